//! Pipeline options at Prepare: Dataflow's options in the Python, Java and
//! Go spellings are checked and typed by `options::validate`, every other
//! option passes, and the job service turns refusals into INVALID_ARGUMENT
//! and notes into job messages.

use std::collections::BTreeMap;
use std::time::Duration;

use weir_jobs::options::{self, AutoscalingAlgorithm, JobOptions, OptionError, CATALOG};
use weir_jobs::{JobRegistry, JobService, ServerConfig};
use weir_proto::beam;
use weir_proto::beam::job_service_server::JobService as _;
use weir_proto::prost::Message;
use weir_proto::prost_types::{value::Kind, ListValue, Struct, Value};

// ------------------------------------------------------------------ helpers

fn to_value(json: &serde_json::Value) -> Value {
    let kind = match json {
        serde_json::Value::Null => Kind::NullValue(0),
        serde_json::Value::Bool(b) => Kind::BoolValue(*b),
        serde_json::Value::Number(n) => Kind::NumberValue(n.as_f64().unwrap()),
        serde_json::Value::String(s) => Kind::StringValue(s.clone()),
        serde_json::Value::Array(a) => Kind::ListValue(ListValue {
            values: a.iter().map(to_value).collect(),
        }),
        serde_json::Value::Object(o) => Kind::StructValue(Struct {
            fields: o.iter().map(|(k, v)| (k.clone(), to_value(v))).collect(),
        }),
    };
    Value { kind: Some(kind) }
}

/// A pipeline options Struct from JSON.
fn opts(json: serde_json::Value) -> Struct {
    match to_value(&json).kind {
        Some(Kind::StructValue(s)) => s,
        _ => panic!("options must be a JSON object"),
    }
}

fn ok(json: serde_json::Value) -> JobOptions {
    options::validate(&opts(json.clone())).unwrap_or_else(|e| panic!("{json} was refused: {e}"))
}

/// Validation must fail, naming `option` (as spelled) and saying `why`.
fn refused(json: serde_json::Value, option: &str, why: &str) -> OptionError {
    let e = options::validate(&opts(json.clone())).expect_err(&format!("{json} was accepted"));
    assert_eq!(e.option, option, "{json}: {e}");
    assert!(
        e.to_string().contains(why),
        "{json}: {e:?} does not say {why:?}"
    );
    assert!(e.to_string().contains(&format!("--{option}")), "{e}");
    e
}

fn py(name: &str) -> String {
    format!("beam:option:{name}:v1")
}

fn one(name: &str, value: serde_json::Value) -> serde_json::Value {
    serde_json::json!({ py(name): value })
}

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn has_note(o: &JobOptions, start: &str) -> bool {
    o.notes.iter().any(|n| n.starts_with(start))
}

// ------------------------------------------------------------------ SDK dumps

#[test]
fn python_default_options_are_all_accepted_without_notes() {
    let json: serde_json::Value = serde_json::from_str(PYTHON_DEFAULT_OPTIONS).unwrap();
    assert!(json.as_object().unwrap().len() >= 70);
    let o = ok(json);
    assert_eq!(o.notes, Vec::<String>::new());
    assert_eq!(o.experiments, vec!["beam_fn_api"]);
    assert_eq!(o.max_cache_memory_usage_mb, Some(0));
    assert!(!o.update && !o.streaming && o.labels.is_empty());
    assert_eq!(o.job_name, None);
}

#[test]
fn python_dataflow_options_are_typed_and_noted() {
    let o = ok(serde_json::from_str(PYTHON_DATAFLOW_OPTIONS).unwrap());
    assert_eq!(o.job_name.as_deref(), Some("my-job"));
    assert_eq!(o.project.as_deref(), Some("proj"));
    assert_eq!(o.region.as_deref(), Some("us-central1"));
    assert_eq!(o.worker_region.as_deref(), Some("us-east1"));
    assert_eq!(o.labels, labels(&[("a", "b"), ("c", "d"), ("e", "")]));
    assert_eq!(o.temp_location.as_deref(), Some("gs://bkt/t"));
    assert_eq!(o.staging_location.as_deref(), Some("/tmp/s"));
    assert_eq!((o.num_workers, o.max_num_workers), (Some(2), Some(5)));
    assert_eq!(
        o.autoscaling_algorithm,
        Some(AutoscalingAlgorithm::ThroughputBased)
    );
    assert_eq!(o.number_of_worker_harness_threads, Some(4));
    assert_eq!(o.disk_size_gb, Some(50));
    assert_eq!(o.use_public_ips, Some(false));
    assert_eq!(o.flexrs_goal.as_deref(), Some("COST_OPTIMIZED"));
    assert_eq!(
        o.dataflow_service_options,
        vec!["enable_prime", "min_num_workers=2"]
    );
    assert_eq!(
        o.experiments,
        vec![
            "use_runner_v2",
            "no_use_multiple_sdk_containers",
            "beam_fn_api"
        ]
    );
    assert_eq!(o.transform_name_mapping, labels(&[("a", "b")]));
    assert!(o.update && o.streaming);
    assert_eq!(o.element_processing_timeout, Some(Duration::from_secs(180)));
    assert_eq!(
        o.spellings.get("worker_machine_type").map(String::as_str),
        Some("machine_type")
    );
    // Every option Weir does not act on is reported, in Python's spelling.
    for start in [
        "--project=proj: ",
        "--region=us-central1: ",
        "--worker_region=us-east1: ",
        "--labels: recorded with the job: a=b, c=d, e=",
        "--machine_type=n1-standard-2: ",
        "--disk_size_gb=50: ",
        "--use_public_ips=false: ",
        "--flexrs_goal=COST_OPTIMIZED: ",
        "--dataflow_service_options=enable_prime,min_num_workers=2: ",
        "--transform_name_mapping=",
        "--update=true: ",
        "--service_account_email=x@y.iam.gserviceaccount.com: ",
        "--dataflow_kms_key=k: ",
        "--enable_streaming_engine=true: ",
    ] {
        assert!(
            has_note(&o, start),
            "no note starting {start:?} in {:#?}",
            o.notes
        );
    }
    // SDK-side and honoured options are not noted.
    for quiet in [
        "--temp_location",
        "--sdk_container_image",
        "--experiments",
        "--job_name",
        "--gcp_oauth_scopes",
        "--dataflow_endpoint",
        "--num_workers",
        "--max_num_workers",
        "--autoscaling_algorithm",
        "--number_of_worker_harness_threads",
        "--element_processing_timeout_minutes",
        "--streaming",
    ] {
        assert!(!has_note(&o, quiet), "{quiet} noted: {:#?}", o.notes);
    }
    assert!(
        o.notes.iter().all(|n| n.contains("recorded")),
        "{:#?}",
        o.notes
    );
}

#[test]
fn unknown_options_are_never_refused() {
    let o = ok(serde_json::json!({
        py("direct_num_workers"): ["not", "a", "number"],
        py("flink_master"): {"nested": [1, 2]},
        py("my_custom_option"): -5,
        "someJavaOption": true,
        py("sdk_worker_parallelism"): "0",
    }));
    assert!(o.notes.is_empty());
}

#[test]
fn null_values_count_as_absent() {
    let o =
        ok(serde_json::json!({ py("num_workers"): null, py("labels"): null, py("job_name"): "" }));
    assert_eq!((o.num_workers, o.job_name), (None, None));
}

// ------------------------------------------------------------------ spellings

fn err(json: serde_json::Value) -> String {
    options::validate(&opts(json.clone())).expect_err(&format!("{json} was accepted")).to_string()
}

