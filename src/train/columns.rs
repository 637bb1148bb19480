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
use ndarray::{s, Array2, ArrayView2};
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
            let even = slice_for(total, rank, ranks, &p.display().to_string())?;
            let mut ds = format::read_dataset_columns(p, even.range.clone())?;
            let columns = match ds.features.as_ref() {
                Some(x) => by_nonzeros(group, x, &even),
                None => even.clone(),
            };
            if columns != even {
                // Read again, this time only the feature columns of the slice.
                ds.features = Some(format::read_feature_columns(p, columns.range.clone())?);
            }
            (ds, columns)
        }
        None => {
            log::info!("no --data given: generating the synthetic default graph in-process");
            let mut ds = crate::graph::generate::synthetic_default(cfg.seed);
            let total = ds.features.as_ref().map_or(0, |f| f.ncols());
            let even = slice_for(total, rank, ranks, "the synthetic default")?;
            let columns = match ds.features.as_ref() {
                Some(x) => {
                    let mine = x.slice(s![.., even.range.clone()]).to_owned();
                    by_nonzeros(group, &mine, &even)
                }
                None => even,
            };
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

/// The slice this rank should hold instead of `even` (its share by width, whose columns `x`
/// holds) so that every rank holds about the same number of **non-zeros**, where the features
/// are mostly zeros: a rank then reads and multiplies its slice as CSR, by its non-zeros, and
/// bag-of-words columns are far from uniform (Facebook's two halves by width hold 77k and
/// 237k non-zeros, so one rank waited at every exchange of partial sums). Kept at `even` for
/// dense features (the work is by width), when balancing gains under 10 % on the busiest
/// rank, or when a balanced slice would be too narrow or too dense to stay sparse.
/// Collective over `group`: every rank computes the same slices from the same counts.
fn by_nonzeros(group: &Group, x: &Array2<f32>, even: &ColumnSlice) -> ColumnSlice {
    use crate::backend::cpu::sparse::{density_of_rows, MAX_SPARSE_DENSITY};
    // Dense features (on a sample of rows, on every rank) are not counted: one pass less over
    // every value at start-up.
    let mostly_zeros = density_of_rows(x.view(), 1024) <= MAX_SPARSE_DENSITY;
    if group
        .allgather_u64(mostly_zeros as u64)
        .iter()
        .all(|&z| z == 0)
    {
        return even.clone();
    }
    let mine = column_nonzeros(x.view());
    // Slices are contiguous and in rank order: their counts, gathered, are every column's.
    let (counts, _) = group.allgatherv("nfp_column_nonzeros", &mine);
    let Some(b) = nonzero_bounds(&counts, group.size(), x.nrows()) else {
        return even.clone();
    };
    let rank = group.rank();
    if rank == 0 {
        let nnz: Vec<u64> = b
            .windows(2)
            .map(|w| counts[w[0]..w[1]].iter().sum())
            .collect();
        log::info!(
            "nfp: feature columns sliced by non-zeros, not by width: the features are mostly \
             zeros and each rank multiplies its slice's; bounds {b:?}, non-zeros {nnz:?}"
        );
    }
    ColumnSlice {
        range: b[rank]..b[rank + 1],
        total: even.total,
    }
}

/// The `ranks + 1` bounds of NFP's column slices over `group`'s ranks, as [`load_sliced`] cuts
/// them: the ranks' own where `data` was loaded as slices; else (whole rows, a dry run's
/// layout) from every column's non-zeros over every rank's rows where the features are
/// `mostly_zeros`, by the loader's rule ([`slice_bounds`]), and even widths otherwise. The
/// planner prices each NFP rank by its own slice: on Facebook equal non-zeros give the first
/// of two ranks 4,106 of the 4,714 columns, and with them 87 % of the sliced weights to
/// update. Collective.
pub fn planned_bounds(group: &Group, data: &TrainData, mostly_zeros: bool) -> Vec<usize> {
    let ranks = group.size();
    if let Some(s) = &data.sliced {
        let mut bounds: Vec<usize> = group
            .allgather_u64(s.columns.range.start as u64)
            .into_iter()
            .map(|b| b as usize)
            .collect();
        bounds.push(s.columns.total);
        return bounds;
    }
    let x = data.store.own_rows();
    if !mostly_zeros {
        return even_bounds(x.ncols(), ranks);
    }
    let mut counts: Vec<f64> = column_nonzeros(x).into_iter().map(|c| c as f64).collect();
    // The rows' count rides along in the last slot.
    counts.push(x.nrows() as f64);
    group.allreduce_sum_f64(&mut counts);
    let rows = counts.pop().unwrap_or(0.0) as usize;
    let counts: Vec<u64> = counts.into_iter().map(|c| c as u64).collect();
    slice_bounds(&counts, ranks, rows)
}

/// The non-zeros of each column of `x`.
fn column_nonzeros(x: ArrayView2<'_, f32>) -> Vec<u64> {
    let mut counts = vec![0u64; x.ncols()];
    for row in x.rows() {
        for (n, &v) in counts.iter_mut().zip(row) {
            *n += (v != 0.0) as u64;
        }
    }
    counts
}

/// The `ranks + 1` bounds of NFP's column slices of features whose column `c` holds
/// `counts[c]` non-zeros over `rows` rows: equal non-zeros where that pays
/// ([`nonzero_bounds`]), else even widths.
pub fn slice_bounds(counts: &[u64], ranks: usize, rows: usize) -> Vec<usize> {
    nonzero_bounds(counts, ranks, rows).unwrap_or_else(|| even_bounds(counts.len(), ranks))
}

/// The `ranks + 1` bounds of the even slices of `total` columns.
fn even_bounds(total: usize, ranks: usize) -> Vec<usize> {
    (0..=ranks).map(|r| total * r / ranks).collect()
}

/// Bounds of `ranks` contiguous column slices holding about equal shares of the non-zeros
/// (`counts[c]` in column `c`, over `rows` rows), or `None` where the even slices (by width)
/// should stay: dense features, a gain under 10 % on the busiest slice, or a balanced slice
/// narrower than the sparse path takes (`MIN_SPARSE_COLS`) or denser than half its limit.
fn nonzero_bounds(counts: &[u64], ranks: usize, rows: usize) -> Option<Vec<usize>> {
    use crate::backend::cpu::sparse::{MAX_SPARSE_DENSITY, MIN_SPARSE_COLS};
    let total = counts.len();
    let sum: u64 = counts.iter().sum();
    let density = |nnz: u64, width: usize| nnz as f64 / (rows.max(1) * width.max(1)) as f64;
    if ranks < 2 || sum == 0 || total / ranks < MIN_SPARSE_COLS {
        return None;
    }
    if density(sum, total) > MAX_SPARSE_DENSITY {
        return None;
    }
    let mut prefix = Vec::with_capacity(total + 1);
    prefix.push(0u64);
    for &c in counts {
        prefix.push(prefix.last().unwrap() + c);
    }
    // Bound r: the first column whose prefix reaches r/ranks of the non-zeros, kept at least
    // MIN_SPARSE_COLS after the one before and before the one after.
    let mut bounds = vec![0usize; ranks + 1];
    bounds[ranks] = total;
    for r in 1..ranks {
        let target = (sum as u128 * r as u128 / ranks as u128) as u64;
        let at = prefix.partition_point(|&p| p < target);
        let lo = bounds[r - 1] + MIN_SPARSE_COLS;
        let hi = total - (ranks - r) * MIN_SPARSE_COLS;
        bounds[r] = at.clamp(lo, hi);
    }
    let nnz = |b: &[usize], r: usize| prefix[b[r + 1]] - prefix[b[r]];
    let busiest = |b: &[usize]| (0..ranks).map(|r| nnz(b, r)).max().unwrap_or(0);
    let even = even_bounds(total, ranks);
    let sparse_enough = (0..ranks)
        .all(|r| density(nnz(&bounds, r), bounds[r + 1] - bounds[r]) <= MAX_SPARSE_DENSITY / 2.0);
    (sparse_enough && (busiest(&bounds) as f64) < 0.9 * busiest(&even) as f64).then_some(bounds)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn skewed_sparse_columns_are_sliced_to_equal_non_zeros() {
        // 1,000 rows, 800 columns: the first 200 hold 30 non-zeros each, the rest 2 each
        // (6,000 + 1,200 = 7,200 non-zeros; density 0.9 %).
        let counts: Vec<u64> = (0..800).map(|c| if c < 200 { 30 } else { 2 }).collect();
        // Half the non-zeros (3,600) fall at column 120: 120 × 30.
        assert_eq!(nonzero_bounds(&counts, 2, 1000), Some(vec![0, 120, 800]));
        // Thirds (2,400 and 4,800) at columns 80 and 160; by width the first third would
        // hold 6,132 of 7,200.
        assert_eq!(
            nonzero_bounds(&counts, 3, 1000),
            Some(vec![0, 80, 160, 800])
        );
    }

    #[test]
    fn even_slices_stay_where_balancing_cannot_help_or_would_break_the_sparse_path() {
        // Uniform counts: already balanced.
        assert_eq!(nonzero_bounds(&[3; 400], 2, 1000), None);
        // Dense features (every value set): the work is by width.
        assert_eq!(nonzero_bounds(&[1000; 400], 2, 1000), None);
        // Too few columns for two slices of MIN_SPARSE_COLS.
        assert_eq!(nonzero_bounds(&[1; 100], 2, 1000), None);
        // All non-zeros in the first 10 columns: a slice stays at least 64 wide, so the
        // busiest still holds them all: no gain, kept even.
        let head: Vec<u64> = (0..400).map(|c| if c < 10 { 900 } else { 0 }).collect();
        assert_eq!(nonzero_bounds(&head, 2, 1000), None);
        // Balanced, the first slice would be 64 columns at 10 % set: too dense to be sure
        // its rank keeps the sparse path (the store samples the density).
        let dense: Vec<u64> = (0..400).map(|c| if c < 100 { 100 } else { 0 }).collect();
        assert_eq!(nonzero_bounds(&dense, 2, 1000), None);
        // A slice never narrower than MIN_SPARSE_COLS, even when balance would want it.
        let sparse_head: Vec<u64> = (0..400).map(|c| if c < 10 { 50 } else { 1 }).collect();
        let b = nonzero_bounds(&sparse_head, 2, 1000).unwrap();
        assert_eq!(b, vec![0, 64, 400]);
        assert_eq!(even_bounds(10, 3), vec![0, 3, 6, 10]);
    }

    /// What the planner prices NFP's ranks by is what the loader cuts: equal non-zeros where
    /// that pays, even widths otherwise.
    #[test]
    fn the_planned_slices_are_the_loaders() {
        let skewed: Vec<u64> = (0..800).map(|c| if c < 200 { 30 } else { 2 }).collect();
        assert_eq!(slice_bounds(&skewed, 2, 1000), vec![0, 120, 800]);
        assert_eq!(slice_bounds(&[3; 400], 2, 1000), vec![0, 200, 400]);
        assert_eq!(slice_bounds(&[1000; 10], 3, 1000), vec![0, 3, 6, 10]);
    }
}
