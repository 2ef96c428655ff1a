"""The explorer's top fa2 pick vs the best config of the measured sweep.

For every shape of the measured sweep (by default
experiments/results/validation_h100.csv: the h100-anchors shapes, 16k tokens
at hidden 2048, N 512…16k, D 64/128, causal 0/1), gpusim predicts every fa2
config of the measured grid (block_m ∈ {64,128} × block_n ∈ {32,64,128} ×
warps ∈ {4,8} × stages ∈ {2,3,4}) and picks the fastest predicted. The pick's
measured time is compared with the fastest measured config:

    loss % = (measured ms of the predicted-best config / best measured ms − 1) × 100

The issue's bar: within 5 %. If the predicted-best config has no measurement
(it failed or was skipped on the GPU), the best-predicted config that was
measured stands in, and the row says so. Also reported: the rank (in
measured order) of the pick, and the Spearman rank correlation of predicted
and measured times over the configs of the shape.

    PYTHONPATH=. python experiments/top_pick.py [--measured CSV] [--out DIR] [--gpu h100]

Writes <out>/top_pick_h100.md and top_pick_h100.csv. Needs the simulator
(simpy): run it on a CPU machine, not on the GPU machine.
"""
from __future__ import annotations

import argparse
import csv
import itertools
import math
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from algorithms.errors import GpusimError, ResultsFileError  # noqa: E402
from experiments.validation.metrics import spearman as validate_spearman  # noqa: E402

RESULTS = ROOT / "experiments" / "results"
MEASURED = RESULTS / "validation_h100.csv"
# The same sweep measured twice more (session 29, validate.py measure): how far
# the measurement itself moves a shape's fastest config (noise_floor)
REPEATS = (RESULTS / "validation_clocked_h100_a.csv", RESULTS / "validation_clocked_h100_b.csv")
GRID = {"block_m": (64, 128), "block_n": (32, 64, 128), "num_warps": (4, 8), "num_stages": (2, 3, 4)}
REQUIRED = ("algo", "head_dim", "seqlen", "causal", "block_m", "block_n", "num_warps",
            "num_stages")
TIME_COLUMNS = ("median_ms", "ms")  # the first present holds the median time in ms
TOKENS, HIDDEN = 16384, 2048
BAR_PCT = 5.0
# Autotuning only the model's k fastest configs (gpusim.triton's prune hook,
# top_k): the loss of the fastest measured among them, for each k
SHORTLISTS = (3, 5, 8)
FIELDS = ("seqlen", "head_dim", "causal", "batch", "heads", "dtype", "n_measured", "n_predicted",
          "pick", "pick_predicted_us", "pick_measured_ms", "pick_was_measured", "best", "best_ms",
          "loss_pct", "within_bar", "pick_measured_rank", "best_predicted_rank", "spearman",
          "pick_bottleneck") + tuple(f"top{k}_loss_pct" for k in SHORTLISTS)


def _truthy(v: str) -> bool:
    return str(v).strip().lower() in ("1", "true", "yes", "y")


def _int(row, key, line):
    try:
        return int(float(row[key]))
    except (TypeError, ValueError):
        raise ResultsFileError(f"line {line}: {key}={row.get(key)!r} is not an integer") from None


