//! The registry every Fn API service shares: SDK workers by worker id (the
//! `worker_id` gRPC header), bundles in flight by instruction id,
//! registered `ProcessBundleDescriptor`s by id, and where each job wants its
//! SDK log entries.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
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
/// restarted) to go.
pub type LogSink = Arc<dyn Fn(WorkerLog, String) + Send + Sync>;

/// Where a job wants its SDK harnesses' own log entries (`BeamFnLogging`,
/// registered with [`FnApi::set_sdk_log`]; the job treats them apart from
/// Weir's notes, see `weir_jobs::registry::Job::sdk_log`);
/// returns true for an entry that echoes the job's own messages (a LOOPBACK
/// client logs the messages it receives through the harness's logger),
/// which Weir's log then keeps at DEBUG.
pub type SdkLogSink = Arc<dyn Fn(WorkerLog, String) -> bool + Send + Sync>;

/// Descriptors a [`Worker`] keeps bundle and processor counts of before it
/// forgets the idle ones.
pub(crate) const MAX_DESCRIPTOR_COUNTS: usize = 256;

/// How long a descriptor's bundle processors may sit idle before Weir
/// counts them gone: the Python SDK shuts down the processors of a
/// descriptor unused for 60 s (`DEFAULT_BUNDLE_PROCESSOR_CACHE_SHUTDOWN_
/// THRESHOLD_S`), and Java's processor cache expires them after a minute.
pub(crate) const PROCESSOR_IDLE_EVICTION: std::time::Duration = std::time::Duration::from_secs(60);

/// A descriptor's bundles and bundle processors at one SDK harness.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ProcessorCount {
    /// Its bundles in flight here.
    running: usize,
    /// The most that ever were in flight at once since the SDK last
    /// evicted them: the processors the SDK harness has built for it.
    built: usize,
    /// When a bundle of it last started or ended.
    last_used: tokio::time::Instant,
}

impl ProcessorCount {
    /// `built`, or 0 once they sat idle past [`PROCESSOR_IDLE_EVICTION`].
    fn built_now(&self) -> usize {
        if self.running == 0 && self.last_used.elapsed() >= PROCESSOR_IDLE_EVICTION {
            0
        } else {
            self.built
        }
    }
}

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
    /// True once the SDK harness has ended its side of the control stream
    /// (it does so as it shuts down, after its last bundle).
    pub(crate) control_ended: watch::Sender<bool>,
    /// True when the SDK harness's gRPC library is one whose harness ends
    /// its data stream by itself as it shuts down (see the data service).
    pub(crate) closes_data_itself: std::sync::atomic::AtomicBool,
    pub(crate) in_flight: AtomicUsize,
    /// Per `ProcessBundleDescriptor` id: its bundles in flight here, and
    /// the most that ever were at once, which is how many bundle
    /// processors the SDK harness has built for it (SDKs build one per
    /// concurrent bundle of a descriptor, reuse idle ones, and evict them
    /// after [`PROCESSOR_IDLE_EVICTION`] unused).
    pub(crate) processors: Mutex<HashMap<String, ProcessorCount>>,
    /// Why the control stream last closed (set by [`Worker::disconnected`]).
    pub(crate) disconnect_reason: Mutex<Option<String>>,
    /// Set by the first control connection claiming this worker id; any
    /// later one is refused (a worker id is used by one SDK harness, once).
    pub(crate) claimed: std::sync::atomic::AtomicBool,
    /// True once the SDK harness opened its Logging stream: its log entries
    /// arrive there, so its process's stderr (the same entries, printed) is
    /// then only logged at DEBUG.
    pub(crate) logging: Arc<std::sync::atomic::AtomicBool>,
    /// The SDK harness process's CPU demand (use plus runqueue wait), in
    /// thousandths of one core, over the busier of its last two sample
    /// windows (see `SdkHarnesses`' CPU sampler):
    /// [`CPU_UNSAMPLED`] unless it ran bundles in both, the same ones
    /// throughout, in the same process; 0 when its process cannot be
    /// measured.
    pub(crate) cpu_permille: AtomicU32,
    /// Bumped each time a bundle starts or ends here: a CPU sample counts
    /// only over a window in which this stayed the same.
    pub(crate) bundle_moves: AtomicU64,
    /// [`Worker::bundle_moves`] when a bundle here last split off work for
    /// this same harness's spare core time (see
    /// `SdkHarnesses::take_spare_core`): no other such split until a bundle
    /// starts or ends here. `u64::MAX` before the first.
    pub(crate) spare_taken_at: AtomicU64,
}

