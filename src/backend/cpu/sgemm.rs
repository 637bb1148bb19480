//! A packed, cache-blocked `f32` matrix product with AVX-512 and AVX2 micro-kernels, run on
//! one thread over one tile of the output ([`super::gemm`] splits products into such tiles).
//!
//! `matrixmultiply` (what `ndarray` uses) reaches about a fifth of an AVX-512 machine's peak
//! on GNN shapes, and about 70% of an AVX2 machine's; it also cannot apply a bias, ReLU or
//! dropout as it stores. This is the classic BLIS loop nest:
//!
//! * `B` is packed once per product ([`PackedB`]) into `NR`-column panels of `KC` rows (row
//!   `p` of a panel is `NR` contiguous floats), so the micro-kernel streams it from L1;
//! * a row-major `A` is read in place, `MC × KC` blocks at a time (the kernel broadcasts from
//!   its `MR` rows); other layouts are packed into `MR`-row panels;
//! * the micro-kernel keeps an `MR × NR` = 12 × 32 tile of `C` in 24 zmm registers and does
//!   `kc` rank-1 updates (`avx512`); without AVX-512 it does the same as four 6 × 16
//!   sub-tiles of 12 ymm registers (`avx2`).
//!
//! # Determinism
//! Every element `C[i, j]` is computed the same way wherever it lies in a tile: one fused
//! multiply-add chain over `p` per `KC` block, blocks added to `C` in increasing `p`. The
//! result therefore depends on the shape only, never on how the caller splits rows or columns
//! among threads, nor on which of the two kernels runs.

#![cfg(target_arch = "x86_64")]

use crate::backend::cpu::simd::{level, Level};
use crate::util::prefetch::prefetch_span;

mod avx2;
mod avx512;

/// Rows of the micro-kernel's tile.
pub const MR: usize = 12;
/// Columns of the micro-kernel's tile (two zmm registers).
pub const NR: usize = 32;
/// Depth of one packed block: `KC·NR` floats of `B` (32 KiB) stay in L1.
pub const KC: usize = 256;
/// Rows of one packed block of `A` (`MC·KC` floats = 144 KiB, in L2).
const MC: usize = 12 * MR;
/// Columns of one packed block of `B` (`KC·NC` floats = 1 MiB, in L2).
const NC: usize = 32 * NR;

/// The micro-kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Isa {
    Avx512,
    Avx2,
}

/// The kernel this CPU runs best, if any (from [`level`], detected once).
pub fn isa() -> Option<Isa> {
    match level() {
        Level::Avx512 => Some(Isa::Avx512),
        Level::Avx2 => Some(Isa::Avx2),
        Level::Base => None,
    }
}

/// True when this CPU can run one of the kernels.
pub fn available() -> bool {
    isa().is_some()
}

/// A read-only strided matrix: element `(i, j)` is at `ptr + i·rs + j·cs`.
#[derive(Clone, Copy, Debug)]
pub struct MatRef {
    pub ptr: *const f32,
    pub rows: usize,
    pub cols: usize,
    pub rs: isize,
    pub cs: isize,
}

/// A writable matrix with unit column stride: element `(i, j)` is at `ptr + i·rs + j`.
#[derive(Clone, Copy, Debug)]
pub struct MatMut {
    pub ptr: *mut f32,
    pub rows: usize,
    pub cols: usize,
    pub rs: isize,
}

// SAFETY: these are plain descriptions of memory; the driver hands disjoint output tiles to
// different threads and only reads the inputs.
unsafe impl Send for MatRef {}
unsafe impl Sync for MatRef {}
unsafe impl Send for MatMut {}
unsafe impl Sync for MatMut {}

impl MatRef {
    /// The matrix an `ndarray` view describes (any strides).
    pub fn of(a: &ndarray::ArrayView2<f32>) -> MatRef {
        MatRef {
            ptr: a.as_ptr(),
            rows: a.nrows(),
            cols: a.ncols(),
            rs: a.strides()[0],
            cs: a.strides()[1],
        }
    }

