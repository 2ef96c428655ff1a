"""What the compiler made of our Triton fa2 kernel for sm_90 (H100/H200), for
its schedule: registers per thread and register spills read off cross-compiled binaries by
experiments/triton_smem_probe.py (experiments/results/triton_smem_fa2.csv,
no GPU, no timing). Above all with 4 warps and block_m = 128 at head dim 128
(also some D = 64 and D = 256 configs), ptxas runs out of its 255 registers
and a thread stores and reloads hundreds of bytes (up to ~1.5 KB) of its
accumulators to its stack in every loop iteration. That local memory traffic
mostly misses L1 (ncu: experiments/spill_counters.py, 0.5-40% of the reloads
hit) and the model sends all of it to L2.

Configs the table lacks, and fp8, get no spills and the schedule's register
estimate (the table is bf16; fp16 has the same register allocation as bf16)."""
from __future__ import annotations

import csv
import functools
import os
import warnings
from dataclasses import dataclass

from .problem import AttentionProblem, TileConfig

TABLE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                     "experiments", "results", "triton_smem_fa2.csv")
SIXTEEN_BIT = ("bf16", "fp16")


@dataclass(frozen=True)
class Spills:
    """Per thread: the stack frame, and what one iteration of the K/V loop
    stores to it and loads from it."""

    stack_bytes: int
    store_bytes: int
    load_bytes: int

    @property
    def bytes(self) -> int:
        return self.store_bytes + self.load_bytes


@functools.lru_cache(maxsize=1)
def _fa2_table() -> dict:
    """(block_m, block_n, num_warps, num_stages, head_dim, causal) -> (Spills
    or None, registers per thread or None)."""
    table = {}
    if not os.path.exists(TABLE):
        warnings.warn(f"{TABLE} is missing: fa2 predictions run without register spills "
                      f"(regenerate it with experiments/triton_smem_probe.py)")
        return table
    with open(TABLE, newline="") as f:
        for r in csv.DictReader(f):
            key = tuple(int(r[k]) for k in ("block_m", "block_n", "num_warps", "num_stages",
                                             "head_dim", "causal"))
            spills = None
            if r.get("spill_store_bytes_per_iter"):
                spills = Spills(int(r["stack_bytes"] or 0), int(r["spill_store_bytes_per_iter"]),
                                int(r["spill_load_bytes_per_iter"]))
            table[key] = (spills, int(r["n_regs"]) if r.get("n_regs") else None)
    return table


def _fa2_row(problem: AttentionProblem, cfg: TileConfig) -> tuple:
    if problem.dtype not in SIXTEEN_BIT:
        return (None, None)
    key = (cfg.block_m, cfg.block_n, cfg.num_warps, cfg.num_stages, problem.head_dim,
           int(problem.causal))
    return _fa2_table().get(key, (None, None))


def fa2_spills(problem: AttentionProblem, cfg: TileConfig) -> Spills | None:
    """The fa2 kernel's spill traffic for this config on sm_90, or None where
    the probe has no row."""
    return _fa2_row(problem, cfg)[0]


def fa2_registers(problem: AttentionProblem, cfg: TileConfig) -> int | None:
    """Registers per thread ptxas gave the fa2 kernel for this config on sm_90
    (they decide how many CTAs share an SM), or None where the probe has no row."""
    return _fa2_row(problem, cfg)[1]
