//! Measure a [`Calibration`]: time every operator the strategies use over a range of sizes on
//! this machine, with this rank layout and backend, and fit a line per operator.
//!
//! Every rank measures at the same time (a barrier before each point), so what ranks sharing a
//! host's cores or memory bandwidth do to each other — 4 ranks on 2 cores are oversubscribed —
//! is in the numbers; only the kernels of a host with more rank threads than cores are timed
//! in turns and priced at each rank's share of the cores ([`super::core_share`]). Each point
//! is the median of a few repetitions on each rank, then the maximum over ranks (a collective
//! waits for its slowest rank; so does a step), and rank 0's result is what every rank uses.
//! Sizes are kept small so that it takes seconds.

use super::calibration::{
    beyond_cache, Calibration, CalibrationKey, Fit, Product, SharedCores, FORMAT, GEMM_SHAPES,
    OPERATORS, ROW_EXCHANGE_NARROW_WIDTH, ROW_EXCHANGE_WIDTH,
};
use super::core_share::CoreShare;
use super::evict::{private_cache_bytes, Evictor};
use crate::backend::Backend;
use crate::comm::World;
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

mod comm;
mod drift;
mod gathers;
mod kernels;
mod sampler;
#[cfg(test)]
mod tests;

use comm::{comm_points, copy_points, partial_sums_points, row_exchange_points, world_and_node};
use drift::drift_points;
use gathers::{
    cache_of_host, far_shares, gather_far_points, gather_points, gather_table_points,
    gathers_from_tables, sparse_gather_points, GATHER_TABLE_ROWS, GATHER_WIDTHS,
};
use kernels::{
    aggregate_points, aggregate_transpose_points, attention_points, elementwise_points,
    gcn_norm_points, gemm_points, optimizer_points, products_of, spmm_points,
};
use sampler::{calibrated_window, routed_ahead_points, sample_ahead_points, sample_points};

/// Repetitions per point (the median is kept), after one untimed warm-up. Three left the
/// 2-core VM's calibrations ±20 % apart from one run to the next on most points.
const REPS: usize = 5;
/// Sweeps over every operator; each point keeps its median over them ([`median_points`]).
const SWEEPS: usize = 3;
/// Sweeps, and repetitions of each kernel point, on an emulated device ([`Backend::is_emulated`]:
/// the CUDA emulator of the tests). Its timings describe no GPU, so precision buys nothing,
/// and its kernels run as fibers at up to 2.5 s a point: with [`SWEEPS`] × [`REPS`] a 2-rank
/// calibration took 225 s on the 2-core VM. It still runs every operator through the device
/// seam, which is what a calibration on emulated ranks is for.
const EMULATED_SWEEPS: usize = 1;
const EMULATED_KERNEL_REPS: usize = 1;
/// Message sizes of the communication operators, bytes per rank. Up to 16 MB: past the 4 MB of
/// a core's cache a byte costs more (2-core VM, 2 ranks: a row exchange 0.49 → 0.93 ns a byte
/// from 4 to 16 MB, partial sums 0.23 → 0.39), and NFP's partial rows at hidden 1024 (11-23 MB
/// a call) were priced at a third of their measured shuffle from points up to 4 MB.
const MESSAGE_BYTES: &[usize] = &[
    1 << 10,
    1 << 14,
    1 << 17,
    1 << 19,
    1 << 21,
    1 << 22,
    1 << 24,
];

/// The key of a run of `device` with this world and `threads` per rank.
pub fn run_key(world: &World, device: String, threads: usize) -> CalibrationKey {
    CalibrationKey {
        host: super::calibration::host_name(),
        ranks: world.size(),
        nodes: world.node_index().1,
        ranks_per_node: world.node().size(),
        threads_per_rank: threads,
        device,
        version: env!("CARGO_PKG_VERSION").to_string(),
    }
}

