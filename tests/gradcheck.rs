//! Finite-difference gradient checks (central differences) for every kernel, layer, loss and
//! whole model, on random blocks that contain isolated destinations, duplicate edges and
//! self-loops. Forward passes run in f32; losses are accumulated in f64.

use gnnpar::backend::cpu::activation::Activation;
use gnnpar::backend::cpu::aggregate::{
    aggregate, aggregate_beside, aggregate_transpose, aggregate_transpose_beside, BlockTranspose,
    EdgeWeights, GcnNorm, LazyTranspose,
};
use gnnpar::backend::cpu::attention::{
    attention_aggregate, attention_backward, edge_softmax, node_logits, AttentionInputs,
};
use gnnpar::backend::cpu::dropout::{mix64, DropoutMask};
use gnnpar::nn::gat::GatConv;
use gnnpar::nn::gcn::GcnConv;
use gnnpar::nn::init::InitKind;
use gnnpar::nn::layer::{Conv, DropoutCtx, Layer};
use gnnpar::nn::linear::Linear;
use gnnpar::nn::mlp::Mlp;
use gnnpar::nn::sage::SageConv;
use gnnpar::nn::{
    bce_with_logits, cross_entropy, LayerNorm, Model, ModelConfig, ModelKind, NormKind, ParamStore,
};
use gnnpar::sample::Block;
use ndarray::{s, Array2, ArrayView2};

/// A small counter-based generator (tests need no `rand`).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 += 1;
        mix64(self.0 ^ 0x1234_5678_9abc_def0)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    /// Uniform in `[-scale, scale)`.
    fn uniform(&mut self, scale: f32) -> f32 {
        ((self.next() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
    }
    fn matrix(&mut self, rows: usize, cols: usize, scale: f32) -> Array2<f32> {
        Array2::from_shape_fn((rows, cols), |_| self.uniform(scale))
    }
}

/// A block with `nd` destinations among `ns` sources: destination 1 (and every 5th) has no
/// in-edges, destination 0 has a duplicate edge and a self-loop, others have 1–4 random
/// sources; when `ns > nd + 1` the last source feeds nobody (`ns == nd` makes a full-graph
/// block, usable by every layer).
fn random_block(rng: &mut Rng, nd: usize, ns: usize) -> Block {
    assert!(nd >= 3 && ns >= nd);
    let spare = ns > nd + 1;
    let feeders = if spare { ns - 1 } else { ns };
    let mut indptr = vec![0];
    let mut indices = Vec::new();
    for i in 0..nd {
        if i == 1 || (i > 0 && i % 5 == 0) {
            // isolated destination
        } else if i == 0 {
            let u = if spare {
                nd + rng.below(ns - nd - 1)
            } else {
                rng.below(ns)
            } as u32;
            indices.extend_from_slice(&[u, u, 0, 2]);
        } else {
            for _ in 0..1 + rng.below(4) {
                indices.push(rng.below(feeders) as u32);
            }
            if i % 3 == 0 {
                indices.push(i as u32); // self-loop
            }
        }
        indptr.push(indices.len());
    }
    let block = Block {
        num_dst: nd,
        src_nodes: (0..ns as u32).map(|v| 100 + 7 * v).collect(),
        indptr,
        indices,
    };
    block.check().unwrap();
    block
}

fn dot64(a: ArrayView2<f32>, b: ArrayView2<f32>) -> f64 {
    assert_eq!(a.dim(), b.dim());
    a.iter()
        .zip(b.iter())
        .map(|(x, y)| *x as f64 * *y as f64)
        .sum()
}

/// Step of the central differences.
const H: f32 = 2e-3;

/// Compare an analytic gradient with central differences of `loss` at the coordinates of
/// `values` (all of them, or an evenly spread subset of at most 150).
///
/// ReLU-type kinks: when a pre-activation lies within `H` of zero, the central difference
/// straddles the kink and is wrong although the gradient is right. The gradient then still
/// matches the one-sided difference on the kink-free side, so a coordinate passes when the
/// central difference or either one-sided difference agrees. A wrong gradient fails all three.
fn check_coords(
    what: &str,
    values: &mut [f32],
    analytic: &[f32],
    mut loss: impl FnMut(&[f32]) -> f64,
) {
    assert_eq!(values.len(), analytic.len(), "{what}: gradient length");
    let n = values.len();
    let stride = n.div_ceil(150).max(1);
    let rel = |a: f64, b: f64| (a - b).abs() / (1e-2 + a.abs().max(b.abs()));
    for i in (0..n).step_by(stride) {
        let orig = values[i];
        let mid = loss(values);
        values[i] = orig + H;
        let up = loss(values);
        values[i] = orig - H;
        let down = loss(values);
        values[i] = orig;
        let h = H as f64;
        let central = (up - down) / (2.0 * h);
        let a = analytic[i] as f64;
        let err = rel(a, central)
            .min(rel(a, (up - mid) / h) * 0.5)
            .min(rel(a, (mid - down) / h) * 0.5);
        assert!(
            err < 2e-2,
            "{what}[{i}]: analytic {a:.6} vs numeric {central:.6} (one-sided {:.6} / {:.6})",
            (up - mid) / h,
            (mid - down) / h
        );
    }
}

/// Check one layer's gradients for its parameters and its input, with the loss
/// `Σ R ⊙ layer(x)` for a fixed random `R`.
fn check_layer(
    name: &str,
    layer: &Layer,
    params: &ParamStore,
    block: &Block,
    x: &Array2<f32>,
    ctx: &DropoutCtx,
) {
    let mut rng = Rng(99);
    let (z, cache) = layer.forward(params, block, x.view(), ctx);
    assert_eq!(z.nrows(), block.num_dst);
    assert!(z.iter().all(|v| v.is_finite()), "{name}: non-finite output");
    let r = rng.matrix(z.nrows(), z.ncols(), 1.0);
    let mut grads = params.clone();
    grads.zero_grads();
    let dx = layer
        .backward(
            &mut grads,
            block,
            &LazyTranspose::default(),
            cache,
            r.view(),
            true,
        )
        .expect("input gradient requested");
    assert_eq!(dx.dim(), x.dim(), "{name}: input gradient shape");

    for (idx, entry) in params.entries.iter().enumerate() {
        let range = entry.offset..entry.offset + entry.len();
        let mut probe = params.clone();
        let analytic = grads.grads[range.clone()].to_vec();
        let mut vals = params.values[range.clone()].to_vec();
        check_coords(
            &format!("{name} d{}", entry.name),
            &mut vals,
            &analytic,
            |v| {
                probe.values[range.clone()].copy_from_slice(v);
                let (z, _) = layer.forward(&probe, block, x.view(), ctx);
                dot64(z.view(), r.view())
            },
        );
        let _ = idx;
    }
    let mut xs = x.clone();
    let shape = x.dim();
    check_coords(
        &format!("{name} dx"),
        xs.as_slice_mut().unwrap(),
        dx.as_slice().unwrap(),
        |v| {
            let xv = Array2::from_shape_vec(shape, v.to_vec()).unwrap();
            let (z, _) = layer.forward(params, block, xv.view(), ctx);
            dot64(z.view(), r.view())
        },
    );
}

fn training_ctx() -> DropoutCtx<'static> {
    DropoutCtx {
        training: true,
        keep_for_backward: true,
        stream: 77,
        orig_ids: None,
        gcn_degrees: None,
    }
}

