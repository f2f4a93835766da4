//! `JobService` (beam_job_api.proto): Prepare, Run, state and message streams,
//! Cancel, GetJobs, GetPipeline, DescribePipelineOptions, GetJobMetrics.
//!
//! Three Weir additions, invisible to Beam's clients:
//! * GetJobMetrics also returns the job's CPU and memory as MonitoringInfos
//!   with `weir:metric:...` URNs ([`crate::resources`]).
//! * GetStateStream and GetMessageStream follow a running job until it ends,
//!   as Beam specifies; a request with the gRPC metadata
//!   [`FOLLOW_HEADER`]` = false` gets only what the job has so far (its
//!   state changes and last messages) and then the stream ends. `weir jobs
//!   logs` and `weir jobs list` use that. After a terminal state it saw
//!   happen, GetStateStream stays open for up to [`STATE_STREAM_LINGER`]
//!   (or until the client leaves), for Beam's Python client's sake.
//! * GetMessageStream carries the job's message stream: state changes,
//!   Weir's messages, the SDK's warnings and errors
//!   ([`crate::registry::Job::sdk_log`]); with the metadata [`LOGS_HEADER`]`
//!   = all` it carries the job's logs, every SDK log entry too (`weir jobs
//!   logs`).

use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use futures::Stream;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use weir_proto::beam;
use weir_proto::beam::job_message::MessageImportance;
use weir_proto::beam::job_messages_response::Response as Event;
use weir_proto::beam::job_state::Enum as JobState;

use crate::registry::{is_terminal, Job, JobRegistry, View};

/// Samples the job's CPU and memory every [`crate::resources::SAMPLE_EVERY`]
/// until it reaches a terminal state (so SDK processes are measured before
/// they exit).
async fn sample_while_running(registry: Arc<JobRegistry>, job: Arc<Job>) {
    loop {
        let (r, j) = (registry.clone(), job.clone());
        let _ = tokio::task::spawn_blocking(move || r.sampler.sample(&j.id, &j.resources)).await;
        if is_terminal(job.state()) {
            return;
        }
        tokio::time::sleep(crate::resources::SAMPLE_EVERY).await;
    }
}

/// gRPC metadata key: `false` makes GetStateStream / GetMessageStream end
/// after the history instead of following the job.
pub const FOLLOW_HEADER: &str = "weir-follow";

fn follows<T>(request: &tonic::Request<T>) -> bool {
    request
        .metadata()
        .get(FOLLOW_HEADER)
        .and_then(|v| v.to_str().ok())
        .map_or(true, |v| !v.eq_ignore_ascii_case("false"))
}

/// gRPC metadata key: `all` makes GetMessageStream carry the job's logs
/// ([`View::Logs`]: every SDK log entry at its own severity) instead of its
/// message stream ([`View::Stream`]). `weir jobs logs` sends it.
pub const LOGS_HEADER: &str = "weir-logs";

fn wants_logs<T>(request: &tonic::Request<T>) -> bool {
    request
        .metadata()
        .get(LOGS_HEADER)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("all"))
}

/// PrepareJobRequests captured so far (`--capture_prepare_dir`).
static CAPTURED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// The Job API service.
pub struct JobService(pub Arc<JobRegistry>);

/// Maps a planning error to the gRPC status a client sees at Prepare.
pub(crate) fn plan_status(e: &weir_plan::PlanError) -> tonic::Status {
    match e {
        weir_plan::PlanError::Unsupported { .. } => tonic::Status::unimplemented(e.to_string()),
        weir_plan::PlanError::Internal(_) => tonic::Status::internal(e.to_string()),
        _ => tonic::Status::invalid_argument(e.to_string()),
    }
}

/// Largest pipeline (encoded bytes) Prepare plans on its own task rather
/// than on a blocking thread: planning takes about 10 us per KiB (Python's
/// wordcount, 48 KiB: 0.4 ms), so one this size plans in about the time a
/// hand-off to a blocking thread and back takes, and holds an async worker
/// no longer.
const INLINE_PLANNING_BYTES: usize = 32 << 10;

/// Whether resolving `pipeline`'s environments runs subprocesses
/// ([`resolve_environments`]: DOCKER and ANYOF environments).
fn needs_docker(pipeline: &beam::Pipeline) -> bool {
    pipeline.components.as_ref().is_some_and(|c| {
        c.environments.values().any(|e| {
            e.urn == weir_proto::urns::env::DOCKER || e.urn == weir_proto::urns::env::ANYOF
        })
    })
}

/// Replaces each ANYOF environment by the alternative Weir starts, and
/// (without a Docker daemon) Beam's SDK images by native harnesses
/// ([`weir_harness::resolve`]); returns the notes for the job's messages.
fn resolve_environments(
    pipeline: &mut beam::Pipeline,
    python_for_docker_images: Option<String>,
) -> Result<Vec<String>, tonic::Status> {
    if !needs_docker(pipeline) {
        return Ok(vec![]);
    }
    let Some(c) = pipeline.components.as_mut() else {
        return Ok(vec![]);
    };
    let subs = weir_harness::resolve::Substitutes {
        weir: weir_harness::weir_exe().unwrap_or_else(|| "weir".into()),
        python: python_for_docker_images
            .or_else(|| std::env::var("WEIR_PYTHON").ok())
            .unwrap_or_else(|| "python3".into()),
        docker: weir_harness::resolve::docker_available(),
    };
    let mut notes = Vec::new();
    let mut ids: Vec<String> = c.environments.keys().cloned().collect();
    ids.sort();
    for id in ids {
        let (env, n) = weir_harness::resolve::resolve(&id, &c.environments[&id], &subs)
            .map_err(|e| tonic::Status::invalid_argument(e.to_string()))?;
        c.environments.insert(id, env);
        notes.extend(n);
    }
    Ok(notes)
}