    /// The `rows × cols` sub-matrix starting at `(i, j)`.
    ///
    /// # Safety
    /// The sub-matrix must lie inside `self`.
    pub unsafe fn sub(&self, i: usize, j: usize, rows: usize, cols: usize) -> MatRef {
        MatRef {
            ptr: self.ptr.offset(i as isize * self.rs + j as isize * self.cs),
            rows,
            cols,
            rs: self.rs,
            cs: self.cs,
        }
    }

    #[inline(always)]
    unsafe fn at(&self, i: usize, j: usize) -> f32 {
        *self.ptr.offset(i as isize * self.rs + j as isize * self.cs)
    }
}

impl MatMut {
    /// The `rows × cols` sub-matrix starting at `(i, j)`.
    ///
    /// # Safety
    /// The sub-matrix must lie inside `self`.
    pub unsafe fn sub(&self, i: usize, j: usize, rows: usize, cols: usize) -> MatMut {
        MatMut {
            ptr: self.ptr.offset(i as isize * self.rs + j as isize),
            rows,
            cols,
            rs: self.rs,
        }
    }
}

/// What a tile does after its last inner block, before storing: add a bias row, then ReLU
/// while recording which outputs are positive, then the next layer's input dropout while
/// recording which outputs are kept. Each is optional (null pointers).
#[derive(Clone, Copy, Debug)]
pub struct Epilogue {
    /// `bias[j]` is added to column `j` of the whole product.
    pub bias: *const f32,
    /// Bit `i·ld + j` (in 32-bit words, little-endian within the caller's 64-bit words) gets
    /// `out[i, j] > 0` for the whole product's row `i`, column `j`; ReLU is applied.
    pub relu_bits: *mut u32,
    /// Row length of the bit layouts (the product's columns, a multiple of 32).
    pub ld: usize,
    /// Where the tile handed to [`gemm_tile`] starts in the whole product (row, column).
    pub origin: (usize, usize),
    /// The dropout, when `drop_seeds` is not null: output `(i, j)` is kept when
    /// `element_hash(drop_seeds[i], j) < keep_below` (scaled by `drop_scale`) and zeroed
    /// otherwise, as [`super::dropout::DropoutMask`] does, recording bit `i·ld + j` of
    /// `drop_bits` like `relu_bits`.
    pub drop_seeds: *const u32,
    pub drop_bits: *mut u32,
    pub keep_below: u32,
    pub drop_scale: f32,
}

impl Epilogue {
    /// No bias, no activation, no dropout.
    pub const NONE: Epilogue = Epilogue {
        bias: std::ptr::null(),
        relu_bits: std::ptr::null_mut(),
        ld: 0,
        origin: (0, 0),
        drop_seeds: std::ptr::null(),
        drop_bits: std::ptr::null_mut(),
        keep_below: 0,
        drop_scale: 1.0,
    };

    /// True when it does nothing.
    pub fn is_none(&self) -> bool {
        self.bias.is_null() && self.relu_bits.is_null() && self.drop_seeds.is_null()
    }

    /// This epilogue for the sub-tile at `(i, j)` of the current one.
    pub fn at(self, i: usize, j: usize) -> Epilogue {
        Epilogue {
            origin: (self.origin.0 + i, self.origin.1 + j),
            ..self
        }
    }
}

// SAFETY: as for MatMut: the driver hands disjoint tiles (and disjoint 32-bit words of the
// bit set, since tiles start at multiples of NR = 32 columns) to different threads.
unsafe impl Send for Epilogue {}
unsafe impl Sync for Epilogue {}

/// Packing buffers, reused across calls on one thread.
#[derive(Default)]
pub struct Workspace {
    a: Vec<f32>,
    b: PackedB,
}

/// Where a tile reads `B` from.
#[derive(Clone, Copy)]
pub enum BSource<'a> {
    /// Packed once for the whole product; the tile's columns start at `j0` (a multiple of
    /// `NR`) and its inner range at `p0` (a multiple of `KC`).
    Shared {
        packed: &'a PackedB,
        p0: usize,
        j0: usize,
    },
    /// The tile's own `k × n` block of `B`, packed here one `KC` block at a time (for a
    /// large row-major `B`, which each tile then packs while it is hot in cache).
    Own(MatRef),
}

