"""gpusim.triton: a `prune_configs_by` hook for `triton.autotune`.

The implementation lives in gpusim.triton_prune (this module's name shadows
nothing outside the package: inside gpusim, `import triton` is absolute and
still finds the real Triton). See gpusim.triton_prune for the details.

    @triton.autotune(configs=..., key=["n_q", "n_kv"],
                     prune_configs_by=gpusim.triton.prune_configs_by(gpu="h100", top_k=8))
"""
from __future__ import annotations

from .triton_prune import (PrecomputedPredictor, Ranked, SimulatorPredictor, SimulatorPrune,
                           config_key, problem_from_args, problem_key, prune_configs_by,
                           write_predictions)


def configs(block_m=(64, 128), block_n=(32, 64, 128), warps=(4, 8), stages=(2, 3, 4)):
    """triton.Config objects for every (BLOCK_M, BLOCK_N, num_warps,
    num_stages): the autotune search space the hook prunes."""
    import triton  # the real Triton: absolute import

    return [triton.Config({"BLOCK_M": m, "BLOCK_N": n}, num_warps=w, num_stages=s)
            for m in block_m for n in block_n for w in warps for s in stages]


__all__ = ["prune_configs_by", "SimulatorPrune", "SimulatorPredictor", "PrecomputedPredictor",
           "Ranked", "problem_from_args", "problem_key", "config_key", "write_predictions",
           "configs"]
