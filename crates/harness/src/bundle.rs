//! The bundle client: runs the engine's bundles on a job's SDK workers
//! (`ProcessBundleRequest` on Control, elements on Data, residuals back).

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use weir_engine::{BundleProcessor, BundleRequest, BundleResult, Completion};
use weir_plan::{StageGraph, StageKind};
use weir_proto::beam;

use crate::metrics::JobMetrics;
use crate::registry::{BundleState, BundleUserState, FnApi, UserState, Worker};

/// Target size of one `Elements.Data` message to an SDK harness (a larger
/// element travels alone: elements are never split across messages).
const DATA_CHUNK_BYTES: usize = 1 << 20;
/// How often a running splittable bundle is checked for splitting.
const SPLIT_CHECK_INTERVAL: Duration = Duration::from_millis(500);
/// Bundles one SDK harness runs at a time.
const BUNDLES_PER_WORKER: usize = 1;
/// Attempts of one bundle before its stage fails the job.
const MAX_ATTEMPTS: usize = 4;
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
            let ms = weir_model::Timestamp(w.seconds.saturating_mul(1000) + i64::from(w.nanos) / 1_000_000);
            out.watermark = Some(out.watermark.map_or(ms, |m: weir_model::Timestamp| m.min(ms)));
        }
        out.elements.push(app.element);
    }
    if out.elements.is_empty() {
        out.delay_ms = 0;
    }
    Ok(out)
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
    workers: HashMap<String, Vec<Arc<Worker>>>,
    runtime: tokio::runtime::Handle,
    instruction_seq: Mutex<u64>,
    metrics: Arc<JobMetrics>,
    user_state: Arc<UserState>,
    pick_lock: Mutex<()>,
    worker_freed: tokio::sync::Notify,
}

