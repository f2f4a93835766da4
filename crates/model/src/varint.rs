//! Beam's `VarInt`: unsigned LEB128 of the 64-bit two's-complement bit
//! pattern of an `i64` (**not** zigzag). Non-negative values below 128 take one
//! byte; any negative value takes the full 10 bytes (e.g. `-1` is
//! `ff ff ff ff ff ff ff ff ff 01`). This is the encoding of
//! `beam:coder:varint:v1` and of every length prefix in Beam's coders.

use crate::error::{Error, Result};

/// Maximum number of bytes a Beam varint can occupy (ceil(64 / 7)).
pub const MAX_VARINT_LEN: usize = 10;

/// Append the Beam varint encoding of `v` (1 to 10 bytes) to `out`.
pub fn encode_varint(v: i64, out: &mut Vec<u8>) {
    let mut u = v as u64;
    loop {
        if u < 0x80 {
            out.push(u as u8);
            return;
        }
        out.push((u as u8 & 0x7f) | 0x80);
        u >>= 7;
    }
}

/// Decode a Beam varint from the front of `bytes`.
///
/// Returns the value (the 64-bit pattern reinterpreted as `i64`) and the
/// number of bytes consumed (1..=10). Errors: [`Error::Truncated`] if the
/// slice ends while the continuation bit is still set; [`Error::Invalid`] if
/// the encoding is longer than 10 bytes or sets bits beyond bit 63.
pub fn decode_varint(bytes: &[u8]) -> Result<(i64, usize)> {
    let mut result: u64 = 0;
    for i in 0..MAX_VARINT_LEN {
        let b = *bytes.get(i).ok_or(Error::Truncated { what: "varint" })?;
        let chunk = (b & 0x7f) as u64;
        if i == MAX_VARINT_LEN - 1 && chunk > 1 {
            return Err(Error::invalid("varint", "value overflows 64 bits"));
        }
        result |= chunk << (7 * i);
        if b & 0x80 == 0 {
            return Ok((result as i64, i + 1));
        }
    }
    Err(Error::invalid("varint", "longer than 10 bytes"))
}

/// Number of bytes [`encode_varint`] would write for `v` (1..=10).
pub fn varint_len(v: i64) -> usize {
    let mut u = v as u64;
    let mut n = 1;
    while u >= 0x80 {
        u >>= 7;
        n += 1;
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    fn enc(v: i64) -> Vec<u8> {
        let mut out = Vec::new();
        encode_varint(v, &mut out);
        out
    }

    #[test]
    fn known_encodings() {
        assert_eq!(enc(0), vec![0]);
        assert_eq!(enc(1), vec![1]);
        assert_eq!(enc(200), vec![0xc8, 0x01]);
        assert_eq!(enc(9001), vec![0xa9, 0x46]);
        assert_eq!(
            enc(-1),
            vec![0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01]
        );
    }

    #[test]
    fn round_trip_and_len() {
        for v in [0i64, 1, 127, 128, 300, i64::MAX, i64::MIN, -1, -2, 1 << 40] {
            let e = enc(v);
            assert_eq!(e.len(), varint_len(v));
            assert_eq!(decode_varint(&e).unwrap(), (v, e.len()));
            let mut with_tail = e.clone();
            with_tail.extend_from_slice(&[9, 9]);
            assert_eq!(decode_varint(&with_tail).unwrap(), (v, e.len()));
        }
    }

    #[test]
    fn errors() {
        assert!(matches!(decode_varint(&[]), Err(Error::Truncated { .. })));
        assert!(matches!(
            decode_varint(&[0x80]),
            Err(Error::Truncated { .. })
        ));
        assert!(matches!(
            decode_varint(&[0xff; 11]),
            Err(Error::Invalid { .. })
        ));
        let mut too_big = vec![0xff; 9];
        too_big.push(0x02);
        assert!(matches!(
            decode_varint(&too_big),
            Err(Error::Invalid { .. })
        ));
    }
}
