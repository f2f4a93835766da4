//! Residuals a bundle returns (SDF checkpoints or split-off work), decoded
//! from `DelayedBundleApplication`s into elements for the stage's input.

use weir_proto::beam;

/// Residuals (SDF checkpoints or split-off work), which re-enter the
/// stage's input: their elements, their least requested resume delay (ms)
/// and their least output watermark. Only residuals of a transform reading
/// the stage input can be re-scheduled.
pub(super) struct Residuals {
    pub(super) elements: Vec<Vec<u8>>,
    pub(super) delay_ms: i64,
    pub(super) watermark: Option<weir_model::Timestamp>,
}

/// A `requested_time_delay` in whole ms, rounded up (a delay under 1 ms is
/// still a delay), at least 0 and at most `i64::MAX`.
fn delay_ms(d: &prost_types::Duration) -> i64 {
    let nanos = i128::from(d.seconds) * 1_000_000_000 + i128::from(d.nanos);
    let ms = (nanos + 999_999).div_euclid(1_000_000);
    i64::try_from(ms.max(0)).unwrap_or(i64::MAX)
}

pub(super) fn residual_elements(
    roots: Vec<beam::DelayedBundleApplication>,
    stage: &weir_plan::SdkStage,
) -> Result<Residuals, String> {
    let mut out = Residuals {
        elements: Vec::with_capacity(roots.len()),
        delay_ms: i64::MAX,
        watermark: None,
    };
    for r in roots {
        let delay = r.requested_time_delay.map_or(0, |d| delay_ms(&d));
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A stage whose input is read by transform `sdf`.
    fn stage() -> weir_plan::SdkStage {
        weir_plan::SdkStage {
            environment_id: "env".into(),
            input: 0,
            input_transform_id: "source".into(),
            side_inputs: vec![],
            outputs: vec![],
            output_transform_ids: vec![],
            residual_transform_ids: vec!["sdf".into()],
            stateful: false,
            time_sorted: false,
            timer_families: vec![],
            splittable: true,
            drain_descriptor_id: None,
            window_expiration_family: None,
        }
    }

    fn residual(
        transform: &str,
        element: &[u8],
        delay: Option<(i64, i32)>,
        watermarks: &[(i64, i32)],
    ) -> beam::DelayedBundleApplication {
        beam::DelayedBundleApplication {
            application: Some(beam::BundleApplication {
                transform_id: transform.into(),
                element: element.to_vec(),
                output_watermarks: watermarks
                    .iter()
                    .enumerate()
                    .map(|(i, &(seconds, nanos))| {
                        (format!("out{i}"), prost_types::Timestamp { seconds, nanos })
                    })
                    .collect(),
                ..Default::default()
            }),
            requested_time_delay: delay
                .map(|(seconds, nanos)| prost_types::Duration { seconds, nanos }),
        }
    }

    #[test]
    fn residuals_keep_their_elements_the_least_delay_and_the_least_watermark() {
        let r = residual_elements(
            vec![
                residual(
                    "sdf",
                    b"a",
                    Some((2, 500_000_000)),
                    &[(10, 0), (7, 250_000_000)],
                ),
                residual("sdf", b"b", Some((1, 999_999)), &[(9, 0)]),
            ],
            &stage(),
        )
        .unwrap();
        assert_eq!(r.elements, [b"a".to_vec(), b"b".to_vec()]);
        assert_eq!(r.delay_ms, 1001, "1 s + 999_999 ns, rounded up to ms");
        assert_eq!(r.watermark, Some(weir_model::Timestamp(7250)));
    }

    #[test]
    fn no_delay_or_a_negative_one_resumes_at_once() {
        let r = residual_elements(vec![residual("sdf", b"a", None, &[])], &stage()).unwrap();
        assert_eq!((r.delay_ms, r.watermark), (0, None));
        let r =
            residual_elements(vec![residual("sdf", b"a", Some((-5, 0)), &[])], &stage()).unwrap();
        assert_eq!(r.delay_ms, 0);
        let r = residual_elements(vec![], &stage()).unwrap();
        assert!(r.elements.is_empty());
        assert_eq!((r.delay_ms, r.watermark), (0, None));
    }

    #[test]
    fn a_delay_rounds_up_to_whole_milliseconds_and_a_past_deadline_is_none() {
        let ms = |seconds, nanos| delay_ms(&prost_types::Duration { seconds, nanos });
        // Under a millisecond is still a delay (PeriodicImpulse defers by
        // what is left of its interval).
        assert_eq!(ms(0, 400_000), 1);
        assert_eq!(ms(0, 1_000_000), 1);
        assert_eq!(ms(0, 1_000_001), 2);
        assert_eq!(ms(2, 0), 2000);
        // A deadline just passed (negative sub-second), or long passed.
        assert_eq!(ms(0, -400_000), 0);
        assert_eq!(ms(-1, -500_000_000), 0);
        // Mixed signs (not a valid Duration) still count exactly.
        assert_eq!(ms(1, -1_000_000), 999);
        // No overflow at the extremes.
        assert_eq!(ms(i64::MAX, 999_999_999), i64::MAX);
        assert_eq!(ms(i64::MIN, -999_999_999), 0);
    }

    #[test]
    fn a_residual_of_a_later_transform_is_refused() {
        let e = residual_elements(vec![residual("later", b"a", None, &[])], &stage())
            .err()
            .unwrap();
        assert!(
            e.starts_with("residual for transform later which does not read the stage input"),
            "{e}"
        );
    }
}
