//! Leaf transforms: walks composites down to primitives and classifies them by URN.

use prost::Message;
use weir_proto::{beam, urns};

use crate::{PlanError, Result};

/// Who executes a leaf transform.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum LeafKind {
    Impulse,
    TestStream,
    GroupByKey,
    Flatten,
    Reshuffle,
    /// Executed by an SDK harness inside a fused stage.
    Sdk,
}

const SDK_URNS: &[&str] = &[
    urns::transform::PAR_DO,
    urns::transform::WINDOW_INTO,
    urns::transform::COMBINE_PER_KEY_PRECOMBINE,
    urns::transform::COMBINE_PER_KEY_MERGE_ACCUMULATORS,
    urns::transform::COMBINE_PER_KEY_EXTRACT_OUTPUTS,
    urns::transform::COMBINE_PER_KEY_CONVERT_TO_ACCUMULATORS,
    urns::transform::COMBINE_GROUPED_VALUES,
    urns::transform::TO_STRING,
    urns::transform::MAP_WINDOWS,
    urns::transform::SDF_PAIR_WITH_RESTRICTION,
    urns::transform::SDF_SPLIT_AND_SIZE_RESTRICTIONS,
    urns::transform::SDF_PROCESS_SIZED_ELEMENTS_AND_RESTRICTIONS,
    urns::transform::SDF_TRUNCATE_SIZED_RESTRICTIONS,
];

/// Requirements (`Pipeline.requirements`) Weir can honour today.
const SUPPORTED_REQUIREMENTS: &[&str] = &[
    urns::requirement::SPLITTABLE_DOFN,
    urns::requirement::BUNDLE_FINALIZATION,
    urns::requirement::STATEFUL_PROCESSING,
    urns::requirement::ON_WINDOW_EXPIRATION,
    // Honoured by a fusion break before each such ParDo (see fusion.rs).
    urns::requirement::REQUIRES_STABLE_INPUT,
    // Honoured by the stateful stage's operator (SdkStage::time_sorted).
    urns::requirement::REQUIRES_TIME_SORTED_INPUT,
];

/// Rejects a pipeline that declares a requirement Weir does not implement.
pub(crate) fn check_requirements(pipeline: &beam::Pipeline) -> Result<()> {
    for r in &pipeline.requirements {
        if !SUPPORTED_REQUIREMENTS.contains(&r.as_str()) {
            return Err(PlanError::Unsupported {
                transform: "<pipeline>".into(),
                urn: r.clone(),
                feature: format!("pipeline requirement {r}"),
            });
        }
    }
    Ok(())
}

/// The Prepare error (INVALID_ARGUMENT) for a ParDo with
/// @RequiresTimeSortedInput that has no state or timers: its input is not
/// keyed, and Beam defines the order per key of a stateful DoFn.
fn time_sorted_refusal(transform: &str) -> PlanError {
    PlanError::Invalid(format!(
        "transform {transform} requires {} but has no state or timers: Weir sorts the \
         input of a stateful ParDo (per key); add state, or sort inside the DoFn",
        urns::requirement::REQUIRES_TIME_SORTED_INPUT
    ))
}

/// The URN of a transform ("" when it has no spec).
pub(crate) fn urn_of(t: &beam::PTransform) -> &str {
    t.spec.as_ref().map(|s| s.urn.as_str()).unwrap_or("")
}

