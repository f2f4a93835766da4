//! `weir expansion-service`: the processes that serve Beam's `ExpansionService`
//! (`beam_expansion_api.proto`) for cross-language transforms, with the
//! environment their expansions carry chosen so that Weir can start it here.
//!
//! - **Java**: `java -cp <jars> org.apache.beam.sdk.expansion.service.ExpansionService PORT`,
//!   the jars being the folder that `scripts/setup_java.sh` fills from
//!   `java/expansion/pom.xml` (Beam Java 2.71.0: core, KafkaIO, Beam SQL, the
//!   SDK harness). Beam's service applies `--defaultEnvironmentType` /
//!   `--defaultEnvironmentConfig` to every expansion: DOCKER (Beam's default,
//!   `apache/beam_java17_sdk:2.71.0`, which Weir runs as `weir boot --java`
//!   without a Docker daemon), PROCESS (`{"command": "<weir> boot --java"}`) or
//!   EXTERNAL (a worker pool, Beam's `ExternalWorkerService`, started beside
//!   the service). Every environment lists the service's classpath as its
//!   dependencies, harness included, so `weir boot --java` runs the
//!   environment's own Beam version.
//! - **Python**: `python -m apache_beam.runners.portability.expansion_service_main`
//!   with `--fully_qualified_name_glob=*` (any Python callable, e.g. for Java's
//!   `PythonExternalTransform`) and `--environment_type/--environment_config`:
//!   DOCKER (`apache/beam_python3.x_sdk:V`, run as `weir boot --python`),
//!   PROCESS (`<weir> boot --python PY`) or EXTERNAL (Beam's Python worker pool,
//!   `apache_beam.runners.worker.worker_pool_main`, started beside it).
//!
//! This module only builds the commands ([`plan`]); the binary starts and
//! supervises them.

use std::path::{Path, PathBuf};

/// Main class of Beam's Java expansion service.
pub const JAVA_EXPANSION_MAIN: &str = "org.apache.beam.sdk.expansion.service.ExpansionService";
/// Main class of Beam's Java worker pool (`BeamFnExternalWorkerPool`).
pub const JAVA_WORKER_POOL_MAIN: &str = "org.apache.beam.fn.harness.ExternalWorkerService";
/// Environment variable naming the Java expansion service's jar folder.
pub const JAVA_EXPANSION_CLASSPATH_ENV: &str = "WEIR_JAVA_EXPANSION_CLASSPATH";

/// Which SDK's expansion service to start.
#[derive(Clone, Debug)]
pub enum ExpansionSdk {
    /// Beam's Java expansion service.
    Java {
        /// The `java` launcher.
        java: String,
        /// The service's jars (see [`find_java_expansion_classpath`]).
        jars: Vec<PathBuf>,
    },
    /// Beam's Python expansion service.
    Python {
        /// Python interpreter with apache-beam installed.
        python: String,
    },
}

/// The environment the service puts on every transform it expands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExpansionEnvironment {
    /// `beam:env:docker:v1` with Beam's SDK image (the SDK's own default).
    Docker,
    /// `beam:env:process:v1` running `weir boot`.
    Process,
    /// `beam:env:external:v1`: a worker pool started beside the service.
    External,
}

impl std::str::FromStr for ExpansionEnvironment {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_uppercase().as_str() {
            "DOCKER" => Ok(Self::Docker),
            "PROCESS" => Ok(Self::Process),
            "EXTERNAL" => Ok(Self::External),
            _ => Err(format!(
                "unknown expansion-service environment '{s}' (DOCKER, PROCESS or EXTERNAL)"
            )),
        }
    }
}

/// One process to start: program, arguments, extra environment variables.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Launch {
    /// What it is, for messages: "expansion service" or "worker pool".
    pub role: &'static str,
    pub program: String,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
}

/// What `weir expansion-service` was told.
#[derive(Clone, Debug)]
pub struct ExpansionConfig {
    pub sdk: ExpansionSdk,
    pub environment: ExpansionEnvironment,
    /// Port of the expansion service (localhost).
    pub port: u16,
    /// Port of the worker pool (EXTERNAL only).
    pub worker_pool_port: Option<u16>,
    /// The `weir` binary that PROCESS environments run as `weir boot`.
    pub weir_bin: PathBuf,
    /// Arguments for the expansion service itself, after Weir's (e.g. Java's
    /// `--javaClassLookupAllowlistFile=...`).
    pub service_args: Vec<String>,
}

