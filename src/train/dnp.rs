//! Destination-node parallelism (APT's DNP): the input layer of every destination is computed
//! by the destination's owner, once, however many ranks need it; the upper layers run data
//! parallel as in GDP ([`super::owner_input`]).
//!
//! The owner gathers the features of the sampled sources of the destinations it was asked for
//! (remote ones from the feature store), computes the input layer and sends the rows back.
//! Backward: gradients of those rows are summed at the owner, which back-propagates through
//! the input layer.

use super::data::TrainData;
use super::metrics::PhaseTimes;
use super::owner_input::OwnerBatch;
use super::strategy::{StepArgs, StepOutput};
use crate::backend::cpu::aggregate::LazyTranspose;
use crate::nn::Model;
use anyhow::Result;
use std::time::Instant;

/// One DNP step; gradients accumulate in `model`. Collective.
pub fn dnp_step(
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
    times.sample += t.elapsed().as_secs_f64();

    let t = Instant::now();
    let x = data.store.gather(group, &ob.input_block.src_nodes);
    times.gather += t.elapsed().as_secs_f64();

    let ctx = OwnerBatch::dropout_ctx(data, key);
    let t = Instant::now();
    let (h_mine, input_cache) =
        model.layers[0].forward_input(&model.params, &ob.input_block, x.view(), &ctx);
    times.forward += t.elapsed().as_secs_f64();
    let (loss_sum, d_mine) = ob.upper_layers(
        model,
        data,
        group,
        &h_mine,
        &ctx,
        scale,
        times,
        ("dnp_rows", "dnp_grads"),
    );
    let t = Instant::now();
    let transpose = LazyTranspose::default();
    model.layers[0].backward(
        &mut model.params,
        &ob.input_block,
        &transpose,
        input_cache,
        d_mine.view(),
        false,
    );
    times.backward += t.elapsed().as_secs_f64();
    Ok(ob.output(loss_sum, ob.input_block.num_src()))
}
