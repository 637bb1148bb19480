//! Per-rank figures of an epoch (phase seconds, bytes moved per kind of operation, feature
//! store counters), gathered on rank 0 with their maximum and mean over ranks: the maximum is
//! what the slowest rank costs everyone, the mean what the work costs on average.

use super::metrics::PhaseTimes;
use super::split::SplitLayerStats;
use crate::comm::{OpStats, World};
use crate::exchange::store::StoreStats;
use serde::Serialize;
use serde_json::{Map, Value};
use std::collections::BTreeMap;

/// One rank's figures for one epoch.
#[derive(Clone, Debug, Serialize)]
pub struct RankReport {
    pub rank: usize,
    pub seconds: PhaseTimes,
    pub comm: BTreeMap<&'static str, OpStats>,
    pub store: StoreStats,
    pub cache_hit_rate: Option<f64>,
    /// Split strategy: edges and cross-rank edges per layer (`layer0` = input layer).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub split: BTreeMap<String, SplitLayerStats>,
}

/// GSplit's per-layer statistics from a gathered report: edges per rank (max, mean,
/// imbalance) and the share of cross-rank edges, for `layers` layers.
pub fn split_summary(gathered: &Value, layers: usize) -> Option<Value> {
    if layers == 0 {
        return None;
    }
    let ranks = gathered["ranks"].as_array()?;
    let per_layer: Vec<Value> = (0..layers)
        .map(|l| {
            let key = format!("layer{l}");
            let edges: Vec<f64> = ranks
                .iter()
                .map(|r| r["split"][&key]["edges"].as_f64().unwrap_or(0.0))
                .collect();
            let cross: f64 = ranks
                .iter()
                .map(|r| r["split"][&key]["cross_edges"].as_f64().unwrap_or(0.0))
                .sum();
            let total: f64 = edges.iter().sum();
            let max = edges.iter().cloned().fold(0.0, f64::max);
            let mean = total / edges.len().max(1) as f64;
            serde_json::json!({
                "layer": l,
                "edges_max": max,
                "edges_mean": mean,
                "imbalance": if mean > 0.0 { max / mean } else { f64::NAN },
                "cross_pct": if total > 0.0 { 100.0 * cross / total } else { 0.0 },
            })
        })
        .collect();
    Some(Value::Array(per_layer))
}

/// Gather every rank's report on rank 0: `{"ranks": [...], "max": {...}, "mean": {...}}` with
/// flattened keys such as `seconds.sample` or `comm.store_rows.bytes_received`. `None` on other
/// ranks. Collective.
pub fn gather(world: &World, mine: &RankReport) -> Option<Value> {
    let text = serde_json::to_string(mine).expect("report serialises");
    let all = world.gather_strings(&text);
    if world.rank() != 0 {
        return None;
    }
    let reports: Vec<Value> = all
        .iter()
        .map(|s| serde_json::from_str(s).expect("reports are produced above"))
        .collect();
    let flats: Vec<BTreeMap<String, f64>> = reports.iter().map(flatten).collect();
    let mut keys: Vec<&String> = flats.iter().flat_map(|f| f.keys()).collect();
    keys.sort();
    keys.dedup();
    let (mut max, mut mean) = (Map::new(), Map::new());
    for k in keys {
        if k == "rank" {
            continue;
        }
        let vals: Vec<f64> = flats
            .iter()
            .map(|f| f.get(k).copied().unwrap_or(0.0))
            .collect();
        let m = vals.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        max.insert(k.clone(), m.into());
        mean.insert(
            k.clone(),
            (vals.iter().sum::<f64>() / vals.len() as f64).into(),
        );
    }
    let mut out = Map::new();
    out.insert("ranks".into(), Value::Array(reports));
    out.insert("max".into(), Value::Object(max));
    out.insert("mean".into(), Value::Object(mean));
    Some(Value::Object(out))
}

/// Numeric leaves of a JSON object as `a.b.c` → value.
fn flatten(v: &Value) -> BTreeMap<String, f64> {
    fn walk(prefix: &str, v: &Value, out: &mut BTreeMap<String, f64>) {
        match v {
            Value::Object(m) => {
                for (k, x) in m {
                    let key = if prefix.is_empty() {
                        k.clone()
                    } else {
                        format!("{prefix}.{k}")
                    };
                    walk(&key, x, out);
                }
            }
            Value::Number(n) => {
                if let Some(f) = n.as_f64() {
                    out.insert(prefix.to_string(), f);
                }
            }
            _ => {}
        }
    }
    let mut out = BTreeMap::new();
    walk("", v, &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flatten_names_nested_numbers() {
        let v: Value = serde_json::json!({"a": {"b": 1.5, "c": [1]}, "d": 2});
        let f = flatten(&v);
        assert_eq!(f.get("a.b"), Some(&1.5));
        assert_eq!(f.get("d"), Some(&2.0));
        assert_eq!(f.len(), 2);
    }
}
