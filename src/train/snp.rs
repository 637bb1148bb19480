//! Source-node parallelism (APT's SNP): the input layer is computed where the input features
//! live. The upper layers run data parallel as in GDP and the input layer's rows of each
//! frontier vertex `v` are finished by `v`'s owner ([`super::owner_input`]), but the neighbour
//! term is summed on the owners of the sources: the owner of `v` sends each sampled edge
//! `u→v` with its weight (mean: `1/deg(v)`) to the owner of `u`, which projects `W_neigh·h_u`
//! once per distinct source and returns the weighted partial sums per destination — rows of the
//! hidden width, not the feature width ([`PartialAggregation`]). The owner of `v` adds them up
//! with its root term `W_self·h_v + b` and applies the activation. No feature row ever leaves
//! its owner.
//!
//! Backward reverses every exchange: the gradient of `v`'s row comes back to `v`'s owner
//! (root weights and bias), which sends it to every source owner that contributed a partial
//! row (neighbour weights). The input layer needs no gradient of its input.
//!
//! The model is GraphSAGE's, parameter for parameter: SNP trains what GDP trains. Dropout on
//! the input features is keyed by vertex, so the masks are GDP's whichever rank applies them;
//! mostly-zero features are multiplied as CSR, as on GDP's path.

use super::data::TrainData;
use super::metrics::PhaseTimes;
use super::owner_input::OwnerBatch;
use super::strategy::{StepArgs, StepOutput};
use crate::dist::partial::{mean_weights, PartialAggregation};
use crate::graph::NodeId;
use crate::nn::layer::Conv;
use crate::nn::{DropoutCtx, Layer, Model};
use crate::tensor::dropout::{derive_stream, DropoutMask};
use crate::tensor::rows::InputRows;
use anyhow::{bail, Result};
use ndarray::Array2;
use std::time::Instant;

/// Why a configuration cannot run under SNP, or `Ok` when it can (config validation calls
/// this). SNP splits the input layer's neighbour sum by source owner, so it needs a sum-type
/// aggregator over the raw features: SAGE's mean, without an input projection in front.
pub fn check_config(cfg: &crate::config::TrainConfig) -> Result<()> {
    check_model(&cfg.model)?;
    if cfg.input_proj {
        bail!(
            "config: `strategy` \"snp\" does not support `input_proj`: SNP computes the input \
             layer's neighbour sums on the sources' owners straight from their feature rows, and \
             a projection (with its norm and residual) in front of the convolution is not split \
             that way; drop `input_proj`, or use --strategy gdp, split or dnp"
        );
    }
    Ok(())
}

/// Why a model cannot run under SNP, or `Ok` when it can.
fn check_model(model: &str) -> Result<()> {
    match model {
        "sage" => Ok(()),
        "gcn" => bail!(
            "config: `strategy` \"snp\" does not support `model` \"gcn\" yet: SNP's partial sums \
             implement SAGE's mean aggregator only, GCN's normalised sum (a per-edge weight \
             sqrt(D_v)/d_v, a per-source factor 1/sqrt(D_u)) is not plugged in; use --model sage, \
             or --strategy gdp, split or dnp"
        ),
        "gat" => bail!(
            "config: `strategy` \"snp\" does not support `model` \"gat\": GAT's attention is a \
             softmax over all sources of a destination, which live on several ranks, so SNP would \
             need an extra exchange of per-destination maxima and sums; use --strategy gdp, \
             split or dnp"
        ),
        "mlp" => bail!(
            "config: `strategy` \"snp\" does not apply to `model` \"mlp\": an MLP aggregates no \
             neighbours, so there are no source-side partial sums; use --strategy gdp or dnp"
        ),
        other => bail!("config: `strategy` \"snp\" does not support `model` \"{other}\""),
    }
}

/// One SNP step; gradients accumulate in `model`. Collective.
pub fn snp_step(
    model: &mut Model,
    data: &mut TrainData,
    args: &StepArgs,
    times: &mut PhaseTimes,
) -> Result<StepOutput> {
    let Conv::Sage(conv) = model.layers[0].conv.clone() else {
        bail!("strategy snp: the input layer must be a SAGE convolution (model \"sage\")");
    };
    let StepArgs {
        group, key, scale, ..
    } = *args;
    let t = Instant::now();
    let ob = OwnerBatch::sample(data, args);
    let block = &ob.input_block;
    let partial = PartialAggregation::new(group, &data.offsets, block, &mean_weights(block));
    times.sample += t.elapsed().as_secs_f64();

    // Only own rows: the sources' on their owners, the destinations' (root term) here.
    let t = Instant::now();
    let x_src = data.store.own_rows_of(partial.sources());
    let x_dst = data.store.own_rows_of(block.dst_nodes());
    times.gather += t.elapsed().as_secs_f64();

    let ctx = OwnerBatch::dropout_ctx(data, key);
    let t = Instant::now();
    let layer = &model.layers[0];
    let x_src = input_rows(layer, &ctx, x_src, partial.sources());
    let x_dst = input_rows(layer, &ctx, x_dst, block.dst_nodes());
    let projected = conv.project_neighbours(&model.params, &x_src);
    let mut h_mine = partial.forward(group, projected.view());
    conv.add_root(&model.params, &x_dst, h_mine.view_mut());
    let saved = layer.activation.map(|act| {
        act.forward_in_place(h_mine.view_mut());
        (act, act.save(h_mine.view()))
    });
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
    conv.accumulate_root_grad(&mut model.params, &x_dst, d_mine.view());
    let d_projected = partial.backward(group, d_mine.view());
    conv.accumulate_neighbour_grad(&mut model.params, &x_src, d_projected.view());
    times.backward += t.elapsed().as_secs_f64();
    Ok(ob.output(loss_sum, partial.sources().len()))
}

/// Feature rows of the vertices `ids` as the input layer reads them: sparse when mostly zero
/// (as `Model::forward` decides for GDP), after the input dropout with the mask
/// `Layer::forward` draws (the layer's stream, rows keyed by original id) — GDP's mask for
/// every vertex, whichever rank applies it.
fn input_rows(layer: &Layer, ctx: &DropoutCtx, x: Array2<f32>, ids: &[NodeId]) -> InputRows {
    let mask = (ctx.training && layer.dropout > 0.0)
        .then(|| DropoutMask::new(derive_stream(ctx.stream, layer.index as u64), layer.dropout));
    let keys: Vec<u64> = match (&mask, ctx.orig_ids) {
        (None, _) => Vec::new(),
        (Some(_), Some(orig)) => ids.iter().map(|&v| orig[v as usize]).collect(),
        (Some(_), None) => ids.iter().map(|&v| v as u64).collect(),
    };
    InputRows::new(x, mask.as_ref(), &keys)
}
