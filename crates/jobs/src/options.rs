//! Pipeline options as the SDK sends them at Prepare: a `Struct` keyed
//! `beam:option:<name>:v1` (Python, Go) or by plain name.

use weir_proto::prost_types::{value::Kind, Struct, Value};

/// The value of option `name` (snake_case), in either spelling.
pub fn get<'a>(options: &'a Struct, name: &str) -> Option<&'a Value> {
    options.fields.get(&format!("beam:option:{name}:v1")).or_else(|| options.fields.get(name))
}

/// A string option.
pub fn string(options: &Struct, name: &str) -> Option<String> {
    match &get(options, name)?.kind {
        Some(Kind::StringValue(s)) => Some(s.clone()),
        Some(Kind::NumberValue(n)) => Some(n.to_string()),
        _ => None,
    }
}

/// A list-of-strings option (e.g. `experiments`).
pub fn strings(options: &Struct, name: &str) -> Vec<String> {
    match get(options, name).and_then(|v| v.kind.as_ref()) {
        Some(Kind::ListValue(l)) => l
            .values
            .iter()
            .filter_map(|v| match &v.kind {
                Some(Kind::StringValue(s)) => Some(s.clone()),
                _ => None,
            })
            .collect(),
        Some(Kind::StringValue(s)) => s.split(',').map(str::to_string).collect(),
        _ => vec![],
    }
}

/// True when `experiments` contains `name` (alone or as `name=value`).
pub fn has_experiment(options: &Struct, name: &str) -> bool {
    strings(options, "experiments").iter().any(|e| e == name || e.starts_with(&format!("{name}=")))
}

/// How many SDK harnesses each environment gets: one per core (Dataflow's
/// rule), or one with `--experiments=no_use_multiple_sdk_containers`.
pub fn sdk_workers_per_environment(options: &Struct) -> usize {
    if has_experiment(options, "no_use_multiple_sdk_containers") {
        return 1;
    }
    std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
}
