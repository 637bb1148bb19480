//! GSplit's split statistics of a partition over sampled mini-batches (GSplit §6.3, fig. 5).
//!
//! Under split parallelism every vertex of a mini-batch is computed by the part that owns it,
//! at every layer. For each hop `h` (0 = the seeds' hop, as in [`counts`](super::counts)):
//!
//! * **vertex load** of part `p`: destinations of hop `h`'s blocks owned by `p` (rows `p`
//!   computes at that layer); **edge load**: sampled edges whose destination `p` owns (the
//!   aggregation work `p` does);
//! * **imbalance**: max / mean of the load over parts (1 = perfectly balanced);
//! * **cross-split edges**: sampled edges whose source and destination lie in different
//!   parts; each needs the source's row shuffled to the destination's part.
//!
//! Input rows (sources of the input block) are loaded by their owners; their per-part load is
//! reported separately.

use crate::graph::parts::PartitionMeta;
use crate::sample::Block;
use anyhow::{bail, Result};
use serde::Serialize;

/// The part of every ORIGINAL vertex id (`result[orig] = part`), from a partition's metadata.
/// Checks that `meta` covers exactly `num_nodes` vertices and that `orig_id` is a permutation.
pub fn part_of_original_ids(meta: &PartitionMeta, num_nodes: u64, what: &str) -> Result<Vec<u32>> {
    if meta.num_nodes() != num_nodes {
        bail!(
            "{what}: the partition has {} vertices but the dataset has {num_nodes} (was it \
             made from this dataset?)",
            meta.num_nodes()
        );
    }
    let mut part = vec![u32::MAX; num_nodes as usize];
    for p in 0..meta.num_parts {
        for new in meta.offsets[p]..meta.offsets[p + 1] {
            let orig = meta.orig_id[new as usize];
            if orig >= num_nodes || part[orig as usize] != u32::MAX {
                bail!(
                    "{what}: `orig_id[{new}]` = {orig} is out of range or repeated (expected \
                     a permutation of 0..{num_nodes})"
                );
            }
            part[orig as usize] = p as u32;
        }
    }
    Ok(part)
}

/// Accumulates per-part loads and cross-split edges over sampled mini-batches.
#[derive(Clone, Debug)]
pub struct SplitStatsAccumulator {
    part: Vec<u32>,
    parts: usize,
    hops: usize,
    /// `vertex_load[h * parts + p]`, `h` in `0..=hops` (`hops`: input rows).
    vertex_load: Vec<u64>,
    /// `edge_load[h * parts + p]`.
    edge_load: Vec<u64>,
    /// Cross-split edges per hop.
    cross: Vec<u64>,
    batches: u64,
}

impl SplitStatsAccumulator {
    /// Statistics of the assignment `part` (indexed by the ids the blocks use, values
    /// `< parts`) over mini-batches of `hops` blocks.
    ///
    /// # Panics
    /// When `parts` is 0 or a part number is out of range.
    pub fn new(part: Vec<u32>, parts: usize, hops: usize) -> Self {
        assert!(parts > 0, "at least one part");
        assert!(
            part.iter().all(|&p| (p as usize) < parts),
            "part numbers must be below {parts}"
        );
        SplitStatsAccumulator {
            part,
            parts,
            hops,
            vertex_load: vec![0; (hops + 1) * parts],
            edge_load: vec![0; hops * parts],
            cross: vec![0; hops],
            batches: 0,
        }
    }

    /// Add one mini-batch (`blocks` input layer first).
    ///
    /// # Panics
    /// When the batch has a different number of hops or an id is out of range.
    pub fn add_batch(&mut self, blocks: &[Block]) {
        let (hops, parts) = (self.hops, self.parts);
        assert_eq!(blocks.len(), hops, "batch has the wrong number of blocks");
        for h in 0..hops {
            let block = &blocks[hops - 1 - h];
            let mut cross = 0u64;
            for i in 0..block.num_dst {
                let pd = self.part[block.src_nodes[i] as usize];
                self.vertex_load[h * parts + pd as usize] += 1;
                self.edge_load[h * parts + pd as usize] += block.in_degree(i) as u64;
                cross += block
                    .in_edges(i)
                    .iter()
                    .filter(|&&s| self.part[block.src_nodes[s as usize] as usize] != pd)
                    .count() as u64;
            }
            self.cross[h] += cross;
        }
        for &v in &blocks[0].src_nodes {
            self.vertex_load[hops * parts + self.part[v as usize] as usize] += 1;
        }
        self.batches += 1;
    }

    /// The statistics so far.
    pub fn finish(&self) -> SplitStats {
        let parts = self.parts;
        let hops = (0..self.hops)
            .map(|h| {
                let vertex_load = self.vertex_load[h * parts..(h + 1) * parts].to_vec();
                let edge_load = self.edge_load[h * parts..(h + 1) * parts].to_vec();
                let edges: u64 = edge_load.iter().sum();
                HopSplit {
                    hop: h,
                    gnn_layer: self.hops - h,
                    vertex_imbalance: imbalance(&vertex_load),
                    edge_imbalance: imbalance(&edge_load),
                    edges,
                    cross_edges: self.cross[h],
                    cross_edge_percent: percent(self.cross[h], edges),
                    vertex_load,
                    edge_load,
                }
            })
            .collect();
        let input_load = self.vertex_load[self.hops * parts..].to_vec();
        SplitStats {
            parts,
            batches: self.batches,
            input_imbalance: imbalance(&input_load),
            input_load,
            hops,
        }
    }
}

