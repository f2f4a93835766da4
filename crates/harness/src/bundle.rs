//! The bundle client: runs the engine's bundles on a job's SDK workers
//! (`ProcessBundleRequest` on Control, elements on Data, residuals back).

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use weir_engine::{BundleProcessor, BundleRequest, BundleResult, Completion};
use weir_plan::{StageGraph, StageKind};
use weir_proto::beam;

use crate::environment::SdkHarnesses;
use crate::metrics::JobMetrics;
use crate::registry::{BundleState, BundleUserState, FnApi, UserState, Worker};

/// Target size of one `Elements.Data` message to an SDK harness (a larger
/// element travels alone: elements are never split across messages).
const DATA_CHUNK_BYTES: usize = 1 << 20;
/// How often a running splittable bundle is checked for splitting.
const SPLIT_CHECK_INTERVAL: Duration = Duration::from_millis(500);
/// Attempts of one bundle before its stage fails a batch job (Dataflow's rule).
pub const MAX_ATTEMPTS: usize = 4;
/// Longest pause between two attempts of a bundle in a streaming job.
const MAX_RETRY_BACKOFF: Duration = Duration::from_secs(60);
/// First pause between attempts of a streaming bundle that keeps failing.
const FIRST_RETRY_BACKOFF: Duration = Duration::from_millis(500);
/// Most dynamic splits requested of one bundle.
const MAX_SPLITS_PER_BUNDLE: u32 = 16;
/// How long to wait for outputs' `is_last` after a successful bundle response.
const OUTPUT_DRAIN_TIMEOUT: Duration = Duration::from_secs(120);

/// Residuals (SDF checkpoints or split-off work), which re-enter the
/// stage's input: their elements, their least requested resume delay (ms)
/// and their least output watermark. Only residuals of a transform reading
/// the stage input can be re-scheduled.
struct Residuals {
    elements: Vec<Vec<u8>>,
    delay_ms: i64,
    watermark: Option<weir_model::Timestamp>,
}

/// One cache token per side input of `stage`, naming the contents
/// `request` reads (`SideInputs::identity`), so an SDK harness keeps what it
/// fetched across bundles until the contents change
/// (`ProcessBundleRequest.CacheToken`, beam_fn_api.proto). User state gets
/// none: a bundle's writes reach the runner only when it succeeds.
fn side_input_cache_tokens(
    job_id: &str,
    stage: &weir_plan::SdkStage,
    request: &BundleRequest,
) -> Vec<beam::process_bundle_request::CacheToken> {
    use beam::process_bundle_request::cache_token;
    let (lineage, version) = request.side_inputs.identity();
    stage
        .side_inputs
        .iter()
        .map(|s| beam::process_bundle_request::CacheToken {
            token: format!("{job_id}/side/{lineage}/{version}").into_bytes(),
            r#type: Some(cache_token::Type::SideInput(cache_token::SideInput {
                transform_id: s.transform_id.clone(),
                side_input_id: s.local_name.clone(),
            })),
        })
        .collect()
}

fn residual_elements(
    roots: Vec<beam::DelayedBundleApplication>,
    stage: &weir_plan::SdkStage,
) -> Result<Residuals, String> {
    let mut out = Residuals {
        elements: Vec::with_capacity(roots.len()),
        delay_ms: i64::MAX,
        watermark: None,
    };
    for r in roots {
        let delay = r
            .requested_time_delay
            .map(|d| d.seconds.saturating_mul(1000) + i64::from(d.nanos) / 1_000_000)
            .unwrap_or(0)
            .max(0);
        out.delay_ms = out.delay_ms.min(delay);
        let app = r.application.unwrap_or_default();
        if !stage.residual_transform_ids.contains(&app.transform_id) {
            return Err(format!(
                "residual for transform {} which does not read the stage input (Weir only re-schedules residuals of the stage's first transforms)",
                app.transform_id
            ));
        }
        for w in app.output_watermarks.values() {
            let ms = weir_model::Timestamp(
                w.seconds.saturating_mul(1000) + i64::from(w.nanos) / 1_000_000,
            );
            out.watermark = Some(
                out.watermark
                    .map_or(ms, |m: weir_model::Timestamp| m.min(ms)),
            );
        }
        out.elements.push(app.element);
    }
    if out.elements.is_empty() {
        out.delay_ms = 0;
    }
    Ok(out)
}

/// How a job's bundles are retried and watched.
#[derive(Clone, Debug, Default)]
pub struct BundlePolicy {
    /// Streaming job: a failed bundle is retried without a cap (Dataflow's
    /// streaming rule); batch: up to [`MAX_ATTEMPTS`] attempts.
    pub streaming: bool,
    /// Dataflow's `element_processing_timeout`: a bundle whose progress
    /// does not move for this long is taken to be stuck on one element; its
    /// SDK harness is restarted and the bundle retried.
    pub element_processing_timeout: Option<Duration>,
    /// The job's drain flag (DrainJob): once set, a running bundle of a
    /// splittable stage is checkpointed (`ProcessBundleSplitRequest` with
    /// fraction_of_remainder 0) and its residual handed to the engine,
    /// which sends it through the stage's drain descriptor (the SDF's
    /// `TruncateRestriction`). Without it an SDF that never stops claiming
    /// (Go's TestDrain) kept its bundle, and the job stayed DRAINING.
    pub drain: Option<Arc<std::sync::atomic::AtomicBool>>,
}

