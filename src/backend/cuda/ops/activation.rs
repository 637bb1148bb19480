//! Activations and their backward (twin: `cpu::activation`). ReLU and LeakyReLU keep one bit
//! per element saying whether the output is positive, in `Saved::Positive`'s layout: flat over
//! the row-major elements, bit `i % 64` of word `i / 64`; ELU keeps its output. Bitwise the
//! CPU's for ReLU and LeakyReLU (values and bits); ELU's `expm1` is the device's.

use anyhow::Result;

use super::{launch, same_device, Args};
use crate::backend::cpu::activation::Activation;
use crate::backend::cuda::kernels::{per_thread, per_warp};
use crate::backend::cuda::mat::{DevMat, DevVec, DevView, DevViewMut};

/// What an activation's backward needs from its forward.
#[derive(Debug)]
pub enum DevSaved {
    /// ReLU, LeakyReLU: whether each output is positive, `ceil(rows·cols / 64)` words.
    Positive(DevVec<u64>),
    /// ELU: the output.
    Output(DevMat),
}

/// The kernels' `(kind, param)` of an activation.
fn code(act: Activation) -> (usize, f32) {
    match act {
        Activation::Relu => (0, 0.0),
        Activation::LeakyRelu { slope } => (1, slope),
        Activation::Elu { alpha } => (2, alpha),
    }
}

fn elements(x: &DevViewMut) -> usize {
    x.rows() * x.cols()
}

/// `x ← act(x)`.
pub fn forward_in_place(act: Activation, x: DevViewMut) -> Result<()> {
    let n = elements(&x);
    if n == 0 {
        return Ok(());
    }
    let (kind, param) = code(act);
    launch(
        x.device(),
        "gnn_activate",
        per_thread(n),
        Args::new().ptr(x.ptr()).u64(n).u32(kind).f32(param),
    )
}

/// `x ← act(x)`, keeping what the backward needs: ReLU / LeakyReLU record the signs in the
/// same pass, ELU copies its output.
pub fn forward_save(act: Activation, mut x: DevViewMut) -> Result<DevSaved> {
    let n = elements(&x);
    if let Activation::Elu { .. } = act {
        forward_in_place(act, x.reborrow())?;
        return Ok(DevSaved::Output(x.view().to_owned()?));
    }
    let bits = DevVec::<u64>::uninit(x.device(), n.div_ceil(64))?;
    if n > 0 {
        let (kind, param) = code(act);
        launch(
            x.device(),
            "gnn_activate_bits",
            per_warp(n.div_ceil(64)),
            Args::new()
                .ptr(x.ptr())
                .u64(n)
                .u32(kind)
                .f32(param)
                .ptr(bits.ptr()),
        )?;
    }
    Ok(DevSaved::Positive(bits))
}

/// The signs of `y` (bit `i` ← `y[i] > 0`), leaving `y` as it is (`Activation::save` of a
/// ReLU's output).
pub fn pack_positive(y: DevView) -> Result<DevVec<u64>> {
    let n = y.rows() * y.cols();
    let bits = DevVec::<u64>::uninit(y.device(), n.div_ceil(64))?;
    if n > 0 {
        launch(
            y.device(),
            "gnn_pack_positive",
            per_warp(n.div_ceil(64)),
            Args::new().ptr(y.ptr()).u64(n).ptr(bits.ptr()),
        )?;
    }
    Ok(bits)
}

/// `g ← g ⊙ act'(·)` from what [`forward_save`] kept.
///
/// # Panics
/// If ELU's saved output is missing (bits given), or the shapes disagree.
pub fn backward_saved(act: Activation, saved: &DevSaved, g: DevViewMut) -> Result<()> {
    match saved {
        DevSaved::Output(y) => backward_in_place(act, y.view(), g),
        DevSaved::Positive(bits) => {
            let other = match act {
                Activation::Relu => 0.0,
                Activation::LeakyRelu { slope } => slope,
                Activation::Elu { .. } => panic!("ELU needs its output, not its signs"),
            };
            scale_by_bits(bits, other, g)
        }
    }
}

/// `g[i] ← g[i]·(bit i ? 1 : other)` over the flat elements of `g`.
pub fn scale_by_bits(bits: &DevVec<u64>, other: f32, g: DevViewMut) -> Result<()> {
    let n = elements(&g);
    assert!(
        bits.len() * 64 >= n,
        "activation backward: {} bit words for {n} elements",
        bits.len()
    );
    same_device(bits.device(), g.device());
    if n == 0 {
        return Ok(());
    }
    launch(
        g.device(),
        "gnn_scale_by_bits",
        per_thread(n),
        Args::new().ptr(g.ptr()).u64(n).ptr(bits.ptr()).f32(other),
    )
}

/// `g ← g ⊙ act'(x)` given the forward's output `y`.
pub fn backward_in_place(act: Activation, y: DevView, g: DevViewMut) -> Result<()> {
    assert_eq!(y.dim(), g.dim(), "activation backward: shapes differ");
    let n = elements(&g);
    if n == 0 {
        return Ok(());
    }
    let (kind, param) = code(act);
    launch(
        g.device(),
        "gnn_activate_backward",
        per_thread(n),
        Args::new()
            .ptr(g.ptr())
            .ptr(y.ptr())
            .u64(n)
            .u32(kind)
            .f32(param),
    )
}
