"""Why are fa3_gluon's timings at N = 512 bimodal? A diagnostic (GPU machine).

kernels.bench's rounds of the Gluon kernel at N = 512 land at either ~0.17 or
0.26-0.28 ms (fa3_gluon_smalln_h100.csv, every P/O/Q placement), cuDNN's do not.
For each shape this times, per kernel:
- `bench`: kernels.bench's measure (do_bench median, L2 flushed, two input sets), 9 times;
- `launch`: each of 300 calls alone between CUDA events, L2 flushed before it: the
  kernel's time plus whatever of the host's call the GPU waits for (p10 / p50 / p90);
- `host`: the CPU time of one call, without synchronising (the launch path); for
  fa3_gluon also `host_unplanned` (its host plan made afresh every call, as before
  _PLANS), and `host_loop` / `host_loop_unplanned` (20 calls back to back, per call);
- `graph`: do_bench of a CUDA graph holding one call (no host work in the loop).
A call whose `host` time approaches the kernel's own (`graph`) is host-bound in `bench`.

    PYTHONPATH=. python experiments/fa3_gluon_small_n_probe.py --out results.csv
"""
from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from kernels.bench import make_fn, parse_kernel  # noqa: E402
from kernels.provenance import provenance, write_csv_atomic  # noqa: E402
from experiments import gpu_probe  # noqa: E402

COLUMNS = ["kernel", "batch", "heads", "seqlen", "head_dim", "causal", "measure", "n", "p10_ms", "p50_ms",
           "p90_ms", "min_ms", "max_ms", "values_ms"]
TOKENS = 16384
HIDDEN = 2048


def quantiles(xs):
    xs = sorted(xs)
    q = lambda f: xs[min(len(xs) - 1, int(f * len(xs)))]  # noqa: E731
    return q(0.1), statistics.median(xs), q(0.9), xs[0], xs[-1]


def host_ms(fn, rounds: int, calls: int) -> list[float]:
    """The host's ms a call: `rounds` times, `calls` calls back to back
    after a synchronisation, without waiting for the GPU."""
    import torch

    out = []
    for _ in range(rounds):
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        out.append((time.perf_counter() - t) * 1e3 / calls)
    return out


@contextlib.contextmanager
def planned_afresh():
    """fa3_gluon's forward with its host plan made on every call (as before _PLANS)."""
    from kernels import fa3_gluon

    keyed = fa3_gluon._plan_key
    fa3_gluon._plan_key = lambda *args: None
    try:
        yield
    finally:
        fa3_gluon._plan_key = keyed


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--seqlens", default="512,1024")
    ap.add_argument("--head-dims", default="64,128")
    ap.add_argument("--kernels", default="fa3_gluon,sdpa_cudnn")
    ap.add_argument("--profile-host", type=int, default=0, metavar="CALLS",
                    help="also cProfile this many calls of each kernel's host path (first shape only)")
    a = ap.parse_args(argv)
    if gpu_probe.start("fa3_gluon_small_n_probe.py", a.out, argv) is None:
        return 2

    import torch
    import triton.testing

    from kernels.common import make_inputs

    prov = provenance("python experiments/fa3_gluon_small_n_probe.py " + " ".join(sys.argv[1:] if argv is None else argv))
    flush = torch.empty(256 * 2**20, dtype=torch.int8, device="cuda")
    rows = []
    for d in (int(x) for x in a.head_dims.split(",")):
        for n in (int(x) for x in a.seqlens.split(",")):
            for causal in (False, True):
                b, h = TOKENS // n, HIDDEN // d
                inputs = [make_inputs(b, h, n, d, dtype=torch.bfloat16, device="cuda") for _ in range(2)]
                for kernel, name, cfg, launch in (parse_kernel(k) for k in a.kernels.split(",")):
                    fn = make_fn(name, cfg, inputs, causal, launch)
                    fn()
                    torch.cuda.synchronize()
                    got = {"bench": [triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")
                                     for _ in range(9)]}
                    alone = []
                    for _ in range(300):
                        flush.zero_()
                        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                        s.record()
                        fn()
                        e.record()
                        e.synchronize()
                        alone.append(s.elapsed_time(e))
                    got["launch"] = alone
                    got["host"] = host_ms(fn, rounds=50, calls=1)
                    if name == "fa3_gluon":
                        with planned_afresh():
                            got["host_unplanned"] = host_ms(fn, rounds=50, calls=1)
                        # back-to-back calls, no synchronisation: the host's rate when the GPU is busy
                        got["host_loop"] = host_ms(fn, rounds=5, calls=20)
                        with planned_afresh():
                            got["host_loop_unplanned"] = host_ms(fn, rounds=5, calls=20)
                    if a.profile_host and not rows:
                        import cProfile
                        import pstats
                        prof = cProfile.Profile()
                        prof.enable()
                        for _ in range(a.profile_host):
                            fn()
                        prof.disable()
                        torch.cuda.synchronize()
                        print(f"--- host path of {kernel}, {a.profile_host} calls", file=sys.stderr)
                        pstats.Stats(prof, stream=sys.stderr).sort_stats("cumulative").print_stats(30)
                    try:
                        one = make_fn(name, cfg, inputs[:1], causal, launch)
                        one()
                        torch.cuda.synchronize()
                        g = torch.cuda.CUDAGraph()
                        with torch.cuda.graph(g):
                            one()
                        got["graph"] = [triton.testing.do_bench(g.replay, warmup=25, rep=100,
                                                                return_mode="median") for _ in range(9)]
                    except Exception as exc:   # a kernel that cannot be captured: say so, go on
                        print(f"{kernel} D={d} N={n} causal={int(causal)}: no graph ({exc!r:.120})",
                              file=sys.stderr)
                    for measure, xs in got.items():
                        p10, p50, p90, lo, hi = quantiles(xs)
                        rows.append({"kernel": kernel, "batch": b, "heads": h, "seqlen": n, "head_dim": d,
                                     "causal": int(causal), "measure": measure, "n": len(xs),
                                     "p10_ms": f"{p10:.5f}", "p50_ms": f"{p50:.5f}", "p90_ms": f"{p90:.5f}",
                                     "min_ms": f"{lo:.5f}", "max_ms": f"{hi:.5f}",
                                     "values_ms": " ".join(f"{x:.4f}" for x in xs) if len(xs) <= 50 else "",
                                     **prov})
                        print(f"D={d} N={n} causal={int(causal)} {kernel:16s} {measure:6s} "
                              f"p10 {p10:.4f} p50 {p50:.4f} p90 {p90:.4f} ms (min {lo:.4f}, max {hi:.4f})",
                              file=sys.stderr, flush=True)
    write_csv_atomic(a.out, rows, COLUMNS + [k for k in prov if k not in COLUMNS])
    return 0


if __name__ == "__main__":
    sys.exit(main())
