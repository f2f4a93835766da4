//! Wire coders: the coders Weir puts on the Fn API data plane.
//!
//! The runner must find element boundaries and split KVs, so every coder it
//! cannot measure (`beam:coder:pickled_python:v1`, rows, custom coders) is
//! wrapped in `beam:coder:length_prefix:v1`; kv, iterable and nullable keep
//! their structure so the runner can see keys and values. SDK harnesses use
//! exactly these coders in the descriptors Weir sends, so both sides agree.

use std::collections::HashMap;

use weir_model::Coder;
use weir_proto::{beam, urns};

use crate::{PlanError, Result};

const STRUCTURAL: &[&str] = &[
    urns::coder::KV,
    urns::coder::ITERABLE,
    urns::coder::NULLABLE,
    urns::coder::TIMER,
];
const MEASURABLE_LEAVES: &[&str] = &[
    urns::coder::BYTES,
    urns::coder::STRING_UTF8,
    urns::coder::VARINT,
    urns::coder::BOOL,
    urns::coder::DOUBLE,
    urns::coder::GLOBAL_WINDOW,
    urns::coder::INTERVAL_WINDOW,
    urns::coder::LENGTH_PREFIX,
];

/// How deep coders may nest (components of components...). A client's
/// coder graph may have a cycle (a coder among its own components), which
/// the recursive walks below would otherwise follow until the stack
/// overflows and the server aborts: [`crate::validate`] refuses those
/// first, and these walks stop at the same depth too.
use crate::validate::MAX_CODER_DEPTH;

fn too_deep(id: &str) -> PlanError {
    PlanError::Invalid(format!(
        "coder {id:?} nests more than {MAX_CODER_DEPTH} coders deep (do its component coders form a cycle?)"
    ))
}

fn lookup<'a>(coders: &'a HashMap<String, beam::Coder>, id: &str) -> Result<&'a beam::Coder> {
    coders
        .get(id)
        .ok_or_else(|| PlanError::Invalid(format!("unknown coder id {id:?}")))
}

fn urn(c: &beam::Coder) -> &str {
    c.spec.as_ref().map(|s| s.urn.as_str()).unwrap_or("")
}

/// Returns the id of the wire form of coder `id`, adding new coders to
/// `coders` as needed. Idempotent: the wire form of a wire coder is itself.
pub(crate) fn wire_coder_id(coders: &mut HashMap<String, beam::Coder>, id: &str) -> Result<String> {
    wire_coder_id_at(coders, id, 0)
}

fn wire_coder_id_at(
    coders: &mut HashMap<String, beam::Coder>,
    id: &str,
    depth: usize,
) -> Result<String> {
    if depth > MAX_CODER_DEPTH {
        return Err(too_deep(id));
    }
    let c = lookup(coders, id)?.clone();
    let u = urn(&c);
    if MEASURABLE_LEAVES.contains(&u) {
        return Ok(id.to_string());
    }
    if STRUCTURAL.contains(&u) {
        let mut comps = Vec::with_capacity(c.component_coder_ids.len());
        for comp in &c.component_coder_ids {
            comps.push(wire_coder_id_at(coders, comp, depth + 1)?);
        }
        if comps == c.component_coder_ids {
            return Ok(id.to_string());
        }
        let new_id = format!("{id}/weir:wire");
        let mut n = c.clone();
        n.component_coder_ids = comps;
        coders.insert(new_id.clone(), n);
        return Ok(new_id);
    }
    let new_id = format!("{id}/weir:lp");
    coders.entry(new_id.clone()).or_insert_with(|| beam::Coder {
        spec: Some(beam::FunctionSpec {
            urn: urns::coder::LENGTH_PREFIX.into(),
            payload: vec![],
        }),
        component_coder_ids: vec![id.to_string()],
    });
    Ok(new_id)
}

/// Adds coder `id` (URN `urn`, no payload, `components` by id) to `coders`
/// unless it is there already; returns `id`.
pub(crate) fn add_coder(
    coders: &mut HashMap<String, beam::Coder>,
    id: String,
    urn: &str,
    components: Vec<String>,
) -> String {
    coders.entry(id.clone()).or_insert_with(|| beam::Coder {
        spec: Some(beam::FunctionSpec {
            urn: urn.into(),
            payload: vec![],
        }),
        component_coder_ids: components,
    });
    id
}

/// Adds (or finds) `beam:coder:windowed_value:v1` of `value` and `window` coders.
pub(crate) fn windowed_coder_id(
    coders: &mut HashMap<String, beam::Coder>,
    value: &str,
    window: &str,
) -> String {
    add_coder(
        coders,
        format!("weir:wv({value},{window})"),
        urns::coder::WINDOWED_VALUE,
        vec![value.to_string(), window.to_string()],
    )
}

/// Converts coder `id` (and its components) to the model's [`Coder`].
pub(crate) fn to_model(coders: &HashMap<String, beam::Coder>, id: &str) -> Result<Coder> {
    to_model_at(coders, id, 0)
}

fn to_model_at(coders: &HashMap<String, beam::Coder>, id: &str, depth: usize) -> Result<Coder> {
    if depth > MAX_CODER_DEPTH {
        return Err(too_deep(id));
    }
    let c = lookup(coders, id)?;
    let comps = c
        .component_coder_ids
        .iter()
        .map(|comp| to_model_at(coders, comp, depth + 1))
        .collect::<Result<Vec<_>>>()?;
    let payload = c.spec.as_ref().map(|s| s.payload.as_slice()).unwrap_or(&[]);
    Coder::from_urn(urn(c), payload, comps).map_err(|source| PlanError::Coder {
        coder_id: id.to_string(),
        source,
    })
}

