//! Checks weir-model against Beam's own coder test vectors
//! (`apache_beam/portability/api/standard_coders.yaml` from the installed
//! Python SDK).
//!
//! Where the file comes from, in order:
//! 1. env `BEAM_STANDARD_CODERS_YAML` (path to the yaml file);
//! 2. `<python> -c 'import apache_beam,os;print(os.path.dirname(apache_beam.__file__))'`
//!    with `<python>` = env `WEIR_PYTHON`, else
//!    `$CARGO_MANIFEST_DIR/../../.venv/bin/python`.
//!
//! If neither works the test FAILS (it never silently skips).
//!
//! For every document whose coder tree the runner supports, each example is
//! checked byte-exactly: `Coder::encoded_len` (nested context, and with
//! trailing garbage, and every proper prefix must be `Truncated`), a full
//! decode into the test-only [`Value`] type compared with the YAML value,
//! and a re-encode of the YAML value compared with the example bytes
//! (skipped for `non_deterministic` coders). Crate helpers (`Window`,
//! `PaneInfo`, `WindowedValue`, `split_kv`, `encode_iterable`) are exercised
//! on the matching documents.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Command;

use serde::Deserialize;
use serde_yaml::Value as Yaml;
use weir_model::varint::{decode_varint, encode_varint};
use weir_model::windowed_value::{encode_iterable, split_kv};
use weir_model::{Coder, Error, PaneInfo, PaneTiming, Timestamp, Window, WindowedValue};

/// URNs whose documents are deliberately not checked. A document containing
/// any other coder the runner does not understand fails the test, so a new
/// kind of vector cannot pass silently.
const SKIPPED_URNS: &[&str] = &[
    // Schema rows: the runner treats them as opaque (length-prefixed) bytes.
    "beam:coder:row:v1",
];

/// Number of documents in Beam 2.77's file that use only supported coders.
/// The test asserts at least this many were checked.
const MIN_CHECKED_DOCS: usize = 32;

// ---------------------------------------------------------------- locating

fn locate_yaml() -> PathBuf {
    if let Ok(p) = std::env::var("BEAM_STANDARD_CODERS_YAML") {
        let p = PathBuf::from(p);
        assert!(
            p.is_file(),
            "BEAM_STANDARD_CODERS_YAML={} is not a file",
            p.display()
        );
        return p;
    }
    let python = std::env::var("WEIR_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|_| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.venv/bin/python")
        });
    let out = Command::new(&python)
        .arg("-c")
        .arg("import apache_beam,os;print(os.path.dirname(apache_beam.__file__))")
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "cannot find Beam's standard_coders.yaml: set BEAM_STANDARD_CODERS_YAML, or \
                 WEIR_PYTHON to a python with apache_beam installed (tried {}: {e})",
                python.display()
            )
        });
    assert!(
        out.status.success(),
        "cannot find Beam's standard_coders.yaml: {} failed to import apache_beam \
         (set BEAM_STANDARD_CODERS_YAML or WEIR_PYTHON): {}",
        python.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).expect("python printed non-UTF-8");
    let dir = stdout
        .lines()
        .map(str::trim)
        .rfind(|l| !l.is_empty())
        .expect("python printed nothing");
    let p = PathBuf::from(dir).join("portability/api/standard_coders.yaml");
    assert!(
        p.is_file(),
        "apache_beam is installed at {dir} but {} does not exist",
        p.display()
    );
    p
}

// ---------------------------------------------------------------- yaml helpers

/// The YAML file writes bytes as strings whose code points are the bytes.
fn latin1(s: &str) -> Vec<u8> {
    s.chars()
        .map(|c| {
            u8::try_from(c as u32)
                .unwrap_or_else(|_| panic!("code point {c:?} > 255 in byte string"))
        })
        .collect()
}

fn field<'a>(y: &'a Yaml, name: &str) -> &'a Yaml {
    y.get(name)
        .unwrap_or_else(|| panic!("missing field {name} in {y:?}"))
}

fn yaml_str(y: &Yaml) -> &str {
    y.as_str()
        .unwrap_or_else(|| panic!("expected string, got {y:?}"))
}

fn yaml_i64(y: &Yaml) -> i64 {
    y.as_i64()
        .unwrap_or_else(|| panic!("expected integer, got {y:?}"))
}

