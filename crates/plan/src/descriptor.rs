//! From fused stages to the engine's [`StageGraph`] and the
//! `ProcessBundleDescriptor`s (beam_fn_api.proto) SDK harnesses execute.
//!
//! Each SDK stage reads its main input through a `beam:runner:source:v1`
//! transform and writes every PCollection consumed outside the stage through a
//! `beam:runner:sink:v1` transform, both carrying a `RemoteGrpcPort` whose
//! coder is the windowed wire coder of that PCollection. Inside the
//! descriptor only the main input and the side inputs are declared in their
//! wire coders; every other PCollection keeps the pipeline's own coder (as
//! Beam's Prism runner does), which SDKs read, e.g. Java for a schema.

use std::collections::{BTreeSet, HashMap};

use prost::Message;
use weir_model::Coder;
use weir_proto::{beam, urns};

use crate::coders::{test_stream_element_coder, to_model, windowed_coder_id, wire_coder_id};
use crate::fusion::{split_inputs, FusedStage};
use crate::graph::*;
use crate::leaves::{pardo_payload, LeafKind};
use crate::{windowing, Plan, PlanError, PlanOptions, Result};

pub(crate) struct Builder<'a> {
    pub(crate) c: &'a beam::Components,
    pub(crate) coders: HashMap<String, beam::Coder>,
    index: HashMap<String, PCollectionIndex>,
    pcollections: Vec<PCollectionInfo>,
    /// PCollection id -> wire (element) coder id.
    wire: HashMap<String, String>,
}

impl Builder<'_> {
    pub(crate) fn pc(&self, id: &str) -> Result<&beam::PCollection> {
        self.c
            .pcollections
            .get(id)
            .ok_or_else(|| PlanError::Invalid(format!("unknown PCollection id {id:?}")))
    }

    /// The wire element coder id of PCollection `id`.
    fn wire_of(&mut self, id: &str) -> Result<String> {
        if let Some(w) = self.wire.get(id) {
            return Ok(w.clone());
        }
        let coder_id = self.pc(id)?.coder_id.clone();
        let w = wire_coder_id(&mut self.coders, &coder_id)?;
        self.wire.insert(id.to_string(), w.clone());
        Ok(w)
    }

    fn index_of(&mut self, id: &str) -> Result<PCollectionIndex> {
        if let Some(&i) = self.index.get(id) {
            return Ok(i);
        }
        let pc = self.pc(id)?.clone();
        let wire = self.wire_of(id)?;
        let windowing = windowing::parse(
            &self.c.windowing_strategies,
            &self.c.environments,
            &pc.windowing_strategy_id,
            id,
        )?;
        let window_coder_id = self.window_wire(&pc.windowing_strategy_id)?;
        let info = PCollectionInfo {
            id: id.to_string(),
            value_coder: to_model(&self.coders, &wire)?,
            window_coder: to_model(&self.coders, &window_coder_id)?,
            windowing,
        };
        self.pcollections.push(info);
        self.index
            .insert(id.to_string(), self.pcollections.len() - 1);
        Ok(self.pcollections.len() - 1)
    }

    /// The wire window coder id of windowing strategy `ws`.
    pub(crate) fn window_wire(&mut self, ws: &str) -> Result<String> {
        let window = self
            .c
            .windowing_strategies
            .get(ws)
            .ok_or_else(|| PlanError::Invalid(format!("unknown windowing strategy {ws:?}")))?
            .window_coder_id
            .clone();
        wire_coder_id(&mut self.coders, &window)
    }

    /// Windowing strategy `ws` as sent to SDK harnesses: with its wire window coder.
    fn wire_windowing_strategy(&mut self, ws: &str) -> Result<beam::WindowingStrategy> {
        let mut strategy = self
            .c
            .windowing_strategies
            .get(ws)
            .cloned()
            .unwrap_or_default();
        strategy.window_coder_id = self.window_wire(ws)?;
        Ok(strategy)
    }

    fn windowed_wire(&mut self, pc_id: &str) -> Result<String> {
        let wire = self.wire_of(pc_id)?;
        let ws = self.pc(pc_id)?.windowing_strategy_id.clone();
        let window = self.window_wire(&ws)?;
        Ok(windowed_coder_id(&mut self.coders, &wire, &window))
    }
}

