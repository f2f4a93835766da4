//! Beam coders as a tree the runner can reason about ([`Coder`]), built from
//! Runner API coder URNs, plus [`Coder::encoded_len`], which finds the byte
//! length of one encoded value so the runner can split streams of elements
//! without decoding them.
//!
//! All lengths here are for the **nested** context (the encoding used inside
//! `kv`, `iterable`, `windowed_value` and on the Fn API data plane):
//!
//! | coder | nested encoding |
//! |---|---|
//! | bytes, string_utf8, length_prefix | varint length + bytes |
//! | varint | Beam varint (1-10 bytes) |
//! | bool | 1 byte |
//! | double | 8 bytes big-endian IEEE 754 |
//! | kv | key then value |
//! | iterable, state_backed_iterable | 4-byte BE `i32` count n ≥ 0 then n values; or count -1 then chunks (varint k, k values) until k = 0. state_backed_iterable additionally allows k = -1 followed by a varint-length state token, which ends the stream |
//! | nullable | byte 0 (null) or 1 then value |
//! | global_window | 0 bytes |
//! | interval_window | 8-byte end timestamp + varint span |
//! | custom_window | 8-byte max timestamp + window |
//! | windowed_value | timestamp (8) + 4-byte BE window count + windows + pane + value |
//! | param_windowed_value | only the value (header is in the coder payload) |
//! | timer | key, tag (varint len + bytes), windows (like iterable), clear bit (1 byte), then if not cleared: fire ts (8), hold ts (8), pane |
//! | sharded_key | varint-length shard id + key |

use crate::error::{Error, Result};
use crate::pane::PaneInfo;
use crate::varint::decode_varint;

/// URN constants for the standard coders this crate understands.
pub mod urns {
    /// `beam:coder:bytes:v1`
    pub const BYTES: &str = "beam:coder:bytes:v1";
    /// `beam:coder:string_utf8:v1`
    pub const STRING_UTF8: &str = "beam:coder:string_utf8:v1";
    /// `beam:coder:varint:v1`
    pub const VARINT: &str = "beam:coder:varint:v1";
    /// `beam:coder:bool:v1`
    pub const BOOL: &str = "beam:coder:bool:v1";
    /// `beam:coder:double:v1`
    pub const DOUBLE: &str = "beam:coder:double:v1";
    /// `beam:coder:kv:v1`
    pub const KV: &str = "beam:coder:kv:v1";
    /// `beam:coder:iterable:v1`
    pub const ITERABLE: &str = "beam:coder:iterable:v1";
    /// `beam:coder:length_prefix:v1`
    pub const LENGTH_PREFIX: &str = "beam:coder:length_prefix:v1";
    /// `beam:coder:nullable:v1`
    pub const NULLABLE: &str = "beam:coder:nullable:v1";
    /// `beam:coder:global_window:v1`
    pub const GLOBAL_WINDOW: &str = "beam:coder:global_window:v1";
    /// `beam:coder:interval_window:v1`
    pub const INTERVAL_WINDOW: &str = "beam:coder:interval_window:v1";
    /// `beam:coder:windowed_value:v1`
    pub const WINDOWED_VALUE: &str = "beam:coder:windowed_value:v1";
    /// `beam:coder:param_windowed_value:v1`
    pub const PARAM_WINDOWED_VALUE: &str = "beam:coder:param_windowed_value:v1";
    /// `beam:coder:timer:v1`
    pub const TIMER: &str = "beam:coder:timer:v1";
    /// `beam:coder:state_backed_iterable:v1`
    pub const STATE_BACKED_ITERABLE: &str = "beam:coder:state_backed_iterable:v1";
    /// `beam:coder:sharded_key:v1`
    pub const SHARDED_KEY: &str = "beam:coder:sharded_key:v1";
    /// `beam:coder:custom_window:v1`
    pub const CUSTOM_WINDOW: &str = "beam:coder:custom_window:v1";
}

