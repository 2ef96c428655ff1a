"""Where fa2's warps wait, config by config, under Nsight Compute: the SM
clock, the tensor pipe's active cycles, MUFU and issue activity, and the
warp stall reasons per issued instruction, for configs of one shape.

A diagnostic, not a calibration: these are counters of the attention kernel,
read to find the effect the model misses; nothing here feeds a profile.
Session 27 asked it of D = 64, N = 16384, non-causal, where the explorer's
picks lose most: the measured best (128x64) is predicted 7-9% slow and
128x128 with 8 warps 10% fast (experiments/results/top_pick_h100.md).

    PYTHONPATH=. python3 experiments/pipe_counters.py [--out $OUT/pipe_counters_h100.csv]   (GPU)

Metric names differ between ncu versions: the script asks ncu which it has
(--query-metrics) and reads those of its wish list that exist. No simulator
import (runs where simpy is absent).
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from experiments.ncu_counters import fa2_counter_rows, fa2_launch  # noqa: E402
from kernels.provenance import write_csv_atomic  # noqa: E402
from experiments import gpu_probe  # noqa: E402

# the measured sweep's shape at N = 16384, D = 64 (16k tokens, hidden 2048)
SHAPE = dict(batch=1, heads=32, seqlen=16384, head_dim=64)
# (block_m, block_n, warps, stages, causal): the six best measured and the
# most mispredicted of that shape (validation_h100.csv)
CONFIGS = [(128, 64, 4, 3, 0), (128, 64, 8, 3, 0), (128, 128, 4, 3, 0), (128, 128, 8, 3, 0),
           (64, 64, 4, 3, 0), (64, 128, 4, 3, 0), (64, 128, 8, 3, 0)]
# (base name, suffix): read where ncu knows the base name
WISHED = [("gpu__time_duration", ".sum"),
          ("sm__cycles_elapsed", ".avg.per_second"),            # the SM clock over the launch
          ("sm__cycles_active", ".avg"),
          ("sm__pipe_tensor_op_gmma_cycles_active", ".avg.pct_of_peak_sustained_active"),
          ("sm__pipe_tensor_op_hmma_cycles_active", ".avg.pct_of_peak_sustained_active"),
          ("sm__inst_executed_pipe_xu", ".sum"),
          ("sm__pipe_xu_cycles_active", ".avg.pct_of_peak_sustained_active"),
          ("sm__inst_executed", ".sum"),
          ("smsp__issue_active", ".avg.pct_of_peak_sustained_active"),
          ("sm__warps_active", ".avg.pct_of_peak_sustained_active"),
          ("l1tex__data_pipe_lsu_wavefronts_mem_shared", ".sum"),
          ("smsp__inst_executed_op_ldgsts", ".sum")]
STALL_PREFIX, STALL_SUFFIX = "smsp__average_warps_issue_stalled_", "_per_issue_active"


def available() -> set[str]:
    """The metric base names this ncu knows on this GPU."""
    ncu = shutil.which("ncu") or "ncu"
    out = subprocess.run([ncu, "--query-metrics"], capture_output=True, text=True).stdout
    return {line.split()[0] for line in out.splitlines() if line and not line.startswith(("-", " ", "="))}


def metrics(known: set[str]) -> list[str]:
    wanted = [base + suffix for base, suffix in WISHED if base in known]
    wanted += sorted(name + ".ratio" for name in known
                     if name.startswith(STALL_PREFIX) and name.endswith(STALL_SUFFIX))
    return wanted


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "pipe_counters_h100.csv"))
    ap.add_argument("--target", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.target:
        fa2_launch(a.target, SHAPE)
        return 0
    if gpu_probe.start("pipe_counters.py", a.out, argv, ncu=True) is None:
        return 2
    wanted = metrics(available())
    if not wanted:
        print("pipe_counters: ncu lists none of the wished metrics (is ncu on PATH?)", file=sys.stderr)
        return 2
    print(f"{len(wanted)} metrics: {', '.join(wanted)}", flush=True)
    rows = []
    for row in fa2_counter_rows(os.path.abspath(__file__), CONFIGS, SHAPE, wanted,
                                "PYTHONPATH=. python3 experiments/pipe_counters.py", units=False):
        rows.append(row)
        print({k: v for k, v in row.items() if k in wanted[:8] or k == "block_n"}, flush=True)
    write_csv_atomic(a.out, rows, list(rows[0]))
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
