//! Transcoding: where a runner transform needs its input in another coder
//! than the producer writes, an SDK-executed identity (`beam:transform:flatten:v1`
//! with one input, run in the producer's environment) re-encodes it.
//!
//! - Flatten inputs whose coder differs from the Flatten output's: the runner
//!   concatenates encoded elements, so all must share the output coder.
//! - GroupByKey inputs that are not KV-coded (e.g. a Flatten of mixed types
//!   coded with a pickling coder): re-encoded as `KV<K, V>` taken from the
//!   GroupByKey output coder `KV<K, Iterable<V>>`.
//! - TestStream outputs: the TestStream writes its events' elements
//!   (`TestStreamPayload.coder_id`, in the outer context) as a PCollection
//!   in `length_prefix(<payload coder>)` (see
//!   `coders::test_stream_element_coder`), re-encoded into the declared
//!   output unless that is already the same coder (Go's custom coders).

use std::collections::HashMap;

use weir_proto::{beam, urns};

use crate::leaves::urn_of;
use crate::{PlanError, Result};

/// Id marker of transcoding transforms (SDK-executed Flattens).
pub(crate) const TRANSCODE_MARKER: &str = "/weir:transcode:";

fn coder_urn<'a>(c: &'a beam::Components, id: &str) -> &'a str {
    c.coders
        .get(id)
        .and_then(|c| c.spec.as_ref())
        .map(|s| s.urn.as_str())
        .unwrap_or("")
}

/// Inserts transcoders; returns the new leaf list.
pub(crate) fn insert(c: &mut beam::Components, leaves: &mut Vec<String>) -> Result<()> {
    let producer: HashMap<String, String> = leaves
        .iter()
        .flat_map(|id| {
            c.transforms[id]
                .outputs
                .values()
                .map(move |pc| (pc.clone(), id.clone()))
        })
        .collect();
    let default_env = leaves
        .iter()
        .map(|id| c.transforms[id].environment_id.clone())
        .find(|e| !e.is_empty())
        .unwrap_or_default();
    let mut out = Vec::with_capacity(leaves.len());
    for id in leaves.drain(..) {
        let t = c.transforms[&id].clone();
        if urn_of(&t) == urns::transform::TEST_STREAM {
            out.push(id.clone());
            out.extend(transcode_test_stream_outputs(c, &id, &default_env)?);
            continue;
        }
        let target_coder: Option<Box<dyn Fn(&str) -> Option<String>>> = match urn_of(&t) {
            urns::transform::FLATTEN => {
                let out_pc = t.outputs.values().next().cloned().unwrap_or_default();
                let out_coder = c
                    .pcollections
                    .get(&out_pc)
                    .map(|p| p.coder_id.clone())
                    .unwrap_or_default();
                Some(Box::new(move |in_coder: &str| {
                    (in_coder != out_coder).then(|| out_coder.clone())
                }))
            }
            urns::transform::GROUP_BY_KEY => {
                let out_pc = t.outputs.values().next().cloned().unwrap_or_default();
                let out_coder_id = c
                    .pcollections
                    .get(&out_pc)
                    .map(|p| p.coder_id.clone())
                    .unwrap_or_default();
                let out_coder = c.coders.get(&out_coder_id).cloned().unwrap_or_default();
                let kv = if coder_urn(c, &out_coder_id) == urns::coder::KV
                    && out_coder.component_coder_ids.len() == 2
                {
                    let iter_id = &out_coder.component_coder_ids[1];
                    let iter = c.coders.get(iter_id).cloned().unwrap_or_default();
                    (coder_urn(c, iter_id) == urns::coder::ITERABLE
                        && iter.component_coder_ids.len() == 1)
                        .then(|| {
                            (
                                out_coder.component_coder_ids[0].clone(),
                                iter.component_coder_ids[0].clone(),
                            )
                        })
                } else {
                    None
                };
                let kv_id = kv.map(|(k, v)| {
                    let id = format!("weir:kv({k},{v})");
                    c.coders.entry(id.clone()).or_insert_with(|| beam::Coder {
                        spec: Some(beam::FunctionSpec {
                            urn: urns::coder::KV.into(),
                            payload: vec![],
                        }),
                        component_coder_ids: vec![k, v],
                    });
                    id
                });
                let coders = c.coders.clone();
                Some(Box::new(move |in_coder: &str| {
                    let is_kv = coders
                        .get(in_coder)
                        .and_then(|c| c.spec.as_ref())
                        .map(|s| s.urn == urns::coder::KV)
                        .unwrap_or(false);
                    if is_kv {
                        None
                    } else {
                        kv_id.clone()
                    }
                }))
            }
            _ => None,
        };
        let Some(target_coder) = target_coder else {
            out.push(id);
            continue;
        };
        let mut t = t;
        let mut names: Vec<String> = t.inputs.keys().cloned().collect();
        names.sort();
        for (n, name) in names.into_iter().enumerate() {
            let input = t.inputs[&name].clone();
            let pc = c.pcollections.get(&input).cloned().ok_or_else(|| {
                PlanError::Invalid(format!("transform {id}: unknown PCollection {input}"))
            })?;
            let Some(coder) = target_coder(&pc.coder_id) else {
                continue;
            };
            let new_pc = format!("{id}{TRANSCODE_MARKER}{n}");
            let mut p = pc.clone();
            p.coder_id = coder;
            p.unique_name = format!("{}/transcoded", pc.unique_name);
            c.pcollections.insert(new_pc.clone(), p);
            let env = producer
                .get(&input)
                .map(|prod| c.transforms[prod].environment_id.clone())
                .filter(|e| !e.is_empty())
                .unwrap_or_else(|| default_env.clone());
            let transcoder = beam::PTransform {
                unique_name: format!("{}/Transcode{n}", t.unique_name),
                spec: Some(beam::FunctionSpec {
                    urn: urns::transform::FLATTEN.into(),
                    payload: vec![],
                }),
                inputs: [("in".to_string(), input.clone())].into_iter().collect(),
                outputs: [("out".to_string(), new_pc.clone())].into_iter().collect(),
                environment_id: env,
                ..Default::default()
            };
            let tid = format!("{id}{TRANSCODE_MARKER}{n}");
            c.transforms.insert(tid.clone(), transcoder);
            out.push(tid);
            t.inputs.insert(name, new_pc);
        }
        c.transforms.insert(id.clone(), t);
        out.push(id);
    }
    *leaves = out;
    Ok(())
}

