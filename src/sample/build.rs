//! Turning sampled neighbours into blocks, and whole mini-batches of blocks.

use super::neighbor::{sample_neighbors, Adjacency, LayerKey, Sampled};
use super::Block;
use crate::graph::{Dataset, NodeId};
use rayon::prelude::*;
use std::cell::RefCell;
use std::convert::Infallible;
use std::sync::atomic::{AtomicU32, Ordering::Relaxed};

/// What identifies one global mini-batch: the run's seed, the epoch and the batch number.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BatchKey {
    pub seed: u64,
    pub epoch: u64,
    pub batch: u64,
}

impl BatchKey {
    /// The key of hop `layer` (0 = the seeds' hop) of this mini-batch.
    pub fn layer(self, layer: u32) -> LayerKey {
        LayerKey {
            seed: self.seed,
            epoch: self.epoch,
            batch: self.batch,
            layer,
        }
    }
}

/// Global vertex id → source-local index within one block, as a table indexed by id: one
/// array access per sampled edge, where a hash map spent most of a mini-batch's sampling time.
/// The table grows to the largest id seen (4 bytes per vertex of the graph at most) and is
/// reused across layers and batches (each sampling thread keeps one, see [`build_block`]); a
/// block resets only the entries it set, so clearing costs the block's size, not the graph's.
///
/// Entries are atomics so that large blocks can be built by all threads at once
/// ([`LocalIds`]'s parallel path); the serial path reads and writes them through `get_mut`,
/// as plain integers.
#[derive(Debug, Default)]
pub struct LocalIds {
    slot: Vec<AtomicU32>,
}

/// Blocks with fewer sampled edges than this are built serially: the parallel build makes three
/// passes over the edges where the serial one makes one, so it only pays on many threads and
/// enough edges to spread (measured: see `docs/architecture.md`, "Host pipeline").
pub(crate) const PAR_MIN_EDGES: usize = 1 << 15;

/// Fewer threads than this build serially, whatever the block's size: the parallel build's
/// three passes and atomic minima take 4.7× the branch-free serial pass's time on one thread
/// (`host_phases_of_a_gdp_step` in `tests/sampler.rs`), so it needs more than four threads to
/// win, and eight to win clearly.
pub(crate) const PAR_MIN_THREADS: usize = 8;

/// Edges per task of the parallel build; fixed, so the work split is the same everywhere.
const EDGE_CHUNK: usize = 4096;

impl LocalIds {
    /// Marks an id with no local index.
    const ABSENT: u32 = u32::MAX;

    /// Make room for ids up to `max_id`.
    fn cover(&mut self, max_id: usize) {
        if max_id >= self.slot.len() {
            let len = (max_id + 1).max(2 * self.slot.len());
            self.slot.resize_with(len, || AtomicU32::new(Self::ABSENT));
        }
    }

    /// Forget the indices of `ids` (the sources of the block just built).
    fn reset(&mut self, ids: &[NodeId]) {
        for &v in ids {
            *self.slot[v as usize].get_mut() = Self::ABSENT;
        }
    }

    /// Sources and edge indices of the block from `dst` with sampled sources `nbrs`, in one
    /// serial pass (see [`build_block`] for the order).
    ///
    /// The edge loop has no branch on "is this vertex new": about a third of a large block's
    /// edges are first appearances, in no pattern a predictor could learn, and the mispredicts
    /// were most of the loop. Every edge writes its vertex after the sources found so far and
    /// counts it only when new; a chosen index is a conditional move.
    fn build_serial(&mut self, dst: &[NodeId], nbrs: &[NodeId]) -> (Vec<NodeId>, Vec<u32>) {
        let nd = dst.len();
        assert!(
            nd + nbrs.len() < Self::ABSENT as usize,
            "a block has fewer than 2^32 - 1 sources"
        );
        let Some(&max_id) = dst.iter().chain(nbrs).max() else {
            return (Vec::new(), Vec::new());
        };
        self.cover(max_id as usize);
        let mut src_nodes = vec![0 as NodeId; nd + nbrs.len()];
        src_nodes[..nd].copy_from_slice(dst);
        for (i, &v) in dst.iter().enumerate() {
            let s = self.slot[v as usize].get_mut();
            if *s == Self::ABSENT {
                *s = i as u32;
            }
        }
        let mut indices = vec![0u32; nbrs.len()];
        let mut len = nd;
        for (o, &u) in indices.iter_mut().zip(nbrs) {
            let s = self.slot[u as usize].get_mut();
            let new = *s == Self::ABSENT;
            let idx = if new { len as u32 } else { *s };
            *s = idx;
            *o = idx;
            src_nodes[len] = u;
            len += new as usize;
        }
        src_nodes.truncate(len);
        self.reset(&src_nodes);
        src_nodes.shrink_to_fit();
        (src_nodes, indices)
    }

