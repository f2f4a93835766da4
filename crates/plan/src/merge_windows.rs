//! Custom merging WindowFns: the SDK stage a GroupByKey asks to merge windows.
//!
//! The runner merges session windows itself, but the windows of any other
//! merging WindowFn (`MergeStatus.NEEDS_MERGE`, e.g. a Python `WindowFn`
//! subclass with its own `merge`) can only be merged by the SDK that defined
//! it. Beam's primitive for that is `beam:transform:merge_windows:v1`
//! (beam_runner_api.proto, `StandardPTransforms.Primitives.MERGE_WINDOWS`):
//! its payload is the WindowFn's `FunctionSpec`, its input
//! `KV<nonce, iterable<window>>`, its output
//! `KV<nonce, KV<iterable<window left unmerged>, iterable<KV<merged window,
//! iterable<window merged into it>>>>>`.
//!
//! For each such GroupByKey the plan builds a small `ProcessBundleDescriptor`
//! — data source → merge_windows → data sink, all in the global window —
//! registered under the GroupByKey's stage id, which the engine runs as
//! bundles whenever a key gets new windows.

use std::collections::HashMap;

use prost::Message;
use weir_proto::{beam, urns};

use crate::coders::{add_coder, windowed_coder_id};
use crate::descriptor::Builder;
use crate::graph::SdkStage;
use crate::{PlanError, PlanOptions, Result};

/// Adds (or finds) a coder with `urn` and `components`, named after them.
fn structural(coders: &mut HashMap<String, beam::Coder>, urn: &str, components: &[&str]) -> String {
    let id = format!("weir:{urn}({})", components.join(","));
    add_coder(
        coders,
        id,
        urn,
        components.iter().map(|c| c.to_string()).collect(),
    )
}

/// The WindowFn spec to put in the merge_windows payload.
///
/// Python pipelines wrap a pickled WindowFn
/// (`beam:window_fn:pickled_python:v1`) in a `google.protobuf.BytesValue`,
/// but Python's SDK harness (2.77, `bundle_processor.create_merge_windows`)
/// unpickles the payload as it comes: it succeeds only when the wrapper's
/// length bytes fall outside the base64 alphabet, which base64 decoding
/// skips (a 120-byte pickle, length byte `x`, fails). Weir hands it the
/// unwrapped pickle, which it always reads. Other specs pass unchanged.
fn sdk_window_fn(spec: &beam::FunctionSpec) -> beam::FunctionSpec {
    let mut spec = spec.clone();
    if spec.urn == urns::window_fn::PICKLED_PYTHON && spec.payload.first() == Some(&0x0a) {
        if let Ok(inner) = Vec::<u8>::decode(spec.payload.as_slice()) {
            if inner.encoded_len() == spec.payload.len() {
                spec.payload = inner;
            }
        }
    }
    spec
}

/// The global windowing strategy of the merge stage's own PCollections.
fn global_strategy(global_window_coder: &str, environment_id: &str) -> beam::WindowingStrategy {
    beam::WindowingStrategy {
        window_fn: Some(beam::FunctionSpec {
            urn: urns::window_fn::GLOBAL.into(),
            payload: vec![],
        }),
        merge_status: beam::merge_status::Enum::NonMerging as i32,
        window_coder_id: global_window_coder.into(),
        trigger: Some(beam::Trigger {
            trigger: Some(beam::trigger::Trigger::Default(Default::default())),
        }),
        accumulation_mode: beam::accumulation_mode::Enum::Discarding as i32,
        output_time: beam::output_time::Enum::EndOfWindow as i32,
        closing_behavior: beam::closing_behavior::Enum::EmitIfNonempty as i32,
        on_time_behavior: beam::on_time_behavior::Enum::FireAlways as i32,
        allowed_lateness: 0,
        environment_id: environment_id.into(),
        assigns_to_one_window: false,
    }
}

