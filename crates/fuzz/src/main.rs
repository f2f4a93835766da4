//! `weir-fuzz`: mutates captured pipelines and Job API requests and sends
//! them to Weir's planner (in-process) or to a live `weir serve`.
//!
//! ```text
//! weir-fuzz planner --secs 60 [--seed N] [--seeds DIR]...
//! weir-fuzz server  --secs 60 [--seed N] [--seeds DIR]... [--weir target/release/weir]
//! ```
//!
//! Seeds: every `*.pb` under the given folders (default `tests/fuzz/seeds`
//! and `crates/plan/tests/fuzz_seeds`), each a `PrepareJobRequest` or a
//! bare `Pipeline`. A case fails when the planner panics, overflows its
//! stack (the process aborts), takes more than 10 s, or reports an internal
//! error; against a server, also when an RPC answers anything but OK,
//! INVALID_ARGUMENT, UNIMPLEMENTED (for Prepare) or a named NOT_FOUND /
//! FAILED_PRECONDITION (other methods), takes over 30 s, or the server
//! dies. The failing case is written to `target/fuzz-failures/`, and the
//! case in progress to `target/fuzz-failures/current.pb` (kept when the
//! process aborts). Exit code 0 only when no case failed.

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use prost::Message;
use weir_fuzz::{Mutator, Rng};
use weir_proto::beam;

const CASE_LIMIT: Duration = Duration::from_secs(10);
const RPC_LIMIT: Duration = Duration::from_secs(30);

struct Args {
    mode: String,
    secs: u64,
    seed: u64,
    seeds: Vec<PathBuf>,
    weir: PathBuf,
    out: PathBuf,
}

fn args() -> anyhow::Result<Args> {
    let mut it = std::env::args().skip(1);
    let mode = it.next().unwrap_or_default();
    if mode != "planner" && mode != "server" {
        bail!("usage: weir-fuzz planner|server [--secs N] [--seed N] [--seeds DIR]... [--weir BIN]");
    }
    let mut a = Args {
        mode,
        secs: 60,
        seed: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1),
        seeds: vec![],
        weir: "target/release/weir".into(),
        out: "target/fuzz-failures".into(),
    };
    while let Some(flag) = it.next() {
        let value = it.next().with_context(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--secs" => a.secs = value.parse()?,
            "--seed" => a.seed = value.parse()?,
            "--seeds" => a.seeds.push(value.into()),
            "--weir" => a.weir = value.into(),
            "--out" => a.out = value.into(),
            _ => bail!("unknown flag {flag}"),
        }
    }
    if a.seeds.is_empty() {
        a.seeds = vec!["tests/fuzz/seeds".into(), "crates/plan/tests/fixtures".into()];
    }
    Ok(a)
}

fn load_seeds(dirs: &[PathBuf]) -> anyhow::Result<Vec<(String, beam::PrepareJobRequest)>> {
    let mut seeds = vec![];
    for dir in dirs {
        let Ok(entries) = std::fs::read_dir(dir) else {
            continue;
        };
        let mut paths: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
        paths.sort();
        for path in paths.into_iter().filter(|p| p.extension().is_some_and(|e| e == "pb")) {
            let bytes = std::fs::read(&path)?;
            let name = path.display().to_string();
            // A PrepareJobRequest has the pipeline in field 1; a bare Pipeline
            // decodes as one with garbage, so tell them by their components.
            let req = match beam::PrepareJobRequest::decode(bytes.as_slice()) {
                Ok(r) if r.pipeline.as_ref().is_some_and(|p| p.components.is_some()) => r,
                _ => beam::PrepareJobRequest {
                    pipeline: Some(beam::Pipeline::decode(bytes.as_slice()).with_context(|| name.clone())?),
                    job_name: "fuzz".into(),
                    ..Default::default()
                },
            };
            seeds.push((name, req));
        }
    }
    if seeds.is_empty() {
        bail!("no seeds (*.pb) under {dirs:?}");
    }
    Ok(seeds)
}

/// What a run found.
#[derive(Default)]
struct Tally {
    cases: u64,
    accepted: u64,
    refused: std::collections::BTreeMap<String, u64>,
    failures: u64,
}

impl Tally {
    fn report(&self, mode: &str, took: Duration) {
        eprintln!(
            "weir-fuzz {mode}: {} cases in {:.0} s, {} accepted, refusals {:?}, {} failures",
            self.cases,
            took.as_secs_f64(),
            self.accepted,
            self.refused,
            self.failures
        );
    }
}

fn save(out: &Path, name: &str, req: &beam::PrepareJobRequest) -> PathBuf {
    let _ = std::fs::create_dir_all(out);
    let path = out.join(name);
    let _ = std::fs::write(&path, req.encode_to_vec());
    path
}

