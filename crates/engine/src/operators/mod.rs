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

use timely::dataflow::StreamVec;

use crate::time::Time;

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
