//! Windowing strategies: what the runner needs of them, and what it rejects.

use std::collections::HashMap;

use prost::Message;
use weir_proto::{beam, urns};

use crate::graph::{OutputTime, WindowFn, Windowing};
use crate::{PlanError, Result};

/// Parses windowing strategy `id`, rejecting features Weir does not run yet
/// (non-default triggers, custom window coders, custom merging WindowFns).
/// `pcollection` names the PCollection for messages.
pub(crate) fn parse(
    strategies: &HashMap<String, beam::WindowingStrategy>,
    coders: &HashMap<String, beam::Coder>,
    id: &str,
    pcollection: &str,
    streaming: bool,
) -> Result<Windowing> {
    let ws = strategies.get(id).ok_or_else(|| {
        PlanError::Invalid(format!(
            "PCollection {pcollection}: unknown windowing strategy {id:?}"
        ))
    })?;
    let fn_urn = ws.window_fn.as_ref().map(|f| f.urn.as_str()).unwrap_or("");
    let unsupported = |urn: &str, feature: String| PlanError::Unsupported {
        transform: format!("producer of PCollection {pcollection}"),
        urn: urn.to_string(),
        feature,
    };
    let window_coder_urn = coders
        .get(&ws.window_coder_id)
        .and_then(|c| c.spec.as_ref())
        .map(|s| s.urn.as_str())
        .unwrap_or("");
    // Windows of custom types travel length-prefixed and stay opaque to the
    // runner; merging them needs the SDK's merge_windows, not implemented yet.
    let custom_window = window_coder_urn != urns::coder::GLOBAL_WINDOW
        && window_coder_urn != urns::coder::INTERVAL_WINDOW;
    if custom_window && ws.merge_status == beam::merge_status::Enum::NeedsMerge as i32 {
        return Err(unsupported(
            fn_urn,
            "a merging WindowFn over a custom window type".into(),
        ));
    }
    // In batch every window's data is complete when its GroupByKey fires, so
    // any trigger fires exactly once per window with all of its elements (as
    // Beam's batch runners do). Streaming needs the trigger state machine.
    match ws.trigger.as_ref().and_then(|t| t.trigger.as_ref()) {
        None
        | Some(beam::trigger::Trigger::Default(_))
        | Some(beam::trigger::Trigger::Always(_)) => {}
        Some(other) if streaming => {
            let name = format!("{other:?}");
            let name = name.split('(').next().unwrap_or("").to_string();
            return Err(unsupported(fn_urn, format!("trigger {name} in a streaming pipeline (Weir runs triggers with batch semantics only)")));
        }
        Some(_) => {}
    }
    let window_fn = match fn_urn {
        urns::window_fn::GLOBAL => WindowFn::Global,
        urns::window_fn::SESSIONS => {
            let payload = ws
                .window_fn
                .as_ref()
                .map(|f| f.payload.as_slice())
                .unwrap_or(&[]);
            let p = beam::SessionWindowsPayload::decode(payload).map_err(|e| {
                PlanError::Invalid(format!(
                    "windowing strategy {id}: bad SessionWindowsPayload: {e}"
                ))
            })?;
            let gap = p.gap_size.unwrap_or_default();
            WindowFn::Sessions {
                gap_ms: gap.seconds * 1000 + i64::from(gap.nanos) / 1_000_000,
            }
        }
        _ if ws.merge_status == beam::merge_status::Enum::NeedsMerge as i32 => {
            return Err(unsupported(fn_urn, "custom merging WindowFn".into()))
        }
        _ => WindowFn::NonMerging,
    };
    let output_time = match beam::output_time::Enum::try_from(ws.output_time) {
        Ok(beam::output_time::Enum::EarliestInPane) => OutputTime::EarliestInPane,
        Ok(beam::output_time::Enum::LatestInPane) => OutputTime::LatestInPane,
        _ => OutputTime::EndOfWindow,
    };
    Ok(Windowing {
        window_fn,
        output_time,
    })
}
