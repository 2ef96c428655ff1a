"""Autotune with and without gpusim's pruning hook, on the GPU machine.

What it measures, per shape (16k tokens at hidden 2048: batch = 16384 / N,
heads = 2048 / D, bf16, forward):
  * full:   triton.autotune over the whole grid (block_m ∈ {64,128} × block_n ∈
            {32,64,128} × warps ∈ {4,8} × stages ∈ {2,3,4}, 36 configs);
  * pruned: the same autotune with prune_configs_by=gpusim.triton.prune_configs_by(
            top_k=k): only the k configs the simulator ranks fastest are compiled
            and benchmarked, for each k of --top-k (default 3 and 8).
For each: the wall time of the first call (autotune = compile + benchmark every
surviving config + run), the config Triton picked, and that config's speed
(triton.testing.do_bench, median, L2 flushed by do_bench between runs).

The autotuner is Triton's own `triton.autotune` wrapped around the jit kernel
of kernels/fa2.py (`_fa2_fwd`, launched with the same arguments and grid as
kernels.fa2.forward): kernels/ has no autotuned entry point, so the wrapper is
built here; nothing is emulated. Each (shape, mode) runs in a fresh subprocess
with an empty TRITON_CACHE_DIR so both modes pay their compile times.

The GPU machine has no simpy: predictions are computed beforehand on a CPU
machine with the engine and committed as JSON, which the hook reads
(gpusim.triton.PrecomputedPredictor):

    # CPU machine with the simulator (once, or when the model changes):
    PYTHONPATH=. python experiments/autotune_prune.py precompute
    # GPU machine (no network, no pip):
    PYTHONPATH=. python experiments/autotune_prune.py run [--seqlens 4096] [--head-dims 64,128]
        [--top-k 3,8]
    # runs split across several GPU calls, made one report:
    PYTHONPATH=. python experiments/autotune_prune.py report RUN1.csv RUN2.csv

Writes experiments/results/autotune_prune_predictions_h100.json (precompute),
experiments/results/autotune_prune_h100.csv (one row per shape and mode, with
provenance), autotune_prune_timings_h100.csv (every config Triton benchmarked)
and autotune_prune_h100.md (the comparison).
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script: make the repo importable
    sys.path.insert(0, str(ROOT))

from algorithms.errors import GpusimError, ResultsFileError  # noqa: E402
from kernels.provenance import git_commit, provenance  # noqa: E402

RESULTS = ROOT / "experiments" / "results"
PREDICTIONS = RESULTS / "autotune_prune_predictions_h100.json"
GRID = {"block_m": (64, 128), "block_n": (32, 64, 128), "warps": (4, 8), "stages": (2, 3, 4)}
SEQLENS = (512, 1024, 2048, 4096, 8192, 16384)
RUN_SEQLENS = (4096,)
HEAD_DIMS = (64, 128)
TOKENS, HIDDEN = 16384, 2048
COLUMNS = ["seqlen", "head_dim", "causal", "batch", "heads", "dtype", "mode", "top_k", "configs_total",
           "configs_benchmarked", "autotune_s", "bench_s", "block_m", "block_n", "num_warps",
           "num_stages", "median_ms", "tflops", "max_abs_err_vs_sdpa", "predicted_rank_of_choice",
           "status", "predictions", "gpu", "sm_clock_mhz", "driver", "torch", "triton", "git_commit", "date",
           "command"]


def shape(seqlen: int, head_dim: int, causal: bool):
    from algorithms.problem import AttentionProblem

    return AttentionProblem(batch=TOKENS // seqlen, heads=HIDDEN // head_dim, seqlen_q=seqlen,
                            head_dim=head_dim, causal=causal, dtype="bf16")


def grid_tile_configs():
    from algorithms.problem import TileConfig

    return [TileConfig(block_m=m, block_n=n, num_warps=w, num_stages=s)
            for m in GRID["block_m"] for n in GRID["block_n"] for w in GRID["warps"]
            for s in GRID["stages"]]


def _ints(text, name: str) -> list[int]:
    """--seqlens, --head-dims, --top-k: positive integers; --causal: 0 and/or 1."""
    from gpusim.artifacts import parse_int_list, parse_str_list

    if name == "--causal":
        return [int(c) for c in parse_str_list(text, name, ("0", "1"))]
    return parse_int_list(text, name, minimum=1)


# ---------------------------------------------------------------------------
# CPU side: predictions

def cmd_precompute(a) -> int:
    from gpusim.triton import write_predictions

    problems = [shape(n, d, bool(c)) for n in _ints(a.seqlens, "--seqlens")
                for d in _ints(a.head_dims, "--head-dims") for c in _ints(a.causal, "--causal")]
    data = write_predictions(a.predictions, problems, grid_tile_configs(), gpu=a.gpu, algo="fa2",
                             jobs=a.jobs, progress=not a.no_progress, simulate=not a.no_sim,
                             meta={"git_commit": git_commit(), "command": "PYTHONPATH=. python "
                                   "experiments/autotune_prune.py " + " ".join(sys.argv[1:]),
                                   "date": _dt.datetime.now(_dt.timezone.utc).isoformat(
                                       timespec="seconds")})
    n_ok = sum(e["runtime_us"] is not None for e in data["entries"])
    print(f"wrote {a.predictions}: {len(data['entries'])} predictions ({n_ok} feasible)"
          + ("" if data["simulated"] else " -- accounting only, NO runtimes: pruning needs --sim"))
    return 0


# ---------------------------------------------------------------------------
# GPU side

def build_tuner(mode: str, top_k: int, predictions: str):
    """triton.autotune around kernels/fa2.py's jit kernel; `mode` pruned adds
    gpusim's hook reading the precomputed predictions."""
    import triton

    import gpusim.triton as gt
    from kernels import fa2 as K

    configs = gt.configs(GRID["block_m"], GRID["block_n"], GRID["warps"], GRID["stages"])
    prune = None
    if mode == "pruned":
        prune = gt.prune_configs_by(gpu="h100", algo="fa2", top_k=top_k,
                                    predictor=gt.PrecomputedPredictor(predictions))
    tuner = triton.autotune(configs=configs, key=["n_q", "n_kv", "HEAD_DIM", "CAUSAL"],
                            prune_configs_by=prune)(K._fa2_fwd)
    return tuner, configs, prune