/// [`Worker::cpu_permille`] before the first sample of its process.
pub(crate) const CPU_UNSAMPLED: u32 = u32::MAX;

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

    /// Ends the runner's side of the data stream (the SDK harness then sees
    /// it end).
    pub(crate) fn close_data(&self) {
        *self.data_tx.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }

    /// Resolves once the SDK harness has closed its side of the control
    /// stream (if it ever opened one) and of the data stream: it has
    /// finished its work and is shutting down.
    pub(crate) async fn sdk_closed(&self) {
        if self.claimed.load(std::sync::atomic::Ordering::SeqCst) {
            let _ = self
                .control_ended
                .subscribe()
                .wait_for(|ended| *ended)
                .await;
        }
        let _ = self
            .data_connected
            .subscribe()
            .wait_for(|open| !*open)
            .await;
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

    /// [`Worker::cpu_permille`]'s value.
    pub(crate) fn cpu_permille(&self) -> u32 {
        self.cpu_permille.load(Ordering::Relaxed)
    }

    /// Notes that a bundle started or ended here: the CPU use sampled over
    /// the bundles before says nothing of the ones now.
    pub(crate) fn bundles_moved(&self) {
        self.bundle_moves.fetch_add(1, Ordering::Relaxed);
        self.cpu_permille.store(CPU_UNSAMPLED, Ordering::Relaxed);
    }

    /// (bundles of `descriptor` in flight here, bundle processors the SDK
    /// harness has built for it).
    pub(crate) fn processors_of(&self, descriptor: &str) -> (usize, usize) {
        let p = self.processors.lock().unwrap_or_else(|p| p.into_inner());
        p.get(descriptor).map_or((0, 0), |c| (c.running, c.built_now()))
    }

    /// Counts a bundle of `descriptor` sent to this worker (and a new
    /// bundle processor when none of the built ones is idle).
    pub(crate) fn descriptor_started(&self, descriptor: &str) {
        let mut p = self.processors.lock().unwrap_or_else(|p| p.into_inner());
        let now = tokio::time::Instant::now();
        let c = p.entry(descriptor.to_string()).or_insert(ProcessorCount {
            running: 0,
            built: 0,
            last_used: now,
        });
        c.built = c.built_now().max(c.running + 1);
        c.running += 1;
        c.last_used = now;
    }

    /// Counts a bundle of `descriptor` ended: its processor idle again, or
    /// when it `failed` gone (SDKs drop the processor of a failed bundle).
    /// Past [`MAX_DESCRIPTOR_COUNTS`] descriptors the idle ones are
    /// forgotten (a streaming job registers a descriptor per side-input
    /// generation).
    pub(crate) fn descriptor_ended(&self, descriptor: &str, failed: bool) {
        let mut p = self.processors.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = p.get_mut(descriptor) {
            c.running = c.running.saturating_sub(1);
            if failed {
                c.built = c.built.saturating_sub(1);
            }
            c.last_used = tokio::time::Instant::now();
        }
        if p.len() > MAX_DESCRIPTOR_COUNTS {
            p.retain(|_, c| c.running > 0);
        }
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
    /// Where the bundle's sink streams spill (timers never do).
    pub spill: Option<OutputSpill>,
    pub all_last: tokio::sync::Notify,
    /// Set once new work (residual restrictions of splittable elements)
    /// split off this bundle was handed to the engine.
    pub split_handed_over: std::sync::atomic::AtomicBool,
    /// Set by a split of the data channel: the bundle's input elements from
    /// this index on were handed back to the engine (`usize::MAX`: none).
    pub split_primary: std::sync::atomic::AtomicUsize,
    /// The first output the SDK harness sent that the bundle has no place
    /// for (data for a transform that is not one of its sinks, timers of an
    /// unknown family): the bundle fails with it rather than lose output.
    pub stray_output: Mutex<Option<String>>,
}

impl BundleState {
    /// Records output the bundle has no place for; the first is kept.
    pub(crate) fn stray(&self, what: String) {
        tracing::warn!("{what}");
        self.stray_output.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert(what);
    }
}

pub use weir_engine::user_state::{BundleUserState, UserState};
use weir_engine::{OutputSpill, SpilledOutput};

/// One output stream of a bundle as received: its `Elements.Data` (or
/// `Elements.Timers`) chunks, kept as they came so a large output is not
/// regrown and copied chunk by chunk; joined once at the end. Under an
/// [`OutputSpill`], chunks past its `above_bytes` go to an unlinked file.
#[derive(Debug, Default)]
pub(crate) struct ByteChunks {
    chunks: Vec<Vec<u8>>,
    /// Bytes in `chunks`.
    held: usize,
    /// The leading bytes written out, and the first write error (the
    /// bundle then fails with it).
    spilled: Option<SpilledOutput>,
    error: Option<String>,
}

impl PartialEq for ByteChunks {
    /// Equal held chunks, neither stream spilled (a spilled stream equals
    /// nothing: its bytes are in a file). For tests.
    fn eq(&self, other: &Self) -> bool {
        self.spilled.is_none() && other.spilled.is_none() && self.chunks == other.chunks
    }
}

impl ByteChunks {
    /// Adds the next chunk of the stream (empty chunks are dropped).
    pub(crate) fn push(&mut self, chunk: Vec<u8>) {
        if !chunk.is_empty() {
            self.held += chunk.len();
            self.chunks.push(chunk);
        }
    }

    /// Adds the next chunk; when `spill` is given and more than its
    /// `above_bytes` are held, writes them out.
    /// After a failed write the stream is doomed (its bundle fails with the
    /// error), so further chunks are dropped rather than held. The write
    /// goes to the page cache under the caller's lock: a few ms a MiB.
    pub(crate) fn push_spilling(&mut self, chunk: Vec<u8>, spill: Option<&OutputSpill>) {
        if self.error.is_some() {
            return;
        }
        self.push(chunk);
        if let Some(spill) = spill {
            if self.held > spill.above_bytes && self.error.is_none() {
                if let Err(e) = self.write_out(spill) {
                    self.error = Some(format!(
                        "cannot spill a bundle output under {}: {e}",
                        spill.dir.display()
                    ));
                }
            }
        }
    }

    fn write_out(&mut self, spill: &OutputSpill) -> std::io::Result<()> {
        use std::io::Write;
        if self.spilled.is_none() {
            std::fs::create_dir_all(&spill.dir)?;
            let path = spill
                .dir
                .join(format!("output-{}", uuid::Uuid::new_v4().simple()));
            let file = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .open(&path)?;
            // Unlinked at once: the bytes vanish with the last handle (if
            // unlinking fails, the job's spill folder goes when it ends).
            std::fs::remove_file(&path)?;
            self.spilled = Some(SpilledOutput { file, len: 0 });
        }
        let out = self.spilled.as_mut().expect("opened above");
        for chunk in self.chunks.drain(..) {
            out.file.write_all(&chunk)?;
            out.len += chunk.len() as u64;
        }
        self.held = 0;
        Ok(())
    }

    /// Bytes received so far.
    pub(crate) fn len(&self) -> usize {
        self.held + self.spilled.as_ref().map_or(0, |s| s.len as usize)
    }

    /// The whole stream: the one chunk as it is, else the chunks joined
    /// into one exactly sized buffer. Spilled bytes are not in it: see
    /// [`ByteChunks::into_parts`].
    pub(crate) fn into_bytes(mut self) -> Vec<u8> {
        match self.chunks.len() {
            0 => Vec::new(),
            1 => self.chunks.pop().expect("one chunk"),
            _ => self.chunks.concat(),
        }
    }

    /// The spilled leading bytes (if any) and the bytes held after them.
    /// Errors: a write to the spill file failed.
    pub(crate) fn into_parts(mut self) -> Result<(Option<SpilledOutput>, Vec<u8>), String> {
        if let Some(e) = self.error.take() {
            return Err(e);
        }
        let spilled = self.spilled.take();
        Ok((spilled, self.into_bytes()))
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
    sdk_logs: Mutex<HashMap<String, SdkLogSink>>,
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
            control_ended: watch::channel(false).0,
            closes_data_itself: std::sync::atomic::AtomicBool::new(false),
            in_flight: AtomicUsize::new(0),
            processors: Mutex::default(),
            disconnect_reason: Mutex::new(None),
            claimed: std::sync::atomic::AtomicBool::new(false),
            logging: Arc::default(),
            cpu_permille: AtomicU32::new(CPU_UNSAMPLED),
            bundle_moves: AtomicU64::new(0),
            spare_taken_at: AtomicU64::new(u64::MAX),
        });
        self.workers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id, w.clone());
        w
    }

    /// Sends the SDK log entries of job `job_id`'s workers to `sink` (until
    /// [`FnApi::remove_sdk_log`]); without one they reach Weir's log only.
    pub fn set_sdk_log(&self, job_id: &str, sink: SdkLogSink) {
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
    pub(crate) fn sdk_log(&self, job_id: &str) -> Option<SdkLogSink> {
        self.sdk_logs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(job_id)
            .cloned()
    }

    /// Forgets a worker (its job ended) and ends its control and data streams.
    pub fn remove_worker(&self, id: &str) {
        if let Some(w) = self.retire_worker(id) {
            w.close_data();
        }
    }

    /// Forgets a worker and ends its control stream. Its data stream stays
    /// open when its SDK harness ends that one by itself as it shuts down
    /// (Python's does so after it has logged its shutdown): the runner
    /// ending both at once lets gRPC finish the harness's calls while its
    /// threads still run. [`Worker::close_data`] ends it in any case.
    /// Returns the worker if it was registered.
    pub(crate) fn retire_worker(&self, id: &str) -> Option<Arc<Worker>> {
        let w = self
            .workers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(id)?;
        w.disconnected("its job ended");
        let mut data = w.data_tx.lock().unwrap_or_else(|p| p.into_inner());
        if !w.closes_data_itself.load(Ordering::SeqCst) {
            *data = None;
        }
        drop(data);
        Some(w)
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
    use super::{ByteChunks, OutputSpill};

    #[test]
    fn byte_chunks_join_in_order_and_move_a_single_chunk() {
        assert_eq!(ByteChunks::default().into_bytes(), Vec::<u8>::new());
        let mut s = ByteChunks::default();
        s.push(b"abc".to_vec());
        s.push(Vec::new());
        assert_eq!(s.len(), 3);
        assert_eq!(s.chunks.len(), 1, "empty chunks are dropped");
        s.push(b"de".to_vec());
        s.push(b"f".to_vec());
        assert_eq!(s.len(), 6);
        assert_eq!(s.into_bytes(), b"abcdef");
        let mut t = ByteChunks::default();
        t.push(b"xyz".to_vec());
        let only = t.chunks[0].as_ptr();
        let joined = t.into_bytes();
        assert_eq!(joined.as_ptr(), only, "one chunk is moved, not copied");
    }

    /// Past the threshold the held chunks go to an unlinked file; the file
    /// and the tail together are the stream, in order.
    #[test]
    fn byte_chunks_spill_past_the_threshold_and_keep_the_order() {
        use std::io::{Read, Seek};
        let dir = std::env::temp_dir().join(format!("weir-chunks-test-{}", std::process::id()));
        let spill = OutputSpill { dir: dir.clone(), above_bytes: 4 };
        let mut s = ByteChunks::default();
        for chunk in [&b"ab"[..], b"cd", b"e", b"fgh", b"i"] {
            s.push_spilling(chunk.to_vec(), Some(&spill));
        }
        assert_eq!(s.len(), 9);
        let (spilled, tail) = s.into_parts().unwrap();
        let mut spilled = spilled.expect("over 4 bytes were held");
        // "abcde" went out when 5 > 4 bytes were held; "fghi" (4) stays.
        assert_eq!((spilled.len, &tail[..]), (5, &b"fghi"[..]));
        let mut head = Vec::new();
        spilled.file.rewind().unwrap();
        spilled.file.read_to_end(&mut head).unwrap();
        assert_eq!(head, b"abcde");
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0, "the file is unlinked");
        // Without a spill nothing is written.
        let mut t = ByteChunks::default();
        t.push_spilling(b"abcdefgh".to_vec(), None);
        assert_eq!(t.into_parts().unwrap().0.map(|s| s.len), None);
        // A folder that cannot be made fails the stream, with the path.
        let mut u = ByteChunks::default();
        let bad = OutputSpill { dir: "/proc/weir-no".into(), above_bytes: 0 };
        u.push_spilling(b"x".to_vec(), Some(&bad));
        u.push_spilling(b"yz".to_vec(), Some(&bad));
        assert_eq!(u.len(), 1, "a doomed stream holds no more chunks");
        let err = u.into_parts().unwrap_err();
        assert!(err.contains("/proc/weir-no"), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