/// The middle value of `v` (the upper one of an even count). `v` must not be empty.
fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Median of `reps` timed runs of `f` after an untimed warm-up, `before` run ahead of each
/// (untimed).
fn median_of_reps(reps: usize, mut before: impl FnMut(), mut f: impl FnMut()) -> f64 {
    f();
    let t: Vec<f64> = (0..reps)
        .map(|_| {
            before();
            let s = Instant::now();
            f();
            s.elapsed().as_secs_f64()
        })
        .collect();
    median(t)
}

/// Median of `REPS` timed runs of `f` (after a warm-up), the maximum over `world`. Collective.
fn time_point(world: &World, f: impl FnMut()) -> f64 {
    time_point_after(world, REPS, || {}, f)
}

/// Where a point's runs start from evicted caches: the evictor of a sweep (one buffer for all
/// its points, made once), or `None` for runs back to back.
type Eviction<'a> = Option<&'a RefCell<Evictor>>;

/// An evictor for the points of one sweep where `cold` (every rank has cores of its own).
fn eviction_if(cold: bool) -> Option<RefCell<Evictor>> {
    cold.then(|| RefCell::new(Evictor::for_host()))
}

/// [`time_point_after`] with the host's caches evicted ahead of every run where `evict` holds
/// an evictor.
fn time_point_evicted(world: &World, reps: usize, evict: Eviction, f: impl FnMut()) -> f64 {
    let before = || {
        if let Some(e) = evict {
            e.borrow_mut().evict();
        }
    };
    time_point_after(world, reps, before, f)
}

/// [`time_point`] of `reps` runs, with `before` run ahead of every call (untimed, before the
/// barrier).
fn time_point_after(world: &World, reps: usize, mut before: impl FnMut(), f: impl FnMut()) -> f64 {
    world.allreduce_max_f64(median_of_reps(
        reps,
        || {
            before();
            world.barrier()
        },
        f,
    ))
}

/// How often a rank waiting for its turn looks whether the round is over.
const TURN_POLL: Duration = Duration::from_micros(200);

/// Times the kernels' points: every rank at once ([`time_point`]), or, on a host whose cores
/// its ranks share, in turns priced at the rank's share of the cores ([`CoreShare`]).
#[derive(Clone, Copy)]
struct KernelTimer<'a> {
    world: &'a World,
    share: CoreShare,
    /// Each run starts from evicted caches ([`KernelTimer::cold`]).
    cold: Eviction<'a>,
    /// Timed runs per point.
    reps: usize,
}

impl<'a> KernelTimer<'a> {
    /// The timer of the host's work (the feature gathers), in turns where ranks share cores.
    fn host(world: &'a World, share: CoreShare) -> Self {
        KernelTimer {
            world,
            share,
            cold: None,
            reps: REPS,
        }
    }

    /// The timer of `be`'s kernels: the host's where `be` computes on the host; a device's
    /// all at once (ranks sharing a GPU is another matter than sharing cores), once a point
    /// where the device is emulated.
    fn kernels<B: Backend>(be: &B, world: &'a World, share: CoreShare) -> Self {
        if B::IS_HOST {
            Self::host(world, share)
        } else {
            KernelTimer {
                world,
                share: CoreShare::NONE,
                cold: None,
                reps: if be.is_emulated() {
                    EMULATED_KERNEL_REPS
                } else {
                    REPS
                },
            }
        }
    }

    /// This timer with every run of a host's kernel started from evicted caches, where every
    /// rank has cores of its own (as the sampler's points are): in a step, sampling and the
    /// feature gather run between one batch's products and the next's. Timed warm, the
    /// products and aggregations priced the 2-rank EPYC grid's forward and backward at
    /// 0.82-0.92 of their measured time (`auto-2026-12-06d-epyc-2ranks.md`).
    /// (`evict`: the sweep's evictor on a host; `None` on a device.)
    fn cold(self, evict: Eviction<'a>) -> Self {
        KernelTimer {
            cold: evict.filter(|_| self.share.turns == 1),
            ..self
        }
    }