def launch_args(problem, q, k, v, o, lse):
    """The autotuned kernel's arguments, as kernels.fa2.forward launches it
    (its own helper: a copy here had fallen behind the kernel's signature)."""
    import math

    from kernels import fa2 as K

    return K.kernel_arguments(problem, q, k, v, o, lse, 1.0 / math.sqrt(problem.head_dim))


def cmd_worker(a) -> int:
    """One autotune in this process (fresh Triton cache set by the parent);
    prints one JSON line."""
    import torch
    import triton
    import triton.testing

    from kernels.common import make_inputs

    problem = shape(a.seqlen, a.head_dim, bool(a.causal))
    p = problem
    q, k, v = make_inputs(p.batch, p.heads, p.seqlen_q, p.head_dim, dtype=torch.bfloat16,
                          device="cuda", generator=torch.Generator().manual_seed(0))
    o = torch.empty_like(q)
    lse = torch.empty(q.shape[:3], dtype=torch.float32, device="cuda")
    tuner, configs, prune = build_tuner(a.mode, a.top_k, a.predictions)
    args, kwargs = launch_args(p, q, k, v, o, lse)

    def grid(meta):
        return (triton.cdiv(p.seqlen_q, meta["BLOCK_M"]), p.batch * p.heads)

    def call():
        tuner[grid](*args, **kwargs)

    torch.cuda.synchronize()
    t0 = time.perf_counter()
    call()
    torch.cuda.synchronize()
    autotune_s = time.perf_counter() - t0
    best = tuner.best_config
    ms = triton.testing.do_bench(call, return_mode="median")
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=p.causal)
    err = (o.float() - ref.float()).abs().max().item()
    timings = [{"block_m": c.kwargs["BLOCK_M"], "block_n": c.kwargs["BLOCK_N"],
                "num_warps": c.num_warps, "num_stages": c.num_stages,
                "median_ms": (t[0] if isinstance(t, (list, tuple)) else t)}
               for c, t in getattr(tuner, "configs_timings", {}).items()]
    rank = None
    if prune is not None:
        hook = prune["early_config_prune"]
        order = [(r.tile.block_m, r.tile.block_n, r.tile.num_warps, r.tile.num_stages)
                 for r in hook.last if r.feasible]
        key = (best.kwargs["BLOCK_M"], best.kwargs["BLOCK_N"], best.num_warps, best.num_stages)
        rank = order.index(key) + 1 if key in order else None
    print(json.dumps({"autotune_s": autotune_s, "bench_s": getattr(tuner, "bench_time", None),
                      "configs_total": len(configs), "configs_benchmarked": len(timings),
                      "block_m": best.kwargs["BLOCK_M"], "block_n": best.kwargs["BLOCK_N"],
                      "num_warps": best.num_warps, "num_stages": best.num_stages,
                      "median_ms": ms, "tflops": p.reference_flops() / (ms * 1e-3) / 1e12,
                      "max_abs_err_vs_sdpa": err, "predicted_rank_of_choice": rank,
                      "timings": timings}))
    return 0


