//! The `weir` binary: argument parsing and start-up only.
//!
//! - `weir serve --job_port 8099` (or plain `weir --job_port N`, as Beam's
//!   PrismRunner launches a runner binary): the Job API, artifact services and
//!   Fn API on one gRPC port.
//! - `weir boot --id ID --provision_endpoint HOST:PORT [--java]`: the boot
//!   command of a `beam:env:process:v1` Python (or, with `--java`, Java) SDK
//!   harness.
//! - `weir jobs list|describe|watch|cancel|drain|logs`: a Job API client for a running server.
//! - `weir expansion-service --port N [--sdk java|python] [--environment E]`:
//!   Beam's Java or Python expansion service (and, for EXTERNAL, a worker
//!   pool), emitting environments Weir starts locally.

use std::path::PathBuf;

mod jobs;

/// mimalloc for every Rust allocation of the process (elements, keys, buffered
/// groups are many small buffers; glibc malloc spent a quarter of a
/// GroupByKey's runner CPU in its own bookkeeping).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "weir",
    version,
    about = "A portable Apache Beam runner on Timely Dataflow"
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    serve: ServeArgs,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the Beam Job API, artifact services and the Fn API on one port.
    Serve(ServeArgs),
    /// Boot a Python (default) or Java (--java) SDK harness for a PROCESS environment.
    Boot(BootArgs),
    /// List, describe, watch, cancel or drain the jobs of a running Weir server, or show their logs.
    Jobs(JobsArgs),
    /// Run jobs for a cluster coordinator (`weir serve --cluster_port`): this
    /// process registers with it and runs its part of each job it is given.
    Worker(WorkerArgs),
    /// Serve Beam's Java (default) or Python expansion service for cross-language
    /// transforms, with environments Weir can start here.
    ExpansionService(ExpansionArgs),
}

#[derive(Args)]
struct WorkerArgs {
    /// `host:port` of the coordinator's --cluster_port.
    #[arg(long)]
    coordinator: String,
    /// The coordinator's Job API token (default: $WEIR_AUTH_TOKEN).
    #[arg(long = "auth_token")]
    auth_token: Option<String>,
    /// File holding the coordinator's token (first line).
    #[arg(long = "auth_token_file", conflicts_with = "auth_token")]
    auth_token_file: Option<PathBuf>,
    /// Address the job's other workers reach this one's timely port at
    /// (default: this machine's address toward the coordinator).
    #[arg(long = "advertise_host")]
    advertise_host: Option<String>,
    /// Port of this worker's timely listener; 0 (default) picks a free one per job.
    #[arg(long = "timely_port", default_value_t = 0)]
    timely_port: u16,
    /// Name in job messages (default: host name and process id).
    #[arg(long)]
    name: Option<String>,
    /// Timely worker threads per job in this process (default: cores).
    #[arg(long)]
    workers: Option<usize>,
    /// Port of this worker's Fn API, which its SDK harnesses dial (0, the
    /// default: any free port).
    #[arg(long = "fn_api_port", default_value_t = 0)]
    fn_api_port: u16,
    /// Address of this worker's Fn API (a non-loopback one needs a token).
    #[arg(long, default_value = "127.0.0.1")]
    bind: String,
    /// Folder for this worker's own files (default: <tmp>/weir-staging).
    #[arg(long = "staging_dir")]
    staging_dir: Option<PathBuf>,
    #[command(flatten)]
    run: RunFlags,
}

/// How a server runs its jobs' SDK harnesses and bundles: the flags `weir
/// serve` and `weir worker` share, which a server passes on to its
/// `--local_workers`.
#[derive(Args, Clone)]
struct RunFlags {
    /// Start the Python SDK harnesses of `weir boot --python` PROCESS
    /// environments as forks of one warm interpreter per Python (Beam
    /// imported once, about 0.5 CPU s saved per harness); false starts a
    /// fresh interpreter for each.
    #[arg(long = "python_fork_server", default_value_t = true, action = clap::ArgAction::Set)]
    python_fork_server: bool,
    /// Run each SDK harness process that stands for one core (Python's
    /// PROCESS harnesses, one per core) on a core of its own, on Linux: the
    /// allowed core with the fewest such harnesses, so concurrent jobs
    /// share the cores evenly. Its bundles then pass the interpreter lock
    /// on one core; false lets the kernel move them.
    #[arg(long = "pin_sdk_harnesses", default_value_t = true, action = clap::ArgAction::Set)]
    pin_sdk_harnesses: bool,
    /// Least wait, in ms (at most 60000), before a splittable DoFn's
    /// residual that asked for a resume delay (`defer_remainder`, a polling
    /// source such as PeriodicImpulse) runs again, batch or streaming;
    /// longer requested delays are kept. Each resume is a bundle, so a
    /// source deferring by 1 ms would otherwise run hundreds of bundles a
    /// second. 0: resume when the requested delay has passed.
    #[arg(long = "min_resume_delay_ms", default_value_t = DEFAULT_MIN_RESUME_DELAY_MS,
          value_parser = clap::value_parser!(u64).range(0..=MAX_MIN_RESUME_DELAY_MS))]
    min_resume_delay_ms: u64,
}

impl RunFlags {
    /// These flags as command-line arguments (`--name=value`), for a
    /// process that takes them too.
    fn to_args(&self) -> Vec<String> {
        vec![
            format!("--python_fork_server={}", self.python_fork_server),
            format!("--pin_sdk_harnesses={}", self.pin_sdk_harnesses),
            format!("--min_resume_delay_ms={}", self.min_resume_delay_ms),
        ]
    }
}

/// `--min_resume_delay_ms`'s default, in ms.
const DEFAULT_MIN_RESUME_DELAY_MS: u64 = weir_engine::DEFAULT_MIN_RESUME_DELAY.as_millis() as u64;
/// `--min_resume_delay_ms`'s largest value, in ms (a minute: more would
/// leave deferred sources all but stopped).
const MAX_MIN_RESUME_DELAY_MS: u64 = 60_000;

