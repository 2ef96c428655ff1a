"""Calibrate the H100 profile from microbenchmarks (never from attention kernels).

    # on the GPU machine (torch, Triton, CuPy, nvcc, pynvml):
    PYTHONPATH=. GPUSIM_GIT_COMMIT=<sha> python3 experiments/calibrate.py run --out-dir $OUT
    # here, on a CPU: compile every microkernel for sm_90 and check its SASS
    PYTHONPATH=. python experiments/calibrate.py check
    # here: rebuild the measured profile from the committed CSV
    PYTHONPATH=. python experiments/calibrate.py profile \
        --csv experiments/results/calibration_h100.csv --out hw_profiles/h100.measured.toml

`run` measures, one microkernel each:
  * HBM read, write and copy bandwidth (Triton streaming kernels over 2 GiB; torch copy_
    as a cross-check);
  * L2 read bandwidth against working-set size, 1 MB ... 1 GB (a persistent Triton kernel
    re-reading a buffer with ld.global.cg, so L1 is bypassed): the plateau and the knee;
    and with every SM reading the same lines at once, or a few blocks apart (l2_shared):
    what the L2 request coalescer's merged lookups do to the rate;
  * tensor-core throughput: a Triton tl.dot loop on operands held on chip (wgmma; bf16,
    fp16, fp8 e4m3) and a CUDA C mma.sync.aligned.m16n8k16 loop (bf16, fp16) and
    m16n8k32 (e4m3) with independent accumulators;
  * exp2 throughput: CUDA C ex2.approx.ftz.f32 (one MUFU.EX2 each) and Triton tl.exp2;
  * fp32 FMA throughput; shared-memory read bandwidth (ld.shared.v4, conflict-free);
  * pointer-chase latency of a plain load (ld.global.cg) in L2 and in DRAM, and of the
    same chase through the TMA unit (cp.async.bulk 16 B into SMEM completing on an
    mbarrier): the TMA's extra latency is the difference;
  * the same plain chase while 16-528 other CTAs stream reads from HBM or from L2
    (loaded_latency): how much later a load lands when the memory is busy; and from
    every SM at once, per SM (latency_per_sm): SMs nearer to L2 and farther from it;
  * cp.async tile copies into a 1-4 deep SMEM ring in Triton's loop order (cp_async): a
    copy's latency and the rate a CTA fills its SMEM at, one CTA alone and every SM busy;
  * launch cost: do_bench of an empty kernel (the fixed cost of every kernel timed the
    way the validation sweep times attention), plus back-to-back eager and graph launches;
  * the device's own report (SMs, SMEM per SM and per block, registers, L2 size).
Every figure goes to calibration_h100.csv with provenance; the profile writer maps a
subset onto hw_profiles/h100.measured.toml (MAPPING below) and copies the rest from
h100.toml with its sources.
"""
from __future__ import annotations

import argparse
import csv
import datetime as _dt
import itertools
import functools
import math
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)

from algorithms.errors import ResultsFileError  # noqa: E402
from kernels.provenance import write_csv_atomic  # noqa: E402

DEFAULT_CSV = os.path.join(ROOT, "experiments", "results", "calibration_h100.csv")
DEFAULT_PROFILE = os.path.join(ROOT, "hw_profiles", "h100.measured.toml")
BASE_PROFILE = os.path.join(ROOT, "hw_profiles", "h100.toml")

COLUMNS = ["bench", "param", "value", "unit", "clock_mhz_nvml", "clock_mhz_kernel", "detail",
           "gpu", "sm_count", "sm_clock_mhz", "max_sm_clock_mhz", "driver", "cuda", "torch",
           "triton", "cupy", "git_commit", "date", "command"]

# ---------------------------------------------------------------------------
# CUDA C microkernels (compiled with nvcc -arch=sm_90 -cubin, loaded with CuPy)
# ---------------------------------------------------------------------------
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
"""

CUDA_KERNELS = ("ex2_loop", "ffma_loop", "smem_read", "mma_bf16", "mma_f16", "mma_e4m3",
                "chase_plain", "chase_tma", "chase_per_sm", "empty_kernel", "cta_cycle", "cta_cycle_stamped",
                *(f"cp_async_d{d}_v{v}" for d in (1, 2, 3, 4) for v in (0, 1, 2, 4, 8, 16, 32)))


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


# ---------------------------------------------------------------------------
# Triton microkernels (defined lazily: importing this file must not need triton)
# ---------------------------------------------------------------------------
def triton_kernels():
    import triton
    import triton.language as tl

    @triton.jit
    def hbm_read(X, OUT, BLOCK: tl.constexpr):
        pid = tl.program_id(0).to(tl.int64)
        x = tl.load(X + pid * BLOCK + tl.arange(0, BLOCK))
        tl.store(OUT + pid, tl.sum(x, axis=0))

    @triton.jit
    def hbm_write(Y, val, BLOCK: tl.constexpr):
        pid = tl.program_id(0).to(tl.int64)
        offs = tl.arange(0, BLOCK)
        tl.store(Y + pid * BLOCK + offs, offs.to(tl.float32) * val + pid.to(tl.float32))

    @triton.jit
    def tile_write(Y, n_cols, BM: tl.constexpr, BN: tl.constexpr):
        # standard's QKᵀ store pattern without its products: a CTA a block of
        # BM rows of a row-major [rows, n_cols] bf16 matrix, walking its columns
        # BN at a time, each step a [BM, BN] tile: BM runs of BN x 2 bytes, the
        # rows n_cols x 2 bytes apart
        pid = tl.program_id(0).to(tl.int64)
        rows = pid * BM + tl.arange(0, BM)
        cols = tl.arange(0, BN)
        for j in range(0, n_cols, BN):
            val = (rows[:, None] + cols[None, :] + j).to(tl.bfloat16)
            tl.store(Y + rows[:, None] * n_cols + j + cols[None, :], val)

    @triton.jit
    def tma_setup(X, OUT, CLK, n_rows, ROWS: tl.constexpr, COLS: tl.constexpr, TMA: tl.constexpr):
        # what kernels/fa3.py does before its first copy: three device-side
        # tensor descriptors (Q, K, V), each built in SMEM, written to the CTA's
        # global scratch and fenced (SASS: ATOMG.E.EXCH.STRONG.GPU, DEPBAR,
        # UTMACCTL.IV, UTMACMDFLUSH), then a [ROWS, COLS] tile through each; TMA
        # False: the same three tiles by plain loads. CLK[cta] = the clock64
        # cycles from the CTA's start to the sum of its tiles.
        pid = tl.program_id(0)
        t0 = tl.inline_asm_elementwise("mov.u64 $0, %clock64;", "=l,r", [pid], dtype=tl.int64,
                                       is_pure=False, pack=1)
        row0 = (pid * ROWS) % n_rows
        if TMA:
            da = tl.make_tensor_descriptor(X, shape=[n_rows, COLS], strides=[COLS, 1], block_shape=[ROWS, COLS])
            db = tl.make_tensor_descriptor(X + COLS, shape=[n_rows - 1, COLS], strides=[COLS, 1],
                                           block_shape=[ROWS, COLS])
            dc = tl.make_tensor_descriptor(X + 2 * COLS, shape=[n_rows - 2, COLS], strides=[COLS, 1],
                                           block_shape=[ROWS, COLS])
            tiles = da.load([row0, 0]) + db.load([row0, 0]) + dc.load([row0, 0])
        else:
            offs = (row0 + tl.arange(0, ROWS))[:, None] * COLS + tl.arange(0, COLS)[None, :]
            tiles = tl.load(X + offs) + tl.load(X + COLS + offs) + tl.load(X + 2 * COLS + offs)
        total = tl.sum(tl.sum(tiles.to(tl.float32), 1), 0)
        t1 = tl.inline_asm_elementwise("mov.u64 $0, %clock64;", "=l,r", [total.to(tl.int32, bitcast=True)],
                                       dtype=tl.int64, is_pure=False, pack=1)
        tl.store(OUT + pid, total)
        tl.store(CLK + pid, t1 - t0)

    @triton.jit
    def store_overlap(Y, CLK, iters, WORK: tl.constexpr, STORE: tl.constexpr, STORES: tl.constexpr):
        # Does a warp wait for its stores to leave the SM? Per iteration: a
        # chain of WORK dependent FMAs on one value a thread, and STORE fp32 a
        # CTA stored from registers to the CTA's own L2-resident slot (values
        # of the iteration, not of the chain: tied to it, the compiler
        # recomputed the chain for every stored register). Posted stores let
        # the chain run while they drain (an iteration takes the longer of the
        # two); a warp that waits for them takes the sum. CLK[cta] = clock64
        # over the loop. STORES False: the chain alone.
        pid = tl.program_id(0)
        x = tl.arange(0, 128).to(tl.float32) * 1e-3 + pid
        tile = tl.arange(0, STORE).to(tl.float32)
        t0 = tl.inline_asm_elementwise("mov.u64 $0, %clock64;", "=l,r", [pid], dtype=tl.int64,
                                       is_pure=False, pack=1)
        for i in range(iters):
            for _ in tl.static_range(WORK):
                x = x * 0.999 + 0.001
            if STORES:
                tl.store(Y + pid * STORE + tl.arange(0, STORE), tile + i)
        t1 = tl.inline_asm_elementwise("mov.u64 $0, %clock64;", "=l,r", [tl.sum(x, 0).to(tl.int32, bitcast=True)],
                                       dtype=tl.int64, is_pure=False, pack=1)
        tl.store(CLK + pid, t1 - t0)

    @triton.jit
    def hbm_copy(X, Y, BLOCK: tl.constexpr):
        pid = tl.program_id(0).to(tl.int64)
        offs = pid * BLOCK + tl.arange(0, BLOCK)
        tl.store(Y + offs, tl.load(X + offs))

    @triton.jit
    def l2_read(X, OUT, nblocks, iters, BLOCK: tl.constexpr, UNROLL: tl.constexpr):
        # UNROLL independent BLOCK-wide loads per step, so several are in flight.
        pid = tl.program_id(0)
        nprog = tl.num_programs(0)
        offs = tl.arange(0, BLOCK)
        acc = tl.zeros([BLOCK], tl.float32)
        for i in range(iters):
            base = (pid + i * nprog) * UNROLL
            for u in tl.static_range(UNROLL):
                b = ((base + u) % nblocks).to(tl.int64)
                acc += tl.load(X + b * BLOCK + offs, cache_modifier=".cg")
        tl.store(OUT + pid * BLOCK + offs, acc)

    @triton.jit
    def l2_shared_read(X, OUT, nblocks, iters, lag, BLOCK: tl.constexpr, UNROLL: tl.constexpr):
        # As l2_read, but every CTA walks the same blocks in the same order,
        # CTA c `lag` blocks ahead of CTA c - 1 (lag 0: all on one block at
        # once, as the CTAs of an attention head step through its K/V tiles)
        pid = tl.program_id(0)
        offs = tl.arange(0, BLOCK)
        acc = tl.zeros([BLOCK], tl.float32)
        start = pid * lag
        for i in range(iters):
            for u in tl.static_range(UNROLL):
                b = ((start + i * UNROLL + u) % nblocks).to(tl.int64)
                acc += tl.load(X + b * BLOCK + offs, cache_modifier=".cg")
        tl.store(OUT + pid * BLOCK + offs, acc)

    @triton.jit
    def l2_write(Y, nblocks, iters, BLOCK: tl.constexpr, UNROLL: tl.constexpr):
        # UNROLL BLOCK-wide stores per step into an L2-resident set: the write
        # path from the SMs into L2 (write-back: the lines never leave L2)
        pid = tl.program_id(0)
        nprog = tl.num_programs(0)
        offs = tl.arange(0, BLOCK)
        val = offs.to(tl.float32)
        for i in range(iters):
            base = (pid + i * nprog) * UNROLL
            for u in tl.static_range(UNROLL):
                b = ((base + u) % nblocks).to(tl.int64)
                tl.store(Y + b * BLOCK + offs, val + i)

    @triton.jit
    def l2_round_trip(X, chunks, passes, CHUNK: tl.constexpr):
        # Each CTA reads its own `chunks` CHUNK-wide pieces of X and writes each
        # back where it was read (x + 1), piece after piece, `passes` times over:
        # data read and written back every pass (FA1's running O, l, m; a
        # working set the next pass finds in L2 or not). Plain ld/st.global.
        pid = tl.program_id(0)
        offs = tl.arange(0, CHUNK)
        base = pid.to(tl.int64) * chunks * CHUNK
        for p in range(passes):
            for c in range(chunks):
                ptr = X + base + c * CHUNK + offs
                tl.store(ptr, tl.load(ptr) + 1.0)

    @triton.jit
    def tile(P, ROWS: tl.constexpr, COLS: tl.constexpr):
        # the [ROWS, COLS] row-major operand tile at P, loaded once into registers
        return tl.load(P + tl.arange(0, ROWS)[:, None] * COLS + tl.arange(0, COLS)[None, :])

    @triton.jit
    def clock_stamp(CLK, slot: tl.constexpr, after):
        # CLK[cta, slot], CLK[cta, slot + 1] = the SM's clock64 and the global
        # timer (ns), read once `after` (an int32 scalar) is computed: cycles
        # counted by the SM that ran the work, whatever clock NVML reports
        # around the launch (its 5 ms samples of sub-ms launches read 1335-1980
        # MHz for the same kernel in session 12)
        cta = tl.program_id(0)
        c = tl.inline_asm_elementwise("mov.u64 $0, %clock64;", "=l,r", [after], dtype=tl.int64,
                                      is_pure=False, pack=1)
        t = tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l,r", [after], dtype=tl.int64,
                                      is_pure=False, pack=1)
        tl.store(CLK + cta * 4 + slot, c)
        tl.store(CLK + cta * 4 + slot + 1, t)

    @triton.jit
    def dot_shape(A, B, C, iters, CLK, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                  A_IN_REGS: tl.constexpr, CLOCKED: tl.constexpr = False):
        # One product per iteration on operands held on chip. A_IN_REGS: A is rebuilt in
        # registers every iteration (as FA's P is), so wgmma takes it from registers
        # and reads only B from SMEM; otherwise both operands sit in SMEM (Q Kᵀ).
        # CLOCKED: CLK gets each CTA's clock64 and global timer at start and end.
        pid = tl.program_id(0)
        if CLOCKED:
            clock_stamp(CLK, 0, pid)
        rm = tl.arange(0, BM)
        rn = tl.arange(0, BN)
        a = tile(A, BM, BK)
        b = tile(B, BK, BN)
        acc = tl.zeros([BM, BN], tl.float32)
        for i in range(iters):
            if A_IN_REGS:
                acc = tl.dot(a + (i & 1).to(a.dtype), b, acc)
            else:
                acc = tl.dot(a, b, acc)
        tl.store(C + pid * BM * BN + rm[:, None] * BN + rn[None, :], acc)
        if CLOCKED:
            clock_stamp(CLK, 2, tl.sum(tl.sum(acc, 1), 0).to(tl.int32, bitcast=True))

    @triton.jit
    def elementwise(x, FMA: tl.constexpr):
        if FMA:  # four dependent fp32 FMAs
            return (((x * 0.999 + 1e-3) * 0.999 + 1e-3) * 0.999 + 1e-3) * 0.999 + 1e-3
        else:  # one MUFU.EX2
            return tl.exp2(-x)

    @triton.jit
    def dot_exp_mix(A, B, C, iters, sms, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                    DOT: tl.constexpr, EXP: tl.constexpr, SPLIT: tl.constexpr,
                    FMA: tl.constexpr = False):
        # Can an SM run the tensor cores and the SFU at once? Each iteration does one
        # [BM, BK] x [BK, BN] product (DOT) and/or one exp2 per element of a
        # [BM, BN] fp32 tile (EXP), on independent data. SPLIT: CTAs of even
        # "rounds" (pid // sms: the hardware hands out one CTA per SM per round)
        # only multiply, those of odd rounds only exponentiate, so every SM holds
        # both kinds and the work comes from different warps of the same SM.
        # FMA: the elementwise work is four dependent fp32 FMAs instead of an exp2.
        pid = tl.program_id(0)
        rm = tl.arange(0, BM)
        rn = tl.arange(0, BN)
        a = tile(A, BM, BK)
        b = tile(B, BK, BN)
        acc = tl.zeros([BM, BN], tl.float32)
        x = (rm[:, None] * BN + rn[None, :] + pid).to(tl.float32) * 1e-6
        if SPLIT:
            if (pid // sms) % 2 == 0:
                for i in range(iters):
                    acc = tl.dot(a, b, acc)
            else:
                for i in range(iters):
                    x = elementwise(x, FMA)
        elif DOT and EXP:
            for i in range(iters):
                acc = tl.dot(a, b, acc)
                x = elementwise(x, FMA)
        elif DOT:
            for i in range(iters):
                acc = tl.dot(a, b, acc)
        else:
            for i in range(iters):
                x = elementwise(x, FMA)
        tl.store(C + pid * BM * BN + rm[:, None] * BN + rn[None, :], acc + x)

    @triton.jit
    def dot_pair(A, B1, B2, C, iters1, iters2, sms, BM: tl.constexpr, BK: tl.constexpr,
                 BN1: tl.constexpr, BN2: tl.constexpr, MODE: tl.constexpr):
        # Does a wgmma starved of SMEM operands hold the tensor pipe against other
        # CTAs' products? Two products from SMEM: [BM, BK] x [BK, BN1] (narrow:
        # SMEM-bound) and [BM, BK] x [BK, BN2] (wide: tensor-bound). MODE 1 or 2:
        # every CTA runs product 1 (iters1 times) or product 2 (iters2); MODE 3:
        # CTAs of even rounds (pid // sms) run product 1, odd rounds product 2,
        # so every SM holds both kinds.
        pid = tl.program_id(0)
        a = tile(A, BM, BK)
        first = MODE == 1
        if MODE == 3:
            first = (pid // sms) % 2 == 0
        if first:
            b = tile(B1, BK, BN1)
            acc = tl.zeros([BM, BN1], tl.float32)
            for i in range(iters1):
                acc = tl.dot(a, b, acc)
            tl.store(C + pid, tl.sum(tl.sum(acc, 1), 0))   # a scalar: no SMEM staging
        else:
            b2 = tile(B2, BK, BN2)
            acc2 = tl.zeros([BM, BN2], tl.float32)
            for i in range(iters2):
                acc2 = tl.dot(a, b2, acc2)
            tl.store(C + pid, tl.sum(tl.sum(acc2, 1), 0))

    @triton.jit
    def phase_stamp(STAMPS, step, m, BM: tl.constexpr, STEPS: tl.constexpr):
        # every row's clock64 once its row max m (which needs S) is in, into
        # STAMPS[cta, step] for steps 0..STEPS-1 (steps before write slot 0,
        # which step 0 overwrites; steps after, the dump slot STEPS). Stored
        # from PTX with the address in m's own layout: a tl.store is given a
        # coalesced layout, and converting the stamps to it went through SMEM
        # with a second CTA barrier mid-step, which would hold the warpgroups
        # together after S (SASS of the cross-compiled kernel).
        clk = tl.inline_asm_elementwise("mov.u64 $0, %clock64;", "=l,r", [m.to(tl.int32, bitcast=True)],
                                        dtype=tl.int64, is_pure=False, pack=1)
        slot = tl.minimum(tl.maximum(step, 0), STEPS)
        row = (m.to(tl.int32, bitcast=True) & 0) + tl.arange(0, BM)
        addr = (STAMPS + (tl.program_id(0) * (STEPS + 1) + slot) * BM + row).to(tl.int64, bitcast=True)
        tl.inline_asm_elementwise("st.global.b64 [$1], $2;\n\tmov.u32 $0, 0;", "=r,l,l", [addr, clk],
                                  dtype=tl.int32, is_pure=False, pack=1)

    @triton.jit
    def dot_chain(A, B, V, C, iters, CLK, STAMPS, first, BM: tl.constexpr, BN: tl.constexpr,
                  BK: tl.constexpr, D: tl.constexpr, CLOCKED: tl.constexpr = False,
                  PHASE_STEPS: tl.constexpr = 0):
        # A dependent chain per iteration, operands on chip: S = A·B (SMEM
        # operands), an exp2 and a row max on S, then acc += P·V with P from
        # registers -- the shape of a flash-attention step without its loads.
        # Timed at 1, 2, 4 CTAs per SM: how much of the chain's latency other
        # CTAs hide (an SM's throughput vs one warpgroup's round trip).
        # CLOCKED: CLK gets each CTA's clock64 and global timer at start and end.
        # PHASE_STEPS: for that many steps from `first`, STAMPS gets every row's
        # clock64 once its S is in (phase_stamp): with 8 warps rows 0-63 are
        # warpgroup 0's and 64-127 warpgroup 1's, so the two stamps of a step
        # say in which order the SM's tensor pipe served the two warpgroups'
        # S products, issued together after the step's CTA barrier (BAR.SYNC
        # heads the loop): whole products in order, one lands a product's
        # time after the other; instructions interleaved, both together.
        pid = tl.program_id(0)
        if CLOCKED:
            clock_stamp(CLK, 0, pid)
        a = tile(A, BM, BK)
        b = tile(B, BK, BN)
        v = tile(V, BN, D)
        acc = tl.zeros([BM, D], tl.float32)
        m = tl.zeros([BM], tl.float32)
        for i in range(iters):
            s = tl.dot(a, b)
            m = tl.maximum(m, tl.max(s, 1))
            if PHASE_STEPS:
                phase_stamp(STAMPS, i - first, m, BM, PHASE_STEPS)
            p = tl.exp2(s * 0.01 - m[:, None] * 0.01)
            acc = tl.dot(p.to(v.dtype), v, acc)
        out = tl.sum(tl.sum(acc, 1), 0) + tl.sum(m, 0)
        tl.store(C + pid, out)
        if CLOCKED:
            clock_stamp(CLK, 2, out.to(tl.int32, bitcast=True))

    @triton.jit
    def softmax_mix(X, OUT, iters, BM: tl.constexpr, BN: tl.constexpr, EXP: tl.constexpr):
        # A flash step's elementwise part alone, its tile in registers: the
        # row max, exp2 of the scores and of the correction, the row sum and
        # the rescale of an accumulator, no products and no loads. Its loop's
        # instructions (SASS) against its time tell whether the SM's issue
        # slots (4 warp instructions a clock) or the MUFU (16 exp2 a clock)
        # bound the mix, or their sum. EXP=False puts an FFMA where each
        # exp2 was: the same instructions less the MUFU.
        pid = tl.program_id(0)
        s = tile(X, BM, BN)
        m = tl.full([BM], -1.0e30, tl.float32)
        l = tl.zeros([BM], tl.float32)
        acc = tl.zeros([BM, BN], tl.float32)
        for i in range(iters):
            m_new = tl.maximum(m, tl.max(s, 1))
            if EXP:
                alpha = tl.exp2(m - m_new)
                p = tl.exp2(s - m_new[:, None])
            else:
                alpha = (m - m_new) * 0.5 + 1.0
                p = (s - m_new[:, None]) * 0.5 + 1.0
            l = l * alpha + tl.sum(p, 1)
            acc = acc * alpha[:, None] + p
            s = s + p * 0.001      # the next step depends on this one
            m = m_new
        tl.store(OUT + pid * BM + tl.arange(0, BM), l + tl.sum(acc, 1))

    @triton.jit
    def exp2_loop(OUT, iters, BLOCK: tl.constexpr):
        pid = tl.program_id(0)
        offs = tl.arange(0, BLOCK)
        x = (offs + pid).to(tl.float32) * 1e-4
        for i in range(iters):
            x = tl.exp2(-x)
        tl.store(OUT + pid * BLOCK + offs, x)

    @triton.jit
    def empty():
        pass

    return dict(hbm_read=hbm_read, hbm_write=hbm_write, hbm_copy=hbm_copy, tile_write=tile_write,
                tma_setup=tma_setup, store_overlap=store_overlap, l2_read=l2_read, l2_shared_read=l2_shared_read,
                l2_write=l2_write, l2_round_trip=l2_round_trip,
                dot_shape=dot_shape, dot_exp_mix=dot_exp_mix, dot_pair=dot_pair, dot_chain=dot_chain,
                softmax_mix=softmax_mix, exp2_loop=exp2_loop, empty=empty)


DOT_SHAPES = {"bf16": (128, 256, 64), "fp16": (128, 256, 64), "fp8": (128, 256, 128)}
DOT_WARPS = 8


# ---------------------------------------------------------------------------
# check: compile everything for sm_90 on a CPU and look at the SASS
# ---------------------------------------------------------------------------
def _sass_ops(cubin_path: str, tool: str) -> str:
    return subprocess.run([tool, "-sass", cubin_path], capture_output=True, text=True).stdout


def compile_sm90(fn, sig: dict, consts: dict, warps: int = 8, stages: int = 3):
    """Cross-compile a microkernel for sm_90 here (no GPU), its pointers
    16-byte aligned as torch allocates them."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    names = list(sig)
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n, t in sig.items() if t.startswith("*")}
    src = ASTSource(fn=fn, signature=sig, constexprs=consts, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps, "num_stages": stages})


