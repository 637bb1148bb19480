//! gnnpar's products (the `gemm` crate in blocks fixed by the shape, with its bias / ReLU /
//! dropout epilogue per block, and `sparse_rows`' listing of the zeros below a ReLU and a
//! dropout) against the `gemm` crate called on the whole product and OpenBLAS, on the
//! products of a GraphSAGE training step, in one run (issue 13). See `benchmarks/README.md`
//! (`gemm.sh`).
//!
//! ```text
//! gnnpar-gemm-bench [--data NAME=FILE.h5]... [--threads 1,N] [--rounds 4] [--min-reps 8] [--min-time 0.3]
//!                   [--json FILE] [--md FILE] [--shapes-only] [--only TEXT]
//! ```
//!
//! Prints one JSON object per (product, implementation, thread count) on stdout, then the
//! markdown report; `--json` and `--md` also write them to files.

mod openblas;
mod shapes;

use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use gnnpar::backend::cpu::activation::{Activation, Saved};
use gnnpar::backend::cpu::bitmask::RowHash;
use gnnpar::backend::cpu::dropout::{mask_row_recorded, DropoutMask};
use gnnpar::backend::cpu::gather::add_to_rows;
use gnnpar::backend::cpu::gemm::{
    add_matmul_tn, describe_split, matmul, matmul_bias_relu, matmul_bias_relu_dropout, matmul_nt,
    RowDropout,
};
use gnnpar::backend::cpu::Cpu;
use gnnpar::backend::Backend;
use ndarray::{Array2, ArrayView2, ArrayViewMut2};
use rayon::prelude::*;
use serde_json::json;

use shapes::StepShape;

/// The products benchmarked. Product dimensions are always `C[m×n] = A[m×k]·B[k×n]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Op {
    /// `[h_dst | mean]·[W_self; W_neigh]`, the plain product.
    Fwd,
    /// The output layer's forward: product + bias (no activation).
    FwdBias,
    /// A hidden layer's forward with bias and ReLU (recording the signs).
    FwdBiasRelu,
    /// ... and the next layer's input dropout (recording the kept bits): what the step runs.
    FwdBiasReluDrop,
    /// Weight gradient `Xᵀ·dY` accumulated into the gradient (`add_matmul_tn`).
    WGrad,
    /// Input gradient `dY·Wᵀ` (`matmul_nt`).
    DGrad,
    /// A square product, for context.
    Square,
}

impl Op {
    fn name(self) -> &'static str {
        match self {
            Op::Fwd => "fwd",
            Op::FwdBias => "fwd+bias",
            Op::FwdBiasRelu => "fwd+bias+relu",
            Op::FwdBiasReluDrop => "fwd+bias+relu+dropout",
            Op::WGrad => "wgrad",
            Op::DGrad => "dgrad",
            Op::Square => "square",
        }
    }

    /// The expression, for the table.
    fn formula(self) -> &'static str {
        match self {
            Op::Fwd => "[h_dst|mean]·W",
            Op::FwdBias => "[h_dst|mean]·W + b",
            Op::FwdBiasRelu => "relu([h_dst|mean]·W + b)",
            Op::FwdBiasReluDrop => "drop(relu([h_dst|mean]·W + b))",
            Op::WGrad => "dW += Xᵀ·dY",
            Op::DGrad => "dX = dY·Wᵀ",
            Op::Square => "A·B",
        }
    }

    fn has_bias(self) -> bool {
        matches!(self, Op::FwdBias | Op::FwdBiasRelu | Op::FwdBiasReluDrop)
    }
}

const IMPLS: [&str; 3] = ["gnnpar", "gemm", "openblas"];

/// Dropout rate of the hidden layers' inputs in `inputs/sage-bench.toml`.
const DROP_P: f32 = 0.5;
/// Fraction of non-zeros left of a hidden layer's output by its ReLU and the next layer's
/// dropout (a half each), in the left operand of the products that skip zeros.
const KEEP_LEFT: f64 = 0.25;
/// A result further than this from the reference (relative to `Σ|a||b|`) is wrong.
const ERR_LIMIT: f64 = 1e-4;

#[derive(Clone, Debug)]
struct Case {
    dataset: String,
    layer: Option<usize>,
    op: Op,
    formula: String,
    m: usize,
    k: usize,
    n: usize,
    /// Whether this product (with this epilogue) is one a real step runs through the GEMM.
    in_step: bool,
    /// gnnpar runs the call the step makes for an input gradient, which may skip the zeros of
    /// the left operand (`Backend::matmul_nt_sparse_left`); otherwise the plain product.
    step_call: bool,
    /// The left operand has [`KEEP_LEFT`] non-zeros, as below another layer's ReLU and
    /// dropout; dense otherwise.
    sparse_left: bool,
    /// The same product as a step's case with `step_call`, by gnnpar's plain product: what the
    /// step would cost without skipping zeros.
    dense_twin: bool,
    note: String,
}

impl Case {
    fn flops(&self) -> f64 {
        2.0 * self.m as f64 * self.k as f64 * self.n as f64
    }

    fn shape(&self) -> String {
        format!("{}×{}×{}", self.m, self.k, self.n)
    }

    fn label(&self) -> String {
        match self.layer {
            Some(l) => format!("{} L{l}", self.dataset),
            None => self.dataset.clone(),
        }
    }

    /// The op's name in the per-op table (products with a mostly-zero left operand apart).
    fn op_label(&self) -> String {
        match (self.sparse_left, self.step_call) {
            (false, _) => self.op.name().to_string(),
            (true, true) => format!("{}, left ¼ non-zero, zeros skipped", self.op.name()),
            (true, false) => format!("{}, left ¼ non-zero, dense product", self.op.name()),
        }
    }
}

