//! Counter-based hashing: random numbers as pure functions of a key, with no generator state.
//!
//! Every random decision in gnnpar (which neighbours a vertex samples, the order of training
//! seeds, dropout masks) is `hash_key(&[seed, epoch, batch, layer, vertex, i])` or similar.
//! Because nothing is carried from one draw to the next, the same decision comes out whichever
//! rank makes it, in whatever order and on however many threads (ARCHITECTURE invariant 3).

/// The golden-ratio increment of SplitMix64; also the initial state of [`hash_key`].
const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;

/// The SplitMix64 finaliser: a bijection on `u64` with full avalanche (every input bit flips
/// about half of the output bits).
#[inline]
pub fn mix64(x: u64) -> u64 {
    let mut z = x;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A hash of a sequence of words, built one word at a time.
///
/// `HashKey::new().push(a).push(b).finish() == hash_key(&[a, b])`, so a caller that draws many
/// numbers sharing a prefix (`seed, epoch, batch, layer, vertex`) hashes the prefix once and
/// extends it per draw.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HashKey(u64);

impl HashKey {
    /// The hash of the empty sequence.
    #[inline]
    pub fn new() -> Self {
        HashKey(GOLDEN)
    }

    /// The hash of this sequence followed by `part`.
    ///
    /// Each step is `mix64(state ^ part) + GOLDEN`: mixing before the next word enters makes
    /// the result depend on the order of the words, and the added constant keeps an all-zero
    /// input from mapping to zero (`mix64(0) == 0`).
    #[inline]
    pub fn push(self, part: u64) -> Self {
        HashKey(mix64(self.0 ^ part).wrapping_add(GOLDEN))
    }

    /// The final 64-bit hash.
    #[inline]
    pub fn finish(self) -> u64 {
        // One more round so the last word is as well mixed as the others.
        mix64(self.0)
    }
}

impl Default for HashKey {
    fn default() -> Self {
        Self::new()
    }
}

/// Order-sensitive hash of `parts`: `hash_key(&[a, b]) != hash_key(&[b, a])` in general.
#[inline]
pub fn hash_key(parts: &[u64]) -> u64 {
    parts
        .iter()
        .fold(HashKey::new(), |k, &p| k.push(p))
        .finish()
}

/// A uniform number in `[0, 1)` from the top 53 bits of `h` (every value a multiple of 2^-53).
#[inline]
pub fn unit_f64(h: u64) -> f64 {
    (h >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
}

/// A number in `[0, n)` from `h` by multiply-high (Lemire's reduction without rejection).
///
/// The bias is at most `n / 2^64`, far below anything a sampler could detect, and no draw is
/// ever rejected, so every draw costs one hash.
#[inline]
pub fn below(h: u64, n: u64) -> u64 {
    ((h as u128 * n as u128) >> 64) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mix64_is_not_the_identity_and_avalanches() {
        assert_eq!(mix64(0), 0);
        let a = mix64(1);
        let b = mix64(2);
        assert_ne!(a, 1);
        // One flipped input bit flips roughly half the output bits.
        let flipped = (a ^ b).count_ones();
        assert!((16..=48).contains(&flipped), "{flipped} bits flipped");
    }

    #[test]
    fn hash_key_is_order_sensitive_and_matches_incremental_form() {
        assert_ne!(hash_key(&[1, 2]), hash_key(&[2, 1]));
        assert_ne!(hash_key(&[0]), hash_key(&[0, 0]));
        assert_ne!(hash_key(&[]), hash_key(&[0]));
        let inc = HashKey::new().push(7).push(8).push(9).finish();
        assert_eq!(inc, hash_key(&[7, 8, 9]));
    }

    #[test]
    fn unit_f64_is_in_range_and_roughly_uniform() {
        assert_eq!(unit_f64(0), 0.0);
        assert!(unit_f64(u64::MAX) < 1.0);
        let n = 100_000;
        let mean: f64 = (0..n).map(|i| unit_f64(hash_key(&[i]))).sum::<f64>() / n as f64;
        assert!((mean - 0.5).abs() < 0.01, "mean {mean}");
    }

    #[test]
    fn below_stays_in_range_and_covers_it() {
        let mut seen = [0usize; 7];
        for i in 0..7000u64 {
            let r = below(hash_key(&[42, i]), 7);
            seen[r as usize] += 1;
        }
        assert!(seen.iter().all(|&c| (800..1200).contains(&c)), "{seen:?}");
        assert_eq!(below(u64::MAX, 1), 0);
    }
}
