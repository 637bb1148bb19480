//! Neighbour sampling into per-layer blocks (message-flow graphs).

pub mod block;

pub use block::Block;
