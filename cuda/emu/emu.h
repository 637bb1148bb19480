// The CUDA emulator's header: force-included (`g++ -include emu.h`) before every `cuda/*.cu`
// when src/backend/cuda/emu.rs compiles the kernels for the CPU. It makes the subset of CUDA C++
// that gnnpar's kernels use compile with g++, and runs a launch on the calling CPU thread:
//
// * blocks run one after another; the threads of a block are cooperative fibers on one OS
//   thread (a small hand-written context switch on x86-64, ucontext elsewhere). A thread runs
//   until it reaches __syncthreads() or a warp collective, then the next runnable thread runs.
//   A thread that never waits runs to its end on the stack of the previous one: a kernel that
//   never synchronises costs one function call per thread.
// * __syncthreads() releases when every thread of the block waits at the same one; a warp
//   collective (__shfl_*_sync, __ballot_sync, __syncwarp, ...) when every lane named in its
//   mask has arrived with the same mask. Every lane deposits its operand in its slot; the last
//   to arrive computes every lane's result, exactly as the PTX instruction defines it.
// * misuse fails the launch with a message naming the kernel, the block and the thread instead
//   of hanging or passing by luck: a divergent barrier (some threads exited, or threads wait at
//   different __syncthreads()), a collective whose mask names an exited or absent lane or
//   leaves out the caller, different collectives with one mask, __trap(). A shuffle that reads
//   a lane outside the mask returns a poison value (NaN for floats).
// * `__shared__` is a `static` (one block runs at a time, so static storage is per block); the
//   dynamic shared memory of GNNPAR_DYNAMIC_SHARED is refilled with 0xff bytes (NaN) before
//   every block, as fresh device memory from the emulator is, so reading what nobody wrote shows.
//
// Restrictions a kernel author must know: no inline PTX (asm), no `extern __shared__` (use
// GNNPAR_DYNAMIC_SHARED inside the kernel), no `<<<...>>>` launches from the device, about
// 60 KiB of stack per thread (an overflow hits a guard page: SIGSEGV), kernels declared
// `extern "C" __global__ void name(` in `.cu` files, 32- or 64-bit shuffles only.
// Atomics are exact (threads never interleave inside one) but a race that a GPU would show
// (a plain read-modify-write by many threads) passes here: threads run in order.

#ifndef GNNPAR_EMU_H
#define GNNPAR_EMU_H

#define GNNPAR_EMU 1

// The C and C++ headers a kernel may use come first, before the CUDA qualifiers below are
// macros (libstdc++ itself spells `__attribute__((__noinline__))`).
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <cstdarg>
#include <cfloat>
#include <climits>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

#if !defined(__x86_64__) || defined(GNNPAR_EMU_UCONTEXT)
#include <ucontext.h>
#define GNNPAR_EMU_USE_UCONTEXT 1
#endif

// ---- qualifiers -----------------------------------------------------------------------------

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
#define __shared__ static
#define __constant__ static
#define __align__(n) alignas(n)
// __restrict__ is a g++ keyword already.

// ---- built-in types -------------------------------------------------------------------------

struct char2 { signed char x, y; };
struct uchar2 { unsigned char x, y; };
struct alignas(4) char4 { signed char x, y, z, w; };
struct alignas(4) uchar4 { unsigned char x, y, z, w; };
struct alignas(8) int2 { int x, y; };
struct int3 { int x, y, z; };
struct alignas(16) int4 { int x, y, z, w; };
struct alignas(8) uint2 { unsigned int x, y; };
struct uint3 { unsigned int x, y, z; };
struct alignas(16) uint4 { unsigned int x, y, z, w; };
struct alignas(16) longlong2 { long long x, y; };
struct alignas(16) ulonglong2 { unsigned long long x, y; };
struct alignas(8) float2 { float x, y; };
struct float3 { float x, y, z; };
struct alignas(16) float4 { float x, y, z, w; };
struct alignas(16) double2 { double x, y; };

struct dim3 {
    unsigned int x, y, z;
    constexpr dim3(unsigned int vx = 1, unsigned int vy = 1, unsigned int vz = 1)
        : x(vx), y(vy), z(vz) {}
    constexpr dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}
    constexpr operator uint3() const { return uint3{x, y, z}; }
};

inline int2 make_int2(int x, int y) { return int2{x, y}; }
inline int3 make_int3(int x, int y, int z) { return int3{x, y, z}; }
inline int4 make_int4(int x, int y, int z, int w) { return int4{x, y, z, w}; }
inline uint2 make_uint2(unsigned x, unsigned y) { return uint2{x, y}; }
inline uint3 make_uint3(unsigned x, unsigned y, unsigned z) { return uint3{x, y, z}; }
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return uint4{x, y, z, w}; }
inline float2 make_float2(float x, float y) { return float2{x, y}; }
inline float3 make_float3(float x, float y, float z) { return float3{x, y, z}; }
inline float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }
inline double2 make_double2(double x, double y) { return double2{x, y}; }
inline longlong2 make_longlong2(long long x, long long y) { return longlong2{x, y}; }
inline ulonglong2 make_ulonglong2(unsigned long long x, unsigned long long y) {
    return ulonglong2{x, y};
}

constexpr int warpSize = 32;

// ---- the launch, as the Rust side passes it (src/backend/cuda/emu.rs `EmuLaunch`) ------------

#define GNNPAR_EMU_ABI 1

extern "C" {
struct gnnpar_emu_launch {
    uint32_t abi;           // GNNPAR_EMU_ABI
    uint32_t grid[3];       // blocks in x, y, z
    uint32_t block[3];      // threads in x, y, z (product 1..=1024)
    uint32_t shared_bytes;  // dynamic shared memory
    uint32_t nargs;         // entries of `args`
    uint32_t reverse;       // nonzero: start and release threads in descending order
    unsigned char* shared;  // at least shared_bytes, 256-byte aligned
    void* stack_pool;       // passed back to `stack`
    // The lowest address of fiber stack `index` (stack_bytes long, a guard page below), or null.
    void* (*stack)(void* pool, uint32_t index);
    uint64_t stack_bytes;
};
}