/// Classifies a leaf transform, rejecting what Weir cannot run.
pub(crate) fn classify(id: &str, t: &beam::PTransform) -> Result<LeafKind> {
    let urn = urn_of(t);
    let unsupported = |feature: &str| PlanError::Unsupported {
        transform: format!("{id} ({})", t.unique_name),
        urn: urn.to_string(),
        feature: feature.to_string(),
    };
    Ok(match urn {
        urns::transform::IMPULSE => LeafKind::Impulse,
        urns::transform::GROUP_BY_KEY => LeafKind::GroupByKey,
        urns::transform::FLATTEN if id.contains(crate::transcode::TRANSCODE_MARKER) => {
            LeafKind::Sdk
        }
        urns::transform::FLATTEN => LeafKind::Flatten,
        urns::transform::RESHUFFLE
        | urns::transform::REDISTRIBUTE_ARBITRARILY
        | urns::transform::REDISTRIBUTE_BY_KEY => LeafKind::Reshuffle,
        urns::transform::TEST_STREAM => LeafKind::TestStream,
        urns::transform::PAR_DO => {
            let payload = pardo_payload(id, t)?;
            for (name, spec) in &payload.state_specs {
                check_state_spec(name, spec).map_err(|feature| unsupported(&feature))?;
            }
            if payload.requires_time_sorted_input
                && payload.state_specs.is_empty()
                && payload.timer_family_specs.is_empty()
            {
                return Err(time_sorted_refusal(&format!("{id} ({})", t.unique_name)));
            }
            for (name, side) in &payload.side_inputs {
                let pattern = side
                    .access_pattern
                    .as_ref()
                    .map(|a| a.urn.as_str())
                    .unwrap_or("");
                if pattern != urns::side_input::ITERABLE && pattern != urns::side_input::MULTIMAP {
                    return Err(PlanError::Unsupported {
                        transform: format!("{id} ({})", t.unique_name),
                        urn: pattern.to_string(),
                        feature: format!("side input {name} access pattern"),
                    });
                }
            }
            LeafKind::Sdk
        }
        u if SDK_URNS.contains(&u) => LeafKind::Sdk,
        "" => {
            return Err(PlanError::Invalid(format!(
                "transform {id} ({}) has no URN and no subtransforms",
                t.unique_name
            )))
        }
        _ => return Err(unsupported("unknown primitive transform")),
    })
}

/// Accepts a user-state spec Weir's State API serves: ReadModifyWrite, Bag,
/// Combining and Set (`beam:user_state:bag:v1` in the Python SDK), Map and
/// Multimap (`beam:user_state:multimap:v1`) and OrderedList
/// (`beam:user_state:ordered_list:v1`). The `protocol` says which `StateKey`
/// kinds the SDK will use; an unknown one is refused. `Err` names the state.
fn check_state_spec(name: &str, spec: &beam::StateSpec) -> std::result::Result<(), String> {
    const SERVED: [&str; 3] = [
        urns::user_state::BAG,
        urns::user_state::MULTIMAP,
        urns::user_state::ORDERED_LIST,
    ];
    let protocol = spec.protocol.as_ref().map(|p| p.urn.as_str()).unwrap_or("");
    if protocol.is_empty() && spec.spec.is_none() {
        return Err(format!("user state {name} without a spec or protocol"));
    }
    if protocol.is_empty() || SERVED.contains(&protocol) {
        Ok(())
    } else {
        Err(format!(
            "user state {name} with protocol {protocol} (Weir serves {})",
            SERVED.join(", ")
        ))
    }
}

/// True for a ParDo with user state or timers.
pub(crate) fn is_stateful(id: &str, t: &beam::PTransform) -> Result<bool> {
    if urn_of(t) != urns::transform::PAR_DO {
        return Ok(false);
    }
    let p = pardo_payload(id, t)?;
    Ok(!p.state_specs.is_empty() || !p.timer_family_specs.is_empty())
}

/// Decodes the `ParDoPayload` of a `beam:transform:pardo:v1` transform.
pub(crate) fn pardo_payload(id: &str, t: &beam::PTransform) -> Result<beam::ParDoPayload> {
    let bytes = t.spec.as_ref().map(|s| s.payload.as_slice()).unwrap_or(&[]);
    beam::ParDoPayload::decode(bytes).map_err(|e| {
        PlanError::Invalid(format!(
            "transform {id} ({}): bad ParDoPayload: {e}",
            t.unique_name
        ))
    })
}

