"""What the compiler made of our Triton kernels for sm_90 (H100/H200), for
their schedules, read off cross-compiled binaries by
experiments/triton_smem_probe.py (experiments/results/triton_smem_fa2.csv,
triton_smem_fa3.csv, triton_smem_standard_qk.csv and triton_smem_fa1.csv,
the last registers only; no GPU, no timing):
- registers per thread (they decide how many CTAs share an SM);
- fa2's register spills: above all with 4 warps and block_m = 128 at head
  dim 128 (also some D = 64 and D = 256 configs), ptxas runs out of its 255
  registers and a thread stores and reloads hundreds of bytes (up to ~1.5 KB)
  of its accumulators to its stack in every loop iteration. That local memory
  traffic mostly misses L1 (ncu: experiments/spill_counters.py, 0.5-40% of
  the reloads hit) and the model sends all of it to L2, the warp waiting
  where the SASS has it wait (spill_wait_slacks);
- the instructions a warp issues per trip of the unmasked and of the masked
  K/V loop besides its wgmma (kernels/sass.py): the softmax, the masks, the
  address arithmetic and the copies' bookkeeping, which the schedules charge
  to the SM's issue slots;
- the stall clocks ptxas scheduled into the code before, between and after
  those loops (kernels/sass.py outside_stalls), which a CTA waits out once
  (its setup, its pipelines' fill and drain, the epilogue's normalisation and
  layout change through SMEM): for fa2 at D = 64 and 128, 185-2054 clocks a
  warp before the first loop, 47-1030 between the two, 249-2196 after the last.

- the same instruction counts for kernels/fa3_gluon.py, which runs FA3's own
  schedule (triton_smem_fa3_gluon.csv): its consumers mask inside one loop,
  behind a branch, so a step issues the loop's shortest path unmasked and
  all of it masked (kernels/sass.py tensor_loop_paths).

Configs the tables lack get no spills and the schedules' estimates (the tables
are bf16, and fp8 for Triton's fa3; fp16 compiles to the same code but for its
conversions)."""
from __future__ import annotations

import csv
import functools
import os
import warnings
from dataclasses import dataclass

from .errors import ResultsFileError
from .problem import AttentionProblem, TileConfig

RESULTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                       "experiments", "results")
SIXTEEN_BIT = ("bf16", "fp16")


@dataclass(frozen=True)
class Spills:
    """Per thread: the stack frame, and what one iteration of the K/V loop
    stores to it and loads from it; wait_slacks: where the warp waits for the
    reloads, as the clocks it issues between a reload and the instruction that
    needs it (kernels/sass.py spill_wait_slacks; empty: one wait, no slack)."""

    stack_bytes: int
    store_bytes: int
    load_bytes: int
    wait_slacks: tuple[int, ...] = ()

    @property
    def bytes(self) -> int:
        return self.store_bytes + self.load_bytes


@dataclass(frozen=True)
class Compiled:
    """One probed config: registers per thread, SMEM Triton allocates, spills
    (None: none recorded), non-tensor instructions a warp issues per trip
    of the unmasked and the masked loop, and the stall clocks of the code
    before, between and after the loops (None where the probe has no count)."""

    registers: int | None
    smem_bytes: int | None
    spills: Spills | None
    issue: int | None
    issue_masked: int | None
    stalls: tuple[int, int, int] | None = None


NOTHING = Compiled(None, None, None, None, None)


def _int_or_none(row: dict, key: str) -> int | None:
    v = row.get(key)
    return int(v) if v not in (None, "") else None