def run_one(seqlen, head_dim, causal, mode, top_k, predictions, timeout_s) -> dict:
    with tempfile.TemporaryDirectory(prefix="triton-cache-") as cache:
        env = dict(os.environ, TRITON_CACHE_DIR=cache, PYTHONPATH=str(ROOT))
        env.pop("TRITON_PRINT_AUTOTUNING", None)
        cmd = [sys.executable, "-m", "experiments.autotune_prune", "_worker", "--seqlen", str(seqlen),
               "--head-dim", str(head_dim), "--causal", str(int(causal)), "--mode", mode,
               "--top-k", str(top_k), "--predictions", str(predictions)]
        try:
            proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True,
                                  timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return {"status": f"timeout after {timeout_s} s"}
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return {"status": f"failed: {tail[:200]}"}
    out = json.loads(lines[-1])
    out["status"] = "ok"
    return out


def markdown(rows, prov, predictions: str = "") -> str:
    """One line per shape and k: full autotune against the autotune of the
    simulator's k fastest configs; then, per k, the mean time saved and how
    often the pruned pick ran within 5% of full autotune's."""
    from gpusim.artifacts import markdown_table
    from gpusim.explore import config_label

    full, pruned = {}, {}
    for r in rows:
        shape = (r["seqlen"], r["head_dim"], r["causal"])
        if r["mode"] == "full":
            full[shape] = r
        else:
            pruned[(shape, int(r["top_k"]))] = r
    body, by_k, same = [], {}, []
    for (shape, k), p in sorted(pruned.items()):
        f = full.get(shape, {})
        if f.get("status") != "ok" or p.get("status") != "ok":
            body.append([*shape, k, f.get("status", "-"), p.get("status", "-"), "", "", "", "", "", ""])
            continue
        loss = (p["median_ms"] / f["median_ms"] - 1) * 100
        if config_label(p) == config_label(f):
            same.append(loss)
        saved = f["autotune_s"] / p["autotune_s"]
        by_k.setdefault(k, []).append((saved, loss))
        body.append([*shape, k, f"{f['autotune_s']:.1f}", f"{p['autotune_s']:.1f}", f"{saved:.1f}×",
                     config_label(f), f"{f['median_ms']:.3f}", config_label(p), f"{p['median_ms']:.3f}",
                     f"{loss:+.1f}%"])
    header = ["N", "D", "causal", "k", "full autotune s", "pruned autotune s", "saved",
              "full pick", "full ms", "pruned pick", "pruned ms", "pruned vs full"]
    summary = [f"- k = {k}: autotune {sum(s for s, _ in v) / len(v):.1f}× faster (mean); the pruned "
               f"pick within 5% of full autotune's in {sum(x <= 5 for _, x in v)} of {len(v)} shapes, "
               f"mean {sum(x for _, x in v) / len(v):+.1f}%, worst {max(x for _, x in v):+.1f}%"
               for k, v in sorted(by_k.items())]
    if same:
        summary.append(f"- where both chose the same config ({len(same)} times), its two timings, "
                       f"each in its own process, differ by {min(same):+.1f}…{max(same):+.1f}%: "
                       "how far one timing of a config is from another")
    return ("# Autotune with and without gpusim pruning (fa2, H100)\n\n"
            f"GPU {prov['gpu']}, SM clock {prov['sm_clock_mhz']} MHz, driver {prov['driver']}, "
            f"torch {prov['torch']}, triton {prov['triton']}, commit {prov['git_commit']}, "
            f"{prov['date']}.\n\nCommand: `{prov['command']}`\n\n"
            + (f"Predictions: {predictions}\n\n" if predictions else "")
            + f"Search space: {len(grid_tile_configs())} configs (block_m {GRID['block_m']}, block_n "
            f"{GRID['block_n']}, warps {GRID['warps']}, stages {GRID['stages']}); pruned (k) keeps "
            "the simulator's k fastest. Autotune time = first call with an empty Triton cache "
            "(compile + benchmark + run), each in its own process. ms = triton.testing.do_bench "
            "median of the chosen config, timed in that process.\n\n"
            + ("\n".join(summary) + "\n\n" if summary else "")
            + markdown_table(header, body))