fn layer(index: usize, conv: Conv, dropout: f32, activation: Option<Activation>) -> Layer {
    Layer::plain(index, conv, dropout, activation)
}

#[test]
fn layer_norm_gain_bias_and_input() {
    let mut rng = Rng(40);
    let (rows, dim) = (7, 6);
    let mut params = ParamStore::new();
    let ln = LayerNorm::new(&mut params, "ln", dim);
    // Non-trivial gain and bias so every term of the backward matters.
    for v in params.values.iter_mut() {
        *v += rng.uniform(0.5);
    }
    // One row nearly constant: a large 1/std, where a wrong variance term shows most.
    let mut x = rng.matrix(rows, dim, 1.5);
    x.row_mut(3).mapv_inplace(|v| 0.3 + 0.05 * v);
    let r = rng.matrix(rows, dim, 1.0);
    let (_, cache) = ln.forward(&params, x.view());
    let mut grads = params.clone();
    grads.zero_grads();
    let dx = ln.backward(&mut grads, cache, r.view());
    let mut vals = params.values.clone();
    let mut probe = params.clone();
    check_coords("layer norm dparams", &mut vals, &grads.grads, |v| {
        probe.values.copy_from_slice(v);
        dot64(ln.forward(&probe, x.view()).0.view(), r.view())
    });
    let mut xs = x.clone();
    check_coords(
        "layer norm dx",
        xs.as_slice_mut().unwrap(),
        dx.as_slice().unwrap(),
        |v| {
            let xv = Array2::from_shape_vec((rows, dim), v.to_vec()).unwrap();
            dot64(ln.forward(&params, xv.view()).0.view(), r.view())
        },
    );
}

/// A hidden layer with layer norm on its input and a residual, for every convolution, on a
/// sampled block (more sources than destinations) and a full-graph block, with dropout.
#[test]
fn residual_norm_layer_per_conv() {
    let mut rng = Rng(41);
    for &(nd, ns) in &[(6usize, 14usize), (12, 12)] {
        let block = random_block(&mut rng, nd, ns);
        for kind in ["sage", "gcn", "gat", "dense"] {
            let dim = 6;
            let mut params = ParamStore::new();
            let (conv, block) = match kind {
                "sage" => (
                    Conv::Sage(SageConv::new(
                        &mut params,
                        "c",
                        dim,
                        dim,
                        InitKind::Glorot,
                        3,
                    )),
                    block.clone(),
                ),
                "gcn" => (
                    Conv::Gcn(GcnConv::new(
                        &mut params,
                        "c",
                        dim,
                        dim,
                        InitKind::Glorot,
                        3,
                    )),
                    block.with_self_loops(),
                ),
                // Two concatenated heads of 3: 6 columns in and out.
                "gat" => (
                    Conv::Gat(GatConv::new(
                        &mut params,
                        "c",
                        dim,
                        3,
                        2,
                        true,
                        InitKind::Glorot,
                        3,
                    )),
                    block.clone(),
                ),
                _ => (
                    Conv::Dense(Linear::new(&mut params, "c", dim, dim, InitKind::Glorot, 3)),
                    block.clone(),
                ),
            };
            let norm = LayerNorm::new(&mut params, "c.norm", dim);
            // Move the norm off its identity initialisation (gain 1, bias 0).
            let off = params.entries[norm.gain].offset;
            for v in &mut params.values[off..off + 2 * dim] {
                *v += rng.uniform(0.4);
            }
            let l = Layer {
                norm: Some(norm),
                residual: true,
                ..layer(1, conv, 0.2, Some(Activation::Elu { alpha: 1.0 }))
            };
            let x = rng.matrix(ns, dim, 1.0);
            check_layer(
                &format!("{kind} residual+norm ({nd}/{ns})"),
                &l,
                &params,
                &block,
                &x,
                &training_ctx(),
            );
            // The same layer behind an input projection (4 feature columns → 6), as the first
            // layer of a model with `input_proj`.
            let mut projected = params.clone();
            let input = Linear::new(&mut projected, "c.input", 4, dim, InitKind::Glorot, 7);
            let off = projected.entries[input.bias.expect("Linear::new registers a bias")].offset;
            for v in &mut projected.values[off..off + dim] {
                *v = rng.uniform(0.3);
            }
            let lp = Layer {
                input: Some(input),
                index: 0,
                ..l.clone()
            };
            let xf = rng.matrix(ns, 4, 1.0);
            check_layer(
                &format!("{kind} projected residual+norm ({nd}/{ns})"),
                &lp,
                &projected,
                &block,
                &xf,
                &training_ctx(),
            );
            // Without an input gradient the norm's parameters still get theirs.
            let (_, cache) = l.forward(&params, &block, x.view(), &training_ctx());
            let mut g = params.clone();
            g.zero_grads();
            let none = l.backward(
                &mut g,
                &block,
                &LazyTranspose::default(),
                cache,
                rng.matrix(nd, dim, 1.0).view(),
                false,
            );
            assert!(none.is_none());
            let e = &params.entries[l.norm.as_ref().unwrap().gain];
            assert!(g.grads[e.offset..e.offset + 2 * dim]
                .iter()
                .any(|&v| v != 0.0));
        }
    }
}

