"""Attention problems, tile configs and the schedules of the four algorithms
(and of one kernel that runs none of them exactly: fa3_triton, Triton 3.6's
build of kernels/fa3.py).

`build(algo, problem, config)` returns a Schedule: per-CTA programs of tile
operations that both the accounting (algorithms.accounting) and the simulator
(gpusim) read. Pure Python: importable on the GPU machine without simpy.
"""
from __future__ import annotations

from . import fa1, fa2, fa3, fa3_triton, standard
from .defaults import ALGORITHMS, SCHEDULES, default_config
from .errors import (DoesNotFit, GpusimError, InvalidConfig, InvalidProblem, ProfileError,
                     UnsupportedAlgorithm)
from .problem import AttentionProblem, TileConfig
from .schedule import Schedule

_MODULES = {"standard": standard, "fa1": fa1, "fa2": fa2, "fa3": fa3, "fa3_triton": fa3_triton}
# Algorithms whose kernels run fp8 inputs; the others take fp16/bf16 only.
FP8_ALGORITHMS = ("fa3", "fa3_triton")
# Hopper-only: wgmma and TMA (a producer warpgroup, or descriptor loads)
HOPPER_ONLY = ("fa3", "fa3_triton")


def module(algo: str):
    try:
        return _MODULES[algo]
    except KeyError:
        raise UnsupportedAlgorithm(
            f"unknown algorithm {algo!r}; choose one of {', '.join(SCHEDULES)}") from None


def check(algo: str, problem: AttentionProblem, config: TileConfig, smem_limit: int) -> None:
    """Raise a typed error if `config` cannot run `problem` with `smem_limit`
    bytes of SMEM per CTA (the GPU's opt-in per-block maximum)."""
    mod = module(algo)
    if problem.dtype == "fp8" and algo not in FP8_ALGORITHMS:
        raise UnsupportedAlgorithm(f"{algo} has no fp8 kernel; fp8 runs with {', '.join(FP8_ALGORITHMS)}")
    if algo not in HOPPER_ONLY and config.num_warps & (config.num_warps - 1):
        raise InvalidConfig(f"{algo}: Triton needs num_warps to be a power of two, got {config.num_warps}")
    if algo != "fa3" and config.block_m & (config.block_m - 1):
        raise InvalidConfig(f"{algo}: Triton needs block_m to be a power of two, got {config.block_m} "
                            f"(a {config.block_m}-row tile runs only in fa3)")
    mod.check(problem, config, smem_limit)


def build(algo: str, problem: AttentionProblem, config: TileConfig | None = None,
          hopper: bool = True) -> Schedule:
    """The schedule of `algo` for `problem` (default config if None). Call
    check() first to refuse configs that do not fit a GPU. hopper: the GPU
    has wgmma/TMA (default configs; fa2's sm_90 build spills registers at
    some configs, algorithms/compiled.py)."""
    mod = module(algo)
    cfg = config or default_config(algo, problem, hopper)
    if mod is fa2:
        return fa2.build(problem, cfg, hopper=hopper)
    return mod.build(problem, cfg)


__all__ = ["ALGORITHMS", "SCHEDULES", "AttentionProblem", "TileConfig", "Schedule", "build", "check",
           "default_config", "module", "DoesNotFit", "GpusimError", "InvalidConfig",
           "InvalidProblem", "ProfileError", "UnsupportedAlgorithm"]
