//! `weir boot`: a boot command for `beam:env:process:v1` Python and Java SDK
//! harnesses without Docker or Beam's Go boot binaries.
//!
//! Follows Beam's container contract: called as `<command> --id=<worker id>
//! --provision_endpoint=<host:port>`, it fetches the provision info, stages
//! the job's artifacts into `<semi-persistent dir>/staged/`, then replaces
//! itself with the SDK harness:
//!
//! - **Python**: `python -m apache_beam.runners.worker.sdk_worker_main`, with
//!   the environment that module reads (`WORKER_ID`, `PIPELINE_OPTIONS`,
//!   `CONTROL_API_SERVICE_DESCRIPTOR`, `LOGGING_API_SERVICE_DESCRIPTOR`,
//!   `SEMI_PERSISTENT_DIRECTORY`, `RUNNER_CAPABILITIES`). The packages the
//!   job staged for its workers (`--requirements_file`, `--extra_package`,
//!   `--setup_file`) are pip-installed first, as Beam's Python container
//!   boot does, but into the worker's own folder rather than the
//!   interpreter's environment ([`install_python_packages`]).
//! - **Java** (`weir boot --java`, the contract of Beam's Java container boot):
//!   `java` with `org.apache.beam.fn.harness.FnHarness` as main class, the
//!   options written as JSON to `<semi>/pipeline_options.json`
//!   (`PIPELINE_OPTIONS_FILE`), `HARNESS_ID`, the service descriptors and
//!   `RUNNER_CAPABILITIES` in the environment, a classpath of the harness jars
//!   (slf4j and its bridges first, then `beam-sdks-java-harness`, then its
//!   dependencies) followed by the staged jars in the order the provision info
//!   lists them, jamm as `-javaagent`, and the container's JVM flags. The
//!   harness jars are a folder ([`find_java_harness_classpath`]) that
//!   `scripts/setup_java.sh` fills from `java/harness/pom.xml`
//!   (`beam-sdks-java-harness` 2.73.0 and its runtime dependencies); when the
//!   staged jars hold a `beam-sdks-java-harness` of their own (an expansion
//!   service's environment), that one runs and the folder adds only logging
//!   jars and jamm.

use std::path::{Path, PathBuf};

use futures::StreamExt;
use prost::Message;
use tonic::metadata::MetadataValue;
use weir_proto::{beam, prost_types, urns, MAX_GRPC_MESSAGE_BYTES};

/// Main module of Beam's Python SDK harness (`python -m`).
pub const PYTHON_HARNESS_MODULE: &str = "apache_beam.runners.worker.sdk_worker_main";

/// File in the semi-persistent folder holding the pid of a Python SDK
/// harness forked by the fork server (`crate::fork_server`): not a child of
/// `weir boot`, it is found for the job's resource figures through this.
pub const HARNESS_PID_FILE: &str = "harness.pid";

/// Environment variable by which Weir gives `weir boot` the folder a
/// Python SDK harness works in: Weir's own working folder, so that a
/// pipeline's relative paths (`--input lear.txt`) mean what they mean to
/// Prism's and DirectRunner's harnesses. `weir boot` itself works in the
/// worker's folder, and the harness still keeps its files in its
/// semi-persistent folder.
pub const HARNESS_CWD_ENV: &str = "WEIR_HARNESS_CWD";

/// The pid in [`HARNESS_PID_FILE`] of the semi-persistent folder `dir`;
/// `None` when no harness was forked for it (no file, or not a pid).
pub fn forked_harness_pid(dir: &Path) -> Option<u32> {
    std::fs::read_to_string(dir.join(HARNESS_PID_FILE)).ok()?.trim().parse().ok()
}

/// What `weir boot` was told.
#[derive(Clone, Debug)]
pub struct BootConfig {
    pub worker_id: String,
    pub provision_endpoint: String,
    /// Where artifacts and the pickled main session go (default: a temp dir per worker).
    pub semi_persistent_directory: Option<PathBuf>,
    /// Which SDK harness to start.
    pub sdk: Sdk,
}

/// The SDK harness `weir boot` starts.
#[derive(Clone, Debug)]
pub enum Sdk {
    /// `python -m apache_beam.runners.worker.sdk_worker_main`.
    Python {
        /// Python interpreter with apache-beam installed.
        python: String,
    },
    /// `java ... org.apache.beam.fn.harness.FnHarness`.
    Java {
        /// The `java` launcher.
        java: String,
        /// Folder of the harness jars (see [`find_java_harness_classpath`]);
        /// `None`: the staged jars must hold the harness themselves.
        harness_classpath: Option<PathBuf>,
    },
    /// The job's staged Go worker binary (`--worker=true`), as Beam's Go
    /// container boot runs it, but from the worker's folder (no copy left
    /// in /tmp) and in Weir's working folder (`HARNESS_CWD_ENV`), so a
    /// pipeline's relative paths mean what they mean to its client.
    Go,
}

/// Environment variable naming the Java harness jar folder.
pub const JAVA_HARNESS_CLASSPATH_ENV: &str = "WEIR_JAVA_HARNESS_CLASSPATH";

/// Main class of Beam's Java SDK harness.
pub const JAVA_HARNESS_MAIN: &str = "org.apache.beam.fn.harness.FnHarness";

/// The folder of Java harness jars: `explicit` (`--java_harness_classpath`),
/// else `$WEIR_JAVA_HARNESS_CLASSPATH`, else `java-harness/` next to the
/// `weir` binary, else `java/harness/target/jars` of the checkout the binary
/// was built in (`<repo>/target/<profile>/weir`). `Ok(None)` when none of the
/// defaults exists.
///
/// # Errors
/// A folder named by the flag or the variable that does not exist.
pub fn find_java_harness_classpath(explicit: Option<PathBuf>) -> Result<Option<PathBuf>, String> {
    let named = explicit
        .map(|p| (p, "--java_harness_classpath"))
        .or_else(|| {
            std::env::var_os(JAVA_HARNESS_CLASSPATH_ENV)
                .filter(|v| !v.is_empty())
                .map(|v| (PathBuf::from(v), JAVA_HARNESS_CLASSPATH_ENV))
        });
    if let Some((dir, source)) = named {
        if dir.is_dir() {
            return Ok(Some(dir));
        }
        return Err(format!(
            "Java harness classpath {} (from {source}) is not a folder; run scripts/setup_java.sh",
            dir.display()
        ));
    }
    let exe = crate::weir_exe();
    let exe_dir = exe.as_deref().and_then(Path::parent);
    let candidates = exe_dir.into_iter().flat_map(|d| {
        [
            d.join("java-harness"),
            d.join("../../java/harness/target/jars"),
        ]
    });
    for c in candidates {
        if c.is_dir() {
            return Ok(Some(c.canonicalize().unwrap_or(c)));
        }
    }
    Ok(None)
}

