// What a product's output gets after cuBLAS wrote it (src/backend/cpu/gemm.rs's epilogue):
// the bias, a ReLU recording the signs, and the next layer's input dropout recording the kept
// elements, in one pass over the output.

#include "common.cuh"

// c (rows × cols) ← drop(relu(c + bias)), each part optional:
// * bias (cols floats) when not null;
// * relu != 0: v ← v > 0 ? v : 0, and relu_bits (when not null) bit i ← (v > 0) over the flat
//   row-major elements i (`Saved::Positive`'s layout, words straddle rows);
// * dropout when keys or seeds is not null: element (r, j) kept when keep_all or
//   element_hash(seed(r), j) < keep_below, kept values scaled by `scale`, dropped ones 0;
//   kept (when not null) bit i ← kept, flat, which is KeptBits' layout as the caller checks
//   that cols is a multiple of 64.
// Each warp takes 64 consecutive elements per step (lane l: elements l and 32 + l), so a
// word of bits is one warp's ballot.
extern "C" __global__ void gnn_epilogue(float* c, gnn_u64 rows, gnn_u32 cols, const float* bias,
                                        gnn_u32 relu, gnn_u64* relu_bits, const gnn_u64* keys,
                                        const gnn_u32* seeds, gnn_u64 stream,
                                        gnn_u32 keep_below, gnn_u32 keep_all, float scale,
                                        gnn_u64* kept) {
    const gnn_u64 n = rows * (gnn_u64)cols;
    const gnn_u64 chunks = (n + 63) / 64;
    const gnn_u64 warp = gnn_warp_id(), warps = gnn_warp_count();
    const gnn_u32 lane = gnn_lane();
    if (warp >= chunks) return;  // the whole warp
    const bool dropout = keys != 0 || seeds != 0;
    const gnn_u64 ncols = cols;
    const gnn_u64 step = warps * 64;
    const gnn_u64 q = step / ncols, rem = step % ncols;
    GnnPos p0 = gnn_pos_of(warp * 64 + lane, ncols);
    GnnPos p1 = gnn_pos_of(warp * 64 + 32 + lane, ncols);
    gnn_u64 seed_row0 = ~0ULL, seed_row1 = ~0ULL;
    gnn_u32 seed0 = 0, seed1 = 0;
    for (gnn_u64 ch = warp; ch < chunks; ch += warps) {
        const gnn_u64 i0 = ch * 64 + lane, i1 = i0 + 32;
        const bool ok0 = i0 < n, ok1 = i1 < n;
        float v0 = ok0 ? c[i0] : 0.0f;
        float v1 = ok1 ? c[i1] : 0.0f;
        if (bias) {
            if (ok0) v0 = gnn_add(v0, bias[p0.col]);
            if (ok1) v1 = gnn_add(v1, bias[p1.col]);
        }
        if (relu) {
            const bool pos0 = v0 > 0.0f, pos1 = v1 > 0.0f;
            v0 = pos0 ? v0 : 0.0f;
            v1 = pos1 ? v1 : 0.0f;
            const gnn_u64 w = gnn_ballot64(ok0 && pos0, ok1 && pos1);
            if (relu_bits && lane == 0) relu_bits[ch] = w;
        }
        if (dropout) {
            bool k0 = false, k1 = false;
            if (ok0) {
                if (p0.row != seed_row0) {
                    seed0 = gnn_seed_of_row(keys, seeds, stream, p0.row);
                    seed_row0 = p0.row;
                }
                k0 = keep_all || gnn_element_hash(seed0, (gnn_u32)p0.col) < keep_below;
                v0 = k0 ? gnn_mul(v0, scale) : 0.0f;
            }
            if (ok1) {
                if (p1.row != seed_row1) {
                    seed1 = gnn_seed_of_row(keys, seeds, stream, p1.row);
                    seed_row1 = p1.row;
                }
                k1 = keep_all || gnn_element_hash(seed1, (gnn_u32)p1.col) < keep_below;
                v1 = k1 ? gnn_mul(v1, scale) : 0.0f;
            }
            const gnn_u64 w = gnn_ballot64(k0, k1);
            if (kept && lane == 0) kept[ch] = w;
        }
        if (ok0) c[i0] = v0;
        if (ok1) c[i1] = v1;
        gnn_pos_advance(&p0, q, rem, ncols);
        gnn_pos_advance(&p1, q, rem, ncols);
    }
}
