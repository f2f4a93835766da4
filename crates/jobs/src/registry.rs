//! The job registry: every job this server knows, its state, messages
//! (runner notes and SDK log entries, the last [`MAX_LOG_ENTRIES`] per job)
//! and staged artifacts. A job's events are read in one of two [`View`]s:
//! its message stream (GetMessageStream, what Beam's clients see) carries
//! state changes, Weir's own messages and the SDK's warnings and errors; its
//! logs (`weir jobs logs`) carry every SDK log entry too (see
//! [`Job::sdk_log`] for why and how). Finished jobs are kept up to a bound
//! ([`DEFAULT_MAX_FINISHED_JOBS`], the oldest finished go first) so a
//! long-running server does not grow without end.

use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use tokio::sync::watch;
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

/// How many of the messages last sent on a job's message stream an SDK log
/// entry is compared with to tell an echo ([`Job::sdk_log`]).
pub const ECHO_WINDOW: usize = 64;

/// SDK warnings and errors the message stream takes at once
/// ([`Job::sdk_log`]); the allowance refills at [`SDK_STREAM_PER_SECOND`].
pub const SDK_STREAM_BURST: f64 = 100.0;

/// SDK warnings and errors per second the message stream takes in the long
/// run; the rest reach the job's logs only.
pub const SDK_STREAM_PER_SECOND: f64 = 10.0;

/// Which of a job's events a reader gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum View {
    /// The job's message stream (GetMessageStream for Beam's clients):
    /// state changes, Weir's own messages, and the SDK's warnings and errors
    /// that are not echoes of the stream ([`Job::sdk_log`]).
    Stream,
    /// The job's logs (`weir jobs logs`): every event, every SDK log entry
    /// at its own severity.
    Logs,
}

/// One published event as each [`View`] sees it.
#[derive(Clone, Debug)]
pub struct Published {
    /// What [`View::Logs`] gets.
    event: beam::JobMessagesResponse,
    /// What [`View::Stream`] gets.
    on_stream: OnStream,
}

#[derive(Clone, Debug)]
enum OnStream {
    Same,
    /// A copy at another importance.
    Changed(beam::JobMessagesResponse),
    Hidden,
}

impl Published {
    /// The event as `view` sees it, or `None` when `view` does not carry it.
    pub fn view(&self, view: View) -> Option<&beam::JobMessagesResponse> {
        match (view, &self.on_stream) {
            (View::Logs, _) | (View::Stream, OnStream::Same) => Some(&self.event),
            (View::Stream, OnStream::Changed(e)) => Some(e),
            (View::Stream, OnStream::Hidden) => None,
        }
    }
}

/// True when `text` names a message id of job `job_id` (`<job id>-<n>`, as
/// [`Job::message`] makes them): Beam's Go client prints each message it
/// receives with its id, and in LOOPBACK that print comes back as an SDK log
/// entry.
fn names_message_of(text: &str, job_id: &str) -> bool {
    let prefix = format!("{job_id}-");
    text.match_indices(&prefix).any(|(i, _)| {
        text[i + prefix.len()..]
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_digit())
    })
}

/// Decides which SDK log entries the message stream carries (see
/// [`Job::sdk_log`]).
struct StreamGate {
    /// Texts of the last [`ECHO_WINDOW`] messages sent on the stream
    /// (Weir's own and SDK entries).
    recent: VecDeque<String>,
    /// SDK entries the stream may still take now (at most [`SDK_STREAM_BURST`]).
    allowance: f64,
    refilled: std::time::Instant,
    /// SDK warnings and errors kept off the stream by the rate limit.
    limited: u64,
}

impl Default for StreamGate {
    fn default() -> Self {
        StreamGate {
            recent: VecDeque::new(),
            allowance: SDK_STREAM_BURST,
            refilled: std::time::Instant::now(),
            limited: 0,
        }
    }
}

impl StreamGate {
    fn sent(&mut self, text: &str) {
        if self.recent.len() == ECHO_WINDOW {
            self.recent.pop_front();
        }
        self.recent.push_back(text.to_string());
    }

    fn is_echo(&self, text: &str, job_id: &str) -> bool {
        names_message_of(text, job_id)
            || self
                .recent
                .iter()
                .any(|r| !r.is_empty() && text.trim_end().ends_with(r.trim_end()))
    }

    /// Takes one unit of the allowance; false when none is left.
    fn take(&mut self) -> bool {
        let now = std::time::Instant::now();
        let refill = now.duration_since(self.refilled).as_secs_f64() * SDK_STREAM_PER_SECOND;
        self.allowance = (self.allowance + refill).min(SDK_STREAM_BURST);
        self.refilled = now;
        if self.allowance >= 1.0 {
            self.allowance -= 1.0;
            true
        } else {
            self.limited += 1;
            false
        }
    }
}

/// Finished jobs (DONE, FAILED, CANCELLED, ...) a registry keeps by default.
pub const DEFAULT_MAX_FINISHED_JOBS: usize = 100;

