//! Pane metadata attached to every windowed value ([`PaneInfo`]) and its
//! Beam wire encoding (Java `PaneInfo.PaneInfoCoder`, Python
//! `PaneInfoCoderImpl`).
//!
//! Wire layout: one header byte, optionally followed by varints.
//! * Low nibble: `is_first` (bit 0) | `is_last` (bit 1) | timing << 2 with
//!   EARLY=0, ON_TIME=1, LATE=2, UNKNOWN=3.
//! * High nibble: encoding kind. `0` FIRST: nothing follows; `1` ONE_INDEX:
//!   varint `index` follows (`on_time_index` is `-1` for EARLY panes, else
//!   equal to `index`); `2` TWO_INDICES: varint `index` then varint
//!   `on_time_index`.

use crate::error::{Error, Result};
use crate::varint::{decode_varint, encode_varint};

/// When a pane fired relative to the watermark (Beam `PaneInfo.Timing`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum PaneTiming {
    /// Fired before the watermark passed the end of the window (wire value 0).
    Early,
    /// The single on-time firing (wire value 1).
    OnTime,
    /// Fired after the watermark passed the end of the window (wire value 2).
    Late,
    /// Not produced by a trigger firing (wire value 3).
    Unknown,
}

impl PaneTiming {
    /// The 2-bit wire code: Early=0, OnTime=1, Late=2, Unknown=3.
    pub fn code(self) -> u8 {
        match self {
            PaneTiming::Early => 0,
            PaneTiming::OnTime => 1,
            PaneTiming::Late => 2,
            PaneTiming::Unknown => 3,
        }
    }

    /// Inverse of [`PaneTiming::code`]; only the low two bits of `c` are used.
    pub fn from_code(c: u8) -> PaneTiming {
        match c & 3 {
            0 => PaneTiming::Early,
            1 => PaneTiming::OnTime,
            2 => PaneTiming::Late,
            _ => PaneTiming::Unknown,
        }
    }
}

/// Beam's `PaneInfo`: which firing of a window produced an element.
///
/// `index` is the 0-based firing index within the window; `on_time_index`
/// (Beam's "nonSpeculativeIndex") counts only ON_TIME/LATE firings and is
/// `-1` for EARLY panes. Decoding a FIRST-kind header yields Beam's cached
/// values: `index` 0 if `is_first` else -1, `on_time_index` -1 if EARLY else 0.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct PaneInfo {
    /// First pane of this window.
    pub is_first: bool,
    /// Last pane of this window (no more will follow).
    pub is_last: bool,
    /// Timing of the firing relative to the watermark.
    pub timing: PaneTiming,
    /// 0-based index of the firing within the window.
    pub index: i64,
    /// Index among non-speculative (ON_TIME/LATE) firings; -1 for EARLY.
    pub on_time_index: i64,
}

const KIND_FIRST: u8 = 0;
const KIND_ONE_INDEX: u8 = 1;
const KIND_TWO_INDICES: u8 = 2;

impl PaneInfo {
    /// Beam `PaneInfo.NO_FIRING` (the default for elements not produced by a
    /// trigger): first+last, Unknown timing, index 0/0. Encodes as `0f`.
    pub const NO_FIRING: PaneInfo = PaneInfo {
        is_first: true,
        is_last: true,
        timing: PaneTiming::Unknown,
        index: 0,
        on_time_index: 0,
    };

    /// Beam `PaneInfo.ON_TIME_AND_ONLY_FIRING`: first+last, OnTime, index
    /// 0/0. Encodes as `07`.
    pub const ON_TIME_AND_ONLY_FIRING: PaneInfo = PaneInfo {
        is_first: true,
        is_last: true,
        timing: PaneTiming::OnTime,
        index: 0,
        on_time_index: 0,
    };

    /// The low-nibble byte: is_first | is_last<<1 | timing<<2.
    fn low_nibble(&self) -> u8 {
        (self.is_first as u8) | ((self.is_last as u8) << 1) | (self.timing.code() << 2)
    }

    /// Beam's choice of encoding kind (identical to Java and Python).
    fn kind(&self) -> u8 {
        if (self.index == 0 && self.on_time_index == 0) || self.timing == PaneTiming::Unknown {
            KIND_FIRST
        } else if self.index == self.on_time_index || self.timing == PaneTiming::Early {
            KIND_ONE_INDEX
        } else {
            KIND_TWO_INDICES
        }
    }

    /// Append the Beam encoding (1 byte, plus 1-2 varints for later panes).
    /// Like Beam, indices of Unknown-timing panes are not written.
    pub fn encode(&self, out: &mut Vec<u8>) {
        let kind = self.kind();
        out.push(self.low_nibble() | (kind << 4));
        if kind >= KIND_ONE_INDEX {
            encode_varint(self.index, out);
        }
        if kind == KIND_TWO_INDICES {
            encode_varint(self.on_time_index, out);
        }
    }

