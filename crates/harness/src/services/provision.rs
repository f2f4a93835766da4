//! `ProvisionService` (beam_provision_api.proto): tells an SDK harness its
//! pipeline options, endpoints and artifacts.

use std::sync::Arc;

use weir_proto::beam;

use super::known_worker;
use crate::registry::FnApi;

/// The provision service.
pub struct ProvisionService(pub Arc<FnApi>);

#[tonic::async_trait]
impl beam::provision_service_server::ProvisionService for ProvisionService {
    async fn get_provision_info(
        &self,
        request: tonic::Request<beam::GetProvisionInfoRequest>,
    ) -> Result<tonic::Response<beam::GetProvisionInfoResponse>, tonic::Status> {
        let worker = known_worker(&self.0, &request)?;
        Ok(tonic::Response::new(beam::GetProvisionInfoResponse {
            info: Some(worker.provision.clone()),
        }))
    }
}
