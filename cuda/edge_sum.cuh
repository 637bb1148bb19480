// The inner loop of every CSR row sum (aggregation over a block, sparse products): one warp
// adds its edges' weighted source rows, lanes over columns, in edge order, as rounded
// products and sums (bitwise the CPU's order).

#ifndef GNNPAR_EDGE_SUM_CUH
#define GNNPAR_EDGE_SUM_CUH

#include "common.cuh"

#define GNN_AGG_COLS 4   // columns per lane per pass (a pass covers 128 columns)
#define GNN_AGG_EDGES 4  // source rows loaded before they are added

// acc[j] ← acc[j] + w_e · rows[u_e · stride + offset + c0 + lane + 32·j] over the edges
// e ∈ [beg, end) in order, where load(e, &u_e, &w_e) gives an edge's row and weight. Lanes
// load 32 edges at a time, broadcast them by shuffles, and read GNN_AGG_EDGES source rows
// before adding them (in order). Every lane of the warp must call it.
template <class Load>
GNN_DEV void gnn_edge_sum(float (&acc)[GNN_AGG_COLS], gnn_u64 beg, gnn_u64 end, Load load,
                          const float* rows, gnn_u64 stride, gnn_u64 offset, gnn_u32 c0,
                          gnn_u32 cols, gnn_u32 lane) {
    for (gnn_u64 e0 = beg; e0 < end; e0 += 32) {
        gnn_u64 my_row = 0;
        float my_w = 0.0f;
        if (e0 + lane < end) load(e0 + lane, &my_row, &my_w);
        const gnn_u64 left = end - e0;
        const int cnt = left < 32 ? (int)left : 32;
        int k = 0;
        for (; k + GNN_AGG_EDGES <= cnt; k += GNN_AGG_EDGES) {
            float v[GNN_AGG_EDGES][GNN_AGG_COLS];
            float w[GNN_AGG_EDGES];
            for (int t = 0; t < GNN_AGG_EDGES; ++t) {
                const gnn_u64 row = __shfl_sync(GNN_FULL_MASK, my_row, k + t);
                w[t] = __shfl_sync(GNN_FULL_MASK, my_w, k + t);
                const float* src = rows + row * stride + offset;
                for (int j = 0; j < GNN_AGG_COLS; ++j) {
                    const gnn_u32 c = c0 + lane + 32 * j;
                    v[t][j] = c < cols ? src[c] : 0.0f;
                }
            }
            for (int t = 0; t < GNN_AGG_EDGES; ++t)
                for (int j = 0; j < GNN_AGG_COLS; ++j) acc[j] = gnn_axpy(acc[j], w[t], v[t][j]);
        }
        for (; k < cnt; ++k) {
            const gnn_u64 row = __shfl_sync(GNN_FULL_MASK, my_row, k);
            const float wk = __shfl_sync(GNN_FULL_MASK, my_w, k);
            const float* src = rows + row * stride + offset;
            for (int j = 0; j < GNN_AGG_COLS; ++j) {
                const gnn_u32 c = c0 + lane + 32 * j;
                if (c < cols) acc[j] = gnn_axpy(acc[j], wk, src[c]);
            }
        }
    }
}

#endif
