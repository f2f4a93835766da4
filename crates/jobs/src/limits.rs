//! Resource limits of a Weir server: what one client may make it hold.
//!
//! Each limit has a `weir serve` flag (named in [`Limits`] and in every
//! refusal, so the operator knows what to raise) and a default that no
//! Beam SDK's ordinary jobs reach. Prepare refuses a job over a limit with
//! INVALID_ARGUMENT (RESOURCE_EXHAUSTED for the cap on prepared jobs), and
//! artifact staging stops a job that stages more than its allowance.

use std::time::Duration;

/// The limits (`weir serve` flags in brackets).
#[derive(Clone, Debug)]
pub struct Limits {
    /// Largest serialized `Pipeline` Prepare takes, in bytes
    /// (`--max_pipeline_bytes`).
    pub max_pipeline_bytes: usize,
    /// Most leaf transforms (those without subtransforms) one pipeline may
    /// have (`--max_pipeline_transforms`): each runner transform of a job
    /// costs the engine about 20 KB while it runs, however small its proto.
    pub max_pipeline_transforms: usize,
    /// Largest serialized value of one pipeline option, in bytes
    /// (`--max_option_bytes`). Options reach SDK harnesses through the
    /// provision service and `weir boot`'s options file, never a command line.
    pub max_option_bytes: usize,
    /// Bytes of artifacts one job may stage (`--max_artifact_bytes_per_job`).
    pub max_artifact_bytes_per_job: u64,
    /// How long a prepared job waits for Run before it is forgotten
    /// (`--prepared_job_ttl_secs`).
    pub prepared_job_ttl: Duration,
    /// How many prepared, not yet run jobs the server keeps
    /// (`--max_prepared_jobs`); Prepare beyond it forgets the oldest one
    /// not staging artifacts, and is RESOURCE_EXHAUSTED if all are.
    pub max_prepared_jobs: usize,
    /// Bytes of serialized pipelines the server holds, in prepared jobs not
    /// yet run and again in finished jobs (`--max_held_pipeline_bytes`):
    /// Prepare past it is RESOURCE_EXHAUSTED, and the oldest finished jobs
    /// are forgotten past it. A job in memory costs about twice its
    /// pipeline (the proto and its plan).
    pub max_held_pipeline_bytes: usize,
    /// SDK harnesses one job may start: `num_workers` (or
    /// `max_num_workers` when autoscaling) times the harnesses per worker
    /// (`--max_sdk_harnesses_per_job`).
    pub max_sdk_harnesses_per_job: usize,
    /// A client's `staging_location` may point outside the server's
    /// staging root (`--allow_client_staging_locations`).
    pub allow_client_staging_locations: bool,
}

/// How deep one option's value may nest (lists and structs in lists and
/// structs). Each level is two protobuf messages, and Weir sends options
/// back inside `GetJobsResponse.job_info`: deeper values would pass
/// prost's recursion limit of 100 in every client's GetJobs.
pub const MAX_OPTION_DEPTH: usize = 32;

/// Flag names, as `weir serve` spells them.
pub mod flag {
    pub const MAX_PIPELINE_BYTES: &str = "--max_pipeline_bytes";
    pub const MAX_PIPELINE_TRANSFORMS: &str = "--max_pipeline_transforms";
    pub const MAX_OPTION_BYTES: &str = "--max_option_bytes";
    pub const MAX_ARTIFACT_BYTES_PER_JOB: &str = "--max_artifact_bytes_per_job";
    pub const PREPARED_JOB_TTL_SECS: &str = "--prepared_job_ttl_secs";
    pub const MAX_PREPARED_JOBS: &str = "--max_prepared_jobs";
    pub const MAX_HELD_PIPELINE_BYTES: &str = "--max_held_pipeline_bytes";
    pub const MAX_SDK_HARNESSES_PER_JOB: &str = "--max_sdk_harnesses_per_job";
    pub const ALLOW_CLIENT_STAGING_LOCATIONS: &str = "--allow_client_staging_locations";
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_pipeline_bytes: 256 << 20,
            // Beam's SDKs' large pipelines have a few thousand.
            max_pipeline_transforms: 20_000,
            max_option_bytes: 1 << 20,
            max_artifact_bytes_per_job: 8 << 30,
            prepared_job_ttl: Duration::from_secs(3600),
            max_prepared_jobs: 100,
            max_held_pipeline_bytes: 1 << 30,
            // A job with default options starts one harness per core of
            // each Python environment (one of a Java or Go one): the
            // default leaves room for a few environments.
            max_sdk_harnesses_per_job: weir_engine::machine_cores()
                .saturating_mul(4)
                .max(256),
            allow_client_staging_locations: false,
        }
    }
}

/// The refusal of something over a limit: `what` is N, over the limit of
/// `limit` (`weir serve FLAG` raises it).
pub fn over(
    what: &str,
    n: impl std::fmt::Display,
    limit: impl std::fmt::Display,
    flag: &str,
) -> String {
    format!("{what} is {n}, over this server's limit of {limit} (weir serve {flag} raises it)")
}

