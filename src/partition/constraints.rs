//! Vertex weights for METIS' multi-constraint balancing: what each part should hold equally.
//!
//! Without a weights file, `--balance` picks constraints as DistDGL does: `vertices` (1 per
//! vertex), `edges` (the vertex's stored degree, i.e. the edges its owner will hold) and
//! `train` (1 per training vertex). With `--weights`, every column of the pre-sampling vertex
//! weights is one constraint (one per GNN layer, so every layer's load is balanced).

use super::weights::VertexEdgeWeights;
use crate::graph::Dataset;
use anyhow::{bail, Result};
use clap::ValueEnum;
use metis::Idx;

/// One balancing constraint chosen with `--balance`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Balance {
    /// Equal vertex counts.
    Vertices,
    /// Equal stored-edge counts (vertex weight = its degree).
    Edges,
    /// Equal training-vertex counts.
    Train,
}

impl Balance {
    /// The name used on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            Balance::Vertices => "vertices",
            Balance::Edges => "edges",
            Balance::Train => "train",
        }
    }
}

/// Vertex weights in METIS layout: `weights[v * ncon + c]`, plus a name per constraint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Constraints {
    pub names: Vec<String>,
    pub weights: Vec<Idx>,
}

impl Constraints {
    /// Number of constraints (METIS' `ncon`).
    pub fn ncon(&self) -> usize {
        self.names.len()
    }

    /// Weight of vertex `v` under constraint `c`.
    pub fn get(&self, v: usize, c: usize) -> Idx {
        self.weights[v * self.ncon() + c]
    }
}

/// Constraints chosen by `--balance` for the whole dataset `ds`.
pub fn from_balance(ds: &Dataset, balance: &[Balance]) -> Result<Constraints> {
    if balance.is_empty() {
        bail!("`--balance` lists no constraint; expected some of vertices, edges, train");
    }
    let mut chosen: Vec<Balance> = Vec::new();
    for &b in balance {
        if !chosen.contains(&b) {
            chosen.push(b);
        }
    }
    let n = ds.local_nodes();
    let mut is_train = vec![false; n];
    for &v in &ds.splits.train {
        is_train[v as usize] = true;
    }
    let columns: Vec<(String, Vec<u64>)> = chosen
        .iter()
        .map(|&b| {
            let col: Vec<u64> = (0..n)
                .map(|v| match b {
                    Balance::Vertices => 1,
                    Balance::Edges => ds.graph.degree(v) as u64,
                    Balance::Train => is_train[v] as u64,
                })
                .collect();
            (b.name().to_string(), col)
        })
        .collect();
    Ok(assemble(n, columns))
}

/// Constraints from a pre-sampling weights file: one per column (`layer0`, `layer1`, …).
pub fn from_weights(weights: &VertexEdgeWeights) -> Constraints {
    let n = weights.vertex_weights.nrows();
    let columns = (0..weights.num_constraints())
        .map(|c| {
            let col = weights
                .vertex_weights
                .column(c)
                .iter()
                .map(|&w| w.max(0) as u64)
                .collect();
            (format!("layer{c}"), col)
        })
        .collect();
    assemble(n, columns)
}

/// Interleave columns into METIS' layout. Each column is divided by a common factor when its
/// total would overflow METIS' 32-bit sums, and columns of total weight 0 are dropped (METIS
/// divides by each constraint's total); when none is left, vertices are balanced by count.
fn assemble(n: usize, columns: Vec<(String, Vec<u64>)>) -> Constraints {
    let budget = (i32::MAX as u64) / 2;
    let mut kept: Vec<(String, Vec<u64>)> = Vec::new();
    for (name, mut col) in columns {
        let total: u64 = col.iter().sum();
        let scale = total.div_ceil(budget).max(1);
        if scale > 1 {
            log::info!("constraint `{name}`: weights divided by {scale} to fit METIS' 32 bits");
            col.iter_mut().for_each(|w| *w /= scale);
        }
        if col.iter().all(|&w| w == 0) {
            log::warn!("constraint `{name}` has total weight 0 and is not balanced");
            continue;
        }
        kept.push((name, col));
    }
    if kept.is_empty() {
        log::warn!("no constraint with positive weight: balancing vertex counts instead");
        kept.push(("vertices".to_string(), vec![1; n]));
    }
    let ncon = kept.len();
    let mut weights = vec![0 as Idx; n * ncon];
    for (c, (_, col)) in kept.iter().enumerate() {
        for (v, &w) in col.iter().enumerate() {
            weights[v * ncon + c] = w as Idx;
        }
    }
    Constraints {
        names: kept.into_iter().map(|(name, _)| name).collect(),
        weights,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::{Csr, Splits};
    use ndarray::Array2;

    fn tiny() -> Dataset {
        Dataset {
            name: "t".into(),
            num_nodes: 3,
            first_node: 0,
            graph: Csr::from_edges(3, &[0, 0, 2], &[1, 2, 0]),
            features: None,
            labels: None,
            num_classes: 0,
            splits: Splits {
                train: vec![2],
                ..Default::default()
            },
            directed: true,
        }
    }

    #[test]
    fn balance_columns_are_interleaved_per_vertex() {
        let c = from_balance(
            &tiny(),
            &[Balance::Vertices, Balance::Edges, Balance::Train],
        )
        .unwrap();
        assert_eq!(c.names, ["vertices", "edges", "train"]);
        assert_eq!(c.weights, vec![1, 2, 0, 1, 0, 0, 1, 1, 1]);
    }

    #[test]
    fn zero_columns_are_dropped() {
        let mut ds = tiny();
        ds.splits.train.clear();
        let c = from_balance(&ds, &[Balance::Train, Balance::Edges]).unwrap();
        assert_eq!(c.names, ["edges"]);
        let w = VertexEdgeWeights {
            vertex_weights: Array2::zeros((3, 2)),
            edge_weights: vec![0; 3],
            epochs: 1,
        };
        assert_eq!(from_weights(&w).names, ["vertices"]);
    }
}
