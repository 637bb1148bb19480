//! [`Cuda`], the CUDA backend: [`Backend`] over the device arrays of [`super::mat`], each
//! operation one of [`super::ops`] (kernels of `cuda/*.cu`) or a cuBLAS product
//! ([`super::blas`]), on a [`Device`] — a real GPU ([`super::driver::DriverGpu`]) or the CPU
//! emulator of the same kernels ([`super::emu::EmuGpu`], tests).
//!
//! The trait's operations do not return errors (the CPU's cannot fail); a device error — out
//! of memory, a failed launch — ends the process here through [`device_failed`], with the
//! device's message, the operation and the memory in use (under MPI the panic hook then aborts
//! the whole job naming the rank). Host descriptions that the CPU reads in place (dropout row
//! keys, GCN factors, labels) are uploaded per call; they are a few bytes per row.

use std::sync::{Arc, OnceLock};

use anyhow::Result;
use ndarray::{Array2, ArrayView2, CowArray, Ix2};

use super::calls::DeviceCalls;
use super::gpu::{DevPtr, Device};
use super::loss_journal::{LossJournal, LossKind};
use super::mat::{DevMat, DevVec, DevView, DevViewMut};
use super::ops::activation::DevSaved;
use super::ops::dropout::{DevKept, DevRowSeeds, RowMask};
use super::ops::graph::{DevGraph, DevTranspose, DevWeights};
use super::ops::sparse::DevSparse;
use super::ops::{
    activation, adam, aggregate, dropout, elementwise, epilogue, gat, gather, loss, norm, reduce,
};
use super::{blas, kernels};
use crate::backend::{
    Activation, AdamStep, AttentionArgs, AttentionGrads, Backend, BlockTranspose, CsrMatrix,
    DeviceSpan, DropoutMask, EdgeWeights, LossSum, RowDropout,
};
use crate::sample::Block;

/// The CUDA backend on one device.
#[derive(Clone, Debug)]
pub struct Cuda {
    device: Device,
    /// Ranks of this host that may share the device (each its own process): each may keep
    /// resident data in its share of the device ([`Backend::fits`]).
    shared_by: usize,
    /// Where the training steps' per-row losses wait to be read, a group at a time.
    losses: Arc<LossJournal>,
}

/// A device operation failed: say what, where and how much memory was in use, then end the
/// process (see the module doc).
#[cold]
fn device_failed(what: &str, device: &Device, err: anyhow::Error) -> ! {
    panic!(
        "CUDA backend: {what} failed on {}: {err:#} (device memory in use {:.0} MiB, peak \
         {:.0} MiB)",
        device.gpu.describe(),
        device.memory.current() as f64 / 1048576.0,
        device.memory.peak() as f64 / 1048576.0
    )
}

impl Cuda {
    /// The backend on `device`.
    pub fn new(device: Device) -> Cuda {
        Cuda {
            losses: LossJournal::new(device.clone()),
            device,
            shared_by: 1,
        }
    }

    /// The backend on GPU `ordinal` (among those `CUDA_VISIBLE_DEVICES` leaves visible), its
    /// kernels compiled for it by NVRTC, products in fp32 or, with `tf32`, on TF32 tensor cores.
    pub fn on_gpu(ordinal: usize, tf32: bool) -> Result<Cuda> {
        let options = super::driver::DriverOptions {
            math: if tf32 {
                super::cublas::MathMode::Tf32
            } else {
                super::cublas::MathMode::Fp32
            },
            ..Default::default()
        };
        let gpu = super::driver::DriverGpu::with_options(ordinal, kernels::SOURCES, &options)?;
        Ok(Cuda::new(Device::new(Arc::new(gpu))))
    }

    /// The backend on the CPU emulator of the kernels (tests: everything above the device
    /// seam runs as it would on a GPU).
    pub fn emulated() -> Result<Cuda> {
        Ok(Cuda::new(super::emu::emu_device_for_tests(
            kernels::SOURCES,
        )?))
    }

    /// This backend with `ranks` ranks (processes) sharing its device, at least 1: resident
    /// data then fits in a `1/ranks` share of what one rank alone could keep.
    pub fn shared_by(self, ranks: usize) -> Cuda {
        Cuda {
            shared_by: ranks.max(1),
            ..self
        }
    }

    /// The device.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// `r`'s value, or the end of the process naming `what` (see [`device_failed`]).
    fn ok<T>(&self, what: &str, r: Result<T>) -> T {
        r.unwrap_or_else(|e| device_failed(what, &self.device, e))
    }

