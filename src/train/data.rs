//! What training reads: the graph, normalised features, labels and splits, whatever the source
//! (the in-process synthetic default, a `dataset.h5`, or a partition directory).

use super::metrics::MetricKind;
use crate::comm::World;
use crate::config::{FeatureNorm, TrainConfig};
use crate::graph::{format, parts, Csr, Dataset, Labels, NodeId, Splits};
use anyhow::{bail, Context, Result};
use ndarray::Array2;
use rayon::prelude::*;
use std::path::Path;

/// The training view of a dataset.
pub struct TrainData {
    /// The graph with its splits (features and labels moved out into the fields below).
    pub ds: Dataset,
    /// Original id of every vertex, indexed by global id, when the graph was relabelled by a
    /// partitioner; `None` means ids are original. Sampling and dropout are keyed by it.
    pub orig_ids: Option<Vec<u64>>,
    pub features: Array2<f32>,
    pub labels: Vec<i64>,
    pub num_classes: usize,
    pub metric: MetricKind,
}

impl TrainData {
    /// Load the data a run trains on. `None` = the synthetic default generated in-process
    /// (the same on every rank, from the config's seed).
    pub fn load(path: Option<&Path>, cfg: &TrainConfig, world: &World) -> Result<TrainData> {
        let (ds, orig_ids) = match path {
            None => {
                log::info!("no --data given: generating the synthetic default graph in-process");
                (crate::graph::generate::synthetic_default(cfg.seed), None)
            }
            Some(p) if parts::is_parts_dir(p) => {
                let (ds, orig) = read_all_parts(p)?;
                (ds, Some(orig))
            }
            Some(p) => (format::read_dataset(p)?, None),
        };
        let _ = world;
        TrainData::from_dataset(ds, orig_ids, cfg)
    }

    /// Prepare a dataset for training: check it has what training needs, normalise features.
    pub fn from_dataset(
        mut ds: Dataset,
        orig_ids: Option<Vec<u64>>,
        cfg: &TrainConfig,
    ) -> Result<TrainData> {
        let name = ds.name.clone();
        let mut features = ds.features.take().with_context(|| {
            format!("dataset `{name}` has no `features`; training needs node features")
        })?;
        let labels = match ds.labels.take() {
            Some(Labels::Class(l)) => l,
            Some(Labels::Multi(_)) => bail!(
                "dataset `{name}` has multi-label `labels`; gnnpar trains single-label node \
                 classification (one class per node)"
            ),
            None => bail!("dataset `{name}` has no `labels`; training needs node labels"),
        };
        if ds.num_classes < 2 {
            bail!(
                "dataset `{name}` has `num_classes` = {}; classification needs at least 2",
                ds.num_classes
            );
        }
        if ds.splits.train.is_empty() {
            bail!("dataset `{name}` has an empty `train_idx`; nothing to train on");
        }
        if cfg.feature_norm == FeatureNorm::Row {
            normalize_rows(&mut features);
        }
        let metric = MetricKind::for_classes(ds.num_classes);
        Ok(TrainData {
            num_classes: ds.num_classes,
            ds,
            orig_ids,
            features,
            labels,
            metric,
        })
    }

    /// Original id of global vertex `v`.
    pub fn orig_of(&self, v: NodeId) -> u64 {
        self.orig_ids.as_ref().map_or(v as u64, |o| o[v as usize])
    }

    /// The splits (global ids).
    pub fn splits(&self) -> &Splits {
        &self.ds.splits
    }
}

/// Divide each row by the sum of its absolute values; zero rows stay zero.
pub fn normalize_rows(x: &mut Array2<f32>) {
    x.axis_iter_mut(ndarray::Axis(0))
        .into_par_iter()
        .for_each(|mut row| {
            let s: f32 = row.iter().map(|v| v.abs()).sum();
            if s > 0.0 {
                row.mapv_inplace(|v| v / s);
            }
        });
}

/// Read every part of a partition directory into one relabelled whole graph (single-rank
/// training on partitioned data, and replicated data-parallel runs).
fn read_all_parts(dir: &Path) -> Result<(Dataset, Vec<u64>)> {
    let meta = parts::read_meta(dir)?;
    let mut indptr = vec![0u64];
    let mut indices: Vec<NodeId> = Vec::with_capacity(meta.num_edges as usize);
    let mut feature_rows = Vec::new();
    let mut labels = Vec::new();
    let mut splits = Splits::default();
    let (mut name, mut classes, mut directed) = (String::new(), 0, true);
    let mut have_labels = true;
    for p in 0..meta.num_parts {
        let part = parts::read_part(dir, &meta, p)?;
        let base = *indptr.last().unwrap();
        indptr.extend(part.graph.indptr[1..].iter().map(|&o| o + base));
        indices.extend_from_slice(&part.graph.indices);
        if let Some(f) = part.features {
            feature_rows.push(f);
        }
        match part.labels {
            Some(Labels::Class(l)) => labels.extend(l),
            _ => have_labels = false,
        }
        splits.train.extend(&part.splits.train);
        splits.val.extend(&part.splits.val);
        splits.test.extend(&part.splits.test);
        name = part.name;
        classes = part.num_classes;
        directed = part.directed;
    }
    let features = if feature_rows.len() == meta.num_parts {
        let views: Vec<_> = feature_rows.iter().map(|f| f.view()).collect();
        Some(ndarray::concatenate(ndarray::Axis(0), &views)?)
    } else {
        None
    };
    let ds = Dataset {
        name,
        num_nodes: meta.num_nodes(),
        first_node: 0,
        graph: Csr { indptr, indices },
        features,
        labels: have_labels.then_some(Labels::Class(labels)),
        num_classes: classes,
        splits,
        directed,
    };
    Ok((ds, meta.orig_id))
}
