//! A packed, cache-blocked `f32` matrix product with an AVX-512 micro-kernel, run on one
//! thread over one tile of the output ([`super::gemm`] splits products into such tiles).
//!
//! `matrixmultiply` (what `ndarray` uses) has AVX2 kernels only and reaches about a fifth of
//! this machine's AVX-512 peak on GNN shapes. This is the classic BLIS loop nest:
//!
//! * `B` is packed once per product ([`PackedB`]) into `NR`-column panels of `KC` rows (row
//!   `p` of a panel is `NR` contiguous floats), so the micro-kernel streams it from L1;
//! * a row-major `A` is read in place, `MC × KC` blocks at a time (the kernel broadcasts from
//!   its `MR` rows); other layouts are packed into `MR`-row panels;
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

use crate::util::prefetch::prefetch_span;

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
/// `pc·npad + panel·kc·NR` (`npad` = `n` rounded up to `NR`). Packing per product instead of
/// per tile matters most for a transposed `B` (`Wᵀ`), whose packing is a scalar transpose.
#[derive(Default)]
pub struct PackedB {
    buf: Vec<f32>,
    skip: usize,
    k: usize,
    npad: usize,
}

impl PackedB {
    /// Pack `b` into this buffer (reusing its memory), in parallel over panels.
    ///
    /// # Safety
    /// `b` must describe valid memory.
    pub unsafe fn pack(&mut self, b: MatRef) {
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
                unsafe { pack_b_panel(b.sub(pc, j0, kc, NR.min(n - j0)), panel) }
            });
    }

    /// Pack rows `pc..pc + kc` of `b` (serially), as the only `KC` block.
    unsafe fn pack_block(&mut self, b: MatRef, pc: usize, kc: usize) {
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
            for p in 0..kc {
                let src = b.ptr.offset((pc + p) as isize * b.rs);
                for j in 0..npad / NR {
                    *(out.add(j * kc * NR + p * NR) as *mut [f32; NR]) =
                        *(src.add(j * NR) as *const [f32; NR]);
                }
            }
            return;
        }
        for (j, panel) in data.chunks_exact_mut(kc * NR).enumerate() {
            let j0 = j * NR;
            pack_b_panel(b.sub(pc, j0, kc, NR.min(n - j0)), panel);
        }
    }

    /// The packed panel of columns `j0..j0 + NR` (`j0` a multiple of `NR`) in the `KC` block
    /// starting at row `pc`.
    #[inline]
    fn panel(&self, pc: usize, j0: usize) -> *const f32 {
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
/// The CPU must support AVX-512F ([`available`]); `a` is `m×k`, `c` is `m×n` inside
/// `packed`'s columns, all in bounds, and `c` overlaps neither input.
#[allow(clippy::too_many_arguments)]
pub unsafe fn gemm_tile(
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
                    ws_b.pack_block(own.sub(0, jc, k, nc), pc, kc);
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
                    for ir in 0..a_panels {
                        let mr = MR.min(mc - ir * MR);
                        let tile = c.sub(ic + ir * MR, jc + jr * NR, mr, nr);
                        let beta = if first { beta } else { 1.0 };
                        let overwrite = first && beta == 0.0;
                        let e = tile_epi.at(ic + ir * MR, jc + jr * NR);
                        if direct {
                            kernel::<true>(
                                kc,
                                aptr.offset((ir * MR) as isize * a.rs),
                                a.rs,
                                bptr,
                                tile,
                                alpha,
                                beta,
                                overwrite,
                                e,
                            );
                        } else {
                            kernel::<false>(
                                kc,
                                aptr.add(ir * a_panel_stride(kc)),
                                0,
                                bptr,
                                tile,
                                alpha,
                                beta,
                                overwrite,
                                e,
                            );
                        }
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

/// Pack one panel of `b` (`kc × cols`, `cols ≤ NR`) into `out` (`kc × NR`), zero-padding
/// the missing columns.
unsafe fn pack_b_panel(b: MatRef, out: &mut [f32]) {
    let (kc, cols) = (b.rows, b.cols);
    if b.cs == 1 {
        for p in 0..kc {
            let src = b.ptr.offset(p as isize * b.rs);
            let dst = &mut out[p * NR..(p + 1) * NR];
            if cols == NR {
                // A fixed length: inlined vector moves, not a memcpy call per row.
                dst.copy_from_slice(&*(src as *const [f32; NR]));
            } else {
                dst[..cols].copy_from_slice(std::slice::from_raw_parts(src, cols));
                dst[cols..].fill(0.0);
            }
        }
    } else {
        for j in 0..NR {
            if j < cols {
                for p in 0..kc {
                    out[p * NR + j] = b.at(p, j);
                }
            } else {
                for p in 0..kc {
                    out[p * NR + j] = 0.0;
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

/// `tile = alpha·(A · b_panel) + beta·tile` for one `mr × nr` tile (`mr ≤ MR`, `nr ≤ NR`);
/// `overwrite` ignores the old contents (`beta == 0`).
///
/// `DIRECT`: `a` points at row 0 of the tile's rows of a row-major `A` (row stride `rsa`);
/// rows past `mr` re-read row `mr − 1` (their results are not stored). Otherwise `a` is a
/// packed `MR`-row panel (`rsa` unused). `epi` (with the tile's origin) is applied to the
/// values before they are stored.
#[target_feature(enable = "avx512f")]
#[allow(clippy::too_many_arguments)]
unsafe fn kernel<const DIRECT: bool>(
    kc: usize,
    a: *const f32,
    rsa: isize,
    b: *const f32,
    tile: MatMut,
    alpha: f32,
    beta: f32,
    overwrite: bool,
    epi: Epilogue,
) {
    let mut acc = [[_mm512_setzero_ps(); 2]; MR];
    let mut bp = b;
    if DIRECT {
        let last = tile.rows.max(1) - 1;
        let rows: [*const f32; MR] = std::array::from_fn(|r| a.offset(r.min(last) as isize * rsa));
        for p in 0..kc {
            let b0 = _mm512_load_ps(bp);
            let b1 = _mm512_load_ps(bp.add(16));
            for (r, row) in acc.iter_mut().enumerate() {
                let av = _mm512_set1_ps(*rows[r].add(p));
                row[0] = _mm512_fmadd_ps(av, b0, row[0]);
                row[1] = _mm512_fmadd_ps(av, b1, row[1]);
            }
            bp = bp.add(NR);
        }
    } else {
        let mut ap = a;
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
    }
    let masks = [lanes(tile.cols), lanes(tile.cols.saturating_sub(16))];
    let va = _mm512_set1_ps(alpha);
    let vb = _mm512_set1_ps(beta);
    let zero = _mm512_setzero_ps();
    let (i0, j0) = epi.origin;
    let below = _mm512_set1_epi32(epi.keep_below as i32);
    let drop_scale = _mm512_set1_ps(epi.drop_scale);
    for (r, row) in acc.iter().enumerate() {
        if r >= tile.rows {
            break;
        }
        let out = tile.ptr.offset(r as isize * tile.rs);
        let mut positive = 0u32;
        let mut kept = 0u32;
        let drop_seed = if epi.drop_seeds.is_null() {
            0
        } else {
            *epi.drop_seeds.add(i0 + r)
        };
        for (h, &mask) in masks.iter().enumerate() {
            if mask == 0 {
                continue;
            }
            let dst = out.add(16 * h);
            let mut v = _mm512_mul_ps(row[h], va);
            if !overwrite {
                v = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mask, dst), vb, v);
            }
            if !epi.bias.is_null() {
                v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(mask, epi.bias.add(j0 + 16 * h)));
            }
            if !epi.relu_bits.is_null() {
                let k = _mm512_mask_cmp_ps_mask::<_CMP_GT_OQ>(mask, v, zero);
                positive |= (k as u32) << (16 * h);
                v = _mm512_max_ps(v, zero);
            }
            if !epi.drop_seeds.is_null() {
                let hash = super::bitmask::element_hash16(drop_seed, (j0 + 16 * h) as u32);
                let k = _mm512_mask_cmplt_epu32_mask(mask, hash, below);
                kept |= (k as u32) << (16 * h);
                v = _mm512_maskz_mul_ps(k, v, drop_scale);
            }
            _mm512_mask_storeu_ps(dst, mask, v);
        }
        // Columns j0..j0 + 32 of row i0 + r: one whole 32-bit word of each bit set (j0 and
        // ld are multiples of 32), which no other tile writes.
        let word = ((i0 + r) * epi.ld + j0) / 32;
        if !epi.relu_bits.is_null() {
            *epi.relu_bits.add(word) = positive;
        }
        if !epi.drop_seeds.is_null() {
            *epi.drop_bits.add(word) = kept;
        }
    }
}
