//! Inverted dropout with counter-based masks, bitwise the CPU's (twins: `cpu::dropout`,
//! `cpu::bitmask`). Element `(r, j)` is kept when the mask keeps everything (`p = 0`) or
//! `element_hash(seed_r, j) < keep_below`; kept values are scaled by `1/(1−p)`, dropped ones
//! are 0. A row's seed is `mix64(stream ^ mix64(key_r ^ 0x5851_f42d_4c95_7f2d)) as u32`, from the
//! row's key (its ORIGINAL vertex id) — computed on the device from [`RowMask::Keys`], or on
//! the host ([`RowMask::Seeds`], e.g. from a `RowDropout`).
//!
//! Kept bits ([`DevKept`]) have `KeptBits`' layout: rows padded to whole 64-bit words
//! (`words_per_row = ceil(cols / 64)`), bit `j % 64` of word `r·words_per_row + j / 64`.

use anyhow::Result;

use super::{launch, same_device, Args};
use crate::backend::cpu::dropout::DropoutMask;
use crate::backend::cpu::gemm::RowDropout;
use crate::backend::cuda::gpu::{DevPtr, Device};
use crate::backend::cuda::kernels::{per_thread, per_warp};
use crate::backend::cuda::mat::{DevMat, DevVec, DevView, DevViewMut};

/// A dropout mask generator (`DropoutMask`'s numbers): keep threshold, scale, stream.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DevDropout {
    pub stream: u64,
    /// Elements whose hash is below this are kept (all with `keep_all`).
    pub keep_below: u32,
    /// `p == 0`.
    pub keep_all: bool,
    /// `1/(1−p)` as an `f32`.
    pub scale: f32,
}

impl DevDropout {
    /// The mask dropping each element with probability `p` on `stream`, computed as
    /// `DropoutMask::new(stream, p)` computes it.
    ///
    /// # Panics
    /// If `p` is outside `[0, 1)`.
    pub fn new(stream: u64, p: f32) -> DevDropout {
        assert!(
            (0.0..1.0).contains(&p),
            "dropout probability {p} not in [0, 1)"
        );
        let keep = 1.0 - p as f64;
        let threshold = (keep * 4_294_967_296.0).round();
        DevDropout {
            stream,
            keep_below: threshold.min(u32::MAX as f64) as u32,
            keep_all: threshold > u32::MAX as f64,
            scale: (1.0 / keep) as f32,
        }
    }
}

/// Per-row seeds uploaded from the host, with the mask's threshold and scale (what a
/// `RowDropout` or a `DropoutMask` with its row keys describes).
#[derive(Debug)]
pub struct DevRowSeeds {
    pub seeds: DevVec<u32>,
    pub keep_below: u32,
    pub keep_all: bool,
    pub scale: f32,
}

impl DevRowSeeds {
    /// The seeds of a product's fused dropout.
    pub fn from_row_dropout(device: &Device, d: &RowDropout) -> Result<DevRowSeeds> {
        Ok(DevRowSeeds {
            seeds: DevVec::upload(device, &d.seeds)?,
            keep_below: d.keep_below,
            keep_all: false,
            scale: d.scale,
        })
    }

    /// `mask` over rows keyed by `keys` (the seeds hashed on the host).
    pub fn from_mask(device: &Device, mask: &DropoutMask, keys: &[u64]) -> Result<DevRowSeeds> {
        match mask.fused(keys) {
            Some(d) => DevRowSeeds::from_row_dropout(device, &d),
            // p = 0: everything is kept; the seeds are never read.
            None => Ok(DevRowSeeds {
                seeds: DevVec::zeros(device, keys.len())?,
                keep_below: u32::MAX,
                keep_all: true,
                scale: mask.scale(),
            }),
        }
    }

    /// Rows.
    pub fn len(&self) -> usize {
        self.seeds.len()
    }

    /// True when there are no rows.
    pub fn is_empty(&self) -> bool {
        self.seeds.is_empty()
    }
}

