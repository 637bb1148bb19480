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
//!   [`GcnNorm::new`] with the graph's degree table, which the source owner folds into the
//!   weights of its edges (it returns `Σ (dst[v]·src[u])·(h_u·W)`), and `v`'s owner adds the
//!   bias; the self-loop `v→v` is an ordinary edge, whose source `v` lives on `v`'s owner.
//!
//! Every piece runs on the model's backend: feature rows are read from the store on the host
//! and uploaded once (on a device that keeps the rank's own rows, gathered there instead), projections, partial sums and the activation stay on the backend, and
//! only partial rows and gradients cross ranks ([`PartialAggregation`], [`OwnerBatch`]).
//!
//! Backward reverses every exchange: the gradient of `v`'s row comes back to `v`'s owner
//! (SAGE's root weights, the bias), which sends it to every source owner that contributed a
//! partial row (the projection's weights). The input layer needs no gradient of its input.
//!
//! The model is GDP's, parameter for parameter: SNP trains what GDP trains. Dropout on the
//! input features is keyed by vertex, so the masks are GDP's whichever rank applies them;
//! mostly-zero features are multiplied as CSR, as on GDP's path.

use super::data::TrainData;
use super::metrics::{PassClock, PhaseTimes};
use super::owner_input::OwnerBatch;
use super::strategy::{
    step_ctx, transposes_on, BatchSpec, InputSource, ResidentFeatures, StepArgs, StepOutput,
};
use crate::backend::cpu::aggregate::BlockTranspose;
use crate::backend::cpu::sparse::CsrMatrix;
use crate::backend::input_rows::InputRows;
use crate::backend::{Backend, GcnNorm};
use crate::comm::Group;
use crate::exchange::partial::{destination_weights, mean_weights, PartialPlan};
use crate::exchange::store::StoreStats;
use crate::exchange::FeatureStore;
use crate::graph::NodeId;
use crate::nn::gcn::GcnConv;
use crate::nn::layer::Conv;
use crate::nn::sage::SageConv;
use crate::nn::{DropoutCtx, Layer, Model};
use anyhow::{bail, Result};
use ndarray::Array2;
use std::time::Instant;

/// The input layer's convolution as SNP splits it: the edge weights the requester sends, the
/// factor the source owner folds into them, and the term added where the partial rows meet.
enum InputConv {
    /// Mean weights `1/deg(v)`; `W_neigh·h_u` on the source owner; root term `W_self·h_v + b`.
    Sage(SageConv),
    /// Destination factors of [`GcnNorm`] as edge weights, times `1/sqrt(D_u)` per source
    /// ([`PartialPlan::scale_sources`]); `h_u·W` on the source owner; only the bias is
    /// added (the self-loop is an ordinary edge).
    Gcn(GcnConv),
}

/// Which of [`InputConv`]'s splits the input layer takes: all the host side of a batch needs
/// to know of the model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SnpInput {
    Sage,
    Gcn,
}

impl SnpInput {
    /// The split of `model`'s input layer, or why SNP cannot train it. The same answer on
    /// every rank (one model, and every rank holds the same degree table), so no rank skips a
    /// collective the others make.
    pub fn of<B: Backend>(model: &Model<B>, data: &TrainData) -> Result<SnpInput> {
        match &model.layers[0].conv {
            Conv::Sage(_) => Ok(SnpInput::Sage),
            Conv::Gcn(_) if data.gcn_degrees.is_none() => {
                bail!("strategy snp: model gcn needs the graph's degree table, which was not built")
            }
            Conv::Gcn(_) => Ok(SnpInput::Gcn),
            _ => bail!(
                "strategy snp: the input layer must be a SAGE or GCN convolution (model \"sage\" \
                 or \"gcn\")"
            ),
        }
    }
}

