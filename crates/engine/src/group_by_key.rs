//! GroupByKey buffering: values grouped by (encoded key, window), merged for
//! session windows (or by the SDK for custom merging WindowFns), released
//! when the watermark passes the window's end.

use std::collections::{HashMap, HashSet};

use weir_model::windowed_value::{encode_iterable, split_kv};
use weir_model::{Coder, PaneInfo, Timestamp, Window, WindowedValue};
use weir_graph::{OutputTime, WindowFn, Windowing};

use crate::merge_windows::Merges;

#[derive(Debug)]
struct Group {
    values: Vec<Vec<u8>>,
    min_ts: Timestamp,
    max_ts: Timestamp,
}

impl Group {
    fn new() -> Self {
        Group {
            values: Vec::new(),
            min_ts: Timestamp::MAX,
            max_ts: Timestamp::MIN,
        }
    }
    fn add(&mut self, ts: Timestamp, value: Vec<u8>) {
        self.values.push(value);
        self.min_ts = self.min_ts.min(ts);
        self.max_ts = self.max_ts.max(ts);
    }
    fn absorb(&mut self, other: Group) {
        self.values.extend(other.values);
        self.min_ts = self.min_ts.min(other.min_ts);
        self.max_ts = self.max_ts.max(other.max_ts);
    }
}

/// Buffered groups of one GroupByKey on one worker.
pub struct GroupByKeyBuffer {
    input_coder: Coder,
    window_coder: Coder,
    windowing: Windowing,
    /// Encoded key -> window -> group.
    groups: HashMap<Vec<u8>, HashMap<Window, Group>>,
    /// Values seen per encoded key, and in all, for hot-key detection.
    key_counts: HashMap<Vec<u8>, u64>,
    total: u64,
    /// Keys with windows a custom merging WindowFn has not merged yet.
    unmerged: HashSet<Vec<u8>>,
}

/// A key holding most of a GroupByKey's values on one worker.
#[derive(Debug, PartialEq)]
pub struct HotKey {
    /// The key as encoded on the wire (nested).
    pub key: Vec<u8>,
    pub values: u64,
    pub total: u64,
}

/// Smallest number of values for a key to be reported hot.
const HOT_KEY_MIN_VALUES: u64 = 1000;

impl GroupByKeyBuffer {
    /// A buffer for input elements coded `WindowedValue<input_coder, window_coder>`
    /// (`input_coder` must be a KV coder) grouped under `windowing`.
    pub fn new(input_coder: Coder, window_coder: Coder, windowing: Windowing) -> Self {
        GroupByKeyBuffer {
            input_coder,
            window_coder,
            windowing,
            groups: HashMap::new(),
            key_counts: HashMap::new(),
            total: 0,
            unmerged: HashSet::new(),
        }
    }