    /// Seconds of `f` (collective over the world): the maximum over ranks of the median of
    /// `reps` runs after a warm-up, each rank's times its share's factor. In turns, the
    /// ranks of a round run their repetitions back to back while the others wait asleep.
    fn point(&self, mut f: impl FnMut()) -> f64 {
        if self.share.turns == 1 {
            return time_point_evicted(self.world, self.reps, self.cold, f);
        }
        let mut mine = 0.0;
        for round in 0..self.share.turns {
            self.world.barrier_sleeping(TURN_POLL);
            if round == self.share.round {
                mine = median_of_reps(self.reps, || {}, &mut f) * self.share.factor;
            }
        }
        self.world.barrier_sleeping(TURN_POLL);
        self.world.allreduce_max_f64(mine)
    }
}

/// One measurement of every operator: its points, and the bytes of each point for the
/// operators fitted in two variables (else empty).
type Sweep = BTreeMap<&'static str, (Vec<[f64; 2]>, Vec<f64>)>;

/// Every operator measured once, in [`OPERATORS`]' units. Collective over `world`.
fn sweep<B: Backend>(be: &B, world: &World, share: CoreShare) -> Sweep {
    let mut ops = Sweep::new();
    let mut put = |name: &'static str, pts: Vec<[f64; 2]>| {
        ops.insert(name, (pts, Vec::new()));
    };
    let multi = world.size() > 1;
    // Communication: a single rank moves nothing, so the operators are free there. Row
    // exchanges at two widths: the bytes' price, and the rows' ([`per_row`]).
    for (width, [world_name, node_name, leaders_name]) in [
        (
            ROW_EXCHANGE_WIDTH,
            ["alltoallv_world", "alltoallv_node", "alltoallv_leaders"],
        ),
        (
            ROW_EXCHANGE_NARROW_WIDTH,
            [
                "alltoallv_world_narrow",
                "alltoallv_node_narrow",
                "alltoallv_leaders_narrow",
            ],
        ),
    ] {
        let (world_a2a, node_a2a) = world_and_node(world, |g| row_exchange_points(world, g, width));
        put(world_name, world_a2a);
        put(node_name, node_a2a);
        let leaders = world.leaders().filter(|l| l.size() > 1);
        put(
            leaders_name,
            if world.node_index().1 > 1 {
                row_exchange_points(world, leaders, width)
            } else {
                vec![]
            },
        );
    }
    let (world_partials, node_partials) =
        world_and_node(world, |g| partial_sums_points(be, world, g));
    put("partial_sums_world", world_partials);
    put("partial_sums_node", node_partials);
    put(
        "allreduce",
        if multi {
            comm_points(
                world,
                Some(world),
                |_, bytes| vec![1.0f32; bytes / 4],
                |g, buf| g.allreduce_sum_f32(buf),
            )
        } else {
            vec![]
        },
    );
    put(
        "allgatherv",
        if multi {
            // `bytes` is what each rank receives in all.
            comm_points(
                world,
                Some(world),
                |g, bytes| vec![1.0f32; bytes / 4 / g.size()],
                |g, mine| {
                    let _ = g.allgatherv("calibrate", mine);
                },
            )
        } else {
            vec![]
        },
    );
    let host = KernelTimer::host(world, share);
    let kernels = KernelTimer::kernels(be, world, share);
    let gather = gather_points(host);
    let gather_far = gather_far_points(host, cache_of_host());
    let gather_tables = gather_table_points(host, cache_of_host());
    if B::IS_HOST {
        put("h2d", vec![]);
        put("d2h", vec![]);
    } else {
        let (up, down) = copy_points(be, world);
        put("h2d", up);
        put("d2h", down);
    }
    // One evictor for every point of the sweep that starts cold (a buffer twice the host's
    // largest cache, not one a point).
    let evictor = eviction_if(share.turns == 1);
    let evict = evictor.as_ref();
    let model = kernels.cold(evict.filter(|_| B::IS_HOST));
    // On a host backend a step's gather follows the last step's products, which push the
    // store out of the caches; a device's step leaves them to the host's sampling and gathers.
    let sparse_gather = sparse_gather_points(host.cold(evict.filter(|_| B::IS_HOST)));
    let [gemm, gemm_tn, gemm_nt] = Product::ALL.map(|form| gemm_points(be, model, form));
    let aggregate = aggregate_points(be, model);
    let aggregate_transpose = aggregate_transpose_points(be, model);
    // Back to back too, where the points above start cold: the kernels of a step whose data
    // stays in the host's cache (`Calibration::with_warm_kernels`).
    let (gemm_warm, aggregate_warm) = if B::IS_HOST && evict.is_some() {
        (
            gemm_points(be, kernels, Product::Forward),
            aggregate_points(be, kernels),
        )
    } else {
        ((vec![], vec![]), (vec![], vec![]))
    };
    let spmm = spmm_points(be, kernels);
    // The sampler of several ranks is collective (owners answer for their vertices): timed
    // with every rank at once; from cold caches where every rank has cores of its own.
    let sample = sample_points(world, evict);
    // Back to back, where the points above start cold: the sampler of a step that leaves the
    // graph in the host's cache (`Calibration::sampling`).
    let sample_warm = if evict.is_some() {
        sample_points(world, None)
    } else {
        (vec![], vec![])
    };
    put("sample_ahead", sample_ahead_points(world, evict));
    put("sample_ahead_routed", routed_ahead_points(world, evict));
    put("optimizer", optimizer_points(be, kernels));
    put("gcn_norm", gcn_norm_points(host));
    put("attention", attention_points(be, kernels));
    put("elementwise", elementwise_points(be, kernels));
    put(
        "drift",
        if multi {
            drift_points(be, world)
        } else {
            vec![]
        },
    );
    ops.insert("gemm", gemm);
    ops.insert("gemm_tn", gemm_tn);
    ops.insert("gemm_nt", gemm_nt);
    ops.insert("aggregate", aggregate);
    ops.insert("aggregate_transpose", aggregate_transpose);
    ops.insert("gemm_warm", gemm_warm);
    ops.insert("aggregate_warm", aggregate_warm);
    ops.insert("spmm", spmm);
    ops.insert("gather", gather);
    ops.insert("gather_far", gather_far);
    ops.insert("gather_tables", (gather_tables, vec![]));
    ops.insert("gather_sparse", sparse_gather);
    ops.insert("sample", sample);
    ops.insert("sample_warm", sample_warm);
    ops
}

