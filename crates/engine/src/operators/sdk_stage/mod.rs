//! The SDK stage operator: runs a fused stage of SDK transforms as bundles
//! on SDK harnesses.
//!
//! Per activation it gathers side-input data (batch: until the side inputs
//! are done; streaming: live, with main-input elements held back until
//! their side windows are ready), drops late data of a stateful DoFn's
//! expired windows, takes completed bundles (outputs under the bundle's
//! hold, residuals re-scheduled, timers applied), resumes delayed residuals
//! (at once when drained), fires ready timers, garbage-collects expired user
//! state, and cuts pending elements into new bundles while there is room.
//! The decisions that need no timely live beside it: [`bundles`] (cutting),
//! [`residuals`] (residual holds and resume delays), [`sides`] (side-input
//! readiness), [`expiry`] (expired windows), [`sorted`] (time-sorted
//! input) and [`state`] (the operator's state and its timer hold).

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use timely::dataflow::channels::pact::{Exchange, Pipeline};
use timely::dataflow::operators::{Capability, Operator};
use timely::dataflow::Scope;
use weir_graph::SdkStage;

use super::{Element, Elements, TaggedElements};
use crate::bundle::{BundleRequest, BundleResult, OnSplit, Splits};
use crate::dataflow::{JobContext, StageStatus};
use crate::group_by_key::GroupByKeyBuffer;
use crate::time::{wall_millis, watermark_of, Time};
use crate::timers::TimerStore;
use crate::outputs::{OutputReader, OutputSpill};
use crate::user_state::UserState;
use crate::EngineError;

mod bundles;
mod expiry;
mod residuals;
mod sides;
mod sorted;
mod spread;
mod state;

use bundles::{cut_bundle, BundleLimits};
use expiry::{drop_expired, set_expiration_timers};
use residuals::{residual_hold, resume_at};
pub(crate) use sides::SharedSides;
use sides::{drop_evicted, empty_views, evict_expired, release_ready, side_specs, with_windows};
use sorted::TimeSorted;
use spread::{even_parts, Spread, SPREAD_CHUNK_BYTES};
use state::{Emission, InFlight};

/// The operator's state, held under timely capabilities.
type State = state::SdkState<Capability<Time>>;

/// Most rounds of timer firings a stage may take before Weir calls it a loop.
const MAX_TIMER_ROUNDS: u64 = 100_000;

/// Most bytes of completed bundles' outputs an SDK stage turns into
/// elements and gives downstream per activation.
const EMIT_BYTES_PER_ACTIVATION: usize = 8 << 20;

/// What the harness reports about a bundle in flight.
enum BundleEvent {
    /// Residuals split off while the bundle runs, how many of them are
    /// the bundle's own input elements handed back, and in how many
    /// bundles those start.
    Split(Vec<Element>, usize, usize),
    /// The bundle finished.
    Done(std::result::Result<BundleResult, String>),
}

