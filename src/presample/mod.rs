//! Pre-sampling (GSplit): run the training sampler for a few epochs before partitioning and
//! count how often every vertex is computed at every layer and every stored edge is sampled.
//! The averaged counts become METIS weights (`weights.h5`), so that a partition balances
//! the sampled load of every layer and cuts few sampled edges; the same sampling loop also
//! measures a given partition's split statistics (imbalance and cross-split edges).
//!
//! * [`run_sampler`]: the training sampler over a whole dataset, keyed exactly as training
//!   keys it (`BatchKey { seed, epoch, batch }`, epochs `0..K`, batches from
//!   [`epoch_batches`]), handing every mini-batch's blocks and sampled edge positions to a
//!   visitor;
//! * [`counts`]: per-vertex per-layer and per-edge counts, and their scaling into weights;
//! * [`split_stats`]: per-layer load per part, imbalance and cross-split edges of a partition.

pub mod counts;
pub mod split_stats;

pub use counts::{LayerCounts, WEIGHT_MAX};
pub use split_stats::{part_of_original_ids, HopSplit, SplitStats, SplitStatsAccumulator};

use crate::graph::{Dataset, NodeId};
use crate::sample::ahead::{window_size, SampleAhead, MAX_WINDOW};
use crate::sample::positions::sample_neighbor_positions;
use crate::sample::{epoch_batches, sample_blocks_with, BatchKey, Block, LocalGraph};
use crate::util::progress::Progress;
use anyhow::{bail, Result};
use std::convert::Infallible;

/// The sampler that pre-sampling runs: the training run's `fanouts`, `batch_size` and
/// `seed`, for `epochs` epochs (`0..epochs`, as training numbers them).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SamplerSpec {
    /// Neighbours per hop from the seeds outward (`-1`: all), as `gnnpar train --fanouts`.
    pub fanouts: Vec<i32>,
    /// Training seeds per mini-batch (≥ 1).
    pub batch_size: usize,
    /// Epochs to sample (≥ 1).
    pub epochs: u64,
    /// The run's seed: batch order and neighbour choice, as in training.
    pub seed: u64,
    /// Batches sampled side by side, each on a thread of its own
    /// ([`crate::sample::ahead`]); `None`: the threads (at most 16, and as many as the id
    /// tables fit in 1 GiB). Changes no count.
    pub sample_ahead: Option<usize>,
}

impl SamplerSpec {
    /// Check the options; errors name the command-line option.
    pub fn validate(&self) -> Result<()> {
        if self.fanouts.is_empty() {
            bail!("--fanouts is empty; give one fanout per layer, e.g. 15,10,5");
        }
        if let Some(f) = self.fanouts.iter().find(|&&f| f == 0 || f < -1) {
            bail!(
                "--fanouts {:?}: {f} is not a fanout (expected a positive count, or -1 for all \
                 neighbours)",
                self.fanouts
            );
        }
        if self.batch_size == 0 {
            bail!("--batch-size must be at least 1 (got 0)");
        }
        if self.sample_ahead == Some(0) {
            bail!("--sample-ahead must be at least 1 (got 0; 1: one batch at a time)");
        }
        if self.epochs == 0 {
            bail!("--epochs must be at least 1 (got 0)");
        }
        Ok(())
    }

    /// Number of hops (= GNN layers).
    pub fn hops(&self) -> usize {
        self.fanouts.len()
    }
}

