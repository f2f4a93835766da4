//! An SDK stage's side inputs: what to materialize of each, and (streaming)
//! when held-back main-input elements may go.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use timely::scheduling::SyncActivator;
use weir_graph::{SdkStage, SideWindowFn, StageGraph};
use weir_model::windowed_value::decode_windows;
use weir_model::Timestamp;

use super::state::{SdkState, WindowedElement};
use crate::operators::Element;
use crate::side_input::{mapped_window, side_ready, Refresh, SideInputSpec, SideInputs, SideProgress};
use crate::time::{last_time_at, watermark_of, Hold, Time};

/// A batch stage's materialized side inputs, shared by the timely workers of
/// one process: the first worker of the process (its leader) builds them
/// and publishes them here, and the others take them, so a process holds
/// one copy of a side input, not one per worker. Keyed by stage index.
#[derive(Default)]
pub(crate) struct SharedSides {
    slots: Mutex<HashMap<usize, Slot>>,
}

#[derive(Default)]
struct Slot {
    /// The published side inputs and how many workers have yet to take them.
    ready: Option<(Arc<SideInputs>, usize)>,
    /// Workers that looked before the leader published: woken then.
    waiting: Vec<Arc<SyncActivator>>,
}

impl SharedSides {
    /// Publishes stage `stage`'s side inputs for `takers` other workers and
    /// wakes those already waiting.
    pub(crate) fn publish(&self, stage: usize, sides: Arc<SideInputs>, takers: usize) {
        let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        let slot = slots.entry(stage).or_default();
        for w in slot.waiting.drain(..) {
            let _ = w.activate();
        }
        if takers == 0 {
            slots.remove(&stage);
        } else {
            slot.ready = Some((sides, takers));
        }
    }

    /// Stage `stage`'s side inputs once published (the slot goes when the
    /// last worker took them); else `None`, and `wake` is activated when
    /// they are.
    pub(crate) fn take(&self, stage: usize, wake: &Arc<SyncActivator>) -> Option<Arc<SideInputs>> {
        let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        let slot = slots.entry(stage).or_default();
        let Some((sides, left)) = slot.ready.as_mut() else {
            slot.waiting.push(wake.clone());
            return None;
        };
        let sides = sides.clone();
        *left -= 1;
        if *left == 0 {
            slots.remove(&stage);
        }
        Some(sides)
    }
}

/// Views of `sides` with no data yet.
pub(super) fn empty_views(sides: &[SideSpec<'_>]) -> SideInputs {
    SideInputs::new(&sides.iter().map(|s| s.0).collect::<Vec<_>>())
}

/// A side input of an SDK stage: what to materialize, its WindowFn, and
/// whether its trigger is not the default one.
pub(super) type SideSpec<'a> = (SideInputSpec<'a>, weir_graph::SideWindowFn, bool);

