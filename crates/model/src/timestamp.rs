//! Event-time timestamps in **milliseconds since the Unix epoch**.
//!
//! Beam defines its bounds in microseconds (`i64::MIN` / `i64::MAX` µs); on
//! the wire every SDK truncates them to milliseconds, giving
//! [`Timestamp::MIN`] = `-9223372036854775` ms and [`Timestamp::MAX`] =
//! `9223372036854775` ms. No clamping is done anywhere in this module:
//! values outside `[MIN, MAX]` are carried through encode/decode unchanged
//! (they should not occur in valid Beam data); comparisons against
//! `MIN`/`MAX` are the caller's business (e.g. a watermark at `MAX` means
//! "done").

use crate::error::{Error, Result};

const SIGN_BIT: u64 = 1 << 63;

/// A Beam event-time instant, in milliseconds since the Unix epoch (may be
/// negative). Ordering is numeric.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
pub struct Timestamp(pub i64);

impl Timestamp {
    /// Beam's `MIN_TIMESTAMP` in milliseconds: `i64::MIN / 1000` =
    /// `-9223372036854775` (encodes as `7fdf3b645a1cac09`). Used for
    /// "before all data" (e.g. the initial watermark, impulse timestamps).
    pub const MIN: Timestamp = Timestamp(i64::MIN / 1000);

    /// Beam's `MAX_TIMESTAMP` in milliseconds: `i64::MAX / 1000` =
    /// `9223372036854775` (encodes as `8020c49ba5e353f7`). A watermark at
    /// `MAX` means no more data will arrive.
    pub const MAX: Timestamp = Timestamp(i64::MAX / 1000);

    /// The global window's max timestamp: [`Timestamp::MAX`] minus one day
    /// (86_400_000 ms) = `9223371950454775`, encoding as `8020c49ba0bcf7f7`.
    /// This is the Runner API constant `GLOBAL_WINDOW_MAX_TIMESTAMP_MILLIS`
    /// and Java's/Go's `GlobalWindow` max timestamp.
    ///
    /// Note: the Python SDK treats that constant as the window's *end* and
    /// reports `GlobalWindow().max_timestamp()` as 1 µs earlier, which
    /// truncates to one millisecond less on the wire; see
    /// [`Timestamp::PYTHON_END_OF_GLOBAL_WINDOW`].
    pub const END_OF_GLOBAL_WINDOW: Timestamp = Timestamp(i64::MAX / 1000 - 86_400_000);

    /// What the Python SDK puts on the wire for
    /// `GlobalWindow().max_timestamp()`: [`Timestamp::END_OF_GLOBAL_WINDOW`]
    /// minus 1 ms = `9223371950454774`, encoding as `8020c49ba0bcf7f6`. Seen
    /// e.g. as the timestamp of on-time global-window output produced by
    /// Python. Treat both values as "end of the global window" when
    /// comparing SDK-produced timestamps.
    pub const PYTHON_END_OF_GLOBAL_WINDOW: Timestamp = Timestamp(i64::MAX / 1000 - 86_400_000 - 1);

    /// The value in milliseconds since the epoch.
    pub fn millis(self) -> i64 {
        self.0
    }