/// The products of one step on `s`, as `nn::sage` runs them: one product per direction where
/// a layer aggregates first, two where it projects first (a thin output layer); none of the
/// first layer's where the features are sparse (the step multiplies CSR rows there: those
/// products are still measured, but not counted in the step).
fn step_cases(s: &StepShape) -> Vec<Case> {
    let mut cases = Vec::new();
    let last = s.layers.len() - 1;
    for (l, ly) in s.layers.iter().enumerate() {
        let (i, o) = (ly.in_dim, ly.out_dim);
        let sparse = l == 0 && s.sparse_input;
        let note = if sparse {
            "sparse features: the step multiplies CSR rows here (backend::cpu::sparse), not this GEMM"
        } else {
            ""
        };
        // `step_call`, `sparse_left`, `dense_twin`.
        type How = (bool, bool, bool);
        const PLAIN: How = (false, false, false);
        let mut push =
            |op: Op, formula: &str, (m, k, n): (usize, usize, usize), in_step: bool, how: How| {
                let (step_call, sparse_left, dense_twin) = how;
                let formula = match (sparse_left, dense_twin) {
                    (false, _) => formula.to_string(),
                    (true, false) => format!("{formula}, left ¼ non-zero"),
                    (true, true) => format!("{formula}, left ¼ non-zero, dense product"),
                };
                cases.push(Case {
                    dataset: s.dataset.clone(),
                    layer: Some(l),
                    op,
                    formula,
                    m,
                    k,
                    n,
                    in_step: in_step && !sparse,
                    step_call,
                    sparse_left,
                    dense_twin,
                    note: note.to_string(),
                })
            };
        if sparse {
            // Not in the step: the plain product and the weight gradient, for the record.
            push(Op::Fwd, Op::Fwd.formula(), (ly.nd, 2 * i, o), false, PLAIN);
            push(
                Op::WGrad,
                Op::WGrad.formula(),
                (2 * i, ly.nd, o),
                false,
                PLAIN,
            );
        } else if s.aggregate_first(l) {
            let fwd = (ly.nd, 2 * i, o);
            push(Op::Fwd, Op::Fwd.formula(), fwd, false, PLAIN);
            if l < last {
                push(
                    Op::FwdBiasRelu,
                    Op::FwdBiasRelu.formula(),
                    fwd,
                    false,
                    PLAIN,
                );
                // Dropout 0.5 between layers: the product below masks its output (fused).
                push(
                    Op::FwdBiasReluDrop,
                    Op::FwdBiasReluDrop.formula(),
                    fwd,
                    true,
                    PLAIN,
                );
            } else {
                push(Op::FwdBias, Op::FwdBias.formula(), fwd, true, PLAIN);
            }
            push(
                Op::WGrad,
                Op::WGrad.formula(),
                (2 * i, ly.nd, o),
                true,
                PLAIN,
            );
            if l > 0 {
                // The input layer needs no input gradient. Below another layer `dY` is zero
                // where this layer's ReLU was off or the next layer's dropout dropped the
                // output; the output layer's is dense. The step's product may skip zeros
                // (`matmul_nt_sparse_left`) in both.
                let hidden = l < last;
                push(
                    Op::DGrad,
                    Op::DGrad.formula(),
                    (ly.nd, o, 2 * i),
                    true,
                    (true, hidden, false),
                );
                if hidden {
                    push(
                        Op::DGrad,
                        Op::DGrad.formula(),
                        (ly.nd, o, 2 * i),
                        false,
                        (false, true, true),
                    );
                }
            }
        } else {
            // Project first (`SageConv::forward_relu`'s other branch, and `input_grad`).
            push(Op::Fwd, "h_in·W_neigh", (ly.ns, i, o), true, PLAIN);
            push(Op::Fwd, "h_dst·W_self (added)", (ly.nd, i, o), true, PLAIN);
            push(
                Op::WGrad,
                "dW_self += h_dstᵀ·dY",
                (i, ly.nd, o),
                true,
                PLAIN,
            );
            push(
                Op::WGrad,
                "dW_neigh += h_inᵀ·d_proj",
                (i, ly.ns, o),
                true,
                PLAIN,
            );
            if l > 0 {
                push(Op::DGrad, "d_proj·W_neighᵀ", (ly.ns, o, i), true, PLAIN);
                push(Op::DGrad, "dY·W_selfᵀ (added)", (ly.nd, o, i), true, PLAIN);
            }
        }
    }
    cases
}

fn square_cases() -> Vec<Case> {
    [512, 2048]
        .iter()
        .map(|&d| Case {
            dataset: format!("square {d}"),
            layer: None,
            op: Op::Square,
            formula: Op::Square.formula().to_string(),
            m: d,
            k: d,
            n: d,
            in_step: false,
            step_call: false,
            sparse_left: false,
            dense_twin: false,
            note: String::new(),
        })
        .collect()
}

/// Deterministic values in [-1, 1).
fn fill(rows: usize, cols: usize, seed: u64) -> Array2<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    Array2::from_shape_fn((rows, cols), |_| {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    })
}

/// The operands of a case: `a_store` is `m×k`, or `k×m` when `a_t` (A is its transpose);
/// likewise `b_store`.
struct Operands {
    a_store: Array2<f32>,
    a_t: bool,
    b_store: Array2<f32>,
    b_t: bool,
    bias: Vec<f32>,
    drop: RowDropout,
}

impl Operands {
    fn new(c: &Case, seed: u64) -> Operands {
        let (a_t, b_t) = match c.op {
            Op::WGrad => (true, false),
            Op::DGrad => (false, true),
            _ => (false, false),
        };
        let mut a_store = if a_t {
            fill(c.k, c.m, seed)
        } else {
            fill(c.m, c.k, seed)
        };
        if c.sparse_left {
            // Exact zeros at random places (a ReLU's and a dropout's).
            let pick = fill(c.m, c.k, seed + 3);
            a_store.zip_mut_with(&pick, |v, &p| {
                if (p as f64 + 1.0) / 2.0 >= KEEP_LEFT {
                    *v = 0.0;
                }
            });
        }
        let b_store = if b_t {
            fill(c.n, c.k, seed + 1)
        } else {
            fill(c.k, c.n, seed + 1)
        };
        let bias = fill(1, c.n, seed + 2).into_raw_vec_and_offset().0;
        let keys: Vec<u64> = (0..c.m as u64).map(|i| i * 31 + 5).collect();
        let drop = DropoutMask::new(seed, DROP_P).fused(&keys).expect("p > 0");
        Operands {
            a_store,
            a_t,
            b_store,
            b_t,
            bias,
            drop,
        }
    }