/// Split statistics of one hop.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct HopSplit {
    /// 0 = the seeds' hop (the last GNN layer).
    pub hop: usize,
    /// The GNN layer computing this hop's destinations (1 = the input layer).
    pub gnn_layer: usize,
    /// Destinations computed per part.
    pub vertex_load: Vec<u64>,
    /// max / mean of `vertex_load`.
    pub vertex_imbalance: f64,
    /// Sampled edges aggregated per part (by the destination's owner).
    pub edge_load: Vec<u64>,
    /// max / mean of `edge_load` (GSplit's "edges per split" imbalance).
    pub edge_imbalance: f64,
    /// Sampled edges of this hop over all batches.
    pub edges: u64,
    /// Of those, edges whose endpoints lie in different parts.
    pub cross_edges: u64,
    pub cross_edge_percent: f64,
}

/// Split statistics of a partition over sampled mini-batches.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SplitStats {
    pub parts: usize,
    /// Mini-batches measured.
    pub batches: u64,
    /// Per hop, seeds' hop first.
    pub hops: Vec<HopSplit>,
    /// Input feature rows loaded per part.
    pub input_load: Vec<u64>,
    pub input_imbalance: f64,
}

impl SplitStats {
    /// Cross-split edges over all hops, in % of all sampled edges.
    pub fn total_cross_edge_percent(&self) -> f64 {
        let cross = self.hops.iter().map(|h| h.cross_edges).sum();
        let edges = self.hops.iter().map(|h| h.edges).sum();
        percent(cross, edges)
    }

    /// A small text table (one line per hop).
    pub fn text(&self) -> String {
        let mut s = format!(
            "split statistics over {} mini-batches, {} parts\n  hop layer  vertex-imb  edge-imb  cross-edges\n",
            self.batches, self.parts
        );
        for h in &self.hops {
            s += &format!(
                "  {:>3} {:>5}  {:>10.3}  {:>8.3}  {:>10.2}%\n",
                h.hop, h.gnn_layer, h.vertex_imbalance, h.edge_imbalance, h.cross_edge_percent
            );
        }
        s += &format!("  input rows imbalance {:.3}\n", self.input_imbalance);
        s
    }
}

/// max / mean of `load` (1.0 when there is no load at all).
fn imbalance(load: &[u64]) -> f64 {
    let total: u64 = load.iter().sum();
    if total == 0 {
        return 1.0;
    }
    let max = *load.iter().max().expect("at least one part") as f64;
    max * load.len() as f64 / total as f64
}

/// `100 · part / whole` (0 when `whole` is 0).
fn percent(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        100.0 * part as f64 / whole as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loads_imbalance_and_cross_edges_of_a_small_batch() {
        // Seeds {0, 1}; hop 1 destinations {0, 1, 2}; input rows {0, 1, 2, 3}.
        let top = Block {
            num_dst: 2,
            src_nodes: vec![0, 1, 2],
            indptr: vec![0, 1, 2],
            indices: vec![2, 0], // 0 <- 2, 1 <- 0
        };
        let bottom = Block {
            num_dst: 3,
            src_nodes: vec![0, 1, 2, 3],
            indptr: vec![0, 2, 2, 3],
            indices: vec![3, 1, 0], // 0 <- 3, 0 <- 1, 2 <- 0
        };
        // Parts: {0, 2} and {1, 3}.
        let mut acc = SplitStatsAccumulator::new(vec![0, 1, 0, 1], 2, 2);
        acc.add_batch(&[bottom, top]);
        let s = acc.finish();
        assert_eq!(s.batches, 1);
        let seeds = &s.hops[0];
        assert_eq!((seeds.hop, seeds.gnn_layer), (0, 2));
        assert_eq!(seeds.vertex_load, vec![1, 1]);
        assert_eq!(seeds.edge_load, vec![1, 1]);
        assert_eq!(seeds.vertex_imbalance, 1.0);
        // 0 <- 2 stays in part 0; 1 <- 0 crosses.
        assert_eq!((seeds.edges, seeds.cross_edges), (2, 1));
        assert_eq!(seeds.cross_edge_percent, 50.0);
        let input = &s.hops[1];
        assert_eq!(input.vertex_load, vec![2, 1]);
        assert_eq!(input.edge_load, vec![3, 0]);
        assert!((input.vertex_imbalance - 4.0 / 3.0).abs() < 1e-12);
        assert_eq!(input.edge_imbalance, 2.0);
        // 0 <- 3 and 0 <- 1 cross; 2 <- 0 does not.
        assert_eq!(input.cross_edges, 2);
        assert_eq!(s.input_load, vec![2, 2]);
        assert!((s.total_cross_edge_percent() - 60.0).abs() < 1e-12);
        assert!(s.text().contains("50.00%"));
    }

    #[test]
    fn original_id_mapping_checks_the_permutation() {
        let meta = PartitionMeta {
            name: "t".into(),
            num_parts: 2,
            offsets: vec![0, 1, 3],
            orig_id: vec![2, 0, 1],
            method: "metis".into(),
            weights: "none".into(),
            edge_cut: 0,
            num_edges: 0,
            seconds: 0.0,
        };
        assert_eq!(part_of_original_ids(&meta, 3, "p").unwrap(), vec![1, 1, 0]);
        assert!(part_of_original_ids(&meta, 4, "p")
            .unwrap_err()
            .to_string()
            .contains("4"));
        let bad = PartitionMeta {
            orig_id: vec![2, 2, 1],
            ..meta
        };
        assert!(part_of_original_ids(&bad, 3, "p")
            .unwrap_err()
            .to_string()
            .contains("orig_id[1]"));
    }
}
