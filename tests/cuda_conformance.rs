//! CPU-twin conformance of every CUDA backend op: random inputs (fixed seeds, sizes that hit
//! the tails — columns that are not multiples of 32 / 64 / 128, empty rows, destinations
//! without edges, degrees above a warp), the CPU kernel and the device op on the same inputs,
//! results compared: bitwise where the CPU is bitwise given the same inputs (masks, bits,
//! aggregations, epilogues, column sums, Adam); products within the rounding bound of a
//! length-k dot product in any order (cuBLAS sums in its own); within 1e-5 relative elsewhere
//! (softmax, ELU, losses: the device's `exp` / `log`; layer norm: warp sums).
//!
//! Every case runs on the emulator (the same `cuda/*.cu` compiled for the CPU), always, and
//! on a real GPU where one answers; without one the GPU side prints `SKIPPED`.

use std::sync::{Arc, OnceLock};

use ndarray::{Array2, ArrayView2};

use gnnpar::backend::cpu;
use gnnpar::backend::cpu::activation::{Activation, Saved};
use gnnpar::backend::cpu::aggregate::{BlockTranspose, EdgeWeights, GcnNorm};
use gnnpar::backend::cpu::dropout::DropoutMask;
use gnnpar::backend::cuda::driver::DriverGpu;
use gnnpar::backend::cuda::gpu::Device;
use gnnpar::backend::cuda::mat::{DevMat, DevVec, DevView};
use gnnpar::backend::cuda::ops::activation::{self as dact, DevSaved};
use gnnpar::backend::cuda::ops::dropout::{self as ddrop, DevDropout, DevRowSeeds, RowMask};
use gnnpar::backend::cuda::ops::graph::{DevGraph, DevTranspose, DevWeights};
use gnnpar::backend::cuda::ops::sparse::DevSparse;
use gnnpar::backend::cuda::ops::{
    adam as dadam, aggregate as dagg, elementwise as delt, epilogue as depi, gat as dgat,
    gather as dgather, loss as dloss, norm as dnorm, reduce as dred,
};
use gnnpar::backend::cuda::{blas, emu, kernels, probe};
use gnnpar::backend::AdamStep;
use gnnpar::sample::Block;
use gnnpar::util::skip::{skipped, SkipKind};

// ---- devices ---------------------------------------------------------------------------------

/// The emulator, compiled once per test process.
fn emulator() -> Device {
    static EMU: OnceLock<Device> = OnceLock::new();
    EMU.get_or_init(|| {
        emu::emu_device_for_tests(kernels::SOURCES).expect("the emulator compiles every kernel")
    })
    .clone()
}

/// A real GPU when the driver, a device, NVRTC and cuBLAS answer (`probe`), with every kernel
/// compiled for it; else why not. Once per process.
fn gpu() -> Result<Device, String> {
    static GPU: OnceLock<Result<Device, String>> = OnceLock::new();
    GPU.get_or_init(|| {
        probe::probe().map_err(|why| why.to_string())?;
        let gpu = DriverGpu::new(0, kernels::SOURCES)
            .unwrap_or_else(|e| panic!("the probed GPU must compile every kernel: {e:#}"));
        Ok(Device::new(Arc::new(gpu)))
    })
    .clone()
}

/// The devices a case runs on: the emulator always, the GPU when there is one (and a
/// `SKIPPED` record for `case` when there is none).
fn devices(case: &str) -> Vec<(&'static str, Device)> {
    let mut out = vec![("emulator", emulator())];
    match gpu() {
        Ok(d) => out.push(("gpu", d)),
        Err(why) => skipped(
            SkipKind::Gpu,
            &format!("cuda_conformance::{case} (GPU side; the emulator side ran)"),
            &why,
        ),
    }
    out
}

// ---- inputs ----------------------------------------------------------------------------------

/// SplitMix64: reproducible inputs from a seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `[-1, 1)`.
    fn f32(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn matrix(&mut self, rows: usize, cols: usize) -> Array2<f32> {
        Array2::from_shape_fn((rows, cols), |_| self.f32())
    }

    fn vec(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.f32()).collect()
    }
}

/// A block with `num_dst` destinations and `num_src` sources whose degrees cover the cases:
/// zero (every fifth destination), small, and above a warp (destination 1: 70 edges), with
/// repeated sources.
fn block(rng: &mut Rng, num_dst: usize, num_src: usize) -> Block {
    let mut indptr = vec![0usize];
    let mut indices = Vec::new();
    for i in 0..num_dst {
        let degree = match i {
            1 => 70,
            _ if i % 5 == 0 => 0,
            _ => 1 + rng.below(12),
        };
        for _ in 0..degree {
            indices.push(rng.below(num_src) as u32);
        }
        indptr.push(indices.len());
    }
    Block {
        num_dst,
        src_nodes: (0..num_src as u32).map(|v| 3 * v + 1).collect(),
        indptr,
        indices,
    }
}

fn up(d: &Device, x: &Array2<f32>) -> DevMat {
    DevMat::upload(d, x.nrows(), x.ncols(), x.as_slice().expect("standard")).unwrap()
}

fn down(x: &DevMat) -> Array2<f32> {
    Array2::from_shape_vec((x.rows(), x.cols()), x.download().unwrap()).unwrap()
}

fn down_view(x: DevView) -> Array2<f32> {
    Array2::from_shape_vec(x.dim(), x.download().unwrap()).unwrap()
}

// ---- comparisons -----------------------------------------------------------------------------

/// Every element bitwise equal (NaN patterns included).
#[track_caller]
fn assert_bitwise(what: &str, got: ArrayView2<f32>, expect: ArrayView2<f32>) {
    assert_eq!(got.dim(), expect.dim(), "{what}: shape");
    for ((idx, g), e) in got.indexed_iter().zip(expect.iter()) {
        assert!(
            g.to_bits() == e.to_bits(),
            "{what}: at {idx:?} got {g:e} ({:#x}), CPU {e:e} ({:#x})",
            g.to_bits(),
            e.to_bits()
        );
    }
}

/// Within `1e-5` relative: `|g − e| ≤ 1e-5 · max(|e|, 1e-3 · max |expect|)` (the floor keeps
/// elements that cancel to nearly zero from asking for more than the others' precision).
#[track_caller]
fn assert_close(what: &str, got: ArrayView2<f32>, expect: ArrayView2<f32>) {
    assert_eq!(got.dim(), expect.dim(), "{what}: shape");
    let scale = expect.iter().fold(0f32, |m, v| m.max(v.abs()));
    for ((idx, g), e) in got.indexed_iter().zip(expect.iter()) {
        let tol = 1e-5 * e.abs().max(1e-3 * scale);
        assert!(
            (g - e).abs() <= tol || g.to_bits() == e.to_bits(),
            "{what}: at {idx:?} got {g:e}, CPU {e:e} (tolerance {tol:e})"
        );
    }
}

