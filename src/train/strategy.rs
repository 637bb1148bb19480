//! Parallel strategies: how the ranks share the work of one global mini-batch.
//!
//! Every strategy computes, on each rank, the gradient of the summed loss over that rank's
//! share of the global mini-batch; the loop then sums gradients over ranks and divides by the
//! global batch size, so the mean loss over the global mini-batch is what gets minimised
//! whatever the rank count (ARCHITECTURE invariant 4).

use super::data::TrainData;
use super::dump::BlockDump;
use super::metrics::PhaseTimes;
use crate::backend::cpu::aggregate::LazyTranspose;
use crate::backend::cpu::sparse::{prefers_sparse, CsrMatrix, SparseRows};
use crate::comm::Group;
use crate::exchange::inference::{FullInput, HaloPlan};
use crate::exchange::sample_blocks_distributed;
use crate::graph::NodeId;
use crate::nn::{cross_entropy, DropoutCtx, Model};
use crate::sample::rng::hash_key;
use crate::sample::{sample_blocks, BatchKey, Block, LocalGraph};
use anyhow::Result;
use ndarray::{concatenate, s, Array2, Axis, CowArray, Ix2};
use std::time::Instant;

/// Strategy names accepted by `--strategy`.
pub const KNOWN: &[&str] = &["gdp", "split", "dnp", "snp"];

/// Strategies built from the ones above: `hybrid` (GDP across nodes, split inside a node) and
/// `auto` (resolved before training to one of the others; see `train::auto`).
pub const COMPOSED: &[&str] = &["hybrid", "auto"];

/// What one rank computed for one mini-batch.
#[derive(Clone, Debug, Default)]
pub struct StepOutput {
    /// Sum of the per-seed losses over this rank's seeds.
    pub loss_sum: f64,
    /// Seeds this rank computed.
    pub seeds: u64,
    /// Destination rows computed and edges aggregated, summed over layers.
    pub nodes: u64,
    pub edges: u64,
    /// Input feature rows gathered.
    pub input_rows: u64,
}

/// What every mini-batch step needs besides the model and the data: the ranks that share the
/// mini-batch, the mini-batch, and how to sample and scale it.
#[derive(Clone, Copy)]
pub struct StepArgs<'a> {
    /// The ranks sharing this mini-batch (the world; under hybrid, the node).
    pub group: &'a Group,
    /// The global mini-batch (under hybrid, this node's share of it).
    pub batch: &'a [NodeId],
    /// Neighbours per layer, from the seeds outward.
    pub fanouts: &'a [i32],
    pub key: BatchKey,
    /// Add GCN's self-loop to every destination.
    pub self_loops: bool,
    /// 1 / global batch size: each rank returns gradients of the mean loss.
    pub scale: f32,
}

/// The dropout stream of one optimizer step (each layer mixes in its index).
fn dropout_stream(key: BatchKey) -> u64 {
    hash_key(&[key.seed, key.epoch, key.batch, 0x64726f70])
}

/// Data-parallel step (GDP): this rank takes the seeds of `batch` it owns, samples their
/// blocks with owner-computes sampling, fetches input rows from the feature store, and runs
/// forward, loss and backward (gradients accumulate in `model`). Collective: every rank calls
/// it for every mini-batch, also with no seeds of its own.
pub fn gdp_minibatch_step(
    model: &mut Model,
    data: &mut TrainData,
    args: &StepArgs,
    times: &mut PhaseTimes,
    dump: Option<(&mut BlockDump, u64)>,
) -> Result<StepOutput> {
    let StepArgs {
        group,
        batch,
        fanouts,
        key,
        self_loops,
        scale,
    } = *args;
    let seeds: Vec<NodeId> = batch.iter().copied().filter(|&v| data.owns(v)).collect();
    let t = Instant::now();
    let graph = LocalGraph::new(&data.part, data.orig_ids.as_deref());
    let mut blocks = if group.size() == 1 {
        sample_blocks(&graph, &seeds, fanouts, key)
    } else {
        sample_blocks_distributed(group, &graph, &data.offsets, &seeds, fanouts, key)
    };
    if let Some((dump, step)) = dump {
        dump.write(step, &blocks, data)?;
    }
    if self_loops {
        blocks = blocks.iter().map(Block::with_self_loops).collect();
    }
    times.sample += t.elapsed().as_secs_f64();

    let t = Instant::now();
    let x = data.store.gather(group, &blocks[0].src_nodes);
    let labels: Vec<i64> = seeds.iter().map(|&s| data.label(s)).collect();
    times.gather += t.elapsed().as_secs_f64();

    let mut out = StepOutput {
        loss_sum: 0.0,
        seeds: seeds.len() as u64,
        nodes: blocks.iter().map(|b| b.num_dst as u64).sum(),
        edges: blocks.iter().map(|b| b.num_edges() as u64).sum(),
        input_rows: blocks[0].num_src() as u64,
    };
    if seeds.is_empty() {
        return Ok(out);
    }
    let refs: Vec<&Block> = blocks.iter().collect();
    let t = Instant::now();
    let ctx = DropoutCtx {
        training: true,
        stream: dropout_stream(key),
        orig_ids: data.orig_ids.as_deref(),
        gcn_degrees: data.gcn_degrees.as_deref(),
    };
    let (logits, cache) = model.forward(&refs, x.view(), &ctx);
    let (loss_sum, mut d_logits) = cross_entropy(&logits, &labels);
    times.forward += t.elapsed().as_secs_f64();

    let t = Instant::now();
    d_logits.mapv_inplace(|g| g * scale);
    model.backward(&refs, cache, d_logits);
    times.backward += t.elapsed().as_secs_f64();
    out.loss_sum = loss_sum;
    Ok(out)
}

