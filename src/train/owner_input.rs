//! What the first-layer strategies DNP and SNP share: the upper layers run data parallel as in
//! GDP, while the input layer of every vertex of the input frontier is computed once for all
//! ranks — by the vertex's owner (DNP), or by the owners of its sources with the partial sums
//! added up at the vertex's owner (SNP) — and its rows travel to the ranks whose upper layers
//! read them.
//!
//! A rank samples the upper layers of its seeds (owner-computes, like GDP). Their input
//! frontier is sent to the owners ([`RowExchange::to_owners`]); each owner re-samples the input
//! hop of the vertices it was asked for (the draw is a pure function of the vertex, so the
//! edges are those GDP would have). Backward reverses the plan: gradients of the input layer's
//! rows are summed at the owner.

use super::data::TrainData;
use super::metrics::PhaseTimes;
use super::strategy::{upper_layers_data_parallel, BatchSpec, StepOutput};
use crate::backend::{Backend, LossSum};
use crate::comm::Group;
use crate::exchange::{sample_blocks_distributed, RowExchange};
use crate::graph::NodeId;
use crate::nn::{DropoutCtx, Model};
use crate::sample::{build_block, sample_neighbors, Block, LocalGraph};

/// One mini-batch as a first-layer strategy samples it on one rank.
pub struct OwnerBatch {
    /// The seeds of the global mini-batch this rank owns.
    pub seeds: Vec<NodeId>,
    /// The upper blocks (hops `0..L-1` from the seeds, input-most first), as GDP samples them.
    pub upper: Vec<Block>,
    /// Brings the input layer's rows of the upper layers' frontier from their owners.
    pub plan: RowExchange,
    /// The input hop of the frontier vertices this rank owns and was asked for (its
    /// destinations, in [`OwnerBatch::plan`]'s row order).
    pub input_block: Block,
    /// Destination rows and edges of every block, for the step's counts (the blocks may move
    /// to a backend).
    counts: (usize, usize),
}

impl OwnerBatch {
    /// Sample `spec`'s mini-batch (global ids; this rank takes the seeds it owns). The
    /// planner's dry run samples this way too, so what it counts is what DNP and SNP train on.
    /// Collective.
    pub fn sample(group: &Group, data: &TrainData, spec: BatchSpec) -> OwnerBatch {
        let BatchSpec {
            batch,
            fanouts,
            key,
            self_loops,
        } = spec;
        let layers = fanouts.len();
        let seeds: Vec<NodeId> = batch.iter().copied().filter(|&v| data.owns(v)).collect();
        let graph = LocalGraph::new(&data.part, data.orig_ids.as_deref());
        let mut upper = sample_blocks_distributed(
            group,
            &graph,
            &data.offsets,
            &seeds,
            &fanouts[..layers - 1],
            key,
        );
        let (plan, mine) =
            RowExchange::to_owners(group, &data.offsets, Self::frontier_of(&seeds, &upper));
        let input_hop = (layers - 1) as u32;
        let sampled = sample_neighbors(&graph, &mine, fanouts[layers - 1], key.layer(input_hop));
        let mut input_block = build_block(&mine, &sampled);
        if self_loops {
            input_block = input_block.with_self_loops();
            upper = upper.iter().map(Block::with_self_loops).collect();
        }
        let counts = (
            input_block.num_dst + upper.iter().map(|b| b.num_dst).sum::<usize>(),
            input_block.num_edges() + upper.iter().map(|b| b.num_edges()).sum::<usize>(),
        );
        OwnerBatch {
            seeds,
            upper,
            plan,
            input_block,
            counts,
        }
    }

    /// The input frontier of the upper layers: the sources of the lowest upper block, or the
    /// seeds themselves for a one-layer model.
    pub fn frontier(&self) -> &[NodeId] {
        Self::frontier_of(&self.seeds, &self.upper)
    }

    fn frontier_of<'a>(seeds: &'a [NodeId], upper: &'a [Block]) -> &'a [NodeId] {
        upper.first().map_or(seeds, |b| &b.src_nodes)
    }

    /// The upper blocks, moved to backend `be` (the CPU keeps the blocks themselves).
    pub fn take_upper<B: Backend>(&mut self, be: &B) -> Vec<B::Graph> {
        std::mem::take(&mut self.upper)
            .into_iter()
            .map(|b| be.graph(b))
            .collect()
    }

    /// From this rank's input-layer rows `h_mine` (one per destination of
    /// [`OwnerBatch::input_block`], on the model's backend): send them to the ranks that asked
    /// (`kinds.0`), run the upper layers (`upper`: [`OwnerBatch::upper`] on the backend) and
    /// the loss over the seeds, back-propagate (with `transposes[i]`, `upper[i]`'s transpose
    /// where the batch came with it), and return the loss sum and the gradient of `h_mine`
    /// summed over the ranks that read each row (`kinds.1`). Collective.
    #[allow(clippy::too_many_arguments)]
    pub fn upper_layers<B: Backend>(
        &self,
        model: &mut Model<B>,
        upper: &[B::Graph],
        transposes: &[B::Transpose],
        data: &TrainData,
        group: &Group,
        h_mine: B::View<'_>,
        ctx: &DropoutCtx,
        scale: f32,
        times: &mut PhaseTimes,
        kinds: (&'static str, &'static str),
    ) -> (LossSum, B::Mat) {
        let be = model.params.backend().clone();
        let h = times.time_shuffle(|| self.plan.forward_on(group, &be, kinds.0, h_mine));
        let labels: Vec<i64> = self.seeds.iter().map(|&s| data.label(s)).collect();
        let (loss_sum, d_h) =
            upper_layers_data_parallel(model, upper, transposes, h, &labels, ctx, scale, times);

        let d_mine = times.time_shuffle(|| {
            let (rows, cols) = be.dim(h_mine);
            let mut d_mine = be.zeros(rows, cols);
            self.plan
                .backward_on(group, &be, kinds.1, be.view(&d_h), be.view_mut(&mut d_mine));
            d_mine
        });
        (loss_sum, d_mine)
    }

    /// The step's counts; `input_rows` is what the input layer read.
    pub fn output(&self, loss_sum: LossSum, input_rows: usize) -> StepOutput {
        StepOutput {
            loss_sum,
            seeds: self.seeds.len() as u64,
            nodes: self.counts.0 as u64,
            edges: self.counts.1 as u64,
            input_rows: input_rows as u64,
        }
    }
}
