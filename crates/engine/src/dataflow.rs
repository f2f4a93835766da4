//! The one module that speaks timely: builds the stage graph as a timely
//! dataflow per worker and steps it until every stage is done.
//!
//! A timely time is a Beam event time with a sequence number below it
//! ([`Time`]): `(Timestamp::to_timely(event_time) << 64) | sequence`. The
//! event-time part of an input frontier is the Beam input watermark; the
//! sequence lets a TestStream wait for the pipeline to catch up with each of
//! its events without moving the watermark. In batch all data sits at the
//! minimum time, so a GroupByKey fires when its input frontier empties (the
//! watermark reaches +infinity).

use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use timely::dataflow::channels::pact::{Exchange, Pipeline};
use timely::dataflow::operators::vec::{Broadcast, Map, Partition, ToStream};
use timely::dataflow::operators::{Capability, Concatenate, Operator, Probe};
use timely::dataflow::{ProbeHandle, Scope, StreamVec};
use weir_model::Timestamp;
use weir_graph::{SdkStage, StageGraph, StageKind};

use crate::bundle::{BundleProcessor, BundleRequest, BundleResult};
use crate::elements::{impulse_element, split_elements};
use crate::group_by_key::GroupByKeyBuffer;
use crate::merge_windows::{decode_response, encode_request};
use crate::panes::PaneBuffer;
use crate::side_input::{side_ready, Refresh, SideInputSpec, SideInputs, SideProgress};
use crate::timers::TimerStore;
use crate::{EngineConfig, EngineError, Result};

type Element = Vec<u8>;
/// A timely time: Beam event time (high 64 bits, `Timestamp::to_timely`)
/// and a sequence number (low 64 bits).
type Time = u128;
type Elements<'s> = StreamVec<'s, Time, Element>;

/// The first timely time at event time `t`.
fn time_at(t: Timestamp) -> Time {
    (Time::from(t.to_timely())) << 64
}

/// The Beam watermark a frontier stands for: the event time of its least
/// time, or, when it is empty (the input is done), `i64::MAX` ms: past every
/// timestamp, including Beam's MAX and a custom window's unknown end.
fn watermark_of(frontier: &[Time]) -> Timestamp {
    frontier
        .iter()
        .min()
        .map(|t| Timestamp::from_timely((t >> 64) as u64))
        .unwrap_or(Timestamp(i64::MAX))
}

/// Processing time, in milliseconds since the Unix epoch: the wall clock, or
/// a TestStream's clock, which moves only when the TestStream advances it.
#[derive(Clone)]
enum Clock {
    Wall,
    Test(Arc<std::sync::atomic::AtomicI64>),
}

impl Clock {
    fn now(&self) -> i64 {
        match self {
            Clock::Wall => wall_millis(),
            Clock::Test(t) => t.load(Ordering::SeqCst),
        }
    }
    /// How long until processing time `at` on the wall clock (None for a
    /// test clock, which only moves with the TestStream).
    fn wait_until(&self, at: i64) -> Option<Duration> {
        match self {
            Clock::Wall => Some(Duration::from_millis(
                (at - wall_millis()).clamp(1, 3_600_000) as u64,
            )),
            Clock::Test(_) => None,
        }
    }
}

fn wall_millis() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// Shared by every worker of one job.
#[derive(Clone)]
struct JobContext {
    graph: Arc<StageGraph>,
    processor: Arc<dyn BundleProcessor>,
    config: EngineConfig,
    failure: Arc<Mutex<Option<EngineError>>>,
    stop: Arc<AtomicBool>,
    clock: Clock,
    /// What each stage is doing, for stuck-job reports.
    status: Arc<Mutex<Vec<Vec<StageStatus>>>>,
    /// Bumped whenever any stage makes progress.
    activity: Arc<std::sync::atomic::AtomicU64>,
}

/// A stage's state as last seen by its operator (for stuck-job reports).
#[derive(Clone, Debug, Default, PartialEq)]
struct StageStatus {
    /// Its input watermark; `None` once its input is done.
    watermark: Option<Timestamp>,
    /// Bundles at SDK harnesses, elements waiting for a bundle, elements
    /// waiting out a resume delay, pending timers.
    in_flight: usize,
    pending: usize,
    delayed: usize,
    timers: usize,
    /// Keys a GroupByKey still buffers windows for.
    windows: usize,
    /// The stage waits for its side inputs.
    waiting_for_side_inputs: bool,
    /// Main-input elements held back until their side windows are ready (streaming).
    held_back: usize,
}

