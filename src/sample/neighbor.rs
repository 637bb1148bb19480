//! Node-wise neighbour sampling of owned vertices, keyed by original vertex ids.
//!
//! [`sample_neighbors`] draws, for each query vertex `v`, `min(fanout, deg(v))` distinct
//! positions of `v`'s neighbour list, uniformly without replacement (Floyd's algorithm), and
//! returns the neighbours at those positions in increasing position order. Draw `i` for `v`
//! is `hash_key(&[seed, epoch, batch, layer, orig_id(v), i])`: the result is a pure function of
//! the key, `v`'s original id and `v`'s neighbour list, so any rank that owns `v`, under any
//! partitioning that keeps list order, samples the same neighbours (ARCHITECTURE invariant 3).

use super::rng::{below, HashKey};
use crate::graph::{Dataset, NodeId};
use crate::util::prefetch::prefetch;
use rayon::prelude::*;

/// A rank's view of the adjacency of the vertices it owns (ARCHITECTURE invariant 2).
///
/// `neighbors(v)` is the list of vertices whose messages `v` receives (its in-neighbours in
/// message-passing terms), as global ids, in the order of the source dataset.
pub trait Adjacency: Sync {
    /// Does this view hold the adjacency of `v`?
    fn owns(&self, v: NodeId) -> bool;
    /// Neighbours of the owned vertex `v` (global ids).
    fn neighbors(&self, v: NodeId) -> &[NodeId];
    /// Original (pre-partition) id of the owned vertex `v`.
    fn orig_id(&self, v: NodeId) -> u64;
}

/// The adjacency held by a [`Dataset`]: a whole graph or one part of a partitioned one.
#[derive(Clone, Copy, Debug)]
pub struct LocalGraph<'a> {
    ds: &'a Dataset,
    /// `orig_ids[v]` for every GLOBAL id `v` (the full table of `parts/meta.h5`).
    orig_ids: Option<&'a [u64]>,
    first: u64,
    end: u64,
}

impl<'a> LocalGraph<'a> {
    /// A view of the vertices held by `ds`. `orig_ids` is indexed by global id (the whole
    /// `orig_id` table of the partition metadata); `None` means ids were never relabelled.
    ///
    /// # Panics
    /// When `orig_ids` is shorter than the graph (the table is validated when it is read).
    pub fn new(ds: &'a Dataset, orig_ids: Option<&'a [u64]>) -> Self {
        if let Some(t) = orig_ids {
            assert!(
                t.len() as u64 >= ds.num_nodes,
                "orig_id table has {} entries for a graph of {} vertices",
                t.len(),
                ds.num_nodes
            );
        }
        LocalGraph {
            ds,
            orig_ids,
            first: ds.first_node,
            end: ds.first_node + ds.local_nodes() as u64,
        }
    }

    /// The dataset this view reads.
    pub fn dataset(&self) -> &'a Dataset {
        self.ds
    }
}

impl Adjacency for LocalGraph<'_> {
    #[inline]
    fn owns(&self, v: NodeId) -> bool {
        (self.first..self.end).contains(&(v as u64))
    }

    #[inline]
    fn neighbors(&self, v: NodeId) -> &[NodeId] {
        self.ds.graph.neighbors((v as u64 - self.first) as usize)
    }

    #[inline]
    fn orig_id(&self, v: NodeId) -> u64 {
        self.orig_ids.map_or(v as u64, |t| t[v as usize])
    }
}

/// What identifies one sampling hop of one mini-batch.
///
/// `layer` counts hops from the seeds outward: layer 0 samples the seeds' neighbours with
/// `fanouts[0]` and produces the LAST block of the mini-batch (ARCHITECTURE invariant 5).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LayerKey {
    pub seed: u64,
    pub epoch: u64,
    pub batch: u64,
    pub layer: u32,
}

impl LayerKey {
    /// The hash state after `seed, epoch, batch, layer`; a vertex extends it with its
    /// original id and then the draw number.
    #[inline]
    pub(crate) fn prefix(&self) -> HashKey {
        HashKey::new()
            .push(self.seed)
            .push(self.epoch)
            .push(self.batch)
            .push(self.layer as u64)
    }
}