    fn a(&self) -> ArrayView2<'_, f32> {
        if self.a_t {
            self.a_store.t()
        } else {
            self.a_store.view()
        }
    }

    fn b(&self) -> ArrayView2<'_, f32> {
        if self.b_t {
            self.b_store.t()
        } else {
            self.b_store.view()
        }
    }
}

/// gnnpar's path for a case's product, in words.
fn gnnpar_path(c: &Case) -> String {
    if c.step_call && c.sparse_left {
        "zeros skipped (sparse_rows)".into()
    } else {
        describe_split(c.m, c.n, c.k)
    }
}

/// `c = a·b + beta·c` by a library; `c` is row-major `m×n`.
fn lib_product(
    lib: &str,
    threads: usize,
    a: ArrayView2<f32>,
    b: ArrayView2<f32>,
    beta: f32,
    c: *mut f32,
) {
    let ((m, k), n) = (a.dim(), b.ncols());
    match lib {
        "openblas" => {
            let (ta, lda) = openblas::layout(a.strides()[0], a.strides()[1], k);
            let (tb, ldb) = openblas::layout(b.strides()[0], b.strides()[1], n);
            // SAFETY: the views describe valid memory with these leading dimensions; `c` is
            // m×n row-major (not read when beta = 0).
            unsafe {
                openblas::cblas_sgemm(
                    openblas::ROW_MAJOR,
                    ta,
                    tb,
                    m as i32,
                    n as i32,
                    k as i32,
                    1.0,
                    a.as_ptr(),
                    lda,
                    b.as_ptr(),
                    ldb,
                    beta,
                    c,
                    n as i32,
                )
            }
        }
        "gemm" => {
            let par = if threads > 1 {
                gemm::Parallelism::Rayon(threads)
            } else {
                gemm::Parallelism::None
            };
            // SAFETY: as above; `read_dst` only when accumulating. The crate computes
            // dst = alpha·dst + beta·lhs·rhs.
            unsafe {
                gemm::gemm(
                    m,
                    n,
                    k,
                    c,
                    1,
                    n as isize,
                    beta != 0.0,
                    a.as_ptr(),
                    a.strides()[1],
                    a.strides()[0],
                    b.as_ptr(),
                    b.strides()[1],
                    b.strides()[0],
                    beta,
                    1.0,
                    false,
                    false,
                    false,
                    par,
                )
            }
        }
        other => panic!("unknown library {other}"),
    }
}

/// A fresh `m×n` product by a library (every element written).
fn lib_fresh(lib: &str, threads: usize, a: ArrayView2<f32>, b: ArrayView2<f32>) -> Array2<f32> {
    let (m, n) = (a.nrows(), b.ncols());
    let mut c = Array2::<f32>::uninit((m, n));
    lib_product(lib, threads, a, b, 0.0, c.as_mut_ptr().cast::<f32>());
    // SAFETY: beta = 0 writes every element.
    unsafe { c.assume_init() }
}

/// The epilogue a library user adds after the product: gnnpar's own separate passes (bias
/// rows, ReLU recording its signs, dropout recording its kept bits), as gnnpar's portable
/// path runs them.
fn separate_epilogue(
    op: Op,
    mut c: ArrayViewMut2<f32>,
    ops: &Operands,
) -> (Option<Vec<u64>>, Option<Vec<u64>>) {
    if !op.has_bias() {
        return (None, None);
    }
    add_to_rows(c.view_mut(), &ops.bias);
    if op == Op::FwdBias {
        return (None, None);
    }
    let bits = match Activation::Relu.forward_save(c.view_mut()) {
        Saved::Positive(bits) => bits,
        Saved::Output(_) => unreachable!("ReLU keeps signs"),
    };
    if op != Op::FwdBiasReluDrop {
        return (Some(bits), None);
    }
    let n = c.ncols();
    let words = n / 64;
    let mut kept = vec![0u64; c.nrows() * words];
    let d = &ops.drop;
    c.as_slice_mut()
        .expect("fresh product")
        .par_chunks_mut(n)
        .zip(kept.par_chunks_mut(words))
        .enumerate()
        .for_each(|(i, (row, bits))| {
            let hash = RowHash {
                seed: d.seeds[i],
                keep_below: d.keep_below,
                keep_all: false,
                scale: d.scale,
            };
            mask_row_recorded(hash, row, bits)
        });
    (Some(bits), Some(kept))
}

/// One call of `imp` on the case: a fresh output, or `acc` updated in place (`WGrad`).
fn run_once(
    imp: &str,
    threads: usize,
    case: &Case,
    ops: &Operands,
    acc: &mut Array2<f32>,
) -> Option<Array2<f32>> {
    let op = case.op;
    let (a, b) = (ops.a(), ops.b());
    if imp == "gnnpar" && case.step_call {
        // What `nn::sage` calls for `[d h_dst | d mean] = dY·[W_self; W_neigh]ᵀ`.
        assert_eq!(
            op,
            Op::DGrad,
            "only input gradients have a step call of their own"
        );
        return Some(Cpu.matmul_nt_sparse_left(ops.a_store.view(), ops.b_store.view()));
    }
    if imp == "gnnpar" {
        return match op {
            Op::Fwd | Op::Square => Some(matmul(a, b)),
            Op::FwdBias => Some(matmul_bias_relu(a, b, Some(&ops.bias), false).0),
            Op::FwdBiasRelu => Some(matmul_bias_relu(a, b, Some(&ops.bias), true).0),
            Op::FwdBiasReluDrop => {
                Some(matmul_bias_relu_dropout(a, b, Some(&ops.bias), true, &ops.drop).0)
            }
            Op::WGrad => {
                add_matmul_tn(ops.a_store.view(), ops.b_store.view(), acc.view_mut());
                None
            }
            Op::DGrad => Some(matmul_nt(ops.a_store.view(), ops.b_store.view())),
        };
    }
    if op == Op::WGrad {
        lib_product(imp, threads, a, b, 1.0, acc.as_mut_ptr());
        return None;
    }
    let mut c = lib_fresh(imp, threads, a, b);
    separate_epilogue(op, c.view_mut(), ops);
    Some(c)
}

