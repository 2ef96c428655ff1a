"""What the validation measures: the shapes (16k tokens, N 512..16384, head dims 64
and 128, causal and not), fa2's config grid, every kernel's case list, the
measured CSV's columns and where the committed results live.
"""
from __future__ import annotations

import os
import sys

from algorithms.errors import GpusimError
from algorithms.problem import AttentionProblem, TileConfig

from . import ROOT

RESULTS = os.path.join(ROOT, "experiments", "results")
DEFAULT_OUT = os.path.join(RESULTS, "validation_h100.csv")
DEFAULT_NCU = os.path.join(RESULTS, "ncu_h100.csv")
DEFAULT_REPORT = os.path.join(RESULTS, "validation_report.md")
DEFAULT_BOUNDS = os.path.join(RESULTS, "validation_bounds.json")
DEFAULT_GLUON = os.path.join(RESULTS, "kernels_bench_fa3_gluon.csv")


# The schedule that replays each measured kernel, where it is not the kernel's own
# name: Triton 3.6 does not warp-specialise kernels/fa3.py on sm_90, so it runs
# fa2's structure with TMA copies (algorithms/fa3_triton.py), not FA3's schedule;
# FA3's schedule is checked against kernels/fa3_gluon.py, which runs it (gluon_rows).
KERNEL_SCHEDULE = {"fa3": "fa3_triton"}
H100_SMEM_PER_BLOCK = 232448
TOKENS, HIDDEN = 16384, 2048
SEQLENS = (512, 1024, 2048, 4096, 8192, 16384)
HEAD_DIMS = (64, 128)
FA2_GRID = dict(block_m=(64, 128), block_n=(32, 64, 128), num_warps=(4, 8), num_stages=(2, 3, 4))
PROV = ["gpu", "sm_clock_mhz", "driver", "torch", "triton", "git_commit", "date", "command"]
COLUMNS = (["algo", "dtype", "batch", "heads", "kv_heads", "seqlen", "head_dim", "causal",
            "block_m", "block_n", "num_warps", "num_stages", "block_k", "consumer_warpgroups",
            "pingpong", "intra_wg_overlap", "mma", "default_config", "ms", "ms_p20", "ms_p80",
            "tflops", "rel_err", "status", "error",
            # NVML over the row's do_bench (kernels/gpu_monitor.py, blank before session 29): the SM
            # clock NVML reports, the board's power, the share of samples the power cap held the
            # clock. NVML's clock is not what the SMs count under load: fa2 rows read 1980 MHz there
            # while their SMs count 1755-1790 cycles a µs (clock_span_h100.csv, validation_notes.md)
            "run_clock_mhz", "run_power_w", "run_power_cap_share"] + PROV)


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def shapes(quick=False):
    seqlens = (1024, 4096, 16384) if quick else SEQLENS
    out = []
    for d in HEAD_DIMS:
        for causal in (False, True):
            for n in seqlens:
                out.append(AttentionProblem(batch=TOKENS // n, heads=HIDDEN // d, seqlen_q=n, head_dim=d,
                                            causal=causal, dtype="bf16"))
    return out


def fa2_configs(problem, quick=False):
    """Every fa2 config of the grid that fits the H100's SMEM per block (algorithms.check)."""
    import algorithms
    import itertools

    grid = FA2_GRID if not quick else dict(block_m=(64, 128), block_n=(32, 64, 128), num_warps=(4, 8),
                                           num_stages=(3,))
    out = []
    for bm, bn, w, s in itertools.product(*grid.values()):
        cfg = TileConfig(block_m=bm, block_n=bn, num_warps=w, num_stages=s)
        try:
            algorithms.check("fa2", problem, cfg, H100_SMEM_PER_BLOCK)
        except GpusimError:
            continue
        out.append(cfg)
    return out


def suite_cases(quick=False):
    """(algo, problem, config, is_default) in the order they are measured: first every algorithm's
    default config on every shape (so a cut-short run still covers every algorithm), then the
    fa2 config sweep shape by shape."""
    from algorithms.defaults import default_config

    first, sweep = [], []
    for p in shapes(quick):
        for algo in ("standard", "fa1", "fa2", "fa3"):
            first.append((algo, p, default_config(algo, p, hopper=True), True))
        p8 = p.with_(dtype="fp8")
        first.append(("fa3", p8, default_config("fa3", p8, hopper=True), True))
    for p in shapes(quick):
        dflt = default_config("fa2", p, hopper=True)
        for cfg in fa2_configs(p, quick):
            if cfg != dflt:
                sweep.append(("fa2", p, cfg, False))
    return first + sweep
