//! `BeamFnData` (beam_fn_api.proto): element bytes to and from SDK harnesses,
//! routed to bundles by instruction id and to outputs by sink transform id.
//! A stream speaks for the worker of its `worker_id` header only: data and
//! timers for an instruction not issued to that worker are dropped, and a
//! second stream for a worker whose stream is open is refused.

use std::pin::Pin;
use std::sync::Arc;

use futures::{Stream, StreamExt};
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;
use weir_proto::beam;

use super::known_worker;
use crate::registry::FnApi;

/// gRPC libraries (the start of a client's `user-agent`) whose SDK harness
/// ends its side of the data stream soon after its control stream ended:
/// Python's, once its worker threads have stopped (1-3 ms later, after it
/// logs "No more requests from control plane"); Go's when its process ends
/// or its worker pool stops it (`StopWorker`, which Weir sends beside),
/// measured 1-1.5 ms. Java's keeps its data stream open until the runner
/// ends it. Either way the runner ends it after a grace.
const CLOSES_DATA_ON_SHUTDOWN: [&str; 2] = ["grpc-python/", "grpc-go/"];

/// The data service.
pub struct DataService(pub Arc<FnApi>);

#[tonic::async_trait]
impl beam::beam_fn_data_server::BeamFnData for DataService {
    type DataStream = Pin<Box<dyn Stream<Item = Result<beam::Elements, tonic::Status>> + Send>>;

    async fn data(
        &self,
        request: tonic::Request<tonic::Streaming<beam::Elements>>,
    ) -> Result<tonic::Response<Self::DataStream>, tonic::Status> {
        let worker = known_worker(&self.0, &request)?;
        let closes_itself = request
            .metadata()
            .get("user-agent")
            .and_then(|ua| ua.to_str().ok())
            .is_some_and(|ua| {
                CLOSES_DATA_ON_SHUTDOWN
                    .iter()
                    .any(|lib| ua.starts_with(lib))
            });
        let mut inbound = request.into_inner();
        let (tx, rx) = mpsc::unbounded_channel();
        {
            // One data stream per worker: a second one claiming the worker
            // id while the first is open would receive its input elements.
            let mut data_tx = worker.data_tx.lock().unwrap_or_else(|p| p.into_inner());
            if data_tx.is_some() {
                return Err(tonic::Status::already_exists(format!(
                    "SDK worker {} already has an open data stream",
                    worker.id
                )));
            }
            // Under the lock: a retirement that sees the sender sees this.
            worker
                .closes_data_itself
                .store(closes_itself, std::sync::atomic::Ordering::SeqCst);
            *data_tx = Some(tx);
        }
        let _ = worker.data_connected.send_replace(true);
        let fn_api = self.0.clone();
        tokio::spawn(async move {
            while let Some(Ok(elements)) = inbound.next().await {
                for t in elements.timers {
                    let Some(bundle) = fn_api.bundle_of(&worker.id, &t.instruction_id) else {
                        tracing::debug!(worker = %worker.id, instruction = %t.instruction_id, "timers for a bundle not in flight on this worker");
                        continue;
                    };
                    let Some(&port) = bundle
                        .timer_index
                        .get(&(t.transform_id.clone(), t.timer_family_id.clone()))
                    else {
                        bundle.stray(format!(
                            "SDK harness {} sent timers for timer family {:?} of transform {:?}, which bundle {} does not have",
                            worker.id, t.timer_family_id, t.transform_id, t.instruction_id
                        ));
                        continue;
                    };
                    let mut out = bundle.outputs.lock().unwrap_or_else(|p| p.into_inner());
                    out.0[port].push(t.timers);
                    if t.is_last {
                        out.1 = out.1.saturating_sub(1);
                        if out.1 == 0 {
                            bundle.all_last.notify_one();
                        }
                    }
                }
                for d in elements.data {
                    let Some(bundle) = fn_api.bundle_of(&worker.id, &d.instruction_id) else {
                        tracing::debug!(worker = %worker.id, instruction = %d.instruction_id, "data for a bundle not in flight on this worker");
                        continue;
                    };
                    let Some(&port) = bundle.sink_index.get(&d.transform_id) else {
                        bundle.stray(format!(
                            "SDK harness {} sent data for transform {:?}, which is not an output of bundle {}",
                            worker.id, d.transform_id, d.instruction_id
                        ));
                        continue;
                    };
                    let mut out = bundle.outputs.lock().unwrap_or_else(|p| p.into_inner());
                    out.0[port].push_spilling(d.data, bundle.spill.as_ref());
                    if d.is_last {
                        out.1 = out.1.saturating_sub(1);
                        if out.1 == 0 {
                            bundle.all_last.notify_one();
                        }
                    }
                }
            }
            *worker.data_tx.lock().unwrap_or_else(|p| p.into_inner()) = None;
            let _ = worker.data_connected.send_replace(false);
        });
        Ok(tonic::Response::new(Box::pin(
            UnboundedReceiverStream::new(rx).map(Ok),
        )))
    }
}