/// Converts a protobuf `Struct` (pipeline options) to JSON.
pub fn struct_to_json(s: &prost_types::Struct) -> serde_json::Value {
    serde_json::Value::Object(
        s.fields
            .iter()
            .map(|(k, v)| (k.clone(), value_to_json(v)))
            .collect(),
    )
}

fn value_to_json(v: &prost_types::Value) -> serde_json::Value {
    use prost_types::value::Kind;
    match &v.kind {
        None | Some(Kind::NullValue(_)) => serde_json::Value::Null,
        // A whole number is written without a fraction, as protojson (Beam's
        // own boot) writes it: Go sends `parallelism` as the number -1, and
        // Python's argparse refuses "-1.0" for an int option.
        // (Every whole f64 in [-2^63, 2^63) converts to i64 exactly.)
        Some(Kind::NumberValue(n)) if n.fract() == 0.0 && (-9.223_372_036_854_775_808e18..9.223_372_036_854_775_808e18).contains(n) => {
            serde_json::Value::Number((*n as i64).into())
        }
        Some(Kind::NumberValue(n)) => serde_json::Number::from_f64(*n)
            .map(serde_json::Value::Number)
            .unwrap_or(serde_json::Value::Null),
        Some(Kind::StringValue(s)) => serde_json::Value::String(s.clone()),
        Some(Kind::BoolValue(b)) => serde_json::Value::Bool(*b),
        Some(Kind::StructValue(s)) => struct_to_json(s),
        Some(Kind::ListValue(l)) => {
            serde_json::Value::Array(l.values.iter().map(value_to_json).collect())
        }
    }
}

fn with_worker<T>(msg: T, worker_id: &str) -> Result<tonic::Request<T>, String> {
    let mut req = tonic::Request::new(msg);
    let v = MetadataValue::try_from(worker_id).map_err(|e| format!("bad worker id: {e}"))?;
    req.metadata_mut().insert("worker_id", v);
    Ok(req)
}

/// Fetches provision info and artifacts, then execs the SDK harness.
/// Returns only on failure.
pub async fn boot(cfg: BootConfig) -> Result<std::convert::Infallible, String> {
    let info = provision(&cfg).await?;
    let semi = cfg
        .semi_persistent_directory
        .clone()
        .unwrap_or_else(|| std::env::temp_dir().join(default_semi_name(&cfg.worker_id)));
    let staged_dir = semi.join("staged");
    let staged = stage_artifacts(&cfg, &info, &staged_dir).await?;
    let cmd = match &cfg.sdk {
        Sdk::Python { python } => {
            // In a file, not the PIPELINE_OPTIONS variable: one environment
            // string over 128 KiB (a large option) fails exec with E2BIG.
            let options_file = write_options(&info, &semi)?;
            let mut cmd = python_command(python, &cfg, &info, &semi, &options_file);
            in_harness_folder(&mut cmd);
            let installs = python_installs(&staged, &staged_dir)?;
            let installed = !installs.is_empty();
            if installed {
                let prefix = semi.join("packages");
                let sites = install_python_packages(python, &installs, &staged_dir, &prefix)?;
                prepend_paths(&mut cmd, "PYTHONPATH", &sites);
                prepend_paths(&mut cmd, "PATH", &[prefix.join("bin")]);
            }
            // The fork server's interpreter has imported Beam and its
            // dependencies already: a job that installs packages of its own
            // (perhaps other versions of those) gets a fresh interpreter.
            let socket = std::env::var_os(crate::fork_server::SOCKET_ENV);
            cmd.env_remove(crate::fork_server::SOCKET_ENV);
            // A fork server that is neither serving nor starting has exited
            // (an interpreter without Beam, say): the interpreter's own
            // error then comes first, not the missing socket.
            if let Some(socket) = socket.filter(|s| !installed && crate::fork_server::available(Path::new(s))) {
                // Returns only when the fork server cannot take it.
                let why = crate::fork_server::run_forked(
                    Path::new(&socket),
                    &cmd,
                    &semi.join(HARNESS_PID_FILE),
                );
                eprintln!("weir boot: no Python fork server took this harness ({why}); starting {python} directly");
            }
            cmd
        }
        Sdk::Go => {
            let worker = go_worker_binary(&staged)?;
            #[cfg(unix)]
            {
                use std::os::unix::fs::PermissionsExt;
                std::fs::set_permissions(&worker, std::fs::Permissions::from_mode(0o755))
                    .map_err(|e| format!("cannot make {} executable: {e}", worker.display()))?;
            }
            let options_file = write_options(&info, &semi)?;
            let mut cmd = go_command(&worker, &cfg, &info, &semi, &options_file);
            cmd.env_remove(crate::fork_server::SOCKET_ENV);
            in_harness_folder(&mut cmd);
            cmd
        }
        Sdk::Java {
            java,
            harness_classpath,
        } => {
            let harness = match harness_classpath {
                Some(dir) => list_jars(dir)?,
                None => Vec::new(),
            };
            let staged: Vec<PathBuf> = staged.into_iter().map(|a| a.path).collect();
            let harness = harness_jars_beside(harness, &staged);
            let has_harness = harness
                .iter()
                .chain(&staged)
                .any(|p| file_name(p).starts_with("beam-sdks-java-harness"));
            if !has_harness {
                return Err(format!(
                    "no Java SDK harness jar: found no Java harness classpath (--java_harness_classpath, \
                     ${JAVA_HARNESS_CLASSPATH_ENV}, java-harness/ next to weir, or \
                     java/harness/target/jars of the checkout; run scripts/setup_java.sh) and no \
                     staged beam-sdks-java-harness jar"
                ));
            }
            let options_file = write_options(&info, &semi)?;
            let spec = JavaSpec {
                harness_jars: order_harness_jars(harness),
                staged_jars: staged,
                options_file,
                max_heap_mb: total_memory_mb().map(|mb| mb * 7 / 10),
            };
            java_command(java, &spec, &cfg, &info)
        }
    };
    exec(cmd)
}