    /// The encoded key of an input element, for routing to a worker.
    pub fn key_of<'a>(
        input_coder: &Coder,
        window_coder: &Coder,
        element: &'a [u8],
    ) -> Result<Vec<u8>, String> {
        let (wv, _) =
            WindowedValue::decode(input_coder, window_coder, element).map_err(|e| e.to_string())?;
        let (k, _) = split_kv(input_coder, &wv.value).map_err(|e| e.to_string())?;
        Ok(k.to_vec())
    }

    /// Adds one input element (an encoded windowed KV).
    pub fn insert(&mut self, element: &[u8]) -> Result<(), String> {
        let (wv, _) = WindowedValue::decode(&self.input_coder, &self.window_coder, element)
            .map_err(|e| e.to_string())?;
        let (k, v) = split_kv(&self.input_coder, &wv.value).map_err(|e| e.to_string())?;
        *self.key_counts.entry(k.to_vec()).or_default() += wv.windows.len() as u64;
        self.total += wv.windows.len() as u64;
        let by_window = self.groups.entry(k.to_vec()).or_default();
        for w in wv.windows {
            by_window
                .entry(w)
                .or_insert_with(Group::new)
                .add(wv.timestamp, v.to_vec());
        }
        match self.windowing.window_fn {
            WindowFn::Sessions { .. } => {
                let merges = session_merges(by_window.keys());
                merge_groups(by_window, merges);
            }
            WindowFn::CustomMerging => {
                self.unmerged.insert(k.to_vec());
            }
            WindowFn::Global | WindowFn::NonMerging => {}
        }
        Ok(())
    }

    /// True when a key whose windows a custom merging WindowFn has not
    /// merged yet has a window `complete` (by its max timestamp): merge
    /// before [`Self::take_complete`].
    pub fn needs_merge(&self, complete: impl Fn(Timestamp) -> bool) -> bool {
        self.unmerged.iter().any(|k| {
            self.groups
                .get(k)
                .is_some_and(|by_window| by_window.keys().any(|w| complete(w.max_timestamp())))
        })
    }

    /// Takes the keys with unmerged windows, each with all its windows (the
    /// input of `beam:transform:merge_windows:v1`).
    pub fn take_unmerged(&mut self) -> Vec<(Vec<u8>, Vec<Window>)> {
        take_unmerged(&mut self.unmerged, &self.groups)
    }

    /// Applies merges of `key`'s windows computed by the SDK: the values of
    /// each group of windows move into their merged window.
    pub fn apply_merges(&mut self, key: &[u8], merges: Merges) {
        if let Some(by_window) = self.groups.get_mut(key) {
            merge_groups(by_window, merges);
        }
    }

    /// The key with most values, when it holds at least half of all values
    /// this buffer saw and at least a thousand (one key's values cannot be
    /// spread over workers); then resets the counts.
    pub fn take_hot_key(&mut self) -> Option<HotKey> {
        let counts = std::mem::take(&mut self.key_counts);
        let total = std::mem::take(&mut self.total);
        let (key, values) = counts.into_iter().max_by_key(|(_, n)| *n)?;
        (values >= HOT_KEY_MIN_VALUES && values * 2 >= total).then_some(HotKey {
            key,
            values,
            total,
        })
    }

    /// How many keys have buffered windows.
    pub fn buffered_keys(&self) -> usize {
        self.groups.len()
    }

    /// True when nothing is buffered.
    pub fn is_empty(&self) -> bool {
        self.groups.is_empty()
    }

    /// Removes and encodes every group whose window is complete, i.e. for
    /// which `complete(window.max_timestamp())` is true. Each output is an
    /// encoded windowed `KV<key, iterable<value>>`, pane on-time and only firing.
    pub fn take_complete(&mut self, complete: impl Fn(Timestamp) -> bool) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        self.groups.retain(|key, by_window| {
            let ready: Vec<Window> = by_window
                .keys()
                .filter(|w| complete(w.max_timestamp()))
                .cloned()
                .collect();
            for w in ready {
                let g = by_window.remove(&w).expect("present");
                let timestamp = match self.windowing.output_time {
                    // Beam Python stamps global-window panes 1 ms before the
                    // Runner API's GLOBAL_WINDOW_MAX_TIMESTAMP (its max is 1 µs
                    // before the end, rounded down); Weir matches those bytes.
                    OutputTime::EndOfWindow if w == Window::Global => {
                        Timestamp::PYTHON_END_OF_GLOBAL_WINDOW
                    }
                    // A custom window's end is unknown to the runner: the
                    // pane takes its latest element's timestamp, which lies
                    // inside the window.
                    OutputTime::EndOfWindow if matches!(w, Window::Custom(_)) => g.max_ts,
                    OutputTime::EndOfWindow => w.max_timestamp(),
                    OutputTime::EarliestInPane => g.min_ts,
                    OutputTime::LatestInPane => g.max_ts,
                };
                let mut value = key.clone();
                encode_iterable(g.values.iter().map(|v| v.as_slice()), &mut value);
                let wv = WindowedValue {
                    timestamp,
                    windows: vec![w],
                    pane: PaneInfo::ON_TIME_AND_ONLY_FIRING,
                    value,
                };
                let mut bytes = Vec::new();
                wv.encode(&mut bytes);
                out.push(bytes);
            }
            !by_window.is_empty()
        });
        out
    }
}

/// Drains `unmerged` into (key, all its windows) pairs, for keys that still
/// hold windows in `by_key`.
pub(crate) fn take_unmerged<V>(
    unmerged: &mut HashSet<Vec<u8>>,
    by_key: &HashMap<Vec<u8>, HashMap<Window, V>>,
) -> Vec<(Vec<u8>, Vec<Window>)> {
    unmerged
        .drain()
        .filter_map(|k| {
            let windows: Vec<Window> = by_key.get(&k)?.keys().cloned().collect();
            Some((k, windows))
        })
        .collect()
}

