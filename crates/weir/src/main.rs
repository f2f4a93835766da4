//! The `weir` binary: argument parsing and start-up only.
//!
//! - `weir serve --job_port 8099` (or plain `weir --job_port N`, as Beam's
//!   PrismRunner launches a runner binary): the Job API, artifact services and
//!   Fn API on one gRPC port.
//! - `weir boot --id ID --provision_endpoint HOST:PORT [--java]`: the boot
//!   command of a `beam:env:process:v1` Python (or, with `--java`, Java) SDK
//!   harness.
//! - `weir jobs list|describe|cancel|logs`: a Job API client for a running server.

use std::path::PathBuf;

mod jobs;

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
    /// List, describe, cancel the jobs of a running Weir server, or show their logs.
    Jobs(JobsArgs),
}

#[derive(Args)]
struct JobsArgs {
    /// Job API endpoint of the server.
    #[arg(long, default_value = "localhost:8099", global = true)]
    endpoint: String,
    #[command(subcommand)]
    action: JobsAction,
}

#[derive(Subcommand)]
enum JobsAction {
    /// One line per job (tab-separated, after a header): id, state, name,
    /// start and end time (UTC), labels.
    List,
    /// A job's name, state, times, labels, state changes, CPU and memory, and options.
    Describe { job_id: String },
    /// Cancel a job.
    Cancel { job_id: String },
    /// Drain a job: its sources stop, work in flight finishes, windows fire,
    /// and it ends DRAINED.
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
    /// Most MiB one batch GroupByKey keeps in memory; beyond it the groups are
    /// written as sorted runs to --spill_dir and merged back as windows fire
    /// (default: a quarter of the machine's RAM; 0: no bound).
    #[arg(long = "gbk_memory_budget_mb", alias = "gbk-memory-budget-mb")]
    gbk_memory_budget_mb: Option<usize>,
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
    /// Accepted for compatibility with Beam's Prism launcher (Weir serves no web UI yet).
    #[arg(long = "serve_http", hide = true)]
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
    #[arg(long)]
    java: bool,
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

fn main() -> anyhow::Result<()> {
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
            let sdk = if b.java {
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
        Some(Command::Serve(s)) => runtime.block_on(serve(s)),
        Some(Command::Jobs(j)) => runtime.block_on(jobs::run(j)),
        None => runtime.block_on(serve(cli.serve)),
    }
}

/// `$JAVA_HOME/bin/java` when `JAVA_HOME` is set, else `java`.
fn default_java() -> String {
    std::env::var_os("JAVA_HOME")
        .map(|home| PathBuf::from(home).join("bin").join("java"))
        .filter(|java| java.is_file())
        .map(|java| java.display().to_string())
        .unwrap_or_else(|| "java".into())
}

/// A quarter of the machine's RAM (Linux /proc/meminfo's MemTotal), the
/// default GroupByKey memory budget; None when it cannot be read.
fn default_gbk_memory_budget() -> Option<usize> {
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

async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    let addr = format!("{}:{}", args.bind, args.job_port);
    let listener = tokio::net::TcpListener::bind(&addr)
        .await
        .with_context(|| format!("cannot bind {addr}"))?;
    let local = listener.local_addr()?;
    let config = weir_jobs::ServerConfig {
        staging_root: args
            .staging_dir
            .unwrap_or_else(|| std::env::temp_dir().join("weir-staging")),
        engine_workers: args.workers.unwrap_or_else(|| {
            std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1)
        }),
        python_for_docker_images: args.python_for_docker_images,
        gbk_memory_budget: match args.gbk_memory_budget_mb {
            Some(0) => None,
            Some(mb) => Some(mb.saturating_mul(1 << 20)),
            None => default_gbk_memory_budget(),
        },
        spill_root: args
            .spill_dir
            .unwrap_or_else(|| std::env::temp_dir().join("weir-spill")),
    };
    tracing::info!("weir job service listening on {local}");
    eprintln!("weir: Beam Job API listening on {local}");
    weir_jobs::serve(listener, config)
        .await
        .context("gRPC server failed")
}

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
        let budget = default_gbk_memory_budget().expect("/proc/meminfo on Linux");
        assert!(budget > 1 << 20, "a quarter of RAM: {budget}");
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
