//! What a rank trains on: the part of the graph it owns (contiguous global ids
//! `offsets[rank]..offsets[rank+1]`), its feature store, labels and splits, and the global list
//! of training vertices, whatever the source (the in-process synthetic default, a
//! `dataset.h5`, or a partition directory).

use super::metrics::MetricKind;
use crate::comm::Group;
use crate::config::{FeatureNorm, TrainConfig};
use crate::exchange::FeatureStore;
use crate::graph::{format, parts, Csr, Dataset, Labels, NodeId, Splits};
use crate::kinds::Strategy;
use anyhow::{bail, Context, Result};
use ndarray::{s, Array2};
use rayon::prelude::*;
use std::path::Path;

/// The training view of this rank's part.
pub struct TrainData {
    /// The owned part (features and labels moved into `store` and `labels`).
    pub part: Dataset,
    /// Ownership ranges: rank `r` owns global ids `offsets[r]..offsets[r+1]`.
    pub offsets: Vec<u64>,
    /// Original id of every vertex, indexed by global id, when a partitioner relabelled the
    /// graph; `None` when global ids are original ids. Sampling and dropout are keyed by it.
    pub orig_ids: Option<Vec<u64>>,
    /// Own feature rows, remote rows on demand, and a cache.
    pub store: FeatureStore,
    /// Labels of the owned vertices.
    pub labels: Vec<i64>,
    pub num_classes: usize,
    pub metric: MetricKind,
    /// Training vertices of the whole graph (global ids, sorted), the same on every rank.
    pub train_all: Vec<NodeId>,
    /// GCN only: every global vertex's degree `D_u` in the whole graph, the same on every rank
    /// ([`TrainData::build_gcn_degrees`]); `None` for other models.
    pub gcn_degrees: Option<Vec<u32>>,
    /// Feature-sliced strategies (NFP): this rank's columns of the input features and the
    /// whole graph's topology. `store` then holds every vertex's row of these columns only.
    pub sliced: Option<super::columns::SlicedInput>,
    /// Whether the rows came from a partition directory. Such data cannot be cut into column
    /// slices (its files hold whole rows per part), so `auto` does not pick NFP for it.
    pub from_parts: bool,
}

/// What to pass instead of one part file: training reads a whole dataset file or all parts.
pub(crate) const TRAIN_ON_WHOLE: &str =
    "train on the partition directory that holds it (parts/), or on the whole dataset.h5";

/// The same for the strategies that read column slices of a dataset file (nfp, slicegcn).
pub(crate) const TRAIN_ON_WHOLE_FILE: &str =
    "this strategy reads column slices of the whole dataset.h5: pass that file";

impl TrainData {
    /// Load this rank's data, partitioned over `group`: the world for most strategies, the
    /// node for `hybrid` (every node holds a full replica of the graph, split over its ranks).
    /// `None` = the synthetic default generated in-process (the same on every rank, from the
    /// config's seed). A dataset file is split into contiguous ranges of vertices, one per
    /// rank of `group`; a partition directory must have one part per rank of `group` (a
    /// single-rank group reads all parts). Collective over `group`.
    pub fn load(path: Option<&Path>, cfg: &TrainConfig, group: &Group) -> Result<TrainData> {
        if cfg.strategy == Strategy::Nfp {
            return super::columns::load_sliced(path, cfg, group);
        }
        let (rank, ranks) = (group.rank(), group.size());
        let (part, offsets, orig_ids) = match path {
            None => {
                log::info!("no --data given: generating the synthetic default graph in-process");
                let ds = crate::graph::generate::synthetic_default(cfg.seed);
                split_contiguous(ds, rank, ranks)
            }
            Some(p) if parts::is_parts_dir(p) => {
                let meta = parts::read_meta(p)?;
                if ranks == 1 {
                    let whole = read_all_parts(p, &meta)?;
                    let n = whole.num_nodes;
                    (whole, vec![0, n], Some(meta.orig_id))
                } else if meta.num_parts != ranks {
                    bail!(parts_mismatch(p, meta.num_parts, ranks, cfg.strategy));
                } else {
                    let part = parts::read_part(p, &meta, rank)?;
                    (part, meta.offsets, Some(meta.orig_id))
                }
            }
            Some(p) => {
                format::read_header(p)?.require_whole(p, TRAIN_ON_WHOLE)?;
                split_contiguous(format::read_dataset(p)?, rank, ranks)
            }
        };
        let source = path.map_or("the synthetic default".to_string(), |p| {
            format!("`{}`", p.display())
        });
        let mut data = TrainData::from_part(part, offsets, orig_ids, cfg, group)
            .with_context(|| format!("cannot train on {source}"))?;
        data.from_parts = path.is_some_and(parts::is_parts_dir);
        Ok(data)
    }

