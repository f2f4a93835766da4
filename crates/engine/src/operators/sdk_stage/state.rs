//! The per-operator state of an SDK stage, and its timer hold.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use weir_model::Timestamp;

use super::bundles::ElementCost;
use super::residuals::DelayedResiduals;
use crate::operators::Element;
use crate::outputs::OutputReader;
use crate::side_input::SideInputs;
use crate::time::{last_time_at, time_at, Hold};
use crate::timers::TimerStore;

/// A main-input element with its windows (decoded once, for readiness checks).
pub(super) type WindowedElement = (Vec<weir_model::Window>, Element);

/// Per-operator state of an SDK stage; `H` is the hold type (a timely
/// capability).
pub(super) struct SdkState<H> {
    /// Elements waiting for a bundle, each chunk under its hold, in order.
    pub(super) pending: VecDeque<(H, Vec<Element>)>,
    /// Residuals waiting out their requested resume delay.
    pub(super) delayed: DelayedResiduals<H>,
    /// Bundles at SDK harnesses, by bundle id.
    pub(super) in_flight: HashMap<u64, InFlight<H>>,
    /// The stage's wall time per input element, from finished bundles
    /// (sizes a splittable stage's bundles).
    pub(super) cost: ElementCost,
    /// The id of the next bundle.
    pub(super) next_bundle: u64,
    /// Input elements handed back by splits of the data channel and not yet
    /// sent again: they were counted as stage input when first sent.
    pub(super) returned: usize,
    /// Batch, on the worker that builds the process's side inputs (see
    /// `SharedSides`): the side inputs so far, until their data is done.
    pub(super) side_building: Option<SideInputs>,
    /// The materialized side inputs; None while a batch stage still waits
    /// for them.
    pub(super) side_inputs: Option<Arc<SideInputs>>,
    /// Streaming: main-input elements (with their windows) held back until
    /// the side windows they map to are ready, under their holds.
    pub(super) held_back: Vec<(H, Vec<WindowedElement>)>,
    /// Streaming: the side-input generation bundles start with.
    pub(super) side_generation: SideGeneration,
    /// Pending timers (stateful stages), and the hold that keeps the stage
    /// alive while any are pending.
    pub(super) timers: TimerStore,
    pub(super) timer_hold: Option<H>,
    /// Rounds of timer firings so far that did not bring the pending timers
    /// to a new low (a re-arming loop), and that low.
    pub(super) timer_rounds: u64,
    pub(super) fewest_pending_timers: usize,
    /// The watermark user state was last garbage-collected at.
    pub(super) state_expired_to: Timestamp,
    /// Outputs of completed bundles not yet given downstream, in order.
    pub(super) emitting: VecDeque<Emission<H>>,
}

/// A bundle at an SDK harness.
pub(super) struct InFlight<H> {
    /// Its hold: its outputs and residuals go downstream under it.
    pub(super) hold: H,
    /// When it was submitted.
    pub(super) submitted: std::time::Instant,
    /// Its input elements, less those a split handed back: what its time
    /// was spent on.
    pub(super) elements: usize,
    /// The earliest max timestamp of its elements' and fired timers'
    /// windows, which its residuals, handed-back elements and new timers
    /// keep (streaming stages whose side windows expire, see
    /// `sides::evict_expired`; else MAX).
    pub(super) earliest_window_end: Timestamp,
}

/// One output stream of a completed bundle, given downstream a slice per
/// activation (so a large output is not turned into elements all at once).
pub(super) struct Emission<H> {
    /// The completed bundle's hold: downstream waits for what is left.
    pub(super) hold: H,
    /// The output port (index into `SdkStage::outputs`).
    pub(super) port: usize,
    /// The stream's encoded windowed values not given yet.
    pub(super) reader: OutputReader,
}

impl<H> SdkState<H> {
    /// The state of a stage with `timers` pending timers (none yet):
    /// nothing pending, in flight or held.
    pub(super) fn new(timers: TimerStore) -> Self {
        SdkState {
            pending: VecDeque::new(),
            delayed: DelayedResiduals::default(),
            in_flight: HashMap::new(),
            cost: ElementCost::default(),
            next_bundle: 0,
            returned: 0,
            side_building: None,
            side_inputs: None,
            held_back: Vec::new(),
            side_generation: SideGeneration::default(),
            timers,
            timer_hold: None,
            timer_rounds: 0,
            fewest_pending_timers: usize::MAX,
            state_expired_to: Timestamp(i64::MIN),
            emitting: VecDeque::new(),
        }
    }
}

