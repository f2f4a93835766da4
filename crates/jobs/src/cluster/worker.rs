//! The worker side of cluster mode (`weir worker --coordinator`): registers
//! with the coordinator, and for each attempt it is given runs the
//! coordinator's plan of the job bound to its own Fn API, starts its own
//! SDK harnesses (one runner harness per worker, as on Dataflow's worker
//! VMs), joins the attempt's timely computation and reports messages,
//! metrics and the end state back.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use prost::Message as _;
use tokio::sync::{mpsc, oneshot};
use weir_engine::ClusterPeers;
use weir_proto::beam;
use weir_proto::beam::job_state::Enum as JobState;

use super::protocol::{read_frame, write_frame, ToCoordinator, ToWorker};
use crate::registry::{Job, JobRegistry, View};

/// How long a cancelled attempt may take to stop before the worker process
/// exits: timely is fail-stop, and a computation whose peers are gone may
/// never return.
const STOP_GRACE: Duration = Duration::from_secs(30);

/// How often a worker sends the coordinator its metrics while an attempt runs.
const METRICS_EVERY: Duration = Duration::from_secs(2);

/// Exit status of a worker that had to abandon a computation that would not stop.
pub const EXIT_STUCK: i32 = 3;

/// Settings of `weir worker`.
#[derive(Clone, Debug)]
pub struct WorkerConfig {
    /// `host:port` of the coordinator's `--cluster_port`.
    pub coordinator: String,
    /// The coordinator's `--auth_token`, when it has one.
    pub token: Option<String>,
    /// How this worker is named in job messages (default: host name and pid).
    pub name: String,
    /// The address other workers reach this one's timely listener at;
    /// None: the local address of the connection to the coordinator.
    pub advertise_host: Option<String>,
    /// First port of the timely listeners (one per job this worker runs at
    /// once: this port, the next, ...); 0 picks a free port per attempt.
    pub timely_port: u16,
}

/// This worker's attempts, by attempt id.
type Attempts = Arc<std::sync::Mutex<HashMap<String, Attempt>>>;

/// The job of `attempt`, when this worker runs it.
fn job_of(attempts: &Attempts, attempt: &str) -> Option<Arc<Job>> {
    attempts
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(attempt)
        .map(|a| a.job.clone())
}

/// A running attempt on this worker.
struct Attempt {
    job: Arc<Job>,
    start: Option<oneshot::Sender<ClusterPeers>>,
}

