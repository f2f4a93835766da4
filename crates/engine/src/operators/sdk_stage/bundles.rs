//! Cutting an SDK stage's pending elements into bundles.

use std::collections::VecDeque;

use crate::operators::Element;
use crate::time::Hold;
use crate::EngineConfig;

/// Bundles a batch of pending restrictions is cut into.
const SPLITTABLE_BUNDLES_PER_BATCH: usize = 4;

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
    /// waiting. Restrictions of a splittable DoFn go out in small bundles
    /// (about a quarter of what is pending each, one when few are pending),
    /// so they spread over SDK workers and a single running one can be
    /// split, without paying the SDK's per-bundle cost for each of thousands
    /// of tiny restrictions. Other stages use `config`'s limits.
    ///
    /// Panics if `config.max_bundle_elements` is 0 for a splittable stage.
    pub(super) fn for_stage(splittable: bool, pending: usize, config: &EngineConfig) -> Self {
        let max_elements = if splittable {
            (pending / SPLITTABLE_BUNDLES_PER_BATCH).clamp(1, config.max_bundle_elements)
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
        let config = EngineConfig {
            max_bundle_elements: 100,
            max_bundle_bytes: 4096,
            ..EngineConfig::default()
        };
        let cases = [(0, 1), (3, 1), (40, 10), (10_000, 100)];
        for (pending, expected) in cases {
            assert_eq!(
                BundleLimits::for_stage(true, pending, &config),
                limits(expected, 4096),
                "{pending} pending"
            );
        }
        assert_eq!(
            BundleLimits::for_stage(false, 3, &config),
            limits(100, 4096)
        );
    }
}
