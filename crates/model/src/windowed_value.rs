//! Decoded `beam:coder:windowed_value:v1` headers around still-encoded
//! values ([`WindowedValue`]), plus small helpers for KV and iterable bytes.

use crate::coder::Coder;
use crate::error::{Error, Result};
use crate::pane::PaneInfo;
use crate::timestamp::Timestamp;
use crate::varint::decode_varint;
use crate::window::Window;

/// An element with its event-time metadata. Only the header is decoded; the
/// value stays as bytes.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct WindowedValue {
    /// Event timestamp, ms since epoch.
    pub timestamp: Timestamp,
    /// Windows the element belongs to (usually exactly one).
    pub windows: Vec<Window>,
    /// Pane the element was produced in.
    pub pane: PaneInfo,
    /// The value's encoded bytes, as encoded by the value coder, nested.
    pub value: Vec<u8>,
}

/// How many elements encoded in zero bytes one iterable may hold: a count
/// of 2^31 global windows would otherwise take the process's memory from
/// four bytes of input.
pub const MAX_EMPTY_ELEMENTS: usize = 1 << 20;

/// Counts one more iterable element of zero bytes in `empty`.
///
/// # Errors
/// [`Error::Invalid`] past [`MAX_EMPTY_ELEMENTS`].
pub(crate) fn count_empty_element(empty: &mut usize) -> Result<()> {
    *empty += 1;
    if *empty > MAX_EMPTY_ELEMENTS {
        return Err(Error::invalid(
            "iterable",
            format!("more than {MAX_EMPTY_ELEMENTS} elements of zero bytes"),
        ));
    }
    Ok(())
}

/// Read a `beam:coder:iterable:v1` (4-byte BE count then the elements, or
/// count -1 and varint-counted chunks ending with 0) from the front of
/// `bytes`, each element decoded by `element` (which returns it and the
/// bytes it used); returns the elements and bytes consumed.
///
/// # Errors
/// [`Error::Truncated`] when `bytes` ends early; [`Error::Invalid`] for a
/// negative count other than -1, a negative chunk size or more than
/// [`MAX_EMPTY_ELEMENTS`] elements of zero bytes; `element`'s errors.
pub fn decode_iterable<T>(
    bytes: &[u8],
    mut element: impl FnMut(&[u8]) -> Result<(T, usize)>,
) -> Result<(Vec<T>, usize)> {
    let raw = bytes.get(..4).ok_or(Error::Truncated {
        what: "iterable count",
    })?;
    let count = i32::from_be_bytes(raw.try_into().expect("4 bytes"));
    let mut pos = 4;
    let mut out = Vec::new();
    // Elements that took no bytes (global windows, say): only these are not
    // bounded by the input's length.
    let mut empty = 0usize;
    let mut read = |n: i64, pos: &mut usize, out: &mut Vec<T>| -> Result<()> {
        for _ in 0..n {
            let rest = bytes.get(*pos..).ok_or(Error::Truncated {
                what: "iterable element",
            })?;
            let (t, used) = element(rest)?;
            if used == 0 {
                count_empty_element(&mut empty)?;
            }
            *pos += used;
            out.push(t);
        }
        Ok(())
    };
    if count >= 0 {
        out.reserve((count as usize).min(16));
        read(i64::from(count), &mut pos, &mut out)?;
    } else if count == -1 {
        loop {
            let (k, n) = decode_varint(bytes.get(pos..).unwrap_or(&[]))?;
            pos += n;
            if k == 0 {
                break;
            }
            if k < 0 {
                return Err(Error::invalid("iterable", format!("chunk count {k}")));
            }
            read(k, &mut pos, &mut out)?;
        }
    } else {
        return Err(Error::invalid("iterable", format!("count {count}")));
    }
    Ok((out, pos))
}

/// Read a window list, i.e. a `beam:coder:iterable:v1` of windows (see
/// [`decode_iterable`]), from the front of `bytes`; returns the windows and
/// bytes consumed.
///
/// # Errors
/// [`Error::Truncated`] when `bytes` ends early; window decoding errors.
pub fn decode_windows(window_coder: &Coder, bytes: &[u8]) -> Result<(Vec<Window>, usize)> {
    decode_iterable(bytes, |b| Window::decode(window_coder, b))
}