fn yaml_bool(y: &Yaml) -> bool {
    y.as_bool()
        .unwrap_or_else(|| panic!("expected bool, got {y:?}"))
}

fn coder_from_spec(spec: &Yaml) -> Coder {
    let urn = yaml_str(field(spec, "urn"));
    let payload = spec
        .get("payload")
        .map(|p| latin1(yaml_str(p)))
        .unwrap_or_default();
    let components: Vec<Coder> = spec
        .get("components")
        .map(|c| {
            c.as_sequence()
                .expect("components is a list")
                .iter()
                .map(coder_from_spec)
                .collect()
        })
        .unwrap_or_default();
    let n = components.len();
    let coder = Coder::from_urn(urn, &payload, components).expect("valid coder spec");
    assert_eq!(coder.urn(), urn);
    assert_eq!(coder.components().len(), n);
    if matches!(
        coder,
        Coder::ParamWindowedValue { .. } | Coder::Opaque { .. }
    ) {
        assert_eq!(coder.payload(), &payload[..]);
    }
    coder
}

fn opaque_urns(c: &Coder, out: &mut Vec<String>) {
    if let Coder::Opaque { urn, .. } = c {
        out.push(urn.clone());
    }
    for sub in c.components() {
        opaque_urns(sub, out);
    }
}

fn contains(c: &Coder, pred: &dyn Fn(&Coder) -> bool) -> bool {
    pred(c) || c.components().into_iter().any(|s| contains(s, pred))
}

// ---------------------------------------------------------------- test values

/// A decoded value, for test purposes only.
#[derive(Debug, Clone, PartialEq)]
enum Value {
    Bytes(Vec<u8>),
    Str(String),
    Int(i64),
    Bool(bool),
    /// IEEE bits, so that NaN and -0.0 compare exactly.
    Double(u64),
    Kv(Box<Value>, Box<Value>),
    List(Vec<Value>),
    Null,
    Window(Window),
    Windowed {
        timestamp: Timestamp,
        windows: Vec<Window>,
        pane: PaneInfo,
        value: Box<Value>,
    },
    Timer {
        key: Box<Value>,
        tag: String,
        windows: Vec<Window>,
        clear: bool,
        fire: Option<Timestamp>,
        hold: Option<Timestamp>,
        pane: Option<PaneInfo>,
    },
    ShardedKey {
        shard: Vec<u8>,
        key: Box<Value>,
    },
}

/// Does the outer (unnested) encoding of `c` differ from the nested one?
fn outer_differs(c: &Coder) -> bool {
    match c {
        Coder::Bytes | Coder::StringUtf8 => true,
        Coder::Kv(_, v) => outer_differs(v),
        Coder::Nullable(i) | Coder::CustomWindow(i) => outer_differs(i),
        Coder::WindowedValue { value, .. } | Coder::ParamWindowedValue { value, .. } => {
            outer_differs(value)
        }
        _ => false,
    }
}

/// State for state_backed_iterable tokens: token bytes -> encoded elements.
type StateMap = HashMap<Vec<u8>, Vec<u8>>;

struct Decoder<'a> {
    bytes: &'a [u8],
    pos: usize,
    state: &'a StateMap,
}

