//! Split parallelism (GSplit): every vertex of a mini-batch is computed, at every layer, by
//! exactly one rank, its owner; hidden rows move between ranks instead of being recomputed.
//!
//! Cooperative sampling builds the per-layer shuffle plans: each rank samples the neighbours
//! of its *local frontier* (owned vertices to compute at that hop; the seeds it owns at hop 0),
//! which gives its *mixed frontier* (the block's sources). Remote vertices of the mixed
//! frontier are sent to their owners and join their next local frontier. Forward moves the
//! previous layer's rows of remote sources along each layer's [`RowExchange`]; backward moves
//! their gradients back along the same plan and sums them at the owner (invariant 6).

use super::data::TrainData;
use super::dump::BlockDump;
use super::metrics::PhaseTimes;
use super::strategy::{StepArgs, StepOutput};
use crate::backend::cpu::aggregate::LazyTranspose;
use crate::comm::Group;
use crate::exchange::RowExchange;
use crate::graph::parts::owner_of;
use crate::graph::NodeId;
use crate::nn::{cross_entropy, DropoutCtx, Model};
use crate::sample::rng::hash_key;
use crate::sample::{build_block, sample_neighbors, BatchKey, Block, LocalGraph};
use anyhow::Result;
use ndarray::Array2;
use serde::Serialize;
use std::collections::HashMap;
use std::time::Instant;

/// One layer of a split mini-batch on one rank.
pub struct SplitLayer {
    /// Destinations = this rank's local frontier (owned); sources = its mixed frontier.
    pub block: Block,
    /// Source positions of owned sources, and their rows in the layer's input matrix.
    own_pos: Vec<u32>,
    own_rows: Vec<u32>,
    /// Source positions of remote sources, in the plan's order.
    remote_pos: Vec<u32>,
    /// Brings the remote sources' input rows from their owners.
    plan: RowExchange,
}

/// Edges one rank aggregates at one layer, and how many of them cross to another rank.
#[derive(Clone, Copy, Debug, Default, Serialize, serde::Deserialize, PartialEq)]
pub struct SplitLayerStats {
    pub edges: u64,
    pub cross_edges: u64,
}

/// The split plan of one mini-batch on one rank: layers input first.
pub struct SplitBatch {
    pub layers: Vec<SplitLayer>,
    /// This rank's seeds (its local frontier at the output layer).
    pub seeds: Vec<NodeId>,
}

impl SplitBatch {
    /// Per layer (input first), the source rows this rank receives from other ranks: what
    /// the layer's forward shuffle brings in (and, above the input layer, what its
    /// backward sends back).
    pub fn remote_rows(&self) -> Vec<usize> {
        self.layers.iter().map(|l| l.remote_pos.len()).collect()
    }

    /// Per-layer edge counts (input layer first).
    pub fn stats(&self) -> Vec<SplitLayerStats> {
        self.layers
            .iter()
            .map(|l| {
                let mut is_remote = vec![false; l.block.num_src()];
                for &p in &l.remote_pos {
                    is_remote[p as usize] = true;
                }
                SplitLayerStats {
                    edges: l.block.num_edges() as u64,
                    cross_edges: l
                        .block
                        .indices
                        .iter()
                        .filter(|&&s| is_remote[s as usize])
                        .count() as u64,
                }
            })
            .collect()
    }
}