/// The host side of an SNP mini-batch ([`snp_host_batch`]): the owner-sampled batch, the plan
/// of its input layer's partial sums and this rank's own rows that the plan reads.
pub struct SnpHostBatch {
    ob: OwnerBatch,
    input: SnpInput,
    plan: PartialPlan,
    x_src: OwnRows,
    /// SAGE's root term: the rows of the input block's destinations.
    x_dst: Option<OwnRows>,
    /// The feature store's counters for the rows read, for the thread that owns the store.
    pub store: StoreStats,
    /// Per upper layer, its block's transpose where the plan the batch was made with says the
    /// backward reads it (the input layer's partial sums keep their own).
    transposes: Vec<Option<BlockTranspose>>,
    sample_seconds: f64,
    gather_seconds: f64,
}

impl SnpHostBatch {
    /// How many of the upper blocks came with their transpose built.
    pub fn transposes_built(&self) -> usize {
        self.transposes.iter().flatten().count()
    }
}

/// The host side of SNP's mini-batch: owner sampling ([`OwnerBatch::sample`]), the input
/// layer's edges routed to their sources' owners with `input`'s weights ([`PartialPlan`]), and
/// the own rows the plan reads — only their indices where the device keeps this rank's rows
/// (`source.resident`), and the upper blocks' transposes `source.transposes` says the backward
/// reads. Collective over `group`, which may be a prefetch worker's communicator: it only
/// reads `data` and is a pure function of its arguments.
pub fn snp_host_batch(
    data: &TrainData,
    group: &Group,
    spec: BatchSpec,
    input: SnpInput,
    source: InputSource,
) -> SnpHostBatch {
    let on_device = source.resident;
    let t = Instant::now();
    let ob = OwnerBatch::sample(group, data, spec);
    let block = &ob.input_block;
    let table = || {
        data.gcn_degrees
            .as_deref()
            .expect("SnpInput::of checked the degree table")
    };
    let weights = match input {
        SnpInput::Sage => mean_weights(block),
        // GDP's destination factors, from the same function: identical edge weights.
        SnpInput::Gcn => destination_weights(block, &GcnNorm::new(block, Some(table())).dst),
    };
    let mut plan = PartialPlan::new(group, &data.offsets, block, &weights);
    if input == SnpInput::Gcn {
        let src = GcnNorm::source_factors(plan.sources(), table());
        plan.scale_sources(&src);
    }
    let transposes = source.transposes.build_from(1, &ob.upper, false);
    let sample_seconds = t.elapsed().as_secs_f64();

    // Only own rows: the sources' on their owners, the destinations' (SAGE's root term) here.
    let t = Instant::now();
    let (x_src, mut store) = OwnRows::read(&data.store, on_device, plan.sources());
    let x_dst = (input == SnpInput::Sage).then(|| {
        let (x, stats) = OwnRows::read(&data.store, on_device, block.dst_nodes());
        store.local_rows += stats.local_rows;
        x
    });
    SnpHostBatch {
        ob,
        input,
        plan,
        x_src,
        x_dst,
        store,
        transposes,
        sample_seconds,
        gather_seconds: t.elapsed().as_secs_f64(),
    }
}

/// One SNP step on the model's backend; gradients accumulate in `model`. Collective.
pub fn snp_step<B: Backend>(
    model: &mut Model<B>,
    data: &mut TrainData,
    resident: Option<&ResidentFeatures<B>>,
    args: &StepArgs,
    times: &mut PhaseTimes,
) -> Result<StepOutput> {
    let input = SnpInput::of(model, data)?;
    let source = InputSource::of(model, resident);
    let host = snp_host_batch(data, args.group, args.spec(), input, source);
    data.store.add_stats(&host.store);
    snp_train_step(model, data, resident, host, args, times)
}

