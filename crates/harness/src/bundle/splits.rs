//! Dynamic splits of a running bundle (`ProcessBundleSplitRequest`): for
//! idle SDK workers (a splittable element in half, a data channel into one
//! bundle per ready worker), for the spare core time of a one-core harness
//! whose batch bundle of restrictions waits, or a checkpoint when the job
//! drains (0).
//!
//! Two kinds, as Dataflow's dynamic work rebalancing: a splittable DoFn's
//! bundle splits inside its element (residual restrictions) or, with
//! several restrictions in a batch job, also at a restriction boundary; and
//! any other bundle of several elements splits its data channel at an
//! element boundary. Either way the elements the SDK has not started go
//! back to the engine and run in bundles of their own.

use std::sync::atomic::Ordering;
use std::time::Duration;

use weir_engine::BundleRequest;
use weir_proto::beam;

use super::residuals::residual_elements;
use super::{Failure, Inner};
use crate::registry::{BundleState, Worker};

/// How often a running splittable DoFn's bundle is checked for splitting.
pub(super) const SPLIT_CHECK_INTERVAL: Duration = Duration::from_millis(500);
/// How often a running bundle of several elements is checked for a split
/// of its data channel: a stage's few slow elements start as one bundle
/// (see the engine's spread), and a check that finds SDK workers ready
/// hands them what is left, one bundle each.
pub(super) const CHANNEL_SPLIT_CHECK_INTERVAL: Duration = Duration::from_millis(100);
/// How long after a change of the SDK harness pool (a bundle ended) a
/// running splittable DoFn's bundle is checked for splitting: time for a
/// bundle waiting for a harness to take the one that became free.
pub(super) const POOL_CHANGE_SETTLE: Duration = Duration::from_millis(10);
/// Most dynamic splits requested of one bundle.
pub(super) const MAX_SPLITS_PER_BUNDLE: u32 = 16;

impl Inner {
    /// Splits the running bundle when that lets other work start now and
    /// fewer than
    /// [`MAX_SPLITS_PER_BUNDLE`] splits were asked; returns the number of
    /// splits asked so far. A splittable DoFn's element (`channel` false)
    /// splits when its residual has an SDK harness to run on
    /// ([`crate::environment::SdkHarnesses::could_run_a_residual`]; on a
    /// one-core harness process, an idle harness no other split was promised,
    /// see [`crate::environment::SdkHarnesses::split_ways`]; a bundle of
    /// several restrictions there also when its own harness leaves its core
    /// partly idle, [`crate::environment::SdkHarnesses::take_spare_core`]); a data
    /// channel of several elements (`channel` true) when its environment
    /// could start another bundle at once (no bundle waits for a worker,
    /// and a worker has room for one more; see
    /// [`crate::environment::SdkHarnesses::has_room`]) and either no element
    /// of its stage waits for a bundle on its timely worker or another SDK
    /// worker sits idle (the engine starts a split's elements at once).
    ///
    /// A splittable DoFn's bundle of one element splits it in half
    /// (fraction of remainder 0.5). A data channel, or a splittable DoFn's
    /// bundle of several restrictions, keeps 1/(k+1) of what is left and
    /// hands the rest back as k bundles, k being the SDK workers ready for
    /// them ([`crate::environment::SdkHarnesses::split_ways`]): a few slow
    /// elements reach every idle core in one check rather than by halving.
    /// The SDK splits a bundle of restrictions at the element boundary
    /// nearest that share, or inside the restriction it is in when the
    /// share is less than what is left of it (Beam's
    /// `ProcessBundleSplitRequest`: residual roots plus a channel split).
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn maybe_split(
        &self,
        worker: &Worker,
        instruction_id: &str,
        request: &BundleRequest,
        stage: &weir_plan::SdkStage,
        bundle: &BundleState,
        mut splits: u32,
        channel: bool,
    ) -> Result<u32, Failure> {
        // Elements of the stage waiting for a bundle on its timely worker.
        let backlog = request
            .on_split
            .as_ref()
            .map_or(usize::MAX, |s| s.backlog.load(Ordering::Relaxed));
        let env = &stage.environment_id;
        let one_core = self.harnesses.one_core_process(env);
        // A splittable DoFn's batch bundle (see the caller) still holding
        // several restrictions: of its input, those its primary kept after
        // earlier splits.
        let left = bundle.split_primary.load(Ordering::Relaxed).min(request.input.len());
        let several = !channel && left > 1 && !self.policy.streaming;
        let worth = if channel {
            (backlog == 0 || self.harnesses.has_idle_worker(env, &worker.id))
                && self.harnesses.has_room(env)
        } else {
            self.harnesses.could_run_a_residual(env, &worker.id, backlog)
        };
        if splits >= MAX_SPLITS_PER_BUNDLE {
            return Ok(splits);
        }
        // A bundle of several restrictions on a one-core harness whose
        // process leaves its core partly idle (its source waits) also
        // splits for that harness itself: the restrictions it would have run
        // as a second bundle of their own.
        // (take_spare_core: only a one-core harness process.)
        let spare = several && self.harnesses.take_spare_core(env, &worker.id);
        if !worth && !spare {
            return Ok(splits);
        }
        // Workers promised to this split's bundles (see `split_ways`).
        let promised = if channel {
            let most = request.input.len().saturating_sub(1);
            self.harnesses.split_ways(env, &worker.id, most)
        } else if several || one_core {
            // The residuals are for idle harnesses: promise them, so another
            // bundle's split does not count them too (one idle harness, two
            // residuals). Several restrictions may go to several of them.
            let most = if several { left - usize::from(spare) } else { 1 };
            match self.harnesses.split_ways(env, &worker.id, most) {
                0 if !spare && one_core => return Ok(splits),
                n => n,
            }
        } else {
            0
        };
        let ways = if channel || several { (promised + usize::from(spare)).max(1) } else { 1 };
        splits += 1;
        let keep = 1.0 / (ways as f64 + 1.0);
        let handed = self
            .split(worker, instruction_id, request, stage, bundle, keep, splits, ways)
            .await;
        self.harnesses
            .split_done(env, promised + usize::from(spare), matches!(handed, Ok(true)));
        handed?;
        Ok(splits)
    }