/// Beam Java sends its options' names in snake case (and `options_id`):
/// Weir's messages give them back as the Java user typed them.
#[test]
fn a_java_clients_options_are_named_in_camel_case_in_errors_and_notes() {
    let java = |extra: serde_json::Value| {
        let mut v = serde_json::json!({ "beam:option:options_id:v1": 7, "beam:option:app_name:v1": "App" });
        v.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        v
    };
    assert_eq!(
        err(java(serde_json::json!({ "beam:option:num_workers:v1": -2 }))),
        "pipeline option --numWorkers: must be 0 or more, got -2"
    );
    assert_eq!(
        err(java(serde_json::json!({ "beam:option:num_workers:v1": 3, "beam:option:max_num_workers:v1": 1 }))),
        "pipeline option --maxNumWorkers: 1 is less than --numWorkers=3"
    );
    let o = ok(java(serde_json::json!({ "beam:option:flex_r_s_goal:v1": "SPEED_OPTIMIZED" })));
    assert!(o.notes.iter().any(|n| n.starts_with("--flexRSGoal=")), "{:#?}", o.notes);
    // Python's spelling stays Python's.
    assert_eq!(
        err(serde_json::json!({ "beam:option:num_workers:v1": -2 })),
        "pipeline option --num_workers: must be 0 or more, got -2"
    );
}

#[test]
fn java_camel_case_spellings_in_both_key_forms() {
    let o = ok(serde_json::json!({
        "beam:option:jobName:v1": "java-job",
        "numWorkers": 3,
        "beam:option:maxNumWorkers:v1": 7,
        "labels": {"team": "data", "cost-center": "42"},
        "beam:option:hotKeyLoggingEnabled:v1": true,
        "beam:option:elementProcessingTimeoutMinutes:v1": 2,
        "usePublicIps": false,
        "beam:option:flex_r_s_goal:v1": "SPEED_OPTIMIZED",
        "beam:option:gcpTempLocation:v1": "gs://bucket/tmp",
        "beam:option:dumpHeapOnOOM:v1": true,
    }));
    assert_eq!(o.job_name.as_deref(), Some("java-job"));
    assert_eq!((o.num_workers, o.max_num_workers), (Some(3), Some(7)));
    assert_eq!(o.labels, labels(&[("cost-center", "42"), ("team", "data")]));
    assert!(o.enable_hot_key_logging);
    assert_eq!(o.element_processing_timeout, Some(Duration::from_secs(120)));
    assert_eq!(o.use_public_ips, Some(false));
    assert_eq!(o.flexrs_goal.as_deref(), Some("SPEED_OPTIMIZED"));
    assert_eq!(o.gcp_temp_location.as_deref(), Some("gs://bucket/tmp"));
    assert!(has_note(&o, "--usePublicIps=false: "));
    assert!(
        !has_note(&o, "--numWorkers"),
        "num_workers is honoured, not noted"
    );
    assert!(
        !has_note(&o, "--hotKeyLoggingEnabled"),
        "hot key logging is honoured, not noted"
    );
    assert!(has_note(&o, "--flex_r_s_goal=SPEED_OPTIMIZED: "));
    assert!(has_note(&o, "--dumpHeapOnOOM=true: "));
    // Java's snake_case translation of its names works too.
    let o = ok(
        serde_json::json!({ py("job_name"): "j", py("max_num_workers"): 4, py("hot_key_logging_enabled"): true }),
    );
    assert_eq!(
        (
            o.job_name.as_deref(),
            o.max_num_workers,
            o.enable_hot_key_logging
        ),
        (Some("j"), Some(4), true)
    );
    // Errors name the option as the user spelled it.
    refused(
        serde_json::json!({ "numWorkers": -1 }),
        "numWorkers",
        "0 or more",
    );
    refused(
        serde_json::json!({ "beam:option:workerRegion:v1": "a", "beam:option:workerZone:v1": "b" }),
        "workerRegion",
        "--workerZone",
    );
}

#[test]
fn go_flags_inside_go_options() {
    let go = |flags: serde_json::Value| {
        serde_json::json!({
            "beam:option:go_options:v1": {"options": flags},
            py("app_name"): "wordcount",
            py("experiments"): ["beam_fn_api"],
            py("retain_docker_containers"): false,
            py("parallelism"): -1,
        })
    };
    let o = ok(go(serde_json::json!({
        "job_name": "go-job",
        "labels": "{\"owner\": \"go-team\"}",
        "num_workers": "2",
        "max_num_workers": "4",
        "no_use_public_ips": "true",
        "element_processing_timeout": "3m30s",
        "worker_machine_type": "e2-standard-4",
        "flexrs_goal": "FLEXRS_COST_OPTIMIZED",
        "dataflow_service_options": "enable_prime,min_num_workers=2",
        "update": "false",
    })));
    assert_eq!(o.job_name.as_deref(), Some("go-job"));
    assert_eq!(o.labels, labels(&[("owner", "go-team")]));
    assert_eq!((o.num_workers, o.max_num_workers), (Some(2), Some(4)));
    assert_eq!(o.use_public_ips, Some(false));
    assert_eq!(o.element_processing_timeout, Some(Duration::from_secs(210)));
    assert_eq!(
        o.dataflow_service_options,
        vec!["enable_prime", "min_num_workers=2"]
    );
    assert_eq!(o.experiments, vec!["beam_fn_api"]);
    assert!(!o.update);
    assert!(has_note(&o, "--worker_machine_type=e2-standard-4: "));
    // Honoured: the job's messages say what Weir does with it, not a note.
    assert!(!has_note(&o, "--element_processing_timeout"));
    refused(
        go(serde_json::json!({ "element_processing_timeout": "30s" })),
        "element_processing_timeout",
        "less than 1 minute",
    );
    refused(
        go(serde_json::json!({ "num_workers": "two" })),
        "num_workers",
        "expects an integer",
    );
    // beam:option: keys win over Go's flags.
    let o = ok(
        serde_json::json!({ py("job_name"): "top", "beam:option:go_options:v1": {"options": {"job_name": "flag"}} }),
    );
    assert_eq!(o.job_name.as_deref(), Some("top"));
    // ...and the flag left out is noted, with both values.
    assert!(
        has_note(&o, "--job_name=flag: also given as --job_name=top, which Weir takes"),
        "{:?}",
        o.notes
    );
    let same = ok(
        serde_json::json!({ py("job_name"): "top", "beam:option:go_options:v1": {"options": {"job_name": "top"}} }),
    );
    assert!(!has_note(&same, "--job_name"), "{:?}", same.notes);
    // The plain accessors see Go's flags too.
    let s = opts(go(serde_json::json!({ "temp_location": "/tmp/go" })));
    assert_eq!(
        options::string(&s, "temp_location").as_deref(),
        Some("/tmp/go")
    );
    assert!(options::has_experiment(&s, "beam_fn_api"));
}

// ------------------------------------------------------------------ labels

#[test]
fn label_forms() {
    // Python: repeated --labels, key=value or JSON per element; a bare key has an empty value.
    let o = ok(one(
        "labels",
        serde_json::json!(["env=prod", "{\"team\": \"data\", \"tier\": \"1\"}", "flag"]),
    ));
    assert_eq!(
        o.labels,
        labels(&[
            ("env", "prod"),
            ("flag", ""),
            ("team", "data"),
            ("tier", "1")
        ])
    );
    // Java / Go: a JSON object string.
    let o = ok(one(
        "labels",
        serde_json::json!("{\"env\": \"dev\", \"n\": 3}"),
    ));
    assert_eq!(o.labels, labels(&[("env", "dev"), ("n", "3")]));
    // A Python dict or Java Map: an object.
    let o = ok(one(
        "labels",
        serde_json::json!({"env": "qa", "unicode-ключ": "значение_1"}),
    ));
    assert_eq!(
        o.labels,
        labels(&[("env", "qa"), ("unicode-ключ", "значение_1")])
    );
    // A single key=value string; Python's --label alias.
    assert_eq!(
        ok(one("labels", serde_json::json!("k=v"))).labels,
        labels(&[("k", "v")])
    );
    assert_eq!(
        ok(one("label", serde_json::json!(["k=v"]))).labels,
        labels(&[("k", "v")])
    );
    // 63-character keys and values are the longest allowed.
    ok(one(
        "labels",
        serde_json::json!([format!("{}={}", "k".repeat(63), "v".repeat(63))]),
    ));
}

