"""How fast is the simulator? A benchmark, not a timed test.

1. One prediction of each algorithm at 16k tokens (B=1, H=16, N=16384, D=128),
   causal and not, on one core (target: at most 1 s each): the fastest of
   --repeat runs in one warm process (this machine's figures move 10-30%
   from run to run with what else shares its host; the fastest is the one
   least disturbed), each run's time in the note.
2. A sweep of 500 fa2 configs x shapes over all local cores (target: under a minute).

    python experiments/bench_simulator.py [--out experiments/results/bench_simulator.csv]
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
from gpusim.artifacts import write_csv  # noqa: E402

SWEEP_SIZE = 500


def cpu_model() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def sweep_jobs():
    shapes = [(16384 // n, 2048 // d, n, d, c) for n in (1024, 4096, 16384) for d in (64, 128)
              for c in (False, True)]
    configs = [TileConfig(block_m=bm, block_n=bn, num_warps=w, num_stages=s)
               for bm, bn, w, s in itertools.product((64, 128), (32, 64, 128), (4, 8), (2, 3, 4))]
    jobs = list(itertools.product(shapes, configs))
    return jobs[:: max(1, len(jobs) // SWEEP_SIZE)][:SWEEP_SIZE]


def one(job):
    (b, h, n, d, c), cfg = job
    try:
        predict(AttentionProblem(batch=b, heads=h, seqlen_q=n, head_dim=d, causal=c), cfg, "h100")
        return "ok"
    except GpusimError:
        return "does not fit"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "experiments/results/bench_simulator.csv"))
    parser.add_argument("--skip-sweep", action="store_true")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each single prediction (the fastest is kept)")
    a = parser.parse_args(argv)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=ROOT).stdout.strip()
    machine = {"cpu": cpu_model(), "cores": os.cpu_count(), "python": platform.python_version(),
               # other work on the machine slows every figure: record it
               "load_average_1min": round(os.getloadavg()[0], 2),
               "git_commit": commit, "date": time.strftime("%Y-%m-%d"),
               "command": "python experiments/bench_simulator.py"}
    if a.repeat < 1:
        parser.error(f"--repeat must be at least 1, got {a.repeat}")
    machine["command"] += f" --repeat {a.repeat}"
    # (compiled parts load on first use: a small prediction first, untimed)
    predict(AttentionProblem(batch=1, heads=2, seqlen_q=512, head_dim=64), None, "h100")
    rows = []
    for causal in (False, True):
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
        jobs = sweep_jobs()
        t0 = time.perf_counter()
        with ProcessPoolExecutor(max_workers=os.cpu_count()) as pool:
            outcomes = list(pool.map(one, jobs, chunksize=4))
        wall = time.perf_counter() - t0
        rows.append({"what": f"sweep of {len(jobs)} fa2 configs x shapes (N 1k-16k), {os.cpu_count()} processes",
                     "wall_s": round(wall, 1), "target_s": 60.0, "met": wall <= 60.0,
                     "note": f"{outcomes.count('ok')} predicted, {outcomes.count('does not fit')} refused (SMEM)",
                     **machine})
        print(f"{rows[-1]['what']}: {wall:.1f} s", file=sys.stderr)
    write_csv(a.out, rows)
    for r in rows:
        print(f"{r['what']:<70} {r['wall_s']:>7} s  target {r['target_s']} s  {'met' if r['met'] else 'MISSED'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
