// GAT attention (src/backend/cpu/attention.rs, src/nn/gat.rs): per-node logits, the edge
// softmax over each destination's in-edges per head with a LeakyReLU, the attention-weighted
// aggregation, their backward, and the mean over heads.
//
// Projected rows `wh` have heads·f columns, head h in columns h·f..(h+1)·f. Per-edge data
// (alpha, the score gradients) is edges × heads in the block's CSR order. Sums run in the
// CPU's order with rounded steps; only expf differs from the CPU's exp.

#include "common.cuh"

// out[u, h] ← wh[u, h, :] · att[h, :] for u < rows (one thread per (u, h), in column order).
extern "C" __global__ void gnn_gat_logits(float* out, const float* wh, const float* att,
                                          gnn_u64 rows, gnn_u32 heads, gnn_u32 f) {
    const gnn_u64 items = rows * heads;
    const gnn_u64 cols = (gnn_u64)heads * f;
    for (gnn_u64 t = gnn_thread_id(); t < items; t += gnn_thread_count()) {
        const gnn_u64 u = t / heads;
        const gnn_u32 h = (gnn_u32)(t - u * heads);
        const float* x = wh + u * cols + (gnn_u64)h * f;
        const float* a = att + (gnn_u64)h * f;
        float s = -0.0f;  // Rust's `sum` starts at −0
        for (gnn_u32 j = 0; j < f; ++j) s = gnn_axpy(s, x[j], a[j]);
        out[t] = s;
    }
}

// alpha[e, h] ← softmax over e ∈ in_edges(v) of LeakyReLU(el[src_e, h] + er[v, h]), one thread
// per (v, h).
extern "C" __global__ void gnn_gat_softmax(float* alpha, const float* el, const float* er,
                                           const gnn_u64* indptr, const gnn_u32* indices,
                                           gnn_u64 num_dst, gnn_u32 heads, float slope) {
    const gnn_u64 items = num_dst * heads;
    for (gnn_u64 t = gnn_thread_id(); t < items; t += gnn_thread_count()) {
        const gnn_u64 v = t / heads;
        const gnn_u32 h = (gnn_u32)(t - v * heads);
        const gnn_u64 beg = indptr[v], end = indptr[v + 1];
        if (beg == end) continue;
        const float r = er[t];
        float m = gnn_neg_inf();
        for (gnn_u64 e = beg; e < end; ++e) {
            const float s = gnn_add(el[(gnn_u64)indices[e] * heads + h], r);
            const float z = s > 0.0f ? s : gnn_mul(slope, s);
            alpha[e * heads + h] = z;
            m = gnn_max(m, z);
        }
        float sum = 0.0f;
        for (gnn_u64 e = beg; e < end; ++e) {
            const float a = expf(gnn_sub(alpha[e * heads + h], m));
            alpha[e * heads + h] = a;
            sum = gnn_add(sum, a);
        }
        const float inv = gnn_div(1.0f, sum);
        for (gnn_u64 e = beg; e < end; ++e) alpha[e * heads + h] = gnn_mul(alpha[e * heads + h], inv);
    }
}

