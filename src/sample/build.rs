//! Turning sampled neighbours into blocks, and whole mini-batches of blocks.

use super::neighbor::{sample_neighbors, Adjacency, LayerKey, Sampled};
use super::Block;
use crate::graph::{Dataset, NodeId};
use std::convert::Infallible;

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
/// array access per sampled edge, where a hash map spent most of a mini-batch's sampling time
/// (the blocks are built serially). The table grows to the largest id seen (4 bytes per vertex
/// of the graph at most) and is reused across layers and batches; a block resets only the
/// entries it set, so clearing costs the block's size, not the graph's.
#[derive(Clone, Debug, Default)]
pub struct LocalIds {
    slot: Vec<u32>,
}

impl LocalIds {
    /// Marks an id with no local index.
    const ABSENT: u32 = u32::MAX;

    /// The local index of `v`, given `next` when `v` has none yet; true when it was new.
    #[inline]
    fn index_or_insert(&mut self, v: NodeId, next: usize) -> (u32, bool) {
        let v = v as usize;
        if v >= self.slot.len() {
            let len = (v + 1).max(2 * self.slot.len());
            self.slot.resize(len, Self::ABSENT);
        }
        let s = &mut self.slot[v];
        if *s == Self::ABSENT {
            *s = u32::try_from(next).expect("a block has fewer than 2^32 - 1 sources");
            (*s, true)
        } else {
            (*s, false)
        }
    }

    /// Forget the indices of `ids` (the sources of the block just built).
    fn reset(&mut self, ids: &[NodeId]) {
        for &v in ids {
            self.slot[v as usize] = Self::ABSENT;
        }
    }
}

/// The block whose destinations are `dst` and whose edges are `sampled` (row `i` of
/// `sampled` holds the sources of `dst[i]`).
///
/// Sources are `dst` first (so destination `i` is source `i`), then every other sampled
/// vertex in order of first appearance in `sampled.neighbors`. `dst` should be distinct; a
/// repeated destination keeps its own source row, and edges to it refer to its first copy.
///
/// # Panics
/// When `sampled` does not have one row per destination.
pub fn build_block(dst: &[NodeId], sampled: &Sampled) -> Block {
    build_block_with(dst, sampled, &mut LocalIds::default())
}

/// [`build_block`] reusing `ids`' memory; mini-batches reuse one table across their layers.
pub fn build_block_with(dst: &[NodeId], sampled: &Sampled, ids: &mut LocalIds) -> Block {
    assert_eq!(
        sampled.offsets.len(),
        dst.len() + 1,
        "build_block: sampled rows do not match the destinations"
    );
    let mut src_nodes = Vec::with_capacity(dst.len() + sampled.neighbors.len());
    for &v in dst {
        ids.index_or_insert(v, src_nodes.len());
        src_nodes.push(v);
    }
    let mut indices = Vec::with_capacity(sampled.neighbors.len());
    for &u in &sampled.neighbors {
        let (idx, new) = ids.index_or_insert(u, src_nodes.len());
        if new {
            src_nodes.push(u);
        }
        indices.push(idx);
    }
    ids.reset(&src_nodes);
    src_nodes.shrink_to_fit();
    Block {
        num_dst: dst.len(),
        src_nodes,
        indptr: sampled.offsets.clone(),
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
    let mut ids = LocalIds::default();
    for (hop, &fanout) in fanouts.iter().enumerate() {
        let frontier: &[NodeId] = blocks.last().map_or(seeds, |b| &b.src_nodes);
        let sampled = sample(frontier, fanout, key.layer(hop as u32))?;
        let block = build_block_with(frontier, &sampled, &mut ids);
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
