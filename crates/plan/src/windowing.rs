//! Windowing strategies: what the runner needs of them, and what it rejects.

use std::collections::HashMap;

use prost::Message;
use weir_model::Timestamp;
use weir_proto::{beam, urns};

use crate::graph::{Accumulation, OutputTime, Trigger, WindowFn, Windowing};
use crate::{PlanError, Result};

/// Parses windowing strategy `id`, rejecting what Weir does not run
/// (retracting accumulation, malformed triggers).
/// `pcollection` names the PCollection for messages; `environments` tell
/// which SDK wrote the strategy ([`closing_emit_always`]).
pub(crate) fn parse(
    strategies: &HashMap<String, beam::WindowingStrategy>,
    environments: &HashMap<String, beam::Environment>,
    id: &str,
    pcollection: &str,
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
    let trigger = match ws.trigger.as_ref() {
        Some(t) => parse_trigger(t).map_err(|feature| unsupported(fn_urn, feature))?,
        None => Trigger::Default,
    };
    let accumulation = match beam::accumulation_mode::Enum::try_from(ws.accumulation_mode) {
        Ok(beam::accumulation_mode::Enum::Accumulating) => Accumulation::Accumulating,
        Ok(beam::accumulation_mode::Enum::Retracting) => {
            return Err(unsupported(fn_urn, "accumulation mode RETRACTING".into()))
        }
        _ => Accumulation::Discarding,
    };
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
        // Windows of a merging WindowFn the runner does not know (of any
        // window type) are merged by the SDK (`beam:transform:merge_windows:v1`).
        _ if ws.merge_status == beam::merge_status::Enum::NeedsMerge as i32 => {
            WindowFn::CustomMerging
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
        trigger,
        accumulation,
        allowed_lateness_ms: ws.allowed_lateness.max(0),
        on_time_fire_always: ws.on_time_behavior
            != beam::on_time_behavior::Enum::FireIfNonempty as i32,
        closing_emit_always: closing_emit_always(ws, environments),
        end_of_global_window: if is_python(ws, environments) {
            Timestamp::PYTHON_END_OF_GLOBAL_WINDOW
        } else {
            Timestamp::END_OF_GLOBAL_WINDOW
        },
        pane_timestamp_from_holds: declares(&ws.environment_id, environments, |c| {
            c.starts_with("beam:version:sdk_base:apache/beam_java")
        }),
    })
}

/// Whether the strategy is a Python SDK's: its environment declares
/// `beam:version:sdk_base:apache/beam_python…` or
/// `beam:combinefn:packed_python:v1`.
fn is_python(ws: &beam::WindowingStrategy, environments: &HashMap<String, beam::Environment>) -> bool {
    is_python_environment(&ws.environment_id, environments)
}

/// Whether environment `id` of `environments` is a Python SDK's: it
/// declares `beam:version:sdk_base:apache/beam_python…` or
/// `beam:combinefn:packed_python:v1`.
pub fn is_python_environment(id: &str, environments: &HashMap<String, beam::Environment>) -> bool {
    declares(id, environments, |c| {
        c.starts_with("beam:version:sdk_base:apache/beam_python") || c == "beam:combinefn:packed_python:v1"
    })
}

/// Whether environment `id` of `environments` declares a capability
/// `capability` accepts (an SDK says which it is by its `sdk_base`).
fn declares(id: &str, environments: &HashMap<String, beam::Environment>, capability: impl Fn(&str) -> bool) -> bool {
    environments.get(id).is_some_and(|e| e.capabilities.iter().any(|c| capability(c)))
}

/// Whether `ClosingBehavior` EMIT_ALWAYS is meant: Beam Python writes
/// EMIT_ALWAYS into every windowing strategy (its SDK has no
/// EMIT_IF_NONEMPTY yet) while its runners emit no final pane without new
/// elements, so a Python strategy ([`is_python`]) is read as
/// EMIT_IF_NONEMPTY; Java's `ClosingBehavior.FIRE_ALWAYS` is honoured.
fn closing_emit_always(
    ws: &beam::WindowingStrategy,
    environments: &HashMap<String, beam::Environment>,
) -> bool {
    ws.closing_behavior == beam::closing_behavior::Enum::EmitAlways as i32 && !is_python(ws, environments)
}

