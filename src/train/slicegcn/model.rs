//! One rank's SliceGCN: its own GCN over the whole graph on its feature slice (or on the
//! shared fusion of all features), a learned slice encoding added to its output, the slice
//! outputs of all ranks gathered side by side, and a shared MLP classifier on them.
//!
//! Parameters live in two stores: the rank's GCN (`gcn`, never summed over ranks) and the
//! shared parts (`shared`: encoding, fusion, classifier; the same values on every rank, their
//! gradients summed by allreduce).
//!
//! The classifier is data parallel over the rows: the rows are cut into `p` contiguous chunks,
//! and an all-to-all sends rank `j` every rank's slice output of chunk `j` (`slice_outputs`),
//! which it places side by side and classifies; the gradient of that input goes back by the
//! reverse all-to-all (`slice_grads`). So each rank runs the classifier on `1/p` of the rows,
//! and holds `1/p` of its activations, instead of all of it on every rank; and each receives
//! `1/p` of what an allgather of the slice outputs would bring. Dropout masks are keyed by row,
//! so a row gets the same mask on whichever rank classifies it.

use super::layout::SliceLayout;
use crate::backend::cpu::dropout::derive_stream;
use crate::backend::cpu::standard;
use crate::backend::{Backend, Cpu};
use crate::comm::Group;
use crate::config::TrainConfig;
use crate::nn::init::glorot_uniform;
use crate::nn::mlp::{Mlp, MlpCache};
use crate::nn::{DropoutCtx, Model, ModelConfig, ModelKind, ParamStore};
use crate::train::metrics::{PassClock, PhaseTimes};
use anyhow::Result;
use ndarray::{s, Array2, ArrayView2};
use std::ops::Range;

/// Mixed into the seed of the shared parts, so they differ from rank 0's GCN.
const SHARED_SEED_TAG: u64 = 0x5348_4152_4544;
/// Mixed into the fusion's dropout stream tag (the fusion has no dropout today; the tag keeps
/// its masks apart from the head's should it get one).
const FUSION_TAG: u64 = 0x4655_5349_4f4e;

/// One rank's share of a SliceGCN.
#[derive(Debug)]
pub struct SliceModel<B: Backend = Cpu> {
    pub layout: SliceLayout,
    /// Encoding (`p × w`), fusion, then the classifier; the same values on every rank.
    pub shared: ParamStore<B>,
    pub encoding: Option<usize>,
    pub fusion: Option<Mlp>,
    pub head: Mlp,
    /// This rank's GCN (`gcn_in → w → … → w`), its own parameters.
    pub gcn: Model<B>,
}

/// What the model trains and evaluates on: the whole graph's block (GCN-normalised by the
/// degree table), its transpose, the rank's input columns of every vertex, and the row keys
/// of dropout (the original ids).
pub struct SliceInput<'a, B: Backend> {
    pub graph: &'a B::Graph,
    pub transpose: &'a B::Transpose,
    pub x: &'a B::Mat,
    pub keys: &'a [u64],
    pub gcn_degrees: Option<&'a [u32]>,
}

