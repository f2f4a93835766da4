//! Data crossing from one SDK to another (a multi-language pipeline): a
//! PCollection that a transform of one SDK writes and a transform of
//! another reads must be in coders both SDKs decode, Beam's standard coders
//! (`beam_runner_api.proto`'s `StandardCoders`), not one only its writer's
//! SDK knows: Python's pickled coder, a serialized Java coder, a Go custom
//! coder. Without this check such a job fails only in the reading SDK's
//! harness, bundle after bundle, with an error that names no PCollection.

use std::collections::{HashMap, HashSet};

use weir_proto::{beam, urns};

use crate::{PlanError, Result};

/// Coders every SDK decodes.
const STANDARD: &[&str] = &[
    urns::coder::BYTES,
    urns::coder::STRING_UTF8,
    urns::coder::KV,
    urns::coder::BOOL,
    urns::coder::VARINT,
    urns::coder::DOUBLE,
    urns::coder::ITERABLE,
    urns::coder::TIMER,
    urns::coder::INTERVAL_WINDOW,
    urns::coder::LENGTH_PREFIX,
    urns::coder::GLOBAL_WINDOW,
    urns::coder::WINDOWED_VALUE,
    urns::coder::PARAM_WINDOWED_VALUE,
    urns::coder::STATE_BACKED_ITERABLE,
    urns::coder::CUSTOM_WINDOW,
    urns::coder::ROW,
    urns::coder::SHARDED_KEY,
    urns::coder::NULLABLE,
];

/// The SDK an environment belongs to, by its `sdk_base` capability
/// (`beam:version:sdk_base:apache/beam_python3.11_sdk:2.77.0`); `None` when
/// it declares none Weir knows.
fn sdk(env: &beam::Environment) -> Option<&'static str> {
    env.capabilities.iter().find_map(|c| {
        let image = c.strip_prefix("beam:version:sdk_base:")?;
        [("apache/beam_python", "Python"), ("apache/beam_java", "Java"), ("apache/beam_go", "Go")]
            .into_iter()
            .find(|(prefix, _)| image.starts_with(prefix))
            .map(|(_, name)| name)
    })
}

/// The first coder of `id`'s tree (itself, then its components) that is
/// not standard: (coder id, URN).
fn non_standard<'a>(c: &'a beam::Components, id: &'a str) -> Option<(&'a str, &'a str)> {
    let mut stack = vec![id];
    let mut seen = HashSet::new();
    while let Some(id) = stack.pop() {
        if !seen.insert(id) {
            continue;
        }
        let coder = c.coders.get(id)?;
        let urn = coder.spec.as_ref().map(|s| s.urn.as_str()).unwrap_or("");
        if !STANDARD.contains(&urn) {
            return Some((id, urn));
        }
        stack.extend(coder.component_coder_ids.iter().map(String::as_str));
    }
    None
}

