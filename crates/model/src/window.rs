//! Windows as the runner handles them: the global window and interval
//! windows `[start, end)`, with their Beam wire encodings
//! (`beam:coder:global_window:v1`, `beam:coder:interval_window:v1`).

use crate::coder::Coder;
use crate::error::{Error, Result};
use crate::timestamp::Timestamp;
use crate::varint::{decode_varint, encode_varint};

/// A Beam window. Ordering (derived) puts `Global` first, then intervals by
/// `(start, end)`; it is only meant for use as a map key.
#[derive(
    Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
pub enum Window {
    /// The single global window; its max timestamp is
    /// [`Timestamp::END_OF_GLOBAL_WINDOW`].
    Global,
    /// Half-open interval `[start, end)` in milliseconds since the epoch
    /// (Beam `IntervalWindow`).
    Interval {
        /// Inclusive start (ms).
        start: Timestamp,
        /// Exclusive end (ms).
        end: Timestamp,
    },
    /// A window of a custom type (e.g. a Python `BoundedWindow` subclass with
    /// its own coder), opaque to the runner: its complete encoding under a
    /// length-prefixed window coder. Its max timestamp is unknown to the
    /// runner and taken as [`Timestamp::MAX`].
    Custom(Vec<u8>),
}

impl Window {
    /// The last timestamp (ms) that belongs to the window: `Global` ->
    /// [`Timestamp::END_OF_GLOBAL_WINDOW`]; `Interval` -> `end - 1` ms
    /// (saturating at `i64::MIN`).
    pub fn max_timestamp(&self) -> Timestamp {
        match self {
            Window::Global => Timestamp::END_OF_GLOBAL_WINDOW,
            Window::Interval { end, .. } => end.saturating_sub_millis(1),
            Window::Custom(_) => Timestamp::MAX,
        }
    }

    /// Append the Beam encoding: `Global` writes 0 bytes; `Interval` writes
    /// the end timestamp (8 bytes, [`Timestamp::encode`]) then a varint of the
    /// span `end - start` in ms (wrapping arithmetic, never panics).
    pub fn encode(&self, out: &mut Vec<u8>) {
        match self {
            Window::Custom(bytes) => out.extend_from_slice(bytes),
            Window::Global => {}
            Window::Interval { start, end } => {
                end.encode(out);
                encode_varint(end.0.wrapping_sub(start.0), out);
            }
        }
    }

    /// Decode one window from the front of `bytes` using `window_coder`;
    /// returns it and the bytes consumed.
    ///
    /// `window_coder` must be [`Coder::GlobalWindow`] (consumes 0 bytes) or
    /// [`Coder::IntervalWindow`] (8-byte end + varint span; `start = end -
    /// span`). As a convenience, `LengthPrefix` of a decodable window coder
    /// and `CustomWindow` (8-byte max-timestamp prefix, skipped) of one are
    /// also accepted. Any other coder -> [`Error::Invalid`].
    pub fn decode(window_coder: &Coder, bytes: &[u8]) -> Result<(Window, usize)> {
        match window_coder {
            Coder::GlobalWindow => Ok((Window::Global, 0)),
            Coder::IntervalWindow => {
                let (end, n) = Timestamp::decode(bytes)?;
                let (span, m) = decode_varint(&bytes[n..])?;
                let start = Timestamp(end.0.wrapping_sub(span));
                Ok((Window::Interval { start, end }, n + m))
            }
            Coder::LengthPrefix(inner) => {
                let (len, n) = decode_varint(bytes)?;
                let len = usize::try_from(len)
                    .map_err(|_| Error::invalid("window", format!("negative length {len}")))?;
                let body = bytes
                    .get(n..)
                    .and_then(|b| b.get(..len))
                    .ok_or(Error::Truncated { what: "window" })?;
                if !matches!(
                    **inner,
                    Coder::GlobalWindow
                        | Coder::IntervalWindow
                        | Coder::CustomWindow(_)
                        | Coder::LengthPrefix(_)
                ) {
                    return Ok((Window::Custom(bytes[..n + len].to_vec()), n + len));
                }
                let (w, used) = Window::decode(inner, body)?;
                if used != len {
                    return Err(Error::invalid(
                        "window",
                        format!("length prefix says {len} bytes but window used {used}"),
                    ));
                }
                Ok((w, n + len))
            }
            Coder::CustomWindow(inner) => {
                if bytes.len() < 8 {
                    return Err(Error::Truncated { what: "window" });
                }
                let (w, used) = Window::decode(inner, &bytes[8..])?;
                Ok((w, 8 + used))
            }
            other => Err(Error::invalid(
                "window coder",
                format!("{} cannot be decoded into a Window", other.urn()),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(b: &[u8]) -> String {
        b.iter().map(|x| format!("{x:02x}")).collect()
    }

    #[test]
    fn global() {
        let mut out = Vec::new();
        Window::Global.encode(&mut out);
        assert!(out.is_empty());
        assert_eq!(
            Window::decode(&Coder::GlobalWindow, &[1, 2]).unwrap(),
            (Window::Global, 0)
        );
        assert_eq!(
            Window::Global.max_timestamp(),
            Timestamp::END_OF_GLOBAL_WINDOW
        );
        let mut ts = Vec::new();
        Window::Global.max_timestamp().encode(&mut ts);
        assert_eq!(hex(&ts), "8020c49ba0bcf7f7");
    }

    #[test]
    fn interval() {
        // From Beam's standard_coders.yaml: {end: 1454293425000, span: 3600000}.
        let w = Window::Interval {
            start: Timestamp(1454293425000 - 3600000),
            end: Timestamp(1454293425000),
        };
        let mut out = Vec::new();
        w.encode(&mut out);
        assert_eq!(hex(&out), "80000152 9aa49b68 80dddb01".replace(' ', ""));
        assert_eq!(
            Window::decode(&Coder::IntervalWindow, &out).unwrap(),
            (w.clone(), 12)
        );
        assert_eq!(w.max_timestamp(), Timestamp(1454293425000 - 1));
        assert!(matches!(
            Window::decode(&Coder::IntervalWindow, &out[..9]),
            Err(Error::Truncated { .. })
        ));
        assert!(matches!(
            Window::decode(&Coder::Bytes, &out),
            Err(Error::Invalid { .. })
        ));
        let lp = Coder::LengthPrefix(Box::new(Coder::IntervalWindow));
        let mut prefixed = vec![12];
        prefixed.extend_from_slice(&out);
        assert_eq!(Window::decode(&lp, &prefixed).unwrap(), (w, 13));
    }
}
