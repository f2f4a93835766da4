//! Structural validation: the pipeline's recursive shapes (the composite
//! hierarchy, coder components, triggers) are finite, acyclic and within
//! documented depths before any other pass walks them.
//!
//! Every walk here uses an explicit stack, so no pipeline a client sends can
//! overflow the server's stack, and each visits every node at most once, so
//! its time and memory are linear in the size of the pipeline proto. The
//! later passes recurse (coders, triggers) or expand composites, and rely on
//! these checks to stay bounded.

use std::collections::HashMap;

use weir_proto::beam;

use crate::{PlanError, Result};

/// How deep composite transforms may nest (`PTransform.subtransforms` of
/// subtransforms...). Beam's SDKs nest a few dozen levels at most.
pub const MAX_COMPOSITE_DEPTH: usize = 256;

/// How deep coders may nest (`Coder.component_coder_ids` of components...).
pub const MAX_CODER_DEPTH: usize = 64;

/// How many coders one coder may expand to, counting a shared component
/// once per use (the planner and the model walk coders as trees: 64 levels
/// of `kv(c, c)` would otherwise be 2^64 nodes).
pub const MAX_CODER_NODES: usize = 10_000;

/// How deep triggers may nest (`Trigger` subtriggers, early and late firings).
pub const MAX_TRIGGER_DEPTH: usize = 64;

/// Checks the composite hierarchy, the coders and the triggers of `pipeline`.
///
/// # Errors
/// [`PlanError::Invalid`] naming the transform, coder or windowing strategy:
/// a transform that is (transitively) its own subtransform, a transform
/// listed twice (as a root or subtransform), an unknown subtransform id, a
/// composite nested deeper than [`MAX_COMPOSITE_DEPTH`]; a coder that is
/// (transitively) its own component, or nests deeper than
/// [`MAX_CODER_DEPTH`] or expands to more than [`MAX_CODER_NODES`]; a trigger deeper than [`MAX_TRIGGER_DEPTH`].
pub(crate) fn check(pipeline: &beam::Pipeline) -> Result<()> {
    let empty = beam::Components::default();
    let c = pipeline.components.as_ref().unwrap_or(&empty);
    transforms(&pipeline.root_transform_ids, &c.transforms)?;
    references(c)?;
    coders(&c.coders)?;
    for (id, ws) in sorted(&c.windowing_strategies) {
        if let Some(t) = &ws.trigger {
            if trigger_depth(t) > MAX_TRIGGER_DEPTH {
                return Err(PlanError::Invalid(format!(
                    "windowing strategy {id:?}: its trigger nests more than {MAX_TRIGGER_DEPTH} triggers deep"
                )));
            }
        }
    }
    Ok(())
}

/// Map entries in id order, so the first error reported is deterministic.
fn sorted<V>(m: &HashMap<String, V>) -> Vec<(&String, &V)> {
    let mut v: Vec<_> = m.iter().collect();
    v.sort_by(|a, b| a.0.cmp(b.0));
    v
}

fn named(id: &str, transforms: &HashMap<String, beam::PTransform>) -> String {
    match transforms.get(id) {
        Some(t) => format!("{id} ({})", t.unique_name),
        None => id.to_string(),
    }
}

/// Walks the composite hierarchy from the roots: each transform once, no
/// cycles, bounded depth.
fn transforms(roots: &[String], transforms: &HashMap<String, beam::PTransform>) -> Result<()> {
    // Where each visited transform was listed (its parent; None for a root).
    let mut parent: HashMap<&str, Option<&str>> = HashMap::new();
    // (transform id, depth) still to visit.
    let mut stack: Vec<(&str, Option<&str>, usize)> =
        roots.iter().rev().map(|r| (r.as_str(), None, 1)).collect();
    while let Some((id, from, depth)) = stack.pop() {
        let Some(t) = transforms.get(id) else {
            return Err(PlanError::Invalid(match from {
                Some(p) => format!(
                    "transform {} lists unknown subtransform id {id:?}",
                    named(p, transforms)
                ),
                None => format!("unknown root transform id {id:?}"),
            }));
        };
        if let Some(&first) = parent.get(id) {
            // Seen before: a cycle if `id` is an ancestor of `from`, else listed twice.
            let mut ancestor = from;
            let mut chain = vec![id];
            while let Some(a) = ancestor {
                chain.push(a);
                if a == id {
                    chain.reverse();
                    let shown: Vec<String> = chain.iter().map(|t| named(t, transforms)).collect();
                    return Err(PlanError::Invalid(format!(
                        "transform {} is its own subtransform (composite cycle {})",
                        named(id, transforms),
                        shown.join(" -> ")
                    )));
                }
                ancestor = parent.get(a).copied().flatten();
                if chain.len() > MAX_COMPOSITE_DEPTH + 1 {
                    break;
                }
            }
            let place = |p: Option<&str>| match p {
                Some(p) => format!("a subtransform of {}", named(p, transforms)),
                None => "a root transform".to_string(),
            };
            return Err(PlanError::Invalid(format!(
                "transform {} is listed twice in the composite hierarchy: as {} and as {}",
                named(id, transforms),
                place(first),
                place(from)
            )));
        }
        if depth > MAX_COMPOSITE_DEPTH {
            return Err(PlanError::Invalid(format!(
                "transform {} nests more than {MAX_COMPOSITE_DEPTH} composites deep",
                named(id, transforms)
            )));
        }
        parent.insert(id, from);
        for s in t.subtransforms.iter().rev() {
            stack.push((s.as_str(), Some(id), depth + 1));
        }
    }
    Ok(())
}

