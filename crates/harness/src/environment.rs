//! Environments: how SDK harnesses are started (`beam:env:external:v1`,
//! `beam:env:process:v1`, `beam:env:docker:v1` in beam_runner_api.proto).

use std::collections::HashMap;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use prost::Message;
use tokio::io::AsyncBufReadExt;
use weir_proto::{beam, urns, MAX_GRPC_MESSAGE_BYTES};

use crate::registry::{FnApi, LogSink, Worker};
use crate::{HarnessError, Result};

/// How long SDK harnesses get to dial the control service after being started.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(120);

/// The SDK workers of one job, and what it takes to stop them.
pub struct StartedWorkers {
    /// Workers by environment id.
    pub workers: HashMap<String, Vec<Arc<Worker>>>,
    children: Vec<tokio::process::Child>,
    pool_workers: Vec<(String, String)>,
    /// Semi-persistent folders of PROCESS workers, removed at stop.
    dirs: Vec<std::path::PathBuf>,
}

/// The semi-persistent folder (artifacts, pickled main session) of a PROCESS worker.
fn worker_dir(worker_id: &str) -> std::path::PathBuf {
    std::env::temp_dir().join("weir-workers").join(worker_id)
}

fn env_error(env_id: &str, urn: &str, message: impl Into<String>) -> HarnessError {
    HarnessError::Environment {
        environment: env_id.to_string(),
        urn: urn.to_string(),
        message: message.into(),
    }
}

fn descriptor(url: &str) -> Option<beam::ApiServiceDescriptor> {
    Some(beam::ApiServiceDescriptor {
        url: url.to_string(),
        ..Default::default()
    })
}

/// Checks that Weir can start `env` (before a job runs).
///
/// # Errors
/// [`HarnessError::Environment`] naming the environment and URN.
pub fn validate(env_id: &str, env: &beam::Environment) -> Result<()> {
    match env.urn.as_str() {
        urns::env::EXTERNAL => {
            let p = beam::ExternalPayload::decode(env.payload.as_slice())
                .map_err(|e| env_error(env_id, &env.urn, e.to_string()))?;
            if p.endpoint.map(|e| e.url).unwrap_or_default().is_empty() {
                return Err(env_error(
                    env_id,
                    &env.urn,
                    "ExternalPayload has no worker pool endpoint",
                ));
            }
        }
        urns::env::PROCESS => {
            let p = beam::ProcessPayload::decode(env.payload.as_slice())
                .map_err(|e| env_error(env_id, &env.urn, e.to_string()))?;
            if p.command.trim().is_empty() {
                return Err(env_error(
                    env_id,
                    &env.urn,
                    "ProcessPayload has an empty command",
                ));
            }
        }
        urns::env::DOCKER => {
            let p = beam::DockerPayload::decode(env.payload.as_slice())
                .map_err(|e| env_error(env_id, &env.urn, e.to_string()))?;
            if p.container_image.is_empty() {
                return Err(env_error(
                    env_id,
                    &env.urn,
                    "DockerPayload has no container image",
                ));
            }
        }
        other => return Err(env_error(env_id, other, "unsupported environment type")),
    }
    Ok(())
}

fn forward_output<R: tokio::io::AsyncRead + Unpin + Send + 'static>(reader: R, worker_id: String) {
    tokio::spawn(async move {
        let mut lines = tokio::io::BufReader::new(reader).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            // The SDK's log entries reach the job through the Logging service;
            // the process's own output goes to Weir's log only.
            tracing::info!(worker = %worker_id, "{line}");
        }
    });
}

