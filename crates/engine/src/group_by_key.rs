//! GroupByKey buffering: values grouped by (encoded key, window), merged for
//! session windows (or by the SDK for custom merging WindowFns), released
//! when the watermark passes the window's end.
//!
//! The cost of an element does not grow with what is buffered: keys live in
//! chunked slots found through a foldhash table over their encoded bytes,
//! each group's values are one contiguous byte run (the body of the encoded
//! iterable it fires as), and every window but the global one is indexed by
//! its max timestamp, so [`GroupByKeyBuffer::take_complete`] visits only
//! windows that became complete (no scan of all keys per activation; the
//! global window completes once, for all keys, and then one pass fires
//! them).
//!
//! Memory: a key of one window is one allocation, its values then its key
//! (see [`Slot`]), so a buffer of small records holds under twice their
//! encoded bytes (`tests/gbk_memory.rs`).

use std::collections::{BTreeMap, HashSet};
use std::hash::BuildHasher;

use hashbrown::HashTable;
use weir_graph::{OutputTime, WindowFn, Windowing};
use weir_model::windowed_value::{begin_iterable, decode_windows, end_iterable};
use weir_model::{Coder, PaneInfo, Timestamp, Window};

use crate::merge_windows::Merges;
use crate::spill::{write_run, Merger, RecordRef, RunReader};

/// Which of a group's element timestamps its pane's timestamp can need:
/// the earliest (`EarliestInPane`) or else the latest (`LatestInPane`, and
/// a custom window's end); one is kept per group, not both.
#[derive(Debug, Clone, Copy)]
pub(crate) struct KeepTs {
    earliest: bool,
}

impl KeepTs {
    fn new(output_time: &OutputTime) -> Self {
        KeepTs {
            earliest: matches!(output_time, OutputTime::EarliestInPane),
        }
    }
    /// The kept timestamp of no elements.
    fn none(self) -> Timestamp {
        if self.earliest {
            Timestamp::MAX
        } else {
            Timestamp::MIN
        }
    }
    fn fold(self, a: Timestamp, b: Timestamp) -> Timestamp {
        if self.earliest {
            a.min(b)
        } else {
            a.max(b)
        }
    }
}

/// Appends `bytes` to a group's values, growing its allocation by half
/// (not doubling, as `Vec` would): at most a third of it goes unused.
fn extend_values(values: &mut Vec<u8>, bytes: &[u8]) {
    if values.capacity() - values.len() < bytes.len() {
        values.reserve_exact(bytes.len().max(values.capacity() / 2));
    }
    values.extend_from_slice(bytes);
}

/// The values of one (key, window): their nested encodings back to back,
/// and the timestamp [`KeepTs`] keeps of theirs.
#[derive(Debug)]
pub(crate) struct Group {
    pub(crate) values: Vec<u8>,
    pub(crate) count: u64,
    pub(crate) ts: Timestamp,
}

impl Group {
    fn empty(keep: KeepTs) -> Group {
        Group {
            values: Vec::new(),
            count: 0,
            ts: keep.none(),
        }
    }

    fn add(&mut self, ts: Timestamp, value: &[u8], keep: KeepTs) {
        extend_values(&mut self.values, value);
        self.count += 1;
        self.ts = keep.fold(self.ts, ts);
    }

    fn absorb(&mut self, other: Group, keep: KeepTs) {
        if self.values.is_empty() {
            self.values = other.values;
        } else {
            extend_values(&mut self.values, &other.values);
        }
        self.count += other.count;
        self.ts = keep.fold(self.ts, other.ts);
    }
}

/// One key's groups: none, a single window (the common case, its values
/// in the slot's `data`), or several, ordered by (max timestamp, window)
/// so complete ones come first.
#[derive(Debug)]
enum KeyGroups {
    None,
    One {
        window: Window,
        count: u64,
        ts: Timestamp,
    },
    /// With the values the key got while it had windows, for hot-key
    /// detection (a `One` group's count is its key's).
    Many(BTreeMap<(Timestamp, Window), Group>, u64),
}

/// Longest key whose one window's values share its allocation: each value
/// appended moves the key, so a longer key keeps its group in a map.
const SHARED_KEY_MAX: usize = 64;

/// The key in a slot's `data`: its last `key_len` bytes.
fn key_of(data: &[u8], key_len: u32) -> &[u8] {
    &data[data.len() - key_len as usize..]
}

/// One buffered key. Its memory is one allocation when it has one window
/// and a key of at most [`SHARED_KEY_MAX`] bytes (the values, then the key),
/// plus this struct in a chunk of [`Slots`].
#[derive(Debug)]
struct Slot {
    /// The values of a `KeyGroups::One` group, then the key's encoding
    /// (the last `key_len` bytes).
    data: Vec<u8>,
    key_len: u32,
    /// The key's hash ([`KeyHash`]): the lookup table rehashes from it.
    hash: KeyHash,
    groups: KeyGroups,
}

impl Slot {
    /// A slot for `key` with room for a first value of `value_bytes` when
    /// the key shares its allocation ([`Self::shares`]).
    fn new(key: &[u8], hash: KeyHash, value_bytes: usize) -> Result<Slot, String> {
        let key_len = u32::try_from(key.len())
            .map_err(|_| format!("a key of {} bytes: GroupByKey takes keys under 4 GiB", key.len()))?;
        let room = if key.len() <= SHARED_KEY_MAX { value_bytes } else { 0 };
        let mut data = Vec::with_capacity(key.len() + room);
        data.extend_from_slice(key);
        Ok(Slot {
            data,
            key_len,
            hash,
            groups: KeyGroups::None,
        })
    }

    fn key(&self) -> &[u8] {
        key_of(&self.data, self.key_len)
    }

    /// Whether a one-window group's values share the key's allocation.
    fn shares(&self) -> bool {
        self.key_len as usize <= SHARED_KEY_MAX
    }

    /// The `One` group's values (empty otherwise).
    fn one_values(&self) -> &[u8] {
        &self.data[..self.data.len() - self.key_len as usize]
    }

    /// Appends `bytes` to the `One` group's values, keeping the key last.
    fn append_one(&mut self, bytes: &[u8]) {
        let start = self.data.len() - self.key_len as usize;
        extend_values(&mut self.data, bytes);
        self.data[start..].rotate_left(self.key_len as usize);
    }

    /// Takes the `One` group's values out of `data`, which keeps the key.
    fn split_one(&mut self) -> Vec<u8> {
        let key = self.data.split_off(self.data.len() - self.key_len as usize);
        std::mem::replace(&mut self.data, key)
    }

    fn is_empty(&self) -> bool {
        match &self.groups {
            KeyGroups::None => true,
            KeyGroups::One { .. } => false,
            KeyGroups::Many(map, _) => map.is_empty(),
        }
    }

    /// The values this key got while it had windows.
    fn seen(&self) -> u64 {
        match &self.groups {
            KeyGroups::None => 0,
            KeyGroups::One { count, .. } => *count,
            KeyGroups::Many(_, seen) => *seen,
        }
    }

    /// Moves a `One` group into `Many`, so another window can join it.
    fn make_many(&mut self) -> &mut BTreeMap<(Timestamp, Window), Group> {
        match std::mem::replace(&mut self.groups, KeyGroups::Many(BTreeMap::new(), 0)) {
            KeyGroups::One { window, count, ts } => {
                let values = self.split_one();
                let mut map = BTreeMap::new();
                map.insert((window.max_timestamp(), window), Group { values, count, ts });
                self.groups = KeyGroups::Many(map, count);
            }
            many @ KeyGroups::Many(..) => self.groups = many,
            KeyGroups::None => {}
        }
        let KeyGroups::Many(map, _) = &mut self.groups else {
            unreachable!()
        };
        map
    }

