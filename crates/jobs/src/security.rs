//! Who may submit, and what a submitted job may make Weir run: the Job API
//! token, the policy for binding a non-loopback address, and the operator's
//! allowlist of PROCESS commands and DOCKER images.
//!
//! The model (README, "Security model"): a Job API client can run code as
//! Weir's user (that is what a PROCESS or DOCKER environment is), so the Job
//! API is open only on loopback unless the operator picks a policy (a token,
//! or `--insecure_allow_remote`), and environments may start only the
//! commands and images the operator allows. The Fn API is not token-checked:
//! SDK harnesses do not send one; its calls are tied to unguessable worker
//! and instruction ids instead (see `weir_harness::services`).

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use prost::Message;
use weir_proto::{beam, urns};

/// The gRPC metadata key carrying the Job API token, as
/// `authorization: Bearer <token>` (a bare `<token>` is accepted too).
pub const TOKEN_HEADER: &str = "authorization";

/// What the operator allows; built by `weir serve` from its flags.
#[derive(Clone, Default)]
pub struct Security {
    /// The Job API token (`--auth_token` / `--auth_token_file`): when set,
    /// every Job API and artifact staging call must carry it.
    pub token: Option<Arc<str>>,
    /// Extra PROCESS commands allowed (`--allow_process_command`): a
    /// pattern matches the command's program (its first word) or the whole
    /// command; `*` matches any run of characters.
    pub process_commands: Vec<String>,
    /// Extra DOCKER images allowed (`--allow_docker_image`), same patterns.
    pub docker_images: Vec<String>,
    /// The `weir` binary serving (its `weir boot …` commands are always
    /// allowed); `None` allows none of them (tests).
    pub weir_binary: Option<PathBuf>,
}

impl std::fmt::Debug for Security {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Security")
            .field("token", &self.token.as_ref().map(|_| "<set>"))
            .field("process_commands", &self.process_commands)
            .field("docker_images", &self.docker_images)
            .field("weir_binary", &self.weir_binary)
            .finish()
    }
}

/// Whether `text` matches `pattern`, where `*` matches any characters.
pub fn glob_match(pattern: &str, text: &str) -> bool {
    let mut parts = pattern.split('*');
    let first = parts.next().unwrap_or("");
    let Some(mut rest) = text.strip_prefix(first) else {
        return false;
    };
    let parts: Vec<&str> = parts.collect();
    let Some((last, middle)) = parts.split_last() else {
        return rest.is_empty();
    };
    for p in middle {
        match rest.find(p) {
            Some(i) => rest = &rest[i + p.len()..],
            None => return false,
        }
    }
    rest.len() >= last.len() && rest.ends_with(last)
}

/// Beam's own SDK images: `[docker.io/]apache/beam_<sdk>_sdk[:tag]`.
fn beam_sdk_image(image: &str) -> bool {
    let image = image.strip_prefix("docker.io/").unwrap_or(image);
    let name = image.split_once(':').map_or(image, |(n, _)| n);
    name.strip_prefix("apache/beam_")
        .and_then(|n| n.strip_suffix("_sdk"))
        .is_some_and(|sdk| {
            !sdk.is_empty()
                && sdk
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '.' || c == '_')
        })
}

fn same_file(a: &Path, b: &Path) -> bool {
    match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    }
}

impl Security {
    /// Checks the Job API token of a request.
    ///
    /// # Errors
    /// UNAUTHENTICATED when a token is required and the request's is missing
    /// or wrong (the message never echoes it).
    pub fn check_token<T>(&self, request: &tonic::Request<T>) -> Result<(), tonic::Status> {
        let Some(want) = &self.token else {
            return Ok(());
        };
        let got = request
            .metadata()
            .get(TOKEN_HEADER)
            .and_then(|v| v.to_str().ok())
            .map(|v| v.strip_prefix("Bearer ").unwrap_or(v).trim());
        match got {
            Some(got) if constant_time_eq(got.as_bytes(), want.as_bytes()) => Ok(()),
            Some(_) => Err(tonic::Status::unauthenticated(
                "wrong Job API token (the `authorization: Bearer <token>` metadata)",
            )),
            None => Err(tonic::Status::unauthenticated(
                "this Weir server needs a Job API token: send `authorization: Bearer <token>` metadata (`weir jobs --auth_token`, WeirRunner's --weirAuthToken, python -m weir_auth; see the README's security model)",
            )),
        }
    }

