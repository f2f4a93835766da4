//! Expired windows in a stateful SDK stage: late data dropped before it
//! reaches the DoFn, and the runner's window-expiration timers.

use crate::operators::Element;
use crate::timers::TimerStore;
use weir_model::Timestamp;

/// `elements` (encoded windowed values of `info`) without their windows
/// that expired at input watermark `watermark` (end of window plus allowed
/// lateness passed); elements left with no window are dropped. Elements
/// that do not decode are kept (the SDK reports them).
pub(super) fn drop_expired(
    info: &weir_graph::PCollectionInfo,
    elements: Vec<Element>,
    watermark: Timestamp,
) -> Vec<Element> {
    let lateness = info.windowing.allowed_lateness_ms;
    let live =
        |w: &weir_model::Window| watermark <= w.max_timestamp().saturating_add_millis(lateness);
    elements
        .into_iter()
        .filter_map(|e| {
            let Ok((mut wv, _)) =
                weir_model::WindowedValue::decode(&info.value_coder, &info.window_coder, &e)
            else {
                return Some(e);
            };
            if wv.windows.iter().all(live) {
                return Some(e);
            }
            wv.windows.retain(live);
            if wv.windows.is_empty() {
                return None;
            }
            let mut out = Vec::with_capacity(e.len());
            wv.encode(&mut out);
            Some(out)
        })
        .collect()
}

/// Sets the runner's window-expiration timer (Java's `@OnWindowExpiration`,
/// see `TimerStore::set_window_expiration`) of every (key, window) of
/// `elements`, encoded windowed KVs of `info`. Elements that do not decode
/// are skipped (the SDK reports them).
pub(super) fn set_expiration_timers(
    timers: &mut TimerStore,
    family: usize,
    info: &weir_graph::PCollectionInfo,
    elements: &[Element],
) {
    for e in elements {
        let Ok((wv, _)) =
            weir_model::WindowedValue::decode(&info.value_coder, &info.window_coder, e)
        else {
            continue;
        };
        let Ok((key, _)) = weir_model::windowed_value::split_kv(&info.value_coder, &wv.value)
        else {
            continue;
        };
        for w in &wv.windows {
            timers.set_window_expiration(family, key, w, info.windowing.allowed_lateness_ms);
        }
    }
}

#[cfg(test)]
mod tests {
    use weir_graph::{PCollectionInfo, WindowFn, Windowing};
    use weir_model::{Coder, PaneInfo, Window, WindowedValue};

    use super::*;

    fn interval(start: i64, end: i64) -> Window {
        Window::Interval {
            start: Timestamp(start),
            end: Timestamp(end),
        }
    }

    fn info(allowed_lateness_ms: i64) -> PCollectionInfo {
        PCollectionInfo {
            id: "pc".into(),
            value_coder: Coder::VarInt,
            window_coder: Coder::IntervalWindow,
            windowing: Windowing {
                window_fn: WindowFn::NonMerging,
                allowed_lateness_ms,
                ..Windowing::global()
            },
        }
    }

    fn element(windows: Vec<Window>) -> Element {
        let mut bytes = Vec::new();
        WindowedValue {
            timestamp: Timestamp(5),
            windows,
            pane: PaneInfo::NO_FIRING,
            value: vec![7],
        }
        .encode(&mut bytes);
        bytes
    }

    #[test]
    fn elements_of_live_windows_are_kept_as_they_are() {
        let e = element(vec![interval(0, 10)]);
        // [0, 10) expires once the watermark passes its max timestamp, 9.
        assert_eq!(
            drop_expired(&info(0), vec![e.clone()], Timestamp(9)),
            vec![e]
        );
    }

    #[test]
    fn elements_of_expired_windows_are_dropped() {
        let e = element(vec![interval(0, 10)]);
        assert!(drop_expired(&info(0), vec![e], Timestamp(10)).is_empty());
    }

    #[test]
    fn allowed_lateness_keeps_a_window_alive_longer() {
        let e = element(vec![interval(0, 10)]);
        assert_eq!(
            drop_expired(&info(5), vec![e.clone()], Timestamp(14)),
            vec![e.clone()]
        );
        assert!(drop_expired(&info(5), vec![e], Timestamp(15)).is_empty());
    }

    #[test]
    fn an_element_in_several_windows_loses_only_the_expired_ones() {
        let e = element(vec![interval(0, 10), interval(5, 15)]);
        let kept = drop_expired(&info(0), vec![e], Timestamp(12));
        assert_eq!(kept, vec![element(vec![interval(5, 15)])]);
    }

    #[test]
    fn elements_that_do_not_decode_are_kept_for_the_sdk_to_report() {
        let garbage = vec![0xff];
        assert_eq!(
            drop_expired(&info(0), vec![garbage.clone()], Timestamp::MAX),
            vec![garbage]
        );
    }
}