/// Runs `cmd` in the folder Weir names in [`HARNESS_CWD_ENV`] (when it is
/// one), without passing the variable on.
fn in_harness_folder(cmd: &mut std::process::Command) {
    cmd.env_remove(HARNESS_CWD_ENV);
    if let Some(dir) = std::env::var_os(HARNESS_CWD_ENV).filter(|d| Path::new(d).is_dir()) {
        cmd.current_dir(dir);
    }
}

/// The Go worker binary among the staged artifacts, as Beam's Go boot finds
/// it: the only artifact, else the one whose role is
/// `beam:artifact:role:go_worker_binary:v1`, else the one named `worker`.
fn go_worker_binary(staged: &[Staged]) -> Result<PathBuf, String> {
    match staged {
        [] => Err("the job staged no artifacts: no Go worker binary (--worker_binary)".into()),
        [only] => Ok(only.path.clone()),
        _ => staged
            .iter()
            .find(|a| a.role == urns::artifact::ROLE_GO_WORKER_BINARY)
            .or_else(|| staged.iter().find(|a| file_name(&a.path) == "worker"))
            .map(|a| a.path.clone())
            .ok_or_else(|| "no staged artifact is the Go worker binary (role go_worker_binary, or named worker)".into()),
    }
}

/// The Go worker's command line: Beam's Go container contract (`--worker`,
/// `--id`, the logging and control endpoints as `host:port`,
/// `--semi_persist_dir`) and its environment (`PIPELINE_OPTIONS_FILE`,
/// `RUNNER_CAPABILITIES`, `STATUS_ENDPOINT` when there is one).
fn go_command(worker: &Path, cfg: &BootConfig, info: &beam::ProvisionInfo, semi: &Path, options_file: &Path) -> std::process::Command {
    let url = |d: &Option<beam::ApiServiceDescriptor>| {
        d.as_ref().map(|d| d.url.clone()).filter(|u| !u.is_empty()).unwrap_or_else(|| cfg.provision_endpoint.clone())
    };
    let mut cmd = std::process::Command::new(worker);
    cmd.arg("--worker=true")
        .arg(format!("--id={}", cfg.worker_id))
        .arg(format!("--logging_endpoint={}", url(&info.logging_endpoint)))
        .arg(format!("--control_endpoint={}", url(&info.control_endpoint)))
        .arg(format!("--semi_persist_dir={}", semi.display()))
        .env("PIPELINE_OPTIONS_FILE", options_file)
        .env("RUNNER_CAPABILITIES", info.runner_capabilities.join(" "));
    if let Some(status) = info.status_endpoint.as_ref().filter(|d| !d.url.is_empty()) {
        cmd.env("STATUS_ENDPOINT", &status.url);
    }
    cmd
}

async fn provision(cfg: &BootConfig) -> Result<beam::ProvisionInfo, String> {
    let mut provision = beam::provision_service_client::ProvisionServiceClient::connect(
        weir_proto::grpc_uri(&cfg.provision_endpoint),
    )
    .await
    .map_err(|e| {
        format!(
            "cannot reach provision endpoint {}: {e}",
            cfg.provision_endpoint
        )
    })?
    .max_decoding_message_size(MAX_GRPC_MESSAGE_BYTES);
    provision
        .get_provision_info(with_worker(
            beam::GetProvisionInfoRequest {},
            &cfg.worker_id,
        )?)
        .await
        .map_err(|e| format!("GetProvisionInfo failed: {e}"))?
        .into_inner()
        .info
        .ok_or_else(|| "provision response has no info".to_string())
}

/// Name of the folder `weir boot` works in when the runner names none:
/// `weir-<worker id>` with every character but letters, digits, `-`, `_`
/// and `.` made `_` (a `:` in a folder name would split a Java classpath;
/// other runners' worker ids have them).
fn default_semi_name(worker_id: &str) -> String {
    let safe: String = worker_id
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') { c } else { '_' })
        .collect();
    format!("weir-{safe}")
}

/// An artifact `weir boot` fetched.
#[derive(Clone, Debug, PartialEq)]
struct Staged {
    /// Where it is: `<staged folder>/<staged name>`.
    path: PathBuf,
    /// Its role URN (`beam:artifact:role:...`).
    role: String,
}

impl Staged {
    fn pip_requirements(&self) -> bool {
        self.role == urns::artifact::ROLE_PIP_REQUIREMENTS_FILE
    }
}

