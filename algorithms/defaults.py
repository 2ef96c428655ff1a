"""Default tile configs and launch rules shared by schedules and kernels.

Kept apart from the schedules so that kernels/ can import them without
pulling in anything else; every rule here is read by both sides.
"""
from __future__ import annotations

from .errors import UnsupportedAlgorithm
from .problem import AttentionProblem, TileConfig

ALGORITHMS = ("standard", "fa1", "fa2", "fa3")
# Schedules of particular kernels besides the four algorithms': kernels/fa3.py
# as Triton 3.6 compiles it (no warp specialisation on sm_90; algorithms/fa3_triton.py)
KERNEL_SCHEDULES = ("fa3_triton",)
SCHEDULES = ALGORITHMS + KERNEL_SCHEDULES


def softmax_num_warps(seqlen_kv: int) -> int:
    """Warps of standard's row-softmax kernel (one CTA per row), as the Triton
    softmax tutorial chooses them: more warps for longer rows so each thread
    holds at most a few dozen elements in registers."""
    block = 1 << (seqlen_kv - 1).bit_length()
    if block <= 2048:
        return 4
    if block <= 8192:
        return 8
    return 16


def fa3_num_warps(consumer_warpgroups: int) -> int:
    """FA3 CTAs hold one producer warpgroup plus the consumer warpgroups."""
    return 4 * (1 + consumer_warpgroups)


def fa3_triton_warps(cfg: TileConfig, fp8: bool = False) -> int:
    """Warps kernels/fa3.py launches for a config whose num_warps counts FA3's
    producer warpgroup. Triton 3.6 builds no producer on sm_90
    (kernels/NOTES.md), so the bf16/fp16 kernel asks for num_warps - 4 when
    the config has more than two warpgroups, and the fp8 kernel for 8 warps
    from 8 up, else 4."""
    if fp8:
        return 8 if cfg.num_warps >= 8 else 4
    return cfg.num_warps - 4 if cfg.num_warps > 8 else cfg.num_warps


def default_config(algo: str, problem: AttentionProblem, hopper: bool = True) -> TileConfig:
    """The config used when the caller gives none.

    hopper: whether the GPU has wgmma/TMA (H100, H200); smaller rings on
    Ampere, whose 164 KB of SMEM per SM holds fewer stages.
    """
    d = problem.head_dim
    if algo == "standard":
        return TileConfig(block_m=128, block_n=128, block_k=64, num_warps=8,
                          num_stages=3 if hopper else 2)
    if algo == "fa1":
        # Algorithm 1 sizes B_c = M/(4d), B_r = min(B_c, d) from the SMEM size M;
        # 64x64 keeps K, V, Q and the split-K combine buffer well inside both GPUs.
        return TileConfig(block_m=64, block_n=64, num_warps=4, num_stages=1)
    if algo == "fa2":
        if d <= 64:
            return TileConfig(block_m=128, block_n=64, num_warps=4, num_stages=3)
        if d <= 128:
            return TileConfig(block_m=128, block_n=64, num_warps=8,
                              num_stages=3 if hopper else 2)
        return TileConfig(block_m=64, block_n=32, num_warps=4, num_stages=2)
    if algo in ("fa3", "fa3_triton"):
        # 3 stages measured 4-14% faster than 2 at D=128 on the H100, and
        # block_n 64 best at D=64 (kernels/NOTES.md, experiments/results/kernels_tune1.csv).
        block_n = 128 if d == 128 else 64
        stages = 2 if d > 128 else 3  # D=256: Q + 3 stages of 64-row K/V exceed 227 KB
        return TileConfig(block_m=128, block_n=block_n, num_warps=fa3_num_warps(2),
                          num_stages=stages, mma="wgmma", consumer_warpgroups=2)
    raise UnsupportedAlgorithm(f"unknown algorithm {algo!r}; choose one of {', '.join(SCHEDULES)}")