#[derive(Args)]
struct ExpansionArgs {
    /// Port of the expansion service (what Python's `expansion_service=` or
    /// `--beam_services` names as localhost:PORT). 0 picks a free one.
    #[arg(long, default_value_t = 8097)]
    port: u16,
    /// Which SDK's expansion service: java (GenerateSequence, KafkaIO, Beam SQL, ...)
    /// or python (any Python callable, for Java's PythonExternalTransform).
    #[arg(long, default_value = "java", value_parser = ["java", "python"])]
    sdk: String,
    /// Environment of the expanded transforms: DOCKER (the SDK's own image, run by Weir
    /// as a native harness without a Docker daemon), PROCESS (`weir boot`) or EXTERNAL
    /// (a worker pool started beside the service).
    #[arg(long, default_value = "DOCKER")]
    environment: weir_harness::expansion::ExpansionEnvironment,
    /// Port of the EXTERNAL worker pool (default: a free one).
    #[arg(long = "worker_pool_port")]
    worker_pool_port: Option<u16>,
    /// Folder of the Java expansion service's jars (default:
    /// $WEIR_JAVA_EXPANSION_CLASSPATH, java-expansion/ next to this binary, or
    /// java/expansion/target/jars of the checkout it was built in).
    #[arg(long = "java_classpath")]
    java_classpath: Option<PathBuf>,
    /// The java launcher (default: $JAVA_HOME/bin/java, else java on the PATH).
    #[arg(long = "java_bin")]
    java_bin: Option<String>,
    /// Python interpreter with apache-beam for --sdk python (default: $WEIR_PYTHON or python3).
    #[arg(long)]
    python: Option<String>,
    /// A jar, or a folder of jars, to add to the Java expansion service's
    /// classpath (your transforms, for JavaExternalTransform); the service
    /// stages its classpath for the expanded transforms' harnesses. Repeatable.
    #[arg(long = "jar")]
    jars: Vec<PathBuf>,
    /// Arguments after `--` go to Beam's expansion service itself, e.g.
    /// `-- --javaClassLookupAllowlistFile=allowlist.yaml` (Java) to let
    /// JavaExternalTransform name classes.
    #[arg(last = true)]
    service_args: Vec<String>,
}

#[derive(Args)]
struct JobsArgs {
    /// Job API endpoint of the server.
    #[arg(long, default_value = "localhost:8099", global = true)]
    endpoint: String,
    /// Job API token of a server started with --auth_token (default: $WEIR_AUTH_TOKEN).
    #[arg(long = "auth_token", global = true)]
    auth_token: Option<String>,
    /// File holding the Job API token (first line).
    #[arg(long = "auth_token_file", global = true)]
    auth_token_file: Option<PathBuf>,
    #[command(subcommand)]
    action: JobsAction,
}

#[derive(Subcommand)]
enum JobsAction {
    /// One line per job (tab-separated, after a header): id, state, name,
    /// start and end time (UTC), labels.
    List,
    /// A job's name, state, times, labels, CPU and memory, per-stage counts
    /// and watermarks, state changes and options.
    Describe { job_id: String },
    /// Per-stage progress (elements in and out, bundles in flight,
    /// watermarks), redrawn every second until the job ends.
    Watch { job_id: String },
    /// Cancel a job.
    Cancel { job_id: String },
    /// Drain a streaming job: its sources stop, work in flight finishes,
    /// windows fire, and it ends DRAINED (a batch job's drain is refused).
    Drain { job_id: String },
    /// A job's messages: runner notes and SDK harness log entries (the
    /// last 10,000), one a line: time, importance, text.
    Logs {
        job_id: String,
        /// Keep printing new entries until the job ends.
        #[arg(long, short)]
        follow: bool,
    },
}

