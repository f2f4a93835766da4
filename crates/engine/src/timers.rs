//! Timers of stateful DoFns: set and cleared by bundles, fired by the runner.
//!
//! Timers travel on the data plane as `Elements.Timers` coded
//! `beam:coder:timer:v1`: key, dynamic timer tag (string), windows
//! (4-byte count, then windows), clear bit, and unless cleared the fire
//! timestamp, hold timestamp (milliseconds, Beam's timestamp encoding) and pane.
//! A later timer with the same (family, key, windows, tag) replaces an earlier one.

use std::collections::{BTreeMap, HashMap};

use weir_model::varint::decode_varint;
use weir_model::{Coder, PaneInfo, Timestamp, Window};
use weir_graph::TimerFamily;

/// Identity of a timer: (family index, key bytes, windows bytes, tag bytes).
type TimerId = (usize, Vec<u8>, Vec<u8>, Vec<u8>);

/// What a round orders a timer by: (its family's time domain is event
/// time, key bytes, windows bytes).
fn timer_group<'a>(families: &[(Coder, Coder, bool)], id: &'a TimerId) -> (bool, &'a [u8], &'a [u8]) {
    (families[id.0].2, id.1.as_slice(), id.2.as_slice())
}

/// Pending timers of one stateful stage on one worker.
pub struct TimerStore {
    families: Vec<(Coder, Coder, bool)>,
    /// Pending timers: (fire timestamp, hold timestamp, encoded timer).
    timers: BTreeMap<TimerId, (Timestamp, Timestamp, Vec<u8>)>,
}

struct Parsed {
    id_key: Vec<u8>,
    windows: Vec<u8>,
    tag: Vec<u8>,
    /// Fire and hold (output) timestamps, unless the timer is cleared.
    fire: Option<(Timestamp, Timestamp)>,
    len: usize,
}

fn parse(key_coder: &Coder, window_coder: &Coder, bytes: &[u8]) -> Result<Parsed, String> {
    let err = |e: weir_model::Error| e.to_string();
    let mut pos = key_coder.encoded_len(bytes).map_err(err)?;
    let id_key = bytes[..pos].to_vec();
    let (tag_len, used) = decode_varint(&bytes[pos..]).map_err(err)?;
    let tag_start = pos + used;
    pos = tag_start + tag_len as usize;
    let tag = bytes
        .get(tag_start..pos)
        .ok_or("truncated timer tag")?
        .to_vec();
    let windows_start = pos;
    let count = i32::from_be_bytes(
        bytes
            .get(pos..pos + 4)
            .ok_or("truncated timer windows")?
            .try_into()
            .map_err(|_| "bad count")?,
    );
    pos += 4;
    for _ in 0..count.max(0) {
        pos += window_coder.encoded_len(&bytes[pos..]).map_err(err)?;
    }
    let windows = bytes[windows_start..pos].to_vec();
    let clear = *bytes.get(pos).ok_or("truncated timer clear bit")? != 0;
    pos += 1;
    let fire = if clear {
        None
    } else {
        let (fire, used) = Timestamp::decode(&bytes[pos..]).map_err(err)?;
        pos += used;
        let (hold, used) = Timestamp::decode(&bytes[pos..]).map_err(err)?;
        pos += used;
        let (_pane, used) = PaneInfo::decode(&bytes[pos..]).map_err(err)?;
        pos += used;
        Some((fire, hold))
    };
    Ok(Parsed {
        id_key,
        windows,
        tag,
        fire,
        len: pos,
    })
}

impl TimerStore {
    /// A store for the stage's timer families.
    pub fn new(families: &[TimerFamily]) -> Self {
        TimerStore {
            families: families
                .iter()
                .map(|f| (f.key_coder.clone(), f.window_coder.clone(), f.event_time))
                .collect(),
            timers: BTreeMap::new(),
        }
    }