#[test]
fn sage_layer_both_evaluation_orders() {
    let mut rng = Rng(1);
    // Sampled shape (aggregate first) and square full-graph shape with out < in (project first).
    for &(nd, ns, din, dout) in &[(6usize, 14usize, 5usize, 4usize), (12, 12, 9, 3)] {
        let block = random_block(&mut rng, nd, ns);
        let mut params = ParamStore::new();
        let conv = SageConv::new(&mut params, "sage", din, dout, InitKind::Glorot, 5);
        let x = rng.matrix(ns, din, 1.0);
        let l = layer(0, Conv::Sage(conv), 0.0, None);
        check_layer("sage", &l, &params, &block, &x, &DropoutCtx::eval());
        // With dropout on the input and an activation (ELU: smooth, no kinks to hit).
        let l = layer(1, l.conv, 0.3, Some(Activation::Elu { alpha: 1.0 }));
        check_layer("sage+dropout+elu", &l, &params, &block, &x, &training_ctx());
    }
}

#[test]
fn gcn_layer_both_evaluation_orders() {
    let mut rng = Rng(2);
    for &(nd, ns, din, dout) in &[(6usize, 14usize, 5usize, 4usize), (12, 12, 9, 3)] {
        let block = random_block(&mut rng, nd, ns).with_self_loops();
        let mut params = ParamStore::new();
        let conv = GcnConv::new(&mut params, "gcn", din, dout, InitKind::Glorot, 6);
        // A non-zero bias so its gradient path is exercised with something to move.
        params.values[din * dout..]
            .iter_mut()
            .for_each(|b| *b = 0.1);
        let x = rng.matrix(ns, din, 1.0);
        let l = layer(
            0,
            Conv::Gcn(conv),
            0.2,
            Some(Activation::LeakyRelu { slope: 0.1 }),
        );
        check_layer("gcn", &l, &params, &block, &x, &training_ctx());
        // With a global degree table (what training passes): degrees unrelated to the block's,
        // one of them 0 (that source's edges weigh nothing).
        let degrees: Vec<u32> = (0..block.src_nodes.iter().max().unwrap() + 1)
            .map(|v| (v / 7) % 5)
            .collect();
        let ctx = DropoutCtx {
            gcn_degrees: Some(&degrees),
            ..training_ctx()
        };
        check_layer("gcn global degrees", &l, &params, &block, &x, &ctx);
    }
}

#[test]
fn gat_layer_concat_and_mean() {
    let mut rng = Rng(3);
    let block = random_block(&mut rng, 7, 15);
    for &concat in &[true, false] {
        let mut params = ParamStore::new();
        let conv = GatConv::new(&mut params, "gat", 4, 3, 2, concat, InitKind::Glorot, 8);
        let x = rng.matrix(15, 4, 1.0);
        let l = layer(
            0,
            Conv::Gat(conv),
            0.25,
            Some(Activation::Elu { alpha: 1.0 }),
        );
        check_layer(
            if concat { "gat concat" } else { "gat mean" },
            &l,
            &params,
            &block,
            &x,
            &training_ctx(),
        );
    }
}

#[test]
fn dense_layer_reads_destination_rows_only() {
    let mut rng = Rng(4);
    let block = random_block(&mut rng, 5, 11);
    let mut params = ParamStore::new();
    let lin = Linear::new(&mut params, "lin", 6, 4, InitKind::Glorot, 9);
    let x = rng.matrix(11, 6, 1.0);
    let l = layer(0, Conv::Dense(lin), 0.3, None);
    check_layer("dense", &l, &params, &block, &x, &training_ctx());
    let (_, cache) = l.forward(&params, &block, x.view(), &training_ctx());
    let mut g = params.clone();
    let d = l
        .backward(
            &mut g,
            &block,
            &LazyTranspose::default(),
            cache,
            Array2::ones((5, 4)).view(),
            true,
        )
        .unwrap();
    assert!(d
        .rows()
        .into_iter()
        .skip(5)
        .all(|r| r.iter().all(|&v| v == 0.0)));
}

