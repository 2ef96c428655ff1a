"""The calibration CSV: its columns, and the rows of repeated runs reduced to one
a (bench, param) (median_rows) and merged into the committed file (merge_rows).
"""
from __future__ import annotations

import csv
import math
import os

from . import ROOT

DEFAULT_CSV = os.path.join(ROOT, "experiments", "results", "calibration_h100.csv")

COLUMNS = ["bench", "param", "value", "unit", "clock_mhz_nvml", "clock_mhz_kernel", "detail",
           "gpu", "sm_count", "sm_clock_mhz", "max_sm_clock_mhz", "driver", "cuda", "torch",
           "triton", "cupy", "git_commit", "date", "command"]


def bench_values(bench: str, path: str = DEFAULT_CSV) -> dict[str, float]:
    """{param: value} of the calibration CSV's rows of `bench`."""
    with open(path, newline="") as f:
        return {r["param"]: float(r["value"]) for r in csv.DictReader(f) if r["bench"] == bench}


def median_rows(runs: list[list[dict]]) -> list[dict]:
    """One row a (bench, param) from repeated runs of the same steps: the
    row of the run whose value is the median (its clocks and detail stay
    with its value; of an even count, the lower middle), its detail
    extended with every run's value, so the spread stays in the CSV. Keys
    in one run only pass as they are."""
    by_key: dict = {}
    for rows in runs:
        for r in rows:
            by_key.setdefault((r["bench"], r["param"]), []).append(r)
    out = []
    for rows in by_key.values():
        numeric = []
        for r in rows:
            try:
                v = float(r["value"])
            except ValueError:
                continue
            if math.isfinite(v):
                numeric.append((v, r))
        if len(rows) == 1 or len(numeric) < 2:
            out.append(rows[0])
            continue
        numeric.sort(key=lambda t: t[0])
        _, pick = numeric[(len(numeric) - 1) // 2]
        values = " / ".join(r["value"] for r in rows)
        out.append({**pick, "detail": f"{pick['detail']}; median of {len(rows)} runs: {values}"})
    return out


def merge_rows(old_rows: list[dict], new_rows: list[dict]) -> tuple[list[dict], list[tuple]]:
    """The CSV's rows with a later run's merged in: a new row takes the place
    of the old one with the same (bench, param) -- the profile reads one
    figure a key, and a re-run is a re-measurement (git keeps the old one) --
    and rows the CSV lacks go at its end. Returns (rows, [(bench, param, old
    value or None, new value)])."""
    at = {(r["bench"], r["param"]): k for k, r in enumerate(old_rows)}
    rows, changes = list(old_rows), []
    for r in new_rows:
        key = (r["bench"], r["param"])
        if key in at:
            changes.append((*key, rows[at[key]]["value"], r["value"]))
            rows[at[key]] = r
        else:
            at[key] = len(rows)
            rows.append(r)
            changes.append((*key, None, r["value"]))
    return rows, changes