    /// Whether `got` (a presented token, if any) lets a caller in: always
    /// when no token is set; else only the token itself (compared in
    /// constant time).
    pub fn token_matches(&self, got: Option<&str>) -> bool {
        match (&self.token, got) {
            (None, _) => true,
            (Some(want), Some(got)) => constant_time_eq(got.trim().as_bytes(), want.as_bytes()),
            (Some(_), None) => false,
        }
    }

    /// Checks that an environment Weir is about to start (after
    /// `beam:env:anyof:v1` and DOCKER substitution) runs an allowed PROCESS
    /// command or DOCKER image. EXTERNAL environments start nothing here.
    ///
    /// # Errors
    /// The message names the environment and the refused command or image,
    /// and the flag that would allow it.
    pub fn check_environment(&self, env_id: &str, env: &beam::Environment) -> Result<(), String> {
        match env.urn.as_str() {
            urns::env::PROCESS => {
                let p = beam::ProcessPayload::decode(env.payload.as_slice())
                    .map_err(|e| format!("environment {env_id}: bad ProcessPayload: {e}"))?;
                if self.process_allowed(&p.command) {
                    Ok(())
                } else {
                    Err(format!(
                        "environment {env_id}: PROCESS command {:?} is not allowed on this server (allowed: this server's own `weir boot` commands and the operator's --allow_process_command patterns{})",
                        p.command,
                        list(&self.process_commands)
                    ))
                }
            }
            urns::env::DOCKER => {
                let p = beam::DockerPayload::decode(env.payload.as_slice())
                    .map_err(|e| format!("environment {env_id}: bad DockerPayload: {e}"))?;
                if self.image_allowed(&p.container_image) {
                    Ok(())
                } else {
                    Err(format!(
                        "environment {env_id}: DOCKER image {:?} is not allowed on this server (allowed: Beam's SDK images apache/beam_*_sdk and the operator's --allow_docker_image patterns{})",
                        p.container_image,
                        list(&self.docker_images)
                    ))
                }
            }
            _ => Ok(()),
        }
    }

    /// Whether a PROCESS `command` may run: this server's `weir boot …`, or
    /// a command whose program (or whole text) matches an operator pattern.
    pub fn process_allowed(&self, command: &str) -> bool {
        let mut words = command.split_whitespace();
        let program = words.next().unwrap_or("");
        if let Some(weir) = &self.weir_binary {
            if words.next() == Some("boot") && same_file(Path::new(program), weir) {
                return true;
            }
        }
        self.process_commands
            .iter()
            .any(|p| glob_match(p, program) || glob_match(p, command.trim()))
    }

    /// Whether a DOCKER image may run: Beam's SDK images, or an operator pattern.
    pub fn image_allowed(&self, image: &str) -> bool {
        beam_sdk_image(image) || self.docker_images.iter().any(|p| glob_match(p, image))
    }
}

