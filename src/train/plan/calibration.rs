//! A calibration: one fitted line `seconds = latency + units · per_unit` per operator, and the
//! key that says which machine and rank layout it was measured on. Pure data and file I/O; no
//! MPI (the measuring is in [`super::calibrate`]).
//!
//! A calibration is valid only where it was measured: the key holds the host, the rank layout
//! (ranks, nodes, ranks per node, threads per rank), the device and the gnnpar version, and a
//! file whose key differs is ignored (with a log line), never silently reused.

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Version of the file layout; a different one is ignored like a different key. (2 added the
/// `sample` and `spmm` operators, 3 the `optimizer`, 4 GAT's `attention`, 5 the
/// `elementwise` passes of hidden activations and row exchanges for `alltoallv`, all measured
/// under training's allocator policy, 6 the ranks' `drift`, 7 the `gather` per row and byte,
/// and the sampler and the gather timed on other inputs every call, 8 the transfers priced
/// through their measured points, [`Fit::by_points`], 9 the `partial_sums` exchanges of rows
/// sent ready and added on receipt, 10 the row exchanges' cost per row,
/// [`Fit::per_row_s`], 11 the kernels timed in turns where ranks share a host's cores,
/// [`SharedCores`], 12 the products with sparse rows timed over two row counts and priced by
/// the bytes of their entries too, 13 the `gather_sparse` of mostly-zero rows as CSR, 14 the
/// gathers priced through their measured points by rows and row size, [`Fit::by_points`], 15
/// the sampler timed from evicted caches where every rank has cores of its own, 16 the
/// communication operators timed up to 16 MB messages, 17 the gathers from tables larger than
/// the host's caches, `gather_far`, and the host's largest cache, [`Calibration::cache_bytes`],
/// 18 the aggregation priced through its measured points, 19 the products' bytes priced
/// beyond the core's own caches, [`Calibration::private_cache_bytes`], 20 the aggregation
/// timed over blocks of three sizes at widths up to 1024 and priced by edges and row size,
/// [`Fit::by_grid`], 21 the products' backward forms timed apart, `gemm_tn` and `gemm_nt`
/// ([`Product`]), and the sparse products timed at output widths up to 1024 and priced through
/// their points by non-zeros and width, 22 the gathers from tables between the near and the
/// far ones, [`Calibration::far_shares`].)
pub const FORMAT: u32 = 22;

/// Dense products `m×k · k×n` of the shapes layers use, each into a newly allocated output as a
/// layer's are: square-ish ones, bound by their flops (2·m·k·n), and skinny ones (a layer into
/// 2 classes, out of 10 features, and their gradients), bound by the bytes they touch
/// (4·(m·k + k·n + m·n), writing the output included). Both terms
/// are fitted together. The points of `gemm`, `gemm_tn` and `gemm_nt` are in this order, each
/// form of the shape ([`Product`]).
pub const GEMM_SHAPES: [(usize, usize, usize); 14] = [
    (1024, 32, 32),
    (1024, 64, 64),
    (1024, 128, 128),
    (1024, 256, 256),
    (1024, 512, 256),
    (1024, 1024, 256),
    (8192, 1024, 2),
    (8192, 2, 1024),
    (8192, 10, 512),
    (8192, 512, 16),
    // A hidden width of 1024: outputs of 32 MB. With 1024 × 1024 × 256 the largest shape,
    // the 2-core grid's steps at hidden 1024 came out 14-34 % under their measured time.
    (8192, 256, 1024),
    (8192, 1024, 512),
    // Wide input rows into a narrow layer (the 2,048-feature SBM's input layer, SAGE's two
    // weights stacked), whose weight gradient is far slower than its forward
    // ([`Calibration::form_ratio`]), which the shapes above do not show.
    (4096, 4096, 64),
    (4096, 2048, 256),
];

/// The calibrated shapes a backward form's ratio to the forward is taken from
/// ([`Calibration::form_ratio`]).
const FORM_NEIGHBOURS: usize = 3;

/// Dense products of one pass of a layer: their flops, the bytes of their three matrices,
/// how many calls make them, and the shape they share: `inner` columns into `cols` (the rows
/// may differ between the calls, as SAGE's root and neighbour products).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Products {
    pub flops: f64,
    pub bytes: f64,
    pub calls: f64,
    pub inner: f64,
    pub cols: f64,
}

/// A dense product's form, each timed as an operator of its own. A layer's
/// forward `x·W` is the first; its backward repeats the product as the weight gradient
/// `xᵀ·dY` (accumulated into the gradient) and, where a gradient has to reach the layer's
/// input, the input gradient `dY·Wᵀ`. Their speeds differ by shape
/// ([`Calibration::form_ratio`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Product {
    /// `a·b` (`gemm`).
    Forward,
    /// `c += aᵀ·b` (`gemm_tn`).
    WeightGradient,
    /// `a·bᵀ` (`gemm_nt`).
    InputGradient,
}

impl Product {
    pub const ALL: [Product; 3] = [
        Product::Forward,
        Product::WeightGradient,
        Product::InputGradient,
    ];

    /// The calibration operator that prices this form.
    pub fn operator(self) -> &'static str {
        match self {
            Product::Forward => "gemm",
            Product::WeightGradient => "gemm_tn",
            Product::InputGradient => "gemm_nt",
        }
    }
}

/// The bytes of one product touching `bytes` that a cache of `cache` bytes cannot hold: what
/// `gemm`'s per-byte term is fitted on (`calibrate`) and charged for
/// ([`Calibration::products`]), with the core's own caches.
pub fn beyond_cache(bytes: f64, cache: f64) -> f64 {
    (bytes - cache).max(0.0)
}

/// Operators every calibration holds, with the unit of their `x`.
pub const OPERATORS: &[(&str, &str)] = &[
    ("alltoallv_world", "byte"),
    ("alltoallv_node", "byte"),
    ("alltoallv_leaders", "byte"),
    ("partial_sums_world", "byte"),
    ("partial_sums_node", "byte"),
    ("allreduce", "byte"),
    ("allgatherv", "byte"),
    ("gather", "row"),
    ("gather_far", "row"),
    ("gather_sparse", "row"),
    ("h2d", "byte"),
    ("d2h", "byte"),
    ("gemm", "flop"),
    ("gemm_tn", "flop"),
    ("gemm_nt", "flop"),
    ("aggregate", "edge"),
    ("spmm", "nnz"),
    ("sample", "edge"),
    ("optimizer", "param"),
    ("attention", "edge_col"),
    ("elementwise", "byte"),
    ("drift", "second"),
];

/// Columns of the rows the `alltoallv_*` points exchange (4 bytes each): their byte prices
/// hold for rows of this width, and [`Fit::per_row_s`] prices the difference in rows.
pub const ROW_EXCHANGE_WIDTH: usize = 64;
/// Columns of the narrower rows the row exchanges are also timed with, at the same bytes, to
/// find their cost per row.
pub const ROW_EXCHANGE_NARROW_WIDTH: usize = 16;

/// Where and how a calibration was measured. Two runs may share one only when these agree.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CalibrationKey {
    pub host: String,
    pub ranks: usize,
    pub nodes: usize,
    pub ranks_per_node: usize,
    pub threads_per_rank: usize,
    /// The backend's own description (CPU threads and GEMM kernels, or the GPU).
    pub device: String,
    pub version: String,
}

impl CalibrationKey {
    /// Why `self` (a file's key) does not fit `run`, or `None` when it does.
    pub fn mismatch(&self, run: &CalibrationKey) -> Option<String> {
        let mut why = Vec::new();
        macro_rules! cmp {
            ($($f:ident),*) => { $( if self.$f != run.$f {
                why.push(format!("{} {:?} (this run: {:?})", stringify!($f), self.$f, run.$f));
            } )* };
        }
        cmp!(
            host,
            version,
            ranks,
            nodes,
            ranks_per_node,
            threads_per_rank,
            device
        );
        (!why.is_empty()).then(|| why.join(", "))
    }