impl BundlePolicy {
    fn draining(&self) -> bool {
        self.drain
            .as_ref()
            .is_some_and(|d| d.load(Ordering::SeqCst))
    }

    /// Whether a bundle that failed `attempts` times is tried again.
    pub fn retries_after(&self, attempts: usize) -> bool {
        self.streaming || attempts < MAX_ATTEMPTS
    }

    /// Pause before attempt `attempts + 1`: none in batch (the retry goes
    /// to another or a fresh SDK harness); in streaming, where retries do
    /// not end, none for the first [`MAX_ATTEMPTS`] - 1 retries, then
    /// doubling from [`FIRST_RETRY_BACKOFF`] up to [`MAX_RETRY_BACKOFF`].
    pub fn backoff(&self, attempts: usize) -> Duration {
        if !self.streaming || attempts < MAX_ATTEMPTS {
            return Duration::ZERO;
        }
        let doublings = (attempts - MAX_ATTEMPTS).min(16) as u32;
        FIRST_RETRY_BACKOFF
            .saturating_mul(1 << doublings)
            .min(MAX_RETRY_BACKOFF)
    }

    /// Whether the job's messages hear of failed attempt `attempts` of a
    /// streaming bundle: the [`MAX_ATTEMPTS`]th, then every doubling.
    pub fn reports_failure(&self, attempts: usize) -> bool {
        self.streaming
            && attempts >= MAX_ATTEMPTS
            && (attempts / MAX_ATTEMPTS).is_power_of_two()
            && attempts % MAX_ATTEMPTS == 0
    }

    /// How often a running bundle's progress is asked for: a quarter of the
    /// timeout, between 100 ms and 10 s.
    pub fn progress_interval(&self) -> Option<Duration> {
        self.element_processing_timeout
            .map(|t| (t / 4).clamp(Duration::from_millis(100), Duration::from_secs(10)))
    }
}

/// A failed attempt: the message, and whether the attempt was stuck.
enum Failure {
    Error(String),
    /// No progress for the element processing timeout; the message names
    /// the transform.
    Stuck(String),
}

impl From<String> for Failure {
    fn from(e: String) -> Self {
        Failure::Error(e)
    }
}

/// The first `n` lines of `text` (an SDK error with a long traceback).
fn first_lines(text: &str, n: usize) -> String {
    let mut lines = text.lines();
    let mut out: Vec<&str> = lines.by_ref().take(n).collect();
    if lines.next().is_some() {
        out.push("[...]");
    }
    out.join("\n")
}

/// A duration the way a user writes it: `45s`, `2m`, `3m30s`, `250ms`.
pub fn human_duration(d: Duration) -> String {
    let secs = d.as_secs();
    if secs == 0 {
        return format!("{}ms", d.as_millis());
    }
    match (secs / 60, secs % 60) {
        (0, s) => format!("{s}s"),
        (m, 0) => format!("{m}m"),
        (m, s) => format!("{m}m{s}s"),
    }
}

/// A job's SDK workers by environment; the engine's [`BundleProcessor`].
#[derive(Clone)]
pub struct JobWorkers {
    inner: Arc<Inner>,
}

struct Inner {
    fn_api: Arc<FnApi>,
    job_id: String,
    graph: Arc<StageGraph>,
    harnesses: Arc<SdkHarnesses>,
    runtime: tokio::runtime::Handle,
    metrics: Arc<JobMetrics>,
    user_state: Arc<UserState>,
    /// Serializes reports of the live user-state cell count, so the last
    /// report is the last count; holds the timestamp (ms) of the last one.
    state_report: Mutex<i64>,
    policy: BundlePolicy,
}

impl JobWorkers {
    /// Runs bundles on the job's started SDK harnesses under `policy`;
    /// bundle MonitoringInfos are added to `metrics`. Descriptor ids
    /// registered with `fn_api` must be `descriptor_id(job_id, stage_id)`.
    pub fn new(
        fn_api: Arc<FnApi>,
        job_id: String,
        graph: Arc<StageGraph>,
        harnesses: Arc<SdkHarnesses>,
        runtime: tokio::runtime::Handle,
        metrics: Arc<JobMetrics>,
        policy: BundlePolicy,
    ) -> Self {
        JobWorkers {
            inner: Arc::new(Inner {
                fn_api,
                job_id,
                graph,
                harnesses,
                runtime,
                metrics,
                user_state: Arc::default(),
                state_report: Mutex::new(0),
                policy,
            }),
        }
    }

    /// The descriptor id of stage `stage_id` of job `job_id`, unique across jobs.
    pub fn descriptor_id(job_id: &str, stage_id: &str) -> String {
        format!("{job_id}/{stage_id}")
    }
}

/// One progress MonitoringInfo: URN, sorted labels, payload.
type Signal = (String, Vec<(String, String)>, Vec<u8>);

