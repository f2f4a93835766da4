//! A [`Plan`] as bytes, so that a cluster's coordinator plans a job once and
//! its workers run that plan (each with its own Fn API address) instead of
//! planning again.
//!
//! Layout: three parts, each a `u32` big-endian length and its bytes: the
//! stage graph as JSON; a `RegisterRequest` (beam_fn_api.proto) holding the
//! descriptors in key order; a `Components` holding the environments.

use std::collections::HashMap;

use prost::Message;
use weir_proto::{beam, urns};

use crate::{Plan, PlanError, Result, StageGraph};

#[derive(serde::Serialize, serde::Deserialize)]
struct Header {
    graph: StageGraph,
    /// The key of each descriptor of the `RegisterRequest`, in its order.
    descriptor_keys: Vec<String>,
}

impl Plan {
    /// The plan as bytes for [`Plan::from_bytes`].
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut keys: Vec<&String> = self.descriptors.keys().collect();
        keys.sort();
        let header = Header {
            graph: self.graph.clone(),
            descriptor_keys: keys.iter().map(|k| (*k).clone()).collect(),
        };
        let register = beam::RegisterRequest {
            process_bundle_descriptor: keys.iter().map(|k| self.descriptors[*k].clone()).collect(),
        };
        let components = beam::Components {
            environments: self.environments.clone().into_iter().collect(),
            ..Default::default()
        };
        let mut out = Vec::new();
        for part in [
            serde_json::to_vec(&header).expect("a stage graph serializes"),
            register.encode_to_vec(),
            components.encode_to_vec(),
        ] {
            out.extend_from_slice(&(part.len() as u32).to_be_bytes());
            out.extend_from_slice(&part);
        }
        out
    }

    /// A plan from the bytes [`Plan::to_bytes`] made.
    ///
    /// # Errors
    /// [`PlanError::Invalid`] naming the part that is truncated or undecodable.
    pub fn from_bytes(mut bytes: &[u8]) -> Result<Plan> {
        let mut part = |what: &str| -> Result<&[u8]> {
            let bad = || PlanError::Invalid(format!("a shipped plan's {what} is truncated"));
            let len = bytes.get(..4).ok_or_else(bad)?;
            let len = u32::from_be_bytes(len.try_into().map_err(|_| bad())?) as usize;
            let end = len.checked_add(4).ok_or_else(bad)?;
            let body = bytes.get(4..end).ok_or_else(bad)?;
            bytes = &bytes[end..];
            Ok(body)
        };
        let invalid =
            |what: &str, e: String| PlanError::Invalid(format!("a shipped plan's {what}: {e}"));
        let header: Header = serde_json::from_slice(part("stage graph")?)
            .map_err(|e| invalid("stage graph", e.to_string()))?;
        let register = beam::RegisterRequest::decode(part("descriptors")?)
            .map_err(|e| invalid("descriptors", e.to_string()))?;
        let components = beam::Components::decode(part("environments")?)
            .map_err(|e| invalid("environments", e.to_string()))?;
        if !bytes.is_empty() {
            return Err(invalid(
                "end",
                format!("{} bytes follow its last part", bytes.len()),
            ));
        }
        if header.descriptor_keys.len() != register.process_bundle_descriptor.len() {
            return Err(invalid(
                "descriptors",
                format!(
                    "{} keys for {} descriptors",
                    header.descriptor_keys.len(),
                    register.process_bundle_descriptor.len()
                ),
            ));
        }
        let descriptors: HashMap<String, beam::ProcessBundleDescriptor> = header
            .descriptor_keys
            .into_iter()
            .zip(register.process_bundle_descriptor)
            .collect();
        Ok(Plan {
            graph: header.graph,
            descriptors,
            environments: components.environments.into_iter().collect(),
        })
    }

    /// Points every descriptor at the Fn API (data, state and timers) served
    /// at `url` (`host:port`): what planning with
    /// [`crate::PlanOptions::fn_api_url`] = `url` would have written.
    ///
    /// # Errors
    /// [`PlanError::Invalid`] for a data source or sink whose `RemoteGrpcPort`
    /// payload does not decode (naming the stage and transform).
    pub fn rebind_fn_api(&mut self, url: &str) -> Result<()> {
        let at = |d: &mut Option<beam::ApiServiceDescriptor>| {
            if let Some(d) = d {
                d.url = url.to_string();
            }
        };
        for (stage, d) in self.descriptors.iter_mut() {
            at(&mut d.state_api_service_descriptor);
            at(&mut d.timer_api_service_descriptor);
            for (id, t) in d.transforms.iter_mut() {
                let Some(spec) = t.spec.as_mut() else {
                    continue;
                };
                if spec.urn != urns::transform::DATA_SOURCE
                    && spec.urn != urns::transform::DATA_SINK
                {
                    continue;
                }
                let mut port = beam::RemoteGrpcPort::decode(spec.payload.as_slice()).map_err(|e| {
                    PlanError::Invalid(format!(
                        "stage {stage}: transform {id} ({}): its RemoteGrpcPort does not decode: {e}",
                        spec.urn
                    ))
                })?;
                at(&mut port.api_service_descriptor);
                spec.payload = port.encode_to_vec();
            }
        }
        Ok(())
    }
}