/// A 64-byte aligned slice of `len` floats inside `v` (grown as needed): aligned panels keep
/// every zmm load inside one cache line.
fn aligned(v: &mut Vec<f32>, len: usize) -> &mut [f32] {
    if v.len() < len + 16 {
        v.resize(len + 16, 0.0);
    }
    let skip = v.as_ptr().align_offset(64).min(15);
    &mut v[skip..skip + len]
}

/// All of `B` (`k × n`) packed once per product and shared by every tile: for each `KC`
/// block of rows starting at `pc`, `NR`-column panels of `kc` rows each, at offset
/// `pc·npad + panel·kc·NR` (`npad` = `n` rounded up to `NR`). A panel holds the kernel's
/// column slices one after the other ([`Isa::slice_width`] columns, `kc` rows each, a row's
/// columns contiguous), so that the slice a kernel call reads is one contiguous block that
/// spreads over every L1 set. Packing per product instead of per tile matters most for a
/// transposed `B` (`Wᵀ`), whose packing is a scalar transpose.
#[derive(Default)]
pub struct PackedB {
    buf: Vec<f32>,
    skip: usize,
    k: usize,
    npad: usize,
}

impl PackedB {
    /// Pack `b` for `isa`'s kernel into this buffer (reusing its memory), in parallel over
    /// panels.
    ///
    /// # Safety
    /// `b` must describe valid memory.
    pub unsafe fn pack(&mut self, b: MatRef, isa: Isa) {
        use rayon::prelude::*;
        let (k, n) = (b.rows, b.cols);
        let npad = n.next_multiple_of(NR);
        self.k = k;
        self.npad = npad;
        let len = k * npad;
        if self.buf.len() < len + 16 {
            self.buf.resize(len + 16, 0.0);
        }
        self.skip = self.buf.as_ptr().align_offset(64).min(15);
        let data = &mut self.buf[self.skip..self.skip + len];
        // One task per (KC block, panel); the regions are disjoint.
        let mut jobs = Vec::with_capacity(k.div_ceil(KC) * (npad / NR));
        let mut rest: &mut [f32] = data;
        for pc in (0..k).step_by(KC) {
            let kc = KC.min(k - pc);
            for j in 0..npad / NR {
                let (panel, tail) = rest.split_at_mut(kc * NR);
                jobs.push((pc, kc, j, panel));
                rest = tail;
            }
        }
        jobs.into_par_iter()
            .with_min_len(16)
            .for_each(|(pc, kc, j, panel)| {
                let j0 = j * NR;
                // SAFETY: the panel lies inside `b` (caller's contract).
                unsafe { pack_b_panel(b.sub(pc, j0, kc, NR.min(n - j0)), panel, isa) }
            });
    }

    /// Pack rows `pc..pc + kc` of `b` (serially) for `isa`, as the only `KC` block.
    unsafe fn pack_block(&mut self, b: MatRef, pc: usize, kc: usize, isa: Isa) {
        let n = b.cols;
        let npad = n.next_multiple_of(NR);
        self.k = kc;
        self.npad = npad;
        let len = kc * npad;
        if self.buf.len() < len + 16 {
            self.buf.resize(len + 16, 0.0);
        }
        self.skip = self.buf.as_ptr().align_offset(64).min(15);
        let data = &mut self.buf[self.skip..self.skip + len];
        if b.cs == 1 && n == npad {
            // Row by row: each source row is read once, in order, and scattered into the
            // panels (reading a panel at a time would stride through all `kc` rows per panel).
            let out = data.as_mut_ptr();
            let sw = isa.slice_width();
            for p in 0..kc {
                let src = b.ptr.offset((pc + p) as isize * b.rs);
                for j in 0..npad / NR {
                    let panel = out.add(j * kc * NR);
                    for s in 0..NR / sw {
                        copy_row(
                            src.add(j * NR + s * sw),
                            panel.add(s * kc * sw + p * sw),
                            sw,
                        );
                    }
                }
            }
            return;
        }
        for (j, panel) in data.chunks_exact_mut(kc * NR).enumerate() {
            let j0 = j * NR;
            pack_b_panel(b.sub(pc, j0, kc, NR.min(n - j0)), panel, isa);
        }
    }

