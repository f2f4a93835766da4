//! Scheduling the residuals a bundle returns (the unprocessed parts of
//! splittable-DoFn elements): their hold and their resume delay.

use weir_model::Timestamp;

use crate::operators::Element;
use crate::time::{time_at, Hold};

/// The hold residuals of a bundle held at `bundle` resume under: their
/// output watermark estimate `residual_watermark` when it is later than the
/// bundle's time (the residuals then hold the stage's output there, not at
/// the bundle's input time), else the bundle's hold.
pub(super) fn residual_hold<H: Hold>(bundle: H, residual_watermark: Option<Timestamp>) -> H {
    match residual_watermark {
        Some(wm) if time_at(wm) > bundle.hold_time() => bundle.delayed_to(time_at(wm)),
        _ => bundle,
    }
}

/// When (wall-clock ms since the epoch) residuals asking for a resume delay
/// of `delay_ms` may run, at wall-clock time `now_ms`: after the delay, and
/// no sooner than `floor_ms` (`EngineConfig::min_resume_delay`); None: at
/// once (no delay asked, or the job is `drained` and the stage resumes them
/// through its drain descriptor).
pub(super) fn resume_at(now_ms: i64, delay_ms: i64, floor_ms: i64, drained: bool) -> Option<i64> {
    (delay_ms > 0 && !drained).then(|| now_ms.saturating_add(delay_ms.max(floor_ms)))
}

/// Residuals waiting out their requested resume delay, each batch under
/// its hold, in the order they came back.
pub(super) struct DelayedResiduals<H> {
    /// (wall-clock ms when due, hold, elements).
    waiting: Vec<(i64, H, Vec<Element>)>,
}

impl<H> Default for DelayedResiduals<H> {
    fn default() -> Self {
        DelayedResiduals {
            waiting: Vec::new(),
        }
    }
}

impl<H> DelayedResiduals<H> {
    /// Adds `elements`, held at `hold`, due at wall-clock ms `due`.
    pub(super) fn push(&mut self, due: i64, hold: H, elements: Vec<Element>) {
        self.waiting.push((due, hold, elements));
    }

    /// Whether no residual waits.
    pub(super) fn is_empty(&self) -> bool {
        self.waiting.is_empty()
    }

    /// How many residual elements wait.
    pub(super) fn elements(&self) -> usize {
        self.waiting.iter().map(|(_, _, e)| e.len()).sum()
    }

    /// Every waiting residual element, in order.
    pub(super) fn iter(&self) -> impl Iterator<Item = &Element> {
        self.waiting.iter().flat_map(|(_, _, e)| e)
    }

    /// Drops every waiting residual (and its hold).
    pub(super) fn clear(&mut self) {
        self.waiting.clear();
    }

    /// Takes every waiting residual, due or not, in order.
    pub(super) fn take_all(&mut self) -> Vec<(H, Vec<Element>)> {
        std::mem::take(&mut self.waiting)
            .into_iter()
            .map(|(_, hold, elements)| (hold, elements))
            .collect()
    }

    /// Takes the residuals due at wall-clock ms `now` (due at or before
    /// it), in order; the others keep waiting.
    pub(super) fn take_due(&mut self, now: i64) -> Vec<(H, Vec<Element>)> {
        let (due, waiting): (Vec<_>, Vec<_>) = std::mem::take(&mut self.waiting)
            .into_iter()
            .partition(|(at, _, _)| *at <= now);
        self.waiting = waiting;
        due.into_iter()
            .map(|(_, hold, elements)| (hold, elements))
            .collect()
    }

    /// When the next waiting residual is due (wall-clock ms), if any waits.
    pub(super) fn next_due(&self) -> Option<i64> {
        self.waiting.iter().map(|(at, _, _)| *at).min()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::time::Time;

    #[test]
    fn residuals_hold_at_their_watermark_estimate_when_it_is_later() {
        let bundle: Time = time_at(Timestamp(10)) | 3;
        assert_eq!(
            residual_hold(bundle, Some(Timestamp(25))),
            time_at(Timestamp(25))
        );
        // An earlier (or equal) estimate cannot move the hold back.
        assert_eq!(residual_hold(bundle, Some(Timestamp(5))), bundle);
        assert_eq!(residual_hold(bundle, Some(Timestamp(10))), bundle);
        assert_eq!(residual_hold(bundle, None), bundle);
    }

    #[test]
    fn a_resume_delay_is_waited_out_unless_the_job_is_drained() {
        assert_eq!(resume_at(1_000, 250, 0, false), Some(1_250));
        assert_eq!(resume_at(1_000, 250, 0, true), None);
        assert_eq!(resume_at(1_000, 0, 0, false), None);
        assert_eq!(resume_at(1_000, -5, 0, false), None);
        assert_eq!(resume_at(i64::MAX - 1, 10, 0, false), Some(i64::MAX));
    }

    #[test]
    fn a_short_resume_delay_is_raised_to_the_floor_and_no_delay_stays_none() {
        // A source deferring by 1 ms waits the 10 ms floor; longer delays
        // are the source's own.
        assert_eq!(resume_at(1_000, 1, 10, false), Some(1_010));
        assert_eq!(resume_at(1_000, 250, 10, false), Some(1_250));
        // The floor never delays a checkpoint that asked for no delay, nor a
        // drained job's residuals. (Runner-initiated splits do not come
        // here: their residuals resume at once.)
        assert_eq!(resume_at(1_000, 0, 10, false), None);
        assert_eq!(resume_at(1_000, 1, 10, true), None);
    }

    #[test]
    fn due_residuals_leave_in_order_and_the_rest_keep_waiting() {
        let mut delayed: DelayedResiduals<Time> = DelayedResiduals::default();
        assert_eq!(delayed.next_due(), None);
        delayed.push(300, 1, vec![vec![1]]);
        delayed.push(100, 2, vec![vec![2], vec![2]]);
        delayed.push(200, 3, vec![vec![3]]);
        assert_eq!(delayed.elements(), 4);
        assert_eq!(delayed.next_due(), Some(100));
        assert_eq!(delayed.take_due(99), vec![]);
        assert_eq!(
            delayed.take_due(200),
            vec![(2, vec![vec![2], vec![2]]), (3, vec![vec![3]])]
        );
        assert_eq!(delayed.next_due(), Some(300));
        assert_eq!(delayed.elements(), 1);
        assert_eq!(delayed.take_all(), vec![(1, vec![vec![1]])]);
        assert!(delayed.is_empty());
    }
}
