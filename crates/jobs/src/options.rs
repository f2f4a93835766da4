//! Pipeline options as the SDKs send them at Prepare: a `Struct` keyed
//! `beam:option:<name>:v1` (Python; Java, which snake_cases its camelCase
//! names), by plain name, or — Go — as flag strings inside
//! `beam:option:go_options:v1` (`{"options": {flag: value}}`).
//!
//! [`validate`] checks the Google Cloud Dataflow options ([`CATALOG`], in any
//! SDK's spelling) and gives their typed view [`JobOptions`]; every other
//! option is accepted as sent. All options reach SDK harnesses unchanged.

mod catalog;
mod values;

use std::collections::{BTreeMap, HashMap};
use std::sync::OnceLock;
use std::time::Duration;

pub use catalog::{Group, Handling, OptionSpec, OptionType, CATALOG};
pub use values::{go_duration, LOCATION_SCHEMES, MAX_LABELS};
use weir_proto::beam;
use weir_proto::prost_types::{value::Kind, Struct, Value};

/// The value of option `name` (snake_case), in either spelling.
pub fn get<'a>(options: &'a Struct, name: &str) -> Option<&'a Value> {
    options
        .fields
        .get(&format!("beam:option:{name}:v1"))
        .or_else(|| options.fields.get(name))
        .or_else(|| go_options(options).and_then(|go| go.fields.get(name)))
}

/// A string option.
pub fn string(options: &Struct, name: &str) -> Option<String> {
    match &get(options, name)?.kind {
        Some(Kind::StringValue(s)) => Some(s.clone()),
        Some(Kind::NumberValue(n)) => Some(n.to_string()),
        _ => None,
    }
}

/// A boolean option (false when absent or not a boolean).
pub fn flag(options: &Struct, name: &str) -> bool {
    matches!(
        get(options, name).and_then(|v| v.kind.as_ref()),
        Some(Kind::BoolValue(true))
    )
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
    strings(options, "experiments")
        .iter()
        .any(|e| e == name || e.starts_with(&format!("{name}=")))
}

/// The value of experiment `name=value` in `experiments`, if present.
pub fn experiment_value(options: &Struct, name: &str) -> Option<String> {
    strings(options, "experiments")
        .iter()
        .find_map(|e| e.strip_prefix(&format!("{name}=")).map(str::to_string))
}

/// How many SDK harnesses one worker (Dataflow's worker VM) runs of an
/// environment whose SDK runs bundles on one core (Python): one per core
/// (Dataflow's rule), or one with
/// `--experiments=no_use_multiple_sdk_containers`. A multi-core SDK's
/// environment gets one ([`weir_harness::environment::harnesses_per_worker`]).
pub fn sdk_workers_per_environment(options: &Struct) -> usize {
    if has_experiment(options, "no_use_multiple_sdk_containers") {
        return 1;
    }
    weir_engine::machine_cores()
}

/// How a job's SDK harnesses are sized, from Dataflow's worker options.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SdkHarnessPlan {
    /// Workers: fixed at `num_workers` (default 1), or with
    /// `autoscaling_algorithm=THROUGHPUT_BASED` between that and
    /// `max_num_workers` (default `num_workers`).
    pub scaling: weir_harness::environment::Scaling,
    /// The harnesses of each environment on one worker: per core or one
    /// ([`sdk_workers_per_environment`]), the bundles each runs at a time
    /// (`number_of_worker_harness_threads` when set, else the SDK's
    /// [`weir_harness::environment::bundles_per_harness`]), and whether the
    /// EXTERNAL environments are the client's in-process pool
    /// ([`in_process_pool`]).
    pub sizing: weir_harness::environment::HarnessSizing,
}