    /// Adds one value at `ts` to the group of `w`; true when the group is new.
    fn add(&mut self, w: &Window, ts: Timestamp, value: &[u8], keep: KeepTs) -> bool {
        let shared = self.shares();
        match &mut self.groups {
            KeyGroups::None if shared => {
                self.groups = KeyGroups::One {
                    window: w.clone(),
                    count: 1,
                    ts,
                };
                self.append_one(value);
                return true;
            }
            KeyGroups::One {
                window,
                count,
                ts: kept,
            } if window == w => {
                *count += 1;
                *kept = keep.fold(*kept, ts);
                self.append_one(value);
                return false;
            }
            _ => {}
        }
        let map = self.make_many();
        let mut new = false;
        map.entry((w.max_timestamp(), w.clone()))
            .or_insert_with(|| {
                new = true;
                Group::empty(keep)
            })
            .add(ts, value, keep);
        if let KeyGroups::Many(_, seen) = &mut self.groups {
            *seen += 1;
        }
        new
    }

    /// Adds group `g` to the group of `w`; true when that group is new.
    fn put(&mut self, w: &Window, g: Group, keep: KeepTs) -> bool {
        let shared = self.shares();
        match &mut self.groups {
            KeyGroups::None if shared => {
                // The values become the allocation, the key joins them.
                let key = std::mem::replace(&mut self.data, g.values);
                extend_values(&mut self.data, &key);
                self.groups = KeyGroups::One {
                    window: w.clone(),
                    count: g.count,
                    ts: g.ts,
                };
                return true;
            }
            KeyGroups::One { window, count, ts } if window == w => {
                *count += g.count;
                *ts = keep.fold(*ts, g.ts);
                self.append_one(&g.values);
                return false;
            }
            _ => {}
        }
        let map = self.make_many();
        let k = (w.max_timestamp(), w.clone());
        match map.get_mut(&k) {
            Some(have) => {
                have.absorb(g, keep);
                false
            }
            None => {
                map.insert(k, g);
                true
            }
        }
    }

    fn remove(&mut self, w: &Window) -> Option<Group> {
        match &mut self.groups {
            KeyGroups::One { window, .. } if window == w => {
                let KeyGroups::One { count, ts, .. } =
                    std::mem::replace(&mut self.groups, KeyGroups::None)
                else {
                    unreachable!()
                };
                Some(Group {
                    values: self.split_one(),
                    count,
                    ts,
                })
            }
            KeyGroups::Many(map, _) => map.remove(&(w.max_timestamp(), w.clone())),
            _ => None,
        }
    }

    fn windows(&self) -> Vec<Window> {
        match &self.groups {
            KeyGroups::None => Vec::new(),
            KeyGroups::One { window, .. } => vec![window.clone()],
            KeyGroups::Many(map, _) => map.keys().map(|(_, w)| w.clone()).collect(),
        }
    }

    fn any_window(&self, mut f: impl FnMut(&Window) -> bool) -> bool {
        match &self.groups {
            KeyGroups::None => false,
            KeyGroups::One { window, .. } => f(window),
            KeyGroups::Many(map, _) => map.keys().any(|(_, w)| f(w)),
        }
    }
}

/// The slots holding windows that complete at each time.
#[derive(Debug, Default)]
struct Expiry {
    /// Window max timestamp -> slots that got a window with it. Entries go
    /// stale when windows merge or fire; stale ones are skipped.
    by_time: BTreeMap<Timestamp, Vec<u32>>,
    /// Some slot got the global window. The global window is not indexed
    /// by slot: it completes once, for every key at once, and then a pass
    /// over the slots fires them all.
    global: bool,
}

impl Expiry {
    /// Indexes slot `id`'s new window `w`.
    fn index(&mut self, w: &Window, id: u32) {
        if *w == Window::Global {
            self.global = true;
        } else {
            self.by_time.entry(w.max_timestamp()).or_default().push(id);
        }
    }

    /// True when a window may be complete under `complete`.
    fn due(&self, complete: impl Fn(Timestamp) -> bool) -> bool {
        self.by_time.first_key_value().is_some_and(|(t, _)| complete(*t))
            || (self.global && complete(Window::Global.max_timestamp()))
    }

    /// True, once, when the global window is complete under `complete`
    /// and some slot has it: then every slot is to be fired.
    fn take_global(&mut self, complete: impl Fn(Timestamp) -> bool) -> bool {
        let due = self.global && complete(Window::Global.max_timestamp());
        self.global &= !due;
        due
    }

    fn clear(&mut self) {
        self.by_time.clear();
        self.global = false;
    }
}

/// Keys per chunk of [`Slots`]: a chunk is 128 KiB, a size allocators
/// serve without rounding up.
const SLOT_CHUNK: usize = (128 << 10) / std::mem::size_of::<Option<Slot>>();

/// The slots of a buffer, by id, in chunks of [`SLOT_CHUNK`]: growing
/// never copies slots nor leaves half of a doubled vector unused.
#[derive(Debug, Default)]
struct Slots {
    chunks: Vec<Vec<Option<Slot>>>,
    len: usize,
}

impl Slots {
    /// Appends an empty slot; returns its id.
    fn push_empty(&mut self) -> usize {
        if self.len.is_multiple_of(SLOT_CHUNK) {
            self.chunks.push(Vec::with_capacity(SLOT_CHUNK));
        }
        self.chunks.last_mut().expect("a chunk").push(None);
        self.len += 1;
        self.len - 1
    }

    fn get(&self, id: u32) -> Option<&Slot> {
        let id = id as usize;
        self.chunks.get(id / SLOT_CHUNK)?.get(id % SLOT_CHUNK)?.as_ref()
    }

    fn entry(&mut self, id: u32) -> &mut Option<Slot> {
        let id = id as usize;
        &mut self.chunks[id / SLOT_CHUNK][id % SLOT_CHUNK]
    }

    fn get_mut(&mut self, id: u32) -> Option<&mut Slot> {
        let id = id as usize;
        self.chunks.get_mut(id / SLOT_CHUNK)?.get_mut(id % SLOT_CHUNK)?.as_mut()
    }

    fn iter(&self) -> impl Iterator<Item = &Slot> {
        self.chunks.iter().flatten().flatten()
    }

    fn clear(&mut self) {
        self.chunks.clear();
        self.len = 0;
    }
}

/// Buffered groups of one GroupByKey on one worker.
pub struct GroupByKeyBuffer {
    input_coder: Coder,
    window_coder: Coder,
    windowing: Windowing,
    hasher: foldhash::fast::RandomState,
    /// Slot ids, found by their key's hash (rehashed from the hash in
    /// each slot when the table grows).
    table: HashTable<u32>,
    slots: Slots,
    /// Slot ids free for reuse (not in `table`).
    free: Vec<u32>,
    /// Slot ids freed but still in `table` (skipped by lookups); dropped
    /// from it in one pass once they outnumber the live keys.
    dead: Vec<u32>,
    live: usize,
    /// Which slots have windows that complete when.
    expiry: Expiry,
    /// The key with most values so far (slot, key, count), for hot-key
    /// detection, and the values seen in all.
    hot: Option<(Option<u32>, Vec<u8>, u64)>,
    total: u64,
    /// Keys that got a slot since the last hot-key report.
    keys_seen: u64,
    /// Keys with windows a custom merging WindowFn has not merged yet.
    unmerged: HashSet<Vec<u8>>,
    /// Bytes of keys and values held (without per-group overhead).
    held_bytes: usize,
    /// Which timestamp of its elements each group keeps.
    keep: KeepTs,
    /// Set by [`Self::with_spill`].
    spill: Option<Spill>,
}

/// A GroupByKey's spilled groups: sorted runs on disk.
struct Spill {
    /// Most bytes the in-memory groups may use before they are spilled.
    budget: usize,
    dir: std::path::PathBuf,
    merger: Merger,
    /// Group parts in runs not yet read back.
    parts: usize,
    /// Most bytes of output one `take_complete` call returns from runs.
    chunk: usize,
    /// More complete groups wait in the runs (the last call hit `chunk`).
    more: bool,
    /// An I/O error while spilling or reading back.
    error: Option<String>,
}

