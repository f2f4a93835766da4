//! Reading option values in the shapes the SDKs send them: Python sends
//! integers as strings and repeated flags as lists, Java sends numbers,
//! objects and lists, Go sends every flag as a string.

use std::collections::BTreeMap;
use std::sync::OnceLock;
use std::time::Duration;

use regex::Regex;
use weir_proto::prost_types::{value::Kind, Value};

use super::OptionError;

fn err(key: &str, reason: impl Into<String>) -> OptionError {
    OptionError {
        option: key.to_string(),
        reason: reason.into(),
    }
}

/// The value as one line of text, shortened, for messages.
pub(crate) fn display(v: &Value) -> String {
    fn full(v: &Value) -> String {
        match &v.kind {
            None | Some(Kind::NullValue(_)) => "null".into(),
            Some(Kind::StringValue(s)) => s.clone(),
            Some(Kind::BoolValue(b)) => b.to_string(),
            Some(Kind::NumberValue(n)) => number(*n),
            Some(Kind::ListValue(l)) => l.values.iter().map(full).collect::<Vec<_>>().join(","),
            Some(Kind::StructValue(s)) => {
                let inner: Vec<String> = s
                    .fields
                    .iter()
                    .map(|(k, v)| format!("{k}={}", full(v)))
                    .collect();
                format!("{{{}}}", inner.join(","))
            }
        }
    }
    let text = full(v);
    if text.chars().count() > 120 {
        format!("{}...", text.chars().take(117).collect::<String>())
    } else {
        text
    }
}

fn number(n: f64) -> String {
    if n.fract() == 0.0 && n.abs() < 1e15 {
        format!("{}", n as i64)
    } else {
        n.to_string()
    }
}

/// True when the value says something: not null, not an empty string, list
/// or object, not `false`.
pub(crate) fn is_set(v: &Value) -> bool {
    match &v.kind {
        None | Some(Kind::NullValue(_)) => false,
        Some(Kind::StringValue(s)) => !s.trim().is_empty(),
        Some(Kind::BoolValue(b)) => *b,
        Some(Kind::NumberValue(_)) => true,
        Some(Kind::ListValue(l)) => !l.values.is_empty(),
        Some(Kind::StructValue(s)) => !s.fields.is_empty(),
    }
}

/// A string option; an empty string counts as unset.
pub(crate) fn string(key: &str, v: &Value) -> Result<Option<String>, OptionError> {
    match &v.kind {
        None | Some(Kind::NullValue(_)) => Ok(None),
        Some(Kind::StringValue(s)) if s.trim().is_empty() => Ok(None),
        Some(Kind::StringValue(s)) => Ok(Some(s.clone())),
        Some(Kind::NumberValue(n)) => Ok(Some(number(*n))),
        Some(Kind::BoolValue(b)) => Ok(Some(b.to_string())),
        Some(Kind::ListValue(_)) | Some(Kind::StructValue(_)) => {
            Err(err(key, format!("expects a string, got {:?}", display(v))))
        }
    }
}

/// A boolean option: a bool, or the string `true` / `false` (Go).
pub(crate) fn boolean(key: &str, v: &Value) -> Result<Option<bool>, OptionError> {
    match &v.kind {
        None | Some(Kind::NullValue(_)) => Ok(None),
        Some(Kind::BoolValue(b)) => Ok(Some(*b)),
        Some(Kind::StringValue(s)) => match s.trim().to_ascii_lowercase().as_str() {
            "" => Ok(None),
            "true" => Ok(Some(true)),
            "false" => Ok(Some(false)),
            _ => Err(err(key, format!("expects true or false, got {s:?}"))),
        },
        _ => Err(err(
            key,
            format!("expects true or false, got {:?}", display(v)),
        )),
    }
}