@functools.lru_cache(maxsize=8)
def _table(name: str) -> dict:
    """(block_m, block_n, num_warps, num_stages, head_dim, causal, dtype[,
    pingpong where the table has it]) -> Compiled, from
    experiments/results/triton_smem_<name>.csv."""
    path = os.path.join(RESULTS, f"triton_smem_{name}.csv")
    table = {}
    if not os.path.exists(path):
        warnings.warn(f"{path} is missing: {name} predictions run on estimates of registers, "
                      f"spills and instructions (regenerate it with experiments/triton_smem_probe.py)")
        return table
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            key = (*(int(r[k]) for k in ("block_m", "block_n", "num_warps", "num_stages",
                                          "head_dim", "causal")), r.get("dtype") or "bf16")
            if "pingpong" in r:
                key += (bool(int(r["pingpong"])),)
            spills = None
            if r.get("spill_store_bytes_per_iter"):
                try:
                    slacks = tuple(int(x) for x in (r.get("spill_wait_slacks") or "").split())
                except ValueError:
                    raise ResultsFileError(f"{path}: spill_wait_slacks must be clock counts separated "
                                           f"by spaces, got {r['spill_wait_slacks']!r}") from None
                spills = Spills(int(r["stack_bytes"] or 0), int(r["spill_store_bytes_per_iter"]),
                                int(r["spill_load_bytes_per_iter"]), slacks)
            stalls = tuple(_int_or_none(r, f"stall_{part}") for part in ("prologue", "between", "epilogue"))
            table[key] = Compiled(_int_or_none(r, "n_regs"), _int_or_none(r, "smem_bytes"), spills,
                                  _int_or_none(r, "issue_per_iter"),
                                  _int_or_none(r, "issue_per_iter_masked"),
                                  None if None in stalls else stalls)
    return table


def compiled(kernel: str, problem: AttentionProblem, launch_warps: int, cfg: TileConfig) -> Compiled:
    """What the probe recorded for `kernel` ("fa2", "fa3", "standard_qk" or "fa1",
    the Triton kernels) at this config launched with `launch_warps` warps;
    NOTHING for configs it did not compile. fp16 reads the bf16 rows (the
    same code but for its conversions); standard_qk computes every tile, so
    its rows are causal 0 whatever the problem."""
    dtype = "bf16" if problem.dtype in SIXTEEN_BIT else problem.dtype
    causal = 0 if kernel == "standard_qk" else int(problem.causal)
    key = (cfg.block_m, cfg.block_n, launch_warps, cfg.num_stages, problem.head_dim, causal, dtype)
    return _table(kernel).get(key, NOTHING)


def fa3_gluon_compiled(problem: AttentionProblem, cfg: TileConfig) -> Compiled:
    """What the probe recorded for kernels/fa3_gluon.py, which runs FA3's
    schedule (experiments/triton_smem_probe.py --gluon-only), at this config
    and pingpong; NOTHING for configs it did not compile (among them fp8,
    which the Gluon kernel does not run)."""
    dtype = "bf16" if problem.dtype in SIXTEEN_BIT else problem.dtype
    key = (cfg.block_m, cfg.block_n, cfg.num_warps, cfg.num_stages, problem.head_dim, int(problem.causal),
           dtype, cfg.pingpong)
    return _table("fa3_gluon").get(key, NOTHING)


def fa2_compiled(problem: AttentionProblem, cfg: TileConfig) -> Compiled:
    return compiled("fa2", problem, cfg.num_warps, cfg)


def fa2_spills(problem: AttentionProblem, cfg: TileConfig) -> Spills | None:
    """The fa2 kernel's spill traffic for this config on sm_90, or None where
    the probe has no row."""
    return fa2_compiled(problem, cfg).spills


def from_compiler(algo: str, problem: AttentionProblem, cfg: TileConfig) -> bool | None:
    """Does the schedule of `algo` at this config take its registers, spills and
    instruction counts from the compiled tables (True), or from estimates
    (False: the probe did not compile it; a large tile's estimate knows no
    spills)? None where the schedule reads no table at the sweep's config."""
    if algo == "fa2":
        return fa2_compiled(problem, cfg) is not NOTHING
    if algo == "fa3":
        return fa3_gluon_compiled(problem, cfg) is not NOTHING
    return None


def fa2_registers(problem: AttentionProblem, cfg: TileConfig) -> int | None:
    """Registers per thread ptxas gave the fa2 kernel for this config on sm_90
    (they decide how many CTAs share an SM), or None where the probe has no row."""
    return fa2_compiled(problem, cfg).registers
