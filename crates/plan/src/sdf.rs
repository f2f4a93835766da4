//! Splittable DoFn expansion: one SDF ParDo becomes pair-with-restriction →
//! split-and-size-restrictions → process-sized-elements-and-restrictions
//! (`beam:transform:sdf_*` URNs in beam_runner_api.proto).
//!
//! Coders follow Beam's portable runners: the paired PCollection is
//! `KV<element, restriction>`, the sized one `KV<KV<element, restriction>, double>`
//! (the restriction coder already carries the watermark-estimator state).
//! The process transform is marked to start a new stage, so the runner
//! receives sized restrictions and can spread them over SDK workers. When the
//! job is drained, truncate-sized-restrictions runs between split and
//! process (same coder in and out), so an unbounded restriction shrinks to
//! what the DoFn's `truncate_restriction` keeps (by default: a bounded one
//! whole, an unbounded one not at all).

use weir_proto::{beam, urns};

use crate::coders::add_coder;
use crate::leaves::{pardo_payload, urn_of};
use crate::{PlanError, Result};

/// Suffix of the SDF process transform id; fusion starts a new stage there.
pub(crate) const PROCESS_SUFFIX: &str = "/weir:sdf-process";
const DOUBLE_CODER_ID: &str = "weir:coder:double";

/// Replaces every splittable ParDo in `leaves` by its expanded transforms
/// (three, or four with truncation when `drain`).
pub(crate) fn expand(
    c: &mut beam::Components,
    leaves: &mut Vec<String>,
    drain: bool,
) -> Result<()> {
    let mut out = Vec::with_capacity(leaves.len());
    for id in leaves.drain(..) {
        let t = &c.transforms[&id];
        if urn_of(t) != urns::transform::PAR_DO {
            out.push(id);
            continue;
        }
        let payload = pardo_payload(&id, t)?;
        if payload.restriction_coder_id.is_empty() {
            out.push(id);
            continue;
        }
        let t = t.clone();
        let main_tag = t
            .inputs
            .keys()
            .find(|k| !payload.side_inputs.contains_key(*k))
            .cloned()
            .ok_or_else(|| {
                PlanError::Invalid(format!("SDF {id} ({}) has no main input", t.unique_name))
            })?;
        let main_input = t.inputs[&main_tag].clone();
        let main_pc = c.pcollections.get(&main_input).cloned().ok_or_else(|| {
            PlanError::Invalid(format!("transform {id}: unknown PCollection {main_input}"))
        })?;

        add_coder(
            &mut c.coders,
            DOUBLE_CODER_ID.into(),
            urns::coder::DOUBLE,
            vec![],
        );
        let paired_coder = add_coder(
            &mut c.coders,
            format!("{id}/weir:paired-coder"),
            urns::coder::KV,
            vec![
                main_pc.coder_id.clone(),
                payload.restriction_coder_id.clone(),
            ],
        );
        let sized_coder = add_coder(
            &mut c.coders,
            format!("{id}/weir:sized-coder"),
            urns::coder::KV,
            vec![paired_coder.clone(), DOUBLE_CODER_ID.into()],
        );

        let paired_pc = format!("{id}/weir:paired");
        let sized_pc = format!("{id}/weir:sized");
        let truncated_pc = format!("{id}/weir:truncated");
        for (pc, coder_id, suffix) in [
            (&paired_pc, &paired_coder, "paired"),
            (&sized_pc, &sized_coder, "sized"),
            (&truncated_pc, &sized_coder, "truncated"),
        ] {
            if pc == &truncated_pc && !drain {
                continue;
            }
            let mut p = main_pc.clone();
            p.coder_id = coder_id.clone();
            p.unique_name = format!("{}/{suffix}", main_pc.unique_name);
            c.pcollections.insert(pc.clone(), p);
        }

        let step = |suffix: &str, name: &str, urn: &str, input: &str, outputs| {
            let mut n = t.clone();
            n.unique_name = format!("{}/{name}", t.unique_name);
            if let Some(spec) = n.spec.as_mut() {
                spec.urn = urn.to_string();
            }
            n.inputs.insert(main_tag.clone(), input.to_string());
            n.outputs = outputs;
            (format!("{id}{suffix}"), n)
        };
        let single = |pc: &String| [("out".to_string(), pc.clone())].into_iter().collect();
        let process_input = if drain { &truncated_pc } else { &sized_pc };
        let mut steps = vec![
            step(
                "/weir:sdf-pair",
                "PairWithRestriction",
                urns::transform::SDF_PAIR_WITH_RESTRICTION,
                &main_input,
                single(&paired_pc),
            ),
            step(
                "/weir:sdf-split",
                "SplitAndSizeRestriction",
                urns::transform::SDF_SPLIT_AND_SIZE_RESTRICTIONS,
                &paired_pc,
                single(&sized_pc),
            ),
        ];
        if drain {
            steps.push(step(
                "/weir:sdf-truncate",
                "TruncateRestriction",
                urns::transform::SDF_TRUNCATE_SIZED_RESTRICTIONS,
                &sized_pc,
                single(&truncated_pc),
            ));
        }
        steps.push(step(
            PROCESS_SUFFIX,
            "Process",
            urns::transform::SDF_PROCESS_SIZED_ELEMENTS_AND_RESTRICTIONS,
            process_input,
            t.outputs.clone(),
        ));
        for (new_id, n) in steps {
            c.transforms.insert(new_id.clone(), n);
            out.push(new_id);
        }
    }
    *leaves = out;
    Ok(())
}