/// An integer option: a whole number, or its decimal string (Python, Go).
pub(crate) fn integer(key: &str, v: &Value) -> Result<Option<i64>, OptionError> {
    match &v.kind {
        None | Some(Kind::NullValue(_)) => Ok(None),
        Some(Kind::NumberValue(n)) if n.is_finite() && n.fract() == 0.0 && n.abs() < 9.0e15 => {
            Ok(Some(*n as i64))
        }
        Some(Kind::StringValue(s)) if s.trim().is_empty() => Ok(None),
        Some(Kind::StringValue(s)) => s
            .trim()
            .parse::<i64>()
            .map(Some)
            .map_err(|_| err(key, format!("expects an integer, got {s:?}"))),
        _ => Err(err(
            key,
            format!("expects an integer, got {:?}", display(v)),
        )),
    }
}

/// An integer option that must be at least `min`.
pub(crate) fn integer_at_least(
    key: &str,
    v: &Value,
    min: i64,
    what: &str,
) -> Result<Option<i64>, OptionError> {
    match integer(key, v)? {
        Some(n) if n < min => Err(err(key, format!("must be {what}, got {n}"))),
        n => Ok(n),
    }
}

/// A list-of-strings option: a list, or a comma-separated string (Go).
pub(crate) fn list(key: &str, v: &Value) -> Result<Vec<String>, OptionError> {
    let item = |v: &Value| match &v.kind {
        Some(Kind::StringValue(s)) => Ok(s.clone()),
        Some(Kind::NumberValue(n)) => Ok(number(*n)),
        Some(Kind::BoolValue(b)) => Ok(b.to_string()),
        _ => Err(err(
            key,
            format!("expects a list of strings, got an element {:?}", display(v)),
        )),
    };
    match &v.kind {
        None | Some(Kind::NullValue(_)) => Ok(vec![]),
        Some(Kind::ListValue(l)) => {
            let mut out = vec![];
            for v in &l.values {
                out.extend(
                    item(v)?
                        .split(',')
                        .map(str::trim)
                        .filter(|s| !s.is_empty())
                        .map(str::to_string),
                );
            }
            Ok(out)
        }
        Some(Kind::StringValue(s)) => Ok(s
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_string)
            .collect()),
        _ => Err(err(
            key,
            format!("expects a list of strings, got {:?}", display(v)),
        )),
    }
}

fn scalar_text(key: &str, entry: &str, v: &Value) -> Result<String, OptionError> {
    match &v.kind {
        Some(Kind::StringValue(s)) => Ok(s.clone()),
        Some(Kind::NumberValue(n)) => Ok(number(*n)),
        Some(Kind::BoolValue(b)) => Ok(b.to_string()),
        None | Some(Kind::NullValue(_)) => Ok(String::new()),
        _ => Err(err(
            key,
            format!(
                "the value of {entry:?} must be a string, got {:?}",
                display(v)
            ),
        )),
    }
}

fn json_object(
    key: &str,
    text: &str,
    out: &mut BTreeMap<String, String>,
) -> Result<(), OptionError> {
    let parsed: serde_json::Value = serde_json::from_str(text)
        .map_err(|e| err(key, format!("{text:?} is not a JSON object: {e}")))?;
    let serde_json::Value::Object(map) = parsed else {
        return Err(err(key, format!("{text:?} is not a JSON object")));
    };
    for (k, v) in map {
        let v = match v {
            serde_json::Value::String(s) => s,
            serde_json::Value::Number(n) => n.to_string(),
            serde_json::Value::Bool(b) => b.to_string(),
            serde_json::Value::Null => String::new(),
            other => {
                return Err(err(
                    key,
                    format!("the value of {k:?} must be a string, got {other}"),
                ))
            }
        };
        out.insert(k, v);
    }
    Ok(())
}