/// The model's side of an SNP step on a prepared [`SnpHostBatch`]: the plan and the rows onto
/// the backend (the rows gathered there from `resident` where the host kept only indices),
/// the input layer's partial sums and the upper layers over `args.group`, and back.
/// Collective.
pub fn snp_train_step<B: Backend>(
    model: &mut Model<B>,
    data: &TrainData,
    resident: Option<&ResidentFeatures<B>>,
    host: SnpHostBatch,
    args: &StepArgs,
    times: &mut PhaseTimes,
) -> Result<StepOutput> {
    let StepArgs {
        group, key, scale, ..
    } = *args;
    let be = model.params.backend().clone();
    let SnpHostBatch {
        mut ob,
        input,
        plan,
        x_src,
        x_dst,
        transposes,
        sample_seconds,
        gather_seconds,
        ..
    } = host;
    times.sample += sample_seconds;
    times.gather += gather_seconds;
    let conv = match (&model.layers[0].conv, input) {
        (Conv::Sage(c), SnpInput::Sage) => InputConv::Sage(c.clone()),
        (Conv::Gcn(c), SnpInput::Gcn) => InputConv::Gcn(c.clone()),
        _ => bail!("strategy snp: a batch prepared for another input layer ({input:?})"),
    };

    let t = Instant::now();
    let partial = plan.on(&be);
    let block = &ob.input_block;
    let ctx = step_ctx(data, key);
    let layer = &model.layers[0];
    let x_src = x_src.on(&be, resident, layer, &ctx, partial.sources());
    let x_dst = x_dst.map(|x| x.on(&be, resident, layer, &ctx, block.dst_nodes()));
    let upper = ob.take_upper(&be);
    let upper_transposes = transposes_on(&be, transposes);
    times.gather += t.elapsed().as_secs_f64();

    let forward = PassClock::start(times);
    let mut h_mine = match &conv {
        InputConv::Sage(c) => {
            let projected = c.project_neighbours(&model.params, &x_src);
            let sums = partial.partial_sums(&be, be.view(&projected));
            let mut h = times.time_shuffle(|| partial.gather_sums(group, &be, sums));
            let x_dst = x_dst.as_ref().expect("gathered for sage");
            c.add_root(&model.params, x_dst, be.view_mut(&mut h));
            h
        }
        InputConv::Gcn(c) => {
            let projected = c.project(&model.params, &x_src);
            let sums = partial.partial_sums(&be, be.view(&projected));
            let mut h = times.time_shuffle(|| partial.gather_sums(group, &be, sums));
            c.add_bias(&model.params, be.view_mut(&mut h));
            h
        }
    };
    let saved = layer
        .activation
        .map(|act| (act, be.activation_forward(act, be.view_mut(&mut h_mine))));
    times.forward += forward.seconds(times);

    let (loss_sum, mut d_mine) = ob.upper_layers(
        model,
        &upper,
        &upper_transposes,
        data,
        group,
        be.view(&h_mine),
        &ctx,
        scale,
        times,
        ("snp_rows", "snp_grads"),
    );
    drop(h_mine);

    let backward = PassClock::start(times);
    if let Some((act, saved)) = &saved {
        be.activation_backward(*act, saved, be.view_mut(&mut d_mine));
    }
    match &conv {
        InputConv::Sage(c) => {
            let x_dst = x_dst.as_ref().expect("gathered for sage");
            c.accumulate_root_grad(&mut model.params, x_dst, be.view(&d_mine));
            let d_sums = times.time_shuffle(|| partial.scatter_grads(group, &be, be.view(&d_mine)));
            let d_projected = partial.partial_sums_backward(&be, d_sums);
            c.accumulate_neighbour_grad(&mut model.params, &x_src, be.view(&d_projected));
        }
        InputConv::Gcn(c) => {
            c.accumulate_bias_grad(&mut model.params, be.view(&d_mine));
            let d_sums = times.time_shuffle(|| partial.scatter_grads(group, &be, be.view(&d_mine)));
            let d_projected = partial.partial_sums_backward(&be, d_sums);
            c.accumulate_weight_grad(&mut model.params, &x_src, be.view(&d_projected));
        }
    }
    times.backward += backward.seconds(times);
    Ok(ob.output(loss_sum, partial.sources().len()))
}

