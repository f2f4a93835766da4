//! The one place that runs a job on timely: builds the stage graph as a
//! timely dataflow per worker (`build`, from the operators in
//! [`crate::operators`]), steps it until every stage is done, and watches
//! for a stuck job.
//!
//! Timely times carry Beam event times (see [`crate::time`]). In batch all
//! data sits at the minimum time, so a GroupByKey fires when its input
//! frontier empties (the watermark reaches +infinity).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use timely::dataflow::operators::vec::{Broadcast, Map, Partition, ToStream};
use timely::dataflow::operators::{Concatenate, Probe};
use timely::dataflow::{ProbeHandle, Scope};
use weir_graph::{StageGraph, StageKind};
use weir_model::Timestamp;

use crate::bundle::BundleProcessor;
use crate::operators::flatten::flatten;
use crate::operators::group_by_key::group_by_key;
use crate::operators::impulse::impulse;
use crate::operators::reshuffle::reshuffle;
use crate::operators::observed;
use crate::operators::sdk_stage::sdk_stage;
use crate::operators::test_stream::test_stream;
use crate::operators::{Element, Elements, TaggedElements};
use crate::time::{wall_millis, watermark_of, Clock, Time};
use crate::{EngineConfig, EngineError, Result};

/// Shared by every worker of one job.
#[derive(Clone)]
pub(crate) struct JobContext {
    pub(crate) graph: Arc<StageGraph>,
    pub(crate) processor: Arc<dyn BundleProcessor>,
    pub(crate) config: EngineConfig,
    pub(crate) failure: Arc<Mutex<Option<EngineError>>>,
    pub(crate) stop: Arc<AtomicBool>,
    pub(crate) clock: Clock,
    /// What each stage is doing, per worker: for stuck-job reports and
    /// for readers of [`EngineConfig::progress`].
    pub(crate) status: Progress,
    /// Bumped whenever any stage makes progress.
    pub(crate) activity: Arc<std::sync::atomic::AtomicU64>,
    /// Timely workers in this process: a worker's global index (over every
    /// process of a cluster job) modulo this is its slot in `status`.
    pub(crate) local_workers: usize,
    /// The job's user state in this process, over the stores of every
    /// stateful stage operator: live cells, their bytes and the budget.
    pub(crate) user_state_usage: Arc<crate::user_state::StateUsage>,
    /// Batch stages' side inputs, built once per process and shared by its
    /// workers.
    pub(crate) shared_sides: Arc<crate::operators::sdk_stage::SharedSides>,
}

/// A stage's state as last seen by its operator, on one timely worker or
/// (from [`Progress::stages`]) merged over all of them.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct StageStatus {
    /// Its input watermark; `None` once its input is done (or before its
    /// operator first reported: see [`StageProgress::reported`]).
    pub watermark: Option<Timestamp>,
    /// Bundles at SDK harnesses.
    pub in_flight: usize,
    /// Elements waiting for a bundle.
    pub pending: usize,
    /// Residuals waiting out a resume delay.
    pub delayed: usize,
    /// Pending timers.
    pub timers: usize,
    /// Keys a GroupByKey still buffers windows for.
    pub windows: usize,
    /// The stage waits for its side inputs.
    pub waiting_for_side_inputs: bool,
    /// Main-input elements held back until their side windows are ready (streaming).
    pub held_back: usize,
}

/// What a stage has done so far, summed over timely workers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct StageCounts {
    /// Main-input elements it took (sent to SDK harnesses, or buffered by a GroupByKey).
    pub elements_in: u64,
    /// Elements it emitted, over all its outputs (a GroupByKey: one per pane).
    pub elements_out: u64,
    /// Bundles that completed (SDK stages).
    pub bundles: u64,
}

/// One stage of a running (or finished) job, merged over timely workers.
/// Serializable: cluster workers send theirs to the coordinator.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct StageProgress {
    /// What its operator last reported.
    pub status: StageStatus,
    /// What it did so far.
    pub counts: StageCounts,
    /// Its output watermark (the least time its output may still carry);
    /// `None` once its output is done.
    pub output_watermark: Option<Timestamp>,
    /// Whether its operator has reported at all (before that, the
    /// watermarks say nothing).
    pub reported: bool,
}

