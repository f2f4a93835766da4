//! GroupByKey in streaming: panes per (key, window), fired by the trigger
//! state machine ([`crate::triggers`]) as elements, the watermark and the
//! processing time arrive.
//!
//! Beam's model (Beam programming guide, "Triggers"; `WindowingStrategy` in
//! beam_runner_api.proto):
//! - an element whose window expired (the input watermark is past the
//!   window's end plus the allowed lateness) is dropped;
//! - a firing emits a pane `KV<key, iterable<value>>` with its `PaneInfo`
//!   (index, on-time index, EARLY / ON_TIME / LATE, first, last); in
//!   DISCARDING mode a pane holds the elements since the previous pane, in
//!   ACCUMULATING mode all of them;
//! - when the watermark passes the end of the window plus the allowed
//!   lateness the window is garbage-collected, with a final pane if it holds
//!   new elements, or, under `ClosingBehavior` EMIT_ALWAYS, if it is
//!   ACCUMULATING and holds any (the final pane repeats them, as Beam
//!   Java's runners and Prism emit it; the plan reads Beam Python's
//!   EMIT_ALWAYS, which it sends whatever the user asked, as
//!   EMIT_IF_NONEMPTY, as its own runners do). Weir never emits an *empty*
//!   final pane;
//! - a trigger that finishes after the end of the window closes the window:
//!   later data for it is dropped.
//!
//! Weir's one departure, chosen to match Beam's Prism runner (and its
//! conformance test `test_after_count_trigger_streaming`): a trigger that
//! finishes *before* the end of its window (e.g. a bare `AfterCount(3)`)
//! fires no more, but the window keeps collecting data and emits it in the
//! final pane when it expires, rather than dropping it.

use std::collections::{HashMap, HashSet};

use weir_model::windowed_value::{encode_iterable, split_kv};
use weir_model::{Coder, PaneInfo, PaneTiming, Timestamp, Window, WindowedValue};
use weir_graph::{Accumulation, OutputTime, WindowFn, Windowing};

use crate::merge_windows::Merges;
use crate::triggers::{CompiledTrigger, TriggerContext, TriggerState};

/// The panes of one (key, window).
#[derive(Debug)]
struct WindowPanes {
    /// Elements not yet emitted (DISCARDING) or all elements (ACCUMULATING).
    values: Vec<Vec<u8>>,
    /// Timestamp range of `values`, for the pane's output time.
    min_ts: Timestamp,
    max_ts: Timestamp,
    /// Elements arrived since the last pane.
    new_elements: u64,
    trigger: TriggerState,
    /// Panes emitted so far, and how many of them were not EARLY.
    pane_index: i64,
    non_speculative_index: i64,
    /// The trigger finished after the end of the window: no more panes,
    /// late data is dropped until the window expires.
    closed: bool,
    /// Timestamp range of the elements that came since the last pane and
    /// not behind the watermark ([`Windowing::pane_timestamp_from_holds`]).
    held: Option<(Timestamp, Timestamp)>,
}

/// Streaming GroupByKey state on one worker: every (key, window) with data
/// or a trigger still running.
pub struct PaneBuffer {
    input_coder: Coder,
    window_coder: Coder,
    windowing: Windowing,
    trigger: CompiledTrigger,
    /// Encoded key -> window -> panes.
    windows: HashMap<Vec<u8>, HashMap<Window, WindowPanes>>,
    /// Elements (per window) dropped because their window had expired or closed.
    pub dropped_late: u64,
    /// Keys with windows a custom merging WindowFn has not merged yet: their
    /// triggers are evaluated once the SDK's merges are applied.
    unmerged: HashSet<Vec<u8>>,
}

impl PaneBuffer {
    /// A buffer for input elements coded `WindowedValue<input_coder,
    /// window_coder>` (`input_coder` a KV coder) under `windowing`.
    pub fn new(input_coder: Coder, window_coder: Coder, windowing: Windowing) -> Self {
        let trigger = CompiledTrigger::new(&windowing.trigger);
        PaneBuffer {
            input_coder,
            window_coder,
            windowing,
            trigger,
            windows: HashMap::new(),
            dropped_late: 0,
            unmerged: HashSet::new(),
        }
    }