/// Checks that every coder a PCollection or a coder names is in the
/// components, so that no such pipeline runs to a late failure (or, for a
/// PCollection the runner never reads, to DONE).
fn references(c: &beam::Components) -> Result<()> {
    for (id, pc) in sorted(&c.pcollections) {
        if !c.coders.contains_key(&pc.coder_id) {
            return Err(PlanError::Invalid(format!(
                "PCollection {id} ({}): unknown coder id {:?}",
                pc.unique_name, pc.coder_id
            )));
        }
    }
    for (id, coder) in sorted(&c.coders) {
        if let Some(missing) = coder.component_coder_ids.iter().find(|comp| !c.coders.contains_key(*comp)) {
            return Err(PlanError::Invalid(format!(
                "coder {id:?}: unknown component coder id {missing:?}"
            )));
        }
    }
    Ok(())
}

/// Checks every coder: no coder is its own (transitive) component, none
/// nests deeper than [`MAX_CODER_DEPTH`]. Unknown component ids are left to
/// the passes that read the coder (they name the PCollection too).
fn coders(coders: &HashMap<String, beam::Coder>) -> Result<()> {
    #[derive(Clone, Copy)]
    enum Mark {
        /// On the current path, with the length of the path so far.
        Open,
        /// Done: the depth of the coder (1 for a coder without components)
        /// and how many coders it expands to.
        Done(usize, usize),
    }
    let mut marks: HashMap<&str, Mark> = HashMap::new();
    for (root, _) in sorted(coders) {
        if marks.contains_key(root.as_str()) {
            continue;
        }
        // (coder id, index of the next component to visit).
        let mut path: Vec<(&str, usize)> = vec![(root.as_str(), 0)];
        marks.insert(root, Mark::Open);
        while let Some(&mut (id, ref mut next)) = path.last_mut() {
            let comps = coders
                .get(id)
                .map(|c| c.component_coder_ids.as_slice())
                .unwrap_or(&[]);
            if let Some(comp) = comps.get(*next) {
                *next += 1;
                match marks.get(comp.as_str()) {
                    Some(Mark::Open) => {
                        let start = path.iter().position(|(p, _)| *p == comp).unwrap_or(0);
                        let mut cycle: Vec<&str> = path[start..].iter().map(|(p, _)| *p).collect();
                        cycle.push(comp);
                        return Err(PlanError::Invalid(format!(
                            "coder {comp:?} is its own component (coder cycle {})",
                            cycle.join(" -> ")
                        )));
                    }
                    Some(Mark::Done(d, _)) => {
                        if path.len() + d > MAX_CODER_DEPTH {
                            return Err(coder_too_deep(path[0].0));
                        }
                    }
                    None => {
                        if path.len() + 1 > MAX_CODER_DEPTH {
                            return Err(coder_too_deep(path[0].0));
                        }
                        marks.insert(comp, Mark::Open);
                        path.push((comp.as_str(), 0));
                    }
                }
                continue;
            }
            // All components done: this coder's depth is one more than
            // theirs, its size one more than their sum.
            let (mut depth, mut size) = (1, 1usize);
            for c in comps {
                if let Some(Mark::Done(d, s)) = marks.get(c.as_str()) {
                    depth = depth.max(1 + d);
                    size = size.saturating_add(*s);
                }
            }
            if size > MAX_CODER_NODES {
                return Err(PlanError::Invalid(format!(
                    "coder {id:?} expands to more than {MAX_CODER_NODES} coders (components used many times over, nested)"
                )));
            }
            marks.insert(id, Mark::Done(depth, size));
            path.pop();
        }
    }
    Ok(())
}

