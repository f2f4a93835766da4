//! Job metrics: MonitoringInfos from every bundle (`ProcessBundleResponse.monitoring_infos`),
//! aggregated across bundles and workers by (URN, type, labels) as metrics.proto defines:
//! sums add, distributions combine, gauges keep the latest, string sets unite.
//! Other types keep the latest report.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Mutex;

use weir_model::varint::{decode_varint, encode_varint};
use weir_proto::{beam, urns::monitoring as m};

/// Live user-state cells of a job in one process (`beam:metrics:latest_int64:v1`,
/// no labels): bag, multimap and ordered-list cells, each one (transform,
/// state id, window, key) with at least one value. Reported by GetJobMetrics
/// once a stateful stage committed a bundle; in a cluster the latest report
/// of any worker process wins.
pub const LIVE_CELLS_URN: &str = "weir:metric:user_state:live_cells:v1";
/// The most live user-state cells the job had at once
/// (`beam:metrics:latest_int64:v1`, no labels): with expiry, a streaming job
/// holds the state of its open windows only, not of every window it saw.
pub const PEAK_LIVE_CELLS_URN: &str = "weir:metric:user_state:peak_live_cells:v1";
/// Estimated bytes the live user-state cells of a job hold in one process
/// (`beam:metrics:latest_int64:v1`, no labels; reported with
/// [`LIVE_CELLS_URN`]): their encodings plus a per-cell and per-value
/// estimate of the maps around them. Appends past the job's budget
/// (`weir serve --user_state_memory_budget_mb`) fail their bundle.
pub const LIVE_BYTES_URN: &str = "weir:metric:user_state:live_bytes:v1";
/// The most bytes [`LIVE_BYTES_URN`] counted at once
/// (`beam:metrics:latest_int64:v1`, no labels).
pub const PEAK_LIVE_BYTES_URN: &str = "weir:metric:user_state:peak_live_bytes:v1";

type Key = (String, String, BTreeMap<String, String>);

/// Aggregated MonitoringInfos of one job, and its failed bundle attempts.
#[derive(Default)]
pub struct JobMetrics {
    cells: Mutex<HashMap<Key, beam::MonitoringInfo>>,
    /// Bundle attempts that failed and were retried, per stage index.
    retries: Mutex<BTreeMap<usize, u64>>,
}

fn varints(payload: &[u8], n: usize) -> Option<Vec<i64>> {
    let mut out = Vec::with_capacity(n);
    let mut pos = 0;
    for _ in 0..n {
        let (v, used) = decode_varint(payload.get(pos..)?).ok()?;
        out.push(v);
        pos += used;
    }
    Some(out)
}

fn encode(values: &[i64]) -> Vec<u8> {
    let mut out = Vec::new();
    for v in values {
        encode_varint(*v, &mut out);
    }
    out
}

fn strings(payload: &[u8]) -> Option<BTreeSet<String>> {
    let n = i32::from_be_bytes(payload.get(0..4)?.try_into().ok()?);
    let mut pos = 4;
    let mut out = BTreeSet::new();
    for _ in 0..n.max(0) {
        let (len, used) = decode_varint(payload.get(pos..)?).ok()?;
        pos += used;
        out.insert(String::from_utf8(payload.get(pos..pos + len as usize)?.to_vec()).ok()?);
        pos += len as usize;
    }
    Some(out)
}

fn encode_strings(set: &BTreeSet<String>) -> Vec<u8> {
    let mut out = (set.len() as i32).to_be_bytes().to_vec();
    for s in set {
        encode_varint(s.len() as i64, &mut out);
        out.extend_from_slice(s.as_bytes());
    }
    out
}

