//! The job registry: every job this server knows, its state, messages
//! (runner notes and SDK log entries, the last [`MAX_LOG_ENTRIES`] per job)
//! and staged artifacts. Finished jobs are kept up to a bound
//! ([`DEFAULT_MAX_FINISHED_JOBS`], the oldest finished go first) so a
//! long-running server does not grow without end.

use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use tokio::sync::broadcast;
use weir_harness::FnApi;
use weir_proto::beam::job_message::MessageImportance;
use weir_proto::beam::job_state::Enum as JobState;
use weir_proto::{beam, prost_types};

use crate::locations::{JobLocations, Location};
use crate::resources::{JobResources, Sampler};
use crate::ServerConfig;

/// Messages (runner notes and SDK log entries) kept per job; older ones are
/// dropped first. State changes are always kept.
pub const MAX_LOG_ENTRIES: usize = 10_000;

/// Finished jobs (DONE, FAILED, CANCELLED, ...) a registry keeps by default.
pub const DEFAULT_MAX_FINISHED_JOBS: usize = 100;

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
    /// Set by DrainJob: sources stop, everything in flight finishes, windows
    /// fire, and the job ends DRAINED.
    pub drain: Arc<AtomicBool>,
    /// Weir's default folder for this job's staged artifacts
    /// (`<staging root>/<job id>`, removed when the job ends).
    pub staging_dir: PathBuf,
    /// Where artifacts are staged and temp files go (see [`crate::locations`]).
    pub locations: JobLocations,
    /// Metrics aggregated from every bundle.
    pub metrics: Arc<weir_harness::JobMetrics>,
    /// CPU and memory of the runner and the job's SDK processes.
    pub resources: JobResources,
    /// When Prepare created the job.
    pub created: SystemTime,
    times: Mutex<Times>,
    state: Mutex<JobState>,
    /// Events in publish order; messages beyond [`MAX_LOG_ENTRIES`] are dropped oldest first.
    history: Mutex<History>,
    events: broadcast::Sender<beam::JobMessagesResponse>,
    next_message: Mutex<u64>,
}

#[derive(Default)]
struct Times {
    started: Option<SystemTime>,
    finished: Option<SystemTime>,
}

#[derive(Default)]
struct History {
    events: VecDeque<beam::JobMessagesResponse>,
    messages: usize,
    dropped: u64,
}

