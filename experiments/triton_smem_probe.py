"""Cross-compile the fa2 (and fa3, standard's QKᵀ and fa1) Triton kernels for sm_90 on a CPU and record
the shared memory Triton allocates (metadata.shared), the registers per
thread ptxas assigns, for fa2 the register spills (stack frame, and the
bytes a thread stores and reloads per iteration of the hot loop, read off the
SASS), the instructions a warp issues per trip of the unmasked and the masked
K/V loop besides its wgmma, and the stall clocks ptxas scheduled into the code
before, between and after those loops (kernels/sass.py), for the grid of configs
the simulator must cover. algorithms/compiled.py reads them back for the
schedules.

    PYTHONPATH=. python experiments/triton_smem_probe.py [--jobs 2] [--quick] [--fa3 | --fa3-only | --standard-only | --fa1-only | --gluon-only]

Writes experiments/results/triton_smem_fa2.csv (and triton_smem_fa3.csv with
--fa3, triton_smem_standard_qk.csv with --standard-only: standard's QKᵀ kernel,
which computes every tile, so causal 0 only; triton_smem_fa1.csv with --fa1-only:
kernels/fa1.py at one stage, its launcher's default, SMEM and registers only;
triton_smem_fa3_gluon.csv with
--gluon-only: kernels/fa3_gluon.py, FA3's own schedule, over the configs it
runs, pingpong and not, its consumers' instructions a step unmasked and masked). No GPU needed: triton.compile with GPUTarget("cuda", 90, 32) runs the
whole pipeline down to a cubin with the bundled ptxas.
"""
from __future__ import annotations

import argparse
import csv
import datetime as _dt
import itertools
import os
import sys
from concurrent.futures import ProcessPoolExecutor

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

H100_SMEM_PER_BLOCK = 232448  # bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin on H100
SEQLEN = 4096  # a multiple of 16 and of every block: the launcher's common specialisation

# spill_wait_slacks: where the hot loop waits for its reloads (kernels/sass.py spill_wait_slacks)
SPILL_COLUMNS = ["stack_bytes", "spill_store_bytes_per_iter", "spill_load_bytes_per_iter", "spill_wait_slacks"]
# non-tensor instructions a warp issues per trip of the unmasked and the masked K/V loop
# (the schedules charge them), and once per CTA outside them (SASS; recorded, not charged:
# charged at a CTA's start or end, 600-1100 instructions a warp took 4-8 points off the
# small-N errors but moved the fast path 4-7% off the full simulation in two cases)
ISSUE_COLUMNS = ["issue_per_iter", "issue_per_iter_masked", "issue_outside_loops"]
# the stall clocks ptxas scheduled into the code before, between and after the K/V loops
# (kernels/sass.py outside_stalls): the schedules wait them out once per CTA
STALL_COLUMNS = ["stall_prologue", "stall_between", "stall_epilogue"]
COLUMNS = ["block_m", "block_n", "num_warps", "num_stages", "head_dim", "causal", "dtype",
           "smem_bytes", "n_regs", "exceeds_h100", *SPILL_COLUMNS, *ISSUE_COLUMNS, *STALL_COLUMNS,
           "triton_version",
           "target", "date",
           "command"]


def _one(args):
    algo, bm, bn, warps, stages, d, causal, dtype = args
    from algorithms.problem import AttentionProblem, TileConfig

    if algo == "fa2":
        from kernels.fa2 import compiled_resources
    elif algo == "fa3":
        from kernels.fa3 import compiled_resources
    elif algo == "fa1":
        from kernels.fa1 import compiled_resources
    else:
        from kernels.standard import compiled_resources
    p = AttentionProblem(batch=1, heads=16, seqlen_q=SEQLEN, head_dim=d, causal=bool(causal), dtype=dtype)
    cfg = TileConfig(block_m=bm, block_n=bn, num_warps=warps, num_stages=stages)
    try:
        r = compiled_resources(p, cfg, target=(90,))
        return args, r, ""
    except Exception as e:  # a config Triton refuses to compile is a data point too
        return args, {}, f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"


GLUON_COLUMNS = ["block_m", "block_n", "num_warps", "num_stages", "head_dim", "causal", "dtype", "pingpong",
                 "smem_bytes", "n_regs", "stack_bytes", "issue_per_iter", "issue_per_iter_masked",
                 "triton_version", "target", "date", "command"]


def _gluon_config(consumers: int, bn: int, stages: int, pingpong: int):
    """The Gluon kernel's TileConfig with `consumers` consumer warpgroups (and its producer's)."""
    from algorithms.problem import TileConfig
    from kernels.fa3_gluon import ROWS_PER_CONSUMER

    return TileConfig(block_m=ROWS_PER_CONSUMER * consumers, block_n=bn, num_warps=4 * (consumers + 1),
                      num_stages=stages, mma="wgmma", consumer_warpgroups=consumers, pingpong=bool(pingpong))


def _one_gluon(args):
    consumers, bn, stages, d, causal, pingpong = args
    from algorithms.errors import GpusimError
    from algorithms.problem import AttentionProblem
    from kernels.fa3_gluon import compiled_info

    p = AttentionProblem(batch=1, heads=16, seqlen_q=SEQLEN, head_dim=d, causal=bool(causal))
    try:
        return args, compiled_info(p, _gluon_config(consumers, bn, stages, pingpong), pingpong=bool(pingpong)), ""
    except GpusimError as e:    # a config the kernel refuses (SMEM): left out
        return args, None, str(e)
    except Exception as e:  # a config Triton refuses to compile is a data point too
        return args, {}, f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"


