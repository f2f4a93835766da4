//! JSON views of the job registry for the web UI's pages.
//!
//! Times are milliseconds since the Unix epoch. A watermark is a number of
//! milliseconds, or one of the strings `"min"` (Beam's minimum timestamp:
//! nothing seen yet), `"max"` (past the end of the global window), `"done"`
//! (the input or output is finished) or `"unknown"` (the stage has not
//! reported yet).

use std::collections::BTreeMap;
use std::time::SystemTime;

use serde_json::{json, Value};
use weir_graph::{StageGraph, StageKind};
use weir_jobs::registry::{is_terminal, View};
use weir_jobs::{Job, JobRegistry};
use weir_proto::beam;
use weir_proto::beam::job_messages_response::Response as Event;
use weir_proto::beam::job_state::Enum as JobState;
use weir_proto::urns::monitoring as m;

/// Beam's name of a job state (`RUNNING`, `DONE`, ...).
pub fn state_name(s: JobState) -> &'static str {
    s.as_str_name()
}

fn millis(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

fn now_ms() -> u64 {
    millis(SystemTime::now())
}

/// A watermark as the module doc describes; `None` is done.
pub fn watermark(w: Option<weir_model::Timestamp>) -> Value {
    match w {
        None => json!("done"),
        Some(t) if t <= weir_model::Timestamp::MIN => json!("min"),
        Some(t) if t >= weir_model::Timestamp::END_OF_GLOBAL_WINDOW => json!("max"),
        Some(t) => json!(t.millis()),
    }
}

/// The SDKs of a job's environments (`apache/beam_python3.11_sdk:2.77.0`,
/// ...), read off their `beam:version:sdk_base:` capabilities.
pub fn sdks(job: &Job) -> Vec<String> {
    let pipeline = job.pipeline.lock().unwrap_or_else(|p| p.into_inner());
    let mut out: Vec<String> = pipeline
        .components
        .iter()
        .flat_map(|c| c.environments.values())
        .flat_map(|e| e.capabilities.iter())
        .filter_map(|c| c.strip_prefix("beam:version:sdk_base:"))
        .map(str::to_string)
        .collect();
    out.sort();
    out.dedup();
    out
}

fn summary(job: &Job) -> Value {
    let (started, finished) = job.times();
    let end = finished.map(millis);
    let start = started.map(millis);
    let duration = start.map(|s| end.unwrap_or_else(now_ms).saturating_sub(s));
    json!({
        "id": job.id,
        "name": job.name,
        "state": state_name(job.state()),
        "terminal": is_terminal(job.state()),
        "created_ms": millis(job.created),
        "start_ms": start,
        "end_ms": end,
        "duration_ms": duration,
        "labels": job.validated.labels,
        "sdks": sdks(job),
        "streaming": job.validated.streaming,
    })
}

/// Every job of the server, newest first: `{"jobs": [summary, ...]}`.
pub fn jobs(registry: &JobRegistry) -> Value {
    let mut all = registry.all();
    all.sort_by_key(|j| std::cmp::Reverse(j.created));
    json!({ "jobs": all.iter().map(|j| summary(j)).collect::<Vec<_>>(), "now_ms": now_ms() })
}

/// The kind of a stage as the UI shows it.
pub use weir_jobs::stage_metrics::kind_name;

/// Element counts per PCollection id, from the SDKs' `beam:metric:element_count:v1`.
fn element_counts(infos: &[beam::MonitoringInfo]) -> BTreeMap<String, i64> {
    let mut out = BTreeMap::new();
    for i in infos.iter().filter(|i| i.urn == m::ELEMENT_COUNT) {
        if let (Some(pc), Some(v)) = (i.labels.get("PCOLLECTION"), sum_value(i)) {
            out.insert(pc.clone(), v);
        }
    }
    out
}

/// The value of a `sum_int64` MonitoringInfo.
pub fn sum_value(info: &beam::MonitoringInfo) -> Option<i64> {
    (info.r#type == m::TYPE_SUM_INT64)
        .then(|| weir_model::varint::decode_varint(&info.payload).ok().map(|(v, _)| v))
        .flatten()
}

fn graph_view(graph: &StageGraph, counts: &BTreeMap<String, i64>, progress: &[weir_engine::StageProgress]) -> Value {
    let mut produced: BTreeMap<usize, u64> = BTreeMap::new();
    for (i, s) in graph.stages.iter().enumerate() {
        // One output: its count is the stage's own (the engine's) count.
        if let ([pc], Some(p)) = (s.outputs().as_slice(), progress.get(i)) {
            produced.insert(*pc, p.counts.elements_out);
        }
    }
    let stages: Vec<Value> = graph
        .stages
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let side: Vec<usize> = match &s.kind {
                StageKind::Sdk(sdk) => sdk.side_inputs.iter().map(|x| x.pcollection).collect(),
                _ => vec![],
            };
            json!({
                "index": i,
                "id": s.id,
                "name": s.name,
                "kind": kind_name(&s.kind),
                "transforms": s.name.split('+').collect::<Vec<_>>(),
                "inputs": s.main_inputs(),
                "side_inputs": side,
                "outputs": s.outputs(),
            })
        })
        .collect();
    let pcollections: Vec<Value> = graph
        .pcollections
        .iter()
        .enumerate()
        .map(|(i, pc)| {
            let elements = counts
                .get(&pc.id)
                .map(|&n| n.max(0) as u64)
                .or_else(|| produced.get(&i).copied());
            json!({ "index": i, "id": pc.id, "elements": elements })
        })
        .collect();
    json!({ "stages": stages, "pcollections": pcollections })
}

