//! The pre-sampling weights file `weights.h5` (written by `gnnpar presample`, read by
//! `gnnpar partition --weights`). See `docs/format.md`, section "weights.h5".
//!
//! Attributes: `format_version` (u32, = [`WEIGHTS_FORMAT_VERSION`]), `num_nodes` (u64),
//! `num_edges` (u64), `epochs` (u64, pre-sampling epochs the counts were averaged over).
//! Datasets: `vertex_weights` (i64, n × ncon, one column per GNN layer) and `edge_weights`
//! (i64, m, aligned with the dataset's `indices` array: entry `e` weighs the edge stored at
//! `indices[e]`). Ids are those of the unpartitioned dataset.

use crate::util::{atomic::AtomicOutput, h5};
use anyhow::{bail, Context, Result};
use ndarray::Array2;
use std::path::Path;

/// The version of the weights file this build writes and the only one it reads.
pub const WEIGHTS_FORMAT_VERSION: u32 = 1;

/// Per-vertex (one column per constraint, usually per layer) and per-edge integer weights.
#[derive(Clone, Debug, PartialEq)]
pub struct VertexEdgeWeights {
    /// `vertex_weights[[v, c]]`: weight of vertex `v` under constraint `c` (≥ 0).
    pub vertex_weights: Array2<i64>,
    /// `edge_weights[e]`: weight of the edge stored at `indices[e]` of the dataset (≥ 0).
    pub edge_weights: Vec<i64>,
    /// Number of pre-sampling epochs the weights were averaged over.
    pub epochs: u64,
}

impl VertexEdgeWeights {
    /// Number of vertices weighed.
    pub fn num_nodes(&self) -> u64 {
        self.vertex_weights.nrows() as u64
    }

    /// Number of edges weighed.
    pub fn num_edges(&self) -> u64 {
        self.edge_weights.len() as u64
    }

    /// Number of vertex constraints (columns of `vertex_weights`).
    pub fn num_constraints(&self) -> usize {
        self.vertex_weights.ncols()
    }

    /// Check that these weights fit a dataset of `num_nodes` vertices and `num_edges` stored
    /// edges; `what` names the weights file in the error.
    pub fn check_fits(&self, num_nodes: u64, num_edges: u64, what: &str) -> Result<()> {
        if self.num_nodes() != num_nodes {
            bail!(
                "{what}: `vertex_weights` has {} rows but the dataset has {num_nodes} vertices \
                 (weights must come from `gnnpar presample` on the same dataset)",
                self.num_nodes()
            );
        }
        if self.num_edges() != num_edges {
            bail!(
                "{what}: `edge_weights` has {} entries but the dataset has {num_edges} edges \
                 (weights must come from `gnnpar presample` on the same dataset)",
                self.num_edges()
            );
        }
        Ok(())
    }

    /// Check internal consistency: at least one constraint, no negative weight.
    fn validate(&self, what: &str) -> Result<()> {
        if self.num_constraints() == 0 {
            bail!("{what}: `vertex_weights` has no columns (expected one per layer)");
        }
        if let Some((i, &w)) = self.vertex_weights.iter().enumerate().find(|(_, &w)| w < 0) {
            let ncon = self.num_constraints();
            bail!(
                "{what}: `vertex_weights[{}, {}]` = {w}; weights are counts and must be ≥ 0",
                i / ncon,
                i % ncon
            );
        }
        if let Some((i, &w)) = self.edge_weights.iter().enumerate().find(|(_, &w)| w < 0) {
            bail!("{what}: `edge_weights[{i}]` = {w}; weights are counts and must be ≥ 0");
        }
        Ok(())
    }
}

/// Read and check `path` (format version, shapes against the attributes, no negative weight).
pub fn read_weights(path: &Path) -> Result<VertexEdgeWeights> {
    let file = h5::open(path)?;
    let what = format!("`{}`", path.display());
    (|| -> Result<VertexEdgeWeights> {
        let version: u32 = h5::read_attr(&file, "format_version")?;
        if version != WEIGHTS_FORMAT_VERSION {
            bail!(
                "{what}: unknown `format_version` {version} (this gnnpar reads weights version \
                 {WEIGHTS_FORMAT_VERSION})"
            );
        }
        let num_nodes: u64 = h5::read_attr(&file, "num_nodes")?;
        let num_edges: u64 = h5::read_attr(&file, "num_edges")?;
        let epochs: u64 = h5::read_attr(&file, "epochs")?;
        let vertex_weights = h5::read_matrix::<i64>(&file, "vertex_weights")?;
        let edge_weights = h5::read_vec::<i64>(&file, "edge_weights")?;
        let weights = VertexEdgeWeights {
            vertex_weights,
            edge_weights,
            epochs,
        };
        if weights.num_nodes() != num_nodes {
            bail!(
                "{what}: `vertex_weights` has {} rows but attribute `num_nodes` is {num_nodes}",
                weights.num_nodes()
            );
        }
        if weights.num_edges() != num_edges {
            bail!(
                "{what}: `edge_weights` has {} entries but attribute `num_edges` is {num_edges}",
                weights.num_edges()
            );
        }
        weights.validate(&what)?;
        Ok(weights)
    })()
    .with_context(|| format!("reading weights file `{}`", path.display()))
}

/// Write `weights` to `path` atomically (temporary name, then rename).
pub fn write_weights(weights: &VertexEdgeWeights, path: &Path) -> Result<()> {
    let what = format!("`{}`", path.display());
    weights.validate(&what)?;
    let out = AtomicOutput::new(path)?;
    (|| -> Result<()> {
        let file = h5::create(out.tmp_path())?;
        h5::write_attr(&file, "format_version", WEIGHTS_FORMAT_VERSION)?;
        h5::write_attr(&file, "num_nodes", weights.num_nodes())?;
        h5::write_attr(&file, "num_edges", weights.num_edges())?;
        h5::write_attr(&file, "epochs", weights.epochs)?;
        h5::write_matrix(&file, "vertex_weights", weights.vertex_weights.view())?;
        h5::write_vec(&file, "edge_weights", &weights.edge_weights)?;
        file.flush().context("flushing HDF5 file")?;
        Ok(())
    })()
    .with_context(|| format!("writing weights file `{}`", path.display()))?;
    out.commit()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> VertexEdgeWeights {
        VertexEdgeWeights {
            vertex_weights: Array2::from_shape_vec((3, 2), vec![1, 2, 0, 4, 5, 6]).unwrap(),
            edge_weights: vec![7, 0, 9, 1],
            epochs: 10,
        }
    }

    #[test]
    fn round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("w.h5");
        let w = sample();
        write_weights(&w, &path).unwrap();
        assert_eq!(read_weights(&path).unwrap(), w);
    }

    #[test]
    fn negative_weights_are_refused_with_their_position() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = sample();
        w.vertex_weights[[2, 1]] = -3;
        let err = write_weights(&w, &dir.path().join("w.h5")).unwrap_err();
        assert!(
            format!("{err:#}").contains("vertex_weights[2, 1]"),
            "{err:#}"
        );
        assert!(!dir.path().join("w.h5").exists());
    }

    #[test]
    fn shape_mismatch_names_the_field() {
        let w = sample();
        let err = w.check_fits(4, 4, "`w.h5`").unwrap_err().to_string();
        assert!(err.contains("vertex_weights") && err.contains('4'), "{err}");
        let err = w.check_fits(3, 5, "`w.h5`").unwrap_err().to_string();
        assert!(err.contains("edge_weights"), "{err}");
        w.check_fits(3, 4, "`w.h5`").unwrap();
    }
}
