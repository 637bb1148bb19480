//! Where the numbers are computed: the [`Backend`] trait, the seam between the model (`nn`,
//! written once) and the hardware.
//!
//! * [`cpu`]: the CPU backend, [`Cpu`] — ndarray + rayon, the hand-tuned GEMM with fused
//!   epilogues, aggregation, dropout, losses. It is the reference every other backend is
//!   compared with.
//! * [`cuda`]: the CUDA backend — cuBLAS and the kernels of `cuda/*.cu`.
//!
//! As in candle (`BackendStorage` under `Storage`) and burn (`Backend` with associated tensor
//! types), a backend names its storage types and implements every operation a layer needs; a
//! layer, the model, Adam and the loss are generic over `B: Backend` and never see where the
//! numbers live (ARCHITECTURE invariant 7: only a backend touches device memory).
//!
//! The operations are at the granularity of the CPU's kernels, fused ones included
//! ([`Backend::matmul_epilogue`]: product, bias, ReLU and the next layer's dropout in one pass),
//! so the CPU backend is exactly today's kernels and a GPU backend can fuse the same way.
//! Descriptions that live on the host whatever the backend — dropout masks and their row keys,
//! GCN's normalisation factors, edge weights, activations — are shared types ([`DropoutMask`],
//! [`GcnNorm`], [`EdgeWeights`], [`Activation`], [`RowDropout`]); the CPU defines them because
//! it is the reference, and a device backend uploads what it needs of them.
//!
//! Ops panic on shape mismatches (caller bugs, like ndarray's); device errors (out of memory, a
//! failed launch) are reported by the device backend as a panic with the device's message,
//! which under MPI aborts the job naming the rank (`comm::fail_job`).

pub mod cpu;
pub mod cuda;
pub mod input_rows;
pub mod loss_sum;

use ndarray::{Array2, ArrayView2, CowArray, Ix2};
use std::fmt::Debug;
use std::ops::Range;
use std::sync::OnceLock;

pub use cpu::activation::Activation;
pub use cpu::aggregate::{BlockTranspose, EdgeWeights, GcnNorm};
pub use cpu::dropout::DropoutMask;
pub use cpu::gemm::RowDropout;
pub use cpu::sparse::CsrMatrix;
pub use cpu::Cpu;
pub use cuda::calls::DeviceCalls;
pub use cuda::Cuda;
pub use loss_sum::LossSum;

use crate::sample::Block;

/// Adam's per-step constants (bias corrections folded in, PyTorch's convention).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamStep {
    pub beta1: f32,
    pub beta2: f32,
    pub lr: f32,
    pub weight_decay: f32,
    pub eps: f32,
    /// AdamW: decay the weights directly instead of adding `wd·p` to the gradient.
    pub decoupled: bool,
    /// `lr / (1 − β1^t)`.
    pub step_size: f32,
    /// `sqrt(1 − β2^t)`.
    pub bc2_sqrt: f32,
}

/// What GAT's backward needs, by reference.
pub struct AttentionArgs<'a, B: Backend> {
    pub graph: &'a B::Graph,
    pub transpose: &'a B::Transpose,
    /// `h·W`, `num_src × heads·f`.
    pub wh: B::View<'a>,
    /// Source logits, `num_src × heads`.
    pub el: B::View<'a>,
    /// Destination logits, `num_dst × heads`.
    pub er: B::View<'a>,
    /// Attention per edge, `edges × heads`.
    pub alpha: B::View<'a>,
    /// `heads × f`.
    pub att_src: B::View<'a>,
    pub att_dst: B::View<'a>,
    pub slope: f32,
}

/// The gradients GAT's attention backward returns.
pub struct AttentionGrads<B: Backend> {
    /// `num_src × heads·f`.
    pub d_wh: B::Mat,
    /// `heads × f`.
    pub d_att_src: B::Mat,
    pub d_att_dst: B::Mat,
}