    /// A short stable name for the default file of this key.
    fn file_stem(&self) -> String {
        let text = serde_json::to_string(self).unwrap_or_default();
        let hash = crate::util::hash::fnv1a(text.bytes());
        format!("calibration-{}-{hash:016x}", sanitize(&self.host))
    }
}

fn sanitize(s: &str) -> String {
    s.chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect()
}

/// One operator's line: `seconds = latency_s + x · per_unit_s` for `x` units of work per call,
/// `+ bytes · per_byte_s` for an operator whose time also follows the bytes it touches (dense
/// products: a skinny one is bound by its matrices' bytes, not its flops — an 8192 × 1024
/// output of `dy·Wᵀ` from 2 classes takes as long as products of 16 times its flops; products
/// with sparse rows: each non-zero's entry is read whatever the width).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Fit {
    pub latency_s: f64,
    pub per_unit_s: f64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub per_byte_s: f64,
    /// Row exchanges: seconds per row beyond what their bytes cost at
    /// [`ROW_EXCHANGE_WIDTH`] columns (routing, packing and placing each row by id), from
    /// the same exchanges timed at [`ROW_EXCHANGE_NARROW_WIDTH`] columns. About 60 ns between
    /// two ranks of the EPYC VM and 220 ns among four oversubscribed: Tolokers' 40-byte feature
    /// rows, priced by their bytes alone, were fetched in 2-5× their predicted time. See
    /// [`Fit::seconds_rows`].
    #[serde(default, skip_serializing_if = "is_zero")]
    pub per_row_s: f64,
    /// What `x` counts: bytes, flops, edges (aggregation; the bytes of the rows they read in
    /// [`Fit::point_bytes`]), edges × columns (attention), stored non-zeros × output columns
    /// (products with sparse input rows), sampled edges (block building), bytes streamed
    /// (activation passes), or parameters (the optimizer's step).
    pub unit: String,
    /// The measured `(x, seconds)` points the line was fitted to (slowest rank per point).
    #[serde(default)]
    pub points: Vec<[f64; 2]>,
    /// The bytes of each point, for a fit with `per_byte_s`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub point_bytes: Vec<f64>,
    /// Price a call through the measured points (increasing `x`) rather than the line: a
    /// transfer's time per byte changes with the message's size (row exchanges at 0.7 ns a byte
    /// for 128-512 KiB and 1.8 ns for 4 MiB, a 2-core EPYC VM), and one line priced the
    /// middle of the range at up to 2.5× its measured time. See [`Fit::seconds`]; which
    /// operators do is `calibrate::PRICED_BY_POINTS`. With [`Fit::point_bytes`] (the
    /// gathers and the aggregation), through the points of each row size measured
    /// ([`Fit::seconds_touching`]).
    #[serde(default)]
    pub by_points: bool,
}

fn is_zero(x: &f64) -> bool {
    *x == 0.0
}

impl Fit {
    /// A free operator (nothing to move, e.g. collectives of a single rank).
    pub fn free(unit: &str) -> Fit {
        Fit {
            latency_s: 0.0,
            per_unit_s: 0.0,
            per_byte_s: 0.0,
            per_row_s: 0.0,
            unit: unit.into(),
            points: Vec::new(),
            point_bytes: Vec::new(),
            by_points: false,
        }
    }

    /// Seconds of `calls` row exchanges moving `bytes` in `rows` rows in all: their bytes'
    /// price ([`Fit::seconds`], rows of [`ROW_EXCHANGE_WIDTH`] columns) plus
    /// [`Fit::per_row_s`] for every row more (or less) than rows of that width would make,
    /// never under half the bytes' price (rows far wider than the calibrated ones).
    pub fn seconds_rows(&self, bytes: f64, rows: f64, calls: f64) -> f64 {
        let base = self.seconds(bytes, calls);
        let calibrated_rows = bytes / (4 * ROW_EXCHANGE_WIDTH) as f64;
        (base + self.per_row_s * (rows - calibrated_rows)).max(0.5 * base)
    }

    /// Seconds for `calls` calls doing `units` of work and touching `bytes` in all. A fit
    /// [`Fit::by_grid`] prices each call of `units / calls` rows of `bytes / units` bytes
    /// through its measured points ([`Fit::per_call_grid`]; `calls` 0: work inside another
    /// call, as one call less its latency); bytes counted without their rows (copies around
    /// an exchange) are priced by the line.
    pub fn seconds_touching(&self, units: f64, bytes: f64, calls: f64) -> f64 {
        if self.by_grid() && units > 0.0 {
            let row = bytes / units;
            return if calls > 0.0 {
                calls * self.per_call_grid(units / calls, row)
            } else {
                self.per_call_grid(units, row) - self.per_call_grid(0.0, row)
            };
        }
        self.seconds(units, calls) + bytes * self.per_byte_s
    }

    /// Priced through points of rows (`x`) and their bytes, several row sizes each timed over
    /// several row counts (the gathers). A gather's time per byte is not one number: rows that
    /// fill a small batch matrix are written within the core's caches, rows of a large one
    /// are not (2-core Intel VM: 512-byte rows at 126 ns each for 256 rows and 188 ns each for
    /// 16,384), and the line through all the points priced the large ones under: grid g's
    /// 2-rank calibration left its own largest 512-byte point at 1.5× the line, and one 1-rank
    /// calibration priced SBM's and RMAT's whole-step gathers at 0.72× their measured time
    /// (through the points: 1.11× and 0.87×, `auto-replan-2026-11-29i.md`).
    pub fn by_grid(&self) -> bool {
        self.by_points
            && !self.point_bytes.is_empty()
            && self.point_bytes.len() == self.points.len()
    }

    /// Seconds of one call of `rows` rows of `row_bytes` bytes each: through the points of
    /// each measured row size (as [`Fit::per_call`] along rows, but beyond the largest count
    /// along its last segment, the large gathers' own cost per row), then linearly in the row
    /// size between the two measured sizes around `row_bytes` (beyond them, along the nearest
    /// two), never below the smaller of the two.
    fn per_call_grid(&self, rows: f64, row_bytes: f64) -> f64 {
        // Each point's row size (points of no rows, which an edited file could hold, price
        // nothing); sizes within rounding of each other are one.
        let sized = || {
            self.points
                .iter()
                .zip(&self.point_bytes)
                .filter(|(p, _)| p[0] > 0.0)
                .map(|(p, &b)| (*p, b / p[0]))
        };
        let same = |a: f64, b: f64| (a - b).abs() <= 1e-9 * a.max(1.0);
        let mut sizes: Vec<f64> = Vec::new();
        for (_, size) in sized() {
            if !sizes.iter().any(|&s| same(s, size)) {
                sizes.push(size);
            }
        }
        if sizes.is_empty() {
            return self.latency_s;
        }
        sizes.sort_by(f64::total_cmp);
        let along = |size: f64| -> f64 {
            let mut series: Vec<[f64; 2]> = sized()
                .filter(|&(_, s)| same(s, size))
                .map(|(p, _)| p)
                .collect();
            series.sort_by(|a, b| a[0].total_cmp(&b[0]));
            let at_zero = self.latency_s.min(series[0][1]);
            through_sorted(&series, at_zero, rows, None)
        };
        if sizes.len() == 1 {
            return along(sizes[0]);
        }
        let hi = sizes
            .partition_point(|&s| s < row_bytes)
            .clamp(1, sizes.len() - 1);
        let (s0, s1) = (sizes[hi - 1], sizes[hi]);
        let (t0, t1) = (along(s0), along(s1));
        let t = t0 + (t1 - t0) * (row_bytes - s0) / (s1 - s0);
        t.max(t0.min(t1)).max(0.0)
    }

