//! Each stage's progress as MonitoringInfos with Weir's own URNs, added to
//! GetJobMetrics (what `weir jobs describe` and `weir jobs watch` show) when
//! the request carries the [`REQUEST_HEADER`] metadata key, as Weir's CLI
//! sends it: Beam's SDKs key a job's metrics by step and name, so Python's
//! `PipelineResult.metrics()` folded every stage's figure of one URN into
//! one. Labels: `STAGE` (the stage id), `STAGE_NAME` (its fused transforms,
//! joined with `+`, cut to [`MAX_NAME_CHARS`]) and `STAGE_KIND`.

use weir_proto::beam;
use weir_proto::urns::monitoring as m;

use crate::Job;

/// The GetJobMetrics request metadata key that asks for the per-stage
/// MonitoringInfos.
pub const REQUEST_HEADER: &str = "weir-stage-metrics";

/// Main-input elements a stage took (`sum_int64`).
pub const ELEMENTS_IN: &str = "weir:metric:stage:elements_in:v1";
/// Elements a stage emitted over all its outputs (`sum_int64`).
pub const ELEMENTS_OUT: &str = "weir:metric:stage:elements_out:v1";
/// Bundles of a stage that completed (`sum_int64`).
pub const BUNDLES: &str = "weir:metric:stage:bundles:v1";
/// Failed bundle attempts of a stage that were retried (`sum_int64`).
pub const RETRIES: &str = "weir:metric:stage:retries:v1";
/// Bundles of a stage now at SDK harnesses (`latest_int64`).
pub const IN_FLIGHT: &str = "weir:metric:stage:bundles_in_flight:v1";
/// A stage's input watermark, ms since the epoch (`latest_int64`): `i64::MAX`
/// once its input is done; absent before the stage first reported.
pub const INPUT_WATERMARK: &str = "weir:metric:stage:input_watermark_ms:v1";
/// A stage's output watermark, ms since the epoch (`latest_int64`), `i64::MAX` once done.
pub const OUTPUT_WATERMARK: &str = "weir:metric:stage:output_watermark_ms:v1";

/// Longest `STAGE_NAME` label, in characters: the response repeats it on
/// every info of the stage, and gRPC clients refuse responses over 4 MiB.
pub const MAX_NAME_CHARS: usize = 200;

/// The watermark value of a MonitoringInfo: `i64::MAX` for done.
fn millis(w: Option<weir_model::Timestamp>) -> i64 {
    w.map_or(i64::MAX, |t| t.millis())
}

fn info(urn: &str, ty: &str, labels: &[(&str, &str)], at_ms: i64, value: i64) -> beam::MonitoringInfo {
    let mut payload = Vec::new();
    if ty == m::TYPE_LATEST_INT64 {
        weir_model::varint::encode_varint(at_ms, &mut payload);
    }
    weir_model::varint::encode_varint(value, &mut payload);
    beam::MonitoringInfo {
        urn: urn.into(),
        r#type: ty.into(),
        payload,
        labels: labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
        ..Default::default()
    }
}

/// The kind of a stage (`Impulse`, `GroupByKey`, `SDK`, ...).
pub fn kind_name(kind: &weir_graph::StageKind) -> &'static str {
    use weir_graph::StageKind as K;
    match kind {
        K::Impulse { .. } => "Impulse",
        K::TestStream { .. } => "TestStream",
        K::GroupByKey { .. } => "GroupByKey",
        K::Flatten { .. } => "Flatten",
        K::Reshuffle { .. } => "Reshuffle",
        K::Sdk(_) => "SDK",
    }
}

/// The job's stages as MonitoringInfos (see the module doc); none before it runs.
pub fn monitoring_infos(job: &Job) -> Vec<beam::MonitoringInfo> {
    let Some(plan) = job.plan.as_ref() else { return vec![] };
    let at = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64);
    let retries = job.metrics.retries();
    let mut out = vec![];
    for (i, p) in job.progress.stages().iter().enumerate() {
        let Some(stage) = plan.graph.stages.get(i) else { continue };
        let name: String = stage.name.chars().take(MAX_NAME_CHARS).collect();
        let labels = [("STAGE", stage.id.as_str()), ("STAGE_NAME", name.as_str()), ("STAGE_KIND", kind_name(&stage.kind))];
        let sum = |urn, v: u64| info(urn, m::TYPE_SUM_INT64, &labels, at, v as i64);
        out.push(sum(ELEMENTS_IN, p.counts.elements_in));
        out.push(sum(ELEMENTS_OUT, p.counts.elements_out));
        out.push(sum(BUNDLES, p.counts.bundles));
        out.push(sum(RETRIES, retries.get(&i).copied().unwrap_or(0)));
        out.push(info(IN_FLIGHT, m::TYPE_LATEST_INT64, &labels, at, p.status.in_flight as i64));
        if p.reported {
            out.push(info(INPUT_WATERMARK, m::TYPE_LATEST_INT64, &labels, at, millis(p.status.watermark)));
        }
        if p.reported || p.output_watermark.is_none() {
            out.push(info(OUTPUT_WATERMARK, m::TYPE_LATEST_INT64, &labels, at, millis(p.output_watermark)));
        }
    }
    out
}
