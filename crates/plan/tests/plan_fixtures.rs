//! Plans pipelines captured from the Beam Python SDK (2.77, PortableRunner,
//! LOOPBACK) and checks the stage graph and descriptors Weir builds for them.
//!
//! The fixtures are produced by `tests/fixtures/capture.py` (see its docstring)
//! and committed; ids such as `ref_PCollection_PCollection_12` are the ones the
//! SDK assigned in that capture. URNs are written out as literals on purpose,
//! so a wrong constant in `weir_proto::urns` cannot hide here.

use std::collections::{BTreeSet, HashMap};

use weir_model::Coder;
use weir_plan::{
    plan, Accumulation, OutputTime, Plan, PlanError, PlanOptions, SdkStage, SideInputKind, Stage,
    StageKind, TestStreamEvent, Trigger, WindowFn,
};
use weir_proto::beam;
use weir_proto::prost::Message;

const FN_API_URL: &str = "127.0.0.1:47011";
const ENV_ID: &str = "ref_Environment_default_environment_1";
const TRANSCODE_MARKER: &str = "/weir:transcode:";

const PICKLED: &str = "beam:coder:pickled_python:v1";
const LENGTH_PREFIX: &str = "beam:coder:length_prefix:v1";
const WINDOWED_VALUE: &str = "beam:coder:windowed_value:v1";
const SOURCE: &str = "beam:runner:source:v1";
const SINK: &str = "beam:runner:sink:v1";
const PAR_DO: &str = "beam:transform:pardo:v1";
const FLATTEN: &str = "beam:transform:flatten:v1";

// ------------------------------------------------------------------ helpers

fn load(name: &str) -> beam::Pipeline {
    let path = format!("{}/tests/fixtures/{name}.pb", env!("CARGO_MANIFEST_DIR"));
    let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("reading {path}: {e}"));
    beam::Pipeline::decode(bytes.as_slice()).unwrap_or_else(|e| panic!("decoding {path}: {e}"))
}

fn options() -> PlanOptions {
    PlanOptions {
        fn_api_url: FN_API_URL.to_string(),
        streaming: false,
        drain: false,
    }
}

/// Plans `pipeline` and checks the invariants every plan must satisfy.
fn plan_ok(pipeline: &beam::Pipeline) -> Plan {
    let p = plan(pipeline, &options()).unwrap_or_else(|e| panic!("planning failed: {e}"));
    check_invariants(&p);
    p
}

fn plan_fixture(name: &str) -> Plan {
    plan_ok(&load(name))
}

fn plan_err(pipeline: &beam::Pipeline) -> PlanError {
    match plan(pipeline, &options()) {
        Ok(p) => panic!(
            "expected a planning error, got {} stages: {:?}",
            p.graph.stages.len(),
            names(&p)
        ),
        Err(e) => e,
    }
}

fn kind_name(s: &Stage) -> &'static str {
    match s.kind {
        StageKind::Impulse { .. } => "Impulse",
        StageKind::TestStream { .. } => "TestStream",
        StageKind::GroupByKey { .. } => "GroupByKey",
        StageKind::Flatten { .. } => "Flatten",
        StageKind::Reshuffle { .. } => "Reshuffle",
        StageKind::Sdk(_) => "Sdk",
    }
}

fn kinds(p: &Plan) -> Vec<&'static str> {
    p.graph.stages.iter().map(kind_name).collect()
}

fn names(p: &Plan) -> Vec<String> {
    p.graph.stages.iter().map(|s| s.name.clone()).collect()
}

fn sdk(p: &Plan, stage: usize) -> &SdkStage {
    match &p.graph.stages[stage].kind {
        StageKind::Sdk(s) => s,
        other => panic!(
            "stage {stage} ({}) is not an SDK stage: {other:?}",
            p.graph.stages[stage].name
        ),
    }
}

fn pc_id(p: &Plan, index: usize) -> &str {
    &p.graph.pcollections[index].id
}

fn descriptor<'a>(p: &'a Plan, stage: usize) -> &'a beam::ProcessBundleDescriptor {
    let id = &p.graph.stages[stage].id;
    p.descriptors
        .get(id)
        .unwrap_or_else(|| panic!("no descriptor for stage {id}"))
}

fn urn_of(t: &beam::PTransform) -> &str {
    t.spec.as_ref().map(|s| s.urn.as_str()).unwrap_or("")
}

fn coder_urn<'a>(coders: &'a HashMap<String, beam::Coder>, id: &str) -> &'a str {
    coders
        .get(id)
        .unwrap_or_else(|| panic!("coder {id:?} is not in the descriptor"))
        .spec
        .as_ref()
        .map(|s| s.urn.as_str())
        .unwrap_or("")
}

/// The model coder of proto coder `id`, built independently of the planner.
fn model(coders: &HashMap<String, beam::Coder>, id: &str) -> Coder {
    let c = coders
        .get(id)
        .unwrap_or_else(|| panic!("coder {id:?} is not in the descriptor"));
    let comps = c
        .component_coder_ids
        .iter()
        .map(|comp| model(coders, comp))
        .collect();
    let spec = c.spec.clone().unwrap_or_default();
    Coder::from_urn(&spec.urn, &spec.payload, comps).unwrap_or_else(|e| panic!("coder {id}: {e}"))
}

fn kv(k: Coder, v: Coder) -> Coder {
    Coder::Kv(Box::new(k), Box::new(v))
}

/// True for `Opaque pickled_python` (the pipeline's own coder, not prefixed).
fn is_pickled(c: &Coder) -> bool {
    matches!(c, Coder::Opaque { urn, .. } if urn == PICKLED)
}

/// The value coder of the sink port through which SDK stage `stage` writes
/// PCollection `pc`.
fn sink_value_coder(p: &Plan, stage: usize, pc: &str) -> Coder {
    let d = descriptor(p, stage);
    let StageKind::Sdk(s) = &p.graph.stages[stage].kind else {
        panic!("stage {stage} is not an SDK stage")
    };
    let port = s
        .outputs
        .iter()
        .position(|&i| p.graph.pcollections[i].id == pc)
        .unwrap_or_else(|| panic!("stage {stage} does not write {pc}"));
    let wv = port_coder(d, &s.output_transform_ids[port], SINK);
    model(&d.coders, &d.coders[&wv].component_coder_ids[0])
}

/// True for `LengthPrefix(Opaque pickled_python)`.
fn is_lp_pickled(c: &Coder) -> bool {
    matches!(c, Coder::LengthPrefix(inner) if matches!(inner.as_ref(), Coder::Opaque { urn, .. } if urn == PICKLED))
}

/// Walks coder `id` as the runner must read it: structure it may look into,
/// leaves it can measure, and anything else only under a length prefix.
/// Returns how many length prefixes were met.
fn check_measurable(coders: &HashMap<String, beam::Coder>, id: &str, path: &str) -> usize {
    let urn = coder_urn(coders, id);
    let here = format!("{path} > {id} ({urn})");
    match urn {
        LENGTH_PREFIX => 1,
        "beam:coder:kv:v1"
        | "beam:coder:iterable:v1"
        | "beam:coder:nullable:v1"
        | WINDOWED_VALUE => coders[id]
            .component_coder_ids
            .iter()
            .map(|c| check_measurable(coders, c, &here))
            .sum(),
        "beam:coder:bytes:v1"
        | "beam:coder:string_utf8:v1"
        | "beam:coder:varint:v1"
        | "beam:coder:bool:v1"
        | "beam:coder:double:v1"
        | "beam:coder:global_window:v1"
        | "beam:coder:interval_window:v1" => 0,
        _ => panic!("coder not under {LENGTH_PREFIX} on a data port: {here}"),
    }
}

/// Decodes the RemoteGrpcPort of a source or sink transform and checks it.
/// Returns the port's windowed coder id.
fn port_coder(d: &beam::ProcessBundleDescriptor, transform_id: &str, expected_urn: &str) -> String {
    let t = d
        .transforms
        .get(transform_id)
        .unwrap_or_else(|| panic!("{} has no transform {transform_id}", d.id));
    assert_eq!(urn_of(t), expected_urn, "transform {transform_id}");
    let payload = &t.spec.as_ref().unwrap().payload;
    let port = beam::RemoteGrpcPort::decode(payload.as_slice()).expect("RemoteGrpcPort payload");
    assert_eq!(
        port.api_service_descriptor.as_ref().map(|a| a.url.as_str()),
        Some(FN_API_URL)
    );
    port.coder_id
}

/// Coder `c` as the runner reads it on the data plane, built independently of
/// the planner: structure kept, measurable leaves kept, anything else under
/// a length prefix.
fn wire_model(c: &Coder) -> Coder {
    match c {
        Coder::Bytes
        | Coder::StringUtf8
        | Coder::VarInt
        | Coder::Bool
        | Coder::Double
        | Coder::GlobalWindow
        | Coder::IntervalWindow
        | Coder::LengthPrefix(_) => c.clone(),
        Coder::Kv(k, v) => kv(wire_model(k), wire_model(v)),
        Coder::Iterable(e) => Coder::Iterable(Box::new(wire_model(e))),
        Coder::Nullable(e) => Coder::Nullable(Box::new(wire_model(e))),
        other => Coder::LengthPrefix(Box::new(other.clone())),
    }
}

/// Which side of a stage's data plane a port is on.
#[derive(Clone, Copy, PartialEq, Debug)]
enum PortSide {
    /// The stage's `beam:runner:source:v1`: the descriptor declares its
    /// PCollection in the port's (wire) coder, since the main input's keys
    /// are the state and timer keys.
    Source,
    /// A `beam:runner:sink:v1`: its PCollection keeps the pipeline's coder
    /// (an SDK may read it inside the stage), the port carries its wire form.
    Sink,
}