fn planner(a: &Args, m: &Mutator) -> anyhow::Result<Tally> {
    let mut rng = Rng::new(a.seed);
    let deadline = Instant::now() + Duration::from_secs(a.secs);
    let mut t = Tally::default();
    while Instant::now() < deadline {
        let (seed, req) = m.request(&mut rng);
        save(&a.out, "current.pb", &req);
        let pipeline = req.pipeline.clone().unwrap_or_default();
        let (tx, rx) = mpsc::channel();
        // The planner runs on a thread with the stack of a tokio blocking
        // thread (2 MiB), as in `weir serve`.
        std::thread::Builder::new()
            .stack_size(2 << 20)
            .spawn(move || {
                let r = std::panic::catch_unwind(|| {
                    weir_plan::plan(&pipeline, &weir_plan::PlanOptions {
                        fn_api_url: "localhost:1".into(),
                        ..Default::default()
                    })
                    .map(|_| ())
                });
                let _ = tx.send(r);
            })?;
        t.cases += 1;
        let verdict = match rx.recv_timeout(CASE_LIMIT) {
            Ok(Ok(Ok(()))) => {
                t.accepted += 1;
                None
            }
            Ok(Ok(Err(e))) => {
                let kind = match &e {
                    weir_plan::PlanError::Unsupported { .. } => "Unsupported",
                    weir_plan::PlanError::Invalid(_) => "Invalid",
                    weir_plan::PlanError::Coder { .. } => "Coder",
                    weir_plan::PlanError::Internal(_) => "Internal",
                };
                *t.refused.entry(kind.into()).or_default() += 1;
                (kind == "Internal" || e.to_string().trim().is_empty()).then(|| format!("internal error: {e}"))
            }
            Ok(Err(_)) => Some("the planner panicked".to_string()),
            Err(_) => Some(format!("the planner took more than {CASE_LIMIT:?}")),
        };
        if let Some(why) = verdict {
            t.failures += 1;
            let path = save(&a.out, &format!("planner-{}-{}.pb", a.seed, t.cases), &req);
            eprintln!("FAILURE (case {} from {seed}): {why}; saved {}", t.cases, path.display());
            if why.contains("took more") {
                break; // the thread still runs; stop here
            }
        }
    }
    let _ = std::fs::remove_file(a.out.join("current.pb"));
    Ok(t)
}

