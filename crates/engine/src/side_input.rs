//! Materialized side inputs, as the State API serves them, and when a
//! streaming stage may read them.
//!
//! Keys follow `StateKey.IterableSideInput` / `MultimapSideInput` /
//! `MultimapKeysSideInput` (beam_fn_api.proto): the consuming transform id,
//! its side input id, the encoded window, and for multimaps the encoded key
//! in the nested context (the Python SDK's `encode_nested`).
//!
//! # Streaming (Beam programming guide, "Side inputs and windowing")
//!
//! A main-input element in window `W` runs once, for every side input, the
//! side window `W` maps to is ready ([`side_ready`]). The SDK maps windows
//! itself (the mapping function is SDK code); the runner assumes Beam's
//! default mapping (the side window containing `W`'s max timestamp, see
//! [`SideWindowFn`]) and calls the side window ready when:
//!
//! * the side-input stream is done (its producers finished), or
//! * global, fixed or sliding side windowing: the side input's watermark
//!   has passed the mapped side window's max timestamp (its on-time pane
//!   has fired), or, when its trigger is not the default one, a pane of the
//!   mapped side window has arrived (an early firing is served, as in
//!   Beam's model). A global side window under the default trigger is so
//!   ready only when its stream ends, as in Beam's Java DirectRunner and
//!   Prism (the Go SDK warns that such a DoFn "will block until end of
//!   Global Window"); the slowly updating side input pattern triggers it
//!   (e.g. `Repeatedly(AfterProcessingTime)`), which makes each firing
//!   ready; or
//! * any other side WindowFn (opaque to the runner): the side watermark has
//!   passed `W`'s max timestamp, i.e. the runner assumes the side window
//!   ends no later than the main window (true for the same windowing).
//!
//! Side data arriving later updates the side input for bundles started
//! afterwards ([`Refresh`]): "if the side input has multiple trigger
//! firings, Beam uses the value from the latest trigger firing". A firing
//! is the side elements delivered at one timely time (one GroupByKey pane
//! firing, one TestStream event, one output of an unbounded source).
//!
//! A fixed or sliding side window is evicted once it has expired for both
//! inputs (each watermark past its max timestamp plus that input's allowed
//! lateness) and every element at the stage is in a window ending after it
//! ([`SideInputs::evict_before`]), so a long-running job holds only live
//! side windows. A main-input window arriving later that would read an
//! evicted side window has expired itself and is dropped before its bundle,
//! and later side data of an evicted window is ignored, both with a notice
//! in the job's messages.

use std::collections::{BTreeMap, HashMap};

use weir_model::windowed_value::split_kv;
use weir_model::{Coder, PaneTiming, Timestamp, Window, WindowedValue};
use weir_graph::{Accumulation, SideInputKind, SideWindowFn, Trigger, Windowing};

/// How side data arriving later changes a window's contents.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refresh {
    /// Every element of the window so far: batch (all data at once), the
    /// default trigger (one pane per window, plus late panes that add to
    /// it).
    All,
    /// A triggered side input in DISCARDING mode: each firing replaces the
    /// window's earlier contents (Dataflow serves the latest firing).
    LatestFiring,
    /// A triggered side input in ACCUMULATING mode: a GroupByKey's panes
    /// are cumulative, so a firing of grouped panes (pane timing known)
    /// replaces the window's contents; elements not produced by a
    /// GroupByKey (pane timing UNKNOWN) accumulate, as a cumulative firing
    /// of them would.
    LatestCumulativePane,
}

impl Refresh {
    /// The refresh rule of a side input with `windowing`, in streaming or batch.
    pub fn of(windowing: &Windowing, streaming: bool) -> Refresh {
        if !streaming || windowing.trigger == Trigger::Default {
            return Refresh::All;
        }
        match windowing.accumulation {
            Accumulation::Discarding => Refresh::LatestFiring,
            Accumulation::Accumulating => Refresh::LatestCumulativePane,
        }
    }
}

/// Largest page of a side input one State API Get returns before the rest
/// goes behind a `continuation_token` (StateGetResponse, beam_fn_api.proto),
/// in bytes, for iterables and a multimap's keys and entries: a page ends
/// at the first element boundary at or past it. Weir's gRPC messages hold
/// at most 1 GiB ([`weir_proto::MAX_GRPC_MESSAGE_BYTES`]), so larger side
/// inputs need pages. Pages are large because Beam's Python SDK, with its
/// state cache on (`--max_cache_memory_usage_mb`), caches only the first
/// page of a side input and reads the rest again on each pass.
pub const PAGE_BYTES: usize = 128 << 20;

/// The nested values of one window of an iterable side input, in pages cut
/// at element boundaries. Each page is a buffer of its own, so a large side
/// input never regrows (and for a moment doubles) one buffer of its size.
#[derive(Clone, Debug, Default)]
struct Pages {
    pages: Vec<Vec<u8>>,
}

/// Estimated bytes a multimap side input's key costs besides its values:
/// its two copies (the window's map and its key list) and their entries.
pub const MULTIMAP_KEY_OVERHEAD_BYTES: usize = 64;

/// Estimated bytes of one multimap key without its values.
fn multimap_key_bytes(key: &[u8]) -> usize {
    MULTIMAP_KEY_OVERHEAD_BYTES + 2 * key.len()
}

impl Pages {
    /// Bytes of the values held.
    fn bytes(&self) -> usize {
        self.pages.iter().map(Vec::len).sum()
    }

    /// Appends one encoded value, starting a new page first when the last
    /// one holds `page_bytes` or more (the full page gives back its spare
    /// capacity).
    fn push(&mut self, value: &[u8], page_bytes: usize) {
        match self.pages.last_mut() {
            Some(last) if last.len() < page_bytes => last.extend_from_slice(value),
            full => {
                if let Some(full) = full {
                    full.shrink_to_fit();
                }
                self.pages.push(value.to_vec());
            }
        }
    }

    /// Page `i` (its token names page `i + 1`); `None` past the last page
    /// (no values: one empty page).
    fn page(&self, i: usize) -> Option<Page> {
        if i > 0 && i >= self.pages.len() {
            return None;
        }
        Some(Page {
            data: self.pages.get(i).cloned().unwrap_or_default(),
            continuation_token: token_of((i + 1 < self.pages.len()).then_some(i + 1)),
        })
    }
}

/// One page of a side input, as `StateGetResponse` carries it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Page {
    /// Concatenated nested elements (whole elements only).
    pub data: Vec<u8>,
    /// Token of the next page; empty on the last one.
    pub continuation_token: Vec<u8>,
}