#[derive(Args, Clone)]
struct ServeArgs {
    /// gRPC port of the Job API (and every other service). 0 picks a free port.
    #[arg(long = "job_port", alias = "job-port", default_value_t = 8099)]
    job_port: u16,
    /// Cluster mode: accept `weir worker --coordinator` processes on this
    /// port (0: any free port) and run each job on `num_workers` of them
    /// (default 1) instead of in this process.
    #[arg(long = "cluster_port")]
    cluster_port: Option<u16>,
    /// With --cluster_port: start this many `weir worker` processes on this
    /// machine, restart any that exits, and stop them with this server (a
    /// local cluster: the same engine as several processes).
    #[arg(long = "local_workers", requires = "cluster_port")]
    local_workers: Option<usize>,
    /// With --cluster_port: how long a job waits for the worker processes it
    /// needs (num_workers) before it fails, in seconds.
    #[arg(long = "worker_wait_secs", default_value_t = 60)]
    worker_wait_secs: u64,
    /// Address to bind.
    #[arg(long, default_value = "127.0.0.1")]
    bind: String,
    /// Timely worker threads per job (default: cores).
    #[arg(long)]
    workers: Option<usize>,
    /// Folder for staged artifacts (default: <tmp>/weir-staging).
    #[arg(long = "staging_dir", alias = "staging-dir")]
    staging_dir: Option<PathBuf>,
    /// Python interpreter (with apache-beam) that runs `apache/beam_python3.x_sdk:V`
    /// DOCKER environments when no Docker daemon answers (default: $WEIR_PYTHON or python3).
    /// When its apache-beam version is not V, the job's messages warn naming both.
    #[arg(long = "python_for_docker_images")]
    python_for_docker_images: Option<String>,
    #[command(flatten)]
    run: RunFlags,
    /// Start the fork server of this Python interpreter (the `--python` of
    /// `weir boot`; repeatable) as the server starts, not at the first
    /// job's first harness: that job's harnesses then need not wait for it
    /// to import Beam (about 0.5 s). It serves PROCESS environments whose
    /// `weir boot --python` is this same string and whose own variables
    /// leave the interpreter's (PYTHON*, LD_*, ...) as here.
    #[arg(long = "python_fork_server_prewarm", value_name = "PYTHON")]
    python_fork_server_prewarm: Vec<String>,
    /// Largest pipeline proto Prepare takes, in bytes.
    #[arg(long = "max_pipeline_bytes", default_value_t = weir_jobs::limits::Limits::default().max_pipeline_bytes)]
    max_pipeline_bytes: usize,
    /// Most leaf transforms one pipeline may have (each costs the engine
    /// about 20 KB while the job runs).
    #[arg(long = "max_pipeline_transforms", default_value_t = weir_jobs::limits::Limits::default().max_pipeline_transforms)]
    max_pipeline_transforms: usize,
    /// Largest serialized value of one pipeline option, in bytes (options
    /// reach SDK harnesses through the provision service and `weir boot`'s
    /// options file).
    #[arg(long = "max_option_bytes", default_value_t = weir_jobs::limits::Limits::default().max_option_bytes)]
    max_option_bytes: usize,
    /// Bytes of artifacts one job may stage.
    #[arg(long = "max_artifact_bytes_per_job", default_value_t = weir_jobs::limits::Limits::default().max_artifact_bytes_per_job)]
    max_artifact_bytes_per_job: u64,
    /// Seconds a prepared job waits for Run before it is forgotten.
    #[arg(long = "prepared_job_ttl_secs", default_value_t = weir_jobs::limits::Limits::default().prepared_job_ttl.as_secs())]
    prepared_job_ttl_secs: u64,
    /// Prepared, not yet run jobs the server keeps; beyond it a Prepare
    /// forgets the oldest one not staging artifacts (refused if all are).
    #[arg(long = "max_prepared_jobs", default_value_t = weir_jobs::limits::Limits::default().max_prepared_jobs)]
    max_prepared_jobs: usize,
    /// Bytes of serialized pipelines held in prepared jobs not yet run (Prepare
    /// past it is refused), and again in finished jobs (the oldest are forgotten past it).
    #[arg(long = "max_held_pipeline_bytes", default_value_t = weir_jobs::limits::Limits::default().max_held_pipeline_bytes)]
    max_held_pipeline_bytes: usize,
    /// SDK harnesses one job may start (num_workers or max_num_workers x
    /// harnesses per worker x environments; default: the larger of 256 and 4 x cores).
    #[arg(long = "max_sdk_harnesses_per_job", default_value_t = weir_jobs::limits::Limits::default().max_sdk_harnesses_per_job)]
    max_sdk_harnesses_per_job: usize,
    /// Let a client's --staging_location name any folder or bucket (default:
    /// only folders under --staging_dir).
    #[arg(long = "allow_client_staging_locations")]
    allow_client_staging_locations: bool,
    /// Write each PrepareJobRequest this server receives, serialized, into
    /// this folder (`prepare-<n>.pb`), e.g. to capture fuzzer seeds.
    #[arg(long = "capture_prepare_dir", hide = true)]
    capture_prepare_dir: Option<PathBuf>,
    /// Job API token: every Job API and artifact staging call must carry
    /// `authorization: Bearer TOKEN` metadata (`weir jobs --auth_token`,
    /// WeirRunner's --weirAuthToken, `python -m weir_auth`). Visible in `ps`:
    /// prefer --auth_token_file.
    #[arg(long = "auth_token")]
    auth_token: Option<String>,
    /// File holding the Job API token (first line; surrounding whitespace ignored).
    #[arg(long = "auth_token_file", conflicts_with = "auth_token")]
    auth_token_file: Option<PathBuf>,
    /// Serve on a non-loopback --bind without a token: anyone who reaches
    /// the port can submit jobs, which run commands as this user.
    #[arg(long = "insecure_allow_remote")]
    insecure_allow_remote: bool,
    /// Also allow PROCESS environments whose command (its program, or the
    /// whole command) matches PATTERN (`*` matches anything; repeatable).
    /// Always allowed: this binary's own `weir boot ...` commands.
    #[arg(long = "allow_process_command", value_name = "PATTERN")]
    allow_process_command: Vec<String>,
    /// Also allow DOCKER environments whose image matches PATTERN (`*`
    /// matches anything; repeatable). Always allowed: Beam's SDK images
    /// `apache/beam_*_sdk[:tag]`.
    #[arg(long = "allow_docker_image", value_name = "PATTERN")]
    allow_docker_image: Vec<String>,
    /// Most MiB one batch GroupByKey keeps in memory; beyond it the groups are
    /// written as sorted runs to --spill_dir and merged back as windows fire
    /// (default: a quarter of the machine's RAM; 0: no bound).
    #[arg(long = "gbk_memory_budget_mb", alias = "gbk-memory-budget-mb")]
    gbk_memory_budget_mb: Option<usize>,
    /// About the most MiB of user state (bags, maps and ordered lists,
    /// estimated with their maps' overhead) one job keeps in this process;
    /// an append past it fails the job, naming the state, so one job cannot
    /// take the server's memory (default: a quarter of the machine's RAM;
    /// 0: no bound).
    #[arg(long = "user_state_memory_budget_mb", alias = "user-state-memory-budget-mb")]
    user_state_memory_budget_mb: Option<usize>,
    /// About the most MiB one stage's side inputs take in this process
    /// (built once per process in batch); past it the job fails, naming the
    /// side inputs (default: a quarter of the machine's RAM; 0: no bound).
    #[arg(long = "side_input_memory_budget_mb", alias = "side-input-memory-budget-mb")]
    side_input_memory_budget_mb: Option<usize>,
    /// Folder for GroupByKey spill files, one subfolder per job, removed when
    /// the job ends (default: <tmp>/weir-spill).
    #[arg(long = "spill_dir", alias = "spill-dir")]
    spill_dir: Option<PathBuf>,
    /// Accepted for compatibility with Beam's Prism launcher; use RUST_LOG.
    #[arg(long = "log_level", hide = true)]
    log_level: Option<String>,
    /// Accepted for compatibility with Beam's Prism launcher.
    #[arg(long = "log_kind", hide = true)]
    log_kind: Option<String>,
    /// HTTP port of the web UI and Prometheus `/metrics`, on the --bind
    /// address and behind the same token as the Job API. Default: 8074 when
    /// free (else a warning, and no UI); 0 picks a free port.
    #[arg(long = "ui_port", alias = "ui-port")]
    ui_port: Option<u16>,
    /// `--serve_http=false` (as Beam's Prism launcher passes it) serves no web UI.
    #[arg(long = "serve_http")]
    serve_http: Option<String>,
}