    /// The packed panel of columns `j0..j0 + NR` (`j0` a multiple of `NR`) in the `KC` block
    /// starting at row `pc`.
    #[inline]
    pub(crate) fn panel(&self, pc: usize, j0: usize) -> *const f32 {
        let kc = KC.min(self.k - pc);
        debug_assert!(j0.is_multiple_of(NR) && j0 < self.npad);
        self.buf[self.skip + pc * self.npad + j0 * kc..].as_ptr()
    }
}

/// `c = alpha·a·b + beta·c` on one thread (`beta == 0` overwrites `c` without reading it),
/// for the output columns `j0..j0 + c.cols` (`j0` a multiple of `NR`) and the inner range
/// `p0..p0 + a.cols` (`p0` a multiple of `KC`) of the product whose `B` is `packed`.
///
/// # Safety
/// The CPU must support `isa` ([`isa`] returns it or [`Isa::Avx2`] on an AVX-512 CPU); `a`
/// is `m×k`, `c` is `m×n` inside `packed`'s columns, all in bounds, and `c` overlaps neither
/// input.
#[allow(clippy::too_many_arguments)]
pub unsafe fn gemm_tile(
    isa: Isa,
    alpha: f32,
    a: MatRef,
    b: BSource,
    beta: f32,
    c: MatMut,
    ws: &mut Workspace,
    epi: Epilogue,
) {
    let (m, k, n) = (a.rows, a.cols, c.cols);
    debug_assert_eq!(c.rows, m);
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        debug_assert!(epi.is_none(), "an epilogue needs a non-empty product");
        scale_rows(c, beta);
        return;
    }
    // A row-major `A` is read in place (broadcasts straight from its rows); other layouts
    // are packed into MR-row panels.
    let direct = a.cs == 1;
    let Workspace { a: ws_a, b: ws_b } = ws;
    for jc in (0..n).step_by(NC) {
        let nc = NC.min(n - jc);
        let b_panels = nc.div_ceil(NR);
        for pc in (0..k).step_by(KC) {
            let kc = KC.min(k - pc);
            let first = pc == 0;
            let tile_epi = if pc + kc == k { epi } else { Epilogue::NONE };
            // The packed B of this block, and the offsets of its columns and rows in it.
            let (packed, pb, jb): (&PackedB, usize, usize) = match b {
                BSource::Shared { packed, p0, j0 } => (packed, p0 + pc, j0 + jc),
                BSource::Own(own) => {
                    ws_b.pack_block(own.sub(0, jc, k, nc), pc, kc, isa);
                    (&*ws_b, 0, 0)
                }
            };
            for ic in (0..m).step_by(MC) {
                let mc = MC.min(m - ic);
                let a_panels = mc.div_ceil(MR);
                let ablk = a.sub(ic, pc, mc, kc);
                let aptr = if direct {
                    ablk.ptr
                } else {
                    let abuf = aligned(ws_a, a_panels * a_panel_stride(kc));
                    pack_a(ablk, abuf);
                    abuf.as_ptr()
                };
                for jr in 0..b_panels {
                    let nr = NR.min(nc - jr * NR);
                    let bptr = packed.panel(pb, jb + jr * NR);
                    // Every row panel runs against one column slice of the B panel before the
                    // next slice, so that the slice stays in L1 while A streams from L2.
                    for slice in 0..isa.slices() {
                        if slice * NR / isa.slices() >= nr {
                            break;
                        }
                        for ir in 0..a_panels {
                            let mr = MR.min(mc - ir * MR);
                            let tile = c.sub(ic + ir * MR, jc + jr * NR, mr, nr);
                            let beta = if first { beta } else { 1.0 };
                            let overwrite = first && beta == 0.0;
                            let e = tile_epi.at(ic + ir * MR, jc + jr * NR);
                            let (ap, rsa) = if direct {
                                (aptr.offset((ir * MR) as isize * a.rs), a.rs)
                            } else {
                                (aptr.add(ir * a_panel_stride(kc)), 0)
                            };
                            let args = (kc, ap, rsa, bptr, tile, alpha, beta, overwrite, e);
                            if direct {
                                kernel::<true>(isa, slice, args);
                            } else {
                                kernel::<false>(isa, slice, args);
                            }
                        }
                    }
                }
            }
        }
    }
}