fn coder_too_deep(id: &str) -> PlanError {
    PlanError::Invalid(format!(
        "coder {id:?} nests more than {MAX_CODER_DEPTH} coders deep"
    ))
}

/// The nesting depth of a trigger (1 for a trigger without subtriggers),
/// walked with an explicit stack.
fn trigger_depth(t: &beam::Trigger) -> usize {
    use beam::trigger::Trigger as T;
    let mut deepest = 0;
    let mut stack = vec![(t, 1usize)];
    while let Some((t, d)) = stack.pop() {
        deepest = deepest.max(d);
        if d > MAX_TRIGGER_DEPTH {
            break;
        }
        let subs: Vec<&beam::Trigger> = match t.trigger.as_ref() {
            Some(T::AfterAll(a)) => a.subtriggers.iter().collect(),
            Some(T::AfterAny(a)) => a.subtriggers.iter().collect(),
            Some(T::AfterEach(a)) => a.subtriggers.iter().collect(),
            Some(T::AfterEndOfWindow(e)) => e
                .early_firings
                .as_deref()
                .into_iter()
                .chain(e.late_firings.as_deref())
                .collect(),
            Some(T::OrFinally(o)) => o.main.as_deref().into_iter().chain(o.finally.as_deref()).collect(),
            Some(T::Repeat(r)) => r.subtrigger.as_deref().into_iter().collect(),
            _ => vec![],
        };
        stack.extend(subs.into_iter().map(|s| (s, d + 1)));
    }
    deepest
}

#[cfg(test)]
mod tests {
    use super::*;
    use weir_proto::urns;

    fn composite(name: &str, subs: &[&str]) -> beam::PTransform {
        beam::PTransform {
            unique_name: name.into(),
            subtransforms: subs.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        }
    }

