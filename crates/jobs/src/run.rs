//! Running one job: plan, start SDK harnesses, run the engine, clean up.

use std::sync::Arc;

use weir_engine::EngineConfig;
use weir_harness::bundle::BundlePolicy;
use weir_harness::environment;
use weir_harness::{JobWorkers, WorkerLog};
use weir_proto::beam;
use weir_proto::beam::job_message::MessageImportance as Importance;
use weir_proto::beam::job_state::Enum as JobState;

use crate::registry::{Job, JobRegistry};

/// Runs `job` to a terminal state; never panics the server.
pub(crate) async fn run(registry: Arc<JobRegistry>, job: Arc<Job>) {
    match execute(&registry, &job).await {
        Ok(()) => {
            job.message(
                Importance::JobMessageBasic,
                format!("job {} finished", job.name),
            );
            if job.drain.load(std::sync::atomic::Ordering::SeqCst) {
                job.set_state(JobState::Drained);
            } else {
                job.set_state(JobState::Done);
            }
        }
        Err((state, message)) => {
            tracing::warn!(job = %job.id, "{message}");
            job.message(
                if state == JobState::Cancelled {
                    Importance::JobMessageBasic
                } else {
                    Importance::JobMessageError
                },
                message,
            );
            job.set_state(state);
        }
    }
    let _ = tokio::fs::remove_dir_all(&job.staging_dir).await;
}

async fn execute(registry: &JobRegistry, job: &Arc<Job>) -> Result<(), (JobState, String)> {
    let fail = |m: String| (JobState::Failed, m);
    let pipeline = job
        .pipeline
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    let plan = weir_plan::plan(
        &pipeline,
        &weir_plan::PlanOptions {
            fn_api_url: registry.fn_api.url.clone(),
            streaming: crate::options::flag(&job.options, "streaming"),
            drain: crate::options::has_experiment(
                &job.options,
                crate::options::TEST_DRAIN_EXPERIMENT,
            ),
        },
    )
    .map_err(|e| fail(e.to_string()))?;
    let prefix = format!("{}/", job.id);
    registry
        .fn_api
        .add_descriptors(plan.descriptors.values().map(|d| {
            let mut d = d.clone();
            d.id = JobWorkers::descriptor_id(&job.id, &d.id);
            d
        }));

    let log_job = job.clone();
    let log: weir_harness::LogSink = Arc::new(move |level, text| {
        let importance = match level {
            WorkerLog::Debug => Importance::JobMessageDebug,
            WorkerLog::Info => Importance::JobMessageBasic,
            WorkerLog::Warning => Importance::JobMessageWarning,
            WorkerLog::Error => Importance::JobMessageError,
        };
        log_job.message(importance, text);
    });
    let sdk_job = job.clone();
    registry
        .fn_api
        .set_sdk_log(&job.id, Arc::new(move |level, text| sdk_job.sdk_log(level, text)));
    let provision = beam::ProvisionInfo {
        pipeline_options: Some(job.options.clone()),
        retrieval_token: job.id.clone(),
        ..Default::default()
    };
    let sizing = crate::options::sdk_harness_plan(&job.validated, &job.options);
    job.message(
        Importance::JobMessageBasic,
        format!(
            "starting {} SDK harness(es) per environment ({} worker(s) of {} SDK harness(es) each) for {} stage(s); each SDK harness runs up to {} bundle(s) at a time",
            sizing.scaling.initial(),
            sizing.scaling.initial() / sizing.per_worker.max(1),
            sizing.per_worker,
            plan.graph.stages.len(),
            sizing.bundles_per_worker,
        ),
    );
    if let Some(t) = job.validated.element_processing_timeout {
        job.message(
            Importance::JobMessageBasic,
            format!(
                "element processing timeout {}: an SDK harness whose bundle makes no progress for that long is restarted and the bundle retried ({})",
                weir_harness::bundle::human_duration(t),
                if job.validated.streaming {
                    "streaming: without a cap".to_string()
                } else {
                    format!("batch: at most {} attempts", weir_harness::bundle::MAX_ATTEMPTS)
                }
            ),
        );
    }
    let started = environment::start(
        &registry.fn_api,
        &job.id,
        &plan.environments,
        sizing.scaling,
        sizing.bundles_per_worker,
        &provision,
        log,
    )
    .await
    .map_err(|e| fail(e.to_string()));
    let started = match started {
        Ok(s) => s,
        Err(e) => {
            registry.fn_api.remove_descriptors(&prefix);
            registry.fn_api.remove_sdk_log(&job.id);
            return Err(e);
        }
    };
    job.set_state(JobState::Running);

    let graph = Arc::new(plan.graph);
    let workers = JobWorkers::new(
        registry.fn_api.clone(),
        job.id.clone(),
        graph.clone(),
        started.clone(),
        tokio::runtime::Handle::current(),
        job.metrics.clone(),
        BundlePolicy {
            streaming: job.validated.streaming,
            element_processing_timeout: job.validated.element_processing_timeout,
        },
    );
    let notice_job = job.clone();
    let config = EngineConfig {
        workers: registry.config.engine_workers,
        // Dataflow's switch, as an option or a dataflow_service_options entry.
        hot_key_logging: job.validated.enable_hot_key_logging
            || job
                .validated
                .dataflow_service_options
                .iter()
                .any(|o| o == "enable_hot_key_logging"),
        notices: weir_engine::Notices(Arc::new(move |text| {
            tracing::warn!(job = %notice_job.id, "{text}");
            notice_job.message(Importance::JobMessageWarning, text);
        })),
        stuck_after: crate::options::experiment_value(
            &job.options,
            crate::options::TEST_STUCK_EXPERIMENT,
        )
        .and_then(|v| v.trim().parse::<u64>().ok())
        .filter(|&n| n > 0)
        .map(std::time::Duration::from_secs)
        .unwrap_or(EngineConfig::default().stuck_after),
        drain: job.drain.clone(),
        ..EngineConfig::default()
    };
    let cancel = job.cancel.clone();
    let result = tokio::task::spawn_blocking(move || {
        weir_engine::run_job(graph, Arc::new(workers), config, cancel)
    })
    .await
    .map_err(|e| {
        fail(format!(
            "the engine thread failed (this is a Weir bug): {e}"
        ))
    });

    started.stop().await;
    registry.fn_api.remove_descriptors(&prefix);
    registry.fn_api.remove_sdk_log(&job.id);
    match result? {
        Ok(()) => Ok(()),
        Err(weir_engine::EngineError::Cancelled) => {
            Err((JobState::Cancelled, "job cancelled".into()))
        }
        Err(e) => Err(fail(format!("job {} failed: {e}", job.name))),
    }
}