def read_measured(path) -> dict:
    """{shape: {(block_m, block_n, warps, stages): median ms}} of the fa2 rows
    with a finite time (column median_ms, else ms: do_bench medians); shape = (seqlen, head_dim, causal, batch, heads, dtype).
    Repeated configs take the median of their times."""
    path = Path(path)
    if not path.is_file():
        raise ResultsFileError(f"{path} does not exist (the measured sweep of the validation issue)")
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        cols = reader.fieldnames or []
        missing = [c for c in REQUIRED if c not in cols]
        time_col = next((c for c in TIME_COLUMNS if c in cols), None)
        if time_col is None:
            missing.append(" or ".join(TIME_COLUMNS))
        if missing:
            raise ResultsFileError(f"{path}: missing columns {', '.join(missing)}")
        times: dict = {}
        for line, row in enumerate(reader, start=2):
            if row["algo"].strip() != "fa2":
                continue
            if "status" in row and row["status"] and row["status"].strip().lower() not in ("ok", ""):
                continue
            try:
                ms = float(row[time_col])
            except (TypeError, ValueError):
                continue
            if not (math.isfinite(ms) and ms > 0):
                continue
            n, d = _int(row, "seqlen", line), _int(row, "head_dim", line)
            batch = _int(row, "batch", line) if row.get("batch") else TOKENS // n
            heads = _int(row, "heads", line) if row.get("heads") else HIDDEN // d
            dtype = (row.get("dtype") or "bf16").strip()
            dtype = {"bfloat16": "bf16", "float16": "fp16"}.get(dtype, dtype)
            shape = (n, d, _truthy(row["causal"]), batch, heads, dtype)
            cfg = tuple(_int(row, k, line) for k in ("block_m", "block_n", "num_warps", "num_stages"))
            times.setdefault(shape, {}).setdefault(cfg, []).append(ms)
    if not times:
        raise ResultsFileError(f"{path}: no fa2 rows with a finite median_ms")
    return {s: {c: statistics.median(v) for c, v in cfgs.items()} for s, cfgs in times.items()}


def grid_configs():
    return [(m, n, w, s) for m in GRID["block_m"] for n in GRID["block_n"]
            for w in GRID["num_warps"] for s in GRID["num_stages"]]


def spearman(xs, ys):
    """experiments/validation/metrics.py's Spearman correlation; None below 3 configs or when undefined."""
    if len(xs) < 3:
        return None
    rho = validate_spearman(xs, ys)
    return None if math.isnan(rho) else rho


def label(cfg) -> str:
    return f"{cfg[0]}x{cfg[1]} w{cfg[2]} s{cfg[3]}"


def _problem(shape):
    from algorithms.problem import AttentionProblem

    n, d, causal, batch, heads, dtype = shape
    return AttentionProblem(batch=batch, heads=heads, seqlen_q=n, head_dim=d, causal=causal,
                            dtype=dtype)


def predict_grid(measured: dict, gpu: str = "h100", jobs=None, executor="process",
                 progress=True) -> dict:
    """{shape: {config: (predicted µs, bottleneck)}} from the simulator."""
    from gpusim.explore import Task, engine_available, run_tasks, sweep_config

    if not engine_available():
        raise GpusimError("top_pick needs the simulator (gpusim.engine, simpy); run it on a CPU machine")
    tasks, keys = [], []
    for shape in sorted(measured):
        problem = _problem(shape)
        for cfg in grid_configs():
            tasks.append(Task("fa2", problem, sweep_config("fa2", problem, gpu, *cfg), gpu, True))
            keys.append((shape, cfg))
    rows = run_tasks(tasks, executor=executor, jobs=jobs, progress=progress, desc="top pick")
    predicted: dict = {}
    for (shape, cfg), r in zip(keys, rows):
        if r.get("feasible") and r.get("runtime_us") is not None:
            predicted.setdefault(shape, {})[cfg] = (r["runtime_us"], r.get("bottleneck"))
    return predicted


def predictions_from_csv(measured: dict, path) -> dict:
    """The same from experiments/validate.py's saved predictions
    (validation_predictions_<profile>.csv: key = algo|dtype|batch|heads|N|D|
    causal|block_m|block_n|warps|stages, runtime_us, bottleneck)."""
    try:
        with open(path, newline="") as f:
            saved = {r["key"]: r for r in csv.DictReader(f)}
    except (OSError, KeyError, csv.Error) as exc:
        raise ResultsFileError(f"cannot read predictions {path}: {exc}") from None
    predicted: dict = {}
    for shape in sorted(measured):
        n, d, causal, batch, heads, dtype = shape
        for cfg in grid_configs():
            key = "|".join(str(x) for x in ("fa2", dtype, batch, heads, n, d, int(causal), *cfg))
            r = saved.get(key)
            if r and r.get("runtime_us") not in (None, ""):
                predicted.setdefault(shape, {})[cfg] = (float(r["runtime_us"]), r.get("bottleneck"))
    return predicted


