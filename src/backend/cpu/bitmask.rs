//! AVX-512 versions of the kernels that apply or record one bit per element (dropout masks,
//! the signs a ReLU keeps for its backward).
//!
//! Compiled plainly, a loop that tests bit `i` of a word per element does not vectorise, and
//! these kernels were the costliest element-wise passes of training. AVX-512 has the right
//! instructions: 16 bits of a word are a `__mmask16` that selects lanes directly, and a
//! comparison yields one. Each function here returns `false` (doing nothing) when the CPU
//! lacks AVX-512, and the caller runs its portable loop; both compute the same operations on
//! every element, so results are bitwise equal either way.
//!
//! Bit `i` of a row's bit set is bit `i % 64` of word `i / 64`.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;
use std::mem::MaybeUninit;

#[cfg(target_arch = "x86_64")]
use super::simd::{level, Level};

/// Whether the AVX-512 kernels may run.
#[cfg(target_arch = "x86_64")]
#[inline]
fn avx512() -> bool {
    level() == Level::Avx512
}

/// The 16 bits of `bits` starting at element `c` (a multiple of 16).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn mask16(bits: &[u64], c: usize) -> __mmask16 {
    (bits[c / 64] >> (c % 64)) as u16
}

/// `g[i] ← g[i]·scale` where bit `i` is set, `0` elsewhere (the backward of a dropout).
pub fn scale_set_or_zero(bits: &[u64], scale: f32, g: &mut [f32]) -> bool {
    assert!(bits.len() * 64 >= g.len(), "bit set shorter than the row");
    #[cfg(target_arch = "x86_64")]
    if avx512() {
        // SAFETY: AVX-512F is present (just checked) and the bit set covers `g`.
        unsafe { scale_set_or_zero_avx512(bits, scale, g) };
        return true;
    }
    false
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn scale_set_or_zero_avx512(bits: &[u64], scale: f32, g: &mut [f32]) {
    let s = _mm512_set1_ps(scale);
    let body = g.len() / 16 * 16;
    for c in (0..body).step_by(16) {
        let p = g.as_mut_ptr().add(c);
        _mm512_storeu_ps(
            p,
            _mm512_maskz_mul_ps(mask16(bits, c), _mm512_loadu_ps(p), s),
        );
    }
    for (c, v) in g.iter_mut().enumerate().skip(body) {
        *v = if (bits[c / 64] >> (c % 64)) & 1 == 1 {
            *v * scale
        } else {
            0.0
        };
    }
}

/// `g[i] ← g[i]·1` where bit `i` is set, `g[i]·other` elsewhere (a ReLU-like backward).
pub fn scale_unset(bits: &[u64], other: f32, g: &mut [f32]) -> bool {
    assert!(bits.len() * 64 >= g.len(), "bit set shorter than the row");
    #[cfg(target_arch = "x86_64")]
    if avx512() {
        // SAFETY: AVX-512F is present (just checked) and the bit set covers `g`.
        unsafe { scale_unset_avx512(bits, other, g) };
        return true;
    }
    false
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn scale_unset_avx512(bits: &[u64], other: f32, g: &mut [f32]) {
    let (one, o) = (_mm512_set1_ps(1.0), _mm512_set1_ps(other));
    let body = g.len() / 16 * 16;
    for c in (0..body).step_by(16) {
        let p = g.as_mut_ptr().add(c);
        let factor = _mm512_mask_blend_ps(mask16(bits, c), o, one);
        _mm512_storeu_ps(p, _mm512_mul_ps(_mm512_loadu_ps(p), factor));
    }
    for (c, v) in g.iter_mut().enumerate().skip(body) {
        *v *= if (bits[c / 64] >> (c % 64)) & 1 == 1 {
            1.0
        } else {
            other
        };
    }
}

/// `bits` bit `i` ← `y[i] > 0`, for `y` starting at a word boundary (the bits past `y`'s
/// end in its last word are cleared).
pub fn pack_positive(y: &[f32], bits: &mut [u64]) -> bool {
    assert!(bits.len() * 64 >= y.len(), "bit set shorter than the row");
    #[cfg(target_arch = "x86_64")]
    if avx512() {
        // SAFETY: AVX-512F is present (just checked) and the bit set covers `y`.
        unsafe { pack_positive_avx512(y, bits) };
        return true;
    }
    false
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn pack_positive_avx512(y: &[f32], bits: &mut [u64]) {
    let zero = _mm512_setzero_ps();
    bits[..y.len().div_ceil(64)].fill(0);
    let body = y.len() / 16 * 16;
    for c in (0..body).step_by(16) {
        let k = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(_mm512_loadu_ps(y.as_ptr().add(c)), zero);
        bits[c / 64] |= (k as u64) << (c % 64);
    }
    for (c, &v) in y.iter().enumerate().skip(body) {
        bits[c / 64] |= ((v > 0.0) as u64) << (c % 64);
    }
}

/// What decides and scales the kept elements of one dropout row: column `c` is kept when
/// `keep_all ∨ element_hash(seed, c) < keep_below`, and kept values are scaled by `scale`.
#[derive(Clone, Copy, Debug)]
pub struct RowHash {
    pub seed: u32,
    pub keep_below: u32,
    pub keep_all: bool,
    pub scale: f32,
}

impl RowHash {
    /// Whether column `col` is kept.
    #[inline(always)]
    pub fn keep(&self, col: usize) -> bool {
        self.keep_all || element_hash(self.seed, col as u32) < self.keep_below
    }
}

/// A dropout row: `dst[c] ← keep(c) ? src[c]·scale : 0` ([`RowHash::keep`]), recording
/// `keep(c)` in `bits`. [`super::dropout`] defines the hash; this computes it 16 columns at a
/// time.
pub fn dropout_row(
    hash: RowHash,
    src: &[f32],
    dst: &mut [MaybeUninit<f32>],
    bits: &mut [u64],
) -> bool {
    assert!(
        src.len() == dst.len() && bits.len() * 64 >= src.len(),
        "dropout row: lengths"
    );
    // SAFETY: the lengths agree.
    unsafe { dropout_row_raw(hash, src.as_ptr(), dst.as_mut_ptr().cast(), src.len(), bits) }
}

/// [`dropout_row`] in place.
pub fn dropout_row_in_place(hash: RowHash, row: &mut [f32], bits: &mut [u64]) -> bool {
    assert!(bits.len() * 64 >= row.len(), "dropout row: lengths");
    // SAFETY: each step reads its 16 floats before writing them, so reading and writing one
    // row is fine.
    unsafe { dropout_row_raw(hash, row.as_ptr(), row.as_mut_ptr(), row.len(), bits) }
}

/// [`dropout_row_avx512`] when the CPU has AVX-512 (false, touching nothing, otherwise).
///
/// # Safety
/// `src` readable and `dst` writable for `n` floats (they may be the same row); `bits` covers
/// `n` bits.
unsafe fn dropout_row_raw(
    hash: RowHash,
    src: *const f32,
    dst: *mut f32,
    n: usize,
    bits: &mut [u64],
) -> bool {
    #[cfg(target_arch = "x86_64")]
    if avx512() {
        dropout_row_avx512(hash, src, dst, n, bits);
        return true;
    }
    let _ = (hash, src, dst, n, bits);
    false
}

/// The per-element hash of [`dropout_row`] (murmur3's 32-bit finaliser).
#[inline(always)]
pub fn element_hash(seed: u32, col: u32) -> u32 {
    let mut h = seed.wrapping_add(col.wrapping_mul(PHI32));
    h ^= h >> 16;
    h = h.wrapping_mul(0x85eb_ca6b);
    h ^= h >> 13;
    h = h.wrapping_mul(0xc2b2_ae35);
    h ^ (h >> 16)
}

/// ⌊2³²/φ⌋, odd: consecutive columns start far apart in the hash's input.
const PHI32: u32 = 0x9e37_79b9;

/// [`element_hash`] of columns `c0..c0 + 16` of the row whose seed is `seed`, one per lane.
///
/// # Safety
/// AVX-512F.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub unsafe fn element_hash16(seed: u32, c0: u32) -> __m512i {
    finalise16(hash_input16(seed, c0))
}

/// [`element_hash`] of columns `c0..c0 + 8`, one per lane (the AVX2 form of
/// [`element_hash16`]).
///
/// # Safety
/// AVX2.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub unsafe fn element_hash8(seed: u32, c0: u32) -> __m256i {
    let lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    let cols = _mm256_add_epi32(_mm256_set1_epi32(c0 as i32), lanes);
    let x = _mm256_add_epi32(
        _mm256_set1_epi32(seed as i32),
        _mm256_mullo_epi32(cols, _mm256_set1_epi32(PHI32 as i32)),
    );
    let mut h = _mm256_xor_si256(x, _mm256_srli_epi32::<16>(x));
    h = _mm256_mullo_epi32(h, _mm256_set1_epi32(0x85eb_ca6bu32 as i32));
    h = _mm256_xor_si256(h, _mm256_srli_epi32::<13>(h));
    h = _mm256_mullo_epi32(h, _mm256_set1_epi32(0xc2b2_ae35u32 as i32));
    _mm256_xor_si256(h, _mm256_srli_epi32::<16>(h))
}

/// `seed + c·φ` for columns `c0..c0 + 16`: the input of [`element_hash`]'s finaliser.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn hash_input16(seed: u32, c0: u32) -> __m512i {
    let lanes = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    let cols = _mm512_add_epi32(_mm512_set1_epi32(c0 as i32), lanes);
    _mm512_add_epi32(
        _mm512_set1_epi32(seed as i32),
        _mm512_mullo_epi32(cols, _mm512_set1_epi32(PHI32 as i32)),
    )
}