/// Whether composite `t` runs as Weir's own transform rather than as its
/// subtransforms: a Reshuffle or Redistribute
/// (`beam:transform:reshuffle:v1`, `beam:transform:redistribute_*:v1`) with
/// one input and one output of the same coder and windowing strategy runs
/// as the runner's Reshuffle, an identity that redistributes elements, as
/// Prism runs it (Dataflow runs it as its own shuffle). Its expansion
/// (random keys, a GroupByKey, and back) costs SDK work on every element
/// and holds all of them until the watermark passes.
fn runs_natively(c: &beam::Components, t: &beam::PTransform) -> bool {
    let urn = urn_of(t);
    if urn != urns::transform::RESHUFFLE
        && urn != urns::transform::REDISTRIBUTE_ARBITRARILY
        && urn != urns::transform::REDISTRIBUTE_BY_KEY
    {
        return false;
    }
    let (Some(input), Some(output)) = (only(&t.inputs), only(&t.outputs)) else {
        return false;
    };
    let (Some(input), Some(output)) = (c.pcollections.get(input), c.pcollections.get(output)) else {
        return false;
    };
    let windowing = |pc: &beam::PCollection| c.windowing_strategies.get(&pc.windowing_strategy_id);
    same_coder(c, &input.coder_id, &output.coder_id, 0)
        && windowing(input).is_some()
        && windowing(input) == windowing(output)
        && !leaks_a_pcollection(c, t)
}

/// Whether a transform outside composite `t` reads one of the PCollections
/// `t`'s subtransforms make, other than `t`'s outputs: then `t` cannot be
/// replaced by one transform.
fn leaks_a_pcollection(c: &beam::Components, t: &beam::PTransform) -> bool {
    let mut inside: std::collections::HashSet<&str> = std::collections::HashSet::new();
    let mut made: std::collections::HashSet<&str> = std::collections::HashSet::new();
    let mut stack: Vec<&str> = t.subtransforms.iter().map(String::as_str).collect();
    while let Some(id) = stack.pop() {
        if !inside.insert(id) {
            continue;
        }
        if let Some(sub) = c.transforms.get(id) {
            stack.extend(sub.subtransforms.iter().map(String::as_str));
            made.extend(sub.outputs.values().map(String::as_str));
        }
    }
    for out in t.outputs.values() {
        made.remove(out.as_str());
    }
    c.transforms.iter().any(|(id, other)| {
        other.subtransforms.is_empty()
            && !inside.contains(id.as_str())
            && other.inputs.values().any(|pc| made.contains(pc.as_str()))
    })
}

/// The one PCollection id of a transform's inputs or outputs `m`: its only
/// value, or the value all its names share. None when it has none or
/// several.
pub(crate) fn only(m: &std::collections::HashMap<String, String>) -> Option<&String> {
    let mut values = m.values();
    let first = values.next()?;
    values.all(|v| v == first).then_some(first)
}

/// Whether coders `a` and `b` of `c` are the same coder: the same id, or
/// the same spec with the same components (at most 32 levels deep).
fn same_coder(c: &beam::Components, a: &str, b: &str, depth: usize) -> bool {
    if a == b {
        return c.coders.contains_key(a);
    }
    let (Some(x), Some(y)) = (c.coders.get(a), c.coders.get(b)) else {
        return false;
    };
    depth < 32
        && x.spec == y.spec
        && x.component_coder_ids.len() == y.component_coder_ids.len()
        && x.component_coder_ids
            .iter()
            .zip(&y.component_coder_ids)
            .all(|(a, b)| same_coder(c, a, b, depth + 1))
}