/// Cooperative sampling of one global mini-batch. Collective: two exchanges per hop.
pub fn sample_split(
    group: &Group,
    data: &TrainData,
    batch: &[NodeId],
    fanouts: &[i32],
    key: BatchKey,
) -> SplitBatch {
    let graph = LocalGraph::new(&data.part, data.orig_ids.as_deref());
    let ranks = group.size();
    let first = data.part.first_node;
    let seeds: Vec<NodeId> = batch.iter().copied().filter(|&v| data.owns(v)).collect();
    let mut frontier = seeds.clone();
    // (block, remote source positions) per hop, seeds outward.
    let mut hops: Vec<(Block, Vec<u32>)> = Vec::with_capacity(fanouts.len());
    // Position of each vertex in this rank's local frontier, per hop (hop 0 = seeds).
    let mut frontier_pos: Vec<HashMap<NodeId, u32>> = vec![position_map(&frontier)];
    for (hop, &fanout) in fanouts.iter().enumerate() {
        let sampled = sample_neighbors(&graph, &frontier, fanout, key.layer(hop as u32));
        let block = build_block(&frontier, &sampled);
        let mut remote_pos = Vec::new();
        let mut counts = vec![0usize; ranks];
        let mut next: Vec<NodeId> = Vec::with_capacity(block.num_src());
        for (p, &v) in block.src_nodes.iter().enumerate() {
            if data.owns(v) {
                next.push(v);
            } else {
                remote_pos.push(p as u32);
                counts[owner_of(&data.offsets, v as u64)] += 1;
            }
        }
        // Remote sources grouped by owner (stable), to become the owners' next frontier.
        let mut by_owner: Vec<(usize, NodeId)> = remote_pos
            .iter()
            .map(|&p| {
                let v = block.src_nodes[p as usize];
                (owner_of(&data.offsets, v as u64), v)
            })
            .collect();
        by_owner.sort_by_key(|&(o, _)| o);
        let send: Vec<NodeId> = by_owner.iter().map(|&(_, v)| v).collect();
        let (received, _) = group.alltoallv("split_frontier_ids", &send, &counts);
        let mut seen = position_map(&next);
        for v in received {
            if let std::collections::hash_map::Entry::Vacant(e) = seen.entry(v) {
                e.insert(next.len() as u32);
                next.push(v);
            }
        }
        hops.push((block, remote_pos));
        frontier_pos.push(seen);
        frontier = next;
    }
    // Plans, input layer first: hop h's sources are rows of hop h+1's local frontier on their
    // owners (the input layer's sources are feature rows, indexed by local id).
    let last = fanouts.len();
    let mut layers = Vec::with_capacity(last);
    for (hop, (block, remote_pos)) in hops.into_iter().enumerate().rev() {
        let input_is_features = hop + 1 == last;
        let row_of = |v: NodeId| -> u32 {
            if input_is_features {
                (v as u64 - first) as u32
            } else {
                frontier_pos[hop + 1][&v]
            }
        };
        let remote_ids: Vec<NodeId> = remote_pos
            .iter()
            .map(|&p| block.src_nodes[p as usize])
            .collect();
        let plan = RowExchange::with_rows(group, &data.offsets, &remote_ids, row_of);
        let mut own_pos = Vec::new();
        let mut own_rows = Vec::new();
        let mut r = 0;
        for (p, &v) in block.src_nodes.iter().enumerate() {
            if r < remote_pos.len() && remote_pos[r] as usize == p {
                r += 1;
                continue;
            }
            own_pos.push(p as u32);
            own_rows.push(row_of(v));
        }
        layers.push(SplitLayer {
            block,
            own_pos,
            own_rows,
            remote_pos,
            plan,
        });
    }
    SplitBatch { layers, seeds }
}

fn position_map(ids: &[NodeId]) -> HashMap<NodeId, u32> {
    ids.iter()
        .enumerate()
        .map(|(i, &v)| (v, i as u32))
        .collect()
}

/// Assemble a layer's source rows: owned ones from `input`, remote ones through the plan.
/// `kind` names the exchange in the byte counts (input features and hidden rows apart).
fn layer_input(
    group: &Group,
    layer: &SplitLayer,
    input: &Array2<f32>,
    kind: &'static str,
) -> Array2<f32> {
    let d = input.ncols();
    let mut h = Array2::<f32>::zeros((layer.block.num_src(), d));
    for (&p, &r) in layer.own_pos.iter().zip(&layer.own_rows) {
        h.row_mut(p as usize).assign(&input.row(r as usize));
    }
    let remote = layer.plan.forward(group, kind, input.view());
    for (k, &p) in layer.remote_pos.iter().enumerate() {
        h.row_mut(p as usize).assign(&remote.row(k));
    }
    h
}

