//! Where one value of a user state ends: the runner stores a map key's
//! values as their concatenated encodings, and only the state's value coder
//! (`StateSpec.multimap_spec.value_coder_id`, `map_spec.value_coder_id`, or
//! `set_spec`'s void values, beam_runner_api.proto) says how many values
//! those bytes hold. `MultimapEntriesUserState` needs the count, because its
//! response writes each map key's values as an `IterableCoder` does (a count,
//! then the values).
//!
//! Standard coders are measured by the model ([`Coder::encoded_len`]). The
//! Java SDK's own coders travel as `beam:coders:javasdk:0.1`, a
//! Java-serialized coder object compressed with snappy-java; the class name
//! at its start names Beam's atomic Java coders, whose wire formats are
//! fixed (`VarIntCoder` is a varint, `BigEndianLongCoder` 8 bytes,
//! `VoidCoder` no bytes), so Weir measures those too.

use prost::Message;
use weir_model::Coder;
use weir_proto::{beam, urns};

use urns::coder::JAVA_SDK as JAVA_SDK_CODER_URN;

/// How the runner measures one encoded value of a user state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ValueShape {
    /// A coder the model measures.
    Coder(Coder),
    /// Every value takes exactly this many bytes; 0 for Java's `VoidCoder`
    /// (the values of Java's `SetState`).
    Fixed(usize),
}

impl ValueShape {
    /// How many values `bytes`, the concatenated encodings of one map key's
    /// values, hold. Values that take no bytes can't be counted: a map key
    /// that exists holds at least one, so that is the answer (Java's
    /// `SetState` puts one `VoidCoder` value a key). Errors: bytes that do
    /// not split into whole values.
    pub fn count(&self, bytes: &[u8]) -> Result<usize, String> {
        match self {
            ValueShape::Fixed(0) => Ok(1),
            ValueShape::Fixed(n) if bytes.len().is_multiple_of(*n) => Ok(bytes.len() / n),
            ValueShape::Fixed(n) => Err(format!(
                "{} bytes of state values are not whole values of {n} bytes",
                bytes.len()
            )),
            ValueShape::Coder(c) => {
                let (mut at, mut n) = (0, 0);
                while at < bytes.len() {
                    let len = c.encoded_len(&bytes[at..]).map_err(|e| {
                        format!("state values under coder {} at byte {at}: {e}", c.urn())
                    })?;
                    if len == 0 {
                        return Ok(1);
                    }
                    at += len;
                    n += 1;
                }
                Ok(n)
            }
        }
    }
}

/// The shape of the values of user state `state_id` of transform
/// `transform_id` in `descriptor`: the value coder of a multimap or map
/// state spec, or the void values of a set. Errors name the transform, the
/// state and the coder when the runner can't measure the values.
pub fn multimap_value_shape(
    descriptor: &beam::ProcessBundleDescriptor,
    transform_id: &str,
    state_id: &str,
) -> Result<ValueShape, String> {
    let what = || format!("user state {state_id:?} of transform {transform_id:?}");
    let transform = descriptor
        .transforms
        .get(transform_id)
        .ok_or_else(|| format!("{}: no such transform in the bundle's descriptor", what()))?;
    let spec = transform.spec.as_ref();
    if spec.map(|s| s.urn.as_str()) != Some(urns::transform::PAR_DO) {
        return Err(format!("{}: the transform is not a ParDo", what()));
    }
    let payload = beam::ParDoPayload::decode(spec.map(|s| s.payload.as_slice()).unwrap_or(&[]))
        .map_err(|e| format!("{}: bad ParDoPayload: {e}", what()))?;
    use beam::state_spec::Spec;
    let value_coder_id = match payload
        .state_specs
        .get(state_id)
        .and_then(|s| s.spec.as_ref())
    {
        Some(Spec::MultimapSpec(m)) => &m.value_coder_id,
        Some(Spec::MapSpec(m)) => &m.value_coder_id,
        Some(Spec::SetSpec(_)) => return Ok(ValueShape::Fixed(0)),
        Some(_) => return Err(format!("{} is not a map, multimap or set state", what())),
        None => return Err(format!("{}: no such state spec", what())),
    };
    coder_shape(&descriptor.coders, value_coder_id).map_err(|e| {
        format!(
            "{}: Weir can't tell where one value ends under value coder {value_coder_id:?}: {e}",
            what()
        )
    })
}

