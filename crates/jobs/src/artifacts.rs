//! Artifacts (beam_artifact_api.proto): staging pulls each environment's
//! dependencies from the submitting client over
//! `ReverseArtifactRetrievalService` into the job's staging location
//! (`<staging_location>/<job id>/`, see [`crate::locations`]: a local
//! folder, `gs://` or `s3://`, written through `object_store`); retrieval
//! serves them to SDK harnesses with `ResolveArtifacts` / `GetArtifact`,
//! reading them back through the same store, to the job's own SDK workers
//! only (the `worker_id` header names a registered worker of that job).

use std::pin::Pin;
use std::sync::Arc;

use futures::{Stream, StreamExt};
use prost::Message;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use weir_proto::beam::artifact_request_wrapper::Request as Ask;
use weir_proto::beam::artifact_response_wrapper::Response as Answer;
use weir_proto::{beam, urns};

use crate::locations::Location;
use crate::registry::{JobRegistry, StagedArtifact};

const CHUNK: usize = 1 << 20;

/// Why a staging stream ended when its job was cancelled or forgotten.
const CANCELLED: &str = "the job was cancelled (or forgotten) before its artifacts were staged";

/// How a staging stream ended.
enum StreamEnd {
    Staged,
    /// The job was cancelled or forgotten first ([`CANCELLED`]).
    Cancelled,
    /// Why staging failed.
    Failed(String),
}

/// `ArtifactStagingService`.
pub struct StagingService(pub Arc<JobRegistry>);

/// Where a prepared job's artifact staging stands: one
/// `ReverseArtifactRetrievalService` stream per job, between Prepare and Run.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Staging {
    /// No client has opened the staging stream.
    #[default]
    NotStarted,
    /// A client's staging stream is open.
    InProgress,
    /// Every environment's dependencies are in the job's staging location.
    Staged,
    /// Staging ended early with this error (the job has to be prepared again).
    Failed(String),
}

/// How often a staging stream looks whether its job was cancelled or forgotten.
const CANCEL_CHECK: std::time::Duration = std::time::Duration::from_millis(200);

/// Whether `job` may run as far as its artifacts go (RunJob). `staging`
/// is the job's, locked by the caller, so that no stream starts staging
/// between this check and the job's start.
///
/// # Errors
/// Why not, for FAILED_PRECONDITION: staging failed or is still running, or
/// an environment lists artifacts (other than embedded ones) that no client
/// staged: no SDK harness could fetch them.
pub(crate) fn check_staged(job: &crate::Job, staging: &Staging) -> Result<(), String> {
    match staging {
        Staging::Staged => Ok(()),
        Staging::InProgress => Err(format!(
            "job {} is still staging its artifacts: call Run once the client's ReverseArtifactRetrievalService stream has ended",
            job.id
        )),
        Staging::Failed(e) => Err(format!(
            "job {}'s artifact staging failed ({e}): prepare the job again",
            job.id
        )),
        Staging::NotStarted => {
            let pipeline = job.pipeline.lock().unwrap_or_else(|p| p.into_inner());
            let environments = pipeline.components.as_ref().map(|c| &c.environments);
            let mut unstaged: Vec<(&String, usize)> = environments
                .into_iter()
                .flatten()
                .map(|(id, env)| {
                    let n = env
                        .dependencies
                        .iter()
                        .filter(|a| a.type_urn != urns::artifact::TYPE_EMBEDDED)
                        .count();
                    (id, n)
                })
                .filter(|(_, n)| *n > 0)
                .collect();
            unstaged.sort();
            match unstaged.first() {
                None => Ok(()),
                Some((env, n)) => Err(format!(
                    "job {}: environment {env:?} lists {n} artifact(s) that were never staged: stage them through the ArtifactStagingService endpoint and staging_session_token that Prepare returned, then call Run",
                    job.id
                )),
            }
        }
    }
}

