// Sparse input rows on the device (twin: src/backend/cpu/sparse.rs): mostly-zero feature rows
// (bag-of-words) as a CSR — indptr u64 (rows + 1 offsets), indices u32 (each stored entry's
// column, increasing within a row), values f32 — built from dense rows on the device, masked
// by dropout in place, multiplied by a dense matrix (x·w) and, over a transpose grouped by
// column, by the transpose (c += xᵀ·d). One warp per row (per column of x for the transpose),
// lanes over the dense columns; no atomics. Each output element adds its terms onto itself in
// entry order, as rounded products and sums: bitwise the CPU's.
//
// The transpose is `BlockTranspose` of the CSR (built on the host): t_start (u64, one group per
// column of x), t_row (the entry's row) and t_entry (its position in the CSR, so values masked
// after the transpose was built are read as they are now). Entries of a column are in
// increasing row order, so those of the first `rows` rows are a prefix of each group.

#include "common.cuh"
#include "edge_sum.cuh"

// counts[r] ← how many entries of row r of the dense rows × cols matrix x are not 0
// (NaN counts: it is stored, as the CPU's CsrMatrix::from_dense stores it).
extern "C" __global__ void gnn_count_nonzeros(const float* x, gnn_u64 rows, gnn_u32 cols,
                                              gnn_u32* counts) {
    const gnn_u32 lane = gnn_lane();
    for (gnn_u64 r = gnn_warp_id(); r < rows; r += gnn_warp_count()) {
        const float* row = x + r * cols;
        gnn_u32 n = 0;
        for (gnn_u32 c0 = 0; c0 < cols; c0 += 32) {
            const gnn_u32 c = c0 + lane;
            const bool nz = c < cols && row[c] != 0.0f;
            n += __popc(__ballot_sync(GNN_FULL_MASK, nz));
        }
        if (lane == 0) counts[r] = n;
    }
}

// The stored entries of x's rows: row r's non-zeros go to indptr[r].. (the prefix sums of
// gnn_count_nonzeros' counts), columns in increasing order, values as they are.
extern "C" __global__ void gnn_compact_rows(const float* x, gnn_u64 rows, gnn_u32 cols,
                                            const gnn_u64* indptr, gnn_u32* indices,
                                            float* values) {
    const gnn_u32 lane = gnn_lane();
    const gnn_u32 lanes_below = (1u << lane) - 1u;
    for (gnn_u64 r = gnn_warp_id(); r < rows; r += gnn_warp_count()) {
        const float* row = x + r * cols;
        gnn_u64 at = indptr[r];
        for (gnn_u32 c0 = 0; c0 < cols; c0 += 32) {
            const gnn_u32 c = c0 + lane;
            const float v = c < cols ? row[c] : 0.0f;
            const bool nz = c < cols && v != 0.0f;
            const gnn_u32 found = __ballot_sync(GNN_FULL_MASK, nz);
            if (nz) {
                const gnn_u64 k = at + __popc(found & lanes_below);
                indices[k] = c;
                values[k] = v;
            }
            at += __popc(found);
        }
    }
}

// Dropout on the stored entries of the first `rows` rows, in place: entry (r, indices[k]) is
// kept when keep_all or element_hash(seed(r), column) < keep_below and then scaled, else 0 —
// the bit the dense mask gives that element (gnn_dropout_rows).
extern "C" __global__ void gnn_sparse_dropout(float* values, const gnn_u64* indptr,
                                              const gnn_u32* indices, gnn_u64 rows,
                                              const gnn_u64* keys, const gnn_u32* seeds,
                                              gnn_u64 stream, gnn_u32 keep_below,
                                              gnn_u32 keep_all, float scale) {
    const gnn_u32 lane = gnn_lane();
    for (gnn_u64 r = gnn_warp_id(); r < rows; r += gnn_warp_count()) {
        const gnn_u32 seed = gnn_seed_of_row(keys, seeds, stream, r);
        for (gnn_u64 k = indptr[r] + lane; k < indptr[r + 1]; k += 32) {
            const bool keep = keep_all || gnn_element_hash(seed, indices[k]) < keep_below;
            values[k] = keep ? gnn_mul(values[k], scale) : 0.0f;
        }
    }
}

