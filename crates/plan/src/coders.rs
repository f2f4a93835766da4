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
    let c = lookup(coders, id)?.clone();
    let u = urn(&c);
    if MEASURABLE_LEAVES.contains(&u) {
        return Ok(id.to_string());
    }
    if STRUCTURAL.contains(&u) {
        let mut comps = Vec::with_capacity(c.component_coder_ids.len());
        for comp in &c.component_coder_ids {
            comps.push(wire_coder_id(coders, comp)?);
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
    let c = lookup(coders, id)?;
    let comps = c
        .component_coder_ids
        .iter()
        .map(|comp| to_model(coders, comp))
        .collect::<Result<Vec<_>>>()?;
    let payload = c.spec.as_ref().map(|s| s.payload.as_slice()).unwrap_or(&[]);
    Coder::from_urn(urn(c), payload, comps).map_err(|source| PlanError::Coder {
        coder_id: id.to_string(),
        source,
    })
}
