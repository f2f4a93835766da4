//! Weir's engine: runs a [`weir_graph::StageGraph`] on Timely Dataflow.
//!
//! Layer: engine. Depends on `weir-model`, `weir-graph` and `timely` (used only
//! in [`dataflow`], `operators` and `time`); never on tonic, prost, tokio or proto types (`tests/layering.rs` checks the whole tree). Entry point:
//! [`run_job`]. SDK stages are executed through the [`BundleProcessor`] trait,
//! which the harness implements.
//!
//! Where things are: `dataflow` runs a job (the graph wiring, the job
//! context, the stuck-job watchdog); `operators` holds one timely operator
//! per file (GroupByKey, TestStream, SDK stage); `time` maps Beam event
//! times to timely times and holds the processing-time clock. The pure
//! state machines the operators drive live in their own modules
//! ([`group_by_key`], [`panes`], [`triggers`], [`side_input`], [`timers`]),
//! and so does user state ([`user_state`]: each stateful stage operator
//! owns the state of the keys routed to its worker and lends it to bundles).
//!
//! Glossary (Beam's terms):
//! - *element*: one encoded windowed value (`beam:coder:windowed_value:v1`).
//! - *bundle*: a batch of elements of one stage's main input, processed by an
//!   SDK harness as one `ProcessBundleRequest`.
//! - *stage*: fused SDK transforms, or one runner transform (Impulse,
//!   GroupByKey, Flatten, Reshuffle).
//! - *watermark*: a timely frontier; timely times are Beam event times in
//!   milliseconds mapped order-preservingly to `u64` (`Timestamp::to_timely`).
//! - *hold*: a retained timely capability (bundles in flight, buffered groups).
//! - *pane*: one firing of a window in a GroupByKey.
//! - *residual*: the unprocessed part of an SDF element returned by a bundle,
//!   re-scheduled into the same stage.

pub mod bundle;
mod dataflow;
pub mod elements;
pub mod error;
pub mod group_by_key;
pub mod merge_windows;
mod operators;
pub mod outputs;
pub mod panes;
mod peers;
pub mod side_input;
mod spill;
mod time;
pub mod timers;
pub mod triggers;
pub mod user_state;

pub use bundle::{BundleProcessor, BundleRequest, BundleResult, Completion, OnSplit, Splits};
pub use dataflow::{run_job, Progress, StageCounts, StageProgress, StageStatus};
pub use error::{panic_text, EngineError, Result};
pub use outputs::{OutputSpill, SpilledOutput};