namespace gnnpar_emu {

// ---- fibers: a context switch ---------------------------------------------------------------

// The stack a fiber may use: the pool's stacks less the colouring offset (take_stack).
#define GNNPAR_EMU_MIN_STACK (60u << 10)

#ifndef GNNPAR_EMU_USE_UCONTEXT
// gnnpar_emu_swap(save, to): push the callee-saved registers on the current stack, store the
// stack pointer in *save, load `to`, pop and return there. A fresh context is a stack whose
// top frame pops zeros and "returns" into the fiber's entry. The SSE and x87 control words are
// not switched: every fiber runs with the launching thread's (CUDA code cannot change them).
extern "C" void gnnpar_emu_swap(void** save, void* to);
asm(".pushsection .text.gnnpar_emu_swap,\"axG\",@progbits,gnnpar_emu_swap,comdat\n"
    ".weak gnnpar_emu_swap\n"
    ".hidden gnnpar_emu_swap\n"
    ".type gnnpar_emu_swap,@function\n"
    "gnnpar_emu_swap:\n"
    "  pushq %rbp\n"
    "  pushq %rbx\n"
    "  pushq %r12\n"
    "  pushq %r13\n"
    "  pushq %r14\n"
    "  pushq %r15\n"
    "  movq %rsp, (%rdi)\n"
    "  movq %rsi, %rsp\n"
    "  popq %r15\n"
    "  popq %r14\n"
    "  popq %r13\n"
    "  popq %r12\n"
    "  popq %rbx\n"
    "  popq %rbp\n"
    "  ret\n"
    ".size gnnpar_emu_swap, .-gnnpar_emu_swap\n"
    ".popsection\n");

struct Ctx {
    void* sp;
};

inline void ctx_switch(Ctx* from, Ctx* to) {
    gnnpar_emu_swap(&from->sp, to->sp);
    asm volatile("" ::: "memory");
}

// `top` is 16-byte aligned.
inline void ctx_init(Ctx* c, unsigned char* top, void (*entry)()) {
    uint64_t* sp = reinterpret_cast<uint64_t*>(top - 64);
    for (int i = 0; i < 6; ++i) sp[i] = 0;      // r15 r14 r13 r12 rbx rbp
    sp[6] = reinterpret_cast<uint64_t>(entry);  // "returned" to: rsp ≡ 8 (mod 16) there
    sp[7] = 0;                                  // the entry's own return address: none
    c->sp = sp;
}
#else
struct Ctx {
    ucontext_t uc;
};

inline void ctx_switch(Ctx* from, Ctx* to) {
    swapcontext(&from->uc, &to->uc);
    asm volatile("" ::: "memory");
}

// `top` is 16-byte aligned; the stack below it is at least GNNPAR_EMU_MIN_STACK bytes.
inline void ctx_init(Ctx* c, unsigned char* top, void (*entry)()) {
    getcontext(&c->uc);
    c->uc.uc_stack.ss_sp = top - GNNPAR_EMU_MIN_STACK;
    c->uc.uc_stack.ss_size = GNNPAR_EMU_MIN_STACK;
    c->uc.uc_link = nullptr;
    makecontext(&c->uc, entry, 0);
}
#endif

// ---- the state of a launch ------------------------------------------------------------------

enum State : uint8_t { T_NEW, T_READY, T_RUN, T_BARRIER, T_WARP, T_DONE };

enum Op : uint8_t {
    OP_SHFL_IDX,
    OP_SHFL_UP,
    OP_SHFL_DOWN,
    OP_SHFL_XOR,
    OP_BALLOT,
    OP_ANY,
    OP_ALL,
    OP_UNI,
    OP_SYNCWARP,
    OP_MATCH_ANY,
    OP_MATCH_ALL,
    OP_REDUCE_ADD,
    OP_REDUCE_MIN_U,
    OP_REDUCE_MIN_I,
    OP_REDUCE_MAX_U,
    OP_REDUCE_MAX_I,
    OP_REDUCE_AND,
    OP_REDUCE_OR,
    OP_REDUCE_XOR,
    OP_SYNCTHREADS,
    OP_SYNCTHREADS_COUNT,
    OP_SYNCTHREADS_AND,
    OP_SYNCTHREADS_OR,
};

inline const char* op_name(uint8_t op) {
    static const char* const names[] = {
        "__shfl_sync",       "__shfl_up_sync",     "__shfl_down_sync",   "__shfl_xor_sync",
        "__ballot_sync",     "__any_sync",         "__all_sync",         "__uni_sync",
        "__syncwarp",        "__match_any_sync",   "__match_all_sync",   "__reduce_add_sync",
        "__reduce_min_sync", "__reduce_min_sync",  "__reduce_max_sync",  "__reduce_max_sync",
        "__reduce_and_sync", "__reduce_or_sync",   "__reduce_xor_sync",  "__syncthreads",
        "__syncthreads_count", "__syncthreads_and", "__syncthreads_or",
    };
    return op < sizeof(names) / sizeof(names[0]) ? names[op] : "?";
}

constexpr uint32_t MAX_THREADS = 1024;
constexpr uint32_t MAX_WARPS = MAX_THREADS / 32;

struct Thread {
    Ctx ctx;
    uint3 idx;
    uint32_t tid;
    int32_t stack;  // index of its fiber stack, -1 when it holds none
    uint8_t state;
    // Its pending collective.
    uint8_t op;
    uint8_t size;  // bytes of `value`
    uint32_t mask;
    int32_t arg;
    int32_t width;
    uint64_t value;
    uint64_t poison;
    uint64_t result;
    const char* file;
    int line;
};

struct Runtime {
    std::mutex lock;  // one launch at a time per loaded library (several devices may share it)
    const gnnpar_emu_launch* launch;
    const char* kernel;
    uint3 block_idx;
    dim3 block_dim;
    dim3 grid_dim;
    uint32_t nthreads;
    uint32_t nwarps;
    bool reverse;
    unsigned char* shared;

    Thread threads[MAX_THREADS];
    Thread* cur;  // the running thread; null on the launching stack
    Ctx main;

    // Threads ready to resume, in the order they resume.
    uint32_t queue[MAX_THREADS];
    uint32_t qhead, qlen;
    uint32_t next_start;  // threads started so far
    uint32_t live;        // started or not, not yet exited
    uint32_t at_warp;     // waiting at a warp collective

    // The block barrier.
    uint32_t at_barrier;
    uint32_t bar_pred;  // threads that passed a nonzero predicate
    uint32_t bar_first;
    uint8_t bar_op;
    const char* bar_file;
    int bar_line;
    uint32_t bar_result;

    uint32_t warp_lanes[MAX_WARPS];    // lanes that exist
    uint32_t warp_arrived[MAX_WARPS];  // lanes waiting at a collective
    uint32_t warp_exited[MAX_WARPS];

    // Fiber stacks of this launch: `nstacks` obtained (the top of each in `stack_tops`),
    // `free_stacks` of them unused.
    unsigned char* stack_tops[MAX_THREADS];
    int32_t free_stacks[MAX_THREADS];
    uint32_t nfree;
    uint32_t nstacks;

    void (*thunk)(void*);
    void* thunk_ctx;

    bool threw;
    char exception[256];