/// Refuses a job whose options ask for more SDK harnesses than
/// [`crate::limits::Limits::max_sdk_harnesses_per_job`]: `num_workers` (or
/// `max_num_workers` when autoscaling) × the SDK harnesses one worker runs
/// of each environment ([`weir_harness::environment::harnesses_per_worker`]).
fn check_sdk_harnesses(
    limits: &crate::limits::Limits,
    validated: &crate::options::JobOptions,
    options: &weir_proto::prost_types::Struct,
    environments: &std::collections::HashMap<String, beam::Environment>,
) -> Result<(), tonic::Status> {
    use weir_harness::environment::{harnesses_per_worker, Scaling};
    let plan = crate::options::sdk_harness_plan(validated, options);
    let option = match plan.scaling {
        Scaling::Fixed(_) => "num_workers",
        Scaling::ThroughputBased { .. } => "max_num_workers",
    };
    let workers = plan.scaling.max();
    // A job with no SDK environment still counts as one.
    let per_worker: usize = environments
        .values()
        .map(|env| harnesses_per_worker(env, &plan.sizing))
        .sum::<usize>()
        .max(1);
    let total = workers.saturating_mul(per_worker);
    if total > limits.max_sdk_harnesses_per_job {
        return Err(tonic::Status::invalid_argument(crate::limits::over(
            &format!(
                "the SDK harnesses this job asks for (pipeline option --{option}: {workers} worker(s) x {per_worker} SDK harness(es) per worker over {} environment(s))",
                environments.len().max(1)
            ),
            total,
            limits.max_sdk_harnesses_per_job,
            crate::limits::flag::MAX_SDK_HARNESSES_PER_JOB,
        )));
    }
    Ok(())
}

impl JobService {
    fn job(&self, id: &str) -> Result<Arc<Job>, tonic::Status> {
        self.0
            .get(id)
            .ok_or_else(|| tonic::Status::not_found(format!("unknown job id {id:?}")))
    }
}

type EventStream<T> = Pin<Box<dyn Stream<Item = Result<T, tonic::Status>> + Send>>;

/// Cancels (`drain` false) or drains a job as CancelJob and DrainJob do;
/// returns its state after the request.
pub fn stop_job(job: &Job, drain: bool) -> JobState {
    if drain {
        stop(job, &job.drain, JobState::Draining)
    } else {
        stop(job, &job.cancel, JobState::Cancelling)
    }
}

/// Why `job` cannot be drained, as Dataflow refuses to drain a batch job:
/// it is a batch job (no `--streaming`, no TestStream, no unbounded
/// PCollection) that runs. Its bounded input ends by itself, and
/// Beam's SDKs report a DRAINED job as failed, so draining one only turned
/// a complete run into a failure. `None` when it can be drained.
pub fn drain_refusal(job: &Job) -> Option<String> {
    // A job not run yet is cancelled by a drain (`stop`), whatever its kind.
    if is_terminal(job.state()) || job.state() == JobState::Stopped {
        return None;
    }
    let streaming = job.validated.streaming
        || job.plan.as_ref().is_some_and(|p| p.graph.streaming)
        || job.has_unbounded_pcollection();
    (!streaming).then(|| {
        format!(
            "job {} is a batch job: only a streaming job (--streaming, a TestStream or an unbounded PCollection) can be drained, as on Dataflow; its bounded input ends by itself, or cancel it (weir jobs cancel {})",
            job.id, job.id
        )
    })
}

/// How long Cancel waits for the job to end before it answers CANCELLING.
const CANCEL_ANSWER_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Asks `job` to stop (CancelJob, DrainJob): a job not started yet is
/// cancelled, a finished one keeps its state, a running one gets `signal`
/// set (its run watches it) and moves to `stopping`. Returns the job's state.
fn stop(job: &Job, signal: &std::sync::atomic::AtomicBool, stopping: JobState) -> JobState {
    match job.state() {
        JobState::Stopped => {
            job.set_state(JobState::Cancelled);
            job.abandon_unrun();
        }
        s if is_terminal(s) => {}
        _ => {
            signal.store(true, Ordering::SeqCst);
            job.set_state(stopping);
        }
    }
    job.state()
}

/// How long GetStateStream stays open after it sent the terminal state it
/// saw happen (unless the client goes first). Beam's Python client stops
/// reading at that state and exits; a stream that ended at once could have
/// grpcio's channel thread handle the stream's end while the interpreter
/// shuts down, and a daemon thread stopped there holding the call's lock
/// hangs the exiting client in that call's finalizer (seen about once in 50
/// jobs on 2 busy cores). Open, the call is just cancelled at exit.
pub const STATE_STREAM_LINGER: std::time::Duration = std::time::Duration::from_secs(5);

