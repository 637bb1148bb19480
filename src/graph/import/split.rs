//! Train / validation / test splits: from boolean masks, or drawn at random (seeded) for sources
//! that have none.

use crate::graph::{NodeId, Splits};
use anyhow::{bail, Result};

/// Ids of the `true` entries of `mask`, ascending.
pub fn ids_of(mask: &[bool]) -> Vec<NodeId> {
    mask.iter()
        .enumerate()
        .filter(|(_, &m)| m)
        .map(|(i, _)| i as NodeId)
        .collect()
}

/// Fractions of a random split; the test set gets the rest.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Fractions {
    pub train: f64,
    pub val: f64,
}

impl Default for Fractions {
    /// 50 / 25 / 25, the proportions of the heterophilous benchmark.
    fn default() -> Self {
        Fractions {
            train: 0.5,
            val: 0.25,
        }
    }
}

impl Fractions {
    /// Check the fractions: train in (0, 1], val in [0, 1), train + val ≤ 1.
    pub fn validate(&self) -> Result<()> {
        let Fractions { train, val } = *self;
        if !(train > 0.0 && train <= 1.0) {
            bail!("--train-frac is {train}; expected a fraction in (0, 1]");
        }
        if !(0.0..1.0).contains(&val) {
            bail!("--val-frac is {val}; expected a fraction in [0, 1)");
        }
        if train + val > 1.0 + 1e-12 {
            bail!("--train-frac {train} plus --val-frac {val} exceed 1");
        }
        Ok(())
    }
}

/// A random split of `0..num_nodes`, a permutation drawn from `seed` (the same for every thread
/// count and platform), cut by `fractions`; each list sorted.
pub fn random(num_nodes: usize, fractions: Fractions, seed: u64) -> Result<Splits> {
    fractions.validate()?;
    if num_nodes == 0 {
        bail!("cannot split a graph without vertices");
    }
    let mut order: Vec<NodeId> = (0..num_nodes as u64).map(|v| v as NodeId).collect();
    let mut rng = SplitMix64(seed ^ 0x6a09_e667_f3bc_c908);
    // Fisher-Yates from the back.
    for i in (1..order.len()).rev() {
        let j = (rng.next() % (i as u64 + 1)) as usize;
        order.swap(i, j);
    }
    let n_train = ((num_nodes as f64 * fractions.train).round() as usize).clamp(1, num_nodes);
    let n_val = ((num_nodes as f64 * fractions.val).round() as usize).min(num_nodes - n_train);
    let mut train = order[..n_train].to_vec();
    let mut val = order[n_train..n_train + n_val].to_vec();
    let mut test = order[n_train + n_val..].to_vec();
    train.sort_unstable();
    val.sort_unstable();
    test.sort_unstable();
    Ok(Splits { train, val, test })
}

/// SplitMix64 (Steele, Lea & Flood 2014): tiny, fast and good enough for a shuffle.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_split_is_a_seeded_partition() {
        let s = random(1000, Fractions::default(), 7).unwrap();
        assert_eq!((s.train.len(), s.val.len(), s.test.len()), (500, 250, 250));
        let mut all: Vec<_> = s
            .train
            .iter()
            .chain(&s.val)
            .chain(&s.test)
            .copied()
            .collect();
        all.sort_unstable();
        assert_eq!(all, (0..1000).collect::<Vec<_>>());
        assert_eq!(s, random(1000, Fractions::default(), 7).unwrap());
        assert_ne!(
            s.train,
            random(1000, Fractions::default(), 8).unwrap().train
        );
    }

    #[test]
    fn bad_fractions_are_refused() {
        let bad = Fractions {
            train: 0.8,
            val: 0.3,
        };
        assert!(random(10, bad, 0)
            .unwrap_err()
            .to_string()
            .contains("exceed 1"));
        let zero = Fractions {
            train: 0.0,
            val: 0.1,
        };
        assert!(random(10, zero, 0).is_err());
    }

    #[test]
    fn mask_ids() {
        assert_eq!(ids_of(&[false, true, true, false]), vec![1, 2]);
    }
}