impl Page {
    /// All of `data` in one page.
    fn whole(data: Vec<u8>) -> Page {
        Page {
            data,
            continuation_token: Vec::new(),
        }
    }
}

/// The continuation token of position `next` (8 bytes, big-endian); empty
/// when there is no next page.
fn token_of(next: Option<usize>) -> Vec<u8> {
    next.map(|n| (n as u64).to_be_bytes().to_vec()).unwrap_or_default()
}

/// The position a continuation token names: 0 for the empty (first) one.
fn position_of(token: &[u8]) -> Option<usize> {
    if token.is_empty() {
        return Some(0);
    }
    usize::try_from(u64::from_be_bytes(<[u8; 8]>::try_from(token).ok()?)).ok()
}

/// The page of `count` entries starting at entry `from`, each written by
/// `write(i, out)`, up to the first entry boundary at or past `page_bytes`;
/// `None` when `from` is past the entries (an empty list has one empty page).
fn entries_page(
    count: usize,
    from: usize,
    page_bytes: usize,
    mut write: impl FnMut(usize, &mut Vec<u8>),
) -> Option<Page> {
    if from > count || (from == count && count > 0) {
        return None;
    }
    let (mut data, mut i) = (Vec::new(), from);
    while i < count && data.len() < page_bytes {
        write(i, &mut data);
        i += 1;
    }
    Some(Page {
        data,
        continuation_token: token_of((i < count).then_some(i)),
    })
}

/// One side input's contents by encoded window.
#[derive(Clone, Debug, Default)]
struct View {
    /// Encoded window -> concatenated nested values, in pages.
    iterable: HashMap<Vec<u8>, Pages>,
    /// Encoded window -> nested key -> (concatenated nested values, value count).
    multimap: HashMap<Vec<u8>, HashMap<Vec<u8>, (Vec<u8>, u32)>>,
    /// Encoded window -> distinct nested keys, first-seen order.
    keys: HashMap<Vec<u8>, Vec<Vec<u8>>>,
    /// Encoded window -> the firing its contents come from ([`Refresh`]).
    firing: HashMap<Vec<u8>, u128>,
    /// Whether any element arrived (in any window).
    any: bool,
    /// Windows whose max timestamp is before this are gone for good
    /// ([`SideInputs::evict_before`]); their late elements are ignored.
    evicted_before: Option<Timestamp>,
    /// Max timestamp -> the encoded windows with data that end there.
    ends: BTreeMap<Timestamp, Vec<Vec<u8>>>,
}

impl View {
    /// Forgets encoded window `wb`'s contents; returns the bytes they were
    /// counted as ([`SideInputs::bytes`]).
    fn remove_window(&mut self, wb: &[u8]) -> usize {
        self.keys.remove(wb);
        self.iterable.remove(wb).map_or(0, |p| p.bytes())
            + self.multimap.remove(wb).map_or(0, |m| {
                m.iter()
                    .map(|(k, (v, _))| multimap_key_bytes(k) + v.len())
                    .sum()
            })
    }
}

/// Every side input of one stage, keyed by (transform id, side input id).
#[derive(Clone, Debug)]
pub struct SideInputs {
    views: HashMap<(String, String), View>,
    /// Unique in the process per [`SideInputs::new`]; a clone keeps it.
    lineage: u64,
    /// Bumped by every [`SideInputs::insert`] and eviction.
    version: u64,
    /// Page size: of iterables when their elements are inserted, of a
    /// multimap's keys and entries when they are read ([`PAGE_BYTES`]
    /// unless set with [`SideInputs::with_page_bytes`]).
    page_bytes: usize,
    /// Estimated bytes the views hold ([`SideInputs::bytes`]).
    bytes: usize,
}

impl Default for SideInputs {
    /// No side input, in a lineage of its own.
    fn default() -> Self {
        SideInputs::new(&[])
    }
}

/// Source of [`SideInputs`] lineages.
static LINEAGES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// What to materialize for one side input.
#[derive(Clone, Copy)]
pub struct SideInputSpec<'a> {
    pub transform_id: &'a str,
    pub local_name: &'a str,
    pub kind: SideInputKind,
    pub value_coder: &'a Coder,
    pub window_coder: &'a Coder,
    /// How later data replaces earlier data of a window.
    pub refresh: Refresh,
}