/// Checks that port coder `wv_id` is `windowed_value(<wire coder of pc>, <window coder of pc>)`
/// in descriptor `d` (for a source, exactly the PCollection's coder id in the
/// descriptor), and that the engine's view of `pc_index` uses the same coders.
fn check_port(
    p: &Plan,
    d: &beam::ProcessBundleDescriptor,
    wv_id: &str,
    pc_index: usize,
    side: PortSide,
) {
    let pc = &p.graph.pcollections[pc_index];
    assert_eq!(
        coder_urn(&d.coders, wv_id),
        WINDOWED_VALUE,
        "port coder {wv_id} of {}",
        d.id
    );
    let comps = &d.coders[wv_id].component_coder_ids;
    assert_eq!(comps.len(), 2, "windowed_value components of {wv_id}");
    let in_descriptor = d
        .pcollections
        .get(&pc.id)
        .unwrap_or_else(|| panic!("{} lacks PCollection {}", d.id, pc.id));
    match side {
        PortSide::Source => assert_eq!(
            comps[0], in_descriptor.coder_id,
            "source port value coder vs PCollection {} coder in {}",
            pc.id, d.id
        ),
        PortSide::Sink => assert_eq!(
            model(&d.coders, &comps[0]),
            wire_model(&model(&d.coders, &in_descriptor.coder_id)),
            "sink port value coder vs the wire form of PCollection {} coder in {}",
            pc.id,
            d.id
        ),
    }
    let ws = d
        .windowing_strategies
        .get(&in_descriptor.windowing_strategy_id)
        .unwrap_or_else(|| {
            panic!(
                "{} lacks windowing strategy {}",
                d.id, in_descriptor.windowing_strategy_id
            )
        });
    assert_eq!(
        comps[1], ws.window_coder_id,
        "port window coder of {}",
        pc.id
    );
    assert_eq!(
        model(&d.coders, &comps[0]),
        pc.value_coder,
        "engine value coder of {}",
        pc.id
    );
    assert_eq!(
        model(&d.coders, &comps[1]),
        pc.window_coder,
        "engine window coder of {}",
        pc.id
    );
    check_measurable(&d.coders, wv_id, &d.id);
}

/// What must hold of every plan, whatever the pipeline.
fn check_invariants(p: &Plan) {
    let g = &p.graph;
    let mut producer: HashMap<usize, usize> = HashMap::new();
    for (i, s) in g.stages.iter().enumerate() {
        assert_eq!(
            s.id,
            format!("stage-{i}"),
            "stage ids follow their position"
        );
        let mut needed = s.main_inputs();
        if let StageKind::Sdk(sdk) = &s.kind {
            needed.extend(sdk.side_inputs.iter().map(|si| si.pcollection));
        }
        for pc in needed {
            let by = producer.get(&pc).unwrap_or_else(|| {
                panic!(
                    "stage {i} ({}) reads {} before it is produced",
                    s.name, g.pcollections[pc].id
                )
            });
            assert!(*by < i);
        }
        for pc in s.outputs() {
            assert!(pc < g.pcollections.len());
            if let Some(prev) = producer.insert(pc, i) {
                panic!(
                    "PCollection {} produced by stages {prev} and {i}",
                    g.pcollections[pc].id
                );
            }
        }
        if let StageKind::Flatten { inputs, output } = &s.kind {
            for &i in inputs {
                assert_eq!(
                    g.pcollections[i].value_coder, g.pcollections[*output].value_coder,
                    "Flatten input {} must share the output coder",
                    g.pcollections[i].id
                );
            }
        }
        if let StageKind::GroupByKey { input, .. } = &s.kind {
            assert!(
                matches!(g.pcollections[*input].value_coder, Coder::Kv(..)),
                "GroupByKey input {} is not KV",
                g.pcollections[*input].id
            );
        }
    }
    let sdk_stages: BTreeSet<&str> = g
        .stages
        .iter()
        .filter(|s| {
            matches!(
                s.kind,
                StageKind::Sdk(_)
                    | StageKind::GroupByKey {
                        merge_windows: Some(_),
                        ..
                    }
            )
        })
        .map(|s| s.id.as_str())
        .chain(g.stages.iter().filter_map(|s| match &s.kind {
            StageKind::Sdk(sdk) => sdk.drain_descriptor_id.as_deref(),
            _ => None,
        }))
        .collect();
    assert_eq!(
        p.descriptors
            .keys()
            .map(|k| k.as_str())
            .collect::<BTreeSet<_>>(),
        sdk_stages,
        "one descriptor per SDK stage, SDF drain variant and GroupByKey merge stage"
    );

    for (i, s) in g.stages.iter().enumerate() {
        let StageKind::Sdk(sdk) = &s.kind else {
            continue;
        };
        let d = descriptor(p, i);
        assert_eq!(d.id, s.id);
        assert_eq!(
            d.state_api_service_descriptor
                .as_ref()
                .map(|a| a.url.as_str()),
            Some(FN_API_URL)
        );
        assert!(
            p.environments.contains_key(&sdk.environment_id),
            "environment {} of {}",
            sdk.environment_id,
            s.id
        );

        // Exactly one source, the stage's input transform, producing the stage input.
        let sources: Vec<&String> = d
            .transforms
            .iter()
            .filter(|(_, t)| urn_of(t) == SOURCE)
            .map(|(id, _)| id)
            .collect();
        assert_eq!(
            sources,
            vec![&sdk.input_transform_id],
            "sources of {}",
            s.id
        );
        let source = &d.transforms[&sdk.input_transform_id];
        assert_eq!(
            source.outputs.values().collect::<Vec<_>>(),
            vec![pc_id(p, sdk.input)]
        );
        let wv = port_coder(d, &sdk.input_transform_id, SOURCE);
        check_port(p, d, &wv, sdk.input, PortSide::Source);

        // One sink per output, in order.
        let sinks = d.transforms.values().filter(|t| urn_of(t) == SINK).count();
        assert_eq!(sinks, sdk.outputs.len(), "sinks of {}", s.id);
        assert_eq!(sdk.output_transform_ids.len(), sdk.outputs.len());
        for (sink_id, &pc) in sdk.output_transform_ids.iter().zip(&sdk.outputs) {
            let sink = &d.transforms[sink_id];
            assert_eq!(
                sink.inputs.values().collect::<Vec<_>>(),
                vec![pc_id(p, pc)],
                "sink {sink_id}"
            );
            let wv = port_coder(d, sink_id, SINK);
            check_port(p, d, &wv, pc, PortSide::Sink);
        }

        // The residual transforms read the stage's input.
        assert!(
            !sdk.residual_transform_ids.is_empty(),
            "{} has no transform reading its input",
            s.id
        );
        for r in &sdk.residual_transform_ids {
            let t = d
                .transforms
                .get(r)
                .unwrap_or_else(|| panic!("residual transform {r} not in {}", s.id));
            assert!(
                t.inputs.values().any(|pc| pc == pc_id(p, sdk.input)),
                "residual transform {r} does not read the input"
            );
        }

        // Side inputs are read by a transform of the stage, under that local name.
        for si in &sdk.side_inputs {
            let t = d.transforms.get(&si.transform_id).unwrap_or_else(|| {
                panic!("side input consumer {} not in {}", si.transform_id, s.id)
            });
            assert_eq!(
                t.inputs.get(&si.local_name).map(|s| s.as_str()),
                Some(pc_id(p, si.pcollection))
            );
        }

        // The descriptor is self-contained.
        for (tid, t) in &d.transforms {
            for pc in t.inputs.values().chain(t.outputs.values()) {
                let info = d.pcollections.get(pc).unwrap_or_else(|| {
                    panic!("{}: transform {tid} uses unknown PCollection {pc}", s.id)
                });
                model(&d.coders, &info.coder_id);
                let ws = d
                    .windowing_strategies
                    .get(&info.windowing_strategy_id)
                    .unwrap_or_else(|| panic!("{}: unknown windowing strategy", s.id));
                model(&d.coders, &ws.window_coder_id);
            }
            if urn_of(t) != SOURCE && urn_of(t) != SINK {
                assert_eq!(t.environment_id, sdk.environment_id, "environment of {tid}");
            }
        }
    }
}

fn unsupported(e: &PlanError) -> (&str, &str, &str) {
    match e {
        PlanError::Unsupported {
            transform,
            urn,
            feature,
        } => (transform, urn, feature),
        other => panic!("expected PlanError::Unsupported, got {other:?}"),
    }
}

fn transform_urns(d: &beam::ProcessBundleDescriptor) -> Vec<String> {
    let mut v: Vec<String> = d
        .transforms
        .values()
        .map(|t| urn_of(t).to_string())
        .collect();
    v.sort();
    v
}

/// The stages a Python `beam.Create(...)` of several elements becomes, given
/// the label: impulse, the fused FlatMap/reshuffle head, the reshuffle's
/// GroupByKey and the fused reshuffle tail with `Map(decode)`.
fn create_stage_names(label: &str) -> [String; 4] {
    [
        format!("{label}/Impulse"),
        format!("{label}/FlatMap(<lambda at core.py:4094>)"),
        // Python's Reshuffle composite runs as Weir's own Reshuffle.
        format!("{label}/MaybeReshuffle/Reshuffle"),
        format!("{label}/Map(decode)"),
    ]
}

// -------------------------------------------------------------------- tests

