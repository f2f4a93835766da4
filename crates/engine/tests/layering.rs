//! The engine's dependency tree (normal dependencies, transitively) holds
//! no proto, gRPC or async-runtime crate: it runs a `weir_graph::StageGraph`
//! and never sees a pipeline proto (README, "Layout").

use std::collections::{BTreeSet, HashMap};
use std::process::Command;

/// Crates the engine must not reach, and why.
const FORBIDDEN: &[(&str, &str)] = &[
    ("weir-proto", "Runner API / Fn API protos"),
    ("weir-plan", "proto-facing planner"),
    ("beam-model-rs", "Beam's generated protos"),
    ("prost", "protobuf"),
    ("tonic", "gRPC"),
    ("tokio", "async runtime (the harness owns it)"),
];

/// The host's target triple (`rustc -vV`), so the walk needs only the
/// packages this platform builds.
fn host() -> String {
    let out = Command::new("rustc").arg("-vV").output().expect("rustc runs");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("host: "))
        .expect("rustc -vV names the host")
        .to_string()
}

/// Names of every package `root` reaches through normal (non-dev,
/// non-build) dependencies, according to `cargo metadata`.
fn normal_closure(root: &str) -> BTreeSet<String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args(["metadata", "--format-version", "1", "--offline"])
        .args(["--filter-platform", &host()])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo metadata runs");
    assert!(
        out.status.success(),
        "cargo metadata failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let names: HashMap<&str, &str> = meta["packages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (p["id"].as_str().unwrap(), p["name"].as_str().unwrap()))
        .collect();
    let nodes: HashMap<&str, &serde_json::Value> = meta["resolve"]["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| (n["id"].as_str().unwrap(), n))
        .collect();
    let start = names
        .iter()
        .find(|(_, n)| **n == root)
        .map(|(id, _)| *id)
        .expect("root package in the workspace");
    let mut seen = BTreeSet::new();
    let mut stack = vec![start];
    while let Some(id) = stack.pop() {
        if !seen.insert(id) {
            continue;
        }
        for dep in nodes[id]["deps"].as_array().into_iter().flatten() {
            let normal = dep["dep_kinds"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|k| k["kind"].is_null());
            if normal {
                stack.push(dep["pkg"].as_str().unwrap());
            }
        }
    }
    seen.iter().map(|id| names[id].to_string()).collect()
}

#[test]
fn engine_reaches_no_proto_grpc_or_tokio_crate() {
    let closure = normal_closure("weir-engine");
    assert!(closure.contains("weir-graph") && closure.contains("timely"));
    let found: Vec<String> = FORBIDDEN
        .iter()
        .filter(|(name, _)| closure.contains(*name))
        .map(|(name, why)| format!("{name} ({why})"))
        .collect();
    assert!(
        found.is_empty(),
        "weir-engine depends (transitively) on {}",
        found.join(", ")
    );
}

#[test]
fn the_check_sees_a_crate_that_does_reach_them() {
    // The same walk from weir-harness must find tonic: the check can fail.
    let closure = normal_closure("weir-harness");
    assert!(closure.contains("tonic") && closure.contains("weir-engine"));
}
