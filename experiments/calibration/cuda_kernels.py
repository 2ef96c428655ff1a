"""CUDA C microkernels of the calibration, compiled with nvcc -arch=sm_90 -cubin
and loaded with CuPy (cuda_benches.py runs them): mma.sync, exp2, FMA and
shared-memory loops, pointer chases (plain, TMA), cp.async rings, CTA turnover.
"""
from __future__ import annotations

import os
import subprocess

CUDA_SRC = r"""
__device__ __forceinline__ unsigned long long gtimer() {
    unsigned long long t; asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t)); return t;
}
__device__ __forceinline__ void stamp(unsigned long long* clk, unsigned long long c0,
                                      unsigned long long t0) {
    if (threadIdx.x == 0) {
        unsigned long long c1 = clock64(), t1 = gtimer();
        clk[2 * blockIdx.x] = c1 - c0; clk[2 * blockIdx.x + 1] = t1 - t0;
    }
}

// stamp, and beyond the grid's 2 x gridDim.x slots the block's clock64 at its
// start and its SM, so that a rate a clock comes from each SM's own count of its
// cycles (spanned_rate), with no timer: clock64 over the global timer read
// 2025-2085 MHz around these loops in session 22, above the H100's 1980 MHz top.
__device__ __forceinline__ void stamp_span(unsigned long long* clk, unsigned long long c0,
                                           unsigned long long t0) {
    stamp(clk, c0, t0);
    if (threadIdx.x == 0) {
        unsigned smid; asm volatile("mov.u32 %0, %smid;" : "=r"(smid));
        clk[2 * gridDim.x + 2 * blockIdx.x] = c0; clk[2 * gridDim.x + 2 * blockIdx.x + 1] = smid;
    }
}

// MUFU: 8 independent chains of x <- 2^-x (stays in (0, 1], no denormals).
extern "C" __global__ void ex2_loop(float* out, int iters, unsigned long long* clk) {
    float x[8];
    #pragma unroll
    for (int j = 0; j < 8; j++) x[j] = 0.001f * (threadIdx.x + 37 * j);
    __syncthreads();
    unsigned long long c0 = clock64(), t0 = gtimer();
    for (int i = 0; i < iters; i++) {
        #pragma unroll
        for (int j = 0; j < 8; j++) {
            float y = -x[j];
            asm volatile("ex2.approx.ftz.f32 %0, %1;" : "=f"(x[j]) : "f"(y));
        }
    }
    __syncthreads();
    stamp_span(clk, c0, t0);
    float s = 0.f;
    #pragma unroll
    for (int j = 0; j < 8; j++) s += x[j];
    out[blockIdx.x * blockDim.x + threadIdx.x] = s;
}

// FP32 pipe: 8 independent FMA chains.
extern "C" __global__ void ffma_loop(float* out, int iters, float a, float b,
                                     unsigned long long* clk) {
    float x[8];
    #pragma unroll
    for (int j = 0; j < 8; j++) x[j] = 0.001f * (threadIdx.x + 37 * j);
    __syncthreads();
    unsigned long long c0 = clock64(), t0 = gtimer();
    #pragma unroll 8
    for (int i = 0; i < iters; i++) {
        #pragma unroll
        for (int j = 0; j < 8; j++) asm volatile("fma.rn.f32 %0, %0, %1, %2;" : "+f"(x[j]) : "f"(a), "f"(b));
    }
    __syncthreads();
    stamp_span(clk, c0, t0);
    float s = 0.f;
    #pragma unroll
    for (int j = 0; j < 8; j++) s += x[j];
    out[blockIdx.x * blockDim.x + threadIdx.x] = s;
}

// Shared memory: 16-byte loads, a warp reads 512 contiguous bytes (4 wavefronts, no
// bank conflicts); 32 KB buffer.
#define SMEM_F4 2048
extern "C" __global__ void smem_read(float* out, int iters, unsigned long long* clk) {
    __shared__ __align__(16) float4 buf[SMEM_F4];
    for (int i = threadIdx.x; i < SMEM_F4; i += blockDim.x)
        buf[i] = make_float4(i * 1.0f, i * 2.0f, i * 3.0f, i * 4.0f);
    __syncthreads();
    unsigned base = (unsigned)__cvta_generic_to_shared(buf);
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    unsigned idx = threadIdx.x;
    unsigned long long c0 = clock64(), t0 = gtimer();
    for (int i = 0; i < iters; i++) {
        #pragma unroll
        for (int j = 0; j < 8; j++) {
            unsigned a = base + 16u * ((idx + 256u * j) & (SMEM_F4 - 1));
            float4 v;
            asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];"
                         : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "r"(a));
            acc.x += v.x; acc.y += v.y; acc.z += v.z; acc.w += v.w;
        }
        idx += 32u;
    }
    __syncthreads();
    stamp_span(clk, c0, t0);
    out[blockIdx.x * blockDim.x + threadIdx.x] = acc.x + acc.y + acc.z + acc.w;
}

// mma.sync m16n8k16 (bf16 / fp16 in, fp32 accumulate), 8 independent accumulators per warp.
#define MMA_LOOP(NAME, TYPE)                                                               \
extern "C" __global__ void NAME(float* out, int iters, unsigned long long* clk) {          \
    unsigned a0 = 0x3c003c00u ^ threadIdx.x, a1 = a0 + 1, a2 = a0 + 2, a3 = a0 + 3;          \
    unsigned b0 = 0x3c003c00u ^ (threadIdx.x * 7), b1 = b0 + 5;                            \
    float d[8][4];                                                                         \
    _Pragma("unroll") for (int j = 0; j < 8; j++)                                          \
        _Pragma("unroll") for (int r = 0; r < 4; r++) d[j][r] = 1e-3f * (j * 4 + r + threadIdx.x); \
    __syncthreads();                                                                       \
    unsigned long long c0 = clock64(), t0 = gtimer();                                      \
    for (int i = 0; i < iters; i++) {                                                      \
        _Pragma("unroll") for (int j = 0; j < 8; j++)                                      \
            asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." TYPE "." TYPE ".f32 "   \
                         "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"           \
                         : "+f"(d[j][0]), "+f"(d[j][1]), "+f"(d[j][2]), "+f"(d[j][3])      \
                         : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));          \
    }                                                                                      \
    __syncthreads();                                                                       \
    stamp(clk, c0, t0);                                                                    \
    float s = 0.f;                                                                         \
    _Pragma("unroll") for (int j = 0; j < 8; j++) s += d[j][0] + d[j][1] + d[j][2] + d[j][3]; \
    out[blockIdx.x * blockDim.x + threadIdx.x] = s;                                        \
}
MMA_LOOP(mma_bf16, "bf16")
MMA_LOOP(mma_f16, "f16")

// mma.sync m16n8k32 e4m3 (sm_89+), fp32 accumulate.
extern "C" __global__ void mma_e4m3(float* out, int iters, unsigned long long* clk) {
    unsigned a0 = 0x38383838u ^ threadIdx.x, a1 = a0 + 1, a2 = a0 + 2, a3 = a0 + 3;
    unsigned b0 = 0x38383838u ^ (threadIdx.x * 7), b1 = b0 + 5;
    float d[8][4];
    #pragma unroll
    for (int j = 0; j < 8; j++) {
        #pragma unroll
        for (int r = 0; r < 4; r++) d[j][r] = 1e-3f * (j * 4 + r + threadIdx.x);
    }
    __syncthreads();
    unsigned long long c0 = clock64(), t0 = gtimer();
    for (int i = 0; i < iters; i++) {
        #pragma unroll
        for (int j = 0; j < 8; j++)
            asm volatile("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 "
                         "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                         : "+f"(d[j][0]), "+f"(d[j][1]), "+f"(d[j][2]), "+f"(d[j][3])
                         : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    }
    __syncthreads();
    stamp(clk, c0, t0);
    float s = 0.f;
    #pragma unroll
    for (int j = 0; j < 8; j++) s += d[j][0] + d[j][1] + d[j][2] + d[j][3];
    out[blockIdx.x * blockDim.x + threadIdx.x] = s;
}

// Pointer chase, one thread: arr[j] holds the index of the next element (lines of 128 B).
extern "C" __global__ void chase_plain(const unsigned* arr, int warm, int steps, unsigned start,
                                       unsigned long long* out) {
    if (threadIdx.x != 0) return;
    unsigned j = start;
    for (int s = 0; s < warm; s++)
        asm volatile("ld.global.cg.u32 %0, [%1];" : "=r"(j) : "l"(arr + j) : "memory");
    unsigned long long c0 = clock64();
    for (int s = 0; s < steps; s++)
        asm volatile("ld.global.cg.u32 %0, [%1];" : "=r"(j) : "l"(arr + j) : "memory");
    unsigned long long c1 = clock64();
    out[0] = c1 - c0; out[1] = j;
}

// The same chase through the TMA unit: cp.async.bulk of 16 B into SMEM, completion on an
// mbarrier (expect_tx), then the next index is read from SMEM.
__device__ __forceinline__ unsigned tma_step(const unsigned* arr, unsigned j, unsigned sdst,
                                             unsigned mbar, unsigned& phase,
                                             volatile unsigned* sbuf) {
    unsigned long long state;
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 %0, [%1], 16;"
                 : "=l"(state) : "r"(mbar) : "memory");
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], 16, [%2];"
                 :: "r"(sdst), "l"(arr + j), "r"(mbar) : "memory");
    unsigned done = 0;
    while (!done) {
        asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                     " selp.u32 %0, 1, 0, p;\n}" : "=r"(done) : "r"(mbar), "r"(phase) : "memory");
    }
    phase ^= 1u;
    return sbuf[0];
}

extern "C" __global__ void chase_tma(const unsigned* arr, int warm, int steps, unsigned start,
                                     unsigned long long* out) {
    __shared__ __align__(128) unsigned sbuf[32];
    __shared__ __align__(8) unsigned long long bar;
    if (threadIdx.x != 0) return;
    unsigned mbar = (unsigned)__cvta_generic_to_shared(&bar);
    unsigned sdst = (unsigned)__cvta_generic_to_shared(sbuf);
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(mbar) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    unsigned phase = 0, j = start;
    for (int s = 0; s < warm; s++) j = tma_step(arr, j, sdst, mbar, phase, sbuf);
    unsigned long long c0 = clock64();
    for (int s = 0; s < steps; s++) j = tma_step(arr, j, sdst, mbar, phase, sbuf);
    unsigned long long c1 = clock64();
    out[0] = c1 - c0; out[1] = j;
}

// chase_plain from every SM at once, each block on its own stretch of the
// chain: a step's cycles and the SM it ran on (is L2 nearer to some SMs?).
extern "C" __global__ void chase_per_sm(const unsigned* arr, int steps, const unsigned* starts,
                                        unsigned long long* out) {
    if (threadIdx.x != 0) return;
    unsigned j = starts[blockIdx.x];
    unsigned long long c0 = clock64();
    for (int s = 0; s < steps; s++)
        asm volatile("ld.global.cg.u32 %0, [%1];" : "=r"(j) : "l"(arr + j) : "memory");
    unsigned long long c1 = clock64();
    unsigned smid;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
    out[3 * blockIdx.x] = c1 - c0; out[3 * blockIdx.x + 1] = smid; out[3 * blockIdx.x + 2] = j;
}

extern "C" __global__ void empty_kernel() {}

// A CTA's life with nothing to hide it: copy this CTA's tile (`vecs` 16-byte vectors:
// a Q tile in) through SMEM back out (an O tile out), then retire. The launch's
// dynamic SMEM sets how many CTAs share an SM; vecs = 0: CTAs that only start and
// retire. Timed over many waves, the slope is one round of CTAs per SM.
#define CTA_CYCLE_VECS_PER_THREAD 8   // a 32 KB tile over 256 threads
// Global -> SMEM: every load issued before the first is used, as a cp.async or TMA
// tile copy is.
__device__ __forceinline__ void tile_in(const int4* __restrict__ in, int4* sbuf, size_t base, int vecs) {
    int4 r[CTA_CYCLE_VECS_PER_THREAD];
    #pragma unroll
    for (int j = 0; j < CTA_CYCLE_VECS_PER_THREAD; j++) {
        int i = threadIdx.x + j * blockDim.x;
        if (i < vecs) r[j] = in[base + i];
    }
    #pragma unroll
    for (int j = 0; j < CTA_CYCLE_VECS_PER_THREAD; j++) {
        int i = threadIdx.x + j * blockDim.x;
        if (i < vecs) sbuf[i] = r[j];
    }
}

// SMEM -> global, all reads before the first store.
__device__ __forceinline__ void tile_out(const int4* sbuf, int4* __restrict__ out, size_t base, int vecs) {
    int4 r[CTA_CYCLE_VECS_PER_THREAD];
    #pragma unroll
    for (int j = 0; j < CTA_CYCLE_VECS_PER_THREAD; j++) {
        int i = threadIdx.x + j * blockDim.x;
        if (i < vecs) r[j] = sbuf[i];
    }
    #pragma unroll
    for (int j = 0; j < CTA_CYCLE_VECS_PER_THREAD; j++) {
        int i = threadIdx.x + j * blockDim.x;
        if (i < vecs) out[base + i] = r[j];
    }
}

extern "C" __global__ void cta_cycle(const int4* __restrict__ in, int4* __restrict__ out, int vecs) {
    extern __shared__ int4 sbuf[];
    const size_t base = (size_t)blockIdx.x * vecs;
    tile_in(in, sbuf, base, vecs);
    __syncthreads();
    tile_out(sbuf, out, base, vecs);
}

// The same copy, stamped: thread 0 records the global timer when the CTA starts,
// when its whole tile has arrived (after the barrier) and when its stores are
// issued, and the SM it ran on. Do the SMs' loads of one round finish one by one
// (served in order) or together (bandwidth shared)? Do the rounds stay in step?
extern "C" __global__ void cta_cycle_stamped(const int4* __restrict__ in, int4* __restrict__ out, int vecs,
                                             unsigned long long* stamps) {
    extern __shared__ int4 sbuf[];
    unsigned long long t0 = gtimer();
    const size_t base = (size_t)blockIdx.x * vecs;
    tile_in(in, sbuf, base, vecs);
    __syncthreads();
    unsigned long long t1 = gtimer();
    tile_out(sbuf, out, base, vecs);
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned smid;
        asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
        unsigned long long* s = stamps + 4 * (size_t)blockIdx.x;
        s[0] = t0; s[1] = t1; s[2] = gtimer(); s[3] = smid;
    }
}

// Tile copies global -> SMEM with cp.async (LDGSTS.E.BYPASS.128), as Triton's fa2 and
// standard kernels stream their K/V tiles, in Triton 3.6's order for a pipelined loop
// (kernels/fa2.py cross-compiled: DEPBAR.LE SB0, BAR.SYNC, the step, BAR.SYNC, LDGSTS):
// every thread copies VPT 16 B vectors of each tile (unrolled, addresses precomputed as
// Triton's are); a DEPTH-deep ring, DEPTH - 1 tiles issued ahead (a commit group each);
// iteration j waits for tile j (cp.async.wait_group DEPTH - 2), meets the CTA's barrier,
// reads a word of the tile, meets it again, then issues tile j + DEPTH - 1 into the
// buffer tile j - 1 had. DEPTH 1: each tile issued and waited for alone (its whole
// latency exposed). VPT 0: the loop's skeleton alone (waits, barriers, the read).
// Tiles come from an L2-resident set of `set_tiles` (a power of two); clock64 and the
// global timer per CTA.
template <int VPT>
__device__ __forceinline__ void cp_async_tile(const int4* __restrict__ src, unsigned ring_s, int tile_vecs,
                                              int tile, int slot) {
    const int4* g = src + (size_t)tile * tile_vecs + threadIdx.x;
    const unsigned s = ring_s + 16u * (unsigned)(slot * tile_vecs + threadIdx.x);
    #pragma unroll
    for (int k = 0; k < VPT; k++)
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;"
                     :: "r"(s + 16u * k * blockDim.x), "l"(g + k * blockDim.x) : "memory");
}

template <int DEPTH, int VPT>
__device__ __forceinline__ void cp_async_stream(const int4* __restrict__ src, int set_tiles,
                                                int tiles, float* out, unsigned long long* clk) {
    extern __shared__ __align__(128) int4 ring[];
    const unsigned ring_s = (unsigned)__cvta_generic_to_shared(ring);
    const int tile_vecs = VPT * blockDim.x, mask = set_tiles - 1;
    const int first = (int)((blockIdx.x * 40503u) & (unsigned)mask);
    float acc = 0.f;
    __syncthreads();
    unsigned long long c0 = clock64(), t0 = gtimer();
    #pragma unroll
    for (int i = 0; i < DEPTH - 1; i++) {
        cp_async_tile<VPT>(src, ring_s, tile_vecs, (first + i) & mask, i);
        asm volatile("cp.async.commit_group;" ::: "memory");
    }
    for (int j = 0; j < tiles; j++) {
        if (DEPTH == 1) {
            cp_async_tile<VPT>(src, ring_s, tile_vecs, (first + j) & mask, 0);
            asm volatile("cp.async.commit_group;" ::: "memory");
        }
        asm volatile("cp.async.wait_group %0;" :: "n"(DEPTH > 1 ? DEPTH - 2 : 0) : "memory");
        __syncthreads();
        acc += __int_as_float(ring[(j % DEPTH) * tile_vecs + threadIdx.x].x);
        __syncthreads();
        if (DEPTH > 1) {   // (past the end the copies re-read early tiles: the count holds)
            cp_async_tile<VPT>(src, ring_s, tile_vecs, (first + j + DEPTH - 1) & mask, (j + DEPTH - 1) % DEPTH);
            asm volatile("cp.async.commit_group;" ::: "memory");
        }
    }
    stamp(clk, c0, t0);
    out[blockIdx.x * blockDim.x + threadIdx.x] = acc;
}
#define CP_ASYNC_KERNEL(D, V)                                                                  \
extern "C" __global__ void cp_async_d##D##_v##V(const int4* src, int set_tiles, int tiles,    \
                                                float* out, unsigned long long* clk) {         \
    cp_async_stream<D, V>(src, set_tiles, tiles, out, clk);                                   \
}
#define CP_ASYNC_DEPTHS(V) CP_ASYNC_KERNEL(1, V) CP_ASYNC_KERNEL(2, V) CP_ASYNC_KERNEL(3, V) CP_ASYNC_KERNEL(4, V)
CP_ASYNC_DEPTHS(0)
CP_ASYNC_DEPTHS(1)
CP_ASYNC_DEPTHS(2)
CP_ASYNC_DEPTHS(4)
CP_ASYNC_DEPTHS(8)
CP_ASYNC_DEPTHS(16)
CP_ASYNC_DEPTHS(32)

__device__ __forceinline__ void cp_async_wait_all_and_sync() {
    asm volatile("cp.async.wait_all;" ::: "memory");
    __syncthreads();
}

// fa2's CTA prologue as Triton 3.6 compiles it for sm_90 (kernels/fa2.py cross-compiled, 64x64
// blocks, D = 64, 4 warps, 3 stages): the Q block by plain 16 B loads into registers (LDG.E.128,
// 4 a thread: 8 KB), stored into SMEM, the first two stages' K and V tiles by cp.async (8 KB
// each, a commit group each, the CTA's barrier between the stages), then the
// fence.proxy.async Triton puts before its loop (the wgmma reads Q from SMEM), the first stage awaited
// (cp.async.wait_group 2) and the CTA's barrier. A probe CTA runs it `probes` times, each with a
// fresh Q block (from a set of q_blocks, larger than L2: from HBM) and K/V tiles from an
// L2-resident set of kv_tiles (both powers of 2), and stamps each: clock64 at its start, once Q is in (after its
// STS has issued: a warp issues in order, the STS waits for Q's registers) and once the first
// stage is in. Blocks below `busy` run instead a loop like a fa2 step without its products (a
// 16 KB cp.async stage a step into a 3-deep ring or none, 32 or 128 ex2 and 10 shuffles a
// thread) for busy_steps steps, so that probes share their SMs with them. out: per probe the
// two intervals; spans: per block its SM, its global timer at start and end, and its cycles.
template <int GROUPS, int STS>
__device__ __forceinline__ void probe_cta(const int4* __restrict__ q_src, int q_blocks, const int4* __restrict__ kv_src,
                                          int kv_tiles, int probes, int index, unsigned long long* out) {
    extern __shared__ __align__(128) int4 smem[];
    const unsigned base = (unsigned)__cvta_generic_to_shared(smem);
    const int t = threadIdx.x;                           // 128 threads, 512 16 B vectors a tile
    float acc = 0.f;
    for (int it = 0; it < probes; it++) {
        cp_async_wait_all_and_sync();
        // (masks, not %: a division by a runtime count is a MUFU.RCP and a dozen more instructions,
        // which ptxas put after the Q stamp, inside the interval timed; the counts are powers of 2)
        const int qb = (index * probes + it) & (q_blocks - 1), kv = (index * 7 + it * 4) & (kv_tiles / 2 - 1);
        unsigned long long c0 = clock64();
        const int4* q = q_src + (size_t)qb * 512 + t;
        int4 r0, r1, r2, r3;
        asm volatile("ld.global.v4.b32 {%0,%1,%2,%3}, [%4];" : "=r"(r0.x), "=r"(r0.y), "=r"(r0.z), "=r"(r0.w) : "l"(q));
        asm volatile("ld.global.v4.b32 {%0,%1,%2,%3}, [%4];" : "=r"(r1.x), "=r"(r1.y), "=r"(r1.z), "=r"(r1.w) : "l"(q + 128));
        asm volatile("ld.global.v4.b32 {%0,%1,%2,%3}, [%4];" : "=r"(r2.x), "=r"(r2.y), "=r"(r2.z), "=r"(r2.w) : "l"(q + 256));
        asm volatile("ld.global.v4.b32 {%0,%1,%2,%3}, [%4];" : "=r"(r3.x), "=r"(r3.y), "=r"(r3.z), "=r"(r3.w) : "l"(q + 384));
        if (STS) {
            smem[t] = r0; smem[t + 128] = r1; smem[t + 256] = r2; smem[t + 384] = r3;
        } else {    // (Q's registers used, not stored: the clock below still waits for them)
            unsigned s = r0.x ^ r0.y ^ r0.z ^ r0.w ^ r1.x ^ r1.y ^ r1.z ^ r1.w ^ r2.x ^ r2.y ^ r2.z ^ r2.w ^
                         r3.x ^ r3.y ^ r3.z ^ r3.w, kept;
            asm volatile("mov.b32 %0, %1;" : "=r"(kept) : "r"(s));
            acc += __int_as_float(kept) * 0.f;
        }
        unsigned long long cq = clock64();
        #pragma unroll
        for (int g = 0; g < GROUPS; g++) {          // K0, V0 | K1, V1: 8 KB tiles, a group each
            if (g == 2) __syncthreads();
            const int4* src = kv_src + (size_t)(kv + g) * 512 + t;
            const unsigned dst = base + 16u * (unsigned)(512 * (1 + g) + t);
            #pragma unroll
            for (int k = 0; k < 4; k++)
                asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"(dst + 16u * 128 * k), "l"(src + 128 * k) : "memory");
            asm volatile("cp.async.commit_group;" ::: "memory");
        }
        // (ptxas: MEMBAR.ALL.CTA, FENCE.VIEW.ASYNC.S, as in fa2's SASS)
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
        asm volatile("cp.async.wait_group %0;" :: "n"(GROUPS - 2) : "memory");
        __syncthreads();
        unsigned long long ckv = clock64();
        acc += __int_as_float(smem[512 + t].x) + __int_as_float(smem[1024 + t].x);
        if (t == 0) {
            out[2 * (index * probes + it)] = cq - c0;
            out[2 * (index * probes + it) + 1] = ckv - cq;
        }
    }
    if (acc == 12345.f) out[0] = 0;     // (keeps the reads)
}

template <int COPY, int EX2, int FMA, int IALU = 0>
__device__ __forceinline__ void busy_cta(const int4* __restrict__ kv_src, int kv_tiles, int steps) {
    extern __shared__ __align__(128) int4 smem[];
    const unsigned base = (unsigned)__cvta_generic_to_shared(smem);
    const int t = threadIdx.x;
    float x[32];
    #pragma unroll
    for (int j = 0; j < 32; j++) x[j] = 0.001f * (t + 37 * j);
    for (int i = 0; i < steps + 2; i++) {
        if (COPY && i < steps) {                    // a 16 KB stage into a 3-deep ring
            const int4* src = kv_src + (size_t)((blockIdx.x * 5 + 2 * i) % (kv_tiles - 2)) * 512 + t;
            const unsigned dst = base + 16u * (unsigned)(1024 * (i % 3) + t);
            #pragma unroll
            for (int k = 0; k < 8; k++)
                asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"(dst + 16u * 128 * k), "l"(src + 128 * k) : "memory");
        }
        asm volatile("cp.async.commit_group;" ::: "memory");
        asm volatile("cp.async.wait_group 2;" ::: "memory");
        __syncthreads();
        float m = __int_as_float(smem[1024 * (i % 3) + t].x);
        #pragma unroll
        for (int s = 16; s > 0; s >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, s));
        #pragma unroll
        for (int e = 0; e < EX2; e += 32) {
            #pragma unroll
            for (int j = 0; j < 32; j++) {
                float y = x[j] * 0.5f - m * 1e-30f;
                asm volatile("ex2.approx.ftz.f32 %0, %1;" : "=f"(x[j]) : "f"(-y));
            }
        }
        #pragma unroll 8
        for (int f = 0; f < FMA; f += 8) {          // 8 independent FFMA chains
            #pragma unroll
            for (int j = 0; j < 8; j++) x[j] = fmaf(x[j], 0.999f, m * 1e-30f);
        }
        #pragma unroll 4
        for (int f = 0; f < IALU; f += 8) {         // 8 independent integer chains (shift, xor, add)
            #pragma unroll
            for (int j = 0; j < 8; j++) {
                unsigned v = __float_as_uint(x[j]);
                x[j] = __uint_as_float(((v ^ (v >> 1)) + 0x9e3779b9u) & 0x3f7fffffu);
            }
        }
        float l = 0.f;
        #pragma unroll
        for (int j = 0; j < 32; j++) l += x[j];
        #pragma unroll
        for (int s = 16; s > 0; s >>= 1) l += __shfl_xor_sync(0xffffffffu, l, s);
        x[0] += l * 1e-30f;
        __syncthreads();
    }
    if (x[0] == 12345.f) smem[t].x = 1;     // (keeps the work)
}

template <int COPY, int EX2, int FMA, int IALU, int GROUPS, int STS>
__device__ __forceinline__ void prologue_probe(const int4* q_src, int q_blocks, const int4* kv_src, int kv_tiles,
                                               int probes, int busy, int busy_steps,
                                               unsigned long long* out, unsigned long long* spans) {
    unsigned long long t0 = gtimer(), c0 = clock64();
    if ((int)blockIdx.x < busy)
        busy_cta<COPY, EX2, FMA, IALU>(kv_src, kv_tiles, busy_steps);
    else
        probe_cta<GROUPS, STS>(q_src, q_blocks, kv_src, kv_tiles, probes, blockIdx.x - busy, out);
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned smid; asm volatile("mov.u32 %0, %smid;" : "=r"(smid));
        spans[4 * blockIdx.x] = smid; spans[4 * blockIdx.x + 1] = t0; spans[4 * blockIdx.x + 2] = gtimer();
        spans[4 * blockIdx.x + 3] = clock64() - c0;
    }
}
// busy CTAs: 16 KB of copies and 32 ex2 a thread a step (`copy`: bound by the SM's copies);
// 128 ex2 a thread and no copies (`mufu`); 32 (`mufu32`); 16 KB of copies and 128 ex2
// (`mixed`: about the copies and MUFU work of a 64x64 fa2 step, at D = 64, taking 1-2k cycles
// a step); 1024 FFMA a thread and nothing else (`ffma`: the issue slots and the FMA pipe, not
// the MIO queue); 256 (`ffma256`); 1024 integer instructions (`ialu`: shifts, xors, adds on the
// integer pipe, none on the FMA pipe that the probe's IMAD.WIDE address arithmetic shares with
// FFMAs). The probe alone, without its second stage (`groups2`: only K0 and V0 issued) or
// without Q's STS (`nosts`): what of the lone first stage's time those take.
#define PROLOGUE_PROBE(NAME, COPY, EX2, FMA, IALU, GROUPS, STS)                                      \
extern "C" __global__ void prologue_probe_##NAME(const int4* q_src, int q_blocks, const int4* kv_src, \
                                                 int kv_tiles, int probes, int busy, int busy_steps,  \
                                                 unsigned long long* out, unsigned long long* spans) { \
    prologue_probe<COPY, EX2, FMA, IALU, GROUPS, STS>(q_src, q_blocks, kv_src, kv_tiles, probes, busy,    \
                                                      busy_steps, out, spans);                          \
}
PROLOGUE_PROBE(copy, 1, 32, 0, 0, 4, 1)
PROLOGUE_PROBE(mufu, 0, 128, 0, 0, 4, 1)
PROLOGUE_PROBE(mufu32, 0, 32, 0, 0, 4, 1)
PROLOGUE_PROBE(mixed, 1, 128, 0, 0, 4, 1)
PROLOGUE_PROBE(ffma, 0, 0, 1024, 0, 4, 1)
PROLOGUE_PROBE(ffma256, 0, 0, 256, 0, 4, 1)
PROLOGUE_PROBE(ialu, 0, 0, 0, 1024, 4, 1)
PROLOGUE_PROBE(groups2, 0, 0, 0, 0, 2, 1)
PROLOGUE_PROBE(nosts, 0, 0, 0, 0, 4, 0)
"""