#[test]
fn wordcount_stages() {
    let p = plan_fixture("wordcount");
    assert_eq!(
        kinds(&p),
        [
            "Impulse",
            "Sdk",
            "Sdk",
            "GroupByKey",
            "Sdk",
            "Impulse",
            "Sdk",
            "Sdk",
            "GroupByKey",
            "Sdk",
            "Sdk",
            "Sdk"
        ]
    );
    let sdf = "Read/Read/SDFBoundedSourceReader/ParDo(SDFBoundedSourceDoFn)";
    assert_eq!(
        names(&p),
        [
            "Read/Read/Impulse".to_string(),
            format!("Read/Read/EmitSource+{sdf}/PairWithRestriction+{sdf}/SplitAndSizeRestriction"),
            format!("{sdf}/Process+Split+PairWithOne+GroupAndSum/Precombine"),
            "GroupAndSum/Group".to_string(),
            "GroupAndSum/Merge+GroupAndSum/ExtractOutputs+Format+Write/Write/WriteImpl/WindowInto(WindowIntoFn)".to_string(),
            "Write/Write/WriteImpl/DoOnce/Impulse".to_string(),
            "Write/Write/WriteImpl/DoOnce/FlatMap(<lambda at core.py:4094>)+Write/Write/WriteImpl/DoOnce/Map(decode)+Write/Write/WriteImpl/InitializeWrite".to_string(),
            "Write/Write/WriteImpl/WriteBundles+Write/Write/WriteImpl/Pair".to_string(),
            "Write/Write/WriteImpl/GroupByKey".to_string(),
            "Write/Write/WriteImpl/Extract".to_string(),
            "Write/Write/WriteImpl/PreFinalize".to_string(),
            "Write/Write/WriteImpl/FinalizeWrite".to_string(),
        ]
    );

    // Impulse feeds the SDF head stage; its element coder is plain bytes.
    let StageKind::Impulse { output } = p.graph.stages[0].kind else {
        unreachable!()
    };
    assert_eq!(p.graph.pcollections[output].value_coder, Coder::Bytes);
    assert_eq!(sdk(&p, 1).input, output);

    // SDF head: the read's EmitSource with the pair and split steps.
    let d1 = descriptor(&p, 1);
    assert_eq!(
        transform_urns(d1),
        [
            "beam:runner:sink:v1",
            "beam:runner:source:v1",
            "beam:transform:pardo:v1",
            "beam:transform:sdf_pair_with_restriction:v1",
            "beam:transform:sdf_split_and_size_restrictions:v1",
        ]
    );
    let sdf_id =
        "ref_AppliedPTransform_Read-Read-SDFBoundedSourceReader-ParDo-SDFBoundedSourceDoFn-_7";
    let sized = format!("{sdf_id}/weir:sized");
    assert_eq!(
        sdk(&p, 1)
            .outputs
            .iter()
            .map(|&i| pc_id(&p, i))
            .collect::<Vec<_>>(),
        [sized.as_str()]
    );
    assert_eq!(
        d1.transforms[&format!("{sdf_id}/weir:sdf-split")]
            .outputs
            .values()
            .collect::<Vec<_>>(),
        [&sized]
    );

    // SDF process: a new stage reading the sized restrictions, fused with Split, PairWithOne and the precombine.
    let s2 = sdk(&p, 2);
    assert_eq!(pc_id(&p, s2.input), sized);
    assert_eq!(
        s2.residual_transform_ids,
        [format!("{sdf_id}/weir:sdf-process")]
    );
    assert_eq!(
        transform_urns(descriptor(&p, 2)),
        [
            "beam:runner:sink:v1",
            "beam:runner:source:v1",
            "beam:transform:combine_per_key_precombine:v1",
            "beam:transform:pardo:v1",
            "beam:transform:pardo:v1",
            "beam:transform:sdf_process_sized_element_and_restrictions:v1",
        ]
    );
    // KV<KV<element, restriction>, double>, with every pickled coder length-prefixed.
    match &p.graph.pcollections[s2.input].value_coder {
        Coder::Kv(paired, size) => {
            assert_eq!(**size, Coder::Double);
            match paired.as_ref() {
                Coder::Kv(element, restriction) => {
                    assert!(is_lp_pickled(element), "element coder {element:?}");
                    assert!(
                        matches!(restriction.as_ref(), Coder::Kv(a, b) if is_lp_pickled(a) && is_lp_pickled(b)),
                        "restriction coder {restriction:?}"
                    );
                }
                other => panic!("paired coder {other:?}"),
            }
        }
        other => panic!("sized coder {other:?}"),
    }

    // The combiner's GroupByKey between the precombine and the merge. Weir
    // lifts the `combine_per_key` composite itself (not the SDK's lifted
    // subtransforms), under the composite's names.
    let combine = "ref_AppliedPTransform_GroupAndSum_10";
    let StageKind::GroupByKey { input, output, .. } = p.graph.stages[3].kind else {
        unreachable!()
    };
    assert_eq!(s2.outputs, [input]);
    assert_eq!(
        pc_id(&p, input),
        format!("{combine}/weir:lifted-precombined")
    );
    assert_eq!(pc_id(&p, output), format!("{combine}/weir:lifted-grouped"));
    let d2 = descriptor(&p, 2);
    let pre = &d2.transforms[&format!("{combine}/weir:lifted-Precombine")];
    assert_eq!(pre.unique_name, "GroupAndSum/Precombine");
    assert_eq!(
        pre.inputs.values().collect::<Vec<_>>(),
        ["ref_PCollection_PCollection_5"]
    );
    let d4 = descriptor(&p, 4);
    assert_eq!(
        sdk(&p, 4).residual_transform_ids,
        [format!("{combine}/weir:lifted-Merge")]
    );
    assert_eq!(
        urn_of(&d4.transforms[&format!("{combine}/weir:lifted-Merge")]),
        "beam:transform:combine_per_key_merge_accumulators:v1"
    );
    assert_eq!(
        urn_of(&d4.transforms[&format!("{combine}/weir:lifted-ExtractOutputs")]),
        "beam:transform:combine_per_key_extract_outputs:v1"
    );
    // The grouping key is Python's deterministic key coder: bare in the
    // descriptor's PCollection, length-prefixed on the sink's port.
    let precombined = format!("{combine}/weir:lifted-precombined");
    let kv = &d2.coders[&d2.pcollections[&precombined].coder_id];
    let key = &d2.coders[&kv.component_coder_ids[0]];
    assert!(String::from_utf8_lossy(&key.spec.as_ref().unwrap().payload)
        .contains("DeterministicFastPrimitivesCoder"));
    match sink_value_coder(&p, 2, &precombined) {
        Coder::Kv(k, _) => assert_eq!(
            *k,
            Coder::LengthPrefix(Box::new(model(&d2.coders, &kv.component_coder_ids[0])))
        ),
        other => panic!("precombined sink coder {other:?}"),
    }
    let gbk_in = &p.graph.pcollections[input];
    assert!(
        matches!(&gbk_in.value_coder, Coder::Kv(k, v) if is_lp_pickled(k) && is_lp_pickled(v)),
        "{:?}",
        gbk_in.value_coder
    );
    assert!(
        matches!(&p.graph.pcollections[output].value_coder, Coder::Kv(k, v) if is_lp_pickled(k) && matches!(v.as_ref(), Coder::Iterable(e) if is_lp_pickled(e)))
    );
    assert_eq!(gbk_in.window_coder, Coder::GlobalWindow);
    assert_eq!(gbk_in.windowing.window_fn, WindowFn::Global);
    assert_eq!(gbk_in.windowing.output_time, OutputTime::EndOfWindow);
    assert_eq!(sdk(&p, 4).input, output);

    // DoOnce writes two PCollections read by later stages: the main input of
    // PreFinalize/FinalizeWrite and the InitializeWrite side input.
    let s6 = sdk(&p, 6);
    let outs: Vec<&str> = s6.outputs.iter().map(|&i| pc_id(&p, i)).collect();
    assert_eq!(
        outs,
        [
            "ref_PCollection_PCollection_11",
            "ref_PCollection_PCollection_12"
        ]
    );
    assert_eq!(
        pc_id(&p, sdk(&p, 10).input),
        "ref_PCollection_PCollection_11"
    );
    assert_eq!(
        pc_id(&p, sdk(&p, 11).input),
        "ref_PCollection_PCollection_11"
    );
    assert_eq!(
        pc_id(&p, sdk(&p, 7).input),
        "ref_PCollection_PCollection_13"
    );
    assert_eq!(
        sdk(&p, 4)
            .outputs
            .iter()
            .map(|&i| pc_id(&p, i))
            .collect::<Vec<_>>(),
        ["ref_PCollection_PCollection_13"]
    );
    assert!(
        sdk(&p, 11).outputs.is_empty(),
        "FinalizeWrite's output is consumed by nobody"
    );

    // Side inputs of the write: all iterable.
    let sides = |stage: usize| -> Vec<(String, String, String, SideInputKind)> {
        sdk(&p, stage)
            .side_inputs
            .iter()
            .map(|si| {
                (
                    si.transform_id.clone(),
                    si.local_name.clone(),
                    pc_id(&p, si.pcollection).to_string(),
                    si.kind,
                )
            })
            .collect()
    };
    let t = |s: &str| s.to_string();
    assert_eq!(
        sides(7),
        [(
            t("ref_AppliedPTransform_Write-Write-WriteImpl-WriteBundles_25"),
            t("python_side_input0"),
            t("ref_PCollection_PCollection_12"),
            SideInputKind::Iterable
        )]
    );
    let pre = "ref_AppliedPTransform_Write-Write-WriteImpl-PreFinalize_29";
    assert_eq!(
        sides(10),
        [
            (
                t(pre),
                t("python_side_input0"),
                t("ref_PCollection_PCollection_12"),
                SideInputKind::Iterable
            ),
            (
                t(pre),
                t("python_side_input1"),
                t("ref_PCollection_PCollection_17"),
                SideInputKind::Iterable
            ),
        ]
    );
    let fin = "ref_AppliedPTransform_Write-Write-WriteImpl-FinalizeWrite_30";
    assert_eq!(
        sides(11),
        [
            (
                t(fin),
                t("python_side_input0"),
                t("ref_PCollection_PCollection_12"),
                SideInputKind::Iterable
            ),
            (
                t(fin),
                t("python_side_input1"),
                t("ref_PCollection_PCollection_17"),
                SideInputKind::Iterable
            ),
            (
                t(fin),
                t("python_side_input2"),
                t("ref_PCollection_PCollection_18"),
                SideInputKind::Iterable
            ),
        ]
    );
    for (stage, sides) in [(0usize, 0usize), (1, 0), (2, 0), (4, 0), (6, 0), (9, 0)] {
        if let StageKind::Sdk(s) = &p.graph.stages[stage].kind {
            assert_eq!(s.side_inputs.len(), sides, "side inputs of stage {stage}");
        }
    }

    // One environment: the LOOPBACK (external) one.
    assert_eq!(p.environments.keys().collect::<Vec<_>>(), [ENV_ID]);
    assert_eq!(p.environments[ENV_ID].urn, "beam:env:external:v1");
}