/// The first stage (pipeline order) that still has work or an unfinished
/// input: where a slow or stuck job waits, as its stuck-job notice says.
/// A Flatten or Reshuffle of `graph` holds nothing, so it is never where a
/// job waits.
pub fn waits_at(progress: &[weir_engine::StageProgress], graph: Option<&weir_graph::StageGraph>) -> Option<usize> {
    progress.iter().enumerate().position(|(i, p)| {
        let passes_through = graph.and_then(|g| g.stages.get(i)).is_some_and(|st| st.kind.passes_through());
        p.reported && !passes_through && p.status.unfinished()
    })
}

fn progress_view(job: &Job, progress: &[weir_engine::StageProgress]) -> Vec<Value> {
    let retries = job.metrics.retries();
    let now = now_ms() as i64;
    progress
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let s = &p.status;
            let input = if p.reported { watermark(s.watermark) } else { json!("unknown") };
            let output = if p.reported || p.output_watermark.is_none() {
                watermark(p.output_watermark)
            } else {
                json!("unknown")
            };
            let lag = input.as_i64().map(|w| (now - w).max(0));
            json!({
                "index": i,
                "reported": p.reported,
                "input_watermark": input,
                "output_watermark": output,
                "watermark_lag_ms": lag,
                "elements_in": p.counts.elements_in,
                "elements_out": p.counts.elements_out,
                "bundles": p.counts.bundles,
                "retries": retries.get(&i).copied().unwrap_or(0),
                "in_flight": s.in_flight,
                "pending": s.pending,
                "delayed": s.delayed,
                "timers": s.timers,
                "buffered_keys": s.windows,
                "held_back": s.held_back,
                "waiting_for_side_inputs": s.waiting_for_side_inputs,
            })
        })
        .collect()
}

/// User metrics (counters, distributions, gauges) from the SDKs' MonitoringInfos.
fn user_metrics(infos: &[beam::MonitoringInfo]) -> Vec<Value> {
    let mut out: Vec<Value> = infos
        .iter()
        .filter(|i| i.urn.starts_with("beam:metric:user:"))
        .map(|i| {
            let label = |k: &str| i.labels.get(k).cloned().unwrap_or_default();
            let mut pos = 0;
            let mut ints = vec![];
            while let Ok((v, used)) = weir_model::varint::decode_varint(&i.payload[pos.min(i.payload.len())..]) {
                ints.push(v);
                pos += used;
                if pos >= i.payload.len() || ints.len() == 4 {
                    break;
                }
            }
            let value = match i.r#type.as_str() {
                m::TYPE_SUM_INT64 => json!(ints.first()),
                m::TYPE_DISTRIBUTION_INT64 if ints.len() == 4 => {
                    json!({ "count": ints[0], "sum": ints[1], "min": ints[2], "max": ints[3] })
                }
                m::TYPE_LATEST_INT64 if ints.len() >= 2 => json!(ints[1]),
                _ => json!(format!("{} bytes", i.payload.len())),
            };
            json!({
                "namespace": label("NAMESPACE"),
                "name": label("NAME"),
                "step": label("PTRANSFORM"),
                "kind": i.urn.trim_start_matches("beam:metric:user:").trim_end_matches(":v1"),
                "value": value,
            })
        })
        .collect();
    out.sort_by_key(|v| (v["step"].to_string(), v["namespace"].to_string(), v["name"].to_string()));
    out
}

fn option_values(options: &prost_types::Struct) -> Value {
    fn value(v: &prost_types::Value) -> Value {
        use prost_types::value::Kind;
        match &v.kind {
            Some(Kind::NullValue(_)) | None => Value::Null,
            Some(Kind::NumberValue(n)) => json!(n),
            Some(Kind::StringValue(s)) => json!(s),
            Some(Kind::BoolValue(b)) => json!(b),
            Some(Kind::StructValue(s)) => option_values(s),
            Some(Kind::ListValue(l)) => Value::Array(l.values.iter().map(value).collect()),
        }
    }
    Value::Object(options.fields.iter().map(|(k, v)| (k.clone(), value(v))).collect())
}