fn text_entry(
    key: &str,
    text: &str,
    out: &mut BTreeMap<String, String>,
) -> Result<(), OptionError> {
    let t = text.trim();
    if t.starts_with('{') {
        return json_object(key, t, out);
    }
    if t.is_empty() {
        return Ok(());
    }
    let (k, v) = t.split_once('=').unwrap_or((t, ""));
    out.insert(k.to_string(), v.to_string());
    Ok(())
}

/// A string-to-string map option (labels, transform_name_mapping): an
/// object (Java, Python dicts), a JSON object string (Java/Go flags), or
/// a list whose elements are `key=value` or JSON objects (Python's repeated
/// `--labels`). Later entries win.
pub(crate) fn string_map(key: &str, v: &Value) -> Result<BTreeMap<String, String>, OptionError> {
    let mut out = BTreeMap::new();
    match &v.kind {
        None | Some(Kind::NullValue(_)) => {}
        Some(Kind::StructValue(s)) => {
            for (k, v) in &s.fields {
                out.insert(k.clone(), scalar_text(key, k, v)?);
            }
        }
        Some(Kind::StringValue(s)) => text_entry(key, s, &mut out)?,
        Some(Kind::ListValue(l)) => {
            for item in &l.values {
                match &item.kind {
                    Some(Kind::StringValue(s)) => text_entry(key, s, &mut out)?,
                    Some(Kind::StructValue(s)) => {
                        for (k, v) in &s.fields {
                            out.insert(k.clone(), scalar_text(key, k, v)?);
                        }
                    }
                    _ => {
                        return Err(err(
                            key,
                            format!("expects key=value entries, got {:?}", display(item)),
                        ))
                    }
                }
            }
        }
        _ => {
            return Err(err(
                key,
                format!("expects an object of strings, got {:?}", display(v)),
            ))
        }
    }
    Ok(out)
}

/// An object of strings only (transform_name_mapping): an object, or a JSON
/// object string.
pub(crate) fn object(key: &str, v: &Value) -> Result<BTreeMap<String, String>, OptionError> {
    match &v.kind {
        Some(Kind::StringValue(s)) if !s.trim().is_empty() && !s.trim().starts_with('{') => Err(
            err(key, format!("expects a JSON object of strings, got {s:?}")),
        ),
        Some(Kind::ListValue(_)) => Err(err(
            key,
            format!("expects an object of strings, got {:?}", display(v)),
        )),
        _ => string_map(key, v),
    }
}

fn label_patterns() -> &'static (Regex, Regex) {
    static P: OnceLock<(Regex, Regex)> = OnceLock::new();
    P.get_or_init(|| {
        (
            Regex::new(r"^[\p{Ll}\p{Lo}][\p{Ll}\p{Lo}\p{N}_-]{0,62}$").expect("label key pattern"),
            Regex::new(r"^[\p{Ll}\p{Lo}\p{N}_-]{0,63}$").expect("label value pattern"),
        )
    })
}

/// Most labels a Dataflow job may carry.
pub const MAX_LABELS: usize = 64;

/// Checks labels against Dataflow's (Compute Engine's) label rules.
pub(crate) fn check_labels(
    key: &str,
    labels: &BTreeMap<String, String>,
) -> Result<(), OptionError> {
    if labels.len() > MAX_LABELS {
        return Err(err(
            key,
            format!(
                "{} labels given; Dataflow allows at most {MAX_LABELS}",
                labels.len()
            ),
        ));
    }
    let (key_re, value_re) = label_patterns();
    for (k, v) in labels {
        if !key_re.is_match(k) {
            return Err(err(
                key,
                format!(
                    "label key {k:?} is invalid: keys start with a lowercase letter and contain only lowercase letters, digits, '_' and '-', at most 63 characters"
                ),
            ));
        }
        if !value_re.is_match(v) {
            return Err(err(
                key,
                format!(
                    "label value {v:?} (key {k:?}) is invalid: values contain only lowercase letters, digits, '_' and '-', at most 63 characters"
                ),
            ));
        }
    }
    Ok(())
}

