//! Element framing: finding element boundaries in data-plane bytes.

use weir_model::{Coder, PaneInfo, Timestamp, Window, WindowedValue};

/// Splits concatenated encoded windowed values into one byte vector per element.
///
/// # Errors
/// A message when the bytes do not decode with the given coders.
pub fn split_elements(
    value_coder: &Coder,
    window_coder: &Coder,
    bytes: &[u8],
) -> Result<Vec<Vec<u8>>, String> {
    let mut out = Vec::new();
    let mut pos = 0;
    while pos < bytes.len() {
        let (_, used) = WindowedValue::decode(value_coder, window_coder, &bytes[pos..])
            .map_err(|e| e.to_string())?;
        out.push(bytes[pos..pos + used].to_vec());
        pos += used;
    }
    Ok(out)
}

/// The one element `beam:transform:impulse:v1` emits: an empty byte array in
/// the global window at Beam's minimum timestamp, pane with no firing info.
/// `value_coder` is the wire coder of Impulse's output (bytes, possibly
/// length-prefixed).
pub fn impulse_element(value_coder: &Coder) -> Vec<u8> {
    let value = match value_coder {
        Coder::LengthPrefix(_) => vec![1, 0],
        _ => vec![0],
    };
    let wv = WindowedValue {
        timestamp: Timestamp::MIN,
        windows: vec![Window::Global],
        pane: PaneInfo::NO_FIRING,
        value,
    };
    let mut out = Vec::new();
    wv.encode(&mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn impulse_matches_beam_bytes() {
        let e = impulse_element(&Coder::Bytes);
        let hex: String = e.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(hex, "7fdf3b645a1cac09000000010f00");
    }

    #[test]
    fn splits_concatenated_elements() {
        let one = impulse_element(&Coder::Bytes);
        let mut two = one.clone();
        two.extend_from_slice(&one);
        let parts = split_elements(&Coder::Bytes, &Coder::GlobalWindow, &two).unwrap();
        assert_eq!(parts, vec![one.clone(), one]);
    }
}
