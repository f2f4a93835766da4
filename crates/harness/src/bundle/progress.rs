//! Progress of a running bundle: `ProcessBundleProgress` polls and the
//! signal by which the element processing timeout finds a stuck bundle.

use std::collections::HashMap;
use std::time::Duration;

use weir_proto::beam;

use super::{Inner, JobWorkers};
use crate::registry::Worker;

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

impl Inner {
    /// The user's name of transform `id` in stage `stage_id`'s descriptor.
    pub(super) fn transform_name(&self, stage_id: &str, id: &str) -> Option<String> {
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
    pub(super) async fn poll_progress(
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
}
