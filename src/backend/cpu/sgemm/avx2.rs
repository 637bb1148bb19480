//! The AVX2 + FMA micro-kernel, for CPUs without AVX-512 (AMD Zen 1–3, Intel client cores,
//! and virtual machines that hide AVX-512).
//!
//! It fills the same `MR × NR` = 12 × 32 tiles from the same packed panels as the AVX-512
//! kernel, as four sub-tiles of 6 × 16: twelve ymm accumulators, two ymm loads of `B` and one
//! broadcast of `A` per step fit the sixteen ymm registers (BLIS's Haswell shape). A call
//! covers one 16-column slice of a tile; the driver runs every row panel against one slice
//! before the next, which keeps the slice's 16 KiB of `B` in L1 (a whole 32 KiB panel does
//! not stay there beside the streaming `A`, and its loads then stall the kernel). Every
//! element is the same chain of fused multiply-adds over `p`, and the epilogue does the same
//! operations in the same order, so the results are bitwise those of the AVX-512 kernel.

use std::arch::x86_64::*;

use super::{Epilogue, KernelArgs, MatMut, MR};
use crate::util::prefetch::prefetch;

/// Rows of a sub-tile.
const SR: usize = 6;
/// Columns of a sub-tile (two ymm registers).
pub(super) const SC: usize = 16;

/// Columns `SC·slice ..` of `tile = alpha·(A · b_panel) + beta·tile` for one `mr × nr` tile
/// (`mr ≤ MR`, `nr ≤ NR`), with the contract of the AVX-512 kernel
/// ([`super::avx512::kernel`]), including `DIRECT`. The caller runs slice 0 of a tile before
/// slice 1: the epilogue writes a row's 32-bit bit words in the first and completes them in
/// the second.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn kernel<const DIRECT: bool>(slice: usize, args: KernelArgs) {
    let (kc, a, rsa, b, tile, alpha, beta, overwrite, epi) = args;
    let c0 = slice * SC;
    debug_assert!(c0 < tile.cols);
    for r0 in (0..MR).step_by(SR) {
        if r0 >= tile.rows {
            break;
        }
        let rows = SR.min(tile.rows - r0);
        let sub = tile.sub(r0, c0, rows, SC.min(tile.cols - c0));
        // The sub-tile's lines of C are stored (and maybe read) after the loop: ask for them
        // now, so that the stores do not wait for them (C is often far larger than cache).
        for r in 0..rows {
            prefetch(sub.ptr.offset(r as isize * sub.rs));
        }
        // The slice's packed columns: `kc` rows of SC contiguous floats.
        let bs = b.add(slice * kc * SC);
        let acc = if DIRECT {
            accumulate_direct(kc, a, rsa, r0, tile.rows, bs)
        } else {
            accumulate_packed(kc, a.add(r0), bs)
        };
        store(&acc, sub, alpha, beta, overwrite, epi, r0, slice);
    }
}

/// The `SR × SC` sums of rows `r0..r0 + SR` of a row-major `A` (rows past `rows` re-read the
/// last one; they are not stored) against a packed slice of `B`.
#[inline(always)]
unsafe fn accumulate_direct(
    kc: usize,
    a: *const f32,
    rsa: isize,
    r0: usize,
    rows: usize,
    b: *const f32,
) -> [[__m256; 2]; SR] {
    let last = rows - 1;
    let ptrs: [*const f32; SR] =
        std::array::from_fn(|r| a.offset((r0 + r).min(last) as isize * rsa));
    let mut acc = [[_mm256_setzero_ps(); 2]; SR];
    let mut bp = b;
    for p0 in (0..kc).step_by(LINE) {
        // Each row is read a cache line at a time: ask for the line after next of all six
        // rows now, so their misses overlap instead of stalling the chain one by one.
        for ptr in &ptrs {
            prefetch(ptr.wrapping_add(p0 + 2 * LINE));
        }
        for p in p0..kc.min(p0 + LINE) {
            let b0 = _mm256_load_ps(bp);
            let b1 = _mm256_load_ps(bp.add(8));
            for (r, row) in acc.iter_mut().enumerate() {
                let av = _mm256_broadcast_ss(&*ptrs[r].add(p));
                row[0] = _mm256_fmadd_ps(av, b0, row[0]);
                row[1] = _mm256_fmadd_ps(av, b1, row[1]);
            }
            bp = bp.add(SC);
        }
    }
    acc
}

/// Floats in a 64-byte cache line.
const LINE: usize = 16;

