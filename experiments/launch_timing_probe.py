"""Do the sweep's do_bench medians and one launch at a time agree? The fa2
configs that spill at 3-4 stages, causal, took 2.28-2.30 ms under ncu (one
launch, caches flushed) against the sweep's do_bench medians of 1.54 and 1.45
ms, while 2 stages and non-causal agreed within 5% (validation_notes.md,
session 14). This times the same launches three ways on the GPU:

  do_bench   triton.testing.do_bench median, inputs rotated over two sets (as
             experiments/validate.py measure);
  single     one launch after an L2 flush (a 256 MB write), timed by CUDA
             events, the median of ROUNDS;
  idle       the same after the GPU sat idle IDLE_S (its clocks may drop).

A diagnostic: nothing here feeds a profile.

    PYTHONPATH=. python3 experiments/launch_timing_probe.py --out $OUT/launch_timing_probe_h100.csv   (GPU)
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from kernels.provenance import provenance, write_csv_atomic  # noqa: E402
from experiments import gpu_probe  # noqa: E402

SHAPE = dict(batch=4, heads=16, seqlen=4096, head_dim=128)
# (block_m, block_n, warps, stages, causal): the spilling 128x64 w4 at 2-4 stages causal, and
# non-causal at 3 stages and an unspilled 8-warp config as controls
CASES = [(128, 64, 4, 2, 1), (128, 64, 4, 3, 1), (128, 64, 4, 4, 1), (128, 64, 4, 3, 0), (128, 64, 8, 3, 1)]
ROUNDS = 9
IDLE_S = 0.2
FLUSH_BYTES = 256 << 20


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "launch_timing_probe_h100.csv"))
    a = ap.parse_args(argv)
    if gpu_probe.start("launch_timing_probe.py", a.out, argv) is None:
        return 2
    import torch
    import triton

    from algorithms.problem import TileConfig
    from kernels import fa2

    b, h, n, d = SHAPE["batch"], SHAPE["heads"], SHAPE["seqlen"], SHAPE["head_dim"]
    inputs = [tuple(torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(3)) for _ in range(2)]
    flush = torch.empty(FLUSH_BYTES, dtype=torch.int8, device="cuda")
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    rows = []
    for bm, bn, w, s, causal in CASES:
        cfg = TileConfig(block_m=bm, block_n=bn, num_warps=w, num_stages=s)
        state = {"i": 0}

        def call():
            state["i"] ^= 1
            return fa2.forward(*inputs[state["i"]], causal=bool(causal), config=cfg)

        call()                                      # compile
        torch.cuda.synchronize()
        bench = triton.testing.do_bench(call, warmup=10, rep=200, quantiles=[0.5])
        timed = {}
        for mode, idle in (("single", 0.0), ("idle", IDLE_S)):
            ms = []
            for _ in range(ROUNDS):
                flush.zero_()
                torch.cuda.synchronize()
                if idle:
                    time.sleep(idle)
                start.record()
                call()
                end.record()
                end.synchronize()
                ms.append(start.elapsed_time(end))
            timed[mode] = ms
        row = {"block_m": bm, "block_n": bn, "num_warps": w, "num_stages": s, **SHAPE, "causal": causal,
               "do_bench_ms": f"{bench:.4f}",
               **{f"{m}_ms_median": f"{statistics.median(v):.4f}" for m, v in timed.items()},
               **{f"{m}_ms_min": f"{min(v):.4f}" for m, v in timed.items()},
               **{f"{m}_ms_max": f"{max(v):.4f}" for m, v in timed.items()}}
        row.update(provenance(command="PYTHONPATH=. python3 experiments/launch_timing_probe.py"))
        rows.append(row)
        print(row, flush=True)
    write_csv_atomic(a.out, rows, list(rows[0]))
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