/// Progress of one running bundle, as Weir judges it for the element
/// processing timeout. The signal is what moves when an element finishes:
/// the SDK's element counts per PCollection (`beam:metric:element_count:v1`),
/// sampled byte sizes and SDF work completed, from `ProcessBundleProgress`
/// responses, and the output bytes the runner has received for the bundle.
/// Execution-time metrics grow while an element is stuck and are left out of
/// the signal; the transform whose `process_bundle_msecs` grew most since
/// the last movement is the one named as stuck.
#[derive(Debug)]
pub struct Progress {
    /// The progress infos and output bytes at the last observation.
    last_signal: Option<(Vec<Signal>, usize)>,
    last_change: std::time::Instant,
    msecs_at_change: HashMap<String, u64>,
    msecs_now: HashMap<String, u64>,
}

const PROGRESS_URNS: &[&str] = &[
    weir_proto::urns::monitoring::ELEMENT_COUNT,
    "beam:metric:sampled_byte_size:v1",
    "beam:metric:ptransform_progress:completed:v1",
];
const PROCESS_MSECS_URN: &str = "beam:metric:pardo_execution_time:process_bundle_msecs:v1";

impl Progress {
    /// A bundle that started at `start` (no progress seen yet).
    pub fn new(start: std::time::Instant) -> Self {
        Progress {
            last_signal: None,
            last_change: start,
            msecs_at_change: HashMap::new(),
            msecs_now: HashMap::new(),
        }
    }

    /// Records one observation at `now`: the progress response's
    /// MonitoringInfos (`None` when the SDK did not answer) and the output
    /// bytes received so far.
    pub fn observe(
        &mut self,
        now: std::time::Instant,
        infos: Option<&[beam::MonitoringInfo]>,
        output_bytes: usize,
    ) {
        let mut signal = vec![];
        if let Some(infos) = infos {
            for i in infos {
                if PROGRESS_URNS.contains(&i.urn.as_str()) {
                    let mut labels: Vec<(String, String)> = i
                        .labels
                        .iter()
                        .map(|(k, v)| (k.clone(), v.clone()))
                        .collect();
                    labels.sort();
                    signal.push((i.urn.clone(), labels, i.payload.clone()));
                } else if i.urn == PROCESS_MSECS_URN {
                    if let (Some(t), Ok(ms)) = (
                        i.labels.get("PTRANSFORM"),
                        prost::encoding::decode_varint(&mut i.payload.as_slice()),
                    ) {
                        self.msecs_now.insert(t.clone(), ms);
                    }
                }
            }
            signal.sort();
        }
        // Without an answer only the output bytes can show movement.
        let signal = match (infos, &self.last_signal) {
            (None, Some((previous, _))) => previous.clone(),
            _ => signal,
        };
        let current = (signal, output_bytes);
        let moved = match &self.last_signal {
            // The first answer is movement when it shows any work done.
            None => infos.is_some_and(|_| !current.0.is_empty()) || output_bytes > 0,
            Some(previous) => *previous != current,
        };
        if moved {
            self.last_change = now;
            self.msecs_at_change = self.msecs_now.clone();
        }
        if infos.is_some() || moved {
            self.last_signal = Some(current);
        }
    }

    /// How long the progress has not moved, at `now`.
    pub fn stalled_for(&self, now: std::time::Instant) -> Duration {
        now.saturating_duration_since(self.last_change)
    }

    /// The transform id whose processing time grew most since the last
    /// movement, if the SDK reports processing times.
    pub fn busiest_transform(&self) -> Option<String> {
        self.msecs_now
            .iter()
            .map(|(t, ms)| {
                (
                    ms.saturating_sub(*self.msecs_at_change.get(t).unwrap_or(&0)),
                    t,
                )
            })
            .filter(|(grew, _)| *grew > 0)
            .max()
            .map(|(_, t)| t.clone())
    }
}

impl BundleProcessor for JobWorkers {
    fn process_bundle(&self, request: BundleRequest, done: Completion) {
        let inner = self.inner.clone();
        self.inner.runtime.spawn(async move {
            let result = inner.run(request).await;
            done(result);
        });
    }

    /// Deletes the user state of the stage's expired windows (see
    /// [`UserState::expire`]). Cells are those of the transforms reading the
    /// stage input (`residual_transform_ids`): a stateful DoFn always starts
    /// a stage (fusion), so they hold every stateful transform of the stage,
    /// and the stage input's window coder and allowed lateness are theirs.
    fn expire_user_state(&self, stage: usize, input_watermark: weir_model::Timestamp) {
        let Some(StageKind::Sdk(s)) = self.inner.graph.stages.get(stage).map(|s| &s.kind) else {
            return;
        };
        let Some(input) = self.inner.graph.pcollections.get(s.input) else {
            return;
        };
        let removed = self.inner.user_state.expire(
            &s.residual_transform_ids,
            &input.window_coder,
            input.windowing.allowed_lateness_ms,
            input_watermark,
        );
        if removed > 0 {
            tracing::debug!(job = %self.inner.job_id, stage = %self.inner.graph.stages[stage].name, removed, watermark = input_watermark.millis(), "expired user state");
            self.inner.report_state_cells();
        }
    }
}