/// Whether the job's EXTERNAL environments are a worker pool inside its
/// client that runs SDK harnesses as threads of one interpreter: a Python
/// client's `--environment_type=LOOPBACK` (sent as
/// `beam:option:environment_type:v1` with its original value, while the
/// environment itself becomes EXTERNAL), unless the experiment
/// `use_loopback_process_worker` makes that pool start processes. Go's
/// flag of that name (inside `go_options`) does not count: a Go harness is
/// one per worker anyway, and a Python environment of a Go job comes from
/// an expansion service, whose worker pool starts processes.
pub fn in_process_pool(options: &Struct) -> bool {
    matches!(
        options.fields.get("beam:option:environment_type:v1").and_then(|v| v.kind.as_ref()),
        Some(Kind::StringValue(t)) if t.eq_ignore_ascii_case("LOOPBACK")
    ) && !has_experiment(options, "use_loopback_process_worker")
}

/// The [`SdkHarnessPlan`] of a job with checked options `validated`
/// (sent as `options`).
pub fn sdk_harness_plan(validated: &JobOptions, options: &Struct) -> SdkHarnessPlan {
    use weir_harness::environment::Scaling;
    let per_worker = sdk_workers_per_environment(options);
    let workers = validated.num_workers.unwrap_or(1).max(1) as usize;
    let scaling = match validated.autoscaling_algorithm {
        Some(AutoscalingAlgorithm::ThroughputBased) => Scaling::ThroughputBased {
            min: workers,
            max: (validated.max_num_workers.map_or(workers, |m| m as usize)).max(workers),
        },
        _ => Scaling::Fixed(workers),
    };
    SdkHarnessPlan {
        scaling,
        sizing: weir_harness::environment::HarnessSizing {
            per_core_sdk: per_worker,
            harness_threads: validated
                .number_of_worker_harness_threads
                .map(|n| n.max(1) as usize),
            in_process_pool: in_process_pool(options),
            streaming: validated.streaming,
        },
    }
}

/// The [`SdkHarnessPlan`] of one worker process of a cluster job, where
/// `num_workers` counts worker processes: one worker's harnesses.
pub fn sdk_harness_plan_on_worker(validated: &JobOptions, options: &Struct) -> SdkHarnessPlan {
    let one = JobOptions {
        num_workers: None,
        max_num_workers: None,
        autoscaling_algorithm: None,
        ..validated.clone()
    };
    sdk_harness_plan(&one, options)
}

/// The Go SDK's flags: `beam:option:go_options:v1` (older SDKs: `options`)
/// holds `{"options": {flag: value}}`.
fn go_options(options: &Struct) -> Option<&Struct> {
    ["beam:option:go_options:v1", "options"]
        .iter()
        .find_map(|key| match &options.fields.get(*key)?.kind {
            Some(Kind::StructValue(outer)) => match &outer.fields.get("options")?.kind {
                Some(Kind::StructValue(inner)) => Some(inner),
                _ => None,
            },
            _ => None,
        })
}

// ------------------------------------------------------------------ validation

/// Experiments that ask Dataflow for its legacy, non-portable runner.
pub const REJECTED_EXPERIMENTS: &[&str] = &[
    "disable_runner_v2",
    "disable_portable_runner",
    "enable_streaming_java_runner",
    "disable_runner_v2_until_2023",
    "disable_prime_runner_v2",
];

/// Test-only experiment: `weir_test_element_processing_timeout_seconds=N`
/// sets the element processing timeout to N seconds, below Dataflow's
/// one-minute minimum, so tests need not wait minutes.
pub const TEST_TIMEOUT_EXPERIMENT: &str = "weir_test_element_processing_timeout_seconds";

/// Test-only experiment: `weir_test_drain_at_start` runs the job as if it
/// had been drained the moment it started (Beam's `FnApiRunner(is_drain=True)`
/// does the same for its tests): splittable DoFns truncate their
/// restrictions before processing them.
pub const TEST_DRAIN_EXPERIMENT: &str = "weir_test_drain_at_start";

/// Test-only experiment: `weir_test_stuck_after_seconds=N` reports the job
/// as stuck after N seconds without progress (default: 5 minutes).
pub const TEST_STUCK_EXPERIMENT: &str = "weir_test_stuck_after_seconds";

/// Dataflow's smallest element processing timeout.
pub const MIN_ELEMENT_PROCESSING_TIMEOUT: Duration = Duration::from_secs(60);