    fn weights(&self, w: EdgeWeights) -> DevWeights {
        self.ok("edge weights", DevWeights::upload(&self.device, w))
    }

    /// Room in the journal for a batch's `rows` losses of `kind`, and their sum to be read
    /// when the training loop wants it (see [`LossSum`]: reading waits for the device).
    fn loss_later(&self, rows: usize, kind: LossKind) -> (DevPtr, LossSum) {
        let (ptr, entry) = self.ok("reserving the loss", self.losses.reserve(rows, kind));
        let device = self.device.clone();
        let sum = LossSum::pending(move || {
            entry
                .sum()
                .unwrap_or_else(|e| device_failed("reading the loss", &device, e))
        });
        (ptr, sum)
    }

    /// `mask`'s per-row seeds for rows keyed by `keys` (hashed on the host: one hash per row),
    /// on the device.
    fn seeds(&self, mask: &DropoutMask, keys: &[u64]) -> DevRowSeeds {
        self.ok(
            "dropout seeds",
            DevRowSeeds::from_mask(&self.device, mask, keys),
        )
    }
}

impl Backend for Cuda {
    type Mat = DevMat;
    type View<'a> = DevView<'a>;
    type ViewMut<'a> = DevViewMut<'a>;
    type Buffer = DevVec<f32>;
    type Graph = DevGraph;
    type Transpose = DevTranspose;
    type Saved = DevSaved;
    type Kept = DevKept;
    type Sparse = DevSparse;

    const IS_HOST: bool = false;

    fn describe(&self) -> String {
        format!("CUDA on {}", self.device.gpu.describe())
    }

    fn is_emulated(&self) -> bool {
        self.device.gpu.is_emulated()
    }

    fn fits(&self, bytes: usize) -> bool {
        match self.device.gpu.total_memory() {
            // Resident data may take half the device: the rest is the step's working memory.
            // Ranks sharing the device split that half.
            Some(total) => self.device.memory.current() + bytes <= total / 2 / self.shared_by,
            None => true,
        }
    }

    fn peak_memory(&self) -> Option<usize> {
        Some(self.device.memory.peak())
    }

    fn blocked_seconds(&self) -> Option<f64> {
        Some(self.device.gpu.blocked_seconds())
    }

    fn device_calls(&self) -> Option<DeviceCalls> {
        Some(self.device.calls.snapshot())
    }

    fn transfers(&self) -> Option<(u64, u64)> {
        let t = &self.device.transfers;
        Some((t.to_device(), t.to_host()))
    }

    fn graph(&self, block: Block) -> DevGraph {
        self.ok("uploading a block", DevGraph::new(&self.device, block))
    }

    fn transpose_of(&self, t: BlockTranspose) -> DevTranspose {
        self.ok(
            "uploading a block's transpose",
            DevTranspose::uploaded(&self.device, &t),
        )
    }

