//! Time-sorted input (`beam:requirement:pardo:time_sorted_input:v1`, Java's
//! `@RequiresTimeSortedInput`): a stateful stage's elements wait until the
//! input watermark passes their timestamp plus the allowed lateness, then
//! go to bundles in timestamp order (equal timestamps in arrival order).
//!
//! Bundles of a stateful stage run one at a time on each timely worker and
//! a key's elements all reach the same worker, so elements released in
//! timestamp order reach the DoFn in timestamp order per key.

use std::collections::BTreeMap;

use weir_model::Timestamp;

use crate::operators::Element;
use crate::time::{time_at, Hold, Time};

/// Elements waiting for the watermark, under one hold.
pub(super) struct TimeSorted<H> {
    /// (event timestamp, arrival number) -> element.
    waiting: BTreeMap<(Timestamp, u64), Element>,
    arrivals: u64,
    /// At or before the time every waiting element came in at, and never
    /// later than the least waiting timestamp when that is possible, so
    /// released elements are not late downstream.
    hold: Option<H>,
    /// `WindowingStrategy.allowed_lateness` of the input, in ms.
    lateness_ms: i64,
}

impl<H: Hold> TimeSorted<H> {
    /// An empty buffer for input with `lateness_ms` of allowed lateness.
    pub(super) fn new(lateness_ms: i64) -> Self {
        TimeSorted {
            waiting: BTreeMap::new(),
            arrivals: 0,
            hold: None,
            lateness_ms,
        }
    }

    /// Adds `elements` (with their event timestamps) that came in under
    /// `hold` at input watermark `watermark`; returns how many it dropped:
    /// those later than the allowed lateness (the watermark already past
    /// their timestamp plus it), which could only reach the DoFn after
    /// elements with later timestamps (Beam drops them, as Java's
    /// `StatefulDoFnRunner` does).
    pub(super) fn push(
        &mut self,
        hold: H,
        watermark: Timestamp,
        elements: impl IntoIterator<Item = (Timestamp, Element)>,
    ) -> usize {
        let mut dropped = 0;
        let mut kept = false;
        for (ts, e) in elements {
            if ts.saturating_add_millis(self.lateness_ms) < watermark {
                dropped += 1;
                continue;
            }
            self.waiting.insert((ts, self.arrivals), e);
            self.arrivals += 1;
            kept = true;
        }
        if kept && self.hold.as_ref().is_none_or(|h| hold.hold_time() < h.hold_time()) {
            self.hold = Some(hold);
        }
        dropped
    }

    /// How many elements wait.
    pub(super) fn len(&self) -> usize {
        self.waiting.len()
    }

    /// The elements whose timestamp plus the allowed lateness the input
    /// watermark `watermark` has passed (all of them once the input is
    /// done: `frontier` None), in timestamp order, under a hold no later
    /// than any of theirs; then moves the hold of what still waits to
    /// `frontier` (the input frontier's least time), or to its least
    /// timestamp when that is earlier, never back. None when none is ready.
    pub(super) fn release(&mut self, watermark: Timestamp, frontier: Option<Time>) -> Option<(H, Vec<Element>)> {
        let lateness = self.lateness_ms;
        let ready = |ts: &Timestamp| frontier.is_none() || ts.saturating_add_millis(lateness) < watermark;
        let mut out = Vec::new();
        while let Some(entry) = self.waiting.first_entry() {
            if !ready(&entry.key().0) {
                break;
            }
            out.push(entry.remove());
        }
        let released = (!out.is_empty()).then(|| self.hold.clone()).flatten().map(|h| (h, out));
        match self.waiting.keys().next() {
            None => self.hold = None,
            Some((least, _)) => {
                let target = frontier.map_or(time_at(*least), |f| f.min(time_at(*least)));
                if let Some(h) = self.hold.as_mut() {
                    if target > h.hold_time() {
                        *h = h.delayed_to(target);
                    }
                }
            }
        }
        released
    }

