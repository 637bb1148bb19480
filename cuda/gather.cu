// Row gathers and scatters by u32 index: one warp per output row, lanes over its columns.

#include "common.cuh"

// out[i] ← src[idx[i]] for i < rows (rows of `cols` floats).
extern "C" __global__ void gnn_gather_rows(float* out, const float* src, const gnn_u32* idx,
                                           gnn_u64 rows, gnn_u32 cols) {
    const gnn_u32 lane = gnn_lane();
    for (gnn_u64 i = gnn_warp_id(); i < rows; i += gnn_warp_count()) {
        const float* s = src + (gnn_u64)idx[i] * cols;
        float* o = out + i * cols;
        for (gnn_u32 j = lane; j < cols; j += 32) o[j] = s[j];
    }
}

// out[idx[i]] ← src[i] for i < rows (the transpose of a gather whose indices are distinct:
// the gradient of picked rows spread back over all rows; `out` is zeroed by the caller).
extern "C" __global__ void gnn_scatter_rows(float* out, const float* src, const gnn_u32* idx,
                                            gnn_u64 rows, gnn_u32 cols) {
    const gnn_u32 lane = gnn_lane();
    for (gnn_u64 i = gnn_warp_id(); i < rows; i += gnn_warp_count()) {
        const float* s = src + i * cols;
        float* o = out + (gnn_u64)idx[i] * cols;
        for (gnn_u32 j = lane; j < cols; j += 32) o[j] = s[j];
    }
}

// out[out_idx[i]] ← src[src_idx[i]] for i < rows (`out_idx` distinct): a gather and a scatter
// in one pass, rows of one matrix into chosen rows of another (split's layer inputs).
extern "C" __global__ void gnn_copy_rows(float* out, const gnn_u32* out_idx, const float* src,
                                         const gnn_u32* src_idx, gnn_u64 rows, gnn_u32 cols) {
    const gnn_u32 lane = gnn_lane();
    for (gnn_u64 i = gnn_warp_id(); i < rows; i += gnn_warp_count()) {
        const float* s = src + (gnn_u64)src_idx[i] * cols;
        float* o = out + (gnn_u64)out_idx[i] * cols;
        for (gnn_u32 j = lane; j < cols; j += 32) o[j] = s[j];
    }
}

// dst[targets[t]] += src[order[k]] for k in seg[t]..seg[t+1], in that order, for t < n (the
// transpose of a gather whose indices repeat: rows grouped by target on the host, one warp per
// distinct target, no atomics, so the sums are in a fixed order and bitwise the CPU's).
extern "C" __global__ void gnn_scatter_add_rows(float* dst, const float* src,
                                                const gnn_u32* targets, const gnn_u64* seg,
                                                const gnn_u32* order, gnn_u64 n, gnn_u32 cols) {
    const gnn_u32 lane = gnn_lane();
    for (gnn_u64 t = gnn_warp_id(); t < n; t += gnn_warp_count()) {
        float* o = dst + (gnn_u64)targets[t] * cols;
        const gnn_u64 begin = seg[t], end = seg[t + 1];
        for (gnn_u32 j = lane; j < cols; j += 32) {
            float acc = o[j];
            for (gnn_u64 k = begin; k < end; ++k) acc = gnn_add(acc, src[(gnn_u64)order[k] * cols + j]);
            o[j] = acc;
        }
    }
}