    bool failed;
    std::string error;
};

inline Runtime g;

// ---- errors ---------------------------------------------------------------------------------

inline std::string fmt(const char* f, ...) __attribute__((format(printf, 1, 2)));
inline std::string fmt(const char* f, ...) {
    char buf[1024];
    va_list ap;
    va_start(ap, f);
    vsnprintf(buf, sizeof buf, f, ap);
    va_end(ap);
    return buf;
}

inline std::string where(const Thread* t) {
    return fmt("thread (%u,%u,%u)", t->idx.x, t->idx.y, t->idx.z);
}

inline std::string site(const char* file, int line) { return fmt("%s:%d", file, line); }

// Ends the launch with `msg`: back to the launching stack; the block's fibers are abandoned.
[[noreturn]] inline void fail(const std::string& msg) {
    if (!g.failed) {
        g.failed = true;
        g.error = msg;
    }
    Thread* me = g.cur;
    g.cur = nullptr;
    if (me) {
        Ctx dead;
        ctx_switch(&dead, &g.main);
    }
    // A failure on the launching stack itself cannot happen (nothing there waits).
    abort();
}

// ---- scheduling -----------------------------------------------------------------------------

inline void fiber_main();

inline int32_t take_stack() {
    if (g.nfree) return g.free_stacks[--g.nfree];
    if (g.nstacks >= MAX_THREADS) fail("the emulator ran out of fiber stacks");
    uint32_t i = g.nstacks;
    unsigned char* base =
        static_cast<unsigned char*>(g.launch->stack(g.launch->stack_pool, i));
    if (!base || g.launch->stack_bytes < GNNPAR_EMU_MIN_STACK + 4096)
        fail("the emulator could not map a fiber stack");
    // Stacks are a whole number of pages apart: without a different offset for each, the
    // frames at their tops would all fall in the same cache sets.
    uintptr_t top = reinterpret_cast<uintptr_t>(base) + g.launch->stack_bytes;
    top -= (uintptr_t(i) * 576u) & 4095u;
    g.stack_tops[i] = reinterpret_cast<unsigned char*>(top & ~uintptr_t(15));
    ++g.nstacks;
    return int32_t(i);
}

inline void start(Thread* t) {
    t->stack = take_stack();
    ctx_init(&t->ctx, g.stack_tops[t->stack], fiber_main);
}

inline void push_ready(Thread* t) {
    t->state = T_READY;
    g.queue[(g.qhead + g.qlen) % MAX_THREADS] = t->tid;
    ++g.qlen;
}

[[noreturn]] inline void fail_stuck();

// The thread to run next: a ready one, else a new one, else the block barrier opens; null when
// the block has finished. A state where nothing can ever run again fails the launch.
inline Thread* pick_next() {
    if (g.qlen) {
        Thread* t = &g.threads[g.queue[g.qhead]];
        g.qhead = (g.qhead + 1) % MAX_THREADS;
        --g.qlen;
        return t;
    }
    if (g.next_start < g.nthreads) {
        uint32_t i = g.next_start++;
        return &g.threads[g.reverse ? g.nthreads - 1 - i : i];
    }
    if (g.live == 0) return nullptr;
    if (g.at_warp == 0 && g.at_barrier == g.live && g.live == g.nthreads) {
        // Everyone waits at the barrier: open it.
        uint32_t n = g.bar_pred;
        g.bar_result = g.bar_op == OP_SYNCTHREADS_AND  ? (n == g.nthreads)
                       : g.bar_op == OP_SYNCTHREADS_OR ? (n != 0)
                                                       : n;
        g.at_barrier = 0;
        g.bar_pred = 0;
        for (uint32_t i = 0; i < g.nthreads; ++i)
            push_ready(&g.threads[g.reverse ? g.nthreads - 1 - i : i]);
        return pick_next();
    }
    fail_stuck();
}

// Gives the CPU to the next thread; returns when this one runs again.
inline void wait_here() {
    Thread* me = g.cur;
    Thread* next = pick_next();
    if (next == me) {
        me->state = T_RUN;
        return;
    }
    if (next->state == T_NEW) start(next);
    next->state = T_RUN;
    g.cur = next;
    ctx_switch(&me->ctx, &next->ctx);
    // Resumed: whoever switched here set g.cur = me.
}

inline void thread_exit(Thread* t) {
    t->state = T_DONE;
    --g.live;
    uint32_t w = t->tid >> 5, bit = 1u << (t->tid & 31);
    g.warp_exited[w] |= bit;
    for (uint32_t m = g.warp_arrived[w]; m; m &= m - 1) {
        Thread* o = &g.threads[w * 32 + __builtin_ctz(m)];
        if (o->mask & bit)
            fail(fmt("%s exited while lane %u of its warp (%s) waits for it in %s(mask 0x%08x) "
                     "at %s",
                     where(t).c_str(), o->tid & 31, where(o).c_str(), op_name(o->op), o->mask,
                     site(o->file, o->line).c_str()));
    }
    if (g.at_barrier)
        fail(fmt("divergent __syncthreads(): %s exited while %u of the block's %u threads wait "
                 "at %s() at %s (first %s)",
                 where(t).c_str(), g.at_barrier, g.nthreads, op_name(g.bar_op),
                 site(g.bar_file, g.bar_line).c_str(), where(&g.threads[g.bar_first]).c_str()));
}

inline void run_body() {
    try {
        g.thunk(g.thunk_ctx);
    } catch (const std::exception& e) {
        snprintf(g.exception, sizeof g.exception, "%s", e.what());
        g.threw = true;
    } catch (...) {
        snprintf(g.exception, sizeof g.exception, "not a std::exception");
        g.threw = true;
    }
    // Out of the handler before leaving the fiber: the exception is freed on this stack.
    if (g.threw) fail(fmt("%s threw an exception: %s", where(g.cur).c_str(), g.exception));
}

// Every fiber starts here and runs threads until one of them waits: a thread that returns
// without waiting hands its stack straight to the next new thread, with no switch.
inline void fiber_main() {
    for (;;) {
        Thread* t = g.cur;
        t->state = T_RUN;
        run_body();
        thread_exit(t);
        Thread* next = pick_next();
        if (next && next->state == T_NEW) {
            next->stack = t->stack;
            t->stack = -1;
            g.cur = next;
            continue;
        }
        g.free_stacks[g.nfree++] = t->stack;
        t->stack = -1;
        Ctx dead;
        if (!next) {
            g.cur = nullptr;
            ctx_switch(&dead, &g.main);
        } else {
            next->state = T_RUN;
            g.cur = next;
            ctx_switch(&dead, &next->ctx);
        }
        abort();  // never resumed
    }
}

// ---- block barrier --------------------------------------------------------------------------

// Out of line (as `collective`): a kernel's frame stays small and the switch path stays hot.
__attribute__((noinline)) inline unsigned barrier(uint8_t op, int pred, const char* file,
                                                  int line) {
    Thread* me = g.cur;
    if (g.at_barrier == 0) {
        g.bar_op = op;
        g.bar_file = file;
        g.bar_line = line;
        g.bar_first = me->tid;
    } else if (g.bar_line != line || g.bar_op != op ||
               (g.bar_file != file && strcmp(g.bar_file, file) != 0)) {
        fail(fmt("divergent barrier: %s reached %s() at %s while %u threads wait at %s() at %s "
                 "(first %s)",
                 where(me).c_str(), op_name(op), site(file, line).c_str(), g.at_barrier,
                 op_name(g.bar_op), site(g.bar_file, g.bar_line).c_str(),
                 where(&g.threads[g.bar_first]).c_str()));
    }
    me->op = op;
    me->file = file;
    me->line = line;
    g.bar_pred += pred != 0;
    ++g.at_barrier;
    me->state = T_BARRIER;
    wait_here();
    return g.bar_result;
}

// ---- warp collectives -----------------------------------------------------------------------

// The lane a shuffle reads (PTX `shfl.sync`, with the clamp and segment mask CUDA's
// __shfl*_sync pass for `width`); a lane outside the segment reads its own value.
inline uint32_t shfl_source(uint8_t op, uint32_t lane, int32_t b, int32_t width) {
    uint32_t segmask = uint32_t(32 - width) & 31u;
    uint32_t cval = op == OP_SHFL_UP ? 0u : 31u;
    int32_t max_lane = int32_t((lane & segmask) | (cval & ~segmask));
    int32_t min_lane = int32_t(lane & segmask);
    int32_t bval = b & 31;
    int32_t j;
    bool ok;
    switch (op) {
        case OP_SHFL_UP:
            j = int32_t(lane) - bval;
            ok = j >= max_lane;
            break;
        case OP_SHFL_DOWN:
            j = int32_t(lane) + bval;
            ok = j <= max_lane;
            break;
        case OP_SHFL_XOR:
            j = int32_t(lane) ^ bval;
            ok = j <= max_lane;
            break;
        default:
            j = min_lane | (bval & ~int32_t(segmask));
            ok = j <= max_lane;
            break;
    }
    return ok ? uint32_t(j) : lane;
}

// Every lane of `mask` (warp `w`) has arrived: compute each one's result.
inline void complete(uint32_t w, uint32_t mask) {
    Thread* lanes = &g.threads[w * 32];
    Thread* first = &lanes[__builtin_ctz(mask)];
    uint8_t op = first->op;
    for (uint32_t m = mask; m; m &= m - 1) {
        Thread* t = &lanes[__builtin_ctz(m)];
        if (t->op != op)
            fail(fmt("lanes of one warp meet at different collectives with mask 0x%08x: %s at %s "
                     "in %s, %s at %s in %s",
                     mask, op_name(first->op), site(first->file, first->line).c_str(),
                     where(first).c_str(), op_name(t->op), site(t->file, t->line).c_str(),
                     where(t).c_str()));
    }
    uint32_t ballot = 0;
    uint64_t acc = 0;
    bool all_equal = true;
    switch (op) {
        case OP_BALLOT:
        case OP_ANY:
        case OP_ALL:
        case OP_UNI:
            for (uint32_t m = mask; m; m &= m - 1) {
                uint32_t l = __builtin_ctz(m);
                if (lanes[l].value) ballot |= 1u << l;
            }
            break;
        case OP_MATCH_ALL:
            for (uint32_t m = mask; m; m &= m - 1)
                all_equal &= lanes[__builtin_ctz(m)].value == first->value;
            break;
        case OP_REDUCE_ADD:
        case OP_REDUCE_AND:
        case OP_REDUCE_OR:
        case OP_REDUCE_XOR:
        case OP_REDUCE_MIN_U:
        case OP_REDUCE_MAX_U:
        case OP_REDUCE_MIN_I:
        case OP_REDUCE_MAX_I: {
            uint32_t r = uint32_t(first->value);
            if (op == OP_REDUCE_ADD || op == OP_REDUCE_OR || op == OP_REDUCE_XOR) r = 0;
            if (op == OP_REDUCE_AND) r = ~0u;
            for (uint32_t m = mask; m; m &= m - 1) {
                uint32_t v = uint32_t(lanes[__builtin_ctz(m)].value);
                switch (op) {
                    case OP_REDUCE_ADD: r += v; break;
                    case OP_REDUCE_AND: r &= v; break;
                    case OP_REDUCE_OR: r |= v; break;
                    case OP_REDUCE_XOR: r ^= v; break;
                    case OP_REDUCE_MIN_U: r = v < r ? v : r; break;
                    case OP_REDUCE_MAX_U: r = v > r ? v : r; break;
                    case OP_REDUCE_MIN_I: r = int32_t(v) < int32_t(r) ? v : r; break;
                    default: r = int32_t(v) > int32_t(r) ? v : r; break;
                }
            }
            acc = r;
            break;
        }
        default:
            break;
    }
    for (uint32_t m = mask; m; m &= m - 1) {
        uint32_t l = __builtin_ctz(m);
        Thread* t = &lanes[l];
        switch (op) {
            case OP_SHFL_IDX:
            case OP_SHFL_UP:
            case OP_SHFL_DOWN:
            case OP_SHFL_XOR: {
                uint32_t j = shfl_source(op, l, t->arg, t->width);
                t->result = (mask >> j) & 1u ? lanes[j].value : t->poison;
                break;
            }
            case OP_BALLOT: t->result = ballot; break;
            case OP_ANY: t->result = ballot != 0; break;
            case OP_ALL: t->result = ballot == mask; break;
            case OP_UNI: t->result = ballot == 0 || ballot == mask; break;
            case OP_MATCH_ANY: {
                uint32_t same = 0;
                for (uint32_t k = mask; k; k &= k - 1) {
                    uint32_t o = __builtin_ctz(k);
                    if (lanes[o].value == t->value) same |= 1u << o;
                }
                t->result = same;
                break;
            }
            case OP_MATCH_ALL: t->result = all_equal ? mask : 0; break;
            case OP_SYNCWARP: t->result = 0; break;
            default: t->result = acc; break;
        }
    }
}

__attribute__((noinline)) inline uint64_t collective(uint8_t op, uint32_t mask, uint64_t value,
                                                    uint8_t size, int32_t arg, int32_t width,
                                                    uint64_t poison, const char* file, int line) {
    Thread* me = g.cur;
    uint32_t lane = me->tid & 31, w = me->tid >> 5, bit = 1u << lane;
    if (!(mask & bit))
        fail(fmt("%s at %s: %s (lane %u) is not in its mask 0x%08x", op_name(op),
                 site(file, line).c_str(), where(me).c_str(), lane, mask));
    if (mask & ~g.warp_lanes[w])
        fail(fmt("%s at %s: mask 0x%08x of %s names lanes 0x%08x that do not exist (a block of "
                 "%u threads)",
                 op_name(op), site(file, line).c_str(), mask, where(me).c_str(),
                 mask & ~g.warp_lanes[w], g.nthreads));
    if (mask & g.warp_exited[w]) {
        uint32_t gone = __builtin_ctz(mask & g.warp_exited[w]);
        fail(fmt("%s at %s: mask 0x%08x of %s names lane %u (%s), which has exited", op_name(op),
                 site(file, line).c_str(), mask, where(me).c_str(), gone,
                 where(&g.threads[w * 32 + gone]).c_str()));
    }
    if (op <= OP_SHFL_XOR && (width < 1 || width > 32 || (width & (width - 1))))
        fail(fmt("%s at %s: width %d is not a power of 2 in 1..32 (%s)", op_name(op),
                 site(file, line).c_str(), width, where(me).c_str()));
    me->op = op;
    me->mask = mask;
    me->value = value;
    me->size = size;
    me->arg = arg;
    me->width = width;
    me->poison = poison;
    me->file = file;
    me->line = line;
    g.warp_arrived[w] |= bit;
    if ((g.warp_arrived[w] & mask) == mask) {
        bool same = true;
        for (uint32_t m = mask; m; m &= m - 1) same &= g.threads[w * 32 + __builtin_ctz(m)].mask == mask;
        if (same) {
            complete(w, mask);
            g.warp_arrived[w] &= ~mask;
            uint32_t others = mask & ~bit;
            g.at_warp -= __builtin_popcount(others);
            if (g.reverse) {
                for (int l = 31; l >= 0; --l)
                    if ((others >> l) & 1u) push_ready(&g.threads[w * 32 + l]);
            } else {
                for (uint32_t m = others; m; m &= m - 1) push_ready(&g.threads[w * 32 + __builtin_ctz(m)]);
            }
            return me->result;
        }
    }
    me->state = T_WARP;
    ++g.at_warp;
    wait_here();
    return me->result;
}

// Nothing can run: say who waits where.
[[noreturn]] inline void fail_stuck() {
    std::string msg;
    if (g.at_warp == 0 && g.at_barrier == g.live) {
        uint32_t exited = g.nthreads - g.live;
        const Thread* gone = nullptr;
        for (uint32_t i = 0; i < g.nthreads && !gone; ++i)
            if (g.threads[i].state == T_DONE) gone = &g.threads[i];
        msg = fmt("divergent __syncthreads(): %u of the block's %u threads wait at %s() at %s "
                  "(first %s) but %u have exited (first %s)",
                  g.at_barrier, g.nthreads, op_name(g.bar_op), site(g.bar_file, g.bar_line).c_str(),
                  where(&g.threads[g.bar_first]).c_str(), exited,
                  gone ? where(gone).c_str() : "?");
    } else {
        msg = fmt("deadlock: no thread can go on (%u wait at a barrier, %u at warp collectives, "
                  "%u exited)",
                  g.at_barrier, g.at_warp, g.nthreads - g.live);
        if (g.at_barrier)
            msg += fmt("; at %s() at %s: first %s", op_name(g.bar_op),
                       site(g.bar_file, g.bar_line).c_str(),
                       where(&g.threads[g.bar_first]).c_str());
        int shown = 0;
        for (uint32_t i = 0; i < g.nthreads && shown < 4; ++i) {
            const Thread* t = &g.threads[i];
            if (t->state != T_WARP) continue;
            uint32_t w = i >> 5;
            uint32_t missing = t->mask & ~g.warp_arrived[w];
            msg += fmt("; %s waits in %s(mask 0x%08x) at %s", where(t).c_str(), op_name(t->op),
                       t->mask, site(t->file, t->line).c_str());
            if (missing)
                msg += fmt(" for lanes 0x%08x", missing);
            else
                msg += " with lanes that passed a different mask";
            ++shown;
        }
    }
    fail(msg);
}

// ---- a launch -------------------------------------------------------------------------------

inline void run_block() {
    g.qhead = g.qlen = 0;
    g.next_start = 0;
    g.live = g.nthreads;
    g.at_warp = 0;
    g.at_barrier = 0;
    g.bar_pred = 0;
    for (uint32_t i = 0; i < g.nthreads; ++i) {
        g.threads[i].state = T_NEW;
        g.threads[i].stack = -1;
    }
    for (uint32_t w = 0; w < g.nwarps; ++w) g.warp_arrived[w] = g.warp_exited[w] = 0;
    if (g.launch->shared_bytes) memset(g.shared, 0xff, g.launch->shared_bytes);
    Thread* first = pick_next();
    start(first);
    first->state = T_RUN;
    g.cur = first;
    ctx_switch(&g.main, &first->ctx);
    // Back when the block has finished or failed.
    g.cur = nullptr;
}

inline int run(const char* name, const gnnpar_emu_launch* l, void (*thunk)(void*), void* ctx,
               char* err, size_t err_len) {
    std::lock_guard<std::mutex> guard(g.lock);
    g.launch = l;
    g.kernel = name;
    g.block_dim = dim3(l->block[0], l->block[1], l->block[2]);
    g.grid_dim = dim3(l->grid[0], l->grid[1], l->grid[2]);
    g.nthreads = l->block[0] * l->block[1] * l->block[2];
    g.nwarps = (g.nthreads + 31) / 32;
    g.reverse = l->reverse != 0;
    g.shared = l->shared;
    g.thunk = thunk;
    g.thunk_ctx = ctx;
    g.failed = false;
    g.threw = false;
    g.error.clear();
    g.nfree = 0;
    g.nstacks = 0;
    for (uint32_t i = 0; i < g.nthreads; ++i) {
        Thread* t = &g.threads[i];
        t->tid = i;
        t->idx = uint3{i % l->block[0], (i / l->block[0]) % l->block[1],
                       i / (l->block[0] * l->block[1])};
    }
    for (uint32_t w = 0; w < g.nwarps; ++w) {
        uint32_t n = std::min<uint32_t>(32, g.nthreads - w * 32);
        g.warp_lanes[w] = n == 32 ? ~0u : (1u << n) - 1;
    }
    for (uint32_t z = 0; z < l->grid[2]; ++z)
        for (uint32_t y = 0; y < l->grid[1]; ++y)
            for (uint32_t x = 0; x < l->grid[0]; ++x) {
                g.block_idx = uint3{x, y, z};
                run_block();
                if (g.failed) {
                    snprintf(err, err_len, "kernel `%s`, block (%u,%u,%u): %s", name, x, y, z,
                             g.error.c_str());
                    return 1;
                }
            }
    return 0;
}

// ---- the exported entry points of a kernel --------------------------------------------------

template <class T>
const char* type_name() {
    return __PRETTY_FUNCTION__;
}

template <class T>
std::string clean_type_name() {
    std::string s = type_name<T>();
    size_t at = s.find("T = ");
    if (at == std::string::npos) return s;
    s = s.substr(at + 4);
    size_t end = s.find_first_of(";]");
    return end == std::string::npos ? s : s.substr(0, end);
}

// 'p' pointer, 'i' 32-bit integer, 'l' 64-bit integer, 'f' float, 'd' double, '?' other.
template <class T>
constexpr char kind_of() {
    if (std::is_pointer<T>::value) return 'p';
    if (std::is_same<T, float>::value) return 'f';
    if (std::is_same<T, double>::value) return 'd';
    if ((std::is_integral<T>::value || std::is_enum<T>::value) && !std::is_same<T, bool>::value) {
        if (sizeof(T) == 4) return 'i';
        if (sizeof(T) == 8) return 'l';
    }
    return '?';
}

// "kind:type;kind:type;..." of a kernel's parameters.
template <class... P>
const char* signature(void (*)(P...)) {
    static const std::string sig = [] {
        std::string s;
        const std::string parts[] = {std::string(), (std::string(1, kind_of<P>()) + ":" +
                                                     clean_type_name<P>())...};
        for (size_t i = 1; i < sizeof(parts) / sizeof(parts[0]); ++i) {
            if (i > 1) s += ';';
            s += parts[i];
        }
        return s;
    }();
    return sig.c_str();
}

template <class... P>
struct Call {
    void (*kernel)(P...);
    std::tuple<std::decay_t<P>...> args;
    static void thunk(void* self) {
        Call* c = static_cast<Call*>(self);
        std::apply(c->kernel, c->args);
    }
};

template <class... P, size_t... I>
Call<P...> unpack(void (*kernel)(P...), void** args, std::index_sequence<I...>) {
    return Call<P...>{kernel, std::tuple<std::decay_t<P>...>(
                                  *static_cast<std::decay_t<P>*>(args[I])...)};
}

template <class... P>
int launch(void (*kernel)(P...), const char* name, const gnnpar_emu_launch* l, void** args,
           char* err, size_t err_len) {
    if (l->abi != GNNPAR_EMU_ABI) {
        snprintf(err, err_len, "kernel `%s`: emulator ABI %u, library built for %u", name, l->abi,
                 GNNPAR_EMU_ABI);
        return 1;
    }
    if (l->nargs != sizeof...(P)) {
        snprintf(err, err_len, "kernel `%s` takes %zu arguments, got %u", name, sizeof...(P),
                 l->nargs);
        return 1;
    }
    uint64_t threads = uint64_t(l->block[0]) * l->block[1] * l->block[2];
    if (threads == 0 || threads > MAX_THREADS) {
        snprintf(err, err_len, "kernel `%s`: %llu threads per block", name,
                 (unsigned long long)threads);
        return 1;
    }
    auto call = unpack(kernel, args, std::index_sequence_for<P...>{});
    return run(name, l, &Call<P...>::thunk, &call, err, err_len);
}

}  // namespace gnnpar_emu

