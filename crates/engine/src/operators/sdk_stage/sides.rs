//! An SDK stage's side inputs: what to materialize of each, and (streaming)
//! when held-back main-input elements may go.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use timely::scheduling::SyncActivator;
use weir_graph::{SdkStage, StageGraph};

use super::state::{SdkState, WindowedElement};
use crate::operators::Element;
use crate::side_input::{side_ready, Refresh, SideInputSpec, SideInputs, SideProgress};
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

    use weir_graph::{SideInputKind, SideWindowFn};
    use weir_model::{Coder, PaneInfo, Timestamp, Window, WindowedValue};

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
