//! What a rank of a feature-sliced strategy (NFP) trains on: a balanced slice of the input
//! features' columns for **every** vertex, the whole graph's topology (it computes the input
//! layer's partial sums for any rank's destinations, and for every vertex in evaluation), and,
//! as under GDP, a contiguous range of vertices whose seeds, labels and splits it owns.
//!
//! The data come from the unpartitioned `dataset.h5` (only this rank's columns are read,
//! [`format::read_dataset_columns`]) or the in-process synthetic default. A partition
//! directory is refused: NFP needs no partition (every rank holds every vertex's columns), and
//! the parts store whole rows per part, so reading them would load every feature on every rank.

use super::data::{split_contiguous, TrainData};
use crate::comm::Group;
use crate::config::{FeatureNorm, TrainConfig};
use crate::exchange::FeatureStore;
use crate::graph::{format, parts, Csr, Dataset, Splits};
use anyhow::{bail, Context, Result};
use ndarray::{s, Array2};
use std::ops::Range;
use std::path::Path;

/// Columns `range` of `total` input feature columns.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ColumnSlice {
    pub range: Range<usize>,
    pub total: usize,
}

impl ColumnSlice {
    /// Rank `rank`'s share of `total` columns split as evenly as possible over `ranks`
    /// (`⌊total·r/ranks⌋ .. ⌊total·(r+1)/ranks⌋`: widths differ by at most one).
    pub fn balanced(total: usize, rank: usize, ranks: usize) -> ColumnSlice {
        ColumnSlice {
            range: total * rank / ranks..total * (rank + 1) / ranks,
            total,
        }
    }

    /// Columns held.
    pub fn width(&self) -> usize {
        self.range.len()
    }
}

/// A feature-sliced rank's extra data: its columns and the whole topology (no features,
/// labels or splits: those of the owned range are in [`TrainData`]).
pub struct SlicedInput {
    pub columns: ColumnSlice,
    pub topology: Dataset,
}

/// Load this rank's columns of every vertex, the whole topology, and the contiguous range of
/// vertices it owns (seeds, labels, splits). Collective over `group`.
pub fn load_sliced(path: Option<&Path>, cfg: &TrainConfig, group: &Group) -> Result<TrainData> {
    let (rank, ranks) = (group.rank(), group.size());
    let (mut ds, columns) = match path {
        Some(p) if parts::is_parts_dir(p) => bail!(
            "--strategy nfp reads the unpartitioned dataset file: every rank holds a slice of \
             the feature columns of every vertex, which a partition directory (whole rows per \
             part) cannot serve; pass the `dataset.h5` that `{}` was made from",
            p.display()
        ),
        Some(p) => {
            let header = format::read_header(p)?;
            header.require_whole(p, super::data::TRAIN_ON_WHOLE_FILE)?;
            let total = header.feature_dim;
            let columns = slice_for(total, rank, ranks, &p.display().to_string())?;
            (
                format::read_dataset_columns(p, columns.range.clone())?,
                columns,
            )
        }
        None => {
            log::info!("no --data given: generating the synthetic default graph in-process");
            let mut ds = crate::graph::generate::synthetic_default(cfg.seed);
            let total = ds.features.as_ref().map_or(0, |f| f.ncols());
            let columns = slice_for(total, rank, ranks, "the synthetic default")?;
            ds.features = ds
                .features
                .map(|f| f.slice(s![.., columns.range.clone()]).to_owned());
            (ds, columns)
        }
    };
    let name = ds.name.clone();
    let mut x = ds
        .features
        .take()
        .with_context(|| format!("dataset `{name}` has no `features`; training needs them"))?;
    if cfg.feature_norm == FeatureNorm::Row {
        normalize_rows_sliced(group, &mut x);
    }
    let topology = Dataset {
        name: ds.name.clone(),
        num_nodes: ds.num_nodes,
        first_node: 0,
        graph: Csr {
            indptr: ds.graph.indptr.clone(),
            indices: ds.graph.indices.clone(),
        },
        features: None,
        labels: None,
        num_classes: ds.num_classes,
        splits: Splits::default(),
        directed: ds.directed,
    };
    let (mut part, offsets, orig_ids) = split_contiguous(ds, rank, ranks);
    // The owned range's rows are never read as such (the store below holds every row of
    // this rank's columns); `from_part` checks the rest of the part.
    part.features = Some(Array2::zeros((part.local_nodes(), 0)));
    let mut data = TrainData::from_part(part, offsets, orig_ids, cfg, group)?;
    let n = topology.num_nodes;
    data.store = FeatureStore::new(vec![0, n], 0, x);
    data.sliced = Some(SlicedInput { columns, topology });
    Ok(data)
}

/// Rank `rank`'s balanced slice of `total` columns, refused when some rank would hold none.
fn slice_for(total: usize, rank: usize, ranks: usize, source: &str) -> Result<ColumnSlice> {
    if total < ranks {
        bail!(
            "--strategy nfp splits the feature columns over the ranks, but {source} has {total} \
             feature columns for {ranks} ranks; run at most {total} ranks, or use --strategy gdp"
        );
    }
    Ok(ColumnSlice::balanced(total, rank, ranks))
}

/// Row normalisation (`x_v / Σ_c |x_vc|`) of sliced rows: each rank sums its columns of every
/// row and the sums are added over ranks, so every rank divides by the whole row's sum.
/// Collective.
fn normalize_rows_sliced(group: &Group, x: &mut Array2<f32>) {
    let mut sums: Vec<f64> = x
        .rows()
        .into_iter()
        .map(|r| r.iter().map(|v| v.abs() as f64).sum())
        .collect();
    group.allreduce_sum_f64(&mut sums);
    for (mut row, &s) in x.rows_mut().into_iter().zip(&sums) {
        if s > 0.0 {
            let s = s as f32;
            row.mapv_inplace(|v| v / s);
        }
    }
}