impl SideInputs {
    /// Empty views of `specs` (no data in any window yet).
    pub fn new(specs: &[SideInputSpec<'_>]) -> SideInputs {
        let views = specs
            .iter()
            .map(|s| {
                (
                    (s.transform_id.to_string(), s.local_name.to_string()),
                    View::default(),
                )
            })
            .collect();
        SideInputs {
            views,
            lineage: LINEAGES.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            version: 0,
            page_bytes: PAGE_BYTES,
            bytes: 0,
        }
    }

    /// These views with pages of `page_bytes` (at least 1): for iterable
    /// elements inserted next and for every multimap read; tests use small
    /// pages.
    pub fn with_page_bytes(mut self, page_bytes: usize) -> SideInputs {
        self.page_bytes = page_bytes.max(1);
        self
    }

    /// Names these contents: two `SideInputs` with the same identity hold
    /// the same data (an `Arc` snapshot never changes; the live copy gets a
    /// new version with every insert and eviction). It is the SDK's side-input cache
    /// token (`ProcessBundleRequest.cache_tokens`, beam_fn_api.proto).
    pub fn identity(&self) -> (u64, u64) {
        (self.lineage, self.version)
    }

    /// Estimated bytes the views hold: the encoded values, and for each
    /// multimap key its two copies (the map's and the key list's) plus
    /// [`MULTIMAP_KEY_OVERHEAD_BYTES`]. Windows replaced by later firings
    /// no longer count.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Adds one element (an encoded windowed value) of `spec`'s side input,
    /// delivered in firing `firing` (a timely time: later firings are
    /// greater). Under [`Refresh::LatestFiring`] (and for grouped panes
    /// under [`Refresh::LatestCumulativePane`]) an element of a later
    /// firing than a window's contents first clears that window; an element
    /// of an earlier firing than them is stale and ignored.
    ///
    /// Returns false when every window of the element was evicted
    /// ([`SideInputs::evict_before`]): the element is ignored.
    ///
    /// # Errors
    /// A message when the element does not decode, or a multimap side input is not KV-coded.
    pub fn insert(
        &mut self,
        spec: &SideInputSpec<'_>,
        element: &[u8],
        firing: u128,
    ) -> Result<bool, String> {
        let (wv, _) = WindowedValue::decode(spec.value_coder, spec.window_coder, element)
            .map_err(|e| e.to_string())?;
        let kv = match spec.kind {
            SideInputKind::Iterable => None,
            SideInputKind::Multimap => {
                if !matches!(spec.value_coder, Coder::Kv(..)) {
                    return Err(format!(
                        "multimap side input {} is not KV-coded",
                        spec.local_name
                    ));
                }
                let (k, v) = split_kv(spec.value_coder, &wv.value).map_err(|e| e.to_string())?;
                Some((k.to_vec(), v.to_vec()))
            }
        };
        let replaces = match spec.refresh {
            Refresh::All => false,
            Refresh::LatestFiring => true,
            Refresh::LatestCumulativePane => wv.pane.timing != PaneTiming::Unknown,
        };
        let page_bytes = self.page_bytes;
        let view = self
            .views
            .entry((spec.transform_id.to_string(), spec.local_name.to_string()))
            .or_default();
        let mut landed = false;
        for w in &wv.windows {
            if view.evicted_before.is_some_and(|before| w.max_timestamp() < before) {
                continue;
            }
            landed = true;
            let mut wb = Vec::new();
            w.encode(&mut wb);
            if !view.firing.contains_key(&wb) {
                view.ends.entry(w.max_timestamp()).or_default().push(wb.clone());
            }
            if replaces {
                match view.firing.get(&wb) {
                    Some(&current) if firing < current => continue,
                    Some(&current) if firing == current => {}
                    _ => {
                        let gone = view.remove_window(&wb);
                        self.bytes = self.bytes.saturating_sub(gone);
                        view.firing.insert(wb.clone(), firing);
                    }
                }
            } else {
                let f = view.firing.entry(wb.clone()).or_insert(firing);
                *f = (*f).max(firing);
            }
            match &kv {
                None => {
                    self.bytes += wv.value.len();
                    view.iterable
                        .entry(wb)
                        .or_default()
                        .push(&wv.value, page_bytes)
                }
                Some((k, v)) => {
                    let by_key = view.multimap.entry(wb.clone()).or_default();
                    let entry = by_key.entry(k.clone()).or_insert_with(|| {
                        view.keys.entry(wb).or_default().push(k.clone());
                        self.bytes += multimap_key_bytes(k);
                        (Vec::new(), 0)
                    });
                    self.bytes += v.len();
                    entry.0.extend_from_slice(v);
                    entry.1 += 1;
                }
            }
        }
        if landed {
            view.any = true;
            self.version += 1;
        }
        Ok(landed)
    }

    /// Drops every window of `spec`'s side input whose max timestamp is
    /// before `before`, and returns how many went. Later elements of such
    /// windows are ignored ([`SideInputs::insert`]). A `before` at or below
    /// an earlier one does nothing.
    pub fn evict_before(&mut self, spec: &SideInputSpec<'_>, before: Timestamp) -> usize {
        let key = (spec.transform_id.to_string(), spec.local_name.to_string());
        let Some(view) = self.views.get_mut(&key) else {
            return 0;
        };
        if view.evicted_before.is_some_and(|b| b >= before) {
            return 0;
        }
        view.evicted_before = Some(before);
        let later = view.ends.split_off(&before);
        let gone = std::mem::replace(&mut view.ends, later);
        let mut count = 0;
        for wb in gone.into_values().flatten() {
            view.firing.remove(&wb);
            let bytes = view.remove_window(&wb);
            self.bytes = self.bytes.saturating_sub(bytes);
            count += 1;
        }
        if count > 0 {
            self.version += 1;
        }
        count
    }

    /// The bound of `(transform_id, local_name)`'s evicted windows: every
    /// window whose max timestamp is before it is gone
    /// ([`SideInputs::evict_before`]); None when none was evicted.
    pub fn evicted_before(&self, transform_id: &str, local_name: &str) -> Option<Timestamp> {
        self.view(transform_id, local_name)?.evicted_before
    }

    /// The earliest max timestamp of `(transform_id, local_name)`'s windows
    /// with data; None when it has none.
    pub fn earliest_window_end(&self, transform_id: &str, local_name: &str) -> Option<Timestamp> {
        self.view(transform_id, local_name)?.ends.keys().next().copied()
    }

    /// Whether any element of the side input arrived.
    pub fn has_any(&self, transform_id: &str, local_name: &str) -> bool {
        self.view(transform_id, local_name)
            .map(|v| v.any)
            .unwrap_or(false)
    }

    /// Whether data (a pane) of the side input arrived in encoded `window`.
    pub fn has_window(&self, transform_id: &str, local_name: &str, window: &[u8]) -> bool {
        self.view(transform_id, local_name)
            .map(|v| v.firing.contains_key(window))
            .unwrap_or(false)
    }

    fn view(&self, transform_id: &str, local_name: &str) -> Option<&View> {
        self.views
            .get(&(transform_id.to_string(), local_name.to_string()))
    }

    /// The page of an iterable side input in `window` that
    /// `continuation_token` names (empty: the first; else one this method
    /// returned), empty when the window has no data; `Ok(None)` when the
    /// stage has no such side input.
    ///
    /// # Errors
    /// A message naming the side input when the token names no page of it.
    pub fn iterable_page(
        &self,
        transform_id: &str,
        local_name: &str,
        window: &[u8],
        continuation_token: &[u8],
    ) -> Result<Option<Page>, String> {
        let Some(v) = self.view(transform_id, local_name) else {
            return Ok(None);
        };
        let empty = Pages::default();
        let pages = v.iterable.get(window).unwrap_or(&empty);
        position_of(continuation_token)
            .and_then(|i| pages.page(i))
            .map(Some)
            .ok_or_else(|| bad_token(continuation_token, "iterable", transform_id, local_name))
    }

    /// Every page of an iterable side input in `window`, concatenated.
    #[cfg(test)]
    fn iterable(&self, transform_id: &str, local_name: &str, window: &[u8]) -> Option<Vec<u8>> {
        let v = self.view(transform_id, local_name)?;
        Some(v.iterable.get(window).map(|p| p.pages.concat()).unwrap_or_default())
    }

    /// Concatenated values for `key` (nested encoding) of a multimap side
    /// input in `window`, always one page: only the empty
    /// `continuation_token` names it; `Ok(None)` when the stage has no such
    /// side input.
    ///
    /// # Errors
    /// A message naming the side input for any other token.
    pub fn multimap_values(
        &self,
        transform_id: &str,
        local_name: &str,
        window: &[u8],
        key: &[u8],
        continuation_token: &[u8],
    ) -> Result<Option<Page>, String> {
        let Some(v) = self.view(transform_id, local_name) else {
            return Ok(None);
        };
        if !continuation_token.is_empty() {
            return Err(bad_token(continuation_token, "multimap", transform_id, local_name));
        }
        let values = v.multimap.get(window).and_then(|m| m.get(key));
        Ok(Some(Page::whole(values.map(|(b, _)| b.clone()).unwrap_or_default())))
    }

    /// The page `continuation_token` names (as for
    /// [`SideInputs::iterable_page`]) of the distinct keys (nested
    /// encoding, first-seen order) of a multimap side input in `window`.
    ///
    /// # Errors
    /// A message naming the side input when the token names no page of it.
    pub fn multimap_keys(
        &self,
        transform_id: &str,
        local_name: &str,
        window: &[u8],
        continuation_token: &[u8],
    ) -> Result<Option<Page>, String> {
        self.multimap_page(transform_id, local_name, window, continuation_token, |key, _, out| {
            out.extend_from_slice(key)
        })
    }

    /// The page `continuation_token` names (as for
    /// [`SideInputs::iterable_page`]) of every key with its values, encoded
    /// as concatenated `KV<key, iterable<value>>`
    /// (`StateKey.MultimapKeysValuesSideInput`).
    ///
    /// # Errors
    /// A message naming the side input when the token names no page of it.
    pub fn multimap_keys_values(
        &self,
        transform_id: &str,
        local_name: &str,
        window: &[u8],
        continuation_token: &[u8],
    ) -> Result<Option<Page>, String> {
        self.multimap_page(transform_id, local_name, window, continuation_token, |key, values, out| {
            let (vals, count) = values.map_or((&[][..], 0), |(b, n)| (&b[..], *n));
            out.extend_from_slice(key);
            out.extend_from_slice(&count.to_be_bytes());
            out.extend_from_slice(vals);
        })
    }

    /// A page of a multimap side input's keys in `window`, each written by
    /// `write(key, its values and their count, out)`.
    fn multimap_page(
        &self,
        transform_id: &str,
        local_name: &str,
        window: &[u8],
        continuation_token: &[u8],
        mut write: impl FnMut(&[u8], Option<&(Vec<u8>, u32)>, &mut Vec<u8>),
    ) -> Result<Option<Page>, String> {
        let Some(v) = self.view(transform_id, local_name) else {
            return Ok(None);
        };
        let keys = v.keys.get(window).map(Vec::as_slice).unwrap_or_default();
        let values = v.multimap.get(window);
        position_of(continuation_token)
            .and_then(|from| {
                entries_page(keys.len(), from, self.page_bytes, |i, out| {
                    write(&keys[i], values.and_then(|m| m.get(&keys[i])), out)
                })
            })
            .map(Some)
            .ok_or_else(|| bad_token(continuation_token, "multimap", transform_id, local_name))
    }
}

/// The error for a continuation token that names no page of a side input.
fn bad_token(token: &[u8], kind: &str, transform_id: &str, local_name: &str) -> String {
    format!("continuation token {token:?} names no page of {kind} side input {local_name} of transform {transform_id}")
}

/// The side window Beam's default window mapping gives main-input window
/// `main` under side WindowFn `window_fn` (the side window containing
/// `main`'s max timestamp; for sliding windows the earliest-starting one,
/// as Java's `SlidingWindows.getDefaultWindowMappingFn` and Python's
/// `default_window_mapping_fn` pick, or, when it falls between windows,
/// the next one, as Java's does); `None` for [`SideWindowFn::Other`]. The
/// side window never ends before `main`.
pub fn mapped_window(window_fn: SideWindowFn, main: &Window) -> Option<Window> {
    let t = main.max_timestamp().millis();
    let interval = |start: i64, size: i64| Window::Interval {
        start: Timestamp(start),
        end: Timestamp(start.saturating_add(size)),
    };
    match window_fn {
        SideWindowFn::Global => Some(Window::Global),
        SideWindowFn::Fixed { size_ms, offset_ms } => {
            Some(interval(t - (t - offset_ms).rem_euclid(size_ms), size_ms))
        }
        SideWindowFn::Sliding {
            size_ms,
            period_ms,
            offset_ms,
        } => {
            // The first start after t - size: the earliest window holding
            // t, or in a gap between windows (size < period) the next one.
            let before = t.saturating_sub(size_ms);
            let start = before - (before - offset_ms).rem_euclid(period_ms) + period_ms;
            Some(interval(start, size_ms))
        }
        SideWindowFn::Other => None,
    }
}

/// What a stage knows about one side input when it decides readiness.
pub struct SideProgress<'a> {
    /// The side input's WindowFn.
    pub window_fn: SideWindowFn,
    /// Its trigger is not the default one (it may fire early panes).
    pub triggered: bool,
    /// Its stream is done (the producers finished).
    pub done: bool,
    /// Its watermark (every side element at or below it has arrived).
    pub watermark: Timestamp,
    /// Whether any element arrived.
    pub any: bool,
    /// Whether data arrived in an encoded side window.
    pub has_window: &'a dyn Fn(&[u8]) -> bool,
}