/// Converts a `Trigger` proto into the plan's tree; the error names what is
/// missing or malformed.
fn parse_trigger(t: &beam::Trigger) -> std::result::Result<Trigger, String> {
    use beam::trigger::Trigger as T;
    let many = |subs: &[beam::Trigger]| -> std::result::Result<Vec<Trigger>, String> {
        subs.iter().map(parse_trigger).collect()
    };
    let boxed =
        |sub: Option<&beam::Trigger>, what: &str| -> std::result::Result<Box<Trigger>, String> {
            sub.map(parse_trigger)
                .transpose()?
                .map(Box::new)
                .ok_or_else(|| format!("trigger {what} without its subtrigger"))
        };
    Ok(match t.trigger.as_ref() {
        None | Some(T::Default(_)) => Trigger::Default,
        Some(T::Always(_)) => Trigger::Always,
        Some(T::Never(_)) => Trigger::Never,
        Some(T::ElementCount(c)) => Trigger::ElementCount(c.element_count.max(0) as u64),
        Some(T::AfterSynchronizedProcessingTime(_)) => Trigger::AfterSynchronizedProcessingTime,
        Some(T::AfterProcessingTime(p)) => {
            let mut delay_ms = 0;
            let mut align = None;
            for tt in &p.timestamp_transforms {
                use beam::timestamp_transform::TimestampTransform as TT;
                match tt.timestamp_transform.as_ref() {
                    Some(TT::Delay(d)) if align.is_none() => delay_ms += d.delay_millis,
                    Some(TT::AlignTo(a)) if a.period > 0 && align.is_none() => {
                        align = Some((a.period, a.offset))
                    }
                    Some(_) => {
                        return Err("AfterProcessingTime with a delay after an alignment, or a non-positive alignment period".into())
                    }
                    None => return Err("AfterProcessingTime with an empty timestamp transform".into()),
                }
            }
            Trigger::AfterProcessingTime { delay_ms, align }
        }
        Some(T::AfterEndOfWindow(e)) => Trigger::AfterEndOfWindow {
            early: e
                .early_firings
                .as_deref()
                .map(parse_trigger)
                .transpose()?
                .map(Box::new),
            late: e
                .late_firings
                .as_deref()
                .map(parse_trigger)
                .transpose()?
                .map(Box::new),
        },
        Some(T::Repeat(r)) => Trigger::Repeatedly(boxed(r.subtrigger.as_deref(), "Repeatedly")?),
        Some(T::AfterEach(a)) => Trigger::AfterEach(many(&a.subtriggers)?),
        Some(T::AfterAny(a)) => Trigger::AfterAny(many(&a.subtriggers)?),
        Some(T::AfterAll(a)) => Trigger::AfterAll(many(&a.subtriggers)?),
        Some(T::OrFinally(o)) => Trigger::OrFinally {
            main: boxed(o.main.as_deref(), "OrFinally")?,
            finally: boxed(o.finally.as_deref(), "OrFinally")?,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(capabilities: &[&str]) -> beam::Environment {
        beam::Environment {
            capabilities: capabilities.iter().map(|c| c.to_string()).collect(),
            ..Default::default()
        }
    }

    /// Environments as each SDK declares itself: by id java, go, py, and
    /// py-packed (Python known only by its packed combiner capability).
    fn sdk_environments() -> HashMap<String, beam::Environment> {
        [
            ("java".to_string(), env(&["beam:version:sdk_base:apache/beam_java17_sdk:2.73.0"])),
            ("go".to_string(), env(&["beam:version:sdk_base:apache/beam_go_sdk:v2.77.0"])),
            ("py".to_string(), env(&["beam:version:sdk_base:apache/beam_python3.11_sdk:2.77.0"])),
            ("py-packed".to_string(), env(&["beam:combinefn:packed_python:v1"])),
        ]
        .into()
    }

    /// EMIT_ALWAYS holds for Java's strategies and not for Python's (which
    /// always send it); EMIT_IF_NONEMPTY never emits an empty final pane.
    #[test]
    fn closing_emit_always_is_honoured_except_for_python() {
        let envs = sdk_environments();
        let ws = |env: &str, closing: beam::closing_behavior::Enum| beam::WindowingStrategy {
            environment_id: env.into(),
            closing_behavior: closing as i32,
            ..Default::default()
        };
        use beam::closing_behavior::Enum::{EmitAlways, EmitIfNonempty};
        assert!(closing_emit_always(&ws("java", EmitAlways), &envs));
        assert!(closing_emit_always(&ws("unknown", EmitAlways), &envs));
        assert!(!closing_emit_always(&ws("java", EmitIfNonempty), &envs));
        assert!(!closing_emit_always(&ws("py", EmitAlways), &envs));
        assert!(!closing_emit_always(&ws("py-packed", EmitAlways), &envs));
    }

    /// The windowing a global-window strategy of SDK environment `env` parses to.
    fn global_of(env: &str) -> Windowing {
        let ws = beam::WindowingStrategy {
            environment_id: env.into(),
            window_fn: Some(beam::FunctionSpec { urn: urns::window_fn::GLOBAL.into(), payload: vec![] }),
            ..Default::default()
        };
        let strategies: HashMap<String, beam::WindowingStrategy> = [("ws".to_string(), ws)].into();
        parse(&strategies, &sdk_environments(), "ws", "pc").unwrap()
    }

    /// A global window's end-of-window pane is stamped as its SDK stamps it:
    /// Python one millisecond before the Runner API's constant, Java and Go
    /// (and an unknown SDK) at it.
    #[test]
    fn end_of_global_window_follows_the_sdk() {
        let end = |env: &str| global_of(env).end_of_global_window;
        assert_eq!(end("java"), Timestamp::END_OF_GLOBAL_WINDOW);
        assert_eq!(end("go"), Timestamp::END_OF_GLOBAL_WINDOW);
        assert_eq!(end("unknown"), Timestamp::END_OF_GLOBAL_WINDOW);
        assert_eq!(end("py"), Timestamp::PYTHON_END_OF_GLOBAL_WINDOW);
        assert_eq!(end("py-packed"), Timestamp::PYTHON_END_OF_GLOBAL_WINDOW);
    }

    /// Only Java's strategies stamp panes from their watermark holds.
    #[test]
    fn pane_timestamps_from_holds_are_javas() {
        assert!(global_of("java").pane_timestamp_from_holds);
        for env in ["go", "py", "py-packed", "unknown"] {
            assert!(!global_of(env).pane_timestamp_from_holds, "{env}");
        }
    }
}
