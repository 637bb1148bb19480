//! Node-feature parallelism (APT's NFP, P3's push-pull): rank `r` holds columns
//! `[c_r, c_{r+1})` of every vertex's input features ([`super::columns`]) and uses only the
//! matching rows of the input layer's weight matrices.
//!
//! One step: every rank samples the seeds of the global mini-batch it owns exactly as GDP
//! does (same blocks), and the input blocks of all ranks are allgathered. Each rank computes
//! the input layer's partial `Σ_u w_uv · x_u[c_r..c_{r+1}] · W[c_r..c_{r+1}, :]` (SAGE: root
//! and neighbour terms; GCN: the normalised aggregation; MLP: the row's product) for the
//! destinations of every rank, in one pass over the ranks' blocks stacked into one
//! ([`Block::stacked`]), on the model's own sliced weights; the partial rows (hidden width) are summed at the
//! destinations' ranks (a reduce-scatter), which add the bias and the activation and run the
//! upper layers data parallel, as GDP. Backward reverses it: the gradient of each rank's
//! input-layer pre-activation rows goes to every rank (an allgather), and each computes the
//! gradient of its rows of `W`. That gradient stays on its rank — it is left out of the
//! gradient allreduce ([`Nfp::unsynced_ranges`]) — while every other parameter (the input
//! layer's bias included, whose gradient the destination's rank computes) is allreduced as
//! under GDP.
//!
//! A rank holds only its rows of the sliced weights: [`Nfp::slice_model`] cuts them out of
//! the whole model ([`ParamStore::with_rows`]), so they, their gradients and their Adam
//! moments take `1/P` of the whole matrices' memory. Every other parameter is whole and
//! identical on every rank. A checkpoint is the whole model, the one GDP would write: the
//! slices (values and Adam moments) are allgathered into the whole layout
//! ([`Nfp::whole_state`]), and a resumed one is cut to this rank's rows again
//! ([`Nfp::narrow`]); so NFP and GDP resume each other's checkpoints.
//!
//! Input dropout is applied on the host while the rows are gathered, with the mask GDP draws
//! keyed by the **global** column (`c_r + c`), so every element gets GDP's mask bit; the sliced
//! layer itself then runs without dropout. GAT is refused in the configuration: its attention
//! scores are a nonlinear function of the whole projected row.

use super::data::TrainData;
use super::metrics::{PassClock, PhaseTimes};
use super::strategy::{
    inference_ctx, recycle_host_rows, step_ctx, upper_layers_data_parallel, FullGraph, StepArgs,
    StepOutput,
};
use crate::backend::input_rows::InputRows;
use crate::backend::{Backend, Cpu, DropoutMask, LossSum};
use crate::comm::Group;
use crate::exchange::slices::{allgather_blocks, allgather_rows, reduce_scatter_rows};
use crate::exchange::FeatureStore;
use crate::graph::{Dataset, NodeId};
use crate::nn::gcn::GcnConv;
use crate::nn::layer::{row_keys, Conv, LayerCache};
use crate::nn::linear::{accumulate_bias_grad, Linear};
use crate::nn::params::{narrow_rows, ParamEntry};
use crate::nn::sage::SageConv;
use crate::nn::{Adam, DropoutCtx, Layer, Model, ParamStore};
use crate::sample::{sample_blocks, Block, LocalGraph};
use anyhow::{bail, Context, Result};
use ndarray::Array2;
use std::ops::Range;
use std::sync::OnceLock;
use std::time::Instant;

/// One rank's sliced input layer and its evaluation state.
pub struct Nfp<B: Backend> {
    /// This rank's feature columns.
    cols: Range<usize>,
    /// The input layer's convolution over this rank's columns, on the model's own (sliced)
    /// weights: `in_dim` = the slice width, no activation, no dropout and no bias (the bias is
    /// added once, where the partial rows meet). Its gradients land in the model's directly.
    layer: Layer,
    /// The sliced weight matrices' indices in the model's parameters.
    weights: Vec<usize>,
    /// The input layer's bias in the model's parameters.
    bias: usize,
    /// The whole model's parameter layout (what GDP holds and a checkpoint stores).
    whole_layout: Vec<ParamEntry>,
    /// Evaluation: the whole graph as one block (destinations = every vertex), and this
    /// rank's columns of every vertex, on the backend (built on first use and kept).
    whole: OnceLock<B::Graph>,
    features: OnceLock<InputRows<B>>,
}