// Exports kernel `name` of the including translation unit (the wrapper emu.rs generates).
#define GNNPAR_EMU_EXPORT(name)                                                                  \
    extern "C" __attribute__((visibility("default"))) int gnnpar_emu_launch_##name(            \
        const gnnpar_emu_launch* l, void** args, char* err, size_t err_len) {                    \
        return ::gnnpar_emu::launch(name, #name, l, args, err, err_len);                         \
    }                                                                                            \
    extern "C" __attribute__((visibility("default"))) const char* gnnpar_emu_signature_##name() { \
        return ::gnnpar_emu::signature(name);                                                    \
    }

// ---- built-in variables ---------------------------------------------------------------------

#define threadIdx (static_cast<const ::uint3&>(::gnnpar_emu::g.cur->idx))
#define blockIdx (static_cast<const ::uint3&>(::gnnpar_emu::g.block_idx))
#define blockDim (static_cast<const ::dim3&>(::gnnpar_emu::g.block_dim))
#define gridDim (static_cast<const ::dim3&>(::gnnpar_emu::g.grid_dim))

// The launch's dynamic shared memory (`extern __shared__ T name[]` on the GPU), 256-byte
// aligned; use it inside a function.
#define GNNPAR_DYNAMIC_SHARED(T, name) T*& name = reinterpret_cast<T*&>(::gnnpar_emu::g.shared)

