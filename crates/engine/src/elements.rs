//! Element framing: finding element boundaries in data-plane bytes.

use weir_model::{Coder, PaneInfo, Timestamp, Window, WindowedValue};

/// The leading elements of concatenated encoded windowed values, at most
/// `max_bytes` of them (but at least one when `bytes` is not empty), one
/// byte vector each, and the bytes they took.
///
/// # Errors
/// A message when the bytes do not decode with the given coders.
pub fn split_prefix(
    value_coder: &Coder,
    window_coder: &Coder,
    bytes: &[u8],
    max_bytes: usize,
) -> Result<(Vec<Vec<u8>>, usize), String> {
    split_whole(value_coder, window_coder, bytes, max_bytes, false)
}

/// Like [`split_prefix`], but when `more_follows` a partial element at the
/// end is left for later (it may go on in bytes not read yet) instead of
/// failing; then no element at all means more bytes are needed.
pub(crate) fn split_whole(
    value_coder: &Coder,
    window_coder: &Coder,
    bytes: &[u8],
    max_bytes: usize,
    more_follows: bool,
) -> Result<(Vec<Vec<u8>>, usize), String> {
    let mut out = Vec::new();
    let mut pos = 0;
    while pos < bytes.len() {
        let used = match WindowedValue::encoded_len(value_coder, window_coder, &bytes[pos..]) {
            Ok(used) => used,
            Err(weir_model::Error::Truncated { .. }) if more_follows => break,
            Err(e) => return Err(e.to_string()),
        };
        if pos > 0 && pos + used > max_bytes {
            break;
        }
        out.push(bytes[pos..pos + used].to_vec());
        pos += used;
    }
    Ok((out, pos))
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
        let (parts, _) = split_prefix(&Coder::Bytes, &Coder::GlobalWindow, &two, usize::MAX).unwrap();
        assert_eq!(parts, vec![one.clone(), one]);
    }

    #[test]
    fn split_prefix_stops_at_max_bytes_but_takes_one() {
        let element = |windows: Vec<Window>, value: &[u8]| {
            let mut out = Vec::new();
            WindowedValue {
                timestamp: Timestamp(7),
                windows,
                pane: PaneInfo::NO_FIRING,
                value: value.to_vec(),
            }
            .encode(&mut out);
            out
        };
        let interval = |a, b| Window::Interval {
            start: Timestamp(a),
            end: Timestamp(b),
        };
        let mut lp = vec![3];
        lp.extend_from_slice(b"abc");
        let parts = [
            element(vec![interval(0, 10)], &lp),
            element(vec![interval(0, 10), interval(5, 15)], &[0]),
            element(vec![], &[1, 9]),
        ];
        let bytes = parts.concat();
        let (vc, wc) = (Coder::Bytes, Coder::IntervalWindow);
        // Measured lengths agree with a full decode.
        for p in &parts {
            assert_eq!(
                WindowedValue::encoded_len(&vc, &wc, p).unwrap(),
                WindowedValue::decode(&vc, &wc, p).unwrap().1
            );
        }
        assert_eq!(split_prefix(&vc, &wc, &bytes, usize::MAX).unwrap(), (parts.to_vec(), bytes.len()));
        let first_two = parts[0].len() + parts[1].len();
        assert_eq!(
            split_prefix(&vc, &wc, &bytes, first_two).unwrap(),
            (parts[..2].to_vec(), first_two)
        );
        assert_eq!(
            split_prefix(&vc, &wc, &bytes, 1).unwrap(),
            (parts[..1].to_vec(), parts[0].len())
        );
        assert_eq!(split_prefix(&vc, &wc, &[], 1).unwrap(), (vec![], 0));
        assert!(split_prefix(&vc, &wc, &bytes[..bytes.len() - 1], usize::MAX).is_err());
    }
}
