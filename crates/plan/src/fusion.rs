//! Greedy fusion: SDK transforms join the stage of the transform that produces
//! their main input, unless the environment differs, they read side inputs
//! (the side input must be complete before the stage runs, and may itself be
//! computed from this stage), or they are an SDF process step (so the runner
//! can spread restrictions over workers), or are stateful (their input must be
//! routed by key), or require stable input (`beam:requirement:pardo:stable_input:v1`:
//! their input is materialized by the runner, so a retried bundle reads
//! exactly the elements of the failed attempt). Runner transforms are stages alone.

use std::collections::{BTreeSet, HashMap};

use weir_proto::beam;

use crate::leaves::{classify, is_stateful, pardo_payload, urn_of, LeafKind};
use crate::sdf::PROCESS_SUFFIX;
use crate::{PlanError, Result};

/// A stage before descriptors are built, in terms of proto ids.
#[derive(Debug)]
pub(crate) enum FusedStage {
    Runner {
        kind: LeafKind,
        transform_id: String,
    },
    Sdk {
        environment_id: String,
        input: String,
        transforms: Vec<String>,
    },
}

/// The main and side input PCollection ids of a leaf.
pub(crate) fn split_inputs(
    id: &str,
    t: &beam::PTransform,
) -> Result<(Vec<String>, Vec<(String, String)>)> {
    let side_names: BTreeSet<String> = if urn_of(t) == weir_proto::urns::transform::PAR_DO
        || urn_of(t).starts_with("beam:transform:sdf_")
    {
        pardo_payload(id, t)?.side_inputs.keys().cloned().collect()
    } else {
        BTreeSet::new()
    };
    let mut main = Vec::new();
    let mut side = Vec::new();
    let mut names: Vec<_> = t.inputs.iter().collect();
    names.sort();
    for (name, pc) in names {
        if side_names.contains(name) {
            side.push((name.clone(), pc.clone()));
        } else {
            main.push(pc.clone());
        }
    }
    Ok((main, side))
}

/// Orders leaves so producers come before consumers (Kahn's algorithm, ties
/// broken by discovery order so plans are deterministic).
fn topo_order(c: &beam::Components, leaves: &[String]) -> Result<Vec<String>> {
    let mut producer: HashMap<&str, usize> = HashMap::new();
    for (i, id) in leaves.iter().enumerate() {
        for pc in c.transforms[id].outputs.values() {
            if let Some(other) = producer.insert(pc, i) {
                let other = &leaves[other];
                return Err(PlanError::Invalid(format!(
                    "PCollection {pc} is the output of two transforms, {other} ({}) and {id} ({}); a PCollection has one producer",
                    c.transforms[other].unique_name, c.transforms[id].unique_name
                )));
            }
        }
    }
    let mut indegree = vec![0usize; leaves.len()];
    let mut consumers: Vec<Vec<usize>> = vec![vec![]; leaves.len()];
    let mut producers: Vec<Vec<usize>> = vec![vec![]; leaves.len()];
    for (i, id) in leaves.iter().enumerate() {
        let mut deps = BTreeSet::new();
        for pc in c.transforms[id].inputs.values() {
            match producer.get(pc.as_str()) {
                Some(&p) => {
                    deps.insert(p);
                }
                None => {
                    return Err(PlanError::Invalid(format!(
                        "transform {id} ({}) reads PCollection {pc}, which no transform produces",
                        c.transforms[id].unique_name
                    )))
                }
            }
        }
        indegree[i] = deps.len();
        for d in deps {
            consumers[d].push(i);
            producers[i].push(d);
        }
    }
    let mut ready: BTreeSet<usize> = (0..leaves.len()).filter(|&i| indegree[i] == 0).collect();
    let mut order = Vec::with_capacity(leaves.len());
    while let Some(i) = ready.pop_first() {
        order.push(leaves[i].clone());
        for &j in &consumers[i] {
            indegree[j] -= 1;
            if indegree[j] == 0 {
                ready.insert(j);
            }
        }
    }
    if order.len() != leaves.len() {
        return Err(PlanError::Invalid(format!(
            "the pipeline's transforms form a cycle: {}",
            cycle(c, leaves, &indegree, &producers)
        )));
    }
    Ok(order)
}

/// One cycle among the transforms Kahn's algorithm left (those still with
/// unmet inputs), as "a (name) -> b (name) -> a": each feeds the next.
fn cycle(c: &beam::Components, leaves: &[String], indegree: &[usize], producers: &[Vec<usize>]) -> String {
    let Some(start) = (0..leaves.len()).find(|&i| indegree[i] > 0) else {
        return "(not found)".into();
    };
    // Every transform left reads from another one left: walk back until a
    // transform repeats.
    let mut path = vec![start];
    let mut seen: HashMap<usize, usize> = HashMap::from([(start, 0)]);
    loop {
        let at = *path.last().expect("not empty");
        let Some(&back) = producers[at].iter().find(|&&p| indegree[p] > 0) else {
            return "(not found)".into();
        };
        if let Some(&first) = seen.get(&back) {
            let mut ring: Vec<usize> = path[first..].to_vec();
            ring.reverse();
            ring.push(ring[0]);
            return ring
                .iter()
                .map(|&i| format!("{} ({})", leaves[i], c.transforms[&leaves[i]].unique_name))
                .collect::<Vec<_>>()
                .join(" -> ");
        }
        seen.insert(back, path.len());
        path.push(back);
    }
}

