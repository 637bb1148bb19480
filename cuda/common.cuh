// Shared device helpers of gnnpar's kernels (cuda/*.cu).
//
// Every file compiles twice: by NVRTC for the GPU (no system headers: only built-ins), and by
// g++ under the CPU emulator (src/backend/cuda/emu.rs), whose cuda/emu/emu.h defines
// GNNPAR_EMU and the CUDA built-ins used here (threadIdx, warp collectives, __fmul_rn, …).
// Kernels are `extern "C" __global__ void gnn_…(…)` with pointer, 32/64-bit integer and float
// parameters only; the Rust wrappers in src/backend/cuda/ops/ pass them in the declared order and width.
//
// Conventions:
// * blockDim.x is a multiple of 32 (the wrappers launch 256 threads), 1-D grids, grid-stride
//   loops, so any grid size is correct;
// * matrices are dense row-major float, a row `cols` floats after the previous one;
// * bit sets are 64-bit words, bit `i % 64` of word `i / 64`;
// * where a kernel must give the CPU backend's bits, it spells every rounding step with
//   gnn_mul / gnn_add / … (never contracted into a fused multiply-add) in the CPU's order.

#ifndef GNNPAR_COMMON_CUH
#define GNNPAR_COMMON_CUH

#ifndef GNNPAR_EMU
#define GNNPAR_DYNAMIC_SHARED(T, name) extern __shared__ T name[]
#endif

typedef unsigned int gnn_u32;
typedef unsigned long long gnn_u64;
typedef long long gnn_i64;

#define GNN_FULL_MASK 0xffffffffu

#define GNN_DEV static __device__ __forceinline__

// ---- indexing ---------------------------------------------------------------------------

GNN_DEV gnn_u64 gnn_thread_id() { return (gnn_u64)blockIdx.x * blockDim.x + threadIdx.x; }
GNN_DEV gnn_u64 gnn_thread_count() { return (gnn_u64)gridDim.x * blockDim.x; }
GNN_DEV gnn_u64 gnn_warp_id() { return gnn_thread_id() / 32; }
GNN_DEV gnn_u64 gnn_warp_count() { return gnn_thread_count() / 32; }
GNN_DEV gnn_u32 gnn_lane() { return threadIdx.x & 31u; }

// ---- rounding steps that never fuse -------------------------------------------------------

GNN_DEV float gnn_mul(float a, float b) { return __fmul_rn(a, b); }
GNN_DEV float gnn_add(float a, float b) { return __fadd_rn(a, b); }
GNN_DEV float gnn_sub(float a, float b) { return __fsub_rn(a, b); }
GNN_DEV float gnn_div(float a, float b) { return __fdiv_rn(a, b); }
GNN_DEV float gnn_sqrt(float a) { return __fsqrt_rn(a); }
GNN_DEV double gnn_dadd(double a, double b) { return __dadd_rn(a, b); }
GNN_DEV float gnn_neg_inf() { return __int_as_float((int)0xff800000u); }

// `acc + w·x` as two rounded steps (the CPU's `axpy`).
GNN_DEV float gnn_axpy(float acc, float w, float x) { return gnn_add(acc, gnn_mul(w, x)); }

// The larger of two values, ignoring a NaN (Rust's f32::max).
GNN_DEV float gnn_max(float a, float b) { return fmaxf(a, b); }

// ---- warp reductions ------------------------------------------------------------------------

GNN_DEV float gnn_warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(GNN_FULL_MASK, v, o);
    return v;
}

GNN_DEV float gnn_warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(GNN_FULL_MASK, v, o));
    return v;
}

// The 64 flags of a warp, lane l's `lo` as bit l and its `hi` as bit 32 + l (every lane of
// the warp must call it).
GNN_DEV gnn_u64 gnn_ballot64(bool lo, bool hi) {
    gnn_u64 a = __ballot_sync(GNN_FULL_MASK, lo);
    gnn_u64 b = __ballot_sync(GNN_FULL_MASK, hi);
    return a | (b << 32);
}

// ---- counter-based dropout hashes (src/backend/cpu/dropout.rs, bitmask.rs) ----------------

// The murmur3 / SplitMix64 64-bit finaliser (`dropout::mix64`).
GNN_DEV gnn_u64 gnn_mix64(gnn_u64 x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33;
    return x;
}

// The 32-bit seed of the dropout row keyed by `key` (`DropoutMask::row_seed` as u32).
GNN_DEV gnn_u32 gnn_row_seed(gnn_u64 stream, gnn_u64 key) {
    return (gnn_u32)gnn_mix64(stream ^ gnn_mix64(key ^ 0x5851f42d4c957f2dULL));
}

// `bitmask::element_hash`: murmur3's 32-bit finaliser over `seed + col·φ`.
GNN_DEV gnn_u32 gnn_element_hash(gnn_u32 seed, gnn_u32 col) {
    gnn_u32 h = seed + col * 0x9e3779b9u;
    h ^= h >> 16;
    h *= 0x85ebca6bu;
    h ^= h >> 13;
    h *= 0xc2b2ae35u;
    return h ^ (h >> 16);
}

// The seed of row `r`: from per-row keys and the stream when `keys` is given, else from
// per-row seeds computed on the host (`RowDropout::seeds`).
GNN_DEV gnn_u32 gnn_seed_of_row(const gnn_u64* keys, const gnn_u32* seeds, gnn_u64 stream,
                                gnn_u64 r) {
    return keys ? gnn_row_seed(stream, keys[r]) : seeds[r];
}

// ---- flat positions ---------------------------------------------------------------------

// A position (row, column) in a row-major matrix of `cols` columns that moves forward by a
// fixed number of elements without dividing: `q = step / cols`, `rem = step % cols`.
struct GnnPos {
    gnn_u64 row;
    gnn_u64 col;
};

GNN_DEV GnnPos gnn_pos_of(gnn_u64 i, gnn_u64 cols) {
    GnnPos p;
    p.row = i / cols;
    p.col = i - p.row * cols;
    return p;
}

GNN_DEV void gnn_pos_advance(GnnPos* p, gnn_u64 q, gnn_u64 rem, gnn_u64 cols) {
    p->row += q;
    p->col += rem;
    if (p->col >= cols) {
        p->col -= cols;
        p->row += 1;
    }
}

#endif  // GNNPAR_COMMON_CUH
