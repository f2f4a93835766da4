//! The captured seeds are real, valid pipelines: each one plans (so the
//! planner's validation accepts what Beam's Python, Java and Go SDKs send),
//! and mutations of them are reproducible from the RNG seed.

use prost::Message;
use weir_proto::beam;

fn seeds() -> Vec<(String, beam::PrepareJobRequest)> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fuzz/seeds");
    let mut out = vec![];
    for sdk in ["python", "java", "go"] {
        let path = dir.join(format!("{sdk}_wordcount.pb"));
        let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        out.push((sdk.to_string(), beam::PrepareJobRequest::decode(bytes.as_slice()).unwrap()));
    }
    out
}

#[test]
fn every_captured_seed_plans() {
    for (sdk, req) in seeds() {
        let plan = weir_plan::plan(
            req.pipeline.as_ref().unwrap(),
            &weir_plan::PlanOptions {
                fn_api_url: "localhost:1".into(),
                ..Default::default()
            },
        )
        .unwrap_or_else(|e| panic!("{sdk}: {e}"));
        assert!(plan.graph.stages.len() >= 3, "{sdk}: {} stages", plan.graph.stages.len());
    }
}

#[test]
fn mutations_are_reproducible_and_change_the_request() {
    let m = weir_fuzz::Mutator::new(seeds());
    let run = |seed| {
        let mut rng = weir_fuzz::Rng::new(seed);
        (0..50).map(|_| m.request(&mut rng).1.encode_to_vec()).collect::<Vec<_>>()
    };
    let (a, b) = (run(7), run(7));
    assert_eq!(a, b);
    let originals: Vec<Vec<u8>> = seeds().iter().map(|(_, r)| r.encode_to_vec()).collect();
    let changed = a.iter().filter(|c| !originals.contains(c)).count();
    assert!(changed >= 45, "only {changed} of 50 mutations changed their seed");
}
