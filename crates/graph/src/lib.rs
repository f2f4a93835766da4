//! The stage graph: what the engine runs, in native types (no protos).
//!
//! Layer: between plan and engine. `weir-plan` builds a [`StageGraph`] from
//! a pipeline proto; `weir-engine` runs it. Depends on `weir-model` only, so
//! the engine's dependency tree holds no proto or gRPC crate.

use weir_model::{Coder, Timestamp};

/// Index of a PCollection in [`StageGraph::pcollections`].
pub type PCollectionIndex = usize;

/// Stages and the PCollections that flow between them.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct StageGraph {
    /// Every PCollection that crosses a stage boundary (or feeds a side input).
    pub pcollections: Vec<PCollectionInfo>,
    /// Stages in topological order: a stage's inputs are produced by earlier stages.
    pub stages: Vec<Stage>,
    /// Streaming semantics (`--streaming`, or a pipeline with a TestStream):
    /// GroupByKeys run their triggers pane by pane as data and the watermark
    /// arrive, and processing time follows a clock. In batch every window
    /// fires once, complete, when its input is done.
    pub streaming: bool,
}

/// A PCollection as the runner sees it on the Fn API data plane.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct PCollectionInfo {
    /// The PCollection id in the pipeline proto.
    pub id: String,
    /// The element coder used on the wire (unknown coders length-prefixed).
    pub value_coder: Coder,
    /// The window coder of its windowing strategy.
    pub window_coder: Coder,
    /// Its windowing strategy.
    pub windowing: Windowing,
}

/// Beam WindowFns the runner must understand (for merging in GroupByKey).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum WindowFn {
    /// `beam:window_fn:global_windows:v1`
    Global,
    /// Fixed, sliding or any other non-merging WindowFn: assignment happens in the SDK.
    NonMerging,
    /// `beam:window_fn:session_windows:v1` with its gap in milliseconds.
    Sessions { gap_ms: i64 },
    /// Any other merging WindowFn (`MergeStatus.NEEDS_MERGE`, e.g. a Python
    /// `WindowFn` subclass with its own `merge`): the runner cannot merge its
    /// windows itself and asks the SDK, through the GroupByKey's
    /// [`StageKind::GroupByKey::merge_windows`] stage.
    CustomMerging,
}

/// Output timestamp policy of a GroupByKey (`OutputTime` in beam_runner_api.proto).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum OutputTime {
    /// The window's max timestamp (end - 1 ms).
    EndOfWindow,
    /// The earliest input timestamp in the pane.
    EarliestInPane,
    /// The latest input timestamp in the pane.
    LatestInPane,
}

/// The parts of a `WindowingStrategy` the engine uses
/// (`beam_runner_api.proto`, message `WindowingStrategy`).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Windowing {
    pub window_fn: WindowFn,
    pub output_time: OutputTime,
    /// When a GroupByKey emits panes (`WindowingStrategy.trigger`).
    pub trigger: Trigger,
    /// Whether a pane repeats the elements of earlier panes of its window.
    pub accumulation: Accumulation,
    /// How long after the end of a window (in event-time milliseconds) its
    /// data is still accepted; later data is dropped. 0 when unset.
    pub allowed_lateness_ms: i64,
    /// `OnTimeBehavior.FIRE_ALWAYS`: the on-time pane is emitted even when
    /// empty (otherwise only when it has new elements).
    pub on_time_fire_always: bool,
    /// `ClosingBehavior.EMIT_ALWAYS`: a window emits a final pane when it
    /// expires even without new elements (Weir does so only for an
    /// ACCUMULATING window that holds elements: its final pane repeats
    /// them, marked last, as Beam Java's and Prism's runners emit it).
    pub closing_emit_always: bool,
    /// The timestamp of a global-window pane output at the end of the window,
    /// as the strategy's SDK stamps it: the Runner API's
    /// `GLOBAL_WINDOW_MAX_TIMESTAMP` (Java's and Go's `GlobalWindow` max,
    /// [`Timestamp::END_OF_GLOBAL_WINDOW`]) or, for Python, one millisecond
    /// less ([`Timestamp::PYTHON_END_OF_GLOBAL_WINDOW`]).
    pub end_of_global_window: Timestamp,
    /// A streaming pane's timestamp (EARLIEST or LATEST in pane) combines
    /// only the elements that came since the window's last pane and not
    /// behind the watermark, or is the window's end when there are none,
    /// as Java's ReduceFnRunner holds the watermark (its late panes are
    /// stamped at the window's end). Set for Java strategies; Python's and
    /// Go's runners (Prism) combine every element of the pane.
    pub pane_timestamp_from_holds: bool,
}

