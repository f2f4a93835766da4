//! The registry every Fn API service shares: SDK workers by worker id (the
//! `worker_id` gRPC header), bundles in flight by instruction id,
//! registered `ProcessBundleDescriptor`s by id, and where each job wants its
//! SDK log entries.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::{mpsc, oneshot, watch};
use weir_engine::side_input::SideInputs;
use weir_proto::beam;

/// Severity of a worker log line forwarded to a job's message stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WorkerLog {
    Debug,
    Info,
    Warning,
    Error,
}

/// Where a job wants Weir's notes about its workers (started, died,
/// restarted) to go; and, registered with [`FnApi::set_sdk_log`], the SDK
/// harnesses' own log entries (`BeamFnLogging`), kept apart because the job
/// treats them differently (see `weir_jobs::registry::Job::sdk_log`).
pub type LogSink = Arc<dyn Fn(WorkerLog, String) + Send + Sync>;

/// One SDK harness as the runner sees it.
pub struct Worker {
    pub id: String,
    pub job_id: String,
    pub provision: beam::ProvisionInfo,
    pub log: LogSink,
    pub(crate) control_tx: Mutex<Option<mpsc::UnboundedSender<beam::InstructionRequest>>>,
    pub(crate) data_tx: Mutex<Option<mpsc::UnboundedSender<beam::Elements>>>,
    pub(crate) pending: Mutex<HashMap<String, oneshot::Sender<beam::InstructionResponse>>>,
    /// True once the control stream is open; false again when it closes.
    pub(crate) connected: watch::Sender<bool>,
    pub(crate) data_connected: watch::Sender<bool>,
    pub(crate) in_flight: AtomicUsize,
    /// Why the control stream last closed (set by [`Worker::disconnected`]).
    pub(crate) disconnect_reason: Mutex<Option<String>>,
    /// Set by the first control connection claiming this worker id; any
    /// later one is refused (a worker id is used by one SDK harness, once).
    pub(crate) claimed: std::sync::atomic::AtomicBool,
}

impl Worker {
    /// Sends an instruction and returns the receiver of its response.
    /// `Err` when the worker's control stream is not open.
    pub(crate) fn send(
        &self,
        req: beam::InstructionRequest,
    ) -> Result<oneshot::Receiver<beam::InstructionResponse>, String> {
        let (tx, rx) = oneshot::channel();
        self.pending
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(req.instruction_id.clone(), tx);
        let control = self.control_tx.lock().unwrap_or_else(|p| p.into_inner());
        match control.as_ref() {
            Some(c) if c.send(req).is_ok() => Ok(rx),
            _ => Err(format!("SDK harness {} is not connected", self.id)),
        }
    }

    pub(crate) fn send_data(&self, elements: beam::Elements) -> Result<(), String> {
        let data = self.data_tx.lock().unwrap_or_else(|p| p.into_inner());
        match data.as_ref() {
            Some(d) if d.send(elements).is_ok() => Ok(()),
            _ => Err(format!("SDK harness {} has no open data stream", self.id)),
        }
    }

    /// Marks the worker disconnected and fails every instruction waiting on it.
    pub(crate) fn disconnected(&self, why: &str) {
        *self.control_tx.lock().unwrap_or_else(|p| p.into_inner()) = None;
        self.disconnect_reason
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get_or_insert_with(|| why.to_string());
        let _ = self.connected.send_replace(false);
        let pending: Vec<_> = self
            .pending
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .drain()
            .collect();
        for (id, tx) in pending {
            let _ = tx.send(beam::InstructionResponse {
                instruction_id: id,
                error: format!("SDK harness {} disconnected: {why}", self.id),
                response: None,
            });
        }
    }

    /// True while the control stream is open.
    pub fn is_connected(&self) -> bool {
        *self.connected.borrow()
    }

    /// Instructions (bundles, splits, progress requests…) sent to this
    /// worker and not answered yet.
    pub fn instructions_pending(&self) -> usize {
        self.pending.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// Bundles currently sent to this worker and not yet answered.
    pub fn bundles_in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Relaxed)
    }
}