def cmd_check(args) -> int:
    import re

    import triton

    tools = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    cuobjdump = os.path.join(tools, "cuobjdump")
    ok = True
    with tempfile.TemporaryDirectory() as d:
        cubin = compile_cuda(d)
        sass = _sass_ops(cubin, cuobjdump)
        funcs = re.split(r"\n\s*Function : ", sass)
        for f in funcs[1:]:
            name = f.split("\n", 1)[0].strip()
            ops = sorted(set(re.findall(r"\b(MUFU\.EX2|HMMA\.[\w.]+|QMMA[\w.]*|LDS\.128|FFMA|"
                                        r"LDG\.E\.STRONG\.GPU|LDG[\w.]*|UBLKCP[\w.]*|SYNCS[\w.]*)",
                                        f)))
            print(f"cuda {name}: {' '.join(ops)}")
    kernels = triton_kernels()

    def sass_of(compiled) -> str:
        with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
            f.write(compiled.asm["cubin"])
            f.flush()
            return _sass_ops(f.name, cuobjdump)

    for dt, (bm, bn, bk) in DOT_SHAPES.items():
        tdt = {"bf16": "*bf16", "fp16": "*fp16", "fp8": "*fp8e4nv"}[dt]
        c = compile_sm90(kernels["dot_shape"], {"A": tdt, "B": tdt, "C": "*fp32", "iters": "i32", "CLK": "*i64",
                                         "BM": "constexpr", "BN": "constexpr", "BK": "constexpr",
                                         "A_IN_REGS": "constexpr", "CLOCKED": "constexpr"},
                  {"BM": bm, "BN": bn, "BK": bk, "A_IN_REGS": False, "CLOCKED": True}, warps=DOT_WARPS)
        s = sass_of(c)
        mma = re.findall(r"\b([HQ]GMMA\.[\w.]+|HMMA\.[\w.]+)", s)
        has = any(m.startswith(("HGMMA", "QGMMA")) for m in mma)
        ok &= has
        print(f"triton dot_shape {dt} {bm}x{bn}x{bk}: {len(mma)} MMA instructions, kinds "
              f"{sorted(set(mma))[:4]}, smem {c.metadata.shared} B; wgmma={'yes' if has else 'NO'}")
    c = compile_sm90(kernels["exp2_loop"], {"OUT": "*fp32", "iters": "i32", "BLOCK": "constexpr"},
              {"BLOCK": 1024}, warps=4)
    s = sass_of(c)
    n_mufu, n_fix = len(re.findall("MUFU.EX2", s)), len(re.findall(r"FMUL|FSETP|FSEL", s))
    print(f"triton exp2_loop: MUFU.EX2 x{n_mufu}, other FP ops {n_fix}")
    unrolled = {"nblocks": "i32", "iters": "i32", "BLOCK": "constexpr", "UNROLL": "constexpr"}
    for name, pointers, op, what in (("l2_read", {"X": "*fp32", "OUT": "*fp32"}, "LDG", "loads"),
                                     ("l2_write", {"Y": "*fp32"}, "STG", "stores")):
        found = re.findall(op + r"[\w.]*", sass_of(compile_sm90(kernels[name], {**pointers, **unrolled},
                                                          {"BLOCK": 2048, "UNROLL": 4})))
        print(f"triton {name}: {len(found)} {what} {sorted(set(found))}")
    return 0 if ok else 1


# ---------------------------------------------------------------------------
# run: the GPU side
# ---------------------------------------------------------------------------
class ClockSampler:
    """Samples the SM clock through NVML on a thread while a benchmark runs."""

    def __init__(self, handle, period_s=0.005):
        self.h, self.period, self.samples = handle, period_s, []
        self._stop = threading.Event()

    def __enter__(self):
        import pynvml

        def loop():
            while not self._stop.is_set():
                try:
                    self.samples.append(pynvml.nvmlDeviceGetClockInfo(self.h, pynvml.NVML_CLOCK_SM))
                except Exception:
                    pass
                time.sleep(self.period)

        self._t = threading.Thread(target=loop, daemon=True)
        self._t.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()

    @property
    def mhz(self):
        s = [x for x in self.samples if x > 0]
        return float(statistics.median(s)) if s else None


class Runner:
    def __init__(self, args):
        import torch

        self.args = args
        self.torch = torch
        self.rows: list[dict] = []
        self.dev = torch.device("cuda")
        props = torch.cuda.get_device_properties(0)
        self.props = props
        self.sms = props.multi_processor_count
        self.nvml = None
        try:
            import pynvml
            pynvml.nvmlInit()
            self.nvml = pynvml.nvmlDeviceGetHandleByIndex(0)
        except Exception as e:  # pragma: no cover
            print(f"[calibrate] NVML unavailable: {e}", file=sys.stderr)
        self.prov = self._provenance()
        self.timing = None      # set by event_loop, noted by the next add()

    def _provenance(self):
        import torch
        import triton
        try:
            import cupy
            cupy_v = cupy.__version__
        except Exception:
            cupy_v = ""
        driver = clock = maxclock = ""
        if self.nvml is not None:
            import pynvml
            driver = pynvml.nvmlSystemGetDriverVersion()
            driver = driver.decode() if isinstance(driver, bytes) else driver
            clock = pynvml.nvmlDeviceGetClockInfo(self.nvml, pynvml.NVML_CLOCK_SM)
            maxclock = pynvml.nvmlDeviceGetMaxClockInfo(self.nvml, pynvml.NVML_CLOCK_SM)
        commit = os.environ.get("GPUSIM_GIT_COMMIT", "")
        if not commit:
            try:
                commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "HEAD"], capture_output=True,
                                        text=True).stdout.strip()
            except Exception:
                commit = ""
        return {"gpu": self.props.name, "sm_count": self.sms, "sm_clock_mhz": clock,
                "max_sm_clock_mhz": maxclock, "driver": driver, "cuda": torch.version.cuda,
                "torch": torch.__version__, "triton": triton.__version__, "cupy": cupy_v,
                "git_commit": commit or "unknown",
                "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
                "command": "PYTHONPATH=. python3 experiments/calibrate.py " + " ".join(sys.argv[1:])}

    def nvml_clock(self):
        """NVML's SM clock now (MHz), None without NVML. Under a tl.dot loop held by the
        power cap it matches the clock the SMs count (clock_stamped_h100.csv)."""
        if self.nvml is None:
            return None
        import pynvml
        try:
            return float(pynvml.nvmlDeviceGetClockInfo(self.nvml, pynvml.NVML_CLOCK_SM))
        except Exception:
            return None

    def sampler(self):
        if self.nvml is None:
            class _Null:
                mhz = None

                def __enter__(s):
                    return s

                def __exit__(s, *e):
                    pass
            return _Null()
        return ClockSampler(self.nvml)

    def add(self, bench, param, value, unit, clock=None, kclock=None, detail=""):
        if self.timing:     # how the figure was timed, when event_loop timed it
            detail = f"{detail}; timed by {self.timing}" if detail else f"timed by {self.timing}"
            self.timing = None
        row = {"bench": bench, "param": param, "value": f"{value:.6g}" if isinstance(value, float) else value,
               "unit": unit, "clock_mhz_nvml": f"{clock:.0f}" if clock else "",
               "clock_mhz_kernel": f"{kclock:.0f}" if kclock else "", "detail": detail}
        row.update(self.prov)
        self.rows.append(row)
        print(f"  {bench:<22} {str(param):<26} {row['value']:>12} {unit:<12} "
              f"nvml {row['clock_mhz_nvml'] or '-':>5} MHz  kernel {row['clock_mhz_kernel'] or '-':>5} MHz"
              f"  {detail}", file=sys.stderr, flush=True)

    # timing helpers -------------------------------------------------------
    def do_bench(self, fn, warmup=25, rep=200):
        import triton
        return triton.testing.do_bench(fn, warmup=warmup, rep=rep, return_mode="median")

    def event_loop(self, fn, n=20, warm=3, host_cover=True):
        """Median ms of fn over n calls with events around each, no cache flush (for
        working sets that should stay in L2). Each call waits for the last, so
        without cover the GPU sits idle between the start event and the kernel
        while the host launches it: some 30 us of Triton's launch path in every
        figure (an empty launch: 33-39 us in two runs, against do_bench's
        4.8-5.0; calibrate.py launch_fill).
        host_cover (the default since session 12) queues a 100 us GPU sleep
        before the start event, so the host has launched fn before the GPU
        reaches it. Rows timed before session 12 were taken without it; every
        row says which (Runner.add appends the timing)."""
        torch = self.torch
        self.timing = "event_loop behind a 100 us GPU sleep" if host_cover else "event_loop, uncovered"
        for _ in range(warm):
            fn()
        # 100 us of GPU clocks at the device's top clock from NVML, else the H100's
        # 1980 MHz (torch.cuda._sleep counts clocks)
        cover = int(100e-6 * float(self.prov.get("max_sm_clock_mhz") or 1980) * 1e6)
        times = []
        for _ in range(n):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            if host_cover:
                torch.cuda._sleep(cover)
            s.record()
            fn()
            e.record()
            e.synchronize()
            times.append(s.elapsed_time(e))
        return statistics.median(times)


def bench_device(r: Runner):
    p = r.props
    for key, attr in (("multi_processor_count", "multi_processor_count"),
                      ("l2_cache_size", "L2_cache_size"),
                      ("shared_memory_per_multiprocessor", "shared_memory_per_multiprocessor"),
                      ("shared_memory_per_block_optin", "shared_memory_per_block_optin"),
                      ("regs_per_multiprocessor", "regs_per_multiprocessor"),
                      ("max_threads_per_multi_processor", "max_threads_per_multi_processor"),
                      ("total_memory", "total_memory")):
        v = getattr(p, attr, None)
        if v is not None:
            r.add("device", key, int(v), "count" if "count" in key or "regs" in key or "threads" in key
                  else "bytes", detail="torch.cuda.get_device_properties")
    try:
        import cupy
        cp = cupy.cuda.runtime.getDeviceProperties(0)
        for k in ("reservedSharedMemPerBlock", "clockRate", "memoryClockRate", "memoryBusWidth"):
            if k in cp:
                r.add("device", k, int(cp[k]), "kHz" if "Rate" in k else ("bits" if "Width" in k else "bytes"),
                      detail="cudaGetDeviceProperties")
    except Exception as e:
        print(f"[calibrate] cupy device properties: {e}", file=sys.stderr)