#[derive(Args)]
struct BootArgs {
    /// Worker id given by the runner.
    #[arg(long)]
    id: String,
    /// Provision service endpoint (host:port).
    #[arg(long = "provision_endpoint", alias = "provision-endpoint")]
    provision_endpoint: String,
    /// Python interpreter with apache-beam installed (default: $WEIR_PYTHON or python3).
    #[arg(long)]
    python: Option<String>,
    /// Boot Beam's Java SDK harness (org.apache.beam.fn.harness.FnHarness) instead of Python's.
    #[arg(long, conflicts_with = "go")]
    java: bool,
    /// Boot a Go pipeline's staged worker binary (Beam's Go container contract) instead of
    /// Python's harness; it works in this server's folder, as `weir boot --python` does.
    #[arg(long)]
    go: bool,
    /// Folder of the Java harness jars (default: $WEIR_JAVA_HARNESS_CLASSPATH, java-harness/
    /// next to this binary, or java/harness/target/jars of the checkout it was built in).
    #[arg(long = "java_harness_classpath")]
    java_harness_classpath: Option<PathBuf>,
    /// The java launcher (default: $JAVA_HOME/bin/java, else java on the PATH).
    #[arg(long = "java_bin")]
    java_bin: Option<String>,
    /// Folder for the worker's staged artifacts (Beam's container contract
    /// spells it `--semi_persist_dir`; Python's `--semi_persistent_directory`
    /// is accepted too).
    #[arg(long = "semi_persist_dir", alias = "semi_persistent_directory")]
    semi_persistent_directory: Option<PathBuf>,
    /// Passed by runners per Beam's container contract; read from provision info instead.
    #[arg(long = "logging_endpoint", hide = true)]
    logging_endpoint: Option<String>,
    #[arg(long = "artifact_endpoint", hide = true)]
    artifact_endpoint: Option<String>,
    #[arg(long = "control_endpoint", hide = true)]
    control_endpoint: Option<String>,
}

/// Runs the command; an error ends the process with status 1 and one line,
/// `Error: what: why`, with no backtrace even under RUST_BACKTRACE (a
/// harness's start-up error reaches the job's messages through the last
/// lines of its output, which frames would push out).
fn main() {
    if let Err(e) = run() {
        eprintln!("Error: {e:#}");
        std::process::exit(1);
    }
}

fn run() -> anyhow::Result<()> {
    // This binary's path, before a rebuild can replace the file (weir_exe).
    let _ = weir_harness::weir_exe();
    weir_jobs::connections::raise_open_files_limit();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "info,h2=warn,tower=warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    match cli.command {
        Some(Command::Boot(b)) => {
            let sdk = if b.go {
                weir_harness::boot::Sdk::Go
            } else if b.java {
                weir_harness::boot::Sdk::Java {
                    java: b.java_bin.unwrap_or_else(default_java),
                    harness_classpath: weir_harness::boot::find_java_harness_classpath(
                        b.java_harness_classpath,
                    )
                    .map_err(|e| anyhow::anyhow!("weir boot: {e}"))?,
                }
            } else {
                weir_harness::boot::Sdk::Python {
                    python: b
                        .python
                        .or_else(|| std::env::var("WEIR_PYTHON").ok())
                        .unwrap_or_else(|| "python3".into()),
                }
            };
            let cfg = weir_harness::boot::BootConfig {
                worker_id: b.id,
                provision_endpoint: b.provision_endpoint,
                semi_persistent_directory: b.semi_persistent_directory,
                sdk,
            };
            let err = runtime.block_on(weir_harness::boot::boot(cfg)).unwrap_err();
            anyhow::bail!("weir boot: {err}")
        }
        Some(Command::Serve(s)) => stop_after(runtime, serve(s, None)),
        Some(Command::Worker(w)) => stop_after(runtime, worker(w)),
        Some(Command::Jobs(j)) => runtime.block_on(jobs::run(j)),
        Some(Command::ExpansionService(e)) => runtime.block_on(expansion_service(e)),
        None => stop_after(runtime, serve(cli.serve, None)),
    }
}

/// Runs a server to its end, then stops: the tasks still running are
/// dropped (their SDK harness processes killed) and blocking work gets at
/// most a second, so a signal ends the process promptly.
fn stop_after(
    runtime: tokio::runtime::Runtime,
    server: impl std::future::Future<Output = anyhow::Result<()>>,
) -> anyhow::Result<()> {
    let ended = runtime.block_on(server);
    runtime.shutdown_timeout(std::time::Duration::from_secs(1));
    ended
}

/// `$JAVA_HOME/bin/java` when `JAVA_HOME` is set, else `java`.
fn default_java() -> String {
    std::env::var_os("JAVA_HOME")
        .map(|home| PathBuf::from(home).join("bin").join("java"))
        .filter(|java| java.is_file())
        .map(|java| java.display().to_string())
        .unwrap_or_else(|| "java".into())
}