    /// [`LocalIds::build_serial`]'s result, computed by all threads: bitwise the same, since
    /// every source's index is still its rank in order of first appearance.
    ///
    /// Destination `i` has key `i` and edge `j` key `nd + j`. (1) Each vertex's entry becomes
    /// the lowest key it appears under (an atomic minimum: the outcome does not depend on
    /// timing). (2) Edge `j` is its vertex's first appearance iff the entry equals its key; a
    /// bit per edge records it, and a prefix count of those bits (by 64-edge word) gives every
    /// first appearance its rank. (3) Each edge reads its vertex's lowest key `k` and turns
    /// it into the local index: `k` itself for a destination, else `nd` plus the rank of the
    /// first appearance `k`; first appearances also write their vertex into `src_nodes`.
    /// Three passes over the edges where the serial build makes one.
    fn build_parallel(&mut self, dst: &[NodeId], nbrs: &[NodeId]) -> (Vec<NodeId>, Vec<u32>) {
        let nd = dst.len();
        let Some(max_id) = dst.par_iter().chain(nbrs.par_iter()).copied().max() else {
            return (Vec::new(), Vec::new());
        };
        self.cover(max_id as usize);
        let slot = &self.slot[..];
        let entry = |v: NodeId| &slot[v as usize];

        // (1) The lowest key of every vertex.
        let lower = |v: NodeId, key: usize| {
            let (e, key) = (entry(v), key as u32);
            if key < e.load(Relaxed) {
                e.fetch_min(key, Relaxed);
            }
        };
        rayon::join(
            || {
                dst.par_iter()
                    .enumerate()
                    .with_min_len(EDGE_CHUNK)
                    .for_each(|(i, &v)| lower(v, i))
            },
            || {
                nbrs.par_chunks(EDGE_CHUNK)
                    .enumerate()
                    .for_each(|(c, chunk)| {
                        let base = nd + c * EDGE_CHUNK;
                        for (k, &u) in chunk.iter().enumerate() {
                            lower(u, base + k)
                        }
                    })
            },
        );

        // (2) A bit per edge: is it its vertex's first appearance? Then the number of first
        // appearances before every 64-edge word.
        const WORDS: usize = EDGE_CHUNK / 64;
        let mut first = vec![0u64; nbrs.len().div_ceil(64)];
        first
            .par_chunks_mut(WORDS)
            .zip(nbrs.par_chunks(EDGE_CHUNK))
            .enumerate()
            .for_each(|(c, (bits, chunk))| {
                let base = nd + c * EDGE_CHUNK;
                for (k, &u) in chunk.iter().enumerate() {
                    if entry(u).load(Relaxed) == (base + k) as u32 {
                        bits[k / 64] |= 1 << (k % 64);
                    }
                }
            });
        let mut before = Vec::with_capacity(first.len() + 1);
        let mut total = 0usize;
        for w in &first {
            before.push(total);
            total += w.count_ones() as usize;
        }
        before.push(total);
        // The local index of the vertex whose lowest key is `k`.
        let index_of = |k: u32| -> u32 {
            let k = k as usize;
            if k < nd {
                return k as u32;
            }
            let (w, b) = ((k - nd) / 64, (k - nd) % 64);
            (nd + before[w] + (first[w] & ((1u64 << b) - 1)).count_ones() as usize) as u32
        };

        // (3) Every edge's source index; first appearances place their vertex. The new
        // sources of a chunk of edges are one contiguous run of `src_nodes`.
        let mut src_nodes = vec![0 as NodeId; nd + total];
        let (head, mut rest) = src_nodes.split_at_mut(nd);
        head.copy_from_slice(dst);
        let mut runs = Vec::with_capacity(first.len().div_ceil(WORDS));
        for c in 0..first.len().div_ceil(WORDS) {
            let n = before[((c + 1) * WORDS).min(first.len())] - before[c * WORDS];
            let (run, tail) = rest.split_at_mut(n);
            runs.push(run);
            rest = tail;
        }
        let mut indices = vec![0u32; nbrs.len()];
        indices
            .par_chunks_mut(EDGE_CHUNK)
            .zip(nbrs.par_chunks(EDGE_CHUNK))
            .zip(runs)
            .enumerate()
            .for_each(|(c, ((out, chunk), run))| {
                let base = nd + c * EDGE_CHUNK;
                let run_start = nd + before[c * WORDS];
                for (k, (o, &u)) in out.iter_mut().zip(chunk).enumerate() {
                    let lowest = entry(u).load(Relaxed);
                    *o = index_of(lowest);
                    if lowest as usize == base + k {
                        run[*o as usize - run_start] = u;
                    }
                }
            });

        src_nodes
            .par_iter()
            .with_min_len(EDGE_CHUNK)
            .for_each(|&v| entry(v).store(Self::ABSENT, Relaxed));
        (src_nodes, indices)
    }