// ---- synchronisation ------------------------------------------------------------------------

#define __syncthreads() ((void)::gnnpar_emu::barrier(::gnnpar_emu::OP_SYNCTHREADS, 0, __FILE__, __LINE__))
#define __syncthreads_count(p) \
    (int(::gnnpar_emu::barrier(::gnnpar_emu::OP_SYNCTHREADS_COUNT, (p), __FILE__, __LINE__)))
#define __syncthreads_and(p) \
    (int(::gnnpar_emu::barrier(::gnnpar_emu::OP_SYNCTHREADS_AND, (p), __FILE__, __LINE__)))
#define __syncthreads_or(p) \
    (int(::gnnpar_emu::barrier(::gnnpar_emu::OP_SYNCTHREADS_OR, (p), __FILE__, __LINE__)))

namespace gnnpar_emu {
// `__syncwarp` is `SyncWarp(__FILE__, __LINE__)`, called with or without a mask.
struct SyncWarp {
    const char* file;
    int line;
    void operator()(unsigned mask = 0xffffffffu) const {
        collective(OP_SYNCWARP, mask, 0, 4, 0, 32, 0, file, line);
    }
};
inline unsigned vote(uint8_t op, const char* file, int line, unsigned mask, int pred) {
    return unsigned(collective(op, mask, pred != 0, 4, 0, 32, 0, file, line));
}

template <class T>
inline uint64_t poison_of() {
    if (std::is_same<T, float>::value) return 0x7fc0deadu;  // a quiet NaN
    if (std::is_same<T, double>::value) return 0x7ff8deaddeaddeadull;
    return 0xdeadbeefdeadbeefull;
}

template <class T>
inline T shfl(uint8_t op, const char* file, int line, unsigned mask, T var, int b, int width) {
    static_assert(sizeof(T) == 4 || sizeof(T) == 8, "a shuffle moves 32 or 64 bits");
    uint64_t bits = 0;
    memcpy(&bits, &var, sizeof(T));
    uint64_t r = collective(op, mask, bits, sizeof(T), b, width, poison_of<T>(), file, line);
    T out;
    memcpy(&out, &r, sizeof(T));
    return out;
}

// CUDA's overloads: int, unsigned, long, unsigned long, long long, unsigned long long, float,
// double (smaller integers promote to int).
#define GNNPAR_EMU_SHFL(fn, OP)                                                                  \
    inline int fn(const char* f, int l, unsigned m, int v, int b, int w = 32) {                  \
        return shfl<int>(OP, f, l, m, v, b, w);                                                  \
    }                                                                                            \
    inline unsigned fn(const char* f, int l, unsigned m, unsigned v, int b, int w = 32) {        \
        return shfl<unsigned>(OP, f, l, m, v, b, w);                                             \
    }                                                                                            \
    inline long fn(const char* f, int l, unsigned m, long v, int b, int w = 32) {                \
        return shfl<long>(OP, f, l, m, v, b, w);                                                 \
    }                                                                                            \
    inline unsigned long fn(const char* f, int l, unsigned m, unsigned long v, int b,            \
                            int w = 32) {                                                        \
        return shfl<unsigned long>(OP, f, l, m, v, b, w);                                        \
    }                                                                                            \
    inline long long fn(const char* f, int l, unsigned m, long long v, int b, int w = 32) {      \
        return shfl<long long>(OP, f, l, m, v, b, w);                                            \
    }                                                                                            \
    inline unsigned long long fn(const char* f, int l, unsigned m, unsigned long long v, int b,  \
                                 int w = 32) {                                                   \
        return shfl<unsigned long long>(OP, f, l, m, v, b, w);                                   \
    }                                                                                            \
    inline float fn(const char* f, int l, unsigned m, float v, int b, int w = 32) {              \
        return shfl<float>(OP, f, l, m, v, b, w);                                                \
    }                                                                                            \
    inline double fn(const char* f, int l, unsigned m, double v, int b, int w = 32) {            \
        return shfl<double>(OP, f, l, m, v, b, w);                                               \
    }
GNNPAR_EMU_SHFL(shfl_idx, OP_SHFL_IDX)
GNNPAR_EMU_SHFL(shfl_up, OP_SHFL_UP)
GNNPAR_EMU_SHFL(shfl_down, OP_SHFL_DOWN)
GNNPAR_EMU_SHFL(shfl_xor, OP_SHFL_XOR)
#undef GNNPAR_EMU_SHFL

inline unsigned match_any(const char* f, int l, unsigned mask, unsigned long long v, int size) {
    return unsigned(collective(OP_MATCH_ANY, mask, v, uint8_t(size), 0, 32, 0, f, l));
}
inline unsigned match_all(const char* f, int l, unsigned mask, unsigned long long v, int size,
                          int* pred) {
    unsigned r = unsigned(collective(OP_MATCH_ALL, mask, v, uint8_t(size), 0, 32, 0, f, l));
    *pred = r != 0;
    return r;
}
inline unsigned reduce(uint8_t op, const char* f, int l, unsigned mask, unsigned v) {
    return unsigned(collective(op, mask, v, 4, 0, 32, 0, f, l));
}
// __reduce_min_sync / __reduce_max_sync exist for int and unsigned: the operand's type picks.
inline unsigned reduce_min(const char* f, int l, unsigned mask, unsigned v) {
    return reduce(OP_REDUCE_MIN_U, f, l, mask, v);
}
inline int reduce_min(const char* f, int l, unsigned mask, int v) {
    return int(reduce(OP_REDUCE_MIN_I, f, l, mask, unsigned(v)));
}
inline unsigned reduce_max(const char* f, int l, unsigned mask, unsigned v) {
    return reduce(OP_REDUCE_MAX_U, f, l, mask, v);
}
inline int reduce_max(const char* f, int l, unsigned mask, int v) {
    return int(reduce(OP_REDUCE_MAX_I, f, l, mask, unsigned(v)));
}
}  // namespace gnnpar_emu