/// The token of `--auth_token` or `--auth_token_file` (an empty one is an error).
fn auth_token(args: &ServeArgs) -> anyhow::Result<Option<String>> {
    let token = match (&args.auth_token, &args.auth_token_file) {
        (Some(t), _) => Some(t.trim().to_string()),
        (None, Some(f)) => Some(
            std::fs::read_to_string(f)
                .with_context(|| format!("cannot read --auth_token_file {}", f.display()))?
                .lines()
                .next()
                .unwrap_or("")
                .trim()
                .to_string(),
        ),
        (None, None) => None,
    };
    if token.as_deref() == Some("") {
        anyhow::bail!("the Job API token (--auth_token / --auth_token_file) is empty");
    }
    Ok(token)
}

/// A free localhost port (bound and released).
fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// Starts the expansion service (and worker pool), says where it listens once
/// it accepts connections, and stops them all when one exits or on
/// SIGINT/SIGTERM.
async fn expansion_service(args: ExpansionArgs) -> anyhow::Result<()> {
    use weir_harness::expansion::{self as ex, ExpansionEnvironment, ExpansionSdk};
    let sdk = match args.sdk.as_str() {
        "python" => ExpansionSdk::Python {
            python: args
                .python
                .or_else(|| std::env::var("WEIR_PYTHON").ok())
                .unwrap_or_else(|| "python3".into()),
        },
        _ => {
            let mut jars = ex::find_java_expansion_classpath(args.java_classpath)
                .map_err(|e| anyhow::anyhow!("weir expansion-service: {e}"))?;
            for extra in &args.jars {
                jars.extend(ex::jars_at(extra).map_err(|e| anyhow::anyhow!("weir expansion-service: --jar: {e}"))?);
            }
            ExpansionSdk::Java {
                java: args.java_bin.unwrap_or_else(default_java),
                jars,
            }
        }
    };
    if !args.jars.is_empty() && args.sdk == "python" {
        anyhow::bail!("weir expansion-service: --jar is for --sdk java");
    }
    let port = if args.port == 0 {
        free_port()?
    } else {
        args.port
    };
    let worker_pool_port = match (args.environment, args.worker_pool_port) {
        (ExpansionEnvironment::External, None) => Some(free_port()?),
        (_, p) => p,
    };
    let cfg = ex::ExpansionConfig {
        sdk,
        environment: args.environment,
        port,
        worker_pool_port,
        weir_bin: weir_harness::weir_exe().context("cannot find the weir binary")?,
        service_args: args.service_args,
    };
    let launches = ex::plan(&cfg).map_err(|e| anyhow::anyhow!("weir expansion-service: {e}"))?;
    let mut children = Vec::new();
    for l in &launches {
        let mut cmd = tokio::process::Command::new(&l.program);
        cmd.args(&l.args)
            .envs(l.env.iter().cloned())
            .stdin(std::process::Stdio::null())
            .kill_on_drop(true);
        let child = cmd
            .spawn()
            .with_context(|| format!("cannot start the {} ({})", l.role, l.program))?;
        tracing::info!(
            role = l.role,
            pid = child.id(),
            "started {} {:?}",
            l.program,
            l.args
        );
        children.push((l.role, child));
    }
    let mut sigterm = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let ready = async {
        loop {
            if tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .is_ok()
            {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
    };
    let outcome = {
        let exited = async {
            let waits = children
                .iter_mut()
                .map(|(role, c)| Box::pin(async move { (*role, c.wait().await) }));
            futures::future::select_all(waits).await.0
        };
        tokio::pin!(ready, exited);
        let mut announced = false;
        loop {
            tokio::select! {
                _ = &mut ready, if !announced => {
                    announced = true;
                    let env = format!("{:?}", args.environment).to_uppercase();
                    eprintln!(
                        "weir: {} expansion service listening on localhost:{port} (environment {env}{})",
                        args.sdk,
                        worker_pool_port
                            .filter(|_| args.environment == ExpansionEnvironment::External)
                            .map(|p| format!(", worker pool localhost:{p}"))
                            .unwrap_or_default()
                    );
                }
                (role, status) = &mut exited => break Err(anyhow::anyhow!(
                    "weir expansion-service: the {role} exited ({})",
                    status.map(|s| s.to_string()).unwrap_or_else(|e| e.to_string())
                )),
                _ = tokio::signal::ctrl_c() => break Ok(()),
                _ = sigterm.recv() => break Ok(()),
            }
        }
    };
    // Stop the JVMs / Pythons (kill_on_drop covers an early return).
    for (_, c) in &mut children {
        let _ = c.kill().await;
    }
    outcome
}

/// A memory budget flag's bytes: N MiB, none for 0, else [`quarter_of_ram`].
fn budget_bytes(mb: Option<usize>) -> Option<usize> {
    match mb {
        Some(0) => None,
        Some(mb) => Some(mb.saturating_mul(1 << 20)),
        None => quarter_of_ram(),
    }
}

/// A quarter of the machine's RAM (Linux /proc/meminfo's MemTotal), the
/// default GroupByKey, user-state and side-input memory budgets; None when
/// it cannot be read.
fn quarter_of_ram() -> Option<usize> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kib: usize = info
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kib * 1024 / 4)
}

/// Starts the Python fork servers `--python_fork_server_prewarm` names, for
/// the environment this server gives its harnesses (see `socket_for`);
/// one that cannot start says so in the log, as a job's would. A job uses
/// one only when its `weir boot --python` names the same interpreter file
/// (a bare name is looked up on PATH; symbolic links are not followed).
fn prewarm_fork_servers(pythons: &[String]) {
    let env = weir_harness::fork_server::own_env();
    for python in pythons {
        if weir_harness::fork_server::ForkServers::global()
            .socket_for(python, &env)
            .is_some()
        {
            tracing::info!("Python fork server of {python} starting (--python_fork_server_prewarm)");
        }
    }
}