/// Each point's median over the sweeps (its size too: the sampler's edges vary a little
/// between sweeps). A sustained slowdown of a few seconds — another job's burst on a shared
/// node — falls in one sweep and leaves the medians alone, where with one sweep it set every
/// point of the operators it overlapped (a 4-rank calibration of the 2-core VM once timed
/// the products at twice the flop time of three others run back to back).
fn median_points<'a>(
    sweeps: impl Iterator<Item = &'a (Vec<[f64; 2]>, Vec<f64>)>,
) -> (Vec<[f64; 2]>, Vec<f64>) {
    let sweeps: Vec<_> = sweeps.collect();
    let (first_points, first_bytes) = sweeps[0];
    let points = (0..first_points.len())
        .map(|i| [0, 1].map(|k| median(sweeps.iter().map(|(p, _)| p[i][k]).collect())))
        .collect();
    let bytes = (0..first_bytes.len())
        .map(|i| median(sweeps.iter().map(|(_, b)| b[i]).collect()))
        .collect();
    (points, bytes)
}

/// The operators priced through their measured points ([`Fit::by_points`]): the transfers,
/// whose time per byte changes with the message's size (protocols, copies through shared
/// memory, caches: 0.7 ns a byte for 128-512 KiB row exchanges and 1.8 ns for 4 MiB on a
/// 2-core EPYC VM). The aggregation and the gathers are priced through theirs by rows and row
/// size ([`Fit::by_grid`]): an aggregation's time per edge × column follows where its source
/// rows fit (on the EPYC VM, 2 ranks, 0.24-0.28 ns while 1-8 MB of sources fit the caches and
/// 0.59 ns at 16 MB), and one line, set by the largest point, priced the small blocks of
/// Tolokers and of hidden widths 64-256 at twice their time (`auto-replan-2026-12-02d*.md`).
/// The other kernels keep their lines: their points are timed on inputs a call before left
/// in the caches, and priced through them the optimizer and the element-wise passes of a
/// training step, whose inputs come cold, came out at 0.4× their measured time
/// (`auto-replan-2026-11-28*.md`); re-priced so today they moved the grid's errors by ±2
/// points either way. The sampler is priced through its points too, evicted and back to
/// back, by edges and vertices per edge ([`Fit::by_grid`], the two synthetic graphs of
/// `sampler::sample_points`): its line, set by the largest batches, priced 8,317 edges at
/// 0.24 ms where they were timed at 0.32 (2 ranks, EPYC VM), and, its back-to-back line
/// having the larger latency, left no difference between the two at the R-MAT graph's
/// 9k-edge batches, whose sampling measured 0.24 ms back to back and 0.45 after an eviction.
const PRICED_BY_POINTS: &[&str] = &[
    "alltoallv_world",
    "alltoallv_node",
    "alltoallv_leaders",
    "partial_sums_world",
    "partial_sums_node",
    "allreduce",
    "allgatherv",
    "h2d",
    "d2h",
];

