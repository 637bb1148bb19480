//! Neural-network layers with explicit forward and backward passes, their parameters in one
//! flat buffer, losses and the Adam optimizer.
//!
//! * [`params`]: the flat parameter / gradient buffers with named views;
//! * [`linear`], [`sage`], [`gcn`], [`gat`], [`mlp`]: layers;
//! * [`layer`]: dropout → conv → activation over one block, the unit strategies schedule;
//! * [`model`]: a stack of layers ([`Model`]);
//! * [`adam`]: the optimizer; [`init`]: seeded initialisation;
//! * [`transposes`]: which blocks a backward reads transposed, so they are built ahead.

pub mod adam;
pub mod gat;
pub mod gcn;
pub mod init;
pub mod layer;
pub mod linear;
pub mod mlp;
pub mod model;
pub mod norm;
pub mod params;
pub mod sage;
pub mod schedule;
pub mod transposes;

pub use crate::backend::cpu::loss::{bce_with_logits, cross_entropy};
pub use adam::Adam;
pub use layer::{DropoutCtx, Layer};
pub use model::{ForwardCache, Model, ModelConfig, ModelKind};
pub use norm::{LayerNorm, NormKind};
pub use params::{ParamEntry, ParamStore};

/// What a backward pass says when its forward ran for inference
/// ([`DropoutCtx::keep_for_backward`] false) and kept no input for it: a caller's bug.
const NOT_KEPT: &str =
    "backward after an inference forward pass (keep_for_backward false): no input was kept";
