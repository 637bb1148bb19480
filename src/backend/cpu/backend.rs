//! [`Cpu`], the CPU backend: [`Backend`] over host matrices (ndarray), each operation one of
//! this module's kernels, unchanged. Moving a matrix in or out of this backend is free
//! (`upload_owned` / `download_owned` move it), so code generic over the backend costs nothing on a CPU.

use ndarray::{concatenate, s, Array2, ArrayView2, ArrayViewMut2, Axis, CowArray, Ix2};
use std::sync::OnceLock;

use super::activation::{Activation, Saved};
use super::aggregate::{
    aggregate, aggregate_beside, aggregate_transpose_beside, aggregate_transpose_lazy,
    BlockTranspose, EdgeWeights, LazyTranspose,
};
use super::attention::{self, AttentionInputs};
use super::dropout::{DropoutMask, KeptBits};
use super::gather::add_column_sums;
use super::gemm::{self, RowDropout};
use super::sparse::{self, CsrMatrix};
use super::{adam, loss, norm, sparse_rows};
use crate::backend::{AdamStep, AttentionArgs, AttentionGrads, Backend, LossSum};
use crate::sample::Block;

/// The CPU backend (a unit: the host has no state to hold).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Cpu;

/// A row of a bias (`1 × n`) as a slice.
fn row_slice<'a>(v: &'a ArrayView2<'a, f32>) -> &'a [f32] {
    v.as_slice().expect("a parameter row is contiguous")
}

impl Backend for Cpu {
    type Mat = Array2<f32>;
    type View<'a> = ArrayView2<'a, f32>;
    type ViewMut<'a> = ArrayViewMut2<'a, f32>;
    type Buffer = Vec<f32>;
    type Graph = Block;
    type Transpose = LazyTranspose;
    type Saved = Saved;
    type Kept = KeptBits;
    type Sparse = CsrMatrix;

    const IS_HOST: bool = true;

    fn fits(&self, _bytes: usize) -> bool {
        true
    }

    fn peak_memory(&self) -> Option<usize> {
        None
    }

    fn transfers(&self) -> Option<(u64, u64)> {
        None
    }

    fn describe(&self) -> String {
        // The processor's model is part of it: a calibration (keyed by this description)
        // taken on a VM that has since moved to other hardware under the same host name
        // describes another machine (the 2-core VM has been an Intel Xeon and an AMD EPYC).
        let model = cpu_model().map(|m| format!("{m}; ")).unwrap_or_default();
        format!(
            "CPU ({model}{} threads, GEMM: gemm crate, {})",
            rayon::current_num_threads(),
            super::gemm::kernels()
        )
    }

    fn graph(&self, block: Block) -> Block {
        block
    }

    fn transpose_of(&self, t: BlockTranspose) -> LazyTranspose {
        LazyTranspose::built(t)
    }