/// Combines two payloads of the same metric type; `None` when either does not decode.
fn combine(ty: &str, old: &[u8], new: &[u8]) -> Option<Vec<u8>> {
    Some(match ty {
        m::TYPE_SUM_INT64 => encode(&[varints(old, 1)?[0].wrapping_add(varints(new, 1)?[0])]),
        m::TYPE_DISTRIBUTION_INT64 => {
            let (a, b) = (varints(old, 4)?, varints(new, 4)?);
            encode(&[a[0] + b[0], a[1] + b[1], a[2].min(b[2]), a[3].max(b[3])])
        }
        m::TYPE_LATEST_INT64 => {
            if varints(new, 2)?[0] >= varints(old, 2)?[0] {
                new.to_vec()
            } else {
                old.to_vec()
            }
        }
        m::TYPE_SET_STRING => {
            let mut s = strings(old)?;
            s.extend(strings(new)?);
            encode_strings(&s)
        }
        _ => new.to_vec(),
    })
}

impl JobMetrics {
    /// Adds one bundle's MonitoringInfos.
    pub fn add(&self, infos: &[beam::MonitoringInfo]) {
        let mut cells = self.cells.lock().unwrap_or_else(|p| p.into_inner());
        for info in infos {
            let key = (
                info.urn.clone(),
                info.r#type.clone(),
                info.labels
                    .iter()
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect(),
            );
            match cells.get_mut(&key) {
                Some(cell) => {
                    if let Some(p) = combine(&info.r#type, &cell.payload, &info.payload) {
                        cell.payload = p;
                    }
                }
                None => {
                    cells.insert(key, info.clone());
                }
            }
        }
    }

    /// Replaces every aggregate with the sum of `parts` (each a set of
    /// MonitoringInfos aggregated elsewhere, e.g. one cluster worker's).
    pub fn replace_with(&self, parts: &[Vec<beam::MonitoringInfo>]) {
        self.cells.lock().unwrap_or_else(|p| p.into_inner()).clear();
        for part in parts {
            self.add(part);
        }
    }

    /// Counts one retried bundle attempt of stage `stage` (its index in the graph).
    pub fn bundle_retried(&self, stage: usize) {
        *self.retries.lock().unwrap_or_else(|p| p.into_inner()).entry(stage).or_default() += 1;
    }

    /// Retried bundle attempts per stage index (stages without retries absent).
    pub fn retries(&self) -> BTreeMap<usize, u64> {
        self.retries.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Every aggregated MonitoringInfo.
    pub fn snapshot(&self) -> Vec<beam::MonitoringInfo> {
        self.cells
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(ty: &str, payload: Vec<u8>) -> beam::MonitoringInfo {
        beam::MonitoringInfo {
            urn: "u".into(),
            r#type: ty.into(),
            payload,
            ..Default::default()
        }
    }

    #[test]
    fn replacing_sums_the_parts_and_forgets_what_was_there() {
        let metrics = JobMetrics::default();
        metrics.add(&[info(m::TYPE_SUM_INT64, encode(&[100]))]);
        let part = |n| vec![info(m::TYPE_SUM_INT64, encode(&[n]))];
        metrics.replace_with(&[part(2), part(5)]);
        assert_eq!(metrics.snapshot(), part(7));
        metrics.replace_with(&[part(3)]);
        assert_eq!(metrics.snapshot(), part(3));
        metrics.replace_with(&[]);
        assert!(metrics.snapshot().is_empty());
    }

    #[test]
    fn aggregates_by_type() {
        let metrics = JobMetrics::default();
        metrics.add(&[
            info(m::TYPE_SUM_INT64, encode(&[2])),
            info(m::TYPE_DISTRIBUTION_INT64, encode(&[1, 1, 1, 1])),
        ]);
        metrics.add(&[
            info(m::TYPE_SUM_INT64, encode(&[4])),
            info(m::TYPE_DISTRIBUTION_INT64, encode(&[1, 3, 3, 3])),
        ]);
        let mut snap = metrics.snapshot();
        snap.sort_by(|a, b| a.r#type.cmp(&b.r#type));
        assert_eq!(snap[0].payload, encode(&[2, 4, 1, 3]));
        assert_eq!(snap[1].payload, encode(&[6]));
        let a: BTreeSet<String> = ["a".to_string()].into();
        let b: BTreeSet<String> = ["zzz".to_string(), "a".to_string()].into();
        assert_eq!(
            strings(
                &combine(m::TYPE_SET_STRING, &encode_strings(&a), &encode_strings(&b)).unwrap()
            )
            .unwrap(),
            b
        );
    }
}