/// Marks `job` as staging, if a staging stream may start now.
///
/// # Errors
/// FAILED_PRECONDITION naming the job: it was run, cancelled or
/// forgotten, or another stream staged (or stages) its artifacts.
fn begin_staging(job: &crate::Job) -> Result<(), tonic::Status> {
    let mut staging = job.staging.lock().unwrap_or_else(|p| p.into_inner());
    let refused = |why: String| Err(tonic::Status::failed_precondition(why));
    if job.state() != beam::job_state::Enum::Stopped
        || job.cancel.load(std::sync::atomic::Ordering::SeqCst)
    {
        return refused(format!(
            "job {} is {:?}: artifacts are staged between Prepare and Run",
            job.id,
            job.state()
        ));
    }
    match &*staging {
        Staging::NotStarted => {
            *staging = Staging::InProgress;
            Ok(())
        }
        Staging::InProgress => refused(format!(
            "job {}'s artifacts are already being staged by another stream",
            job.id
        )),
        Staging::Staged => refused(format!("job {}'s artifacts were already staged", job.id)),
        Staging::Failed(e) => refused(format!(
            "job {}'s artifact staging already failed ({e}): prepare the job again",
            job.id
        )),
    }
}

/// Resolves once `job` is cancelled or forgotten before it ran.
async fn stopped(job: &crate::Job) {
    let mut tick = tokio::time::interval(CANCEL_CHECK);
    while !job.cancel.load(std::sync::atomic::Ordering::SeqCst) {
        tick.tick().await;
    }
}

/// `ArtifactRetrievalService`.
pub struct RetrievalService(pub Arc<JobRegistry>);

type Inbound = tonic::Streaming<beam::ArtifactResponseWrapper>;

async fn next(inbound: &mut Inbound) -> Result<beam::ArtifactResponseWrapper, String> {
    match inbound.next().await {
        Some(Ok(m)) => Ok(m),
        Some(Err(e)) => Err(format!("staging stream error: {e}")),
        None => Err("client closed the staging stream early".into()),
    }
}

fn staged_name(a: &beam::ArtifactInformation, n: usize) -> String {
    let name = if a.role_urn == urns::artifact::ROLE_STAGING_TO {
        beam::ArtifactStagingToRolePayload::decode(a.role_payload.as_slice())
            .map(|p| p.staged_name)
            .unwrap_or_default()
    } else {
        String::new()
    };
    let safe: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "._-".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect();
    format!("{n}-{safe}")
}

/// Streams one artifact into a location (multipart uploads for large
/// artifacts on cloud stores, via `object_store`'s buffered writer).
pub struct Writer<'a> {
    location: &'a Location,
    path: &'a object_store::path::Path,
    inner: object_store::buffered::BufWriter,
}

impl<'a> Writer<'a> {
    /// A writer of `path` inside `location`.
    pub fn new(location: &'a Location, path: &'a object_store::path::Path) -> Self {
        Writer {
            location,
            path,
            inner: object_store::buffered::BufWriter::new(location.store.clone(), path.clone()),
        }
    }

    fn fail(&self, e: impl std::fmt::Display) -> String {
        self.location.error(format!(
            "cannot write {}: {e}",
            self.location.display(self.path)
        ))
    }

    /// Appends bytes.
    ///
    /// # Errors
    /// The location's error text (naming its option) with the store's error.
    pub async fn write(&mut self, data: &[u8]) -> Result<(), String> {
        use tokio::io::AsyncWriteExt;
        let r = self.inner.write_all(data).await;
        r.map_err(|e| self.fail(e))
    }

    /// Completes the upload.
    ///
    /// # Errors
    /// As [`Writer::write`].
    pub async fn finish(mut self) -> Result<(), String> {
        use tokio::io::AsyncWriteExt;
        let r = self.inner.shutdown().await;
        r.map_err(|e| self.fail(e))
    }
}

/// The chunks of a staged artifact, each at most [`CHUNK`] bytes, read
/// from its store as they are sent.
pub type ArtifactChunks = Pin<Box<dyn Stream<Item = Result<Vec<u8>, tonic::Status>> + Send>>;

