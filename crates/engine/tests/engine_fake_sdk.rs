//! Runs the engine on hand-built stage graphs, with a fake SDK harness: a
//! [`BundleProcessor`] that decodes each bundle with `weir_model`, applies a
//! Rust function per element and encodes what it emits. Bundles complete on
//! their own threads, so the engine's asynchronous completion path is used.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use weir_engine::side_input::SideInputs;
use weir_engine::user_state::{BundleUserState, StateCell, StateUsage};
use weir_engine::{
    run_job, BundleProcessor, BundleRequest, BundleResult, Completion, EngineConfig, EngineError,
};
use weir_model::varint::{decode_varint, encode_varint};
use weir_model::{Coder, PaneInfo, Timestamp, Window, WindowedValue};
use weir_plan::{
    OutputTime, PCollectionIndex, PCollectionInfo, SdkStage, SideInput, SideInputKind, Stage,
    StageGraph, StageKind, WindowFn, Windowing,
};

// ------------------------------------------------------------ value codecs

fn varint(v: i64) -> Vec<u8> {
    let mut out = Vec::new();
    encode_varint(v, &mut out);
    out
}

fn read_varint(bytes: &[u8]) -> (i64, usize) {
    decode_varint(bytes).expect("varint")
}

fn string(s: &str) -> Vec<u8> {
    let mut out = varint(s.len() as i64);
    out.extend_from_slice(s.as_bytes());
    out
}

fn read_string(bytes: &[u8]) -> (String, usize) {
    let (len, n) = read_varint(bytes);
    let end = n + len as usize;
    (
        String::from_utf8(bytes[n..end].to_vec()).expect("utf-8"),
        end,
    )
}

/// `KV<string, varint>`.
fn kv_str_int(k: &str, v: i64) -> Vec<u8> {
    let mut out = string(k);
    out.extend(varint(v));
    out
}

fn read_kv_str_int(bytes: &[u8]) -> (String, i64) {
    let (k, n) = read_string(bytes);
    let (v, m) = read_varint(&bytes[n..]);
    assert_eq!(
        n + m,
        bytes.len(),
        "trailing bytes after KV<string, varint>"
    );
    (k, v)
}

/// Concatenated varints (an iterable side input's values) or an iterable's body.
fn read_varints(mut bytes: &[u8]) -> Vec<i64> {
    let mut out = Vec::new();
    while !bytes.is_empty() {
        let (v, n) = read_varint(bytes);
        out.push(v);
        bytes = &bytes[n..];
    }
    out
}

/// Every page of the global window of iterable side input `local_name` of
/// `transform_id`, concatenated, read as an SDK reads it (following
/// continuation tokens); `None` when the stage has no such side input.
fn read_iterable(sides: &SideInputs, transform_id: &str, local_name: &str) -> Option<Vec<u8>> {
    let (mut token, mut out) = (Vec::new(), Vec::new());
    loop {
        let page = sides
            .iterable_page(transform_id, local_name, &[], &token)
            .expect("a token it gave")?;
        out.extend_from_slice(&page.data);
        if page.continuation_token.is_empty() {
            return Some(out);
        }
        token = page.continuation_token;
    }
}

/// `KV<string, iterable<varint>>` as GroupByKey emits it (either iterable form).
fn read_grouped(bytes: &[u8]) -> (String, Vec<i64>) {
    let (k, mut pos) = read_string(bytes);
    let count = i32::from_be_bytes(bytes[pos..pos + 4].try_into().unwrap());
    pos += 4;
    let mut values = Vec::new();
    if count >= 0 {
        for _ in 0..count {
            let (v, n) = read_varint(&bytes[pos..]);
            values.push(v);
            pos += n;
        }
    } else {
        loop {
            let (chunk, n) = read_varint(&bytes[pos..]);
            pos += n;
            if chunk == 0 {
                break;
            }
            for _ in 0..chunk {
                let (v, n) = read_varint(&bytes[pos..]);
                values.push(v);
                pos += n;
            }
        }
    }
    assert_eq!(pos, bytes.len(), "trailing bytes after a grouped value");
    (k, values)
}

// ------------------------------------------------------------ graph building

fn kv_coder() -> Coder {
    Coder::Kv(Box::new(Coder::StringUtf8), Box::new(Coder::VarInt))
}

fn grouped_coder() -> Coder {
    Coder::Kv(
        Box::new(Coder::StringUtf8),
        Box::new(Coder::Iterable(Box::new(Coder::VarInt))),
    )
}

fn global() -> Windowing {
    Windowing {
        window_fn: WindowFn::Global,
        output_time: OutputTime::EndOfWindow,
        ..Windowing::global()
    }
}

/// A `Stage`, an `SdkStage` and a `PCollectionInfo` as the planner makes them
/// for a plain ParDo, so the graphs below only set the fields they care about
/// (fields added to these types later keep their planner defaults).
struct Templates {
    stage: Stage,
    sdk: SdkStage,
    pcollection: PCollectionInfo,
}

fn templates() -> Templates {
    use weir_proto::beam;
    use weir_proto::prost::Message;
    let spec = |urn: &str, payload: Vec<u8>| {
        Some(beam::FunctionSpec {
            urn: urn.into(),
            payload,
        })
    };
    let coder = |urn: &str| beam::Coder {
        spec: spec(urn, vec![]),
        component_coder_ids: vec![],
    };
    let mut c = beam::Components::default();
    c.coders
        .insert("bytes".into(), coder("beam:coder:bytes:v1"));
    c.coders
        .insert("global".into(), coder("beam:coder:global_window:v1"));
    c.windowing_strategies.insert(
        "ws".into(),
        beam::WindowingStrategy {
            window_fn: spec("beam:window_fn:global_windows:v1", vec![]),
            window_coder_id: "global".into(),
            ..Default::default()
        },
    );
    c.environments.insert(
        "env".into(),
        beam::Environment {
            urn: "beam:env:external:v1".into(),
            ..Default::default()
        },
    );
    for pc in ["p0", "p1"] {
        c.pcollections.insert(
            pc.into(),
            beam::PCollection {
                unique_name: pc.into(),
                coder_id: "bytes".into(),
                windowing_strategy_id: "ws".into(),
                ..Default::default()
            },
        );
    }
    c.transforms.insert(
        "impulse".into(),
        beam::PTransform {
            unique_name: "Impulse".into(),
            spec: spec("beam:transform:impulse:v1", vec![]),
            outputs: [("out".to_string(), "p0".to_string())]
                .into_iter()
                .collect(),
            ..Default::default()
        },
    );
    let payload = beam::ParDoPayload {
        do_fn: spec("beam:dofn:fake:v1", vec![]),
        ..Default::default()
    };
    c.transforms.insert(
        "pardo".into(),
        beam::PTransform {
            unique_name: "ParDo".into(),
            spec: spec("beam:transform:pardo:v1", payload.encode_to_vec()),
            inputs: [("in".to_string(), "p0".to_string())].into_iter().collect(),
            outputs: [("out".to_string(), "p1".to_string())]
                .into_iter()
                .collect(),
            environment_id: "env".into(),
            ..Default::default()
        },
    );
    let pipeline = beam::Pipeline {
        components: Some(c),
        root_transform_ids: vec!["impulse".into(), "pardo".into()],
        ..Default::default()
    };
    let plan = weir_plan::plan(
        &pipeline,
        &weir_plan::PlanOptions {
            fn_api_url: "localhost:1".into(),
            streaming: false,
            drain: false,
        },
    )
    .expect("template pipeline plans");
    let stage = plan.graph.stages[1].clone();
    let StageKind::Sdk(sdk) = stage.kind.clone() else {
        panic!("the ParDo is an SDK stage")
    };
    Templates {
        stage,
        sdk,
        pcollection: plan.graph.pcollections[0].clone(),
    }
}

struct GraphBuilder {
    pcollections: Vec<PCollectionInfo>,
    stages: Vec<Stage>,
    templates: Templates,
}

impl Default for GraphBuilder {
    fn default() -> Self {
        GraphBuilder {
            pcollections: vec![],
            stages: vec![],
            templates: templates(),
        }
    }
}

impl GraphBuilder {
    fn pc(&mut self, id: &str, value_coder: Coder) -> PCollectionIndex {
        self.pc_windowed(id, value_coder, Coder::GlobalWindow, global())
    }

    fn pc_windowed(
        &mut self,
        id: &str,
        value_coder: Coder,
        window_coder: Coder,
        windowing: Windowing,
    ) -> PCollectionIndex {
        self.pcollections.push(PCollectionInfo {
            id: id.into(),
            value_coder,
            window_coder,
            windowing,
            ..self.templates.pcollection.clone()
        });
        self.pcollections.len() - 1
    }

