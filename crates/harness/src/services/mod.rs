//! The Fn API gRPC services, one per file, each holding only the registry.
//! Every SDK channel carries a `worker_id` header; services route by it.

mod control;
mod data;
mod logging;
mod provision;
mod state;

use std::sync::Arc;

pub use control::ControlService;
pub use data::DataService;
pub use logging::LoggingService;
pub use provision::ProvisionService;
pub use state::StateService;
use weir_proto::beam;
use weir_proto::MAX_GRPC_MESSAGE_BYTES as MAX;

use crate::registry::{FnApi, Worker};

/// The `worker_id` header of a request.
fn worker_id<T>(req: &tonic::Request<T>) -> Result<String, tonic::Status> {
    req.metadata()
        .get("worker_id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
        .ok_or_else(|| tonic::Status::invalid_argument("missing worker_id header"))
}

fn known_worker<T>(fn_api: &FnApi, req: &tonic::Request<T>) -> Result<Arc<Worker>, tonic::Status> {
    let id = worker_id(req)?;
    fn_api
        .worker(&id)
        .ok_or_else(|| tonic::Status::not_found(format!("unknown SDK worker id {id:?}")))
}

/// Adds every Fn API service (with raised message limits) to a tonic router.
pub fn add_to(
    router: tonic::transport::server::Router,
    fn_api: &Arc<FnApi>,
) -> tonic::transport::server::Router {
    use beam::beam_fn_control_server::BeamFnControlServer;
    use beam::beam_fn_data_server::BeamFnDataServer;
    use beam::beam_fn_logging_server::BeamFnLoggingServer;
    use beam::beam_fn_state_server::BeamFnStateServer;
    use beam::provision_service_server::ProvisionServiceServer;
    router
        .add_service(
            BeamFnControlServer::new(ControlService(fn_api.clone()))
                .max_decoding_message_size(MAX)
                .max_encoding_message_size(MAX),
        )
        .add_service(
            BeamFnDataServer::new(DataService(fn_api.clone()))
                .max_decoding_message_size(MAX)
                .max_encoding_message_size(MAX),
        )
        .add_service(
            BeamFnStateServer::new(StateService(fn_api.clone()))
                .max_decoding_message_size(MAX)
                .max_encoding_message_size(MAX),
        )
        .add_service(
            BeamFnLoggingServer::new(LoggingService(fn_api.clone()))
                .max_decoding_message_size(MAX)
                .max_encoding_message_size(MAX),
        )
        .add_service(
            ProvisionServiceServer::new(ProvisionService(fn_api.clone()))
                .max_decoding_message_size(MAX)
                .max_encoding_message_size(MAX),
        )
}
