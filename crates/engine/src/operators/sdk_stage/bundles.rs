//! Cutting an SDK stage's pending elements into bundles.

use std::collections::VecDeque;
use std::time::Duration;

use crate::operators::Element;
use crate::time::Hold;
use crate::EngineConfig;

/// Bundles a batch of pending restrictions is cut into (see [`BundleLimits::for_stage`]).
const SPLITTABLE_BUNDLES_PER_BATCH: usize = 4;

/// The wall time a bundle of a splittable stage should take at least, once
/// the stage's cost per element is known: a smaller bundle is mostly the
/// SDK's fixed cost per bundle (a few ms of building or resetting its
/// processor, its state sampler, its metrics). Bounds the tail of bundles
/// at the end of a batch of restrictions too.
const MIN_SPLITTABLE_BUNDLE: Duration = Duration::from_millis(100);

/// A stage's wall time per input element, learned from its bundles that
/// finished (an even mix of the last estimate and the newest bundle), and
/// whether any of its elements was split (residual restrictions).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(super) struct ElementCost {
    per_element: Option<Duration>,
    split: bool,
}

impl ElementCost {
    /// Notes that an element of the stage left a residual (a split or a
    /// checkpoint): its restrictions differ in size, and a cost per element
    /// says little.
    pub(super) fn residual_seen(&mut self) {
        self.split = true;
    }

    /// Learns from a bundle of `elements` input elements that took `took`
    /// from submit to done; a bundle without input elements teaches nothing.
    pub(super) fn observe(&mut self, elements: usize, took: Duration) {
        if elements == 0 {
            return;
        }
        let newest = Duration::from_nanos(
            (took.as_nanos() / elements as u128).min(u128::from(u64::MAX)) as u64,
        );
        self.per_element = Some(match self.per_element {
            Some(old) => (old + newest) / 2,
            None => newest,
        });
    }

    /// The fewest elements a splittable stage's bundle should hold so that
    /// it takes about [`MIN_SPLITTABLE_BUNDLE`]: 1 while nothing is known,
    /// when an element takes that long, or once an element left a residual
    /// ([`ElementCost::residual_seen`]).
    pub(super) fn min_elements(&self) -> usize {
        if self.split {
            return 1;
        }
        match self.per_element {
            Some(d) if !d.is_zero() => {
                (MIN_SPLITTABLE_BUNDLE.as_nanos() / d.as_nanos()).max(1) as usize
            }
            Some(_) => usize::MAX,
            None => 1,
        }
    }
}

/// How large one bundle may grow.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct BundleLimits {
    /// Most elements in the bundle.
    pub(super) max_elements: usize,
    /// Most bytes in the bundle (summed encoded element sizes); a single
    /// larger element still forms a bundle.
    pub(super) max_bytes: usize,
}

impl BundleLimits {
    /// The limits for a stage's next bundles, with `pending` elements
    /// waiting. With `one_bundle` (a batch job whose SDK harnesses run a
    /// bundle on one core each, see
    /// [`crate::BundleProcessor::restrictions_in_one_bundle`]) the
    /// restrictions of a splittable DoFn pending on one timely worker go out
    /// as one bundle, as DirectRunner's workers run them: the SDK pays its
    /// per-bundle cost once (a combiner lifted into the stage flushes once,
    /// not once per restriction), and the harness layer splits the bundle
    /// for SDK workers that fall idle or leave their core partly idle (up
    /// to `config`'s element and byte limits). Otherwise they go out in small
    /// bundles (about a quarter of what is pending each, one when few are
    /// pending), so they spread over SDK workers, but never fewer than
    /// `min_elements` (see [`ElementCost::min_elements`]) while that many
    /// are pending. Other stages use `config`'s limits.
    ///
    /// Panics if `config.max_bundle_elements` is 0 for a splittable stage.
    pub(super) fn for_stage(
        splittable: bool,
        one_bundle: bool,
        pending: usize,
        min_elements: usize,
        config: &EngineConfig,
    ) -> Self {
        let max_elements = if splittable && !one_bundle {
            (pending / SPLITTABLE_BUNDLES_PER_BATCH)
                .max(min_elements.min(pending))
                .clamp(1, config.max_bundle_elements)
        } else {
            config.max_bundle_elements
        };
        BundleLimits {
            max_elements,
            max_bytes: config.max_bundle_bytes,
        }
    }
}

