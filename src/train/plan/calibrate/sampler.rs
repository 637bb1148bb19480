//! Points of the sampler a rank runs, over a synthetic graph cut into contiguous ranges.

use super::gathers::spread_ids;
use super::{time_point_evicted, Eviction, REPS};
use crate::comm::World;
use crate::exchange::sample_blocks_distributed;
use crate::exchange::sampling::distributed_window;
use crate::graph::{Csr, Dataset, NodeId, Splits};
use crate::sample::ahead::{window_size, SampleAhead};
use crate::sample::{sample_blocks, BatchKey, Block, LocalGraph};

/// Rows `[first, end)` of a synthetic graph of `n` vertices with `degree` pseudo-random
/// neighbours each (16 MiB of ids for the whole graph at the size used: more than a core's
/// caches, as a real graph's adjacency is), held as a partitioned dataset holds its part: a CSR
/// of those rows with global column ids, which the sampler reads through [`LocalGraph`], the
/// real graphs' code path. (A table of fixed-degree rows read without row offsets, as the
/// calibration once used, saves a read per vertex: 2-core EPYC VM, 1,024 seeds, fanouts 10 and
/// 5, after an eviction, 0.83-0.97 ms a batch against 1.07-1.29 over the same graph as a CSR
/// and 1.05-1.09 over the 200k SBM's.)
pub(super) fn synthetic_part(n: usize, degree: usize, first: usize, end: usize) -> Dataset {
    let indptr = (0..=end - first).map(|r| (r * degree) as u64).collect();
    let indices = (first * degree..end * degree)
        .map(|i| ((i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 40) as usize % n)
        .map(|u| u as NodeId)
        .collect();
    Dataset {
        name: "calibration".into(),
        num_nodes: n as u64,
        first_node: first as u64,
        graph: Csr { indptr, indices },
        features: None,
        labels: None,
        num_classes: 0,
        splits: Splits::default(),
        directed: true,
    }
}

/// The synthetic graph's neighbours per vertex.
const SYNTHETIC_DEGREE: usize = 16;

/// The neighbours per vertex of the second synthetic graph [`sample_points`] times: fewer than
/// either fanout, so that its batches read about three times as many vertices' rows per edge
/// (a half against 0.18 at [`SYNTHETIC_DEGREE`]).
const SPARSE_SYNTHETIC_DEGREE: usize = 2;

/// The synthetic graph of `degree` neighbours a vertex cut into contiguous ranges, one a rank
/// (`offsets`): this rank's part.
struct CutGraph {
    part: Dataset,
    offsets: Vec<u64>,
}

impl CutGraph {
    fn new(world: &World, degree: usize) -> CutGraph {
        let (n, ranks, rank) = (SYNTHETIC_VERTICES, world.size(), world.rank());
        let offsets: Vec<u64> = (0..=ranks).map(|r| (r * n / ranks) as u64).collect();
        let (first, end) = (offsets[rank] as usize, offsets[rank + 1] as usize);
        CutGraph {
            part: synthetic_part(n, degree, first, end),
            offsets,
        }
    }

    /// This rank's share: its range's adjacency.
    fn mine(&self) -> LocalGraph<'_> {
        LocalGraph::new(&self.part, None)
    }

    /// This rank's range of vertices.
    fn range(&self) -> (u64, u64) {
        let first = self.part.first_node;
        (first, first + self.part.local_nodes() as u64)
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
/// back to back). Where ranks share cores (no evictor) the calls run back to back as
/// before: 4 ranks on the 2 cores, all evicting, priced the build phase of GDP and DNP at
/// 2-3× what it measured, and the same calibration their model phase at 1.4-1.7×. The
/// strategies' id exchanges while sampling are also priced
/// by their bytes and calls (`cost::build`), which counts the bytes GDP's sampler moves here
/// a second time: 4-12 bytes an edge at the alltoallv's rate, a few ns against the tens an
/// edge costs.
///
/// Timed over two synthetic graphs, of [`SYNTHETIC_DEGREE`] and [`SPARSE_SYNTHETIC_DEGREE`]
/// neighbours a vertex, and the vertices each point's blocks hold as destinations kept
/// beside its edges (the points' bytes): a batch costs by the vertices whose neighbours it
/// reads (their row offsets and first ids come from memory) more than by the edges it draws.
/// One thread, evicted, 1,024 seeds: 4,087 vertices and 8,175 edges of the sparse graph in
/// 0.39 ms, 12,243 and 66,339 of the dense one in 1.15-1.22; the R-MAT graph's batches
/// (4,253 and 15,743, two fifths of its vertices without a neighbour) took 0.59-0.64 ms,
/// priced at 0.29 by their edges along the dense graph's points (2-core EPYC VM). The routed
/// sampler of 2 ranks follows its edges more: 8,177 edges of the sparse graph (4,088
/// vertices) took 0.33 ms, 8,317 of the dense one (1,535) 0.36.
pub(super) fn sample_points(world: &World, evict: Eviction) -> (Vec<[f64; 2]>, Vec<f64>) {
    let ranks = world.size();
    let (mut points, mut vertices) = (Vec::new(), Vec::new());
    for degree in [SYNTHETIC_DEGREE, SPARSE_SYNTHETIC_DEGREE] {
        let cut = CutGraph::new(world, degree);
        let (mine, offsets) = (cut.mine(), &cut.offsets);
        let (first, end) = cut.range();
        let (p, v) = timed_points(
            world,
            evict,
            |seeds| {
                spread_ids(seeds, (end - first) as usize, REPS + 1)
                    .into_iter()
                    .map(|b| b.into_iter().map(|v| v + first as NodeId).collect())
                    .collect()
            },
            |call, batches| {
                let key = BatchKey {
                    seed: 7,
                    epoch: 0,
                    batch: call as u64,
                };
                let blocks = if ranks > 1 {
                    sample_blocks_distributed(world, &mine, offsets, &batches[call], &[10, 5], key)
                } else {
                    sample_blocks(&mine, &batches[call], &[10, 5], key)
                };
                sampled(&blocks)
            },
        );
        points.extend(p);
        vertices.extend(v);
    }
    (points, vertices)
}

/// What a sampling call built: the edges of its blocks and their destination vertices (the
/// vertices whose neighbours it read).
fn sampled(blocks: &[Block]) -> [usize; 2] {
    [
        blocks.iter().map(Block::num_edges).sum(),
        blocks.iter().map(|b| b.num_dst).sum(),
    ]
}

/// The points of a sampler over growing seed sets: `batches_for(seeds)` the batches of the
/// timed calls, `call(k, batches)` the `k`-th call (its result: the edges it sampled and the
/// vertices whose neighbours it read), every call after evicting the host's caches where
/// `evict` holds an evictor. `x` = the edges of a call (the mean over the calls and the
/// ranks), the seconds the median call's, slowest rank; beside each point the mean of its
/// vertices.
fn timed_points(
    world: &World,
    evict: Eviction,
    batches_for: impl Fn(usize) -> Vec<Vec<NodeId>>,
    mut call: impl FnMut(usize, &[Vec<NodeId>]) -> [usize; 2],
) -> (Vec<[f64; 2]>, Vec<f64>) {
    [128usize, 512, 1024, 2048]
        .iter()
        .map(|&seeds| {
            let batches = batches_for(seeds);
            let (mut k, mut sums) = (0, [0usize; 2]);
            let s = time_point_evicted(world, REPS, evict, || {
                let [edges, vertices] = call(k, &batches);
                sums[0] += edges;
                sums[1] += vertices;
                k += 1;
            });
            let mut mean = sums.map(|x| x as f64 / k as f64);
            world.allreduce_sum_f64(&mut mean);
            let ranks = world.size() as f64;
            ([mean[0] / ranks, s], mean[1] / ranks)
        })
        .unzip()
}

/// The synthetic graph's vertices the sampler points are timed on.
const SYNTHETIC_VERTICES: usize = 1 << 18;

/// Batches a window samples at once with `--sample-ahead` at its default ([`window_size`] on
/// the synthetic graph): the fewest any rank's threads sample, as GDP's ranks agree on when
/// they sample windows together (`Trainer::sample_window`); what [`sample_ahead_points`] and
/// [`routed_ahead_points`] time, and 1 (nothing to time) below 4 threads. Collective.
pub(super) fn calibrated_window(world: &World) -> usize {
    let mine = window_size(
        None,
        rayon::current_num_threads(),
        SYNTHETIC_VERTICES as u64,
    );
    world.allreduce_min_usize(mine)
}

/// The local sampler run in windows ([`crate::sample::ahead`]: GDP on one rank, NFP):
/// every rank samples [`calibrated_window`] batches of its own seeds over the whole synthetic
/// graph side by side, each on a thread of its own, on the same two hops as
/// [`sample_points`]: `x` = the window's edges (the mean over the timed calls and the ranks),
/// the seconds those of the window. No points below 4 threads. From cold caches where every
/// rank has cores of its own, as [`sample_points`].
pub(super) fn sample_ahead_points(world: &World, evict: Eviction) -> Vec<[f64; 2]> {
    let n = SYNTHETIC_VERTICES;
    let graph = synthetic_part(n, SYNTHETIC_DEGREE, 0, n);
    let whole = LocalGraph::new(&graph, None);
    // Every rank its own seeds, as NFP's ranks sample theirs.
    let seeds = |v: NodeId| ((v as usize + world.rank() * 7919) % n) as NodeId;
    window_points(
        world,
        evict,
        n,
        seeds,
        |ahead, b, window, seeds_of, key_of| {
            ahead.take(b, window, &whole, &[10, 5], seeds_of, key_of)
        },
    )
}

/// The owner-routed sampler run in windows sampled together (GDP on several ranks,
/// [`crate::exchange::sampling::distributed_window`]): every rank samples
/// [`calibrated_window`] batches of seeds of its own over the synthetic graph cut into
/// contiguous ranges, as [`sample_points`] does one batch, each hop of the window routed to
/// the owners in one exchange. `x` and the seconds as [`sample_ahead_points`]; no points on
/// one rank or below 4 threads.
pub(super) fn routed_ahead_points(world: &World, evict: Eviction) -> Vec<[f64; 2]> {
    let ranks = world.size();
    if ranks < 2 {
        return Vec::new();
    }
    let cut = CutGraph::new(world, SYNTHETIC_DEGREE);
    let (mine, offsets) = (cut.mine(), &cut.offsets);
    let (first, end) = cut.range();
    let share = (end - first) as usize;
    let seeds = |v: NodeId| (v as usize % share) as NodeId + first as NodeId;
    window_points(
        world,
        evict,
        share,
        seeds,
        |ahead, b, window, seeds_of, key_of| {
            ahead.take_window(b, window, |batches| {
                distributed_window(world, &mine, offsets, &[10, 5], batches, seeds_of, key_of)
            })
        },
    )
}

/// The points of a windowed sampler ([`timed_points`]): each call samples one window of
/// [`calibrated_window`] batches of ids spread over `0..n` and moved by `seed`, every batch
/// taken from `take(ahead, b, window, seeds_of, key_of)`. No points below a window of 2.
fn window_points<F>(
    world: &World,
    evict: Eviction,
    n: usize,
    seed: impl Fn(NodeId) -> NodeId,
    mut take: F,
) -> Vec<[f64; 2]>
where
    F: FnMut(
        &mut SampleAhead,
        usize,
        usize,
        &(dyn Fn(usize) -> Vec<NodeId> + Sync),
        &(dyn Fn(usize) -> BatchKey + Sync),
    ) -> anyhow::Result<(Vec<Block>, f64)>,
{
    let window = calibrated_window(world);
    if window < 2 {
        return Vec::new();
    }
    let mut ahead = SampleAhead::new(window);
    let (points, _) = timed_points(
        world,
        evict,
        |seeds| {
            spread_ids(seeds, n, (REPS + 1) * window)
                .into_iter()
                .map(|b| b.into_iter().map(&seed).collect())
                .collect()
        },
        |call, batches| {
            let first = call * window;
            ahead.clear();
            let seeds_of = |i: usize| batches[first + i].clone();
            let key_of = |i: usize| BatchKey {
                seed: 7,
                epoch: 1,
                batch: (first + i) as u64,
            };
            (0..window)
                .map(|b| {
                    let (blocks, _) = take(&mut ahead, b, window, &seeds_of, &key_of)
                        .expect("the sampling threads start and answer");
                    sampled(&blocks)
                })
                .fold([0, 0], |a, b| [a[0] + b[0], a[1] + b[1]])
        },
    );
    points
}