#define __syncwarp (::gnnpar_emu::SyncWarp{__FILE__, __LINE__})
#define __shfl_sync(...) ::gnnpar_emu::shfl_idx(__FILE__, __LINE__, __VA_ARGS__)
#define __shfl_up_sync(...) ::gnnpar_emu::shfl_up(__FILE__, __LINE__, __VA_ARGS__)
#define __shfl_down_sync(...) ::gnnpar_emu::shfl_down(__FILE__, __LINE__, __VA_ARGS__)
#define __shfl_xor_sync(...) ::gnnpar_emu::shfl_xor(__FILE__, __LINE__, __VA_ARGS__)
#define __ballot_sync(mask, pred) \
    ::gnnpar_emu::vote(::gnnpar_emu::OP_BALLOT, __FILE__, __LINE__, (mask), (pred))
#define __any_sync(mask, pred) \
    int(::gnnpar_emu::vote(::gnnpar_emu::OP_ANY, __FILE__, __LINE__, (mask), (pred)))
#define __all_sync(mask, pred) \
    int(::gnnpar_emu::vote(::gnnpar_emu::OP_ALL, __FILE__, __LINE__, (mask), (pred)))
#define __uni_sync(mask, pred) \
    int(::gnnpar_emu::vote(::gnnpar_emu::OP_UNI, __FILE__, __LINE__, (mask), (pred)))
#define __match_any_sync(mask, v) \
    ::gnnpar_emu::match_any(__FILE__, __LINE__, (mask), (unsigned long long)(v), int(sizeof(v)))
#define __match_all_sync(mask, v, pred)                                                          \
    ::gnnpar_emu::match_all(__FILE__, __LINE__, (mask), (unsigned long long)(v), int(sizeof(v)), \
                            (pred))
#define __reduce_add_sync(mask, v) \
    ::gnnpar_emu::reduce(::gnnpar_emu::OP_REDUCE_ADD, __FILE__, __LINE__, (mask), (v))
#define __reduce_and_sync(mask, v) \
    ::gnnpar_emu::reduce(::gnnpar_emu::OP_REDUCE_AND, __FILE__, __LINE__, (mask), (v))
#define __reduce_or_sync(mask, v) \
    ::gnnpar_emu::reduce(::gnnpar_emu::OP_REDUCE_OR, __FILE__, __LINE__, (mask), (v))