impl<H: Hold> SdkState<H> {
    /// Keeps the stage's timer hold at the earliest hold timestamp of its
    /// pending timers (see [`timer_hold`]); `bundle` is the hold of a bundle
    /// that just completed, if any.
    pub(super) fn refresh_timer_hold(&mut self, bundle: Option<&H>) {
        self.timer_hold = timer_hold(self.timer_hold.take(), bundle, self.timers.min_hold());
    }
}

/// The stage's timer hold, given its `current` one, the hold of a bundle
/// that just completed (`bundle`), and the earliest hold timestamp of its
/// pending timers (`min_hold`, None when no timer is pending: no hold). It
/// is never earlier than a hold it may use (the earlier of `current` and
/// `bundle`); None as well when there is neither.
///
/// The hold sits at the *last* timely time of its event time (the low 64
/// bits, a TestStream's event sequence, all ones): it holds the Beam
/// watermark at that event time all the same, but it is not "work before"
/// any TestStream event at that event time. A TestStream replays its next
/// event only once everything before its current time is done; a timer
/// held at the stream's current event time (e.g. set at exactly the
/// watermark) can only fire after the stream moves the watermark on, so
/// counting its hold as pending work would stall the job for good.
pub(super) fn timer_hold<H: Hold>(
    current: Option<H>,
    bundle: Option<&H>,
    min_hold: Option<Timestamp>,
) -> Option<H> {
    let min_hold = min_hold?;
    let base = match (current, bundle) {
        (Some(h), Some(c)) if c.hold_time() < h.hold_time() => c.clone(),
        (Some(h), _) => h,
        (None, Some(c)) => c.clone(),
        (None, None) => return None,
    };
    let at = last_time_at(base.hold_time().max(time_at(min_hold)));
    Some(base.delayed_to(at))
}

/// The side-input generation of a streaming stage (see
/// `BundleRequest::side_input_generation`): bumped when a global-window side
/// input changes after a bundle used the current generation, so SDK
/// harnesses do not serve the stale value from their cache.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(super) struct SideGeneration {
    current: u64,
    used: bool,
}

impl SideGeneration {
    /// A global-window side input got new data: a new generation if a
    /// bundle used the current one.
    pub(super) fn global_side_changed(&mut self) {
        if self.used {
            self.current += 1;
            self.used = false;
        }
    }

    /// The generation a bundle starting now runs with (marked used).
    pub(super) fn for_bundle(&mut self) -> u64 {
        self.used = true;
        self.current
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::time::Time;

    const LOW_BITS: Time = u64::MAX as Time;

    #[test]
    fn no_pending_timer_means_no_timer_hold() {
        let current: Time = time_at(Timestamp(3));
        assert_eq!(timer_hold(Some(current), Some(&current), None), None);
    }

    #[test]
    fn a_timer_hold_needs_a_hold_to_start_from() {
        assert_eq!(timer_hold::<Time>(None, None, Some(Timestamp(5))), None);
    }

    #[test]
    fn the_timer_hold_sits_at_the_last_time_of_the_earliest_timer_hold() {
        let bundle: Time = time_at(Timestamp(2)) | 7;
        assert_eq!(
            timer_hold(None, Some(&bundle), Some(Timestamp(5))),
            Some(time_at(Timestamp(5)) | LOW_BITS)
        );
    }

    #[test]
    fn the_timer_hold_starts_from_the_earlier_of_the_current_and_bundle_holds() {
        let current: Time = time_at(Timestamp(8));
        let bundle: Time = time_at(Timestamp(4));
        // A timer held at 6 can be held from the bundle (4), not from the current hold (8).
        assert_eq!(
            timer_hold(Some(current), Some(&bundle), Some(Timestamp(6))),
            Some(time_at(Timestamp(6)) | LOW_BITS)
        );
        // A later bundle does not replace the current hold.
        let later: Time = time_at(Timestamp(9));
        assert_eq!(
            timer_hold(Some(current), Some(&later), Some(Timestamp(6))),
            Some(time_at(Timestamp(8)) | LOW_BITS)
        );
    }

    #[test]
    fn the_timer_hold_never_moves_back_before_its_base() {
        let current: Time = time_at(Timestamp(8)) | 2;
        assert_eq!(
            timer_hold(Some(current), None, Some(Timestamp(1))),
            Some(time_at(Timestamp(8)) | LOW_BITS)
        );
    }

    #[test]
    fn a_side_generation_moves_on_only_after_a_bundle_used_it() {
        let mut generation = SideGeneration::default();
        generation.global_side_changed();
        assert_eq!(generation.for_bundle(), 0);
        assert_eq!(generation.for_bundle(), 0);
        generation.global_side_changed();
        generation.global_side_changed();
        assert_eq!(generation.for_bundle(), 1);
        generation.global_side_changed();
        assert_eq!(generation.for_bundle(), 2);
    }
}
