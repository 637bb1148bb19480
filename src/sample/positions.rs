//! Neighbour sampling that also says WHICH stored edges were drawn.
//!
//! [`sample_neighbor_positions`] draws exactly what [`sample_neighbors`](super::sample_neighbors)
//! draws (the same counter-based keys and the same Floyd
//! algorithm, same increasing position order) and returns, alongside the neighbours, the index
//! of every sampled edge in the dataset's `indices` array. Pre-sampling counts how often each
//! stored edge is sampled with it; training keeps using the faster `sample_neighbors`.
//!
//! Both call the same draw (`neighbor::Scratch::choose` under `LayerKey::prefix`); the unit
//! test below checks, for every fanout path (all neighbours, few draws, many draws), that the
//! positions read back exactly the neighbours `sample_neighbors` returns.

use super::neighbor::{
    chunked_outputs, sample_count, Adjacency, LayerKey, LocalGraph, Sampled, Scratch,
};
use crate::graph::NodeId;
use rayon::prelude::*;

/// Sampled neighbours and the stored edges they came from.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SampledEdges {
    /// The neighbours, exactly as `sample_neighbors` returns them.
    pub sampled: Sampled,
    /// `positions[i]` is the index into the dataset's `graph.indices` of the edge that
    /// produced `sampled.neighbors[i]`.
    pub positions: Vec<usize>,
}

/// [`sample_neighbors`](super::sample_neighbors) on a [`LocalGraph`], also returning the
/// position in `graph.dataset().graph.indices` of every sampled edge.
///
/// # Panics
/// When a vertex is not owned by `graph` (as `sample_neighbors`).
pub fn sample_neighbor_positions(
    graph: &LocalGraph,
    vertices: &[NodeId],
    fanout: i32,
    key: LayerKey,
) -> SampledEdges {
    let ds = graph.dataset();
    let first = ds.first_node;
    let row_start = |v: NodeId| ds.graph.indptr[(v as u64 - first) as usize] as usize;

    let mut offsets = Vec::with_capacity(vertices.len() + 1);
    offsets.push(0usize);
    let mut total = 0usize;
    for &v in vertices {
        assert!(
            graph.owns(v),
            "sample_neighbor_positions: vertex {v} is not owned here"
        );
        total += sample_count(fanout, graph.neighbors(v).len());
        offsets.push(total);
    }
    let mut positions = vec![0usize; total];

    // Each chunk of queries writes its own slice of the output.
    let prefix = key.prefix();
    chunked_outputs(vertices, &offsets, &mut positions)
        .into_par_iter()
        .for_each(|(chunk, out)| {
            let mut floyd = Scratch::default();
            let mut at = 0;
            for &v in chunk {
                let deg = graph.neighbors(v).len();
                let start = row_start(v);
                let k = sample_count(fanout, deg);
                let dst = &mut out[at..at + k];
                at += k;
                if k == deg {
                    for (i, d) in dst.iter_mut().enumerate() {
                        *d = start + i;
                    }
                } else {
                    floyd.choose(prefix.push(graph.orig_id(v)), deg, k);
                    for (d, &p) in dst.iter_mut().zip(&floyd.positions) {
                        *d = start + p;
                    }
                }
            }
        });

    let neighbors = positions.iter().map(|&e| ds.graph.indices[e]).collect();
    SampledEdges {
        sampled: Sampled { offsets, neighbors },
        positions,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::{Csr, Dataset, Splits};
    use crate::sample::sample_neighbors;

    /// A graph whose rows have degrees 0..=199, neighbours scattered (and repeated) so that a
    /// wrong position would read a different neighbour.
    fn graph(first_node: u64, num_nodes: u64) -> Dataset {
        let rows = 200u32;
        let (mut src, mut dst) = (Vec::new(), Vec::new());
        for r in 0..rows {
            for i in 0..r {
                src.push(r);
                dst.push((r * 7919 + i * 104_729) % num_nodes as u32);
            }
        }
        Dataset {
            name: "positions".into(),
            num_nodes,
            first_node,
            graph: Csr::from_edges(rows as usize, &src, &dst),
            features: None,
            labels: None,
            num_classes: 0,
            splits: Splits::default(),
            directed: true,
        }
    }

    #[test]
    fn positions_read_back_exactly_what_sample_neighbors_draws() {
        for first in [0u64, 300] {
            let ds = graph(first, 1000);
            let orig: Vec<u64> = (0..1000u64).map(|v| (v * 37 + 11) % 1000).collect();
            let g = LocalGraph::new(&ds, Some(&orig));
            // Repeats and scattered order, as a frontier could be.
            let vertices: Vec<NodeId> = (0..200u32)
                .rev()
                .chain([5, 5, 150])
                .map(|v| v + first as u32)
                .collect();
            // -1: all; 3 and 15: the linear path; 40 and 120: the bit-set path.
            for fanout in [-1, 1, 3, 15, 40, 120] {
                for batch in 0..3 {
                    let key = LayerKey {
                        seed: 9,
                        epoch: 2,
                        batch,
                        layer: 1,
                    };
                    let want = sample_neighbors(&g, &vertices, fanout, key);
                    let got = sample_neighbor_positions(&g, &vertices, fanout, key);
                    assert_eq!(got.sampled, want, "fanout {fanout} batch {batch}");
                    assert_eq!(got.positions.len(), want.neighbors.len());
                    for (i, &v) in vertices.iter().enumerate() {
                        let row = (v as u64 - first) as usize;
                        let (lo, hi) = (
                            ds.graph.indptr[row] as usize,
                            ds.graph.indptr[row + 1] as usize,
                        );
                        let pos =
                            &got.positions[got.sampled.offsets[i]..got.sampled.offsets[i + 1]];
                        assert!(pos.iter().all(|&e| (lo..hi).contains(&e)), "row {row}");
                        assert!(pos.windows(2).all(|w| w[0] < w[1]), "distinct, increasing");
                        let read: Vec<NodeId> = pos.iter().map(|&e| ds.graph.indices[e]).collect();
                        assert_eq!(read, want.row(i), "fanout {fanout} vertex {v}");
                    }
                }
            }
        }
    }
}