/// One job, from Prepare to a terminal state.
pub struct Job {
    /// Job id; also the preparation id and the staging session token.
    pub id: String,
    pub name: String,
    /// The pipeline; after staging, environment dependencies point at Weir's copies.
    pub pipeline: Mutex<beam::Pipeline>,
    /// The serialized size of the pipeline the job was made with, in bytes
    /// (what it counts against [`crate::limits::Limits::max_held_pipeline_bytes`]).
    pub pipeline_bytes: usize,
    /// The pipeline planned once, at Prepare (None only for jobs made by
    /// [`JobRegistry::create`], which fail if run); Run takes it with the
    /// environments as staging left them ([`Job::plan_to_run`]).
    pub plan: Option<weir_plan::Plan>,
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
    /// Each stage's watermarks and counts, published by the engine while the job runs.
    pub progress: weir_engine::Progress,
    /// When Prepare created the job.
    pub created: SystemTime,
    /// Where the client's staging of the job's artifacts stands.
    pub staging: Mutex<crate::artifacts::Staging>,
    times: Mutex<Times>,
    state: Mutex<JobState>,
    /// Events in publish order; messages beyond [`MAX_LOG_ENTRIES`] are dropped oldest first.
    history: Arc<Mutex<History>>,
    /// Bumped after each publish: wakes [`Subscription`]s.
    published: watch::Sender<()>,
    next_message: Mutex<u64>,
    gate: Mutex<StreamGate>,
    /// Connections to the job's worker pools, opened at Prepare.
    pub pools: weir_harness::environment::PoolChannels,
    /// The SDK harnesses Prepare started ([`crate::run::prestart`]), for
    /// Run to take; discarded with a job that is never run.
    prestarted: Mutex<Option<Prestarted>>,
}

/// SDK harnesses starting (or started) at Prepare: the task of
/// [`weir_harness::environment::start`].
pub(crate) type Prestarted = tokio::task::JoinHandle<
    std::result::Result<Arc<weir_harness::environment::SdkHarnesses>, weir_harness::HarnessError>,
>;

#[derive(Default)]
struct Times {
    started: Option<SystemTime>,
    finished: Option<SystemTime>,
}

#[derive(Default)]
struct History {
    /// Each event with its sequence number (0, 1, ... in publish order;
    /// increasing, with gaps where messages were dropped).
    events: VecDeque<(u64, Arc<Published>)>,
    /// The sequence number of the next event published.
    next_seq: u64,
    messages: usize,
    dropped: u64,
}

/// A reader of one job's events after a point: each event it reads in
/// publish order, none twice, none skipped unless the job's history dropped
/// it (the [`MAX_LOG_ENTRIES`] bound) before it was read. Events are shared
/// with the history, not copied; a reader takes at most
/// [`Subscription::BATCH`] of them at a time.
pub struct Subscription {
    history: Arc<Mutex<History>>,
    published: watch::Receiver<()>,
    /// Sequence number of the next event to read.
    next: u64,
    ready: VecDeque<Arc<Published>>,
}

impl Subscription {
    /// Most events taken from the history under its lock at once.
    pub const BATCH: usize = 256;

    /// The next event; waits for one to be published. None once the job is
    /// gone (no [`Job`] holds it any more) and every event is read.
    pub async fn recv(&mut self) -> Option<Arc<Published>> {
        loop {
            if let Some(p) = self.ready.pop_front() {
                return Some(p);
            }
            // Seen before reading: a publish after the read wakes `changed`.
            self.published.borrow_and_update();
            {
                let h = self.history.lock().unwrap_or_else(|p| p.into_inner());
                let from = h.events.partition_point(|(seq, _)| *seq < self.next);
                for (seq, p) in h.events.range(from..).take(Self::BATCH) {
                    self.ready.push_back(p.clone());
                    self.next = seq + 1;
                }
            }
            if self.ready.is_empty() && self.published.changed().await.is_err() {
                return None;
            }
        }
    }
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
    /// Whether the job's pipeline has an unbounded PCollection (one of the
    /// things that make a job streaming, with `--streaming` and a TestStream).
    pub fn has_unbounded_pcollection(&self) -> bool {
        let pipeline = self.pipeline.lock().unwrap_or_else(|p| p.into_inner());
        pipeline.components.as_ref().is_some_and(|c| {
            c.pcollections.values().any(|pc| pc.is_bounded == beam::is_bounded::Enum::Unbounded as i32)
        })
    }

    /// The job's metrics with each step named as the user named it
    /// ([`crate::service::name_steps`]), as GetJobMetrics, the web UI and
    /// `/metrics` show them.
    pub fn metrics_by_step(&self) -> Vec<beam::MonitoringInfo> {
        let mut infos = self.metrics.snapshot();
        crate::service::name_steps(&mut infos, &self.pipeline.lock().unwrap_or_else(|p| p.into_inner()));
        infos
    }

    /// Keeps the SDK harnesses Prepare is starting, for Run.
    pub(crate) fn set_prestarted(&self, started: Prestarted) {
        *self.prestarted.lock().unwrap_or_else(|p| p.into_inner()) = Some(started);
    }

    /// The SDK harnesses Prepare started, if it did (once).
    pub(crate) fn take_prestarted(&self) -> Option<Prestarted> {
        self.prestarted.lock().unwrap_or_else(|p| p.into_inner()).take()
    }