/// The processes to start, the worker pool (if any) first.
///
/// # Errors
/// EXTERNAL without a worker pool port; a Java service without jars.
pub fn plan(cfg: &ExpansionConfig) -> Result<Vec<Launch>, String> {
    let weir = cfg.weir_bin.display().to_string();
    let pool = match cfg.environment {
        ExpansionEnvironment::External => Some(cfg.worker_pool_port.ok_or_else(|| {
            "an EXTERNAL expansion-service environment needs a worker pool port".to_string()
        })?),
        _ => None,
    };
    let mut launches = Vec::new();
    match &cfg.sdk {
        ExpansionSdk::Java { java, jars } => {
            if jars.is_empty() {
                return Err(
                    "no jars for the Java expansion service; run scripts/setup_java.sh".into(),
                );
            }
            let classpath = jars
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(":");
            let mut jvm = vec![
                "--add-opens=java.base/java.nio=ALL-UNNAMED".to_string(),
                "--add-opens=java.base/java.lang=ALL-UNNAMED".to_string(),
                "--add-opens=java.base/java.util=ALL-UNNAMED".to_string(),
            ];
            let service_env_args = match cfg.environment {
                ExpansionEnvironment::Docker => Vec::new(),
                ExpansionEnvironment::Process => vec![
                    "--defaultEnvironmentType=PROCESS".to_string(),
                    format!(
                        "--defaultEnvironmentConfig={}",
                        serde_json::json!({ "command": format!("{weir} boot --java") })
                    ),
                ],
                ExpansionEnvironment::External => vec![
                    "--defaultEnvironmentType=EXTERNAL".to_string(),
                    format!("--defaultEnvironmentConfig=localhost:{}", pool.unwrap_or(0)),
                ],
            };
            if let Some(pool) = pool {
                // The pool's SDK harnesses need jamm as an agent, as in Beam's container.
                let mut pool_jvm = jvm.clone();
                if let Some(jamm) = jars.iter().find(|p| file_name(p).starts_with("jamm-")) {
                    pool_jvm.push(format!("-javaagent:{}", jamm.display()));
                }
                let options = serde_json::json!({ "options": {
                    "defaultEnvironmentType": "EXTERNAL",
                    "defaultEnvironmentConfig": format!("localhost:{pool}"),
                }});
                launches.push(Launch {
                    role: "worker pool",
                    program: java.clone(),
                    args: pool_jvm
                        .into_iter()
                        .chain([
                            "-cp".to_string(),
                            classpath.clone(),
                            JAVA_WORKER_POOL_MAIN.into(),
                        ])
                        .collect(),
                    env: vec![("PIPELINE_OPTIONS".into(), options.to_string())],
                });
            }
            jvm.extend([
                "-cp".to_string(),
                classpath,
                JAVA_EXPANSION_MAIN.to_string(),
                cfg.port.to_string(),
            ]);
            jvm.extend(service_env_args);
            jvm.extend(cfg.service_args.iter().cloned());
            launches.push(Launch {
                role: "expansion service",
                program: java.clone(),
                args: jvm,
                env: Vec::new(),
            });
        }
        ExpansionSdk::Python { python } => {
            if let Some(pool) = pool {
                launches.push(Launch {
                    role: "worker pool",
                    program: python.clone(),
                    args: vec![
                        "-m".into(),
                        "apache_beam.runners.worker.worker_pool_main".into(),
                        format!("--service_port={pool}"),
                    ],
                    env: python_first_on_path(python),
                });
            }
            let mut args = vec![
                "-m".to_string(),
                "apache_beam.runners.portability.expansion_service_main".to_string(),
                "-p".to_string(),
                cfg.port.to_string(),
                "--fully_qualified_name_glob=*".to_string(),
            ];
            match cfg.environment {
                ExpansionEnvironment::Docker => {}
                ExpansionEnvironment::Process => args.extend([
                    "--environment_type=PROCESS".to_string(),
                    format!(
                        "--environment_config={}",
                        serde_json::json!({ "command": format!("{weir} boot --python {python}") })
                    ),
                ]),
                ExpansionEnvironment::External => args.extend([
                    "--environment_type=EXTERNAL".to_string(),
                    format!("--environment_config=localhost:{}", pool.unwrap_or(0)),
                ]),
            }
            args.extend(cfg.service_args.iter().cloned());
            launches.push(Launch {
                role: "expansion service",
                program: python.clone(),
                args,
                env: Vec::new(),
            });
        }
    }
    Ok(launches)
}

