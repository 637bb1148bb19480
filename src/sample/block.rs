//! One layer of a sampled mini-batch, in DGL's message-flow-graph layout.

use crate::graph::NodeId;
use rayon::prelude::*;

/// Destinations per task of [`Block::with_self_loops`].
const LOOP_CHUNK: usize = 2048;

/// A bipartite block from `num_src` source rows to `num_dst` destination rows.
///
/// * The destination nodes are the first `num_dst` source nodes (`src_nodes[..num_dst]`), so a
///   layer can read a destination's own previous representation (SAGE's root weight, GCN's
///   self-loop) without a lookup.
/// * Edges are stored by destination in CSR form: the sources of destination `i` are the
///   source-local indices `indices[indptr[i]..indptr[i + 1]]` (duplicates allowed: sampling
///   with multiplicity or multigraphs).
/// * `src_nodes` holds global vertex ids (after any relabelling by the partitioner).
///
/// In a mini-batch of `L` layers, `blocks[0]` is the input layer (its sources are the input
/// feature rows) and `blocks[L-1]` the output layer (its destinations are the seeds).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Block {
    pub num_dst: usize,
    pub src_nodes: Vec<NodeId>,
    pub indptr: Vec<usize>,
    pub indices: Vec<u32>,
}

impl Block {
    /// Number of source rows.
    pub fn num_src(&self) -> usize {
        self.src_nodes.len()
    }

    /// Number of edges.
    pub fn num_edges(&self) -> usize {
        self.indices.len()
    }

    /// Global ids of the destination nodes.
    pub fn dst_nodes(&self) -> &[NodeId] {
        &self.src_nodes[..self.num_dst]
    }

    /// Source-local indices of the in-neighbours of destination `i`.
    #[inline]
    pub fn in_edges(&self, i: usize) -> &[u32] {
        &self.indices[self.indptr[i]..self.indptr[i + 1]]
    }

    /// In-degree of destination `i`.
    #[inline]
    pub fn in_degree(&self, i: usize) -> usize {
        self.indptr[i + 1] - self.indptr[i]
    }

    /// The same block with one self-loop edge `i -> i` appended to every destination
    /// (GCN's `A + I`).
    pub fn with_self_loops(&self) -> Block {
        // Destination `i`'s row moves by `i` (one loop per earlier row), so every chunk of
        // destinations knows where its rows go and writes them in parallel.
        let indptr: Vec<usize> = self
            .indptr
            .iter()
            .enumerate()
            .map(|(i, &o)| o + i)
            .collect();
        let mut indices = vec![0u32; self.indices.len() + self.num_dst];
        let mut outs = Vec::with_capacity(self.num_dst.div_ceil(LOOP_CHUNK));
        let mut rest = indices.as_mut_slice();
        for lo in (0..self.num_dst).step_by(LOOP_CHUNK) {
            let hi = (lo + LOOP_CHUNK).min(self.num_dst);
            let (out, tail) = rest.split_at_mut(indptr[hi] - indptr[lo]);
            outs.push((lo..hi, out));
            rest = tail;
        }
        outs.into_par_iter().for_each(|(rows, out)| {
            let mut at = 0;
            for i in rows {
                let row = self.in_edges(i);
                out[at..at + row.len()].copy_from_slice(row);
                out[at + row.len()] = i as u32;
                at += row.len() + 1;
            }
        });
        Block {
            num_dst: self.num_dst,
            src_nodes: self.src_nodes.clone(),
            indptr,
            indices,
        }
    }