impl<'a> Decoder<'a> {
    fn rest(&self) -> &'a [u8] {
        &self.bytes[self.pos..]
    }
    fn take(&mut self, n: usize) -> &'a [u8] {
        assert!(self.rest().len() >= n, "test decoder ran out of bytes");
        let s = &self.bytes[self.pos..self.pos + n];
        self.pos += n;
        s
    }
    fn varint(&mut self) -> i64 {
        let (v, n) = decode_varint(self.rest()).expect("varint");
        self.pos += n;
        v
    }
    fn len_prefixed(&mut self) -> &'a [u8] {
        let n = self.varint();
        self.take(usize::try_from(n).expect("non-negative length"))
    }
    fn timestamp(&mut self) -> Timestamp {
        let (t, n) = Timestamp::decode(self.rest()).expect("timestamp");
        self.pos += n;
        t
    }
    fn pane(&mut self) -> PaneInfo {
        let (p, n) = PaneInfo::decode(self.rest()).expect("pane");
        self.pos += n;
        p
    }
    fn window(&mut self, coder: &Coder) -> Window {
        let (w, n) = Window::decode(coder, self.rest()).expect("window");
        self.pos += n;
        w
    }
    fn i32(&mut self) -> i32 {
        i32::from_be_bytes(self.take(4).try_into().unwrap())
    }
    fn windows(&mut self, coder: &Coder) -> Vec<Window> {
        let n = self.i32();
        assert!(n >= 0, "window lists in the vectors use the counted form");
        (0..n).map(|_| self.window(coder)).collect()
    }

    fn iterable(&mut self, elem: &Coder) -> Vec<Value> {
        let n = self.i32();
        if n >= 0 {
            return (0..n).map(|_| self.value(elem, true)).collect();
        }
        assert_eq!(n, -1);
        let mut out = Vec::new();
        loop {
            let k = self.varint();
            if k == 0 {
                return out;
            }
            if k == -1 {
                let token = self.len_prefixed().to_vec();
                let suffix = self
                    .state
                    .get(&token)
                    .unwrap_or_else(|| panic!("unknown state token {token:?}"));
                let mut sub = Decoder {
                    bytes: suffix,
                    pos: 0,
                    state: self.state,
                };
                while sub.pos < suffix.len() {
                    out.push(sub.value(elem, true));
                }
                return out;
            }
            for _ in 0..k {
                out.push(self.value(elem, true));
            }
        }
    }

    fn value(&mut self, c: &Coder, nested: bool) -> Value {
        match c {
            Coder::Bytes if !nested => Value::Bytes(self.take(self.rest().len()).to_vec()),
            Coder::Bytes => Value::Bytes(self.len_prefixed().to_vec()),
            Coder::StringUtf8 => {
                let raw = if nested {
                    self.len_prefixed()
                } else {
                    self.take(self.rest().len())
                };
                Value::Str(String::from_utf8(raw.to_vec()).expect("utf-8"))
            }
            Coder::VarInt => Value::Int(self.varint()),
            Coder::Bool => match self.take(1)[0] {
                0 => Value::Bool(false),
                1 => Value::Bool(true),
                b => panic!("bool byte {b}"),
            },
            Coder::Double => Value::Double(u64::from_be_bytes(self.take(8).try_into().unwrap())),
            Coder::Kv(k, v) => {
                let key = self.value(k, true);
                Value::Kv(Box::new(key), Box::new(self.value(v, nested)))
            }
            Coder::Iterable(e) | Coder::StateBackedIterable(e) => Value::List(self.iterable(e)),
            Coder::LengthPrefix(inner) => {
                let body = self.len_prefixed();
                let mut sub = Decoder {
                    bytes: body,
                    pos: 0,
                    state: self.state,
                };
                let v = sub.value(inner, false);
                assert_eq!(sub.pos, body.len(), "length prefix body not fully used");
                v
            }
            Coder::Nullable(inner) => match self.take(1)[0] {
                0 => Value::Null,
                1 => self.value(inner, nested),
                b => panic!("nullable byte {b}"),
            },
            Coder::GlobalWindow | Coder::IntervalWindow => Value::Window(self.window(c)),
            Coder::CustomWindow(inner) => {
                let max_ts = self.timestamp();
                let w = self.value(inner, nested);
                if let Value::Window(win) = &w {
                    assert_eq!(
                        win.max_timestamp(),
                        max_ts,
                        "custom_window timestamp prefix"
                    );
                }
                w
            }
            Coder::WindowedValue { value, window } => {
                let timestamp = self.timestamp();
                let windows = self.windows(window);
                let pane = self.pane();
                let value = Box::new(self.value(value, nested));
                Value::Windowed {
                    timestamp,
                    windows,
                    pane,
                    value,
                }
            }
            Coder::ParamWindowedValue {
                value,
                window,
                payload,
            } => {
                let v = self.value(value, nested);
                let hdr = WindowedValue::from_param_payload(window, payload, vec![])
                    .expect("param_windowed_value payload");
                Value::Windowed {
                    timestamp: hdr.timestamp,
                    windows: hdr.windows,
                    pane: hdr.pane,
                    value: Box::new(v),
                }
            }
            Coder::Timer { key, window } => {
                let key = Box::new(self.value(key, true));
                let tag = String::from_utf8(self.len_prefixed().to_vec()).expect("utf-8 tag");
                let windows = self.windows(window);
                let clear = match self.take(1)[0] {
                    0 => false,
                    1 => true,
                    b => panic!("clear bit {b}"),
                };
                let (fire, hold, pane) = if clear {
                    (None, None, None)
                } else {
                    (
                        Some(self.timestamp()),
                        Some(self.timestamp()),
                        Some(self.pane()),
                    )
                };
                Value::Timer {
                    key,
                    tag,
                    windows,
                    clear,
                    fire,
                    hold,
                    pane,
                }
            }
            Coder::ShardedKey(k) => {
                let shard = self.len_prefixed().to_vec();
                Value::ShardedKey {
                    shard,
                    key: Box::new(self.value(k, true)),
                }
            }
            Coder::Opaque { urn, .. } => panic!("test decoder cannot decode {urn}"),
        }
    }
}

