//! Environments: how SDK harnesses are started (`beam:env:external:v1`,
//! `beam:env:process:v1`, `beam:env:docker:v1` in beam_runner_api.proto).

use std::collections::HashMap;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use prost::Message;
use tokio::io::AsyncBufReadExt;
use weir_engine::machine_cores;
use weir_proto::{beam, urns, MAX_GRPC_MESSAGE_BYTES};

use crate::cores;
use crate::fork_server;
use crate::registry::{FnApi, LogSink, Worker, WorkerLog, CPU_UNSAMPLED};
use crate::{HarnessError, Result};

/// How long SDK harnesses get to dial the control service after being
/// started; for a process Weir started, how long it may go without writing
/// a line before it connects (a boot that installs packages is given time
/// while it reports progress, up to [`BOOT_LIMIT`]).
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(120);

/// Longest a process Weir started may take to connect, output or not.
pub const BOOT_LIMIT: Duration = Duration::from_secs(30 * 60);

/// Fewest bundles one SDK harness of a multi-threaded SDK runs at a time by
/// default in a streaming job (see [`multi_core_bundles_per_harness`]).
pub const MULTI_CORE_BUNDLES_PER_HARNESS: usize = 16;

/// Bundles one SDK harness of a multi-threaded SDK runs at a time by
/// default in a streaming job: [`MULTI_CORE_BUNDLES_PER_HARNESS`], or two
/// per core of the machine when that is more (streaming bundles are small
/// and often wait on state). A worker runs one such harness
/// ([`harnesses_per_worker`]), so it must keep every core busy.
pub fn multi_core_bundles_per_harness() -> usize {
    MULTI_CORE_BUNDLES_PER_HARNESS.max(2 * machine_cores())
}

/// Bundles one SDK harness of a multi-threaded SDK runs at a time by
/// default in a batch job: one per core of the machine, Dataflow's default
/// for batch (`WorkerPool.numThreadsPerWorker`: the machine type's cores).
/// More only contend for the cores: Java's wordcount (53 MB, 2 cores) took
/// 14% more wall time and 16% more CPU with 16.
pub fn batch_multi_core_bundles_per_harness() -> usize {
    machine_cores().max(1)
}

/// Bundles one SDK harness of any other SDK (Python) runs at a time for
/// each core it stands for (see [`bundles_per_harness`]): its harness runs
/// bundles on a thread pool but, under one interpreter lock, on about one
/// core; a second bundle runs while the first waits (sleeps, I/O, state and
/// data requests).
pub const SINGLE_CORE_BUNDLES_PER_HARNESS: usize = 2;

/// Longest a small bundle of a one-core SDK waits for an idle bundle
/// processor of its descriptor on a harness that runs that descriptor
/// already (see [`SdkHarnesses::pick`]); about what a Python harness takes
/// to build a processor for a simple stage.
pub const PROCESSOR_WAIT: Duration = Duration::from_millis(30);

/// Input bytes up to which a bundle is small for [`SdkHarnesses::pick`]:
/// processing it costs less than building a bundle processor.
pub const SMALL_BUNDLE_BYTES: usize = 16 * 1024;

/// How one worker sizes the SDK harnesses of a job's environments, from
/// Dataflow's worker options.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HarnessSizing {
    /// Harnesses per worker of an SDK that runs bundles on one core
    /// (Python): one per core, or one with `no_use_multiple_sdk_containers`.
    pub per_core_sdk: usize,
    /// Bundles per harness, for every SDK, when set
    /// (`number_of_worker_harness_threads`).
    pub harness_threads: Option<usize>,
    /// The job's EXTERNAL environments are its client's own worker pool,
    /// whose harnesses are threads of the client's one interpreter (Python's
    /// LOOPBACK): one harness per worker, as more would add channels and
    /// bundle processors but no core.
    pub in_process_pool: bool,
    /// The job runs in streaming mode (`--streaming`, a TestStream, or an
    /// unbounded PCollection): a multi-threaded SDK's harness runs
    /// [`multi_core_bundles_per_harness`] bundles at a time, not
    /// [`batch_multi_core_bundles_per_harness`].
    pub streaming: bool,
}

/// How many bundles Weir sends one SDK harness of `env` at a time:
/// `number_of_worker_harness_threads` when set; else, for an SDK that
/// declares `beam:protocol:multi_core_bundle_processing:v1` in the
/// environment's capabilities (Java and Go, whose harnesses run bundles on
/// many threads; Dataflow gives such an SDK one harness per worker VM for
/// all its cores), [`batch_multi_core_bundles_per_harness`] in a batch job
/// and [`multi_core_bundles_per_harness`] in a streaming one;
/// else [`SINGLE_CORE_BUNDLES_PER_HARNESS`] for each core the harness stands
/// for (Python: 2 with one harness per core; twice the cores with one per
/// worker).
pub fn bundles_per_harness(env: &beam::Environment, sizing: &HarnessSizing) -> usize {
    bundles_per_harness_and_reason(env, sizing).0
}

/// [`bundles_per_harness`] with the reason for it, for the job's messages:
/// e.g. `(16, "the SDK declares beam:protocol:multi_core_bundle_processing:v1")`.
pub fn bundles_per_harness_and_reason(
    env: &beam::Environment,
    sizing: &HarnessSizing,
) -> (usize, &'static str) {
    if let Some(n) = sizing.harness_threads {
        return (n.max(1), "number_of_worker_harness_threads");
    }
    if declares_multi_core(env) {
        return if sizing.streaming {
            (
                multi_core_bundles_per_harness(),
                "a streaming job, and the SDK declares beam:protocol:multi_core_bundle_processing:v1",
            )
        } else {
            (
                batch_multi_core_bundles_per_harness(),
                "one per core in a batch job, and the SDK declares beam:protocol:multi_core_bundle_processing:v1",
            )
        };
    }
    let cores_per_harness = cores_per_harness(env, sizing);
    if cores_per_harness == 1 {
        (
            SINGLE_CORE_BUNDLES_PER_HARNESS,
            "the default for an SDK that does not declare beam:protocol:multi_core_bundle_processing:v1",
        )
    } else {
        (
            SINGLE_CORE_BUNDLES_PER_HARNESS * cores_per_harness,
            "two per core: a worker runs one SDK harness, for all its cores, of an SDK that does not declare beam:protocol:multi_core_bundle_processing:v1",
        )
    }
}

/// Cores of the machine one SDK harness of `env` stands for (at least 1):
/// the cores over [`harnesses_per_worker`].
fn cores_per_harness(env: &beam::Environment, sizing: &HarnessSizing) -> usize {
    (machine_cores() / harnesses_per_worker(env, sizing)).max(1)
}

/// Whether `env` declares `beam:protocol:multi_core_bundle_processing:v1`:
/// its SDK harness runs bundles on many cores at once.
pub fn declares_multi_core(env: &beam::Environment) -> bool {
    env.capabilities
        .iter()
        .any(|c| c == urns::protocol::MULTI_CORE_BUNDLE_PROCESSING)
}

/// SDK harnesses one worker (Dataflow's worker VM) runs for `env`: one for
/// an SDK that declares `beam:protocol:multi_core_bundle_processing:v1`
/// (Java, Go: Dataflow runs one container of such an SDK per VM, its
/// bundles on all cores) and for the client's in-process worker pool
/// ([`HarnessSizing::in_process_pool`]), else `per_core_sdk` (Python: one
/// per core, or one with `no_use_multiple_sdk_containers`).
pub fn harnesses_per_worker(env: &beam::Environment, sizing: &HarnessSizing) -> usize {
    if declares_multi_core(env) || in_client_pool(env, sizing) {
        1
    } else {
        sizing.per_core_sdk.max(1)
    }
}

/// Whether `env`'s harnesses are threads of the client's one interpreter:
/// an EXTERNAL environment of a job whose EXTERNAL environments are its
/// client's in-process worker pool ([`HarnessSizing::in_process_pool`]).
pub fn in_client_pool(env: &beam::Environment, sizing: &HarnessSizing) -> bool {
    sizing.in_process_pool && env.urn == urns::env::EXTERNAL
}

/// The semi-persistent folder (artifacts, pickled main session) of a PROCESS worker.
fn worker_dir(worker_id: &str) -> std::path::PathBuf {
    std::env::temp_dir().join("weir-workers").join(worker_id)
}

fn env_error(env_id: &str, urn: &str, message: impl Into<String>) -> HarnessError {
    HarnessError::Environment {
        environment: env_id.to_string(),
        urn: urn.to_string(),
        message: message.into(),
    }
}

fn descriptor(url: &str) -> Option<beam::ApiServiceDescriptor> {
    Some(beam::ApiServiceDescriptor {
        url: url.to_string(),
        ..Default::default()
    })
}

/// Checks that Weir can start `env` (before a job runs).
///
/// # Errors
/// [`HarnessError::Environment`] naming the environment and URN.
pub fn validate(env_id: &str, env: &beam::Environment) -> Result<()> {
    match env.urn.as_str() {
        urns::env::EXTERNAL => {
            let p = beam::ExternalPayload::decode(env.payload.as_slice())
                .map_err(|e| env_error(env_id, &env.urn, e.to_string()))?;
            if p.endpoint.map(|e| e.url).unwrap_or_default().is_empty() {
                return Err(env_error(
                    env_id,
                    &env.urn,
                    "ExternalPayload has no worker pool endpoint",
                ));
            }
        }
        urns::env::PROCESS => {
            let p = beam::ProcessPayload::decode(env.payload.as_slice())
                .map_err(|e| env_error(env_id, &env.urn, e.to_string()))?;
            if p.command.trim().is_empty() {
                return Err(env_error(
                    env_id,
                    &env.urn,
                    "ProcessPayload has an empty command",
                ));
            }
        }
        urns::env::DOCKER => {
            let p = beam::DockerPayload::decode(env.payload.as_slice())
                .map_err(|e| env_error(env_id, &env.urn, e.to_string()))?;
            if p.container_image.is_empty() {
                return Err(env_error(
                    env_id,
                    &env.urn,
                    "DockerPayload has no container image",
                ));
            }
        }
        other => return Err(env_error(env_id, other, "unsupported environment type")),
    }
    Ok(())
}

/// Lines of an SDK process's output kept for the error when it exits before connecting.
const OUTPUT_TAIL_LINES: usize = 20;
/// Longest output line kept in that tail, in bytes.
const OUTPUT_TAIL_LINE_BYTES: usize = 2000;

/// What an SDK process wrote: its last lines, oldest first, and how many
/// lines in all.
#[derive(Default)]
struct Tail {
    lines: std::collections::VecDeque<String>,
    written: u64,
}

type OutputTail = Arc<Mutex<Tail>>;

/// Takes a line an SDK process wrote to stdout, as `[worker] stdout: line`,
/// for the job's logs.
type PrintedLine = Arc<dyn Fn(String) + Send + Sync>;

/// Logs each line `reader` (an SDK process's stdout or stderr) writes at
/// INFO, keeping the last [`OUTPUT_TAIL_LINES`] in `tail`. For stderr,
/// where SDKs print their log entries, `logging` is the worker's "Logging
/// stream open" flag: once it is set, the same entries arrive there, and
/// stderr lines go at DEBUG. A DoFn's `print` (stdout) stays at INFO and
/// also goes to `printed` (the job's logs).
fn forward_output<R: tokio::io::AsyncRead + Unpin + Send + 'static>(
    reader: R,
    worker_id: String,
    tail: OutputTail,
    logging: Option<Arc<AtomicBool>>,
    printed: Option<PrintedLine>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut lines = tokio::io::BufReader::new(reader).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            if let Some(printed) = &printed {
                printed(format!("[{worker_id}] stdout: {line}"));
            }
            // The SDK's log entries reach the job through the Logging service;
            // the process's own output goes to Weir's log only (and, should
            // it exit before connecting or fail after, into the job's error
            // or a warning).
            if logging.as_ref().is_some_and(|l| l.load(Ordering::Relaxed)) {
                tracing::debug!(worker = %worker_id, "{line}");
            } else {
                tracing::info!(worker = %worker_id, "{line}");
            }
            let mut kept = line;
            if kept.len() > OUTPUT_TAIL_LINE_BYTES {
                let mut end = OUTPUT_TAIL_LINE_BYTES;
                while !kept.is_char_boundary(end) {
                    end -= 1;
                }
                kept.truncate(end);
                kept.push_str(" [...]");
            }
            let mut tail = tail.lock().unwrap_or_else(|p| p.into_inner());
            if tail.lines.len() == OUTPUT_TAIL_LINES {
                tail.lines.pop_front();
            }
            tail.lines.push_back(kept);
            tail.written += 1;
        }
    })
}

/// How a process ended: its exit code, or the signal that ended it.
fn exit_status(status: &std::io::Result<std::process::ExitStatus>) -> String {
    match status {
        Ok(s) => match s.code() {
            Some(code) => code.to_string(),
            None => s.to_string(),
        },
        Err(e) => format!("unknown ({e})"),
    }
}

/// Waits until a watched process has exited; its exit status (`None` when
/// its watcher went away without one).
async fn exited(status: &mut tokio::sync::watch::Receiver<Option<String>>) -> Option<String> {
    status
        .wait_for(Option::is_some)
        .await
        .ok()
        .and_then(|s| s.clone())
}

/// Watches a started SDK process: whether (and how) it has exited, and the
/// last lines it wrote.
#[derive(Clone)]
struct ProcessExit {
    /// `Some(status)` once the process has exited and its output is read.
    status: tokio::sync::watch::Receiver<Option<String>>,
    output: OutputTail,
}

/// How often the autoscaler looks at the backlog.
pub const AUTOSCALE_INTERVAL: Duration = Duration::from_secs(1);

/// How often the CPU use of one-core SDK harness processes is sampled
/// (see [`SdkHarnesses::pick`]'s `alone` bundles).
pub const CPU_SAMPLE_INTERVAL: Duration = Duration::from_millis(200);

/// CPU demand (use plus runqueue wait, [`process_cpu_demand`]), in
/// thousandths of one core, from which a one-core SDK harness counts as
/// keeping its core busy: it takes no second `alone` bundle of a
/// descriptor (see [`SdkHarnesses::pick`]). A CPU-bound Python bundle keeps
/// its harness at 950 or more; one that waits (I/O, sleeps: Beam's
/// synthetic source sleeps between records) leaves it near 500.
pub const CORE_BUSY_PERMILLE: u32 = 750;
/// How long an SDK harness must sit idle before the autoscaler stops it.
pub const AUTOSCALE_IDLE: Duration = Duration::from_secs(5);
/// How long a dead SDK process gets to report its exit status.
const EXIT_GRACE: Duration = Duration::from_secs(2);

/// How long [`SdkHarnesses::stop`] waits for instructions already sent to
/// be answered before it closes the workers' streams.
pub const STOP_GRACE: Duration = Duration::from_secs(5);

/// How long [`SdkHarnesses::stop`] waits, once it has stopped them, for the
/// SDK harnesses to close their control and data streams.
const SDK_CLOSE_GRACE: Duration = Duration::from_secs(1);

/// How the job's worker count is managed (Dataflow's
/// `autoscaling_algorithm`, applied per environment). A worker runs
/// [`harnesses_per_worker`] SDK harnesses of each environment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scaling {
    /// A fixed number of workers (`NONE`, or no algorithm).
    Fixed(usize),
    /// `THROUGHPUT_BASED`: between `min` and `max` workers' worth of SDK
    /// harnesses per environment, more while bundles wait for a free one,
    /// fewer when some sit idle for [`AUTOSCALE_IDLE`].
    ThroughputBased { min: usize, max: usize },
}

impl Scaling {
    /// Workers the job starts with.
    pub fn initial(&self) -> usize {
        match *self {
            Scaling::Fixed(n) => n.max(1),
            Scaling::ThroughputBased { min, .. } => min.max(1),
        }
    }

    /// Most workers the job may have.
    pub fn max(&self) -> usize {
        match *self {
            Scaling::Fixed(n) => n.max(1),
            Scaling::ThroughputBased { min, max } => max.max(min).max(1),
        }
    }
}

/// A connection to an EXTERNAL environment's worker pool.
type PoolClient =
    beam::beam_fn_external_worker_pool_client::BeamFnExternalWorkerPoolClient<tonic::transport::Channel>;

/// A job's connections to its EXTERNAL environments' worker pools, by
/// endpoint URL. [`PoolChannels::preconnect`] opens them when the job is
/// prepared, so StartWorker at Run need not wait for a TCP and HTTP/2
/// handshake with the pool (1–2 ms with a client's in-process LOOPBACK
/// pool, whose Python is busy right after Run returns). Each serves for
/// [`PRECONNECT_TTL`]; later StartWorker calls dial afresh.
#[derive(Clone, Default)]
pub struct PoolChannels(Arc<Mutex<HashMap<String, Arc<PoolChannel>>>>);

/// One pool's connection: None once connecting failed.
type PoolChannel = tokio::sync::OnceCell<Option<tonic::transport::Channel>>;