/// The public Dataflow endpoint, which Python always sends.
const PUBLIC_DATAFLOW_ENDPOINT: &str = "https://dataflow.googleapis.com";

/// Bytes a job's name may have, from `--job_name` or
/// `PrepareJobRequest.job_name` (Dataflow takes at most 1024 characters);
/// the name is kept with the job and shown in every listing.
pub const MAX_JOB_NAME_BYTES: usize = 1024;

/// Why `name` is refused: it is over [`MAX_JOB_NAME_BYTES`].
pub(crate) fn job_name_too_long(name: &str) -> String {
    format!(
        "it is {} bytes long; a job name has at most {MAX_JOB_NAME_BYTES} (Dataflow's limit on job names)",
        name.len()
    )
}

/// Dataflow's job name rule (`Job.name` in its REST API).
const DATAFLOW_JOB_NAME: &str = r"^[a-z]([-a-z0-9]{0,1022}[a-z0-9])?$";

/// A pipeline option Weir refuses, named as the user spelled it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("pipeline option --{option}: {reason}")]
pub struct OptionError {
    /// The option, spelled as sent (`num_workers`, `numWorkers`, ...).
    pub option: String,
    pub reason: String,
}

/// Dataflow's `autoscaling_algorithm` values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AutoscalingAlgorithm {
    ThroughputBased,
    None,
}

/// The Dataflow options of a job, checked and typed. Options not set are
/// `None` / empty. [`JobOptions::notes`] says what Weir does not honour.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct JobOptions {
    pub job_name: Option<String>,
    pub project: Option<String>,
    pub region: Option<String>,
    pub zone: Option<String>,
    pub worker_region: Option<String>,
    pub worker_zone: Option<String>,
    /// Job labels (Dataflow's rules hold for every one).
    pub labels: BTreeMap<String, String>,
    pub temp_location: Option<String>,
    pub gcp_temp_location: Option<String>,
    pub staging_location: Option<String>,
    pub experiments: Vec<String>,
    pub dataflow_service_options: Vec<String>,
    pub num_workers: Option<u32>,
    pub max_num_workers: Option<u32>,
    pub autoscaling_algorithm: Option<AutoscalingAlgorithm>,
    pub number_of_worker_harness_threads: Option<u32>,
    pub max_cache_memory_usage_mb: Option<u64>,
    pub disk_size_gb: Option<u64>,
    pub flexrs_goal: Option<String>,
    /// From `element_processing_timeout_minutes` (Python, Java),
    /// `element_processing_timeout` (Go) or the test-only experiment
    /// [`TEST_TIMEOUT_EXPERIMENT`].
    pub element_processing_timeout: Option<Duration>,
    pub streaming: bool,
    pub update: bool,
    pub transform_name_mapping: BTreeMap<String, String>,
    pub enable_hot_key_logging: bool,
    pub use_public_ips: Option<bool>,
    /// Canonical name of each Dataflow option given → the spelling used.
    pub spellings: BTreeMap<&'static str, String>,
    /// One message per option Weir accepted without acting on it (or only
    /// partly): for the job's message stream.
    pub notes: Vec<String>,
}

/// Lowercase ASCII letters and digits only: `jobName`, `job_name` and Java's
/// `flex_r_s_goal` (from `flexRSGoal`) meet.
fn normalize(name: &str) -> String {
    name.chars()
        .filter(char::is_ascii_alphanumeric)
        .map(|c| c.to_ascii_lowercase())
        .collect()
}

fn index() -> &'static HashMap<String, usize> {
    static INDEX: OnceLock<HashMap<String, usize>> = OnceLock::new();
    INDEX.get_or_init(|| {
        let mut map = HashMap::new();
        for (i, spec) in CATALOG.iter().enumerate() {
            for spelling in [spec.name, spec.python, spec.java, spec.go]
                .iter()
                .chain(spec.aliases)
            {
                if !spelling.is_empty() {
                    map.insert(normalize(spelling), i);
                }
            }
        }
        map
    })
}