fn encode_len_prefixed(b: &[u8], out: &mut Vec<u8>) {
    encode_varint(b.len() as i64, out);
    out.extend_from_slice(b);
}

fn encode_windows(ws: &[Window], out: &mut Vec<u8>) {
    out.extend_from_slice(&(ws.len() as i32).to_be_bytes());
    for w in ws {
        w.encode(out);
    }
}

fn encode_value(c: &Coder, v: &Value, nested: bool, out: &mut Vec<u8>) {
    match (c, v) {
        (Coder::Bytes, Value::Bytes(b)) if nested => encode_len_prefixed(b, out),
        (Coder::Bytes, Value::Bytes(b)) => out.extend_from_slice(b),
        (Coder::StringUtf8, Value::Str(s)) if nested => encode_len_prefixed(s.as_bytes(), out),
        (Coder::StringUtf8, Value::Str(s)) => out.extend_from_slice(s.as_bytes()),
        (Coder::VarInt, Value::Int(i)) => encode_varint(*i, out),
        (Coder::Bool, Value::Bool(b)) => out.push(*b as u8),
        (Coder::Double, Value::Double(bits)) => out.extend_from_slice(&bits.to_be_bytes()),
        (Coder::Kv(kc, vc), Value::Kv(k, v)) => {
            encode_value(kc, k, true, out);
            encode_value(vc, v, nested, out);
        }
        (Coder::Iterable(e) | Coder::StateBackedIterable(e), Value::List(items)) => {
            let encoded: Vec<Vec<u8>> = items
                .iter()
                .map(|i| {
                    let mut b = Vec::new();
                    encode_value(e, i, true, &mut b);
                    b
                })
                .collect();
            encode_iterable(encoded.iter().map(Vec::as_slice), out);
        }
        (Coder::LengthPrefix(inner), v) => {
            let mut body = Vec::new();
            encode_value(inner, v, false, &mut body);
            encode_len_prefixed(&body, out);
        }
        (Coder::Nullable(_), Value::Null) => out.push(0),
        (Coder::Nullable(inner), v) => {
            out.push(1);
            encode_value(inner, v, nested, out);
        }
        (Coder::GlobalWindow | Coder::IntervalWindow, Value::Window(w)) => w.encode(out),
        (Coder::CustomWindow(inner), Value::Window(w)) => {
            w.max_timestamp().encode(out);
            encode_value(inner, v, nested, out);
        }
        (
            Coder::WindowedValue { value: vc, .. },
            Value::Windowed {
                timestamp,
                windows,
                pane,
                value,
            },
        ) => {
            timestamp.encode(out);
            encode_windows(windows, out);
            pane.encode(out);
            encode_value(vc, value, nested, out);
        }
        (Coder::ParamWindowedValue { value: vc, .. }, Value::Windowed { value, .. }) => {
            encode_value(vc, value, nested, out)
        }
        (
            Coder::Timer { key: kc, .. },
            Value::Timer {
                key,
                tag,
                windows,
                clear,
                fire,
                hold,
                pane,
            },
        ) => {
            encode_value(kc, key, true, out);
            encode_len_prefixed(tag.as_bytes(), out);
            encode_windows(windows, out);
            out.push(*clear as u8);
            if !clear {
                fire.unwrap().encode(out);
                hold.unwrap().encode(out);
                pane.unwrap().encode(out);
            }
        }
        (Coder::ShardedKey(kc), Value::ShardedKey { shard, key }) => {
            encode_len_prefixed(shard, out);
            encode_value(kc, key, true, out);
        }
        (c, v) => panic!("cannot encode {v:?} with {c:?}"),
    }
}

// ---------------------------------------------------------------- expected values

