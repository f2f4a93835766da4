//! The bundle client: runs the engine's bundles on a job's SDK workers
//! (`ProcessBundleRequest` on Control, elements on Data, residuals back).
//!
//! Here: [`JobWorkers`] (the engine's [`BundleProcessor`]) and the attempt
//! loop of one bundle. Beside it: `policy` (retries and backoff), `exchange`
//! (the Fn API exchange of one attempt), `splits` (dynamic splits and the
//! drain checkpoint), `residuals` (residual decoding) and `progress`
//! (progress polls and stuck detection).

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use weir_engine::{BundleProcessor, BundleRequest, BundleResult, Completion};
use weir_plan::{StageGraph, StageKind};
use weir_proto::beam;

use crate::environment::SdkHarnesses;
use crate::metrics::JobMetrics;
use crate::registry::{BundleState, BundleUserState, ByteChunks, FnApi};
use weir_engine::user_state::StateUsage;

mod exchange;
mod policy;
mod progress;
mod residuals;
mod splits;

pub use policy::{human_duration, BundlePolicy, MAX_ATTEMPTS};
pub use progress::Progress;

use policy::{first_lines, MAX_RETRY_BACKOFF};

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

impl BundleProcessor for JobWorkers {
    fn process_bundle(&self, request: BundleRequest, done: Completion) {
        let inner = self.inner.clone();
        self.inner.runtime.spawn(async move {
            let result = inner.run(request).await;
            done(result);
        });
    }

    /// One bundle where each SDK harness of the stage's environment is a
    /// process that runs bundles on one core (a Python harness of its own,
    /// see [`crate::environment::SdkHarnesses::one_core_process`]): bundles in it only take
    /// turns at one interpreter, the SDK's fixed cost per bundle (a lifted
    /// combiner's flush, a side input's fetch) is paid once, and an idle
    /// harness, or the bundle's own one while its core is partly idle,
    /// takes the restrictions split off (see `Inner::maybe_split`). Not in the client's
    /// in-process pool, whose concurrent bundles overlap their waits, nor
    /// for an SDK that runs bundles on many cores.
    fn restrictions_in_one_bundle(&self, stage: usize) -> bool {
        match self.inner.graph.stages.get(stage).map(|s| &s.kind) {
            Some(StageKind::Sdk(sdk)) => {
                sdk.splittable && self.inner.harnesses.one_core_process(&sdk.environment_id)
            }
            _ => false,
        }
    }

    /// Reports the job's live user-state cells once the engine deleted some
    /// (the engine logs the expiry itself).
    fn user_state_expired(
        &self,
        _stage: usize,
        _input_watermark: weir_model::Timestamp,
        removed: usize,
        cells: &StateUsage,
    ) {
        if removed > 0 {
            self.inner.report_state_cells(cells);
        }
    }
}

impl Inner {
    /// Reports the job's live user-state cells and bytes and their peaks
    /// (`cells`, the job's usage in this process) as the
    /// [`crate::metrics::LIVE_CELLS_URN`], [`crate::metrics::PEAK_LIVE_CELLS_URN`],
    /// [`crate::metrics::LIVE_BYTES_URN`] and
    /// [`crate::metrics::PEAK_LIVE_BYTES_URN`] gauges of its metrics.
    fn report_state_cells(&self, cells: &StateUsage) {
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
            gauge(crate::metrics::LIVE_CELLS_URN, cells.live()),
            gauge(crate::metrics::PEAK_LIVE_CELLS_URN, cells.peak()),
            gauge(crate::metrics::LIVE_BYTES_URN, cells.bytes()),
            gauge(crate::metrics::PEAK_LIVE_BYTES_URN, cells.peak_bytes()),
        ]);
    }
}

/// Why an attempt of a bundle failed.
struct AttemptFailure {
    message: String,
    /// Whether a retry may follow: not when the attempt handed residual
    /// restrictions to the engine (the retry would redo that work), nor
    /// when it was refused user state past the job's budget (the retry
    /// would be refused again).
    retry: bool,
    /// Input elements the attempt kept (fewer after a split of its data
    /// channel): a retry runs these.
    kept: usize,
}

