//! Seeded random train / validation / test splits of exact sizes: vertex `v` goes to the split
//! holding its position under a seeded permutation. Ids come out sorted.

use super::bijection::Bijection;
use super::rng::Stream;
use crate::graph::{NodeId, Splits};
use rayon::prelude::*;

/// Split sizes `(train, val, test)` for fractions of `n` vertices (rounded to the nearest
/// vertex; the test split takes the rest).
pub fn split_sizes(n: u64, train_frac: f64, val_frac: f64) -> (u64, u64, u64) {
    let train = ((train_frac * n as f64).round() as u64).min(n);
    let val = ((val_frac * n as f64).round() as u64).min(n - train);
    (train, val, n - train - val)
}

/// The splits of `n` vertices for `seed`.
pub fn random_splits(n: u64, train_frac: f64, val_frac: f64, seed: u64) -> Splits {
    let (train, val, _) = split_sizes(n, train_frac, val_frac);
    let perm = Bijection::new(n, seed, Stream::Splits);
    // 0 = train, 1 = val, 2 = test: one byte per vertex instead of three permutation passes.
    let which: Vec<u8> = (0..n)
        .into_par_iter()
        .map(|v| {
            let p = perm.forward(v);
            if p < train {
                0
            } else if p < train + val {
                1
            } else {
                2
            }
        })
        .collect();
    let pick = |k: u8| -> Vec<NodeId> {
        which
            .par_iter()
            .enumerate()
            .filter(|&(_, &w)| w == k)
            .map(|(v, _)| v as NodeId)
            .collect()
    };
    Splits {
        train: pick(0),
        val: pick(1),
        test: pick(2),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exact_sizes_disjoint_and_covering() {
        let s = random_splits(1001, 0.5, 0.25, 3);
        assert_eq!((s.train.len(), s.val.len(), s.test.len()), (501, 250, 250));
        let mut all: Vec<NodeId> = s
            .train
            .iter()
            .chain(&s.val)
            .chain(&s.test)
            .copied()
            .collect();
        assert!(s.train.windows(2).all(|w| w[0] < w[1]));
        all.sort_unstable();
        assert_eq!(all, (0..1001).collect::<Vec<_>>());
        // Not simply the first half of the ids.
        assert!(s.train.iter().any(|&v| v > 700));
    }
}