    /// Asks the SDK to split the running bundle, keeping
    /// `fraction_of_remainder` of what is left (0: a checkpoint, everything
    /// not yet claimed goes to the residual), and hands the residuals (and
    /// the input elements the SDK has not started, to start as `ways`
    /// bundles) to the engine. True when it handed any.
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
        ways: usize,
    ) -> Result<bool, Failure> {
        // A bundle whose result is read as a whole is never split.
        let Some(on_split) = &request.on_split else {
            return Ok(false);
        };
        let asked = std::time::Instant::now();
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
            return Ok(false); // the bundle finished first, or the SDK declined
        };
        tracing::debug!(worker = %worker.id, bundle = %instruction_id, input = %stage.input_transform_id, elements = request.input.len(), round_trip_us = asked.elapsed().as_micros() as u64, split = ?split, "split response");
        let mut residuals = residual_elements(split.residual_roots, stage)?.elements;
        let restrictions = residuals.len();
        // Input elements from the first residual one on are left to the
        // runner (a split at the element boundary returns the element the
        // SDK was at): schedule them again as a whole.
        let kept = bundle.split_primary.load(Ordering::Relaxed);
        let mut returned = 0;
        if let Some(back) = handed_back(&split.channel_splits, request.input.len(), kept) {
            returned = back.len();
            bundle.split_primary.store(back.start, Ordering::Relaxed);
            residuals.extend(request.input[back].iter().cloned());
        }
        if !residuals.is_empty() {
            tracing::info!(worker = %worker.id, bundle = %instruction_id, "split off {restrictions} residual restriction(s) and {returned} input element(s) of {} (fraction of remainder {fraction_of_remainder:.3}, in {} bundle(s))", request.input.len(), if returned > 0 { ways.min(residuals.len()) } else { 1 });
            if restrictions > 0 {
                bundle.split_handed_over.store(true, Ordering::Relaxed);
            }
            (on_split.hand_back)(residuals, returned, ways);
            return Ok(true);
        }
        Ok(false)
    }
}

/// The bundle's input elements (indices into its `input`, of `len`) that a
/// split's `channel_splits` hand back to the runner: from the least
/// `first_residual_element` up to `kept`, the end of what earlier splits of
/// the bundle left its primary (`usize::MAX` when none did). None when the
/// split gives up nothing new. A stage reads one data channel, so every
/// channel split is of it: Beam Java 2.73's harness leaves
/// `ChannelSplit.transform_id` empty, and ignoring such a split would lose
/// the elements it gave up.
fn handed_back(
    splits: &[beam::process_bundle_split_response::ChannelSplit],
    len: usize,
    kept: usize,
) -> Option<std::ops::Range<usize>> {
    let first = splits
        .iter()
        .map(|c| c.first_residual_element.max(0) as usize)
        .min()?
        .min(len);
    let end = kept.min(len);
    (first < end).then_some(first..end)
}

#[cfg(test)]
mod tests {
    use super::*;
    use beam::process_bundle_split_response::ChannelSplit;

    fn split(transform_id: &str, first: i64) -> ChannelSplit {
        ChannelSplit {
            transform_id: transform_id.into(),
            last_primary_element: first - 1,
            first_residual_element: first,
        }
    }

    #[test]
    fn a_channel_split_without_a_transform_id_still_hands_elements_back() {
        // Java 2.73: transform_id "".
        assert_eq!(handed_back(&[split("", 1)], 2, usize::MAX), Some(1..2));
        assert_eq!(handed_back(&[split("stage-3/source", 4)], 10, usize::MAX), Some(4..10));
    }

    #[test]
    fn a_later_split_hands_back_only_what_the_earlier_one_kept() {
        assert_eq!(handed_back(&[split("s", 3)], 10, 6), Some(3..6));
        // At or past what is kept: nothing new.
        assert_eq!(handed_back(&[split("s", 6)], 10, 6), None);
        assert_eq!(handed_back(&[split("s", 8)], 10, 6), None);
    }

    #[test]
    fn no_channel_split_or_one_past_the_input_hands_back_nothing() {
        assert_eq!(handed_back(&[], 10, usize::MAX), None);
        // A splittable element's split returns the element after it.
        assert_eq!(handed_back(&[split("s", 1)], 1, usize::MAX), None);
        assert_eq!(handed_back(&[split("s", 99)], 10, usize::MAX), None);
        // A negative index (malformed) counts as 0: everything goes back.
        assert_eq!(handed_back(&[split("s", -5)], 3, usize::MAX), Some(0..3));
    }
}