/// A Beam coder tree. Component coders are boxed; payloads are raw bytes as
/// found in the Runner API `FunctionSpec.payload`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum Coder {
    /// `beam:coder:bytes:v1`: nested = varint length + bytes.
    Bytes,
    /// `beam:coder:string_utf8:v1`: nested = varint length + UTF-8 bytes.
    StringUtf8,
    /// `beam:coder:varint:v1`: Beam varint of an `i64` (1-10 bytes).
    VarInt,
    /// `beam:coder:bool:v1`: 1 byte, 0 or 1.
    Bool,
    /// `beam:coder:double:v1`: 8 bytes big-endian IEEE 754.
    Double,
    /// `beam:coder:kv:v1` (key coder, value coder): key then value.
    Kv(Box<Coder>, Box<Coder>),
    /// `beam:coder:iterable:v1` (element coder).
    Iterable(Box<Coder>),
    /// `beam:coder:length_prefix:v1` (inner coder): varint byte length then
    /// the inner encoding. The runner never needs to understand the inner coder.
    LengthPrefix(Box<Coder>),
    /// `beam:coder:nullable:v1` (inner coder): byte 0 = null, byte 1 + value.
    Nullable(Box<Coder>),
    /// `beam:coder:global_window:v1`: 0 bytes.
    GlobalWindow,
    /// `beam:coder:interval_window:v1`: 8-byte end timestamp + varint span (ms).
    IntervalWindow,
    /// `beam:coder:windowed_value:v1`: timestamp, windows, pane, value.
    WindowedValue {
        /// Coder of the value.
        value: Box<Coder>,
        /// Coder of each window.
        window: Box<Coder>,
    },
    /// `beam:coder:param_windowed_value:v1`: only the value is on the wire;
    /// `payload` holds a full `windowed_value` encoding (with an empty bytes
    /// value) giving the constant timestamp, windows and pane.
    ParamWindowedValue {
        /// Coder of the value.
        value: Box<Coder>,
        /// Coder of the windows in the payload header.
        window: Box<Coder>,
        /// The constant header, encoded as described above.
        payload: Vec<u8>,
    },
    /// `beam:coder:timer:v1` (key coder, window coder).
    Timer {
        /// Coder of the user key.
        key: Box<Coder>,
        /// Coder of each window.
        window: Box<Coder>,
    },
    /// `beam:coder:state_backed_iterable:v1` (element coder). Measurable by
    /// [`Coder::encoded_len`], but its contents may live behind a state token,
    /// so it does not count as runner-readable.
    StateBackedIterable(Box<Coder>),
    /// `beam:coder:sharded_key:v1` (key coder): varint-length shard id + key.
    ShardedKey(Box<Coder>),
    /// `beam:coder:custom_window:v1` (window coder): 8-byte max timestamp +
    /// the window. Does not count as runner-readable (the window is the SDK's).
    CustomWindow(Box<Coder>),
    /// A coder the runner does not interpret (e.g. beam:coder:pickled_python:v1, beam:coder:row:v1); the runner must wrap it in LengthPrefix before it ever needs its length.
    Opaque {
        /// The coder's URN.
        urn: String,
        /// The coder's payload, unchanged.
        payload: Vec<u8>,
        /// Its component coders, unchanged (not length-prefixed).
        components: Vec<Coder>,
    },
}

fn expect_components(urn: &str, components: &[Coder], n: usize) -> Result<()> {
    if components.len() == n {
        Ok(())
    } else {
        Err(Error::invalid(
            "coder",
            format!(
                "{urn} takes {n} component coder(s), got {}",
                components.len()
            ),
        ))
    }
}