/// How the elements of a TestStream (`TestStreamPayload.coder_id` =
/// `payload`) reach the data plane: the coder of the PCollection the
/// TestStream writes, and whether each `TimestampedElement.encoded_element`
/// must be length-prefixed to be in that coder.
///
/// `encoded_element` is the element in the payload coder's **outer**
/// context (Python `coder.encode`, Java `CoderUtils.encodeToByteArray`: a
/// string or bytes without its length, a KV whose value has none), which
/// the runner cannot turn into the nested context for coders it does not
/// know. So the elements travel as `length_prefix(payload)`: a varint
/// length, then the outer encoding, which is exactly how every SDK encodes
/// and decodes a `length_prefix` coder (the inner value in the outer
/// context), so the SDK decodes the bytes it wrote. Two cases are already
/// in that form and are not prefixed again:
///
/// * the payload coder is a `length_prefix` coder (same bytes in both contexts);
/// * a Go custom coder ([`urns::coder::GO_CUSTOM`]): the Go SDK has no outer
///   context and its element encoder writes the length prefix itself (its
///   pipeline declares the output as `length_prefix(custom)`).
///
/// The returned coder id is `payload` itself or `<payload>/weir:lp`, added
/// to `coders` when missing (the id [`wire_coder_id`] gives a coder it
/// length-prefixes).
pub(crate) fn test_stream_element_coder(
    coders: &mut HashMap<String, beam::Coder>,
    payload: &str,
) -> Result<TestStreamElements> {
    let u = urn(lookup(coders, payload)?).to_string();
    if u == urns::coder::LENGTH_PREFIX {
        return Ok(TestStreamElements {
            coder_id: payload.to_string(),
            prefix: false,
        });
    }
    let coder_id = add_coder(
        coders,
        format!("{payload}/weir:lp"),
        urns::coder::LENGTH_PREFIX,
        vec![payload.to_string()],
    );
    Ok(TestStreamElements {
        coder_id,
        prefix: u != urns::coder::GO_CUSTOM,
    })
}

/// See [`test_stream_element_coder`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct TestStreamElements {
    /// Coder id of the PCollection the TestStream writes its elements to.
    pub coder_id: String,
    /// Each `encoded_element` gets a varint length prefix.
    pub prefix: bool,
}

impl TestStreamElements {
    /// One `encoded_element` as the data plane carries it in `coder_id`.
    pub fn wire_form(&self, encoded_element: &[u8]) -> Vec<u8> {
        if !self.prefix {
            return encoded_element.to_vec();
        }
        let mut out = Vec::with_capacity(encoded_element.len() + 5);
        weir_model::varint::encode_varint(encoded_element.len() as i64, &mut out);
        out.extend_from_slice(encoded_element);
        out
    }
}

/// True when coder ids `a` and `b` name the same coder: the same id, or the
/// same URN and payload over components that are the same coders. Coders
/// nested deeper than [`MAX_CODER_DEPTH`] are not the same.
pub(crate) fn same_coder(coders: &HashMap<String, beam::Coder>, a: &str, b: &str) -> bool {
    same_coder_at(coders, a, b, 0)
}

fn same_coder_at(coders: &HashMap<String, beam::Coder>, a: &str, b: &str, depth: usize) -> bool {
    if a == b {
        return true;
    }
    if depth > MAX_CODER_DEPTH {
        return false;
    }
    let (Some(ca), Some(cb)) = (coders.get(a), coders.get(b)) else {
        return false;
    };
    ca.spec == cb.spec
        && ca.component_coder_ids.len() == cb.component_coder_ids.len()
        && ca
            .component_coder_ids
            .iter()
            .zip(&cb.component_coder_ids)
            .all(|(x, y)| same_coder_at(coders, x, y, depth + 1))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn coder(urn: &str, components: &[&str]) -> beam::Coder {
        beam::Coder {
            spec: Some(beam::FunctionSpec {
                urn: urn.into(),
                payload: vec![],
            }),
            component_coder_ids: components.iter().map(|c| c.to_string()).collect(),
        }
    }

    /// Coders that are their own components (a client's pipeline may say
    /// so) are an error naming the coder, not a stack overflow.
    #[test]
    fn cyclic_coders_are_refused() {
        let mut coders: HashMap<String, beam::Coder> = [
            ("a", coder(urns::coder::KV, &["s", "b"])),
            ("b", coder(urns::coder::KV, &["s", "a"])),
            ("c", coder(urns::coder::KV, &["s", "d"])),
            ("d", coder(urns::coder::KV, &["s", "c"])),
            ("s", coder(urns::coder::STRING_UTF8, &[])),
        ]
        .into_iter()
        .map(|(id, c)| (id.to_string(), c))
        .collect();
        let err = to_model(&coders, "a").unwrap_err().to_string();
        assert!(err.contains("nests more than 64 coders deep"), "{err}");
        let err = wire_coder_id(&mut coders, "a").unwrap_err().to_string();
        assert!(err.contains("nests more than 64 coders deep"), "{err}");
        assert!(!same_coder(&coders, "a", "c"));
        assert!(same_coder(&coders, "a", "a"));
        // A deep but acyclic coder still converts.
        let mut id = "s".to_string();
        for n in 0..60 {
            let next = format!("kv{n}");
            coders.insert(next.clone(), coder(urns::coder::KV, &["s", &id]));
            id = next;
        }
        assert!(to_model(&coders, &id).is_ok());
    }
}