/// `PATH` with the folder of `python` first: Beam's Python worker pool starts
/// each SDK harness as a literal `python -c ...`, which must be the
/// interpreter that has apache-beam (e.g. a venv's). Empty for a bare name.
fn python_first_on_path(python: &str) -> Vec<(String, String)> {
    let dir = match Path::new(python).parent() {
        Some(d) if !d.as_os_str().is_empty() => d.display().to_string(),
        _ => return Vec::new(),
    };
    let path = std::env::var("PATH").unwrap_or_default();
    vec![(
        "PATH".into(),
        if path.is_empty() {
            dir
        } else {
            format!("{dir}:{path}")
        },
    )]
}

fn file_name(p: &Path) -> &str {
    p.file_name().and_then(|n| n.to_str()).unwrap_or("")
}

/// The Java expansion service's jars: the `.jar` files of `explicit`
/// (`--java_classpath`), else of `$WEIR_JAVA_EXPANSION_CLASSPATH`, else of
/// `java-expansion/` next to the `weir` binary, else of
/// `java/expansion/target/jars` of the checkout the binary was built in.
///
/// # Errors
/// A named folder that does not exist or holds no jar; no default folder.
pub fn find_java_expansion_classpath(explicit: Option<PathBuf>) -> Result<Vec<PathBuf>, String> {
    let named = explicit.map(|p| (p, "--java_classpath")).or_else(|| {
        std::env::var_os(JAVA_EXPANSION_CLASSPATH_ENV)
            .filter(|v| !v.is_empty())
            .map(|v| (PathBuf::from(v), JAVA_EXPANSION_CLASSPATH_ENV))
    });
    let dir = match named {
        Some((dir, source)) => {
            if !dir.is_dir() {
                return Err(format!(
                    "Java expansion classpath {} (from {source}) is not a folder; run scripts/setup_java.sh",
                    dir.display()
                ));
            }
            dir
        }
        None => {
            let exe = crate::weir_exe();
            let exe_dir = exe.as_deref().and_then(Path::parent);
            exe_dir
                .into_iter()
                .flat_map(|d| [d.join("java-expansion"), d.join("../../java/expansion/target/jars")])
                .find(|c| c.is_dir())
                .ok_or_else(|| {
                    "no Java expansion service jars (java/expansion/target/jars of the checkout, \
                     java-expansion/ next to weir, --java_classpath or $WEIR_JAVA_EXPANSION_CLASSPATH); \
                     run scripts/setup_java.sh"
                        .to_string()
                })?
        }
    };
    let jars = crate::boot::list_jars(&dir)?;
    if jars.is_empty() {
        return Err(format!(
            "{} holds no jar; run scripts/setup_java.sh",
            dir.display()
        ));
    }
    Ok(jars)
}