impl Windowing {
    /// Global windows, default trigger, discarding, no lateness, output at
    /// the end of the window (stamped as Python does).
    pub fn global() -> Self {
        Windowing {
            window_fn: WindowFn::Global,
            output_time: OutputTime::EndOfWindow,
            trigger: Trigger::Default,
            accumulation: Accumulation::Discarding,
            allowed_lateness_ms: 0,
            on_time_fire_always: true,
            closing_emit_always: false,
            end_of_global_window: Timestamp::PYTHON_END_OF_GLOBAL_WINDOW,
            pane_timestamp_from_holds: false,
        }
    }
}

/// `AccumulationMode` in beam_runner_api.proto (RETRACTING is rejected).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Accumulation {
    /// Each pane holds only the elements that arrived since the previous pane.
    Discarding,
    /// Each pane holds every element of its window so far.
    Accumulating,
}

/// A trigger (`Trigger` in beam_runner_api.proto), as a tree.
///
/// Times are Beam event times or processing times in milliseconds.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum Trigger {
    /// `Trigger.Default`: fires when the watermark passes the end of the
    /// window, then once per late element (within allowed lateness).
    Default,
    /// `Trigger.AfterEndOfWindow`, with optional early and late firings
    /// (each repeated).
    AfterEndOfWindow {
        early: Option<Box<Trigger>>,
        late: Option<Box<Trigger>>,
    },
    /// `Trigger.ElementCount`: fires once at least `count` elements arrived.
    ElementCount(u64),
    /// `Trigger.AfterProcessingTime`: fires once the processing time passes
    /// the first element's arrival plus `delay_ms` (the sum of its delay
    /// transforms), rounded up to `align` = (period, offset) when given.
    AfterProcessingTime {
        delay_ms: i64,
        align: Option<(i64, i64)>,
    },
    /// `Trigger.AfterSynchronizedProcessingTime`: on one machine, processing
    /// time is synchronized already: fires as soon as an element arrived.
    AfterSynchronizedProcessingTime,
    /// `Trigger.Always`: fires after every element.
    Always,
    /// `Trigger.Never`: never fires; only the final pane at window expiry.
    Never,
    /// `Trigger.Repeatedly`: its subtrigger, reset after every firing.
    Repeatedly(Box<Trigger>),
    /// `Trigger.AfterEach`: its subtriggers in sequence.
    AfterEach(Vec<Trigger>),
    /// `Trigger.AfterAny`: fires (and finishes) when any subtrigger fires.
    AfterAny(Vec<Trigger>),
    /// `Trigger.AfterAll`: fires (and finishes) when every subtrigger has fired.
    AfterAll(Vec<Trigger>),
    /// `Trigger.OrFinally`: `main` until `finally` fires, then finishes.
    OrFinally {
        main: Box<Trigger>,
        finally: Box<Trigger>,
    },
}

impl Trigger {
    /// True when the trigger or one of its subtriggers fires on processing
    /// time (`AfterProcessingTime`, `AfterSynchronizedProcessingTime`): its
    /// panes depend on the wall clock, in batch as in streaming.
    pub fn uses_processing_time(&self) -> bool {
        match self {
            Trigger::AfterProcessingTime { .. } | Trigger::AfterSynchronizedProcessingTime => true,
            Trigger::Default | Trigger::ElementCount(_) | Trigger::Always | Trigger::Never => false,
            Trigger::AfterEndOfWindow { early, late } => early
                .iter()
                .chain(late.iter())
                .any(|t| t.uses_processing_time()),
            Trigger::Repeatedly(t) => t.uses_processing_time(),
            Trigger::AfterEach(ts) | Trigger::AfterAny(ts) | Trigger::AfterAll(ts) => {
                ts.iter().any(Trigger::uses_processing_time)
            }
            Trigger::OrFinally { main, finally } => {
                main.uses_processing_time() || finally.uses_processing_time()
            }
        }
    }
}

