//! TestStream elements on the data plane, for each SDK's way of encoding
//! `TestStreamPayload.TimestampedElement.encoded_element`.
//!
//! Python (`coder.encode`) and Java (`CoderUtils.encodeToByteArray`) encode
//! the element in the payload coder's outer context: a string or bytes
//! without its length, a KV whose value has none. The Go SDK has no outer
//! context: its element encoder writes what its coder nests (a string with
//! its length, a custom coder with a length prefix), and it names the
//! custom coder itself (`c0`) as the payload coder while the output is
//! `length_prefix(c0)`. Weir sends every element as
//! `length_prefix(<payload coder>)`, which each SDK decodes back to what it
//! encoded; the cases below pin the exact bytes.
//!
//! The pipelines are built by hand in the shape each SDK submits:
//! TestStream -> WindowInto (an SDK transform) in environment `env`.

use std::collections::HashMap;

use weir_model::Coder;
use weir_plan::{plan, Plan, PlanOptions, StageKind, TestStreamEvent};
use weir_proto::beam;
use weir_proto::prost::Message;

const TEST_STREAM: &str = "beam:transform:teststream:v1";
const WINDOW_INTO: &str = "beam:transform:window_into:v1";
const FLATTEN: &str = "beam:transform:flatten:v1";
const SOURCE: &str = "beam:runner:source:v1";
const LENGTH_PREFIX: &str = "beam:coder:length_prefix:v1";
const STRING_UTF8: &str = "beam:coder:string_utf8:v1";
const KV: &str = "beam:coder:kv:v1";
const VARINT: &str = "beam:coder:varint:v1";
const GO_CUSTOM: &str = "beam:go:coder:custom:v1";
const JAVA_CUSTOM: &str = "beam:coders:javasdk:0.1";

fn spec(urn: &str, payload: Vec<u8>) -> Option<beam::FunctionSpec> {
    Some(beam::FunctionSpec { urn: urn.into(), payload })
}

/// A coder; SDK-specific (custom) coders get a payload, as SDKs send them.
fn coder(urn: &str, components: &[&str]) -> beam::Coder {
    let payload = if urn.starts_with("beam:coder:") { vec![] } else { b"serialized custom coder".to_vec() };
    beam::Coder {
        spec: spec(urn, payload),
        component_coder_ids: components.iter().map(|c| c.to_string()).collect(),
    }
}

/// A pipeline TestStream(`payload_coder`, elements) -> WindowInto, whose
/// TestStream output PCollection is coded `output_coder`.
fn pipeline(coders: &[(&str, beam::Coder)], payload_coder: &str, output_coder: &str, elements: &[&[u8]]) -> beam::Pipeline {
    use beam::test_stream_payload::{event, Event, TimestampedElement};
    let events = vec![
        Event {
            event: Some(event::Event::ElementEvent(event::AddElements {
                elements: elements
                    .iter()
                    .map(|e| TimestampedElement { encoded_element: e.to_vec(), timestamp: 7 })
                    .collect(),
                tag: String::new(),
            })),
        },
        Event {
            event: Some(event::Event::WatermarkEvent(event::AdvanceWatermark { new_watermark: i64::MAX, tag: String::new() })),
        },
    ];
    let payload = beam::TestStreamPayload { coder_id: payload_coder.into(), events, endpoint: None };
    let mut c = beam::Components::default();
    for (id, cd) in coders {
        c.coders.insert(id.to_string(), cd.clone());
    }
    c.coders.insert("gw".into(), coder("beam:coder:global_window:v1", &[]));
    c.windowing_strategies.insert(
        "ws".into(),
        beam::WindowingStrategy {
            window_fn: spec("beam:window_fn:global_windows:v1", vec![]),
            merge_status: beam::merge_status::Enum::NonMerging as i32,
            window_coder_id: "gw".into(),
            trigger: Some(beam::Trigger { trigger: Some(beam::trigger::Trigger::Default(beam::trigger::Default {})) }),
            accumulation_mode: beam::accumulation_mode::Enum::Discarding as i32,
            output_time: beam::output_time::Enum::EndOfWindow as i32,
            closing_behavior: beam::closing_behavior::Enum::EmitAlways as i32,
            on_time_behavior: beam::on_time_behavior::Enum::FireAlways as i32,
            environment_id: "env".into(),
            ..Default::default()
        },
    );
    for (id, coder_id) in [("events", output_coder), ("windowed", output_coder)] {
        c.pcollections.insert(
            id.into(),
            beam::PCollection {
                unique_name: id.into(),
                coder_id: coder_id.into(),
                is_bounded: beam::is_bounded::Enum::Unbounded as i32,
                windowing_strategy_id: "ws".into(),
                ..Default::default()
            },
        );
    }
    c.transforms.insert(
        "stream".into(),
        beam::PTransform {
            unique_name: "Stream".into(),
            spec: spec(TEST_STREAM, payload.encode_to_vec()),
            outputs: [("out".to_string(), "events".to_string())].into_iter().collect(),
            ..Default::default()
        },
    );
    let window_into = beam::WindowIntoPayload {
        window_fn: spec("beam:window_fn:global_windows:v1", vec![]),
    };
    c.transforms.insert(
        "window".into(),
        beam::PTransform {
            unique_name: "Window".into(),
            spec: spec(WINDOW_INTO, window_into.encode_to_vec()),
            inputs: [("in".to_string(), "events".to_string())].into_iter().collect(),
            outputs: [("out".to_string(), "windowed".to_string())].into_iter().collect(),
            environment_id: "env".into(),
            ..Default::default()
        },
    );
    c.environments.insert("env".into(), beam::Environment { urn: "beam:env:external:v1".into(), ..Default::default() });
    beam::Pipeline {
        components: Some(c),
        root_transform_ids: vec!["stream".into(), "window".into()],
        ..Default::default()
    }
}

