"""How fast is the simulator? A benchmark, not a timed test.

1. One prediction of each algorithm at 16k tokens (B=1, H=16, N=16384, D=128),
   causal and not, on one core (target: at most 1 s each): the fastest of
   --repeat runs in one warm process (this machine's figures move 10-30%
   from run to run with what else shares its host; the fastest is the one
   least disturbed), each run's time in the note.
2. A sweep of 500 fa2 configs x shapes over all local cores (target: under a minute).

    python experiments/bench_simulator.py [--out experiments/results/bench_simulator.csv]
        [--jobs-out experiments/results/bench_simulator_jobs.csv]

--jobs-out writes each sweep job's own wall time (in its worker) and how many
of its CTAs the engine simulated op by op rather than fast-forwarded, so that
the configs the sweep's time goes to, and why, can be seen; --skip-singles and
--sweep-size N (its first N jobs) make a short run.
"""
from __future__ import annotations

import argparse
import itertools
import os
import platform
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import algorithms  # noqa: E402
from algorithms.errors import GpusimError  # noqa: E402
from algorithms.problem import AttentionProblem, TileConfig  # noqa: E402
from gpusim import predict  # noqa: E402
from gpusim.artifacts import cannot_write, write_csv  # noqa: E402

SWEEP_SIZE = 500