/// Fetches every dependency of the provision info into `staged`; returns
/// them in the provision info's order.
async fn stage_artifacts(
    cfg: &BootConfig,
    info: &beam::ProvisionInfo,
    staged: &Path,
) -> Result<Vec<Staged>, String> {
    std::fs::create_dir_all(staged)
        .map_err(|e| format!("cannot create {}: {e}", staged.display()))?;
    let mut paths = Vec::new();
    if info.dependencies.is_empty() {
        return Ok(paths);
    }
    let endpoint = info
        .artifact_endpoint
        .as_ref()
        .map(|d| d.url.clone())
        .unwrap_or_else(|| cfg.provision_endpoint.clone());
    let mut artifacts =
        beam::artifact_retrieval_service_client::ArtifactRetrievalServiceClient::connect(
            weir_proto::grpc_uri(&endpoint),
        )
        .await
        .map_err(|e| format!("cannot reach artifact endpoint {endpoint}: {e}"))?
        .max_decoding_message_size(MAX_GRPC_MESSAGE_BYTES);
    let mut taken = std::collections::HashSet::new();
    for (i, dep) in info.dependencies.iter().enumerate() {
        let name = if dep.role_urn == urns::artifact::ROLE_STAGING_TO
            || dep.role_urn == urns::artifact::ROLE_GO_WORKER_BINARY
        {
            beam::ArtifactStagingToRolePayload::decode(dep.role_payload.as_slice())
                .map(|p| p.staged_name)
                .unwrap_or_default()
        } else {
            String::new()
        };
        // A name that is no plain file name (empty, `.`, `..`, a path) gets
        // one of Weir's.
        let plain = !name.is_empty() && name != "." && name != ".." && !name.contains(['/', '\\', '\0']);
        let name = if !plain || !taken.insert(name.clone()) {
            format!("artifact-{i}")
        } else {
            name
        };
        let mut stream = artifacts
            .get_artifact(with_worker(
                beam::GetArtifactRequest {
                    artifact: Some(dep.clone()),
                },
                &cfg.worker_id,
            )?)
            .await
            .map_err(|e| format!("GetArtifact {name} failed: {e}"))?
            .into_inner();
        let mut bytes = Vec::new();
        while let Some(chunk) = stream.next().await {
            bytes.extend(
                chunk
                    .map_err(|e| format!("GetArtifact {name} failed: {e}"))?
                    .data,
            );
        }
        let path = staged.join(&name);
        std::fs::write(&path, bytes).map_err(|e| format!("cannot write artifact {name}: {e}"))?;
        paths.push(Staged {
            path,
            role: dep.role_urn.clone(),
        });
    }
    Ok(paths)
}

/// Staged names the Python SDK gives what its workers install
/// (`apache_beam/runners/portability/stager.py`): the requirements file, the
/// list of extra packages (one staged name a line) and the `--setup_file`
/// package.
const PYTHON_REQUIREMENTS_FILE: &str = "requirements.txt";
const PYTHON_EXTRA_PACKAGES_FILE: &str = "extra_packages.txt";
const PYTHON_WORKFLOW_TARBALL: &str = "workflow.tar.gz";

/// How often `weir boot` says that pip is still installing.
const INSTALL_HEARTBEAT: std::time::Duration = std::time::Duration::from_secs(30);

/// What a Python job's workers install, in the order Beam's container boot
/// installs it: requirements files, then extra packages, then the
/// `--setup_file` package.
#[derive(Debug, Default, PartialEq)]
struct PythonInstalls {
    requirements: Vec<PathBuf>,
    packages: Vec<PathBuf>,
}

impl PythonInstalls {
    fn is_empty(&self) -> bool {
        self.requirements.is_empty() && self.packages.is_empty()
    }
}

/// Reads what to install from the staged artifacts (in `dir`). Errors name
/// an extra package that `extra_packages.txt` lists but the job did not
/// stage.
fn python_installs(staged: &[Staged], dir: &Path) -> Result<PythonInstalls, String> {
    let named = |name: &str| staged.iter().find(|a| a.path == dir.join(name)).map(|a| a.path.clone());
    let mut out = PythonInstalls::default();
    out.requirements.extend(named(PYTHON_REQUIREMENTS_FILE));
    out.requirements
        .extend(staged.iter().filter(|a| a.pip_requirements()).map(|a| a.path.clone()));
    if let Some(list) = named(PYTHON_EXTRA_PACKAGES_FILE) {
        let text = std::fs::read_to_string(&list)
            .map_err(|e| format!("cannot read the staged {PYTHON_EXTRA_PACKAGES_FILE}: {e}"))?;
        for name in text.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')) {
            let path = named(name).ok_or_else(|| {
                format!("{PYTHON_EXTRA_PACKAGES_FILE} lists the extra package {name}, which the job did not stage")
            })?;
            out.packages.push(path);
        }
    }
    out.packages.extend(named(PYTHON_WORKFLOW_TARBALL));
    Ok(out)
}

/// The `pip install` of `installs` into `prefix` (`--prefix`: packages the
/// interpreter already has count as installed, and nothing is written into
/// its environment). `offline`: from the staged files only, building with
/// the interpreter's own setuptools (`--no-index --no-build-isolation`).
fn pip_install_command(python: &str, installs: &PythonInstalls, find_links: &Path, prefix: &Path, offline: bool) -> std::process::Command {
    let mut cmd = std::process::Command::new(python);
    cmd.args(["-m", "pip", "install", "--no-cache-dir", "--disable-pip-version-check", "--no-warn-script-location"])
        .arg("--prefix")
        .arg(prefix)
        .arg("--find-links")
        .arg(find_links);
    if offline {
        cmd.args(["--no-index", "--no-build-isolation"]);
    }
    for r in &installs.requirements {
        cmd.arg("-r").arg(r);
    }
    cmd.args(&installs.packages);
    // pip's own output goes where the harness's does (the worker's log).
    cmd.stdin(std::process::Stdio::null()).stdout(std::process::Stdio::inherit());
    cmd
}

