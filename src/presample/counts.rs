//! Pre-sampling counts and the METIS weights made from them.
//!
//! # Column convention (also that of `weights.h5`'s `vertex_weights`)
//!
//! With `L` hops (fanouts) there are `L + 1` columns:
//!
//! * column `h` (`0 ≤ h < L`): how often the vertex is a DESTINATION of hop `h`'s block, i.e.
//!   is computed at that layer. Hops count from the seeds outward (ARCHITECTURE invariant 5):
//!   column 0 counts the seeds (computed by the last GNN layer), column `L - 1` the
//!   destinations of the input block (computed by the first GNN layer);
//! * column `L`: how often the vertex is a SOURCE row of the input block, i.e. its input
//!   features are loaded.
//!
//! Each vertex is counted at most once per column per mini-batch (block destinations and
//! sources are distinct). Edge counts add up every hop at which the stored edge was sampled.
//!
//! # Scaling
//!
//! Weights are the counts averaged over the `K` epochs, times one factor `s` shared by all
//! columns and the edges, chosen so that the largest weight is [`WEIGHT_MAX`]:
//! `w = round(count / K · s)`, `s = WEIGHT_MAX · K / max(count)`. A count above zero never
//! rounds to weight 0 (it becomes 1), so "sampled rarely" stays distinct from "never
//! sampled". Weights are relative: METIS balances each column against its own total, and
//! `gnnpar partition` divides them further when a total would overflow METIS' 32 bits.

use crate::partition::weights::VertexEdgeWeights;
use crate::sample::Block;
use anyhow::{bail, Result};
use ndarray::Array2;

/// The largest weight written (the most frequent count maps to it).
pub const WEIGHT_MAX: i64 = 1_000_000;

/// Raw pre-sampling counts over some number of mini-batches.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LayerCounts {
    hops: usize,
    /// `vertex[v * (hops + 1) + c]`: count of vertex `v` in column `c` (see the module doc).
    vertex: Vec<u32>,
    /// `edge[e]`: times the stored edge `indices[e]` was sampled, over all hops.
    edge: Vec<u32>,
}

impl LayerCounts {
    /// Zero counts for `num_nodes` vertices, `num_edges` stored edges and `hops` hops.
    pub fn new(num_nodes: usize, num_edges: usize, hops: usize) -> Self {
        LayerCounts {
            hops,
            vertex: vec![0; num_nodes * (hops + 1)],
            edge: vec![0; num_edges],
        }
    }

    /// Number of columns (`hops + 1`).
    pub fn columns(&self) -> usize {
        self.hops + 1
    }

    /// Count of vertex `v` in column `c`.
    pub fn vertex(&self, v: usize, c: usize) -> u32 {
        self.vertex[v * self.columns() + c]
    }

    /// Count of the stored edge `e`.
    pub fn edge(&self, e: usize) -> u32 {
        self.edge[e]
    }

    /// Sum of column `c` over all vertices.
    pub fn column_total(&self, c: usize) -> u64 {
        self.vertex
            .iter()
            .skip(c)
            .step_by(self.columns())
            .map(|&x| x as u64)
            .sum()
    }

    /// Sum of the edge counts (sampled edges over all hops).
    pub fn edge_total(&self) -> u64 {
        self.edge.iter().map(|&x| x as u64).sum()
    }

    /// Add one mini-batch: `blocks` input layer first, `positions[h]` the stored-edge index of
    /// every edge of hop `h` (as [`run_sampler`](super::run_sampler) hands them over).
    ///
    /// # Panics
    /// When the batch has a different number of hops, or an id is out of range.
    pub fn add_batch(&mut self, blocks: &[Block], positions: &[Vec<usize>]) {
        let (hops, cols) = (self.hops, self.columns());
        assert_eq!(blocks.len(), hops, "batch has the wrong number of blocks");
        assert_eq!(positions.len(), hops, "batch has the wrong number of hops");
        // A sequential scatter: sampling (hashing, block building) costs far more per batch
        // than these increments, and a plain loop keeps the counts trivially deterministic.
        for h in 0..hops {
            for &v in blocks[hops - 1 - h].dst_nodes() {
                self.vertex[v as usize * cols + h] += 1;
            }
            for &e in &positions[h] {
                self.edge[e] += 1;
            }
        }
        for &v in &blocks[0].src_nodes {
            self.vertex[v as usize * cols + hops] += 1;
        }
    }