#[test]
fn wordcount_ports_length_prefix_pickled_coders() {
    let p = plan_fixture("wordcount");
    let original = load("wordcount").components.unwrap();
    // check_invariants already walked every port coder; here: the walk is not
    // vacuous, pickled coders do reach the data plane, always length-prefixed.
    let mut prefixed = 0;
    for (i, s) in p.graph.stages.iter().enumerate() {
        let StageKind::Sdk(sdk) = &s.kind else {
            continue;
        };
        let d = descriptor(&p, i);
        let mut ports = vec![port_coder(d, &sdk.input_transform_id, SOURCE)];
        ports.extend(
            sdk.output_transform_ids
                .iter()
                .map(|id| port_coder(d, id, SINK)),
        );
        for wv in ports {
            prefixed += check_measurable(&d.coders, &wv, &d.id);
        }
        // Inside the descriptor only the main input and the side inputs are
        // declared in their wire coders; every other PCollection keeps the
        // pipeline's own coder (an SDK reads it, e.g. Java's SchemaCoder).
        let wire: Vec<&str> = std::iter::once(sdk.input)
            .chain(sdk.side_inputs.iter().map(|si| si.pcollection))
            .map(|i| p.graph.pcollections[i].id.as_str())
            .collect();
        for (id, pc) in &d.pcollections {
            if wire.contains(&id.as_str()) {
                check_measurable(&d.coders, &pc.coder_id, id);
            } else if let Some(declared) = original.pcollections.get(id) {
                // (PCollections Weir adds, e.g. a lifted combine's, are not in the pipeline.)
                assert_eq!(
                    pc.coder_id, declared.coder_id,
                    "{}: PCollection {id} must keep the pipeline's coder",
                    d.id
                );
            }
        }
    }
    assert!(
        prefixed >= 10,
        "only {prefixed} length prefixes on wordcount's ports"
    );
    // The pipeline's own coder for the PairWithOne output is KV<pickled, varint>
    // with a bare pickled key; inside stage 2 (PairWithOne -> the lifted
    // Precombine) the descriptor keeps it as it is.
    let d = descriptor(&p, 2);
    let pc = &d.pcollections["ref_PCollection_PCollection_5"];
    assert_eq!(
        pc.coder_id, original.pcollections["ref_PCollection_PCollection_5"].coder_id,
        "the descriptor keeps the pipeline's coder of a PCollection inside the stage"
    );
    match model(&d.coders, &pc.coder_id) {
        Coder::Kv(k, v) => {
            assert!(is_pickled(&k), "key coder {k:?}");
            assert_eq!(*v, Coder::VarInt);
        }
        other => panic!("PairWithOne output coder {other:?}"),
    }
}

#[test]
fn wordcount_plans_deterministically() {
    let pipeline = load("wordcount");
    let a = plan_ok(&pipeline);
    let b = plan_ok(&pipeline);
    assert_eq!(format!("{:?}", a.graph), format!("{:?}", b.graph));
    for (id, d) in &a.descriptors {
        let mut x = d.transforms.keys().collect::<Vec<_>>();
        let mut y = b.descriptors[id].transforms.keys().collect::<Vec<_>>();
        x.sort();
        y.sort();
        assert_eq!(x, y, "transforms of {id}");
    }
}

#[test]
fn side_input_iterable() {
    let p = plan_fixture("side_input");
    assert_eq!(
        kinds(&p),
        [
            "Impulse",
            "Sdk",
            "Reshuffle",
            "Sdk",
            "Impulse",
            "Sdk",
            "Reshuffle",
            "Sdk",
            "Sdk"
        ]
    );
    let mut expected: Vec<String> = create_stage_names("CreateSide").into();
    expected.extend(create_stage_names("CreateMain"));
    expected.push("AddSum".into());
    assert_eq!(names(&p), expected);

    let add = sdk(&p, 8);
    assert_eq!(
        add.input,
        sdk(&p, 7).outputs[0],
        "AddSum reads CreateMain's output"
    );
    assert_eq!(add.side_inputs.len(), 1);
    let si = &add.side_inputs[0];
    assert_eq!(si.transform_id, "ref_AppliedPTransform_AddSum_26");
    assert_eq!(si.local_name, "python_side_input0");
    assert_eq!(si.kind, SideInputKind::Iterable);
    assert_eq!(
        sdk(&p, 3).outputs,
        [si.pcollection],
        "the side input is CreateSide's output"
    );
    let side_pc = &p.graph.pcollections[si.pcollection];
    assert_eq!(side_pc.id, "ref_PCollection_PCollection_8");
    assert_eq!(side_pc.value_coder, Coder::VarInt);
    assert_eq!(side_pc.window_coder, Coder::GlobalWindow);
    assert_eq!(p.graph.pcollections[add.input].value_coder, Coder::VarInt);
    // The consuming ParDo sees the side input PCollection in its descriptor.
    let d = descriptor(&p, 8);
    assert_eq!(
        model(
            &d.coders,
            &d.pcollections["ref_PCollection_PCollection_8"].coder_id
        ),
        Coder::VarInt
    );
    assert!(add.outputs.is_empty());
}

#[test]
fn side_input_multimap() {
    let p = plan_fixture("multimap_side_input");
    assert_eq!(
        kinds(&p),
        [
            "Impulse",
            "Sdk",
            "Reshuffle",
            "Sdk",
            "Impulse",
            "Sdk",
            "Reshuffle",
            "Sdk",
            "Sdk"
        ]
    );
    assert_eq!(p.graph.stages[8].name, "Lookup");
    let lookup = sdk(&p, 8);
    assert_eq!(lookup.side_inputs.len(), 1);
    let si = &lookup.side_inputs[0];
    assert_eq!(si.transform_id, "ref_AppliedPTransform_Lookup_26");
    assert_eq!(si.local_name, "python_side_input0");
    assert_eq!(si.kind, SideInputKind::Multimap);
    assert_eq!(sdk(&p, 3).outputs, [si.pcollection]);
    assert_eq!(
        p.graph.pcollections[si.pcollection].value_coder,
        kv(Coder::StringUtf8, Coder::VarInt)
    );
    assert_eq!(
        p.graph.pcollections[lookup.input].value_coder,
        Coder::StringUtf8
    );
}

#[test]
fn flatten_mixed_coders_transcodes_both_inputs() {
    let p = plan_fixture("flatten_mixed_coders");
    assert_eq!(
        kinds(&p),
        [
            "Impulse",
            "Sdk",
            "Reshuffle",
            "Sdk",
            "Impulse",
            "Sdk",
            "Reshuffle",
            "Sdk",
            "Flatten",
            "Sdk"
        ]
    );
    let [_, _, _, kvs_tail] = create_stage_names("CreateKVs");
    let [_, _, _, strs_tail] = create_stage_names("CreateStrs");
    assert_eq!(
        p.graph.stages[3].name,
        format!("{kvs_tail}+Flatten/Transcode0")
    );
    assert_eq!(
        p.graph.stages[7].name,
        format!("{strs_tail}+Flatten/Transcode1")
    );
    assert_eq!(p.graph.stages[9].name, "Show");

    let flatten = "ref_AppliedPTransform_Flatten_26";
    let StageKind::Flatten { inputs, output } = &p.graph.stages[8].kind else {
        unreachable!()
    };
    let ids: Vec<&str> = inputs.iter().map(|&i| pc_id(&p, i)).collect();
    assert_eq!(
        ids,
        [
            format!("{flatten}{TRANSCODE_MARKER}0"),
            format!("{flatten}{TRANSCODE_MARKER}1")
        ]
    );
    assert_eq!(pc_id(&p, *output), "ref_PCollection_PCollection_17");
    let out_coder = &p.graph.pcollections[*output].value_coder;
    assert!(
        is_lp_pickled(out_coder),
        "Flatten output coder {out_coder:?}"
    );
    assert_eq!(sdk(&p, 9).input, *output);

    // Each transcoder is an SDK flatten fused into its producer's stage:
    // KV<str, int> -> pickled, and str -> pickled.
    for (stage, n, from) in [
        (3usize, 0, kv(Coder::StringUtf8, Coder::VarInt)),
        (7, 1, Coder::StringUtf8),
    ] {
        let d = descriptor(&p, stage);
        let tid = format!("{flatten}{TRANSCODE_MARKER}{n}");
        let t = d
            .transforms
            .get(&tid)
            .unwrap_or_else(|| panic!("stage {stage} lacks transcoder {tid}"));
        assert_eq!(urn_of(t), FLATTEN);
        assert_eq!(t.unique_name, format!("Flatten/Transcode{n}"));
        assert_eq!(t.environment_id, ENV_ID);
        let input = t.inputs.values().next().unwrap();
        let out = t.outputs.values().next().unwrap();
        assert_eq!(out, &tid, "transcoder output PCollection");
        assert_eq!(
            model(&d.coders, &d.pcollections[input].coder_id),
            from,
            "transcoder {n} input coder"
        );
        // The pipeline's (pickled) coder in the descriptor, prefixed on the port.
        assert!(is_pickled(&model(&d.coders, &d.pcollections[out].coder_id)));
        assert!(is_lp_pickled(&sink_value_coder(&p, stage, out)));
        assert_eq!(
            sdk(&p, stage).outputs,
            [inputs[n]],
            "stage {stage} writes only the transcoded PCollection"
        );
    }
    // No other stage holds a transcoder.
    for (id, d) in &p.descriptors {
        let n = d
            .transforms
            .iter()
            .filter(|(k, t)| k.contains(TRANSCODE_MARKER) && urn_of(t) == FLATTEN)
            .count();
        let expected = usize::from(id == "stage-3" || id == "stage-7");
        assert_eq!(n, expected, "transcoders in {id}");
    }
}