impl Inner {
    /// Runs a bundle, retrying a failed attempt on the least busy SDK
    /// worker (a fresh one when its worker died or was stuck): up to
    /// [`MAX_ATTEMPTS`] attempts in batch, without a cap in streaming, as
    /// Dataflow does. Outputs, timers, user state and metrics of a failed
    /// attempt are discarded, so a retry duplicates nothing. A bundle that
    /// already handed residual restrictions to the engine is not retried
    /// (the retry would redo that work), nor one refused user state past
    /// the job's budget (in streaming too); one whose data channel was split
    /// is retried with the input elements it kept (the primary).
    async fn run(&self, mut request: BundleRequest) -> Result<BundleResult, String> {
        let mut attempts = 0;
        let last = loop {
            attempts += 1;
            let started = std::time::Instant::now();
            match self.attempt(&request).await {
                Ok(r) => {
                    tracing::debug!(stage = %request.stage_id, elements = request.input.len(), ms = started.elapsed().as_millis() as u64, "bundle done");
                    return Ok(r);
                }
                Err(AttemptFailure { message: e, retry, kept: primary }) => {
                    tracing::warn!(job = %self.job_id, stage = %request.stage_name, attempt = attempts, "bundle failed: {e}");
                    if !retry
                        || !self.policy.retries_after(attempts)
                        || self.harnesses.is_stopping()
                    {
                        break e;
                    }
                    // The elements handed back run in bundles of their own.
                    request.input.truncate(primary);
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

    /// One attempt of `request`; its failure says whether a retry may
    /// follow and how many input elements the attempt kept.
    async fn attempt(&self, request: &BundleRequest) -> Result<BundleResult, AttemptFailure> {
        let stage = match &self.graph.stages[request.stage].kind {
            StageKind::Sdk(stage) => stage,
            StageKind::GroupByKey {
                merge_windows: Some(stage),
                ..
            } => &**stage,
            _ => {
                return Err(AttemptFailure {
                    message: format!("stage {} runs no SDK bundles", request.stage_name),
                    retry: true,
                    kept: request.input.len(),
                })
            }
        };
        let descriptor = match self.descriptor_for(request) {
            Ok(d) => d,
            Err(Failure::Error(e) | Failure::Stuck(e)) => {
                return Err(AttemptFailure { message: e, retry: true, kept: request.input.len() })
            }
        };
        // A splittable DoFn's restrictions are small but may run long.
        let small = !stage.splittable
            && request.input.iter().map(Vec::len).sum::<usize>()
                <= crate::environment::SMALL_BUNDLE_BYTES;
        // A batch splittable stage that makes no runner round trips (no
        // side inputs, no state) may keep a one-core harness's interpreter
        // busy: a second of its bundles there would only contend for the
        // lock (Python wordcount's read: 5-7% more SDK CPU), and splitting
        // already feeds every idle harness. `pick` lets a second one in
        // when the harness's CPU use shows the first one waits.
        let alone = stage.splittable
            && !self.graph.streaming
            && stage.side_inputs.is_empty()
            && !stage.stateful;
        let worker = self
            .harnesses
            .pick(&stage.environment_id, &descriptor, small, alone)
            .await
            .map_err(|e| AttemptFailure { message: e, retry: true, kept: request.input.len() })?;
        // Unguessable: state requests, data and results are accepted only
        // for instructions issued to the worker that sends them.
        let instruction_id = self.fn_api.fresh_id(&format!("{}-bundle-", self.job_id));
        let sinks = stage.output_transform_ids.len();
        let streams = sinks + stage.timer_families.len();
        let bundle = Arc::new(BundleState {
            worker_id: worker.id.clone(),
            descriptor_id: JobWorkers::descriptor_id(&self.job_id, &request.stage_id),
            side_inputs: request.side_inputs.clone(),
            user_state: BundleUserState::new(request.user_state.clone()),
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
            outputs: Mutex::new(((0..streams).map(|_| ByteChunks::default()).collect(), streams)),
            spill: request.spill_outputs.clone(),
            all_last: tokio::sync::Notify::new(),
            split_handed_over: std::sync::atomic::AtomicBool::new(false),
            split_primary: std::sync::atomic::AtomicUsize::new(usize::MAX),
            stray_output: Default::default(),
        });
        self.fn_api
            .bundles
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(instruction_id.clone(), bundle.clone());
        let result = self
            .exchange(&worker, &instruction_id, &descriptor, request, stage, &bundle, sinks)
            .await;
        self.harnesses.release(&worker, &descriptor, result.is_err());
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
        let failure = |message| AttemptFailure {
            message,
            // A retry would redo handed-over residuals, and would be
            // refused the same user state again.
            retry: !bundle.split_handed_over.load(Ordering::Relaxed)
                && bundle.user_state.refused().is_none(),
            kept: bundle
                .split_primary
                .load(Ordering::Relaxed)
                .min(request.input.len()),
        };
        match result {
            Ok(r) => {
                // Checked before the bundle's metrics counted; kept here
                // for any path that did not check.
                if let Err(e) = bundle.user_state.commit() {
                    return Err(failure(e));
                }
                if stage.stateful {
                    self.report_state_cells(request.user_state.usage());
                }
                Ok(r)
            }
            Err(e) => Err(failure(e)),
        }
    }
}