impl SliceModel<Cpu> {
    /// Build rank `layout.rank`'s model: the shared parts from `seed` (the same on every
    /// rank), the GCN from `seed` and the rank.
    pub fn new(
        layout: SliceLayout,
        cfg: &TrainConfig,
        classes: usize,
        seed: u64,
    ) -> Result<SliceModel<Cpu>> {
        // This rank's GCN: the run's shape at the slice's width.
        let gcn_cfg = ModelConfig {
            kind: ModelKind::Gcn,
            hidden: layout.width,
            heads: 1,
            ..crate::train::model_config(cfg, layout.gcn_in, layout.width)
        };
        let gcn = Model::new(gcn_cfg, derive_stream(seed, layout.rank as u64))?;
        let shared_seed = derive_stream(seed, SHARED_SEED_TAG);
        let mut shared = ParamStore::new();
        let encoding = cfg.slice_encoding.then(|| {
            let e = shared.add("slice_encoding", &[layout.ranks, layout.width]);
            glorot_uniform(&mut shared, e, derive_stream(shared_seed, 1));
            e
        });
        // The fusion is a 2-layer MLP of the run's hidden width: a hidden layer as narrow as
        // its output (⌈d'/p⌉, 3 columns for Minesweeper at p = 3) loses what ReLU zeroes there,
        // and one as wide as the features (d' × d') would dwarf the GCNs on wide data.
        let fusion = layout.fusion.then(|| {
            let mut m = Mlp::new(
                &mut shared,
                "fusion",
                &[layout.features, cfg.hidden, layout.gcn_in],
                0.0,
                cfg.init,
                derive_stream(shared_seed, 2),
            );
            m.tag ^= FUSION_TAG;
            m
        });
        let head = Mlp::new(
            &mut shared,
            "head",
            &[layout.gathered(), cfg.hidden, classes],
            cfg.dropout,
            cfg.init,
            derive_stream(shared_seed, 3),
        );
        Ok(SliceModel {
            layout,
            shared,
            encoding,
            fusion,
            head,
            gcn,
        })
    }

    /// The same model with its parameters on `backend`.
    pub fn to_backend<B: Backend>(&self, backend: B) -> SliceModel<B> {
        SliceModel {
            layout: self.layout.clone(),
            shared: self.shared.to_backend(backend.clone()),
            encoding: self.encoding,
            fusion: self.fusion.clone(),
            head: self.head.clone(),
            gcn: self.gcn.to_backend(backend),
        }
    }
}

/// What the forward keeps for the backward.
struct SliceCache<B: Backend> {
    fusion: Option<MlpCache<B>>,
    gcn: Vec<crate::nn::layer::LayerCache<B>>,
    head: MlpCache<B>,
}

impl<B: Backend> SliceModel<B> {
    /// Logits of this rank's chunk of `rows` (row indices of the graph; [`chunk`]) from the
    /// forward pass, and its cache. Collective over `group` (the slice outputs are exchanged).
    fn forward(
        &self,
        group: &Group,
        input: &SliceInput<B>,
        rows: &[usize],
        stream: u64,
        training: bool,
        times: &mut PhaseTimes,
    ) -> (B::Mat, SliceCache<B>) {
        let be = self.shared.backend().clone();
        // The head runs identically on every rank: one stream for all; each rank's GCN mixes
        // in its rank so the slices draw independent masks.
        // Without training (evaluation's logits) no backward pass follows.
        let head_ctx = DropoutCtx {
            training,
            keep_for_backward: training,
            stream,
            orig_ids: None,
            gcn_degrees: None,
        };
        let gcn_ctx = DropoutCtx {
            training,
            keep_for_backward: training,
            stream: derive_stream(stream, self.layout.rank as u64),
            orig_ids: None,
            gcn_degrees: input.gcn_degrees,
        };
        let (fused, fusion_cache) = match &self.fusion {
            Some(f) => {
                let (x, c) = f.forward(&self.shared, be.view(input.x), input.keys, &head_ctx);
                (Some(x), Some(c))
            }
            None => (None, None),
        };
        let x = fused.as_ref().unwrap_or(input.x);
        let mut caches = Vec::with_capacity(self.gcn.layers.len());
        let mut h: Option<B::Mat> = None;
        for layer in &self.gcn.layers {
            let src = h.as_ref().map_or(be.view(x), |m| be.view(m));
            let (out, cache) = layer.forward(&self.gcn.params, input.graph, src, &gcn_ctx);
            caches.push(cache);
            h = Some(out);
        }
        let h = h.expect("at least one layer");
        let mut mine = be.select_rows(be.view(&h), rows);
        drop(h);
        if let Some(e) = self.encoding {
            let r = self.layout.rank;
            be.add_bias(
                be.view_mut(&mut mine),
                be.rows(self.shared.view(e), r..r + 1),
            );
        }
        let gathered = times.time_shuffle(|| to_classifier(group, &be, mine, self.layout.width));
        let own = chunk(rows.len(), group.size(), group.rank());
        let keys: Vec<u64> = rows[own].iter().map(|&r| input.keys[r]).collect();
        let (logits, head) = self
            .head
            .forward(&self.shared, be.view(&gathered), &keys, &head_ctx);
        (
            logits,
            SliceCache {
                fusion: fusion_cache,
                gcn: caches,
                head,
            },
        )
    }

