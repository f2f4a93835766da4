//! The coordinator side of cluster mode (`weir serve --cluster_port`):
//! registers `weir worker` processes and runs each job on `num_workers` of
//! them as one timely computation, restarting a batch job whose worker is
//! lost (up to [`MAX_ATTEMPTS`], as Dataflow retries).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use prost::Message as _;
use tokio::sync::{mpsc, Notify};
use weir_proto::beam;
use weir_proto::beam::job_message::MessageImportance as Importance;
use weir_proto::beam::job_state::Enum as JobState;

use super::protocol::{
    read_frame, read_frame_within, write_frame, ToCoordinator, ToWorker, MAX_HELLO_BYTES,
};
use crate::registry::Job;

/// Attempts of a batch job whose worker process is lost (Dataflow: 4).
pub const MAX_ATTEMPTS: u32 = 4;

/// How long a job waits for enough idle workers before it fails, by
/// default (`weir serve --worker_wait_secs`).
pub const WORKER_WAIT: Duration = Duration::from_secs(60);

/// How long workers get to take an attempt and reserve their ports.
const PREPARE_TIMEOUT: Duration = Duration::from_secs(120);

/// How long a cancelled attempt's workers get to report that they stopped.
const STOP_TIMEOUT: Duration = Duration::from_secs(30);

/// One registered worker process.
struct Worker {
    id: String,
    name: String,
    /// Frames to send: header and body.
    tx: mpsc::UnboundedSender<(ToWorker, Vec<u8>)>,
    /// Attempts it runs now (jobs share workers; each attempt has its own
    /// SDK harnesses and timely computation on it).
    load: AtomicUsize,
    /// Where this worker's events for each attempt go.
    attempts: Mutex<HashMap<String, mpsc::UnboundedSender<Event>>>,
}

/// What an attempt hears from one of its workers.
enum Event {
    From(usize, ToCoordinator, Vec<u8>),
    /// The worker's connection ended.
    Lost(usize),
}

/// The registered workers of a coordinator.
pub struct Coordinator {
    workers: Mutex<Vec<Arc<Worker>>>,
    changed: Notify,
    security: Arc<crate::security::Security>,
    wait: Duration,
    next_id: AtomicU64,
}

impl Coordinator {
    /// A coordinator with no workers; workers must send the Job API token
    /// of `security` when it has one.
    /// A job waits up to `wait` for the workers it needs.
    pub fn new(security: Arc<crate::security::Security>, wait: Duration) -> Arc<Coordinator> {
        Arc::new(Coordinator {
            workers: Mutex::default(),
            changed: Notify::new(),
            security,
            wait,
            next_id: AtomicU64::new(1),
        })
    }