def probe_gluon(jobs: int, outdir: str, command: str) -> None:
    """triton_smem_fa3_gluon.csv: the Gluon FA3 kernel over 2 and 3 consumer
    warpgroups, block_n 64 and 128, 2-4 stages, D 64 and 128, causal and not,
    pingpong and not (bf16; fp16 compiles to the same code but for its
    conversions)."""
    import triton

    grid = list(itertools.product([2, 3], [64, 128], [2, 3, 4], [64, 128], [0, 1], [0, 1]))
    rows = []
    with ProcessPoolExecutor(max_workers=jobs) as ex:
        for n, (args, res, err) in enumerate(ex.map(_one_gluon, grid), 1):
            print(f"[fa3_gluon {n}/{len(grid)}] {args} {err or ''}", file=sys.stderr, flush=True)
            if res is None:
                continue
            consumers, bn, stages, d, causal, pingpong = args
            cfg = _gluon_config(consumers, bn, stages, pingpong)
            rows.append({"block_m": cfg.block_m, "block_n": bn, "num_warps": cfg.num_warps,
                         "num_stages": stages, "head_dim": d, "causal": causal, "dtype": "bf16",
                         "pingpong": pingpong,
                         **{k: "" if res.get(k) is None else res[k]
                            for k in ("smem_bytes", "n_regs", "stack_bytes", "issue_per_iter",
                                      "issue_per_iter_masked")},
                         "triton_version": triton.__version__, "target": "cuda:90",
                         "date": _dt.date.today().isoformat(), "command": command})
    _write(os.path.join(outdir, "triton_smem_fa3_gluon.csv"), GLUON_COLUMNS, rows)


def _write(path: str, columns: list[str], rows: list[dict]) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=columns)
        w.writeheader()
        w.writerows(rows)
    os.replace(tmp, path)
    print(f"wrote {path} ({len(rows)} rows)", file=sys.stderr)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--quick", action="store_true", help="head_dim 128 only")
    ap.add_argument("--fa3", action="store_true", help="also probe kernels.fa3 (bf16 and fp8)")
    ap.add_argument("--fa3-only", action="store_true", help="probe kernels.fa3 alone")
    ap.add_argument("--standard-only", action="store_true", help="probe standard's QKᵀ kernel alone")
    ap.add_argument("--fa1-only", action="store_true", help="probe kernels.fa1 alone (one stage)")
    ap.add_argument("--gluon-only", action="store_true", help="probe kernels.fa3_gluon alone")
    ap.add_argument("--outdir", default=os.path.join("experiments", "results"))
    a = ap.parse_args(argv)
    from gpusim.artifacts import cannot_write

    if cannot_write("triton_smem_probe", os.path.join(a.outdir, "triton_smem_fa2.csv")):
        return 2    # (before minutes of compiles, not after)
    import triton

    command = "python " + " ".join(["experiments/triton_smem_probe.py"] + (argv if argv is not None else sys.argv[1:]))
    if a.gluon_only:
        probe_gluon(a.jobs, a.outdir, command)
        return
    if a.standard_only:
        algos = ["standard_qk"]
    elif a.fa1_only:
        algos = ["fa1"]
    else:
        algos = (["fa2"] if not a.fa3_only else []) + (["fa3"] if a.fa3 or a.fa3_only else [])
    dims = [128] if a.quick else [64, 128, 256]
    date = _dt.date.today().isoformat()
    for algo in algos:
        # fa3: Triton's TMA kernel, bf16 and its fp8 twin, with >= 2 stages for the ring
        dtypes = ["bf16", "fp8"] if algo == "fa3" else ["bf16"]
        grid = list(itertools.product([algo], [64, 128], [32, 64, 128], [4, 8], [1, 2, 3, 4], dims, [0, 1],
                                      dtypes))
        if algo == "fa3":
            grid = [g for g in grid if g[4] >= 2]
        if algo == "standard_qk":     # every tile computed: causal changes nothing
            grid = [g for g in grid if g[6] == 0]
        if algo == "fa1":             # its launcher's one stage: the loops are not pipelined
            grid = [g for g in grid if g[4] == 1]
        rows = []
        with ProcessPoolExecutor(max_workers=a.jobs) as ex:
            for n, (args, res, err) in enumerate(ex.map(_one, grid), 1):
                _, bm, bn, warps, stages, d, causal, dtype = args
                smem, regs = res.get("smem_bytes"), res.get("n_regs")
                rows.append({"block_m": bm, "block_n": bn, "num_warps": warps, "num_stages": stages,
                             "head_dim": d, "causal": causal, "dtype": dtype,
                             "smem_bytes": "" if smem is None else smem,
                             "n_regs": "" if regs is None else regs,
                             "exceeds_h100": "" if smem is None else int(smem > H100_SMEM_PER_BLOCK),
                             **{k: "" if res.get(k) is None else res[k]
                                for k in (*SPILL_COLUMNS, *ISSUE_COLUMNS, *STALL_COLUMNS)},
                             "triton_version": triton.__version__, "target": "cuda:90",
                             "date": date, "command": command})
                print(f"[{algo} {n}/{len(grid)}] {args[1:]} smem={smem} regs={regs} {err}",
                      file=sys.stderr, flush=True)
        _write(os.path.join(a.outdir, f"triton_smem_{algo}.csv"), COLUMNS, rows)


if __name__ == "__main__":
    sys.exit(main())