    /// Least squares of `seconds = latency + x · per_unit + bytes · per_byte` over `points`
    /// (`x`, seconds) with `bytes[i]` per point, each point weighted by 1/√seconds (between
    /// absolute errors, which only the largest points would steer, and relative ones, which
    /// would let the small products outvote the large ones a step's time is made of).
    /// Coefficients are kept non-negative: of every subset
    /// of the three terms whose fit has no negative coefficient, the one with the smallest
    /// error wins (the full fit when it is non-negative).
    pub fn least_squares_with_bytes(unit: &str, points: Vec<[f64; 2]>, bytes: Vec<f64>) -> Fit {
        Fit::two_term_fit(unit, points, bytes, f64::sqrt)
    }

    /// [`Fit::least_squares_with_bytes`] with every point weighted by 1/seconds: relative
    /// errors, so that the small points count as much as the large ones. The feature gather
    /// needs it: with 1/√seconds its widest rows (4 KiB, 16 ms a point) set the line and left
    /// a 40-byte row at a sixth of its measured 20 ns (2-core VM), and Tolokers' rows are 40
    /// bytes.
    pub fn least_squares_relative_with_bytes(
        unit: &str,
        points: Vec<[f64; 2]>,
        bytes: Vec<f64>,
    ) -> Fit {
        Fit::two_term_fit(unit, points, bytes, |s| s)
    }

    /// The fit of both: each point weighted by `1 / scale(seconds)`.
    fn two_term_fit(
        unit: &str,
        points: Vec<[f64; 2]>,
        bytes: Vec<f64>,
        scale: impl Fn(f64) -> f64,
    ) -> Fit {
        assert_eq!(points.len(), bytes.len(), "one byte count per point");
        let weight = |p: &[f64; 2]| if p[1] > 0.0 { 1.0 / scale(p[1]) } else { 0.0 };
        let rows: Vec<[f64; 3]> = points
            .iter()
            .zip(&bytes)
            .map(|(p, &b)| [weight(p), p[0] * weight(p), b * weight(p)])
            .collect();
        let y: Vec<f64> = points.iter().map(|p| p[1] * weight(p)).collect();
        let mut best: Option<([f64; 3], f64)> = None;
        for mask in 1u8..8 {
            let Some(c) = solve_subset(&rows, &y, mask) else {
                continue;
            };
            if c.iter().any(|&v| v < 0.0 || !v.is_finite()) {
                continue;
            }
            let sse: f64 = rows
                .iter()
                .zip(&y)
                .map(|(r, &t)| (r[0] * c[0] + r[1] * c[1] + r[2] * c[2] - t).powi(2))
                .sum();
            if best.is_none_or(|(_, e)| sse < e * (1.0 - 1e-12)) {
                best = Some((c, sse));
            }
        }
        let c = best.map_or([0.0; 3], |(c, _)| c);
        Fit {
            latency_s: c[0],
            per_unit_s: c[1],
            per_byte_s: c[2],
            per_row_s: 0.0,
            unit: unit.into(),
            points,
            point_bytes: bytes,
            by_points: false,
        }
    }

    /// Seconds for `calls` calls moving `units` in all (each call an equal share; `calls` 0:
    /// work inside another call, no latency of its own). Through the measured points where
    /// the fit is [`Fit::by_points`] ([`Fit::per_call`]), else by the line.
    pub fn seconds(&self, units: f64, calls: f64) -> f64 {
        if units <= 0.0 && calls <= 0.0 {
            return 0.0;
        }
        if self.by_points && self.point_bytes.is_empty() && self.points.len() >= 2 {
            return if calls > 0.0 {
                calls * self.per_call(units / calls)
            } else {
                self.per_call(units) - self.per_call(0.0)
            };
        }
        calls * self.latency_s + units * self.per_unit_s
    }

    /// Seconds of one call of `x` units through the measured points ([`through_sorted`]),
    /// from the line's latency at 0 and beyond the largest along the line's slope.
    fn per_call(&self, x: f64) -> f64 {
        let at_zero = self.latency_s.min(self.points[0][1]);
        through_sorted(&self.points, at_zero, x, Some(self.per_unit_s))
    }

    /// [`Fit::least_squares`]'s line, pricing through the points ([`Fit::by_points`]), which
    /// it keeps sorted by `x`.
    pub fn through_points(unit: &str, mut points: Vec<[f64; 2]>) -> Fit {
        points.sort_by(|a, b| a[0].total_cmp(&b[0]));
        Fit {
            by_points: true,
            ..Fit::least_squares(unit, points)
        }
    }

    /// Least-squares line through `points` (`x`, seconds). A negative intercept or a slope that
    /// is not positive (noise on a flat or tiny range) is refitted through the origin, so that
    /// no prediction is ever negative and more work is never priced as no dearer: the plan tests'
    /// calibrations side by side on the 16-core GPU host once left the optimizer's or the
    /// activations' points falling with their size, and a flat line priced that work as free.
    pub fn least_squares(unit: &str, points: Vec<[f64; 2]>) -> Fit {
        let n = points.len() as f64;
        if points.is_empty() {
            return Fit::free(unit);
        }
        let (sx, sy) = points
            .iter()
            .fold((0.0, 0.0), |(a, b), p| (a + p[0], b + p[1]));
        let (mx, my) = (sx / n, sy / n);
        let sxx: f64 = points.iter().map(|p| (p[0] - mx).powi(2)).sum();
        let sxy: f64 = points.iter().map(|p| (p[0] - mx) * (p[1] - my)).sum();
        let (mut a, mut b) = if sxx > 0.0 {
            let b = sxy / sxx;
            (my - b * mx, b)
        } else {
            (my, 0.0)
        };
        if sxx > 0.0 && (b <= 0.0 || a < 0.0) {
            // Through the origin: b = Σxy / Σx².
            let sxx0: f64 = points.iter().map(|p| p[0] * p[0]).sum();
            let sxy0: f64 = points.iter().map(|p| p[0] * p[1]).sum();
            (a, b) = (0.0, if sxx0 > 0.0 { sxy0 / sxx0 } else { 0.0 });
        }
        Fit {
            latency_s: a,
            per_unit_s: b,
            per_byte_s: 0.0,
            per_row_s: 0.0,
            unit: unit.into(),
            points,
            point_bytes: Vec::new(),
            by_points: false,
        }
    }
}

/// Seconds at `x` through `points` (sorted by `x`; their seconds taken non-decreasing, so that
/// more work never prices cheaper): straight lines between neighbours, from `at_zero` at 0 to
/// the smallest point, and beyond the largest along `beyond` seconds per unit (`None`: the
/// slope of the last segment).
fn through_sorted(points: &[[f64; 2]], at_zero: f64, x: f64, beyond: Option<f64>) -> f64 {
    let mut prev = [0.0, at_zero];
    let mut slope = 0.0;
    for p in points {
        let y = p[1].max(prev[1]);
        let span = p[0] - prev[0];
        if x <= p[0] {
            return if span > 0.0 {
                prev[1] + (y - prev[1]) * (x - prev[0]) / span
            } else {
                y
            };
        }
        if span > 0.0 {
            slope = (y - prev[1]) / span;
        }
        prev = [p[0], y];
    }
    prev[1] + (x - prev[0]) * beyond.unwrap_or(slope)
}