fn list(patterns: &[String]) -> String {
    if patterns.is_empty() {
        String::new()
    } else {
        format!(": {}", patterns.join(", "))
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Whether `weir serve` may listen on `ip`: always on loopback; elsewhere
/// only with a token or the operator's explicit `--insecure_allow_remote`.
///
/// # Errors
/// The reason, naming the address and the flags that choose a policy.
pub fn check_bind(
    ip: IpAddr,
    security: &Security,
    insecure_allow_remote: bool,
) -> Result<(), String> {
    if ip.is_loopback() || security.token.is_some() || insecure_allow_remote {
        return Ok(());
    }
    Err(format!(
        "refusing to serve on {ip}, which is not a loopback address, without an access policy: anyone who reaches the Job API can run commands as this user. Pick one: --auth_token TOKEN or --auth_token_file FILE (clients then send `authorization: Bearer TOKEN`), or --insecure_allow_remote to serve without one (TLS client certificates are not supported yet)"
    ))
}

/// A tonic interceptor requiring the Job API token on every call.
#[derive(Clone)]
pub struct RequireToken(pub Arc<Security>);

impl tonic::service::Interceptor for RequireToken {
    fn call(&mut self, request: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        self.0.check_token(&request)?;
        Ok(request)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn process(command: &str) -> beam::Environment {
        beam::Environment {
            urn: urns::env::PROCESS.into(),
            payload: beam::ProcessPayload {
                command: command.into(),
                ..Default::default()
            }
            .encode_to_vec(),
            ..Default::default()
        }
    }

    fn docker(image: &str) -> beam::Environment {
        beam::Environment {
            urn: urns::env::DOCKER.into(),
            payload: beam::DockerPayload {
                container_image: image.into(),
            }
            .encode_to_vec(),
            ..Default::default()
        }
    }

    #[test]
    fn globs() {
        assert!(glob_match("*", "anything at all"));
        assert!(glob_match("/opt/go/bin/*", "/opt/go/bin/beam-go-boot"));
        assert!(!glob_match("/opt/go/bin/*", "/usr/bin/sh"));
        assert!(glob_match("/tmp/*/boot.sh", "/tmp/x/y/boot.sh"));
        assert!(!glob_match("/tmp/*/boot.sh", "/tmp/x/boot.shx"));
        assert!(glob_match("exact", "exact"));
        assert!(!glob_match("exact", "exactly"));
        assert!(glob_match("a*a", "aa") && !glob_match("a*a", "a"));
    }

    #[test]
    fn only_weir_boot_and_allowed_commands_run() {
        let exe = std::env::current_exe().unwrap();
        let security = Security {
            weir_binary: Some(exe.clone()),
            process_commands: vec!["/opt/beam/*".into()],
            ..Default::default()
        };
        let boot = format!("{} boot --python /usr/bin/python3", exe.display());
        assert_eq!(security.check_environment("py", &process(&boot)), Ok(()));
        // The same binary without `boot` is not a boot command.
        let serve = format!("{} serve --job_port 1", exe.display());
        assert!(security.check_environment("py", &process(&serve)).is_err());
        assert_eq!(
            security.check_environment("go", &process("/opt/beam/beam-go-boot")),
            Ok(())
        );
        let e = security
            .check_environment("evil", &process("/bin/sh -c 'curl x | sh'"))
            .unwrap_err();
        assert_eq!(
            e,
            "environment evil: PROCESS command \"/bin/sh -c 'curl x | sh'\" is not allowed on this server (allowed: this server's own `weir boot` commands and the operator's --allow_process_command patterns: /opt/beam/*)"
        );
        // Another binary named weir is not this server's.
        let e = security
            .check_environment("fake", &process("/tmp/weir boot --python x"))
            .unwrap_err();
        assert!(e.contains("\"/tmp/weir boot --python x\""), "{e}");
    }

    #[test]
    fn beam_sdk_images_and_allowed_images_run() {
        let security = Security {
            docker_images: vec!["registry.example/team/*".into()],
            ..Default::default()
        };
        for ok in [
            "apache/beam_python3.11_sdk:2.77.0",
            "docker.io/apache/beam_java17_sdk:2.73.0",
            "apache/beam_go_sdk",
            "registry.example/team/sdk:1",
        ] {
            assert_eq!(security.check_environment("e", &docker(ok)), Ok(()), "{ok}");
        }
        for bad in [
            "alpine",
            "apache/beam_python3.11_sdk/../evil",
            "evil/apache/beam_x_sdk",
        ] {
            let e = security.check_environment("e", &docker(bad)).unwrap_err();
            assert!(
                e.contains(&format!("DOCKER image {bad:?} is not allowed")),
                "{e}"
            );
        }
    }

    #[test]
    fn tokens_are_checked() {
        let open = Security::default();
        assert!(open.check_token(&tonic::Request::new(())).is_ok());
        let closed = Security {
            token: Some("s3cret".into()),
            ..Default::default()
        };
        let with = |v: &str| {
            let mut r = tonic::Request::new(());
            r.metadata_mut().insert(TOKEN_HEADER, v.parse().unwrap());
            r
        };
        assert!(closed.check_token(&with("Bearer s3cret")).is_ok());
        assert!(closed.check_token(&with("s3cret")).is_ok());
        let e = closed.check_token(&with("Bearer nope")).unwrap_err();
        assert_eq!(e.code(), tonic::Code::Unauthenticated);
        assert!(!e.message().contains("nope"));
        let e = closed.check_token(&tonic::Request::new(())).unwrap_err();
        assert_eq!(e.code(), tonic::Code::Unauthenticated);
    }

    #[test]
    fn remote_binds_need_a_policy() {
        let none = Security::default();
        let token = Security {
            token: Some("t".into()),
            ..Default::default()
        };
        let lo: IpAddr = "127.0.0.1".parse().unwrap();
        let any: IpAddr = "0.0.0.0".parse().unwrap();
        assert!(check_bind(lo, &none, false).is_ok());
        assert!(check_bind("::1".parse().unwrap(), &none, false).is_ok());
        let e = check_bind(any, &none, false).unwrap_err();
        assert!(e.starts_with("refusing to serve on 0.0.0.0"), "{e}");
        assert!(check_bind(any, &token, false).is_ok());
        assert!(check_bind(any, &none, true).is_ok());
    }
}