/// murmur3's 32-bit finaliser on 16 lanes.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn finalise16(x: __m512i) -> __m512i {
    let mut h = _mm512_xor_si512(x, _mm512_srli_epi32::<16>(x));
    h = _mm512_mullo_epi32(h, _mm512_set1_epi32(0x85eb_ca6bu32 as i32));
    h = _mm512_xor_si512(h, _mm512_srli_epi32::<13>(h));
    h = _mm512_mullo_epi32(h, _mm512_set1_epi32(0xc2b2_ae35u32 as i32));
    _mm512_xor_si512(h, _mm512_srli_epi32::<16>(h))
}

/// # Safety
/// AVX-512F; `src` readable and `dst` writable for `n` floats (they may be the same row);
/// `bits` covers `n` bits.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn dropout_row_avx512(
    hash: RowHash,
    src: *const f32,
    dst: *mut f32,
    n: usize,
    bits: &mut [u64],
) {
    let RowHash {
        seed,
        keep_below,
        keep_all,
        scale,
    } = hash;
    bits[..n.div_ceil(64)].fill(0);
    // seed + c·φ for the 16 columns of the current step, advanced by 16·φ per step.
    let mut x = hash_input16(seed, 0);
    let step = _mm512_set1_epi32(PHI32.wrapping_mul(16) as i32);
    let below = _mm512_set1_epi32(keep_below as i32);
    let s = _mm512_set1_ps(scale);
    let body = n / 16 * 16;
    for c in (0..body).step_by(16) {
        let h = finalise16(x);
        let k: __mmask16 = if keep_all {
            0xffff
        } else {
            _mm512_cmplt_epu32_mask(h, below)
        };
        let v = _mm512_maskz_mul_ps(k, _mm512_loadu_ps(src.add(c)), s);
        _mm512_storeu_ps(dst.add(c), v);
        bits[c / 64] |= (k as u64) << (c % 64);
        x = _mm512_add_epi32(x, step);
    }
    if body < n {
        // The last `n − body` (< 16) columns under a lane mask: narrow rows (an input layer's
        // few features) are all tail.
        let c = body;
        let tail: __mmask16 = (1u16 << (n - body)) - 1;
        let h = finalise16(x);
        let k: __mmask16 = if keep_all {
            tail
        } else {
            _mm512_mask_cmplt_epu32_mask(tail, h, below)
        };
        let v = _mm512_maskz_mul_ps(k, _mm512_maskz_loadu_ps(tail, src.add(c)), s);
        _mm512_mask_storeu_ps(dst.add(c), tail, v);
        bits[c / 64] |= (k as u64) << (c % 64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bits_of(n: usize, salt: u64) -> Vec<u64> {
        (0..n.div_ceil(64) as u64)
            .map(|w| crate::backend::cpu::dropout::mix64(w ^ salt))
            .collect()
    }

    fn bit(bits: &[u64], c: usize) -> bool {
        (bits[c / 64] >> (c % 64)) & 1 == 1
    }

    /// Rows narrower than one vector (an input layer's few features) are all tail: masked
    /// lanes give the scalar definition's values and bits, and leave the rest untouched.
    #[test]
    fn narrow_dropout_rows_match_the_scalar_definition() {
        for n in [1, 7, 10, 15] {
            let g: Vec<f32> = (0..n).map(|i| (i as f32 * 0.9).cos() - 0.1).collect();
            let mut row = g.clone();
            row.push(42.0);
            let mut bits = vec![u64::MAX; 1];
            let hash = RowHash {
                seed: 5,
                keep_below: 0x9000_0000,
                keep_all: false,
                scale: 3.0,
            };
            if dropout_row_in_place(hash, &mut row[..n], &mut bits) {
                for c in 0..n {
                    let keep = element_hash(5, c as u32) < 0x9000_0000;
                    let e = if keep { g[c] * 3.0 } else { 0.0 };
                    assert_eq!(row[c].to_bits(), e.to_bits(), "{n} columns, at {c}");
                    assert_eq!(bit(&bits, c), keep, "{n} columns, bit {c}");
                }
                assert_eq!(bits[0] >> n, 0, "{n} columns: bits past the row");
                assert_eq!(row[n], 42.0, "{n} columns: past the row");
            }
        }
    }

    #[test]
    #[allow(clippy::needless_range_loop)] // index-by-index against the definitions
    fn kernels_match_their_scalar_definitions() {
        // 83 elements: whole 16-lane steps, a partial word and a scalar tail.
        let n = 83;
        let g: Vec<f32> = (0..n).map(|i| (i as f32 * 0.7).sin() - 0.2).collect();
        let bits = bits_of(n, 9);
        let mut a = g.clone();
        if scale_set_or_zero(&bits, 2.5, &mut a) {
            for c in 0..n {
                let e = if bit(&bits, c) { g[c] * 2.5 } else { 0.0 };
                assert_eq!(a[c].to_bits(), e.to_bits(), "scale_set_or_zero at {c}");
            }
        }
        let mut b = g.clone();
        if scale_unset(&bits, 0.1, &mut b) {
            for c in 0..n {
                let e = g[c] * if bit(&bits, c) { 1.0 } else { 0.1 };
                assert_eq!(b[c].to_bits(), e.to_bits(), "scale_unset at {c}");
            }
        }
        let mut packed = vec![u64::MAX; 2];
        if pack_positive(&g, &mut packed) {
            for c in 0..128 {
                assert_eq!(bit(&packed, c), c < n && g[c] > 0.0, "pack_positive at {c}");
            }
        }
        for (keep_below, keep_all) in [(0x8000_0000u32, false), (0x3000_0000, false), (0, true)] {
            let mut dst = vec![MaybeUninit::new(f32::NAN); n];
            let mut rec = vec![u64::MAX; 2];
            let mut in_place = g.clone();
            let mut rec2 = vec![0u64; 2];
            let hash = RowHash {
                seed: 77,
                keep_below,
                keep_all,
                scale: 2.0,
            };
            if dropout_row_in_place(hash, &mut in_place, &mut rec2) {
                let e: Vec<u32> = (0..n)
                    .map(|c| {
                        let keep = keep_all || element_hash(77, c as u32) < keep_below;
                        (if keep { g[c] * 2.0 } else { 0.0 }).to_bits()
                    })
                    .collect();
                let got: Vec<u32> = in_place.iter().map(|v| v.to_bits()).collect();
                assert_eq!(got, e, "dropout in place");
            }
            if dropout_row(hash, &g, &mut dst, &mut rec) {
                for c in 0..128 {
                    let keep = c < n && (keep_all || element_hash(77, c as u32) < keep_below);
                    assert_eq!(bit(&rec, c), keep, "dropout bit {c}");
                    if c < n {
                        let e = if keep { g[c] * 2.0 } else { 0.0 };
                        // SAFETY: every element of the row was written.
                        let got = unsafe { dst[c].assume_init() };
                        assert_eq!(got.to_bits(), e.to_bits(), "dropout value {c}");
                    }
                }
            }
        }
    }
}