/// Runs `weir worker --coordinator at` as local worker `i` for as long as
/// this server lives: restarted a second after it exits, and sent SIGTERM
/// when this process dies (PR_SET_PDEATHSIG).
/// `flags` are this server's own that its workers take too.
async fn supervise_local_worker(
    i: usize,
    at: std::net::SocketAddr,
    token: Option<String>,
    flags: Vec<String>,
) {
    let Some(exe) = weir_harness::weir_exe() else {
        tracing::error!("cannot start local workers: this binary's path is unknown");
        return;
    };
    loop {
        let mut cmd = tokio::process::Command::new(&exe);
        cmd.args(["worker", "--coordinator", &at.to_string(), "--name", &format!("local-{i}")])
            .args(&flags)
            .stdin(std::process::Stdio::null())
            .kill_on_drop(true);
        if let Some(t) = &token {
            // Not in argv, where `ps` would show it.
            cmd.env("WEIR_AUTH_TOKEN", t);
        }
        // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
                Ok(())
            });
        }
        match cmd.spawn() {
            Ok(mut child) => {
                let status = child.wait().await;
                tracing::warn!(worker = i, "local worker exited ({status:?}); restarting it in 1 s");
            }
            Err(e) => tracing::error!(worker = i, "cannot start local worker: {e}"),
        }
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    }
}

/// The `weir serve` arguments a `weir worker` runs its local server with:
/// its Fn API port and address, no web UI, and its own settings of the
/// flags it shares with `weir serve`.
///
/// # Errors
/// clap's error if the arguments do not parse as `weir serve`'s.
fn worker_serve_args(w: &WorkerArgs, token: Option<&str>) -> anyhow::Result<ServeArgs> {
    let mut argv: Vec<String> = vec![
        "serve".into(),
        "--job_port".into(),
        w.fn_api_port.to_string(),
        "--bind".into(),
        w.bind.clone(),
        "--serve_http=false".into(),
    ];
    if let Some(n) = w.workers {
        argv.extend(["--workers".into(), n.to_string()]);
    }
    if let Some(d) = &w.staging_dir {
        argv.extend(["--staging_dir".into(), d.display().to_string()]);
    }
    argv.extend(w.run.to_args());
    if let Some(t) = token {
        argv.extend(["--auth_token".into(), t.to_string()]);
    }
    let matches = ServeArgs::augment_args(clap::Command::new("serve")).try_get_matches_from(&argv)?;
    Ok(<ServeArgs as clap::FromArgMatches>::from_arg_matches(&matches)?)
}

/// `weir worker`: a local server (Fn API for this worker's SDK harnesses,
/// loopback by default) whose jobs come from the coordinator.
async fn worker(w: WorkerArgs) -> anyhow::Result<()> {
    let token = match (&w.auth_token, &w.auth_token_file) {
        (Some(t), _) => Some(t.trim().to_string()),
        (None, Some(f)) => std::fs::read_to_string(f)
            .with_context(|| format!("cannot read --auth_token_file {}", f.display()))?
            .lines()
            .next()
            .map(|l| l.trim().to_string()),
        (None, None) => std::env::var("WEIR_AUTH_TOKEN").ok().map(|t| t.trim().to_string()),
    }
    .filter(|t| !t.is_empty());
    let args = worker_serve_args(&w, token.as_deref())?;
    let name = w.name.clone().unwrap_or_else(|| {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_string())
            .unwrap_or_else(|_| "worker".into());
        format!("{host}:{}", std::process::id())
    });
    serve(
        args,
        Some(weir_jobs::cluster::WorkerConfig {
            coordinator: w.coordinator,
            token,
            name,
            advertise_host: w.advertise_host,
            timely_port: w.timely_port,
        }),
    )
    .await
}