    /// Drops every waiting element and the hold (the job stopped).
    pub(super) fn clear(&mut self) {
        self.waiting.clear();
        self.hold = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn el(ts: i64) -> (Timestamp, Element) {
        (Timestamp(ts), ts.to_string().into_bytes())
    }

    fn values(elements: &[Element]) -> Vec<i64> {
        elements
            .iter()
            .map(|e| String::from_utf8(e.clone()).unwrap().parse().unwrap())
            .collect()
    }

    #[test]
    fn elements_wait_for_the_watermark_and_come_out_in_timestamp_order() {
        let mut s = TimeSorted::<Time>::new(0);
        s.push(time_at(Timestamp::MIN), Timestamp::MIN, [el(5), el(3), el(9), el(1)]);
        assert!(s.release(Timestamp::MIN, Some(time_at(Timestamp::MIN))).is_none());
        // The watermark at 5 releases 1 and 3 (passed), not 5 itself.
        let (hold, out) = s.release(Timestamp(5), Some(time_at(Timestamp(5)))).unwrap();
        assert_eq!(hold, time_at(Timestamp::MIN));
        assert_eq!(values(&out), [1, 3]);
        assert_eq!(s.len(), 2);
        // What waits holds at the frontier (5), its least timestamp.
        let (hold, out) = s.release(Timestamp(i64::MAX), None).unwrap();
        assert_eq!(hold, time_at(Timestamp(5)));
        assert_eq!(values(&out), [5, 9]);
        assert_eq!(s.len(), 0);
        assert!(s.hold.is_none());
    }

    #[test]
    fn batch_input_comes_out_sorted_when_the_input_is_done() {
        let mut s = TimeSorted::<Time>::new(0);
        for chunk in (0..1000i64).rev().collect::<Vec<_>>().chunks(7) {
            s.push(time_at(Timestamp::MIN), Timestamp::MIN, chunk.iter().map(|&t| el(t)));
            assert!(s.release(Timestamp::MIN, Some(time_at(Timestamp::MIN))).is_none());
        }
        let (_, out) = s.release(Timestamp(i64::MAX), None).unwrap();
        assert_eq!(values(&out), (0..1000).collect::<Vec<_>>());
    }

    #[test]
    fn equal_timestamps_keep_their_arrival_order() {
        let mut s = TimeSorted::<Time>::new(0);
        let a = (Timestamp(2), b"a".to_vec());
        let b = (Timestamp(2), b"b".to_vec());
        let c = (Timestamp(1), b"c".to_vec());
        s.push(time_at(Timestamp::MIN), Timestamp::MIN, [a, b, c]);
        let (_, out) = s.release(Timestamp(3), None).unwrap();
        assert_eq!(out, [b"c".to_vec(), b"a".to_vec(), b"b".to_vec()]);
    }

    #[test]
    fn allowed_lateness_delays_the_release_and_keeps_late_elements_in_order() {
        let mut s = TimeSorted::<Time>::new(5_000);
        s.push(time_at(Timestamp::MIN), Timestamp::MIN, [el(300), el(200)]);
        // Watermark 100: nothing has passed 200 + 5 s.
        assert!(s.release(Timestamp(100), Some(time_at(Timestamp(100)))).is_none());
        // Late (behind the watermark) but within the lateness: they wait too.
        assert_eq!(s.push(time_at(Timestamp(100)), Timestamp(100), [el(50), el(99)]), 0);
        assert!(s.release(Timestamp(5_050), Some(time_at(Timestamp(5_050)))).is_none());
        let (_, out) = s.release(Timestamp(5_250), Some(time_at(Timestamp(5_250)))).unwrap();
        assert_eq!(values(&out), [50, 99, 200]);
        let (_, out) = s.release(Timestamp(i64::MAX), None).unwrap();
        assert_eq!(values(&out), [300]);
    }

    #[test]
    fn elements_later_than_the_allowed_lateness_are_dropped() {
        let mut s = TimeSorted::<Time>::new(1_000);
        s.push(time_at(Timestamp::MIN), Timestamp::MIN, [el(5_000)]);
        // Watermark 3_000: 1_500 is late but within 1 s; 1_000 and 10 are not.
        let dropped = s.push(time_at(Timestamp(3_000)), Timestamp(3_000), [el(1_000), el(10), el(2_500)]);
        assert_eq!(dropped, 2);
        let (_, out) = s.release(Timestamp(i64::MAX), None).unwrap();
        assert_eq!(values(&out), [2_500, 5_000]);
        // Nothing kept: no hold taken.
        assert_eq!(s.push(time_at(Timestamp(9_000)), Timestamp(9_000), [el(1)]), 1);
        assert!(s.hold.is_none());
    }

    #[test]
    fn everything_goes_once_the_input_is_done_even_with_endless_lateness() {
        let mut s = TimeSorted::<Time>::new(i64::MAX);
        s.push(time_at(Timestamp::MIN), Timestamp::MIN, [el(7), el(3)]);
        assert!(s.release(Timestamp(100), Some(time_at(Timestamp(100)))).is_none());
        let (_, out) = s.release(Timestamp(i64::MAX), None).unwrap();
        assert_eq!(values(&out), [3, 7]);
    }

    #[test]
    fn the_hold_never_moves_back_and_never_passes_the_least_timestamp() {
        let mut s = TimeSorted::<Time>::new(0);
        s.push(time_at(Timestamp(10)), Timestamp(10), [el(40)]);
        // The frontier moved to 20: the hold follows it (below 40).
        assert!(s.release(Timestamp(20), Some(time_at(Timestamp(20)))).is_none());
        assert_eq!(s.hold, Some(time_at(Timestamp(20))));
        // A late element at 15 under a later hold: the hold stays at 20.
        s.push(time_at(Timestamp(30)), Timestamp(15), [el(15)]);
        assert!(s.release(Timestamp(15), Some(time_at(Timestamp(30)))).is_none());
        assert_eq!(s.hold, Some(time_at(Timestamp(20))));
        // The frontier far ahead: the hold goes no further than 40... once
        // 15 is out.
        let (hold, out) = s.release(Timestamp(35), Some(time_at(Timestamp(100)))).unwrap();
        assert_eq!((hold, values(&out)), (time_at(Timestamp(20)), vec![15]));
        assert_eq!(s.hold, Some(time_at(Timestamp(40))));
    }
}