/// The f64 reference `a·b` and `|a|·|b|` (OpenBLAS `dgemm`, all cores).
fn reference(ops: &Operands) -> (Array2<f64>, Array2<f64>) {
    // `mapv` keeps a transposed view's memory order: make both row-major for `dgemm`.
    let a = ops.a().mapv(f64::from).as_standard_layout().into_owned();
    let b = ops.b().mapv(f64::from).as_standard_layout().into_owned();
    let (m, k, n) = (a.nrows(), a.ncols(), b.ncols());
    let dgemm = |a: &Array2<f64>, b: &Array2<f64>| {
        let mut c = Array2::<f64>::zeros((m, n));
        // SAFETY: standard-layout operands of the right shapes.
        unsafe {
            openblas::cblas_dgemm(
                openblas::ROW_MAJOR,
                openblas::NO_TRANS,
                openblas::NO_TRANS,
                m as i32,
                n as i32,
                k as i32,
                1.0,
                a.as_ptr(),
                k as i32,
                b.as_ptr(),
                n as i32,
                0.0,
                c.as_mut_ptr(),
                n as i32,
            )
        };
        c
    };
    let r = dgemm(&a, &b);
    let (mut a, mut b) = (a, b);
    a.mapv_inplace(f64::abs);
    b.mapv_inplace(f64::abs);
    let abs = dgemm(&a, &b);
    (r, abs)
}

/// Largest `|c - expected| / Σ|a||b|` over the output (the epilogue applied to the reference).
fn max_rel_err(
    op: Op,
    c: ArrayView2<f32>,
    r: &Array2<f64>,
    abs: &Array2<f64>,
    ops: &Operands,
) -> f64 {
    let mut worst = 0f64;
    for ((i, j), &r) in r.indexed_iter() {
        let bias = if op.has_bias() {
            ops.bias[j] as f64
        } else {
            0.0
        };
        let mut e = r + bias;
        let mut denom = abs[[i, j]] + bias.abs();
        if matches!(op, Op::FwdBiasRelu | Op::FwdBiasReluDrop) {
            e = e.max(0.0);
        }
        if op == Op::FwdBiasReluDrop {
            let d = &ops.drop;
            let hash = RowHash {
                seed: d.seeds[i],
                keep_below: d.keep_below,
                keep_all: false,
                scale: d.scale,
            };
            if hash.keep(j) {
                e *= d.scale as f64;
                denom *= d.scale as f64;
            } else {
                e = 0.0;
            }
        }
        let err = (c[[i, j]] as f64 - e).abs() / denom.max(f64::MIN_POSITIVE);
        worst = worst.max(err);
    }
    worst
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

struct Settings {
    /// Rounds over the implementations per product and thread count, in alternating order
    /// (gnnpar, gemm, OpenBLAS, then the reverse), so that a drift in the machine's load
    /// does not favour whichever runs first.
    rounds: usize,
    min_reps: usize,
    max_reps: usize,
    min_time: f64,
}

#[derive(Clone, Debug)]
struct Measured {
    case: usize,
    imp: &'static str,
    threads: usize,
    seconds: f64,
    /// The fastest call: what the code does when nothing else takes the cores.
    min_seconds: f64,
    gflops: f64,
    reps: usize,
    max_rel_err: f64,
    /// Output bitwise the same as at the first thread count.
    same_bits: bool,
}

/// One call of `imp` on the case in `pool` (the first warm-up), checked against the
/// reference: the largest relative error, the seconds the call took, and a hash of the
/// output's bits (to see whether the thread count changes them).
fn check(
    pool: &rayon::ThreadPool,
    imp: &str,
    threads: usize,
    case: &Case,
    ops: &Operands,
    refs: &(Array2<f64>, Array2<f64>),
) -> (f64, f64, u64) {
    openblas::set_threads(threads);
    pool.install(|| {
        let mut acc = Array2::<f32>::zeros(accumulator_shape(case));
        let t = Instant::now();
        let out = run_once(imp, threads, case, ops, &mut acc);
        let secs = t.elapsed().as_secs_f64();
        let c = out.as_ref().unwrap_or(&acc);
        let err = max_rel_err(case.op, c.view(), &refs.0, &refs.1, ops);
        let hash = c.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, v| {
            (h ^ v.to_bits() as u64).wrapping_mul(0x0100_0000_01b3)
        });
        (err, secs, hash)
    })
}

fn accumulator_shape(case: &Case) -> (usize, usize) {
    if case.op == Op::WGrad {
        (case.m, case.n)
    } else {
        (0, 0)
    }
}

/// Seconds of successive calls of `imp` on the case in `pool` (after one untimed call when
/// `warm_up`): at least `min_reps` and `min_time` seconds of them, at most `max_reps`.
#[allow(clippy::too_many_arguments)]
fn time_block(
    pool: &rayon::ThreadPool,
    imp: &str,
    threads: usize,
    case: &Case,
    ops: &Operands,
    min_reps: usize,
    min_time: f64,
    max_reps: usize,
    warm_up: bool,
) -> Vec<f64> {
    openblas::set_threads(threads);
    pool.install(|| {
        let mut acc = Array2::<f32>::zeros(accumulator_shape(case));
        if warm_up {
            drop(run_once(imp, threads, case, ops, &mut acc));
        }
        let mut times = Vec::new();
        let start = Instant::now();
        while times.len() < max_reps
            && (times.len() < min_reps || start.elapsed().as_secs_f64() < min_time)
        {
            let t = Instant::now();
            let out = run_once(imp, threads, case, ops, &mut acc);
            times.push(t.elapsed().as_secs_f64());
            drop(out);
        }
        times
    })
}

/// User + system CPU seconds of this process so far.
fn cpu_seconds() -> f64 {
    // SAFETY: getrusage fills the struct it is given.
    unsafe {
        let mut u: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut u);
        let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
        tv(u.ru_utime) + tv(u.ru_stime)
    }
}

fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|s| s.trim().to_string())
        })
        .unwrap_or_else(|| "unknown".into())
}

fn isa_name() -> &'static str {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            return "AVX-512";
        }
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
        {
            return "AVX2 + FMA";
        }
    }
    "no AVX2"
}

fn gnnpar_kernel() -> String {
    format!(
        "the gemm crate ({}), in blocks of the output fixed by the shape, epilogue per block",
        gnnpar::backend::cpu::gemm::kernels()
    )
}

fn gemm_kernel() -> &'static str {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            return "AVX-512 (feature x86-v4)";
        }
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
        {
            return "AVX2 + FMA";
        }
    }
    "scalar / SSE"
}

struct Args {
    data: Vec<(String, PathBuf)>,
    threads: Vec<usize>,
    set: Settings,
    json: Option<PathBuf>,
    md: Option<PathBuf>,
    shapes_only: bool,
    /// Only the products whose label and formula contain this (e.g. `tolokers L1`).
    only: Option<String>,
}

fn parse_args() -> Args {
    let mut args = Args {
        data: Vec::new(),
        threads: Vec::new(),
        set: Settings {
            rounds: 4,
            min_reps: 8,
            max_reps: 30,
            min_time: 0.3,
        },
        json: None,
        md: None,
        shapes_only: false,
        only: None,
    };
    let mut it = std::env::args().skip(1);
    let usage = "usage: gnnpar-gemm-bench [--data NAME=FILE.h5]... [--threads 1,N] [--rounds 4] [--min-reps 8] \
                 [--max-reps 30] [--min-time 0.3] [--json FILE] [--md FILE] [--shapes-only] [--only TEXT]";
    while let Some(a) = it.next() {
        let mut val = || {
            it.next()
                .unwrap_or_else(|| panic!("{a} needs a value\n{usage}"))
        };
        match a.as_str() {
            "--data" => {
                let v = val();
                let (name, path) = v
                    .split_once('=')
                    .unwrap_or_else(|| panic!("--data NAME=FILE\n{usage}"));
                args.data.push((name.to_string(), PathBuf::from(path)));
            }
            "--threads" => {
                args.threads = val()
                    .split(',')
                    .map(|t| t.trim().parse().expect("--threads: numbers"))
                    .collect()
            }
            "--rounds" => args.set.rounds = val().parse::<usize>().expect("--rounds").max(1),
            "--min-reps" => args.set.min_reps = val().parse().expect("--min-reps"),
            "--max-reps" => args.set.max_reps = val().parse().expect("--max-reps"),
            "--min-time" => args.set.min_time = val().parse().expect("--min-time"),
            "--json" => args.json = Some(PathBuf::from(val())),
            "--md" => args.md = Some(PathBuf::from(val())),
            "--shapes-only" => args.shapes_only = true,
            "--only" => args.only = Some(val()),
            "-h" | "--help" => {
                println!("{usage}");
                std::process::exit(0);
            }
            other => panic!("unknown argument {other}\n{usage}"),
        }
    }
    if args.threads.is_empty() {
        let n = std::thread::available_parallelism().map_or(1, |n| n.get());
        args.threads = vec![1, n];
    }
    args.threads.dedup();
    args.set.max_reps = args.set.max_reps.max(args.set.min_reps);
    args
}