    /// How many keys have windows with state.
    pub fn buffered_keys(&self) -> usize {
        self.windows.len()
    }

    /// True when no window holds state.
    pub fn is_empty(&self) -> bool {
        self.windows.is_empty()
    }

    /// The earliest processing time (ms) at which a processing-time trigger
    /// of some window may fire.
    pub fn next_deadline(&self) -> Option<i64> {
        self.windows
            .values()
            .flat_map(|m| m.values())
            .filter(|p| !p.closed)
            .filter_map(|p| self.trigger.next_deadline(&p.trigger))
            .min()
    }

    /// True once the watermark passed the window's end plus the allowed
    /// lateness (always at the end of the input, watermark `i64::MAX` ms).
    fn expired(&self, w: &Window, watermark: Timestamp) -> bool {
        watermark == Timestamp(i64::MAX)
            || watermark
                > w.max_timestamp()
                    .saturating_add_millis(self.windowing.allowed_lateness_ms)
    }

    /// Adds one input element (an encoded windowed KV) with the input
    /// watermark `watermark` and processing time `now` (ms), and returns the
    /// panes its arrival fires (encoded windowed `KV<key, iterable<value>>`).
    ///
    /// # Errors
    /// A message when the element does not decode.
    pub fn insert(
        &mut self,
        element: &[u8],
        watermark: Timestamp,
        now: i64,
    ) -> Result<Vec<Vec<u8>>, String> {
        let (wv, _) = WindowedValue::decode(&self.input_coder, &self.window_coder, element)
            .map_err(|e| e.to_string())?;
        let (k, v) = split_kv(&self.input_coder, &wv.value).map_err(|e| e.to_string())?;
        let mut touched = Vec::new();
        for w in wv.windows {
            if self.expired(&w, watermark) {
                self.dropped_late += 1;
                continue;
            }
            let by_window = self.windows.entry(k.to_vec()).or_default();
            let p = by_window.entry(w.clone()).or_insert_with(|| WindowPanes {
                values: Vec::new(),
                min_ts: Timestamp::MAX,
                max_ts: Timestamp::MIN,
                new_elements: 0,
                trigger: self.trigger.new_state(),
                pane_index: 0,
                non_speculative_index: 0,
                closed: false,
                held: None,
            });
            if p.closed {
                self.dropped_late += 1;
                continue;
            }
            p.values.push(v.to_vec());
            p.min_ts = p.min_ts.min(wv.timestamp);
            p.max_ts = p.max_ts.max(wv.timestamp);
            if wv.timestamp >= watermark && w.max_timestamp() >= watermark {
                p.held = Some(p.held.map_or((wv.timestamp, wv.timestamp), |(lo, hi)| {
                    (lo.min(wv.timestamp), hi.max(wv.timestamp))
                }));
            }
            p.new_elements += 1;
            let cx = TriggerContext {
                watermark,
                now,
                window_max: w.max_timestamp(),
            };
            self.trigger.on_element(&mut p.trigger, &cx);
            touched.push(w);
        }
        if touched.is_empty() {
            return Ok(vec![]);
        }
        match self.windowing.window_fn {
            WindowFn::Sessions { .. } => {
                if let Some(by_window) = self.windows.get_mut(k) {
                    let merges = crate::group_by_key::session_merges(by_window.keys());
                    merge_panes(&self.trigger, by_window, merges);
                }
            }
            WindowFn::CustomMerging => {
                self.unmerged.insert(k.to_vec());
                return Ok(vec![]);
            }
            WindowFn::Global | WindowFn::NonMerging => {}
        }
        // Processing-time triggers are not evaluated here but in the next
        // `advance` (the operator calls it once its input batch is in), so
        // elements that arrive together (one bundle's output, one TestStream
        // event) make one pane, as on Prism: e.g. a
        // `Repeatedly(AfterSynchronizedProcessingTime)` fires once per
        // window there, not once per element.
        Ok(self.evaluate_key(k, watermark, i64::MIN))
    }

    /// True when some key has windows a custom merging WindowFn has not
    /// merged yet (no pane fires until they are: see [`Self::apply_merges`]).
    pub fn has_unmerged(&self) -> bool {
        !self.unmerged.is_empty()
    }