/// How long a connection opened at Prepare serves StartWorker calls: the
/// job's first harnesses start right after Run; later ones (replacements,
/// autoscaling) dial afresh, so a connection that went stale meanwhile is
/// not used, and a job prepared but never run holds none for long.
pub const PRECONNECT_TTL: Duration = Duration::from_secs(30);

/// How long bundles promised by a split hold their SDK workers for other
/// splits ([`SdkHarnesses::split_ways`]), from the promise or from the
/// split handing its work to the engine ([`SdkHarnesses::split_done`]):
/// time enough for the engine to start them.
const PROMISE_TTL: Duration = Duration::from_millis(100);

/// Longest wait for a TCP connection to a worker pool.
const POOL_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

impl PoolChannels {
    /// Starts connecting, in the background, to the worker pool of each
    /// EXTERNAL environment in `environments`, for [`PRECONNECT_TTL`]. A
    /// pool that cannot be reached now is dialled again at Run, which
    /// reports the error. Call within a tokio runtime.
    pub fn preconnect(&self, environments: &HashMap<String, beam::Environment>) {
        for env in environments.values() {
            let Some(endpoint) = pool_endpoint(env) else {
                continue;
            };
            let cell = Arc::new(PoolChannel::new());
            self.map().insert(endpoint.clone(), cell.clone());
            let this = self.clone();
            tokio::spawn(async move {
                dial_once(&cell, &endpoint).await;
                tokio::time::sleep(PRECONNECT_TTL).await;
                let mut map = this.map();
                if map.get(&endpoint).is_some_and(|c| Arc::ptr_eq(c, &cell)) {
                    map.remove(&endpoint);
                }
            });
        }
    }

    /// Drops the job's connections (its end).
    pub fn clear(&self) {
        self.map().clear();
    }

    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<PoolChannel>>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A client of `endpoint`'s pool on the connection opened at Prepare
    /// (waiting for it while it is being made), or on a fresh one when
    /// there is none or it could not be made.
    ///
    /// # Errors
    /// The pool cannot be reached.
    async fn client(&self, endpoint: &str) -> std::result::Result<PoolClient, tonic::transport::Error> {
        let cell = self.map().get(endpoint).cloned();
        let preconnected = match cell {
            Some(cell) => dial_once(&cell, endpoint).await,
            None => None,
        };
        let channel = match preconnected {
            Some(channel) => channel,
            None => connect_pool(endpoint).await?,
        };
        Ok(PoolClient::new(channel)
            .max_decoding_message_size(MAX_GRPC_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_GRPC_MESSAGE_BYTES))
    }
}

/// `cell`'s connection to the pool at `endpoint`: made now if nobody made
/// it yet, else the one made (waiting while it is being made); None when
/// connecting failed.
async fn dial_once(cell: &PoolChannel, endpoint: &str) -> Option<tonic::transport::Channel> {
    cell.get_or_init(|| async { connect_pool(endpoint).await.ok() })
        .await
        .clone()
}

/// The worker pool endpoint URL of an EXTERNAL environment (LOOPBACK is
/// one); None for other environments or an undecodable payload.
fn pool_endpoint(env: &beam::Environment) -> Option<String> {
    if env.urn != urns::env::EXTERNAL {
        return None;
    }
    beam::ExternalPayload::decode(env.payload.as_slice())
        .ok()?
        .endpoint
        .map(|e| e.url)
}

/// Opens a connection to the worker pool at `endpoint` (`host:port` or a URL).
async fn connect_pool(
    endpoint: &str,
) -> std::result::Result<tonic::transport::Channel, tonic::transport::Error> {
    tonic::transport::Endpoint::new(weir_proto::grpc_uri(endpoint))?
        .connect_timeout(POOL_CONNECT_TIMEOUT)
        .connect()
        .await
}

/// How one SDK harness was started, so it can be stopped.
enum Handle {
    /// PROCESS or DOCKER: a task owns the child process; sending on `kill`
    /// (or dropping it) kills it. Also its semi-persistent folder.
    Process {
        kill: tokio::sync::oneshot::Sender<()>,
        exit: ProcessExit,
        dir: Option<std::path::PathBuf>,
        /// The process started (for PROCESS: the command, which may be
        /// `weir boot`; it writes the pid of a Python harness a fork server
        /// forked for it to `<dir>/harness.pid`).
        pid: Option<u32>,
    },
    /// EXTERNAL / LOOPBACK: the worker pool that started it.
    Pool { endpoint: String },
}

#[derive(Default)]
struct Pool {
    /// Workers by environment id that take bundles: connected, or dead and
    /// about to be replaced by their watcher.
    workers: HashMap<String, Vec<Arc<Worker>>>,
    /// Replacements and scale-ups being started, by environment id.
    starting: HashMap<String, usize>,
    /// Bundles waiting for a free worker, by environment id (the backlog).
    waiting: HashMap<String, usize>,
    /// Of those, `alone` bundles ([`SdkHarnesses::pick`]): each needs a
    /// harness of its own, by environment id.
    waiting_alone: HashMap<String, usize>,
    /// When each worker last finished a bundle (or joined), by worker id.
    last_busy: HashMap<String, Instant>,
    /// How each worker was started, by worker id.
    handles: HashMap<String, Handle>,
}

impl Pool {
    /// Counts a bundle of `env_id` into the backlog (`waiting` true) or out
    /// of it; `alone` as [`SdkHarnesses::pick`]'s.
    fn count_waiting(&mut self, env_id: &str, alone: bool, waiting: bool) {
        let counts = [Some(&mut self.waiting), alone.then_some(&mut self.waiting_alone)];
        for n in counts.into_iter().flatten() {
            let n = n.entry(env_id.to_string()).or_default();
            *n = if waiting { *n + 1 } else { n.saturating_sub(1) };
        }
    }

    /// SDK harnesses the backlog of `env_id` asks for, with `room` bundles
    /// each: one per waiting `alone` bundle (it runs beside no other bundle
    /// of its descriptor), one per `room` other waiting bundles.
    fn harnesses_wanted(&self, env_id: &str, room: usize) -> usize {
        let waiting = self.waiting.get(env_id).copied().unwrap_or(0);
        let alone = self.waiting_alone.get(env_id).copied().unwrap_or(0).min(waiting);
        alone + (waiting - alone).div_ceil(room.max(1))
    }
}

/// The SDK harnesses of one job, looked after the way Dataflow's runner
/// harness looks after its SDK processes: a harness that dies is replaced
/// (a fresh worker id, started the way its environment says), a stuck one
/// can be restarted ([`SdkHarnesses::replace`]), and under
/// [`Scaling::ThroughputBased`] the count follows the backlog. Every change
/// goes to the job's messages through its [`LogSink`].
pub struct SdkHarnesses {
    fn_api: Arc<FnApi>,
    job_id: String,
    environments: HashMap<String, beam::Environment>,
    provision: beam::ProvisionInfo,
    log: LogSink,
    /// Per environment id: bundles one of its harnesses runs at a time
    /// ([`bundles_per_harness`]).
    bundles_per_worker: HashMap<String, usize>,
    /// Per environment id: its SDK harnesses per worker ([`harnesses_per_worker`]).
    harnesses_per_worker: HashMap<String, usize>,
    /// How the job sized its harnesses.
    sizing: HarnessSizing,
    pool: Mutex<Pool>,
    changed: tokio::sync::Notify,
    stopping: AtomicBool,
    /// Turns true when [`SdkHarnesses::stop`] begins: harnesses still
    /// waiting to connect give up then, instead of at [`CONNECT_TIMEOUT`].
    stopped: tokio::sync::watch::Sender<bool>,
    /// The job's cancel flag: set (with `failure`) when the job cannot go
    /// on, so its run stops and fails it with `failure`.
    cancel: Arc<AtomicBool>,
    /// Why the job cannot go on (e.g. its LOOPBACK/EXTERNAL worker pool is gone).
    failure: Mutex<Option<String>>,
    /// Per environment id: bundles promised to ready SDK workers by recent
    /// splits ([`SdkHarnesses::split_ways`]) and not picked yet, and when
    /// the last promise was made or renewed: other splits meanwhile do not
    /// count those workers again. Forgotten after [`PROMISE_TTL`].
    promised: Mutex<HashMap<String, (usize, tokio::time::Instant)>>,
    /// The job's connections to its worker pools, for StartWorker.
    pools: PoolChannels,
}