fn main() {
    let args = parse_args();
    // As `gnnpar train` does: freed blocks are reused instead of returned to the kernel, so
    // fresh outputs do not fault their pages in again at every call.
    gnnpar::backend::cpu::memory::keep_freed_memory();

    let mut steps: Vec<StepShape> = Vec::new();
    for (name, path) in &args.data {
        let s = if path.exists() {
            shapes::sample_step(name, path).unwrap_or_else(|e| panic!("{name}: {e}"))
        } else {
            eprintln!(
                "{name}: {} not found, using the recorded row counts",
                path.display()
            );
            shapes::recorded(name).unwrap_or_else(|| panic!("{name}: no recorded shapes"))
        };
        steps.push(s);
    }
    if args.data.is_empty() {
        for name in ["tolokers", "facebook", "sbm200k"] {
            steps.push(shapes::recorded(name).expect("recorded"));
        }
    }
    for s in &steps {
        let layers: Vec<_> = s
            .layers
            .iter()
            .enumerate()
            .map(|(l, ly)| {
                json!({"layer": l, "num_dst": ly.nd, "num_src": ly.ns, "edges": ly.e,
                       "in": ly.in_dim, "out": ly.out_dim,
                       "aggregate_first": s.aggregate_first(l)})
            })
            .collect();
        println!(
            "{}",
            json!({"step": s.dataset, "source": s.source, "sparse_input": s.sparse_input,
                   "nodes": s.layers.iter().map(|l| l.nd).sum::<usize>(),
                   "input_rows": s.layers[0].ns, "layers": layers})
        );
    }
    if args.shapes_only {
        return;
    }

    let mut cases: Vec<Case> = steps.iter().flat_map(step_cases).collect();
    cases.extend(square_cases());
    if let Some(only) = &args.only {
        cases.retain(|c| format!("{} {}", c.label(), c.formula).contains(only.as_str()));
    }

    let (blas_config, blas_core) = openblas::describe();
    let machine = json!({
        "cpu": cpu_model(),
        "isa": isa_name(),
        "cores": std::thread::available_parallelism().map_or(1, |n| n.get()),
        "threads": args.threads,
        "gnnpar_kernel": gnnpar_kernel(),
        "gemm_crate": format!("gemm 0.19, {}", gemm_kernel()),
        "openblas": blas_config,
        "openblas_core": blas_core,
        "openblas_max_threads": openblas::threads(),
        "loadavg_before": std::fs::read_to_string("/proc/loadavg").unwrap_or_default().trim(),
    });
    println!("{machine}");

    let pools: Vec<rayon::ThreadPool> = args
        .threads
        .iter()
        .map(|&t| {
            rayon::ThreadPoolBuilder::new()
                .num_threads(t)
                .build()
                .expect("pool")
        })
        .collect();
    let max_threads = *args.threads.iter().max().unwrap();

    let started = Instant::now();
    let cpu_before = cpu_seconds();
    let mut results: Vec<Measured> = Vec::new();
    for (ci, case) in cases.iter().enumerate() {
        let ops = Operands::new(case, 1 + ci as u64 * 7);
        openblas::set_threads(max_threads);
        let refs = reference(&ops);
        let path = gnnpar_path(case);
        // Output hashes at the first thread count, per implementation.
        let mut first_hashes: Vec<u64> = Vec::new();
        for (pool, &threads) in pools.iter().zip(&args.threads) {
            let checks: Vec<(f64, f64, u64)> = IMPLS
                .iter()
                .map(|imp| check(pool, imp, threads, case, &ops, &refs))
                .collect();
            let errs: Vec<f64> = checks.iter().map(|c| c.0).collect();
            let hashes: Vec<u64> = checks.iter().map(|c| c.2).collect();
            if first_hashes.is_empty() {
                first_hashes = hashes.clone();
            }
            let same_bits: Vec<bool> = hashes
                .iter()
                .zip(&first_hashes)
                .map(|(a, b)| a == b)
                .collect();
            // A product of a quarter second or more needs no untimed call before each block:
            // its first call's extra cost (faulting in the output, workspaces) is small.
            let warm_up: Vec<bool> = checks.iter().map(|c| c.1 < 0.25).collect();
            let mut times: Vec<Vec<f64>> = vec![Vec::new(); IMPLS.len()];
            let set = &args.set;
            let per_round = set.min_reps.div_ceil(set.rounds);
            for round in 0..set.rounds {
                let mut order: Vec<usize> = (0..IMPLS.len()).collect();
                if round % 2 == 1 {
                    order.reverse();
                }
                for (pos, &i) in order.iter().enumerate() {
                    let t = time_block(
                        pool,
                        IMPLS[i],
                        threads,
                        case,
                        &ops,
                        per_round,
                        set.min_time / set.rounds as f64,
                        set.max_reps.div_ceil(set.rounds),
                        warm_up[i],
                    );
                    times[i].extend(t);
                    if IMPLS[i] == "openblas" && threads > 1 && pos + 1 < order.len() {
                        // OpenBLAS's idle threads spin for ~0.1 s after a call: let them
                        // park before another implementation is timed on the same cores.
                        std::thread::sleep(Duration::from_millis(150));
                    }
                }
            }
            for (i, imp) in IMPLS.iter().enumerate() {
                let reps = times[i].len();
                let min_seconds = times[i].iter().cloned().fold(f64::INFINITY, f64::min);
                let seconds = median(std::mem::take(&mut times[i]));
                let gflops = case.flops() / seconds / 1e9;
                let err = errs[i];
                println!(
                    "{}",
                    json!({"dataset": case.dataset, "layer": case.layer, "op": case.op.name(),
                           "what": case.formula, "shape": case.shape(), "m": case.m,
                           "k": case.k, "n": case.n, "impl": imp, "threads": threads,
                           "gflops": round(gflops, 2), "seconds": seconds,
                           "min_seconds": min_seconds, "reps": reps,
                           "max_rel_err": err, "ok": err <= ERR_LIMIT,
                           "same_bits_as_first_threads": same_bits[i],
                           "in_step": case.in_step, "gnnpar_path": path})
                );
                results.push(Measured {
                    case: ci,
                    imp,
                    threads,
                    seconds,
                    min_seconds,
                    gflops,
                    reps,
                    max_rel_err: err,
                    same_bits: same_bits[i],
                });
            }
        }
    }
    let elapsed = started.elapsed().as_secs_f64();
    let cpu = cpu_seconds() - cpu_before;
    let load_after = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();

    let md = report(
        &machine,
        &steps,
        &cases,
        &results,
        &args.threads,
        elapsed,
        cpu,
        load_after.trim(),
    );
    println!("{md}");
    if let Some(p) = &args.md {
        std::fs::write(p, &md).expect("write --md");
    }
    if let Some(p) = &args.json {
        let rows: Vec<_> = results
            .iter()
            .map(|r| {
                let c = &cases[r.case];
                json!({"dataset": c.dataset, "layer": c.layer, "op": c.op.name(),
                       "what": c.formula, "shape": c.shape(), "m": c.m, "k": c.k, "n": c.n, "impl": r.imp,
                       "threads": r.threads, "gflops": round(r.gflops, 2),
                       "seconds": r.seconds, "min_seconds": r.min_seconds, "reps": r.reps,
                       "same_bits_as_first_threads": r.same_bits, "max_rel_err": r.max_rel_err,
                       "ok": r.max_rel_err <= ERR_LIMIT, "in_step": c.in_step, "note": c.note})
            })
            .collect();
        let steps_json: Vec<_> = steps
            .iter()
            .map(|s| {
                json!({"dataset": s.dataset, "source": s.source, "sparse_input": s.sparse_input,
                       "layers": s.layers.iter().map(|l| json!({"num_dst": l.nd, "num_src": l.ns,
                           "edges": l.e, "in": l.in_dim, "out": l.out_dim})).collect::<Vec<_>>()})
            })
            .collect();
        let doc = json!({
            "benchmark": "gemm (issue 13)",
            "machine": machine,
            "loadavg_after": load_after.trim(),
            "seconds": elapsed,
            "cpu_seconds": cpu,
            "error_limit": ERR_LIMIT,
            "steps": steps_json,
            "step_totals": step_totals(&steps, &cases, &results, &args.threads),
            "results": rows,
        });
        std::fs::write(p, serde_json::to_string_pretty(&doc).unwrap() + "\n")
            .expect("write --json");
    }
    // `!(err <= limit)` on purpose: a NaN error counts as bad.
    #[allow(clippy::neg_cmp_op_on_partial_ord)]
    let bad = results
        .iter()
        .filter(|r| !(r.max_rel_err <= ERR_LIMIT))
        .count();
    if bad > 0 {
        eprintln!("{bad} result(s) differ from the reference by more than {ERR_LIMIT:e}");
        std::process::exit(1);
    }
}