#[test]
fn linear_and_mlp_head() {
    let mut rng = Rng(5);
    let mut params = ParamStore::new();
    let lin = Linear::new(&mut params, "lin", 7, 3, InitKind::Glorot, 1);
    let x = rng.matrix(9, 7, 1.0);
    let r = rng.matrix(9, 3, 1.0);
    let mut grads = params.clone();
    let dx = lin.backward(&mut grads, x.view(), r.view(), true).unwrap();
    let mut vals = params.values.clone();
    check_coords("linear dparams", &mut vals, &grads.grads, |v| {
        let mut p = params.clone();
        p.values.copy_from_slice(v);
        dot64(lin.forward(&p, x.view()).view(), r.view())
    });
    let mut xs = x.clone();
    check_coords(
        "linear dx",
        xs.as_slice_mut().unwrap(),
        dx.as_slice().unwrap(),
        |v| {
            let xv = Array2::from_shape_vec((9, 7), v.to_vec()).unwrap();
            dot64(lin.forward(&params, xv.view()).view(), r.view())
        },
    );

    // MLP head with dropout keyed by row keys, and without (its cache then keeps each hidden
    // layer's input as it is, uncopied).
    for dropout in [0.3, 0.0] {
        let mut params = ParamStore::new();
        let mlp = Mlp::new(
            &mut params,
            "head",
            &[6, 8, 3],
            dropout,
            InitKind::Glorot,
            2,
        );
        let x = rng.matrix(10, 6, 1.0);
        let keys: Vec<u64> = (0..10).map(|i| 1000 + i).collect();
        let ctx = training_ctx();
        let (y, cache) = mlp.forward(&params, x.view(), &keys, &ctx);
        let r = rng.matrix(y.nrows(), y.ncols(), 1.0);
        let mut grads = params.clone();
        let dx = mlp.backward(&mut grads, cache, r.clone(), true).unwrap();
        let mut vals = params.values.clone();
        check_coords(
            &format!("mlp dparams, dropout {dropout}"),
            &mut vals,
            &grads.grads,
            |v| {
                let mut p = params.clone();
                p.values.copy_from_slice(v);
                dot64(mlp.forward(&p, x.view(), &keys, &ctx).0.view(), r.view())
            },
        );
        let mut xs = x.clone();
        check_coords(
            &format!("mlp dx, dropout {dropout}"),
            xs.as_slice_mut().unwrap(),
            dx.as_slice().unwrap(),
            |v| {
                let xv = Array2::from_shape_vec((10, 6), v.to_vec()).unwrap();
                dot64(
                    mlp.forward(&params, xv.view(), &keys, &ctx).0.view(),
                    r.view(),
                )
            },
        );
    }
}

/// Aggregations are linear maps: their backward must be the exact adjoint,
/// `<A·x, y> = <x, Aᵀ·y>`, which is the gradient check of `x ↦ <A·x, y>` without step error.
#[test]
fn aggregations_backward_is_the_adjoint() {
    let mut rng = Rng(6);
    let block = random_block(&mut rng, 9, 20);
    let bt = BlockTranspose::new(&block);
    let norm = GcnNorm::new(&block, None);
    let coef = norm.per_edge(&block);
    let x = rng.matrix(20, 5, 1.0);
    let y = rng.matrix(9, 5, 1.0);
    for (name, w) in [
        ("sum", EdgeWeights::Sum),
        ("mean", EdgeWeights::Mean),
        ("gcn per edge", EdgeWeights::PerEdge(&coef)),
        ("gcn factored", norm.weights()),
    ] {
        let ax = aggregate(&block, x.view(), w);
        let aty = aggregate_transpose(&block, &bt, y.view(), w);
        let (lhs, rhs) = (dot64(ax.view(), y.view()), dot64(x.view(), aty.view()));
        assert!(
            (lhs - rhs).abs() < 1e-5 * (1.0 + lhs.abs()),
            "{name}: {lhs} vs {rhs}"
        );
        // Isolated destinations aggregate to zero.
        assert!(ax.row(1).iter().all(|&v| v == 0.0), "{name}");
        // The last source feeds nobody, so it gets no gradient.
        assert!(aty.row(19).iter().all(|&v| v == 0.0), "{name}");
        // Beside the destinations' own rows: `[x_dst | A·x]` and its adjoint, for narrow
        // (fixed-width kernel) and wide rows.
        for cols in [5, 40] {
            let xw = rng.matrix(20, cols, 1.0);
            let yw = rng.matrix(9, 2 * cols, 1.0);
            let bx = aggregate_beside(&block, xw.view(), w);
            assert_eq!(bx.slice(s![.., ..cols]), xw.slice(s![..9, ..]), "{name}");
            let expect = aggregate(&block, xw.view(), w);
            assert_eq!(bx.slice(s![.., cols..]), expect, "{name}");
            let bty = aggregate_transpose_beside(&block, &bt, yw.view(), w, None);
            let (lhs, rhs) = (dot64(bx.view(), yw.view()), dot64(xw.view(), bty.view()));
            assert!(
                (lhs - rhs).abs() < 1e-5 * (1.0 + lhs.abs()),
                "{name} beside, {cols} columns: {lhs} vs {rhs}"
            );
        }
        // Finite differences agree too (the map is linear, so they are exact up to rounding).
        let mut xs = x.clone();
        check_coords(
            &format!("aggregate {name}"),
            xs.as_slice_mut().unwrap(),
            aty.as_slice().unwrap(),
            |v| {
                let xv = Array2::from_shape_vec((20, 5), v.to_vec()).unwrap();
                dot64(aggregate(&block, xv.view(), w).view(), y.view())
            },
        );
    }
}