/// A row exchange's seconds per row from its points at [`ROW_EXCHANGE_WIDTH`] columns
/// (`wide`) and at [`ROW_EXCHANGE_NARROW_WIDTH`] (`narrow`), the same bytes point by point:
/// the median over the points of the extra time over the extra rows (none below 0).
fn per_row(wide: &[[f64; 2]], narrow: &[[f64; 2]]) -> f64 {
    let rows = |bytes: f64, width: usize| bytes / (4 * width) as f64;
    let each: Vec<f64> = wide
        .iter()
        .zip(narrow)
        .map(|(w, n)| {
            let extra = rows(w[0], ROW_EXCHANGE_NARROW_WIDTH) - rows(w[0], ROW_EXCHANGE_WIDTH);
            ((n[1] - w[1]) / extra).max(0.0)
        })
        .collect();
    if each.is_empty() {
        return 0.0;
    }
    median(each)
}

/// Measure every operator (collective over `world`) in [`SWEEPS`] sweeps, keep each point's
/// median over them, and fit the lines.
pub fn calibrate<B: Backend>(be: &B, world: &World, key: CalibrationKey) -> Calibration {
    // Measure under the allocator policy training runs under (`Model::new` sets it): with
    // glibc's defaults every large fresh output is a new mapping whose pages fault in, and a
    // `gnnpar calibrate` of its own timed 8192 × 2 · 2 × 1024 at 11 ms against 1.3 ms with the
    // freed memory reused, as training reuses it.
    crate::backend::cpu::memory::keep_freed_memory();
    let started = Instant::now();
    let share = CoreShare::measure(world, key.threads_per_rank);
    if share.turns > 1 && world.rank() == 0 {
        log::info!(
            "calibration: {} ranks of {} thread(s) share this host's cores: kernels timed in {} \
             turns, priced at {:.2}× their time (a step's share of the cores)",
            world.ranks_on_host(),
            key.threads_per_rank,
            share.turns,
            share.factor
        );
    }
    let count = if be.is_emulated() {
        if world.rank() == 0 {
            log::info!(
                "calibration: the device is emulated on the CPU: its timings describe no GPU, so \
                 {EMULATED_SWEEPS} sweep and {EMULATED_KERNEL_REPS} timed run per kernel point"
            );
        }
        EMULATED_SWEEPS
    } else {
        SWEEPS
    };
    let sweeps: Vec<Sweep> = (0..count).map(|_| sweep(be, world, share)).collect();
    // A host's products run from its cores' caches; a device's have none of them.
    let private = if B::IS_HOST {
        private_cache_bytes().unwrap_or(0) as f64
    } else {
        0.0
    };
    let mut ops: BTreeMap<String, Fit> = BTreeMap::new();
    for (name, unit) in OPERATORS {
        let (points, bytes) = median_points(sweeps.iter().map(|s| &s[name]));
        let mut fit = match *name {
            // The products' bytes beyond the core's own caches (`Calibration::products`).
            "gemm" | "gemm_tn" | "gemm_nt" | "gemm_warm" => {
                let beyond = bytes.iter().map(|&b| beyond_cache(b, private)).collect();
                Fit {
                    point_bytes: bytes,
                    ..Fit::least_squares_with_bytes(unit, points, beyond)
                }
            }
            // Priced through their points by rows and row size (`Fit::by_grid`); the line
            // is kept for reading.
            "gather"
            | "gather_far"
            | "gather_sparse"
            | "aggregate"
            | "aggregate_warm"
            | "aggregate_transpose"
            | "spmm"
            | "sample"
            | "sample_warm" => Fit {
                by_points: true,
                ..Fit::least_squares_relative_with_bytes(unit, points, bytes)
            },
            _ if PRICED_BY_POINTS.contains(name) => Fit::through_points(unit, points),
            _ => Fit::least_squares(unit, points),
        };
        let narrow = format!("{name}_narrow");
        if sweeps[0].contains_key(narrow.as_str()) {
            // A row exchange, timed on narrower rows too: its cost per row.
            let (narrow, _) = median_points(sweeps.iter().map(|s| &s[narrow.as_str()]));
            fit.per_row_s = per_row(&fit.points, &narrow);
        }
        ops.insert(name.to_string(), fit);
    }
    let (tables, _) = median_points(sweeps.iter().map(|s| &s["gather_tables"]));
    let far_shares = far_shares(&ops["gather"], &ops["gather_far"], &tables, cache_of_host());
    let mut cal = Calibration {
        format: FORMAT,
        key,
        seconds_to_calibrate: 0.0,
        operators: ops,
        far_shares,
        shared_cores: (share.turns > 1).then_some(SharedCores {
            turns: share.turns,
            factor: share.factor,
        }),
        cache_bytes: cache_of_host() as f64,
        private_cache_bytes: private,
        sample_window: calibrated_window(world),
    };
    // Rank 0's numbers everywhere (they are maxima over ranks already; this makes them bitwise
    // the same whatever the reductions' rounding).
    share_from_root(world, &mut cal);
    cal.seconds_to_calibrate = world.allreduce_max_f64(started.elapsed().as_secs_f64());
    cal
}

