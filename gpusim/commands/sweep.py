"""`gpusim sweep`: predict every (block_m, block_n, warps, stages) of a problem.

    gpusim sweep --gpu h100 --algo fa2 --batch 4 --heads 16 --seqlen 4096 --head-dim 128 \
        [--block-m 64,128] [--block-n 32,64,128] [--warps 4,8] [--stages 2,3,4] \
        [--jobs N | --executor dask [--scheduler tcp://host:8786]] [--out results/]

Writes <out>/sweep_<gpu>_<algo>_<shape>.csv (one row per config; infeasible
ones with feasible=0 and the reason) and .png (heatmaps of runtime over
block_m × block_n per stages and warps), and prints the best configs with
their bottleneck.
"""
from __future__ import annotations

import sys

from algorithms.errors import GpusimError

from ..artifacts import DEFAULT_RESULTS, ensure_dir, parse_int_list, save_figure, write_csv
from ..cli import add_problem_args, problem_from_args
from ..explore import (BLOCK_M, BLOCK_N, EXECUTORS, ROW_FIELDS, STAGES, WARPS, best_rows,
                       config_label, engine_available, plot_heatmaps, run_tasks, sweep_stem,
                       sweep_tasks)
from ..triton_prune import DEFAULT_TOP_K


def _csv(values) -> str:
    return ",".join(str(v) for v in values)


def add_executor_args(p) -> None:
    g = p.add_argument_group("parallelism")
    g.add_argument("--jobs", type=int, default=None,
                   help="worker processes (default: all local cores)")
    g.add_argument("--executor", default="process", choices=EXECUTORS,
                   help="process: local ProcessPoolExecutor; dask: dask.distributed; serial")
    g.add_argument("--scheduler", default=None,
                   help="with --executor dask: scheduler address (default: a LocalCluster here)")
    g.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")


def register(subparsers) -> None:
    p = subparsers.add_parser("sweep", help="predict every block size / warps / stages config; heatmaps")
    add_problem_args(p)
    p.add_argument("--block-m", default=_csv(BLOCK_M), help=f"comma-separated (default {_csv(BLOCK_M)})")
    p.add_argument("--block-n", default=_csv(BLOCK_N), help=f"comma-separated (default {_csv(BLOCK_N)})")
    p.add_argument("--warps", default=_csv(WARPS), help=f"comma-separated (default {_csv(WARPS)})")
    p.add_argument("--stages", default=_csv(STAGES), help=f"comma-separated (default {_csv(STAGES)})")
    p.add_argument("--top", type=int, default=5, help="how many best configs to list")
    p.add_argument("--metric", default="runtime_us", choices=("runtime_us", "tflops"),
                   help="what the heatmaps colour")
    p.add_argument("--no-sim", action="store_true",
                   help="accounting only (no runtimes): rank by bytes requested from global memory")
    p.add_argument("--out", default=str(DEFAULT_RESULTS), help="output folder (default results/)")
    add_executor_args(p)
    p.set_defaults(func=cmd_sweep)


def require_engine(no_sim: bool) -> bool:
    """simulate flag for the tasks; a one-line error if the engine is missing."""
    if no_sim:
        return False
    if not engine_available():
        raise GpusimError("the simulator (gpusim.engine) is not importable here; "
                          "pass --no-sim for the accounting only")
    return True


def cmd_sweep(a) -> int:
    from ..profile import load_profile

    if a.top < 1:
        raise GpusimError(f"--top must be at least 1, got {a.top}")
    gpu = load_profile(a.gpu)
    problem = problem_from_args(a)
    simulate = require_engine(a.no_sim)
    grid = {name: parse_int_list(getattr(a, attr), f"--{name}")
            for name, attr in (("block-m", "block_m"), ("block-n", "block_n"),
                               ("warps", "warps"), ("stages", "stages"))}
    out = ensure_dir(a.out)     # (before the sweep's minutes of predictions, not after)
    tasks = sweep_tasks(a.algo, problem, gpu, grid["block-m"], grid["block-n"], grid["warps"],
                        grid["stages"], simulate=simulate)
    rows = run_tasks(tasks, executor=a.executor, jobs=a.jobs, scheduler=a.scheduler,
                     progress=not a.no_progress, desc=f"sweep {a.algo} on {gpu.name}")
    stem = sweep_stem(a.algo, problem, gpu.name)
    csv_path = write_csv(out / f"{stem}.csv", rows, ROW_FIELDS)
    metric = a.metric if simulate else "l2_read_bytes"
    p = problem
    title = (f"{a.algo} on {gpu.name}: B={p.batch} H={p.heads} KVH={p.kv_heads} N={p.seqlen_q} "
             f"Nkv={p.seqlen_kv} D={p.head_dim}{' causal' if p.causal else ''} {p.dtype}")
    png_path = save_figure(plot_heatmaps(rows, title, metric), out / f"{stem}.png")
    print_summary(rows, a.top, simulate, title)
    print(f"wrote {csv_path}\nwrote {png_path}")
    return 0