/// Append a window list as [`decode_windows`] reads it: a 4-byte BE count
/// then each window ([`Window::encode`]). Panics past `i32::MAX` windows.
pub fn encode_windows(windows: &[Window], out: &mut Vec<u8>) {
    let n = i32::try_from(windows.len()).expect("more than i32::MAX windows");
    out.extend_from_slice(&n.to_be_bytes());
    for w in windows {
        w.encode(out);
    }
}

impl WindowedValue {
    /// Decode one windowed value (beam:coder:windowed_value:v1 with the given value and window coders) from the front of `bytes`; returns it and bytes consumed. The value bytes are measured with value_coder.encoded_len.
    ///
    /// `window_coder` must be decodable by [`Window::decode`]; `value_coder`
    /// must be measurable by [`Coder::encoded_len`] (e.g. after
    /// [`Coder::length_prefix_unknown`]).
    pub fn decode(
        value_coder: &Coder,
        window_coder: &Coder,
        bytes: &[u8],
    ) -> Result<(WindowedValue, usize)> {
        let (timestamp, mut pos) = Timestamp::decode(bytes)?;
        let (windows, n) = decode_windows(window_coder, &bytes[pos..])?;
        pos += n;
        let (pane, n) = PaneInfo::decode(&bytes[pos..])?;
        pos += n;
        let len = value_coder.encoded_len(&bytes[pos..])?;
        let value = bytes[pos..pos + len].to_vec();
        pos += len;
        Ok((
            WindowedValue {
                timestamp,
                windows,
                pane,
                value,
            },
            pos,
        ))
    }

    /// Byte length of the first windowed value (as [`WindowedValue::decode`]
    /// reads it) in `bytes`, measured without copying its value or window
    /// list.
    ///
    /// # Errors
    /// As [`WindowedValue::decode`]: truncated bytes, undecodable windows or
    /// pane, a value `value_coder` cannot measure.
    pub fn encoded_len(value_coder: &Coder, window_coder: &Coder, bytes: &[u8]) -> Result<usize> {
        let (_, mut pos) = Timestamp::decode(bytes)?;
        let rest = &bytes[pos..];
        if rest.get(..4) == Some(&1i32.to_be_bytes()[..]) {
            // One window, the common case: no window list built.
            pos += 4 + Window::decode(window_coder, &rest[4..])?.1;
        } else {
            pos += decode_windows(window_coder, rest)?.1;
        }
        pos += PaneInfo::encoded_len(&bytes[pos..])?;
        pos += value_coder.encoded_len(&bytes[pos..])?;
        Ok(pos)
    }

    /// Append the `windowed_value` encoding: timestamp (8 bytes), 4-byte BE
    /// window count, each window ([`Window::encode`]), pane, then the raw
    /// `value` bytes unchanged (header then raw value bytes).
    pub fn encode(&self, out: &mut Vec<u8>) {
        self.timestamp.encode(out);
        encode_windows(&self.windows, out);
        self.pane.encode(out);
        out.extend_from_slice(&self.value);
    }

    /// Decode every element of a concatenated stream (Fn API data plane payload).
    ///
    /// The whole of `bytes` must be consumed; a partial trailing element is
    /// an error ([`Error::Truncated`]).
    pub fn decode_all(
        value_coder: &Coder,
        window_coder: &Coder,
        bytes: &[u8],
    ) -> Result<Vec<WindowedValue>> {
        let mut out = Vec::new();
        let mut pos = 0;
        while pos < bytes.len() {
            let (wv, n) = WindowedValue::decode(value_coder, window_coder, &bytes[pos..])?;
            pos += n;
            out.push(wv);
        }
        Ok(out)
    }

    /// Decode the constant header of a `beam:coder:param_windowed_value:v1`
    /// from its coder `payload` (a full windowed_value encoding whose value is
    /// an empty nested `bytes`), combined with an already-encoded `value`.
    pub fn from_param_payload(
        window_coder: &Coder,
        payload: &[u8],
        value: Vec<u8>,
    ) -> Result<WindowedValue> {
        let (mut wv, _) = WindowedValue::decode(&Coder::Bytes, window_coder, payload)?;
        wv.value = value;
        Ok(wv)
    }
}