/// Whether the side window main-input window `main` maps to is ready (see
/// the module documentation for the rule and where it comes from).
pub fn side_ready(side: &SideProgress<'_>, main: &Window) -> bool {
    if side.done {
        return true;
    }
    match mapped_window(side.window_fn, main) {
        Some(Window::Global) => side.watermark > Window::Global.max_timestamp() || (side.triggered && side.any),
        Some(w) => {
            if side.watermark > w.max_timestamp() {
                return true;
            }
            let mut wb = Vec::new();
            w.encode(&mut wb);
            side.triggered && (side.has_window)(&wb)
        }
        None => side.watermark > main.max_timestamp(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use weir_model::PaneInfo;

    fn interval(start: i64, end: i64) -> Window {
        Window::Interval {
            start: Timestamp(start),
            end: Timestamp(end),
        }
    }

    fn encoded(w: &Window) -> Vec<u8> {
        let mut b = Vec::new();
        w.encode(&mut b);
        b
    }

    /// An encoded value in the global window, no firing.
    fn encoded_element(value: Vec<u8>) -> Vec<u8> {
        element_bytes(value, Window::Global, PaneInfo::NO_FIRING)
    }

    /// A varint value (one byte, < 128) in `window` with `pane`.
    fn element(value: u8, window: Window, pane: PaneInfo) -> Vec<u8> {
        element_bytes(vec![value], window, pane)
    }

    /// The windowed value of encoded `value` in `window` with `pane`.
    fn element_bytes(value: Vec<u8>, window: Window, pane: PaneInfo) -> Vec<u8> {
        let wv = WindowedValue {
            timestamp: Timestamp(0),
            windows: vec![window],
            pane,
            value,
        };
        let mut out = Vec::new();
        wv.encode(&mut out);
        out
    }

    fn spec(refresh: Refresh, window_coder: &Coder) -> SideInputSpec<'_> {
        SideInputSpec {
            transform_id: "t",
            local_name: "s",
            kind: SideInputKind::Iterable,
            value_coder: &Coder::VarInt,
            window_coder,
            refresh,
        }
    }

    /// Equal identities mean equal contents: a snapshot keeps its identity,
    /// the live copy moves on with each insert, and two views built apart
    /// (two timely workers) never share one, even with the same history.
    #[test]
    fn identity_changes_with_contents_and_differs_across_lineages() {
        let spec = spec(Refresh::All, &Coder::GlobalWindow);
        let mut live = std::sync::Arc::new(SideInputs::new(std::slice::from_ref(&spec)));
        let empty = live.identity();
        let snapshot = live.clone();
        std::sync::Arc::make_mut(&mut live)
            .insert(&spec, &element(1, Window::Global, PaneInfo::default()), 0)
            .unwrap();
        assert_eq!(snapshot.identity(), empty);
        assert_eq!(live.identity().0, empty.0);
        assert_ne!(live.identity(), empty);
        assert_eq!(snapshot.iterable("t", "s", &[]), Some(vec![]));
        assert_eq!(live.iterable("t", "s", &[]), Some(vec![1]));
        // An element that does not decode changes nothing.
        let before = live.identity();
        assert!(std::sync::Arc::make_mut(&mut live).insert(&spec, &[], 0).is_err());
        assert_eq!(live.identity(), before);

        let mut other = SideInputs::new(std::slice::from_ref(&spec));
        other
            .insert(&spec, &element(1, Window::Global, PaneInfo::default()), 0)
            .unwrap();
        assert_ne!(other.identity(), live.identity());
        assert_ne!(SideInputs::default().identity(), SideInputs::default().identity());
    }

    #[test]
    fn fixed_windows_map_to_the_window_holding_the_main_windows_max_timestamp() {
        let fixed = SideWindowFn::Fixed {
            size_ms: 10_000,
            offset_ms: 0,
        };
        // Main [0, 5000) -> side [0, 10000); main [5000, 12000) -> [10000, 20000).
        assert_eq!(
            mapped_window(fixed, &interval(0, 5_000)),
            Some(interval(0, 10_000))
        );
        assert_eq!(
            mapped_window(fixed, &interval(5_000, 12_000)),
            Some(interval(10_000, 20_000))
        );
        // Negative times and an offset.
        assert_eq!(
            mapped_window(fixed, &interval(-3_000, -2_000)),
            Some(interval(-10_000, 0))
        );
        let shifted = SideWindowFn::Fixed {
            size_ms: 10_000,
            offset_ms: 3_000,
        };
        assert_eq!(
            mapped_window(shifted, &interval(0, 5_000)),
            Some(interval(3_000, 13_000))
        );
        assert_eq!(
            mapped_window(SideWindowFn::Global, &interval(0, 1)),
            Some(Window::Global)
        );
        assert_eq!(mapped_window(SideWindowFn::Other, &interval(0, 1)), None);
    }

    #[test]
    fn sliding_windows_map_to_the_earliest_window_holding_the_max_timestamp() {
        // Size 10 s every 5 s: t = 12.999 s is in [5, 15) and [10, 20); the earliest is [5, 15).
        let sliding = SideWindowFn::Sliding {
            size_ms: 10_000,
            period_ms: 5_000,
            offset_ms: 0,
        };
        assert_eq!(
            mapped_window(sliding, &interval(12_000, 13_000)),
            Some(interval(5_000, 15_000))
        );
        // t = 9.999 s: [0, 10) and [5, 15) -> [0, 10).
        assert_eq!(
            mapped_window(sliding, &interval(0, 10_000)),
            Some(interval(0, 10_000))
        );
        // Size 3 s every 2 s: t = 4.999 s is in [2, 5) and [4, 7) -> [2, 5);
        // t = 5.999 s only in [4, 7).
        let sparse = SideWindowFn::Sliding {
            size_ms: 3_000,
            period_ms: 2_000,
            offset_ms: 0,
        };
        assert_eq!(
            mapped_window(sparse, &interval(4_000, 5_000)),
            Some(interval(2_000, 5_000))
        );
        assert_eq!(
            mapped_window(sparse, &interval(5_000, 6_000)),
            Some(interval(4_000, 7_000))
        );
        // The least start (offset plus whole periods) after t - size, found
        // by counting, for sizes above, equal to and below the period (t in
        // a gap maps to the next window, as Java's
        // SlidingWindows.getDefaultWindowMappingFn does).
        for (size_ms, period_ms, offset_ms) in [(60, 10, 0), (60, 10, 3), (10, 10, 0), (7, 10, 2), (25, 7, 5)] {
            for t in -100..100i64 {
                let mut start = offset_ms - 1000 * period_ms;
                while start <= t - size_ms {
                    start += period_ms;
                }
                if start <= t {
                    assert!(t < start + size_ms, "t {t} in the earliest window holding it");
                } else {
                    assert!(start - period_ms + size_ms <= t, "t {t} in a gap, before the next window");
                }
                let window_fn = SideWindowFn::Sliding { size_ms, period_ms, offset_ms };
                assert_eq!(
                    mapped_window(window_fn, &interval(t, t + 1)),
                    Some(interval(start, start + size_ms)),
                    "size {size_ms} period {period_ms} offset {offset_ms} t {t}"
                );
            }
        }
    }

    fn progress<'a>(
        window_fn: SideWindowFn,
        triggered: bool,
        watermark: i64,
        any: bool,
        has_window: &'a dyn Fn(&[u8]) -> bool,
    ) -> SideProgress<'a> {
        SideProgress {
            window_fn,
            triggered,
            done: false,
            watermark: Timestamp(watermark),
            any,
            has_window,
        }
    }

    #[test]
    fn fixed_side_window_is_ready_once_the_watermark_passes_its_end() {
        let fixed = SideWindowFn::Fixed {
            size_ms: 10_000,
            offset_ms: 0,
        };
        let none = |_: &[u8]| false;
        // Main [0, 5000) maps to [0, 10000): ready only past 9999 ms.
        let main = interval(0, 5_000);
        assert!(!side_ready(
            &progress(fixed, false, 5_000, true, &none),
            &main
        ));
        assert!(!side_ready(
            &progress(fixed, false, 9_999, true, &none),
            &main
        ));
        assert!(side_ready(
            &progress(fixed, false, 10_000, false, &none),
            &main
        ));
        // A done stream is ready at any watermark.
        let done = SideProgress {
            done: true,
            ..progress(fixed, false, i64::MIN / 1000, false, &none)
        };
        assert!(side_ready(&done, &main));
    }

    #[test]
    fn triggered_fixed_side_window_is_ready_once_a_pane_of_it_arrived() {
        let fixed = SideWindowFn::Fixed {
            size_ms: 10_000,
            offset_ms: 0,
        };
        let side = encoded(&interval(0, 10_000));
        let has = move |w: &[u8]| w == side.as_slice();
        let main = interval(0, 5_000);
        assert!(side_ready(&progress(fixed, true, 0, true, &has), &main));
        // Without a trigger (one on-time pane), data alone is not enough.
        assert!(!side_ready(&progress(fixed, false, 0, true, &has), &main));
        // A pane of another window does not count.
        assert!(!side_ready(
            &progress(fixed, true, 0, true, &has),
            &interval(10_000, 20_000)
        ));
    }

    #[test]
    fn triggered_global_side_window_is_ready_once_any_element_arrived() {
        let none = |_: &[u8]| false;
        let main = interval(0, 5_000);
        assert!(!side_ready(&progress(SideWindowFn::Global, true, 1_000_000, false, &none), &main));
        assert!(side_ready(&progress(SideWindowFn::Global, true, 0, true, &none), &main));
    }

    #[test]
    fn default_triggered_global_side_window_waits_for_its_stream_to_end() {
        // Go's TestTestStreamTwoInt64Sequences: the side input (straight
        // from a TestStream, global window, default trigger) got elements
        // before a watermark event and more after; reading it at the first
        // ones missed the rest.
        let none = |_: &[u8]| false;
        let main = interval(0, 5_000);
        assert!(!side_ready(&progress(SideWindowFn::Global, false, 130, true, &none), &main));
        let done = SideProgress { done: true, ..progress(SideWindowFn::Global, false, 130, true, &none) };
        assert!(side_ready(&done, &main));
    }

    #[test]
    fn opaque_side_windowing_waits_for_the_main_windows_end() {
        let none = |_: &[u8]| false;
        let main = interval(0, 5_000);
        assert!(!side_ready(
            &progress(SideWindowFn::Other, false, 4_999, true, &none),
            &main
        ));
        assert!(side_ready(
            &progress(SideWindowFn::Other, false, 5_000, true, &none),
            &main
        ));
    }

    #[test]
    fn refresh_rule_follows_trigger_and_accumulation() {
        let mut w = Windowing::global();
        assert_eq!(Refresh::of(&w, true), Refresh::All);
        w.trigger = Trigger::Repeatedly(Box::new(Trigger::ElementCount(1)));
        assert_eq!(Refresh::of(&w, false), Refresh::All);
        assert_eq!(Refresh::of(&w, true), Refresh::LatestFiring);
        w.accumulation = Accumulation::Accumulating;
        assert_eq!(Refresh::of(&w, true), Refresh::LatestCumulativePane);
    }

    #[test]
    fn a_later_firing_replaces_a_window_and_an_earlier_one_is_ignored() {
        let spec = spec(Refresh::LatestFiring, &Coder::IntervalWindow);
        let (w0, w1) = (interval(0, 10), interval(10, 20));
        let mut s = SideInputs::new(std::slice::from_ref(&spec));
        assert!(!s.has_any("t", "s"));
        s.insert(&spec, &element(1, w0.clone(), PaneInfo::NO_FIRING), 5)
            .unwrap();
        s.insert(&spec, &element(2, w0.clone(), PaneInfo::NO_FIRING), 5)
            .unwrap();
        s.insert(&spec, &element(7, w1.clone(), PaneInfo::NO_FIRING), 5)
            .unwrap();
        assert!(s.has_any("t", "s") && s.has_window("t", "s", &encoded(&w0)));
        assert_eq!(s.iterable("t", "s", &encoded(&w0)), Some(vec![1, 2]));
        // Firing 9 replaces [0, 10) only; firing 3 is stale.
        s.insert(&spec, &element(3, w0.clone(), PaneInfo::NO_FIRING), 9)
            .unwrap();
        s.insert(&spec, &element(4, w0.clone(), PaneInfo::NO_FIRING), 3)
            .unwrap();
        assert_eq!(s.iterable("t", "s", &encoded(&w0)), Some(vec![3]));
        assert_eq!(s.iterable("t", "s", &encoded(&w1)), Some(vec![7]));
    }

    #[test]
    fn accumulating_replaces_for_grouped_panes_and_adds_ungrouped_elements() {
        let spec = spec(Refresh::LatestCumulativePane, &Coder::GlobalWindow);
        let g = encoded(&Window::Global);
        let mut s = SideInputs::new(std::slice::from_ref(&spec));
        let early = PaneInfo {
            timing: PaneTiming::Early,
            ..PaneInfo::NO_FIRING
        };
        s.insert(&spec, &element(3, Window::Global, early), 1)
            .unwrap();
        s.insert(&spec, &element(12, Window::Global, early), 2)
            .unwrap();
        assert_eq!(s.iterable("t", "s", &g), Some(vec![12]));
        // Elements that no GroupByKey produced accumulate.
        let mut s = SideInputs::new(std::slice::from_ref(&spec));
        s.insert(&spec, &element(1, Window::Global, PaneInfo::NO_FIRING), 1)
            .unwrap();
        s.insert(&spec, &element(2, Window::Global, PaneInfo::NO_FIRING), 2)
            .unwrap();
        assert_eq!(s.iterable("t", "s", &g), Some(vec![1, 2]));
    }

    /// A page ends at the first element boundary at or past the page size;
    /// each token names the next page; an empty window is one empty page;
    /// a token that names no page is refused, naming the side input.
    #[test]
    fn iterable_pages_end_at_element_boundaries_and_tokens_walk_them() {
        let spec = spec(Refresh::All, &Coder::GlobalWindow);
        let g = encoded(&Window::Global);
        let pages_of = |s: &SideInputs| {
            let (mut token, mut pages) = (Vec::new(), Vec::new());
            loop {
                let page = s.iterable_page("t", "s", &g, &token).unwrap().unwrap();
                pages.push(page.data);
                if page.continuation_token.is_empty() {
                    return pages;
                }
                token = page.continuation_token;
            }
        };
        let filled = |page_bytes: usize| {
            let mut s = SideInputs::new(std::slice::from_ref(&spec)).with_page_bytes(page_bytes);
            assert_eq!(pages_of(&s), vec![Vec::<u8>::new()]);
            for v in 1..=5 {
                s.insert(&spec, &element(v, Window::Global, PaneInfo::NO_FIRING), 0)
                    .unwrap();
            }
            s
        };
        assert_eq!(pages_of(&filled(2)), vec![vec![1, 2], vec![3, 4], vec![5]]);
        // Elements of two bytes (varints 200, 300): a page ends at the first
        // boundary at or past the size, and an element larger than a page
        // is a page of its own, whole.
        let mut s = SideInputs::new(std::slice::from_ref(&spec)).with_page_bytes(3);
        let mut one = SideInputs::new(std::slice::from_ref(&spec)).with_page_bytes(1);
        for value in [vec![1], vec![0xC8, 0x01], vec![2], vec![0xAC, 0x02]] {
            let e = encoded_element(value);
            s.insert(&spec, &e, 0).unwrap();
            one.insert(&spec, &e, 0).unwrap();
        }
        assert_eq!(pages_of(&s), vec![vec![1, 0xC8, 0x01], vec![2, 0xAC, 0x02]]);
        assert_eq!(pages_of(&one), vec![vec![1], vec![0xC8, 0x01], vec![2], vec![0xAC, 0x02]]);
        // A snapshot keeps its pages while the live copy grows.
        let snapshot = std::sync::Arc::new(s);
        let mut live = snapshot.clone();
        std::sync::Arc::make_mut(&mut live)
            .insert(&spec, &encoded_element(vec![9]), 0)
            .unwrap();
        assert_eq!(pages_of(&snapshot), vec![vec![1, 0xC8, 0x01], vec![2, 0xAC, 0x02]]);
        assert_eq!(pages_of(&live), vec![vec![1, 0xC8, 0x01], vec![2, 0xAC, 0x02], vec![9]]);
        assert_eq!(pages_of(&filled(3)), vec![vec![1, 2, 3], vec![4, 5]]);
        assert_eq!(pages_of(&filled(PAGE_BYTES)), vec![vec![1, 2, 3, 4, 5]]);

        let s = filled(2);
        for bad in [&3u64.to_be_bytes()[..], &u64::MAX.to_be_bytes(), &[0; 9], b"x"] {
            let err = s.iterable_page("t", "s", &g, bad).unwrap_err();
            assert!(err.contains("no page of iterable side input s of transform t"), "{err}");
        }
        assert_eq!(s.iterable_page("t", "other", &g, &[]), Ok(None));
    }

    /// The estimated bytes count each value, a multimap key once (its two
    /// copies and overhead), and no longer the windows a later firing
    /// replaced.
    #[test]
    fn bytes_count_values_and_keys_and_forget_replaced_windows() {
        let iter = spec(Refresh::LatestFiring, &Coder::IntervalWindow);
        let kv = Coder::Kv(Box::new(Coder::VarInt), Box::new(Coder::VarInt));
        let map = SideInputSpec {
            local_name: "m",
            kind: SideInputKind::Multimap,
            value_coder: &kv,
            ..spec(Refresh::All, &Coder::IntervalWindow)
        };
        let mut s = SideInputs::new(&[iter, map]);
        let (w1, w2) = (interval(0, 10), interval(10, 20));
        for v in [1, 2, 3] {
            s.insert(&iter, &element(v, w1.clone(), PaneInfo::default()), 0).unwrap();
        }
        s.insert(&iter, &element(4, w2.clone(), PaneInfo::default()), 0).unwrap();
        assert_eq!(s.bytes(), 4);
        for (k, v) in [(7u8, 70u8), (7, 71), (8, 80)] {
            s.insert(&map, &element_bytes(vec![k, v], w1.clone(), PaneInfo::default()), 0)
                .unwrap();
        }
        let key = MULTIMAP_KEY_OVERHEAD_BYTES + 2;
        assert_eq!(s.bytes(), 4 + 2 * key + 3);
        // A later firing of w1 replaces its three values with one.
        s.insert(&iter, &element(9, w1.clone(), PaneInfo::default()), 1).unwrap();
        assert_eq!(s.bytes(), 2 + 2 * key + 3);
        assert_eq!(s.iterable("t", "s", &encoded(&w1)), Some(vec![9]));
    }

    /// Evicting before t drops exactly the windows ending before t, of
    /// iterables and multimaps, with their bytes; reads of them find
    /// nothing, their late elements are ignored and counted, the identity
    /// moves on, and a bound at or below an earlier one does nothing.
    #[test]
    fn evicted_windows_go_with_their_bytes_and_ignore_late_elements() {
        let iter = spec(Refresh::All, &Coder::IntervalWindow);
        let kv = Coder::Kv(Box::new(Coder::VarInt), Box::new(Coder::VarInt));
        let map = SideInputSpec {
            local_name: "m",
            kind: SideInputKind::Multimap,
            value_coder: &kv,
            ..spec(Refresh::All, &Coder::IntervalWindow)
        };
        let mut s = SideInputs::new(&[iter, map]);
        let (w0, w1, w2) = (interval(0, 10), interval(10, 20), interval(20, 30));
        for (v, w) in [(1, &w0), (2, &w0), (3, &w1), (4, &w2)] {
            s.insert(&iter, &element(v, w.clone(), PaneInfo::default()), 0).unwrap();
        }
        s.insert(&map, &element_bytes(vec![7, 70], w0.clone(), PaneInfo::default()), 0).unwrap();
        s.insert(&map, &element_bytes(vec![8, 80], w2.clone(), PaneInfo::default()), 0).unwrap();
        let key = MULTIMAP_KEY_OVERHEAD_BYTES + 2;
        assert_eq!(s.bytes(), 4 + 2 * (key + 1));
        assert_eq!(s.earliest_window_end("t", "s"), Some(Timestamp(9)));
        let before = s.identity();

        // [10, 20) ends at 19: evicting before 19 keeps it, before 20 does not.
        assert_eq!(s.evict_before(&iter, Timestamp(19)), 1, "only [0, 10)");
        assert_eq!(s.evict_before(&iter, Timestamp(20)), 1, "then [10, 20)");
        assert_eq!(s.evict_before(&iter, Timestamp(15)), 0, "a lower bound does nothing");
        assert_eq!(s.evicted_before("t", "s"), Some(Timestamp(20)));
        assert_eq!(s.earliest_window_end("t", "s"), Some(Timestamp(29)));
        assert_eq!(s.bytes(), 1 + 2 * (key + 1), "the multimap is untouched");
        assert_ne!(s.identity(), before);
        for w in [&w0, &w1] {
            assert!(!s.has_window("t", "s", &encoded(w)));
            assert_eq!(s.iterable("t", "s", &encoded(w)), Some(vec![]));
        }
        assert_eq!(s.iterable("t", "s", &encoded(&w2)), Some(vec![4]));

        assert_eq!(s.evict_before(&map, Timestamp(20)), 1);
        assert_eq!(s.bytes(), 1 + key + 1);
        let keys = |s: &SideInputs, w: &Window| s.multimap_keys("t", "m", &encoded(w), &[]).unwrap().unwrap().data;
        assert_eq!(keys(&s, &w0), Vec::<u8>::new());
        assert_eq!(keys(&s, &w2), vec![8]);
        assert_eq!(s.evicted_before("t", "nothing"), None);

        // Late elements of an evicted window are ignored (the contents, and
        // so the identity, stay); others still land.
        let before = s.identity();
        assert!(!s.insert(&iter, &element(5, w1.clone(), PaneInfo::default()), 1).unwrap());
        assert_eq!(s.identity(), before);
        assert!(!s.insert(&map, &element_bytes(vec![9, 90], w0.clone(), PaneInfo::default()), 1).unwrap());
        assert!(s.insert(&iter, &element(6, w2.clone(), PaneInfo::default()), 1).unwrap());
        assert_eq!(s.iterable("t", "s", &encoded(&w1)), Some(vec![]));
        assert!(!s.has_window("t", "s", &encoded(&w1)));
        assert_eq!(s.iterable("t", "s", &encoded(&w2)), Some(vec![4, 6]));
        assert_eq!(s.bytes(), 2 + key + 1);
        // An element in an evicted and a live window lands in the live one.
        let both = WindowedValue {
            timestamp: Timestamp(0),
            windows: vec![w1.clone(), w2.clone()],
            pane: PaneInfo::default(),
            value: vec![7],
        };
        let mut bytes = Vec::new();
        both.encode(&mut bytes);
        assert!(s.insert(&iter, &bytes, 1).unwrap());
        assert_eq!(s.iterable("t", "s", &encoded(&w1)), Some(vec![]));
        assert_eq!(s.iterable("t", "s", &encoded(&w2)), Some(vec![4, 6, 7]));
    }

    /// A multimap's keys and its `KV<key, iterable<value>>` entries page
    /// at entry boundaries, in first-seen key order, each entry whole.
    #[test]
    fn multimap_keys_and_entries_page_at_entry_boundaries() {
        let kv = Coder::Kv(Box::new(Coder::VarInt), Box::new(Coder::VarInt));
        let spec = SideInputSpec {
            kind: SideInputKind::Multimap,
            value_coder: &kv,
            ..spec(Refresh::All, &Coder::GlobalWindow)
        };
        let g = encoded(&Window::Global);
        let mut s = SideInputs::new(std::slice::from_ref(&spec)).with_page_bytes(5);
        type Read<'a> = &'a dyn Fn(&SideInputs, &[u8]) -> Result<Option<Page>, String>;
        let pages_of = |s: &SideInputs, read: Read<'_>| {
            let (mut token, mut pages) = (Vec::new(), Vec::new());
            loop {
                let page = read(s, &token).unwrap().unwrap();
                pages.push(page.data);
                if page.continuation_token.is_empty() {
                    return pages;
                }
                token = page.continuation_token;
            }
        };
        let keys: Read<'_> = &|s, t| s.multimap_keys("t", "s", &g, t);
        let entries: Read<'_> = &|s, t| s.multimap_keys_values("t", "s", &g, t);
        assert_eq!(pages_of(&s, keys), vec![Vec::<u8>::new()]);
        assert_eq!(pages_of(&s, entries), vec![Vec::<u8>::new()]);
        for (k, v) in [(3u8, 30u8), (1, 10), (3, 31), (2, 20)] {
            s.insert(&spec, &encoded_element(vec![k, v]), 0).unwrap();
        }
        // Keys of one byte: pages of 5 keys hold all three.
        assert_eq!(pages_of(&s, keys), vec![vec![3, 1, 2]]);
        // Entries: key, 4-byte count, values; a page ends once it holds 5 bytes.
        assert_eq!(
            pages_of(&s, entries),
            vec![
                vec![3, 0, 0, 0, 2, 30, 31],
                vec![1, 0, 0, 0, 1, 10],
                vec![2, 0, 0, 0, 1, 20]
            ]
        );
        // Entry 3 of 3 keys, and tokens no page ever had, are refused.
        for bad in [&3u64.to_be_bytes()[..], &u64::MAX.to_be_bytes(), &[0; 9]] {
            for read in [keys, entries] {
                let err = read(&s, bad).unwrap_err();
                assert!(err.contains("no page of multimap side input s of transform t"), "{err}");
            }
        }
        assert_eq!(s.multimap_keys("t", "other", &g, &[]), Ok(None));
        // One key's values are one page; no token names another.
        assert_eq!(s.multimap_values("t", "s", &g, &[3], &[]), Ok(Some(Page::whole(vec![30, 31]))));
        let err = s.multimap_values("t", "s", &g, &[3], &1u64.to_be_bytes()).unwrap_err();
        assert!(err.contains("no page of multimap side input s of transform t"), "{err}");
    }

    #[test]
    fn batch_build_keeps_every_element() {
        let spec = spec(Refresh::All, &Coder::GlobalWindow);
        // A batch stage inserts every element as one firing.
        let mut s = SideInputs::new(std::slice::from_ref(&spec));
        for e in [
            element(1, Window::Global, PaneInfo::NO_FIRING),
            element(2, Window::Global, PaneInfo::ON_TIME_AND_ONLY_FIRING),
        ] {
            s.insert(&spec, &e, 0).unwrap();
        }
        assert_eq!(
            s.iterable("t", "s", &encoded(&Window::Global)),
            Some(vec![1, 2])
        );
        assert_eq!(s.iterable("t", "other", &[]), None);
    }
}