/// One event of a TestStream (`TestStreamPayload.Event`).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum TestStreamEvent {
    /// Elements for the output `output` (index into the stage's outputs):
    /// encoded values (the payload's coder, nested) with event timestamps.
    Elements {
        output: usize,
        elements: Vec<(Vec<u8>, weir_model::Timestamp)>,
    },
    /// The watermark of output `output` advances to `to`.
    Watermark {
        output: usize,
        to: weir_model::Timestamp,
    },
    /// The test clock (processing time) advances by `advance_ms` milliseconds.
    ProcessingTime { advance_ms: i64 },
}

/// One unit of execution.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct Stage {
    /// Stable id, also the `ProcessBundleDescriptor` id for SDK stages.
    pub id: String,
    /// Unique names of the transforms in the stage, joined with `+`, for messages.
    pub name: String,
    pub kind: StageKind,
}

/// What a stage does.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub enum StageKind {
    /// `beam:transform:impulse:v1`: one empty byte array in the global window at MIN timestamp.
    Impulse { output: PCollectionIndex },
    /// `beam:transform:teststream:v1`: replays `events` in order; each output
    /// waits until the pipeline has caught up with the previous event.
    TestStream {
        outputs: Vec<PCollectionIndex>,
        events: Vec<TestStreamEvent>,
    },
    /// `beam:transform:group_by_key:v1`, executed by the runner.
    GroupByKey {
        input: PCollectionIndex,
        output: PCollectionIndex,
        /// For input windowed by a [`WindowFn::CustomMerging`]: the SDK
        /// stage (registered under this stage's id) that runs
        /// `beam:transform:merge_windows:v1` on the WindowFn. It reads
        /// `KV<nonce, iterable<window>>` and writes
        /// `KV<nonce, KV<iterable<unmerged window>, iterable<KV<merged window,
        /// iterable<window merged into it>>>>>`, nonces as `beam:coder:bytes:v1`,
        /// in the global window. Its `outputs` is empty: its one sink
        /// (`output_transform_ids[0]`) feeds no PCollection of the graph.
        merge_windows: Option<Box<SdkStage>>,
    },
    /// `beam:transform:flatten:v1`, executed by the runner.
    Flatten {
        inputs: Vec<PCollectionIndex>,
        output: PCollectionIndex,
    },
    /// `beam:transform:reshuffle:v1` (and redistribute): an identity that redistributes elements.
    Reshuffle {
        input: PCollectionIndex,
        output: PCollectionIndex,
    },
    /// Fused SDK transforms run as bundles on an SDK harness.
    Sdk(SdkStage),
}

impl StageKind {
    /// Whether the stage only passes elements on (a Flatten, a Reshuffle):
    /// it holds none, so a job never waits at it.
    pub fn passes_through(&self) -> bool {
        matches!(self, StageKind::Flatten { .. } | StageKind::Reshuffle { .. })
    }
}