    /// Decode a pane from the front of `bytes`; returns it and the bytes
    /// consumed (1 to 21). [`Error::Invalid`] for an encoding kind other than
    /// 0, 1, 2; [`Error::Truncated`] if input runs out.
    pub fn decode(bytes: &[u8]) -> Result<(PaneInfo, usize)> {
        let b = *bytes
            .first()
            .ok_or(Error::Truncated { what: "pane info" })?;
        let is_first = b & 1 != 0;
        let timing = PaneTiming::from_code(b >> 2);
        let mut pane = PaneInfo {
            is_first,
            is_last: b & 2 != 0,
            timing,
            index: if is_first { 0 } else { -1 },
            on_time_index: if timing == PaneTiming::Early { -1 } else { 0 },
        };
        let mut pos = 1;
        match b >> 4 {
            KIND_FIRST => {}
            KIND_ONE_INDEX => {
                let (index, n) = decode_varint(&bytes[pos..])?;
                pos += n;
                pane.index = index;
                pane.on_time_index = if timing == PaneTiming::Early {
                    -1
                } else {
                    index
                };
            }
            KIND_TWO_INDICES => {
                let (index, n) = decode_varint(&bytes[pos..])?;
                pos += n;
                let (on_time, n) = decode_varint(&bytes[pos..])?;
                pos += n;
                pane.index = index;
                pane.on_time_index = on_time;
            }
            k => {
                return Err(Error::invalid(
                    "pane info",
                    format!("unknown encoding kind {k} in header byte {b:#04x}"),
                ))
            }
        }
        Ok((pane, pos))
    }

    /// Number of bytes the pane encoding at the front of `bytes` occupies,
    /// without building the value. Same errors as [`PaneInfo::decode`].
    pub fn encoded_len(bytes: &[u8]) -> Result<usize> {
        PaneInfo::decode(bytes).map(|(_, n)| n)
    }
}

impl Default for PaneInfo {
    /// [`PaneInfo::NO_FIRING`].
    fn default() -> Self {
        PaneInfo::NO_FIRING
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn enc(p: PaneInfo) -> Vec<u8> {
        let mut out = Vec::new();
        p.encode(&mut out);
        out
    }

    #[test]
    fn well_known_bytes() {
        assert_eq!(enc(PaneInfo::NO_FIRING), vec![0x0f]);
        assert_eq!(enc(PaneInfo::ON_TIME_AND_ONLY_FIRING), vec![0x07]);
        assert_eq!(PaneInfo::decode(&[0x0f]).unwrap(), (PaneInfo::NO_FIRING, 1));
        assert_eq!(
            PaneInfo::decode(&[0x07, 0xff]).unwrap(),
            (PaneInfo::ON_TIME_AND_ONLY_FIRING, 1)
        );
    }

    #[test]
    fn indexed_panes() {
        // PaneInfo(false, true, ON_TIME, 30, 40) from Beam's param_windowed_value vector.
        let p = PaneInfo {
            is_first: false,
            is_last: true,
            timing: PaneTiming::OnTime,
            index: 30,
            on_time_index: 40,
        };
        assert_eq!(enc(p), vec![0x26, 0x1e, 0x28]);
        assert_eq!(PaneInfo::decode(&[0x26, 0x1e, 0x28]).unwrap(), (p, 3));
        // Late pane with index == on_time_index -> ONE_INDEX.
        let late = PaneInfo {
            is_first: false,
            is_last: false,
            timing: PaneTiming::Late,
            index: 3,
            on_time_index: 3,
        };
        assert_eq!(enc(late), vec![0x18, 3]);
        assert_eq!(PaneInfo::decode(&[0x18, 3]).unwrap(), (late, 2));
        // Early pane: ONE_INDEX, on_time_index -1.
        let early = PaneInfo {
            is_first: false,
            is_last: false,
            timing: PaneTiming::Early,
            index: 2,
            on_time_index: -1,
        };
        assert_eq!(enc(early), vec![0x10, 2]);
        assert_eq!(PaneInfo::decode(&[0x10, 2]).unwrap(), (early, 2));
    }

    #[test]
    fn errors() {
        assert!(matches!(
            PaneInfo::decode(&[]),
            Err(Error::Truncated { .. })
        ));
        assert!(matches!(
            PaneInfo::decode(&[0x17]),
            Err(Error::Truncated { .. })
        ));
        assert!(matches!(
            PaneInfo::decode(&[0x3f]),
            Err(Error::Invalid { .. })
        ));
    }
}