#[derive(Default)]
struct ProgressCells {
    status: Vec<Vec<StageStatus>>,
    counts: Vec<StageCounts>,
    reported: Vec<bool>,
    /// Output watermark per stage and worker (`None`: done); starts at MIN.
    output: Vec<Vec<Option<Timestamp>>>,
}

/// Live progress of one job's stages: written by the engine while the job
/// runs, read by anyone holding a clone (the web UI, `/metrics`). Stage `i`
/// is `StageGraph::stages[i]`. Empty until [`run_job`] starts.
#[derive(Clone, Default)]
pub struct Progress(Arc<Mutex<ProgressCells>>, Arc<std::sync::atomic::AtomicU64>);

impl std::fmt::Debug for Progress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Progress")
    }
}

impl Progress {
    fn cells(&self) -> std::sync::MutexGuard<'_, ProgressCells> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Sizes the cells for `stages` stages on `workers` workers.
    fn start(&self, stages: usize, workers: usize) {
        let mut c = self.cells();
        c.status = vec![vec![StageStatus::default(); workers]; stages];
        c.counts = vec![StageCounts::default(); stages];
        c.reported = vec![false; stages];
        c.output = vec![vec![Some(Timestamp::MIN); workers]; stages];
    }

    /// Bytes of encoded elements this process's timely workers sent to
    /// workers in other processes (cluster mode; 0 otherwise).
    pub fn exchanged_bytes(&self) -> u64 {
        self.1.load(Ordering::Relaxed)
    }

    /// Counts `bytes` sent to another process.
    pub(crate) fn exchanged(&self, bytes: u64) {
        self.1.fetch_add(bytes, Ordering::Relaxed);
    }

    /// Publishes stages whose progress was measured elsewhere: `parts` holds
    /// one [`Progress::stages`] per process of a cluster job (stage `i` of
    /// each is the same stage), read back merged as if from local workers.
    pub fn publish_parts(&self, parts: &[Vec<StageProgress>]) {
        let stages = parts.iter().map(Vec::len).max().unwrap_or(0);
        let mut c = self.cells();
        c.status = vec![vec![StageStatus::default(); parts.len()]; stages];
        c.output = vec![vec![None; parts.len()]; stages];
        c.counts = vec![StageCounts::default(); stages];
        c.reported = vec![false; stages];
        for (w, part) in parts.iter().enumerate() {
            for (i, p) in part.iter().enumerate() {
                c.status[i][w] = p.status.clone();
                c.output[i][w] = p.output_watermark;
                c.reported[i] |= p.reported;
                let n = &mut c.counts[i];
                n.elements_in += p.counts.elements_in;
                n.elements_out += p.counts.elements_out;
                n.bundles += p.counts.bundles;
            }
        }
    }

    /// Every stage, merged over workers: counts summed, the least watermarks.
    pub fn stages(&self) -> Vec<StageProgress> {
        let c = self.cells();
        c.status
            .iter()
            .zip(&c.output)
            .zip(&c.reported)
            .zip(&c.counts)
            .map(|(((workers, outputs), &reported), &counts)| StageProgress {
                status: workers
                    .iter()
                    .fold(StageStatus::default(), |a, w| a.merged(w)),
                counts,
                output_watermark: least(outputs),
                reported,
            })
            .collect()
    }
}

/// The least of per-worker watermarks, `None` (done) only when all are done.
fn least(watermarks: &[Option<Timestamp>]) -> Option<Timestamp> {
    watermarks.iter().flatten().min().copied()
}

impl StageStatus {
    /// Whether the stage still has work (bundles at harnesses, elements
    /// waiting for one, elements held back) or an input not done: where a
    /// slow or stuck job may wait.
    pub fn unfinished(&self) -> bool {
        self.watermark.is_some() || self.in_flight > 0 || self.pending > 0 || self.held_back > 0
    }