/// Streams a job's events through `map` (None = skip) until a terminal
/// state has been sent; if that state arrived live, then keeps the stream
/// open, sending nothing, for up to `linger` (or until the client leaves).
/// With `live_too` false, ends after the history.
fn follow<T: Send + 'static>(
    job: Arc<Job>,
    map: fn(beam::JobMessagesResponse) -> Option<T>,
    live_too: bool,
    view: View,
    linger: std::time::Duration,
) -> EventStream<T> {
    let (tx, rx) = mpsc::channel(256);
    tokio::spawn(async move {
        let (history, mut live) = job.subscribe(view);
        // Not kept: a job the registry forgets (e.g. prepared, never run)
        // ends its readers instead of living on in them.
        drop(job);
        let terminal = |e: &beam::JobMessagesResponse| matches!(&e.response, Some(Event::StateResponse(s)) if JobState::try_from(s.state).map(is_terminal).unwrap_or(false));
        // Sends one event; false when the stream should end.
        let forward = |e: beam::JobMessagesResponse| {
            let end = terminal(&e);
            let tx = tx.clone();
            async move {
                if let Some(m) = map(e) {
                    if tx.send(Ok(m)).await.is_err() {
                        return false;
                    }
                }
                !end
            }
        };
        for e in history {
            if !forward(e).await {
                return;
            }
        }
        if !live_too {
            return;
        }
        loop {
            // A client gone ends the task at once, not at the next event.
            let p = tokio::select! {
                p = live.recv() => p,
                () = tx.closed() => None,
            };
            let Some(p) = p else { return };
            let Some(e) = p.view(view) else { continue };
            if !forward(e.clone()).await {
                break;
            }
        }
        drop(live);
        if !linger.is_zero() {
            tokio::select! {
                () = tokio::time::sleep(linger) => {}
                () = tx.closed() => {}
            }
        }
    });
    Box::pin(ReceiverStream::new(rx))
}