#define __reduce_xor_sync(mask, v) \
    ::gnnpar_emu::reduce(::gnnpar_emu::OP_REDUCE_XOR, __FILE__, __LINE__, (mask), (v))
#define __reduce_min_sync(mask, v) ::gnnpar_emu::reduce_min(__FILE__, __LINE__, (mask), (v))
#define __reduce_max_sync(mask, v) ::gnnpar_emu::reduce_max(__FILE__, __LINE__, (mask), (v))

// The lanes of the caller's warp that have not exited (a GPU reports those converged here;
// the emulator cannot know, so it reports every lane still alive).
inline unsigned __activemask() {
    using namespace gnnpar_emu;
    uint32_t w = g.cur->tid >> 5;
    return g.warp_lanes[w] & ~g.warp_exited[w];
}

inline unsigned __lanemask_lt() { return (1u << (::gnnpar_emu::g.cur->tid & 31)) - 1; }

[[noreturn]] inline void __trap() {
    using namespace gnnpar_emu;
    fail(fmt("%s called __trap()", where(g.cur).c_str()));
}
#define __brkpt() __trap()

inline void __threadfence() { __atomic_signal_fence(__ATOMIC_SEQ_CST); }
inline void __threadfence_block() { __atomic_signal_fence(__ATOMIC_SEQ_CST); }
inline void __threadfence_system() { __atomic_signal_fence(__ATOMIC_SEQ_CST); }
inline void __nanosleep(unsigned) {}
inline long long clock64() {
    static long long ticks = 0;
    return ++ticks;
}

// ---- atomics (exact: fibers never interleave inside one) ------------------------------------

#define GNNPAR_EMU_ATOMIC(name, T, expr) \
    inline T name(T* p, T v) {           \
        T old = *p;                      \
        *p = (expr);                     \
        return old;                      \
    }
GNNPAR_EMU_ATOMIC(atomicAdd, int, old + v)
GNNPAR_EMU_ATOMIC(atomicAdd, unsigned int, old + v)
GNNPAR_EMU_ATOMIC(atomicAdd, unsigned long long, old + v)
GNNPAR_EMU_ATOMIC(atomicAdd, float, old + v)
GNNPAR_EMU_ATOMIC(atomicAdd, double, old + v)
GNNPAR_EMU_ATOMIC(atomicSub, int, old - v)
GNNPAR_EMU_ATOMIC(atomicSub, unsigned int, old - v)
GNNPAR_EMU_ATOMIC(atomicExch, int, v)
GNNPAR_EMU_ATOMIC(atomicExch, unsigned int, v)
GNNPAR_EMU_ATOMIC(atomicExch, unsigned long long, v)
GNNPAR_EMU_ATOMIC(atomicExch, float, v)
GNNPAR_EMU_ATOMIC(atomicMin, int, v < old ? v : old)
GNNPAR_EMU_ATOMIC(atomicMin, unsigned int, v < old ? v : old)
GNNPAR_EMU_ATOMIC(atomicMin, long long, v < old ? v : old)
GNNPAR_EMU_ATOMIC(atomicMin, unsigned long long, v < old ? v : old)
GNNPAR_EMU_ATOMIC(atomicMax, int, v > old ? v : old)
GNNPAR_EMU_ATOMIC(atomicMax, unsigned int, v > old ? v : old)
GNNPAR_EMU_ATOMIC(atomicMax, long long, v > old ? v : old)
GNNPAR_EMU_ATOMIC(atomicMax, unsigned long long, v > old ? v : old)
GNNPAR_EMU_ATOMIC(atomicAnd, int, old & v)
GNNPAR_EMU_ATOMIC(atomicAnd, unsigned int, old & v)
GNNPAR_EMU_ATOMIC(atomicAnd, unsigned long long, old & v)
GNNPAR_EMU_ATOMIC(atomicOr, int, old | v)
GNNPAR_EMU_ATOMIC(atomicOr, unsigned int, old | v)
GNNPAR_EMU_ATOMIC(atomicOr, unsigned long long, old | v)
GNNPAR_EMU_ATOMIC(atomicXor, int, old ^ v)
GNNPAR_EMU_ATOMIC(atomicXor, unsigned int, old ^ v)
GNNPAR_EMU_ATOMIC(atomicXor, unsigned long long, old ^ v)
GNNPAR_EMU_ATOMIC(atomicInc, unsigned int, old >= v ? 0u : old + 1)
GNNPAR_EMU_ATOMIC(atomicDec, unsigned int, (old == 0 || old > v) ? v : old - 1)
#undef GNNPAR_EMU_ATOMIC

#define GNNPAR_EMU_CAS(T)                          \
    inline T atomicCAS(T* p, T compare, T v) {     \
        T old = *p;                                \
        if (old == compare) *p = v;                \
        return old;                                \
    }
GNNPAR_EMU_CAS(int)
GNNPAR_EMU_CAS(unsigned int)
GNNPAR_EMU_CAS(unsigned long long)
GNNPAR_EMU_CAS(unsigned short)
#undef GNNPAR_EMU_CAS

#define atomicAdd_block atomicAdd
#define atomicAdd_system atomicAdd
#define atomicMax_block atomicMax
#define atomicMin_block atomicMin
#define atomicOr_block atomicOr
#define atomicAnd_block atomicAnd
#define atomicCAS_block atomicCAS
#define atomicExch_block atomicExch

// ---- integer intrinsics ---------------------------------------------------------------------

inline int __popc(unsigned int x) { return __builtin_popcount(x); }
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline int __ffsll(long long x) { return __builtin_ffsll(x); }
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz(unsigned(x)); }
inline int __clzll(long long x) { return x == 0 ? 64 : __builtin_clzll((unsigned long long)x); }
inline unsigned int __brev(unsigned int x) {
    x = ((x >> 1) & 0x55555555u) | ((x & 0x55555555u) << 1);
    x = ((x >> 2) & 0x33333333u) | ((x & 0x33333333u) << 2);
    x = ((x >> 4) & 0x0f0f0f0fu) | ((x & 0x0f0f0f0fu) << 4);
    x = ((x >> 8) & 0x00ff00ffu) | ((x & 0x00ff00ffu) << 8);
    return (x >> 16) | (x << 16);
}
inline unsigned long long __brevll(unsigned long long x) {
    return (static_cast<unsigned long long>(__brev(unsigned(x))) << 32) | __brev(unsigned(x >> 32));
}
inline unsigned int __umulhi(unsigned int a, unsigned int b) {
    return unsigned((static_cast<unsigned long long>(a) * b) >> 32);
}
inline int __mulhi(int a, int b) { return int((static_cast<long long>(a) * b) >> 32); }
inline unsigned long long __umul64hi(unsigned long long a, unsigned long long b) {
    return static_cast<unsigned long long>((static_cast<unsigned __int128>(a) * b) >> 64);
}
inline long long __mul64hi(long long a, long long b) {
    return static_cast<long long>((static_cast<__int128>(a) * b) >> 64);
}
inline int __mul24(int a, int b) { return int((unsigned(a) << 8) >> 8) * int((unsigned(b) << 8) >> 8); }
inline unsigned __umul24(unsigned a, unsigned b) { return (a & 0xffffffu) * (b & 0xffffffu); }
inline unsigned __funnelshift_l(unsigned lo, unsigned hi, unsigned s) {
    unsigned long long v = (static_cast<unsigned long long>(hi) << 32) | lo;
    return unsigned((v << (s & 31)) >> 32);
}
inline unsigned __funnelshift_r(unsigned lo, unsigned hi, unsigned s) {
    unsigned long long v = (static_cast<unsigned long long>(hi) << 32) | lo;
    return unsigned(v >> (s & 31));
}
inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
    unsigned long long v = (static_cast<unsigned long long>(y) << 32) | x;
    unsigned r = 0;
    for (int i = 0; i < 4; ++i) r |= unsigned((v >> (((s >> (4 * i)) & 7) * 8)) & 0xff) << (8 * i);
    return r;
}