/// This rank's feature rows of some of its own vertices, as read on the host. Which path the
/// input layer takes is decided from the rows' counts ([`FeatureStore::prefers_sparse_rows`]
/// makes the test `InputRows::new` would make of the dense rows): sparse rows come from the
/// store's CSR copy where it keeps one; dense rows, where the device keeps the rank's rows, as
/// indices only; else the dense rows themselves.
enum OwnRows {
    OnDevice(Vec<u32>),
    Host(Array2<f32>),
    /// Rows that take the sparse path, from the store's CSR copy: never dense (Facebook: 4,714
    /// columns, about 13 set).
    Sparse(CsrMatrix),
}

impl OwnRows {
    /// The rows of `ids` from `store`, and the store's counters for them; `on_device`: the
    /// device keeps this rank's own rows.
    fn read(store: &FeatureStore, on_device: bool, ids: &[NodeId]) -> (OwnRows, StoreStats) {
        let sparse = store.prefers_sparse_rows(ids) == Some(true);
        if sparse {
            if let Some((csr, stats)) = store.gather_local_sparse(ids) {
                return (OwnRows::Sparse(csr), stats);
            }
        }
        if on_device && !sparse {
            let (rows, stats) = store.own_row_indices(ids);
            (OwnRows::OnDevice(rows), stats)
        } else {
            let (x, stats) = store.own_rows_of(ids);
            (OwnRows::Host(x), stats)
        }
    }

    /// The rows of `ids` as the input layer reads them on `be`: gathered from `resident`
    /// there, the CSR rows as such, or made from the host's dense rows by [`input_rows`]; the
    /// same path and masks either way, so the same numbers.
    fn on<B: Backend>(
        self,
        be: &B,
        resident: Option<&ResidentFeatures<B>>,
        layer: &Layer,
        ctx: &DropoutCtx,
        ids: &[NodeId],
    ) -> InputRows<B> {
        match self {
            OwnRows::OnDevice(rows) => {
                let own = &resident
                    .expect("rows are read on the device only where it keeps them")
                    .own;
                let mut x = be.gather_rows(be.view(own), &rows);
                if ctx.training && layer.dropout > 0.0 {
                    let keys = dropout_keys(ctx, ids);
                    be.dropout_in_place(&layer.input_dropout(ctx), be.view_mut(&mut x), &keys);
                }
                InputRows::Dense(x)
            }
            OwnRows::Sparse(csr) => {
                let mut x = be.sparse_from_csr(csr, None);
                if ctx.training && layer.dropout > 0.0 {
                    let keys = dropout_keys(ctx, ids);
                    be.sparse_dropout_in_place(&layer.input_dropout(ctx), &mut x, &keys);
                }
                InputRows::Sparse(x)
            }
            OwnRows::Host(x) => input_rows(be, layer, ctx, x, ids),
        }
    }
}

/// The keys of `ids`' dropout rows: original ids, the keys GDP's masks use.
fn dropout_keys(ctx: &DropoutCtx, ids: &[NodeId]) -> Vec<u64> {
    match ctx.orig_ids {
        Some(orig) => ids.iter().map(|&v| orig[v as usize]).collect(),
        None => ids.iter().map(|&v| v as u64).collect(),
    }
}

/// Feature rows of the vertices `ids` as the input layer reads them, on backend `be`: sparse
/// when mostly zero and the backend has a sparse path (as `Layer::forward_input` decides for
/// GDP), after the input dropout with the mask `Layer::forward` draws (the layer's stream,
/// rows keyed by original id) — GDP's mask for every vertex, whichever rank applies it.
fn input_rows<B: Backend>(
    be: &B,
    layer: &Layer,
    ctx: &DropoutCtx,
    x: Array2<f32>,
    ids: &[NodeId],
) -> InputRows<B> {
    let mask = (ctx.training && layer.dropout > 0.0).then(|| layer.input_dropout(ctx));
    let keys = if mask.is_some() {
        dropout_keys(ctx, ids)
    } else {
        Vec::new()
    };
    InputRows::new(be, x, mask.as_ref(), &keys)
}