/// The Dataflow option spelled `name` (any SDK's spelling, with or without
/// `beam:option:...:v1`).
pub fn spec(name: &str) -> Option<&'static OptionSpec> {
    index()
        .get(&normalize(option_name(name)))
        .map(|&i| &CATALOG[i])
}

fn option_name(key: &str) -> &str {
    key.strip_prefix("beam:option:")
        .and_then(|k| k.strip_suffix(":v1"))
        .unwrap_or(key)
}

/// The Dataflow options present, by catalog index: the spelling used and
/// the value. `beam:option:` keys win over plain keys, which win over Go's
/// flags; null values count as absent. Also a note for each spelling given
/// besides the one taken, with another value (`beam:option:num_workers:v1`
/// and Go's `num_workers`, say).
fn present_and_dropped(options: &Struct) -> (HashMap<usize, (String, &Value)>, Vec<String>) {
    let mut top: Vec<(&String, &Value)> = options.fields.iter().collect();
    top.sort_by(|a, b| a.0.cmp(b.0));
    let mut go: Vec<(&String, &Value)> = go_options(options)
        .map(|g| g.fields.iter().collect())
        .unwrap_or_default();
    go.sort_by(|a, b| a.0.cmp(b.0));
    let ranked = top
        .into_iter()
        .map(|(k, v)| {
            (
                u8::from(!(k.starts_with("beam:option:") && k.ends_with(":v1"))),
                k,
                v,
            )
        })
        .chain(go.into_iter().map(|(k, v)| (2, k, v)));
    let mut found: HashMap<usize, (u8, String, &Value)> = HashMap::new();
    let mut others: Vec<(usize, u8, String, &Value)> = Vec::new();
    let java = from_java(options);
    for (rank, key, value) in ranked {
        if matches!(value.kind, None | Some(Kind::NullValue(_))) {
            continue;
        }
        let name = option_name(key);
        let Some(&i) = index().get(&normalize(name)) else {
            continue;
        };
        let shown;
        let name = if java && rank == 0 {
            shown = lower_camel(name);
            shown.as_str()
        } else {
            name
        };
        match found.get(&i) {
            Some((r, _, _)) if *r <= rank => others.push((i, rank, name.to_string(), value)),
            _ => {
                if let Some((r, n, v)) = found.insert(i, (rank, name.to_string(), value)) {
                    others.push((i, r, n, v));
                }
            }
        }
    }
    let mut dropped: Vec<String> = others
        .into_iter()
        .filter_map(|(i, _, name, value)| {
            let (_, kept, taken) = &found[&i];
            let differ = values::is_set(value)
                && values::is_set(taken)
                && values::display(value) != values::display(taken);
            differ.then(|| {
                format!(
                    "--{name}={}: also given as --{kept}={}, which Weir takes",
                    values::display(value),
                    values::display(taken)
                )
            })
        })
        .collect();
    dropped.sort();
    let found = found
        .into_iter()
        .map(|(i, (_, name, value))| (i, (name, value)))
        .collect();
    (found, dropped)
}

/// Whether the options come from Beam Java, which alone sends
/// `options_id` (`PipelineOptions.getOptionsId`). Its `beam:option:` keys
/// are its getters' names in snake case, so messages spell them back in
/// camel case (`--numWorkers`), as the user typed them.
fn from_java(options: &Struct) -> bool {
    options.fields.contains_key("beam:option:options_id:v1")
}

/// `num_workers` as `numWorkers` (`flex_r_s_goal` as `flexRSGoal`).
fn lower_camel(snake: &str) -> String {
    let mut out = String::with_capacity(snake.len());
    let mut upper = false;
    for c in snake.chars() {
        if c == '_' && !out.is_empty() {
            upper = true;
        } else if upper {
            out.extend(c.to_uppercase());
            upper = false;
        } else {
            out.push(c);
        }
    }
    out
}

fn catalog_index(name: &str) -> usize {
    CATALOG
        .iter()
        .position(|s| s.name == name)
        .unwrap_or_else(|| panic!("{name} is not in the option catalog"))
}

fn err(option: &str, reason: impl Into<String>) -> OptionError {
    OptionError {
        option: option.to_string(),
        reason: reason.into(),
    }
}