/// Moves the groups of each set of merged windows of one key into their
/// merged window.
fn merge_groups(by_window: &mut HashMap<Window, Group>, merges: Merges) {
    for (target, members) in merges {
        if members == [target.clone()] {
            continue;
        }
        let mut g = Group::new();
        for m in members {
            if let Some(old) = by_window.remove(&m) {
                g.absorb(old);
            }
        }
        by_window.entry(target).or_insert_with(Group::new).absorb(g);
    }
}

/// Beam's session merging over one key's interval windows: windows that
/// intersect become their span. Returns each merged window with the
/// windows it replaces (only merges of two or more windows).
pub(crate) fn session_merges<'a>(
    windows: impl Iterator<Item = &'a Window>,
) -> Vec<(Window, Vec<Window>)> {
    let mut windows: Vec<Window> = windows
        .filter(|w| matches!(w, Window::Interval { .. }))
        .cloned()
        .collect();
    windows.sort_by_key(|w| match w {
        Window::Interval { start, .. } => *start,
        Window::Global | Window::Custom(_) => Timestamp::MIN,
    });
    let mut merged: Vec<(Window, Vec<Window>)> = Vec::new();
    for w in windows {
        let Window::Interval { start, end } = w else {
            continue;
        };
        if let Some((Window::Interval { end: cur_end, .. }, members)) = merged.last_mut() {
            if start < *cur_end {
                *cur_end = (*cur_end).max(end);
                members.push(w);
                continue;
            }
        }
        merged.push((w.clone(), vec![w]));
    }
    merged.retain(|(_, members)| members.len() > 1);
    merged
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kv(key: &str, value: u8, ts: i64, window: Window) -> Vec<u8> {
        let mut v = vec![key.len() as u8];
        v.extend_from_slice(key.as_bytes());
        v.push(value);
        let mut out = Vec::new();
        WindowedValue {
            timestamp: Timestamp(ts),
            windows: vec![window],
            pane: PaneInfo::NO_FIRING,
            value: v,
        }
        .encode(&mut out);
        out
    }

    fn coder() -> Coder {
        Coder::Kv(Box::new(Coder::StringUtf8), Box::new(Coder::VarInt))
    }

    #[test]
    fn groups_by_key_and_fires_at_end_of_global_window() {
        let windowing = Windowing {
            window_fn: WindowFn::Global,
            output_time: OutputTime::EndOfWindow,
            ..Windowing::global()
        };
        let mut b = GroupByKeyBuffer::new(coder(), Coder::GlobalWindow, windowing);
        for (k, v) in [("a", 1), ("b", 2), ("a", 3)] {
            b.insert(&kv(k, v, 5, Window::Global)).unwrap();
        }
        assert!(b
            .take_complete(|t| t < Timestamp::END_OF_GLOBAL_WINDOW)
            .is_empty());
        let mut out = b.take_complete(|_| true);
        out.sort();
        let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
        // timestamp = end of global window, 1 window, pane 07, key "a", iterable [1, 3].
        assert_eq!(
            hex(&out[0]),
            "8020c49ba0bcf7f6000000010701610000000201 03".replace(' ', "")
        );
        assert_eq!(
            hex(&out[1]),
            "8020c49ba0bcf7f600000001070162000000010 2".replace(' ', "")
        );
        assert!(b.is_empty());
    }

    #[test]
    fn custom_merging_windows_wait_for_the_sdks_merges() {
        let iw = |start: i64, end: i64| Window::Interval {
            start: Timestamp(start),
            end: Timestamp(end),
        };
        let windowing = Windowing {
            window_fn: WindowFn::CustomMerging,
            ..Windowing::global()
        };
        let mut b = GroupByKeyBuffer::new(coder(), Coder::IntervalWindow, windowing);
        b.insert(&kv("a", 1, 1, iw(1, 2))).unwrap();
        b.insert(&kv("a", 3, 3, iw(3, 4))).unwrap();
        b.insert(&kv("a", 12, 12, iw(12, 13))).unwrap();
        b.insert(&kv("b", 5, 5, iw(5, 6))).unwrap();
        // Nothing is complete at watermark 0; everything at watermark 100.
        assert!(!b.needs_merge(|t| t < Timestamp(0)));
        assert!(b.needs_merge(|t| t < Timestamp(100)));
        let mut unmerged = b.take_unmerged();
        unmerged.sort();
        for (_, windows) in unmerged.iter_mut() {
            windows.sort();
        }
        assert_eq!(
            unmerged,
            vec![
                (vec![1, b'a'], vec![iw(1, 2), iw(3, 4), iw(12, 13)]),
                (vec![1, b'b'], vec![iw(5, 6)]),
            ]
        );
        assert!(!b.needs_merge(|_| true));
        // The SDK merged a's first two windows (which do not even touch),
        // and left b's alone (a merge of a window into itself is a no-op).
        b.apply_merges(&[1, b'a'], vec![(iw(1, 4), vec![iw(1, 2), iw(3, 4)])]);
        b.apply_merges(&[1, b'b'], vec![(iw(5, 6), vec![iw(5, 6)])]);
        let out = b.take_complete(|_| true);
        let coder_out = Coder::Kv(
            Box::new(Coder::StringUtf8),
            Box::new(Coder::Iterable(Box::new(Coder::VarInt))),
        );
        let mut got: Vec<(Window, i64, Vec<u8>)> = out
            .iter()
            .map(|bytes| {
                let (wv, _) =
                    WindowedValue::decode(&coder_out, &Coder::IntervalWindow, bytes).unwrap();
                (wv.windows[0].clone(), wv.timestamp.0, wv.value)
            })
            .collect();
        got.sort();
        assert_eq!(
            got,
            vec![
                (iw(1, 4), 3, vec![1, b'a', 0, 0, 0, 2, 1, 3]),
                (iw(5, 6), 5, vec![1, b'b', 0, 0, 0, 1, 5]),
                (iw(12, 13), 12, vec![1, b'a', 0, 0, 0, 1, 12]),
            ]
        );
        assert!(b.is_empty());
    }

    #[test]
    fn merges_sessions() {
        let windowing = Windowing {
            window_fn: WindowFn::Sessions { gap_ms: 10 },
            output_time: OutputTime::EarliestInPane,
            ..Windowing::global()
        };
        let mut b = GroupByKeyBuffer::new(coder(), Coder::IntervalWindow, windowing);
        let w = |s: i64| Window::Interval {
            start: Timestamp(s),
            end: Timestamp(s + 10),
        };
        for (v, ts) in [(1, 0), (2, 5), (3, 30)] {
            b.insert(&kv("k", v, ts, w(ts))).unwrap();
        }
        let out = b.take_complete(|_| true);
        let mut windows: Vec<(Window, Timestamp)> = out
            .iter()
            .map(|e| {
                let (wv, _) = WindowedValue::decode(
                    &Coder::Kv(
                        Box::new(Coder::StringUtf8),
                        Box::new(Coder::Iterable(Box::new(Coder::VarInt))),
                    ),
                    &Coder::IntervalWindow,
                    e,
                )
                .unwrap();
                (wv.windows[0].clone(), wv.timestamp)
            })
            .collect();
        windows.sort();
        assert_eq!(
            windows,
            vec![
                (
                    Window::Interval {
                        start: Timestamp(0),
                        end: Timestamp(15)
                    },
                    Timestamp(0)
                ),
                (w(30), Timestamp(30))
            ]
        );
    }
}