/// `|A|·|B|`: the magnitude a product's rounding scales with (an element that cancels to
/// nearly zero keeps the absolute error of its largest terms, not a relative one).
fn abs_product(a: ArrayView2<f32>, b: ArrayView2<f32>) -> Array2<f32> {
    a.mapv(f32::abs).dot(&b.mapv(f32::abs))
}

/// Within the worst-case rounding of two length-`k` dot products summed in different orders:
/// each is within `γ_k · bound` of the exact value (`γ_k ≈ k·ε/2`, Higham's bound), so they
/// differ by at most `k·ε · bound`; `bound` is `|A|·|B|` plus the magnitudes of whatever the
/// op adds (an accumulator, a bias), and the `+ 3` covers those few extra roundings. A wrong
/// index, transpose or accumulation misses by the order of `bound` itself.
#[track_caller]
fn assert_product_close(
    what: &str,
    got: ArrayView2<f32>,
    expect: ArrayView2<f32>,
    bound: ArrayView2<f32>,
    k: usize,
) {
    assert_eq!(got.dim(), expect.dim(), "{what}: shape");
    assert_eq!(bound.dim(), expect.dim(), "{what}: bound's shape");
    let per_unit = (k + 3) as f32 * f32::EPSILON;
    for (((idx, g), e), b) in got.indexed_iter().zip(expect.iter()).zip(bound.iter()) {
        let tol = per_unit * b;
        assert!(
            (g - e).abs() <= tol || g.to_bits() == e.to_bits(),
            "{what}: at {idx:?} got {g:e}, CPU {e:e} (tolerance {tol:e}, |A|·|B| bound {b:e})"
        );
    }
}

fn row(v: &[f32]) -> Array2<f32> {
    Array2::from_shape_vec((1, v.len()), v.to_vec()).unwrap()
}

// ---- products --------------------------------------------------------------------------------

#[test]
fn products_match_the_cpu_within_tolerance() {
    let mut rng = Rng(1);
    // Shapes with tails everywhere, a long reduction (weight gradient) and an empty inner side.
    for &(m, k, n) in &[
        (37, 45, 70),
        (1, 300, 3),
        (130, 1, 65),
        (0, 4, 5),
        (9, 0, 6),
    ] {
        let a = rng.matrix(m, k);
        let b = rng.matrix(k, n);
        let at = a.t().as_standard_layout().to_owned();
        let bt = b.t().as_standard_layout().to_owned();
        let c0 = rng.matrix(m, n);
        let cpu_ab = cpu::gemm::matmul(a.view(), b.view());
        let cpu_nt = cpu::gemm::matmul_nt(a.view(), bt.view());
        let cpu_tn = cpu::gemm::matmul_tn(at.view(), b.view());
        let mut cpu_acc = c0.clone();
        cpu::gemm::add_matmul_tn(at.view(), b.view(), cpu_acc.view_mut());
        let mut cpu_ab_scaled = c0.clone();
        cpu::gemm::gemm_into(0.5, a.view(), b.view(), -2.0, cpu_ab_scaled.view_mut());
        let ab = abs_product(a.view(), b.view());
        let acc_bound = &ab + &c0.mapv(f32::abs);
        let scaled_bound = &ab * 0.5 + &c0.mapv(|v| 2.0 * v.abs());
        for (name, d) in devices("products") {
            let (da, db, dat, dbt) = (up(&d, &a), up(&d, &b), up(&d, &at), up(&d, &bt));
            let what = |op: &str| format!("{name}: {op} {m}×{k}·{k}×{n}");
            let close = |op: &str, got: &DevMat, expect: &Array2<f32>, bound: &Array2<f32>| {
                assert_product_close(&what(op), down(got).view(), expect.view(), bound.view(), k)
            };
            close(
                "matmul",
                &blas::matmul(da.view(), db.view()).unwrap(),
                &cpu_ab,
                &ab,
            );
            close(
                "matmul_nt",
                &blas::matmul_nt(da.view(), dbt.view()).unwrap(),
                &cpu_nt,
                &ab,
            );
            close(
                "matmul_tn",
                &blas::matmul_tn(dat.view(), db.view()).unwrap(),
                &cpu_tn,
                &ab,
            );
            let mut dacc = up(&d, &c0);
            blas::add_matmul_tn(dat.view(), db.view(), dacc.view_mut()).unwrap();
            close("add_matmul_tn", &dacc, &cpu_acc, &acc_bound);
            let mut dsc = up(&d, &c0);
            blas::gemm_into(0.5, da.view(), db.view(), -2.0, dsc.view_mut()).unwrap();
            close("gemm_into", &dsc, &cpu_ab_scaled, &scaled_bound);
        }
    }
    // c[..rows] += a·bᵀ.
    let (a, b, c) = (rng.matrix(5, 33), rng.matrix(7, 33), rng.matrix(9, 7));
    let mut expect = c.clone();
    cpu::gemm::add_matmul_nt_rows(a.view(), b.view(), expect.view_mut());
    let mut bound = c.mapv(f32::abs);
    bound
        .slice_mut(ndarray::s![..5, ..])
        .scaled_add(1.0, &abs_product(a.view(), b.t()));
    for (name, d) in devices("products_rows") {
        let mut dc = up(&d, &c);
        blas::add_matmul_nt_rows(up(&d, &a).view(), up(&d, &b).view(), dc.view_mut()).unwrap();
        assert_product_close(
            &format!("{name}: add_matmul_nt_rows"),
            down(&dc).view(),
            expect.view(),
            bound.view(),
            33,
        );
    }
}

// ---- sparse input rows -----------------------------------------------------------------------

/// A `rows × cols` matrix with about `density` of its entries non-zero, every seventh row
/// empty and row 1 holding more entries than a warp has lanes.
fn sparse_matrix(rng: &mut Rng, rows: usize, cols: usize, density: f64) -> Array2<f32> {
    let per_mille = (density * 1000.0) as u64;
    Array2::from_shape_fn((rows, cols), |(i, j)| {
        let dense_row = i == 1 && j % 3 == 0;
        let keep = dense_row || (rng.next() % 1000 < per_mille && i % 7 != 3);
        if keep {
            rng.f32()
        } else {
            0.0
        }
    })
}

