//! `/metrics`: the server's jobs in Prometheus' text format, built with the
//! `prometheus` crate from a fresh registry on every scrape (a snapshot of
//! [`weir_jobs::JobRegistry`], as a custom collector would give).
//!
//! Per job (label `job_id`): state, the SDKs' element counts per PCollection
//! and user counters (the same sums GetJobMetrics returns), runner and SDK
//! CPU seconds and resident memory. Per stage (labels `job_id`, `stage`:
//! the stage id; `weir_stage_info` maps it to the stage's kind and name):
//! elements in and out, bundles, retried attempts, bundles in flight,
//! elements pending, input and output watermarks and the input watermark's
//! lag behind the wall clock (seconds; absent while unknown, at Beam's
//! minimum or maximum, or done).

use prometheus::{Encoder, GaugeVec, IntCounterVec, IntGaugeVec, Opts, Registry, TextEncoder};
use weir_jobs::JobRegistry;
use weir_proto::urns::monitoring as m;

use weir_jobs::stage_metrics::MAX_NAME_CHARS;

fn counter(r: &Registry, name: &str, help: &str, labels: &[&str]) -> prometheus::Result<IntCounterVec> {
    let c = IntCounterVec::new(Opts::new(name, help), labels)?;
    r.register(Box::new(c.clone()))?;
    Ok(c)
}

fn gauge(r: &Registry, name: &str, help: &str, labels: &[&str]) -> prometheus::Result<IntGaugeVec> {
    let g = IntGaugeVec::new(Opts::new(name, help), labels)?;
    r.register(Box::new(g.clone()))?;
    Ok(g)
}

fn float_gauge(r: &Registry, name: &str, help: &str, labels: &[&str]) -> prometheus::Result<GaugeVec> {
    let g = GaugeVec::new(Opts::new(name, help), labels)?;
    r.register(Box::new(g.clone()))?;
    Ok(g)
}

