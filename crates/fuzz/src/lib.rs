//! Mutations of real pipelines and Job API requests, for fuzzing Weir.
//!
//! Not part of Weir: a test tool. Entry type: [`Mutator`], which holds seed
//! `PrepareJobRequest`s (captured from Beam's Python, Java and Go SDKs, see
//! `tests/fuzz/seeds/`) and makes mutated copies of them: structural
//! mutations that keep the proto well formed but break its references
//! (ids pointed elsewhere, cycles, deep chains, entries removed, URNs and
//! payloads swapped, payload fields rewired) and byte-level mutations of
//! the serialized pipeline that still decode.

use std::collections::HashMap;

use prost::Message;
use weir_proto::beam;
use weir_proto::prost_types::{value::Kind, ListValue, Struct, Value};

/// A small PRNG (xorshift64*): the same seed makes the same choices
/// (byte-level mutations also depend on prost's hash-ordered map encoding).
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator from `seed` (0 is replaced by a fixed odd constant).
    pub fn new(seed: u64) -> Rng {
        Rng(if seed == 0 { 0x9E37_79B9_7F4A_7C15 } else { seed })
    }
    /// The next 64 random bits.
    pub fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Uniform in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next() % n as u64) as usize
        }
    }
    /// True with probability 1/n.
    pub fn one_in(&mut self, n: usize) -> bool {
        self.below(n) == 0
    }
    /// A random element of `v`, if any.
    pub fn pick<'a, T>(&mut self, v: &'a [T]) -> Option<&'a T> {
        if v.is_empty() {
            None
        } else {
            v.get(self.below(v.len()))
        }
    }
}

/// Seed requests and the vocabulary (URNs, ids) mutations draw from.
pub struct Mutator {
    /// The seeds, each with a name for reports.
    pub seeds: Vec<(String, beam::PrepareJobRequest)>,
    urns: Vec<String>,
    payloads: Vec<Vec<u8>>,
}

fn keys<V>(m: &HashMap<String, V>) -> Vec<String> {
    let mut k: Vec<String> = m.keys().cloned().collect();
    k.sort();
    k
}

impl Mutator {
    /// A mutator over `seeds`.
    pub fn new(seeds: Vec<(String, beam::PrepareJobRequest)>) -> Mutator {
        let mut urns = vec![];
        let mut payloads = vec![];
        for (_, s) in &seeds {
            let Some(c) = s.pipeline.as_ref().and_then(|p| p.components.as_ref()) else {
                continue;
            };
            for t in c.transforms.values() {
                if let Some(spec) = &t.spec {
                    urns.push(spec.urn.clone());
                    payloads.push(spec.payload.clone());
                }
            }
            for cd in c.coders.values() {
                if let Some(spec) = &cd.spec {
                    urns.push(spec.urn.clone());
                }
            }
            for e in c.environments.values() {
                urns.push(e.urn.clone());
                payloads.push(e.payload.clone());
            }
        }
        urns.sort();
        urns.dedup();
        payloads.sort();
        payloads.dedup();
        Mutator {
            seeds,
            urns,
            payloads,
        }
    }

    /// A mutated copy of a random seed (1 to 4 mutations), and the seed's name.
    pub fn request(&self, rng: &mut Rng) -> (String, beam::PrepareJobRequest) {
        let (name, seed) = &self.seeds[rng.below(self.seeds.len())];
        let mut req = seed.clone();
        let n = 1 + rng.below(4);
        for _ in 0..n {
            match rng.below(10) {
                0 => self.bytes(rng, &mut req),
                1 => mutate_options(rng, req.pipeline_options.get_or_insert_with(Default::default)),
                _ => {
                    if let Some(p) = req.pipeline.as_mut() {
                        self.structure(rng, p);
                    }
                }
            }
        }
        (name.clone(), req)
    }

