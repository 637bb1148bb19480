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
use std::path::Path;

mod file;
mod fit;
#[cfg(test)]
mod tests;

pub use file::{default_path, host_name, load, CalibrationKey, Loaded};
pub use fit::Fit;

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
/// far ones, [`Calibration::far_shares`], 23 the local sampler timed in windows of batches
/// side by side, `sample_ahead` ([`Calibration::sample_window`]), 24 the owner-routed sampler
/// timed in windows sampled together, `sample_ahead_routed`, and the window the ranks
/// agree on, 25 the samplers timed over a CSR read through the real graphs' adjacency, 26 the
/// products and aggregations timed from evicted caches where every rank has cores of its own,
/// 27 the sampler also timed back to back, `sample_warm`, and priced between the two by what
/// of the graph a step leaves in the host's cache ([`Calibration::sampling`]), 28 the
/// sampler timed over two synthetic graphs and priced by its edges and by the vertices whose
/// neighbours it reads, 29 the products' forward form and the aggregation also timed back to
/// back, `gemm_warm` and `aggregate_warm`, and priced between the two by how much of a step's
/// data the host's cache holds ([`Calibration::with_warm_kernels`]), 30 GCN's normalisation
/// factors of a block, `gcn_norm`, and the `gather_sparse` of CSR rows timed from evicted
/// caches on a host backend where every rank has cores of its own, 31 the backward's
/// transposed aggregation, `aggregate_transpose`, 32 the sparse products over columns drawn
/// by Zipf's law, as a bag-of-words matrix's are, 33 the `allreduce` and `allgatherv` timed on
/// buffers made before the timed runs, as a step's gradients are.)
pub const FORMAT: u32 = 33;

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
    ("gemm_warm", "flop"),
    ("aggregate", "edge"),
    ("aggregate_warm", "edge"),
    ("aggregate_transpose", "edge"),
    ("spmm", "nnz"),
    ("sample", "edge"),
    ("sample_warm", "edge"),
    ("sample_ahead", "edge"),
    ("sample_ahead_routed", "edge"),
    ("optimizer", "param"),
    ("gcn_norm", "vertex"),
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
    /// Batches the `sample_ahead` and `sample_ahead_routed` points sampled at once (the
    /// fewest any rank's threads sample by default, at most 16; 1 where a rank has fewer
    /// than 4 threads, and those points are empty): a run's window of another size is priced
    /// from them ([`Calibration::local_sampling`], [`Calibration::routed_sampling`]).
    #[serde(default = "one")]
    pub sample_window: usize,
}

