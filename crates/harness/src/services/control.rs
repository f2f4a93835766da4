//! `BeamFnControl` (beam_fn_api.proto): instructions to SDK harnesses and their responses.
//! One control connection per worker id, ever (a second is refused); a
//! response completes only an instruction sent to that worker; a worker
//! gets only its own job's `ProcessBundleDescriptor`s.

use std::pin::Pin;
use std::sync::Arc;

use futures::{Stream, StreamExt};
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;
use weir_proto::beam;

use super::known_worker;
use crate::registry::FnApi;

/// The control service.
pub struct ControlService(pub Arc<FnApi>);

#[tonic::async_trait]
impl beam::beam_fn_control_server::BeamFnControl for ControlService {
    type ControlStream =
        Pin<Box<dyn Stream<Item = Result<beam::InstructionRequest, tonic::Status>> + Send>>;

    async fn control(
        &self,
        request: tonic::Request<tonic::Streaming<beam::InstructionResponse>>,
    ) -> Result<tonic::Response<Self::ControlStream>, tonic::Status> {
        let worker = known_worker(&self.0, &request)?;
        if worker
            .claimed
            .swap(true, std::sync::atomic::Ordering::SeqCst)
        {
            tracing::warn!(worker = %worker.id, job = %worker.job_id, "refused a second control connection for a worker id");
            return Err(tonic::Status::already_exists(format!(
                "SDK worker id {} was already used by a control connection",
                worker.id
            )));
        }
        let mut responses = request.into_inner();
        let (tx, rx) = mpsc::unbounded_channel();
        *worker.control_tx.lock().unwrap_or_else(|p| p.into_inner()) = Some(tx);
        let _ = worker.connected.send_replace(true);
        let fn_api = self.0.clone();
        tracing::info!(worker = %worker.id, job = %worker.job_id, "SDK harness connected (control)");
        tokio::spawn(async move {
            let why = loop {
                match responses.next().await {
                    Some(Ok(resp)) => {
                        let waiter = worker
                            .pending
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .remove(&resp.instruction_id);
                        match waiter {
                            Some(w) => {
                                let _ = w.send(resp);
                            }
                            None => {
                                tracing::debug!(worker = %worker.id, id = %resp.instruction_id, "response to an unknown instruction")
                            }
                        }
                    }
                    Some(Err(e)) => break format!("control stream broken: {}", e.message()),
                    None => break "control stream closed".to_string(),
                }
            };
            tracing::info!(worker = %worker.id, "SDK harness {why}");
            let _ = worker.control_ended.send_replace(true);
            // Still registered means its job is running: the harness died.
            // The job's supervisor (environment::SdkHarnesses) sees the
            // worker disconnect, replaces it and says so in the job's messages.
            if fn_api.worker(&worker.id).is_some() {
                tracing::warn!(worker = %worker.id, "SDK harness is unhealthy: {why}");
            }
            worker.disconnected(&why);
        });
        Ok(tonic::Response::new(Box::pin(
            UnboundedReceiverStream::new(rx).map(Ok),
        )))
    }

    async fn get_process_bundle_descriptor(
        &self,
        request: tonic::Request<beam::GetProcessBundleDescriptorRequest>,
    ) -> Result<tonic::Response<beam::ProcessBundleDescriptor>, tonic::Status> {
        let worker = known_worker(&self.0, &request)?;
        let id = &request.get_ref().process_bundle_descriptor_id;
        self.0
            .descriptor_of_job(&worker.job_id, id)
            .map(tonic::Response::new)
            .ok_or_else(|| {
                tonic::Status::not_found(format!(
                    "no ProcessBundleDescriptor {id:?} for the job of SDK worker {}",
                    worker.id
                ))
            })
    }
}