/// The dropout of a matrix's rows as a kernel takes it.
#[derive(Clone, Copy, Debug)]
pub enum RowMask<'a> {
    /// A mask and each row's key on the device (seeds hashed by the kernel).
    Keys(&'a DevDropout, &'a DevVec<u64>),
    /// Seeds hashed on the host.
    Seeds(&'a DevRowSeeds),
}

/// The kernel arguments `keys, seeds, stream, keep_below, keep_all, scale` of a mask.
pub(crate) struct MaskArgs {
    pub keys: DevPtr,
    pub seeds: DevPtr,
    pub stream: u64,
    pub keep_below: u32,
    pub keep_all: bool,
    pub scale: f32,
}

impl RowMask<'_> {
    /// Rows it covers.
    pub fn rows(&self) -> usize {
        match self {
            RowMask::Keys(_, keys) => keys.len(),
            RowMask::Seeds(s) => s.len(),
        }
    }

    /// `1/(1−p)`.
    pub fn scale(&self) -> f32 {
        match self {
            RowMask::Keys(m, _) => m.scale,
            RowMask::Seeds(s) => s.scale,
        }
    }

    pub(crate) fn args(&self) -> MaskArgs {
        match *self {
            RowMask::Keys(m, keys) => MaskArgs {
                keys: keys.ptr(),
                seeds: 0,
                stream: m.stream,
                keep_below: m.keep_below,
                keep_all: m.keep_all,
                scale: m.scale,
            },
            RowMask::Seeds(s) => MaskArgs {
                keys: 0,
                seeds: s.seeds.ptr(),
                stream: 0,
                keep_below: s.keep_below,
                keep_all: s.keep_all,
                scale: s.scale,
            },
        }
    }
}

impl Args {
    /// The six mask arguments, in the kernels' order.
    pub(crate) fn mask(self, m: &MaskArgs) -> Args {
        self.ptr(m.keys)
            .ptr(m.seeds)
            .raw_u64(m.stream)
            .u32(m.keep_below as usize)
            .flag(m.keep_all)
            .f32(m.scale)
    }
}

/// Which elements a dropout kept (`KeptBits` on the device).
#[derive(Debug)]
pub struct DevKept {
    pub words_per_row: usize,
    /// `rows · words_per_row` words.
    pub bits: DevVec<u64>,
    /// `1/(1−p)`.
    pub scale: f32,
}

impl DevKept {
    /// Bits for a `rows × cols` matrix, uninitialised (a kernel writes every word).
    fn uninit(device: &Device, rows: usize, cols: usize, scale: f32) -> Result<DevKept> {
        let words_per_row = cols.div_ceil(64);
        Ok(DevKept {
            words_per_row,
            bits: DevVec::uninit(device, rows * words_per_row)?,
            scale,
        })
    }

    /// The kept bits a fused product recorded for a `rows × cols` output (bit `i·cols + j`,
    /// `cols` a multiple of 64: the same words).
    pub fn from_product(rows: usize, cols: usize, scale: f32, bits: DevVec<u64>) -> DevKept {
        assert!(cols.is_multiple_of(64), "dropout bits: whole words per row");
        assert_eq!(bits.len(), rows * cols / 64, "dropout bits: shape");
        DevKept {
            words_per_row: cols / 64,
            bits,
            scale,
        }
    }

    /// Rows these bits cover.
    pub fn rows(&self) -> usize {
        self.bits.len().checked_div(self.words_per_row).unwrap_or(0)
    }

    /// Panic unless these bits belong to a `rows × cols` matrix.
    pub fn check_shape(&self, rows: usize, cols: usize) {
        assert_eq!(
            (rows * self.words_per_row, self.words_per_row),
            (self.bits.len(), cols.div_ceil(64)),
            "dropout bits: shape"
        );
    }