/// Least squares over the columns of `rows` selected by `mask` (bit j: column j), by the
/// normal equations (at most 3 × 3, solved by Gaussian elimination with scaling); the other
/// coefficients are 0. `None` when the system is singular.
fn solve_subset(rows: &[[f64; 3]], y: &[f64], mask: u8) -> Option<[f64; 3]> {
    let cols: Vec<usize> = (0..3).filter(|j| mask & (1 << j) != 0).collect();
    let n = cols.len();
    // Scale every column to unit maximum so flops (1e9) and bytes (1e7) condition alike.
    let scale: Vec<f64> = cols
        .iter()
        .map(|&j| rows.iter().map(|r| r[j].abs()).fold(0.0, f64::max))
        .collect();
    if scale.contains(&0.0) {
        return None;
    }
    let mut a = vec![vec![0.0; n + 1]; n];
    for (r, &t) in rows.iter().zip(y) {
        for p in 0..n {
            let xp = r[cols[p]] / scale[p];
            for q in 0..n {
                a[p][q] += xp * r[cols[q]] / scale[q];
            }
            a[p][n] += xp * t;
        }
    }
    for p in 0..n {
        let pivot = (p..n).max_by(|&i, &j| a[i][p].abs().total_cmp(&a[j][p].abs()))?;
        a.swap(p, pivot);
        if a[p][p].abs() < 1e-12 {
            return None;
        }
        let pivot_row = a[p].clone();
        for (i, row) in a.iter_mut().enumerate() {
            if i != p {
                let f = row[p] / pivot_row[p];
                for (x, &y) in row.iter_mut().zip(&pivot_row).skip(p) {
                    *x -= f * y;
                }
            }
        }
    }
    let mut c = [0.0; 3];
    for p in 0..n {
        c[cols[p]] = a[p][n] / a[p][p] / scale[p];
    }
    Some(c)
}

/// A calibration file's contents.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Calibration {
    pub format: u32,
    pub key: CalibrationKey,
    /// Seconds the measuring took.
    pub seconds_to_calibrate: f64,
    pub operators: BTreeMap<String, Fit>,
    /// Where rank 0's host runs more rank threads than it has cores: how its kernels were
    /// timed and priced ([`super::core_share`]). Absent where every rank had cores of its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shared_cores: Option<SharedCores>,
    /// Bytes of rank 0's host's largest cache (32 MiB where the host reports none): the size
    /// of the far gathers' tables, and how much of a store's rows its ranks' gathers find
    /// there where [`Calibration::far_shares`] is empty.
    pub cache_bytes: f64,
    /// `[table bytes, share]`, ascending: how much of the way from the near gathers' price to
    /// the far ones' a gather from a table of that size went, measured with every rank
    /// gathering at once from its own (the near table's bytes at 0, the far table's at 1):
    /// what the host's caches hold of a store, which a reported cache size does not say on a
    /// VM whose neighbours share it ([`Calibration::far_share`]).
    #[serde(default)]
    pub far_shares: Vec<[f64; 2]>,
    /// Bytes of the largest cache below rank 0's host's last level (its L2; 0 for a device's
    /// calibration): a product's bytes within it cost no more than its flops, only those
    /// beyond are priced by `gemm`'s per-byte term ([`Calibration::products`]).
    pub private_cache_bytes: f64,
}

/// The kernels of a calibration timed in turns on a host whose ranks share its cores.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct SharedCores {
    /// Rounds the host's ranks took turns in, as many ranks at once as it has cores for.
    pub turns: usize,
    /// What the kernels' prices are of their times on cores of their own: ranks × their
    /// cores each / the host's cores.
    pub factor: f64,
}

impl Calibration {
    /// The fit of `op` (one of [`OPERATORS`]). Every loaded or measured calibration has them
    /// all ([`Calibration::check`]); an operator the machine lacks (no device, one node) is
    /// stored as free.
    pub fn op(&self, op: &str) -> &Fit {
        self.operators
            .get(op)
            .unwrap_or_else(|| panic!("calibration without operator `{op}` (checked on load)"))
    }

    /// Seconds of the products `p` in form `form`. The forward products are priced by
    /// `gemm`: by their flops, and by the bytes each call cannot keep in the core's own
    /// caches ([`Calibration::private_cache_bytes`]; those within cost nothing beyond the
    /// flops). Fitted on every byte, that term (6.3 GB/s, set by skinny products into fresh
    /// 32 MB outputs) priced a 1024×32×32 product at 2.9× its measured time and the 12
    /// calibrated shapes at 0.86-2.9×; on the bytes beyond a 2 MB L2, 0.85-1.11× (Xeon VM,
    /// 2026-12-03). A backward form costs the forward's price times its measured ratio to the
    /// forward at the calibrated shapes nearest to `p`'s ([`Calibration::form_ratio`]).
    pub fn products(&self, form: Product, p: &Products) -> f64 {
        let calls_or_one = p.calls.max(1.0);
        let beyond = calls_or_one * beyond_cache(p.bytes / calls_or_one, self.private_cache_bytes);
        self.op("gemm").seconds_touching(p.flops, beyond, p.calls)
            * self.form_ratio(form, p.inner, p.cols)
    }

    /// What a product of `inner` columns into `cols` costs in `form` against its forward
    /// form: the ratio of their times at the calibrated shapes ([`GEMM_SHAPES`]) nearest in
    /// (log inner, log cols), weighted by the inverse square of the distance (exact at a
    /// calibrated shape). Its speed is a matter of shape, not of flops or bytes: with 4,096
    /// columns into 64 the weight gradient took 2.9× the forward's time, with 512 into 16
    /// 1.8×, with 256 into 256 1.1× (Xeon VM, 2-rank calibration), which no line through
    /// flops and bytes fitted (the one tried priced the first at 0.6× its time). 1 where the
    /// calibration has no points of the form (a synthetic one).
    pub fn form_ratio(&self, form: Product, inner: f64, cols: f64) -> f64 {
        if form == Product::Forward {
            return 1.0;
        }
        let (Some(forward), Some(other)) = (
            self.operators.get(Product::Forward.operator()),
            self.operators.get(form.operator()),
        ) else {
            return 1.0;
        };
        if forward.points.len() != GEMM_SHAPES.len() || other.points.len() != GEMM_SHAPES.len() {
            return 1.0;
        }
        let log = |v: f64| v.max(1.0).log2();
        let mut near: Vec<(f64, f64)> = GEMM_SHAPES
            .iter()
            .zip(forward.points.iter().zip(&other.points))
            .filter(|(_, (f, o))| f[1] > 0.0 && o[1] > 0.0)
            .map(|(&(_, k, n), (f, o))| {
                let d2 = (log(inner) - log(k as f64)).powi(2) + (log(cols) - log(n as f64)).powi(2);
                (d2, (o[1] / f[1]).ln())
            })
            .collect();
        if near.is_empty() {
            return 1.0;
        }
        near.sort_by(|a, b| a.0.total_cmp(&b.0));
        if near[0].0 <= 1e-12 {
            return near[0].1.exp();
        }
        let nearest = &near[..near.len().min(FORM_NEIGHBOURS)];
        let weight: f64 = nearest.iter().map(|(d2, _)| 1.0 / d2).sum();
        (nearest.iter().map(|(d2, r)| r / d2).sum::<f64>() / weight).exp()
    }

    /// The share of the way from the near gathers' price to the far ones' that a gather from
    /// a rank's store of `store_bytes` goes: through [`Calibration::far_shares`], linearly in
    /// the logarithm of the bytes between its points (0 below the first, 1 beyond the last);
    /// without them, what of the store does not fit the rank's share of the host's largest
    /// cache (the host's ranks share it). A dense gather is priced as `gather` plus this share
    /// of what `gather_far` costs more.
    pub fn far_share(&self, store_bytes: f64) -> f64 {
        if let [first, .., last] = self.far_shares.as_slice() {
            if store_bytes <= first[0] {
                return first[1];
            }
            if store_bytes >= last[0] {
                return last[1];
            }
            let hi = self
                .far_shares
                .iter()
                .position(|p| p[0] >= store_bytes)
                .unwrap_or(self.far_shares.len() - 1);
            let (a, b) = (self.far_shares[hi - 1], self.far_shares[hi]);
            let t = (store_bytes.ln() - a[0].ln()) / (b[0].ln() - a[0].ln());
            return a[1] + t.clamp(0.0, 1.0) * (b[1] - a[1]);
        }
        let share = self.cache_bytes / self.key.ranks_per_node.max(1) as f64;
        if store_bytes <= share {
            0.0
        } else {
            1.0 - share / store_bytes
        }
    }

