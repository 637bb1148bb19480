//! gnnpar: distributed graph neural network training on HPC clusters.
//!
//! The crate is one library plus the `gnnpar` binary. Modules hold one concern each:
//!
//! * [`graph`]: the in-memory CSR graph and dataset, the versioned HDF5 format, partition files;
//! * [`commands`]: the implementation of each CLI sub-command (argument structs live there too);
//! * [`comm`]: the only module that calls MPI;
//! * [`sample`]: neighbour sampling into per-layer blocks;
//! * [`util`]: atomic output files, progress reporting, HDF5 helpers.
//!
//! See `docs/architecture.md` for how the pieces fit together.

pub mod backend;
pub mod comm;
pub mod commands;
pub mod config;
pub mod exchange;
pub mod graph;
pub mod kinds;
pub mod nn;
pub mod partition;
pub mod presample;
pub mod sample;
pub mod train;
pub mod util;
