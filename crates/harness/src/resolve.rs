//! Turning the environments a pipeline names into ones Weir starts:
//! `beam:env:anyof:v1` becomes its first alternative Weir can start (EXTERNAL
//! and PROCESS before DOCKER, as they need no daemon), and without a Docker
//! daemon a `beam:env:docker:v1` naming one of Beam's own SDK images becomes
//! a `beam:env:process:v1` running `weir boot` (native harness).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use prost::Message;
use weir_proto::{beam, urns};

use crate::{HarnessError, Result};

/// The Java harness jars' Beam version that `scripts/setup_java.sh` fetches.
pub const JAVA_HARNESS_VERSION: &str = "2.73.0";

/// What replaces Beam's SDK images when no Docker daemon answers.
#[derive(Clone, Debug)]
pub struct Substitutes {
    /// The `weir` binary whose `boot` starts the native harness.
    pub weir: PathBuf,
    /// The interpreter for `apache/beam_python3.x_sdk` images
    /// (`weir serve --python_for_docker_images`).
    pub python: String,
    /// Whether `docker` works here ([`docker_available`]).
    pub docker: bool,
}

/// Whether the `docker` CLI exists and `docker info` succeeds within 10 s;
/// checked once per process.
pub fn docker_available() -> bool {
    static DOCKER: OnceLock<bool> = OnceLock::new();
    *DOCKER.get_or_init(|| {
        let child = std::process::Command::new("docker")
            .args(["info", "--format", "{{.ServerVersion}}"])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn();
        let Ok(mut child) = child else { return false };
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            match child.try_wait() {
                Ok(Some(status)) => return status.success(),
                Ok(None) if std::time::Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(50))
                }
                _ => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return false;
                }
            }
        }
    })
}

/// The apache-beam version `python` imports (None when it cannot); cached per interpreter.
fn python_beam_version(python: &str) -> Option<String> {
    static VERSIONS: OnceLock<Mutex<HashMap<String, Option<String>>>> = OnceLock::new();
    let cache = VERSIONS.get_or_init(Default::default);
    if let Some(v) = cache.lock().unwrap().get(python) {
        return v.clone();
    }
    let v = std::process::Command::new(python)
        .args(["-c", "import apache_beam; print(apache_beam.__version__)"])
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    cache.lock().unwrap().insert(python.to_string(), v.clone());
    v
}

fn env_error(env_id: &str, urn: &str, message: impl Into<String>) -> HarnessError {
    HarnessError::Environment {
        environment: env_id.to_string(),
        urn: urn.to_string(),
        message: message.into(),
    }
}

/// Beam's SDK images Weir can replace: (`java`?, tag) of
/// `[docker.io/]apache/beam_java<N>_sdk:<tag>` or `apache/beam_python3.<N>_sdk:<tag>`.
fn beam_sdk_image(image: &str) -> Option<(bool, &str)> {
    let image = image.strip_prefix("docker.io/").unwrap_or(image);
    let rest = image.strip_prefix("apache/beam_")?;
    let (name, tag) = rest.split_once(':').unwrap_or((rest, "latest"));
    let name = name.strip_suffix("_sdk")?;
    let digits = |s: &str| !s.is_empty() && s.chars().all(|c| c.is_ascii_digit());
    if name.strip_prefix("java").is_some_and(digits) {
        Some((true, tag))
    } else if name.strip_prefix("python3.").is_some_and(digits) {
        Some((false, tag))
    } else {
        None
    }
}

/// Rank of an ANYOF alternative: what needs no daemon first.
fn preference(urn: &str) -> usize {
    match urn {
        urns::env::EXTERNAL => 0,
        urns::env::PROCESS => 1,
        urns::env::DOCKER => 2,
        _ => 3,
    }
}

