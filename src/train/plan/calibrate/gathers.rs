//! Points of the feature gathers: rows from tables the host's caches hold and from ones far
//! larger, the tables between (how much of a store the caches hold), and sparse rows.

use super::KernelTimer;
use crate::exchange::store::FeatureStore;
use crate::graph::NodeId;
use crate::train::plan::calibration::Fit;
use crate::train::plan::evict::host_cache_bytes;
use ndarray::Array2;

/// The host's largest cache, or 32 MiB where it reports none.
pub(super) fn cache_of_host() -> usize {
    host_cache_bytes().unwrap_or(32 << 20)
}

/// The row widths (columns) the dense gathers are timed at.
pub(super) const GATHER_WIDTHS: [usize; 3] = [8, 128, 1024];

/// The near gathers' tables, rows at each of [`GATHER_WIDTHS`]: 1, 16 and 32 MB.
pub(super) const GATHER_TABLE_ROWS: [usize; 3] = [1 << 15, 1 << 15, 1 << 13];

/// The feature gather (rows by id from this rank's store into a batch matrix), with the real
/// store's code path, at three row widths: `x` = rows, and the bytes of each point. A row
/// costs its lookup (ownership, cache) and placement whatever its width, which bytes alone
/// missed: Tolokers' 40-byte rows gathered at 2-5× their bytes' prediction (2-core VM).
pub(super) fn gather_points(timer: KernelTimer) -> (Vec<[f64; 2]>, Vec<f64>) {
    gathers_from_tables(timer, GATHER_TABLE_ROWS.into_iter().zip(GATHER_WIDTHS))
}

/// The far gathers' tables: this many times the host's largest cache, within the bounds below
/// (a host that reports no cache gets the lower one), so that almost every row a gather reads
/// comes from memory, not from a cache.
const FAR_TABLE_CACHE_MULTIPLE: usize = 4;
const FAR_TABLE_MIN_BYTES: usize = 128 << 20;
const FAR_TABLE_MAX_BYTES: usize = 512 << 20;

/// The feature gather as [`gather_points`] times it, at the same row widths and counts, from
/// tables far larger than the host's caches (`gather_far`). [`gather_points`]' tables (1-32
/// MB) stay in a large last-level cache between calls: on the 2-core EPYC VM (32 MB L3) they
/// priced the 200k SBM's gathers (51 MB of rows per rank) at 0.47× their measured time, its
/// 512-byte rows at 47 ns each where one from a 512 MB table took about twice that. The
/// planner mixes the two by how much of a rank's store its share of the cache can hold
/// ([`Calibration::far_share`](crate::train::plan::calibration::Calibration::far_share)).
pub(super) fn gather_far_points(
    timer: KernelTimer,
    cache_bytes: usize,
) -> (Vec<[f64; 2]>, Vec<f64>) {
    let table_bytes = far_table_bytes(cache_bytes);
    let tables = GATHER_WIDTHS.map(|width| (table_bytes / (width * 4), width));
    gathers_from_tables(timer, tables.into_iter())
}

/// The bytes of each far gather's table on a host whose largest cache is `cache_bytes`.
fn far_table_bytes(cache_bytes: usize) -> usize {
    (cache_bytes * FAR_TABLE_CACHE_MULTIPLE).clamp(FAR_TABLE_MIN_BYTES, FAR_TABLE_MAX_BYTES)
}

/// The tables between the near gathers' and the far ones that [`gather_table_points`] times.
const SWEPT_TABLE_BYTES: [usize; 4] = [32 << 20, 64 << 20, 128 << 20, 256 << 20];

/// The rows and row width of the gathers that measure how a table's size slows them: those of
/// the near and far gathers' largest point at their middle width (16,384 rows of 512 bytes).
pub(super) const SWEPT_GATHER: (usize, usize) = (16384, 128);

/// One gather of [`SWEPT_GATHER`] rows from tables of each of [`SWEPT_TABLE_BYTES`] smaller
/// than the far gathers' (every rank at once, each from its own, as a step's gathers run):
/// `x` = the table's bytes. The host's caches hold what they hold of each, whatever size it
/// reports: the 2-core Xeon VM reports a 480 MB L3, which its neighbours share, and a 51 MB
/// store there gathered its 256-byte rows at 65 ns each, where the near tables' price was
/// about 28 and the far one's 90 ([`far_shares`]).
pub(super) fn gather_table_points(timer: KernelTimer, cache_bytes: usize) -> Vec<[f64; 2]> {
    let (rows, width) = SWEPT_GATHER;
    let mut points = Vec::new();
    for table_bytes in SWEPT_TABLE_BYTES
        .into_iter()
        .filter(|&b| b < far_table_bytes(cache_bytes))
    {
        let table_rows = table_bytes / (width * 4);
        let table = Array2::from_shape_fn((table_rows, width), |(i, j)| (i * 7 + j) as f32);
        let store = FeatureStore::new(vec![0, table_rows as u64], 0, table);
        let s = time_gather(timer, rows, table_rows, &mut |ids| {
            let (x, _) = store.gather_local(ids);
            store.recycle(x);
        });
        points.push([table_bytes as f64, s]);
    }
    points
}