    /// Sources and edge indices of a block, by the parallel build where it pays (`parallel`:
    /// `None` decides by size and thread count, tests force either path).
    fn build(
        &mut self,
        dst: &[NodeId],
        nbrs: &[NodeId],
        parallel: Option<bool>,
    ) -> (Vec<NodeId>, Vec<u32>) {
        // Keys of the parallel build must stay below `ABSENT`.
        let fits = dst.len() + nbrs.len() < Self::ABSENT as usize;
        let parallel = parallel.unwrap_or_else(|| {
            nbrs.len() >= PAR_MIN_EDGES && rayon::current_num_threads() >= PAR_MIN_THREADS
        });
        if parallel && fits {
            self.build_parallel(dst, nbrs)
        } else {
            self.build_serial(dst, nbrs)
        }
    }
}

thread_local! {
    /// The id table of the blocks this thread builds: allocated once per thread (it grows to
    /// the graph's size), instead of once per block.
    static TABLE: RefCell<LocalIds> = RefCell::default();
}

/// Run `f` with this thread's id table. The table is taken out of its cell for the call, so a
/// nested call (none is expected) would get a fresh one instead of a borrow error.
fn with_thread_table<R>(f: impl FnOnce(&mut LocalIds) -> R) -> R {
    let mut ids = TABLE.with(|t| t.take());
    let out = f(&mut ids);
    TABLE.with(|t| t.replace(ids));
    out
}

/// The block whose destinations are `dst` and whose edges are `sampled` (row `i` of
/// `sampled` holds the sources of `dst[i]`).
///
/// Sources are `dst` first (so destination `i` is source `i`), then every other sampled
/// vertex in order of first appearance in `sampled.neighbors`. `dst` should be distinct; a
/// repeated destination keeps its own source row, and edges to it refer to its first copy.
/// Large blocks are built by all threads, with the same result.
///
/// # Panics
/// When `sampled` does not have one row per destination.
pub fn build_block(dst: &[NodeId], sampled: &Sampled) -> Block {
    with_thread_table(|ids| build_block_with(dst, sampled, ids))
}

/// [`build_block`] reusing `ids`' memory.
pub fn build_block_with(dst: &[NodeId], sampled: &Sampled, ids: &mut LocalIds) -> Block {
    build_parts(dst, sampled.offsets.clone(), &sampled.neighbors, ids, None)
}

/// [`build_block`] by the serial (`false`) or the parallel (`true`) build, whatever the
/// block's size and the thread count: for tests that compare the two.
pub fn build_block_forced(dst: &[NodeId], sampled: &Sampled, parallel: bool) -> Block {
    let offsets = sampled.offsets.clone();
    with_thread_table(|ids| build_parts(dst, offsets, &sampled.neighbors, ids, Some(parallel)))
}