/// The metrics of every job of `jobs`, in Prometheus' text format.
///
/// # Errors
/// The `prometheus` crate's error when a metric cannot be registered or encoded.
pub fn render(jobs: &JobRegistry) -> prometheus::Result<String> {
    let r = Registry::new();
    let job_state = gauge(&r, "weir_job_state", "1 for the job's current Beam JobState (label state)", &["job_id", "job_name", "state"])?;
    let pc_elements = counter(&r, "weir_pcollection_elements_total", "Elements the SDK harnesses counted per PCollection (beam:metric:element_count:v1)", &["job_id", "pcollection"])?;
    let user = counter(&r, "weir_user_counter_total", "User counters (beam:metric:user:sum_int64:v1)", &["job_id", "step", "namespace", "name"])?;
    let runner_cpu = float_gauge(&r, "weir_job_runner_cpu_seconds", "CPU seconds of the Weir server since the job started", &["job_id"])?;
    let runner_mem = gauge(&r, "weir_job_runner_memory_bytes", "Resident memory of the Weir server", &["job_id"])?;
    let sdk_cpu = float_gauge(&r, "weir_job_sdk_cpu_seconds", "CPU seconds of the job's SDK harness processes (0 in LOOPBACK)", &["job_id"])?;
    let sdk_mem = gauge(&r, "weir_job_sdk_memory_bytes", "Resident memory of the job's live SDK harness processes", &["job_id"])?;
    let sdk_procs = gauge(&r, "weir_job_sdk_processes", "SDK harness processes of the job seen so far", &["job_id"])?;
    let stage_info = gauge(&r, "weir_stage_info", "1 per stage: its kind and name (the transforms fused in it, joined with +)", &["job_id", "stage", "kind", "name"])?;
    let s = ["job_id", "stage"];
    let st_in = counter(&r, "weir_stage_elements_in_total", "Main-input elements a stage took", &s)?;
    let st_out = counter(&r, "weir_stage_elements_out_total", "Elements a stage emitted", &s)?;
    let st_bundles = counter(&r, "weir_stage_bundles_total", "Bundles of a stage that completed", &s)?;
    let st_retries = counter(&r, "weir_stage_bundle_retries_total", "Failed bundle attempts of a stage that were retried", &s)?;
    let st_flight = gauge(&r, "weir_stage_bundles_in_flight", "Bundles of a stage at SDK harnesses", &s)?;
    let st_pending = gauge(&r, "weir_stage_elements_pending", "Elements of a stage waiting for a bundle", &s)?;
    let st_in_wm = float_gauge(&r, "weir_stage_input_watermark_seconds", "A stage's input watermark, seconds since the Unix epoch", &s)?;
    let st_out_wm = float_gauge(&r, "weir_stage_output_watermark_seconds", "A stage's output watermark, seconds since the Unix epoch", &s)?;
    let st_lag = float_gauge(&r, "weir_stage_watermark_lag_seconds", "How far a stage's input watermark is behind the wall clock", &s)?;

    let now = std::time::SystemTime::now()
        .duration_since(std::time::SystemTime::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64());
    let finite = |w: Option<weir_model::Timestamp>| {
        w.filter(|t| *t > weir_model::Timestamp::MIN && *t < weir_model::Timestamp::END_OF_GLOBAL_WINDOW)
            .map(|t| t.millis() as f64 / 1000.0)
    };
    for job in jobs.all() {
        let id = job.id.as_str();
        job_state
            .with_label_values(&[id, job.name.as_str(), crate::views::state_name(job.state())])
            .set(1);
        let infos = job.metrics_by_step();
        for info in infos {
            let Some(v) = crate::views::sum_value(&info) else { continue };
            let label = |k: &str| info.labels.get(k).map(String::as_str).unwrap_or("");
            if info.urn == m::ELEMENT_COUNT {
                pc_elements.with_label_values(&[id, label("PCOLLECTION")]).inc_by(v.max(0) as u64);
            } else if info.urn == m::USER_SUM_INT64 {
                user.with_label_values(&[id, label("PTRANSFORM"), label("NAMESPACE"), label("NAME")])
                    .inc_by(v.max(0) as u64);
            }
        }
        let u = job.resources.usage();
        runner_cpu.with_label_values(&[id]).set(u.runner_cpu_ms as f64 / 1000.0);
        runner_mem.with_label_values(&[id]).set(u.runner_memory as i64);
        sdk_cpu.with_label_values(&[id]).set(u.sdk_cpu_ms() as f64 / 1000.0);
        sdk_mem.with_label_values(&[id]).set(u.sdk_memory as i64);
        sdk_procs.with_label_values(&[id]).set(u.sdk_cpu_by_pid.len() as i64);
        let Some(plan) = job.plan.as_ref() else { continue };
        let retries = job.metrics.retries();
        for (i, p) in job.progress.stages().iter().enumerate() {
            let Some(stage) = plan.graph.stages.get(i) else { continue };
            let l = [id, stage.id.as_str()];
            let name: String = stage.name.chars().take(MAX_NAME_CHARS).collect();
            stage_info
                .with_label_values(&[id, stage.id.as_str(), crate::views::kind_name(&stage.kind), name.as_str()])
                .set(1);
            st_in.with_label_values(&l).inc_by(p.counts.elements_in);
            st_out.with_label_values(&l).inc_by(p.counts.elements_out);
            st_bundles.with_label_values(&l).inc_by(p.counts.bundles);
            st_retries.with_label_values(&l).inc_by(retries.get(&i).copied().unwrap_or(0));
            st_flight.with_label_values(&l).set(p.status.in_flight as i64);
            st_pending.with_label_values(&l).set(p.status.pending as i64);
            if p.reported {
                if let Some(w) = finite(p.status.watermark) {
                    st_in_wm.with_label_values(&l).set(w);
                    st_lag.with_label_values(&l).set((now - w).max(0.0));
                }
                if let Some(w) = finite(p.output_watermark) {
                    st_out_wm.with_label_values(&l).set(w);
                }
            }
        }
    }
    let mut out = vec![];
    TextEncoder::new().encode(&r.gather(), &mut out)?;
    String::from_utf8(out).map_err(|e| prometheus::Error::Msg(e.to_string()))
}