#[tonic::async_trait]
impl beam::job_service_server::JobService for JobService {
    async fn prepare(
        &self,
        request: tonic::Request<beam::PrepareJobRequest>,
    ) -> Result<tonic::Response<beam::PrepareJobResponse>, tonic::Status> {
        // Staging goes where the client dialed (the server's own address
        // when that is not a host:port): reachable from the client, and
        // gRPC reuses its connection instead of opening another.
        let staging_url = request
            .extensions()
            .get::<crate::DialedAuthority>()
            .map_or_else(|| self.0.url.clone(), |d| d.0.clone());
        let req = request.into_inner();
        if let Some(dir) = &self.0.config.capture_prepare_dir {
            let n = CAPTURED.fetch_add(1, Ordering::SeqCst);
            let path = dir.join(format!("prepare-{}-{n}.pb", std::process::id()));
            let _ = std::fs::create_dir_all(dir);
            if let Err(e) = std::fs::write(&path, prost::Message::encode_to_vec(&req)) {
                tracing::warn!(
                    "cannot capture the PrepareJobRequest into {}: {e}",
                    path.display()
                );
            }
        }
        let pipeline = req
            .pipeline
            .ok_or_else(|| tonic::Status::invalid_argument("PrepareJobRequest has no pipeline"))?;
        let limits = &self.0.config.limits;
        let options = req.pipeline_options.unwrap_or_default();
        let pipeline_bytes = prost::Message::encoded_len(&pipeline);
        crate::limits::check_request(limits, pipeline_bytes, &options)
            .and_then(|()| crate::limits::check_transforms(limits, &pipeline))
            .map_err(tonic::Status::invalid_argument)?;
        self.0.expire_prepared();
        let (prepared, mut held) = self.0.prepared();
        if prepared >= limits.max_prepared_jobs {
            // Make room: the oldest prepared job no client is staging goes.
            let Some(gone) = self.0.forget_oldest_idle_prepared() else {
                return Err(tonic::Status::resource_exhausted(crate::limits::over(
                    &format!(
                        "the number of prepared jobs not yet run, with this one, all staging their artifacts (each is forgotten {} s after its Prepare),",
                        limits.prepared_job_ttl.as_secs()
                    ),
                    prepared + 1,
                    limits.max_prepared_jobs,
                    crate::limits::flag::MAX_PREPARED_JOBS,
                )));
            };
            tracing::warn!(
                job = %gone,
                "prepared job forgotten before it ran: {} prepared jobs are held ({}) and a new job came",
                limits.max_prepared_jobs,
                crate::limits::flag::MAX_PREPARED_JOBS
            );
            held = self.0.prepared().1;
        }
        if held.saturating_add(pipeline_bytes) > limits.max_held_pipeline_bytes {
            return Err(tonic::Status::resource_exhausted(crate::limits::over(
                &format!(
                    "the serialized pipelines of the prepared jobs not yet run, with this one ({pipeline_bytes} bytes),"
                ),
                format!("{} bytes", held + pipeline_bytes),
                format!("{} bytes", limits.max_held_pipeline_bytes),
                crate::limits::flag::MAX_HELD_PIPELINE_BYTES,
            )));
        }
        // DOCKER images against the operator's allowlist before any
        // substitution (PROCESS commands are checked once resolved, below).
        if let Some(c) = &pipeline.components {
            let mut ids: Vec<&String> = c.environments.keys().collect();
            ids.sort();
            for id in ids {
                let env = &c.environments[id];
                if env.urn == weir_proto::urns::env::DOCKER {
                    self.0
                        .config
                        .security
                        .check_environment(id, env)
                        .map_err(tonic::Status::permission_denied)?;
                }
            }
        }
        let mut validated = crate::options::validate(&options)
            .map_err(|e| tonic::Status::invalid_argument(e.to_string()))?;
        validated.notes.extend(container_image_note(&options, &pipeline));
        // --job_name's length is checked with the options.
        if req.job_name.len() > crate::options::MAX_JOB_NAME_BYTES {
            return Err(tonic::Status::invalid_argument(format!(
                "PrepareJobRequest.job_name: {}",
                crate::options::job_name_too_long(&req.job_name)
            )));
        }
        let plan_options = weir_plan::PlanOptions {
            fn_api_url: self.0.url.clone(),
            streaming: validated.streaming,
            drain: crate::options::has_experiment(&options, crate::options::TEST_DRAIN_EXPERIMENT),
        };
        let python = self.0.config.python_for_docker_images.clone();
        let inline = !needs_docker(&pipeline) && pipeline_bytes <= INLINE_PLANNING_BYTES;
        let prepare = move || {
            let mut pipeline = pipeline;
            let notes = resolve_environments(&mut pipeline, python)?;
            let plan = weir_plan::plan(&pipeline, &plan_options);
            Ok::<_, tonic::Status>((pipeline, notes, plan))
        };
        // A planner bug (a panic) must fail this Prepare only.
        let planner_bug = |e: String| {
            tonic::Status::internal(format!(
                "Weir's planner failed on this pipeline (this is a Weir bug): {e}"
            ))
        };
        let (pipeline, env_notes, plan) = if inline {
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(prepare))
                .map_err(|panic| planner_bug(weir_engine::panic_text(panic.as_ref())))??
        } else {
            // Off the async workers: `docker info` and the interpreter's
            // Beam version are subprocesses, and planning a large pipeline
            // takes a while.
            tokio::task::spawn_blocking(prepare)
                .await
                .map_err(|e| planner_bug(e.to_string()))??
        };
        let plan = plan.map_err(|e| plan_status(&e))?;
        check_sdk_harnesses(limits, &validated, &options, &plan.environments)?;
        for (id, env) in &plan.environments {
            weir_harness::environment::validate(id, env)
                .map_err(|e| tonic::Status::unimplemented(e.to_string()))?;
            // The operator's allowlist (weir serve --allow_process_command,
            // --allow_docker_image): a job runs no other command.
            self.0
                .config
                .security
                .check_environment(id, env)
                .map_err(tonic::Status::permission_denied)?;
        }
        // Python always sends the placeholder name "job"; --job_name says more.
        let name = match validated.job_name.clone() {
            Some(name) if req.job_name.is_empty() || req.job_name == "job" => name,
            // Then the job id (create_job names an unnamed job by it).
            None if req.job_name == "job" => String::new(),
            _ => req.job_name,
        };
        let id = JobRegistry::new_job_id();
        let locations = crate::locations::resolve(
            &validated,
            &self.0.default_locations(),
            &crate::locations::SystemEnv,
        )
        .map_err(|e| tonic::Status::invalid_argument(e.to_string()))?;
        for location in [&locations.staging, &locations.temp] {
            if location.option.is_some() {
                location
                    .probe(&id)
                    .await
                    .map_err(tonic::Status::failed_precondition)?;
            }
        }
        let stages = plan.graph.stages.len();
        let job = self
            .0
            .create_job(id, name, pipeline, Some(plan), options, locations);
        // Each option note says what Weir does not do of what the client
        // asked: a warning, which Beam's clients show at their default log
        // level (Python's PortableRunner logs BASIC messages at INFO).
        for note in &validated.notes {
            job.message(MessageImportance::JobMessageWarning, note.clone());
        }
        for note in &env_notes {
            job.message(MessageImportance::JobMessageBasic, note.clone());
        }
        // After the token, limit and environment checks (no policy limits
        // EXTERNAL endpoints): dialling the job's worker pools now takes
        // the handshake off the path from Run to its first bundle.
        if let Some(plan) = &job.plan {
            job.pools.preconnect(&plan.environments);
        }
        if self.0.coordinator().is_none() {
            crate::run::prestart(&self.0, &job);
        }
        tracing::info!(job = %job.id, name = %job.name, stages, "prepared");
        Ok(tonic::Response::new(beam::PrepareJobResponse {
            preparation_id: job.id.clone(),
            artifact_staging_endpoint: Some(beam::ApiServiceDescriptor {
                url: staging_url,
                ..Default::default()
            }),
            staging_session_token: job.id.clone(),
        }))
    }

    async fn run(
        &self,
        request: tonic::Request<beam::RunJobRequest>,
    ) -> Result<tonic::Response<beam::RunJobResponse>, tonic::Status> {
        let job = self.job(&request.get_ref().preparation_id)?;
        match job.state() {
            JobState::Stopped => {}
            JobState::Cancelled | JobState::Cancelling if job.times().0.is_none() => {
                return Err(tonic::Status::failed_precondition(format!(
                    "job {} was cancelled before it was run",
                    job.id
                )))
            }
            _ => {
                return Err(tonic::Status::failed_precondition(format!(
                    "job {} was already run",
                    job.id
                )))
            }
        }
        {
            let staging = job.staging.lock().unwrap_or_else(|p| p.into_inner());
            crate::artifacts::check_staged(&job, &staging).map_err(tonic::Status::failed_precondition)?;
            job.set_state(JobState::Starting);
        }
        job.message(MessageImportance::JobMessageDetailed, locations_message(&job));
        let registry = self.0.clone();
        let running = job.clone();
        tokio::spawn(async move {
            let sampling = tokio::spawn(sample_while_running(registry.clone(), running.clone()));
            crate::run::run(registry.clone(), running.clone()).await;
            sampling.abort();
            registry.sampler.sample(&running.id, &running.resources);
            // Weir's own temp folder for the job goes; a user's temp
            // location keeps only what the SDK wrote there.
            let temp = &running.locations.temp;
            if temp.option.is_none() {
                temp.remove_job_folder(&running.id).await;
            } else if let Some(dir) = &temp.local {
                // Only if empty: the probe's folder, nothing the SDK wrote.
                let _ = tokio::fs::remove_dir(dir.join(&running.id)).await;
            }
            registry.evict_finished();
        });
        Ok(tonic::Response::new(beam::RunJobResponse {
            job_id: job.id.clone(),
        }))
    }

    async fn get_jobs(
        &self,
        request: tonic::Request<beam::GetJobsRequest>,
    ) -> Result<tonic::Response<beam::GetJobsResponse>, tonic::Status> {
        let mut job_info: Vec<beam::JobInfo> = self.0.all().iter().map(|j| j.info()).collect();
        if request.metadata().get(FULL_OPTIONS_HEADER).is_none() {
            fit_reply(&mut job_info, GET_JOBS_REPLY_BYTES);
        }
        Ok(tonic::Response::new(beam::GetJobsResponse { job_info }))
    }

    async fn get_state(
        &self,
        request: tonic::Request<beam::GetJobStateRequest>,
    ) -> Result<tonic::Response<beam::JobStateEvent>, tonic::Status> {
        let job = self.job(&request.get_ref().job_id)?;
        Ok(tonic::Response::new(beam::JobStateEvent {
            state: job.state() as i32,
            timestamp: Some(std::time::SystemTime::now().into()),
        }))
    }

    async fn get_pipeline(
        &self,
        request: tonic::Request<beam::GetJobPipelineRequest>,
    ) -> Result<tonic::Response<beam::GetJobPipelineResponse>, tonic::Status> {
        let job = self.job(&request.get_ref().job_id)?;
        let pipeline = job
            .pipeline
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        Ok(tonic::Response::new(beam::GetJobPipelineResponse {
            pipeline: Some(pipeline),
        }))
    }

    async fn cancel(
        &self,
        request: tonic::Request<beam::CancelJobRequest>,
    ) -> Result<tonic::Response<beam::CancelJobResponse>, tonic::Status> {
        let job = self.job(&request.get_ref().job_id)?;
        // Subscribed first, so the end of the job cannot slip by unseen.
        let (_, mut events) = job.subscribe(View::Stream);
        stop(&job, &job.cancel, JobState::Cancelling);
        // Answered once the job is CANCELLED (its harnesses stop without
        // waiting for their bundles, well under a second), as Prism does:
        // Beam's Python client, waiting right after a cancel, breaks on a
        // job still CANCELLING. A job slower to stop is answered CANCELLING.
        let deadline = tokio::time::sleep(CANCEL_ANSWER_WAIT);
        tokio::pin!(deadline);
        while !is_terminal(job.state()) {
            tokio::select! {
                _ = &mut deadline => break,
                event = events.recv() => if event.is_none() { break },
            }
        }
        Ok(tonic::Response::new(beam::CancelJobResponse {
            state: job.state() as i32,
        }))
    }

    /// Drains a running job (Dataflow's drain): its sources stop reading
    /// (splittable DoFn restrictions are truncated by the DoFn's
    /// `truncate_restriction` and what is left runs at once, a TestStream
    /// ends), work in flight finishes, every window fires, and the job ends
    /// DRAINED. A job that has not started is cancelled.
    async fn drain(
        &self,
        request: tonic::Request<beam::DrainJobRequest>,
    ) -> Result<tonic::Response<beam::DrainJobResponse>, tonic::Status> {
        let job = self.job(&request.get_ref().job_id)?;
        if let Some(reason) = drain_refusal(&job) {
            return Err(tonic::Status::failed_precondition(reason));
        }
        Ok(tonic::Response::new(beam::DrainJobResponse {
            state: stop(&job, &job.drain, JobState::Draining) as i32,
        }))
    }

    type GetStateStreamStream = EventStream<beam::JobStateEvent>;

    async fn get_state_stream(
        &self,
        request: tonic::Request<beam::GetJobStateRequest>,
    ) -> Result<tonic::Response<Self::GetStateStreamStream>, tonic::Status> {
        let job = self.job(&request.get_ref().job_id)?;
        let live = follows(&request);
        Ok(tonic::Response::new(follow(
            job,
            |e| match e.response {
                Some(Event::StateResponse(s)) => Some(s),
                _ => None,
            },
            live,
            View::Stream,
            STATE_STREAM_LINGER,
        )))
    }

    type GetMessageStreamStream = EventStream<beam::JobMessagesResponse>;

    async fn get_message_stream(
        &self,
        request: tonic::Request<beam::JobMessagesRequest>,
    ) -> Result<tonic::Response<Self::GetMessageStreamStream>, tonic::Status> {
        let job = self.job(&request.get_ref().job_id)?;
        let live = follows(&request);
        let view = if wants_logs(&request) {
            View::Logs
        } else {
            View::Stream
        };
        // Not lingering: Beam's Python client waits for this stream's end.
        Ok(tonic::Response::new(follow(job, Some, live, view, std::time::Duration::ZERO)))
    }

    async fn get_job_metrics(
        &self,
        request: tonic::Request<beam::GetJobMetricsRequest>,
    ) -> Result<tonic::Response<beam::GetJobMetricsResponse>, tonic::Status> {
        let job = self.job(&request.get_ref().job_id)?;
        if !is_terminal(job.state()) && job.state() != JobState::Stopped {
            let sampler = &self.0.sampler;
            sampler.sample(&job.id, &job.resources);
        }
        let mut infos = job.metrics_by_step();
        infos.extend(job.resources.monitoring_infos());
        // Per-stage figures only for Weir's own CLI: a Beam SDK keys
        // metrics by step and name, not by STAGE, so it would fold a job's
        // stages into one meaningless figure per URN.
        if request.metadata().contains_key(crate::stage_metrics::REQUEST_HEADER) {
            infos.extend(crate::stage_metrics::monitoring_infos(&job));
        }
        // Batch bundles are committed when the runner accepts their outputs,
        // so attempted and committed agree.
        Ok(tonic::Response::new(beam::GetJobMetricsResponse {
            metrics: Some(beam::MetricResults {
                attempted: infos.clone(),
                committed: infos,
            }),
        }))
    }

    async fn describe_pipeline_options(
        &self,
        _: tonic::Request<beam::DescribePipelineOptionsRequest>,
    ) -> Result<tonic::Response<beam::DescribePipelineOptionsResponse>, tonic::Status> {
        Ok(tonic::Response::new(
            beam::DescribePipelineOptionsResponse {
                options: crate::options::runner_descriptors(),
            },
        ))
    }
}