struct Server {
    child: std::process::Child,
    endpoint: String,
    dir: PathBuf,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn start_server(weir: &Path) -> anyhow::Result<Server> {
    use std::io::BufRead;
    let dir = std::env::temp_dir().join(format!("weir-fuzz-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let weir = std::fs::canonicalize(weir).with_context(|| format!("no {}", weir.display()))?;
    // In its own folder: a mutated job's relative temp_location or output
    // path lands there, not in the caller's working tree.
    let mut child = std::process::Command::new(&weir)
        .current_dir(&dir)
        .args(["serve", "--job_port", "0", "--staging_dir"])
        .arg(dir.join("staging"))
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .env("RUST_LOG", "warn")
        .spawn()
        .with_context(|| format!("cannot start {}", weir.display()))?;
    let stderr = child.stderr.take().context("no stderr")?;
    let mut lines = std::io::BufReader::new(stderr).lines();
    let endpoint = loop {
        let Some(line) = lines.next() else {
            bail!("weir serve exited before listening");
        };
        let line = line?;
        if let Some(addr) = line.strip_prefix("weir: Beam Job API listening on ") {
            break addr.trim().to_string();
        }
    };
    // Keep draining its stderr so it never blocks on a full pipe.
    std::thread::spawn(move || for _ in lines {});
    Ok(Server {
        child,
        endpoint,
        dir,
    })
}

fn server(a: &Args, m: &Mutator) -> anyhow::Result<Tally> {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let mut s = start_server(&a.weir)?;
    rt.block_on(async {
        use beam::job_service_client::JobServiceClient;
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", s.endpoint))?
            .connect()
            .await?;
        let mut client = JobServiceClient::new(channel)
            .max_decoding_message_size(1 << 30)
            .max_encoding_message_size(1 << 30);
        let mut rng = Rng::new(a.seed);
        let deadline = Instant::now() + Duration::from_secs(a.secs);
        let mut t = Tally::default();
        let mut known_ids: Vec<String> = vec![];
        while Instant::now() < deadline {
            let (seed, req) = m.request(&mut rng);
            save(&a.out, "current.pb", &req);
            t.cases += 1;
            let mut failure = None;
            match tokio::time::timeout(RPC_LIMIT, client.prepare(req.clone())).await {
                Err(_) => failure = Some(format!("Prepare took more than {RPC_LIMIT:?}")),
                Ok(Ok(r)) => {
                    t.accepted += 1;
                    let id = r.into_inner().preparation_id;
                    // Never run a mutated pipeline (its environments may run
                    // any command): cancel it.
                    let _ = client.cancel(beam::CancelJobRequest { job_id: id.clone() }).await;
                    known_ids.push(id);
                    if known_ids.len() > 50 {
                        known_ids.remove(0);
                    }
                }
                Ok(Err(status)) => {
                    *t.refused.entry(format!("{:?}", status.code())).or_default() += 1;
                    let named = !status.message().trim().is_empty();
                    // INVALID_ARGUMENT / UNIMPLEMENTED (the pipeline), or the
                    // operator's policy: PERMISSION_DENIED (environment
                    // allowlist), RESOURCE_EXHAUSTED (a limit, named).
                    let refusal = matches!(
                        status.code(),
                        tonic::Code::InvalidArgument
                            | tonic::Code::Unimplemented
                            | tonic::Code::PermissionDenied
                            | tonic::Code::ResourceExhausted
                    );
                    if !refusal || !named {
                        failure = Some(format!("Prepare answered {:?}: {}", status.code(), status.message()));
                    }
                }
            }
            // Job API calls on known, mutated and unknown ids.
            if failure.is_none() && rng.one_in(2) {
                let id = match rng.below(3) {
                    0 => rng.pick(&known_ids).cloned().unwrap_or_default(),
                    1 => {
                        let mut id = rng.pick(&known_ids).cloned().unwrap_or_default();
                        if !id.is_empty() {
                            let i = rng.below(id.len());
                            id.replace_range(i..=i, "x");
                        }
                        id
                    }
                    _ => ["", "job-", "../../etc", "\u{0}", "job-00000000000000000000000000000000"][rng.below(5)].to_string(),
                };
                let r = tokio::time::timeout(RPC_LIMIT, job_api_call(&mut client, &mut rng, id)).await;
                failure = match r {
                    Err(_) => Some("a Job API call took more than 30 s".into()),
                    Ok(Err(status)) if matches!(
                        status.code(),
                        tonic::Code::NotFound | tonic::Code::FailedPrecondition | tonic::Code::InvalidArgument
                    ) && !status.message().is_empty() => None,
                    Ok(Err(status)) => Some(format!("a Job API call answered {:?}: {}", status.code(), status.message())),
                    Ok(Ok(())) => None,
                };
            }
            if let Ok(Some(exit)) = s.child.try_wait() {
                failure = Some(format!("weir serve died: {exit}"));
            }
            if let Some(why) = failure {
                t.failures += 1;
                let path = save(&a.out, &format!("server-{}-{}.pb", a.seed, t.cases), &req);
                eprintln!("FAILURE (case {} from {seed}): {why}; saved {}", t.cases, path.display());
                if why.contains("died") || why.contains("took more") {
                    break;
                }
            }
        }
        let _ = std::fs::remove_file(a.out.join("current.pb"));
        anyhow::Ok(t)
    })
    .map(|t| {
        let _ = s.child.kill();
        t
    })
}

/// One random Job API call about job `id`.
async fn job_api_call(
    client: &mut beam::job_service_client::JobServiceClient<tonic::transport::Channel>,
    rng: &mut Rng,
    id: String,
) -> Result<(), tonic::Status> {
    use futures_lite::next;
    match rng.below(9) {
        0 => client.get_state(beam::GetJobStateRequest { job_id: id }).await.map(|_| ()),
        1 => client.get_pipeline(beam::GetJobPipelineRequest { job_id: id }).await.map(|_| ()),
        2 => client.cancel(beam::CancelJobRequest { job_id: id }).await.map(|_| ()),
        3 => client.drain(beam::DrainJobRequest { job_id: id }).await.map(|_| ()),
        4 => client.get_job_metrics(beam::GetJobMetricsRequest { job_id: id }).await.map(|_| ()),
        5 => client
            .run(beam::RunJobRequest {
                preparation_id: id,
                retrieval_token: String::new(),
            })
            .await
            .map(|_| ()),
        6 => {
            let mut req = tonic::Request::new(beam::JobMessagesRequest { job_id: id });
            req.metadata_mut().insert("weir-follow", "false".parse().expect("ascii"));
            let mut s = client.get_message_stream(req).await?.into_inner();
            next(&mut s).await
        }
        7 => {
            let mut req = tonic::Request::new(beam::GetJobStateRequest { job_id: id });
            req.metadata_mut().insert("weir-follow", "false".parse().expect("ascii"));
            let mut s = client.get_state_stream(req).await?.into_inner();
            next(&mut s).await
        }
        _ => client.get_jobs(beam::GetJobsRequest {}).await.map(|_| ()),
    }
}

mod futures_lite {
    /// Reads a stream to its end (a stream that does not end is the caller's timeout).
    pub async fn next<T>(s: &mut tonic::Streaming<T>) -> Result<(), tonic::Status> {
        while s.message().await?.is_some() {}
        Ok(())
    }
}

fn main() -> anyhow::Result<()> {
    let a = args()?;
    let seeds = load_seeds(&a.seeds)?;
    eprintln!("weir-fuzz {}: {} seeds, rng seed {}, {} s", a.mode, seeds.len(), a.seed, a.secs);
    let m = Mutator::new(seeds);
    let start = Instant::now();
    let t = if a.mode == "planner" { planner(&a, &m)? } else { server(&a, &m)? };
    t.report(&a.mode, start.elapsed());
    if t.failures > 0 {
        bail!("{} failing cases (saved under {})", t.failures, a.out.display());
    }
    Ok(())
}
