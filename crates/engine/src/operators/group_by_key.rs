//! The GroupByKey operator: wires the pure GroupByKey buffers into timely.
//!
//! The grouping itself lives outside timely: [`crate::group_by_key`]'s
//! [`GroupByKeyBuffer`] (batch: one pane per window, fired when the
//! watermark passes it, spilled to disk past a memory budget) and
//! [`crate::panes`]'s [`PaneBuffer`] (streaming, and a batch GroupByKey
//! whose trigger uses processing time: trigger-driven panes). This
//! operator routes elements to workers by key, feeds the buffer, runs a
//! custom merging WindowFn's merges through the SDK, emits fired panes under
//! a hold, and reports late data and hot keys.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use timely::dataflow::channels::pact::Exchange;
use timely::dataflow::operators::{Capability, Operator};
use weir_graph::StageKind;
use weir_model::Timestamp;

use super::{Element, Elements};
use crate::bundle::{BundleRequest, BundleResult};
use crate::dataflow::{JobContext, StageStatus};
use crate::group_by_key::GroupByKeyBuffer;
use crate::merge_windows::{decode_response, encode_request};
use crate::panes::PaneBuffer;
use crate::time::{watermark_of, Time};
use crate::EngineError;

/// The GroupByKey stage `stage_index` over `input` (elements of PCollection
/// `input_pc`): its output stream carries the fired panes, one encoded
/// windowed KV of key and iterable per pane.
pub(crate) fn group_by_key<'s>(
    input: Elements<'s>,
    ctx: &JobContext,
    stage_index: usize,
    input_pc: usize,
    output_pc: usize,
) -> Elements<'s> {
    let graph = ctx.graph.clone();
    let info = &graph.pcollections[input_pc];
    let (vc, wc) = (info.value_coder.clone(), info.window_coder.clone());
    let ctx = ctx.clone();
    let name = graph.stages[stage_index].name.clone();
    let worker = input.scope().worker().clone();
    let worker_index = worker.index();
    let (route_ctx, peers) = (ctx.clone(), worker.peers() as u64);
    let route = move |e: &Element| {
        let hash = GroupByKeyBuffer::route_hash(&vc, &wc, e).unwrap_or(0);
        route_ctx.count_exchange(worker_index, hash, peers, e.len());
        hash
    };
    input.unary_frontier(Exchange::new(route), &name.clone(), move |cap, op_info| {
        drop(cap);
        let info = &ctx.graph.pcollections[input_pc];
        let mut groups = if ctx.graph.runs_triggers(input_pc, output_pc) {
            Groups::Streaming(PaneBuffer::new(
                info.value_coder.clone(),
                info.window_coder.clone(),
                info.windowing.clone(),
            ))
        } else {
            let buffer = GroupByKeyBuffer::new(
                info.value_coder.clone(),
                info.window_coder.clone(),
                info.windowing.clone(),
            );
            Groups::Batch(match ctx.config.gbk_memory_budget {
                Some(budget) => buffer.with_spill(
                    budget / ctx.config.workers.max(1),
                    ctx.config.spill_dir.join(format!("stage{stage_index}-worker{worker_index}")),
                ),
                None => buffer,
            })
        };
        let activator = worker.activator_for(op_info.address.clone());
        let mut reported_late = 0u64;
        let mut held: Option<Capability<Time>> = None;
        // A custom merging WindowFn: the keys of the merge bundle in flight
        // (by nonce), and where its result lands.
        let merge_stage = match &ctx.graph.stages[stage_index].kind {
            StageKind::GroupByKey { merge_windows, .. } => merge_windows.is_some(),
            _ => false,
        };
        // With the input watermark when it was sent: the merged windows'
        // triggers are evaluated as of the elements' arrival.
        let mut merging: Option<(Vec<Vec<u8>>, Timestamp)> = None;
        let merged: Arc<Mutex<Option<std::result::Result<BundleResult, String>>>> = Arc::default();
        let merge_activator = Arc::new(worker.sync_activator_for(op_info.address.to_vec()));
        move |(input, frontier), output| {
            let watermark = watermark_of(frontier.frontier().as_ref());
            let now = ctx.clock.now();
            let mut ready: Vec<Element> = Vec::new();
            input.for_each(|cap, data| {
                let t = *cap.least().expect("non-empty stamp");
                if held.as_ref().map(|h| t < *h.time()).unwrap_or(true) {
                    held = cap.retain_least(0);
                }
                ctx.count(stage_index, data.len(), 0, 0);
                for e in data.drain(..) {
                    let inserted = match &mut groups {
                        Groups::Batch(b) => b.insert(&e),
                        Groups::Streaming(p) => p.insert(&e, watermark, now).map(|panes| ready.extend(panes)),
                    };
                    if let Err(message) = inserted {
                        ctx.fail(EngineError::BadData {
                            stage: name.clone(),
                            pcollection: ctx.graph.pcollections[input_pc].id.clone(),
                            message,
                        });
                    }
                }
            });
            if ctx.stopped() {
                held = None;
                return;
            }
            if merge_stage {
                let result = merging
                    .is_some()
                    .then(|| merged.lock().unwrap_or_else(|p| p.into_inner()).take())
                    .flatten();
                if let Some(result) = result {
                    let (keys, sent_at) = merging.take().expect("a merge is in flight");
                    let window_coder = &ctx.graph.pcollections[input_pc].window_coder;
                    let merges = result
                        .and_then(|r| decode_response(window_coder, r.outputs.first().map(Vec::as_slice).unwrap_or(&[])));
                    match merges {
                        Ok(merges) => {
                            for (nonce, m) in merges {
                                let Some(key) = keys.get(nonce) else { continue };
                                match &mut groups {
                                    Groups::Batch(b) => b.apply_merges(key, m),
                                    Groups::Streaming(p) => ready.extend(p.apply_merges(key, m, sent_at, now)),
                                }
                            }
                        }
                        Err(message) => ctx.fail(EngineError::BundleFailed {
                            stage: format!("{name} (merging windows of its custom WindowFn)"),
                            message,
                        }),
                    }
                }
                let needed = merging.is_none()
                    && match &groups {
                        Groups::Batch(b) => b.needs_merge(|t: Timestamp| watermark > t),
                        Groups::Streaming(p) => p.has_unmerged(),
                    };
                if needed {
                    let requests = match &mut groups {
                        Groups::Batch(b) => b.take_unmerged(),
                        Groups::Streaming(p) => p.take_unmerged(),
                    };
                    let input = encode_request(requests.iter().map(|(_, w)| w.as_slice()));
                    merging = Some((requests.into_iter().map(|(k, _)| k).collect(), watermark));
                    let (slot, activator) = (merged.clone(), merge_activator.clone());
                    ctx.processor.process_bundle(
                        BundleRequest {
                            stage: stage_index,
                            stage_id: ctx.graph.stages[stage_index].id.clone(),
                            stage_name: format!("{name}/MergeWindows"),
                            input,
                            side_inputs: Arc::default(),
                            side_input_generation: 0,
                            timers: vec![],
                            on_split: None,
                            user_state: Arc::default(),
                            spill_outputs: None,
                        },
                        Box::new(move |result| {
                            *slot.lock().unwrap_or_else(|p| p.into_inner()) = Some(result);
                            let _ = activator.activate();
                        }),
                    );
                }
            }
            // Windows wait for their merges before anything fires.
            match &mut groups {
                _ if merging.is_some() => {}
                Groups::Batch(b) => {
                    // Spilled groups come back a chunk per activation, and
                    // only while the SDK stages keep up: what they have not
                    // taken yet would otherwise pile up in memory.
                    let backlog = b.spilled_runs() > 0
                        && ctx.pending_elements() > 2 * ctx.config.max_bundle_elements;
                    if backlog {
                        activator.activate_after(Duration::from_millis(2));
                    } else {
                        ready.extend(b.take_complete(|t: Timestamp| watermark > t));
                        if b.has_more_complete() {
                            activator.activate();
                        }
                    }
                    if let Some(message) = b.take_error() {
                        ctx.fail(EngineError::Spill { stage: name.clone(), message });
                    }
                }
                Groups::Streaming(p) => {
                    ready.extend(p.advance(watermark, now));
                    if p.dropped_late > reported_late {
                        ctx.config.notices.send(format!(
                            "GroupByKey {name} dropped {} late element(s) so far: their windows had expired (watermark past the end of the window plus the allowed lateness) or closed",
                            p.dropped_late
                        ));
                        reported_late = p.dropped_late;
                    }
                    if let Some(at) = p.next_deadline() {
                        if let Some(wait) = ctx.clock.wait_until(at) {
                            activator.activate_after(wait);
                        }
                    }
                }
            }
            if let Some(cap) = held.as_ref() {
                if !ready.is_empty() {
                    ctx.count(stage_index, 0, ready.len(), 0);
                    output.session(cap).give_iterator(ready.into_iter());
                }
            }
            let empty = match &groups {
                Groups::Batch(b) => b.is_empty(),
                Groups::Streaming(p) => p.is_empty(),
            };
            ctx.report(stage_index, worker_index, StageStatus {
                watermark: (!frontier.is_empty()).then_some(watermark),
                windows: match &groups {
                    Groups::Batch(b) => b.buffered_keys(),
                    Groups::Streaming(p) => p.buffered_keys(),
                },
                ..StageStatus::default()
            });
            if empty {
                if let (Some(_), Groups::Batch(buffer)) = (held.as_ref(), &mut groups) {
                    if let Some(hot) = buffer.take_hot_key() {
                        let share = 100.0 * hot.values as f64 / hot.total as f64;
                        let key = if ctx.config.hot_key_logging {
                            format!("key {}", describe_key(&hot.key))
                        } else {
                            "a key (enable_hot_key_logging shows which)".to_string()
                        };
                        ctx.config.notices.send(format!(
                            "hot key in GroupByKey {name}: {key} has {} of the {} values ({share:.0}%) grouped on one worker",
                            hot.values, hot.total
                        ));
                    }
                }
                held = None;
            } else if merging.is_some() {
                // Panes of windows being merged go out at the time their
                // elements came in: downstream must not think them late.
            } else if let (Some(cap), Some(min)) = (held.as_mut(), frontier.frontier().iter().min())
            {
                if *min > *cap.time() {
                    cap.downgrade(min);
                }
            }
        }
    })
}