/// Memory a buffered key costs beyond its key and value bytes (its slot,
/// table and expiry entries, allocator rounding), for the spill budget.
const KEY_OVERHEAD: usize = 96;

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

/// Fewest keys a worker's GroupByKey must see for one to be reported hot:
/// with fewer, the parallelism is the key count the pipeline chose (a
/// sharded or single-key write, `WriteToText(num_shards=4)` or Go's
/// `textio.Write`), and half the values on one key is no skew.
const HOT_KEY_MIN_KEYS: u64 = 8;

/// The hash of a key's bytes, kept in its slot.
type KeyHash = u32;

/// A [`KeyHash`] as the table's 64-bit hash: multiplied by an odd
/// constant, so that the bucket index (low bits) and the control byte (top
/// bits) vary independently however large the table.
fn spread(h: KeyHash) -> u64 {
    u64::from(h).wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

/// Where the routing hash of a key comes from: the same on every worker.
const ROUTE_SEED: u64 = 0x5745_4952_4742_4b31;

/// The parts of one encoded windowed KV, borrowed from its bytes.
pub(crate) struct Parsed<'a> {
    pub(crate) timestamp: Timestamp,
    pub(crate) windows: Windows,
    pub(crate) key: &'a [u8],
    pub(crate) value: &'a [u8],
}

/// An element's windows: nearly always exactly one (no allocation then).
pub(crate) enum Windows {
    One(Window),
    Many(Vec<Window>),
}

impl Windows {
    pub(crate) fn as_slice(&self) -> &[Window] {
        match self {
            Windows::One(w) => std::slice::from_ref(w),
            Windows::Many(v) => v,
        }
    }
}

/// Splits an element coded `WindowedValue<KV<k, v>, window_coder>` into its
/// timestamp, windows, key and value bytes (the pane is skipped).
pub(crate) fn parse<'a>(
    input_coder: &Coder,
    window_coder: &Coder,
    element: &'a [u8],
) -> Result<Parsed<'a>, String> {
    let err = |e: weir_model::Error| e.to_string();
    let (timestamp, mut pos) = Timestamp::decode(element).map_err(err)?;
    let rest = &element[pos..];
    let count = rest
        .get(..4)
        .map(|b| i32::from_be_bytes(b.try_into().expect("4 bytes")));
    let windows = if count == Some(1) {
        let (w, n) = Window::decode(window_coder, &rest[4..]).map_err(err)?;
        pos += 4 + n;
        Windows::One(w)
    } else {
        let (ws, n) = decode_windows(window_coder, rest).map_err(err)?;
        pos += n;
        Windows::Many(ws)
    };
    pos += PaneInfo::encoded_len(&element[pos..]).map_err(err)?;
    let Coder::Kv(kc, vc) = input_coder else {
        return Err(format!(
            "expected beam:coder:kv:v1 as GroupByKey input, got {}",
            input_coder.urn()
        ));
    };
    let rest = &element[pos..];
    let klen = kc.encoded_len(rest).map_err(err)?;
    let vlen = vc.encoded_len(&rest[klen..]).map_err(err)?;
    Ok(Parsed {
        timestamp,
        windows,
        key: &rest[..klen],
        value: &rest[klen..klen + vlen],
    })
}

/// Appends the output element of one fired group: `WindowedValue<KV<key,
/// iterable<value>>>` in `window` at `timestamp`, pane on-time and only firing.
pub(crate) fn encode_pane(
    key: &[u8],
    window: &Window,
    timestamp: Timestamp,
    count: u64,
    values: &[u8],
    out: &mut Vec<u8>,
) {
    out.reserve(8 + 4 + 16 + 1 + key.len() + 4 + values.len());
    timestamp.encode(out);
    out.extend_from_slice(&1i32.to_be_bytes());
    window.encode(out);
    PaneInfo::ON_TIME_AND_ONLY_FIRING.encode(out);
    out.extend_from_slice(key);
    let chunked = begin_iterable(count, out);
    out.extend_from_slice(values);
    end_iterable(chunked, out);
}

/// The timestamp of a fired group's pane under `output_time`; a global
/// window's pane at its end is `end_of_global_window` (see
/// `Windowing::end_of_global_window`).
pub(crate) fn pane_timestamp(
    output_time: &OutputTime,
    end_of_global_window: Timestamp,
    w: &Window,
    min_ts: Timestamp,
    max_ts: Timestamp,
) -> Timestamp {
    match output_time {
        OutputTime::EndOfWindow if *w == Window::Global => end_of_global_window,
        // A custom window's end is unknown to the runner: the pane takes its
        // latest element's timestamp, which lies inside the window.
        OutputTime::EndOfWindow if matches!(w, Window::Custom(_)) => max_ts,
        OutputTime::EndOfWindow => w.max_timestamp(),
        OutputTime::EarliestInPane => min_ts,
        OutputTime::LatestInPane => max_ts,
    }
}

impl GroupByKeyBuffer {
    /// A buffer for input elements coded `WindowedValue<input_coder, window_coder>`
    /// (`input_coder` must be a KV coder) grouped under `windowing`.
    pub fn new(input_coder: Coder, window_coder: Coder, windowing: Windowing) -> Self {
        GroupByKeyBuffer {
            keep: KeepTs::new(&windowing.output_time),
            input_coder,
            window_coder,
            windowing,
            hasher: foldhash::fast::RandomState::default(),
            table: HashTable::new(),
            slots: Slots::default(),
            free: Vec::new(),
            dead: Vec::new(),
            live: 0,
            expiry: Expiry::default(),
            hot: None,
            total: 0,
            keys_seen: 0,
            unmerged: HashSet::new(),
            held_bytes: 0,
            spill: None,
        }
    }

    /// Bounds the memory of the buffered groups to about `budget` bytes:
    /// beyond it they are written as a sorted run to a new file in `dir`
    /// (created if needed; files are removed once read back or when the
    /// buffer is dropped) and merged back when their windows fire, so the
    /// output is the same groups with their values in the same order. Only
    /// for non-merging WindowFns (global, fixed, sliding...); a merging one
    /// keeps everything in memory.
    pub fn with_spill(mut self, budget: usize, dir: std::path::PathBuf) -> Self {
        if matches!(
            self.windowing.window_fn,
            WindowFn::Global | WindowFn::NonMerging
        ) {
            self.spill = Some(Spill {
                budget: budget.max(1),
                dir,
                merger: Merger { runs: Vec::new() },
                parts: 0,
                chunk: (budget / 4).clamp(64 << 10, 64 << 20),
                more: false,
                error: None,
            });
        }
        self
    }

    /// Estimated bytes the in-memory groups use.
    pub fn memory_estimate(&self) -> usize {
        self.held_bytes + self.live * KEY_OVERHEAD
    }

    /// How many sorted runs are on disk.
    pub fn spilled_runs(&self) -> usize {
        self.spill.as_ref().map_or(0, |s| s.merger.runs.len())
    }

    /// True when complete groups are still waiting in spilled runs after
    /// [`Self::take_complete`] returned its most bytes: call it again.
    pub fn has_more_complete(&self) -> bool {
        self.spill.as_ref().is_some_and(|s| s.more)
    }

    /// The first I/O error of spilling (naming the spill directory), once.
    pub fn take_error(&mut self) -> Option<String> {
        self.spill.as_mut().and_then(|s| s.error.take())
    }