    /// This status and `other`'s (another worker's of the same stage) as
    /// one: counts summed, the least watermark (a done input, `None`, counts
    /// only when both are done), waiting for side inputs if either is.
    fn merged(mut self, other: &StageStatus) -> StageStatus {
        self.watermark = match (self.watermark, other.watermark) {
            (Some(x), Some(y)) => Some(x.min(y)),
            (x, y) => x.or(y),
        };
        self.in_flight += other.in_flight;
        self.pending += other.pending;
        self.delayed += other.delayed;
        self.timers += other.timers;
        self.windows += other.windows;
        self.waiting_for_side_inputs |= other.waiting_for_side_inputs;
        self.held_back += other.held_back;
        self
    }
}

impl JobContext {
    /// Counts `bytes` as exchanged when timely worker `from` routes an
    /// element by `hash` over `peers` workers and the worker timely picks
    /// (`hash & (peers - 1)` for a power of two, else `hash % peers`, as its
    /// `Exchange` pact does) runs in another process. No-op outside cluster mode.
    pub(crate) fn count_exchange(&self, from: usize, hash: u64, peers: u64, bytes: usize) {
        if self.config.cluster.is_none() || peers == 0 {
            return;
        }
        let target = if peers.is_power_of_two() { hash & (peers - 1) } else { hash % peers };
        if from / self.local_workers != target as usize / self.local_workers {
            self.status.exchanged(bytes as u64);
        }
    }

