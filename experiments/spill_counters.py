"""Register spills of the fa2 kernel under Nsight Compute: local-memory bytes
loaded and stored through L1, and how many of those loads hit in L1, for a few
configs -- against the bytes the schedule charges (algorithms/compiled.py:
per-thread STL/LDL bytes of the hot loop, read off the SASS, x threads x
iterations x CTAs). Counters, not timings: they check a mechanism.

    PYTHONPATH=. python3 experiments/spill_counters.py [--out $OUT/spill_counters_h100.csv]   (GPU)

No simulator import (runs where simpy is absent).
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from experiments.ncu_counters import fa2_counter_rows, fa2_launch  # noqa: E402
from kernels.provenance import write_csv_atomic  # noqa: E402
from experiments import gpu_probe  # noqa: E402

SHAPE = dict(batch=4, heads=16, seqlen=4096, head_dim=128)
# (block_m, block_n, warps, stages, causal): 128x64 w4 at 2-4 stages, causal and not, is where
# the model's spill waits miss most (validation_notes.md, session 14): 2 stages fit two CTAs an
# SM, 3 and 4 one, which leaves L1 more room beside SMEM
CONFIGS = [(128, 64, 4, 3, 0), (128, 128, 4, 3, 0), (128, 64, 8, 3, 0), (128, 64, 4, 2, 0), (128, 64, 4, 4, 0),
           (128, 64, 4, 2, 1), (128, 64, 4, 3, 1), (128, 64, 4, 4, 1)]
METRICS = ["l1tex__t_bytes_pipe_lsu_mem_local_op_ld.sum", "l1tex__t_bytes_pipe_lsu_mem_local_op_st.sum",
           "l1tex__t_sector_pipe_lsu_mem_local_op_ld_hit_rate.pct", "gpu__time_duration.sum"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "spill_counters_h100.csv"))
    ap.add_argument("--target", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.target:
        fa2_launch(a.target, SHAPE)
        return 0
    if gpu_probe.start("spill_counters.py", a.out, argv, ncu=True) is None:
        return 2
    rows = []
    for row in fa2_counter_rows(os.path.abspath(__file__), CONFIGS, SHAPE, METRICS,
                                "PYTHONPATH=. python3 experiments/spill_counters.py", units=True):
        rows.append(row)
        print(row, flush=True)
    write_csv_atomic(a.out, rows, list(rows[0]))
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