#[test]
fn sparse_rows_and_their_products_are_bitwise_the_cpus() {
    let mut rng = Rng(7);
    for &(rows, cols, n) in &[(70, 300, 45), (9, 64, 130), (40, 129, 1)] {
        let x = sparse_matrix(&mut rng, rows, cols, 0.03);
        let csr = cpu::sparse::CsrMatrix::from_dense(x.view());
        assert!(
            cpu::sparse::prefers_sparse(x.view()),
            "test input is sparse"
        );
        let w = rng.matrix(cols, n);
        let d = rng.matrix(rows, n);
        let c0 = rng.matrix(cols, n);
        let part = rows / 2;
        let keys: Vec<u64> = (0..part as u64).map(|k| 1000 + 3 * k).collect();
        let mask = DropoutMask::new(0x5eed, 0.4);
        let mut masked = csr.first_rows(part);
        mask.apply_sparse_in_place(&mut masked, &keys);
        for (name, dev) in devices("sparse_rows") {
            let what = |op: &str| format!("{name}: {op} ({rows}×{cols}, {n} columns)");
            let built = DevSparse::from_dense(up(&dev, &x).view()).unwrap();
            let from_host = DevSparse::from_host(&dev, x.view()).unwrap();
            for (how, sx) in [("from_dense", built), ("from_host", from_host)] {
                let sx = sx.unwrap_or_else(|| panic!("{}: rows not taken as sparse", what(how)));
                assert_eq!(sx.dim(), (rows, cols), "{}", what(how));
                assert_eq!(sx.nnz(), csr.nnz(), "{}", what(how));
                assert_bitwise(&what(how), down(&sx.to_dense().unwrap()).view(), x.view());
                // x·w over all rows and a prefix, written and accumulated.
                for r in [rows, part] {
                    let expect = cpu::sparse::spmm(&csr, r, w.view());
                    let got = sx.times(r, up(&dev, &w).view()).unwrap();
                    assert_bitwise(
                        &what(&format!("spmm of {r} rows")),
                        down(&got).view(),
                        expect.view(),
                    );
                    let mut expect = c0.slice(ndarray::s![..r, ..n]).to_owned();
                    let mut got = up(&dev, &expect);
                    cpu::sparse::spmm_into(&csr, r, w.view(), expect.view_mut(), true);
                    sx.times_into(r, up(&dev, &w).view(), got.view_mut(), true)
                        .unwrap();
                    assert_bitwise(
                        &what("spmm_into, accumulating"),
                        down(&got).view(),
                        expect.view(),
                    );
                    // c += x[..r]ᵀ·d[..r].
                    let dr = d.slice(ndarray::s![..r, ..]).to_owned();
                    let mut expect = c0.clone();
                    cpu::sparse::add_spmm_tn(&csr, r, dr.view(), expect.view_mut());
                    let mut got = up(&dev, &c0);
                    sx.add_transposed_times(r, up(&dev, &dr).view(), got.view_mut())
                        .unwrap();
                    assert_bitwise(
                        &what(&format!("spmm_tn of {r} rows")),
                        down(&got).view(),
                        expect.view(),
                    );
                }
                // A prefix copy, masked: the dense mask's bits on the stored entries, the
                // structure (and its transpose, built above) shared, the original untouched.
                let mut first = sx.first_rows(part).unwrap();
                assert!(first.shares_structure(&sx) && first.transpose_built());
                let seeds = DevRowSeeds::from_mask(&dev, &mask, &keys).unwrap();
                first.dropout_in_place(RowMask::Seeds(&seeds)).unwrap();
                assert_bitwise(
                    &what("masked prefix"),
                    down(&first.to_dense().unwrap()).view(),
                    masked.to_dense().view(),
                );
                assert_bitwise(
                    &what("original after masking a copy"),
                    down(&sx.to_dense().unwrap()).view(),
                    x.view(),
                );
                let dr = d.slice(ndarray::s![..part, ..]).to_owned();
                let mut expect = c0.clone();
                cpu::sparse::add_spmm_tn(&masked, part, dr.view(), expect.view_mut());
                let mut got = up(&dev, &c0);
                first
                    .add_transposed_times(part, up(&dev, &dr).view(), got.view_mut())
                    .unwrap();
                assert_bitwise(
                    &what("spmm_tn of the masked prefix"),
                    down(&got).view(),
                    expect.view(),
                );
            }
        }
    }
}

#[test]
fn dense_or_narrow_rows_are_not_made_sparse() {
    let mut rng = Rng(8);
    let dense = rng.matrix(50, 100);
    let narrow = sparse_matrix(&mut rng, 50, 63, 0.02);
    let empty = Array2::<f32>::zeros((0, 100));
    for (name, dev) in devices("sparse_refusals") {
        for (what, x) in [("dense", &dense), ("narrow", &narrow), ("empty", &empty)] {
            assert!(
                DevSparse::from_dense(up(&dev, x).view()).unwrap().is_none(),
                "{name}: {what} rows made sparse on the device"
            );
            assert!(
                DevSparse::from_host(&dev, x.view()).unwrap().is_none(),
                "{name}: {what} rows made sparse from the host"
            );
            assert!(
                !cpu::sparse::prefers_sparse(x.view()),
                "the CPU agrees: {what}"
            );
        }
    }
}

// ---- element-wise, gathers, column sums --------------------------------------------------

#[test]
fn elementwise_ops_are_bitwise_the_cpus() {
    let mut rng = Rng(2);
    let (x, y) = (rng.matrix(37, 70), rng.matrix(37, 70));
    let mut axpy = y.clone();
    cpu::gather::axpy(0.37, x.as_slice().unwrap(), axpy.as_slice_mut().unwrap());
    let sum = &y + &x;
    let scaled = x.mapv(|v| v * -1.5);
    for (name, d) in devices("elementwise") {
        let dx = up(&d, &x);
        let mut dy = up(&d, &y);
        delt::axpy(0.37, dx.view(), dy.view_mut()).unwrap();
        assert_bitwise(&format!("{name}: axpy"), down(&dy).view(), axpy.view());
        let mut dy = up(&d, &y);
        delt::add_assign(dy.view_mut(), dx.view()).unwrap();
        assert_bitwise(&format!("{name}: add_assign"), down(&dy).view(), sum.view());
        let mut ds = up(&d, &x);
        delt::scale(ds.view_mut(), -1.5).unwrap();
        assert_bitwise(&format!("{name}: scale"), down(&ds).view(), scaled.view());
        // A residual: rows 3..20 only.
        let mut dy = up(&d, &y);
        delt::add_assign(dy.view_mut().row_range(3..20), dx.view().row_range(3..20)).unwrap();
        let mut expect = y.clone();
        for r in 3..20 {
            for c in 0..70 {
                expect[[r, c]] += x[[r, c]];
            }
        }
        assert_bitwise(
            &format!("{name}: residual rows"),
            down(&dy).view(),
            expect.view(),
        );
        let mut df = up(&d, &x);
        delt::fill(df.view_mut().row_range(1..4), 2.5).unwrap();
        delt::fill(df.view_mut().row_range(5..6), 0.0).unwrap();
        let mut expect = x.clone();
        expect.slice_mut(ndarray::s![1..4, ..]).fill(2.5);
        expect.slice_mut(ndarray::s![5..6, ..]).fill(0.0);
        assert_bitwise(&format!("{name}: fill"), down(&df).view(), expect.view());
        let cat = delt::concat_rows(dx.view().row_range(0..5), dy.view().row_range(7..9)).unwrap();
        let expect = ndarray::concatenate(
            ndarray::Axis(0),
            &[
                x.slice(ndarray::s![0..5, ..]),
                down(&dy).slice(ndarray::s![7..9, ..]),
            ],
        )
        .unwrap();
        assert_bitwise(
            &format!("{name}: concat_rows"),
            down(&cat).view(),
            expect.view(),
        );
        let pad = delt::pad_rows(dx.view().row_range(0..3), 6).unwrap();
        let mut expect = Array2::zeros((6, 70));
        expect
            .slice_mut(ndarray::s![0..3, ..])
            .assign(&x.slice(ndarray::s![0..3, ..]));
        assert_bitwise(
            &format!("{name}: pad_rows"),
            down(&pad).view(),
            expect.view(),
        );
    }
}

