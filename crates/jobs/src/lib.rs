//! Weir's job service: the Beam Job API (`beam_job_api.proto`), artifact
//! staging and retrieval (`beam_artifact_api.proto`), pipeline options and
//! the job registry; wires plan, engine and harness together for each job.
//!
//! Layer: jobs. Entry types: [`JobRegistry`] (all jobs of this server),
//! [`JobService`], [`artifacts::StagingService`],
//! [`artifacts::RetrievalService`], and [`serve`] which assembles every
//! service on one gRPC port.

pub mod artifacts;
pub mod locations;
pub mod options;
pub mod registry;
pub mod resources;
mod run;
pub mod service;

use std::net::SocketAddr;
use std::sync::Arc;

pub use registry::{Job, JobRegistry};
pub use service::JobService;
use weir_harness::FnApi;
use weir_proto::{beam, MAX_GRPC_MESSAGE_BYTES as MAX};

/// Settings of a Weir server.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// Where staged artifacts are stored (one folder per job).
    pub staging_root: std::path::PathBuf,
    /// Timely worker threads per job (default: cores).
    pub engine_workers: usize,
    /// Interpreter replacing `apache/beam_python3.x_sdk` images when no Docker
    /// daemon answers (`weir serve --python_for_docker_images`; None: $WEIR_PYTHON or python3).
    pub python_for_docker_images: Option<String>,
    /// Most bytes one batch GroupByKey of a job keeps in memory before it
    /// spills sorted runs under `spill_root` (`weir serve
    /// --gbk_memory_budget_mb`); None: no bound.
    pub gbk_memory_budget: Option<usize>,
    /// Where GroupByKeys spill (one folder per job, removed when it ends).
    pub spill_root: std::path::PathBuf,
}

/// Serves the Job API, artifact services and every Fn API service on
/// `listener` until the process ends.
///
/// # Errors
/// The transport error when the server cannot run.
pub async fn serve(
    listener: tokio::net::TcpListener,
    config: ServerConfig,
) -> Result<(), tonic::transport::Error> {
    let addr: SocketAddr = listener.local_addr().expect("bound listener");
    let host = if addr.ip().is_unspecified() {
        "localhost".to_string()
    } else {
        addr.ip().to_string()
    };
    let url = format!("{host}:{}", addr.port());
    let fn_api = FnApi::new(url.clone());
    let registry = JobRegistry::new(fn_api.clone(), config, url);
    let router = tonic::transport::Server::builder()
        .add_service(
            beam::job_service_server::JobServiceServer::new(JobService(registry.clone()))
                .max_decoding_message_size(MAX)
                .max_encoding_message_size(MAX),
        )
        .add_service(
            beam::artifact_staging_service_server::ArtifactStagingServiceServer::new(
                artifacts::StagingService(registry.clone()),
            )
            .max_decoding_message_size(MAX)
            .max_encoding_message_size(MAX),
        )
        .add_service(
            beam::artifact_retrieval_service_server::ArtifactRetrievalServiceServer::new(
                artifacts::RetrievalService(registry.clone()),
            )
            .max_decoding_message_size(MAX)
            .max_encoding_message_size(MAX),
        );
    let router = weir_harness::services::add_to(router, &fn_api);
    let _keep: Arc<JobRegistry> = registry;
    // TCP_NODELAY on every connection: SDK harnesses wait for each state
    // response before their next request, and with Nagle's algorithm
    // against the client's delayed ACKs every small response waited ~40 ms
    // (Beam Go's timer tests, one state read and write per element, took
    // 30-60 s instead of 1-2).
    let incoming = tokio_stream::StreamExt::map(
        tokio_stream::wrappers::TcpListenerStream::new(listener),
        |conn| {
            if let Ok(c) = &conn {
                let _ = c.set_nodelay(true);
            }
            conn
        },
    );
    router.serve_with_incoming(incoming).await
}