/// Starts `scaling.initial()` workers' SDK harnesses for each environment
/// ([`harnesses_per_worker`] each, by `sizing`), all at once, returns as
/// soon as each environment has one connected to the control service (the
/// rest join as they connect), and looks after them. Each harness of an
/// environment is sent at most [`bundles_per_harness`] bundles at a time.
///
/// # Errors
/// [`HarnessError::Environment`] when one cannot be started,
/// [`HarnessError::ConnectTimeout`] when one does not connect in time,
/// [`HarnessError::Cancelled`] as soon as (within 100 ms) `cancel` is set;
/// the ones already started are stopped.
#[allow(clippy::too_many_arguments)]
pub async fn start(
    fn_api: &Arc<FnApi>,
    job_id: &str,
    environments: &HashMap<String, beam::Environment>,
    scaling: Scaling,
    sizing: HarnessSizing,
    provision: &beam::ProvisionInfo,
    log: LogSink,
    cancel: Arc<AtomicBool>,
    pools: PoolChannels,
) -> Result<Arc<SdkHarnesses>> {
    for (env_id, env) in environments {
        validate(env_id, env)?;
    }
    let harnesses = Arc::new(SdkHarnesses {
        fn_api: fn_api.clone(),
        job_id: job_id.to_string(),
        environments: environments.clone(),
        provision: provision.clone(),
        log,
        bundles_per_worker: environments
            .iter()
            .map(|(id, env)| (id.clone(), bundles_per_harness(env, &sizing)))
            .collect(),
        harnesses_per_worker: environments
            .iter()
            .map(|(id, env)| (id.clone(), harnesses_per_worker(env, &sizing)))
            .collect(),
        sizing,
        pool: Mutex::default(),
        changed: tokio::sync::Notify::new(),
        stopping: AtomicBool::new(false),
        stopped: tokio::sync::watch::channel(false).0,
        cancel: cancel.clone(),
        failure: Mutex::new(None),
        promised: Mutex::new(HashMap::new()),
        pools,
    });
    let cancelled = async {
        while !cancel.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    let started = tokio::select! {
        r = harnesses.start_initial(scaling.initial()) => r,
        () = cancelled => Err(HarnessError::Cancelled),
    };
    match started {
        Ok(()) => {
            if let Scaling::ThroughputBased { min, .. } = scaling {
                harnesses.autoscale(min.max(1), scaling.max());
            }
            if harnesses.environments.keys().any(|id| harnesses.harness_cpu_sampled(id)) {
                harnesses.sample_cpu();
            }
            Ok(harnesses)
        }
        Err(e) => {
            harnesses.stop().await;
            Err(e)
        }
    }
}

impl SdkHarnesses {
    fn pool(&self) -> std::sync::MutexGuard<'_, Pool> {
        self.pool.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Launches `workers` workers' harnesses of every environment
    /// ([`SdkHarnesses::harnesses_per_worker`] each) at once and
    /// returns as soon as each environment has one connected: bundles start
    /// on it while the others are still coming up (they join the pool as
    /// they connect; [`SdkHarnesses::pick`] waits for them while they are
    /// counted in `starting`).
    ///
    /// # Errors
    /// The first launch or connection that fails before every environment
    /// has a harness. One that fails later fails the job
    /// ([`SdkHarnesses::fail`]) with the same message.
    async fn start_initial(self: &Arc<Self>, workers: usize) -> Result<()> {
        let mut env_ids: Vec<_> = self.environments.keys().cloned().collect();
        env_ids.sort();
        {
            let mut pool = self.pool();
            for env_id in &env_ids {
                *pool.starting.entry(env_id.clone()).or_default() +=
                    workers * self.harnesses_per_worker(env_id);
            }
        }
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(String, Result<()>)>();
        for env_id in &env_ids {
            for _ in 0..workers * self.harnesses_per_worker(env_id) {
                let (this, env_id, tx) = (self.clone(), env_id.clone(), tx.clone());
                tokio::spawn(async move {
                    let started = async {
                        let (w, exit) = this.launch(&env_id).await?;
                        if let Err(e) = wait_connected(&w, exit, this.stopped.subscribe()).await {
                            this.stop_worker(&w, Duration::ZERO).await;
                            return Err(e);
                        }
                        if this.stopping.load(Ordering::SeqCst) {
                            this.stop_worker(&w, Duration::ZERO).await;
                        } else {
                            this.join(&env_id, w);
                        }
                        Ok(())
                    }
                    .await;
                    this.done_starting(&env_id);
                    // After start returned, nobody listens: a harness that
                    // could not start then fails the job.
                    if let Err(tokio::sync::mpsc::error::SendError((_, Err(e)))) = tx.send((env_id, started)) {
                        if !this.stopping.load(Ordering::SeqCst) {
                            this.fail(e.to_string());
                        }
                    }
                });
            }
        }
        drop(tx);
        let mut waiting: std::collections::HashSet<String> = env_ids.into_iter().collect();
        while !waiting.is_empty() {
            match rx.recv().await {
                Some((env_id, Ok(()))) => {
                    waiting.remove(&env_id);
                }
                Some((_, Err(e))) => return Err(e),
                None => break,
            }
        }
        Ok(())
    }

    /// Adds a connected worker to the pool and watches it for death.
    fn join(self: &Arc<Self>, env_id: &str, worker: Arc<Worker>) {
        {
            let mut pool = self.pool();
            pool.last_busy.insert(worker.id.clone(), Instant::now());
            pool.workers
                .entry(env_id.to_string())
                .or_default()
                .push(worker.clone());
        }
        self.changed.notify_waiters();
        let this = self.clone();
        let env_id = env_id.to_string();
        tokio::spawn(async move {
            let mut rx = worker.connected.subscribe();
            if rx.wait_for(|c| !*c).await.is_err() || this.stopping.load(Ordering::SeqCst) {
                return;
            }
            let why = worker
                .disconnect_reason
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone()
                .unwrap_or_else(|| "control stream closed".into());
            this.replace(&env_id, &worker, format!("died ({why})"), EXIT_GRACE);
        });
    }

    /// Starts one SDK harness of `env_id` (without waiting for it to
    /// connect); for a process, also how to see it exit.
    async fn launch(&self, env_id: &str) -> Result<(Arc<Worker>, Option<ProcessExit>)> {
        let env = &self.environments[env_id];
        let url = self.fn_api.url.clone();
        let worker_id = self.fn_api.fresh_id(&format!("{}-worker-", self.job_id));
        let mut info = self.provision.clone();
        info.logging_endpoint = descriptor(&url);
        info.artifact_endpoint = descriptor(&url);
        info.control_endpoint = descriptor(&url);
        info.dependencies = env.dependencies.clone();
        let worker = self.fn_api.add_worker(
            worker_id.clone(),
            self.job_id.clone(),
            info,
            self.log.clone(),
        );
        // A PROCESS harness that stands for one core gets a core of its
        // own, spread apart from its environment's other harnesses.
        let pin = if env.urn == urns::env::PROCESS
            && self.one_core_process(env_id)
            && cores_per_harness(env, &self.sizing) == 1
        {
            cores::pin(&format!("{}/{env_id}", self.job_id))
        } else {
            None
        };
        if let Some(p) = &pin {
            tracing::info!(worker = %worker_id, "SDK harness runs on CPU {} (--pin_sdk_harnesses)", p.cpu());
        }
        // What a harness process prints to stdout (a DoFn's `print`) goes
        // to the job's logs too, as Dataflow shows a worker's stdout.
        let (fn_api, job_id) = (self.fn_api.clone(), self.job_id.clone());
        let printed: PrintedLine = Arc::new(move |text: String| {
            if let Some(sink) = fn_api.sdk_log(&job_id) {
                sink(WorkerLog::Info, text);
            }
        });
        match spawn_harness(env_id, env, &worker_id, &url, worker.logging.clone(), printed, &self.pools, pin)
            .await
        {
            Ok(handle) => {
                let mut pool = self.pool();
                if self.stopping.load(Ordering::SeqCst) {
                    drop(pool);
                    self.fn_api.remove_worker(&worker_id);
                    stop_handle_of(handle, &worker_id, Duration::ZERO).await;
                    return Err(env_error(env_id, &env.urn, "the job is stopping"));
                }
                let exit = match &handle {
                    Handle::Process { exit, .. } => Some(exit.clone()),
                    Handle::Pool { .. } => None,
                };
                pool.handles.insert(worker_id, handle);
                Ok((worker, exit))
            }
            Err(e) => {
                self.fn_api.remove_worker(&worker_id);
                Err(e)
            }
        }
    }

    /// Forgets a worker and stops its process (or asks its pool to);
    /// returns how the process ended when it did so within `grace`.
    async fn stop_worker(&self, worker: &Worker, grace: Duration) -> Option<String> {
        self.fn_api.remove_worker(&worker.id);
        let handle = {
            let mut pool = self.pool();
            pool.last_busy.remove(&worker.id);
            pool.handles.remove(&worker.id)
        };
        match handle {
            Some(h) => stop_handle_of(h, &worker.id, grace).await,
            None => None,
        }
    }

    /// Takes `worker` of `env_id` out of the pool and starts a replacement
    /// (returns at once; a bundle waiting for a worker waits for it). `what`
    /// says what happened to it for the job's messages ("died (...)"). The
    /// old harness is stopped: given `grace` to exit on its own, then
    /// killed. Does nothing when the worker already left the pool.
    pub fn replace(
        self: &Arc<Self>,
        env_id: &str,
        worker: &Arc<Worker>,
        what: String,
        grace: Duration,
    ) {
        {
            let mut pool = self.pool();
            let Some(ws) = pool.workers.get_mut(env_id) else {
                return;
            };
            let Some(i) = ws.iter().position(|w| w.id == worker.id) else {
                return;
            };
            ws.remove(i);
            *pool.starting.entry(env_id.to_string()).or_default() += 1;
        }
        if !self.stopping.load(Ordering::SeqCst) {
            tracing::warn!(job = %self.job_id, worker = %worker.id, "SDK harness {what}; restarting it");
            (self.log)(
                WorkerLog::Warning,
                format!("SDK harness {} {what}; restarting it", worker.id),
            );
        }
        let this = self.clone();
        let (env_id, worker) = (env_id.to_string(), worker.clone());
        tokio::spawn(async move {
            let exit = this.stop_worker(&worker, grace).await;
            let what = match exit {
                Some(status) => format!("{what}, exit status {status}"),
                None => what,
            };
            if this.stopping.load(Ordering::SeqCst) {
                this.done_starting(&env_id);
                return;
            }
            match this.start_one(&env_id).await {
                Ok(new) => (this.log)(
                    WorkerLog::Warning,
                    format!("SDK harness {} {what}; restarted as {}", worker.id, new.id),
                ),
                // The job is stopping: its replacement was not needed.
                Err(_) if this.stopping.load(Ordering::SeqCst) => {}
                Err(e) => {
                    let text = format!(
                        "SDK harness {} {what}; restarting it failed: {e}",
                        worker.id
                    );
                    (this.log)(WorkerLog::Error, text.clone());
                    // A LOOPBACK/EXTERNAL worker pool that no longer answers
                    // (its client went away) cannot give the job a harness
                    // again: fail the job rather than wait forever.
                    if this.environments[&env_id].urn == urns::env::EXTERNAL {
                        this.fail(format!(
                            "the worker pool of environment {env_id} is gone: {text}"
                        ));
                    }
                }
            }
        });
    }

    /// Starts one more worker of `env_id` whose start is already counted in
    /// `starting`; adds it to the pool once connected.
    async fn start_one(self: &Arc<Self>, env_id: &str) -> Result<Arc<Worker>> {
        let started = async {
            let (w, exit) = self.launch(env_id).await?;
            if let Err(e) = wait_connected(&w, exit, self.stopped.subscribe()).await {
                self.stop_worker(&w, Duration::ZERO).await;
                return Err(e);
            }
            Ok(w)
        }
        .await;
        if let Ok(w) = &started {
            self.join(env_id, w.clone());
        }
        self.done_starting(env_id);
        started
    }

    fn done_starting(&self, env_id: &str) {
        if let Some(n) = self.pool().starting.get_mut(env_id) {
            *n = n.saturating_sub(1);
        }
        self.changed.notify_waiters();
    }

    /// Bundles one harness of environment `env_id` runs at a time.
    pub fn bundles_per_worker(&self, env_id: &str) -> usize {
        self.bundles_per_worker.get(env_id).copied().unwrap_or(1)
    }

    /// SDK harnesses of `env_id` per worker ([`harnesses_per_worker`]).
    pub fn harnesses_per_worker(&self, env_id: &str) -> usize {
        self.harnesses_per_worker.get(env_id).copied().unwrap_or(1)
    }

    /// A connected worker of `env_id` for a bundle of `descriptor` (a
    /// `ProcessBundleDescriptor` id): one with fewer than
    /// [`SdkHarnesses::bundles_per_worker`] bundles in flight, the least
    /// busy, among those one with an idle bundle processor for
    /// `descriptor` first; its in-flight counts already raised. Waits,
    /// counted in the backlog, while every worker is busy or being
    /// replaced.
    ///
    /// A `small` bundle of an SDK whose harness runs on one core (no
    /// `beam:protocol:multi_core_bundle_processing:v1`) also waits, up to
    /// [`PROCESSOR_WAIT`], rather than make a harness that already runs
    /// `descriptor` in every processor it built build another: the
    /// harness would run both on its one core anyway, and building a
    /// processor costs more than a small bundle (two one-element bundles
    /// on a LOOPBACK client took 33-36 ms each at once against 19 ms for
    /// one alone). That wait is not counted in the backlog: it asks for no
    /// more harnesses and holds back no split.
    ///
    /// An `alone` bundle of such an SDK goes only to a harness that runs no
    /// other bundle of `descriptor`, or whose process leaves its core partly
    /// idle ([`Worker::cpu_permille`] under [`CORE_BUSY_PERMILLE`]; none
    /// yet counts as busy), when each harness is a PROCESS standing for one
    /// core (not the client's in-process pool, not one harness for a
    /// worker's cores): two CPU-bound bundles on one interpreter only take
    /// turns at its lock (see the bundle's caller), while a bundle that
    /// waits leaves room for a second.
    ///
    /// # Errors
    /// When the environment has no worker left and none is starting.
    pub(crate) async fn pick(
        &self,
        env_id: &str,
        descriptor: &str,
        small: bool,
        alone: bool,
    ) -> std::result::Result<Arc<Worker>, String> {
        let one_core = self
            .environments
            .get(env_id)
            .is_some_and(|env| !declares_multi_core(env));
        let alone = alone && self.harness_cpu_sampled(env_id);
        // tokio's clock, so tests can pause it.
        let reuse_until =
            (small && one_core).then(|| tokio::time::Instant::now() + PROCESSOR_WAIT);
        let mut counted = false;
        loop {
            let changed = self.changed.notified();
            let reuse_only = reuse_until.is_some_and(|t| tokio::time::Instant::now() < t);
            {
                let mut pool = self.pool();
                if self.is_stopping() {
                    if counted {
                        pool.count_waiting(env_id, alone, false);
                    }
                    return Err(format!(
                        "the SDK harnesses of job {} are stopped",
                        self.job_id
                    ));
                }
                let ws = pool.workers.get(env_id).cloned().unwrap_or_default();
                let room = self.bundles_per_worker(env_id);
                let with_room: Vec<&Arc<Worker>> = ws
                    .iter()
                    .filter(|w| w.is_connected() && w.bundles_in_flight() < room)
                    .collect();
                // (bundles in flight, no idle processor for `descriptor`).
                let free = with_room
                    .iter()
                    .map(|w| {
                        let (running, built) = w.processors_of(descriptor);
                        (*w, running, built)
                    })
                    .filter(|&(_, running, built)| !reuse_only || running == 0 || built > running)
                    .filter(|&(w, running, _)| {
                        !(alone && running > 0 && w.cpu_permille() >= CORE_BUSY_PERMILLE)
                    })
                    .min_by_key(|&(w, running, built)| {
                        (w.bundles_in_flight(), alone && running > 0, built <= running)
                    });
                let done = match free {
                    Some((w, running, _)) => {
                        tracing::trace!(worker = %w.id, descriptor, alone, running, permille = w.cpu_permille(), in_flight = w.bundles_in_flight(), "bundle picks a worker");
                        w.in_flight.fetch_add(1, Ordering::Relaxed);
                        w.bundles_moved();
                        let mut promised = self.promised.lock().unwrap_or_else(|p| p.into_inner());
                        if let Some(p) = promised.get_mut(env_id) {
                            p.0 = p.0.saturating_sub(1);
                        }
                        w.descriptor_started(descriptor);
                        Some(Ok(w.clone()))
                    }
                    None if ws.is_empty()
                        && pool.starting.get(env_id).copied().unwrap_or(0) == 0 =>
                    {
                        Some(Err(format!("no SDK harness left for environment {env_id}")))
                    }
                    None => None,
                };
                // In the backlog only while no worker has room, or none
                // is free of its descriptor for an `alone` bundle (demand
                // for more harnesses): a small bundle waiting for an idle
                // processor is no demand for more harnesses (autoscaling)
                // and holds back no split.
                let blocked = done.is_none() && (with_room.is_empty() || alone);
                if counted != blocked {
                    pool.count_waiting(env_id, alone, blocked);
                    counted = blocked;
                }
                if let Some(result) = done {
                    return result;
                }
            }
            // Also wake up now and then, in case a worker died without
            // finishing a bundle; and when a small bundle's wait is over.
            let mut nap = Duration::from_millis(200);
            if let Some(t) = reuse_until.filter(|_| reuse_only) {
                nap = nap.min(t.saturating_duration_since(tokio::time::Instant::now()));
            }
            let _ = tokio::time::timeout(nap, changed).await;
        }
    }

    /// Stops the job with `why` as its failure ([`SdkHarnesses::failure`]).
    pub fn fail(&self, why: String) {
        tracing::warn!(job = %self.job_id, "{why}");
        self.failure
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get_or_insert(why);
        self.cancel.store(true, Ordering::SeqCst);
        self.changed.notify_waiters();
    }

    /// Why the job cannot go on, when [`SdkHarnesses::fail`] said so.
    pub fn failure(&self) -> Option<String> {
        self.failure
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Adds a note to the job's messages (through its [`LogSink`]).
    pub fn note(&self, level: WorkerLog, text: String) {
        (self.log)(level, text);
    }

    /// True once [`SdkHarnesses::stop`] was called (the job ended).
    pub fn is_stopping(&self) -> bool {
        self.stopping.load(Ordering::SeqCst)
    }

    /// Gives back a worker [`SdkHarnesses::pick`] handed out for a bundle
    /// of `descriptor`; `failed` when the bundle failed (the SDK harness
    /// then drops its processor).
    pub(crate) fn release(&self, worker: &Worker, descriptor: &str, failed: bool) {
        worker.descriptor_ended(descriptor, failed);
        worker.in_flight.fetch_sub(1, Ordering::Relaxed);
        worker.bundles_moved();
        {
            let mut pool = self.pool();
            if pool.last_busy.contains_key(&worker.id) {
                pool.last_busy.insert(worker.id.clone(), Instant::now());
            }
        }
        self.changed.notify_waiters();
    }

    /// True, once, when worker `busy` of `env_id` can take work split off a
    /// bundle it runs: each harness of `env_id` is a PROCESS standing for
    /// one core whose CPU is sampled ([`SdkHarnesses::harness_cpu_sampled`]),
    /// `busy` has room for another bundle, and its process left its core
    /// partly idle ([`Worker::cpu_permille`] above 0, which stands for a
    /// process that could not be read, and under [`CORE_BUSY_PERMILLE`]):
    /// its bundle waits (a source that sleeps, I/O), and a second bundle
    /// fills those waits. Then false until a bundle starts or ends on
    /// `busy`: the work split off counts as taken, and is promised as a
    /// worker of [`SdkHarnesses::split_ways`] is (settle it with
    /// [`SdkHarnesses::split_done`]).
    pub(crate) fn take_spare_core(&self, env_id: &str, busy: &str) -> bool {
        if !self.harness_cpu_sampled(env_id) {
            return false;
        }
        let room = self.bundles_per_worker(env_id);
        let pool = self.pool();
        let Some(w) = pool
            .workers
            .get(env_id)
            .and_then(|ws| ws.iter().find(|w| w.id == busy))
        else {
            return false;
        };
        let moves = w.bundle_moves.load(Ordering::Relaxed);
        let spare = w.is_connected()
            && w.bundles_in_flight() < room
            && (1..CORE_BUSY_PERMILLE).contains(&w.cpu_permille())
            && w.spare_taken_at.load(Ordering::Relaxed) != moves
            // No bundle started or ended here meanwhile (`release` moves
            // bundles outside the pool lock).
            && w.bundle_moves.load(Ordering::Relaxed) == moves;
        if spare {
            w.spare_taken_at.store(moves, Ordering::Relaxed);
            drop(pool);
            self.promise(env_id, |_| 1);
        }
        spare
    }

    /// Promises `ready(outstanding)` more workers of `env_id` to a split
    /// (`outstanding`: those promised within [`PROMISE_TTL`], the others
    /// lapsed) and returns that number; a promise of any renews the
    /// deadline. Take it after the pool lock (pick takes the two in that
    /// order).
    fn promise(&self, env_id: &str, ready: impl FnOnce(usize) -> usize) -> usize {
        let mut promised = self.promised.lock().unwrap_or_else(|p| p.into_inner());
        let promised = promised
            .entry(env_id.to_string())
            .or_insert((0, tokio::time::Instant::now()));
        if promised.1.elapsed() > PROMISE_TTL {
            promised.0 = 0;
        }
        let ready = ready(promised.0);
        if ready > 0 {
            *promised = (promised.0 + ready, tokio::time::Instant::now());
        }
        ready
    }

    /// True when a connected worker of `env_id` other than `busy` has no bundle.
    pub(crate) fn has_idle_worker(&self, env_id: &str, busy: &str) -> bool {
        self.pool().workers.get(env_id).is_some_and(|ws| {
            ws.iter()
                .any(|w| w.id != busy && w.is_connected() && w.bundles_in_flight() == 0)
        })
    }

    /// In how many new bundles, at most `most`, work split off a bundle of
    /// `env_id` running on `busy` could start now (0 when none): for an SDK whose
    /// harnesses run bundles on one core each in processes of their own
    /// (Python PROCESS), the other idle workers, a core each; otherwise
    /// (a multi-core SDK, the client's in-process pool) the free bundle
    /// slots of the environment's workers, at most the machine's cores not
    /// running one of its bundles.
    ///
    /// The workers returned are promised to this split for [`PROMISE_TTL`]
    /// or until bundles are picked: another split meanwhile does not count
    /// them again. So call it only for a split about to be asked.
    pub(crate) fn split_ways(&self, env_id: &str, busy: &str, most: usize) -> usize {
        let Some(env) = self.environments.get(env_id) else {
            return 0;
        };
        let room = self.bundles_per_worker(env_id);
        let pool = self.pool();
        let ws: Vec<&Arc<Worker>> = pool
            .workers
            .get(env_id)
            .map(|ws| ws.iter().filter(|w| w.is_connected()).collect())
            .unwrap_or_default();
        let ways = if !declares_multi_core(env) && !in_client_pool(env, &self.sizing) {
            ws.iter()
                .filter(|w| w.id != busy && w.bundles_in_flight() == 0)
                .count()
        } else {
            let running: usize = ws.iter().map(|w| w.bundles_in_flight()).sum();
            let free: usize = ws
                .iter()
                .map(|w| room.saturating_sub(w.bundles_in_flight()))
                .sum();
            free.min(machine_cores().saturating_sub(running))
        };
        // After the pool lock (pick takes the two in that order).
        self.promise(env_id, |outstanding| ways.saturating_sub(outstanding).min(most))
    }

    /// Settles `ways` workers [`SdkHarnesses::split_ways`] promised to a
    /// split of `env_id`: when it handed work to the engine, they stay
    /// promised for [`PROMISE_TTL`] from now (the SDK's answer may have
    /// taken most of it); when it handed none (the SDK declined, or the
    /// bundle ended first), they are free again.
    pub(crate) fn split_done(&self, env_id: &str, ways: usize, handed: bool) {
        if ways == 0 {
            return;
        }
        let mut promised = self.promised.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(p) = promised.get_mut(env_id) {
            if handed {
                p.1 = tokio::time::Instant::now();
            } else {
                p.0 = p.0.saturating_sub(ways);
            }
        }
    }

    /// Resolves at the first notified change of the pool after this call
    /// (not after its first poll): a bundle ended (its harness may be
    /// idle), a worker joined, a start ended, the job failed or stopped.
    pub(crate) fn pool_changed(&self) -> tokio::sync::futures::Notified<'_> {
        self.changed.notified()
    }

    /// True when each SDK harness of `env_id` stands for one core: it runs
    /// the default [`SINGLE_CORE_BUNDLES_PER_HARNESS`] bundles, not
    /// `number_of_worker_harness_threads` nor two for each of a worker's
    /// cores (`no_use_multiple_sdk_containers`), where other harnesses
    /// could not take a bundle it turned away.
    fn harness_per_core(&self, env_id: &str) -> bool {
        self.sizing.harness_threads.is_none()
            && self.bundles_per_worker(env_id) == SINGLE_CORE_BUNDLES_PER_HARNESS
    }

    /// True when each SDK harness of `env_id` is a PROCESS of its own that
    /// stands for one core ([`SdkHarnesses::one_core_process`],
    /// [`SdkHarnesses::harness_per_core`]) and its CPU use can be read
    /// (Linux): the harnesses whose `alone` bundles [`SdkHarnesses::pick`]
    /// keeps apart while their CPU use says they are busy.
    fn harness_cpu_sampled(&self, env_id: &str) -> bool {
        cfg!(target_os = "linux")
            && self.environments.get(env_id).is_some_and(|env| env.urn == urns::env::PROCESS)
            && self.one_core_process(env_id)
            && self.harness_per_core(env_id)
    }

    /// True when each SDK harness of `env_id` is an interpreter of its own
    /// that runs its bundles on about one core: its SDK does not declare
    /// `beam:protocol:multi_core_bundle_processing:v1` and it is not the
    /// client's in-process pool ([`in_client_pool`]). Only another, idle
    /// harness can take a residual of its bundle.
    pub(crate) fn one_core_process(&self, env_id: &str) -> bool {
        self.environments
            .get(env_id)
            .is_some_and(|env| !declares_multi_core(env) && !in_client_pool(env, &self.sizing))
    }

    /// True when a residual of a splittable DoFn's bundle running on `busy`
    /// has an SDK harness to run on: another connected worker of `env_id`
    /// is idle; or, for an SDK that runs bundles on many cores
    /// ([`declares_multi_core`]), no element of the stage waits
    /// (`stage_backlog` 0) and a bundle could start now on any worker,
    /// `busy` included ([`SdkHarnesses::has_room`]); or, in the client's
    /// in-process pool ([`in_client_pool`]: one interpreter), the same and
    /// fewer of its bundles in flight than the machine has cores, as if a
    /// harness per core had one idle. A Python harness of its own runs its
    /// bundles on about one core, so only another worker counts. (The
    /// residual still waits while its timely worker has its most bundles of
    /// the stage in flight.)
    pub(crate) fn could_run_a_residual(&self, env_id: &str, busy: &str, stage_backlog: usize) -> bool {
        let Some(env) = self.environments.get(env_id) else {
            return self.has_idle_worker(env_id, busy);
        };
        let spare_core = || {
            self.workers(env_id).iter().map(|w| w.bundles_in_flight()).sum::<usize>() < machine_cores()
        };
        self.has_idle_worker(env_id, busy)
            || stage_backlog == 0
                && (declares_multi_core(env) || in_client_pool(env, &self.sizing) && spare_core())
                && self.has_room(env_id)
    }

    /// True when a bundle of `env_id` could start at once: none waits for a
    /// worker, and a connected worker has fewer bundles in flight than
    /// [`SdkHarnesses::bundles_per_worker`].
    pub(crate) fn has_room(&self, env_id: &str) -> bool {
        let room = self.bundles_per_worker(env_id);
        let pool = self.pool();
        pool.waiting.get(env_id).copied().unwrap_or(0) == 0
            && pool.workers.get(env_id).is_some_and(|ws| {
                ws.iter()
                    .any(|w| w.is_connected() && w.bundles_in_flight() < room)
            })
    }

    /// Workers of `env_id` in the pool now.
    pub fn workers(&self, env_id: &str) -> Vec<Arc<Worker>> {
        self.pool().workers.get(env_id).cloned().unwrap_or_default()
    }

    /// Bundles waiting for a free worker of `env_id`.
    pub fn backlog(&self, env_id: &str) -> usize {
        self.pool().waiting.get(env_id).copied().unwrap_or(0)
    }

    /// Samples, every [`CPU_SAMPLE_INTERVAL`] until the job stops, the CPU
    /// demand ([`process_cpu_demand`]) of each PROCESS SDK harness into [`Worker::cpu_permille`] (the
    /// busier of its last two windows, each one in which its bundles
    /// neither started nor ended): the Python harness a fork server forked
    /// (its pid in `<semi_persist_dir>/harness.pid`) or else the process
    /// started. Only the workers of environments whose `alone` bundles
    /// [`SdkHarnesses::pick`] keeps apart are sampled
    /// ([`SdkHarnesses::harness_cpu_sampled`]); one whose process cannot be
    /// read gets 0, so it never counts as busy, and so does, near enough,
    /// one whose command starts Python as a child rather than exec it. A
    /// harness found leaving its core partly idle wakes the bundles waiting
    /// in [`SdkHarnesses::pick`].
    fn sample_cpu(self: &Arc<Self>) {
        let this = self.clone();
        tokio::spawn(async move {
            // By worker id: the last sample.
            let mut last: HashMap<String, CpuSample> = HashMap::new();
            let ticks_per_second = clock_ticks_per_second();
            loop {
                // The sampled environments' workers, each with its PROCESS
                // folder and process (under the lock; files read after).
                let workers: Vec<(Arc<Worker>, Option<(std::path::PathBuf, Option<u32>)>)> = {
                    let pool = this.pool();
                    pool.workers
                        .iter()
                        .filter(|(env_id, _)| this.harness_cpu_sampled(env_id))
                        .flat_map(|(_, ws)| ws)
                        .map(|w| {
                            let process = match pool.handles.get(&w.id) {
                                Some(Handle::Process { dir: Some(d), pid, .. }) => Some((d.clone(), *pid)),
                                _ => None,
                            };
                            (w.clone(), process)
                        })
                        .collect()
                };
                let now = Instant::now();
                let mut freed = false;
                last.retain(|id, _| workers.iter().any(|(w, _)| &w.id == id));
                for (w, process) in workers {
                    // The pid `weir boot` wrote for a harness it had forked,
                    // or else the process started.
                    let pid = process
                        .and_then(|(dir, pid)| crate::boot::forked_harness_pid(&dir).or(pid));
                    let Some((pid, demand)) =
                        pid.and_then(|p| Some((p, process_cpu_demand(p, ticks_per_second)?)))
                    else {
                        w.cpu_permille.store(0, Ordering::Relaxed);
                        continue;
                    };
                    let sample = CpuSample::after(
                        last.get(&w.id),
                        pid,
                        now,
                        demand,
                        w.bundle_moves.load(Ordering::Relaxed),
                        w.bundles_in_flight(),
                    );
                    let (window, permille) = (sample.window, sample.permille);
                    let before = w.cpu_permille.swap(permille, Ordering::Relaxed);
                    tracing::trace!(worker = %w.id, window, bundles = w.bundles_in_flight(), "SDK harness CPU sample");
                    if (before >= CORE_BUSY_PERMILLE) != (permille >= CORE_BUSY_PERMILLE) {
                        tracing::debug!(
                            worker = %w.id,
                            permille,
                            bundles = w.bundles_in_flight(),
                            "SDK harness process {}",
                            if permille >= CORE_BUSY_PERMILLE {
                                "keeps its core busy, or its bundles changed"
                            } else {
                                "leaves its core partly idle"
                            }
                        );
                    }
                    freed |= before >= CORE_BUSY_PERMILLE && permille < CORE_BUSY_PERMILLE;
                    last.insert(w.id.clone(), sample);
                }
                if freed {
                    this.changed.notify_waiters();
                }
                tokio::time::sleep(CPU_SAMPLE_INTERVAL).await;
                if this.stopping.load(Ordering::SeqCst) {
                    return;
                }
            }
        });
    }

    /// Runs the THROUGHPUT_BASED autoscaler until the job stops, between
    /// `min` and `max` workers' harnesses per environment: every
    /// [`AUTOSCALE_INTERVAL`], an environment with waiting bundles gets
    /// enough new harnesses for them (one per `bundles_per_worker` waiting
    /// bundles, one per waiting `alone` bundle, up to its most); one with no backlog stops a harness idle
    /// for [`AUTOSCALE_IDLE`] while it has more than its fewest.
    fn autoscale(self: &Arc<Self>, min: usize, max: usize) {
        let mut env_ids: Vec<String> = self.environments.keys().cloned().collect();
        env_ids.sort();
        // Per environment: (id, fewest, most) SDK harnesses.
        let bounds: Vec<(String, usize, usize)> = env_ids
            .iter()
            .map(|id| {
                let per = self.harnesses_per_worker(id);
                (id.clone(), min * per, max * per)
            })
            .collect();
        let range = match bounds.as_slice() {
            [(_, lo, hi), rest @ ..] if rest.iter().all(|(_, l, h)| l == lo && h == hi) => {
                format!("between {lo} and {hi} SDK harness(es) per environment")
            }
            _ => bounds
                .iter()
                .map(|(id, lo, hi)| format!("between {lo} and {hi} SDK harness(es) of environment {id}"))
                .collect::<Vec<_>>()
                .join(", "),
        };
        (self.log)(
            WorkerLog::Info,
            format!("autoscaling (THROUGHPUT_BASED): {range} ({min} to {max} worker(s)), following the bundles waiting for one"),
        );
        let this = self.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(AUTOSCALE_INTERVAL).await;
                if this.stopping.load(Ordering::SeqCst) {
                    return;
                }
                for (env_id, lo, hi) in &bounds {
                    this.autoscale_step(env_id, *lo, *hi).await;
                }
            }
        });
    }

    async fn autoscale_step(self: &Arc<Self>, env_id: &str, min: usize, max: usize) {
        let now = Instant::now();
        let (grow, retire, count) = {
            let mut pool = self.pool();
            let live = pool.workers.get(env_id).map_or(0, Vec::len);
            let starting = pool.starting.get(env_id).copied().unwrap_or(0);
            let waiting = pool.waiting.get(env_id).copied().unwrap_or(0);
            let count = live + starting;
            if waiting > 0 && count < max {
                // Harnesses already starting count towards the backlog's.
                let want = pool.harnesses_wanted(env_id, self.bundles_per_worker(env_id));
                let want = want.saturating_sub(starting).min(max - count);
                *pool.starting.entry(env_id.to_string()).or_default() += want;
                (want, None, count)
            } else if waiting == 0 && starting == 0 && live > min {
                let idle = pool.workers[env_id]
                    .iter()
                    .filter(|w| w.is_connected() && w.bundles_in_flight() == 0)
                    .filter_map(|w| Some((w.clone(), *pool.last_busy.get(&w.id)?)))
                    .filter(|(_, since)| now.duration_since(*since) >= AUTOSCALE_IDLE)
                    .min_by_key(|(_, since)| *since);
                // Out of the pool under the lock, so no bundle picks it meanwhile.
                let retire = idle.map(|(w, since)| {
                    pool.workers
                        .get_mut(env_id)
                        .expect("present")
                        .retain(|x| x.id != w.id);
                    (w, now.duration_since(since))
                });
                (0, retire, live)
            } else {
                (0, None, count)
            }
        };
        if grow > 0 {
            (self.log)(
                WorkerLog::Info,
                format!(
                    "autoscaling (THROUGHPUT_BASED): bundles are waiting for an SDK harness of environment {env_id}; scaling from {count} to {} SDK harness(es) (at most {max})",
                    count + grow
                ),
            );
            for _ in 0..grow {
                let this = self.clone();
                let env_id = env_id.to_string();
                tokio::spawn(async move {
                    if let Err(e) = this.start_one(&env_id).await {
                        if this.stopping.load(Ordering::SeqCst) {
                            return;
                        }
                        (this.log)(
                            WorkerLog::Warning,
                            format!("autoscaling (THROUGHPUT_BASED): starting an SDK harness of environment {env_id} failed: {e}"),
                        );
                    }
                });
            }
        }
        if let Some((w, idle)) = retire {
            self.stop_worker(&w, Duration::ZERO).await;
            (self.log)(
                WorkerLog::Info,
                format!(
                    "autoscaling (THROUGHPUT_BASED): SDK harness {} of environment {env_id} was idle for {}s; stopped it, scaling from {count} to {} SDK harness(es) (at least {min})",
                    w.id,
                    idle.as_secs(),
                    count - 1
                ),
            );
        }
    }

    /// Stops every worker: StopWorker on pools (sent, not waited for), kill
    /// for processes; then waits up to [`SDK_CLOSE_GRACE`] for the
    /// harnesses to close their streams. Workers
    /// still starting stop waiting for their connection at once. Instructions
    /// already sent (bundles of a failed job's other keys, say) get up to
    /// [`STOP_GRACE`] to be answered first: an SDK harness tears down a
    /// DoFn when its bundle ends or its control stream closes after it, and
    /// a bundle cut off mid-way (Java waits for its data forever) would
    /// never reach `@Teardown`.
    pub async fn stop(&self) {
        self.stop_within(STOP_GRACE).await
    }

    /// [`Self::stop`] giving instructions already sent up to `grace` (zero
    /// for a cancelled job: Beam promises its DoFns no teardown, and its
    /// client waits in CANCELLING meanwhile).
    pub async fn stop_within(&self, grace: Duration) {
        {
            let _pool = self.pool();
            // Under the lock: a launch that sees `stopping` false has
            // registered its handle before the drain below takes them.
            self.stopping.store(true, Ordering::SeqCst);
        }
        self.stopped.send_replace(true);
        self.changed.notify_waiters();
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline
            && self
                .pool()
                .workers
                .values()
                .flatten()
                .any(|w| w.is_connected() && w.instructions_pending() > 0)
        {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let (workers, handles) = {
            let mut pool = self.pool();
            let workers: Vec<Arc<Worker>> = pool.workers.drain().flat_map(|(_, ws)| ws).collect();
            let handles: Vec<(String, Handle)> = pool.handles.drain().collect();
            (workers, handles)
        };
        // Forget the workers first, so their streams closing is not taken
        // for a dying SDK harness. Their control streams end here; a data
        // stream the harness ends by itself stays open until it does.
        let mut retired = workers.clone();
        for (id, _) in &handles {
            retired.extend(self.fn_api.retire_worker(id));
        }
        for w in &workers {
            self.fn_api.retire_worker(&w.id);
        }
        let began = Instant::now();
        // A pool's StopWorker goes beside the wait below, not before it:
        // a harness ends on its own once its control stream ends, and the
        // RPC's answer (a round trip through the client's Python, ~2 ms
        // under its GIL) need not hold up the job's state. Processes are
        // killed and waited for, each on its own.
        let (pools, processes): (Vec<_>, Vec<_>) = handles
            .into_iter()
            .partition(|(_, h)| matches!(h, Handle::Pool { .. }));
        for (id, h) in pools {
            tokio::spawn(async move { stop_handle_of(h, &id, Duration::ZERO).await });
        }
        futures::future::join_all(
            processes
                .into_iter()
                .map(|(id, h)| async move { stop_handle_of(h, &id, Duration::ZERO).await }),
        )
        .await;
        // The harnesses saw their control streams end: let them close
        // theirs, so one running in the client (LOOPBACK) is done before
        // the client learns the job's state and exits.
        let closed = futures::future::join_all(workers.iter().map(|w| w.sdk_closed()));
        let stopped = began.elapsed();
        let _ = tokio::time::timeout(SDK_CLOSE_GRACE, closed).await;
        for w in &retired {
            w.close_data();
        }
        tracing::debug!(job = %self.job_id, stop_us = stopped.as_micros() as u64, closed_us = began.elapsed().as_micros() as u64, "SDK harnesses stopped");
        self.changed.notify_waiters();
    }

    /// True when an environment's SDK harnesses come from a worker pool
    /// (EXTERNAL, which LOOPBACK is): they may run inside the client.
    pub fn has_worker_pool(&self) -> bool {
        self.environments
            .values()
            .any(|e| e.urn == urns::env::EXTERNAL)
    }
}