async fn serve(args: ServeArgs, worker: Option<weir_jobs::cluster::WorkerConfig>) -> anyhow::Result<()> {
    // A cluster worker that stops leaves its attempts to the coordinator,
    // which re-runs them elsewhere; cancelling them would cancel the jobs.
    let cancel_on_signal = worker.is_none();
    let security = weir_jobs::security::Security {
        token: auth_token(&args)?.map(Into::into),
        process_commands: args.allow_process_command.clone(),
        docker_images: args.allow_docker_image.clone(),
        weir_binary: weir_harness::weir_exe(),
    };
    let addr = format!("{}:{}", args.bind, args.job_port);
    // Before binding: a non-loopback address needs an access policy.
    let ips: Vec<std::net::IpAddr> = tokio::net::lookup_host(&addr)
        .await
        .with_context(|| format!("cannot resolve --bind {}", args.bind))?
        .map(|a| a.ip())
        .collect();
    for ip in &ips {
        weir_jobs::security::check_bind(*ip, &security, args.insecure_allow_remote)
            .map_err(|e| anyhow::anyhow!("{e}"))?;
    }
    if security.token.is_none() && ips.iter().any(|ip| !ip.is_loopback()) {
        tracing::warn!("serving on {} without a Job API token (--insecure_allow_remote): anyone who reaches it can run commands as this user", args.bind);
    }
    let listener = tokio::net::TcpListener::bind(&addr)
        .await
        .with_context(|| format!("cannot bind {addr}"))?;
    let local = listener.local_addr()?;
    let ui = ui_listener(&args).await?;
    let worker_wait = std::time::Duration::from_secs(args.worker_wait_secs);
    let cluster = match args.cluster_port {
        Some(port) => {
            let l = tokio::net::TcpListener::bind((args.bind.as_str(), port))
                .await
                .with_context(|| format!("cannot bind the cluster port {}:{port} (--cluster_port)", args.bind))?;
            let at = l.local_addr()?;
            tracing::info!("cluster coordinator: workers register on {at}");
            eprintln!("weir: cluster port listening on {at} (weir worker --coordinator {at})");
            // Each local worker runs its jobs as this server would.
            let flags = args.run.to_args();
            for i in 1..=args.local_workers.unwrap_or(0) {
                tokio::spawn(supervise_local_worker(i, at, auth_token(&args)?, flags.clone()));
            }
            Some(l)
        }
        None => None,
    };
    weir_harness::fork_server::ForkServers::global().set_enabled(args.run.python_fork_server);
    weir_harness::cores::set_enabled(args.run.pin_sdk_harnesses);
    if args.run.python_fork_server {
        prewarm_fork_servers(&args.python_fork_server_prewarm);
    } else if !args.python_fork_server_prewarm.is_empty() {
        tracing::warn!("--python_fork_server_prewarm is ignored: --python_fork_server=false");
    }
    let config = weir_jobs::ServerConfig {
        staging_root: args
            .staging_dir
            .unwrap_or_else(|| std::env::temp_dir().join("weir-staging")),
        engine_workers: args
            .workers
            .unwrap_or_else(weir_engine::machine_cores),
        python_for_docker_images: args.python_for_docker_images,
        limits: weir_jobs::limits::Limits {
            max_pipeline_bytes: args.max_pipeline_bytes,
            max_pipeline_transforms: args.max_pipeline_transforms,
            max_option_bytes: args.max_option_bytes,
            max_artifact_bytes_per_job: args.max_artifact_bytes_per_job,
            prepared_job_ttl: std::time::Duration::from_secs(args.prepared_job_ttl_secs),
            max_prepared_jobs: args.max_prepared_jobs,
            max_held_pipeline_bytes: args.max_held_pipeline_bytes,
            max_sdk_harnesses_per_job: args.max_sdk_harnesses_per_job,
            allow_client_staging_locations: args.allow_client_staging_locations,
        },
        capture_prepare_dir: args.capture_prepare_dir,
        security: std::sync::Arc::new(security),
        gbk_memory_budget: budget_bytes(args.gbk_memory_budget_mb),
        user_state_memory_budget: budget_bytes(args.user_state_memory_budget_mb),
        side_input_memory_budget: budget_bytes(args.side_input_memory_budget_mb),
        spill_root: args
            .spill_dir
            .unwrap_or_else(|| std::env::temp_dir().join("weir-spill")),
        min_resume_delay: std::time::Duration::from_millis(args.run.min_resume_delay_ms),
    };
    if worker.is_some() {
        tracing::info!("weir worker: Fn API for this worker's SDK harnesses on {local}");
    } else {
        tracing::info!("weir job service listening on {local}");
        eprintln!("weir: Beam Job API listening on {local}");
    }
    let served = std::sync::Arc::new(std::sync::OnceLock::new());
    let keep = served.clone();
    let server = weir_jobs::serve_with(listener, config, move |registry| {
        let _ = keep.set(registry.clone());
        if let Some(l) = cluster {
            let c = weir_jobs::cluster::Coordinator::new(registry.security().clone(), worker_wait);
            registry.set_coordinator(c.clone());
            tokio::spawn(c.listen(l));
        }
        if let Some(w) = worker {
            let registry = registry.clone();
            tokio::spawn(async move {
                if let Err(why) = weir_jobs::cluster::worker::run(registry, w).await {
                    tracing::error!("{why}");
                    eprintln!("weir worker: {why}");
                    std::process::exit(2);
                }
            });
        }
        if let Some(ui) = ui {
            if let Ok(addr) = ui.local_addr() {
                eprintln!("weir: web UI on http://{addr}/ (Prometheus: /metrics)");
            }
            tokio::spawn(async move {
                if let Err(e) = weir_web::serve(ui, registry).await {
                    tracing::error!("the web UI stopped: {e}");
                }
            });
        }
    });
    let mut sigterm = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let signal = tokio::select! {
        served = server => return served.context("gRPC server failed"),
        _ = tokio::signal::ctrl_c() => "SIGINT",
        _ = sigterm.recv() => "SIGTERM",
    };
    match served.get() {
        Some(registry) if cancel_on_signal => shut_down(registry, signal, &mut sigterm).await,
        _ => eprintln!("weir: {signal}: stopping"),
    }
    weir_harness::fork_server::ForkServers::global().stop();
    Ok(())
}

/// How long `weir serve` waits, after SIGINT or SIGTERM, for its cancelled
/// jobs to stop their SDK harnesses before it exits anyway: the grace a
/// cancel gives bundles in flight, and 3 s for the harnesses to exit.
const SHUTDOWN_GRACE: std::time::Duration =
    weir_harness::environment::STOP_GRACE.saturating_add(std::time::Duration::from_secs(3));

/// How long `weir serve` keeps serving, once its cancelled jobs have
/// stopped, so their clients' streams deliver CANCELLED.
const STREAMS_FLUSH: std::time::Duration = std::time::Duration::from_millis(500);