/// Schemes a temp or staging location may use.
pub const LOCATION_SCHEMES: &[&str] = &["file", "gs", "s3"];

/// GCS bucket names as Dataflow accepts them in a location
/// (`PipelineOptionsValidator.GCS_BUCKET` of Beam's Python SDK, which the
/// Dataflow runner applies to `temp_location` and `staging_location`):
/// lowercase letters, digits, `-`, `_` and `.`, starting and ending with a
/// letter or digit, at least 3 characters.
fn gcs_bucket() -> &'static Regex {
    static RE: OnceLock<Regex> = OnceLock::new();
    RE.get_or_init(|| Regex::new(r"^[a-z0-9][-_a-z0-9.]+[a-z0-9]$").expect("valid regex"))
}

/// Checks a temp or staging location: a local path, or a `file://`, `gs://`
/// or `s3://` URL (the last two with a bucket). A `gs://` location follows
/// Dataflow's rule (`PipelineOptionsValidator.validate_gcs_path`):
/// `gs://BUCKET/OBJECT` with a valid bucket name (see [`gcs_bucket`]; so no
/// `@`, upper case or spaces), a `/` after the bucket, and no line break in
/// the object.
pub(crate) fn check_location(key: &str, location: &str) -> Result<(), OptionError> {
    let Some((scheme, rest)) = location.split_once("://") else {
        return Ok(());
    };
    let is_scheme = scheme
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic())
        && scheme
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'));
    if !is_scheme {
        return Ok(());
    }
    let scheme = scheme.to_ascii_lowercase();
    if !LOCATION_SCHEMES.contains(&scheme.as_str()) {
        return Err(err(key, format!("{location:?}: scheme {scheme}:// is not supported; use a local path, file://, gs:// or s3://")));
    }
    if scheme != "file" && rest.split('/').next().unwrap_or("").is_empty() {
        return Err(err(key, format!("{location:?} names no bucket")));
    }
    if scheme == "gs" {
        let Some((bucket, object)) = rest.split_once('/') else {
            return Err(err(key, format!("{location:?} is not a Cloud Storage path gs://BUCKET/OBJECT; did you mean \"{location}/\"?")));
        };
        if !gcs_bucket().is_match(bucket) {
            return Err(err(key, format!(
                "{location:?}: invalid Cloud Storage bucket name {bucket:?}: use 3 or more lowercase letters, digits, '-', '_' or '.', starting and ending with a letter or digit (https://cloud.google.com/storage/docs/buckets#naming)"
            )));
        }
        if object.contains(['\n', '\r']) {
            return Err(err(
                key,
                format!("{location:?}: a Cloud Storage object name cannot contain a line break"),
            ));
        }
    }
    Ok(())
}

/// Parses a Go duration (`time.ParseDuration`): `300ms`, `1.5h`, `3m30s`.
/// Negative durations are refused.
pub fn go_duration(text: &str) -> Option<Duration> {
    let mut s = text.trim();
    if let Some(rest) = s.strip_prefix('+') {
        s = rest;
    }
    if s == "0" {
        return Some(Duration::ZERO);
    }
    if s.is_empty() {
        return None;
    }
    const UNITS: &[(&str, f64)] = &[
        ("ns", 1e-9),
        ("us", 1e-6),
        ("\u{b5}s", 1e-6),
        ("\u{3bc}s", 1e-6),
        ("ms", 1e-3),
        ("s", 1.0),
        ("m", 60.0),
        ("h", 3600.0),
    ];
    let mut seconds = 0.0f64;
    while !s.is_empty() {
        let end = s
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(s.len());
        let (num, rest) = s.split_at(end);
        if num.is_empty() || num == "." {
            return None;
        }
        let value: f64 = num.parse().ok()?;
        let (unit, scale) = UNITS.iter().find(|(u, _)| rest.starts_with(u))?;
        seconds += value * scale;
        s = &rest[unit.len()..];
    }
    Duration::try_from_secs_f64(seconds).ok()
}

