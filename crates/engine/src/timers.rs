//! Timers of stateful DoFns: set and cleared by bundles, fired by the runner.
//!
//! Timers travel on the data plane as `Elements.Timers` coded
//! `beam:coder:timer:v1`: key, dynamic timer tag (string), windows
//! (4-byte count, then windows), clear bit, and unless cleared the fire
//! timestamp, hold timestamp (milliseconds, Beam's timestamp encoding) and pane.
//! A later timer with the same (family, key, windows, tag) replaces an earlier one.
//!
//! The store is indexed so that its work follows what changes, not what
//! waits: setting, clearing and firing a timer cost O(log n), and the
//! earliest hold and processing-time timer are read in O(log n).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use weir_model::varint::decode_varint;
use weir_model::{Coder, PaneInfo, Timestamp, Window};
use weir_graph::TimerFamily;

type FastMap<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

/// The queue a timer waits in: its time domain, with the window-expiration
/// family (Java's `@OnWindowExpiration`) apart, as it fires only in a round
/// where nothing else is due.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Lane {
    Processing = 0,
    Event = 1,
    Expiration = 2,
}

/// The timers a round orders together: one lane, key and windows (both
/// encoded). Of one group a round fires only the earliest due timestamp.
#[derive(Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct Group {
    lane: Lane,
    key: Vec<u8>,
    windows: Vec<u8>,
}

/// One pending timer: fire and hold timestamps and its encoded form.
struct Pending {
    fire: Timestamp,
    hold: Timestamp,
    bytes: Vec<u8>,
}

/// The pending timers of one [`Group`], by (family, tag) and by fire time.
#[derive(Default)]
struct GroupTimers {
    timers: FastMap<(usize, Vec<u8>), Pending>,
    by_fire: BTreeSet<(Timestamp, usize, Vec<u8>)>,
}

impl GroupTimers {
    fn earliest(&self) -> Option<Timestamp> {
        self.by_fire.first().map(|(fire, _, _)| *fire)
    }
}

/// Pending timers of one stateful stage on one worker.
pub struct TimerStore {
    /// Per family: key coder, window coder, lane, [`TimerFamily::fire_at_hold`].
    families: Vec<(Coder, Coder, Lane, bool)>,
    groups: FastMap<Arc<Group>, GroupTimers>,
    /// Per lane, each group with pending timers at its earliest fire time.
    queues: [BTreeSet<(Timestamp, Arc<Group>)>; 3],
    /// Hold timestamps of the pending timers, counted.
    holds: BTreeMap<Timestamp, usize>,
    /// The earliest max timestamp of each group's windows, counted.
    window_ends: BTreeMap<Timestamp, usize>,
    len: usize,
}

struct Parsed {
    id_key: Vec<u8>,
    windows: Vec<u8>,
    tag: Vec<u8>,
    /// Fire and hold (output) timestamps, unless the timer is cleared.
    fire: Option<(Timestamp, Timestamp)>,
    /// Where the fire timestamp's bytes start and end.
    fire_bytes: (usize, usize),
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
    let fire_start = pos;
    let mut fire_end = pos;
    let fire = if clear {
        None
    } else {
        let (fire, used) = Timestamp::decode(&bytes[pos..]).map_err(err)?;
        pos += used;
        fire_end = pos;
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
        fire_bytes: (fire_start, fire_end),
        len: pos,
    })
}

impl TimerStore {
    /// A store for the stage's timer families; `expiration_family` is the
    /// stage's window-expiration family (`SdkStage::window_expiration_family`),
    /// whose timers fire only in a round where no other timer is due.
    pub fn new(families: &[TimerFamily], expiration_family: Option<usize>) -> Self {
        TimerStore {
            families: families
                .iter()
                .enumerate()
                .map(|(i, f)| {
                    let lane = if Some(i) == expiration_family {
                        Lane::Expiration
                    } else if f.event_time {
                        Lane::Event
                    } else {
                        Lane::Processing
                    };
                    (f.key_coder.clone(), f.window_coder.clone(), lane, f.fire_at_hold)
                })
                .collect(),
            groups: FastMap::default(),
            queues: Default::default(),
            holds: BTreeMap::new(),
            window_ends: BTreeMap::new(),
            len: 0,
        }
    }