    /// Writes every in-memory group to a new sorted run and empties memory.
    fn spill_all(&mut self) -> Result<(), String> {
        let Some(spill) = self.spill.as_mut() else {
            return Ok(());
        };
        if self.live == 0 {
            return Ok(());
        }
        // A group keeps one timestamp (KeepTs): it is both bounds of its
        // record, and the merge's min and max keep it right.
        fn record<'a>(
            key: &'a [u8],
            w: &Window,
            count: u64,
            ts: Timestamp,
            values: &'a [u8],
        ) -> RecordRef<'a> {
            let mut window = Vec::new();
            w.encode(&mut window);
            RecordRef {
                expiry: w.max_timestamp(),
                key,
                window,
                min_ts: ts,
                max_ts: ts,
                count,
                values,
            }
        }
        let mut records = Vec::with_capacity(self.live);
        for slot in self.slots.iter() {
            match &slot.groups {
                KeyGroups::None => {}
                KeyGroups::One { window, count, ts } => {
                    records.push(record(slot.key(), window, *count, *ts, slot.one_values()))
                }
                KeyGroups::Many(map, _) => records.extend(
                    map.iter()
                        .map(|((_, w), g)| record(slot.key(), w, g.count, g.ts, &g.values)),
                ),
            }
        }
        let parts = records.len();
        let run = write_run(&spill.dir, records)
            .and_then(RunReader::open)
            .map_err(|e| {
                format!(
                    "GroupByKey could not spill to {}: {e} (set weir serve --gbk_memory_budget_mb higher or free disk space)",
                    spill.dir.display()
                )
            })?;
        spill.merger.runs.push(run);
        spill.parts += parts;
        tracing::debug!(
            runs = spill.merger.runs.len(),
            groups = parts,
            "GroupByKey spilled its groups to disk"
        );
        self.slots.clear();
        self.free.clear();
        self.dead.clear();
        self.table.clear();
        self.expiry.clear();
        self.live = 0;
        self.held_bytes = 0;
        if let Some((slot, _, _)) = &mut self.hot {
            *slot = None;
        }
        Ok(())
    }

    /// `take_complete` when runs are on disk: memory joins the runs, then
    /// complete groups are merged out, at most `chunk` bytes per call.
    fn take_complete_spilled(&mut self, complete: &impl Fn(Timestamp) -> bool) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        let mem_due = self.expiry.due(complete);
        let spill = self.spill.as_ref().expect("spilling");
        let run_due = spill.merger.next_expiry().is_some_and(complete);
        if !mem_due && !run_due {
            return out;
        }
        if let Err(e) = self.spill_all() {
            self.spill
                .as_mut()
                .expect("spilling")
                .error
                .get_or_insert(e);
            return out;
        }
        let output_time = self.windowing.output_time.clone();
        let end_of_global_window = self.windowing.end_of_global_window;
        let window_coder = self.window_coder.clone();
        let spill = self.spill.as_mut().expect("spilling");
        let mut bytes = 0usize;
        spill.more = false;
        while spill.merger.next_expiry().is_some_and(complete) {
            if bytes >= spill.chunk {
                spill.more = true;
                break;
            }
            let r = match spill.merger.pop() {
                Ok(Some(r)) => r,
                Ok(None) => break,
                Err(e) => {
                    spill.error.get_or_insert(format!(
                        "GroupByKey could not read back its spill in {}: {e}",
                        spill.dir.display()
                    ));
                    break;
                }
            };
            let w = match Window::decode(&window_coder, &r.window) {
                Ok((w, _)) => w,
                Err(e) => {
                    spill
                        .error
                        .get_or_insert(format!("GroupByKey spill: window: {e}"));
                    break;
                }
            };
            let ts = pane_timestamp(&output_time, end_of_global_window, &w, r.min_ts, r.max_ts);
            let mut e = Vec::new();
            encode_pane(&r.key, &w, ts, r.count, &r.values, &mut e);
            bytes += e.len();
            out.push(e);
        }
        spill.parts = spill.parts.saturating_sub(out.len());
        out
    }

    /// The encoded key of an input element, for routing to a worker.
    pub fn key_of(
        input_coder: &Coder,
        window_coder: &Coder,
        element: &[u8],
    ) -> Result<Vec<u8>, String> {
        Ok(parse(input_coder, window_coder, element)?.key.to_vec())
    }

    /// A hash of an input element's encoded key, the same on every worker
    /// and run: routes elements of one key to one worker without copying it.
    pub fn route_hash(
        input_coder: &Coder,
        window_coder: &Coder,
        element: &[u8],
    ) -> Result<u64, String> {
        let key = parse(input_coder, window_coder, element)?.key;
        Ok(foldhash::fast::FixedState::with_seed(ROUTE_SEED).hash_one(key))
    }

    fn key_hash(&self, key: &[u8]) -> KeyHash {
        self.hasher.hash_one(key) as KeyHash
    }

    fn find(&self, key: &[u8]) -> Option<u32> {
        self.find_hashed(key, self.key_hash(key))
    }

    fn find_hashed(&self, key: &[u8], h: KeyHash) -> Option<u32> {
        let slots = &self.slots;
        self.table
            .find(spread(h), |&id| {
                slots.get(id).is_some_and(|s| s.hash == h && s.key() == key)
            })
            .copied()
    }

    /// The slot of `key`, created if absent (with room for a first value of
    /// `value_bytes`, see [`Slot::new`]).
    fn slot_for(&mut self, key: &[u8], value_bytes: usize) -> Result<u32, String> {
        let h = self.key_hash(key);
        if let Some(id) = self.find_hashed(key, h) {
            return Ok(id);
        }
        let slot = Slot::new(key, h, value_bytes)?;
        let id = match self.free.pop() {
            Some(id) => id,
            None => u32::try_from(self.slots.push_empty())
                .map_err(|_| "GroupByKey takes fewer than 2^32 keys per worker".to_string())?,
        };
        *self.slots.entry(id) = Some(slot);
        self.live += 1;
        self.keys_seen += 1;
        self.held_bytes += key.len();
        if !self.dead.is_empty() && self.table.len() >= self.table.capacity() {
            // The table is about to grow: drop dead entries first.
            self.drop_dead();
        }
        let slots = &self.slots;
        // A dead entry (freed slot) rehashes anywhere: lookups skip it.
        self.table.insert_unique(spread(h), id, |&id| {
            slots.get(id).map_or(0, |s| spread(s.hash))
        });
        Ok(id)
    }

    /// Removes freed slots from the table; their ids become reusable.
    fn drop_dead(&mut self) {
        let slots = &self.slots;
        self.table.retain(|id| slots.get(*id).is_some());
        self.free.append(&mut self.dead);
    }

    fn free_slot(&mut self, id: u32) {
        let Some(slot) = self.slots.entry(id).take() else {
            return;
        };
        self.held_bytes -= slot.key_len as usize;
        self.live -= 1;
        self.dead.push(id);
        if self.live == 0 {
            self.slots.clear();
            self.free.clear();
            self.dead.clear();
            self.table.clear();
        } else if self.dead.len() > self.live.max(1024) {
            self.drop_dead();
        }
        if let Some((hot_slot, _, _)) = &mut self.hot {
            if *hot_slot == Some(id) {
                *hot_slot = None;
            }
        }
    }

    fn slot_mut(&mut self, id: u32) -> &mut Slot {
        self.slots.get_mut(id).expect("live slot")
    }

    /// Adds one input element (an encoded windowed KV).
    pub fn insert(&mut self, element: &[u8]) -> Result<(), String> {
        let p = parse(&self.input_coder, &self.window_coder, element)?;
        let windows = p.windows.as_slice();
        if windows.is_empty() {
            // In no window: the element is in no group (Beam drops it).
            return Ok(());
        }
        let id = self.slot_for(p.key, p.value.len())?;
        let n = windows.len() as u64;
        let keep = self.keep;
        // Split borrows: the slot is updated while its new windows are indexed.
        let (slots, expiry) = (&mut self.slots, &mut self.expiry);
        let slot = slots.get_mut(id).expect("live slot");
        for w in windows {
            if slot.add(w, p.timestamp, p.value, keep) {
                expiry.index(w, id);
            }
        }
        let seen = slot.seen();
        self.held_bytes += p.value.len() * windows.len();
        self.total += n;
        let over = self.spill.as_ref().is_some_and(|s| {
            s.error.is_none() && self.held_bytes + self.live * KEY_OVERHEAD > s.budget
        });
        let leader = self.hot.as_ref().map(|(_, _, c)| *c).unwrap_or(0);
        if seen > leader {
            match &mut self.hot {
                Some((Some(h), _, c)) if *h == id => *c = seen,
                _ => self.hot = Some((Some(id), p.key.to_vec(), seen)),
            }
        }
        if over {
            // A failed spill fails the job through take_error.
            if let Err(e) = self.spill_all() {
                if let Some(s) = self.spill.as_mut() {
                    s.error.get_or_insert(e);
                }
            }
        }
        match self.windowing.window_fn {
            WindowFn::Sessions { .. } => {
                let merges = match &self.slot_mut(id).groups {
                    KeyGroups::Many(map, _) if map.len() > 1 => {
                        session_merges(map.keys().map(|(_, w)| w))
                    }
                    _ => Vec::new(),
                };
                self.merge(id, merges);
            }
            WindowFn::CustomMerging => {
                if !self.unmerged.contains(p.key) {
                    self.unmerged.insert(p.key.to_vec());
                }
            }
            WindowFn::Global | WindowFn::NonMerging => {}
        }
        Ok(())
    }

    /// Moves the groups of each set of merged windows of slot `id` into their
    /// merged window, indexing new windows.
    fn merge(&mut self, id: u32, merges: Merges) {
        for (target, members) in merges {
            if members == [target.clone()] {
                continue;
            }
            let keep = self.keep;
            let slot = self.slot_mut(id);
            let mut g = Group::empty(keep);
            for m in members {
                if let Some(old) = slot.remove(&m) {
                    g.absorb(old, keep);
                }
            }
            if slot.put(&target, g, keep) {
                self.expiry.index(&target, id);
            }
        }
    }

    /// True when a key whose windows a custom merging WindowFn has not
    /// merged yet has a window `complete` (by its max timestamp): merge
    /// before [`Self::take_complete`].
    pub fn needs_merge(&self, complete: impl Fn(Timestamp) -> bool) -> bool {
        self.unmerged.iter().any(|k| {
            self.find(k).is_some_and(|id| {
                self.slots
                    .get(id)
                    .is_some_and(|s| s.any_window(|w| complete(w.max_timestamp())))
            })
        })
    }

    /// Takes the keys with unmerged windows, each with all its windows (the
    /// input of `beam:transform:merge_windows:v1`).
    pub fn take_unmerged(&mut self) -> Vec<(Vec<u8>, Vec<Window>)> {
        let keys: Vec<Vec<u8>> = self.unmerged.drain().collect();
        keys.into_iter()
            .filter_map(|k| {
                let id = self.find(&k)?;
                let windows = self.slots.get(id)?.windows();
                Some((k, windows))
            })
            .collect()
    }

    /// Applies merges of `key`'s windows computed by the SDK: the values of
    /// each group of windows move into their merged window.
    pub fn apply_merges(&mut self, key: &[u8], merges: Merges) {
        if let Some(id) = self.find(key) {
            self.merge(id, merges);
        }
    }

    /// The key with most values, when it holds at least half of all values
    /// this buffer saw and at least a thousand (one key's values cannot be
    /// spread over workers); then resets the counts of all values and of
    /// keys. A key's count covers the values it got while it had buffered
    /// windows, so a key still buffered keeps its count.
    pub fn take_hot_key(&mut self) -> Option<HotKey> {
        let hot = self.hot.take();
        let total = std::mem::take(&mut self.total);
        let keys = std::mem::take(&mut self.keys_seen);
        if self.live == 0 {
            self.slots.clear();
            self.free.clear();
            self.dead.clear();
            self.table.clear();
            self.expiry.clear();
        }
        let (_, key, values) = hot?;
        (keys >= HOT_KEY_MIN_KEYS && values >= HOT_KEY_MIN_VALUES && values * 2 >= total).then_some(HotKey {
            key,
            values,
            total,
        })
    }

    /// How many keys have buffered windows (groups in spilled runs count
    /// once per run they are in).
    pub fn buffered_keys(&self) -> usize {
        self.live + self.spill.as_ref().map_or(0, |s| s.parts)
    }

    /// True when nothing is buffered (in memory or spilled).
    pub fn is_empty(&self) -> bool {
        self.live == 0 && self.spill.as_ref().is_none_or(|s| s.merger.is_empty())
    }

    /// Bytes of encoded keys and values held (a lower bound of the memory
    /// the buffer uses).
    pub fn held_bytes(&self) -> usize {
        self.held_bytes
    }

    /// Removes and encodes every group whose window is complete, i.e. for
    /// which `complete(window.max_timestamp())` is true; `complete` must be
    /// monotone (true for a timestamp means true for every earlier one, as
    /// "the watermark has passed it" is). Each output is an encoded windowed
    /// `KV<key, iterable<value>>`, pane on-time and only firing. Costs
    /// O(log windows) when nothing is complete.
    ///
    /// With spilled runs ([`Self::with_spill`]) the complete groups come
    /// back from disk a chunk at a time: see [`Self::has_more_complete`].
    pub fn take_complete(&mut self, complete: impl Fn(Timestamp) -> bool) -> Vec<Vec<u8>> {
        if self.spill.as_ref().is_some_and(|s| !s.merger.is_empty()) {
            return self.take_complete_spilled(&complete);
        }
        let mut out = Vec::new();
        while let Some(entry) = self.expiry.by_time.first_entry() {
            if !complete(*entry.key()) {
                break;
            }
            for id in entry.remove() {
                self.fire_slot(id, &complete, &mut out);
            }
        }
        if self.expiry.take_global(&complete) {
            for id in 0..self.slots.len {
                if self.live == 0 {
                    break;
                }
                self.fire_slot(id as u32, &complete, &mut out);
            }
        }
        out
    }

    /// Fires the complete windows of slot `id` (if it is still live).
    fn fire_slot(
        &mut self,
        id: u32,
        complete: &impl Fn(Timestamp) -> bool,
        out: &mut Vec<Vec<u8>>,
    ) {
        let output_time = self.windowing.output_time.clone();
        let end_of_global_window = self.windowing.end_of_global_window;
        let Some(slot) = self.slots.get_mut(id) else {
            return;
        };
        let mut fired = 0usize;
        let mut emit = |key: &[u8], w: &Window, count: u64, ts: Timestamp, values: &[u8]| {
            let ts = pane_timestamp(&output_time, end_of_global_window, w, ts, ts);
            let mut bytes = Vec::new();
            encode_pane(key, w, ts, count, values, &mut bytes);
            out.push(bytes);
            fired += values.len();
        };
        match &mut slot.groups {
            KeyGroups::None => {}
            KeyGroups::One { window, .. } => {
                if !complete(window.max_timestamp()) {
                    return;
                }
                let KeyGroups::One { window, count, ts } =
                    std::mem::replace(&mut slot.groups, KeyGroups::None)
                else {
                    unreachable!()
                };
                emit(slot.key(), &window, count, ts, slot.one_values());
            }
            KeyGroups::Many(map, _) => {
                while let Some(e) = map.first_entry() {
                    if !complete(e.key().0) {
                        break;
                    }
                    let ((_, w), g) = e.remove_entry();
                    emit(key_of(&slot.data, slot.key_len), &w, g.count, g.ts, &g.values);
                }
            }
        }
        let empty = slot.is_empty();
        self.held_bytes -= fired;
        if empty {
            self.free_slot(id);
        }
    }
}

