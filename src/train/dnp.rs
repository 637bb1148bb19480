//! Destination-node parallelism (APT's DNP): the input layer of every destination is computed
//! by the destination's owner, once, however many ranks need it; the upper layers run data
//! parallel as in GDP.
//!
//! A rank samples the upper layers of its seeds (owner-computes, like GDP). Their input
//! frontier is sent to the owners ([`RowExchange::to_owners`]); each owner re-samples the input
//! hop of the vertices it was asked for (the draw is a pure function of the vertex, so the
//! edges are those GDP would have), gathers their sources' features, computes the input layer
//! and sends the rows back. Backward reverses the plan: gradients of those rows are summed at
//! the owner, which back-propagates through the input layer.

use super::data::TrainData;
use super::metrics::PhaseTimes;
use super::strategy::StepOutput;
use crate::comm::Group;
use crate::dist::{sample_blocks_distributed, RowExchange};
use crate::graph::NodeId;
use crate::nn::{cross_entropy, DropoutCtx, Model};
use crate::sample::rng::hash_key;
use crate::sample::{build_block, sample_neighbors, BatchKey, Block, LocalGraph};
use crate::tensor::aggregate::LazyTranspose;
use anyhow::Result;
use ndarray::Array2;
use std::time::Instant;

/// One DNP step; gradients accumulate in `model`. Collective.
#[allow(clippy::too_many_arguments)]
pub fn dnp_step(
    model: &mut Model,
    data: &mut TrainData,
    group: &Group,
    batch: &[NodeId],
    fanouts: &[i32],
    key: BatchKey,
    self_loops: bool,
    scale: f32,
    times: &mut PhaseTimes,
) -> Result<StepOutput> {
    let layers = fanouts.len();
    let seeds: Vec<NodeId> = batch.iter().copied().filter(|&v| data.owns(v)).collect();
    let t = Instant::now();
    let graph = LocalGraph::new(&data.part, data.orig_ids.as_deref());
    // Upper layers (hops 0..L-1 from the seeds), sampled as GDP samples them.
    let mut upper = sample_blocks_distributed(
        group,
        &graph,
        &data.offsets,
        &seeds,
        &fanouts[..layers - 1],
        key,
    );
    let frontier: Vec<NodeId> = upper.first().map_or(seeds.clone(), |b| b.src_nodes.clone());
    // The input layer of the vertices this rank owns and was asked for.
    let (plan, mine) = RowExchange::to_owners(group, &data.offsets, &frontier);
    let input_hop = (layers - 1) as u32;
    let sampled = sample_neighbors(&graph, &mine, fanouts[layers - 1], key.layer(input_hop));
    let mut input_block = build_block(&mine, &sampled);
    if self_loops {
        input_block = input_block.with_self_loops();
        upper = upper.iter().map(Block::with_self_loops).collect();
    }
    times.sample += t.elapsed().as_secs_f64();

    let t = Instant::now();
    let x = data.store.gather(group, &input_block.src_nodes);
    times.gather += t.elapsed().as_secs_f64();

    let ctx = DropoutCtx {
        training: true,
        stream: hash_key(&[key.seed, key.epoch, key.batch, 0x64726f70]),
        orig_ids: data.orig_ids.as_deref(),
        gcn_degrees: data.gcn_degrees.as_deref(),
    };
    let t = Instant::now();
    let (h_mine, input_cache) =
        model.layers[0].forward(&model.params, &input_block, x.view(), &ctx);
    let mut h = plan.forward(group, "dnp_rows", h_mine.view());
    let mut caches = Vec::with_capacity(layers - 1);
    for (layer, block) in model.layers[1..].iter().zip(&upper) {
        let (out, cache) = layer.forward(&model.params, block, h.view(), &ctx);
        caches.push(cache);
        h = out;
    }
    let labels: Vec<i64> = seeds.iter().map(|&s| data.label(s)).collect();
    let (loss_sum, mut d_h) = cross_entropy(&h, &labels);
    times.forward += t.elapsed().as_secs_f64();

    let t = Instant::now();
    d_h.mapv_inplace(|g| g * scale);
    for ((layer, block), cache) in model.layers[1..].iter().zip(&upper).zip(caches).rev() {
        let transpose = LazyTranspose::default();
        d_h = layer
            .backward(
                &mut model.params,
                block,
                &transpose,
                cache,
                d_h.view(),
                true,
            )
            .expect("asked for the input gradient");
    }
    let mut d_mine = Array2::<f32>::zeros(h_mine.raw_dim());
    plan.backward(group, "dnp_grads", d_h.view(), &mut d_mine);
    let transpose = LazyTranspose::default();
    model.layers[0].backward(
        &mut model.params,
        &input_block,
        &transpose,
        input_cache,
        d_mine.view(),
        false,
    );
    times.backward += t.elapsed().as_secs_f64();
    Ok(StepOutput {
        loss_sum,
        seeds: seeds.len() as u64,
        nodes: (input_block.num_dst + upper.iter().map(|b| b.num_dst).sum::<usize>()) as u64,
        edges: (input_block.num_edges() + upper.iter().map(|b| b.num_edges()).sum::<usize>())
            as u64,
        input_rows: input_block.num_src() as u64,
    })
}