def predictions_from_json(measured: dict, path) -> dict:
    """The same from a JSON of experiments/autotune_prune.py precompute (no
    simulator needed), or from validate.py's predictions CSV; shapes or
    configs the file lacks are left out."""
    import json

    from gpusim.triton_prune import problem_key

    if str(path).endswith(".csv"):
        return predictions_from_csv(measured, path)
    try:
        with open(path) as f:
            data = json.load(f)
        table = {(e["problem_key"], e["config_key"]): e for e in data["entries"]}
    except (OSError, ValueError, KeyError) as exc:
        raise ResultsFileError(f"cannot read predictions {path}: {exc}") from None
    predicted: dict = {}
    for shape in sorted(measured):
        pk = problem_key(_problem(shape))
        for cfg in grid_configs():
            e = table.get((pk, f"m{cfg[0]}-n{cfg[1]}-w{cfg[2]}-s{cfg[3]}"))
            if e and e.get("runtime_us") is not None:
                predicted.setdefault(shape, {})[cfg] = (e["runtime_us"], e.get("bottleneck"))
    return predicted


def analyse(measured: dict, gpu: str = "h100", jobs=None, executor="process", progress=True,
            predicted: dict | None = None):
    if predicted is None:
        predicted = predict_grid(measured, gpu, jobs, executor, progress)
    out = []
    for shape in sorted(measured):
        n, d, causal, batch, heads, dtype = shape
        meas, pred = measured[shape], predicted.get(shape, {})
        row = {"seqlen": n, "head_dim": d, "causal": int(causal), "batch": batch, "heads": heads,
               "dtype": dtype, "n_measured": len(meas), "n_predicted": len(pred)}
        if not pred:
            row["pick"] = "no feasible prediction"
            out.append(row)
            continue
        unpredicted = [c for c in meas if c not in pred]
        if unpredicted:
            # A pick among a few predicted configs says nothing about the
            # explorer: score a shape only when every measured config was predicted.
            row["pick"] = (f"not scored: {len(unpredicted)} of {len(meas)} measured configs "
                           "have no prediction")
            out.append(row)
            continue
        by_pred = sorted(pred, key=lambda c: (pred[c][0], c))
        best = min(meas, key=lambda c: (meas[c], c))
        pick = by_pred[0]
        measured_picks = [c for c in by_pred if c in meas]
        if not measured_picks:
            row.update(pick=label(pick), pick_predicted_us=pred[pick][0], best=label(best),
                       best_ms=meas[best], pick_was_measured=False)
            out.append(row)
            continue
        stand_in = measured_picks[0]
        by_meas = sorted(meas, key=lambda c: (meas[c], c))
        common = [c for c in meas if c in pred]
        row.update(pick=label(stand_in) + ("" if stand_in == pick else f" (predicted best {label(pick)} not measured)"),
                   pick_predicted_us=pred[stand_in][0], pick_measured_ms=meas[stand_in],
                   pick_was_measured=stand_in == pick, best=label(best), best_ms=meas[best],
                   loss_pct=(meas[stand_in] / meas[best] - 1) * 100,
                   pick_measured_rank=by_meas.index(stand_in) + 1,
                   best_predicted_rank=by_pred.index(best) + 1 if best in pred else None,
                   spearman=spearman([pred[c][0] for c in common], [meas[c] for c in common]),
                   pick_bottleneck=pred[stand_in][1])
        row["within_bar"] = row["loss_pct"] <= BAR_PCT
        for k in SHORTLISTS:
            row[f"top{k}_loss_pct"] = (min(meas[c] for c in measured_picks[:k]) / meas[best] - 1) * 100
        out.append(row)
    return out


