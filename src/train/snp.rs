//! Source-node parallelism (APT's SNP): the input layer is computed where the input features
//! live. The upper layers run data parallel as in GDP and the input layer's rows of each
//! frontier vertex `v` are finished by `v`'s owner ([`super::owner_input`]), but the neighbour
//! term is summed on the owners of the sources: the owner of `v` sends each sampled edge
//! `u→v` with its weight to the owner of `u`, which projects `h_u` once per distinct source
//! and returns the weighted partial sums per destination — rows of the hidden width, not the
//! feature width ([`PartialAggregation`]). The owner of `v` adds them up, adds what the
//! convolution adds at the destination and applies the activation. No feature row ever leaves
//! its owner.
//!
//! Two convolutions split this way (`InputConv`):
//! * GraphSAGE (mean): edge weight `1/deg(v)`, the source owner projects `W_neigh·h_u`, and
//!   `v`'s owner adds the root term `W_self·h_v + b`;
//! * GCN: edge weight `dst[v]` and source factor `src[u] = 1/sqrt(D_u)` of
//!   [`GcnNorm::new`] with the graph's degree table (the source owner returns
//!   `Σ dst[v]·src[u]·(h_u·W)`), and `v`'s owner adds the bias; the self-loop `v→v` is an
//!   ordinary edge, whose source `v` lives on `v`'s owner.
//!
//! Backward reverses every exchange: the gradient of `v`'s row comes back to `v`'s owner
//! (SAGE's root weights, the bias), which sends it to every source owner that contributed a
//! partial row (the projection's weights). The input layer needs no gradient of its input.
//!
//! The model is GDP's, parameter for parameter: SNP trains what GDP trains. Dropout on the
//! input features is keyed by vertex, so the masks are GDP's whichever rank applies them;
//! mostly-zero features are multiplied as CSR, as on GDP's path.

use super::data::TrainData;
use super::metrics::PhaseTimes;
use super::owner_input::OwnerBatch;
use super::strategy::{StepArgs, StepOutput};
use crate::backend::cpu::aggregate::GcnNorm;
use crate::backend::cpu::rows::InputRows;
use crate::exchange::partial::{destination_weights, mean_weights, PartialAggregation};
use crate::graph::NodeId;
use crate::nn::gcn::GcnConv;
use crate::nn::layer::Conv;
use crate::nn::sage::SageConv;
use crate::nn::{DropoutCtx, Layer, Model};
use anyhow::{bail, Result};
use ndarray::Array2;
use std::time::Instant;

/// The input layer's convolution as SNP splits it: the edge weights the requester sends, the
/// factor the source owner applies to its projected rows, and the term added where the partial
/// rows meet.
enum InputConv {
    /// Mean weights `1/deg(v)`; `W_neigh·h_u` on the source owner; root term `W_self·h_v + b`.
    Sage(SageConv),
    /// Destination factors of [`GcnNorm`] as edge weights; `src` holds `1/sqrt(D_u)` per
    /// source row ([`PartialAggregation::sources`]) for `src[u]·(h_u·W)` on the source owner;
    /// only the bias is added (the self-loop is an ordinary edge).
    Gcn { conv: GcnConv, src: Vec<f32> },
}

