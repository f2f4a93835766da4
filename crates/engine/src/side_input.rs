//! Materialized side inputs, as the State API serves them.
//!
//! Keys follow `StateKey.IterableSideInput` / `MultimapSideInput` /
//! `MultimapKeysSideInput` (beam_fn_api.proto): the consuming transform id,
//! its side input id, the encoded window, and for multimaps the encoded key
//! in the outer (unnested) context, as the SDK's key coder `encode`s it.

use std::collections::HashMap;

use weir_model::windowed_value::split_kv;
use weir_model::{Coder, WindowedValue};
use weir_plan::SideInputKind;

/// One side input's contents by encoded window.
#[derive(Debug, Default)]
struct View {
    /// Encoded window -> concatenated nested values.
    iterable: HashMap<Vec<u8>, Vec<u8>>,
    /// Encoded window -> outer-encoded key -> concatenated nested values.
    multimap: HashMap<Vec<u8>, HashMap<Vec<u8>, Vec<u8>>>,
    /// Encoded window -> concatenated nested keys (first-seen order).
    keys: HashMap<Vec<u8>, Vec<u8>>,
}

/// Every side input of one stage, keyed by (transform id, side input id).
#[derive(Debug, Default)]
pub struct SideInputs {
    views: HashMap<(String, String), View>,
}

/// What to materialize for one side input.
pub struct SideInputSpec<'a> {
    pub transform_id: &'a str,
    pub local_name: &'a str,
    pub kind: SideInputKind,
    pub value_coder: &'a Coder,
    pub window_coder: &'a Coder,
}

/// The outer-context encoding of a value given its nested encoding: bytes and
/// strings drop their length prefix; a KV's last component recurses.
fn nested_to_outer<'a>(coder: &Coder, nested: &'a [u8]) -> Result<&'a [u8], String> {
    match coder {
        Coder::Bytes | Coder::StringUtf8 => {
            let (len, used) = weir_model::varint::decode_varint(nested).map_err(|e| e.to_string())?;
            nested.get(used..used + len as usize).ok_or_else(|| "truncated key".to_string())
        }
        _ => Ok(nested),
    }
}

impl SideInputs {
    /// Builds the views of `specs` from their elements (encoded windowed values).
    ///
    /// # Errors
    /// A message when an element does not decode, or a multimap side input is not KV-coded.
    pub fn build(specs: &[SideInputSpec<'_>], data: &[Vec<Vec<u8>>]) -> Result<SideInputs, String> {
        let mut views = HashMap::new();
        for (spec, elements) in specs.iter().zip(data) {
            let mut view = View::default();
            for e in elements {
                let (wv, _) = WindowedValue::decode(spec.value_coder, spec.window_coder, e).map_err(|e| e.to_string())?;
                for w in &wv.windows {
                    let mut wb = Vec::new();
                    w.encode(&mut wb);
                    match spec.kind {
                        SideInputKind::Iterable => view.iterable.entry(wb).or_default().extend_from_slice(&wv.value),
                        SideInputKind::Multimap => {
                            let Coder::Kv(key_coder, _) = spec.value_coder else {
                                return Err(format!("multimap side input {} is not KV-coded", spec.local_name));
                            };
                            let (k, v) = split_kv(spec.value_coder, &wv.value).map_err(|e| e.to_string())?;
                            let outer = nested_to_outer(key_coder, k)?.to_vec();
                            let by_key = view.multimap.entry(wb.clone()).or_default();
                            if !by_key.contains_key(&outer) {
                                view.keys.entry(wb).or_default().extend_from_slice(k);
                            }
                            by_key.entry(outer).or_default().extend_from_slice(v);
                        }
                    }
                }
            }
            views.insert((spec.transform_id.to_string(), spec.local_name.to_string()), view);
        }
        Ok(SideInputs { views })
    }

    fn view(&self, transform_id: &str, local_name: &str) -> Option<&View> {
        self.views.get(&(transform_id.to_string(), local_name.to_string()))
    }

    /// Concatenated values of an iterable side input in `window` (empty when
    /// the window has no data); `None` when the stage has no such side input.
    pub fn iterable(&self, transform_id: &str, local_name: &str, window: &[u8]) -> Option<&[u8]> {
        let v = self.view(transform_id, local_name)?;
        Some(v.iterable.get(window).map(|b| b.as_slice()).unwrap_or(&[]))
    }

    /// Concatenated values for `key` (outer-encoded) of a multimap side input in `window`.
    pub fn multimap_values(&self, transform_id: &str, local_name: &str, window: &[u8], key: &[u8]) -> Option<&[u8]> {
        let v = self.view(transform_id, local_name)?;
        Some(v.multimap.get(window).and_then(|m| m.get(key)).map(|b| b.as_slice()).unwrap_or(&[]))
    }

    /// Concatenated distinct keys (nested encoding) of a multimap side input in `window`.
    pub fn multimap_keys(&self, transform_id: &str, local_name: &str, window: &[u8]) -> Option<&[u8]> {
        let v = self.view(transform_id, local_name)?;
        Some(v.keys.get(window).map(|b| b.as_slice()).unwrap_or(&[]))
    }
}