#[test]
fn gathers_and_scatters_move_whole_rows() {
    let mut rng = Rng(3);
    let src = rng.matrix(50, 33);
    let idx: Vec<u32> = (0..77).map(|_| rng.below(50) as u32).collect();
    let expect = cpu::gather::gather_rows(src.view(), &idx);
    let picked: Vec<usize> = vec![4, 0, 49, 17, 8];
    let sel = src.select(ndarray::Axis(0), &picked);
    let mut spread = Array2::<f32>::zeros((60, 33));
    for (i, &r) in picked.iter().enumerate() {
        spread.row_mut(r).assign(&sel.row(i));
    }
    for (name, d) in devices("gathers") {
        let ds = up(&d, &src);
        let di = DevVec::upload(&d, &idx).unwrap();
        let got = dgather::gather_rows(ds.view(), &di).unwrap();
        assert_bitwise(
            &format!("{name}: gather_rows"),
            down(&got).view(),
            expect.view(),
        );
        let pi = dgather::upload_indices(&d, &picked).unwrap();
        let got = dgather::gather_rows(ds.view(), &pi).unwrap();
        assert_bitwise(&format!("{name}: select"), down(&got).view(), sel.view());
        let back = dgather::scatter_rows(got.view(), &pi, 60).unwrap();
        assert_bitwise(
            &format!("{name}: scatter_rows"),
            down(&back).view(),
            spread.view(),
        );
        let none = dgather::gather_rows(ds.view(), &DevVec::upload(&d, &[]).unwrap()).unwrap();
        assert_eq!((none.rows(), none.cols()), (0, 33));
    }
}

/// Rows of one matrix into chosen rows of another (distinct targets, repeated sources, rows
/// left alone keep their values), 45 columns (a partial last warp): bitwise the CPU twin,
/// which is bitwise a plain loop.
#[test]
fn copy_rows_moves_rows_between_chosen_positions() {
    let mut rng = Rng(37);
    let cols = 45;
    let base = rng.matrix(70, cols);
    let src = rng.matrix(30, cols);
    let mut targets: Vec<u32> = (0..70).collect();
    for i in (1..targets.len()).rev() {
        targets.swap(i, rng.below(i + 1));
    }
    let dst_idx = &targets[..50];
    let src_idx: Vec<u32> = (0..50).map(|_| rng.below(30) as u32).collect();
    let mut expect = base.clone();
    for (&d, &s) in dst_idx.iter().zip(&src_idx) {
        expect.row_mut(d as usize).assign(&src.row(s as usize));
    }
    let mut got = base.clone();
    cpu::gather::copy_rows(got.view_mut(), dst_idx, src.view(), &src_idx);
    assert_bitwise("cpu: copy_rows", got.view(), expect.view());
    for (name, d) in devices("copy_rows") {
        let mut dd = up(&d, &base);
        dgather::copy_rows(dd.view_mut(), dst_idx, up(&d, &src).view(), &src_idx).unwrap();
        assert_bitwise(
            &format!("{name}: copy_rows"),
            down(&dd).view(),
            expect.view(),
        );
    }
}

#[test]
#[should_panic(expected = "destination row 3 named twice")]
fn copy_rows_refuses_a_repeated_destination() {
    let src = Array2::<f32>::zeros((4, 2));
    let mut dst = Array2::<f32>::zeros((5, 2));
    cpu::gather::copy_rows(dst.view_mut(), &[3, 1, 3], src.view(), &[0, 1, 2]);
}

/// Rows added at repeated targets (one target gets more rows than a warp has lanes, some
/// none), 45 columns (a partial last warp): the device sums each target's rows in the order
/// of their index, bitwise the CPU twin, which is bitwise a plain loop in that order.
#[test]
fn scatter_add_rows_sums_repeated_targets_in_index_order() {
    let mut rng = Rng(31);
    let cols = 45;
    let base = rng.matrix(40, cols);
    let src = rng.matrix(150, cols);
    let mut idx: Vec<u32> = (0..150).map(|_| rng.below(30) as u32).collect();
    for t in idx.iter_mut().step_by(3) {
        *t = 7;
    }
    let mut expect = base.clone();
    cpu::gather::scatter_add_rows(expect.view_mut(), &idx, src.view());
    let mut naive = base.clone();
    for (i, &t) in idx.iter().enumerate() {
        let mut row = naive.row_mut(t as usize);
        row += &src.row(i);
    }
    assert_bitwise("cpu: scatter_add_rows", expect.view(), naive.view());
    for (name, d) in devices("scatter_add_rows") {
        let mut dst = up(&d, &base);
        let ds = up(&d, &src);
        dgather::scatter_add_rows(dst.view_mut(), &idx, ds.view()).unwrap();
        assert_bitwise(
            &format!("{name}: scatter_add_rows"),
            down(&dst).view(),
            expect.view(),
        );
        let none = DevMat::zeros(&d, 0, cols).unwrap();
        dgather::scatter_add_rows(dst.view_mut(), &[], none.view()).unwrap();
        assert_bitwise(
            &format!("{name}: scatter_add_rows of no rows"),
            down(&dst).view(),
            expect.view(),
        );
    }
}

#[test]
fn column_sums_are_bitwise_the_cpus_over_several_chunks() {
    let mut rng = Rng(4);
    // 300 columns: 109-row chunks, so 500 rows are 5 partial sums; 3 columns: one chunk.
    for &(rows, cols) in &[(500, 300), (333, 3), (64, 64), (0, 5), (1, 1)] {
        let x = rng.matrix(rows, cols);
        let expect = cpu::gather::column_sums(x.view());
        let expect = row(expect.as_slice().unwrap());
        let g0 = rng.vec(cols);
        let mut acc = row(&g0);
        cpu::gather::add_column_sums(acc.view_mut(), x.view());
        for (name, d) in devices("column_sums") {
            let dx = up(&d, &x);
            let got = dred::column_sums(dx.view()).unwrap();
            assert_bitwise(
                &format!("{name}: column_sums {rows}×{cols}"),
                down(&got).view(),
                expect.view(),
            );
            let mut dg = up(&d, &row(&g0));
            dred::add_column_sums(dg.view_mut(), dx.view()).unwrap();
            assert_bitwise(
                &format!("{name}: add_column_sums {rows}×{cols}"),
                down(&dg).view(),
                acc.view(),
            );
        }
    }
}

// ---- activations -------------------------------------------------------------------------

/// The CPU's sign bits of `forward_save`.
fn cpu_bits(saved: Saved) -> Vec<u64> {
    match saved {
        Saved::Positive(b) => b,
        Saved::Output(_) => panic!("expected bits"),
    }
}

