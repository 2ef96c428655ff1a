"""The schedule of kernels/fa3.py as Triton 3.6 compiles it for sm_90: FA3's
tiles on FA2's structure.

Triton 3.6 does not warp-specialise the kernel on sm_90: the TTGIR has no
`ttg.warp_specialize` op for any config (kernels/NOTES.md). So there is no
producer warpgroup, no pingpong and no intra-warpgroup overlap: every warp
computes, as in fa2, and Triton's software pipeliner fills the K/V ring
num_stages - 1 blocks ahead. What differs from fa2, read off the compiled
kernel (SASS of 128x128, 8 warps, 2 stages, D = 64 and 128):
- K, V and Q arrive by TMA from tensor descriptors (UTMALDG issued by one
  elected thread, an mbarrier counting the bytes), not cp.async, and every
  CTA first builds those three descriptors on the device, one after the
  other, waiting for each (6045 cycles in all on the H100, calibrate.py
  tma_setup: 3-5 us a CTA, as long as a short CTA's loop);
- the launch has num_warps - 4 warps when the config counts FA3's producer
  warpgroup (algorithms.defaults.fa3_triton_warps, which the kernel
  launches with);
- Q Kᵀ is waited for at once and P V is left running into the next step
  (WARPGROUP.DEPBAR after the first product only), as in fa2; the fp8
  kernel (`_fa3_fp8_fwd`) too, since it folds each block's V scale into
  the accumulator's rescale instead of descaling P V before adding it.
Registers, SMEM and the instructions a warp issues per step come from the
probe's table (experiments/results/triton_smem_fa3.csv, bf16 and fp8).

This is the schedule to compare with measurements of kernels/fa3.py;
algorithms/fa3 is FA3's own, which kernels/fa3_gluon.py runs.
"""
from __future__ import annotations

from . import fa2
from .compiled import compiled
from .defaults import fa3_triton_warps
from .errors import InvalidConfig
from .ops import TMA
from .problem import AttentionProblem, TileConfig
from .schedule import Schedule
from .smem import check_fits_block

NAME = "fa3_triton"
# Q, K and V (fp8: Q, K and Vᵀ) through descriptors each CTA builds on the
# device (three UTMACCTL.IV in the SASS of both kernels; tests/test_fa3_triton.py)
DEVICE_DESCRIPTORS = 3
VARIANT = fa2.Variant(name=NAME, launch="fa3_fwd", engine=TMA, device_descriptors=DEVICE_DESCRIPTORS)
FP8_VARIANT = fa2.Variant(name=NAME, launch="fa3_fp8_fwd", engine=TMA,
                          device_descriptors=DEVICE_DESCRIPTORS)


def launched(problem: AttentionProblem, cfg: TileConfig) -> TileConfig:
    """The config with the warps the kernel launches."""
    return cfg.with_(num_warps=fa3_triton_warps(cfg, fp8=problem.dtype == "fp8"))


def smem_bytes(problem: AttentionProblem, cfg: TileConfig) -> int:
    """Triton's allocation where the probe compiled the config, else fa2's
    rule (Q and the K/V ring; the mbarriers add up to 1 KB more)."""
    run = launched(problem, cfg)
    return compiled("fa3", problem, run.num_warps, run).smem_bytes or fa2.smem_bytes(problem, run)


def check(problem: AttentionProblem, cfg: TileConfig, smem_limit: int) -> None:
    if cfg.num_warps % 4 or not 4 <= cfg.num_warps <= 16:
        raise InvalidConfig(f"{NAME}: num_warps must be 4, 8, 12 or 16 (whole warpgroups), "
                            f"got {cfg.num_warps}")
    if cfg.num_stages < 2:
        raise InvalidConfig(f"{NAME} needs num_stages >= 2 for its TMA ring, got {cfg.num_stages}")
    if cfg.mma not in ("auto", "wgmma"):
        raise InvalidConfig(f"{NAME} runs on wgmma, got mma={cfg.mma!r}")
    check_fits_block(smem_bytes(problem, cfg), smem_limit, NAME)


def build(problem: AttentionProblem, cfg: TileConfig) -> Schedule:
    run = launched(problem, cfg)
    variant = FP8_VARIANT if problem.dtype == "fp8" else VARIANT
    return fa2.build_variant(problem, run, compiled("fa3", problem, run.num_warps, run), variant)