/// Split encoded KV bytes into (key bytes, value bytes) using the kv coder's key coder length. Error if coder is not Kv.
///
/// `bytes` should hold exactly one encoded KV (nested key, then value): the
/// value slice is everything after the key and is not validated.
/// [`Error::Invalid`] if `kv_coder` is not [`Coder::Kv`]; errors from
/// measuring the key are passed through.
pub fn split_kv<'a>(kv_coder: &Coder, bytes: &'a [u8]) -> Result<(&'a [u8], &'a [u8])> {
    match kv_coder {
        Coder::Kv(key, _) => {
            let n = key.encoded_len(bytes)?;
            Ok(bytes.split_at(n))
        }
        other => Err(Error::invalid(
            "kv coder",
            format!("expected beam:coder:kv:v1, got {}", other.urn()),
        )),
    }
}

/// Encode an iterable of already-encoded element byte strings (each in
/// nested form for the element coder): see [`begin_iterable`].
pub fn encode_iterable<'a>(elements: impl ExactSizeIterator<Item = &'a [u8]>, out: &mut Vec<u8>) {
    let chunked = begin_iterable(elements.len() as u64, out);
    for e in elements {
        out.extend_from_slice(e);
    }
    end_iterable(chunked, out);
}

/// Writes the head of an iterable of `count` elements (`beam:coder:iterable:v1`)
/// whose encodings the caller appends next: the 4-byte BE count, or past
/// `i32::MAX` elements the chunked form's count -1 and one chunk's varint
/// count. Returns whether it chose the chunked form, whose end
/// [`end_iterable`] then writes after the elements.
pub fn begin_iterable(count: u64, out: &mut Vec<u8>) -> bool {
    match i32::try_from(count) {
        Ok(n) => {
            out.extend_from_slice(&n.to_be_bytes());
            false
        }
        Err(_) => {
            out.extend_from_slice(&(-1i32).to_be_bytes());
            // Under 2^63 elements: no u64 count of real data is larger.
            crate::varint::encode_varint(count as i64, out);
            true
        }
    }
}