    fn stage(&mut self, name: &str, kind: StageKind) -> usize {
        let id = format!("stage-{}", self.stages.len());
        self.stages.push(Stage {
            id,
            name: name.into(),
            kind,
            ..self.templates.stage.clone()
        });
        self.stages.len() - 1
    }

    fn impulse(&mut self) -> PCollectionIndex {
        let out = self.pc(&format!("impulse{}", self.stages.len()), Coder::Bytes);
        self.stage("Impulse", StageKind::Impulse { output: out });
        out
    }

    fn sdk(
        &mut self,
        name: &str,
        input: PCollectionIndex,
        outputs: Vec<PCollectionIndex>,
        side_inputs: Vec<SideInput>,
    ) -> usize {
        let n = self.stages.len();
        let sdk = SdkStage {
            environment_id: "fake-env".into(),
            input,
            input_transform_id: format!("stage-{n}/source"),
            side_inputs,
            output_transform_ids: outputs
                .iter()
                .map(|o| format!("stage-{n}/sink:{o}"))
                .collect(),
            outputs,
            residual_transform_ids: vec![format!("{name}-transform")],
            ..self.templates.sdk.clone()
        };
        self.stage(name, StageKind::Sdk(sdk))
    }

    fn build(self) -> Arc<StageGraph> {
        Arc::new(StageGraph {
            pcollections: self.pcollections,
            stages: self.stages,
            streaming: false,
        })
    }
}

// ------------------------------------------------------------ the fake SDK

/// What a stage function does with one element.
#[derive(Default)]
struct Emit {
    /// (output port, encoded value): windowed like the input element.
    outputs: Vec<(usize, Vec<u8>)>,
    /// Encoded values returned as residuals (SDF checkpoints), windowed like the input.
    residuals: Vec<Vec<u8>>,
    /// The resume delay these residuals ask for, ms (the bundle's is the least).
    residual_delay_ms: i64,
    /// Fails the bundle with this message.
    error: Option<String>,
}

impl Emit {
    fn out(port: usize, value: Vec<u8>) -> Emit {
        Emit {
            outputs: vec![(port, value)],
            ..Default::default()
        }
    }
}

type StageFn = Box<dyn Fn(&WindowedValue, &SideInputs) -> Emit + Send + Sync>;

#[derive(Default)]
struct Stats {
    /// Stage index -> element count of each bundle, in completion order.
    bundles: Mutex<HashMap<usize, Vec<usize>>>,
    /// Bundle threads currently running.
    running: AtomicUsize,
}

impl Stats {
    fn bundle_sizes(&self, stage: usize) -> Vec<usize> {
        self.bundles
            .lock()
            .unwrap()
            .get(&stage)
            .cloned()
            .unwrap_or_default()
    }
}

struct Inner {
    graph: Arc<StageGraph>,
    functions: HashMap<usize, StageFn>,
    stats: Stats,
    /// Stages whose bundles are kept, never completed (for cancellation).
    hang: Vec<usize>,
    held: Mutex<Vec<Completion>>,
    started: Mutex<Option<mpsc::Sender<usize>>>,
}

#[derive(Clone)]
struct FakeSdk(Arc<Inner>);

impl FakeSdk {
    fn new(graph: Arc<StageGraph>, functions: Vec<(usize, StageFn)>) -> FakeSdk {
        FakeSdk(Arc::new(Inner {
            graph,
            functions: functions.into_iter().collect(),
            stats: Stats::default(),
            hang: vec![],
            held: Mutex::new(vec![]),
            started: Mutex::new(None),
        }))
    }

    fn run_bundle(inner: &Inner, request: &BundleRequest) -> Result<BundleResult, String> {
        let stage = &inner.graph.stages[request.stage];
        assert_eq!(stage.id, request.stage_id);
        assert_eq!(stage.name, request.stage_name);
        let StageKind::Sdk(sdk) = &stage.kind else {
            panic!("bundle for non-SDK stage {}", stage.id)
        };
        let input = &inner.graph.pcollections[sdk.input];
        // Each input entry is exactly one encoded windowed value.
        let mut elements = Vec::with_capacity(request.input.len());
        for bytes in &request.input {
            let (wv, used) = WindowedValue::decode(&input.value_coder, &input.window_coder, bytes)
                .map_err(|e| format!("fake SDK cannot decode its input: {e}"))?;
            assert_eq!(
                used,
                bytes.len(),
                "an input entry of stage {} holds more than one element",
                stage.name
            );
            elements.push(wv);
        }
        inner
            .stats
            .bundles
            .lock()
            .unwrap()
            .entry(request.stage)
            .or_default()
            .push(elements.len());
        let f = inner
            .functions
            .get(&request.stage)
            .unwrap_or_else(|| panic!("no function for stage {}", stage.name));
        let mut result = BundleResult {
            outputs: vec![Vec::new(); sdk.outputs.len()],
            ..Default::default()
        };
        for wv in &elements {
            let emit = f(wv, &request.side_inputs);
            if let Some(e) = emit.error {
                return Err(e);
            }
            let rewrap = |value: Vec<u8>| WindowedValue {
                value,
                ..wv.clone()
            };
            for (port, value) in emit.outputs {
                rewrap(value).encode(&mut result.outputs[port]);
            }
            if !emit.residuals.is_empty() {
                result.residual_delay_ms = if result.residuals.is_empty() {
                    emit.residual_delay_ms
                } else {
                    result.residual_delay_ms.min(emit.residual_delay_ms)
                };
            }
            for value in emit.residuals {
                let mut bytes = Vec::new();
                rewrap(value).encode(&mut bytes);
                result.residuals.push(bytes);
            }
        }
        Ok(result)
    }
}

impl BundleProcessor for FakeSdk {
    fn process_bundle(&self, request: BundleRequest, done: Completion) {
        let inner = self.0.clone();
        if let Some(tx) = inner.started.lock().unwrap().as_ref() {
            let _ = tx.send(request.stage);
        }
        if inner.hang.contains(&request.stage) {
            inner.held.lock().unwrap().push(done);
            return;
        }
        inner.stats.running.fetch_add(1, Ordering::SeqCst);
        // Complete from another thread, a little later, as a real harness does.
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis((request.input.len() % 3) as u64));
            let result = FakeSdk::run_bundle(&inner, &request);
            inner.stats.running.fetch_sub(1, Ordering::SeqCst);
            done(result);
        });
    }
}

fn config(workers: usize, max_bundle_elements: usize) -> EngineConfig {
    EngineConfig {
        workers,
        max_bundle_elements,
        max_bundle_bytes: 1 << 20,
        max_bundles_in_flight: 2,
        ..EngineConfig::default()
    }
}

/// Runs the job on its own thread; fails the test if it takes longer than a minute.
fn run(
    graph: Arc<StageGraph>,
    sdk: FakeSdk,
    config: EngineConfig,
    cancel: Arc<AtomicBool>,
) -> Result<(), EngineError> {
    run_within(graph, sdk, config, cancel, Duration::from_secs(60))
}

/// Runs the job on its own thread; fails the test if it takes longer than `limit`
/// (a hung job's thread is left behind).
fn run_within(
    graph: Arc<StageGraph>,
    sdk: FakeSdk,
    config: EngineConfig,
    cancel: Arc<AtomicBool>,
    limit: Duration,
) -> Result<(), EngineError> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(run_job(graph, Arc::new(sdk), config, cancel));
    });
    rx.recv_timeout(limit)
        .unwrap_or_else(|_| panic!("the job did not finish within {limit:?}"))
}

fn no_cancel() -> Arc<AtomicBool> {
    Arc::new(AtomicBool::new(false))
}

// ------------------------------------------------------------ tests

const SEEDS: i64 = 50;
const PER_SEED: i64 = 20;
const KEYS: i64 = 7;

/// Impulse → Seeds (0..50) → FanOut (20 KVs each, 7 keys) → GroupByKey → Sum.
/// Returns the sums the Sum stage saw, one entry per group, and the fake.
fn fan_out_group_sum(workers: usize) -> (Vec<(String, i64, usize)>, FakeSdk, Arc<StageGraph>) {
    fan_out_group_sum_with(workers, weir_engine::Progress::default())
}

/// [`fan_out_group_sum`], publishing the job's progress into `progress`.
fn fan_out_group_sum_with(
    workers: usize,
    progress: weir_engine::Progress,
) -> (Vec<(String, i64, usize)>, FakeSdk, Arc<StageGraph>) {
    let sums: Arc<Mutex<Vec<(String, i64, usize)>>> = Arc::default();
    let (graph, functions) = fan_out_job(sums.clone());
    let sdk = FakeSdk::new(graph.clone(), functions);
    let config = EngineConfig {
        progress,
        ..config(workers, 3)
    };
    run(graph.clone(), sdk.clone(), config, no_cancel()).expect("job succeeds");
    let mut out = sums.lock().unwrap().clone();
    out.sort();
    (out, sdk, graph)
}