/// Cancels every job that has not finished (as CancelJob does) and waits up
/// to [`SHUTDOWN_GRACE`], or until a second signal, for them to stop, so
/// their SDK harness processes end with the server.
async fn shut_down(
    registry: &weir_jobs::JobRegistry,
    signal: &str,
    sigterm: &mut tokio::signal::unix::Signal,
) {
    let running: Vec<_> = registry
        .all()
        .into_iter()
        .filter(|j| !weir_jobs::registry::is_terminal(j.state()))
        .collect();
    if running.is_empty() {
        eprintln!("weir: {signal}: stopping");
        return;
    }
    eprintln!(
        "weir: {signal}: cancelling {} unfinished job(s) before stopping",
        running.len()
    );
    for job in &running {
        weir_jobs::service::stop_job(job, false);
    }
    let stopped = async {
        while running
            .iter()
            .any(|j| !weir_jobs::registry::is_terminal(j.state()))
        {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    };
    tokio::select! {
        _ = stopped => {
            // Let the clients' state and message streams carry the
            // terminal state before the server goes.
            tokio::time::sleep(STREAMS_FLUSH).await;
        }
        _ = tokio::time::sleep(SHUTDOWN_GRACE) => {
            eprintln!("weir: jobs still stopping after {SHUTDOWN_GRACE:?}; exiting");
        }
        _ = tokio::signal::ctrl_c() => {}
        _ = sigterm.recv() => {}
    }
}

/// The web UI's listener (see `--ui_port`), or None when it is off or its
/// default port is taken.
async fn ui_listener(args: &ServeArgs) -> anyhow::Result<Option<tokio::net::TcpListener>> {
    if args
        .serve_http
        .as_deref()
        .is_some_and(|v| matches!(v.to_ascii_lowercase().as_str(), "false" | "0" | "no"))
    {
        return Ok(None);
    }
    let port = args.ui_port.unwrap_or(DEFAULT_UI_PORT);
    match tokio::net::TcpListener::bind((args.bind.as_str(), port)).await {
        Ok(l) => Ok(Some(l)),
        Err(e) if args.ui_port.is_none() => {
            tracing::warn!("no web UI: port {port} is taken ({e}); pass --ui_port N (0: any free port)");
            Ok(None)
        }
        Err(e) => Err(e).with_context(|| format!("cannot bind the web UI on {}:{port} (--ui_port)", args.bind)),
    }
}

/// The web UI's port when `--ui_port` is not given (Prism's is 8074 too).
const DEFAULT_UI_PORT: u16 = 8074;

#[cfg(test)]
mod tests {
    use super::*;

    fn boot_dir(args: &[&str]) -> Option<PathBuf> {
        let cli = Cli::try_parse_from(args).expect("weir boot arguments parse");
        match cli.command {
            Some(Command::Boot(b)) => b.semi_persistent_directory,
            _ => panic!("not parsed as `weir boot`"),
        }
    }

    #[test]
    fn serve_takes_the_memory_budget_and_spill_dir() {
        let cli = Cli::try_parse_from([
            "weir",
            "serve",
            "--gbk_memory_budget_mb=64",
            "--spill_dir=/tmp/s",
        ])
        .expect("serve arguments parse");
        let Some(Command::Serve(s)) = cli.command else {
            panic!("not parsed as `weir serve`");
        };
        assert_eq!(s.gbk_memory_budget_mb, Some(64));
        assert_eq!(s.spill_dir, Some(PathBuf::from("/tmp/s")));
        let budget = quarter_of_ram().expect("/proc/meminfo on Linux");
        assert!(budget > 1 << 20, "a quarter of RAM: {budget}");
    }

    #[test]
    fn the_resume_delay_floor_defaults_to_10_ms_and_0_turns_it_off() {
        let serve = |extra: &[&str]| {
            let cli = Cli::try_parse_from(["weir", "serve"].iter().chain(extra))
                .expect("serve arguments parse");
            match cli.command {
                Some(Command::Serve(s)) => s.run.min_resume_delay_ms,
                _ => panic!("not parsed as `weir serve`"),
            }
        };
        assert_eq!(serve(&[]), 10);
        assert_eq!(serve(&["--min_resume_delay_ms=0"]), 0);
        assert!(Cli::try_parse_from(["weir", "serve", "--min_resume_delay_ms=-1"]).is_err());
        assert!(Cli::try_parse_from(["weir", "serve", "--min_resume_delay_ms=60001"]).is_err());
    }

    #[test]
    fn workers_run_jobs_with_the_flags_they_share_with_serve() {
        // `weir serve --local_workers` passes its settings on...
        let cli = Cli::try_parse_from([
            "weir",
            "serve",
            "--min_resume_delay_ms=37",
            "--pin_sdk_harnesses=false",
            "--python_fork_server=false",
        ])
        .expect("serve arguments parse");
        let Some(Command::Serve(s)) = cli.command else {
            panic!("not parsed as `weir serve`");
        };
        let flags = s.run.to_args();
        let worker = Cli::try_parse_from(
            ["weir", "worker", "--coordinator", "localhost:1"]
                .into_iter()
                .map(String::from)
                .chain(flags),
        )
        .expect("the local worker's flags parse as `weir worker`'s");
        let Some(Command::Worker(w)) = worker.command else {
            panic!("not parsed as `weir worker`");
        };
        // ...and a worker runs its local server with them.
        let inner = worker_serve_args(&w, Some("t")).expect("a worker's serve arguments parse");
        assert_eq!(inner.run.min_resume_delay_ms, 37);
        assert!(!inner.run.pin_sdk_harnesses);
        assert!(!inner.run.python_fork_server);
        assert_eq!(inner.serve_http.as_deref(), Some("false"));
    }

    #[test]
    fn boot_takes_the_container_contracts_flags_and_pythons_spelling() {
        // What Weir's PROCESS launcher passes (Beam's container contract).
        let contract = [
            "weir",
            "boot",
            "--id=job-1-worker-1",
            "--provision_endpoint=localhost:1",
            "--logging_endpoint=localhost:1",
            "--artifact_endpoint=localhost:1",
            "--control_endpoint=localhost:1",
            "--semi_persist_dir=/tmp/w1",
        ];
        assert_eq!(boot_dir(&contract), Some(PathBuf::from("/tmp/w1")));
        // Python's spelling, as older Weir launchers passed it.
        let python = [
            "weir",
            "boot",
            "--id=w",
            "--provision_endpoint=localhost:1",
            "--semi_persistent_directory=/tmp/w2",
        ];
        assert_eq!(boot_dir(&python), Some(PathBuf::from("/tmp/w2")));
    }
}