fn expected_pane(y: &Yaml) -> PaneInfo {
    let timing = match yaml_str(field(y, "timing")) {
        "EARLY" => PaneTiming::Early,
        "ON_TIME" => PaneTiming::OnTime,
        "LATE" => PaneTiming::Late,
        "UNKNOWN" => PaneTiming::Unknown,
        t => panic!("unknown pane timing {t}"),
    };
    PaneInfo {
        is_first: yaml_bool(field(y, "is_first")),
        is_last: yaml_bool(field(y, "is_last")),
        timing,
        index: yaml_i64(field(y, "index")),
        on_time_index: yaml_i64(field(y, "on_time_index")),
    }
}

fn expected_window(window_coder: &Coder, y: &Yaml) -> Window {
    match window_coder {
        Coder::GlobalWindow => {
            let s = yaml_str(y);
            assert!(
                s.is_empty() || s == "global",
                "global window written as {s:?}"
            );
            Window::Global
        }
        Coder::IntervalWindow => {
            let end = yaml_i64(field(y, "end"));
            let span = yaml_i64(field(y, "span"));
            Window::Interval {
                start: Timestamp(end - span),
                end: Timestamp(end),
            }
        }
        Coder::CustomWindow(inner) => expected_window(inner, field(y, "window")),
        other => panic!("no expected-window conversion for {other:?}"),
    }
}

fn expected_windows(window_coder: &Coder, y: &Yaml) -> Vec<Window> {
    y.as_sequence()
        .expect("windows list")
        .iter()
        .map(|w| expected_window(window_coder, w))
        .collect()
}

fn expected(c: &Coder, y: &Yaml) -> Value {
    match c {
        Coder::Bytes => Value::Bytes(latin1(yaml_str(y))),
        Coder::StringUtf8 => Value::Str(yaml_str(y).to_string()),
        Coder::VarInt => Value::Int(yaml_i64(y)),
        Coder::Bool => Value::Bool(yaml_bool(y)),
        Coder::Double => {
            let s = yaml_str(y);
            let d: f64 = s.parse().unwrap_or_else(|e| panic!("double {s:?}: {e}"));
            Value::Double(d.to_bits())
        }
        Coder::Kv(k, v) => Value::Kv(
            Box::new(expected(k, field(y, "key"))),
            Box::new(expected(v, field(y, "value"))),
        ),
        Coder::Iterable(e) | Coder::StateBackedIterable(e) => Value::List(
            y.as_sequence()
                .expect("list")
                .iter()
                .map(|i| expected(e, i))
                .collect(),
        ),
        Coder::LengthPrefix(inner) => expected(inner, y),
        Coder::Nullable(inner) => {
            if y.is_null() {
                Value::Null
            } else {
                expected(inner, y)
            }
        }
        Coder::GlobalWindow | Coder::IntervalWindow | Coder::CustomWindow(_) => {
            Value::Window(expected_window(c, y))
        }
        Coder::WindowedValue { value, window }
        | Coder::ParamWindowedValue { value, window, .. } => Value::Windowed {
            timestamp: Timestamp(yaml_i64(field(y, "timestamp"))),
            windows: expected_windows(window, field(y, "windows")),
            pane: expected_pane(field(y, "pane")),
            value: Box::new(expected(value, field(y, "value"))),
        },
        Coder::Timer { key, window } => {
            let clear = yaml_bool(field(y, "clearBit"));
            Value::Timer {
                key: Box::new(expected(key, field(y, "userKey"))),
                tag: yaml_str(field(y, "dynamicTimerTag")).to_string(),
                windows: expected_windows(window, field(y, "windows")),
                clear,
                fire: (!clear).then(|| Timestamp(yaml_i64(field(y, "fireTimestamp")))),
                hold: (!clear).then(|| Timestamp(yaml_i64(field(y, "holdTimestamp")))),
                pane: (!clear).then(|| expected_pane(field(y, "pane"))),
            }
        }
        Coder::ShardedKey(k) => Value::ShardedKey {
            shard: latin1(yaml_str(field(y, "shardId"))),
            key: Box::new(expected(k, field(y, "key"))),
        },
        Coder::Opaque { urn, .. } => panic!("no expected value for {urn}"),
    }
}

// ---------------------------------------------------------------- the checks

#[derive(Default)]
struct Stats {
    docs_checked: usize,
    docs_skipped: usize,
    examples: usize,
    len_checks: usize,
    reencodes: usize,
    helper_checks: usize,
}