/// A GroupByKey's buffered data: one pane per window in batch, trigger-driven
/// panes in streaming and under a processing-time trigger.
enum Groups {
    Batch(GroupByKeyBuffer),
    Streaming(PaneBuffer),
}

/// A printable form of an encoded key: a length-prefixed UTF-8 string as
/// text, anything else as hex; at most 100 characters.
fn describe_key(key: &[u8]) -> String {
    let text = weir_model::varint::decode_varint(key)
        .ok()
        .filter(|(len, used)| *len as usize + used == key.len())
        .and_then(|(_, used)| std::str::from_utf8(&key[used..]).ok())
        .filter(|s| s.chars().all(|c| !c.is_control()))
        .map(|s| format!("{s:?}"))
        .unwrap_or_else(|| key.iter().map(|b| format!("{b:02x}")).collect());
    text.chars().take(100).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_length_prefixed_string_key_reads_as_quoted_text() {
        assert_eq!(describe_key(b"\x03abc"), "\"abc\"");
        assert_eq!(describe_key(b"\x00"), "\"\"");
    }

    #[test]
    fn other_keys_read_as_hex() {
        // The length prefix does not match the bytes that follow.
        assert_eq!(describe_key(b"\x05abc"), "05616263");
        // Not UTF-8.
        assert_eq!(describe_key(&[0x02, 0xff, 0xfe]), "02fffe");
        // Control characters are not shown as text.
        assert_eq!(describe_key(b"\x01\n"), "010a");
    }

    #[test]
    fn a_long_key_is_cut_at_100_characters() {
        let key = vec![0xabu8; 80];
        let text = describe_key(&key);
        assert_eq!(text.len(), 100);
        assert!(text.chars().all(|c| c == 'a' || c == 'b'));
    }
}