/// Checks the Dataflow options in `options` and returns their typed view.
///
/// Options outside Dataflow's reference (the SDKs send many: Python sends
/// every option with a value) are accepted without a look. Options Weir
/// does not act on produce a note each in [`JobOptions::notes`].
///
/// # Errors
/// The first option that breaks a rule, named as spelled in `options`.
pub fn validate(options: &Struct) -> Result<JobOptions, OptionError> {
    let (given, dropped) = present_and_dropped(options);
    let at = |name: &str| {
        given
            .get(&catalog_index(name))
            .map(|(k, v)| (k.as_str(), *v))
    };
    let mut o = JobOptions {
        spellings: given
            .iter()
            .map(|(&i, (k, _))| (CATALOG[i].name, k.clone()))
            .collect(),
        ..JobOptions::default()
    };

    let string = |name: &str| -> Result<Option<String>, OptionError> {
        match at(name) {
            Some((k, v)) => values::string(k, v),
            None => Ok(None),
        }
    };
    let boolean = |name: &str| -> Result<Option<bool>, OptionError> {
        match at(name) {
            Some((k, v)) => values::boolean(k, v),
            None => Ok(None),
        }
    };
    let count = |name: &str, min: i64| -> Result<Option<i64>, OptionError> {
        let what = if min > 0 {
            "a positive integer"
        } else {
            "0 or more"
        };
        match at(name) {
            Some((k, v)) => values::integer_at_least(k, v, min, what),
            None => Ok(None),
        }
    };
    let to_u32 = |name: &str, n: Option<i64>| -> Result<Option<u32>, OptionError> {
        n.map(|n| {
            u32::try_from(n).map_err(|_| {
                err(
                    at(name).map_or(name, |(k, _)| k),
                    format!("{n} is too large"),
                )
            })
        })
        .transpose()
    };

    // Basic.
    o.job_name = string("job_name")?;
    if let (Some(name), Some((k, _))) = (o.job_name.as_deref(), at("job_name")) {
        if name.len() > MAX_JOB_NAME_BYTES {
            return Err(err(k, job_name_too_long(name)));
        }
    }
    o.project = string("project")?;
    o.region = string("region")?;
    for (name, slot) in [
        ("temp_location", &mut o.temp_location),
        ("gcp_temp_location", &mut o.gcp_temp_location),
        ("staging_location", &mut o.staging_location),
    ] {
        *slot = string(name)?;
        if let (Some(location), Some((k, _))) = (slot.as_deref(), at(name)) {
            values::check_location(k, location)?;
        }
    }
    if let Some((k, v)) = at("labels") {
        o.labels = values::string_map(k, v)?;
        values::check_labels(k, &o.labels)?;
    }
    if let Some((k, v)) = at("experiments") {
        o.experiments = values::list(k, v)?;
        for e in &o.experiments {
            let name = e.split_once('=').map_or(e.as_str(), |(n, _)| n);
            if REJECTED_EXPERIMENTS.contains(&name) {
                return Err(err(
                    k,
                    format!("{e}: Weir is a Portable Runner (Runner v2); it cannot run Dataflow's legacy runner. Remove the experiment."),
                ));
            }
        }
    }
    if let Some((k, v)) = at("dataflow_service_options") {
        o.dataflow_service_options = values::list(k, v)?;
    }
    o.streaming = boolean("streaming")?.unwrap_or(false);

    // Resource utilization.
    // 0 is Dataflow's "not set" (Java's int getters default to it, and
    // reading one unset sends it): Weir's own default applies.
    let workers = |name: &str| -> Result<Option<i64>, OptionError> { Ok(count(name, 0)?.filter(|&n| n > 0)) };
    o.num_workers = to_u32("num_workers", workers("num_workers")?)?;
    o.max_num_workers = to_u32("max_num_workers", workers("max_num_workers")?)?;
    if let (Some(n), Some(max)) = (o.num_workers, o.max_num_workers) {
        if max < n {
            let (k, _) = at("max_num_workers").expect("given");
            let (nk, _) = at("num_workers").expect("given");
            return Err(err(k, format!("{max} is less than --{nk}={n}")));
        }
    }
    if let Some(a) = string("autoscaling_algorithm")? {
        o.autoscaling_algorithm = Some(match a.trim() {
            "THROUGHPUT_BASED" => AutoscalingAlgorithm::ThroughputBased,
            "NONE" => AutoscalingAlgorithm::None,
            other => {
                return Err(err(
                    at("autoscaling_algorithm").expect("given").0,
                    format!("{other:?}: use THROUGHPUT_BASED or NONE"),
                ))
            }
        });
    }
    if let Some(goal) = string("flexrs_goal")? {
        let bare = goal.trim().strip_prefix("FLEXRS_").unwrap_or(goal.trim());
        if !matches!(bare, "COST_OPTIMIZED" | "SPEED_OPTIMIZED" | "UNSPECIFIED") {
            return Err(err(
                at("flexrs_goal").expect("given").0,
                format!("{goal:?}: use COST_OPTIMIZED or SPEED_OPTIMIZED"),
            ));
        }
        o.flexrs_goal = Some(goal);
    }
    // 0 is Dataflow Java's default (`@Default.Integer(0)`): the service decides.
    o.number_of_worker_harness_threads = to_u32(
        "number_of_worker_harness_threads",
        count("number_of_worker_harness_threads", 0)?.filter(|&n| n > 0),
    )?;
    o.max_cache_memory_usage_mb = count("max_cache_memory_usage_mb", 0)?.map(|n| n as u64);

    // Worker level.
    o.disk_size_gb = count("disk_size_gb", 0)?.map(|n| n as u64);
    count("disk_provisioned_iops", 1)?;
    count("disk_provisioned_throughput_mibps", 1)?;
    o.zone = string("zone")?;
    o.worker_region = string("worker_region")?;
    o.worker_zone = string("worker_zone")?;
    let spelled = |name: &str| at(name).map_or(name.to_string(), |(k, _)| k.to_string());
    if o.zone.is_some() && (o.worker_region.is_some() || o.worker_zone.is_some()) {
        let other = if o.worker_region.is_some() {
            "worker_region"
        } else {
            "worker_zone"
        };
        return Err(err(
            &spelled("zone"),
            format!(
                "cannot be used with --{} (zone is deprecated: use worker_zone)",
                spelled(other)
            ),
        ));
    }
    if o.worker_region.is_some() && o.worker_zone.is_some() {
        return Err(err(
            &spelled("worker_region"),
            format!(
                "cannot be used with --{}: they are mutually exclusive",
                spelled("worker_zone")
            ),
        ));
    }
    if (o.worker_region.is_some() || o.worker_zone.is_some())
        && o.experiments
            .iter()
            .any(|e| e == "worker_region" || e.starts_with("worker_region="))
    {
        return Err(err(
            &spelled("experiments"),
            format!(
                "the deprecated experiment worker_region cannot be used with --{}",
                spelled(if o.worker_region.is_some() {
                    "worker_region"
                } else {
                    "worker_zone"
                })
            ),
        ));
    }

    // Security and networking.
    o.use_public_ips = boolean("use_public_ips")?;
    if boolean("no_use_public_ips")? == Some(true) {
        if o.use_public_ips == Some(true) {
            return Err(err(
                &spelled("no_use_public_ips"),
                format!("contradicts --{}=true", spelled("use_public_ips")),
            ));
        }
        o.use_public_ips = Some(false);
    }

    // Streaming pipeline management.
    o.update = boolean("update")?.unwrap_or(false);
    if let Some((k, v)) = at("transform_name_mapping") {
        o.transform_name_mapping = values::object(k, v)?;
    }
    boolean("enable_streaming_engine")?;

    // Debugging.
    o.enable_hot_key_logging = boolean("enable_hot_key_logging")?.unwrap_or(false);
    let minutes = match at("element_processing_timeout_minutes") {
        Some((k, v)) => match values::integer(k, v)? {
            Some(m) if m < 1 => {
                return Err(err(
                    k,
                    format!("must be at least 1 minute (Dataflow's minimum), got {m}"),
                ))
            }
            Some(m) => Some(Duration::from_secs((m as u64).saturating_mul(60))),
            None => None,
        },
        None => None,
    };
    let go = match at("element_processing_timeout") {
        Some((k, v)) => match values::string(k, v)? {
            Some(text) => {
                let d = go_duration(&text)
                    .ok_or_else(|| err(k, format!("{text:?} is not a duration such as 3m30s")))?;
                if d < MIN_ELEMENT_PROCESSING_TIMEOUT {
                    return Err(err(
                        k,
                        format!("{text} is less than 1 minute (Dataflow's minimum)"),
                    ));
                }
                Some(d)
            }
            None => None,
        },
        None => None,
    };
    if let (Some(m), Some(g)) = (minutes, go) {
        if m != g {
            return Err(err(
                &spelled("element_processing_timeout"),
                format!(
                    "{} disagrees with --{}={}",
                    values::human(g),
                    spelled("element_processing_timeout_minutes"),
                    m.as_secs() / 60
                ),
            ));
        }
    }
    o.element_processing_timeout = minutes.or(go);
    if let Some(e) = o
        .experiments
        .iter()
        .find(|e| e.split_once('=').map_or(e.as_str(), |(n, _)| n) == TEST_TIMEOUT_EXPERIMENT)
    {
        let k = spelled("experiments");
        let seconds = e
            .split_once('=')
            .and_then(|(_, n)| n.trim().parse::<u64>().ok())
            .filter(|&n| n > 0)
            .ok_or_else(|| err(&k, format!("{e}: expects {TEST_TIMEOUT_EXPERIMENT}=N with N a positive number of seconds")))?;
        o.element_processing_timeout = Some(Duration::from_secs(seconds));
        o.notes.push(format!(
            "--{k}={e}: test-only experiment; the element processing timeout is {seconds}s (Dataflow's 1-minute minimum does not apply)"
        ));
    }

    // Notes: what Weir does not act on.
    o.notes.extend(dropped);
    if let Some(max) = o.max_num_workers {
        if o.autoscaling_algorithm != Some(AutoscalingAlgorithm::ThroughputBased) {
            o.notes.push(format!(
                "--{}={max}: has no effect without --{}=THROUGHPUT_BASED (Weir's default is NONE: a fixed count of num_workers)",
                spelled("max_num_workers"),
                spelled("autoscaling_algorithm"),
            ));
        }
    }
    if let Some(name) = &o.job_name {
        static RE: OnceLock<regex::Regex> = OnceLock::new();
        if !RE
            .get_or_init(|| regex::Regex::new(DATAFLOW_JOB_NAME).expect("job name pattern"))
            .is_match(name)
        {
            o.notes.push(format!(
                "--{}={name}: Dataflow would reject this job name (it wants [a-z]([-a-z0-9]*[a-z0-9])?); Weir accepts it",
                spelled("job_name")
            ));
        }
    }
    if !o.labels.is_empty() {
        let list: Vec<String> = o.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
        o.notes.push(format!(
            "--{}: recorded with the job: {}",
            spelled("labels"),
            list.join(", ")
        ));
    }
    let mut indices: Vec<usize> = given.keys().copied().collect();
    indices.sort_unstable();
    for i in indices {
        let spec = &CATALOG[i];
        let (key, value) = &given[&i];
        if spec.handling != Handling::Recorded {
            continue;
        }
        let noteworthy = match spec.name {
            "enable_streaming_engine" => o.streaming && values::is_set(value),
            "dataflow_endpoint" => values::string(key, value)?
                .is_some_and(|e| e.trim_end_matches('/') != PUBLIC_DATAFLOW_ENDPOINT),
            "use_public_ips" => true,
            _ => values::is_set(value),
        };
        if noteworthy {
            o.notes
                .push(format!("--{key}={}: {}", values::display(value), spec.weir));
        }
    }
    Ok(o)
}

