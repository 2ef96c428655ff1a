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
    """SMEM Triton 3.6 allocates for kernels/fa2.py on sm_90.

    Provisional rule until the probe's CSV lands: the Q tile plus num_stages
    buffers of K and V (a stage-1 loop still stages K and V through SMEM for
    the tensor cores).
    """
    e, d = problem.elem_bytes, problem.head_dim
    q = cfg.block_m * d * e
    kv = 2 * cfg.block_n * d * e
    return q + max(1, cfg.num_stages) * kv


def check_fits_block(required: int, limit: int, what: str) -> None:
    if required > limit:
        raise DoesNotFit("shared memory", required, limit,
                         f"{what}: reduce block_m, block_n or num_stages")