impl Coder {
    /// Build from a Beam coder URN, its payload and already-built component coders. Standard URNs: beam:coder:bytes:v1, string_utf8, varint, bool, double, kv, iterable, length_prefix, nullable, global_window, interval_window, windowed_value, param_windowed_value, timer, state_backed_iterable, sharded_key, custom_window (all `"beam:coder:<name>:v1"`). Anything else -> Opaque. Wrong component count -> Error::Invalid.
    ///
    /// Payloads of standard coders are ignored, except for
    /// `param_windowed_value`, whose payload is kept verbatim.
    pub fn from_urn(urn: &str, payload: &[u8], components: Vec<Coder>) -> Result<Coder> {
        let n = match urn {
            urns::BYTES
            | urns::STRING_UTF8
            | urns::VARINT
            | urns::BOOL
            | urns::DOUBLE
            | urns::GLOBAL_WINDOW
            | urns::INTERVAL_WINDOW => 0,
            urns::ITERABLE
            | urns::LENGTH_PREFIX
            | urns::NULLABLE
            | urns::STATE_BACKED_ITERABLE
            | urns::SHARDED_KEY
            | urns::CUSTOM_WINDOW => 1,
            urns::KV | urns::WINDOWED_VALUE | urns::PARAM_WINDOWED_VALUE | urns::TIMER => 2,
            _ => {
                return Ok(Coder::Opaque {
                    urn: urn.to_string(),
                    payload: payload.to_vec(),
                    components,
                })
            }
        };
        expect_components(urn, &components, n)?;
        let mut it = components.into_iter().map(Box::new);
        let mut next = || it.next().expect("component count checked");
        Ok(match urn {
            urns::BYTES => Coder::Bytes,
            urns::STRING_UTF8 => Coder::StringUtf8,
            urns::VARINT => Coder::VarInt,
            urns::BOOL => Coder::Bool,
            urns::DOUBLE => Coder::Double,
            urns::GLOBAL_WINDOW => Coder::GlobalWindow,
            urns::INTERVAL_WINDOW => Coder::IntervalWindow,
            urns::ITERABLE => Coder::Iterable(next()),
            urns::LENGTH_PREFIX => Coder::LengthPrefix(next()),
            urns::NULLABLE => Coder::Nullable(next()),
            urns::STATE_BACKED_ITERABLE => Coder::StateBackedIterable(next()),
            urns::SHARDED_KEY => Coder::ShardedKey(next()),
            urns::CUSTOM_WINDOW => Coder::CustomWindow(next()),
            urns::KV => {
                let k = next();
                Coder::Kv(k, next())
            }
            urns::WINDOWED_VALUE => {
                let value = next();
                Coder::WindowedValue {
                    value,
                    window: next(),
                }
            }
            urns::PARAM_WINDOWED_VALUE => {
                let value = next();
                Coder::ParamWindowedValue {
                    value,
                    window: next(),
                    payload: payload.to_vec(),
                }
            }
            urns::TIMER => {
                let key = next();
                Coder::Timer {
                    key,
                    window: next(),
                }
            }
            _ => unreachable!("all standard URNs handled"),
        })
    }

    /// The coder's URN (`beam:coder:<name>:v1`, or the stored URN for
    /// [`Coder::Opaque`]).
    pub fn urn(&self) -> &str {
        match self {
            Coder::Bytes => urns::BYTES,
            Coder::StringUtf8 => urns::STRING_UTF8,
            Coder::VarInt => urns::VARINT,
            Coder::Bool => urns::BOOL,
            Coder::Double => urns::DOUBLE,
            Coder::Kv(..) => urns::KV,
            Coder::Iterable(_) => urns::ITERABLE,
            Coder::LengthPrefix(_) => urns::LENGTH_PREFIX,
            Coder::Nullable(_) => urns::NULLABLE,
            Coder::GlobalWindow => urns::GLOBAL_WINDOW,
            Coder::IntervalWindow => urns::INTERVAL_WINDOW,
            Coder::WindowedValue { .. } => urns::WINDOWED_VALUE,
            Coder::ParamWindowedValue { .. } => urns::PARAM_WINDOWED_VALUE,
            Coder::Timer { .. } => urns::TIMER,
            Coder::StateBackedIterable(_) => urns::STATE_BACKED_ITERABLE,
            Coder::ShardedKey(_) => urns::SHARDED_KEY,
            Coder::CustomWindow(_) => urns::CUSTOM_WINDOW,
            Coder::Opaque { urn, .. } => urn,
        }
    }

    /// The coder's payload bytes: the stored payload for
    /// `ParamWindowedValue` and `Opaque`, empty for every other coder.
    pub fn payload(&self) -> &[u8] {
        match self {
            Coder::ParamWindowedValue { payload, .. } | Coder::Opaque { payload, .. } => payload,
            _ => &[],
        }
    }