    /// Byte-level: flip, drop, insert or repeat bytes of the serialized
    /// pipeline; kept only when the result still decodes.
    fn bytes(&self, rng: &mut Rng, req: &mut beam::PrepareJobRequest) {
        let Some(p) = req.pipeline.as_ref() else {
            return;
        };
        let mut b = p.encode_to_vec();
        if b.is_empty() {
            return;
        }
        for _ in 0..1 + rng.below(8) {
            let i = rng.below(b.len());
            match rng.below(4) {
                0 => b[i] ^= 1 << rng.below(8),
                1 => b[i] = rng.next() as u8,
                2 => {
                    let end = (i + 1 + rng.below(16)).min(b.len());
                    b.drain(i..end);
                }
                _ => {
                    let end = (i + 1 + rng.below(64)).min(b.len());
                    let chunk = b[i..end].to_vec();
                    let at = rng.below(b.len());
                    b.splice(at..at, chunk);
                }
            }
            if b.is_empty() {
                return;
            }
        }
        if let Ok(p) = beam::Pipeline::decode(b.as_slice()) {
            req.pipeline = Some(p);
        }
    }

    /// One structural mutation of the pipeline.
    fn structure(&self, rng: &mut Rng, p: &mut beam::Pipeline) {
        let c = p.components.get_or_insert_with(Default::default);
        let transforms = keys(&c.transforms);
        let pcs = keys(&c.pcollections);
        let coders = keys(&c.coders);
        let strategies = keys(&c.windowing_strategies);
        let envs = keys(&c.environments);
        let all: Vec<String> = [&transforms, &pcs, &coders, &strategies, &envs]
            .into_iter()
            .flatten()
            .cloned()
            .collect();
        // An id: usually of the right kind, sometimes any or a fresh one.
        let id = |rng: &mut Rng, right: &[String]| -> String {
            match rng.below(8) {
                0 => rng.pick(&all).cloned().unwrap_or_default(),
                1 => format!("fuzz-{}", rng.below(1000)),
                _ => rng.pick(right).cloned().unwrap_or_default(),
            }
        };
        match rng.below(22) {
            // References pointed elsewhere.
            0 => {
                if let Some(t) = rng.pick(&transforms).and_then(|t| c.transforms.get_mut(t)) {
                    if let Some(k) = t.inputs.keys().min().cloned() {
                        t.inputs.insert(k, id(rng, &pcs));
                    } else {
                        t.inputs.insert("fuzz".into(), id(rng, &pcs));
                    }
                }
            }
            1 => {
                if let Some(t) = rng.pick(&transforms).and_then(|t| c.transforms.get_mut(t)) {
                    if let Some(k) = t.outputs.keys().min().cloned() {
                        t.outputs.insert(k, id(rng, &pcs));
                    }
                }
            }
            2 => {
                if let Some(pc) = rng.pick(&pcs).and_then(|x| c.pcollections.get_mut(x)) {
                    if rng.one_in(2) {
                        pc.coder_id = id(rng, &coders);
                    } else {
                        pc.windowing_strategy_id = id(rng, &strategies);
                    }
                }
            }
            3 => {
                let target = id(rng, &coders);
                if let Some(cd) = rng.pick(&coders).and_then(|x| c.coders.get_mut(x)) {
                    if cd.component_coder_ids.is_empty() || rng.one_in(2) {
                        cd.component_coder_ids.push(target);
                    } else {
                        let i = rng.below(cd.component_coder_ids.len());
                        cd.component_coder_ids[i] = target;
                    }
                }
            }
            // Cycles and sharing in the composite hierarchy.
            4 => {
                let (a, b) = (id(rng, &transforms), id(rng, &transforms));
                if let Some(t) = c.transforms.get_mut(&a) {
                    t.subtransforms.push(b);
                }
            }
            5 => {
                if let Some(r) = rng.pick(&transforms).cloned() {
                    p.root_transform_ids.push(r);
                }
            }
            // Deep chains.
            6 => {
                let n = 1 + rng.below(20_000);
                let base = rng.pick(&coders).cloned().unwrap_or_default();
                let mut prev = base;
                for i in 0..n {
                    let cid = format!("fuzz-chain-{i}");
                    c.coders.insert(
                        cid.clone(),
                        beam::Coder {
                            spec: Some(beam::FunctionSpec {
                                urn: if rng.one_in(2) { "beam:coder:kv:v1" } else { "beam:coder:iterable:v1" }.into(),
                                payload: vec![],
                            }),
                            component_coder_ids: if rng.one_in(2) { vec![prev.clone(), prev] } else { vec![prev] },
                        },
                    );
                    prev = cid;
                }
                if let Some(pc) = rng.pick(&pcs).and_then(|x| c.pcollections.get_mut(x)) {
                    pc.coder_id = prev;
                }
            }
            7 => {
                let n = 1 + rng.below(20_000);
                let mut prev: Option<String> = rng.pick(&transforms).cloned();
                for i in 0..n {
                    let tid = format!("fuzz-nest-{i}");
                    c.transforms.insert(
                        tid.clone(),
                        beam::PTransform {
                            unique_name: tid.clone(),
                            subtransforms: prev.into_iter().collect(),
                            ..Default::default()
                        },
                    );
                    prev = Some(tid);
                }
                p.root_transform_ids = prev.into_iter().collect();
            }
            // Entries removed.
            8 => {
                if let Some(x) = rng.pick(&transforms) {
                    c.transforms.remove(x);
                }
            }
            9 => {
                if let Some(x) = rng.pick(&pcs) {
                    c.pcollections.remove(x);
                }
            }
            10 => {
                if let Some(x) = rng.pick(&coders) {
                    c.coders.remove(x);
                }
            }
            11 => {
                if rng.one_in(2) {
                    if let Some(x) = rng.pick(&strategies) {
                        c.windowing_strategies.remove(x);
                    }
                } else if let Some(x) = rng.pick(&envs) {
                    c.environments.remove(x);
                }
            }
            // URNs and payloads swapped.
            12 => {
                let urn = rng.pick(&self.urns).cloned().unwrap_or_default();
                if let Some(t) = rng.pick(&transforms).and_then(|x| c.transforms.get_mut(x)) {
                    t.spec.get_or_insert_with(Default::default).urn = urn;
                }
            }
            13 => {
                let urn = rng.pick(&self.urns).cloned().unwrap_or_default();
                if let Some(cd) = rng.pick(&coders).and_then(|x| c.coders.get_mut(x)) {
                    cd.spec.get_or_insert_with(Default::default).urn = urn;
                }
            }
            14 => {
                let payload = rng.pick(&self.payloads).cloned().unwrap_or_default();
                if let Some(t) = rng.pick(&transforms).and_then(|x| c.transforms.get_mut(x)) {
                    t.spec.get_or_insert_with(Default::default).payload = payload;
                }
            }
            15 => {
                if let Some(t) = rng.pick(&transforms).and_then(|x| c.transforms.get_mut(x)) {
                    if let Some(spec) = t.spec.as_mut() {
                        flip_some(rng, &mut spec.payload);
                    }
                }
            }
            // Payload fields rewired (ParDo, Combine, TestStream, environment).
            16 => {
                let (cid, pid) = (id(rng, &coders), id(rng, &pcs));
                let (tid, sid) = (id(rng, &transforms), id(rng, &strategies));
                if let Some(t) = rng.pick(&transforms).and_then(|x| c.transforms.get_mut(x)) {
                    rewire_payload(rng, t, &cid, &pid, &tid, &sid);
                }
            }
            17 => {
                let (cid, e) = (id(rng, &coders), id(rng, &envs));
                if let Some(ws) = rng.pick(&strategies).and_then(|x| c.windowing_strategies.get_mut(x)) {
                    match rng.below(5) {
                        0 => ws.window_coder_id = cid,
                        1 => ws.environment_id = e,
                        2 => ws.merge_status = rng.below(5) as i32,
                        3 => {
                            let depth = 1 + rng.below(120);
                            ws.trigger = Some(random_trigger(rng, depth));
                        }
                        _ => {
                            ws.accumulation_mode = rng.below(5) as i32;
                            ws.output_time = rng.below(5) as i32;
                            ws.allowed_lateness = rng.next() as i64;
                        }
                    }
                }
            }
            18 => {
                let e = id(rng, &envs);
                if let Some(t) = rng.pick(&transforms).and_then(|x| c.transforms.get_mut(x)) {
                    t.environment_id = e;
                }
            }
            19 => {
                if let Some(env) = rng.pick(&envs).and_then(|x| c.environments.get_mut(x)) {
                    match rng.below(3) {
                        0 => flip_some(rng, &mut env.payload),
                        1 => {
                            // ANYOF around itself, nested.
                            let mut inner = env.clone();
                            for _ in 0..1 + rng.below(50) {
                                inner = beam::Environment {
                                    urn: "beam:env:anyof:v1".into(),
                                    payload: beam::AnyOfEnvironmentPayload {
                                        environments: vec![inner],
                                    }
                                    .encode_to_vec(),
                                    ..Default::default()
                                };
                            }
                            *env = inner;
                        }
                        _ => env.urn = rng.pick(&self.urns).cloned().unwrap_or_default(),
                    }
                }
            }
            20 => {
                if !p.requirements.is_empty() && rng.one_in(2) {
                    p.requirements.clear();
                } else {
                    p.requirements.push(
                        rng.pick(&[
                            "beam:requirement:pardo:splittable_dofn:v1",
                            "beam:requirement:pardo:stateful:v1",
                            "beam:requirement:pardo:time_sorted_input:v1",
                            "beam:requirement:pardo:fuzz:v1",
                        ])
                        .map(|s| s.to_string())
                        .unwrap_or_default(),
                    );
                }
            }
            _ => {
                // A transform's outputs fed back to its own input (a dataflow cycle).
                if let Some(t) = rng.pick(&transforms).and_then(|x| c.transforms.get_mut(x)) {
                    if let Some(o) = t.outputs.keys().min().and_then(|k| t.outputs.get(k)).cloned() {
                        t.inputs.insert("fuzz-loop".into(), o);
                    }
                }
            }
        }
    }
}