/// Drains `unmerged` into (key, all its windows) pairs, for keys that still
/// hold windows in `by_key`.
pub(crate) fn take_unmerged<V>(
    unmerged: &mut HashSet<Vec<u8>>,
    by_key: &std::collections::HashMap<Vec<u8>, std::collections::HashMap<Window, V>>,
) -> Vec<(Vec<u8>, Vec<Window>)> {
    unmerged
        .drain()
        .filter_map(|k| {
            let windows: Vec<Window> = by_key.get(&k)?.keys().cloned().collect();
            Some((k, windows))
        })
        .collect()
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
    use weir_model::WindowedValue;

    fn kv(key: &str, value: u8, ts: i64, window: Window) -> Vec<u8> {
        element(key, value, ts, vec![window])
    }

    /// An encoded `KV<string, varint>` (`value` under 128) in `windows`.
    pub(super) fn element(key: &str, value: u8, ts: i64, windows: Vec<Window>) -> Vec<u8> {
        let mut v = vec![key.len() as u8];
        v.extend_from_slice(key.as_bytes());
        v.push(value);
        let mut out = Vec::new();
        WindowedValue {
            timestamp: Timestamp(ts),
            windows,
            pane: PaneInfo::NO_FIRING,
            value: v,
        }
        .encode(&mut out);
        out
    }

    pub(super) fn coder() -> Coder {
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
    use weir_model::WindowedValue;

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
        // Fewer keys than HOT_KEY_MIN_KEYS: a sharded write, not a skew.
        for i in 0..4000 {
            b.insert(&element(&format!("shard{}", i % 4 / 3))).unwrap();
        }
        assert_eq!(b.take_hot_key(), None, "two keys, 75% on one");
    }
}

