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
    let (result, teardown) = match registry.coordinator() {
        Some(c) => (crate::cluster::coordinator::run_job(c, &job).await, None),
        None => {
            let (result, teardown) = execute(&registry, &job, None).await;
            (result, Some(teardown))
        }
    };
    let failed = result.is_err();
    let teardown = teardown.map(|t| t.cancelled(&result));
    Teardown::around(&job, teardown, failed, || match result {
        Ok(()) => {
            job.message(
                Importance::JobMessageBasic,
                format!("job '{}' finished", job.name),
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
    })
    .await;
}

/// Runs this worker's part of one attempt of a cluster job (`weir
/// worker`): returns the state it ended in (DONE, DRAINED, FAILED,
/// CANCELLED) and, unless DONE or DRAINED, why.
pub(crate) async fn run_attempt(
    registry: Arc<JobRegistry>,
    job: Arc<Job>,
    peers: weir_engine::ClusterPeers,
) -> (JobState, String) {
    job.set_state(JobState::Starting);
    let (result, teardown) = execute(&registry, &job, Some(peers)).await;
    let failed = result.is_err();
    let teardown = teardown.cancelled(&result);
    let ended = Teardown::around(&job, Some(teardown), failed, || match result {
        Ok(()) if job.drain.load(std::sync::atomic::Ordering::SeqCst) => {
            job.set_state(JobState::Drained);
            (JobState::Drained, String::new())
        }
        Ok(()) => {
            job.set_state(JobState::Done);
            (JobState::Done, String::new())
        }
        Err((state, message)) => {
            job.message(Importance::JobMessageError, message.clone());
            job.set_state(state);
            (state, message)
        }
    })
    .await;
    ended
}

/// What is left of a job once its outcome is known: its SDK harnesses to
/// stop and its Fn API registrations (process bundle descriptors, SDK log
/// sink) to drop. A job that succeeded is reported DONE (or DRAINED) first,
/// so the client sees it as soon as its work is done rather than after its
/// SDK harnesses exit (about 10 ms for a Python process); a cluster worker
/// still reports its attempt after its teardown. A job whose SDK harnesses
/// come from a worker pool (LOOPBACK) is torn down first: those harnesses
/// may be threads of the client, and a client that exits on DONE while they
/// still shut down (and log) dies in Python's interpreter shutdown ("could
/// not acquire lock for <stderr> at interpreter shutdown"). A job that
/// failed or was cancelled is torn down first too, so
/// bundles already sent get their grace ([`environment::STOP_GRACE`])
/// before the client sees FAILED (the SDK tears down a failed bundle's
/// DoFns as it fails it, which Beam's lifecycle tests check).
struct Teardown {
    fn_api: Arc<weir_harness::FnApi>,
    job_id: String,
    harnesses: Option<Arc<environment::SdkHarnesses>>,
    /// The job was cancelled: its harnesses stop without waiting for the
    /// bundles they run, so the client sees CANCELLED at once.
    cancelled: bool,
}

impl Teardown {
    /// This teardown, told whether the job's `result` is a cancellation.
    fn cancelled<T>(mut self, result: &Result<T, (JobState, String)>) -> Self {
        self.cancelled = matches!(result, Err((JobState::Cancelled, _)));
        self
    }

    /// Reports a job's outcome (`report`, which sets its state) with
    /// `teardown` on the side of it this type's doc gives: before it when
    /// the job `failed` (or was cancelled) or has a worker pool, after it
    /// otherwise; then deletes the job's staged artifacts.
    async fn around<T>(
        job: &Job,
        teardown: Option<Self>,
        failed: bool,
        report: impl FnOnce() -> T,
    ) -> T {
        let mut teardown = teardown;
        let pool = |t: &Self| t.harnesses.as_ref().is_some_and(|h| h.has_worker_pool());
        if failed || teardown.as_ref().is_some_and(pool) {
            if let Some(teardown) = teardown.take() {
                teardown.run().await;
            }
        }
        let reported = report();
        if let Some(teardown) = teardown {
            teardown.run().await;
        }
        let _ = tokio::fs::remove_dir_all(&job.staging_dir).await;
        // Harnesses started at Prepare that a failed Run never took.
        job.discard_prestarted();
        job.pools.clear();
        reported
    }

    async fn run(self) {
        if let Some(harnesses) = self.harnesses {
            if self.cancelled {
                harnesses.stop_within(std::time::Duration::ZERO).await;
            } else {
                harnesses.stop().await;
            }
        }
        self.fn_api.remove_descriptors(&format!("{}/", self.job_id));
        self.fn_api.remove_sdk_log(&self.job_id);
    }
}

/// Starts, at Prepare, the SDK harnesses of a job whose every environment
/// is its client's in-process worker pool (Python's LOOPBACK, whose pool
/// serves before the client calls Prepare), so that they connect while the
/// client stages artifacts and calls Run; Run takes them. Such a harness
/// runs in the client and fetches no artifacts, so staging changes nothing
/// it is given. Not in a cluster, whose workers start their own.
pub(crate) fn prestart(registry: &Arc<JobRegistry>, job: &Arc<Job>) {
    let Some(plan) = &job.plan else {
        return;
    };
    let harness_plan = harness_plan(job, plan, false);
    let sizing = &harness_plan.sizing;
    let in_client = |env: &beam::Environment| environment::in_client_pool(env, sizing);
    if plan.environments.is_empty() || !plan.environments.values().all(in_client) {
        return;
    }
    let (registry, job2, environments) = (registry.clone(), job.clone(), plan.environments.clone());
    job.set_prestarted(tokio::spawn(async move {
        start_harnesses(&registry, &job2, &environments, harness_plan).await
    }));
}

/// `job`'s SDK harness plan ([`crate::options::sdk_harness_plan`], or one
/// worker's of a cluster job), sized for streaming when the job streams:
/// `--streaming`, a TestStream ([`weir_plan::StageGraph::streaming`]) or
/// an unbounded PCollection.
fn harness_plan(
    job: &Job,
    plan: &weir_plan::Plan,
    on_worker: bool,
) -> crate::options::SdkHarnessPlan {
    let mut harness_plan = if on_worker {
        crate::options::sdk_harness_plan_on_worker(&job.validated, &job.options)
    } else {
        crate::options::sdk_harness_plan(&job.validated, &job.options)
    };
    harness_plan.sizing.streaming |= plan.graph.streaming || job.has_unbounded_pcollection();
    harness_plan
}

/// [`environment::start`] for `job`: its SDK harnesses' messages go to the
/// job's messages, and each is provisioned with the job's options.
async fn start_harnesses(
    registry: &JobRegistry,
    job: &Arc<Job>,
    environments: &std::collections::HashMap<String, beam::Environment>,
    harness_plan: crate::options::SdkHarnessPlan,
) -> weir_harness::Result<Arc<environment::SdkHarnesses>> {
    // Weak: the harnesses (and so this sink) may be kept in the job itself.
    let log_job = Arc::downgrade(job);
    let log: weir_harness::LogSink = Arc::new(move |level, text| {
        let importance = match level {
            WorkerLog::Debug => Importance::JobMessageDebug,
            WorkerLog::Info => Importance::JobMessageBasic,
            WorkerLog::Warning => Importance::JobMessageWarning,
            WorkerLog::Error => Importance::JobMessageError,
        };
        if let Some(job) = log_job.upgrade() {
            job.message(importance, text);
        }
    });
    let provision = beam::ProvisionInfo {
        pipeline_options: Some(job.options.clone()),
        retrieval_token: job.id.clone(),
        ..Default::default()
    };
    environment::start(
        &registry.fn_api,
        &job.id,
        environments,
        harness_plan.scaling,
        harness_plan.sizing,
        &provision,
        log,
        job.cancel.clone(),
        job.pools.clone(),
    )
    .await
}

/// Runs `job` in this process, or as process `peers.process` of a cluster
/// attempt.
///
/// Returns the outcome and what is left to tear down
/// ([`Teardown::run`], after the caller sets the job's state).
async fn execute(
    registry: &JobRegistry,
    job: &Arc<Job>,
    peers: Option<weir_engine::ClusterPeers>,
) -> (Result<(), (JobState, String)>, Teardown) {
    let mut teardown = Teardown {
        fn_api: registry.fn_api.clone(),
        job_id: job.id.clone(),
        harnesses: None,
        cancelled: false,
    };
    let result = execute_with(registry, job, peers, &mut teardown).await;
    (result, teardown)
}

/// [`execute`]'s work; the SDK harnesses it starts go into `teardown`.
async fn execute_with(
    registry: &JobRegistry,
    job: &Arc<Job>,
    peers: Option<weir_engine::ClusterPeers>,
    teardown: &mut Teardown,
) -> Result<(), (JobState, String)> {
    let fail = |m: String| (JobState::Failed, m);
    let plan = job.plan_to_run().map_err(fail)?;
    registry
        .fn_api
        .add_descriptors(plan.descriptors.values().map(|d| {
            let mut d = d.clone();
            d.id = JobWorkers::descriptor_id(&job.id, &d.id);
            d
        }));

    let sdk_job = job.clone();
    registry.fn_api.set_sdk_log(
        &job.id,
        Arc::new(move |level, text| sdk_job.sdk_log(level, text)),
    );
    // In a cluster, num_workers counts worker processes, each with its own
    // SDK harnesses: size them as for one worker. (Workers that share a
    // machine do not share its cores out: an attempt's work is seldom even
    // across workers, and a worker given most of a read then runs it on
    // one harness; wordcount on 3 local workers took 1.8x as long.)
    let harness_plan = harness_plan(job, &plan, peers.is_some());
    job.message(
        Importance::JobMessageBasic,
        format!(
            "starting {} for {} stage(s); {}",
            harness_count_text(&plan.environments, harness_plan.scaling.initial(), &harness_plan.sizing),
            plan.graph.stages.len(),
            bundles_per_harness_text(&plan.environments, &harness_plan.sizing),
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
    // The harnesses Prepare started, if it did (never for a cluster
    // attempt); else, or if their worker pool could not be reached then (it
    // may serve only from Run on), started now.
    let prestarted = match peers.is_none().then(|| job.take_prestarted()).flatten() {
        Some(started) => match started.await {
            Ok(Err(e @ weir_harness::HarnessError::Environment { .. })) => {
                job.message(
                    Importance::JobMessageDetailed,
                    format!("the SDK harnesses asked for at Prepare did not start ({e}); asking again"),
                );
                None
            }
            Ok(Ok(harnesses)) => match harnesses.failure() {
                // One died before Run and could not be replaced.
                Some(why) => {
                    harnesses.stop().await;
                    return Err(fail(why));
                }
                None => Some(Ok(harnesses)),
            },
            Ok(Err(e)) => Some(Err(e)),
            Err(e) => Some(Err(weir_harness::HarnessError::Environment {
                environment: plan.environments.keys().cloned().collect::<Vec<_>>().join(", "),
                urn: weir_proto::urns::env::EXTERNAL.to_string(),
                message: format!("the start of its SDK harnesses at Prepare failed: {e}"),
            })),
        },
        None => None,
    };
    let started = match prestarted {
        Some(started) => started,
        None => start_harnesses(registry, job, &plan.environments, harness_plan).await,
    }
    .map_err(|e| match e {
        weir_harness::HarnessError::Cancelled => (
            JobState::Cancelled,
            "job cancelled while its SDK harnesses started".to_string(),
        ),
        e => fail(e.to_string()),
    });
    let started = started?;
    teardown.harnesses = Some(started.clone());
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
            drain: Some(job.drain.clone()),
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
        gbk_memory_budget: registry.config.gbk_memory_budget,
        user_state_budget: registry.config.user_state_memory_budget,
        side_input_budget: registry.config.side_input_memory_budget,
        spill_dir: registry.config.spill_root.join(&job.id),
        progress: job.progress.clone(),
        cluster: peers,
        min_resume_delay: registry.config.min_resume_delay,
        ..EngineConfig::default()
    };
    let spill_dir = config.spill_dir.clone();
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

    // Runs are deleted as they are read back; a failed job may leave some.
    let _ = std::fs::remove_dir_all(&spill_dir);
    // The SDK harnesses stop after the caller reports the outcome (Teardown).
    match result? {
        Ok(()) => Ok(()),
        // The harnesses stopped the job (e.g. its worker pool is gone).
        Err(weir_engine::EngineError::Cancelled) if started.failure().is_some() => {
            Err(fail(format!(
                "job '{}' failed: {}",
                job.name,
                started.failure().unwrap_or_default()
            )))
        }
        Err(weir_engine::EngineError::Cancelled) => {
            Err((JobState::Cancelled, "job cancelled".into()))
        }
        Err(e) => Err(fail(format!("job '{}' failed: {}", job.name, for_the_user(&e, job.plan.as_ref())))),
    }
}

/// The engine's error as the job's message: a failed stage of a Java or Go
/// environment is named by its transforms too (`stage stage-2
/// (ParDo(Parse)+ParDo(Count)) failed: ...`), as those SDKs' errors name
/// none. A Python stage's is not: Python's error names the failing
/// transform itself (`[while running 'Map(use)']`), and Beam's
/// test_error_message_includes_stage wants the transforms fused with it
/// left out.
fn for_the_user(e: &weir_engine::EngineError, plan: Option<&weir_plan::Plan>) -> String {
    if let (weir_engine::EngineError::BundleFailed { stage, message }, Some(plan)) = (e, plan) {
        if let Some(s) = plan.graph.stages.iter().find(|s| s.id == *stage) {
            if let weir_plan::StageKind::Sdk(sdk) = &s.kind {
                if !weir_plan::is_python_environment(&sdk.environment_id, &plan.environments)
                    && !s.name.is_empty()
                    && s.name != s.id
                {
                    return name_transforms(format!("stage {} ({}) failed: {message}", s.id, s.name), plan);
                }
            }
        }
    }
    match plan {
        Some(plan) => name_transforms(e.to_string(), plan),
        None => e.to_string(),
    }
}

/// `text` with each `transform "<id>"` of the plan's transforms (Weir's
/// own messages quote a transform by its id, as the Fn API gives it) as
/// `transform "<its unique name>"`, the name the user gave it.
fn name_transforms(mut text: String, plan: &weir_plan::Plan) -> String {
    if !text.contains("transform \"") {
        return text;
    }
    for d in plan.descriptors.values() {
        for (id, t) in &d.transforms {
            let quoted = format!("transform {id:?}");
            if !t.unique_name.is_empty() && text.contains(&quoted) {
                text = text.replace(&quoted, &format!("transform {:?}", t.unique_name));
            }
        }
    }
    text
}

/// How many SDK harnesses each environment starts with, for the job's
/// messages: `N SDK harness(es) per environment (W worker(s) of P SDK
/// harness(es) each)`, or one clause per environment when they differ
/// ([`environment::harnesses_per_worker`] by `sizing`).
fn harness_count_text(
    environments: &std::collections::HashMap<String, beam::Environment>,
    workers: usize,
    sizing: &environment::HarnessSizing,
) -> String {
    per_environment_text(
        environments,
        |env| {
            let n = environment::harnesses_per_worker(env, sizing);
            let why = if environment::declares_multi_core(env) {
                " (one per worker: the SDK declares beam:protocol:multi_core_bundle_processing:v1)"
            } else if environment::in_client_pool(env, sizing) {
                " (one per worker: the environment is the client's in-process worker pool, --environment_type=LOOPBACK)"
            } else {
                ""
            };
            (n, why)
        },
        (sizing.per_core_sdk, ""),
        |p, why| {
            format!(
                "{} SDK harness(es) per environment ({workers} worker(s) of {p} SDK harness(es) each){why}",
                workers * p
            )
        },
        |id, p, why| {
            format!(
                "{} SDK harness(es) of environment {id} ({workers} worker(s) of {p} each){why}",
                workers * p
            )
        },
        ", ",
    )
}

/// How many bundles each environment's SDK harnesses run at a time, for the
/// job's messages: `each SDK harness runs up to N bundle(s) at a time`,
/// saying why when the SDK chose it, or one clause per environment when
/// they differ.
fn bundles_per_harness_text(
    environments: &std::collections::HashMap<String, beam::Environment>,
    sizing: &environment::HarnessSizing,
) -> String {
    let default = sizing
        .harness_threads
        .unwrap_or(environment::SINGLE_CORE_BUNDLES_PER_HARNESS);
    per_environment_text(
        environments,
        |env| environment::bundles_per_harness_and_reason(env, sizing),
        (default, ""),
        |n, why| match why {
            "" => format!("each SDK harness runs up to {n} bundle(s) at a time"),
            why => format!("each SDK harness runs up to {n} bundle(s) at a time ({why})"),
        },
        |id, n, why| {
            format!("an SDK harness of environment {id} runs up to {n} bundle(s) at a time ({why})")
        },
        "; ",
    )
}

/// A job message's clause about a number chosen per environment, with its
/// reason (`of`): `all(n, reason)` when every environment got the same (or
/// `all(none...)` when there is none), else `each(id, n, reason)` for every
/// environment in order of id, joined by `separator`.
fn per_environment_text(
    environments: &std::collections::HashMap<String, beam::Environment>,
    of: impl Fn(&beam::Environment) -> (usize, &'static str),
    none: (usize, &'static str),
    all: impl Fn(usize, &str) -> String,
    each: impl Fn(&str, usize, &str) -> String,
    separator: &str,
) -> String {
    let mut per_env: Vec<(&String, usize, &'static str)> = environments
        .iter()
        .map(|(id, env)| {
            let (n, why) = of(env);
            (id, n, why)
        })
        .collect();
    per_env.sort();
    match per_env.as_slice() {
        [] => all(none.0, none.1),
        [(_, n, why), rest @ ..] if rest.iter().all(|(_, m, w)| m == n && w == why) => all(*n, why),
        _ => per_env
            .iter()
            .map(|(id, n, why)| each(id, *n, why))
            .collect::<Vec<_>>()
            .join(separator),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    const MULTI: &str = weir_proto::urns::protocol::MULTI_CORE_BUNDLE_PROCESSING;

    /// An EXTERNAL environment declaring `capabilities`.
    pub(crate) fn env(capabilities: &[&str]) -> beam::Environment {
        beam::Environment {
            urn: weir_proto::urns::env::EXTERNAL.into(),
            capabilities: capabilities.iter().map(|c| c.to_string()).collect(),
            ..Default::default()
        }
    }

    /// Environments by id, each with its capabilities.
    fn envs(list: &[(&str, &[&str])]) -> std::collections::HashMap<String, beam::Environment> {
        list.iter()
            .map(|(id, caps)| (id.to_string(), env(caps)))
            .collect()
    }

    /// Sizing with `per_core_sdk` harnesses per worker of a one-core SDK and
    /// `harness_threads` bundles each when set.
    fn sizing(per_core_sdk: usize, harness_threads: Option<usize>) -> environment::HarnessSizing {
        environment::HarnessSizing {
            per_core_sdk,
            harness_threads,
            in_process_pool: false,
            streaming: false,
        }
    }

    /// This machine's cores: one Python harness per core runs two bundles.
    fn cores() -> usize {
        weir_engine::machine_cores()
    }

    #[test]
    fn the_message_says_the_clients_in_process_pool_runs_one_harness_per_worker() {
        let python = envs(&[("py", &["beam:protocol:worker_status:v1"])]);
        let pool = environment::HarnessSizing { in_process_pool: true, ..sizing(2, None) };
        assert_eq!(
            harness_count_text(&python, 1, &pool),
            "1 SDK harness(es) per environment (1 worker(s) of 1 SDK harness(es) each) (one per worker: the environment is the client's in-process worker pool, --environment_type=LOOPBACK)"
        );
        let pool = environment::HarnessSizing { in_process_pool: true, ..sizing(cores(), None) };
        if cores() > 1 {
            assert_eq!(
                bundles_per_harness_text(&python, &pool),
                format!("each SDK harness runs up to {} bundle(s) at a time (two per core: a worker runs one SDK harness, for all its cores, of an SDK that does not declare beam:protocol:multi_core_bundle_processing:v1)", 2 * cores())
            );
        }
    }

    #[test]
    fn the_message_says_how_many_sdk_harnesses_each_environment_starts() {
        let python = envs(&[("py", &["beam:protocol:worker_status:v1"])]);
        assert_eq!(
            harness_count_text(&python, 3, &sizing(2, None)),
            "6 SDK harness(es) per environment (3 worker(s) of 2 SDK harness(es) each)"
        );
        let java = envs(&[("java", &[MULTI])]);
        assert_eq!(
            harness_count_text(&java, 1, &sizing(2, None)),
            "1 SDK harness(es) per environment (1 worker(s) of 1 SDK harness(es) each) (one per worker: the SDK declares beam:protocol:multi_core_bundle_processing:v1)"
        );
        let both = envs(&[("py", &[]), ("java", &[MULTI])]);
        assert_eq!(
            harness_count_text(&both, 2, &sizing(2, None)),
            "2 SDK harness(es) of environment java (2 worker(s) of 1 each) (one per worker: the SDK declares beam:protocol:multi_core_bundle_processing:v1), 4 SDK harness(es) of environment py (2 worker(s) of 2 each)"
        );
        // With one harness per worker for every SDK, the clauses agree again.
        assert_eq!(
            harness_count_text(&envs(&[("py", &[])]), 1, &sizing(1, None)),
            "1 SDK harness(es) per environment (1 worker(s) of 1 SDK harness(es) each)"
        );
    }

    #[test]
    fn the_messages_of_a_job_without_environments_give_the_defaults() {
        let none = std::collections::HashMap::new();
        assert_eq!(
            harness_count_text(&none, 3, &sizing(2, None)),
            "6 SDK harness(es) per environment (3 worker(s) of 2 SDK harness(es) each)"
        );
        assert_eq!(
            bundles_per_harness_text(&none, &sizing(cores(), None)),
            format!(
                "each SDK harness runs up to {} bundle(s) at a time",
                environment::SINGLE_CORE_BUNDLES_PER_HARNESS
            )
        );
        assert_eq!(
            bundles_per_harness_text(&none, &sizing(cores(), Some(5))),
            "each SDK harness runs up to 5 bundle(s) at a time"
        );
    }

    #[test]
    fn the_message_says_how_many_bundles_each_sdk_harness_runs() {
        let python = envs(&[("py", &["beam:protocol:worker_status:v1"])]);
        assert_eq!(
            bundles_per_harness_text(&python, &sizing(cores(), None)),
            "each SDK harness runs up to 2 bundle(s) at a time (the default for an SDK that does not declare beam:protocol:multi_core_bundle_processing:v1)"
        );
        assert_eq!(
            bundles_per_harness_text(&python, &sizing(cores(), Some(2))),
            "each SDK harness runs up to 2 bundle(s) at a time (number_of_worker_harness_threads)"
        );
        // Batch: one per core; streaming: 16, or two per core on a larger machine.
        let multi = environment::multi_core_bundles_per_harness();
        let java = envs(&[("java", &[MULTI])]);
        assert_eq!(
            bundles_per_harness_text(&java, &sizing(cores(), None)),
            format!("each SDK harness runs up to {} bundle(s) at a time (one per core in a batch job, and the SDK declares beam:protocol:multi_core_bundle_processing:v1)", cores())
        );
        let streaming = environment::HarnessSizing { streaming: true, ..sizing(cores(), None) };
        assert_eq!(
            bundles_per_harness_text(&java, &streaming),
            format!("each SDK harness runs up to {multi} bundle(s) at a time (a streaming job, and the SDK declares beam:protocol:multi_core_bundle_processing:v1)")
        );
        let both = envs(&[("py", &[]), ("java", &[MULTI])]);
        assert_eq!(
            bundles_per_harness_text(&both, &streaming),
            format!("an SDK harness of environment java runs up to {multi} bundle(s) at a time (a streaming job, and the SDK declares beam:protocol:multi_core_bundle_processing:v1); an SDK harness of environment py runs up to 2 bundle(s) at a time (the default for an SDK that does not declare beam:protocol:multi_core_bundle_processing:v1)")
        );
        assert_eq!(
            bundles_per_harness_text(&both, &sizing(cores(), Some(3))),
            "each SDK harness runs up to 3 bundle(s) at a time (number_of_worker_harness_threads)"
        );
    }
}