/// The whole model's parameters and Adam state in its own layout (an NFP checkpoint).
pub struct WholeState {
    pub entries: Vec<ParamEntry>,
    pub params: Vec<f32>,
    pub adam_m: Vec<f32>,
    pub adam_v: Vec<f32>,
    pub adam_t: u64,
}

impl<B: Backend> Nfp<B> {
    /// Cut `model` (the whole model, initialised as GDP's) to this rank's rows of the input
    /// layer's weights — the columns `data` holds — and move it to `backend`; with the sliced
    /// input layer that runs on it. The returned model's input layer is usable only through
    /// the returned [`Nfp`]: its weights have the slice's rows, not `in_dim`.
    pub fn slice_model(
        model: Model<Cpu>,
        data: &TrainData,
        backend: B,
    ) -> Result<(Model<B>, Nfp<B>)> {
        let sliced = data
            .sliced
            .as_ref()
            .context("strategy nfp: the data were not loaded as column slices")?;
        let cols = sliced.columns.range.clone();
        let first = &model.layers[0];
        if first.input.is_some() || first.norm.is_some() || first.residual {
            bail!(
                "strategy nfp: the input layer has an input projection, norm or residual, which \
                 need whole feature rows; drop `input_proj`"
            );
        }
        let w = cols.len();
        // The model's own weight indices (their rows cut to the slice below) and no bias.
        let (conv, weights, bias) = match &first.conv {
            Conv::Sage(c) => (
                Conv::Sage(SageConv {
                    in_dim: w,
                    bias: None,
                    ..c.clone()
                }),
                vec![c.w_self, c.w_neigh],
                c.bias,
            ),
            Conv::Gcn(c) => (
                Conv::Gcn(GcnConv {
                    in_dim: w,
                    bias: None,
                    ..c.clone()
                }),
                vec![c.weight],
                c.bias,
            ),
            Conv::Dense(c) => (
                Conv::Dense(Linear {
                    in_dim: w,
                    bias: None,
                    ..c.clone()
                }),
                vec![c.weight],
                c.bias,
            ),
            Conv::Gat(_) => bail!(
                "strategy nfp does not support GAT: its attention scores are a nonlinear \
                 function of the whole projected row, not a sum over feature slices"
            ),
        };
        let bias = bias.context("strategy nfp: the input layer has no bias")?;
        let whole_layout = model.params.entries.clone();
        let sliced = Model {
            params: model.params.with_rows(&weights, cols.clone()),
            ..model
        };
        let nfp = Nfp {
            cols,
            layer: Layer::plain(0, conv, 0.0, None),
            weights,
            bias,
            whole_layout,
            whole: OnceLock::new(),
            features: OnceLock::new(),
        };
        Ok((sliced.to_backend(backend), nfp))
    }

    /// The flat-buffer ranges of the sliced weight matrices in the (sliced) model: their
    /// gradients are not allreduced, and their values differ between ranks.
    pub fn unsynced_ranges(&self, model: &Model<B>) -> Vec<Range<usize>> {
        self.weights
            .iter()
            .map(|&m| {
                let e = &model.params.entries[m];
                e.offset..e.offset + e.len()
            })
            .collect()
    }