#[test]
fn flatten_then_gbk_transcodes_flatten_inputs() {
    let p = plan_fixture("flatten_then_gbk");
    assert_eq!(
        kinds(&p),
        [
            "Impulse",
            "Sdk",
            "Reshuffle",
            "Sdk",
            "Impulse",
            "Sdk",
            "Reshuffle",
            "Sdk",
            "Flatten",
            "GroupByKey",
            "Sdk"
        ]
    );
    let [_, _, _, one_tail] = create_stage_names("CreateOne");
    let [_, _, _, two_tail] = create_stage_names("CreateTwo");
    assert_eq!(
        p.graph.stages[3].name,
        format!("{one_tail}+Flatten/Transcode0")
    );
    assert_eq!(
        p.graph.stages[7].name,
        format!("{two_tail}+Untyped+Flatten/Transcode1")
    );
    assert_eq!(p.graph.stages[9].name, "Group");
    assert_eq!(p.graph.stages[10].name, "Sum");

    let pickled_kv =
        |c: &Coder| matches!(c, Coder::Kv(k, v) if is_lp_pickled(k) && is_lp_pickled(v));
    let StageKind::Flatten { inputs, output } = &p.graph.stages[8].kind else {
        unreachable!()
    };
    let flatten = "ref_AppliedPTransform_Flatten_27";
    let ids: Vec<&str> = inputs.iter().map(|&i| pc_id(&p, i)).collect();
    assert_eq!(
        ids,
        [
            format!("{flatten}{TRANSCODE_MARKER}0"),
            format!("{flatten}{TRANSCODE_MARKER}1")
        ]
    );
    assert!(pickled_kv(&p.graph.pcollections[*output].value_coder));
    let StageKind::GroupByKey {
        input,
        output: grouped,
        ..
    } = p.graph.stages[9].kind
    else {
        unreachable!()
    };
    assert_eq!(
        input, *output,
        "the GroupByKey reads the Flatten output directly (it is KV-coded)"
    );
    assert!(
        matches!(&p.graph.pcollections[grouped].value_coder, Coder::Kv(k, v) if is_lp_pickled(k) && matches!(v.as_ref(), Coder::Iterable(e) if is_lp_pickled(e)))
    );

    // Transcoder 0: KV<str, int> -> KV<pickled, pickled>; transcoder 1: pickled (Untyped) -> KV<pickled, pickled>.
    for (stage, n, from_is) in [(3usize, 0, "kv"), (7, 1, "pickled")] {
        let d = descriptor(&p, stage);
        let t = &d.transforms[&format!("{flatten}{TRANSCODE_MARKER}{n}")];
        let from = model(
            &d.coders,
            &d.pcollections[t.inputs.values().next().unwrap()].coder_id,
        );
        match from_is {
            "kv" => assert_eq!(from, kv(Coder::StringUtf8, Coder::VarInt)),
            _ => assert!(is_pickled(&from), "{from:?}"),
        }
        // KV<pickled, pickled>: bare in the descriptor, prefixed on the port.
        let out = t.outputs.values().next().unwrap();
        assert!(matches!(
            model(&d.coders, &d.pcollections[out].coder_id),
            Coder::Kv(k, v) if is_pickled(&k) && is_pickled(&v)
        ));
        assert!(pickled_kv(&sink_value_coder(&p, stage, out)));
    }
}

/// The Python SDK always gives a GroupByKey a KV-coded input; other SDKs (and
/// older Pythons) may not. Recode the Flatten output as the bare pickled
/// coder and the planner must re-encode the GroupByKey input as KV.
#[test]
fn gbk_with_non_kv_input_gets_a_transcoder() {
    let mut pipeline = load("flatten_then_gbk");
    let c = pipeline.components.as_mut().unwrap();
    let flatten = "ref_AppliedPTransform_Flatten_27";
    let group = "ref_AppliedPTransform_Group_28";
    assert_eq!(c.transforms[group].unique_name, "Group");
    let untyped_out = c
        .transforms
        .values()
        .find(|t| t.unique_name == "Untyped")
        .unwrap()
        .outputs
        .values()
        .next()
        .unwrap()
        .clone();
    let pickled = c.pcollections[&untyped_out].coder_id.clone();
    assert_eq!(c.coders[&pickled].spec.as_ref().unwrap().urn, PICKLED);
    let flatten_out = c.transforms[flatten]
        .outputs
        .values()
        .next()
        .unwrap()
        .clone();
    c.pcollections.get_mut(&flatten_out).unwrap().coder_id = pickled;

    let p = plan_ok(&pipeline);
    assert_eq!(
        kinds(&p),
        [
            "Impulse",
            "Sdk",
            "Reshuffle",
            "Sdk",
            "Impulse",
            "Sdk",
            "Reshuffle",
            "Sdk",
            "Flatten",
            "Sdk",
            "GroupByKey",
            "Sdk"
        ]
    );
    // Only CreateOne's branch (KV<str, int>) differs from the pickled Flatten output now.
    let StageKind::Flatten { inputs, output } = &p.graph.stages[8].kind else {
        unreachable!()
    };
    let ids: Vec<&str> = inputs.iter().map(|&i| pc_id(&p, i)).collect();
    assert_eq!(
        ids,
        [format!("{flatten}{TRANSCODE_MARKER}0"), untyped_out.clone()]
    );
    assert!(is_lp_pickled(&p.graph.pcollections[*output].value_coder));
    assert_eq!(
        p.graph.stages[7].name,
        format!("{}+Untyped", create_stage_names("CreateTwo")[3])
    );

    // The GroupByKey transcoder: its own stage reading the Flatten output.
    assert_eq!(p.graph.stages[9].name, "Group/Transcode0");
    let s9 = sdk(&p, 9);
    assert_eq!(s9.input, *output);
    let tid = format!("{group}{TRANSCODE_MARKER}0");
    assert_eq!(s9.residual_transform_ids, [tid.clone()]);
    assert_eq!(s9.environment_id, ENV_ID);
    let d = descriptor(&p, 9);
    assert_eq!(urn_of(&d.transforms[&tid]), FLATTEN);
    let StageKind::GroupByKey { input, .. } = p.graph.stages[10].kind else {
        unreachable!()
    };
    assert_eq!(s9.outputs, [input]);
    assert_eq!(pc_id(&p, input), tid);
    assert!(
        matches!(&p.graph.pcollections[input].value_coder, Coder::Kv(k, v) if is_lp_pickled(k) && is_lp_pickled(v))
    );
}

#[test]
fn sessions_windowing_reaches_the_gbk() {
    let p = plan_fixture("sessions");
    assert_eq!(
        kinds(&p),
        ["Impulse", "Sdk", "Reshuffle", "Sdk", "GroupByKey", "Sdk"]
    );
    let [a, b, c, tail] = create_stage_names("Create");
    assert_eq!(
        names(&p),
        [
            a,
            b,
            c,
            format!("{tail}+Stamp+Window"),
            "Group".into(),
            "Count".into()
        ]
    );

    // Create's reshuffle runs in the global window.
    let StageKind::Reshuffle { input, .. } = p.graph.stages[2].kind else {
        unreachable!()
    };
    assert_eq!(
        p.graph.pcollections[input].windowing.window_fn,
        WindowFn::Global
    );

    let StageKind::GroupByKey { input, output, .. } = p.graph.stages[4].kind else {
        unreachable!()
    };
    assert_eq!(sdk(&p, 3).outputs, [input]);
    for pc in [input, output] {
        let info = &p.graph.pcollections[pc];
        assert_eq!(
            info.windowing.window_fn,
            WindowFn::Sessions { gap_ms: 10_000 },
            "{}",
            info.id
        );
        assert_eq!(info.windowing.output_time, OutputTime::EndOfWindow);
        assert_eq!(info.window_coder, Coder::IntervalWindow);
    }
    assert_eq!(pc_id(&p, input), "ref_PCollection_PCollection_10");
    assert_eq!(sdk(&p, 5).input, output);
    // The WindowInto runs in the SDK, in the stage before the GroupByKey.
    let d = descriptor(&p, 3);
    assert_eq!(
        urn_of(&d.transforms["ref_AppliedPTransform_Window_15"]),
        "beam:transform:window_into:v1"
    );
}

