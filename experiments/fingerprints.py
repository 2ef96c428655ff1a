"""Fingerprint the engine's predictions, to show a change to the engine kept them bit-identical.

27 predictions: every schedule at B1 H16 N16k D128 and B4 H16 N2048 D64, causal and not; GQA
at an odd length; two many-CTA fa2 configs and an FA1 shape near L2's edge; three small cases
simulated in full (fast=False). Each prediction's JSON (runtime, bytes, busy fractions, per
launch) is written, and `--compare` says which differ from another run's file.

    PYTHONPATH=. python experiments/fingerprints.py --out /tmp/after.json [--compare /tmp/before.json]

Run it in a `git worktree` of the commit before a change (copy this file into its experiments/
if it is older: the script imports the checkout it sits in) and here after; the files must be
equal byte for byte. Session 23, bbf0c11 against 22a753d: 23 of 27 bit-identical, the other
four FA3's, whose schedule took the Gluon kernel's compiled instructions (67951e1).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from algorithms.problem import AttentionProblem, TileConfig  # noqa: E402
from gpusim import predict  # noqa: E402
from gpusim.artifacts import atomic_write_text  # noqa: E402

SCHEDULES = ("fa2", "fa3", "fa1", "standard", "fa3_triton")


def cases() -> list[tuple[str, dict, TileConfig | None, bool]]:
    out = []
    for algo in SCHEDULES:
        for causal in (False, True):
            out.append((algo, dict(batch=1, heads=16, seqlen_q=16384, head_dim=128, causal=causal), None, True))
            out.append((algo, dict(batch=4, heads=16, seqlen_q=2048, head_dim=64, causal=causal), None, True))
    out += [
        ("fa2", dict(batch=2, heads=8, kv_heads=2, seqlen_q=3000, head_dim=64, causal=True), None, True),
        ("fa2", dict(batch=16, heads=32, seqlen_q=1024, head_dim=64, causal=True), TileConfig(64, 32, 4, 2), True),
        ("fa2", dict(batch=1, heads=16, seqlen_q=16384, head_dim=128), TileConfig(128, 64, 4, 2), True),
        ("fa1", dict(batch=4, heads=32, seqlen_q=1024, head_dim=64), None, True),
        ("fa2", dict(batch=1, heads=4, seqlen_q=2048, head_dim=64, causal=True), None, False),
        ("standard", dict(batch=1, heads=2, seqlen_q=1024, head_dim=64, causal=True), None, False),
        ("fa1", dict(batch=1, heads=4, seqlen_q=1024, head_dim=64), None, False),
    ]
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="where to write the fingerprints (JSON)")
    parser.add_argument("--compare", help="an earlier run's file: list the predictions that differ")
    parser.add_argument("--gpu", default="h100")
    a = parser.parse_args(argv)
    prints = {}
    for algo, problem, cfg, fast in cases():
        key = f"{algo} {problem} {cfg} fast={fast}"
        t0 = time.perf_counter()
        pred = predict(AttentionProblem(**problem), cfg, a.gpu, algo=algo, fast=fast)
        prints[key] = pred.to_json()
        print(f"{time.perf_counter() - t0:6.2f} s  {key}  {pred.runtime_us!r} us", file=sys.stderr, flush=True)
    atomic_write_text(a.out, json.dumps(prints, indent=1, sort_keys=True, default=str))
    if a.compare:
        try:
            before = json.loads(Path(a.compare).read_text())
        except (OSError, ValueError) as e:
            print(f"fingerprints: cannot read {a.compare}: {e}", file=sys.stderr)
            return 2
        differ = sorted(k for k in prints.keys() | before.keys() if prints.get(k) != before.get(k))
        for k in differ:
            print(f"differs: {k}")
        print(f"{len(prints) - len(differ)} of {len(prints)} predictions bit-identical")
        return 1 if differ else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
