//! How a job's bundles are retried (attempt cap, streaming backoff, which
//! failures the job hears of) and how messages show durations and SDK errors.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

/// Attempts of one bundle before its stage fails a batch job (Dataflow's rule).
pub const MAX_ATTEMPTS: usize = 4;
/// Longest pause between two attempts of a bundle in a streaming job.
pub(super) const MAX_RETRY_BACKOFF: Duration = Duration::from_secs(60);
/// First pause between attempts of a streaming bundle that keeps failing.
const FIRST_RETRY_BACKOFF: Duration = Duration::from_millis(500);

/// How a job's bundles are retried and watched.
#[derive(Clone, Debug, Default)]
pub struct BundlePolicy {
    /// Streaming job: a failed bundle is retried without a cap (Dataflow's
    /// streaming rule); batch: up to [`MAX_ATTEMPTS`] attempts.
    pub streaming: bool,
    /// Dataflow's `element_processing_timeout`: a bundle whose progress
    /// does not move for this long is taken to be stuck on one element; its
    /// SDK harness is restarted and the bundle retried.
    pub element_processing_timeout: Option<Duration>,
    /// The job's drain flag (DrainJob): once set, a running bundle of a
    /// splittable stage is checkpointed (`ProcessBundleSplitRequest` with
    /// fraction_of_remainder 0) and its residual handed to the engine,
    /// which sends it through the stage's drain descriptor (the SDF's
    /// `TruncateRestriction`). Without it an SDF that never stops claiming
    /// (Go's TestDrain) kept its bundle, and the job stayed DRAINING.
    pub drain: Option<Arc<std::sync::atomic::AtomicBool>>,
}

impl BundlePolicy {
    pub(super) fn draining(&self) -> bool {
        self.drain
            .as_ref()
            .is_some_and(|d| d.load(Ordering::SeqCst))
    }

    /// Whether a bundle that failed `attempts` times is tried again.
    pub fn retries_after(&self, attempts: usize) -> bool {
        self.streaming || attempts < MAX_ATTEMPTS
    }

    /// Pause before attempt `attempts + 1`: none in batch (the retry goes
    /// to another or a fresh SDK harness); in streaming, where retries do
    /// not end, none for the first [`MAX_ATTEMPTS`] - 1 retries, then
    /// doubling from [`FIRST_RETRY_BACKOFF`] up to [`MAX_RETRY_BACKOFF`].
    pub fn backoff(&self, attempts: usize) -> Duration {
        if !self.streaming || attempts < MAX_ATTEMPTS {
            return Duration::ZERO;
        }
        let doublings = (attempts - MAX_ATTEMPTS).min(16) as u32;
        FIRST_RETRY_BACKOFF
            .saturating_mul(1 << doublings)
            .min(MAX_RETRY_BACKOFF)
    }

    /// Whether the job's messages hear of failed attempt `attempts` of a
    /// streaming bundle: the [`MAX_ATTEMPTS`]th, then every doubling.
    pub fn reports_failure(&self, attempts: usize) -> bool {
        self.streaming
            && attempts >= MAX_ATTEMPTS
            && (attempts / MAX_ATTEMPTS).is_power_of_two()
            && attempts % MAX_ATTEMPTS == 0
    }

    /// How often a running bundle's progress is asked for: a quarter of the
    /// timeout, between 100 ms and 10 s.
    pub fn progress_interval(&self) -> Option<Duration> {
        self.element_processing_timeout
            .map(|t| (t / 4).clamp(Duration::from_millis(100), Duration::from_secs(10)))
    }
}

/// The first `n` lines of `text` (an SDK error with a long traceback).
pub(super) fn first_lines(text: &str, n: usize) -> String {
    let mut lines = text.lines();
    let mut out: Vec<&str> = lines.by_ref().take(n).collect();
    if lines.next().is_some() {
        out.push("[...]");
    }
    out.join("\n")
}

/// A duration the way a user writes it: `45s`, `2m`, `3m30s`, `250ms`.
pub fn human_duration(d: Duration) -> String {
    let secs = d.as_secs();
    if secs == 0 {
        return format!("{}ms", d.as_millis());
    }
    match (secs / 60, secs % 60) {
        (0, s) => format!("{s}s"),
        (m, 0) => format!("{m}m"),
        (m, s) => format!("{m}m{s}s"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batch_caps_attempts_and_streaming_does_not() {
        let batch = BundlePolicy::default();
        assert!(batch.retries_after(1) && batch.retries_after(3));
        assert!(!batch.retries_after(MAX_ATTEMPTS));
        assert_eq!(batch.backoff(3), Duration::ZERO);
        let streaming = BundlePolicy {
            streaming: true,
            ..Default::default()
        };
        assert!(streaming.retries_after(MAX_ATTEMPTS) && streaming.retries_after(1000));
        assert_eq!(streaming.backoff(2), Duration::ZERO);
        // Exponential from the 4th failure, capped.
        let pauses: Vec<u128> = (4..=13).map(|n| streaming.backoff(n).as_millis()).collect();
        assert_eq!(
            pauses,
            [500, 1000, 2000, 4000, 8000, 16000, 32000, 60000, 60000, 60000]
        );
        assert_eq!(streaming.backoff(1000), MAX_RETRY_BACKOFF);
        assert_eq!(streaming.backoff(usize::MAX), MAX_RETRY_BACKOFF);
        // The job hears of the 4th, 8th, 16th, 32nd... failure.
        let reported: Vec<usize> = (1..=70).filter(|&n| streaming.reports_failure(n)).collect();
        assert_eq!(reported, [4, 8, 16, 32, 64]);
        assert!(!batch.reports_failure(4));
    }

    #[test]
    fn progress_is_polled_four_times_per_timeout_within_bounds() {
        let every = |secs| {
            BundlePolicy {
                element_processing_timeout: Some(Duration::from_secs(secs)),
                ..Default::default()
            }
            .progress_interval()
        };
        assert_eq!(every(3), Some(Duration::from_millis(750)));
        assert_eq!(every(180), Some(Duration::from_secs(10)));
        assert_eq!(BundlePolicy::default().progress_interval(), None);
    }

    #[test]
    fn durations_read_like_go_durations() {
        assert_eq!(human_duration(Duration::from_secs(3)), "3s");
        assert_eq!(human_duration(Duration::from_secs(180)), "3m");
        assert_eq!(human_duration(Duration::from_secs(210)), "3m30s");
        assert_eq!(human_duration(Duration::from_millis(250)), "250ms");
    }

    #[test]
    fn durations_truncate_to_whole_seconds_and_stop_at_minutes() {
        assert_eq!(human_duration(Duration::ZERO), "0ms");
        assert_eq!(human_duration(Duration::from_millis(1999)), "1s");
        assert_eq!(human_duration(Duration::from_millis(60_500)), "1m");
        assert_eq!(human_duration(Duration::from_secs(7200)), "120m");
    }

    #[test]
    fn first_lines_marks_what_it_leaves_out() {
        assert_eq!(first_lines("a\nb\nc", 2), "a\nb\n[...]");
        assert_eq!(first_lines("a\nb", 2), "a\nb");
        assert_eq!(
            first_lines("a\nb\n", 2),
            "a\nb",
            "a trailing newline is no line"
        );
        assert_eq!(first_lines("", 20), "");
    }

    #[test]
    fn draining_follows_the_drain_flag() {
        assert!(!BundlePolicy::default().draining());
        let flag = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let policy = BundlePolicy {
            drain: Some(flag.clone()),
            ..Default::default()
        };
        assert!(!policy.draining());
        flag.store(true, Ordering::SeqCst);
        assert!(policy.draining());
    }
}