#[test]
fn labels_breaking_dataflow_rules_are_refused() {
    refused(
        one("labels", serde_json::json!(["Env=prod"])),
        "labels",
        "label key \"Env\"",
    );
    refused(
        one("labels", serde_json::json!(["1env=prod"])),
        "labels",
        "label key \"1env\"",
    );
    refused(
        one("labels", serde_json::json!(["_env=prod"])),
        "labels",
        "label key",
    );
    refused(
        one("labels", serde_json::json!(["env=Prod"])),
        "labels",
        "label value \"Prod\"",
    );
    refused(
        one("labels", serde_json::json!(["env=a.b"])),
        "labels",
        "label value",
    );
    refused(
        one(
            "labels",
            serde_json::json!([format!("{}=v", "k".repeat(64))]),
        ),
        "labels",
        "at most 63",
    );
    refused(
        one(
            "labels",
            serde_json::json!([format!("k={}", "v".repeat(64))]),
        ),
        "labels",
        "at most 63",
    );
    refused(
        one("labels", serde_json::json!({"env": {"nested": "x"}})),
        "labels",
        "must be a string",
    );
    refused(
        one("labels", serde_json::json!("{not json")),
        "labels",
        "not a JSON object",
    );
    refused(
        one("labels", serde_json::json!("[\"a\"]")),
        "labels",
        "label key",
    );
    let many: Vec<String> = (0..65).map(|i| format!("k{i}=v")).collect();
    refused(
        one("labels", serde_json::json!(many)),
        "labels",
        "at most 64",
    );
    refused(
        serde_json::json!({ "beam:option:label:v1": ["BAD=x"] }),
        "label",
        "label key",
    );
}

// ------------------------------------------------------------------ locations

#[test]
fn temp_and_staging_locations() {
    for location in [
        "/tmp/weir",
        "relative/tmp",
        "file:///tmp/weir",
        "gs://bucket/tmp",
        "s3://bucket/tmp",
        "GS://bucket/tmp",
    ] {
        for name in ["temp_location", "staging_location", "gcp_temp_location"] {
            let o = ok(one(name, serde_json::json!(location)));
            let got = match name {
                "temp_location" => o.temp_location,
                "staging_location" => o.staging_location,
                _ => o.gcp_temp_location,
            };
            assert_eq!(got.as_deref(), Some(location));
        }
    }
    refused(
        one("temp_location", serde_json::json!("hdfs://nn/tmp")),
        "temp_location",
        "scheme hdfs://",
    );
    refused(
        one("staging_location", serde_json::json!("http://host/stage")),
        "staging_location",
        "scheme http://",
    );
    refused(
        serde_json::json!({ "tempLocation": "azfs://acct/c" }),
        "tempLocation",
        "use a local path, file://, gs:// or s3://",
    );
    refused(
        serde_json::json!({ "beam:option:gcpTempLocation:v1": "gs://" }),
        "gcpTempLocation",
        "names no bucket",
    );
    // Dataflow's rule for gs:// locations (Beam Python's
    // PipelineOptionsValidator.validate_gcs_path): a valid bucket name.
    refused(
        one("temp_location", serde_json::json!("gs://bucket@1/tmp")),
        "temp_location",
        "invalid Cloud Storage bucket name \"bucket@1\"",
    );
    refused(
        one("staging_location", serde_json::json!("gs://bucket")),
        "staging_location",
        "is not a Cloud Storage path gs://BUCKET/OBJECT",
    );
    refused(
        one("temp_location", serde_json::json!(["/a", "/b"])),
        "temp_location",
        "expects a string",
    );
}

// ------------------------------------------------------------------ regions and zones

#[test]
fn region_and_zone_combinations() {
    ok(serde_json::json!({ py("region"): "us-central1", py("zone"): "us-central1-a" }));
    ok(serde_json::json!({ py("region"): "us-central1", py("worker_region"): "us-east1" }));
    ok(serde_json::json!({ py("region"): "us-central1", py("worker_zone"): "us-east1-b" }));
    refused(
        serde_json::json!({ py("zone"): "a", py("worker_region"): "b" }),
        "zone",
        "--worker_region",
    );
    refused(
        serde_json::json!({ py("zone"): "a", py("worker_zone"): "b" }),
        "zone",
        "--worker_zone",
    );
    refused(
        serde_json::json!({ py("worker_region"): "a", py("worker_zone"): "b" }),
        "worker_region",
        "mutually exclusive",
    );
    refused(
        serde_json::json!({ py("worker_region"): "a", py("experiments"): ["worker_region=b"] }),
        "experiments",
        "deprecated experiment worker_region",
    );
    // Empty strings are unset.
    ok(serde_json::json!({ py("zone"): "a", py("worker_region"): "" }));
}

// ------------------------------------------------------------------ experiments

#[test]
fn legacy_runner_experiments_are_refused() {
    for e in [
        "disable_portable_runner",
        "disable_runner_v2",
        "enable_streaming_java_runner",
        "disable_runner_v2_until_2023",
        "disable_prime_runner_v2",
    ] {
        let err = refused(
            one("experiments", serde_json::json!(["beam_fn_api", e])),
            "experiments",
            "Weir is a Portable Runner",
        );
        assert!(err.reason.contains(e), "{err}");
    }
    refused(
        serde_json::json!({ "experiments": "a,disable_runner_v2" }),
        "experiments",
        "disable_runner_v2",
    );
    refused(
        serde_json::json!({ "beam:option:experiment:v1": ["disable_runner_v2=true"] }),
        "experiment",
        "Portable Runner",
    );
    let o = ok(one(
        "experiments",
        serde_json::json!([
            "enable_portable_runner",
            "use_runner_v2",
            "use_unified_worker",
            "beam_fn_api"
        ]),
    ));
    assert_eq!(o.experiments.len(), 4);
    assert!(o.notes.is_empty());
}

// ------------------------------------------------------------------ resources

#[test]
fn worker_counts() {
    for bad in [
        serde_json::json!(0),
        serde_json::json!("0"),
        serde_json::json!(-3),
        serde_json::json!("-1"),
    ] {
        if bad.as_i64().or_else(|| bad.as_str().and_then(|s| s.parse().ok())) == Some(0) {
            // 0 is Dataflow's "not set" (Java's int getters read it unset).
            let o = ok(serde_json::json!({ py("num_workers"): bad.clone(), py("max_num_workers"): bad }));
            assert_eq!((o.num_workers, o.max_num_workers), (None, None));
            continue;
        }
        for name in ["num_workers", "max_num_workers", "number_of_worker_harness_threads"] {
            refused(one(name, bad.clone()), name, "must be 0 or more");
        }
    }
    // 0 is Dataflow Java's default for numberOfWorkerHarnessThreads: Weir decides.
    for zero in [serde_json::json!(0), serde_json::json!("0")] {
        assert_eq!(
            ok(one("number_of_worker_harness_threads", zero)).number_of_worker_harness_threads,
            None
        );
    }
    refused(
        one("num_workers", serde_json::json!(1.5)),
        "num_workers",
        "expects an integer",
    );
    refused(
        one("num_workers", serde_json::json!("many")),
        "num_workers",
        "expects an integer",
    );
    refused(
        one("num_workers", serde_json::json!(true)),
        "num_workers",
        "expects an integer",
    );
    refused(
        serde_json::json!({ py("num_workers"): 5, py("max_num_workers"): 3 }),
        "max_num_workers",
        "less than --num_workers=5",
    );
    let o = ok(serde_json::json!({ py("num_workers"): "5", py("max_num_workers"): 5 }));
    assert_eq!((o.num_workers, o.max_num_workers), (Some(5), Some(5)));
    assert_eq!(
        ok(one(
            "number_of_worker_harness_threads",
            serde_json::json!(12)
        ))
        .number_of_worker_harness_threads,
        Some(12)
    );
    // 0 keeps its Dataflow meaning where it has one.
    assert_eq!(
        ok(one("max_cache_memory_usage_mb", serde_json::json!("0"))).max_cache_memory_usage_mb,
        Some(0)
    );
    assert_eq!(
        ok(one("disk_size_gb", serde_json::json!(0))).disk_size_gb,
        Some(0)
    );
    refused(
        one("max_cache_memory_usage_mb", serde_json::json!(-1)),
        "max_cache_memory_usage_mb",
        "0 or more",
    );
    refused(
        one("disk_size_gb", serde_json::json!("-10")),
        "disk_size_gb",
        "0 or more",
    );
    refused(
        one("disk_provisioned_iops", serde_json::json!(0)),
        "disk_provisioned_iops",
        "positive",
    );
}