/// Ends an iterable [`begin_iterable`] began: the chunked form's empty
/// last chunk (varint 0), nothing for the counted form.
pub fn end_iterable(chunked: bool, out: &mut Vec<u8>) {
    if chunked {
        out.push(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(b: &[u8]) -> String {
        b.iter().map(|x| format!("{x:02x}")).collect()
    }

    fn unhex(s: &str) -> Vec<u8> {
        let s: String = s.chars().filter(|c| !c.is_whitespace()).collect();
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    /// Past `i32::MAX` elements an iterable takes the chunked form, which
    /// the iterable coder reads back.
    #[test]
    fn iterables_past_i32_max_elements_are_chunked() {
        let mut out = Vec::new();
        let chunked = begin_iterable(1 << 31, &mut out);
        end_iterable(chunked, &mut out);
        assert!(chunked);
        assert_eq!(hex(&out), "ffffffff" .to_owned() + "8080808008" + "00");
        let mut small = Vec::new();
        assert!(!begin_iterable(3, &mut small));
        assert_eq!(hex(&small), "00000003");
        // The chunked form of three varints reads back as them.
        let coder = Coder::Iterable(Box::new(Coder::VarInt));
        let bytes = unhex("ffffffff 03 01 02 03 00");
        assert_eq!(coder.encoded_len(&bytes).unwrap(), bytes.len());
    }

    #[test]
    fn impulse_element_bytes() {
        let impulse = WindowedValue {
            timestamp: Timestamp::MIN,
            windows: vec![Window::Global],
            pane: PaneInfo::NO_FIRING,
            value: vec![0], // empty bytes, nested: varint length 0
        };
        let mut out = Vec::new();
        impulse.encode(&mut out);
        assert_eq!(hex(&out), "7fdf3b645a1cac09000000010f00");
        let (back, n) = WindowedValue::decode(&Coder::Bytes, &Coder::GlobalWindow, &out).unwrap();
        assert_eq!(n, out.len());
        assert_eq!(back, impulse);
        let wvc = Coder::WindowedValue {
            value: Box::new(Coder::Bytes),
            window: Box::new(Coder::GlobalWindow),
        };
        assert_eq!(wvc.encoded_len(&out).unwrap(), 14);
    }

    #[test]
    fn on_time_end_of_global_window() {
        // As produced by the Python SDK (its GlobalWindow max timestamp).
        let wv = WindowedValue {
            timestamp: Timestamp::PYTHON_END_OF_GLOBAL_WINDOW,
            windows: vec![Window::Global],
            pane: PaneInfo::ON_TIME_AND_ONLY_FIRING,
            value: vec![0x02],
        };
        let mut out = Vec::new();
        wv.encode(&mut out);
        assert_eq!(hex(&out), "8020c49ba0bcf7f6000000010702");
        assert_eq!(
            WindowedValue::decode(&Coder::VarInt, &Coder::GlobalWindow, &out)
                .unwrap()
                .0,
            wv
        );
    }

    #[test]
    fn decode_all_stream() {
        // Two elements from Beam's windowed_value vectors, concatenated.
        let a = unhex("7ffffffffff9e580 00000001 80000152 9aa49b68 c08b11 0f 04");
        let b = unhex(
            "7fffffffffffff9c 00000002 800001529aa49b68 80dddb01 7fdf3b645a1cad76 ed02 0f 02",
        );
        let stream = [a.clone(), b.clone()].concat();
        let all =
            WindowedValue::decode_all(&Coder::VarInt, &Coder::IntervalWindow, &stream).unwrap();
        assert_eq!(all.len(), 2);
        assert_eq!(all[0].timestamp, Timestamp(-400000));
        assert_eq!(all[1].windows.len(), 2);
        assert_eq!(all[1].value, vec![2]);
        let mut re = Vec::new();
        for wv in &all {
            wv.encode(&mut re);
        }
        assert_eq!(re, stream);
        assert!(matches!(
            WindowedValue::decode_all(
                &Coder::VarInt,
                &Coder::IntervalWindow,
                &stream[..stream.len() - 1]
            ),
            Err(Error::Truncated { .. })
        ));
    }

    #[test]
    fn kv_and_iterable_helpers() {
        let kv = Coder::Kv(Box::new(Coder::StringUtf8), Box::new(Coder::VarInt));
        let (k, v) = split_kv(&kv, b"\x03key\x05").unwrap();
        assert_eq!((k, v), (&b"\x03key"[..], &b"\x05"[..]));
        assert!(split_kv(&Coder::Bytes, b"\x00").is_err());
        let mut out = Vec::new();
        encode_iterable([&b"\x01"[..], &b"\x02"[..]].into_iter(), &mut out);
        assert_eq!(out, vec![0, 0, 0, 2, 1, 2]);
        let it = Coder::Iterable(Box::new(Coder::VarInt));
        assert_eq!(it.encoded_len(&out).unwrap(), out.len());
    }

    #[test]
    fn param_payload() {
        let payload = unhex("7fdf3b645a1cac09 00000001 0f 00");
        let wv =
            WindowedValue::from_param_payload(&Coder::GlobalWindow, &payload, vec![2]).unwrap();
        assert_eq!(wv.timestamp, Timestamp::MIN);
        assert_eq!(wv.windows, vec![Window::Global]);
        assert_eq!(wv.pane, PaneInfo::NO_FIRING);
    }

    #[test]
    fn a_huge_count_of_zero_byte_windows_is_refused_not_allocated() {
        // Timestamp, then 0x7fffffff global windows (zero bytes each), then a pane.
        let mut bytes = unhex("7fdf3b645a1cac09 7fffffff 0f 00");
        let err = WindowedValue::decode(&Coder::Bytes, &Coder::GlobalWindow, &bytes).unwrap_err();
        assert!(err.to_string().contains("more than 1048576 elements of zero bytes"), "{err}");
        // The chunked form: count -1, then a chunk of 2^62 windows.
        bytes = unhex("7fdf3b645a1cac09 ffffffff 808080808080808040 00 0f 00");
        let err = WindowedValue::decode(&Coder::Bytes, &Coder::GlobalWindow, &bytes).unwrap_err();
        assert!(err.to_string().contains("zero bytes"), "{err}");
        let wvc = Coder::WindowedValue { value: Box::new(Coder::Bytes), window: Box::new(Coder::GlobalWindow) };
        let err = wvc.encoded_len(&bytes).unwrap_err();
        assert!(err.to_string().contains("zero bytes"), "{err}");
        // A real element's single global window still decodes.
        let one = unhex("7fdf3b645a1cac09 00000001 0f 00");
        assert_eq!(WindowedValue::decode(&Coder::Bytes, &Coder::GlobalWindow, &one).unwrap().0.windows, vec![Window::Global]);
    }
}