/// Waits until `w` dials the control service.
///
/// # Errors
/// [`HarnessError::ExitedBeforeConnect`] as soon as its process exits
/// first (with its exit status and last output lines),
/// [`HarnessError::ConnectTimeout`] after [`CONNECT_TIMEOUT`] (of silence,
/// for a process) or [`BOOT_LIMIT`],
/// [`HarnessError::Stopped`] as soon as `stopped` turns true.
async fn wait_connected(
    w: &Worker,
    exit: Option<ProcessExit>,
    mut stopped: tokio::sync::watch::Receiver<bool>,
) -> Result<()> {
    let mut rx = w.connected.subscribe();
    let connected = rx.wait_for(|c| *c);
    let output = exit.as_ref().map(|e| e.output.clone());
    let quiet = if output.is_some() {
        format!("and its process wrote nothing for {} s", CONNECT_TIMEOUT.as_secs())
    } else {
        format!("within {} s", CONNECT_TIMEOUT.as_secs())
    };
    let exited = async {
        match exit {
            Some(mut e) => match exited(&mut e.status).await {
                Some(status) => {
                    let output = e.output.lock().unwrap_or_else(|p| p.into_inner());
                    (status, output.lines.iter().cloned().collect::<Vec<_>>())
                }
                None => std::future::pending().await,
            },
            None => std::future::pending().await,
        }
    };
    let timeout_error = |why: String| HarnessError::ConnectTimeout {
        worker_id: w.id.clone(),
        why,
    };
    tokio::select! {
        biased;
        r = tokio::time::timeout(BOOT_LIMIT, connected) => match r {
            Ok(Ok(_)) => Ok(()),
            _ => Err(timeout_error(format!("within {} s of its start", BOOT_LIMIT.as_secs()))),
        },
        _ = quiet_for(output, CONNECT_TIMEOUT) => Err(timeout_error(quiet)),
        (status, stderr) = exited => Err(HarnessError::ExitedBeforeConnect {
            worker_id: w.id.clone(),
            status,
            stderr,
        }),
        _ = stopped.wait_for(|s| *s) => Err(HarnessError::Stopped {
            worker_id: w.id.clone(),
        }),
    }
}