fn is_message(e: &beam::JobMessagesResponse) -> bool {
    matches!(
        e.response,
        Some(beam::job_messages_response::Response::MessageResponse(_))
    )
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
        if is_message(&event) {
            h.messages += 1;
            if h.messages > MAX_LOG_ENTRIES {
                if let Some(i) = h.events.iter().position(is_message) {
                    h.events.remove(i);
                    h.messages -= 1;
                    h.dropped += 1;
                }
            }
        }
        h.events.push_back(event.clone());
        let _ = self.events.send(event);
    }

    /// When Run started the job, and when it reached a terminal state.
    pub fn times(&self) -> (Option<SystemTime>, Option<SystemTime>) {
        let t = self.times.lock().unwrap_or_else(|p| p.into_inner());
        (t.started, t.finished)
    }

    /// Messages dropped because the job had more than [`MAX_LOG_ENTRIES`].
    pub fn dropped_messages(&self) -> u64 {
        self.history
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .dropped
    }

    /// Moves the job to `state` (ignored once terminal) and tells subscribers.
    pub fn set_state(&self, state: JobState) {
        {
            let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
            if is_terminal(*s) || *s == state {
                return;
            }
            *s = state;
            let mut t = self.times.lock().unwrap_or_else(|p| p.into_inner());
            if state == JobState::Starting {
                t.started.get_or_insert_with(SystemTime::now);
            }
            if is_terminal(state) {
                t.finished = Some(SystemTime::now());
            }
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
                    time: now().to_string(),
                    importance: importance as i32,
                    message_text: text.into(),
                },
            )),
        });
    }

    /// Everything kept so far (every state change, the last
    /// [`MAX_LOG_ENTRIES`] messages), and a receiver of what comes next.
    pub fn subscribe(
        &self,
    ) -> (
        Vec<beam::JobMessagesResponse>,
        broadcast::Receiver<beam::JobMessagesResponse>,
    ) {
        let h = self.history.lock().unwrap_or_else(|p| p.into_inner());
        (h.events.iter().cloned().collect(), self.events.subscribe())
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

/// One staged artifact: where it is stored and for which job.
#[derive(Clone, Debug)]
pub struct StagedArtifact {
    pub job_id: String,
    pub location: Location,
    pub path: object_store::path::Path,
}

/// All jobs of one server, plus what running them needs.
pub struct JobRegistry {
    jobs: Mutex<HashMap<String, Arc<Job>>>,
    /// Artifacts workers may fetch (only what was staged), by the path or
    /// URL in their `ArtifactFilePayload`.
    pub(crate) staged: Mutex<HashMap<String, StagedArtifact>>,
    /// Reads CPU and memory of processes for every job.
    pub(crate) sampler: Sampler,
    max_finished: AtomicUsize,
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
            staged: Mutex::default(),
            sampler: Sampler::default(),
            max_finished: AtomicUsize::new(DEFAULT_MAX_FINISHED_JOBS),
            fn_api,
            config,
            url,
        })
    }

    /// A fresh job id (`job-<uuid>`).
    pub fn new_job_id() -> String {
        format!("job-{}", uuid::Uuid::new_v4().simple())
    }

    /// Weir's default folders: staging under the staging root, temp under
    /// `<tmp>/weir-temp`.
    pub fn default_locations(&self) -> crate::locations::Defaults {
        crate::locations::Defaults {
            staging: self.config.staging_root.clone(),
            temp: std::env::temp_dir().join("weir-temp"),
        }
    }

    /// Creates a job in state STOPPED. Options that break Dataflow's rules
    /// leave `validated` at its default (Prepare refuses them before this);
    /// locations that cannot be opened fall back to Weir's folders (Prepare
    /// uses [`JobRegistry::create_job`] and refuses them instead).
    pub fn create(
        &self,
        name: String,
        pipeline: beam::Pipeline,
        options: prost_types::Struct,
    ) -> Arc<Job> {
        let validated = crate::options::validate(&options).unwrap_or_default();
        let env = crate::locations::SystemEnv;
        let locations = crate::locations::resolve(&validated, &self.default_locations(), &env)
            .or_else(|_| {
                crate::locations::resolve(
                    &crate::options::JobOptions::default(),
                    &self.default_locations(),
                    &env,
                )
            })
            .expect("Weir's default folders can be created");
        self.create_job(Self::new_job_id(), name, pipeline, options, locations)
    }

    /// Creates job `id` in state STOPPED with its resolved locations, and
    /// forgets the oldest finished jobs beyond the bound.
    pub fn create_job(
        &self,
        id: String,
        name: String,
        pipeline: beam::Pipeline,
        options: prost_types::Struct,
        locations: JobLocations,
    ) -> Arc<Job> {
        let name = if name.is_empty() { id.clone() } else { name };
        let validated = crate::options::validate(&options).unwrap_or_default();
        let job = Arc::new(Job {
            staging_dir: self.config.staging_root.join(&id),
            id: id.clone(),
            name,
            pipeline: Mutex::new(pipeline),
            options,
            validated,
            locations,
            cancel: Arc::new(AtomicBool::new(false)),
            drain: Arc::new(AtomicBool::new(false)),
            metrics: Arc::default(),
            resources: JobResources::default(),
            created: SystemTime::now(),
            times: Mutex::default(),
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
        self.evict_finished();
        job
    }

    /// How many finished jobs to keep (default [`DEFAULT_MAX_FINISHED_JOBS`]).
    pub fn set_max_finished_jobs(&self, n: usize) {
        self.max_finished.store(n, Ordering::Relaxed);
        self.evict_finished();
    }

    /// Forgets the finished jobs beyond the bound, oldest finish first,
    /// with their staged-artifact entries. Returns the ids forgotten.
    pub fn evict_finished(&self) -> Vec<String> {
        let max = self.max_finished.load(Ordering::Relaxed);
        let mut jobs = self.jobs.lock().unwrap_or_else(|p| p.into_inner());
        let mut finished: Vec<(SystemTime, String)> = jobs
            .values()
            .filter(|j| is_terminal(j.state()))
            .map(|j| (j.times().1.unwrap_or(j.created), j.id.clone()))
            .collect();
        if finished.len() <= max {
            return vec![];
        }
        finished.sort();
        let gone: Vec<String> = finished[..finished.len() - max]
            .iter()
            .map(|(_, id)| id.clone())
            .collect();
        for id in &gone {
            jobs.remove(id);
        }
        drop(jobs);
        self.staged
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|_, a| !gone.contains(&a.job_id));
        for id in &gone {
            tracing::debug!(job = %id, "finished job forgotten (registry bound)");
        }
        gone
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

#[cfg(test)]
mod tests {
    use super::*;

    fn registry(name: &str) -> Arc<JobRegistry> {
        let url = "127.0.0.1:1".to_string();
        JobRegistry::new(
            FnApi::new(url.clone()),
            ServerConfig {
                staging_root: std::env::temp_dir()
                    .join(format!("weir-registry-test-{}-{name}", std::process::id())),
                engine_workers: 1,
            },
            url,
        )
    }

    fn job(r: &JobRegistry, name: &str) -> Arc<Job> {
        r.create(name.into(), beam::Pipeline::default(), Default::default())
    }

    #[test]
    fn only_the_newest_finished_jobs_are_kept() {
        let r = registry("bound");
        r.set_max_finished_jobs(2);
        let running = job(&r, "running");
        running.set_state(JobState::Running);
        let finished: Vec<_> = (0..4)
            .map(|i| {
                let j = job(&r, &format!("f{i}"));
                j.set_state(JobState::Starting);
                std::thread::sleep(std::time::Duration::from_millis(2));
                j.set_state(if i % 2 == 0 {
                    JobState::Done
                } else {
                    JobState::Failed
                });
                j
            })
            .collect();
        let stopped = job(&r, "prepared");
        let mut names: Vec<String> = r.all().iter().map(|j| j.name.clone()).collect();
        names.sort();
        // Running and prepared jobs stay; of the finished, the last two to finish.
        assert_eq!(names, vec!["f2", "f3", "prepared", "running"]);
        assert!(r.get(&finished[0].id).is_none());
        assert!(r.get(&stopped.id).is_some());
        // The running job finishing pushes out the oldest finished one.
        running.set_state(JobState::Cancelled);
        assert_eq!(r.evict_finished(), vec![finished[2].id.clone()]);
        assert!(r.get(&running.id).is_some());
    }

    #[test]
    fn the_default_bound_is_a_hundred() {
        let r = registry("hundred");
        for i in 0..105 {
            job(&r, &format!("j{i}")).set_state(JobState::Done);
        }
        // Evicted at the next create (or when a run ends).
        job(&r, "last");
        assert_eq!(r.all().len(), DEFAULT_MAX_FINISHED_JOBS + 1);
    }

    #[test]
    fn messages_are_bounded_but_states_are_kept() {
        let r = registry("log");
        let j = job(&r, "chatty");
        j.set_state(JobState::Starting);
        for i in 0..MAX_LOG_ENTRIES + 5 {
            j.message(MessageImportance::JobMessageBasic, format!("line {i}"));
        }
        j.set_state(JobState::Done);
        let (history, _) = j.subscribe();
        let texts: Vec<&str> = history
            .iter()
            .filter_map(|e| match &e.response {
                Some(beam::job_messages_response::Response::MessageResponse(m)) => {
                    Some(m.message_text.as_str())
                }
                _ => None,
            })
            .collect();
        assert_eq!(texts.len(), MAX_LOG_ENTRIES);
        assert_eq!(texts[0], "line 5");
        assert_eq!(
            *texts.last().unwrap(),
            format!("line {}", MAX_LOG_ENTRIES + 4)
        );
        let states = history.len() - texts.len();
        assert_eq!(states, 3, "STOPPED, STARTING, DONE");
        assert_eq!(j.dropped_messages(), 5);
        let (start, end) = j.times();
        assert!(start.is_some() && end.is_some() && start <= end);
    }
}