#[cfg(test)]
mod index_tests {
    use super::tests::{coder, element};
    use super::*;
    use weir_model::windowed_value::encode_iterable;
    use weir_model::WindowedValue;

    fn iw(start: i64, end: i64) -> Window {
        Window::Interval {
            start: Timestamp(start),
            end: Timestamp(end),
        }
    }

    fn buffer(window_fn: WindowFn, output_time: OutputTime) -> GroupByKeyBuffer {
        let windowing = Windowing {
            window_fn,
            output_time,
            ..Windowing::global()
        };
        GroupByKeyBuffer::new(coder(), Coder::IntervalWindow, windowing)
    }

    /// (key, window, timestamp, values) of each output, sorted.
    fn decoded(out: &[Vec<u8>]) -> Vec<(String, Window, i64, Vec<u8>)> {
        let c = Coder::Kv(
            Box::new(Coder::StringUtf8),
            Box::new(Coder::Iterable(Box::new(Coder::VarInt))),
        );
        let mut got: Vec<_> = out
            .iter()
            .map(|b| {
                let (wv, used) = WindowedValue::decode(&c, &Coder::IntervalWindow, b).unwrap();
                assert_eq!(used, b.len());
                assert_eq!(wv.pane, PaneInfo::ON_TIME_AND_ONLY_FIRING);
                assert_eq!(wv.windows.len(), 1);
                let klen = wv.value[0] as usize;
                let key = String::from_utf8(wv.value[1..1 + klen].to_vec()).unwrap();
                let values = wv.value[1 + klen + 4..].to_vec();
                let n = i32::from_be_bytes(wv.value[1 + klen..1 + klen + 4].try_into().unwrap());
                assert_eq!(n as usize, values.len());
                (key, wv.windows[0].clone(), wv.timestamp.0, values)
            })
            .collect();
        got.sort();
        got
    }

    #[test]
    fn fixed_windows_fire_as_the_watermark_passes_each_end() {
        let mut b = buffer(WindowFn::NonMerging, OutputTime::EndOfWindow);
        for (k, v, ts) in [
            ("a", 1, 1),
            ("a", 2, 12),
            ("b", 3, 5),
            ("a", 4, 25),
            ("b", 5, 7),
        ] {
            let w = iw(ts / 10 * 10, ts / 10 * 10 + 10);
            b.insert(&element(k, v, ts, vec![w])).unwrap();
        }
        assert_eq!(b.buffered_keys(), 2);
        // Watermark 9: nothing is complete ([0,10) has max timestamp 9).
        assert!(b.take_complete(|t| Timestamp(9) > t).is_empty());
        assert_eq!(
            decoded(&b.take_complete(|t| Timestamp(10) > t)),
            vec![
                ("a".into(), iw(0, 10), 9, vec![1]),
                ("b".into(), iw(0, 10), 9, vec![3, 5]),
            ]
        );
        assert_eq!(b.buffered_keys(), 1, "b has no windows left");
        assert_eq!(
            decoded(&b.take_complete(|t| Timestamp(20) > t)),
            vec![("a".into(), iw(10, 20), 19, vec![2])]
        );
        assert!(b.take_complete(|t| Timestamp(20) > t).is_empty());
        assert_eq!(
            decoded(&b.take_complete(|_| true)),
            vec![("a".into(), iw(20, 30), 29, vec![4])]
        );
        assert!(b.is_empty());
        assert_eq!(b.held_bytes(), 0);
    }

    #[test]
    fn an_element_in_several_windows_joins_each() {
        let mut b = buffer(WindowFn::NonMerging, OutputTime::LatestInPane);
        // Sliding windows: size 10, period 5.
        b.insert(&element("k", 1, 7, vec![iw(0, 10), iw(5, 15)]))
            .unwrap();
        b.insert(&element("k", 2, 11, vec![iw(5, 15), iw(10, 20)]))
            .unwrap();
        assert_eq!(
            decoded(&b.take_complete(|t| Timestamp(15) > t)),
            vec![
                ("k".into(), iw(0, 10), 7, vec![1]),
                ("k".into(), iw(5, 15), 11, vec![1, 2]),
            ]
        );
        assert_eq!(
            decoded(&b.take_complete(|_| true)),
            vec![("k".into(), iw(10, 20), 11, vec![2])]
        );
    }

    #[test]
    fn merged_sessions_fire_at_the_merged_end_not_the_stale_one() {
        let mut b = buffer(
            WindowFn::Sessions { gap_ms: 10 },
            OutputTime::EarliestInPane,
        );
        b.insert(&element("k", 1, 0, vec![iw(0, 10)])).unwrap();
        b.insert(&element("k", 2, 5, vec![iw(5, 15)])).unwrap();
        // [0, 10) alone would be complete at watermark 10; merged into
        // [0, 15) it waits for 15.
        assert!(b.take_complete(|t| Timestamp(10) > t).is_empty());
        assert_eq!(b.buffered_keys(), 1);
        // A third element extends the session again.
        b.insert(&element("k", 3, 13, vec![iw(13, 23)])).unwrap();
        assert!(b.take_complete(|t| Timestamp(15) > t).is_empty());
        assert_eq!(
            decoded(&b.take_complete(|t| Timestamp(23) > t)),
            vec![("k".into(), iw(0, 23), 0, vec![1, 2, 3])]
        );
        assert!(b.is_empty());
    }

    #[test]
    fn custom_merges_index_the_merged_window() {
        let windowing = Windowing {
            window_fn: WindowFn::CustomMerging,
            output_time: OutputTime::EndOfWindow,
            ..Windowing::global()
        };
        let mut b = GroupByKeyBuffer::new(coder(), Coder::IntervalWindow, windowing);
        b.insert(&element("a", 1, 1, vec![iw(1, 2)])).unwrap();
        b.insert(&element("a", 2, 3, vec![iw(3, 4)])).unwrap();
        b.take_unmerged();
        b.apply_merges(&[1, b'a'], vec![(iw(1, 50), vec![iw(1, 2), iw(3, 4)])]);
        assert!(b.take_complete(|t| Timestamp(10) > t).is_empty());
        assert_eq!(
            decoded(&b.take_complete(|t| Timestamp(50) > t)),
            vec![("a".into(), iw(1, 50), 49, vec![1, 2])]
        );
    }

