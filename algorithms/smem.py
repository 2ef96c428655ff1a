"""On-chip resources a CTA needs: shared memory and registers.

The SMEM of the Triton kernels is what Triton allocates; the rule below was
read off compiled kernels (experiments/triton_smem_probe.py, results in
experiments/results/triton_smem_fa2.csv) and a test checks it row by row.
"""
from __future__ import annotations

from .errors import DoesNotFit
from .problem import AttentionProblem, TileConfig, cdiv

# Registers a Triton attention thread holds besides its tile values:
# pointers, loop counters, row statistics and address arithmetic.
REGISTER_OVERHEAD = 32
MAX_REGISTERS_PER_THREAD = 255
# An mbarrier is one 64-bit word in SMEM.
MBARRIER_BYTES = 8


def registers_per_thread(threads: int, fp32_values: int, packed16_values: int = 0) -> int:
    """Registers per thread for tile values spread evenly over the CTA's
    threads (fp32 one per register, 16-bit two per register), capped at the
    255 the ISA allows (beyond that the compiler spills)."""
    regs = REGISTER_OVERHEAD + cdiv(fp32_values, threads) + cdiv(packed16_values, 2 * threads)
    return min(MAX_REGISTERS_PER_THREAD, regs)


def triton_fa_smem_bytes(problem: AttentionProblem, cfg: TileConfig) -> int:
    """SMEM Triton 3.6 allocates for kernels/fa2.py on sm_90 (exact on all 288
    cross-compiled configs of experiments/results/triton_smem_fa2.csv):
    one [block_m, d] Q buffer (wgmma reads its A operand from SMEM), plus
    num_stages buffers each of K and V when the loop is pipelined; with
    num_stages == 1 K and V share one buffer. P goes to the second GEMM from
    registers and reduction scratch reuses these buffers: no other SMEM.
    num_warps and causal never change it."""
    e, d = problem.elem_bytes, problem.head_dim
    kv_buffers = 2 * cfg.num_stages if cfg.num_stages >= 2 else 1
    return e * d * (cfg.block_m + cfg.block_n * kv_buffers)


def check_fits_block(required: int, limit: int, what: str) -> None:
    if required > limit:
        raise DoesNotFit("shared memory", required, limit,
                         f"{what}: reduce block_m, block_n or num_stages")