/// The products a cached calibration is checked on ([`GEMM_SHAPES`]' 3rd to 5th: 33 to 268
/// MFLOP, about 35 ms in all with their repetitions on one core of the 2-core VM).
const CHECK_SHAPES: std::ops::Range<usize> = 2..5;

/// How fast this host runs a few of the calibration's products now, against the times `cal`
/// holds for them: the median over them of (seconds now / seconds then), timed as the
/// calibration timed them. `None` when `cal` has no such points. Collective; every rank gets
/// rank 0's ratio (each point is the maximum over ranks already).
///
/// A calibration is seconds of one machine state: on the shared 2-core VM one was taken in a
/// slow stretch (its products at 1.36× the previous calibration's), and every prediction made
/// from it came out 1.38× too slow while training ran at its usual speed. Predictions keep
/// using the cached numbers (the same calibration gives the same plan); this says when they
/// no longer describe the host.
pub fn products_against<B: Backend>(be: &B, world: &World, cal: &Calibration) -> Option<f64> {
    let then = &cal.operators.get("gemm")?.points;
    if then.len() != GEMM_SHAPES.len() {
        return None;
    }
    let threads = cal.key.threads_per_rank;
    let share = if B::IS_HOST {
        CoreShare::measure(world, threads)
    } else {
        CoreShare::NONE
    };
    let evictor = eviction_if(B::IS_HOST && share.turns == 1);
    let timer = KernelTimer::kernels(be, world, share).cold(evictor.as_ref());
    let (now, _) = products_of(be, timer, &GEMM_SHAPES[CHECK_SHAPES], Product::Forward);
    let ratios: Vec<f64> = now
        .iter()
        .zip(&then[CHECK_SHAPES])
        // The same product (its flops) timed then, and timed at all.
        .filter(|(n, t)| n[0] == t[0] && t[1] > 0.0)
        .map(|(n, t)| n[1] / t[1])
        .collect();
    median_ratio_from_root(world, ratios)
}