def cmd_run(a) -> int:
    from experiments import gpu_probe
    from gpusim.artifacts import atomic_write_text, repo_relative, write_csv

    lists = {name: _ints(getattr(a, name[2:].replace("-", "_")), name)   # (before the GPU is probed)
             for name in ("--seqlens", "--head-dims", "--causal", "--top-k")}
    if gpu_probe.start("autotune_prune.py", str(Path(a.out) / "autotune_prune_h100.csv"), None) is None:
        return 2
    if not Path(a.predictions).is_file():
        print(f"autotune_prune run: {a.predictions} is missing; run `precompute` on a machine "
              "with the simulator first", file=sys.stderr)
        return 2
    command = "PYTHONPATH=. python experiments/autotune_prune.py " + " ".join(sys.argv[1:])
    prov = provenance(command)
    with open(a.predictions) as f:
        meta = json.load(f)
    about = (f"`{repo_relative(a.predictions)}` ({meta.get('gpu')}, commit {meta.get('git_commit', '?')}, "
             f"{meta.get('date', '?')}: `{meta.get('command', '?')}`)")
    rows, timing_rows = [], []
    start = time.time()
    out_csv = Path(a.out) / "autotune_prune_h100.csv"
    for n in lists["--seqlens"]:
        for d in lists["--head-dims"]:
            for c in lists["--causal"]:
                for mode, k in [("full", "")] + [("pruned", k) for k in lists["--top-k"]]:
                    if time.time() - start > a.budget_s:
                        print(f"budget of {a.budget_s} s spent; stopping", file=sys.stderr)
                        break
                    res = run_one(n, d, c, mode, k or 1, a.predictions, a.timeout_s)  # (full: k unused)
                    p = shape(n, d, bool(c))
                    row = {"seqlen": n, "head_dim": d, "causal": c, "batch": p.batch,
                           "heads": p.heads, "dtype": p.dtype, "mode": mode, "top_k": k, **res,
                           "predictions": about, **prov}
                    for t in row.pop("timings", []) or []:
                        timing_rows.append({"seqlen": n, "head_dim": d, "causal": c, "mode": mode,
                                            "top_k": k, **t, **prov})
                    rows.append(row)
                    print(f"N={n} D={d} causal={c} {mode}{k}: {res.get('status')} "
                          f"autotune {res.get('autotune_s', float('nan')):.1f} s, pick "
                          f"{res.get('block_m')}x{res.get('block_n')} w{res.get('num_warps')} "
                          f"s{res.get('num_stages')} {res.get('median_ms', float('nan')):.3f} ms",
                          file=sys.stderr, flush=True)
                    # written after every run: a cut-off session keeps what it measured
                    write_csv(out_csv, rows, COLUMNS)
                    write_csv(Path(a.out) / "autotune_prune_timings_h100.csv", timing_rows)
                    atomic_write_text(Path(a.out) / "autotune_prune_h100.md", markdown(rows, prov, about))
    print(markdown(rows, prov, about))
    return 0