/// `@OnWindowExpiration` (Java; `ParDoPayload.on_window_expiration_timer_family_spec`)
/// must name a timer family of the DoFn: one that names none is refused,
/// naming the transform and the family. (A working one runs end to end in
/// tests/e2e/test_window_expiration.py.)
#[test]
fn on_window_expiration_must_name_a_timer_family_of_the_dofn() {
    let mut pipeline = load("stateful_dofn");
    let c = pipeline.components.as_mut().unwrap();
    let (id, t) = c
        .transforms
        .iter_mut()
        .find(|(_, t)| {
            t.spec.as_ref().is_some_and(|s| s.urn == PAR_DO)
                && beam::ParDoPayload::decode(t.spec.as_ref().unwrap().payload.as_slice())
                    .is_ok_and(|p| !p.state_specs.is_empty())
        })
        .expect("the stateful ParDo");
    let id = id.clone();
    let spec = t.spec.as_mut().unwrap();
    let mut payload = beam::ParDoPayload::decode(spec.payload.as_slice()).unwrap();
    payload.on_window_expiration_timer_family_spec = "no-such-family".into();
    spec.payload = payload.encode_to_vec();
    match plan_err(&pipeline) {
        PlanError::Invalid(message) => {
            assert!(
                message.contains(&id) && message.contains("no-such-family"),
                "{message}"
            );
        }
        other => panic!("expected Invalid, got {other:?}"),
    }
}

/// A custom merging WindowFn (a Python `WindowFn` with its own `merge`):
/// Prepare accepts it, and its GroupByKey carries a merge stage, registered
/// under the GroupByKey's stage id, that runs Beam's
/// `beam:transform:merge_windows:v1` on the pipeline's own WindowFn spec in
/// the WindowFn's environment, between a data source of
/// `KV<bytes, iterable<window>>` and a data sink of
/// `KV<bytes, KV<iterable<window>, iterable<KV<window, iterable<window>>>>>`,
/// both windowed in the global window.
#[test]
fn custom_merging_windowfn_gets_a_merge_windows_stage() {
    let pipeline = load("custom_merging");
    let p = plan_ok(&pipeline);
    let (index, merge) = p
        .graph
        .stages
        .iter()
        .enumerate()
        .find_map(|(i, s)| match &s.kind {
            StageKind::GroupByKey {
                input,
                merge_windows,
                ..
            } if s.name == "Group" => {
                assert_eq!(
                    p.graph.pcollections[*input].windowing.window_fn,
                    WindowFn::CustomMerging
                );
                Some((i, merge_windows.clone().expect("a merge stage")))
            }
            StageKind::GroupByKey { merge_windows, .. } => {
                assert!(merge_windows.is_none(), "{} merges no windows", s.name);
                None
            }
            _ => None,
        })
        .expect("the Group GroupByKey");
    assert_eq!(merge.environment_id, ENV_ID);
    assert!(merge.outputs.is_empty());
    assert_eq!(merge.output_transform_ids.len(), 1);
    let d = descriptor(&p, index);
    assert_eq!(d.transforms.len(), 3);
    let source = &d.transforms[&merge.input_transform_id];
    let sink = &d.transforms[&merge.output_transform_ids[0]];
    assert_eq!(urn_of(source), SOURCE);
    assert_eq!(urn_of(sink), SINK);
    let (merge_id, merge_t) = d
        .transforms
        .iter()
        .find(|(_, t)| urn_of(t) == "beam:transform:merge_windows:v1")
        .expect("a merge_windows transform");
    assert_eq!(merge_t.unique_name, "Group/MergeWindows");
    assert_eq!(merge_t.environment_id, ENV_ID);
    // Its payload is the WindowFn spec of the windowing strategy, with the
    // pickle unwrapped from Python's BytesValue (what Python's SDK harness
    // reads: see merge_windows.rs).
    let c = pipeline.components.as_ref().unwrap();
    let group = c
        .transforms
        .values()
        .find(|t| t.unique_name == "Group")
        .unwrap();
    let ws = &c.windowing_strategies
        [&c.pcollections[group.inputs.values().next().unwrap()].windowing_strategy_id];
    let original = ws.window_fn.as_ref().unwrap();
    let spec =
        beam::FunctionSpec::decode(merge_t.spec.as_ref().unwrap().payload.as_slice()).unwrap();
    assert_eq!(spec.urn, "beam:window_fn:pickled_python:v1");
    assert_eq!(original.urn, spec.urn);
    assert_eq!(original.payload[0], 0x0a, "BytesValue field 1");
    let pickle = Vec::<u8>::decode(original.payload.as_slice()).unwrap();
    assert!(
        pickle.starts_with(b"QlpoOTFBWSZTW"),
        "base64 of a bz2 stream"
    );
    assert_eq!(spec.payload, pickle);
    // Wiring: source -> merge_windows -> sink.
    let unmerged = &source.outputs["out"];
    let merged = &merge_t.outputs["output"];
    assert_eq!(&merge_t.inputs["input"], unmerged);
    assert_eq!(&sink.inputs["in"], merged, "sink of {merge_id}");
    // Coders: spell them out as URN trees.
    fn tree(coders: &HashMap<String, beam::Coder>, id: &str) -> String {
        let c = &coders[id];
        let urn = c
            .spec
            .as_ref()
            .unwrap()
            .urn
            .trim_start_matches("beam:coder:")
            .trim_end_matches(":v1");
        if c.component_coder_ids.is_empty() {
            urn.to_string()
        } else {
            let parts: Vec<String> = c
                .component_coder_ids
                .iter()
                .map(|x| tree(coders, x))
                .collect();
            format!("{urn}({})", parts.join(", "))
        }
    }
    let port = |t: &beam::PTransform| {
        beam::RemoteGrpcPort::decode(t.spec.as_ref().unwrap().payload.as_slice())
            .unwrap()
            .coder_id
    };
    assert_eq!(
        tree(&d.coders, &port(source)),
        "windowed_value(kv(bytes, iterable(interval_window)), global_window)"
    );
    assert_eq!(
        tree(&d.coders, &port(sink)),
        "windowed_value(kv(bytes, kv(iterable(interval_window), iterable(kv(interval_window, iterable(interval_window))))), global_window)"
    );
    assert_eq!(
        tree(&d.coders, &d.pcollections[unmerged].coder_id),
        "kv(bytes, iterable(interval_window))"
    );
    let strategy = &d.windowing_strategies[&d.pcollections[merged].windowing_strategy_id];
    assert_eq!(
        strategy.window_fn.as_ref().unwrap().urn,
        "beam:window_fn:global_windows:v1"
    );
    assert_eq!(tree(&d.coders, &strategy.window_coder_id), "global_window");
    assert!(p.environments.contains_key(ENV_ID));
}

/// A DoFn with a `BagStateSpec`. Weir rejected user state until stateful
/// processing landed; either way the answer must be precise: a rejection
/// names the stateful requirement or the state, and a plan runs the DoFn in a
/// stage of its own (its input is routed by key) flagged stateful.
#[test]
fn stateful_dofn_bag_state() {
    let pipeline = load("stateful_dofn");
    assert_eq!(
        pipeline.requirements,
        ["beam:requirement:pardo:stateful:v1"]
    );
    match plan(&pipeline, &options()) {
        Err(e) => {
            let (_, urn, feature) = unsupported(&e);
            assert_eq!(urn, "beam:requirement:pardo:stateful:v1");
            assert!(
                feature.contains("beam:requirement:pardo:stateful:v1"),
                "{feature}"
            );
            // Without the requirement, the DoFn's state spec is still caught.
            let mut stripped = pipeline.clone();
            stripped.requirements.clear();
            let e = plan_err(&stripped);
            let (transform, urn, feature) = unsupported(&e);
            assert_eq!(urn, PAR_DO);
            assert!(
                transform.contains("ref_AppliedPTransform_Buffer_14 (Buffer)"),
                "{transform}"
            );
            assert!(feature.contains("user state"), "{feature}");
        }
        Ok(p) => {
            check_invariants(&p);
            assert_eq!(kinds(&p), ["Impulse", "Sdk", "Reshuffle", "Sdk", "Sdk"]);
            let [a, b, c, d] = create_stage_names("Create");
            assert_eq!(names(&p), [a, b, c, d, "Buffer".to_string()]);
            let buffer = sdk(&p, 4);
            assert_eq!(buffer.input, sdk(&p, 3).outputs[0]);
            assert_eq!(
                p.graph.pcollections[buffer.input].value_coder,
                kv(Coder::StringUtf8, Coder::VarInt)
            );
            assert!(
                format!("{buffer:?}").contains("stateful: true"),
                "{buffer:?}"
            );
            assert!(format!("{:?}", sdk(&p, 3)).contains("stateful: false"));
            let t = &descriptor(&p, 4).transforms["ref_AppliedPTransform_Buffer_14"];
            let payload =
                beam::ParDoPayload::decode(t.spec.as_ref().unwrap().payload.as_slice()).unwrap();
            assert_eq!(payload.state_specs.keys().collect::<Vec<_>>(), ["buffer"]);
        }
    }
}

/// `OrderedListStateSpec` (`beam:user_state:ordered_list:v1`) is planned
/// like bag state: the DoFn runs in a stateful stage of its own, with its
/// state spec passed to the SDK unchanged.
#[test]
fn ordered_list_state_plans() {
    let p = plan(&load("ordered_list_state"), &options()).expect("ordered-list state plans");
    check_invariants(&p);
    assert_eq!(kinds(&p), ["Impulse", "Sdk", "Reshuffle", "Sdk", "Sdk"]);
    let ordered = sdk(&p, 4);
    assert!(
        format!("{ordered:?}").contains("stateful: true"),
        "{ordered:?}"
    );
    let t = &descriptor(&p, 4).transforms["ref_AppliedPTransform_Ordered_14"];
    let payload = beam::ParDoPayload::decode(t.spec.as_ref().unwrap().payload.as_slice()).unwrap();
    let spec = &payload.state_specs["events"];
    assert_eq!(
        spec.protocol.as_ref().map(|p| p.urn.as_str()),
        Some("beam:user_state:ordered_list:v1")
    );
}