/// Every option Weir understands, as `PipelineOptionDescriptor`s.
pub fn descriptors() -> Vec<beam::PipelineOptionDescriptor> {
    use beam::pipeline_option_type::Enum as T;
    CATALOG
        .iter()
        .map(|spec| {
            let ty = match spec.ty {
                OptionType::String => T::String,
                OptionType::Boolean => T::Boolean,
                OptionType::Integer => T::Integer,
                OptionType::Number => T::Number,
                OptionType::Array => T::Array,
                OptionType::Object => T::Object,
            };
            let mut spellings = vec![];
            for (sdk, s) in [("Java", spec.java), ("Go", spec.go)] {
                if !s.is_empty() && s != spec.name {
                    spellings.push(format!("{sdk}: {s}"));
                }
            }
            let mut description = spec.description.to_string();
            if !spellings.is_empty() {
                description.push_str(&format!(" ({})", spellings.join(", ")));
            }
            description.push_str(" Weir: ");
            if !spec.rule.is_empty() {
                description.push_str(spec.rule);
                description.push(' ');
            }
            let weir = if spec.handling == Handling::Recorded {
                format!("{} {}.", spec.name, spec.weir)
            } else {
                spec.weir.to_string()
            };
            description.push_str(&weir);
            beam::PipelineOptionDescriptor {
                name: spec.name.to_string(),
                r#type: ty as i32,
                description,
                default_value: String::new(),
                group: spec.group.as_str().to_string(),
            }
        })
        .collect()
}