    /// Refuse a calibration with a missing operator or a non-finite or negative coefficient,
    /// naming `origin` (the file) and the field.
    pub fn check(&self, origin: &str) -> Result<()> {
        for (field, v) in [
            ("cache_bytes", self.cache_bytes),
            ("private_cache_bytes", self.private_cache_bytes),
        ] {
            if !v.is_finite() || v < 0.0 {
                bail!(
                    "calibration {origin}: field `{field}` is {v}; it must be a finite number ≥ 0"
                );
            }
        }
        for (i, p) in self.far_shares.iter().enumerate() {
            let ascending = i == 0 || p[0] > self.far_shares[i - 1][0];
            if !(p[0].is_finite() && p[0] > 0.0 && (0.0..=1.0).contains(&p[1]) && ascending) {
                bail!(
                    "calibration {origin}: field `far_shares[{i}]` is {p:?}; it must be [bytes > \
                     0, share in 0..1] with the bytes ascending"
                );
            }
        }
        for (op, unit) in OPERATORS {
            let Some(f) = self.operators.get(*op) else {
                bail!("calibration {origin}: field `operators.{op}` is missing");
            };
            for (name, v) in [
                ("latency_s", f.latency_s),
                ("per_unit_s", f.per_unit_s),
                ("per_byte_s", f.per_byte_s),
                ("per_row_s", f.per_row_s),
            ] {
                if !v.is_finite() || v < 0.0 {
                    bail!(
                        "calibration {origin}: field `operators.{op}.{name}` is {v}; it must \
                         be a finite number ≥ 0"
                    );
                }
            }
            let sorted = f.points.windows(2).all(|w| w[0][0] <= w[1][0]);
            let valid = |p: &[f64; 2]| p.iter().all(|v| v.is_finite() && *v >= 0.0);
            if f.by_points && !f.point_bytes.is_empty() {
                let sized = f.point_bytes.len() == f.points.len()
                    && f.point_bytes.iter().all(|b| b.is_finite() && *b >= 0.0);
                if !(sized && f.points.iter().all(valid)) {
                    bail!(
                        "calibration {origin}: fields `operators.{op}.points` and `point_bytes` \
                         must be finite numbers ≥ 0, one byte count per point, for an operator \
                         priced by its points"
                    );
                }
            } else if f.by_points && !(sorted && f.points.iter().all(valid)) {
                bail!(
                    "calibration {origin}: field `operators.{op}.points` must be pairs of finite \
                     numbers ≥ 0 in increasing x for an operator priced by its points"
                );
            }
            if f.unit != *unit {
                bail!(
                    "calibration {origin}: field `operators.{op}.unit` is {:?}, expected {unit:?}",
                    f.unit
                );
            }
        }
        Ok(())
    }

    /// Every operator's pricing in [`OPERATORS`] order, as numbers (what rank 0 broadcasts):
    /// latency, per unit, per byte, per row, whether by points, the point count, then each
    /// point's `x` and seconds, then the count of point bytes and each of them; last, the
    /// host's cache bytes.
    pub fn wire(&self) -> Vec<f64> {
        let mut w = Vec::new();
        for (op, _) in OPERATORS {
            let f = self.op(op);
            w.extend([f.latency_s, f.per_unit_s, f.per_byte_s, f.per_row_s]);
            w.extend([f.by_points as u8 as f64, f.points.len() as f64]);
            w.extend(f.points.iter().flatten());
            w.push(f.point_bytes.len() as f64);
            w.extend(&f.point_bytes);
        }
        w.push(self.cache_bytes);
        w.push(self.private_cache_bytes);
        w.push(self.far_shares.len() as f64);
        w.extend(self.far_shares.iter().flatten());
        w
    }

    /// Price as `w` says (from [`Calibration::wire`] on rank 0), so that every rank prices with
    /// bit-identical numbers.
    pub fn set_wire(&mut self, w: &[f64]) {
        let mut it = w.iter().copied();
        let mut next = || it.next().expect("a whole calibration on the wire");
        for (op, unit) in OPERATORS {
            let f = self
                .operators
                .entry(op.to_string())
                .or_insert_with(|| Fit::free(unit));
            (f.latency_s, f.per_unit_s, f.per_byte_s, f.per_row_s) =
                (next(), next(), next(), next());
            f.by_points = next() == 1.0;
            let n = next() as usize;
            f.points = (0..n).map(|_| [next(), next()]).collect();
            let n = next() as usize;
            f.point_bytes = (0..n).map(|_| next()).collect();
        }
        self.cache_bytes = next();
        self.private_cache_bytes = next();
        let n = next() as usize;
        self.far_shares = (0..n).map(|_| [next(), next()]).collect();
    }

    /// Write atomically (a reader never sees half a file).
    pub fn save(&self, path: &Path) -> Result<()> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).with_context(|| {
                format!(
                    "cannot create the calibration directory `{}`",
                    dir.display()
                )
            })?;
        }
        let out = crate::util::atomic::AtomicOutput::new(path)?;
        std::fs::write(out.tmp_path(), serde_json::to_string_pretty(self)?)
            .with_context(|| format!("cannot write calibration `{}`", path.display()))?;
        out.commit()
    }
}

/// What reading a calibration file found.
#[derive(Debug)]
pub enum Loaded {
    /// No file at the path.
    Missing,
    /// A well-formed file measured elsewhere (another host, version, layout or device): why.
    Foreign(String),
    /// A file for this run.
    Usable(Calibration),
}

/// Read `path` and compare its key with `run`'s. A malformed file is an error naming the file
/// and the field; a file for another key is [`Loaded::Foreign`], not an error.
pub fn load(path: &Path, run: &CalibrationKey) -> Result<Loaded> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Loaded::Missing),
        Err(e) => {
            return Err(e).with_context(|| format!("cannot read calibration `{}`", path.display()))
        }
    };
    let origin = format!("`{}`", path.display());
    let value: serde_json::Value = serde_json::from_str(&text)
        .with_context(|| format!("calibration {origin} is not valid JSON"))?;
    // Every calibration gnnpar ever wrote has an integer `format`: a file without one is
    // something else, which a new calibration must not overwrite.
    let Some(format) = value.get("format").and_then(|f| f.as_u64()) else {
        bail!(
            "{origin} is not a gnnpar calibration: it has no integer field `format`; give \
             --calibration another path, or remove the file"
        );
    };
    if format != FORMAT as u64 {
        return Ok(Loaded::Foreign(format!(
            "it is of calibration format {format}, and this gnnpar reads format {FORMAT}"
        )));
    }
    let cal: Calibration = serde_json::from_value(value)
        .with_context(|| format!("calibration {origin} has a bad or missing field"))?;
    // A damaged file is reported, whatever it was measured for.
    cal.check(&origin)?;
    if let Some(why) = cal.key.mismatch(run) {
        return Ok(Loaded::Foreign(format!("it was measured for {why}")));
    }
    Ok(Loaded::Usable(cal))
}

