//! Which remote feature rows are worth caching: a presampling pass over the first mini-batches
//! counts how often each remote vertex is read as an input row; the most read come first.

use super::data::TrainData;
use crate::comm::Group;
use crate::exchange::sample_blocks_distributed;
use crate::graph::NodeId;
use crate::sample::{BatchKey, LocalGraph};
use std::collections::HashMap;

/// Epoch key of the presampling pass: distinct from every training epoch, so the cache is
/// chosen from the access distribution rather than from the exact batches to come.
pub const PRESAMPLE_EPOCH: u64 = u64::MAX;

/// Remote vertices this rank reads as input rows in `batches`, most read first (ties by id).
/// Collective: every rank samples the same batches.
pub fn hottest_remote_rows(
    data: &TrainData,
    group: &Group,
    batches: &[Vec<NodeId>],
    fanouts: &[i32],
    seed: u64,
) -> Vec<NodeId> {
    let graph = LocalGraph::new(&data.part, data.orig_ids.as_deref());
    let mut counts: HashMap<NodeId, u32> = HashMap::new();
    for (b, batch) in batches.iter().enumerate() {
        let seeds: Vec<NodeId> = batch.iter().copied().filter(|&v| data.owns(v)).collect();
        let key = BatchKey {
            seed,
            epoch: PRESAMPLE_EPOCH,
            batch: b as u64,
        };
        let blocks = sample_blocks_distributed(group, &graph, &data.offsets, &seeds, fanouts, key);
        for &v in &blocks[0].src_nodes {
            if !data.owns(v) {
                *counts.entry(v).or_default() += 1;
            }
        }
    }
    let mut ranked: Vec<(NodeId, u32)> = counts.into_iter().collect();
    ranked.sort_unstable_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    ranked.into_iter().map(|(v, _)| v).collect()
}