/// What every micro-kernel takes: the depth `kc`, `A` (a row pointer and its stride, or a
/// packed panel and 0), the packed `B` panel, the output tile, `alpha`, `beta`, whether to
/// overwrite the tile, and the epilogue.
pub(super) type KernelArgs = (
    usize,
    *const f32,
    isize,
    *const f32,
    MatMut,
    f32,
    f32,
    bool,
    Epilogue,
);

impl Isa {
    /// Columns of the slices the kernel covers a tile in, one pass over `kc` each.
    pub fn slice_width(self) -> usize {
        match self {
            Isa::Avx512 => NR,
            Isa::Avx2 => avx2::SC,
        }
    }

    /// Column slices of a tile.
    fn slices(self) -> usize {
        NR / self.slice_width()
    }
}

/// The micro-kernel of `isa` on column slice `slice` of one tile (see [`avx512::kernel`]).
#[inline(always)]
unsafe fn kernel<const DIRECT: bool>(isa: Isa, slice: usize, args: KernelArgs) {
    match isa {
        Isa::Avx512 => avx512::kernel::<DIRECT>(args),
        Isa::Avx2 => avx2::kernel::<DIRECT>(slice, args),
    }
}

/// `c *= beta` (`beta == 0` writes zeros, whatever `c` held).
unsafe fn scale_rows(c: MatMut, beta: f32) {
    for i in 0..c.rows {
        let row = std::slice::from_raw_parts_mut(c.ptr.offset(i as isize * c.rs), c.cols);
        if beta == 0.0 {
            row.fill(0.0);
        } else {
            row.iter_mut().for_each(|v| *v *= beta);
        }
    }
}

/// Floats from one packed `A` panel of depth `kc` to the next. The padding of one cache line
/// keeps the panels off the same L1 sets: a transposed `A` is packed by writing one step into
/// every panel in turn, and `kc·MR` floats is a multiple of 4 KiB when `kc` is 256.
fn a_panel_stride(kc: usize) -> usize {
    kc * MR + 16
}

/// Pack `a` (`mc × kc`) into `MR`-row panels [`a_panel_stride`] floats apart, zero-padding
/// the last one.
unsafe fn pack_a(a: MatRef, buf: &mut [f32]) {
    let (mc, kc) = (a.rows, a.cols);
    let stride = a_panel_stride(kc);
    let panels = mc.div_ceil(MR);
    if a.rs == 1 {
        // Column-major source (a transposed view): step `p` of every panel lies in one
        // contiguous source column, so read the columns in order (streaming) and scatter each
        // into the panels; reading a panel at a time would stride through all `kc` columns
        // once per panel.
        let full = mc / MR;
        let out = buf.as_mut_ptr();
        for p in 0..kc {
            let src = a.ptr.offset(p as isize * a.cs);
            if p + 8 < kc {
                prefetch_span(a.ptr.offset((p + 8) as isize * a.cs), mc);
            }
            for panel in 0..full {
                // A fixed length: inlined vector moves, not a memcpy call per step.
                *(out.add(panel * stride + p * MR) as *mut [f32; MR]) =
                    *(src.add(panel * MR) as *const [f32; MR]);
            }
            if full < panels {
                let rows = mc - full * MR;
                let dst = std::slice::from_raw_parts_mut(out.add(full * stride + p * MR), MR);
                dst[..rows].copy_from_slice(std::slice::from_raw_parts(src.add(full * MR), rows));
                dst[rows..].fill(0.0);
            }
        }
        return;
    }
    for panel in 0..panels {
        let out = &mut buf[panel * stride..panel * stride + kc * MR];
        let i0 = panel * MR;
        let rows = MR.min(mc - i0);
        for r in 0..MR {
            if r < rows {
                for p in 0..kc {
                    out[p * MR + r] = a.at(i0 + r, p);
                }
            } else {
                for p in 0..kc {
                    out[p * MR + r] = 0.0;
                }
            }
        }
    }
}