/// Fuses the leaves into stages, in topological order.
pub(crate) fn fuse(c: &beam::Components, leaves: &[String]) -> Result<Vec<FusedStage>> {
    let order = topo_order(c, leaves)?;
    let mut stages: Vec<FusedStage> = Vec::new();
    // PCollection id -> index of the SDK stage producing it.
    let mut sdk_stage_of: HashMap<String, usize> = HashMap::new();
    for id in order {
        let t = &c.transforms[&id];
        let kind = classify(&id, t)?;
        if kind != LeafKind::Sdk {
            stages.push(FusedStage::Runner {
                kind,
                transform_id: id,
            });
            continue;
        }
        let (main, side) = split_inputs(&id, t)?;
        let [input] = main.as_slice() else {
            return Err(PlanError::Unsupported {
                transform: format!("{id} ({})", t.unique_name),
                urn: urn_of(t).to_string(),
                feature: format!("an SDK transform with {} main inputs", main.len()),
            });
        };
        let env = t.environment_id.clone();
        // A stateful DoFn reads its input routed by key, so it starts a stage.
        let stateful = is_stateful(&id, t)?;
        // @RequiresStableInput: the input comes from runner-held data.
        let stable = urn_of(t) == weir_proto::urns::transform::PAR_DO
            && pardo_payload(&id, t)?.requires_stable_input;
        let fuse_into = sdk_stage_of.get(input).copied().filter(|&s| {
            side.is_empty()
                && !id.ends_with(PROCESS_SUFFIX)
                && !stateful
                && !stable
                && matches!(&stages[s], FusedStage::Sdk { environment_id, .. } if *environment_id == env)
        });
        let stage = match fuse_into {
            Some(s) => {
                if let FusedStage::Sdk { transforms, .. } = &mut stages[s] {
                    transforms.push(id.clone());
                }
                s
            }
            None => {
                stages.push(FusedStage::Sdk {
                    environment_id: env,
                    input: input.clone(),
                    transforms: vec![id.clone()],
                });
                stages.len() - 1
            }
        };
        for pc in t.outputs.values() {
            sdk_stage_of.insert(pc.clone(), stage);
        }
    }
    Ok(stages)
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;
    use weir_proto::urns;

    fn pardo(name: &str, input: &str, output: &str, stable: bool) -> beam::PTransform {
        beam::PTransform {
            unique_name: name.into(),
            spec: Some(beam::FunctionSpec {
                urn: urns::transform::PAR_DO.into(),
                payload: beam::ParDoPayload {
                    requires_stable_input: stable,
                    ..Default::default()
                }
                .encode_to_vec(),
            }),
            inputs: [("in".to_string(), input.to_string())].into(),
            outputs: [("out".to_string(), output.to_string())].into(),
            environment_id: "py".into(),
            ..Default::default()
        }
    }

    /// Impulse -> A -> B -> C; `stable` says which of A, B, C require stable input.
    fn stages(stable: [bool; 3]) -> Vec<Vec<String>> {
        let mut c = beam::Components::default();
        c.transforms.insert(
            "imp".into(),
            beam::PTransform {
                unique_name: "Impulse".into(),
                spec: Some(beam::FunctionSpec {
                    urn: urns::transform::IMPULSE.into(),
                    ..Default::default()
                }),
                outputs: [("out".to_string(), "p0".to_string())].into(),
                ..Default::default()
            },
        );
        for (i, name) in ["a", "b", "c"].iter().enumerate() {
            c.transforms.insert(
                name.to_string(),
                pardo(name, &format!("p{i}"), &format!("p{}", i + 1), stable[i]),
            );
        }
        let leaves: Vec<String> = ["imp", "a", "b", "c"].map(String::from).to_vec();
        fuse(&c, &leaves)
            .unwrap()
            .into_iter()
            .filter_map(|s| match s {
                FusedStage::Sdk { transforms, .. } => Some(transforms),
                FusedStage::Runner { .. } => None,
            })
            .collect()
    }

    #[test]
    fn a_stable_input_pardo_starts_a_stage_reading_runner_held_data() {
        assert_eq!(stages([false; 3]), vec![vec!["a", "b", "c"]]);
        assert_eq!(
            stages([false, true, false]),
            vec![vec!["a"], vec!["b", "c"]]
        );
        assert_eq!(
            stages([false, true, true]),
            vec![vec!["a"], vec!["b"], vec!["c"]]
        );
    }
}