/// Run the training sampler over the whole dataset `ds` for `spec.epochs` epochs, calling
/// `visit(blocks, positions)` for every mini-batch in order (epoch by epoch, batch by batch).
///
/// `blocks` are input layer first, as [`sample_blocks`](crate::sample::sample_blocks) returns
/// them (identical to what a 1-rank training run samples); `positions[h]` holds, for hop `h`
/// (0 = the seeds' hop, whose block is `blocks[L - 1]`), the index in `ds.graph.indices` of
/// every edge of that block, in the block's edge order. Returns the number of mini-batches.
pub fn run_sampler(
    ds: &Dataset,
    spec: &SamplerSpec,
    mut visit: impl FnMut(&[Block], &[Vec<usize>]),
) -> Result<u64> {
    spec.validate()?;
    if !ds.is_whole() {
        bail!(
            "dataset `{}` holds vertices {}..{} of {}: pre-sampling needs the whole dataset, \
             not a part",
            ds.name,
            ds.first_node,
            ds.first_node + ds.local_nodes() as u64,
            ds.num_nodes
        );
    }
    let train: &[NodeId] = &ds.splits.train;
    if train.is_empty() {
        bail!(
            "dataset `{}` has an empty `train_idx`: there are no mini-batches to pre-sample",
            ds.name
        );
    }
    let graph = LocalGraph::new(ds, None);
    let per_epoch = train.len().div_ceil(spec.batch_size) as u64;
    let mut progress = Progress::new("presample", per_epoch * spec.epochs);
    let mut batches_seen = 0u64;
    // A batch's blocks and, per hop, the positions of its sampled edges.
    let sample_batch = |seeds: &[NodeId], key: BatchKey| {
        let mut positions: Vec<Vec<usize>> = Vec::with_capacity(spec.hops());
        let blocks: Result<Vec<Block>, Infallible> =
            sample_blocks_with(seeds, &spec.fanouts, key, |frontier, fanout, lkey| {
                let drawn = sample_neighbor_positions(&graph, frontier, fanout, lkey);
                positions.push(drawn.positions);
                Ok(drawn.sampled)
            });
        match blocks {
            Ok(blocks) => (blocks, positions),
            Err(never) => match never {},
        }
    };
    // Whole batches side by side, visited in order all the same. From two threads: a batch
    // drawn with its edges' positions is a mostly serial pass, and on the 2-core VM windows
    // of two took 2 epochs of the 200k SBM from 4.3-4.9 s to 3.1-3.2 s.
    let threads = rayon::current_num_threads();
    let window = window_size(
        Some(spec.sample_ahead.unwrap_or(threads.min(MAX_WINDOW))),
        threads,
        ds.num_nodes,
    );
    let mut ahead = (window > 1).then(|| SampleAhead::new(window));
    for epoch in 0..spec.epochs {
        let batches = epoch_batches(train, |v| v as u64, spec.seed, epoch, spec.batch_size);
        let key_of = |b: usize| BatchKey {
            seed: spec.seed,
            epoch,
            batch: b as u64,
        };
        if let Some(ahead) = &mut ahead {
            ahead.clear();
        }
        for b in 0..batches.len() {
            let (blocks, positions) = match &mut ahead {
                Some(ahead) => {
                    ahead
                        .take_with(b, batches.len(), |i| sample_batch(&batches[i], key_of(i)))?
                        .0
                }
                None => sample_batch(&batches[b], key_of(b)),
            };
            visit(&blocks, &positions);
            batches_seen += 1;
            progress.inc(1);
        }
    }
    progress.finish();
    Ok(batches_seen)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::{Csr, Splits};
    use crate::sample::sample_blocks;

    fn ring(n: u32) -> Dataset {
        // Each vertex linked to its 6 nearest ring neighbours: degree 6, so fanout 3 samples.
        let (mut src, mut dst) = (Vec::new(), Vec::new());
        for v in 0..n {
            for d in [1, 2, 3, n - 1, n - 2, n - 3] {
                src.push(v);
                dst.push((v + d) % n);
            }
        }
        Dataset {
            name: "ring".into(),
            num_nodes: n as u64,
            first_node: 0,
            graph: Csr::from_edges(n as usize, &src, &dst),
            features: None,
            labels: None,
            num_classes: 0,
            splits: Splits {
                train: (0..n).step_by(3).collect(),
                ..Default::default()
            },
            directed: false,
        }
    }

    #[test]
    fn sampler_matches_training_blocks_and_positions_match_edges() {
        let ds = ring(200);
        let spec = SamplerSpec {
            fanouts: vec![3, 2],
            batch_size: 16,
            epochs: 2,
            seed: 5,
            sample_ahead: None,
        };
        let graph = LocalGraph::new(&ds, None);
        let mut expected = Vec::new();
        for epoch in 0..2 {
            for (b, seeds) in epoch_batches(&ds.splits.train, |v| v as u64, 5, epoch, 16)
                .iter()
                .enumerate()
            {
                let key = BatchKey {
                    seed: 5,
                    epoch,
                    batch: b as u64,
                };
                expected.push(sample_blocks(&graph, seeds, &[3, 2], key));
            }
        }
        // One batch at a time, and windows of 3 and 5 batches side by side (5 batches an
        // epoch: windows of 3 cut at the epoch's end): the same batches, visited in order.
        for ahead in [Some(1), Some(3), Some(5)] {
            let spec = SamplerSpec {
                sample_ahead: ahead,
                ..spec.clone()
            };
            let mut seen = 0usize;
            let batches = run_sampler(&ds, &spec, |blocks, positions| {
                assert_eq!(blocks, expected[seen].as_slice());
                for (h, pos) in positions.iter().enumerate() {
                    let block = &blocks[blocks.len() - 1 - h];
                    assert_eq!(pos.len(), block.num_edges());
                    for i in 0..block.num_dst {
                        let v = block.src_nodes[i] as usize;
                        let row = ds.graph.indptr[v] as usize..ds.graph.indptr[v + 1] as usize;
                        for (k, &s) in block.in_edges(i).iter().enumerate() {
                            let e = pos[block.indptr[i] + k];
                            assert!(row.contains(&e));
                            assert_eq!(ds.graph.indices[e], block.src_nodes[s as usize]);
                        }
                    }
                }
                seen += 1;
            })
            .unwrap();
            assert_eq!(batches as usize, expected.len());
            assert_eq!(seen, expected.len());
        }
    }

    #[test]
    fn bad_specs_name_the_option() {
        let ok = SamplerSpec {
            fanouts: vec![3],
            batch_size: 4,
            epochs: 1,
            seed: 0,
            sample_ahead: None,
        };
        let err = |s: SamplerSpec| s.validate().unwrap_err().to_string();
        assert!(err(SamplerSpec {
            sample_ahead: Some(0),
            ..ok.clone()
        })
        .contains("--sample-ahead"));
        assert!(err(SamplerSpec {
            fanouts: vec![],
            ..ok.clone()
        })
        .contains("--fanouts"));
        assert!(err(SamplerSpec {
            fanouts: vec![3, 0],
            ..ok.clone()
        })
        .contains("--fanouts"));
        assert!(err(SamplerSpec {
            batch_size: 0,
            ..ok.clone()
        })
        .contains("--batch-size"));
        assert!(err(SamplerSpec {
            epochs: 0,
            ..ok.clone()
        })
        .contains("--epochs"));
        let mut ds = ring(30);
        ds.splits.train.clear();
        let e = run_sampler(&ds, &ok, |_, _| {}).unwrap_err().to_string();
        assert!(e.contains("train_idx"), "{e}");
    }
}