impl JobWorkers {
    /// Wraps started workers; bundle MonitoringInfos are added to `metrics`. Descriptor ids registered with `fn_api` must be
    /// `descriptor_id(job_id, stage_id)`.
    pub fn new(
        fn_api: Arc<FnApi>,
        job_id: String,
        graph: Arc<StageGraph>,
        workers: HashMap<String, Vec<Arc<Worker>>>,
        runtime: tokio::runtime::Handle,
        metrics: Arc<JobMetrics>,
    ) -> Self {
        JobWorkers {
            inner: Arc::new(Inner {
                fn_api,
                job_id,
                graph,
                workers,
                runtime,
                instruction_seq: Mutex::new(0),
                metrics,
                user_state: Arc::default(),
                pick_lock: Mutex::new(()),
                worker_freed: tokio::sync::Notify::new(),
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
}

impl Inner {
    /// A connected worker of `environment_id` with no bundle in flight, with
    /// its in-flight count already raised (choice and count under one lock).
    /// Waits while every worker is busy: one bundle per SDK process at a time
    /// keeps CPU-bound SDKs (Python's GIL) from thrashing, and the queue of
    /// waiting bundles is what lets an idle worker take split-off work.
    async fn pick(&self, environment_id: &str) -> Result<Arc<Worker>, String> {
        let workers = self
            .workers
            .get(environment_id)
            .ok_or_else(|| format!("no SDK workers for environment {environment_id}"))?;
        loop {
            let freed = self.worker_freed.notified();
            {
                let _choosing = self.pick_lock.lock().unwrap_or_else(|p| p.into_inner());
                let connected: Vec<&Arc<Worker>> =
                    workers.iter().filter(|w| w.is_connected()).collect();
                if connected.is_empty() {
                    return Err(format!(
                        "no connected SDK harness for environment {environment_id}"
                    ));
                }
                if let Some(w) = connected
                    .into_iter()
                    .find(|w| w.in_flight.load(Ordering::Relaxed) < BUNDLES_PER_WORKER)
                {
                    w.in_flight.fetch_add(1, Ordering::Relaxed);
                    return Ok(w.clone());
                }
            }
            // Also wake up now and then, in case a worker died without finishing a bundle.
            let _ = tokio::time::timeout(Duration::from_millis(200), freed).await;
        }
    }

    /// Runs a bundle, retrying a failed attempt (up to [`MAX_ATTEMPTS`], as
    /// Dataflow does in batch) on the least busy SDK worker. Outputs, timers,
    /// user state and metrics of a failed attempt are discarded, so a retry
    /// duplicates nothing. A bundle that already handed split-off work to the
    /// engine is not retried (the retry would redo that work).
    async fn run(&self, request: BundleRequest) -> Result<BundleResult, String> {
        let mut errors = Vec::new();
        for attempt in 1..=MAX_ATTEMPTS {
            let started = std::time::Instant::now();
            match self.attempt(&request).await {
                Ok(r) => {
                    tracing::debug!(stage = %request.stage_id, elements = request.input.len(), ms = started.elapsed().as_millis() as u64, "bundle done");
                    return Ok(r);
                }
                Err((e, split_handed_over)) => {
                    tracing::warn!(job = %self.job_id, stage = %request.stage_name, attempt, "bundle failed: {e}");
                    errors.push(e);
                    if split_handed_over {
                        break;
                    }
                }
            }
        }
        let attempts = errors.len();
        let last = errors.pop().unwrap_or_default();
        Err(if attempts > 1 {
            format!("bundle failed {attempts} times; last error: {last}")
        } else {
            last
        })
    }

    /// One attempt; on failure also says whether split-off work was handed to the engine.
    async fn attempt(&self, request: &BundleRequest) -> Result<BundleResult, (String, bool)> {
        let StageKind::Sdk(stage) = &self.graph.stages[request.stage].kind else {
            return Err((
                format!("stage {} is not an SDK stage", request.stage_name),
                false,
            ));
        };
        let worker = self
            .pick(&stage.environment_id)
            .await
            .map_err(|e| (e, false))?;
        let instruction_id = {
            let mut seq = self
                .instruction_seq
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            *seq += 1;
            format!("{}-bundle-{}", self.job_id, *seq)
        };
        let sinks = stage.outputs.len();
        let streams = sinks + stage.timer_families.len();
        let bundle = Arc::new(BundleState {
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
        worker.in_flight.fetch_sub(1, Ordering::Relaxed);
        self.worker_freed.notify_waiters();
        self.fn_api
            .bundles
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&instruction_id);
        match result {
            Ok(r) => {
                bundle.user_state.commit();
                Ok(r)
            }
            Err(e) => Err((e, bundle.split_handed_over.load(Ordering::Relaxed))),
        }
    }

    /// True when some other connected worker of `env` has no bundle in flight.
    fn idle_worker(&self, env: &str, busy: &Worker) -> bool {
        self.workers
            .get(env)
            .map(|ws| {
                ws.iter().any(|w| {
                    w.id != busy.id && w.is_connected() && w.in_flight.load(Ordering::Relaxed) == 0
                })
            })
            .unwrap_or(false)
    }

    /// Waits for the bundle's response. Meanwhile, for a splittable stage
    /// whose bundle holds one element, asks the SDK to split the rest of the
    /// element in half whenever another SDK worker sits idle
    /// (`ProcessBundleSplitRequest`, fraction_of_remainder 0.5), and hands the
    /// residuals to the engine at once so the idle worker takes them.
    async fn await_response(
        &self,
        worker: &Worker,
        instruction_id: &str,
        request: &BundleRequest,
        stage: &weir_plan::SdkStage,
        bundle: &BundleState,
        mut response: tokio::sync::oneshot::Receiver<beam::InstructionResponse>,
    ) -> Result<beam::InstructionResponse, String> {
        let gone = || format!("SDK harness {} went away", worker.id);
        if !stage.splittable || request.input.len() != 1 {
            return response.await.map_err(|_| gone());
        }
        let mut splits = 0u32;
        loop {
            tokio::select! {
                r = &mut response => return r.map_err(|_| gone()),
                _ = tokio::time::sleep(SPLIT_CHECK_INTERVAL) => {}
            }
            if splits >= MAX_SPLITS_PER_BUNDLE || !self.idle_worker(&stage.environment_id, worker) {
                continue;
            }
            splits += 1;
            let split = worker.send(beam::InstructionRequest {
                instruction_id: format!("{instruction_id}-split-{splits}"),
                request: Some(beam::instruction_request::Request::ProcessBundleSplit(
                    beam::ProcessBundleSplitRequest {
                        instruction_id: instruction_id.to_string(),
                        desired_splits: [(
                            stage.input_transform_id.clone(),
                            beam::process_bundle_split_request::DesiredSplit {
                                fraction_of_remainder: 0.5,
                                allowed_split_points: vec![],
                                estimated_input_elements: 1,
                            },
                        )]
                        .into_iter()
                        .collect(),
                    },
                )),
            })?;
            let Ok(split) = split.await else {
                return Err(gone());
            };
            let Some(beam::instruction_response::Response::ProcessBundleSplit(split)) =
                split.response
            else {
                continue; // the bundle finished first, or the SDK declined
            };
            let mut residuals = residual_elements(split.residual_roots, stage)?.elements;
            // A split at the element boundary leaves the (single) input element
            // to the runner: schedule it again as a whole.
            let element_returned = split.channel_splits.iter().any(|c| {
                c.transform_id == stage.input_transform_id && c.first_residual_element == 0
            });
            if element_returned {
                residuals.push(request.input[0].clone());
            }
            if !residuals.is_empty() {
                tracing::info!(worker = %worker.id, bundle = %instruction_id, "split off {} residual(s)", residuals.len());
                bundle.split_handed_over.store(true, Ordering::Relaxed);
                (request.on_split)(residuals);
            }
        }
    }

    async fn exchange(
        &self,
        worker: &Worker,
        instruction_id: &str,
        request: &BundleRequest,
        stage: &weir_plan::SdkStage,
        bundle: &BundleState,
        sinks: usize,
    ) -> Result<BundleResult, String> {
        let response = worker.send(beam::InstructionRequest {
            instruction_id: instruction_id.to_string(),
            request: Some(beam::instruction_request::Request::ProcessBundle(
                beam::ProcessBundleRequest {
                    process_bundle_descriptor_id: JobWorkers::descriptor_id(
                        &self.job_id,
                        &request.stage_id,
                    ),
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
        let mut data_ready = worker.data_connected.subscribe();
        if tokio::time::timeout(OUTPUT_DRAIN_TIMEOUT, data_ready.wait_for(|c| *c))
            .await
            .is_err()
        {
            return Err(format!(
                "SDK harness {} never opened its data stream",
                worker.id
            ));
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
            return Err(response.error);
        }
        let Some(beam::instruction_response::Response::ProcessBundle(pb)) = response.response
        else {
            return Err(format!(
                "SDK harness {} answered a bundle with something else",
                worker.id
            ));
        };
        // Wait for every sink's is_last (the data stream may lag the control stream).
        loop {
            let notified = bundle.all_last.notified();
            if bundle.outputs.lock().unwrap_or_else(|p| p.into_inner()).1 == 0 {
                break;
            }
            if tokio::time::timeout(OUTPUT_DRAIN_TIMEOUT, notified)
                .await
                .is_err()
            {
                return Err(format!(
                    "SDK harness {} never finished sending outputs of bundle {instruction_id}",
                    worker.id
                ));
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
                    ))
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
