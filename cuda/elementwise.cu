// Element-wise passes over flat float arrays (a matrix, a row range, a parameter).

#include "common.cuh"

// x[i] ← value.
extern "C" __global__ void gnn_fill(float* x, gnn_u64 n, float value) {
    for (gnn_u64 i = gnn_thread_id(); i < n; i += gnn_thread_count()) x[i] = value;
}

// x[i] ← a·x[i].
extern "C" __global__ void gnn_scale(float* x, gnn_u64 n, float a) {
    for (gnn_u64 i = gnn_thread_id(); i < n; i += gnn_thread_count()) x[i] = gnn_mul(a, x[i]);
}

// y[i] ← y[i] + a·x[i] (the CPU's `axpy`: a rounded product, then a rounded sum; a = 1 is a
// plain sum).
extern "C" __global__ void gnn_axpy(float* y, const float* x, gnn_u64 n, float a) {
    for (gnn_u64 i = gnn_thread_id(); i < n; i += gnn_thread_count())
        y[i] = gnn_axpy(y[i], a, x[i]);
}

// out[i] ← a·x[i] + b·y[i], each product rounded, then the sum (a copy for a = 1, b = 0).
extern "C" __global__ void gnn_lincomb(float* out, const float* x, const float* y, gnn_u64 n,
                                       float a, float b) {
    for (gnn_u64 i = gnn_thread_id(); i < n; i += gnn_thread_count())
        out[i] = gnn_add(gnn_mul(a, x[i]), gnn_mul(b, y[i]));
}