fn single(
    t: &beam::PTransform,
    id: &str,
    what: &str,
    m: &HashMap<String, String>,
) -> Result<String> {
    crate::leaves::only(m).cloned().ok_or_else(|| {
        PlanError::Invalid(format!(
            "transform {id} ({}) must have exactly one {what}",
            t.unique_name
        ))
    })
}

pub(crate) fn build(
    c: &beam::Components,
    fused: Vec<FusedStage>,
    options: &PlanOptions,
) -> Result<Plan> {
    let mut b = Builder {
        c,
        coders: c.coders.clone(),
        index: HashMap::new(),
        pcollections: vec![],
        wire: HashMap::new(),
    };

    // Leaf id -> fused stage number; PCollection id -> consuming leaves.
    let mut stage_of_leaf: HashMap<&str, usize> = HashMap::new();
    for (i, s) in fused.iter().enumerate() {
        match s {
            FusedStage::Runner { transform_id, .. } => {
                stage_of_leaf.insert(transform_id, i);
            }
            FusedStage::Sdk { transforms, .. } => {
                for t in transforms {
                    stage_of_leaf.insert(t, i);
                }
            }
        }
    }
    let mut consumers: HashMap<&str, Vec<usize>> = HashMap::new();
    for (leaf, &stage) in &stage_of_leaf {
        for pc in c.transforms[*leaf].inputs.values() {
            consumers.entry(pc.as_str()).or_default().push(stage);
        }
    }

    let mut stages = Vec::new();
    let mut descriptors = HashMap::new();
    let mut environments = HashMap::new();
    for (n, s) in fused.iter().enumerate() {
        let stage_id = format!("stage-{n}");
        match s {
            FusedStage::Runner { kind, transform_id } => {
                let t = &c.transforms[transform_id];
                let kind = match kind {
                    LeafKind::Impulse => StageKind::Impulse {
                        output: b.index_of(&single(t, transform_id, "output", &t.outputs)?)?,
                    },
                    LeafKind::TestStream => test_stream(&mut b, transform_id, t)?,
                    LeafKind::GroupByKey | LeafKind::Reshuffle => {
                        let input = b.index_of(&single(t, transform_id, "input", &t.inputs)?)?;
                        let output = b.index_of(&single(t, transform_id, "output", &t.outputs)?)?;
                        if !matches!(b.pcollections[input].value_coder, Coder::Kv(..))
                            && *kind == LeafKind::GroupByKey
                        {
                            return Err(PlanError::Invalid(format!(
                                "GroupByKey {transform_id} ({}) input {} is not KV-coded",
                                t.unique_name, b.pcollections[input].id
                            )));
                        }
                        if *kind == LeafKind::GroupByKey {
                            let merge_windows = if b.pcollections[input].windowing.window_fn
                                == WindowFn::CustomMerging
                            {
                                let input_id = single(t, transform_id, "input", &t.inputs)?;
                                let (stage, d) = crate::merge_windows::stage(
                                    &mut b,
                                    &stage_id,
                                    &t.unique_name,
                                    &input_id,
                                    input,
                                    options,
                                )?;
                                if let Some(env) = c.environments.get(&stage.environment_id) {
                                    environments.insert(stage.environment_id.clone(), env.clone());
                                }
                                descriptors.insert(stage_id.clone(), d);
                                Some(Box::new(stage))
                            } else {
                                None
                            };
                            StageKind::GroupByKey {
                                input,
                                output,
                                merge_windows,
                            }
                        } else {
                            StageKind::Reshuffle { input, output }
                        }
                    }
                    LeafKind::Flatten => {
                        let mut names: Vec<_> = t.inputs.iter().collect();
                        names.sort();
                        let inputs = names
                            .into_iter()
                            .map(|(_, pc)| b.index_of(pc))
                            .collect::<Result<Vec<_>>>()?;
                        StageKind::Flatten {
                            inputs,
                            output: b.index_of(&single(t, transform_id, "output", &t.outputs)?)?,
                        }
                    }
                    LeafKind::Sdk => {
                        return Err(PlanError::Internal("SDK leaf in a runner stage".into()))
                    }
                };
                stages.push(Stage {
                    id: stage_id,
                    name: t.unique_name.clone(),
                    kind,
                });
            }
            FusedStage::Sdk {
                environment_id,
                input,
                transforms,
            } => {
                let mut d = beam::ProcessBundleDescriptor {
                    id: stage_id.clone(),
                    state_api_service_descriptor: Some(beam::ApiServiceDescriptor {
                        url: options.fn_api_url.clone(),
                        ..Default::default()
                    }),
                    ..Default::default()
                };
                let mut referenced: BTreeSet<String> = BTreeSet::new();
                let mut outputs: BTreeSet<String> = BTreeSet::new();
                let mut side_inputs = Vec::new();
                let mut side_pcollections: BTreeSet<String> = BTreeSet::new();
                let mut residual_transform_ids = Vec::new();
                let mut splittable = false;
                let mut stateful = false;
                let mut time_sorted = false;
                let mut window_expiration_family = None;
                let mut timer_families = Vec::new();
                let mut names = Vec::new();
                for tid in transforms {
                    let t = &c.transforms[tid];
                    names.push(t.unique_name.clone());
                    referenced.extend(t.inputs.values().cloned());
                    referenced.extend(t.outputs.values().cloned());
                    for pc in t.outputs.values() {
                        let outside = consumers
                            .get(pc.as_str())
                            .map(|v| v.iter().any(|&st| st != n))
                            .unwrap_or(false);
                        if outside {
                            outputs.insert(pc.clone());
                        }
                    }
                    let (main, side) = split_inputs(tid, t)?;
                    if main.first() == Some(input) {
                        residual_transform_ids.push(tid.clone());
                        splittable |= crate::leaves::urn_of(t)
                            == urns::transform::SDF_PROCESS_SIZED_ELEMENTS_AND_RESTRICTIONS;
                    }
                    if !side.is_empty() {
                        let payload = pardo_payload(tid, t)?;
                        for (local, pc) in side {
                            let pattern = payload.side_inputs[&local]
                                .access_pattern
                                .as_ref()
                                .map(|a| a.urn.as_str());
                            let kind = if pattern == Some(urns::side_input::MULTIMAP) {
                                SideInputKind::Multimap
                            } else {
                                SideInputKind::Iterable
                            };
                            side_pcollections.insert(pc.clone());
                            side_inputs.push(SideInput {
                                transform_id: tid.clone(),
                                local_name: local,
                                pcollection: b.index_of(&pc)?,
                                kind,
                                window_fn: side_window_fn(c, &pc),
                            });
                        }
                    }
                    let mut t = t.clone();
                    if crate::leaves::urn_of(&t) == urns::transform::PAR_DO {
                        let mut payload = pardo_payload(tid, &t)?;
                        if !payload.timer_family_specs.is_empty() {
                            let mut families: Vec<_> =
                                payload.timer_family_specs.iter_mut().collect();
                            families.sort_by(|a, b| a.0.cmp(b.0));
                            for (family_id, spec) in families {
                                let wire =
                                    wire_coder_id(&mut b.coders, &spec.timer_family_coder_id)?;
                                let model = to_model(&b.coders, &wire)?;
                                let Coder::Timer { key, window } = model else {
                                    return Err(PlanError::Invalid(format!(
                                        "timer family {family_id} of {tid} is not coded with beam:coder:timer:v1"
                                    )));
                                };
                                timer_families.push(TimerFamily {
                                    transform_id: tid.clone(),
                                    family_id: family_id.clone(),
                                    key_coder: *key,
                                    window_coder: *window,
                                    event_time: spec.time_domain
                                        != beam::time_domain::Enum::ProcessingTime as i32,
                                    fire_at_hold: spec.time_domain
                                        == beam::time_domain::Enum::ProcessingTime as i32
                                        && crate::windowing::is_python_environment(
                                            &t.environment_id,
                                            &c.environments,
                                        ),
                                });
                                spec.timer_family_coder_id = wire;
                            }
                            if let Some(spec) = t.spec.as_mut() {
                                spec.payload = payload.encode_to_vec();
                            }
                        }
                        if main.first() == Some(input) && crate::leaves::is_stateful(tid, &t)? {
                            // As Beam's Java runners (runners-core's StatefulDoFnRunner)
                            // refuse it: state and timers are kept per window, and a
                            // merging WindowFn's elements come in unmerged windows.
                            let input_index = b.index_of(input)?;
                            if matches!(
                                b.pcollections[input_index].windowing.window_fn,
                                WindowFn::Sessions { .. } | WindowFn::CustomMerging
                            ) {
                                return Err(PlanError::Invalid(format!(
                                    "transform {tid} ({}): a stateful DoFn (state or timers) is not supported on a PCollection with a merging WindowFn (here {}); state is kept per window, and merging windows are only merged by a GroupByKey. Re-window the input into non-merging windows first",
                                    t.unique_name,
                                    match b.pcollections[input_index].windowing.window_fn {
                                        WindowFn::Sessions { .. } => "session windows",
                                        _ => "a custom merging WindowFn",
                                    }
                                )));
                            }
                            stateful = true;
                            time_sorted = payload.requires_time_sorted_input;
                            let family = &payload.on_window_expiration_timer_family_spec;
                            if !family.is_empty() {
                                let index = timer_families
                                    .iter()
                                    .position(|f| f.transform_id == *tid && f.family_id == *family)
                                    .ok_or_else(|| {
                                        PlanError::Invalid(format!(
                                            "transform {tid} ({}): its on_window_expiration_timer_family_spec {family:?} names no timer family of it",
                                            t.unique_name
                                        ))
                                    })?;
                                window_expiration_family = Some(index);
                            }
                        }
                    }
                    d.transforms.insert(tid.clone(), t);
                }
                if !timer_families.is_empty() {
                    d.timer_api_service_descriptor = Some(beam::ApiServiceDescriptor {
                        url: options.fn_api_url.clone(),
                        ..Default::default()
                    });
                }
                let source_id = format!("{stage_id}/source");
                let port = |coder_id: String| beam::RemoteGrpcPort {
                    api_service_descriptor: Some(beam::ApiServiceDescriptor {
                        url: options.fn_api_url.clone(),
                        ..Default::default()
                    }),
                    coder_id,
                };
                let source_port = port(b.windowed_wire(input)?);
                d.transforms.insert(
                    source_id.clone(),
                    beam::PTransform {
                        unique_name: source_id.clone(),
                        spec: Some(beam::FunctionSpec {
                            urn: urns::transform::DATA_SOURCE.into(),
                            payload: source_port.encode_to_vec(),
                        }),
                        outputs: [("out".to_string(), input.clone())].into_iter().collect(),
                        ..Default::default()
                    },
                );
                let mut output_indices = Vec::new();
                let mut output_transform_ids = Vec::new();
                for pc in &outputs {
                    let sink_id = format!("{stage_id}/sink:{pc}");
                    let sink_port = port(b.windowed_wire(pc)?);
                    d.transforms.insert(
                        sink_id.clone(),
                        beam::PTransform {
                            unique_name: sink_id.clone(),
                            spec: Some(beam::FunctionSpec {
                                urn: urns::transform::DATA_SINK.into(),
                                payload: sink_port.encode_to_vec(),
                            }),
                            inputs: [("in".to_string(), pc.clone())].into_iter().collect(),
                            ..Default::default()
                        },
                    );
                    output_indices.push(b.index_of(pc)?);
                    output_transform_ids.push(sink_id);
                }
                // Only what crosses the data or state plane is in its wire
                // coder: the main input (its keys are the state and timer
                // keys) and the side inputs (served by the runner). Every
                // other PCollection keeps the pipeline's coder, so an SDK
                // still sees e.g. Java's SchemaCoder on a PCollection it
                // reads rows from; the sinks' ports carry the wire coder.
                // Except an element coder that is itself a windowed value
                // (Java's `Create.windowedValues` before it unwraps them):
                // the Java harness takes such a PCollection coder for the
                // coder of the whole windowed element, so it goes
                // length-prefixed (opaque to the harness), as before.
                for pc in &referenced {
                    let mut p = b.pc(pc)?.clone();
                    let element_urn = b
                        .coders
                        .get(&p.coder_id)
                        .and_then(|c| c.spec.as_ref())
                        .map(|s| s.urn.as_str());
                    let windowed_element = matches!(
                        element_urn,
                        Some(urns::coder::WINDOWED_VALUE | urns::coder::PARAM_WINDOWED_VALUE)
                    );
                    if pc == input || side_pcollections.contains(pc) || windowed_element {
                        p.coder_id = b.wire_of(pc)?;
                    }
                    if !d
                        .windowing_strategies
                        .contains_key(&p.windowing_strategy_id)
                    {
                        let strategy = b.wire_windowing_strategy(&p.windowing_strategy_id)?;
                        d.windowing_strategies
                            .insert(p.windowing_strategy_id.clone(), strategy);
                    }
                    d.pcollections.insert(pc.clone(), p);
                }
                let input_index = b.index_of(input)?;
                // A job drained later truncates the restrictions running then.
                let drain_descriptor_id = match residual_transform_ids
                    .iter()
                    .find(|t| t.ends_with(crate::sdf::PROCESS_SUFFIX))
                {
                    Some(process_id) if splittable && !options.drain => {
                        let id = format!("{stage_id}/drain");
                        let v = crate::sdf::drain_variant(&d, &id, process_id, input)?;
                        descriptors.insert(id.clone(), v);
                        Some(id)
                    }
                    _ => None,
                };
                stages.push(Stage {
                    id: stage_id.clone(),
                    name: names.join("+"),
                    kind: StageKind::Sdk(SdkStage {
                        environment_id: environment_id.clone(),
                        input: input_index,
                        input_transform_id: source_id,
                        side_inputs,
                        outputs: output_indices,
                        output_transform_ids,
                        residual_transform_ids,
                        splittable,
                        stateful,
                        time_sorted,
                        timer_families,
                        drain_descriptor_id,
                        window_expiration_family,
                    }),
                });
                if let Some(env) = c.environments.get(environment_id) {
                    environments.insert(environment_id.clone(), env.clone());
                } else {
                    return Err(PlanError::Invalid(format!(
                        "stage {} uses unknown environment {environment_id:?}",
                        names.join("+")
                    )));
                }
                descriptors.insert(stage_id, d);
            }
        }
    }
    // Every descriptor gets the final coder table (wire coders were added while building).
    for d in descriptors.values_mut() {
        d.coders = b.coders.clone();
        d.environments = c.environments.clone();
    }
    Ok(Plan {
        graph: StageGraph {
            streaming: options.streaming
                || stages
                    .iter()
                    .any(|s| matches!(s.kind, StageKind::TestStream { .. })),
            pcollections: b.pcollections,
            stages,
        },
        descriptors,
        environments,
    })
}