/// A fused stage executed by an SDK harness.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct SdkStage {
    /// Environment the stage's transforms run in.
    pub environment_id: String,
    /// The main input, read through the `beam:runner:source:v1` transform `input_transform_id`.
    pub input: PCollectionIndex,
    pub input_transform_id: String,
    /// Side inputs served over the State API.
    pub side_inputs: Vec<SideInput>,
    /// Outputs, each written by the `beam:runner:sink:v1` transform at the same position of `output_transform_ids`.
    pub outputs: Vec<PCollectionIndex>,
    pub output_transform_ids: Vec<String>,
    /// Transform ids whose residuals (SDF checkpoints / splits) re-enter this stage's input.
    pub residual_transform_ids: Vec<String>,
    /// True when the stage's first transform is a stateful DoFn (user state
    /// or timers): its input is routed by key and one bundle runs at a time.
    pub stateful: bool,
    /// True when that stateful DoFn requires its input sorted by timestamp
    /// (`ParDoPayload.requires_time_sorted_input`, requirement
    /// `beam:requirement:pardo:time_sorted_input:v1`): the runner holds
    /// each element until the input watermark passes its timestamp plus
    /// the allowed lateness, then gives them in timestamp order.
    pub time_sorted: bool,
    /// Timer families of the stage's transforms (`ParDoPayload.timer_family_specs`).
    pub timer_families: Vec<TimerFamily>,
    /// True when the stage input feeds an SDF process transform
    /// (`beam:transform:sdf_process_sized_element_and_restrictions:v1`), so a
    /// running bundle can be split inside its element (dynamic splitting).
    pub splittable: bool,
    /// For a splittable stage of a job not drained from the start: the id of
    /// a second `ProcessBundleDescriptor` of the stage in which
    /// `beam:transform:sdf_truncate_sized_restrictions:v1` runs before the
    /// process transform (same input and outputs). Once the job is drained,
    /// the residuals of its running restrictions go through it, so the
    /// DoFn's `truncate_restriction` decides what is left to process.
    pub drain_descriptor_id: Option<String>,
    /// For a stateful stage whose DoFn has an `@OnWindowExpiration` callback
    /// (`ParDoPayload.on_window_expiration_timer_family_spec`, requirement
    /// `beam:requirement:pardo:on_window_expiration:v1`): the index in
    /// `timer_families` of the family the runner fires, once per key and
    /// window of the stage's input, when the window expires (its max
    /// timestamp plus the allowed lateness), before its state goes.
    pub window_expiration_family: Option<usize>,
}

/// A timer family of a stateful DoFn: timers travel on the data plane as
/// `Elements.Timers` coded `beam:coder:timer:v1` with these key and window coders.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct TimerFamily {
    pub transform_id: String,
    pub family_id: String,
    pub key_coder: Coder,
    pub window_coder: Coder,
    /// Event-time timers fire with the watermark; processing-time timers fire
    /// as soon as the stage's input is done (batch).
    pub event_time: bool,
    /// Its timers go to the SDK with the hold (output) timestamp as their
    /// fire timestamp: Beam Python stamps a timer callback's output with the
    /// fire timestamp, where Java and Go use the hold, so a Python
    /// processing-time timer's output would carry the wall clock instead of
    /// its element's event time (Prism rewrites it the same way).
    pub fire_at_hold: bool,
}

/// How a side input is read (`beam:side_input:iterable:v1` / `beam:side_input:multimap:v1`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum SideInputKind {
    Iterable,
    Multimap,
}

/// A side input of a transform in an SDK stage.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct SideInput {
    /// The consuming transform id and its local input name, as in `StateKey`s.
    pub transform_id: String,
    pub local_name: String,
    pub pcollection: PCollectionIndex,
    pub kind: SideInputKind,
    /// The side input PCollection's WindowFn, for deciding in streaming
    /// when the side window a main-input window maps to is ready.
    pub window_fn: SideWindowFn,
}

/// A side input's WindowFn as far as the runner can map main-input windows
/// onto it. Beam's default window mapping (Java `WindowFn.getDefaultWindowMappingFn`,
/// Python `sideinputs.default_window_mapping_fn`) maps a main-input window
/// to the side window that contains its max timestamp (for sliding windows
/// the earliest-starting such window); the global WindowFn maps every window
/// to the global window. Durations and offsets are milliseconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum SideWindowFn {
    /// `beam:window_fn:global_windows:v1`
    Global,
    /// `beam:window_fn:fixed_windows:v1`
    Fixed { size_ms: i64, offset_ms: i64 },
    /// `beam:window_fn:sliding_windows:v1`
    Sliding {
        size_ms: i64,
        period_ms: i64,
        offset_ms: i64,
    },
    /// Any other WindowFn (sessions, custom): its side windows are opaque.
    Other,
}