/// Serves the coordinator until it refuses this worker; reconnects (every
/// 2 s) whenever the connection is lost, cancelling the attempts it had.
///
/// # Errors
/// When the coordinator refuses the worker (wrong token or version).
pub async fn run(registry: Arc<JobRegistry>, config: WorkerConfig) -> Result<(), String> {
    let mut said_waiting = false;
    loop {
        let stream = match tokio::net::TcpStream::connect(&config.coordinator).await {
            Ok(s) => s,
            Err(e) => {
                if !said_waiting {
                    tracing::warn!(coordinator = %config.coordinator, "cannot reach the coordinator ({e}); retrying every 2 s");
                    said_waiting = true;
                }
                tokio::time::sleep(Duration::from_secs(2)).await;
                continue;
            }
        };
        said_waiting = false;
        match serve(&registry, &config, stream).await {
            Ok(()) => {}
            Err(Fatal(why)) => return Err(why),
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

struct Fatal(String);

async fn serve(
    registry: &Arc<JobRegistry>,
    config: &WorkerConfig,
    stream: tokio::net::TcpStream,
) -> Result<(), Fatal> {
    let _ = stream.set_nodelay(true);
    let host = match &config.advertise_host {
        Some(h) => h.clone(),
        None => stream
            .local_addr()
            .map(|a| a.ip().to_string())
            .unwrap_or_else(|_| "127.0.0.1".into()),
    };
    let (mut rd, mut wr) = stream.into_split();
    let hello = ToCoordinator::Hello {
        token: config.token.clone(),
        name: config.name.clone(),
        version: super::protocol::version(),
    };
    if let Err(e) = write_frame(&mut wr, &hello, &[]).await {
        tracing::warn!("lost the coordinator: {e}");
        return Ok(());
    }
    match read_frame::<_, ToWorker>(&mut rd).await {
        Ok((ToWorker::Welcome { worker_id }, _)) => {
            tracing::info!(coordinator = %config.coordinator, %worker_id, timely_host = %host, "registered with the coordinator");
        }
        Ok((ToWorker::Refused { why }, _)) => {
            return Err(Fatal(format!(
                "the coordinator at {} refused this worker: {why}",
                config.coordinator
            )));
        }
        Ok((other, _)) => {
            tracing::warn!("unexpected first message from the coordinator: {other:?}");
            return Ok(());
        }
        Err(e) => {
            tracing::warn!("lost the coordinator: {e}");
            return Ok(());
        }
    }
    let (out_tx, mut out_rx) = mpsc::unbounded_channel::<(ToCoordinator, Vec<u8>)>();
    let writer = tokio::spawn(async move {
        while let Some((m, body)) = out_rx.recv().await {
            if write_frame(&mut wr, &m, &body).await.is_err() {
                break;
            }
        }
    });
    let attempts: Attempts = Arc::default();
    let ended = loop {
        let (m, body) = match read_frame::<_, ToWorker>(&mut rd).await {
            Ok(f) => f,
            Err(e) => break e,
        };
        match m {
            ToWorker::Prepare {
                attempt,
                job_id,
                workers,
            } => {
                let (start_tx, start_rx) = oneshot::channel();
                match prepare(registry, &attempt, &job_id, &body) {
                    Ok(job) => {
                        attempts.lock().unwrap_or_else(|p| p.into_inner()).insert(
                            attempt.clone(),
                            Attempt {
                                job: job.clone(),
                                start: Some(start_tx),
                            },
                        );
                        tokio::spawn(run_attempt(
                            registry.clone(),
                            job,
                            attempt,
                            workers,
                            host.clone(),
                            config.timely_port,
                            start_rx,
                            out_tx.clone(),
                            attempts.clone(),
                        ));
                    }
                    Err(error) => {
                        let _ = out_tx.send((
                            ToCoordinator::Finished {
                                attempt,
                                state: JobState::Failed as i32,
                                error,
                                exchanged_bytes: 0,
                            },
                            vec![],
                        ));
                    }
                }
            }
            ToWorker::Start {
                attempt,
                process,
                addresses,
            } => {
                let start = attempts
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .get_mut(&attempt)
                    .and_then(|a| a.start.take());
                if let Some(start) = start {
                    let _ = start.send(ClusterPeers {
                        process,
                        addresses,
                        session: attempt.clone(),
                        listener: None,
                    });
                }
            }
            ToWorker::Cancel { attempt } => {
                if let Some(job) = job_of(&attempts, &attempt) {
                    stop(job, attempts.clone(), attempt);
                }
            }
            ToWorker::Drain { attempt } => {
                if let Some(job) = job_of(&attempts, &attempt) {
                    job.drain.store(true, Ordering::SeqCst);
                }
            }
            ToWorker::Welcome { .. } | ToWorker::Refused { .. } => {}
        }
    };
    tracing::warn!(coordinator = %config.coordinator, "lost the coordinator ({ended}); cancelling this worker's attempts");
    writer.abort();
    let running: Vec<(String, Arc<Job>)> = attempts
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .map(|(id, a)| (id.clone(), a.job.clone()))
        .collect();
    for (id, job) in running {
        stop(job, attempts.clone(), id);
    }
    Ok(())
}

/// Cancels `job`; exits the process if it has not stopped within [`STOP_GRACE`].
fn stop(job: Arc<Job>, attempts: Attempts, attempt: String) {
    job.cancel.store(true, Ordering::SeqCst);
    tokio::spawn(async move {
        tokio::time::sleep(STOP_GRACE).await;
        if attempts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains_key(&attempt)
        {
            tracing::error!(%attempt, "the attempt did not stop within {} s of its cancel (a timely computation whose peers are gone cannot be abandoned); exiting with status {EXIT_STUCK} so that the worker is restarted", STOP_GRACE.as_secs());
            std::process::exit(EXIT_STUCK);
        }
    });
}

/// Takes attempt `attempt` of job `job_id` from `body` (a length-prefixed
/// `PrepareJobRequest`, then the coordinator's plan; see
/// [`ToWorker::Prepare`]), the plan bound to this worker's Fn API.
fn prepare(
    registry: &JobRegistry,
    attempt: &str,
    job_id: &str,
    body: &[u8],
) -> Result<Arc<Job>, String> {
    let undecodable =
        |what: &str| format!("the coordinator sent an undecodable job {job_id}: {what}");
    let (request, plan) = super::protocol::split_prepare_body(body).map_err(|e| undecodable(&e))?;
    let req = beam::PrepareJobRequest::decode(request).map_err(|e| undecodable(&e.to_string()))?;
    let mut plan = weir_plan::Plan::from_bytes(plan).map_err(|e| undecodable(&e.to_string()))?;
    plan.rebind_fn_api(&registry.url)
        .map_err(|e| undecodable(&e.to_string()))?;
    let pipeline = req.pipeline.unwrap_or_default();
    let options = req.pipeline_options.unwrap_or_default();
    let validated = crate::options::validate(&options).map_err(|e| e.to_string())?;
    let locations = crate::locations::resolve(
        &validated,
        &registry.default_locations(),
        &crate::locations::SystemEnv,
    )
    .map_err(|e| e.to_string())?;
    // The staged artifacts the coordinator's pipeline names (its staging
    // folder must be shared with the workers, or be gs:// / s3://).
    let mut staged = Vec::new();
    for env in pipeline
        .components
        .iter()
        .flat_map(|c| c.environments.values())
    {
        for dep in &env.dependencies {
            if dep.type_urn != weir_proto::urns::artifact::TYPE_FILE {
                continue;
            }
            if let Ok(p) = beam::ArtifactFilePayload::decode(dep.type_payload.as_slice()) {
                staged.push((p.path.clone(), staged_artifact(attempt, &p.path)?));
            }
        }
    }
    registry
        .staged
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .extend(staged);
    Ok(registry.create_job(
        attempt.to_string(),
        req.job_name,
        pipeline,
        Some(plan),
        options,
        locations,
    ))
}

/// Where the artifact staged at `path` (a local path, or a `gs://` / `s3://`
/// URL) is read from, for the SDK harnesses of job `job_id`.
fn staged_artifact(job_id: &str, path: &str) -> Result<crate::registry::StagedArtifact, String> {
    let cannot = |e: String| format!("artifact {path}: {e}");
    let (location, object) = if path.contains("://") {
        let (scheme, rest) = path.split_once("://").unwrap_or_default();
        let (bucket, key) = rest.split_once('/').unwrap_or((rest, ""));
        let l = crate::locations::open(
            "staging_location",
            &format!("{scheme}://{bucket}"),
            &crate::locations::SystemEnv,
        )
        .map_err(|e| cannot(e.to_string()))?;
        (l, object_store::path::Path::from(key))
    } else {
        let p = std::path::Path::new(path);
        let (dir, file) = (
            p.parent().unwrap_or(std::path::Path::new("/")),
            p.file_name().unwrap_or_default(),
        );
        let l = crate::locations::default_folder(dir).map_err(cannot)?;
        (
            l,
            object_store::path::Path::from(file.to_string_lossy().as_ref()),
        )
    };
    Ok(crate::registry::StagedArtifact {
        job_id: job_id.to_string(),
        location,
        path: object,
    })
}

/// How many ports past `--timely_port` a worker tries for concurrent jobs.
const PORT_RANGE: u16 = 64;

/// An attempt's timely listener on `host`: any free port when `first` is
/// 0, else the first free one from `first` on. Returns its address and the
/// bound listener, which the attempt holds until it ends, so that neither
/// another attempt nor any other socket (an outgoing connection's
/// ephemeral port) takes the port before its workers connect.
fn reserve(host: &str, first: u16) -> Result<(String, std::net::TcpListener), String> {
    let candidates: Vec<u16> = if first == 0 {
        vec![0]
    } else {
        (0..PORT_RANGE)
            .filter_map(|i| first.checked_add(i))
            .collect()
    };
    let mut last = String::new();
    for port in candidates {
        match std::net::TcpListener::bind((host, port)) {
            Ok(l) => {
                let port = l.local_addr().map_err(|e| e.to_string())?.port();
                let address = if host.contains(':') {
                    format!("[{host}]:{port}")
                } else {
                    format!("{host}:{port}")
                };
                return Ok((address, l));
            }
            Err(e) => last = format!("cannot listen on {host}:{port} for timely: {e}"),
        }
    }
    Err(last)
}

#[allow(clippy::too_many_arguments)]
async fn run_attempt(
    registry: Arc<JobRegistry>,
    job: Arc<Job>,
    attempt: String,
    workers: usize,
    host: String,
    timely_port: u16,
    start: oneshot::Receiver<ClusterPeers>,
    out: mpsc::UnboundedSender<(ToCoordinator, Vec<u8>)>,
    attempts: Attempts,
) {
    // Forward the job's messages and logs as they come.
    let (_, mut events) = job.subscribe(View::Logs);
    let forward_out = out.clone();
    let forward_attempt = attempt.clone();
    let forwarder = tokio::spawn(async move {
        loop {
            let Some(p) = events.recv().await else { break };
            let Some(beam::job_messages_response::Response::MessageResponse(m)) =
                p.view(View::Logs).and_then(|e| e.response.clone())
            else {
                continue;
            };
            let on_stream = p.view(View::Stream).is_some();
            let attempt = forward_attempt.clone();
            let m = if on_stream {
                ToCoordinator::Message {
                    attempt,
                    importance: m.importance,
                    text: m.message_text,
                }
            } else {
                ToCoordinator::Log {
                    attempt,
                    importance: m.importance,
                    text: m.message_text,
                }
            };
            if forward_out.send((m, vec![])).is_err() {
                break;
            }
        }
    });
    let finish = |state: JobState, error: String| {
        let metrics = beam::MetricResults {
            attempted: job.metrics.snapshot(),
            committed: vec![],
        };
        // The stages' final progress first, then the end.
        let stages = job.progress.stages();
        let _ = out.send((
            ToCoordinator::Metrics {
                attempt: attempt.clone(),
                stages,
            },
            metrics.encode_to_vec(),
        ));
        let _ = out.send((
            ToCoordinator::Finished {
                attempt: attempt.clone(),
                state: state as i32,
                error,
                exchanged_bytes: job.progress.exchanged_bytes(),
            },
            vec![],
        ));
    };
    match reserve(&host, timely_port) {
        Ok((address, listener)) => {
            let _ = out.send((
                ToCoordinator::Reserved {
                    attempt: attempt.clone(),
                    address,
                },
                vec![],
            ));
            tracing::info!(%attempt, workers, "attempt taken; waiting for its peers");
            let peers = tokio::select! {
                p = start => p.ok(),
                _ = async { while !job.cancel.load(Ordering::SeqCst) { tokio::time::sleep(Duration::from_millis(100)).await } } => None,
            };
            match peers {
                Some(mut peers) => {
                    peers.listener = Some(Arc::new(listener));
                    // The coordinator's GetJobMetrics sees this worker's metrics while it runs.
                    let (ticker_job, ticker_out, ticker_attempt) =
                        (job.clone(), out.clone(), attempt.clone());
                    let ticker = tokio::spawn(async move {
                        loop {
                            tokio::time::sleep(METRICS_EVERY).await;
                            let m = beam::MetricResults {
                                attempted: ticker_job.metrics.snapshot(),
                                committed: vec![],
                            };
                            let stages = ticker_job.progress.stages();
                            let frame = (
                                ToCoordinator::Metrics {
                                    attempt: ticker_attempt.clone(),
                                    stages,
                                },
                                m.encode_to_vec(),
                            );
                            if ticker_out.send(frame).is_err() {
                                break;
                            }
                        }
                    });
                    let (state, error) =
                        crate::run::run_attempt(registry.clone(), job.clone(), peers).await;
                    ticker.abort();
                    // Give the forwarder the last messages before Finished.
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    finish(state, error);
                }
                None => finish(JobState::Cancelled, "cancelled before it started".into()),
            }
        }
        Err(e) => finish(JobState::Failed, e),
    }
    forwarder.abort();
    attempts
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .remove(&attempt);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The reserved port stays bound until the attempt drops its listener:
    /// nothing else can bind it, a reservation from the same first port
    /// takes another one, and once dropped the port can be reserved again.
    #[test]
    fn a_reserved_port_is_held_until_the_listener_is_dropped() {
        let (address, listener) = reserve("127.0.0.1", 0).unwrap();
        let port = listener.local_addr().unwrap().port();
        assert_eq!(address, format!("127.0.0.1:{port}"));
        assert!(std::net::TcpListener::bind(("127.0.0.1", port)).is_err());
        if port < u16::MAX - PORT_RANGE {
            let (next, other) = reserve("127.0.0.1", port).unwrap();
            assert_ne!(next, address);
            drop(other);
        }
        drop(listener);
        let (again, _) = reserve("127.0.0.1", port).unwrap();
        assert_eq!(again, address);
    }
}
