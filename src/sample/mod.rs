//! Neighbour sampling into per-layer blocks (message-flow graphs).
//!
//! # Conventions
//!
//! * **Direction.** Messages flow along block edges from a source to a destination, and a
//!   destination aggregates over its in-neighbours. The stored neighbour list of `v` in a
//!   [`Dataset`](crate::graph::Dataset) is taken as the vertices whose messages `v` receives:
//!   the sampler samples entries of that list, and [`full_block`] uses it unchanged. For an
//!   undirected graph (stored both ways) this is the only reading; for a directed graph it
//!   means a stored edge `u → w` lets `u` aggregate `w`. (DGL samples in-edges instead;
//!   importers that want DGL's reading store the reverse lists.)
//! * **Fanouts** count from the seeds outward (ARCHITECTURE invariant 5): `fanouts[0]` is
//!   applied to the seeds with [`LayerKey::layer`] 0 and produces the last block;
//!   [`sample_blocks`] returns blocks input layer first.
//! * **Randomness** is counter-based ([`rng`]): a vertex's sample is a pure function of
//!   `(seed, epoch, batch, layer, original id)` and its neighbour list, and the batches of an
//!   epoch a pure function of `(seed, epoch)` and the original ids of the training set, so
//!   they do not depend on who samples, on the thread count, or on the partitioning
//!   (ARCHITECTURE invariant 3).

pub mod ahead;
pub mod batches;
pub mod block;
pub mod build;
pub mod hop;
pub mod neighbor;
pub mod positions;
pub mod rng;

pub use batches::{epoch_batches, seed_order_key};
pub use block::Block;
pub use build::{
    build_block, build_block_forced, build_block_with, full_block, sample_blocks,
    sample_blocks_with, BatchKey, LocalIds,
};
pub use hop::{sample_hop, sample_hop_pipelined};
pub use neighbor::{sample_count, sample_neighbors, Adjacency, LayerKey, LocalGraph, Sampled};
