//! Turning sampled neighbours into blocks, and whole mini-batches of blocks.

use super::hop::sample_hop;
use super::neighbor::{Adjacency, LayerKey, Sampled};
use super::Block;
use crate::graph::{Dataset, NodeId};
use crate::util::prefetch::prefetch;
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
    lines: Vec<TableLine>,
}

/// The 16 entries of [`LocalIds`] that share one 64-byte cache line, aligned to it, so that
/// the parallel build can give whole lines to one owner ([`owner_of`]).
#[derive(Debug)]
#[repr(align(64))]
struct TableLine([AtomicU32; 16]);

/// Blocks with fewer sampled edges than this are built serially: the parallel build makes four
/// passes over the keys where the serial one makes one, so it only pays on many threads and
/// enough edges to spread (measured: see `docs/architecture.md`, "Host pipeline").
pub(crate) const PAR_MIN_EDGES: usize = 1 << 15;

/// Fewer threads than this build serially, whatever the block's size: the parallel build's
/// four passes take 4.4-7× the branch-free serial pass's time on one thread and 1.5-1.7× less
/// on two (`host_phases_of_a_gdp_step` in `tests/sampler.rs`), so it cannot win below five
/// threads and breaks even near eight; 16 threads are where it is meant to pay, and it has
/// not been timed there.
pub(crate) const PAR_MIN_THREADS: usize = 8;

/// Keys (destinations, then edges) per task of the parallel build. At most `u16::MAX`: a
/// chunk's owner bounds are `u16`.
const EDGE_CHUNK: usize = 4096;

/// How many edges ahead a build prefetches the id-table entry it will visit, when the table is
/// larger than [`FAR_TABLE_BYTES`]. On a 3M-vertex graph (a 12 MB table, beyond the 2 MB L2
/// of the VM's cores) 16 ahead made the serial build 7-10 % faster (3.8-3.9 → 3.5-3.7 ms a
/// batch, three A/B rounds); on a 200k-vertex graph (800 KB, in the L2) they cost 2-7 %, so a
/// table within the L2 goes without (equal to the loop before them within the noise).
const ENTRY_AHEAD: usize = 16;

/// Tables above this size are prefetched ahead ([`ENTRY_AHEAD`]): 1 MiB, about a core's L2.
const FAR_TABLE_BYTES: usize = 1 << 20;

/// The most owners the parallel build splits the id table among.
const MAX_OWNERS: usize = 256;

/// Which of `owners` owners handles vertex `v` in the parallel build: the 16 entries of one
/// line of the id table ([`TableLine`]) have the same owner, so two owners never write one
/// line, and lines are spread over owners by a multiplicative hash, so a run of popular ids
/// does not land on one owner.
fn owner_of(v: NodeId, owners: usize) -> usize {
    let line = (v >> 4).wrapping_mul(0x9E37_79B9);
    ((line as u64 * owners as u64) >> 32) as usize
}

impl LocalIds {
    /// Marks an id with no local index.
    const ABSENT: u32 = u32::MAX;

    /// Make room for ids up to `max_id`.
    fn cover(&mut self, max_id: usize) {
        let lines = max_id / 16 + 1;
        if lines > self.lines.len() {
            let len = lines.max(2 * self.lines.len());
            self.lines.resize_with(len, || {
                TableLine(std::array::from_fn(|_| AtomicU32::new(Self::ABSENT)))
            });
        }
    }

    /// Whether the table is larger than a core's L2 cache is likely to be
    /// ([`FAR_TABLE_BYTES`]): then the builds prefetch the entries ahead.
    fn far(&self) -> bool {
        self.lines.len() * std::mem::size_of::<TableLine>() > FAR_TABLE_BYTES
    }

    /// The entry of id `v`, shared (the parallel build).
    fn entry(&self, v: NodeId) -> &AtomicU32 {
        &self.lines[v as usize / 16].0[v as usize % 16]
    }

    /// The entry of id `v`, owned (the serial build).
    fn entry_mut(&mut self, v: NodeId) -> &mut u32 {
        self.lines[v as usize / 16].0[v as usize % 16].get_mut()
    }

