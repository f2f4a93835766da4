//! Layering: the planner stays free of the async/gRPC runtime and of the
//! layers after it.
//!
//! Reads the workspace's manifests through `cargo metadata` and checks the
//! *direct* normal (and build) dependencies of `weir-plan`: it needs
//! `weir-proto`, whose generated services pull in tonic, so its transitive
//! tree can't be checked. The engine's whole tree is checked in
//! `crates/engine/tests/layering.rs`.

use std::process::Command;

use serde_json::Value;

/// `cargo metadata --no-deps` for this workspace (manifests only, no resolution).
fn metadata() -> Value {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_string());
    let out = Command::new(&cargo)
        .args(["metadata", "--format-version", "1", "--no-deps"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap_or_else(|e| panic!("running {cargo} metadata: {e}"));
    assert!(
        out.status.success(),
        "cargo metadata failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("cargo metadata prints JSON")
}

/// Package names `package` depends on directly, dev-dependencies excluded.
fn direct_deps(meta: &Value, package: &str) -> Vec<String> {
    let packages = meta["packages"].as_array().expect("packages array");
    let p = packages
        .iter()
        .find(|p| p["name"] == package)
        .unwrap_or_else(|| panic!("package {package} is not in the workspace"));
    let mut deps: Vec<String> = p["dependencies"]
        .as_array()
        .expect("dependencies array")
        .iter()
        .filter(|d| d["kind"].as_str() != Some("dev"))
        .map(|d| d["name"].as_str().expect("dependency name").to_string())
        .collect();
    deps.sort();
    deps.dedup();
    deps
}

fn assert_none_of(package: &str, deps: &[String], forbidden: &[&str]) {
    let bad: Vec<&String> = deps
        .iter()
        .filter(|d| forbidden.contains(&d.as_str()))
        .collect();
    assert!(
        bad.is_empty(),
        "{package} must not depend directly on {bad:?} (its dependencies: {deps:?})"
    );
}

#[test]
fn plan_has_no_async_or_grpc_dependency() {
    let meta = metadata();
    let deps = direct_deps(&meta, "weir-plan");
    // Not vacuous: the manifest was read.
    assert!(deps.iter().any(|d| d == "weir-proto"), "{deps:?}");
    assert!(deps.iter().any(|d| d == "weir-model"), "{deps:?}");
    assert_none_of(
        "weir-plan",
        &deps,
        &["tokio", "tokio-stream", "tonic", "timely"],
    );
    assert_none_of(
        "weir-plan",
        &deps,
        &["weir-engine", "weir-harness", "weir-jobs", "weir"],
    );
}