/// Checks every input of every SDK-executed leaf in `leaves` (main and side
/// inputs) against the SDKs that wrote it, looking through runner
/// transforms (GroupByKey, Flatten, Reshuffle) to the SDK transforms behind
/// them.
///
/// # Errors
/// [`PlanError::Invalid`] naming the PCollection, the writing and reading
/// transforms and SDKs, and the coder and its URN.
pub(crate) fn check(c: &beam::Components, leaves: &[String]) -> Result<()> {
    let producer: HashMap<&str, &str> = leaves
        .iter()
        .filter_map(|id| c.transforms.get(id).map(|t| (id, t)))
        .flat_map(|(id, t)| t.outputs.values().map(move |pc| (pc.as_str(), id.as_str())))
        .collect();
    let sdk_of = |t: &beam::PTransform| c.environments.get(&t.environment_id).and_then(sdk);
    let name = |id: &str| c.transforms.get(id).map_or(id.to_string(), |t| t.unique_name.clone());
    for id in leaves {
        let Some(reader) = c.transforms.get(id) else { continue };
        let Some(reads) = sdk_of(reader) else { continue };
        let mut inputs: Vec<&String> = reader.inputs.values().collect();
        inputs.sort();
        inputs.dedup();
        for pc in inputs {
            // The SDK transforms whose output reaches `pc`.
            let mut stack = vec![pc.as_str()];
            let mut seen = HashSet::new();
            while let Some(p) = stack.pop() {
                if !seen.insert(p) {
                    continue;
                }
                let Some(writer_id) = producer.get(p) else { continue };
                let writer = &c.transforms[*writer_id];
                if writer.environment_id.is_empty() {
                    stack.extend(writer.inputs.values().map(String::as_str));
                    continue;
                }
                let Some(writes) = sdk_of(writer) else { continue };
                if writes == reads {
                    continue;
                }
                let coder_id = c.pcollections.get(pc.as_str()).map_or("", |p| p.coder_id.as_str());
                if let Some((bad, urn)) = non_standard(c, coder_id) {
                    return Err(PlanError::Invalid(format!(
                        "PCollection {pc:?} goes from {} ({writes} SDK) to {} ({reads} SDK) in coder {coder_id:?}, whose part {bad:?} ({urn}) only the {writes} SDK can decode: give it a standard coder (a schema, or a type both SDKs know: bytes, str, int, float, bool, KV and iterables of them; in Python `.with_output_types(...)`)",
                        name(writer_id),
                        name(id),
                    )));
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(sdk_base: &str) -> beam::Environment {
        beam::Environment {
            capabilities: vec![format!("beam:version:sdk_base:{sdk_base}")],
            ..Default::default()
        }
    }

    fn coder(urn: &str, components: &[&str]) -> beam::Coder {
        beam::Coder {
            spec: Some(beam::FunctionSpec { urn: urn.into(), payload: vec![] }),
            component_coder_ids: components.iter().map(|s| s.to_string()).collect(),
        }
    }

    fn transform(name: &str, urn: &str, env: &str, inputs: &[&str], outputs: &[&str]) -> beam::PTransform {
        beam::PTransform {
            unique_name: name.into(),
            spec: Some(beam::FunctionSpec { urn: urn.into(), payload: vec![] }),
            environment_id: env.into(),
            inputs: inputs.iter().enumerate().map(|(i, p)| (format!("i{i}"), p.to_string())).collect(),
            outputs: outputs.iter().enumerate().map(|(i, p)| (format!("o{i}"), p.to_string())).collect(),
            ..Default::default()
        }
    }

    /// Python writes `a`, a GroupByKey groups it into `b`, Java reads `b`;
    /// `b`'s coder is KV<str, iterable<`value`>>.
    fn pipeline(value: beam::Coder) -> (beam::Components, Vec<String>) {
        let mut c = beam::Components::default();
        c.environments.insert("py".into(), env("apache/beam_python3.11_sdk:2.77.0"));
        c.environments.insert("java".into(), env("apache/beam_java17_sdk:2.73.0"));
        c.coders.insert("str".into(), coder(urns::coder::STRING_UTF8, &[]));
        c.coders.insert("value".into(), value);
        c.coders.insert("kv".into(), coder(urns::coder::KV, &["str", "value"]));
        c.coders.insert("iter".into(), coder(urns::coder::ITERABLE, &["value"]));
        c.coders.insert("grouped".into(), coder(urns::coder::KV, &["str", "iter"]));
        for (pc, coder_id) in [("a", "kv"), ("b", "grouped"), ("c", "str")] {
            c.pcollections.insert(pc.into(), beam::PCollection { coder_id: coder_id.into(), ..Default::default() });
        }
        c.transforms.insert("write".into(), transform("Write", urns::transform::PAR_DO, "py", &[], &["a"]));
        c.transforms.insert("gbk".into(), transform("Group", urns::transform::GROUP_BY_KEY, "", &["a"], &["b"]));
        c.transforms.insert("read".into(), transform("ReadInJava", urns::transform::PAR_DO, "java", &["b"], &["c"]));
        (c, vec!["write".into(), "gbk".into(), "read".into()])
    }

    #[test]
    fn a_pickled_coder_may_not_cross_to_another_sdk() {
        let (c, leaves) = pipeline(coder("beam:coder:pickled_python:v1", &[]));
        let err = check(&c, &leaves).unwrap_err().to_string();
        for part in ["\"b\"", "Write (Python SDK)", "ReadInJava (Java SDK)", "beam:coder:pickled_python:v1", "\"grouped\""] {
            assert!(err.contains(part), "{part} missing from: {err}");
        }
    }

    #[test]
    fn standard_coders_cross_and_one_sdk_keeps_its_own() {
        let (c, leaves) = pipeline(coder(urns::coder::VARINT, &[]));
        check(&c, &leaves).unwrap();
        // Python to Python: the pickled coder is fine.
        let (mut c, leaves) = pipeline(coder("beam:coder:pickled_python:v1", &[]));
        c.transforms.get_mut("read").unwrap().environment_id = "py".into();
        check(&c, &leaves).unwrap();
        // An environment of no known SDK is not judged.
        let (mut c, leaves) = pipeline(coder("beam:coder:pickled_python:v1", &[]));
        c.environments.insert("java".into(), beam::Environment::default());
        check(&c, &leaves).unwrap();
    }
}
