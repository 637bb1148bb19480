//! Summary statistics of a dataset, printed by `prepare`, `generate` and `info`.

use super::Dataset;
use serde::Serialize;

/// Counts and degree statistics of a dataset (or of one part).
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Summary {
    pub name: String,
    pub nodes: u64,
    pub local_nodes: usize,
    pub edges: u64,
    pub features: usize,
    pub classes: usize,
    pub degree_min: usize,
    pub degree_mean: f64,
    pub degree_max: usize,
    pub train: usize,
    pub val: usize,
    pub test: usize,
    pub directed: bool,
}

impl Summary {
    /// Compute the summary of `ds`.
    pub fn of(ds: &Dataset) -> Self {
        let rows = ds.local_nodes();
        let (mut dmin, mut dmax) = (usize::MAX, 0usize);
        for r in 0..rows {
            let d = ds.graph.degree(r);
            dmin = dmin.min(d);
            dmax = dmax.max(d);
        }
        if rows == 0 {
            dmin = 0;
        }
        Summary {
            name: ds.name.clone(),
            nodes: ds.num_nodes,
            local_nodes: rows,
            edges: ds.local_edges(),
            features: ds.feature_dim(),
            classes: ds.num_classes,
            degree_min: dmin,
            degree_mean: ds.local_edges() as f64 / rows.max(1) as f64,
            degree_max: dmax,
            train: ds.splits.train.len(),
            val: ds.splits.val.len(),
            test: ds.splits.test.len(),
            directed: ds.directed,
        }
    }

    /// One human-readable line.
    pub fn line(&self) -> String {
        format!(
            "{}: {} nodes, {} edges ({}), {} features, {} classes, degree min/mean/max {}/{:.2}/{}, \
             split train/val/test {}/{}/{}",
            self.name,
            self.local_nodes,
            self.edges,
            if self.directed { "directed" } else { "undirected, both directions stored" },
            self.features,
            self.classes,
            self.degree_min,
            self.degree_mean,
            self.degree_max,
            self.train,
            self.val,
            self.test
        )
    }
}