    /// Applies the timers a bundle wrote for family `family` (set or clear).
    pub fn apply(&mut self, family: usize, mut bytes: &[u8]) -> Result<(), String> {
        let (key_coder, window_coder, _) =
            self.families.get(family).ok_or("unknown timer family")?;
        while !bytes.is_empty() {
            let p = parse(key_coder, window_coder, bytes)?;
            let id = (family, p.id_key, p.windows, p.tag);
            match p.fire {
                Some((fire, hold)) => {
                    self.timers
                        .insert(id, (fire, hold, bytes[..p.len].to_vec()));
                }
                None => {
                    self.timers.remove(&id);
                }
            }
            bytes = &bytes[p.len..];
        }
        Ok(())
    }

    /// Sets the runner's window-expiration timer of `key` (encoded as the
    /// family's key coder does) in `window`, in timer family `family` (the
    /// stage's `SdkStage::window_expiration_family`, for Java's
    /// `@OnWindowExpiration`): an event-time timer with an empty tag that
    /// fires once the input watermark passes the window's max timestamp plus
    /// `allowed_lateness_ms` (milliseconds; saturating at Beam's MAX), with
    /// its hold (output timestamp) at the window's max timestamp, so the
    /// callback's output is on time and the window's state outlives it.
    /// Setting it again changes nothing. Windows of custom types (whose end
    /// the runner cannot know) get none; their state goes with the job.
    pub fn set_window_expiration(
        &mut self,
        family: usize,
        key: &[u8],
        window: &Window,
        allowed_lateness_ms: i64,
    ) {
        if matches!(window, Window::Custom(_)) || family >= self.families.len() {
            return;
        }
        let mut windows = Vec::new();
        weir_model::windowed_value::encode_windows(std::slice::from_ref(window), &mut windows);
        let id = (family, key.to_vec(), windows, Vec::new());
        if self.timers.contains_key(&id) {
            return;
        }
        let hold = window.max_timestamp();
        let fire = hold.saturating_add_millis(allowed_lateness_ms);
        let mut bytes = key.to_vec();
        bytes.push(0); // the empty dynamic timer tag
        bytes.extend_from_slice(&id.2);
        bytes.push(0); // not cleared
        fire.encode(&mut bytes);
        hold.encode(&mut bytes);
        PaneInfo::NO_FIRING.encode(&mut bytes);
        self.timers.insert(id, (fire, hold, bytes));
    }

    /// How many timers are pending.
    pub fn len(&self) -> usize {
        self.timers.len()
    }

    /// True when no timer is pending.
    pub fn is_empty(&self) -> bool {
        self.timers.is_empty()
    }

    /// The earliest firing time of a pending processing-time timer.
    pub fn next_processing_time(&self) -> Option<Timestamp> {
        self.timers
            .iter()
            .filter(|(id, _)| !self.families[id.0].2)
            .map(|(_, (fire, _, _))| *fire)
            .min()
    }

    /// The earliest hold (output) timestamp of the pending timers: the
    /// stage's output watermark may not pass it.
    pub fn min_hold(&self) -> Option<Timestamp> {
        self.timers.values().map(|(_, hold, _)| *hold).min()
    }