    /// Component coders in Runner API order: kv = `[key, value]`;
    /// windowed_value / param_windowed_value = `[value, window]`; timer =
    /// `[key, window]`; single-component coders = `[inner]`; leaves = `[]`;
    /// opaque = its stored components.
    pub fn components(&self) -> Vec<&Coder> {
        match self {
            Coder::Bytes
            | Coder::StringUtf8
            | Coder::VarInt
            | Coder::Bool
            | Coder::Double
            | Coder::GlobalWindow
            | Coder::IntervalWindow => vec![],
            Coder::Kv(k, v) => vec![k, v],
            Coder::Iterable(c)
            | Coder::LengthPrefix(c)
            | Coder::Nullable(c)
            | Coder::StateBackedIterable(c)
            | Coder::ShardedKey(c)
            | Coder::CustomWindow(c) => vec![c],
            Coder::WindowedValue { value, window }
            | Coder::ParamWindowedValue { value, window, .. } => vec![value, window],
            Coder::Timer { key, window } => vec![key, window],
            Coder::Opaque { components, .. } => components.iter().collect(),
        }
    }

    /// true when the runner can find the byte length of an encoded value (no Opaque/StateBackedIterable/CustomWindow anywhere except under LengthPrefix).
    pub fn is_runner_readable(&self) -> bool {
        match self {
            Coder::LengthPrefix(_) => true,
            Coder::Opaque { .. } | Coder::StateBackedIterable(_) | Coder::CustomWindow(_) => false,
            other => other
                .components()
                .into_iter()
                .all(Coder::is_runner_readable),
        }
    }

    /// Same structure with every Opaque (and any other sub-coder the runner cannot measure) wrapped in LengthPrefix. kv/iterable/windowed_value/nullable/length_prefix keep their structure. Idempotent.
    ///
    /// Concretely: `Opaque`, `StateBackedIterable` and `CustomWindow` become
    /// `LengthPrefix(<unchanged>)`; an existing `LengthPrefix` is kept as is
    /// (its inner coder is not touched); every other coder is rebuilt with
    /// its components processed recursively. The result always satisfies
    /// [`Coder::is_runner_readable`].
    pub fn length_prefix_unknown(&self) -> Coder {
        let f = |c: &Coder| Box::new(c.length_prefix_unknown());
        match self {
            Coder::Bytes
            | Coder::StringUtf8
            | Coder::VarInt
            | Coder::Bool
            | Coder::Double
            | Coder::GlobalWindow
            | Coder::IntervalWindow
            | Coder::LengthPrefix(_) => self.clone(),
            Coder::Opaque { .. } | Coder::StateBackedIterable(_) | Coder::CustomWindow(_) => {
                Coder::LengthPrefix(Box::new(self.clone()))
            }
            Coder::Kv(k, v) => Coder::Kv(f(k), f(v)),
            Coder::Iterable(c) => Coder::Iterable(f(c)),
            Coder::Nullable(c) => Coder::Nullable(f(c)),
            Coder::ShardedKey(c) => Coder::ShardedKey(f(c)),
            Coder::WindowedValue { value, window } => Coder::WindowedValue {
                value: f(value),
                window: f(window),
            },
            Coder::ParamWindowedValue {
                value,
                window,
                payload,
            } => Coder::ParamWindowedValue {
                value: f(value),
                window: f(window),
                payload: payload.clone(),
            },
            Coder::Timer { key, window } => Coder::Timer {
                key: f(key),
                window: f(window),
            },
        }
    }

    /// Byte length of the first encoded value in `bytes` (the "nested" / outer context encoding as used inside kv, iterable and on the Fn API data plane). Error::Truncated if bytes run out; Error::UnknownCoder for Opaque not under LengthPrefix.
    ///
    /// `state_backed_iterable` and `custom_window` are measured too (see the
    /// module table) even though they are not [`Coder::is_runner_readable`].
    /// Trailing bytes after the first value are ignored.
    pub fn encoded_len(&self, bytes: &[u8]) -> Result<usize> {
        let mut r = Reader { bytes, pos: 0 };
        r.skip_value(self)?;
        Ok(r.pos)
    }
}