/// The stage of a `beam:transform:teststream:v1` transform: its outputs (in
/// the order of their tags) and its events, from the `TestStreamPayload`.
/// An event's empty tag names the main output: the only output, or the one
/// tagged `None` (Python) / `main` otherwise.
fn test_stream(b: &mut Builder<'_>, id: &str, t: &beam::PTransform) -> Result<StageKind> {
    use beam::test_stream_payload::event::Event;
    let payload = t.spec.as_ref().map(|s| s.payload.as_slice()).unwrap_or(&[]);
    let p = beam::TestStreamPayload::decode(payload).map_err(|e| {
        PlanError::Invalid(format!("TestStream {id} ({}): bad TestStreamPayload: {e}", t.unique_name))
    })?;
    if p.endpoint.is_some() && p.events.is_empty() {
        return Err(PlanError::Unsupported {
            transform: format!("{id} ({})", t.unique_name),
            urn: urns::transform::TEST_STREAM.into(),
            feature: "a TestStream served by a TestStreamService endpoint (give the events in the payload)".into(),
        });
    }
    let mut tags: Vec<&String> = t.outputs.keys().collect();
    tags.sort();
    let outputs = tags
        .iter()
        .map(|tag| b.index_of(&t.outputs[*tag]))
        .collect::<Result<Vec<_>>>()?;
    let output_of = |tag: &str| -> Result<usize> {
        let found = if tag.is_empty() {
            if tags.len() == 1 {
                Some(0)
            } else {
                tags.iter().position(|t| *t == "None" || *t == "main" || *t == "out")
            }
        } else {
            tags.iter().position(|t| *t == tag)
        };
        found.ok_or_else(|| {
            PlanError::Invalid(format!(
                "TestStream {id}: event for output tag {tag:?}, which is not one of its outputs {tags:?}"
            ))
        })
    };
    // Elements come in the payload coder's outer context; the TestStream's
    // PCollections carry them length-prefixed (see test_stream_element_coder).
    let elements_form = test_stream_element_coder(&mut b.coders, &p.coder_id)?;
    let mut events = Vec::new();
    for e in &p.events {
        events.push(match e.event.as_ref() {
            Some(Event::ElementEvent(add)) => {
                let output = output_of(&add.tag)?;
                TestStreamEvent::Elements {
                    output,
                    elements: add
                        .elements
                        .iter()
                        .map(|el| (elements_form.wire_form(&el.encoded_element), weir_model::Timestamp(el.timestamp)))
                        .collect(),
                }
            }
            Some(Event::WatermarkEvent(w)) => TestStreamEvent::Watermark {
                output: output_of(&w.tag)?,
                to: weir_model::Timestamp(w.new_watermark),
            },
            Some(Event::ProcessingTimeEvent(pt)) => TestStreamEvent::ProcessingTime {
                advance_ms: pt.advance_duration,
            },
            None => continue,
        });
    }
    Ok(StageKind::TestStream { outputs, events })
}