/// Installs a Python job's packages into `prefix`, as Beam's container boot
/// does into the container: from the staged files first and, when that
/// fails, with the package index too (Beam's SDK stages requirements without
/// their dependencies). Returns the prefix's `site-packages` folders, for
/// `PYTHONPATH`. Errors say pip's exit status; its output is in the log.
fn install_python_packages(
    python: &str,
    installs: &PythonInstalls,
    find_links: &Path,
    prefix: &Path,
) -> Result<Vec<PathBuf>, String> {
    let run = |offline: bool| -> Result<std::process::ExitStatus, String> {
        let mut child = pip_install_command(python, installs, find_links, prefix, offline)
            .spawn()
            .map_err(|e| format!("cannot run {python} -m pip: {e}"))?;
        // A line at least this often: the runner gives a booting harness
        // time while its output goes on (environment::CONNECT_TIMEOUT).
        let started = std::time::Instant::now();
        let mut said = started;
        loop {
            if let Some(status) = child.try_wait().map_err(|e| format!("cannot wait for pip: {e}"))? {
                return Ok(status);
            }
            if said.elapsed() >= INSTALL_HEARTBEAT {
                said = std::time::Instant::now();
                eprintln!("weir boot: pip is still installing the job's Python packages ({} s)", started.elapsed().as_secs());
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    };
    let status = run(true)?;
    if !status.success() {
        eprintln!("weir boot: the staged packages alone did not install ({status}); trying again with the package index");
        let status = run(false)?;
        if !status.success() {
            let what: Vec<&str> = installs.requirements.iter().chain(&installs.packages).map(|p| file_name(p)).collect();
            return Err(format!(
                "pip could not install the job's Python packages ({}): pip {status}; pip's output is above",
                what.join(", ")
            ));
        }
    }
    Ok(site_packages(prefix))
}

/// The `site-packages` folders pip made under `prefix`
/// (`lib*/python*/site-packages`), sorted.
fn site_packages(prefix: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for lib in std::fs::read_dir(prefix).into_iter().flatten().flatten() {
        if !file_name(&lib.path()).starts_with("lib") {
            continue;
        }
        for py in std::fs::read_dir(lib.path()).into_iter().flatten().flatten() {
            let site = py.path().join("site-packages");
            if file_name(&py.path()).starts_with("python") && site.is_dir() {
                out.push(site);
            }
        }
    }
    out.sort();
    out.dedup();
    out
}

/// Puts `paths` before what the variable `var` holds (in `cmd`, else in
/// this process's environment).
fn prepend_paths(cmd: &mut std::process::Command, var: &str, paths: &[PathBuf]) {
    let current = cmd
        .get_envs()
        .find(|(k, _)| *k == std::ffi::OsStr::new(var))
        .and_then(|(_, v)| v.map(|v| v.to_os_string()))
        .or_else(|| std::env::var_os(var));
    let all = paths.iter().cloned().chain(current.iter().flat_map(std::env::split_paths));
    if let Ok(joined) = std::env::join_paths(all) {
        cmd.env(var, joined);
    }
}

/// `url: "host:port"` of a descriptor (protobuf text format, as the SDK
/// harnesses parse it), defaulting to the provision endpoint.
fn descriptor(d: &Option<beam::ApiServiceDescriptor>, default: &str) -> String {
    format!(
        "url: \"{}\"",
        d.as_ref().map(|d| d.url.as_str()).unwrap_or(default)
    )
}

/// Writes the provision info's pipeline options as JSON to
/// `<semi>/pipeline_options.json` (what `PIPELINE_OPTIONS_FILE` names).
fn write_options(info: &beam::ProvisionInfo, semi: &Path) -> Result<PathBuf, String> {
    let options_file = semi.join("pipeline_options.json");
    let options = info
        .pipeline_options
        .as_ref()
        .map(struct_to_json)
        .unwrap_or(serde_json::json!({}));
    std::fs::create_dir_all(semi).map_err(|e| format!("cannot create {}: {e}", semi.display()))?;
    std::fs::write(&options_file, options.to_string())
        .map_err(|e| format!("cannot write {}: {e}", options_file.display()))?;
    Ok(options_file)
}

fn python_command(
    python: &str,
    cfg: &BootConfig,
    info: &beam::ProvisionInfo,
    semi: &Path,
    options_file: &Path,
) -> std::process::Command {
    let mut cmd = std::process::Command::new(python);
    cmd.args(["-m", PYTHON_HARNESS_MODULE])
        .env("WORKER_ID", &cfg.worker_id)
        .env("PIPELINE_OPTIONS_FILE", options_file)
        .env("SEMI_PERSISTENT_DIRECTORY", semi);
    set_fn_api_env(&mut cmd, cfg, info);
    cmd
}

/// Sets what every SDK's container contract reads to reach the runner:
/// `CONTROL_API_SERVICE_DESCRIPTOR` and `LOGGING_API_SERVICE_DESCRIPTOR`
/// (the provision info's endpoints, else the provision endpoint) and
/// `RUNNER_CAPABILITIES` (space-separated URNs).
fn set_fn_api_env(cmd: &mut std::process::Command, cfg: &BootConfig, info: &beam::ProvisionInfo) {
    cmd.env(
        "CONTROL_API_SERVICE_DESCRIPTOR",
        descriptor(&info.control_endpoint, &cfg.provision_endpoint),
    )
    .env(
        "LOGGING_API_SERVICE_DESCRIPTOR",
        descriptor(&info.logging_endpoint, &cfg.provision_endpoint),
    )
    .env("RUNNER_CAPABILITIES", info.runner_capabilities.join(" "));
}

/// What the Java harness's command line is made of.
#[derive(Clone, Debug)]
struct JavaSpec {
    /// The harness folder's jars, in classpath order ([`order_harness_jars`]).
    harness_jars: Vec<PathBuf>,
    /// The job's staged artifacts, in the provision info's order.
    staged_jars: Vec<PathBuf>,
    /// Where the pipeline options JSON was written.
    options_file: PathBuf,
    /// `-Xmx` in MiB (Beam's container takes 70% of the machine's memory).
    max_heap_mb: Option<u64>,
}

fn file_name(p: &Path) -> &str {
    p.file_name().and_then(|n| n.to_str()).unwrap_or("")
}

/// The `.jar` files of folder `dir`, by name (none: an empty list). Errors
/// say the folder cannot be read.
pub(crate) fn list_jars(dir: &Path) -> Result<Vec<PathBuf>, String> {
    let entries =
        std::fs::read_dir(dir).map_err(|e| format!("cannot read {}: {e}", dir.display()))?;
    let mut jars: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "jar"))
        .collect();
    jars.sort();
    Ok(jars)
}

/// The jars of the harness folder that go on the classpath beside `staged`.
///
/// When the environment stages its own `beam-sdks-java-harness` jar (an
/// expansion service's environment lists its whole classpath, harness
/// included), that harness and its Beam version run: of the folder only the
/// logging jars and jamm (which the harness declares `provided`) stay, so
/// Beam jars of another version can't shadow the staged ones. Otherwise the
/// whole folder goes first.
fn harness_jars_beside(harness: Vec<PathBuf>, staged: &[PathBuf]) -> Vec<PathBuf> {
    const KEEP: [&str; 6] = [
        "slf4j-api-",
        "slf4j-jdk14-",
        "jcl-over-slf4j-",
        "log4j-over-slf4j-",
        "log4j-to-slf4j-",
        "jamm-",
    ];
    let stages_harness = staged
        .iter()
        .any(|p| file_name(p).starts_with("beam-sdks-java-harness"));
    if !stages_harness {
        return harness;
    }
    harness
        .into_iter()
        .filter(|p| KEEP.iter().any(|k| file_name(p).starts_with(k)))
        .collect()
}