impl SideWindowFn {
    /// Whether its windows end before the global window does (fixed and
    /// sliding), so a streaming runner may let expired ones go.
    pub fn expires(self) -> bool {
        matches!(self, SideWindowFn::Fixed { .. } | SideWindowFn::Sliding { .. })
    }
}

impl StageGraph {
    /// The stages that read `pcollection` as a main input, in order.
    pub fn consumers(&self, pcollection: PCollectionIndex) -> Vec<usize> {
        self.stages
            .iter()
            .enumerate()
            .filter(|(_, s)| s.main_inputs().contains(&pcollection))
            .map(|(i, _)| i)
            .collect()
    }

    /// True when a side input of some SDK stage reads `pcollection` or a
    /// PCollection computed from it (through any stages downstream).
    pub fn feeds_side_input(&self, pcollection: PCollectionIndex) -> bool {
        let sides: std::collections::HashSet<PCollectionIndex> = self
            .stages
            .iter()
            .filter_map(|s| match &s.kind {
                StageKind::Sdk(sdk) => Some(sdk.side_inputs.iter().map(|si| si.pcollection)),
                _ => None,
            })
            .flatten()
            .collect();
        let mut seen = vec![false; self.pcollections.len()];
        let mut todo = vec![pcollection];
        while let Some(pc) = todo.pop() {
            if sides.contains(&pc) {
                return true;
            }
            if std::mem::replace(&mut seen[pc], true) {
                continue;
            }
            for stage in self.consumers(pc) {
                todo.extend(self.stages[stage].outputs());
            }
        }
        false
    }

    /// Whether the GroupByKey from `input` to `output` cuts panes by its
    /// trigger as data arrives, instead of one pane per window once its
    /// input is done: always in streaming; in batch when the trigger uses
    /// processing time (Java's DirectRunner fires those on the wall clock,
    /// early panes while upstream work holds the watermark), unless its
    /// panes feed a side input (read once complete in batch, as one firing
    /// per window).
    pub fn runs_triggers(&self, input: PCollectionIndex, output: PCollectionIndex) -> bool {
        self.streaming
            || (self.pcollections[input].windowing.trigger.uses_processing_time()
                && !self.feeds_side_input(output))
    }
}

impl Stage {
    /// Main inputs of the stage (not side inputs).
    pub fn main_inputs(&self) -> Vec<PCollectionIndex> {
        match &self.kind {
            StageKind::Impulse { .. } | StageKind::TestStream { .. } => vec![],
            StageKind::GroupByKey { input, .. } | StageKind::Reshuffle { input, .. } => {
                vec![*input]
            }
            StageKind::Flatten { inputs, .. } => inputs.clone(),
            StageKind::Sdk(s) => vec![s.input],
        }
    }