template <class T>
inline T __ldg(const T* p) {
    return *p;
}
template <class T>
inline T __ldcg(const T* p) {
    return *p;
}
template <class T>
inline T __ldca(const T* p) {
    return *p;
}
template <class T>
inline T __ldcs(const T* p) {
    return *p;
}
template <class T>
inline T __ldlu(const T* p) {
    return *p;
}
template <class T>
inline T __ldcv(const T* p) {
    return *p;
}
template <class T>
inline void __stcg(T* p, T v) {
    *p = v;
}
template <class T>
inline void __stcs(T* p, T v) {
    *p = v;
}
template <class T>
inline void __stwb(T* p, T v) {
    *p = v;
}
template <class T>
inline void __stwt(T* p, T v) {
    *p = v;
}

// min / max as CUDA overloads them (integers of each width, mixed signedness goes unsigned).
#define GNNPAR_EMU_MINMAX(T)                        \
    inline T min(T a, T b) { return a < b ? a : b; } \
    inline T max(T a, T b) { return a > b ? a : b; }
GNNPAR_EMU_MINMAX(int)
GNNPAR_EMU_MINMAX(unsigned int)
GNNPAR_EMU_MINMAX(long)
GNNPAR_EMU_MINMAX(unsigned long)
GNNPAR_EMU_MINMAX(long long)
GNNPAR_EMU_MINMAX(unsigned long long)
#undef GNNPAR_EMU_MINMAX
#define GNNPAR_EMU_MINMAX_MIXED(A, B, R)                        \
    inline R min(A a, B b) { return min(static_cast<R>(a), static_cast<R>(b)); }          \
    inline R min(B a, A b) { return min(static_cast<R>(a), static_cast<R>(b)); }          \
    inline R max(A a, B b) { return max(static_cast<R>(a), static_cast<R>(b)); }          \
    inline R max(B a, A b) { return max(static_cast<R>(a), static_cast<R>(b)); }
GNNPAR_EMU_MINMAX_MIXED(int, unsigned int, unsigned int)
GNNPAR_EMU_MINMAX_MIXED(long, unsigned long, unsigned long)
GNNPAR_EMU_MINMAX_MIXED(long long, unsigned long long, unsigned long long)
#undef GNNPAR_EMU_MINMAX_MIXED
inline float min(float a, float b) { return fminf(a, b); }
inline float max(float a, float b) { return fmaxf(a, b); }
inline double min(double a, double b) { return fmin(a, b); }
inline double max(double a, double b) { return fmax(a, b); }
inline double min(float a, double b) { return fmin(a, b); }
inline double min(double a, float b) { return fmin(a, b); }
inline double max(float a, double b) { return fmax(a, b); }
inline double max(double a, float b) { return fmax(a, b); }
inline unsigned umin(unsigned a, unsigned b) { return a < b ? a : b; }
inline unsigned umax(unsigned a, unsigned b) { return a > b ? a : b; }
inline long long llmin(long long a, long long b) { return a < b ? a : b; }
inline long long llmax(long long a, long long b) { return a > b ? a : b; }
inline unsigned long long ullmin(unsigned long long a, unsigned long long b) { return a < b ? a : b; }
inline unsigned long long ullmax(unsigned long long a, unsigned long long b) { return a > b ? a : b; }

// ---- bit casts and conversions --------------------------------------------------------------

inline unsigned int __float_as_uint(float x) {
    unsigned int u;
    memcpy(&u, &x, 4);
    return u;
}
inline int __float_as_int(float x) {
    int u;
    memcpy(&u, &x, 4);
    return u;
}
inline float __uint_as_float(unsigned int u) {
    float x;
    memcpy(&x, &u, 4);
    return x;
}
inline float __int_as_float(int u) {
    float x;
    memcpy(&x, &u, 4);
    return x;
}
inline long long __double_as_longlong(double x) {
    long long u;
    memcpy(&u, &x, 8);
    return u;
}
inline double __longlong_as_double(long long u) {
    double x;
    memcpy(&x, &u, 8);
    return x;
}
inline int __float2int_rz(float x) { return int(x); }
inline int __float2int_rn(float x) { return int(nearbyintf(x)); }
inline int __float2int_rd(float x) { return int(floorf(x)); }
inline int __float2int_ru(float x) { return int(ceilf(x)); }
inline unsigned __float2uint_rz(float x) { return unsigned(x); }
inline unsigned __float2uint_rn(float x) { return unsigned(nearbyintf(x)); }
inline long long __float2ll_rz(float x) { return (long long)x; }
inline long long __float2ll_rn(float x) { return (long long)nearbyintf(x); }
inline float __int2float_rn(int x) { return float(x); }
inline float __uint2float_rn(unsigned x) { return float(x); }
inline float __ll2float_rn(long long x) { return float(x); }
inline float __ull2float_rn(unsigned long long x) { return float(x); }
inline float __double2float_rn(double x) { return float(x); }

// ---- float math -----------------------------------------------------------------------------
// IEEE-exact operations (+ - * / sqrt fma, the _rn intrinsics) give the GPU's bits; the
// transcendental ones are the C library's (within the GPU's documented ulp errors, 1e-5
// relative at worst for the fast __expf / __logf).

inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fsqrt_rn(float a) { return sqrtf(a); }
inline float __frcp_rn(float a) { return 1.0f / a; }
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
inline float __frsqrt_rn(float a) { return 1.0f / sqrtf(a); }
inline double __dadd_rn(double a, double b) { return a + b; }
inline double __dsub_rn(double a, double b) { return a - b; }
inline double __dmul_rn(double a, double b) { return a * b; }
inline double __ddiv_rn(double a, double b) { return a / b; }
inline double __fma_rn(double a, double b, double c) { return std::fma(a, b, c); }
inline float __fdividef(float a, float b) { return a / b; }
inline float __expf(float x) { return expf(x); }
inline float __exp10f(float x) { return powf(10.0f, x); }
inline float __logf(float x) { return logf(x); }
inline float __log2f(float x) { return log2f(x); }
inline float __log10f(float x) { return log10f(x); }
inline float __powf(float a, float b) { return powf(a, b); }
inline float __sinf(float x) { return sinf(x); }
inline float __cosf(float x) { return cosf(x); }
inline float __tanf(float x) { return tanf(x); }
inline void __sincosf(float x, float* s, float* c) {
    *s = sinf(x);
    *c = cosf(x);
}
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
inline double rsqrt(double x) { return 1.0 / sqrt(x); }
inline float rcbrtf(float x) { return 1.0f / cbrtf(x); }
inline float __saturatef(float x) { return x > 0.0f ? (x < 1.0f ? x : 1.0f) : 0.0f; }
inline float normcdff(float x) { return 0.5f * erfcf(-x * 0.70710678118654752f); }
// fmaf, fmaxf, fminf, expf, logf, log1pf, expm1f, sqrtf, tanhf, powf, ... are the C library's:
// fmaf is a real fused multiply-add (one rounding) whether or not the CPU has an FMA
// instruction, and sqrtf is correctly rounded, as on the GPU.

#ifndef CUDART_INF_F
#define CUDART_INF_F __int_as_float(0x7f800000)
#endif
#ifndef CUDART_NAN_F
#define CUDART_NAN_F __int_as_float(0x7fffffff)
#endif
#ifndef CUDART_INF
#define CUDART_INF __longlong_as_double(0x7ff0000000000000LL)
#endif
#ifndef CUDART_PI_F
#define CUDART_PI_F 3.141592654f
#endif

#endif  // GNNPAR_EMU_H