#[test]
fn gat_attention_kernels() {
    let mut rng = Rng(7);
    let block = random_block(&mut rng, 8, 16);
    let bt = BlockTranspose::new(&block);
    let (heads, f) = (3, 2);
    let wh = rng.matrix(16, heads * f, 1.0);
    let att_src = rng.matrix(heads, f, 1.0);
    let att_dst = rng.matrix(heads, f, 1.0);
    let r = rng.matrix(8, heads * f, 1.0);
    let run = |wh: &Array2<f32>, a_s: &Array2<f32>, a_d: &Array2<f32>| {
        let el = node_logits(wh.view(), a_s.view(), 16);
        let er = node_logits(wh.view(), a_d.view(), 8);
        let alpha = edge_softmax(&block, el.view(), er.view(), 0.2);
        let out = attention_aggregate(&block, alpha.view(), wh.view());
        (el, er, alpha, out)
    };
    let (el, er, alpha, out) = run(&wh, &att_src, &att_dst);
    // Attention sums to one over each non-empty destination, per head.
    for v in 0..8 {
        for h in 0..heads {
            let s: f32 = (block.indptr[v]..block.indptr[v + 1])
                .map(|e| alpha[[e, h]])
                .sum();
            if block.in_degree(v) > 0 {
                assert!((s - 1.0).abs() < 1e-5);
            }
        }
    }
    assert!(out.row(1).iter().all(|&v| v == 0.0));
    let g = attention_backward(
        &AttentionInputs {
            block: &block,
            transpose: &bt,
            wh: wh.view(),
            el: el.view(),
            er: er.view(),
            alpha: alpha.view(),
            att_src: att_src.view(),
            att_dst: att_dst.view(),
            slope: 0.2,
        },
        r.view(),
    );
    let loss = |wh: &Array2<f32>, a_s: &Array2<f32>, a_d: &Array2<f32>| {
        dot64(run(wh, a_s, a_d).3.view(), r.view())
    };
    let mut v = wh.clone();
    check_coords(
        "attention dwh",
        v.as_slice_mut().unwrap(),
        g.d_wh.as_slice().unwrap(),
        |s| {
            loss(
                &Array2::from_shape_vec(wh.dim(), s.to_vec()).unwrap(),
                &att_src,
                &att_dst,
            )
        },
    );
    let mut v = att_src.clone();
    check_coords(
        "attention datt_src",
        v.as_slice_mut().unwrap(),
        g.d_att_src.as_slice().unwrap(),
        |s| {
            loss(
                &wh,
                &Array2::from_shape_vec(att_src.dim(), s.to_vec()).unwrap(),
                &att_dst,
            )
        },
    );
    let mut v = att_dst.clone();
    check_coords(
        "attention datt_dst",
        v.as_slice_mut().unwrap(),
        g.d_att_dst.as_slice().unwrap(),
        |s| {
            loss(
                &wh,
                &att_src,
                &Array2::from_shape_vec(att_dst.dim(), s.to_vec()).unwrap(),
            )
        },
    );
}

#[test]
fn activations_and_fixed_dropout_mask() {
    let mut rng = Rng(8);
    // Points away from the kink at 0.
    let x = Array2::from_shape_fn((6, 7), |_| {
        let v = rng.uniform(2.0);
        if v.abs() < 0.05 {
            0.5
        } else {
            v
        }
    });
    let r = rng.matrix(6, 7, 1.0);
    for act in [
        Activation::Relu,
        Activation::Elu { alpha: 1.0 },
        Activation::LeakyRelu { slope: 0.2 },
    ] {
        let mut y = x.clone();
        act.forward_in_place(y.view_mut());
        let mut g = r.clone();
        act.backward_in_place(y.view(), g.view_mut());
        let mut xs = x.clone();
        check_coords(
            &format!("{act:?}"),
            xs.as_slice_mut().unwrap(),
            g.as_slice().unwrap(),
            |v| {
                let mut y = Array2::from_shape_vec((6, 7), v.to_vec()).unwrap();
                act.forward_in_place(y.view_mut());
                dot64(y.view(), r.view())
            },
        );
    }
    let mask = DropoutMask::new(5, 0.4);
    let keys: Vec<u64> = (0..6).map(|i| 3 * i + 1).collect();
    let mut g = r.clone();
    mask.apply_in_place(g.view_mut(), &keys);
    let mut xs = x.clone();
    check_coords(
        "dropout",
        xs.as_slice_mut().unwrap(),
        g.as_slice().unwrap(),
        |v| {
            let xv = Array2::from_shape_vec((6, 7), v.to_vec()).unwrap();
            dot64(mask.apply(xv.view(), &keys).view(), r.view())
        },
    );
}