    /// Outputs of the stage.
    pub fn outputs(&self) -> Vec<PCollectionIndex> {
        match &self.kind {
            StageKind::Impulse { output }
            | StageKind::GroupByKey { output, .. }
            | StageKind::Reshuffle { output, .. }
            | StageKind::Flatten { output, .. } => vec![*output],
            StageKind::TestStream { outputs, .. } => outputs.clone(),
            StageKind::Sdk(s) => s.outputs.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn processing_time_is_found_anywhere_in_the_trigger_tree() {
        let apt = Trigger::AfterProcessingTime { delay_ms: 1, align: None };
        assert!(apt.uses_processing_time());
        assert!(Trigger::AfterSynchronizedProcessingTime.uses_processing_time());
        assert!(Trigger::Repeatedly(Box::new(apt.clone())).uses_processing_time());
        assert!(Trigger::AfterEndOfWindow { early: Some(Box::new(apt.clone())), late: None }
            .uses_processing_time());
        assert!(Trigger::AfterEndOfWindow { early: None, late: Some(Box::new(apt.clone())) }
            .uses_processing_time());
        assert!(Trigger::OrFinally {
            main: Box::new(Trigger::ElementCount(2)),
            finally: Box::new(apt.clone())
        }
        .uses_processing_time());
        assert!(Trigger::AfterAny(vec![Trigger::Never, apt]).uses_processing_time());
    }

    /// Impulse -> pc0 -> GroupByKey -> pc1 -> SDK stage -> pc2, and an SDK
    /// stage on pc3 (from a second Impulse) reading `side` as a side input.
    fn graph(trigger: Trigger, side: Option<PCollectionIndex>) -> StageGraph {
        let pc = |id: &str, trigger: Trigger| PCollectionInfo {
            id: id.into(),
            value_coder: Coder::Bytes,
            window_coder: Coder::GlobalWindow,
            windowing: Windowing { trigger, ..Windowing::global() },
        };
        let sdk = |input, outputs: Vec<PCollectionIndex>, sides: Vec<PCollectionIndex>| {
            StageKind::Sdk(SdkStage {
                environment_id: "env".into(),
                input,
                input_transform_id: "in".into(),
                side_inputs: sides
                    .into_iter()
                    .map(|pcollection| SideInput {
                        transform_id: "t".into(),
                        local_name: "side".into(),
                        pcollection,
                        kind: SideInputKind::Iterable,
                        window_fn: SideWindowFn::Global,
                    })
                    .collect(),
                output_transform_ids: outputs.iter().map(|o| format!("out{o}")).collect(),
                outputs,
                residual_transform_ids: vec![],
                stateful: false,
                time_sorted: false,
                timer_families: vec![],
                splittable: false,
                drain_descriptor_id: None,
                window_expiration_family: None,
            })
        };
        let stage = |id: &str, kind| Stage { id: id.into(), name: id.into(), kind };
        StageGraph {
            pcollections: vec![
                pc("pc0", trigger),
                pc("pc1", Trigger::Default),
                pc("pc2", Trigger::Default),
                pc("pc3", Trigger::Default),
                pc("pc4", Trigger::Default),
            ],
            stages: vec![
                stage("impulse", StageKind::Impulse { output: 0 }),
                stage("gbk", StageKind::GroupByKey { input: 0, output: 1, merge_windows: None }),
                stage("after", sdk(1, vec![2], vec![])),
                stage("impulse2", StageKind::Impulse { output: 3 }),
                stage("main", sdk(3, vec![4], side.into_iter().collect())),
            ],
            streaming: false,
        }
    }

    #[test]
    fn a_side_input_downstream_is_found_through_stages() {
        assert!(graph(Trigger::Default, Some(2)).feeds_side_input(1));
        assert!(graph(Trigger::Default, Some(1)).feeds_side_input(1));
        assert!(graph(Trigger::Default, Some(1)).feeds_side_input(0));
        assert!(!graph(Trigger::Default, None).feeds_side_input(1));
        // pc3 is the main input of the side input's reader, not upstream of it.
        assert!(!graph(Trigger::Default, Some(2)).feeds_side_input(3));
    }

    #[test]
    fn batch_runs_processing_time_triggers_unless_they_feed_a_side_input() {
        let apt = Trigger::Repeatedly(Box::new(Trigger::AfterProcessingTime { delay_ms: 1, align: None }));
        assert!(graph(apt.clone(), None).runs_triggers(0, 1));
        assert!(!graph(apt.clone(), Some(2)).runs_triggers(0, 1));
        assert!(!graph(Trigger::ElementCount(2), None).runs_triggers(0, 1));
        let mut streaming = graph(Trigger::ElementCount(2), Some(2));
        streaming.streaming = true;
        assert!(streaming.runs_triggers(0, 1));
    }

    #[test]
    fn data_and_watermark_triggers_do_not_use_processing_time() {
        for t in [
            Trigger::Default,
            Trigger::ElementCount(3),
            Trigger::Always,
            Trigger::Never,
            Trigger::Repeatedly(Box::new(Trigger::ElementCount(1))),
            Trigger::AfterEndOfWindow {
                early: Some(Box::new(Trigger::ElementCount(1))),
                late: Some(Box::new(Trigger::Never)),
            },
            Trigger::AfterAll(vec![Trigger::ElementCount(1), Trigger::Default]),
            Trigger::AfterEach(vec![]),
        ] {
            assert!(!t.uses_processing_time(), "{t:?}");
        }
    }
}