/// One split-parallel step: cooperative sampling, then forward and backward layer by layer
/// with the row shuffles in between. Gradients accumulate in `model`. Collective.
pub fn split_step(
    model: &mut Model,
    data: &TrainData,
    args: &StepArgs,
    times: &mut PhaseTimes,
    dump: Option<(&mut BlockDump, u64)>,
) -> Result<(StepOutput, Vec<SplitLayerStats>)> {
    let StepArgs {
        group,
        batch,
        fanouts,
        key,
        self_loops,
        scale,
    } = *args;
    let t = Instant::now();
    let mut sb = sample_split(group, data, batch, fanouts, key);
    if let Some((dump, step)) = dump {
        let blocks: Vec<Block> = sb.layers.iter().map(|l| l.block.clone()).collect();
        dump.write(step, &blocks, data)?;
    }
    if self_loops {
        for l in &mut sb.layers {
            l.block = l.block.with_self_loops();
        }
    }
    let stats = sb.stats();
    times.sample += t.elapsed().as_secs_f64();

    // Forward: input features are read only by their owners, then shuffled.
    let ctx = DropoutCtx {
        training: true,
        stream: hash_key(&[key.seed, key.epoch, key.batch, 0x64726f70]),
        orig_ids: data.orig_ids.as_deref(),
        gcn_degrees: data.gcn_degrees.as_deref(),
    };
    // Rows of each layer's input matrix (the owner-side rows the plans index).
    let mut input_rows: Vec<usize> = Vec::with_capacity(sb.layers.len());
    let mut caches = Vec::with_capacity(sb.layers.len());
    let mut h: Option<Array2<f32>> = None;
    let t_fwd = Instant::now();
    for (l, (layer, sl)) in model.layers.iter().zip(&sb.layers).enumerate() {
        let t = Instant::now();
        let input = h.as_ref().unwrap_or(data.store.own_rows());
        input_rows.push(input.nrows());
        let kind = if l == 0 {
            "split_features"
        } else {
            "split_rows"
        };
        let h_src = layer_input(group, sl, input, kind);
        times.gather += t.elapsed().as_secs_f64();
        let (out, cache) = if l == 0 {
            // Bag-of-words features stay sparse, as on GDP's path.
            layer.forward_input(&model.params, &sl.block, h_src.view(), &ctx)
        } else {
            layer.forward(&model.params, &sl.block, h_src.view(), &ctx)
        };
        caches.push(cache);
        h = Some(out);
    }
    let h = h.expect("at least one layer");
    let labels: Vec<i64> = sb.seeds.iter().map(|&s| data.label(s)).collect();
    let (loss_sum, mut d_h) = cross_entropy(&h, &labels);
    times.forward += t_fwd.elapsed().as_secs_f64();

    let t = Instant::now();
    d_h.mapv_inplace(|g| g * scale);
    for (l, ((layer, sl), cache)) in model
        .layers
        .iter()
        .zip(&sb.layers)
        .zip(caches)
        .enumerate()
        .rev()
    {
        let need_src = l > 0;
        let transpose = LazyTranspose::default();
        let d_src = layer.backward(
            &mut model.params,
            &sl.block,
            &transpose,
            cache,
            d_h.view(),
            need_src,
        );
        if let Some(d_src) = d_src {
            let prev_rows = input_rows[l];
            let mut d_prev = Array2::<f32>::zeros((prev_rows, d_src.ncols()));
            for (&p, &r) in sl.own_pos.iter().zip(&sl.own_rows) {
                let mut row = d_prev.row_mut(r as usize);
                row += &d_src.row(p as usize);
            }
            let remote_grads = d_src.select(
                ndarray::Axis(0),
                &sl.remote_pos
                    .iter()
                    .map(|&p| p as usize)
                    .collect::<Vec<_>>(),
            );
            sl.plan
                .backward(group, "split_grads", remote_grads.view(), &mut d_prev);
            d_h = d_prev;
        }
    }
    times.backward += t.elapsed().as_secs_f64();
    let out = StepOutput {
        loss_sum,
        seeds: sb.seeds.len() as u64,
        nodes: sb.layers.iter().map(|l| l.block.num_dst as u64).sum(),
        edges: sb.layers.iter().map(|l| l.block.num_edges() as u64).sum(),
        input_rows: sb.layers[0].own_pos.len() as u64,
    };
    Ok((out, stats))
}