#[test]
fn losses() {
    let mut rng = Rng(9);
    let logits = rng.matrix(8, 5, 3.0);
    let labels: Vec<i64> = (0..8).map(|i| (i * 3 % 5) as i64).collect();
    let (loss, grad) = cross_entropy(&logits, &labels);
    assert!(loss > 0.0);
    let mut l = logits.clone();
    check_coords(
        "cross_entropy",
        l.as_slice_mut().unwrap(),
        grad.as_slice().unwrap(),
        |v| {
            cross_entropy(
                &Array2::from_shape_vec((8, 5), v.to_vec()).unwrap(),
                &labels,
            )
            .0
        },
    );
    let targets = Array2::from_shape_fn((8, 5), |(i, j)| ((i + j) % 3 == 0) as i64);
    let (loss, grad) = bce_with_logits(&logits, targets.view());
    assert!(loss > 0.0);
    let mut l = logits.clone();
    check_coords(
        "bce",
        l.as_slice_mut().unwrap(),
        grad.as_slice().unwrap(),
        |v| {
            bce_with_logits(
                &Array2::from_shape_vec((8, 5), v.to_vec()).unwrap(),
                targets.view(),
            )
            .0
        },
    );
}

fn config(kind: ModelKind, dropout: f32) -> ModelConfig {
    ModelConfig {
        heads: 2,
        ..ModelConfig::plain(kind, 5, 4, 3, 2, dropout)
    }
}

/// Whole 2-layer models: sampled (two different blocks) and full-batch (one block twice).
#[test]
fn whole_models_per_kind() {
    for kind in [
        ModelKind::Sage,
        ModelKind::Gcn,
        ModelKind::Gat,
        ModelKind::Mlp,
    ] {
        let mut rng = Rng(30 + kind as u64);
        let b1 = random_block(&mut rng, 5, 12);
        // blocks[0] maps 25 sources to the 12 sources of blocks[1].
        let b0 = {
            let mut b = random_block(&mut rng, 12, 25);
            b.src_nodes[..12].copy_from_slice(&b1.src_nodes);
            b
        };
        let full = random_block(&mut rng, 10, 10);
        let (b0, b1, full) = if kind == ModelKind::Gcn {
            (
                b0.with_self_loops(),
                b1.with_self_loops(),
                full.with_self_loops(),
            )
        } else {
            (b0, b1, full)
        };
        for (case, blocks) in [
            ("sampled", vec![&b0, &b1]),
            ("full-batch", vec![&full, &full]),
        ] {
            let model = Model::new(config(kind, 0.2), 3).unwrap();
            let x = rng.matrix(blocks[0].num_src(), 5, 1.0);
            let labels: Vec<i64> = (0..blocks[1].num_dst).map(|i| (i % 3) as i64).collect();
            let ctx = training_ctx();
            let loss_of = |m: &Model| {
                let (logits, _) = m.forward(&blocks, x.view(), &ctx);
                cross_entropy(&logits, &labels).0
            };
            let (logits, cache) = model.forward(&blocks, x.view(), &ctx);
            assert_eq!(logits.dim(), (blocks[1].num_dst, 3));
            let (_, d) = cross_entropy(&logits, &labels);
            let mut trained = model.clone();
            trained.params.zero_grads();
            trained.backward(&blocks, cache, d.clone());
            let analytic = trained.params.grads.clone();
            assert!(analytic.iter().any(|&g| g != 0.0));
            let mut vals = model.params.values.clone();
            let mut probe = model.clone();
            check_coords(&format!("{kind} {case} model"), &mut vals, &analytic, |v| {
                probe.params.values.copy_from_slice(v);
                loss_of(&probe)
            });
        }
    }
}

/// Whole 3-layer models with residual connections and layer norm, full-batch (one block
/// three times, as full-batch training does), with and without the input projection.
#[test]
fn whole_residual_norm_models_per_kind() {
    for kind in [ModelKind::Sage, ModelKind::Gcn, ModelKind::Gat] {
        for input_proj in [false, true] {
            let mut rng = Rng(50 + kind as u64);
            let mut full = random_block(&mut rng, 10, 10);
            if kind == ModelKind::Gcn {
                full = full.with_self_loops();
            }
            let blocks = vec![&full, &full, &full];
            let cfg = ModelConfig {
                layers: 3,
                residual: true,
                norm: NormKind::Layer,
                input_proj,
                // Rows of 8 (not 4): layer norm over very few columns is too curved for `H`.
                hidden: 8,
                ..config(kind, 0.2)
            };
            let mut model = Model::new(cfg, 4).unwrap();
            // Non-zero biases: with zero biases an isolated destination's row is constant, and
            // layer norm of a (near-)constant row has a huge 1/std (1/sqrt(eps)); the gradient
            // is still right there (checked with smaller steps), but too curved for `H`.
            for v in model.params.values.iter_mut() {
                *v += rng.uniform(0.2);
            }
            // Smooth activations: a ReLU kink moves the mean and variance of a whole
            // normalised row, so several kinks fall within one finite-difference step.
            for l in &mut model.layers {
                if l.activation.is_some() {
                    l.activation = Some(Activation::Elu { alpha: 1.0 });
                }
            }
            let first = &model.layers[0];
            assert_eq!(first.input.is_some(), input_proj);
            assert_eq!(first.residual, input_proj);
            assert_eq!(first.norm.is_some(), input_proj);
            assert!(model.layers[1].residual && model.layers[1].norm.is_some());
            assert!(!model.layers[2].residual && model.layers[2].norm.is_some());
            let x = rng.matrix(10, 5, 1.0);
            let labels: Vec<i64> = (0..10).map(|i| (i % 3) as i64).collect();
            let ctx = training_ctx();
            let (logits, cache) = model.forward(&blocks, x.view(), &ctx);
            let (_, d) = cross_entropy(&logits, &labels);
            let mut trained = model.clone();
            trained.params.zero_grads();
            trained.backward(&blocks, cache, d.clone());
            let analytic = trained.params.grads.clone();
            let mut vals = model.params.values.clone();
            let mut probe = model.clone();
            let what = format!("{kind} residual+norm model (input_proj {input_proj})");
            check_coords(&what, &mut vals, &analytic, |v| {
                probe.params.values.copy_from_slice(v);
                let (logits, _) = probe.forward(&blocks, x.view(), &ctx);
                cross_entropy(&logits, &labels).0
            });
        }
    }
}