/// Starts `per_environment` SDK harnesses for each environment and waits until
/// they have all dialed the control service.
///
/// # Errors
/// [`HarnessError::Environment`] when one cannot be started,
/// [`HarnessError::ConnectTimeout`] when one does not connect in time.
pub async fn start(
    fn_api: &Arc<FnApi>,
    job_id: &str,
    environments: &HashMap<String, beam::Environment>,
    per_environment: usize,
    provision: &beam::ProvisionInfo,
    log: LogSink,
) -> Result<StartedWorkers> {
    let url = fn_api.url.clone();
    let mut started = StartedWorkers {
        workers: HashMap::new(),
        children: vec![],
        pool_workers: vec![],
        dirs: vec![],
    };
    let mut env_ids: Vec<_> = environments.keys().cloned().collect();
    env_ids.sort();
    for env_id in env_ids {
        let env = &environments[&env_id];
        validate(&env_id, env)?;
        for _ in 0..per_environment.max(1) {
            let worker_id = fn_api.fresh_id(&format!("{job_id}-worker-"));
            let mut info = provision.clone();
            info.logging_endpoint = descriptor(&url);
            info.artifact_endpoint = descriptor(&url);
            info.control_endpoint = descriptor(&url);
            info.dependencies = env.dependencies.clone();
            let worker =
                fn_api.add_worker(worker_id.clone(), job_id.to_string(), info, log.clone());
            started
                .workers
                .entry(env_id.clone())
                .or_default()
                .push(worker);
            let flags = vec![
                format!("--id={worker_id}"),
                format!("--provision_endpoint={url}"),
                format!("--logging_endpoint={url}"),
                format!("--artifact_endpoint={url}"),
                format!("--control_endpoint={url}"),
            ];
            match env.urn.as_str() {
                urns::env::EXTERNAL => {
                    let p = beam::ExternalPayload::decode(env.payload.as_slice())
                        .map_err(|e| env_error(&env_id, &env.urn, e.to_string()))?;
                    let pool = p.endpoint.map(|e| e.url).unwrap_or_default();
                    let addr = weir_proto::grpc_uri(&pool);
                    let mut client = beam::beam_fn_external_worker_pool_client::BeamFnExternalWorkerPoolClient::connect(addr)
                        .await
                        .map_err(|e| env_error(&env_id, &env.urn, format!("cannot reach worker pool {pool}: {e}")))?
                        .max_decoding_message_size(MAX_GRPC_MESSAGE_BYTES)
                        .max_encoding_message_size(MAX_GRPC_MESSAGE_BYTES);
                    let resp = client
                        .start_worker(beam::StartWorkerRequest {
                            worker_id: worker_id.clone(),
                            control_endpoint: descriptor(&url),
                            logging_endpoint: descriptor(&url),
                            artifact_endpoint: descriptor(&url),
                            provision_endpoint: descriptor(&url),
                            params: p.params.clone(),
                        })
                        .await
                        .map_err(|e| {
                            env_error(
                                &env_id,
                                &env.urn,
                                format!("StartWorker on {pool} failed: {e}"),
                            )
                        })?
                        .into_inner();
                    if !resp.error.is_empty() {
                        return Err(env_error(
                            &env_id,
                            &env.urn,
                            format!("worker pool {pool}: {}", resp.error),
                        ));
                    }
                    started.pool_workers.push((pool, worker_id.clone()));
                }
                urns::env::PROCESS | urns::env::DOCKER => {
                    let (program, args, envs) = if env.urn == urns::env::PROCESS {
                        let p = beam::ProcessPayload::decode(env.payload.as_slice())
                            .map_err(|e| env_error(&env_id, &env.urn, e.to_string()))?;
                        let mut words = p.command.split_whitespace().map(str::to_string);
                        let program = words.next().unwrap_or_default();
                        let mut args: Vec<String> = words.collect();
                        args.extend(flags.clone());
                        let dir = worker_dir(&worker_id);
                        args.push(format!("--semi_persistent_directory={}", dir.display()));
                        started.dirs.push(dir);
                        (program, args, p.env)
                    } else {
                        let p = beam::DockerPayload::decode(env.payload.as_slice())
                            .map_err(|e| env_error(&env_id, &env.urn, e.to_string()))?;
                        let mut args = vec![
                            "run".into(),
                            "--rm".into(),
                            "--network=host".into(),
                            p.container_image,
                        ];
                        args.extend(flags.clone());
                        ("docker".to_string(), args, HashMap::new())
                    };
                    let mut child = tokio::process::Command::new(&program)
                        .args(&args)
                        .envs(envs)
                        .stdin(Stdio::null())
                        .stdout(Stdio::piped())
                        .stderr(Stdio::piped())
                        .kill_on_drop(true)
                        .spawn()
                        .map_err(|e| {
                            env_error(&env_id, &env.urn, format!("cannot start {program:?}: {e}"))
                        })?;
                    if let Some(out) = child.stdout.take() {
                        forward_output(out, worker_id.clone());
                    }
                    if let Some(err) = child.stderr.take() {
                        forward_output(err, worker_id.clone());
                    }
                    started.children.push(child);
                }
                other => return Err(env_error(&env_id, other, "unsupported environment type")),
            }
        }
    }
    for workers in started.workers.values() {
        for w in workers {
            let mut rx = w.connected.subscribe();
            if tokio::time::timeout(CONNECT_TIMEOUT, rx.wait_for(|c| *c))
                .await
                .is_err()
            {
                return Err(HarnessError::ConnectTimeout {
                    worker_id: w.id.clone(),
                    seconds: CONNECT_TIMEOUT.as_secs(),
                });
            }
        }
    }
    Ok(started)
}

impl StartedWorkers {
    /// Stops every worker: StopWorker on pools, kill for processes.
    pub async fn stop(mut self, fn_api: &FnApi) {
        // Forget the workers first, so their streams closing is not taken
        // for a dying SDK harness.
        for workers in self.workers.values() {
            for w in workers {
                fn_api.remove_worker(&w.id);
            }
        }
        for (pool, worker_id) in self.pool_workers.drain(..) {
            let addr = weir_proto::grpc_uri(&pool);
            if let Ok(mut client) =
                beam::beam_fn_external_worker_pool_client::BeamFnExternalWorkerPoolClient::connect(
                    addr,
                )
                .await
            {
                let _ = client
                    .stop_worker(beam::StopWorkerRequest {
                        worker_id: worker_id.clone(),
                    })
                    .await;
            }
        }
        for mut child in self.children.drain(..) {
            let _ = child.start_kill();
            let _ = tokio::time::timeout(Duration::from_secs(5), child.wait()).await;
        }
        for dir in self.dirs.drain(..) {
            let _ = tokio::fs::remove_dir_all(dir).await;
        }
    }
}
