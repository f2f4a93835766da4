//! Beam's model protos as Weir uses them.
//!
//! Layer: the bottom. Re-exports the generated Runner API, Fn API and Job API
//! types of `beam-model-rs` (Beam 2.70 protos; fields added by later SDKs are
//! ignored on decode) and owns every URN string Weir understands ([`urns`]).
//! Nothing else in the workspace writes a URN literal.

pub mod urns;

/// Every generated message and service of Beam's model, flattened
/// (`pipeline.v1`, `fn_execution.v1`, `job_management.v1`, ...).
pub use beam_model_rs::v1 as beam;

pub use prost;
pub use prost_types;

/// The URI a tonic client dials for a Beam `ApiServiceDescriptor.url`, which
/// SDKs and runners usually write as bare `host:port`: `http://` is added
/// when no scheme is given.
pub fn grpc_uri(url: &str) -> String {
    if url.contains("://") {
        url.to_string()
    } else {
        format!("http://{url}")
    }
}

/// Largest gRPC message Weir sends or accepts, on every server and client:
/// tonic's 4 MiB default is far too small for Beam (20+ MB pipelines and
/// multi-MiB elements are common).
pub const MAX_GRPC_MESSAGE_BYTES: usize = 1 << 30;