#[test]
fn backward_accumulates_into_grads() {
    let mut rng = Rng(20);
    let block = random_block(&mut rng, 6, 6);
    let mut model = Model::new(config(ModelKind::Sage, 0.0), 1).unwrap();
    let x = rng.matrix(6, 5, 1.0);
    let d = rng.matrix(6, 3, 1.0);
    let ctx = DropoutCtx::eval();
    let (_, c) = model.forward(&[&block, &block], x.view(), &ctx);
    model.backward(&[&block, &block], c, d.clone());
    let once = model.params.grads.clone();
    let (_, c) = model.forward(&[&block, &block], x.view(), &ctx);
    model.backward(&[&block, &block], c, d.clone());
    for (a, b) in model.params.grads.iter().zip(&once) {
        assert!((a - 2.0 * b).abs() <= 1e-6 * (1.0 + b.abs()));
    }
}

/// Dropout masks follow the original vertex id: the same vertices under other global ids (as
/// after relabelling by a partitioner) and in another row order give the same outputs.
#[test]
fn dropout_masks_follow_original_ids() {
    let mut params = ParamStore::new();
    let lin = Linear::new(&mut params, "lin", 16, 4, InitKind::Glorot, 1);
    let l = layer(0, Conv::Dense(lin), 0.5, None);
    let mut rng = Rng(30);
    let x = rng.matrix(6, 16, 1.0);
    // Global ids 0..6 with original ids orig_a; the same vertices relabelled and permuted.
    let orig_a: Vec<u64> = vec![50, 51, 52, 53, 54, 55];
    let block_a = Block {
        num_dst: 6,
        src_nodes: (0..6).collect(),
        indptr: vec![0; 7],
        indices: vec![],
    };
    let perm = [3usize, 5, 0, 4, 1, 2];
    // Block b holds vertex perm[i] of block a at row i, under global id 10 + i.
    let mut orig_b = vec![0u64; 16];
    for (i, &p) in perm.iter().enumerate() {
        orig_b[10 + i] = orig_a[p];
    }
    let block_b = Block {
        num_dst: 6,
        src_nodes: (10..16).collect(),
        indptr: vec![0; 7],
        indices: vec![],
    };
    let xb = Array2::from_shape_fn((6, 16), |(i, j)| x[[perm[i], j]]);
    let ctx_a = DropoutCtx {
        training: true,
        keep_for_backward: true,
        stream: 9,
        orig_ids: Some(&orig_a),
        gcn_degrees: None,
    };
    let ctx_b = DropoutCtx {
        orig_ids: Some(&orig_b),
        ..ctx_a
    };
    let (ya, _) = l.forward(&params, &block_a, x.view(), &ctx_a);
    let (yb, _) = l.forward(&params, &block_b, xb.view(), &ctx_b);
    for (i, &p) in perm.iter().enumerate() {
        for c in 0..4 {
            assert!((yb[[i, c]] - ya[[p, c]]).abs() < 1e-6);
        }
    }
    // Without the original ids the masks differ (keys are then the global ids).
    let (yc, _) = l.forward(
        &params,
        &block_b,
        xb.view(),
        &DropoutCtx {
            orig_ids: None,
            ..ctx_a
        },
    );
    assert_ne!(yc, yb);
}

/// Forward and backward give bitwise the same results on 1 and 3 threads.
#[test]
fn results_do_not_depend_on_thread_count() {
    let mut rng = Rng(40);
    let block = random_block(&mut rng, 300, 900);
    let b1 = random_block(&mut rng, 100, 300);
    let x = rng.matrix(900, 40, 1.0);
    let run = |threads: usize, kind: ModelKind| {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        pool.install(|| {
            let mut cfg = config(kind, 0.3);
            cfg.in_dim = 40;
            cfg.hidden = 64;
            let mut m = Model::new(cfg, 5).unwrap();
            let blocks = [&block, &b1];
            let (y, c) = m.forward(&blocks, x.view(), &training_ctx());
            let labels: Vec<i64> = (0..100).map(|i| i % 3).collect();
            let (_, d) = cross_entropy(&y, &labels);
            m.backward(&blocks, c, d.clone());
            (y, m.params.grads)
        })
    };
    for kind in [ModelKind::Sage, ModelKind::Gcn, ModelKind::Gat] {
        assert_eq!(run(1, kind), run(3, kind), "{kind}");
    }
}

#[test]
fn bad_configs_are_refused_with_the_field_named() {
    let mut c = config(ModelKind::Sage, 0.1);
    c.hidden = 0;
    assert!(Model::new(c, 1).unwrap_err().to_string().contains("hidden"));
    let mut c = config(ModelKind::Gat, 0.1);
    c.heads = 0;
    assert!(Model::new(c, 1).unwrap_err().to_string().contains("heads"));
    let c = config(ModelKind::Gcn, 1.0);
    assert!(Model::new(c, 1)
        .unwrap_err()
        .to_string()
        .contains("dropout"));
    let mut c = config(ModelKind::Gcn, 0.1);
    c.layers = 0;
    assert!(Model::new(c, 1).unwrap_err().to_string().contains("layers"));
    assert!("gin"
        .parse::<ModelKind>()
        .unwrap_err()
        .to_string()
        .contains("unknown model 'gin'"));
    assert_eq!(serde_json::to_string(&ModelKind::Gat).unwrap(), "\"gat\"");
}

