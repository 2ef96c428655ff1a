"""The FA3 schedule beside the kernel that runs it: kernels/fa3_gluon.py.

validate.py measures the Triton fa3 kernel, which Triton 3.6 does not warp-
specialise on sm_90 (kernels/NOTES.md): it runs FA3's tiles without FA3's
producer warp and consumer warpgroups, so its rows judge the schedule on a
kernel that does not execute it. The Gluon kernel does (a TMA producer warp,
two wgmma consumer warpgroups, intra-warpgroup overlap; pingpong off by
default). This predicts algorithms/fa3 at the Gluon kernel's own default
config for every row of its measured sweep, beside the Triton fa3's rows of
the same run. Nothing is tuned to these timings.

Where the two still differ: the Gluon kernel is persistent when not causal
(one CTA per SM walks the tiles, its producer prefetching the next tile's
Q/K/V during the current epilogue); the schedule launches one CTA per tile.

    python experiments/fa3_gluon_check.py [--gpu h100] [--measured experiments/results/kernels_bench_fa3_gluon.csv]
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from algorithms.errors import ResultsFileError  # noqa: E402
from algorithms.problem import AttentionProblem  # noqa: E402
from gpusim import predict  # noqa: E402
from gpusim.artifacts import atomic_write_text, read_csv_rows, repo_relative, write_csv  # noqa: E402

MEASURED = ROOT / "experiments/results/kernels_bench_fa3_gluon.csv"
KERNELS = ("fa3_gluon", "fa3")   # the kernel that runs the schedule, and Triton's fa3 beside it


def measured_rows(path) -> dict:
    """{(kernel, N, D, causal): (ms, provenance row)} of the ok rows of a kernels.bench CSV."""
    out = {}
    for r in read_csv_rows(path):
        try:
            if r["kernel"] in KERNELS and r["status"] == "ok" and r["dtype"] == "bf16":
                out[r["kernel"], int(r["seqlen"]), int(r["head_dim"]), int(r["causal"])] = (float(r["ms"]), r)
        except (KeyError, ValueError) as exc:
            raise ResultsFileError(f"{path}: not a kernels.bench CSV ({exc})") from None
    if not any(k[0] == "fa3_gluon" for k in out):
        raise ResultsFileError(f"{path} has no ok bf16 fa3_gluon rows")
    return out


def compare(measured: dict, gpu: str) -> list[dict]:
    # imported here, not at the top: importing the kernels (and triton) decides
    # once per process whether @triton.jit runs compiled or interpreted, which
    # the kernel tests set for themselves
    from kernels.fa3_gluon import cfg_persistent, default_config

    table = []
    for (kernel, n, d, causal), (ms, row) in sorted(measured.items()):
        if kernel != "fa3_gluon":
            continue
        problem = AttentionProblem(batch=int(row["batch"]), heads=int(row["heads"]), seqlen_q=n, head_dim=d,
                                   causal=bool(causal))
        config = default_config(problem)
        pred = predict(problem, config, gpu, algo="fa3")
        triton_ms = measured.get(("fa3", n, d, causal), (None,))[0]
        table.append({"seqlen": n, "head_dim": d, "causal": causal,
                      "config": f"{config.block_m}x{config.block_n} s{config.num_stages} "
                                f"pingpong={int(config.pingpong)}",
                      "persistent": int(cfg_persistent(problem)), "gluon_ms": ms,
                      "triton_fa3_ms": triton_ms, "predicted_ms": round(pred.runtime_us / 1e3, 5),
                      "error_vs_gluon": round(pred.runtime_us / 1e3 / ms - 1, 4),
                      "error_vs_triton_fa3": (round(pred.runtime_us / 1e3 / triton_ms - 1, 4)
                                              if triton_ms else None),
                      "bottleneck": pred.bottleneck, "profile": gpu,
                      "measured_commit": row.get("git_commit", ""), "gpu": row.get("gpu", "")})
        print(f"  N={n} D={d} causal={causal}: gluon {ms:.4f} ms, predicted {table[-1]['predicted_ms']:.4f}",
              file=sys.stderr, flush=True)
    return table


def markdown(table: list[dict], gpu: str, measured_path) -> str:
    first = table[0]
    out = [f"# The FA3 schedule beside the kernel that runs it ({gpu})", "",
           f"Measured: `{measured_path}` ({first['gpu']}, commit {first['measured_commit']}; "
           "`python -m kernels.bench --kernels fa3_gluon,fa3,...`, bf16, 16k tokens, hidden 2048). "
           f"Predicted: `python experiments/fa3_gluon_check.py --gpu {gpu}`, algorithms/fa3 at the Gluon "
           "kernel's default config. Error = predicted / measured − 1.", "",
           "| N | D | causal | config | persistent kernel | Gluon ms | predicted ms | error | "
           "Triton fa3 ms | error vs it |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for r in table:
        vs_triton = f"{r['error_vs_triton_fa3']:+.1%}" if r["error_vs_triton_fa3"] is not None else "–"
        out.append(f"| {r['seqlen']} | {r['head_dim']} | {r['causal']} | {r['config']} | {r['persistent']} | "
                   f"{r['gluon_ms']:.4f} | {r['predicted_ms']:.4f} | {r['error_vs_gluon']:+.1%} | "
                   f"{r['triton_fa3_ms'] or '–'} | {vs_triton} |")
    out.append("")
    for label, key in (("the Gluon kernel", "error_vs_gluon"), ("Triton's fa3", "error_vs_triton_fa3")):
        errs = [r[key] for r in table if r[key] is not None]
        if errs:
            out.append(f"- Against {label}: MAPE {statistics.mean(abs(e) for e in errs):.1%}, "
                       f"median {statistics.median(errs):+.1%}, range {min(errs):+.1%} … {max(errs):+.1%} "
                       f"({len(errs)} rows)")
    for causal in (0, 1):
        errs = [r["error_vs_gluon"] for r in table if r["causal"] == causal]
        if errs:
            out.append(f"- causal={causal}, against the Gluon kernel: MAPE "
                       f"{statistics.mean(abs(e) for e in errs):.1%} ({len(errs)} rows)")
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpu", default="h100")
    parser.add_argument("--measured", default=str(MEASURED))
    parser.add_argument("--out", default=None,
                        help="markdown path (default experiments/results/fa3_gluon_check_<gpu>.md; "
                             "the CSV beside it)")
    a = parser.parse_args(argv)
    try:
        table = compare(measured_rows(a.measured), a.gpu)
    except ResultsFileError as exc:
        print(f"fa3_gluon_check: error: {exc}", file=sys.stderr)
        return 2
    out = Path(a.out or ROOT / f"experiments/results/fa3_gluon_check_{a.gpu.replace('.', '_')}.md")
    atomic_write_text(out, markdown(table, a.gpu, repo_relative(a.measured)))
    write_csv(out.with_suffix(".csv"), table)
    print(f"wrote {out} and its .csv")
    return 0


if __name__ == "__main__":
    sys.exit(main())