    fn pipeline(roots: &[&str], ts: Vec<(&str, beam::PTransform)>) -> beam::Pipeline {
        beam::Pipeline {
            root_transform_ids: roots.iter().map(|s| s.to_string()).collect(),
            components: Some(beam::Components {
                transforms: ts.into_iter().map(|(i, t)| (i.to_string(), t)).collect(),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn invalid(r: Result<()>) -> String {
        match r {
            Err(PlanError::Invalid(m)) => m,
            other => panic!("expected Invalid, got {other:?}"),
        }
    }

    #[test]
    fn a_transform_listing_itself_is_refused_by_name() {
        let p = pipeline(&["self"], vec![("self", composite("Loop", &["self"]))]);
        assert_eq!(
            invalid(check(&p)),
            "transform self (Loop) is its own subtransform (composite cycle self (Loop) -> self (Loop))"
        );
    }

    #[test]
    fn a_three_transform_composite_cycle_is_refused_by_name() {
        let p = pipeline(
            &["a"],
            vec![
                ("a", composite("A", &["b"])),
                ("b", composite("B", &["c"])),
                ("c", composite("C", &["a"])),
            ],
        );
        assert_eq!(
            invalid(check(&p)),
            "transform a (A) is its own subtransform (composite cycle a (A) -> b (B) -> c (C) -> a (A))"
        );
    }

    #[test]
    fn shared_subtransforms_and_unknown_ids_are_refused() {
        // A diamond (b listed by a twice) would otherwise double the leaves per level.
        let p = pipeline(
            &["a"],
            vec![("a", composite("A", &["b", "b"])), ("b", composite("B", &[]))],
        );
        assert_eq!(
            invalid(check(&p)),
            "transform b (B) is listed twice in the composite hierarchy: as a subtransform of a (A) and as a subtransform of a (A)"
        );
        let p = pipeline(&["a"], vec![("a", composite("A", &["zz"]))]);
        assert_eq!(
            invalid(check(&p)),
            "transform a (A) lists unknown subtransform id \"zz\""
        );
    }

    #[test]
    fn deep_composite_nesting_is_refused_in_bounded_time() {
        let n = 100_000;
        let mut ts = Vec::new();
        let names: Vec<String> = (0..=n).map(|i| format!("t{i}")).collect();
        for i in 0..n {
            ts.push((names[i].as_str(), composite("C", &[names[i + 1].as_str()])));
        }
        ts.push((names[n].as_str(), composite("Leaf", &[])));
        let p = pipeline(&["t0"], ts);
        let start = std::time::Instant::now();
        assert_eq!(
            invalid(check(&p)),
            "transform t256 (C) nests more than 256 composites deep"
        );
        assert!(start.elapsed() < std::time::Duration::from_secs(2));
        // Just within the limit is accepted.
        let p = pipeline(
            &["t0"],
            (0..MAX_COMPOSITE_DEPTH)
                .map(|i| {
                    let subs: Vec<&str> = if i + 1 < MAX_COMPOSITE_DEPTH {
                        vec![names[i + 1].as_str()]
                    } else {
                        vec![]
                    };
                    (names[i].as_str(), composite("C", &subs))
                })
                .collect(),
        );
        assert!(check(&p).is_ok());
    }

    fn coder(components: &[&str]) -> beam::Coder {
        beam::Coder {
            spec: Some(beam::FunctionSpec {
                urn: if components.is_empty() {
                    urns::coder::BYTES.into()
                } else {
                    urns::coder::KV.into()
                },
                payload: vec![],
            }),
            component_coder_ids: components.iter().map(|c| c.to_string()).collect(),
        }
    }

    fn coders_of(cs: Vec<(String, beam::Coder)>) -> HashMap<String, beam::Coder> {
        cs.into_iter().collect()
    }

    #[test]
    fn self_and_mutually_referencing_coders_are_refused_by_name() {
        let cs = coders_of(vec![("me".into(), coder(&["me"]))]);
        assert_eq!(
            invalid(coders(&cs)),
            "coder \"me\" is its own component (coder cycle me -> me)"
        );
        let cs = coders_of(vec![
            ("a".into(), coder(&["b", "x"])),
            ("b".into(), coder(&["x", "a"])),
            ("x".into(), coder(&[])),
        ]);
        assert_eq!(
            invalid(coders(&cs)),
            "coder \"a\" is its own component (coder cycle a -> b -> a)"
        );
    }

    #[test]
    fn dangling_coder_ids_are_refused_by_name() {
        let mut c = beam::Components {
            coders: coders_of(vec![("x".into(), coder(&[])), ("kv".into(), coder(&["x", "gone"]))]),
            ..Default::default()
        };
        assert_eq!(invalid(references(&c)), "coder \"kv\": unknown component coder id \"gone\"");
        c.coders.insert("gone".into(), coder(&[]));
        c.pcollections.insert(
            "pc".into(),
            beam::PCollection { unique_name: "Out".into(), coder_id: "nowhere".into(), ..Default::default() },
        );
        assert_eq!(invalid(references(&c)), "PCollection pc (Out): unknown coder id \"nowhere\"");
        c.pcollections.get_mut("pc").unwrap().coder_id = "kv".into();
        assert!(references(&c).is_ok());
    }

    #[test]
    fn a_ten_thousand_deep_coder_chain_is_refused_without_recursion() {
        let n = 10_000;
        let mut cs = vec![("c0".to_string(), coder(&[]))];
        for i in 1..n {
            cs.push((format!("c{i}"), coder(&[&format!("c{}", i - 1)])));
        }
        let cs = coders_of(cs);
        let m = invalid(coders(&cs));
        assert!(
            m.starts_with("coder \"c") && m.ends_with("nests more than 64 coders deep"),
            "{m}"
        );
        // A shared component is not a cycle: kv(x, x), kv(kv(x,x), kv(x,x)),
        // ... but 60 levels of it would be 2^60 coders to walk as a tree.
        let mut cs = vec![("d0".to_string(), coder(&[]))];
        for i in 1..60 {
            let prev = format!("d{}", i - 1);
            cs.push((format!("d{i}"), coder(&[&prev, &prev])));
        }
        let start = std::time::Instant::now();
        assert_eq!(
            invalid(coders(&coders_of(cs.clone()))),
            "coder \"d13\" expands to more than 10000 coders (components used many times over, nested)"
        );
        assert!(start.elapsed() < std::time::Duration::from_secs(1));
        // 12 levels (8191 coders) are fine.
        cs.truncate(13);
        assert!(coders(&coders_of(cs)).is_ok());
    }

    #[test]
    fn deep_triggers_are_refused() {
        let mut t = beam::Trigger {
            trigger: Some(beam::trigger::Trigger::Always(Default::default())),
        };
        for _ in 0..100 {
            t = beam::Trigger {
                trigger: Some(beam::trigger::Trigger::Repeat(Box::new(
                    beam::trigger::Repeat {
                        subtrigger: Some(Box::new(t)),
                    },
                ))),
            };
        }
        let p = beam::Pipeline {
            components: Some(beam::Components {
                windowing_strategies: [(
                    "ws".to_string(),
                    beam::WindowingStrategy {
                        trigger: Some(t),
                        ..Default::default()
                    },
                )]
                .into(),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(
            invalid(check(&p)),
            "windowing strategy \"ws\": its trigger nests more than 64 triggers deep"
        );
    }
}
