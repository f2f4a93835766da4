//! One attempt's Fn API exchange: `ProcessBundleRequest`, input and timers on
//! Data, the response awaited (splitting and polling), outputs, finalization.

use std::time::Duration;

use weir_engine::{BundleRequest, BundleResult};
use weir_proto::beam;

use super::policy::human_duration;
use super::progress::Progress;
use super::residuals::residual_elements;
use super::splits::{
    CHANNEL_SPLIT_CHECK_INTERVAL, MAX_SPLITS_PER_BUNDLE, POOL_CHANGE_SETTLE, SPLIT_CHECK_INTERVAL,
};
use super::{Failure, Inner, JobWorkers};
use crate::registry::{BundleState, ByteChunks, Worker};

/// Target size of one `Elements.Data` message to an SDK harness (a larger
/// element travels alone: elements are never split across messages).
const DATA_CHUNK_BYTES: usize = 1 << 20;
/// How long to wait for outputs' `is_last` after a successful bundle response.
const OUTPUT_DRAIN_TIMEOUT: Duration = Duration::from_secs(120);

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

impl Inner {
    /// Waits for the bundle's response, meanwhile:
    /// * for a splittable stage's bundle (of one element; or of several in
    ///   a batch job), asks the SDK to split what is left of it whenever
    ///   another SDK worker sits idle, or a batch bundle of several
    ///   restrictions' own harness leaves its core partly idle
    ///   (`ProcessBundleSplitRequest`: the rest of one element in half; of
    ///   several, a share per ready worker), and hands the residuals to the
    ///   engine at once so that worker takes them; for another stage's
    ///   bundle of several elements, splits
    ///   its data channel whenever the environment has room for another
    ///   bundle, handing what is left back as one bundle per ready SDK
    ///   worker ([`Inner::maybe_split`]);
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
        // A splittable DoFn's bundle splits inside its element, or in a
        // batch job with several elements at an element boundary (the
        // restrictions not started go back) or inside the one it is in. (A
        // streaming job's bundles of several restrictions run whole: one
        // split inside a restriction would end their retries.)
        let several = stage.splittable && request.input.len() > 1 && !self.policy.streaming;
        let restrictions = stage.splittable && (request.input.len() == 1 || several);
        let splittable = restrictions || drainable;
        // Any other bundle of several elements may split its data channel,
        // unless it is keyed (a stateful stage runs a key's elements in
        // order, one bundle at a time) or delivers timers.
        let channel = !stage.splittable
            && !stage.stateful
            && request.on_split.is_some()
            && request.input.len() > 1
            && request.timers.iter().all(Vec::is_empty);
        let splittable = splittable || channel;
        // Progress is watched only with an element processing timeout.
        let watch = self
            .policy
            .element_processing_timeout
            .zip(self.policy.progress_interval());
        let tick = match watch {
            None if !splittable => return response.await.map_err(|_| gone()),
            None if channel || several => CHANNEL_SPLIT_CHECK_INTERVAL,
            None => SPLIT_CHECK_INTERVAL,
            Some((_, every)) if channel || several => every.min(CHANNEL_SPLIT_CHECK_INTERVAL),
            Some((_, every)) if splittable => every.min(SPLIT_CHECK_INTERVAL),
            Some((_, every)) => every,
        };
        let mut progress = Progress::new(std::time::Instant::now());
        let mut last_poll = std::time::Instant::now();
        let mut polls = 0u32;
        let mut splits = 0u32;
        // A splittable DoFn's bundle (one element, or several in batch) on a
        // one-core harness process is also checked as soon as the pool
        // changes (another bundle ended: its harness may now be idle), after
        // a moment in which a waiting bundle takes that harness first.
        // (Other harnesses may run a residual beside its bundle: the
        // periodic check is enough.)
        let element = restrictions && self.harnesses.one_core_process(&stage.environment_id);
        // Made again as soon as it fires, before the check it starts, so a
        // change during a split's round trip is not missed.
        let mut changed = Box::pin(self.harnesses.pool_changed());
        loop {
            tokio::select! {
                r = &mut response => return r.map_err(|_| gone()),
                _ = tokio::time::sleep(tick) => {}
                _ = changed.as_mut(), if element => {
                    changed = Box::pin(self.harnesses.pool_changed());
                    tokio::select! {
                        r = &mut response => return r.map_err(|_| gone()),
                        _ = tokio::time::sleep(POOL_CHANGE_SETTLE) => {}
                    }
                }
            }
            if drainable && self.policy.draining() {
                if splits < MAX_SPLITS_PER_BUNDLE {
                    splits = MAX_SPLITS_PER_BUNDLE;
                    self.split(worker, instruction_id, request, stage, bundle, 0.0, splits, 1)
                        .await?;
                }
            } else if channel || restrictions {
                splits = self
                    .maybe_split(worker, instruction_id, request, stage, bundle, splits, channel)
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
                .map(ByteChunks::len)
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
    pub(super) fn descriptor_for(&self, request: &BundleRequest) -> Result<String, Failure> {
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

    pub(super) async fn exchange(
        &self,
        worker: &Worker,
        instruction_id: &str,
        descriptor: &str,
        request: &BundleRequest,
        stage: &weir_plan::SdkStage,
        bundle: &BundleState,
        sinks: usize,
    ) -> Result<BundleResult, Failure> {
        let mut response = worker.send(beam::InstructionRequest {
            instruction_id: instruction_id.to_string(),
            request: Some(beam::instruction_request::Request::ProcessBundle(
                beam::ProcessBundleRequest {
                    process_bundle_descriptor_id: descriptor.to_string(),
                    cache_tokens: side_input_cache_tokens(&self.job_id, stage, request),
                    ..Default::default()
                },
            )),
        })?;
        let data = |chunk: Vec<u8>, is_last: bool| beam::Elements {
            data: vec![beam::elements::Data {
                instruction_id: instruction_id.to_string(),
                transform_id: stage.input_transform_id.clone(),
                data: chunk,
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
        // Each chunk is moved into its message, not copied.
        let mut chunk = Vec::new();
        for element in &request.input {
            if !chunk.is_empty() && chunk.len() + element.len() > DATA_CHUNK_BYTES {
                let full = std::mem::replace(&mut chunk, Vec::with_capacity(DATA_CHUNK_BYTES));
                worker.send_data(data(full, false))?;
            }
            chunk.extend_from_slice(element);
        }
        if !chunk.is_empty() {
            worker.send_data(data(chunk, false))?;
        }
        worker.send_data(data(Vec::new(), true))?;
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
        // An append past the job's user-state budget fails the bundle, even
        // when the SDK carried on (Python's ignores an Append's error):
        // before its metrics count and its finalization runs.
        if let Some(refused) = bundle.user_state.refused() {
            return Err(refused.into());
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
        if let Some(stray) = bundle.stray_output.lock().unwrap_or_else(|p| p.into_inner()).take() {
            return Err(stray.into());
        }
        let streams =
            std::mem::take(&mut bundle.outputs.lock().unwrap_or_else(|p| p.into_inner()).0);
        let mut streams = streams.into_iter();
        let mut outputs = Vec::with_capacity(sinks);
        let mut spilled = Vec::new();
        for stream in streams.by_ref().take(sinks) {
            let (head, tail) = stream.into_parts()?;
            if head.is_some() {
                spilled.resize_with(outputs.len(), || None);
                spilled.push(head);
            }
            outputs.push(tail);
        }
        let timers = streams.map(ByteChunks::into_bytes).collect();
        Ok(BundleResult {
            outputs,
            spilled,
            residuals: residuals.elements,
            residual_delay_ms: residuals.delay_ms,
            residual_watermark: residuals.watermark,
            timers,
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use weir_engine::side_input::SideInputs;

    fn side(transform_id: &str, local_name: &str) -> weir_plan::SideInput {
        weir_plan::SideInput {
            transform_id: transform_id.into(),
            local_name: local_name.into(),
            pcollection: 0,
            kind: weir_plan::SideInputKind::Iterable,
            window_fn: weir_plan::SideWindowFn::Global,
        }
    }

    #[test]
    fn one_cache_token_per_side_input_names_the_contents() {
        let stage = weir_plan::SdkStage {
            environment_id: "env".into(),
            input: 0,
            input_transform_id: "source".into(),
            side_inputs: vec![side("pardo", "side0"), side("pardo", "side1")],
            outputs: vec![],
            output_transform_ids: vec![],
            residual_transform_ids: vec![],
            stateful: false,
            time_sorted: false,
            timer_families: vec![],
            splittable: false,
            drain_descriptor_id: None,
            window_expiration_family: None,
        };
        let request = BundleRequest {
            stage: 0,
            stage_id: "s0".into(),
            stage_name: "stage".into(),
            input: vec![],
            side_inputs: Arc::new(SideInputs::default()),
            side_input_generation: 0,
            timers: vec![],
            on_split: None,
            user_state: Arc::default(),
            spill_outputs: None,
        };
        let (lineage, version) = request.side_inputs.identity();
        let token = format!("job-1/side/{lineage}/{version}").into_bytes();
        let tokens = side_input_cache_tokens("job-1", &stage, &request);
        use beam::process_bundle_request::cache_token;
        let expected: Vec<_> = ["side0", "side1"]
            .into_iter()
            .map(|id| beam::process_bundle_request::CacheToken {
                token: token.clone(),
                r#type: Some(cache_token::Type::SideInput(cache_token::SideInput {
                    transform_id: "pardo".into(),
                    side_input_id: id.into(),
                })),
            })
            .collect();
        assert_eq!(tokens, expected);
        let none = weir_plan::SdkStage {
            side_inputs: vec![],
            ..stage
        };
        assert!(side_input_cache_tokens("job-1", &none, &request).is_empty());
    }
}