#[test]
fn activations_and_their_bits_match_the_cpu() {
    let mut rng = Rng(5);
    // 37·45 = 1665 elements: words straddle rows, the last word is partial.
    let mut x = rng.matrix(37, 45);
    x[[0, 0]] = 0.0;
    x[[0, 1]] = -0.0;
    x[[3, 7]] = f32::MIN_POSITIVE;
    let g = rng.matrix(37, 45);
    for act in [Activation::Relu, Activation::LeakyRelu { slope: 0.2 }] {
        let mut y = x.clone();
        let bits = cpu_bits(act.forward_save(y.view_mut()));
        let mut gb = g.clone();
        act.backward_saved(&Saved::Positive(bits.clone()), gb.view_mut());
        for (name, d) in devices("activation_bits") {
            let mut dx = up(&d, &x);
            let saved = dact::forward_save(act, dx.view_mut()).unwrap();
            assert_bitwise(
                &format!("{name}: {act:?} forward"),
                down(&dx).view(),
                y.view(),
            );
            let DevSaved::Positive(dbits) = &saved else {
                panic!("bits expected")
            };
            assert_eq!(dbits.download().unwrap(), bits, "{name}: {act:?} sign bits");
            let packed = dact::pack_positive(dx.view()).unwrap();
            assert_eq!(
                packed.download().unwrap(),
                bits,
                "{name}: {act:?} pack_positive"
            );
            let mut dg = up(&d, &g);
            dact::backward_saved(act, &saved, dg.view_mut()).unwrap();
            assert_bitwise(
                &format!("{name}: {act:?} backward"),
                down(&dg).view(),
                gb.view(),
            );
            let mut dy = up(&d, &x);
            dact::forward_in_place(act, dy.view_mut()).unwrap();
            assert_bitwise(
                &format!("{name}: {act:?} in place"),
                down(&dy).view(),
                y.view(),
            );
        }
    }
    // ELU: the device's expm1 (close); the backward from the same output is bitwise.
    let act = Activation::Elu { alpha: 1.3 };
    let mut y = x.clone();
    act.forward_in_place(y.view_mut());
    let mut gb = g.clone();
    act.backward_in_place(y.view(), gb.view_mut());
    for (name, d) in devices("activation_elu") {
        let mut dx = up(&d, &x);
        let saved = dact::forward_save(act, dx.view_mut()).unwrap();
        assert_close(&format!("{name}: ELU forward"), down(&dx).view(), y.view());
        assert!(matches!(saved, DevSaved::Output(_)));
        let mut dg = up(&d, &g);
        dact::backward_in_place(act, up(&d, &y).view(), dg.view_mut()).unwrap();
        assert_bitwise(
            &format!("{name}: ELU backward"),
            down(&dg).view(),
            gb.view(),
        );
    }
}

// ---- dropout ---------------------------------------------------------------------------------

/// The kept bits `mask` gives rows keyed `keys` of `cols` columns, in KeptBits' padded layout,
/// from the CPU's own per-element decision.
fn expected_kept(mask: &DropoutMask, keys: &[u64], cols: usize) -> Vec<u64> {
    let words = cols.div_ceil(64);
    let mut bits = vec![0u64; keys.len() * words];
    for (r, &k) in keys.iter().enumerate() {
        for c in 0..cols {
            if mask.keep(k, c) {
                bits[r * words + c / 64] |= 1 << (c % 64);
            }
        }
    }
    bits
}

#[test]
fn dropout_masks_and_bits_are_bitwise_the_cpus() {
    let mut rng = Rng(6);
    for &(rows, cols, p) in &[
        (41, 70, 0.4f32),
        (13, 128, 0.5),
        (9, 5, 0.1),
        (7, 33, 0.0),
        (0, 8, 0.5),
    ] {
        let x = rng.matrix(rows, cols);
        let g = rng.matrix(rows, cols);
        let keys: Vec<u64> = (0..rows).map(|_| rng.next() >> 20).collect();
        let stream = rng.next();
        let mask = DropoutMask::new(stream, p);
        let (y, kept) = mask.apply_recorded(x.view(), &keys);
        let mut gk = g.clone();
        kept.apply_in_place(gk.view_mut());
        let bits = expected_kept(&mask, &keys, cols);
        let dmask = DevDropout::new(stream, p);
        assert_eq!(dmask.scale, mask.scale(), "scale");
        for (name, d) in devices("dropout") {
            let dkeys = DevVec::upload(&d, &keys).unwrap();
            let seeds = DevRowSeeds::from_mask(&d, &mask, &keys).unwrap();
            for (how, rm) in [
                ("keys", RowMask::Keys(&dmask, &dkeys)),
                ("seeds", RowMask::Seeds(&seeds)),
            ] {
                let what = |op: &str| format!("{name}: {op} ({how}) {rows}×{cols} p={p}");
                let dx = up(&d, &x);
                let (dy, dkept) = ddrop::apply_recorded(dx.view(), rm).unwrap();
                assert_bitwise(&what("apply_recorded"), down(&dy).view(), y.view());
                assert_eq!(
                    dkept.bits.download().unwrap(),
                    bits,
                    "{}",
                    what("kept bits")
                );
                let mut dxi = up(&d, &x);
                let k2 = ddrop::apply_recorded_in_place(dxi.view_mut(), rm).unwrap();
                assert_bitwise(
                    &what("apply_recorded_in_place"),
                    down(&dxi).view(),
                    y.view(),
                );
                assert_eq!(
                    k2.bits.download().unwrap(),
                    bits,
                    "{}",
                    what("kept bits in place")
                );
                let plain = ddrop::apply(dx.view(), rm).unwrap();
                assert_bitwise(&what("apply"), down(&plain).view(), y.view());
                let mut dg = up(&d, &g);
                ddrop::apply_in_place(dg.view_mut(), rm).unwrap();
                assert_bitwise(
                    &what("apply_in_place (backward by keys)"),
                    down(&dg).view(),
                    gk.view(),
                );
                let mut dg = up(&d, &g);
                dkept.apply_in_place(dg.view_mut()).unwrap();
                assert_bitwise(&what("kept bits backward"), down(&dg).view(), gk.view());
            }
        }
    }
}

