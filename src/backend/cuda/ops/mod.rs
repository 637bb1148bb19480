//! The CUDA backend's operations: each a wrapper that checks shapes on the host and launches
//! one or a few kernels of `cuda/*.cu` (or cuBLAS through [`super::blas`]), over the typed
//! device arrays of [`super::mat`]. Each has a CPU twin in [`crate::backend::cpu`] with the
//! same semantics; `tests/cuda_conformance.rs` compares every one with its twin on the
//! emulator and, where there is one, on a GPU.
//!
//! One module per concern:
//! * [`elementwise`]: fill, scale, axpy, sums, row copies (concatenate, pad);
//! * [`gather`]: gather and scatter rows by index;
//! * [`reduce`]: column sums in a fixed order (bias gradients), bitwise the CPU's;
//! * [`activation`]: ReLU / LeakyReLU with one sign bit per element, ELU, their backward;
//! * [`dropout`]: counter-based masks bitwise the CPU's, kept bits, their backward;
//! * [`epilogue`]: a product's bias, ReLU and next-layer dropout in one pass after cuBLAS;
//! * [`graph`]: a block on the device ([`graph::DevGraph`]), its lazily built transpose and
//!   edge weights;
//! * [`aggregate`]: CSR aggregation and its transpose;
//! * [`gat`]: attention logits, edge softmax, attention aggregation and their backward;
//! * [`norm`]: layer normalisation and its backward;
//! * [`sparse`]: mostly-zero input rows as CSR, their products and transposed products;
//! * [`loss`]: cross-entropy and binary cross-entropy with logits;
//! * [`adam`]: the Adam / AdamW update over the flat parameter buffer.
//!
//! Errors are the device's (a failed allocation or launch); shape mismatches are caller bugs
//! and panic, as the CPU kernels do.

pub mod activation;
pub mod adam;
pub mod aggregate;
pub mod dropout;
pub mod elementwise;
pub mod epilogue;
pub mod gat;
pub mod gather;
pub mod graph;
pub mod loss;
pub mod norm;
pub mod reduce;
pub mod sparse;

#[cfg(test)]
pub(crate) mod testing;

use anyhow::{Context, Result};

use super::gpu::{DevPtr, Device, KernelArg, Launch};

/// Kernel arguments, built in the order of the kernel's parameters.
#[derive(Default)]
pub(crate) struct Args(Vec<KernelArg>);

impl Args {
    pub fn new() -> Args {
        Args(Vec::with_capacity(16))
    }

    /// A device pointer (`T*`).
    pub fn ptr(mut self, p: DevPtr) -> Args {
        self.0.push(KernelArg::Ptr(p));
        self
    }

    /// An optional pointer: null when absent.
    pub fn opt(self, p: Option<DevPtr>) -> Args {
        self.ptr(p.unwrap_or(0))
    }

    /// A `gnn_u64`.
    pub fn u64(mut self, v: usize) -> Args {
        self.0.push(KernelArg::U64(v as u64));
        self
    }

    /// A `gnn_u64` given as one.
    pub fn raw_u64(mut self, v: u64) -> Args {
        self.0.push(KernelArg::U64(v));
        self
    }

    /// A `gnn_u32`.
    ///
    /// # Panics
    /// If `v` does not fit 32 bits (a column count past 2³²).
    pub fn u32(mut self, v: usize) -> Args {
        self.0.push(KernelArg::U32(
            u32::try_from(v).expect("kernel argument past 32 bits"),
        ));
        self
    }

    /// A flag (`gnn_u32` 0 or 1).
    pub fn flag(self, v: bool) -> Args {
        self.u32(v as usize)
    }

    /// A `float`.
    pub fn f32(mut self, v: f32) -> Args {
        self.0.push(KernelArg::F32(v));
        self
    }
}

/// Launch `name` on `device` with `args`, naming the kernel in an error.
pub(crate) fn launch(device: &Device, name: &str, launch: Launch, args: Args) -> Result<()> {
    device
        .gpu
        .launch(name, launch, &args.0)
        .with_context(|| format!("kernel {name}"))
}

/// Panic unless two views live on the same device (a caller bug).
pub(crate) fn same_device(a: &Device, b: &Device) {
    assert!(
        std::sync::Arc::ptr_eq(&a.gpu, &b.gpu),
        "operands live on different devices"
    );
}