/// The merge stage of GroupByKey stage `stage_id` (named `name`), whose
/// input PCollection `input` (index `input_index` in the graph) is windowed
/// by a custom merging WindowFn: the [`SdkStage`] the engine sends merge
/// bundles to and its `ProcessBundleDescriptor` (id `stage_id`).
///
/// # Errors
/// [`PlanError::Invalid`] when the windowing strategy has no WindowFn or
/// names no environment the pipeline defines (the SDK that must merge).
pub(crate) fn stage(
    b: &mut Builder<'_>,
    stage_id: &str,
    name: &str,
    input: &str,
    input_index: usize,
    options: &PlanOptions,
) -> Result<(SdkStage, beam::ProcessBundleDescriptor)> {
    let ws_id = b.pc(input)?.windowing_strategy_id.clone();
    let ws =
        b.c.windowing_strategies
            .get(&ws_id)
            .cloned()
            .unwrap_or_default();
    let window_fn = ws.window_fn.clone().ok_or_else(|| {
        PlanError::Invalid(format!(
            "windowing strategy {ws_id} of PCollection {input} has no WindowFn"
        ))
    })?;
    let environment_id = ws.environment_id.clone();
    if !b.c.environments.contains_key(&environment_id) {
        return Err(PlanError::Invalid(format!(
            "GroupByKey {name}: the merging WindowFn {} of PCollection {input} names no known environment ({environment_id:?}) to merge its windows in",
            window_fn.urn
        )));
    }
    let window = b.window_wire(&ws_id)?;
    let coders = &mut b.coders;
    let bytes = structural(coders, urns::coder::BYTES, &[]);
    let global = structural(coders, urns::coder::GLOBAL_WINDOW, &[]);
    let windows = structural(coders, urns::coder::ITERABLE, &[&window]);
    let in_coder = structural(coders, urns::coder::KV, &[&bytes, &windows]);
    let merge = structural(coders, urns::coder::KV, &[&window, &windows]);
    let merges = structural(coders, urns::coder::ITERABLE, &[&merge]);
    let result = structural(coders, urns::coder::KV, &[&windows, &merges]);
    let out_coder = structural(coders, urns::coder::KV, &[&bytes, &result]);
    let in_wire = windowed_coder_id(coders, &in_coder, &global);
    let out_wire = windowed_coder_id(coders, &out_coder, &global);

    let strategy_id = format!("{stage_id}/global");
    let (unmerged, merged) = (format!("{stage_id}/unmerged"), format!("{stage_id}/merged"));
    let (source_id, merge_id, sink_id) = (
        format!("{stage_id}/source"),
        format!("{stage_id}/merge_windows"),
        format!("{stage_id}/sink"),
    );
    let port = |coder_id: String| {
        beam::RemoteGrpcPort {
            api_service_descriptor: Some(beam::ApiServiceDescriptor {
                url: options.fn_api_url.clone(),
                ..Default::default()
            }),
            coder_id,
        }
        .encode_to_vec()
    };
    let transform = |unique_name: String,
                     urn: &str,
                     payload: Vec<u8>,
                     inputs: &[(&str, &str)],
                     outputs: &[(&str, &str)],
                     env: &str| beam::PTransform {
        unique_name,
        spec: Some(beam::FunctionSpec {
            urn: urn.into(),
            payload,
        }),
        inputs: inputs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        outputs: outputs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        environment_id: env.into(),
        ..Default::default()
    };
    let pcollection = |coder_id: &str| beam::PCollection {
        unique_name: String::new(),
        coder_id: coder_id.into(),
        is_bounded: beam::is_bounded::Enum::Bounded as i32,
        windowing_strategy_id: strategy_id.clone(),
        display_data: vec![],
    };
    let descriptor = beam::ProcessBundleDescriptor {
        id: stage_id.into(),
        transforms: [
            (
                source_id.clone(),
                transform(
                    source_id.clone(),
                    urns::transform::DATA_SOURCE,
                    port(in_wire),
                    &[],
                    &[("out", &unmerged)],
                    "",
                ),
            ),
            (
                merge_id.clone(),
                transform(
                    format!("{name}/MergeWindows"),
                    urns::transform::MERGE_WINDOWS,
                    sdk_window_fn(&window_fn).encode_to_vec(),
                    &[("input", &unmerged)],
                    &[("output", &merged)],
                    &environment_id,
                ),
            ),
            (
                sink_id.clone(),
                transform(
                    sink_id.clone(),
                    urns::transform::DATA_SINK,
                    port(out_wire),
                    &[("in", &merged)],
                    &[],
                    "",
                ),
            ),
        ]
        .into_iter()
        .collect(),
        pcollections: [
            (unmerged.clone(), pcollection(&in_coder)),
            (merged.clone(), pcollection(&out_coder)),
        ]
        .into_iter()
        .collect(),
        windowing_strategies: [(
            strategy_id.clone(),
            global_strategy(&global, &environment_id),
        )]
        .into_iter()
        .collect(),
        state_api_service_descriptor: Some(beam::ApiServiceDescriptor {
            url: options.fn_api_url.clone(),
            ..Default::default()
        }),
        ..Default::default()
    };
    let stage = SdkStage {
        environment_id,
        input: input_index,
        input_transform_id: source_id,
        side_inputs: vec![],
        outputs: vec![],
        output_transform_ids: vec![sink_id],
        residual_transform_ids: vec![],
        stateful: false,
        time_sorted: false,
        timer_families: vec![],
        splittable: false,
        drain_descriptor_id: None,
        window_expiration_family: None,
    };
    Ok((stage, descriptor))
}