CUDA_KERNELS = ("ex2_loop", "ffma_loop", "smem_read", "mma_bf16", "mma_f16", "mma_e4m3",
                "chase_plain", "chase_tma", "chase_per_sm", "empty_kernel", "cta_cycle", "cta_cycle_stamped",
                *(f"cp_async_d{d}_v{v}" for d in (1, 2, 3, 4) for v in (0, 1, 2, 4, 8, 16, 32)),
                *(f"prologue_probe_{m}" for m in ("copy", "mufu", "mufu32", "mixed", "ffma", "ffma256",
                                                  "groups2", "nosts", "ialu")))


def compile_cuda(workdir: str, arch: str = "sm_90") -> str:
    """nvcc the microkernels to a cubin; returns its path."""
    src = os.path.join(workdir, "calib_kernels.cu")
    cubin = os.path.join(workdir, "calib_kernels.cubin")
    with open(src, "w") as f:
        f.write(CUDA_SRC)
    import shutil
    nvcc = shutil.which("nvcc") or next((c for c in ("/usr/local/cuda/bin/nvcc",)
                                         if os.path.exists(c)), "nvcc")
    cmd = [nvcc, f"-arch={arch}", "-O3", "-cubin", "-o", cubin, src]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode:
        raise RuntimeError(f"nvcc failed: {r.stderr.strip()[:2000]}")
    return cubin
