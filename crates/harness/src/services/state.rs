//! `BeamFnState` (beam_fn_api.proto): side inputs served from the bundle's
//! materialized views (`IterableSideInput`, `MultimapSideInput`,
//! `MultimapKeysSideInput`, `MultimapKeysValuesSideInput`) and user state
//! (`BagUserState`, `MultimapUserState`, `MultimapKeysUserState`,
//! `MultimapEntriesUserState`, `OrderedListUserState`), read and written
//! through the bundle's view of the engine's user state
//! ([`weir_engine::user_state`]).
//! A state stream needs the `worker_id` header of a registered worker, and
//! answers only for bundles issued to that worker.

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
use crate::state_values::{multimap_value_shape, ValueShape};
use weir_engine::user_state::{BundleUserState, ListRange, MapKey, StateCell};

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

/// The engine's cell of a user-state key: (transform id, state id,
/// window, key), the fields every `StateKey.*UserState` has.
fn cell(transform_id: &str, state_id: &str, window: &[u8], key: &[u8]) -> StateCell {
    StateCell {
        transform_id: transform_id.to_string(),
        state_id: state_id.to_string(),
        window: window.to_vec(),
        key: key.to_vec(),
    }
}

/// The cell and map key of a `MultimapUserState` key.
fn map_key(k: &beam::state_key::MultimapUserState) -> MapKey {
    MapKey {
        cell: cell(&k.transform_id, &k.user_state_id, &k.window, &k.key),
        map_key: k.map_key.clone(),
    }
}

/// The cell and sort keys of an `OrderedListUserState` key: its `range`
/// (`[start, end)`), or every sort key when the key has none.
fn list_range(k: &beam::state_key::OrderedListUserState) -> ListRange {
    use std::ops::Bound;
    ListRange {
        cell: cell(&k.transform_id, &k.user_state_id, &k.window, &k.key),
        range: match k.range {
            Some(r) => (Bound::Included(r.start), Bound::Excluded(r.end)),
            None => (Bound::Unbounded, Bound::Unbounded),
        },
    }
}

/// Serves a user-state request from the bundle's view of user state, or
/// returns `None` for a key that is not user state. `value_shape` gives the
/// shape of the values of a (transform id, state id)'s multimap, which
/// `MultimapEntriesUserState` needs (see [`crate::state_values`]). Errors
/// name the state key and say which operation it does not support.
fn user_state(
    state: &BundleUserState,
    key: &Key,
    req: &beam::StateRequest,
    value_shape: impl Fn(&str, &str) -> Result<ValueShape, String>,
) -> Option<Result<Response, String>> {
    let op = req.request.as_ref();
    let unsupported = |what: &str| Err(format!("{what} is not supported on state key {key:?}"));
    Some(match (key, op) {
        (_, None) => Err("state request without an operation".into()),
        (Key::BagUserState(k), Some(op)) => {
            let c = cell(&k.transform_id, &k.user_state_id, &k.window, &k.key);
            match op {
                R::Get(_) => Ok(get(state.get(&c))),
                R::Append(a) => state.append(&c, &a.data).map(|()| APPENDED),
                R::Clear(_) => {
                    state.clear(&c);
                    Ok(CLEARED)
                }
            }
        }
        (Key::MultimapUserState(k), Some(R::Get(_))) => Ok(get(state.multimap_get(&map_key(k)))),
        (Key::MultimapUserState(k), Some(R::Append(a))) => state
            .multimap_append(&map_key(k), &a.data)
            .map(|()| APPENDED),
        (Key::MultimapUserState(k), Some(R::Clear(_))) => {
            state.multimap_clear(&map_key(k));
            Ok(CLEARED)
        }
        (Key::MultimapKeysUserState(k), Some(R::Get(_))) => Ok(get(
            state.multimap_keys(&cell(&k.transform_id, &k.user_state_id, &k.window, &k.key)),
        )),
        (Key::MultimapKeysUserState(k), Some(R::Clear(_))) => {
            state.multimap_clear_all(&cell(&k.transform_id, &k.user_state_id, &k.window, &k.key));
            Ok(CLEARED)
        }
        (Key::MultimapKeysUserState(_), Some(R::Append(_))) => {
            unsupported("Append (MultimapKeysUserState allows only Get and Clear; append to a map key with MultimapUserState)")
        }
        (Key::MultimapEntriesUserState(k), Some(R::Get(_))) => {
            value_shape(&k.transform_id, &k.user_state_id).and_then(|shape| {
                state
                    .multimap_entries(
                        &cell(&k.transform_id, &k.user_state_id, &k.window, &k.key),
                        |values| shape.count(values),
                    )
                    .map(get)
            })
        }
        (Key::MultimapEntriesUserState(k), Some(R::Clear(_))) => {
            state.multimap_clear_all(&cell(&k.transform_id, &k.user_state_id, &k.window, &k.key));
            Ok(CLEARED)
        }
        (Key::MultimapEntriesUserState(_), Some(R::Append(_))) => {
            unsupported("Append (MultimapEntriesUserState allows only Get and Clear; append to a map key with MultimapUserState)")
        }
        (Key::OrderedListUserState(k), Some(R::Get(g))) => state
            .ordered_list_get(&list_range(k), &g.continuation_token, ORDERED_LIST_PAGE_BYTES)
            .map(|page| {
                Response::Get(beam::StateGetResponse {
                    continuation_token: page.continuation_token,
                    data: page.data,
                })
            }),
        (Key::OrderedListUserState(k), Some(R::Append(a))) => state
            .ordered_list_append(&list_range(k).cell, &a.data)
            .map(|()| APPENDED),
        (Key::OrderedListUserState(k), Some(R::Clear(_))) => {
            state.ordered_list_clear(&list_range(k));
            Ok(CLEARED)
        }
        _ => return None,
    })
}

