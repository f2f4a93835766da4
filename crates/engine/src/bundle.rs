//! The bundle interface between the engine and SDK harnesses.

use std::sync::Arc;

use crate::outputs::{OutputSpill, SpilledOutput};
use crate::side_input::SideInputs;
use crate::user_state::{StateUsage, UserState};

/// One bundle for an SDK stage.
pub struct BundleRequest {
    /// Index of the stage in the graph and its id (= `ProcessBundleDescriptor` id).
    pub stage: usize,
    pub stage_id: String,
    /// Stage name for messages.
    pub stage_name: String,
    /// The bundle's main-input elements, each an encoded windowed value.
    /// (The Fn API data plane never splits an element across messages.)
    pub input: Vec<Vec<u8>>,
    /// Materialized side inputs of the stage, served over the State API.
    pub side_inputs: Arc<SideInputs>,
    /// Bumped each time a global-window side input of a streaming stage
    /// changed. A Python SDK evaluates global-window side inputs once per
    /// bundle processor and keeps them (Beam issue #28776), so bundles of a
    /// new generation go to a new `ProcessBundleDescriptor` id (a copy of
    /// the stage's) and get fresh processors. 0: the stage's own descriptor.
    pub side_input_generation: u64,
    /// Timers to deliver, per timer family of the stage (same order as
    /// `SdkStage::timer_families`): concatenated encoded `beam:coder:timer:v1` values.
    pub timers: Vec<Vec<u8>>,
    /// The user state of the keys this stage's operator owns on its timely
    /// worker (see [`crate::user_state`]): the bundle reads and writes it
    /// through a `BundleUserState`, committed only when the bundle succeeds.
    /// A stage that is not stateful gets a store of its own too; no SDK
    /// writes to it (its descriptor has no state specs).
    pub user_state: Arc<UserState>,
    /// Where the harness writes the bundle's outputs (not its timers) while
    /// they outgrow memory; None: kept in memory.
    pub spill_outputs: Option<OutputSpill>,
    /// How the running bundle's split-off work goes back to the engine
    /// (see [`Splits`]). None: the bundle must not be split (its result is
    /// read as a whole).
    pub on_split: Option<Splits>,
}

/// Hands residuals of a split of a running bundle back to the engine
/// before the bundle ends: encoded windowed values of the stage input; how
/// many of them are the bundle's own input elements the SDK had not
/// started (a split of the data channel at an element boundary), as opposed
/// to new restrictions of splittable elements; and in how many bundles
/// (at least 1) those elements start, one per SDK worker ready for them.
pub type OnSplit = Arc<dyn Fn(Vec<Vec<u8>>, usize, usize) + Send + Sync>;

/// What a running bundle may split off, and where it goes.
#[derive(Clone)]
pub struct Splits {
    /// Takes the residuals of a split ([`OnSplit`]).
    pub hand_back: OnSplit,
    /// Elements of the stage waiting for a bundle on the bundle's timely
    /// worker, kept current by the engine: splitting a bundle's data channel
    /// only helps while none wait (what it hands back would queue behind
    /// them).
    pub backlog: Arc<std::sync::atomic::AtomicUsize>,
}

/// What a bundle produced.
#[derive(Debug, Default)]
pub struct BundleResult {
    /// Per stage output (same order as `SdkStage::outputs`): concatenated encoded windowed values.
    pub outputs: Vec<Vec<u8>>,
    /// Per stage output, when the harness spilled some of it (see
    /// [`BundleRequest::spill_outputs`]): its leading bytes, which come
    /// before `outputs[i]`. Shorter than `outputs` (or empty): not spilled.
    pub spilled: Vec<Option<SpilledOutput>>,
    /// Residual elements (SDF checkpoints), each an encoded windowed value of the stage input.
    pub residuals: Vec<Vec<u8>>,
    /// How long the residuals asked to wait before they resume, in
    /// milliseconds rounded up (the least
    /// `DelayedBundleApplication.requested_time_delay` of them; 0 = at
    /// once). The stage waits that long, and at least
    /// [`crate::EngineConfig::min_resume_delay`] when it is above 0.
    pub residual_delay_ms: i64,
    /// The residuals' output watermark estimate (the least of their
    /// `BundleApplication.output_watermarks`, ms), when they reported one: the
    /// stage's output watermark is held there, not at the bundle's input time.
    pub residual_watermark: Option<weir_model::Timestamp>,
    /// Timers the bundle set or cleared, per timer family (concatenated encoded timers).
    pub timers: Vec<Vec<u8>>,
}

/// Completion callback; called exactly once, from any thread.
pub type Completion = Box<dyn FnOnce(std::result::Result<BundleResult, String>) + Send>;

/// Runs bundles on SDK harnesses. Implemented by the harness layer.
pub trait BundleProcessor: Send + Sync + 'static {
    /// Starts `request` and returns at once; `done` is called when the bundle
    /// completes, with the outputs or with an error message (the user's
    /// traceback when user code raised).
    fn process_bundle(&self, request: BundleRequest, done: Completion);

    /// Whether a batch job's splittable SDK stage `stage` (its index in the
    /// graph) gets the restrictions pending on a timely worker as one
    /// bundle, which the processor splits for SDK workers that fall idle,
    /// rather than in small bundles that spread by themselves. The default
    /// is small bundles.
    fn restrictions_in_one_bundle(&self, stage: usize) -> bool {
        let _ = stage;
        false
    }

    /// Told after the engine garbage-collected the user state of stateful
    /// SDK stage `stage` (its index in the graph) on one timely worker at
    /// input watermark `input_watermark` (event time, ms; `i64::MAX` once
    /// the input is done): `removed` cells went, and `cells` counts what the
    /// job holds in this process now (see [`UserState::expire`]). For
    /// metrics; the default does nothing.
    ///
    /// The engine expires state in streaming jobs only (in batch the
    /// watermark jumps to the end of input once, and the state goes with the
    /// job), and only when no bundle of the stage is running or waiting and
    /// no timer is ready, with the input watermark held back to the earliest
    /// hold of the stage's pending timers, so a window's end-of-window
    /// timers have run (and read its state) before its state goes.
    fn user_state_expired(
        &self,
        stage: usize,
        input_watermark: weir_model::Timestamp,
        removed: usize,
        cells: &StateUsage,
    ) {
        let _ = (stage, input_watermark, removed, cells);
    }
}
