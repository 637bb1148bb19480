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
use super::evict::{host_cache_bytes, private_cache_bytes, Evictor};
use crate::backend::{AdamStep, Backend, EdgeWeights};
use crate::comm::{Group, World};
use crate::exchange::plan::alltoallv_rows_on;
use crate::exchange::store::FeatureStore;
use crate::exchange::{sample_blocks_distributed, RowExchange};
use crate::graph::NodeId;
use crate::sample::{sample_blocks, Adjacency, BatchKey, Block};
use ndarray::Array2;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

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
    /// Timed runs per point.
    reps: usize,
}

impl<'a> KernelTimer<'a> {
    /// The timer of the host's work (the feature gathers), in turns where ranks share cores.
    fn host(world: &'a World, share: CoreShare) -> Self {
        KernelTimer {
            world,
            share,
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
                reps: if be.is_emulated() {
                    EMULATED_KERNEL_REPS
                } else {
                    REPS
                },
            }
        }
    }

    /// Seconds of `f` (collective over the world): the maximum over ranks of the median of
    /// `reps` runs after a warm-up, each rank's times its share's factor. In turns, the
    /// ranks of a round run their repetitions back to back while the others wait asleep.
    fn point(&self, mut f: impl FnMut()) -> f64 {
        if self.share.turns == 1 {
            return time_point_after(self.world, self.reps, || {}, f);
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

/// Points of a collective over `group` (when this rank is in it) for every message size;
/// ranks outside the group take part in the timing's barrier and maximum only.
fn comm_points(world: &World, group: Option<&Group>, op: impl Fn(&Group, usize)) -> Vec<[f64; 2]> {
    MESSAGE_BYTES
        .iter()
        .map(|&bytes| {
            let s = time_point(world, || {
                if let Some(g) = group {
                    op(g, bytes)
                }
            });
            [bytes as f64, s]
        })
        .collect()
}

/// Points of the `alltoallv` operators over `group` (when this rank is in it), rows of
/// `width` columns: a row
/// exchange as the strategies run theirs, planned for the batch at hand ([`RowExchange::new`]:
/// the wanted ids to their owners), made ([`RowExchange::forward`]: rows packed by id on their
/// owners, exchanged, and placed in the order asked for) and reversed
/// ([`RowExchange::backward`]: the gradients summed per row, sent back and added into the
/// owners' rows), where every rank receives `bytes` of rows in all, evenly from the other
/// ranks, ids spread over the owners' rows; half the time is one call's. A bare alltoallv of
/// one ready buffer measured 3-4× faster per byte on the 2-core VM than the exchanges inside
/// training steps, whose shuffles and fetches this operator prices.
fn row_exchange_points(world: &World, group: Option<&Group>, width: usize) -> Vec<[f64; 2]> {
    MESSAGE_BYTES
        .iter()
        .map(|&bytes| {
            let prepared = group.map(|g| {
                let (ranks, peers) = (g.size(), g.size().saturating_sub(1).max(1));
                let wanted_rows = (bytes / 4 / width).max(1);
                let held = 2 * wanted_rows;
                let offsets: Vec<u64> = (0..=ranks).map(|r| (r * held) as u64).collect();
                let wanted: Vec<NodeId> = (0..wanted_rows)
                    .map(|i| {
                        let owner = (g.rank() + 1 + i % peers) % ranks;
                        let row = (i as u64 * 2_654_435_761) % held as u64;
                        (offsets[owner] + row) as NodeId
                    })
                    .collect();
                (offsets, wanted, Array2::from_elem((held, width), 1.0f32))
            });
            let s = time_point(world, || {
                if let (Some(g), Some((offsets, wanted, local))) = (group, &prepared) {
                    let plan = RowExchange::new(g, offsets, wanted);
                    let rows = plan.forward(g, "calibrate", local.view());
                    let mut grads = Array2::zeros(local.dim());
                    plan.backward(g, "calibrate", rows.view(), &mut grads);
                }
            });
            // Two calls: the rows out and their gradients back.
            [bytes as f64, s / 2.0]
        })
        .collect()
}

/// Points of the `partial_sums` operators over `group` (when this rank is in it): partial
/// sums as SNP and NFP exchange theirs ([`alltoallv_rows_on`] on the backend): rows of 256
/// columns made ready on the backend, sent, and added into one destination row per peer's
/// row on receipt; backward, the destinations' gradients gathered back into one row per
/// partial and sent back. Every rank receives `bytes` in all, evenly from the other ranks;
/// half the time is one call's. No rows are packed or placed by id: at 4 MiB on the 2-core
/// EPYC VM this costs 0.5× a row exchange of the same bytes between 2 ranks, 0.35× among 4.
fn partial_sums_points<B: Backend>(be: &B, world: &World, group: Option<&Group>) -> Vec<[f64; 2]> {
    const WIDTH: usize = 256;
    MESSAGE_BYTES
        .iter()
        .map(|&bytes| {
            let counts = group.map(|g| {
                let peers = g.size().saturating_sub(1).max(1);
                let per_peer = (bytes / 4 / WIDTH / peers).max(1);
                let rows: Vec<usize> = (0..g.size())
                    .map(|r| if r == g.rank() { 0 } else { per_peer })
                    .collect();
                // Peer `p`'s `i`-th row adds into destination `i`, as SNP's virtual
                // destinations are grouped by owner, then by destination.
                let dst: Vec<u32> = (0..peers * per_peer)
                    .map(|i| (i % per_peer) as u32)
                    .collect();
                (rows, dst, per_peer)
            });
            let s = time_point(world, || {
                if let (Some(g), Some((rows, dst, num_dst))) = (group, &counts) {
                    let ready = be.zeros(dst.len(), WIDTH);
                    let received = alltoallv_rows_on(g, be, "calibrate", ready, rows, rows);
                    let mut sums = be.zeros(*num_dst, WIDTH);
                    be.scatter_add_rows(be.view_mut(&mut sums), dst, be.view(&received));
                    let grads = be.gather_rows(be.view(&sums), dst);
                    let back = alltoallv_rows_on(g, be, "calibrate", grads, rows, rows);
                    // A one-row read waits for the device's queued work.
                    let _ = be.download(be.rows(be.view(&back), 0..1));
                }
            });
            // Two calls: the sums out and their gradients back.
            [bytes as f64, s / 2.0]
        })
        .collect()
}

/// One measurement of every operator: its points, and the bytes of each point for the
/// operators fitted in two variables (else empty).
type Sweep = BTreeMap<&'static str, (Vec<[f64; 2]>, Vec<f64>)>;

/// The points of a collective operator over the world and over each rank's node
/// (`measure(Some(group))`, every rank at once): none on one rank, and the node's are the
/// world's where the node is the world. Collective over `world`.
fn world_and_node(
    world: &World,
    mut measure: impl FnMut(Option<&Group>) -> Vec<[f64; 2]>,
) -> (Vec<[f64; 2]>, Vec<[f64; 2]>) {
    let node = world.node();
    let world_points = if world.size() > 1 {
        measure(Some(world))
    } else {
        vec![]
    };
    let node_points = if node.size() > 1 && node.size() < world.size() {
        measure(Some(node))
    } else if node.size() > 1 {
        world_points.clone() // the node is the world: the same points
    } else {
        vec![]
    };
    (world_points, node_points)
}

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
            comm_points(world, Some(world), |g, bytes| {
                let mut buf = vec![1.0f32; bytes / 4];
                g.allreduce_sum_f32(&mut buf);
            })
        } else {
            vec![]
        },
    );
    put(
        "allgatherv",
        if multi {
            // `bytes` is what each rank receives in all.
            comm_points(world, Some(world), |g, bytes| {
                let mine = vec![1.0f32; bytes / 4 / g.size()];
                let _ = g.allgatherv("calibrate", &mine);
            })
        } else {
            vec![]
        },
    );
    let host = KernelTimer::host(world, share);
    let kernels = KernelTimer::kernels(be, world, share);
    let gather = gather_points(host);
    let gather_far = gather_far_points(host, cache_of_host());
    let gather_tables = gather_table_points(host, cache_of_host());
    let sparse_gather = sparse_gather_points(host);
    if B::IS_HOST {
        put("h2d", vec![]);
        put("d2h", vec![]);
    } else {
        let (up, down) = copy_points(be, world);
        put("h2d", up);
        put("d2h", down);
    }
    let [gemm, gemm_tn, gemm_nt] = Product::ALL.map(|form| gemm_points(be, kernels, form));
    let aggregate = aggregate_points(be, kernels);
    let spmm = spmm_points(be, kernels);
    // The sampler of several ranks is collective (owners answer for their vertices): timed
    // with every rank at once; from cold caches where every rank has cores of its own.
    put("sample", sample_points(world, share.turns == 1));
    put("optimizer", optimizer_points(be, kernels));
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
    ops.insert("spmm", spmm);
    ops.insert("gather", gather);
    ops.insert("gather_far", gather_far);
    ops.insert("gather_tables", (gather_tables, vec![]));
    ops.insert("gather_sparse", sparse_gather);
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
/// points either way.
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
            "gemm" | "gemm_tn" | "gemm_nt" => {
                let beyond = bytes.iter().map(|&b| beyond_cache(b, private)).collect();
                Fit {
                    point_bytes: bytes,
                    ..Fit::least_squares_with_bytes(unit, points, beyond)
                }
            }
            // Priced through their points by rows and row size (`Fit::by_grid`); the line
            // is kept for reading.
            "gather" | "gather_far" | "gather_sparse" | "aggregate" | "spmm" => Fit {
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
    let timer = KernelTimer::kernels(be, world, share);
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

/// The host's largest cache, or 32 MiB where it reports none.
fn cache_of_host() -> usize {
    host_cache_bytes().unwrap_or(32 << 20)
}

/// The row widths (columns) the dense gathers are timed at.
const GATHER_WIDTHS: [usize; 3] = [8, 128, 1024];

/// The near gathers' tables, rows at each of [`GATHER_WIDTHS`]: 1, 16 and 32 MB.
const GATHER_TABLE_ROWS: [usize; 3] = [1 << 15, 1 << 15, 1 << 13];

/// The feature gather (rows by id from this rank's store into a batch matrix), with the real
/// store's code path, at three row widths: `x` = rows, and the bytes of each point. A row
/// costs its lookup (ownership, cache) and placement whatever its width, which bytes alone
/// missed: Tolokers' 40-byte rows gathered at 2-5× their bytes' prediction (2-core VM).
fn gather_points(timer: KernelTimer) -> (Vec<[f64; 2]>, Vec<f64>) {
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
/// ([`super::calibration::Calibration::far_share`]).
fn gather_far_points(timer: KernelTimer, cache_bytes: usize) -> (Vec<[f64; 2]>, Vec<f64>) {
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
const SWEPT_GATHER: (usize, usize) = (16384, 128);

/// One gather of [`SWEPT_GATHER`] rows from tables of each of [`SWEPT_TABLE_BYTES`] smaller
/// than the far gathers' (every rank at once, each from its own, as a step's gathers run):
/// `x` = the table's bytes. The host's caches hold what they hold of each, whatever size it
/// reports: the 2-core Xeon VM reports a 480 MB L3, which its neighbours share, and a 51 MB
/// store there gathered its 256-byte rows at 65 ns each, where the near tables' price was
/// about 28 and the far one's 90 ([`far_shares`]).
fn gather_table_points(timer: KernelTimer, cache_bytes: usize) -> Vec<[f64; 2]> {
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

/// [`super::calibration::Calibration::far_shares`] from the near and far gathers and the
/// swept tables' points: each table's gather of [`SWEPT_GATHER`] rows as a share of the way
/// from the near gathers' time for them (share 0 at the near table's bytes) to the far ones'
/// (1 at the far table's), non-decreasing. Empty where the far gather is no slower than the
/// near one (nothing to interpolate).
fn far_shares(near: &Fit, far: &Fit, tables: &[[f64; 2]], cache_bytes: usize) -> Vec<[f64; 2]> {
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
fn gathers_from_tables(
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
fn sparse_gather_points(timer: KernelTimer) -> (Vec<[f64; 2]>, Vec<f64>) {
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
fn spread_ids(n: usize, range: usize, calls: usize) -> Vec<Vec<NodeId>> {
    (0..calls as u64)
        .map(|call| {
            (0..n as u64)
                .map(|i| ((i + call * n as u64) * 2_654_435_761 % range as u64) as NodeId)
                .collect()
        })
        .collect()
}

/// Host → device and device → host copies of growing matrices.
fn copy_points<B: Backend>(be: &B, world: &World) -> (Vec<[f64; 2]>, Vec<[f64; 2]>) {
    let mut up = Vec::new();
    let mut down = Vec::new();
    for &bytes in MESSAGE_BYTES {
        let x = Array2::<f32>::ones((bytes / 4 / 256, 256));
        let s = time_point(world, || {
            let m = be.upload(x.view());
            // A one-row read waits for the copy (device work is queued).
            let _ = be.download(be.rows(be.view(&m), 0..1));
        });
        up.push([bytes as f64, s]);
        let m = be.upload(x.view());
        let s = time_point(world, || {
            let _ = be.download(be.view(&m));
        });
        down.push([bytes as f64, s]);
    }
    (up, down)
}

fn gemm_points<B: Backend>(be: &B, timer: KernelTimer, form: Product) -> (Vec<[f64; 2]>, Vec<f64>) {
    products_of(be, timer, &GEMM_SHAPES, form)
}

/// The points of the products `shapes` in `form` (`(flops, seconds)`) and the bytes each
/// touches. A shape `(m, k, n)` is a layer's `m` rows of `k` columns into `n`: forward
/// `x·W` (`m×k · k×n`), its weight gradient `xᵀ·dY` added onto a `k×n` gradient, its
/// input gradient `dY·Wᵀ` (`m×n · n×k`) — the same flops and bytes in every form.
fn products_of<B: Backend>(
    be: &B,
    timer: KernelTimer,
    shapes: &[(usize, usize, usize)],
    form: Product,
) -> (Vec<[f64; 2]>, Vec<f64>) {
    let mut points = Vec::new();
    let mut bytes = Vec::new();
    for &(m, k, n) in shapes {
        // Small whole numbers, as every point's inputs (the values do not change the timing).
        let matrix = |r: usize, c: usize, modulus: usize| {
            be.upload(Array2::from_shape_fn((r, c), |(i, j)| ((i + j) % modulus) as f32).view())
        };
        let s = match form {
            Product::Forward => {
                let (x, w) = (matrix(m, k, 7), matrix(k, n, 5));
                timer.point(|| {
                    let y = be.matmul(be.view(&x), be.view(&w));
                    let _ = be.download(be.rows(be.view(&y), 0..1));
                })
            }
            Product::WeightGradient => {
                let (x, dy, mut g) = (matrix(m, k, 7), matrix(m, n, 3), matrix(k, n, 1));
                timer.point(|| {
                    be.add_matmul_tn(be.view(&x), be.view(&dy), be.view_mut(&mut g));
                    let _ = be.download(be.rows(be.view(&g), 0..1));
                })
            }
            Product::InputGradient => {
                let (dy, w) = (matrix(m, n, 3), matrix(k, n, 5));
                timer.point(|| {
                    let dx = be.matmul_nt(be.view(&dy), be.view(&w));
                    let _ = be.download(be.rows(be.view(&dx), 0..1));
                })
            }
        };
        points.push([(2 * m * k * n) as f64, s]);
        bytes.push((4 * (m * k + k * n + m * n)) as f64);
    }
    (points, bytes)
}

/// A sampled-looking block: `dst` destinations with [`BLOCK_FANOUT`] pseudo-random sources
/// each among `src`.
fn synthetic_block(dst: usize, src: usize) -> Block {
    let indices: Vec<u32> = (0..dst * BLOCK_FANOUT)
        .map(|i| ((i as u64 * 2_654_435_761) % src as u64) as u32)
        .collect();
    Block {
        num_dst: dst,
        src_nodes: (0..src as NodeId).collect(),
        indptr: (0..=dst).map(|v| v * BLOCK_FANOUT).collect(),
        indices,
    }
}

/// Sources per destination of the synthetic blocks (a sampled block's fanout).
const BLOCK_FANOUT: usize = 10;

/// The block the attention points run on: 4096 destinations among 16384 sources.
fn attention_block() -> Block {
    synthetic_block(4096, 16384)
}

/// Source rows of the aggregation points' blocks (a quarter as many destinations, each of
/// [`BLOCK_FANOUT`] sources), and the widths each is timed at. The sources' bytes, from 128 KiB
/// to 256 MiB, span the core's own caches, the host's last level and memory.
const AGGREGATE_SOURCES: [usize; 3] = [2048, 16384, 65536];
const AGGREGATE_WIDTHS: [usize; 4] = [16, 64, 256, 1024];

/// Mean aggregation over blocks of each [`AGGREGATE_SOURCES`] at each [`AGGREGATE_WIDTHS`]:
/// `x` = edges, and the bytes of the source rows they read (edges × width × 4), so that it is
/// priced through its points by edges and row size as the gathers are ([`Fit::by_grid`]).
/// An edge × column is not one price: its source rows are read at random, so it costs what
/// the cache the sources fit in charges per row. Timed at widths up to 256 over 16384 sources
/// (up to 16 MB) and priced by edges × columns alone, a real batch's input-layer aggregation
/// of the 2,048-feature SBM (26,520 edges) took 22 ms where that priced 10.6 ms, and its
/// 64-column ones 0.6× their price (2-core EPYC VM); the grid's train phase of that SBM went
/// from 1.12-1.23× its prediction to 0.88-1.05× (`auto-replan-2026-12-03c*.md`).
fn aggregate_points<B: Backend>(be: &B, timer: KernelTimer) -> (Vec<[f64; 2]>, Vec<f64>) {
    let (mut points, mut bytes) = (Vec::new(), Vec::new());
    for &src in &AGGREGATE_SOURCES {
        let block = synthetic_block(src / 4, src);
        let edges = block.num_edges();
        let g = be.graph(block);
        for &w in &AGGREGATE_WIDTHS {
            let x =
                be.upload(Array2::from_shape_fn((src, w), |(i, j)| ((i + j) % 3) as f32).view());
            let s = timer.point(|| {
                let out = be.aggregate(&g, be.view(&x), EdgeWeights::Mean);
                let _ = be.download(be.rows(be.view(&out), 0..1));
            });
            points.push([edges as f64, s]);
            bytes.push((edges * w * 4) as f64);
        }
    }
    (points, bytes)
}

/// The output widths the sparse products are timed at.
const SPMM_WIDTHS: [usize; 4] = [16, 64, 256, 1024];

/// Products with sparse input rows (bag-of-words features at 1 % density, 4096 columns), the
/// forward `x·w` and the weight gradient `xᵀ·d` together, at the output widths of the layers
/// trained (16 to 1024 columns) and over 1024 and 4096 of the rows: `x` = 2 × stored
/// non-zeros (each read by both products), the bytes the row of `w` (or of the gradient)
/// each non-zero reads, `4 ×` the width. Priced through these points by non-zeros and width
/// ([`Fit::by_grid`]), as the aggregation is by edges and row size: a non-zero's cost per
/// column is not one number (on the Xeon VM 0.12 ns at 64 columns, 0.18 at 256 and 0.26 at
/// 1024, as the weight outgrows the 2 MB L2), and the line through widths up to 256 that
/// priced them left Facebook's 2-rank steps of hidden 1024 at 1.14-1.49× their predicted
/// train phase. A backend
/// without a sparse path (it multiplies such rows densely, priced by `gemm`) has no points:
/// the operator is free and unused.
fn spmm_points<B: Backend>(be: &B, timer: KernelTimer) -> (Vec<[f64; 2]>, Vec<f64>) {
    let (rows, cols, per_row) = (4096usize, 4096usize, 41usize);
    let mut dense = Array2::<f32>::zeros((rows, cols));
    for i in 0..rows {
        for t in 0..per_row {
            let j = ((i * per_row + t) as u64 * 2_654_435_761 % cols as u64) as usize;
            dense[(i, j)] = 1.0;
        }
    }
    let dev = be.upload(dense.view());
    let Some(x) = be.sparse_from_dense(be.view(&dev)) else {
        // Every rank takes this branch alike (same backend kind), so no collective is skipped.
        return (vec![], vec![]);
    };
    let (mut points, mut bytes) = (Vec::new(), Vec::new());
    for used in [rows / 4, rows] {
        let nnz = dense
            .slice(ndarray::s![..used, ..])
            .iter()
            .filter(|&&v| v != 0.0)
            .count();
        for n in SPMM_WIDTHS {
            let w =
                be.upload(Array2::from_shape_fn((cols, n), |(i, j)| ((i + j) % 5) as f32).view());
            let d =
                be.upload(Array2::from_shape_fn((used, n), |(i, j)| ((i * j) % 3) as f32).view());
            let mut g = be.upload(Array2::<f32>::zeros((cols, n)).view());
            let s = timer.point(|| {
                let y = be.spmm(&x, used, be.view(&w));
                be.add_spmm_tn(&x, used, be.view(&d), be.view_mut(&mut g));
                let _ = be.download(be.rows(be.view(&y), 0..1));
            });
            points.push([(2 * nnz) as f64, s]);
            bytes.push((2 * nnz * n * 4) as f64);
        }
    }
    (points, bytes)
}

/// A synthetic adjacency for timing the sampler: `n` vertices of `degree` pseudo-random
/// neighbours each (16 MiB of ids at the size used: more than a core's caches, as a real
/// graph's adjacency is).
struct SyntheticGraph {
    degree: usize,
    neighbors: Vec<NodeId>,
}

impl SyntheticGraph {
    fn new(n: usize, degree: usize) -> SyntheticGraph {
        let neighbors = (0..n * degree)
            .map(|i| ((i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 40) as usize % n)
            .map(|u| u as NodeId)
            .collect();
        SyntheticGraph { degree, neighbors }
    }

    fn neighbors(&self, v: NodeId) -> &[NodeId] {
        let v = v as usize;
        &self.neighbors[v * self.degree..(v + 1) * self.degree]
    }
}

/// This rank's share of a [`SyntheticGraph`] cut into contiguous ranges, as a partitioned
/// graph's rank holds its vertices' adjacency only (on one rank, the whole graph).
struct OwnedRange<'a> {
    graph: &'a SyntheticGraph,
    first: u64,
    end: u64,
}

impl Adjacency for OwnedRange<'_> {
    fn owns(&self, v: NodeId) -> bool {
        (self.first..self.end).contains(&(v as u64))
    }

    fn neighbors(&self, v: NodeId) -> &[NodeId] {
        self.graph.neighbors(v)
    }

    fn orig_id(&self, v: NodeId) -> u64 {
        v as u64
    }
}

/// The sampler a rank runs, on two hops of fanout 10 and 5 from growing seed sets: `x` =
/// edges in this rank's blocks (the mean over the timed calls and the ranks). On one rank the
/// local `sample_blocks` (draws, de-duplication, block building); on several the owner-routed
/// `sample_blocks_distributed` GDP's ranks run (and DNP's and SNP's upper hops), over the
/// synthetic graph cut into contiguous ranges, every rank sampling seeds of its own: routing
/// every frontier to its owners, drawing for the other ranks and merging their answers is
/// work per edge the local sampler never does, and priced as local sampling the build phase
/// of 2-rank steps ran 1.5-3.6× its prediction (2-core VM, grid h). Every call samples other
/// seeds under another batch key, as training does, and the host's caches are evicted ahead
/// of every call ([`Evictor`]): in a step the model's phases run between two batches'
/// sampling and leave none of the adjacency or the sampler's tables in the caches, where
/// back to back the calls found them there (a 16 MiB synthetic graph in a 105 MiB L3) and
/// priced the build phase of the 2-rank grid at 1.2-1.9× less than it measured (2-core VM,
/// grid j; one thread sampling real graphs after such an eviction took 1.1-1.7× as long as
/// back to back). Where ranks share cores (`cold` false) the calls run back to back as
/// before: 4 ranks on the 2 cores, all evicting, priced the build phase of GDP and DNP at
/// 2-3× what it measured, and the same calibration their model phase at 1.4-1.7×. The
/// strategies' id exchanges while sampling are also priced
/// by their bytes and calls (`cost::build`), which counts the bytes GDP's sampler moves here
/// a second time: 4-12 bytes an edge at the alltoallv's rate, a few ns against the tens an
/// edge costs.
fn sample_points(world: &World, cold: bool) -> Vec<[f64; 2]> {
    let (n, degree) = (1usize << 18, 16usize);
    let graph = SyntheticGraph::new(n, degree);
    let ranks = world.size();
    let offsets: Vec<u64> = (0..=ranks).map(|r| (r * n / ranks) as u64).collect();
    let (first, end) = (offsets[world.rank()], offsets[world.rank() + 1]);
    let mine = OwnedRange {
        graph: &graph,
        first,
        end,
    };
    let mut evictor = cold.then(Evictor::for_host);
    [128usize, 512, 1024, 2048]
        .iter()
        .map(|&seeds| {
            let batches: Vec<Vec<NodeId>> = spread_ids(seeds, (end - first) as usize, REPS + 1)
                .into_iter()
                .map(|b| b.into_iter().map(|v| v + first as NodeId).collect())
                .collect();
            let (mut call, mut edges) = (0, 0usize);
            let s = time_point_after(
                world,
                REPS,
                || evictor.iter_mut().for_each(Evictor::evict),
                || {
                    let key = BatchKey {
                        seed: 7,
                        epoch: 0,
                        batch: call as u64,
                    };
                    let blocks = if ranks > 1 {
                        sample_blocks_distributed(
                            world,
                            &mine,
                            &offsets,
                            &batches[call],
                            &[10, 5],
                            key,
                        )
                    } else {
                        sample_blocks(&mine, &batches[call], &[10, 5], key)
                    };
                    edges += blocks.iter().map(Block::num_edges).sum::<usize>();
                    call += 1;
                },
            );
            let mut mean = [edges as f64 / call as f64];
            world.allreduce_sum_f64(&mut mean);
            [mean[0] / ranks as f64, s]
        })
        .collect()
}

/// Repetitions of each drift point. The wait is a mean over them, set by a few long stalls
/// (a rank descheduled for milliseconds), and a step pays it as a share of its work. On the
/// 2-core VM four calibrations with [`REPS`] (5) spread 2.1× (2 ranks) and 3.2× (4 ranks) in
/// drift, which moves a step's prediction by up to a tenth; three with 20 spread 1.7× and
/// 1.45×, for 2-7 s more of calibration.
const DRIFT_REPS: usize = 20;

/// How far the ranks drift apart over a stretch of the same work between two collectives:
/// every rank starts together and runs the same products (`x` = its seconds, mean over ranks),
/// then waits for the slowest (`y` = the slowest rank's seconds less its own, mean over ranks).
/// In a training step every collective waits so for the ranks' drift since the previous one:
/// the wait lands in whichever phase holds the next collective (measured on the 2-core VM:
/// `sample`, `gather` and `allreduce` ran 2-20× their predictions), where the other
/// operators, each timed after a barrier, never see it. On dedicated cores it is near 0.
fn drift_points<B: Backend>(be: &B, world: &World) -> Vec<[f64; 2]> {
    let a = be.upload(Array2::from_shape_fn((1024, 256), |(i, j)| ((i + j) % 7) as f32).view());
    let b = be.upload(Array2::from_shape_fn((256, 256), |(i, j)| ((i * j) % 5) as f32).view());
    let work = |products: usize| {
        for _ in 0..products {
            let c = be.matmul(be.view(&a), be.view(&b));
            let _ = be.download(be.rows(be.view(&c), 0..1));
        }
    };
    work(1);
    let ranks = world.size() as f64;
    [1usize, 4, 16]
        .iter()
        .map(|&products| {
            let (mut own, mut waited) = (0.0, 0.0);
            for _ in 0..DRIFT_REPS {
                world.barrier();
                let t = Instant::now();
                work(products);
                let s = t.elapsed().as_secs_f64();
                own += s;
                waited += world.allreduce_max_f64(s) - s;
            }
            let mut sums = [own, waited];
            world.allreduce_sum_f64(&mut sums);
            let n = DRIFT_REPS as f64 * ranks;
            [sums[0] / n, sums[1] / n]
        })
        .collect()
}

/// The optimizer's share of a step: zeroing the gradients and one Adam update, over flat
/// buffers of growing parameter counts (`x` = parameters). Every strategy pays it once per
/// step on every rank, and at a hidden width of 1024 it is a tenth of a CPU step (Facebook's
/// SAGE has 12M parameters: 28 bytes of moments, values and gradients read or written each).
fn optimizer_points<B: Backend>(be: &B, timer: KernelTimer) -> Vec<[f64; 2]> {
    let step = AdamStep {
        beta1: 0.9,
        beta2: 0.999,
        lr: 1e-3,
        weight_decay: 0.0,
        eps: 1e-8,
        decoupled: false,
        step_size: 1e-2,
        bc2_sqrt: 0.05,
    };
    [1usize << 16, 1 << 18, 1 << 20, 1 << 22]
        .iter()
        .map(|&n| {
            let start: Vec<f32> = (0..n).map(|i| (i % 13) as f32 * 0.01).collect();
            let mut values = be.buffer_from_host(&start);
            let mut grads = be.buffer_from_host(&start);
            let mut m = be.buffer_from_host(&start);
            let mut v = be.buffer_from_host(&start);
            let s = timer.point(|| {
                be.buffer_zero(&mut grads);
                be.adam_step(&mut values, &grads, &mut m, &mut v, step);
                // One value back: the host waits for the device's queue.
                let _ = be.download(be.buffer_view(&values, 0, 1, 1));
            });
            [n as f64, s]
        })
        .collect()
}

/// A hidden layer's activation, forward (ReLU in place, its signs kept) and backward (the
/// gradient scaled by them in place), over hidden rows of 256 columns: `x` = the bytes the
/// two passes read and write (16 per value). At a wide hidden layer these passes stream more
/// bytes than the layer's products touch.
fn elementwise_points<B: Backend>(be: &B, timer: KernelTimer) -> Vec<[f64; 2]> {
    let act = crate::backend::Activation::Relu;
    [1024usize, 4096, 16384, 65536]
        .iter()
        .map(|&rows| {
            let cols = 256usize;
            let values = || Array2::from_shape_fn((rows, cols), |(i, j)| (i as f32) - (j as f32));
            let mut h = be.upload(values().view());
            let mut g = be.upload(values().view());
            let s = timer.point(|| {
                let saved = be.activation_forward(act, be.view_mut(&mut h));
                be.activation_backward(act, &saved, be.view_mut(&mut g));
                let _ = be.download(be.rows(be.view(&g), 0..1));
            });
            [(16 * rows * cols) as f64, s]
        })
        .collect()
}

/// GAT's attention, forward and backward as a layer runs it (node logits of sources and
/// destinations, edge softmax, weighted aggregation, then `attention_backward`), on the
/// synthetic block with 4 heads: `x` = edges × all heads' columns.
fn attention_points<B: Backend>(be: &B, timer: KernelTimer) -> Vec<[f64; 2]> {
    let block = attention_block();
    let (dst, src, edges) = (block.num_dst, block.num_src(), block.num_edges());
    let heads = 4usize;
    let g = be.graph(block);
    let transpose = B::Transpose::default();
    [16usize, 64, 128, 256]
        .iter()
        .map(|&w| {
            let f = w / heads;
            let wh = be.upload(
                Array2::from_shape_fn((src, w), |(i, j)| ((i + j) % 5) as f32 * 0.1).view(),
            );
            let att = be.upload(
                Array2::from_shape_fn((heads, f), |(i, j)| ((i * j) % 3) as f32 * 0.1).view(),
            );
            let d_out = be.upload(
                Array2::from_shape_fn((dst, w), |(i, j)| ((i * j) % 7) as f32 * 0.1).view(),
            );
            let s = timer.point(|| {
                let el = be.node_logits(be.view(&wh), be.view(&att), src);
                let er = be.node_logits(be.view(&wh), be.view(&att), dst);
                let alpha = be.edge_softmax(&g, be.view(&el), be.view(&er), 0.2);
                let out = be.attention_aggregate(&g, be.view(&alpha), be.view(&wh));
                let grads = be.attention_backward(
                    &crate::backend::AttentionArgs {
                        graph: &g,
                        transpose: &transpose,
                        wh: be.view(&wh),
                        el: be.view(&el),
                        er: be.view(&er),
                        alpha: be.view(&alpha),
                        att_src: be.view(&att),
                        att_dst: be.view(&att),
                        slope: 0.2,
                    },
                    be.view(&d_out),
                );
                let _ = be.download(be.rows(be.view(&out), 0..1));
                let _ = be.download(be.rows(be.view(&grads.d_wh), 0..1));
            });
            [(edges * w) as f64, s]
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cost_per_row_is_the_median_extra_time_over_the_extra_rows() {
        // At 1 MiB: 4096 rows of 64 columns, 16384 of 16: 12288 more rows. Extra times of
        // 1.2288 ms, 2.4576 ms and (noise) less than the wide rows' give 100 ns, 200 ns and 0.
        let mib = 1048576.0;
        let wide = [[mib, 1e-3], [mib, 1e-3], [mib, 1e-3]];
        let narrow = [
            [mib, 1e-3 + 1.2288e-3],
            [mib, 1e-3 + 2.4576e-3],
            [mib, 0.9e-3],
        ];
        assert!((per_row(&wide, &narrow) - 1e-7).abs() < 1e-15);
        // One rank (no points): no cost per row.
        assert_eq!(per_row(&[], &[]), 0.0);
    }

    /// Each swept table's gather as a share of the way from the near gathers' time for the
    /// same rows to the far ones', between a 0 at the near table and a 1 at the far table,
    /// never falling; nothing where the far gather is no slower.
    #[test]
    fn far_shares_place_each_table_between_the_near_and_far_gathers() {
        let (rows, width) = SWEPT_GATHER;
        let bytes = (rows * width * 4) as f64;
        let fit = |seconds: f64| Fit {
            points: vec![[256.0, 1e-6], [rows as f64, seconds]],
            point_bytes: vec![256.0 * 512.0, bytes],
            ..Fit::free("row")
        };
        let mib = (1usize << 20) as f64;
        // The last table is the far one's size (4× a 64 MiB cache): left to the far point.
        let tables = [
            [32.0 * mib, 2e-3],
            [64.0 * mib, 1.5e-3],
            [128.0 * mib, 5e-3],
            [256.0 * mib, 2e-3],
        ];
        let cache = 64 << 20;
        let shares = far_shares(&fit(1e-3), &fit(3e-3), &tables, cache);
        assert_eq!(
            shares,
            vec![
                [16.0 * mib, 0.0],
                [32.0 * mib, 0.5],
                [64.0 * mib, 0.5],
                [128.0 * mib, 1.0],
                [256.0 * mib, 1.0],
            ]
        );
        assert!(far_shares(&fit(3e-3), &fit(3e-3), &tables, cache).is_empty());
        assert!(far_shares(&Fit::free("row"), &fit(3e-3), &tables, cache).is_empty());
    }
}