    /// Logits of `rows` without dropout (evaluation), on the host of every rank: each rank
    /// classifies its chunk, and the chunks' logits are allgathered. Collective.
    pub fn logits(&self, group: &Group, input: &SliceInput<B>, rows: &[usize]) -> Array2<f32> {
        let (logits, _) = self.forward(group, input, rows, 0, false, &mut PhaseTimes::default());
        let mine = self.shared.backend().download_owned(logits);
        if group.size() == 1 {
            return mine;
        }
        let classes = mine.ncols();
        let flat: Vec<f32> = mine.iter().copied().collect();
        let (all, _) = group.allgatherv("slice_logits", &flat);
        Array2::from_shape_vec((rows.len(), classes), all).expect("every chunk's logits")
    }

    /// Zero the gradients, run forward and backward on the training rows `rows` (labels
    /// `labels`) for the gradient of the mean cross-entropy, and sum the shared gradients over
    /// ranks. Returns the summed loss over `rows` (on every rank). Collective over `group`.
    pub fn train_step(
        &mut self,
        group: &Group,
        input: &SliceInput<B>,
        rows: &[usize],
        labels: &[i64],
        stream: u64,
    ) -> f64 {
        self.train_step_timed(
            group,
            input,
            rows,
            labels,
            stream,
            &mut PhaseTimes::default(),
        )
    }

    /// [`SliceModel::train_step`], adding its phases to `times`: forward and backward (less
    /// the exchanges of slice outputs and their gradients, counted as `shuffle`) and the
    /// allreduce of the shared gradients and the loss.
    pub fn train_step_timed(
        &mut self,
        group: &Group,
        input: &SliceInput<B>,
        rows: &[usize],
        labels: &[i64],
        stream: u64,
        times: &mut PhaseTimes,
    ) -> f64 {
        let be = self.shared.backend().clone();
        self.shared.zero_grads();
        self.gcn.params.zero_grads();
        let n = be.dim(be.view(input.x)).0;
        let clock = PassClock::start(times);
        let (logits, cache) = self.forward(group, input, rows, stream, true, times);
        let own = chunk(rows.len(), group.size(), group.rank());
        let (loss_sum, mut d) = be.cross_entropy(be.view(&logits), &labels[own]);
        drop(logits);
        times.forward += clock.seconds(times);
        let clock = PassClock::start(times);
        be.scale(be.view_mut(&mut d), 1.0 / rows.len().max(1) as f32);
        let d_gathered = self
            .head
            .backward(&mut self.shared, cache.head, d, true)
            .expect("asked for the input gradient");
        let (r, w) = (self.layout.rank, self.layout.width);
        let d_mine = times.time_shuffle(|| from_classifier(group, &be, d_gathered, w, rows.len()));
        if let Some(e) = self.encoding {
            let grad = be.rows_mut(self.shared.grad_mut(e), r..r + 1);
            be.add_column_sums(grad, be.view(&d_mine));
        }
        let mut d_h = be.scatter_rows(be.view(&d_mine), rows, n);
        drop(d_mine);
        let need_dx = self.fusion.is_some();
        let mut d_x = None;
        for (l, (layer, c)) in self.gcn.layers.iter().zip(cache.gcn).enumerate().rev() {
            let need = l > 0 || need_dx;
            let next = layer.backward_owned(
                &mut self.gcn.params,
                input.graph,
                input.transpose,
                c,
                d_h,
                need,
            );
            match next {
                Some(next) if l > 0 => d_h = next,
                Some(next) => {
                    d_x = Some(next);
                    break;
                }
                None => break,
            }
        }
        if let (Some(f), Some(c), Some(d_x)) = (&self.fusion, cache.fusion, d_x) {
            f.backward(&mut self.shared, c, d_x, false);
        }
        times.backward += clock.seconds(times);
        // Read once the backward pass is queued: reading waits for the device.
        let loss_sum = loss_sum.value();
        if group.size() == 1 {
            return loss_sum;
        }
        let t = std::time::Instant::now();
        be.with_host_buffer(&mut self.shared.grads, &mut |g| group.allreduce_sum_f32(g));
        let mut total = [loss_sum];
        group.allreduce_sum_f64(&mut total);
        times.allreduce += t.elapsed().as_secs_f64();
        total[0]
    }