    /// Records what stage `stage` does on timely worker `worker` now, and
    /// counts a change as progress.
    pub(crate) fn report(&self, stage: usize, worker: usize, status: StageStatus) {
        let mut all = self.status.cells();
        all.reported[stage] = true;
        let slot = &mut all.status[stage][worker % self.local_workers];
        if *slot != status {
            *slot = status;
            self.activity.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Adds to stage `stage`'s counts.
    pub(crate) fn count(&self, stage: usize, elements_in: usize, elements_out: usize, bundles: u64) {
        let mut all = self.status.cells();
        if let Some(c) = all.counts.get_mut(stage) {
            c.elements_in += elements_in as u64;
            c.elements_out += elements_out as u64;
            c.bundles += bundles;
        }
    }

    /// Records the output watermarks of worker `worker`'s stages, read off
    /// their probes (`None`: that output is done).
    fn report_outputs(&self, worker: usize, probes: &[ProbeHandle<Time>]) {
        let mut all = self.status.cells();
        for (stage, probe) in probes.iter().enumerate() {
            all.output[stage][worker % self.local_workers] = probe.with_frontier(|f| {
                (!f.is_empty()).then(|| watermark_of(f.as_ref()))
            });
        }
    }

    /// A notice describing where a job that made no progress is waiting:
    /// the first stage (in pipeline order) whose input is not done.
    pub(crate) fn stuck_notice(&self, idle: Duration) -> String {
        // One line per stage: counts summed over workers, the least watermark.
        let all: Vec<StageStatus> = self.status.stages().into_iter().map(|s| s.status).collect();
        let waiting: Vec<String> = all
            .iter()
            .enumerate()
            .filter(|(i, st)| {
                // A Flatten or Reshuffle holds nothing: it is never where a job waits.
                !self.graph.stages[*i].kind.passes_through() && st.unfinished()
            })
            .take(3)
            .map(|(i, st)| {
                let stage = &self.graph.stages[i];
                let wm = match st.watermark {
                    None => "+inf (input done)".to_string(),
                    Some(w) if w <= Timestamp::MIN => "-inf (Beam's MIN)".to_string(),
                    Some(w) => format!("{} ms", w.millis()),
                };
                let mut what = vec![format!("input watermark {wm}")];
                if st.waiting_for_side_inputs {
                    what.push("waiting for its side inputs".into());
                }
                for (n, label) in [
                    (st.in_flight, "bundle(s) at SDK harnesses"),
                    (st.pending, "element(s) waiting for a bundle"),
                    (
                        st.held_back,
                        "element(s) held back until their side windows are ready",
                    ),
                    (st.delayed, "residual(s) waiting out a resume delay"),
                    (st.timers, "timer(s) pending"),
                    (st.windows, "key(s) with buffered windows"),
                ] {
                    if n > 0 {
                        what.push(format!("{n} {label}"));
                    }
                }
                format!("stage {} ({}): {}", stage.id, stage.name, what.join(", "))
            })
            .collect();
        format!(
            "the job has made no progress for {} s; it waits at {}",
            idle.as_secs(),
            if waiting.is_empty() {
                "no stage (all inputs done)".to_string()
            } else {
                waiting.join("; ")
            }
        )
    }

    /// Elements waiting for a bundle in all SDK stages, as last reported.
    pub(crate) fn pending_elements(&self) -> usize {
        let all = self.status.cells();
        all.status.iter().flatten().map(|s| s.pending).sum()
    }

    /// Whether the job is held without work to do: some stage holds
    /// main-input elements back for their side inputs, or has pending timers
    /// (whose holds, their output timestamps, hold the watermark), while no
    /// stage has a bundle in flight, elements waiting for one or residuals
    /// waiting out a delay. The job can then only move on with more input
    /// (a TestStream's next event): e.g. Java's `Timer.withOutputTimestamp`
    /// holds a stage's output watermark below the stream's current time
    /// until the timer fires, which may take the stream's later events.
    pub(crate) fn idle_but_held(&self) -> bool {
        let all = self.status.cells();
        let stages = all.status.iter().flatten();
        stages.clone().any(|s| s.held_back > 0 || s.timers > 0)
            && stages
                .clone()
                .all(|s| s.in_flight == 0 && s.pending == 0 && s.delayed == 0)
    }

    pub(crate) fn fail(&self, e: EngineError) {
        let mut f = self.failure.lock().unwrap_or_else(|p| p.into_inner());
        if f.is_none() {
            *f = Some(e);
        }
        self.stop.store(true, Ordering::SeqCst);
    }
    pub(crate) fn draining(&self) -> bool {
        self.config.drain.load(Ordering::SeqCst)
    }
    pub(crate) fn stopped(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }
}

/// How often each worker copies its stages' output watermarks into [`Progress`].
const OUTPUT_WATERMARKS_EVERY: Duration = Duration::from_millis(200);

/// Runs `graph` to completion on `config.workers` timely worker threads,
/// executing SDK stages through `processor`. Blocks the calling thread.
///
/// # Errors
/// The first stage failure ([`EngineError::BundleFailed`] carries the SDK's
/// message), [`EngineError::Cancelled`] when `cancel` is set.
pub fn run_job(
    graph: Arc<StageGraph>,
    processor: Arc<dyn BundleProcessor>,
    config: EngineConfig,
    cancel: Arc<AtomicBool>,
) -> Result<()> {
    // Streaming jobs run on one timely worker: elements then reach each
    // GroupByKey in the order their producers emitted them, so count- and
    // processing-time triggers cut panes the way Beam's other runners do
    // (Prism, the Python DirectRunner). SDK harnesses still run bundles of
    // different stages in parallel.
    let workers = if graph.streaming {
        1
    } else {
        config.workers.max(1)
    };
    let stage_count = graph.stages.len();
    let graph_has_test_stream = graph
        .stages
        .iter()
        .any(|s| matches!(s.kind, StageKind::TestStream { .. }));
    let ctx = JobContext {
        graph,
        processor,
        config: config.clone(),
        failure: Arc::new(Mutex::new(None)),
        stop: Arc::new(AtomicBool::new(false)),
        status: {
            config.progress.start(stage_count, workers);
            config.progress.clone()
        },
        activity: Arc::default(),
        local_workers: workers,
        user_state_usage: Arc::new(crate::user_state::StateUsage::with_budget(
            config.user_state_budget,
        )),
        shared_sides: Arc::default(),
        clock: if graph_has_test_stream {
            Clock::Test(Arc::new(std::sync::atomic::AtomicI64::new(wall_millis())))
        } else {
            Clock::Wall
        },
    };
    let worker_ctx = ctx.clone();
    let (allocators, comms): (Vec<_>, Box<dyn std::any::Any + Send>) = match &config.cluster {
        None => timely::CommunicationConfig::Process(workers)
            .try_build()
            .map_err(EngineError::Internal)?,
        Some(peers) => {
            use timely::communication::allocator::zero_copy::initialize::initialize_networking_from_sockets;
            use timely::communication::allocator::ProcessBuilder;
            let sockets = crate::peers::connect(peers, PEERS_WITHIN, &cancel).map_err(|e| {
                if cancel.load(Ordering::SeqCst) {
                    EngineError::Cancelled
                } else {
                    EngineError::Internal(e)
                }
            })?;
            let hooks = timely::communication::Hooks::default();
            let local = ProcessBuilder::new_typed_vector(
                workers,
                hooks.refill.clone(),
                hooks.spill.clone(),
            );
            let (builders, guard) =
                initialize_networking_from_sockets(local, sockets, peers.process, workers, hooks)
                    .map_err(|e| EngineError::Internal(format!("timely networking: {e}")))?;
            (
                builders
                    .into_iter()
                    .map(timely::communication::AllocatorBuilder::Tcp)
                    .collect(),
                Box::new(guard),
            )
        }
    };
    let guards = timely::execute::execute_from(
        allocators,
        comms,
        timely::WorkerConfig::default(),
        move |worker| {
            let ctx = worker_ctx.clone();
            let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                run_worker(worker, &ctx, &cancel)
            }));
            if let Err(panic) = caught {
                let text = crate::panic_text(panic.as_ref());
                ctx.fail(EngineError::Internal(format!(
                    "a timely worker panicked: {text}"
                )));
            }
        },
    )
    .map_err(EngineError::Internal)?;
    finish(ctx, guards)
}

