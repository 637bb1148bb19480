// CSR aggregation over a block and its transpose (src/backend/cpu/aggregate.rs), one warp
// per output row, lanes over its columns: every edge's source row is read as whole 128-byte
// lines, 32 edges' indices and weights are loaded at once and broadcast by shuffles, and 4
// edges' rows are in flight at a time. Each column adds its terms in edge order, as rounded
// products and sums, so results are bitwise the CPU's. No atomics: the transpose gathers over
// the transposed CSR.
//
// Index widths: indptr u64 (any edge count), indices / transposed destinations and edge ids
// u32 (a block's sources and edges are below 2^32, as the CPU's BlockTranspose asserts).
//
// Weights (`mode`): 0 sum (1), 1 mean (1 / in-degree of the destination), 2 per edge
// (edge_w[e], the block's CSR order), 3 factored (src_w[u] per edge, the destination's sum
// then scaled by dst_w[v]: GCN's normalisation).

#include "common.cuh"
#include "edge_sum.cuh"

// out[i, out_offset + c] ← Σ_{e ∈ in_edges(i)} w_e · x[indices[e], c] for i < num_dst, c < cols
// (rows of `out` are out_stride floats apart); with copy_own, out[i, c] ← x[i, c] too
// (`aggregate_beside`: [x_dst | aggregate], out_stride = 2·cols, out_offset = cols).
extern "C" __global__ void gnn_aggregate(float* out, gnn_u64 out_stride, gnn_u64 out_offset,
                                         gnn_u32 copy_own, const float* x, gnn_u32 cols,
                                         const gnn_u64* indptr, const gnn_u32* indices,
                                         gnn_u64 num_dst, gnn_u32 mode, const float* edge_w,
                                         const float* src_w, const float* dst_w) {
    const gnn_u32 lane = gnn_lane();
    for (gnn_u64 i = gnn_warp_id(); i < num_dst; i += gnn_warp_count()) {
        const gnn_u64 beg = indptr[i], end = indptr[i + 1];
        const float uniform = mode == 1 ? gnn_div(1.0f, (float)(end - beg)) : 1.0f;
        float* o = out + i * out_stride;
        for (gnn_u32 c0 = 0; c0 < cols; c0 += 32 * GNN_AGG_COLS) {
            float acc[GNN_AGG_COLS];
            for (int j = 0; j < GNN_AGG_COLS; ++j) acc[j] = 0.0f;
            auto load = [&](gnn_u64 e, gnn_u64* row, float* w) {
                *row = indices[e];
                *w = mode == 2 ? edge_w[e] : mode == 3 ? src_w[*row] : uniform;
            };
            gnn_edge_sum(acc, beg, end, load, x, cols, 0, c0, cols, lane);
            const float scale = mode == 3 ? dst_w[i] : 1.0f;
            for (int j = 0; j < GNN_AGG_COLS; ++j) {
                const gnn_u32 c = c0 + lane + 32 * j;
                if (c < cols) o[out_offset + c] = mode == 3 ? gnn_mul(acc[j], scale) : acc[j];
            }
        }
        if (copy_own) {
            const float* own = x + i * cols;
            for (gnn_u32 c = lane; c < cols; c += 32) o[c] = own[c];
        }
    }
}

// The transpose: out[u, c] ← Σ_{k ∈ t_indptr[u]..t_indptr[u+1]} w_k · dy[t_dst[k], dy_offset + c]
// for u < num_src (rows of dy are dy_stride floats apart), where the weight of the k-th
// transposed edge (destination v = t_dst[k], block edge t_edge[k]) is 1 (sum),
// 1 / in_degree(v) from the block's indptr (mean), edge_w[t_edge[k]] (per edge) or dst_w[v]
// with the sum then scaled by src_w[u] (factored). Then, with add_own and u < num_dst, the
// row adds dy[u, c] (the own half of `aggregate_beside`'s gradient); with `kept`, the row is
// masked by a dropout's recorded bits (kept: words_per_row words per row, scale).
extern "C" __global__ void gnn_aggregate_transpose(
    float* out, const float* dy, gnn_u64 dy_stride, gnn_u64 dy_offset, gnn_u32 cols,
    const gnn_u64* t_indptr, const gnn_u32* t_dst, const gnn_u32* t_edge, gnn_u64 num_src,
    const gnn_u64* indptr, gnn_u64 num_dst, gnn_u32 mode, const float* edge_w,
    const float* src_w, const float* dst_w, gnn_u32 add_own, const gnn_u64* kept,
    gnn_u32 words_per_row, float kept_scale) {
    const gnn_u32 lane = gnn_lane();
    for (gnn_u64 u = gnn_warp_id(); u < num_src; u += gnn_warp_count()) {
        const gnn_u64 beg = t_indptr[u], end = t_indptr[u + 1];
        float* o = out + u * cols;
        for (gnn_u32 c0 = 0; c0 < cols; c0 += 32 * GNN_AGG_COLS) {
            float acc[GNN_AGG_COLS];
            for (int j = 0; j < GNN_AGG_COLS; ++j) acc[j] = 0.0f;
            auto load = [&](gnn_u64 k, gnn_u64* row, float* w) {
                const gnn_u64 v = t_dst[k];
                *row = v;
                if (mode == 1)
                    *w = gnn_div(1.0f, (float)(indptr[v + 1] - indptr[v]));
                else if (mode == 2)
                    *w = edge_w[t_edge[k]];
                else if (mode == 3)
                    *w = dst_w[v];
                else
                    *w = 1.0f;
            };
            gnn_edge_sum(acc, beg, end, load, dy, dy_stride, dy_offset, c0, cols, lane);
            const float scale = mode == 3 ? src_w[u] : 1.0f;
            const float* own = dy + u * dy_stride;
            const gnn_u64* bits = kept ? kept + u * words_per_row : 0;
            for (int j = 0; j < GNN_AGG_COLS; ++j) {
                const gnn_u32 c = c0 + lane + 32 * j;
                if (c >= cols) continue;
                float v = mode == 3 ? gnn_mul(acc[j], scale) : acc[j];
                if (add_own && u < num_dst) v = gnn_add(v, own[c]);
                if (bits) v = ((bits[c / 64] >> (c % 64)) & 1ULL) ? gnn_mul(v, kept_scale) : 0.0f;
                o[c] = v;
            }
        }
    }
}