    fn block<'g>(&self, graph: &'g Block) -> &'g Block {
        graph
    }

    fn graph_of<'a>(&self, block: &'a Block, _slot: &'a OnceLock<Block>) -> &'a Block {
        block
    }

    fn zeros(&self, rows: usize, cols: usize) -> Array2<f32> {
        Array2::zeros((rows, cols))
    }

    fn upload(&self, x: ArrayView2<f32>) -> Array2<f32> {
        x.to_owned()
    }

    fn download(&self, x: ArrayView2<f32>) -> Array2<f32> {
        x.to_owned()
    }

    fn upload_owned(&self, x: Array2<f32>) -> Array2<f32> {
        x
    }

    fn host_view<'a>(&self, x: Self::View<'a>) -> CowArray<'a, f32, Ix2> {
        CowArray::from(x)
    }

    fn download_owned(&self, x: Array2<f32>) -> Array2<f32> {
        x
    }

    fn view<'a>(&self, x: &'a Array2<f32>) -> ArrayView2<'a, f32> {
        x.view()
    }

    fn view_mut<'a>(&self, x: &'a mut Array2<f32>) -> ArrayViewMut2<'a, f32> {
        x.view_mut()
    }

    fn reborrow<'a>(&self, x: &'a mut ArrayViewMut2<'_, f32>) -> ArrayViewMut2<'a, f32> {
        x.view_mut()
    }

    fn shorten<'b, 'a: 'b>(&self, x: Self::View<'a>) -> Self::View<'b> {
        x
    }

    fn as_view<'a>(&self, x: &'a ArrayViewMut2<'_, f32>) -> ArrayView2<'a, f32> {
        x.view()
    }

    fn dim(&self, x: ArrayView2<f32>) -> (usize, usize) {
        x.dim()
    }

    fn dim_mut(&self, x: &ArrayViewMut2<f32>) -> (usize, usize) {
        x.dim()
    }

    fn mat_dim(&self, x: &Array2<f32>) -> (usize, usize) {
        x.dim()
    }

    fn rows<'a>(&self, x: Self::View<'a>, range: std::ops::Range<usize>) -> Self::View<'a> {
        x.slice_move(s![range, ..])
    }

    fn rows_mut<'a>(
        &self,
        x: Self::ViewMut<'a>,
        range: std::ops::Range<usize>,
    ) -> Self::ViewMut<'a> {
        x.slice_move(s![range, ..])
    }

    fn to_owned(&self, x: ArrayView2<f32>) -> Array2<f32> {
        x.to_owned()
    }

    fn pad_rows(&self, x: Array2<f32>, rows: usize) -> Array2<f32> {
        if x.nrows() == rows {
            return x;
        }
        assert!(x.nrows() < rows, "pad_rows: {} rows to {rows}", x.nrows());
        let mut full = Array2::zeros((rows, x.ncols()));
        full.slice_mut(s![..x.nrows(), ..]).assign(&x);
        full
    }

    fn concat_rows(&self, a: ArrayView2<f32>, b: ArrayView2<f32>) -> Array2<f32> {
        concatenate(Axis(0), &[a, b]).expect("concat_rows: same width")
    }

    fn gather_rows(&self, x: ArrayView2<f32>, idx: &[u32]) -> Array2<f32> {
        super::gather::gather_rows(x, idx)
    }

    fn select_rows(&self, x: ArrayView2<f32>, idx: &[usize]) -> Array2<f32> {
        x.select(Axis(0), idx)
    }

    fn scatter_rows(&self, x: ArrayView2<f32>, idx: &[usize], rows: usize) -> Array2<f32> {
        assert_eq!(x.nrows(), idx.len(), "scatter_rows: one target per row");
        let targets: Vec<u32> = idx
            .iter()
            .map(|&r| u32::try_from(r).expect("row index past 2^32"))
            .collect();
        let every_row: Vec<u32> = (0..idx.len() as u32).collect();
        let mut out = Array2::zeros((rows, x.ncols()));
        super::gather::copy_rows(out.view_mut(), &targets, x, &every_row);
        out
    }

    fn copy_rows(
        &self,
        dst: ArrayViewMut2<f32>,
        dst_idx: &[u32],
        x: ArrayView2<f32>,
        src_idx: &[u32],
    ) {
        super::gather::copy_rows(dst, dst_idx, x, src_idx)
    }

    fn scatter_add_rows(&self, dst: ArrayViewMut2<f32>, idx: &[u32], x: ArrayView2<f32>) {
        super::gather::scatter_add_rows(dst, idx, x)
    }

    fn truncate_rows(&self, x: Array2<f32>, rows: usize) -> Array2<f32> {
        assert!(rows <= x.nrows(), "truncate_rows: {rows} of {}", x.nrows());
        x.slice_move(s![..rows, ..])
    }

    fn add_assign(&self, mut dst: ArrayViewMut2<f32>, src: ArrayView2<f32>) {
        dst += &src;
    }

    fn add_scaled(&self, mut dst: ArrayViewMut2<f32>, a: f32, src: ArrayView2<f32>) {
        dst.scaled_add(a, &src);
    }

    fn scale(&self, mut x: ArrayViewMut2<f32>, a: f32) {
        x.mapv_inplace(|v| v * a);
    }

    fn add_bias(&self, z: ArrayViewMut2<f32>, bias: ArrayView2<f32>) {
        super::gather::add_to_rows(z, row_slice(&bias));
    }

    fn add_column_sums(&self, grad: ArrayViewMut2<f32>, dz: ArrayView2<f32>) {
        add_column_sums(grad, dz);
    }

    fn matmul(&self, a: ArrayView2<f32>, b: ArrayView2<f32>) -> Array2<f32> {
        gemm::matmul(a, b)
    }

    fn matmul_nt(&self, a: ArrayView2<f32>, b: ArrayView2<f32>) -> Array2<f32> {
        gemm::matmul_nt(a, b)
    }

    fn add_matmul_tn(&self, a: ArrayView2<f32>, b: ArrayView2<f32>, c: ArrayViewMut2<f32>) {
        gemm::add_matmul_tn(a, b, c)
    }

    fn add_matmul_nt_rows(&self, a: ArrayView2<f32>, b: ArrayView2<f32>, c: ArrayViewMut2<f32>) {
        gemm::add_matmul_nt_rows(a, b, c)
    }

    fn gemm_into(
        &self,
        alpha: f32,
        a: ArrayView2<f32>,
        b: ArrayView2<f32>,
        beta: f32,
        c: ArrayViewMut2<f32>,
    ) {
        gemm::gemm_into(alpha, a, b, beta, c)
    }

    fn matmul_nt_sparse_left(&self, a: ArrayView2<f32>, b: ArrayView2<f32>) -> Array2<f32> {
        sparse_rows::matmul_mostly_zero_rows(a, b.t())
    }

    fn add_matmul_tn_building_transpose(
        &self,
        a: ArrayView2<f32>,
        b: ArrayView2<f32>,
        c: ArrayViewMut2<f32>,
        g: &Block,
        t: &LazyTranspose,
    ) {
        // Building the transpose is serial: do it while the other threads run the product.
        rayon::join(|| t.get(g), || gemm::add_matmul_tn(a, b, c));
    }

    fn matmul_epilogue(
        &self,
        onto: Option<Array2<f32>>,
        a: ArrayView2<f32>,
        b: ArrayView2<f32>,
        bias: Option<ArrayView2<f32>>,
        relu: bool,
        dropout: Option<(&RowDropout, &DropoutMask)>,
    ) -> (Array2<f32>, Option<Saved>, Option<KeptBits>) {
        let bias = bias.as_ref().map(row_slice);
        let (z, bits, kept) =
            gemm::matmul_onto_bias_relu(onto, a, b, bias, relu, dropout.map(|(rows, _)| rows));
        let kept = dropout
            .zip(kept)
            .map(|((_, mask), words)| KeptBits::from_product(z.nrows(), z.ncols(), mask, words));
        (z, bits.map(Saved::Positive), kept)
    }

    fn aggregate(&self, g: &Block, x: ArrayView2<f32>, w: EdgeWeights) -> Array2<f32> {
        aggregate(g, x, w)
    }

    fn aggregate_beside(&self, g: &Block, x: ArrayView2<f32>, w: EdgeWeights) -> Array2<f32> {
        aggregate_beside(g, x, w)
    }

    fn aggregate_transpose(
        &self,
        g: &Block,
        t: &LazyTranspose,
        d: ArrayView2<f32>,
        w: EdgeWeights,
    ) -> Array2<f32> {
        aggregate_transpose_lazy(g, t, d, w)
    }

    fn aggregate_transpose_beside(
        &self,
        g: &Block,
        t: &LazyTranspose,
        d: ArrayView2<f32>,
        w: EdgeWeights,
        kept: Option<&KeptBits>,
    ) -> Array2<f32> {
        aggregate_transpose_beside(g, t.get(g), d, w, kept)
    }

    fn node_logits(&self, wh: ArrayView2<f32>, att: ArrayView2<f32>, rows: usize) -> Array2<f32> {
        attention::node_logits(wh, att, rows)
    }

    fn edge_softmax(
        &self,
        g: &Block,
        el: ArrayView2<f32>,
        er: ArrayView2<f32>,
        slope: f32,
    ) -> Array2<f32> {
        attention::edge_softmax(g, el, er, slope)
    }

    fn attention_aggregate(
        &self,
        g: &Block,
        alpha: ArrayView2<f32>,
        wh: ArrayView2<f32>,
    ) -> Array2<f32> {
        attention::attention_aggregate(g, alpha, wh)
    }

    fn attention_backward(
        &self,
        a: &AttentionArgs<Cpu>,
        d_out: ArrayView2<f32>,
    ) -> AttentionGrads<Cpu> {
        let g = attention::attention_backward(
            &AttentionInputs {
                block: a.graph,
                transpose: a.transpose.get(a.graph),
                wh: a.wh,
                el: a.el,
                er: a.er,
                alpha: a.alpha,
                att_src: a.att_src,
                att_dst: a.att_dst,
                slope: a.slope,
            },
            d_out,
        );
        AttentionGrads {
            d_wh: g.d_wh,
            d_att_src: g.d_att_src,
            d_att_dst: g.d_att_dst,
        }
    }

    fn mean_heads(&self, x: ArrayView2<f32>, heads: usize, f: usize) -> Array2<f32> {
        attention::mean_heads(x, heads, f)
    }

    fn spread_heads(&self, d: ArrayView2<f32>, heads: usize, f: usize) -> Array2<f32> {
        attention::spread_heads(d, heads, f)
    }

    fn activation_forward(&self, act: Activation, x: ArrayViewMut2<f32>) -> Saved {
        act.forward_save(x)
    }

    fn activation_backward(&self, act: Activation, saved: &Saved, g: ArrayViewMut2<f32>) {
        act.backward_saved(saved, g)
    }

    fn activation_in_place(&self, act: Activation, x: ArrayViewMut2<f32>) {
        act.forward_in_place(x)
    }

    fn saved_is_bits(&self, saved: &Saved) -> bool {
        matches!(saved, Saved::Positive(_))
    }

    fn dropout_recorded(
        &self,
        mask: &DropoutMask,
        x: ArrayView2<f32>,
        keys: &[u64],
    ) -> (Array2<f32>, KeptBits) {
        mask.apply_recorded(x, keys)
    }

    fn dropout_recorded_in_place(
        &self,
        mask: &DropoutMask,
        mut x: ArrayViewMut2<f32>,
        keys: &[u64],
    ) -> KeptBits {
        if x.is_standard_layout() {
            return mask.apply_recorded_in_place(x, keys);
        }
        // The row kernels need contiguous rows: mask a copy and write it back.
        let (masked, kept) = mask.apply_recorded(x.view(), keys);
        x.assign(&masked);
        kept
    }

    fn dropout_in_place(&self, mask: &DropoutMask, x: ArrayViewMut2<f32>, keys: &[u64]) {
        mask.apply_in_place(x, keys)
    }

    fn kept_apply(&self, kept: &KeptBits, x: ArrayViewMut2<f32>) {
        kept.apply_in_place(x)
    }

    fn kept_and_positive(
        &self,
        kept: &KeptBits,
        cols: usize,
        positive: &Saved,
    ) -> Option<KeptBits> {
        match positive {
            Saved::Positive(bits) => kept.and_positive(cols, bits),
            Saved::Output(_) => None,
        }
    }

    fn layer_norm(
        &self,
        x: ArrayView2<f32>,
        gain: ArrayView2<f32>,
        bias: ArrayView2<f32>,
        eps: f32,
    ) -> (Array2<f32>, Array2<f32>, Array2<f32>) {
        let (y, xhat, inv_std) = norm::layer_norm(x, row_slice(&gain), row_slice(&bias), eps);
        let rows = inv_std.len();
        let inv_std = Array2::from_shape_vec((rows, 1), inv_std).expect("one per row");
        (y, xhat, inv_std)
    }

    fn layer_norm_backward(
        &self,
        xhat: ArrayView2<f32>,
        inv_std: ArrayView2<f32>,
        gain: ArrayView2<f32>,
        dy: ArrayView2<f32>,
    ) -> (Array2<f32>, Array2<f32>, Array2<f32>) {
        let inv_std = inv_std.as_slice().expect("one column, contiguous");
        norm::layer_norm_backward(xhat, inv_std, row_slice(&gain), dy)
    }

    fn cross_entropy(&self, logits: ArrayView2<f32>, labels: &[i64]) -> (LossSum, Array2<f32>) {
        let (sum, grad) = loss::cross_entropy(logits, labels);
        (LossSum::ready(sum), grad)
    }

    fn bce_with_logits(
        &self,
        logits: ArrayView2<f32>,
        targets: ArrayView2<i64>,
    ) -> (LossSum, Array2<f32>) {
        let (sum, grad) = loss::bce_with_logits(logits, targets);
        (LossSum::ready(sum), grad)
    }

    fn buffer_from_host(&self, values: &[f32]) -> Vec<f32> {
        values.to_vec()
    }

    fn buffer_to_host(&self, buf: &Vec<f32>) -> Vec<f32> {
        buf.clone()
    }

    fn buffer_len(&self, buf: &Vec<f32>) -> usize {
        buf.len()
    }

    fn buffer_write(&self, buf: &mut Vec<f32>, values: &[f32]) {
        buf.copy_from_slice(values);
    }

    fn buffer_zero(&self, buf: &mut Vec<f32>) {
        // Every step zeroes the whole gradient buffer (10 MB for Facebook's first layer):
        // on all threads, not one.
        use rayon::prelude::*;
        buf.par_chunks_mut(1 << 16).for_each(|c| c.fill(0.0));
    }

    fn buffer_view<'a>(
        &self,
        buf: &'a Vec<f32>,
        offset: usize,
        rows: usize,
        cols: usize,
    ) -> ArrayView2<'a, f32> {
        ArrayView2::from_shape((rows, cols), &buf[offset..offset + rows * cols])
            .expect("a parameter fits its buffer")
    }

    fn buffer_view_mut<'a>(
        &self,
        buf: &'a mut Vec<f32>,
        offset: usize,
        rows: usize,
        cols: usize,
    ) -> ArrayViewMut2<'a, f32> {
        ArrayViewMut2::from_shape((rows, cols), &mut buf[offset..offset + rows * cols])
            .expect("a parameter fits its buffer")
    }

    fn with_host_buffer(&self, buf: &mut Vec<f32>, f: &mut dyn FnMut(&mut [f32])) {
        f(buf)
    }

    fn adam_step(
        &self,
        values: &mut Vec<f32>,
        grads: &Vec<f32>,
        m: &mut Vec<f32>,
        v: &mut Vec<f32>,
        step: AdamStep,
    ) {
        adam::adam_step(values, grads, m, v, step)
    }

    fn sparse_from_dense(&self, x: ArrayView2<f32>) -> Option<CsrMatrix> {
        sparse::prefers_sparse(x).then(|| CsrMatrix::from_dense(x))
    }

    fn sparse_from_host(&self, x: ArrayView2<f32>) -> Option<CsrMatrix> {
        self.sparse_from_dense(x)
    }

    fn sparse_from_csr(&self, x: CsrMatrix, _transpose: Option<BlockTranspose>) -> CsrMatrix {
        x
    }

    fn sparse_dim(&self, x: &CsrMatrix) -> (usize, usize) {
        (x.nrows(), x.ncols)
    }

    fn sparse_to_dense(&self, x: &CsrMatrix) -> Array2<f32> {
        x.to_dense()
    }

    fn sparse_first_rows(&self, x: &CsrMatrix, rows: usize) -> CsrMatrix {
        if rows == x.nrows() {
            x.clone()
        } else {
            x.first_rows(rows)
        }
    }

    fn sparse_dropout_in_place(&self, mask: &DropoutMask, x: &mut CsrMatrix, keys: &[u64]) {
        mask.apply_sparse_in_place(x, keys);
    }

    fn spmm(&self, x: &CsrMatrix, rows: usize, w: ArrayView2<f32>) -> Array2<f32> {
        sparse::spmm(x, rows, w)
    }

    fn spmm_into(
        &self,
        x: &CsrMatrix,
        rows: usize,
        w: ArrayView2<f32>,
        out: ArrayViewMut2<f32>,
        accumulate: bool,
    ) {
        sparse::spmm_into(x, rows, w, out, accumulate)
    }

    fn add_spmm_tn(&self, x: &CsrMatrix, rows: usize, d: ArrayView2<f32>, c: ArrayViewMut2<f32>) {
        sparse::add_spmm_tn(x, rows, d, c)
    }
}

/// The host processor's model name (`/proc/cpuinfo`'s first `model name`), where it says.
fn cpu_model() -> Option<String> {
    let info = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    model_name_in(&info)
}

/// The first `model name` of a `/proc/cpuinfo` text, its spaces collapsed.
fn model_name_in(info: &str) -> Option<String> {
    let line = info.lines().find(|l| l.starts_with("model name"))?;
    let name = line
        .split_once(':')?
        .1
        .split_whitespace()
        .collect::<Vec<_>>();
    (!name.is_empty()).then(|| name.join(" "))
}

#[cfg(test)]
mod tests {
    use super::model_name_in;

    #[test]
    fn the_model_name_is_the_first_one_cpuinfo_gives() {
        let info = "processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD  EPYC 9654 \
                    96-Core Processor\n\nprocessor\t: 1\nmodel name\t: other\n";
        assert_eq!(
            model_name_in(info).as_deref(),
            Some("AMD EPYC 9654 96-Core Processor")
        );
        assert_eq!(model_name_in("processor\t: 0\n"), None);
        assert_eq!(model_name_in("model name\t:  \n"), None);
    }
}
