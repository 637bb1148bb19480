//! The train phase's price: each layer's products, aggregations (or attention) and
//! activations, forward and backward, from the calibrated kernels.

use super::{ModelShape, Order};
use crate::kinds::ModelKind;
use crate::train::plan::calibration::{Calibration, Product, Products};
use crate::train::plan::dry_run::Counts;

/// The work of one layer's forward and backward, in the order the layer picks (aggregate
/// first unless projecting first is fewer multiply-adds): its dense products, and its
/// aggregations. SAGE has two weights (self and neighbour), GCN one. Backward repeats the
/// forward's products as weight gradients and, where a gradient has to reach the layer's
/// input (every layer but the input one), as input gradients: the same flops and bytes in
/// each form, a backward form priced as the forward times its measured ratio to it
/// ([`Calibration::products`]). GAT always projects every source first ([`gat_layer_work`]).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct LayerWork {
    /// The forward pass's dense products.
    pub forward: Products,
    /// Whether backward computes the input gradient (else the weight gradients only).
    pub input_gradient: bool,
    pub aggregations: Aggregations,
    /// GAT: edges × the product's columns of its attention (logits, softmax, weighted
    /// aggregation, and their backward), priced by the calibrated `attention` operator.
    pub attention_cols: f64,
}

impl LayerWork {
    /// The forms the layer's products run in, forward and backward.
    pub fn forms(&self) -> impl Iterator<Item = Product> + '_ {
        Product::ALL
            .into_iter()
            .filter(|&f| f != Product::InputGradient || self.input_gradient)
    }

    /// Flops of every product, forward and backward.
    #[cfg(test)]
    pub fn flops(&self) -> f64 {
        self.forms().count() as f64 * self.forward.flops
    }

    /// Seconds of every product in every form ([`Calibration::products`]).
    pub fn product_seconds(&self, cal: &Calibration) -> f64 {
        let p = self.forward;
        self.forms().map(|form| cal.products(form, &p)).sum()
    }
}

/// A layer's aggregations in a step: `passes` calls (forward, and the transposed one backward
/// where a gradient has to pass it), each over `edges` edges reading rows of `width` columns.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Aggregations {
    pub edges: f64,
    pub width: f64,
    pub passes: f64,
}

impl Aggregations {
    pub fn edge_cols(&self) -> f64 {
        self.passes * self.edges * self.width
    }

    /// Seconds through the calibrated operators, each pass priced by its edges and the bytes
    /// of the rows they read: the forward by `aggregate` (`calibrate::aggregate_points`), a
    /// backward one by `aggregate_transpose` (its transpose built on the host included), or
    /// as a forward one where the calibration has no such points.
    pub fn seconds(&self, cal: &Calibration) -> f64 {
        if self.passes <= 0.0 || self.edges <= 0.0 {
            return 0.0;
        }
        let pass = |op: &str| {
            cal.op(op)
                .seconds_touching(self.edges, self.edges * self.width * 4.0, 1.0)
        };
        let transposed = if cal.op("aggregate_transpose").priced() {
            "aggregate_transpose"
        } else {
            "aggregate"
        };
        pass("aggregate") + (self.passes - 1.0).max(0.0) * pass(transposed)
    }
}

pub fn layer_work(
    kind: ModelKind,
    (i, o): (f64, f64),
    (nd, ns, e): (f64, f64, f64),
    need_src: bool,
    order: Order,
) -> LayerWork {
    if kind == ModelKind::Gat {
        return gat_layer_work((i, o), (nd, ns, e), need_src);
    }
    let k = if kind == ModelKind::Sage { 2.0 } else { 1.0 };
    let agg_first = order == Order::Cheaper && e * i + nd * i * o <= ns * i * o + e * o;
    // A product of `m` rows by the `i × o` weight: its flops and the bytes of its three
    // matrices (the weight and input gradients touch as many).
    let product = |m: f64| (2.0 * m * i * o, 4.0 * (m * i + i * o + m * o));
    let ((f_self, b_self), (f_neigh, b_neigh)) = (product(nd), product(ns));
    // Aggregating first, SAGE's two weights stack into one product (`SageConv::forward`);
    // projecting first, each is a product of its own.
    let (flops, bytes, width, calls, inner) = if agg_first {
        (k * f_self, k * b_self, i, 1.0, k * i)
    } else {
        (
            f_neigh + (k - 1.0) * f_self,
            b_neigh + (k - 1.0) * b_self,
            o,
            k,
            i,
        )
    };
    // Backward: the weight gradients, the input gradients when needed, and the transposed
    // aggregation when a gradient has to pass it.
    let backward = if need_src || !agg_first { 1.0 } else { 0.0 };
    LayerWork {
        forward: Products {
            flops,
            bytes,
            calls,
            inner,
            cols: o,
        },
        input_gradient: need_src,
        aggregations: Aggregations {
            edges: e,
            width,
            passes: 1.0 + backward,
        },
        attention_cols: 0.0,
    }
}

