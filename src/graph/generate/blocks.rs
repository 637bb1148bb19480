//! Balanced classes over a seeded permutation: vertex `v` sits at position `perm(v)`, and
//! positions are cut into `classes` consecutive blocks of equal size (± 1). The SBM draws its
//! edges through the same layout, so its blocks are its classes.

use super::bijection::Bijection;
use super::rng::Stream;
use crate::graph::NodeId;
use rayon::prelude::*;

/// `classes` blocks of near-equal size over a seeded permutation of `[0, n)`.
#[derive(Clone, Debug)]
pub struct BlockLayout {
    n: u64,
    classes: u64,
    perm: Bijection,
}

impl BlockLayout {
    /// The layout of `n` vertices in `classes` blocks (`1 <= classes <= n`) for `seed`.
    pub fn new(n: u64, classes: usize, seed: u64) -> Self {
        debug_assert!(classes >= 1 && classes as u64 <= n);
        BlockLayout {
            n,
            classes: classes as u64,
            perm: Bijection::new(n, seed, Stream::Labels),
        }
    }

    /// First position of block `b` (`b == classes` gives `n`).
    #[inline]
    pub fn block_start(&self, b: u64) -> u64 {
        // No overflow: b <= classes <= n < 2^32, so b · n < 2^64.
        b * self.n / self.classes
    }

    /// The block holding position `pos`: the largest `b` with `block_start(b) <= pos`.
    #[inline]
    pub fn block_of_position(&self, pos: u64) -> u64 {
        // block_start(b) <= pos  ⇔  b·n < (pos + 1)·classes  ⇔  b <= ((pos + 1)·classes − 1) / n;
        // pos < n < 2^32 and classes < 2^32, so the product fits in 64 bits.
        ((pos + 1) * self.classes - 1) / self.n
    }

    /// Position of vertex `v`.
    #[inline]
    pub fn position(&self, v: NodeId) -> u64 {
        self.perm.forward(v as u64)
    }

    /// The vertex at position `pos`.
    #[inline]
    pub fn vertex_at(&self, pos: u64) -> NodeId {
        self.perm.inverse(pos) as NodeId
    }

    /// Class (block) of every vertex, in vertex order.
    pub fn labels(&self) -> Vec<i64> {
        (0..self.n)
            .into_par_iter()
            .map(|v| self.block_of_position(self.perm.forward(v)) as i64)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_are_balanced_and_consistent() {
        for (n, c) in [(10u64, 3usize), (7, 7), (1000, 8), (1, 1), (9, 2)] {
            let layout = BlockLayout::new(n, c, 5);
            for pos in 0..n {
                let b = layout.block_of_position(pos);
                assert!(b < c as u64);
                assert!(layout.block_start(b) <= pos && pos < layout.block_start(b + 1));
            }
            let labels = layout.labels();
            let mut sizes = vec![0u64; c];
            for &l in &labels {
                sizes[l as usize] += 1;
            }
            let (lo, hi) = (sizes.iter().min().unwrap(), sizes.iter().max().unwrap());
            assert!(hi - lo <= 1, "n={n} c={c}: sizes {sizes:?}");
            for v in 0..n as NodeId {
                assert_eq!(layout.vertex_at(layout.position(v)), v);
            }
        }
    }
}