/// Device memory as an address and a length in `f32`s, for a CUDA-aware MPI that reads and
/// writes device pointers in place of staged host copies ([`Backend::device_span`]). Rust never
/// dereferences it: only MPI does, inside `comm`'s device-pointer collectives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceSpan {
    pub addr: u64,
    pub len: usize,
}

/// A matrix borrowed or owned: ndarray's `CowArray` for any backend.
pub enum CowMat<'a, B: Backend> {
    Borrowed(B::View<'a>),
    Owned(B::Mat),
}

impl<'a, B: Backend> CowMat<'a, B> {
    /// Borrow it.
    pub fn view<'s>(&'s self, be: &B) -> B::View<'s>
    where
        'a: 's,
    {
        match self {
            CowMat::Borrowed(v) => be.shorten(*v),
            CowMat::Owned(m) => be.view(m),
        }
    }

    /// Own it (a copy only when borrowed).
    pub fn into_owned(self, be: &B) -> B::Mat {
        match self {
            CowMat::Borrowed(v) => be.to_owned(v),
            CowMat::Owned(m) => m,
        }
    }

    /// Owned, for a forward pass's cache, where a backward pass will read it (`keep`); else
    /// dropped, and a borrowed matrix is not copied.
    pub fn kept(self, be: &B, keep: bool) -> Option<B::Mat> {
        keep.then(|| self.into_owned(be))
    }
}