    /// Check a part has what training needs, normalise its features, and gather the global
    /// training set. Collective over `group` (the ranks `offsets` divides the graph among).
    pub fn from_part(
        mut part: Dataset,
        offsets: Vec<u64>,
        orig_ids: Option<Vec<u64>>,
        cfg: &TrainConfig,
        group: &Group,
    ) -> Result<TrainData> {
        let name = part.name.clone();
        let mut features = part.features.take().with_context(|| {
            format!("dataset `{name}` has no `features`; training needs node features")
        })?;
        let labels = match part.labels.take() {
            Some(Labels::Class(l)) => l,
            Some(Labels::Multi(_)) => bail!(
                "dataset `{name}` has multi-label `labels`; gnnpar trains single-label node \
                 classification (one class per node)"
            ),
            None => bail!("dataset `{name}` has no `labels`; training needs node labels"),
        };
        if part.num_classes < 2 {
            bail!(
                "dataset `{name}` has `num_classes` = {}; classification needs at least 2",
                part.num_classes
            );
        }
        if cfg.feature_norm == FeatureNorm::Row {
            normalize_rows(&mut features);
        }
        let (mut train_all, _) = group.allgatherv("train_ids", &part.splits.train);
        train_all.sort_unstable();
        if train_all.is_empty() {
            bail!("dataset `{name}` has an empty `train_idx`; nothing to train on");
        }
        let metric = MetricKind::for_classes(part.num_classes);
        let store = FeatureStore::new(offsets.clone(), group.rank(), features);
        Ok(TrainData {
            num_classes: part.num_classes,
            part,
            offsets,
            orig_ids,
            store,
            labels,
            metric,
            train_all,
            gcn_degrees: None,
            sliced: None,
            from_parts: false,
        })
    }

    /// Fill [`TrainData::gcn_degrees`]: each rank contributes the neighbour counts of the
    /// vertices it owns (+1 with self-loops, matching `Block::with_self_loops`), gathered in
    /// rank order, which is global id order (contiguous ownership). GCN normalises an edge
    /// `u → v` by `D_u`, which a rank that does not own `u` cannot count from its own edges.
    /// Costs 4 bytes per vertex of the graph on every rank. Collective over the ranks the graph is partitioned over (`group`).
    pub fn build_gcn_degrees(&mut self, group: &Group, self_loops: bool) -> Result<()> {
        let g = &self.part.graph;
        let extra = u64::from(self_loops);
        let mine = (0..g.num_rows())
            .map(|r| {
                let d = g.degree(r) as u64 + extra;
                u32::try_from(d).with_context(|| {
                    format!(
                        "vertex {} has {d} neighbours; GCN's degree table holds 32-bit degrees",
                        self.part.first_node + r as u64
                    )
                })
            })
            .collect::<Result<Vec<u32>>>()?;
        let (all, _) = group.allgatherv("gcn_degrees", &mine);
        let n = *self.offsets.last().unwrap_or(&0);
        if all.len() as u64 != n {
            bail!(
                "GCN degree table has {} entries for a graph of {n} vertices",
                all.len()
            );
        }
        self.gcn_degrees = Some(all);
        Ok(())
    }

    /// Original id of global vertex `v`.
    pub fn orig_of(&self, v: NodeId) -> u64 {
        self.orig_ids.as_ref().map_or(v as u64, |o| o[v as usize])
    }

    /// Does this rank own global vertex `v`?
    pub fn owns(&self, v: NodeId) -> bool {
        let v = v as u64;
        v >= self.part.first_node && v < self.part.first_node + self.part.local_nodes() as u64
    }

    /// Label of an owned vertex.
    pub fn label(&self, v: NodeId) -> i64 {
        self.labels[(v as u64 - self.part.first_node) as usize]
    }