    /// Takes the keys with unmerged windows, each with all its windows (the
    /// input of `beam:transform:merge_windows:v1`).
    pub fn take_unmerged(&mut self) -> Vec<(Vec<u8>, Vec<Window>)> {
        crate::group_by_key::take_unmerged(&mut self.unmerged, &self.windows)
    }

    /// Applies merges of `key`'s windows computed by the SDK (panes and
    /// trigger states merge as for sessions), then evaluates the key's
    /// triggers as an element arrival does; returns the panes fired.
    pub fn apply_merges(
        &mut self,
        key: &[u8],
        merges: Merges,
        watermark: Timestamp,
        now: i64,
    ) -> Vec<Vec<u8>> {
        if let Some(by_window) = self.windows.get_mut(key) {
            merge_panes(&self.trigger, by_window, merges);
        }
        self.evaluate_key(key, watermark, now)
    }

    /// Evaluates the triggers of every window of `key` after elements arrived.
    fn evaluate_key(&mut self, key: &[u8], watermark: Timestamp, now: i64) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        if let Some(mut by_window) = self.windows.remove(key) {
            let windows: Vec<Window> = by_window.keys().cloned().collect();
            for w in windows {
                let p = by_window.get_mut(&w).expect("present");
                if self.evaluate(key, &w, p, watermark, now, false, &mut out) {
                    by_window.remove(&w);
                }
            }
            if !by_window.is_empty() {
                self.windows.insert(key.to_vec(), by_window);
            }
        }
        out
    }

    /// Evaluates every window at input watermark `watermark` and processing
    /// time `now`: fires the triggers that are ready and garbage-collects
    /// expired windows. Returns the panes emitted.
    pub fn advance(&mut self, watermark: Timestamp, now: i64) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        let mut windows = std::mem::take(&mut self.windows);
        windows.retain(|key, by_window| {
            by_window.retain(|w, p| !self.evaluate(key, w, p, watermark, now, true, &mut out));
            !by_window.is_empty()
        });
        self.windows = windows;
        out
    }

    /// Fires window `w` of `key` if its trigger is ready or it expired;
    /// returns true when its state can be dropped.
    #[allow(clippy::too_many_arguments)]
    fn evaluate(
        &self,
        key: &[u8],
        w: &Window,
        p: &mut WindowPanes,
        watermark: Timestamp,
        now: i64,
        by_watermark: bool,
        out: &mut Vec<Vec<u8>>,
    ) -> bool {
        let expired = self.expired(w, watermark);
        if p.closed {
            return expired;
        }
        let cx = TriggerContext {
            watermark,
            now,
            window_max: w.max_timestamp(),
        };
        let finished_before = self.trigger.is_finished(&p.trigger);
        let fire = !finished_before && self.trigger.should_fire(&p.trigger, &cx);
        if fire {
            self.trigger.on_fire(&mut p.trigger, &cx);
        }
        if !fire && !expired {
            return false;
        }
        let past_end = watermark > w.max_timestamp();
        let finished = self.trigger.is_finished(&p.trigger);
        let is_last = expired || (finished && past_end);
        let on_time = past_end && p.non_speculative_index == 0 && by_watermark;
        // ClosingBehavior EMIT_ALWAYS: an accumulating window's final pane
        // repeats what it holds even without new elements (Beam Java's
        // `ClosingBehavior.FIRE_ALWAYS`, e.g. after a late pane).
        let closing = expired
            && self.windowing.closing_emit_always
            && self.windowing.accumulation == Accumulation::Accumulating
            && !p.values.is_empty();
        let emit = p.new_elements > 0
            || closing
            || (fire && on_time && self.windowing.on_time_fire_always && p.pane_index > 0);
        if emit {
            let (timing, on_time_index) = if !past_end {
                (PaneTiming::Early, -1)
            } else {
                let t = if on_time {
                    PaneTiming::OnTime
                } else {
                    PaneTiming::Late
                };
                (t, p.non_speculative_index)
            };
            let pane = PaneInfo {
                is_first: p.pane_index == 0,
                is_last,
                timing,
                index: p.pane_index,
                on_time_index,
            };
            p.pane_index += 1;
            if past_end {
                p.non_speculative_index += 1;
            }
            let timestamp = if self.windowing.pane_timestamp_from_holds
                && !matches!(w, Window::Custom(_))
                && self.windowing.output_time != OutputTime::EndOfWindow
            {
                match p.held {
                    Some((lo, hi)) => pane_timestamp(&self.windowing, w, lo, hi),
                    None => w.max_timestamp(),
                }
            } else {
                pane_timestamp(&self.windowing, w, p.min_ts, p.max_ts)
            };
            p.held = None;
            let mut value = key.to_vec();
            encode_iterable(p.values.iter().map(|v| v.as_slice()), &mut value);
            let wv = WindowedValue {
                timestamp,
                windows: vec![w.clone()],
                pane,
                value,
            };
            let mut bytes = Vec::new();
            wv.encode(&mut bytes);
            out.push(bytes);
            p.new_elements = 0;
            if self.windowing.accumulation == Accumulation::Discarding {
                p.values.clear();
                p.min_ts = Timestamp::MAX;
                p.max_ts = Timestamp::MIN;
            }
        }
        if is_last && !expired {
            p.closed = true;
            p.values.clear();
        }
        expired
    }
}