    /// `blocks` as one block: their destinations stacked in order (block `q`'s are rows
    /// `Σ_{p<q} num_dst_p ..` of the result), then their other sources in the same order,
    /// each edge kept on its destination and pointed at its source's new row. A layer over the
    /// result computes every block's output rows at once, stacked as the blocks are (NFP's
    /// sliced input layer over every rank's block: one product per step instead of one per
    /// rank, and the partial rows come out in the order they are sent). Sources that several
    /// blocks share stay one row per block.
    pub fn stacked(blocks: &[Block]) -> Block {
        let dsts: usize = blocks.iter().map(|b| b.num_dst).sum();
        let srcs: usize = blocks.iter().map(Block::num_src).sum();
        let edges: usize = blocks.iter().map(Block::num_edges).sum();
        let mut src_nodes = Vec::with_capacity(srcs);
        for b in blocks {
            src_nodes.extend_from_slice(b.dst_nodes());
        }
        for b in blocks {
            src_nodes.extend_from_slice(&b.src_nodes[b.num_dst..]);
        }
        let mut indptr: Vec<usize> = Vec::with_capacity(dsts + 1);
        indptr.push(0);
        let mut indices = Vec::with_capacity(edges);
        // Where block `q`'s destinations and its other sources start in the stacked rows.
        let (mut dst_at, mut rest_at) = (0usize, dsts);
        for b in blocks {
            let nd = b.num_dst;
            indices.extend(b.indices.iter().map(|&i| {
                let i = i as usize;
                let row = if i < nd { dst_at + i } else { rest_at + i - nd };
                row as u32
            }));
            let base = indptr[indptr.len() - 1];
            indptr.extend(b.indptr[1..].iter().map(|&o| base + o));
            dst_at += nd;
            rest_at += b.num_src() - nd;
        }
        Block {
            num_dst: dsts,
            src_nodes,
            indptr,
            indices,
        }
    }

    /// Check internal consistency (used by tests and debug builds).
    pub fn check(&self) -> Result<(), String> {
        if self.num_dst > self.src_nodes.len() {
            return Err(format!(
                "num_dst {} > num_src {}",
                self.num_dst,
                self.src_nodes.len()
            ));
        }
        if self.indptr.len() != self.num_dst + 1 || self.indptr[0] != 0 {
            return Err("indptr must have num_dst + 1 entries starting at 0".into());
        }
        if self.indptr.windows(2).any(|w| w[1] < w[0])
            || *self.indptr.last().unwrap() != self.indices.len()
        {
            return Err("indptr must be non-decreasing and end at the edge count".into());
        }
        if self
            .indices
            .iter()
            .any(|&s| s as usize >= self.src_nodes.len())
        {
            return Err("edge source out of range".into());
        }
        Ok(())
    }
}

#[cfg(test)]
impl Block {
    /// A small block shared by unit tests: destinations 0..3 among sources with global ids
    /// 10..14; dst 0 <- {1, 1, 2} (a duplicate edge), dst 1 <- {} (isolated), dst 2 <- {2, 0}.
    pub(crate) fn small_example() -> Block {
        Block {
            num_dst: 3,
            src_nodes: vec![10, 11, 12, 13],
            indptr: vec![0, 3, 3, 5],
            indices: vec![1, 1, 2, 2, 0],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every stacked destination is the block's own, with the same sources (by global id) in
    /// the same order; the destinations lead the sources, in block order.
    #[test]
    fn stacked_blocks_keep_every_destination_and_its_sources() {
        let a = Block::small_example();
        let b = Block {
            num_dst: 2,
            src_nodes: vec![11, 20, 10],
            indptr: vec![0, 1, 3],
            indices: vec![2, 0, 1],
        };
        let empty = Block {
            num_dst: 0,
            src_nodes: vec![],
            indptr: vec![0],
            indices: vec![],
        };
        let blocks = [a.clone(), empty, b.clone()];
        let s = Block::stacked(&blocks);
        s.check().unwrap();
        assert_eq!(s.num_dst, 5);
        assert_eq!(s.dst_nodes(), &[10, 11, 12, 11, 20]);
        assert_eq!(s.num_src(), a.num_src() + b.num_src());
        let sources = |blk: &Block, i: usize| -> Vec<NodeId> {
            blk.in_edges(i)
                .iter()
                .map(|&j| blk.src_nodes[j as usize])
                .collect()
        };
        let originals = [(&a, 0), (&a, 1), (&a, 2), (&b, 0), (&b, 1)];
        for (row, (blk, i)) in originals.into_iter().enumerate() {
            assert_eq!(sources(&s, row), sources(blk, i), "destination row {row}");
        }
        assert_eq!(Block::stacked(std::slice::from_ref(&a)), a);
    }
}