/// The source rows of a full-graph layer: owned rows then halo rows, without a copy when
/// there is no halo (one rank).
pub(crate) fn with_halo<'a>(own: &'a Array2<f32>, halo: &Array2<f32>) -> CowArray<'a, f32, Ix2> {
    if halo.nrows() == 0 {
        CowArray::from(own.view())
    } else {
        CowArray::from(concatenate(Axis(0), &[own.view(), halo.view()]).expect("same width"))
    }
}

/// Full-batch step over a partitioned graph: each rank computes every layer for the vertices
/// it owns, after fetching its halo's previous-layer rows; backward sends the halo gradients
/// back along the same plan. The loss covers the rank's own training vertices. Collective.
#[allow(clippy::too_many_arguments)]
pub fn full_batch_step(
    model: &mut Model,
    data: &TrainData,
    group: &Group,
    plan: &HaloPlan,
    transpose: &LazyTranspose,
    key: BatchKey,
    scale: f32,
    times: &mut PhaseTimes,
) -> Result<StepOutput> {
    let own = data.part.local_nodes();
    let ctx = DropoutCtx {
        training: true,
        stream: dropout_stream(key),
        orig_ids: data.orig_ids.as_deref(),
        gcn_degrees: data.gcn_degrees.as_deref(),
    };
    let t = Instant::now();
    let mut caches = Vec::with_capacity(model.layers.len());
    // Every rank reaches the first step together, so the collective fetch inside runs on all.
    let input = plan.input.get_or_init(|| {
        let own = data.store.own_rows();
        let remote = plan.halo.forward(group, "halo_rows", own.view());
        let x = with_halo(own, &remote).into_owned();
        if model.layers[0].conv.supports_sparse() && prefers_sparse(x.view()) {
            FullInput::Sparse(SparseRows::new(CsrMatrix::from_dense(x.view())))
        } else {
            FullInput::Dense(x)
        }
    });
    let (mut h, first) = match input {
        FullInput::Dense(x) => model.layers[0].forward(&model.params, &plan.block, x.view(), &ctx),
        FullInput::Sparse(x) => model.layers[0].forward_sparse(&model.params, &plan.block, x, &ctx),
    };
    caches.push(first);
    for layer in &model.layers[1..] {
        let remote = plan.halo.forward(group, "halo_rows", h.view());
        let (out, cache) = layer.forward(
            &model.params,
            &plan.block,
            with_halo(&h, &remote).view(),
            &ctx,
        );
        caches.push(cache);
        h = out;
    }
    let first = data.part.first_node;
    let rows: Vec<usize> = data
        .splits()
        .train
        .iter()
        .map(|&v| (v as u64 - first) as usize)
        .collect();
    let labels: Vec<i64> = rows.iter().map(|&r| data.labels[r]).collect();
    let picked = h.select(Axis(0), &rows);
    let (loss_sum, mut d_picked) = cross_entropy(&picked, &labels);
    times.forward += t.elapsed().as_secs_f64();

    let t = Instant::now();
    d_picked.mapv_inplace(|g| g * scale);
    let mut d_h = Array2::<f32>::zeros(h.raw_dim());
    for (i, &r) in rows.iter().enumerate() {
        d_h.row_mut(r).assign(&d_picked.row(i));
    }
    for (l, (layer, cache)) in model.layers.iter().zip(caches).enumerate().rev() {
        let need_src = l > 0;
        // Gradients move from layer to layer without copies: the owned rows of `d_src` are
        // the next `d_h` in place, only the (small) halo rows are copied out.
        let d_src = layer.backward_owned(
            &mut model.params,
            &plan.block,
            transpose,
            cache,
            std::mem::take(&mut d_h),
            need_src,
        );
        if let Some(d_src) = d_src {
            let d_halo = d_src.slice(s![own.., ..]).to_owned();
            let mut d_own = d_src.slice_move(s![..own, ..]);
            plan.halo
                .backward(group, "halo_grads", d_halo.view(), &mut d_own);
            d_h = d_own;
        }
    }
    times.backward += t.elapsed().as_secs_f64();
    Ok(StepOutput {
        loss_sum,
        seeds: rows.len() as u64,
        nodes: (own * model.layers.len()) as u64,
        edges: (plan.block.num_edges() * model.layers.len()) as u64,
        input_rows: plan.block.num_src() as u64,
    })
}