    /// Parameters of this rank: (its GCN, the shared parts).
    pub fn num_params(&self) -> (usize, usize) {
        (self.gcn.params.len(), self.shared.len())
    }
}

/// The chunk of `len` rows that rank `rank` of `ranks` classifies: contiguous, in rank
/// order, sizes differing by at most one.
fn chunk(len: usize, ranks: usize, rank: usize) -> Range<usize> {
    len * rank / ranks..len * (rank + 1) / ranks
}

/// Rows of each chunk, in rank order.
fn chunk_sizes(len: usize, ranks: usize) -> Vec<usize> {
    (0..ranks).map(|j| chunk(len, ranks, j).len()).collect()
}

/// The classifier's input on this rank: every rank's slice output (`mine`, all rows ×
/// `width`) of this rank's chunk, rank `i` in columns `i·width..`. One all-to-all (each rank
/// sends chunk `j` of its rows to rank `j`) on the host, where the columns are placed: one
/// download and one upload on a device backend. Collective.
fn to_classifier<B: Backend>(group: &Group, be: &B, mine: B::Mat, width: usize) -> B::Mat {
    let p = group.size();
    if p == 1 {
        return mine;
    }
    let mine = be.download_owned(mine);
    let mine = standard(mine.view());
    let own = chunk(mine.nrows(), p, group.rank()).len();
    let (recv, _) = group.alltoallv_rows(
        "slice_outputs",
        mine.as_slice().expect("standard layout"),
        width,
        &chunk_sizes(mine.nrows(), p),
    );
    // Block `i` (rows `i·own..`) came from rank `i`: it becomes columns `i·width..`.
    let recv = ArrayView2::from_shape((p * own, width), &recv).expect("own rows from each rank");
    let mut out = Array2::<f32>::zeros((own, p * width));
    for i in 0..p {
        out.slice_mut(s![.., i * width..(i + 1) * width])
            .assign(&recv.slice(s![i * own..(i + 1) * own, ..]));
    }
    be.upload_owned(out)
}

/// The reverse of [`to_classifier`]: the gradient of this rank's classifier input (its
/// chunk's rows × `p·width`) goes back by columns, and this rank receives the gradient of its
/// slice output for all `len` rows (in row order). Collective.
fn from_classifier<B: Backend>(
    group: &Group,
    be: &B,
    d: B::Mat,
    width: usize,
    len: usize,
) -> B::Mat {
    let p = group.size();
    if p == 1 {
        return d;
    }
    let d = be.download_owned(d);
    let own = d.nrows();
    let mut send = Array2::<f32>::zeros((p * own, width));
    for i in 0..p {
        send.slice_mut(s![i * own..(i + 1) * own, ..])
            .assign(&d.slice(s![.., i * width..(i + 1) * width]));
    }
    let send = send.as_slice().expect("built in standard layout");
    let (recv, _) = group.alltoallv_rows("slice_grads", send, width, &vec![own; p]);
    be.upload_owned(Array2::from_shape_vec((len, width), recv).expect("every chunk's rows"))
}