/// [`Calibration::far_shares`](crate::train::plan::calibration::Calibration::far_shares)
/// from the near and far gathers and the
/// swept tables' points: each table's gather of [`SWEPT_GATHER`] rows as a share of the way
/// from the near gathers' time for them (share 0 at the near table's bytes) to the far ones'
/// (1 at the far table's), non-decreasing. Empty where the far gather is no slower than the
/// near one (nothing to interpolate).
pub(super) fn far_shares(
    near: &Fit,
    far: &Fit,
    tables: &[[f64; 2]],
    cache_bytes: usize,
) -> Vec<[f64; 2]> {
    let (rows, width) = SWEPT_GATHER;
    let bytes = (rows * width * 4) as f64;
    let at = |f: &Fit| {
        (0..f.points.len().min(f.point_bytes.len()))
            .find(|&i| f.points[i][0] == rows as f64 && f.point_bytes[i] == bytes)
            .map(|i| f.points[i][1])
    };
    let (Some(t_near), Some(t_far)) = (at(near), at(far)) else {
        return vec![];
    };
    if t_far <= t_near {
        return vec![];
    }
    let near_table = (GATHER_TABLE_ROWS[1] * GATHER_WIDTHS[1] * 4) as f64;
    let far_table = far_table_bytes(cache_bytes) as f64;
    let mut shares = vec![[near_table, 0.0]];
    let mut highest = 0.0f64;
    for &[table, t] in tables
        .iter()
        .filter(|p| p[0] > near_table && p[0] < far_table)
    {
        highest = highest.max(((t - t_near) / (t_far - t_near)).clamp(0.0, 1.0));
        shares.push([table, highest]);
    }
    shares.push([far_table, 1.0]);
    shares
}

/// [`time_gathers`] of the store's `gather_local` from a table of each `(rows, width)`.
pub(super) fn gathers_from_tables(
    timer: KernelTimer,
    tables: impl Iterator<Item = (usize, usize)>,
) -> (Vec<[f64; 2]>, Vec<f64>) {
    let (mut points, mut bytes) = (Vec::new(), Vec::new());
    for (table_rows, width) in tables {
        let table = Array2::from_shape_fn((table_rows, width), |(i, j)| (i * 7 + j) as f32);
        let store = FeatureStore::new(vec![0, table_rows as u64], 0, table);
        time_gathers(
            timer,
            table_rows,
            width * 4,
            (&mut points, &mut bytes),
            |ids| {
                let (x, _) = store.gather_local(ids);
                store.recycle(x);
            },
        );
    }
    (points, bytes)
}

/// The feature gather of mostly-zero rows a first layer takes as CSR (GDP's batches on
/// bag-of-words features), with the real store's code path: rows by id assembled from the
/// store's CSR copy, at 8 and 64 non-zeros a row; `x` = rows, and the bytes of each point's
/// entries (a column and a value each). Priced as the dense gather, Facebook's batches (~14
/// non-zeros a row) gathered at 2.5× their prediction on one rank (2-core VM): the sparse
/// path looks every row up, counts its entries and places them, more per row than a copy.
/// On a host backend `timer` starts every run from evicted caches where every rank has cores
/// of its own ([`KernelTimer::cold`]), as a step's gather follows the last step's products:
/// timed back to back (10-28 ns a row of 8 entries), Facebook's 2-rank GDP batches were
/// priced at 0.30 ms of load where they measured 0.63-1.07 (2-core EPYC VM), and from
/// evicted caches (15-89 ns a row) at 0.62.
pub(super) fn sparse_gather_points(timer: KernelTimer) -> (Vec<[f64; 2]>, Vec<f64>) {
    let (table_rows, width) = (1usize << 13, 1024usize);
    let (mut points, mut bytes) = (Vec::new(), Vec::new());
    for nonzeros in [8usize, 64] {
        let every = width / nonzeros;
        let table = Array2::from_shape_fn((table_rows, width), |(i, j)| {
            if (i * 7 + j) % every == 0 {
                (i + j) as f32 + 1.0
            } else {
                0.0
            }
        });
        let store = FeatureStore::new(vec![0, table_rows as u64], 0, table);
        assert!(
            store.has_sparse_copy(),
            "calibration: the sparse table is kept as CSR"
        );
        time_gathers(
            timer,
            table_rows,
            nonzeros * 8,
            (&mut points, &mut bytes),
            |ids| {
                std::hint::black_box(store.gather_local_input(ids, true));
            },
        );
    }
    (points, bytes)
}

/// Times `gather` of 256 to 16,384 ids among `table_rows`, other ids every call (as every
/// batch reads other rows), adding each point (rows, seconds) and the bytes it touches
/// (`row_bytes` a row) to `out`.
fn time_gathers(
    timer: KernelTimer,
    table_rows: usize,
    row_bytes: usize,
    out: (&mut Vec<[f64; 2]>, &mut Vec<f64>),
    mut gather: impl FnMut(&[NodeId]),
) {
    let (points, bytes) = out;
    for n in [256usize, 1024, 4096, 16384] {
        let s = time_gather(timer, n, table_rows, &mut gather);
        points.push([n as f64, s]);
        bytes.push((n * row_bytes) as f64);
    }
}

/// Seconds of `gather` of `n` ids among `table_rows` ([`KernelTimer::point`]), other ids every
/// call (its warm-up and repetitions), as every batch reads other rows.
fn time_gather(
    timer: KernelTimer,
    n: usize,
    table_rows: usize,
    gather: &mut impl FnMut(&[NodeId]),
) -> f64 {
    let batches = spread_ids(n, table_rows, timer.reps + 1);
    let mut call = 0;
    timer.point(|| {
        gather(&batches[call]);
        call += 1;
    })
}

/// `calls` sets of `n` ids among `range`, one for every call a timer's point makes (its
/// warm-up and repetitions), each a fixed pseudo-random spread (as a batch's sampled vertices
/// are) and each another.
pub(super) fn spread_ids(n: usize, range: usize, calls: usize) -> Vec<Vec<NodeId>> {
    (0..calls as u64)
        .map(|call| {
            (0..n as u64)
                .map(|i| ((i + call * n as u64) * 2_654_435_761 % range as u64) as NodeId)
                .collect()
        })
        .collect()
}