// out ← the dense rows × cols form of the first `rows` rows.
extern "C" __global__ void gnn_sparse_to_dense(float* out, gnn_u64 rows, gnn_u32 cols,
                                               const gnn_u64* indptr, const gnn_u32* indices,
                                               const float* values) {
    const gnn_u32 lane = gnn_lane();
    for (gnn_u64 r = gnn_warp_id(); r < rows; r += gnn_warp_count()) {
        float* o = out + r * cols;
        for (gnn_u32 c = lane; c < cols; c += 32) o[c] = 0.0f;
        // Every lane's zeros are written before any lane scatters over them.
        __syncwarp();
        for (gnn_u64 k = indptr[r] + lane; k < indptr[r + 1]; k += 32) o[indices[k]] = values[k];
    }
}

// out[i, c] ← (out[i, c] +) Σ_k values[k] · w[indices[k], c] over row i's entries in order,
// for i < rows, c < cols (`out` is rows × cols, `w` is x's columns × cols).
extern "C" __global__ void gnn_spmm(float* out, gnn_u32 accumulate, const float* w,
                                    gnn_u32 cols, const gnn_u64* indptr,
                                    const gnn_u32* indices, const float* values, gnn_u64 rows) {
    const gnn_u32 lane = gnn_lane();
    for (gnn_u64 i = gnn_warp_id(); i < rows; i += gnn_warp_count()) {
        const gnn_u64 beg = indptr[i], end = indptr[i + 1];
        float* o = out + i * cols;
        for (gnn_u32 c0 = 0; c0 < cols; c0 += 32 * GNN_AGG_COLS) {
            // Terms are added onto the output itself, in order: the CPU's sums.
            float acc[GNN_AGG_COLS];
            for (int j = 0; j < GNN_AGG_COLS; ++j) {
                const gnn_u32 c = c0 + lane + 32 * j;
                acc[j] = accumulate && c < cols ? o[c] : 0.0f;
            }
            auto load = [&](gnn_u64 k, gnn_u64* row, float* wk) {
                *row = indices[k];
                *wk = values[k];
            };
            gnn_edge_sum(acc, beg, end, load, w, cols, 0, c0, cols, lane);
            for (int j = 0; j < GNN_AGG_COLS; ++j) {
                const gnn_u32 c = c0 + lane + 32 * j;
                if (c < cols) o[c] = acc[j];
            }
        }
    }
}

// c[j, col] += Σ values[t_entry[k]] · d[t_row[k], col] over column j's entries of the first
// `rows` rows (a prefix of its group, found by binary search), for j < x_cols, col < cols
// (`c` is x_cols × cols, `d` is rows × cols).
extern "C" __global__ void gnn_spmm_tn_add(float* c, const float* d, gnn_u32 cols,
                                           const gnn_u64* t_start, const gnn_u32* t_row,
                                           const gnn_u32* t_entry, const float* values,
                                           gnn_u64 x_cols, gnn_u64 rows) {
    const gnn_u32 lane = gnn_lane();
    for (gnn_u64 j = gnn_warp_id(); j < x_cols; j += gnn_warp_count()) {
        const gnn_u64 beg = t_start[j];
        // Every lane computes the same cut, so the warp stays converged.
        gnn_u64 lo = beg, hi = t_start[j + 1];
        while (lo < hi) {
            const gnn_u64 mid = lo + (hi - lo) / 2;
            if (t_row[mid] < rows)
                lo = mid + 1;
            else
                hi = mid;
        }
        const gnn_u64 end = lo;
        if (beg == end) continue;
        float* o = c + j * cols;
        for (gnn_u32 c0 = 0; c0 < cols; c0 += 32 * GNN_AGG_COLS) {
            float acc[GNN_AGG_COLS];
            for (int t = 0; t < GNN_AGG_COLS; ++t) {
                const gnn_u32 col = c0 + lane + 32 * t;
                acc[t] = col < cols ? o[col] : 0.0f;
            }
            auto load = [&](gnn_u64 k, gnn_u64* row, float* wk) {
                *row = t_row[k];
                *wk = values[t_entry[k]];
            };
            gnn_edge_sum(acc, beg, end, load, d, cols, 0, c0, cols, lane);
            for (int t = 0; t < GNN_AGG_COLS; ++t) {
                const gnn_u32 col = c0 + lane + 32 * t;
                if (col < cols) o[col] = acc[t];
            }
        }
    }
}
