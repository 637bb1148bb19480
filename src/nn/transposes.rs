//! Which of a mini-batch's blocks the model's backward reads transposed, known before the step,
//! so that a prefetch worker builds those transposes while the device trains.
//!
//! Why: on a device the training thread's host work bounds a mini-batch step (the GPU waits for
//! its launches and uploads), and a transpose built on first use put a counting sort over the
//! block's edges on that thread in every backward. The rule per layer mirrors the backward
//! passes: SAGE's and GCN's aggregate-first form reads the transpose only for the input gradient,
//! their project-first and sparse-input forms always; GAT always; a dense layer never. A wrong
//! answer costs time, never a number: a transpose not built ahead is built on first use as
//! before, and one built in vain is dropped (`tests`: the rule against what a backward built).

use crate::backend::cpu::aggregate::BlockTranspose;
use crate::backend::cpu::sparse::CsrMatrix;
use crate::sample::Block;

/// Whether one layer's backward reads its block's transpose.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TransposeRule {
    Never,
    Always,
    /// Unless the layer aggregates before it projects on this block ([`aggregate_first`]) and
    /// its input rows are dense.
    UnlessAggregateFirst {
        in_dim: usize,
        out_dim: usize,
    },
}

impl TransposeRule {
    /// Whether the backward reads `block`'s transpose; `sparse_input`: the layer takes its
    /// input rows in sparse form (the model's first layer on mostly-zero features).
    pub fn reads(&self, block: &Block, sparse_input: bool) -> bool {
        match *self {
            TransposeRule::Never => false,
            TransposeRule::Always => true,
            TransposeRule::UnlessAggregateFirst { in_dim, out_dim } => {
                sparse_input || !aggregate_first(block, in_dim, out_dim)
            }
        }
    }
}

/// True when aggregating `in_dim`-wide rows before projecting them to `out_dim` costs fewer
/// multiply-adds on `block` than projecting first (SAGE's and GCN's choice of form).
pub fn aggregate_first(block: &Block, in_dim: usize, out_dim: usize) -> bool {
    let (e, ns, nd) = (block.num_edges(), block.num_src(), block.num_dst);
    let (i, o) = (in_dim, out_dim);
    e * i + nd * i * o <= ns * i * o + e * o
}

/// Layers a [`TransposePlan`] covers; deeper layers' transposes are built on first use.
/// (A plan is `Copy`, as the batch sources the prefetch workers share are.)
const PLANNED_LAYERS: usize = 16;

/// A model's [`TransposeRule`] per layer, or none (a host backend builds each transpose on
/// first use, beside the product that needs it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TransposePlan {
    layers: usize,
    rules: [TransposeRule; PLANNED_LAYERS],
}

impl TransposePlan {
    /// Build nothing ahead.
    pub fn none() -> TransposePlan {
        TransposePlan {
            layers: 0,
            rules: [TransposeRule::Never; PLANNED_LAYERS],
        }
    }

    /// The rules of a model's layers, input layer first (those past [`PLANNED_LAYERS`] are
    /// left to first use).
    pub fn of(rules: impl IntoIterator<Item = TransposeRule>) -> TransposePlan {
        let mut plan = TransposePlan::none();
        for (slot, rule) in plan.rules.iter_mut().zip(rules) {
            *slot = rule;
            plan.layers += 1;
        }
        plan
    }

    /// Whether layer `l`'s backward reads `block`'s transpose (false past the plan).
    pub fn reads(&self, l: usize, block: &Block, sparse_input: bool) -> bool {
        l < self.layers && self.rules[l].reads(block, sparse_input && l == 0)
    }

    /// The transposes of a batch that the backward reads: of `blocks` (input layer first),
    /// and of the input rows when they come sparse (`sparse_input`; its weight gradient
    /// `xᵀ·d` on a device gathers over it; the CPU's product needs none, so without a plan it
    /// is built on first use, if ever).
    pub fn build<'b>(
        &self,
        blocks: impl IntoIterator<Item = &'b Block>,
        sparse_input: Option<&CsrMatrix>,
    ) -> (Vec<Option<BlockTranspose>>, Option<BlockTranspose>) {
        let input = sparse_input
            .filter(|_| self.layers > 0 && self.rules[0] != TransposeRule::Never)
            .map(|x| BlockTranspose::of_csr(x.ncols, &x.indptr, &x.indices));
        (self.build_from(0, blocks, sparse_input.is_some()), input)
    }

    /// [`TransposePlan::build`] for the blocks of layers `first..` (a strategy whose input
    /// layer takes no block transpose, SNP's, builds its upper layers' only).
    pub fn build_from<'b>(
        &self,
        first: usize,
        blocks: impl IntoIterator<Item = &'b Block>,
        sparse_input: bool,
    ) -> Vec<Option<BlockTranspose>> {
        blocks
            .into_iter()
            .enumerate()
            .map(|(i, b)| {
                self.reads(first + i, b, sparse_input)
                    .then(|| BlockTranspose::new(b))
            })
            .collect()
    }
}