/// Returns once a process's output (`None`: a worker pool's harness, whose
/// output Weir does not see) has gained no line for `quiet`.
async fn quiet_for(output: Option<OutputTail>, quiet: Duration) {
    let Some(output) = output else {
        return tokio::time::sleep(quiet).await;
    };
    let written = || output.lock().unwrap_or_else(|p| p.into_inner()).written;
    let (mut seen, mut since) = (written(), tokio::time::Instant::now());
    // Looked at every second: the silence is measured to within one.
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tick.tick().await;
        let now = written();
        if now != seen {
            (seen, since) = (now, tokio::time::Instant::now());
        } else if since.elapsed() >= quiet {
            return;
        }
    }
}

/// Stops a harness; a process gets `grace` to exit by itself first. Returns
/// the exit status of a process that exited within `grace`.
async fn stop_handle_of(handle: Handle, worker_id: &str, grace: Duration) -> Option<String> {
    match handle {
        Handle::Pool { endpoint } => {
            let addr = weir_proto::grpc_uri(&endpoint);
            // A pool that stopped answering must not hold up the job's end.
            let stop = async {
                let mut client = PoolClient::connect(addr).await.ok()?;
                let request = beam::StopWorkerRequest {
                    worker_id: worker_id.to_string(),
                };
                client.stop_worker(request).await.ok()
            };
            let _ = tokio::time::timeout(STOP_GRACE, stop).await;
            None
        }
        Handle::Process {
            kill,
            mut exit,
            dir,
            ..
        } => {
            let status = match tokio::time::timeout(grace, exited(&mut exit.status)).await {
                Ok(status) => status,
                Err(_) => {
                    let _ = kill.send(());
                    let _ = tokio::time::timeout(Duration::from_secs(5), exited(&mut exit.status))
                        .await;
                    None
                }
            };
            if let Some(dir) = dir {
                let _ = tokio::fs::remove_dir_all(dir).await;
            }
            status
        }
    }
}

/// Starts one SDK harness of `env` as worker `worker_id`: StartWorker on an
/// EXTERNAL environment's worker pool, or the PROCESS command / `docker run`
/// with Beam's boot flags. `logging` is the worker's "Logging stream
/// open" flag and `printed` takes its stdout lines (see [`forward_output`]). A PROCESS harness given a `pin`
/// runs on that core only (see [`crate::cores`]) and holds it until it exits.
async fn spawn_harness(
    env_id: &str,
    env: &beam::Environment,
    worker_id: &str,
    url: &str,
    logging: Arc<AtomicBool>,
    printed: PrintedLine,
    pools: &PoolChannels,
    pin: Option<cores::CorePin>,
) -> Result<Handle> {
    let flags = vec![
        format!("--id={worker_id}"),
        format!("--provision_endpoint={url}"),
        format!("--logging_endpoint={url}"),
        format!("--artifact_endpoint={url}"),
        format!("--control_endpoint={url}"),
    ];
    match env.urn.as_str() {
        urns::env::EXTERNAL => {
            let p = beam::ExternalPayload::decode(env.payload.as_slice())
                .map_err(|e| env_error(env_id, &env.urn, e.to_string()))?;
            let pool = p.endpoint.map(|e| e.url).unwrap_or_default();
            let mut client = pools.client(&pool).await.map_err(|e| {
                env_error(
                    env_id,
                    &env.urn,
                    format!("cannot reach worker pool {pool}: {e}"),
                )
            })?;
            let resp = client
                .start_worker(beam::StartWorkerRequest {
                    worker_id: worker_id.to_string(),
                    control_endpoint: descriptor(url),
                    logging_endpoint: descriptor(url),
                    artifact_endpoint: descriptor(url),
                    provision_endpoint: descriptor(url),
                    params: p.params.clone(),
                })
                .await
                .map_err(|e| {
                    env_error(
                        env_id,
                        &env.urn,
                        format!("StartWorker on {pool} failed: {e}"),
                    )
                })?
                .into_inner();
            if !resp.error.is_empty() {
                return Err(env_error(
                    env_id,
                    &env.urn,
                    format!("worker pool {pool}: {}", resp.error),
                ));
            }
            Ok(Handle::Pool { endpoint: pool })
        }
        urns::env::PROCESS | urns::env::DOCKER => {
            let mut dir = None;
            let (program, args, envs) = if env.urn == urns::env::PROCESS {
                let p = beam::ProcessPayload::decode(env.payload.as_slice())
                    .map_err(|e| env_error(env_id, &env.urn, e.to_string()))?;
                let mut words = p.command.split_whitespace().map(str::to_string);
                let mut program = words.next().unwrap_or_default();
                // The harness runs in its own folder (below), so a relative
                // command path is resolved against Weir's folder first.
                if program.contains('/') && std::path::Path::new(&program).is_relative() {
                    if let Ok(cwd) = std::env::current_dir() {
                        program = cwd.join(&program).display().to_string();
                    }
                }
                let mut args: Vec<String> = words.collect();
                args.extend(flags);
                let d = worker_dir(worker_id);
                // Beam's container contract spells it `--semi_persist_dir`
                // (Beam's Go and Java boot programs exit on an unknown flag);
                // `weir boot` accepts it and Python's spelling.
                args.push(format!("--semi_persist_dir={}", d.display()));
                std::fs::create_dir_all(&d).map_err(|e| {
                    env_error(
                        env_id,
                        &env.urn,
                        format!("cannot create {}: {e}", d.display()),
                    )
                })?;
                dir = Some(d);
                let mut envs = p.env;
                // The folder `weir boot` runs a Python harness in.
                if let Ok(cwd) = std::env::current_dir() {
                    envs.entry(crate::boot::HARNESS_CWD_ENV.to_string())
                        .or_insert_with(|| cwd.display().to_string());
                }
                (program, args, envs)
            } else {
                let p = beam::DockerPayload::decode(env.payload.as_slice())
                    .map_err(|e| env_error(env_id, &env.urn, e.to_string()))?;
                let mut args = vec![
                    "run".into(),
                    "--rm".into(),
                    "--network=host".into(),
                    p.container_image,
                ];
                args.extend(flags);
                ("docker".to_string(), args, HashMap::new())
            };
            let mut envs = envs;
            // This binary's `weir boot` for Python forks its harness from a
            // warm interpreter (see `crate::fork_server`).
            let weir_python = envs
                .get("WEIR_PYTHON")
                .cloned()
                .or_else(|| std::env::var("WEIR_PYTHON").ok());
            // The PATH the harness will have finds a bare `weir`.
            let path = envs.get("PATH").cloned().or_else(|| std::env::var("PATH").ok());
            if let Some(python) =
                fork_server::boot_python(&program, &args, weir_python.as_deref(), path.as_deref())
            {
                // The whole environment `weir boot` will have.
                let mut full = fork_server::own_env();
                full.extend(envs.clone());
                if let Some(socket) = fork_server::ForkServers::global().socket_for(&python, &full) {
                    envs.insert(
                        fork_server::SOCKET_ENV.to_string(),
                        socket.display().to_string(),
                    );
                }
            }
            let mut command = tokio::process::Command::new(&program);
            // Each boot program works in its worker's own folder: boot
            // programs write files into their working folder (Beam's Go boot
            // writes `pipeline_options.json` there), and harnesses of
            // concurrent jobs must not read each other's. (`weir boot` runs
            // a Python harness in Weir's folder: `HARNESS_CWD_ENV`.)
            if let Some(d) = &dir {
                command.current_dir(d);
            }
            if let Some(p) = &pin {
                cores::run_on(&mut command, p.cpu());
            }
            // A process group of its own, killed whole: a boot program's
            // worker outlives it otherwise (Go's worker sleeps after its
            // work until killed; killing only `beam-go-boot` orphaned it).
            #[cfg(unix)]
            command.process_group(0);
            let mut child = command
                .args(&args)
                .envs(envs)
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .kill_on_drop(true)
                .spawn()
                .map_err(|e| {
                    env_error(env_id, &env.urn, format!("cannot start {program:?}: {e}"))
                })?;
            let pid = child.id();
            let tail = OutputTail::default();
            let readers: Vec<_> = [
                child
                    .stdout
                    .take()
                    .map(|o| forward_output(o, worker_id.to_string(), tail.clone(), None, Some(printed))),
                child
                    .stderr
                    .take()
                    .map(|e| forward_output(e, worker_id.to_string(), tail.clone(), Some(logging.clone()), None)),
            ]
            .into_iter()
            .flatten()
            .collect();
            let (kill, killed) = tokio::sync::oneshot::channel::<()>();
            let (status_tx, status) = tokio::sync::watch::channel(None);
            let (worker_id, failed_tail) = (worker_id.to_string(), tail.clone());
            // The group dies with the task below, also when the runtime drops
            // it (a server stopping at once): kill_on_drop kills only the
            // boot program.
            let group = GroupKiller(pid);
            tokio::spawn(async move {
                // Moved in whole (a field alone would not carry the Drop).
                let mut group = group;
                // A dropped `kill` sender kills the process too.
                let (status, on_its_own) = tokio::select! {
                    biased;
                    s = child.wait() => (s, true),
                    _ = killed => {
                        let _ = child.start_kill();
                        (child.wait().await, false)
                    }
                };
                // What the boot program started and left behind goes too,
                // now: the group id may be reused once it is empty.
                kill_group(pid);
                group.0 = None;
                // Its last lines belong with its exit status.
                let _ = tokio::time::timeout(
                    Duration::from_secs(1),
                    futures::future::join_all(readers),
                )
                .await;
                // A harness that failed after its output went to DEBUG: its
                // last lines (a crash's traceback) are worth a warning.
                let failed = !matches!(&status, Ok(s) if s.success());
                if on_its_own && failed && logging.load(Ordering::Relaxed) {
                    let tail = failed_tail.lock().unwrap_or_else(|p| p.into_inner());
                    let lines: Vec<&str> = tail.lines.iter().map(String::as_str).collect();
                    tracing::warn!(
                        worker = %worker_id,
                        "SDK harness process exited with status {}; its last output lines:\n{}",
                        exit_status(&status),
                        lines.join("\n")
                    );
                }
                // Its core is free before a replacement can be started.
                drop(pin);
                let _ = status_tx.send(Some(exit_status(&status)));
            });
            Ok(Handle::Process {
                kill,
                exit: ProcessExit {
                    status,
                    output: tail,
                },
                dir,
                pid,
            })
        }
        other => Err(env_error(env_id, other, "unsupported environment type")),
    }
}

/// One CPU sample of an SDK harness process ([`SdkHarnesses::sample_cpu`]).
#[derive(Clone, Copy, Debug)]
struct CpuSample {
    pid: u32,
    at: Instant,
    /// [`process_cpu_demand`] then, in seconds.
    demand: f64,
    /// [`Worker::bundle_moves`] then.
    moves: u64,
    /// CPU demand (use plus runqueue wait) over the window this sample
    /// ended, in thousandths of a core;
    /// [`CPU_UNSAMPLED`] when there was no window (first sample, another
    /// pid) or the harness's bundles changed in it, or it ran none.
    window: u32,
    /// What [`Worker::cpu_permille`] becomes: the busier of this window and
    /// the one before (one dip, a bundle finishing with its outputs on
    /// their way, is not idleness).
    permille: u32,
}

impl CpuSample {
    /// The sample that follows `then` for a harness now with `pid`,
    /// `demand` seconds of CPU demand, `moves` bundle starts and ends,
    /// `in_flight` bundles.
    fn after(
        then: Option<&CpuSample>,
        pid: u32,
        now: Instant,
        demand: f64,
        moves: u64,
        in_flight: usize,
    ) -> CpuSample {
        let window = match then {
            Some(t) if t.pid == pid && t.moves == moves && in_flight > 0 => {
                let wall = now.duration_since(t.at).as_secs_f64().max(1e-3);
                let wanted = (demand - t.demand).max(0.0);
                (wanted / wall * 1000.0).round() as u32
            }
            _ => CPU_UNSAMPLED,
        };
        let previous = then.map_or(CPU_UNSAMPLED, |t| t.window);
        CpuSample { pid, at: now, demand, moves, window, permille: window.max(previous) }
    }
}