/// Orders the harness jars as Beam's Java container does: slf4j-api, the JDK
/// binding, the commons-logging and log4j bridges, the harness, then the rest
/// by name. jamm stays on the classpath too (it is also the `-javaagent`).
fn order_harness_jars(mut jars: Vec<PathBuf>) -> Vec<PathBuf> {
    const FIRST: [&str; 6] = [
        "slf4j-api-",
        "slf4j-jdk14-",
        "jcl-over-slf4j-",
        "log4j-over-slf4j-",
        "log4j-to-slf4j-",
        "beam-sdks-java-harness-",
    ];
    let rank = |p: &PathBuf| {
        let name = file_name(p);
        FIRST
            .iter()
            .position(|prefix| name.starts_with(prefix))
            .unwrap_or(FIRST.len())
    };
    jars.sort_by(|a, b| rank(a).cmp(&rank(b)).then_with(|| a.cmp(b)));
    jars
}

fn java_command(
    java: &str,
    spec: &JavaSpec,
    cfg: &BootConfig,
    info: &beam::ProvisionInfo,
) -> std::process::Command {
    let mut cmd = std::process::Command::new(java);
    if let Some(mb) = spec.max_heap_mb {
        cmd.arg(format!("-Xmx{mb}m"));
    }
    cmd.args([
        "-XX:+UseParallelGC",
        "-XX:+AlwaysActAsServerClassMachine",
        "-XX:-OmitStackTraceInFastThrow",
        "--add-opens=java.base/java.nio=ALL-UNNAMED",
        "--add-opens=java.base/sun.nio.ch=ALL-UNNAMED",
        "--add-opens=java.base/java.lang=ALL-UNNAMED",
        "--add-opens=java.base/java.util=ALL-UNNAMED",
    ]);
    let jamm = spec
        .harness_jars
        .iter()
        .chain(&spec.staged_jars)
        .find(|p| file_name(p).starts_with("jamm-"));
    if let Some(jamm) = jamm {
        cmd.arg(format!("-javaagent:{}", jamm.display()));
    }
    let classpath = spec
        .harness_jars
        .iter()
        .chain(&spec.staged_jars)
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(":");
    cmd.arg("-cp").arg(classpath).arg(JAVA_HARNESS_MAIN);
    cmd.env("HARNESS_ID", &cfg.worker_id)
        .env("PIPELINE_OPTIONS_FILE", &spec.options_file);
    set_fn_api_env(&mut cmd, cfg, info);
    if info.status_endpoint.is_some() {
        cmd.env(
            "STATUS_API_SERVICE_DESCRIPTOR",
            descriptor(&info.status_endpoint, &cfg.provision_endpoint),
        );
    }
    cmd
}

/// The machine's memory in MiB (`MemTotal` of `/proc/meminfo`).
fn total_memory_mb() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb / 1024)
}

/// Replaces this process with `cmd` (on Unix); returns only on failure.
/// (longest, total) bytes of a command's arguments and explicitly set variables.
fn exec_sizes(cmd: &std::process::Command) -> (usize, usize) {
    let mut sizes: Vec<usize> = cmd.get_args().map(|a| a.len() + 1).collect();
    sizes.extend(
        cmd.get_envs()
            .filter_map(|(k, v)| v.map(|v| k.len() + v.len() + 2)),
    );
    (sizes.iter().copied().max().unwrap_or(0), sizes.iter().sum())
}