    /// `g ← mask(g)` from the bits: the dropout's backward, bitwise what masking with the
    /// forward's keys gives.
    pub fn apply_in_place(&self, g: DevViewMut) -> Result<()> {
        let (rows, cols) = g.dim();
        self.check_shape(rows, cols);
        if rows == 0 || cols == 0 {
            return Ok(());
        }
        launch(
            g.device(),
            "gnn_dropout_from_bits",
            per_warp(rows),
            Args::new()
                .ptr(g.ptr())
                .u64(rows)
                .u32(cols)
                .ptr(self.bits.ptr())
                .u32(self.words_per_row)
                .f32(self.scale),
        )
    }

    /// These bits and'ed with `positive`, a ReLU's signs over the same matrix (flat layout),
    /// when the rows are whole words (`cols` a multiple of 64) so both layouts agree; `None`
    /// otherwise (`KeptBits::and_positive`).
    pub fn and_positive(&self, cols: usize, positive: &DevVec<u64>) -> Result<Option<DevKept>> {
        let whole_words = cols.is_multiple_of(64) && self.words_per_row == cols / 64;
        if !whole_words || positive.len() < self.bits.len() {
            return Ok(None);
        }
        let n = self.bits.len();
        let bits = DevVec::<u64>::uninit(self.bits.device(), n)?;
        if n > 0 {
            launch(
                bits.device(),
                "gnn_bits_and",
                per_thread(n),
                Args::new()
                    .ptr(bits.ptr())
                    .ptr(self.bits.ptr())
                    .ptr(positive.ptr())
                    .u64(n),
            )?;
        }
        Ok(Some(DevKept {
            words_per_row: self.words_per_row,
            bits,
            scale: self.scale,
        }))
    }
}

/// `dst ← mask(src)` (`dst` may be `src`), recording into `kept` when given.
fn run(
    src: DevPtr,
    dst: DevPtr,
    dim: (usize, usize),
    mask: RowMask,
    kept: Option<&DevKept>,
    device: &Device,
) -> Result<()> {
    let (rows, cols) = dim;
    assert_eq!(mask.rows(), rows, "dropout: one key per row");
    if rows == 0 || cols == 0 {
        return Ok(());
    }
    let words = cols.div_ceil(64);
    launch(
        device,
        "gnn_dropout_rows",
        per_warp(rows),
        Args::new()
            .ptr(src)
            .ptr(dst)
            .u64(rows)
            .u32(cols)
            .mask(&mask.args())
            .opt(kept.map(|k| k.bits.ptr()))
            .u32(words),
    )
}

/// `x ← mask(x)` without recording (also the backward when only the keys were kept).
pub fn apply_in_place(x: DevViewMut, mask: RowMask) -> Result<()> {
    run(x.ptr(), x.ptr(), x.dim(), mask, None, x.device())
}

/// A masked copy of `x`.
pub fn apply(x: DevView, mask: RowMask) -> Result<DevMat> {
    let out = DevMat::uninit(x.device(), x.rows(), x.cols())?;
    run(x.ptr(), out.view().ptr(), x.dim(), mask, None, x.device())?;
    Ok(out)
}

/// A masked copy of `x` and the kept elements.
pub fn apply_recorded(x: DevView, mask: RowMask) -> Result<(DevMat, DevKept)> {
    let out = DevMat::uninit(x.device(), x.rows(), x.cols())?;
    let kept = DevKept::uninit(x.device(), x.rows(), x.cols(), mask.scale())?;
    run(
        x.ptr(),
        out.view().ptr(),
        x.dim(),
        mask,
        Some(&kept),
        x.device(),
    )?;
    Ok((out, kept))
}

/// `x ← mask(x)`, returning the kept elements (bitwise [`apply_recorded`]).
pub fn apply_recorded_in_place(x: DevViewMut, mask: RowMask) -> Result<DevKept> {
    let kept = DevKept::uninit(x.device(), x.rows(), x.cols(), mask.scale())?;
    run(x.ptr(), x.ptr(), x.dim(), mask, Some(&kept), x.device())?;
    same_device(x.device(), kept.bits.device());
    Ok(kept)
}