    fn block<'g>(&self, graph: &'g DevGraph) -> &'g Block {
        graph.block()
    }

    fn graph_of<'a>(&self, block: &'a Block, slot: &'a OnceLock<DevGraph>) -> &'a DevGraph {
        slot.get_or_init(|| self.graph(block.clone()))
    }

    fn zeros(&self, rows: usize, cols: usize) -> DevMat {
        self.ok("allocating", DevMat::zeros(&self.device, rows, cols))
    }

    fn upload(&self, x: ArrayView2<f32>) -> DevMat {
        let x = crate::backend::cpu::standard(x);
        let (rows, cols) = x.dim();
        let values = x.as_slice().expect("standard layout");
        self.ok(
            "uploading a matrix",
            DevMat::upload(&self.device, rows, cols, values),
        )
    }

    fn download(&self, x: DevView<'_>) -> Array2<f32> {
        let values = self.ok("downloading a matrix", x.download());
        Array2::from_shape_vec(x.dim(), values).expect("one value per element")
    }

    fn host_view<'a>(&self, x: Self::View<'a>) -> CowArray<'a, f32, Ix2> {
        CowArray::from(self.download(x))
    }

    fn download_owned(&self, x: DevMat) -> Array2<f32> {
        self.download(x.view())
    }

    fn view<'a>(&self, x: &'a DevMat) -> DevView<'a> {
        x.view()
    }

    fn view_mut<'a>(&self, x: &'a mut DevMat) -> DevViewMut<'a> {
        x.view_mut()
    }

    fn reborrow<'a>(&self, x: &'a mut DevViewMut<'_>) -> DevViewMut<'a> {
        x.reborrow()
    }

    fn shorten<'b, 'a: 'b>(&self, x: Self::View<'a>) -> Self::View<'b> {
        x
    }

    fn as_view<'a>(&self, x: &'a DevViewMut<'_>) -> DevView<'a> {
        x.view()
    }

    fn dim(&self, x: DevView<'_>) -> (usize, usize) {
        x.dim()
    }

    fn dim_mut(&self, x: &DevViewMut<'_>) -> (usize, usize) {
        x.dim()
    }

    fn mat_dim(&self, x: &DevMat) -> (usize, usize) {
        (x.rows(), x.cols())
    }

    fn rows<'a>(&self, x: Self::View<'a>, range: std::ops::Range<usize>) -> Self::View<'a> {
        x.row_range(range)
    }

    fn rows_mut<'a>(
        &self,
        x: Self::ViewMut<'a>,
        range: std::ops::Range<usize>,
    ) -> Self::ViewMut<'a> {
        x.row_range(range)
    }

    fn to_owned(&self, x: DevView<'_>) -> DevMat {
        self.ok("copying a matrix", x.to_owned())
    }

    fn pad_rows(&self, x: DevMat, rows: usize) -> DevMat {
        if x.rows() == rows {
            return x;
        }
        self.ok("padding rows", elementwise::pad_rows(x.view(), rows))
    }

    fn concat_rows(&self, a: DevView<'_>, b: DevView<'_>) -> DevMat {
        self.ok("concatenating rows", elementwise::concat_rows(a, b))
    }

    fn gather_rows(&self, x: DevView<'_>, idx: &[u32]) -> DevMat {
        let idx = self.ok("row indices", DevVec::upload(&self.device, idx));
        self.ok("gathering rows", gather::gather_rows(x, &idx))
    }

    fn select_rows(&self, x: DevView<'_>, idx: &[usize]) -> DevMat {
        let idx = self.ok("row indices", gather::upload_indices(&self.device, idx));
        self.ok("selecting rows", gather::gather_rows(x, &idx))
    }

    fn scatter_rows(&self, x: DevView<'_>, idx: &[usize], rows: usize) -> DevMat {
        let idx = self.ok("row indices", gather::upload_indices(&self.device, idx));
        self.ok("scattering rows", gather::scatter_rows(x, &idx, rows))
    }

    fn copy_rows(&self, dst: DevViewMut<'_>, dst_idx: &[u32], x: DevView<'_>, src_idx: &[u32]) {
        self.ok("copying rows", gather::copy_rows(dst, dst_idx, x, src_idx))
    }

    fn scatter_add_rows(&self, dst: DevViewMut<'_>, idx: &[u32], x: DevView<'_>) {
        self.ok("scatter-adding rows", gather::scatter_add_rows(dst, idx, x))
    }

    fn truncate_rows(&self, mut x: DevMat, rows: usize) -> DevMat {
        x.truncate_rows(rows);
        x
    }

    fn add_assign(&self, dst: DevViewMut<'_>, src: DevView<'_>) {
        self.ok("adding", elementwise::add_assign(dst, src))
    }

    fn add_scaled(&self, dst: DevViewMut<'_>, a: f32, src: DevView<'_>) {
        self.ok("axpy", elementwise::axpy(a, src, dst))
    }

    fn scale(&self, x: DevViewMut<'_>, a: f32) {
        self.ok("scaling", elementwise::scale(x, a))
    }

    fn add_bias(&self, z: DevViewMut<'_>, bias: DevView<'_>) {
        self.ok("adding a bias", epilogue::add_bias(z, bias))
    }

    fn add_column_sums(&self, grad: DevViewMut<'_>, dz: DevView<'_>) {
        self.ok("column sums", reduce::add_column_sums(grad, dz))
    }

    fn matmul(&self, a: DevView<'_>, b: DevView<'_>) -> DevMat {
        self.ok("matmul", blas::matmul(a, b))
    }

    fn matmul_nt(&self, a: DevView<'_>, b: DevView<'_>) -> DevMat {
        self.ok("matmul_nt", blas::matmul_nt(a, b))
    }

    fn add_matmul_tn(&self, a: DevView<'_>, b: DevView<'_>, c: DevViewMut<'_>) {
        self.ok("add_matmul_tn", blas::add_matmul_tn(a, b, c))
    }

    fn add_matmul_nt_rows(&self, a: DevView<'_>, b: DevView<'_>, c: DevViewMut<'_>) {
        self.ok("add_matmul_nt_rows", blas::add_matmul_nt_rows(a, b, c))
    }

    fn gemm_into(&self, alpha: f32, a: DevView<'_>, b: DevView<'_>, beta: f32, c: DevViewMut<'_>) {
        self.ok("gemm", blas::gemm_into(alpha, a, b, beta, c))
    }

    fn matmul_epilogue(
        &self,
        onto: Option<DevMat>,
        a: DevView<'_>,
        b: DevView<'_>,
        bias: Option<DevView<'_>>,
        relu: bool,
        dropout: Option<(&RowDropout, &DropoutMask)>,
    ) -> (DevMat, Option<DevSaved>, Option<DevKept>) {
        let seeds = dropout.map(|(rows, _)| {
            self.ok(
                "dropout seeds",
                DevRowSeeds::from_row_dropout(&self.device, rows),
            )
        });
        let (z, bits, kept) = self.ok(
            "a product with its epilogue",
            epilogue::matmul_onto_bias_relu(
                onto,
                a,
                b,
                bias,
                relu,
                seeds.as_ref().map(RowMask::Seeds),
            ),
        );
        (z, bits.map(DevSaved::Positive), kept)
    }

    fn aggregate(&self, g: &DevGraph, x: DevView<'_>, w: EdgeWeights) -> DevMat {
        let w = self.weights(w);
        self.ok("aggregation", aggregate::aggregate(g, x, &w))
    }

    fn aggregate_beside(&self, g: &DevGraph, x: DevView<'_>, w: EdgeWeights) -> DevMat {
        let w = self.weights(w);
        self.ok("aggregation", aggregate::aggregate_beside(g, x, &w))
    }

    fn aggregate_transpose(
        &self,
        g: &DevGraph,
        t: &DevTranspose,
        d: DevView<'_>,
        w: EdgeWeights,
    ) -> DevMat {
        let w = self.weights(w);
        let t = self.ok("a block's transpose", t.get(g));
        self.ok(
            "transposed aggregation",
            aggregate::aggregate_transpose(g, t, d, &w),
        )
    }

    fn aggregate_transpose_beside(
        &self,
        g: &DevGraph,
        t: &DevTranspose,
        d: DevView<'_>,
        w: EdgeWeights,
        kept: Option<&DevKept>,
    ) -> DevMat {
        let w = self.weights(w);
        let t = self.ok("a block's transpose", t.get(g));
        self.ok(
            "transposed aggregation",
            aggregate::aggregate_transpose_beside(g, t, d, &w, kept),
        )
    }

    fn node_logits(&self, wh: DevView<'_>, att: DevView<'_>, rows: usize) -> DevMat {
        self.ok("attention logits", gat::node_logits(wh, att, rows))
    }

    fn edge_softmax(&self, g: &DevGraph, el: DevView<'_>, er: DevView<'_>, slope: f32) -> DevMat {
        self.ok("edge softmax", gat::edge_softmax(g, el, er, slope))
    }

    fn attention_aggregate(&self, g: &DevGraph, alpha: DevView<'_>, wh: DevView<'_>) -> DevMat {
        self.ok(
            "attention aggregation",
            gat::attention_aggregate(g, alpha, wh),
        )
    }

    fn attention_backward(
        &self,
        a: &AttentionArgs<Cuda>,
        d_out: DevView<'_>,
    ) -> AttentionGrads<Cuda> {
        let t = self.ok("a block's transpose", a.transpose.get(a.graph));
        let g = self.ok(
            "attention backward",
            gat::attention_backward(
                &gat::AttentionInputs {
                    graph: a.graph,
                    transpose: t,
                    wh: a.wh,
                    el: a.el,
                    er: a.er,
                    alpha: a.alpha,
                    att_src: a.att_src,
                    att_dst: a.att_dst,
                    slope: a.slope,
                },
                d_out,
            ),
        );
        AttentionGrads {
            d_wh: g.d_wh,
            d_att_src: g.d_att_src,
            d_att_dst: g.d_att_dst,
        }
    }

    fn mean_heads(&self, x: DevView<'_>, heads: usize, f: usize) -> DevMat {
        self.ok("mean over heads", gat::mean_heads(x, heads, f))
    }

    fn spread_heads(&self, d: DevView<'_>, heads: usize, f: usize) -> DevMat {
        self.ok("spread over heads", gat::spread_heads(d, heads, f))
    }

    fn activation_forward(&self, act: Activation, x: DevViewMut<'_>) -> DevSaved {
        self.ok("activation", activation::forward_save(act, x))
    }

    fn activation_backward(&self, act: Activation, saved: &DevSaved, g: DevViewMut<'_>) {
        self.ok(
            "activation backward",
            activation::backward_saved(act, saved, g),
        )
    }

    fn activation_in_place(&self, act: Activation, x: DevViewMut<'_>) {
        self.ok("activation", activation::forward_in_place(act, x))
    }

    fn saved_is_bits(&self, saved: &DevSaved) -> bool {
        matches!(saved, DevSaved::Positive(_))
    }

    fn dropout_recorded(
        &self,
        mask: &DropoutMask,
        x: DevView<'_>,
        keys: &[u64],
    ) -> (DevMat, DevKept) {
        let seeds = self.seeds(mask, keys);
        self.ok(
            "dropout",
            dropout::apply_recorded(x, RowMask::Seeds(&seeds)),
        )
    }

    fn dropout_recorded_in_place(
        &self,
        mask: &DropoutMask,
        x: DevViewMut<'_>,
        keys: &[u64],
    ) -> DevKept {
        let seeds = self.seeds(mask, keys);
        self.ok(
            "dropout",
            dropout::apply_recorded_in_place(x, RowMask::Seeds(&seeds)),
        )
    }

    fn dropout_in_place(&self, mask: &DropoutMask, x: DevViewMut<'_>, keys: &[u64]) {
        let seeds = self.seeds(mask, keys);
        self.ok(
            "dropout",
            dropout::apply_in_place(x, RowMask::Seeds(&seeds)),
        )
    }

    fn kept_apply(&self, kept: &DevKept, x: DevViewMut<'_>) {
        self.ok("dropout backward", kept.apply_in_place(x))
    }

    fn kept_and_positive(
        &self,
        kept: &DevKept,
        cols: usize,
        positive: &DevSaved,
    ) -> Option<DevKept> {
        match positive {
            DevSaved::Positive(bits) => self.ok("combining bits", kept.and_positive(cols, bits)),
            DevSaved::Output(_) => None,
        }
    }

    fn layer_norm(
        &self,
        x: DevView<'_>,
        gain: DevView<'_>,
        bias: DevView<'_>,
        eps: f32,
    ) -> (DevMat, DevMat, DevMat) {
        self.ok("layer norm", norm::layer_norm(x, gain, bias, eps))
    }

    fn layer_norm_backward(
        &self,
        xhat: DevView<'_>,
        inv_std: DevView<'_>,
        gain: DevView<'_>,
        dy: DevView<'_>,
    ) -> (DevMat, DevMat, DevMat) {
        let cols = xhat.cols();
        let mut d_gain = self.zeros(1, cols);
        let mut d_bias = self.zeros(1, cols);
        let dx = self.ok(
            "layer norm backward",
            norm::layer_norm_backward(
                xhat,
                inv_std,
                gain,
                dy,
                d_gain.view_mut(),
                d_bias.view_mut(),
            ),
        );
        (dx, d_gain, d_bias)
    }

    fn cross_entropy(&self, logits: DevView<'_>, labels: &[i64]) -> (LossSum, DevMat) {
        let labels = self.ok("uploading labels", DevVec::upload(&self.device, labels));
        let (losses, sum) = self.loss_later(logits.rows(), LossKind::F32);
        let grad = self.ok(
            "cross-entropy",
            loss::cross_entropy_into(logits, &labels, 1.0, losses),
        );
        (sum, grad)
    }

    fn bce_with_logits(&self, logits: DevView<'_>, targets: ArrayView2<i64>) -> (LossSum, DevMat) {
        let t = self.ok("uploading targets", loss::upload_targets(logits, targets));
        let (losses, sum) = self.loss_later(logits.rows(), LossKind::F64);
        let grad = self.ok(
            "binary cross-entropy",
            loss::bce_with_logits_into(logits, &t, 1.0, losses),
        );
        (sum, grad)
    }

    fn buffer_from_host(&self, values: &[f32]) -> DevVec<f32> {
        self.ok("uploading a buffer", DevVec::upload(&self.device, values))
    }

    fn buffer_to_host(&self, buf: &DevVec<f32>) -> Vec<f32> {
        self.ok("downloading a buffer", buf.download())
    }

    fn buffer_len(&self, buf: &DevVec<f32>) -> usize {
        buf.len()
    }

    fn buffer_write(&self, buf: &mut DevVec<f32>, values: &[f32]) {
        self.ok("writing a buffer", buf.write(values))
    }

    fn buffer_zero(&self, buf: &mut DevVec<f32>) {
        let len = buf.len();
        self.ok(
            "zeroing a buffer",
            self.device
                .gpu
                .zero(buf.ptr(), len * std::mem::size_of::<f32>()),
        )
    }

    fn buffer_view<'a>(
        &self,
        buf: &'a DevVec<f32>,
        offset: usize,
        rows: usize,
        cols: usize,
    ) -> DevView<'a> {
        DevView::of(buf.buf(), offset, rows, cols)
    }

    fn buffer_view_mut<'a>(
        &self,
        buf: &'a mut DevVec<f32>,
        offset: usize,
        rows: usize,
        cols: usize,
    ) -> DevViewMut<'a> {
        DevViewMut::of(buf.buf_mut(), offset, rows, cols)
    }

    fn with_host_buffer(&self, buf: &mut DevVec<f32>, f: &mut dyn FnMut(&mut [f32])) {
        let mut host = self.buffer_to_host(buf);
        f(&mut host);
        self.buffer_write(buf, &host);
    }

    fn device_span(&self, x: DevView<'_>) -> Option<DeviceSpan> {
        // MPI reads the memory outside the stream: the kernels that write it must be done.
        self.ok("synchronizing", self.device.gpu.synchronize());
        Some(DeviceSpan {
            addr: x.ptr(),
            len: x.rows() * x.cols(),
        })
    }

    fn device_span_mut(&self, x: DevViewMut<'_>) -> Option<DeviceSpan> {
        // Work queued before may still read or write it: MPI must not overwrite it under them.
        self.ok("synchronizing", self.device.gpu.synchronize());
        Some(DeviceSpan {
            addr: x.ptr(),
            len: x.rows() * x.cols(),
        })
    }

    fn adam_step(
        &self,
        values: &mut DevVec<f32>,
        grads: &DevVec<f32>,
        m: &mut DevVec<f32>,
        v: &mut DevVec<f32>,
        step: AdamStep,
    ) {
        let n = values.len();
        let values = DevViewMut::of(values.buf_mut(), 0, 1, n);
        let grads = DevView::of(grads.buf(), 0, 1, n);
        let m = DevViewMut::of(m.buf_mut(), 0, 1, n);
        let v = DevViewMut::of(v.buf_mut(), 0, 1, n);
        self.ok("Adam", adam::adam_step(values, grads, m, v, step))
    }

    fn sparse_from_dense(&self, x: DevView<'_>) -> Option<DevSparse> {
        self.ok("sparse rows", DevSparse::from_dense(x))
    }

    fn sparse_from_host(&self, x: ArrayView2<f32>) -> Option<DevSparse> {
        self.ok("sparse rows", DevSparse::from_host(&self.device, x))
    }

    fn sparse_from_csr(&self, x: CsrMatrix, transpose: Option<BlockTranspose>) -> DevSparse {
        self.ok(
            "sparse rows",
            DevSparse::from_csr(&self.device, x, transpose),
        )
    }

    fn sparse_dim(&self, x: &DevSparse) -> (usize, usize) {
        x.dim()
    }

    fn sparse_to_dense(&self, x: &DevSparse) -> DevMat {
        self.ok("sparse to dense", x.to_dense())
    }

    fn sparse_first_rows(&self, x: &DevSparse, rows: usize) -> DevSparse {
        self.ok("sparse rows", x.first_rows(rows))
    }

    fn sparse_dropout_in_place(&self, mask: &DropoutMask, x: &mut DevSparse, keys: &[u64]) {
        let seeds = self.seeds(mask, keys);
        self.ok("sparse dropout", x.dropout_in_place(RowMask::Seeds(&seeds)))
    }

    fn spmm(&self, x: &DevSparse, rows: usize, w: DevView<'_>) -> DevMat {
        self.ok("sparse product", x.times(rows, w))
    }

    fn spmm_into(
        &self,
        x: &DevSparse,
        rows: usize,
        w: DevView<'_>,
        out: DevViewMut<'_>,
        accumulate: bool,
    ) {
        self.ok("sparse product", x.times_into(rows, w, out, accumulate))
    }

    fn add_spmm_tn(&self, x: &DevSparse, rows: usize, d: DevView<'_>, c: DevViewMut<'_>) {
        self.ok(
            "transposed sparse product",
            x.add_transposed_times(rows, d, c),
        )
    }
}