impl JobContext {
    /// Records what stage `stage` does on timely worker `worker` now, and
    /// counts a change as progress.
    fn report(&self, stage: usize, worker: usize, status: StageStatus) {
        let mut all = self.status.lock().unwrap_or_else(|p| p.into_inner());
        let slot = &mut all[stage][worker];
        if *slot != status {
            *slot = status;
            self.activity.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// A notice describing where a job that made no progress is waiting:
    /// the first stage (in pipeline order) whose input is not done.
    fn stuck_notice(&self, idle: Duration) -> String {
        let per_worker = self.status.lock().unwrap_or_else(|p| p.into_inner());
        // One line per stage: counts summed over workers, the least watermark.
        let all: Vec<StageStatus> = per_worker
            .iter()
            .map(|workers| {
                workers.iter().fold(StageStatus::default(), |mut a, w| {
                    a.watermark = match (a.watermark, w.watermark) {
                        (Some(x), Some(y)) => Some(x.min(y)),
                        (x, y) => x.or(y),
                    };
                    a.in_flight += w.in_flight;
                    a.pending += w.pending;
                    a.delayed += w.delayed;
                    a.timers += w.timers;
                    a.windows += w.windows;
                    a.waiting_for_side_inputs |= w.waiting_for_side_inputs;
                    a.held_back += w.held_back;
                    a
                })
            })
            .collect();
        let waiting: Vec<String> = all
            .iter()
            .enumerate()
            .filter(|(_, st)| {
                st.watermark.is_some() || st.in_flight > 0 || st.pending > 0 || st.held_back > 0
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
    fn pending_elements(&self) -> usize {
        let all = self.status.lock().unwrap_or_else(|p| p.into_inner());
        all.iter().flatten().map(|s| s.pending).sum()
    }

    /// Whether the job is held without work to do: some stage holds
    /// main-input elements back for their side inputs, or has pending timers
    /// (whose holds, their output timestamps, hold the watermark), while no
    /// stage has a bundle in flight, elements waiting for one or residuals
    /// waiting out a delay. The job can then only move on with more input
    /// (a TestStream's next event): e.g. Java's `Timer.withOutputTimestamp`
    /// holds a stage's output watermark below the stream's current time
    /// until the timer fires, which may take the stream's later events.
    fn idle_but_held(&self) -> bool {
        let all = self.status.lock().unwrap_or_else(|p| p.into_inner());
        let stages = all.iter().flatten();
        stages.clone().any(|s| s.held_back > 0 || s.timers > 0)
            && stages
                .clone()
                .all(|s| s.in_flight == 0 && s.pending == 0 && s.delayed == 0)
    }

    fn fail(&self, e: EngineError) {
        let mut f = self.failure.lock().unwrap_or_else(|p| p.into_inner());
        if f.is_none() {
            *f = Some(e);
        }
        self.stop.store(true, Ordering::SeqCst);
    }
    fn draining(&self) -> bool {
        self.config.drain.load(Ordering::SeqCst)
    }
    fn stopped(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }
}

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
        status: Arc::new(Mutex::new(vec![
            vec![StageStatus::default(); workers];
            stage_count
        ])),
        activity: Arc::default(),
        clock: if graph_has_test_stream {
            Clock::Test(Arc::new(std::sync::atomic::AtomicI64::new(wall_millis())))
        } else {
            Clock::Wall
        },
    };
    let worker_ctx = ctx.clone();
    let guards = timely::execute(timely::Config::process(workers), move |worker| {
        let ctx = worker_ctx.clone();
        let probe = ProbeHandle::<Time>::new();
        let peers = worker.peers();
        let index = worker.index();
        worker.dataflow::<Time, _, _>(|scope| build(scope, &ctx, &probe, index, peers));
        let mut last_activity = (
            ctx.activity.load(Ordering::Relaxed),
            std::time::Instant::now(),
        );
        while !probe.done() {
            if index == 0 {
                // Stuck-job watchdog: report (once per period) where a
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
        }
    })
    .map_err(EngineError::Internal)?;
    for r in guards.join() {
        if let Err(panic) = r {
            ctx.fail(EngineError::Internal(format!(
                "a timely worker panicked: {panic}"
            )));
        }
    }
    let failure = ctx.failure.lock().unwrap_or_else(|p| p.into_inner()).take();
    match failure {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// A printable form of an encoded key: a length-prefixed UTF-8 string as
/// text, anything else as hex; at most 100 characters.
fn describe_key(key: &[u8]) -> String {
    let text = weir_model::varint::decode_varint(key)
        .ok()
        .filter(|(len, used)| *len as usize + used == key.len())
        .and_then(|(_, used)| std::str::from_utf8(&key[used..]).ok())
        .filter(|s| s.chars().all(|c| !c.is_control()))
        .map(|s| format!("{s:?}"))
        .unwrap_or_else(|| key.iter().map(|b| format!("{b:02x}")).collect());
    text.chars().take(100).collect()
}

fn build<'s>(
    scope: Scope<'s, Time>,
    ctx: &JobContext,
    probe: &ProbeHandle<Time>,
    index: usize,
    _peers: usize,
) {
    let graph = ctx.graph.clone();
    let mut streams: Vec<Option<Elements<'s>>> = vec![None; graph.pcollections.len()];
    let get = |streams: &Vec<Option<Elements<'s>>>, pc: usize| -> Elements<'s> {
        streams[pc]
            .clone()
            .expect("stages are in topological order")
    };
    for (stage_index, stage) in graph.stages.iter().enumerate() {
        match &stage.kind {
            StageKind::Impulse { output } => {
                let data = if index == 0 {
                    vec![impulse_element(&graph.pcollections[*output].value_coder)]
                } else {
                    vec![]
                };
                streams[*output] = Some(data.to_stream(scope));
            }
            StageKind::TestStream { outputs, events } => {
                let tagged = test_stream(scope, ctx, probe, index, outputs.len(), events);
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
                let s =
                    scope.concatenate(inputs.iter().map(|&i| get(&streams, i)).collect::<Vec<_>>());
                streams[*output] = Some(s);
            }
            StageKind::Reshuffle { input, output } => {
                // SDK stages already spread their input over workers; a
                // reshuffle only needs to break fusion, which planning did.
                streams[*output] = Some(get(&streams, *input));
            }
            StageKind::GroupByKey { input, output, .. } => {
                let s = group_by_key(get(&streams, *input), ctx, stage_index, *input, *output);
                let s = s.probe_with(probe);
                streams[*output] = Some(s);
            }
            StageKind::Sdk(sdk) => {
                let main = get(&streams, sdk.input);
                let sides: Vec<StreamVec<'s, Time, (u32, Element)>> = sdk
                    .side_inputs
                    .iter()
                    .enumerate()
                    .map(|(i, si)| get(&streams, si.pcollection).map(move |e| (i as u32, e)))
                    .collect();
                let sides = if sides.is_empty() {
                    Vec::<(u32, Element)>::new().to_stream(scope)
                } else {
                    scope.concatenate(sides).broadcast()
                };
                let tagged = sdk_stage(scope, main, sides, ctx, stage_index, sdk).probe_with(probe);
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
}

fn group_by_key<'s>(
    input: Elements<'s>,
    ctx: &JobContext,
    stage_index: usize,
    input_pc: usize,
    _output_pc: usize,
) -> Elements<'s> {
    let graph = ctx.graph.clone();
    let info = &graph.pcollections[input_pc];
    let (vc, wc) = (info.value_coder.clone(), info.window_coder.clone());
    let route = move |e: &Element| {
        GroupByKeyBuffer::route_hash(&vc, &wc, e).unwrap_or(0)
    };
    let ctx = ctx.clone();
    let name = graph.stages[stage_index].name.clone();
    let worker = input.scope().worker().clone();
    let worker_index = worker.index();
    input.unary_frontier(Exchange::new(route), &name.clone(), move |cap, op_info| {
        drop(cap);
        let info = &ctx.graph.pcollections[input_pc];
        let mut groups = if ctx.graph.streaming {
            Groups::Streaming(PaneBuffer::new(
                info.value_coder.clone(),
                info.window_coder.clone(),
                info.windowing.clone(),
            ))
        } else {
            let buffer = GroupByKeyBuffer::new(
                info.value_coder.clone(),
                info.window_coder.clone(),
                info.windowing.clone(),
            );
            Groups::Batch(match ctx.config.gbk_memory_budget {
                Some(budget) => buffer.with_spill(
                    budget / ctx.config.workers.max(1),
                    ctx.config.spill_dir.join(format!("stage{stage_index}-worker{worker_index}")),
                ),
                None => buffer,
            })
        };
        let activator = worker.activator_for(op_info.address.clone());
        let mut reported_late = 0u64;
        let mut held: Option<Capability<Time>> = None;
        // A custom merging WindowFn: the keys of the merge bundle in flight
        // (by nonce), and where its result lands.
        let merge_stage = match &ctx.graph.stages[stage_index].kind {
            StageKind::GroupByKey { merge_windows, .. } => merge_windows.is_some(),
            _ => false,
        };
        // With the input watermark when it was sent: the merged windows'
        // triggers are evaluated as of the elements' arrival.
        let mut merging: Option<(Vec<Vec<u8>>, Timestamp)> = None;
        let merged: Arc<Mutex<Option<std::result::Result<BundleResult, String>>>> = Arc::default();
        let merge_activator = Arc::new(worker.sync_activator_for(op_info.address.to_vec()));
        move |(input, frontier), output| {
            let watermark = watermark_of(frontier.frontier().as_ref());
            let now = ctx.clock.now();
            let mut ready: Vec<Element> = Vec::new();
            input.for_each(|cap, data| {
                let t = *cap.least().expect("non-empty stamp");
                if held.as_ref().map(|h| t < *h.time()).unwrap_or(true) {
                    held = cap.retain_least(0);
                }
                for e in data.drain(..) {
                    let inserted = match &mut groups {
                        Groups::Batch(b) => b.insert(&e),
                        Groups::Streaming(p) => p.insert(&e, watermark, now).map(|panes| ready.extend(panes)),
                    };
                    if let Err(message) = inserted {
                        ctx.fail(EngineError::BadData {
                            stage: name.clone(),
                            pcollection: ctx.graph.pcollections[input_pc].id.clone(),
                            message,
                        });
                    }
                }
            });
            if ctx.stopped() {
                held = None;
                return;
            }
            if merge_stage {
                let result = merging
                    .is_some()
                    .then(|| merged.lock().unwrap_or_else(|p| p.into_inner()).take())
                    .flatten();
                if let Some(result) = result {
                    let (keys, sent_at) = merging.take().expect("a merge is in flight");
                    let window_coder = &ctx.graph.pcollections[input_pc].window_coder;
                    let merges = result
                        .and_then(|r| decode_response(window_coder, r.outputs.first().map(Vec::as_slice).unwrap_or(&[])));
                    match merges {
                        Ok(merges) => {
                            for (nonce, m) in merges {
                                let Some(key) = keys.get(nonce) else { continue };
                                match &mut groups {
                                    Groups::Batch(b) => b.apply_merges(key, m),
                                    Groups::Streaming(p) => ready.extend(p.apply_merges(key, m, sent_at, now)),
                                }
                            }
                        }
                        Err(message) => ctx.fail(EngineError::BundleFailed {
                            stage: format!("{name} (merging windows of its custom WindowFn)"),
                            message,
                        }),
                    }
                }
                let needed = merging.is_none()
                    && match &groups {
                        Groups::Batch(b) => b.needs_merge(|t: Timestamp| watermark > t),
                        Groups::Streaming(p) => p.has_unmerged(),
                    };
                if needed {
                    let requests = match &mut groups {
                        Groups::Batch(b) => b.take_unmerged(),
                        Groups::Streaming(p) => p.take_unmerged(),
                    };
                    let input = encode_request(requests.iter().map(|(_, w)| w.as_slice()));
                    merging = Some((requests.into_iter().map(|(k, _)| k).collect(), watermark));
                    let (slot, activator) = (merged.clone(), merge_activator.clone());
                    ctx.processor.process_bundle(
                        BundleRequest {
                            stage: stage_index,
                            stage_id: ctx.graph.stages[stage_index].id.clone(),
                            stage_name: format!("{name}/MergeWindows"),
                            input,
                            side_inputs: Arc::default(),
                            side_input_generation: 0,
                            timers: vec![],
                            on_split: Arc::new(|_| {}),
                        },
                        Box::new(move |result| {
                            *slot.lock().unwrap_or_else(|p| p.into_inner()) = Some(result);
                            let _ = activator.activate();
                        }),
                    );
                }
            }
            // Windows wait for their merges before anything fires.
            match &mut groups {
                _ if merging.is_some() => {}
                Groups::Batch(b) => {
                    // Spilled groups come back a chunk per activation, and
                    // only while the SDK stages keep up: what they have not
                    // taken yet would otherwise pile up in memory.
                    let backlog = b.spilled_runs() > 0
                        && ctx.pending_elements() > 2 * ctx.config.max_bundle_elements;
                    if backlog {
                        activator.activate_after(Duration::from_millis(2));
                    } else {
                        ready.extend(b.take_complete(|t: Timestamp| watermark > t));
                        if b.has_more_complete() {
                            activator.activate();
                        }
                    }
                    if let Some(message) = b.take_error() {
                        ctx.fail(EngineError::Spill { stage: name.clone(), message });
                    }
                }
                Groups::Streaming(p) => {
                    ready.extend(p.advance(watermark, now));
                    if p.dropped_late > reported_late {
                        ctx.config.notices.send(format!(
                            "GroupByKey {name} dropped {} late element(s) so far: their windows had expired (watermark past the end of the window plus the allowed lateness) or closed",
                            p.dropped_late
                        ));
                        reported_late = p.dropped_late;
                    }
                    if let Some(at) = p.next_deadline() {
                        if let Some(wait) = ctx.clock.wait_until(at) {
                            activator.activate_after(wait);
                        }
                    }
                }
            }
            if let Some(cap) = held.as_ref() {
                if !ready.is_empty() {
                    output.session(cap).give_iterator(ready.into_iter());
                }
            }
            let empty = match &groups {
                Groups::Batch(b) => b.is_empty(),
                Groups::Streaming(p) => p.is_empty(),
            };
            ctx.report(stage_index, worker_index, StageStatus {
                watermark: (!frontier.is_empty()).then_some(watermark),
                windows: match &groups {
                    Groups::Batch(b) => b.buffered_keys(),
                    Groups::Streaming(p) => p.buffered_keys(),
                },
                ..StageStatus::default()
            });
            if empty {
                if let (Some(_), Groups::Batch(buffer)) = (held.as_ref(), &mut groups) {
                    if let Some(hot) = buffer.take_hot_key() {
                        let share = 100.0 * hot.values as f64 / hot.total as f64;
                        let key = if ctx.config.hot_key_logging {
                            format!("key {}", describe_key(&hot.key))
                        } else {
                            "a key (enable_hot_key_logging shows which)".to_string()
                        };
                        ctx.config.notices.send(format!(
                            "hot key in GroupByKey {name}: {key} has {} of the {} values ({share:.0}%) grouped on one worker",
                            hot.values, hot.total
                        ));
                    }
                }
                held = None;
            } else if merging.is_some() {
                // Panes of windows being merged go out at the time their
                // elements came in: downstream must not think them late.
            } else if let (Some(cap), Some(min)) = (held.as_mut(), frontier.frontier().iter().min())
            {
                if *min > *cap.time() {
                    cap.downgrade(min);
                }
            }
        }
    })
}

/// A GroupByKey's buffered data: one pane per window in batch, trigger-driven
/// panes in streaming.
enum Groups {
    Batch(GroupByKeyBuffer),
    Streaming(PaneBuffer),
}

/// A TestStream (`beam:transform:teststream:v1`) on worker 0: replays its
/// events in order, each once the pipeline has processed everything before
/// it (the probe has passed the stream's current time). Elements go out in
/// the global window at their own timestamps, tagged with their output's
/// port; a watermark event moves the watermark of its output (Beam's
/// `AdvanceWatermark` names the output's tag), and the stream's event time
/// is the least watermark of its outputs: every output is held back to the
/// slowest, so no output's elements arrive late because another output's
/// watermark moved on (Python's multi-output TestStreams advance each tag on
/// its own). A processing-time event moves the job's test clock. The stream
/// ends (watermark +infinity) after its last event.
fn test_stream<'s>(
    scope: Scope<'s, Time>,
    ctx: &JobContext,
    probe: &ProbeHandle<Time>,
    index: usize,
    outputs: usize,
    events: &[weir_graph::TestStreamEvent],
) -> StreamVec<'s, Time, (u32, Element)> {
    use timely::dataflow::operators::generic::operator::source;
    use weir_graph::TestStreamEvent;
    let events: VecDeque<TestStreamEvent> = if index == 0 {
        events.iter().cloned().collect()
    } else {
        VecDeque::new()
    };
    let ctx = ctx.clone();
    let probe = probe.clone();
    let worker = scope.worker().clone();
    source(scope, "TestStream", move |cap, info| {
        let activator = worker.activator_for(info.address.clone());
        let mut cap = Some(cap);
        let mut events = events;
        let mut watermarks = vec![Timestamp::MIN; outputs.max(1)];
        let mut sequence: u64 = 0;
        // (activity counter, consecutive checks it stayed the same) while
        // the probe is held only by elements waiting for side inputs.
        let mut quiet = (u64::MAX, 0u32);
        move |output| {
            let Some(c) = cap.as_mut() else { return };
            if ctx.stopped() || ctx.draining() {
                cap = None;
                return;
            }
            // Wait until everything before the stream's current time is
            // done. Main-input elements held back for side data that later
            // events bring, and the holds of pending timers, do not count
            // (Beam's TestStream waits for the pipeline to quiesce): when
            // they are all that holds the probe and nothing else moved for a
            // few checks, the stream goes on.
            if probe.less_than(c.time()) {
                let activity = ctx.activity.load(Ordering::Relaxed);
                if ctx.idle_but_held() && activity == quiet.0 {
                    quiet.1 += 1;
                } else {
                    quiet = (activity, 0);
                }
                if quiet.1 < QUIET_CHECKS {
                    activator.activate_after(Duration::from_millis(1));
                    return;
                }
            }
            quiet = (u64::MAX, 0);
            let Some(event) = events.pop_front() else {
                cap = None;
                return;
            };
            match event {
                TestStreamEvent::Elements {
                    output: port,
                    elements,
                } => {
                    let mut session = output.session(c);
                    for (value, timestamp) in elements {
                        let wv = weir_model::WindowedValue {
                            timestamp,
                            windows: vec![weir_model::Window::Global],
                            pane: weir_model::PaneInfo::NO_FIRING,
                            value,
                        };
                        let mut bytes = Vec::new();
                        wv.encode(&mut bytes);
                        session.give((port as u32, bytes));
                    }
                }
                TestStreamEvent::Watermark { output: port, to } => {
                    if let Some(w) = watermarks.get_mut(port) {
                        *w = (*w).max(to.min(Timestamp::MAX));
                    }
                }
                TestStreamEvent::ProcessingTime { advance_ms } => {
                    if let Clock::Test(t) = &ctx.clock {
                        t.fetch_add(advance_ms.max(0), Ordering::SeqCst);
                    }
                }
            }
            sequence += 1;
            let event_time = watermarks.iter().copied().min().unwrap_or(Timestamp::MIN);
            c.downgrade(&(time_at(event_time) | Time::from(sequence)));
            activator.activate();
        }
    })
}

/// Consecutive checks (1 ms apart) a TestStream waits, while only elements
/// held back for side inputs or timer holds hold it, before it replays its
/// next event.
const QUIET_CHECKS: u32 = 3;

/// Bundles a batch of pending restrictions is cut into (see the SDK stage operator).
const SPLITTABLE_BUNDLES_PER_BATCH: usize = 4;

/// Most rounds of timer firings a stage may take before Weir calls it a loop.
const MAX_TIMER_ROUNDS: u64 = 100_000;

/// What the harness reports about a bundle in flight.
enum BundleEvent {
    /// Residuals split off while the bundle runs.
    Split(Vec<Element>),
    /// The bundle finished.
    Done(std::result::Result<BundleResult, String>),
}

/// A main-input element with its windows (decoded once, for readiness checks).
type WindowedElement = (Vec<weir_model::Window>, Element);

/// A side input of an SDK stage: what to materialize, its WindowFn, and
/// whether its trigger is not the default one.
type SideSpec<'a> = (SideInputSpec<'a>, weir_graph::SideWindowFn, bool);

/// Per-operator state of an SDK stage.
struct SdkState {
    pending: VecDeque<(Capability<Time>, Vec<Element>)>,
    /// Residuals waiting out their requested resume delay: (wall-clock ms
    /// when due, hold, elements).
    delayed: Vec<(i64, Capability<Time>, Vec<Element>)>,
    in_flight: HashMap<u64, Capability<Time>>,
    next_bundle: u64,
    side_data: Vec<Vec<Element>>,
    side_inputs: Option<Arc<SideInputs>>,
    /// Streaming: main-input elements (with their windows) held back until
    /// the side windows they map to are ready, under their holds.
    held_back: Vec<(Capability<Time>, Vec<WindowedElement>)>,
    /// Streaming: the side-input generation bundles start with (bumped when
    /// a global-window side input changes after a bundle used the current
    /// one; see `BundleRequest::side_input_generation`), and whether a
    /// bundle used it.
    side_generation: u64,
    side_generation_used: bool,
    /// Pending timers (stateful stages), and the hold that keeps the stage
    /// alive while any are pending.
    timers: TimerStore,
    timer_hold: Option<Capability<Time>>,
    timer_rounds: u64,
    /// The watermark user state was last garbage-collected at.
    state_expired_to: Timestamp,
}

/// The side inputs of `sdk`: what to materialize of each, its WindowFn,
/// and whether its trigger is not the default one.
fn side_specs<'a>(sdk: &'a SdkStage, graph: &'a StageGraph) -> Vec<SideSpec<'a>> {
    sdk.side_inputs
        .iter()
        .map(|si| {
            let info = &graph.pcollections[si.pcollection];
            let spec = SideInputSpec {
                transform_id: &si.transform_id,
                local_name: &si.local_name,
                kind: si.kind,
                value_coder: &info.value_coder,
                window_coder: &info.window_coder,
                refresh: Refresh::of(&info.windowing, graph.streaming),
            };
            (
                spec,
                si.window_fn,
                info.windowing.trigger != weir_graph::Trigger::Default,
            )
        })
        .collect()
}

/// Moves held-back main-input elements whose side windows are all ready
/// (`side_ready` for each of `sides`: spec, WindowFn, triggered) to the
/// pending queue under their holds. The holds of elements still waiting
/// move up to the side input's frontier within their own event time, so a
/// TestStream waiting for the pipeline to catch up with an event (its
/// sequence number below the same event time) can replay the next one,
/// which may bring the side data; their event time, and so the watermark
/// they hold, never changes.
fn release_ready(st: &mut SdkState, sides: &[SideSpec<'_>], side_frontier: &[Time]) {
    let Some(live) = st.side_inputs.clone() else {
        return;
    };
    let done = side_frontier.is_empty();
    let watermark = watermark_of(side_frontier);
    let ready = |windows: &[weir_model::Window]| {
        sides.iter().all(|(spec, window_fn, triggered)| {
            let has_window = |w: &[u8]| live.has_window(spec.transform_id, spec.local_name, w);
            let progress = SideProgress {
                window_fn: *window_fn,
                triggered: *triggered,
                done,
                watermark,
                any: live.has_any(spec.transform_id, spec.local_name),
                has_window: &has_window,
            };
            windows.iter().all(|w| side_ready(&progress, w))
        })
    };
    let side_min = side_frontier.iter().min().copied();
    for (cap, elements) in std::mem::take(&mut st.held_back) {
        let (go, wait): (Vec<_>, Vec<_>) = elements
            .into_iter()
            .partition(|(windows, _)| ready(windows));
        if !go.is_empty() {
            st.pending
                .push_back((cap.clone(), go.into_iter().map(|(_, e)| e).collect()));
        }
        if wait.is_empty() {
            continue;
        }
        let same_event_time = *cap.time() | Time::from(u64::MAX);
        let cap = match side_min.map(|m| m.min(same_event_time)) {
            Some(t) if t > *cap.time() => cap.delayed(&t),
            _ => cap,
        };
        st.held_back.push((cap, wait));
    }
}

/// `elements` (encoded windowed values of `info`) without their windows
/// that expired at input watermark `watermark` (end of window plus allowed
/// lateness passed); elements left with no window are dropped. Elements
/// that do not decode are kept (the SDK reports them).
fn drop_expired(
    info: &weir_graph::PCollectionInfo,
    elements: Vec<Element>,
    watermark: Timestamp,
) -> Vec<Element> {
    let lateness = info.windowing.allowed_lateness_ms;
    let live =
        |w: &weir_model::Window| watermark <= w.max_timestamp().saturating_add_millis(lateness);
    elements
        .into_iter()
        .filter_map(|e| {
            let Ok((mut wv, _)) =
                weir_model::WindowedValue::decode(&info.value_coder, &info.window_coder, &e)
            else {
                return Some(e);
            };
            if wv.windows.iter().all(live) {
                return Some(e);
            }
            wv.windows.retain(live);
            if wv.windows.is_empty() {
                return None;
            }
            let mut out = Vec::with_capacity(e.len());
            wv.encode(&mut out);
            Some(out)
        })
        .collect()
}

/// Sets the runner's window-expiration timer (Java's `@OnWindowExpiration`,
/// see `TimerStore::set_window_expiration`) of every (key, window) of
/// `elements`, encoded windowed KVs of `info`. Elements that do not decode
/// are skipped (the SDK reports them).
fn set_expiration_timers(
    timers: &mut TimerStore,
    family: usize,
    info: &weir_graph::PCollectionInfo,
    elements: &[Element],
) {
    for e in elements {
        let Ok((wv, _)) =
            weir_model::WindowedValue::decode(&info.value_coder, &info.window_coder, e)
        else {
            continue;
        };
        let Ok((key, _)) = weir_model::windowed_value::split_kv(&info.value_coder, &wv.value)
        else {
            continue;
        };
        for w in &wv.windows {
            timers.set_window_expiration(family, key, w, info.windowing.allowed_lateness_ms);
        }
    }
}

/// Keeps the stage's timer hold at the earliest hold timestamp of its
/// pending timers (never earlier than a capability it may use: the current
/// hold or `bundle`, the capability of a bundle that just completed), and
/// drops it when no timer is pending.
///
/// The hold sits at the *last* timely time of its event time (the low 64
/// bits, a TestStream's event sequence, all ones): it holds the Beam
/// watermark at that event time all the same, but it is not "work before"
/// any TestStream event at that event time. A TestStream replays its next
/// event only once everything before its current time is done; a timer
/// held at the stream's current event time (e.g. set at exactly the
/// watermark) can only fire after the stream moves the watermark on, so
/// counting its hold as pending work would stall the job for good.
fn refresh_timer_hold(st: &mut SdkState, bundle: Option<&Capability<Time>>) {
    let Some(min_hold) = st.timers.min_hold() else {
        st.timer_hold = None;
        return;
    };
    let base = match (st.timer_hold.take(), bundle) {
        (Some(h), Some(c)) if c.time() < h.time() => c.clone(),
        (Some(h), _) => h,
        (None, Some(c)) => c.clone(),
        (None, None) => return,
    };
    let at = (*base.time()).max(time_at(min_hold)) | Time::from(u64::MAX);
    st.timer_hold = Some(base.delayed(&at));
}

fn sdk_stage<'s>(
    scope: Scope<'s, Time>,
    main: Elements<'s>,
    sides: StreamVec<'s, Time, (u32, Element)>,
    ctx: &JobContext,
    stage_index: usize,
    sdk: &SdkStage,
) -> StreamVec<'s, Time, (u32, Element)> {
    let worker = scope.worker();
    let worker_index = worker.index();
    let ctx = ctx.clone();
    let sdk = sdk.clone();
    let name = ctx.graph.stages[stage_index].name.clone();
    // Stateful stages route by key (state and timers of a key live with one
    // operator); others spread elements round-robin.
    let mut round_robin = 0u64;
    let keyed = sdk.stateful.then(|| {
        let info = &ctx.graph.pcollections[sdk.input];
        (info.value_coder.clone(), info.window_coder.clone())
    });
    let route = move |e: &Element| match &keyed {
        Some((vc, wc)) => GroupByKeyBuffer::route_hash(vc, wc, e).unwrap_or(0),
        None => {
            round_robin = round_robin.wrapping_add(1);
            round_robin
        }
    };
    main.binary_frontier(sides, Exchange::new(route), Pipeline, &name.clone(), move |cap, info| {
        drop(cap);
        let activator = Arc::new(worker.sync_activator_for(info.address.to_vec()));
        let wakeup = worker.activator_for(info.address.clone());
        let completions: Arc<Mutex<Vec<(u64, BundleEvent)>>> = Arc::default();
        let state = Rc::new(RefCell::new(SdkState {
            pending: VecDeque::new(),
            delayed: Vec::new(),
            in_flight: HashMap::new(),
            next_bundle: 0,
            side_data: vec![Vec::new(); sdk.side_inputs.len()],
            side_inputs: None,
            held_back: Vec::new(),
            side_generation: 0,
            side_generation_used: false,
            timers: TimerStore::new(&sdk.timer_families),
            timer_hold: None,
            timer_rounds: 0,
            state_expired_to: Timestamp(i64::MIN),
        }));
        let submit_stage_id = ctx.graph.stages[stage_index].id.clone();
        let drain_stage_id = sdk.drain_descriptor_id.clone();
        let submit_ctx = ctx.clone();
        let submit_name = name.clone();
        let submit_activator = activator.clone();
        let submit_completions = completions.clone();
        let expiration = sdk
            .window_expiration_family
            .map(|family| (family, ctx.graph.pcollections[sdk.input].clone()));
        let submit = move |st: &mut SdkState, cap: Capability<Time>, elements: Vec<Element>, timers: Vec<Vec<u8>>| {
            let (ctx, activator, completions) = (&submit_ctx, &submit_activator, &submit_completions);
            let side_inputs = st.side_inputs.clone().unwrap_or_default();
            let side_input_generation = st.side_generation;
            st.side_generation_used = true;
            let id = st.next_bundle;
            st.next_bundle += 1;
            st.in_flight.insert(id, cap);
            if let Some((family, info)) = &expiration {
                set_expiration_timers(&mut st.timers, *family, info, &elements);
            }
            // Once the job is drained, a splittable stage's restrictions go
            // through its drain descriptor, which truncates them first.
            let stage_id = match &drain_stage_id {
                Some(drain) if ctx.draining() => drain.clone(),
                _ => submit_stage_id.clone(),
            };
            let completions = completions.clone();
            let activator = activator.clone();
            let (split_completions, split_activator) = (completions.clone(), activator.clone());
            let on_split = Arc::new(move |residuals: Vec<Element>| {
                split_completions.lock().unwrap_or_else(|p| p.into_inner()).push((id, BundleEvent::Split(residuals)));
            let _ = split_activator.activate();
            });
            let request = BundleRequest {
                on_split,
                stage: stage_index,
                stage_id,
                stage_name: submit_name.clone(),
                input: elements,
                side_inputs,
                side_input_generation,
                timers,
            };
            ctx.processor.process_bundle(
                request,
                Box::new(move |result| {
                    completions.lock().unwrap_or_else(|p| p.into_inner()).push((id, BundleEvent::Done(result)));
                let _ = activator.activate();
                }),
            );
        };
        // Streaming: side inputs are live (updated as their data arrives, and
        // read per main-input window once ready; see side_input.rs).
        let live_sides = ctx.graph.streaming && !sdk.side_inputs.is_empty();
        if live_sides {
            let graph = ctx.graph.clone();
            let specs: Vec<SideInputSpec<'_>> = side_specs(&sdk, &graph).into_iter().map(|(s, _, _)| s).collect();
            state.borrow_mut().side_inputs = Some(Arc::new(SideInputs::new(&specs)));
        }
        move |(input, frontier), (side_input, side_frontier), output| {
            let mut st = state.borrow_mut();
            let st = &mut *st;
            let graph = ctx.graph.clone();
            let sides = side_specs(&sdk, &graph);
            let mut side_error = None;
            side_input.for_each(|cap, data| {
                let firing = *cap.least().expect("non-empty stamp");
                for (i, e) in data.drain(..) {
                    if !live_sides {
                        st.side_data[i as usize].push(e);
                        continue;
                    }
                    if sides[i as usize].1 == weir_graph::SideWindowFn::Global && st.side_generation_used {
                        st.side_generation += 1;
                        st.side_generation_used = false;
                    }
                    let live = Arc::make_mut(st.side_inputs.get_or_insert_with(Arc::default));
                    if let Err(message) = live.insert(&sides[i as usize].0, &e, firing) {
                        side_error.get_or_insert(message);
                    }
                }
            });
            if let Some(message) = side_error {
                ctx.fail(EngineError::BadData { stage: name.clone(), pcollection: "side input".into(), message });
                return;
            }
            // A stateful DoFn never sees data of expired windows (the input
            // watermark past the window's end plus the allowed lateness): its
            // state for them is gone, as in Beam's StatefulDoFnRunner.
            let input_watermark = watermark_of(frontier.frontier().as_ref());
            input.for_each(|cap, data| {
                let mut elements = std::mem::take(data);
                if sdk.stateful && ctx.graph.streaming {
                    let info = &ctx.graph.pcollections[sdk.input];
                    let before = elements.len();
                    elements = drop_expired(info, elements, input_watermark);
                    if elements.len() < before {
                        ctx.config.notices.send(format!(
                            "stage {name} dropped {} late element(s) for a stateful DoFn: their windows had expired",
                            before - elements.len()
                        ));
                    }
                }
                if elements.is_empty() {
                    return;
                }
                let Some(c) = cap.retain_least(0) else { return };
                if live_sides {
                    let info = &ctx.graph.pcollections[sdk.input];
                    let with_windows = elements
                        .into_iter()
                        .map(|e| {
                            // An element that does not decode runs at once (the SDK reports it).
                            let windows = weir_model::WindowedValue::decode(&info.value_coder, &info.window_coder, &e)
                                .map(|(wv, _)| wv.windows)
                                .unwrap_or_default();
                            (windows, e)
                        })
                        .collect();
                    st.held_back.push((c, with_windows));
                } else {
                    st.pending.push_back((c, elements));
                }
            });
            if live_sides && !st.held_back.is_empty() {
                release_ready(st, &sides, side_frontier.frontier().as_ref());
            }
            if ctx.stopped() {
                st.held_back.clear();
                st.pending.clear();
                st.delayed.clear();
                st.in_flight.clear();
                st.timer_hold = None;
                return;
            }
            if st.side_inputs.is_none() && side_frontier.is_empty() {
                let specs: Vec<SideInputSpec<'_>> = sides.into_iter().map(|(s, _, _)| s).collect();
                match SideInputs::build(&specs, &st.side_data) {
                    Ok(s) => st.side_inputs = Some(Arc::new(s)),
                    Err(message) => {
                        ctx.fail(EngineError::BadData { stage: name.clone(), pcollection: "side input".into(), message });
                        return;
                    }
                }
                st.side_data.clear();
            }
            // Completed bundles: emit outputs at the bundle's hold, re-queue residuals.
            let done: Vec<_> = std::mem::take(&mut *completions.lock().unwrap_or_else(|p| p.into_inner()));
            for (id, event) in done {
                let result = match event {
                    BundleEvent::Split(residuals) => {
                        // Work split off a running bundle: schedule it under that bundle's hold.
                        if let Some(cap) = st.in_flight.get(&id) {
                            let cap = cap.clone();
                            st.pending.push_back((cap, residuals));
                        }
                        continue;
                    }
                    BundleEvent::Done(result) => result,
                };
                let Some(cap) = st.in_flight.remove(&id) else { continue };
                match result {
                    Ok(r) => {
                        let mut session = output.session(&cap);
                        for (port, bytes) in r.outputs.iter().enumerate() {
                            let Some(&pc) = sdk.outputs.get(port) else { continue };
                            let info = &ctx.graph.pcollections[pc];
                            match split_elements(&info.value_coder, &info.window_coder, bytes) {
                                Ok(elements) => session.give_iterator(elements.into_iter().map(|e| (port as u32, e))),
                                Err(message) => ctx.fail(EngineError::BadData { stage: name.clone(), pcollection: info.id.clone(), message }),
                            }
                        }
                        drop(session);
                        tracing::debug!(stage = %name, timers = ?r.timers.iter().map(|t| t.iter().map(|b| format!("{b:02x}")).collect::<String>()).collect::<Vec<_>>(), outputs = ?r.outputs.iter().map(|o| o.len()).collect::<Vec<_>>(), "bundle done");
                        for (family, bytes) in r.timers.iter().enumerate() {
                            if let Err(message) = st.timers.apply(family, bytes) {
                                ctx.fail(EngineError::BadData { stage: name.clone(), pcollection: "timers".into(), message });
                            }
                        }
                        refresh_timer_hold(st, Some(&cap));
                        if !r.residuals.is_empty() {
                            // The residuals' watermark estimate holds the
                            // stage's output (not the bundle's input time),
                            // and a requested resume delay is waited out.
                            let cap = match r.residual_watermark {
                                Some(wm) if time_at(wm) > *cap.time() => cap.delayed(&time_at(wm)),
                                _ => cap,
                            };
                            // Drained, a residual resumes at once (truncated).
                            let drained = ctx.draining() && sdk.drain_descriptor_id.is_some();
                            if r.residual_delay_ms > 0 && !drained {
                                st.delayed.push((wall_millis().saturating_add(r.residual_delay_ms), cap, r.residuals));
                            } else {
                                st.pending.push_back((cap, r.residuals));
                            }
                        }
                    }
                    Err(message) => ctx.fail(EngineError::BundleFailed { stage: ctx.graph.stages[stage_index].id.clone(), message }),
                }
            }
            if ctx.stopped() {
                return;
            }
            // Draining: residuals waiting to resume later (sources polling
            // for more) resume at once through the drain descriptor, where
            // the DoFn's `truncate_restriction` decides what is left of them;
            // a stage without one drops them, so the sources finish.
            if ctx.draining() && !st.delayed.is_empty() {
                let delayed = std::mem::take(&mut st.delayed);
                if sdk.drain_descriptor_id.is_some() {
                    st.pending.extend(delayed.into_iter().map(|(_, cap, elements)| (cap, elements)));
                }
            }
            // Residuals whose resume delay has passed become pending work.
            if !st.delayed.is_empty() {
                let now = wall_millis();
                let (due, waiting): (Vec<_>, Vec<_>) = std::mem::take(&mut st.delayed).into_iter().partition(|(at, _, _)| *at <= now);
                st.delayed = waiting;
                for (_, cap, elements) in due {
                    st.pending.push_back((cap, elements));
                }
                if let Some(next) = st.delayed.iter().map(|(at, _, _)| *at).min() {
                    wakeup.activate_after(Duration::from_millis((next - now).max(1) as u64));
                }
            }
            let status = |st: &SdkState, waiting_for_side_inputs: bool| StageStatus {
                watermark: (!frontier.is_empty()).then(|| watermark_of(frontier.frontier().as_ref())),
                in_flight: st.in_flight.len(),
                pending: st.pending.iter().map(|(_, e)| e.len()).sum(),
                delayed: st.delayed.iter().map(|(_, _, e)| e.len()).sum(),
                timers: st.timers.len(),
                windows: 0,
                waiting_for_side_inputs: waiting_for_side_inputs || !st.held_back.is_empty(),
                held_back: st.held_back.iter().map(|(_, e)| e.len()).sum(),
            };
            // Start bundles while there is room.
            if st.side_inputs.is_none() {
                ctx.report(stage_index, worker_index, status(st, true));
                return;
            }
            // A stateful stage runs one bundle at a time, so bundles never race on a key's state.
            let max_in_flight = if sdk.stateful { 1 } else { ctx.config.max_bundles_in_flight };
            // Fire timers once the input before them is done: event-time timers
            // when the watermark passes them; processing-time timers when the
            // clock passes them (streaming) or the input is exhausted.
            if st.pending.is_empty() && st.in_flight.is_empty() && !st.timers.is_empty() {
                let input_done = frontier.is_empty();
                let watermark = watermark_of(frontier.frontier().as_ref());
                let now = ctx.clock.now();
                let streaming = ctx.graph.streaming;
                let fired = st.timers.take_ready(sdk.window_expiration_family, |event_time, fire| {
                    if event_time {
                        watermark > fire
                    } else {
                        input_done || (streaming && now >= fire.millis())
                    }
                });
                if streaming {
                    if let Some(next) = st.timers.next_processing_time() {
                        if let Some(wait) = ctx.clock.wait_until(next.millis()) {
                            wakeup.activate_after(wait);
                        }
                    }
                }
                tracing::debug!(stage = %name, fired = fired.is_some(), hold = st.timer_hold.is_some(), "timer check");
                if let (Some(timers), Some(cap)) = (fired, st.timer_hold.clone()) {
                    st.timer_rounds += 1;
                    // In batch a timer that keeps re-arming would never let the
                    // job end; in streaming a looping timer is legitimate.
                    if st.timer_rounds > MAX_TIMER_ROUNDS && !ctx.graph.streaming {
                        ctx.fail(EngineError::BundleFailed {
                            stage: ctx.graph.stages[stage_index].id.clone(),
                            message: format!("timers kept re-arming for {MAX_TIMER_ROUNDS} rounds; giving up"),
                        });
                        return;
                    }
                    submit(st, cap, Vec::new(), timers);
                }
            }
            refresh_timer_hold(st, None);
            // Garbage-collects the user state of expired windows (see
            // BundleProcessor::expire_user_state): only while the stage is
            // idle (no bundle reads or writes state meanwhile; a streaming
            // job has one worker, so that covers every key), and at the input
            // watermark held back to the earliest hold of the pending timers,
            // so timers of a window (their hold is in the window) run with its
            // state before it goes. Called again only when that moved.
            if sdk.stateful && ctx.graph.streaming && st.pending.is_empty() && st.in_flight.is_empty() && st.delayed.is_empty() {
                let watermark = watermark_of(frontier.frontier().as_ref());
                let gc = st.timers.min_hold().map_or(watermark, |hold| hold.min(watermark));
                if gc > st.state_expired_to {
                    st.state_expired_to = gc;
                    ctx.processor.expire_user_state(stage_index, gc);
                }
            }
            // Restrictions of a splittable DoFn go out in small bundles (about
            // a quarter of what is pending each, one when few are pending), so
            // they spread over SDK workers and a single running one can be
            // split, without paying the SDK's per-bundle cost for each of
            // thousands of tiny restrictions.
            let max_elements = if sdk.splittable {
                let pending: usize = st.pending.iter().map(|(_, e)| e.len()).sum();
                (pending / SPLITTABLE_BUNDLES_PER_BATCH).clamp(1, ctx.config.max_bundle_elements)
            } else {
                ctx.config.max_bundle_elements
            };
            while st.in_flight.len() < max_in_flight {
                let Some((cap, first)) = st.pending.pop_front() else { break };
                // Fill the bundle from consecutive chunks held at the same time.
                let mut elements: Vec<Element> = Vec::new();
                let mut bytes = 0;
                let mut chunk = first;
                loop {
                    let mut take = 0;
                    while take < chunk.len()
                        && elements.len() + take < max_elements
                        && (elements.len() + take == 0 || bytes + chunk[take].len() <= ctx.config.max_bundle_bytes)
                    {
                        bytes += chunk[take].len();
                        take += 1;
                    }
                    let rest = chunk.split_off(take);
                    elements.append(&mut chunk);
                    if !rest.is_empty() {
                        st.pending.push_front((cap.clone(), rest));
                        break;
                    }
                    match st.pending.front() {
                        Some((next, _)) if next.time() == cap.time() => {
                            chunk = st.pending.pop_front().expect("front exists").1;
                        }
                        _ => break,
                    }
                }
                if elements.is_empty() {
                    continue;
                }
                submit(st, cap, elements, vec![]);
            }
            ctx.report(stage_index, worker_index, status(st, false));
        }
    })
}