/// Sampled neighbours of a list of query vertices, in CSR form: the neighbours of query `i`
/// are `neighbors[offsets[i]..offsets[i + 1]]` (global ids).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Sampled {
    pub offsets: Vec<usize>,
    pub neighbors: Vec<NodeId>,
}

impl Sampled {
    /// Rows of `lens[i]` neighbours each, laid end to end in `neighbors`.
    pub fn from_lengths(lens: &[u32], neighbors: Vec<NodeId>) -> Sampled {
        let mut offsets = Vec::with_capacity(lens.len() + 1);
        offsets.push(0usize);
        for &l in lens {
            offsets.push(offsets.last().unwrap() + l as usize);
        }
        debug_assert_eq!(offsets.last().copied(), Some(neighbors.len()));
        Sampled { offsets, neighbors }
    }

    /// Number of query vertices.
    pub fn len(&self) -> usize {
        self.offsets.len().saturating_sub(1)
    }

    /// True when there are no query vertices.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Sampled neighbours of query `i`.
    #[inline]
    pub fn row(&self, i: usize) -> &[NodeId] {
        &self.neighbors[self.offsets[i]..self.offsets[i + 1]]
    }

    /// Put together the answers of several owners into one result over `total` queries.
    ///
    /// Part `(positions, s)` answered the queries whose indices in the full query list are
    /// `positions` (in the order `s` holds them). This is how a rank reassembles its frontier
    /// after sending each owner its share (owner computes, ARCHITECTURE invariant 2).
    ///
    /// # Panics
    /// When a part's `positions` and rows differ in length, a position is out of range, or the
    /// parts do not cover every query exactly once.
    pub fn merge_by_position(total: usize, parts: &[(&[usize], &Sampled)]) -> Sampled {
        let mut counts = vec![usize::MAX; total];
        for (positions, s) in parts {
            assert_eq!(
                positions.len(),
                s.len(),
                "positions and sampled rows differ"
            );
            for (j, &p) in positions.iter().enumerate() {
                assert!(counts[p] == usize::MAX, "query {p} answered twice");
                counts[p] = s.offsets[j + 1] - s.offsets[j];
            }
        }
        let mut offsets = Vec::with_capacity(total + 1);
        offsets.push(0);
        for (p, &c) in counts.iter().enumerate() {
            assert!(c != usize::MAX, "query {p} not answered");
            offsets.push(offsets[p] + c);
        }
        let mut neighbors = vec![0 as NodeId; offsets[total]];
        for (positions, s) in parts {
            for (j, &p) in positions.iter().enumerate() {
                neighbors[offsets[p]..offsets[p + 1]].copy_from_slice(s.row(j));
            }
        }
        Sampled { offsets, neighbors }
    }
}

/// How many neighbours a vertex of degree `deg` keeps under `fanout` (`< 0`: all of them).
#[inline]
pub fn sample_count(fanout: i32, deg: usize) -> usize {
    if fanout < 0 {
        deg
    } else {
        deg.min(fanout as usize)
    }
}

/// Query vertices handled by one rayon task, for `n` queries: 512, or fewer for short lists
/// so that they still make 64 tasks (a mini-batch's first hop has 1,024 seeds: at 512 per task
/// two threads did all of it). A function of the query count only, never of the thread
/// count, so the work split, and anything that could depend on it, is the same on every
/// machine.
pub(crate) fn chunk_len(n: usize) -> usize {
    (n / 64).clamp(64, 512)
}

/// Pair every chunk of `items` ([`chunk_len`] of them) with its own slice of `out`, where item
/// `i` writes `out[offsets[i]..offsets[i + 1]]`: output sizes are known before any draw, so
/// parallel chunks write straight into one buffer.
pub(crate) fn chunked_outputs<'a, T, U>(
    items: &'a [T],
    offsets: &[usize],
    out: &'a mut [U],
) -> Vec<(&'a [T], &'a mut [U])> {
    let chunk_len = chunk_len(items.len());
    let mut outs = Vec::with_capacity(items.len().div_ceil(chunk_len));
    let mut rest = out;
    for (c, chunk) in items.chunks(chunk_len).enumerate() {
        let len = offsets[c * chunk_len + chunk.len()] - offsets[c * chunk_len];
        let (head, tail) = rest.split_at_mut(len);
        outs.push((chunk, head));
        rest = tail;
    }
    outs
}