/// How long the processes of a cluster attempt get to connect to each
/// other: each first starts its SDK harnesses (an image pull, a pip install,
/// a JVM), so this is long; a lost worker ends the wait sooner, through the
/// coordinator's cancel.
const PEERS_WITHIN: std::time::Duration = std::time::Duration::from_secs(15 * 60);

/// Builds and steps the job's dataflow on one timely worker until it is
/// done or stopped.
fn run_worker(worker: &mut timely::worker::Worker, ctx: &JobContext, cancel: &AtomicBool) {
    let ctx = ctx.clone();
    let probe = ProbeHandle::<Time>::new();
    let peers = worker.peers();
    let index = worker.index();
    let stage_probes =
        worker.dataflow::<Time, _, _>(|scope| build(scope, &ctx, &probe, index, peers));
    let mut outputs_reported = std::time::Instant::now();
    let mut last_activity = (
        ctx.activity.load(Ordering::Relaxed),
        std::time::Instant::now(),
    );
    while !probe.done() {
        if index % ctx.local_workers == 0 {
            // Stuck-job watchdog (one per process): report (once per period) where a
            // job that stopped making progress waits.
            let activity = ctx.activity.load(Ordering::Relaxed);
            if activity != last_activity.0 {
                last_activity = (activity, std::time::Instant::now());
            } else if last_activity.1.elapsed() >= ctx.config.stuck_after {
                ctx.config
                    .notices
                    .send(ctx.stuck_notice(last_activity.1.elapsed()));
                last_activity.1 = std::time::Instant::now();
            }
        }
        if cancel.load(Ordering::SeqCst) {
            ctx.fail(EngineError::Cancelled);
        }
        if ctx.stopped() {
            // A failed or cancelled job may still hold capabilities
            // (bundles that will never complete): drop the dataflow
            // rather than wait for it to drain.
            for id in worker.installed_dataflows() {
                worker.drop_dataflow(id);
            }
            break;
        }
        worker.step_or_park(Some(Duration::from_millis(20)));
        if outputs_reported.elapsed() >= OUTPUT_WATERMARKS_EVERY {
            ctx.report_outputs(index, &stage_probes);
            outputs_reported = std::time::Instant::now();
        }
    }
    ctx.report_outputs(index, &stage_probes);
}

