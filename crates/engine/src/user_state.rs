//! User state: the committed cells of a stateful stage on one timely worker
//! and one bundle's buffered writes over them, for the user-state keys of
//! `StateKey` in beam_fn_api.proto (the harness maps each key to a
//! [`StateCell`], with a map key or a sort-key range where the key has one):
//!
//! * `BagUserState` (`beam:user_state:bag:v1`): a bag of encoded values. The
//!   Python SDK also keeps value, combining and set state in bags.
//! * `MultimapUserState` / `MultimapKeysUserState`
//!   (`beam:user_state:multimap:v1`, Java's MapState and MultimapState): map
//!   keys, each with a bag of encoded values.
//! * `OrderedListUserState` (`beam:user_state:ordered_list:v1`): values
//!   ordered by an `i64` sort key (Python's `OrderedListStateSpec` uses the
//!   timestamp in microseconds), read and cleared by sort-key range.
//!
//! Every cell is identified by (transform id, state id, encoded window,
//! encoded key): the same key in two windows has two separate cells.
//!
//! A bundle writes into its own [`BundleUserState`], which reads through to
//! the committed [`UserState`]; its writes reach the committed state only
//! through [`BundleUserState::commit`], called when the bundle succeeded, so
//! a failed attempt leaves no trace and its retry duplicates nothing.
//!
//! The engine owns the state: each SDK stage operator holds one [`UserState`]
//! for the keys routed to its worker (stateful inputs are exchanged by key),
//! hands it to every bundle in [`crate::BundleRequest::user_state`], and
//! garbage-collects a window's state once the window expires
//! ([`UserState::expire`]), as Beam's `StatefulDoFnRunner` and Dataflow do.
//! The stores of a job in one process share a [`StateUsage`]: its live cells
//! and their estimated bytes, which the harness reports as the job's gauges,
//! and the job's budget of bytes, past which appends are refused (Weir keeps
//! user state in memory, so one job cannot take the server's memory).

use std::collections::{BTreeMap, HashMap};
use std::ops::Bound;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use weir_model::varint::{decode_varint, encode_varint};
use weir_model::{Coder, Timestamp, Window};

/// One user-state cell: the fields every `StateKey.*UserState` message of
/// beam_fn_api.proto has (`transform_id`, `user_state_id`, `window` and
/// `key`, the last two as the SDK encoded them).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct StateCell {
    pub transform_id: String,
    pub state_id: String,
    pub window: Vec<u8>,
    pub key: Vec<u8>,
}

/// One map key of a multimap cell (`StateKey.MultimapUserState`): the cell
/// and the encoded map key.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MapKey {
    pub cell: StateCell,
    pub map_key: Vec<u8>,
}

/// A range of ordered-list sort keys. Beam's `OrderedListRange` is
/// `[start, end)`; a state key without a range means every sort key.
pub type SortKeyRange = (Bound<i64>, Bound<i64>);

/// Sort keys of an ordered-list cell (`StateKey.OrderedListUserState`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListRange {
    pub cell: StateCell,
    pub range: SortKeyRange,
}

/// False for a range that holds no sort key (`start >= end`), which
/// `BTreeMap::range` would reject.
fn non_empty(r: &SortKeyRange) -> bool {
    match *r {
        (Bound::Included(s), Bound::Excluded(e)) => s < e,
        _ => true,
    }
}

fn contains(r: &SortKeyRange, k: i64) -> bool {
    std::ops::RangeBounds::contains(r, &k)
}

/// Values of one ordered list by sort key; values with the same sort key keep
/// the order they were appended in. Each value is kept as the bytes of its
/// element coder (without the length prefix it travels with).
type OrderedList = BTreeMap<i64, Vec<Vec<u8>>>;

/// Removes the sort keys of `range` from `list`; returns the estimated
/// bytes removed ([`ordered_values_bytes`]).
fn remove_range(list: &mut OrderedList, range: &SortKeyRange) -> usize {
    if !non_empty(range) {
        return 0;
    }
    let doomed: Vec<i64> = list.range(*range).map(|(k, _)| *k).collect();
    doomed
        .iter()
        .filter_map(|k| list.remove(k))
        .map(|values| ordered_values_bytes(&values))
        .sum()
}

/// Decodes the data of an Append on an ordered list: a concatenation of
/// `KV<varint sort key, length-prefixed value>` (beam_fn_api.proto,
/// `StateAppendRequest.data`). Errors name the offending byte offset.
pub fn decode_ordered_entries(data: &[u8]) -> Result<Vec<(i64, Vec<u8>)>, String> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < data.len() {
        let bad = |what: &str| format!("bad ordered-list append data at byte {at}: {what}");
        let (sort_key, n) = decode_varint(&data[at..]).map_err(|e| bad(&e.to_string()))?;
        let (len, m) = decode_varint(&data[at + n..]).map_err(|e| bad(&e.to_string()))?;
        let start = at + n + m;
        let end = usize::try_from(len)
            .ok()
            .and_then(|l| start.checked_add(l))
            .filter(|&e| e <= data.len())
            .ok_or_else(|| bad(&format!("value length {len} runs past the data")))?;
        out.push((sort_key, data[start..end].to_vec()));
        at = end;
    }
    Ok(out)
}

/// Appends one ordered-list entry in the wire form of a Get response
/// (varint sort key, varint length, value bytes).
fn encode_ordered_entry(sort_key: i64, value: &[u8], out: &mut Vec<u8>) {
    encode_varint(sort_key, out);
    encode_varint(value.len() as i64, out);
    out.extend_from_slice(value);
}

/// Where an ordered-list Get resumes: at sort key `.0`, after skipping the
/// first `.1` values of that sort key. Encoded as two Beam varints; this is
/// the `continuation_token` Weir hands out, opaque to the SDK.
fn encode_token(sort_key: i64, skip: u64) -> Vec<u8> {
    let mut out = Vec::new();
    encode_varint(sort_key, &mut out);
    encode_varint(skip as i64, &mut out);
    out
}

fn decode_token(token: &[u8]) -> Result<(i64, u64), String> {
    let bad = || format!("bad ordered-list continuation token {token:?}");
    let (sort_key, n) = decode_varint(token).map_err(|_| bad())?;
    let (skip, m) = decode_varint(&token[n..]).map_err(|_| bad())?;
    if n + m != token.len() || skip < 0 {
        return Err(bad());
    }
    Ok((sort_key, skip as u64))
}

/// One page of an ordered-list Get: the encoded entries and the continuation
/// token of the next page (empty on the last page).
#[derive(Debug, PartialEq, Eq)]
pub struct Page {
    pub data: Vec<u8>,
    pub continuation_token: Vec<u8>,
}

/// Estimated bytes one cell costs besides its ids, window, key and values:
/// its map entry, the four `Vec`s of its [`StateCell`] and its share of the
/// window index.
pub const CELL_OVERHEAD_BYTES: usize = 160;
/// Estimated bytes one map key of a multimap cell costs besides its encoding
/// and its values (a `BTreeMap` entry of two `Vec`s).
pub const MAP_KEY_OVERHEAD_BYTES: usize = 64;
/// Estimated bytes one ordered-list value costs besides its encoding (its
/// `Vec` and its share of its sort key's `BTreeMap` entry).
pub const ORDERED_VALUE_OVERHEAD_BYTES: usize = 40;

/// Estimated bytes of a live cell without its values.
fn cell_bytes(c: &StateCell) -> usize {
    CELL_OVERHEAD_BYTES + c.transform_id.len() + c.state_id.len() + c.window.len() + c.key.len()
}

/// Estimated bytes of one map key of a multimap and its values.
fn map_key_bytes(map_key: &[u8], values: &[u8]) -> usize {
    MAP_KEY_OVERHEAD_BYTES + map_key.len() + values.len()
}

/// Estimated bytes of every map key of a multimap and their values.
fn multimap_bytes(map: &BTreeMap<Vec<u8>, Vec<u8>>) -> usize {
    map.iter().map(|(k, v)| map_key_bytes(k, v)).sum()
}

/// Estimated bytes of one ordered-list value.
fn ordered_value_bytes(value: &[u8]) -> usize {
    ORDERED_VALUE_OVERHEAD_BYTES + value.len()
}

/// Estimated bytes of the values of one sort key of an ordered list.
fn ordered_values_bytes(values: &[Vec<u8>]) -> usize {
    values.iter().map(|v| ordered_value_bytes(v)).sum()
}

/// Removes the cells of `cells` that `doomed` picks; returns their
/// estimated bytes: each cell's own and `values_bytes` of its state.
fn remove_cells<V>(
    cells: &mut HashMap<StateCell, V>,
    doomed: impl Fn(&StateCell) -> bool,
    values_bytes: impl Fn(&V) -> usize,
) -> usize {
    let mut removed = 0;
    cells.retain(|c, values| {
        let keep = !doomed(c);
        if !keep {
            removed += cell_bytes(c) + values_bytes(values);
        }
        keep
    });
    removed
}