/// Where the job's artifacts and temp files go, for its messages. A local
/// temp location outside Weir's folders is the SDK's alone (the server
/// keeps its own temp files in its folder, see
/// [`crate::locations::resolve`]), and the message says so.
fn locations_message(job: &Job) -> String {
    let (staging, temp, v) = (&job.locations.staging, &job.locations.temp, &job.validated);
    // Weir's own temp folder although the user set a temp location: the
    // location was left to the SDK.
    let sdk_temp = [("temp_location", &v.temp_location), ("gcp_temp_location", &v.gcp_temp_location)]
        .into_iter()
        .find_map(|(name, value)| Some((v.spellings.get(name).map_or(name, String::as_str), value.as_deref()?)))
        .filter(|_| temp.option.is_none());
    let temp_files = match sdk_temp {
        Some((option, location)) => format!(
            "Weir's own temp files go to {}/{id}, and the SDK writes its temp files to --{option}={location} (outside Weir's folders, so the SDK reaches it itself)",
            temp.describe(),
            id = job.id
        ),
        None => format!("temp files go to {}/{}", temp.describe(), job.id),
    };
    format!("artifacts are staged under {}/{}; {temp_files}", staging.describe(), job.id)
}

/// Puts each transform's unique name (`CountWords/Count`, what the user
/// named it) in the `PTRANSFORM` label of `infos`, where the SDK reported
/// its id in `pipeline` (`ref_AppliedPTransform_CountWords_12`), and
/// `<name>/weir:<piece>` where it reported a piece Weir added
/// (`<id>/weir:<piece>`). Beam's SDKs key a job's metrics by that label,
/// and Dataflow and DirectRunner key them by step name, so
/// `MetricsFilter().with_step("CountWords")` finds them (Beam's filters
/// match a step by whole `/`-separated parts, so pieces match too). The
/// renaming is one to one, since clients keep one value per key: a name
/// that two transforms share (Go names a DoFn applied twice alike) or that
/// is some transform's id stays an id. Labels that name no transform stay
/// as they are.
pub fn name_steps(infos: &mut [beam::MonitoringInfo], pipeline: &beam::Pipeline) {
    let Some(components) = &pipeline.components else {
        return;
    };
    let transforms = &components.transforms;
    let mut uses: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
    for t in transforms.values() {
        *uses.entry(t.unique_name.as_str()).or_default() += 1;
    }
    let name = |id: &str| {
        transforms
            .get(id)
            .map(|t| t.unique_name.as_str())
            .filter(|n| !n.is_empty() && uses.get(n) == Some(&1) && !transforms.contains_key(*n))
    };
    for info in infos {
        let Some(label) = info.labels.get_mut(weir_proto::urns::monitoring::PTRANSFORM_LABEL) else {
            continue;
        };
        let step = match label.split_once("/weir:") {
            Some((id, piece)) if !transforms.contains_key(label.as_str()) => {
                name(id).map(|n| format!("{n}/weir:{piece}"))
            }
            _ => name(label).map(str::to_string),
        };
        if let Some(step) = step {
            *label = step;
        }
    }
}