/// Output collection of one bundle in flight.
pub(crate) struct BundleState {
    /// The worker the bundle's instruction was issued to: only its streams
    /// may send the bundle's data and timers or make its state requests.
    pub worker_id: String,
    /// The id of the stage's `ProcessBundleDescriptor` (its state specs
    /// and coders), whatever side-input generation the bundle runs under.
    pub descriptor_id: String,
    pub side_inputs: Arc<SideInputs>,
    pub user_state: BundleUserState,
    pub sink_index: HashMap<String, usize>,
    /// (transform id, timer family id) -> index into `outputs` (after the sinks).
    pub timer_index: HashMap<(String, String), usize>,
    /// Per sink, then per timer family: the bytes received so far; and how
    /// many of those streams have not sent `is_last` yet.
    pub outputs: Mutex<(Vec<ByteChunks>, usize)>,
    pub all_last: tokio::sync::Notify,
    /// Set once work split off this bundle was handed to the engine.
    pub split_handed_over: std::sync::atomic::AtomicBool,
}

pub use weir_engine::user_state::{BundleUserState, UserState};

/// One output stream of a bundle as received: its `Elements.Data` (or
/// `Elements.Timers`) chunks, kept as they came so a large output is not
/// regrown and copied chunk by chunk; joined once at the end.
#[derive(Debug, Default, Clone, PartialEq)]
pub(crate) struct ByteChunks(Vec<Vec<u8>>);

impl ByteChunks {
    /// Adds the next chunk of the stream (empty chunks are dropped).
    pub(crate) fn push(&mut self, chunk: Vec<u8>) {
        if !chunk.is_empty() {
            self.0.push(chunk);
        }
    }

    /// Bytes received so far.
    pub(crate) fn len(&self) -> usize {
        self.0.iter().map(Vec::len).sum()
    }

    /// The whole stream: the one chunk as it is, else the chunks joined
    /// into one exactly sized buffer.
    pub(crate) fn into_bytes(mut self) -> Vec<u8> {
        match self.0.len() {
            0 => Vec::new(),
            1 => self.0.pop().expect("one chunk"),
            _ => self.0.concat(),
        }
    }
}

/// Shared state of the Fn API services.
pub struct FnApi {
    /// `host:port` SDK harnesses dial for every Fn API service.
    pub url: String,
    workers: Mutex<HashMap<String, Arc<Worker>>>,
    pub(crate) bundles: Mutex<HashMap<String, Arc<BundleState>>>,
    descriptors: Mutex<HashMap<String, beam::ProcessBundleDescriptor>>,
    /// Where each job's SDK log entries go, by job id.
    sdk_logs: Mutex<HashMap<String, LogSink>>,
    next_id: AtomicU64,
}

impl FnApi {
    /// A registry whose services are reachable at `url` (`host:port`).
    pub fn new(url: String) -> Arc<FnApi> {
        Arc::new(FnApi {
            url,
            workers: Mutex::default(),
            bundles: Mutex::default(),
            descriptors: Mutex::default(),
            sdk_logs: Mutex::default(),
            next_id: AtomicU64::new(1),
        })
    }

    /// A fresh id that cannot be guessed: the prefix, a counter unique in
    /// this process (for reading logs), `-` and 128 random bits in hex
    /// (a v4 UUID's 122 random bits and its version bits), e.g.
    /// `job-…-worker-3-9f0c…`. Worker and instruction ids are the Fn API's
    /// only credentials (see [`crate::services`]).
    pub fn fresh_id(&self, prefix: &str) -> String {
        format!(
            "{prefix}{}-{}",
            self.next_id.fetch_add(1, Ordering::Relaxed),
            uuid::Uuid::new_v4().simple()
        )
    }

