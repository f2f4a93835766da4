//! The Fn API gRPC services, one per file, each holding only the registry.
//! Every SDK channel carries a `worker_id` header; services route by it, and
//! it is required: each call is checked against the worker's own job.
//! Worker ids and instruction ids are unguessable
//! ([`crate::FnApi::fresh_id`]), so a process that does not know them can
//! reach no job; one that learns a worker id (from a harness's command
//! line) still cannot claim a connected worker's control or data stream.

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

#[cfg(test)]
mod tests {
    //! Isolation of jobs on the Fn API, over real gRPC: a process that is
    //! another job's worker (or no worker) reads no state, descriptors or
    //! provision info of a job, sends no data into its bundles, and cannot
    //! take over its worker's control stream.

    use std::collections::HashMap;
    use std::sync::Mutex;

    use futures::StreamExt;
    use tonic::metadata::MetadataValue;

    use super::*;
    use crate::registry::{BundleState, BundleUserState, ByteChunks, LogSink};

    async fn serve() -> Arc<FnApi> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("127.0.0.1:{}", listener.local_addr().unwrap().port());
        let fn_api = FnApi::new(url);
        let router = add_to(
            tonic::transport::Server::builder().add_routes(Default::default()),
            &fn_api,
        );
        tokio::spawn(
            router.serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
        );
        fn_api
    }

    fn as_worker<T>(msg: T, worker_id: Option<&str>) -> tonic::Request<T> {
        let mut r = tonic::Request::new(msg);
        if let Some(id) = worker_id {
            r.metadata_mut()
                .insert("worker_id", MetadataValue::try_from(id).unwrap());
        }
        r
    }

    async fn channel(fn_api: &FnApi) -> tonic::transport::Channel {
        tonic::transport::Endpoint::from_shared(format!("http://{}", fn_api.url))
            .unwrap()
            .connect()
            .await
            .unwrap()
    }

    /// Registers a worker of `job` whose provision info carries `secret`.
    fn worker(fn_api: &FnApi, job: &str, secret: &str) -> Arc<Worker> {
        let log: LogSink = Arc::new(|_, _| {});
        let info = beam::ProvisionInfo {
            retrieval_token: secret.to_string(),
            ..Default::default()
        };
        fn_api.add_worker(
            fn_api.fresh_id(&format!("{job}-worker-")),
            job.to_string(),
            info,
            log,
        )
    }

    fn bag() -> beam::state_key::BagUserState {
        beam::state_key::BagUserState {
            transform_id: "t".into(),
            user_state_id: "bag".into(),
            window: vec![],
            key: vec![1, b'k'],
        }
    }

    /// A bundle of worker `w` in flight, with one sink `sink` and a user
    /// state bag holding a secret.
    fn bundle(fn_api: &FnApi, w: &Worker, instruction: &str) -> Arc<BundleState> {
        let b = Arc::new(BundleState {
            worker_id: w.id.clone(),
            descriptor_id: format!("{}/s1", w.job_id),
            side_inputs: Default::default(),
            user_state: BundleUserState::new(Default::default()),
            sink_index: HashMap::from([("sink".to_string(), 0)]),
            timer_index: HashMap::new(),
            outputs: Mutex::new((vec![ByteChunks::default()], 1)),
            spill: None,
            all_last: tokio::sync::Notify::new(),
            split_handed_over: Default::default(),
            split_primary: std::sync::atomic::AtomicUsize::new(usize::MAX),
            stray_output: Default::default(),
        });
        b.user_state.append(
            &weir_engine::user_state::StateCell {
                transform_id: "t".into(),
                state_id: "bag".into(),
                window: vec![],
                key: vec![1, b'k'],
            },
            b"job-a secret state",
        )
        .unwrap();
        fn_api
            .bundles
            .lock()
            .unwrap()
            .insert(instruction.to_string(), b.clone());
        b
    }

    #[test]
    fn fresh_ids_are_unguessable() {
        let fn_api = FnApi::new("x:1".into());
        let a = fn_api.fresh_id("job-worker-");
        let b = fn_api.fresh_id("job-worker-");
        let (a_n, a_rand) = a
            .strip_prefix("job-worker-")
            .unwrap()
            .split_once('-')
            .unwrap();
        let (b_n, b_rand) = b
            .strip_prefix("job-worker-")
            .unwrap()
            .split_once('-')
            .unwrap();
        assert_eq!((a_n, b_n), ("1", "2"));
        assert_eq!((a_rand.len(), b_rand.len()), (32, 32));
        assert_ne!(a_rand, b_rand);
        assert!(a_rand.chars().all(|c| c.is_ascii_hexdigit()));
    }

    #[tokio::test]
    async fn a_second_client_cannot_touch_another_jobs_worker() {
        let fn_api = serve().await;
        let a = worker(&fn_api, "job-a", "secret-of-a");
        let b = worker(&fn_api, "job-b", "secret-of-b");
        fn_api.add_descriptors([beam::ProcessBundleDescriptor {
            id: "job-a/s1".into(),
            ..Default::default()
        }]);
        let instruction = fn_api.fresh_id("job-a-bundle-");
        let in_flight = bundle(&fn_api, &a, &instruction);
        let ch = channel(&fn_api).await;

        // Descriptors: only to a worker of the descriptor's own job.
        let mut control = beam::beam_fn_control_client::BeamFnControlClient::new(ch.clone());
        let get = |id: &str| beam::GetProcessBundleDescriptorRequest {
            process_bundle_descriptor_id: id.into(),
        };
        let e = control
            .get_process_bundle_descriptor(as_worker(get("job-a/s1"), None))
            .await
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e}");
        let e = control
            .get_process_bundle_descriptor(as_worker(get("job-a/s1"), Some(&b.id)))
            .await
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::NotFound, "{e}");
        let d = control
            .get_process_bundle_descriptor(as_worker(get("job-a/s1"), Some(&a.id)))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(d.id, "job-a/s1");

        // Provision info: a guessed worker id of the old form gets nothing.
        let mut provision = beam::provision_service_client::ProvisionServiceClient::new(ch.clone());
        for guess in ["job-a-worker-1", "job-a-worker-1-0"] {
            let e = provision
                .get_provision_info(as_worker(beam::GetProvisionInfoRequest {}, Some(guess)))
                .await
                .unwrap_err();
            assert_eq!(e.code(), tonic::Code::NotFound, "{e}");
        }
        let info = provision
            .get_provision_info(as_worker(beam::GetProvisionInfoRequest {}, Some(&b.id)))
            .await
            .unwrap()
            .into_inner()
            .info
            .unwrap();
        assert_eq!(info.retrieval_token, "secret-of-b");

        // State: job b's worker (and no worker at all) reads nothing of a's bundle.
        let read = beam::StateRequest {
            id: "1".into(),
            instruction_id: instruction.clone(),
            state_key: Some(beam::StateKey {
                r#type: Some(beam::state_key::Type::BagUserState(bag())),
            }),
            request: Some(beam::state_request::Request::Get(Default::default())),
        };
        let mut state = beam::beam_fn_state_client::BeamFnStateClient::new(ch.clone());
        let e = state
            .state(as_worker(futures::stream::iter([read.clone()]), None))
            .await
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e}");
        let mut answers = state
            .state(as_worker(
                futures::stream::iter([read.clone()]),
                Some(&b.id),
            ))
            .await
            .unwrap()
            .into_inner();
        let answer = answers.next().await.unwrap().unwrap();
        assert!(answer.response.is_none(), "{answer:?}");
        assert!(
            answer
                .error
                .contains("not a bundle in flight on SDK worker job-b-worker-"),
            "{}",
            answer.error
        );
        let mut answers = state
            .state(as_worker(futures::stream::iter([read]), Some(&a.id)))
            .await
            .unwrap()
            .into_inner();
        let answer = answers.next().await.unwrap().unwrap();
        assert_eq!(answer.error, "");
        match answer.response {
            Some(beam::state_response::Response::Get(g)) => {
                assert_eq!(g.data, b"job-a secret state")
            }
            other => panic!("{other:?}"),
        }

        // Data: b's stream cannot complete a's bundle; a's own can.
        let done = |text: &[u8]| beam::Elements {
            data: vec![beam::elements::Data {
                instruction_id: instruction.clone(),
                transform_id: "sink".into(),
                data: text.to_vec(),
                is_last: true,
            }],
            timers: vec![],
        };
        let mut data = beam::beam_fn_data_client::BeamFnDataClient::new(ch.clone());
        let (b_tx, b_rx) = tokio::sync::mpsc::unbounded_channel();
        let _b_stream = data
            .data(as_worker(
                tokio_stream::wrappers::UnboundedReceiverStream::new(b_rx),
                Some(&b.id),
            ))
            .await
            .unwrap();
        b_tx.send(done(b"forged")).unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        assert_eq!(*in_flight.outputs.lock().unwrap(), (vec![ByteChunks::default()], 1));
        let (a_tx, a_rx) = tokio::sync::mpsc::unbounded_channel();
        let _a_stream = data
            .data(as_worker(
                tokio_stream::wrappers::UnboundedReceiverStream::new(a_rx),
                Some(&a.id),
            ))
            .await
            .unwrap();
        // A second data stream claiming a's id while a's is open: refused.
        let e = data
            .data(as_worker(futures::stream::pending(), Some(&a.id)))
            .await
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::AlreadyExists, "{e}");
        // Output of a's bundle for a transform it has no sink for: kept as
        // the bundle's failure, never silently dropped.
        let mut stray = done(b"lost?");
        stray.data[0].transform_id = "no-such-transform".into();
        stray.data[0].is_last = false;
        a_tx.send(stray).unwrap();
        a_tx.send(done(b"real")).unwrap();
        tokio::time::timeout(
            std::time::Duration::from_secs(5),
            in_flight.all_last.notified(),
        )
        .await
        .unwrap();
        assert_eq!(
            std::mem::take(&mut in_flight.outputs.lock().unwrap().0[0]).into_bytes(),
            b"real".to_vec()
        );
        let stray = in_flight.stray_output.lock().unwrap().clone().expect("the stray output is recorded");
        assert!(
            stray.starts_with(&format!("SDK harness {} sent data for transform \"no-such-transform\", which is not an output of bundle {instruction}", a.id)),
            "{stray}"
        );

        // Control: the first connection for a worker id takes it, a second is refused.
        let _first = control
            .control(as_worker(futures::stream::pending(), Some(&a.id)))
            .await
            .unwrap();
        let e = control
            .control(as_worker(futures::stream::pending(), Some(&a.id)))
            .await
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::AlreadyExists, "{e}");
        assert!(a.is_connected());
    }
}
