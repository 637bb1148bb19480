// Element-wise activations and their backward (src/backend/cpu/activation.rs). Every
// backward reads the forward's OUTPUT, or one bit per element saying whether it is positive.
// kind: 0 = ReLU, 1 = LeakyReLU (param = slope), 2 = ELU (param = alpha).

#include "common.cuh"

GNN_DEV float gnn_act_value(gnn_u32 kind, float param, float x) {
    if (x > 0.0f) return x;
    if (kind == 0) return 0.0f;
    if (kind == 1) return gnn_mul(param, x);
    return gnn_mul(param, expm1f(x));
}

GNN_DEV float gnn_act_derivative(gnn_u32 kind, float param, float y) {
    if (y > 0.0f) return 1.0f;
    if (kind == 0) return 0.0f;
    if (kind == 1) return param;
    return gnn_add(y, param);
}

// x ← act(x) over n elements.
extern "C" __global__ void gnn_activate(float* x, gnn_u64 n, gnn_u32 kind, float param) {
    for (gnn_u64 i = gnn_thread_id(); i < n; i += gnn_thread_count())
        x[i] = gnn_act_value(kind, param, x[i]);
}

// x ← act(x) (ReLU or LeakyReLU) over n elements, bits bit i ← (x[i] > 0) after: one warp per
// 64 elements, a word per warp step.
extern "C" __global__ void gnn_activate_bits(float* x, gnn_u64 n, gnn_u32 kind, float param,
                                             gnn_u64* bits) {
    const gnn_u64 words = (n + 63) / 64;
    const gnn_u32 lane = gnn_lane();
    for (gnn_u64 w = gnn_warp_id(); w < words; w += gnn_warp_count()) {
        const gnn_u64 i0 = w * 64 + lane, i1 = i0 + 32;
        bool p0 = false, p1 = false;
        if (i0 < n) {
            const float y = gnn_act_value(kind, param, x[i0]);
            x[i0] = y;
            p0 = y > 0.0f;
        }
        if (i1 < n) {
            const float y = gnn_act_value(kind, param, x[i1]);
            x[i1] = y;
            p1 = y > 0.0f;
        }
        const gnn_u64 word = gnn_ballot64(p0, p1);
        if (lane == 0) bits[w] = word;
    }
}

// bits bit i ← (y[i] > 0) over n elements (the signs of an output, without changing it).
extern "C" __global__ void gnn_pack_positive(const float* y, gnn_u64 n, gnn_u64* bits) {
    const gnn_u64 words = (n + 63) / 64;
    const gnn_u32 lane = gnn_lane();
    for (gnn_u64 w = gnn_warp_id(); w < words; w += gnn_warp_count()) {
        const gnn_u64 i0 = w * 64 + lane, i1 = i0 + 32;
        const bool p0 = i0 < n && y[i0] > 0.0f;
        const bool p1 = i1 < n && y[i1] > 0.0f;
        const gnn_u64 word = gnn_ballot64(p0, p1);
        if (lane == 0) bits[w] = word;
    }
}

// g[i] ← g[i]·1 where bit i is set, g[i]·other elsewhere (ReLU: other = 0; LeakyReLU: slope).
extern "C" __global__ void gnn_scale_by_bits(float* g, gnn_u64 n, const gnn_u64* bits,
                                             float other) {
    for (gnn_u64 i = gnn_thread_id(); i < n; i += gnn_thread_count()) {
        const bool set = (bits[i / 64] >> (i % 64)) & 1ULL;
        g[i] = gnn_mul(g[i], set ? 1.0f : other);
    }
}

// g[i] ← g[i]·act'(y[i]) from the forward's output y.
extern "C" __global__ void gnn_activate_backward(float* g, const float* y, gnn_u64 n,
                                                 gnn_u32 kind, float param) {
    for (gnn_u64 i = gnn_thread_id(); i < n; i += gnn_thread_count())
        g[i] = gnn_mul(g[i], gnn_act_derivative(kind, param, y[i]));
}