/// The graph of [`fan_out_group_sum`] and its stage functions; the Sum
/// stage pushes each group's (key, sum, count) into `sums`.
fn fan_out_job(sums: Arc<Mutex<Vec<(String, i64, usize)>>>) -> (Arc<StageGraph>, Vec<(usize, StageFn)>) {
    let mut g = GraphBuilder::default();
    let imp = g.impulse();
    let seeds = g.pc("seeds", Coder::VarInt);
    let pairs = g.pc("pairs", kv_coder());
    let grouped = g.pc("grouped", grouped_coder());
    let s_seeds = g.sdk("Seeds", imp, vec![seeds], vec![]);
    let s_fan = g.sdk("FanOut", seeds, vec![pairs], vec![]);
    g.stage(
        "Group",
        StageKind::GroupByKey {
            input: pairs,
            output: grouped,
            merge_windows: None,
        },
    );
    let s_sum = g.sdk("Sum", grouped, vec![], vec![]);
    let graph = g.build();

    let sums2 = sums;
    let functions: Vec<(usize, StageFn)> = vec![
        (
            s_seeds,
            Box::new(|wv: &WindowedValue, _: &SideInputs| {
                assert_eq!(
                    wv.value,
                    vec![0],
                    "the impulse element is an empty byte array"
                );
                assert_eq!(wv.timestamp, Timestamp::MIN);
                assert_eq!(wv.windows, vec![Window::Global]);
                Emit {
                    outputs: (0..SEEDS).map(|s| (0, varint(s))).collect(),
                    ..Default::default()
                }
            }),
        ),
        (
            s_fan,
            Box::new(|wv: &WindowedValue, _: &SideInputs| {
                let (seed, _) = read_varint(&wv.value);
                let outputs = (0..PER_SEED)
                    .map(|j| {
                        let v = seed * PER_SEED + j;
                        (0, kv_str_int(&format!("k{}", v % KEYS), v))
                    })
                    .collect();
                Emit {
                    outputs,
                    ..Default::default()
                }
            }),
        ),
        (
            s_sum,
            Box::new(move |wv: &WindowedValue, _: &SideInputs| {
                let (k, values) = read_grouped(&wv.value);
                assert_eq!(wv.windows, vec![Window::Global]);
                assert_eq!(wv.pane, PaneInfo::ON_TIME_AND_ONLY_FIRING);
                sums2
                    .lock()
                    .unwrap()
                    .push((k, values.iter().sum(), values.len()));
                Emit::default()
            }),
        ),
    ];
    (graph, functions)
}

fn expected_sums() -> Vec<(String, i64, usize)> {
    let mut m: BTreeMap<String, (i64, usize)> = BTreeMap::new();
    for v in 0..SEEDS * PER_SEED {
        let e = m.entry(format!("k{}", v % KEYS)).or_default();
        e.0 += v;
        e.1 += 1;
    }
    m.into_iter().map(|(k, (s, n))| (k, s, n)).collect()
}

#[test]
fn group_and_sum_one_worker() {
    let (sums, sdk, _) = fan_out_group_sum(1);
    let expected = expected_sums();
    assert_eq!(sums, expected);
    // Spot-check the expectation itself: 0..1000, key k0 holds 0, 7, ..., 994.
    assert_eq!(expected[0], ("k0".to_string(), 71_071, 143));
    assert_eq!(expected.iter().map(|e| e.1).sum::<i64>(), 499_500);

    // Bundles honour max_bundle_elements = 3; every seed processed once.
    let fan = sdk.0.stats.bundle_sizes(2);
    assert_eq!(fan.iter().sum::<usize>(), SEEDS as usize);
    assert!(
        fan.iter().all(|&n| (1..=3).contains(&n)),
        "FanOut bundle sizes {fan:?}"
    );
    assert!(fan.len() >= 17, "{} FanOut bundles", fan.len());
    assert_eq!(
        sdk.0.stats.bundle_sizes(1),
        vec![1],
        "one impulse element, one bundle"
    );
    let sum_bundles = sdk.0.stats.bundle_sizes(4);
    assert_eq!(
        sum_bundles.iter().sum::<usize>(),
        KEYS as usize,
        "one group per key"
    );
    assert!(sum_bundles.len() >= 3, "Sum bundles {sum_bundles:?}");
    assert_eq!(sdk.0.stats.running.load(Ordering::SeqCst), 0);
}

#[test]
fn progress_of_a_finished_job_shows_every_stage_done() {
    let progress = weir_engine::Progress::default();
    let (sums, sdk, graph) = fan_out_group_sum_with(2, progress.clone());
    assert_eq!(sums, expected_sums());
    let stages = progress.stages();
    assert_eq!(stages.len(), graph.stages.len());
    for (stage, p) in graph.stages.iter().zip(&stages) {
        assert_eq!(p.output_watermark, None, "{}: output done", stage.name);
        assert_eq!(p.status.in_flight + p.status.pending, 0, "{}: nothing left", stage.name);
        // Runner stages without an operator of their own (Impulse) never report.
        let reports = !matches!(stage.kind, StageKind::Impulse { .. });
        assert_eq!(p.reported, reports, "{}", stage.name);
        if reports {
            assert_eq!(p.status.watermark, None, "{}: input done", stage.name);
        }
    }
    // Impulse, Seeds, FanOut, Group, Sum: 1 seed call, 50 seeds, 1000 pairs, 7 groups.
    let counts: Vec<(u64, u64)> = stages.iter().map(|p| (p.counts.elements_in, p.counts.elements_out)).collect();
    assert_eq!(counts, vec![(0, 1), (1, 50), (50, 1000), (1000, 7), (7, 0)]);
    let fan_bundles = sdk.0.stats.bundle_sizes(2).len() as u64;
    assert_eq!(stages[2].counts.bundles, fan_bundles, "the FanOut bundles the SDK ran");
}

/// Cluster mode in one test: three "processes" (each its own `run_job`,
/// fake SDK and two timely workers) form one timely computation over
/// localhost TCP. The groups come out exactly once, across processes, and
/// the GroupByKey's elements cross between them.
#[test]
fn group_and_sum_across_three_processes_same_result() {
    let ports: Vec<u16> = (0..3)
        .map(|_| {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        })
        .collect();
    let addresses: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
    let sums: Arc<Mutex<Vec<(String, i64, usize)>>> = Arc::default();
    let runs: Vec<_> = (0..3)
        .map(|process| {
            let (graph, functions) = fan_out_job(sums.clone());
            let sdk = FakeSdk::new(graph.clone(), functions);
            let progress = weir_engine::Progress::default();
            let config = EngineConfig {
                progress: progress.clone(),
                cluster: Some(weir_engine::ClusterPeers {
                    process,
                    addresses: addresses.clone(),
                    session: "test-attempt".into(),
                    listener: None,
                }),
                ..config(2, 3)
            };
            let (tx, rx) = mpsc::channel();
            std::thread::spawn(move || {
                let _ = tx.send(run_job(graph, Arc::new(sdk.clone()), config, no_cancel()));
            });
            (rx, progress)
        })
        .collect();
    let mut exchanged = Vec::new();
    for (rx, progress) in runs {
        rx.recv_timeout(Duration::from_secs(60))
            .expect("every process finishes within a minute")
            .expect("job succeeds");
        exchanged.push(progress.exchanged_bytes());
    }
    let mut got = sums.lock().unwrap().clone();
    got.sort();
    assert_eq!(got, expected_sums());
    // The Impulse is on process 0, and FanOut's round-robin stays in its
    // process: the pairs reach the other processes' GroupByKeys over TCP.
    assert!(exchanged[0] > 0, "bytes sent by each process: {exchanged:?}");
}

#[test]
fn group_and_sum_three_workers_same_result() {
    let (one, _, _) = fan_out_group_sum(1);
    let (three, sdk, _) = fan_out_group_sum(3);
    assert_eq!(three, one);
    assert_eq!(three, expected_sums());
    let fan = sdk.0.stats.bundle_sizes(2);
    assert_eq!(fan.iter().sum::<usize>(), SEEDS as usize);
    assert!(fan.iter().all(|&n| n <= 3), "FanOut bundle sizes {fan:?}");
}

