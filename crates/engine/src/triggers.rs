//! The trigger state machine: when a window's pane fires, per (key, window).
//!
//! Semantics follow Beam's trigger documentation and the `Trigger` message
//! of `beam_runner_api.proto`: a trigger is evaluated after each element and
//! whenever the input watermark or the processing time advances; when it
//! fires, the GroupByKey emits a pane. Once-triggers (`ElementCount`,
//! `AfterProcessingTime`, `AfterAny`, `AfterAll`, `AfterEach` after its last
//! subtrigger, `OrFinally` once its `finally` fires) *finish* when they fire;
//! `Repeatedly` and the early/late firings of `AfterEndOfWindow` reset their
//! subtrigger instead.
//!
//! Times: event times are [`Timestamp`]s (ms); processing times are
//! milliseconds since the Unix epoch (or since the start of a TestStream's
//! clock).

use weir_model::Timestamp;
use weir_graph::Trigger;

/// What a trigger sees when it is evaluated.
#[derive(Clone, Copy, Debug)]
pub struct TriggerContext {
    /// The GroupByKey's input watermark.
    pub watermark: Timestamp,
    /// The current processing time, in milliseconds.
    pub now: i64,
    /// The window's last timestamp (`Window::max_timestamp`).
    pub window_max: Timestamp,
}

impl TriggerContext {
    fn past_end_of_window(&self) -> bool {
        self.watermark > self.window_max
    }
}

/// A trigger tree flattened in pre-order, shared by all windows of a GroupByKey.
#[derive(Clone, Debug)]
pub struct CompiledTrigger {
    nodes: Vec<Node>,
}

#[derive(Clone, Debug)]
enum Node {
    Default,
    AfterEndOfWindow {
        early: Option<usize>,
        late: Option<usize>,
    },
    ElementCount(u64),
    AfterProcessingTime {
        delay_ms: i64,
        align: Option<(i64, i64)>,
    },
    Always,
    Never,
    Repeatedly(usize),
    AfterEach(Vec<usize>),
    AfterAny(Vec<usize>),
    AfterAll(Vec<usize>),
    OrFinally {
        main: usize,
        finally: usize,
    },
}

/// The state of one trigger tree for one window.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TriggerState {
    nodes: Vec<NodeState>,
}

#[derive(Clone, Debug, Default, PartialEq)]
struct NodeState {
    finished: bool,
    /// Elements seen (ElementCount, Always, Default after the on-time pane).
    count: u64,
    /// Processing time at which an AfterProcessingTime node fires.
    deadline: Option<i64>,
    /// AfterEach: the subtrigger now active.
    current: usize,
    /// Default / AfterEndOfWindow: the on-time firing happened.
    on_time_fired: bool,
}

impl CompiledTrigger {
    /// Flattens `trigger`.
    pub fn new(trigger: &Trigger) -> Self {
        let mut c = CompiledTrigger { nodes: Vec::new() };
        c.add(trigger);
        c
    }

    fn add(&mut self, t: &Trigger) -> usize {
        let at = self.nodes.len();
        self.nodes.push(Node::Never);
        let node = match t {
            Trigger::Default => Node::Default,
            Trigger::AfterEndOfWindow { early, late } => Node::AfterEndOfWindow {
                early: early.as_deref().map(|e| self.add(e)),
                late: late.as_deref().map(|l| self.add(l)),
            },
            Trigger::ElementCount(n) => Node::ElementCount((*n).max(1)),
            Trigger::AfterProcessingTime { delay_ms, align } => Node::AfterProcessingTime {
                delay_ms: *delay_ms,
                align: *align,
            },
            Trigger::AfterSynchronizedProcessingTime => Node::AfterProcessingTime {
                delay_ms: 0,
                align: None,
            },
            Trigger::Always => Node::Always,
            Trigger::Never => Node::Never,
            Trigger::Repeatedly(sub) => Node::Repeatedly(self.add(sub)),
            Trigger::AfterEach(subs) => Node::AfterEach(subs.iter().map(|s| self.add(s)).collect()),
            Trigger::AfterAny(subs) => Node::AfterAny(subs.iter().map(|s| self.add(s)).collect()),
            Trigger::AfterAll(subs) => Node::AfterAll(subs.iter().map(|s| self.add(s)).collect()),
            Trigger::OrFinally { main, finally } => {
                let main = self.add(main);
                let finally = self.add(finally);
                Node::OrFinally { main, finally }
            }
        };
        self.nodes[at] = node;
        at
    }

    /// A fresh state for a new window.
    pub fn new_state(&self) -> TriggerState {
        TriggerState {
            nodes: vec![NodeState::default(); self.nodes.len()],
        }
    }

    /// Records one element arriving in the window.
    pub fn on_element(&self, s: &mut TriggerState, cx: &TriggerContext) {
        self.element(0, s, cx);
    }

