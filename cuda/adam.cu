// Adam / AdamW over the flat parameter buffer (src/nn/adam.rs), in place on the device, with
// the CPU's operations in its order, each rounded (so bitwise the CPU's update). The host
// computes the step's constants as the CPU does (bias corrections in f64, then f32).

#include "common.cuh"

// For each i < n: grad = g[i]; with wd ≠ 0, decoupled: p ← p·decay (decay = 1 − lr·wd), else
// grad ← grad + wd·p; m ← m + (1 − β1)·(grad − m); v ← v·β2 + ((1 − β2)·grad)·grad;
// p ← p − (step_size·m) / (sqrt(v) / bc2_sqrt + eps).
extern "C" __global__ void gnn_adam(float* p, const float* g, float* m, float* v, gnn_u64 n,
                                    float one_minus_b1, float b2, float one_minus_b2, float wd,
                                    gnn_u32 decoupled, float decay, float step_size,
                                    float bc2_sqrt, float eps) {
    for (gnn_u64 i = gnn_thread_id(); i < n; i += gnn_thread_count()) {
        float grad = g[i];
        float pi = p[i];
        if (wd != 0.0f) {
            if (decoupled)
                pi = gnn_mul(pi, decay);
            else
                grad = gnn_axpy(grad, wd, pi);
        }
        float mi = m[i];
        mi = gnn_add(mi, gnn_mul(one_minus_b1, gnn_sub(grad, mi)));
        float vi = gnn_add(gnn_mul(v[i], b2), gnn_mul(gnn_mul(one_minus_b2, grad), grad));
        const float denom = gnn_add(gnn_div(gnn_sqrt(vi), bc2_sqrt), eps);
        pi = gnn_sub(pi, gnn_div(gnn_mul(step_size, mi), denom));
        m[i] = mi;
        v[i] = vi;
        p[i] = pi;
    }
}