/// The shape of coder `id` of `coders`: a known Java SDK coder, else the
/// model's coder if the runner can measure it.
fn coder_shape(
    coders: &std::collections::HashMap<String, beam::Coder>,
    id: &str,
) -> Result<ValueShape, String> {
    let c = coders.get(id).ok_or_else(|| format!("no coder {id:?}"))?;
    let spec = c.spec.clone().unwrap_or_default();
    if spec.urn == JAVA_SDK_CODER_URN {
        let class = java_coder_class(&spec.payload)?;
        return java_atomic_shape(&class)
            .ok_or_else(|| format!("Java coder {class} is opaque to the runner"));
    }
    let coder = model_coder(coders, id, 0)?;
    if coder.is_runner_readable() {
        Ok(ValueShape::Coder(coder))
    } else {
        Err(format!("coder {} is opaque to the runner", spec.urn))
    }
}

/// Coder `id` as the model's [`Coder`] (components first), at most 32 deep.
fn model_coder(
    coders: &std::collections::HashMap<String, beam::Coder>,
    id: &str,
    depth: usize,
) -> Result<Coder, String> {
    if depth > 32 {
        return Err(format!("coder {id:?} nests too deep"));
    }
    let c = coders.get(id).ok_or_else(|| format!("no coder {id:?}"))?;
    let components = c
        .component_coder_ids
        .iter()
        .map(|comp| model_coder(coders, comp, depth + 1))
        .collect::<Result<Vec<_>, _>>()?;
    let spec = c.spec.clone().unwrap_or_default();
    Coder::from_urn(&spec.urn, &spec.payload, components).map_err(|e| e.to_string())
}

/// The wire shape of Beam Java's atomic coder class `class`, if Weir knows
/// it (`org.apache.beam.sdk.coders.*`).
fn java_atomic_shape(class: &str) -> Option<ValueShape> {
    let name = class.strip_prefix("org.apache.beam.sdk.coders.")?;
    Some(match name {
        // VarInt.encode of an int or a long, as the standard varint coder.
        "VarIntCoder" | "VarLongCoder" | "DurationCoder" => ValueShape::Coder(Coder::VarInt),
        // A varint length, then the bytes.
        "ByteArrayCoder" | "StringUtf8Coder" | "TextualIntegerCoder" => {
            ValueShape::Coder(Coder::Bytes)
        }
        "VoidCoder" => ValueShape::Fixed(0),
        "ByteCoder" | "BooleanCoder" => ValueShape::Fixed(1),
        "BigEndianShortCoder" => ValueShape::Fixed(2),
        "BigEndianIntegerCoder" | "FloatCoder" => ValueShape::Fixed(4),
        "BigEndianLongCoder" | "DoubleCoder" | "InstantCoder" => ValueShape::Fixed(8),
        _ => return None,
    })
}

/// The class name of the Java-serialized object in a
/// `beam:coders:javasdk:0.1` payload: snappy-java's stream format (an
/// 8-byte magic, two 4-byte versions, then blocks of a 4-byte big-endian
/// length and raw snappy data), holding Java serialization's
/// `AC ED 00 05`, `TC_OBJECT`, `TC_CLASSDESC` and the class name (a 2-byte
/// length and its bytes).
pub fn java_coder_class(payload: &[u8]) -> Result<String, String> {
    let bad = |what: &str| format!("not a Java-serialized coder: {what}");
    // The class name is a short way in: decompress no more than it needs.
    let object = snappy_java_decompress(payload, 8 + 0xffff).map_err(|e| bad(&e))?;
    let header = object.get(..8).ok_or_else(|| bad("short object stream"))?;
    if header[..6] != [0xac, 0xed, 0x00, 0x05, 0x73, 0x72] {
        return Err(bad("no serialized object with a class description"));
    }
    let len = u16::from_be_bytes([header[6], header[7]]) as usize;
    let name = object
        .get(8..8 + len)
        .ok_or_else(|| bad("truncated class name"))?;
    String::from_utf8(name.to_vec()).map_err(|_| bad("class name is not UTF-8"))
}