#[test]
fn kept_bits_and_relu_signs_combine_as_on_the_cpu() {
    let mut rng = Rng(7);
    let (rows, cols) = (23, 128);
    let x = rng.matrix(rows, cols);
    let keys: Vec<u64> = (0..rows as u64).map(|k| k * 7 + 3).collect();
    let mask = DropoutMask::new(99, 0.3);
    let (_, kept) = mask.apply_recorded(x.view(), &keys);
    let mut h = rng.matrix(rows, cols);
    let positive = cpu_bits(Activation::Relu.forward_save(h.view_mut()));
    let both = kept.and_positive(cols, &positive).expect("whole words");
    let g = rng.matrix(rows, cols);
    let mut expect = g.clone();
    both.apply_in_place(expect.view_mut());
    assert!(kept.and_positive(70, &positive).is_none());
    for (name, d) in devices("and_positive") {
        let (_, dkept) = ddrop::apply_recorded(
            up(&d, &x).view(),
            RowMask::Seeds(&DevRowSeeds::from_mask(&d, &mask, &keys).unwrap()),
        )
        .unwrap();
        let dpos = DevVec::upload(&d, &positive).unwrap();
        let dboth = dkept
            .and_positive(cols, &dpos)
            .unwrap()
            .expect("whole words");
        let mut dg = up(&d, &g);
        dboth.apply_in_place(dg.view_mut()).unwrap();
        assert_bitwise(
            &format!("{name}: and_positive"),
            down(&dg).view(),
            expect.view(),
        );
        assert!(dkept.and_positive(70, &dpos).unwrap().is_none());
    }
}

// ---- the product's epilogue ----------------------------------------------------------------

#[test]
fn epilogues_are_bitwise_the_cpus_given_the_same_product() {
    let mut rng = Rng(8);
    for &(m, k, n, relu, drop) in &[
        (37, 20, 128, true, true),
        (37, 20, 70, true, false),
        (5, 9, 64, false, true),
        (16, 3, 7, false, false),
        (0, 4, 64, true, true),
    ] {
        let a = rng.matrix(m, k);
        let b = rng.matrix(k, n);
        let bias = rng.vec(n);
        let keys: Vec<u64> = (0..m as u64).map(|i| i * 31 + 5).collect();
        let stream = 0xfeed_u64 + n as u64;
        let mask = DropoutMask::new(stream, 0.45);
        let row_dropout = mask.fused(&keys).expect("p > 0");
        let onto = rng.matrix(m, n);
        for (name, d) in devices("epilogue") {
            let (da, db) = (up(&d, &a), up(&d, &b));
            let dbias = up(&d, &row(&bias));
            // The device's own product, read back, is the CPU epilogue's input: an empty
            // inner dimension makes the CPU's product `onto + 0`, exactly `onto`.
            let product = down(&blas::matmul(da.view(), db.view()).unwrap());
            let empty_a = Array2::<f32>::zeros((m, 0));
            let empty_b = Array2::<f32>::zeros((0, n));
            let (expect, expect_bits, expect_kept) = cpu::gemm::matmul_onto_bias_relu(
                Some(product.clone()),
                empty_a.view(),
                empty_b.view(),
                Some(&bias),
                relu,
                drop.then_some(&row_dropout),
            );
            let dkeys = DevVec::upload(&d, &keys).unwrap();
            let dmask = DevDropout::new(stream, 0.45);
            let seeds = DevRowSeeds::from_row_dropout(&d, &row_dropout).unwrap();
            for (how, rm) in [
                ("keys", RowMask::Keys(&dmask, &dkeys)),
                ("seeds", RowMask::Seeds(&seeds)),
            ] {
                let what = |op: &str| {
                    format!("{name}: {op} ({how}) {m}×{k}·{k}×{n} relu {relu} drop {drop}")
                };
                let (c, bits, kept) = depi::matmul_onto_bias_relu(
                    None,
                    da.view(),
                    db.view(),
                    Some(dbias.view()),
                    relu,
                    drop.then_some(rm),
                )
                .unwrap();
                assert_bitwise(&what("epilogue"), down(&c).view(), expect.view());
                assert_eq!(
                    bits.map(|b| b.download().unwrap()),
                    expect_bits.clone(),
                    "{}",
                    what("ReLU bits")
                );
                assert_eq!(
                    kept.map(|k| k.bits.download().unwrap()),
                    expect_kept.clone(),
                    "{}",
                    what("kept bits")
                );
            }
            // Onto an existing matrix: the product itself within tolerance of the CPU's.
            let (cpu_onto, _, _) = cpu::gemm::matmul_onto_bias_relu(
                Some(onto.clone()),
                a.view(),
                b.view(),
                Some(&bias),
                relu,
                None,
            );
            let (c, _, _) = depi::matmul_onto_bias_relu(
                Some(up(&d, &onto)),
                da.view(),
                db.view(),
                Some(dbias.view()),
                relu,
                None,
            )
            .unwrap();
            let bound =
                abs_product(a.view(), b.view()) + onto.mapv(f32::abs) + row(&bias).mapv(f32::abs);
            assert_product_close(
                &format!("{name}: onto + product"),
                down(&c).view(),
                cpu_onto.view(),
                bound.view(),
                k,
            );
            // The bias alone (`add_to_rows`).
            let mut z = product.clone();
            cpu::gather::add_to_rows(z.view_mut(), &bias);
            let mut dz = up(&d, &product);
            depi::add_bias(dz.view_mut(), dbias.view()).unwrap();
            assert_bitwise(&format!("{name}: add_bias"), down(&dz).view(), z.view());
        }
    }
}

// ---- aggregation -------------------------------------------------------------------------

/// Every weighting of `block` on the host: its GCN factors and per-edge weights.
fn weightings(rng: &mut Rng, block: &Block) -> (GcnNorm, Vec<f32>) {
    let degrees: Vec<u32> = (0..3 * block.num_src() as u32 + 2)
        .map(|_| rng.below(20) as u32)
        .collect();
    (
        GcnNorm::new(block, Some(&degrees)),
        rng.vec(block.num_edges()),
    )
}

