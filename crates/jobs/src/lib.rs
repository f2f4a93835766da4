//! Weir's job service: the Beam Job API (`beam_job_api.proto`), artifact
//! staging and retrieval (`beam_artifact_api.proto`), pipeline options and
//! the job registry; wires plan, engine and harness together for each job.
//!
//! Layer: jobs. Entry types: [`JobRegistry`] (all jobs of this server),
//! [`JobService`], [`artifacts::StagingService`],
//! [`artifacts::RetrievalService`], and [`serve`] which assembles every
//! service on one gRPC port.

pub mod artifacts;
pub mod cluster;
pub mod connections;
pub mod limits;
pub mod locations;
pub mod options;
pub mod registry;
pub mod resources;
mod run;
pub mod security;
pub mod service;
pub mod stage_metrics;

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
    /// What one client may make the server hold ([`limits::Limits`]).
    pub limits: limits::Limits,
    /// Debugging: each PrepareJobRequest is written, serialized, into this
    /// folder (`weir serve --capture_prepare_dir`).
    pub capture_prepare_dir: Option<std::path::PathBuf>,
    /// The Job API token and the allowlist of PROCESS commands and DOCKER
    /// images ([`security::Security`]).
    pub security: Arc<security::Security>,
    /// Most bytes one batch GroupByKey of a job keeps in memory before it
    /// spills sorted runs under `spill_root` (`weir serve
    /// --gbk_memory_budget_mb`); None: no bound.
    pub gbk_memory_budget: Option<usize>,
    /// About the most bytes of user state one job keeps in one process
    /// (`weir serve --user_state_memory_budget_mb`;
    /// [`weir_engine::EngineConfig::user_state_budget`]); None: no bound.
    pub user_state_memory_budget: Option<usize>,
    /// About the most bytes one stage's side inputs take in one process
    /// (`weir serve --side_input_memory_budget_mb`;
    /// [`weir_engine::EngineConfig::side_input_budget`]); None: no bound.
    pub side_input_memory_budget: Option<usize>,
    /// Where GroupByKeys spill (one folder per job, removed when it ends).
    pub spill_root: std::path::PathBuf,
    /// Least wait before a splittable DoFn's deferred residual runs again
    /// (`weir serve --min_resume_delay_ms`; [`weir_engine::EngineConfig::min_resume_delay`]).
    pub min_resume_delay: std::time::Duration,
}

/// A gRPC service whose undecodable requests are INVALID_ARGUMENT
/// ([`decode_errors_are_invalid_argument`]).
#[derive(Clone)]
struct DecodeErrorsAreInvalid<S>(S);

impl<S: tonic::server::NamedService> tonic::server::NamedService for DecodeErrorsAreInvalid<S> {
    const NAME: &'static str = S::NAME;
}

impl<S, Req, B> tower::Service<Req> for DecodeErrorsAreInvalid<S>
where
    S: tower::Service<Req, Response = tonic::codegen::http::Response<B>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future =
        std::pin::Pin<Box<dyn std::future::Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), S::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, req: Req) -> Self::Future {
        let f = self.0.call(req);
        Box::pin(async move { f.await.map(decode_errors_are_invalid_argument) })
    }
}

/// The `host:port` a client dialed to reach the Job API (its HTTP/2
/// `:authority`), kept in the request's extensions by [`RecordAuthority`]:
/// Prepare names it as the artifact staging endpoint, an address the client
/// can reach by definition (the server's own may not be, e.g. `localhost`
/// when it listens on every interface), and one Python's gRPC stages over
/// without a new connection.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DialedAuthority(pub String);

impl DialedAuthority {
    /// `authority` if it is a `host:port` (a port, a non-empty host); None
    /// otherwise (e.g. a Unix socket's `localhost`), where the server's own
    /// address serves instead.
    pub fn of(authority: &tonic::codegen::http::uri::Authority) -> Option<DialedAuthority> {
        let port = authority.port_u16()?;
        let host = authority.host();
        (!host.is_empty()).then(|| DialedAuthority(format!("{host}:{port}")))
    }
}

/// A gRPC service whose requests carry the [`DialedAuthority`] of their URI.
#[derive(Clone)]
struct RecordAuthority<S>(S);

