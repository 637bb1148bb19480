// Layer normalisation per row (src/backend/cpu/norm.rs): y = (x − mean) / sqrt(var + eps) ·
// gain + bias, keeping xhat = (x − mean) / sqrt(var + eps) and 1 / sqrt(var + eps) per row for
// the backward. One warp per row. The row sums are the CPU's: sequential in column order
// (from −0, as Rust's `sum` starts), so the results are bitwise the CPU's: the warp reads 32
// columns at a time (coalesced) into a per-warp staging area in shared memory, and lane 0 adds
// them in order while the other lanes wait. The gain and bias gradients are column sums
// (reduce.cu).

#include "common.cuh"

// Staging per warp: 32 floats per sum, at most 32 warps per block.
#define GNN_LN_WARPS 32

// Σ_{j < dim} term(j) in column order from −0, on every lane (every lane must call it).
template <class Term>
GNN_DEV float gnn_row_sum(float* stage, gnn_u32 dim, gnn_u32 lane, Term term) {
    float s = -0.0f;
    for (gnn_u32 c0 = 0; c0 < dim; c0 += 32) {
        if (c0 + lane < dim) stage[lane] = term(c0 + lane);
        __syncwarp();
        if (lane == 0) {
            const gnn_u32 cnt = dim - c0 < 32 ? dim - c0 : 32;
            for (gnn_u32 k = 0; k < cnt; ++k) s = gnn_add(s, stage[k]);
        }
        __syncwarp();
    }
    return __shfl_sync(GNN_FULL_MASK, s, 0);
}

extern "C" __global__ void gnn_layernorm_forward(float* y, float* xhat, float* inv_std,
                                                 const float* x, const float* gain,
                                                 const float* bias, gnn_u64 rows, gnn_u32 dim,
                                                 float eps) {
    __shared__ float stage_all[GNN_LN_WARPS * 32];
    float* stage = stage_all + (threadIdx.x / 32) * 32;
    const gnn_u32 lane = gnn_lane();
    const float n = (float)dim;
    for (gnn_u64 r = gnn_warp_id(); r < rows; r += gnn_warp_count()) {
        const float* xr = x + r * dim;
        const float mean =
            gnn_div(gnn_row_sum(stage, dim, lane, [&](gnn_u32 j) { return xr[j]; }), n);
        const float var = gnn_div(gnn_row_sum(stage, dim, lane,
                                               [&](gnn_u32 j) {
                                                   const float d = gnn_sub(xr[j], mean);
                                                   return gnn_mul(d, d);
                                               }),
                                  n);
        const float inv = gnn_div(1.0f, gnn_sqrt(gnn_add(var, eps)));
        if (lane == 0) inv_std[r] = inv;
        for (gnn_u32 j = lane; j < dim; j += 32) {
            const float h = gnn_mul(gnn_sub(xr[j], mean), inv);
            xhat[r * dim + j] = h;
            y[r * dim + j] = gnn_add(gnn_mul(h, gain[j]), bias[j]);
        }
    }
}

// dx = inv_std · (g − mean(g) − xhat · mean(g · xhat)) with g = dy · gain, per row (the sums in
// column order from 0, as the CPU's loop).
extern "C" __global__ void gnn_layernorm_backward(float* dx, const float* dy, const float* xhat,
                                                  const float* inv_std, const float* gain,
                                                  gnn_u64 rows, gnn_u32 dim) {
    __shared__ float stage_all[GNN_LN_WARPS * 64];
    float* sg = stage_all + (threadIdx.x / 32) * 64;
    float* sgx = sg + 32;
    const gnn_u32 lane = gnn_lane();
    const float n = (float)dim;
    for (gnn_u64 r = gnn_warp_id(); r < rows; r += gnn_warp_count()) {
        const float* d = dy + r * dim;
        const float* h = xhat + r * dim;
        float mean_g = 0.0f, mean_gx = 0.0f;
        for (gnn_u32 c0 = 0; c0 < dim; c0 += 32) {
            const gnn_u32 j = c0 + lane;
            if (j < dim) {
                const float g = gnn_mul(d[j], gain[j]);
                sg[lane] = g;
                sgx[lane] = gnn_mul(g, h[j]);
            }
            __syncwarp();
            if (lane == 0) {
                const gnn_u32 cnt = dim - c0 < 32 ? dim - c0 : 32;
                for (gnn_u32 k = 0; k < cnt; ++k) {
                    mean_g = gnn_add(mean_g, sg[k]);
                    mean_gx = gnn_add(mean_gx, sgx[k]);
                }
            }
            __syncwarp();
        }
        mean_g = gnn_div(__shfl_sync(GNN_FULL_MASK, mean_g, 0), n);
        mean_gx = gnn_div(__shfl_sync(GNN_FULL_MASK, mean_gx, 0), n);
        const float inv = inv_std[r];
        for (gnn_u32 j = lane; j < dim; j += 32) {
            const float g = gnn_mul(d[j], gain[j]);
            dx[r * dim + j] = gnn_mul(inv, gnn_sub(gnn_sub(g, mean_g), gnn_mul(h[j], mean_gx)));
        }
    }
}