/// Points each output of TestStream `id` whose coder differs from the coder
/// its elements travel in (`coders::test_stream_element_coder`) at a new
/// PCollection in that coder, and returns the transcoders (SDK Flattens)
/// that fill the original outputs from them.
fn transcode_test_stream_outputs(
    c: &mut beam::Components,
    id: &str,
    env: &str,
) -> Result<Vec<String>> {
    use prost::Message;
    let mut t = c.transforms[id].clone();
    let payload = t.spec.as_ref().map(|s| s.payload.as_slice()).unwrap_or(&[]);
    let element_coder = beam::TestStreamPayload::decode(payload)
        .map_err(|e| PlanError::Invalid(format!("TestStream {id}: bad TestStreamPayload: {e}")))?
        .coder_id;
    if element_coder.is_empty() || !c.coders.contains_key(&element_coder) {
        return Err(PlanError::Invalid(format!(
            "TestStream {id}: unknown element coder {element_coder:?}"
        )));
    }
    let element_coder = crate::coders::test_stream_element_coder(&mut c.coders, &element_coder)?.coder_id;
    let mut tags: Vec<String> = t.outputs.keys().cloned().collect();
    tags.sort();
    let mut transcoders = Vec::new();
    for (n, tag) in tags.into_iter().enumerate() {
        let output = t.outputs[&tag].clone();
        let pc = c.pcollections.get(&output).cloned().ok_or_else(|| {
            PlanError::Invalid(format!("TestStream {id}: unknown PCollection {output}"))
        })?;
        if crate::coders::same_coder(&c.coders, &pc.coder_id, &element_coder) {
            continue;
        }
        let raw = format!("{id}{TRANSCODE_MARKER}out{n}");
        let mut p = pc.clone();
        p.coder_id = element_coder.clone();
        p.unique_name = format!("{}/as-events", pc.unique_name);
        c.pcollections.insert(raw.clone(), p);
        let tid = format!("{id}{TRANSCODE_MARKER}out{n}/transcode");
        c.transforms.insert(
            tid.clone(),
            beam::PTransform {
                unique_name: format!("{}/Transcode{n}", t.unique_name),
                spec: Some(beam::FunctionSpec {
                    urn: urns::transform::FLATTEN.into(),
                    payload: vec![],
                }),
                inputs: [("in".to_string(), raw.clone())].into_iter().collect(),
                outputs: [("out".to_string(), output)].into_iter().collect(),
                environment_id: env.to_string(),
                ..Default::default()
            },
        );
        t.outputs.insert(tag, raw);
        transcoders.push(tid);
    }
    c.transforms.insert(id.to_string(), t);
    Ok(transcoders)
}
