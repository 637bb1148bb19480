//! A packed, cache-blocked `f32` matrix product with an AVX-512 micro-kernel, run on one
//! thread over one tile of the output ([`super::gemm`] splits products into such tiles).
//!
//! `matrixmultiply` (what `ndarray` uses) has AVX2 kernels only and reaches about a fifth of
//! this machine's AVX-512 peak on GNN shapes. This is the classic BLIS loop nest:
//!
//! * `B` is packed per `KC × NC` block into `NR`-column panels (row `p` of a panel is `NR`
//!   contiguous floats), so the micro-kernel streams it from L1;
//! * `A` is packed per `MC × KC` block into `MR`-row panels (column `p` of a panel is `MR`
//!   contiguous floats), kept in L2;
//! * the micro-kernel keeps an `MR × NR` = 12 × 32 tile of `C` in 24 zmm registers and does
//!   `kc` rank-1 updates.
//!
//! # Determinism
//! Every element `C[i, j]` is computed the same way wherever it lies in a tile: one fused
//! multiply-add chain over `p` per `KC` block, blocks added to `C` in increasing `p`. The
//! result therefore depends on the shape only, never on how the caller splits rows or columns
//! among threads.

#![cfg(target_arch = "x86_64")]

use std::arch::x86_64::*;

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

/// True when this CPU can run the kernel (checked once; std caches the answer).
pub fn available() -> bool {
    std::arch::is_x86_feature_detected!("avx512f")
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

/// Packing buffers, reused across calls on one thread.
#[derive(Default)]
pub struct Workspace {
    a: Vec<f32>,
    b: Vec<f32>,
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

/// `c = alpha·a·b + beta·c` on one thread (`beta == 0` overwrites `c` without reading it).
///
/// # Safety
/// The CPU must support AVX-512F ([`available`]); `a` is `m×k`, `b` is `k×n`, `c` is `m×n`,
/// all in bounds, and `c` overlaps neither input.
pub unsafe fn gemm_tile(
    alpha: f32,
    a: MatRef,
    b: MatRef,
    beta: f32,
    c: MatMut,
    ws: &mut Workspace,
) {
    let (m, k, n) = (a.rows, a.cols, b.cols);
    debug_assert_eq!(b.rows, k);
    debug_assert_eq!((c.rows, c.cols), (m, n));
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        scale_rows(c, beta);
        return;
    }
    for jc in (0..n).step_by(NC) {
        let nc = NC.min(n - jc);
        let b_panels = nc.div_ceil(NR);
        for pc in (0..k).step_by(KC) {
            let kc = KC.min(k - pc);
            let first = pc == 0;
            let bbuf = aligned(&mut ws.b, b_panels * kc * NR);
            pack_b(b.sub(pc, jc, kc, nc), bbuf);
            let bptr = bbuf.as_ptr();
            for ic in (0..m).step_by(MC) {
                let mc = MC.min(m - ic);
                let a_panels = mc.div_ceil(MR);
                let abuf = aligned(&mut ws.a, a_panels * kc * MR);
                pack_a(a.sub(ic, pc, mc, kc), abuf);
                let aptr = abuf.as_ptr();
                for jr in 0..b_panels {
                    let nr = NR.min(nc - jr * NR);
                    for ir in 0..a_panels {
                        let mr = MR.min(mc - ir * MR);
                        let tile = c.sub(ic + ir * MR, jc + jr * NR, mr, nr);
                        kernel(
                            kc,
                            aptr.add(ir * kc * MR),
                            bptr.add(jr * kc * NR),
                            tile,
                            alpha,
                            if first { beta } else { 1.0 },
                            first && beta == 0.0,
                        );
                    }
                }
            }
        }
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

/// Pack `a` (`mc × kc`) into `MR`-row panels, zero-padding the last one.
unsafe fn pack_a(a: MatRef, buf: &mut [f32]) {
    let (mc, kc) = (a.rows, a.cols);
    for (panel, out) in buf.chunks_exact_mut(kc * MR).enumerate() {
        let i0 = panel * MR;
        let rows = MR.min(mc - i0);
        if a.rs == 1 {
            // Column-major source (a transposed view): each column of the panel is contiguous.
            for p in 0..kc {
                let src = a.ptr.offset(i0 as isize + p as isize * a.cs);
                let dst = &mut out[p * MR..(p + 1) * MR];
                dst[..rows].copy_from_slice(std::slice::from_raw_parts(src, rows));
                dst[rows..].fill(0.0);
            }
        } else {
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
}

/// Pack `b` (`kc × nc`) into `NR`-column panels, zero-padding the last one.
unsafe fn pack_b(b: MatRef, buf: &mut [f32]) {
    let (kc, nc) = (b.rows, b.cols);
    for (panel, out) in buf.chunks_exact_mut(kc * NR).enumerate() {
        let j0 = panel * NR;
        let cols = NR.min(nc - j0);
        if b.cs == 1 {
            for p in 0..kc {
                let src = b.ptr.offset(p as isize * b.rs + j0 as isize);
                let dst = &mut out[p * NR..(p + 1) * NR];
                dst[..cols].copy_from_slice(std::slice::from_raw_parts(src, cols));
                dst[cols..].fill(0.0);
            }
        } else {
            for j in 0..NR {
                if j < cols {
                    for p in 0..kc {
                        out[p * NR + j] = b.at(p, j0 + j);
                    }
                } else {
                    for p in 0..kc {
                        out[p * NR + j] = 0.0;
                    }
                }
            }
        }
    }
}

/// Mask of the first `n` (≤ 16) lanes.
#[inline(always)]
fn lanes(n: usize) -> __mmask16 {
    if n >= 16 {
        0xffff
    } else {
        ((1u32 << n) - 1) as __mmask16
    }
}

/// `tile = alpha·(a_panel · b_panel) + beta·tile` for one `mr × nr` tile (`mr ≤ MR`,
/// `nr ≤ NR`); `overwrite` ignores the old contents (`beta == 0`).
#[target_feature(enable = "avx512f")]
unsafe fn kernel(
    kc: usize,
    a: *const f32,
    b: *const f32,
    tile: MatMut,
    alpha: f32,
    beta: f32,
    overwrite: bool,
) {
    let mut acc = [[_mm512_setzero_ps(); 2]; MR];
    let mut ap = a;
    let mut bp = b;
    for _ in 0..kc {
        let b0 = _mm512_load_ps(bp);
        let b1 = _mm512_load_ps(bp.add(16));
        // A constant trip count: fully unrolled, `acc` lives in registers.
        for (r, row) in acc.iter_mut().enumerate() {
            let av = _mm512_set1_ps(*ap.add(r));
            row[0] = _mm512_fmadd_ps(av, b0, row[0]);
            row[1] = _mm512_fmadd_ps(av, b1, row[1]);
        }
        ap = ap.add(MR);
        bp = bp.add(NR);
    }
    let masks = [lanes(tile.cols), lanes(tile.cols.saturating_sub(16))];
    let va = _mm512_set1_ps(alpha);
    let vb = _mm512_set1_ps(beta);
    for (r, row) in acc.iter().enumerate() {
        if r >= tile.rows {
            break;
        }
        let out = tile.ptr.offset(r as isize * tile.rs);
        for (h, &mask) in masks.iter().enumerate() {
            if mask == 0 {
                continue;
            }
            let dst = out.add(16 * h);
            let mut v = _mm512_mul_ps(row[h], va);
            if !overwrite {
                v = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mask, dst), vb, v);
            }
            _mm512_mask_storeu_ps(dst, mask, v);
        }
    }
}
