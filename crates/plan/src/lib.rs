//! Turns a Beam pipeline (Runner API proto) into Weir's stage graph.
//!
//! Layer: plan. Depends on `weir-proto` and `weir-model`; no tokio, no timely,
//! no I/O. Entry point: [`plan`], which validates the pipeline, expands
//! splittable DoFns, fuses SDK transforms into stages and builds one
//! `ProcessBundleDescriptor` per SDK stage. The engine consumes the native
//! [`StageGraph`]; the harness consumes the descriptors.

mod coders;
mod combiner_lifting;
mod cross_sdk;
mod descriptor;
pub mod error;
mod fusion;
mod leaves;
mod merge_windows;
mod sdf;
mod transcode;
pub mod validate;
mod windowing;
mod wire;

use std::collections::HashMap;

pub use error::{PlanError, Result};
pub use windowing::is_python_environment;
/// The stage graph types (`weir-graph`), where the plan puts its result.
pub use weir_graph as graph;
pub use graph::*;
use weir_proto::beam;

/// What the plan needs to know about the running harness.
#[derive(Clone, Debug, Default)]
pub struct PlanOptions {
    /// `host:port` of the Fn API (data and state) service SDK harnesses dial;
    /// written into every `RemoteGrpcPort` and `state_api_service_descriptor`.
    pub fn_api_url: String,
    /// The job runs in streaming mode (`--streaming`): see [`StageGraph::streaming`].
    pub streaming: bool,
    /// The job starts drained: splittable DoFns truncate their restrictions
    /// (`beam:transform:sdf_truncate_sized_restrictions:v1`) before
    /// processing them, as a runner does when a job is drained.
    pub drain: bool,
}

/// A planned job: the engine's stage graph and, per SDK stage, the
/// `ProcessBundleDescriptor` registered with SDK harnesses.
#[derive(Clone, Debug)]
pub struct Plan {
    /// Stages in topological order over native types.
    pub graph: StageGraph,
    /// `ProcessBundleDescriptor` per SDK stage id (`StageGraph::stages[i].id`).
    pub descriptors: HashMap<String, beam::ProcessBundleDescriptor>,
    /// Environments referenced by SDK stages, by environment id.
    pub environments: HashMap<String, beam::Environment>,
}

/// Validates and plans `pipeline`.
///
/// # Errors
/// [`PlanError::Unsupported`] for a transform, coder, windowing strategy or
/// requirement Weir does not implement (the message names the transform and
/// URN); [`PlanError::Invalid`] for a malformed pipeline (dangling ids, a
/// transform without its spec, a composite or coder cycle, nesting deeper
/// than the limits of [`validate`]).
pub fn plan(pipeline: &beam::Pipeline, options: &PlanOptions) -> Result<Plan> {
    validate::check(pipeline)?;
    leaves::check_requirements(pipeline)?;
    let mut components = pipeline.components.clone().unwrap_or_default();
    let mut leaf_ids = leaves::collect(pipeline, &mut components)?;
    cross_sdk::check(&components, &leaf_ids)?;
    sdf::expand(&mut components, &mut leaf_ids, options.drain)?;
    transcode::insert(&mut components, &mut leaf_ids)?;
    let fused = fusion::fuse(&components, &leaf_ids)?;
    descriptor::build(&components, fused, options)
}