#[test]
fn after_count_trigger_is_parsed_for_streaming() {
    let streaming = PlanOptions {
        streaming: true,
        ..options()
    };
    let p = plan(&load("after_count_trigger"), &streaming).expect("plans");
    assert!(p.graph.streaming);
    let gbk_input = p
        .graph
        .stages
        .iter()
        .find_map(|s| match s.kind {
            StageKind::GroupByKey { input, .. } if s.name == "Group" => Some(input),
            _ => None,
        })
        .expect("the GroupByKey Group");
    let w = &p.graph.pcollections[gbk_input].windowing;
    assert_eq!(w.trigger, Trigger::ElementCount(2));
    assert_eq!(w.accumulation, Accumulation::Discarding);
    assert_eq!(w.window_fn, WindowFn::Global);
}

#[test]
fn test_stream_events_and_trigger_tree() {
    // TestStream: ("a", 1)@1 s, watermark 10 s, +5 s processing time,
    // ("b", 2)@2 s, watermark +infinity (Beam's MAX_TIMESTAMP, in ms); then
    // FixedWindows(10 s) with
    // AfterWatermark(early=AfterCount(1), late=AfterCount(1)), accumulating,
    // allowed lateness 60 s.
    let p = plan_fixture("test_stream");
    assert!(p.graph.streaming, "a TestStream makes the job streaming");
    assert_eq!(kinds(&p), ["TestStream", "Sdk", "GroupByKey"]);
    let StageKind::TestStream { outputs, events } = &p.graph.stages[0].kind else {
        unreachable!()
    };
    assert_eq!(outputs.len(), 1);
    let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
    let summary: Vec<String> = events
        .iter()
        .map(|e| match e {
            TestStreamEvent::Elements { output, elements } => format!(
                "elements[{output}]:{}",
                elements
                    .iter()
                    .map(|(v, t)| format!("{}@{}", hex(v), t.millis()))
                    .collect::<Vec<_>>()
                    .join(",")
            ),
            TestStreamEvent::Watermark { output, to } => {
                format!("watermark[{output}]:{}", to.millis())
            }
            TestStreamEvent::ProcessingTime { advance_ms } => format!("processing:+{advance_ms}"),
        })
        .collect();
    assert_eq!(summary.len(), 5, "{summary:?}");
    // Values are Python-pickled tuples, length-prefixed on Weir's wire.
    assert!(
        summary[0].starts_with("elements[0]:07") && summary[0].ends_with("@1000"),
        "{summary:?}"
    );
    assert_eq!(summary[1], "watermark[0]:10000");
    assert_eq!(summary[2], "processing:+5000");
    assert!(summary[3].ends_with("@2000"), "{summary:?}");
    assert_eq!(
        summary[4],
        format!("watermark[0]:{}", weir_model::Timestamp::MAX.millis())
    );
    let StageKind::GroupByKey { input, .. } = p.graph.stages[2].kind else {
        unreachable!()
    };
    let w = &p.graph.pcollections[input].windowing;
    assert_eq!(
        w.trigger,
        Trigger::AfterEndOfWindow {
            early: Some(Box::new(Trigger::ElementCount(1))),
            late: Some(Box::new(Trigger::ElementCount(1))),
        }
    );
    assert_eq!(w.accumulation, Accumulation::Accumulating);
    assert_eq!(w.allowed_lateness_ms, 60_000);
    assert_eq!(w.window_fn, WindowFn::NonMerging);
}

#[test]
fn after_count_trigger_runs_with_batch_semantics() {
    // In batch the GroupByKey fires once per window with all its data.
    let p = plan_fixture("after_count_trigger");
    assert!(
        p.graph
            .stages
            .iter()
            .any(|s| matches!(s.kind, StageKind::GroupByKey { .. })),
        "{:?}",
        names(&p)
    );
}

#[test]
fn unknown_urn_is_rejected() {
    let e = plan_err(&load("unknown_urn"));
    let (transform, urn, feature) = unsupported(&e);
    assert_eq!(urn, "beam:transform:weir_test_unknown:v1");
    assert!(
        transform.contains("ref_AppliedPTransform_Split_8") && transform.contains("(Split)"),
        "{transform}"
    );
    assert!(feature.contains("unknown"), "{feature}");
    let message = e.to_string();
    assert!(
        message.contains("beam:transform:weir_test_unknown:v1") && message.contains("Split"),
        "{message}"
    );
}

#[test]
fn unknown_urn_fixture_differs_from_wordcount_only_in_that_urn() {
    // Guards the fixture itself: the rejection above is about the URN, nothing else.
    let a = load("wordcount").components.unwrap();
    let b = load("unknown_urn").components.unwrap();
    assert_eq!(a.transforms.len(), b.transforms.len());
    let changed: Vec<&String> = a
        .transforms
        .keys()
        .filter(|id| a.transforms[*id] != b.transforms[*id])
        .collect();
    assert_eq!(changed, ["ref_AppliedPTransform_Split_8"]);
    assert_eq!(
        urn_of(&a.transforms["ref_AppliedPTransform_Split_8"]),
        PAR_DO
    );
}

#[test]
fn drain_truncates_restrictions_before_processing() {
    // Wordcount's ReadFromText is a splittable DoFn: drained, its sized
    // restrictions pass through truncate-sized-restrictions first.
    let drained = PlanOptions {
        drain: true,
        ..options()
    };
    let p = plan(&load("wordcount"), &drained).expect("plans");
    let urns_in_order: Vec<String> = p
        .descriptors
        .values()
        .flat_map(|d| d.transforms.values())
        .filter_map(|t| t.spec.as_ref().map(|s| s.urn.clone()))
        .filter(|u| u.starts_with("beam:transform:sdf_"))
        .collect();
    assert!(
        urns_in_order.contains(&"beam:transform:sdf_truncate_sized_restrictions:v1".to_string()),
        "{urns_in_order:?}"
    );
    let truncate = "beam:transform:sdf_truncate_sized_restrictions:v1";
    let has_truncate =
        |d: &beam::ProcessBundleDescriptor| d.transforms.values().any(|t| urn_of(t) == truncate);
    // Drained from the start, no stage needs a separate drain variant.
    assert!(p
        .graph
        .stages
        .iter()
        .all(|s| !matches!(&s.kind, StageKind::Sdk(sdk) if sdk.drain_descriptor_id.is_some())));

    // Not drained: the stage's own descriptor has no truncation, but its
    // drain variant (for a drain later on) truncates the stage input before
    // the process transform, which then reads the truncated restrictions.
    let undrained = plan(&load("wordcount"), &options()).expect("plans");
    let (index, sdk) = undrained
        .graph
        .stages
        .iter()
        .enumerate()
        .find_map(|(i, s)| match &s.kind {
            StageKind::Sdk(sdk) if sdk.splittable => Some((i, sdk)),
            _ => None,
        })
        .expect("a splittable stage");
    let main = descriptor(&undrained, index);
    assert!(!has_truncate(main));
    let drain_id = sdk.drain_descriptor_id.as_ref().expect("a drain variant");
    assert_eq!(drain_id, &format!("{}/drain", main.id));
    let variant = &undrained.descriptors[drain_id];
    assert_eq!(&variant.id, drain_id);
    assert_eq!(variant.transforms.len(), main.transforms.len() + 1);
    let input = pc_id(&undrained, sdk.input);
    let (_, t) = variant
        .transforms
        .iter()
        .find(|(_, t)| urn_of(t) == truncate)
        .expect("truncate");
    assert!(
        t.unique_name.ends_with("/TruncateRestriction"),
        "{}",
        t.unique_name
    );
    assert!(t.inputs.values().any(|pc| pc == input));
    let truncated = t.outputs["out"].clone();
    let process = variant
        .transforms
        .values()
        .find(|t| urn_of(t) == "beam:transform:sdf_process_sized_element_and_restrictions:v1")
        .unwrap();
    assert!(process.inputs.values().any(|pc| *pc == truncated));
    assert!(!process.inputs.values().any(|pc| pc == input));
    assert_eq!(
        variant.pcollections[&truncated].coder_id,
        variant.pcollections[input].coder_id
    );
    // Source and sinks are the stage's own.
    for id in std::iter::once(&sdk.input_transform_id).chain(&sdk.output_transform_ids) {
        assert_eq!(variant.transforms[id], main.transforms[id]);
    }
}

/// A side input records its PCollection's WindowFn (for streaming
/// readiness): global as captured, and fixed or sliding with their sizes,
/// periods and offsets in milliseconds when the side windowing is changed.
#[test]
fn side_input_window_fn() {
    use weir_plan::SideWindowFn;
    let side_of = |p: &Plan| sdk(p, 8).side_inputs[0].window_fn;
    let pipeline = load("side_input");
    assert_eq!(side_of(&plan_ok(&pipeline)), SideWindowFn::Global);
    let duration = |ms: i64| weir_proto::prost_types::Duration {
        seconds: ms / 1000,
        nanos: (ms % 1000) as i32 * 1_000_000,
    };
    let at = |ms: i64| weir_proto::prost_types::Timestamp {
        seconds: ms / 1000,
        nanos: (ms % 1000) as i32 * 1_000_000,
    };
    let with_window_fn = |urn: &str, payload: Vec<u8>| {
        let mut p = pipeline.clone();
        let c = p.components.as_mut().expect("components");
        let side = c
            .pcollections
            .get_mut("ref_PCollection_PCollection_8")
            .expect("side PCollection");
        let mut ws = c.windowing_strategies[&side.windowing_strategy_id].clone();
        ws.window_fn = Some(beam::FunctionSpec {
            urn: urn.into(),
            payload,
        });
        c.windowing_strategies.insert("side_ws".into(), ws);
        side.windowing_strategy_id = "side_ws".into();
        plan_ok(&p)
    };
    let fixed = beam::FixedWindowsPayload {
        size: Some(duration(10_000)),
        offset: Some(at(3_500)),
    };
    assert_eq!(
        side_of(&with_window_fn(
            "beam:window_fn:fixed_windows:v1",
            fixed.encode_to_vec()
        )),
        SideWindowFn::Fixed {
            size_ms: 10_000,
            offset_ms: 3_500
        }
    );
    let sliding = beam::SlidingWindowsPayload {
        size: Some(duration(10_000)),
        offset: None,
        period: Some(duration(2_500)),
    };
    assert_eq!(
        side_of(&with_window_fn(
            "beam:window_fn:sliding_windows:v1",
            sliding.encode_to_vec()
        )),
        SideWindowFn::Sliding {
            size_ms: 10_000,
            period_ms: 2_500,
            offset_ms: 0
        }
    );
    // A zero size cannot map windows: opaque.
    let broken = beam::FixedWindowsPayload {
        size: None,
        offset: None,
    };
    assert_eq!(
        side_of(&with_window_fn(
            "beam:window_fn:fixed_windows:v1",
            broken.encode_to_vec()
        )),
        SideWindowFn::Other
    );
}