/// How a job is run.
#[derive(Clone, Debug)]
pub struct EngineConfig {
    /// Timely worker threads in this process (default: cores).
    pub workers: usize,
    /// Most elements in one bundle sent to an SDK harness.
    pub max_bundle_elements: usize,
    /// Most bytes in one bundle (a single larger element still forms a bundle).
    pub max_bundle_bytes: usize,
    /// Most bundles one stage operator on one worker keeps in flight.
    pub max_bundles_in_flight: usize,
    /// Whether hot-key reports may show the key itself (Dataflow's
    /// `enable_hot_key_logging`); otherwise only its size and share.
    pub hot_key_logging: bool,
    /// Where the engine sends notices meant for the job's message stream.
    pub notices: Notices,
    /// After how long without progress anywhere in the job the engine
    /// reports it as stuck (naming the stages it waits at and their input
    /// watermarks) in the job's messages; repeated every period.
    pub stuck_after: std::time::Duration,
    /// Set when the job is drained: a TestStream ends, and splittable-DoFn
    /// residuals resume at once through their stage's drain descriptor
    /// (`SdkStage::drain_descriptor_id`: the DoFn's `truncate_restriction`
    /// first), so the sources finish and every window fires.
    pub drain: std::sync::Arc<std::sync::atomic::AtomicBool>,
    /// Most bytes one batch GroupByKey keeps in memory (over all workers)
    /// before it writes its groups as sorted runs under `spill_dir` and
    /// merges them back when they fire (non-merging WindowFns only); None:
    /// no bound.
    pub gbk_memory_budget: Option<usize>,
    /// About the most bytes of user state the job keeps in this process
    /// (estimated, with the reservations of bundles in flight:
    /// [`user_state::StateUsage`]); an append past it fails its bundle with
    /// a message naming the state. None: no bound.
    pub user_state_budget: Option<usize>,
    /// About the most bytes one stage's side inputs take in this process
    /// ([`side_input::SideInputs::bytes`]); past it the job fails, naming
    /// the side inputs. None: no bound.
    pub side_input_budget: Option<usize>,
    /// Where GroupByKeys spill: one subfolder per stage and worker, removed
    /// when the job ends.
    pub spill_dir: std::path::PathBuf,
    /// Where the engine publishes each stage's watermarks and counts while
    /// the job runs (a shared handle: keep a clone to read it).
    pub progress: Progress,
    /// Set when this process is one of several running the job as one
    /// timely computation (cluster mode); None: the job runs in this
    /// process alone.
    pub cluster: Option<ClusterPeers>,
    /// Least wait before a residual that asked for a resume delay
    /// (`DelayedBundleApplication.requested_time_delay` > 0: Python's
    /// `defer_remainder`, Java's `ProcessContinuation.resume()
    /// .withResumeDelay`, Go's `sdf.ResumeProcessingIn`) runs again, in
    /// whole ms rounded up; a longer requested delay is kept. Bounds how
    /// often a polling restriction's bundles run. Residuals asking for no
    /// delay are not delayed.
    pub min_resume_delay: std::time::Duration,
}

/// Default [`EngineConfig::min_resume_delay`]: 10 ms.
pub const DEFAULT_MIN_RESUME_DELAY: std::time::Duration = std::time::Duration::from_millis(10);

/// This process's place in a job that runs across several processes
/// (`weir worker`s): one timely computation whose processes connect to each
/// other over TCP (timely's own transport).
#[derive(Clone, Debug)]
pub struct ClusterPeers {
    /// This process's index in `addresses`.
    pub process: usize,
    /// `host:port` of every process's timely listener, in process order;
    /// the same list in every process.
    pub addresses: Vec<String>,
    /// Names the attempt (the same in its processes, different in any
    /// other), so that a process of another attempt cannot join this one.
    pub session: String,
    /// This process's timely listener, bound to `addresses[process]` since
    /// its port was chosen, so that no other socket can take the port in
    /// between; `None`: the workers bind the address when they connect.
    pub listener: Option<std::sync::Arc<std::net::TcpListener>>,
}

/// A sink for engine notices (e.g. hot keys), shown in the job's messages.
#[derive(Clone)]
pub struct Notices(pub std::sync::Arc<dyn Fn(String) + Send + Sync>);

impl Notices {
    /// Sends one notice.
    pub fn send(&self, text: String) {
        (self.0)(text)
    }
}

impl std::fmt::Debug for Notices {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Notices")
    }
}

impl Default for Notices {
    fn default() -> Self {
        Notices(std::sync::Arc::new(|text| tracing::warn!("{text}")))
    }
}

/// The cores this process may use (`available_parallelism`, at least 1),
/// read once, so every sizing rule (timely workers, SDK harnesses, split
/// decisions) counts the same.
pub fn machine_cores() -> usize {
    static CORES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            workers: machine_cores(),
            max_bundle_elements: 10_000,
            max_bundle_bytes: 8 << 20,
            max_bundles_in_flight: 2,
            hot_key_logging: false,
            notices: Notices::default(),
            stuck_after: std::time::Duration::from_secs(300),
            drain: Default::default(),
            gbk_memory_budget: None,
            user_state_budget: None,
            side_input_budget: None,
            spill_dir: std::env::temp_dir().join("weir-spill"),
            progress: Progress::default(),
            cluster: None,
            min_resume_delay: DEFAULT_MIN_RESUME_DELAY,
        }
    }
}