    /// Applies the timers a bundle wrote for family `family` (set or clear).
    /// A timer of a [`TimerFamily::fire_at_hold`] family still fires at its
    /// fire timestamp, but goes to the SDK with its hold in that place.
    pub fn apply(&mut self, family: usize, mut bytes: &[u8]) -> Result<(), String> {
        let (key_coder, window_coder, lane, fire_at_hold) =
            self.families.get(family).ok_or("unknown timer family")?.clone();
        while !bytes.is_empty() {
            let p = parse(&key_coder, &window_coder, bytes)?;
            let group = Group { lane, key: p.id_key, windows: p.windows };
            let pending = p.fire.map(|(fire, hold)| {
                let mut delivered = bytes[..p.len].to_vec();
                if fire_at_hold {
                    let mut at_hold = Vec::with_capacity(8);
                    hold.encode(&mut at_hold);
                    delivered.splice(p.fire_bytes.0..p.fire_bytes.1, at_hold);
                }
                Pending { fire, hold, bytes: delivered }
            });
            self.put(group, family, p.tag, pending);
            bytes = &bytes[p.len..];
        }
        Ok(())
    }

    /// Sets (`Some`) or clears (`None`) the timer (family, tag) of `group`.
    fn put(&mut self, group: Group, family: usize, tag: Vec<u8>, pending: Option<Pending>) {
        let group = match self.groups.get_key_value(&group) {
            Some((known, _)) => known.clone(),
            None if pending.is_some() => Arc::new(group),
            None => return,
        };
        self.put_in(group, family, tag, pending);
    }

    /// [`Self::put`] on a group's shared identity, keeping the indexes;
    /// returns the timer it replaced or cleared.
    fn put_in(&mut self, group: Arc<Group>, family: usize, tag: Vec<u8>, pending: Option<Pending>) -> Option<Pending> {
        let lane = group.lane as usize;
        let timers = self.groups.entry(group.clone()).or_default();
        let before = timers.earliest();
        let id = (family, tag);
        let old = timers.timers.remove(&id);
        if let Some(old) = &old {
            timers.by_fire.remove(&(old.fire, id.0, id.1.clone()));
            uncount(&mut self.holds, old.hold);
            self.len -= 1;
        }
        if let Some(p) = pending {
            timers.by_fire.insert((p.fire, id.0, id.1.clone()));
            *self.holds.entry(p.hold).or_default() += 1;
            timers.timers.insert(id, p);
            self.len += 1;
        }
        let after = timers.earliest();
        if after.is_none() {
            self.groups.remove(&group);
        }
        // A group with no timers is gone, so `before` is None for a new one.
        let window_end = || windows_end(&self.families[family].1, &group.windows);
        match (before, after) {
            (None, Some(_)) => *self.window_ends.entry(window_end()).or_default() += 1,
            (Some(_), None) => {
                let end = window_end();
                uncount(&mut self.window_ends, end);
            }
            _ => {}
        }
        if before != after {
            if let Some(t) = before {
                self.queues[lane].remove(&(t, group.clone()));
            }
            if let Some(t) = after {
                self.queues[lane].insert((t, group));
            }
        }
        old
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
        let Some((_, _, lane, _)) = self.families.get(family) else {
            return;
        };
        if matches!(window, Window::Custom(_)) {
            return;
        }
        let mut windows = Vec::new();
        weir_model::windowed_value::encode_windows(std::slice::from_ref(window), &mut windows);
        let group = Group { lane: *lane, key: key.to_vec(), windows };
        if self.groups.get(&group).is_some_and(|t| t.timers.contains_key(&(family, Vec::new()))) {
            return;
        }
        let hold = window.max_timestamp();
        let fire = hold.saturating_add_millis(allowed_lateness_ms);
        let mut bytes = key.to_vec();
        bytes.push(0); // the empty dynamic timer tag
        bytes.extend_from_slice(&group.windows);
        bytes.push(0); // not cleared
        fire.encode(&mut bytes);
        hold.encode(&mut bytes);
        PaneInfo::NO_FIRING.encode(&mut bytes);
        self.put(group, family, Vec::new(), Some(Pending { fire, hold, bytes }));
    }