    #[test]
    fn late_data_after_a_firing_forms_a_new_pane() {
        let mut b = buffer(WindowFn::NonMerging, OutputTime::EndOfWindow);
        b.insert(&element("k", 1, 1, vec![iw(0, 10)])).unwrap();
        assert_eq!(b.take_complete(|t| Timestamp(100) > t).len(), 1);
        b.insert(&element("k", 2, 2, vec![iw(0, 10)])).unwrap();
        assert_eq!(
            decoded(&b.take_complete(|t| Timestamp(100) > t)),
            vec![("k".into(), iw(0, 10), 9, vec![2])]
        );
    }

    #[test]
    fn reused_slots_do_not_fire_early() {
        let mut b = buffer(WindowFn::NonMerging, OutputTime::EndOfWindow);
        b.insert(&element("a", 1, 1, vec![iw(0, 10)])).unwrap();
        assert_eq!(b.take_complete(|t| Timestamp(10) > t).len(), 1);
        // "b" takes a's freed slot; an index entry of a's at 9 is gone, and
        // b's own window waits for its end.
        b.insert(&element("b", 2, 30, vec![iw(30, 40)])).unwrap();
        b.insert(&element("a", 3, 35, vec![iw(30, 40)])).unwrap();
        assert!(b.take_complete(|t| Timestamp(39) > t).is_empty());
        assert_eq!(b.buffered_keys(), 2);
        assert_eq!(
            decoded(&b.take_complete(|t| Timestamp(40) > t)),
            vec![
                ("a".into(), iw(30, 40), 39, vec![3]),
                ("b".into(), iw(30, 40), 39, vec![2]),
            ]
        );
    }

    /// Keys of many lengths, values interleaved, some keys gaining a second
    /// window (their one group then moves out of the key's allocation) and
    /// losing it: every group fires with its own key, values and timestamp.
    #[test]
    fn interleaved_keys_of_any_length_keep_their_groups() {
        for output_time in [OutputTime::EarliestInPane, OutputTime::LatestInPane] {
            let earliest = matches!(output_time, OutputTime::EarliestInPane);
            let mut b = buffer(WindowFn::NonMerging, output_time);
            let mut want: BTreeMap<(String, Window), (i64, Vec<u8>)> = BTreeMap::new();
            for round in 0..6u8 {
                // Short keys share their one window's allocation, longer
                // ones (past SHARED_KEY_MAX with the length byte) do not.
                for len in (0..40usize).chain([63, 64, 65, 100]) {
                    let key = "k".repeat(len);
                    // Keys of odd length get a second window in round 3.
                    let w = if round == 3 && len % 2 == 1 { iw(100, 200) } else { iw(0, 100) };
                    let ts = (w.max_timestamp().0 - i64::from(round) * 7 - len as i64).max(0);
                    let v = round * 40 + len as u8 % 40;
                    b.insert(&element(&key, v % 128, ts, vec![w.clone()])).unwrap();
                    let e = want.entry((key, w)).or_insert((ts, Vec::new()));
                    e.0 = if earliest { e.0.min(ts) } else { e.0.max(ts) };
                    e.1.push(v % 128);
                }
            }
            // The expected groups of window `w`, sorted as `decoded` sorts.
            let groups_of = |w: Window| {
                let mut g: Vec<_> = want
                    .iter()
                    .filter(|((_, have), _)| *have == w)
                    .map(|((k, w), (ts, vs))| (k.clone(), w.clone(), *ts, vs.clone()))
                    .collect();
                g.sort();
                g
            };
            assert_eq!(decoded(&b.take_complete(|t| Timestamp(100) > t)), groups_of(iw(0, 100)));
            assert_eq!(decoded(&b.take_complete(|_| true)), groups_of(iw(100, 200)));
            assert!(b.is_empty());
            assert_eq!(b.held_bytes(), 0);
        }
    }

    /// An element in no window joins no group and leaves nothing behind.
    #[test]
    fn an_element_in_no_window_is_dropped() {
        let mut b = buffer(WindowFn::NonMerging, OutputTime::EndOfWindow);
        b.insert(&element("k", 1, 0, vec![])).unwrap();
        assert!(b.is_empty());
        assert_eq!(b.held_bytes(), 0);
        assert!(b.take_complete(|_| true).is_empty());
    }

    /// A group past `i32::MAX` values fires in the iterable's chunked form
    /// (no panic): count -1, one chunk of them all, an empty chunk.
    #[test]
    fn a_group_past_i32_max_values_fires_chunked() {
        let mut out = Vec::new();
        encode_pane(b"\x01k", &Window::Global, Timestamp(0), 1 << 31, b"vv", &mut out);
        assert!(out.ends_with(b"\x01k\xff\xff\xff\xff\x80\x80\x80\x80\x08vv\x00"));
    }

    /// The output bytes equal those built the plain way (decode, collect
    /// values, encode_iterable, WindowedValue::encode).
    #[test]
    fn panes_are_byte_identical_to_the_plain_encoding() {
        let mut b = buffer(WindowFn::NonMerging, OutputTime::LatestInPane);
        let mut expected = Vec::new();
        for key in 0..50u8 {
            let k = format!("key{key}");
            let values: Vec<u8> = (0..(key % 7 + 1)).collect();
            for (i, v) in values.iter().enumerate() {
                b.insert(&element(&k, *v, 100 + i as i64, vec![iw(0, 1000)]))
                    .unwrap();
            }
            let mut value = vec![k.len() as u8];
            value.extend_from_slice(k.as_bytes());
            let parts: Vec<Vec<u8>> = values.iter().map(|v| vec![*v]).collect();
            encode_iterable(parts.iter().map(|p| p.as_slice()), &mut value);
            let mut bytes = Vec::new();
            WindowedValue {
                timestamp: Timestamp(100 + values.len() as i64 - 1),
                windows: vec![iw(0, 1000)],
                pane: PaneInfo::ON_TIME_AND_ONLY_FIRING,
                value,
            }
            .encode(&mut bytes);
            expected.push(bytes);
        }
        let mut got = b.take_complete(|_| true);
        got.sort();
        expected.sort();
        assert_eq!(got, expected);
    }

    #[test]
    fn route_hash_depends_on_the_key_only() {
        let c = coder();
        let h = |k: &str, v: u8, w: Window| {
            GroupByKeyBuffer::route_hash(
                &c,
                &Coder::IntervalWindow,
                &element(k, v, v as i64, vec![w]),
            )
            .unwrap()
        };
        assert_eq!(h("a", 1, iw(0, 10)), h("a", 9, iw(50, 60)));
        assert_ne!(h("a", 1, iw(0, 10)), h("b", 1, iw(0, 10)));
        assert_eq!(
            GroupByKeyBuffer::key_of(
                &c,
                &Coder::IntervalWindow,
                &element("ab", 1, 0, vec![iw(0, 1)])
            )
            .unwrap(),
            vec![2, b'a', b'b']
        );
        let bad = GroupByKeyBuffer::route_hash(
            &Coder::VarInt,
            &Coder::IntervalWindow,
            &element("a", 1, 0, vec![iw(0, 1)]),
        );
        assert!(bad.unwrap_err().contains("beam:coder:kv:v1"));
    }

    /// Keys freed in bulk (their ids dropped from the table in one pass and
    /// reused) are still found, and values never land in another key.
    #[test]
    fn freed_and_reused_slots_keep_keys_apart() {
        let mut b = buffer(WindowFn::NonMerging, OutputTime::EndOfWindow);
        let key = |i: i64| format!("k{i}");
        for i in 0..3000i64 {
            let end = if i < 2500 { 10 } else { 100 };
            b.insert(&element(&key(i), (i % 100) as u8, 1, vec![iw(0, end)]))
                .unwrap();
        }
        assert_eq!(b.take_complete(|t| Timestamp(10) > t).len(), 2500);
        assert_eq!(b.buffered_keys(), 500);
        for i in (0..3000i64).rev() {
            b.insert(&element(&key(i), 7, 50, vec![iw(0, 100)]))
                .unwrap();
        }
        assert_eq!(b.buffered_keys(), 3000);
        let got = decoded(&b.take_complete(|_| true));
        assert_eq!(got.len(), 3000);
        for (k, w, _, values) in got {
            let i: i64 = k[1..].parse().unwrap();
            assert_eq!(w, iw(0, 100));
            let want = if i < 2500 {
                vec![7]
            } else {
                vec![(i % 100) as u8, 7]
            };
            assert_eq!(values, want, "{k}");
        }
        assert!(b.is_empty());
    }