/// The `SR × SC` sums of `SR` rows of a packed `MR`-row panel of `A` (starting at `a`)
/// against a packed slice of `B`.
#[inline(always)]
unsafe fn accumulate_packed(kc: usize, a: *const f32, b: *const f32) -> [[__m256; 2]; SR] {
    let mut acc = [[_mm256_setzero_ps(); 2]; SR];
    let (mut ap, mut bp) = (a, b);
    for _ in 0..kc {
        let b0 = _mm256_load_ps(bp);
        let b1 = _mm256_load_ps(bp.add(8));
        for (r, row) in acc.iter_mut().enumerate() {
            let av = _mm256_broadcast_ss(&*ap.add(r));
            row[0] = _mm256_fmadd_ps(av, b0, row[0]);
            row[1] = _mm256_fmadd_ps(av, b1, row[1]);
        }
        ap = ap.add(MR);
        bp = bp.add(SC);
    }
    acc
}

/// Lanes `0..n` (`n ≤ 8`) set, as a vector mask.
#[inline(always)]
unsafe fn lanes(n: usize) -> __m256i {
    _mm256_cmpgt_epi32(
        _mm256_set1_epi32(n as i32),
        _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
    )
}

/// Store one sub-tile (`sub`: its place in `C`, `r0`: its first row in the tile, `slice`:
/// which 16 of the tile's 32 columns), applying `epi` as the AVX-512 kernel does.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn store(
    acc: &[[__m256; 2]; SR],
    sub: MatMut,
    alpha: f32,
    beta: f32,
    overwrite: bool,
    epi: Epilogue,
    r0: usize,
    slice: usize,
) {
    let va = _mm256_set1_ps(alpha);
    let vb = _mm256_set1_ps(beta);
    let zero = _mm256_setzero_ps();
    // Unsigned `hash < keep_below` as a signed comparison of both with the top bit flipped.
    let flip = _mm256_set1_epi32(i32::MIN);
    let below = _mm256_xor_si256(_mm256_set1_epi32(epi.keep_below as i32), flip);
    let drop_scale = _mm256_set1_ps(epi.drop_scale);
    let (i0, j0) = epi.origin;
    let col0 = j0 + SC * slice;
    let counts = [sub.cols.min(8), sub.cols.saturating_sub(8)];
    let masks = [lanes(counts[0]), lanes(counts[1])];
    for (r, row) in acc.iter().enumerate().take(sub.rows) {
        let i = i0 + r0 + r;
        let out = sub.ptr.offset(r as isize * sub.rs);
        let (mut positive, mut kept) = (0u32, 0u32);
        let drop_seed = if epi.drop_seeds.is_null() {
            0
        } else {
            *epi.drop_seeds.add(i)
        };
        for (q, (&n, &mask)) in counts.iter().zip(&masks).enumerate() {
            if n == 0 {
                continue;
            }
            let dst = out.add(8 * q);
            let mut v = _mm256_mul_ps(row[q], va);
            if !overwrite {
                v = _mm256_fmadd_ps(_mm256_maskload_ps(dst, mask), vb, v);
            }
            if !epi.bias.is_null() {
                v = _mm256_add_ps(v, _mm256_maskload_ps(epi.bias.add(col0 + 8 * q), mask));
            }
            let lane_bits = (1u32 << n) - 1;
            if !epi.relu_bits.is_null() {
                let k = _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_GT_OQ>(v, zero)) as u32;
                positive |= (k & lane_bits) << (8 * q);
                v = _mm256_max_ps(v, zero);
            }
            if !epi.drop_seeds.is_null() {
                let hash =
                    crate::backend::cpu::bitmask::element_hash8(drop_seed, (col0 + 8 * q) as u32);
                let keep = _mm256_cmpgt_epi32(below, _mm256_xor_si256(hash, flip));
                kept |=
                    (_mm256_movemask_ps(_mm256_castsi256_ps(keep)) as u32 & lane_bits) << (8 * q);
                v = _mm256_and_ps(_mm256_mul_ps(v, drop_scale), _mm256_castsi256_ps(keep));
            }
            if n == 8 {
                _mm256_storeu_ps(dst, v);
            } else {
                _mm256_maskstore_ps(dst, mask, v);
            }
        }
        // Row `i`'s 32-bit word for columns j0..j0 + 32 (j0 and ld are multiples of 32):
        // slice 0 writes its low 16 bits (clearing the rest), slice 1 adds its own.
        let word = (i * epi.ld + j0) / 32;
        if !epi.relu_bits.is_null() {
            merge_bits(epi.relu_bits.add(word), positive, slice);
        }
        if !epi.drop_seeds.is_null() {
            merge_bits(epi.drop_bits.add(word), kept, slice);
        }
    }
}

/// Write one slice's 16 bits into a row's 32-bit word: slice 0 writes the word (its
/// high bits cleared), slice 1 adds its bits above them.
#[inline(always)]
unsafe fn merge_bits(word: *mut u32, bits: u32, slice: usize) {
    *word = if slice == 0 {
        bits
    } else {
        *word | (bits << SC)
    };
}