    /// The factor `s` of the module doc for counts gathered over `epochs` epochs.
    fn scale(&self, epochs: u64) -> Result<f64> {
        let max = self
            .vertex
            .iter()
            .chain(&self.edge)
            .copied()
            .max()
            .unwrap_or(0);
        if max == 0 {
            bail!("pre-sampling counted nothing (no mini-batch was sampled)");
        }
        Ok(WEIGHT_MAX as f64 * epochs as f64 / max as f64)
    }

    /// The METIS weights of counts gathered over `epochs` epochs, and the factor `s` they were
    /// scaled by (`weight = round(count / epochs · s)`).
    pub fn to_weights(&self, epochs: u64) -> Result<(VertexEdgeWeights, f64)> {
        if epochs == 0 {
            bail!("--epochs must be at least 1 (got 0)");
        }
        let s = self.scale(epochs)?;
        let per_count = s / epochs as f64;
        let weigh = |c: u32| -> i64 {
            if c == 0 {
                0
            } else {
                ((c as f64 * per_count).round() as i64).max(1)
            }
        };
        let n = self.vertex.len() / self.columns();
        let vertex_weights = Array2::from_shape_vec(
            (n, self.columns()),
            self.vertex.iter().map(|&c| weigh(c)).collect(),
        )
        .expect("vertex counts are n × columns");
        let edge_weights = self.edge.iter().map(|&c| weigh(c)).collect();
        Ok((
            VertexEdgeWeights {
                vertex_weights,
                edge_weights,
                epochs,
            },
            s,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two hops over 5 vertices: seeds {0, 1}; hop 1 destinations {0, 1, 2}; input rows
    /// {0, 1, 2, 3}.
    fn batch() -> (Vec<Block>, Vec<Vec<usize>>) {
        let top = Block {
            num_dst: 2,
            src_nodes: vec![0, 1, 2],
            indptr: vec![0, 1, 2],
            indices: vec![2, 0],
        };
        let bottom = Block {
            num_dst: 3,
            src_nodes: vec![0, 1, 2, 3],
            indptr: vec![0, 1, 1, 2],
            indices: vec![3, 0],
        };
        (vec![bottom, top], vec![vec![4, 1], vec![0, 7]])
    }

    #[test]
    fn columns_follow_the_documented_convention() {
        let (blocks, pos) = batch();
        let mut c = LayerCounts::new(5, 8, 2);
        c.add_batch(&blocks, &pos);
        c.add_batch(&blocks, &pos);
        let col = |k: usize| (0..5).map(|v| c.vertex(v, k)).collect::<Vec<_>>();
        assert_eq!(col(0), vec![2, 2, 0, 0, 0]);
        assert_eq!(col(1), vec![2, 2, 2, 0, 0]);
        assert_eq!(col(2), vec![2, 2, 2, 2, 0]);
        assert_eq!(
            (0..8).map(|e| c.edge(e)).collect::<Vec<_>>(),
            vec![2, 2, 0, 0, 2, 0, 0, 2]
        );
        assert_eq!(c.column_total(2), 8);
        assert_eq!(c.edge_total(), 8);
    }

    #[test]
    fn weights_scale_the_largest_count_to_weight_max_and_keep_rare_ones() {
        let mut c = LayerCounts::new(3, 2, 1);
        c.vertex = vec![4_000_000, 0, 1, 2_000_000, 0, 0];
        c.edge = vec![1_000_000, 0];
        let (w, s) = c.to_weights(2).unwrap();
        assert_eq!(w.epochs, 2);
        assert_eq!(w.vertex_weights[[0, 0]], WEIGHT_MAX);
        assert_eq!(w.vertex_weights[[1, 1]], WEIGHT_MAX / 2);
        // 1 / 4e6 of the maximum rounds to 0 but was sampled: kept at 1.
        assert_eq!(w.vertex_weights[[1, 0]], 1);
        assert_eq!(w.vertex_weights[[0, 1]], 0);
        assert_eq!(w.edge_weights, vec![WEIGHT_MAX / 4, 0]);
        // weight = count / epochs · s
        assert!((4_000_000.0 / 2.0 * s - WEIGHT_MAX as f64).abs() < 1e-6);
    }

    #[test]
    fn nothing_counted_is_an_error() {
        let c = LayerCounts::new(3, 2, 1);
        assert!(c.to_weights(1).is_err());
    }
}