/// End to end: forward, loss, backward and Adam fit a small labelled graph for every kind.
#[test]
fn adam_steps_fit_a_small_graph() {
    use gnnpar::nn::Adam;
    for kind in [
        ModelKind::Sage,
        ModelKind::Gcn,
        ModelKind::Gat,
        ModelKind::Mlp,
    ] {
        let mut rng = Rng(50);
        let block = random_block(&mut rng, 30, 30).with_self_loops();
        let x = rng.matrix(30, 5, 1.0);
        let labels: Vec<i64> = (0..30)
            .map(|i| (x[[i, 0]] > 0.0) as i64 + (x[[i, 1]] > 0.0) as i64)
            .collect();
        let mut model = Model::new(config(kind, 0.0), 1).unwrap();
        let mut opt = Adam::new(model.params.len(), 0.05, 0.0);
        let blocks = [&block, &block];
        let mut losses = Vec::new();
        for step in 0..60 {
            let ctx = DropoutCtx {
                training: true,
                keep_for_backward: true,
                stream: step,
                orig_ids: None,
                gcn_degrees: None,
            };
            let (logits, cache) = model.forward(&blocks, x.view(), &ctx);
            let (loss, d) = cross_entropy(&logits, &labels);
            losses.push(loss / 30.0);
            model.params.zero_grads();
            model.backward(&blocks, cache, d.clone());
            opt.step(&mut model.params.values, &model.params.grads);
        }
        let (first, last) = (losses[0], *losses.last().unwrap());
        assert!(last < 0.5 * first, "{kind}: loss {first:.3} → {last:.3}");
    }
}

/// SliceGCN's shared parts on one rank: the slice encoding (a per-rank row added to the GCN
/// output) and the feature fusion (a 2-layer MLP of all features feeding the GCN), through the
/// whole model (fusion → GCN → encoding → classifier → cross-entropy), with dropout on.
#[test]
fn slicegcn_encoding_and_fusion() {
    use gnnpar::comm::World;
    use gnnpar::config::{Strategy, TrainConfig};
    use gnnpar::train::slicegcn::{SliceInput, SliceLayout, SliceModel};
    let mut rng = Rng(11);
    let n = 12;
    let mut block = random_block(&mut rng, n, n).with_self_loops();
    // Global ids 0..n: the degree table below is indexed by them.
    block.src_nodes = (0..n as u32).collect();
    let degrees: Vec<u32> = (0..n)
        .map(|v| block.indices.iter().filter(|&&u| u as usize == v).count() as u32)
        .collect();
    let x = rng.matrix(n, 5, 1.0);
    let keys: Vec<u64> = (0..n as u64).collect();
    let rows: Vec<usize> = vec![0, 2, 3, 5, 7, 8, 11];
    let labels: Vec<i64> = rows.iter().map(|&r| (r % 3) as i64).collect();
    let world = World::solo();
    let cfg = TrainConfig {
        model: ModelKind::Gcn,
        strategy: Strategy::Slicegcn,
        layers: 2,
        hidden: 6,
        dropout: 0.2,
        input_dropout: Some(0.0),
        slice_encoding: true,
        feature_fusion: true,
        full_batch: true,
        ..TrainConfig::default()
    };
    let layout = SliceLayout::new(0, 1, 5, cfg.hidden, 1.0, true).unwrap();
    let mut model = SliceModel::new(layout, &cfg, 3, 4).unwrap();
    let transpose = LazyTranspose::default();
    let input = SliceInput {
        graph: &block,
        transpose: &transpose,
        x: &x,
        keys: &keys,
        gcn_degrees: Some(&degrees),
    };
    let stream = 77;
    // Biases start at zero, so a row whose fusion hidden units are all dead fuses to exactly
    // zero, and GCN pre-activations fed only by such rows sit exactly on ReLU's kink: there the
    // loss has no derivative in the fusion's output bias (measured: one-sided slopes -0.051 and
    // -0.004 at any step) and the analytic value is a subgradient. Move every shared value off
    // its initial point so that no pre-activation is exactly zero.
    // The encoding and the fusion come before the classifier in the shared store.
    let reduced = model
        .shared
        .entries
        .iter()
        .find(|e| e.name.starts_with("head"))
        .expect("the classifier's parameters")
        .offset;
    let jitter = rng.matrix(1, reduced, 0.05);
    for (v, j) in model.shared.values.iter_mut().zip(jitter.iter()) {
        *v += j;
    }
    model.train_step(&world, &input, &rows, &labels, stream);
    let analytic = model.shared.grads.clone();
    assert!(model.encoding.is_some() && model.fusion.is_some());
    // Only the encoding and the fusion (the classifier is an MLP, checked on its own).
    assert!(analytic[..reduced].iter().any(|&g| g != 0.0));
    let mut vals = model.shared.values[..reduced].to_vec();
    let base = model.shared.values.clone();
    check_coords(
        "slicegcn encoding + fusion",
        &mut vals,
        &analytic[..reduced],
        |v| {
            let mut values = base.clone();
            values[..reduced].copy_from_slice(v);
            model.shared.values.copy_from_slice(&values);
            let loss = model.train_step(&world, &input, &rows, &labels, stream);
            loss / rows.len() as f64
        },
    );
}