/// A note when `--sdk_container_image` (or its deprecated name) asks for an
/// image no environment of the pipeline uses: the SDK writes the option
/// into its DOCKER environments or not at all (Beam Python's PortableRunner
/// takes the image from --environment_config), and Weir runs the
/// environments as sent.
fn container_image_note(options: &prost_types::Struct, pipeline: &beam::Pipeline) -> Option<String> {
    use prost::Message;
    use prost_types::value::Kind;
    let (key, image) = ["sdk_container_image", "worker_harness_container_image"].iter().find_map(|name| {
        match options.fields.get(&format!("beam:option:{name}:v1")).and_then(|v| v.kind.as_ref()) {
            Some(Kind::StringValue(s)) if !s.is_empty() => Some((*name, s.clone())),
            _ => None,
        }
    })?;
    let mut images: Vec<String> = pipeline
        .components
        .iter()
        .flat_map(|c| c.environments.values())
        .filter(|e| e.urn == weir_proto::urns::env::DOCKER)
        .filter_map(|e| beam::DockerPayload::decode(e.payload.as_slice()).ok())
        .map(|p| p.container_image)
        .collect();
    if images.iter().any(|i| *i == image) {
        return None;
    }
    images.sort();
    images.dedup();
    Some(if images.is_empty() {
        format!("--{key}={image}: has no effect on this job: none of its environments is DOCKER")
    } else {
        format!(
            "--{key}={image}: not applied: the pipeline's DOCKER environments ask for {} (the SDK did not write the option into them; Beam Python takes the image from --environment_config), and Weir runs them as sent",
            images.join(", ")
        )
    })
}

