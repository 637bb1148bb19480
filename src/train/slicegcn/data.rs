//! What a SliceGCN rank loads: the whole topology, labels and splits, and only the feature
//! columns its slice needs (all of them under feature fusion). A dataset file is read with a
//! column hyperslab ([`format::read_dataset_columns`]), so a rank's feature memory falls with
//! its slice; the synthetic default is generated whole and cut.

use super::layout::SliceLayout;
use crate::comm::Group;
use crate::config::{FeatureNorm, TrainConfig};
use crate::graph::{format, parts, Dataset};
use crate::train::data::{normalize_rows, TrainData};
use anyhow::{bail, Context, Result};
use ndarray::s;
use std::path::Path;

/// The dataset's feature width, read before the slice is chosen: from the file's header, or
/// by generating the synthetic default (which [`load`] then cuts).
pub fn feature_dim(path: Option<&Path>, seed: u64) -> Result<(usize, Option<Dataset>)> {
    match path {
        None => {
            let ds = crate::graph::generate::synthetic_default(seed);
            let d = ds.features.as_ref().map_or(0, |f| f.ncols());
            Ok((d, Some(ds)))
        }
        Some(p) if parts::is_parts_dir(p) => bail!(
            "`{}` is a partition directory; --strategy slicegcn holds the whole graph on every \
             rank, so give it the dataset file (`gnnpar prepare`'s output) instead",
            p.display()
        ),
        Some(p) => {
            let header = format::read_header(p)?;
            header.require_whole(p, crate::train::data::TRAIN_ON_WHOLE_FILE)?;
            Ok((header.feature_dim, None))
        }
    }
}

/// Load the whole graph with the columns `layout.read_cols`, as a one-rank [`TrainData`]
/// (`solo`: a group of this rank alone, since nothing of the data is divided among ranks).
pub fn load(
    path: Option<&Path>,
    generated: Option<Dataset>,
    layout: &SliceLayout,
    cfg: &TrainConfig,
    solo: &Group,
) -> Result<TrainData> {
    let cols = layout.read_cols.clone();
    // Row normalisation divides by a sum over all columns: it needs whole rows first.
    let whole_rows = cfg.feature_norm == FeatureNorm::Row;
    let mut ds = match (path, generated) {
        (_, Some(ds)) => ds,
        (Some(p), None) if whole_rows => format::read_dataset(p)?,
        (Some(p), None) => format::read_dataset_columns(p, cols.clone())?,
        (None, None) => bail!("slicegcn: no dataset given and none generated"),
    };
    let name = ds.name.clone();
    if let Some(f) = ds.features.as_mut() {
        if whole_rows {
            normalize_rows(f);
        }
        if f.ncols() != cols.len() {
            *f = f.slice(s![.., cols.clone()]).to_owned();
        }
    }
    let n = ds.num_nodes;
    // Normalised above (on whole rows); the slice must not be normalised again.
    let cfg = TrainConfig {
        feature_norm: FeatureNorm::None,
        ..cfg.clone()
    };
    TrainData::from_part(ds, vec![0, n], None, &cfg, solo)
        .with_context(|| format!("cannot train slicegcn on `{name}`"))
}
