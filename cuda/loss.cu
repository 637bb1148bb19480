// Losses on logits (src/backend/cpu/loss.rs): per-row losses for the host to sum in order (as
// f64, like the CPU), and the gradient of the summed loss, times `scale`.

#include "common.cuh"

// Softmax cross-entropy, one warp per row of `classes` logits: loss[r] ← −log_softmax(x_r)[y_r]
// and grad_r ← (softmax(x_r) − onehot(y_r))·scale, computed as the CPU does: max, the sum of
// exp(x − max) in column order (each lane adds the row's values broadcast in order, so every
// lane holds the same sum), row ← (x − max) − ln(sum), grad ← exp(row) (− 1 at the label).
extern "C" __global__ void gnn_cross_entropy(float* grad, float* loss, const float* logits,
                                             const gnn_i64* labels, gnn_u64 rows,
                                             gnn_u32 classes, float scale) {
    const gnn_u32 lane = gnn_lane();
    for (gnn_u64 r = gnn_warp_id(); r < rows; r += gnn_warp_count()) {
        const float* x = logits + r * classes;
        float* g = grad + r * classes;
        const gnn_i64 y = labels[r];
        float m = gnn_neg_inf();
        for (gnn_u32 c = lane; c < classes; c += 32) m = gnn_max(m, x[c]);
        m = gnn_warp_max(m);
        float sum = -0.0f;  // Rust's `sum` starts at −0
        for (gnn_u32 c0 = 0; c0 < classes; c0 += 32) {
            const gnn_u32 c = c0 + lane;
            const float e = c < classes ? expf(gnn_sub(x[c], m)) : 0.0f;
            const gnn_u32 cnt = classes - c0 < 32 ? classes - c0 : 32;
            for (gnn_u32 k = 0; k < cnt; ++k) sum = gnn_add(sum, __shfl_sync(GNN_FULL_MASK, e, k));
        }
        const float log_sum = logf(sum);
        for (gnn_u32 c = lane; c < classes; c += 32) {
            const float v = gnn_sub(gnn_sub(x[c], m), log_sum);
            float p = expf(v);
            if ((gnn_i64)c == y) {
                loss[r] = -v;
                p = gnn_sub(p, 1.0f);
            }
            g[c] = gnn_mul(p, scale);
        }
    }
}

// Binary cross-entropy with logits over every element, one thread per row (the row's loss is
// an f64 sum in column order, as the CPU's): loss[r] ← Σ_c max(x, 0) − x·t + ln(1 + e^{−|x|}),
// grad ← (σ(x) − t)·scale, t = 1 where targets is non-zero, else 0.
extern "C" __global__ void gnn_bce_with_logits(float* grad, double* loss, const float* logits,
                                               const gnn_i64* targets, gnn_u64 rows,
                                               gnn_u32 cols, float scale) {
    for (gnn_u64 r = gnn_thread_id(); r < rows; r += gnn_thread_count()) {
        double acc = 0.0;
        for (gnn_u32 c = 0; c < cols; ++c) {
            const gnn_u64 i = r * cols + c;
            const float t = targets[i] != 0 ? 1.0f : 0.0f;
            const float x = logits[i];
            const float l = gnn_add(gnn_sub(gnn_max(x, 0.0f), gnn_mul(x, t)),
                                    log1pf(expf(-fabsf(x))));
            acc = gnn_dadd(acc, (double)l);
            float s;
            if (x >= 0.0f) {
                s = gnn_div(1.0f, gnn_add(1.0f, expf(-x)));
            } else {
                const float e = expf(x);
                s = gnn_div(e, gnn_add(1.0f, e));
            }
            grad[i] = gnn_mul(gnn_sub(s, t), scale);
        }
        loss[r] = acc;
    }
}