/// The largest GetJobs reply sent without [`FULL_OPTIONS_HEADER`]: under
/// gRPC's default 4 MiB limit of received messages, which Beam's clients keep.
pub const GET_JOBS_REPLY_BYTES: usize = 3 << 20;

/// Metadata key asking GetJobs for every job's options whatever the reply's
/// size (Weir's CLI sends it, with a larger limit of its own).
pub const FULL_OPTIONS_HEADER: &str = "weir-full-options";

/// Leaves out the options of the jobs with the largest ones until the reply
/// fits in `limit` bytes, each replaced by one field saying so
/// (`weir:options_omitted:v1`): one job with megabytes of options must not
/// make GetJobs fail for every client.
fn fit_reply(jobs: &mut [beam::JobInfo], limit: usize) {
    use prost::Message;
    let mut total: usize = jobs.iter().map(|j| j.encoded_len() + 8).sum();
    if total <= limit {
        return;
    }
    let mut by_size: Vec<(usize, usize)> =
        jobs.iter().enumerate().map(|(i, j)| (j.pipeline_options.as_ref().map_or(0, |o| o.encoded_len()), i)).collect();
    by_size.sort_unstable_by(|a, b| b.cmp(a));
    for (size, i) in by_size {
        if total <= limit {
            break;
        }
        let job = &mut jobs[i];
        let before = job.encoded_len();
        let note = format!(
            "{size} bytes of options left out of GetJobs to keep its reply under {limit} bytes; `weir jobs describe {}` shows them",
            job.job_id
        );
        job.pipeline_options = Some(prost_types::Struct {
            fields: [(
                "weir:options_omitted:v1".to_string(),
                prost_types::Value { kind: Some(prost_types::value::Kind::StringValue(note)) },
            )]
            .into(),
        });
        total = total.saturating_sub(before.saturating_sub(job.encoded_len()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_name_their_step_by_the_transform_s_unique_name() {
        let transform = |name: &str| beam::PTransform { unique_name: name.into(), ..Default::default() };
        let pipeline = beam::Pipeline {
            components: Some(beam::Components {
                transforms: [
                    ("ref_AppliedPTransform_CountStep_14".to_string(), transform("CountStep")),
                    ("s2".to_string(), transform("Outer/ParMultiDo(Fn)")),
                    ("nameless".to_string(), transform("")),
                    // Go names a DoFn applied twice alike: both keep their ids.
                    ("e1".to_string(), transform("main.countFn")),
                    ("e2".to_string(), transform("main.countFn")),
                    // A name that is another transform's id stays an id.
                    ("e3".to_string(), transform("e1")),
                ]
                .into(),
                ..Default::default()
            }),
            ..Default::default()
        };
        let info = |label: Option<&str>| beam::MonitoringInfo {
            urn: "beam:metric:user:sum_int64:v1".into(),
            labels: label
                .map(|l| [("PTRANSFORM".to_string(), l.to_string()), ("NAME".to_string(), "n".to_string())].into())
                .unwrap_or_default(),
            ..Default::default()
        };
        let mut infos = vec![
            info(Some("ref_AppliedPTransform_CountStep_14")),
            info(Some("s2/weir:lifted")),
            info(Some("nameless")),
            info(Some("unknown/weir:x")),
            info(None),
            info(Some("e1")),
            info(Some("e2/weir:precombine")),
            info(Some("e3")),
            info(Some("s2")),
        ];
        name_steps(&mut infos, &pipeline);
        let steps: Vec<_> = infos.iter().map(|i| i.labels.get("PTRANSFORM").map(String::as_str)).collect();
        assert_eq!(
            steps,
            [
                Some("CountStep"),
                Some("Outer/ParMultiDo(Fn)/weir:lifted"),
                Some("nameless"),
                Some("unknown/weir:x"),
                None,
                Some("e1"),
                Some("e2/weir:precombine"),
                Some("e3"),
                Some("Outer/ParMultiDo(Fn)"),
            ]
        );
        assert!(infos.iter().take(4).all(|i| i.labels["NAME"] == "n"));
        // One to one: no two labels became one.
        let distinct: std::collections::HashSet<_> = steps.iter().collect();
        assert_eq!(distinct.len(), steps.len());
    }
    use crate::run::tests::env;
    use weir_proto::prost_types::{value::Kind, Struct, Value};

    fn num_workers(n: f64) -> Struct {
        Struct {
            fields: [(
                "beam:option:num_workers:v1".to_string(),
                Value {
                    kind: Some(Kind::NumberValue(n)),
                },
            )]
            .into_iter()
            .collect(),
        }
    }

    /// The cap counts one SDK harness per worker of a multi-core SDK's
    /// environment and one per core of another's.
    #[test]
    fn the_harness_cap_counts_each_environments_harnesses_per_worker() {
        let limits = crate::limits::Limits {
            max_sdk_harnesses_per_job: 256,
            ..Default::default()
        };
        let cores = weir_engine::machine_cores();
        let options = num_workers(200.0);
        let validated = crate::options::validate(&options).expect("valid");
        let multi = weir_proto::urns::protocol::MULTI_CORE_BUNDLE_PROCESSING;
        let java = std::collections::HashMap::from([("java".to_string(), env(&[multi]))]);
        check_sdk_harnesses(&limits, &validated, &options, &java)
            .expect("200 workers of one Java harness each fit under 256");
        let both = std::collections::HashMap::from([
            ("java".to_string(), env(&[multi])),
            ("py".to_string(), env(&[])),
        ]);
        let refused = check_sdk_harnesses(&limits, &validated, &options, &both)
            .expect_err("200 workers of 1 + cores harnesses each do not fit under 256");
        assert_eq!(refused.code(), tonic::Code::InvalidArgument);
        assert!(
            refused.message().contains(&format!(
                "pipeline option --num_workers: 200 worker(s) x {} SDK harness(es) per worker over 2 environment(s)",
                1 + cores
            )),
            "{}",
            refused.message()
        );
    }

    /// `--sdk_container_image` the pipeline's DOCKER environments do not
    /// use, or with no DOCKER environment, gets a note naming both.
    #[test]
    fn an_unapplied_container_image_is_noted() {
        use prost::Message;
        let options = |image: &str| Struct {
            fields: [(
                "beam:option:sdk_container_image:v1".to_string(),
                Value { kind: Some(Kind::StringValue(image.into())) },
            )]
            .into(),
        };
        let docker = |image: &str| beam::Pipeline {
            components: Some(beam::Components {
                environments: [(
                    "py".to_string(),
                    beam::Environment {
                        urn: weir_proto::urns::env::DOCKER.into(),
                        payload: beam::DockerPayload { container_image: image.into() }.encode_to_vec(),
                        ..Default::default()
                    },
                )]
                .into(),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(container_image_note(&options("my/image:1"), &docker("my/image:1")), None);
        assert_eq!(container_image_note(&Struct::default(), &docker("apache/beam:1")), None);
        let note = container_image_note(&options("my/image:1"), &docker("apache/beam:1")).unwrap();
        assert!(
            note.starts_with("--sdk_container_image=my/image:1: not applied: the pipeline's DOCKER environments ask for apache/beam:1"),
            "{note}"
        );
        let note = container_image_note(&options("my/image:1"), &beam::Pipeline::default()).unwrap();
        assert_eq!(note, "--sdk_container_image=my/image:1: has no effect on this job: none of its environments is DOCKER");
    }

    /// Past the reply limit the largest options go first, each replaced by
    /// a note; the rest stay as sent.
    #[test]
    fn get_jobs_leaves_out_the_largest_options_to_fit() {
        use prost::Message;
        let job = |id: &str, bytes: usize| beam::JobInfo {
            job_id: id.into(),
            pipeline_options: Some(Struct {
                fields: [("beam:option:x:v1".to_string(), Value { kind: Some(Kind::StringValue("x".repeat(bytes))) })]
                    .into(),
            }),
            ..Default::default()
        };
        let mut jobs = vec![job("small", 10), job("big", 5000), job("medium", 2000)];
        let kept = jobs.clone();
        fit_reply(&mut jobs, 10_000);
        assert_eq!(jobs, kept, "under the limit nothing changes");
        fit_reply(&mut jobs, 3000);
        assert_eq!((&jobs[0], &jobs[2]), (&kept[0], &kept[2]));
        let note = &jobs[1].pipeline_options.as_ref().unwrap().fields["weir:options_omitted:v1"];
        assert!(
            matches!(&note.kind, Some(Kind::StringValue(t)) if t.contains("`weir jobs describe big` shows them")),
            "{note:?}"
        );
        assert!(jobs.iter().map(|j| j.encoded_len() + 8).sum::<usize>() <= 3000);
    }
}