// out[v, c] ← Σ_{e ∈ in_edges(v)} alpha[e, c / f] · wh[src_e, c] (c < heads·f): one warp per
// destination, lanes over columns (4 per lane per pass), edges in order; 32 edges' sources
// loaded at once and broadcast, 4 source rows read before they are added.
extern "C" __global__ void gnn_gat_aggregate(float* out, const float* alpha, const float* wh,
                                             const gnn_u64* indptr, const gnn_u32* indices,
                                             gnn_u64 num_dst, gnn_u32 heads, gnn_u32 f) {
    const gnn_u32 lane = gnn_lane();
    const gnn_u32 cols = heads * f;
    for (gnn_u64 v = gnn_warp_id(); v < num_dst; v += gnn_warp_count()) {
        const gnn_u64 beg = indptr[v], end = indptr[v + 1];
        for (gnn_u32 c0 = 0; c0 < cols; c0 += 128) {
            float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            gnn_u32 head[4];
            for (int j = 0; j < 4; ++j) {
                const gnn_u32 c = c0 + lane + 32 * j;
                head[j] = c < cols ? c / f : 0;
            }
            for (gnn_u64 e0 = beg; e0 < end; e0 += 32) {
                const gnn_u32 my_u = e0 + lane < end ? indices[e0 + lane] : 0;
                const gnn_u64 left = end - e0;
                const int cnt = left < 32 ? (int)left : 32;
                int k = 0;
                for (; k + 4 <= cnt; k += 4) {
                    float x[4][4], w[4][4];
                    for (int t = 0; t < 4; ++t) {
                        const gnn_u64 u = __shfl_sync(GNN_FULL_MASK, my_u, k + t);
                        const gnn_u64 e = e0 + k + t;
                        for (int j = 0; j < 4; ++j) {
                            const gnn_u32 c = c0 + lane + 32 * j;
                            x[t][j] = c < cols ? wh[u * cols + c] : 0.0f;
                            w[t][j] = c < cols ? alpha[e * heads + head[j]] : 0.0f;
                        }
                    }
                    for (int t = 0; t < 4; ++t)
                        for (int j = 0; j < 4; ++j) acc[j] = gnn_axpy(acc[j], w[t][j], x[t][j]);
                }
                for (; k < cnt; ++k) {
                    const gnn_u64 u = __shfl_sync(GNN_FULL_MASK, my_u, k);
                    const gnn_u64 e = e0 + k;
                    for (int j = 0; j < 4; ++j) {
                        const gnn_u32 c = c0 + lane + 32 * j;
                        if (c < cols)
                            acc[j] = gnn_axpy(acc[j], alpha[e * heads + head[j]], wh[u * cols + c]);
                    }
                }
            }
            for (int j = 0; j < 4; ++j) {
                const gnn_u32 c = c0 + lane + 32 * j;
                if (c < cols) out[v * cols + c] = acc[j];
            }
        }
    }
}

// Backward, per destination v and head h (one thread each): d_pre[e, h] ← the gradient of the
// score of edge e before the LeakyReLU, through the softmax, and d_er[v, h] ← Σ_e d_pre[e, h].
// d_alpha[e, h] = d_out[v, h, :] · wh[src_e, h, :]; d_score = alpha ⊙ (d_alpha − Σ alpha ⊙
// d_alpha); times `slope` where the pre-activation score is ≤ 0.
extern "C" __global__ void gnn_gat_backward_dst(float* d_pre, float* d_er, const float* d_out,
                                                const float* wh, const float* el,
                                                const float* er, const float* alpha,
                                                const gnn_u64* indptr, const gnn_u32* indices,
                                                gnn_u64 num_dst, gnn_u32 heads, gnn_u32 f,
                                                float slope) {
    const gnn_u64 items = num_dst * heads;
    const gnn_u64 cols = (gnn_u64)heads * f;
    for (gnn_u64 t = gnn_thread_id(); t < items; t += gnn_thread_count()) {
        const gnn_u64 v = t / heads;
        const gnn_u32 h = (gnn_u32)(t - v * heads);
        const gnn_u64 beg = indptr[v], end = indptr[v + 1];
        const float* dv = d_out + v * cols + (gnn_u64)h * f;
        float dot = -0.0f;  // both dot products are Rust `sum`s, from −0
        for (gnn_u64 e = beg; e < end; ++e) {
            const float* x = wh + (gnn_u64)indices[e] * cols + (gnn_u64)h * f;
            float s = -0.0f;
            for (gnn_u32 j = 0; j < f; ++j) s = gnn_axpy(s, dv[j], x[j]);
            d_pre[e * heads + h] = s;
            dot = gnn_axpy(dot, alpha[e * heads + h], s);
        }
        const float r = er[t];
        float sum = 0.0f;
        for (gnn_u64 e = beg; e < end; ++e) {
            const gnn_u64 eh = e * heads + h;
            float g = gnn_mul(alpha[eh], gnn_sub(d_pre[eh], dot));
            const float s = gnn_add(el[(gnn_u64)indices[e] * heads + h], r);
            if (s <= 0.0f) g = gnn_mul(g, slope);
            d_pre[eh] = g;
            sum = gnn_add(sum, g);
        }
        d_er[t] = sum;
    }
}

