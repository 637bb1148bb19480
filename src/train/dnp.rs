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
use super::strategy::{
    place_rows, step_ctx, transposes_on, BatchSpec, InputSource, ResidentFeatures, StepArgs,
    StepOutput,
};
use crate::backend::cpu::aggregate::BlockTranspose;
use crate::backend::Backend;
use crate::comm::Group;
use crate::exchange::store::{InputRows, PlacedRows, StoreStats};
use crate::nn::Model;
use anyhow::Result;
use std::time::Instant;

/// The host side of a DNP mini-batch ([`dnp_host_batch`]): the owner-sampled batch and its
/// input block's rows as the host makes them.
pub struct DnpHostBatch {
    ob: OwnerBatch,
    input: DnpInput,
    /// The feature store's counters for the input rows, for the thread that owns the store.
    pub store: StoreStats,
    /// Per layer (the input block, then the upper blocks), its transpose where
    /// [`InputSource::transposes`] says the backward reads it.
    transposes: Vec<Option<BlockTranspose>>,
    /// The sparse input rows' transpose, where [`InputSource::transposes`] builds it ahead
    /// ([`crate::nn::transposes::TransposePlan::build`]).
    input_transpose: Option<BlockTranspose>,
    sample_seconds: f64,
    gather_seconds: f64,
}

/// The input block's source rows as the host made them.
enum DnpInput {
    /// Every row: as CSR where the input layer takes sparse rows and the store keeps a CSR
    /// copy (the test the layer would make of the dense rows, made from their counts), else
    /// dense (the layer makes its own test).
    Host(InputRows),
    /// Where each row is on a device that keeps this rank's own rows (and maybe its cache),
    /// with the rows it lacks.
    Placed(PlacedRows),
}

/// The host side of DNP's mini-batch: owner sampling ([`OwnerBatch::sample`]) and the
/// rows of the input block's sources — all of them, or only those a device that keeps this
/// rank's own rows lacks, as `source` says (GDP's rule for its batches). Collective over
/// `group`, which may be a prefetch worker's communicator: it only reads `data` and is a pure
/// function of its arguments.
pub fn dnp_host_batch(
    data: &TrainData,
    group: &Group,
    spec: BatchSpec,
    source: InputSource,
) -> DnpHostBatch {
    let t = Instant::now();
    let ob = OwnerBatch::sample(group, data, spec);
    let sample_seconds = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let src = &ob.input_block.src_nodes;
    let (input, store) = if source.resident {
        let (placed, stats) = data.store.place_input(group, src, source.cache_resident);
        (DnpInput::Placed(placed), stats)
    } else {
        let (rows, stats) = data
            .store
            .gather_input(group, src, source.sparse_first_layer);
        (DnpInput::Host(rows), stats)
    };
    let gather_seconds = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let sparse_input = match &input {
        DnpInput::Host(InputRows::Sparse(x)) => Some(x),
        _ => None,
    };
    let blocks = std::iter::once(&ob.input_block).chain(&ob.upper);
    let (transposes, input_transpose) = source.transposes.build(blocks, sparse_input);
    DnpHostBatch {
        ob,
        input,
        store,
        transposes,
        input_transpose,
        sample_seconds: sample_seconds + t.elapsed().as_secs_f64(),
        gather_seconds,
    }
}

impl DnpHostBatch {
    /// How many of the batch's blocks came with their transpose built.
    pub fn transposes_built(&self) -> usize {
        self.transposes.iter().flatten().count()
    }
}

/// The input block's rows on the backend.
enum Input<B: Backend> {
    Dense(B::Mat),
    Sparse(B::Sparse),
}

/// One DNP step on the model's backend; gradients accumulate in `model`. Collective.
pub fn dnp_step<B: Backend>(
    model: &mut Model<B>,
    data: &mut TrainData,
    resident: Option<&ResidentFeatures<B>>,
    args: &StepArgs,
    times: &mut PhaseTimes,
) -> Result<StepOutput> {
    let host = dnp_host_batch(
        data,
        args.group,
        args.spec(),
        InputSource::of(model, resident),
    );
    data.store.add_stats(&host.store);
    dnp_train_step(model, data, resident, host, args, times)
}

/// The model's side of a DNP step on a prepared [`DnpHostBatch`]: the input rows onto the
/// backend (or placed there beside `resident`), the input layer, the exchange of its rows
/// and the upper layers over `args.group`, and back. Collective.
pub fn dnp_train_step<B: Backend>(
    model: &mut Model<B>,
    data: &TrainData,
    resident: Option<&ResidentFeatures<B>>,
    host: DnpHostBatch,
    args: &StepArgs,
    times: &mut PhaseTimes,
) -> Result<StepOutput> {
    let StepArgs {
        group, key, scale, ..
    } = *args;
    let be = model.params.backend().clone();
    let DnpHostBatch {
        mut ob,
        input,
        transposes,
        input_transpose,
        sample_seconds,
        gather_seconds,
        ..
    } = host;
    times.sample += sample_seconds;
    times.gather += gather_seconds;

    // The rows go to the backend once, with the blocks; where the device keeps this rank's
    // own rows (and cache), only the rows fetched from other ranks go up and the device
    // places the rest.
    let t = Instant::now();
    let x: Input<B> = match (input, resident) {
        (DnpInput::Placed(placed), Some(features)) => {
            Input::Dense(place_rows(&be, features, placed, data))
        }
        (DnpInput::Host(InputRows::Dense(x)), _) => Input::Dense(be.upload_owned(x)),
        (DnpInput::Host(InputRows::Sparse(x)), _) => {
            Input::Sparse(be.sparse_from_csr(x, input_transpose))
        }
        (DnpInput::Placed(_), None) => {
            panic!("dnp rows placed for a device that keeps no features")
        }
    };
    let input_rows = ob.input_block.num_src();
    let input = be.graph(std::mem::take(&mut ob.input_block));
    let upper = ob.take_upper(&be);
    let mut transposes = transposes_on(&be, transposes).into_iter();
    let input_transpose = transposes.next().unwrap_or_default();
    let upper_transposes: Vec<B::Transpose> = transposes.collect();
    times.gather += t.elapsed().as_secs_f64();

    let ctx = step_ctx(data, key);
    let t = Instant::now();
    let layer = &model.layers[0];
    let (h_mine, input_cache) = match &x {
        Input::Dense(x) => layer.forward_input(&model.params, &input, be.view(x), &ctx),
        Input::Sparse(x) => layer.forward_sparse(&model.params, &input, x, &ctx),
    };
    drop(x);
    times.forward += t.elapsed().as_secs_f64();
    let (loss_sum, d_mine) = ob.upper_layers(
        model,
        &upper,
        &upper_transposes,
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
    model.layers[0].backward_owned(
        &mut model.params,
        &input,
        &input_transpose,
        input_cache,
        d_mine,
        false,
    );
    times.backward += t.elapsed().as_secs_f64();
    Ok(ob.output(loss_sum, input_rows))
}