/// What the user state of one job holds in one process, over all its
/// stores: live cells (bag, multimap and ordered-list cells, each one
/// (transform, state id, window, key) with at least one value) and their
/// estimated bytes in memory (encodings plus [`CELL_OVERHEAD_BYTES`] and
/// the like), each with the most there were at once; and the job's budget
/// of bytes, past which [`BundleUserState`]'s appends are refused.
#[derive(Debug, Default)]
pub struct StateUsage {
    live: AtomicUsize,
    peak: AtomicUsize,
    bytes: AtomicUsize,
    peak_bytes: AtomicUsize,
    /// Bytes the job's uncommitted bundles have reserved under the budget
    /// (their appends, estimated as they will be committed).
    reserved: AtomicUsize,
    budget: Option<usize>,
}

impl StateUsage {
    /// No state yet, with a budget of `budget` bytes (None: no bound).
    pub fn with_budget(budget: Option<usize>) -> Self {
        StateUsage {
            budget,
            ..StateUsage::default()
        }
    }

    /// Cells that hold state now.
    pub fn live(&self) -> usize {
        self.live.load(Ordering::Relaxed)
    }

    /// The most cells [`StateUsage::live`] counted after any commit (cells
    /// only appear through commits, so this is the job's peak).
    pub fn peak(&self) -> usize {
        self.peak.load(Ordering::Relaxed)
    }

    /// Estimated bytes the committed state holds now.
    pub fn bytes(&self) -> usize {
        self.bytes.load(Ordering::Relaxed)
    }

    /// The most [`StateUsage::bytes`] after any commit.
    pub fn peak_bytes(&self) -> usize {
        self.peak_bytes.load(Ordering::Relaxed)
    }

    /// The job's budget of bytes; None: no bound.
    pub fn budget(&self) -> Option<usize> {
        self.budget
    }

    /// Moves the live count from `before` to `after` cells of one store.
    fn changed(&self, before: usize, after: usize) {
        let live = if after >= before {
            self.live.fetch_add(after - before, Ordering::Relaxed) + (after - before)
        } else {
            self.live.fetch_sub(before - after, Ordering::Relaxed) - (before - after)
        };
        self.peak.fetch_max(live, Ordering::Relaxed);
    }

    /// Adds `size`'s change to the bytes of one store.
    fn resized(&self, size: Resize) {
        let bytes = if size.added >= size.removed {
            let d = size.added - size.removed;
            self.bytes.fetch_add(d, Ordering::Relaxed) + d
        } else {
            let d = size.removed - size.added;
            self.bytes.fetch_sub(d, Ordering::Relaxed).saturating_sub(d)
        };
        self.peak_bytes.fetch_max(bytes, Ordering::Relaxed);
    }

    /// Bytes uncommitted bundles have reserved (always 0 without a budget).
    pub fn reserved(&self) -> usize {
        self.reserved.load(Ordering::Relaxed)
    }

    /// Reserves `more` bytes for an append to `cell`, if the committed
    /// bytes and every bundle's reservations stay within the budget.
    /// Errors, past it: the message names the state, its transform, the
    /// sizes and the flag that sets the budget.
    fn admit(&self, cell: &StateCell, more: usize) -> Result<(), String> {
        let Some(budget) = self.budget else {
            return Ok(());
        };
        let reserved = self.reserved.fetch_add(more, Ordering::Relaxed).saturating_add(more);
        let held = self.bytes();
        let total = held.saturating_add(reserved);
        if total <= budget {
            return Ok(());
        }
        self.reserved.fetch_sub(more, Ordering::Relaxed);
        Err(format!(
            "user state {:?} of transform {:?}: appending {more} bytes would take the job's user state to about {total} bytes ({held} committed, {} more in bundles not yet committed), past its budget of {budget} bytes (weir serve --user_state_memory_budget_mb). Weir keeps user state in memory: clear state the DoFn no longer needs (or set timers that do), or raise the budget",
            cell.state_id,
            cell.transform_id,
            reserved - more,
        ))
    }

    /// Gives back `n` bytes reserved by [`StateUsage::admit`].
    fn release(&self, n: usize) {
        if self.budget.is_some() && n > 0 {
            self.reserved.fetch_sub(n, Ordering::Relaxed);
        }
    }
}

/// Bytes a commit or an expiry added to and removed from a store.
#[derive(Clone, Copy, Debug, Default)]
struct Resize {
    added: usize,
    removed: usize,
}

impl Resize {
    /// Something of `old` bytes became `new` bytes.
    fn replaced(&mut self, old: usize, new: usize) {
        self.removed += old;
        self.added += new;
    }
}

/// Committed user state of one stateful stage on one timely worker, for
/// every cell of its transforms. Cells that become empty are dropped.
#[derive(Default)]
pub struct UserState {
    committed: Mutex<Committed>,
    usage: Arc<StateUsage>,
}

#[derive(Default)]
struct Committed {
    /// Bag cells: the concatenated encoded values.
    bags: HashMap<StateCell, Vec<u8>>,
    /// Multimap cells: encoded map key -> concatenated encoded values. A map
    /// key put with values that encode to no bytes is kept, with no bytes.
    multimaps: HashMap<StateCell, BTreeMap<Vec<u8>, Vec<u8>>>,
    ordered_lists: HashMap<StateCell, OrderedList>,
    /// How many cells of the maps above each (transform id, encoded window)
    /// has, so that expiry looks at each window once, not at every cell.
    windows: HashMap<String, HashMap<Vec<u8>, usize>>,
    /// Estimated bytes of the cells above (see [`StateUsage::bytes`]).
    bytes: usize,
}

impl Committed {
    /// Counts a cell that `existed` before a commit and is `live` after it,
    /// and its bytes in `size`.
    fn track(&mut self, key: &StateCell, existed: bool, live: bool, size: &mut Resize) {
        if existed == live {
            return;
        }
        if live {
            size.added += cell_bytes(key);
        } else {
            size.removed += cell_bytes(key);
        }
        let windows = self.windows.entry(key.transform_id.clone()).or_default();
        let count = windows.entry(key.window.clone()).or_default();
        if live {
            *count += 1;
        } else {
            *count = count.saturating_sub(1);
            if *count == 0 {
                windows.remove(&key.window);
                if windows.is_empty() {
                    self.windows.remove(&key.transform_id);
                }
            }
        }
    }
}

/// When the state of `window` (encoded with `window_coder`) is
/// garbage-collected: the watermark must pass its max timestamp plus
/// `allowed_lateness_ms`. `None` (never before the job ends) for the global
/// window, a custom window (its max timestamp is unknown to the runner) and
/// bytes that do not decode as exactly one window.
fn expiry_time(window_coder: &Coder, window: &[u8], allowed_lateness_ms: i64) -> Option<Timestamp> {
    match Window::decode(window_coder, window) {
        Ok((w @ Window::Interval { .. }, used)) if used == window.len() => Some(
            w.max_timestamp()
                .saturating_add_millis(allowed_lateness_ms.max(0)),
        ),
        _ => None,
    }
}

impl UserState {
    /// An empty store whose cells and bytes count towards `usage` (the
    /// job's).
    pub fn new(usage: Arc<StateUsage>) -> Self {
        UserState {
            committed: Mutex::default(),
            usage,
        }
    }

    fn committed(&self) -> std::sync::MutexGuard<'_, Committed> {
        self.committed.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Deletes, for every key and state id, the committed cells of the
    /// transforms `transform_ids` whose window (encoded with `window_coder`,
    /// the window coder of the transforms' input) has expired at
    /// `input_watermark` (event time, ms): `max_timestamp +
    /// allowed_lateness_ms < input_watermark`. The global window and custom
    /// windows never expire here (see [`expiry_time`]). Returns the number of
    /// cells deleted. Costs one decode per distinct window of the
    /// transforms; cells are visited only when some window expired.
    ///
    /// Beam's `StatefulDoFnRunner` clears a window's state at the same time
    /// (its garbage-collection timer at the window's max timestamp plus the
    /// allowed lateness).
    pub fn expire(
        &self,
        transform_ids: &[String],
        window_coder: &Coder,
        allowed_lateness_ms: i64,
        input_watermark: Timestamp,
    ) -> usize {
        let mut committed = self.committed();
        let mut expired: HashMap<String, std::collections::HashSet<Vec<u8>>> = HashMap::new();
        for t in transform_ids {
            let Some(windows) = committed.windows.get(t) else {
                continue;
            };
            let gone: std::collections::HashSet<Vec<u8>> = windows
                .keys()
                .filter(|w| {
                    expiry_time(window_coder, w, allowed_lateness_ms)
                        .is_some_and(|at| at < input_watermark)
                })
                .cloned()
                .collect();
            if !gone.is_empty() {
                expired.insert(t.clone(), gone);
            }
        }
        if expired.is_empty() {
            return 0;
        }
        let doomed = |c: &StateCell| {
            expired
                .get(c.transform_id.as_str())
                .is_some_and(|ws| ws.contains(c.window.as_slice()))
        };
        let before = committed.live_cells();
        let size = Resize {
            added: 0,
            removed: remove_cells(&mut committed.bags, doomed, Vec::len)
                + remove_cells(&mut committed.multimaps, doomed, multimap_bytes)
                + remove_cells(&mut committed.ordered_lists, doomed, |list| {
                    list.values().map(|v| ordered_values_bytes(v)).sum()
                }),
        };
        for (t, gone) in &expired {
            if let Some(windows) = committed.windows.get_mut(t) {
                windows.retain(|w, _| !gone.contains(w));
                if windows.is_empty() {
                    committed.windows.remove(t);
                }
            }
        }
        let after = committed.live_cells();
        committed.bytes = committed.bytes.saturating_sub(size.removed);
        self.usage.changed(before, after);
        self.usage.resized(size);
        before - after
    }