/// The drain variant of an SDK stage descriptor `d` whose input PCollection
/// `input` feeds SDF process transform `process_id` (see
/// `SdkStage::drain_descriptor_id`): a copy with id `id` in which a
/// `beam:transform:sdf_truncate_sized_restrictions:v1` (the process
/// transform's own ParDo payload, same coder in and out) sits between the
/// stage input and the process transform.
///
/// # Errors
/// [`PlanError::Internal`] when `process_id` is not in `d` or does not read `input`.
pub(crate) fn drain_variant(
    d: &beam::ProcessBundleDescriptor,
    id: &str,
    process_id: &str,
    input: &str,
) -> Result<beam::ProcessBundleDescriptor> {
    let mut v = d.clone();
    v.id = id.to_string();
    let process = v.transforms.get_mut(process_id).ok_or_else(|| {
        PlanError::Internal(format!(
            "drain variant of {}: no transform {process_id}",
            d.id
        ))
    })?;
    let tag = process
        .inputs
        .iter()
        .find(|(_, pc)| pc.as_str() == input)
        .map(|(tag, _)| tag.clone())
        .ok_or_else(|| {
            PlanError::Internal(format!(
                "drain variant of {}: {process_id} does not read {input}",
                d.id
            ))
        })?;
    let truncated = format!("{input}/weir:drain-truncated");
    process.inputs.insert(tag.clone(), truncated.clone());
    let mut truncate = process.clone();
    truncate.unique_name = format!(
        "{}/TruncateRestriction",
        process.unique_name.trim_end_matches("/Process")
    );
    if let Some(spec) = truncate.spec.as_mut() {
        spec.urn = urns::transform::SDF_TRUNCATE_SIZED_RESTRICTIONS.to_string();
    }
    truncate.inputs.insert(tag, input.to_string());
    truncate.outputs = [("out".to_string(), truncated.clone())]
        .into_iter()
        .collect();
    let pc = v.pcollections.get(input).cloned().ok_or_else(|| {
        PlanError::Internal(format!(
            "drain variant of {}: PCollection {input} not in the descriptor",
            d.id
        ))
    })?;
    v.pcollections.insert(truncated, pc);
    v.transforms
        .insert(format!("{process_id}/weir:drain-truncate"), truncate);
    Ok(v)
}