/// The side inputs of `sdk`, in `sdk.side_inputs` order: what to
/// materialize of each, its WindowFn, and whether its trigger is not the
/// default one.
pub(super) fn side_specs<'a>(sdk: &'a SdkStage, graph: &'a StageGraph) -> Vec<SideSpec<'a>> {
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
/// pending queue under their holds; the others stay held back, their holds
/// moved as [`held_back_hold`] says. Does nothing before the side inputs
/// exist.
pub(super) fn release_ready<H: Hold>(
    st: &mut SdkState<H>,
    sides: &[SideSpec<'_>],
    side_frontier: &[Time],
) {
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
    for (hold, elements) in std::mem::take(&mut st.held_back) {
        let (go, wait): (Vec<_>, Vec<_>) = elements
            .into_iter()
            .partition(|(windows, _)| ready(windows));
        if !go.is_empty() {
            st.pending
                .push_back((hold.clone(), go.into_iter().map(|(_, e)| e).collect()));
        }
        if wait.is_empty() {
            continue;
        }
        st.held_back.push((held_back_hold(hold, side_min), wait));
    }
}

/// Streaming: evicts the side windows no main-input element of the stage
/// may read any more, so a long-running job holds only live side windows
/// (Beam's window expiry, as for user state). Fixed or sliding side window
/// `W` of side input `i` goes once
/// * the main input's watermark has passed `W`'s max timestamp plus the
///   main input's allowed lateness,
/// * the side input's watermark has passed it plus its own
///   (`side_lateness_ms[i]`; later side data of `W` is ignored), and
/// * every window of the elements and timers at the stage (held back,
///   pending, delayed, pending timers, and the elements and fired timers
///   of bundles in flight) ends after `W`.
///
/// Under Beam's default window mappings a main window maps to a side window
/// ending no earlier than itself, so a main element arriving later that
/// would read `W` is in an expired window: [`drop_evicted`] drops that
/// window of it before its bundle, as Beam allows for expired data.
/// Returns how many windows went.
pub(super) fn evict_expired<H: Hold>(
    st: &mut SdkState<H>,
    sides: &[SideSpec<'_>],
    side_lateness_ms: &[i64],
    main: &weir_graph::PCollectionInfo,
    main_watermark: Timestamp,
    side_frontier: &[Time],
) -> usize {
    let Some(live) = st.side_inputs.as_ref() else {
        return 0;
    };
    let expired = main_watermark.saturating_sub_millis(main.windowing.allowed_lateness_ms);
    let side_watermark = watermark_of(side_frontier);
    // Each expiring side input's bound from the watermarks alone, where it
    // holds a window ending before it: most calls stop here.
    let bounds: Vec<(&SideInputSpec<'_>, Timestamp, Timestamp)> = sides
        .iter()
        .zip(side_lateness_ms)
        .filter(|((_, window_fn, _), _)| window_fn.expires())
        .filter_map(|((spec, _, _), lateness)| {
            let before = expired.min(side_watermark.saturating_sub_millis(*lateness));
            let earliest = live.earliest_window_end(spec.transform_id, spec.local_name)?;
            (earliest < before).then_some((spec, before, earliest))
        })
        .collect();
    let Some(enough) = bounds.iter().map(|(_, _, earliest)| *earliest).min() else {
        return 0;
    };
    let floor = stage_floor(st, main, enough);
    let live = st.side_inputs.as_mut().expect("checked above");
    let mut evicted = 0;
    for (spec, before, earliest) in bounds {
        let before = before.min(floor);
        if earliest < before {
            evicted += Arc::make_mut(live).evict_before(spec, before);
        }
    }
    evicted
}

/// The earliest max timestamp of the windows of the elements and timers at
/// the stage (in flight, pending timers, held back, pending, delayed), or
/// some value at or below `enough` once one is found: below that nothing is
/// evicted anyway.
fn stage_floor<H: Hold>(st: &SdkState<H>, main: &weir_graph::PCollectionInfo, enough: Timestamp) -> Timestamp {
    let mut floor = st.in_flight.values().map(|b| b.earliest_window_end).min().unwrap_or(Timestamp(i64::MAX));
    floor = floor.min(st.timers.earliest_window_end());
    let held = st.held_back.iter().flat_map(|(_, elements)| elements.iter().flat_map(|(windows, _)| windows));
    for w in held {
        if floor <= enough {
            return floor;
        }
        floor = floor.min(w.max_timestamp());
    }
    for e in st.pending.iter().flat_map(|(_, e)| e).chain(st.delayed.iter()) {
        if floor <= enough {
            return floor;
        }
        floor = floor.min(earliest_window_end(main, [e]));
    }
    floor
}

/// The earliest max timestamp of the windows of `elements` (encoded
/// windowed values of `info`); MAX when none has a window that decodes.
pub(super) fn earliest_window_end<'a>(
    info: &weir_graph::PCollectionInfo,
    elements: impl IntoIterator<Item = &'a Element>,
) -> Timestamp {
    elements
        .into_iter()
        .filter_map(|e| windows_of(info, e))
        .flatten()
        .map(|w| w.max_timestamp())
        .min()
        .unwrap_or(Timestamp(i64::MAX))
}

/// The earliest window end a bundle keeps at the stage while it runs
/// ([`super::state::InFlight::earliest_window_end`]): of its `elements`
/// (encoded windowed values of `info`) and of the `fired` timers it runs
/// (per family, read by the stage's `timers`), since its residuals,
/// handed-back elements and new timers come back in those windows.
pub(super) fn bundle_window_end(
    info: &weir_graph::PCollectionInfo,
    elements: &[Element],
    timers: &crate::timers::TimerStore,
    fired: &[Vec<u8>],
) -> Timestamp {
    earliest_window_end(info, elements).min(timers.fired_window_end(fired))
}

/// The windows of `element` (an encoded windowed value of `info`), read
/// without its pane or value; None when they do not decode.
fn windows_of(info: &weir_graph::PCollectionInfo, element: &[u8]) -> Option<Vec<weir_model::Window>> {
    let (_, at) = Timestamp::decode(element).ok()?;
    decode_windows(&info.window_coder, &element[at..]).ok().map(|(windows, _)| windows)
}

/// Takes out of `elements` (encoded windowed values of `info`, about to go
/// out in a bundle) every window that maps to a side window `live` has
/// evicted ([`evict_expired`]: such a window arrived expired), dropping an
/// element left with none. Returns what is left and how many windows went.
/// An element that does not decode is kept (the SDK reports it).
pub(super) fn drop_evicted(
    info: &weir_graph::PCollectionInfo,
    sides: &[SideSpec<'_>],
    live: &SideInputs,
    elements: Vec<Element>,
) -> (Vec<Element>, usize) {
    let evicted: Vec<(SideWindowFn, Timestamp)> = sides
        .iter()
        .filter_map(|(spec, window_fn, _)| {
            Some((*window_fn, live.evicted_before(spec.transform_id, spec.local_name)?))
        })
        .collect();
    if evicted.is_empty() {
        return (elements, 0);
    }
    let live_window = |w: &weir_model::Window| {
        evicted.iter().all(|(window_fn, before)| {
            mapped_window(*window_fn, w).is_none_or(|side| side.max_timestamp() >= *before)
        })
    };
    let mut dropped = 0;
    let kept = elements
        .into_iter()
        .filter_map(|e| {
            // Most elements keep every window: their value is not decoded.
            if windows_of(info, &e).is_none_or(|windows| windows.iter().all(live_window)) {
                return Some(e);
            }
            let Ok((mut wv, _)) = weir_model::WindowedValue::decode(&info.value_coder, &info.window_coder, &e) else {
                return Some(e);
            };
            let before = wv.windows.len();
            wv.windows.retain(live_window);
            dropped += before - wv.windows.len();
            if wv.windows.is_empty() {
                return None;
            }
            let mut out = Vec::with_capacity(e.len());
            wv.encode(&mut out);
            Some(out)
        })
        .collect();
    (kept, dropped)
}

/// `elements` (encoded windowed values of `info`) with their windows, for
/// the wait for side windows; an element that does not decode gets none and
/// runs at once (the SDK reports it).
pub(super) fn with_windows(info: &weir_graph::PCollectionInfo, elements: Vec<Element>) -> Vec<WindowedElement> {
    elements
        .into_iter()
        .map(|e| {
            let windows = weir_model::WindowedValue::decode(&info.value_coder, &info.window_coder, &e)
                .map(|(wv, _)| wv.windows)
                .unwrap_or_default();
            (windows, e)
        })
        .collect()
}

/// The hold of main-input elements still waiting for their side windows,
/// held at `hold`, when the side inputs' frontier starts at `side_min`
/// (None: the side inputs are done). The hold moves up to the side
/// frontier within its own event time, so a TestStream waiting for the
/// pipeline to catch up with an event (its sequence number below the same
/// event time) can replay the next one, which may bring the side data; its
/// event time, and so the watermark it holds, never changes.
pub(super) fn held_back_hold<H: Hold>(hold: H, side_min: Option<Time>) -> H {
    let same_event_time = last_time_at(hold.hold_time());
    match side_min.map(|m| m.min(same_event_time)) {
        Some(t) if t > hold.hold_time() => hold.delayed_to(t),
        _ => hold,
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use weir_graph::SideInputKind;
    use weir_model::{Coder, PaneInfo, Window, WindowedValue};

    use super::*;
    use crate::operators::sdk_stage::state::WindowedElement;
    use crate::time::time_at;
    use crate::timers::TimerStore;

    fn interval(start: i64, end: i64) -> Window {
        Window::Interval {
            start: Timestamp(start),
            end: Timestamp(end),
        }
    }

    fn spec() -> SideSpec<'static> {
        (
            SideInputSpec {
                transform_id: "t",
                local_name: "side",
                kind: SideInputKind::Iterable,
                value_coder: &Coder::VarInt,
                window_coder: &Coder::IntervalWindow,
                refresh: Refresh::All,
            },
            SideWindowFn::Fixed {
                size_ms: 10,
                offset_ms: 0,
            },
            false,
        )
    }

    fn element(window: Window) -> WindowedElement {
        let mut bytes = Vec::new();
        WindowedValue {
            timestamp: Timestamp(0),
            windows: vec![window.clone()],
            pane: PaneInfo::NO_FIRING,
            value: vec![1],
        }
        .encode(&mut bytes);
        (vec![window], bytes)
    }

    fn state(held_back: Vec<(Time, Vec<WindowedElement>)>) -> SdkState<Time> {
        let mut st = SdkState::new(TimerStore::new(&[], None));
        st.side_inputs = Some(Arc::new(SideInputs::new(&[spec().0])));
        st.held_back = held_back;
        st
    }

    #[test]
    fn a_waiting_hold_moves_up_to_the_side_frontier_but_stays_in_its_event_time() {
        let hold = time_at(Timestamp(3)) | 2;
        assert_eq!(
            held_back_hold(hold, Some(time_at(Timestamp(3)) | 9)),
            time_at(Timestamp(3)) | 9
        );
        assert_eq!(
            held_back_hold(hold, Some(time_at(Timestamp(50)))),
            last_time_at(hold)
        );
        // A side frontier behind the hold, or none, leaves it where it is.
        assert_eq!(held_back_hold(hold, Some(time_at(Timestamp(1)))), hold);
        assert_eq!(held_back_hold(hold, None), hold);
    }

    #[test]
    fn elements_go_once_the_side_watermark_passes_their_side_window() {
        let hold = time_at(Timestamp(3));
        let early = element(interval(0, 10));
        let late = element(interval(10, 20));
        let mut st = state(vec![(hold, vec![early.clone(), late.clone()])]);
        // Side watermark 10: window [0, 10) is complete, [10, 20) is not.
        release_ready(&mut st, &[spec()], &[time_at(Timestamp(10))]);
        assert_eq!(st.pending, [(hold, vec![early.1])]);
        assert_eq!(st.held_back, vec![(last_time_at(hold), vec![late.clone()])]);
        // The side inputs are done: everything goes.
        release_ready(&mut st, &[spec()], &[]);
        assert_eq!(st.pending.len(), 2);
        assert_eq!(st.pending[1], (last_time_at(hold), vec![late.1]));
        assert!(st.held_back.is_empty());
    }

    /// Side data in windows [0, 10), [10, 20) and [20, 30).
    fn with_side_data(st: &mut SdkState<Time>) {
        for start in [0, 10, 20] {
            insert_side(st, &spec().0, interval(start, start + 10));
        }
    }

    /// Inserts a side element in `window` into the stage's live side inputs.
    fn insert_side(st: &mut SdkState<Time>, spec: &SideInputSpec<'_>, window: Window) {
        let live = Arc::make_mut(st.side_inputs.as_mut().unwrap());
        live.insert(spec, &element(window).1, 0).unwrap();
    }

    /// Whether the stage's live side inputs hold data in `window`.
    fn has_side(st: &SdkState<Time>, window: Window) -> bool {
        let mut wb = Vec::new();
        window.encode(&mut wb);
        st.side_inputs.as_ref().unwrap().has_window("t", "side", &wb)
    }

    fn live_windows(st: &SdkState<Time>) -> Vec<i64> {
        [0, 10, 20]
            .into_iter()
            .filter(|&start| has_side(st, interval(start, start + 10)))
            .collect()
    }

    fn main_info() -> weir_graph::PCollectionInfo {
        weir_graph::PCollectionInfo {
            id: "main".into(),
            value_coder: Coder::VarInt,
            window_coder: Coder::IntervalWindow,
            windowing: weir_graph::Windowing::global(),
        }
    }

    /// Timers of one event-time family in interval windows.
    fn interval_timers() -> TimerStore {
        let family = weir_graph::TimerFamily {
            transform_id: "t".into(),
            family_id: "f".into(),
            key_coder: Coder::StringUtf8,
            window_coder: Coder::IntervalWindow,
            event_time: true,
            fire_at_hold: false,
        };
        TimerStore::new(&[family], None)
    }

    /// A side window goes once both watermarks passed its end plus their
    /// allowed lateness and no element or timer at the stage (held back,
    /// pending, delayed, in flight, pending timers) has a window ending in
    /// or before it.
    #[test]
    fn side_windows_expire_behind_both_watermarks_and_the_stages_elements() {
        let evict = |st: &mut SdkState<Time>, main: i64, side: i64, lateness: (i64, i64)| {
            let side = [time_at(Timestamp(side))];
            let mut info = main_info();
            info.windowing.allowed_lateness_ms = lateness.0;
            evict_expired(st, &[spec()], &[lateness.1], &info, Timestamp(main), &side)
        };
        let mut st = state(vec![]);
        with_side_data(&mut st);
        // Main watermark 25, side 15: only [0, 10) is behind both.
        assert_eq!(evict(&mut st, 25, 15, (0, 0)), 1);
        assert_eq!(live_windows(&st), [10, 20]);
        // The side input's allowed lateness of 6 keeps [10, 20) at side watermark 25.
        assert_eq!(evict(&mut st, 40, 25, (0, 6)), 0);
        // The main input's, likewise.
        assert_eq!(evict(&mut st, 25, 40, (6, 0)), 0);
        // An element of window [10, 20) at the stage keeps [10, 20) and
        // [20, 30), wherever it waits.
        let (hold, waiting) = (time_at(Timestamp(12)), element(interval(10, 20)));
        st.held_back = vec![(hold, vec![waiting.clone()])];
        assert_eq!(evict(&mut st, 40, 40, (0, 0)), 0);
        st.held_back.clear();
        st.pending.push_back((hold, vec![waiting.1.clone()]));
        assert_eq!(evict(&mut st, 40, 40, (0, 0)), 0);
        st.pending.clear();
        st.delayed.push(0, hold, vec![waiting.1.clone()]);
        assert_eq!(evict(&mut st, 40, 40, (0, 0)), 0);
        st.delayed.clear();
        let in_flight = |end: i64| super::super::state::InFlight {
            hold,
            submitted: std::time::Instant::now(),
            elements: 1,
            earliest_window_end: Timestamp(end),
        };
        st.in_flight.insert(0, in_flight(19));
        assert_eq!(evict(&mut st, 40, 40, (0, 0)), 0);
        assert_eq!(live_windows(&st), [10, 20]);
        // A pending timer of window [10, 20) keeps it too.
        st.in_flight.insert(0, in_flight(35));
        st.timers = interval_timers();
        st.timers.set_window_expiration(0, b"\x01a", &interval(10, 20), 0);
        assert_eq!(evict(&mut st, 40, 40, (0, 0)), 0);
        assert_eq!(live_windows(&st), [10, 20]);
        // Once it fired, and with a bundle in flight of later windows only,
        // both go.
        assert!(st.timers.take_ready(|_, _| true).is_some());
        assert_eq!(evict(&mut st, 40, 40, (0, 0)), 2);
        assert!(live_windows(&st).is_empty());
    }

    /// A bundle keeps the earliest window of its elements and of the timers
    /// it fires.
    #[test]
    fn a_bundle_keeps_the_windows_of_its_elements_and_fired_timers() {
        let info = main_info();
        let mut store = interval_timers();
        store.set_window_expiration(0, b"\x01a", &interval(0, 10), 0);
        let fired = store.take_ready(|_, _| true).unwrap();
        let later = element(interval(20, 30)).1;
        assert_eq!(bundle_window_end(&info, &[later.clone()], &store, &[]), Timestamp(29));
        assert_eq!(bundle_window_end(&info, &[later], &store, &fired), Timestamp(9), "the fired timer's window");
        assert_eq!(bundle_window_end(&info, &[], &store, &fired), Timestamp(9), "timers only");
        assert_eq!(bundle_window_end(&info, &[], &store, &[]), Timestamp(i64::MAX));
    }

    /// Global side windowing never expires.
    #[test]
    fn a_global_side_window_never_expires() {
        let mut st = state(vec![]);
        let global = (
            SideInputSpec { window_coder: &Coder::GlobalWindow, ..spec().0 },
            SideWindowFn::Global,
            false,
        );
        insert_side(&mut st, &global.0, Window::Global);
        assert_eq!(evict_expired(&mut st, &[global], &[0], &main_info(), Timestamp(i64::MAX), &[]), 0);
        assert!(has_side(&st, Window::Global));
    }

    /// Sliding side windows (size 20, every 10) go by their own ends.
    #[test]
    fn sliding_side_windows_expire_by_their_ends() {
        let sliding = (
            spec().0,
            SideWindowFn::Sliding { size_ms: 20, period_ms: 10, offset_ms: 0 },
            false,
        );
        let mut st = state(vec![]);
        for start in [-10, 0, 10] {
            insert_side(&mut st, &sliding.0, interval(start, start + 20));
        }
        // Watermarks at 20: [-10, 10) and [0, 20) have ended, [10, 30) has not.
        let at = [time_at(Timestamp(20))];
        assert_eq!(evict_expired(&mut st, &[sliding], &[0], &main_info(), Timestamp(20), &at), 2);
        let has = |start: i64| has_side(&st, interval(start, start + 20));
        assert_eq!((has(-10), has(0), has(10)), (false, false, true));
    }

    /// Sliding side windows with gaps (size 7 every 10): an on-time main
    /// element of [0, 10) reads the next side window, [10, 17), so it is
    /// kept while [0, 7) goes.
    #[test]
    fn a_main_window_in_a_gap_reads_the_next_side_window_and_is_kept() {
        let gaps = (
            spec().0,
            SideWindowFn::Sliding { size_ms: 7, period_ms: 10, offset_ms: 0 },
            false,
        );
        let mut st = state(vec![]);
        for start in [0, 10] {
            insert_side(&mut st, &gaps.0, interval(start, start + 7));
        }
        let waiting = element(interval(0, 10));
        st.pending.push_back((time_at(Timestamp(5)), vec![waiting.1.clone()]));
        let at = [time_at(Timestamp(8))];
        assert_eq!(evict_expired(&mut st, &[gaps], &[0], &main_info(), Timestamp(8), &at), 1);
        let (kept, dropped) = drop_evicted(&main_info(), &[gaps], st.side_inputs.as_ref().unwrap(), vec![waiting.1.clone()]);
        assert_eq!((kept, dropped), (vec![waiting.1], 0));
    }

    /// Before a bundle, a main element's windows that map to an evicted
    /// side window go (the element too when none is left); the rest stay
    /// as they were.
    #[test]
    fn windows_reading_an_evicted_side_window_are_dropped_before_the_bundle() {
        let mut st = state(vec![]);
        with_side_data(&mut st);
        assert_eq!(evict_expired(&mut st, &[spec()], &[0], &main_info(), Timestamp(20), &[time_at(Timestamp(20))]), 2);
        let info = main_info();
        let encode = |windows: Vec<Window>| {
            let mut bytes = Vec::new();
            WindowedValue { timestamp: Timestamp(0), windows, pane: PaneInfo::NO_FIRING, value: vec![1] }.encode(&mut bytes);
            bytes
        };
        let late = encode(vec![interval(5, 15)]);
        let live = encode(vec![interval(20, 30)]);
        let both = encode(vec![interval(5, 15), interval(20, 30)]);
        let (kept, dropped) = drop_evicted(
            &info,
            &[spec()],
            st.side_inputs.as_ref().unwrap(),
            vec![late, live.clone(), both, vec![0xff]],
        );
        assert_eq!(dropped, 2);
        assert_eq!(kept, [live.clone(), live, vec![0xff]], "[5, 15) went from the third; the last does not decode");
        // Nothing evicted: nothing is decoded or dropped.
        let fresh = state(vec![]);
        let (kept, dropped) = drop_evicted(&info, &[spec()], fresh.side_inputs.as_ref().unwrap(), vec![vec![0xff]]);
        assert_eq!((kept, dropped), (vec![vec![0xff]], 0));
    }

    #[test]
    fn nothing_is_released_before_the_side_inputs_exist() {
        let mut st = state(vec![(
            time_at(Timestamp(0)),
            vec![element(interval(0, 10))],
        )]);
        st.side_inputs = None;
        release_ready(&mut st, &[spec()], &[]);
        assert!(st.pending.is_empty());
        assert_eq!(st.held_back.len(), 1);
    }

    /// The builder's side inputs reach every other worker of the process,
    /// whether it looked before or after they were published; a worker that
    /// looked early is woken; the slot goes once the last one took them.
    #[test]
    fn shared_side_inputs_reach_every_worker_once_published() {
        timely::execute_directly(|worker| {
            let shared = SharedSides::default();
            let early = Arc::new(worker.sync_activator_for(vec![0]));
            let late = Arc::new(worker.sync_activator_for(vec![1]));
            assert!(shared.take(7, &early).is_none(), "nothing published yet");
            let built = Arc::new(SideInputs::default());
            shared.publish(7, built.clone(), 2);
            let got = shared.take(7, &early).expect("published");
            assert!(Arc::ptr_eq(&got, &built), "the same copy, not a new one");
            assert!(shared.slots.lock().unwrap().contains_key(&7));
            assert!(Arc::ptr_eq(&shared.take(7, &late).unwrap(), &built));
            assert!(shared.slots.lock().unwrap().is_empty(), "the slot goes with the last taker");
            // A process of one worker: nothing is kept.
            shared.publish(8, built.clone(), 0);
            assert!(shared.slots.lock().unwrap().is_empty());
            assert_eq!(Arc::strong_count(&built), 2, "only `built` and `got` hold it");
        });
    }
}