    /// How many cells of this store hold state: bags, multimaps and ordered
    /// lists with at least one value, each a (transform, state id, window,
    /// key).
    pub fn live_cells(&self) -> usize {
        self.committed().live_cells()
    }

    /// Estimated bytes of this store's cells (see [`StateUsage::bytes`]).
    pub fn bytes(&self) -> usize {
        self.committed().bytes
    }

    /// The job's usage this store adds to.
    pub fn usage(&self) -> &Arc<StateUsage> {
        &self.usage
    }
}

impl Committed {
    fn live_cells(&self) -> usize {
        self.bags.len() + self.multimaps.len() + self.ordered_lists.len()
    }
}

/// One bundle's writes to one multimap cell.
#[derive(Default)]
struct MultimapChanges {
    /// The bundle cleared the whole multimap (before `keys` were written).
    cleared: bool,
    /// Per map key, what the bundle did to it.
    keys: BTreeMap<Vec<u8>, MapKeyChanges>,
}

/// One bundle's writes to one map key of a multimap.
#[derive(Default)]
struct MapKeyChanges {
    /// The bundle removed the map key (before the appends below).
    cleared: bool,
    /// The bundle appended to the map key since, maybe values that encode
    /// to no bytes: Java's SetState is a multimap of `VoidCoder` values, so
    /// an Append with empty data puts a key, and the key then exists.
    put: bool,
    /// The encoded values appended since.
    appended: Vec<u8>,
    /// Bytes reserved for the appends since ([`Changes::pending`]).
    reserved: usize,
}

/// One bundle's writes to one ordered-list cell, in the order that gives the
/// same result as replaying them: first the committed values of `removed`
/// ranges go, then `added` is merged in.
#[derive(Default)]
struct OrderedListChanges {
    removed: Vec<SortKeyRange>,
    added: OrderedList,
}

#[derive(Default)]
struct Changes {
    /// Per bag: whether the bundle cleared it, and what it appended since.
    bags: HashMap<StateCell, (bool, Vec<u8>)>,
    multimaps: HashMap<StateCell, MultimapChanges>,
    ordered_lists: HashMap<StateCell, OrderedListChanges>,
    /// Bytes this bundle reserved under the job's budget
    /// ([`StateUsage::admit`]): its appends not cleared by it since, and its
    /// new cells and map keys, estimated as a commit will count them. Given
    /// back when the bundle commits or is dropped.
    pending: usize,
    /// Why an append was refused: the bundle then fails at
    /// [`BundleUserState::commit`], whatever the SDK made of the refusal
    /// (Python's SDK does not look at an Append's error).
    refused: Option<String>,
}

impl Changes {
    /// Reserves `more` bytes for an append to `cell` under the job's budget
    /// in `usage`. Errors: past the budget, or an append of this bundle was
    /// refused before.
    fn admit(&mut self, usage: &StateUsage, cell: &StateCell, more: usize) -> Result<(), String> {
        if let Some(e) = &self.refused {
            return Err(e.clone());
        }
        if let Err(e) = usage.admit(cell, more) {
            self.refused = Some(e.clone());
            return Err(e);
        }
        self.pending += more;
        Ok(())
    }

    /// Gives back `n` reserved bytes of writes the bundle undid.
    fn release(&mut self, usage: &StateUsage, n: usize) {
        let n = n.min(self.pending);
        self.pending -= n;
        usage.release(n);
    }
}

impl Drop for BundleUserState {
    /// A bundle that never committed gives back its reservation.
    fn drop(&mut self) {
        let pending = self.changes().pending;
        self.base.usage.release(pending);
    }
}

/// One bundle's view of user state: its own writes over the committed state,
/// committed only when the bundle succeeds (a failed attempt leaves no trace).
pub struct BundleUserState {
    base: Arc<UserState>,
    changes: Mutex<Changes>,
}

impl BundleUserState {
    /// A view with no writes yet.
    pub fn new(base: Arc<UserState>) -> Self {
        BundleUserState {
            base,
            changes: Mutex::default(),
        }
    }