#[test]
fn flatten_of_two_branches() {
    for workers in [1, 2] {
        let mut g = GraphBuilder::default();
        let imp = g.impulse();
        let left = g.pc("left", kv_coder());
        let right = g.pc("right", kv_coder());
        let all = g.pc("all", kv_coder());
        // Both branches read the same impulse output.
        let s_left = g.sdk("Left", imp, vec![left], vec![]);
        let s_right = g.sdk("Right", imp, vec![right], vec![]);
        g.stage(
            "Flatten",
            StageKind::Flatten {
                inputs: vec![left, right],
                output: all,
            },
        );
        let s_collect = g.sdk("Collect", all, vec![], vec![]);
        let graph = g.build();

        let seen: Arc<Mutex<Vec<(String, i64)>>> = Arc::default();
        let seen2 = seen.clone();
        let functions: Vec<(usize, StageFn)> = vec![
            (
                s_left,
                Box::new(|_: &WindowedValue, _: &SideInputs| Emit {
                    outputs: (1..=10).map(|i| (0, kv_str_int("left", i))).collect(),
                    ..Default::default()
                }),
            ),
            (
                s_right,
                Box::new(|_: &WindowedValue, _: &SideInputs| Emit {
                    outputs: (1..=5).map(|i| (0, kv_str_int("right", i * 100))).collect(),
                    ..Default::default()
                }),
            ),
            (
                s_collect,
                Box::new(move |wv: &WindowedValue, _: &SideInputs| {
                    seen2.lock().unwrap().push(read_kv_str_int(&wv.value));
                    Emit::default()
                }),
            ),
        ];
        let sdk = FakeSdk::new(graph.clone(), functions);
        let progress = weir_engine::Progress::default();
        let config = EngineConfig { progress: progress.clone(), ..config(workers, 4) };
        run(graph, sdk.clone(), config, no_cancel()).expect("job succeeds");
        // The Flatten counts what passed through it and reports its input
        // watermark (done), as every stage with an operator does.
        let flatten = &progress.stages()[3];
        assert_eq!((flatten.counts.elements_in, flatten.counts.elements_out), (15, 15), "workers = {workers}");
        assert!(flatten.reported && flatten.status.watermark.is_none(), "{flatten:?}");
        let mut seen = seen.lock().unwrap().clone();
        seen.sort();
        let mut expected: Vec<(String, i64)> = (1..=10).map(|i| ("left".to_string(), i)).collect();
        expected.extend((1..=5).map(|i| ("right".to_string(), i * 100)));
        expected.sort();
        assert_eq!(seen, expected, "workers = {workers}");
        assert_eq!(
            sdk.0.stats.bundle_sizes(s_collect).iter().sum::<usize>(),
            15
        );
        assert!(sdk.0.stats.bundle_sizes(s_collect).iter().all(|&n| n <= 4));
    }
}

#[test]
fn iterable_side_input_in_global_window() {
    for workers in [1, 2] {
        let mut g = GraphBuilder::default();
        let imp = g.impulse();
        let side = g.pc("side", Coder::VarInt);
        let main = g.pc("main", Coder::VarInt);
        let s_side = g.sdk("MakeSide", imp, vec![side], vec![]);
        let s_main = g.sdk("MakeMain", imp, vec![main], vec![]);
        let si = SideInput {
            transform_id: "add-transform".into(),
            local_name: "s".into(),
            pcollection: side,
            kind: SideInputKind::Iterable,
            window_fn: weir_plan::SideWindowFn::Global,
        };
        let s_add = g.sdk("AddSide", main, vec![], vec![si]);
        let graph = g.build();

        let seen: Arc<Mutex<Vec<(i64, Vec<i64>)>>> = Arc::default();
        let seen2 = seen.clone();
        let functions: Vec<(usize, StageFn)> = vec![
            (
                s_side,
                Box::new(|_: &WindowedValue, _: &SideInputs| Emit {
                    outputs: (1..=5).map(|i| (0, varint(i))).collect(),
                    ..Default::default()
                }),
            ),
            (
                s_main,
                Box::new(|_: &WindowedValue, _: &SideInputs| Emit {
                    outputs: (0..12).map(|i| (0, varint(i * 1000))).collect(),
                    ..Default::default()
                }),
            ),
            (
                s_add,
                Box::new(move |wv: &WindowedValue, sides: &SideInputs| {
                    // The global window encodes as no bytes.
                    let bytes = read_iterable(sides, "add-transform", "s")
                        .expect("the stage's side input is served");
                    assert!(read_iterable(sides, "add-transform", "other").is_none());
                    let mut values = read_varints(&bytes);
                    values.sort();
                    let (x, _) = read_varint(&wv.value);
                    seen2.lock().unwrap().push((x, values));
                    Emit::default()
                }),
            ),
        ];
        let sdk = FakeSdk::new(graph.clone(), functions);
        run(graph, sdk, config(workers, 5), no_cancel()).expect("job succeeds");
        let mut seen = seen.lock().unwrap().clone();
        seen.sort();
        let expected: Vec<(i64, Vec<i64>)> =
            (0..12).map(|i| (i * 1000, vec![1, 2, 3, 4, 5])).collect();
        assert_eq!(
            seen, expected,
            "every main element sees the whole side input (workers = {workers})"
        );
    }
}

#[test]
fn sdf_residuals_are_resent_and_counted_once() {
    for workers in [1, 2] {
        let mut g = GraphBuilder::default();
        let imp = g.impulse();
        let work = g.pc("work", Coder::VarInt);
        let done_pc = g.pc("done", Coder::VarInt);
        let s_seed = g.sdk("Seed", imp, vec![work], vec![]);
        let s_proc = g.sdk("Process", work, vec![done_pc], vec![]);
        let s_collect = g.sdk("Collect", done_pc, vec![], vec![]);
        let graph = g.build();

        // Element v < 100 is "checkpointed" on its first pass: the bundle
        // returns v + 100 as a residual and no output; the resumed element
        // (>= 100) finishes and outputs v.
        let residuals_returned = Arc::new(AtomicUsize::new(0));
        let r2 = residuals_returned.clone();
        let collected: Arc<Mutex<Vec<i64>>> = Arc::default();
        let c2 = collected.clone();
        let functions: Vec<(usize, StageFn)> = vec![
            (
                s_seed,
                Box::new(|_: &WindowedValue, _: &SideInputs| Emit {
                    outputs: (0..9).map(|i| (0, varint(i))).collect(),
                    ..Default::default()
                }),
            ),
            (
                s_proc,
                Box::new(move |wv: &WindowedValue, _: &SideInputs| {
                    let (v, _) = read_varint(&wv.value);
                    if v < 100 {
                        r2.fetch_add(1, Ordering::SeqCst);
                        Emit {
                            residuals: vec![varint(v + 100)],
                            ..Default::default()
                        }
                    } else {
                        Emit::out(0, varint(v - 100))
                    }
                }),
            ),
            (
                s_collect,
                Box::new(move |wv: &WindowedValue, _: &SideInputs| {
                    c2.lock().unwrap().push(read_varint(&wv.value).0);
                    Emit::default()
                }),
            ),
        ];
        let sdk = FakeSdk::new(graph.clone(), functions);
        run(graph, sdk.clone(), config(workers, 2), no_cancel()).expect("job succeeds");
        let mut collected = collected.lock().unwrap().clone();
        collected.sort();
        assert_eq!(
            collected,
            (0..9).collect::<Vec<_>>(),
            "each element output exactly once (workers = {workers})"
        );
        assert_eq!(residuals_returned.load(Ordering::SeqCst), 9);
        // Process saw every element twice: 9 originals and 9 residuals.
        let sizes = sdk.0.stats.bundle_sizes(s_proc);
        assert_eq!(
            sizes.iter().sum::<usize>(),
            18,
            "Process bundle sizes {sizes:?}"
        );
        assert!(sizes.iter().all(|&n| n <= 2));
    }
}

/// Impulse → Seed (one element) → Poll, which checkpoints the element once
/// asking `delay_ms`, under `EngineConfig::min_resume_delay` = `floor`:
/// returns how long after the first attempt the resumed one ran.
fn resume_gap(delay_ms: i64, floor: Duration) -> Duration {
    let mut g = GraphBuilder::default();
    let imp = g.impulse();
    let work = g.pc("work", Coder::VarInt);
    let s_seed = g.sdk("Seed", imp, vec![work], vec![]);
    let s_poll = g.sdk("Poll", work, vec![], vec![]);
    let graph = g.build();
    let seen: Arc<Mutex<Vec<std::time::Instant>>> = Arc::default();
    let s2 = seen.clone();
    let functions: Vec<(usize, StageFn)> = vec![
        (
            s_seed,
            Box::new(|_: &WindowedValue, _: &SideInputs| Emit::out(0, varint(0))),
        ),
        (
            s_poll,
            Box::new(move |wv: &WindowedValue, _: &SideInputs| {
                s2.lock().unwrap().push(std::time::Instant::now());
                match read_varint(&wv.value).0 {
                    0 => Emit {
                        residuals: vec![varint(1)],
                        residual_delay_ms: delay_ms,
                        ..Default::default()
                    },
                    _ => Emit::default(),
                }
            }),
        ),
    ];
    let sdk = FakeSdk::new(graph.clone(), functions);
    let config = EngineConfig {
        min_resume_delay: floor,
        ..config(1, 10)
    };
    run(graph, sdk, config, no_cancel()).expect("job succeeds");
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 2, "the element and its residual");
    seen[1] - seen[0]
}