impl<S: tonic::server::NamedService> tonic::server::NamedService for RecordAuthority<S> {
    const NAME: &'static str = S::NAME;
}

impl<S, B> tower::Service<tonic::codegen::http::Request<B>> for RecordAuthority<S>
where
    S: tower::Service<tonic::codegen::http::Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), S::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, mut req: tonic::codegen::http::Request<B>) -> Self::Future {
        if let Some(dialed) = req.uri().authority().and_then(DialedAuthority::of) {
            req.extensions_mut().insert(dialed);
        }
        self.0.call(req)
    }
}

/// Longest status message Weir's Job API sends, in bytes of text: gRPC
/// clients drop a response whose metadata passes 8 KiB (Python's
/// grpc-core: RESOURCE_EXHAUSTED "received metadata size exceeds hard
/// limit"), and a refusal that quotes a client's value can be any size.
const MAX_STATUS_MESSAGE: usize = 2048;

/// The bytes of `encoded` with every `%XX` escape decoded (as gRPC's
/// `grpc-message` and URL query strings spell them); other bytes as they are.
pub fn percent_decode(encoded: &str) -> Vec<u8> {
    let b = encoded.as_bytes();
    let mut bytes = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = (b[i] == b'%' && i + 2 < b.len())
            .then(|| std::str::from_utf8(&b[i + 1..i + 3]).ok())
            .flatten()
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match hex {
            Some(x) => {
                bytes.push(x);
                i += 3;
            }
            None => {
                bytes.push(b[i]);
                i += 1;
            }
        }
    }
    bytes
}

/// `grpc-message` (percent-encoded, as gRPC's HTTP/2 protocol spells it)
/// cut to [`MAX_STATUS_MESSAGE`] bytes of text on a character boundary,
/// saying how much was left out; None when it is short enough.
fn shorten_status_message(encoded: &str) -> Option<String> {
    if encoded.len() <= MAX_STATUS_MESSAGE {
        return None;
    }
    let bytes = percent_decode(encoded);
    let text = String::from_utf8_lossy(&bytes);
    if text.len() <= MAX_STATUS_MESSAGE {
        return None;
    }
    let mut cut = MAX_STATUS_MESSAGE;
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    let short = format!("{}... ({} more bytes)", &text[..cut], text.len() - cut);
    let mut out = String::with_capacity(short.len());
    for &c in short.as_bytes() {
        if (0x20..=0x7e).contains(&c) && c != b'%' {
            out.push(c as char);
        } else {
            out.push_str(&format!("%{c:02X}"));
        }
    }
    Some(out)
}