fn plan_ok(p: &beam::Pipeline) -> Plan {
    let options = PlanOptions { fn_api_url: "127.0.0.1:1".into(), streaming: false, drain: false };
    plan(p, &options).unwrap_or_else(|e| panic!("planning failed: {e}"))
}

/// The TestStream's elements as the engine sends them, and the wire coder
/// of the PCollection they go into.
fn elements(p: &Plan) -> (Vec<Vec<u8>>, Coder) {
    let StageKind::TestStream { outputs, events } = &p.graph.stages[0].kind else {
        panic!("first stage is not the TestStream: {:?}", p.graph.stages[0].kind)
    };
    let elements = events
        .iter()
        .flat_map(|e| match e {
            TestStreamEvent::Elements { elements, .. } => elements.iter().map(|(v, _)| v.clone()).collect(),
            _ => vec![],
        })
        .collect();
    (elements, p.graph.pcollections[outputs[0]].value_coder.clone())
}

/// URNs of the transforms of the one SDK stage's descriptor.
fn sdk_urns(p: &Plan) -> Vec<String> {
    assert_eq!(p.descriptors.len(), 1, "one SDK stage");
    let d = p.descriptors.values().next().unwrap();
    let mut urns: Vec<String> = d
        .transforms
        .values()
        .filter_map(|t| t.spec.as_ref().map(|s| s.urn.clone()))
        .collect();
    urns.sort();
    urns
}

/// The coder (as URN tree) the SDK stage's data-plane source reads.
fn source_coder(p: &Plan) -> String {
    let d = p.descriptors.values().next().unwrap();
    let source = d
        .transforms
        .values()
        .find(|t| t.spec.as_ref().is_some_and(|s| s.urn == SOURCE))
        .expect("a source");
    let port = beam::RemoteGrpcPort::decode(source.spec.as_ref().unwrap().payload.as_slice()).unwrap();
    fn tree(coders: &HashMap<String, beam::Coder>, id: &str) -> String {
        let c = &coders[id];
        let urn = c.spec.as_ref().map(|s| s.urn.as_str()).unwrap_or("");
        let short = urn.strip_prefix("beam:coder:").unwrap_or(urn).trim_end_matches(":v1");
        if c.component_coder_ids.is_empty() {
            short.to_string()
        } else {
            let comps: Vec<String> = c.component_coder_ids.iter().map(|x| tree(coders, x)).collect();
            format!("{short}({})", comps.join(", "))
        }
    }
    tree(&d.coders, &port.coder_id)
}