/// A backend: storage types and every operation of a layer, the model, the loss and Adam.
///
/// Matrices are row-major `f32`. `View`s borrow a matrix or a range of its rows, or a parameter
/// inside the flat parameter [`Backend::Buffer`]; `ViewMut`s borrow mutably.
pub trait Backend: Clone + Debug + Send + Sync + 'static {
    /// An owned matrix.
    type Mat: Debug + Send + Sync;
    /// A borrowed matrix (or rows of one).
    type View<'a>: Copy + Debug;
    /// A mutably borrowed matrix (or rows of one).
    type ViewMut<'a>: Debug;
    /// A flat `f32` buffer: parameters, gradients, optimizer moments.
    type Buffer: Debug + Send + Sync;
    /// A block of the mini-batch as this backend reads it (built from a host [`Block`]).
    type Graph: Debug + Send + Sync;
    /// The block's edges grouped by source, built on first use (transposed aggregations).
    type Transpose: Debug + Default + Send + Sync;
    /// What an activation's backward needs: ReLU's sign bits, or ELU's output.
    type Saved: Debug + Send + Sync;
    /// Which elements a dropout kept (one bit per element, rows padded to whole words).
    type Kept: Debug + Send + Sync;
    /// Sparse input rows (mostly-zero features); backends without a sparse path use an
    /// uninhabited type and never produce one.
    type Sparse: Debug + Send + Sync;

    /// True when the backend's matrices are host memory (moving data in or out is free).
    const IS_HOST: bool;

    /// What this backend computes on, for the log.
    fn describe(&self) -> String;
    /// Whether the device is emulated on the CPU (tests), so that timing it describes no
    /// hardware.
    fn is_emulated(&self) -> bool {
        false
    }
    /// Whether `bytes` more may be kept resident (whole-graph features on a device), leaving
    /// room for a step's work.
    fn fits(&self, bytes: usize) -> bool;
    /// The most device memory in use at once so far, in bytes (`None` on the host, where the
    /// process's peak RSS says it).
    fn peak_memory(&self) -> Option<usize>;
    /// Bytes copied host → device and device → host so far (`None` on the host, which copies
    /// nothing).
    fn transfers(&self) -> Option<(u64, u64)>;
    /// Calls into the device so far, by kind (`None` on the host, which makes none).
    fn device_calls(&self) -> Option<DeviceCalls> {
        None
    }
    /// Seconds the host has spent blocked on the device so far (`None` on the host): what
    /// tells a device-bound step (most of its host time is this) from a host-bound one.
    fn blocked_seconds(&self) -> Option<f64> {
        None
    }

    // ---- graphs ---------------------------------------------------------------------------

    /// `block` on this backend (the CPU keeps it as it is; a device uploads it).
    fn graph(&self, block: Block) -> Self::Graph;
    /// The host block `graph` was built from (its shape, ids and degrees).
    fn block<'g>(&self, graph: &'g Self::Graph) -> &'g Block;
    /// A transpose of a block built ahead on the host (by a prefetch worker): the aggregations
    /// over that block's graph that read its transpose take this one instead of building it.
    fn transpose_of(&self, t: BlockTranspose) -> Self::Transpose;
    /// A long-lived `block` (full-graph training and evaluation) as a graph of this backend,
    /// built into `slot` on first use; the CPU reads the block itself.
    fn graph_of<'a>(&self, block: &'a Block, slot: &'a OnceLock<Self::Graph>) -> &'a Self::Graph;

    // ---- matrices -------------------------------------------------------------------------

    /// `rows × cols` zeros.
    fn zeros(&self, rows: usize, cols: usize) -> Self::Mat;
    /// A copy of a host matrix.
    fn upload(&self, x: ArrayView2<f32>) -> Self::Mat;
    /// A host copy.
    fn download(&self, x: Self::View<'_>) -> Array2<f32>;
    /// Host matrix in, backend matrix out, without a copy where the backend is the host.
    fn upload_owned(&self, x: Array2<f32>) -> Self::Mat {
        self.upload(x.view())
    }
    /// The values on the host: borrowed where the backend is the host, else a copy.
    fn host_view<'a>(&self, x: Self::View<'a>) -> CowArray<'a, f32, Ix2>;
    /// Backend matrix in, host matrix out, without a copy where the backend is the host.
    fn download_owned(&self, x: Self::Mat) -> Array2<f32>;
    fn view<'a>(&self, x: &'a Self::Mat) -> Self::View<'a>;
    fn view_mut<'a>(&self, x: &'a mut Self::Mat) -> Self::ViewMut<'a>;
    /// The same elements, borrowed again for a shorter time.
    fn reborrow<'a>(&self, x: &'a mut Self::ViewMut<'_>) -> Self::ViewMut<'a>;
    /// A view for a shorter lifetime (views are covariant, but the compiler cannot know that of
    /// an associated type).
    fn shorten<'b, 'a: 'b>(&self, x: Self::View<'a>) -> Self::View<'b>;
    /// Read access to a mutable view.
    fn as_view<'a>(&self, x: &'a Self::ViewMut<'_>) -> Self::View<'a>;
    /// `(rows, cols)`.
    fn dim(&self, x: Self::View<'_>) -> (usize, usize);
    fn dim_mut(&self, x: &Self::ViewMut<'_>) -> (usize, usize);
    fn mat_dim(&self, x: &Self::Mat) -> (usize, usize);
    /// Rows `range`.
    fn rows<'a>(&self, x: Self::View<'a>, range: Range<usize>) -> Self::View<'a>;
    fn rows_mut<'a>(&self, x: Self::ViewMut<'a>, range: Range<usize>) -> Self::ViewMut<'a>;
    /// An owned copy.
    fn to_owned(&self, x: Self::View<'_>) -> Self::Mat;
    /// `x` with `rows - x.rows` zero rows appended.
    fn pad_rows(&self, x: Self::Mat, rows: usize) -> Self::Mat;
    /// `[a; b]`: the rows of `a` then those of `b`.
    fn concat_rows(&self, a: Self::View<'_>, b: Self::View<'_>) -> Self::Mat;
    /// The rows `idx` of `x`, in order (an input-row gather).
    fn gather_rows(&self, x: Self::View<'_>, idx: &[u32]) -> Self::Mat;
    /// The rows `idx` of `x`, in order.
    fn select_rows(&self, x: Self::View<'_>, idx: &[usize]) -> Self::Mat;
    /// `rows × cols` zeros with row `idx[i]` set to row `i` of `x` (`idx` distinct).
    fn scatter_rows(&self, x: Self::View<'_>, idx: &[usize], rows: usize) -> Self::Mat;
    /// `dst[dst_idx[i]] = x[src_idx[i]]` for every `i` (`dst_idx` distinct); the other rows of
    /// `dst` keep their values. A gather and a scatter in one pass, with no matrix between.
    fn copy_rows(
        &self,
        dst: Self::ViewMut<'_>,
        dst_idx: &[u32],
        x: Self::View<'_>,
        src_idx: &[u32],
    );
    /// `dst[idx[i]] += x[i]` for every row `i` of `x`; rows with the same target add up in the
    /// order of `i`, whatever the threads (a fixed order, so exchanged gradients sum alike on
    /// every backend and run). Where rows that came through an exchange land.
    fn scatter_add_rows(&self, dst: Self::ViewMut<'_>, idx: &[u32], x: Self::View<'_>);
    /// The first `rows` rows of `x` (no copy: the allocation is kept).
    fn truncate_rows(&self, x: Self::Mat, rows: usize) -> Self::Mat;

    // ---- element-wise ---------------------------------------------------------------------

    /// `dst += src`.
    fn add_assign(&self, dst: Self::ViewMut<'_>, src: Self::View<'_>);
    /// `dst += a · src`.
    fn add_scaled(&self, dst: Self::ViewMut<'_>, a: f32, src: Self::View<'_>);
    /// `x *= a`.
    fn scale(&self, x: Self::ViewMut<'_>, a: f32);
    /// `z[i, :] += bias` (`bias` is `1 × cols`).
    fn add_bias(&self, z: Self::ViewMut<'_>, bias: Self::View<'_>);
    /// `grad += Σ_rows dz` (`grad` is `1 × cols`): a bias gradient.
    fn add_column_sums(&self, grad: Self::ViewMut<'_>, dz: Self::View<'_>);

    // ---- products -------------------------------------------------------------------------

    /// `a · b`.
    fn matmul(&self, a: Self::View<'_>, b: Self::View<'_>) -> Self::Mat;
    /// `a · bᵀ`.
    fn matmul_nt(&self, a: Self::View<'_>, b: Self::View<'_>) -> Self::Mat;
    /// `c += aᵀ · b` (weight gradients).
    fn add_matmul_tn(&self, a: Self::View<'_>, b: Self::View<'_>, c: Self::ViewMut<'_>);
    /// [`Backend::add_matmul_tn`], while `t` (the transpose of `g`) is built if it was not:
    /// the CPU overlaps its serial build with the product.
    fn add_matmul_tn_building_transpose(
        &self,
        a: Self::View<'_>,
        b: Self::View<'_>,
        c: Self::ViewMut<'_>,
        _g: &Self::Graph,
        _t: &Self::Transpose,
    ) {
        self.add_matmul_tn(a, b, c)
    }
    /// `c[..a.rows] += a · bᵀ`.
    fn add_matmul_nt_rows(&self, a: Self::View<'_>, b: Self::View<'_>, c: Self::ViewMut<'_>);
    /// `c = alpha · a · b + beta · c`.
    fn gemm_into(
        &self,
        alpha: f32,
        a: Self::View<'_>,
        b: Self::View<'_>,
        beta: f32,
        c: Self::ViewMut<'_>,
    );
    /// `[onto +] a · b`, then `+ bias`, then ReLU (recording its signs) when `relu`, then —
    /// only with `relu` — the next layer's input dropout (recording the kept elements; `mask`
    /// is the mask `dropout` came from). Returns the output, the ReLU's saved signs when
    /// applied, and the kept bits when the dropout was applied.
    #[allow(clippy::too_many_arguments)]
    fn matmul_epilogue(
        &self,
        onto: Option<Self::Mat>,
        a: Self::View<'_>,
        b: Self::View<'_>,
        bias: Option<Self::View<'_>>,
        relu: bool,
        dropout: Option<(&RowDropout, &DropoutMask)>,
    ) -> (Self::Mat, Option<Self::Saved>, Option<Self::Kept>);

    /// [`Backend::matmul_epilogue`] of `a · w`, where `w = [w_top; w_bottom]` (the two
    /// matrices stacked in memory, e.g. SAGE's `[W_self; W_neigh]`). A backend may split the
    /// product at the stack boundary: the CPU computes `a[:, ..k]·w_top` skipping the exact
    /// zeros of that half (a ReLU's and a dropout's, below another layer) and adds the rest on,
    /// the single product within rounding.
    #[allow(clippy::too_many_arguments)]
    fn matmul_epilogue_stacked(
        &self,
        a: Self::View<'_>,
        _w_top: Self::View<'_>,
        _w_bottom: Self::View<'_>,
        w: Self::View<'_>,
        bias: Option<Self::View<'_>>,
        relu: bool,
        dropout: Option<(&RowDropout, &DropoutMask)>,
    ) -> (Self::Mat, Option<Self::Saved>, Option<Self::Kept>) {
        self.matmul_epilogue(None, a, w, bias, relu, dropout)
    }
    /// `a · bᵀ` where `a` is mostly exact zeros (a gradient below a ReLU and a dropout); the
    /// values of [`Backend::matmul_nt`] (a backend may skip the zeros).
    fn matmul_nt_sparse_left(&self, a: Self::View<'_>, b: Self::View<'_>) -> Self::Mat {
        self.matmul_nt(a, b)
    }

    // ---- graph aggregation ----------------------------------------------------------------

    /// `out[i] = Σ_{u → i} w · x[u]` over the block's edges (`x` has `num_src` rows).
    fn aggregate(&self, g: &Self::Graph, x: Self::View<'_>, w: EdgeWeights) -> Self::Mat;
    /// `[x[i] | aggregate(x)[i]]` per destination (`2·cols` columns).
    fn aggregate_beside(&self, g: &Self::Graph, x: Self::View<'_>, w: EdgeWeights) -> Self::Mat;
    /// The transpose of [`Backend::aggregate`]: `out[u] = Σ_{u → i} w · d[i]` (`num_src` rows).
    fn aggregate_transpose(
        &self,
        g: &Self::Graph,
        t: &Self::Transpose,
        d: Self::View<'_>,
        w: EdgeWeights,
    ) -> Self::Mat;
    /// The transpose of [`Backend::aggregate_beside`] from `[d_self | d_agg]`, each row then
    /// masked by `kept` when given.
    fn aggregate_transpose_beside(
        &self,
        g: &Self::Graph,
        t: &Self::Transpose,
        d: Self::View<'_>,
        w: EdgeWeights,
        kept: Option<&Self::Kept>,
    ) -> Self::Mat;

    // ---- GAT ------------------------------------------------------------------------------

    /// Per row and head, `Σ_f wh[r, h·f + j] · att[h, j]` for the first `rows` rows.
    fn node_logits(&self, wh: Self::View<'_>, att: Self::View<'_>, rows: usize) -> Self::Mat;
    /// Attention per edge and head: softmax over each destination's edges of
    /// `LeakyReLU(el[u] + er[i])`.
    fn edge_softmax(
        &self,
        g: &Self::Graph,
        el: Self::View<'_>,
        er: Self::View<'_>,
        slope: f32,
    ) -> Self::Mat;
    /// `out[i, h] = Σ_{u → i} alpha[e, h] · wh[u, h]` (heads concatenated).
    fn attention_aggregate(
        &self,
        g: &Self::Graph,
        alpha: Self::View<'_>,
        wh: Self::View<'_>,
    ) -> Self::Mat;
    /// The backward of node logits, edge softmax and attention aggregation.
    fn attention_backward(
        &self,
        a: &AttentionArgs<Self>,
        d_out: Self::View<'_>,
    ) -> AttentionGrads<Self>;
    /// `out[v] = mean_h x[v, h]` over `heads` heads of `f` columns.
    fn mean_heads(&self, x: Self::View<'_>, heads: usize, f: usize) -> Self::Mat;
    /// The backward of [`Backend::mean_heads`]: `out[v, h] = d[v] / heads`.
    fn spread_heads(&self, d: Self::View<'_>, heads: usize, f: usize) -> Self::Mat;

    // ---- activations and dropout ----------------------------------------------------------

    /// Apply `act` in place, keeping what its backward needs.
    fn activation_forward(&self, act: Activation, x: Self::ViewMut<'_>) -> Self::Saved;
    /// `g ← g ⊙ act'(x)` from what the forward kept.
    fn activation_backward(&self, act: Activation, saved: &Self::Saved, g: Self::ViewMut<'_>);
    /// Apply `act` in place without keeping anything (evaluation, MLP heads).
    fn activation_in_place(&self, act: Activation, x: Self::ViewMut<'_>);
    /// Whether `saved` is one sign bit per element (ReLU, LeakyReLU), which a dropout's kept
    /// bits can absorb ([`Backend::kept_and_positive`]).
    fn saved_is_bits(&self, saved: &Self::Saved) -> bool;
    /// A masked copy of `x` (row `r` keyed by `keys[r]`) and the kept elements.
    fn dropout_recorded(
        &self,
        mask: &DropoutMask,
        x: Self::View<'_>,
        keys: &[u64],
    ) -> (Self::Mat, Self::Kept);
    /// [`Backend::dropout_recorded`] in place.
    fn dropout_recorded_in_place(
        &self,
        mask: &DropoutMask,
        x: Self::ViewMut<'_>,
        keys: &[u64],
    ) -> Self::Kept;
    /// `x ← mask(x)` without recording (a gradient, when only keys were kept).
    fn dropout_in_place(&self, mask: &DropoutMask, x: Self::ViewMut<'_>, keys: &[u64]);
    /// `x ← kept(x)`: the recorded mask applied again (a dropout's backward).
    fn kept_apply(&self, kept: &Self::Kept, x: Self::ViewMut<'_>);
    /// `kept` AND the ReLU signs `positive` of the layer below (rows of `cols` elements, a
    /// multiple of 64), so that one pass applies both backwards; `None` when the layouts do not
    /// line up.
    fn kept_and_positive(
        &self,
        kept: &Self::Kept,
        cols: usize,
        positive: &Self::Saved,
    ) -> Option<Self::Kept>;

    // ---- layer norm -----------------------------------------------------------------------

    /// Normalise each row: `y = (x − mean)/sqrt(var + eps) · gain + bias`; returns `y`, the
    /// normalised input `xhat` and `1/std` per row (`rows × 1`).
    fn layer_norm(
        &self,
        x: Self::View<'_>,
        gain: Self::View<'_>,
        bias: Self::View<'_>,
        eps: f32,
    ) -> (Self::Mat, Self::Mat, Self::Mat);
    /// The backward of [`Backend::layer_norm`]: `dx`, and the gain and bias gradients
    /// (`1 × cols` each: `Σ_rows dy·xhat` and `Σ_rows dy`).
    fn layer_norm_backward(
        &self,
        xhat: Self::View<'_>,
        inv_std: Self::View<'_>,
        gain: Self::View<'_>,
        dy: Self::View<'_>,
    ) -> (Self::Mat, Self::Mat, Self::Mat);

    // ---- losses ---------------------------------------------------------------------------

    /// Softmax cross-entropy per row against class ids: the summed loss (on the host, or to
    /// be read from the device when wanted: [`LossSum`]) and d(summed loss)/d logits.
    fn cross_entropy(&self, logits: Self::View<'_>, labels: &[i64]) -> (LossSum, Self::Mat);
    /// Binary cross-entropy with logits against 0/1 targets (`rows × cols`).
    fn bce_with_logits(
        &self,
        logits: Self::View<'_>,
        targets: ArrayView2<i64>,
    ) -> (LossSum, Self::Mat);

    // ---- flat buffers and Adam ------------------------------------------------------------

    fn buffer_from_host(&self, values: &[f32]) -> Self::Buffer;
    fn buffer_to_host(&self, buf: &Self::Buffer) -> Vec<f32>;
    fn buffer_len(&self, buf: &Self::Buffer) -> usize;
    /// Overwrite with host values (same length).
    fn buffer_write(&self, buf: &mut Self::Buffer, values: &[f32]);
    fn buffer_zero(&self, buf: &mut Self::Buffer);
    /// `rows × cols` elements from `offset`, as a matrix view.
    fn buffer_view<'a>(
        &self,
        buf: &'a Self::Buffer,
        offset: usize,
        rows: usize,
        cols: usize,
    ) -> Self::View<'a>;
    fn buffer_view_mut<'a>(
        &self,
        buf: &'a mut Self::Buffer,
        offset: usize,
        rows: usize,
        cols: usize,
    ) -> Self::ViewMut<'a>;
    /// Run `f` on the buffer's values on the host, writing back what it changed (gradient
    /// allreduce through MPI; free where the backend is the host).
    fn with_host_buffer(&self, buf: &mut Self::Buffer, f: &mut dyn FnMut(&mut [f32]));
    /// Where `x`'s elements lie in device memory (contiguous, row-major), once the work queued
    /// so far has finished, for a CUDA-aware MPI to read or write them without a host copy;
    /// `None` where the backend's memory is the host's (MPI reads host slices then).
    fn device_span(&self, _x: Self::View<'_>) -> Option<DeviceSpan> {
        None
    }
    /// [`Backend::device_span`] of memory MPI will write.
    fn device_span_mut(&self, _x: Self::ViewMut<'_>) -> Option<DeviceSpan> {
        None
    }
    /// One Adam update of `values` from `grads` with moments `m`, `v`.
    fn adam_step(
        &self,
        values: &mut Self::Buffer,
        grads: &Self::Buffer,
        m: &mut Self::Buffer,
        v: &mut Self::Buffer,
        step: AdamStep,
    );

    // ---- sparse input rows ----------------------------------------------------------------

    /// `x` as sparse rows when it is mostly zeros and this backend has a sparse path.
    fn sparse_from_dense(&self, x: Self::View<'_>) -> Option<Self::Sparse>;
    /// [`Backend::sparse_from_dense`] of host rows, made without their dense form on the
    /// backend (a full-batch input: 424 MB dense on Facebook, under 1 MB sparse).
    fn sparse_from_host(&self, x: ArrayView2<f32>) -> Option<Self::Sparse>;
    /// Rows the host already holds as CSR (a mini-batch gathered from a store's sparse copy,
    /// whose caller made [`Backend::sparse_from_dense`]'s test from the rows' counts), as this
    /// backend's sparse rows: moved where the backend is the host, uploaded as CSR otherwise.
    /// `transpose`: their entries grouped by column, built ahead (by a prefetch worker) for a
    /// backend whose weight gradient reads it; a device uploads it instead of building it on
    /// first use, the CPU (which needs none) drops it.
    fn sparse_from_csr(&self, x: CsrMatrix, transpose: Option<BlockTranspose>) -> Self::Sparse;
    fn sparse_dim(&self, x: &Self::Sparse) -> (usize, usize);
    fn sparse_to_dense(&self, x: &Self::Sparse) -> Self::Mat;
    /// The first `rows` rows.
    fn sparse_first_rows(&self, x: &Self::Sparse, rows: usize) -> Self::Sparse;
    /// Dropout on the stored entries (the same mask as on the dense form).
    fn sparse_dropout_in_place(&self, mask: &DropoutMask, x: &mut Self::Sparse, keys: &[u64]);
    /// `x[..rows] · w`.
    fn spmm(&self, x: &Self::Sparse, rows: usize, w: Self::View<'_>) -> Self::Mat;
    /// `out (+)= x[..rows] · w`.
    fn spmm_into(
        &self,
        x: &Self::Sparse,
        rows: usize,
        w: Self::View<'_>,
        out: Self::ViewMut<'_>,
        accumulate: bool,
    );
    /// `c += x[..rows]ᵀ · d`.
    fn add_spmm_tn(&self, x: &Self::Sparse, rows: usize, d: Self::View<'_>, c: Self::ViewMut<'_>);
}
