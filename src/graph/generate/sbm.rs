//! Stochastic block model: `classes` blocks of near-equal size over a seeded permutation of the
//! ids; each undirected pair picks a uniform first end, then its second end inside the same
//! block with probability `homophily`, else uniformly among the vertices of the other blocks.
//! Labels are blocks; features are class centroids plus noise (see [`super::features`]).

use super::blocks::BlockLayout;
use super::rng::{SplitMix64, Stream};
use super::stream::{build_symmetric_csr, chunk_range, PairSource};
use super::{finish_dataset, CommonParams, Generated};
use crate::graph::NodeId;
use anyhow::{bail, Result};

/// Fraction of pairs drawn inside a block when none is given.
pub const DEFAULT_HOMOPHILY: f64 = 0.8;

/// Parameters of [`super::sbm`].
#[derive(Clone, Debug, PartialEq)]
pub struct SbmParams {
    /// Sizes, seed, features and splits.
    pub common: CommonParams,
    /// Probability that a drawn pair lies inside one block (`--homophily`, in [0, 1]). With one
    /// class every pair does.
    pub homophily: f64,
}

impl SbmParams {
    /// SBM parameters with the default homophily.
    pub fn new(common: CommonParams) -> Self {
        SbmParams {
            common,
            homophily: DEFAULT_HOMOPHILY,
        }
    }

    /// Check every option; errors name the option.
    pub fn validate(&self) -> Result<()> {
        self.common.validate()?;
        if !(0.0..=1.0).contains(&self.homophily) {
            bail!(
                "--homophily = {} is outside [0, 1] (the fraction of edges drawn inside a block)",
                self.homophily
            );
        }
        Ok(())
    }
}

/// The pairs of an SBM, drawn chunk by chunk.
struct SbmPairs<'a> {
    layout: &'a BlockLayout,
    n: u64,
    classes: u64,
    pairs: u64,
    homophily: f64,
    seed: u64,
}

impl PairSource for SbmPairs<'_> {
    fn num_pairs(&self) -> u64 {
        self.pairs
    }

    fn draw_chunk<F: FnMut(NodeId, NodeId)>(&self, chunk: u64, mut emit: F) {
        let mut rng = SplitMix64::for_item(self.seed, Stream::Edges, chunk);
        for _ in chunk_range(chunk, self.pairs) {
            let pos_u = rng.below(self.n);
            let block = self.layout.block_of_position(pos_u);
            let start = self.layout.block_start(block);
            let size = self.layout.block_start(block + 1) - start;
            let inside = rng.unit() < self.homophily || self.classes == 1;
            let pos_v = if inside {
                start + rng.below(size)
            } else {
                // Uniform over the positions outside [start, start + size).
                let r = rng.below(self.n - size);
                if r >= start {
                    r + size
                } else {
                    r
                }
            };
            emit(self.layout.vertex_at(pos_u), self.layout.vertex_at(pos_v));
        }
    }
}

/// Generate the SBM described by `params`, with what happened to the drawn pairs.
pub fn generate(params: &SbmParams) -> Result<Generated> {
    params.validate()?;
    let c = &params.common;
    let layout = BlockLayout::new(c.nodes, c.classes, c.seed);
    let source = SbmPairs {
        layout: &layout,
        n: c.nodes,
        classes: c.classes as u64,
        pairs: c.edges / 2,
        homophily: params.homophily,
        seed: c.seed,
    };
    let (graph, stats) = build_symmetric_csr(c.nodes as usize, &source);
    Ok(finish_dataset(c, graph, layout.labels(), stats))
}