/// GAT's layer (`nn::gat`), `o` the product's width (all heads): forward projects every
/// source (`h·W`), then the attention — each node's logits, a softmax per edge and head, the
/// weighted aggregation of `o` columns per edge — and backward the attention's gradients and
/// the projection's weight gradient (and input gradient when needed). The products are priced
/// as GEMM, the attention per edge-column by its own calibrated operator (on the 2-core VM
/// 3.5 ns per edge-column forward and backward, against 0.3 ns for one mean aggregation;
/// priced as aggregations, GAT steps came out 40-60 % under their measured time).
pub fn gat_layer_work(
    (i, o): (f64, f64),
    (_nd, ns, e): (f64, f64, f64),
    need_src: bool,
) -> LayerWork {
    LayerWork {
        forward: Products {
            flops: 2.0 * ns * i * o,
            bytes: 4.0 * (ns * i + i * o + ns * o),
            calls: 1.0,
            inner: i,
            cols: o,
        },
        input_gradient: need_src,
        aggregations: Aggregations::default(),
        attention_cols: e * o,
    }
}

/// Train-phase seconds of `c`'s layers, the input layer computed in `order`; `scanned`: a
/// sparse input layer first finds the non-zeros of dense rows (else its rows came as CSR).
/// Everything is priced layer by layer: the products by their flops and their bytes beyond
/// the core's own caches per call, the backward forms (weight and input gradients) at their
/// measured ratios to the forward ([`LayerWork::product_seconds`]), the aggregations, attention
/// and activations by their calibrated operators.
pub(super) fn compute(
    shape: &ModelShape,
    cal: &Calibration,
    c: &Counts,
    order: Order,
    scanned: bool,
) -> f64 {
    (0..shape.in_w.len())
        .map(|l| {
            let rows = (c.dst[l], c.src[l], c.edges[l]);
            activation(shape, cal, l, c.dst[l]) + layer(shape, cal, l, rows, order, scanned)
        })
        .sum()
}

/// Every layer but the last activates its `nd` output rows, and backward scales their
/// gradient by what the activation kept: two passes over `dst × out` values each way.
pub(super) fn activation(shape: &ModelShape, cal: &Calibration, l: usize, nd: f64) -> f64 {
    if l + 1 < shape.in_w.len() {
        cal.op("elementwise")
            .seconds(16.0 * nd * shape.out_w[l], 2.0)
    } else {
        0.0
    }
}

/// Layer `l`'s products and aggregations (or attention), and GCN's normalisation, over a block
/// of `nd` destinations, `ns` sources and `e` edges, forward and backward; the input layer in
/// `order`.
pub(super) fn layer(
    shape: &ModelShape,
    cal: &Calibration,
    l: usize,
    (nd, ns, e): (f64, f64, f64),
    order: Order,
    scanned: bool,
) -> f64 {
    let (i, o) = (shape.in_w[l], shape.out_w[l]);
    let norm = normalisation(shape.kind, cal, nd, ns);
    if l == 0 {
        if let Some(nnz) = shape.input_nnz {
            return norm + sparse_input_layer(shape.kind, cal, (i, o), (nd, ns, e), nnz, scanned);
        }
    }
    let w = layer_work(
        shape.kind,
        (i, o),
        (nd, ns, e),
        l > 0,
        if l == 0 { order } else { Order::Cheaper },
    );
    // GAT's layers run one attention (forward and backward) each instead of aggregations.
    norm + w.product_seconds(cal)
        + if w.attention_cols > 0.0 {
            cal.op("attention").seconds(w.attention_cols, 1.0)
        } else {
            w.aggregations.seconds(cal)
        }
}

/// A GCN layer's normalisation factors of its block, computed in every forward from the
/// block's `ns` sources and `nd` destinations (`nn::gcn`, priced by `gcn_norm`); no other
/// layer has them.
fn normalisation(kind: ModelKind, cal: &Calibration, nd: f64, ns: f64) -> f64 {
    if kind == ModelKind::Gcn {
        cal.op("gcn_norm").seconds(ns + nd, 1.0)
    } else {
        0.0
    }
}

/// An input layer on sparse rows (`nnz` stored per row, `i` columns dense): the scan that
/// finds the non-zeros when they came dense (`scanned`: the dense rows read once, priced as
/// the gather's bytes), the products
/// with the non-zeros only (`spmm`: forward `x·W` of every source, SAGE's root term on the
/// destinations too, and the weight gradients `xᵀ·d` as many; by their non-zeros and the row
/// of `o` columns each reads), and the aggregation at the
/// output width forward and transposed backward (always projected first). No input gradient.
fn sparse_input_layer(
    kind: ModelKind,
    cal: &Calibration,
    (i, o): (f64, f64),
    (nd, ns, e): (f64, f64, f64),
    nnz: f64,
    scanned: bool,
) -> f64 {
    let k = if kind == ModelKind::Sage { 2.0 } else { 1.0 };
    let rows = ns + (k - 1.0) * nd;
    // Both products read each non-zero once, and with it a row of `o` columns.
    let reads = 2.0 * nnz * rows;
    let scan = if scanned {
        cal.op("gather").seconds_touching(ns, ns * i * 4.0, 1.0)
    } else {
        0.0
    };
    let aggregations = Aggregations {
        edges: e,
        width: o,
        passes: 2.0,
    };
    scan + cal.op("spmm").seconds_touching(reads, reads * o * 4.0, k) + aggregations.seconds(cal)
}