/// What `DescribePipelineOptions` serves: the [`descriptors`] of options
/// the Python SDK does not define itself (an empty [`OptionSpec::python`]).
/// Python's PortableRunner, the Beam client that asks, adds each described
/// option to its command-line parser so a user can set it and drops those
/// it already has, one failed `add_argument` each: describing the whole
/// catalog cost every job about 3.6 ms of the client's time and changed
/// nothing.
pub fn runner_descriptors() -> Vec<beam::PipelineOptionDescriptor> {
    descriptors()
        .into_iter()
        .filter(|d| spec(&d.name).is_some_and(|s| s.python.is_empty()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spellings_do_not_collide() {
        let mut seen: HashMap<String, &str> = HashMap::new();
        for spec in CATALOG {
            let mut mine: Vec<String> = [spec.name, spec.python, spec.java, spec.go]
                .iter()
                .chain(spec.aliases)
                .filter(|s| !s.is_empty())
                .map(|s| normalize(s))
                .collect();
            mine.sort();
            mine.dedup();
            for n in mine {
                if let Some(other) = seen.insert(n.clone(), spec.name) {
                    panic!("{n} is a spelling of both {other} and {}", spec.name);
                }
            }
        }
    }

    #[test]
    fn every_spec_is_found_by_each_spelling() {
        for spec in CATALOG {
            for s in [spec.name, spec.python, spec.java, spec.go]
                .iter()
                .chain(spec.aliases)
                .filter(|s| !s.is_empty())
            {
                assert_eq!(spec_name(s), Some(spec.name), "{s}");
                assert_eq!(
                    spec_name(&format!("beam:option:{s}:v1")),
                    Some(spec.name),
                    "{s}"
                );
            }
        }
        // Java snake_cases camelCase letter by letter.
        assert_eq!(
            spec_name("beam:option:flex_r_s_goal:v1"),
            Some("flexrs_goal")
        );
        assert_eq!(
            spec_name("beam:option:dump_heap_on_o_o_m:v1"),
            Some("dump_heap_on_oom")
        );
        assert_eq!(spec_name("beam:option:direct_num_workers:v1"), None);
    }

    fn spec_name(s: &str) -> Option<&'static str> {
        spec(s).map(|s| s.name)
    }

    #[test]
    fn recorded_options_say_what_happens() {
        for spec in CATALOG {
            assert!(
                !spec.weir.is_empty() && !spec.description.is_empty(),
                "{}",
                spec.name
            );
            if spec.handling == Handling::Recorded {
                assert!(
                    spec.weir.contains("recorded"),
                    "{}: {}",
                    spec.name,
                    spec.weir
                );
            }
        }
    }
}