/// A request tonic cannot decode (malformed, or nested deeper than prost's
/// recursion limit of 100) is answered INTERNAL "failed to decode Protobuf
/// message: <field path>: <why>" by tonic; it is the client's fault, so
/// Weir answers INVALID_ARGUMENT with the same message. (Only unary
/// requests; their error comes as a trailers-only response.)
fn decode_errors_are_invalid_argument<B>(
    mut r: tonic::codegen::http::Response<B>,
) -> tonic::codegen::http::Response<B> {
    let h = r.headers();
    let internal = h.get("grpc-status").is_some_and(|v| v == "13");
    let decode = h
        .get("grpc-message")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|m| {
            m.starts_with("failed%20to%20decode") || m.starts_with("failed to decode")
        });
    if internal && decode {
        r.headers_mut().insert(
            "grpc-status",
            tonic::codegen::http::HeaderValue::from_static("3"),
        );
    }
    let short = r
        .headers()
        .get("grpc-message")
        .and_then(|v| v.to_str().ok())
        .and_then(shorten_status_message)
        .and_then(|m| tonic::codegen::http::HeaderValue::from_str(&m).ok());
    if let Some(m) = short {
        r.headers_mut().insert("grpc-message", m);
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_host_and_port_is_a_dialed_authority() {
        let of = |a: &str| DialedAuthority::of(&a.parse().unwrap()).map(|d| d.0);
        assert_eq!(of("localhost:8099").as_deref(), Some("localhost:8099"));
        assert_eq!(of("[::1]:8099").as_deref(), Some("[::1]:8099"));
        assert_eq!(of("10.0.0.7:1").as_deref(), Some("10.0.0.7:1"));
        // Credentials are not echoed.
        assert_eq!(of("user:pw@host:1").as_deref(), Some("host:1"));
        // A Unix socket's authority (no port): the server's own address serves.
        assert_eq!(of("localhost"), None);
    }

    /// A long refusal is cut on a character boundary, percent-encoded as
    /// gRPC sends it, and says how much was left out; a short one is kept.
    #[test]
    fn long_status_messages_are_shortened() {
        assert_eq!(shorten_status_message("pipeline%20option%20x"), None);
        let long = format!("got%20%22{}%22", "%C3%A9".repeat(3000));
        let short = shorten_status_message(&long).expect("shortened");
        let decoded: Vec<u8> = {
            let b = short.as_bytes();
            let mut v = vec![];
            let mut i = 0;
            while i < b.len() {
                if b[i] == b'%' {
                    v.push(
                        u8::from_str_radix(std::str::from_utf8(&b[i + 1..i + 3]).unwrap(), 16)
                            .unwrap(),
                    );
                    i += 3;
                } else {
                    v.push(b[i]);
                    i += 1;
                }
            }
            v
        };
        let text = String::from_utf8(decoded).expect("cut on a character boundary");
        // 'got "' (5 bytes) and 1021 é (2 bytes each) fit in 2048 bytes, of 6006.
        assert_eq!(
            text,
            format!("got \"{}... ({} more bytes)", "é".repeat(1021), 6006 - 2047)
        );
    }
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
    serve_with(listener, config, |_| {}).await
}

/// [`serve`], first handing the server's [`JobRegistry`] to `with` (e.g. to
/// serve the web UI beside the Job API).
///
/// # Errors
/// The transport error when the server cannot run.
pub async fn serve_with(
    listener: tokio::net::TcpListener,
    config: ServerConfig,
    with: impl FnOnce(Arc<JobRegistry>),
) -> Result<(), tonic::transport::Error> {
    let addr: SocketAddr = listener.local_addr().expect("bound listener");
    let url = if addr.ip().is_unspecified() {
        format!("localhost:{}", addr.port())
    } else {
        addr.to_string() // [v6]:port
    };
    let fn_api = FnApi::new(url.clone());
    // Prepare must be able to receive a pipeline at its limit (the limit
    // itself is checked in Prepare, where the refusal can name its flag).
    let job_api_max = MAX.max(config.limits.max_pipeline_bytes.saturating_add(64 << 20));
    let registry = JobRegistry::new(fn_api.clone(), config.clone(), url);
    with(registry.clone());
    let expiring = registry.clone();
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(std::time::Duration::from_secs(10)).await;
            expiring.expire_prepared();
        }
    });
    // The Job API and staging (what clients call) need the token when one
    // is set; the Fn API and retrieval (what SDK harnesses call) are tied
    // to worker ids instead.
    let token = security::RequireToken(config.security.clone());
    use tonic::service::interceptor::InterceptedService;
    let router = tonic::transport::Server::builder()
        .add_service(RecordAuthority(DecodeErrorsAreInvalid(
            InterceptedService::new(
                beam::job_service_server::JobServiceServer::new(JobService(registry.clone()))
                    .max_decoding_message_size(job_api_max)
                    .max_encoding_message_size(MAX),
                token.clone(),
            ),
        )))
        .add_service(InterceptedService::new(
            beam::artifact_staging_service_server::ArtifactStagingServiceServer::new(
                artifacts::StagingService(registry.clone()),
            )
            .max_decoding_message_size(MAX)
            .max_encoding_message_size(MAX),
            token,
        ))
        .add_service(
            beam::artifact_retrieval_service_server::ArtifactRetrievalServiceServer::new(
                artifacts::RetrievalService(registry.clone()),
            )
            .max_decoding_message_size(MAX)
            .max_encoding_message_size(MAX),
        );
    let router = weir_harness::services::add_to(router, &fn_api);
    let _keep: Arc<JobRegistry> = registry;
    let incoming = connections::incoming(listener);
    router.serve_with_incoming(incoming).await
}
