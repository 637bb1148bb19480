//! Hybrid parallelism (GSplit's hybrid): data parallel across nodes, split parallel inside a
//! node.
//!
//! Every node holds a full replica of the graph, partitioned over its own ranks (node-local
//! rank `r` loads part `r`; see [`data_group`]). The global mini-batch is dealt out to the
//! nodes by position (seed `i` goes to node `i mod nodes`), and the ranks of a node run
//! `split_step` on the node's share over the node communicator: hidden rows move only
//! inside a node, where links are fast, and nothing but the gradient allreduce crosses
//! nodes. The trainer sums gradients and loss over the whole world, so the update is the
//! one of the whole global mini-batch (invariant 4); with one node hybrid is split, with
//! one rank per node it is GDP with replicated data.

use crate::comm::{Group, World};
use crate::graph::NodeId;
use crate::kinds::Strategy;
use std::borrow::Cow;

/// The ranks a strategy partitions the graph over: the node for `hybrid` (each node holds
/// the whole graph), the world otherwise. Data loading, the feature store and its cache,
/// sampling, and full-graph evaluation all run over this group.
pub fn data_group(world: &World, strategy: Strategy) -> &Group {
    if strategy == Strategy::Hybrid {
        world.node()
    } else {
        world
    }
}

/// The seeds of `batch` node `node` of `nodes` trains: those at positions `node`,
/// `node + nodes`, … A fixed rule over the global batch, so every rank agrees without
/// talking, and the shares are disjoint and cover the batch.
pub fn node_share(batch: &[NodeId], node: usize, nodes: usize) -> Vec<NodeId> {
    batch
        .iter()
        .skip(node)
        .step_by(nodes.max(1))
        .copied()
        .collect()
}

/// The group and the seeds a split-family step runs on: under `hybrid`, the node and its
/// share of `batch` (the node's ranks then run [`split_step`](super::split::split_step) on
/// it; the trainer allreduces gradients and loss over the world); under `split`, the world
/// and the whole batch.
pub fn split_scope<'w, 'b>(
    world: &'w World,
    strategy: Strategy,
    batch: &'b [NodeId],
) -> (&'w Group, Cow<'b, [NodeId]>) {
    let seeds = split_seeds(strategy, batch, world.node_index());
    (data_group(world, strategy), seeds)
}

/// The seeds of `batch` a split-family step of node `node` of `nodes` runs on: the node's
/// share under `hybrid`, else the whole batch ([`split_scope`] without the world, for
/// threads that cannot hold it).
pub fn split_seeds(
    strategy: Strategy,
    batch: &[NodeId],
    (node, nodes): (usize, usize),
) -> Cow<'_, [NodeId]> {
    if strategy == Strategy::Hybrid {
        Cow::Owned(node_share(batch, node, nodes))
    } else {
        Cow::Borrowed(batch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_shares_are_disjoint_and_cover_the_batch() {
        let batch: Vec<NodeId> = vec![9, 4, 7, 1, 3];
        let shares: Vec<Vec<NodeId>> = (0..2).map(|n| node_share(&batch, n, 2)).collect();
        assert_eq!(shares, vec![vec![9, 7, 3], vec![4, 1]]);
        assert_eq!(node_share(&batch, 0, 1), batch);
        // More nodes than seeds: some nodes get nothing.
        assert!(node_share(&batch, 6, 7).is_empty());
        let mut all: Vec<NodeId> = (0..3).flat_map(|n| node_share(&batch, n, 3)).collect();
        all.sort_unstable();
        assert_eq!(all, vec![1, 3, 4, 7, 9]);
    }
}