#[test]
fn a_deferred_residual_waits_at_least_the_floor_and_an_undeferred_one_does_not() {
    let floor = Duration::from_millis(500);
    // A 1 ms resume delay is raised to the floor...
    let gap = resume_gap(1, floor);
    assert!(gap >= floor, "resumed after {gap:?}, before the {floor:?} floor");
    // ...a longer one is kept...
    let gap = resume_gap(700, floor);
    assert!(gap >= Duration::from_millis(700), "resumed after {gap:?}, asked 700 ms");
    // ...and a checkpoint asking no delay resumes at once.
    let gap = resume_gap(0, floor);
    assert!(gap < Duration::from_millis(400), "resumed after {gap:?}, asked no delay");
}

/// Numbers (0..count) → Boom, which fails the bundle holding element `bad`.
fn failing_job(count: i64, bad: i64, config: EngineConfig) -> Result<(), EngineError> {
    let mut g = GraphBuilder::default();
    let imp = g.impulse();
    let nums = g.pc("nums", Coder::VarInt);
    let s_nums = g.sdk("Numbers", imp, vec![nums], vec![]);
    let s_boom = g.sdk("Boom", nums, vec![], vec![]);
    let graph = g.build();
    let functions: Vec<(usize, StageFn)> = vec![
        (
            s_nums,
            Box::new(move |_: &WindowedValue, _: &SideInputs| Emit {
                outputs: (0..count).map(|i| (0, varint(i))).collect(),
                ..Default::default()
            }),
        ),
        (
            s_boom,
            Box::new(move |wv: &WindowedValue, _: &SideInputs| {
                if read_varint(&wv.value).0 == bad {
                    Emit { error: Some(format!("Traceback (most recent call last):\nValueError: element {bad} is cursed")), ..Default::default() }
                } else {
                    Emit::default()
                }
            }),
        ),
    ];
    let sdk = FakeSdk::new(graph.clone(), functions);
    run_within(graph, sdk, config, no_cancel(), Duration::from_secs(20))
}

fn assert_bundle_failed(result: Result<(), EngineError>, bad: i64) {
    let err = result.expect_err("the job must fail");
    match &err {
        EngineError::BundleFailed { stage, message } => {
            assert_eq!(stage, "stage-2", "the Boom stage");
            assert_eq!(
                message,
                &format!("Traceback (most recent call last):\nValueError: element {bad} is cursed")
            );
        }
        other => panic!("expected BundleFailed, got {other:?}"),
    }
    assert!(
        err.to_string()
            .contains(&format!("ValueError: element {bad} is cursed")),
        "{err}"
    );
}

#[test]
fn failing_bundle_fails_the_job_with_its_message() {
    // Every element fits in the first bundles: nothing is left queued when the failure arrives.
    assert_bundle_failed(failing_job(4, 2, config(2, 10)), 2);
}

/// A bundle fails while later bundles of the same stage still wait in the
/// queue and nothing else is in flight. The operator returns early once the
/// job is stopped, keeping the queued bundles' capabilities; nothing activates
/// it again, so the dataflow never completes and `run_job` never returns
/// (timely keeps stepping a worker until its dataflows are done).
#[test]
fn failing_bundle_with_work_still_queued_ends_the_job() {
    let one_in_flight = EngineConfig {
        max_bundles_in_flight: 1,
        ..config(1, 3)
    };
    assert_bundle_failed(failing_job(20, 7, one_in_flight), 7);
}

/// Numbers (0..10) → Stuck, whose bundles the fake harness holds without completing.
fn stuck_job() -> (Arc<StageGraph>, FakeSdk, usize, mpsc::Receiver<usize>) {
    let mut g = GraphBuilder::default();
    let imp = g.impulse();
    let nums = g.pc("nums", Coder::VarInt);
    let s_nums = g.sdk("Numbers", imp, vec![nums], vec![]);
    let s_stuck = g.sdk("Stuck", nums, vec![], vec![]);
    let graph = g.build();
    let functions: Vec<(usize, StageFn)> = vec![
        (
            s_nums,
            Box::new(|_: &WindowedValue, _: &SideInputs| Emit {
                outputs: (0..10).map(|i| (0, varint(i))).collect(),
                ..Default::default()
            }),
        ),
        (
            s_stuck,
            Box::new(|_: &WindowedValue, _: &SideInputs| Emit::default()),
        ),
    ];
    let mut sdk = FakeSdk::new(graph.clone(), functions);
    let (tx, rx) = mpsc::channel();
    let inner = Arc::get_mut(&mut sdk.0).expect("not shared yet");
    inner.hang = vec![s_stuck];
    *inner.started.lock().unwrap() = Some(tx);
    (graph, sdk, s_stuck, rx)
}

/// Waits until `n` bundles of `stage` have started.
fn wait_for_bundles(rx: &mpsc::Receiver<usize>, stage: usize, n: usize) {
    let mut seen = 0;
    while seen < n {
        let s = rx
            .recv_timeout(Duration::from_secs(30))
            .expect("bundles start");
        if s == stage {
            seen += 1;
        }
    }
}

