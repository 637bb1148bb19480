//! One operator's fit: the line through its measured points, and pricing a call through
//! those points where a line does not follow them.

use super::ROW_EXCHANGE_WIDTH;
use serde::{Deserialize, Serialize};

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
    /// the same exchanges timed at [`ROW_EXCHANGE_NARROW_WIDTH`](super::ROW_EXCHANGE_NARROW_WIDTH)
    /// columns. About 60 ns between two ranks of the EPYC VM and 220 ns among four
    /// oversubscribed: Tolokers' 40-byte feature rows, priced by their bytes alone, were
    /// fetched in 2-5× their predicted time. See
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

/// How far apart two points' sizes (bytes per unit) may be and still be one series of
/// [`Fit::by_grid`]: the gathers' and aggregations' sizes are exact (a row's bytes), the
/// sampler's are what its batches happened to read (vertices per edge, within 2 % of each
/// other on one synthetic graph and 2.7 times apart between its two), and the sizes of
/// two series differ by at least twice.
const SERIES_TOLERANCE: f64 = 0.1;

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

    /// This fit moved `share` (0 to 1) of the way to `other`'s, the same operator timed in
    /// another state of the caches: each coefficient of the line, and where it is priced
    /// through its points ([`Fit::by_points`]) and `other` has the same points (their `x` and
    /// bytes), each point's seconds, toward `other`'s but never past this one's (a point
    /// timed dearer by noise moves nothing). A line's points stay as measured (the record, and
    /// what [`Calibration::form_ratio`](super::Calibration::form_ratio) reads).
    pub fn toward(&self, other: &Fit, share: f64) -> Fit {
        let mix = |a: f64, b: f64| a + share * (b - a);
        let mut fit = Fit {
            latency_s: mix(self.latency_s, other.latency_s),
            per_unit_s: mix(self.per_unit_s, other.per_unit_s),
            per_byte_s: mix(self.per_byte_s, other.per_byte_s),
            per_row_s: mix(self.per_row_s, other.per_row_s),
            ..self.clone()
        };
        let same_points = self.points.len() == other.points.len()
            && self.point_bytes == other.point_bytes
            && self
                .points
                .iter()
                .zip(&other.points)
                .all(|(a, b)| a[0] == b[0]);
        if self.by_points && same_points {
            for (p, q) in fit.points.iter_mut().zip(&other.points) {
                p[1] = mix(p[1], q[1].min(p[1]));
            }
        }
        fit
    }

    /// Whether anything was timed or set for this operator ([`Fit::free`] is not).
    pub fn priced(&self) -> bool {
        !self.points.is_empty()
            || [
                self.latency_s,
                self.per_unit_s,
                self.per_byte_s,
                self.per_row_s,
            ]
            .iter()
            .any(|&x| x != 0.0)
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
        // nothing); sizes within [`SERIES_TOLERANCE`] of each other are one series.
        let sized = || {
            self.points
                .iter()
                .zip(&self.point_bytes)
                .filter(|(p, _)| p[0] > 0.0)
                .map(|(p, &b)| (*p, b / p[0]))
        };
        let same = |a: f64, b: f64| (a - b).abs() <= SERIES_TOLERANCE * a.abs().max(b.abs());
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
