"""`gpusim compare`: predicted TFLOP/s, HBM traffic and speedups of standard,
FA1, FA2 and FA3 on A100 and H100 (experiments/speedups.py does the work).

    gpusim compare [--gpus a100-80gb,h100] [--algos standard,fa1,fa2,fa3] \
        [--seqlens 512,1024,2048,4096,8192,16384] [--head-dims 64,128] [--causal 0,1] \
        [--tokens 16384] [--hidden 2048] [--out results/compare] [--jobs N | --executor dask]

Writes <out>/speedups.csv, speedups.md, compare_tflops.png and compare_hbm.png.
"""
from __future__ import annotations

from algorithms.defaults import ALGORITHMS
from algorithms.errors import GpusimError
from algorithms.problem import DTYPE_BYTES

from ..artifacts import DEFAULT_RESULTS, parse_int_list, parse_str_list
from .sweep import add_executor_args, require_engine


def _csv(values) -> str:
    return ",".join(str(v) for v in values)


def register(subparsers) -> None:
    from experiments.speedups import GPUS, HEAD_DIMS, HIDDEN, SEQLENS, TOKENS

    p = subparsers.add_parser("compare", help="predicted speedups of standard/FA1/FA2/FA3 on A100 and H100")
    p.add_argument("--gpus", default=_csv(GPUS), help=f"profiles, comma-separated (default {_csv(GPUS)})")
    p.add_argument("--algos", default=_csv(ALGORITHMS))
    p.add_argument("--seqlens", default=_csv(SEQLENS))
    p.add_argument("--head-dims", default=_csv(HEAD_DIMS))
    p.add_argument("--causal", default="0,1", help="0, 1 or 0,1 (default both)")
    p.add_argument("--tokens", type=int, default=TOKENS, help="batch × N (default 16384)")
    p.add_argument("--hidden", type=int, default=HIDDEN, help="heads × head_dim (default 2048)")
    p.add_argument("--dtype", default="bf16", choices=[d for d in DTYPE_BYTES if d != "fp8"])
    p.add_argument("--no-sim", action="store_true", help="accounting only: bytes requested, no runtimes")
    p.add_argument("--out", default=str(DEFAULT_RESULTS / "compare"),
                   help="output folder (default results/compare)")
    add_executor_args(p)
    p.set_defaults(func=cmd_compare)


def cmd_compare(a) -> int:
    from experiments.speedups import run_study

    gpus = parse_str_list(a.gpus, "--gpus")
    algos = parse_str_list(a.algos, "--algos", ALGORITHMS)
    seqlens = parse_int_list(a.seqlens, "--seqlens", minimum=1)
    head_dims = parse_int_list(a.head_dims, "--head-dims", minimum=1)
    causal_flags = parse_int_list(a.causal, "--causal")
    if any(c not in (0, 1) for c in causal_flags):
        raise GpusimError(f"--causal takes 0, 1 or 0,1, got {a.causal}")
    if a.tokens < 1 or a.hidden < 1:
        raise GpusimError("--tokens and --hidden must be positive")
    simulate = require_engine(a.no_sim)
    command = (f"gpusim compare --gpus {_csv(gpus)} --algos {_csv(algos)} --seqlens {_csv(seqlens)} "
               f"--head-dims {_csv(head_dims)} --causal {_csv(causal_flags)} --tokens {a.tokens} "
               f"--hidden {a.hidden} --dtype {a.dtype}" + (" --no-sim" if a.no_sim else ""))
    result = run_study(a.out, gpus, algos, seqlens, head_dims, [bool(c) for c in causal_flags],
                       simulate=simulate, executor=a.executor, jobs=a.jobs, scheduler=a.scheduler,
                       progress=not a.no_progress, command=command, tokens=a.tokens,
                       hidden=a.hidden, dtype=a.dtype)
    rows = result["rows"]
    if simulate:
        print(f"{'gpu':<10} {'D':>3} {'causal':>6} {'N':>6}  " +
              "  ".join(f"{x:>9}" for x in algos) + "   (predicted TFLOP/s; speedup over standard)")
        keys = sorted({(r["gpu"], r["head_dim"], r["causal"], r["seqlen_q"]) for r in rows},
                      key=lambda k: (gpus.index(k[0]), k[1], k[2], k[3]))
        index = {(r["gpu"], r["head_dim"], r["causal"], r["seqlen_q"], r["algo"]): r for r in rows}
        for k in keys:
            cells = []
            for algo in algos:
                r = index.get(k + (algo,))
                if r is None or not r["applicable"]:
                    cells.append(f"{'n/a':>9}")
                elif algo == "standard" or not r.get("speedup_vs_standard"):
                    cells.append(f"{r['tflops']:>9.0f}")
                else:
                    cells.append(f"{r['tflops']:>4.0f} {r['speedup_vs_standard']:>3.1f}x")
            print(f"{k[0]:<10} {k[1]:>3} {int(k[2]):>6} {k[3]:>6}  " + "  ".join(cells))
    else:
        print(f"{len(rows)} predictions (accounting only)")
    for path in result["files"]:
        print(f"wrote {path}")
    return 0