/// Cursor used by [`Coder::encoded_len`]; `pos` never exceeds `bytes.len()`.
struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl Reader<'_> {
    fn rest(&self) -> &[u8] {
        &self.bytes[self.pos..]
    }

    fn advance(&mut self, n: usize, what: &'static str) -> Result<()> {
        if self.bytes.len() - self.pos < n {
            return Err(Error::Truncated { what });
        }
        self.pos += n;
        Ok(())
    }

    fn varint(&mut self) -> Result<i64> {
        let (v, n) = decode_varint(self.rest())?;
        self.pos += n;
        Ok(v)
    }

    fn byte(&mut self, what: &'static str) -> Result<u8> {
        let b = *self.rest().first().ok_or(Error::Truncated { what })?;
        self.pos += 1;
        Ok(b)
    }

    fn be_i32(&mut self, what: &'static str) -> Result<i32> {
        let raw = self.rest().get(..4).ok_or(Error::Truncated { what })?;
        let v = i32::from_be_bytes(raw.try_into().expect("4 bytes"));
        self.pos += 4;
        Ok(v)
    }

    /// varint length followed by that many bytes.
    fn length_prefixed(&mut self, what: &'static str) -> Result<()> {
        let len = self.varint()?;
        let len = usize::try_from(len)
            .map_err(|_| Error::invalid(what, format!("negative length {len}")))?;
        self.advance(len, what)
    }

    /// Iterable framing shared by iterable, state_backed_iterable, and the
    /// window lists of windowed_value and timer.
    fn iterable(&mut self, elem: &Coder, allow_state_token: bool) -> Result<()> {
        let count = self.be_i32("iterable count")?;
        if count >= 0 && *elem == Coder::GlobalWindow {
            return Ok(()); // zero-width elements: nothing to skip
        }
        let mut empty = 0usize;
        if count >= 0 {
            for _ in 0..count {
                self.skip_element(elem, &mut empty)?;
            }
            return Ok(());
        }
        if count != -1 {
            return Err(Error::invalid(
                "iterable",
                format!("count {count} (only -1 may be negative)"),
            ));
        }
        loop {
            let k = self.varint()?;
            if k == 0 {
                return Ok(());
            }
            if k == -1 && allow_state_token {
                return self.length_prefixed("state token");
            }
            if k < 0 {
                return Err(Error::invalid("iterable", format!("chunk count {k}")));
            }
            for _ in 0..k {
                self.skip_element(elem, &mut empty)?;
            }
        }
    }

    /// One iterable element, counting in `empty` those of zero bytes, of
    /// which an iterable holds at most
    /// [`crate::windowed_value::MAX_EMPTY_ELEMENTS`] (a chunk count of 2^62
    /// global windows would otherwise loop for ever).
    fn skip_element(&mut self, elem: &Coder, empty: &mut usize) -> Result<()> {
        let before = self.pos;
        self.skip_value(elem)?;
        if self.pos == before {
            crate::windowed_value::count_empty_element(empty)?;
        }
        Ok(())
    }

    fn pane(&mut self) -> Result<()> {
        let n = PaneInfo::encoded_len(self.rest())?;
        self.pos += n;
        Ok(())
    }

    fn skip_value(&mut self, coder: &Coder) -> Result<()> {
        match coder {
            Coder::Bytes => self.length_prefixed("bytes"),
            Coder::StringUtf8 => self.length_prefixed("string_utf8"),
            Coder::LengthPrefix(_) => self.length_prefixed("length_prefix"),
            Coder::VarInt => self.varint().map(|_| ()),
            Coder::Bool => self.advance(1, "bool"),
            Coder::Double => self.advance(8, "double"),
            Coder::Kv(k, v) => {
                self.skip_value(k)?;
                self.skip_value(v)
            }
            Coder::Iterable(e) => self.iterable(e, false),
            Coder::StateBackedIterable(e) => self.iterable(e, true),
            Coder::Nullable(c) => match self.byte("nullable")? {
                0 => Ok(()),
                1 => self.skip_value(c),
                b => Err(Error::invalid("nullable", format!("presence byte {b}"))),
            },
            Coder::GlobalWindow => Ok(()),
            Coder::IntervalWindow => {
                self.advance(8, "interval window")?;
                self.varint().map(|_| ())
            }
            Coder::CustomWindow(w) => {
                self.advance(8, "custom window")?;
                self.skip_value(w)
            }
            Coder::WindowedValue { value, window } => {
                self.advance(8, "timestamp")?;
                self.iterable(window, false)?;
                self.pane()?;
                self.skip_value(value)
            }
            Coder::ParamWindowedValue { value, .. } => self.skip_value(value),
            Coder::Timer { key, window } => {
                self.skip_value(key)?;
                self.length_prefixed("timer tag")?;
                self.iterable(window, false)?;
                if self.byte("timer clear bit")? == 0 {
                    self.advance(16, "timer timestamps")?;
                    self.pane()?;
                }
                Ok(())
            }
            Coder::ShardedKey(k) => {
                self.length_prefixed("shard id")?;
                self.skip_value(k)
            }
            Coder::Opaque { urn, .. } => Err(Error::UnknownCoder { urn: urn.clone() }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opaque(urn: &str) -> Coder {
        Coder::Opaque {
            urn: urn.into(),
            payload: vec![1, 2],
            components: vec![],
        }
    }

    #[test]
    fn from_urn_and_back() {
        let kv = Coder::from_urn(urns::KV, b"", vec![Coder::Bytes, Coder::VarInt]).unwrap();
        assert_eq!(
            kv,
            Coder::Kv(Box::new(Coder::Bytes), Box::new(Coder::VarInt))
        );
        assert_eq!(kv.urn(), urns::KV);
        assert_eq!(kv.components(), vec![&Coder::Bytes, &Coder::VarInt]);
        assert!(matches!(
            Coder::from_urn(urns::KV, b"", vec![Coder::Bytes]),
            Err(Error::Invalid { .. })
        ));
        assert!(matches!(
            Coder::from_urn(urns::BYTES, b"", vec![Coder::Bytes]),
            Err(Error::Invalid { .. })
        ));
        let o = Coder::from_urn("beam:coder:row:v1", b"xy", vec![Coder::Bytes]).unwrap();
        assert_eq!(o.urn(), "beam:coder:row:v1");
        assert_eq!(o.payload(), b"xy");
        assert_eq!(o.components(), vec![&Coder::Bytes]);
        let p = Coder::from_urn(
            urns::PARAM_WINDOWED_VALUE,
            b"hdr",
            vec![Coder::VarInt, Coder::GlobalWindow],
        )
        .unwrap();
        assert_eq!(p.payload(), b"hdr");
    }

    #[test]
    fn readability_and_length_prefixing() {
        let pickled = opaque("beam:coder:pickled_python:v1");
        let wv = Coder::WindowedValue {
            value: Box::new(Coder::Kv(
                Box::new(Coder::StringUtf8),
                Box::new(pickled.clone()),
            )),
            window: Box::new(Coder::GlobalWindow),
        };
        assert!(!wv.is_runner_readable());
        let fixed = wv.length_prefix_unknown();
        assert!(fixed.is_runner_readable());
        assert_eq!(
            fixed,
            Coder::WindowedValue {
                value: Box::new(Coder::Kv(
                    Box::new(Coder::StringUtf8),
                    Box::new(Coder::LengthPrefix(Box::new(pickled)))
                )),
                window: Box::new(Coder::GlobalWindow),
            }
        );
        assert_eq!(fixed.length_prefix_unknown(), fixed);
        let sbi = Coder::StateBackedIterable(Box::new(Coder::VarInt));
        assert!(!sbi.is_runner_readable());
        assert_eq!(
            sbi.length_prefix_unknown(),
            Coder::LengthPrefix(Box::new(sbi.clone()))
        );
    }

    #[test]
    fn lengths() {
        let kv = Coder::Kv(Box::new(Coder::Bytes), Box::new(Coder::VarInt));
        assert_eq!(kv.encoded_len(b"\x03abc\x0aTRAILING").unwrap(), 5);
        assert!(matches!(
            kv.encoded_len(b"\x03ab"),
            Err(Error::Truncated { .. })
        ));
        let it = Coder::Iterable(Box::new(Coder::Bool));
        assert_eq!(it.encoded_len(&[0, 0, 0, 2, 1, 0, 9]).unwrap(), 6);
        assert_eq!(
            it.encoded_len(&[0xff, 0xff, 0xff, 0xff, 2, 1, 0, 1, 1, 0, 9])
                .unwrap(),
            10
        );
        let op = opaque("x");
        assert!(matches!(
            op.encoded_len(b"\x00"),
            Err(Error::UnknownCoder { .. })
        ));
        assert_eq!(
            Coder::LengthPrefix(Box::new(op))
                .encoded_len(b"\x02ab")
                .unwrap(),
            3
        );
        assert!(matches!(
            Coder::Bytes.encoded_len(&[0xff; 10][..9]),
            Err(Error::Truncated { .. })
        ));
        let mut neg = vec![0xff; 9];
        neg.push(1);
        assert!(matches!(
            Coder::Bytes.encoded_len(&neg),
            Err(Error::Invalid { .. })
        ));
    }
}