/// The width of the gathers a cached calibration is checked on (512-byte rows).
const CHECK_GATHER_WIDTH: usize = 128;

/// How fast this host gathers feature rows now, against `cal`: its `gather` points of
/// [`CHECK_GATHER_WIDTH`] columns timed again as the calibration timed them, the median over
/// them of (seconds now / seconds then); `None` when `cal` has no such points. The products
/// of [`products_against`] are bound by the cores, a gather by the caches and the memory,
/// which a VM shares with its neighbours: on the 2-core EPYC VM the 512-byte gathers of
/// 16,384 rows took 47 ns a row in one calibration and 122 ns in another an hour later,
/// while the products of the two stayed within 10 % of each other. Collective; every rank
/// gets rank 0's ratio.
pub fn gathers_against(world: &World, cal: &Calibration) -> Option<f64> {
    let then = cal.operators.get("gather")?;
    let share = CoreShare::measure(world, cal.key.threads_per_rank);
    let (table_rows, width) = GATHER_TABLE_ROWS
        .into_iter()
        .zip(GATHER_WIDTHS)
        .find(|&(_, w)| w == CHECK_GATHER_WIDTH)
        .expect("the check's width is one the calibration times");
    let table = || [(table_rows, width)].into_iter();
    // Once untimed: the first gathers a process times run 1.5-1.7× the calibration's (2-core
    // Xeon VM, a plan right after a calibration, 2 ranks: 1.51-1.73× in every run), the same
    // gathers timed again 1.04-1.05×. A calibration times them after a dozen operators and
    // training after its first steps, so the first pass only made every run warn of a host
    // that had not changed (the grids' check read 1.56× on 2 ranks, 1.24× on 4).
    let _ = gathers_from_tables(KernelTimer::host(world, share), table());
    let (now, now_bytes) = gathers_from_tables(KernelTimer::host(world, share), table());
    let ratios: Vec<f64> = now
        .iter()
        .zip(&now_bytes)
        .filter_map(|(n, &b)| {
            // The point of the same rows and bytes then (its width's), timed at all.
            let at = (0..then.points.len().min(then.point_bytes.len()))
                .find(|&i| then.points[i][0] == n[0] && then.point_bytes[i] == b)?;
            (then.points[at][1] > 0.0).then(|| n[1] / then.points[at][1])
        })
        .collect();
    median_ratio_from_root(world, ratios)
}

/// The median of this rank's `ratios`, rank 0's on every rank; `None` where rank 0 has none.
/// Collective.
fn median_ratio_from_root(world: &World, ratios: Vec<f64>) -> Option<f64> {
    let mut ratio = [if ratios.is_empty() {
        f64::NAN
    } else {
        median(ratios)
    }];
    world.broadcast_f64_from_root(&mut ratio);
    ratio[0].is_finite().then_some(ratio[0])
}

/// Make every rank price with rank 0's calibration, bit for bit ([`Calibration::wire`]; the
/// other ranks' `cal` needs only its key). Collective.
pub fn share_from_root(world: &World, cal: &mut Calibration) {
    let mut wire = if world.rank() == 0 {
        cal.wire()
    } else {
        Vec::new()
    };
    let mut len = [wire.len() as f64];
    world.broadcast_f64_from_root(&mut len);
    wire.resize(len[0] as usize, 0.0);
    world.broadcast_f64_from_root(&mut wire);
    cal.set_wire(&wire);
}