#[cfg(test)]
mod hot_key_tests {
    use super::*;

    #[test]
    fn reports_a_key_with_most_values_once() {
        let windowing = Windowing {
            window_fn: WindowFn::Global,
            output_time: OutputTime::EndOfWindow,
            ..Windowing::global()
        };
        let coder = Coder::Kv(Box::new(Coder::StringUtf8), Box::new(Coder::VarInt));
        let mut b = GroupByKeyBuffer::new(coder, Coder::GlobalWindow, windowing);
        let element = |k: &str| {
            let mut v = vec![k.len() as u8];
            v.extend_from_slice(k.as_bytes());
            v.push(1);
            let mut out = Vec::new();
            WindowedValue {
                timestamp: Timestamp(0),
                windows: vec![Window::Global],
                pane: PaneInfo::NO_FIRING,
                value: v,
            }
            .encode(&mut out);
            out
        };
        for _ in 0..1200 {
            b.insert(&element("hot")).unwrap();
        }
        for i in 0..800 {
            b.insert(&element(&format!("k{}", i % 8))).unwrap();
        }
        let hot = b.take_hot_key().unwrap();
        assert_eq!(
            hot,
            HotKey {
                key: b"\x03hot".to_vec(),
                values: 1200,
                total: 2000
            }
        );
        assert_eq!(b.take_hot_key(), None, "reported once");
    }
}