    /// Removes the timers `ready(event_time, fire_timestamp)` accepts and
    /// returns them per family, in fire-timestamp order; `None` if there are none.
    ///
    /// Of the timers of one key and window in one time domain, a round takes
    /// only those at the earliest due timestamp: a firing may set a timer
    /// earlier than the next one due (a timer re-arming itself every minute
    /// before the window-end timer), and Beam fires a key's timers in
    /// timestamp order, as Java's DirectRunner does. Each further due
    /// timestamp of one key and window costs a round (a bundle).
    ///
    /// Timers of family `last` (the window-expiration family, Java's
    /// `@OnWindowExpiration`) are only taken in a round where no timer of
    /// another family is due: an SDK runs the timer families of one bundle
    /// in an order of its own, and the expiration callback must see what
    /// the window's other timers did to its state (e.g. an OrderedList
    /// `clearRange` in an `@OnTimer`), as it runs last for its window in
    /// Beam's model.
    pub fn take_ready(&mut self, last: Option<usize>, ready: impl Fn(bool, Timestamp) -> bool) -> Option<Vec<Vec<u8>>> {
        let mut due: Vec<(Timestamp, &TimerId)> = self
            .timers
            .iter()
            .filter(|(id, (fire, _, _))| ready(self.families[id.0].2, *fire))
            .map(|(id, (fire, _, _))| (*fire, id))
            .collect();
        if due.iter().any(|(_, id)| Some(id.0) != last) {
            due.retain(|(_, id)| Some(id.0) != last);
        }
        if due.is_empty() {
            return None;
        }
        // The earliest due timestamp of each (time domain, key, windows).
        let mut earliest: HashMap<(bool, &[u8], &[u8]), Timestamp> = HashMap::new();
        for (fire, id) in &due {
            earliest
                .entry(timer_group(&self.families, id))
                .and_modify(|t| *t = (*t).min(*fire))
                .or_insert(*fire);
        }
        let mut due: Vec<(Timestamp, TimerId)> = due
            .iter()
            .filter(|(fire, id)| earliest[&timer_group(&self.families, id)] == *fire)
            .map(|(fire, id)| (*fire, (*id).clone()))
            .collect();
        due.sort();
        let mut out = vec![Vec::new(); self.families.len()];
        for (_, id) in due {
            if let Some((_, _, bytes)) = self.timers.remove(&id) {
                out[id.0].extend_from_slice(&bytes);
            }
        }
        Some(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use weir_model::Window;

    fn timer(key: &str, tag: &str, fire: Option<i64>) -> Vec<u8> {
        let mut b = vec![key.len() as u8];
        b.extend_from_slice(key.as_bytes());
        b.push(tag.len() as u8);
        b.extend_from_slice(tag.as_bytes());
        b.extend_from_slice(&1i32.to_be_bytes());
        Window::Global.encode(&mut b);
        match fire {
            None => b.push(1),
            Some(ts) => {
                b.push(0);
                Timestamp(ts).encode(&mut b);
                Timestamp(ts).encode(&mut b);
                PaneInfo::NO_FIRING.encode(&mut b);
            }
        }
        b
    }

    fn family() -> TimerFamily {
        TimerFamily {
            transform_id: "t".into(),
            family_id: "f".into(),
            key_coder: Coder::StringUtf8,
            window_coder: Coder::GlobalWindow,
            event_time: true,
        }
    }

    #[test]
    fn window_expiration_timers_fire_once_per_key_and_window_after_the_lateness() {
        let interval = Window::Interval {
            start: Timestamp(0),
            end: Timestamp(10),
        };
        let mut f = family();
        f.window_coder = Coder::IntervalWindow;
        let mut s = TimerStore::new(&[f]);
        s.set_window_expiration(0, b"\x01a", &interval, 5);
        s.set_window_expiration(0, b"\x01a", &interval, 5);
        s.set_window_expiration(0, b"\x01b", &interval, 5);
        s.set_window_expiration(0, b"\x01b", &Window::Custom(vec![0]), 5);
        assert_eq!(s.len(), 2);
        // Held at the window's max timestamp (9), fired after 9 + 5.
        assert_eq!(s.min_hold(), Some(Timestamp(9)));
        assert!(s.take_ready(None, |_, fire| fire < Timestamp(14)).is_none());
        let fired = s
            .take_ready(None, |event_time, fire| event_time && fire <= Timestamp(14))
            .unwrap();
        // Exactly what the SDK would write for such a timer: key, empty tag,
        // one window, set, fire 14, hold 9, no firing.
        let mut expected = Vec::new();
        for key in ["a", "b"] {
            expected.extend_from_slice(&[1, key.as_bytes()[0], 0]);
            expected.extend_from_slice(&1i32.to_be_bytes());
            interval.encode(&mut expected);
            expected.push(0);
            Timestamp(14).encode(&mut expected);
            Timestamp(9).encode(&mut expected);
            PaneInfo::NO_FIRING.encode(&mut expected);
        }
        assert_eq!(fired, vec![expected.clone()]);
        // And the store parses its own timers like any other.
        let mut again = TimerStore::new(&[TimerFamily {
            window_coder: Coder::IntervalWindow,
            ..family()
        }]);
        again.apply(0, &expected).unwrap();
        assert_eq!(again.len(), 2);
        assert!(s.is_empty());
    }

    #[test]
    fn window_expiration_timers_wait_for_the_other_families() {
        let mut f = family();
        f.window_coder = Coder::IntervalWindow;
        let interval = Window::Interval { start: Timestamp(0), end: Timestamp(10) };
        let mut s = TimerStore::new(&[f.clone(), f]);
        // Family 0: a user timer at 5; family 1: the expiration timer (fires after 9).
        let mut user = vec![1, b'a', 0];
        user.extend_from_slice(&1i32.to_be_bytes());
        interval.encode(&mut user);
        user.push(0);
        Timestamp(5).encode(&mut user);
        Timestamp(5).encode(&mut user);
        PaneInfo::NO_FIRING.encode(&mut user);
        s.apply(0, &user).unwrap();
        s.set_window_expiration(1, b"\x01a", &interval, 0);
        // Both are due at once (the watermark jumped to the end): the user
        // timer goes alone first, the expiration timer in the next round.
        let first = s.take_ready(Some(1), |_, _| true).unwrap();
        assert_eq!(first, vec![user, vec![]]);
        let second = s.take_ready(Some(1), |_, _| true).unwrap();
        assert!(second[0].is_empty() && !second[1].is_empty(), "{second:?}");
        assert!(s.is_empty());
    }

    #[test]
    fn a_key_and_window_fires_one_timestamp_a_round_across_families() {
        let mut s = TimerStore::new(&[family(), family()]);
        // Key a: family 0 ("late") at 60, family 1 ("early") at 10; key b:
        // family 0 at 30 and at 40 (two tags).
        s.apply(0, &timer("a", "", Some(60))).unwrap();
        s.apply(1, &timer("a", "", Some(10))).unwrap();
        let mut b = timer("b", "x", Some(40));
        b.extend(timer("b", "y", Some(30)));
        s.apply(0, &b).unwrap();
        let all = |_: bool, _: Timestamp| true;
        // Round 1: each key's earliest only.
        assert_eq!(
            s.take_ready(None, all).unwrap(),
            vec![timer("b", "y", Some(30)), timer("a", "", Some(10))]
        );
        // The early timer re-arms itself at 20, before the late one: it fires first.
        s.apply(1, &timer("a", "", Some(20))).unwrap();
        assert_eq!(
            s.take_ready(None, all).unwrap(),
            vec![timer("b", "x", Some(40)), timer("a", "", Some(20))]
        );
        assert_eq!(s.take_ready(None, all).unwrap(), vec![timer("a", "", Some(60)), vec![]]);
        assert!(s.take_ready(None, all).is_none());
        // Timers at one timestamp go together, and processing-time timers
        // are ordered apart from event-time ones.
        let mut pt = family();
        pt.event_time = false;
        let mut s = TimerStore::new(&[family(), family(), pt]);
        s.apply(0, &timer("a", "", Some(5))).unwrap();
        s.apply(1, &timer("a", "", Some(5))).unwrap();
        s.apply(2, &timer("a", "", Some(7))).unwrap();
        assert_eq!(
            s.take_ready(None, all).unwrap(),
            vec![timer("a", "", Some(5)), timer("a", "", Some(5)), timer("a", "", Some(7))]
        );
    }

    #[test]
    fn later_set_replaces_and_clear_removes() {
        let mut s = TimerStore::new(&[family()]);
        let mut batch = timer("a", "", Some(10));
        batch.extend(timer("b", "", Some(5)));
        batch.extend(timer("a", "", Some(20)));
        s.apply(0, &batch).unwrap();
        s.apply(0, &timer("c", "x", Some(1))).unwrap();
        s.apply(0, &timer("c", "x", None)).unwrap();
        assert!(s.take_ready(None, |_, t| t < Timestamp(5)).is_none());
        let fired = s.take_ready(None, |_, t| t <= Timestamp(20)).unwrap();
        let mut expected = timer("b", "", Some(5));
        expected.extend(timer("a", "", Some(20)));
        assert_eq!(fired, vec![expected]);
        assert!(s.is_empty());
    }
}