/// Waits for the worker threads of `guards` and returns the job's result.
fn finish(ctx: JobContext, guards: timely::communication::initialize::WorkerGuards<()>) -> Result<()> {
    if ctx.config.cluster.is_some() {
        // Joining would also join timely's network threads, which end only
        // once every other process has ended its part too: a process whose
        // part failed must report that first (its coordinator then cancels
        // the others). So wait for the worker threads alone, and leave the
        // network threads to a thread of their own.
        while !guards.guards().iter().all(|g| g.is_finished()) {
            std::thread::sleep(Duration::from_millis(10));
        }
        // (A worker's panic was caught and recorded as the job's failure
        // by the worker itself.)
        std::thread::spawn(move || {
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| guards.join()));
        });
    } else {
        for r in guards.join() {
            if let Err(panic) = r {
                ctx.fail(EngineError::Internal(format!(
                    "a timely worker panicked: {panic}"
                )));
            }
        }
    }
    let failure = ctx.failure.lock().unwrap_or_else(|p| p.into_inner()).take();
    match failure {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// Builds `ctx.graph` on timely worker `index` (of `_peers`): one stream
/// per PCollection, made stage by stage in topological order; the outputs
/// of GroupByKey and SDK stages are probed by `probe` (the job is done when
/// its frontier empties). Returns one probe per stage on its output (its
/// output watermark).
fn build<'s>(
    scope: Scope<'s, Time>,
    ctx: &JobContext,
    probe: &ProbeHandle<Time>,
    index: usize,
    peers: usize,
) -> Vec<ProbeHandle<Time>> {
    let graph = ctx.graph.clone();
    let stage_probes: Vec<ProbeHandle<Time>> =
        graph.stages.iter().map(|_| ProbeHandle::new()).collect();
    let mut streams: Vec<Option<Elements<'s>>> = vec![None; graph.pcollections.len()];
    let get = |streams: &Vec<Option<Elements<'s>>>, pc: usize| -> Elements<'s> {
        streams[pc]
            .clone()
            .expect("stages are in topological order")
    };
    for (stage_index, stage) in graph.stages.iter().enumerate() {
        match &stage.kind {
            StageKind::Impulse { output } => {
                let value_coder = &graph.pcollections[*output].value_coder;
                let s = impulse(scope, ctx, stage_index, index, value_coder);
                streams[*output] = Some(s.probe_with(&stage_probes[stage_index]));
            }
            StageKind::TestStream { outputs, events } => {
                let tagged = test_stream(scope, ctx, probe, index, outputs.len(), events)
                    .probe_with(&stage_probes[stage_index]);
                let parts = tagged.partition(outputs.len().max(1) as u64, |(port, e)| {
                    (u64::from(port), e)
                });
                for (port, s) in parts.into_iter().enumerate() {
                    if let Some(&pc) = outputs.get(port) {
                        streams[pc] = Some(s);
                    }
                }
            }
            StageKind::Flatten { inputs, output } => {
                let s = flatten(scope, inputs.iter().map(|&i| get(&streams, i)).collect());
                let s = observed(s, ctx, stage_index);
                streams[*output] = Some(s.probe_with(&stage_probes[stage_index]));
            }
            StageKind::Reshuffle { input, output } => {
                let s = reshuffle(get(&streams, *input), ctx, index, peers);
                let s = observed(s, ctx, stage_index);
                streams[*output] = Some(s.probe_with(&stage_probes[stage_index]));
            }
            StageKind::GroupByKey { input, output, .. } => {
                let s = group_by_key(get(&streams, *input), ctx, stage_index, *input, *output);
                let s = s.probe_with(probe).probe_with(&stage_probes[stage_index]);
                streams[*output] = Some(s);
            }
            StageKind::Sdk(sdk) => {
                let main = get(&streams, sdk.input);
                let sides: Vec<TaggedElements<'s>> = sdk
                    .side_inputs
                    .iter()
                    .enumerate()
                    .map(|(i, si)| {
                        let ctx = ctx.clone();
                        // Broadcast: every element goes to each other process's workers.
                        let remote = if ctx.config.cluster.is_some() {
                            (peers - ctx.local_workers) as u64
                        } else {
                            0
                        };
                        get(&streams, si.pcollection).map(move |e| {
                            if remote > 0 {
                                ctx.status.exchanged(e.len() as u64 * remote);
                            }
                            (i as u32, e)
                        })
                    })
                    .collect();
                let sides = if sides.is_empty() {
                    Vec::<(u32, Element)>::new().to_stream(scope)
                } else {
                    scope.concatenate(sides).broadcast()
                };
                let tagged = sdk_stage(scope, main, sides, ctx, stage_index, sdk)
                    .probe_with(probe)
                    .probe_with(&stage_probes[stage_index]);
                let parts = tagged.partition(sdk.outputs.len().max(1) as u64, |(port, e)| {
                    (u64::from(port), e)
                });
                for (port, s) in parts.into_iter().enumerate() {
                    if let Some(&pc) = sdk.outputs.get(port) {
                        streams[pc] = Some(s);
                    }
                }
            }
        }
    }
    stage_probes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merged_statuses_sum_counts_and_keep_the_least_watermark() {
        let a = StageStatus {
            watermark: Some(Timestamp(20)),
            in_flight: 1,
            pending: 10,
            held_back: 2,
            ..StageStatus::default()
        };
        let b = StageStatus {
            watermark: Some(Timestamp(5)),
            in_flight: 2,
            timers: 3,
            waiting_for_side_inputs: true,
            ..StageStatus::default()
        };
        let m = a.clone().merged(&b);
        assert_eq!(
            m,
            StageStatus {
                watermark: Some(Timestamp(5)),
                in_flight: 3,
                pending: 10,
                delayed: 0,
                timers: 3,
                windows: 0,
                waiting_for_side_inputs: true,
                held_back: 2,
            }
        );
    }

    #[test]
    fn published_parts_read_back_merged_over_processes() {
        let stage = |wm: Option<i64>, out: Option<i64>, n: u64| StageProgress {
            status: StageStatus {
                watermark: wm.map(Timestamp),
                in_flight: 1,
                ..StageStatus::default()
            },
            counts: StageCounts { elements_in: n, elements_out: 2 * n, bundles: 1 },
            output_watermark: out.map(Timestamp),
            reported: true,
        };
        let p = Progress::default();
        p.publish_parts(&[
            vec![stage(Some(10), Some(5), 3), stage(None, None, 1)],
            vec![stage(Some(7), Some(9), 4), stage(Some(2), Some(1), 1)],
        ]);
        let got = p.stages();
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].status.watermark, Some(Timestamp(7)));
        assert_eq!(got[0].status.in_flight, 2);
        assert_eq!(got[0].output_watermark, Some(Timestamp(5)));
        assert_eq!((got[0].counts.elements_in, got[0].counts.elements_out, got[0].counts.bundles), (7, 14, 2));
        // A process that is done does not hide the other's watermark.
        assert_eq!(got[1].status.watermark, Some(Timestamp(2)));
        assert_eq!(got[1].output_watermark, Some(Timestamp(1)));
    }

    #[test]
    fn a_done_worker_does_not_hide_another_workers_watermark() {
        let done = StageStatus::default();
        let at = StageStatus {
            watermark: Some(Timestamp(7)),
            ..StageStatus::default()
        };
        assert_eq!(done.clone().merged(&at).watermark, Some(Timestamp(7)));
        assert_eq!(at.merged(&done).watermark, Some(Timestamp(7)));
        assert_eq!(done.clone().merged(&done).watermark, None);
    }
}