def markdown(rows, source: str, gpu: str, predictions: str | None = None, args: str = "",
             floor=()) -> str:
    from gpusim.artifacts import markdown_table

    done = [r for r in rows if r.get("loss_pct") is not None]
    body = []
    for r in rows:
        if r.get("loss_pct") is None:
            body.append([r["seqlen"], r["head_dim"], r["causal"], r.get("pick", ""), "", "",
                         r.get("best", ""), "", "", "", ""])
            continue
        body.append([r["seqlen"], r["head_dim"], r["causal"], r["pick"],
                     f"{r['pick_predicted_us']:.0f}", f"{r['pick_measured_ms']:.3f}", r["best"],
                     f"{r['best_ms']:.3f}", f"{r['loss_pct']:.1f}%",
                     f"{r['pick_measured_rank']}/{r['n_measured']}",
                     "" if r.get("spearman") is None else f"{r['spearman']:.2f}"])
    header = ["N", "D", "causal", "predicted-best config", "predicted µs", "its measured ms",
              "measured-best config", "best ms", "loss", "pick's measured rank", "Spearman"]
    lines = [f"# Top fa2 pick of the explorer vs the measured sweep ({gpu})", "",
             f"Measured: `{source}`. Predicted by gpusim over the grid block_m {GRID['block_m']} × "
             f"block_n {GRID['block_n']} × warps {GRID['num_warps']} × stages {GRID['num_stages']}. "
             f"Loss = measured time of the predicted-best config ÷ best measured − 1; the bar is "
             f"{BAR_PCT:.0f}%. Spearman: rank correlation of predicted and measured times over the "
             "shape's configs.", "",
             "Command: `PYTHONPATH=. python experiments/top_pick.py"
             + (f" {args}" if args else "") + "`"
             + (f" (predictions read from {predictions})" if predictions else
                " (predictions made by the simulator at run time)"), ""]
    if done:
        within = sum(r["within_bar"] for r in done)
        losses = [r["loss_pct"] for r in done]
        lines += [f"**{within} of {len(done)} shapes within {BAR_PCT:.0f}%**; loss mean "
                  f"{statistics.fmean(losses):.1f}%, median {statistics.median(losses):.1f}%, "
                  f"max {max(losses):.1f}%.", ""]
    lines.append(markdown_table(header, body).rstrip("\n"))
    if done:
        lines += ["", shortlist_table(done)]
    if floor:
        lines += ["", noise_table(floor)]
    return "\n".join(lines)


def noise_floor(runs: dict) -> list[tuple]:
    """What a perfect model would lose to the measurement's own spread: each
    run's fastest config per shape, timed in each other run, against that
    run's fastest. runs: {name: read_measured(...)}. [(from, in, losses %)]."""
    out = []
    for x, y in itertools.permutations(runs, 2):
        losses = []
        for shape, times in runs[x].items():
            other = runs[y].get(shape)
            pick = min(times, key=lambda c: (times[c], c))
            if other and pick in other:
                losses.append((other[pick] / min(other.values()) - 1) * 100)
        if losses:
            out.append((x, y, losses))
    return out


def noise_table(floor) -> str:
    from gpusim.artifacts import markdown_table

    body = [[f"`{x}`", f"`{y}`", f"{sum(v <= BAR_PCT for v in losses)} of {len(losses)}",
             f"{statistics.fmean(losses):.1f}%", f"{max(losses):.1f}%"] for x, y, losses in floor]
    return ("The measurement's own floor: each run's fastest config per shape, timed in another "
            "run of the same sweep, against that run's fastest (what a model that knew one run "
            "exactly would lose in the other).\n\n"
            + markdown_table(["fastest in", "timed in", f"shapes within {BAR_PCT:.0f}%", "loss mean",
                              "loss max"], body))


