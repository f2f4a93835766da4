//! The TestStream operator (`beam:transform:teststream:v1`).

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::time::Duration;

use timely::dataflow::{ProbeHandle, Scope};
use weir_model::Timestamp;

use super::TaggedElements;
use crate::dataflow::JobContext;
use crate::time::{time_at, Clock, Time};

/// A TestStream (`beam:transform:teststream:v1`) on worker 0: replays its
/// events in order, each once the pipeline has processed everything before
/// it (the probe has passed the stream's current time). Elements go out in
/// the global window at their own timestamps, tagged with their output's
/// port; a watermark event moves the watermark of its output (Beam's
/// `AdvanceWatermark` names the output's tag), and the stream's event time
/// is the least watermark of its outputs: every output is held back to the
/// slowest, so no output's elements arrive late because another output's
/// watermark moved on (Python's multi-output TestStreams advance each tag on
/// its own). A processing-time event moves the job's test clock. The stream
/// ends (watermark +infinity) after its last event.
pub(crate) fn test_stream<'s>(
    scope: Scope<'s, Time>,
    ctx: &JobContext,
    probe: &ProbeHandle<Time>,
    index: usize,
    outputs: usize,
    events: &[weir_graph::TestStreamEvent],
) -> TaggedElements<'s> {
    use timely::dataflow::operators::generic::operator::source;
    use weir_graph::TestStreamEvent;
    let events: VecDeque<TestStreamEvent> = if index == 0 {
        events.iter().cloned().collect()
    } else {
        VecDeque::new()
    };
    let ctx = ctx.clone();
    let probe = probe.clone();
    let worker = scope.worker().clone();
    source(scope, "TestStream", move |cap, info| {
        let activator = worker.activator_for(info.address.clone());
        let mut cap = Some(cap);
        let mut events = events;
        let mut watermarks = vec![Timestamp::MIN; outputs.max(1)];
        let mut sequence: u64 = 0;
        // (activity counter, consecutive checks it stayed the same) while
        // the probe is held only by elements waiting for side inputs.
        let mut quiet = (u64::MAX, 0u32);
        move |output| {
            let Some(c) = cap.as_mut() else { return };
            if ctx.stopped() || ctx.draining() {
                cap = None;
                return;
            }
            // Wait until everything before the stream's current time is
            // done. Main-input elements held back for side data that later
            // events bring, and the holds of pending timers, do not count
            // (Beam's TestStream waits for the pipeline to quiesce): when
            // they are all that holds the probe and nothing else moved for a
            // few checks, the stream goes on.
            if probe.less_than(c.time()) {
                let activity = ctx.activity.load(Ordering::Relaxed);
                if ctx.idle_but_held() && activity == quiet.0 {
                    quiet.1 += 1;
                } else {
                    quiet = (activity, 0);
                }
                if quiet.1 < QUIET_CHECKS {
                    activator.activate_after(Duration::from_millis(1));
                    return;
                }
            }
            quiet = (u64::MAX, 0);
            let Some(event) = events.pop_front() else {
                cap = None;
                return;
            };
            match event {
                TestStreamEvent::Elements {
                    output: port,
                    elements,
                } => {
                    let mut session = output.session(c);
                    for (value, timestamp) in elements {
                        let wv = weir_model::WindowedValue {
                            timestamp,
                            windows: vec![weir_model::Window::Global],
                            pane: weir_model::PaneInfo::NO_FIRING,
                            value,
                        };
                        let mut bytes = Vec::new();
                        wv.encode(&mut bytes);
                        session.give((port as u32, bytes));
                    }
                }
                TestStreamEvent::Watermark { output: port, to } => {
                    if let Some(w) = watermarks.get_mut(port) {
                        *w = (*w).max(to.min(Timestamp::MAX));
                    }
                }
                TestStreamEvent::ProcessingTime { advance_ms } => {
                    if let Clock::Test(t) = &ctx.clock {
                        t.fetch_add(advance_ms.max(0), Ordering::SeqCst);
                    }
                }
            }
            sequence += 1;
            let event_time = watermarks.iter().copied().min().unwrap_or(Timestamp::MIN);
            c.downgrade(&(time_at(event_time) | Time::from(sequence)));
            activator.activate();
        }
    })
}

/// Consecutive checks (1 ms apart) a TestStream waits, while only elements
/// held back for side inputs or timer holds hold it, before it replays its
/// next event.
const QUIET_CHECKS: u32 = 3;
