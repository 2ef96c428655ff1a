"""gpusim demo: the main job on its built-in default problem, A100 and H100 side by side."""
from __future__ import annotations

import sys
import time

import algorithms
from algorithms.errors import GpusimError
from algorithms.problem import AttentionProblem

DEFAULT_GPUS = ("a100-80gb", "h100")


def register(subparsers) -> None:
    p = subparsers.add_parser("demo", help="predict the four algorithms on A100 and H100 (default problem)")
    p.add_argument("--gpus", default=",".join(DEFAULT_GPUS), help="comma-separated profiles")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--seqlen", type=int, default=4096)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--causal", action="store_true")
    p.set_defaults(func=run)


def _gb(n) -> str:
    return f"{n / 1e9:8.3f}"


def run(a) -> int:
    from ..predict import predict

    problem = AttentionProblem(batch=a.batch, heads=a.heads, seqlen_q=a.seqlen,
                               head_dim=a.head_dim, causal=a.causal)
    print(f"gpusim demo: B={problem.batch} H={problem.heads} N={problem.seqlen_q} "
          f"D={problem.head_dim} causal={problem.causal} {problem.dtype}; default config per "
          f"algorithm and GPU; TFLOP/s counts 4·B·H·N²·D{' ×0.5' if problem.causal else ''}\n")
    for gpu in a.gpus.split(","):
        rows, standard_us = [], None
        for algo in algorithms.ALGORITHMS:
            print(f"  simulating {algo} on {gpu} ...", file=sys.stderr, flush=True)
            t0 = time.perf_counter()
            try:
                pred = predict(problem, None, gpu, algo=algo)
            except GpusimError as exc:
                rows.append((algo, None, str(exc)))
                continue
            rows.append((algo, pred, f"{time.perf_counter() - t0:.2f}s"))
            if algo == "standard":
                standard_us = pred.runtime_us
        print(f"{gpu}")
        print(f"  {'algo':<9}{'matmul GFLOP':>13}{'exp GFLOP':>10}{'global GB':>10}{'compuls. GB':>12}"
              f"{'SMEM/CTA':>9}{'runtime us':>12}{'TFLOP/s':>9}{'HBM GB':>9}{'L2 hit':>7}"
              f"{'speedup':>8}  bottleneck")
        for algo, pred, note in rows:
            if pred is None:
                print(f"  {algo:<9}refused: {note}")
                continue
            speedup = standard_us / pred.runtime_us if standard_us else float("nan")
            print(f"  {algo:<9}{pred.flops_matmul / 1e9:>13.1f}{pred.flops_exp / 1e9:>10.2f}"
                  f"{_gb(pred.global_read_bytes + pred.global_write_bytes):>10}"
                  f"{_gb(pred.compulsory_read_bytes + pred.compulsory_write_bytes):>12}"
                  f"{pred.smem_bytes_per_cta / 1024:>8.0f}K{pred.runtime_us:>12,.1f}{pred.tflops:>9.1f}"
                  f"{_gb(pred.hbm_read_bytes + pred.hbm_write_bytes):>9}{pred.l2_hit_rate:>7.1%}"
                  f"{speedup:>7.1f}x  {pred.bottleneck} ({pred.bottleneck_share:.0%})")
        print()
    print("global GB: bytes requested from global memory (reads + writes); compuls.: every tensor "
          "read once and written once;\nHBM GB: what the simulated L2 let through. "
          "`gpusim predict --help` for one config, `gpusim sweep` to explore.")
    return 0
