//! The job registry: every job this server knows, its state, messages and staged artifacts.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use tokio::sync::broadcast;
use weir_harness::FnApi;
use weir_proto::beam::job_message::MessageImportance;
use weir_proto::beam::job_state::Enum as JobState;
use weir_proto::{beam, prost_types};

use crate::ServerConfig;

/// One job, from Prepare to a terminal state.
pub struct Job {
    /// Job id; also the preparation id and the staging session token.
    pub id: String,
    pub name: String,
    /// The pipeline; after staging, environment dependencies point at Weir's copies.
    pub pipeline: Mutex<beam::Pipeline>,
    pub options: prost_types::Struct,
    /// The checked, typed view of `options`: labels, element processing
    /// timeout, ... (see [`crate::options::validate`]).
    pub validated: crate::options::JobOptions,
    /// Set to cancel a running job.
    pub cancel: Arc<AtomicBool>,
    /// Folder of this job's staged artifacts.
    pub staging_dir: PathBuf,
    /// Metrics aggregated from every bundle.
    pub metrics: Arc<weir_harness::JobMetrics>,
    state: Mutex<JobState>,
    history: Mutex<Vec<beam::JobMessagesResponse>>,
    events: broadcast::Sender<beam::JobMessagesResponse>,
    next_message: Mutex<u64>,
}

fn now() -> prost_types::Timestamp {
    prost_types::Timestamp::from(SystemTime::now())
}

/// True for DONE, FAILED, CANCELLED, DRAINED, UPDATED.
pub fn is_terminal(s: JobState) -> bool {
    matches!(
        s,
        JobState::Done
            | JobState::Failed
            | JobState::Cancelled
            | JobState::Drained
            | JobState::Updated
    )
}

impl Job {
    /// Current state.
    pub fn state(&self) -> JobState {
        *self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn publish(&self, event: beam::JobMessagesResponse) {
        let mut h = self.history.lock().unwrap_or_else(|p| p.into_inner());
        h.push(event.clone());
        let _ = self.events.send(event);
    }

    /// Moves the job to `state` (ignored once terminal) and tells subscribers.
    pub fn set_state(&self, state: JobState) {
        {
            let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
            if is_terminal(*s) || *s == state {
                return;
            }
            *s = state;
        }
        tracing::info!(job = %self.id, state = state.as_str_name(), "job state");
        self.publish(beam::JobMessagesResponse {
            response: Some(beam::job_messages_response::Response::StateResponse(
                beam::JobStateEvent {
                    state: state as i32,
                    timestamp: Some(now()),
                },
            )),
        });
    }

    /// Adds a message to the job's message stream.
    pub fn message(&self, importance: MessageImportance, text: impl Into<String>) {
        let id = {
            let mut n = self.next_message.lock().unwrap_or_else(|p| p.into_inner());
            *n += 1;
            *n
        };
        self.publish(beam::JobMessagesResponse {
            response: Some(beam::job_messages_response::Response::MessageResponse(
                beam::JobMessage {
                    message_id: format!("{}-{id}", self.id),
                    time: format!("{:?}", now()),
                    importance: importance as i32,
                    message_text: text.into(),
                },
            )),
        });
    }

    /// Everything published so far, and a receiver of what comes next.
    pub fn subscribe(
        &self,
    ) -> (
        Vec<beam::JobMessagesResponse>,
        broadcast::Receiver<beam::JobMessagesResponse>,
    ) {
        let h = self.history.lock().unwrap_or_else(|p| p.into_inner());
        (h.clone(), self.events.subscribe())
    }

    /// `JobInfo` for GetJobs.
    pub fn info(&self) -> beam::JobInfo {
        beam::JobInfo {
            job_id: self.id.clone(),
            job_name: self.name.clone(),
            pipeline_options: Some(self.options.clone()),
            state: self.state() as i32,
        }
    }
}

/// All jobs of one server, plus what running them needs.
pub struct JobRegistry {
    jobs: Mutex<HashMap<String, Arc<Job>>>,
    /// Artifact files workers may fetch (only what was staged).
    pub(crate) staged_files: Mutex<HashSet<PathBuf>>,
    pub(crate) fn_api: Arc<FnApi>,
    pub(crate) config: ServerConfig,
    /// `host:port` of this server (artifact staging endpoint).
    pub(crate) url: String,
}

impl JobRegistry {
    /// An empty registry.
    pub fn new(fn_api: Arc<FnApi>, config: ServerConfig, url: String) -> Arc<JobRegistry> {
        Arc::new(JobRegistry {
            jobs: Mutex::default(),
            staged_files: Mutex::default(),
            fn_api,
            config,
            url,
        })
    }

    /// Creates a job in state STOPPED. Options that break Dataflow's rules
    /// leave `validated` at its default (Prepare refuses them before this).
    pub fn create(
        &self,
        name: String,
        pipeline: beam::Pipeline,
        options: prost_types::Struct,
    ) -> Arc<Job> {
        let id = format!("job-{}", uuid::Uuid::new_v4().simple());
        let name = if name.is_empty() { id.clone() } else { name };
        let validated = crate::options::validate(&options).unwrap_or_default();
        let job = Arc::new(Job {
            staging_dir: self.config.staging_root.join(&id),
            id: id.clone(),
            name,
            pipeline: Mutex::new(pipeline),
            options,
            validated,
            cancel: Arc::new(AtomicBool::new(false)),
            metrics: Arc::default(),
            state: Mutex::new(JobState::Stopped),
            history: Mutex::default(),
            events: broadcast::channel(4096).0,
            next_message: Mutex::new(0),
        });
        job.publish(beam::JobMessagesResponse {
            response: Some(beam::job_messages_response::Response::StateResponse(
                beam::JobStateEvent {
                    state: JobState::Stopped as i32,
                    timestamp: Some(now()),
                },
            )),
        });
        self.jobs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id, job.clone());
        job
    }

    /// The job with this id.
    pub fn get(&self, id: &str) -> Option<Arc<Job>> {
        self.jobs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(id)
            .cloned()
    }

    /// Every job, oldest first by id order.
    pub fn all(&self) -> Vec<Arc<Job>> {
        let mut v: Vec<_> = self
            .jobs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect();
        v.sort_by(|a, b| a.id.cmp(&b.id));
        v
    }
}
