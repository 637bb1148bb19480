//! R-MAT (Chakrabarti, Zhan & Faloutsos 2004): each pair descends `log2 N` levels of the
//! adjacency matrix, choosing one quadrant per level with probabilities `(a, b, c, d)`, which
//! gives power-law degrees. `N` is rounded up to a power of two for the descent and pairs with
//! an end `≥ N` are drawn again; the ids are then scattered by a seeded bijection of `[0, N)`,
//! so a vertex's degree does not follow from its id (partitioners get no free locality).
//!
//! R-MAT has no communities; labels are balanced seeded random classes and features are class
//! centroids plus noise, so the graph can be trained on (features carry the signal).

use super::bijection::Bijection;
use super::blocks::BlockLayout;
use super::rng::{SplitMix64, Stream};
use super::stream::{build_symmetric_csr, chunk_range, PairSource};
use super::{finish_dataset, CommonParams, Generated};
use crate::graph::NodeId;
use anyhow::{bail, Result};

/// Quadrant probabilities used when none are given (Graph500's).
pub const DEFAULT_ABCD: [f64; 4] = [0.57, 0.19, 0.19, 0.05];

/// Parameters of [`super::rmat`].
#[derive(Clone, Debug, PartialEq)]
pub struct RmatParams {
    /// Sizes, seed, features and splits.
    pub common: CommonParams,
    /// Quadrant probabilities `a, b, c, d` (top-left, top-right, bottom-left, bottom-right):
    /// non-negative, summing to 1, with `a` the largest.
    pub abcd: [f64; 4],
}

impl RmatParams {
    /// R-MAT parameters with the default quadrant probabilities.
    pub fn new(common: CommonParams) -> Self {
        RmatParams {
            common,
            abcd: DEFAULT_ABCD,
        }
    }

    /// Check every option; errors name the option.
    pub fn validate(&self) -> Result<()> {
        self.common.validate()?;
        let [a, b, c, d] = self.abcd;
        if let Some(p) = self.abcd.iter().find(|p| !p.is_finite() || **p < 0.0) {
            bail!("--abcd holds {p}; each of a, b, c, d must be a probability ≥ 0");
        }
        let sum = a + b + c + d;
        if (sum - 1.0).abs() > 1e-6 {
            bail!("--abcd = {a},{b},{c},{d} sums to {sum}; the four probabilities must sum to 1");
        }
        // With `a` the largest, a pair lands in the top-left quadrant (both ids < N) with
        // probability ≥ 1/4, so redrawing out-of-range pairs always ends quickly.
        if a < b.max(c).max(d) {
            bail!(
                "--abcd = {a},{b},{c},{d}: `a` must be the largest probability \
                 (R-MAT puts the dense corner at the top left)"
            );
        }
        Ok(())
    }
}

/// The pairs of an R-MAT graph, drawn chunk by chunk.
struct RmatPairs {
    n: u64,
    pairs: u64,
    levels: u32,
    /// Cumulative quadrant thresholds `a, a + b, a + b + c` scaled to 2^32.
    thresholds: [u64; 3],
    scramble: Bijection,
    seed: u64,
}

impl RmatPairs {
    /// One descent: the (row, column) of a cell of the 2^levels × 2^levels matrix.
    #[inline]
    fn descend(&self, rng: &mut SplitMix64) -> (u64, u64) {
        let (mut row, mut col) = (0u64, 0u64);
        let mut bits = 0u64;
        for level in 0..self.levels {
            // 32 random bits per level: two levels per draw.
            if level % 2 == 0 {
                bits = rng.next_u64();
            } else {
                bits >>= 32;
            }
            let r = bits & 0xffff_ffff;
            // Quadrant without branches (they would mispredict about half the time):
            // r < t0 → (0, 0); t0 ≤ r < t1 → (0, 1); t1 ≤ r < t2 → (1, 0); t2 ≤ r → (1, 1).
            let [past_a, past_b, past_c] = self.thresholds.map(|t| (r >= t) as u64);
            row = (row << 1) | past_b;
            col = (col << 1) | (past_a ^ past_b ^ past_c);
        }
        (row, col)
    }
}

impl PairSource for RmatPairs {
    fn num_pairs(&self) -> u64 {
        self.pairs
    }

    fn draw_chunk<F: FnMut(NodeId, NodeId)>(&self, chunk: u64, mut emit: F) {
        let mut rng = SplitMix64::for_item(self.seed, Stream::Edges, chunk);
        for _ in chunk_range(chunk, self.pairs) {
            let (u, v) = loop {
                let (u, v) = self.descend(&mut rng);
                if u < self.n && v < self.n {
                    break (u, v);
                }
            };
            emit(
                self.scramble.forward(u) as NodeId,
                self.scramble.forward(v) as NodeId,
            );
        }
    }
}

/// Generate the R-MAT graph described by `params`, with what happened to the drawn pairs.
pub fn generate(params: &RmatParams) -> Result<Generated> {
    params.validate()?;
    let c = &params.common;
    let [a, b, cc, _] = params.abcd;
    let scale = |p: f64| ((p * 4_294_967_296.0).round() as u64).min(1 << 32);
    let source = RmatPairs {
        n: c.nodes,
        pairs: c.edges / 2,
        levels: 64 - (c.nodes - 1).leading_zeros(),
        thresholds: [scale(a), scale(a + b), scale(a + b + cc)],
        scramble: Bijection::new(c.nodes, c.seed, Stream::Scramble),
        seed: c.seed,
    };
    let (graph, stats) = build_symmetric_csr(c.nodes as usize, &source);
    let labels = BlockLayout::new(c.nodes, c.classes, c.seed).labels();
    Ok(finish_dataset(c, graph, labels, stats))
}