#[test]
fn aggregations_and_their_transposes_are_bitwise_the_cpus() {
    let mut rng = Rng(9);
    for &(num_dst, num_src, cols) in &[(23, 61, 7), (12, 40, 130), (6, 6, 33), (0, 5, 4), (4, 9, 1)]
    {
        let blk = block(&mut rng, num_dst, num_src);
        let bt = BlockTranspose::new(&blk);
        let (norm, per_edge) = weightings(&mut rng, &blk);
        let x = rng.matrix(num_src, cols);
        let dy = rng.matrix(num_dst, cols);
        let d2 = rng.matrix(num_dst, 2 * cols);
        let keys: Vec<u64> = (0..num_src as u64).map(|i| i + 1000).collect();
        let (_, kept) =
            DropoutMask::new(5, 0.3).apply_recorded(rng.matrix(num_src, cols).view(), &keys);
        let kinds: [(&str, EdgeWeights); 4] = [
            ("sum", EdgeWeights::Sum),
            ("mean", EdgeWeights::Mean),
            ("per-edge", EdgeWeights::PerEdge(&per_edge)),
            ("gcn", norm.weights()),
        ];
        for (name, d) in devices("aggregate") {
            let g = DevGraph::new(&d, blk.clone()).unwrap();
            let lazy = DevTranspose::default();
            let t = lazy.get(&g).unwrap();
            assert!(lazy.is_built());
            let (dx, ddy, dd2) = (up(&d, &x), up(&d, &dy), up(&d, &d2));
            let (_, dkept) = ddrop::apply_recorded(
                up(&d, &Array2::zeros((num_src, cols))).view(),
                RowMask::Seeds(
                    &DevRowSeeds::from_mask(&d, &DropoutMask::new(5, 0.3), &keys).unwrap(),
                ),
            )
            .unwrap();
            for (kind, w) in kinds {
                let what = |op: &str| format!("{name}: {op} {kind} {num_dst}→{num_src} × {cols}");
                let dw = DevWeights::upload(&d, w).unwrap();
                let expect = cpu::aggregate::aggregate(&blk, x.view(), w);
                let got = dagg::aggregate(&g, dx.view(), &dw).unwrap();
                assert_bitwise(&what("aggregate"), down(&got).view(), expect.view());
                let expect = cpu::aggregate::aggregate_beside(&blk, x.view(), w);
                let got = dagg::aggregate_beside(&g, dx.view(), &dw).unwrap();
                assert_bitwise(&what("aggregate_beside"), down(&got).view(), expect.view());
                let expect = cpu::aggregate::aggregate_transpose(&blk, &bt, dy.view(), w);
                let got = dagg::aggregate_transpose(&g, t, ddy.view(), &dw).unwrap();
                assert_bitwise(
                    &what("aggregate_transpose"),
                    down(&got).view(),
                    expect.view(),
                );
                for with_kept in [false, true] {
                    // (The CPU's transpose_rows slices its empty input out of range when a
                    // block has no destinations: the answer is zeros.)
                    let expect = if num_dst == 0 {
                        Array2::zeros((num_src, cols))
                    } else {
                        cpu::aggregate::aggregate_transpose_beside(
                            &blk,
                            &bt,
                            d2.view(),
                            w,
                            with_kept.then_some(&kept),
                        )
                    };
                    let got = dagg::aggregate_transpose_beside(
                        &g,
                        g.transpose().unwrap(),
                        dd2.view(),
                        &dw,
                        with_kept.then_some(&dkept),
                    )
                    .unwrap();
                    assert_bitwise(
                        &what(&format!("aggregate_transpose_beside (kept {with_kept})")),
                        down(&got).view(),
                        expect.view(),
                    );
                }
            }
            // A host transpose uploaded with the graph is the same one.
            let g2 = DevGraph::from_block(&d, &blk, Some(&bt)).unwrap();
            let t2 = g2.transpose().unwrap();
            assert_eq!(t2.dst.download().unwrap(), bt.dst);
            assert_eq!(t2.edge.download().unwrap(), bt.edge);
        }
    }
}

// ---- GAT ------------------------------------------------------------------------------------

#[test]
fn attention_matches_the_cpu() {
    let mut rng = Rng(10);
    for &(num_dst, num_src, heads, f) in
        &[(17, 45, 3, 5), (9, 30, 2, 33), (6, 6, 1, 1), (0, 4, 2, 3)]
    {
        let blk = block(&mut rng, num_dst, num_src);
        let bt = BlockTranspose::new(&blk);
        let cols = heads * f;
        let wh = rng.matrix(num_src, cols);
        let att_src = rng.matrix(heads, f);
        let att_dst = rng.matrix(heads, f);
        let el = cpu::attention::node_logits(wh.view(), att_src.view(), num_src);
        let er = cpu::attention::node_logits(wh.view(), att_dst.view(), num_dst);
        let alpha = cpu::attention::edge_softmax(&blk, el.view(), er.view(), 0.2);
        let out = cpu::attention::attention_aggregate(&blk, alpha.view(), wh.view());
        let d_out = rng.matrix(num_dst, cols);
        let grads = cpu::attention::attention_backward(
            &cpu::attention::AttentionInputs {
                block: &blk,
                transpose: &bt,
                wh: wh.view(),
                el: el.view(),
                er: er.view(),
                alpha: alpha.view(),
                att_src: att_src.view(),
                att_dst: att_dst.view(),
                slope: 0.2,
            },
            d_out.view(),
        );
        for (name, d) in devices("attention") {
            let what = |op: &str| format!("{name}: {op} {num_dst}→{num_src}, {heads}×{f}");
            let g = DevGraph::new(&d, blk.clone()).unwrap();
            let (dwh, das, dad) = (up(&d, &wh), up(&d, &att_src), up(&d, &att_dst));
            let del = dgat::node_logits(dwh.view(), das.view(), num_src).unwrap();
            let der = dgat::node_logits(dwh.view(), dad.view(), num_dst).unwrap();
            assert_bitwise(&what("node_logits (src)"), down(&del).view(), el.view());
            assert_bitwise(&what("node_logits (dst)"), down(&der).view(), er.view());
            // The softmax with the device's exp: within tolerance.
            let dalpha =
                dgat::edge_softmax(&g, up(&d, &el).view(), up(&d, &er).view(), 0.2).unwrap();
            assert_close(&what("edge_softmax"), down(&dalpha).view(), alpha.view());
            // Given the same attention, the aggregation is bitwise.
            let dal = up(&d, &alpha);
            let dout = dgat::attention_aggregate(&g, dal.view(), dwh.view()).unwrap();
            assert_bitwise(&what("attention_aggregate"), down(&dout).view(), out.view());
            let (del, der) = (up(&d, &el), up(&d, &er));
            let dgrads = dgat::attention_backward(
                &dgat::AttentionInputs {
                    graph: &g,
                    transpose: g.transpose().unwrap(),
                    wh: dwh.view(),
                    el: del.view(),
                    er: der.view(),
                    alpha: dal.view(),
                    att_src: das.view(),
                    att_dst: dad.view(),
                    slope: 0.2,
                },
                up(&d, &d_out).view(),
            )
            .unwrap();
            // Given the same forward values, the backward has no exp: bitwise.
            assert_bitwise(&what("d_wh"), down(&dgrads.d_wh).view(), grads.d_wh.view());
            assert_bitwise(
                &what("d_att_src"),
                down(&dgrads.d_att_src).view(),
                grads.d_att_src.view(),
            );
            assert_bitwise(
                &what("d_att_dst"),
                down(&dgrads.d_att_dst).view(),
                grads.d_att_dst.view(),
            );
        }
    }
}

#[test]
fn heads_average_and_spread_as_on_the_cpu() {
    let mut rng = Rng(11);
    let (rows, heads, f) = (29, 3, 7);
    let x = rng.matrix(rows, heads * f);
    let dz = rng.matrix(rows, f);
    let mean = cpu::attention::mean_heads(x.view(), heads, f);
    let spread = cpu::attention::spread_heads(dz.view(), heads, f);
    for (name, d) in devices("heads") {
        let got = dgat::mean_heads(up(&d, &x).view(), heads, f).unwrap();
        assert_bitwise(
            &format!("{name}: mean_heads"),
            down(&got).view(),
            mean.view(),
        );
        let got = dgat::spread_heads(up(&d, &dz).view(), heads, f).unwrap();
        assert_bitwise(
            &format!("{name}: spread_heads"),
            down(&got).view(),
            spread.view(),
        );
    }
}

