"""How much of a round trip's working set does the H100's L2 keep? Nsight Compute's DRAM bytes, not timings.

l2_keep_probe.py times round trips (each CTA reading its own part of a
working set and writing each piece back, pass after pass) and finds the
time a byte half-way between L2's pace and HBM's at about 38-43 MB with one
CTA an SM and 46-48 MB with four. A time can be half-way for two reasons:
half of the bytes miss, or fewer miss and a CTA that waits on each of its
round trips feels each miss more. ncu's DRAM read bytes tell which. The
same for kernels/fa1.py at batch 1 and 66-132 heads (one CTA an SM) at
N = 1024, D = 64, where the model's L2 keeps FA1's running O, l, m up to
about 50 MB (validation_notes.md, session 32).

Each row: the case, ncu's dram__bytes_read/write of the second launch (ncu
flushes the caches before it, as validate.py's ncu rows), and for the
round trips the fraction of the passes after the first that came from DRAM:
(read - working set) / ((passes - 1) x working set).

    PYTHONPATH=. python3 experiments/l2_keep_ncu.py --out $OUT/l2_keep_ncu_h100.csv   (GPU, ncu)
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from experiments.ncu_counters import counter_bytes, second_launch  # noqa: E402

METRICS = ["dram__bytes_read.sum", "dram__bytes_write.sum", "lts__t_sector_hit_rate.pct"]
# round trips: (CTAs an SM, piece bytes, layout, working set MB); fa1: (heads, seqlen)
ROUND_TRIPS = [(1, 16384, "pow2", mb) for mb in (24, 32, 36, 40, 44, 48)] + \
              [(4, 4096, "packed", mb) for mb in (32, 40, 44, 48, 52)]
# --clean: the same round trips (1 CTA an SM) with every k-th piece only read
# (k = 1: all clean; k = 3: a third clean, as FA1's Q beside its O, l, m)
CLEAN_TRIPS = [(1, 16384, "pow2", mb, k) for k in (1, 3) for mb in (36, 40, 44, 48)]
FA1_CASES = [(66, 1024), (100, 1024), (116, 1024), (132, 1024)]
H100_L2_BYTES = 50 * 2 ** 20     # NVIDIA H100 whitepaper (hw_profiles/h100.toml l2.capacity_bytes)


def round_trip_case(per_sm: int, piece: int, how: str, mb: int, sms: int = 132):
    """(ctas, pieces a CTA, stride, passes, working set bytes) as l2_keep_probe.py runs them."""
    from experiments.l2_keep_probe import layout

    ctas = sms * per_sm
    chunks, stride = layout(ctas, piece // 4, mb << 20, how)
    ws = ctas * chunks * piece
    return ctas, chunks, stride, max(8, -(-(1 << 30) // (2 * ws))), ws


def target(spec: str) -> None:
    """Runs under ncu: the case `spec` names, launched twice."""
    import torch

    kind, *args = spec.split(":")
    if kind == "rt":
        from experiments.l2_keep_probe import _round_trip

        per_sm, piece, how, mb = int(args[0]), int(args[1]), args[2], int(args[3])
        clean = int(args[4]) if len(args) > 4 else 0
        sms = torch.cuda.get_device_properties(0).multi_processor_count
        ctas, chunks, stride, passes, _ = round_trip_case(per_sm, piece, how, mb, sms)
        x = torch.zeros(ctas * stride, device="cuda", dtype=torch.float32)
        for _ in range(2):
            _round_trip[(ctas,)](x, chunks, stride, passes, CHUNK=piece // 4, CLEAN_EVERY=clean, num_warps=4)
    else:
        from algorithms.problem import TileConfig
        from kernels.fa1 import forward

        heads, seqlen = int(args[0]), int(args[1])
        q, k, v = (torch.randn(1, heads, seqlen, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        for _ in range(2):
            forward(q, k, v, config=TileConfig(64, 64, 4, 1))
    torch.cuda.synchronize()


def keep_all_fit(rows, capacity: int) -> tuple[int, float]:
    """The retention ramp's start (hw_profiles l2.keep_all_bytes) that fits
    the round trips' miss fractions best in least squares, with the ramp
    (working set - start) / (capacity - start) clamped to [0, 1], over every
    round-trip row (any CTAs an SM, clean or dirty) whose working set is at
    most `capacity`; searched on a 0.1 MB grid. Returns (start, rms error)."""
    pts = [(int(r["working_set_bytes"]), float(r["miss_fraction"])) for r in rows
           if r["case"].startswith("rt:") and r["miss_fraction"] not in ("", None)
           and int(r["working_set_bytes"]) <= capacity]
    if len(pts) < 3:
        raise ValueError(f"need 3 round-trip rows within {capacity} B, got {len(pts)}")

    def sse(start):
        return sum((min(1.0, max(0.0, (w - start) / (capacity - start))) - m) ** 2 for w, m in pts)

    start = min(range(0, capacity, 100_000), key=sse)
    return start, (sse(start) / len(pts)) ** 0.5


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "l2_keep_ncu_h100.csv"))
    ap.add_argument("--target", help=argparse.SUPPRESS)
    ap.add_argument("--clean", action="store_true", help="only CLEAN_TRIPS: round trips with clean pieces")
    ap.add_argument("--fit", nargs="+", metavar="CSV",
                    help="no GPU: print the retention ramp's start (l2.keep_all_bytes) that fits these "
                         "results' round trips against a 50 MiB L2 (keep_all_fit)")
    a = ap.parse_args(argv)
    if a.fit:
        import csv

        try:
            rows = [r for path in a.fit for r in csv.DictReader(open(path))]
            start, rms = keep_all_fit(rows, H100_L2_BYTES)
        except (OSError, KeyError, ValueError) as e:
            print(f"l2_keep_ncu: cannot fit {' '.join(a.fit)}: {e}", file=sys.stderr)
            return 2
        print(f"keep_all_bytes = {start}  ({start / 1e6:.1f} MB; rms miss-fraction error {rms:.3f} "
              f"over the round trips within {H100_L2_BYTES} B)")
        return 0
    if a.target is not None:
        target(a.target)
        return 0
    from experiments.gpu_probe import start
    from kernels.provenance import provenance, write_csv_atomic

    if start("l2_keep_ncu.py", a.out, argv, ncu=True) is None:    # before ncu's runs, not after
        return 2
    script = os.path.abspath(__file__)
    rows = []
    cases = ([("rt", c) for c in CLEAN_TRIPS] if a.clean else
             [("rt", c) for c in ROUND_TRIPS] + [("fa1", c) for c in FA1_CASES])
    for kind, c in cases:
        spec = ":".join(map(str, (kind, *c)))
        got = second_launch(script, spec, "_round_trip" if kind == "rt" else "_fa1_fwd", METRICS)
        row = {"case": spec, "dram_read_bytes": counter_bytes(got, METRICS[0]),
               "dram_write_bytes": counter_bytes(got, METRICS[1]),
               "l2_hit_rate_pct": got.get(METRICS[2], ("", ""))[0]}
        if kind == "rt":
            ctas, _, _, passes, ws = round_trip_case(*c[:4])
            row.update(working_set_bytes=ws, passes=passes,
                       miss_fraction=round((read * scale - ws) / ((passes - 1) * ws), 4))
        else:
            row.update(working_set_bytes=c[0] * c[1] * 392, passes=c[1] // 64, miss_fraction="")
        row.update(provenance(command="PYTHONPATH=. python3 experiments/l2_keep_ncu.py"))
        rows.append(row)
        print({k: row[k] for k in ("case", "dram_read_bytes", "dram_write_bytes", "l2_hit_rate_pct",
                                   "working_set_bytes", "miss_fraction")}, flush=True)
    write_csv_atomic(a.out, rows, list(rows[0]))
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