#[test]
fn autoscaling_and_flexrs() {
    assert_eq!(
        ok(one("autoscaling_algorithm", serde_json::json!("NONE"))).autoscaling_algorithm,
        Some(AutoscalingAlgorithm::None)
    );
    assert_eq!(
        ok(serde_json::json!({ "autoscalingAlgorithm": "THROUGHPUT_BASED" })).autoscaling_algorithm,
        Some(AutoscalingAlgorithm::ThroughputBased)
    );
    refused(
        one("autoscaling_algorithm", serde_json::json!("BASIC")),
        "autoscaling_algorithm",
        "THROUGHPUT_BASED or NONE",
    );
    refused(
        one(
            "autoscaling_algorithm",
            serde_json::json!("throughput_based"),
        ),
        "autoscaling_algorithm",
        "THROUGHPUT_BASED or NONE",
    );
    for goal in [
        "COST_OPTIMIZED",
        "SPEED_OPTIMIZED",
        "FLEXRS_COST_OPTIMIZED",
        "FLEXRS_SPEED_OPTIMIZED",
        "FLEXRS_UNSPECIFIED",
        "UNSPECIFIED",
    ] {
        assert_eq!(
            ok(one("flexrs_goal", serde_json::json!(goal)))
                .flexrs_goal
                .as_deref(),
            Some(goal)
        );
    }
    refused(
        one("flexrs_goal", serde_json::json!("FAST")),
        "flexrs_goal",
        "COST_OPTIMIZED or SPEED_OPTIMIZED",
    );
}

// ------------------------------------------------------------------ element processing timeout

#[test]
fn element_processing_timeout() {
    assert_eq!(
        ok(one(
            "element_processing_timeout_minutes",
            serde_json::json!("1")
        ))
        .element_processing_timeout,
        Some(Duration::from_secs(60))
    );
    assert_eq!(
        ok(one(
            "element_processing_timeout_minutes",
            serde_json::json!(90)
        ))
        .element_processing_timeout,
        Some(Duration::from_secs(5400))
    );
    refused(
        one("element_processing_timeout_minutes", serde_json::json!("0")),
        "element_processing_timeout_minutes",
        "at least 1 minute",
    );
    refused(
        serde_json::json!({ "elementProcessingTimeoutMinutes": -2 }),
        "elementProcessingTimeoutMinutes",
        "at least 1 minute",
    );
    // Go: a duration.
    assert_eq!(
        ok(one("element_processing_timeout", serde_json::json!("1m"))).element_processing_timeout,
        Some(Duration::from_secs(60))
    );
    assert_eq!(
        ok(one(
            "element_processing_timeout",
            serde_json::json!("1h30m")
        ))
        .element_processing_timeout,
        Some(Duration::from_secs(5400))
    );
    refused(
        one("element_processing_timeout", serde_json::json!("59s")),
        "element_processing_timeout",
        "less than 1 minute",
    );
    refused(
        one("element_processing_timeout", serde_json::json!("3 minutes")),
        "element_processing_timeout",
        "not a duration",
    );
    refused(
        one("element_processing_timeout", serde_json::json!("5")),
        "element_processing_timeout",
        "not a duration",
    );
    // Both spellings must agree.
    ok(
        serde_json::json!({ py("element_processing_timeout_minutes"): 3, py("element_processing_timeout"): "3m" }),
    );
    refused(
        serde_json::json!({ py("element_processing_timeout_minutes"): 3, py("element_processing_timeout"): "4m" }),
        "element_processing_timeout",
        "disagrees with --element_processing_timeout_minutes=3",
    );
    // The test-only experiment goes below the minimum.
    let o = ok(serde_json::json!({
        py("experiments"): ["weir_test_element_processing_timeout_seconds=5"],
        py("element_processing_timeout_minutes"): 10,
    }));
    assert_eq!(o.element_processing_timeout, Some(Duration::from_secs(5)));
    assert!(
        has_note(
            &o,
            "--experiments=weir_test_element_processing_timeout_seconds=5: test-only"
        ),
        "{:?}",
        o.notes
    );
    assert!(
        !has_note(&o, "--element_processing_timeout_minutes"),
        "{:?}",
        o.notes
    );
    for bad in [
        "weir_test_element_processing_timeout_seconds",
        "weir_test_element_processing_timeout_seconds=0",
        "weir_test_element_processing_timeout_seconds=x",
    ] {
        refused(
            one("experiments", serde_json::json!([bad])),
            "experiments",
            "positive number of seconds",
        );
    }
}

// ------------------------------------------------------------------ other rules

#[test]
fn public_ips() {
    assert_eq!(
        ok(one("use_public_ips", serde_json::json!(true))).use_public_ips,
        Some(true)
    );
    assert_eq!(
        ok(one("no_use_public_ips", serde_json::json!(true))).use_public_ips,
        Some(false)
    );
    assert_eq!(
        ok(one("no_use_public_ips", serde_json::json!(false))).use_public_ips,
        None
    );
    refused(
        serde_json::json!({ py("use_public_ips"): true, py("no_use_public_ips"): "true" }),
        "no_use_public_ips",
        "--use_public_ips=true",
    );
    refused(
        one("use_public_ips", serde_json::json!("sometimes")),
        "use_public_ips",
        "true or false",
    );
}

#[test]
fn value_types_are_checked() {
    refused(
        one("job_name", serde_json::json!(["a"])),
        "job_name",
        "expects a string",
    );
    refused(
        one("streaming", serde_json::json!("maybe")),
        "streaming",
        "true or false",
    );
    refused(
        one("update", serde_json::json!(1)),
        "update",
        "true or false",
    );
    refused(
        one("experiments", serde_json::json!({"a": 1})),
        "experiments",
        "list of strings",
    );
    refused(
        one("transform_name_mapping", serde_json::json!("oldname")),
        "transform_name_mapping",
        "expects a JSON object",
    );
    refused(
        one("transform_name_mapping", serde_json::json!(["a=b"])),
        "transform_name_mapping",
        "expects an object",
    );
    let o = ok(one(
        "transform_name_mapping",
        serde_json::json!("{\"Old\": \"New\"}"),
    ));
    assert_eq!(o.transform_name_mapping, labels(&[("Old", "New")]));
}

#[test]
fn notes_only_for_options_that_are_set() {
    let o = ok(serde_json::json!({
        py("project"): "p",
        py("update"): false,
        py("enable_hot_key_logging"): false,
        py("enable_streaming_engine"): true,
        py("dataflow_endpoint"): "https://dataflow.googleapis.com",
        py("network"): "",
    }));
    assert_eq!(o.notes.len(), 1, "{:?}", o.notes);
    assert!(
        o.notes[0].starts_with("--project=p: has no local meaning"),
        "{:?}",
        o.notes
    );
    let o = ok(serde_json::json!({
        py("streaming"): true,
        py("enable_streaming_engine"): true,
        py("dataflow_endpoint"): "https://dataflow.example.test",
        py("template_location"): "gs://b/template",
        py("create_from_snapshot"): "snap-1",
        py("sdk_harness_container_image_overrides"): [".*java.*,my/java:1"],
    }));
    assert!(!has_note(&o, "--streaming"), "{:#?}", o.notes);
    for start in [
        "--enable_streaming_engine=true: ",
        "--dataflow_endpoint=https://dataflow.example.test: ",
        "--template_location=gs://b/template: is not supported",
        "--create_from_snapshot=snap-1: ",
        "--sdk_harness_container_image_overrides=.*java.*,my/java:1: is not applied",
    ] {
        assert!(has_note(&o, start), "no note {start:?} in {:#?}", o.notes);
    }
}

#[test]
fn job_names_dataflow_would_refuse_get_a_note() {
    assert!(ok(one("job_name", serde_json::json!("wordcount-2024")))
        .notes
        .is_empty());
    for name in ["WordCount", "my_job", "job-", "1job"] {
        let o = ok(one("job_name", serde_json::json!(name)));
        assert_eq!(o.job_name.as_deref(), Some(name));
        assert!(
            has_note(&o, &format!("--job_name={name}: Dataflow would reject")),
            "{:?}",
            o.notes
        );
    }
}