/// Up to this many draws, membership is a linear scan of the chosen positions; above it a
/// bit set over the neighbour list is cheaper.
const LINEAR_MAX: usize = 32;

/// Lists up to this long (most lists a sampler meets) keep their membership bits in a few
/// words on the stack: the chosen positions then come out sorted by scanning the bits, with
/// no sort (the sort of the linear path was a third of the draw's time).
const STACK_BITS: usize = 256;

/// A query vertex's neighbour list and original id, looked up once per call.
type Row<'a> = (&'a [NodeId], u64);

/// Sample up to `fanout` neighbours (`-1`: all) of each of `vertices`, which must all be owned
/// by `adj`. Rows of the result follow `vertices`; duplicates in `vertices` get identical rows.
///
/// # Panics
/// When a vertex is not owned by `adj` (the caller routes vertices to their owners).
pub fn sample_neighbors(
    adj: &impl Adjacency,
    vertices: &[NodeId],
    fanout: i32,
    key: LayerKey,
) -> Sampled {
    // Look every row up once, in parallel: the `indptr` and `orig_id` reads of scattered
    // frontier vertices are cache misses, and independent lookups let many be in flight.
    let rows: Vec<Row> = vertices
        .par_iter()
        .map(|&v| {
            assert!(
                adj.owns(v),
                "sample_neighbors: vertex {v} is not owned here"
            );
            (adj.neighbors(v), adj.orig_id(v))
        })
        .collect();

    // Output sizes are known before drawing anything, so every chunk writes straight into
    // its own slice of one output buffer. The offsets are a prefix sum, by chunks: each
    // chunk's total, then (serially, one add per chunk) where each chunk starts, then every
    // chunk's own offsets in parallel.
    let count = |(list, _): &Row| sample_count(fanout, list.len());
    let chunk = chunk_len(rows.len());
    let chunk_totals: Vec<usize> = rows
        .par_chunks(chunk)
        .map(|chunk| chunk.iter().map(count).sum())
        .collect();
    let mut offsets = vec![0usize; rows.len() + 1];
    let mut total = 0usize;
    let starts: Vec<usize> = chunk_totals
        .iter()
        .map(|&t| {
            total += t;
            total - t
        })
        .collect();
    offsets[1..]
        .par_chunks_mut(chunk)
        .zip(rows.par_chunks(chunk))
        .zip(starts)
        .for_each(|((out, chunk), mut at)| {
            for (o, row) in out.iter_mut().zip(chunk) {
                at += count(row);
                *o = at;
            }
        });
    let mut neighbors = vec![0 as NodeId; total];

    let prefix = key.prefix();
    chunked_outputs(&rows, &offsets, &mut neighbors)
        .into_par_iter()
        .for_each(|(chunk, out)| {
            // Two stages, `DRAW_AHEAD` vertices apart: draw a vertex's positions and prefetch
            // the chosen entries, then copy them out once the loads have had time to land.
            let mut scratch = Scratch::default();
            let mut drawn: [Vec<usize>; DRAW_AHEAD] = Default::default();
            let mut at = 0;
            for j in 0..chunk.len() + DRAW_AHEAD {
                // Copy out vertex `j - DRAW_AHEAD` first: vertex `j`'s draw reuses its slot.
                if let Some(i) = j.checked_sub(DRAW_AHEAD) {
                    let (nbrs, _) = chunk[i];
                    let k = sample_count(fanout, nbrs.len());
                    let dst = &mut out[at..at + k];
                    at += k;
                    if k == nbrs.len() {
                        dst.copy_from_slice(nbrs);
                    } else {
                        for (d, &p) in dst.iter_mut().zip(&drawn[i % DRAW_AHEAD]) {
                            *d = nbrs[p];
                        }
                    }
                }
                let Some(&(nbrs, orig)) = chunk.get(j) else {
                    continue;
                };
                if let Some(&(ahead, _)) = chunk.get(j + PREFETCH_AHEAD) {
                    prefetch_list(ahead);
                }
                let k = sample_count(fanout, nbrs.len());
                if k < nbrs.len() {
                    scratch.choose(prefix.push(orig), nbrs.len(), k);
                    for &p in &scratch.positions {
                        prefetch(&nbrs[p]);
                    }
                    std::mem::swap(&mut scratch.positions, &mut drawn[j % DRAW_AHEAD]);
                }
            }
        });
    Sampled { offsets, neighbors }
}

