//! A seeded bijection of `[0, n)` that needs no memory: a 4-round Feistel network on the
//! smallest even number of bits covering `n`, with cycle walking to stay inside `[0, n)`.
//!
//! The generators use it to scatter vertex ids (so neither the degree of an R-MAT vertex nor the
//! block of an SBM vertex correlates with its id, which would flatter contiguous-range
//! partitions), to assign balanced labels, and to draw exact-size splits, all in parallel and
//! without a permutation array of `n` entries.

use super::rng::{mix64, SplitMix64, Stream};

/// A permutation of `[0, n)` given by a seed.
#[derive(Clone, Debug)]
pub struct Bijection {
    n: u64,
    half_bits: u32,
    mask: u64,
    keys: [u64; 4],
}

impl Bijection {
    /// The permutation of `[0, n)` for `(seed, stream)`. `n` must be at most 2^32.
    pub fn new(n: u64, seed: u64, stream: Stream) -> Self {
        debug_assert!(n <= 1 << 32);
        let bits = 64 - n.saturating_sub(1).leading_zeros();
        let half_bits = bits.div_ceil(2).max(1);
        let mut rng = SplitMix64::for_item(seed, stream, 0);
        Bijection {
            n,
            half_bits,
            mask: (1u64 << half_bits) - 1,
            keys: std::array::from_fn(|_| rng.next_u64()),
        }
    }

    /// Number of elements permuted.
    pub fn len(&self) -> u64 {
        self.n
    }

    /// True for the permutation of the empty set.
    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    #[inline]
    fn round(&self, half: u64, key: u64) -> u64 {
        mix64(half ^ key) & self.mask
    }

    #[inline]
    fn encrypt(&self, x: u64) -> u64 {
        let (mut l, mut r) = (x >> self.half_bits, x & self.mask);
        for &k in &self.keys {
            (l, r) = (r, l ^ self.round(r, k));
        }
        (l << self.half_bits) | r
    }

    #[inline]
    fn decrypt(&self, y: u64) -> u64 {
        let (mut l, mut r) = (y >> self.half_bits, y & self.mask);
        for &k in self.keys.iter().rev() {
            (l, r) = (r ^ self.round(l, k), l);
        }
        (l << self.half_bits) | r
    }

    /// The image of `x < n`. Cycle walking: the Feistel domain is below `4 n`, so on average
    /// fewer than four rounds of encryption land back inside `[0, n)`.
    #[inline]
    pub fn forward(&self, x: u64) -> u64 {
        debug_assert!(x < self.n);
        let mut y = self.encrypt(x);
        while y >= self.n {
            y = self.encrypt(y);
        }
        y
    }

    /// The preimage of `y < n`: `inverse(forward(x)) == x`.
    #[inline]
    pub fn inverse(&self, y: u64) -> u64 {
        debug_assert!(y < self.n);
        let mut x = self.decrypt(y);
        while x >= self.n {
            x = self.decrypt(x);
        }
        x
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn is_a_permutation_with_its_inverse() {
        for n in [1u64, 2, 3, 5, 16, 17, 1000, 4097] {
            let b = Bijection::new(n, 11, Stream::Labels);
            let mut seen = vec![false; n as usize];
            for x in 0..n {
                let y = b.forward(x);
                assert!(y < n);
                assert!(!seen[y as usize], "n={n}: {y} hit twice");
                seen[y as usize] = true;
                assert_eq!(b.inverse(y), x);
            }
        }
    }

    #[test]
    fn seed_changes_the_permutation() {
        let a = Bijection::new(1000, 1, Stream::Labels);
        let b = Bijection::new(1000, 2, Stream::Labels);
        let moved = (0..1000).filter(|&x| a.forward(x) != b.forward(x)).count();
        assert!(moved > 900, "only {moved} of 1000 differ");
    }
}