/// The output timestamp of a pane of window `w` whose elements span
/// `min_ts..=max_ts` (both ignored for an empty pane).
pub(crate) fn pane_timestamp(
    windowing: &Windowing,
    w: &Window,
    min_ts: Timestamp,
    max_ts: Timestamp,
) -> Timestamp {
    let empty = min_ts > max_ts;
    match windowing.output_time {
        // Stamped as the strategy's SDK stamps it (Python 1 ms early).
        OutputTime::EndOfWindow if *w == Window::Global => windowing.end_of_global_window,
        // A custom window's end is unknown to the runner: the pane takes its
        // latest element's timestamp, which lies inside the window.
        OutputTime::EndOfWindow if matches!(w, Window::Custom(_)) && !empty => max_ts,
        OutputTime::EarliestInPane if !empty => min_ts,
        OutputTime::LatestInPane if !empty => max_ts,
        _ => w.max_timestamp(),
    }
}

/// Merges the panes of each set of merged windows of one key (session
/// windows that intersect, or the SDK's merges) into their merged window,
/// merging their values and trigger states.
fn merge_panes(
    trigger: &CompiledTrigger,
    by_window: &mut HashMap<Window, WindowPanes>,
    merges: Merges,
) {
    for (target, members) in merges {
        if members == [target.clone()] {
            continue;
        }
        // The pane indices of the merged window itself, when it was one of
        // the windows merged (elements that fell inside a session):
        // Java's DirectRunner goes on from them there, and starts a new
        // window's (a session the merge grew) at pane 0.
        let mut carried = (0, 0);
        let mut parts: Vec<WindowPanes> = Vec::new();
        for m in members.iter().chain(std::iter::once(&target)) {
            if let Some(part) = by_window.remove(m) {
                if *m == target {
                    carried = (part.pane_index, part.non_speculative_index);
                }
                parts.push(part);
            }
        }
        if parts.is_empty() {
            continue;
        }
        let states: Vec<TriggerState> = parts.iter().map(|p| p.trigger.clone()).collect();
        let mut p = WindowPanes {
            values: Vec::new(),
            min_ts: Timestamp::MAX,
            max_ts: Timestamp::MIN,
            new_elements: 0,
            trigger: trigger.merge(&states),
            pane_index: carried.0,
            non_speculative_index: carried.1,
            closed: false,
            held: None,
        };
        for part in parts {
            p.held = match (p.held, part.held) {
                (Some((a, b)), Some((c, d))) => Some((a.min(c), b.max(d))),
                (x, y) => x.or(y),
            };
            p.values.extend(part.values);
            p.min_ts = p.min_ts.min(part.min_ts);
            p.max_ts = p.max_ts.max(part.max_ts);
            p.new_elements += part.new_elements;
            p.closed |= part.closed;
        }
        by_window.insert(target, p);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use weir_graph::Trigger;

    fn coder() -> Coder {
        Coder::Kv(Box::new(Coder::StringUtf8), Box::new(Coder::VarInt))
    }

    fn fixed(ts: i64) -> Window {
        let start = ts.div_euclid(10) * 10;
        Window::Interval {
            start: Timestamp(start),
            end: Timestamp(start + 10),
        }
    }

    fn element(key: &str, value: u8, ts: i64) -> Vec<u8> {
        let mut v = vec![key.len() as u8];
        v.extend_from_slice(key.as_bytes());
        v.push(value);
        let mut out = Vec::new();
        WindowedValue {
            timestamp: Timestamp(ts),
            windows: vec![fixed(ts)],
            pane: PaneInfo::NO_FIRING,
            value: v,
        }
        .encode(&mut out);
        out
    }

    /// (key, values, timing, index, on-time index, first, last) of a pane.
    type Pane = (String, Vec<i64>, PaneTiming, i64, i64, bool, bool);

    fn decode(panes: Vec<Vec<u8>>) -> Vec<Pane> {
        let out_coder = Coder::Kv(
            Box::new(Coder::StringUtf8),
            Box::new(Coder::Iterable(Box::new(Coder::VarInt))),
        );
        panes
            .iter()
            .map(|b| {
                let (wv, _) = WindowedValue::decode(&out_coder, &Coder::IntervalWindow, b).unwrap();
                let key =
                    String::from_utf8(wv.value[1..1 + wv.value[0] as usize].to_vec()).unwrap();
                let rest = &wv.value[1 + wv.value[0] as usize..];
                let n = u32::from_be_bytes(rest[..4].try_into().unwrap()) as usize;
                let values = rest[4..4 + n].iter().map(|&x| x as i64).collect();
                let p = wv.pane;
                (
                    key,
                    values,
                    p.timing,
                    p.index,
                    p.on_time_index,
                    p.is_first,
                    p.is_last,
                )
            })
            .collect()
    }

    fn windowing(trigger: Trigger, accumulation: Accumulation, lateness: i64) -> Windowing {
        Windowing {
            window_fn: WindowFn::NonMerging,
            output_time: OutputTime::EndOfWindow,
            trigger,
            accumulation,
            allowed_lateness_ms: lateness,
            on_time_fire_always: true,
            closing_emit_always: false,
            end_of_global_window: Timestamp::PYTHON_END_OF_GLOBAL_WINDOW,
            pane_timestamp_from_holds: false,
        }
    }

    #[test]
    fn after_count_then_leftovers_at_window_end() {
        // Beam's test_after_count_trigger_streaming, key A: 1..5 in [0, 10).
        let mut b = PaneBuffer::new(
            coder(),
            Coder::IntervalWindow,
            windowing(Trigger::ElementCount(3), Accumulation::Discarding, 0),
        );
        let mut out = vec![];
        for v in 1..=5 {
            out.extend(
                b.insert(&element("A", v, v as i64), Timestamp::MIN, 0)
                    .unwrap(),
            );
        }
        out.extend(b.advance(Timestamp(10), 0));
        assert!(b.is_empty());
        assert_eq!(
            decode(out),
            vec![
                (
                    "A".into(),
                    vec![1, 2, 3],
                    PaneTiming::Early,
                    0,
                    -1,
                    true,
                    false
                ),
                (
                    "A".into(),
                    vec![4, 5],
                    PaneTiming::OnTime,
                    1,
                    0,
                    false,
                    true
                ),
            ]
        );
    }

    #[test]
    fn early_on_time_and_late_panes_accumulating() {
        let trigger = Trigger::AfterEndOfWindow {
            early: Some(Box::new(Trigger::ElementCount(2))),
            late: Some(Box::new(Trigger::ElementCount(1))),
        };
        let mut b = PaneBuffer::new(
            coder(),
            Coder::IntervalWindow,
            windowing(trigger, Accumulation::Accumulating, 100),
        );
        let mut out = vec![];
        for v in 1..=3 {
            out.extend(
                b.insert(&element("k", v, v as i64), Timestamp(0), 0)
                    .unwrap(),
            );
        }
        out.extend(b.advance(Timestamp(10), 0)); // on time
        out.extend(b.insert(&element("k", 7, 7), Timestamp(50), 0).unwrap()); // late
        out.extend(b.advance(Timestamp(200), 0)); // expired: nothing new
        assert_eq!(
            b.insert(&element("k", 8, 8), Timestamp(200), 0).unwrap(),
            Vec::<Vec<u8>>::new()
        );
        assert_eq!(b.dropped_late, 1);
        assert_eq!(
            decode(out),
            vec![
                (
                    "k".into(),
                    vec![1, 2],
                    PaneTiming::Early,
                    0,
                    -1,
                    true,
                    false
                ),
                (
                    "k".into(),
                    vec![1, 2, 3],
                    PaneTiming::OnTime,
                    1,
                    0,
                    false,
                    false
                ),
                (
                    "k".into(),
                    vec![1, 2, 3, 7],
                    PaneTiming::Late,
                    2,
                    1,
                    false,
                    false
                ),
            ]
        );
    }

    /// Java's timestamps of EARLIEST panes: the on-time pane at its earliest
    /// element; a late pane, whose element came behind the watermark, at
    /// the window's end (Java's DirectRunner); Prism's rule combines every
    /// element of the (accumulating) pane.
    #[test]
    fn java_stamps_a_late_pane_at_the_window_end() {
        let stamps = |from_holds: bool| {
            let trigger = Trigger::AfterEndOfWindow {
                early: None,
                late: Some(Box::new(Trigger::ElementCount(1))),
            };
            let mut w = windowing(trigger, Accumulation::Accumulating, 100);
            w.output_time = OutputTime::EarliestInPane;
            w.pane_timestamp_from_holds = from_holds;
            let mut b = PaneBuffer::new(coder(), Coder::IntervalWindow, w);
            let mut out = vec![];
            out.extend(b.insert(&element("k", 3, 3), Timestamp(0), 0).unwrap());
            out.extend(b.insert(&element("k", 1, 1), Timestamp(0), 0).unwrap());
            out.extend(b.advance(Timestamp(10), 0)); // on time
            out.extend(b.insert(&element("k", 5, 5), Timestamp(20), 0).unwrap()); // late
            let out_coder = Coder::Kv(
                Box::new(Coder::StringUtf8),
                Box::new(Coder::Iterable(Box::new(Coder::VarInt))),
            );
            out.iter()
                .map(|e| WindowedValue::decode(&out_coder, &Coder::IntervalWindow, e).unwrap().0.timestamp)
                .collect::<Vec<_>>()
        };
        assert_eq!(stamps(true), vec![Timestamp(1), Timestamp(9)]);
        assert_eq!(stamps(false), vec![Timestamp(1), Timestamp(1)]);
    }

    /// A late element inside a session that already fired: its pane goes
    /// on from the session's (index 1, not first); one that grows the
    /// session makes a new window, whose panes start at 0 (both as Java's
    /// and Python's DirectRunners give).
    #[test]
    fn a_late_element_inside_a_fired_session_goes_on_with_its_pane_index() {
        let trigger = Trigger::AfterEndOfWindow {
            early: None,
            late: Some(Box::new(Trigger::ElementCount(1))),
        };
        let mut w = windowing(trigger, Accumulation::Accumulating, 100);
        w.window_fn = WindowFn::Sessions { gap_ms: 10 };
        let mut b = PaneBuffer::new(coder(), Coder::IntervalWindow, w);
        let session = |v: u8, ts: i64| {
            let mut out = Vec::new();
            WindowedValue {
                timestamp: Timestamp(ts),
                windows: vec![Window::Interval { start: Timestamp(ts), end: Timestamp(ts + 10) }],
                pane: PaneInfo::NO_FIRING,
                value: vec![1, b'k', v],
            }
            .encode(&mut out);
            out
        };
        let mut out = vec![];
        out.extend(b.insert(&session(1, 1), Timestamp(0), 0).unwrap());
        out.extend(b.insert(&session(5, 5), Timestamp(0), 0).unwrap());
        out.extend(b.advance(Timestamp(20), 0)); // [1, 15) on time
        out.extend(b.insert(&session(2, 2), Timestamp(20), 0).unwrap()); // late, inside [1, 15)
        out.extend(b.insert(&session(8, 8), Timestamp(20), 0).unwrap()); // late: grows it to [1, 18)
        assert_eq!(
            decode(out),
            vec![
                ("k".into(), vec![1, 5], PaneTiming::OnTime, 0, 0, true, false),
                ("k".into(), vec![1, 5, 2], PaneTiming::Late, 1, 1, false, false),
                ("k".into(), vec![1, 5, 2, 8], PaneTiming::Late, 0, 0, true, false),
            ]
        );
    }

    /// Beam Java's TestStreamTest#testLateDataAccumulating: under
    /// ClosingBehavior FIRE_ALWAYS (EMIT_ALWAYS) an accumulating window's
    /// expiry emits a final pane repeating its elements, though none is new.
    #[test]
    fn closing_emit_always_repeats_an_accumulating_window_in_its_final_pane() {
        let trigger = Trigger::AfterEndOfWindow {
            early: None,
            late: Some(Box::new(Trigger::ElementCount(1))),
        };
        let mut w = windowing(trigger, Accumulation::Accumulating, 100);
        w.closing_emit_always = true;
        let mut b = PaneBuffer::new(coder(), Coder::IntervalWindow, w);
        let mut out = vec![];
        for v in 1..=3 {
            out.extend(b.insert(&element("k", v, v as i64), Timestamp(0), 0).unwrap());
        }
        out.extend(b.advance(Timestamp(10), 0)); // on time
        out.extend(b.insert(&element("k", 7, 7), Timestamp(50), 0).unwrap()); // late
        out.extend(b.advance(Timestamp(150), 0)); // expired: the final pane
        assert!(b.is_empty());
        assert_eq!(
            decode(out),
            vec![
                ("k".into(), vec![1, 2, 3], PaneTiming::OnTime, 0, 0, true, false),
                ("k".into(), vec![1, 2, 3, 7], PaneTiming::Late, 1, 1, false, false),
                ("k".into(), vec![1, 2, 3, 7], PaneTiming::Late, 2, 2, false, true),
            ]
        );
    }

    /// Beam Go's TestTriggerAfterSynchronizedProcessingTime: elements that
    /// arrive together make one pane per window, not one per element.
    #[test]
    fn synchronized_processing_time_fires_once_for_elements_arriving_together() {
        let trigger = Trigger::Repeatedly(Box::new(Trigger::AfterSynchronizedProcessingTime));
        let mut b = PaneBuffer::new(
            coder(),
            Coder::IntervalWindow,
            windowing(trigger, Accumulation::Discarding, 0),
        );
        for v in 1..=3 {
            assert!(b.insert(&element("k", v, v as i64), Timestamp(0), 1000).unwrap().is_empty());
        }
        let out = b.advance(Timestamp(0), 1000);
        assert_eq!(
            decode(out),
            vec![("k".into(), vec![1, 2, 3], PaneTiming::Early, 0, -1, true, false)]
        );
        assert!(b.advance(Timestamp(0), 1001).is_empty());
    }

    #[test]
    fn default_trigger_drops_data_past_allowed_lateness() {
        let mut b = PaneBuffer::new(
            coder(),
            Coder::IntervalWindow,
            windowing(Trigger::Default, Accumulation::Discarding, 0),
        );
        b.insert(&element("k", 1, 1), Timestamp(0), 0).unwrap();
        let out = b.advance(Timestamp(10), 0);
        assert_eq!(
            decode(out),
            vec![("k".into(), vec![1], PaneTiming::OnTime, 0, 0, true, true)]
        );
        assert!(b
            .insert(&element("k", 2, 2), Timestamp(10), 0)
            .unwrap()
            .is_empty());
        assert_eq!(b.dropped_late, 1);
        assert!(b.is_empty());
    }

    #[test]
    fn processing_time_trigger_fires_on_the_clock() {
        let trigger = Trigger::Repeatedly(Box::new(Trigger::AfterProcessingTime {
            delay_ms: 1000,
            align: None,
        }));
        let mut b = PaneBuffer::new(
            coder(),
            Coder::IntervalWindow,
            windowing(trigger, Accumulation::Discarding, 0),
        );
        b.insert(&element("k", 1, 1), Timestamp(0), 5000).unwrap();
        b.insert(&element("k", 2, 2), Timestamp(0), 5500).unwrap();
        assert_eq!(b.next_deadline(), Some(6000));
        assert!(b.advance(Timestamp(0), 5999).is_empty());
        let out = b.advance(Timestamp(0), 6000);
        assert_eq!(
            decode(out),
            vec![(
                "k".into(),
                vec![1, 2],
                PaneTiming::Early,
                0,
                -1,
                true,
                false
            )]
        );
        assert_eq!(b.next_deadline(), None);
    }
}