    /// How many timers are pending.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when no timer is pending.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The earliest firing time of a pending processing-time timer.
    pub fn next_processing_time(&self) -> Option<Timestamp> {
        self.queues[Lane::Processing as usize].first().map(|(fire, _)| *fire)
    }

    /// The earliest max timestamp of the pending timers' windows (MIN for
    /// windows that do not decode); MAX when none is pending.
    pub fn earliest_window_end(&self) -> Timestamp {
        self.window_ends.keys().next().copied().unwrap_or(Timestamp(i64::MAX))
    }

    /// The earliest max timestamp of the windows of `fired` (encoded timers
    /// per family, as [`TimerStore::take_ready`] returns them; MIN for
    /// bytes that do not parse); MAX when there are none.
    pub fn fired_window_end(&self, fired: &[Vec<u8>]) -> Timestamp {
        let mut floor = Timestamp(i64::MAX);
        for (family, mut bytes) in fired.iter().map(Vec::as_slice).enumerate() {
            let Some((key_coder, window_coder, _, _)) = self.families.get(family) else {
                return Timestamp(i64::MIN);
            };
            while !bytes.is_empty() {
                let Ok(p) = parse(key_coder, window_coder, bytes) else {
                    return Timestamp(i64::MIN);
                };
                floor = floor.min(windows_end(window_coder, &p.windows));
                bytes = &bytes[p.len..];
            }
        }
        floor
    }

    /// The earliest hold (output) timestamp of the pending timers: the
    /// stage's output watermark may not pass it.
    pub fn min_hold(&self) -> Option<Timestamp> {
        self.holds.keys().next().copied()
    }

    /// Removes the timers `ready(event_time, fire_timestamp)` accepts and
    /// returns them per family, in fire-timestamp order; `None` if there are
    /// none. `ready` must accept every earlier timestamp of a time domain
    /// once it accepts one (a watermark or a clock): each lane is read in
    /// fire order up to the first timestamp it refuses.
    ///
    /// Of the timers of one key and window in one time domain, a round takes
    /// only those at the earliest due timestamp: a firing may set a timer
    /// earlier than the next one due (a timer re-arming itself every minute
    /// before the window-end timer), and Beam fires a key's timers in
    /// timestamp order, as Java's DirectRunner does. Each further due
    /// timestamp of one key and window costs a round (a bundle).
    ///
    /// Timers of the window-expiration family (Java's
    /// `@OnWindowExpiration`) are only taken in a round where no timer of
    /// another family is due: an SDK runs the timer families of one bundle
    /// in an order of its own, and the expiration callback must see what
    /// the window's other timers did to its state (e.g. an OrderedList
    /// `clearRange` in an `@OnTimer`), as it runs last for its window in
    /// Beam's model.
    pub fn take_ready(&mut self, ready: impl Fn(bool, Timestamp) -> bool) -> Option<Vec<Vec<u8>>> {
        let due = |lane: Lane, queue: &BTreeSet<(Timestamp, Arc<Group>)>| -> Vec<(Timestamp, Arc<Group>)> {
            queue
                .iter()
                .take_while(|(fire, _)| ready(lane != Lane::Processing, *fire))
                .cloned()
                .collect()
        };
        let mut groups = due(Lane::Processing, &self.queues[Lane::Processing as usize]);
        groups.extend(due(Lane::Event, &self.queues[Lane::Event as usize]));
        if groups.is_empty() {
            groups = due(Lane::Expiration, &self.queues[Lane::Expiration as usize]);
        }
        if groups.is_empty() {
            return None;
        }
        let mut fired: Vec<(Timestamp, usize, Arc<Group>, Vec<u8>)> = Vec::new();
        for (fire, group) in &groups {
            let timers = &self.groups[group];
            fired.extend(
                timers
                    .by_fire
                    .range((*fire, 0, Vec::new())..)
                    .take_while(|(t, _, _)| t == fire)
                    .map(|(_, family, tag)| (*fire, *family, group.clone(), tag.clone())),
            );
        }
        fired.sort_by(|a, b| (a.0, a.1, &a.2.key, &a.2.windows, &a.3).cmp(&(b.0, b.1, &b.2.key, &b.2.windows, &b.3)));
        let mut out = vec![Vec::new(); self.families.len()];
        for (_, family, group, tag) in fired {
            if let Some(p) = self.put_in(group, family, tag, None) {
                out[family].extend_from_slice(&p.bytes);
            }
        }
        Some(out)
    }
}

