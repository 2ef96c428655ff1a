"""The explorer's fa2 picks run again on the GPU, beside the sweep's best configs.

top_pick.py compares each pick with timings of the measured sweep, taken hours
earlier. This re-measures both in one run, so the comparison does not ride on
run-to-run drift:

    # here: the kernels.bench command for the picks and the sweep's best configs
    PYTHONPATH=. python experiments/top_pick_live.py plan [--picks experiments/results/top_pick_h100.csv]
    # on the GPU machine: run that command (it writes top_pick_live_h100.csv)
    # here: each pick's live time over the fastest config of the same run
    PYTHONPATH=. python experiments/top_pick_live.py analyse --live experiments/results/top_pick_live_h100.csv

`analyse` writes top_pick_live_h100.md beside the live CSV. Needs no simulator.
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from algorithms.errors import ResultsFileError  # noqa: E402
from experiments.top_pick import BAR_PCT, RESULTS  # noqa: E402
from gpusim.artifacts import read_csv_rows  # noqa: E402

PICKS = RESULTS / "top_pick_h100.csv"


def _spec(config: str) -> str:
    """'128x64 w8 s3' -> 'fa2@128x64x8x3' (kernels.bench's --kernels form)."""
    try:
        tile, warps, stages = config.split()
        return f"fa2@{tile}x{int(warps[1:])}x{int(stages[1:])}"
    except ValueError:
        raise ResultsFileError(f"config {config!r} is not like '128x64 w8 s3'") from None


def _shape(row: dict) -> tuple[int, int, int]:
    return int(row["seqlen"]), int(row["head_dim"]), int(row["causal"])


def plan(picks_path) -> str:
    picks = read_csv_rows(picks_path)
    if not picks:
        raise ResultsFileError(f"{picks_path} has no rows")
    specs = sorted({_spec(r["pick"]) for r in picks} | {_spec(r["best"]) for r in picks})
    return (f"python -m kernels.bench --kernels {','.join(specs)} --rep 40 "
            f"--out $OUT/top_pick_live_h100.csv")


def analyse(picks_path, live_path) -> tuple[list[dict], str]:
    picks = {_shape(r): r for r in read_csv_rows(picks_path)}
    live_rows = read_csv_rows(live_path)
    live: dict[tuple, dict[str, float]] = {}
    for r in live_rows:
        if r.get("status") == "ok" and r["kernel"].startswith("fa2@"):
            live.setdefault(_shape(r), {})[r["config"]] = float(r["ms"])
    rows = []
    for shape in sorted(picks):
        times = live.get(shape, {})
        pick = picks[shape]["pick"]
        if pick not in times or not times:
            continue
        best = min(times, key=times.get)
        loss = (times[pick] / times[best] - 1) * 100
        rows.append({"seqlen": shape[0], "head_dim": shape[1], "causal": shape[2], "pick": pick,
                     "pick_ms": times[pick], "best": best, "best_ms": times[best],
                     "loss_pct": round(loss, 2), "configs_run": len(times)})
    if not rows:
        raise ResultsFileError(f"{live_path} has no ok fa2 row for a pick of {picks_path}")
    losses = [r["loss_pct"] for r in rows]
    within = sum(x <= BAR_PCT for x in losses)
    any_row = live_rows[0]
    lines = [
        "# The explorer's fa2 picks, run live on the GPU",
        "",
        f"Picks from `{Path(picks_path).name}`; timed with the sweep's best configs in one run "
        f"(`{Path(live_path).name}`: {any_row.get('gpu', '?')}, driver {any_row.get('driver', '?')}, "
        f"commit {any_row.get('git_commit', '?')}, {any_row.get('date', '?')}). Loss = pick's ms over "
        f"the fastest config of the same run, minus 1.",
        "",
        f"**{within} of {len(rows)} picks within {BAR_PCT:.0f}%**; loss median "
        f"{statistics.median(losses):.1f}%, mean {statistics.mean(losses):.1f}%, max {max(losses):.1f}%.",
        "",
        "| N | D | causal | pick | pick ms | fastest in the run | its ms | loss |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(f"| {r['seqlen']} | {r['head_dim']} | {r['causal']} | {r['pick']} | {r['pick_ms']:.4f} | "
                     f"{r['best']} | {r['best_ms']:.4f} | {r['loss_pct']:+.1f}% |")
    return rows, "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="re-run the explorer's fa2 picks live")
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("plan", help="print the kernels.bench command")
    p.add_argument("--picks", default=str(PICKS))
    a2 = sub.add_parser("analyse", help="losses of the picks in a live run")
    a2.add_argument("--picks", default=str(PICKS))
    a2.add_argument("--live", required=True)
    a = ap.parse_args(argv)
    try:
        if a.cmd == "plan":
            print(plan(a.picks))
            return 0
        from gpusim.artifacts import atomic_write_text
        _, md = analyse(a.picks, a.live)
        out = Path(a.live).with_suffix(".md")
        atomic_write_text(out, md)
        print(md)
        print(f"wrote {out}")
    except ResultsFileError as exc:
        print(f"top_pick_live: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