    /// Whether the trigger fires now.
    pub fn should_fire(&self, s: &TriggerState, cx: &TriggerContext) -> bool {
        self.fire_ready(0, s, cx)
    }

    /// Records a firing (call only when [`Self::should_fire`] is true).
    pub fn on_fire(&self, s: &mut TriggerState, cx: &TriggerContext) {
        self.fire(0, s, cx);
    }

    /// True once the whole trigger has finished.
    pub fn is_finished(&self, s: &TriggerState) -> bool {
        s.nodes[0].finished
    }

    /// Resets the whole trigger to its initial state.
    pub fn reset(&self, s: &mut TriggerState) {
        self.reset_node(0, s);
    }

    /// The earliest processing time at which the trigger may fire without a
    /// new element, if it waits on processing time.
    pub fn next_deadline(&self, s: &TriggerState) -> Option<i64> {
        s.nodes
            .iter()
            .zip(&self.nodes)
            .filter(|(st, n)| !st.finished && matches!(n, Node::AfterProcessingTime { .. }))
            .filter_map(|(st, _)| st.deadline)
            .min()
    }

    /// The state of a window merged from windows with `states` (session
    /// merging): counts add up, the earliest deadline wins, a node is
    /// finished when it finished in any of them, and end-of-window triggers
    /// wait for the merged window's end again.
    pub fn merge(&self, states: &[TriggerState]) -> TriggerState {
        let mut out = self.new_state();
        for (i, n) in out.nodes.iter_mut().enumerate() {
            for s in states {
                let o = &s.nodes[i];
                n.finished |= o.finished;
                n.count += o.count;
                n.deadline = match (n.deadline, o.deadline) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                };
                n.current = n.current.max(o.current);
            }
            // The merged window ends later than its parts: whether its
            // end-of-window firing happened is decided afresh by the
            // watermark (as in Java's AfterWatermark on merge).
            n.on_time_fired = false;
            if matches!(self.nodes[i], Node::Default | Node::AfterEndOfWindow { .. }) {
                n.finished = false;
            }
        }
        out
    }

    fn element(&self, i: usize, s: &mut TriggerState, cx: &TriggerContext) {
        if s.nodes[i].finished {
            return;
        }
        match &self.nodes[i] {
            Node::Default | Node::ElementCount(_) | Node::Always => s.nodes[i].count += 1,
            Node::Never => {}
            Node::AfterProcessingTime { delay_ms, align } => {
                if s.nodes[i].deadline.is_none() {
                    let mut at = cx.now.saturating_add(*delay_ms);
                    if let Some((period, offset)) = align {
                        // The next time t >= at with t = offset (mod period).
                        let rem = (at - offset).rem_euclid(*period);
                        if rem != 0 {
                            at += period - rem;
                        }
                    }
                    s.nodes[i].deadline = Some(at);
                }
            }
            Node::AfterEndOfWindow { early, late } => {
                let sub = if s.nodes[i].on_time_fired {
                    *late
                } else {
                    *early
                };
                if let Some(sub) = sub {
                    self.element(sub, s, cx);
                }
            }
            Node::Repeatedly(sub) => self.element(*sub, s, cx),
            Node::AfterEach(subs) => {
                if let Some(&sub) = subs.get(s.nodes[i].current) {
                    self.element(sub, s, cx);
                }
            }
            Node::AfterAny(subs) | Node::AfterAll(subs) => {
                for &sub in subs {
                    self.element(sub, s, cx);
                }
            }
            Node::OrFinally { main, finally } => {
                self.element(*main, s, cx);
                self.element(*finally, s, cx);
            }
        }
    }

    fn fire_ready(&self, i: usize, s: &TriggerState, cx: &TriggerContext) -> bool {
        let st = &s.nodes[i];
        if st.finished {
            return false;
        }
        match &self.nodes[i] {
            Node::Default => {
                if st.on_time_fired {
                    st.count > 0
                } else {
                    cx.past_end_of_window()
                }
            }
            Node::ElementCount(n) => st.count >= *n,
            Node::Always => st.count > 0,
            Node::Never => false,
            Node::AfterProcessingTime { .. } => st.deadline.is_some_and(|d| cx.now >= d),
            Node::AfterEndOfWindow { early, late } => {
                if st.on_time_fired {
                    late.is_some_and(|l| self.fire_ready(l, s, cx))
                } else {
                    cx.past_end_of_window() || early.is_some_and(|e| self.fire_ready(e, s, cx))
                }
            }
            Node::Repeatedly(sub) => self.fire_ready(*sub, s, cx),
            Node::AfterEach(subs) => subs
                .get(st.current)
                .is_some_and(|&sub| self.fire_ready(sub, s, cx)),
            Node::AfterAny(subs) => subs.iter().any(|&sub| self.fire_ready(sub, s, cx)),
            Node::AfterAll(subs) => {
                subs.iter().any(|&sub| self.fire_ready(sub, s, cx))
                    && subs
                        .iter()
                        .all(|&sub| s.nodes[sub].finished || self.fire_ready(sub, s, cx))
            }
            Node::OrFinally { main, finally } => {
                self.fire_ready(*main, s, cx) || self.fire_ready(*finally, s, cx)
            }
        }
    }

    fn fire(&self, i: usize, s: &mut TriggerState, cx: &TriggerContext) {
        match self.nodes[i].clone() {
            Node::Default => {
                if cx.past_end_of_window() {
                    s.nodes[i].on_time_fired = true;
                }
                s.nodes[i].count = 0;
            }
            Node::ElementCount(_) | Node::AfterProcessingTime { .. } => s.nodes[i].finished = true,
            Node::Always => s.nodes[i].count = 0,
            Node::Never => {}
            Node::AfterEndOfWindow { early, late } => {
                if !s.nodes[i].on_time_fired {
                    if cx.past_end_of_window() {
                        s.nodes[i].on_time_fired = true;
                        if let Some(e) = early {
                            self.reset_node(e, s);
                        }
                        match late {
                            Some(l) => self.reset_node(l, s),
                            None => s.nodes[i].finished = true,
                        }
                    } else if let Some(e) = early {
                        self.fire(e, s, cx);
                        if s.nodes[e].finished {
                            self.reset_node(e, s);
                        }
                    }
                } else if let Some(l) = late {
                    self.fire(l, s, cx);
                    if s.nodes[l].finished {
                        self.reset_node(l, s);
                    }
                }
            }
            Node::Repeatedly(sub) => {
                self.fire(sub, s, cx);
                if s.nodes[sub].finished {
                    self.reset_node(sub, s);
                }
            }
            Node::AfterEach(subs) => {
                if let Some(&sub) = subs.get(s.nodes[i].current) {
                    self.fire(sub, s, cx);
                    if s.nodes[sub].finished {
                        s.nodes[i].current += 1;
                    }
                }
                if s.nodes[i].current >= subs.len() {
                    s.nodes[i].finished = true;
                }
            }
            Node::AfterAny(subs) | Node::AfterAll(subs) => {
                for sub in subs {
                    if self.fire_ready(sub, s, cx) {
                        self.fire(sub, s, cx);
                    }
                }
                s.nodes[i].finished = true;
            }
            Node::OrFinally { main, finally } => {
                if self.fire_ready(finally, s, cx) {
                    self.fire(finally, s, cx);
                    s.nodes[i].finished = true;
                } else {
                    self.fire(main, s, cx);
                    if s.nodes[main].finished {
                        s.nodes[i].finished = true;
                    }
                }
            }
        }
    }

    fn reset_node(&self, i: usize, s: &mut TriggerState) {
        s.nodes[i] = NodeState::default();
        let children: Vec<usize> = match &self.nodes[i] {
            Node::AfterEndOfWindow { early, late } => early.iter().chain(late).copied().collect(),
            Node::Repeatedly(sub) => vec![*sub],
            Node::AfterEach(subs) | Node::AfterAny(subs) | Node::AfterAll(subs) => subs.clone(),
            Node::OrFinally { main, finally } => vec![*main, *finally],
            _ => vec![],
        };
        for c in children {
            self.reset_node(c, s);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cx(watermark: i64, now: i64) -> TriggerContext {
        TriggerContext {
            watermark: Timestamp(watermark),
            now,
            window_max: Timestamp(9),
        }
    }

    /// Feeds elements (at processing times) and reports at which element
    /// (1-based) the trigger fired, firing whenever it is ready.
    fn firings(t: &Trigger, elements: usize, watermark: i64) -> Vec<usize> {
        let c = CompiledTrigger::new(t);
        let mut s = c.new_state();
        let mut out = vec![];
        for i in 1..=elements {
            let x = cx(watermark, i as i64);
            c.on_element(&mut s, &x);
            if c.should_fire(&s, &x) {
                c.on_fire(&mut s, &x);
                out.push(i);
            }
        }
        out
    }

    #[test]
    fn element_count_fires_once_and_finishes() {
        let t = Trigger::ElementCount(3);
        assert_eq!(firings(&t, 7, 0), vec![3]);
    }

    #[test]
    fn repeatedly_resets_its_subtrigger() {
        let t = Trigger::Repeatedly(Box::new(Trigger::ElementCount(3)));
        assert_eq!(firings(&t, 7, 0), vec![3, 6]);
    }

    #[test]
    fn after_each_runs_subtriggers_in_sequence() {
        let t = Trigger::AfterEach(vec![Trigger::ElementCount(2), Trigger::ElementCount(3)]);
        assert_eq!(firings(&t, 9, 0), vec![2, 5]);
    }

    #[test]
    fn after_any_and_after_all() {
        let any = Trigger::AfterAny(vec![Trigger::ElementCount(4), Trigger::ElementCount(2)]);
        assert_eq!(firings(&any, 6, 0), vec![2]);
        let all = Trigger::Repeatedly(Box::new(Trigger::AfterAll(vec![
            Trigger::ElementCount(4),
            Trigger::ElementCount(2),
        ])));
        assert_eq!(firings(&all, 9, 0), vec![4, 8]);
    }

    #[test]
    fn or_finally_stops_the_main_trigger() {
        let t = Trigger::OrFinally {
            main: Box::new(Trigger::Repeatedly(Box::new(Trigger::ElementCount(2)))),
            finally: Box::new(Trigger::ElementCount(5)),
        };
        assert_eq!(firings(&t, 9, 0), vec![2, 4, 5]);
    }

    #[test]
    fn always_fires_on_every_element_and_never_does_not() {
        assert_eq!(firings(&Trigger::Always, 3, 0), vec![1, 2, 3]);
        assert_eq!(firings(&Trigger::Never, 3, 0), Vec::<usize>::new());
    }

    #[test]
    fn after_end_of_window_with_early_and_late_firings() {
        let t = Trigger::AfterEndOfWindow {
            early: Some(Box::new(Trigger::ElementCount(2))),
            late: Some(Box::new(Trigger::ElementCount(1))),
        };
        let c = CompiledTrigger::new(&t);
        let mut s = c.new_state();
        let mut fired = vec![];
        // Four elements before the end of the window: early panes at 2 and 4.
        for i in 1..=4 {
            let x = cx(0, i);
            c.on_element(&mut s, &x);
            if c.should_fire(&s, &x) {
                c.on_fire(&mut s, &x);
                fired.push(format!("early@{i}"));
            }
        }
        // The watermark passes the end of the window: the on-time pane.
        let x = cx(10, 5);
        assert!(c.should_fire(&s, &x));
        c.on_fire(&mut s, &x);
        fired.push("on-time".into());
        assert!(!c.should_fire(&s, &x));
        // Each late element fires a late pane.
        for i in 6..=7 {
            let x = cx(10, i);
            c.on_element(&mut s, &x);
            assert!(c.should_fire(&s, &x));
            c.on_fire(&mut s, &x);
            fired.push(format!("late@{i}"));
        }
        assert_eq!(fired, ["early@2", "early@4", "on-time", "late@6", "late@7"]);
        assert!(!c.is_finished(&s));
    }

    #[test]
    fn default_fires_at_end_of_window_then_per_late_element() {
        let c = CompiledTrigger::new(&Trigger::Default);
        let mut s = c.new_state();
        c.on_element(&mut s, &cx(0, 0));
        assert!(!c.should_fire(&s, &cx(9, 0)));
        assert!(c.should_fire(&s, &cx(10, 0)));
        c.on_fire(&mut s, &cx(10, 0));
        assert!(!c.should_fire(&s, &cx(20, 0)), "no new element, no pane");
        c.on_element(&mut s, &cx(20, 0));
        assert!(c.should_fire(&s, &cx(20, 0)));
    }

    #[test]
    fn after_processing_time_waits_for_the_clock() {
        let t = Trigger::AfterProcessingTime {
            delay_ms: 100,
            align: None,
        };
        let c = CompiledTrigger::new(&t);
        let mut s = c.new_state();
        c.on_element(&mut s, &cx(0, 1000));
        c.on_element(&mut s, &cx(0, 1050));
        assert_eq!(
            c.next_deadline(&s),
            Some(1100),
            "timed from the first element"
        );
        assert!(!c.should_fire(&s, &cx(0, 1099)));
        assert!(c.should_fire(&s, &cx(0, 1100)));
        let aligned = Trigger::AfterProcessingTime {
            delay_ms: 0,
            align: Some((60, 5)),
        };
        let c = CompiledTrigger::new(&aligned);
        let mut s = c.new_state();
        c.on_element(&mut s, &cx(0, 100));
        assert_eq!(c.next_deadline(&s), Some(125));
    }

    #[test]
    fn merged_states_add_counts() {
        let c = CompiledTrigger::new(&Trigger::ElementCount(3));
        let mut a = c.new_state();
        let mut b = c.new_state();
        c.on_element(&mut a, &cx(0, 0));
        c.on_element(&mut b, &cx(0, 0));
        let mut m = c.merge(&[a, b]);
        assert!(!c.should_fire(&m, &cx(0, 0)));
        c.on_element(&mut m, &cx(0, 0));
        assert!(c.should_fire(&m, &cx(0, 0)));
    }
}