fn flip_some(rng: &mut Rng, b: &mut Vec<u8>) {
    if b.is_empty() {
        b.extend((0..rng.below(16)).map(|_| rng.next() as u8));
        return;
    }
    for _ in 0..1 + rng.below(4) {
        let i = rng.below(b.len());
        match rng.below(3) {
            0 => b[i] ^= 1 << rng.below(8),
            1 => b.truncate(i),
            _ => b[i] = rng.next() as u8,
        }
        if b.is_empty() {
            return;
        }
    }
}

/// Points an id inside a transform's payload elsewhere.
fn rewire_payload(rng: &mut Rng, t: &mut beam::PTransform, coder: &str, pc: &str, transform: &str, ws: &str) {
    let Some(spec) = t.spec.as_mut() else { return };
    if let Ok(mut p) = beam::ParDoPayload::decode(spec.payload.as_slice()) {
        if spec.urn.contains("pardo") || spec.urn.contains("sdf") {
            match rng.below(6) {
                0 => p.restriction_coder_id = coder.into(),
                1 => {
                    let name = if rng.one_in(2) {
                        t.inputs.keys().min().cloned().unwrap_or_default()
                    } else {
                        format!("side{}", rng.below(3))
                    };
                    p.side_inputs.insert(
                        name,
                        beam::SideInput {
                            access_pattern: Some(beam::FunctionSpec {
                                urn: if rng.one_in(2) { "beam:side_input:iterable:v1" } else { "beam:side_input:multimap:v1" }.into(),
                                payload: vec![],
                            }),
                            ..Default::default()
                        },
                    );
                    if rng.one_in(2) {
                        t.inputs.insert(format!("side{}", rng.below(3)), pc.into());
                    }
                }
                2 => {
                    p.timer_family_specs.insert(
                        format!("timer{}", rng.below(3)),
                        beam::TimerFamilySpec {
                            time_domain: rng.below(4) as i32,
                            timer_family_coder_id: coder.into(),
                        },
                    );
                }
                3 => {
                    p.state_specs.insert(
                        format!("state{}", rng.below(3)),
                        beam::StateSpec {
                            spec: Some(beam::state_spec::Spec::BagSpec(beam::BagStateSpec {
                                element_coder_id: coder.into(),
                            })),
                            protocol: None,
                        },
                    );
                }
                4 => p.on_window_expiration_timer_family_spec = format!("timer{}", rng.below(3)),
                _ => {
                    p.requests_finalization = !p.requests_finalization;
                    p.requires_stable_input = !p.requires_stable_input;
                }
            }
            spec.payload = p.encode_to_vec();
            return;
        }
    }
    if spec.urn.contains("combine") {
        if let Ok(mut p) = beam::CombinePayload::decode(spec.payload.as_slice()) {
            p.accumulator_coder_id = coder.into();
            spec.payload = p.encode_to_vec();
            return;
        }
    }
    if spec.urn.contains("teststream") {
        if let Ok(mut p) = beam::TestStreamPayload::decode(spec.payload.as_slice()) {
            if rng.one_in(2) {
                p.coder_id = coder.into();
            } else {
                use beam::test_stream_payload::event::{AddElements, AdvanceWatermark, Event};
                let e = if rng.one_in(2) {
                    Event::WatermarkEvent(AdvanceWatermark {
                        new_watermark: rng.next() as i64,
                        tag: format!("tag{}", rng.below(3)),
                    })
                } else {
                    Event::ElementEvent(AddElements {
                        elements: vec![beam::test_stream_payload::TimestampedElement {
                            encoded_element: (0..rng.below(8)).map(|_| rng.next() as u8).collect(),
                            timestamp: rng.next() as i64,
                        }],
                        tag: String::new(),
                    })
                };
                p.events.push(beam::test_stream_payload::Event { event: Some(e) });
            }
            spec.payload = p.encode_to_vec();
            return;
        }
    }
    // Otherwise an id where the payload was (a composite's leftovers, a Read).
    let _ = (transform, ws);
    spec.payload = coder.as_bytes().to_vec();
}

