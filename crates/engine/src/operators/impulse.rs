//! The Impulse stage (`beam:transform:impulse:v1`), the job's source: one
//! empty byte array in the global window at Beam's minimum timestamp.

use timely::dataflow::operators::vec::ToStream;
use timely::dataflow::Scope;
use weir_model::Coder;

use super::Elements;
use crate::dataflow::JobContext;
use crate::elements::impulse_element;
use crate::time::Time;

/// The output of Impulse stage `stage_index` on timely worker `worker`: the
/// one impulse element (coded by `value_coder`, the wire coder of its
/// output) on worker 0, nothing on the others. The stream's frontier
/// empties at once, so the source never holds the watermark.
pub(crate) fn impulse<'s>(
    scope: Scope<'s, Time>,
    ctx: &JobContext,
    stage_index: usize,
    worker: usize,
    value_coder: &Coder,
) -> Elements<'s> {
    let data = if worker == 0 {
        ctx.count(stage_index, 0, 1, 0);
        vec![impulse_element(value_coder)]
    } else {
        vec![]
    };
    data.to_stream(scope)
}
