// Inverted dropout with counter-based masks (src/backend/cpu/dropout.rs): element (r, j) is
// kept when keep_all or element_hash(seed(r), j) < keep_below, kept values are scaled by
// `scale`, dropped ones become 0. Kept bits are KeptBits' layout: rows padded to whole words,
// bit j % 64 of word r·words_per_row + j / 64.

#include "common.cuh"

// dst ← mask(src) (dst may be src), row r seeded by keys[r] and `stream` (or seeds[r]), and
// when `kept` is not null the kept elements recorded. One warp per row, 64 columns per step.
extern "C" __global__ void gnn_dropout_rows(const float* src, float* dst, gnn_u64 rows,
                                            gnn_u32 cols, const gnn_u64* keys,
                                            const gnn_u32* seeds, gnn_u64 stream,
                                            gnn_u32 keep_below, gnn_u32 keep_all, float scale,
                                            gnn_u64* kept, gnn_u32 words_per_row) {
    const gnn_u32 lane = gnn_lane();
    for (gnn_u64 r = gnn_warp_id(); r < rows; r += gnn_warp_count()) {
        const gnn_u32 seed = gnn_seed_of_row(keys, seeds, stream, r);
        const float* s = src + r * cols;
        float* d = dst + r * cols;
        for (gnn_u32 w = 0; w < words_per_row; ++w) {
            const gnn_u32 j0 = w * 64 + lane, j1 = j0 + 32;
            bool k0 = false, k1 = false;
            if (j0 < cols) {
                k0 = keep_all || gnn_element_hash(seed, j0) < keep_below;
                d[j0] = k0 ? gnn_mul(s[j0], scale) : 0.0f;
            }
            if (j1 < cols) {
                k1 = keep_all || gnn_element_hash(seed, j1) < keep_below;
                d[j1] = k1 ? gnn_mul(s[j1], scale) : 0.0f;
            }
            const gnn_u64 word = gnn_ballot64(k0, k1);
            if (kept && lane == 0) kept[r * words_per_row + w] = word;
        }
    }
}

// g ← mask(g) from recorded bits: g·scale where kept, 0 elsewhere (a dropout's backward).
extern "C" __global__ void gnn_dropout_from_bits(float* g, gnn_u64 rows, gnn_u32 cols,
                                                 const gnn_u64* kept, gnn_u32 words_per_row,
                                                 float scale) {
    const gnn_u32 lane = gnn_lane();
    for (gnn_u64 r = gnn_warp_id(); r < rows; r += gnn_warp_count()) {
        float* row = g + r * cols;
        const gnn_u64* bits = kept + r * words_per_row;
        for (gnn_u32 j = lane; j < cols; j += 32) {
            const bool k = (bits[j / 64] >> (j % 64)) & 1ULL;
            row[j] = k ? gnn_mul(row[j], scale) : 0.0f;
        }
    }
}

// out[i] ← a[i] & b[i] over n words (kept bits and'ed with a ReLU's signs).
extern "C" __global__ void gnn_bits_and(gnn_u64* out, const gnn_u64* a, const gnn_u64* b,
                                        gnn_u64 n) {
    for (gnn_u64 i = gnn_thread_id(); i < n; i += gnn_thread_count()) out[i] = a[i] & b[i];
}
