//! Materialized side inputs, as the State API serves them.
//!
//! Keys follow `StateKey.IterableSideInput` / `MultimapSideInput` /
//! `MultimapKeysSideInput` (beam_fn_api.proto): the consuming transform id,
//! its side input id, the encoded window, and for multimaps the encoded key
//! in the nested context (the Python SDK's `encode_nested`).

use std::collections::HashMap;

use weir_model::windowed_value::split_kv;
use weir_model::{Coder, WindowedValue};
use weir_plan::SideInputKind;

/// One side input's contents by encoded window.
#[derive(Debug, Default)]
struct View {
    /// Encoded window -> concatenated nested values.
    iterable: HashMap<Vec<u8>, Vec<u8>>,
    /// Encoded window -> nested key -> (concatenated nested values, value count).
    multimap: HashMap<Vec<u8>, HashMap<Vec<u8>, (Vec<u8>, u32)>>,
    /// Encoded window -> distinct nested keys, first-seen order.
    keys: HashMap<Vec<u8>, Vec<Vec<u8>>>,
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
                let (wv, _) = WindowedValue::decode(spec.value_coder, spec.window_coder, e)
                    .map_err(|e| e.to_string())?;
                for w in &wv.windows {
                    let mut wb = Vec::new();
                    w.encode(&mut wb);
                    match spec.kind {
                        SideInputKind::Iterable => view
                            .iterable
                            .entry(wb)
                            .or_default()
                            .extend_from_slice(&wv.value),
                        SideInputKind::Multimap => {
                            if !matches!(spec.value_coder, Coder::Kv(..)) {
                                return Err(format!(
                                    "multimap side input {} is not KV-coded",
                                    spec.local_name
                                ));
                            }
                            let (k, v) =
                                split_kv(spec.value_coder, &wv.value).map_err(|e| e.to_string())?;
                            let by_key = view.multimap.entry(wb.clone()).or_default();
                            let entry = by_key.entry(k.to_vec()).or_insert_with(|| {
                                view.keys.entry(wb).or_default().push(k.to_vec());
                                (Vec::new(), 0)
                            });
                            entry.0.extend_from_slice(v);
                            entry.1 += 1;
                        }
                    }
                }
            }
            views.insert(
                (spec.transform_id.to_string(), spec.local_name.to_string()),
                view,
            );
        }
        Ok(SideInputs { views })
    }

    fn view(&self, transform_id: &str, local_name: &str) -> Option<&View> {
        self.views
            .get(&(transform_id.to_string(), local_name.to_string()))
    }

    /// Concatenated values of an iterable side input in `window` (empty when
    /// the window has no data); `None` when the stage has no such side input.
    pub fn iterable(&self, transform_id: &str, local_name: &str, window: &[u8]) -> Option<Vec<u8>> {
        let v = self.view(transform_id, local_name)?;
        Some(v.iterable.get(window).cloned().unwrap_or_default())
    }

    /// Concatenated values for `key` (nested encoding) of a multimap side input in `window`.
    pub fn multimap_values(
        &self,
        transform_id: &str,
        local_name: &str,
        window: &[u8],
        key: &[u8],
    ) -> Option<Vec<u8>> {
        let v = self.view(transform_id, local_name)?;
        Some(
            v.multimap
                .get(window)
                .and_then(|m| m.get(key))
                .map(|(b, _)| b.clone())
                .unwrap_or_default(),
        )
    }

    /// Concatenated distinct keys (nested encoding) of a multimap side input in `window`.
    pub fn multimap_keys(
        &self,
        transform_id: &str,
        local_name: &str,
        window: &[u8],
    ) -> Option<Vec<u8>> {
        let v = self.view(transform_id, local_name)?;
        Some(v.keys.get(window).map(|ks| ks.concat()).unwrap_or_default())
    }

    /// Every key with its values, encoded as concatenated `KV<key, iterable<value>>`
    /// (`StateKey.MultimapKeysValuesSideInput`).
    pub fn multimap_keys_values(
        &self,
        transform_id: &str,
        local_name: &str,
        window: &[u8],
    ) -> Option<Vec<u8>> {
        let v = self.view(transform_id, local_name)?;
        let mut out = Vec::new();
        if let (Some(keys), Some(values)) = (v.keys.get(window), v.multimap.get(window)) {
            for k in keys {
                let (vals, count) = &values[k];
                out.extend_from_slice(k);
                out.extend_from_slice(&count.to_be_bytes());
                out.extend_from_slice(vals);
            }
        }
        Some(out)
    }
}