/// The environment Weir starts for `env`, and notes for the job's messages.
///
/// # Errors
/// [`HarnessError::Environment`] naming the environment, URN and (for
/// DOCKER without a daemon) the image, when Weir cannot start it.
pub fn resolve(
    env_id: &str,
    env: &beam::Environment,
    subs: &Substitutes,
) -> Result<(beam::Environment, Vec<String>)> {
    match env.urn.as_str() {
        urns::env::ANYOF => {
            let p = beam::AnyOfEnvironmentPayload::decode(env.payload.as_slice())
                .map_err(|e| env_error(env_id, &env.urn, e.to_string()))?;
            let mut order: Vec<usize> = (0..p.environments.len()).collect();
            order.sort_by_key(|&i| preference(&p.environments[i].urn));
            let mut refused = Vec::new();
            for i in order {
                let alt = &p.environments[i];
                if alt.urn == urns::env::ANYOF {
                    // One level of alternatives: a client's ANYOF nested in
                    // ANYOF... would otherwise recurse as deep as it likes.
                    refused.push(format!(
                        "alternative {} ({}): an ANYOF inside an ANYOF (Weir takes one level of alternatives)",
                        i + 1,
                        alt.urn
                    ));
                    continue;
                }
                match resolve(env_id, alt, subs).and_then(|(e, notes)| {
                    crate::environment::validate(env_id, &e).map(|_| (e, notes))
                }) {
                    Ok((chosen, mut notes)) => {
                        notes.insert(
                            0,
                            format!(
                                "environment {env_id} ({}): chose alternative {} of {} ({})",
                                urns::env::ANYOF,
                                i + 1,
                                p.environments.len(),
                                alt.urn
                            ),
                        );
                        return Ok((chosen, notes));
                    }
                    Err(e) => refused.push(format!("alternative {} ({}): {e}", i + 1, alt.urn)),
                }
            }
            Err(env_error(
                env_id,
                &env.urn,
                format!("no alternative Weir can start: [{}]", refused.join("; ")),
            ))
        }
        urns::env::DOCKER if !subs.docker => {
            let p = beam::DockerPayload::decode(env.payload.as_slice())
                .map_err(|e| env_error(env_id, &env.urn, e.to_string()))?;
            let image = p.container_image;
            let Some((java, tag)) = beam_sdk_image(&image) else {
                return Err(env_error(
                    env_id,
                    &env.urn,
                    format!(
                        "image {image} cannot be run: no Docker daemon answers (`docker info` failed), \
                         and only Beam's SDK images (apache/beam_java*_sdk, apache/beam_python3.*_sdk) \
                         are replaced by native harnesses"
                    ),
                ));
            };
            let weir = subs.weir.display().to_string();
            let (command, version_note) = if java {
                let found = crate::boot::find_java_harness_classpath(None)
                    .map_err(|e| env_error(env_id, &env.urn, format!("image {image}: {e}")))?;
                if found.is_none() {
                    return Err(env_error(
                        env_id,
                        &env.urn,
                        format!(
                            "image {image} cannot be run: no Docker daemon answers and no Java harness \
                             jars were found (run scripts/setup_java.sh)"
                        ),
                    ));
                }
                let note = (tag != JAVA_HARNESS_VERSION).then(|| {
                    format!(
                        "image {image} asks for Beam {tag}, the Java harness jars are Beam {JAVA_HARNESS_VERSION}"
                    )
                });
                (format!("{weir} boot --java"), note)
            } else {
                let note = match python_beam_version(&subs.python) {
                    Some(v) if v == tag => None,
                    Some(v) => Some(format!(
                        "WARNING: image {image} asks for apache-beam {tag}, {} has apache-beam {v}; \
                         the harness runs with {v}",
                        subs.python
                    )),
                    None => {
                        return Err(env_error(
                            env_id,
                            &env.urn,
                            format!(
                                "image {image} cannot be run: no Docker daemon answers and {} cannot \
                                 import apache_beam (set weir serve --python_for_docker_images)",
                                subs.python
                            ),
                        ))
                    }
                };
                (format!("{weir} boot --python {}", subs.python), note)
            };
            let mut notes = vec![format!(
                "environment {env_id}: no Docker daemon answers; image {image} is replaced by a \
                 native harness: {command}"
            )];
            notes.extend(version_note);
            let chosen = beam::Environment {
                urn: urns::env::PROCESS.into(),
                payload: beam::ProcessPayload {
                    command,
                    ..Default::default()
                }
                .encode_to_vec(),
                ..env.clone()
            };
            Ok((chosen, notes))
        }
        _ => Ok((env.clone(), vec![])),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn docker(image: &str) -> beam::Environment {
        beam::Environment {
            urn: urns::env::DOCKER.into(),
            payload: beam::DockerPayload {
                container_image: image.into(),
            }
            .encode_to_vec(),
            capabilities: vec!["cap".into()],
            ..Default::default()
        }
    }

    fn external(url: &str) -> beam::Environment {
        beam::Environment {
            urn: urns::env::EXTERNAL.into(),
            payload: beam::ExternalPayload {
                endpoint: Some(beam::ApiServiceDescriptor {
                    url: url.into(),
                    ..Default::default()
                }),
                ..Default::default()
            }
            .encode_to_vec(),
            ..Default::default()
        }
    }

    fn subs(docker: bool) -> Substitutes {
        Substitutes {
            weir: "/bin/weir".into(),
            python: "python-that-does-not-exist".into(),
            docker,
        }
    }

    #[test]
    fn beam_sdk_images_are_recognised() {
        assert_eq!(
            beam_sdk_image("apache/beam_java17_sdk:2.73.0"),
            Some((true, "2.73.0"))
        );
        assert_eq!(
            beam_sdk_image("docker.io/apache/beam_python3.11_sdk:2.77.0"),
            Some((false, "2.77.0"))
        );
        assert_eq!(beam_sdk_image("apache/beam_go_sdk:2.77.0"), None);
        assert_eq!(beam_sdk_image("example.com/nope:1"), None);
    }

    #[test]
    fn docker_with_a_daemon_is_kept_and_other_images_without_one_are_refused_by_name() {
        let env = docker("example.com/nope:1");
        assert_eq!(
            resolve("e", &env, &subs(true)).unwrap(),
            (env.clone(), vec![])
        );
        let err = resolve("e", &env, &subs(false)).unwrap_err().to_string();
        assert!(
            err.contains("image example.com/nope:1 cannot be run"),
            "{err}"
        );
        let err = resolve(
            "e",
            &docker("apache/beam_python3.11_sdk:2.77.0"),
            &subs(false),
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("python-that-does-not-exist cannot import apache_beam"),
            "{err}"
        );
    }

    #[test]
    fn anyof_prefers_what_needs_no_daemon_and_says_so() {
        let any = beam::Environment {
            urn: urns::env::ANYOF.into(),
            payload: beam::AnyOfEnvironmentPayload {
                environments: vec![docker("example.com/nope:1"), external("localhost:5")],
            }
            .encode_to_vec(),
            ..Default::default()
        };
        let (chosen, notes) = resolve("e", &any, &subs(true)).unwrap();
        assert_eq!(chosen, external("localhost:5"));
        assert_eq!(
            notes,
            vec!["environment e (beam:env:anyof:v1): chose alternative 2 of 2 (beam:env:external:v1)"]
        );
        let none = beam::Environment {
            urn: urns::env::ANYOF.into(),
            payload: beam::AnyOfEnvironmentPayload {
                environments: vec![docker("example.com/nope:1"), external("")],
            }
            .encode_to_vec(),
            ..Default::default()
        };
        let err = resolve("e", &none, &subs(false)).unwrap_err().to_string();
        assert!(err.contains("no alternative Weir can start"), "{err}");
        assert!(err.contains("example.com/nope:1"), "{err}");
    }
    /// A chain of ANYOF environments, each the only alternative of the one
    /// before (5,000 deep), is refused without recursing.
    #[test]
    fn nested_anyof_is_refused_at_the_first_level() {
        let mut env = external("localhost:5");
        for _ in 0..5_000 {
            env = beam::Environment {
                urn: urns::env::ANYOF.into(),
                payload: beam::AnyOfEnvironmentPayload {
                    environments: vec![env],
                }
                .encode_to_vec(),
                ..Default::default()
            };
        }
        let err = resolve("deep", &env, &subs(true)).unwrap_err().to_string();
        assert!(err.contains("environment deep"), "{err}");
        assert!(err.contains("an ANYOF inside an ANYOF"), "{err}");
    }
}
