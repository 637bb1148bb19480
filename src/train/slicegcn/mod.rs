//! SliceGCN (`--strategy slicegcn`): every rank holds the whole graph and a slice of the
//! feature columns (or, with feature fusion, a shared learned projection of all of them), runs
//! its own narrow GCN on the whole graph with no communication between layers, adds a learned
//! slice encoding, and the slice outputs are gathered side by side into a shared MLP
//! classifier. A different model from the one-rank GCN by design (`docs/architecture.md`).
//!
//! * [`layout`]: which columns and widths a rank has, and its parameter counts;
//! * [`data`]: loading the whole topology with only the rank's columns;
//! * [`model`]: the per-rank model, its forward and backward;
//! * [`run`]: the training loop, evaluation and checkpoints.

pub mod data;
pub mod layout;
pub mod model;
pub mod run;

pub use layout::{param_counts, SliceLayout};
pub use model::{SliceInput, SliceModel};
pub use run::SliceTrainer;