// ---- layer norm ------------------------------------------------------------------------------

#[test]
fn layer_norm_matches_the_cpu() {
    let mut rng = Rng(12);
    for &(rows, dim) in &[(37, 70), (5, 256), (3, 1), (0, 8)] {
        let x = rng.matrix(rows, dim).mapv(|v| 3.0 * v + 0.5);
        let (gain, bias) = (rng.vec(dim), rng.vec(dim));
        let dy = rng.matrix(rows, dim);
        let (y, xhat_cpu, inv_cpu) = cpu::norm::layer_norm(x.view(), &gain, &bias, 1e-5);
        let g0 = rng.vec(dim);
        let (dx, sum_g, sum_b) =
            cpu::norm::layer_norm_backward(xhat_cpu.view(), &inv_cpu, &gain, dy.view());
        // The backend accumulates the sums into the gradients (`grad += Σ`).
        let (mut dg, mut db) = (g0.clone(), g0.clone());
        cpu::gather::axpy(1.0, sum_g.as_slice().unwrap(), &mut dg);
        cpu::gather::axpy(1.0, sum_b.as_slice().unwrap(), &mut db);
        for (name, d) in devices("layer_norm") {
            let what = |op: &str| format!("{name}: layer norm {op} {rows}×{dim}");
            let (dgain, dbias) = (up(&d, &row(&gain)), up(&d, &row(&bias)));
            let (gy, xhat, inv_std) =
                dnorm::layer_norm(up(&d, &x).view(), dgain.view(), dbias.view(), 1e-5).unwrap();
            assert_bitwise(&what("y"), down(&gy).view(), y.view());
            assert_bitwise(&what("xhat"), down(&xhat).view(), xhat_cpu.view());
            assert_eq!((inv_std.rows(), inv_std.cols()), (rows, 1));
            assert_eq!(inv_std.download().unwrap(), inv_cpu, "{}", what("1/std"));
            let mut gg = up(&d, &row(&g0));
            let mut gb = up(&d, &row(&g0));
            let gdx = dnorm::layer_norm_backward(
                xhat.view(),
                inv_std.view(),
                dgain.view(),
                up(&d, &dy).view(),
                gg.view_mut(),
                gb.view_mut(),
            )
            .unwrap();
            assert_bitwise(&what("dx"), down(&gdx).view(), dx.view());
            assert_bitwise(&what("d_gain"), down(&gg).view(), row(&dg).view());
            assert_bitwise(&what("d_bias"), down(&gb).view(), row(&db).view());
        }
    }
}

// ---- losses ----------------------------------------------------------------------------------

#[track_caller]
fn assert_loss(what: &str, got: f64, expect: f64) {
    assert!(
        (got - expect).abs() <= 1e-5 * expect.abs().max(1e-6),
        "{what}: loss {got} vs CPU {expect}"
    );
}

#[test]
fn losses_match_the_cpu() {
    let mut rng = Rng(13);
    for &(rows, classes) in &[(45, 7), (9, 40), (3, 1), (0, 3)] {
        let logits = rng.matrix(rows, classes).mapv(|v| 4.0 * v);
        let labels: Vec<i64> = (0..rows).map(|_| rng.below(classes) as i64).collect();
        let (loss, grad) = cpu::loss::cross_entropy(&logits, &labels);
        let grad_scaled = grad.mapv(|g| g * 0.25);
        let targets = Array2::from_shape_fn((rows, classes), |_| {
            (rng.below(3) == 0) as i64 * (1 + rng.below(2) as i64)
        });
        let (bce, bgrad) = cpu::loss::bce_with_logits(&logits, targets.view());
        for (name, d) in devices("losses") {
            let what = |op: &str| format!("{name}: {op} {rows}×{classes}");
            let dl = up(&d, &logits);
            let (l, g) = dloss::cross_entropy_host(dl.view(), &labels, 0.25).unwrap();
            assert_loss(&what("cross_entropy"), l, loss);
            assert_close(
                &what("cross_entropy grad"),
                down(&g).view(),
                grad_scaled.view(),
            );
            let (l, g) = dloss::bce_with_logits_host(dl.view(), targets.view(), 1.0).unwrap();
            assert_loss(&what("bce"), l, bce);
            assert_close(&what("bce grad"), down(&g).view(), bgrad.view());
        }
    }
}

// ---- Adam ----------------------------------------------------------------------------------

/// The CPU's Adam after `steps` steps from `grads`, starting from `values`.
fn cpu_adam(values: &[f32], grads: &[Vec<f32>], lr: f32, wd: f32, decoupled: bool) -> Vec<f32> {
    let mut opt = gnnpar::nn::adam::Adam::new(values.len(), lr, wd);
    opt.decoupled = decoupled;
    let mut p = values.to_vec();
    for g in grads {
        opt.step(&mut p, g);
    }
    p
}

/// Step `t`'s constants as `nn::adam::Adam::step` computes them.
fn adam_constants(t: i32, lr: f32, wd: f32, decoupled: bool) -> AdamStep {
    let (beta1, beta2) = (0.9f32, 0.999f32);
    let bc1 = 1.0 - (beta1 as f64).powi(t);
    let bc2 = 1.0 - (beta2 as f64).powi(t);
    AdamStep {
        beta1,
        beta2,
        lr,
        weight_decay: wd,
        eps: 1e-8,
        decoupled,
        step_size: (lr as f64 / bc1) as f32,
        bc2_sqrt: bc2.sqrt() as f32,
    }
}

#[test]
fn adam_is_bitwise_the_cpus() {
    let mut rng = Rng(14);
    let n = 1000;
    let values = rng.vec(n);
    let grads: Vec<Vec<f32>> = (0..4).map(|_| rng.vec(n)).collect();
    for &(wd, decoupled) in &[(0.0f32, false), (0.01, false), (0.05, true)] {
        let expect = cpu_adam(&values, &grads, 0.01, wd, decoupled);
        for (name, d) in devices("adam") {
            let mut p = up(&d, &row(&values));
            let mut m = DevMat::zeros(&d, 1, n).unwrap();
            let mut v = DevMat::zeros(&d, 1, n).unwrap();
            for (t, g) in grads.iter().enumerate() {
                let step = adam_constants(t as i32 + 1, 0.01, wd, decoupled);
                let dg = up(&d, &row(g));
                dadam::adam_step(p.view_mut(), dg.view(), m.view_mut(), v.view_mut(), step)
                    .unwrap();
            }
            assert_bitwise(
                &format!("{name}: adam wd {wd} decoupled {decoupled}"),
                down(&p).view(),
                row(&expect).view(),
            );
        }
    }
}

#[test]
fn views_read_back_what_they_cover() {
    let mut rng = Rng(15);
    let x = rng.matrix(10, 6);
    for (name, d) in devices("views") {
        let dx = up(&d, &x);
        assert_bitwise(
            &format!("{name}: row range"),
            down_view(dx.view().row_range(2..5)).view(),
            x.slice(ndarray::s![2..5, ..]),
        );
    }
}
