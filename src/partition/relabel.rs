//! Relabelling for contiguous ownership (ARCHITECTURE invariant 1) and extraction of each
//! part's dataset.
//!
//! New ids are ordered by part, then by original id within a part, so part `p` owns
//! `[offsets[p], offsets[p+1])`. Neighbour lists keep their original order (only the ids
//! change): the sampler picks neighbours by original id and list position, which therefore
//! does not depend on the partition.

use crate::graph::{Csr, Dataset, Labels, NodeId, Splits};
use ndarray::Axis;
use rayon::prelude::*;

/// The mapping between original and new vertex ids.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Relabeling {
    /// `offsets[p]..offsets[p+1]` are the new ids of part `p`.
    pub offsets: Vec<u64>,
    /// `orig_id[new] = old`.
    pub orig_id: Vec<NodeId>,
    /// `new_id[old] = new`.
    pub new_id: Vec<NodeId>,
}

impl Relabeling {
    /// Relabel from the part of every vertex (`part[v] < parts`).
    pub fn from_parts(part: &[u32], parts: usize) -> Relabeling {
        let mut offsets = vec![0u64; parts + 1];
        for &p in part {
            offsets[p as usize + 1] += 1;
        }
        for p in 0..parts {
            offsets[p + 1] += offsets[p];
        }
        let mut next = offsets[..parts].to_vec();
        let mut new_id = vec![0 as NodeId; part.len()];
        let mut orig_id = vec![0 as NodeId; part.len()];
        // Visiting old ids in increasing order keeps them in that order within each part.
        for (old, &p) in part.iter().enumerate() {
            let new = next[p as usize];
            next[p as usize] += 1;
            new_id[old] = new as NodeId;
            orig_id[new as usize] = old as NodeId;
        }
        Relabeling {
            offsets,
            orig_id,
            new_id,
        }
    }

    /// Number of parts.
    pub fn num_parts(&self) -> usize {
        self.offsets.len() - 1
    }

    /// Original ids of the vertices owned by part `p`, in new-id order.
    pub fn owned(&self, p: usize) -> &[NodeId] {
        &self.orig_id[self.offsets[p] as usize..self.offsets[p + 1] as usize]
    }
}

/// The dataset of part `p`: owned rows (in new-id order) with neighbour ids relabelled and
/// in their original order, owned features and labels, owned split ids (new ids, sorted).
pub fn extract_part(ds: &Dataset, relabel: &Relabeling, p: usize) -> Dataset {
    let owned = relabel.owned(p);
    let graph = relabelled_rows(&ds.graph, owned, &relabel.new_id);
    let rows: Vec<usize> = owned.iter().map(|&v| v as usize).collect();
    let features = ds.features.as_ref().map(|f| f.select(Axis(0), &rows));
    let labels = ds.labels.as_ref().map(|l| match l {
        Labels::Class(c) => Labels::Class(rows.iter().map(|&v| c[v]).collect()),
        Labels::Multi(m) => Labels::Multi(m.select(Axis(0), &rows)),
    });
    let (lo, hi) = (relabel.offsets[p], relabel.offsets[p + 1]);
    let owned_split = |ids: &[NodeId]| -> Vec<NodeId> {
        let mut out: Vec<NodeId> = ids
            .iter()
            .map(|&v| relabel.new_id[v as usize])
            .filter(|&v| (lo..hi).contains(&(v as u64)))
            .collect();
        out.sort_unstable();
        out
    };
    Dataset {
        name: ds.name.clone(),
        num_nodes: ds.num_nodes,
        first_node: lo,
        graph,
        features,
        labels,
        num_classes: ds.num_classes,
        splits: Splits {
            train: owned_split(&ds.splits.train),
            val: owned_split(&ds.splits.val),
            test: owned_split(&ds.splits.test),
        },
        directed: ds.directed,
    }
}

/// Rows `owned` of `graph` (in that order), neighbours mapped through `new_id`, in parallel
/// over blocks of rows.
fn relabelled_rows(graph: &Csr, owned: &[NodeId], new_id: &[NodeId]) -> Csr {
    let mut indptr = Vec::with_capacity(owned.len() + 1);
    indptr.push(0u64);
    let mut total = 0u64;
    for &v in owned {
        total += graph.degree(v as usize) as u64;
        indptr.push(total);
    }
    let mut indices = vec![0 as NodeId; total as usize];
    // Blocks of rows own disjoint, contiguous stretches of `indices`.
    const BLOCK: usize = 4096;
    let mut blocks: Vec<(&[NodeId], &mut [NodeId])> = Vec::new();
    let mut rest: &mut [NodeId] = &mut indices;
    for (b, rows) in owned.chunks(BLOCK).enumerate() {
        let len = (indptr[b * BLOCK + rows.len()] - indptr[b * BLOCK]) as usize;
        let (head, tail) = rest.split_at_mut(len);
        blocks.push((rows, head));
        rest = tail;
    }
    blocks.into_par_iter().for_each(|(rows, out)| {
        let mut at = 0;
        for &v in rows {
            for &u in graph.neighbors(v as usize) {
                out[at] = new_id[u as usize];
                at += 1;
            }
        }
    });
    Csr { indptr, indices }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_ids_follow_part_then_original_id() {
        let r = Relabeling::from_parts(&[1, 0, 1, 0, 2], 3);
        assert_eq!(r.offsets, vec![0, 2, 4, 5]);
        assert_eq!(r.orig_id, vec![1, 3, 0, 2, 4]);
        for (old, &new) in r.new_id.iter().enumerate() {
            assert_eq!(r.orig_id[new as usize] as usize, old);
        }
    }

    #[test]
    fn rows_keep_their_neighbour_order() {
        // Vertex 0 lists 2, 1, 2 (in that order); parts put 2 first.
        let g = Csr::from_edges(3, &[0, 0, 0, 1], &[2, 1, 2, 0]);
        let r = Relabeling::from_parts(&[1, 1, 0], 2);
        // new ids: 2 → 0, 0 → 1, 1 → 2.
        let part1 = relabelled_rows(&g, r.owned(1), &r.new_id);
        assert_eq!(part1.indptr, vec![0, 3, 4]);
        assert_eq!(part1.indices, vec![0, 2, 0, 1]);
    }
}