/// A random trigger about `depth` levels deep.
fn random_trigger(rng: &mut Rng, depth: usize) -> beam::Trigger {
    use beam::trigger::Trigger as T;
    let mut t = beam::Trigger {
        trigger: Some(match rng.below(4) {
            0 => T::Always(Default::default()),
            1 => T::Never(Default::default()),
            2 => T::ElementCount(beam::trigger::ElementCount {
                element_count: rng.next() as i32,
            }),
            _ => T::Default(Default::default()),
        }),
    };
    for _ in 1..depth {
        t = beam::Trigger {
            trigger: Some(match rng.below(4) {
                0 => T::Repeat(Box::new(beam::trigger::Repeat {
                    subtrigger: Some(Box::new(t)),
                })),
                1 => T::AfterAny(beam::trigger::AfterAny { subtriggers: vec![t] }),
                2 => T::OrFinally(Box::new(beam::trigger::OrFinally {
                    main: Some(Box::new(t)),
                    finally: None,
                })),
                _ => T::AfterEndOfWindow(Box::new(beam::trigger::AfterEndOfWindow {
                    early_firings: Some(Box::new(t)),
                    late_firings: None,
                })),
            }),
        };
    }
    t
}

/// A random option value about `depth` levels deep.
fn random_value(rng: &mut Rng, depth: usize) -> Value {
    let kind = if depth == 0 {
        match rng.below(5) {
            0 => Kind::NumberValue(match rng.below(4) {
                0 => f64::NAN,
                1 => -1.0,
                2 => 1e300,
                _ => rng.below(1_000_000) as f64,
            }),
            1 => Kind::BoolValue(rng.one_in(2)),
            2 => Kind::NullValue(0),
            3 => Kind::StringValue("x".repeat(if rng.one_in(10) { 200_000 } else { rng.below(40) })),
            _ => Kind::StringValue(["true", "-5", "gs://b/x", "/tmp/fuzz", "THROUGHPUT_BASED", "", "1e9", "{\"a\":"][rng.below(8)].into()),
        }
    } else if rng.one_in(2) {
        Kind::ListValue(ListValue {
            values: vec![random_value(rng, depth - 1)],
        })
    } else {
        Kind::StructValue(Struct {
            fields: [(format!("k{}", rng.below(3)), random_value(rng, depth - 1))].into(),
        })
    };
    Value { kind: Some(kind) }
}

/// One mutation of a job's pipeline options.
pub fn mutate_options(rng: &mut Rng, o: &mut Struct) {
    const NAMES: &[&str] = &[
        "num_workers",
        "max_num_workers",
        "autoscaling_algorithm",
        "number_of_worker_harness_threads",
        "staging_location",
        "temp_location",
        "job_name",
        "streaming",
        "experiments",
        "environment_config",
        "sdk_worker_parallelism",
        "runner",
        "go_options",
    ];
    let key = if rng.one_in(3) {
        let mut keys: Vec<String> = o.fields.keys().cloned().collect();
        keys.sort();
        rng.pick(&keys).cloned().unwrap_or_default()
    } else {
        format!("beam:option:{}:v1", NAMES[rng.below(NAMES.len())])
    };
    if rng.one_in(6) {
        o.fields.remove(&key);
    } else {
        let depth = if rng.one_in(4) { rng.below(60) } else { 0 };
        o.fields.insert(key, random_value(rng, depth));
    }
}
