// Column sums in a fixed order (bias and gain gradients, GAT's attention-vector gradients):
// never float atomics, so a result does not change from run to run. Two passes, as the CPU
// backend sums them (src/backend/cpu/gather.rs `column_sums`): rows are cut into chunks of
// `chunk_rows`; pass 1 sums each chunk's rows in order into its partial row, pass 2 adds the
// partials in chunk order. With the CPU's chunk size the sums are bitwise the CPU's.

#include "common.cuh"

// partials[k·cols + c] ← Σ_{r in chunk k, in order} term(r, c), starting from 0, where
// term = x[r, c], times y[r, c] when y is not null (the product rounded first), times
// coef[r·heads + c / f] when coef is not null (the CPU's `axpy(coef, row, acc)`).
// One thread per (chunk, column).
extern "C" __global__ void gnn_colsum_partial(float* partials, const float* x, const float* y,
                                              const float* coef, gnn_u64 rows, gnn_u32 cols,
                                              gnn_u32 heads, gnn_u32 f, gnn_u64 chunk_rows,
                                              gnn_u64 chunks) {
    const gnn_u64 items = chunks * cols;
    for (gnn_u64 t = gnn_thread_id(); t < items; t += gnn_thread_count()) {
        const gnn_u64 k = t / cols;
        const gnn_u32 c = (gnn_u32)(t - k * cols);
        const gnn_u64 lo = k * chunk_rows;
        const gnn_u64 hi = lo + chunk_rows < rows ? lo + chunk_rows : rows;
        const gnn_u32 h = coef ? c / f : 0;
        float acc = 0.0f;
        for (gnn_u64 r = lo; r < hi; ++r) {
            float v = x[r * cols + c];
            if (y) v = gnn_mul(v, y[r * cols + c]);
            acc = coef ? gnn_axpy(acc, coef[r * heads + h], v) : gnn_add(acc, v);
        }
        partials[t] = acc;
    }
}

// out[c] ← (out[c] +) Σ_k partials[k·cols + c], partials added in order to 0 first.
extern "C" __global__ void gnn_colsum_finish(float* out, const float* partials, gnn_u64 chunks,
                                             gnn_u32 cols, gnn_u32 accumulate) {
    for (gnn_u64 c = gnn_thread_id(); c < cols; c += gnn_thread_count()) {
        float s = 0.0f;
        for (gnn_u64 k = 0; k < chunks; ++k) s = gnn_add(s, partials[k * cols + c]);
        out[c] = accumulate ? gnn_add(out[c], s) : s;
    }
}