/// The jar `path` names, or the `.jar` files of the folder it names, sorted.
///
/// # Errors
/// A path that does not exist, a file that is not a `.jar`, a folder with none.
pub fn jars_at(path: &Path) -> Result<Vec<PathBuf>, String> {
    let is_jar = |p: &Path| p.extension().is_some_and(|x| x == "jar");
    if path.is_file() {
        return if is_jar(path) {
            Ok(vec![path.to_path_buf()])
        } else {
            Err(format!("{} is not a .jar file", path.display()))
        };
    }
    let jars = crate::boot::list_jars(path)?;
    if jars.is_empty() {
        return Err(format!("{} holds no jar", path.display()));
    }
    Ok(jars)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jars_at_takes_a_jar_or_a_folders_jars() {
        let dir = std::env::temp_dir().join(format!("weir-jars-at-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        assert!(jars_at(&dir).unwrap_err().contains("holds no jar"));
        std::fs::write(dir.join("b.jar"), "").unwrap();
        std::fs::write(dir.join("a.jar"), "").unwrap();
        std::fs::write(dir.join("notes.txt"), "").unwrap();
        assert_eq!(jars_at(&dir).unwrap(), vec![dir.join("a.jar"), dir.join("b.jar")]);
        assert_eq!(jars_at(&dir.join("a.jar")).unwrap(), vec![dir.join("a.jar")]);
        assert!(jars_at(&dir.join("notes.txt")).unwrap_err().contains("not a .jar"));
        assert!(jars_at(&dir.join("missing")).unwrap_err().contains("cannot read"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    fn java(environment: ExpansionEnvironment) -> ExpansionConfig {
        ExpansionConfig {
            sdk: ExpansionSdk::Java {
                java: "/jdk/bin/java".into(),
                jars: vec![
                    "/x/beam-sdks-java-core-2.71.0.jar".into(),
                    "/x/jamm-0.4.0.jar".into(),
                ],
            },
            environment,
            port: 8097,
            worker_pool_port: Some(5555),
            weir_bin: "/w/weir".into(),
            service_args: Vec::new(),
        }
    }

    /// The user's arguments for the service come last, after Weir's.
    #[test]
    fn service_arguments_follow_weirs() {
        let cfg = ExpansionConfig {
            service_args: vec!["--javaClassLookupAllowlistFile=*".into()],
            ..java(ExpansionEnvironment::Process)
        };
        let launches = plan(&cfg).unwrap();
        let args = &launches[0].args;
        assert_eq!(args[args.len() - 2], r#"--defaultEnvironmentConfig={"command":"/w/weir boot --java"}"#);
        assert_eq!(args[args.len() - 1], "--javaClassLookupAllowlistFile=*");
    }

    #[test]
    fn java_docker_runs_beams_service_with_its_defaults() {
        let launches = plan(&java(ExpansionEnvironment::Docker)).unwrap();
        assert_eq!(launches.len(), 1);
        let args = &launches[0].args;
        let n = args.len();
        assert_eq!(
            &args[n - 4..],
            [
                "-cp",
                "/x/beam-sdks-java-core-2.71.0.jar:/x/jamm-0.4.0.jar",
                JAVA_EXPANSION_MAIN,
                "8097"
            ]
        );
    }

    #[test]
    fn java_process_and_external_set_the_default_environment() {
        let launches = plan(&java(ExpansionEnvironment::Process)).unwrap();
        let args = &launches[0].args;
        assert_eq!(args[args.len() - 2], "--defaultEnvironmentType=PROCESS");
        assert_eq!(
            args[args.len() - 1],
            r#"--defaultEnvironmentConfig={"command":"/w/weir boot --java"}"#
        );

        let launches = plan(&java(ExpansionEnvironment::External)).unwrap();
        assert_eq!(launches.len(), 2);
        assert_eq!(launches[0].role, "worker pool");
        assert!(launches[0]
            .args
            .contains(&"-javaagent:/x/jamm-0.4.0.jar".to_string()));
        assert_eq!(launches[0].args.last().unwrap(), JAVA_WORKER_POOL_MAIN);
        assert!(launches[0].env[0]
            .1
            .contains(r#""defaultEnvironmentConfig":"localhost:5555""#));
        let args = &launches[1].args;
        assert_eq!(
            args[args.len() - 1],
            "--defaultEnvironmentConfig=localhost:5555"
        );
    }

    #[test]
    fn python_service_takes_any_callable_and_the_environment() {
        let cfg = ExpansionConfig {
            sdk: ExpansionSdk::Python {
                python: "/v/bin/python".into(),
            },
            environment: ExpansionEnvironment::Process,
            port: 8098,
            worker_pool_port: None,
            weir_bin: "/w/weir".into(),
            service_args: Vec::new(),
        };
        let launches = plan(&cfg).unwrap();
        assert_eq!(launches.len(), 1);
        assert_eq!(
            launches[0].args,
            [
                "-m",
                "apache_beam.runners.portability.expansion_service_main",
                "-p",
                "8098",
                "--fully_qualified_name_glob=*",
                "--environment_type=PROCESS",
                r#"--environment_config={"command":"/w/weir boot --python /v/bin/python"}"#,
            ]
        );
        let external = ExpansionConfig {
            environment: ExpansionEnvironment::External,
            ..cfg
        };
        let err = plan(&external.clone()).unwrap_err();
        assert!(err.contains("worker pool port"), "{err}");
        let with_pool = ExpansionConfig {
            worker_pool_port: Some(5556),
            ..external
        };
        let launches = plan(&with_pool).unwrap();
        assert_eq!(launches[0].role, "worker pool");
        assert_eq!(launches[0].args[2], "--service_port=5556");
        // The pool runs a literal `python`: the venv's comes first on PATH.
        assert_eq!(launches[0].env[0].0, "PATH");
        assert!(
            launches[0].env[0].1.starts_with("/v/bin:"),
            "{:?}",
            launches[0].env
        );
        assert_eq!(
            launches[1].args.last().unwrap(),
            "--environment_config=localhost:5556"
        );
    }

    #[test]
    fn environments_parse_case_insensitively() {
        assert_eq!(
            "docker".parse::<ExpansionEnvironment>().unwrap(),
            ExpansionEnvironment::Docker
        );
        assert!("LOOPBACK"
            .parse::<ExpansionEnvironment>()
            .unwrap_err()
            .contains("LOOPBACK"));
    }
}