    /// For a job that will not run (cancelled or forgotten before Run): sets
    /// its cancel flag, which ends a start of its harnesses (Prepare's)
    /// still waiting for them to connect, and stops those started
    /// ([`Job::discard_prestarted`]), and removes the artifacts it staged
    /// in Weir's own folder (a client's staging location keeps its files).
    pub(crate) fn abandon_unrun(&self) {
        self.cancel.store(true, Ordering::SeqCst);
        self.discard_prestarted();
        if self.locations.staging.option.is_none() {
            // Before Cancel answers: the client may look at once.
            let _ = std::fs::remove_dir_all(&self.staging_dir);
        }
    }

    /// Stops the SDK harnesses Prepare started that no run took: in the
    /// background, once they have connected or failed to.
    pub(crate) fn discard_prestarted(&self) {
        let Some(started) = self.take_prestarted() else {
            return;
        };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(async move {
                    if let Ok(Ok(harnesses)) = started.await {
                        harnesses.stop().await;
                    }
                });
            }
            // No runtime to stop them on (not reached: callers run on
            // one); the task, if any is left, ends with its harnesses.
            Err(_) => drop(started),
        }
    }

    /// The plan made at Prepare, its environments (and the copies of them in
    /// its bundle descriptors) replaced by the pipeline's, whose dependencies
    /// staging has since pointed at Weir's copies of the artifacts.
    ///
    /// # Errors
    /// A job made without a plan ([`JobRegistry::create`]).
    pub fn plan_to_run(&self) -> Result<weir_plan::Plan, String> {
        let mut plan = self
            .plan
            .clone()
            .ok_or_else(|| format!("job {} was not prepared (it has no plan)", self.id))?;
        let pipeline = self.pipeline.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(staged) = pipeline.components.as_ref().map(|c| &c.environments) {
            let fresh = |id: &String, env: &mut beam::Environment| {
                if let Some(s) = staged.get(id) {
                    *env = s.clone();
                }
            };
            for (id, env) in plan.environments.iter_mut() {
                fresh(id, env);
            }
            for d in plan.descriptors.values_mut() {
                for (id, env) in d.environments.iter_mut() {
                    fresh(id, env);
                }
            }
        }
        Ok(plan)
    }

    /// Current state.
    pub fn state(&self) -> JobState {
        *self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn publish(&self, event: beam::JobMessagesResponse) {
        self.publish_as(event, OnStream::Same);
    }

    fn publish_as(&self, event: beam::JobMessagesResponse, on_stream: OnStream) {
        let event = Published { event, on_stream };
        let mut h = self.history.lock().unwrap_or_else(|p| p.into_inner());
        if is_message(&event.event) {
            h.messages += 1;
            if h.messages > MAX_LOG_ENTRIES {
                if let Some(i) = h.events.iter().position(|(_, e)| is_message(&e.event)) {
                    h.events.remove(i);
                    h.messages -= 1;
                    h.dropped += 1;
                }
            }
        }
        let seq = h.next_seq;
        h.next_seq += 1;
        h.events.push_back((seq, Arc::new(event)));
        drop(h);
        self.published.send_replace(());
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

    /// Where the job's artifact staging stands.
    pub fn staging_state(&self) -> crate::artifacts::Staging {
        self.staging.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// True while a client's `ReverseArtifactRetrievalService` stream stages this job's artifacts.
    pub fn is_staging(&self) -> bool {
        self.staging_state() == crate::artifacts::Staging::InProgress
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

    fn job_message(
        &self,
        importance: MessageImportance,
        text: String,
    ) -> beam::JobMessagesResponse {
        let id = {
            let mut n = self.next_message.lock().unwrap_or_else(|p| p.into_inner());
            *n += 1;
            *n
        };
        beam::JobMessagesResponse {
            response: Some(beam::job_messages_response::Response::MessageResponse(
                beam::JobMessage {
                    message_id: format!("{}-{id}", self.id),
                    time: now().to_string(),
                    importance: importance as i32,
                    message_text: text,
                },
            )),
        }
    }

    /// Adds one of Weir's own messages to the job's message stream (and logs).
    pub fn message(&self, importance: MessageImportance, text: impl Into<String>) {
        let text = text.into();
        self.gate
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .sent(&text);
        let event = self.job_message(importance, text);
        self.publish(event);
    }

    /// Adds an SDK harness's log entry (Fn API `BeamFnLogging`, `text` as
    /// `[<worker id>] <message>`) to the job's logs, where it keeps its
    /// severity. The job's message stream gets only warnings and errors, and
    /// not all of them, so that no client can echo entries back into a loop:
    ///
    /// * DEBUG and INFO entries never reach the stream. Beam's Go client logs
    ///   every message it receives through Beam's logger, which in LOOPBACK
    ///   is the SDK harness's own and sends it back here; were INFO entries
    ///   on the stream, each would come back forever.
    /// * An entry that is an echo of the stream stays off it: one that names
    ///   a message id of this job (the Go client prints ids) or ends with the
    ///   text of one of the last [`ECHO_WINDOW`] messages sent on it (clients
    ///   print a message's text last; so a client that logs a warning it
    ///   received at WARNING cannot loop either, and an SDK warning repeated
    ///   word for word reaches the stream once per window).
    /// * The stream takes at most [`SDK_STREAM_BURST`] SDK entries at once
    ///   and [`SDK_STREAM_PER_SECOND`] in the long run; the rest reach the
    ///   logs only (a backstop for echoes that match neither rule).
    /// * SDK errors reach the stream as warnings: Beam's Go client takes any
    ///   `JOB_MESSAGE_ERROR` for the job's failure even when the job ends
    ///   DONE (say, a bundle that failed once and succeeded when retried).
    ///   When a job fails, Weir's own error message says so and why.
    ///
    /// Returns true when the entry is such an echo (a warning or error).
    pub fn sdk_log(&self, level: weir_harness::WorkerLog, text: String) -> bool {
        use weir_harness::WorkerLog;
        let importance = match level {
            WorkerLog::Debug => MessageImportance::JobMessageDebug,
            WorkerLog::Info => MessageImportance::JobMessageBasic,
            WorkerLog::Warning => MessageImportance::JobMessageWarning,
            WorkerLog::Error => MessageImportance::JobMessageError,
        };
        let mut echo = false;
        let to_stream = matches!(level, WorkerLog::Warning | WorkerLog::Error) && {
            let mut gate = self.gate.lock().unwrap_or_else(|p| p.into_inner());
            echo = gate.is_echo(&text, &self.id);
            let pass = !echo && gate.take();
            if pass {
                gate.sent(&text);
            }
            pass
        };
        let event = self.job_message(importance, text);
        let on_stream = match (to_stream, level) {
            (false, _) => OnStream::Hidden,
            (true, WorkerLog::Error) => {
                let mut copy = event.clone();
                if let Some(beam::job_messages_response::Response::MessageResponse(m)) =
                    &mut copy.response
                {
                    m.importance = MessageImportance::JobMessageWarning as i32;
                }
                OnStream::Changed(copy)
            }
            (true, _) => OnStream::Same,
        };
        self.publish_as(event, on_stream);
        echo
    }

    /// SDK warnings and errors kept off the message stream by its rate
    /// limit so far ([`Job::sdk_log`]).
    pub fn sdk_entries_rate_limited(&self) -> u64 {
        self.gate.lock().unwrap_or_else(|p| p.into_inner()).limited
    }

    /// Everything `view` carries that is kept so far (every state change,
    /// of the last [`MAX_LOG_ENTRIES`] messages those `view` carries), and a
    /// [`Subscription`] to what comes next (read it through [`Published::view`]).
    pub fn subscribe(&self, view: View) -> (Vec<beam::JobMessagesResponse>, Subscription) {
        let h = self.history.lock().unwrap_or_else(|p| p.into_inner());
        (
            h.events
                .iter()
                .filter_map(|(_, e)| e.view(view).cloned())
                .collect(),
            Subscription {
                history: self.history.clone(),
                published: self.published.subscribe(),
                next: h.next_seq,
                ready: VecDeque::new(),
            },
        )
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
    /// Set in cluster mode (`weir serve --cluster_port`): jobs run on the
    /// coordinator's worker processes instead of in this one.
    coordinator: std::sync::OnceLock<Arc<crate::cluster::Coordinator>>,
    /// This server's own folders under the staging root and under
    /// `<tmp>/weir-temp`, for its jobs' default folders (None where one
    /// could not be claimed: the root itself then).
    own_staging: Option<crate::locations::ServerFolder>,
    own_temp: Option<crate::locations::ServerFolder>,
}

/// The root of Weir's temp folders: `<tmp>/weir-temp`.
fn temp_root() -> PathBuf {
    std::env::temp_dir().join("weir-temp")
}

/// Claims this server's folder under `root`, logging what servers no longer
/// alive left there and removing it; None (with a warning) if it cannot.
fn claim_folder(root: &std::path::Path) -> Option<crate::locations::ServerFolder> {
    match crate::locations::ServerFolder::claim(root) {
        Ok((folder, removed)) => {
            for dir in removed {
                tracing::info!("removed {}: left by a server that is no longer running", dir.display());
            }
            Some(folder)
        }
        Err(e) => {
            tracing::warn!(
                "cannot claim a folder of this server's own under {}: {e}; jobs' default folders go in it directly, and what a server that crashes leaves there stays",
                root.display()
            );
            None
        }
    }
}

impl JobRegistry {
    /// The server's access policy (Job API token, allowlists).
    pub fn security(&self) -> &Arc<crate::security::Security> {
        &self.config.security
    }

    /// An empty registry.
    pub fn new(fn_api: Arc<FnApi>, config: ServerConfig, url: String) -> Arc<JobRegistry> {
        let own_staging = claim_folder(&config.staging_root);
        let own_temp = claim_folder(&temp_root());
        Arc::new(JobRegistry {
            own_staging,
            own_temp,
            jobs: Mutex::default(),
            staged: Mutex::default(),
            sampler: Sampler::default(),
            max_finished: AtomicUsize::new(DEFAULT_MAX_FINISHED_JOBS),
            fn_api,
            config,
            url,
            coordinator: std::sync::OnceLock::new(),
        })
    }

    /// Makes this server a cluster coordinator: from now on its jobs run on
    /// `coordinator`'s workers. Returns false when it already was one.
    pub fn set_coordinator(&self, coordinator: Arc<crate::cluster::Coordinator>) -> bool {
        self.coordinator.set(coordinator).is_ok()
    }

    /// The cluster coordinator, in cluster mode.
    pub fn coordinator(&self) -> Option<&Arc<crate::cluster::Coordinator>> {
        self.coordinator.get()
    }

    /// A fresh job id (`job-<uuid>`).
    pub fn new_job_id() -> String {
        format!("job-{}", uuid::Uuid::new_v4().simple())
    }

    /// Weir's default folders: staging under the staging root, temp under
    /// `<tmp>/weir-temp`, each job's in this server's own folder there.
    pub fn default_locations(&self) -> crate::locations::Defaults {
        let own = |f: &Option<crate::locations::ServerFolder>, root: PathBuf| {
            f.as_ref().map_or(root, |f| f.dir.clone())
        };
        crate::locations::Defaults {
            staging: self.config.staging_root.clone(),
            temp: temp_root(),
            own_staging: own(&self.own_staging, self.config.staging_root.clone()),
            own_temp: own(&self.own_temp, temp_root()),
            client_staging_anywhere: self.config.limits.allow_client_staging_locations,
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
        self.create_job(Self::new_job_id(), name, pipeline, None, options, locations)
    }

    /// Creates job `id` in state STOPPED with its resolved locations, and
    /// forgets the oldest finished jobs beyond the bound.
    pub fn create_job(
        &self,
        id: String,
        name: String,
        pipeline: beam::Pipeline,
        plan: Option<weir_plan::Plan>,
        options: prost_types::Struct,
        locations: JobLocations,
    ) -> Arc<Job> {
        let name = if name.is_empty() { id.clone() } else { name };
        let validated = crate::options::validate(&options).unwrap_or_default();
        let job = Arc::new(Job {
            staging_dir: self.default_locations().own_staging.join(&id),
            id: id.clone(),
            name,
            pipeline_bytes: prost::Message::encoded_len(&pipeline),
            pipeline: Mutex::new(pipeline),
            plan,
            options,
            validated,
            locations,
            cancel: Arc::new(AtomicBool::new(false)),
            drain: Arc::new(AtomicBool::new(false)),
            metrics: Arc::default(),
            resources: JobResources::default(),
            progress: weir_engine::Progress::default(),
            created: SystemTime::now(),
            staging: Mutex::default(),
            times: Mutex::default(),
            state: Mutex::new(JobState::Stopped),
            history: Arc::default(),
            published: watch::channel(()).0,
            next_message: Mutex::new(0),
            gate: Mutex::default(),
            pools: weir_harness::environment::PoolChannels::default(),
            prestarted: Mutex::new(None),
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
        let max_bytes = self.config.limits.max_held_pipeline_bytes;
        let mut jobs = self.jobs.lock().unwrap_or_else(|p| p.into_inner());
        let mut finished: Vec<(SystemTime, String, usize)> = jobs
            .values()
            .filter(|j| is_terminal(j.state()))
            .map(|j| (j.times().1.unwrap_or(j.created), j.id.clone(), j.pipeline_bytes))
            .collect();
        let mut bytes: usize = finished.iter().map(|f| f.2).sum();
        if finished.len() <= max && bytes <= max_bytes {
            return vec![];
        }
        finished.sort();
        // The oldest go first, until both the count and the bytes fit.
        let mut kept = finished.len();
        let mut gone: Vec<String> = Vec::new();
        for (_, id, b) in &finished {
            if kept <= max && bytes <= max_bytes {
                break;
            }
            gone.push(id.clone());
            kept -= 1;
            bytes -= b;
        }
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

    /// Forgets prepared jobs that were not run within the TTL
    /// ([`crate::limits::Limits::prepared_job_ttl`]), with their staged
    /// artifacts; returns the ids forgotten.
    pub fn expire_prepared(&self) -> Vec<String> {
        let ttl = self.config.limits.prepared_job_ttl;
        let now = SystemTime::now();
        let mut jobs = self.jobs.lock().unwrap_or_else(|p| p.into_inner());
        let gone: Vec<Arc<Job>> = jobs
            .values()
            .filter(|j| {
                j.state() == JobState::Stopped
                    && now.duration_since(j.created).unwrap_or_default() >= ttl
            })
            .cloned()
            .collect();
        for j in &gone {
            jobs.remove(&j.id);
        }
        drop(jobs);
        self.forget_unrun(&gone);
        for j in &gone {
            tracing::info!(job = %j.id, "prepared job forgotten: not run within {:?} ({})", ttl, crate::limits::flag::PREPARED_JOB_TTL_SECS);
        }
        gone.iter().map(|j| j.id.clone()).collect()
    }

    /// Forgets the prepared job not yet run that was prepared first among
    /// those whose artifacts are not being staged, a job whose artifacts
    /// are all staged (its client is about to call Run) only when there is
    /// no other; returns its id (None if every prepared job is staging).
    /// Prepare calls it at `--max_prepared_jobs`, so prepared jobs a client
    /// never runs cannot keep other clients' jobs out until they expire.
    pub fn forget_oldest_idle_prepared(&self) -> Option<String> {
        let mut jobs = self.jobs.lock().unwrap_or_else(|p| p.into_inner());
        let staged = |j: &Job| j.staging_state() == crate::artifacts::Staging::Staged;
        let oldest = jobs
            .values()
            .filter(|j| j.state() == JobState::Stopped && !j.is_staging())
            .min_by(|a, b| {
                (staged(a), a.created, &a.id).cmp(&(staged(b), b.created, &b.id))
            })
            .cloned()?;
        jobs.remove(&oldest.id);
        drop(jobs);
        self.forget_unrun(std::slice::from_ref(&oldest));
        Some(oldest.id.clone())
    }

    /// Releases what jobs removed before they ran held: staged artifacts,
    /// harnesses started at Prepare, Weir's staging folder.
    fn forget_unrun(&self, gone: &[Arc<Job>]) {
        for j in gone {
            self.release_unrun(j);
        }
    }

    /// Releases what a job that will not run (cancelled or forgotten
    /// before Run) holds: its entries among the staged artifacts, and what
    /// [`Job::abandon_unrun`] releases.
    pub(crate) fn release_unrun(&self, job: &Job) {
        self.staged
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|_, a| a.job_id != job.id);
        job.abandon_unrun();
    }

    /// How many jobs are prepared and not run yet, and the serialized bytes
    /// of their pipelines.
    pub fn prepared(&self) -> (usize, usize) {
        self.jobs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .filter(|j| j.state() == JobState::Stopped)
            .fold((0, 0), |(n, bytes), j| (n + 1, bytes + j.pipeline_bytes))
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
    use crate::artifacts::Staging;

    fn registry(name: &str) -> Arc<JobRegistry> {
        registry_with(name, Default::default())
    }

    fn registry_with(name: &str, limits: crate::limits::Limits) -> Arc<JobRegistry> {
        let url = "127.0.0.1:1".to_string();
        JobRegistry::new(
            FnApi::new(url.clone()),
            ServerConfig {
                python_for_docker_images: None,
                staging_root: std::env::temp_dir()
                    .join(format!("weir-registry-test-{}-{name}", std::process::id())),
                engine_workers: 1,
                limits,
                capture_prepare_dir: None,
                security: Default::default(),
                gbk_memory_budget: None,
                user_state_memory_budget: None,
                side_input_memory_budget: None,
                spill_root: std::env::temp_dir().join("weir-spill"),
                min_resume_delay: weir_engine::DEFAULT_MIN_RESUME_DELAY,
            },
            url,
        )
    }

    /// Run takes Prepare's plan with the environments staging rewrote, in
    /// the plan and in its bundle descriptors; a job without a plan fails.
    #[test]
    fn plan_to_run_takes_the_staged_environments() {
        let r = registry("plan-to-run");
        let env = |dep: &str| beam::Environment {
            urn: "beam:env:external:v1".into(),
            dependencies: vec![beam::ArtifactInformation {
                type_urn: dep.into(),
                ..Default::default()
            }],
            ..Default::default()
        };
        let mut plan = weir_plan::plan(
            &beam::Pipeline::default(),
            &weir_plan::PlanOptions {
                fn_api_url: "localhost:1".into(),
                streaming: false,
                drain: false,
            },
        )
        .expect("an empty pipeline plans");
        plan.environments.insert("py".into(), env("as sent"));
        let mut d = beam::ProcessBundleDescriptor::default();
        d.environments.insert("py".into(), env("as sent"));
        plan.descriptors.insert("s1".into(), d);
        let mut pipeline = beam::Pipeline::default();
        pipeline
            .components
            .get_or_insert_with(Default::default)
            .environments
            .insert("py".into(), env("staged"));
        let prepared = r.create_job(
            "j1".into(),
            "j1".into(),
            pipeline,
            Some(plan),
            Default::default(),
            crate::locations::resolve(
                &crate::options::JobOptions::default(),
                &r.default_locations(),
                &crate::locations::SystemEnv,
            )
            .expect("Weir's default folders"),
        );
        let run = prepared.plan_to_run().expect("a prepared job has a plan");
        assert_eq!(run.environments["py"].dependencies[0].type_urn, "staged");
        assert_eq!(
            run.descriptors["s1"].environments["py"].dependencies[0].type_urn,
            "staged"
        );
        let unplanned = job(&r, "unplanned");
        assert_eq!(
            unplanned.plan_to_run().unwrap_err(),
            format!("job {} was not prepared (it has no plan)", unplanned.id)
        );
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

    /// At the cap of prepared jobs, the oldest one not staging goes; jobs
    /// staging, running or finished stay.
    #[test]
    fn the_oldest_idle_prepared_job_is_forgotten_first() {
        let r = registry("idle-prepared");
        let staging_oldest = job(&r, "staging");
        *staging_oldest.staging.lock().unwrap() = Staging::InProgress;
        std::thread::sleep(std::time::Duration::from_millis(2));
        // Staged, its client about to call Run: it goes after the others.
        let staged = job(&r, "staged");
        *staged.staging.lock().unwrap() = Staging::Staged;
        std::thread::sleep(std::time::Duration::from_millis(2));
        let running = job(&r, "running");
        running.set_state(JobState::Running);
        let idle: Vec<_> = (0..2)
            .map(|i| {
                std::thread::sleep(std::time::Duration::from_millis(2));
                job(&r, &format!("idle{i}"))
            })
            .collect();
        assert_eq!(r.forget_oldest_idle_prepared(), Some(idle[0].id.clone()));
        assert!(r.get(&idle[0].id).is_none());
        assert_eq!(r.forget_oldest_idle_prepared(), Some(idle[1].id.clone()));
        assert_eq!(r.forget_oldest_idle_prepared(), Some(staged.id.clone()));
        assert_eq!(r.forget_oldest_idle_prepared(), None);
        assert!(r.get(&staging_oldest.id).is_some() && r.get(&running.id).is_some());
        *staging_oldest.staging.lock().unwrap() = Staging::Staged;
        assert_eq!(r.forget_oldest_idle_prepared(), Some(staging_oldest.id.clone()));
    }

    /// Finished jobs' pipelines count against the held bytes too: past
    /// them the oldest finished jobs go, whatever their number.
    #[test]
    fn finished_jobs_are_forgotten_past_the_held_pipeline_bytes() {
        let r = registry_with(
            "held-bytes",
            crate::limits::Limits { max_held_pipeline_bytes: 250, ..Default::default() },
        );
        let big = beam::Pipeline { requirements: vec!["x".repeat(100)], ..Default::default() };
        let jobs: Vec<_> = (0..3)
            .map(|i| {
                let j = r.create(format!("b{i}"), big.clone(), Default::default());
                assert_eq!(j.pipeline_bytes, 102);
                j.set_state(JobState::Starting);
                std::thread::sleep(std::time::Duration::from_millis(2));
                j.set_state(JobState::Done);
                j
            })
            .collect();
        // 3 x 102 bytes is over 250: the oldest goes, two fit.
        assert_eq!(r.evict_finished(), vec![jobs[0].id.clone()]);
        assert_eq!(r.evict_finished(), Vec::<String>::new());
        assert_eq!(r.all().len(), 2);
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
        let (history, _) = j.subscribe(View::Logs);
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

    fn texts(events: &[beam::JobMessagesResponse]) -> Vec<(String, i32)> {
        events
            .iter()
            .filter_map(|e| match &e.response {
                Some(beam::job_messages_response::Response::MessageResponse(m)) => {
                    Some((m.message_text.clone(), m.importance))
                }
                _ => None,
            })
            .collect()
    }

    #[test]
    fn sdk_info_reaches_the_logs_but_not_the_message_stream() {
        use weir_harness::WorkerLog;
        let r = registry("sdk-levels");
        let j = job(&r, "levels");
        j.message(MessageImportance::JobMessageBasic, "runner note");
        j.sdk_log(WorkerLog::Debug, "[w1] debug entry".into());
        j.sdk_log(WorkerLog::Info, "[w1] info entry".into());
        j.sdk_log(WorkerLog::Warning, "[w1] warning entry".into());
        j.sdk_log(WorkerLog::Error, "[w1] error entry".into());
        let basic = MessageImportance::JobMessageBasic as i32;
        let warning = MessageImportance::JobMessageWarning as i32;
        let error = MessageImportance::JobMessageError as i32;
        let debug = MessageImportance::JobMessageDebug as i32;
        assert_eq!(
            texts(&j.subscribe(View::Logs).0),
            vec![
                ("runner note".to_string(), basic),
                ("[w1] debug entry".to_string(), debug),
                ("[w1] info entry".to_string(), basic),
                ("[w1] warning entry".to_string(), warning),
                ("[w1] error entry".to_string(), error),
            ]
        );
        // The stream: Weir's note, the SDK's warning, and its error as a warning.
        assert_eq!(
            texts(&j.subscribe(View::Stream).0),
            vec![
                ("runner note".to_string(), basic),
                ("[w1] warning entry".to_string(), warning),
                ("[w1] error entry".to_string(), warning),
            ]
        );
    }

    #[test]
    fn sdk_echoes_of_the_message_stream_stay_off_it() {
        use weir_harness::WorkerLog;
        let r = registry("sdk-echo");
        let j = job(&r, "echo");
        j.message(
            MessageImportance::JobMessageWarning,
            "hot key in GroupByKey g: a key has 10 of the 10 values",
        );
        // As Beam's Go client prints a message it received: time, id, text.
        let go_echo = format!(
            "[w1] (time=2026-12-01T08:58:40Z)(id={}-1)hot key in GroupByKey g: a key has 10 of the 10 values",
            j.id
        );
        // sdk_log says which entries are echoes (Weir's own log keeps them
        // at DEBUG).
        assert!(j.sdk_log(WorkerLog::Warning, go_echo.clone()));
        // An echo without the id (another client's format) still has the text.
        assert!(j.sdk_log(
            WorkerLog::Warning,
            "[w1] job said: hot key in GroupByKey g: a key has 10 of the 10 values".into(),
        ));
        // An echo of an echo: the id of the first SDK entry.
        assert!(j.sdk_log(WorkerLog::Error, format!("[w1] (id={}-2) again", j.id)));
        // A worker id is not a message id.
        let own = format!("[{}-worker-3] disk almost full", j.id);
        assert!(!j.sdk_log(WorkerLog::Warning, own.clone()));
        // Word for word again: once per window.
        assert!(j.sdk_log(WorkerLog::Warning, own.clone()));
        // A text that merely starts like an earlier one is no echo.
        assert!(!j.sdk_log(WorkerLog::Warning, "[w1] retry 1".into()));
        assert!(!j.sdk_log(WorkerLog::Warning, "[w1] retry 10".into()));
        let stream: Vec<String> = texts(&j.subscribe(View::Stream).0)
            .into_iter()
            .map(|(t, _)| t)
            .collect();
        assert_eq!(
            stream,
            vec![
                "hot key in GroupByKey g: a key has 10 of the 10 values".to_string(),
                own.clone(),
                "[w1] retry 1".to_string(),
                "[w1] retry 10".to_string(),
            ]
        );
        // The logs keep every entry.
        assert_eq!(texts(&j.subscribe(View::Logs).0).len(), 8);
        assert!(names_message_of(&go_echo, &j.id));
        assert!(!names_message_of(&own, &j.id));
    }

    #[test]
    fn sdk_warnings_are_rate_limited_on_the_message_stream() {
        use weir_harness::WorkerLog;
        let r = registry("sdk-rate");
        let j = job(&r, "rate");
        let n = SDK_STREAM_BURST as usize + 50;
        for i in 0..n {
            j.sdk_log(WorkerLog::Warning, format!("[w1] distinct warning {i}"));
        }
        let on_stream = texts(&j.subscribe(View::Stream).0).len();
        // The burst, plus what refilled while the loop ran (10 per second).
        assert!(
            on_stream >= SDK_STREAM_BURST as usize && on_stream < SDK_STREAM_BURST as usize + 10,
            "{on_stream} on the stream"
        );
        assert_eq!(j.sdk_entries_rate_limited() as usize, n - on_stream);
        assert_eq!(texts(&j.subscribe(View::Logs).0).len(), n);
    }

    #[tokio::test]
    async fn a_slow_subscriber_reads_every_event_the_history_keeps_in_order() {
        let r = registry("slow");
        let j = job(&r, "slow");
        let (history, mut live) = j.subscribe(View::Logs);
        assert_eq!(history.len(), 1, "STOPPED");
        // More than a broadcast channel of 4096 would have kept for it.
        let n = 6000;
        for i in 0..n {
            j.message(MessageImportance::JobMessageBasic, format!("m{i}"));
        }
        for i in 0..n {
            let p = live.recv().await.expect("event");
            assert_eq!(
                texts(&[p.view(View::Logs).cloned().unwrap()])[0].0,
                format!("m{i}")
            );
        }
        // Past the bound, the history drops the oldest messages unread.
        for i in n..MAX_LOG_ENTRIES + n + 3 {
            j.message(MessageImportance::JobMessageBasic, format!("m{i}"));
        }
        j.set_state(JobState::Done);
        let first = live.recv().await.expect("event");
        assert_eq!(
            texts(&[first.view(View::Logs).cloned().unwrap()])[0].0,
            format!("m{}", n + 3)
        );
    }

    #[tokio::test]
    async fn a_subscriber_waits_for_the_next_event_and_ends_with_the_job() {
        let r = registry("wait");
        let j = job(&r, "wait");
        let (_, mut live) = j.subscribe(View::Stream);
        let reader = tokio::spawn(async move {
            let mut states = Vec::new();
            while let Some(p) = live.recv().await {
                if let Some(beam::job_messages_response::Response::StateResponse(s)) =
                    p.view(View::Stream).and_then(|e| e.response.clone())
                {
                    states.push(s.state);
                }
            }
            states
        });
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        j.set_state(JobState::Running);
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        j.set_state(JobState::Done);
        drop(j);
        r.set_max_finished_jobs(0);
        let states = tokio::time::timeout(std::time::Duration::from_secs(10), reader)
            .await
            .expect("the reader ends once the job is forgotten")
            .unwrap();
        assert_eq!(
            states,
            vec![JobState::Running as i32, JobState::Done as i32]
        );
    }

    #[tokio::test]
    async fn a_live_subscriber_gets_its_view_only() {
        use weir_harness::WorkerLog;
        let r = registry("sdk-live");
        let j = job(&r, "live");
        let (_, mut live) = j.subscribe(View::Stream);
        j.sdk_log(WorkerLog::Info, "[w1] info".into());
        j.sdk_log(WorkerLog::Warning, "[w1] warn".into());
        let first = live.recv().await.expect("event");
        assert!(first.view(View::Stream).is_none());
        assert!(first.view(View::Logs).is_some());
        let second = live.recv().await.expect("event");
        assert_eq!(
            texts(&[second.view(View::Stream).cloned().unwrap()])[0].0,
            "[w1] warn"
        );
    }
}