/// The earliest max timestamp of an encoded window list: MIN when it does
/// not decode (nothing may pass it), MAX when it is empty.
fn windows_end(window_coder: &Coder, windows: &[u8]) -> Timestamp {
    match weir_model::windowed_value::decode_windows(window_coder, windows) {
        Ok((windows, _)) => windows.iter().map(Window::max_timestamp).min().unwrap_or(Timestamp(i64::MAX)),
        Err(_) => Timestamp(i64::MIN),
    }
}

/// Takes one count of `hold` off the counted timestamps `holds`.
fn uncount(holds: &mut BTreeMap<Timestamp, usize>, hold: Timestamp) {
    if let Some(n) = holds.get_mut(&hold) {
        *n -= 1;
        if *n == 0 {
            holds.remove(&hold);
        }
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
            fire_at_hold: false,
        }
    }

    /// The earliest window end of pending and of fired timers: windows
    /// [0, 10) and [20, 30) pending end at 9; fired ones are read from
    /// their bytes; once at or below `enough` the scan may stop.
    #[test]
    fn timers_report_their_earliest_window_end() {
        let interval = |start: i64| Window::Interval {
            start: Timestamp(start),
            end: Timestamp(start + 10),
        };
        let mut f = family();
        f.window_coder = Coder::IntervalWindow;
        let mut s = TimerStore::new(&[f], None);
        assert_eq!(s.earliest_window_end(), Timestamp(i64::MAX));
        s.set_window_expiration(0, b"\x01a", &interval(20), 0);
        s.set_window_expiration(0, b"\x01b", &interval(0), 0);
        s.set_window_expiration(0, b"\x01c", &interval(0), 0);
        assert_eq!(s.earliest_window_end(), Timestamp(9));
        let fired = s.take_ready(|_, fire| fire <= Timestamp(9)).unwrap();
        assert_eq!(s.fired_window_end(&fired), Timestamp(9), "the [0, 10) timers fired");
        assert_eq!(s.earliest_window_end(), Timestamp(29), "[20, 30) is left");
        assert!(s.take_ready(|_, _| true).is_some());
        assert_eq!(s.earliest_window_end(), Timestamp(i64::MAX), "none left");
        assert_eq!(s.fired_window_end(&[]), Timestamp(i64::MAX));
        assert_eq!(s.fired_window_end(&[vec![0xff]]), Timestamp(i64::MIN), "bytes that do not parse hold everything");
    }

    #[test]
    fn window_expiration_timers_fire_once_per_key_and_window_after_the_lateness() {
        let interval = Window::Interval {
            start: Timestamp(0),
            end: Timestamp(10),
        };
        let mut f = family();
        f.window_coder = Coder::IntervalWindow;
        let mut s = TimerStore::new(&[f], None);
        s.set_window_expiration(0, b"\x01a", &interval, 5);
        s.set_window_expiration(0, b"\x01a", &interval, 5);
        s.set_window_expiration(0, b"\x01b", &interval, 5);
        s.set_window_expiration(0, b"\x01b", &Window::Custom(vec![0]), 5);
        assert_eq!(s.len(), 2);
        // Held at the window's max timestamp (9), fired after 9 + 5.
        assert_eq!(s.min_hold(), Some(Timestamp(9)));
        assert!(s.take_ready(|_, fire| fire < Timestamp(14)).is_none());
        let fired = s
            .take_ready(|event_time, fire| event_time && fire <= Timestamp(14))
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
        let mut again = TimerStore::new(
            &[TimerFamily {
                window_coder: Coder::IntervalWindow,
                ..family()
            }],
            None,
        );
        again.apply(0, &expected).unwrap();
        assert_eq!(again.len(), 2);
        assert!(s.is_empty());
    }

    #[test]
    fn window_expiration_timers_wait_for_the_other_families() {
        let mut f = family();
        f.window_coder = Coder::IntervalWindow;
        let interval = Window::Interval { start: Timestamp(0), end: Timestamp(10) };
        let mut s = TimerStore::new(&[f.clone(), f], Some(1));
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
        let first = s.take_ready(|_, _| true).unwrap();
        assert_eq!(first, vec![user, vec![]]);
        let second = s.take_ready(|_, _| true).unwrap();
        assert!(second[0].is_empty() && !second[1].is_empty(), "{second:?}");
        assert!(s.is_empty());
    }

    #[test]
    fn a_key_and_window_fires_one_timestamp_a_round_across_families() {
        let mut s = TimerStore::new(&[family(), family()], None);
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
            s.take_ready(all).unwrap(),
            vec![timer("b", "y", Some(30)), timer("a", "", Some(10))]
        );
        // The early timer re-arms itself at 20, before the late one: it fires first.
        s.apply(1, &timer("a", "", Some(20))).unwrap();
        assert_eq!(
            s.take_ready(all).unwrap(),
            vec![timer("b", "x", Some(40)), timer("a", "", Some(20))]
        );
        assert_eq!(s.take_ready(all).unwrap(), vec![timer("a", "", Some(60)), vec![]]);
        assert!(s.take_ready(all).is_none());
        // Timers at one timestamp go together, and processing-time timers
        // are ordered apart from event-time ones.
        let mut pt = family();
        pt.event_time = false;
        let mut s = TimerStore::new(&[family(), family(), pt], None);
        s.apply(0, &timer("a", "", Some(5))).unwrap();
        s.apply(1, &timer("a", "", Some(5))).unwrap();
        s.apply(2, &timer("a", "", Some(7))).unwrap();
        assert_eq!(
            s.take_ready(all).unwrap(),
            vec![timer("a", "", Some(5)), timer("a", "", Some(5)), timer("a", "", Some(7))]
        );
    }

    #[test]
    fn later_set_replaces_and_clear_removes() {
        let mut s = TimerStore::new(&[family()], None);
        let mut batch = timer("a", "", Some(10));
        batch.extend(timer("b", "", Some(5)));
        batch.extend(timer("a", "", Some(20)));
        s.apply(0, &batch).unwrap();
        s.apply(0, &timer("c", "x", Some(1))).unwrap();
        s.apply(0, &timer("c", "x", None)).unwrap();
        assert!(s.take_ready(|_, t| t < Timestamp(5)).is_none());
        let fired = s.take_ready(|_, t| t <= Timestamp(20)).unwrap();
        let mut expected = timer("b", "", Some(5));
        expected.extend(timer("a", "", Some(20)));
        assert_eq!(fired, vec![expected]);
        assert!(s.is_empty());
    }

    /// The store's rules written the plain way: every round scans every
    /// pending timer.
    #[derive(Default)]
    struct Reference {
        timers: BTreeMap<(usize, Vec<u8>, Vec<u8>), (Timestamp, Timestamp, Vec<u8>)>,
    }

    impl Reference {
        fn take(&mut self, event: &[bool], last: usize, ready: impl Fn(bool, Timestamp) -> bool) -> Option<Vec<Vec<u8>>> {
            let mut due: Vec<_> = self
                .timers
                .iter()
                .filter(|(id, (fire, _, _))| ready(event[id.0], *fire))
                .map(|(id, (fire, _, _))| (*fire, id.clone()))
                .collect();
            if due.iter().any(|(_, id)| id.0 != last) {
                due.retain(|(_, id)| id.0 != last);
            }
            if due.is_empty() {
                return None;
            }
            let group = |id: &(usize, Vec<u8>, Vec<u8>)| (event[id.0], id.1.clone());
            let mut earliest = HashMap::new();
            for (fire, id) in &due {
                let e = earliest.entry(group(id)).or_insert(*fire);
                *e = (*e).min(*fire);
            }
            due.retain(|(fire, id)| earliest[&group(id)] == *fire);
            due.sort();
            let mut out = vec![Vec::new(); event.len()];
            for (_, id) in due {
                out[id.0].extend(self.timers.remove(&id).unwrap().2);
            }
            Some(out)
        }
    }

    #[test]
    fn the_index_fires_what_a_full_scan_would() {
        let mut pt = family();
        pt.event_time = false;
        let families = [family(), family(), pt, family()];
        let event = [true, true, false, true];
        let mut store = TimerStore::new(&families, Some(3));
        let mut reference = Reference::default();
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut next = |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        let (mut watermark, mut now) = (0, 0);
        for _ in 0..5000 {
            if next(3) == 0 {
                watermark += next(4) as i64;
                now += next(4) as i64;
                let ready = |event_time: bool, t: Timestamp| {
                    if event_time { t.millis() < watermark } else { t.millis() <= now }
                };
                assert_eq!(store.take_ready(ready), reference.take(&event, 3, ready));
            } else {
                let family = next(4) as usize;
                let key = ["a", "b", "c"][next(3) as usize];
                let tag = ["", "x"][next(2) as usize];
                let fire = (next(5) != 0).then(|| watermark.min(now) + next(12) as i64);
                let bytes = timer(key, tag, fire);
                store.apply(family, &bytes).unwrap();
                let mut id_key = vec![key.len() as u8];
                id_key.extend_from_slice(key.as_bytes());
                let id = (family, id_key, tag.as_bytes().to_vec());
                match fire {
                    Some(t) => {
                        reference.timers.insert(id, (Timestamp(t), Timestamp(t), bytes));
                    }
                    None => {
                        reference.timers.remove(&id);
                    }
                }
            }
            assert_eq!(store.len(), reference.timers.len());
            assert_eq!(store.min_hold(), reference.timers.values().map(|v| v.1).min());
            assert_eq!(
                store.next_processing_time(),
                reference.timers.iter().filter(|(id, _)| id.0 == 2).map(|(_, v)| v.0).min()
            );
        }
    }

    #[test]
    fn a_fire_at_hold_family_fires_on_time_and_is_delivered_at_its_hold() {
        let mut f = family();
        f.event_time = false;
        f.fire_at_hold = true;
        let mut s = TimerStore::new(&[f], None);
        let timer = |fire: i64, hold: i64| {
            let mut b = vec![1, b'a', 0];
            b.extend_from_slice(&1i32.to_be_bytes());
            Window::Global.encode(&mut b);
            b.push(0);
            Timestamp(fire).encode(&mut b);
            Timestamp(hold).encode(&mut b);
            PaneInfo::NO_FIRING.encode(&mut b);
            b
        };
        // Set at wall-clock time 1000 for an element at event time 10.
        s.apply(0, &timer(1000, 10)).unwrap();
        assert_eq!(s.next_processing_time(), Some(Timestamp(1000)));
        assert_eq!(s.min_hold(), Some(Timestamp(10)));
        assert!(s.take_ready(|_, t| t < Timestamp(1000)).is_none());
        assert_eq!(s.take_ready(|_, t| t <= Timestamp(1000)).unwrap(), vec![timer(10, 10)]);
    }
}
