//! The global order of training seeds in an epoch, and its cut into mini-batches.
//!
//! The order is defined over ORIGINAL vertex ids, so it is the same whatever the partitioning,
//! the rank count and the strategy (ARCHITECTURE invariant 3). In a distributed run every rank
//! computes the same global batches from the global training set and takes the seeds it owns.

use super::rng::hash_key;
use crate::graph::NodeId;
use rayon::prelude::*;

/// Sort key of a training vertex with original id `orig` in `epoch`: a hash, then the
/// original id to break (astronomically rare) ties.
#[inline]
pub fn seed_order_key(seed: u64, epoch: u64, orig: u64) -> (u64, u64) {
    (hash_key(&[seed, epoch, orig]), orig)
}

/// The mini-batches of `epoch`: `train` sorted by [`seed_order_key`] of `orig_of(v)`, cut into
/// batches of `batch_size` (the last one smaller). `batch_size == 0` means one batch holding
/// the whole training set. An empty training set gives no batches.
pub fn epoch_batches(
    train: &[NodeId],
    orig_of: impl Fn(NodeId) -> u64,
    seed: u64,
    epoch: u64,
    batch_size: usize,
) -> Vec<Vec<NodeId>> {
    let mut keyed: Vec<((u64, u64), NodeId)> = train
        .iter()
        .map(|&v| (seed_order_key(seed, epoch, orig_of(v)), v))
        .collect();
    // A total order on whole elements: the unstable sort's result does not depend on the
    // input order or the thread count.
    keyed.par_sort_unstable();
    let size = if batch_size == 0 {
        keyed.len().max(1)
    } else {
        batch_size
    };
    keyed
        .chunks(size)
        .map(|c| c.iter().map(|&(_, v)| v).collect())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_cover_the_train_set_once_with_a_short_last_batch() {
        let train: Vec<NodeId> = (0..10).map(|i| i * 3).collect();
        let b = epoch_batches(&train, |v| v as u64, 1, 0, 4);
        assert_eq!(b.iter().map(Vec::len).collect::<Vec<_>>(), vec![4, 4, 2]);
        let mut all: Vec<NodeId> = b.concat();
        all.sort_unstable();
        assert_eq!(all, train);
    }

    #[test]
    fn zero_batch_size_is_one_batch_and_empty_train_is_no_batch() {
        let train: Vec<NodeId> = (0..5).collect();
        assert_eq!(epoch_batches(&train, |v| v as u64, 1, 0, 0).len(), 1);
        assert!(epoch_batches(&[], |v| v as u64, 1, 0, 8).is_empty());
    }
}