def read_run_rows(path) -> list[dict]:
    """The rows of a run's autotune_prune_h100.csv, times as numbers."""
    from gpusim.artifacts import read_csv_rows

    rows = read_csv_rows(path)
    missing = [c for c in ("seqlen", "head_dim", "causal", "mode", "top_k", "status", "autotune_s",
                           "median_ms", "block_m", "block_n", "num_warps", "num_stages")
               if rows and c not in rows[0]]
    if not rows or missing:
        raise ResultsFileError(f"{path}: " + (f"missing columns {', '.join(missing)}" if rows
                                              else "no rows"))
    for r in rows:
        for key in ("seqlen", "head_dim", "causal"):
            r[key] = int(r[key])
        if r["status"] == "ok":
            try:
                r["autotune_s"], r["median_ms"] = float(r["autotune_s"]), float(r["median_ms"])
            except ValueError:
                raise ResultsFileError(f"{path}: a row with status ok has no autotune_s or median_ms") from None
    return rows


def cmd_report(a) -> int:
    """Runs split across several calls (a GPU command may last 10 minutes) made
    into one CSV and report; provenance from the runs' own rows."""
    from gpusim.artifacts import atomic_write_text, write_csv

    rows = [r for path in a.runs for r in read_run_rows(path)]
    prov = {k: rows[0].get(k, "") for k in ("gpu", "sm_clock_mhz", "driver", "torch", "triton",
                                              "git_commit")}
    prov["date"] = ", ".join(dict.fromkeys(r.get("date", "") for r in rows))
    prov["command"] = "`; `".join(dict.fromkeys(r.get("command", "") for r in rows))
    for key in ("gpu", "git_commit"):
        if len({r.get(key) for r in rows}) > 1:
            raise ResultsFileError(f"the runs differ in {key}: {sorted({r.get(key) for r in rows})}")
    md = markdown(rows, prov, rows[0].get("predictions", ""))
    write_csv(Path(a.out) / "autotune_prune_h100.csv", rows, COLUMNS)
    atomic_write_text(Path(a.out) / "autotune_prune_h100.md", md)
    print(md)
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("precompute", help="CPU: predict the grid for the anchor shapes into JSON")
    p.add_argument("--seqlens", default=",".join(map(str, SEQLENS)))
    p.add_argument("--head-dims", default=",".join(map(str, HEAD_DIMS)))
    p.add_argument("--causal", default="0,1")
    p.add_argument("--gpu", default="h100")
    p.add_argument("--predictions", default=str(PREDICTIONS))
    p.add_argument("--jobs", type=int, default=None)
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--no-sim", action="store_true", help="(testing only) accounting, no runtimes")
    p.set_defaults(func=cmd_precompute)
    p = sub.add_parser("run", help="GPU: autotune with and without pruning")
    p.add_argument("--seqlens", default=",".join(map(str, RUN_SEQLENS)))
    p.add_argument("--head-dims", default=",".join(map(str, HEAD_DIMS)))
    p.add_argument("--causal", default="0,1")
    p.add_argument("--top-k", default="3,8",
                   help="comma-separated k: one pruned autotune keeping the simulator's k fastest, each")
    p.add_argument("--predictions", default=str(PREDICTIONS))
    p.add_argument("--out", default=str(RESULTS))
    p.add_argument("--budget-s", type=float, default=480, help="start no new run after this")
    p.add_argument("--timeout-s", type=float, default=300, help="per (shape, mode) subprocess")
    p.set_defaults(func=cmd_run)
    p = sub.add_parser("report", help="CPU: one report from the CSVs of several runs")
    p.add_argument("runs", nargs="+", help="autotune_prune_h100.csv files of `run`")
    p.add_argument("--out", default=str(RESULTS))
    p.set_defaults(func=cmd_report)
    p = sub.add_parser("_worker", help=argparse.SUPPRESS)
    p.add_argument("--seqlen", type=int, required=True)
    p.add_argument("--head-dim", type=int, required=True)
    p.add_argument("--causal", type=int, default=0)
    p.add_argument("--mode", choices=("full", "pruned"), required=True)
    p.add_argument("--top-k", type=int, default=3)
    p.add_argument("--predictions", default=str(PREDICTIONS))
    p.set_defaults(func=cmd_worker)
    a = ap.parse_args(argv)
    try:
        return a.func(a)
    except GpusimError as e:
        print(f"autotune_prune: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