    fn changes(&self) -> std::sync::MutexGuard<'_, Changes> {
        self.changes.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn committed(&self) -> std::sync::MutexGuard<'_, Committed> {
        self.base.committed()
    }

    /// Why an append of this bundle was refused (the job's user state would
    /// have passed its budget); the bundle must then fail.
    pub fn refused(&self) -> Option<String> {
        self.changes().refused.clone()
    }

    /// Estimated bytes a commit adds for cell `key`: none when the bundle
    /// already `touched` it (counted then) or it holds committed state.
    fn new_cell_bytes(
        &self,
        key: &StateCell,
        touched: bool,
        committed: impl Fn(&Committed) -> bool,
    ) -> usize {
        if touched || committed(&self.committed()) {
            0
        } else {
            cell_bytes(key)
        }
    }

    // ---- BagUserState ----

    /// The bag's concatenated encoded values as this bundle sees them.
    pub fn get(&self, key: &StateCell) -> Vec<u8> {
        let changes = self.changes();
        let (cleared, appended) = changes
            .bags
            .get(key)
            .map(|(c, a)| (*c, a.as_slice()))
            .unwrap_or((false, &[]));
        let mut out = if cleared {
            Vec::new()
        } else {
            self.committed().bags.get(key).cloned().unwrap_or_default()
        };
        out.extend_from_slice(appended);
        out
    }

    /// Appends encoded values to the bag. Errors: the job's user state
    /// would pass its budget ([`StateUsage::budget`]).
    pub fn append(&self, key: &StateCell, data: &[u8]) -> Result<(), String> {
        let mut changes = self.changes();
        let cell = self.new_cell_bytes(key, changes.bags.contains_key(key), |c| {
            c.bags.contains_key(key)
        });
        changes.admit(&self.base.usage, key, cell + data.len())?;
        changes
            .bags
            .entry(key.clone())
            .or_default()
            .1
            .extend_from_slice(data);
        Ok(())
    }

    /// Empties the bag.
    pub fn clear(&self, key: &StateCell) {
        let mut changes = self.changes();
        if let Some((_, dropped)) = changes.bags.insert(key.clone(), (true, Vec::new())) {
            changes.release(&self.base.usage, dropped.len());
        }
    }

    // ---- MultimapUserState / MultimapKeysUserState ----

    /// The concatenated encoded values of one map key (`MultimapUserState`
    /// Get); empty when the map key has none.
    pub fn multimap_get(&self, k: &MapKey) -> Vec<u8> {
        let changes = self.changes();
        let change = changes.multimaps.get(&k.cell);
        let (cleared, appended) = match change.and_then(|c| c.keys.get(&k.map_key)) {
            Some(kc) => (
                kc.cleared || change.is_some_and(|c| c.cleared),
                kc.appended.as_slice(),
            ),
            None => (change.is_some_and(|c| c.cleared), &[][..]),
        };
        let mut out = if cleared {
            Vec::new()
        } else {
            self.committed()
                .multimaps
                .get(&k.cell)
                .and_then(|m| m.get(&k.map_key))
                .cloned()
                .unwrap_or_default()
        };
        out.extend_from_slice(appended);
        out
    }

    /// Appends encoded values to one map key (`MultimapUserState` Append).
    /// The map key exists from then on even when `data` is empty (values
    /// whose coder writes no bytes, such as the `VoidCoder` values of Java's
    /// SetState). Errors: the job's user state would pass its budget
    /// ([`StateUsage::budget`]).
    pub fn multimap_append(&self, k: &MapKey, data: &[u8]) -> Result<(), String> {
        let mut changes = self.changes();
        let change = changes.multimaps.get(&k.cell);
        let cell = self.new_cell_bytes(&k.cell, change.is_some(), |c| {
            c.multimaps.contains_key(&k.cell)
        });
        // A map key the bundle puts costs its entry unless it is committed
        // and the bundle did not remove it.
        let new_key = match change.and_then(|c| c.keys.get(&k.map_key)) {
            Some(kc) => !kc.put && (kc.cleared || !self.has_map_key(k)),
            None => change.is_some_and(|c| c.cleared) || !self.has_map_key(k),
        };
        let key_bytes = if new_key { map_key_bytes(&k.map_key, &[]) } else { 0 };
        changes.admit(&self.base.usage, &k.cell, cell + key_bytes + data.len())?;
        let kc = changes
            .multimaps
            .entry(k.cell.clone())
            .or_default()
            .keys
            .entry(k.map_key.clone())
            .or_default();
        kc.put = true;
        kc.appended.extend_from_slice(data);
        kc.reserved += key_bytes + data.len();
        Ok(())
    }

    /// Whether the committed multimap has map key `k`.
    fn has_map_key(&self, k: &MapKey) -> bool {
        self.committed()
            .multimaps
            .get(&k.cell)
            .is_some_and(|m| m.contains_key(&k.map_key))
    }

    /// Removes one map key and its values (`MultimapUserState` Clear).
    pub fn multimap_clear(&self, k: &MapKey) {
        let mut changes = self.changes();
        let dropped = changes
            .multimaps
            .entry(k.cell.clone())
            .or_default()
            .keys
            .insert(
                k.map_key.clone(),
                MapKeyChanges {
                    cleared: true,
                    ..MapKeyChanges::default()
                },
            );
        if let Some(dropped) = dropped {
            changes.release(&self.base.usage, dropped.reserved);
        }
    }

    /// The multimap of one (transform, state id, window, key) as this
    /// bundle sees it: every map key that was put and not removed since,
    /// with its concatenated encoded values (maybe none, maybe empty bytes),
    /// in the byte order of the map keys' encodings.
    fn multimap_view(&self, key: &StateCell) -> BTreeMap<Vec<u8>, Vec<u8>> {
        let changes = self.changes();
        let change = changes.multimaps.get(key);
        let mut view = BTreeMap::new();
        if !change.is_some_and(|c| c.cleared) {
            if let Some(m) = self.committed().multimaps.get(key) {
                view = m.clone();
            }
        }
        for (mk, kc) in change.map(|c| &c.keys).into_iter().flatten() {
            if kc.cleared {
                view.remove(mk);
            }
            if kc.put {
                view.entry(mk.clone())
                    .or_default()
                    .extend_from_slice(&kc.appended);
            }
        }
        view
    }

    /// The concatenated encoded map keys of the multimap
    /// (`MultimapKeysUserState` Get), in the byte order of their encodings.
    pub fn multimap_keys(&self, key: &StateCell) -> Vec<u8> {
        self.multimap_view(key).into_keys().flatten().collect()
    }

    /// Every entry of the multimap (`MultimapEntriesUserState` Get): for each
    /// map key, in the byte order of their encodings, the map key's encoding
    /// followed by its values as Beam's `IterableCoder` writes them in a
    /// nested context (a 4-byte big-endian count, then the values), i.e.
    /// `KV<K, Iterable<V>>` elements, which is how Java's
    /// `MultimapUserState.entries()` decodes them. `count_values` counts the
    /// values in a map key's concatenated value encodings (the runner stores
    /// bytes, so only the state's value coder knows where one value ends).
    /// Errors: those of `count_values`, or more than `i32::MAX` values.
    pub fn multimap_entries(
        &self,
        key: &StateCell,
        count_values: impl Fn(&[u8]) -> Result<usize, String>,
    ) -> Result<Vec<u8>, String> {
        let mut out = Vec::new();
        for (map_key, values) in self.multimap_view(key) {
            let n = count_values(&values)?;
            let n = i32::try_from(n).map_err(|_| {
                format!("{n} values under one map key are more than an iterable holds")
            })?;
            out.extend_from_slice(&map_key);
            out.extend_from_slice(&n.to_be_bytes());
            out.extend_from_slice(&values);
        }
        Ok(out)
    }

    /// Removes every map key (`MultimapKeysUserState` Clear; the same for
    /// `MultimapEntriesUserState` Clear).
    pub fn multimap_clear_all(&self, key: &StateCell) {
        let mut changes = self.changes();
        let dropped = changes.multimaps.insert(
            key.clone(),
            MultimapChanges {
                cleared: true,
                keys: BTreeMap::new(),
            },
        );
        let dropped: usize = dropped.iter().flat_map(|c| c.keys.values()).map(|kc| kc.reserved).sum();
        changes.release(&self.base.usage, dropped);
    }

    // ---- OrderedListUserState ----

    /// The values of the key's sort-key range as this bundle sees them, in
    /// sort-key order (values of one sort key in append order), encoded as
    /// `KV<varint, length-prefixed value>` and cut into pages of about
    /// `page_bytes` (at least one entry a page). `continuation_token` is
    /// empty for the first page, else the token of the previous page.
    /// Errors: a token Weir did not hand out.
    pub fn ordered_list_get(
        &self,
        k: &ListRange,
        continuation_token: &[u8],
        page_bytes: usize,
    ) -> Result<Page, String> {
        let range = k.range;
        // A token resumes at its sort key, skipping the values of that sort
        // key the previous pages held.
        let (resume, mut skip) = if continuation_token.is_empty() {
            (range.0, None)
        } else {
            let (sort_key, skip) = decode_token(continuation_token)?;
            (Bound::Included(sort_key), Some((sort_key, skip)))
        };
        let from: SortKeyRange = (resume, range.1);
        let mut page = Page {
            data: Vec::new(),
            continuation_token: Vec::new(),
        };
        if !non_empty(&from) {
            return Ok(page);
        }
        let changes = self.changes();
        let change = changes.ordered_lists.get(&k.cell);
        let committed = self.committed();
        let empty = OrderedList::new();
        let base = committed.ordered_lists.get(&k.cell).unwrap_or(&empty);
        let removed = |sk: i64| change.is_some_and(|c| c.removed.iter().any(|r| contains(r, sk)));
        let mut base_iter = base.range(from).filter(|(sk, _)| !removed(**sk)).peekable();
        let mut added_iter = change
            .map(|c| c.added.range(from))
            .into_iter()
            .flatten()
            .peekable();
        loop {
            // The next sort key from either side; committed values first.
            let next = match (base_iter.peek(), added_iter.peek()) {
                (None, None) => return Ok(page),
                (Some((b, _)), Some((a, _))) => **b.min(a),
                (Some((b, _)), None) => **b,
                (None, Some((a, _))) => **a,
            };
            let mut values: Vec<&Vec<u8>> = Vec::new();
            if base_iter.peek().is_some_and(|(sk, _)| **sk == next) {
                values.extend(base_iter.next().map(|(_, v)| v).into_iter().flatten());
            }
            if added_iter.peek().is_some_and(|(sk, _)| **sk == next) {
                values.extend(added_iter.next().map(|(_, v)| v).into_iter().flatten());
            }
            let skipped = match skip.take() {
                Some((sort_key, n)) if sort_key == next => n as usize,
                _ => 0,
            };
            for (i, v) in values.iter().enumerate().skip(skipped) {
                if !page.data.is_empty() && page.data.len() + v.len() > page_bytes {
                    page.continuation_token = encode_token(next, i as u64);
                    return Ok(page);
                }
                encode_ordered_entry(next, v, &mut page.data);
            }
        }
    }

    /// Adds encoded `KV<varint sort key, length-prefixed value>` entries
    /// (`OrderedListUserState` Append; a range the key has does not apply).
    /// Errors: data that does not decode as such entries.
    /// Errors also: the job's user state would pass its budget
    /// ([`StateUsage::budget`]).
    pub fn ordered_list_append(&self, key: &StateCell, data: &[u8]) -> Result<(), String> {
        let entries = decode_ordered_entries(data)?;
        let mut changes = self.changes();
        let cell = self.new_cell_bytes(key, changes.ordered_lists.contains_key(key), |c| {
            c.ordered_lists.contains_key(key)
        });
        let values: usize = entries.iter().map(|(_, v)| ordered_value_bytes(v)).sum();
        changes.admit(&self.base.usage, key, cell + values)?;
        let added = &mut changes.ordered_lists.entry(key.clone()).or_default().added;
        for (sort_key, value) in entries {
            added.entry(sort_key).or_default().push(value);
        }
        Ok(())
    }

    /// Removes the values of the key's sort-key range (`OrderedListUserState`
    /// Clear; no range clears the whole list).
    pub fn ordered_list_clear(&self, k: &ListRange) {
        let range = k.range;
        if !non_empty(&range) {
            return;
        }
        let mut changes = self.changes();
        let change = changes.ordered_lists.entry(k.cell.clone()).or_default();
        let dropped = remove_range(&mut change.added, &range);
        change.removed.push(range);
        changes.release(&self.base.usage, dropped);
    }

    /// Applies the bundle's writes to the committed state. Errors (and
    /// applies nothing): an append of the bundle was refused (the job's
    /// user state would have passed its budget), so the bundle must fail.
    pub fn commit(&self) -> Result<(), String> {
        let changes = std::mem::take(&mut *self.changes());
        if let Some(refused) = changes.refused {
            self.base.usage.release(changes.pending);
            return Err(refused);
        }
        let mut committed = self.committed();
        let committed = &mut *committed;
        let before = committed.live_cells();
        let mut size = Resize::default();
        for (key, (cleared, appended)) in changes.bags {
            let existed = committed.bags.contains_key(&key);
            let bag = committed.bags.entry(key.clone()).or_default();
            if cleared {
                size.removed += bag.len();
                bag.clear();
            }
            size.added += appended.len();
            bag.extend_from_slice(&appended);
            let live = !bag.is_empty();
            if !live {
                committed.bags.remove(&key);
            }
            committed.track(&key, existed, live, &mut size);
        }
        for (key, change) in changes.multimaps {
            let existed = committed.multimaps.contains_key(&key);
            let map = committed.multimaps.entry(key.clone()).or_default();
            if change.cleared {
                size.removed += multimap_bytes(map);
                map.clear();
            }
            for (map_key, kc) in change.keys {
                let old = map.get(&map_key).map_or(0, |v| map_key_bytes(&map_key, v));
                if kc.cleared {
                    map.remove(&map_key);
                }
                if kc.put {
                    map.entry(map_key.clone())
                        .or_default()
                        .extend_from_slice(&kc.appended);
                }
                let new = map.get(&map_key).map_or(0, |v| map_key_bytes(&map_key, v));
                size.replaced(old, new);
            }
            let live = !map.is_empty();
            if !live {
                committed.multimaps.remove(&key);
            }
            committed.track(&key, existed, live, &mut size);
        }
        for (key, change) in changes.ordered_lists {
            let existed = committed.ordered_lists.contains_key(&key);
            let list = committed.ordered_lists.entry(key.clone()).or_default();
            for range in &change.removed {
                size.removed += remove_range(list, range);
            }
            for (sort_key, values) in change.added {
                size.added += ordered_values_bytes(&values);
                list.entry(sort_key).or_default().extend(values);
            }
            let live = !list.is_empty();
            if !live {
                committed.ordered_lists.remove(&key);
            }
            committed.track(&key, existed, live, &mut size);
        }
        committed.bytes = (committed.bytes + size.added).saturating_sub(size.removed);
        self.base.usage.changed(before, committed.live_cells());
        self.base.usage.resized(size);
        // The committed bytes now count what the reservation stood for.
        self.base.usage.release(changes.pending);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A nested-context string encoding (varint length, bytes), as SDKs encode
    /// keys, map keys and string values.
    fn s(text: &str) -> Vec<u8> {
        let mut out = Vec::new();
        encode_varint(text.len() as i64, &mut out);
        out.extend_from_slice(text.as_bytes());
        out
    }

    fn cat(parts: &[&str]) -> Vec<u8> {
        parts.iter().flat_map(|p| s(p)).collect()
    }

    fn cell(transform_id: &str, state_id: &str, window: &[u8], key: &[u8]) -> StateCell {
        StateCell {
            transform_id: transform_id.into(),
            state_id: state_id.into(),
            window: window.to_vec(),
            key: key.to_vec(),
        }
    }

    fn bag(window: &[u8], key: &str) -> StateCell {
        cell("t", "bag", window, &s(key))
    }

    fn entry(window: &[u8], key: &str, map_key: &str) -> MapKey {
        MapKey {
            cell: map_keys(window, key),
            map_key: s(map_key),
        }
    }

    fn map_keys(window: &[u8], key: &str) -> StateCell {
        cell("t", "map", window, &s(key))
    }

    /// Sort keys `[start, end)` of the list of `key`; all of them for `None`.
    fn list(key: &str, range: Option<(i64, i64)>) -> ListRange {
        ListRange {
            cell: cell("t", "list", &[], &s(key)),
            range: match range {
                Some((start, end)) => (Bound::Included(start), Bound::Excluded(end)),
                None => (Bound::Unbounded, Bound::Unbounded),
            },
        }
    }

    /// Encodes (sort key, string value) entries as an SDK appends them.
    fn entries(items: &[(i64, &str)]) -> Vec<u8> {
        let mut out = Vec::new();
        for (k, v) in items {
            encode_ordered_entry(*k, &s(v), &mut out);
        }
        out
    }

    /// Decodes a Get's entries back to (sort key, string value).
    fn decoded(data: &[u8]) -> Vec<(i64, String)> {
        decode_ordered_entries(data)
            .unwrap()
            .into_iter()
            .map(|(k, v)| {
                let (len, n) = decode_varint(&v).unwrap();
                assert_eq!(n + len as usize, v.len());
                (k, String::from_utf8(v[n..].to_vec()).unwrap())
            })
            .collect()
    }

    fn read_all(b: &BundleUserState, k: &ListRange) -> Vec<(i64, String)> {
        decoded(&b.ordered_list_get(k, &[], usize::MAX).unwrap().data)
    }

    #[test]
    fn bag_writes_are_seen_by_their_bundle_and_committed_only_on_commit() {
        let base = Arc::new(UserState::default());
        let (w1, w2) = (b"w1".as_slice(), b"w2".as_slice());
        let a = BundleUserState::new(base.clone());
        a.append(&bag(w1, "k"), &cat(&["x", "y"])).unwrap();
        a.append(&bag(w2, "k"), &cat(&["other window"])).unwrap();
        assert_eq!(a.get(&bag(w1, "k")), cat(&["x", "y"]));
        assert_eq!(a.get(&bag(w2, "k")), cat(&["other window"]));
        // A failed attempt: never committed, leaves no trace.
        let failed = BundleUserState::new(base.clone());
        failed.append(&bag(w1, "k"), &cat(&["lost"])).unwrap();
        assert_eq!(BundleUserState::new(base.clone()).get(&bag(w1, "k")), b"");
        a.commit().unwrap();
        let b = BundleUserState::new(base.clone());
        assert_eq!(b.get(&bag(w1, "k")), cat(&["x", "y"]));
        b.clear(&bag(w1, "k"));
        b.append(&bag(w1, "k"), &cat(&["z"])).unwrap();
        assert_eq!(b.get(&bag(w1, "k")), cat(&["z"]));
        b.commit().unwrap();
        let c = BundleUserState::new(base);
        assert_eq!(c.get(&bag(w1, "k")), cat(&["z"]));
        assert_eq!(c.get(&bag(w2, "k")), cat(&["other window"]));
        assert_eq!(c.get(&bag(w1, "other key")), b"");
    }

    #[test]
    fn multimap_get_append_clear_and_keys() {
        let base = Arc::new(UserState::default());
        let w = b"w".as_slice();
        let a = BundleUserState::new(base.clone());
        a.multimap_append(&entry(w, "k", "b"), &cat(&["b1"])).unwrap();
        a.multimap_append(&entry(w, "k", "a"), &cat(&["a1", "a2"])).unwrap();
        a.multimap_append(&entry(w, "k", "b"), &cat(&["b2"])).unwrap();
        assert_eq!(a.multimap_get(&entry(w, "k", "a")), cat(&["a1", "a2"]));
        assert_eq!(a.multimap_get(&entry(w, "k", "b")), cat(&["b1", "b2"]));
        assert_eq!(a.multimap_get(&entry(w, "k", "none")), b"");
        assert_eq!(a.multimap_keys(&map_keys(w, "k")), cat(&["a", "b"]));
        // Other user keys and windows have their own multimaps.
        assert_eq!(a.multimap_keys(&map_keys(w, "k2")), b"");
        assert_eq!(a.multimap_keys(&map_keys(b"w2", "k")), b"");
        a.commit().unwrap();

        let b = BundleUserState::new(base.clone());
        assert_eq!(b.multimap_keys(&map_keys(w, "k")), cat(&["a", "b"]));
        b.multimap_clear(&entry(w, "k", "a"));
        assert_eq!(b.multimap_get(&entry(w, "k", "a")), b"");
        assert_eq!(b.multimap_keys(&map_keys(w, "k")), cat(&["b"]));
        b.multimap_append(&entry(w, "k", "a"), &cat(&["a3"])).unwrap();
        b.multimap_append(&entry(w, "k", "b"), &cat(&["b3"])).unwrap();
        assert_eq!(b.multimap_get(&entry(w, "k", "a")), cat(&["a3"]));
        assert_eq!(
            b.multimap_get(&entry(w, "k", "b")),
            cat(&["b1", "b2", "b3"])
        );
        assert_eq!(b.multimap_keys(&map_keys(w, "k")), cat(&["a", "b"]));
        // Not committed: the next bundle sees the first bundle's state.
        let c = BundleUserState::new(base.clone());
        assert_eq!(c.multimap_get(&entry(w, "k", "a")), cat(&["a1", "a2"]));
        b.commit().unwrap();

        let d = BundleUserState::new(base.clone());
        assert_eq!(d.multimap_get(&entry(w, "k", "a")), cat(&["a3"]));
        assert_eq!(
            d.multimap_get(&entry(w, "k", "b")),
            cat(&["b1", "b2", "b3"])
        );
        d.multimap_append(&entry(w, "k", "c"), &cat(&["c1"])).unwrap();
        d.multimap_clear_all(&map_keys(w, "k"));
        assert_eq!(d.multimap_keys(&map_keys(w, "k")), b"");
        assert_eq!(d.multimap_get(&entry(w, "k", "b")), b"");
        assert_eq!(d.multimap_get(&entry(w, "k", "c")), b"");
        d.multimap_append(&entry(w, "k", "b"), &cat(&["b4"])).unwrap();
        assert_eq!(d.multimap_get(&entry(w, "k", "b")), cat(&["b4"]));
        assert_eq!(d.multimap_keys(&map_keys(w, "k")), cat(&["b"]));
        d.commit().unwrap();

        let e = BundleUserState::new(base.clone());
        assert_eq!(e.multimap_keys(&map_keys(w, "k")), cat(&["b"]));
        assert_eq!(e.multimap_get(&entry(w, "k", "b")), cat(&["b4"]));
        assert_eq!(e.multimap_get(&entry(w, "k", "a")), b"");
        e.multimap_clear(&entry(w, "k", "b"));
        e.commit().unwrap();
        assert!(base.committed.lock().unwrap().multimaps.is_empty());
    }

    /// Java's SetState is a multimap of `VoidCoder` values: each add is an
    /// Append of no bytes, and the set's elements are the map keys. A key
    /// put with no bytes exists, in its bundle and after commit.
    #[test]
    fn multimap_keys_put_with_empty_values_exist() {
        let base = Arc::new(UserState::default());
        let w = b"w".as_slice();
        let a = BundleUserState::new(base.clone());
        a.multimap_append(&entry(w, "k", "x"), b"").unwrap();
        a.multimap_append(&entry(w, "k", "y"), b"").unwrap();
        a.multimap_append(&entry(w, "k", "x"), b"").unwrap();
        assert_eq!(a.multimap_keys(&map_keys(w, "k")), cat(&["x", "y"]));
        a.commit().unwrap();
        assert_eq!(base.live_cells(), 1);

        let b = BundleUserState::new(base.clone());
        assert_eq!(b.multimap_keys(&map_keys(w, "k")), cat(&["x", "y"]));
        assert_eq!(b.multimap_get(&entry(w, "k", "x")), b"");
        // SetState.add(e) is remove(e) then put(e, null).
        b.multimap_clear(&entry(w, "k", "y"));
        b.multimap_append(&entry(w, "k", "y"), b"").unwrap();
        b.multimap_clear(&entry(w, "k", "x"));
        assert_eq!(b.multimap_keys(&map_keys(w, "k")), cat(&["y"]));
        b.commit().unwrap();
        let c = BundleUserState::new(base.clone());
        assert_eq!(c.multimap_keys(&map_keys(w, "k")), cat(&["y"]));
        // Cleared and put again in one bundle: the key stays.
        c.multimap_clear_all(&map_keys(w, "k"));
        c.multimap_append(&entry(w, "k", "z"), b"").unwrap();
        assert_eq!(c.multimap_keys(&map_keys(w, "k")), cat(&["z"]));
        c.commit().unwrap();
        let d = BundleUserState::new(base.clone());
        assert_eq!(d.multimap_keys(&map_keys(w, "k")), cat(&["z"]));
        d.multimap_clear(&entry(w, "k", "z"));
        d.commit().unwrap();
        assert_eq!(
            base.live_cells(),
            0,
            "the last key removed empties the cell"
        );
    }

    /// Ordered lists carry each value's length, so an empty value is a value.
    #[test]
    fn ordered_list_keeps_empty_values() {
        let base = Arc::new(UserState::default());
        let all = list("k", None);
        let a = BundleUserState::new(base.clone());
        let mut data = Vec::new();
        encode_ordered_entry(4, b"", &mut data);
        encode_ordered_entry(2, b"", &mut data);
        a.ordered_list_append(&all.cell, &data).unwrap();
        a.commit().unwrap();
        let b = BundleUserState::new(base.clone());
        let page = b.ordered_list_get(&all, &[], usize::MAX).unwrap();
        assert_eq!(page.data, vec![2, 0, 4, 0]);
        assert_eq!(base.live_cells(), 1);
    }

    /// Entries list every map key, one with no value bytes too, with the
    /// count `count_values` gives for its bytes, committed and pending.
    #[test]
    fn multimap_entries_of_keys_with_and_without_value_bytes() {
        let base = Arc::new(UserState::default());
        let w = b"w".as_slice();
        let a = BundleUserState::new(base.clone());
        a.multimap_append(&entry(w, "k", "b"), &[7, 8]).unwrap();
        a.multimap_append(&entry(w, "k", "a"), b"").unwrap();
        a.commit().unwrap();
        let b = BundleUserState::new(base.clone());
        b.multimap_append(&entry(w, "k", "b"), &[9]).unwrap();
        let entries_key = map_keys(w, "k");
        // One byte a value.
        let got = b
            .multimap_entries(&entries_key, |v| Ok(v.len().max(1)))
            .unwrap();
        let want = [
            &s("a")[..],
            &[0, 0, 0, 1],
            &s("b"),
            &[0, 0, 0, 3],
            &[7, 8, 9],
        ]
        .concat();
        assert_eq!(got, want);
        let err = b
            .multimap_entries(&entries_key, |_| Err("bad values".to_string()))
            .unwrap_err();
        assert_eq!(err, "bad values");
        let err = b
            .multimap_entries(&entries_key, |_| Ok(usize::MAX))
            .unwrap_err();
        assert!(err.contains("more than an iterable holds"), "{err}");
    }

    #[test]
    fn ordered_list_reads_by_range_in_sort_key_order() {
        let base = Arc::new(UserState::default());
        let a = BundleUserState::new(base.clone());
        let all = list("k", None);
        a.ordered_list_append(&all.cell, &entries(&[(5, "e"), (-3, "neg"), (1, "b1")]))
            .unwrap();
        a.commit().unwrap();
        let b = BundleUserState::new(base.clone());
        b.ordered_list_append(&all.cell, &entries(&[(1, "b2"), (9, "i"), (i64::MIN, "min")]))
            .unwrap();
        let expected = [
            (i64::MIN, "min"),
            (-3, "neg"),
            (1, "b1"),
            (1, "b2"),
            (5, "e"),
            (9, "i"),
        ];
        let expected: Vec<_> = expected.iter().map(|(k, v)| (*k, v.to_string())).collect();
        assert_eq!(read_all(&b, &all), expected);
        assert_eq!(
            read_all(&b, &list("k", Some((i64::MIN, i64::MAX)))),
            expected
        );
        assert_eq!(
            read_all(&b, &list("k", Some((1, 9)))),
            expected[2..5].to_vec()
        );
        assert_eq!(read_all(&b, &list("k", Some((2, 2)))), vec![]);
        assert_eq!(read_all(&b, &list("k", Some((7, 2)))), vec![]);
        assert_eq!(read_all(&b, &list("other", None)), vec![]);

        b.ordered_list_clear(&list("k", Some((0, 6))));
        let after: Vec<_> = [
            expected[0].clone(),
            expected[1].clone(),
            expected[5].clone(),
        ]
        .to_vec();
        assert_eq!(read_all(&b, &all), after);
        // An append after the clear is kept, in a cleared range too.
        b.ordered_list_append(&all.cell, &entries(&[(3, "c")])).unwrap();
        assert_eq!(
            read_all(&b, &list("k", Some((0, 6)))),
            vec![(3, "c".to_string())]
        );
        // The first bundle's state is what others see until commit.
        assert_eq!(read_all(&BundleUserState::new(base.clone()), &all).len(), 3);
        b.commit().unwrap();
        let c = BundleUserState::new(base.clone());
        assert_eq!(
            read_all(&c, &all),
            vec![
                (i64::MIN, "min".to_string()),
                (-3, "neg".to_string()),
                (3, "c".to_string()),
                (9, "i".to_string())
            ]
        );
        c.ordered_list_clear(&list("k", None));
        assert_eq!(read_all(&c, &all), vec![]);
        c.commit().unwrap();
        assert!(base.committed.lock().unwrap().ordered_lists.is_empty());
    }

    #[test]
    fn ordered_list_pages_resume_with_continuation_tokens() {
        let base = Arc::new(UserState::default());
        let a = BundleUserState::new(base.clone());
        let all = list("k", None);
        let items: Vec<(i64, String)> = (0..40)
            .map(|i| ((i / 4) as i64 * 10, format!("value-{i:02}")))
            .collect();
        let (committed, pending) = items.split_at(17);
        let enc = |xs: &[(i64, String)]| {
            entries(&xs.iter().map(|(k, v)| (*k, v.as_str())).collect::<Vec<_>>())
        };
        a.ordered_list_append(&all.cell, &enc(committed)).unwrap();
        a.commit().unwrap();
        let b = BundleUserState::new(base);
        b.ordered_list_append(&all.cell, &enc(pending)).unwrap();
        for page_bytes in [1, 10, 25, 64, 1000] {
            for range in [None, Some((10, 70)), Some((35, 41))] {
                let k = list("k", range);
                let mut got = Vec::new();
                let mut token = Vec::new();
                let mut pages = 0;
                loop {
                    let page = b.ordered_list_get(&k, &token, page_bytes).unwrap();
                    assert!(!page.data.is_empty() || page.continuation_token.is_empty());
                    got.extend(decoded(&page.data));
                    pages += 1;
                    if page.continuation_token.is_empty() {
                        break;
                    }
                    token = page.continuation_token;
                }
                let want: Vec<_> = items
                    .iter()
                    .filter(|(sk, _)| range.is_none_or(|(s, e)| *sk >= s && *sk < e))
                    .cloned()
                    .collect();
                assert_eq!(got, want, "page_bytes {page_bytes}, range {range:?}");
                if page_bytes == 1 {
                    assert_eq!(pages, want.len().max(1), "one entry a page");
                }
            }
        }
        let err = b.ordered_list_get(&all, &[0xff], 10).unwrap_err();
        assert!(err.contains("continuation token"), "{err}");
    }

    #[test]
    fn ordered_list_append_rejects_malformed_data() {
        let b = BundleUserState::new(Arc::default());
        let all = list("k", None);
        let mut data = entries(&[(1, "ok")]);
        data.extend_from_slice(&[2, 9, b'x']);
        let err = b.ordered_list_append(&all.cell, &data).unwrap_err();
        assert!(err.contains("byte 5") && err.contains("length 9"), "{err}");
        assert_eq!(
            read_all(&b, &all),
            vec![],
            "nothing of a bad append is kept"
        );
    }

    /// An `IntervalWindow` `[start, end)` (ms) as `beam:coder:interval_window:v1` encodes it.
    fn interval(start: i64, end: i64) -> Vec<u8> {
        let mut out = Vec::new();
        Window::Interval {
            start: Timestamp(start),
            end: Timestamp(end),
        }
        .encode(&mut out);
        out
    }

    fn cell_of(base: &UserState, transform: &str, state: &str, window: &[u8], key: &str) -> bool {
        let c = cell(transform, state, window, &s(key));
        let committed = base.committed();
        committed.bags.contains_key(&c)
            || committed.multimaps.contains_key(&c)
            || committed.ordered_lists.contains_key(&c)
    }

    /// Writes one bag cell per (window, key), one multimap and one ordered
    /// list cell in `w0`, and one bag of another transform in `w0`.
    fn fill(base: &Arc<UserState>, windows: &[&[u8]], keys: &[&str]) {
        let b = BundleUserState::new(base.clone());
        for w in windows {
            for k in keys {
                b.append(&bag(w, k), &cat(&["v"])).unwrap();
            }
        }
        b.multimap_append(&entry(windows[0], "k", "m"), &cat(&["x"])).unwrap();
        let mut l = list("k", None);
        l.cell.window = windows[0].to_vec();
        b.ordered_list_append(&l.cell, &entries(&[(1, "o")])).unwrap();
        b.append(
            &StateCell {
                transform_id: "other".into(),
                ..bag(windows[0], "k")
            },
            &cat(&["y"]),
        ).unwrap();
        b.commit().unwrap();
    }

    #[test]
    fn expire_deletes_the_cells_of_expired_windows_only() {
        let base = Arc::new(UserState::default());
        let (w0, w1, w2) = (
            interval(0, 10_000),
            interval(10_000, 20_000),
            interval(20_000, 30_000),
        );
        fill(&base, &[&w0, &w1, &w2], &["a", "b", "c"]);
        // 9 bags, a multimap, an ordered list, the other transform's bag.
        assert_eq!(base.live_cells(), 12);
        assert_eq!(base.usage().peak(), 12);
        let t = ["t".to_string()];
        let coder = Coder::IntervalWindow;
        // [0, 10 s) has max timestamp 9999 ms: with 5 s allowed lateness
        // its state goes once the watermark passes 14999 ms, not at 14999.
        assert_eq!(base.expire(&t, &coder, 5_000, Timestamp(9_999)), 0);
        assert_eq!(base.expire(&t, &coder, 5_000, Timestamp(14_999)), 0);
        assert_eq!(base.live_cells(), 12);
        assert_eq!(base.expire(&t, &coder, 5_000, Timestamp(15_000)), 5);
        assert_eq!(base.live_cells(), 7);
        for k in ["a", "b", "c"] {
            assert!(!cell_of(&base, "t", "bag", &w0, k), "{k} in [0, 10 s)");
            assert!(cell_of(&base, "t", "bag", &w1, k), "{k} in [10 s, 20 s)");
            assert!(cell_of(&base, "t", "bag", &w2, k), "{k} in [20 s, 30 s)");
        }
        assert!(!cell_of(&base, "t", "map", &w0, "k"));
        assert!(!cell_of(&base, "t", "list", &w0, "k"));
        // Another transform's cells (another stage's) are not touched.
        assert!(cell_of(&base, "other", "bag", &w0, "k"));
        let fresh = BundleUserState::new(base.clone());
        assert_eq!(fresh.get(&bag(&w0, "a")), b"");
        assert_eq!(fresh.get(&bag(&w1, "a")), cat(&["v"]));
        // Calling again at the same watermark finds nothing more.
        assert_eq!(base.expire(&t, &coder, 5_000, Timestamp(15_000)), 0);
        // The end of the input (i64::MAX) expires every interval window.
        assert_eq!(base.expire(&t, &coder, 5_000, Timestamp(i64::MAX)), 6);
        assert_eq!(base.live_cells(), 1);
        assert_eq!(base.usage().peak(), 12);
        assert!(base.committed().windows.get("t").is_none());
    }

    /// Two workers' stores of one job add up in their shared count, and
    /// its peak is the most they held together.
    #[test]
    fn stores_of_one_job_share_their_cell_count() {
        let count = Arc::new(StateUsage::default());
        let (a, b) = (
            Arc::new(UserState::new(count.clone())),
            Arc::new(UserState::new(count.clone())),
        );
        let w0 = interval(0, 10);
        fill(&a, &[&w0], &["a", "b"]);
        fill(&b, &[&w0], &["c"]);
        assert_eq!((a.live_cells(), b.live_cells()), (5, 4));
        assert_eq!((count.live(), count.peak()), (9, 9));
        let t = ["t".to_string()];
        assert_eq!(a.expire(&t, &Coder::IntervalWindow, 0, Timestamp(10)), 4);
        assert_eq!((count.live(), count.peak()), (5, 9));
        let failed = BundleUserState::new(b.clone());
        failed.append(&bag(&w0, "d"), &cat(&["never committed"])).unwrap();
        drop(failed);
        assert_eq!(count.live(), 5);
    }

    /// Estimated bytes of a bag cell holding `values` (the test's helpers
    /// give transform "t", and bag, map and list state ids).
    fn bag_bytes(window: &[u8], key: &str, values: &[u8]) -> usize {
        CELL_OVERHEAD_BYTES + "t".len() + "bag".len() + window.len() + s(key).len() + values.len()
    }

    /// The job's bytes follow every commit exactly: bag values, multimap
    /// keys and values, ordered-list values and each live cell's ids, as
    /// clears and removals take them away again; expiry frees its cells'
    /// bytes and a failed bundle adds none.
    #[test]
    fn bytes_follow_commits_clears_and_expiry() {
        let usage = Arc::new(StateUsage::default());
        let base = Arc::new(UserState::new(usage.clone()));
        let w = interval(0, 10);
        let a = BundleUserState::new(base.clone());
        a.append(&bag(&w, "k"), &cat(&["x", "yz"])).unwrap();
        a.multimap_append(&entry(&w, "k", "m"), &cat(&["v1"])).unwrap();
        a.multimap_append(&entry(&w, "k", "m"), &cat(&["v2"])).unwrap();
        a.multimap_append(&entry(&w, "k", "set"), b"").unwrap();
        let mut l = list("k", None);
        l.cell.window = w.clone();
        a.ordered_list_append(&l.cell, &entries(&[(1, "o1"), (2, "o22")])).unwrap();
        a.commit().unwrap();
        let map_cell = CELL_OVERHEAD_BYTES + 1 + 3 + w.len() + 2;
        let list_cell = CELL_OVERHEAD_BYTES + 1 + 4 + w.len() + 2;
        let bag_size = bag_bytes(&w, "k", &cat(&["x", "yz"]));
        let map = map_cell + (MAP_KEY_OVERHEAD_BYTES + 2 + 6) + (MAP_KEY_OVERHEAD_BYTES + 4);
        let ordered = list_cell + (ORDERED_VALUE_OVERHEAD_BYTES + 3) + (ORDERED_VALUE_OVERHEAD_BYTES + 4);
        assert_eq!(usage.bytes(), bag_size + map + ordered);
        assert_eq!(base.bytes(), usage.bytes());

        // A failed bundle's writes count nowhere.
        let failed = BundleUserState::new(base.clone());
        failed.append(&bag(&w, "k"), &cat(&["lost"])).unwrap();
        drop(failed);
        assert_eq!(usage.bytes(), bag_size + map + ordered);

        // Value state: clear and rewrite; one map key removed; one sort key removed.
        let b = BundleUserState::new(base.clone());
        b.clear(&bag(&w, "k"));
        b.append(&bag(&w, "k"), &cat(&["new"])).unwrap();
        b.multimap_clear(&entry(&w, "k", "m"));
        let mut one = list("k", Some((2, 3)));
        one.cell.window = w.clone();
        b.ordered_list_clear(&one);
        b.commit().unwrap();
        let bag_size = bag_bytes(&w, "k", &cat(&["new"]));
        let map = map_cell + MAP_KEY_OVERHEAD_BYTES + 4;
        let ordered = list_cell + ORDERED_VALUE_OVERHEAD_BYTES + 3;
        assert_eq!(usage.bytes(), bag_size + map + ordered);

        // The whole multimap cleared: its cell goes, with its bytes.
        let c = BundleUserState::new(base.clone());
        c.multimap_clear_all(&map_keys(&w, "k"));
        c.commit().unwrap();
        assert_eq!(usage.bytes(), bag_size + ordered);
        let peak = usage.peak_bytes();

        let t = ["t".to_string()];
        assert_eq!(base.expire(&t, &Coder::IntervalWindow, 0, Timestamp(10)), 2);
        assert_eq!((usage.bytes(), base.bytes()), (0, 0));
        assert_eq!(usage.peak_bytes(), peak);
    }

    /// Past the job's budget an append is refused with a message naming the
    /// state, its transform and the flag, and the bundle's commit fails with
    /// it and applies nothing. A bundle reserves what its appends will cost
    /// once committed (new cells and map keys included), bundles in flight
    /// see each other's reservations, clears give back what they undo, and
    /// a commit or a dropped bundle gives back the rest.
    #[test]
    fn appends_past_the_budget_are_refused() {
        let usage = Arc::new(StateUsage::with_budget(Some(2000)));
        let base = Arc::new(UserState::new(usage.clone()));
        let (k, k2) = (bag(b"", "k"), bag(b"", "k2"));
        let cell = bag_bytes(b"", "k", &[]);
        let a = BundleUserState::new(base.clone());
        a.append(&k, &[0; 1000]).unwrap();
        assert_eq!(usage.reserved(), cell + 1000);
        let over = 2000 - (cell + 1000) + 1;
        let err = a.append(&k, &vec![0; over]).unwrap_err();
        for part in [
            "user state \"bag\" of transform \"t\"".to_string(),
            format!("appending {over} bytes"),
            "about 2001 bytes".into(),
            "budget of 2000 bytes".into(),
            "--user_state_memory_budget_mb".into(),
        ] {
            assert!(err.contains(&part), "{part:?} not in {err:?}");
        }
        // Once refused, every append of the bundle is.
        assert_eq!(a.append(&k, &[0]).unwrap_err(), err);

        // Another bundle in flight sees a's reservation.
        let b = BundleUserState::new(base.clone());
        let room = 2000 - usage.reserved() - bag_bytes(b"", "k2", &[]);
        b.append(&k2, &vec![0; room]).unwrap();
        assert_eq!(usage.reserved(), 2000);
        assert!(b.append(&k2, &[0]).is_err());

        // The bundle must fail: its refused appends are not in its state.
        assert_eq!(a.commit().unwrap_err(), err);
        assert_eq!((usage.bytes(), base.live_cells()), (0, 0));
        drop(b);
        assert_eq!(usage.reserved(), 0, "a failed and a dropped bundle give back");

        // Clears give back what they undo: bags, map keys, ordered values.
        let c = BundleUserState::new(base.clone());
        c.append(&k, &[0; 1400]).unwrap();
        c.clear(&k);
        c.append(&k, &[0; 1400]).unwrap();
        assert_eq!(usage.reserved(), cell + 1400);
        let m = entry(b"", "k", "m");
        c.multimap_append(&m, &[0; 10]).unwrap();
        c.multimap_append(&m, &[0; 5]).unwrap();
        let map_cell = CELL_OVERHEAD_BYTES + 1 + 3 + 2;
        assert_eq!(usage.reserved(), cell + 1400 + map_cell + MAP_KEY_OVERHEAD_BYTES + 2 + 15);
        c.multimap_clear(&m);
        assert_eq!(usage.reserved(), cell + 1400 + map_cell);
        // 2 entries of sort key 0 and an empty value: 40 bytes each once committed.
        let l = list("k", None);
        c.ordered_list_append(&l.cell, &[0; 4]).unwrap();
        let list_cell = CELL_OVERHEAD_BYTES + 1 + 4 + 2;
        assert_eq!(
            usage.reserved(),
            cell + 1400 + map_cell + list_cell + 2 * ORDERED_VALUE_OVERHEAD_BYTES
        );
        c.ordered_list_clear(&l);
        assert_eq!(usage.reserved(), cell + 1400 + map_cell + list_cell);
        c.commit().unwrap();
        assert_eq!(usage.bytes(), bag_bytes(b"", "k", &[0; 1400]));
        assert_eq!(usage.reserved(), 0, "the commit gives back the reservation");

        // Appending to a committed cell reserves no second cell; another
        // store of the job sees the committed bytes.
        let d = BundleUserState::new(base.clone());
        d.append(&k, &[0; 10]).unwrap();
        assert_eq!(usage.reserved(), 10);
        drop(d);
        let other = Arc::new(UserState::new(usage.clone()));
        let e = BundleUserState::new(other);
        let room = 2000 - usage.bytes() - bag_bytes(b"", "k2", &[]);
        e.append(&k2, &vec![0; room]).unwrap();
        assert!(e.append(&k2, &[0]).is_err());

        // No budget: no refusal, nothing reserved.
        let unbounded = Arc::new(UserState::default());
        BundleUserState::new(unbounded.clone())
            .append(&k, &vec![0; 1 << 20])
            .unwrap();
        assert_eq!(unbounded.usage().reserved(), 0);
    }

    #[test]
    fn state_written_again_after_expiry_is_counted_and_expires_again() {
        let base = Arc::new(UserState::default());
        let w0 = interval(0, 10);
        let t = ["t".to_string()];
        fill(&base, &[&w0], &["a"]);
        assert_eq!(base.expire(&t, &Coder::IntervalWindow, 0, Timestamp(10)), 3);
        let b = BundleUserState::new(base.clone());
        b.append(&bag(&w0, "a"), &cat(&["again"])).unwrap();
        b.commit().unwrap();
        assert_eq!(base.live_cells(), 2);
        assert_eq!(base.usage().peak(), 4, "the peak was before the expiry");
        assert_eq!(base.committed().windows["t"][&w0], 1);
        // A cell emptied by the DoFn leaves the index too.
        let c = BundleUserState::new(base.clone());
        c.clear(&bag(&w0, "a"));
        c.commit().unwrap();
        assert!(base.committed().windows.get("t").is_none());
        assert_eq!(base.live_cells(), 1);
    }

    #[test]
    fn global_and_custom_windows_never_expire() {
        let base = Arc::new(UserState::default());
        let t = ["t".to_string()];
        // The global window encodes as no bytes.
        fill(&base, &[b""], &["a", "b"]);
        assert_eq!(base.live_cells(), 5);
        for wm in [
            Timestamp::END_OF_GLOBAL_WINDOW,
            Timestamp::MAX,
            Timestamp(i64::MAX),
        ] {
            assert_eq!(base.expire(&t, &Coder::GlobalWindow, 0, wm), 0);
        }
        assert_eq!(base.live_cells(), 5);

        // A custom window: opaque bytes under a length-prefixed unknown coder.
        let custom_coder = Coder::LengthPrefix(Box::new(Coder::Bytes));
        let custom = [3u8, b'x', b'y', b'z'];
        let base = Arc::new(UserState::default());
        fill(&base, &[&custom], &["a"]);
        assert_eq!(
            Window::decode(&custom_coder, &custom).unwrap().0,
            Window::Custom(custom.to_vec())
        );
        assert_eq!(base.expire(&t, &custom_coder, 0, Timestamp(i64::MAX)), 0);
        assert!(cell_of(&base, "t", "bag", &custom, "a"));
        // Window bytes that do not decode with the coder are kept too.
        let base = Arc::new(UserState::default());
        fill(&base, &[&[1, 2, 3]], &["a"]);
        assert_eq!(
            base.expire(&t, &Coder::IntervalWindow, 0, Timestamp(i64::MAX)),
            0
        );
        assert_eq!(base.live_cells(), 4);
    }

    /// Random operations over several bundles, some failing, against a plain
    /// model: a list of (sort key, value) in append order.
    #[test]
    fn ordered_list_matches_a_plain_model() {
        let base = Arc::new(UserState::default());
        let all = list("k", None);
        let mut model: Vec<(i64, String)> = Vec::new();
        let mut seed: u64 = 0x2545_f491_4f6c_dd1d;
        let mut next = |n: u64| {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (seed >> 33) % n
        };
        for bundle in 0..30 {
            let b = BundleUserState::new(base.clone());
            let mut view = model.clone();
            for op in 0..20 {
                let (lo, hi) = (next(30) as i64 - 10, next(30) as i64 - 10);
                match next(4) {
                    0 | 1 => {
                        let v = format!("{bundle}-{op}");
                        b.ordered_list_append(&all.cell, &entries(&[(lo, &v)])).unwrap();
                        view.push((lo, v));
                    }
                    2 => {
                        b.ordered_list_clear(&list("k", Some((lo, hi))));
                        view.retain(|(k, _)| !(*k >= lo && *k < hi));
                    }
                    _ => {
                        let mut want: Vec<_> = view
                            .iter()
                            .filter(|(k, _)| *k >= lo && *k < hi)
                            .cloned()
                            .collect();
                        want.sort_by_key(|(k, _)| *k); // stable: append order within a key
                        let got = read_all(&b, &list("k", Some((lo, hi))));
                        assert_eq!(got, want, "bundle {bundle} op {op}");
                    }
                }
            }
            if next(3) > 0 {
                b.commit().unwrap();
                model = view;
            }
            let mut want = model.clone();
            want.sort_by_key(|(k, _)| *k);
            assert_eq!(read_all(&BundleUserState::new(base.clone()), &all), want);
        }
    }
}
