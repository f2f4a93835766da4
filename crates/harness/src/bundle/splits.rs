//! Dynamic splits of a running bundle (`ProcessBundleSplitRequest`): for an
//! idle SDK worker (fraction 0.5), or a checkpoint when the job drains (0).
//!
//! Two kinds, as Dataflow's dynamic work rebalancing: a splittable DoFn's
//! bundle of one element splits inside the element (residual restrictions),
//! and any other bundle of several elements splits its data channel at an
//! element boundary (the elements the SDK has not started go back to the
//! engine and run in bundles of their own).

use std::sync::atomic::Ordering;
use std::time::Duration;

use weir_engine::BundleRequest;
use weir_proto::beam;

use super::residuals::residual_elements;
use super::{Failure, Inner};
use crate::registry::{BundleState, Worker};

/// How often a running splittable bundle is checked for splitting.
pub(super) const SPLIT_CHECK_INTERVAL: Duration = Duration::from_millis(500);
/// Most dynamic splits requested of one bundle.
pub(super) const MAX_SPLITS_PER_BUNDLE: u32 = 16;

impl Inner {
    /// Splits the running bundle in half when another worker is idle and
    /// fewer than [`MAX_SPLITS_PER_BUNDLE`] splits were asked; returns the
    /// number of splits asked so far.
    pub(super) async fn maybe_split(
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

    /// Splits the data channel of a running bundle of several elements in
    /// half when no element of its stage waits for a bundle on its timely
    /// worker, its environment could start another bundle at once (no
    /// bundle waits for a worker, and a worker has room for one more; see
    /// [`crate::environment::SdkHarnesses::has_room`]) and fewer than
    /// [`MAX_SPLITS_PER_BUNDLE`] splits were asked; returns the number of
    /// splits asked so far.
    pub(super) async fn maybe_split_channel(
        &self,
        worker: &Worker,
        instruction_id: &str,
        request: &BundleRequest,
        stage: &weir_plan::SdkStage,
        bundle: &BundleState,
        mut splits: u32,
    ) -> Result<u32, Failure> {
        let backlog = request
            .on_split
            .as_ref()
            .map_or(usize::MAX, |s| s.backlog.load(Ordering::Relaxed));
        if splits >= MAX_SPLITS_PER_BUNDLE
            || backlog > 0
            || !self.harnesses.has_room(&stage.environment_id)
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
    pub(super) async fn split(
        &self,
        worker: &Worker,
        instruction_id: &str,
        request: &BundleRequest,
        stage: &weir_plan::SdkStage,
        bundle: &BundleState,
        fraction_of_remainder: f64,
        nth: u32,
    ) -> Result<(), Failure> {
        // A bundle whose result is read as a whole is never split.
        let Some(on_split) = &request.on_split else {
            return Ok(());
        };
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
        let restrictions = residuals.len();
        // Input elements from the first residual one on are left to the
        // runner (a split at the element boundary returns the element the
        // SDK was at): schedule them again as a whole.
        let mut returned = 0;
        if let Some(first) = split
            .channel_splits
            .iter()
            .filter(|c| c.transform_id == stage.input_transform_id)
            .map(|c| c.first_residual_element.max(0) as usize)
            .min()
        {
            let first = first.min(request.input.len());
            let already = bundle.split_primary.load(Ordering::Relaxed).min(request.input.len());
            // A later split of the same bundle hands back only what an
            // earlier one did not.
            if first < already {
                residuals.extend(request.input[first..already].iter().cloned());
                returned = already - first;
                bundle.split_primary.store(first, Ordering::Relaxed);
            }
        }
        if !residuals.is_empty() {
            tracing::info!(worker = %worker.id, bundle = %instruction_id, "split off {restrictions} residual restriction(s) and {returned} input element(s) (fraction of remainder {fraction_of_remainder})");
            if restrictions > 0 {
                bundle.split_handed_over.store(true, Ordering::Relaxed);
            }
            (on_split.hand_back)(residuals, returned);
        }
        Ok(())
    }
}