def shortlist_table(rows) -> str:
    """How autotuning only the model's k fastest configs would fare (gpusim.triton's
    prune hook with top_k = k): the fastest measured among them against the best."""
    from gpusim.artifacts import markdown_table

    body = []
    for k, key in [(1, "loss_pct")] + [(k, f"top{k}_loss_pct") for k in SHORTLISTS]:
        losses = [r[key] for r in rows]
        body.append([k, f"{sum(x <= BAR_PCT for x in losses)} of {len(losses)}",
                     f"{statistics.fmean(losses):.1f}%", f"{max(losses):.1f}%"])
    return ("Autotuning only the model's k fastest configs (`gpusim.triton.prune_configs_by(top_k=k)`): "
            "the fastest measured among them against the shape's best.\n\n"
            + markdown_table(["k", f"shapes within {BAR_PCT:.0f}%", "loss mean", "loss max"], body))


def main(argv=None) -> int:
    from gpusim.artifacts import atomic_write_text, ensure_dir, parse_int_list, repo_relative, write_csv

    ap = argparse.ArgumentParser(description="explorer's top fa2 pick vs the measured sweep")
    ap.add_argument("--measured", default=str(MEASURED))
    ap.add_argument("--out", default=str(RESULTS))
    ap.add_argument("--gpu", default="h100")
    ap.add_argument("--jobs", type=int, default=None)
    ap.add_argument("--no-progress", action="store_true")
    ap.add_argument("--predictions", default=None,
                    help="JSON of `autotune_prune.py precompute` or validate.py's "
                         "validation_predictions_<gpu>.csv instead of running the simulator")
    ap.add_argument("--seqlens", default=None, help="only these N (comma-separated)")
    ap.add_argument("--head-dims", default=None, help="only these head dims")
    ap.add_argument("--causal", default=None, help="only 0, 1 or 0,1")
    ap.add_argument("--repeats", default=None,
                    help="the same sweep measured again (comma-separated CSVs; '' for none): how "
                         "far the measurement alone moves each shape's fastest config (default: "
                         "the H100 sweep's two re-measurements, with the default --measured only)")
    a = ap.parse_args(argv)
    try:
        ensure_dir(a.out)     # (before minutes of predictions, not after)
        measured = read_measured(a.measured)
        for idx, text, flag in ((0, a.seqlens, "--seqlens"), (1, a.head_dims, "--head-dims"),
                                (2, a.causal, "--causal")):
            if text:
                keep = set(parse_int_list(text, flag, minimum=0))
                measured = {s: v for s, v in measured.items() if int(s[idx]) in keep}
        if not measured:
            raise ResultsFileError("no measured shape left after --seqlens/--head-dims/--causal")
        predicted = predictions_from_json(measured, a.predictions) if a.predictions else None
        rows = analyse(measured, a.gpu, a.jobs, progress=not a.no_progress, predicted=predicted)
        runs = {repo_relative(a.measured): measured}
        if a.repeats is None:   # (another sweep's repeats are not these)
            same = Path(a.measured).resolve() == MEASURED.resolve()
            a.repeats = ",".join(str(p) for p in REPEATS) if same else ""
        for path in (p for p in a.repeats.split(",") if p.strip()):
            runs[repo_relative(path)] = {s: v for s, v in read_measured(path).items() if s in measured}
        # a profile's name or .toml path, dots made underscores as validate.py's
        # files have them (Path.stem took h100.measured for h100)
        name = Path(a.gpu).name.removesuffix(".toml").replace(".", "_")
        md = markdown(rows, repo_relative(a.measured), name, a.predictions,
                      " ".join(argv if argv is not None else sys.argv[1:]), noise_floor(runs))
        write_csv(Path(a.out) / f"top_pick_{name}.csv", rows, FIELDS)
        atomic_write_text(Path(a.out) / f"top_pick_{name}.md", md)
    except GpusimError as exc:
        print(f"top_pick: error: {exc}", file=sys.stderr)
        return 2
    print(md)
    print(f"wrote {Path(a.out) / f'top_pick_{name}.md'} and .csv")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