/// Reads a staged artifact back from its store, [`CHUNK`] bytes at a time:
/// serving an artifact to each SDK harness holds one chunk in memory, not
/// the artifact.
///
/// # Errors
/// NOT_FOUND with the location (and its option) when the store cannot open
/// it; a later read error ends the stream with the same message.
pub async fn read_staged(a: &StagedArtifact) -> Result<ArtifactChunks, tonic::Status> {
    use object_store::ObjectStoreExt;
    let shown = a.location.display(&a.path);
    let error = a.location.error(format!("cannot read {shown}: "));
    let fail = move |e: object_store::Error| tonic::Status::not_found(format!("{error}{e}"));
    let got = a.location.store.get(&a.path).await.map_err(&fail)?;
    struct Reading {
        parts: futures::stream::BoxStream<'static, object_store::Result<bytes::Bytes>>,
        pending: bytes::BytesMut,
        done: bool,
        sent: bool,
    }
    let first = Reading { parts: got.into_stream(), pending: bytes::BytesMut::new(), done: false, sent: false };
    Ok(Box::pin(futures::stream::unfold(Some(first), move |reading| {
        let fail = fail.clone();
        async move {
            let mut r = reading?;
            while !r.done && r.pending.len() < CHUNK {
                match r.parts.next().await {
                    Some(Ok(b)) => r.pending.extend_from_slice(&b),
                    Some(Err(e)) => return Some((Err(fail(e)), None)),
                    None => r.done = true,
                }
            }
            // An empty artifact is one empty chunk, as SDKs expect a reply.
            if r.pending.is_empty() && r.sent {
                return None;
            }
            r.sent = true;
            let n = r.pending.len().min(CHUNK);
            let chunk = r.pending.split_to(n).to_vec();
            Some((Ok(chunk), Some(r)))
        }
    })))
}

/// Pulls every dependency of every environment of the job; returns the
/// rewritten environments.
async fn stage(
    registry: &JobRegistry,
    job: &crate::Job,
    inbound: &mut Inbound,
    tx: &mpsc::Sender<Result<beam::ArtifactRequestWrapper, tonic::Status>>,
) -> Result<(), String> {
    let mut environments = job
        .pipeline
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .components
        .clone()
        .unwrap_or_default()
        .environments;
    let mut env_ids: Vec<String> = environments.keys().cloned().collect();
    env_ids.sort();
    let mut n = 0;
    let max_bytes = registry.config.limits.max_artifact_bytes_per_job;
    let mut total: u64 = 0;
    for env_id in env_ids {
        let deps = environments[&env_id].dependencies.clone();
        if deps.is_empty() {
            continue;
        }
        let ask = |r| Ok(beam::ArtifactRequestWrapper { request: Some(r) });
        tx.send(ask(Ask::ResolveArtifact(beam::ResolveArtifactsRequest {
            artifacts: deps,
            preferred_urns: vec![
                urns::artifact::TYPE_FILE.into(),
                urns::artifact::TYPE_EMBEDDED.into(),
            ],
        })))
        .await
        .map_err(|_| "client went away")?;
        let resolved = match next(inbound).await?.response {
            Some(Answer::ResolveArtifactResponse(r)) => r.replacements,
            _ => return Err("expected a ResolveArtifactsResponse".into()),
        };
        let mut staged = Vec::new();
        for a in resolved {
            if a.type_urn == urns::artifact::TYPE_EMBEDDED {
                staged.push(a);
                continue;
            }
            tx.send(ask(Ask::GetArtifact(beam::GetArtifactRequest {
                artifact: Some(a.clone()),
            })))
            .await
            .map_err(|_| "client went away")?;
            n += 1;
            let location = &job.locations.staging;
            let path = location.path(&[&job.id, &staged_name(&a, n)]);
            let mut writer = Writer::new(location, &path);
            loop {
                let m = next(inbound).await?;
                if let Some(Answer::GetArtifactResponse(r)) = m.response {
                    total = total.saturating_add(r.data.len() as u64);
                    if total > max_bytes {
                        return Err(crate::limits::over(
                            &format!("the artifacts staged by job {} (so far)", job.id),
                            format!("{total} bytes"),
                            format!("{max_bytes} bytes"),
                            crate::limits::flag::MAX_ARTIFACT_BYTES_PER_JOB,
                        ));
                    }
                    writer.write(&r.data).await?;
                }
                if m.is_last {
                    break;
                }
            }
            writer.finish().await?;
            let shown = location.display(&path);
            registry
                .staged
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(
                    shown.clone(),
                    StagedArtifact {
                        job_id: job.id.clone(),
                        location: location.clone(),
                        path,
                    },
                );
            staged.push(beam::ArtifactInformation {
                type_urn: urns::artifact::TYPE_FILE.into(),
                type_payload: beam::ArtifactFilePayload {
                    path: shown,
                    sha256: String::new(),
                }
                .encode_to_vec(),
                role_urn: a.role_urn,
                role_payload: a.role_payload,
            });
        }
        if let Some(env) = environments.get_mut(&env_id) {
            env.dependencies = staged;
        }
    }
    let mut pipeline = job.pipeline.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(c) = pipeline.components.as_mut() {
        c.environments = environments;
    }
    Ok(())
}

