//! The AVX-512 micro-kernel: a 12 × 32 tile of `C` in 24 zmm registers.

use std::arch::x86_64::*;

use super::{KernelArgs, MR, NR};

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
pub(super) unsafe fn kernel<const DIRECT: bool>(args: KernelArgs) {
    let (kc, a, rsa, b, tile, alpha, beta, overwrite, epi) = args;
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
                let hash =
                    crate::backend::cpu::bitmask::element_hash16(drop_seed, (j0 + 16 * h) as u32);
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