    /// This rank's columns of rows `ids` on the backend, masked with GDP's input dropout
    /// (`mask` with the rows' keys, as [`row_keys`] makes them for GDP): as CSR from the store's sparse
    /// copy where the input layer takes sparse rows and these rows pass its sparse test
    /// (the store makes the test `forward_input` makes on dense rows, from the rows'
    /// non-zero counts), so bag-of-words slices are read and multiplied by their non-zeros
    /// only — on Facebook a step's rows are a few MB of entries against hundreds of MB
    /// dense; else dense rows.
    fn slice_rows(
        &self,
        be: &B,
        store: &FeatureStore,
        ids: &[NodeId],
        mask: Option<(&DropoutMask, &[u64])>,
    ) -> InputRows<B> {
        let sparse = self.layer.takes_sparse_input()
            && store.has_sparse_copy()
            && store.prefers_sparse_rows(ids) == Some(true);
        if let Some((mut csr, _)) = sparse.then(|| store.gather_local_sparse(ids)).flatten() {
            if let Some((mask, keys)) = mask {
                mask.apply_sparse_in_place_from(&mut csr, keys, self.cols.start);
            }
            return InputRows::Sparse(be.sparse_from_csr(csr, None));
        }
        let (mut x, _) = store.gather_local(ids);
        if let Some((mask, keys)) = mask {
            mask_columns(mask, &mut x, keys, self.cols.start);
        }
        if B::IS_HOST {
            // Given back to the store once the forward is done with it (`recycle_rows`).
            InputRows::Dense(be.upload_owned(x))
        } else {
            let up = be.upload(x.view());
            store.recycle(x);
            InputRows::Dense(up)
        }
    }

    /// Give a step's dense rows on the host back to the store, as GDP does.
    fn recycle_rows(be: &B, store: &FeatureStore, x: InputRows<B>) {
        if let InputRows::Dense(x) = x {
            recycle_host_rows(be, store, x);
        }
    }

    /// The sliced input layer's forward pass on `x` (its sparse path for CSR rows).
    fn forward_slice(
        &self,
        params: &ParamStore<B>,
        g: &B::Graph,
        x: &InputRows<B>,
        ctx: &DropoutCtx,
    ) -> (B::Mat, LayerCache<B>) {
        let be = params.backend();
        match x {
            InputRows::Dense(x) => self.layer.forward_input(params, g, be.view(x), ctx),
            InputRows::Sparse(x) => self.layer.forward_sparse(params, g, x, ctx),
        }
    }

    /// Parameters or Adam moments `whole`, in the whole model's layout (a checkpoint's), cut to
    /// this rank's layout.
    pub fn narrow(&self, whole: &[f32]) -> Result<Vec<f32>> {
        let n = self.whole_len();
        if whole.len() != n {
            bail!("nfp: {} values for a model of {n} parameters", whole.len());
        }
        Ok(narrow_rows(
            &self.whole_layout,
            &self.weights,
            &self.cols,
            whole,
        ))
    }

    /// The number of parameters of the whole model.
    pub fn whole_len(&self) -> usize {
        self.whole_layout.iter().map(ParamEntry::len).sum()
    }

