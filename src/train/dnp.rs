//! Destination-node parallelism (APT's DNP): the input layer of every destination is computed
//! by the destination's owner, once, however many ranks need it; the upper layers run data
//! parallel as in GDP ([`super::owner_input`]).
//!
//! The owner gathers the features of the sampled sources of the destinations it was asked for
//! (remote ones from the feature store; on a device that keeps the rank's own rows, and its
//! cache, those are gathered there and only fetched rows go up), computes the input layer and
//! sends the rows back.
//! Backward: gradients of those rows are summed at the owner, which back-propagates through
//! the input layer.

use super::data::TrainData;
use super::metrics::PhaseTimes;
use super::owner_input::OwnerBatch;
use super::strategy::{place_rows, ResidentFeatures, StepArgs, StepOutput};
use crate::backend::Backend;
use crate::nn::Model;
use anyhow::Result;
use std::time::Instant;

/// One DNP step on the model's backend; gradients accumulate in `model`. Collective.
pub fn dnp_step<B: Backend>(
    model: &mut Model<B>,
    data: &mut TrainData,
    resident: Option<&ResidentFeatures<B>>,
    args: &StepArgs,
    times: &mut PhaseTimes,
) -> Result<StepOutput> {
    let StepArgs {
        group, key, scale, ..
    } = *args;
    let be = model.params.backend().clone();
    let t = Instant::now();
    let mut ob = OwnerBatch::sample(data, args);
    times.sample += t.elapsed().as_secs_f64();

    // Feature rows come from the store (on the host) and go to the backend once, with the
    // blocks; where the device keeps this rank's own rows (and cache), only the rows fetched
    // from other ranks go up and the device places the rest.
    let t = Instant::now();
    let src = &ob.input_block.src_nodes;
    let x = match resident {
        Some(features) => {
            let (placed, stats) = data.store.place_input(group, src, features.cache.is_some());
            data.store.add_stats(&stats);
            place_rows(&be, features, placed, data)
        }
        None => be.upload_owned(data.store.gather(group, src)),
    };
    let input_rows = ob.input_block.num_src();
    let input = be.graph(std::mem::take(&mut ob.input_block));
    let upper = ob.take_upper(&be);
    times.gather += t.elapsed().as_secs_f64();

    let ctx = OwnerBatch::dropout_ctx(data, key);
    let t = Instant::now();
    let (h_mine, input_cache) =
        model.layers[0].forward_input(&model.params, &input, be.view(&x), &ctx);
    drop(x);
    times.forward += t.elapsed().as_secs_f64();
    let (loss_sum, d_mine) = ob.upper_layers(
        model,
        &upper,
        data,
        group,
        be.view(&h_mine),
        &ctx,
        scale,
        times,
        ("dnp_rows", "dnp_grads"),
    );
    drop(h_mine);
    let t = Instant::now();
    let transpose = B::Transpose::default();
    model.layers[0].backward_owned(
        &mut model.params,
        &input,
        &transpose,
        input_cache,
        d_mine,
        false,
    );
    times.backward += t.elapsed().as_secs_f64();
    Ok(ob.output(loss_sum, input_rows))
}