    /// Feature width (of the whole rows, also when this rank holds a slice of the columns).
    pub fn feature_dim(&self) -> usize {
        self.sliced
            .as_ref()
            .map_or(self.store.dim(), |s| s.columns.total)
    }

    /// The owned splits (global ids).
    pub fn splits(&self) -> &Splits {
        &self.part.splits
    }
}

/// Why a partition directory of `parts` parts cannot feed `ranks` ranks (the ranks of the
/// world, or of a node under `hybrid`), and what would.
fn parts_mismatch(dir: &Path, parts: usize, ranks: usize, strategy: Strategy) -> String {
    let dir = dir.display();
    if strategy == Strategy::Hybrid {
        return format!(
            "`{dir}` has {parts} parts but --strategy hybrid needs one part per rank of a node, \
             and a node has {ranks} ranks; partition into {ranks} parts, or group the ranks \
             into nodes of {parts} with --ranks-per-node {parts} (it must divide the job's \
             ranks)"
        );
    }
    let mut msg = format!(
        "`{dir}` has {parts} parts but the job has {ranks} ranks; run {parts} ranks \
         ({}) or partition into {ranks} parts",
        crate::comm::launcher::run_hint(parts)
    );
    if ranks > parts && ranks.is_multiple_of(parts) {
        msg.push_str(&format!(
            ", or give every group of {parts} ranks a full replica of the graph with \
             `--strategy hybrid --ranks-per-node {parts}`"
        ));
    }
    msg
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

/// Keep the contiguous range of vertices rank `rank` of `ranks` owns (an even split by id,
/// no partitioner involved); with one rank, the whole dataset.
pub(super) fn split_contiguous(
    ds: Dataset,
    rank: usize,
    ranks: usize,
) -> (Dataset, Vec<u64>, Option<Vec<u64>>) {
    let n = ds.num_nodes;
    let offsets: Vec<u64> = (0..=ranks as u64).map(|r| n * r / ranks as u64).collect();
    if ranks == 1 {
        return (ds, offsets, None);
    }
    let (lo, hi) = (offsets[rank] as usize, offsets[rank + 1] as usize);
    let (e_lo, e_hi) = (ds.graph.indptr[lo], ds.graph.indptr[hi]);
    let graph = Csr {
        indptr: ds.graph.indptr[lo..=hi].iter().map(|&o| o - e_lo).collect(),
        indices: ds.graph.indices[e_lo as usize..e_hi as usize].to_vec(),
    };
    let keep = |ids: &[NodeId]| -> Vec<NodeId> {
        ids.iter()
            .copied()
            .filter(|&v| (lo..hi).contains(&(v as usize)))
            .collect()
    };
    let part = Dataset {
        name: ds.name.clone(),
        num_nodes: n,
        first_node: lo as u64,
        graph,
        features: ds
            .features
            .as_ref()
            .map(|f| f.slice(s![lo..hi, ..]).to_owned()),
        labels: ds.labels.as_ref().map(|l| match l {
            Labels::Class(v) => Labels::Class(v[lo..hi].to_vec()),
            Labels::Multi(m) => Labels::Multi(m.slice(s![lo..hi, ..]).to_owned()),
        }),
        num_classes: ds.num_classes,
        splits: Splits {
            train: keep(&ds.splits.train),
            val: keep(&ds.splits.val),
            test: keep(&ds.splits.test),
        },
        directed: ds.directed,
    };
    (part, offsets, None)
}

/// Read every part of a partition directory into one relabelled whole graph (single-rank
/// training on partitioned data).
fn read_all_parts(dir: &Path, meta: &parts::PartitionMeta) -> Result<Dataset> {
    let mut indptr = vec![0u64];
    let mut indices: Vec<NodeId> = Vec::with_capacity(meta.num_edges as usize);
    let mut feature_rows = Vec::new();
    let mut labels = Vec::new();
    let mut splits = Splits::default();
    let (mut name, mut classes, mut directed) = (String::new(), 0, true);
    let mut have_labels = true;
    for p in 0..meta.num_parts {
        let part = parts::read_part(dir, meta, p)?;
        let base = *indptr.last().unwrap_or(&0);
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
    Ok(Dataset {
        name,
        num_nodes: meta.num_nodes(),
        first_node: 0,
        graph: Csr { indptr, indices },
        features,
        labels: have_labels.then_some(Labels::Class(labels)),
        num_classes: classes,
        splits,
        directed,
    })
}
