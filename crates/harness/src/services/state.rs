//! `BeamFnState` (beam_fn_api.proto): side inputs served from the bundle's
//! materialized views (`IterableSideInput`, `MultimapSideInput`,
//! `MultimapKeysSideInput`, `MultimapKeysValuesSideInput`) and user state
//! (`BagUserState`, `MultimapUserState`, `MultimapKeysUserState`,
//! `OrderedListUserState`; see [`crate::user_state`]).

use std::pin::Pin;
use std::sync::Arc;

use futures::{Stream, StreamExt};
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;
use weir_proto::beam;
use weir_proto::beam::state_key::Type as Key;
use weir_proto::beam::state_request::Request as R;
use weir_proto::beam::state_response::Response;

use crate::registry::FnApi;
use crate::user_state::BundleUserState;

/// The state service.
pub struct StateService(pub Arc<FnApi>);

/// Largest `data` of one ordered-list Get response; longer reads continue
/// with a `continuation_token` (StateGetResponse, beam_fn_api.proto).
const ORDERED_LIST_PAGE_BYTES: usize = 1 << 20;

/// The successful response to one state request.
fn get(data: Vec<u8>) -> Response {
    Response::Get(beam::StateGetResponse {
        continuation_token: vec![],
        data,
    })
}
const APPENDED: Response = Response::Append(beam::StateAppendResponse {});
const CLEARED: Response = Response::Clear(beam::StateClearResponse {});

/// Serves a user-state request from the bundle's view of user state, or
/// returns `None` for a key that is not user state. Errors name the state key
/// and say which operation it does not support.
fn user_state(
    state: &BundleUserState,
    key: &Key,
    req: &beam::StateRequest,
) -> Option<Result<Response, String>> {
    let op = req.request.as_ref();
    let unsupported = |what: &str| Err(format!("{what} is not supported on state key {key:?}"));
    Some(match (key, op) {
        (_, None) => Err("state request without an operation".into()),
        (Key::BagUserState(k), Some(R::Get(_))) => Ok(get(state.get(k))),
        (Key::BagUserState(k), Some(R::Append(a))) => {
            state.append(k, &a.data);
            Ok(APPENDED)
        }
        (Key::BagUserState(k), Some(R::Clear(_))) => {
            state.clear(k);
            Ok(CLEARED)
        }
        (Key::MultimapUserState(k), Some(R::Get(_))) => Ok(get(state.multimap_get(k))),
        (Key::MultimapUserState(k), Some(R::Append(a))) => {
            state.multimap_append(k, &a.data);
            Ok(APPENDED)
        }
        (Key::MultimapUserState(k), Some(R::Clear(_))) => {
            state.multimap_clear(k);
            Ok(CLEARED)
        }
        (Key::MultimapKeysUserState(k), Some(R::Get(_))) => Ok(get(state.multimap_keys(k))),
        (Key::MultimapKeysUserState(k), Some(R::Clear(_))) => {
            state.multimap_clear_all(k);
            Ok(CLEARED)
        }
        (Key::MultimapKeysUserState(_), Some(R::Append(_))) => {
            unsupported("Append (MultimapKeysUserState allows only Get and Clear; append to a map key with MultimapUserState)")
        }
        (Key::MultimapEntriesUserState(_), _) => unsupported(
            "MultimapEntriesUserState (Weir serves MultimapKeysUserState and MultimapUserState)",
        ),
        (Key::OrderedListUserState(k), Some(R::Get(g))) => state
            .ordered_list_get(k, &g.continuation_token, ORDERED_LIST_PAGE_BYTES)
            .map(|page| {
                Response::Get(beam::StateGetResponse {
                    continuation_token: page.continuation_token,
                    data: page.data,
                })
            }),
        (Key::OrderedListUserState(k), Some(R::Append(a))) => state
            .ordered_list_append(k, &a.data)
            .map(|()| APPENDED),
        (Key::OrderedListUserState(k), Some(R::Clear(_))) => {
            state.ordered_list_clear(k);
            Ok(CLEARED)
        }
        _ => return None,
    })
}

/// The response to one state request, or the error to send back.
fn answer(fn_api: &FnApi, req: &beam::StateRequest) -> Result<Response, String> {
    let bundle = fn_api
        .bundle(&req.instruction_id)
        .ok_or_else(|| format!("state request for unknown bundle {:?}", req.instruction_id))?;
    let key = req
        .state_key
        .as_ref()
        .and_then(|k| k.r#type.as_ref())
        .ok_or("state request without a key")?;
    if let Some(answer) = user_state(&bundle.user_state, key, req) {
        return answer;
    }
    if !matches!(req.request, Some(R::Get(_))) {
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
        .map(get)
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
                    Ok(response) => beam::StateResponse {
                        id: req.id,
                        error: String::new(),
                        response: Some(response),
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

#[cfg(test)]
mod tests {
    use super::*;
    use beam::state_key::{MultimapKeysUserState, MultimapUserState};

    fn request(key: Key, request: R) -> beam::StateRequest {
        beam::StateRequest {
            id: "1".into(),
            instruction_id: "b".into(),
            state_key: Some(beam::StateKey { r#type: Some(key) }),
            request: Some(request),
        }
    }

    fn serve(
        state: &BundleUserState,
        req: &beam::StateRequest,
    ) -> Option<Result<Response, String>> {
        let key = req.state_key.as_ref().unwrap().r#type.as_ref().unwrap();
        user_state(state, key, req)
    }

    #[test]
    fn multimap_requests_reach_the_bundle_state() {
        let state = BundleUserState::new(Default::default());
        let entry = Key::MultimapUserState(MultimapUserState {
            transform_id: "t".into(),
            user_state_id: "m".into(),
            window: vec![],
            key: vec![1, b'k'],
            map_key: vec![1, b'a'],
        });
        let keys = Key::MultimapKeysUserState(MultimapKeysUserState {
            transform_id: "t".into(),
            user_state_id: "m".into(),
            window: vec![],
            key: vec![1, b'k'],
        });
        let append = R::Append(beam::StateAppendRequest { data: vec![7, 8] });
        let get = R::Get(beam::StateGetRequest::default());
        assert_eq!(
            serve(&state, &request(entry.clone(), append.clone())),
            Some(Ok(APPENDED))
        );
        assert_eq!(
            serve(&state, &request(entry.clone(), get.clone())),
            Some(Ok(self::get(vec![7, 8])))
        );
        assert_eq!(
            serve(&state, &request(keys.clone(), get.clone())),
            Some(Ok(self::get(vec![1, b'a'])))
        );
        let err = serve(&state, &request(keys.clone(), append))
            .unwrap()
            .unwrap_err();
        assert!(
            err.contains("Append") && err.contains("MultimapKeysUserState"),
            "{err}"
        );
        let clear = R::Clear(beam::StateClearRequest {});
        assert_eq!(
            serve(&state, &request(keys.clone(), clear)),
            Some(Ok(CLEARED))
        );
        assert_eq!(
            serve(&state, &request(entry, get.clone())),
            Some(Ok(self::get(vec![])))
        );

        let entries = Key::MultimapEntriesUserState(Default::default());
        let err = serve(&state, &request(entries, get.clone()))
            .unwrap()
            .unwrap_err();
        assert!(err.contains("MultimapEntriesUserState"), "{err}");
        // Side-input keys are not user state.
        let side = Key::IterableSideInput(Default::default());
        assert_eq!(serve(&state, &request(side, get)), None);
    }
}
