//! Timely times, watermarks, holds and the processing-time clock.
//!
//! A timely time is a Beam event time with a sequence number below it
//! ([`Time`]): `(Timestamp::to_timely(event_time) << 64) | sequence`. The
//! event-time part of an input frontier is the Beam input watermark; the
//! sequence lets a TestStream wait for the pipeline to catch up with each of
//! its events without moving the watermark.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use timely::dataflow::operators::Capability;
use weir_model::Timestamp;

/// A timely time: Beam event time (high 64 bits, `Timestamp::to_timely`)
/// and a sequence number (low 64 bits).
pub(crate) type Time = u128;

/// The first timely time at event time `t` (sequence number 0).
pub(crate) fn time_at(t: Timestamp) -> Time {
    (Time::from(t.to_timely())) << 64
}

/// The last timely time at event time `t` (sequence number all ones): it
/// holds the watermark at `t` but comes after every TestStream event at `t`.
pub(crate) fn last_time_at(t: Time) -> Time {
    t | Time::from(u64::MAX)
}

/// The Beam watermark a frontier stands for: the event time of its least
/// time, or, when it is empty (the input is done), `i64::MAX` ms: past every
/// timestamp, including Beam's MAX and a custom window's unknown end.
pub(crate) fn watermark_of(frontier: &[Time]) -> Timestamp {
    frontier
        .iter()
        .min()
        .map(|t| Timestamp::from_timely((t >> 64) as u64))
        .unwrap_or(Timestamp(i64::MAX))
}

/// A hold on the watermark at a timely time: a timely capability in the
/// operators, a bare [`Time`] in unit tests of their pure parts.
pub(crate) trait Hold: Clone {
    /// The timely time it holds at.
    fn hold_time(&self) -> Time;
    /// A hold at `t`, which must not be earlier than [`Hold::hold_time`]
    /// (panics otherwise, as `Capability::delayed` does).
    fn delayed_to(&self, t: Time) -> Self;
}

impl Hold for Capability<Time> {
    fn hold_time(&self) -> Time {
        *self.time()
    }
    fn delayed_to(&self, t: Time) -> Self {
        self.delayed(&t)
    }
}

#[cfg(test)]
impl Hold for Time {
    fn hold_time(&self) -> Time {
        *self
    }
    fn delayed_to(&self, t: Time) -> Self {
        assert!(t >= *self, "a hold cannot move back from {self} to {t}");
        t
    }
}

/// Processing time, in milliseconds since the Unix epoch: the wall clock, or
/// a TestStream's clock, which moves only when the TestStream advances it.
#[derive(Clone)]
pub(crate) enum Clock {
    Wall,
    Test(Arc<AtomicI64>),
}

impl Clock {
    /// Processing time now (ms since the epoch).
    pub(crate) fn now(&self) -> i64 {
        match self {
            Clock::Wall => wall_millis(),
            Clock::Test(t) => t.load(Ordering::SeqCst),
        }
    }
    /// How long until processing time `at` on the wall clock, between 1 ms
    /// and an hour (None for a test clock, which only moves with the
    /// TestStream).
    pub(crate) fn wait_until(&self, at: i64) -> Option<Duration> {
        match self {
            Clock::Wall => Some(Duration::from_millis(
                (at - wall_millis()).clamp(1, 3_600_000) as u64,
            )),
            Clock::Test(_) => None,
        }
    }
}

/// The wall clock, in milliseconds since the Unix epoch (0 before it).
pub(crate) fn wall_millis() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn time_at_keeps_event_time_order_and_leaves_the_sequence_zero() {
        let times: Vec<Time> = [Timestamp::MIN, Timestamp(-5), Timestamp(0), Timestamp(7)]
            .into_iter()
            .map(time_at)
            .collect();
        assert!(times.windows(2).all(|w| w[0] < w[1]));
        assert!(times.iter().all(|t| (*t as u64) == 0));
        assert_eq!(last_time_at(time_at(Timestamp(7))) as u64, u64::MAX);
        assert!(last_time_at(time_at(Timestamp(7))) < time_at(Timestamp(8)));
    }

    #[test]
    fn watermark_is_the_least_event_time_ignoring_sequence_numbers() {
        let frontier = [time_at(Timestamp(30)) | 4, time_at(Timestamp(10)) | 9];
        assert_eq!(watermark_of(&frontier), Timestamp(10));
        assert_eq!(watermark_of(&[time_at(Timestamp(-3))]), Timestamp(-3));
    }

    #[test]
    fn an_empty_frontier_is_past_every_timestamp() {
        assert_eq!(watermark_of(&[]), Timestamp(i64::MAX));
        assert!(watermark_of(&[]) > Timestamp::MAX);
    }

    #[test]
    fn a_test_clock_reads_its_counter_and_never_schedules_a_wakeup() {
        let counter = Arc::new(AtomicI64::new(1_000));
        let clock = Clock::Test(counter.clone());
        assert_eq!(clock.now(), 1_000);
        counter.fetch_add(250, Ordering::SeqCst);
        assert_eq!(clock.now(), 1_250);
        assert_eq!(clock.wait_until(5_000), None);
    }

    #[test]
    fn the_wall_clock_waits_at_least_a_millisecond_and_at_most_an_hour() {
        let past = Clock::Wall.wait_until(0);
        assert_eq!(past, Some(Duration::from_millis(1)));
        let far = Clock::Wall.wait_until(wall_millis() + 10 * 3_600_000);
        assert_eq!(far, Some(Duration::from_secs(3_600)));
    }

    #[test]
    fn a_bare_time_hold_moves_only_forward() {
        assert_eq!(5u128.delayed_to(9), 9);
        assert!(std::panic::catch_unwind(|| 9u128.delayed_to(5)).is_err());
    }
}