/// Decompresses snappy-java's stream format (`SnappyOutputStream`: the
/// magic `82 'SNAPPY' 00`, a 4-byte version and a 4-byte compatible
/// version, then blocks of a 4-byte big-endian length and a raw snappy
/// block), stopping after the block that reaches `limit` bytes.
fn snappy_java_decompress(payload: &[u8], limit: usize) -> Result<Vec<u8>, String> {
    const MAGIC: &[u8] = b"\x82SNAPPY\x00";
    let rest = payload.strip_prefix(MAGIC).ok_or("no snappy-java header")?;
    let mut blocks = rest.get(8..).ok_or("truncated snappy-java header")?;
    let mut out = Vec::new();
    while !blocks.is_empty() && out.len() < limit {
        let len = blocks
            .get(..4)
            .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize)
            .ok_or("truncated snappy-java block length")?;
        let block = blocks
            .get(4..4 + len)
            .ok_or("truncated snappy-java block")?;
        snappy_decompress(block, &mut out)?;
        blocks = &blocks[4 + len..];
    }
    Ok(out)
}

/// Appends the decompression of one raw snappy block (a varint length, then
/// literal and copy elements) to `out`. Each of snappy-java's blocks stands
/// alone: a copy reaching back before the block's start is an error, and so
/// is an element that would write past the length the block's header gives
/// (which bounds what a crafted payload can make Weir allocate).
fn snappy_decompress(block: &[u8], out: &mut Vec<u8>) -> Result<(), String> {
    let start = out.len();
    let (expected, mut at) = {
        let (mut v, mut shift, mut i) = (0usize, 0u32, 0usize);
        loop {
            let b = *block.get(i).ok_or("truncated snappy length")?;
            v |= ((b & 0x7f) as usize) << shift;
            i += 1;
            if b & 0x80 == 0 {
                break (v, i);
            }
            shift += 7;
            if shift > 28 {
                return Err("bad snappy length".into());
            }
        }
    };
    let byte = |i: usize| block.get(i).copied().ok_or("truncated snappy block");
    while at < block.len() {
        let tag = block[at];
        at += 1;
        let (len, offset) = match tag & 3 {
            0 => {
                let mut len = (tag >> 2) as usize;
                if len >= 60 {
                    let extra = len - 59;
                    len = 0;
                    for k in 0..extra {
                        len |= (byte(at + k)? as usize) << (8 * k);
                    }
                    at += extra;
                }
                if out.len() - start + len + 1 > expected {
                    return Err(format!("snappy literal past the block's {expected} bytes"));
                }
                let lit = block
                    .get(at..at + len + 1)
                    .ok_or("truncated snappy literal")?;
                out.extend_from_slice(lit);
                at += len + 1;
                continue;
            }
            1 => {
                let off = (((tag >> 5) as usize) << 8) | byte(at)? as usize;
                at += 1;
                (4 + ((tag >> 2) & 7) as usize, off)
            }
            2 => {
                let off = u16::from_le_bytes([byte(at)?, byte(at + 1)?]) as usize;
                at += 2;
                ((tag >> 2) as usize + 1, off)
            }
            _ => {
                let b = [byte(at)?, byte(at + 1)?, byte(at + 2)?, byte(at + 3)?];
                at += 4;
                ((tag >> 2) as usize + 1, u32::from_le_bytes(b) as usize)
            }
        };
        if offset == 0 || offset > out.len() - start {
            return Err("snappy copy before the start of the block".into());
        }
        if out.len() - start + len > expected {
            return Err(format!("snappy copy past the block's {expected} bytes"));
        }
        for _ in 0..len {
            out.push(out[out.len() - offset]);
        }
    }
    if out.len() - start != expected {
        return Err(format!(
            "snappy block decompressed to {} bytes, its header says {expected}",
            out.len() - start
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    // `RunnerApi.Coder` payloads Beam Java 2.73.0's `SdkComponents.registerCoder`
    // wrote for these coders (URN beam:coders:javasdk:0.1), and for two of
    // them the plain `ObjectOutputStream` bytes of the same coder object.
    const VAR_INT: &str = "82534e4150505900000000010000000100000094d801f03caced0005737200266f72672e6170616368652e6265616d2e73646b2e636f646572732e566172496e74436f646572c04b32daa94b5668020000787200266a35001841746f6d696343014238c7ecb5cc857450460200007872002a6a350028537472756374757265644301393873bf120ed5d43611020000787200206a39000043012f30f622405755f7b8830200007870";
    const VOID: &str = "82534e4150505900000000010000000100000091d601e8aced0005737200246f72672e6170616368652e6265616d2e73646b2e636f646572732e566f6964436f646572b9bf559be80daf55020000787200266a33001841746f6d696343014038c7ecb5cc857450460200007872002a6a350028537472756374757265644301393873bf120ed5d43611020000787200206a39000043012f30f622405755f7b8830200007870";
    const BIG_ENDIAN_INT: &str = "82534e41505059000000000100000001000000a1e201f049aced0005737200306f72672e6170616368652e6265616d2e73646b2e636f646572732e426967456e6469616e496e7465676572436f6465729ab412a0870c0eff020000787200266f72675e3f001841746f6d696343014c38c7ecb5cc857450460200007872002a6a350028537472756374757265644301393873bf120ed5d43611020000787200206a39000043012f30f622405755f7b8830200007870";
    const BIG_ENDIAN_LONG: &str = "82534e415050590000000001000000010000009adf01c0aced00057372002d6f72672e6170616368652e6265616d2e73646b2e636f646572732e426967456e6469616e4c6f6e6743011440da4995caeec60e3a020000787200266f72623c001841746f6d696343013524c7ecb5cc8574504602000135002a6a350028537472756374757265644301393873bf120ed5d43611020000787200206a39000043012f30f622405755f7b8830200007870";
    const INSTANT: &str = "82534e4150505900000000010000000100000092d901a8aced0005737200276f72672e6170616368652e6265616d2e73646b2e636f646572732e496e7374616e7443010e380b349840b43bffc6020000787200266a36001841746f6d696343013524c7ecb5cc8574504602000135002a6a350028537472756374757265644301393873bf120ed5d43611020000787200206a39000043012f30f622405755f7b8830200007870";
    const BYTE: &str = "82534e4150505900000000010000000100000091d601e8aced0005737200246f72672e6170616368652e6265616d2e73646b2e636f646572732e42797465436f646572ebf9011985bf5134020000787200266a33001841746f6d696343014038c7ecb5cc857450460200007872002a6a350028537472756374757265644301393873bf120ed5d43611020000787200206a39000043012f30f622405755f7b8830200007870";
    const SERIALIZABLE_STRING: &str = "82534e41505059000000000100000001000000b6e101f061aced00057372002c6f72672e6170616368652e6265616d2e73646b2e636f646572732e53657269616c697a61626c65436f64657208f4208ec5796e6c0200014c0004747970657400114c6a6176612f6c616e672f436c6173733b787200266f72672e5a560014437573746f6d0550386ab0089d0b3b1d0b020000787200206a8b00004301921cf622405755f7b883012f107076720010017a602e6c616e672e537472696e67a0f0a4387a3bb3420200007870";
    const LIST_OF_VAR_INT: &str = "82534e415050590000000001000000010000011eab03e8aced0005737200246f72672e6170616368652e6265616d2e73646b2e636f646572732e4c697374436f6465726601c8363d6700630200007872002c6a3300304974657261626c654c696b65430146505d5c6e21f18deb0b0200024c000c656c656d656e74051a1c7400224c6f72672f097d002f017d142f73646b2f63013704732f0524103b4c000c690d53704e616d657400124c6a6176612f6c616e672f537472696e673b7872002a6a9300245374727563747572656405533873bf120ed5d43611020000787200206a3900004301891cf622405755f7b883012f1070737200266a31000c566172490ddd1cc04b32daa94b566801377635001441746f6d6963056c5cc7ecb5cc857450460200007871007e00047400044c697374";
    const BIG_ENDIAN_LONG_SERIALIZED: &str = "aced00057372002d6f72672e6170616368652e6265616d2e73646b2e636f646572732e426967456e6469616e4c6f6e67436f646572da4995caeec60e3a020000787200266f72672e6170616368652e6265616d2e73646b2e636f646572732e41746f6d6963436f646572c7ecb5cc857450460200007872002a6f72672e6170616368652e6265616d2e73646b2e636f646572732e53747275637475726564436f64657273bf120ed5d43611020000787200206f72672e6170616368652e6265616d2e73646b2e636f646572732e436f646572f622405755f7b8830200007870";
    const LIST_OF_VAR_INT_SERIALIZED: &str = "aced0005737200246f72672e6170616368652e6265616d2e73646b2e636f646572732e4c697374436f6465726601c8363d6700630200007872002c6f72672e6170616368652e6265616d2e73646b2e636f646572732e4974657261626c654c696b65436f6465725d5c6e21f18deb0b0200024c000c656c656d656e74436f6465727400224c6f72672f6170616368652f6265616d2f73646b2f636f646572732f436f6465723b4c000c6974657261626c654e616d657400124c6a6176612f6c616e672f537472696e673b7872002a6f72672e6170616368652e6265616d2e73646b2e636f646572732e53747275637475726564436f64657273bf120ed5d43611020000787200206f72672e6170616368652e6265616d2e73646b2e636f646572732e436f646572f622405755f7b8830200007870737200266f72672e6170616368652e6265616d2e73646b2e636f646572732e566172496e74436f646572c04b32daa94b5668020000787200266f72672e6170616368652e6265616d2e73646b2e636f646572732e41746f6d6963436f646572c7ecb5cc857450460200007871007e00047400044c697374";

    #[test]
    fn snappy_java_streams_decompress_to_the_java_serialization() {
        for (payload, serialized) in [
            (BIG_ENDIAN_LONG, BIG_ENDIAN_LONG_SERIALIZED),
            (LIST_OF_VAR_INT, LIST_OF_VAR_INT_SERIALIZED),
        ] {
            assert_eq!(
                snappy_java_decompress(&hex(payload), usize::MAX).unwrap(),
                hex(serialized)
            );
        }
        let mut cut = hex(LIST_OF_VAR_INT);
        cut.truncate(cut.len() - 3);
        assert!(snappy_java_decompress(&cut, usize::MAX).is_err());
        assert_eq!(
            snappy_java_decompress(b"not snappy", usize::MAX).unwrap_err(),
            "no snappy-java header"
        );
    }

    #[test]
    fn java_atomic_coders_are_recognized_by_class() {
        let shape = |payload: &str| java_atomic_shape(&java_coder_class(&hex(payload)).unwrap());
        assert_eq!(shape(VAR_INT), Some(ValueShape::Coder(Coder::VarInt)));
        assert_eq!(shape(VOID), Some(ValueShape::Fixed(0)));
        assert_eq!(shape(BIG_ENDIAN_INT), Some(ValueShape::Fixed(4)));
        assert_eq!(shape(BIG_ENDIAN_LONG), Some(ValueShape::Fixed(8)));
        assert_eq!(shape(INSTANT), Some(ValueShape::Fixed(8)));
        assert_eq!(shape(BYTE), Some(ValueShape::Fixed(1)));
        assert_eq!(
            java_coder_class(&hex(SERIALIZABLE_STRING)).unwrap(),
            "org.apache.beam.sdk.coders.SerializableCoder"
        );
        assert_eq!(shape(SERIALIZABLE_STRING), None);
        assert_eq!(shape(LIST_OF_VAR_INT), None);
    }

    #[test]
    fn snappy_blocks_write_no_more_than_their_header_says() {
        // Header: 4 bytes. A 1-byte literal "a", then a copy of 64 bytes at
        // offset 1 (tag 0b111111_10, 2-byte offset): 65 bytes in all.
        let block = [4, 0, b'a', 0xfe, 1, 0];
        let err = snappy_decompress(&block, &mut Vec::new()).unwrap_err();
        assert_eq!(err, "snappy copy past the block's 4 bytes");
        // A 5-byte literal under a 4-byte header.
        let block = [4, 4 << 2, b'a', b'b', b'c', b'd', b'e'];
        let err = snappy_decompress(&block, &mut Vec::new()).unwrap_err();
        assert_eq!(err, "snappy literal past the block's 4 bytes");
        // Within the header's length: a literal "ab", then a 4-byte copy at offset 2.
        let block = [6, 1 << 2, b'a', b'b', 0x01, 2];
        let mut out = Vec::new();
        snappy_decompress(&block, &mut out).unwrap();
        assert_eq!(out, b"ababab");
    }

    #[test]
    fn counts_values_by_shape() {
        let varint = ValueShape::Coder(Coder::VarInt);
        assert_eq!(varint.count(&[]), Ok(0));
        assert_eq!(
            varint.count(&[97, 0xac, 0x02, 0xff, 0xff, 0xff, 0xff, 0x0f]),
            Ok(3)
        );
        let err = varint.count(&[97, 0x80]).unwrap_err();
        assert!(err.contains("at byte 1"), "{err}");
        let strings = ValueShape::Coder(Coder::StringUtf8);
        assert_eq!(strings.count(&[1, b'a', 0, 2, b'b', b'c']), Ok(3));
        assert_eq!(ValueShape::Fixed(4).count(&[0; 12]), Ok(3));
        assert!(ValueShape::Fixed(4).count(&[0; 6]).is_err());
        // Values of no bytes: a key that exists holds one.
        assert_eq!(ValueShape::Fixed(0).count(&[]), Ok(1));
    }

    fn coder(urn: &str, payload: Vec<u8>, components: &[&str]) -> beam::Coder {
        beam::Coder {
            spec: Some(beam::FunctionSpec {
                urn: urn.into(),
                payload,
            }),
            component_coder_ids: components.iter().map(|c| c.to_string()).collect(),
        }
    }

    /// A descriptor with one ParDo "t" whose state specs are `specs`.
    fn descriptor(specs: Vec<(&str, beam::state_spec::Spec)>) -> beam::ProcessBundleDescriptor {
        let payload = beam::ParDoPayload {
            state_specs: specs
                .into_iter()
                .map(|(id, spec)| {
                    (
                        id.to_string(),
                        beam::StateSpec {
                            spec: Some(spec),
                            ..Default::default()
                        },
                    )
                })
                .collect(),
            ..Default::default()
        };
        let transform = beam::PTransform {
            spec: Some(beam::FunctionSpec {
                urn: urns::transform::PAR_DO.into(),
                payload: payload.encode_to_vec(),
            }),
            ..Default::default()
        };
        let coders: HashMap<String, beam::Coder> = [
            ("str", coder(urns::coder::STRING_UTF8, vec![], &[])),
            ("int", coder(JAVA_SDK_CODER_URN, hex(VAR_INT), &[])),
            (
                "ser",
                coder(JAVA_SDK_CODER_URN, hex(SERIALIZABLE_STRING), &[]),
            ),
            ("kv", coder(urns::coder::KV, vec![], &["str", "str"])),
            ("opaque_kv", coder(urns::coder::KV, vec![], &["str", "int"])),
        ]
        .into_iter()
        .map(|(id, c)| (id.to_string(), c))
        .collect();
        beam::ProcessBundleDescriptor {
            transforms: [("t".to_string(), transform)].into_iter().collect(),
            coders,
            ..Default::default()
        }
    }

    #[test]
    fn value_shape_comes_from_the_state_spec() {
        use beam::state_spec::Spec;
        let multimap = |v: &str| {
            Spec::MultimapSpec(beam::MultimapStateSpec {
                key_coder_id: "str".into(),
                value_coder_id: v.into(),
            })
        };
        let d = descriptor(vec![
            ("ints", multimap("int")),
            ("kvs", multimap("kv")),
            ("ser", multimap("ser")),
            ("opaque_kv", multimap("opaque_kv")),
            (
                "map",
                Spec::MapSpec(beam::MapStateSpec {
                    key_coder_id: "str".into(),
                    value_coder_id: "str".into(),
                }),
            ),
            (
                "set",
                Spec::SetSpec(beam::SetStateSpec {
                    element_coder_id: "str".into(),
                }),
            ),
            ("bag", Spec::BagSpec(beam::BagStateSpec::default())),
        ]);
        let shape = |state: &str| multimap_value_shape(&d, "t", state);
        assert_eq!(shape("ints"), Ok(ValueShape::Coder(Coder::VarInt)));
        assert_eq!(
            shape("kvs"),
            Ok(ValueShape::Coder(Coder::Kv(
                Box::new(Coder::StringUtf8),
                Box::new(Coder::StringUtf8)
            )))
        );
        assert_eq!(shape("map"), Ok(ValueShape::Coder(Coder::StringUtf8)));
        assert_eq!(shape("set"), Ok(ValueShape::Fixed(0)));
        let err = shape("ser").unwrap_err();
        assert!(
            err.contains("\"ser\"") && err.contains("SerializableCoder is opaque"),
            "{err}"
        );
        let err = shape("opaque_kv").unwrap_err();
        assert!(err.contains("beam:coder:kv:v1 is opaque"), "{err}");
        assert!(shape("bag")
            .unwrap_err()
            .contains("not a map, multimap or set"));
        assert!(shape("none").unwrap_err().contains("no such state spec"));
        assert!(multimap_value_shape(&d, "u", "ints")
            .unwrap_err()
            .contains("no such transform"));
    }
}