#[test]
fn python_string_elements_get_their_length() {
    // TestStream(coder=StrUtf8Coder()): "abc" is b"abc" (outer context).
    let p = plan_ok(&pipeline(&[("str", coder(STRING_UTF8, &[]))], "str", "str", &[b"abc", b""]));
    let (got, wire) = elements(&p);
    assert_eq!(got, vec![b"\x03abc".to_vec(), b"\x00".to_vec()]);
    assert_eq!(wire, Coder::LengthPrefix(Box::new(Coder::StringUtf8)));
    assert_eq!(source_coder(&p), "windowed_value(length_prefix(string_utf8), global_window)");
    // The SDK re-encodes them into the declared string PCollection.
    assert!(sdk_urns(&p).contains(&FLATTEN.to_string()), "{:?}", sdk_urns(&p));
}

#[test]
fn java_kv_elements_keep_the_outer_value_inside_a_length_prefix() {
    // Java KvCoder<String, String>, outer context: the key nested
    // (length-prefixed), the value in the outer context (no length).
    let coders = [("s", coder(STRING_UTF8, &[])), ("kv", coder(KV, &["s", "s"]))];
    let p = plan_ok(&pipeline(&coders, "kv", "kv", &[b"\x01kvv"]));
    let (got, wire) = elements(&p);
    assert_eq!(got, vec![b"\x04\x01kvv".to_vec()]);
    assert_eq!(wire, Coder::LengthPrefix(Box::new(Coder::Kv(Box::new(Coder::StringUtf8), Box::new(Coder::StringUtf8)))));
}

#[test]
fn java_custom_coder_elements_are_length_prefixed_once() {
    // A Java custom coder (e.g. VarIntCoder): opaque to the runner; the
    // outer encoding goes inside one length prefix, as Weir's wire coder
    // length_prefix(custom) has it.
    let coders = [("int", coder(JAVA_CUSTOM, &[]))];
    let p = plan_ok(&pipeline(&coders, "int", "int", &[b"\x96\x01"]));
    let (got, wire) = elements(&p);
    assert_eq!(got, vec![b"\x02\x96\x01".to_vec()]);
    assert!(matches!(&wire, Coder::LengthPrefix(inner) if inner.urn() == JAVA_CUSTOM), "{wire:?}");
}

#[test]
fn go_custom_coder_elements_are_already_length_prefixed() {
    // Go `int`: payload coder c0 = the custom coder, output c1 =
    // length_prefix(c0); Go's encoder wrote varint length 1, then 0x0e.
    let coders = [("c0", coder(GO_CUSTOM, &[])), ("c1", coder(LENGTH_PREFIX, &["c0"]))];
    let p = plan_ok(&pipeline(&coders, "c0", "c1", &[b"\x01\x0e", b"\x02\x80\x01"]));
    let (got, wire) = elements(&p);
    assert_eq!(got, vec![b"\x01\x0e".to_vec(), b"\x02\x80\x01".to_vec()]);
    assert!(matches!(&wire, Coder::LengthPrefix(inner) if inner.urn() == GO_CUSTOM), "{wire:?}");
    // The output already is length_prefix(c0): no transcoder.
    assert!(!sdk_urns(&p).contains(&FLATTEN.to_string()), "{:?}", sdk_urns(&p));
}

#[test]
fn go_string_elements_are_wrapped_as_go_decodes_them() {
    // Go strings are nested even at the top level (varint length + bytes);
    // Go decodes length_prefix(string) as a length, then its own string.
    let p = plan_ok(&pipeline(&[("c0", coder(STRING_UTF8, &[]))], "c0", "c0", &[b"\x02hi"]));
    let (got, wire) = elements(&p);
    assert_eq!(got, vec![b"\x03\x02hi".to_vec()]);
    assert_eq!(wire, Coder::LengthPrefix(Box::new(Coder::StringUtf8)));
}

#[test]
fn length_prefixed_payload_coders_pass_through() {
    // A payload coder that is a length_prefix coder encodes the same in
    // both contexts: the elements are already in it.
    let coders = [("v", coder(VARINT, &[])), ("lp", coder(LENGTH_PREFIX, &["v"]))];
    let p = plan_ok(&pipeline(&coders, "lp", "v", &[b"\x01\x05"]));
    let (got, wire) = elements(&p);
    assert_eq!(got, vec![b"\x01\x05".to_vec()]);
    assert_eq!(wire, Coder::LengthPrefix(Box::new(Coder::VarInt)));
    assert!(sdk_urns(&p).contains(&FLATTEN.to_string()), "{:?}", sdk_urns(&p));
}