/// One SNP step; gradients accumulate in `model`. Collective.
pub fn snp_step(
    model: &mut Model,
    data: &mut TrainData,
    args: &StepArgs,
    times: &mut PhaseTimes,
) -> Result<StepOutput> {
    let StepArgs {
        group, key, scale, ..
    } = *args;
    let t = Instant::now();
    let ob = OwnerBatch::sample(data, args);
    let block = &ob.input_block;
    let (mut conv, weights) = match &model.layers[0].conv {
        Conv::Sage(c) => (InputConv::Sage(c.clone()), mean_weights(block)),
        Conv::Gcn(c) => {
            // Every rank holds the same table (built for model gcn), so all ranks take this
            // branch alike and no collective is skipped.
            let Some(table) = data.gcn_degrees.as_deref() else {
                bail!(
                    "strategy snp: model gcn needs the graph's degree table, which was not built"
                );
            };
            // GDP's destination factors, from the same function: identical edge weights.
            let norm = GcnNorm::new(block, Some(table));
            let conv = InputConv::Gcn {
                conv: c.clone(),
                src: Vec::new(),
            };
            (conv, destination_weights(block, &norm.dst))
        }
        _ => bail!(
            "strategy snp: the input layer must be a SAGE or GCN convolution (model \"sage\" \
             or \"gcn\")"
        ),
    };
    let partial = PartialAggregation::new(group, &data.offsets, block, &weights);
    if let InputConv::Gcn { src, .. } = &mut conv {
        let table = data.gcn_degrees.as_deref().expect("checked above");
        *src = GcnNorm::source_factors(partial.sources(), table);
    }
    times.sample += t.elapsed().as_secs_f64();

    // Only own rows: the sources' on their owners, the destinations' (SAGE's root term) here.
    let t = Instant::now();
    let x_src = data.store.own_rows_of(partial.sources());
    let x_dst =
        matches!(conv, InputConv::Sage(_)).then(|| data.store.own_rows_of(block.dst_nodes()));
    times.gather += t.elapsed().as_secs_f64();

    let ctx = OwnerBatch::dropout_ctx(data, key);
    let t = Instant::now();
    let layer = &model.layers[0];
    let x_src = input_rows(layer, &ctx, x_src, partial.sources());
    let x_dst = x_dst.map(|x| input_rows(layer, &ctx, x, block.dst_nodes()));
    let mut h_mine = match &conv {
        InputConv::Sage(c) => {
            let projected = c.project_neighbours(&model.params, &x_src);
            let mut h = partial.forward(group, projected.view());
            let x_dst = x_dst.as_ref().expect("gathered for sage");
            c.add_root(&model.params, x_dst, h.view_mut());
            h
        }
        InputConv::Gcn { conv: c, src } => {
            let projected = c.project_sources(&model.params, &x_src, src);
            let mut h = partial.forward(group, projected.view());
            c.add_bias(&model.params, h.view_mut());
            h
        }
    };
    let saved = layer
        .activation
        .map(|act| (act, act.forward_save(h_mine.view_mut())));
    times.forward += t.elapsed().as_secs_f64();

    let (loss_sum, mut d_mine) = ob.upper_layers(
        model,
        data,
        group,
        &h_mine,
        &ctx,
        scale,
        times,
        ("snp_rows", "snp_grads"),
    );

    let t = Instant::now();
    if let Some((act, saved)) = &saved {
        act.backward_saved(saved, d_mine.view_mut());
    }
    match &conv {
        InputConv::Sage(c) => {
            let x_dst = x_dst.as_ref().expect("gathered for sage");
            c.accumulate_root_grad(&mut model.params, x_dst, d_mine.view());
            let d_projected = partial.backward(group, d_mine.view());
            c.accumulate_neighbour_grad(&mut model.params, &x_src, d_projected.view());
        }
        InputConv::Gcn { conv: c, src } => {
            c.accumulate_bias_grad(&mut model.params, d_mine.view());
            let d_projected = partial.backward(group, d_mine.view());
            c.accumulate_source_grad(&mut model.params, &x_src, src, d_projected);
        }
    }
    times.backward += t.elapsed().as_secs_f64();
    Ok(ob.output(loss_sum, partial.sources().len()))
}

/// Feature rows of the vertices `ids` as the input layer reads them: sparse when mostly zero
/// (as `Model::forward` decides for GDP), after the input dropout with the mask
/// `Layer::forward` draws (the layer's stream, rows keyed by original id) — GDP's mask for
/// every vertex, whichever rank applies it.
fn input_rows(layer: &Layer, ctx: &DropoutCtx, x: Array2<f32>, ids: &[NodeId]) -> InputRows {
    let mask = (ctx.training && layer.dropout > 0.0).then(|| layer.input_dropout(ctx));
    let keys: Vec<u64> = match (&mask, ctx.orig_ids) {
        (None, _) => Vec::new(),
        (Some(_), Some(orig)) => ids.iter().map(|&v| orig[v as usize]).collect(),
        (Some(_), None) => ids.iter().map(|&v| v as u64).collect(),
    };
    InputRows::new(x, mask.as_ref(), &keys)
}