def cpu_model() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def sweep_jobs(size: int = SWEEP_SIZE):
    shapes = [(16384 // n, 2048 // d, n, d, c) for n in (1024, 4096, 16384) for d in (64, 128)
              for c in (False, True)]
    configs = [TileConfig(block_m=bm, block_n=bn, num_warps=w, num_stages=s)
               for bm, bn, w, s in itertools.product((64, 128), (32, 64, 128), (4, 8), (2, 3, 4))]
    jobs = list(itertools.product(shapes, configs))
    return jobs[:: max(1, len(jobs) // SWEEP_SIZE)][:size]


def one(job) -> tuple[str, float, dict]:
    """(outcome, the job's wall seconds in its worker, where they went: the
    GPU's parts simulated and, of one part's CTAs, those run op by op and
    those fast-forwarded; empty where the config does not fit)."""
    (b, h, n, d, c), cfg = job
    t0 = time.perf_counter()
    try:
        pred = predict(AttentionProblem(batch=b, heads=h, seqlen_q=n, head_dim=d, causal=c), cfg, "h100")
        outcome = "ok"
        ctas = {"parts": pred.simulated_parts,
                "ctas_simulated": sum(lp.ctas_simulated for lp in pred.launches),
                "ctas_ghosted": sum(lp.ctas_ghosted for lp in pred.launches)}
    except GpusimError:
        outcome, ctas = "does not fit", {}
    return outcome, time.perf_counter() - t0, ctas


def job_rows(jobs, outcomes, machine: dict) -> list[dict]:
    """One row per sweep job, slowest first."""
    empty = {"parts": "", "ctas_simulated": "", "ctas_ghosted": ""}
    rows = [{"batch": b, "heads": h, "seqlen": n, "head_dim": d, "causal": int(c),
             "config": f"{cfg.block_m}x{cfg.block_n}x{cfg.num_warps}x{cfg.num_stages}",
             "outcome": outcome, "wall_s": round(wall, 3), **empty, **ctas, **machine}
            for ((b, h, n, d, c), cfg), (outcome, wall, ctas) in zip(jobs, outcomes)]
    return sorted(rows, key=lambda r: -r["wall_s"])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "experiments/results/bench_simulator.csv"))
    parser.add_argument("--skip-sweep", action="store_true")
    parser.add_argument("--skip-singles", action="store_true")
    parser.add_argument("--sweep-size", type=int, default=SWEEP_SIZE, help="the sweep's first N jobs only")
    parser.add_argument("--jobs-out", help="CSV of each sweep job's wall time, slowest first")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each single prediction (the fastest is kept)")
    a = parser.parse_args(argv)
    if a.sweep_size < 1:
        parser.error(f"--sweep-size must be at least 1, got {a.sweep_size}")
    # (checked before a run that can take half an hour, not after it)
    if any(cannot_write("bench_simulator", path) for path in (a.out, a.jobs_out) if path):
        return 2
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=ROOT).stdout.strip()
    machine = {"cpu": cpu_model(), "cores": os.cpu_count(), "python": platform.python_version(),
               # other work on the machine slows every figure: record it
               "load_average_1min": round(os.getloadavg()[0], 2),
               "git_commit": commit, "date": time.strftime("%Y-%m-%d"),
               "command": "python experiments/bench_simulator.py"}
    if a.repeat < 1:
        parser.error(f"--repeat must be at least 1, got {a.repeat}")
    args = argv if argv is not None else sys.argv[1:]
    machine["command"] = " ".join(["python experiments/bench_simulator.py", *args])
    # (compiled parts load on first use: a small prediction first, untimed)
    predict(AttentionProblem(batch=1, heads=2, seqlen_q=512, head_dim=64), None, "h100")
    rows = []
    for causal in (False, True) if not a.skip_singles else ():
        for algo in algorithms.ALGORITHMS:
            p = AttentionProblem(batch=1, heads=16, seqlen_q=16384, head_dim=128, causal=causal)
            walls = []
            for _ in range(a.repeat):
                t0 = time.perf_counter()
                pred = predict(p, None, "h100", algo=algo)
                walls.append(time.perf_counter() - t0)
            wall = min(walls)
            runs = " / ".join(f"{w:.2f}" for w in walls)
            rows.append({"what": f"predict {algo} N=16384 D=128 causal={int(causal)}", "wall_s": round(wall, 3),
                         "target_s": 1.0, "met": wall <= 1.0,
                         "note": f"{pred.tflops:.0f} TFLOP/s predicted; runs {runs} s",
                         **machine})
            print(f"{rows[-1]['what']}: {wall:.2f} s", file=sys.stderr, flush=True)
    if not a.skip_sweep:
        jobs = sweep_jobs(a.sweep_size)
        t0 = time.perf_counter()
        with ProcessPoolExecutor(max_workers=os.cpu_count()) as pool:
            outcomes = list(pool.map(one, jobs, chunksize=4))
        wall = time.perf_counter() - t0
        kinds = [outcome for outcome, _, _ in outcomes]
        rows.append({"what": f"sweep of {len(jobs)} fa2 configs x shapes (N 1k-16k), {os.cpu_count()} processes",
                     "wall_s": round(wall, 1), "target_s": 60.0, "met": wall <= 60.0,
                     "note": f"{kinds.count('ok')} predicted, {kinds.count('does not fit')} refused (SMEM)",
                     **machine})
        print(f"{rows[-1]['what']}: {wall:.1f} s", file=sys.stderr)
        per_job = job_rows(jobs, outcomes, machine)
        total = sum(r["wall_s"] for r in per_job)
        slowest = per_job[: max(1, len(per_job) // 10)]
        print(f"the slowest tenth of the jobs took {sum(r['wall_s'] for r in slowest) / total:.0%} of the "
              f"workers' {total:.0f} s:", file=sys.stderr)
        for r in slowest[:10]:
            part = ""
            if r["outcome"] == "ok":
                part = f"{r['ctas_simulated']} of {r['ctas_simulated'] + r['ctas_ghosted']} CTAs simulated"
                if r["parts"] > 1:
                    part += f" (one of {r['parts']} parts)"
            print(f"  {r['wall_s']:6.1f} s  B{r['batch']} H{r['heads']} N{r['seqlen']} D{r['head_dim']} "
                  f"causal={r['causal']} {r['config']}  {part}", file=sys.stderr)
        if a.jobs_out:
            write_csv(a.jobs_out, per_job)
    write_csv(a.out, rows)
    for r in rows:
        print(f"{r['what']:<70} {r['wall_s']:>7} s  target {r['target_s']} s  {'met' if r['met'] else 'MISSED'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