    /// Forget the indices of `ids` (the sources of the block just built).
    fn reset(&mut self, ids: &[NodeId]) {
        for &v in ids {
            *self.entry_mut(v) = Self::ABSENT;
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
        let mut numbering = Numbering::start(self, dst, nbrs.len());
        numbering.add_edges(nbrs);
        numbering.finish()
    }

    /// The serial build's edge loop: every edge's index into `indices`, new sources appended
    /// to `src_nodes` after the `len` found so far; returns the sources' count. `FAR`:
    /// prefetch the entries [`ENTRY_AHEAD`] edges ahead (a separate instantiation: a run-time
    /// test in the loop cost the in-L2 case as much as the prefetches).
    fn number_edges<const FAR: bool>(
        &mut self,
        nbrs: &[NodeId],
        indices: &mut [u32],
        src_nodes: &mut [NodeId],
        mut len: usize,
    ) -> usize {
        let lines = self.lines.as_ptr();
        for (j, (o, &u)) in indices.iter_mut().zip(nbrs).enumerate() {
            if FAR {
                if let Some(&ahead) = nbrs.get(j + ENTRY_AHEAD) {
                    prefetch(lines.wrapping_add(ahead as usize / 16));
                }
            }
            let s = self.entry_mut(u);
            let new = *s == Self::ABSENT;
            let idx = if new { len as u32 } else { *s };
            *s = idx;
            *o = idx;
            src_nodes[len] = u;
            len += new as usize;
        }
        len
    }

    /// [`LocalIds::build_serial`]'s result, computed by all threads: bitwise the same, since
    /// every source's index is still its rank in order of first appearance.
    ///
    /// Destination `i` has key `i` and edge `j` key `nd + j`; a vertex's first appearance is
    /// its lowest key. The id table is split among owners by cache line ([`owner_of`]) and
    /// only a vertex's owner touches its entry until the reset, so no line is written by two
    /// threads and no entry needs an atomic read-modify-write. (An atomic minimum per edge on a
    /// shared table, the previous design, was no faster on two threads than on one: the
    /// table's lines moved between the cores at every write.)
    ///
    /// (1) Each 4,096-key chunk's (vertex, key) pairs are sorted by owner, in key order within
    /// an owner (a counting sort). (2) Each owner walks its share of every chunk in key order:
    /// a vertex's first visit stores that key in its entry as its lowest, and every visit
    /// replaces the pair's vertex with the lowest key. (3) A bit per key marks the edges that
    /// are first appearances (lowest == own key), and a prefix count of the bits (by 64-key
    /// word) ranks them. (4) Each first appearance writes its vertex at `nd` + its rank in
    /// `src_nodes` (and clears its entry), and every edge turns its lowest key into its index:
    /// the key itself for a destination, else `nd` + the rank of that first appearance. Four
    /// passes over the keys where the serial build makes one, so it pays on several threads
    /// only (see [`PAR_MIN_THREADS`]).
    fn build_parallel(&mut self, dst: &[NodeId], nbrs: &[NodeId]) -> (Vec<NodeId>, Vec<u32>) {
        let (nd, n) = (dst.len(), dst.len() + nbrs.len());
        let owners = (2 * rayon::current_num_threads()).clamp(1, MAX_OWNERS);
        let chunks = n.div_ceil(EDGE_CHUNK);
        // The vertices of keys `start..end`: the destinations' part, then the edges'.
        let keys = |start: usize, end: usize| {
            let (a, b) = (start.min(nd), end.min(nd));
            (&dst[a..b], &nbrs[start.max(nd) - nd..end.max(nd) - nd])
        };
        let vertex = |key: usize| if key < nd { dst[key] } else { nbrs[key - nd] };

        // (1) Every chunk's pairs by owner: owner `o`'s share of chunk `c` is
        // `pairs[c * EDGE_CHUNK ..][bounds[c][o]..bounds[c][o + 1]]`. Also each chunk's
        // largest id, to size the table.
        let mut pairs = vec![(0 as NodeId, 0u32); n];
        let mut bounds = vec![0u16; chunks * (owners + 1)];
        let max_id = pairs
            .par_chunks_mut(EDGE_CHUNK)
            .zip(bounds.par_chunks_mut(owners + 1))
            .enumerate()
            .map(|(c, (out, bound))| {
                let start = c * EDGE_CHUNK;
                let (a, b) = keys(start, start + out.len());
                // The chunk's vertices as one slice, read by the three loops below.
                let mut vs = [0 as NodeId; EDGE_CHUNK];
                vs[..a.len()].copy_from_slice(a);
                vs[a.len()..out.len()].copy_from_slice(b);
                let vs = &vs[..out.len()];
                let mut of = [0u16; EDGE_CHUNK];
                for (o, &v) in of.iter_mut().zip(vs) {
                    *o = owner_of(v, owners) as u16;
                }
                let max_id = vs.iter().copied().max().unwrap_or(0);
                for &o in &of[..vs.len()] {
                    bound[o as usize + 1] += 1;
                }
                for o in 0..owners {
                    bound[o + 1] += bound[o];
                }
                let mut at = [0u16; MAX_OWNERS];
                at[..owners].copy_from_slice(&bound[..owners]);
                for (k, (&o, &v)) in of.iter().zip(vs).enumerate() {
                    let p = &mut at[o as usize];
                    out[*p as usize] = (v, (start + k) as u32);
                    *p += 1;
                }
                max_id
            })
            .max();
        let Some(max_id) = max_id else {
            return (Vec::new(), Vec::new());
        };
        self.cover(max_id as usize);
        let (table, far) = (&*self, self.far());

        // (2) Each owner alone on its entries: every pair's vertex becomes its lowest key.
        let mut shares: Vec<Vec<&mut [(NodeId, u32)]>> = (0..owners).map(|_| Vec::new()).collect();
        for (chunk, bound) in pairs.chunks_mut(EDGE_CHUNK).zip(bounds.chunks(owners + 1)) {
            let mut rest = chunk;
            for (o, share) in shares.iter_mut().enumerate() {
                let (mine, tail) = rest.split_at_mut((bound[o + 1] - bound[o]) as usize);
                share.push(mine);
                rest = tail;
            }
        }
        shares.into_par_iter().for_each(|share| {
            for mine in share {
                for j in 0..mine.len() {
                    if let (true, Some(&(ahead, _))) = (far, mine.get(j + ENTRY_AHEAD)) {
                        prefetch(table.entry(ahead));
                    }
                    let (v, key) = &mut mine[j];
                    let entry = table.entry(*v);
                    let seen = entry.load(Relaxed);
                    let lowest = if seen == Self::ABSENT { *key } else { seen };
                    entry.store(lowest, Relaxed);
                    *v = lowest;
                }
            }
        });

        // (3) A bit per key for the first appearances of edges, and the count before each
        // 64-key word. A chunk is 64 words, so each chunk sets its own words.
        const WORDS: usize = EDGE_CHUNK / 64;
        let mut first = vec![0u64; n.div_ceil(64)];
        let nd_key = nd as u32;
        first
            .par_chunks_mut(WORDS)
            .zip(pairs.par_chunks(EDGE_CHUNK))
            .enumerate()
            .for_each(|(c, (bits, chunk))| {
                let start = (c * EDGE_CHUNK) as u32;
                for &(lowest, key) in chunk {
                    let own = (lowest == key) & (key >= nd_key);
                    let k = (key - start) as usize;
                    bits[k / 64] |= (own as u64) << (k % 64);
                }
            });
        let mut before = Vec::with_capacity(first.len() + 1);
        let mut total = 0u32;
        for w in &first {
            before.push(total);
            total += w.count_ones();
        }
        before.push(total);
        // The index of the vertex whose lowest key is `k`.
        let index_of = |k: u32| -> u32 {
            let (w, b) = ((k / 64) as usize, k % 64);
            let rank = before[w] + (first[w] & ((1u64 << b) - 1)).count_ones();
            if k < nd_key {
                k
            } else {
                nd_key + rank
            }
        };

        // (4) First appearances place their vertex; every edge gets its index. Chunk `c`'s
        // new sources are one run of `src_nodes`, its edges one run of `indices`.
        let mut src_nodes = vec![0 as NodeId; nd + total as usize];
        let (head, mut rest) = src_nodes.split_at_mut(nd);
        let mut indices = vec![0u32; n - nd];
        let mut edges = &mut indices[..];
        let mut runs = Vec::with_capacity(chunks);
        for c in 0..chunks {
            let (start, end) = (c * EDGE_CHUNK, ((c + 1) * EDGE_CHUNK).min(n));
            let news = (before[(end.div_ceil(64)).min(first.len())] - before[start / 64]) as usize;
            let (run, tail) = rest.split_at_mut(news);
            rest = tail;
            let (out, tail) = edges.split_at_mut(end.max(nd) - start.max(nd));
            edges = tail;
            runs.push((run, out));
        }
        head.par_chunks_mut(EDGE_CHUNK)
            .zip(dst.par_chunks(EDGE_CHUNK))
            .for_each(|(out, part)| {
                out.copy_from_slice(part);
                part.iter()
                    .for_each(|&v| table.entry(v).store(Self::ABSENT, Relaxed));
            });
        runs.into_par_iter()
            .zip(pairs.par_chunks(EDGE_CHUNK))
            .enumerate()
            .for_each(|(c, ((run, out), chunk))| {
                let start = c * EDGE_CHUNK;
                let mut placed = 0;
                for (w, &bits) in first[start / 64..][..chunk.len().div_ceil(64)]
                    .iter()
                    .enumerate()
                {
                    let mut bits = bits;
                    while bits != 0 {
                        let v = vertex(start + w * 64 + bits.trailing_zeros() as usize);
                        run[placed] = v;
                        table.entry(v).store(Self::ABSENT, Relaxed);
                        placed += 1;
                        bits &= bits - 1;
                    }
                }
                let edge0 = start.max(nd);
                for &(lowest, key) in chunk {
                    if key as usize >= nd {
                        out[key as usize - edge0] = index_of(lowest);
                    }
                }
            });
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

/// The serial build taken edge run by edge run: [`LocalIds::build_serial`] is one run, and a
/// pipelined hop ([`super::hop`]) adds each part of the frontier's rows as soon as it is drawn,
/// in order, so the sources and indices are those of one run over all of them.
pub(super) struct Numbering<'a> {
    ids: &'a mut LocalIds,
    /// The sources so far (`len` of them); entries past `len` are scratch.
    src_nodes: Vec<NodeId>,
    len: usize,
    indices: Vec<u32>,
}

impl<'a> Numbering<'a> {
    /// Destinations first: destination `i` is source `i`, and a repeated destination's edges
    /// refer to its first copy. `edges`: how many edges will be added, where known (room is
    /// made for them once instead of growing run by run).
    pub(super) fn start(ids: &'a mut LocalIds, dst: &[NodeId], edges: usize) -> Self {
        if let Some(&max_id) = dst.iter().max() {
            ids.cover(max_id as usize);
        }
        for (i, &v) in dst.iter().enumerate() {
            let s = ids.entry_mut(v);
            if *s == LocalIds::ABSENT {
                *s = i as u32;
            }
        }
        let mut src_nodes = Vec::with_capacity(dst.len() + edges);
        src_nodes.extend_from_slice(dst);
        Numbering {
            ids,
            src_nodes,
            len: dst.len(),
            indices: Vec::with_capacity(edges),
        }
    }

    /// Number the next run of edges (their sources, in order).
    pub(super) fn add_edges(&mut self, nbrs: &[NodeId]) {
        assert!(
            self.len + self.indices.len() + nbrs.len() < LocalIds::ABSENT as usize,
            "a block has fewer than 2^32 - 1 sources"
        );
        let Some(&max_id) = nbrs.iter().max() else {
            return;
        };
        self.ids.cover(max_id as usize);
        let first = self.indices.len();
        self.indices.resize(first + nbrs.len(), 0);
        self.src_nodes.resize(self.len + nbrs.len(), 0);
        let (indices, src_nodes) = (&mut self.indices[first..], &mut self.src_nodes[..]);
        self.len = if self.ids.far() {
            self.ids
                .number_edges::<true>(nbrs, indices, src_nodes, self.len)
        } else {
            self.ids
                .number_edges::<false>(nbrs, indices, src_nodes, self.len)
        };
    }

    /// The sources and every edge's index; the table is clean again.
    pub(super) fn finish(mut self) -> (Vec<NodeId>, Vec<u32>) {
        self.src_nodes.truncate(self.len);
        self.ids.reset(&self.src_nodes);
        self.src_nodes.shrink_to_fit();
        (self.src_nodes, self.indices)
    }
}

thread_local! {
    /// The id table of the blocks this thread builds: allocated once per thread (it grows to
    /// the graph's size), instead of once per block.
    static TABLE: RefCell<LocalIds> = RefCell::default();
}

/// Run `f` with this thread's id table. The table is taken out of its cell for the call, so a
/// nested call (none is expected) would get a fresh one instead of a borrow error.
pub(super) fn with_thread_table<R>(f: impl FnOnce(&mut LocalIds) -> R) -> R {
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
    let blocks: Result<Vec<Block>, Infallible> =
        blocks_by_hop(seeds, fanouts, key, |frontier, fanout, lkey| {
            Ok(sample_hop(adj, frontier, fanout, lkey))
        });
    match blocks {
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
    blocks_by_hop(seeds, fanouts, key, |frontier, fanout, lkey| {
        let Sampled { offsets, neighbors } = sample(frontier, fanout, lkey)?;
        Ok(with_thread_table(|ids| {
            build_parts(frontier, offsets, &neighbors, ids, None)
        }))
    })
}

/// The blocks of one mini-batch, each hop's by `hop(frontier, fanout, layer_key)` from the
/// previous hop's sources (the seeds first), returned input layer first.
fn blocks_by_hop<E>(
    seeds: &[NodeId],
    fanouts: &[i32],
    key: BatchKey,
    mut hop: impl FnMut(&[NodeId], i32, LayerKey) -> Result<Block, E>,
) -> Result<Vec<Block>, E> {
    let mut blocks: Vec<Block> = Vec::with_capacity(fanouts.len());
    for (layer, &fanout) in fanouts.iter().enumerate() {
        let frontier: &[NodeId] = blocks.last().map_or(seeds, |b| &b.src_nodes);
        let block = hop(frontier, fanout, key.layer(layer as u32))?;
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