    /// One NFP step; gradients accumulate in `model` (the sliced weights' only in this rank's
    /// rows). `sampled`: this rank's seeds' blocks sampled ahead ([`crate::sample::ahead`]),
    /// else sampled here. Collective.
    pub fn step(
        &mut self,
        model: &mut Model<B>,
        data: &mut TrainData,
        args: &StepArgs,
        sampled: Option<Vec<Block>>,
        times: &mut PhaseTimes,
    ) -> Result<StepOutput> {
        let StepArgs {
            group,
            batch,
            fanouts,
            key,
            self_loops,
            scale,
        } = *args;
        let be = model.params.backend().clone();
        let t = Instant::now();
        let sliced = data.sliced.as_ref().context("nfp: no sliced data")?;
        let seeds: Vec<NodeId> = batch.iter().copied().filter(|&v| data.owns(v)).collect();
        // Every rank holds the whole topology: its seeds' blocks are GDP's, sampled locally.
        let mut blocks = match sampled {
            Some(blocks) => blocks,
            None => {
                let graph = LocalGraph::new(&sliced.topology, data.orig_ids.as_deref());
                sample_blocks(&graph, &seeds, fanouts, key)
            }
        };
        if self_loops {
            blocks = blocks.iter().map(Block::with_self_loops).collect();
        }
        let mut out = StepOutput {
            loss_sum: LossSum::default(),
            seeds: seeds.len() as u64,
            nodes: blocks.iter().map(|b| b.num_dst as u64).sum(),
            edges: blocks.iter().map(|b| b.num_edges() as u64).sum(),
            input_rows: blocks[0].num_src() as u64,
        };
        let inputs = allgather_blocks(group, "nfp_blocks", &blocks[0]);
        times.sample += t.elapsed().as_secs_f64();

        // Every rank's input block as one: the sliced layer runs once over all of them, and
        // its partial rows come out stacked by rank, as they are sent.
        let dst_counts: Vec<usize> = inputs.iter().map(|b| b.num_dst).collect();
        let stacked = Block::stacked(&inputs);
        drop(inputs);

        // This rank's columns of the stacked block's input rows, masked with GDP's input
        // dropout (keyed by vertex, as GDP keys them).
        let t = Instant::now();
        let ctx = step_ctx(data, key);
        let first = &model.layers[0];
        let mask = (first.dropout > 0.0).then(|| first.input_dropout(&ctx));
        let keys = mask
            .as_ref()
            .map(|_| row_keys(&stacked, stacked.num_src(), ctx.orig_ids));
        let masked = mask.as_ref().zip(keys.as_deref());
        let x = (stacked.num_dst > 0)
            .then(|| self.slice_rows(&be, &data.store, &stacked.src_nodes, masked));
        let g = be.graph(stacked);
        let upper: Vec<B::Graph> = blocks.drain(1..).map(|b| be.graph(b)).collect();
        let mine = blocks[0].num_dst;
        times.gather += t.elapsed().as_secs_f64();

        let forward = PassClock::start(times);
        let h = self.layer.conv.out_dim();
        let (send, cache) = match x {
            Some(x) => {
                let (partials, cache) = self.forward_slice(&model.params, &g, &x, &ctx);
                Self::recycle_rows(&be, &data.store, x);
                (partials, Some(cache))
            }
            None => (be.zeros(0, h), None),
        };
        let mut z = times.time_shuffle(|| {
            reduce_scatter_rows(group, &be, "nfp_partials", send, &dst_counts, mine)
        });
        be.add_bias(be.view_mut(&mut z), model.params.view(self.bias));
        let first = &model.layers[0];
        let saved = first
            .activation
            .map(|act| (act, be.activation_forward(act, be.view_mut(&mut z))));
        times.forward += forward.seconds(times);

        let labels: Vec<i64> = seeds.iter().map(|&s| data.label(s)).collect();
        let mut d_z = if seeds.is_empty() {
            be.zeros(0, h)
        } else {
            let (loss_sum, d) =
                upper_layers_data_parallel(model, &upper, &[], z, &labels, &ctx, scale, times);
            out.loss_sum = loss_sum;
            d
        };

        let backward = PassClock::start(times);
        if let Some((act, saved)) = &saved {
            be.activation_backward(*act, saved, be.view_mut(&mut d_z));
        }
        accumulate_bias_grad(&mut model.params, Some(self.bias), be.view(&d_z));
        // Every rank's gradient rows, stacked by rank: the stacked block's output gradient.
        let d_all = times
            .time_shuffle(|| allgather_rows(group, &be, "nfp_grads", be.view(&d_z), &dst_counts));
        drop(d_z);
        if let Some(cache) = cache {
            self.layer.backward(
                &mut model.params,
                &g,
                &B::Transpose::default(),
                cache,
                be.view(&d_all),
                false,
            );
        }
        times.backward += backward.seconds(times);
        Ok(out)
    }

    /// Logits of the owned vertices by exact full-graph inference: the input layer's partial
    /// rows of every vertex over this rank's columns, summed at the vertices' owners; the
    /// upper layers over `full`'s partitioned graph and halo exchange, as under GDP.
    /// Collective.
    pub fn infer(
        &mut self,
        group: &Group,
        model: &Model<B>,
        data: &TrainData,
        full: &FullGraph<B>,
        self_loops: bool,
    ) -> Result<B::Mat> {
        let be = model.params.backend().clone();
        let sliced = data.sliced.as_ref().context("nfp: no sliced data")?;
        let g = self
            .whole
            .get_or_init(|| be.graph(whole_block(&sliced.topology, self_loops)));
        let x = self.features.get_or_init(|| {
            let every: Vec<NodeId> = (0..sliced.topology.num_nodes as NodeId).collect();
            self.slice_rows(&be, &data.store, &every, None)
        });
        let ctx = inference_ctx(data);
        let (partial, _) = self.forward_slice(&model.params, g, x, &ctx);
        let counts: Vec<usize> = data
            .offsets
            .windows(2)
            .map(|w| (w[1] - w[0]) as usize)
            .collect();
        let own = data.part.local_nodes();
        let mut h = reduce_scatter_rows(group, &be, "nfp_eval_partials", partial, &counts, own);
        be.add_bias(be.view_mut(&mut h), model.params.view(self.bias));
        if let Some(act) = model.layers[0].activation {
            be.activation_in_place(act, be.view_mut(&mut h));
        }
        let part_graph = full.graph(&be);
        for layer in &model.layers[1..] {
            let out = {
                let h_src = full
                    .plan
                    .with_halo(group, &be, be.view(&h), "eval_halo_rows");
                layer
                    .forward(&model.params, part_graph, h_src.view(&be), &ctx)
                    .0
            };
            h = out;
        }
        Ok(h)
    }

