//! Where an SDK stage's unkeyed input elements go among timely workers.

/// Bytes of unkeyed input that go to one timely worker before the next
/// worker's turn (see [`Spread`]).
pub(super) const SPREAD_CHUNK_BYTES: usize = 16 << 10;

/// Where an SDK stage's unkeyed input elements go: to one timely worker
/// until `chunk` bytes went there (at least one element), then to the next,
/// round-robin over `workers` workers, starting with the routing worker.
/// So a small input (Create's few elements) runs as one bundle, as on
/// Prism, instead of one per worker each paying the SDK's per-bundle cost;
/// a large one still spreads evenly; and a bundle of few slow elements
/// spreads by dynamic splits of its data channel. A `chunk` of 0 moves on
/// after every element.
pub(super) struct Spread {
    /// The first worker of this process (0 off a cluster).
    base: u64,
    /// Workers spread over.
    workers: u64,
    /// The current target, relative to `base`.
    target: u64,
    /// Bytes routed to the current target so far.
    sent: usize,
    chunk: usize,
}

impl Spread {
    /// Routing from the worker `index` over `workers` workers of its
    /// process (all of them off a cluster), starting with `index` itself.
    pub(super) fn new(index: u64, workers: u64, chunk: usize) -> Self {
        let workers = workers.max(1);
        Spread { base: index / workers * workers, workers, target: index % workers, sent: 0, chunk }
    }

    /// The worker an element of `bytes` bytes goes to.
    pub(super) fn route(&mut self, bytes: usize) -> u64 {
        if self.sent > 0 && self.sent + bytes > self.chunk {
            self.target = (self.target + 1) % self.workers;
            self.sent = 0;
        }
        self.sent += bytes.max(1);
        self.base + self.target
    }
}

/// `elements` cut into `ways` (at least 1, at most one per element)
/// bundles of consecutive elements whose sizes differ by at most one: the
/// elements a split of a data channel handed back, one bundle per SDK
/// worker ready for them.
pub(super) fn even_parts<T>(elements: Vec<T>, ways: usize) -> Vec<Vec<T>> {
    let ways = ways.clamp(1, elements.len().max(1));
    let (base, extra) = (elements.len() / ways, elements.len() % ways);
    let mut rest = elements.into_iter();
    (0..ways)
        .map(|i| rest.by_ref().take(base + usize::from(i < extra)).collect())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn returned_elements_go_in_even_consecutive_parts() {
        assert_eq!(even_parts((0..7).collect(), 3), vec![vec![0, 1, 2], vec![3, 4], vec![5, 6]]);
        assert_eq!(even_parts((0..2).collect(), 5), vec![vec![0], vec![1]]);
        assert_eq!(even_parts((0..4).collect(), 0), vec![vec![0, 1, 2, 3]]);
        assert_eq!(even_parts(Vec::<u8>::new(), 3), vec![Vec::<u8>::new()]);
    }

    fn targets(spread: &mut Spread, sizes: &[usize]) -> Vec<u64> {
        sizes.iter().map(|&n| spread.route(n)).collect()
    }

    #[test]
    fn a_small_input_stays_with_the_routing_worker() {
        let mut spread = Spread::new(1, 2, 16 << 10);
        assert_eq!(targets(&mut spread, &[10, 10, 10]), vec![1, 1, 1]);
    }

    #[test]
    fn chunks_go_round_robin_and_a_large_element_goes_alone() {
        let mut spread = Spread::new(0, 3, 100);
        assert_eq!(
            targets(&mut spread, &[60, 40, 1, 500, 10, 90, 1]),
            vec![0, 0, 1, 2, 0, 0, 1]
        );
    }

    #[test]
    fn a_zero_chunk_moves_on_after_every_element() {
        let mut spread = Spread::new(2, 3, 0);
        assert_eq!(targets(&mut spread, &[5, 0, 5, 5]), vec![2, 0, 1, 2]);
    }

    #[test]
    fn in_a_cluster_it_stays_within_the_process() {
        // Worker 5 of a process holding workers 4..8.
        let mut spread = Spread::new(5, 4, 0);
        assert_eq!(targets(&mut spread, &[1, 1, 1, 1, 1]), vec![5, 6, 7, 4, 5]);
    }
}