/// Cancelling while bundles run: the harness finishes (here: abandons with an
/// empty result) the bundles it holds, and the job ends as cancelled.
#[test]
fn cancellation_stops_a_running_job() {
    let (graph, sdk, s_stuck, rx) = stuck_job();
    let cancel = no_cancel();
    let (c2, sdk2) = (cancel.clone(), sdk.clone());
    let finished = Arc::new(AtomicBool::new(false));
    let finished2 = finished.clone();
    let released = Arc::new(AtomicUsize::new(0));
    let released2 = released.clone();
    std::thread::spawn(move || {
        wait_for_bundles(&rx, s_stuck, 1);
        c2.store(true, Ordering::SeqCst);
        // As a harness does on cancellation: complete what it holds, until the job is over.
        while !finished2.load(Ordering::SeqCst) {
            let held: Vec<Completion> = std::mem::take(&mut *sdk2.0.held.lock().unwrap());
            for done in held {
                released2.fetch_add(1, Ordering::SeqCst);
                done(Ok(BundleResult::default()));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    });
    let started = std::time::Instant::now();
    let result = run_within(graph, sdk, config(2, 3), cancel, Duration::from_secs(30));
    finished.store(true, Ordering::SeqCst);
    let err = result.expect_err("the job must be cancelled");
    assert!(
        matches!(err, EngineError::Cancelled),
        "expected Cancelled, got {err:?}"
    );
    assert_eq!(err.to_string(), "job cancelled");
    assert!(started.elapsed() < Duration::from_secs(20));
    // Whether the job noticed the stop before or after the harness gave bundles back varies.
    assert!(released.load(Ordering::SeqCst) <= 10);
}

/// Cancelling a job whose bundles never complete (user code stuck in a loop,
/// the typical reason to cancel). Once the stage's operator has gone idle
/// waiting for completions, nothing schedules it again after the stop, so it
/// keeps its capabilities and `run_job` never returns.
#[test]
fn cancellation_with_stuck_bundles_returns() {
    let (graph, sdk, s_stuck, rx) = stuck_job();
    let cancel = no_cancel();
    let c2 = cancel.clone();
    std::thread::spawn(move || {
        // Two bundles (max in flight) started, then let the dataflow go quiet.
        wait_for_bundles(&rx, s_stuck, 2);
        std::thread::sleep(Duration::from_millis(300));
        c2.store(true, Ordering::SeqCst);
    });
    let err = run_within(graph, sdk, config(1, 3), cancel, Duration::from_secs(20))
        .expect_err("the job must be cancelled");
    assert!(
        matches!(err, EngineError::Cancelled),
        "expected Cancelled, got {err:?}"
    );
}

#[test]
fn cancelled_before_start() {
    let mut g = GraphBuilder::default();
    let imp = g.impulse();
    let s = g.sdk("Never", imp, vec![], vec![]);
    let graph = g.build();
    let mut sdk = FakeSdk::new(
        graph.clone(),
        vec![(
            s,
            Box::new(|_: &WindowedValue, _: &SideInputs| Emit::default()) as StageFn,
        )],
    );
    Arc::get_mut(&mut sdk.0).unwrap().hang = vec![s];
    let err =
        run(graph, sdk, config(1, 10), Arc::new(AtomicBool::new(true))).expect_err("cancelled");
    assert!(matches!(err, EngineError::Cancelled), "{err:?}");
}

/// Session windows merge per key in the GroupByKey, across workers.
#[test]
fn session_windows_merge_in_group_by_key() {
    let gap = 10;
    let sessions = Windowing {
        window_fn: WindowFn::Sessions { gap_ms: gap },
        output_time: OutputTime::EndOfWindow,
        ..Windowing::global()
    };
    for workers in [1, 3] {
        let mut g = GraphBuilder::default();
        let imp = g.impulse();
        let stamped = g.pc_windowed(
            "stamped",
            kv_coder(),
            Coder::IntervalWindow,
            sessions.clone(),
        );
        let grouped = g.pc_windowed(
            "grouped",
            grouped_coder(),
            Coder::IntervalWindow,
            sessions.clone(),
        );
        let s_stamp = g.sdk("Stamp", imp, vec![stamped], vec![]);
        g.stage(
            "Group",
            StageKind::GroupByKey {
                input: stamped,
                output: grouped,
                merge_windows: None,
            },
        );
        let s_collect = g.sdk("Collect", grouped, vec![], vec![]);
        let graph = g.build();

        // (key, timestamp): a@1, a@5, a@12 form one session [1, 22); a@40 another; b@3 its own.
        let input = [("a", 1i64), ("a", 5), ("a", 12), ("a", 40), ("b", 3)];
        let seen: Arc<Mutex<Vec<(String, i64, i64, i64, Vec<i64>)>>> = Arc::default();
        let seen2 = seen.clone();
        let sdk = FakeSdk::new(
            graph.clone(),
            vec![(
                s_collect,
                Box::new(move |wv: &WindowedValue, _: &SideInputs| {
                    let (k, mut values) = read_grouped(&wv.value);
                    values.sort();
                    let Window::Interval { start, end } = wv.windows[0].clone() else {
                        panic!("not an interval window")
                    };
                    seen2
                        .lock()
                        .unwrap()
                        .push((k, start.0, end.0, wv.timestamp.0, values));
                    Emit::default()
                }) as StageFn,
            )],
        );
        // The Stamp stage emits elements with their own timestamps and session
        // windows, as the SDK's WindowInto would; other stages go to the fake.
        struct StampSdk {
            inner: FakeSdk,
            stage: usize,
            elements: Vec<(&'static str, i64)>,
            gap: i64,
        }
        impl BundleProcessor for StampSdk {
            fn process_bundle(&self, request: BundleRequest, done: Completion) {
                if request.stage != self.stage {
                    return self.inner.process_bundle(request, done);
                }
                let mut out = Vec::new();
                for (k, ts) in &self.elements {
                    WindowedValue {
                        timestamp: Timestamp(*ts),
                        windows: vec![Window::Interval {
                            start: Timestamp(*ts),
                            end: Timestamp(ts + self.gap),
                        }],
                        pane: PaneInfo::NO_FIRING,
                        value: kv_str_int(k, *ts),
                    }
                    .encode(&mut out);
                }
                std::thread::spawn(move || {
                    done(Ok(BundleResult {
                        outputs: vec![out],
                        ..Default::default()
                    }))
                });
            }
        }
        let processor = StampSdk {
            inner: sdk,
            stage: s_stamp,
            elements: input.to_vec(),
            gap,
        };
        let (tx, rx) = mpsc::channel();
        let g2 = graph.clone();
        std::thread::spawn(move || {
            let _ = tx.send(run_job(
                g2,
                Arc::new(processor),
                config(workers, 2),
                no_cancel(),
            ));
        });
        rx.recv_timeout(Duration::from_secs(60))
            .expect("job finishes")
            .expect("job succeeds");

        let mut seen = seen.lock().unwrap().clone();
        seen.sort();
        // Output timestamp: end of window = end - 1 ms.
        let expected = vec![
            ("a".to_string(), 1, 22, 21, vec![1, 5, 12]),
            ("a".to_string(), 40, 50, 49, vec![40]),
            ("b".to_string(), 3, 13, 12, vec![3]),
        ];
        assert_eq!(seen, expected, "workers = {workers}");
    }
}

// ------------------------------------------------------------ user-state expiry

/// What the stateful stage of `user_state_expires_after_its_windows_timers`
/// saw, in order. Windows are named by their start (10 ms fixed windows).
#[derive(Clone, Debug, PartialEq)]
enum GcEvent {
    /// An element (key, window start, value) reached the stateful stage.
    Element(String, i64, i64),
    /// A timer of (key, window start) fired and read this state.
    Timer(String, i64, Vec<i64>),
    /// The engine expired user state: `user_state_expired(stage, watermark ms)`.
    Expire(usize, i64),
}

const GC_WINDOW_MS: i64 = 10;
const GC_LATENESS_MS: i64 = 5;

/// A fake harness for a TestStream → Window → Buffer pipeline: Window puts
/// each element in its 10 ms fixed window; Buffer is stateful, appends each
/// value to the state of its (key, window) and sets an event-time timer at
/// the end of the window (hold there too, as Python's SDK does), and on a
/// timer reads that state. The state is the engine's (the bundle's
/// `user_state`, written and committed as the harness does); the engine
/// expires it, and `user_state_expired` logs when.
#[derive(Clone)]
struct GcSdk {
    window_stage: usize,
    buffer_stage: usize,
    log: Arc<Mutex<Vec<GcEvent>>>,
    /// The job's live cells after the last expiry.
    cells_left: Arc<Mutex<Option<usize>>>,
}

/// The bag cell of `key` in `window` of the Buffer transform.
fn buffer_cell(key: &str, window: &Window) -> StateCell {
    let mut encoded = Vec::new();
    window.encode(&mut encoded);
    StateCell {
        transform_id: "Buffer-transform".into(),
        state_id: "values".into(),
        window: encoded,
        key: string(key),
    }
}

fn fixed_window(ts: i64) -> Window {
    let start = ts.div_euclid(GC_WINDOW_MS) * GC_WINDOW_MS;
    Window::Interval {
        start: Timestamp(start),
        end: Timestamp(start + GC_WINDOW_MS),
    }
}

/// An event-time timer of `beam:coder:timer:v1` (string key, empty tag,
/// one interval window) firing and holding at the window's max timestamp.
fn end_of_window_timer(key: &str, window: &Window) -> Vec<u8> {
    let mut out = string(key);
    out.extend(varint(0));
    out.extend_from_slice(&1i32.to_be_bytes());
    window.encode(&mut out);
    out.push(0);
    window.max_timestamp().encode(&mut out);
    window.max_timestamp().encode(&mut out);
    PaneInfo::NO_FIRING.encode(&mut out);
    out
}

/// (key, window start) of each timer in concatenated `end_of_window_timer`s.
fn read_timers(mut bytes: &[u8]) -> Vec<(String, i64)> {
    let mut out = Vec::new();
    while !bytes.is_empty() {
        let (key, mut pos) = read_string(bytes);
        let (tag_len, n) = read_varint(&bytes[pos..]);
        pos += n + tag_len as usize + 4;
        let (window, n) = Window::decode(&Coder::IntervalWindow, &bytes[pos..]).unwrap();
        pos += n + 1;
        for _ in 0..2 {
            pos += Timestamp::decode(&bytes[pos..]).unwrap().1;
        }
        pos += PaneInfo::decode(&bytes[pos..]).unwrap().1;
        let Window::Interval { start, .. } = window else {
            panic!("not an interval window")
        };
        out.push((key, start.0));
        bytes = &bytes[pos..];
    }
    out
}

impl GcSdk {
    fn run(&self, request: &BundleRequest) -> BundleResult {
        let mut result = BundleResult::default();
        if request.stage == self.window_stage {
            let mut out = Vec::new();
            for bytes in &request.input {
                let (mut wv, _) =
                    WindowedValue::decode(&kv_coder(), &Coder::GlobalWindow, bytes).unwrap();
                wv.windows = vec![fixed_window(wv.timestamp.0)];
                wv.encode(&mut out);
            }
            result.outputs = vec![out];
            return result;
        }
        assert_eq!(request.stage, self.buffer_stage);
        let mut timers = Vec::new();
        let state = BundleUserState::new(request.user_state.clone());
        let mut log = self.log.lock().unwrap();
        for bytes in &request.input {
            let (wv, _) =
                WindowedValue::decode(&kv_coder(), &Coder::IntervalWindow, bytes).unwrap();
            let (k, v) = read_kv_str_int(&wv.value);
            let Window::Interval { start, .. } = wv.windows[0] else {
                panic!("not an interval window")
            };
            state.append(&buffer_cell(&k, &wv.windows[0]), &varint(v)).unwrap();
            log.push(GcEvent::Element(k.clone(), start.0, v));
            timers.extend(end_of_window_timer(&k, &wv.windows[0]));
        }
        for (key, start) in request.timers.iter().flat_map(|t| read_timers(t)) {
            let window = fixed_window(start);
            let mut bytes = &state.get(&buffer_cell(&key, &window))[..];
            let mut read = Vec::new();
            while !bytes.is_empty() {
                let (v, n) = read_varint(bytes);
                read.push(v);
                bytes = &bytes[n..];
            }
            log.push(GcEvent::Timer(key, start, read));
        }
        state.commit().unwrap();
        result.timers = vec![timers];
        result
    }
}

impl BundleProcessor for GcSdk {
    fn process_bundle(&self, request: BundleRequest, done: Completion) {
        let sdk = self.clone();
        std::thread::spawn(move || done(Ok(sdk.run(&request))));
    }

    fn user_state_expired(
        &self,
        stage: usize,
        input_watermark: Timestamp,
        _removed: usize,
        cells: &StateUsage,
    ) {
        self.log
            .lock()
            .unwrap()
            .push(GcEvent::Expire(stage, input_watermark.0));
        *self.cells_left.lock().unwrap() = Some(cells.live());
    }
}

/// A streaming stateful stage deletes its expired windows' user state while
/// the job runs, never before the window's end-of-window
/// timers ran (also a timer that a late element re-armed within the allowed
/// lateness), and never for a window that still gets elements.
#[test]
fn user_state_expires_after_its_windows_timers() {
    use weir_plan::{TestStreamEvent, TimerFamily};
    let mut g = GraphBuilder::default();
    let raw = g.pc("raw", kv_coder());
    let elements = |items: &[(&str, i64, i64)]| TestStreamEvent::Elements {
        output: 0,
        elements: items
            .iter()
            .map(|(k, v, ts)| (kv_str_int(k, *v), Timestamp(*ts)))
            .collect(),
    };
    let watermark = |to: i64| TestStreamEvent::Watermark {
        output: 0,
        to: Timestamp(to),
    };
    let events = vec![
        elements(&[("a", 1, 1), ("b", 3, 3), ("a", 12, 12)]),
        watermark(10),
        // Late for [0, 10) but within the 5 ms of lateness: kept.
        elements(&[("a", 7, 7)]),
        watermark(15),
        // [0, 10) expired at 15 (9 + 5 < 15): dropped, its state stays gone.
        elements(&[("a", 8, 8)]),
        watermark(30),
    ];
    g.stage(
        "TestStream",
        StageKind::TestStream {
            outputs: vec![raw],
            events,
        },
    );
    let fixed = Windowing {
        window_fn: WindowFn::NonMerging,
        allowed_lateness_ms: GC_LATENESS_MS,
        ..Windowing::global()
    };
    let windowed = g.pc_windowed("windowed", kv_coder(), Coder::IntervalWindow, fixed);
    let window_stage = g.sdk("Window", raw, vec![windowed], vec![]);
    let buffer_stage = g.sdk("Buffer", windowed, vec![], vec![]);
    if let StageKind::Sdk(sdk) = &mut g.stages[buffer_stage].kind {
        sdk.stateful = true;
        sdk.timer_families = vec![TimerFamily {
            transform_id: "Buffer-transform".into(),
            family_id: "flush".into(),
            key_coder: Coder::StringUtf8,
            window_coder: Coder::IntervalWindow,
            event_time: true,
            fire_at_hold: false,
        }];
    }
    let mut graph = (*g.build()).clone();
    graph.streaming = true;
    let sdk = GcSdk {
        window_stage,
        buffer_stage,
        log: Arc::default(),
        cells_left: Arc::default(),
    };
    let (tx, rx) = mpsc::channel();
    let processor = sdk.clone();
    std::thread::spawn(move || {
        let _ = tx.send(run_job(
            Arc::new(graph),
            Arc::new(processor),
            config(1, 100),
            no_cancel(),
        ));
    });
    rx.recv_timeout(Duration::from_secs(60))
        .expect("job finishes")
        .expect("job succeeds");

    let log = sdk.log.lock().unwrap().clone();
    let a = |s: &str| s.to_string();
    let timers: Vec<&GcEvent> = log
        .iter()
        .filter(|e| matches!(e, GcEvent::Timer(..)))
        .collect();
    assert_eq!(
        timers,
        [
            &GcEvent::Timer(a("a"), 0, vec![1]),
            &GcEvent::Timer(a("b"), 0, vec![3]),
            &GcEvent::Timer(a("a"), 0, vec![1, 7]),
            &GcEvent::Timer(a("a"), 10, vec![12]),
        ],
        "{log:?}"
    );
    // (position in the log, stage, watermark) of each expiry.
    let expiries: Vec<(usize, usize, i64)> = log
        .iter()
        .enumerate()
        .filter_map(|(i, e)| match e {
            GcEvent::Expire(stage, wm) => Some((i, *stage, *wm)),
            _ => None,
        })
        .collect();
    assert!(
        expiries.iter().all(|(_, stage, _)| *stage == buffer_stage),
        "{log:?}"
    );
    assert!(
        expiries.windows(2).all(|w| w[0].2 < w[1].2),
        "watermarks only grow: {log:?}"
    );
    // Window [s, s + 10) may go once the watermark passes s + 9 + 5: no
    // timer or element of it comes after such an expiry.
    for (i, event) in log.iter().enumerate() {
        let start = match event {
            GcEvent::Timer(_, s, _) | GcEvent::Element(_, s, _) => *s,
            GcEvent::Expire(..) => continue,
        };
        let gc_time = start + GC_WINDOW_MS - 1 + GC_LATENESS_MS;
        assert!(
            expiries.iter().all(|(at, _, wm)| *at > i || *wm <= gc_time),
            "event {i} ({event:?}) after its window's state expired: {log:?}"
        );
    }
    // Expiry happened while the job ran, and once more at the end of input.
    assert!(
        expiries.iter().any(|(_, _, wm)| *wm > 14 && *wm <= 30),
        "{log:?}"
    );
    assert_eq!(
        log.last(),
        Some(&GcEvent::Expire(buffer_stage, i64::MAX)),
        "{log:?}"
    );
    assert!(!log.contains(&GcEvent::Element(a("a"), 0, 8)), "{log:?}");
    // The engine deleted every window's state by the end of input.
    assert_eq!(*sdk.cells_left.lock().unwrap(), Some(0), "{log:?}");
}

/// Streaming: a main element waits for its global-window side input (even
/// after the watermark passed it, which the TestStream must not wait on),
/// and a triggered DISCARDING side input serves its latest firing to the
/// bundles that start after it arrived.
#[test]
fn streaming_side_input_holds_main_elements_and_serves_the_latest_firing() {
    use weir_plan::{Accumulation, SideWindowFn, TestStreamEvent, Trigger};
    let mut g = GraphBuilder::default();
    let main = g.pc("main", Coder::VarInt);
    let side = g.pc_windowed(
        "side",
        Coder::VarInt,
        Coder::GlobalWindow,
        Windowing {
            trigger: Trigger::Repeatedly(Box::new(Trigger::ElementCount(1))),
            accumulation: Accumulation::Discarding,
            ..global()
        },
    );
    let elements = |output: usize, values: &[i64]| TestStreamEvent::Elements {
        output,
        elements: values.iter().map(|&v| (varint(v), Timestamp(v))).collect(),
    };
    let events = vec![
        elements(0, &[10]),
        TestStreamEvent::Watermark {
            output: 0,
            to: Timestamp(1_000),
        },
        elements(1, &[1]),
        elements(0, &[20]),
        elements(1, &[2, 3]),
        elements(0, &[30, 31]),
        elements(1, &[4]),
    ];
    g.stage(
        "TestStream",
        StageKind::TestStream {
            outputs: vec![main, side],
            events,
        },
    );
    let si = SideInput {
        transform_id: "use-transform".into(),
        local_name: "s".into(),
        pcollection: side,
        kind: SideInputKind::Iterable,
        window_fn: SideWindowFn::Global,
    };
    let s_use = g.sdk("UseSide", main, vec![], vec![si]);
    let mut graph = Arc::try_unwrap(g.build()).unwrap_or_else(|_| unreachable!());
    graph.streaming = true;
    let graph = Arc::new(graph);

    let seen: Arc<Mutex<Vec<(i64, Vec<i64>)>>> = Arc::default();
    let seen2 = seen.clone();
    let functions: Vec<(usize, StageFn)> = vec![(
        s_use,
        Box::new(move |wv: &WindowedValue, sides: &SideInputs| {
            let values = read_varints(&read_iterable(sides, "use-transform", "s").expect("served"));
            seen2
                .lock()
                .unwrap()
                .push((read_varint(&wv.value).0, values));
            Emit::default()
        }),
    )];
    let sdk = FakeSdk::new(graph.clone(), functions);
    run(graph, sdk, config(1, 5), no_cancel()).expect("job succeeds");
    let mut seen = seen.lock().unwrap().clone();
    seen.sort();
    assert_eq!(
        seen,
        vec![
            (10, vec![1]),
            (20, vec![1]),
            (30, vec![2, 3]),
            (31, vec![2, 3])
        ],
        "10 waits for the first side value; 30 and 31 see the firing of 2 and 3, not 1"
    );
}

/// A stateful stage whose bundles set, per element `(key, v)`, an
/// event-time timer at the element's timestamp plus `offset_ms` (held there
/// too), and log each timer that fires as `(key, fire timestamp)`.
#[derive(Clone)]
struct TimerAtSdk {
    offset_ms: i64,
    fired: Arc<Mutex<Vec<(String, i64)>>>,
}

impl BundleProcessor for TimerAtSdk {
    fn process_bundle(&self, request: BundleRequest, done: Completion) {
        let sdk = self.clone();
        std::thread::spawn(move || {
            let mut timers = Vec::new();
            for bytes in &request.input {
                let (wv, _) = WindowedValue::decode(&kv_coder(), &Coder::GlobalWindow, bytes).unwrap();
                let (key, _) = read_kv_str_int(&wv.value);
                let at = Timestamp(wv.timestamp.0 + sdk.offset_ms);
                timers.extend(string(&key));
                timers.extend(varint(0));
                timers.extend_from_slice(&1i32.to_be_bytes());
                timers.push(0);
                at.encode(&mut timers);
                at.encode(&mut timers);
                PaneInfo::NO_FIRING.encode(&mut timers);
            }
            for mut bytes in request.timers.iter().map(|t| t.as_slice()) {
                while !bytes.is_empty() {
                    let (key, mut pos) = read_string(bytes);
                    pos += 1 + 4 + 1; // empty tag, one global window, set
                    let (fire, n) = Timestamp::decode(&bytes[pos..]).unwrap();
                    pos += n;
                    pos += Timestamp::decode(&bytes[pos..]).unwrap().1;
                    pos += PaneInfo::decode(&bytes[pos..]).unwrap().1;
                    sdk.fired.lock().unwrap().push((key, fire.0));
                    bytes = &bytes[pos..];
                }
            }
            done(Ok(BundleResult { timers: vec![timers], ..BundleResult::default() }))
        });
    }
}

/// TestStream -> a stateful stage with one event-time timer per element.
fn timers_under_test_stream(events: Vec<weir_plan::TestStreamEvent>, offset_ms: i64) -> Vec<(String, i64)> {
    use weir_plan::TimerFamily;
    let mut g = GraphBuilder::default();
    let raw = g.pc("raw", kv_coder());
    g.stage("TestStream", StageKind::TestStream { outputs: vec![raw], events });
    let stage = g.sdk("Timers", raw, vec![], vec![]);
    if let StageKind::Sdk(sdk) = &mut g.stages[stage].kind {
        sdk.stateful = true;
        sdk.timer_families = vec![TimerFamily {
            transform_id: "Timers-transform".into(),
            family_id: "t".into(),
            key_coder: Coder::StringUtf8,
            window_coder: Coder::GlobalWindow,
            event_time: true,
            fire_at_hold: false,
        }];
    }
    let mut graph = (*g.build()).clone();
    graph.streaming = true;
    let sdk = TimerAtSdk { offset_ms, fired: Arc::default() };
    let (tx, rx) = mpsc::channel();
    let processor = sdk.clone();
    std::thread::spawn(move || {
        let _ = tx.send(run_job(Arc::new(graph), Arc::new(processor), config(1, 100), no_cancel()));
    });
    rx.recv_timeout(Duration::from_secs(30))
        .expect("the job finishes (a timer at the watermark must not stall it)")
        .expect("job succeeds");
    let fired = sdk.fired.lock().unwrap().clone();
    fired
}

/// Python's `test_timer_output_timestamp`: the watermark is at 10 when the
/// element (timestamp 10) sets a timer at 10, held at 10, and the stream
/// ends. The TestStream must not wait for that timer's hold (the timer can
/// only fire once the watermark moves past 10, i.e. after the stream goes
/// on): the timer fires at the end of the stream.
#[test]
fn event_time_timer_at_the_watermark_fires_at_the_end_of_a_test_stream() {
    use weir_plan::TestStreamEvent;
    let events = vec![
        TestStreamEvent::Watermark { output: 0, to: Timestamp(10) },
        TestStreamEvent::Elements { output: 0, elements: vec![(kv_str_int("k", 1), Timestamp(10))] },
    ];
    assert_eq!(timers_under_test_stream(events, 0), [("k".to_string(), 10)]);
}

/// Java's `ParDoTest.testEventTimeTimerUnbounded`: a relative timer 1 s
/// after the element (at 0), then the watermark is advanced to exactly
/// 1000 ms, then to infinity.
#[test]
fn relative_event_time_timer_fires_when_the_watermark_passes_it() {
    use weir_plan::TestStreamEvent;
    let events = vec![
        TestStreamEvent::Watermark { output: 0, to: Timestamp(0) },
        TestStreamEvent::Elements { output: 0, elements: vec![(kv_str_int("hello", 37), Timestamp(0))] },
        TestStreamEvent::Watermark { output: 0, to: Timestamp(1000) },
        TestStreamEvent::Watermark { output: 0, to: Timestamp::MAX },
    ];
    assert_eq!(timers_under_test_stream(events, 1000), [("hello".to_string(), 1000)]);
}

/// A TestStream keeps a watermark per output (`AdvanceWatermark` names its
/// output's tag): moving the main output's watermark past a window does
/// not make the side output's elements of that window late (Beam's
/// test_multi_triggered_gbk_side_input advances `main` to 8 before it adds
/// `side` elements at 2 and 7). A stateful stage in fixed windows would
/// drop them as expired if it saw the main output's watermark.
#[test]
fn test_stream_outputs_advance_their_watermarks_on_their_own() {
    use weir_plan::{TestStreamEvent, TimerFamily};
    let mut g = GraphBuilder::default();
    let main = g.pc("main", kv_coder());
    let side = g.pc("side", kv_coder());
    let events = vec![
        TestStreamEvent::Watermark { output: 0, to: Timestamp(100) },
        TestStreamEvent::Elements { output: 1, elements: vec![(kv_str_int("a", 1), Timestamp(5))] },
        TestStreamEvent::Watermark { output: 1, to: Timestamp(100) },
    ];
    g.stage("TestStream", StageKind::TestStream { outputs: vec![main, side], events });
    let fixed = Windowing {
        window_fn: WindowFn::NonMerging,
        allowed_lateness_ms: GC_LATENESS_MS,
        ..Windowing::global()
    };
    let windowed = g.pc_windowed("windowed", kv_coder(), Coder::IntervalWindow, fixed);
    let window_stage = g.sdk("Window", side, vec![windowed], vec![]);
    let buffer_stage = g.sdk("Buffer", windowed, vec![], vec![]);
    if let StageKind::Sdk(sdk) = &mut g.stages[buffer_stage].kind {
        sdk.stateful = true;
        sdk.timer_families = vec![TimerFamily {
            transform_id: "Buffer-transform".into(),
            family_id: "flush".into(),
            key_coder: Coder::StringUtf8,
            window_coder: Coder::IntervalWindow,
            event_time: true,
            fire_at_hold: false,
        }];
    }
    let mut graph = (*g.build()).clone();
    graph.streaming = true;
    let sdk = GcSdk { window_stage, buffer_stage, log: Arc::default(), cells_left: Arc::default() };
    let (tx, rx) = mpsc::channel();
    let processor = sdk.clone();
    std::thread::spawn(move || {
        let _ = tx.send(run_job(Arc::new(graph), Arc::new(processor), config(1, 100), no_cancel()));
    });
    rx.recv_timeout(Duration::from_secs(30)).expect("job finishes").expect("job succeeds");
    let log = sdk.log.lock().unwrap().clone();
    let seen: Vec<&GcEvent> = log.iter().filter(|e| !matches!(e, GcEvent::Expire(..))).collect();
    assert_eq!(
        seen,
        [&GcEvent::Element("a".into(), 0, 1), &GcEvent::Timer("a".into(), 0, vec![1])],
        "{log:?}"
    );
}