/// How many vertices ahead the list of a frontier vertex is prefetched.
const PREFETCH_AHEAD: usize = 8;

/// How many vertices after its draw a vertex's chosen neighbours are copied out.
const DRAW_AHEAD: usize = 4;

/// Ask the CPU to start loading a neighbour list that will be read soon. Frontier vertices
/// are scattered over the graph, so without this nearly every list read is a cache miss that
/// the loop waits for; with it several misses are in flight at once.
#[inline(always)]
fn prefetch_list(list: &[NodeId]) {
    if let (Some(first), Some(last)) = (list.first(), list.last()) {
        prefetch(first);
        prefetch(last);
    }
}

/// Per-task buffers reused across vertices, so drawing allocates nothing per vertex. The one
/// implementation of the draw: `positions.rs` (pre-sampling) uses it too.
#[derive(Default)]
pub(crate) struct Scratch {
    /// Chosen positions; sorted after each draw.
    pub(crate) positions: Vec<usize>,
    /// Membership bits over positions, for large draws; all zero between draws.
    bits: Vec<u64>,
}

impl Scratch {
    /// Choose `k < deg` distinct positions of `[0, deg)` uniformly (Floyd's algorithm: `k`
    /// draws, none rejected) into `self.positions`, sorted increasingly.
    pub(crate) fn choose(&mut self, vkey: HashKey, deg: usize, k: usize) {
        let positions = &mut self.positions;
        positions.clear();
        let draw = |i: usize, j: usize| below(vkey.push(i as u64).finish(), j as u64 + 1) as usize;
        if deg <= 64 {
            // One word: it stays in a register, where four words live in memory and each
            // draw's test waits for the previous draw's store.
            return floyd_in_words::<1>(deg, k, draw, positions);
        }
        if deg <= STACK_BITS {
            return floyd_in_words::<{ STACK_BITS / 64 }>(deg, k, draw, positions);
        }
        if k <= LINEAR_MAX {
            for i in 0..k {
                let j = deg - k + i;
                let t = draw(i, j);
                positions.push(if positions.contains(&t) { j } else { t });
            }
        } else {
            let words = deg.div_ceil(64);
            if self.bits.len() < words {
                self.bits.resize(words, 0);
            }
            let bits = &mut self.bits;
            for i in 0..k {
                let j = deg - k + i;
                let t = draw(i, j);
                let pick = if bits[t / 64] >> (t % 64) & 1 == 1 {
                    j
                } else {
                    t
                };
                bits[pick / 64] |= 1 << (pick % 64);
                positions.push(pick);
            }
            // Clear only the words we touched: O(k), not O(deg).
            for &p in positions.iter() {
                bits[p / 64] = 0;
            }
        }
        positions.sort_unstable();
    }
}

