//! Quality of a partition: edge cut and per-part balance.

use super::constraints::Constraints;
use crate::graph::Dataset;
use rayon::prelude::*;
use serde::Serialize;
use std::fmt::Write as _;

/// What `gnnpar partition` reports (printed as text, or as JSON with `--json`).
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct PartitionStats {
    pub name: String,
    pub method: String,
    /// `none` or the weights file.
    pub weights: String,
    /// The constraints METIS balanced (empty for the baselines).
    pub constraints: Vec<String>,
    pub num_parts: usize,
    pub num_nodes: u64,
    pub num_edges: u64,
    /// Stored edges whose endpoints lie in different parts (each direction counts).
    pub edge_cut: u64,
    pub edge_cut_percent: f64,
    pub part_vertices: Vec<u64>,
    pub part_edges: Vec<u64>,
    pub part_train: Vec<u64>,
    /// max / mean over parts (1.0 when there is nothing to balance).
    pub vertex_imbalance: f64,
    pub edge_imbalance: f64,
    pub train_imbalance: f64,
    /// max / mean of each balanced constraint's load, in the order of `constraints`.
    pub constraint_imbalance: Vec<f64>,
    /// Seconds computing the assignment (symmetrising and METIS, or the baseline).
    pub partition_seconds: f64,
    /// Seconds for the whole command (reading, partitioning, writing).
    pub total_seconds: f64,
}

impl PartitionStats {
    /// Measure the partition `part` of the whole dataset `ds`. Timings are filled in later.
    pub fn measure(
        ds: &Dataset,
        part: &[u32],
        parts: usize,
        constraints: Option<&Constraints>,
    ) -> PartitionStats {
        let n = ds.local_nodes();
        let mut part_vertices = vec![0u64; parts];
        let mut part_edges = vec![0u64; parts];
        let mut part_train = vec![0u64; parts];
        for (v, &p) in part.iter().enumerate() {
            part_vertices[p as usize] += 1;
            part_edges[p as usize] += ds.graph.degree(v) as u64;
        }
        for &v in &ds.splits.train {
            part_train[part[v as usize] as usize] += 1;
        }
        let constraint_imbalance = constraints
            .map(|c| {
                (0..c.ncon())
                    .map(|k| {
                        let mut load = vec![0u64; parts];
                        for (v, &p) in part.iter().enumerate() {
                            load[p as usize] += c.get(v, k) as u64;
                        }
                        imbalance(&load)
                    })
                    .collect()
            })
            .unwrap_or_default();
        let cut = edge_cut(ds, part);
        let m = ds.local_edges();
        PartitionStats {
            name: ds.name.clone(),
            method: String::new(),
            weights: "none".into(),
            constraints: constraints.map(|c| c.names.clone()).unwrap_or_default(),
            num_parts: parts,
            num_nodes: n as u64,
            num_edges: m,
            edge_cut: cut,
            edge_cut_percent: 100.0 * cut as f64 / m.max(1) as f64,
            vertex_imbalance: imbalance(&part_vertices),
            edge_imbalance: imbalance(&part_edges),
            train_imbalance: imbalance(&part_train),
            part_vertices,
            part_edges,
            part_train,
            constraint_imbalance,
            partition_seconds: 0.0,
            total_seconds: 0.0,
        }
    }

    /// The human-readable report: one summary line, then one line per part.
    pub fn text(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "{}: {} parts by {} (weights {}{}), edge cut {} of {} edges ({:.2}%), \
             imbalance max/mean vertices {:.3} edges {:.3} train {:.3}, \
             partition {:.2} s, total {:.2} s",
            self.name,
            self.num_parts,
            self.method,
            self.weights,
            if self.constraints.is_empty() {
                String::new()
            } else {
                format!("; balancing {}", self.constraints.join(","))
            },
            self.edge_cut,
            self.num_edges,
            self.edge_cut_percent,
            self.vertex_imbalance,
            self.edge_imbalance,
            self.train_imbalance,
            self.partition_seconds,
            self.total_seconds
        );
        if !self.constraint_imbalance.is_empty() {
            let per: Vec<String> = self
                .constraints
                .iter()
                .zip(&self.constraint_imbalance)
                .map(|(n, i)| format!("{n} {i:.3}"))
                .collect();
            let _ = writeln!(s, "constraint imbalance max/mean: {}", per.join(", "));
        }
        for p in 0..self.num_parts {
            let _ = writeln!(
                s,
                "part {p}: {} vertices, {} edges, {} train",
                self.part_vertices[p], self.part_edges[p], self.part_train[p]
            );
        }
        s
    }
}

/// Stored edges `u → v` with `part[u] != part[v]`, counted in parallel over rows.
pub fn edge_cut(ds: &Dataset, part: &[u32]) -> u64 {
    (0..ds.local_nodes())
        .into_par_iter()
        .map(|u| {
            let pu = part[u];
            ds.graph
                .neighbors(u)
                .iter()
                .filter(|&&v| part[v as usize] != pu)
                .count() as u64
        })
        .sum()
}

/// max / mean of per-part loads; 1.0 when every load is 0.
pub fn imbalance(load: &[u64]) -> f64 {
    let total: u64 = load.iter().sum();
    if total == 0 || load.is_empty() {
        return 1.0;
    }
    let max = *load.iter().max().unwrap_or(&0) as f64;
    max / (total as f64 / load.len() as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn imbalance_is_max_over_mean() {
        assert_eq!(imbalance(&[2, 2, 2]), 1.0);
        assert_eq!(imbalance(&[3, 1]), 1.5);
        assert_eq!(imbalance(&[0, 0]), 1.0);
    }
}
