//! `BeamFnState` (beam_fn_api.proto): side inputs served from the bundle's
//! materialized views (`IterableSideInput`, `MultimapSideInput`,
//! `MultimapKeysSideInput`, `MultimapKeysValuesSideInput`) and user state
//! bags (`BagUserState`: get, append, clear).

use std::pin::Pin;
use std::sync::Arc;

use futures::{Stream, StreamExt};
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;
use weir_proto::beam;
use weir_proto::beam::state_key::Type as Key;

use crate::registry::FnApi;

/// The state service.
pub struct StateService(pub Arc<FnApi>);

/// The data of a Get (`Some`), or `None` for a completed Append / Clear.
fn answer(fn_api: &FnApi, req: &beam::StateRequest) -> Result<Option<Vec<u8>>, String> {
    let bundle = fn_api
        .bundle(&req.instruction_id)
        .ok_or_else(|| format!("state request for unknown bundle {:?}", req.instruction_id))?;
    let key = req
        .state_key
        .as_ref()
        .and_then(|k| k.r#type.as_ref())
        .ok_or("state request without a key")?;
    if let Key::BagUserState(k) = key {
        use beam::state_request::Request as R;
        return match &req.request {
            Some(R::Get(_)) => Ok(Some(bundle.user_state.get(k))),
            Some(R::Append(a)) => {
                bundle.user_state.append(k, &a.data);
                Ok(None)
            }
            Some(R::Clear(_)) => {
                bundle.user_state.clear(k);
                Ok(None)
            }
            None => Err("state request without an operation".into()),
        };
    }
    if !matches!(req.request, Some(beam::state_request::Request::Get(_))) {
        return Err(format!("side inputs are read-only (state key {key:?})"));
    }
    let side = &bundle.side_inputs;
    let found = match key {
        Key::IterableSideInput(k) => side.iterable(&k.transform_id, &k.side_input_id, &k.window),
        Key::MultimapSideInput(k) => {
            side.multimap_values(&k.transform_id, &k.side_input_id, &k.window, &k.key)
        }
        Key::MultimapKeysSideInput(k) => {
            side.multimap_keys(&k.transform_id, &k.side_input_id, &k.window)
        }
        Key::MultimapKeysValuesSideInput(k) => {
            side.multimap_keys_values(&k.transform_id, &k.side_input_id, &k.window)
        }
        other => return Err(format!("state key {other:?} is not supported by Weir yet")),
    };
    found
        .map(Some)
        .ok_or_else(|| format!("no side input for state key {key:?}"))
}

#[tonic::async_trait]
impl beam::beam_fn_state_server::BeamFnState for StateService {
    type StateStream =
        Pin<Box<dyn Stream<Item = Result<beam::StateResponse, tonic::Status>> + Send>>;

    async fn state(
        &self,
        request: tonic::Request<tonic::Streaming<beam::StateRequest>>,
    ) -> Result<tonic::Response<Self::StateStream>, tonic::Status> {
        let mut inbound = request.into_inner();
        let (tx, rx) = mpsc::unbounded_channel();
        let fn_api = self.0.clone();
        tokio::spawn(async move {
            while let Some(Ok(req)) = inbound.next().await {
                let resp = match answer(&fn_api, &req) {
                    Ok(Some(data)) => beam::StateResponse {
                        id: req.id,
                        error: String::new(),
                        response: Some(beam::state_response::Response::Get(
                            beam::StateGetResponse {
                                continuation_token: vec![],
                                data,
                            },
                        )),
                    },
                    Ok(None) => beam::StateResponse {
                        id: req.id,
                        error: String::new(),
                        response: Some(match req.request {
                            Some(beam::state_request::Request::Clear(_)) => {
                                beam::state_response::Response::Clear(beam::StateClearResponse {})
                            }
                            _ => {
                                beam::state_response::Response::Append(beam::StateAppendResponse {})
                            }
                        }),
                    },
                    Err(error) => beam::StateResponse {
                        id: req.id,
                        error,
                        response: None,
                    },
                };
                if tx.send(resp).is_err() {
                    break;
                }
            }
        });
        Ok(tonic::Response::new(Box::pin(
            UnboundedReceiverStream::new(rx).map(Ok),
        )))
    }
}
