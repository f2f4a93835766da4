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

/// Mutations change their seed, and what they make still encodes and
/// decodes to the same request. (Runs are not reproducible byte for byte:
/// prost writes map entries in hash order, which byte-level mutations see;
/// a failing case is saved as a file instead.)
#[test]
fn mutations_change_the_request_and_stay_well_formed() {
    let m = weir_fuzz::Mutator::new(seeds());
    let mut rng = weir_fuzz::Rng::new(7);
    let originals: Vec<beam::PrepareJobRequest> = seeds().into_iter().map(|(_, r)| r).collect();
    let mut changed = 0;
    for _ in 0..50 {
        let (_, req) = m.request(&mut rng);
        let back = beam::PrepareJobRequest::decode(req.encode_to_vec().as_slice()).unwrap();
        assert!(back == req);
        changed += usize::from(!originals.contains(&req));
    }
    assert!(changed >= 45, "only {changed} of 50 mutations changed their seed");
}
