//! Combiner lifting: a `beam:transform:combine_per_key:v1` composite becomes
//! precombine → GroupByKey → merge accumulators → extract outputs
//! (`beam:transform:combine_per_key_*` URNs), so values are combined inside
//! the producing stage before the shuffle. Beam's Python SDK already lifts on
//! the client; other SDKs send the composite.
//!
//! Lifted only under the default trigger (each pane then combines all of
//! its inputs) and an end-of-window output time; otherwise Weir runs the
//! composite's own subtransforms. The SDKs' precombines give a partial
//! accumulator the timestamp of whichever input came first (Java's
//! `PrecombineGroupingTable`; Go's, Beam issue #20436), so under
//! `EARLIEST_IN_PANE` or `LATEST_IN_PANE` (`beam:runner_api OutputTime`) a
//! lifted combine's pane timestamp would depend on the order of the bundle.

use prost::Message;
use weir_proto::{beam, urns};

use crate::coders::add_coder;
use crate::leaves::urn_of;
use crate::{PlanError, Result};

/// Lifts composite `id` if it is a liftable combine_per_key; returns the ids
/// of the four new leaf transforms, or `None` to recurse into it as usual.
pub(crate) fn lift(c: &mut beam::Components, id: &str) -> Result<Option<Vec<String>>> {
    let Some(t) = c.transforms.get(id).cloned() else {
        return Ok(None);
    };
    if urn_of(&t) != urns::transform::COMBINE_PER_KEY || t.inputs.len() != 1 || t.outputs.len() != 1
    {
        return Ok(None);
    }
    let payload =
        beam::CombinePayload::decode(t.spec.as_ref().map(|s| s.payload.as_slice()).unwrap_or(&[]))
            .map_err(|e| {
                PlanError::Invalid(format!(
                    "transform {id} ({}): bad CombinePayload: {e}",
                    t.unique_name
                ))
            })?;
    let input = t.inputs.values().next().cloned().unwrap_or_default();
    let output = t.outputs.values().next().cloned().unwrap_or_default();
    let Some(in_pc) = c.pcollections.get(&input).cloned() else {
        return Ok(None);
    };
    let ws = c.windowing_strategies.get(&in_pc.windowing_strategy_id);
    let default_trigger = ws
        .and_then(|ws| ws.trigger.as_ref())
        .map(|tr| matches!(tr.trigger, None | Some(beam::trigger::Trigger::Default(_))))
        .unwrap_or(true);
    let end_of_window = ws
        .map(|ws| {
            !matches!(
                beam::output_time::Enum::try_from(ws.output_time),
                Ok(beam::output_time::Enum::EarliestInPane | beam::output_time::Enum::LatestInPane)
            )
        })
        .unwrap_or(true);
    let in_coder = c.coders.get(&in_pc.coder_id).cloned().unwrap_or_default();
    let kv_input = in_coder
        .spec
        .as_ref()
        .map(|s| s.urn == urns::coder::KV)
        .unwrap_or(false)
        && in_coder.component_coder_ids.len() == 2;
    if !default_trigger || !end_of_window || !kv_input || payload.accumulator_coder_id.is_empty() {
        return Ok(None);
    }
    // The environment of the composite, or of the first subtransform that has one.
    let env = std::iter::once(t.environment_id.clone())
        .chain(
            t.subtransforms
                .iter()
                .filter_map(|s| c.transforms.get(s).map(|s| s.environment_id.clone())),
        )
        .find(|e| !e.is_empty())
        .unwrap_or_default();

    let key = in_coder.component_coder_ids[0].clone();
    let acc = payload.accumulator_coder_id.clone();
    let kv_acc = add_coder(
        &mut c.coders,
        format!("weir:kv({key},{acc})"),
        urns::coder::KV,
        vec![key.clone(), acc.clone()],
    );
    let iter_acc = add_coder(
        &mut c.coders,
        format!("weir:iterable({acc})"),
        urns::coder::ITERABLE,
        vec![acc.clone()],
    );
    let kv_iter_acc = add_coder(
        &mut c.coders,
        format!("weir:kv({key},{iter_acc})"),
        urns::coder::KV,
        vec![key, iter_acc],
    );

    let pc = |c: &mut beam::Components, suffix: &str, coder_id: &str| {
        let pid = format!("{id}/weir:lifted-{suffix}");
        let mut p = in_pc.clone();
        p.coder_id = coder_id.to_string();
        p.unique_name = format!("{}/{suffix}", t.unique_name);
        c.pcollections.insert(pid.clone(), p);
        pid
    };
    let precombined = pc(c, "precombined", &kv_acc);
    let grouped = pc(c, "grouped", &kv_iter_acc);
    let merged = pc(c, "merged", &kv_acc);

    let spec_payload = t
        .spec
        .as_ref()
        .map(|s| s.payload.clone())
        .unwrap_or_default();
    let steps = [
        (
            "Precombine",
            urns::transform::COMBINE_PER_KEY_PRECOMBINE,
            &input,
            &precombined,
            true,
        ),
        (
            "Group",
            urns::transform::GROUP_BY_KEY,
            &precombined,
            &grouped,
            false,
        ),
        (
            "Merge",
            urns::transform::COMBINE_PER_KEY_MERGE_ACCUMULATORS,
            &grouped,
            &merged,
            true,
        ),
        (
            "ExtractOutputs",
            urns::transform::COMBINE_PER_KEY_EXTRACT_OUTPUTS,
            &merged,
            &output,
            true,
        ),
    ];
    let mut ids = Vec::new();
    for (name, urn, from, to, sdk) in steps {
        let tid = format!("{id}/weir:lifted-{name}");
        c.transforms.insert(
            tid.clone(),
            beam::PTransform {
                unique_name: format!("{}/{name}", t.unique_name),
                spec: Some(beam::FunctionSpec {
                    urn: urn.into(),
                    payload: if sdk { spec_payload.clone() } else { vec![] },
                }),
                inputs: [("in".to_string(), from.clone())].into_iter().collect(),
                outputs: [("out".to_string(), to.clone())].into_iter().collect(),
                environment_id: if sdk { env.clone() } else { String::new() },
                ..Default::default()
            },
        );
        ids.push(tid);
    }
    Ok(Some(ids))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{plan, PlanOptions, StageKind};

    /// A pipeline: Impulse → ParDo (KV<string, varint>) → CombinePerKey composite (GBK + ParDo inside).
    fn pipeline() -> beam::Pipeline {
        let mut c = beam::Components::default();
        let spec = |urn: &str, payload: Vec<u8>| {
            Some(beam::FunctionSpec {
                urn: urn.into(),
                payload,
            })
        };
        for (id, urn, comps) in [
            ("bytes", urns::coder::BYTES, vec![]),
            ("str", urns::coder::STRING_UTF8, vec![]),
            ("int", urns::coder::VARINT, vec![]),
            ("kv", urns::coder::KV, vec!["str", "int"]),
            ("iter", urns::coder::ITERABLE, vec!["int"]),
            ("kv_iter", urns::coder::KV, vec!["str", "iter"]),
            ("gw", urns::coder::GLOBAL_WINDOW, vec![]),
        ] {
            c.coders.insert(
                id.into(),
                beam::Coder {
                    spec: spec(urn, vec![]),
                    component_coder_ids: comps.into_iter().map(String::from).collect(),
                },
            );
        }
        c.windowing_strategies.insert(
            "ws".into(),
            beam::WindowingStrategy {
                window_fn: spec(urns::window_fn::GLOBAL, vec![]),
                window_coder_id: "gw".into(),
                ..Default::default()
            },
        );
        c.environments.insert(
            "env".into(),
            beam::Environment {
                urn: urns::env::EXTERNAL.into(),
                ..Default::default()
            },
        );
        for (id, coder) in [
            ("imp", "bytes"),
            ("kvs", "kv"),
            ("grouped", "kv_iter"),
            ("sums", "kv"),
        ] {
            c.pcollections.insert(
                id.into(),
                beam::PCollection {
                    coder_id: coder.into(),
                    windowing_strategy_id: "ws".into(),
                    ..Default::default()
                },
            );
        }
        let pardo = beam::ParDoPayload {
            do_fn: spec("beam:dofn:pickled_python_info:v1", vec![]),
            ..Default::default()
        }
        .encode_to_vec();
        let io = |i: &[&str],
                  o: &[&str]|
         -> (
            std::collections::HashMap<String, String>,
            std::collections::HashMap<String, String>,
        ) {
            (
                i.iter().map(|p| (p.to_string(), p.to_string())).collect(),
                o.iter().map(|p| (p.to_string(), p.to_string())).collect(),
            )
        };
        let mut add = |id: &str,
                       urn: &str,
                       payload: Vec<u8>,
                       i: &[&str],
                       o: &[&str],
                       env: &str,
                       subs: &[&str]| {
            let (inputs, outputs) = io(i, o);
            c.transforms.insert(
                id.into(),
                beam::PTransform {
                    unique_name: id.into(),
                    spec: spec(urn, payload),
                    inputs,
                    outputs,
                    environment_id: env.into(),
                    subtransforms: subs.iter().map(|s| s.to_string()).collect(),
                    ..Default::default()
                },
            );
        };
        add(
            "Impulse",
            urns::transform::IMPULSE,
            vec![],
            &[],
            &["imp"],
            "",
            &[],
        );
        add(
            "Pairs",
            urns::transform::PAR_DO,
            pardo.clone(),
            &["imp"],
            &["kvs"],
            "env",
            &[],
        );
        let combine = beam::CombinePayload {
            combine_fn: spec("beam:combinefn:pickled_python:v1", vec![1, 2, 3]),
            accumulator_coder_id: "int".into(),
        }
        .encode_to_vec();
        add(
            "Sum",
            urns::transform::COMBINE_PER_KEY,
            combine,
            &["kvs"],
            &["sums"],
            "",
            &["Sum/Group", "Sum/Combine"],
        );
        add(
            "Sum/Group",
            urns::transform::GROUP_BY_KEY,
            vec![],
            &["kvs"],
            &["grouped"],
            "",
            &[],
        );
        add(
            "Sum/Combine",
            urns::transform::PAR_DO,
            pardo,
            &["grouped"],
            &["sums"],
            "env",
            &[],
        );
        beam::Pipeline {
            components: Some(c),
            root_transform_ids: vec!["Impulse".into(), "Pairs".into(), "Sum".into()],
            ..Default::default()
        }
    }

    #[test]
    fn lifts_combine_per_key_into_precombine_gbk_merge_extract() {
        let plan = batch_plan(&pipeline());
        assert_eq!(
            stage_kinds(&plan),
            vec![
                "impulse",
                "sdk[Pairs+Sum/Precombine]",
                "gbk",
                "sdk[Sum/Merge+Sum/ExtractOutputs]"
            ]
        );
        // The accumulators cross the shuffle as KV<string, varint>, grouped into KV<string, iterable<varint>>.
        let StageKind::GroupByKey { input, output, .. } = plan.graph.stages[2].kind else {
            panic!()
        };
        use weir_model::Coder;
        assert_eq!(
            plan.graph.pcollections[input].value_coder,
            Coder::Kv(Box::new(Coder::StringUtf8), Box::new(Coder::VarInt))
        );
        assert_eq!(
            plan.graph.pcollections[output].value_coder,
            Coder::Kv(
                Box::new(Coder::StringUtf8),
                Box::new(Coder::Iterable(Box::new(Coder::VarInt)))
            )
        );
        // The lifted SDK transforms carry the CombinePayload.
        let d = &plan.descriptors[&plan.graph.stages[1].id];
        let pre = d
            .transforms
            .values()
            .find(|t| t.unique_name == "Sum/Precombine")
            .unwrap();
        let payload =
            beam::CombinePayload::decode(pre.spec.as_ref().unwrap().payload.as_slice()).unwrap();
        assert_eq!(payload.combine_fn.unwrap().payload, vec![1, 2, 3]);
        assert_eq!(pre.environment_id, "env");
    }

    /// `pipeline` planned as a batch job.
    fn batch_plan(pipeline: &beam::Pipeline) -> crate::Plan {
        plan(
            pipeline,
            &PlanOptions {
                fn_api_url: "localhost:1".into(),
                streaming: false,
                drain: false,
            },
        )
        .unwrap()
    }

    /// The names of a plan's stages: impulse, gbk, or sdk[fused transforms].
    fn stage_kinds(plan: &crate::Plan) -> Vec<String> {
        plan.graph
            .stages
            .iter()
            .map(|s| match &s.kind {
                StageKind::Impulse { .. } => "impulse".to_string(),
                StageKind::GroupByKey { .. } => "gbk".to_string(),
                StageKind::Sdk(_) => format!("sdk[{}]", s.name),
                other => format!("{other:?}"),
            })
            .collect()
    }

    #[test]
    fn does_not_lift_under_an_earliest_or_latest_output_time() {
        for output_time in [
            beam::output_time::Enum::EarliestInPane,
            beam::output_time::Enum::LatestInPane,
        ] {
            let mut p = pipeline();
            let c = p.components.as_mut().unwrap();
            c.windowing_strategies.get_mut("ws").unwrap().output_time = output_time as i32;
            assert_eq!(
                stage_kinds(&batch_plan(&p)),
                vec!["impulse", "sdk[Pairs]", "gbk", "sdk[Sum/Combine]"],
                "{output_time:?}"
            );
        }
        let mut p = pipeline();
        let c = p.components.as_mut().unwrap();
        c.windowing_strategies.get_mut("ws").unwrap().output_time =
            beam::output_time::Enum::EndOfWindow as i32;
        assert_eq!(
            stage_kinds(&batch_plan(&p)),
            vec![
                "impulse",
                "sdk[Pairs+Sum/Precombine]",
                "gbk",
                "sdk[Sum/Merge+Sum/ExtractOutputs]"
            ]
        );
    }
}