/// Takes the next bundle off the front of `pending` (chunks of elements
/// under their holds, in arrival order): elements of consecutive chunks held
/// at the same time, up to `limits`; what does not fit goes back to the
/// front under its hold. The bundle is empty when the first chunk is (or
/// when no element fits, with `max_elements` 0). None when nothing is
/// pending.
pub(super) fn cut_bundle<H: Hold>(
    pending: &mut VecDeque<(H, Vec<Element>)>,
    limits: BundleLimits,
) -> Option<(H, Vec<Element>)> {
    let (hold, first) = pending.pop_front()?;
    let mut elements: Vec<Element> = Vec::new();
    let mut bytes = 0;
    let mut chunk = first;
    loop {
        let mut take = 0;
        while take < chunk.len()
            && elements.len() + take < limits.max_elements
            && (elements.len() + take == 0 || bytes + chunk[take].len() <= limits.max_bytes)
        {
            bytes += chunk[take].len();
            take += 1;
        }
        let rest = chunk.split_off(take);
        elements.append(&mut chunk);
        if !rest.is_empty() {
            pending.push_front((hold.clone(), rest));
            break;
        }
        match pending.front() {
            Some((next, _)) if next.hold_time() == hold.hold_time() => {
                chunk = pending.pop_front().expect("front exists").1;
            }
            _ => break,
        }
    }
    Some((hold, elements))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::time::Time;

    fn limits(max_elements: usize, max_bytes: usize) -> BundleLimits {
        BundleLimits {
            max_elements,
            max_bytes,
        }
    }

    /// At most 100 elements or 4096 bytes a bundle.
    fn config() -> EngineConfig {
        EngineConfig {
            max_bundle_elements: 100,
            max_bundle_bytes: 4096,
            ..EngineConfig::default()
        }
    }

    fn elements(sizes: &[usize]) -> Vec<Element> {
        sizes.iter().map(|&n| vec![n as u8; n]).collect()
    }

    #[test]
    fn nothing_pending_cuts_no_bundle() {
        let mut pending: VecDeque<(Time, Vec<Element>)> = VecDeque::new();
        assert_eq!(cut_bundle(&mut pending, limits(10, 100)), None);
    }

    #[test]
    fn chunks_at_the_same_time_fill_one_bundle() {
        let mut pending = VecDeque::from([
            (5, elements(&[1, 1])),
            (5, elements(&[1])),
            (7, elements(&[1])),
        ]);
        let (hold, bundle) = cut_bundle(&mut pending, limits(10, 100)).unwrap();
        assert_eq!((hold, bundle.len()), (5, 3));
        assert_eq!(pending, VecDeque::from([(7, elements(&[1]))]));
    }

    #[test]
    fn the_element_limit_leaves_the_rest_at_the_front_under_its_hold() {
        let mut pending = VecDeque::from([(5, elements(&[1, 2, 3])), (5, elements(&[4]))]);
        let (hold, bundle) = cut_bundle(&mut pending, limits(2, 100)).unwrap();
        assert_eq!((hold, bundle), (5, elements(&[1, 2])));
        assert_eq!(
            pending,
            VecDeque::from([(5, elements(&[3])), (5, elements(&[4]))])
        );
        let (_, bundle) = cut_bundle(&mut pending, limits(2, 100)).unwrap();
        assert_eq!(bundle, elements(&[3, 4]));
        assert!(pending.is_empty());
    }

    #[test]
    fn the_byte_limit_counts_encoded_sizes_but_a_large_element_still_goes() {
        let mut pending = VecDeque::from([(1, elements(&[40, 50, 20]))]);
        let (_, bundle) = cut_bundle(&mut pending, limits(10, 100)).unwrap();
        assert_eq!(bundle, elements(&[40, 50]));
        let mut pending = VecDeque::from([(1, elements(&[200, 1]))]);
        let (_, bundle) = cut_bundle(&mut pending, limits(10, 100)).unwrap();
        assert_eq!(bundle, elements(&[200]));
        assert_eq!(pending, VecDeque::from([(1, elements(&[1]))]));
    }

    #[test]
    fn an_empty_chunk_cuts_an_empty_bundle() {
        let mut pending = VecDeque::from([(1, Vec::new()), (2, elements(&[1]))]);
        assert_eq!(cut_bundle(&mut pending, limits(10, 100)), Some((1, vec![])));
        assert_eq!(pending.len(), 1);
    }

    #[test]
    fn splittable_stages_cut_about_a_quarter_of_what_is_pending() {
        let config = config();
        let cases = [(0, 1), (3, 1), (40, 10), (10_000, 100)];
        for (pending, expected) in cases {
            assert_eq!(
                BundleLimits::for_stage(true, false, pending, 1, &config),
                limits(expected, 4096),
                "{pending} pending"
            );
        }
        assert_eq!(
            BundleLimits::for_stage(false, false, 3, 1, &config),
            limits(100, 4096)
        );
    }

    #[test]
    fn splittable_stages_with_one_bundle_send_what_is_pending_at_once() {
        let config = config();
        for (pending, minimum) in [(0, 1), (3, 1), (8, 1), (40, 25), (10_000, 1)] {
            assert_eq!(
                BundleLimits::for_stage(true, true, pending, minimum, &config),
                limits(100, 4096),
                "{pending} pending"
            );
        }
        // Eight restrictions pending: one bundle of all eight.
        let mut pending = VecDeque::from([(1, elements(&[9; 8]))]);
        let limits = BundleLimits::for_stage(true, true, 8, 1, &config);
        assert_eq!(cut_bundle(&mut pending, limits).map(|(_, b)| b.len()), Some(8));
        assert!(pending.is_empty());
    }

    #[test]
    fn a_splittable_stage_keeps_bundles_at_its_minimum_while_enough_are_pending() {
        let config = config();
        // (pending, minimum) -> most elements in the next bundle.
        let cases = [
            ((40, 25), 25),    // above a quarter of 40
            ((200, 25), 50),   // a quarter is more
            ((10, 25), 10),    // fewer pending than the minimum: all of them
            ((0, 25), 1),      // nothing pending
            ((400, 500), 100), // never above max_bundle_elements
        ];
        for ((pending, minimum), expected) in cases {
            assert_eq!(
                BundleLimits::for_stage(true, false, pending, minimum, &config),
                limits(expected, 4096),
                "{pending} pending, minimum {minimum}"
            );
        }
        // Only splittable stages have a minimum.
        assert_eq!(
            BundleLimits::for_stage(false, false, 3, 25, &config),
            limits(100, 4096)
        );
    }

    #[test]
    fn the_minimum_holds_about_100_ms_of_elements_once_their_cost_is_known() {
        let mut cost = ElementCost::default();
        assert_eq!(cost.min_elements(), 1, "nothing known yet");
        // 125 elements in 500 ms: 4 ms each, so 25 fill 100 ms.
        cost.observe(125, Duration::from_millis(500));
        assert_eq!(cost.min_elements(), 25);
        // A timers-only bundle (no input elements) teaches nothing.
        cost.observe(0, Duration::from_secs(9));
        assert_eq!(cost.min_elements(), 25);
        // The newest bundle weighs half: (4 ms + 12 ms) / 2 = 8 ms each.
        cost.observe(1, Duration::from_millis(12));
        assert_eq!(cost.min_elements(), 12);
        // An element that takes longer than 100 ms goes alone.
        let mut slow = ElementCost::default();
        slow.observe(2, Duration::from_secs(3));
        assert_eq!(slow.min_elements(), 1);
        // Once an element left a residual, bundles go back to the quarter rule.
        let mut split = ElementCost::default();
        split.observe(100, Duration::from_millis(100));
        assert_eq!(split.min_elements(), 100);
        split.residual_seen();
        assert_eq!(split.min_elements(), 1);
        // Elements too fast to measure: as many as are pending.
        let mut instant = ElementCost::default();
        instant.observe(1, Duration::ZERO);
        assert_eq!(instant.min_elements(), usize::MAX);
    }
}