/// The CPU time process `pid` wanted, in seconds: the CPU it used (all
/// its threads, [`process_cpu_ticks`]) plus the time its live threads
/// waited on a runqueue (`/proc/<pid>/task/*/schedstat`, second field, in
/// ns; none counted where the kernel has no schedstat). On a machine with
/// more runnable threads than cores, a CPU-bound harness uses less than
/// its core but wants all of it. `None` when its CPU cannot be read.
fn process_cpu_demand(pid: u32, ticks_per_second: f64) -> Option<f64> {
    let used = process_cpu_ticks(pid)? as f64 / ticks_per_second;
    let waited_ns: u64 = std::fs::read_dir(format!("/proc/{pid}/task"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|task| std::fs::read_to_string(task.path().join("schedstat")).ok())
        .filter_map(|line| schedstat_wait_ns(&line))
        .sum();
    Some(used + waited_ns as f64 / 1e9)
}

/// Nanoseconds spent waiting on a runqueue, the second field of a
/// `/proc/<pid>/task/<tid>/schedstat` line (`run_ns wait_ns timeslices`).
fn schedstat_wait_ns(line: &str) -> Option<u64> {
    line.split_whitespace().nth(1)?.parse().ok()
}

/// User plus system CPU time of process `pid` (all its threads), in
/// clock ticks; `None` when it cannot be read (no such process, no
/// `/proc`).
fn process_cpu_ticks(pid: u32) -> Option<u64> {
    stat_cpu_ticks(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// utime plus stime (fields 14 and 15) of a `/proc/<pid>/stat` line.
fn stat_cpu_ticks(stat: &str) -> Option<u64> {
    // After the command's last closing parenthesis (the command may hold
    // any): field 3 (state) onwards.
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace().skip(11);
    let user: u64 = fields.next()?.parse().ok()?;
    let system: u64 = fields.next()?.parse().ok()?;
    Some(user + system)
}

/// The clock ticks per second of `/proc`'s CPU times (`_SC_CLK_TCK`).
fn clock_ticks_per_second() -> f64 {
    // SAFETY: sysconf reads a constant of the system.
    let n = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if n > 0 { n as f64 } else { 100.0 }
}

/// Kills process group `.0` ([`kill_group`]) when dropped.
struct GroupKiller(Option<u32>);

impl Drop for GroupKiller {
    fn drop(&mut self) {
        kill_group(self.0);
    }
}

/// Kills process group `pid` (a PROCESS harness's boot program and what it
/// started: see `process_group(0)` where it is spawned); nothing without a pid.
fn kill_group(pid: Option<u32>) {
    #[cfg(unix)]
    if let Some(pid) = pid.and_then(|p| libc::pid_t::try_from(p).ok()).filter(|p| *p > 1) {
        // SAFETY: kill(2) with a negative pid signals that process group only.
        unsafe {
            libc::kill(-pid, libc::SIGKILL);
        }
    }
    #[cfg(not(unix))]
    let _ = pid;
}

#[cfg(test)]
mod tests {

    /// A booting process has CONNECT_TIMEOUT of silence, counted from its
    /// last output line; a pool's harness has CONNECT_TIMEOUT from its start.
    #[tokio::test(start_paused = true)]
    async fn a_process_that_writes_lines_keeps_its_time_to_connect() {
        let start = tokio::time::Instant::now();
        quiet_for(None, CONNECT_TIMEOUT).await;
        assert_eq!(start.elapsed(), CONNECT_TIMEOUT);
        let start = tokio::time::Instant::now();
        quiet_for(Some(OutputTail::default()), CONNECT_TIMEOUT).await;
        assert!(start.elapsed() <= CONNECT_TIMEOUT + Duration::from_secs(1), "a silent process");

        let tail = OutputTail::default();
        let writer = tail.clone();
        tokio::spawn(async move {
            // A line every 100 s for 5 lines, then silence.
            for _ in 0..5 {
                tokio::time::sleep(Duration::from_secs(100)).await;
                writer.lock().unwrap().written += 1;
            }
        });
        let start = tokio::time::Instant::now();
        quiet_for(Some(tail), CONNECT_TIMEOUT).await;
        let waited = start.elapsed();
        assert!(
            waited >= Duration::from_secs(500) + CONNECT_TIMEOUT
                && waited <= Duration::from_secs(501) + CONNECT_TIMEOUT,
            "{waited:?}"
        );
    }
    use super::*;

    fn process_env(command: &str) -> beam::Environment {
        beam::Environment {
            urn: urns::env::PROCESS.to_string(),
            payload: beam::ProcessPayload {
                command: command.to_string(),
                ..Default::default()
            }
            .encode_to_vec(),
            ..Default::default()
        }
    }

    fn env(capabilities: &[&str]) -> beam::Environment {
        beam::Environment {
            urn: urns::env::EXTERNAL.into(),
            capabilities: capabilities.iter().map(|c| c.to_string()).collect(),
            ..Default::default()
        }
    }

    /// Sizing with `per_core_sdk` harnesses per worker of a one-core SDK,
    /// `harness_threads` bundles each when set, and no in-process pool.
    fn sizing(per_core_sdk: usize, harness_threads: Option<usize>) -> HarnessSizing {
        HarnessSizing { per_core_sdk, harness_threads, in_process_pool: false, streaming: false }
    }

    /// Starts job `job` with one PROCESS harness running the shell script
    /// `body`, which must exit before connecting; returns the start's error.
    async fn start_exiting_script(job: &str, body: &str) -> HarnessError {
        let dir = tempfile_dir(job);
        let script = dir.join("boot.sh");
        std::fs::write(&script, format!("#!/bin/sh\n{body}")).unwrap();
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        let fn_api = FnApi::new("localhost:1".into());
        let envs = HashMap::from([(
            "env".to_string(),
            process_env(&script.display().to_string()),
        )]);
        let log: LogSink = Arc::new(|_, _| {});
        let started = start(
            &fn_api,
            job,
            &envs,
            Scaling::Fixed(1),
            sizing(1, None),
            &beam::ProvisionInfo::default(),
            log,
            Arc::new(AtomicBool::new(false)),
            PoolChannels::default(),
        )
        .await;
        let _ = std::fs::remove_dir_all(dir);
        match started {
            Ok(_) => panic!("a harness that exits cannot start"),
            Err(e) => e,
        }
    }

    /// The SDK harnesses of job "job" with no environment and an empty pool.
    fn harnesses_of(fn_api: &Arc<FnApi>) -> Arc<SdkHarnesses> {
        Arc::new(SdkHarnesses {
            fn_api: fn_api.clone(),
            job_id: "job".into(),
            environments: HashMap::new(),
            provision: beam::ProvisionInfo::default(),
            log: Arc::new(|_, _| {}),
            bundles_per_worker: HashMap::new(),
            harnesses_per_worker: HashMap::new(),
            sizing: sizing(1, None),
            pool: Mutex::default(),
            changed: tokio::sync::Notify::new(),
            stopping: AtomicBool::new(false),
            stopped: tokio::sync::watch::channel(false).0,
            cancel: Arc::new(AtomicBool::new(false)),
            failure: Mutex::new(None),
        promised: Mutex::new(HashMap::new()),
            pools: PoolChannels::default(),
        })
    }

    /// A worker of job "job" whose control stream is open, and the SDK's
    /// end of it.
    fn connected_worker(
        fn_api: &FnApi,
        id: &str,
    ) -> (
        Arc<Worker>,
        tokio::sync::mpsc::UnboundedReceiver<beam::InstructionRequest>,
    ) {
        let worker = fn_api.add_worker(
            id.into(),
            "job".into(),
            beam::ProvisionInfo::default(),
            Arc::new(|_, _| {}),
        );
        let rx = connect(&worker);
        (worker, rx)
    }

    /// Marks `worker` connected, as if it had dialed the control service;
    /// returns what it is sent.
    fn connect(worker: &Worker) -> tokio::sync::mpsc::UnboundedReceiver<beam::InstructionRequest> {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        *worker.control_tx.lock().unwrap() = Some(tx);
        let _ = worker.connected.send_replace(true);
        rx
    }

    /// `start` of one worker for job `job`, running: two harnesses of each
    /// of `envs` whose SDK runs bundles on one core, one of the others.
    fn spawn_start(
        fn_api: &Arc<FnApi>,
        job: &'static str,
        envs: HashMap<String, beam::Environment>,
        cancel: Arc<AtomicBool>,
    ) -> tokio::task::JoinHandle<Result<Arc<SdkHarnesses>>> {
        let fn_api = fn_api.clone();
        tokio::spawn(async move {
            start(
                &fn_api,
                job,
                &envs,
                // One worker of two harnesses (an SDK that runs bundles on one core).
                Scaling::Fixed(1),
                sizing(2, None),
                &beam::ProvisionInfo::default(),
                Arc::new(|_, _| {}),
                cancel,
                PoolChannels::default(),
            )
            .await
        })
    }

    /// `stop` lets an instruction already sent be answered before it closes
    /// the worker's control stream (so the SDK harness tears its DoFns
    /// down), and gives up after [`STOP_GRACE`] on one never answered.
    #[tokio::test]
    async fn stop_waits_for_sent_instructions_then_closes() {
        let fn_api = FnApi::new("localhost:1".into());
        let harnesses = harnesses_of(&fn_api);
        let (worker, mut control_rx) = connected_worker(&fn_api, "job-worker-1");
        harnesses
            .pool()
            .workers
            .insert("env".into(), vec![worker.clone()]);
        let answer = worker
            .send(beam::InstructionRequest {
                instruction_id: "bundle-1".into(),
                request: None,
            })
            .unwrap();
        // The SDK side: answers 300 ms later, while its stream is still open.
        let sdk = {
            let worker = worker.clone();
            tokio::spawn(async move {
                let req = control_rx.recv().await.expect("the bundle");
                tokio::time::sleep(Duration::from_millis(300)).await;
                let open = worker.is_connected();
                let tx = worker.pending.lock().unwrap().remove(&req.instruction_id);
                let _ = tx.expect("pending").send(beam::InstructionResponse {
                    instruction_id: req.instruction_id,
                    ..Default::default()
                });
                // The stream closes after the answer.
                let closed = control_rx.recv().await.is_none();
                (open, closed)
            })
        };
        let began = Instant::now();
        harnesses.stop().await;
        let waited = began.elapsed();
        assert!(
            waited >= Duration::from_millis(300) && waited < STOP_GRACE,
            "{waited:?}"
        );
        assert_eq!(answer.await.unwrap().error, "");
        assert_eq!(sdk.await.unwrap(), (true, true));
        assert!(!worker.is_connected());

        // Never answered: stop gives up after STOP_GRACE and fails it.
        let (other, _control_rx) = connected_worker(&fn_api, "job-worker-2");
        let harnesses = harnesses_of(&fn_api);
        harnesses.pool().workers.insert("env".into(), vec![other.clone()]);
        let stuck = other
            .send(beam::InstructionRequest {
                instruction_id: "bundle-2".into(),
                request: None,
            })
            .unwrap();
        let began = Instant::now();
        harnesses.stop().await;
        assert!(began.elapsed() >= STOP_GRACE, "{:?}", began.elapsed());
        assert!(stuck.await.unwrap().error.contains("disconnected"));
    }

    /// `stop` ends every control stream, but a data stream that its SDK
    /// harness ends by itself (Python's, Go's) stays open until it does:
    /// the job's end waits for that harness to have shut down. Another
    /// harness's data stream (Java's) ends with its control stream.
    #[tokio::test]
    async fn stop_waits_for_a_harness_that_ends_its_own_data_stream() {
        let fn_api = FnApi::new("localhost:1".into());
        let harnesses = harnesses_of(&fn_api);
        let open_data = |w: &Worker, closes_itself: bool| {
            let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
            *w.data_tx.lock().unwrap() = Some(tx);
            let _ = w.data_connected.send_replace(true);
            w.closes_data_itself.store(closes_itself, Ordering::SeqCst);
            rx
        };
        let (python, mut python_control) = connected_worker(&fn_api, "job-worker-1");
        let (java, mut java_control) = connected_worker(&fn_api, "job-worker-2");
        let mut python_data = open_data(&python, true);
        let mut java_data = open_data(&java, false);
        harnesses
            .pool()
            .workers
            .insert("env".into(), vec![python.clone(), java.clone()]);
        // The Python side: its data stream is still open once its control
        // stream has ended; it shuts down for 200 ms, then ends its side.
        let sdk = {
            let python = python.clone();
            tokio::spawn(async move {
                assert!(python_control.recv().await.is_none());
                let open = matches!(
                    python_data.try_recv(),
                    Err(tokio::sync::mpsc::error::TryRecvError::Empty)
                );
                tokio::time::sleep(Duration::from_millis(200)).await;
                let _ = python.data_connected.send_replace(false);
                open
            })
        };
        // The Java side: its call ends when the runner ends its data stream.
        let jvm = {
            let java = java.clone();
            tokio::spawn(async move {
                assert!(java_control.recv().await.is_none());
                assert!(java_data.recv().await.is_none());
                let _ = java.data_connected.send_replace(false);
            })
        };
        let began = Instant::now();
        harnesses.stop().await;
        let waited = began.elapsed();
        assert!(
            waited >= Duration::from_millis(200) && waited < SDK_CLOSE_GRACE,
            "{waited:?}"
        );
        assert!(sdk.await.unwrap(), "the Python harness's data stream ended with its control stream");
        jvm.await.unwrap();
        assert!(python.data_tx.lock().unwrap().is_none());
    }

    /// A harness process that exits before dialing the control service fails
    /// the start at once, with its exit status and its last output lines.
    #[tokio::test]
    async fn process_that_exits_before_connecting_fails_at_once() {
        let began = Instant::now();
        let err = start_exiting_script(
            "job",
            "echo starting\necho \"unknown flag: $1\" >&2\nexit 3\n",
        )
        .await;
        assert!(
            began.elapsed() < Duration::from_secs(10),
            "took {:?}",
            began.elapsed()
        );
        match &err {
            HarnessError::ExitedBeforeConnect { status, stderr, .. } => {
                assert_eq!(status, "3");
                let mut got = stderr.clone();
                got.sort();
                assert_eq!(got.len(), 2, "{got:?}");
                assert_eq!(got[0], "starting");
                // The worker id: readable prefix, counter, 128 random bits.
                let id = got[1]
                    .strip_prefix("unknown flag: --id=job-worker-1-")
                    .unwrap();
                assert_eq!(id.len(), 32, "{id}");
                assert!(id.chars().all(|c| c.is_ascii_hexdigit()), "{id}");
            }
            other => panic!("wrong error: {other}"),
        }
        assert!(err.to_string().contains("exit status 3"), "{err}");
    }

    /// `start` returns once one harness of the environment has connected,
    /// not all of them: the other is still counted as starting (so bundles
    /// wait for it), joins the pool when it connects, and one that exits
    /// instead fails the job with its exit status.
    #[tokio::test]
    async fn start_returns_at_the_first_connection_and_a_late_failure_fails_the_job() {
        let dir = tempfile_dir("first-connect");
        let script = dir.join("boot.sh");
        // Records its worker id, then exits 4 once the test drops a file
        // named after it (harnesses never dial here; the test connects them).
        std::fs::write(
            &script,
            format!(
                "#!/bin/sh\nid=\"${{1#--id=}}\"\necho \"$id\" > {d}/started-$$\nwhile [ ! -e \"{d}/exit-$id\" ]; do sleep 0.02; done\nexit 4\n",
                d = dir.display()
            ),
        )
        .unwrap();
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        let fn_api = FnApi::new("localhost:1".into());
        let envs = HashMap::from([("env".to_string(), process_env(&script.display().to_string()))]);
        let cancel = Arc::new(AtomicBool::new(false));
        let starting = spawn_start(&fn_api, "job-fc", envs, cancel.clone());
        // Both harnesses are launched at once.
        let ids = loop {
            let ids: Vec<String> = std::fs::read_dir(&dir)
                .unwrap()
                .filter_map(|e| {
                    let e = e.unwrap();
                    let name = e.file_name().to_string_lossy().into_owned();
                    name.starts_with("started-")
                        .then(|| std::fs::read_to_string(e.path()).unwrap_or_default().trim().to_string())
                })
                .filter(|id| !id.is_empty())
                .collect();
            if ids.len() == 2 {
                break ids;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        let _control_rx = connect(&fn_api.worker(&ids[0]).expect("launched worker"));
        let harnesses = tokio::time::timeout(Duration::from_secs(10), starting)
            .await
            .expect("start returns once one harness connected")
            .unwrap()
            .expect("started");
        assert_eq!(
            harnesses.workers("env").iter().map(|w| w.id.clone()).collect::<Vec<_>>(),
            vec![ids[0].clone()]
        );
        assert_eq!(harnesses.pool().starting.get("env").copied(), Some(1));
        assert!(!cancel.load(Ordering::SeqCst));

        // The other exits before connecting: the job fails, naming its exit.
        std::fs::write(dir.join(format!("exit-{}", ids[1])), "").unwrap();
        let began = Instant::now();
        while !cancel.load(Ordering::SeqCst) {
            assert!(began.elapsed() < Duration::from_secs(10), "the job did not fail");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let why = harnesses.failure().unwrap_or_default();
        assert!(why.contains(&ids[1]) && why.contains("exit status 4"), "{why}");
        assert_eq!(harnesses.pool().starting.get("env").copied(), Some(0));
        std::fs::write(dir.join(format!("exit-{}", ids[0])), "").unwrap();
        harnesses.stop().await;
        let _ = std::fs::remove_dir_all(dir);
    }

    /// A worker pool that accepts every StartWorker and records the worker
    /// ids, whose harnesses never dial (the test connects them). It records
    /// the ids it is asked to stop too, and with `stall_stops` never
    /// answers a StopWorker.
    struct SilentPool {
        started: Arc<Mutex<Vec<String>>>,
        stopped: Arc<Mutex<Vec<String>>>,
        stall_stops: bool,
    }

    #[tonic::async_trait]
    impl beam::beam_fn_external_worker_pool_server::BeamFnExternalWorkerPool for SilentPool {
        async fn start_worker(
            &self,
            request: tonic::Request<beam::StartWorkerRequest>,
        ) -> std::result::Result<tonic::Response<beam::StartWorkerResponse>, tonic::Status> {
            self.started.lock().unwrap().push(request.into_inner().worker_id);
            Ok(tonic::Response::new(beam::StartWorkerResponse::default()))
        }

        async fn stop_worker(
            &self,
            request: tonic::Request<beam::StopWorkerRequest>,
        ) -> std::result::Result<tonic::Response<beam::StopWorkerResponse>, tonic::Status> {
            self.stopped.lock().unwrap().push(request.into_inner().worker_id);
            if self.stall_stops {
                std::future::pending::<()>().await;
            }
            Ok(tonic::Response::new(beam::StopWorkerResponse::default()))
        }
    }

    /// A [`SilentPool`] serving on a free local port: an EXTERNAL
    /// environment with `capabilities` that starts its harnesses there, and
    /// the worker ids it was asked to start.
    async fn silent_pool(capabilities: &[&str]) -> (beam::Environment, Arc<Mutex<Vec<String>>>) {
        let pool = served_silent_pool(capabilities, false).await;
        (pool.env, pool.started)
    }

    /// [`silent_pool`], also with the worker ids the pool was asked to
    /// stop and the TCP connections it accepted; with `stall_stops` it
    /// never answers a StopWorker.
    async fn served_silent_pool(capabilities: &[&str], stall_stops: bool) -> ServedPool {
        use tokio_stream::StreamExt;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let endpoint = format!("localhost:{}", listener.local_addr().unwrap().port());
        let (started, stopped) = (Arc::default(), Arc::default());
        let accepted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = accepted.clone();
        let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener).map(move |conn| {
            counted.fetch_add(1, Ordering::SeqCst);
            conn
        });
        let pool = beam::beam_fn_external_worker_pool_server::BeamFnExternalWorkerPoolServer::new(
            SilentPool {
                started: Arc::clone(&started),
                stopped: Arc::clone(&stopped),
                stall_stops,
            },
        );
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(pool)
                .serve_with_incoming(incoming),
        );
        let env = beam::Environment {
            urn: urns::env::EXTERNAL.into(),
            payload: beam::ExternalPayload {
                endpoint: Some(beam::ApiServiceDescriptor {
                    url: endpoint,
                    ..Default::default()
                }),
                ..Default::default()
            }
            .encode_to_vec(),
            capabilities: capabilities.iter().map(|c| c.to_string()).collect(),
            ..Default::default()
        };
        ServedPool { env, started, stopped, accepted }
    }

    /// A [`SilentPool`] being served: its EXTERNAL environment, the worker
    /// ids it was asked to start and to stop, and the TCP connections it
    /// accepted.
    struct ServedPool {
        env: beam::Environment,
        started: Arc<Mutex<Vec<String>>>,
        stopped: Arc<Mutex<Vec<String>>>,
        accepted: Arc<std::sync::atomic::AtomicUsize>,
    }

    /// Starts job `job` on `envs` (one environment "env", a silent pool
    /// recording its StartWorker ids in `ids`), connects the first harness
    /// it launches, and returns once start returned and the second harness
    /// was launched: one harness connected (with the SDK's end of its
    /// control stream), one still starting.
    async fn start_one_connected_one_starting(
        fn_api: &Arc<FnApi>,
        job: &'static str,
        envs: HashMap<String, beam::Environment>,
        ids: &Mutex<Vec<String>>,
    ) -> (Arc<SdkHarnesses>, tokio::sync::mpsc::UnboundedReceiver<beam::InstructionRequest>) {
        let starting = spawn_start(fn_api, job, envs, Arc::new(AtomicBool::new(false)));
        let began = Instant::now();
        let first = loop {
            if let Some(id) = ids.lock().unwrap().first().cloned() {
                break id;
            }
            assert!(began.elapsed() < Duration::from_secs(10), "no StartWorker");
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        let control_rx = connect(&fn_api.worker(&first).expect("launched worker"));
        let harnesses = tokio::time::timeout(Duration::from_secs(10), starting)
            .await
            .expect("start returns once one harness connected")
            .unwrap()
            .expect("started");
        while ids.lock().unwrap().len() < 2 {
            assert!(began.elapsed() < Duration::from_secs(10), "no second StartWorker");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        (harnesses, control_rx)
    }

    /// Harnesses of a Java ("java") and a Python ("py") environment, one
    /// connected worker each, running up to `java_room` and `py_room`
    /// bundles; the workers with their instruction receivers.
    #[allow(clippy::type_complexity)]
    fn java_and_python(
        fn_api: &Arc<FnApi>,
        java_room: usize,
        py_room: usize,
    ) -> (
        SdkHarnesses,
        [(Arc<Worker>, tokio::sync::mpsc::UnboundedReceiver<beam::InstructionRequest>); 2],
    ) {
        let mut harnesses = Arc::try_unwrap(harnesses_of(fn_api)).ok().unwrap();
        harnesses.environments = HashMap::from([
            ("java".to_string(), env(JAVA)),
            ("py".to_string(), env(PYTHON)),
        ]);
        harnesses.bundles_per_worker =
            HashMap::from([("java".to_string(), java_room), ("py".to_string(), py_room)]);
        let java = connected_worker(fn_api, "job-worker-java");
        let py = connected_worker(fn_api, "job-worker-py");
        harnesses.pool().workers.insert("java".into(), vec![java.0.clone()]);
        harnesses.pool().workers.insert("py".into(), vec![py.0.clone()]);
        (harnesses, [java, py])
    }

    /// A split data channel's elements start as one bundle per idle other
    /// harness of a one-core SDK (at least one), and as one per free bundle
    /// slot of a multi-core SDK up to the cores not running its bundles.
    /// The workers a split counts are promised to it: a second split soon
    /// after does not count them again, until their bundles are picked or
    /// PROMISE_TTL passes.
    #[tokio::test(start_paused = true)]
    async fn a_data_channel_splits_one_way_per_ready_sdk_worker() {
        let fn_api = FnApi::new("localhost:1".into());
        let (harnesses, [(java, _java_rx), (py, _py_rx)]) = java_and_python(&fn_api, 4, 2);
        let later = || tokio::time::advance(PROMISE_TTL + Duration::from_millis(1));
        py.in_flight.store(1, Ordering::SeqCst);
        assert_eq!(harnesses.split_ways("py", &py.id, 9), 0, "no idle harness");
        let (a, _a_rx) = connected_worker(&fn_api, "job-worker-py-2");
        let (b, _b_rx) = connected_worker(&fn_api, "job-worker-py-3");
        harnesses.pool().workers.get_mut("py").unwrap().extend([a.clone(), b.clone()]);
        assert_eq!(harnesses.split_ways("py", &py.id, 9), 2);
        assert_eq!(harnesses.split_ways("py", &a.id, 9), 0, "both idle harnesses are promised");
        later().await;
        assert_eq!(harnesses.split_ways("py", &py.id, 9), 2, "promises lapse");
        // A pick takes up one promise; the idle harness left stays promised.
        harnesses.pick("py", "d", false, false).await.unwrap();
        assert_eq!(harnesses.split_ways("py", &py.id, 9), 0);
        later().await;
        a.in_flight.store(1, Ordering::SeqCst);
        b.in_flight.store(0, Ordering::SeqCst);
        assert_eq!(harnesses.split_ways("py", &py.id, 9), 1);
        later().await;
        // Two bundles (on py and b) and one idle harness (a): a split that
        // can use one (a splittable element's residual) promises it; the
        // other bundle's split then finds none.
        a.in_flight.store(0, Ordering::SeqCst);
        b.in_flight.store(1, Ordering::SeqCst);
        assert_eq!(harnesses.split_ways("py", &py.id, 1), 1);
        assert_eq!(harnesses.split_ways("py", &b.id, 1), 0, "a is promised");
        // A split that handed nothing back frees its promise; one that did
        // keeps it PROMISE_TTL from then.
        harnesses.split_done("py", 1, false);
        assert_eq!(harnesses.split_ways("py", &b.id, 1), 1, "a is free again");
        tokio::time::advance(PROMISE_TTL / 2).await;
        harnesses.split_done("py", 1, true);
        tokio::time::advance(PROMISE_TTL / 2 + Duration::from_millis(1)).await;
        assert_eq!(harnesses.split_ways("py", &py.id, 1), 0, "renewed");
        // Java: 3 free slots of 4, capped by the cores not running a bundle;
        // Python's promise is not Java's.
        java.in_flight.store(1, Ordering::SeqCst);
        assert_eq!(
            harnesses.split_ways("java", &java.id, 9),
            3.min(machine_cores() - 1)
        );
        assert_eq!(harnesses.split_ways("none", &java.id, 9), 0);
    }

    /// A splittable DoFn's residual counts as able to start on the same
    /// harness only for a multi-core SDK with room and no stage backlog;
    /// for a one-core SDK only another idle harness counts.
    #[test]
    fn a_residual_runs_on_the_same_harness_only_for_a_multi_core_sdk() {
        let fn_api = FnApi::new("localhost:1".into());
        let (harnesses, [(java, _java_rx), (py, _py_rx)]) = java_and_python(&fn_api, 16, 2);
        java.in_flight.store(1, Ordering::SeqCst);
        py.in_flight.store(1, Ordering::SeqCst);
        assert!(harnesses.could_run_a_residual("java", &java.id, 0));
        assert!(!harnesses.could_run_a_residual("java", &java.id, 1), "the stage has a backlog");
        assert!(!harnesses.could_run_a_residual("py", &py.id, 0), "a Python harness has room but one core");
        // A full multi-core harness takes no more.
        java.in_flight.store(16, Ordering::SeqCst);
        assert!(!harnesses.could_run_a_residual("java", &java.id, 0));
        // An idle second harness takes the residual, whatever the SDK.
        let (idle, _idle_rx) = connected_worker(&fn_api, "job-worker-py-2");
        harnesses.pool().workers.get_mut("py").unwrap().push(idle);
        assert!(harnesses.could_run_a_residual("py", &py.id, 1));
    }

    /// In the client's in-process pool (LOOPBACK) every harness shares one
    /// interpreter, so its one harness takes a residual while it runs fewer
    /// bundles than there are cores.
    #[test]
    fn a_residual_runs_on_the_same_harness_of_the_clients_in_process_pool() {
        let fn_api = FnApi::new("localhost:1".into());
        let mut harnesses = Arc::try_unwrap(harnesses_of(&fn_api)).ok().unwrap();
        harnesses.environments = HashMap::from([("py".to_string(), env(PYTHON))]);
        harnesses.bundles_per_worker = HashMap::from([("py".to_string(), 64)]);
        harnesses.sizing = HarnessSizing { in_process_pool: true, ..sizing(2, None) };
        let (py, _py_rx) = connected_worker(&fn_api, "job-worker-py");
        let cores = machine_cores();
        py.in_flight.store(cores - 1, Ordering::SeqCst);
        harnesses.pool().workers.insert("py".into(), vec![py.clone()]);
        assert!(harnesses.could_run_a_residual("py", &py.id, 0));
        assert!(!harnesses.could_run_a_residual("py", &py.id, 1), "the stage has a backlog");
        py.in_flight.store(cores, Ordering::SeqCst);
        assert!(!harnesses.could_run_a_residual("py", &py.id, 0), "as many bundles as cores run");
    }

    /// An `alone` bundle of a one-core SDK goes only to a harness that runs
    /// no other bundle of its descriptor, and waits (in the backlog) while
    /// each does; other descriptors and other bundles share a harness, as
    /// do a multi-core SDK's, the client's in-process pool and a harness
    /// that stands for several cores.
    #[tokio::test(start_paused = true)]
    async fn an_alone_bundle_does_not_share_a_one_core_harness_with_its_descriptor() {
        let fn_api = FnApi::new("localhost:1".into());
        let (mut harnesses, [(java, _java_rx), (py, _py_rx)]) =
            java_and_python(&fn_api, 4, SINGLE_CORE_BUNDLES_PER_HARNESS);
        for env in harnesses.environments.values_mut() {
            env.urn = urns::env::PROCESS.into();
        }
        let harnesses = Arc::new(harnesses);
        let pick = |env: &'static str, d: &'static str, alone: bool| {
            let h = harnesses.clone();
            tokio::spawn(async move { h.pick(env, d, false, alone).await.unwrap().id.clone() })
        };
        assert_eq!(pick("py", "d", true).await.unwrap(), py.id);
        let second = pick("py", "d", true);
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(!second.is_finished(), "the harness runs a bundle of d already");
        assert_eq!(harnesses.backlog("py"), 1, "demand for another harness");
        assert_eq!(pick("py", "d", false).await.unwrap(), py.id);
        assert_eq!(py.processors_of("d"), (2, 2));
        assert_eq!(pick("java", "d", true).await.unwrap(), java.id);
        assert_eq!(pick("java", "d", true).await.unwrap(), java.id);
        // One of d ends: one still runs, the alone bundle still waits.
        harnesses.release(&py, "d", false);
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(!second.is_finished());
        // The last one ends: it starts, and leaves the backlog.
        harnesses.release(&py, "d", false);
        assert_eq!(second.await.unwrap(), py.id);
        assert_eq!(py.processors_of("d"), (1, 2));
        assert_eq!(harnesses.backlog("py"), 0);
        assert_eq!(pick("py", "e", true).await.unwrap(), py.id, "another descriptor");
        harnesses.release(&py, "e", false);
        // A harness whose last CPU sample shows its bundle of d waiting (a
        // core partly idle) takes a second one; unsampled, it counts as busy.
        let third = pick("py", "d", true);
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(!third.is_finished(), "no CPU sample yet: busy");
        py.cpu_permille.store(CORE_BUSY_PERMILLE, Ordering::Relaxed);
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(!third.is_finished(), "at the mark: busy");
        py.cpu_permille.store(CORE_BUSY_PERMILLE - 1, Ordering::Relaxed);
        assert_eq!(third.await.unwrap(), py.id);
        assert_eq!(py.processors_of("d"), (2, 2));
        assert_eq!(harnesses.backlog("py"), 0);
        assert_eq!(py.cpu_permille(), CPU_UNSAMPLED, "a bundle started: the sample is stale");
        // A harness whose CPU Weir does not sample (EXTERNAL): bundles share it.
        let (external, [_, (ext_py, _ext_rx)]) =
            java_and_python(&fn_api, 4, SINGLE_CORE_BUNDLES_PER_HARNESS);
        external.pick("py", "d", false, true).await.unwrap();
        external.pick("py", "d", false, true).await.unwrap();
        assert_eq!(ext_py.processors_of("d"), (2, 2));
        // One harness for a worker's cores, or the client's in-process pool
        // (LOOPBACK: one interpreter for every core): bundles share it.
        let (wide, [_, (wide_py, _wide_rx)]) = java_and_python(&fn_api, 4, 4);
        wide.pick("py", "d", false, true).await.unwrap();
        wide.pick("py", "d", false, true).await.unwrap();
        assert_eq!(wide_py.processors_of("d"), (2, 2));
        let (mut pooled, [_, (pool_py, _pool_rx)]) =
            java_and_python(&fn_api, 4, SINGLE_CORE_BUNDLES_PER_HARNESS);
        pooled.sizing.in_process_pool = true;
        pooled.pick("py", "d", false, true).await.unwrap();
        pooled.pick("py", "d", false, true).await.unwrap();
        assert_eq!(pool_py.processors_of("d"), (2, 2));
    }

    /// A one-core PROCESS harness whose last CPU sample shows its core
    /// partly idle offers that spare time to one split of a bundle it runs,
    /// and then to none until a bundle starts or ends on it; a busy or
    /// unsampled harness, a full one, and a harness whose CPU Weir does not
    /// sample (EXTERNAL) offer none.
    #[tokio::test]
    async fn a_waiting_one_core_harness_takes_one_split_of_its_own_bundle() {
        let fn_api = FnApi::new("localhost:1".into());
        let (mut harnesses, [_, (py, _py_rx)]) =
            java_and_python(&fn_api, 4, SINGLE_CORE_BUNDLES_PER_HARNESS);
        for env in harnesses.environments.values_mut() {
            env.urn = urns::env::PROCESS.into();
        }
        assert_eq!(harnesses.pick("py", "d", false, false).await.unwrap().id, py.id);
        assert!(!harnesses.take_spare_core("py", &py.id), "unsampled: busy");
        py.cpu_permille.store(CORE_BUSY_PERMILLE, Ordering::Relaxed);
        assert!(!harnesses.take_spare_core("py", &py.id), "at the mark: busy");
        py.cpu_permille.store(0, Ordering::Relaxed);
        assert!(!harnesses.take_spare_core("py", &py.id), "a process that could not be read");
        py.cpu_permille.store(CORE_BUSY_PERMILLE - 1, Ordering::Relaxed);
        assert!(!harnesses.take_spare_core("py", "another"), "not a worker of py");
        assert!(harnesses.take_spare_core("py", &py.id));
        assert_eq!(harnesses.promised.lock().unwrap()["py"].0, 1, "promised, as split_ways does");
        assert!(!harnesses.take_spare_core("py", &py.id), "taken until a bundle moves");
        // The work split off starts here: full (two bundles), and unsampled.
        harnesses.pick("py", "d", false, false).await.unwrap();
        assert_eq!(harnesses.promised.lock().unwrap()["py"].0, 0, "the promise is kept");
        py.cpu_permille.store(0, Ordering::Relaxed);
        assert!(!harnesses.take_spare_core("py", &py.id), "no room");
        // One ends: room again, and the next sample may offer it.
        harnesses.release(&py, "d", false);
        py.cpu_permille.store(100, Ordering::Relaxed);
        assert!(harnesses.take_spare_core("py", &py.id));
        // EXTERNAL: not sampled, never offered.
        let (external, [_, (ext_py, _ext_rx)]) =
            java_and_python(&fn_api, 4, SINGLE_CORE_BUNDLES_PER_HARNESS);
        external.pick("py", "d", false, false).await.unwrap();
        ext_py.cpu_permille.store(0, Ordering::Relaxed);
        assert!(!external.take_spare_core("py", &ext_py.id));
    }

    /// utime and stime are fields 14 and 15 of a stat line, counted after
    /// the command's last parenthesis whatever the command holds.
    #[test]
    fn stat_cpu_ticks_add_utime_and_stime() {
        let line = "42 (a) (b c) R 1 42 42 0 -1 4194560 100 0 7 0 1234 56 9 8 20 0 5 0 99 1 2";
        assert_eq!(stat_cpu_ticks(line), Some(1234 + 56));
        assert_eq!(stat_cpu_ticks("42 (x) R 1 2"), None, "too short");
        assert_eq!(stat_cpu_ticks("no parenthesis"), None);
    }

    /// A window counts only with the same pid, the same bundles and some
    /// running; the value kept is the busier of the last two windows.
    #[test]
    fn a_cpu_sample_measures_only_a_settled_window() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        // pid 7; demand in hundredths of a second.
        let next = |then: Option<&CpuSample>, ms, ticks: u64, moves, in_flight| {
            CpuSample::after(then, 7, at(ms), ticks as f64 / 100.0, moves, in_flight)
        };
        let first = next(None, 0, 1000, 3, 1);
        assert_eq!((first.window, first.permille), (CPU_UNSAMPLED, CPU_UNSAMPLED));
        // 10 ticks in 200 ms: half a core; the window before had none.
        let second = next(Some(&first), 200, 1010, 3, 1);
        assert_eq!((second.window, second.permille), (500, CPU_UNSAMPLED));
        let third = next(Some(&second), 400, 1016, 3, 1);
        assert_eq!((third.window, third.permille), (300, 500), "the busier of two");
        let fourth = next(Some(&third), 600, 1022, 3, 1);
        assert_eq!(fourth.permille, 300);
        // A bundle started or ended, none ran, or another process.
        assert_eq!(next(Some(&fourth), 800, 1030, 4, 1).window, CPU_UNSAMPLED);
        assert_eq!(next(Some(&fourth), 800, 1030, 3, 0).window, CPU_UNSAMPLED);
        let other = CpuSample::after(Some(&fourth), 8, at(800), 0.05, 3, 1);
        assert_eq!(other.window, CPU_UNSAMPLED);
    }

    /// The wait is the second of a schedstat line's three fields.
    #[test]
    fn schedstat_wait_is_the_second_field() {
        assert_eq!(schedstat_wait_ns("120142473 107435328 395\n"), Some(107435328));
        assert_eq!(schedstat_wait_ns("120142473"), None);
        assert_eq!(schedstat_wait_ns(""), None);
    }

    /// A process's CPU demand is at least the CPU it used, and a process
    /// that is gone has none.
    #[cfg(target_os = "linux")]
    #[test]
    fn process_cpu_demand_covers_the_cpu_used() {
        let me = std::process::id();
        let tps = clock_ticks_per_second();
        let used = process_cpu_ticks(me).expect("this process's /proc/<pid>/stat") as f64 / tps;
        let demand = process_cpu_demand(me, tps).expect("this process's demand");
        assert!(demand >= used, "{demand} < {used}");
        assert_eq!(process_cpu_demand(u32::MAX, tps), None);
    }

    /// A process's CPU ticks grow as it works, and a process that is gone
    /// has none.
    #[cfg(target_os = "linux")]
    #[test]
    fn process_cpu_ticks_count_this_process_s_work() {
        let me = std::process::id();
        let before = process_cpu_ticks(me).expect("this process's /proc/<pid>/stat");
        let ticks = clock_ticks_per_second();
        // Work until 0.2 s of CPU is counted: however busy the machine (the
        // other tests run beside this one), the count must get there.
        let target = before + (0.2 * ticks) as u64;
        let start = std::time::Instant::now();
        let (mut x, mut after) = (0u64, before);
        while after < target && start.elapsed() < Duration::from_secs(60) {
            for _ in 0..1_000_000 {
                x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
            }
            after = process_cpu_ticks(me).expect("still here");
        }
        assert!(after >= target, "{before} -> {after} ({ticks}/s) in {:?}", start.elapsed());
        assert_eq!(process_cpu_ticks(u32::MAX), None);
    }

    /// The autoscaler's demand: a harness per waiting `alone` bundle, one
    /// per `room` others; counting out takes a bundle from both counts.
    #[test]
    fn each_waiting_alone_bundle_asks_for_a_harness_of_its_own() {
        let mut pool = Pool::default();
        for alone in [true, true, false, false, false] {
            pool.count_waiting("py", alone, true);
        }
        assert_eq!(pool.harnesses_wanted("py", 2), 2 + 2);
        assert_eq!(pool.harnesses_wanted("py", 4), 2 + 1);
        pool.count_waiting("py", true, false);
        assert_eq!(pool.waiting["py"], 4);
        assert_eq!(pool.harnesses_wanted("py", 2), 1 + 2);
        assert_eq!(pool.harnesses_wanted("go", 2), 0);
    }

    /// A small bundle of a one-core SDK waits for the harness's idle bundle
    /// processor of its descriptor rather than have it build another, at
    /// most PROCESSOR_WAIT; a large one, another descriptor's, or a
    /// multi-core SDK's starts at once.
    #[tokio::test(start_paused = true)]
    async fn a_small_bundle_waits_for_an_idle_processor_of_its_descriptor() {
        let fn_api = FnApi::new("localhost:1".into());
        let (harnesses, [(java, _java_rx), (py, _py_rx)]) = java_and_python(&fn_api, 4, 4);
        let harnesses = Arc::new(harnesses);
        let soon = Duration::from_millis(5);
        let pick = |env: &'static str, d: &'static str, small: bool| {
            let h = harnesses.clone();
            tokio::spawn(async move { h.pick(env, d, small, false).await.unwrap().id.clone() })
        };
        // The first bundle of a descriptor starts (its processor gets built).
        pick("py", "d", true).await.unwrap();
        assert_eq!(py.processors_of("d"), (1, 1));
        // A second small one waits for it: it finishes, the second reuses it.
        let began = tokio::time::Instant::now();
        let second = pick("py", "d", true);
        tokio::time::sleep(soon).await;
        assert!(!second.is_finished(), "a small bundle built a second processor");
        assert_eq!(harnesses.backlog("py"), 0, "a worker has room: no demand for more harnesses");
        assert!(harnesses.has_room("py"));
        harnesses.release(&py, "d", false);
        second.await.unwrap();
        assert!(began.elapsed() < PROCESSOR_WAIT);
        assert_eq!(py.processors_of("d"), (1, 1));
        // Large bundles, other descriptors and multi-core SDKs do not wait.
        pick("py", "d", false).await.unwrap();
        assert_eq!(py.processors_of("d"), (2, 2));
        pick("py", "e", true).await.unwrap();
        pick("java", "d", true).await.unwrap();
        pick("java", "d", true).await.unwrap();
        assert_eq!(java.processors_of("d"), (2, 2));
        // Two processors of "d" built, both busy: a third small bundle
        // waits PROCESSOR_WAIT at most, then has a third built.
        let began = tokio::time::Instant::now();
        pick("py", "d", true).await.unwrap();
        assert!(began.elapsed() >= PROCESSOR_WAIT);
        assert_eq!(py.processors_of("d"), (3, 3));
        // With one idle, a small bundle takes it at once.
        harnesses.release(&py, "d", false);
        let began = tokio::time::Instant::now();
        pick("py", "d", true).await.unwrap();
        assert!(began.elapsed() < PROCESSOR_WAIT);
        assert_eq!(py.processors_of("d"), (3, 3));
        // A failed bundle's processor is gone (the SDK drops it).
        harnesses.release(&py, "d", true);
        assert_eq!(py.processors_of("d"), (2, 2));
        // Idle past the SDK's eviction, the processors are gone: a small
        // bundle starts at once and builds one.
        harnesses.release(&py, "d", false);
        harnesses.release(&py, "d", false);
        assert_eq!(py.processors_of("d"), (0, 2));
        tokio::time::advance(crate::registry::PROCESSOR_IDLE_EVICTION).await;
        assert_eq!(py.processors_of("d"), (0, 0));
        let began = tokio::time::Instant::now();
        pick("py", "d", true).await.unwrap();
        assert!(began.elapsed() < PROCESSOR_WAIT);
        assert_eq!(py.processors_of("d"), (1, 1));
    }

    /// Past MAX_DESCRIPTOR_COUNTS descriptors a worker forgets the idle ones
    /// (a streaming job has one per side-input generation).
    #[test]
    fn a_worker_forgets_idle_descriptors_past_its_bound() {
        let fn_api = FnApi::new("localhost:1".into());
        let (w, _rx) = connected_worker(&fn_api, "job-worker-1");
        w.descriptor_started("busy");
        for n in 0..crate::registry::MAX_DESCRIPTOR_COUNTS + 1 {
            let d = format!("s@side{n}");
            w.descriptor_started(&d);
            w.descriptor_ended(&d, false);
        }
        let left = w.processors.lock().unwrap().len();
        assert!(left <= crate::registry::MAX_DESCRIPTOR_COUNTS, "{left} kept");
        assert_eq!(w.processors_of("busy"), (1, 1), "one in flight is kept");
    }

    /// One worker starts one harness of a multi-core SDK's environment and
    /// `per_core_sdk` of another's.
    #[tokio::test]
    async fn a_worker_starts_one_harness_of_a_multi_core_sdk_and_one_per_core_of_another() {
        let (java, java_ids) = silent_pool(JAVA).await;
        let (python, python_ids) = silent_pool(PYTHON).await;
        let fn_api = FnApi::new("localhost:1".into());
        let envs = HashMap::from([("java".to_string(), java), ("py".to_string(), python)]);
        let cancel = Arc::new(AtomicBool::new(false));
        let starting = spawn_start(&fn_api, "job-per-worker", envs, cancel.clone());
        let began = Instant::now();
        while java_ids.lock().unwrap().len() < 1 || python_ids.lock().unwrap().len() < 2 {
            assert!(began.elapsed() < Duration::from_secs(10), "harnesses not started");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // All are launched at once: none comes later.
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(java_ids.lock().unwrap().len(), 1);
        assert_eq!(python_ids.lock().unwrap().len(), 2);
        cancel.store(true, Ordering::SeqCst);
        let started = tokio::time::timeout(Duration::from_secs(10), starting)
            .await
            .expect("start gives up once cancelled")
            .unwrap();
        assert!(matches!(started, Err(HarnessError::Cancelled)), "{:?}", started.err());
    }

    /// Stopping a job ends the wait of a LOOPBACK/EXTERNAL harness that has
    /// not connected yet at once, not after CONNECT_TIMEOUT: nothing of the
    /// job's harness set is left waiting.
    #[tokio::test]
    async fn stop_ends_the_wait_of_a_pool_harness_that_never_connects() {
        let (external, ids) = silent_pool(&[]).await;
        let fn_api = FnApi::new("localhost:1".into());
        let envs = HashMap::from([("env".to_string(), external)]);
        let (harnesses, _control_rx) =
            start_one_connected_one_starting(&fn_api, "job-stop-wait", envs, &ids).await;
        assert_eq!(harnesses.pool().starting.get("env").copied(), Some(1));
        harnesses.stop().await;
        let began = Instant::now();
        while harnesses.pool().starting.get("env").copied() != Some(0) {
            assert!(
                began.elapsed() < Duration::from_secs(5),
                "the unconnected harness still waits after stop"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // Its task let go of the harness set too.
        while Arc::strong_count(&harnesses) > 1 {
            assert!(began.elapsed() < Duration::from_secs(5), "a task still holds the job's harnesses");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Stopping a job's harnesses sends StopWorker to the pool for each of
    /// them, but does not wait for the pool's answer: a pool that never
    /// answers holds up neither the job's end nor its state.
    #[tokio::test]
    async fn stop_sends_stop_worker_without_waiting_for_the_answer() {
        let pool = served_silent_pool(&[], true).await;
        let (ids, stopped) = (pool.started, pool.stopped);
        let fn_api = FnApi::new("localhost:1".into());
        let envs = HashMap::from([("env".to_string(), pool.env)]);
        let (harnesses, _control_rx) =
            start_one_connected_one_starting(&fn_api, "job-stop-rpc", envs, &ids).await;
        let stopping = Instant::now();
        harnesses.stop().await;
        // SDK_CLOSE_GRACE at most (the test's harness never closes its
        // streams), well short of STOP_GRACE, which a wait for the stalled
        // answer would reach.
        assert!(stopping.elapsed() < STOP_GRACE - Duration::from_secs(2), "{:?}", stopping.elapsed());
        let mut expected = ids.lock().unwrap().clone();
        expected.sort();
        loop {
            let mut got = stopped.lock().unwrap().clone();
            got.sort();
            if got == expected {
                break;
            }
            assert!(stopping.elapsed() < Duration::from_secs(10), "StopWorker for {got:?}, not {expected:?}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// A job's StartWorker calls go over the connection opened when it was
    /// prepared: the pool accepts one connection for the preconnect and
    /// both launches. A pool that cannot be reached is an error at launch.
    #[tokio::test]
    async fn start_worker_uses_the_connection_opened_at_prepare() {
        let ServedPool { env, started, accepted, .. } = served_silent_pool(&[], false).await;
        let endpoint = pool_endpoint(&env).unwrap();
        let pools = PoolChannels::default();
        pools.preconnect(&HashMap::from([("env".to_string(), env)]));
        let began = Instant::now();
        while accepted.load(Ordering::SeqCst) == 0 {
            assert!(began.elapsed() < Duration::from_secs(10), "no connection at prepare");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        for id in ["w1", "w2"] {
            pools
                .client(&endpoint)
                .await
                .unwrap()
                .start_worker(beam::StartWorkerRequest {
                    worker_id: id.into(),
                    ..Default::default()
                })
                .await
                .unwrap();
        }
        assert_eq!(*started.lock().unwrap(), vec!["w1".to_string(), "w2".to_string()]);
        assert_eq!(accepted.load(Ordering::SeqCst), 1);

        let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let nowhere = format!("localhost:{}", closed.local_addr().unwrap().port());
        drop(closed);
        assert!(pools.client(&nowhere).await.is_err());
    }

    /// Each PROCESS harness runs in its own folder (its semi-persistent
    /// folder), so boot programs that write into their working folder
    /// (Beam's Go boot) do not share files across harnesses and jobs.
    #[tokio::test]
    async fn process_harness_runs_in_its_own_folder() {
        match start_exiting_script("job-cwd", "pwd >&2\nexit 5\n").await {
            HarnessError::ExitedBeforeConnect {
                stderr, worker_id, ..
            } => {
                assert!(worker_id.starts_with("job-cwd-worker-1-"), "{worker_id}");
                assert_eq!(stderr, vec![worker_dir(&worker_id).display().to_string()]);
            }
            other => panic!("wrong error: {other}"),
        }
    }

    fn tempfile_dir(name: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("weir-test-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    // The non-coder capabilities each SDK declares (Beam Java 2.73.0's
    // `Environments.getJavaCapabilities()`, Go v2.77.0's `goCapabilities()`,
    // Python 2.77.0's `python_sdk_capabilities()`).
    const JAVA: &[&str] = &[
        "beam:protocol:control_request_elements_embedding:v1",
        "beam:protocol:data_sampling:v1",
        "beam:protocol:harness_monitoring_infos:v1",
        "beam:protocol:multi_core_bundle_processing:v1",
        "beam:protocol:multimap_state:v1",
        "beam:protocol:ordered_list_state:v1",
        "beam:protocol:progress_reporting:v1",
        "beam:protocol:sdk_consuming_received_data:v1",
        "beam:protocol:state_caching:v1",
        "beam:transform:sdf_truncate_sized_restrictions:v1",
        "beam:transform:to_string:v1",
        "beam:version:sdk_base:apache/beam_java17_sdk:2.73.0",
    ];
    const GO: &[&str] = &[
        "beam:protocol:progress_reporting:v1",
        "beam:protocol:multi_core_bundle_processing:v1",
        "beam:transform:sdf_truncate_sized_restrictions:v1",
        "beam:protocol:worker_status:v1",
        "beam:protocol:monitoring_info_short_ids:v1",
        "beam:version:sdk_base:go:apache/beam_go_sdk:2.77.0",
        "beam:transform:to_string:v1",
        "beam:protocol:data_sampling:v1",
        "beam:protocol:sdk_consuming_received_data:v1",
    ];
    const PYTHON: &[&str] = &[
        "beam:combinefn:packed_python:v1",
        "beam:protocol:data_sampling:v1",
        "beam:protocol:harness_monitoring_infos:v1",
        "beam:protocol:named_data_streams:v1",
        "beam:protocol:ordered_list_state:v1",
        "beam:protocol:progress_reporting:v0",
        "beam:protocol:sdk_consuming_received_data:v1",
        "beam:protocol:worker_status:v1",
        "beam:transform:sdf_truncate_sized_restrictions:v1",
        "beam:transform:to_string:v1",
        "beam:version:sdk_base:apache/beam_python3.11_sdk:2.77.0",
    ];

    #[test]
    fn bundles_per_harness_follow_the_sdk_unless_the_option_says() {
        let cores = machine_cores();
        let multi = MULTI_CORE_BUNDLES_PER_HARNESS.max(2 * cores);
        assert!(multi >= 16);
        let per_core = sizing(cores, None);
        // A multi-core SDK: one bundle per core in batch, 16 (or two per core) streaming.
        assert_eq!(bundles_per_harness(&env(JAVA), &per_core), cores);
        assert_eq!(bundles_per_harness(&env(GO), &per_core), cores);
        let streaming = HarnessSizing { streaming: true, ..per_core };
        assert_eq!(bundles_per_harness(&env(JAVA), &streaming), multi);
        assert_eq!(bundles_per_harness(&env(GO), &streaming), multi);
        // The mode does not change a one-core SDK's.
        assert_eq!(bundles_per_harness(&env(PYTHON), &streaming), SINGLE_CORE_BUNDLES_PER_HARNESS);
        assert_eq!(bundles_per_harness(&env(PYTHON), &per_core), SINGLE_CORE_BUNDLES_PER_HARNESS);
        assert_eq!(bundles_per_harness(&env(&[]), &per_core), SINGLE_CORE_BUNDLES_PER_HARNESS);
        // One Python harness for all of a worker's cores runs two bundles per core.
        assert_eq!(
            bundles_per_harness(&env(PYTHON), &sizing(1, None)),
            SINGLE_CORE_BUNDLES_PER_HARNESS * cores
        );
        let pool = HarnessSizing { in_process_pool: true, ..per_core };
        assert_eq!(bundles_per_harness(&env(PYTHON), &pool), SINGLE_CORE_BUNDLES_PER_HARNESS * cores);
        // number_of_worker_harness_threads wins, for every SDK.
        assert_eq!(bundles_per_harness(&env(PYTHON), &sizing(cores, Some(1))), 1);
        assert_eq!(bundles_per_harness(&env(PYTHON), &sizing(1, Some(3))), 3);
        assert_eq!(bundles_per_harness(&env(JAVA), &sizing(cores, Some(2))), 2);
        assert_eq!(bundles_per_harness(&env(JAVA), &sizing(cores, Some(0))), 1);
    }

    #[test]
    fn a_worker_runs_one_harness_of_a_multi_core_sdk_and_one_per_core_of_another() {
        assert_eq!(harnesses_per_worker(&env(JAVA), &sizing(4, None)), 1);
        assert_eq!(harnesses_per_worker(&env(GO), &sizing(4, None)), 1);
        assert_eq!(harnesses_per_worker(&env(PYTHON), &sizing(4, None)), 4);
        assert_eq!(harnesses_per_worker(&env(&[]), &sizing(2, None)), 2);
        assert_eq!(harnesses_per_worker(&env(PYTHON), &sizing(0, None)), 1);
    }

    #[test]
    fn the_clients_in_process_pool_runs_one_harness_per_worker() {
        let pool = HarnessSizing { in_process_pool: true, ..sizing(4, None) };
        assert_eq!(harnesses_per_worker(&env(PYTHON), &pool), 1);
        // Only its EXTERNAL environments are the client's pool: a PROCESS
        // environment of the same job still runs one per core.
        let process = beam::Environment { urn: urns::env::PROCESS.into(), ..env(PYTHON) };
        assert_eq!(harnesses_per_worker(&process, &pool), 4);
    }
}