/// The block of destinations `dst` whose sampled sources are `nbrs`, row `i` at
/// `offsets[i]..offsets[i + 1]` (kept as the block's `indptr`).
fn build_parts(
    dst: &[NodeId],
    offsets: Vec<usize>,
    nbrs: &[NodeId],
    ids: &mut LocalIds,
    parallel: Option<bool>,
) -> Block {
    assert_eq!(
        offsets.len(),
        dst.len() + 1,
        "build_block: sampled rows do not match the destinations"
    );
    let (src_nodes, indices) = ids.build(dst, nbrs, parallel);
    Block {
        num_dst: dst.len(),
        src_nodes,
        indptr: offsets,
        indices,
    }
}

/// Sample the blocks of one mini-batch from `seeds` with `fanouts` counted from the seeds
/// outward (ARCHITECTURE invariant 5): `fanouts[0]` samples the seeds' neighbours and makes
/// the last block. Returns the blocks input layer first (`blocks[0]` reads input features,
/// `blocks[L-1]` has the seeds as destinations). Every frontier vertex must be owned by
/// `adj`; for a partitioned graph use [`sample_blocks_with`] and route vertices to owners.
pub fn sample_blocks(
    adj: &impl Adjacency,
    seeds: &[NodeId],
    fanouts: &[i32],
    key: BatchKey,
) -> Vec<Block> {
    let result: Result<Vec<Block>, Infallible> =
        sample_blocks_with(seeds, fanouts, key, |frontier, fanout, lkey| {
            Ok(sample_neighbors(adj, frontier, fanout, lkey))
        });
    match result {
        Ok(blocks) => blocks,
        Err(never) => match never {},
    }
}

/// [`sample_blocks`] with the per-hop sampling supplied by the caller:
/// `sample(frontier, fanout, layer_key)` must return one row per frontier vertex, as
/// [`sample_neighbors`] would on the frontier's owners. A distributed sampler sends each
/// owner its share of the frontier, and reassembles the answers with
/// [`Sampled::merge_by_position`]; the blocks are then identical to a single rank's.
pub fn sample_blocks_with<E>(
    seeds: &[NodeId],
    fanouts: &[i32],
    key: BatchKey,
    mut sample: impl FnMut(&[NodeId], i32, LayerKey) -> Result<Sampled, E>,
) -> Result<Vec<Block>, E> {
    let mut blocks: Vec<Block> = Vec::with_capacity(fanouts.len());
    for (hop, &fanout) in fanouts.iter().enumerate() {
        let frontier: &[NodeId] = blocks.last().map_or(seeds, |b| &b.src_nodes);
        let Sampled { offsets, neighbors } = sample(frontier, fanout, key.layer(hop as u32))?;
        let block = with_thread_table(|ids| build_parts(frontier, offsets, &neighbors, ids, None));
        blocks.push(block);
    }
    blocks.reverse();
    Ok(blocks)
}

/// The block of full-graph training: every held vertex is a destination with all its
/// neighbours as sources.
///
/// A Block is CSR by destination: destination `v` aggregates over its list. Like the sampler,
/// this takes the stored list of `v` as the vertices whose messages `v` receives, so no
/// transpose is needed and `sample_blocks` with fanout `-1` gives the same edges.
///
/// For a whole dataset the sources are `0..n` (source index = global id). For one part, the
/// owned vertices come first (as destinations), then every other vertex in increasing id.
pub fn full_block(ds: &Dataset) -> Block {
    let n = ds.num_nodes as usize;
    let first = ds.first_node as usize;
    let held = ds.local_nodes();
    let end = first + held;
    // Owned [first, end) → 0..held; [0, first) → held..end; [end, n) keeps its id.
    let local = |v: NodeId| -> u32 {
        let v = v as usize;
        (if v < first {
            held + v
        } else if v < end {
            v - first
        } else {
            v
        }) as u32
    };
    let src_nodes: Vec<NodeId> = (first..end)
        .chain(0..first)
        .chain(end..n)
        .map(|v| v as NodeId)
        .collect();
    let indices = if first == 0 {
        // Whole graph or the first part: source index = global id.
        ds.graph.indices.clone()
    } else {
        ds.graph.indices.iter().map(|&v| local(v)).collect()
    };
    Block {
        num_dst: held,
        src_nodes,
        indptr: ds.graph.indptr.iter().map(|&o| o as usize).collect(),
        indices,
    }
}