    /// Many keys, few complete: take_complete touches only the complete ones
    /// (a full scan per call would make this quadratic and time out).
    #[test]
    fn take_complete_is_proportional_to_what_fired() {
        let mut b = buffer(WindowFn::NonMerging, OutputTime::EndOfWindow);
        for i in 0..20_000i64 {
            b.insert(&element(&format!("k{i}"), 1, i, vec![iw(i, i + 1)]))
                .unwrap();
        }
        let start = std::time::Instant::now();
        let mut fired = 0;
        for wm in 1..=20_000i64 {
            fired += b.take_complete(|t| Timestamp(wm) > t).len();
            assert_eq!(fired as i64, wm);
        }
        assert!(b.is_empty());
        assert!(start.elapsed() < std::time::Duration::from_secs(5));
    }
}

#[cfg(test)]
mod spill_tests {
    use super::*;
    use weir_model::WindowedValue;

    fn iw(start: i64, end: i64) -> Window {
        Window::Interval {
            start: Timestamp(start),
            end: Timestamp(end),
        }
    }

    fn element(key: u32, value: u32, ts: i64, window: Window) -> Vec<u8> {
        let k = format!("key-{key}");
        let mut v = vec![k.len() as u8];
        v.extend_from_slice(k.as_bytes());
        weir_model::varint::encode_varint(i64::from(value), &mut v);
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

    fn buffer(window_fn: WindowFn, output_time: OutputTime) -> GroupByKeyBuffer {
        let windowing = Windowing {
            window_fn,
            output_time,
            ..Windowing::global()
        };
        GroupByKeyBuffer::new(
            Coder::Kv(Box::new(Coder::StringUtf8), Box::new(Coder::VarInt)),
            Coder::IntervalWindow,
            windowing,
        )
    }

    fn dir(name: &str) -> std::path::PathBuf {
        std::env::temp_dir().join(format!("weir-spill-{name}-{}", std::process::id()))
    }

    /// Everything complete under `wm`, calling take_complete until no more.
    fn drain(b: &mut GroupByKeyBuffer, wm: i64) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        loop {
            out.extend(b.take_complete(|t| Timestamp(wm) > t));
            if !b.has_more_complete() {
                break;
            }
        }
        assert_eq!(b.take_error(), None);
        out.sort();
        out
    }

    /// A spilling buffer gives the same output bytes (values in the same
    /// order within each group) as an in-memory one, window by window.
    #[test]
    fn spilled_groups_come_back_identical_in_order_and_windows() {
        let d = dir("identical");
        let mut plain = buffer(WindowFn::NonMerging, OutputTime::LatestInPane);
        let mut spilled =
            buffer(WindowFn::NonMerging, OutputTime::LatestInPane).with_spill(4096, d.clone());
        for i in 0..3000u32 {
            // 200 keys, 3 fixed windows of 100 ms; values in arrival order.
            let ts = i64::from(i % 300);
            let e = element(
                i * 7919 % 200,
                i,
                ts,
                iw(ts / 100 * 100, ts / 100 * 100 + 100),
            );
            plain.insert(&e).unwrap();
            spilled.insert(&e).unwrap();
        }
        assert!(
            spilled.spilled_runs() > 3,
            "runs: {}",
            spilled.spilled_runs()
        );
        assert!(spilled.memory_estimate() <= 4096);
        for wm in [50, 100, 200, 1000] {
            let a = drain(&mut plain, wm);
            let b = drain(&mut spilled, wm);
            assert_eq!(a.len(), b.len(), "watermark {wm}");
            assert_eq!(a, b, "watermark {wm}");
        }
        assert!(plain.is_empty() && spilled.is_empty());
        let left: Vec<_> = std::fs::read_dir(&d)
            .map(|r| r.collect())
            .unwrap_or_default();
        assert!(left.is_empty(), "run files left: {left:?}");
        let _ = std::fs::remove_dir(&d);
    }

    /// The global window, one value per key (the load tests' shape), output
    /// in chunks no larger than the chunk size plus one group.
    #[test]
    fn global_window_spill_is_read_back_in_chunks() {
        let d = dir("global");
        let windowing = Windowing {
            window_fn: WindowFn::Global,
            output_time: OutputTime::EndOfWindow,
            ..Windowing::global()
        };
        let coder = Coder::Kv(Box::new(Coder::StringUtf8), Box::new(Coder::VarInt));
        let mut plain =
            GroupByKeyBuffer::new(coder.clone(), Coder::GlobalWindow, windowing.clone());
        let mut spilled = GroupByKeyBuffer::new(coder, Coder::GlobalWindow, windowing)
            .with_spill(64 << 10, d.clone());
        for i in 0..20_000u32 {
            let k = format!("k{}", i % 5000);
            let mut v = vec![k.len() as u8];
            v.extend_from_slice(k.as_bytes());
            weir_model::varint::encode_varint(i64::from(i), &mut v);
            let mut e = Vec::new();
            WindowedValue {
                timestamp: Timestamp(i64::from(i)),
                windows: vec![Window::Global],
                pane: PaneInfo::NO_FIRING,
                value: v,
            }
            .encode(&mut e);
            plain.insert(&e).unwrap();
            spilled.insert(&e).unwrap();
        }
        assert!(spilled.spilled_runs() >= 2);
        assert!(spilled
            .take_complete(|t| t < Timestamp::END_OF_GLOBAL_WINDOW)
            .is_empty());
        let mut chunks = 0;
        let mut got = Vec::new();
        loop {
            let part = spilled.take_complete(|_| true);
            let bytes: usize = part.iter().map(Vec::len).sum();
            assert!(bytes <= (64 << 10) + 200, "chunk of {bytes} bytes");
            got.extend(part);
            chunks += 1;
            if !spilled.has_more_complete() {
                break;
            }
        }
        assert!(chunks > 1);
        let mut want = plain.take_complete(|_| true);
        want.sort();
        got.sort();
        assert_eq!(got.len(), 5000);
        assert_eq!(got, want);
        assert!(spilled.is_empty());
        let _ = std::fs::remove_dir(&d);
    }

    #[test]
    fn merging_windows_stay_in_memory() {
        let d = dir("sessions");
        let mut b = buffer(
            WindowFn::Sessions { gap_ms: 10 },
            OutputTime::EarliestInPane,
        )
        .with_spill(1, d.clone());
        for i in 0..100u32 {
            b.insert(&element(
                i % 3,
                i,
                i64::from(i),
                iw(i64::from(i), i64::from(i) + 10),
            ))
            .unwrap();
        }
        assert_eq!(b.spilled_runs(), 0);
        assert_eq!(drain(&mut b, 1000).len(), 3);
        assert!(!d.exists());
    }

    #[test]
    fn an_unwritable_spill_directory_is_reported() {
        let file = dir("not-a-dir");
        std::fs::write(&file, b"x").unwrap();
        let mut b =
            buffer(WindowFn::NonMerging, OutputTime::EndOfWindow).with_spill(1, file.clone());
        b.insert(&element(1, 1, 1, iw(0, 10))).unwrap();
        let err = b.take_error().unwrap();
        assert_eq!(b.take_error(), None, "reported once");
        assert!(
            err.contains("could not spill to") && err.contains("not-a-dir"),
            "{err}"
        );
        let _ = std::fs::remove_file(&file);
    }
}