fn one() -> usize {
    1
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
    /// Seconds for a rank to sample a batch of `edges` edges in its step, `warm` (0 to 1) of
    /// its graph's adjacency still in the host's cache from the batch before (the planner's
    /// `cost::sampler_warm_share`): the evicted points' price (`sample`) less that share of
    /// what the points timed back to back (`sample_warm`) cost less. The ranks' steps between
    /// two batches either leave the adjacency where the sampler finds it or push it out: on
    /// the 2-core EPYC VM (2 ranks, 32 MB L3) the dry run's batches of Tolokers, Facebook and
    /// the R-MAT graph sampled in 0.24-0.33 ms back to back and 0.43-0.46 after an eviction,
    /// and their steps' sampling measured 0.21-0.38 ms at hidden width 64 and 0.37-0.91 at
    /// 1024; the 200k SBM's, whose gathered rows alone fill a rank's share of the cache, 1.0-1.1
    /// at every width against 0.54 and 1.15. Without warm points (the sampler was timed back
    /// to back anyway: ranks sharing cores) `sample`'s price.
    ///
    /// `vertices` are the batch's destination vertices (whose neighbours it reads): both
    /// operators are priced through their points by edges and vertices per edge
    /// ([`Fit::by_grid`]), timed over synthetic graphs of two degrees.
    pub fn sampling(&self, edges: f64, vertices: f64, warm: f64) -> f64 {
        let cold = self.op("sample").seconds_touching(edges, vertices, 1.0);
        let fit = self.op("sample_warm");
        if warm <= 0.0 || !fit.priced() {
            return cold;
        }
        let hot = fit.seconds_touching(edges, vertices, 1.0).min(cold);
        cold - warm.min(1.0) * (cold - hot)
    }

    /// Seconds for a rank to sample a batch of `edges` edges locally, in its step
    /// ([`Calibration::sampling`]), or in a window of `window` batches side by side
    /// ([`crate::sample::ahead`]): the calibrated window's time at `edges` a batch,
    /// shared by the run's batches of a window (no more than the calibration sampled at once:
    /// one thread a batch), and scaled as [`Calibration::sampling`] scales a batch's by
    /// `warm`.
    pub fn local_sampling(&self, edges: f64, vertices: f64, window: usize, warm: f64) -> f64 {
        self.windowed_sampling("sample_ahead", [edges, vertices], window, warm)
    }

    /// Seconds for a rank of several to sample a batch of `edges` edges with the owner-routed
    /// sampler, in its step (`sample`), or in a window of `window` batches sampled together
    /// ([`crate::exchange::sampling::distributed_window`]): the calibrated window's time
    /// (its exchanges included) shared as [`Calibration::local_sampling`] shares it. The id
    /// exchanges' bytes are priced apart, by the strategy.
    pub fn routed_sampling(&self, edges: f64, vertices: f64, window: usize, warm: f64) -> f64 {
        self.windowed_sampling("sample_ahead_routed", [edges, vertices], window, warm)
    }

    /// The windows were timed from evicted caches over the denser synthetic graph, as
    /// `sample`'s first series was: a window's price at `edges` a batch is scaled by what
    /// `warm` takes off a batch's price and by what a batch of `vertices` costs more than one
    /// of that graph's vertices per edge ([`Calibration::sampling`]).
    fn windowed_sampling(
        &self,
        op: &str,
        [edges, vertices]: [f64; 2],
        window: usize,
        warm: f64,
    ) -> f64 {
        let fit = self.op(op);
        if window < 2 || self.sample_window < 2 || !fit.priced() {
            return self.sampling(edges, vertices, warm);
        }
        let own_ratio = if edges > 0.0 { vertices / edges } else { 0.0 };
        let dense = edges
            * self
                .densest_sampled_vertices_per_edge()
                .unwrap_or(own_ratio);
        let timed = self.sampling(edges, dense, 0.0);
        let scale = if timed > 0.0 {
            self.sampling(edges, vertices, warm) / timed
        } else {
            1.0
        };
        let calibrated = self.sample_window as f64;
        scale * fit.seconds(edges * calibrated, 1.0) / window.min(self.sample_window) as f64
    }

    /// The fewest vertices per edge among the `sample` points: the denser synthetic graph's,
    /// which the windowed samplers are timed over. `None` without such points.
    fn densest_sampled_vertices_per_edge(&self) -> Option<f64> {
        let fit = self.op("sample");
        fit.points
            .iter()
            .zip(&fit.point_bytes)
            .filter(|(p, _)| p[0] > 0.0)
            .map(|(p, &v)| v / p[0])
            .min_by(f64::total_cmp)
    }

    /// This calibration as the kernels of a step run, `warm` (0 to 1) of whose data the
    /// host's cache still holds when they read it (the planner's `cost::kernel_warm_share`):
    /// the dense products' line and the aggregation's points and line moved that share of the
    /// way from their evicted times (`gemm`, `aggregate`) to their back-to-back ones
    /// (`gemm_warm`, `aggregate_warm`; never above the evicted point). The backward forms keep
    /// their ratios to the forward ([`Calibration::form_ratio`], from the evicted points). The
    /// calibration as it is at 0 or without warm points (a device, or ranks sharing cores,
    /// whose kernels are timed back to back anyway).
    ///
    /// Why: timed evicted, the kernels of small steps came out at about twice their measured
    /// time (2-rank Tolokers at hidden width 64, 2-core EPYC VM: a train phase of 0.28-0.31 ms
    /// priced at 0.46-0.65), and timed back to back (format 25) the 2-rank grid's forward
    /// and backward came out at 0.84-0.89 of their measured time; a step of a few MB runs
    /// from the cache, one of 40 MB does not.
    pub fn with_warm_kernels(&self, warm: f64) -> std::borrow::Cow<'_, Calibration> {
        use std::borrow::Cow;
        let warm = warm.clamp(0.0, 1.0);
        let pairs = [("gemm", "gemm_warm"), ("aggregate", "aggregate_warm")];
        let hot = |name: &str| self.operators.get(name).filter(|f| f.priced());
        if warm <= 0.0 || pairs.iter().all(|(_, h)| hot(h).is_none()) {
            return Cow::Borrowed(self);
        }
        let mut cal = self.clone();
        for (cold, warm_op) in pairs {
            if let (Some(c), Some(h)) = (self.operators.get(cold), hot(warm_op)) {
                cal.operators.insert(cold.to_string(), c.toward(h, warm));
            }
        }
        // The transposed aggregation has no back-to-back points: each of its points moves as
        // far as the forward's point of the same block and width did.
        if let (Some(before), Some(after), Some(t)) = (
            self.operators.get("aggregate"),
            cal.operators.get("aggregate").cloned(),
            cal.operators.get_mut("aggregate_transpose"),
        ) {
            if t.points.len() == before.points.len() && t.point_bytes == before.point_bytes {
                for ((p, b), a) in t.points.iter_mut().zip(&before.points).zip(&after.points) {
                    if b[1] > 0.0 {
                        p[1] *= a[1] / b[1];
                    }
                }
            }
        }
        Cow::Owned(cal)
    }

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
        w.push(self.sample_window as f64);
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
        self.sample_window = next() as usize;
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
