//! Leaf transforms: walks composites down to primitives and classifies them by URN.

use prost::Message;
use weir_proto::{beam, urns};

use crate::{PlanError, Result};

/// Who executes a leaf transform.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum LeafKind {
    Impulse,
    TestStream,
    GroupByKey,
    Flatten,
    Reshuffle,
    /// Executed by an SDK harness inside a fused stage.
    Sdk,
}

const SDK_URNS: &[&str] = &[
    urns::transform::PAR_DO,
    urns::transform::WINDOW_INTO,
    urns::transform::COMBINE_PER_KEY_PRECOMBINE,
    urns::transform::COMBINE_PER_KEY_MERGE_ACCUMULATORS,
    urns::transform::COMBINE_PER_KEY_EXTRACT_OUTPUTS,
    urns::transform::COMBINE_PER_KEY_CONVERT_TO_ACCUMULATORS,
    urns::transform::COMBINE_GROUPED_VALUES,
    urns::transform::TO_STRING,
    urns::transform::MAP_WINDOWS,
    urns::transform::SDF_PAIR_WITH_RESTRICTION,
    urns::transform::SDF_SPLIT_AND_SIZE_RESTRICTIONS,
    urns::transform::SDF_PROCESS_SIZED_ELEMENTS_AND_RESTRICTIONS,
    urns::transform::SDF_TRUNCATE_SIZED_RESTRICTIONS,
];

/// Requirements (`Pipeline.requirements`) Weir can honour today.
const SUPPORTED_REQUIREMENTS: &[&str] = &[
    urns::requirement::SPLITTABLE_DOFN,
    urns::requirement::BUNDLE_FINALIZATION,
    urns::requirement::STATEFUL_PROCESSING,
];

/// Rejects a pipeline that declares a requirement Weir does not implement.
pub(crate) fn check_requirements(pipeline: &beam::Pipeline) -> Result<()> {
    for r in &pipeline.requirements {
        if !SUPPORTED_REQUIREMENTS.contains(&r.as_str()) {
            return Err(PlanError::Unsupported {
                transform: "<pipeline>".into(),
                urn: r.clone(),
                feature: format!("pipeline requirement {r}"),
            });
        }
    }
    Ok(())
}

/// The URN of a transform ("" when it has no spec).
pub(crate) fn urn_of(t: &beam::PTransform) -> &str {
    t.spec.as_ref().map(|s| s.urn.as_str()).unwrap_or("")
}

/// Classifies a leaf transform, rejecting what Weir cannot run.
pub(crate) fn classify(id: &str, t: &beam::PTransform) -> Result<LeafKind> {
    let urn = urn_of(t);
    let unsupported = |feature: &str| PlanError::Unsupported {
        transform: format!("{id} ({})", t.unique_name),
        urn: urn.to_string(),
        feature: feature.to_string(),
    };
    Ok(match urn {
        urns::transform::IMPULSE => LeafKind::Impulse,
        urns::transform::GROUP_BY_KEY => LeafKind::GroupByKey,
        urns::transform::FLATTEN if id.contains(crate::transcode::TRANSCODE_MARKER) => {
            LeafKind::Sdk
        }
        urns::transform::FLATTEN => LeafKind::Flatten,
        urns::transform::RESHUFFLE
        | urns::transform::REDISTRIBUTE_ARBITRARILY
        | urns::transform::REDISTRIBUTE_BY_KEY => LeafKind::Reshuffle,
        urns::transform::TEST_STREAM => LeafKind::TestStream,
        urns::transform::PAR_DO => {
            let payload = pardo_payload(id, t)?;
            for (name, spec) in &payload.state_specs {
                use beam::state_spec::Spec;
                match spec.spec {
                    Some(Spec::ReadModifyWriteSpec(_)) | Some(Spec::BagSpec(_)) | Some(Spec::CombiningSpec(_)) | Some(Spec::SetSpec(_)) => {}
                    _ => return Err(unsupported(&format!("user state {name} of this kind (map, multimap and ordered-list state are not implemented yet)"))),
                }
            }
            if !payload.on_window_expiration_timer_family_spec.is_empty() {
                return Err(unsupported("OnWindowExpiration"));
            }
            if payload.requires_time_sorted_input {
                return Err(unsupported("@RequiresTimeSortedInput"));
            }
            for (name, side) in &payload.side_inputs {
                let pattern = side
                    .access_pattern
                    .as_ref()
                    .map(|a| a.urn.as_str())
                    .unwrap_or("");
                if pattern != urns::side_input::ITERABLE && pattern != urns::side_input::MULTIMAP {
                    return Err(PlanError::Unsupported {
                        transform: format!("{id} ({})", t.unique_name),
                        urn: pattern.to_string(),
                        feature: format!("side input {name} access pattern"),
                    });
                }
            }
            LeafKind::Sdk
        }
        u if SDK_URNS.contains(&u) => LeafKind::Sdk,
        "" => {
            return Err(PlanError::Invalid(format!(
                "transform {id} ({}) has no URN and no subtransforms",
                t.unique_name
            )))
        }
        _ => return Err(unsupported("unknown primitive transform")),
    })
}

/// True for a ParDo with user state or timers.
pub(crate) fn is_stateful(id: &str, t: &beam::PTransform) -> Result<bool> {
    if urn_of(t) != urns::transform::PAR_DO {
        return Ok(false);
    }
    let p = pardo_payload(id, t)?;
    Ok(!p.state_specs.is_empty() || !p.timer_family_specs.is_empty())
}

/// Decodes the `ParDoPayload` of a `beam:transform:pardo:v1` transform.
pub(crate) fn pardo_payload(id: &str, t: &beam::PTransform) -> Result<beam::ParDoPayload> {
    let bytes = t.spec.as_ref().map(|s| s.payload.as_slice()).unwrap_or(&[]);
    beam::ParDoPayload::decode(bytes).map_err(|e| {
        PlanError::Invalid(format!(
            "transform {id} ({}): bad ParDoPayload: {e}",
            t.unique_name
        ))
    })
}

/// Leaf transform ids reachable from the roots, in discovery order. A
/// transform with subtransforms is a composite and is replaced by its leaves.
/// Liftable `combine_per_key` composites are replaced by their lifted form.
pub(crate) fn collect(pipeline: &beam::Pipeline, c: &mut beam::Components) -> Result<Vec<String>> {
    let mut out = Vec::new();
    let mut stack: Vec<String> = pipeline.root_transform_ids.iter().rev().cloned().collect();
    while let Some(id) = stack.pop() {
        let id = &id;
        if let Some(lifted) = crate::combiner_lifting::lift(c, id)? {
            out.extend(lifted);
            continue;
        }
        let t = c
            .transforms
            .get(id)
            .ok_or_else(|| PlanError::Invalid(format!("unknown transform id {id:?}")))?;
        if !t.subtransforms.is_empty() {
            stack.extend(t.subtransforms.iter().rev().cloned());
            continue;
        }
        if urn_of(t).is_empty() && t.inputs.is_empty() && t.outputs.is_empty() {
            continue; // an empty composite, e.g. the root of an empty pipeline
        }
        if !t.outputs.is_empty() && t.outputs.values().all(|o| t.inputs.values().any(|i| i == o)) {
            // A composite whose expansion returned its input unchanged (e.g.
            // Python's Create/MaybeReshuffle of one element in streaming):
            // it has no subtransforms and nothing to run.
            continue;
        }
        classify(id, t)?;
        out.push(id.clone());
    }
    Ok(out)
}
