"""How far is the engine's fast path from its full simulation? A benchmark of
the model against itself (no GPU): sixteen shapes across the four algorithms,
each predicted with fast=True and fast=False on the h100 profile.

    python experiments/fast_vs_full.py [--out experiments/results/fast_vs_full.csv] [--jobs 2] [--fa1]

The full simulation times every operation of every CTA on the whole GPU
(seconds to tens of seconds a shape); the fast path simulates one of two
equal parts of it where the problem allows (gpusim/symmetry.py) and
extrapolates steady loops and CTA classes there (gpusim/engine/skipping.py, ghosting.py).
Both are the same model: the difference is the fast path's own error, apart
from the model's error against the GPU.
"""
from __future__ import annotations

import argparse
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from algorithms.problem import AttentionProblem, TileConfig  # noqa: E402
from gpusim import predict  # noqa: E402
from experiments.validation.suite import HEAD_DIMS, HIDDEN, SEQLENS, TOKENS  # noqa: E402
from gpusim.artifacts import cannot_write, write_csv  # noqa: E402
from kernels.provenance import git_commit  # noqa: E402

# (algo, batch, heads, seqlen, head_dim, causal, (block_m, block_n, warps, stages) or None = default)
CASES = [
    ("standard", 16, 16, 1024, 128, False, None),
    ("standard", 4, 16, 2048, 64, True, None),
    ("fa2", 4, 16, 4096, 64, False, None),
    ("fa2", 4, 16, 4096, 128, True, None),
    ("fa2", 16, 32, 1024, 64, False, (64, 32, 4, 2)),
    ("fa2", 2, 16, 8192, 128, False, (64, 64, 4, 3)),
    ("fa2", 8, 32, 2048, 64, True, (64, 32, 8, 3)),      # two warpgroup roles, long causal loops
    ("fa2", 1, 16, 16384, 128, False, (64, 128, 4, 2)),  # one CTA an SM, one class: its ghosts' period
    ("fa2", 1, 16, 16384, 128, True, (128, 64, 8, 2)),   # two stages, causal, long loops (session 25: -20%)
    ("fa2", 8, 16, 2048, 128, False, (128, 64, 4, 2)),   # spills 260 bytes a thread a step to its stack
    ("fa1", 4, 32, 1024, 64, False, None),
    ("fa1", 1, 16, 4096, 128, True, None),
    ("fa3", 4, 16, 4096, 128, True, None),
    ("fa3", 16, 32, 1024, 64, False, None),
    # bench_simulator.py's standard singles (its PV GEMM's CTAs spread in the fast path)
    ("standard", 1, 16, 16384, 128, False, None),
    ("standard", 1, 16, 16384, 128, True, None),
]

# --fa1: FA1's 24 validation shapes (validate.py's sweep: TOKENS tokens, HIDDEN / D
# heads), its default config. Its fast path came out 10-17% under its full
# simulation on several (session 30).
FA1_CASES = [("fa1", TOKENS // n, HIDDEN // d, n, d, causal, None)
             for n in SEQLENS for d in HEAD_DIMS for causal in (True, False)]


def _one(case):
    algo, b, h, n, d, causal, cfg = case
    problem = AttentionProblem(batch=b, heads=h, seqlen_q=n, head_dim=d, causal=causal)
    config = TileConfig(block_m=cfg[0], block_n=cfg[1], num_warps=cfg[2], num_stages=cfg[3]) if cfg else None
    out = {}
    for fast in (True, False):
        t0 = time.perf_counter()
        p = predict(problem, config, "h100", algo=algo, fast=fast)
        out[fast] = (p, time.perf_counter() - t0)
    (f, tf), (s, ts) = out[True], out[False]
    rel = lambda a, b: round(a / b - 1, 4) if b else float("nan")
    return {"algo": algo, "batch": b, "heads": h, "seqlen": n, "head_dim": d, "causal": causal,
            "config": "default" if cfg is None else "x".join(map(str, cfg)),
            "fast_us": round(f.runtime_us, 2), "full_us": round(s.runtime_us, 2),
            "runtime_err": rel(f.runtime_us, s.runtime_us),
            "hbm_read_err": rel(f.hbm_read_bytes, s.hbm_read_bytes),
            "hbm_write_err": rel(f.hbm_write_bytes, s.hbm_write_bytes),
            "fast_wall_s": round(tf, 2), "full_wall_s": round(ts, 2)}


def _warm_up() -> None:
    """A worker's first prediction loads the engine's compiled parts (numba),
    seconds that would otherwise land on whichever case it times first:
    the fast path's, which runs first (before, fa1 B4 H32 N1024 took 10.3 s
    fast against 3.9 s full that way, 2.5 against 2.2 warm)."""
    predict(AttentionProblem(batch=1, heads=2, seqlen_q=512, head_dim=64), None, "h100")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "experiments/results/fast_vs_full.csv"))
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--fa1", action="store_true",
                    help="FA1's 24 validation shapes instead (default out: fast_vs_full_fa1.csv)")
    a = ap.parse_args(argv)
    if a.jobs < 1:
        ap.error(f"--jobs must be at least 1, got {a.jobs}")
    cases, command = (FA1_CASES, "python experiments/fast_vs_full.py --fa1") if a.fa1 else \
        (CASES, "python experiments/fast_vs_full.py")
    if a.fa1 and a.out == ap.get_default("out"):
        a.out = str(ROOT / "experiments/results/fast_vs_full_fa1.csv")
    if cannot_write("fast_vs_full", a.out):     # (before minutes of full simulations, not after)
        return 2
    rows = []
    with ProcessPoolExecutor(a.jobs, initializer=_warm_up) as ex:
        for row in ex.map(_one, cases):
            row.update(git_commit=git_commit(), date=time.strftime("%Y-%m-%d"), command=command)
            rows.append(row)
            print(f"{row['algo']:8s} B{row['batch']} H{row['heads']} N{row['seqlen']} D{row['head_dim']} "
                  f"causal={int(row['causal'])} {row['config']}: fast {row['fast_us']:.1f} us, "
                  f"full {row['full_us']:.1f} us ({row['runtime_err']:+.1%}); HBM read "
                  f"{row['hbm_read_err']:+.1%}", flush=True)
    write_csv(a.out, rows)
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
