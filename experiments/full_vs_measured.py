"""The engine's full simulation, not its fast path, against the measured sweep.

validate.py judges what users get, the fast path. When the question is
whether the model itself (its units, L2, HBM) is right, the fast path's own
error is in the way; this predicts every fa2 config of a few shapes with
fast=False and prints, per shape, MAPE, Spearman and top-1 loss against
experiments/results/validation_h100.csv. CPU only; full simulations cost
seconds to minutes each, so use many cores (the GPU machine's 16).

    PYTHONPATH=. python experiments/full_vs_measured.py --jobs 16 --out $OUT/full_vs_measured.csv \
        [--shapes 64:0:2048,128:1:4096] [--label NAME]
"""
from __future__ import annotations

import argparse
import csv
import os
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from kernels.provenance import write_csv_atomic  # noqa: E402
from experiments.validation.loading import load_measurements  # noqa: E402
from experiments.validation.metrics import mape, spearman, top1_loss  # noqa: E402
from experiments.validation.predictions import _row_key, predictions_path  # noqa: E402

# (head dim, causal, N): the shapes whose config ranking the L2 question moved
# most (session 26): D64 non-causal at N >= 2048, D128 at N4096, and two
# small ones
DEFAULT_SHAPES = "64:0:2048,64:0:4096,128:0:4096,128:1:4096,64:1:1024,128:0:1024"
FIELDS = ("key", "algo", "head_dim", "causal", "seqlen", "config", "measured_us", "full_us", "label",
          "profile", "seconds")


def parse_shapes(text: str) -> list[tuple[int, int, int]]:
    out = []
    for part in text.split(","):
        try:
            d, c, n = (int(x) for x in part.split(":"))
        except ValueError:
            raise ValueError(f"full_vs_measured: shape {part!r} is not D:causal:N (e.g. 64:0:2048)") from None
        out.append((d, c, n))
    return out


def _full(args):
    profile, row = args
    import gpusim

    t0 = time.time()
    try:
        us = gpusim.predict(row["problem"], row["config"], profile, algo=row["algo"], fast=False).runtime_us
    except Exception as e:  # reported, not fatal
        print(f"  {_row_key(row)}: {type(e).__name__}: {e}", file=sys.stderr)
        us = None
    return us, time.time() - t0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--shapes", default=DEFAULT_SHAPES, help="D:causal:N,... (fa2 rows of these shapes)")
    ap.add_argument("--profile", default="h100")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--label", default="", help="a name for this model variant, kept in the CSV")
    a = ap.parse_args(argv)
    try:
        shapes = set(parse_shapes(a.shapes))
    except ValueError as e:
        print(e, file=sys.stderr)
        return 2
    rows = [r for r in load_measurements()
            if r["algo"] == "fa2" and (r["problem"].head_dim, int(r["problem"].causal), r["problem"].seqlen_q) in shapes]
    if not rows:
        print(f"full_vs_measured: no fa2 rows for shapes {a.shapes}", file=sys.stderr)
        return 2
    print(f"{len(rows)} rows, {a.jobs} jobs", flush=True)
    with ProcessPoolExecutor(max_workers=a.jobs) as ex:
        results = list(ex.map(_full, [(a.profile, r) for r in rows]))
    out = []
    for r, (us, secs) in zip(rows, results):
        p, c = r["problem"], r["config"]
        out.append({"key": _row_key(r), "algo": r["algo"], "head_dim": p.head_dim, "causal": int(p.causal),
                    "seqlen": p.seqlen_q, "config": f"{c.block_m}x{c.block_n}x{c.num_warps}x{c.num_stages}",
                    "measured_us": r["ms"] * 1e3, "full_us": us, "label": a.label, "profile": a.profile,
                    "seconds": round(secs, 1)})
    write_csv_atomic(a.out, out, FIELDS)
    # the fast path's saved predictions of the same rows (validate.py report), beside
    fast = {}
    try:
        with open(predictions_path(a.profile)) as f:
            fast = {r["key"]: float(r["runtime_us"]) for r in csv.DictReader(f) if r.get("runtime_us")}
    except OSError:
        pass
    for shape in sorted(shapes):
        part = [o for o in out if (o["head_dim"], o["causal"], o["seqlen"]) == shape and o["full_us"]]
        if len(part) < 2:
            continue
        meas = [o["measured_us"] for o in part]
        line = f"D{shape[0]} causal {shape[1]} N{shape[2]}: {len(part)} configs"
        for what, pred in (("full", [o["full_us"] for o in part]), ("fast, saved", [fast.get(o["key"]) for o in part])):
            if None in pred:
                continue
            line += (f"; {what}: MAPE {mape(pred, meas):.1%}, Spearman {spearman(pred, meas):.2f}, "
                     f"top-1 loss {top1_loss(pred, meas):.1%}")
        print(line + f" ({statistics.median(o['seconds'] for o in part):.0f} s a full simulation)", flush=True)
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