fn check_encoded_len(coder: &Coder, bytes: &[u8], ctx: &str, stats: &mut Stats) {
    assert_eq!(
        coder
            .encoded_len(bytes)
            .unwrap_or_else(|e| panic!("{ctx}: encoded_len failed: {e}")),
        bytes.len(),
        "{ctx}: encoded_len"
    );
    let mut padded = bytes.to_vec();
    padded.extend_from_slice(&[0x00, 0xff, 0x01]);
    assert_eq!(
        coder.encoded_len(&padded).unwrap(),
        bytes.len(),
        "{ctx}: encoded_len with trailing bytes"
    );
    for cut in 0..bytes.len() {
        match coder.encoded_len(&bytes[..cut]) {
            Err(Error::Truncated { .. }) => {}
            other => panic!(
                "{ctx}: prefix of {cut}/{} bytes gave {other:?}, expected Truncated",
                bytes.len()
            ),
        }
    }
    // Wrapping the coder in a length prefix measures prefix + body.
    let lp = Coder::LengthPrefix(Box::new(coder.clone()));
    let mut framed = Vec::new();
    encode_len_prefixed(bytes, &mut framed);
    assert_eq!(
        lp.encoded_len(&framed).unwrap(),
        framed.len(),
        "{ctx}: length_prefix"
    );
    stats.len_checks += 1;
}

/// Extra checks of the crate's typed helpers on the matching coders.
fn check_helpers(
    coder: &Coder,
    bytes: &[u8],
    value: &Value,
    deterministic: bool,
    ctx: &str,
    stats: &mut Stats,
) {
    match (coder, value) {
        (Coder::GlobalWindow | Coder::IntervalWindow, Value::Window(w)) => {
            assert_eq!(
                Window::decode(coder, bytes).unwrap(),
                (w.clone(), bytes.len()),
                "{ctx}"
            );
            let mut out = Vec::new();
            w.encode(&mut out);
            assert_eq!(out, bytes, "{ctx}: Window::encode");
            stats.helper_checks += 1;
        }
        (
            Coder::WindowedValue {
                value: vc,
                window: wc,
            },
            Value::Windowed {
                timestamp,
                windows,
                pane,
                ..
            },
        ) => {
            let (wv, n) =
                WindowedValue::decode(vc, wc, bytes).unwrap_or_else(|e| panic!("{ctx}: {e}"));
            assert_eq!(n, bytes.len(), "{ctx}: WindowedValue::decode consumed");
            assert_eq!(
                (&wv.timestamp, &wv.windows, &wv.pane),
                (timestamp, windows, pane),
                "{ctx}"
            );
            assert_eq!(vc.encoded_len(&wv.value).unwrap(), wv.value.len());
            let mut out = Vec::new();
            wv.encode(&mut out);
            assert_eq!(out, bytes, "{ctx}: WindowedValue::encode");
            let stream = [bytes, bytes, bytes].concat();
            let all = WindowedValue::decode_all(vc, wc, &stream).unwrap();
            assert_eq!(all, vec![wv.clone(), wv.clone(), wv], "{ctx}: decode_all");
            stats.helper_checks += 1;
        }
        (Coder::Kv(kc, _), Value::Kv(k, _)) => {
            let (kb, vb) = split_kv(coder, bytes).unwrap();
            let mut key_bytes = Vec::new();
            encode_value(kc, k, true, &mut key_bytes);
            assert_eq!(kb, &key_bytes[..], "{ctx}: split_kv key");
            assert_eq!(kb.len() + vb.len(), bytes.len());
            stats.helper_checks += 1;
        }
        (Coder::Iterable(e), Value::List(items)) if deterministic => {
            // Element boundaries found by encoded_len, re-joined by encode_iterable.
            let mut pos = 4;
            let mut elems = Vec::new();
            for _ in items {
                let n = e.encoded_len(&bytes[pos..]).unwrap();
                elems.push(&bytes[pos..pos + n]);
                pos += n;
            }
            let mut out = Vec::new();
            encode_iterable(elems.into_iter(), &mut out);
            assert_eq!(out, bytes, "{ctx}: encode_iterable");
            stats.helper_checks += 1;
        }
        _ => {}
    }
}