/// The SDK stage `stage_index` (`sdk`) over `main` (its main input) and
/// `sides` (every side input's elements, tagged with the side input's index
/// in `sdk.side_inputs`, broadcast to every worker). Its output carries the
/// bundles' outputs tagged with their port in `sdk.outputs`. Failures stop
/// the job through `ctx` (`EngineError::BundleFailed`, `BadData`).
pub(crate) fn sdk_stage<'s>(
    scope: Scope<'s, Time>,
    main: Elements<'s>,
    sides: TaggedElements<'s>,
    ctx: &JobContext,
    stage_index: usize,
    sdk: &SdkStage,
) -> TaggedElements<'s> {
    let worker = scope.worker();
    let worker_index = worker.index();
    let ctx = ctx.clone();
    let sdk = sdk.clone();
    let name = ctx.graph.stages[stage_index].name.clone();
    // Stateful stages route by key (state and timers of a key live with one
    // operator); splittable stages spread restrictions round-robin, one at a
    // time; others spread in chunks (see spread.rs).
    let keyed = sdk.stateful.then(|| {
        let info = &ctx.graph.pcollections[sdk.input];
        (info.value_coder.clone(), info.window_coder.clone())
    });
    // In a cluster, spreading stays within this process (a Reshuffle
    // spreads over processes); keyed elements go wherever their key lives.
    let peers = worker.peers() as u64;
    let chunk = if sdk.splittable { 0 } else { SPREAD_CHUNK_BYTES };
    // A batch job's restrictions go out as one bundle where the processor
    // splits it for idle SDK workers (see BundleLimits::for_stage).
    let one_bundle =
        sdk.splittable && !ctx.graph.streaming && ctx.processor.restrictions_in_one_bundle(stage_index);
    let mut spread = Spread::new(worker_index as u64, ctx.local_workers as u64, chunk);
    let route_ctx = ctx.clone();
    let route = move |e: &Element| match &keyed {
        Some((vc, wc)) => {
            let hash = GroupByKeyBuffer::route_hash(vc, wc, e).unwrap_or(0);
            route_ctx.count_exchange(worker_index, hash, peers, e.len());
            hash
        }
        None => spread.route(e.len()),
    };
    main.binary_frontier(sides, Exchange::new(route), Pipeline, &name.clone(), move |cap, info| {
        drop(cap);
        let activator = Arc::new(worker.sync_activator_for(info.address.to_vec()));
        let wakeup = worker.activator_for(info.address.clone());
        let completions: Arc<Mutex<Vec<(u64, BundleEvent)>>> = Arc::default();
        let state = Rc::new(RefCell::new(State::new(TimerStore::new(
            &sdk.timer_families,
            sdk.window_expiration_family,
        ))));
        // A DoFn that requires time-sorted input: its elements wait here for
        // the watermark (see sorted.rs).
        let mut sorted: Option<TimeSorted<Capability<Time>>> = sdk.time_sorted.then(|| {
            TimeSorted::new(ctx.graph.pcollections[sdk.input].windowing.allowed_lateness_ms)
        });
        // The user state of the keys routed to this worker (see crate::user_state).
        let user_state = Arc::new(UserState::new(ctx.user_state_usage.clone()));
        let submit_user_state = user_state.clone();
        // Under a memory budget, large bundle outputs wait on disk.
        let spill_outputs = ctx
            .config
            .gbk_memory_budget
            .map(|budget| OutputSpill::for_budget(ctx.config.spill_dir.join("outputs"), budget));
        let submit_stage_id = ctx.graph.stages[stage_index].id.clone();
        // The least wait of a residual that asked for a resume delay, whole
        // ms rounded up.
        let resume_floor_ms =
            i64::try_from(ctx.config.min_resume_delay.as_micros().div_ceil(1000)).unwrap_or(i64::MAX);
        // Elements waiting for a bundle here, for the harness's split decisions.
        let backlog = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let submit_backlog = backlog.clone();
        let drain_stage_id = sdk.drain_descriptor_id.clone();
        let submit_ctx = ctx.clone();
        let submit_name = name.clone();
        let submit_activator = activator.clone();
        let submit_completions = completions.clone();
        let expiration = sdk
            .window_expiration_family
            .map(|family| (family, ctx.graph.pcollections[sdk.input].clone()));
        let submit_sdk = sdk.clone();
        // Streaming: whether side windows of this stage may expire (fixed or
        // sliding side windowing, a main window coder whose ends the runner
        // reads; see sides::evict_expired).
        let expiring_sides = ctx.graph.streaming
            && matches!(
                ctx.graph.pcollections[sdk.input].window_coder,
                weir_model::Coder::GlobalWindow | weir_model::Coder::IntervalWindow
            )
            && sdk.side_inputs.iter().any(|si| si.window_fn.expires());
        // Each side input's allowed lateness, for the eviction.
        let side_lateness: Vec<i64> = sdk
            .side_inputs
            .iter()
            .map(|si| ctx.graph.pcollections[si.pcollection].windowing.allowed_lateness_ms)
            .collect();
        let submit = move |st: &mut State, cap: Capability<Time>, mut elements: Vec<Element>, timers: Vec<Vec<u8>>| {
            let (ctx, activator, completions) = (&submit_ctx, &submit_activator, &submit_completions);
            // Input elements a split handed back were counted when they
            // first went out.
            let recounted = st.returned.min(elements.len());
            st.returned -= recounted;
            // Streaming: windows whose side windows were evicted have
            // expired; they go here (see sides::evict_expired).
            let main_info = &ctx.graph.pcollections[submit_sdk.input];
            let mut earliest_window_end = weir_model::Timestamp(i64::MAX);
            if let Some(live) = st.side_inputs.as_deref().filter(|_| expiring_sides) {
                let sides = side_specs(&submit_sdk, &ctx.graph);
                let dropped;
                (elements, dropped) = drop_evicted(main_info, &sides, live, elements);
                earliest_window_end = sides::bundle_window_end(main_info, &elements, &st.timers, &timers);
                if dropped > 0 {
                    ctx.config.notices.send(format!(
                        "stage {submit_name} dropped {dropped} late element window(s): they had expired, and with them the side-input windows they read"
                    ));
                }
                if elements.is_empty() && timers.is_empty() {
                    return;
                }
            }
            let side_inputs = st.side_inputs.clone().unwrap_or_default();
            let side_input_generation = st.side_generation.for_bundle();
            let id = st.next_bundle;
            st.next_bundle += 1;
            ctx.count(stage_index, elements.len().saturating_sub(recounted), 0, 0);
            st.in_flight.insert(
                id,
                InFlight { hold: cap, submitted: std::time::Instant::now(), elements: elements.len(), earliest_window_end },
            );
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
            let on_split: OnSplit = Arc::new(move |residuals: Vec<Element>, returned: usize, ways: usize| {
                split_completions.lock().unwrap_or_else(|p| p.into_inner()).push((id, BundleEvent::Split(residuals, returned, ways)));
            let _ = split_activator.activate();
            });
            let request = BundleRequest {
                user_state: submit_user_state.clone(),
                spill_outputs: spill_outputs.clone(),
                on_split: Some(Splits { hand_back: on_split, backlog: submit_backlog.clone() }),
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
        // Batch: the first worker of this process builds the side inputs as
        // their data arrives and shares them with the process's other
        // workers, which drop their copies of the data (see SharedSides).
        let shares_sides = !live_sides && !sdk.side_inputs.is_empty();
        let builds_sides = worker_index % ctx.local_workers == 0;
        if live_sides {
            let graph = ctx.graph.clone();
            state.borrow_mut().side_inputs = Some(Arc::new(empty_views(&side_specs(&sdk, &graph))));
        }
        move |(input, frontier), (side_input, side_frontier), output| {
            let mut st = state.borrow_mut();
            let st = &mut *st;
            let graph = ctx.graph.clone();
            let sides = side_specs(&sdk, &graph);
            let mut side_error = None;
            let mut ignored = 0;
            side_input.for_each(|cap, data| {
                let firing = *cap.least().expect("non-empty stamp");
                for (i, e) in data.drain(..) {
                    if !live_sides {
                        if builds_sides {
                            let building = st.side_building.get_or_insert_with(|| empty_views(&sides));
                            if let Err(message) = building.insert(&sides[i as usize].0, &e, 0) {
                                side_error.get_or_insert(message);
                            }
                        }
                        continue;
                    }
                    if sides[i as usize].1 == weir_graph::SideWindowFn::Global {
                        st.side_generation.global_side_changed();
                    }
                    let live = Arc::make_mut(st.side_inputs.get_or_insert_with(Arc::default));
                    match live.insert(&sides[i as usize].0, &e, firing) {
                        Ok(landed) => ignored += usize::from(!landed),
                        Err(message) => {
                            side_error.get_or_insert(message);
                        }
                    }
                }
            });
            if let Some(message) = side_error {
                ctx.fail(EngineError::BadData { stage: name.clone(), pcollection: "side input".into(), message });
                return;
            }
            // Every worker gets the side data (and evicts at its own pace):
            // the first one tells what it ignored.
            if ignored > 0 && worker_index == 0 {
                ctx.config.notices.send(format!(
                    "stage {name} ignored {ignored} late side-input element(s): their windows had expired"
                ));
            }
            // The side inputs of a stage are held in memory, once per process
            // (batch) or per worker (streaming): past their budget the job
            // fails rather than the server.
            let held = if live_sides { st.side_inputs.as_deref() } else { st.side_building.as_ref() };
            if let (Some(budget), Some(held)) = (ctx.config.side_input_budget, held) {
                if held.bytes() > budget {
                    let names: Vec<String> = sides
                        .iter()
                        .map(|(s, _, _)| format!("{:?} of transform {:?}", s.local_name, s.transform_id))
                        .collect();
                    ctx.fail(EngineError::OverBudget {
                        stage: name.clone(),
                        message: format!(
                            "its side inputs ({}) hold about {} bytes in this process, past their budget of {budget} bytes (weir serve --side_input_memory_budget_mb). Weir keeps side inputs in memory: read a smaller side input (a combined or filtered view), or raise the budget",
                            names.join(", "),
                            held.bytes()
                        ),
                    });
                    return;
                }
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
                if let Some(sorted) = sorted.as_mut() {
                    // An element whose timestamp does not decode goes at once (the SDK reports it).
                    let (stamped, bad): (Vec<_>, Vec<_>) = elements
                        .into_iter()
                        .map(|e| (weir_model::Timestamp::decode(&e).map(|(t, _)| t).ok(), e))
                        .partition(|(t, _)| t.is_some());
                    let late = sorted.push(
                        c.clone(),
                        input_watermark,
                        stamped.into_iter().map(|(t, e)| (t.expect("partitioned"), e)),
                    );
                    if late > 0 {
                        ctx.config.notices.send(format!(
                            "stage {name} dropped {late} late element(s) for a DoFn that requires time-sorted input: the watermark had passed their timestamp plus the allowed lateness"
                        ));
                    }
                    if bad.is_empty() {
                        return;
                    }
                    elements = bad.into_iter().map(|(_, e)| e).collect();
                }
                if live_sides {
                    st.held_back.push((c, with_windows(&ctx.graph.pcollections[sdk.input], elements)));
                } else {
                    st.pending.push_back((c, elements));
                }
            });
            if live_sides && !st.held_back.is_empty() {
                release_ready(st, &sides, side_frontier.frontier().as_ref());
            }
            if let Some(sorted) = sorted.as_mut() {
                let least = frontier.frontier().iter().min().copied();
                if let Some((hold, ready)) = sorted.release(input_watermark, least) {
                    if live_sides {
                        // In order, behind the elements already waiting for their side windows.
                        st.held_back.push((hold, with_windows(&ctx.graph.pcollections[sdk.input], ready)));
                        release_ready(st, &sides, side_frontier.frontier().as_ref());
                    } else {
                        st.pending.push_back((hold, ready));
                    }
                }
            }
            if ctx.stopped() {
                if let Some(sorted) = sorted.as_mut() {
                    sorted.clear();
                }
                st.held_back.clear();
                st.pending.clear();
                st.delayed.clear();
                st.in_flight.clear();
                st.emitting.clear();
                st.timer_hold = None;
                return;
            }
            if st.side_inputs.is_none() && side_frontier.is_empty() {
                if !shares_sides {
                    st.side_inputs = Some(Arc::default());
                } else if builds_sides {
                    let built = Arc::new(st.side_building.take().unwrap_or_else(|| empty_views(&sides)));
                    ctx.shared_sides.publish(stage_index, built.clone(), ctx.local_workers - 1);
                    st.side_inputs = Some(built);
                } else {
                    // None until the builder publishes them; it wakes us.
                    st.side_inputs = ctx.shared_sides.take(stage_index, &activator);
                }
            }
            // Completed bundles: emit outputs at the bundle's hold, re-queue residuals.
            let done: Vec<_> = std::mem::take(&mut *completions.lock().unwrap_or_else(|p| p.into_inner()));
            for (id, event) in done {
                let result = match event {
                    BundleEvent::Split(residuals, returned, ways) => {
                        // Work split off a running bundle: schedule it under that bundle's hold.
                        let Some(bundle) = st.in_flight.get_mut(&id) else { continue };
                        let cap = bundle.hold.clone();
                        // Elements handed back are not what the bundle's time was spent on.
                        bundle.elements = bundle.elements.saturating_sub(returned);
                        st.returned += returned;
                        if residuals.len() > returned {
                            st.cost.residual_seen();
                        }
                        // Input elements handed back by a split of a data
                        // channel (with, for a splittable DoFn, the residual
                        // of the element it was in) start at once, past the
                        // limit of bundles in flight, in `ways` bundles: the
                        // harness split because that many SDK workers have
                        // room for them now.
                        if returned > 0 && !sdk.stateful && !ctx.stopped() {
                            for part in even_parts(residuals, ways) {
                                submit(st, cap.clone(), part, vec![]);
                            }
                        } else {
                            st.pending.push_back((cap, residuals));
                        }
                        continue;
                    }
                    BundleEvent::Done(result) => result,
                };
                let Some(bundle) = st.in_flight.remove(&id) else { continue };
                st.cost.observe(bundle.elements, bundle.submitted.elapsed());
                let cap = bundle.hold;
                match result {
                    Ok(r) => {
                        ctx.count(stage_index, 0, 0, 1);
                        tracing::debug!(stage = %name, timers = ?r.timers.iter().map(|t| t.iter().map(|b| format!("{b:02x}")).collect::<String>()).collect::<Vec<_>>(), outputs = ?r.outputs.iter().map(|o| o.len()).collect::<Vec<_>>(), spilled = ?r.spilled.iter().map(|s| s.as_ref().map_or(0, |s| s.len)).collect::<Vec<_>>(), "bundle done");
                        // Outputs go downstream below, under the bundle's hold.
                        let mut spilled = r.spilled.into_iter();
                        for (port, bytes) in r.outputs.into_iter().enumerate() {
                            let spilled = spilled.next().flatten();
                            if (bytes.is_empty() && spilled.is_none()) || port >= sdk.outputs.len() {
                                continue;
                            }
                            match OutputReader::new(spilled, bytes) {
                                Ok(reader) => st.emitting.push_back(Emission { hold: cap.clone(), port, reader }),
                                Err(e) => ctx.fail(EngineError::BundleFailed {
                                    stage: ctx.graph.stages[stage_index].id.clone(),
                                    message: format!("cannot read a spilled bundle output back: {e}"),
                                }),
                            }
                        }
                        for (family, bytes) in r.timers.iter().enumerate() {
                            if let Err(message) = st.timers.apply(family, bytes) {
                                ctx.fail(EngineError::BadData { stage: name.clone(), pcollection: "timers".into(), message });
                            }
                        }
                        st.refresh_timer_hold(Some(&cap));
                        if !r.residuals.is_empty() {
                            st.cost.residual_seen();
                            // The residuals' watermark estimate holds the
                            // stage's output (not the bundle's input time),
                            // and a requested resume delay is waited out.
                            let cap = residual_hold(cap, r.residual_watermark);
                            // Drained, a residual resumes at once (truncated).
                            let drained = ctx.draining() && sdk.drain_descriptor_id.is_some();
                            match resume_at(wall_millis(), r.residual_delay_ms, resume_floor_ms, drained) {
                                Some(due) => st.delayed.push(due, cap, r.residuals),
                                None => st.pending.push_back((cap, r.residuals)),
                            }
                        }
                    }
                    Err(message) => ctx.fail(EngineError::BundleFailed { stage: ctx.graph.stages[stage_index].id.clone(), message }),
                }
            }
            // Completed bundles' outputs, at most EMIT_BYTES_PER_ACTIVATION
            // of them now: downstream (a GroupByKey that spills, say) takes
            // them before the next slice becomes elements.
            let mut budget = EMIT_BYTES_PER_ACTIVATION;
            while budget > 0 {
                let Some(em) = st.emitting.front_mut() else { break };
                let info = &ctx.graph.pcollections[sdk.outputs[em.port]];
                match em.reader.next(&info.value_coder, &info.window_coder, budget) {
                    Ok((elements, used)) => {
                        budget = budget.saturating_sub(used.max(1));
                        ctx.count(stage_index, 0, elements.len(), 0);
                        let port = em.port as u32;
                        output.session(&em.hold).give_iterator(elements.into_iter().map(|e| (port, e)));
                        if em.reader.is_done() {
                            st.emitting.pop_front();
                        }
                    }
                    Err(message) => {
                        ctx.fail(EngineError::BadData { stage: name.clone(), pcollection: info.id.clone(), message });
                        st.emitting.pop_front();
                    }
                }
            }
            if !st.emitting.is_empty() {
                wakeup.activate();
            }
            if ctx.stopped() {
                return;
            }
            // Draining: residuals waiting to resume later (sources polling
            // for more) resume at once through the drain descriptor, where
            // the DoFn's `truncate_restriction` decides what is left of them;
            // a stage without one drops them, so the sources finish.
            if ctx.draining() && !st.delayed.is_empty() {
                let delayed = st.delayed.take_all();
                if sdk.drain_descriptor_id.is_some() {
                    st.pending.extend(delayed);
                }
            }
            // Residuals whose resume delay has passed become pending work.
            if !st.delayed.is_empty() {
                let now = wall_millis();
                st.pending.extend(st.delayed.take_due(now));
                if let Some(next) = st.delayed.next_due() {
                    wakeup.activate_after(Duration::from_millis((next - now).max(1) as u64));
                }
            }
            let sorted_waiting = sorted.as_ref().map_or(0, TimeSorted::len);
            // Streaming: side windows no main element may read any more go.
            if expiring_sides {
                let main_info = &ctx.graph.pcollections[sdk.input];
                let evicted = evict_expired(
                    st,
                    &sides,
                    &side_lateness,
                    main_info,
                    watermark_of(frontier.frontier().as_ref()),
                    side_frontier.frontier().as_ref(),
                );
                if evicted > 0 {
                    tracing::debug!(stage = %name, evicted, "expired side windows evicted");
                }
            }
            let status = |st: &State, waiting_for_side_inputs: bool| StageStatus {
                watermark: (!frontier.is_empty()).then(|| watermark_of(frontier.frontier().as_ref())),
                in_flight: st.in_flight.len(),
                pending: st.pending.iter().map(|(_, e)| e.len()).sum(),
                delayed: st.delayed.elements(),
                timers: st.timers.len(),
                windows: 0,
                waiting_for_side_inputs: waiting_for_side_inputs || !st.held_back.is_empty(),
                held_back: st.held_back.iter().map(|(_, e)| e.len()).sum::<usize>()
                    + sorted_waiting,
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
                let pending_timers = st.timers.len();
                let fired = st.timers.take_ready(|event_time, fire| {
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
                    // Rounds that did not bring the pending timers to a new
                    // low: a key with many timers takes a round per
                    // timestamp and drains; a re-arming loop never does.
                    if pending_timers < st.fewest_pending_timers {
                        st.fewest_pending_timers = pending_timers;
                    } else {
                        st.timer_rounds += 1;
                    }
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
            st.refresh_timer_hold(None);
            // Garbage-collects the user state of expired windows (see
            // BundleProcessor::user_state_expired): only while the stage is
            // idle (no bundle reads or writes state meanwhile), and at the
            // input watermark held back to the earliest hold of the pending
            // timers, so timers of a window (their hold is in the window) run
            // with its state before it goes. Again only when that moved. The
            // cells are those of the transforms reading the stage input: a
            // stateful DoFn always starts a stage (fusion), so they hold every
            // stateful transform of it, and the input's window coder and
            // allowed lateness are theirs.
            if sdk.stateful && ctx.graph.streaming && st.pending.is_empty() && st.in_flight.is_empty() && st.delayed.is_empty() {
                let watermark = watermark_of(frontier.frontier().as_ref());
                let gc = st.timers.min_hold().map_or(watermark, |hold| hold.min(watermark));
                if gc > st.state_expired_to {
                    st.state_expired_to = gc;
                    let input = &ctx.graph.pcollections[sdk.input];
                    let removed = user_state.expire(
                        &sdk.residual_transform_ids,
                        &input.window_coder,
                        input.windowing.allowed_lateness_ms,
                        gc,
                    );
                    if removed > 0 {
                        tracing::debug!(stage = %name, removed, watermark = gc.millis(), "expired user state");
                    }
                    ctx.processor.user_state_expired(stage_index, gc, removed, user_state.usage());
                }
            }
            // Restrictions of a splittable DoFn: one bundle or small ones
            // (see BundleLimits::for_stage).
            let pending: usize = if sdk.splittable { st.pending.iter().map(|(_, e)| e.len()).sum() } else { 0 };
            let limits = BundleLimits::for_stage(sdk.splittable, one_bundle, pending, st.cost.min_elements(), &ctx.config);
            while st.in_flight.len() < max_in_flight {
                let Some((cap, elements)) = cut_bundle(&mut st.pending, limits) else { break };
                if elements.is_empty() {
                    continue;
                }
                submit(st, cap, elements, vec![]);
            }
            let waiting: usize = st.pending.iter().map(|(_, e)| e.len()).sum();
            backlog.store(waiting, std::sync::atomic::Ordering::Relaxed);
            ctx.report(stage_index, worker_index, status(st, false));
        }
    })
}
