//! Adam / AdamW over a flat parameter buffer on the device (twin: the CPU backend's Adam,
//! PyTorch's semantics), in place on device-resident values, gradients and moments, bitwise
//! the CPU's update: every step is a rounded operation in the CPU's order, and the constants
//! the CPU computes in `f32` (`1 − β1`, `1 − β2`, `1 − lr·wd`) are computed here on the host
//! the same way.

use anyhow::Result;

use super::{launch, same_device, Args};
use crate::backend::cuda::kernels::per_thread;
use crate::backend::cuda::mat::{DevView, DevViewMut};
use crate::backend::AdamStep;

/// One update of `values` from `grads` with moments `m`, `v` (all the same number of elements;
/// views of flat buffers, e.g. `DevView::of(buf, 0, 1, len)`), with step `c`'s constants (as
/// `nn::adam::Adam::step` computes them: bias corrections in `f64`, then `f32`).
pub fn adam_step(
    values: DevViewMut,
    grads: DevView,
    m: DevViewMut,
    v: DevViewMut,
    c: AdamStep,
) -> Result<()> {
    let n = values.rows() * values.cols();
    assert_eq!(
        grads.rows() * grads.cols(),
        n,
        "adam: gradient count differs"
    );
    assert_eq!(m.rows() * m.cols(), n, "adam: moment count differs");
    assert_eq!(v.rows() * v.cols(), n, "adam: moment count differs");
    same_device(values.device(), grads.device());
    if n == 0 {
        return Ok(());
    }
    launch(
        values.device(),
        "gnn_adam",
        per_thread(n),
        Args::new()
            .ptr(values.ptr())
            .ptr(grads.ptr())
            .ptr(m.ptr())
            .ptr(v.ptr())
            .u64(n)
            .f32(1.0 - c.beta1)
            .f32(c.beta2)
            .f32(1.0 - c.beta2)
            .f32(c.weight_decay)
            .flag(c.decoupled)
            .f32(1.0 - c.lr * c.weight_decay)
            .f32(c.step_size)
            .f32(c.bc2_sqrt)
            .f32(c.eps),
    )
}