    /// Registers a worker the runner is about to start.
    pub fn add_worker(
        &self,
        id: String,
        job_id: String,
        provision: beam::ProvisionInfo,
        log: LogSink,
    ) -> Arc<Worker> {
        let w = Arc::new(Worker {
            id: id.clone(),
            job_id,
            provision,
            log,
            control_tx: Mutex::new(None),
            data_tx: Mutex::new(None),
            pending: Mutex::default(),
            connected: watch::channel(false).0,
            data_connected: watch::channel(false).0,
            in_flight: AtomicUsize::new(0),
            disconnect_reason: Mutex::new(None),
            claimed: std::sync::atomic::AtomicBool::new(false),
        });
        self.workers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id, w.clone());
        w
    }

    /// Sends the SDK log entries of job `job_id`'s workers to `sink` (until
    /// [`FnApi::remove_sdk_log`]); without one they reach Weir's log only.
    pub fn set_sdk_log(&self, job_id: &str, sink: LogSink) {
        self.sdk_logs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(job_id.to_string(), sink);
    }

    /// Stops sending job `job_id`'s SDK log entries anywhere but Weir's log.
    pub fn remove_sdk_log(&self, job_id: &str) {
        self.sdk_logs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(job_id);
    }

    /// Where job `job_id`'s SDK log entries go, if anywhere.
    pub(crate) fn sdk_log(&self, job_id: &str) -> Option<LogSink> {
        self.sdk_logs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(job_id)
            .cloned()
    }

    /// Forgets a worker (its job ended).
    pub fn remove_worker(&self, id: &str) {
        if let Some(w) = self
            .workers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(id)
        {
            w.disconnected("its job ended");
            *w.data_tx.lock().unwrap_or_else(|p| p.into_inner()) = None;
        }
    }

    /// The worker with this id, if registered.
    pub fn worker(&self, id: &str) -> Option<Arc<Worker>> {
        self.workers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(id)
            .cloned()
    }

    /// Makes descriptors available to `GetProcessBundleDescriptor`.
    pub fn add_descriptors(
        &self,
        descriptors: impl IntoIterator<Item = beam::ProcessBundleDescriptor>,
    ) {
        let mut d = self.descriptors.lock().unwrap_or_else(|p| p.into_inner());
        for desc in descriptors {
            d.insert(desc.id.clone(), desc);
        }
    }

    /// Forgets descriptors whose id starts with `prefix` (a job's).
    pub fn remove_descriptors(&self, prefix: &str) {
        self.descriptors
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|k, _| !k.starts_with(prefix));
    }

    /// Descriptor `id` for worker `worker`: only the descriptors of the
    /// worker's own job (ids `<job id>/...`, see
    /// [`crate::JobWorkers::descriptor_id`]).
    pub(crate) fn descriptor_of_job(
        &self,
        job_id: &str,
        id: &str,
    ) -> Option<beam::ProcessBundleDescriptor> {
        id.strip_prefix(job_id)
            .filter(|rest| rest.starts_with('/'))
            .and_then(|_| self.descriptor(id))
    }

    pub(crate) fn descriptor(&self, id: &str) -> Option<beam::ProcessBundleDescriptor> {
        self.descriptors
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(id)
            .cloned()
    }

    /// Runs `f` on descriptor `id` (or `None`), without copying it.
    pub(crate) fn with_descriptor<T>(
        &self,
        id: &str,
        f: impl FnOnce(Option<&beam::ProcessBundleDescriptor>) -> T,
    ) -> T {
        f(self
            .descriptors
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(id))
    }

    /// The bundle in flight under `instruction_id`, when it was issued to
    /// worker `worker_id` (another worker's bundles are not its to touch).
    pub(crate) fn bundle_of(
        &self,
        worker_id: &str,
        instruction_id: &str,
    ) -> Option<Arc<BundleState>> {
        self.bundles
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(instruction_id)
            .filter(|b| b.worker_id == worker_id)
            .cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::ByteChunks;

    #[test]
    fn byte_chunks_join_in_order_and_move_a_single_chunk() {
        let mut s = ByteChunks::default();
        assert_eq!(s.clone().into_bytes(), Vec::<u8>::new());
        s.push(b"abc".to_vec());
        s.push(Vec::new());
        assert_eq!(s.len(), 3);
        assert_eq!(s.clone().0.len(), 1, "empty chunks are dropped");
        s.push(b"de".to_vec());
        s.push(b"f".to_vec());
        assert_eq!(s.len(), 6);
        assert_eq!(s.into_bytes(), b"abcdef");
        let mut t = ByteChunks::default();
        t.push(b"xyz".to_vec());
        let only = t.0[0].as_ptr();
        assert_eq!(t.into_bytes().as_ptr(), only, "one chunk is moved, not copied");
    }
}
