//! Distributed pieces between `comm` and `train`: row exchange plans, owner-computes sampling,
//! partial aggregation on source owners (SNP), the feature store with its cache, and
//! distributed full-graph inference.
//!
//! Vertices are owned in contiguous ranges (`offsets[r]..offsets[r+1]` on rank `r`,
//! ARCHITECTURE invariant 1); a rank holds the adjacency, features and labels of its own
//! vertices only and asks owners for everything else.

pub mod inference;
pub mod partial;
pub mod plan;
pub mod sampling;
pub mod store;

pub use plan::RowExchange;
pub use sampling::sample_blocks_distributed;
pub use store::FeatureStore;