/// Pack one panel of `b` (`kc × cols`, `cols ≤ NR`) into `out` (`kc × NR`, as `isa`'s
/// column slices one after the other; see [`PackedB`]), zero-padding the missing columns.
unsafe fn pack_b_panel(b: MatRef, out: &mut [f32], isa: Isa) {
    let (kc, cols) = (b.rows, b.cols);
    let sw = isa.slice_width();
    if b.cs == 1 {
        for p in 0..kc {
            let src = b.ptr.offset(p as isize * b.rs);
            for s in 0..NR / sw {
                let c0 = s * sw;
                let dst = &mut out[s * kc * sw + p * sw..][..sw];
                if c0 + sw <= cols {
                    copy_row(src.add(c0), dst.as_mut_ptr(), sw);
                } else {
                    let n = cols.saturating_sub(c0);
                    dst[..n].copy_from_slice(std::slice::from_raw_parts(src.add(c0), n));
                    dst[n..].fill(0.0);
                }
            }
        }
    } else {
        for j in 0..NR {
            let slice = &mut out[j / sw * kc * sw..][..kc * sw];
            for p in 0..kc {
                slice[p * sw + j % sw] = if j < cols { b.at(p, j) } else { 0.0 };
            }
        }
    }
}

/// Copy `len` (16 or 32) floats: a fixed length inlines as vector moves, not a memcpy call
/// per row.
#[inline(always)]
unsafe fn copy_row(src: *const f32, dst: *mut f32, len: usize) {
    match len {
        16 => *(dst as *mut [f32; 16]) = *(src as *const [f32; 16]),
        32 => *(dst as *mut [f32; 32]) = *(src as *const [f32; 32]),
        _ => std::ptr::copy_nonoverlapping(src, dst, len),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::bitmask::element_hash;
    use crate::backend::cpu::pseudo_matrix as pseudo;
    use ndarray::Array2;

    /// What every kernel computes for element `(i, j)`, step by step in scalar code: one
    /// fused multiply-add chain per `KC` block, `alpha·acc + beta·old` fused (`beta` = 1 after
    /// the first block, the old value ignored when overwriting), then the epilogue. Kernels
    /// must match it bitwise.
    #[allow(clippy::too_many_arguments)]
    fn model(
        a: &Array2<f32>,
        b: &Array2<f32>,
        alpha: f32,
        beta: f32,
        old: &Array2<f32>,
        bias: &[f32],
        seeds: &[u32],
        keep_below: u32,
        scale: f32,
    ) -> (Array2<f32>, Vec<u32>, Vec<u32>) {
        let (m, k, n) = (a.nrows(), a.ncols(), b.ncols());
        let mut c = old.clone();
        let (mut pos, mut kept) = (vec![0u32; m * n / 32], vec![0u32; m * n / 32]);
        for i in 0..m {
            for j in 0..n {
                for pc in (0..k).step_by(KC) {
                    let mut acc = 0f32;
                    for p in pc..k.min(pc + KC) {
                        acc = a[[i, p]].mul_add(b[[p, j]], acc);
                    }
                    let first = pc == 0;
                    let bt = if first { beta } else { 1.0 };
                    c[[i, j]] = if first && beta == 0.0 {
                        acc * alpha
                    } else {
                        c[[i, j]].mul_add(bt, acc * alpha)
                    };
                }
                let mut v = c[[i, j]] + bias[j];
                let bit = 1u32 << (j % 32);
                if v > 0.0 {
                    pos[(i * n + j) / 32] |= bit;
                }
                v = v.max(0.0);
                if element_hash(seeds[i], j as u32) < keep_below {
                    kept[(i * n + j) / 32] |= bit;
                    v *= scale;
                } else {
                    v = 0.0;
                }
                c[[i, j]] = v;
            }
        }
        (c, pos, kept)
    }

    /// Every kernel this CPU has, on direct and packed `A`, shared and per-tile `B`, tile
    /// tails and two `KC` blocks, with the whole epilogue: bitwise the scalar model (so the
    /// AVX2 and AVX-512 kernels also agree bitwise with each other).
    #[test]
    fn kernels_match_the_scalar_model_bitwise() {
        let isas: Vec<Isa> = match isa() {
            Some(Isa::Avx512) => vec![Isa::Avx512, Isa::Avx2],
            Some(Isa::Avx2) => {
                crate::util::skip::skipped(
                    crate::util::skip::SkipKind::Other,
                    "kernels_match_the_scalar_model_bitwise (AVX-512 kernel)",
                    "this CPU has no AVX-512; only the AVX2 kernel was checked",
                );
                vec![Isa::Avx2]
            }
            None => {
                crate::util::skip::skipped(
                    crate::util::skip::SkipKind::Other,
                    "kernels_match_the_scalar_model_bitwise",
                    "this CPU has neither AVX2+FMA nor AVX-512",
                );
                return;
            }
        };
        for &(m, k, n) in &[(1, 3, 32), (13, 40, 64), (29, 300, 96), (12, 256, 32)] {
            let a = pseudo(m, k, 1);
            let at = a.t().to_owned();
            let b = pseudo(k, n, 2);
            let old = pseudo(m, n, 3);
            let bias: Vec<f32> = (0..n).map(|j| j as f32 * 0.01 - 0.1).collect();
            let seeds: Vec<u32> = (0..m as u32)
                .map(|i| i.wrapping_mul(2_654_435_761))
                .collect();
            let (keep_below, scale) = (u32::MAX / 3 * 2, 1.5);
            for (alpha, beta) in [(1.0, 0.0), (0.5, -2.0)] {
                let expect = model(&a, &b, alpha, beta, &old, &bias, &seeds, keep_below, scale);
                for &isa in &isas {
                    for transposed_a in [false, true] {
                        for shared in [false, true] {
                            let mut c = old.clone();
                            let (mut pos, mut kept) = (vec![0u32; m * n / 32], vec![0; m * n / 32]);
                            let epi = Epilogue {
                                bias: bias.as_ptr(),
                                relu_bits: pos.as_mut_ptr(),
                                ld: n,
                                origin: (0, 0),
                                drop_seeds: seeds.as_ptr(),
                                drop_bits: kept.as_mut_ptr(),
                                keep_below,
                                drop_scale: scale,
                            };
                            let av = if transposed_a { at.t() } else { a.view() };
                            let (aref, bref) = (MatRef::of(&av), MatRef::of(&b.view()));
                            let cm = MatMut {
                                ptr: c.as_mut_ptr(),
                                rows: m,
                                cols: n,
                                rs: n as isize,
                            };
                            let mut packed = PackedB::default();
                            let mut ws = Workspace::default();
                            // SAFETY: the CPU has `isa`; every operand covers its shape.
                            unsafe {
                                let source = if shared {
                                    packed.pack(bref, isa);
                                    BSource::Shared {
                                        packed: &packed,
                                        p0: 0,
                                        j0: 0,
                                    }
                                } else {
                                    BSource::Own(bref)
                                };
                                gemm_tile(isa, alpha, aref, source, beta, cm, &mut ws, epi);
                            }
                            let what = format!(
                                "{isa:?} {m}×{k}×{n} alpha {alpha} beta {beta} \
                                 transposed A {transposed_a} shared B {shared}"
                            );
                            let same = c
                                .iter()
                                .zip(expect.0.iter())
                                .all(|(x, y)| x.to_bits() == y.to_bits());
                            assert!(same, "{what}: values differ from the scalar model");
                            assert_eq!(pos, expect.1, "{what}: ReLU bits");
                            assert_eq!(kept, expect.2, "{what}: dropout bits");
                        }
                    }
                }
            }
        }
    }
}