fn round(x: f64, digits: i32) -> f64 {
    let p = 10f64.powi(digits);
    (x * p).round() / p
}

fn find<'a>(
    results: &'a [Measured],
    case: usize,
    imp: &str,
    threads: usize,
) -> Option<&'a Measured> {
    results
        .iter()
        .find(|r| r.case == case && r.imp == imp && r.threads == threads)
}

/// Summed median seconds per implementation (`IMPLS` order) over the cases `keep` selects.
fn sum_seconds(
    cases: &[Case],
    results: &[Measured],
    threads: usize,
    keep: impl Fn(&Case) -> bool,
) -> Vec<f64> {
    sum_by(cases, results, threads, keep, |r| r.seconds)
}

/// [`sum_seconds`] of the fastest calls instead of the medians.
fn sum_min_seconds(
    cases: &[Case],
    results: &[Measured],
    threads: usize,
    keep: impl Fn(&Case) -> bool,
) -> Vec<f64> {
    sum_by(cases, results, threads, keep, |r| r.min_seconds)
}

fn sum_by(
    cases: &[Case],
    results: &[Measured],
    threads: usize,
    keep: impl Fn(&Case) -> bool,
    secs: impl Fn(&Measured) -> f64,
) -> Vec<f64> {
    IMPLS
        .iter()
        .map(|imp| {
            cases
                .iter()
                .enumerate()
                .filter(|(_, c)| keep(c))
                .filter_map(|(i, _)| find(results, i, imp, threads))
                .map(&secs)
                .sum()
        })
        .collect()
}

/// The faster library's summed time over gnnpar's (> 1: gnnpar faster).
fn sum_ratio(secs: &[f64]) -> f64 {
    secs[1].min(secs[2]) / secs[0]
}

fn step_totals(
    steps: &[StepShape],
    cases: &[Case],
    results: &[Measured],
    threads: &[usize],
) -> Vec<serde_json::Value> {
    let mut out = Vec::new();
    for s in steps {
        for &t in threads {
            let all = sum_seconds(cases, results, t, |c| c.in_step && c.dataset == s.dataset);
            let dense = sum_seconds(cases, results, t, |c| {
                dense_step(c) && c.dataset == s.dataset
            });
            let best = sum_min_seconds(cases, results, t, |c| c.in_step && c.dataset == s.dataset);
            out.push(json!({"dataset": s.dataset, "threads": t,
                            "fastest_calls": {"gnnpar": best[0], "gemm": best[1],
                                              "openblas": best[2],
                                              "best_library_over_gnnpar": sum_ratio(&best)},
                            "gnnpar": all[0], "gemm": all[1], "openblas": all[2],
                            "best_library_over_gnnpar": sum_ratio(&all),
                            "dense_products_only": {"gnnpar": dense[0], "gemm": dense[1],
                                                    "openblas": dense[2],
                                                    "best_library_over_gnnpar": sum_ratio(&dense),
                                                    "over_gnnpar": dense[0] / all[0]}}));
        }
    }
    out
}

/// The step's products with every zero-skipping product replaced by its dense twin: the
/// step as gnnpar would run it without `sparse_rows`.
fn dense_step(c: &Case) -> bool {
    (c.in_step && !(c.step_call && c.sparse_left)) || c.dense_twin
}

/// Speed of gnnpar relative to the faster library: > 1 when gnnpar is faster.
fn ratio(results: &[Measured], case: usize, threads: usize) -> Option<f64> {
    let g = find(results, case, "gnnpar", threads)?;
    let best = ["gemm", "openblas"]
        .iter()
        .filter_map(|i| find(results, case, i, threads))
        .map(|r| r.seconds)
        .fold(f64::INFINITY, f64::min);
    Some(best / g.seconds)
}