/// The response to one state request of worker `worker_id`, or the error to
/// send back.
fn answer(fn_api: &FnApi, worker_id: &str, req: &beam::StateRequest) -> Result<Response, String> {
    let bundle = fn_api
        .bundle_of(worker_id, &req.instruction_id)
        .ok_or_else(|| {
            format!(
                "state request for instruction {:?}, which is not a bundle in flight on SDK worker {worker_id}",
                req.instruction_id
            )
        })?;
    let key = req
        .state_key
        .as_ref()
        .and_then(|k| k.r#type.as_ref())
        .ok_or("state request without a key")?;
    let value_shape = |transform_id: &str, state_id: &str| {
        fn_api.with_descriptor(&bundle.descriptor_id, |d| {
            let d = d.ok_or_else(|| {
                format!(
                    "no ProcessBundleDescriptor {:?} for the bundle",
                    bundle.descriptor_id
                )
            })?;
            multimap_value_shape(d, transform_id, state_id)
        })
    };
    if let Some(answer) = user_state(&bundle.user_state, key, req, value_shape) {
        return answer;
    }
    let Some(R::Get(get_request)) = &req.request else {
        return Err(format!("side inputs are read-only (state key {key:?})"));
    };
    let side = &bundle.side_inputs;
    let token = &get_request.continuation_token;
    let page = match key {
        Key::IterableSideInput(k) => {
            side.iterable_page(&k.transform_id, &k.side_input_id, &k.window, token)?
        }
        Key::MultimapSideInput(k) => {
            side.multimap_values(&k.transform_id, &k.side_input_id, &k.window, &k.key, token)?
        }
        Key::MultimapKeysSideInput(k) => {
            side.multimap_keys(&k.transform_id, &k.side_input_id, &k.window, token)?
        }
        Key::MultimapKeysValuesSideInput(k) => {
            side.multimap_keys_values(&k.transform_id, &k.side_input_id, &k.window, token)?
        }
        other => return Err(format!("state key {other:?} is not supported by Weir yet")),
    };
    page.map(|p| {
        Response::Get(beam::StateGetResponse {
            continuation_token: p.continuation_token,
            data: p.data,
        })
    })
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
        let worker = super::known_worker(&self.0, &request)?;
        let mut inbound = request.into_inner();
        let (tx, rx) = mpsc::unbounded_channel();
        let fn_api = self.0.clone();
        tokio::spawn(async move {
            while let Some(Ok(req)) = inbound.next().await {
                let resp = match answer(&fn_api, &worker.id, &req) {
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
        // Values of state "m" of transform "t" are varints (Java's VarIntCoder).
        user_state(state, key, req, |t, s| {
            if (t, s) == ("t", "m") {
                Ok(ValueShape::Coder(weir_model::Coder::VarInt))
            } else {
                Err(format!("no state {s} of {t}"))
            }
        })
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

        // Side-input keys are not user state.
        let side = Key::IterableSideInput(Default::default());
        assert_eq!(serve(&state, &request(side, get)), None);
    }

    fn entry_of(map_key: &str) -> Key {
        Key::MultimapUserState(MultimapUserState {
            transform_id: "t".into(),
            user_state_id: "m".into(),
            window: vec![],
            key: vec![1, b'k'],
            map_key: [&[map_key.len() as u8], map_key.as_bytes()].concat(),
        })
    }

    fn entries_key(state_id: &str) -> Key {
        Key::MultimapEntriesUserState(beam::state_key::MultimapEntriesUserState {
            transform_id: "t".into(),
            user_state_id: state_id.into(),
            window: vec![],
            key: vec![1, b'k'],
        })
    }

    /// `MultimapEntriesUserState` Get answers `KV<K, Iterable<V>>` elements as
    /// Java's `KvCoder.of(keyCoder, IterableCoder.of(valueCoder))` decodes
    /// them: the map key, a 4-byte big-endian count, the values.
    #[test]
    fn multimap_entries_are_kvs_of_key_and_counted_values() {
        let state = BundleUserState::new(Default::default());
        let append = |data: &[u8]| {
            R::Append(beam::StateAppendRequest {
                data: data.to_vec(),
            })
        };
        let get = R::Get(beam::StateGetRequest::default());
        // Java's testMultimapStatePut: a -> 97, 97, 98 (two appends); b -> 33.
        for (mk, data) in [("b", &[33u8][..]), ("a", &[97, 97]), ("a", &[98])] {
            assert_eq!(
                serve(&state, &request(entry_of(mk), append(data))),
                Some(Ok(APPENDED))
            );
        }
        let want = [
            &[1, b'a'][..],
            &[0, 0, 0, 3],
            &[97, 97, 98],
            &[1, b'b'],
            &[0, 0, 0, 1],
            &[33],
        ]
        .concat();
        assert_eq!(
            serve(&state, &request(entries_key("m"), get.clone())),
            Some(Ok(self::get(want)))
        );
        // A multi-byte varint (300 = ac 02) counts as one value.
        serve(&state, &request(entry_of("b"), append(&[0xac, 0x02])));
        let want = [
            &[1, b'a'][..],
            &[0, 0, 0, 3],
            &[97, 97, 98],
            &[1, b'b'],
            &[0, 0, 0, 2],
            &[33, 0xac, 0x02],
        ]
        .concat();
        assert_eq!(
            serve(&state, &request(entries_key("m"), get.clone())),
            Some(Ok(self::get(want)))
        );
        // Values that do not split under the value coder are an error, not
        // a wrong count.
        serve(&state, &request(entry_of("c"), append(&[0x80])));
        let err = serve(&state, &request(entries_key("m"), get.clone()))
            .unwrap()
            .unwrap_err();
        assert!(
            err.contains("beam:coder:varint:v1") && err.contains("byte 0"),
            "{err}"
        );
        // A state whose value coder is unknown names the state.
        let err = serve(&state, &request(entries_key("other"), get.clone()))
            .unwrap()
            .unwrap_err();
        assert!(err.contains("no state other of t"), "{err}");
        // Clear on the entries key clears the whole multimap.
        let clear = R::Clear(beam::StateClearRequest {});
        assert_eq!(
            serve(&state, &request(entries_key("m"), clear)),
            Some(Ok(CLEARED))
        );
        assert_eq!(
            serve(&state, &request(entries_key("m"), get.clone())),
            Some(Ok(self::get(vec![])))
        );
        assert_eq!(
            serve(&state, &request(entry_of("a"), get)),
            Some(Ok(self::get(vec![])))
        );
        let err = serve(&state, &request(entries_key("m"), append(&[1])))
            .unwrap()
            .unwrap_err();
        assert!(
            err.contains("Append") && err.contains("MultimapEntriesUserState"),
            "{err}"
        );
    }
}
