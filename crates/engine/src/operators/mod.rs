//! The timely operators Weir builds a job's stages from, one per file.
//!
//! - [`group_by_key`]: a GroupByKey stage; wires the pure buffers
//!   ([`crate::group_by_key::GroupByKeyBuffer`] in batch,
//!   [`crate::panes::PaneBuffer`] in streaming) into timely.
//! - [`test_stream`]: a TestStream stage, replaying its events.
//! - [`sdk_stage`]: a fused SDK stage, run as bundles on SDK harnesses.
//! - [`impulse`]: the Impulse source (timely's `to_stream`).
//! - [`flatten`]: a Flatten (timely's `concatenate`).
//! - [`reshuffle`]: a Reshuffle (a pass-through in one process, a
//!   round-robin exchange over the processes of a cluster).
//!
//! `dataflow::build` wires them into one timely dataflow per worker.

use timely::dataflow::channels::pact::Pipeline;
use timely::dataflow::operators::Operator;
use timely::dataflow::StreamVec;

use crate::dataflow::{JobContext, StageStatus};
use crate::time::{watermark_of, Time};

pub(crate) mod flatten;
pub(crate) mod group_by_key;
pub(crate) mod impulse;
pub(crate) mod reshuffle;
pub(crate) mod sdk_stage;
pub(crate) mod test_stream;

/// One encoded windowed value (`beam:coder:windowed_value:v1`).
pub(crate) type Element = Vec<u8>;

/// A timely stream of elements of one PCollection.
pub(crate) type Elements<'s> = StreamVec<'s, Time, Element>;

/// A timely stream of elements tagged with the output port (index into the
/// stage's outputs) they belong to.
pub(crate) type TaggedElements<'s> = StreamVec<'s, Time, (u32, Element)>;

/// `input` unchanged, as the output of stage `stage`, a Flatten or a
/// Reshuffle (which emit what they take): counts its elements in and out
/// and reports its input watermark, so `weir jobs describe`, the web UI and
/// `/metrics` show such a stage as they show the others (they showed 0 in,
/// 0 out and no watermark).
pub(crate) fn observed<'s>(input: Elements<'s>, ctx: &JobContext, stage: usize) -> Elements<'s> {
    let ctx = ctx.clone();
    let worker = input.scope().worker().index();
    let name = format!("{} (counted)", ctx.graph.stages[stage].name);
    input.unary_frontier(Pipeline, &name, move |_, _| {
        let mut last = None;
        move |(input, frontier), output| {
            input.for_each(|cap, data| {
                ctx.count(stage, data.len(), data.len(), 0);
                if let Some(cap) = cap.retain_least(0) {
                    output.session(&cap).give_container(data);
                }
            });
            let f = frontier.frontier();
            let watermark = (!f.is_empty()).then(|| watermark_of(f.as_ref()));
            if last != Some(watermark) {
                last = Some(watermark);
                ctx.report(stage, worker, StageStatus { watermark, ..StageStatus::default() });
            }
        }
    })
}