/// A duration for messages: `90s`, `3m`, `3m30s`, `1h`.
pub(crate) fn human(d: Duration) -> String {
    let total = d.as_secs();
    if d.subsec_nanos() != 0 || total == 0 {
        return format!("{:?}", d);
    }
    let (h, m, s) = (total / 3600, total / 60 % 60, total % 60);
    let mut out = String::new();
    if h > 0 {
        out.push_str(&format!("{h}h"));
    }
    if m > 0 {
        out.push_str(&format!("{m}m"));
    }
    if s > 0 {
        out.push_str(&format!("{s}s"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_durations() {
        assert_eq!(go_duration("3m30s"), Some(Duration::from_secs(210)));
        assert_eq!(go_duration("1h"), Some(Duration::from_secs(3600)));
        assert_eq!(go_duration("1.5m"), Some(Duration::from_secs(90)));
        assert_eq!(go_duration("250ms"), Some(Duration::from_millis(250)));
        assert_eq!(go_duration("0"), Some(Duration::ZERO));
        assert_eq!(go_duration("+2m"), Some(Duration::from_secs(120)));
        for bad in ["", "5", "-1m", "m", "3x", "1m30", ".m"] {
            assert_eq!(go_duration(bad), None, "{bad}");
        }
    }

    #[test]
    fn human_durations() {
        assert_eq!(human(Duration::from_secs(210)), "3m30s");
        assert_eq!(human(Duration::from_secs(3600)), "1h");
        assert_eq!(human(Duration::from_secs(45)), "45s");
    }

    #[test]
    fn locations() {
        for ok in [
            "/tmp/x",
            "relative/dir",
            "file:///tmp/x",
            "gs://bucket/tmp",
            "gs://my_bucket.example-1/",
            "gs://bucket/x@1/y",
            "s3://bucket",
            "GS://bucket/x",
            "C:\\temp",
        ] {
            assert!(check_location("temp_location", ok).is_ok(), "{ok}");
        }
        for bad in [
            "hdfs://nn/tmp",
            "http://host/x",
            "azfs://a/b",
            "gs://",
            "s3:///x",
            // Dataflow's rule for gs:// locations: bucket names in lower
            // case, of letters, digits, '-', '_', '.', a '/' after them.
            "gs://bucket@1/tmp",
            "gs://b@2",
            "gs://Bucket/x",
            "gs://ab/x",
            "gs://-bucket/x",
            "gs://bucket",
            "gs://bucket/a\nb",
        ] {
            let e = check_location("temp_location", bad).unwrap_err();
            assert_eq!(e.option, "temp_location", "{bad}");
        }
    }

    #[test]
    fn label_rules() {
        let ok: BTreeMap<String, String> = [
            ("env", "prod"),
            ("team-a_1", ""),
            ("ключ", "значение"),
            ("k", "0-9_x"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        check_labels("labels", &ok).unwrap();
        for (k, v) in [
            ("Env", "x"),
            ("1env", "x"),
            ("env", "Prod"),
            ("env", "a.b"),
            ("e", "x y"),
        ] {
            let m = BTreeMap::from([(k.to_string(), v.to_string())]);
            assert!(check_labels("labels", &m).is_err(), "{k}={v}");
        }
        let long_key = BTreeMap::from([("a".repeat(64), String::new())]);
        assert!(check_labels("labels", &long_key).is_err());
        let max_key = BTreeMap::from([("a".repeat(63), "b".repeat(63))]);
        check_labels("labels", &max_key).unwrap();
        let long_value = BTreeMap::from([("a".into(), "b".repeat(64))]);
        assert!(check_labels("labels", &long_value).is_err());
        let many: BTreeMap<String, String> =
            (0..65).map(|i| (format!("k{i}"), String::new())).collect();
        assert!(check_labels("labels", &many).is_err());
    }
}