def bench_hbm(r: Runner, K):
    torch = r.torch
    nbytes = (1 << 31) if not r.args.quick else (1 << 29)
    n = nbytes // 4
    x = torch.randn(n, device="cuda", dtype=torch.float32)
    y = torch.empty_like(x)
    BLOCK = 8192
    grid = (n // BLOCK,)
    part = torch.empty(grid[0], device="cuda", dtype=torch.float32)
    cases = {
        "read": (lambda: K["hbm_read"][grid](x, part, BLOCK=BLOCK, num_warps=8), nbytes),
        "write": (lambda: K["hbm_write"][grid](y, 1.5, BLOCK=BLOCK, num_warps=8), nbytes),
        "copy": (lambda: K["hbm_copy"][grid](x, y, BLOCK=BLOCK, num_warps=8), 2 * nbytes),
        "copy_torch": (lambda: y.copy_(x), 2 * nbytes),
    }
    for name, (fn, moved) in cases.items():
        fn()
        torch.cuda.synchronize()
        with r.sampler() as s:
            ms = r.do_bench(fn)
        r.add("hbm_bandwidth", name, moved / (ms * 1e-3) / 1e9, "GB/s", s.mhz,
              detail=f"{nbytes >> 20} MiB fp32 buffers, bytes read+written / do_bench median "
                     f"{ms * 1e3:.1f} us")
    del x, y


# Tile widths for tile_write, in bf16 columns: runs of 64 to 256 B (standard's
# QKᵀ at block_n = 128 writes 256 B runs). Wider tiles spill the pointer tensor
# (STL in the sm_90 SASS at 128x256 and 128x512, 255 registers) and measure that
# instead: 2436 and 307 GB/s on the H100.
TILE_WRITE_COLS = (32, 64, 128)


def bench_tile_write(r: Runner, K):
    """HBM write bandwidth for the store pattern of standard's QKᵀ (rows
    `tile_write`): 2 GB of bf16 written as [128, BN] tiles, a CTA a row block
    walking its columns, BN of TILE_WRITE_COLS (runs of 64-256 B); against
    hbm_bandwidth/write, 32 KB contiguous a CTA."""
    torch = r.torch
    n_cols = 4096
    n_rows = ((1 << 31) if not r.args.quick else (1 << 29)) // (2 * n_cols)
    y = torch.empty(n_rows, n_cols, device="cuda", dtype=torch.bfloat16)
    bm = 128
    for bn in TILE_WRITE_COLS:
        def fn():
            return K["tile_write"][(n_rows // bm,)](y, n_cols, BM=bm, BN=bn, num_warps=8)

        fn()
        torch.cuda.synchronize()
        with r.sampler() as s:
            ms = r.do_bench(fn)
        r.add("tile_write", f"{bm}x{bn}", y.numel() * 2 / (ms * 1e-3) / 1e9, "GB/s", s.mhz,
              detail=f"{y.numel() * 2 >> 20} MiB of bf16 rows {n_cols * 2} B long, {n_rows // bm} CTAs of 8 "
                     f"warps each writing {bm} rows as [{bm}, {bn}] tiles ({bn * 2} B runs); do_bench "
                     f"median {ms * 1e3:.1f} us")
    del y


# the descriptors tma_setup builds, as kernels/fa3.py (Q, K, V; fp8: Q, K, Vᵀ)
TMA_SETUP_DESCRIPTORS = 3


def bench_tma_setup(r: Runner, K):
    """The cycles a CTA spends building kernels/fa3.py's three device-side TMA
    descriptors before its first copy (rows `tma_setup`): tma_setup with TMA
    against the same three [64, 64] bf16 tiles by plain loads, clock64 per CTA
    from its start to the tiles' sum, median over CTAs, with one CTA an SM
    (grid = SMs) and with eight (grid = 8 x SMs, the descriptors' global
    atomics from every CTA at once)."""
    from kernels.common import ensure_tma_allocator

    torch = r.torch
    ensure_tma_allocator()
    rows, cols, n_rows = 64, 64, 1 << 16
    x = (torch.randn(n_rows, cols, device="cuda") * 0.1).to(torch.bfloat16)
    for per_sm in (1, 8):
        grid = r.sms * per_sm
        out = torch.empty(grid, device="cuda", dtype=torch.float32)
        clk = torch.zeros(grid, device="cuda", dtype=torch.int64)
        cycles = {}
        for tma in (False, True):
            def fn():
                return K["tma_setup"][(grid,)](x, out, clk, n_rows, ROWS=rows, COLS=cols, TMA=tma, num_warps=4)

            runs = cta_clock_runs(torch, fn, clk, 5)
            cycles[tma] = statistics.median(runs)
            r.add("tma_setup", f"{'tma' if tma else 'plain'}_x{per_sm}", cycles[tma], "clk",
                  detail=f"{grid} CTAs of 4 warps ({per_sm} an SM at most): clock64 from a CTA's start to "
                         f"the sum of three [{rows}, {cols}] bf16 tiles "
                         + ("loaded through three device-side tensor descriptors it builds first"
                            if tma else "loaded by plain loads") + "; median CTA, median of 5 launches: "
                         + " / ".join(f"{v:.0f}" for v in runs))
        r.add("tma_setup", f"descriptors_x{per_sm}", cycles[True] - cycles[False], "clk",
              detail=f"tma_x{per_sm} less plain_x{per_sm}: three device-side descriptors built and "
                     f"fenced, and their three copies' extra latency, a CTA")


# store_overlap: a chain of dependent FMAs (~1000 cycles at 4 a link) against
# stores of 4-64 KB a CTA an iteration (64 KB is 2060 cycles at the SM's 31.8 B/clk)
STORE_OVERLAP_WORK = 256
STORE_OVERLAP_BYTES = (4096, 8192, 16384, 32768, 65536)
STORE_OVERLAP_WARPS = 4
# stores of at least this many bytes an iteration run at the warps' rate; smaller
# ones wait out their latency (4 KB: 183 cycles, 22 B/clk)
STORE_OVERLAP_DRAINED = 16384


def bench_store_overlap(r: Runner, K):
    """Does a warp wait for its stores to leave the SM (rows `store_overlap`)?
    One 4-warp CTA an SM, each iteration a chain of STORE_OVERLAP_WORK
    dependent FMAs and a store of B bytes from registers: the chain alone,
    the store alone, and both, in clock64 cycles an iteration (median CTA).
    Posted stores: both take the longer of the two; waited-for: their sum."""
    torch = r.torch
    grid = r.sms
    iters = 256
    clk = torch.zeros(grid, device="cuda", dtype=torch.int64)
    for nbytes in STORE_OVERLAP_BYTES:
        floats = nbytes // 4
        y = torch.empty(grid * floats, device="cuda", dtype=torch.float32)
        cycles = {}
        for case, work, stores in (("chain", STORE_OVERLAP_WORK, False), ("store", 0, True),
                                   ("both", STORE_OVERLAP_WORK, True)):
            def fn():
                return K["store_overlap"][(grid,)](y, clk, iters, WORK=work, STORE=floats, STORES=stores,
                                                   num_warps=STORE_OVERLAP_WARPS)

            runs = [c / iters for c in cta_clock_runs(torch, fn, clk, 3)]
            cycles[case] = statistics.median(runs)
            r.add("store_overlap", f"{nbytes}B_{case}", cycles[case], "clk/iter",
                  detail=f"{grid} CTAs of 4 warps, one an SM, {iters} iterations of "
                         + {"chain": f"{work} dependent FMAs", "store": f"a {nbytes} B store from registers",
                            "both": f"{work} dependent FMAs and a {nbytes} B store"}[case]
                         + "; clock64 over the loop, median CTA, median of 3 launches: "
                         + " / ".join(f"{v:.1f}" for v in runs))
        longer, total = max(cycles["chain"], cycles["store"]), cycles["chain"] + cycles["store"]
        r.add("store_overlap", f"{nbytes}B_waited", (cycles["both"] - longer) / (total - longer), "",
              detail="(both - the longer part) / (sum - the longer part): 0 = the stores drain beside "
                     "the chain, 1 = the warp waits for them")
        del y


def bench_l2(r: Runner, K):
    torch = r.torch
    BLOCK, UNROLL = 2048, 4  # fp32: 4 loads of 8 KB in flight per program per step
    grid = r.sms * 4
    sizes_mb = [1, 2, 4, 8, 12, 16, 20, 24, 28, 32, 36, 40, 44, 48, 56, 64, 80, 96, 128, 256, 512, 1024]
    if r.args.quick:
        sizes_mb = [4, 16, 32, 48, 64, 256]
    big = torch.randn((1024 << 20) // 4, device="cuda", dtype=torch.float32)
    out = torch.empty(grid * BLOCK, device="cuda", dtype=torch.float32)
    target = 4 << 30  # bytes per launch
    for mb in sizes_mb:
        ws = mb << 20
        nblocks = ws // (BLOCK * 4)
        steps = max(2, -(-max(target, 4 * ws) // (grid * UNROLL * BLOCK * 4)))
        moved = steps * grid * UNROLL * BLOCK * 4

        def fn():
            K["l2_read"][(grid,)](big, out, nblocks, steps, BLOCK=BLOCK, UNROLL=UNROLL, num_warps=8)

        with r.sampler() as s:
            ms = r.event_loop(fn, n=7 if ws < (256 << 20) else 3)
        r.add("l2_read_bandwidth", f"{mb}MB", moved / (ms * 1e-3) / 1e9, "GB/s", s.mhz,
              detail=f"working set {mb} MB re-read {moved / ws:.0f}x by {grid} CTAs, ld.global.cg; "
                     f"{ms * 1e3:.0f} us per launch")
    # One SM alone: what the L2 -> SM path delivers to a single CTA (the per-SM port).
    ws = 4 << 20
    for block, unroll, warps in ((4096, 4, 32), (4096, 8, 32), (4096, 16, 32), (2048, 8, 16)):
        nblocks = ws // (block * 4)
        steps = (256 << 20) // (block * unroll * 4)
        o1 = torch.empty(block, device="cuda", dtype=torch.float32)

        def fn1():
            K["l2_read"][(1,)](big, o1, nblocks, steps, BLOCK=block, UNROLL=unroll, num_warps=warps)

        with r.sampler() as s:
            ms = r.event_loop(fn1, n=5)
        bw = steps * unroll * block * 4 / (ms * 1e-3)
        r.add("l2_sm_port", f"1cta_{warps}warps_{block * unroll * 4 // 1024}KB", bw / ((s.mhz or float("nan")) * 1e6),
              "B/clk/SM", s.mhz,
              detail=f"one CTA ({warps} warps, {block * unroll * 4 // 1024} KB of loads in flight per step) "
                     f"re-reading a 4 MB L2-resident set with ld.global.cg: {bw / 1e9:.1f} GB/s at the NVML clock")
    del big


# l2_shared: lags (in 8 KB blocks) between consecutive CTAs walking one block
# sequence; "spread" puts each CTA on its own part of the set (l2's pattern).
L2_SHARED_LAGS = (0, 1, 2, 4, 8, 32, "spread")


def bench_l2_shared(r: Runner, K):
    """Do requests from many SMs for the same lines cost L2 its bandwidth
    once or once each? ncu counts fewer sectors looked up at the L2 slices
    than the SMs receive for fa2 (26-48% fewer non-causal: the L2 request
    coalescer merges requests for a sector in flight); this measures what
    that does to the rate. One CTA an SM (8 warps, four 8 KB loads in flight
    each) re-reads a 16 MB L2-resident set, all CTAs walking the same block
    sequence, CTA c `lag` blocks ahead of CTA c - 1, and, as `l2` does, each
    on its own part of the set ("spread"). Rows `l2_shared`: bytes the SMs
    received / time, GB/s."""
    torch = r.torch
    BLOCK, UNROLL = 2048, 4
    grid = r.sms
    ws = 16 << 20
    nblocks = ws // (BLOCK * 4)
    buf = torch.randn(ws // 4, device="cuda", dtype=torch.float32)
    out = torch.empty(grid * BLOCK, device="cuda", dtype=torch.float32)
    iters = (2 << 30) // (grid * UNROLL * BLOCK * 4)     # 2 GB received a launch
    for lag in L2_SHARED_LAGS:
        step = nblocks // grid if lag == "spread" else lag

        def fn():
            K["l2_shared_read"][(grid,)](buf, out, nblocks, iters, step, BLOCK=BLOCK, UNROLL=UNROLL, num_warps=8)

        with r.sampler() as smp:
            ms = r.event_loop(fn, n=7, warm=2)
        moved = iters * grid * UNROLL * BLOCK * 4
        r.add("l2_shared", f"lag_{lag}", moved / (ms * 1e-3) / 1e9, "GB/s", smp.mhz,
              detail=f"{grid} CTAs (one an SM, 8 warps) re-reading a 16 MB set, ld.global.cg, "
                     + ("each on its own part of it" if lag == "spread" else
                        f"all walking one 8 KB block sequence, each {lag} blocks ahead of the last")
                     + f"; {moved >> 20} MB received a launch, {ms:.3f} ms")
    del buf


def bench_l2_duration(r: Runner, K):
    """Why `l2` and `loaded_latency` disagree on the L2's bandwidth (7.7 TB/s
    against 10.9 re-reading 16 MB with 528 CTAs): the same l2_read over 4-32 MB
    working sets, each held in a buffer of its own size or as the head of a
    1 GB buffer (as `l2` reads it), each launch moving 4 GB (as `l2`, about
    0.5 ms) or 64 GB (about 8 ms). Rows `l2_duration`, GB/s."""
    torch = r.torch
    BLOCK, UNROLL = 2048, 4
    grid = r.sms * 4
    out = torch.empty(grid * BLOCK, device="cuda", dtype=torch.float32)
    head = torch.randn((1024 << 20) // 4, device="cuda", dtype=torch.float32)
    for mb in (4, 8, 16, 24, 32):
        ws = mb << 20
        nblocks = ws // (BLOCK * 4)
        own = torch.randn(ws // 4, device="cuda", dtype=torch.float32)
        for where, buf in (("own", own), ("head1g", head)):
            for label, moved in (("4GB", 4 << 30), ("64GB", 64 << 30)):
                steps = max(2, moved // (grid * UNROLL * BLOCK * 4))

                def fn():
                    K["l2_read"][(grid,)](buf, out, nblocks, steps, BLOCK=BLOCK, UNROLL=UNROLL, num_warps=8)

                with r.sampler() as smp:
                    ms = r.event_loop(fn, n=5 if label == "4GB" else 3, warm=2)
                done = steps * grid * UNROLL * BLOCK * 4
                r.add("l2_duration", f"{mb}MB_{where}_{label}", done / (ms * 1e-3) / 1e9, "GB/s", smp.mhz,
                      detail=f"l2_read, {grid} CTAs of 8 warps, {mb} MB working set "
                             f"({'a buffer of its own' if where == 'own' else 'the head of a 1 GB buffer'}), "
                             f"{done >> 20} MB a launch, {ms:.3f} ms")
        del own
    del head


def bench_l2_ramp(r: Runner, K):
    """l2_duration's launches of 4 GB ran at 7.7 TB/s and of 64 GB at 10.3
    (16 MB working set): a per-launch cost, or a rate that climbs during a
    launch? The same l2_read moving 0.125-64 GB a launch over a 16 MB set,
    and over a 2 GB set (from HBM); then a 0.5 GB launch over the 16 MB set
    right after a 1 ms exp2 kernel on every SM (warm clocks, L2 untouched)
    and right after do_bench's own flush (zeroing 256 MB, as the validation
    sweep times its kernels). Rows `l2_ramp`: ms a launch (event pairs)."""
    torch = r.torch
    BLOCK, UNROLL = 2048, 4
    grid = r.sms * 4
    out = torch.empty(grid * BLOCK, device="cuda", dtype=torch.float32)
    chunk = grid * UNROLL * BLOCK * 4
    for ws_mb in (16, 2048):
        buf = torch.randn((ws_mb << 20) // 4, device="cuda", dtype=torch.float32)
        nblocks = (ws_mb << 20) // (BLOCK * 4)
        sizes = (0.125, 0.25, 0.5, 1, 2, 4, 8, 16, 32, 64) if ws_mb == 16 else (0.25, 0.5, 1, 2, 4, 8)
        for gb in sizes:
            steps = max(1, int(gb * (1 << 30)) // chunk)

            def fn():
                K["l2_read"][(grid,)](buf, out, nblocks, steps, BLOCK=BLOCK, UNROLL=UNROLL, num_warps=8)

            with r.sampler() as smp:
                ms = r.event_loop(fn, n=5, warm=2)
            r.add("l2_ramp", f"{ws_mb}MB_{gb}GB", ms, "ms", smp.mhz,
                  detail=f"l2_read, {grid} CTAs of 8 warps, {ws_mb} MB working set, {steps * chunk >> 20} MB "
                         f"a launch: {steps * chunk / (ms * 1e-3) / 1e9:.0f} GB/s")
        if ws_mb != 16:
            del buf
            continue
        steps = (1 << 29) // chunk
        spin_out = torch.empty(r.sms * 16 * 1024, device="cuda", dtype=torch.float32)
        flush = torch.empty(256 << 20, dtype=torch.int8, device="cuda")
        before = {"after_spin": lambda: K["exp2_loop"][(r.sms * 16,)](spin_out, 16384, BLOCK=1024, num_warps=4),
                  "after_flush": lambda: flush.zero_()}
        for name, pre in before.items():
            times = []
            with r.sampler() as smp:
                for _ in range(7):
                    pre()
                    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    s.record()
                    K["l2_read"][(grid,)](buf, out, nblocks, steps, BLOCK=BLOCK, UNROLL=UNROLL, num_warps=8)
                    e.record()
                    e.synchronize()
                    times.append(s.elapsed_time(e))
            ms = statistics.median(times)
            r.add("l2_ramp", f"16MB_0.5GB_{name}", ms, "ms", smp.mhz,
                  detail=f"the 0.5 GB launch over 16 MB timed alone right after "
                         f"{'a 1 ms exp2 loop on every SM' if name == 'after_spin' else 'zeroing 256 MB'}: "
                         f"{steps * chunk / (ms * 1e-3) / 1e9:.0f} GB/s; reps "
                         f"{', '.join(f'{t:.3f}' for t in times)}")
        del buf, flush


def bench_launch_fill(r: Runner, K):
    """l2_ramp's launches take about 23 us (from L2) and 28 us (from HBM)
    more than their bytes at the sustained rate, against 4 us for an empty
    kernel: where does a streaming launch lose that time? The same l2_read
    over a 16 MB L2-resident set with 0-128 steps a CTA (32 KB each), 132
    and 528 CTAs. Rows `launch_fill`: us a launch (event pairs, median)."""
    torch = r.torch
    BLOCK, UNROLL = 2048, 4
    buf = torch.randn((16 << 20) // 4, device="cuda", dtype=torch.float32)
    nblocks = (16 << 20) // (BLOCK * 4)
    for grid in (r.sms, r.sms * 4):
        out = torch.empty(grid * BLOCK, device="cuda", dtype=torch.float32)
        for steps in (0, 1, 2, 4, 8, 16, 32, 64, 128):
            def fn():
                K["l2_read"][(grid,)](buf, out, nblocks, steps, BLOCK=BLOCK, UNROLL=UNROLL, num_warps=8)

            moved = steps * grid * UNROLL * BLOCK * 4
            for cover in (False, True):
                with r.sampler() as smp:
                    ms = r.event_loop(fn, n=21, warm=3, host_cover=cover)
                r.add("launch_fill", f"{grid}ctas_{steps}steps" + ("_covered" if cover else ""), ms * 1e3, "us",
                      smp.mhz, detail=f"l2_read, {grid} CTAs of 8 warps, {steps} steps of 32 KB a CTA over a 16 MB "
                                      f"set: {moved >> 20} MB a launch")
            if grid == r.sms * 4 and steps in (0, 8, 64):
                # as the validation sweep times its kernels: do_bench, L2 flushed before each call
                with r.sampler() as smp:
                    ms = r.do_bench(fn)
                r.add("launch_fill", f"{grid}ctas_{steps}steps_do_bench", ms * 1e3, "us", smp.mhz,
                      detail=f"the same launch timed by triton.testing.do_bench (L2 flushed before each "
                             f"call, so the set comes from HBM): {moved >> 20} MB a launch")
    del buf


# l2_round_trip: 4 KB pieces (1024 fp32), 4 CTAs of 4 warps an SM; each CTA
# owns `chunks` pieces, so the working set is sms x 4 x chunks x 4 KB
# (2.06 MB a chunk on 132 SMs): 4 to 64 chunks span 8-132 MB around the 50 MB L2.
ROUND_TRIP_CHUNK = 1024
ROUND_TRIP_CTAS_PER_SM = 4
ROUND_TRIP_CHUNKS = (4, 8, 10, 12, 14, 16, 17, 18, 19, 20, 21, 22, 23, 24, 26, 28, 32, 40, 48, 64)


def bench_l2_round_trip(r: Runner, K):
    """How much data read and written back each pass L2 keeps for the next
    pass: every CTA walks its own part of a working set, reading each piece
    and writing it back, pass after pass. Below what L2 keeps, a pass runs at
    L2's pace; above it, at HBM's. The byte rate at each working set
    (l2_round_trip rows). No profile key reads it: l2.keep_all_bytes comes
    from ncu's DRAM bytes of the same round trips (experiments/l2_keep_ncu.py),
    which tell misses from waits; these times say where they begin."""
    torch = r.torch
    grid = r.sms * ROUND_TRIP_CTAS_PER_SM
    piece = ROUND_TRIP_CHUNK * 4
    big = torch.zeros(grid * max(ROUND_TRIP_CHUNKS) * ROUND_TRIP_CHUNK, device="cuda", dtype=torch.float32)
    for chunks in ROUND_TRIP_CHUNKS:
        ws = grid * chunks * piece
        passes = max(4, -(-(1 << 30) // (2 * ws)))   # at least 1 GB read and written a launch

        def fn():
            K["l2_round_trip"][(grid,)](big, chunks, passes, CHUNK=ROUND_TRIP_CHUNK, num_warps=4)

        with r.sampler() as s:
            ms = r.event_loop(fn, n=5)
        moved = 2 * passes * ws
        r.add("l2_round_trip", f"{ws}B", moved / (ms * 1e-3) / 1e9, "GB/s", s.mhz,
              detail=f"working set {ws / 2**20:.1f} MB ({grid} CTAs x {chunks} pieces of {piece} B) read and "
                     f"written back {passes} times, plain ld/st.global; {ms * 1e3:.0f} us per launch")
    del big


def bench_l2_store(r: Runner, K):
    """Stores into an L2-resident set: one CTA alone (the SM's write path to
    L2, l2_sm_store) and four CTAs per SM (L2's write bandwidth)."""
    torch = r.torch
    ws = 4 << 20
    y = torch.empty(ws // 4, device="cuda", dtype=torch.float32)
    for block, unroll, warps in ((4096, 4, 32), (4096, 8, 32), (2048, 8, 16), (1024, 8, 8)):
        nblocks = ws // (block * 4)
        steps = (256 << 20) // (block * unroll * 4)

        def fn1():
            K["l2_write"][(1,)](y, nblocks, steps, BLOCK=block, UNROLL=unroll, num_warps=warps)

        with r.sampler() as s:
            ms = r.event_loop(fn1, n=5)
        bw = steps * unroll * block * 4 / (ms * 1e-3)
        r.add("l2_sm_store", f"1cta_{warps}warps_{block * unroll * 4 // 1024}KB",
              bw / ((s.mhz or float("nan")) * 1e6), "B/clk/SM", s.mhz,
              detail=f"one CTA ({warps} warps, {block * unroll * 4 // 1024} KB of stores per step) "
                     f"writing a 4 MB L2-resident set (st.global, 16 B per thread per store): "
                     f"{bw / 1e9:.1f} GB/s at the NVML clock")
    block, unroll = 2048, 4
    grid = r.sms * 4
    nblocks = ws // (block * 4)
    steps = max(2, (4 << 30) // (grid * unroll * block * 4))

    def fn():
        K["l2_write"][(grid,)](y, nblocks, steps, BLOCK=block, UNROLL=unroll, num_warps=8)

    with r.sampler() as s:
        ms = r.event_loop(fn, n=5)
    bw = steps * grid * unroll * block * 4 / (ms * 1e-3)
    r.add("l2_write_bandwidth", "4MB", bw / 1e9, "GB/s", s.mhz,
          detail=f"{grid} CTAs (8 warps) writing a 4 MB L2-resident set, {ms * 1e3:.0f} us per launch")


def _dot_tflops(r: Runner, K, dt: str):
    torch = r.torch
    bm, bn, bk = DOT_SHAPES[dt]
    tdt = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp8": torch.float8_e4m3fn}[dt]
    a = (torch.randn(bm, bk, device="cuda") * 0.1).to(tdt)
    b = (torch.randn(bk, bn, device="cuda") * 0.1).to(tdt)
    grid = r.sms * 8
    c = torch.empty(grid * bm * bn, device="cuda", dtype=torch.float32)
    clk = torch.zeros(grid * 4, device="cuda", dtype=torch.int64)
    iters = 4096 if not r.args.quick else 1024

    def fn():
        K["dot_shape"][(grid,)](a, b, c, iters, clk, BM=bm, BN=bn, BK=bk, A_IN_REGS=False,
                                CLOCKED=True, num_warps=DOT_WARPS, num_stages=1)

    fn()
    torch.cuda.synchronize()
    with r.sampler() as s:
        ms = r.event_loop(fn, n=9)
    kmhz, _ = stamped_clock(clk)
    flops = 2.0 * bm * bn * bk * iters * grid
    r.add("tensor_wgmma_triton", dt, flops / (ms * 1e-3) / 1e12, "TFLOP/s", s.mhz, kmhz,
          detail=f"tl.dot loop {bm}x{bn}x{bk}, {DOT_WARPS} warps, operands on chip, {grid} CTAs x "
                 f"{iters} iters; {ms:.2f} ms; kernel clock: clock64 over the global timer in each CTA "
                 f"of the last launch, median")


# Attention-sized products (bf16): (BM, BN, BK, warps, A in registers).
# SS rows are Q Kᵀ (BK = head dim, BN = block_n); RS rows are P V (BK = block_n,
# BN = head dim, P in registers). Enough CTAs per SM to hide issue latency, so
# each figure is the tensor cores' sustained rate for that instruction mix.
WGMMA_SHAPES = ([(bm, bn, bk, w, 0) for bm in (64, 128) for bn in (16, 32, 64, 128, 256)
                 for bk in (64, 128) for w in (4, 8)]
                + [(bm, bn, bk, w, 1) for bm in (64, 128) for bn in (64, 128)
                   for bk in (16, 32, 64, 128) for w in (4, 8)])


def bench_wgmma_shapes(r: Runner, K):
    """Tensor-core throughput per attention-sized tl.dot shape: how the rate falls
    with narrow wgmma instructions (small N) and with A read from SMEM."""
    import re

    torch = r.torch
    for bm, bn, bk, warps, a_regs in WGMMA_SHAPES:
        a = (torch.randn(bm, bk, device="cuda") * 0.1).to(torch.bfloat16)
        b = (torch.randn(bk, bn, device="cuda") * 0.1).to(torch.bfloat16)
        grid = r.sms * 8
        c = torch.empty(grid * bm * bn, device="cuda", dtype=torch.float32)
        iters = max(64, int(4e11 / (grid * 2 * bm * bn * bk)))
        if r.args.quick:
            iters = max(16, iters // 8)

        def fn():
            return K["dot_shape"][(grid,)](a, b, c, iters, c, BM=bm, BN=bn, BK=bk, A_IN_REGS=a_regs,
                                          num_warps=warps, num_stages=1)

        compiled = fn()
        torch.cuda.synchronize()
        ptx = compiled.asm.get("ptx", "")
        instr = sorted(set(re.findall(r"wgmma\.mma_async\.sync\.aligned\.(m\d+n\d+k\d+)", ptx)))
        with r.sampler() as s:
            ms = r.event_loop(fn, n=7)
        flops = 2.0 * bm * bn * bk * iters * grid
        mode = "RS" if a_regs else "SS"
        r.add("wgmma_shape", f"{mode}_{bm}x{bn}x{bk}_w{warps}", flops / (ms * 1e-3) / 1e12, "TFLOP/s",
              s.mhz, detail=f"bf16 tl.dot loop, A {'in registers' if a_regs else 'in SMEM'}, "
                            f"instructions {'/'.join(instr) or '?'}, smem {compiled.metadata.shared} B, "
                            f"{grid} CTAs x {iters} iters; {ms:.3f} ms")


def bench_dot_exp_overlap(r: Runner, K):
    """Whether tensor-core and exp2 work overlap on an SM: time per iteration of a
    product alone, exp2 alone, both in the same warps, and both from different CTAs
    on the same SM (SPLIT, twice the CTAs so each SM gets the same work as 'both').
    Overlap would make 'both' close to max(dot, exp); none makes it their sum."""
    torch = r.torch
    for bm, bn, bk, warps in ((64, 64, 128, 4), (128, 64, 128, 8), (64, 128, 64, 4)):
        a = (torch.randn(bm, bk, device="cuda") * 0.1).to(torch.bfloat16)
        b = (torch.randn(bk, bn, device="cuda") * 0.1).to(torch.bfloat16)
        iters = 2048 if not r.args.quick else 256
        per_sm = 2
        modes = {"dot": (1, 0, 0, 0), "exp": (0, 1, 0, 0), "both": (1, 1, 0, 0), "split": (1, 1, 1, 0),
                 "fma": (0, 1, 0, 1), "split_fma": (1, 1, 1, 1)}
        for mode, (dot, ex, split, fma) in modes.items():
            grid = r.sms * per_sm * (2 if split else 1)
            c = torch.empty(grid * bm * bn, device="cuda", dtype=torch.float32)

            def fn():
                K["dot_exp_mix"][(grid,)](a, b, c, iters, r.sms, BM=bm, BN=bn, BK=bk, DOT=dot, EXP=ex,
                                          SPLIT=split, FMA=fma, num_warps=warps, num_stages=1)

            fn()
            torch.cuda.synchronize()
            with r.sampler() as s:
                ms = r.event_loop(fn, n=7)
            # wall time per iteration: every SM runs per_sm CTAs (x2 when split) at once
            r.add("dot_exp_overlap", f"{bm}x{bn}x{bk}_w{warps}_{mode}", ms * 1e3 / iters, "us/iter",
                  s.mhz, detail=f"{grid} CTAs ({per_sm} per SM{', x2: half dot, half exp' if split else ''}) "
                               f"x {iters} iters; {ms:.3f} ms")


# (narrow BN1, wide BN2, narrow products per wide one, CTAs of each kind per
# SM) at BM = 64, BK = 64, 4 warps. SS 64x16x64 reads 10 KB of SMEM per 0.13
# MFLOP (SMEM-bound: the wgmma_shape rows); SS 64x256x64 reads 40 KB per 2.1
# MFLOP and SS 64x128x64 24 KB per 1 MFLOP (tensor-bound). With 6 (3) narrow
# products per wide one, the narrow CTAs' SMEM time about equals the wide
# ones' tensor time, so a starved wgmma that holds the pipe makes the mix take
# their sum, independent tensor and SMEM queues 15-20% less. Residency: the
# kernel holds both branches' operands (40 KB) and the 64x256 accumulator
# takes 154 registers a thread, so that pair runs one CTA of each kind per SM.
DOT_PAIRS = ((16, 256, 6, 1), (16, 128, 3, 2))


def bench_dot_pair(r: Runner, K):
    """A narrow (SMEM-bound) and a wide (tensor-bound) wgmma product in different
    CTAs of one SM: time of each alone and of the two together (split), per
    round of `iters2` wide products. Rows `dot_pair`; tests/test_wgmma_operands.py
    replays them in the engine."""
    torch = r.torch
    bm, bk, warps = 64, 64, 4
    for bn1, bn2, ratio, per_sm in DOT_PAIRS:
        a = (torch.randn(bm, bk, device="cuda") * 0.1).to(torch.bfloat16)
        b1 = (torch.randn(bk, bn1, device="cuda") * 0.1).to(torch.bfloat16)
        b2 = (torch.randn(bk, bn2, device="cuda") * 0.1).to(torch.bfloat16)
        iters2 = 1024 if not r.args.quick else 128
        iters1 = iters2 * ratio
        for mode, name in ((1, "narrow"), (2, "wide"), (3, "split")):
            grid = r.sms * per_sm * (2 if mode == 3 else 1)
            c = torch.empty(grid, device="cuda", dtype=torch.float32)

            def fn():
                return K["dot_pair"][(grid,)](a, b1, b2, c, iters1, iters2, r.sms, BM=bm, BK=bk,
                                              BN1=bn1, BN2=bn2, MODE=mode, num_warps=warps,
                                              num_stages=1)

            compiled = fn()
            torch.cuda.synchronize()
            with r.sampler() as s:
                ms = r.event_loop(fn, n=7)
            r.add("dot_pair", f"{bm}x{bn1}x{bk}_{bm}x{bn2}x{bk}_r{ratio}_w{warps}_x{per_sm}_{name}",
                  ms * 1e3, "us", s.mhz,
                  detail=f"{grid} CTAs ({per_sm} per SM{', x2: half narrow, half wide' if mode == 3 else ''}); "
                         f"narrow {iters1} iters, wide {iters2}; smem {compiled.metadata.shared} B; "
                         f"{ms:.3f} ms")


# (BM, BN, D, warps): flash-attention step shapes (block_m, block_n, head dim).
DOT_CHAINS = ((64, 32, 128, 4), (64, 64, 128, 4), (128, 64, 128, 8), (128, 64, 128, 4),
              (64, 64, 64, 4), (128, 64, 64, 8))
# Held out (rows `dot_chain_wide`, which no profile number is reduced from):
# steps 128 keys wide, whose fa2 configs the model takes 5-8% faster than
# their 64-wide twins against the measured sweep (validation_notes.md, session
# 33); 128x128 at D = 128 only with 8 warps (4 would spill).
WIDE_DOT_CHAINS = ((64, 128, 64, 4), (64, 128, 128, 4), (128, 128, 64, 4), (128, 128, 64, 8),
                   (128, 128, 128, 8))
# ... and the other step shapes of fa2's config grid (block_m 64/128, block_n
# 32/64/128, 4/8 warps, D 64/128; rows `dot_chain_more`), but 128x128 with 4
# warps at D = 128, which spills: with the two lists above, every one the
# validation sweep runs (session 33)
MORE_DOT_CHAINS = ((64, 32, 64, 4), (64, 32, 64, 8), (64, 32, 128, 8), (64, 64, 64, 8), (64, 64, 128, 8),
                   (64, 128, 64, 8), (64, 128, 128, 8), (128, 32, 64, 4), (128, 32, 64, 8), (128, 32, 128, 4),
                   (128, 32, 128, 8), (128, 64, 64, 4))


def bench_dot_chain(r: Runner, K, shapes=None, bench: str = "dot_chain"):
    """Time per iteration of the dependent chain S = A·B -> exp2, row max ->
    acc += P·V with 1, 2 and 4 CTAs per SM (rows `bench`). With one CTA an
    iteration costs the chain's round trip; with more, the SM's throughput.
    shapes: (BM, BN, D, warps), DOT_CHAINS unless given."""
    torch = r.torch
    for bm, bn, d, warps in shapes or DOT_CHAINS:
        a = (torch.randn(bm, d, device="cuda") * 0.1).to(torch.bfloat16)
        b = (torch.randn(d, bn, device="cuda") * 0.1).to(torch.bfloat16)
        v = (torch.randn(bn, d, device="cuda") * 0.1).to(torch.bfloat16)
        iters = 2048 if not r.args.quick else 256
        for per_sm in (1, 2, 4):
            grid = r.sms * per_sm
            c = torch.empty(grid, device="cuda", dtype=torch.float32)
            clk = torch.zeros(grid * 4, device="cuda", dtype=torch.int64)

            def fn():
                return K["dot_chain"][(grid,)](a, b, v, c, iters, clk, clk, 0, BM=bm, BN=bn, BK=d, D=d,
                                               CLOCKED=True, num_warps=warps, num_stages=1)

            compiled = fn()
            torch.cuda.synchronize()
            with r.sampler() as s:
                ms = r.event_loop(fn, n=7)
            kmhz, cta_cycles = stamped_clock(clk)
            r.add(bench, f"{bm}x{bn}x{d}_w{warps}_x{per_sm}", ms * 1e3 / iters, "us/iter", s.mhz, kmhz,
                  detail=f"{grid} CTAs ({per_sm} per SM, if registers allow: "
                         f"{getattr(compiled, 'n_regs', '?')} a thread) x {iters} iters; "
                         f"smem {compiled.metadata.shared} B; {ms:.3f} ms; flops/iter/CTA {4 * bm * bn * d}; "
                         f"kernel clock: clock64 over the global timer in each CTA of the last launch, median")
            r.add(f"{bench}_cta_cycles", f"{bm}x{bn}x{d}_w{warps}_x{per_sm}", cta_cycles / iters,
                  "clk/iter", s.mhz, kmhz,
                  detail="a CTA's clock64 from its start to its end over its iterations (median CTA of "
                         "the last launch): cycles on the SM that ran it, whatever its clock")


# The dot_chain shapes with two warpgroups: where the engine and the GPU part
# (tests/test_dot_chain.py's held-out rows)
PHASE_CHAINS = ((128, 64, 128, 8), (128, 64, 64, 8))
PHASE_STEPS = 16


def bench_dot_chain_phase(r: Runner, K):
    """In which order does an SM's tensor pipe serve two warpgroups' products
    issued together? dot_chain with PHASE_STEPS stamps every row's clock64
    once its S is in, for PHASE_STEPS steps in the middle of the run, one
    8-warp CTA an SM.
    Rows `dot_chain_phase`: the median over CTAs and steps of warpgroup 1's
    stamp less warpgroup 0's (each the median of its 64 rows), in cycles;
    the detail gives the step's period, the spread, and how often each
    warpgroup's S came first. The raw stamps go to dot_chain_phase.csv."""
    import numpy as np

    torch = r.torch
    raw = []
    for bm, bn, d, warps in PHASE_CHAINS:
        a = (torch.randn(bm, d, device="cuda") * 0.1).to(torch.bfloat16)
        b = (torch.randn(d, bn, device="cuda") * 0.1).to(torch.bfloat16)
        v = (torch.randn(bn, d, device="cuda") * 0.1).to(torch.bfloat16)
        iters = 2048 if not r.args.quick else 256
        first = iters // 2
        grid = r.sms
        c = torch.empty(grid, device="cuda", dtype=torch.float32)
        stamps = torch.zeros(grid * (PHASE_STEPS + 1) * bm, device="cuda", dtype=torch.int64)

        def fn():
            return K["dot_chain"][(grid,)](a, b, v, c, iters, stamps, stamps, first, BM=bm, BN=bn, BK=d, D=d,
                                           PHASE_STEPS=PHASE_STEPS, num_warps=warps, num_stages=1)

        compiled = fn()
        torch.cuda.synchronize()
        with r.sampler() as smp:
            ms = r.event_loop(fn, n=5)
        t = stamps.cpu().numpy().reshape(grid, PHASE_STEPS + 1, bm)[:, :PHASE_STEPS].astype(np.float64)
        half = bm // 2
        wg0, wg1 = np.median(t[:, :, :half], axis=2), np.median(t[:, :, half:], axis=2)   # [cta, step]
        offset = wg1 - wg0
        period = np.diff(wg0, axis=1)
        spread = np.max(t[:, :, :half], axis=2) - np.min(t[:, :, :half], axis=2)
        shape = f"{bm}x{bn}x{d}_w{warps}_x1"
        r.add("dot_chain_phase", shape, float(np.median(offset)), "clk", smp.mhz,
              detail=f"{grid} CTAs (one an SM) x {iters} steps, stamps at steps {first}-{first + PHASE_STEPS - 1}: "
                     f"warpgroup 1's S in less warpgroup 0's, median {np.median(offset):.0f} clk, "
                     f"p10 {np.percentile(offset, 10):.0f}, p90 {np.percentile(offset, 90):.0f}; |offset| median "
                     f"{np.median(np.abs(offset)):.0f}; warpgroup 0 first in {np.mean(offset > 0):.0%} of steps, "
                     f"together (within 16 clk) in {np.mean(np.abs(offset) <= 16):.0%}; step period median "
                     f"{np.median(period):.0f} clk; rows of one warpgroup within {np.median(spread):.0f} clk "
                     f"(median); {getattr(compiled, 'n_regs', '?')} registers a thread, smem "
                     f"{compiled.metadata.shared} B; {ms:.3f} ms a launch ({ms * 1e3 / iters:.3f} us a step)")
        for cta in range(grid):
            for k in range(PHASE_STEPS):
                raw.append({"shape": shape, "cta": cta, "step": first + k, "wg0_clk": int(wg0[cta, k]),
                            "wg1_clk": int(wg1[cta, k])})
    os.makedirs(r.args.out_dir, exist_ok=True)
    write_csv_atomic(os.path.join(r.args.out_dir, "dot_chain_phase.csv"), raw,
                     ["shape", "cta", "step", "wg0_clk", "wg1_clk"])


def cta_clock_runs(torch, fn, clk, launches: int) -> list[float]:
    """fn once to compile and warm, then `launches` more times: after each,
    the median over CTAs of the clock64 count each wrote into clk."""
    import numpy as np
    fn()
    torch.cuda.synchronize()
    runs = []
    for _ in range(launches):
        fn()
        torch.cuda.synchronize()
        runs.append(float(np.median(clk.cpu().numpy())))
    return runs


def stamped_clock(clk) -> tuple[float, float]:
    """(MHz, cycles) from CLK of clock_stamp: per CTA [clock64, timer ns] at its
    start and end; the medians over CTAs of cycles per ns (x 1000) and of
    cycles from start to end."""
    import numpy as np
    a = clk.cpu().numpy().reshape(-1, 4).astype(np.float64)
    cycles, ns = a[:, 2] - a[:, 0], a[:, 3] - a[:, 1]
    good = (ns > 0) & (cycles > 0)
    if not good.any():
        return float("nan"), float("nan")
    return float(np.median(cycles[good] / ns[good]) * 1e3), float(np.median(cycles[good]))


def _clock_of(clk):
    """SM clock (MHz) from per-block (clock64 cycles, globaltimer ns) pairs
    (stamp's; of stamp_span's buffer, pass its first half)."""
    import numpy as np
    a = np.asarray(clk).reshape(-1, 2).astype(np.float64)
    cyc, ns = a[:, 0], a[:, 1]
    good = ns > 0
    return float(np.median(cyc[good] / ns[good]) * 1e3), float(np.median(cyc[good]))


def spanned_rate(clk, work_per_block: float) -> tuple[float, int]:
    """Work a clock an SM, each SM by its own clock64 (stamp_span's buffer):
    its blocks' work over the cycles from its first block's start to its
    last one's end, whatever the clock ran at and however many blocks it
    held at once; the median over SMs, and how many SMs."""
    import numpy as np
    cycles_ns, start_sm = np.asarray(clk).reshape(2, -1)
    cycles = cycles_ns.reshape(-1, 2)[:, 0].astype(np.float64)
    start, sm = start_sm.reshape(-1, 2).T.astype(np.float64)
    rates = []
    for s in np.unique(sm):
        mine = sm == s
        span = float(np.max(start[mine] + cycles[mine]) - np.min(start[mine]))
        if span > 0:
            rates.append(work_per_block * int(mine.sum()) / span)
    return (float(np.median(rates)), len(rates)) if rates else (float("nan"), 0)


def bench_cuda(r: Runner, mod):
    import cupy
    import numpy as np

    sms = r.sms
    grid, threads = sms * 8, 256

    def run(name, iters, extra=(), n=5):
        k = mod.get_function(name)
        out = cupy.empty(grid * threads, dtype=cupy.float32)
        clk = cupy.zeros(4 * grid, dtype=cupy.uint64)   # (stamp_span's; stamp fills the first half)
        args = (out, np.int32(iters)) + tuple(extra) + (clk,)
        k((grid,), (threads,), args)
        cupy.cuda.Device().synchronize()
        times = []
        with r.sampler() as s:
            for _ in range(n):
                st, en = cupy.cuda.Event(), cupy.cuda.Event()
                st.record()
                k((grid,), (threads,), args)
                en.record()
                en.synchronize()
                times.append(cupy.cuda.get_elapsed_time(st, en))
        ms = statistics.median(times)
        raw = clk.get()
        kmhz, cycles = _clock_of(raw[:2 * grid])
        return ms, kmhz, cycles, s.mhz, raw

    def spanned(bench, per_block, unit, nv, kmhz, raw):
        # the same launch's rate a clock by each SM's own cycles (spanned_rate)
        v, n = spanned_rate(raw, per_block)
        r.add(bench, "per_clk_per_sm_spanned", v, unit, nv, kmhz,
              detail=f"each SM's blocks' work / its clock64 cycles from its first block's start to "
                     f"its last one's end (no timer), median over {n} SMs")

    # exp2 (MUFU)
    iters = 4096
    ms, kmhz, cyc, nv, raw = run("ex2_loop", iters)
    total = grid * threads * iters * 8.0
    r.add("exp2_cuda", "ex2.approx.ftz.f32 /s", total / (ms * 1e-3), "1/s", nv, kmhz,
          detail=f"{grid}x{threads} threads x {iters} x 8 chains; {ms:.3f} ms")
    per_clk = total / (ms * 1e-3) / (sms * kmhz * 1e6)
    r.add("exp2_cuda", "per_clk_per_sm", per_clk, "1/clk/SM", nv, kmhz,
          detail="rate / (SMs x SM clock read in-kernel: clock64 / globaltimer)")
    spanned("exp2_cuda", total / grid, "1/clk/SM", nv, kmhz, raw)
    # FFMA
    ms, kmhz, cyc, nv, raw = run("ffma_loop", iters, (np.float32(0.999), np.float32(0.001)))
    total = grid * threads * iters * 8.0
    r.add("ffma_cuda", "per_clk_per_sm", total / (ms * 1e-3) / (sms * kmhz * 1e6), "FMA/clk/SM", nv,
          kmhz, detail=f"{total / (ms * 1e-3) / 1e12:.2f} T FMA/s; 8 independent chains")
    spanned("ffma_cuda", total / grid, "FMA/clk/SM", nv, kmhz, raw)
    # SMEM
    iters = 2048
    ms, kmhz, cyc, nv, raw = run("smem_read", iters)
    total = grid * threads * iters * 8 * 16.0
    r.add("smem_read_cuda", "per_clk_per_sm", total / (ms * 1e-3) / (sms * kmhz * 1e6), "B/clk/SM",
          nv, kmhz, detail=f"ld.shared.v4 conflict-free; {total / (ms * 1e-3) / 1e12:.1f} TB/s total")
    spanned("smem_read_cuda", total / grid, "B/clk/SM", nv, kmhz, raw)
    # mma.sync
    for name, dt, flop_per in (("mma_bf16", "bf16", 2 * 16 * 8 * 16), ("mma_f16", "fp16", 2 * 16 * 8 * 16),
                               ("mma_e4m3", "fp8", 2 * 16 * 8 * 32)):
        try:
            iters = 4096
            ms, kmhz, cyc, nv, _ = run(name, iters)
            warps = grid * threads // 32
            flops = warps * iters * 8.0 * flop_per
            r.add("tensor_mma_sync_cuda", dt, flops / (ms * 1e-3) / 1e12, "TFLOP/s", nv, kmhz,
                  detail=f"mma.sync m16n8k{flop_per // 256}, 8 independent accumulators/warp, "
                         f"{grid}x{threads}; {ms:.2f} ms")
        except Exception as e:
            r.add("tensor_mma_sync_cuda", dt, "nan", "TFLOP/s", detail=f"failed: {str(e)[:200]}")


def _chase_chain(torch, ws_bytes: int, seed: int):
    """A random cycle through the 128 B lines of a ws_bytes buffer for
    chase_plain: element 32·i holds the index of the next line's element.
    Returns (buffer, start index, lines)."""
    lines = ws_bytes // 128
    g = torch.Generator(device="cuda")
    g.manual_seed(seed)
    perm = torch.randperm(lines, device="cuda", generator=g).to(torch.int64)
    arr = torch.zeros(lines * 32, dtype=torch.int32, device="cuda")
    arr[perm * 32] = (torch.roll(perm, -1) * 32).to(torch.int32)
    return arr, int(perm[0].item()) * 32, lines


def _as_cupy_u32(arr):
    """A chain from _chase_chain as the uint32 CuPy array the CUDA chases take
    (a view of the torch buffer, which it keeps alive)."""
    import cupy
    ptr = cupy.cuda.MemoryPointer(cupy.cuda.UnownedMemory(arr.data_ptr(), arr.numel() * 4, arr), 0)
    return cupy.ndarray((arr.numel(),), dtype=cupy.uint32, memptr=ptr)


def bench_latency(r: Runner, mod):
    import cupy
    import numpy as np
    torch = r.torch

    out = cupy.zeros(2, dtype=cupy.uint64)
    steps = 4096
    rng = np.random.default_rng(7)
    for regime, ws in (("l2", 4 << 20), ("dram", 1 << 30)):
        arr, start, lines = _chase_chain(torch, ws, 1 if regime == "l2" else 2)
        carr = _as_cupy_u32(arr)
        warm = lines if regime == "l2" else 64  # l2: touch every line first; dram: only a few
        res = {}
        for kind in ("plain", "tma"):
            try:
                k = mod.get_function(f"chase_{kind}")
                vals = []
                with r.sampler() as s:
                    for rep in range(3):
                        # dram: every (kind, repetition) starts at its own random line, so no
                        # chase walks lines an earlier one left in L2
                        st = start if regime == "l2" else int(rng.integers(lines)) * 32
                        k((1,), (32,), (carr, np.int32(warm), np.int32(steps), np.uint32(st), out))
                        cupy.cuda.Device().synchronize()
                        vals.append(int(out[0].get()) / steps)
                res[kind] = statistics.median(vals)
                r.add("latency", f"{kind}_{regime}", res[kind], "cycles", s.mhz,
                      detail=f"1-thread pointer chase over {ws >> 20} MB of 128 B lines, random order, "
                             f"{steps} steps, clock64; " +
                             ("ld.global.cg" if kind == "plain" else
                              "cp.async.bulk 16 B -> SMEM + mbarrier expect_tx/try_wait") +
                             f"; reps {', '.join(f'{v:.0f}' for v in vals)}")
            except Exception as e:
                r.add("latency", f"{kind}_{regime}", "nan", "cycles", detail=f"failed: {str(e)[:200]}")
        if "plain" in res and "tma" in res:
            r.add("latency", f"tma_extra_{regime}", res["tma"] - res["plain"], "cycles",
                  detail="TMA chase minus plain chase, same chain")
        del arr


def bench_latency_per_sm(r: Runner, mod):
    """chase_plain's L2 latency from each SM (rows `latency_per_sm`,
    param sm_<id>): one block an SM, all at once, each chasing its own
    stretch of one random cycle through a 4 MB L2-resident set (ld.global.cg),
    the second of two launches timed (the first leaves the set in L2). A
    single thread's chase puts next to no load on L2. Do SMs differ? (CTAs
    that stay in lock-step collide at L2 every step; on the H100 they drift
    apart: fa2_stamps.py lone, session 28.)"""
    import cupy
    import numpy as np
    torch = r.torch
    steps = 2048
    arr, start, lines = _chase_chain(torch, 4 << 20, 1)
    # the chain's order: walk it once on the host to space the blocks' starts along it
    nxt = arr.view(-1, 32)[:, 0].cpu().numpy() // 32
    order = np.empty(lines, dtype=np.int64)
    j = start // 32
    for k in range(lines):
        order[k] = j
        j = nxt[j]
    blocks = r.sms
    starts = cupy.asarray((order[np.arange(blocks) * (lines // blocks)] * 32).astype(np.uint32))
    carr = _as_cupy_u32(arr)
    out = cupy.zeros(3 * blocks, dtype=cupy.uint64)
    k = mod.get_function("chase_per_sm")
    per_sm: dict = {}
    with r.sampler() as s:
        for rep in range(4):
            k((blocks,), (32,), (carr, np.int32(steps), starts, out))
            cupy.cuda.Device().synchronize()
            if rep == 0:
                continue        # (the set enters L2)
            got = out.get().reshape(blocks, 3)
            for cycles, sm, _ in got:
                per_sm.setdefault(int(sm), []).append(int(cycles) / steps)
    for sm in sorted(per_sm):
        vals = per_sm[sm]
        r.add("latency_per_sm", f"sm_{sm}", statistics.median(vals), "cycles", s.mhz,
              detail=f"1-thread pointer chase, {steps} steps over a 4 MB L2-resident set (ld.global.cg), "
                     f"{blocks} blocks at once; median of {len(vals)} blocks/launches: "
                     + ", ".join(f"{v:.0f}" for v in vals))
    del arr


# Background readers for loaded_latency: CTAs of 8 warps streaming ld.global.cg
# (0 = the chase alone, 528 = 4 an SM: every SM reading as hard as it can)
LOADED_BACKGROUND_CTAS = (0, 16, 33, 66, 132, 264, 528)


def bench_loaded_latency(r: Runner, K, mod):
    """The pointer chase of `latency` (one thread, ld.global.cg, random 128 B
    lines) timed while other CTAs stream reads: from HBM (a 2 GB buffer; the
    chase over 1 GB, so both miss L2) and from L2 (a 16 MB buffer; the chase
    over 4 MB, both L2-resident). Rows `loaded_latency`: the chase's cycles a
    step beside the background's own bandwidth, for LOADED_BACKGROUND_CTAS
    readers. The model's HBM and L2 are bandwidth shared among requests plus
    a fixed latency; this tells how much later a load lands when the memory
    is busy than that sharing alone makes it (a 128 B chase step takes no
    bandwidth to speak of)."""
    import cupy
    import numpy as np
    torch = r.torch
    chase = mod.get_function("chase_plain")
    BLOCK, UNROLL = 2048, 4
    out = cupy.zeros(2, dtype=cupy.uint64)
    steps = 2048 if not r.args.quick else 256
    rng = np.random.default_rng(11)
    bg_stream, chase_stream = torch.cuda.Stream(), torch.cuda.Stream()
    for regime, ws_chase, ws_bg in (("dram", 1 << 30, 2 << 30), ("l2", 4 << 20, 16 << 20)):
        arr, start, lines = _chase_chain(torch, ws_chase, 3 if regime == "dram" else 4)
        carr = _as_cupy_u32(arr)
        big = torch.randn(ws_bg // 4, device="cuda", dtype=torch.float32)
        nblocks = ws_bg // (BLOCK * 4)
        warm = lines if regime == "l2" else 64
        for ctas in LOADED_BACKGROUND_CTAS:
            part = torch.empty(max(ctas, 1) * BLOCK, device="cuda", dtype=torch.float32)
            # enough background to outlast the chase several times over, even slowed
            per_launch = (24 << 30) if regime == "dram" else (96 << 30)
            iters = max(1, per_launch // (max(ctas, 1) * UNROLL * BLOCK * 4))
            vals, bws, margins = [], [], []
            with r.sampler() as smp:
                for rep in range(3):
                    torch.cuda.synchronize()
                    if ctas:
                        t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                        with torch.cuda.stream(bg_stream):
                            t0.record()
                            K["l2_read"][(ctas,)](big, part, nblocks, iters, BLOCK=BLOCK, UNROLL=UNROLL,
                                                  num_warps=8)
                            t1.record()
                        time.sleep(0.002)   # the readers in full swing before the chase starts
                    st = start if regime == "l2" else int(rng.integers(lines)) * 32
                    done = torch.cuda.Event(enable_timing=True)
                    with cupy.cuda.ExternalStream(chase_stream.cuda_stream):
                        chase((1,), (32,), (carr, np.int32(warm), np.int32(steps), np.uint32(st), out))
                    done.record(chase_stream)
                    torch.cuda.synchronize()
                    vals.append(int(out[0].get()) / steps)
                    if ctas:
                        bws.append(iters * ctas * UNROLL * BLOCK * 4 / (t0.elapsed_time(t1) * 1e-3) / 1e9)
                        # > 0: the chase ended while the readers still ran (it was loaded throughout)
                        margins.append(done.elapsed_time(t1))
            bw = statistics.median(bws) if bws else 0.0
            overlap = (f"; the chase ended {min(margins):.1f}-{max(margins):.1f} ms before the readers"
                       if margins else "")
            r.add("loaded_latency", f"{regime}_{ctas}ctas", statistics.median(vals), "cycles", smp.mhz,
                  detail=f"1-thread chase over {ws_chase >> 20} MB ({steps} steps, clock64) while {ctas} CTAs "
                         f"of 8 warps re-read {ws_bg >> 20} MB (ld.global.cg) at {bw:.0f} GB/s; "
                         f"reps {', '.join(f'{v:.0f}' for v in vals)}{overlap}")
        del arr, big


# latency_clock: the tl.dot loop on every SM for this long before the chase, so
# the power cap has lowered the clock (1650 MHz sustained, clock_power_h100.csv)
LATENCY_CLOCK_HEAT_S = 0.3
# ... on all SMs but these, left free for the chase (a tl.dot CTA may hold all of an SM's registers)
LATENCY_CLOCK_FREE_SMS = 4


def bench_latency_clock(r: Runner, K, mod):
    """Does a load's latency follow the SM clock? The pointer chase of
    `latency` (one thread, ld.global.cg), from L2 and from HBM, timed two
    ways: in cycles (clock64) and in ns (CUDA events around it), alone (the
    top clock) and while a tl.dot loop runs on every SM and the power cap
    holds the clock down. Rows `latency_clock`: cycles and ns a step, NVML's
    clock read right before and after the chases (clock_mhz_nvml), and the
    clock cycles over ns imply. A latency fixed in ns (memory-side) takes fewer cycles
    at the lower clock; one fixed in cycles (SM-side) takes more ns. The
    profiles keep latencies in cycles, measured at the top clock, and the
    engine turns them into time at the profile's clock (1816 MHz), which is
    right only for the SM-side part."""
    import cupy
    import numpy as np
    torch = r.torch
    chase = mod.get_function("chase_plain")
    out = cupy.zeros(2, dtype=cupy.uint64)
    steps = 4096
    rng = np.random.default_rng(13)
    bm, bn, bk = DOT_SHAPES["bf16"]
    a = (torch.randn(bm, bk, device="cuda") * 0.1).to(torch.bfloat16)
    b = (torch.randn(bk, bn, device="cuda") * 0.1).to(torch.bfloat16)
    c = torch.empty(r.sms * bm * bn, device="cuda", dtype=torch.float32)
    clk = torch.zeros(r.sms * 4, device="cuda", dtype=torch.int64)
    # ~0.6 s of products, one CTA an SM
    heat_iters = int(0.6 / 0.57e-6)
    bg_stream, chase_stream = torch.cuda.Stream(), torch.cuda.Stream()
    for regime, ws in (("l2", 4 << 20), ("dram", 1 << 30)):
        arr, start, lines = _chase_chain(torch, ws, 5 if regime == "l2" else 6)
        carr = _as_cupy_u32(arr)
        warm = lines if regime == "l2" else 64
        for state in ("alone", "capped"):
            cycles, nss, clocks = [], [], []      # clocks: NVML's, read right before and after the chases
            with r.sampler() as smp:
                for rep in range(3):
                    torch.cuda.synchronize()
                    time.sleep(0.2)
                    if state == "capped":
                        with torch.cuda.stream(bg_stream):
                            K["dot_shape"][(r.sms - LATENCY_CLOCK_FREE_SMS,)](a, b, c, heat_iters, clk,
                                                                               BM=bm, BN=bn, BK=bk,
                                                     A_IN_REGS=False, CLOCKED=False, num_warps=DOT_WARPS,
                                                     num_stages=1)
                        time.sleep(LATENCY_CLOCK_HEAT_S)
                    # two chases back to back, short then long: the difference of their
                    # event times over the difference of their steps is ns a step, free of
                    # the launch and of the warm-up walk
                    times, counted = [], 0
                    clocks.append(r.nvml_clock())
                    for n in (steps, 3 * steps):
                        st = start if regime == "l2" else int(rng.integers(lines)) * 32
                        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                        e0.record(chase_stream)
                        with cupy.cuda.ExternalStream(chase_stream.cuda_stream):
                            chase((1,), (32,), (carr, np.int32(warm), np.int32(n), np.uint32(st), out))
                        e1.record(chase_stream)
                        e1.synchronize()
                        times.append(e0.elapsed_time(e1) * 1e6)
                        counted = int(out[0].get())
                    clocks.append(r.nvml_clock())
                    cycles.append(counted / (3 * steps))
                    nss.append((times[1] - times[0]) / (2 * steps))
                    torch.cuda.synchronize()
            cyc, ns = statistics.median(cycles), statistics.median(nss)
            at = statistics.median([x for x in clocks if x]) if any(clocks) else smp.mhz
            r.add("latency_clock", f"{regime}_{state}_cycles", cyc, "cycles", at,
                  detail=f"1-thread chase over {ws >> 20} MB, {3 * steps} steps, clock64; " +
                         ("alone" if state == "alone" else
                          f"beside a tl.dot loop on {r.sms - LATENCY_CLOCK_FREE_SMS} SMs, started "
                          f"{LATENCY_CLOCK_HEAT_S} s before") +
                         f"; reps {', '.join(f'{v:.0f}' for v in cycles)}")
            r.add("latency_clock", f"{regime}_{state}_ns", ns, "ns", at,
                  detail=f"the chase of {steps} and of {3 * steps} steps on CUDA events: their difference "
                         f"over {2 * steps} steps; implied clock {cyc / ns * 1e3:.0f} MHz; "
                         f"reps {', '.join(f'{v:.1f}' for v in nss)}")
        del arr


# cp_async: ring depths, threads a CTA, 16 B vectors a thread a tile (kernels
# cp_async_d{depth}_v{vpt}: 4-64 KB tiles; 0: the loop without copies)
CP_ASYNC_DEPTHS = (1, 2, 3, 4)
CP_ASYNC_VPT = {128: (0, 2, 4, 8, 16, 32), 256: (0, 1, 2, 4, 8, 16)}
CP_ASYNC_SET_BYTES = 4 << 20     # L2-resident (50 MB L2)
CP_ASYNC_TILES_PER_CTA = 512


def bench_cp_async(r: Runner, mod):
    """Tile copies global -> SMEM with cp.async, as Triton's fa2 and standard
    kernels pipeline their K/V tiles (CUDA kernels cp_async_d{depth}_v{vpt};
    tiles from a 4 MB L2-resident set). Rows `cp_async`: the median CTA's
    clock64 cycles a tile (its loop's iteration).
    - one CTA alone (`1cta_...`): with depth 1 a tile's whole round trip is
      exposed, so cycles against bytes give the copy's fixed cost (the
      intercept, less the loop's own skeleton: the `0KB` rows) and the rate a
      CTA fills its SMEM at (the slope): rows `cp_async_fit`. Deeper rings show
      how much of it a pipeline hides;
    - every SM busy (`{1,2}x132cta_...`): the same copies when all SMs share
      the L2, and the launch's aggregate rate (detail)."""
    import cupy
    import numpy as np

    src = cupy.random.random(CP_ASYNC_SET_BYTES // 4, dtype=cupy.float32)
    smem_max = int(r.props.shared_memory_per_block_optin)
    tiles = CP_ASYNC_TILES_PER_CTA if not r.args.quick else 64

    def launch(depth, grid, threads, vpt, reps=3):
        k = mod.get_function(f"cp_async_d{depth}_v{vpt}")
        tile_bytes = vpt * threads * 16
        smem = max(depth * tile_bytes, 16 * threads)
        k.max_dynamic_shared_size_bytes = smem
        set_tiles = CP_ASYNC_SET_BYTES // tile_bytes if tile_bytes else 1
        out = cupy.empty(grid * threads, dtype=cupy.float32)
        clk = cupy.zeros(2 * grid, dtype=cupy.uint64)
        args = (src, np.int32(set_tiles), np.int32(tiles), out, clk)
        k((grid,), (threads,), args, shared_mem=smem)     # warm: the set into L2
        cupy.cuda.Device().synchronize()
        cycles, mhz, spans = [], [], []
        for _ in range(reps):
            k((grid,), (threads,), args, shared_mem=smem)
            cupy.cuda.Device().synchronize()
            c = clk.get()
            kmhz, cyc = _clock_of(c)
            cycles.append(cyc / tiles)
            mhz.append(kmhz)
            spans.append(float(c.reshape(-1, 2)[:, 1].max()))
        i = int(np.argsort(cycles)[len(cycles) // 2])
        return cycles[i], mhz[i], spans[i], cycles

    depth1: dict = {}
    with r.sampler() as s:
        for threads, vpts in CP_ASYNC_VPT.items():
            for depth in CP_ASYNC_DEPTHS:
                for vpt in vpts:
                    nbytes = vpt * threads * 16
                    if depth * nbytes > smem_max:
                        continue
                    cyc, kmhz, _, reps = launch(depth, 1, threads, vpt)
                    if depth == 1:
                        depth1.setdefault(threads, []).append((nbytes, cyc))
                    rate = f"{nbytes / cyc:.1f} B/clk" if nbytes else "no copies: the loop's waits, barriers and read"
                    r.add("cp_async", f"1cta_{threads}t_{nbytes // 1024}KB_d{depth}", cyc, "clk/tile", s.mhz, kmhz,
                          detail=f"one CTA of {threads} threads alone, {nbytes // 1024} KB tiles by cp.async.cg 16 B "
                                 f"({vpt} a thread), ring depth {depth}, {tiles} tiles, clock64: {rate}; "
                                 f"reps {', '.join(f'{v:.0f}' for v in reps)}")
        threads, vpt = 256, 8       # 32 KB tiles
        for per_sm in (1, 2):
            for depth in CP_ASYNC_DEPTHS:
                nbytes = vpt * threads * 16
                if per_sm * (depth * nbytes + 1024) > int(r.props.shared_memory_per_multiprocessor):
                    continue
                grid = r.sms * per_sm
                cyc, kmhz, span_ns, reps = launch(depth, grid, threads, vpt)
                rate = grid * tiles * nbytes / (span_ns * 1e-9) / 1e9
                r.add("cp_async", f"{per_sm}x{r.sms}cta_{threads}t_{nbytes // 1024}KB_d{depth}", cyc, "clk/tile",
                      s.mhz, kmhz,
                      detail=f"{grid} CTAs of {threads} threads ({per_sm} an SM), {nbytes // 1024} KB tiles by "
                             f"cp.async.cg 16 B, ring depth {depth}, {tiles} tiles each: {nbytes / cyc:.1f} B/clk "
                             f"a CTA, {rate:.0f} GB/s in all (the slowest CTA's span); "
                             f"reps {', '.join(f'{v:.0f}' for v in reps)}")
    for threads, pts in depth1.items():
        skeleton = next((c for b, c in pts if b == 0), None)
        pts = [(b, c) for b, c in pts if b]
        if len(pts) < 2 or skeleton is None:
            continue
        xs, ys = [p[0] for p in pts], [p[1] for p in pts]
        mx, my = statistics.fmean(xs), statistics.fmean(ys)
        slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
        intercept = my - slope * mx
        pts_s = ", ".join(f"{x // 1024} KB {y:.0f}" for x, y in pts)
        r.add("cp_async_fit", f"1cta_{threads}t_latency", intercept - skeleton, "cycles",
              detail=f"depth-1 cycles a tile = skeleton + latency + bytes / rate, least squares over {pts_s}: "
                     f"intercept {intercept:.0f} less the loop's skeleton without copies {skeleton:.0f}")
        r.add("cp_async_fit", f"1cta_{threads}t_rate", 1.0 / slope, "B/clk",
              detail=f"the same fit's slope: one CTA of {threads} threads ({threads // 32} warps) fills its SMEM "
                     f"from L2 at {1.0 / slope:.1f} B/clk ({pts_s})")
    del src


CTA_CYCLE_TILES = (0, 16384, 32768)   # bytes per CTA: none, a 128x64 and a 128x128 bf16 tile
CTA_CYCLE_PER_SM = (1, 2, 4)
CTA_CYCLE_THREADS = 256
CTA_CYCLE_ROUNDS = (8, 40)


def bench_cta_cycle(r: Runner, mod):
    """Time of one round of CTAs per SM that each copy a tile in and out through
    SMEM (rows `cta_cycle`): the slope between launches of 8 and 40 rounds, so
    the kernel's launch and ramp cancel. 1, 2 and 4 CTAs per SM, set by the
    launch's dynamic SMEM. With no bytes it is the SM's cost of starting and
    retiring a CTA; with a tile, what a load and a store round trip add."""
    import cupy
    import numpy as np

    k = mod.get_function("cta_cycle")
    per_sm_smem = int(r.props.shared_memory_per_multiprocessor)
    reserved = 1024
    most = max(CTA_CYCLE_PER_SM) * max(CTA_CYCLE_ROUNDS) * r.sms * max(CTA_CYCLE_TILES)
    src = cupy.random.random(most // 4, dtype=cupy.float32)
    dst = cupy.empty_like(src)
    for nbytes in CTA_CYCLE_TILES:
        for per_sm in CTA_CYCLE_PER_SM:
            smem = per_sm_smem // per_sm - reserved
            k.max_dynamic_shared_size_bytes = smem
            times = {}
            with r.sampler() as s:
                for rounds in CTA_CYCLE_ROUNDS:
                    grid = r.sms * per_sm * rounds

                    def fn():
                        k((grid,), (CTA_CYCLE_THREADS,), (src, dst, np.int32(nbytes // 16)),
                          shared_mem=smem)

                    times[rounds] = r.event_loop(fn, n=9)
            lo, hi = CTA_CYCLE_ROUNDS
            per_round = (times[hi] - times[lo]) / (hi - lo) * 1e3
            r.add("cta_cycle", f"{nbytes}B_x{per_sm}", per_round, "us/round", s.mhz,
                  detail=f"{CTA_CYCLE_THREADS} threads, dynamic smem {smem} B ({per_sm} CTA(s) per SM); "
                         f"{lo} rounds {times[lo] * 1e3:.2f} us, {hi} rounds {times[hi] * 1e3:.2f} us; "
                         f"tile {nbytes} B read from HBM and written back per CTA")
    del src, dst


CTA_STAMP_ROUNDS = 8


def bench_cta_stamps(r: Runner, mod, out_dir: str):
    """Per-CTA timestamps of the copy at one CTA per SM (16 and 32 KB tiles), written
    to cta_stamps_h100.csv beside the calibration CSV; rows `cta_stamps` summarise,
    per round, how spread the SMs' tile arrivals are (FIFO service would spread the
    first round's arrivals over its whole transfer, shared bandwidth bunches them)."""
    import cupy
    import numpy as np

    k = mod.get_function("cta_cycle_stamped")
    smem = int(r.props.shared_memory_per_multiprocessor) - 1024
    k.max_dynamic_shared_size_bytes = smem
    grid = r.sms * CTA_STAMP_ROUNDS
    # every repetition reads and writes its own slices, beyond what L2 (50 MB) keeps
    # of the one before: a repetition's loads miss L2 (the first also misses the TLB)
    reps, words = 3, grid * max(CTA_CYCLE_TILES) // 4
    src = cupy.random.random(reps * words, dtype=cupy.float32)
    dst = cupy.empty_like(src)
    stamps = cupy.zeros(4 * grid, dtype=cupy.uint64)
    lines = ["tile_bytes,rep,cta,sm,start_ns,arrived_ns,end_ns"]
    for nbytes in CTA_CYCLE_TILES[1:]:
        for rep in range(reps):
            k((grid,), (CTA_CYCLE_THREADS,), (src[rep * words:], dst[rep * words:], np.int32(nbytes // 16),
                                             stamps), shared_mem=smem)
            cupy.cuda.Device().synchronize()
            a = stamps.get().reshape(grid, 4).astype(np.int64)
            t0 = a[:, 0].min()
            for c in range(grid):
                lines.append(f"{nbytes},{rep},{c},{a[c, 3]},{a[c, 0] - t0},{a[c, 1] - t0},{a[c, 2] - t0}")
            if rep != 1:   # summarise a warm-TLB, cold-L2 repetition
                continue
            for rnd in (0, 1, CTA_STAMP_ROUNDS - 1):
                part = a[rnd * r.sms:(rnd + 1) * r.sms]
                start, arrive = part[:, 0] - t0, part[:, 1] - part[:, 0]
                r.add("cta_stamps", f"{nbytes}B_round{rnd}", float(np.median(arrive)) / 1e3, "us",
                      detail=f"tile arrival after CTA start, median over the round's {r.sms} CTAs; "
                             f"p10 {np.percentile(arrive, 10) / 1e3:.3f} p90 {np.percentile(arrive, 90) / 1e3:.3f} us; "
                             f"CTA starts spread p10-p90 {np.percentile(start, 10) / 1e3:.3f}-"
                             f"{np.percentile(start, 90) / 1e3:.3f} us after the first")
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "cta_stamps_h100.csv"), "w") as f:
        f.write("\n".join(lines) + "\n")
    del src, dst


def bench_exp2_triton(r: Runner, K):
    torch = r.torch
    BLOCK, grid, iters = 1024, r.sms * 16, 2048
    out = torch.empty(grid * BLOCK, device="cuda", dtype=torch.float32)

    def fn():
        K["exp2_loop"][(grid,)](out, iters, BLOCK=BLOCK, num_warps=4)

    fn()
    torch.cuda.synchronize()
    with r.sampler() as s:
        ms = r.event_loop(fn, n=7)
    rate = grid * BLOCK * iters / (ms * 1e-3)
    r.add("exp2_triton", "tl.exp2 /s", rate, "1/s", s.mhz,
          detail=f"dependent chain x <- exp2(-x), {grid} CTAs x {BLOCK} x {iters}; {ms:.3f} ms "
                 f"(per clk per SM at the NVML clock: {rate / (r.sms * (s.mhz or 1) * 1e6):.2f})")


SOFTMAX_MIX_TILES = ((16, 64), (32, 64), (32, 128), (64, 64), (64, 128), (128, 64))
SOFTMAX_MIX_WARPS = 4


def bench_softmax_mix(r: Runner, K):
    """Time per loop iteration of softmax_mix (rows `softmax_mix`) with 1, 2, 4
    and 8 CTAs per SM, beside its loop's SASS: instructions a warp issues per
    iteration and how many are MUFU. With the SM saturated, SM clocks per CTA
    iteration against the issue bound (instructions x warps / 4 schedulers)
    and the MUFU bound (MUFU x 32 lanes x warps / 16 a clock)."""
    from kernels import sass

    torch = r.torch
    iters = 1024 if not r.args.quick else 128
    for (bm, bn), exp in itertools.product(SOFTMAX_MIX_TILES, (True, False)):
        x = torch.randn(bm * bn, device="cuda", dtype=torch.float32)
        counts = None
        for per_sm in (1, 2, 4, 8, 16):
            grid = r.sms * per_sm
            out = torch.empty(grid * bm, device="cuda", dtype=torch.float32)

            def fn():
                return K["softmax_mix"][(grid,)](x, out, iters, BM=bm, BN=bn, EXP=exp,
                                                 num_warps=SOFTMAX_MIX_WARPS, num_stages=1)

            compiled = fn()
            torch.cuda.synchronize()
            if counts is None:
                bodies = sass.loops(sass.cuobjdump(compiled, "-sass") or "")
                body = max(bodies, key=len) if bodies else []
                counts = (len(body), sum(sass.opcode(i) == "MUFU" for i in body))
            with r.sampler() as smp:
                ms = r.event_loop(fn, n=7)
            mhz = smp.mhz or float(r.prov["sm_clock_mhz"] or 0) or None
            instr, mufu = counts
            cycles = ms * 1e-3 / iters * (mhz or 0) * 1e6 / per_sm     # SM clocks per CTA iteration
            issue = instr * SOFTMAX_MIX_WARPS / 4
            mufu_bound = mufu * 32 * SOFTMAX_MIX_WARPS / 16
            r.add("softmax_mix", f"{bm}x{bn}_w{SOFTMAX_MIX_WARPS}{'' if exp else '_noexp'}_x{per_sm}", cycles,
                  "clk/cta-iter", mhz,
                  detail=f"{grid} CTAs ({per_sm} per SM, {getattr(compiled, 'n_regs', '?')} registers a thread) "
                         f"x {iters} iters, {ms:.3f} ms; loop: {instr} instructions a warp, {mufu} MUFU; "
                         f"issue bound {issue:.0f}, MUFU bound {mufu_bound:.0f} clk per CTA iteration")


def bench_launch(r: Runner, K, mod):
    torch = r.torch
    fn = lambda: K["empty"][(1,)]()  # noqa: E731
    fn()
    torch.cuda.synchronize()
    ms = r.do_bench(fn, warmup=25, rep=200)
    r.add("launch", "do_bench_empty_triton", ms * 1e3, "us",
          detail="triton.testing.do_bench median of an empty Triton kernel (grid 1): the fixed cost "
                 "a do_bench-timed kernel pays")
    n = 2000
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(n):
        fn()
    e.record()
    e.synchronize()
    r.add("launch", "back_to_back_eager_triton", s.elapsed_time(e) * 1e3 / n, "us",
          detail=f"{n} empty Triton launches back to back, events around all (host launch path included)")
    try:
        g = torch.cuda.CUDAGraph()
        st = torch.cuda.Stream()
        with torch.cuda.stream(st):
            for _ in range(3):
                fn()
        torch.cuda.synchronize()
        with torch.cuda.graph(g):
            for _ in range(200):
                fn()
        g.replay()
        torch.cuda.synchronize()
        times = []
        for _ in range(10):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            g.replay()
            e.record()
            e.synchronize()
            times.append(s.elapsed_time(e) * 1e3 / 200)
        r.add("launch", "back_to_back_graph_triton", statistics.median(times), "us",
              detail="CUDA graph of 200 empty Triton kernels, replay time / 200")
    except Exception as ex:
        r.add("launch", "back_to_back_graph_triton", "nan", "us", detail=f"failed: {str(ex)[:200]}")
    if mod is not None:
        import cupy
        k = mod.get_function("empty_kernel")
        for _ in range(50):
            k((1,), (32,), ())
        cupy.cuda.Device().synchronize()
        st, en = cupy.cuda.Event(), cupy.cuda.Event()
        st.record()
        for _ in range(n):
            k((1,), (32,), ())
        en.record()
        en.synchronize()
        r.add("launch", "back_to_back_eager_cupy", cupy.cuda.get_elapsed_time(st, en) * 1e3 / n, "us",
              detail=f"{n} empty CuPy RawKernel launches back to back")


def cmd_run(args) -> int:
    import torch

    from experiments import gpu_probe

    if gpu_probe.start("calibrate.py", os.path.join(args.out_dir, "calibration_h100.csv"), None) is None:
        return 2
    t_start = time.time()
    r = Runner(args)
    print(f"[calibrate] {r.prov['gpu']}, {r.sms} SMs, driver {r.prov['driver']}, clock "
          f"{r.prov['sm_clock_mhz']} MHz (max {r.prov['max_sm_clock_mhz']})", file=sys.stderr)
    K = triton_kernels()
    mod = None
    try:
        import cupy
        work = tempfile.mkdtemp()
        try:
            mod = cupy.RawModule(path=compile_cuda(work))
        except Exception as e:
            print(f"[calibrate] nvcc path failed ({e}); trying NVRTC through CuPy", file=sys.stderr)
            mod = cupy.RawModule(code=CUDA_SRC, options=("-std=c++17",))
            mod.get_function("empty_kernel")
    except Exception as e:
        print(f"[calibrate] CUDA C microkernels unavailable: {e}", file=sys.stderr)
        r.add("cuda_build", "nvcc", "nan", "", detail=f"failed: {str(e)[:300]}")
    steps = [("device", lambda: bench_device(r)), ("hbm", lambda: bench_hbm(r, K)),
             ("tile_write", lambda: bench_tile_write(r, K)),
             ("tma_setup", lambda: bench_tma_setup(r, K)),
             ("store_overlap", lambda: bench_store_overlap(r, K)),
             ("l2", lambda: bench_l2(r, K)),
             ("l2_store", lambda: bench_l2_store(r, K)),
             ("l2_round_trip", lambda: bench_l2_round_trip(r, K)),
             ("l2_duration", lambda: bench_l2_duration(r, K)),
             ("l2_shared", lambda: bench_l2_shared(r, K)),
             ("l2_ramp", lambda: bench_l2_ramp(r, K)),
             ("launch_fill", lambda: bench_launch_fill(r, K)),
             ("wgmma", lambda: [_dot_tflops(r, K, dt) for dt in ("bf16", "fp16", "fp8")]),
             ("wgmma_shapes", lambda: bench_wgmma_shapes(r, K)),
             ("dot_exp_overlap", lambda: bench_dot_exp_overlap(r, K)),
             ("dot_pair", lambda: bench_dot_pair(r, K)),
             ("dot_chain", lambda: bench_dot_chain(r, K)),
             ("dot_chain_wide", lambda: bench_dot_chain(r, K, WIDE_DOT_CHAINS, "dot_chain_wide")),
             ("dot_chain_more", lambda: bench_dot_chain(r, K, MORE_DOT_CHAINS, "dot_chain_more")),
             ("dot_chain_phase", lambda: bench_dot_chain_phase(r, K)),
             ("cuda", lambda: mod and bench_cuda(r, mod)),
             ("exp2_triton", lambda: bench_exp2_triton(r, K)),
             ("softmax_mix", lambda: bench_softmax_mix(r, K)),
             ("latency", lambda: mod and bench_latency(r, mod)),
             ("latency_per_sm", lambda: mod and bench_latency_per_sm(r, mod)),
             ("loaded_latency", lambda: mod and bench_loaded_latency(r, K, mod)),
             ("latency_clock", lambda: mod and bench_latency_clock(r, K, mod)),
             ("launch", lambda: bench_launch(r, K, mod)),
             ("cta_cycle", lambda: mod and bench_cta_cycle(r, mod)),
             ("cp_async", lambda: mod and bench_cp_async(r, mod)),
             ("cta_stamps", lambda: mod and bench_cta_stamps(r, mod, args.out_dir))]
    only = set(args.only.split(",")) if args.only else None
    for name, step in steps:
        if only and name not in only:
            continue
        t0 = time.time()
        print(f"[calibrate] {name} ...", file=sys.stderr, flush=True)
        try:
            step()
        except Exception as e:
            traceback.print_exc()
            r.add(name, "error", "nan", "", detail=f"failed: {type(e).__name__}: {str(e)[:300]}")
        torch.cuda.synchronize()
        print(f"[calibrate] {name} done in {time.time() - t0:.1f} s", file=sys.stderr, flush=True)
    os.makedirs(args.out_dir, exist_ok=True)
    csv_path = os.path.join(args.out_dir, "calibration_h100.csv")
    write_csv_atomic(csv_path, r.rows, COLUMNS)
    prof = os.path.join(args.out_dir, "h100.measured.toml")
    try:
        write_profile(r.rows, prof)
        from_profile_check(prof)
    except Exception as e:
        print(f"[calibrate] profile not written: {e}", file=sys.stderr)
    print(f"[calibrate] wrote {csv_path} and {prof} in {time.time() - t_start:.0f} s", file=sys.stderr)
    print_summary(r.rows)
    return 0


def print_summary(rows):
    print(f"{'bench':<22} {'param':<28} {'value':>12} unit")
    for row in rows:
        if row["bench"] == "device":
            continue
        print(f"{row['bench']:<22} {row['param']:<28} {row['value']:>12} {row['unit']}")


# ---------------------------------------------------------------------------
# profile: measured rows -> hw_profiles/h100.measured.toml
# ---------------------------------------------------------------------------
def _val(rows, bench, param):
    for row in rows:
        if row["bench"] == bench and row["param"] == param:
            try:
                v = float(row["value"])
            except ValueError:
                return None, row
            return (v if math.isfinite(v) else None), row
    return None, None


def l2_plateau_and_knee(rows):
    """The L2 plateau: the median bandwidth over working sets of 4-32 MB, the range of
    the K/V an attention wave keeps hot (the heads 132 CTAs cover: 4-8 MB here) and well
    inside the 50 MB. Sets of 1-2 MB read faster (11 TB/s in the first run; likely
    served by the near L2 partition), which attention's hot sets do not fit, so they
    are left out (the CSV keeps them). The knee: the smallest working set whose bandwidth
    falls below half-way between the plateau and the largest working set's (HBM)."""
    pts = []
    for row in rows:
        if row["bench"] == "l2_read_bandwidth":
            try:
                pts.append((int(row["param"].rstrip("MB")), float(row["value"])))
            except ValueError:
                pass
    pts.sort()
    if len(pts) < 3:
        return None, None, pts
    plateau = statistics.median([bw for mb, bw in pts if 4 <= mb <= 32] or [pts[0][1]])
    floor = pts[-1][1]
    mid = (plateau + floor) / 2
    knee = next((mb for mb, bw in pts if bw < mid), None)
    return plateau, knee, pts


def latency_at_clock(rows, regime: str, profile_mhz: float):
    """A load's latency in cycles at the profile's clock, from latency_clock's
    two chases (alone at the top clock, and with the power cap holding the
    clock down): cycles = c + t x f, c the part that runs on the SM's clock
    (cycles) and t the part that does not (ns: L2's and HBM's own clocks),
    solved from the two (clock, cycles) points and taken at profile_mhz.
    (cycles, how it was found, the row) or None without both rows."""
    c1, alone = _val(rows, "latency_clock", f"{regime}_alone_cycles")
    c2, capped = _val(rows, "latency_clock", f"{regime}_capped_cycles")
    try:
        f1, f2 = float(alone["clock_mhz_nvml"]), float(capped["clock_mhz_nvml"])
    except (TypeError, ValueError, KeyError):
        return None
    if c1 is None or c2 is None:
        return None
    if not (f1 > f2 > 0) or not (c1 > 0 and c2 > 0):
        return None
    t = (c1 - c2) / (f1 - f2)           # cycles a MHz: ns of the part off the SM's clock
    c = c1 - t * f1
    if t < 0 or c < 0:                  # (outside the model: keep the plain chase)
        return None
    cycles = c + t * profile_mhz
    how = (f"{c1:.0f} cycles at {f1:.0f} MHz alone and {c2:.0f} at {f2:.0f} MHz beside a tl.dot loop held "
           f"by the power cap (latency_clock): {c:.0f} cycles on the SM's clock + {t * 1e3:.0f} ns off it, "
           f"= {cycles:.0f} cycles at the profile's {profile_mhz:.0f} MHz")
    return cycles, how, capped


def chase_latency(rows, regime: str, plain: str, profile_mhz: float):
    """(cycles, how, row) of a pointer chase for the profile: latency_at_clock's
    split where the CSV has it, else `latency`'s plain chase (`plain`) as
    measured; (None, '', None) without either. `how` continues the source's text."""
    at_clock = latency_at_clock(rows, regime, profile_mhz)
    if at_clock:
        cycles, how, row = at_clock
        return cycles, f", {how}", row
    v, row = _val(rows, "latency", plain)
    return (v, f" = {v:.0f} cycles", row) if v else (None, "", None)


def tensor_alu_serial_fractions(rows):
    """{shape/kind: f} from the dot_exp_overlap rows: with product CTAs and elementwise
    CTAs sharing each SM, T_split = T_dot + f x T_elementwise (f = 0: the units overlap
    fully, 1: not at all)."""
    t = {r["param"]: float(r["value"]) for r in rows if r["bench"] == "dot_exp_overlap"}
    out = {}
    for key in t:
        if not key.endswith("_dot"):
            continue
        shape = key[: -len("_dot")]
        for kind, split in (("exp", "split"), ("fma", "split_fma")):
            alone, both = t.get(f"{shape}_{kind}"), t.get(f"{shape}_{split}")
            if alone and both:
                out[f"{shape}_{kind}"] = (both - t[key]) / alone
    return out


DOT_CHAIN_LOOPS = os.path.join(ROOT, "experiments", "results", "dot_chain_loops_sm90.csv")


def compile_dot_chain(bm: int, bn: int, d: int, warps: int):
    """The dot_chain kernel cross-compiled for sm_90 here, as bench_dot_chain launches it."""
    sig = {"A": "*bf16", "B": "*bf16", "V": "*bf16", "C": "*fp32", "iters": "i32", "CLK": "*i64",
           "STAMPS": "*i64", "first": "i32", "BM": "constexpr", "BN": "constexpr", "BK": "constexpr",
           "D": "constexpr", "CLOCKED": "constexpr", "PHASE_STEPS": "constexpr"}
    return compile_sm90(triton_kernels()["dot_chain"], sig,
                        dict(BM=bm, BN=bn, BK=d, D=d, CLOCKED=True, PHASE_STEPS=0), warps=warps, stages=1)


def compile_dot_chain_loop(bm: int, bn: int, d: int, warps: int) -> dict:
    """The dot_chain kernel's loop as ptxas compiles it for sm_90
    (compile_dot_chain): per warp and trip, the instructions it issues
    besides its wgmma ('issue'), of which MUFU ('mufu'), and the stall
    clocks ptxas scheduled ('stall_clocks'); kernels/sass.py."""
    from kernels import sass
    parts = sass.tensor_loop_parts(sass.cuobjdump(compile_dot_chain(bm, bn, d, warps), "-sass"))
    if not parts:
        raise RuntimeError(f"dot_chain {bm}x{bn}x{d} w{warps}: no tensor loop in its sm_90 SASS")
    return parts[0]


def cmd_loops(args) -> int:
    """Write DOT_CHAIN_LOOPS: the compiled loop of every dot_chain shape (CPU only)."""
    import triton
    from kernels.provenance import git_commit
    rows = []
    for bm, bn, d, warps in DOT_CHAINS + WIDE_DOT_CHAINS + MORE_DOT_CHAINS:
        loop = compile_dot_chain_loop(bm, bn, d, warps)
        rows.append({"shape": f"{bm}x{bn}x{d}", "num_warps": warps, "issue_per_iter": loop["issue"],
                     "mufu_per_iter": loop["mufu"], "stall_clocks_per_iter": loop["stall_clocks"],
                     "triton": triton.__version__, "target": "cuda:90",
                     "git_commit": git_commit(), "date": _dt.date.today().isoformat(),
                     "command": "python experiments/calibrate.py loops"})
        print(f"dot_chain {rows[-1]['shape']} w{warps}: {loop}")
    write_csv_atomic(args.out, rows, list(rows[0]))
    print(f"wrote {args.out}")
    return 0


@functools.lru_cache(maxsize=4)
def _dot_chain_loops(path: str) -> dict:
    try:
        with open(path, newline="") as f:
            rows = list(csv.DictReader(f))
        return {(r["shape"], int(r["num_warps"])): {"issue": int(r["issue_per_iter"]), "mufu": int(r["mufu_per_iter"]),
                                                    "stall_clocks": int(r["stall_clocks_per_iter"])} for r in rows}
    except (OSError, KeyError, ValueError) as e:
        raise ResultsFileError(f"{path}: not a dot_chain loop table ({type(e).__name__}: {e}); "
                               f"write it with `python experiments/calibrate.py loops`") from None


def dot_chain_loop(bm: int, bn: int, d: int, warps: int, path: str = DOT_CHAIN_LOOPS) -> dict:
    """compile_dot_chain_loop's counts for one shape, from the committed table
    (tests run Triton's interpreter, which cannot compile for sm_90)."""
    loop = _dot_chain_loops(path).get((f"{bm}x{bn}x{d}", warps))
    if loop is None:
        raise ResultsFileError(f"{path} has no dot_chain {bm}x{bn}x{d} with {warps} warps; "
                               f"write it with `python experiments/calibrate.py loops`")
    return loop


def _dot_chain_steps(rows, rates):
    """{shape_wN: (cycles a step with one CTA per SM, with the SM saturated
    (the lesser of the 2- and 4-CTA times per CTA), its products' cycles,
    its softmax's cycles)} from the dot_chain rows, the parts at the SM's
    measured rates: each product its tensor time or its SMEM operand reads,
    whichever is longer; the softmax its exp2s on the MUFU and then its
    other instructions on the issue slots, as the compiled loop has them
    (dot_chain_loop), one after the other as fa2's steps charge them
    (algorithms/fa2.step_ops). rates: per SM per clock, 'tensor' (flops),
    'exp2', 'alu' (issue slots, thread-instructions), 'smem' (bytes), and
    'operand_bytes' (HardwareProfile.wgmma_operand_bytes)."""
    timed, alone = {}, {}
    for r in rows:
        clock = row_clock(r)
        if r["bench"] == "dot_chain" and clock:
            shape, warps, ctas = r["param"].rsplit("_", 2)
            timed.setdefault((shape, warps), {})[int(ctas[1:])] = float(r["value"]) * clock   # µs x MHz
        elif r["bench"] == "dot_chain_cta_cycles" and r["param"].endswith("_x1"):
            # one CTA an SM: its own clock64 count, launch and clock aside
            shape, warps, _ = r["param"].rsplit("_", 2)
            alone[(shape, warps)] = float(r["value"])
    out = {}
    for (shape, warps), t in timed.items():
        if not {1, 2, 4} <= set(t):
            continue
        bm, bn, d = map(int, shape.split("x"))
        n_warps = int(warps[1:])

        def product(m, n, k, a_in_smem):
            return max(2 * m * n * k / rates["tensor"],
                       rates["operand_bytes"](m, n, k, 2, a_in_smem, n) / rates["smem"])

        loop = dot_chain_loop(bm, bn, d, n_warps)
        lanes = n_warps * 32
        softmax = (loop["mufu"] * lanes / rates["exp2"]
                   + (loop["issue"] - loop["mufu"]) * lanes / rates["alu"])
        out[f"{shape}_{warps}"] = (alone.get((shape, warps), t[1]), min(t[2] / 2, t[4] / 4),
                                   product(bm, bn, d, True) + product(bm, d, bn, False), softmax)
    return out


def row_clock(row) -> float | None:
    """The SM clock (MHz) a row's launch ran at: read in the kernel (clock64
    over the global timer) where the row has it, else NVML's samples around
    it (unreliable for sub-ms launches: 1335-1980 MHz for one kernel whose
    in-kernel cycles agreed to 0.01%, session 12)."""
    for key in ("clock_mhz_kernel", "clock_mhz_nvml"):
        try:
            v = float(row.get(key) or "nan")
        except ValueError:
            continue
        if math.isfinite(v) and v > 0:
            return v
    return None


def flash_step_latencies(steps):
    """{shape: cycles}: a one-warpgroup (4-warp) step alone on its SM, less
    its parts -- the chain's latency, which a lone warpgroup waits out and
    other CTAs or warpgroups can fill. The 8-warp rows are left out: their
    two warpgroups already fill part of it."""
    return {k: alone - products - softmax for k, (alone, _, products, softmax) in steps.items()
            if k.endswith("_w4")}


def chain_serial_fractions(steps):
    """{shape: f}: with the SM saturated, a step takes its products plus f
    times its softmax (f = 0: the tensor cores never wait for the softmax
    pipes, 1: never overlap them)."""
    return {k: (saturated - products) / softmax for k, (_, saturated, products, softmax) in steps.items()}


def mapping(rows):
    """{(section, key): (value, source)} for every profile key a measurement sets."""
    import tomllib

    base = tomllib.loads(open(BASE_PROFILE).read())
    out = {}
    any_row = rows[0] if rows else {}
    gpu_desc = f"{any_row.get('gpu', '?')}, {any_row.get('sm_count', '?')} SMs, driver {any_row.get('driver', '?')}"
    date = (any_row.get("date") or "")[:10]
    cmd = any_row.get("command", "experiments/calibrate.py run")

    def cite(what, row, clock=None):
        clk = clock or (row or {}).get("clock_mhz_kernel") or (row or {}).get("clock_mhz_nvml") or "?"
        command = (row or {}).get("command") or cmd
        when = ((row or {}).get("date") or "")[:10] or date
        return (f"our microbenchmark, {when}, `{command}`, {gpu_desc}, SM clock {clk} MHz read during the run: "
                f"{what} (experiments/results/calibration_h100.csv)")

    # device query
    for key, param in (("gpu.sm_count", "multi_processor_count"),
                       ("residency.smem_per_sm_bytes", "shared_memory_per_multiprocessor"),
                       ("residency.smem_per_block_bytes", "shared_memory_per_block_optin"),
                       ("residency.registers_per_sm", "regs_per_multiprocessor"),
                       ("residency.max_threads_per_sm", "max_threads_per_multi_processor"),
                       ("residency.smem_reserved_per_cta_bytes", "reservedSharedMemPerBlock"),
                       ("l2.capacity_bytes", "l2_cache_size"),
                       ("hbm.capacity_bytes", "total_memory")):
        v, row = _val(rows, "device", param)
        if v is not None:
            out[tuple(key.split("."))] = (int(v), f"device query on the lent GPU, {date} ({gpu_desc}): "
                                                  f"{row['detail']} {param} = {int(v)}")
    # tensor cores
    peak16 = base["tensor_cores"]["peak_dense_tflops_16bit"]
    n_sms = int(any_row.get("sm_count") or base["gpu"]["sm_count"])
    bf16, row_bf = _val(rows, "tensor_wgmma_triton", "bf16")
    if bf16:
        mix = [(row_clock(r), r) for r in rows if r["bench"] == "dot_chain"
               and not r["param"].endswith("_x1") and r.get("clock_mhz_kernel")]
        if mix:
            # the clock the flash-step mix runs at with the SM saturated, read in the
            # kernel: the per-clock rates and cycle counts of the profile become
            # seconds at it. (The bf16 tl.dot loop alone, every SM's tensor pipe
            # busy, runs slower: its own row says at which clock.)
            clocks = sorted(c for c, _ in mix)
            clk = statistics.median(clocks)
            row_clk = min(mix, key=lambda t: abs(t[0] - clk))[1]
            out[("gpu", "sm_clock_mhz")] = (round(clk, 0), cite(
                f"SM clock read in the kernel (clock64 over the global timer, median CTA) while the "
                f"dot_chain flash-step mix ran with 2 and 4 CTAs an SM, median of {len(clocks)} launches "
                f"({clocks[0]:.0f}-{clocks[-1]:.0f} MHz); per-clock rates and cycle counts become seconds "
                f"at it", row_clk, clk))
        elif row_bf.get("clock_mhz_nvml"):     # a CSV from before in-kernel clocks
            clk = row_bf["clock_mhz_nvml"]
            out[("gpu", "sm_clock_mhz")] = (float(clk), cite(
                "median SM clock NVML reported while the tensor cores ran the bf16 tl.dot loop "
                "(the regime attention kernels run in); per-clock rates below use it", row_bf, clk))
        # The tensor pipe's rate in flop a clock, over the clock the tl.dot loop ran
        # at (read in the kernel: with every SM's tensor pipe busy the clock drops,
        # 1647 MHz on the lent H100, against the flash-step mix's 1816), and at the
        # profile's clock. Taken as TFLOP/s over peak, the loop's 885.8 TFLOP/s at
        # 1647 MHz became 3695 flop a clock at 1816 MHz, 9% under the 4074 the loop
        # ran at, and the chain latency and serial fraction reduced from dot_chain
        # with it (below) absorbed the difference (experiments/fa2_step_parts.py).
        profile_clk = float(out[("gpu", "sm_clock_mhz")][0]) if ("gpu", "sm_clock_mhz") in out \
            else float(base["gpu"]["sm_clock_mhz"])
        per_clk = bf16 * 1e12 / (n_sms * (row_clock(row_bf) or profile_clk) * 1e6)
        out[("tensor_cores", "sustained_fraction")] = (
            round(min(1.0, per_clk * n_sms * profile_clk * 1e6 / (peak16 * 1e12)), 4),
            cite(f"Triton tl.dot loop (wgmma) on operands held on chip, bf16 {bf16:.1f} TFLOP/s at "
                 f"{row_clock(row_bf) or profile_clk:.0f} MHz: {per_clk:.0f} flop a clock an SM, at the profile's "
                 f"{profile_clk:.0f} MHz / datasheet {peak16} dense", row_bf))
    ms_bf, row_ms = _val(rows, "tensor_mma_sync_cuda", "bf16")
    if bf16 and ms_bf:
        # per clock, each loop at the clock it ran at (mma.sync's at 1830 MHz, the
        # tl.dot loop's at 1647 on the lent H100)
        ms_per_clk = ms_bf * 1e12 / (n_sms * (row_clock(row_ms) or profile_clk) * 1e6)
        out[("tensor_cores", "mma_sync_relative_rate")] = (
            round(min(1.0, ms_per_clk / per_clk), 4),
            cite(f"CUDA C mma.sync.m16n8k16 bf16 loop {ms_bf:.1f} TFLOP/s at {row_clock(row_ms) or profile_clk:.0f} MHz "
                 f"({ms_per_clk:.0f} flop a clock an SM) / wgmma tl.dot loop's {per_clk:.0f}", row_ms))
    # units
    # (each SM's own cycles where the run has them: the in-kernel clock,
    # clock64 over the global timer, read 2025-2085 MHz around these loops in
    # session 22, above the H100's 1980 MHz top, and the per-second rates it
    # divides take the launch's ramp and tail in: 1-7% low against the span)
    for key, bench, what in (
            ("exp2_per_clk_per_sm", "exp2_cuda", "ex2.approx.ftz.f32 (MUFU.EX2) throughput"),
            ("alu_ops_per_clk_per_sm", "ffma_cuda", "fp32 FMA throughput"),
            ("smem_bytes_per_clk_per_sm", "smem_read_cuda", "conflict-free ld.shared.v4 bytes")):
        v, row = _val(rows, bench, "per_clk_per_sm_spanned")
        how = "a clock an SM, by each SM's clock64 over its blocks' span (no timer; median over SMs)"
        if not v:
            v, row = _val(rows, bench, "per_clk_per_sm")
            how = "/ (SMs x SM clock read in-kernel: clock64 over the global timer)"
        if v:
            out[("units", key)] = (round(v, 2), cite(f"{what} {how} = {v:.2f}", row))
    serial = tensor_alu_serial_fractions(rows)
    if serial:   # the fallback where the CSV has no dot_chain rows (replaced below)
        row = next(r for r in rows if r["bench"] == "dot_exp_overlap")
        v = min(1.0, statistics.median(serial.values()))
        out[("units", "tensor_alu_serial_fraction")] = (round(v, 2), cite(
            "wgmma CTAs beside exp2-only or FMA-only CTAs on one SM take T_dot + f x T_elementwise; "
            "f per shape " + ", ".join(f"{k} {x:.2f}" for k, x in serial.items())
            + f"; median {v:.2f}", row, row.get("clock_mhz_nvml")))
    # the dependent chain of a flash step, beyond its parts' throughput times
    units = {k: out[("units", k)][0] for k in ("exp2_per_clk_per_sm", "alu_ops_per_clk_per_sm",
                                              "smem_bytes_per_clk_per_sm") if ("units", k) in out}
    if bf16 and len(units) == 3:
        # every part in cycles, as dot_chain counts them: the tensor pipe at its
        # rate a clock (so the engine, charging products at that rate and the
        # latency at the profile's clock, gives back the one-CTA step it was taken from)
        chain_clocks = sorted(c for c in (row_clock(r) for r in rows if r["bench"] == "dot_chain") if c)
        chain_clock = f"{chain_clocks[0]:.0f}-{chain_clocks[-1]:.0f} (per launch, in the kernel)" if chain_clocks else None
        rates = {"tensor": per_clk, "exp2": units["exp2_per_clk_per_sm"],
                 "alu": units["alu_ops_per_clk_per_sm"], "smem": units["smem_bytes_per_clk_per_sm"],
                 "operand_bytes": _profile_module().parse_profile(base, BASE_PROFILE).wgmma_operand_bytes}
        steps = _dot_chain_steps(rows, rates)
        latencies = flash_step_latencies(steps)
        row = next((r for r in rows if r["bench"] == "dot_chain"), None)
        if latencies:
            v = max(0.0, statistics.median(latencies.values()))
            out[("units", "flash_step_latency_cycles")] = (round(v, 0), cite(
                "one flash step's dependent chain on operands held on chip (S = A·B, row max, exp2, "
                "acc += P·V), timed with one 4-warp CTA per SM, less its parts at the rates measured "
                "here (tl.dot loop, SMEM operand reads; its exp2s on the MUFU, then its other "
                "instructions, as its sm_90 loop has them, on the issue slots), in SM clocks: "
                + ", ".join(f"{k} {x:.0f}" for k, x in latencies.items()) + f"; median {v:.0f}",
                row, chain_clock))
        fractions = chain_serial_fractions(steps)
        if fractions:
            v = min(1.0, max(0.0, statistics.median(fractions.values())))
            earlier = ", ".join(f"{k} {x:.2f}" for k, x in serial.items())
            out[("units", "tensor_alu_serial_fraction")] = (round(v, 2), cite(
                "the same dot_chain kernel with 2 and 4 CTAs per SM (the SM saturated) takes its "
                "products plus f x its softmax (its exp2s, then its other instructions, as its sm_90 "
                "loop has them), the parts at the rates measured here; f per shape "
                + ", ".join(f"{k} {x:.2f}" for k, x in fractions.items()) + f"; median {v:.2f}. "
                "(dot_exp_overlap, with exp2-only or FMA-only CTAs beside product-only CTAs, gave "
                + (earlier or "no rows") + ": separate streams of back-to-back MUFU or FFMA "
                "instructions, not the attention mix, where each warp interleaves them with its "
                "wgmma waits; the profile takes the chain's figure.)", row, chain_clock))
    # L2
    plateau, knee, pts = l2_plateau_and_knee(rows)
    if plateau:
        row = next(r for r in rows if r["bench"] == "l2_read_bandwidth")
        out[("l2", "bandwidth_gbps")] = (round(plateau, 0), cite(
            f"persistent Triton ld.global.cg re-read of a working set, median over working sets "
            f"of 4-32 MB = {plateau:.0f} GB/s (bandwidth falls below half-way to HBM at {knee} MB)",
            row, row.get("clock_mhz_nvml")))
    port = [(float(r["value"]), r) for r in rows if r["bench"] == "l2_sm_port"
            and _val(rows, "l2_sm_port", r["param"])[0]]
    if port and ("l2", "sm_port_bytes_per_clk") in {(s, k) for s in base for k in base[s]
                                                     if isinstance(base[s], dict)}:
        v, row = max(port, key=lambda t: t[0])
        out[("l2", "sm_port_bytes_per_clk")] = (round(v, 1), cite(
            f"a single CTA re-reading a 4 MB L2-resident set (ld.global.cg), best of the single-CTA probes in the CSV "
            f"= {v:.1f} B/clk at the NVML clock", row, row.get("clock_mhz_nvml")))
    store = [(float(r["value"]), r) for r in rows if r["bench"] == "l2_sm_store"
             and _val(rows, "l2_sm_store", r["param"])[0]]
    if store:
        v, row = max(store, key=lambda t: t[0])
        out[("l2", "sm_store_bytes_per_clk")] = (round(v, 1), cite(
            f"a single CTA storing into a 4 MB L2-resident set (STG.E.128), best of the single-CTA probes in "
            f"the CSV = {v:.1f} B/clk at the NVML clock", row, row.get("clock_mhz_nvml")))
    profile_mhz = float(out[("gpu", "sm_clock_mhz")][0]) if ("gpu", "sm_clock_mhz") in out \
        else float(base["gpu"]["sm_clock_mhz"])
    cycles, how, row = chase_latency(rows, "l2", "plain_l2", profile_mhz)
    if cycles:
        out[("l2", "hit_latency_cycles")] = (round(cycles, 0), cite(
            f"1-thread pointer chase, ld.global.cg, 4 MB working set (L2 hits){how}", row))
    per_sm = {}
    for r in rows:
        if r["bench"] == "latency_per_sm" and r["param"].startswith("sm_"):
            v, row = _val(rows, "latency_per_sm", r["param"])
            if v:
                per_sm[int(r["param"][3:])] = (v, row)
    if sorted(per_sm) == list(range(n_sms)):
        cycles = [per_sm[i][0] for i in range(n_sms)]
        middle = statistics.median(cycles)
        out[("l2", "sm_latency_offsets_cycles")] = ([round(c - middle, 1) + 0.0 for c in cycles], cite(
            f"1-thread pointer chase from every SM at once (calibrate.py latency_per_sm), ld.global.cg, 4 MB "
            f"L2-resident set: {min(cycles):.0f}-{max(cycles):.0f} cycles, median {middle:.0f}; each SM's "
            f"less the median, by SM id", per_sm[0][1]))
    # HBM
    v, row = _val(rows, "hbm_bandwidth", "copy")
    if v:
        peak = base["hbm"]["peak_bandwidth_gbps"]
        out[("hbm", "sustained_bandwidth_gbps")] = (round(min(v, peak), 0), cite(
            f"Triton 2 GiB device-to-device copy, bytes read + written / time = {v:.0f} GB/s "
            f"(read-only and write-only kernels in the CSV)", row, row.get("clock_mhz_nvml")))
    cycles, how, row = chase_latency(rows, "dram", "plain_dram", profile_mhz)
    if cycles:
        out[("hbm", "latency_cycles")] = (round(cycles, 0), cite(
            f"1-thread pointer chase, ld.global.cg, random 128 B lines over 1 GB (L2 misses, TLB "
            f"misses included){how}", row))
        out[("copy", "plain_load_latency_cycles")] = (round(cycles, 0), cite(
            f"a global load that misses L2: the DRAM pointer chase{how}", row))
    v, row = _val(rows, "latency", "tma_extra_dram")
    if v is not None and v >= 0:
        out[("copy", "tma_extra_latency_cycles")] = (round(v, 0), cite(
            f"the same DRAM chase through cp.async.bulk + mbarrier minus the plain chase = {v:.0f} cycles",
            row))
    alone = [(float(r["value"]), r) for r in rows if r["bench"] == "store_overlap"
             and r["param"].endswith("B_store") and int(r["param"].split("B_")[0]) >= STORE_OVERLAP_DRAINED]
    if alone:
        per_warp = sorted((int(r["param"].split("B_")[0]) / v / STORE_OVERLAP_WARPS, r) for v, r in alone if v > 0)
        v, row = per_warp[(len(per_warp) - 1) // 2]
        out[("l2", "sm_store_bytes_per_clk_per_warp")] = (round(v, 2), cite(
            f"one {STORE_OVERLAP_WARPS}-warp CTA an SM storing 16-64 KB from registers an iteration "
            f"(store_overlap): " + ", ".join(f"{b:.2f}" for b, _ in per_warp) + f" B/clk a warp, median "
            f"{v:.2f}, where 8-32 warps of one CTA reach the SM's write path (l2_store, 31.3-31.9 B/clk)",
            row))
    v, row = _val(rows, "tma_setup", "descriptors_x1")
    if v is not None and v >= 0:
        out[("copy", "tma_descriptor_setup_cycles")] = (round(v / TMA_SETUP_DESCRIPTORS, 0), cite(
            f"a CTA (one an SM) building {TMA_SETUP_DESCRIPTORS} device-side tensor descriptors as "
            f"kernels/fa3.py does (each written to global scratch by a GPU-scope atomic, waited "
            f"for, UTMACCTL.IV, UTMACMDFLUSH) and loading a tile through each, less the same tiles "
            f"by plain loads: {v:.0f} clock64 cycles, {v / TMA_SETUP_DESCRIPTORS:.0f} a descriptor "
            f"(with eight CTAs an SM building at once: "
            f"{(_val(rows, 'tma_setup', 'descriptors_x8')[0] or float('nan')) / TMA_SETUP_DESCRIPTORS:.0f})",
            row))
    v, row = _val(rows, "cta_cycle", "0B_x1")
    if v and row.get("clock_mhz_nvml"):
        clk = float(row["clock_mhz_nvml"])
        out[("launch", "cta_turnover_cycles")] = (round(v * clk, 0), cite(
            f"CTAs of {CTA_CYCLE_THREADS} threads that do nothing, one per SM (all of an SM's SMEM "
            f"each), {v:.3f} us a round (slope between launches of {CTA_CYCLE_ROUNDS[0]} and "
            f"{CTA_CYCLE_ROUNDS[1]} rounds; {row.get('date', '')[:10]}) x {clk:.0f} MHz = "
            f"{v * clk:.0f} cycles to start and retire a CTA", row, clk))
    v, row = _val(rows, "launch", "do_bench_empty_triton")
    if v:
        out[("launch", "kernel_launch_us")] = (round(v, 2), cite(
            f"triton.testing.do_bench median of an empty kernel = {v:.2f} us: the fixed cost every "
            f"do_bench-timed kernel pays (back-to-back eager and graph launches in the CSV)", row))
    return out


def _toml_value(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(v, float):
        return repr(float(v))
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    return str(v)


def write_profile(rows, path):
    import tomllib

    SCHEMA = _profile_module().SCHEMA

    base = tomllib.loads(open(BASE_PROFILE).read())
    m = mapping(rows)
    data = {s: dict(base[s]) for s in base if s != "sources"}
    sources = dict(base["sources"])
    for (sec, key), (v, src) in m.items():
        typ = SCHEMA[sec][key][0]
        data[sec][key] = typ(v)
        sources[f"{sec}.{key}"] = src
    data["gpu"]["name"] = "h100.measured"
    data["gpu"]["description"] = base["gpu"]["description"] + " (calibrated from our microbenchmarks)"
    if data["hbm"]["sustained_bandwidth_gbps"] > data["hbm"]["peak_bandwidth_gbps"]:
        data["hbm"]["sustained_bandwidth_gbps"] = data["hbm"]["peak_bandwidth_gbps"]
    lines = ["# NVIDIA H100 SXM5, calibrated: written by experiments/calibrate.py from",
             "# experiments/results/calibration_h100.csv. Keys whose source begins with",
             "# \"our microbenchmark\" or \"device query\" were measured on the lent GPU; the others",
             "# are copied from h100.toml with their sources. Attention kernels never feed it.",
             f"# measured keys: {', '.join(sorted(f'{s}.{k}' for s, k in m))}", ""]
    for sec, keys in SCHEMA.items():
        lines.append(f"[{sec}]")
        for key in keys:
            lines.append(f"{key} = {_toml_value(data[sec][key])}")
        lines.append("")
    lines.append("[sources]")
    for sec, keys in SCHEMA.items():
        for key in keys:
            k = f"{sec}.{key}"
            if k in sources:
                lines.append(f"{_toml_value(k)} = {_toml_value(sources[k])}")
    text = "\n".join(lines) + "\n"
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)
    return m


def _profile_module():
    """gpusim/profile.py loaded by path: the GPU machine has no simpy, and the package's
    __init__ may pull the engine in; profile.py itself needs only algorithms/."""
    import importlib.util
    if "_gpusim_profile" in sys.modules:
        return sys.modules["_gpusim_profile"]
    spec = importlib.util.spec_from_file_location("_gpusim_profile",
                                                  os.path.join(ROOT, "gpusim", "profile.py"))
    mod = importlib.util.module_from_spec(spec)
    sys.modules["_gpusim_profile"] = mod
    spec.loader.exec_module(mod)
    return mod


def from_profile_check(path):
    return _profile_module().load_profile(path)


def cmd_profile(args) -> int:
    from gpusim.artifacts import read_csv_rows   # (CPU side: `run` on the GPU machine needs no gpusim)

    rows = read_csv_rows(args.csv)
    m = write_profile(rows, args.out)
    from_profile_check(args.out)
    print(f"wrote {args.out}: {len(m)} measured keys")
    for (s, k), (v, _) in sorted(m.items()):
        print(f"  {s}.{k} = {v}")
    return 0


def median_rows(runs: list[list[dict]]) -> list[dict]:
    """One row a (bench, param) from repeated runs of the same steps: the
    row of the run whose value is the median (its clocks and detail stay
    with its value; of an even count, the lower middle), its detail
    extended with every run's value, so the spread stays in the CSV. Keys
    in one run only pass as they are."""
    by_key: dict = {}
    for rows in runs:
        for r in rows:
            by_key.setdefault((r["bench"], r["param"]), []).append(r)
    out = []
    for rows in by_key.values():
        numeric = []
        for r in rows:
            try:
                v = float(r["value"])
            except ValueError:
                continue
            if math.isfinite(v):
                numeric.append((v, r))
        if len(rows) == 1 or len(numeric) < 2:
            out.append(rows[0])
            continue
        numeric.sort(key=lambda t: t[0])
        _, pick = numeric[(len(numeric) - 1) // 2]
        values = " / ".join(r["value"] for r in rows)
        out.append({**pick, "detail": f"{pick['detail']}; median of {len(rows)} runs: {values}"})
    return out


def merge_rows(old_rows: list[dict], new_rows: list[dict]) -> tuple[list[dict], list[tuple]]:
    """The CSV's rows with a later run's merged in: a new row takes the place
    of the old one with the same (bench, param) -- the profile reads one
    figure a key, and a re-run is a re-measurement (git keeps the old one) --
    and rows the CSV lacks go at its end. Returns (rows, [(bench, param, old
    value or None, new value)])."""
    at = {(r["bench"], r["param"]): k for k, r in enumerate(old_rows)}
    rows, changes = list(old_rows), []
    for r in new_rows:
        key = (r["bench"], r["param"])
        if key in at:
            changes.append((*key, rows[at[key]]["value"], r["value"]))
            rows[at[key]] = r
        else:
            at[key] = len(rows)
            rows.append(r)
            changes.append((*key, None, r["value"]))
    return rows, changes


def cmd_merge(args) -> int:
    from gpusim.artifacts import read_csv_rows

    old = read_csv_rows(args.csv)
    runs = [read_csv_rows(path) for path in args.new]
    for name, rows in ((args.csv, old), *zip(args.new, runs)):
        missing = [c for c in ("bench", "param", "value") if rows and c not in rows[0]]
        if missing:
            raise ResultsFileError(f"{name}: no column {missing[0]!r}; a calibration CSV has {', '.join(COLUMNS)}")
    new = median_rows(runs)
    rows, changes = merge_rows(old, new)
    write_csv_atomic(args.csv, rows, COLUMNS)
    for bench, param, before, after in changes:
        print(f"  {bench:<22} {param:<28} {before if before is not None else '(new)':>12} -> {after}")
    print(f"merged {len(new)} rows of {len(runs)} run(s) into {args.csv} ({len(rows)} rows)")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("run", help="measure on the GPU machine")
    p.add_argument("--out-dir", default=os.environ.get("OUT") or os.path.join(ROOT, "experiments", "results"))
    p.add_argument("--quick", action="store_true", help="smaller buffers and fewer sizes")
    p.add_argument("--only", default="", help="comma-separated steps: device,hbm,tile_write,tma_setup,store_overlap,l2,wgmma,cuda,softmax_mix,"
                                              "l2_store,l2_round_trip,l2_duration,l2_ramp,launch_fill,wgmma_shapes,dot_exp_overlap,dot_pair,dot_chain,dot_chain_wide,dot_chain_more,dot_chain_phase,"
                                              "exp2_triton,latency,loaded_latency,"
                                              "launch,cta_cycle,cta_stamps")
    p.set_defaults(func=cmd_run)
    p = sub.add_parser("check", help="compile every microkernel for sm_90 here and show its SASS")
    p.set_defaults(func=cmd_check)
    p = sub.add_parser("merge", help="merge a later run's CSV into the committed one (same bench and param: replaced)")
    p.add_argument("--new", required=True, action="append",
                   help="a run's calibration CSV; repeat for repeated runs (each key: the median run's row)")
    p.add_argument("--csv", default=DEFAULT_CSV)
    p.set_defaults(func=cmd_merge)
    p = sub.add_parser("loops", help="cross-compile the dot_chain kernels for sm_90 here and write their loops' "
                                     "instruction counts (the profile's reduction reads them)")
    p.add_argument("--out", default=DOT_CHAIN_LOOPS)
    p.set_defaults(func=cmd_loops)
    p = sub.add_parser("profile", help="write the measured profile from the CSV")
    p.add_argument("--csv", default=DEFAULT_CSV)
    p.add_argument("--out", default=DEFAULT_PROFILE)
    p.set_defaults(func=cmd_profile)
    args = ap.parse_args(argv)
    try:
        return args.func(args)
    except ResultsFileError as e:
        print(f"calibrate: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