impl Inner {
    /// Reports the job's live user-state cells and their peak as the
    /// [`crate::user_state::LIVE_CELLS_URN`] and
    /// [`crate::user_state::PEAK_LIVE_CELLS_URN`] gauges of its metrics.
    fn report_state_cells(&self) {
        let mut last = self.state_report.lock().unwrap_or_else(|p| p.into_inner());
        // Gauges keep the report with the latest timestamp: never go back.
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64)
            .max(*last);
        *last = now;
        let gauge = |urn: &str, value: usize| {
            let mut payload = Vec::new();
            weir_model::varint::encode_varint(now, &mut payload);
            weir_model::varint::encode_varint(value as i64, &mut payload);
            beam::MonitoringInfo {
                urn: urn.to_string(),
                r#type: weir_proto::urns::monitoring::TYPE_LATEST_INT64.to_string(),
                payload,
                ..Default::default()
            }
        };
        self.metrics.add(&[
            gauge(
                crate::user_state::LIVE_CELLS_URN,
                self.user_state.live_cells(),
            ),
            gauge(
                crate::user_state::PEAK_LIVE_CELLS_URN,
                self.user_state.peak_cells(),
            ),
        ]);
    }
}

impl Inner {
    /// Runs a bundle, retrying a failed attempt on the least busy SDK
    /// worker (a fresh one when its worker died or was stuck): up to
    /// [`MAX_ATTEMPTS`] attempts in batch, without a cap in streaming, as
    /// Dataflow does. Outputs, timers, user state and metrics of a failed
    /// attempt are discarded, so a retry duplicates nothing. A bundle that
    /// already handed split-off work to the engine is not retried (the
    /// retry would redo that work).
    async fn run(&self, request: BundleRequest) -> Result<BundleResult, String> {
        let mut attempts = 0;
        let last = loop {
            attempts += 1;
            let started = std::time::Instant::now();
            match self.attempt(&request).await {
                Ok(r) => {
                    tracing::debug!(stage = %request.stage_id, elements = request.input.len(), ms = started.elapsed().as_millis() as u64, "bundle done");
                    return Ok(r);
                }
                Err((e, split_handed_over)) => {
                    tracing::warn!(job = %self.job_id, stage = %request.stage_name, attempt = attempts, "bundle failed: {e}");
                    if split_handed_over
                        || !self.policy.retries_after(attempts)
                        || self.harnesses.is_stopping()
                    {
                        break e;
                    }
                    self.metrics.bundle_retried(request.stage);
                    let pause = self.policy.backoff(attempts);
                    if self.policy.streaming && attempts >= MAX_ATTEMPTS {
                        tracing::warn!(job = %self.job_id, stage = %request.stage_name, "streaming: retrying a bundle that failed {attempts} times in {}", human_duration(pause));
                    }
                    if self.policy.reports_failure(attempts) {
                        self.harnesses.note(
                            crate::WorkerLog::Warning,
                            format!(
                                "streaming: a bundle of stage {} keeps failing ({attempts} attempts so far; retrying in {}, backing off up to {}); last error: {}",
                                request.stage_name,
                                human_duration(pause),
                                human_duration(MAX_RETRY_BACKOFF),
                                first_lines(&e, 20)
                            ),
                        );
                    }
                    tokio::time::sleep(pause).await;
                }
            }
        };
        Err(if attempts > 1 {
            format!("bundle failed {attempts} times; last error: {last}")
        } else {
            last
        })
    }