/// Checks the pipeline's size and each option's against `limits`.
///
/// # Errors
/// The message names the option (or the pipeline), its size, the limit and the flag.
pub fn check_request(
    limits: &Limits,
    pipeline_bytes: usize,
    options: &weir_proto::prost_types::Struct,
) -> Result<(), String> {
    use prost::Message;
    if pipeline_bytes > limits.max_pipeline_bytes {
        return Err(over(
            "the pipeline proto",
            format!("{pipeline_bytes} bytes"),
            format!("{} bytes", limits.max_pipeline_bytes),
            flag::MAX_PIPELINE_BYTES,
        ));
    }
    let mut keys: Vec<&String> = options.fields.keys().collect();
    keys.sort();
    for key in keys {
        let depth = value_depth(&options.fields[key]);
        if depth > MAX_OPTION_DEPTH {
            return Err(format!(
                "pipeline option {key} nests lists and structs {depth} deep, more than the {MAX_OPTION_DEPTH} Weir takes"
            ));
        }
        let n = options.fields[key].encoded_len();
        if n > limits.max_option_bytes {
            return Err(over(
                &format!("pipeline option {key}"),
                format!("{n} bytes"),
                format!("{} bytes", limits.max_option_bytes),
                flag::MAX_OPTION_BYTES,
            ));
        }
    }
    Ok(())
}

/// Checks the number of leaf transforms of `pipeline` against `limits`.
///
/// # Errors
/// The message gives the count, the limit and the flag.
pub fn check_transforms(limits: &Limits, pipeline: &weir_proto::beam::Pipeline) -> Result<(), String> {
    let leaves = pipeline
        .components
        .as_ref()
        .map_or(0, |c| c.transforms.values().filter(|t| t.subtransforms.is_empty()).count());
    if leaves > limits.max_pipeline_transforms {
        return Err(over(
            "the number of the pipeline's leaf transforms (those without subtransforms)",
            leaves,
            limits.max_pipeline_transforms,
            flag::MAX_PIPELINE_TRANSFORMS,
        ));
    }
    Ok(())
}

/// How deep `v` nests: 1 for a scalar, one more per list or struct around
/// it (walked with an explicit stack: the value is the client's).
fn value_depth(v: &weir_proto::prost_types::Value) -> usize {
    use weir_proto::prost_types::value::Kind;
    let mut deepest = 0;
    let mut stack = vec![(v, 1usize)];
    while let Some((v, d)) = stack.pop() {
        deepest = deepest.max(d);
        match &v.kind {
            Some(Kind::ListValue(l)) => stack.extend(l.values.iter().map(|c| (c, d + 1))),
            Some(Kind::StructValue(s)) => stack.extend(s.fields.values().map(|c| (c, d + 1))),
            _ => {}
        }
    }
    deepest
}

#[cfg(test)]
mod tests {
    use super::*;
    use weir_proto::prost_types::{value::Kind, Struct, Value};

    #[test]
    fn a_big_pipeline_or_option_is_refused_naming_it_and_the_flag() {
        let limits = Limits {
            max_pipeline_bytes: 1000,
            max_option_bytes: 10,
            ..Limits::default()
        };
        let opt = |s: &str| Struct {
            fields: [(
                "beam:option:big:v1".to_string(),
                Value {
                    kind: Some(Kind::StringValue(s.into())),
                },
            )]
            .into(),
        };
        assert_eq!(check_request(&limits, 1000, &opt("short")), Ok(()));
        assert_eq!(
            check_request(&limits, 1001, &opt("")).unwrap_err(),
            "the pipeline proto is 1001 bytes, over this server's limit of 1000 bytes (weir serve --max_pipeline_bytes raises it)"
        );
        assert_eq!(
            check_request(&limits, 10, &opt("0123456789")).unwrap_err(),
            "pipeline option beam:option:big:v1 is 12 bytes, over this server's limit of 10 bytes (weir serve --max_option_bytes raises it)"
        );
    }

    #[test]
    fn an_option_nested_deeper_than_the_limit_is_refused_naming_it() {
        let nested = |levels: usize| {
            let mut v = Value {
                kind: Some(Kind::StringValue("x".into())),
            };
            for i in 0..levels {
                v = Value {
                    kind: Some(if i % 2 == 0 {
                        Kind::ListValue(weir_proto::prost_types::ListValue { values: vec![v] })
                    } else {
                        Kind::StructValue(Struct {
                            fields: [("k".to_string(), v)].into(),
                        })
                    }),
                };
            }
            Struct {
                fields: [("beam:option:deep:v1".to_string(), v)].into(),
            }
        };
        let limits = Limits::default();
        assert_eq!(
            check_request(&limits, 0, &nested(MAX_OPTION_DEPTH - 1)),
            Ok(())
        );
        assert_eq!(
            check_request(&limits, 0, &nested(MAX_OPTION_DEPTH)).unwrap_err(),
            "pipeline option beam:option:deep:v1 nests lists and structs 33 deep, more than the 32 Weir takes"
        );
    }

    #[test]
    fn a_pipeline_of_too_many_leaf_transforms_is_refused_naming_the_flag() {
        use weir_proto::beam;
        let limits = Limits { max_pipeline_transforms: 2, ..Limits::default() };
        let mut p = beam::Pipeline::default();
        let c = p.components.get_or_insert_with(Default::default);
        for id in ["a", "b"] {
            c.transforms.insert(id.into(), beam::PTransform::default());
        }
        c.transforms.insert(
            "composite".into(),
            beam::PTransform { subtransforms: vec!["a".into(), "b".into()], ..Default::default() },
        );
        assert_eq!(check_transforms(&limits, &p), Ok(()));
        p.components.as_mut().unwrap().transforms.insert("c".into(), beam::PTransform::default());
        assert_eq!(
            check_transforms(&limits, &p).unwrap_err(),
            "the number of the pipeline's leaf transforms (those without subtransforms) is 3, over this server's limit of 2 (weir serve --max_pipeline_transforms raises it)"
        );
    }
}