ESTIMATED_MARK = "*"


def _label(row: dict) -> str:
    """A config's label, marked where its registers, spills and instructions are
    estimates rather than the compiler's (explore's from_compiler = 0)."""
    return config_label(row) + (ESTIMATED_MARK if row.get("from_compiler") == 0 else "")


def print_estimated_note(listed, file) -> None:
    """Say what the mark means when a listed config carries it."""
    if any(r.get("from_compiler") == 0 for r in listed):
        print(f"  {ESTIMATED_MARK} not in the compiled tables (experiments/triton_smem_probe.py: block_m "
              "64/128 x block_n 32/64/128 x 4/8 warps x 1-4 stages): registers, spills and "
              "instructions estimated; a large tile's estimate knows no spills, so its prediction "
              "may be optimistic", file=file)


def print_shortlist(rows, file) -> None:
    """The configs to autotune: the model's DEFAULT_TOP_K fastest, which
    gpusim.triton's prune hook keeps. The first pick alone was within 5% of
    the measured best in about half of the H100 shapes measured; the best of
    these almost always (docs/experiments.md has the figures)."""
    short = best_rows(rows, DEFAULT_TOP_K)
    if len(short) < 2:
        return
    spread = (short[-1]["runtime_us"] / short[0]["runtime_us"] - 1) * 100
    print(f"  to autotune: the {len(short)} fastest predicted (within +{spread:.0f}% of the first; "
          "gpusim.triton.prune_configs_by keeps them): " + ", ".join(_label(r) for r in short),
          file=file)


def print_summary(rows, top: int, simulate: bool, title: str, file=None) -> None:
    file = file or sys.stdout
    feasible = [r for r in rows if r.get("feasible")]
    print(f"{title}: {len(rows)} configs, {len(feasible)} feasible", file=file)
    reasons: dict[str, int] = {}
    for r in rows:
        if not r.get("feasible"):
            key = r["reason"].split(",")[0] if r["reason"].startswith("out of resource") else r["reason"]
            reasons[key] = reasons.get(key, 0) + 1
    for reason, n in sorted(reasons.items(), key=lambda kv: -kv[1]):
        print(f"  infeasible: {n:4d} × {reason}", file=file)
    best = best_rows(rows, top)
    if not best:
        print("  no feasible config", file=file)
        return
    if simulate:
        print(f"  {'rank':>4}  {'config':<18} {'runtime µs':>11} {'TFLOP/s':>8} {'SMEM KB':>8} "
              f"{'CTA/SM':>6}  bottleneck", file=file)
        for i, r in enumerate(best, 1):
            share = f" ({r['bottleneck_share']:.0%})" if r.get("bottleneck_share") is not None else ""
            print(f"  {i:>4}  {_label(r):<18} {r['runtime_us']:>11,.1f} {r['tflops']:>8.1f} "
                  f"{r['smem_bytes'] / 1024:>8.0f} {r['ctas_per_sm']:>6}  {r['bottleneck']}{share}",
                  file=file)
        print_shortlist(rows, file)
        print_estimated_note(best_rows(rows, max(top, DEFAULT_TOP_K)), file)
    else:
        print("  accounting only (--no-sim): ranked by bytes requested from global memory", file=file)
        print(f"  {'rank':>4}  {'config':<18} {'requested GB':>12} {'SMEM KB':>8} {'CTA/SM':>6}",
              file=file)
        for i, r in enumerate(best, 1):
            print(f"  {i:>4}  {config_label(r):<18} {r['l2_read_bytes'] / 1e9:>12.3f} "
                  f"{r['smem_bytes'] / 1024:>8.0f} {r['ctas_per_sm']:>6}", file=file)