/// Floyd's `k` draws over `[0, deg)` (`deg <= 64 * W`) with the membership bits in `W` words
/// on the stack, then the chosen positions in increasing order from the bits, so no sort.
/// The draw loop is the heap path's again on purpose: one helper over a `&mut [u64]` for both
/// made the last hop's draws about 10 % slower (the word no longer stayed in a register).
#[inline(always)]
fn floyd_in_words<const W: usize>(
    deg: usize,
    k: usize,
    draw: impl Fn(usize, usize) -> usize,
    positions: &mut Vec<usize>,
) {
    debug_assert!(deg <= 64 * W);
    let mut bits = [0u64; W];
    for i in 0..k {
        let j = deg - k + i;
        let t = draw(i, j);
        let pick = if bits[t / 64] >> (t % 64) & 1 == 1 {
            j
        } else {
            t
        };
        bits[pick / 64] |= 1 << (pick % 64);
    }
    for (w, &word) in bits[..deg.div_ceil(64)].iter().enumerate() {
        let mut rest = word;
        while rest != 0 {
            positions.push(w * 64 + rest.trailing_zeros() as usize);
            rest &= rest - 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn choose(seed: u64, deg: usize, k: usize) -> Vec<usize> {
        let mut s = Scratch::default();
        s.choose(HashKey::new().push(seed), deg, k);
        s.positions.clone()
    }

    #[test]
    fn floyd_draws_distinct_sorted_positions_in_range() {
        for &(deg, k) in &[(10, 3), (10, 9), (100, 40), (100, 99), (1000, 33), (5, 1)] {
            for seed in 0..50 {
                let p = choose(seed, deg, k);
                assert_eq!(p.len(), k);
                assert!(p.windows(2).all(|w| w[0] < w[1]), "{p:?}");
                assert!(p.iter().all(|&x| x < deg));
            }
        }
    }

    /// Floyd's algorithm as written in the books: what every membership path must return.
    fn floyd_reference(seed: u64, deg: usize, k: usize) -> Vec<usize> {
        let vkey = HashKey::new().push(seed);
        let mut chosen = std::collections::BTreeSet::new();
        for i in 0..k {
            let j = deg - k + i;
            let t = below(vkey.push(i as u64).finish(), j as u64 + 1) as usize;
            chosen.insert(if chosen.contains(&t) { j } else { t });
        }
        chosen.into_iter().collect()
    }

    #[test]
    fn every_membership_path_draws_what_plain_floyd_draws() {
        // Stack bits (deg <= 256, any k), linear scan (k <= 32) and heap bits (k > 32).
        let cases = [
            (2, 1),
            (40, 5),
            (64, 63),
            (65, 15),
            (200, 150),
            (256, 10),
            (257, 10),
            (1000, 32),
            (1000, 33),
            (5000, 400),
        ];
        for &(deg, k) in &cases {
            for seed in 0..40 {
                assert_eq!(
                    choose(seed, deg, k),
                    floyd_reference(seed, deg, k),
                    "deg {deg} k {k}"
                );
            }
        }
    }

    #[test]
    fn every_membership_path_is_uniform() {
        // Each position should be chosen k/deg of the time by the stack bits (deg <= 256),
        // the linear scan (k <= 32) and the heap bits (k > 32) alike.
        for &(deg, k) in &[(12usize, 4usize), (120, 40), (300, 30), (600, 200)] {
            let trials = 20_000;
            let mut hits = vec![0usize; deg];
            for seed in 0..trials {
                for p in choose(seed, deg, k) {
                    hits[p] += 1;
                }
            }
            let expect = trials as f64 * k as f64 / deg as f64;
            for (p, &h) in hits.iter().enumerate() {
                let rel = (h as f64 - expect).abs() / expect;
                assert!(
                    rel < 0.08,
                    "deg {deg} k {k}: position {p} hit {h}, expected {expect}"
                );
            }
        }
    }

    #[test]
    fn bit_set_is_clean_after_each_draw() {
        let mut s = Scratch::default();
        for seed in 0..20 {
            s.choose(HashKey::new().push(seed), 500, 100);
            assert!(s.bits.iter().all(|&w| w == 0));
        }
    }

    #[test]
    fn merge_by_position_restores_query_order() {
        let a = Sampled {
            offsets: vec![0, 2, 3],
            neighbors: vec![10, 11, 12],
        };
        let b = Sampled {
            offsets: vec![0, 0, 1],
            neighbors: vec![20],
        };
        let m = Sampled::merge_by_position(4, &[(&[3, 0], &a), (&[1, 2], &b)]);
        assert_eq!(m.offsets, vec![0, 1, 1, 2, 4]);
        assert_eq!(m.neighbors, vec![12, 20, 10, 11]);
    }
}