fn exec(mut cmd: std::process::Command) -> Result<std::convert::Infallible, String> {
    let program = cmd.get_program().to_string_lossy().into_owned();
    #[cfg(unix)]
    {
        use std::os::unix::process::CommandExt;
        let err = cmd.exec();
        // E2BIG: Linux allows 128 KiB per argument or variable, ~2 MiB in all.
        if err.raw_os_error() == Some(7) {
            let (longest, total) = exec_sizes(&cmd);
            return Err(format!(
                "cannot exec {program}: its command line and environment are too large for the operating system ({total} bytes in all, the longest argument or variable {longest} bytes; Linux allows 128 KiB each): a pipeline option or environment variable is too big ({err})"
            ));
        }
        Err(format!("cannot exec {program}: {err}"))
    }
    #[cfg(not(unix))]
    {
        let status = cmd
            .status()
            .map_err(|e| format!("cannot run {program}: {e}"))?;
        std::process::exit(status.code().unwrap_or(1));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Options go to the SDK as protojson writes them: whole numbers without
    /// a fraction (Go's `parallelism` -1 must read as an int in Python).
    #[test]
    fn options_json_writes_whole_numbers_as_integers() {
        use prost_types::value::Kind;
        let num = |n: f64| prost_types::Value { kind: Some(Kind::NumberValue(n)) };
        let s = prost_types::Struct {
            fields: [
                ("parallelism".to_string(), num(-1.0)),
                ("ratio".to_string(), num(0.25)),
                ("big".to_string(), num(1e300)),
            ]
            .into(),
        };
        assert_eq!(
            serde_json::to_string(&struct_to_json(&s)).unwrap(),
            r#"{"big":1e+300,"parallelism":-1,"ratio":0.25}"#
        );
    }

    /// The forked harness's pid is read from its folder's pid file, with
    /// or without a newline; none without a file or a number in it.
    #[test]
    fn the_forked_harness_pid_comes_from_its_pid_file() {
        let dir = std::env::temp_dir().join(format!("weir-pid-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        assert_eq!(forked_harness_pid(&dir), None, "no file");
        std::fs::write(dir.join(HARNESS_PID_FILE), "4242\n").unwrap();
        assert_eq!(forked_harness_pid(&dir), Some(4242));
        std::fs::write(dir.join(HARNESS_PID_FILE), "").unwrap();
        assert_eq!(forked_harness_pid(&dir), None, "empty (being written)");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// The Go worker is found as Beam's Go boot finds it, and started with
    /// its container contract.
    #[test]
    fn go_worker_follows_beams_go_boot() {
        let staged = |name: &str, role: &str| Staged { path: PathBuf::from("/s").join(name), role: role.into() };
        let go_role = urns::artifact::ROLE_GO_WORKER_BINARY;
        let to = urns::artifact::ROLE_STAGING_TO;
        assert_eq!(go_worker_binary(&[staged("artifact-0", go_role)]).unwrap(), PathBuf::from("/s/artifact-0"));
        assert_eq!(
            go_worker_binary(&[staged("worker", to), staged("artifact-1", go_role)]).unwrap(),
            PathBuf::from("/s/artifact-1")
        );
        assert_eq!(go_worker_binary(&[staged("a", to), staged("worker", to)]).unwrap(), PathBuf::from("/s/worker"));
        assert!(go_worker_binary(&[staged("a", to), staged("b", to)]).unwrap_err().contains("Go worker binary"));
        assert!(go_worker_binary(&[]).unwrap_err().contains("--worker_binary"));

        let info = beam::ProvisionInfo {
            control_endpoint: Some(beam::ApiServiceDescriptor { url: "localhost:7".into(), ..Default::default() }),
            runner_capabilities: vec!["a".into(), "b".into()],
            ..Default::default()
        };
        let cfg = BootConfig { sdk: Sdk::Go, ..config() };
        let cmd = go_command(Path::new("/s/worker"), &cfg, &info, Path::new("/semi"), Path::new("/semi/pipeline_options.json"));
        let args: Vec<_> = cmd.get_args().map(|a| a.to_string_lossy().into_owned()).collect();
        assert_eq!(
            args,
            [
                "--worker=true",
                "--id=w-1",
                "--logging_endpoint=localhost:1",
                "--control_endpoint=localhost:7",
                "--semi_persist_dir=/semi"
            ]
        );
        let env: std::collections::HashMap<_, _> = cmd
            .get_envs()
            .map(|(k, v)| (k.to_string_lossy().into_owned(), v.unwrap().to_string_lossy().into_owned()))
            .collect();
        assert_eq!(env["PIPELINE_OPTIONS_FILE"], "/semi/pipeline_options.json");
        assert_eq!(env["RUNNER_CAPABILITIES"], "a b");
        assert!(!env.contains_key("STATUS_ENDPOINT"));
    }

    #[test]
    fn the_default_folder_name_is_safe_on_a_classpath() {
        assert_eq!(default_semi_name("job-1-worker-2"), "weir-job-1-worker-2");
        assert_eq!(default_semi_name("job-1:env:3/../x y"), "weir-job-1_env_3_.._x_y");
    }

    /// What a Python job installs comes from the stager's staged names and
    /// the requirements role, in Beam's order: requirements, then the extra
    /// packages as extra_packages.txt lists them, then workflow.tar.gz.
    #[test]
    fn python_installs_follow_the_stagers_names() {
        let dir = std::env::temp_dir().join(format!("weir-installs-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(PYTHON_EXTRA_PACKAGES_FILE), "b-1.0.tar.gz\n\n# note\na-2.0-py3-none-any.whl\n").unwrap();
        let staged = |name: &str, pip_requirements: bool| Staged {
            path: dir.join(name),
            role: if pip_requirements { urns::artifact::ROLE_PIP_REQUIREMENTS_FILE } else { urns::artifact::ROLE_STAGING_TO }.into(),
        };
        let all = [
            staged("pickled_main_session", false),
            staged(PYTHON_WORKFLOW_TARBALL, false),
            staged("a-2.0-py3-none-any.whl", false),
            staged("b-1.0.tar.gz", false),
            staged(PYTHON_EXTRA_PACKAGES_FILE, false),
            staged("artifact-7", true),
            staged(PYTHON_REQUIREMENTS_FILE, false),
        ];
        let got = python_installs(&all, &dir).unwrap();
        assert_eq!(got.requirements, vec![dir.join(PYTHON_REQUIREMENTS_FILE), dir.join("artifact-7")]);
        assert_eq!(
            got.packages,
            vec![dir.join("b-1.0.tar.gz"), dir.join("a-2.0-py3-none-any.whl"), dir.join(PYTHON_WORKFLOW_TARBALL)]
        );
        assert!(python_installs(&all[..1], &dir).unwrap().is_empty(), "nothing to install");
        let err = python_installs(&[staged(PYTHON_EXTRA_PACKAGES_FILE, false)], &dir).unwrap_err();
        assert!(err.contains("b-1.0.tar.gz") && err.contains("did not stage"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// pip installs into the worker's prefix, never the interpreter's
    /// environment; offline it reads the staged folder only.
    #[test]
    fn pip_installs_into_the_prefix() {
        let installs = PythonInstalls {
            requirements: vec!["/s/requirements.txt".into()],
            packages: vec!["/s/workflow.tar.gz".into()],
        };
        let args = |offline| {
            pip_install_command("py", &installs, Path::new("/s"), Path::new("/w/packages"), offline)
                .get_args()
                .map(|a| a.to_string_lossy().into_owned())
                .collect::<Vec<_>>()
                .join(" ")
        };
        assert_eq!(
            args(true),
            "-m pip install --no-cache-dir --disable-pip-version-check --no-warn-script-location \
             --prefix /w/packages --find-links /s --no-index --no-build-isolation \
             -r /s/requirements.txt /s/workflow.tar.gz"
        );
        assert!(!args(false).contains("--no-index") && args(false).contains("--prefix /w/packages"));
    }

    /// PYTHONPATH gets the prefix's site-packages before what it held.
    #[test]
    fn site_packages_go_first_on_the_path() {
        let dir = std::env::temp_dir().join(format!("weir-site-test-{}", std::process::id()));
        let site = dir.join("lib/python3.11/site-packages");
        std::fs::create_dir_all(&site).unwrap();
        std::fs::create_dir_all(dir.join("bin")).unwrap();
        assert_eq!(site_packages(&dir), vec![site.clone()]);
        let mut cmd = std::process::Command::new("py");
        cmd.env("PYTHONPATH", "/user/lib");
        prepend_paths(&mut cmd, "PYTHONPATH", &[site.clone()]);
        let value = cmd.get_envs().find(|(k, _)| *k == "PYTHONPATH").unwrap().1.unwrap().to_owned();
        assert_eq!(value, std::ffi::OsString::from(format!("{}:/user/lib", site.display())));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    fn config() -> BootConfig {
        BootConfig {
            worker_id: "w-1".into(),
            provision_endpoint: "localhost:1".into(),
            semi_persistent_directory: None,
            sdk: Sdk::Java {
                java: "java".into(),
                harness_classpath: None,
            },
        }
    }

    #[test]
    fn harness_jars_put_slf4j_and_the_bridges_before_the_harness() {
        let jars = [
            "zstd-1.jar",
            "beam-sdks-java-harness-2.73.0.jar",
            "jamm-0.4.0.jar",
            "log4j-over-slf4j-2.0.16.jar",
            "slf4j-jdk14-2.0.16.jar",
            "jcl-over-slf4j-2.0.16.jar",
            "slf4j-api-2.0.16.jar",
            "avro-1.11.4.jar",
            "log4j-to-slf4j-2.23.1.jar",
        ]
        .map(|n| PathBuf::from("/h").join(n))
        .to_vec();
        let names: Vec<String> = order_harness_jars(jars)
            .iter()
            .map(|p| file_name(p).to_string())
            .collect();
        assert_eq!(
            names,
            [
                "slf4j-api-2.0.16.jar",
                "slf4j-jdk14-2.0.16.jar",
                "jcl-over-slf4j-2.0.16.jar",
                "log4j-over-slf4j-2.0.16.jar",
                "log4j-to-slf4j-2.23.1.jar",
                "beam-sdks-java-harness-2.73.0.jar",
                "avro-1.11.4.jar",
                "jamm-0.4.0.jar",
                "zstd-1.jar",
            ]
        );
    }

    #[test]
    fn a_staged_harness_replaces_the_folders_beam_jars() {
        let folder: Vec<PathBuf> = [
            "slf4j-api-2.0.16.jar",
            "beam-sdks-java-harness-2.73.0.jar",
            "beam-sdks-java-core-2.73.0.jar",
            "jamm-0.4.0.jar",
            "avro-1.11.4.jar",
        ]
        .map(|n| PathBuf::from("/h").join(n))
        .to_vec();
        let app = vec![PathBuf::from("/s/app.jar")];
        assert_eq!(harness_jars_beside(folder.clone(), &app), folder);
        let own = vec![
            PathBuf::from("/s/beam-sdks-java-harness-2.71.0-abc.jar"),
            PathBuf::from("/s/beam-sdks-java-core-2.71.0-def.jar"),
        ];
        let kept: Vec<String> = harness_jars_beside(folder, &own)
            .iter()
            .map(|p| file_name(p).to_string())
            .collect();
        assert_eq!(kept, ["slf4j-api-2.0.16.jar", "jamm-0.4.0.jar"]);
    }

    #[test]
    fn java_command_follows_the_container_contract() {
        let spec = JavaSpec {
            harness_jars: vec![
                "/h/slf4j-api-2.jar".into(),
                "/h/beam-sdks-java-harness-2.73.0.jar".into(),
                "/h/jamm-0.4.0.jar".into(),
            ],
            staged_jars: vec![
                "/s/app-abc.jar".into(),
                "/s/beam-sdks-java-core-xyz.jar".into(),
            ],
            options_file: "/semi/pipeline_options.json".into(),
            max_heap_mb: Some(700),
        };
        let info = beam::ProvisionInfo {
            control_endpoint: Some(beam::ApiServiceDescriptor {
                url: "localhost:7".into(),
                ..Default::default()
            }),
            runner_capabilities: vec!["a:v1".into(), "b:v1".into()],
            ..Default::default()
        };
        let cmd = java_command("/jdk/bin/java", &spec, &config(), &info);
        assert_eq!(cmd.get_program(), "/jdk/bin/java");
        let args: Vec<String> = cmd
            .get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        assert_eq!(args[0], "-Xmx700m");
        assert!(args.contains(&"-XX:+UseParallelGC".to_string()));
        assert!(args.contains(&"-XX:-OmitStackTraceInFastThrow".to_string()));
        assert!(args.contains(&"--add-opens=java.base/java.nio=ALL-UNNAMED".to_string()));
        assert!(args.contains(&"-javaagent:/h/jamm-0.4.0.jar".to_string()));
        let n = args.len();
        assert_eq!(args[n - 3], "-cp");
        assert_eq!(
            args[n - 2],
            "/h/slf4j-api-2.jar:/h/beam-sdks-java-harness-2.73.0.jar:/h/jamm-0.4.0.jar:/s/app-abc.jar:/s/beam-sdks-java-core-xyz.jar"
        );
        assert_eq!(args[n - 1], JAVA_HARNESS_MAIN);
        let env: std::collections::HashMap<String, String> = cmd
            .get_envs()
            .filter_map(|(k, v)| {
                Some((
                    k.to_string_lossy().into_owned(),
                    v?.to_string_lossy().into_owned(),
                ))
            })
            .collect();
        assert_eq!(env["HARNESS_ID"], "w-1");
        assert_eq!(env["PIPELINE_OPTIONS_FILE"], "/semi/pipeline_options.json");
        assert_eq!(
            env["CONTROL_API_SERVICE_DESCRIPTOR"],
            "url: \"localhost:7\""
        );
        // No logging endpoint in the provision info: the provision endpoint serves it.
        assert_eq!(
            env["LOGGING_API_SERVICE_DESCRIPTOR"],
            "url: \"localhost:1\""
        );
        assert_eq!(env["RUNNER_CAPABILITIES"], "a:v1 b:v1");
        assert!(!env.contains_key("STATUS_API_SERVICE_DESCRIPTOR"));
    }

    #[test]
    fn a_named_harness_classpath_must_exist() {
        let err = find_java_harness_classpath(Some("/nonexistent/weir-jars".into())).unwrap_err();
        assert!(err.contains("--java_harness_classpath"), "{err}");
        let dir = std::env::temp_dir();
        assert_eq!(
            find_java_harness_classpath(Some(dir.clone())).unwrap(),
            Some(dir)
        );
    }
}
