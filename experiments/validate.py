"""Validate the simulator against the Triton kernels on a real GPU.

    # GPU machine (imports algorithms/ and kernels/ only: no simpy there)
    PYTHONPATH=. python3 experiments/validate.py measure [--quick] [--budget-s 300] [--out CSV]
    PYTHONPATH=. python3 experiments/validate.py ncu [--out experiments/results/ncu_h100.csv]
    # CPU
    PYTHONPATH=. python experiments/validate.py report [--gpu h100 --gpu h100.measured]

measure: every kernel of the suite (standard, fa1, fa2, fa3, fa3 fp8) with its default config,
and fa2 with every config of block_m {64,128} x block_n {32,64,128} x warps {4,8} x stages
{2,3,4} that fits, over head_dim {64,128} x N {512..16384} at 16k tokens (batch = 16384/N,
heads = 2048/head_dim), causal and not, bf16. Time: triton.testing.do_bench median (it
flushes L2 between calls) on random N(0,1) inputs rotated over two sets (192 MB each, more
than the 50 MB L2). Each row's output is checked against torch SDPA first. Failures are
rows with a status, not exceptions. The CSV is rewritten atomically as rows come in;
--budget-s stops cleanly before a deadline.

ncu: DRAM bytes read/written and L2 read sectors from the SMs for a representative subset,
under Nsight Compute with --clock-control none (one process; each case fenced by a marker
kernel whose grid size is the case number).

report: predicts every measured row with gpusim.predict on each profile and writes
experiments/results/validation_report.md (+ validation_*.png). No model parameter is fitted
to these timings.

The parts live in experiments/validation/ (its __init__ says which file holds
what); this file is their command line.
"""

from __future__ import annotations

import argparse
import os
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from algorithms.errors import GpusimError  # noqa: E402

from experiments.validation.measure import cmd_measure  # noqa: E402
from experiments.validation.ncu import cmd_ncu, cmd_ncu_parse, cmd_ncu_target  # noqa: E402
from experiments.validation.report import cmd_report  # noqa: E402
from experiments.validation.suite import (DEFAULT_BOUNDS, DEFAULT_GLUON, DEFAULT_NCU, DEFAULT_OUT,  # noqa: E402
                                          DEFAULT_REPORT, RESULTS)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="Measure the kernels and validate the simulator against them.")
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("measure", help="GPU: time the suite and the fa2 config sweep")
    p.add_argument("--out", default=DEFAULT_OUT)
    p.add_argument("--quick", action="store_true", help="N in {1024,4096,16384}, fa2 with stages=3 only")
    p.add_argument("--budget-s", type=float, default=0, help="stop starting rows this many seconds after start")
    p.add_argument("--margin-s", type=float, default=8, help="stop this long before the budget")
    p.add_argument("--algos", default="", help="comma-separated subset of standard,fa1,fa2,fa3")
    p.add_argument("--limit", type=int, default=0, help="first N rows only (debugging)")
    p.add_argument("--warmup-ms", type=float, default=10)
    p.add_argument("--rep-ms", type=float, default=40)
    p.add_argument("--precompile-workers", type=int, default=12)
    p.set_defaults(func=cmd_measure)
    p = sub.add_parser("ncu", help="GPU: DRAM and L2 bytes of a representative subset under Nsight Compute")
    p.add_argument("--out", default=DEFAULT_NCU)
    p.add_argument("--timeout-s", type=float, default=240)
    p.set_defaults(func=cmd_ncu)
    p = sub.add_parser("ncu-parse", help="CPU: rebuild the ncu CSV from its raw export")
    p.add_argument("--raw", default=os.path.join(RESULTS, "ncu_h100_raw.csv"))
    p.add_argument("--out", default=DEFAULT_NCU)
    p.set_defaults(func=cmd_ncu_parse)
    p = sub.add_parser("ncu-target", help=argparse.SUPPRESS)
    p.set_defaults(func=cmd_ncu_target)
    p = sub.add_parser("report", help="CPU: predictions vs measurements, figures, markdown")
    p.add_argument("--measurements", default=DEFAULT_OUT)
    p.add_argument("--ncu", default=DEFAULT_NCU)
    p.add_argument("--gpu", action="append", help="profile(s) to predict with (default h100 and h100.measured)")
    p.add_argument("--report", default=DEFAULT_REPORT)
    p.add_argument("--bounds", default=DEFAULT_BOUNDS)
    p.add_argument("--gluon", default=DEFAULT_GLUON,
                   help="kernels.bench CSV with fa3_gluon rows: FA3's schedule against the kernel that "
                        "runs it ('' to leave them out)")
    p.add_argument("--write-bounds", action="store_true", help="store the guard subset's errors as CI bounds")
    p.add_argument("--subset", choices=("all", "headline", "guard"), default="all",
                   help="all measured rows; headline: defaults on every shape + fa2 configs at N=1024; "
                        "guard: the CI guard's rows")
    p.add_argument("--jobs", type=int, default=max(1, (os.cpu_count() or 2)))
    p.add_argument("--no-plots", action="store_true")
    p.add_argument("--reuse-predictions", action="store_true",
                   help="reuse the predictions saved beside the report (*_predictions_<profile>.csv), "
                        "predicting only the rows they lack (each line keeps the commit it was made at)")
    p.set_defaults(func=cmd_report)
    args = ap.parse_args(argv)
    try:
        return args.func(args)
    except GpusimError as e:    # (a results file that cannot be read or written, among others)
        print(f"validate: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