/// The element bytes of a plan's TestStream events, as hex.
fn test_stream_elements(p: &Plan) -> Vec<String> {
    let StageKind::TestStream { events, .. } = &p.graph.stages[0].kind else {
        panic!("stage 0 is not the TestStream: {:?}", kinds(p))
    };
    let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
    events
        .iter()
        .filter_map(|e| match e {
            TestStreamEvent::Elements { elements, .. } => Some(elements.iter().map(|(v, _)| hex(v))),
            _ => None,
        })
        .flatten()
        .collect()
}

#[test]
fn go_test_stream_custom_coder_elements_keep_their_own_length_prefix() {
    // Captured from Beam Go v2.77.0's TestTestStreamInt16Sequence (LOOPBACK):
    // the payload names coder c0 (beam:go:coder:custom:v1, zigzag varint),
    // its output n1 is length_prefix(c0), and Go encodes each element with
    // its custom encoder, which writes the length itself: 91 -> 02 b6 01.
    // The data plane must carry exactly that (one prefix), not 03 02 b6 01
    // (which Go decoded as 1, 1, 1).
    let p = plan_fixture("go_test_stream_int16");
    assert_eq!(test_stream_elements(&p), ["02b601", "02b801", "02ba01"]);
    // TestTestStreamSimple: output coder c0 itself (custom), which Weir's
    // wire coder length-prefixes: 42 -> 01 54, again one prefix only.
    let p = plan_fixture("go_test_stream_simple");
    assert_eq!(test_stream_elements(&p), ["0154"]);
}

#[test]
fn go_test_stream_varint_elements_travel_length_prefixed() {
    // TestTestStreamTwoInt64Sequences: beam:coder:varint:v1 elements
    // 91 92 93 @100 ms, watermark 110, 96 97 98 @120 ms, watermark 130;
    // a TestStream's elements travel as length_prefix(payload coder).
    let p = plan_fixture("go_test_stream_two_int64");
    assert_eq!(test_stream_elements(&p), ["015b", "015c", "015d", "0160", "0161", "0162"]);
}

// ------------------------------------------------------------ shipped plans

/// A cluster's coordinator ships its plan; a worker decodes it and points it
/// at its own Fn API. That must equal the worker planning the pipeline itself.
#[test]
fn a_shipped_plan_rebound_to_another_fn_api_equals_planning_there() {
    const WORKER_URL: &str = "10.0.0.7:40111";
    for name in [
        "wordcount",
        "side_input",
        "stateful_dofn",
        "test_stream",
        "sessions",
        "custom_merging",
        "ordered_list_state",
        "after_count_trigger",
    ] {
        let pipeline = load(name);
        let shipped = plan_ok(&pipeline).to_bytes();
        let mut received = Plan::from_bytes(&shipped).unwrap_or_else(|e| panic!("{name}: {e}"));
        received.rebind_fn_api(WORKER_URL).expect("ports decode");
        let there = plan(
            &pipeline,
            &PlanOptions {
                fn_api_url: WORKER_URL.into(),
                ..options()
            },
        )
        .expect("plans");
        assert_eq!(
            format!("{:?}", received.graph),
            format!("{:?}", there.graph),
            "{name}: stage graph"
        );
        assert_eq!(received.descriptors, there.descriptors, "{name}: descriptors");
        assert_eq!(received.environments, there.environments, "{name}: environments");
        // The rebinding reached every data port (the original URL is gone).
        let bytes = received.to_bytes();
        assert!(
            !bytes.windows(FN_API_URL.len()).any(|w| w == FN_API_URL.as_bytes()),
            "{name}: the coordinator's Fn API address is left in the plan"
        );
    }
}

#[test]
fn a_truncated_shipped_plan_is_refused_naming_its_part() {
    let shipped = plan_fixture("wordcount").to_bytes();
    for (cut, part) in [(2, "stage graph"), (shipped.len() - 3, "environments")] {
        match Plan::from_bytes(&shipped[..cut]) {
            Err(PlanError::Invalid(m)) => assert!(m.contains(part), "{m}"),
            other => panic!("cut at {cut}: {:?}", other.map(|p| p.graph.stages.len())),
        }
    }
    let mut longer = shipped.clone();
    longer.push(0);
    match Plan::from_bytes(&longer) {
        Err(PlanError::Invalid(m)) => assert!(m.contains("1 bytes follow"), "{m}"),
        other => panic!("trailing byte: {:?}", other.map(|p| p.graph.stages.len())),
    }
}

/// A stateful DoFn whose input has session windows: its elements come in
/// their own unmerged windows, so each would see fresh state. Refused, as
/// Beam's Java runners refuse it, naming the transform and the WindowFn.
#[test]
fn a_stateful_dofn_on_merging_windows_is_refused_naming_it() {
    let mut pipeline = load("stateful_dofn");
    let sessions = load("sessions");
    let from = sessions.components.as_ref().unwrap();
    let (_, ws) = from
        .windowing_strategies
        .iter()
        .find(|(_, ws)| ws.window_fn.as_ref().unwrap().urn == "beam:window_fn:session_windows:v1")
        .expect("the sessions fixture has a sessions strategy");
    let comps = pipeline.components.as_mut().unwrap();
    comps.windowing_strategies.insert("sessions_ws".into(), ws.clone());
    for (id, coder) in &from.coders {
        comps.coders.entry(id.clone()).or_insert_with(|| coder.clone());
    }
    let buffer = comps.transforms.values().find(|t| t.unique_name == "Buffer").unwrap().clone();
    let input = buffer.inputs.values().next().unwrap();
    comps.pcollections.get_mut(input).unwrap().windowing_strategy_id = "sessions_ws".into();
    let message = plan_err(&pipeline).to_string();
    assert!(message.contains("(Buffer)"), "{message}");
    assert!(message.contains("stateful DoFn") && message.contains("session windows"), "{message}");
}

/// A ParDo that reads its own output, and two transforms that write one
/// PCollection: both refused by name (the first had vanished from the plan,
/// its input's data with it).
#[test]
fn a_self_loop_and_a_second_producer_are_refused_by_name() {
    let mut looped = load("stateful_dofn");
    let comps = looped.components.as_mut().unwrap();
    let buffer = comps.transforms.values_mut().find(|t| t.unique_name == "Buffer").unwrap();
    let output = buffer.outputs.values().next().unwrap().clone();
    for input in buffer.inputs.values_mut() {
        *input = output.clone();
    }
    let message = plan_err(&looped).to_string();
    assert!(message.contains("(Buffer, beam:transform:pardo:v1) reads its own output PCollection"), "{message}");

    let mut doubled = load("stateful_dofn");
    let comps = doubled.components.as_mut().unwrap();
    let output = comps.transforms.values().find(|t| t.unique_name == "Buffer").unwrap().outputs.values().next().unwrap().clone();
    let (other_id, other) =
        comps.transforms.iter_mut().find(|(_, t)| t.unique_name == "Create/Map(decode)").unwrap();
    let other_id = other_id.clone();
    let key = other.outputs.keys().next().unwrap().clone();
    other.outputs.insert(key, output.clone());
    let message = plan_err(&doubled).to_string();
    assert!(message.contains(&format!("PCollection {output} is the output of two transforms")), "{message}");
    assert!(message.contains(&other_id) && message.contains("(Buffer)"), "{message}");
}

/// Two transforms that read each other's output: the error names the cycle.
#[test]
fn a_two_transform_cycle_is_refused_naming_both() {
    let mut p = load("stateful_dofn");
    let comps = p.components.as_mut().unwrap();
    let (buffer_id, buffer) = comps.transforms.iter().find(|(_, t)| t.unique_name == "Buffer").unwrap();
    let buffer_id = buffer_id.clone();
    let input = buffer.inputs.values().next().unwrap().clone();
    let output = buffer.outputs.values().next().unwrap().clone();
    let feeder_id = comps
        .transforms
        .iter()
        .find(|(_, t)| t.subtransforms.is_empty() && t.outputs.values().any(|o| *o == input))
        .map(|(id, _)| id.clone())
        .expect("a leaf writes Buffer's input");
    let feeder = comps.transforms.get_mut(&feeder_id).unwrap();
    let feeder_name = feeder.unique_name.clone();
    for i in feeder.inputs.values_mut() {
        *i = output.clone();
    }
    let message = plan_err(&p).to_string();
    let b = format!("{buffer_id} (Buffer)");
    let f = format!("{feeder_id} ({feeder_name})");
    assert!(
        message.ends_with(&format!("form a cycle: {f} -> {b} -> {f}"))
            || message.ends_with(&format!("form a cycle: {b} -> {f} -> {b}")),
        "{message}"
    );
}