#[tonic::async_trait]
impl beam::artifact_staging_service_server::ArtifactStagingService for StagingService {
    type ReverseArtifactRetrievalServiceStream =
        Pin<Box<dyn Stream<Item = Result<beam::ArtifactRequestWrapper, tonic::Status>> + Send>>;

    async fn reverse_artifact_retrieval_service(
        &self,
        request: tonic::Request<Inbound>,
    ) -> Result<tonic::Response<Self::ReverseArtifactRetrievalServiceStream>, tonic::Status> {
        let mut inbound = request.into_inner();
        let first = next(&mut inbound)
            .await
            .map_err(tonic::Status::invalid_argument)?;
        let job = self.0.get(&first.staging_token).ok_or_else(|| {
            tonic::Status::not_found(format!("unknown staging token {:?}", first.staging_token))
        })?;
        begin_staging(&job)?;
        let (tx, rx) = mpsc::channel(16);
        let registry = self.0.clone();
        tokio::spawn(async move {
            let ended = tokio::select! {
                staged = stage(&registry, &job, &mut inbound, &tx) => match staged {
                    Ok(()) => StreamEnd::Staged,
                    Err(e) => StreamEnd::Failed(e),
                },
                _ = stopped(&job) => StreamEnd::Cancelled,
            };
            let outcome = match &ended {
                StreamEnd::Staged => Staging::Staged,
                StreamEnd::Cancelled => Staging::Failed(CANCELLED.to_string()),
                StreamEnd::Failed(e) => Staging::Failed(e.clone()),
            };
            *job.staging.lock().unwrap_or_else(|p| p.into_inner()) = outcome;
            let status = match ended {
                StreamEnd::Staged => return,
                StreamEnd::Cancelled => {
                    // What it wrote before it saw the cancel goes too.
                    registry.release_unrun(&job);
                    tonic::Status::cancelled(format!("job {}: {CANCELLED}", job.id))
                }
                StreamEnd::Failed(e) => {
                    let message = format!("artifact staging failed: {e}");
                    tracing::warn!(job = %job.id, "{message}");
                    job.message(beam::job_message::MessageImportance::JobMessageError, message.clone());
                    if e.contains(crate::limits::flag::MAX_ARTIFACT_BYTES_PER_JOB) {
                        tonic::Status::resource_exhausted(message)
                    } else {
                        tonic::Status::internal(message)
                    }
                }
            };
            let _ = tx.send(Err(status)).await;
        });
        Ok(tonic::Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}

/// The job of the SDK worker named by a retrieval call's `worker_id` header
/// (the header every SDK channel carries): artifacts are served only to a
/// registered worker, and only its own job's.
///
/// # Errors
/// INVALID_ARGUMENT without the header, NOT_FOUND for an unknown worker id.
fn caller_job<T>(
    registry: &JobRegistry,
    request: &tonic::Request<T>,
) -> Result<String, tonic::Status> {
    let id = request
        .metadata()
        .get("worker_id")
        .and_then(|v| v.to_str().ok())
        .ok_or_else(|| tonic::Status::invalid_argument("missing worker_id header"))?;
    registry
        .fn_api
        .worker(id)
        .map(|w| w.job_id.clone())
        .ok_or_else(|| tonic::Status::not_found(format!("unknown SDK worker id {id:?}")))
}

#[tonic::async_trait]
impl beam::artifact_retrieval_service_server::ArtifactRetrievalService for RetrievalService {
    type GetArtifactStream =
        Pin<Box<dyn Stream<Item = Result<beam::GetArtifactResponse, tonic::Status>> + Send>>;

    async fn resolve_artifacts(
        &self,
        request: tonic::Request<beam::ResolveArtifactsRequest>,
    ) -> Result<tonic::Response<beam::ResolveArtifactsResponse>, tonic::Status> {
        caller_job(&self.0, &request)?;
        Ok(tonic::Response::new(beam::ResolveArtifactsResponse {
            replacements: request.into_inner().artifacts,
        }))
    }

    async fn get_artifact(
        &self,
        request: tonic::Request<beam::GetArtifactRequest>,
    ) -> Result<tonic::Response<Self::GetArtifactStream>, tonic::Status> {
        let job_id = caller_job(&self.0, &request)?;
        let a = request.into_inner().artifact.unwrap_or_default();
        let data = match a.type_urn.as_str() {
            urns::artifact::TYPE_FILE => {
                let p =
                    beam::ArtifactFilePayload::decode(a.type_payload.as_slice()).map_err(|e| {
                        tonic::Status::invalid_argument(format!("bad ArtifactFilePayload: {e}"))
                    })?;
                let staged = self
                    .0
                    .staged
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .get(&p.path)
                    .cloned();
                let Some(staged) = staged.filter(|s| s.job_id == job_id) else {
                    return Err(tonic::Status::permission_denied(format!(
                        "{} was not staged with this server for job {job_id}",
                        p.path
                    )));
                };
                let chunks = read_staged(&staged).await?;
                return Ok(tonic::Response::new(Box::pin(chunks.map(|c| {
                    c.map(|data| beam::GetArtifactResponse { data })
                }))));
            }
            urns::artifact::TYPE_EMBEDDED => {
                beam::EmbeddedFilePayload::decode(a.type_payload.as_slice())
                    .map_err(|e| {
                        tonic::Status::invalid_argument(format!("bad EmbeddedFilePayload: {e}"))
                    })?
                    .data
            }
            other => {
                return Err(tonic::Status::unimplemented(format!(
                    "artifact type {other} is not supported"
                )))
            }
        };
        let chunks: Vec<Result<beam::GetArtifactResponse, tonic::Status>> = if data.is_empty() {
            vec![Ok(beam::GetArtifactResponse { data })]
        } else {
            data.chunks(CHUNK)
                .map(|c| Ok(beam::GetArtifactResponse { data: c.to_vec() }))
                .collect()
        };
        Ok(tonic::Response::new(Box::pin(futures::stream::iter(
            chunks,
        ))))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use object_store::memory::InMemory;
    use object_store::path::Path;

    use super::*;
    use crate::locations::StoreKind;

    #[tokio::test]
    async fn artifacts_round_trip_through_a_store() {
        // The in-memory store stands in for a gs:// bucket.
        let location = Location {
            option: Some("staging_location".into()),
            url: "gs://bucket/staging".into(),
            kind: StoreKind::Gcs,
            store: Arc::new(InMemory::new()),
            prefix: Path::from("staging"),
            local: None,
        };
        let path = location.path(&["job-1", "1-pickled_main_session"]);
        let data: Vec<u8> = (0..3 * CHUNK + 17).map(|i| (i % 251) as u8).collect();
        let mut w = Writer::new(&location, &path);
        for chunk in data.chunks(CHUNK / 3) {
            w.write(chunk).await.unwrap();
        }
        w.finish().await.unwrap();
        assert_eq!(
            location.display(&path),
            "gs://bucket/staging/job-1/1-pickled_main_session"
        );
        let staged = StagedArtifact {
            job_id: "job-1".into(),
            location: location.clone(),
            path: path.clone(),
        };
        let chunks: Vec<Vec<u8>> = read_staged(&staged).await.unwrap().map(|c| c.unwrap()).collect().await;
        assert_eq!(chunks.iter().map(Vec::len).collect::<Vec<_>>(), [CHUNK, CHUNK, CHUNK, 17]);
        assert_eq!(chunks.concat(), data);

        let missing = StagedArtifact {
            path: location.path(&["job-1", "gone"]),
            ..staged.clone()
        };
        // An empty artifact is one empty chunk.
        let empty_path = location.path(&["job-1", "2-empty"]);
        Writer::new(&location, &empty_path).finish().await.unwrap();
        let empty = StagedArtifact { path: empty_path, ..staged.clone() };
        let chunks: Vec<Vec<u8>> = read_staged(&empty).await.unwrap().map(|c| c.unwrap()).collect().await;
        assert_eq!(chunks, vec![Vec::<u8>::new()]);

        let Err(e) = read_staged(&missing).await else { panic!("a missing artifact was read") };
        assert_eq!(e.code(), tonic::Code::NotFound);
        assert!(
            e.message().starts_with(
                "pipeline option --staging_location: gs://bucket/staging: cannot read gs://bucket/staging/job-1/gone: "
            ),
            "{}",
            e.message()
        );
    }
}