// ------------------------------------------------------------------ DescribePipelineOptions

#[test]
fn descriptors_cover_the_catalog() {
    use beam::pipeline_option_type::Enum as T;
    let d = options::descriptors();
    assert_eq!(d.len(), CATALOG.len());
    let mut names: Vec<&str> = d.iter().map(|d| d.name.as_str()).collect();
    names.sort_unstable();
    names.dedup();
    assert_eq!(names.len(), d.len(), "duplicate names");
    let groups = [
        "basic",
        "resource_utilization",
        "debugging",
        "security_and_networking",
        "streaming_pipeline_management",
        "worker_level",
    ];
    for g in groups {
        assert!(d.iter().any(|d| d.group == g), "no option in group {g}");
    }
    let find = |n: &str| {
        d.iter()
            .find(|d| d.name == n)
            .unwrap_or_else(|| panic!("{n} not described"))
    };
    for (name, ty) in [
        ("job_name", T::String),
        ("labels", T::Object),
        ("experiments", T::Array),
        ("num_workers", T::Integer),
        ("streaming", T::Boolean),
        ("profile_sample_rate", T::Number),
        ("element_processing_timeout_minutes", T::Integer),
        ("element_processing_timeout", T::String),
        ("temp_location", T::String),
        ("worker_machine_type", T::String),
        ("transform_name_mapping", T::Object),
    ] {
        assert_eq!(find(name).r#type, ty as i32, "{name}");
    }
    for desc in &d {
        assert!(
            groups.contains(&desc.group.as_str()),
            "{}: {}",
            desc.name,
            desc.group
        );
        assert!(desc.description.contains("Weir:"), "{}", desc.description);
    }
    assert!(find("num_workers").description.contains("Java: numWorkers"));
    assert!(find("experiments")
        .description
        .contains("no_use_multiple_sdk_containers"));
}

#[test]
fn the_documentation_lists_every_option() {
    let doc = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../docs/pipeline-options.md"
    ))
    .expect("docs/pipeline-options.md");
    for spec in CATALOG {
        for spelling in [spec.python, spec.java, spec.go]
            .into_iter()
            .chain(spec.aliases.iter().copied())
            .filter(|s| !s.is_empty())
        {
            assert!(
                doc.contains(&format!("`{spelling}`")),
                "docs/pipeline-options.md does not mention {spelling} ({})",
                spec.name
            );
        }
    }
}

// ------------------------------------------------------------------ the job service

fn config() -> ServerConfig {
    ServerConfig {
        python_for_docker_images: None,
        staging_root: std::env::temp_dir()
            .join(format!("weir-options-test-{}", std::process::id())),
        engine_workers: 1,
        limits: Default::default(),
        capture_prepare_dir: None,
        security: Default::default(),
        gbk_memory_budget: None,
        user_state_memory_budget: None,
        side_input_memory_budget: None,
        spill_root: std::env::temp_dir().join("weir-spill"),
        min_resume_delay: weir_engine::DEFAULT_MIN_RESUME_DELAY,
    }
}

fn service() -> (JobService, std::sync::Arc<JobRegistry>) {
    let url = "127.0.0.1:1".to_string();
    let registry = JobRegistry::new(weir_harness::FnApi::new(url.clone()), config(), url);
    (JobService(registry.clone()), registry)
}

/// Prepares the wordcount pipeline with no options; returns its job id.
async fn prepare_wordcount(svc: &JobService) -> String {
    svc.prepare(tonic::Request::new(beam::PrepareJobRequest {
        pipeline: Some(wordcount()),
        pipeline_options: Some(Struct::default()),
        job_name: "job".into(),
    }))
    .await
    .expect("prepared")
    .into_inner()
    .preparation_id
}

/// A state stream follows its job only while the registry keeps it: a
/// prepared job forgotten unrun ends the stream instead of leaving it (and
/// the job) waiting forever.
#[tokio::test]
async fn the_state_stream_of_a_job_forgotten_unrun_ends() {
    use tokio_stream::StreamExt;
    let url = "127.0.0.1:1".to_string();
    let mut forgetful = config();
    forgetful.limits.prepared_job_ttl = Duration::ZERO;
    let registry = JobRegistry::new(weir_harness::FnApi::new(url.clone()), forgetful, url);
    let svc = JobService(registry.clone());
    let id = prepare_wordcount(&svc).await;
    let mut states = svc
        .get_state_stream(tonic::Request::new(beam::GetJobStateRequest {
            job_id: id.clone(),
        }))
        .await
        .expect("stream")
        .into_inner();
    let first = states.next().await.expect("a state").expect("ok");
    assert_eq!(first.state, beam::job_state::Enum::Stopped as i32);
    assert_eq!(registry.expire_prepared(), vec![id]);
    let end = tokio::time::timeout(Duration::from_secs(10), states.next())
        .await
        .expect("the stream ends once the job is forgotten");
    assert!(end.is_none(), "{end:?}");
}

/// After the terminal state it saw happen, the state stream stays open
/// (weir_jobs::service::STATE_STREAM_LINGER) so that Beam's Python client,
/// which stops reading there and exits, does not meet the stream's end
/// while its interpreter shuts down; the message stream, which that client
/// reads to its end, ends at once.
#[tokio::test(start_paused = true)]
async fn the_state_stream_lingers_after_the_terminal_state_and_the_message_stream_does_not() {
    use tokio_stream::StreamExt;
    let (svc, registry) = service();
    let id = prepare_wordcount(&svc).await;
    let mut states = svc
        .get_state_stream(tonic::Request::new(beam::GetJobStateRequest { job_id: id.clone() }))
        .await
        .expect("stream")
        .into_inner();
    let mut messages = svc
        .get_message_stream(tonic::Request::new(beam::JobMessagesRequest { job_id: id.clone() }))
        .await
        .expect("stream")
        .into_inner();
    let first = states.next().await.expect("a state").expect("ok");
    assert_eq!(first.state, beam::job_state::Enum::Stopped as i32);
    registry.get(&id).expect("the job").set_state(beam::job_state::Enum::Done);
    let done = states.next().await.expect("a state").expect("ok");
    assert_eq!(done.state, beam::job_state::Enum::Done as i32);
    let linger = weir_jobs::service::STATE_STREAM_LINGER;
    let early = tokio::time::timeout(linger - Duration::from_millis(100), states.next()).await;
    assert!(early.is_err(), "the state stream ended right after DONE: {early:?}");
    let end = tokio::time::timeout(Duration::from_millis(200), states.next())
        .await
        .expect("the state stream ends after its linger");
    assert!(end.is_none(), "{end:?}");
    // The message stream had DONE and ended with it.
    let mut last = None;
    while let Some(m) = messages.next().await {
        last = Some(m.expect("ok"));
    }
    let last = last.expect("messages");
    assert!(
        matches!(&last.response, Some(beam::job_messages_response::Response::StateResponse(s)) if s.state == beam::job_state::Enum::Done as i32),
        "{last:?}"
    );
}

/// A state stream read after its job ended (its terminal state is history)
/// ends at once.
#[tokio::test]
async fn the_state_stream_of_a_finished_job_ends_at_once() {
    use tokio_stream::StreamExt;
    let (svc, registry) = service();
    let id = prepare_wordcount(&svc).await;
    registry.get(&id).expect("the job").set_state(beam::job_state::Enum::Done);
    let states = svc
        .get_state_stream(tonic::Request::new(beam::GetJobStateRequest { job_id: id.clone() }))
        .await
        .expect("stream")
        .into_inner();
    let all: Vec<_> = tokio::time::timeout(Duration::from_secs(2), states.collect::<Vec<_>>())
        .await
        .expect("the stream ends at once");
    let last = all.last().expect("states").as_ref().expect("ok");
    assert_eq!(last.state, beam::job_state::Enum::Done as i32);
}