    /// Append Beam's timestamp encoding (Java `InstantCoder`, Python
    /// `TimestampCoder`): exactly 8 bytes, big-endian, of the millisecond
    /// value's bit pattern with the sign bit flipped, so that byte-wise
    /// ordering matches numeric ordering.
    pub fn encode(self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.to_timely().to_be_bytes());
    }

    /// Decode the 8-byte encoding written by [`Timestamp::encode`] from the
    /// front of `bytes`. Returns the timestamp and the bytes consumed
    /// (always 8); [`Error::Truncated`] if fewer than 8 bytes are available.
    pub fn decode(bytes: &[u8]) -> Result<(Timestamp, usize)> {
        let raw: [u8; 8] = bytes
            .get(..8)
            .ok_or(Error::Truncated { what: "timestamp" })?
            .try_into()
            .expect("slice of length 8");
        Ok((Timestamp::from_timely(u64::from_be_bytes(raw)), 8))
    }

    /// Order-preserving map to `u64` for use as a timely-dataflow timestamp:
    /// `(ms as u64) ^ (1 << 63)`. `Timestamp(i64::MIN)` maps to 0, `MIN` and
    /// `MAX` map to ordinary interior values; `a < b` iff
    /// `a.to_timely() < b.to_timely()`.
    pub fn to_timely(self) -> u64 {
        (self.0 as u64) ^ SIGN_BIT
    }

    /// Inverse of [`Timestamp::to_timely`] (total; every `u64` maps to a
    /// timestamp).
    pub fn from_timely(t: u64) -> Timestamp {
        Timestamp((t ^ SIGN_BIT) as i64)
    }

    /// `self + ms` milliseconds, saturating at the `i64` range (not at
    /// `MIN`/`MAX`).
    pub fn saturating_add_millis(self, ms: i64) -> Timestamp {
        Timestamp(self.0.saturating_add(ms))
    }

    /// `self - ms` milliseconds, saturating at the `i64` range (not at
    /// `MIN`/`MAX`).
    pub fn saturating_sub_millis(self, ms: i64) -> Timestamp {
        Timestamp(self.0.saturating_sub(ms))
    }
}

impl std::fmt::Display for Timestamp {
    /// Formats as `<millis>ms`, or `MIN` / `MAX` / `END_OF_GLOBAL_WINDOW` for
    /// those special values.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            Timestamp::MIN => write!(f, "MIN"),
            Timestamp::MAX => write!(f, "MAX"),
            Timestamp::END_OF_GLOBAL_WINDOW => write!(f, "END_OF_GLOBAL_WINDOW"),
            Timestamp(ms) => write!(f, "{ms}ms"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(b: &[u8]) -> String {
        b.iter().map(|x| format!("{x:02x}")).collect()
    }

    fn enc(t: Timestamp) -> Vec<u8> {
        let mut out = Vec::new();
        t.encode(&mut out);
        out
    }

    #[test]
    fn constants() {
        assert_eq!(Timestamp::MIN.millis(), -9223372036854775);
        assert_eq!(Timestamp::MAX.millis(), 9223372036854775);
        assert_eq!(Timestamp::END_OF_GLOBAL_WINDOW.millis(), 9223371950454775);
    }

    #[test]
    fn beam_wire_bytes() {
        assert_eq!(hex(&enc(Timestamp::MIN)), "7fdf3b645a1cac09");
        assert_eq!(
            hex(&enc(Timestamp::END_OF_GLOBAL_WINDOW)),
            "8020c49ba0bcf7f7"
        );
        assert_eq!(
            hex(&enc(Timestamp::PYTHON_END_OF_GLOBAL_WINDOW)),
            "8020c49ba0bcf7f6"
        );
        assert_eq!(hex(&enc(Timestamp::MAX)), "8020c49ba5e353f7");
        assert_eq!(hex(&enc(Timestamp(0))), "8000000000000000");
        assert_eq!(hex(&enc(Timestamp(-100))), "7fffffffffffff9c");
    }

    #[test]
    fn round_trip_and_order() {
        let ts = [
            i64::MIN,
            Timestamp::MIN.0,
            -1,
            0,
            1,
            Timestamp::MAX.0,
            i64::MAX,
        ];
        for w in ts.windows(2) {
            let (a, b) = (Timestamp(w[0]), Timestamp(w[1]));
            assert!(a.to_timely() < b.to_timely());
            assert!(enc(a) < enc(b));
        }
        for t in ts {
            let t = Timestamp(t);
            assert_eq!(Timestamp::from_timely(t.to_timely()), t);
            let mut e = enc(t);
            e.push(0xaa);
            assert_eq!(Timestamp::decode(&e).unwrap(), (t, 8));
        }
        assert!(matches!(
            Timestamp::decode(&[0; 7]),
            Err(Error::Truncated { .. })
        ));
    }
}
