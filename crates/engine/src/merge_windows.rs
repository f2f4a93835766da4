//! Window merging by the SDK, for GroupByKeys over a custom merging WindowFn.
//!
//! The GroupByKey sends the windows of the keys that got new windows to its
//! merge stage (`beam:transform:merge_windows:v1`, see
//! `weir_graph::StageKind::GroupByKey::merge_windows`) as one bundle, and
//! applies the merges that come back before it fires any of those windows.
//! Encodings (beam_runner_api.proto, `MERGE_WINDOWS`):
//! - request element: `KV<nonce, iterable<window>>`, the nonce a
//!   `beam:coder:bytes:v1` holding the request's index as 4 big-endian bytes;
//! - response element: `KV<nonce, KV<iterable<window left unmerged>,
//!   iterable<KV<merged window, iterable<window merged into it>>>>>`;
//!
//! both as windowed values in the global window at Beam's MIN timestamp.

use weir_model::varint::{decode_varint, encode_varint};
use weir_model::windowed_value::{decode_iterable, decode_windows, encode_windows};
use weir_model::{Coder, PaneInfo, Timestamp, Window, WindowedValue};

/// How the windows of one key merge: each merged window with the windows it
/// replaces (a merged window may be one of them).
pub type Merges = Vec<(Window, Vec<Window>)>;

/// Encodes one request element per `(key, windows)` of `requests`; the
/// element's nonce is its index in `requests`.
pub fn encode_request<'a>(requests: impl Iterator<Item = &'a [Window]>) -> Vec<Vec<u8>> {
    requests
        .enumerate()
        .map(|(i, windows)| {
            let mut value = Vec::new();
            encode_varint(4, &mut value);
            value.extend_from_slice(&(i as u32).to_be_bytes());
            encode_windows(windows, &mut value);
            let mut out = Vec::new();
            WindowedValue {
                timestamp: Timestamp::MIN,
                windows: vec![Window::Global],
                pane: PaneInfo::NO_FIRING,
                value,
            }
            .encode(&mut out);
            out
        })
        .collect()
}

/// Decodes the merge stage's output (concatenated windowed values) whose
/// windows are coded with `window_coder`: per response, the request index
/// (nonce) and the merges of that key's windows.
///
/// # Errors
/// A message naming what did not decode (a nonce that is not 4 bytes, a
/// truncated element).
pub fn decode_response(window_coder: &Coder, bytes: &[u8]) -> Result<Vec<(usize, Merges)>, String> {
    let windows = Coder::Iterable(Box::new(window_coder.clone()));
    let value_coder = Coder::Kv(
        Box::new(Coder::Bytes),
        Box::new(Coder::Kv(
            Box::new(windows.clone()),
            Box::new(Coder::Iterable(Box::new(Coder::Kv(
                Box::new(window_coder.clone()),
                Box::new(windows),
            )))),
        )),
    );
    let elements = WindowedValue::decode_all(&value_coder, &Coder::GlobalWindow, bytes)
        .map_err(|e| format!("merge_windows output: {e}"))?;
    elements
        .iter()
        .map(|wv| {
            decode_value(window_coder, &wv.value).map_err(|e| format!("merge_windows output: {e}"))
        })
        .collect()
}

fn decode_value(window_coder: &Coder, v: &[u8]) -> Result<(usize, Merges), String> {
    let (len, mut pos) = decode_varint(v).map_err(|e| e.to_string())?;
    let nonce: [u8; 4] = v
        .get(pos..pos + len as usize)
        .and_then(|n| n.try_into().ok())
        .ok_or_else(|| format!("nonce of {len} bytes, expected 4"))?;
    pos += 4;
    let (_unmerged, n) = decode_windows(window_coder, &v[pos..]).map_err(|e| e.to_string())?;
    pos += n;
    let (merges, _) = decode_iterable(&v[pos..], |b| {
        let (merged, n) = Window::decode(window_coder, b)?;
        let (originals, m) = decode_windows(window_coder, &b[n..])?;
        Ok(((merged, originals), n + m))
    })
    .map_err(|e| e.to_string())?;
    Ok((u32::from_be_bytes(nonce) as usize, merges))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(start: i64, end: i64) -> Window {
        Window::Interval {
            start: Timestamp(start),
            end: Timestamp(end),
        }
    }

    /// Encodes what an SDK's merge_windows writes: KV<nonce, KV<unmerged, merges>>.
    fn response(nonce: u32, unmerged: &[Window], merges: &[(Window, Vec<Window>)]) -> Vec<u8> {
        let mut value = vec![4];
        value.extend_from_slice(&nonce.to_be_bytes());
        encode_windows(unmerged, &mut value);
        let parts: Vec<Vec<u8>> = merges
            .iter()
            .map(|(m, originals)| {
                let mut b = Vec::new();
                m.encode(&mut b);
                encode_windows(originals, &mut b);
                b
            })
            .collect();
        weir_model::windowed_value::encode_iterable(parts.iter().map(|p| p.as_slice()), &mut value);
        let mut out = Vec::new();
        WindowedValue {
            timestamp: Timestamp::MIN,
            windows: vec![Window::Global],
            pane: PaneInfo::NO_FIRING,
            value,
        }
        .encode(&mut out);
        out
    }

    #[test]
    fn request_elements_carry_the_index_as_nonce_and_the_windows() {
        let requests = [vec![w(0, 10), w(5, 20)], vec![w(100, 110)]];
        let elements = encode_request(requests.iter().map(|r| r.as_slice()));
        assert_eq!(elements.len(), 2);
        let (wv, used) = WindowedValue::decode(
            &Coder::Kv(
                Box::new(Coder::Bytes),
                Box::new(Coder::Iterable(Box::new(Coder::IntervalWindow))),
            ),
            &Coder::GlobalWindow,
            &elements[1],
        )
        .unwrap();
        assert_eq!(used, elements[1].len());
        assert_eq!(wv.timestamp, Timestamp::MIN);
        assert_eq!(wv.windows, vec![Window::Global]);
        // nonce: length 4, index 1; then one window: end 110 (8 bytes), span 10.
        assert_eq!(&wv.value[..5], &[4, 0, 0, 0, 1]);
        assert_eq!(&wv.value[5..9], &1i32.to_be_bytes());
        let (windows, _) = decode_windows(&Coder::IntervalWindow, &wv.value[5..]).unwrap();
        assert_eq!(windows, vec![w(100, 110)]);
    }

    #[test]
    fn responses_decode_to_merges_per_request() {
        let mut bytes = response(1, &[w(1, 2)], &[(w(0, 20), vec![w(0, 10), w(5, 20)])]);
        bytes.extend(response(0, &[w(7, 8), w(9, 10)], &[]));
        let decoded = decode_response(&Coder::IntervalWindow, &bytes).unwrap();
        assert_eq!(
            decoded,
            vec![(1, vec![(w(0, 20), vec![w(0, 10), w(5, 20)])]), (0, vec![])]
        );
    }

    #[test]
    fn a_bad_nonce_is_reported() {
        let mut bytes = response(0, &[], &[]);
        // Make the nonce 3 bytes long: the element no longer decodes as sent.
        let at = 8 + 4 + 1;
        bytes[at] = 3;
        assert!(decode_response(&Coder::IntervalWindow, &bytes).is_err());
    }
}
