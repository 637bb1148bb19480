//! What crosses ranks, between `comm` (the MPI calls) and `train` (the strategies): row
//! exchange plans (`plan`: one shuffle plan, rows forward and summed gradients back),
//! owner-computes sampling (`sampling`), partial aggregation on the sources' owners (`partial`,
//! SNP), the collectives of feature-sliced training (`slices`, NFP), the feature store with its cache of remote rows (`store`), its rows in host shared memory (`host_rows`) and its rows on the wire without their zeros (`packed_rows`), and full-graph layers over
//! owned vertices plus a halo (`inference`).
//!
//! Vertices are owned in contiguous ranges (`offsets[r]..offsets[r+1]` on rank `r`,
//! ARCHITECTURE invariant 1); a rank holds the adjacency, features and labels of its own
//! vertices only and asks owners for everything else.

pub mod host_rows;
pub mod inference;
pub mod packed_rows;
pub mod partial;
pub mod plan;
pub mod sampling;
pub mod slices;
pub mod store;

pub use plan::RowExchange;
pub use sampling::sample_blocks_distributed;
pub use store::FeatureStore;