/// Prepare names as the staging endpoint the host:port the client dialed
/// (its gRPC library then stages over the connection it has), not the
/// server's own address.
#[tokio::test]
async fn prepare_stages_where_the_client_dialed() {
    use beam::job_service_client::JobServiceClient;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(weir_jobs::serve(listener, config()));
    for host in ["localhost", "127.0.0.1"] {
        let dialed = format!("{host}:{port}");
        let mut client = JobServiceClient::connect(format!("http://{dialed}"))
            .await
            .expect("connect");
        let prepared = client
            .prepare(beam::PrepareJobRequest {
                pipeline: Some(wordcount()),
                pipeline_options: Some(Struct::default()),
                job_name: "job".into(),
            })
            .await
            .expect("prepared")
            .into_inner();
        assert_eq!(
            prepared.artifact_staging_endpoint.expect("endpoint").url,
            dialed
        );
    }
}

fn wordcount() -> beam::Pipeline {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../plan/tests/fixtures/wordcount.pb"
    );
    beam::Pipeline::decode(std::fs::read(path).expect("wordcount fixture").as_slice())
        .expect("pipeline")
}

fn messages(registry: &JobRegistry, id: &str) -> Vec<String> {
    let (history, _) = registry
        .get(id)
        .expect("job")
        .subscribe(weir_jobs::registry::View::Logs);
    history
        .into_iter()
        .filter_map(|e| match e.response {
            Some(beam::job_messages_response::Response::MessageResponse(m)) => Some(m.message_text),
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn prepare_refuses_invalid_options_with_invalid_argument() {
    let (svc, _) = service();
    for (json, option) in [
        (one("labels", serde_json::json!(["Bad=x"])), "--labels"),
        (
            serde_json::json!({ "beam:option:numWorkers:v1": -1 }),
            "--numWorkers",
        ),
        (
            one("experiments", serde_json::json!(["disable_runner_v2"])),
            "Portable Runner",
        ),
        (
            serde_json::json!({ py("zone"): "a", py("worker_zone"): "b" }),
            "--zone",
        ),
    ] {
        let req = beam::PrepareJobRequest {
            pipeline: Some(wordcount()),
            pipeline_options: Some(opts(json)),
            job_name: "job".into(),
        };
        let status = svc
            .prepare(tonic::Request::new(req))
            .await
            .expect_err("refused");
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
        assert!(status.message().contains(option), "{status:?}");
    }
}

#[tokio::test]
async fn prepare_records_options_and_reports_notes() {
    let (svc, registry) = service();
    let mut options = opts(serde_json::from_str(PYTHON_DATAFLOW_OPTIONS).unwrap());
    // Prepare opens the temp location; gs:// would need Google Cloud
    // credentials (see locations.rs), a local folder does not.
    let temp = std::env::temp_dir().join(format!("weir-options-temp-{}", std::process::id()));
    options.fields.insert(
        "beam:option:temp_location:v1".into(),
        Value {
            kind: Some(Kind::StringValue(temp.display().to_string())),
        },
    );
    // A client's staging location must be under the server's staging root.
    let staging = std::env::temp_dir()
        .join(format!("weir-options-test-{}", std::process::id()))
        .join("client-staging");
    options.fields.insert(
        "beam:option:staging_location:v1".into(),
        Value {
            kind: Some(Kind::StringValue(staging.display().to_string())),
        },
    );
    let req = beam::PrepareJobRequest {
        pipeline: Some(wordcount()),
        pipeline_options: Some(options.clone()),
        job_name: "job".into(),
    };
    let id = svc
        .prepare(tonic::Request::new(req))
        .await
        .expect("prepared")
        .into_inner()
        .preparation_id;
    let job = registry.get(&id).expect("job");
    assert_eq!(
        job.name, "my-job",
        "--job_name replaces Python's placeholder"
    );
    assert_eq!(
        job.validated.labels,
        labels(&[("a", "b"), ("c", "d"), ("e", "")])
    );
    assert_eq!(
        job.validated.element_processing_timeout,
        Some(Duration::from_secs(180))
    );
    assert_eq!(job.options, options, "options are kept as sent");
    let texts = messages(&registry, &id);
    let mut notes = options::validate(&options).unwrap().notes;
    // The image no environment of the pipeline (it has no DOCKER one) uses.
    notes.push("--sdk_container_image=img: has no effect on this job: none of its environments is DOCKER".into());
    assert_eq!(texts, notes);
    assert!(
        texts.iter().any(|t| t.starts_with("--project=proj: ")),
        "{texts:#?}"
    );

    // A name in the request wins over --job_name.
    let req = beam::PrepareJobRequest {
        pipeline: Some(wordcount()),
        pipeline_options: Some(options),
        job_name: "explicit".into(),
    };
    let id = svc
        .prepare(tonic::Request::new(req))
        .await
        .expect("prepared")
        .into_inner()
        .preparation_id;
    assert_eq!(registry.get(&id).unwrap().name, "explicit");

    // Python's defaults: no notes at all.
    let defaults = opts(serde_json::from_str(PYTHON_DEFAULT_OPTIONS).unwrap());
    let req = beam::PrepareJobRequest {
        pipeline: Some(wordcount()),
        pipeline_options: Some(defaults),
        job_name: String::new(),
    };
    let id = svc
        .prepare(tonic::Request::new(req))
        .await
        .expect("prepared")
        .into_inner()
        .preparation_id;
    assert!(messages(&registry, &id).is_empty());
    assert_eq!(registry.get(&id).unwrap().name, id);

    // A job name is at most 1024 bytes, from the request or --job_name.
    let long = "n".repeat(options::MAX_JOB_NAME_BYTES + 1);
    for (job_name, option) in [(long.clone(), None), ("job".to_string(), Some(long))] {
        let mut options = opts(serde_json::from_str(PYTHON_DEFAULT_OPTIONS).unwrap());
        if let Some(name) = option {
            options.fields.insert("beam:option:job_name:v1".into(), Value { kind: Some(Kind::StringValue(name)) });
        }
        let req = beam::PrepareJobRequest { pipeline: Some(wordcount()), pipeline_options: Some(options), job_name };
        let refused = svc.prepare(tonic::Request::new(req)).await.expect_err("refused");
        assert_eq!(refused.code(), tonic::Code::InvalidArgument);
        assert!(refused.message().ends_with("is 1025 bytes long; a job name has at most 1024 (Dataflow's limit on job names)"), "{}", refused.message());
    }
    let exact = "n".repeat(options::MAX_JOB_NAME_BYTES);
    let req = beam::PrepareJobRequest {
        pipeline: Some(wordcount()),
        pipeline_options: Some(opts(serde_json::from_str(PYTHON_DEFAULT_OPTIONS).unwrap())),
        job_name: exact.clone(),
    };
    let id = svc.prepare(tonic::Request::new(req)).await.expect("prepared").into_inner().preparation_id;
    assert_eq!(registry.get(&id).unwrap().name, exact);
}

#[tokio::test]
async fn describe_pipeline_options_serves_what_python_does_not_define() {
    let (svc, _) = service();
    let d = svc
        .describe_pipeline_options(tonic::Request::new(beam::DescribePipelineOptionsRequest {}))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(d.options, options::runner_descriptors());
    let names: Vec<&str> = d.options.iter().map(|o| o.name.as_str()).collect();
    for name in ["element_processing_timeout", "gcp_temp_location", "worker_binary"] {
        assert!(names.contains(&name), "{name} not described: {names:?}");
    }
    for name in ["num_workers", "experiments", "job_name"] {
        assert!(!names.contains(&name), "Python defines {name}");
    }
    let python_has = CATALOG.iter().filter(|s| !s.python.is_empty()).count();
    assert_eq!(d.options.len() + python_has, CATALOG.len());
}

// ------------------------------------------------------------------ captured options

/// Every option the Python SDK (2.77, PortableRunner, LOOPBACK) sent at
/// Prepare for a pipeline run without options of its own.
const PYTHON_DEFAULT_OPTIONS: &str = r#"{
 "beam:option:allow_non_deterministic_key_coders:v1": false,
 "beam:option:allow_unsafe_triggers:v1": false,
 "beam:option:artifact_port:v1": "0",
 "beam:option:auto_unique_labels:v1": false,
 "beam:option:beam_services:v1": {},
 "beam:option:bootstrap_servers:v1": "localhost:9092",
 "beam:option:dataflow_endpoint:v1": "https://dataflow.googleapis.com",
 "beam:option:direct_embed_docker_python:v1": false,
 "beam:option:direct_num_workers:v1": "1",
 "beam:option:direct_runner_bundle_repeat:v1": "0",
 "beam:option:direct_runner_use_stacked_bundle:v1": true,
 "beam:option:direct_running_mode:v1": "in_memory",
 "beam:option:direct_test_splits:v1": {},
 "beam:option:disable_beartype:v1": false,
 "beam:option:dry_run:v1": false,
 "beam:option:enable_artifact_caching:v1": false,
 "beam:option:enable_bucket_read_metric_counter:v1": false,
 "beam:option:enable_bucket_write_metric_counter:v1": false,
 "beam:option:enable_gcsio_blob_generation:v1": false,
 "beam:option:enable_hot_key_logging:v1": false,
 "beam:option:enable_streaming_engine:v1": true,
 "beam:option:environment_cache_millis:v1": "0",
 "beam:option:environment_type:v1": "LOOPBACK",
 "beam:option:exclude_infer_dataclass_field_type:v1": false,
 "beam:option:expansion_port:v1": "0",
 "beam:option:experiments:v1": [
  "beam_fn_api"
 ],
 "beam:option:flink_master:v1": "[auto]",
 "beam:option:flink_submit_uber_jar:v1": false,
 "beam:option:flink_version:v1": "2.2",
 "beam:option:force_cloudpickle_deterministic_coders:v1": false,
 "beam:option:gcp_oauth_scopes:v1": [
  "https://www.googleapis.com/auth/bigquery",
  "https://www.googleapis.com/auth/cloud-platform",
  "https://www.googleapis.com/auth/devstorage.full_control",
  "https://www.googleapis.com/auth/userinfo.email",
  "https://www.googleapis.com/auth/datastore",
  "https://www.googleapis.com/auth/spanner.admin",
  "https://www.googleapis.com/auth/spanner.data"
 ],
 "beam:option:hdfs_full_urls:v1": false,
 "beam:option:job_endpoint:v1": "localhost:18099",
 "beam:option:job_port:v1": "0",
 "beam:option:job_server_java_launcher:v1": "java",
 "beam:option:job_server_jvm_properties:v1": [],
 "beam:option:job_server_timeout:v1": "300",
 "beam:option:max_cache_memory_usage_mb:v1": "0",
 "beam:option:max_parallelism:v1": "-1",
 "beam:option:no_auth:v1": false,
 "beam:option:no_gcsio_throttling_counter:v1": false,
 "beam:option:no_wait_until_finish:v1": false,
 "beam:option:parallelism:v1": "-1",
 "beam:option:performance_runtime_type_check:v1": false,
 "beam:option:pickle_library:v1": "default",
 "beam:option:pipeline_type_check:v1": true,
 "beam:option:prism_log_kind:v1": "console",
 "beam:option:prism_log_level:v1": "info",
 "beam:option:profile_cpu:v1": false,
 "beam:option:profile_memory:v1": false,
 "beam:option:profile_postprocess_interval_sec:v1": "600",
 "beam:option:profile_sample_rate:v1": 1.0,
 "beam:option:profile_upload_interval_sec:v1": "300",
 "beam:option:profiler_stop_after_crash:v1": false,
 "beam:option:profiler_stop_after_sec:v1": "0",
 "beam:option:requirements_cache_only_sources:v1": false,
 "beam:option:resource_hints:v1": [],
 "beam:option:runtime_type_check:v1": false,
 "beam:option:s3_disable_ssl:v1": false,
 "beam:option:save_main_session:v1": true,
 "beam:option:sdk_location:v1": "container",
 "beam:option:sdk_worker_parallelism:v1": "1",
 "beam:option:spark_master_url:v1": "local[4]",
 "beam:option:spark_submit_uber_jar:v1": false,
 "beam:option:spark_version:v1": "3",
 "beam:option:streaming:v1": false,
 "beam:option:type_check_additional:v1": "",
 "beam:option:type_check_strictness:v1": "DEFAULT_TO_ANY",
 "beam:option:update:v1": false,
 "beam:option:use_transform_service:v1": false
}"#;

/// What the Python SDK sent for the same pipeline run with Dataflow flags:
/// --job_name=my-job --project=proj --region=us-central1 --worker_region=us-east1
/// --labels a=b --labels '{"c": "d"}' --labels e --temp_location=gs://bkt/t
/// --staging_location=/tmp/s --num_workers=2 --max_num_workers=5
/// --autoscaling_algorithm=THROUGHPUT_BASED --number_of_worker_harness_threads=4
/// --machine_type=n1-standard-2 --disk_size_gb=50 --no_use_public_ips
/// --flexrs_goal=COST_OPTIMIZED --dataflow_service_options=enable_prime,min_num_workers=2
/// --experiments=use_runner_v2,no_use_multiple_sdk_containers
/// --transform_name_mapping='{"a":"b"}' --update --element_processing_timeout_minutes=3
/// --service_account_email=x@y.iam.gserviceaccount.com --dataflow_kms_key=k --streaming
/// --sdk_container_image=img
const PYTHON_DATAFLOW_OPTIONS: &str = r#"{
 "beam:option:allow_non_deterministic_key_coders:v1": false,
 "beam:option:allow_unsafe_triggers:v1": false,
 "beam:option:artifact_port:v1": "0",
 "beam:option:auto_unique_labels:v1": false,
 "beam:option:autoscaling_algorithm:v1": "THROUGHPUT_BASED",
 "beam:option:beam_services:v1": {},
 "beam:option:bootstrap_servers:v1": "localhost:9092",
 "beam:option:dataflow_endpoint:v1": "https://dataflow.googleapis.com",
 "beam:option:dataflow_kms_key:v1": "k",
 "beam:option:dataflow_service_options:v1": [
  "enable_prime",
  "min_num_workers=2"
 ],
 "beam:option:direct_embed_docker_python:v1": false,
 "beam:option:direct_num_workers:v1": "1",
 "beam:option:direct_runner_bundle_repeat:v1": "0",
 "beam:option:direct_runner_use_stacked_bundle:v1": true,
 "beam:option:direct_running_mode:v1": "in_memory",
 "beam:option:direct_test_splits:v1": {},
 "beam:option:disable_beartype:v1": false,
 "beam:option:disk_size_gb:v1": "50",
 "beam:option:dry_run:v1": false,
 "beam:option:element_processing_timeout_minutes:v1": "3",
 "beam:option:enable_artifact_caching:v1": false,
 "beam:option:enable_bucket_read_metric_counter:v1": false,
 "beam:option:enable_bucket_write_metric_counter:v1": false,
 "beam:option:enable_gcsio_blob_generation:v1": false,
 "beam:option:enable_hot_key_logging:v1": false,
 "beam:option:enable_streaming_engine:v1": true,
 "beam:option:environment_cache_millis:v1": "0",
 "beam:option:environment_type:v1": "LOOPBACK",
 "beam:option:exclude_infer_dataclass_field_type:v1": false,
 "beam:option:expansion_port:v1": "0",
 "beam:option:experiments:v1": [
  "use_runner_v2",
  "no_use_multiple_sdk_containers",
  "beam_fn_api"
 ],
 "beam:option:flexrs_goal:v1": "COST_OPTIMIZED",
 "beam:option:flink_master:v1": "[auto]",
 "beam:option:flink_submit_uber_jar:v1": false,
 "beam:option:flink_version:v1": "2.2",
 "beam:option:force_cloudpickle_deterministic_coders:v1": false,
 "beam:option:gcp_oauth_scopes:v1": [
  "https://www.googleapis.com/auth/bigquery",
  "https://www.googleapis.com/auth/cloud-platform",
  "https://www.googleapis.com/auth/devstorage.full_control",
  "https://www.googleapis.com/auth/userinfo.email",
  "https://www.googleapis.com/auth/datastore",
  "https://www.googleapis.com/auth/spanner.admin",
  "https://www.googleapis.com/auth/spanner.data"
 ],
 "beam:option:hdfs_full_urls:v1": false,
 "beam:option:job_endpoint:v1": "localhost:18177",
 "beam:option:job_name:v1": "my-job",
 "beam:option:job_port:v1": "0",
 "beam:option:job_server_java_launcher:v1": "java",
 "beam:option:job_server_jvm_properties:v1": [],
 "beam:option:job_server_timeout:v1": "300",
 "beam:option:labels:v1": [
  "a=b",
  "{\"c\": \"d\"}",
  "e"
 ],
 "beam:option:machine_type:v1": "n1-standard-2",
 "beam:option:max_cache_memory_usage_mb:v1": "0",
 "beam:option:max_num_workers:v1": "5",
 "beam:option:max_parallelism:v1": "-1",
 "beam:option:no_auth:v1": false,
 "beam:option:no_gcsio_throttling_counter:v1": false,
 "beam:option:no_wait_until_finish:v1": false,
 "beam:option:num_workers:v1": "2",
 "beam:option:number_of_worker_harness_threads:v1": "4",
 "beam:option:parallelism:v1": "-1",
 "beam:option:performance_runtime_type_check:v1": false,
 "beam:option:pickle_library:v1": "default",
 "beam:option:pipeline_type_check:v1": true,
 "beam:option:prism_log_kind:v1": "console",
 "beam:option:prism_log_level:v1": "info",
 "beam:option:profile_cpu:v1": false,
 "beam:option:profile_memory:v1": false,
 "beam:option:profile_postprocess_interval_sec:v1": "600",
 "beam:option:profile_sample_rate:v1": 1.0,
 "beam:option:profile_upload_interval_sec:v1": "300",
 "beam:option:profiler_stop_after_crash:v1": false,
 "beam:option:profiler_stop_after_sec:v1": "0",
 "beam:option:project:v1": "proj",
 "beam:option:region:v1": "us-central1",
 "beam:option:requirements_cache_only_sources:v1": false,
 "beam:option:resource_hints:v1": [],
 "beam:option:runtime_type_check:v1": false,
 "beam:option:s3_disable_ssl:v1": false,
 "beam:option:save_main_session:v1": false,
 "beam:option:sdk_container_image:v1": "img",
 "beam:option:sdk_location:v1": "container",
 "beam:option:sdk_worker_parallelism:v1": "1",
 "beam:option:service_account_email:v1": "x@y.iam.gserviceaccount.com",
 "beam:option:spark_master_url:v1": "local[4]",
 "beam:option:spark_submit_uber_jar:v1": false,
 "beam:option:spark_version:v1": "3",
 "beam:option:staging_location:v1": "/tmp/s",
 "beam:option:streaming:v1": true,
 "beam:option:temp_location:v1": "gs://bkt/t",
 "beam:option:transform_name_mapping:v1": {
  "a": "b"
 },
 "beam:option:type_check_additional:v1": "",
 "beam:option:type_check_strictness:v1": "DEFAULT_TO_ANY",
 "beam:option:update:v1": true,
 "beam:option:use_public_ips:v1": false,
 "beam:option:use_transform_service:v1": false,
 "beam:option:worker_harness_container_image:v1": "img",
 "beam:option:worker_region:v1": "us-east1"
}"#;

#[test]
fn worker_options_size_the_sdk_harnesses() {
    use weir_harness::environment::Scaling;
    let plan = |json: serde_json::Value| {
        let s = opts(json);
        options::sdk_harness_plan(&options::validate(&s).expect("valid"), &s)
    };
    let one_each = || py("experiments");
    // Default: one worker of one SDK harness (with no_use_multiple_sdk_containers); the SDK decides its bundles at a time.
    let p = plan(serde_json::json!({ one_each(): ["no_use_multiple_sdk_containers"] }));
    assert_eq!(
        (p.sizing.per_core_sdk, p.scaling, p.sizing.harness_threads),
        (1, Scaling::Fixed(1), None)
    );
    // num_workers sets the workers; NONE keeps the count fixed.
    let p = plan(serde_json::json!({
        one_each(): ["no_use_multiple_sdk_containers"], py("num_workers"): 3,
        py("max_num_workers"): 5, py("autoscaling_algorithm"): "NONE",
        py("number_of_worker_harness_threads"): 4,
    }));
    assert_eq!((p.scaling, p.sizing.harness_threads), (Scaling::Fixed(3), Some(4)));
    // THROUGHPUT_BASED: between num_workers and max_num_workers.
    let p = plan(serde_json::json!({
        one_each(): ["no_use_multiple_sdk_containers"], py("num_workers"): 2,
        py("max_num_workers"): 5, py("autoscaling_algorithm"): "THROUGHPUT_BASED",
    }));
    assert_eq!(p.scaling, Scaling::ThroughputBased { min: 2, max: 5 });
    assert_eq!(p.scaling.initial(), 2);
    // Without max_num_workers there is no room to grow.
    let p = plan(serde_json::json!({
        one_each(): ["no_use_multiple_sdk_containers"], py("autoscaling_algorithm"): "THROUGHPUT_BASED",
    }));
    assert_eq!(p.scaling, Scaling::ThroughputBased { min: 1, max: 1 });
    // Per worker: one SDK harness per core (of an SDK that runs bundles on one core).
    let cores = weir_engine::machine_cores();
    let p = plan(serde_json::json!({ py("num_workers"): 2 }));
    assert_eq!((p.sizing.per_core_sdk, p.scaling), (cores, Scaling::Fixed(2)));
}

#[test]
fn only_a_python_clients_loopback_is_the_clients_in_process_pool() {
    // A Python client's options, as captured: environment_type stays LOOPBACK.
    let python = opts(serde_json::from_str(PYTHON_DEFAULT_OPTIONS).unwrap());
    assert!(options::in_process_pool(&python));
    let plan = options::sdk_harness_plan(&options::validate(&python).expect("valid"), &python);
    assert!(plan.sizing.in_process_pool);
    // Its pool starts processes with use_loopback_process_worker.
    let processes = opts(serde_json::json!({
        py("environment_type"): "LOOPBACK",
        py("experiments"): ["beam_fn_api", "use_loopback_process_worker"],
    }));
    assert!(!options::in_process_pool(&processes));
    assert!(!options::in_process_pool(&opts(serde_json::json!({ py("environment_type"): "PROCESS" }))));
    // Go's flag of that name is not Python's in-process pool.
    let go = opts(serde_json::json!({
        "beam:option:go_options:v1": {"options": {"environment_type": "LOOPBACK"}},
    }));
    assert_eq!(options::string(&go, "environment_type").as_deref(), Some("LOOPBACK"));
    assert!(!options::in_process_pool(&go));
}

#[test]
fn max_num_workers_without_autoscaling_gets_a_note() {
    let o = ok(one("max_num_workers", serde_json::json!(4)));
    assert!(
        has_note(&o, "--max_num_workers=4: has no effect without --autoscaling_algorithm=THROUGHPUT_BASED"),
        "{:?}",
        o.notes
    );
    let o = ok(serde_json::json!({
        py("max_num_workers"): 4,
        py("autoscaling_algorithm"): "THROUGHPUT_BASED",
    }));
    assert!(!has_note(&o, "--max_num_workers"), "{:?}", o.notes);
}

/// The options each SDK's client really sends (the fuzz seeds: word counts
/// of Python, Java and Go) give no note of a spelling left out: Go sends
/// `runner` twice (empty at the top, `universal` among its flags), which
/// must not read as a conflict.
#[test]
fn real_clients_options_give_no_spelling_notes() {
    for sdk in ["python", "java", "go"] {
        let path = format!("{}/../../tests/fuzz/seeds/{sdk}_wordcount.pb", env!("CARGO_MANIFEST_DIR"));
        let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
        let request = beam::PrepareJobRequest::decode(bytes.as_slice()).expect("a PrepareJobRequest");
        let o = options::validate(&request.pipeline_options.unwrap_or_default()).expect("valid");
        assert!(
            !o.notes.iter().any(|n| n.contains("also given as")),
            "{sdk}: {:?}",
            o.notes
        );
    }
}