/// The WindowFn of PCollection `pc` as a side input sees it (see
/// [`SideWindowFn`]); a payload that does not decode, or a non-positive size
/// or period, makes it [`SideWindowFn::Other`].
fn side_window_fn(c: &beam::Components, pc: &str) -> SideWindowFn {
    let Some(f) = c
        .pcollections
        .get(pc)
        .and_then(|p| c.windowing_strategies.get(&p.windowing_strategy_id))
        .and_then(|ws| ws.window_fn.as_ref())
    else {
        return SideWindowFn::Other;
    };
    let ms = |d: Option<weir_proto::prost_types::Duration>| d.map(|d| d.seconds * 1000 + i64::from(d.nanos) / 1_000_000).unwrap_or(0);
    let at = |t: Option<weir_proto::prost_types::Timestamp>| t.map(|t| t.seconds * 1000 + i64::from(t.nanos) / 1_000_000).unwrap_or(0);
    match f.urn.as_str() {
        urns::window_fn::GLOBAL => SideWindowFn::Global,
        urns::window_fn::FIXED => match beam::FixedWindowsPayload::decode(f.payload.as_slice()) {
            Ok(p) if ms(p.size) > 0 => SideWindowFn::Fixed { size_ms: ms(p.size), offset_ms: at(p.offset) },
            _ => SideWindowFn::Other,
        },
        urns::window_fn::SLIDING => match beam::SlidingWindowsPayload::decode(f.payload.as_slice()) {
            Ok(p) if ms(p.size) > 0 && ms(p.period) > 0 => SideWindowFn::Sliding {
                size_ms: ms(p.size),
                period_ms: ms(p.period),
                offset_ms: at(p.offset),
            },
            _ => SideWindowFn::Other,
        },
        _ => SideWindowFn::Other,
    }
}