#[allow(clippy::too_many_arguments)]
fn report(
    machine: &serde_json::Value,
    steps: &[StepShape],
    cases: &[Case],
    results: &[Measured],
    threads: &[usize],
    elapsed: f64,
    cpu: f64,
    load_after: &str,
) -> String {
    let mut md = String::new();
    let m = |k: &str| machine[k].as_str().unwrap_or("").to_string();
    let _ = writeln!(md, "## Run");
    let _ = writeln!(md);
    let _ = writeln!(
        md,
        "- CPU: {} ({} cores), ISA: **{}**",
        m("cpu"),
        machine["cores"],
        m("isa")
    );
    let _ = writeln!(md, "- gnnpar kernel: {}", m("gnnpar_kernel"));
    let _ = writeln!(md, "- {}", m("gemm_crate"));
    let _ = writeln!(
        md,
        "- OpenBLAS: {} (kernels: {})",
        m("openblas"),
        m("openblas_core")
    );
    let _ = writeln!(
        md,
        "- threads: {:?}; load average before: {}, after: {load_after}",
        threads,
        m("loadavg_before")
    );
    let _ = writeln!(
        md,
        "- {elapsed:.0} s of measurements using {cpu:.0} CPU seconds; other processes' load shows \
         as CPU seconds well under wall seconds × threads"
    );
    for imp in IMPLS {
        let differ = results
            .iter()
            .filter(|r| r.imp == imp && !r.same_bits)
            .count();
        let of = results
            .iter()
            .filter(|r| r.imp == imp && r.threads != threads[0])
            .count();
        let _ = writeln!(
            md,
            "- {imp}: {differ} of {of} products at {:?} threads differ bitwise from the same product at {} thread(s)",
            &threads[1..],
            threads[0]
        );
    }
    let _ = writeln!(
        md,
        "- shapes: {}",
        steps
            .iter()
            .map(|s| format!("{} ({})", s.dataset, s.source))
            .collect::<Vec<_>>()
            .join("; ")
    );
    let _ = writeln!(md);

    let _ = writeln!(md, "## GEMM seconds of one training step");
    let _ = writeln!(md);
    let _ = writeln!(
        md,
        "Sum of the medians of the products a real step runs through the GEMM (rows marked ● \
         below: the fused forward with bias + ReLU + dropout on hidden layers and bias on the \
         output layer, weight gradients, input gradients above the input layer; gnnpar runs \
         the call the step makes for an input gradient, which skips the zeros of a hidden \
         layer's `dY`). Ratio \
         = the faster library's time / gnnpar's (> 1: gnnpar faster). \"dense products \
         only\" replaces each zero-skipping product by gnnpar's dense product of the same \
         data: the step without `backend::cpu::sparse_rows` (its gain: that time / gnnpar's); \
         \"fastest calls\" sums each product's fastest call instead of its median (less \
         sensitive to other processes on the cores)."
    );
    let _ = writeln!(md);
    let _ = writeln!(md, "| dataset | threads | gnnpar ms | gemm ms | OpenBLAS ms | best library / gnnpar | dense products only: gnnpar ms | best library / gnnpar | sparse_rows gain | fastest calls: best library / gnnpar |");
    let _ = writeln!(
        md,
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
    );
    for s in steps {
        for &t in threads {
            let all = sum_seconds(cases, results, t, |c| c.in_step && c.dataset == s.dataset);
            let dense = sum_seconds(cases, results, t, |c| {
                dense_step(c) && c.dataset == s.dataset
            });
            let best = sum_min_seconds(cases, results, t, |c| c.in_step && c.dataset == s.dataset);
            let _ = writeln!(
                md,
                "| {} | {t} | {:.2} | {:.2} | {:.2} | **{:.2}** | {:.2} | {:.2} | {:.2} | {:.2} |",
                s.dataset,
                all[0] * 1e3,
                all[1] * 1e3,
                all[2] * 1e3,
                sum_ratio(&all),
                dense[0] * 1e3,
                sum_ratio(&dense),
                dense[0] / all[0],
                sum_ratio(&best)
            );
        }
    }
    let _ = writeln!(md);

    let _ = writeln!(md, "## Per op, all datasets");
    let _ = writeln!(md);
    let _ = writeln!(
        md,
        "Summed median seconds over the datasets' products of each op that a step runs \
         through the GEMM (the plain and ReLU-only forward rows: the same shapes as the step's \
         fused one), and the range of the per-product ratios."
    );
    let _ = writeln!(md);
    let _ = writeln!(md, "| op | threads | products | gnnpar ms | gemm ms | OpenBLAS ms | best library / gnnpar | per-product min | max |");
    let _ = writeln!(
        md,
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"
    );
    let mut labels: Vec<String> = Vec::new();
    for op in [
        Op::Fwd,
        Op::FwdBiasRelu,
        Op::FwdBiasReluDrop,
        Op::FwdBias,
        Op::WGrad,
        Op::DGrad,
        Op::Square,
    ] {
        for c in cases.iter().filter(|c| c.op == op) {
            if !labels.contains(&c.op_label()) {
                labels.push(c.op_label());
            }
        }
    }
    for label in &labels {
        for &t in threads {
            let keep = |c: &Case| &c.op_label() == label && c.note.is_empty();
            let rs: Vec<f64> = cases
                .iter()
                .enumerate()
                .filter(|(_, c)| keep(c))
                .filter_map(|(i, _)| ratio(results, i, t))
                .collect();
            if rs.is_empty() {
                continue;
            }
            let secs = sum_seconds(cases, results, t, keep);
            let min = rs.iter().cloned().fold(f64::INFINITY, f64::min);
            let max = rs.iter().cloned().fold(0.0, f64::max);
            let _ = writeln!(
                md,
                "| {label} | {t} | {} | {:.2} | {:.2} | {:.2} | **{:.2}** | {min:.2} | {max:.2} |",
                rs.len(),
                secs[0] * 1e3,
                secs[1] * 1e3,
                secs[2] * 1e3,
                sum_ratio(&secs)
            );
        }
    }
    let _ = writeln!(md);

    let _ = writeln!(md, "## All products");
    let _ = writeln!(md);
    let _ = writeln!(
        md,
        "GFLOP/s (2·m·k·n / median seconds; epilogues not counted as flops but their time is). \
         `m×k×n` is the product `C[m×n] = A[m×k]·B[k×n]`. For the epilogue rows the libraries' \
         time includes gnnpar's separate bias / ReLU / dropout passes; gnnpar's is its \
         epilogue per block of rows. ● = run by a real step. err = largest |C − reference| / Σ|a||b| over all \
         implementations and thread counts (f64 reference; limit {ERR_LIMIT:e})."
    );
    let _ = writeln!(md);
    let mut head = String::from("| product | op | m×k×n | ● | gnnpar path |");
    let mut sep = String::from("| --- | --- | --- | --- | --- |");
    for &t in threads {
        let _ = write!(
            head,
            " gnnpar {t}T | gemm {t}T | OpenBLAS {t}T | ratio {t}T |"
        );
        sep.push_str(" --- | --- | --- | --- |");
    }
    head.push_str(" err |");
    sep.push_str(" --- |");
    let _ = writeln!(md, "{head}");
    let _ = writeln!(md, "{sep}");
    for (ci, c) in cases.iter().enumerate() {
        let path = gnnpar_path(c);
        let mut row = format!(
            "| {} | {} | {} | {} | {} |",
            c.label(),
            c.formula,
            c.shape(),
            if c.in_step { "●" } else { "" },
            path
        );
        let mut err = 0f64;
        for &t in threads {
            for imp in IMPLS {
                match find(results, ci, imp, t) {
                    Some(r) => {
                        err = err.max(r.max_rel_err);
                        let _ = write!(row, " {:.1} |", r.gflops);
                    }
                    None => row.push_str(" — |"),
                }
            }
            match ratio(results, ci, t) {
                Some(r) => {
                    let _ = write!(row, " {r:.2} |");
                }
                None => row.push_str(" — |"),
            }
        }
        let _ = write!(row, " {err:.1e} |");
        let _ = writeln!(md, "{row}");
    }
    let notes: Vec<String> = cases
        .iter()
        .filter(|c| !c.note.is_empty())
        .map(|c| format!("{}: {}", c.label(), c.note))
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    if !notes.is_empty() {
        let _ = writeln!(md);
        for n in notes {
            let _ = writeln!(md, "- {n}");
        }
    }
    md
}