/// One job in full: its summary, options, stage graph with live counts and
/// watermarks per stage, where it waits, user metrics, and CPU and memory
/// samples over time.
pub fn job(job: &Job) -> Value {
    let infos = job.metrics_by_step();
    let progress = job.progress.stages();
    let graph = job
        .plan
        .as_ref()
        .map(|p| graph_view(&p.graph, &element_counts(&infos), &progress))
        .unwrap_or_else(|| json!({ "stages": [], "pcollections": [] }));
    let usage = job.resources.usage();
    let history: Vec<Value> = job
        .resources
        .history()
        .iter()
        .map(|s| json!([s.at_ms, s.runner_cpu_ms, s.runner_memory, s.sdk_cpu_ms, s.sdk_memory]))
        .collect();
    let running = job.state() == JobState::Running;
    let mut v = summary(job);
    v["options"] = option_values(&job.options);
    v["graph"] = graph;
    v["progress"] = Value::Array(progress_view(job, &progress));
    v["waits_at"] = json!(running.then(|| waits_at(&progress, job.plan.as_ref().map(|p| &p.graph))).flatten());
    v["user_metrics"] = Value::Array(user_metrics(&infos));
    v["resources"] = json!({
        "columns": ["at_ms", "runner_cpu_ms", "runner_memory_bytes", "sdk_cpu_ms", "sdk_memory_bytes"],
        "history": history,
        "runner_cpu_ms": usage.runner_cpu_ms,
        "runner_peak_memory_bytes": usage.runner_peak_memory,
        "sdk_cpu_ms": usage.sdk_cpu_ms(),
        "sdk_peak_memory_bytes": usage.sdk_peak_memory,
        "sdk_processes": usage.sdk_cpu_by_pid.len(),
    });
    v["now_ms"] = json!(now_ms());
    v
}

/// The sequence number of a message id `<job id>-<n>`.
fn sequence(message_id: &str) -> Option<u64> {
    message_id.rsplit('-').next()?.parse().ok()
}

/// The job's log entries (runner messages, SDK log entries, state changes)
/// with a sequence number greater than `after` (all when `None`):
/// `{"entries": [{"seq", "time", "importance", "text"}], "last": n}`.
pub fn logs(job: &Job, after: Option<u64>) -> Value {
    let (history, _) = job.subscribe(View::Logs);
    let mut last = after.unwrap_or(0);
    let mut entries = vec![];
    for e in history {
        match e.response {
            Some(Event::MessageResponse(msg)) => {
                let Some(seq) = sequence(&msg.message_id) else { continue };
                if after.is_some_and(|a| seq <= a) {
                    continue;
                }
                last = last.max(seq);
                let importance = beam::job_message::MessageImportance::try_from(msg.importance)
                    .map(|i| i.as_str_name().trim_start_matches("JOB_MESSAGE_").to_string())
                    .unwrap_or_else(|_| "UNKNOWN".into());
                entries.push(json!({
                    "seq": seq,
                    "time": msg.time,
                    "importance": importance,
                    "text": msg.message_text,
                }));
            }
            Some(Event::StateResponse(_)) | None => {}
        }
    }
    json!({ "entries": entries, "last": last, "dropped": job.dropped_messages() })
}

#[cfg(test)]
mod tests {
    use super::*;
    use weir_engine::{StageProgress, StageStatus};
    use weir_model::Timestamp;

    #[test]
    fn watermarks_read_as_numbers_or_named_ends() {
        assert_eq!(watermark(None), json!("done"));
        assert_eq!(watermark(Some(Timestamp::MIN)), json!("min"));
        assert_eq!(watermark(Some(Timestamp::END_OF_GLOBAL_WINDOW)), json!("max"));
        assert_eq!(watermark(Some(Timestamp(1_700_000_000_123))), json!(1_700_000_000_123i64));
    }

    #[test]
    fn a_job_waits_at_its_first_stage_with_an_unfinished_input() {
        let done = StageProgress { reported: true, ..Default::default() };
        let open = StageProgress {
            reported: true,
            status: StageStatus { watermark: Some(Timestamp(5)), ..Default::default() },
            ..Default::default()
        };
        let silent = StageProgress::default();
        assert_eq!(waits_at(&[done.clone(), silent.clone(), open.clone(), open.clone()], None), Some(2));
        assert_eq!(waits_at(&[done.clone(), silent], None), None);
        let busy = StageProgress {
            reported: true,
            status: StageStatus { in_flight: 1, ..Default::default() },
            ..Default::default()
        };
        assert_eq!(waits_at(&[done, busy], None), Some(1));
    }

    #[test]
    fn message_ids_give_their_sequence_number() {
        assert_eq!(sequence("job-0a1b-17"), Some(17));
        assert_eq!(sequence("nonsense"), None);
    }
}