    fn workers(&self) -> std::sync::MutexGuard<'_, Vec<Arc<Worker>>> {
        self.workers.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Accepts workers on `listener` until the process ends.
    pub async fn listen(self: Arc<Self>, listener: tokio::net::TcpListener) {
        loop {
            match listener.accept().await {
                Ok((stream, peer)) => {
                    let _ = stream.set_nodelay(true);
                    let me = self.clone();
                    tokio::spawn(async move {
                        if let Err(e) = me.serve_worker(stream).await {
                            tracing::info!(%peer, "cluster connection ended: {e}");
                        }
                    });
                }
                Err(e) => {
                    tracing::warn!("cluster port: cannot accept: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    }

    async fn serve_worker(self: Arc<Self>, stream: tokio::net::TcpStream) -> std::io::Result<()> {
        let (mut rd, mut wr) = stream.into_split();
        let hello = tokio::time::timeout(
            Duration::from_secs(10),
            read_frame_within::<_, ToCoordinator>(&mut rd, MAX_HELLO_BYTES),
        )
        .await
        .map_err(|_| std::io::Error::other("no Hello within 10 s"))??;
        let (name, refused) = match hello.0 {
            ToCoordinator::Hello {
                token,
                name,
                version,
            } => {
                let refused = if !self.security.token_matches(token.as_deref()) {
                    Some(
                        "the worker's token does not match the coordinator's --auth_token"
                            .to_string(),
                    )
                } else if version != super::protocol::version() {
                    Some(format!(
                        "the worker runs Weir {version}, the coordinator {}",
                        super::protocol::version()
                    ))
                } else {
                    None
                };
                (name, refused)
            }
            other => (
                String::new(),
                Some(format!("expected Hello first, got {other:?}")),
            ),
        };
        if let Some(why) = refused {
            tracing::warn!(worker = %name, "refused a worker: {why}");
            write_frame(&mut wr, &ToWorker::Refused { why: why.clone() }, &[]).await?;
            return Err(std::io::Error::other(why));
        }
        let id = format!("worker-{}", self.next_id.fetch_add(1, Ordering::SeqCst));
        write_frame(
            &mut wr,
            &ToWorker::Welcome {
                worker_id: id.clone(),
            },
            &[],
        )
        .await?;
        let (tx, mut rx) = mpsc::unbounded_channel::<(ToWorker, Vec<u8>)>();
        let worker = Arc::new(Worker {
            id: id.clone(),
            name: name.clone(),
            tx,
            load: AtomicUsize::new(0),
            attempts: Mutex::default(),
        });
        self.workers().push(worker.clone());
        self.changed.notify_waiters();
        tracing::info!(worker = %id, %name, "worker registered");
        let writer = tokio::spawn(async move {
            while let Some((m, body)) = rx.recv().await {
                if write_frame(&mut wr, &m, &body).await.is_err() {
                    break;
                }
            }
        });
        let ended = loop {
            match read_frame::<_, ToCoordinator>(&mut rd).await {
                Ok((m, body)) => {
                    let attempt = match &m {
                        ToCoordinator::Reserved { attempt, .. }
                        | ToCoordinator::Message { attempt, .. }
                        | ToCoordinator::Log { attempt, .. }
                        | ToCoordinator::Metrics { attempt, .. }
                        | ToCoordinator::Finished { attempt, .. } => attempt.clone(),
                        ToCoordinator::Hello { .. } => continue,
                    };
                    let to = worker
                        .attempts
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .get(&attempt)
                        .cloned();
                    if let Some(to) = to {
                        // The process index is filled in by the attempt's relay.
                        let _ = to.send(Event::From(usize::MAX, m, body));
                    }
                }
                Err(e) => break e,
            }
        };
        writer.abort();
        self.workers().retain(|w| w.id != id);
        let attempts: Vec<_> = worker
            .attempts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .drain()
            .map(|(_, tx)| tx)
            .collect();
        for tx in attempts {
            let _ = tx.send(Event::Lost(usize::MAX));
        }
        self.changed.notify_waiters();
        tracing::warn!(worker = %id, %name, "worker lost: {ended}");
        Ok(())
    }

    /// Takes `min..=max` workers (the least loaded, at most `max`), waiting
    /// up to the coordinator's wait for at least `min` to be registered.
    async fn acquire(
        &self,
        min: usize,
        max: usize,
        job: &Job,
    ) -> Result<Vec<Arc<Worker>>, (JobState, String)> {
        let started = Instant::now();
        loop {
            let changed = self.changed.notified();
            {
                let workers = self.workers();
                if workers.len() >= min {
                    let mut by_load: Vec<Arc<Worker>> = workers.clone();
                    by_load.sort_by_key(|w| w.load.load(Ordering::SeqCst));
                    by_load.truncate(max);
                    for w in &by_load {
                        w.load.fetch_add(1, Ordering::SeqCst);
                    }
                    return Ok(by_load);
                }
                if started.elapsed() >= self.wait {
                    return Err((
                        JobState::Failed,
                        format!(
                            "job '{}' needs {min} worker process(es) (--num_workers), but after {} s the coordinator has {} registered; start more with `weir worker --coordinator`",
                            job.name,
                            self.wait.as_secs(),
                            workers.len()
                        ),
                    ));
                }
            }
            if job.cancel.load(Ordering::SeqCst) {
                return Err((
                    JobState::Cancelled,
                    "job cancelled while waiting for workers".into(),
                ));
            }
            let _ = tokio::time::timeout(Duration::from_millis(500), changed).await;
        }
    }
}

/// Frees `workers` from `attempt`.
fn release(workers: &[Arc<Worker>], attempt: &str) {
    for w in workers {
        w.attempts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(attempt);
        let _ = w
            .load
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
    }
}

/// How one attempt ended.
enum Outcome {
    Ok,
    /// A worker process was lost: a batch job may restart.
    WorkerLost(String),
    Failed(JobState, String),
}

/// Whether the job's plan has a TestStream stage (a testing transform that
/// Dataflow does not run at all).
fn has_test_stream(job: &Job) -> bool {
    job.plan.as_ref().is_some_and(|p| {
        p.graph
            .stages
            .iter()
            .any(|s| matches!(s.kind, weir_graph::StageKind::TestStream { .. }))
    })
}

/// Runs `job` on the coordinator's workers: the cluster form of a job's
/// run ([`crate::run`]), with the same result.
pub(crate) async fn run_job(
    coordinator: &Coordinator,
    job: &Arc<Job>,
) -> Result<(), (JobState, String)> {
    let asked = job.validated.num_workers.unwrap_or(1).max(1) as usize;
    let wanted = if asked > 1 && has_test_stream(job) {
        job.message(
            Importance::JobMessageWarning,
            format!(
                "the pipeline has a TestStream ({}): it runs on one worker process, not the {asked} --num_workers asks for, because a TestStream's processing-time clock and its wait for the pipeline to quiesce are those of one process",
                weir_proto::urns::transform::TEST_STREAM
            ),
        );
        1
    } else {
        asked
    };
    let max_attempts = if job.validated.streaming {
        1
    } else {
        MAX_ATTEMPTS
    };
    // The job as Prepare took it, and the plan Prepare made: workers run
    // that plan (bound to their own Fn API) rather than planning again.
    let plan = job
        .plan_to_run()
        .map_err(|e| (JobState::Failed, e))?
        .to_bytes();
    let request = {
        let pipeline = job
            .pipeline
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let prepare = beam::PrepareJobRequest {
            pipeline: Some(pipeline),
            pipeline_options: Some(job.options.clone()),
            job_name: job.name.clone(),
        }
        .encode_to_vec();
        super::protocol::prepare_body(&prepare, &plan)
    };
    for n in 1..=max_attempts {
        // A restart runs on what is left (or was replaced), at least one worker.
        let min = if n == 1 { wanted } else { 1 };
        let workers = coordinator.acquire(min, wanted, job).await?;
        let attempt = format!("{}-a{n}", job.id);
        let names: Vec<&str> = workers.iter().map(|w| w.name.as_str()).collect();
        job.message(
            Importance::JobMessageBasic,
            format!(
                "attempt {n}: running on {} worker process(es): {}",
                workers.len(),
                names.join(", ")
            ),
        );
        let outcome = run_attempt(job, &workers, &attempt, &request).await;
        release(&workers, &attempt);
        match outcome {
            Outcome::Ok => return Ok(()),
            Outcome::Failed(state, why) => return Err((state, why)),
            Outcome::WorkerLost(why) if n < max_attempts => {
                job.message(
                    Importance::JobMessageWarning,
                    format!("attempt {n} failed: {why}; restarting the job (attempt {} of {max_attempts})", n + 1),
                );
            }
            Outcome::WorkerLost(why) => {
                let what = if job.validated.streaming {
                    "a streaming job is not restarted (no checkpoint to resume from)".to_string()
                } else {
                    format!("{max_attempts} attempts failed")
                };
                return Err((
                    JobState::Failed,
                    format!("job '{}' failed: {why}; {what}", job.name),
                ));
            }
        }
    }
    unreachable!("the last attempt returns")
}

async fn run_attempt(
    job: &Arc<Job>,
    workers: &[Arc<Worker>],
    attempt: &str,
    request: &[u8],
) -> Outcome {
    // One channel for the attempt; each worker's events are tagged with its
    // process index by a small relay.
    let (tx, mut rx) = mpsc::unbounded_channel::<Event>();
    for (i, w) in workers.iter().enumerate() {
        let (wtx, mut wrx) = mpsc::unbounded_channel::<Event>();
        w.attempts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(attempt.to_string(), wtx);
        let tx = tx.clone();
        tokio::spawn(async move {
            while let Some(e) = wrx.recv().await {
                let e = match e {
                    Event::From(_, m, b) => Event::From(i, m, b),
                    Event::Lost(_) => Event::Lost(i),
                };
                if tx.send(e).is_err() {
                    break;
                }
            }
        });
    }
    drop(tx);
    let send_all = |m: ToWorker| {
        for w in workers {
            let _ = w.tx.send((m.clone(), vec![]));
        }
    };
    for w in workers {
        let _ = w.tx.send((
            ToWorker::Prepare {
                attempt: attempt.to_string(),
                job_id: job.id.clone(),
                workers: workers.len(),
            },
            request.to_vec(),
        ));
    }
    let lost_name = |i: usize| workers.get(i).map_or("?".to_string(), |w| w.name.clone());
    let cancel_all = || {
        send_all(ToWorker::Cancel {
            attempt: attempt.to_string(),
        })
    };

    let mut addresses: Vec<Option<String>> = vec![None; workers.len()];
    let deadline = tokio::time::Instant::now() + PREPARE_TIMEOUT;
    while addresses.iter().any(Option::is_none) {
        let e = tokio::select! {
            e = rx.recv() => e,
            _ = tokio::time::sleep_until(deadline) => {
                cancel_all();
                return Outcome::WorkerLost(format!("worker(s) did not take the job within {} s", PREPARE_TIMEOUT.as_secs()));
            }
            _ = tokio::time::sleep(Duration::from_millis(200)) => {
                if job.cancel.load(Ordering::SeqCst) {
                    cancel_all();
                    return Outcome::Failed(JobState::Cancelled, "job cancelled".into());
                }
                continue;
            }
        };
        match e {
            None => return Outcome::WorkerLost("every worker of the attempt was lost".into()),
            Some(Event::Lost(i)) => {
                cancel_all();
                return Outcome::WorkerLost(format!(
                    "worker {} was lost while taking the job",
                    lost_name(i)
                ));
            }
            Some(Event::From(i, ToCoordinator::Reserved { address, .. }, _)) => {
                addresses[i] = Some(address);
            }
            Some(Event::From(i, ToCoordinator::Finished { error, .. }, _)) => {
                cancel_all();
                return Outcome::Failed(
                    JobState::Failed,
                    format!(
                        "job '{}' failed on worker {}: {error}",
                        job.name,
                        lost_name(i)
                    ),
                );
            }
            Some(Event::From(i, m, _)) => relay(job, &lost_name(i), m),
        }
    }
    let addresses: Vec<String> = addresses
        .into_iter()
        .map(Option::unwrap_or_default)
        .collect();
    for (i, w) in workers.iter().enumerate() {
        let _ = w.tx.send((
            ToWorker::Start {
                attempt: attempt.to_string(),
                process: i,
                addresses: addresses.clone(),
            },
            vec![],
        ));
    }
    job.set_state(JobState::Running);

    let mut finished = vec![false; workers.len()];
    let mut failure: Option<Outcome> = None;
    let mut cancelled_at: Option<Instant> = None;
    let mut drained = false;
    let mut exchanged = 0u64;
    // Each worker's latest metrics (the last sent just before it finishes);
    // the job's are their sum, so a failed attempt's are replaced and only
    // the completed attempt counts (committed, as Dataflow reports them).
    let mut metrics: Vec<Vec<beam::MonitoringInfo>> = vec![vec![]; workers.len()];
    let mut stages: Vec<Vec<weir_engine::StageProgress>> = vec![vec![]; workers.len()];
    while finished.contains(&false) {
        if failure.is_none() && job.cancel.load(Ordering::SeqCst) {
            failure = Some(Outcome::Failed(JobState::Cancelled, "job cancelled".into()));
        }
        if failure.is_some() && cancelled_at.is_none() {
            cancel_all();
            cancelled_at = Some(Instant::now());
        }
        if cancelled_at.is_some_and(|t| t.elapsed() >= STOP_TIMEOUT) {
            break;
        }
        if !drained && job.drain.load(Ordering::SeqCst) {
            drained = true;
            send_all(ToWorker::Drain {
                attempt: attempt.to_string(),
            });
        }
        let e = tokio::select! {
            e = rx.recv() => e,
            _ = tokio::time::sleep(Duration::from_millis(200)) => continue,
        };
        match e {
            None => break,
            Some(Event::Lost(i)) => {
                finished[i] = true;
                if failure.is_none() {
                    failure = Some(Outcome::WorkerLost(format!(
                        "worker {} was lost (its process ended or its connection broke)",
                        lost_name(i)
                    )));
                }
            }
            Some(Event::From(
                i,
                ToCoordinator::Finished {
                    state,
                    error,
                    exchanged_bytes,
                    ..
                },
                _,
            )) => {
                exchanged += exchanged_bytes;
                let ok = state == JobState::Done as i32 || state == JobState::Drained as i32;
                if !ok && failure.is_none() {
                    failure = Some(
                        if state == JobState::Cancelled as i32 && !job.cancel.load(Ordering::SeqCst)
                        {
                            Outcome::WorkerLost(format!(
                                "worker {} stopped the attempt: {error}",
                                lost_name(i)
                            ))
                        } else if state == JobState::Cancelled as i32 {
                            Outcome::Failed(JobState::Cancelled, "job cancelled".into())
                        } else {
                            Outcome::Failed(
                                JobState::Failed,
                                format!("{error} (on worker {})", lost_name(i)),
                            )
                        },
                    );
                }
                finished[i] = true;
            }
            Some(Event::From(i, ToCoordinator::Metrics { stages: s, .. }, body)) => {
                if let Ok(m) = beam::MetricResults::decode(body.as_slice()) {
                    metrics[i] = m.attempted;
                    job.metrics.replace_with(&metrics);
                }
                // The workers run this job's plan: their stages are its stages.
                stages[i] = s;
                job.progress.publish_parts(&stages);
            }
            Some(Event::From(i, m, _)) => relay(job, &lost_name(i), m),
        }
    }
    if let Some(f) = failure {
        return f;
    }
    job.message(
        Importance::JobMessageBasic,
        format!(
            "{attempt}: the {} worker processes exchanged {exchanged} bytes of encoded elements ({:.1} MiB)",
            workers.len(),
            exchanged as f64 / (1 << 20) as f64
        ),
    );
    Outcome::Ok
}

/// A worker's message or log entry, republished on the coordinator's job.
fn relay(job: &Job, worker: &str, m: ToCoordinator) {
    match m {
        ToCoordinator::Message {
            importance, text, ..
        } => {
            let importance =
                Importance::try_from(importance).unwrap_or(Importance::JobMessageBasic);
            job.message(importance, format!("[{worker}] {text}"));
        }
        ToCoordinator::Log {
            importance, text, ..
        } => {
            use weir_harness::WorkerLog;
            let level = match Importance::try_from(importance)
                .unwrap_or(Importance::JobMessageBasic)
            {
                Importance::JobMessageError => WorkerLog::Error,
                Importance::JobMessageWarning => WorkerLog::Warning,
                Importance::JobMessageDebug | Importance::JobMessageDetailed => WorkerLog::Debug,
                _ => WorkerLog::Info,
            };
            job.sdk_log(level, format!("[{worker}] {text}"));
        }
        _ => {}
    }
}