    /// One attempt; on failure also says whether split-off work was handed to the engine.
    async fn attempt(&self, request: &BundleRequest) -> Result<BundleResult, (String, bool)> {
        let stage = match &self.graph.stages[request.stage].kind {
            StageKind::Sdk(stage) => stage,
            StageKind::GroupByKey {
                merge_windows: Some(stage),
                ..
            } => &**stage,
            _ => {
                return Err((
                    format!("stage {} runs no SDK bundles", request.stage_name),
                    false,
                ))
            }
        };
        let worker = self
            .harnesses
            .pick(&stage.environment_id)
            .await
            .map_err(|e| (e, false))?;
        // Unguessable: state requests, data and results are accepted only
        // for instructions issued to the worker that sends them.
        let instruction_id = self.fn_api.fresh_id(&format!("{}-bundle-", self.job_id));
        let sinks = stage.output_transform_ids.len();
        let streams = sinks + stage.timer_families.len();
        let bundle = Arc::new(BundleState {
            worker_id: worker.id.clone(),
            descriptor_id: JobWorkers::descriptor_id(&self.job_id, &request.stage_id),
            side_inputs: request.side_inputs.clone(),
            user_state: BundleUserState::new(self.user_state.clone()),
            sink_index: stage
                .output_transform_ids
                .iter()
                .enumerate()
                .map(|(i, t)| (t.clone(), i))
                .collect(),
            timer_index: stage
                .timer_families
                .iter()
                .enumerate()
                .map(|(i, f)| ((f.transform_id.clone(), f.family_id.clone()), sinks + i))
                .collect(),
            outputs: Mutex::new((vec![Vec::new(); streams], streams)),
            all_last: tokio::sync::Notify::new(),
            split_handed_over: std::sync::atomic::AtomicBool::new(false),
        });
        self.fn_api
            .bundles
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(instruction_id.clone(), bundle.clone());
        let result = self
            .exchange(&worker, &instruction_id, request, stage, &bundle, sinks)
            .await;
        self.harnesses.release(&worker);
        let result = result.map_err(|f| match f {
            Failure::Error(e) => e,
            Failure::Stuck(what) => {
                // Dataflow restarts the SDK harness of a stuck element.
                self.harnesses.replace(
                    &stage.environment_id,
                    &worker,
                    what.clone(),
                    Duration::ZERO,
                );
                format!("SDK harness {} {what}; it was restarted", worker.id)
            }
        });
        self.fn_api
            .bundles
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&instruction_id);
        match result {
            Ok(r) => {
                bundle.user_state.commit();
                if stage.stateful {
                    self.report_state_cells();
                }
                Ok(r)
            }
            Err(e) => Err((e, bundle.split_handed_over.load(Ordering::Relaxed))),
        }
    }

    /// Waits for the bundle's response, meanwhile:
    /// * for a splittable stage whose bundle holds one element, asks the SDK
    ///   to split the rest of the element in half whenever another SDK worker
    ///   sits idle (`ProcessBundleSplitRequest`, fraction_of_remainder 0.5),
    ///   and hands the residuals to the engine at once so the idle worker
    ///   takes them;
    /// * with an element processing timeout, watches the bundle's progress
    ///   ([`Progress`]) and gives up on it ([`Failure::Stuck`]) when the
    ///   progress has not moved for the timeout.
    async fn await_response(
        &self,
        worker: &Worker,
        instruction_id: &str,
        request: &BundleRequest,
        stage: &weir_plan::SdkStage,
        bundle: &BundleState,
        mut response: tokio::sync::oneshot::Receiver<beam::InstructionResponse>,
    ) -> Result<beam::InstructionResponse, Failure> {
        let gone = || Failure::Error(format!("SDK harness {} went away", worker.id));
        let drainable = stage.splittable && self.policy.drain.is_some();
        let splittable = stage.splittable && request.input.len() == 1 || drainable;
        // Progress is watched only with an element processing timeout.
        let watch = self
            .policy
            .element_processing_timeout
            .zip(self.policy.progress_interval());
        let tick = match watch {
            None if !splittable => return response.await.map_err(|_| gone()),
            None => SPLIT_CHECK_INTERVAL,
            Some((_, every)) if splittable => every.min(SPLIT_CHECK_INTERVAL),
            Some((_, every)) => every,
        };
        let mut progress = Progress::new(std::time::Instant::now());
        let mut last_poll = std::time::Instant::now();
        let mut polls = 0u32;
        let mut splits = 0u32;
        loop {
            tokio::select! {
                r = &mut response => return r.map_err(|_| gone()),
                _ = tokio::time::sleep(tick) => {}
            }
            if drainable && self.policy.draining() {
                if splits < MAX_SPLITS_PER_BUNDLE {
                    splits = MAX_SPLITS_PER_BUNDLE;
                    self.split(worker, instruction_id, request, stage, bundle, 0.0, splits)
                        .await?;
                }
            } else if splittable && request.input.len() == 1 {
                splits = self
                    .maybe_split(worker, instruction_id, request, stage, bundle, splits)
                    .await?;
            }
            let Some((timeout, progress_every)) = watch else {
                continue;
            };
            if last_poll.elapsed() < progress_every {
                continue;
            }
            last_poll = std::time::Instant::now();
            polls += 1;
            let infos = self
                .poll_progress(worker, instruction_id, polls, progress_every)
                .await;
            let received = bundle
                .outputs
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .0
                .iter()
                .map(Vec::len)
                .sum();
            let now = std::time::Instant::now();
            progress.observe(now, infos.as_deref(), received);
            if progress.stalled_for(now) >= timeout {
                let transform = progress
                    .busiest_transform()
                    .and_then(|id| self.transform_name(&request.stage_id, &id))
                    .unwrap_or_else(|| request.stage_name.clone());
                return Err(Failure::Stuck(format!(
                    "was stuck: an element of transform {transform} made no progress for {} (element processing timeout {})",
                    human_duration(progress.stalled_for(now)),
                    human_duration(timeout)
                )));
            }
        }
    }

    /// The descriptor id a bundle runs under: the stage's, or for a later
    /// side-input generation (see `BundleRequest::side_input_generation`) a
    /// copy of it registered on first use under `<stage's id>@side<N>`.
    fn descriptor_for(&self, request: &BundleRequest) -> Result<String, Failure> {
        let base = JobWorkers::descriptor_id(&self.job_id, &request.stage_id);
        if request.side_input_generation == 0 {
            return Ok(base);
        }
        let id = format!("{base}@side{}", request.side_input_generation);
        if self.fn_api.descriptor(&id).is_none() {
            let mut d = self.fn_api.descriptor(&base).ok_or_else(|| {
                Failure::Error(format!(
                    "no ProcessBundleDescriptor registered for stage {}",
                    request.stage_id
                ))
            })?;
            d.id = id.clone();
            self.fn_api.add_descriptors([d]);
        }
        Ok(id)
    }

    /// The user's name of transform `id` in stage `stage_id`'s descriptor.
    fn transform_name(&self, stage_id: &str, id: &str) -> Option<String> {
        let d = self
            .fn_api
            .descriptor(&JobWorkers::descriptor_id(&self.job_id, stage_id))?;
        d.transforms
            .get(id)
            .map(|t| t.unique_name.clone())
            .filter(|n| !n.is_empty())
    }

    /// Asks for the bundle's progress; `None` when the SDK did not answer
    /// within `wait` or answered with an error.
    async fn poll_progress(
        &self,
        worker: &Worker,
        instruction_id: &str,
        n: u32,
        wait: Duration,
    ) -> Option<Vec<beam::MonitoringInfo>> {
        let id = format!("{instruction_id}-progress-{n}");
        let rx = worker
            .send(beam::InstructionRequest {
                instruction_id: id.clone(),
                request: Some(beam::instruction_request::Request::ProcessBundleProgress(
                    beam::ProcessBundleProgressRequest {
                        instruction_id: instruction_id.to_string(),
                    },
                )),
            })
            .ok()?;
        match tokio::time::timeout(wait, rx).await {
            Ok(Ok(r)) if r.error.is_empty() => match r.response {
                Some(beam::instruction_response::Response::ProcessBundleProgress(p)) => {
                    Some(p.monitoring_infos)
                }
                _ => None,
            },
            Ok(_) => None,
            Err(_) => {
                worker
                    .pending
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .remove(&id);
                None
            }
        }
    }

    /// Splits the running bundle in half when another worker is idle and
    /// fewer than [`MAX_SPLITS_PER_BUNDLE`] splits were asked; returns the
    /// number of splits asked so far.
    async fn maybe_split(
        &self,
        worker: &Worker,
        instruction_id: &str,
        request: &BundleRequest,
        stage: &weir_plan::SdkStage,
        bundle: &BundleState,
        mut splits: u32,
    ) -> Result<u32, Failure> {
        if splits >= MAX_SPLITS_PER_BUNDLE
            || !self
                .harnesses
                .has_idle_worker(&stage.environment_id, &worker.id)
        {
            return Ok(splits);
        }
        splits += 1;
        self.split(worker, instruction_id, request, stage, bundle, 0.5, splits)
            .await?;
        Ok(splits)
    }

    /// Asks the SDK to split the running bundle, keeping
    /// `fraction_of_remainder` of what is left (0: a checkpoint, everything
    /// not yet claimed goes to the residual), and hands the residuals (and
    /// the input elements the SDK has not started) to the engine.
    #[allow(clippy::too_many_arguments)]
    async fn split(
        &self,
        worker: &Worker,
        instruction_id: &str,
        request: &BundleRequest,
        stage: &weir_plan::SdkStage,
        bundle: &BundleState,
        fraction_of_remainder: f64,
        nth: u32,
    ) -> Result<(), Failure> {
        let split = worker.send(beam::InstructionRequest {
            instruction_id: format!("{instruction_id}-split-{nth}"),
            request: Some(beam::instruction_request::Request::ProcessBundleSplit(
                beam::ProcessBundleSplitRequest {
                    instruction_id: instruction_id.to_string(),
                    desired_splits: [(
                        stage.input_transform_id.clone(),
                        beam::process_bundle_split_request::DesiredSplit {
                            fraction_of_remainder,
                            allowed_split_points: vec![],
                            estimated_input_elements: request.input.len() as i64,
                        },
                    )]
                    .into_iter()
                    .collect(),
                },
            )),
        })?;
        let Ok(split) = split.await else {
            return Err(Failure::Error(format!(
                "SDK harness {} went away",
                worker.id
            )));
        };
        let Some(beam::instruction_response::Response::ProcessBundleSplit(split)) = split.response
        else {
            return Ok(()); // the bundle finished first, or the SDK declined
        };
        let mut residuals = residual_elements(split.residual_roots, stage)?.elements;
        // Input elements from the first residual one on are left to the
        // runner (a split at the element boundary returns the element the
        // SDK was at): schedule them again as a whole.
        if let Some(first) = split
            .channel_splits
            .iter()
            .filter(|c| c.transform_id == stage.input_transform_id)
            .map(|c| c.first_residual_element.max(0) as usize)
            .min()
        {
            residuals.extend(request.input.iter().skip(first).cloned());
        }
        if !residuals.is_empty() {
            tracing::info!(worker = %worker.id, bundle = %instruction_id, "split off {} residual(s) (fraction of remainder {fraction_of_remainder})", residuals.len());
            bundle.split_handed_over.store(true, Ordering::Relaxed);
            (request.on_split)(residuals);
        }
        Ok(())
    }

    async fn exchange(
        &self,
        worker: &Worker,
        instruction_id: &str,
        request: &BundleRequest,
        stage: &weir_plan::SdkStage,
        bundle: &BundleState,
        sinks: usize,
    ) -> Result<BundleResult, Failure> {
        let mut response = worker.send(beam::InstructionRequest {
            instruction_id: instruction_id.to_string(),
            request: Some(beam::instruction_request::Request::ProcessBundle(
                beam::ProcessBundleRequest {
                    process_bundle_descriptor_id: self.descriptor_for(request)?,
                    cache_tokens: side_input_cache_tokens(&self.job_id, stage, request),
                    ..Default::default()
                },
            )),
        })?;
        let data = |chunk: &[u8], is_last: bool| beam::Elements {
            data: vec![beam::elements::Data {
                instruction_id: instruction_id.to_string(),
                transform_id: stage.input_transform_id.clone(),
                data: chunk.to_vec(),
                is_last,
            }],
            timers: vec![],
        };
        // SDK harnesses open their data stream when their first bundle needs it.
        // A bundle the SDK fails before it opens the stream (a DoFn whose
        // setup raises, a descriptor it cannot build), or a harness that
        // dies meanwhile, answers on the control stream: that answer ends
        // the attempt at once, with the SDK's own error text.
        let mut data_ready = worker.data_connected.subscribe();
        tokio::select! {
            opened = tokio::time::timeout(OUTPUT_DRAIN_TIMEOUT, data_ready.wait_for(|c| *c)) => {
                if opened.is_err() {
                    return Err(format!(
                        "SDK harness {} never opened its data stream (waited {})",
                        worker.id,
                        human_duration(OUTPUT_DRAIN_TIMEOUT)
                    )
                    .into());
                }
            }
            early = &mut response => {
                return Err(match early {
                    Ok(r) if !r.error.is_empty() => r.error.into(),
                    Ok(_) => format!(
                        "SDK harness {} answered bundle {instruction_id} before opening its data stream",
                        worker.id
                    )
                    .into(),
                    Err(_) => format!("SDK harness {} went away", worker.id).into(),
                });
            }
        }
        // Whole elements only in each Data message, about DATA_CHUNK_BYTES each.
        let mut chunk = Vec::new();
        for element in &request.input {
            if !chunk.is_empty() && chunk.len() + element.len() > DATA_CHUNK_BYTES {
                worker.send_data(data(&chunk, false))?;
                chunk.clear();
            }
            chunk.extend_from_slice(element);
        }
        if !chunk.is_empty() {
            worker.send_data(data(&chunk, false))?;
        }
        worker.send_data(data(&[], true))?;
        // Every timer family is an input stream of the bundle, ended by an
        // empty is_last message (SDKs drop the payload of an is_last message).
        if !stage.timer_families.is_empty() {
            let timers = |is_last: bool| {
                stage
                    .timer_families
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| {
                        is_last
                            || request
                                .timers
                                .get(*i)
                                .map(|t| !t.is_empty())
                                .unwrap_or(false)
                    })
                    .map(|(i, f)| beam::elements::Timers {
                        instruction_id: instruction_id.to_string(),
                        transform_id: f.transform_id.clone(),
                        timer_family_id: f.family_id.clone(),
                        timers: if is_last {
                            vec![]
                        } else {
                            request.timers[i].clone()
                        },
                        is_last,
                    })
                    .collect::<Vec<_>>()
            };
            let fired = timers(false);
            if !fired.is_empty() {
                worker.send_data(beam::Elements {
                    data: vec![],
                    timers: fired,
                })?;
            }
            worker.send_data(beam::Elements {
                data: vec![],
                timers: timers(true),
            })?;
        }

        let response = self
            .await_response(worker, instruction_id, request, stage, bundle, response)
            .await?;
        if !response.error.is_empty() {
            return Err(response.error.into());
        }
        let Some(beam::instruction_response::Response::ProcessBundle(pb)) = response.response
        else {
            return Err(format!(
                "SDK harness {} answered a bundle with something else",
                worker.id
            )
            .into());
        };
        // Wait for every sink's is_last (the data stream may lag the control stream).
        loop {
            let notified = bundle.all_last.notified();
            if bundle.outputs.lock().unwrap_or_else(|p| p.into_inner()).1 == 0 {
                break;
            }
            let mut connected = worker.connected.subscribe();
            tokio::select! {
                waited = tokio::time::timeout(OUTPUT_DRAIN_TIMEOUT, notified) => {
                    if waited.is_err() {
                        return Err(format!(
                            "SDK harness {} never finished sending outputs of bundle {instruction_id}",
                            worker.id
                        )
                        .into());
                    }
                }
                _ = connected.wait_for(|c| !*c) => {
                    if bundle.outputs.lock().unwrap_or_else(|p| p.into_inner()).1 != 0 {
                        return Err(format!(
                            "SDK harness {} went away before it finished sending outputs of bundle {instruction_id}",
                            worker.id
                        )
                        .into());
                    }
                }
            }
        }
        let residuals = residual_elements(pb.residual_roots, stage)?;
        self.metrics.add(&pb.monitoring_infos);
        if pb.requires_finalization {
            // Outputs are in the runner's hands: run the bundle's finalization
            // callbacks (beam:requirement:pardo:finalization:v1). A failing
            // callback does not fail the job, as in Beam's other runners.
            let finalize = worker.send(beam::InstructionRequest {
                instruction_id: format!("{instruction_id}-finalize"),
                request: Some(beam::instruction_request::Request::FinalizeBundle(
                    beam::FinalizeBundleRequest {
                        instruction_id: instruction_id.to_string(),
                    },
                )),
            })?;
            match finalize.await {
                Ok(r) if !r.error.is_empty() => {
                    tracing::warn!(worker = %worker.id, "bundle finalization of {instruction_id} failed: {}", r.error);
                    (worker.log)(
                        crate::WorkerLog::Warning,
                        format!("bundle finalization callback failed: {}", r.error),
                    );
                }
                Ok(_) => {}
                Err(_) => {
                    return Err(format!(
                        "SDK harness {} went away during bundle finalization",
                        worker.id
                    )
                    .into())
                }
            }
        }
        let mut outputs =
            std::mem::take(&mut bundle.outputs.lock().unwrap_or_else(|p| p.into_inner()).0);
        let timers = outputs.split_off(sinks.min(outputs.len()));
        Ok(BundleResult {
            outputs,
            residuals: residuals.elements,
            residual_delay_ms: residuals.delay_ms,
            residual_watermark: residuals.watermark,
            timers,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    fn info(urn: &str, label: (&str, &str), value: u64) -> beam::MonitoringInfo {
        let mut payload = vec![];
        prost::encoding::encode_varint(value, &mut payload);
        beam::MonitoringInfo {
            urn: urn.to_string(),
            labels: [(label.0.to_string(), label.1.to_string())]
                .into_iter()
                .collect(),
            payload,
            ..Default::default()
        }
    }

    fn count(pcoll: &str, n: u64) -> beam::MonitoringInfo {
        info(
            weir_proto::urns::monitoring::ELEMENT_COUNT,
            ("PCOLLECTION", pcoll),
            n,
        )
    }

    fn msecs(transform: &str, n: u64) -> beam::MonitoringInfo {
        info(PROCESS_MSECS_URN, ("PTRANSFORM", transform), n)
    }

    #[test]
    fn progress_moves_with_element_counts_and_output_not_with_time() {
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let mut p = Progress::new(t0);
        p.observe(
            at(1),
            Some(&[count("in", 1), msecs("a", 10), msecs("b", 5)]),
            0,
        );
        assert_eq!(
            p.stalled_for(at(1)),
            Duration::ZERO,
            "first answer shows work done"
        );
        // Only processing time grows: no progress; b is the busy transform.
        p.observe(
            at(2),
            Some(&[count("in", 1), msecs("a", 10), msecs("b", 900)]),
            0,
        );
        p.observe(
            at(4),
            Some(&[count("in", 1), msecs("a", 10), msecs("b", 2900)]),
            0,
        );
        assert_eq!(p.stalled_for(at(4)), Duration::from_secs(3));
        assert_eq!(p.busiest_transform().as_deref(), Some("b"));
        // No answer at all is no progress either.
        p.observe(at(5), None, 0);
        assert_eq!(p.stalled_for(at(5)), Duration::from_secs(4));
        // Output bytes received move it, answer or not.
        p.observe(at(6), None, 100);
        assert_eq!(p.stalled_for(at(7)), Duration::from_secs(1));
        // So does a new element count.
        p.observe(
            at(8),
            Some(&[count("in", 2), msecs("a", 10), msecs("b", 3000)]),
            100,
        );
        assert_eq!(p.stalled_for(at(8)), Duration::ZERO);
        assert_eq!(
            p.busiest_transform(),
            None,
            "nothing grew since the movement"
        );
    }

    #[test]
    fn stuck_from_the_start_counts_from_the_bundle_start() {
        let t0 = Instant::now();
        let mut p = Progress::new(t0);
        p.observe(t0 + Duration::from_secs(2), Some(&[]), 0);
        p.observe(t0 + Duration::from_secs(4), Some(&[]), 0);
        assert_eq!(
            p.stalled_for(t0 + Duration::from_secs(4)),
            Duration::from_secs(4)
        );
    }

    #[test]
    fn batch_caps_attempts_and_streaming_does_not() {
        let batch = BundlePolicy::default();
        assert!(batch.retries_after(1) && batch.retries_after(3));
        assert!(!batch.retries_after(MAX_ATTEMPTS));
        assert_eq!(batch.backoff(3), Duration::ZERO);
        let streaming = BundlePolicy {
            streaming: true,
            ..Default::default()
        };
        assert!(streaming.retries_after(MAX_ATTEMPTS) && streaming.retries_after(1000));
        assert_eq!(streaming.backoff(2), Duration::ZERO);
        // Exponential from the 4th failure, capped.
        let pauses: Vec<u128> = (4..=13).map(|n| streaming.backoff(n).as_millis()).collect();
        assert_eq!(
            pauses,
            [500, 1000, 2000, 4000, 8000, 16000, 32000, 60000, 60000, 60000]
        );
        assert_eq!(streaming.backoff(1000), MAX_RETRY_BACKOFF);
        assert_eq!(streaming.backoff(usize::MAX), MAX_RETRY_BACKOFF);
        // The job hears of the 4th, 8th, 16th, 32nd... failure.
        let reported: Vec<usize> = (1..=70).filter(|&n| streaming.reports_failure(n)).collect();
        assert_eq!(reported, [4, 8, 16, 32, 64]);
        assert!(!batch.reports_failure(4));
    }

    #[test]
    fn progress_is_polled_four_times_per_timeout_within_bounds() {
        let every = |secs| {
            BundlePolicy {
                element_processing_timeout: Some(Duration::from_secs(secs)),
                ..Default::default()
            }
            .progress_interval()
        };
        assert_eq!(every(3), Some(Duration::from_millis(750)));
        assert_eq!(every(180), Some(Duration::from_secs(10)));
        assert_eq!(BundlePolicy::default().progress_interval(), None);
    }

    #[test]
    fn durations_read_like_go_durations() {
        assert_eq!(human_duration(Duration::from_secs(3)), "3s");
        assert_eq!(human_duration(Duration::from_secs(180)), "3m");
        assert_eq!(human_duration(Duration::from_secs(210)), "3m30s");
        assert_eq!(human_duration(Duration::from_millis(250)), "250ms");
    }
}
