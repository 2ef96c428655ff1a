"""Predicted speedups of FlashAttention 1/2/3 over standard attention.

The layout of the FlashAttention papers' forward-pass figures: a fixed token
budget (16k tokens: batch = 16384 / N) and hidden size 2048 (heads = 2048 /
head_dim), N from 512 to 16k, head dims 64 and 128, causal and not, one panel
per (GPU, head dim, causal) with a bar per algorithm. Everything here is a
prediction of gpusim (no measurement); FA3 on an A100 is not applicable (no
wgmma/TMA) and is reported as such, with the reason.

    gpusim compare [--gpus a100-80gb,h100] [--out results/compare]
    python -m experiments.speedups [same flags]

Writes speedups.csv (one row per GPU, algorithm, head dim, causal, N),
speedups.md (tables of predicted TFLOP/s and speedups over standard) and
compare_tflops.png / compare_hbm.png.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Sequence

from algorithms.defaults import ALGORITHMS
from algorithms.errors import GpusimError
from algorithms.problem import AttentionProblem

from gpusim.artifacts import atomic_write_text, ensure_dir, markdown_table, pyplot, save_figure, write_csv
from gpusim.explore import ROW_FIELDS, Task, run_tasks

SEQLENS = (512, 1024, 2048, 4096, 8192, 16384)
HEAD_DIMS = (64, 128)
GPUS = ("a100-80gb", "h100")
TOKENS = 16384
HIDDEN = 2048
COLORS = {"standard": "#8c8c8c", "fa1": "#1f77b4", "fa2": "#ff7f0e", "fa3": "#d62728"}
NAMES = {"standard": "Standard", "fa1": "FlashAttention", "fa2": "FlashAttention-2",
         "fa3": "FlashAttention-3"}
FIELDS = tuple(dict.fromkeys(("gpu", "algo", "head_dim", "causal", "seqlen_q", "batch", "heads", "dtype", "applicable",
          "reason", "runtime_us", "tflops", "speedup_vs_standard", "hbm_bytes", "requested_bytes",
          "compulsory_bytes", "workspace_bytes") + tuple(
    f for f in ROW_FIELDS if f not in ("gpu", "algo", "head_dim", "causal", "seqlen_q", "batch",
                                       "heads", "dtype", "reason"))))


def shape(seqlen: int, head_dim: int, causal: bool, tokens: int = TOKENS, hidden: int = HIDDEN,
          dtype: str = "bf16") -> AttentionProblem:
    if tokens % seqlen or hidden % head_dim:
        raise GpusimError(f"tokens ({tokens}) must be a multiple of N ({seqlen}) and hidden "
                          f"({hidden}) of head_dim ({head_dim})")
    return AttentionProblem(batch=tokens // seqlen, heads=hidden // head_dim, seqlen_q=seqlen,
                            head_dim=head_dim, causal=causal, dtype=dtype)


def workspace_bytes(algo: str, problem: AttentionProblem) -> int:
    """HBM the algorithm needs besides Q, K, V, O and LSE: standard's S and P,
    FA1's O accumulator and statistics; read off the schedule's tensors."""
    import algorithms

    tensors = algorithms.build(algo, problem).tensors
    return sum(t.nbytes for t in tensors.values() if t.kind in ("intermediate", "workspace"))


def study_tasks(gpus: Sequence[str], algos: Sequence[str], seqlens: Sequence[int],
                head_dims: Sequence[int], causals: Sequence[bool], simulate: bool,
                tokens: int = TOKENS, hidden: int = HIDDEN, dtype: str = "bf16") -> list[Task]:
    tasks = []
    for gpu in gpus:
        for d in head_dims:
            for causal in causals:
                for n in seqlens:
                    problem = shape(n, d, causal, tokens, hidden, dtype)
                    for algo in algos:
                        tasks.append(Task(algo, problem, None, gpu, simulate))
    return tasks


def finish_rows(rows: list[dict]) -> list[dict]:
    """Add applicability, traffic totals and speedups over standard."""
    from gpusim.explore import _profile

    out = []
    std = {}
    for r in rows:
        r = dict(r)
        r["applicable"] = bool(r.get("feasible"))
        r["requested_bytes"] = ((r.get("l2_read_bytes") or 0) + (r.get("global_write_bytes") or 0)
                                if r["applicable"] else None)
        r["compulsory_bytes"] = ((r.get("compulsory_read_bytes") or 0) +
                                 (r.get("compulsory_write_bytes") or 0) if r["applicable"] else None)
        r["hbm_bytes"] = (r["hbm_read_bytes"] + r["hbm_write_bytes"]
                          if r.get("hbm_read_bytes") is not None else None)
        problem = AttentionProblem(batch=r["batch"], heads=r["heads"], seqlen_q=r["seqlen_q"],
                                   head_dim=r["head_dim"], causal=bool(r["causal"]), dtype=r["dtype"])
        r["workspace_bytes"] = workspace_bytes(r["algo"], problem)
        out.append(r)
        if r["algo"] == "standard":
            std[(r["gpu"], r["head_dim"], r["causal"], r["seqlen_q"])] = r
    for r in out:
        base = std.get((r["gpu"], r["head_dim"], r["causal"], r["seqlen_q"]))
        if base and r.get("runtime_us") and base.get("runtime_us"):
            r["speedup_vs_standard"] = base["runtime_us"] / r["runtime_us"]
    return out


def _fmt_gb(n) -> str:
    return "—" if n is None else f"{n / 1e9:.2f}"


def markdown(rows: list[dict], simulate: bool, command: str) -> str:
    """Per GPU: predicted TFLOP/s of each algorithm and its speedup over
    standard (runtime ratio), per (head dim, causal, N); n/a cells with why."""
    gpus = list(dict.fromkeys(r["gpu"] for r in rows))
    algos = [a for a in ALGORITHMS if any(r["algo"] == a for r in rows)]
    lines = ["# Predicted speedups over standard attention", "",
             "Predicted by gpusim (no measurement). Shapes: batch × N = 16k tokens, heads × "
             "head_dim = 2048 (the FlashAttention papers' layout); TFLOP/s counts "
             "4·B·H·N²·D, halved when causal. Speedup = standard's predicted runtime ÷ the "
             "algorithm's. Each algorithm runs its default config for the GPU and shape.", "",
             f"Made with: `{command}`", ""]
    notes: dict[str, int] = {}

    def note(reason: str) -> str:
        if reason not in notes:
            notes[reason] = len(notes) + 1
        return f"n/a [{notes[reason]}]"

    index = {(r["gpu"], r["algo"], r["head_dim"], r["causal"], r["seqlen_q"]): r for r in rows}
    keys = sorted({(r["head_dim"], r["causal"], r["seqlen_q"]) for r in rows},
                  key=lambda k: (k[0], k[1], k[2]))
    for gpu in gpus:
        lines += [f"## {gpu}", ""]
        if simulate:
            header = ["head_dim", "causal", "N"] + [f"{a} TFLOP/s" for a in algos] + \
                     [f"{a} speedup" for a in algos if a != "standard"]
        else:
            header = ["head_dim", "causal", "N"] + [f"{a} GB requested" for a in algos] + \
                     [f"{a} GB compulsory" for a in algos]
        body = []
        for d, causal, n in keys:
            first, second = [], []
            for a in algos:
                r = index.get((gpu, a, d, causal, n))
                if r is None:
                    first.append("")
                    second.append("")
                elif not r["applicable"]:
                    first.append(note(r["reason"]))
                    second.append("n/a")
                elif simulate:
                    first.append(f"{r['tflops']:.0f}")
                    sp = r.get("speedup_vs_standard")
                    second.append(f"{sp:.2f}×" if sp else "—")
                else:
                    first.append(_fmt_gb(r["requested_bytes"]))
                    second.append(_fmt_gb(r["compulsory_bytes"]))
            if simulate:
                second = [c for a, c in zip(algos, second) if a != "standard"]
            body.append([d, "yes" if causal else "no", n] + first + second)
        lines.append(markdown_table(header, body))
    if notes:
        lines += ["Not applicable:", ""]
        lines += [f"[{i}] {reason}" for reason, i in notes.items()]
        lines.append("")
    if not simulate:
        lines += ["Accounting only (--no-sim): bytes requested from global memory and the "
                  "compulsory bytes; runtimes, TFLOP/s and HBM traffic after L2 need the simulator.", ""]
    return "\n".join(lines)


def _panels(rows):
    gpus = list(dict.fromkeys(r["gpu"] for r in rows))
    dims = sorted({r["head_dim"] for r in rows})
    causals = sorted({bool(r["causal"]) for r in rows})
    return gpus, dims, causals


def plot(rows: list[dict], metric: str, ylabel: str, title: str, log: bool = False):
    """Grouped bars: a panel per (GPU, head dim) row and causal column, N on
    the x axis, one bar per algorithm; n/a algorithms named in the panel."""
    import numpy as np

    plt = pyplot()
    gpus, dims, causals = _panels(rows)
    algos = [a for a in ALGORITHMS if any(r["algo"] == a for r in rows)]
    seqlens = sorted({r["seqlen_q"] for r in rows})
    nrows = len(gpus) * len(dims)
    fig, axes = plt.subplots(nrows, len(causals), squeeze=False,
                             figsize=(4.6 * len(causals), 2.7 * nrows))
    width = 0.8 / max(1, len(algos))
    x = np.arange(len(seqlens))
    index = {(r["gpu"], r["algo"], r["head_dim"], bool(r["causal"]), r["seqlen_q"]): r for r in rows}
    for gi, gpu in enumerate(gpus):
        for di, d in enumerate(dims):
            for ci, causal in enumerate(causals):
                ax = axes[gi * len(dims) + di][ci]
                missing = {}
                for ai, a in enumerate(algos):
                    vals = []
                    for n in seqlens:
                        r = index.get((gpu, a, d, causal, n))
                        v = r.get(metric) if r else None
                        if r is not None and not r["applicable"]:
                            missing[a] = (r["reason"] if "wgmma" in r["reason"]
                                          else r.get("short_reason") or r["reason"])
                        vals.append(np.nan if v is None else v)
                    if all(math.isnan(v) for v in vals):
                        continue
                    bars = ax.bar(x + (ai - (len(algos) - 1) / 2) * width, vals, width,
                                  label=NAMES[a], color=COLORS[a])
                    if not log and len(seqlens) <= 6:
                        ax.bar_label(bars, fmt="%.0f", fontsize=5, padding=1)
                if missing:
                    text = "; ".join(f"{NAMES[a]}: n/a ({_short(reason)})" for a, reason in missing.items())
                    ax.text(0.01, 0.98, text, transform=ax.transAxes, va="top", fontsize=6,
                            color="0.3", wrap=True)
                ax.set_xticks(x, [f"{n // 1024}k" if n >= 1024 else str(n) for n in seqlens],
                              fontsize=7)
                if log:
                    ax.set_yscale("log")
                ax.set_title(f"{gpu}, head dim {d}, {'causal' if causal else 'not causal'}", fontsize=8)
                ax.tick_params(axis="y", labelsize=7)
                ax.margins(y=0.18)
                if ci == 0:
                    ax.set_ylabel(ylabel, fontsize=8)
                if gi * len(dims) + di == nrows - 1:
                    ax.set_xlabel("sequence length N", fontsize=8)
    handles, labels = [], []
    for ax in axes.flat:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            if lab not in labels:
                handles.append(h)
                labels.append(lab)
    fig.legend(handles, labels, loc="upper center", ncol=len(labels), fontsize=8,
               bbox_to_anchor=(0.5, 1.0))
    fig.suptitle(title, fontsize=9, y=1.03)
    fig.tight_layout()
    return fig


def _short(reason: str) -> str:
    if "wgmma" in reason:
        return "needs Hopper wgmma+TMA"
    return reason if len(reason) < 40 else reason[:39] + "…"


def run_study(out: Path, gpus=GPUS, algos=ALGORITHMS, seqlens=SEQLENS, head_dims=HEAD_DIMS,
              causals=(False, True), simulate: bool = True, executor: str = "process",
              jobs=None, scheduler=None, progress: bool = True, command: str = "gpusim compare",
              tokens: int = TOKENS, hidden: int = HIDDEN, dtype: str = "bf16") -> dict:
    """Predict the grid, write the CSV, Markdown and figures under `out`;
    return {"rows": rows, "files": [paths]}."""
    from gpusim.profile import load_profile

    for g in gpus:
        load_profile(g)  # an unknown GPU fails here, in one line
    ensure_dir(out)      # ... and an output folder that cannot be written, before the predictions
    tasks = study_tasks(gpus, algos, seqlens, head_dims, causals, simulate, tokens, hidden, dtype)
    rows = finish_rows(run_tasks(tasks, executor=executor, jobs=jobs, scheduler=scheduler,
                                 progress=progress, desc="compare"))
    out = Path(out)
    files = [write_csv(out / "speedups.csv", rows, FIELDS),
             atomic_write_text(out / "speedups.md", markdown(rows, simulate, command))]
    sub = f"predicted by gpusim; batch·N = {tokens} tokens, heads·D = {hidden}, {dtype}"
    if simulate:
        files.append(save_figure(plot(rows, "tflops", "TFLOP/s (predicted)",
                                      f"Attention forward speed, {sub}"), out / "compare_tflops.png"))
        for r in rows:
            r["_hbm_gb"] = r["hbm_bytes"] / 1e9 if r.get("hbm_bytes") is not None else None
        files.append(save_figure(plot(rows, "_hbm_gb", "HBM traffic GB (predicted)",
                                      f"HBM bytes read + written, {sub}", log=True),
                                 out / "compare_hbm.png"))
    else:
        for r in rows:
            r["_req_gb"] = r["requested_bytes"] / 1e9 if r.get("requested_bytes") is not None else None
        files.append(save_figure(plot(rows, "_req_gb", "GB requested (accounting)",
                                      f"Bytes requested from global memory (before L2), {sub}",
                                      log=True), out / "compare_requested.png"))
    for r in rows:
        r.pop("_hbm_gb", None)
        r.pop("_req_gb", None)
    return {"rows": rows, "files": files}


def main(argv=None) -> int:
    from gpusim.cli import main as cli_main
    import sys

    return cli_main(["compare", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    raise SystemExit(main())
