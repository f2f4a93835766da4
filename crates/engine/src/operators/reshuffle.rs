//! The Reshuffle stage (`beam:transform:reshuffle:v1`, and redistribute):
//! an identity that redistributes elements.

use timely::dataflow::operators::Exchange;

use super::{Element, Elements};
use crate::dataflow::JobContext;

/// `input` redistributed. In one process the SDK stage reading it spreads
/// its input over the timely workers (in 16 KiB chunks, so a few elements
/// make one bundle and spread by dynamic splits of its data channel, as on
/// Prism and Dataflow), and a reshuffle only breaks fusion (the plan did
/// that), so the stream passes through. In a cluster, SDK stages spread
/// over their own process's workers only, so a reshuffle sends elements
/// round-robin over all `peers` workers of every process, starting after
/// this worker's `index`, and counts the bytes that leave.
pub(crate) fn reshuffle<'s>(
    input: Elements<'s>,
    ctx: &JobContext,
    index: usize,
    peers: usize,
) -> Elements<'s> {
    if ctx.config.cluster.is_none() {
        return input;
    }
    let (ctx, mut next) = (ctx.clone(), index as u64);
    input.exchange(move |e: &Element| {
        next = next.wrapping_add(1);
        let hash = next % peers as u64;
        ctx.count_exchange(index, hash, peers as u64, e.len());
        hash
    })
}