/// Leaf transform ids reachable from the roots, in discovery order. A
/// transform with subtransforms is a composite and is replaced by its leaves.
/// Liftable `combine_per_key` composites are replaced by their lifted form.
pub(crate) fn collect(pipeline: &beam::Pipeline, c: &mut beam::Components) -> Result<Vec<String>> {
    let mut out = Vec::new();
    let mut stack: Vec<String> = pipeline.root_transform_ids.iter().rev().cloned().collect();
    while let Some(id) = stack.pop() {
        let id = &id;
        if let Some(lifted) = crate::combiner_lifting::lift(c, id)? {
            out.extend(lifted);
            continue;
        }
        let t = c
            .transforms
            .get(id)
            .ok_or_else(|| PlanError::Invalid(format!("unknown transform id {id:?}")))?;
        if !t.subtransforms.is_empty() && !runs_natively(c, t) {
            stack.extend(t.subtransforms.iter().rev().cloned());
            continue;
        }
        if urn_of(t).is_empty() && t.inputs.is_empty() && t.outputs.is_empty() {
            continue; // an empty composite, e.g. the root of an empty pipeline
        }
        if !t.outputs.is_empty()
            && t.outputs
                .values()
                .all(|o| t.inputs.values().any(|i| i == o))
        {
            // A composite whose expansion returned its input unchanged (e.g.
            // Python's Create/MaybeReshuffle of one element in streaming):
            // it has no subtransforms and nothing to run.
            // A primitive can't read what it writes; another URN (Python's
            // composites come as beam:transform:pickled_python:v1) is such
            // a composite.
            let t_urn = urn_of(t);
            if ![
                urns::transform::PAR_DO,
                urns::transform::GROUP_BY_KEY,
                urns::transform::FLATTEN,
                urns::transform::IMPULSE,
                urns::transform::WINDOW_INTO,
            ]
            .contains(&t_urn)
            {
                continue;
            }
            return Err(PlanError::Invalid(format!(
                "transform {id} ({}, {}) reads its own output PCollection {}: the pipeline's transforms form a cycle",
                t.unique_name,
                urn_of(t),
                t.outputs.values().next().map(String::as_str).unwrap_or_default()
            )));
        }
        classify(id, t)?;
        out.push(id.clone());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Impulse -> Reshuffle composite (one subtransform `Inner`) -> nothing;
    /// the composite's output has coder `out_coder`, its input "bytes".
    fn reshuffle_pipeline(urn: &str, out_coder: &str) -> (beam::Pipeline, beam::Components) {
        let pardo = |name: &str, input: &str, output: &str| beam::PTransform {
            unique_name: name.into(),
            spec: Some(beam::FunctionSpec { urn: urns::transform::PAR_DO.into(), payload: vec![] }),
            inputs: [("in".to_string(), input.to_string())].into(),
            outputs: [("out".to_string(), output.to_string())].into(),
            ..Default::default()
        };
        let coder = |urn: &str, components: &[&str]| beam::Coder {
            spec: Some(beam::FunctionSpec { urn: urn.into(), payload: vec![] }),
            component_coder_ids: components.iter().map(|c| c.to_string()).collect(),
        };
        let pc = |coder: &str| beam::PCollection {
            coder_id: coder.into(),
            windowing_strategy_id: "ws".into(),
            ..Default::default()
        };
        let c = beam::Components {
            transforms: [
                (
                    "impulse".to_string(),
                    beam::PTransform {
                        unique_name: "Impulse".into(),
                        spec: Some(beam::FunctionSpec { urn: urns::transform::IMPULSE.into(), payload: vec![] }),
                        outputs: [("out".to_string(), "a".to_string())].into(),
                        ..Default::default()
                    },
                ),
                (
                    "reshuffle".to_string(),
                    beam::PTransform {
                        unique_name: "Reshuffle".into(),
                        spec: Some(beam::FunctionSpec { urn: urn.into(), payload: vec![] }),
                        inputs: [("in".to_string(), "a".to_string())].into(),
                        outputs: [("out".to_string(), "b".to_string())].into(),
                        subtransforms: vec!["inner".into()],
                        ..Default::default()
                    },
                ),
                ("inner".to_string(), pardo("Reshuffle/Inner", "a", "b")),
            ]
            .into(),
            pcollections: [("a".to_string(), pc("bytes")), ("b".to_string(), pc(out_coder))].into(),
            coders: [
                ("bytes".to_string(), coder("beam:coder:bytes:v1", &[])),
                ("bytes2".to_string(), coder("beam:coder:bytes:v1", &[])),
                ("lp".to_string(), coder("beam:coder:length_prefix:v1", &["bytes"])),
            ]
            .into(),
            windowing_strategies: [("ws".to_string(), beam::WindowingStrategy::default())].into(),
            environments: Default::default(),
        };
        let p = beam::Pipeline {
            root_transform_ids: vec!["impulse".into(), "reshuffle".into()],
            ..Default::default()
        };
        (p, c)
    }

    #[test]
    fn a_reshuffle_composite_of_one_coder_runs_as_weirs_reshuffle() {
        for urn in [
            urns::transform::RESHUFFLE,
            urns::transform::REDISTRIBUTE_ARBITRARILY,
            urns::transform::REDISTRIBUTE_BY_KEY,
        ] {
            // The same coder, by id or by spec: the composite is a leaf.
            for out in ["bytes", "bytes2"] {
                let (p, mut c) = reshuffle_pipeline(urn, out);
                assert_eq!(collect(&p, &mut c).unwrap(), ["impulse", "reshuffle"], "{urn} {out}");
                assert_eq!(classify("reshuffle", &c.transforms["reshuffle"]).unwrap(), LeafKind::Reshuffle);
            }
            // Another coder: its expansion runs.
            let (p, mut c) = reshuffle_pipeline(urn, "lp");
            assert_eq!(collect(&p, &mut c).unwrap(), ["impulse", "inner"], "{urn}");
        }
        // Another windowing strategy: its expansion runs.
        let (p, mut c) = reshuffle_pipeline(urns::transform::RESHUFFLE, "bytes");
        c.windowing_strategies.insert(
            "ws2".into(),
            beam::WindowingStrategy { allowed_lateness: 5, ..Default::default() },
        );
        c.pcollections.get_mut("b").unwrap().windowing_strategy_id = "ws2".into();
        assert_eq!(collect(&p, &mut c).unwrap(), ["impulse", "inner"]);
        // Any other composite runs as its subtransforms.
        let (p, mut c) = reshuffle_pipeline("beam:transform:generic_composite:v1", "bytes");
        assert_eq!(collect(&p, &mut c).unwrap(), ["impulse", "inner"]);
    }

    /// A transform outside the composite that reads a PCollection made
    /// inside it keeps the expansion (the composite is no one transform).
    #[test]
    fn a_reshuffle_whose_inner_pcollection_is_read_outside_runs_its_expansion() {
        let (mut p, mut c) = reshuffle_pipeline(urns::transform::RESHUFFLE, "bytes");
        // Inner now makes "mid" (then Inner2 makes "b"); Outside reads "mid".
        let inner = c.transforms.get_mut("inner").unwrap();
        inner.outputs = [("out".to_string(), "mid".to_string())].into();
        let mut inner2 = inner.clone();
        inner2.unique_name = "Reshuffle/Inner2".into();
        inner2.inputs = [("in".to_string(), "mid".to_string())].into();
        inner2.outputs = [("out".to_string(), "b".to_string())].into();
        let mut outside = inner2.clone();
        outside.unique_name = "Outside".into();
        outside.outputs = [("out".to_string(), "c".to_string())].into();
        c.transforms.insert("inner2".into(), inner2);
        c.transforms.get_mut("reshuffle").unwrap().subtransforms = vec!["inner".into(), "inner2".into()];
        for pc in ["mid", "c"] {
            let b = c.pcollections["b"].clone();
            c.pcollections.insert(pc.into(), b);
        }
        assert_eq!(collect(&p, &mut c.clone()).unwrap(), ["impulse", "reshuffle"]);
        c.transforms.insert("outside".into(), outside);
        p.root_transform_ids.push("outside".into());
        assert_eq!(collect(&p, &mut c).unwrap(), ["impulse", "inner", "inner2", "outside"]);
    }

    fn spec(kind: Option<beam::state_spec::Spec>, protocol: &str) -> beam::StateSpec {
        beam::StateSpec {
            protocol: (!protocol.is_empty()).then(|| beam::FunctionSpec {
                urn: protocol.to_string(),
                payload: vec![],
            }),
            spec: kind,
        }
    }

    #[test]
    fn state_specs_weir_serves_are_accepted() {
        use beam::state_spec::Spec;
        let cases = [
            (Spec::BagSpec(Default::default()), urns::user_state::BAG),
            (Spec::SetSpec(Default::default()), urns::user_state::BAG),
            (
                Spec::MapSpec(Default::default()),
                urns::user_state::MULTIMAP,
            ),
            (
                Spec::MultimapSpec(Default::default()),
                urns::user_state::MULTIMAP,
            ),
            (
                Spec::OrderedListSpec(Default::default()),
                urns::user_state::ORDERED_LIST,
            ),
        ];
        for (kind, protocol) in cases {
            assert_eq!(
                check_state_spec("s", &spec(Some(kind.clone()), protocol)),
                Ok(())
            );
            assert_eq!(check_state_spec("s", &spec(Some(kind), "")), Ok(()));
        }
    }

    #[test]
    fn on_window_expiration_is_accepted_and_unknown_requirements_are_named() {
        let pipeline = |r: &str| beam::Pipeline {
            requirements: vec![r.to_string()],
            ..Default::default()
        };
        assert!(check_requirements(&pipeline(urns::requirement::ON_WINDOW_EXPIRATION)).is_ok());
        match check_requirements(&pipeline("beam:requirement:pardo:weir_test_unknown:v1")) {
            Err(PlanError::Unsupported { urn, feature, .. }) => {
                assert_eq!(urn, "beam:requirement:pardo:weir_test_unknown:v1");
                assert!(feature.contains(&urn), "{feature}");
            }
            other => panic!("expected Unsupported, got {other:?}"),
        }
        let t = beam::PTransform {
            unique_name: "Expiring".into(),
            spec: Some(beam::FunctionSpec {
                urn: urns::transform::PAR_DO.into(),
                payload: beam::ParDoPayload {
                    on_window_expiration_timer_family_spec: "expiry".into(),
                    ..Default::default()
                }
                .encode_to_vec(),
            }),
            ..Default::default()
        };
        assert_eq!(classify("t1", &t).unwrap(), LeafKind::Sdk);
    }

    #[test]
    fn time_sorted_input_is_accepted_for_a_stateful_pardo_and_refused_without_state() {
        let sorted = |stateful: bool| beam::PTransform {
            unique_name: "SortedDoFn".into(),
            spec: Some(beam::FunctionSpec {
                urn: urns::transform::PAR_DO.into(),
                payload: beam::ParDoPayload {
                    requires_time_sorted_input: true,
                    state_specs: if stateful {
                        [(
                            "last".to_string(),
                            beam::StateSpec {
                                spec: Some(beam::state_spec::Spec::ReadModifyWriteSpec(
                                    beam::ReadModifyWriteStateSpec { coder_id: "c".into() },
                                )),
                                ..Default::default()
                            },
                        )]
                        .into()
                    } else {
                        Default::default()
                    },
                    ..Default::default()
                }
                .encode_to_vec(),
            }),
            ..Default::default()
        };
        let pipeline = |r: &str| beam::Pipeline {
            requirements: vec![r.to_string()],
            ..Default::default()
        };
        assert_eq!(
            urns::requirement::REQUIRES_TIME_SORTED_INPUT,
            "beam:requirement:pardo:time_sorted_input:v1"
        );
        for r in [
            urns::requirement::REQUIRES_STABLE_INPUT,
            urns::requirement::REQUIRES_TIME_SORTED_INPUT,
        ] {
            assert!(check_requirements(&pipeline(r)).is_ok(), "{r}");
        }
        assert_eq!(classify("t7", &sorted(true)).unwrap(), LeafKind::Sdk);
        match classify("t7", &sorted(false)).unwrap_err() {
            PlanError::Invalid(m) => assert!(
                m.starts_with(
                    "transform t7 (SortedDoFn) requires beam:requirement:pardo:time_sorted_input:v1 but has no state or timers"
                ),
                "{m}"
            ),
            other => panic!("expected Invalid, got {other:?}"),
        }
    }

    #[test]
    fn unknown_state_protocol_and_empty_spec_are_refused() {
        let err = check_state_spec(
            "counts",
            &spec(
                Some(beam::state_spec::Spec::BagSpec(Default::default())),
                "beam:user_state:fancy:v1",
            ),
        )
        .unwrap_err();
        assert!(
            err.contains("counts") && err.contains("beam:user_state:fancy:v1"),
            "{err}"
        );
        let err = check_state_spec("empty", &spec(None, "")).unwrap_err();
        assert!(err.contains("empty"), "{err}");
    }
}