// d_el[u, h] ← Σ over the transposed edges k of source u of d_pre[t_edge[k], h] (one thread per
// (u, h), in the transposed order).
extern "C" __global__ void gnn_gat_backward_src_logits(float* d_el, const float* d_pre,
                                                       const gnn_u64* t_indptr,
                                                       const gnn_u32* t_edge, gnn_u64 num_src,
                                                       gnn_u32 heads) {
    const gnn_u64 items = num_src * heads;
    for (gnn_u64 t = gnn_thread_id(); t < items; t += gnn_thread_count()) {
        const gnn_u64 u = t / heads;
        const gnn_u32 h = (gnn_u32)(t - u * heads);
        float s = 0.0f;
        for (gnn_u64 k = t_indptr[u]; k < t_indptr[u + 1]; ++k)
            s = gnn_add(s, d_pre[(gnn_u64)t_edge[k] * heads + h]);
        d_el[t] = s;
    }
}

// d_wh[u, c] ← Σ_k alpha[e_k, h] · d_out[v_k, c] over the transposed edges of u, then
// + d_el[u, h] · att_src[h, j], then (u < num_dst) + d_er[u, h] · att_dst[h, j], where
// c = h·f + j: one warp per source, lanes over columns.
extern "C" __global__ void gnn_gat_backward_src(float* d_wh, const float* d_out,
                                                const float* alpha, const float* d_el,
                                                const float* d_er, const float* att_src,
                                                const float* att_dst, const gnn_u64* t_indptr,
                                                const gnn_u32* t_dst, const gnn_u32* t_edge,
                                                gnn_u64 num_src, gnn_u64 num_dst,
                                                gnn_u32 heads, gnn_u32 f) {
    const gnn_u32 lane = gnn_lane();
    const gnn_u32 cols = heads * f;
    for (gnn_u64 u = gnn_warp_id(); u < num_src; u += gnn_warp_count()) {
        const gnn_u64 beg = t_indptr[u], end = t_indptr[u + 1];
        for (gnn_u32 c = lane; c < cols; c += 32) {
            const gnn_u32 h = c / f;
            float g = 0.0f;
            for (gnn_u64 k = beg; k < end; ++k)
                g = gnn_axpy(g, alpha[(gnn_u64)t_edge[k] * heads + h],
                             d_out[(gnn_u64)t_dst[k] * cols + c]);
            g = gnn_axpy(g, d_el[u * heads + h], att_src[c]);
            if (u < num_dst) g = gnn_axpy(g, d_er[u * heads + h], att_dst[c]);
            d_wh[u * cols + c] = g;
        }
    }
}

// out[v, j] ← Σ_h inv · x[v, h·f + j] (heads in order from 0; inv = 1 / heads).
extern "C" __global__ void gnn_mean_heads(float* out, const float* x, gnn_u64 rows,
                                          gnn_u32 heads, gnn_u32 f, float inv) {
    const gnn_u64 items = rows * f;
    for (gnn_u64 t = gnn_thread_id(); t < items; t += gnn_thread_count()) {
        const gnn_u64 v = t / f;
        const gnn_u32 j = (gnn_u32)(t - v * f);
        const float* row = x + v * heads * f;
        float s = 0.0f;
        for (gnn_u32 h = 0; h < heads; ++h) s = gnn_axpy(s, inv, row[(gnn_u64)h * f + j]);
        out[t] = s;
    }
}

// out[v, h·f + j] ← dz[v, j] · inv for every head h (the backward of gnn_mean_heads).
extern "C" __global__ void gnn_spread_heads(float* out, const float* dz, gnn_u64 rows,
                                            gnn_u32 heads, gnn_u32 f, float inv) {
    const gnn_u64 cols = (gnn_u64)heads * f;
    const gnn_u64 items = rows * cols;
    for (gnn_u64 t = gnn_thread_id(); t < items; t += gnn_thread_count()) {
        const gnn_u64 v = t / cols;
        const gnn_u64 c = t - v * cols;
        out[t] = gnn_mul(dz[v * f + c % f], inv);
    }
}