#[test]
fn beam_standard_coders_yaml() {
    let path = locate_yaml();
    let text = std::fs::read_to_string(&path).expect("read standard_coders.yaml");
    let mut stats = Stats::default();
    let mut skipped: Vec<String> = Vec::new();

    for (doc_index, de) in serde_yaml::Deserializer::from_str(&text).enumerate() {
        let doc = Yaml::deserialize(de).expect("valid yaml document");
        if doc.is_null() {
            continue;
        }
        let spec = field(&doc, "coder");
        let coder = coder_from_spec(spec);
        let top_urn = coder.urn().to_string();

        let mut unknown = Vec::new();
        opaque_urns(&coder, &mut unknown);
        if !unknown.is_empty() {
            for u in &unknown {
                assert!(
                    SKIPPED_URNS.contains(&u.as_str()),
                    "document #{doc_index} uses coder {u} which the runner does not understand \
                     and which is not in SKIPPED_URNS"
                );
            }
            if !skipped.contains(&top_urn) {
                skipped.push(top_urn);
            }
            stats.docs_skipped += 1;
            continue;
        }

        let non_deterministic = spec
            .get("non_deterministic")
            .map(yaml_bool)
            .unwrap_or(false);
        let contexts: Vec<bool> = match doc.get("nested") {
            Some(n) => vec![yaml_bool(n)],
            None => vec![true, false],
        };
        let state: StateMap = spec
            .get("state")
            .or_else(|| doc.get("state"))
            .and_then(Yaml::as_mapping)
            .map(|m| {
                m.iter()
                    .map(|(k, v)| (yaml_str(k).as_bytes().to_vec(), latin1(yaml_str(v))))
                    .collect()
            })
            .unwrap_or_default();

        // Coder-level API checks.
        let conservative = contains(&coder, &|c| {
            matches!(c, Coder::StateBackedIterable(_) | Coder::CustomWindow(_))
        });
        assert_eq!(
            coder.is_runner_readable(),
            !conservative,
            "doc #{doc_index} {top_urn}: is_runner_readable"
        );
        let lp = coder.length_prefix_unknown();
        assert!(lp.is_runner_readable());
        assert_eq!(
            lp.length_prefix_unknown(),
            lp,
            "length_prefix_unknown is idempotent"
        );
        if !conservative {
            assert_eq!(lp, coder, "readable coders are left unchanged");
        }

        let examples = field(&doc, "examples")
            .as_mapping()
            .expect("examples mapping");
        assert!(!examples.is_empty());
        for (k, v) in examples {
            let bytes = latin1(yaml_str(k));
            for &nested in &contexts {
                let ctx = format!(
                    "doc #{doc_index} {top_urn} (nested={nested}) example {:02x?}",
                    bytes
                );
                stats.examples += 1;
                // (a) encoded_len, nested context only.
                if nested || !outer_differs(&coder) {
                    check_encoded_len(&coder, &bytes, &ctx, &mut stats);
                }
                // (b) decode, compare with the YAML value, re-encode.
                let mut d = Decoder {
                    bytes: &bytes,
                    pos: 0,
                    state: &state,
                };
                let decoded = d.value(&coder, nested);
                assert_eq!(d.pos, bytes.len(), "{ctx}: test decoder consumed");
                let want = expected(&coder, v);
                assert_eq!(decoded, want, "{ctx}: decoded value");
                if !non_deterministic {
                    let mut out = Vec::new();
                    encode_value(&coder, &want, nested, &mut out);
                    assert_eq!(out, bytes, "{ctx}: re-encoding");
                    stats.reencodes += 1;
                }
                if nested || !outer_differs(&coder) {
                    check_helpers(
                        &coder,
                        &bytes,
                        &decoded,
                        !non_deterministic,
                        &ctx,
                        &mut stats,
                    );
                }
            }
        }
        stats.docs_checked += 1;
    }

    println!(
        "standard_coders.yaml ({}): {} documents checked, {} skipped {:?}; {} example/context \
         pairs, {} encoded_len checks, {} re-encodings, {} typed-helper checks",
        path.display(),
        stats.docs_checked,
        stats.docs_skipped,
        skipped,
        stats.examples,
        stats.len_checks,
        stats.reencodes,
        stats.helper_checks
    );
    assert!(
        stats.docs_checked >= MIN_CHECKED_DOCS,
        "only {} documents checked, expected at least {MIN_CHECKED_DOCS}",
        stats.docs_checked
    );
}