    /// The whole model and its Adam state on every rank: every rank's rows of the sliced
    /// weights (values and moments) allgathered into the whole layout, the rest as held.
    /// Collective.
    pub fn whole_state(&self, group: &Group, model: &Model<B>, adam: &Adam<B>) -> WholeState {
        let (m, v, t) = adam.state();
        let [params, adam_m, adam_v] = [model.params.values_on_host(), m, v].map(|buf| {
            let mut out = Vec::with_capacity(self.whole_len());
            for (i, e) in model.params.entries.iter().enumerate() {
                let mine = &buf[e.offset..e.offset + e.len()];
                if self.weights.contains(&i) {
                    // Slices are contiguous rows in rank order: their concatenation is the
                    // matrix.
                    let (all, _) = group.allgatherv("nfp_weights", mine);
                    out.extend_from_slice(&all);
                } else {
                    out.extend_from_slice(mine);
                }
            }
            out
        });
        WholeState {
            entries: self.whole_layout.clone(),
            params,
            adam_m,
            adam_v,
            adam_t: t,
        }
    }
}

/// Apply `mask` to rows `x` of columns `first..` (row `r` keyed by `keys[r]`, as GDP keys
/// it): element `(r, c)` keeps GDP's bit for global column `first + c`.
fn mask_columns(mask: &DropoutMask, x: &mut Array2<f32>, keys: &[u64], first: usize) {
    let scale = mask.scale();
    for (mut row, &key) in x.rows_mut().into_iter().zip(keys) {
        for (c, e) in row.iter_mut().enumerate() {
            *e = if mask.keep(key, first + c) {
                *e * scale
            } else {
                0.0
            };
        }
    }
}

/// The whole graph as one block: every vertex a destination and (in id order) a source, with
/// GCN's self-loops when asked.
fn whole_block(topology: &Dataset, self_loops: bool) -> Block {
    let n = topology.num_nodes as usize;
    let block = Block {
        num_dst: n,
        src_nodes: (0..n as NodeId).collect(),
        indptr: topology.graph.indptr.iter().map(|&o| o as usize).collect(),
        indices: topology.graph.indices.clone(),
    };
    if self_loops {
        block.with_self_loops()
    } else {
        block
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sample::rng::hash_key;

    #[test]
    fn column_masks_are_the_whole_rows_masks_cut_at_the_slice() {
        let mask = DropoutMask::new(hash_key(&[1, 2, 3]), 0.5);
        let whole = Array2::from_shape_fn((5, 10), |(r, c)| (r * 10 + c + 1) as f32);
        let ids: Vec<NodeId> = vec![4, 9, 0, 2, 7];
        let keys: Vec<u64> = ids.iter().map(|&v| v as u64).collect();
        let expected = mask.apply(whole.view(), &keys);
        for cols in [0..3, 3..7, 7..10] {
            let mut x = whole.slice(ndarray::s![.., cols.clone()]).to_owned();
            mask_columns(&mask, &mut x, &keys, cols.start);
            assert_eq!(x, expected.slice(ndarray::s![.., cols.clone()]));
            // The same bits on the slice's stored entries, columns counted from `first`.
            let slice = whole.slice(ndarray::s![.., cols.clone()]);
            let mut csr = crate::backend::cpu::sparse::CsrMatrix::from_dense(slice);
            mask.apply_sparse_in_place_from(&mut csr, &keys, cols.start);
            assert_eq!(csr.to_dense(), expected.slice(ndarray::s![.., cols]));
        }
    }
}