/// The default calibration file of `key`: `$GNNPAR_CALIBRATION_DIR`, else
/// `$XDG_CACHE_HOME/gnnpar`, else `$HOME/.cache/gnnpar`, else the working directory; the name
/// carries the host and a hash of the key, so layouts do not overwrite each other.
pub fn default_path(key: &CalibrationKey) -> PathBuf {
    let env = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    let dir = env("GNNPAR_CALIBRATION_DIR")
        .or_else(|| env("XDG_CACHE_HOME").map(|d| d.join("gnnpar")))
        .or_else(|| env("HOME").map(|d| d.join(".cache").join("gnnpar")))
        .unwrap_or_else(|| PathBuf::from("."));
    dir.join(format!("{}.json", key.file_stem()))
}

/// This host's name (the kernel's), or `unknown`.
pub fn host_name() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: `buf` is writable for its length; gethostname NUL-terminates within it or fails.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr() as *mut libc::c_char, buf.len()) };
    if rc != 0 {
        return "unknown".into();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn key() -> CalibrationKey {
        CalibrationKey {
            host: "h1".into(),
            ranks: 2,
            nodes: 1,
            ranks_per_node: 2,
            threads_per_rank: 1,
            device: "CPU".into(),
            version: "0.1.0".into(),
        }
    }

    fn calibration() -> Calibration {
        Calibration {
            format: FORMAT,
            key: key(),
            seconds_to_calibrate: 1.0,
            operators: OPERATORS
                .iter()
                .map(|(op, unit)| (op.to_string(), Fit::least_squares(unit, vec![[1.0, 2.0]])))
                .collect(),
            shared_cores: None,
            cache_bytes: 32.0 * 1024.0 * 1024.0,
            private_cache_bytes: 2.0 * 1024.0 * 1024.0,
            far_shares: vec![],
        }
    }

    #[test]
    fn least_squares_recovers_a_line_and_never_goes_negative() {
        let pts = (1..6)
            .map(|i| [i as f64 * 1e6, 1e-5 + i as f64 * 1e6 / 5e9])
            .collect();
        let f = Fit::least_squares("byte", pts);
        assert!((f.latency_s - 1e-5).abs() < 1e-12, "{f:?}");
        assert!((f.per_unit_s - 2e-10).abs() < 1e-18, "{f:?}");
        // Decreasing noise: through the origin (Σxy / Σx² = 5 / 5), neither a negative slope
        // nor a flat line that prices more work as no dearer.
        let f = Fit::least_squares("byte", vec![[1.0, 3.0], [2.0, 1.0]]);
        assert_eq!((f.latency_s, f.per_unit_s), (0.0, 1.0));
        // One size only: its mean, as a latency.
        let f = Fit::least_squares("byte", vec![[2.0, 3.0], [2.0, 1.0]]);
        assert_eq!((f.latency_s, f.per_unit_s), (2.0, 0.0));
        // Negative intercept: refitted through the origin.
        let f = Fit::least_squares("byte", vec![[1.0, 0.5], [2.0, 2.0], [3.0, 3.5]]);
        assert_eq!(f.latency_s, 0.0);
        assert!(f.per_unit_s > 0.0);
    }

    #[test]
    fn the_two_term_fit_recovers_flops_and_bytes_and_stays_non_negative() {
        // 1 µs a call, 10 GFLOP/s, 5 GB/s, on shapes where flops and bytes vary apart.
        let shapes = [
            (1e6, 1e5),
            (1e8, 1e6),
            (1e7, 4e7),
            (5e8, 2e6),
            (2e7, 1e7),
            (1e9, 3e7),
        ];
        let pts: Vec<[f64; 2]> = shapes
            .iter()
            .map(|&(f, b)| [f, 1e-6 + f * 1e-10 + b * 2e-10])
            .collect();
        let bytes = shapes.iter().map(|s| s.1).collect();
        let f = Fit::least_squares_with_bytes("flop", pts, bytes);
        assert!((f.latency_s - 1e-6).abs() < 1e-9, "{f:?}");
        assert!((f.per_unit_s / 1e-10 - 1.0).abs() < 1e-6, "{f:?}");
        assert!((f.per_byte_s / 2e-10 - 1.0).abs() < 1e-6, "{f:?}");
        assert!((f.seconds_touching(1e8, 1e6, 1.0) - (1e-6 + 1e-2 + 2e-4)).abs() < 1e-12);
        // Time falling with bytes (noise): the bytes term is dropped, not made negative.
        let pts = vec![[1e6, 3e-3], [2e6, 2e-3], [3e6, 4e-3], [4e6, 3e-3]];
        let f = Fit::least_squares_with_bytes("flop", pts, vec![1e6, 9e6, 2e6, 8e6]);
        assert!(
            f.latency_s >= 0.0 && f.per_unit_s >= 0.0 && f.per_byte_s >= 0.0,
            "{f:?}"
        );
    }

    #[test]
    fn points_price_between_neighbours_and_along_the_line_beyond() {
        // Cheap per unit while the work fits the caches, dearer beyond (x = bytes).
        let f = Fit::through_points("byte", vec![[4e6, 8e-3], [1e3, 4e-6], [1e5, 7e-5]]);
        assert!(f.by_points);
        assert_eq!(f.points[0], [1e3, 4e-6], "kept sorted");
        let per = f.per_unit_s;
        // One call at a point costs the point; between two, the straight line joining them.
        assert_eq!(f.seconds(1e5, 1.0), 7e-5);
        let mid = 7e-5 + (8e-3 - 7e-5) * (1e6 - 1e5) / (4e6 - 1e5);
        assert!((f.seconds(1e6, 1.0) - mid).abs() < 1e-15);
        // Calls share the units: two calls of 1e5 cost two points.
        assert_eq!(f.seconds(2e5, 2.0), 2.0 * 7e-5);
        // Below the smallest point, towards the line's latency at 0 (here 0: through the origin).
        assert_eq!(f.latency_s, 0.0);
        assert!((f.seconds(500.0, 1.0) - 2e-6).abs() < 1e-18);
        // Beyond the largest, the line's slope from it.
        assert!((f.seconds(5e6, 1.0) - (8e-3 + 1e6 * per)).abs() < 1e-15);
        // The line alone would price the middle point differently.
        let line = Fit {
            by_points: false,
            ..f.clone()
        };
        assert_ne!(line.seconds(1e5, 1.0), f.seconds(1e5, 1.0));
        // Work inside another call (no calls of its own): the points less a call's latency.
        assert_eq!(f.seconds(1e5, 0.0), 7e-5);
        // More work never prices cheaper, whatever the noise of the points.
        let noisy = Fit::through_points("byte", vec![[1.0, 5.0], [2.0, 3.0], [4.0, 6.0]]);
        assert_eq!(noisy.seconds(2.0, 1.0), 5.0);
        assert!(noisy.seconds(3.0, 1.0) >= 5.0);
    }

    #[test]
    fn a_row_exchange_pays_per_row_beyond_its_calibrated_rows() {
        // 1 ns a byte through the points, 100 ns a row beyond rows of 64 columns (256 B).
        let mut f = Fit::through_points("byte", vec![[0.0, 0.0], [1e6, 1e-3]]);
        f.per_row_s = 1e-7;
        let bytes = 256_000.0;
        // Rows of the calibrated width: the bytes' price alone.
        assert!((f.seconds_rows(bytes, 1000.0, 1.0) - 256e-6).abs() < 1e-15);
        // 40-byte rows: 6400 rows, 5400 more than the calibrated 1000.
        let narrow = f.seconds_rows(bytes, 6400.0, 1.0);
        assert!(
            (narrow - (256e-6 + 5400.0 * 1e-7)).abs() < 1e-15,
            "{narrow}"
        );
        // Rows wider than the calibrated ones cost less, never under half the bytes' price.
        assert!((f.seconds_rows(bytes, 1.0, 1.0) - (256e-6 - 999.0 * 1e-7)).abs() < 1e-15);
        f.per_row_s = 1e-6;
        assert_eq!(f.seconds_rows(bytes, 1.0, 1.0), 128e-6);
        // No rows' cost without one measured.
        f.per_row_s = 0.0;
        assert_eq!(f.seconds_rows(bytes, 6400.0, 1.0), f.seconds(bytes, 1.0));
    }

    #[test]
    fn products_pay_only_for_the_bytes_each_call_cannot_keep_in_the_cores_caches() {
        let mut cal = calibration();
        cal.private_cache_bytes = 1000.0;
        let gemm = cal.operators.get_mut("gemm").unwrap();
        (gemm.latency_s, gemm.per_unit_s, gemm.per_byte_s) = (1e-6, 1e-9, 1e-8);
        // Two calls of 600 bytes each: within the cache, the flops and latencies alone.
        let small = cal.products(Product::Forward, &products(5000.0, 1200.0, 2.0));
        assert!((small - (2e-6 + 5e-6)).abs() < 1e-18, "{small}");
        // Two calls of 1500 bytes: 500 beyond the cache each.
        let large = cal.products(Product::Forward, &products(5000.0, 3000.0, 2.0));
        assert!(
            (large - (2e-6 + 5e-6 + 1000.0 * 1e-8)).abs() < 1e-18,
            "{large}"
        );
        // Without a private cache (a device's calibration) every byte is priced.
        cal.private_cache_bytes = 0.0;
        let all = cal.products(Product::Forward, &products(5000.0, 3000.0, 2.0));
        assert!((all - (2e-6 + 5e-6 + 3000.0 * 1e-8)).abs() < 1e-18, "{all}");
    }

    fn products(flops: f64, bytes: f64, calls: f64) -> Products {
        Products {
            flops,
            bytes,
            calls,
            inner: 64.0,
            cols: 64.0,
        }
    }

    #[test]
    fn a_backward_form_costs_the_forward_times_its_ratio_at_the_nearest_shapes() {
        let mut cal = calibration();
        // The forward at 1 ns a flop; the weight gradient 3× it at the shapes of 4096
        // columns, 1× elsewhere; the input gradient 2× everywhere.
        let timed = |ratio: &dyn Fn(usize) -> f64| -> Vec<[f64; 2]> {
            GEMM_SHAPES
                .iter()
                .map(|&(m, k, n)| {
                    let flops = (2 * m * k * n) as f64;
                    [flops, flops * 1e-9 * ratio(k)]
                })
                .collect()
        };
        for (op, ratio) in [
            ("gemm", &(|_| 1.0) as &dyn Fn(usize) -> f64),
            ("gemm_tn", &|k| if k == 4096 { 3.0 } else { 1.0 }),
            ("gemm_nt", &|_| 2.0),
        ] {
            let fit = cal.operators.get_mut(op).unwrap();
            fit.points = timed(ratio);
            (fit.latency_s, fit.per_unit_s, fit.per_byte_s) = (0.0, 1e-9, 0.0);
        }
        cal.private_cache_bytes = f64::INFINITY;
        let at = |inner: f64, cols: f64| Products {
            flops: 1e6,
            bytes: 0.0,
            calls: 1.0,
            inner,
            cols,
        };
        let priced = |p: &Products| Product::ALL.map(|form| cal.products(form, p));
        // At a calibrated shape: exactly its ratios.
        let wide = priced(&at(4096.0, 64.0));
        assert!(
            (wide[0] - 1e-3).abs() < 1e-15 && (wide[1] - 3e-3).abs() < 1e-15,
            "{wide:?}"
        );
        assert!((wide[2] - 2e-3).abs() < 1e-15, "{wide:?}");
        // Between shapes: a blend of the nearest ones' ratios, within theirs.
        let between = priced(&at(2048.0, 128.0))[1] / 1e-3;
        assert!(between > 1.0 && between < 3.0, "{between}");
        // Far from the wide shapes: the forward's price.
        let narrow = priced(&at(64.0, 64.0));
        assert!((narrow[1] - 1e-3).abs() < 1e-15, "{narrow:?}");
        // A calibration without points of the forms (a synthetic one) prices them as forward.
        assert_eq!(
            calibration().form_ratio(Product::WeightGradient, 4096.0, 64.0),
            1.0
        );
    }

    #[test]
    fn the_wire_carries_every_operators_pricing() {
        let mut cal = calibration();
        cal.operators.insert(
            "aggregate".into(),
            Fit::through_points("edge", vec![[1.0, 2.0], [4.0, 3.0]]),
        );
        cal.operators.get_mut("alltoallv_world").unwrap().per_row_s = 1e-7;
        cal.operators.insert("gather".into(), gather_grid());
        cal.far_shares = vec![[16e6, 0.0], [64e6, 0.4], [512e6, 1.0]];
        let mut other = Calibration {
            operators: BTreeMap::new(),
            cache_bytes: 0.0,
            private_cache_bytes: 0.0,
            far_shares: vec![],
            ..cal.clone()
        };
        other.set_wire(&cal.wire());
        assert_eq!(other.cache_bytes, cal.cache_bytes);
        assert_eq!(other.private_cache_bytes, cal.private_cache_bytes);
        assert_eq!(other.far_shares, cal.far_shares);
        for (op, _) in OPERATORS {
            let (a, b) = (cal.op(op), other.op(op));
            assert_eq!(
                (
                    a.latency_s,
                    a.per_unit_s,
                    a.per_byte_s,
                    a.per_row_s,
                    a.by_points
                ),
                (
                    b.latency_s,
                    b.per_unit_s,
                    b.per_byte_s,
                    b.per_row_s,
                    b.by_points
                ),
                "{op}"
            );
            assert_eq!(a.points, b.points, "{op}");
            assert_eq!(a.point_bytes, b.point_bytes, "{op}");
            assert_eq!(a.seconds(3.0, 1.0), b.seconds(3.0, 1.0), "{op}");
            assert_eq!(
                a.seconds_touching(300.0, 3e4, 1.0),
                b.seconds_touching(300.0, 3e4, 1.0),
                "{op}"
            );
        }
    }

    /// A gather measured at 32- and 512-byte rows over 100 and 1000 rows, 512-byte rows
    /// dearer per row in the larger gather (its batch matrix no longer in the caches).
    fn gather_grid() -> Fit {
        let points = vec![
            [100.0, 3e-6],
            [1000.0, 3e-5],
            [100.0, 1e-5],
            [1000.0, 1.5e-4],
        ];
        let bytes = vec![3200.0, 32000.0, 51200.0, 512000.0];
        Fit {
            by_points: true,
            ..Fit::least_squares_relative_with_bytes("row", points, bytes)
        }
    }

    #[test]
    fn gathers_price_through_their_points_by_rows_and_row_size() {
        let f = gather_grid();
        assert!(f.by_grid());
        let close = |a: f64, b: f64| (a - b).abs() <= 1e-12 * b.abs().max(1e-9);
        // A measured point costs what it measured, in one call or shared by calls.
        assert!(close(f.seconds_touching(1000.0, 512000.0, 1.0), 1.5e-4));
        assert!(close(f.seconds_touching(200.0, 6400.0, 2.0), 6e-6));
        // Between two counts of one row size, the straight line joining them.
        let mid = 1e-5 + (1.5e-4 - 1e-5) * 400.0 / 900.0;
        assert!(close(f.seconds_touching(500.0, 256000.0, 1.0), mid));
        // Beyond the largest count, along the last segment (the large gathers' own cost per
        // row, 155 ns here), not the line through every point.
        let beyond = 1.5e-4 + 9000.0 * (1.5e-4 - 1e-5) / 900.0;
        assert!(close(f.seconds_touching(1e4, 5.12e6, 1.0), beyond));
        let line = Fit {
            by_points: false,
            ..f.clone()
        };
        assert!(line.seconds_touching(1e4, 5.12e6, 1.0) < 0.8 * beyond);
        // Between two row sizes, linear in the row's bytes.
        let (small, large) = (3e-5, 1.5e-4);
        let t = (272.0 - 32.0) / (512.0 - 32.0);
        assert!(close(
            f.seconds_touching(1000.0, 272000.0, 1.0),
            small + (large - small) * t
        ));
        // Beyond the largest size, along the two largest; below the smallest, never under it.
        let wide = small + (large - small) * (1024.0 - 32.0) / 480.0;
        assert!(close(f.seconds_touching(1000.0, 1024000.0, 1.0), wide));
        assert!(close(f.seconds_touching(1000.0, 8000.0, 1.0), small));
        // Nothing gathered costs nothing; bytes without rows are priced by the line; work
        // inside another call pays no latency of its own.
        assert_eq!(f.seconds_touching(0.0, 0.0, 0.0), 0.0);
        assert_eq!(f.seconds_touching(0.0, 1e6, 0.0), 1e6 * f.per_byte_s);
        let inside = f.seconds_touching(1000.0, 32000.0, 0.0);
        assert!(close(inside, 3e-5 - f.latency_s.min(3e-6)));
        // A calibration whose bytes do not match its points is refused.
        let mut cal = calibration();
        let mut broken = gather_grid();
        broken.point_bytes.pop();
        cal.operators.insert("gather".into(), broken);
        let err = cal.check("c.json").unwrap_err().to_string();
        assert!(err.contains("operators.gather.points"), "{err}");
    }

    #[test]
    fn files_round_trip_and_foreign_keys_are_not_used() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub").join("cal.json");
        assert!(matches!(load(&path, &key()).unwrap(), Loaded::Missing));
        let cal = calibration();
        cal.save(&path).unwrap();
        match load(&path, &key()).unwrap() {
            Loaded::Usable(c) => assert_eq!(c, cal),
            other => panic!("{other:?}"),
        }
        for (field, value) in [("host", "h2"), ("version", "9.9.9")] {
            let mut other = key();
            match field {
                "host" => other.host = value.into(),
                _ => other.version = value.into(),
            }
            match load(&path, &other).unwrap() {
                Loaded::Foreign(why) => assert!(why.contains(field), "{why}"),
                other => panic!("{other:?}"),
            }
        }
    }

    #[test]
    fn bad_files_name_the_file_and_the_field() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cal.json");
        std::fs::write(&path, "{not json").unwrap();
        let err = format!("{:#}", load(&path, &key()).unwrap_err());
        assert!(err.contains("cal.json") && err.contains("JSON"), "{err}");

        let mut unsorted = calibration();
        unsorted.operators.insert(
            "allreduce".into(),
            Fit::through_points("byte", vec![[1.0, 1.0], [2.0, 2.0]]),
        );
        unsorted
            .operators
            .get_mut("allreduce")
            .unwrap()
            .points
            .reverse();
        std::fs::write(&path, serde_json::to_string(&unsorted).unwrap()).unwrap();
        let err = format!("{:#}", load(&path, &key()).unwrap_err());
        assert!(
            err.contains("cal.json") && err.contains("operators.allreduce.points"),
            "{err}"
        );

        let mut v = serde_json::to_value(calibration()).unwrap();
        v["operators"]["gemm"]
            .as_object_mut()
            .unwrap()
            .remove("per_unit_s");
        std::fs::write(&path, v.to_string()).unwrap();
        let err = format!("{:#}", load(&path, &key()).unwrap_err());
        assert!(
            err.contains("cal.json") && err.contains("per_unit_s"),
            "{err}"
        );

        let mut v = serde_json::to_value(calibration()).unwrap();
        v["operators"]["allreduce"]["latency_s"] = serde_json::json!(-1.0);
        std::fs::write(&path, v.to_string()).unwrap();
        let err = format!("{:#}", load(&path, &key()).unwrap_err());
        assert!(
            err.contains("cal.json") && err.contains("operators.allreduce.latency_s"),
            "{err}"
        );

        let mut v = serde_json::to_value(calibration()).unwrap();
        v["operators"].as_object_mut().unwrap().remove("h2d");
        std::fs::write(&path, v.to_string()).unwrap();
        let err = format!("{:#}", load(&path, &key()).unwrap_err());
        assert!(err.contains("operators.h2d"), "{err}");

        // JSON that is no calibration at all is an error, not a foreign calibration to
        // measure again over it.
        for text in ["[1, 2, 3]", r#"{"format": "15"}"#, r#"{"name": "x"}"#] {
            std::fs::write(&path, text).unwrap();
            let err = format!("{:#}", load(&path, &key()).unwrap_err());
            assert!(
                err.contains("cal.json") && err.contains("not a gnnpar calibration"),
                "{text}: {err}"
            );
        }
        // A damaged file is reported even when it was measured for another layout.
        let mut other = key();
        other.ranks += 1;
        let mut v = serde_json::to_value(calibration()).unwrap();
        v["operators"]["allreduce"]["latency_s"] = serde_json::json!(-1.0);
        std::fs::write(&path, v.to_string()).unwrap();
        let err = format!("{:#}", load(&path, &other).unwrap_err());
        assert!(err.contains("latency_s"), "{err}");
        // Another format number is a foreign file, said in a sentence.
        let mut v = serde_json::to_value(calibration()).unwrap();
        v["format"] = serde_json::json!(3);
        std::fs::write(&path, v.to_string()).unwrap();
        match load(&path, &key()).unwrap() {
            Loaded::Foreign(why) => assert!(why.contains("calibration format 3"), "{why}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn default_paths_differ_by_layout() {
        let mut other = key();
        other.ranks = 4;
        assert_ne!(default_path(&key()), default_path(&other));
    }

    #[test]
    fn the_far_share_is_what_of_a_store_the_ranks_share_of_the_cache_cannot_hold() {
        // 32 MiB among the key's 2 ranks: 16 MiB each.
        let cal = calibration();
        let mib = 1024.0 * 1024.0;
        assert_eq!(cal.far_share(0.0), 0.0);
        assert_eq!(cal.far_share(16.0 * mib), 0.0);
        assert!((cal.far_share(64.0 * mib) - 0.75).abs() < 1e-12);
        assert!(cal.far_share(1e12) < 1.0);
        let alone = Calibration {
            key: CalibrationKey {
                ranks_per_node: 1,
                ..key()
            },
            ..calibration()
        };
        assert!((alone.far_share(64.0 * mib) - 0.5).abs() < 1e-12);
    }

    #[test]
    fn the_far_share_follows_the_measured_tables_in_log_bytes_and_bad_points_are_refused() {
        let mib = 1024.0 * 1024.0;
        let cal = Calibration {
            far_shares: vec![[16.0 * mib, 0.0], [64.0 * mib, 0.5], [512.0 * mib, 1.0]],
            ..calibration()
        };
        // Not the cache size's rule (16 MiB a rank there: 0.75 at 64 MiB) but the points.
        assert_eq!(cal.far_share(8.0 * mib), 0.0);
        assert!((cal.far_share(32.0 * mib) - 0.25).abs() < 1e-12);
        assert!((cal.far_share(64.0 * mib) - 0.5).abs() < 1e-12);
        assert!((cal.far_share(128.0 * mib) - 0.5 - 0.5 / 3.0).abs() < 1e-12);
        assert_eq!(cal.far_share(4096.0 * mib), 1.0);
        cal.check("test").unwrap();
        for bad in [
            vec![[64.0 * mib, 0.5], [16.0 * mib, 0.0]],
            vec![[16.0 * mib, 1.5]],
            vec![[f64::NAN, 0.0]],
            vec![[0.0, 0.0]],
        ] {
            let c = Calibration {
                far_shares: bad,
                ..calibration()
            };
            let e = c.check("cal.json").unwrap_err().to_string();
            assert!(e.contains("far_shares"), "{e}");
        }
    }
}
