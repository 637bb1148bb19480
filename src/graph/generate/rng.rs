//! Small, dependency-free random number generation with explicit streams.
//!
//! Every random quantity of a generated graph is drawn from a [`SplitMix64`] whose state is
//! derived from `(seed, stream, index)` by [`stream_seed`]: a chunk of edges, a feature row, a
//! centroid. Nothing depends on which thread draws what, so the output is the same for any
//! number of rayon threads.

/// The SplitMix64 finaliser: a bijective 64-bit mixer with good avalanche behaviour.
#[inline]
pub fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Independent sub-streams of one seed. Each use of randomness gets its own tag, so adding a
/// new use never shifts the numbers drawn by the others.
#[derive(Clone, Copy, Debug)]
#[repr(u64)]
pub enum Stream {
    /// SBM / R-MAT edge chunks.
    Edges = 1,
    /// Permutation keys of the block / label assignment.
    Labels = 2,
    /// Permutation keys of the R-MAT id scramble.
    Scramble = 3,
    /// Class centroids.
    Centroids = 4,
    /// Per-vertex feature noise.
    Features = 5,
    /// Permutation keys of the train / val / test split.
    Splits = 6,
}

/// The seed of item `index` of `stream` under the user's `seed`.
#[inline]
pub fn stream_seed(seed: u64, stream: Stream, index: u64) -> u64 {
    let s = mix64(seed ^ mix64((stream as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15)));
    mix64(s ^ index.wrapping_mul(0xd6e8_feb8_6659_fd93))
}

/// SplitMix64 (Steele, Lea & Flood 2014): 64 bits of state, passes BigCrush, and seeding it from
/// a hash of the item index makes it a counter-based generator per item.
#[derive(Clone, Debug)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    /// A generator for item `index` of `stream`.
    pub fn for_item(seed: u64, stream: Stream, index: u64) -> Self {
        SplitMix64 {
            state: stream_seed(seed, stream, index),
        }
    }

    /// The next 64 random bits.
    #[inline]
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        mix64(self.state)
    }

    /// Uniform in `[0, n)` by Lemire's multiply-shift (`n > 0`). The bias is below `n / 2^64`,
    /// far under anything a graph of fewer than 2^32 vertices could show.
    #[inline]
    pub fn below(&mut self, n: u64) -> u64 {
        ((self.next_u64() as u128 * n as u128) >> 64) as u64
    }

    /// Uniform in `[0, 1)` with 53 random bits.
    #[inline]
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Two independent standard normal values (Box–Muller).
    #[inline]
    pub fn normal_pair(&mut self) -> (f64, f64) {
        // 1 - unit() is in (0, 1], so the logarithm is finite.
        let r = (-2.0 * (1.0 - self.unit()).ln()).sqrt();
        let theta = std::f64::consts::TAU * self.unit();
        (r * theta.cos(), r * theta.sin())
    }

    /// Fill `out` with independent standard normal values.
    pub fn fill_normal(&mut self, out: &mut [f32]) {
        let mut pairs = out.chunks_exact_mut(2);
        for pair in &mut pairs {
            let (a, b) = self.normal_pair();
            pair[0] = a as f32;
            pair[1] = b as f32;
        }
        if let [last] = pairs.into_remainder() {
            *last = self.normal_pair().0 as f32;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_and_items_differ() {
        let a = SplitMix64::for_item(7, Stream::Edges, 0).next_u64();
        let b = SplitMix64::for_item(7, Stream::Edges, 1).next_u64();
        let c = SplitMix64::for_item(7, Stream::Features, 0).next_u64();
        let d = SplitMix64::for_item(8, Stream::Edges, 0).next_u64();
        assert!(a != b && a != c && a != d && b != c);
        assert_eq!(a, SplitMix64::for_item(7, Stream::Edges, 0).next_u64());
    }

    #[test]
    fn below_stays_in_range_and_covers_it() {
        let mut rng = SplitMix64::for_item(1, Stream::Edges, 0);
        let mut seen = [0u32; 7];
        for _ in 0..7000 {
            let x = rng.below(7);
            assert!(x < 7);
            seen[x as usize] += 1;
        }
        assert!(seen.iter().all(|&c| c > 800), "{seen:?}");
    }

    #[test]
    fn normals_have_unit_variance() {
        let mut rng = SplitMix64::for_item(3, Stream::Features, 0);
        let mut buf = vec![0f32; 100_001];
        rng.fill_normal(&mut buf);
        let n = buf.len() as f64;
        let mean = buf.iter().map(|&x| x as f64).sum::<f64>() / n;
        let var = buf.iter().map(|&x| (x as f64 - mean).powi(2)).sum::<f64>() / n;
        assert!(mean.abs() < 0.02, "mean {mean}");
        assert!((var - 1.0).abs() < 0.03, "variance {var}");
    }
}
