//! Parallel strategies: how the ranks share the work of one global mini-batch.
//!
//! Every strategy computes, on each rank, the gradient of the summed loss over that rank's
//! share of the global mini-batch; the loop then sums gradients over ranks and divides by the
//! global batch size, so the mean loss over the global mini-batch is what gets minimised
//! whatever the rank count (ARCHITECTURE invariant 4).

use super::data::TrainData;
use super::metrics::PhaseTimes;
use crate::graph::NodeId;
use crate::nn::{cross_entropy, DropoutCtx, Model};
use crate::sample::{sample_blocks, BatchKey, Block, LocalGraph};
use anyhow::Result;
use ndarray::Array2;
use rayon::prelude::*;
use std::time::Instant;

/// Strategy names accepted by `--strategy`.
pub const KNOWN: &[&str] = &["gdp"];

/// What one rank computed for one mini-batch.
#[derive(Clone, Debug, Default)]
pub struct StepOutput {
    /// Sum of the per-seed losses over this rank's seeds.
    pub loss_sum: f64,
    /// Destination rows computed and edges aggregated, summed over layers.
    pub nodes: u64,
    pub edges: u64,
    /// Input feature rows gathered.
    pub input_rows: u64,
}

/// The seeds of global mini-batch `batch` that rank `rank` of `ranks` computes, when every
/// rank holds the whole graph: a contiguous slice, so shares differ by at most one seed.
pub fn share_of(batch: &[NodeId], rank: usize, ranks: usize) -> &[NodeId] {
    let n = batch.len();
    &batch[n * rank / ranks..n * (rank + 1) / ranks]
}

/// Gather rows `ids` of `x` into a new matrix (parallel over rows).
pub fn gather_rows(x: &Array2<f32>, ids: &[NodeId]) -> Array2<f32> {
    let d = x.ncols();
    let mut out = Array2::<f32>::zeros((ids.len(), d));
    let src = x.as_slice().expect("feature matrix is contiguous");
    out.as_slice_mut()
        .expect("fresh matrix is contiguous")
        .par_chunks_mut(d.max(1))
        .zip(ids.par_iter())
        .for_each(|(row, &v)| {
            let v = v as usize;
            row.copy_from_slice(&src[v * d..(v + 1) * d]);
        });
    out
}

/// Data-parallel step (GDP) on a rank that holds the graph: sample the blocks of `seeds`,
/// gather their input rows, forward, loss, backward (gradients accumulate in `model`).
#[allow(clippy::too_many_arguments)]
pub fn gdp_minibatch_step(
    model: &mut Model,
    data: &TrainData,
    graph: &LocalGraph,
    seeds: &[NodeId],
    fanouts: &[i32],
    key: BatchKey,
    self_loops: bool,
    scale: f32,
    times: &mut PhaseTimes,
) -> Result<StepOutput> {
    if seeds.is_empty() {
        return Ok(StepOutput::default());
    }
    let t = Instant::now();
    let mut blocks = sample_blocks(graph, seeds, fanouts, key);
    if self_loops {
        blocks = blocks.iter().map(Block::with_self_loops).collect();
    }
    times.sample += t.elapsed().as_secs_f64();

    let t = Instant::now();
    let x = gather_rows(&data.features, &blocks[0].src_nodes);
    let labels: Vec<i64> = seeds.iter().map(|&s| data.labels[s as usize]).collect();
    times.gather += t.elapsed().as_secs_f64();

    let refs: Vec<&Block> = blocks.iter().collect();
    let out = StepOutput {
        loss_sum: 0.0,
        nodes: blocks.iter().map(|b| b.num_dst as u64).sum(),
        edges: blocks.iter().map(|b| b.num_edges() as u64).sum(),
        input_rows: blocks[0].num_src() as u64,
    };
    forward_backward(
        model, data, &refs, &x, None, &labels, key, scale, times, out,
    )
}

/// Full-batch step: the whole graph forward on every rank, loss over this rank's share of the
/// training nodes.
#[allow(clippy::too_many_arguments)]
pub fn full_batch_step(
    model: &mut Model,
    data: &TrainData,
    full: &Block,
    seeds: &[NodeId],
    key: BatchKey,
    scale: f32,
    times: &mut PhaseTimes,
) -> Result<StepOutput> {
    let refs: Vec<&Block> = vec![full; model.cfg.layers];
    let labels: Vec<i64> = seeds.iter().map(|&s| data.labels[s as usize]).collect();
    let out = StepOutput {
        loss_sum: 0.0,
        nodes: (full.num_dst * model.cfg.layers) as u64,
        edges: (full.num_edges() * model.cfg.layers) as u64,
        input_rows: full.num_src() as u64,
    };
    forward_backward(
        model,
        data,
        &refs,
        &data.features,
        Some(seeds),
        &labels,
        key,
        scale,
        times,
        out,
    )
}

/// Forward, loss of the rows `loss_rows` (all output rows when `None`), backward.
#[allow(clippy::too_many_arguments)]
fn forward_backward(
    model: &mut Model,
    data: &TrainData,
    blocks: &[&Block],
    x: &Array2<f32>,
    loss_rows: Option<&[NodeId]>,
    labels: &[i64],
    key: BatchKey,
    scale: f32,
    times: &mut PhaseTimes,
    mut out: StepOutput,
) -> Result<StepOutput> {
    let t = Instant::now();
    let ctx = DropoutCtx {
        training: true,
        stream: crate::sample::rng::hash_key(&[key.seed, key.epoch, key.batch, 0x64726f70]),
        orig_ids: data.orig_ids.as_deref(),
    };
    let (logits, cache) = model.forward(blocks, x, &ctx);
    let picked;
    let logits_for_loss = match loss_rows {
        Some(rows) => {
            picked = gather_rows(&logits, rows);
            &picked
        }
        None => &logits,
    };
    let (loss_sum, mut d_logits) = cross_entropy(logits_for_loss, labels);
    times.forward += t.elapsed().as_secs_f64();

    let t = Instant::now();
    d_logits.mapv_inplace(|g| g * scale);
    let d_out = match loss_rows {
        Some(rows) => {
            let mut full = Array2::<f32>::zeros(logits.raw_dim());
            for (i, &r) in rows.iter().enumerate() {
                full.row_mut(r as usize).assign(&d_logits.row(i));
            }
            full
        }
        None => d_logits,
    };
    model.backward(blocks, cache, &d_out);
    times.backward += t.elapsed().as_secs_f64();
    out.loss_sum = loss_sum;
    Ok(out)
}
