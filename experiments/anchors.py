"""Predictions beside the measured H100 anchors (shared/reference/h100-anchors.md).

The anchors are torch SDPA backends, not our kernels, so each is paired with
the schedule that does what it does; nothing is tuned to them:
- FLASH_ATTENTION (FlashAttention-2, no Hopper instructions) ↔ fa2 with
  mma.sync and cp.async, block 128x64, 4 warps, 2 stages (FA2's forward tiles);
- CUDNN_ATTENTION (TMA + wgmma, FA3-class) ↔ fa3 at its default config;
- MATH (S and P through HBM) ↔ standard at its default config.

    python experiments/anchors.py [--gpus h100,h100.measured] [--out experiments/results/anchors_h100.md]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from algorithms.problem import AttentionProblem, TileConfig  # noqa: E402
from gpusim import predict  # noqa: E402
from gpusim.artifacts import atomic_write_text, write_csv  # noqa: E402

# Measured TFLOP/s from shared/reference/h100-anchors.md (2026-11-21, lent H100).
SEQLENS = (512, 1024, 2048, 4096, 8192, 16384)
ANCHORS = {  # (head_dim, causal, backend) -> TFLOP/s per N
    (64, 0, "CUDNN"): (388, 427, 453, 463, 450, 454),
    (64, 0, "FLASH"): (259, 293, 302, 308, 311, 313),
    (64, 0, "MATH"): (13, 14, 15, 15, 14, None),
    (64, 1, "CUDNN"): (258, 335, 392, 417, 439, 448),
    (64, 1, "FLASH"): (150, 211, 261, 282, 290, 298),
    (64, 1, "MATH"): (6, 6, 6, 6, 5, None),
    (128, 0, "CUDNN"): (509, 579, 605, 655, 605, 594),
    (128, 0, "FLASH"): (302, 332, 346, 357, 350, 353),
    (128, 0, "MATH"): (19, 21, 23, 23, 22, None),
    (128, 1, "CUDNN"): (315, 425, 490, 559, 552, 572),
    (128, 1, "FLASH"): (180, 245, 282, 304, 316, 327),
    (128, 1, "MATH"): (9, 9, 10, 10, 9, None),
}
FA2_PAPER_CONFIG = TileConfig(block_m=128, block_n=64, num_warps=4, num_stages=2, mma="mma.sync")
PAIRING = {"FLASH": ("fa2", FA2_PAPER_CONFIG), "CUDNN": ("fa3", None), "MATH": ("standard", None)}


def rows(gpus: list[str]):
    for (d, causal, backend), measured in ANCHORS.items():
        algo, config = PAIRING[backend]
        for n, tflops in zip(SEQLENS, measured):
            if tflops is None:
                continue
            problem = AttentionProblem(batch=16384 // n, heads=2048 // d, seqlen_q=n, head_dim=d,
                                       causal=bool(causal))
            row = {"head_dim": d, "causal": causal, "seqlen": n, "backend": backend, "algo": algo,
                   "measured_tflops": tflops}
            for gpu in gpus:
                pred = predict(problem, config, gpu, algo=algo)
                row[f"pred_{gpu}"] = round(pred.tflops, 1)
                row[f"err_{gpu}"] = round(pred.tflops / tflops - 1, 3)
                row[f"bottleneck_{gpu}"] = pred.bottleneck
            print(f"  {backend:<5} D={d} causal={causal} N={n}: measured {tflops}, "
                  + ", ".join(f"{g} {row[f'pred_{g}']}" for g in gpus), file=sys.stderr, flush=True)
            yield row


def markdown(table: list[dict], gpus: list[str]) -> str:
    out = ["| backend ↔ schedule | D | causal | N | measured TFLOP/s | "
           + " | ".join(f"predicted ({g}) | error" for g in gpus) + " |",
           "|---|---|---|---|---|" + "---|---|" * len(gpus)]
    for r in table:
        cells = " | ".join(f"{r[f'pred_{g}']} | {r[f'err_{g}']:+.0%}" for g in gpus)
        out.append(f"| {r['backend']} ↔ {r['algo']} | {r['head_dim']} | {r['causal']} | {r['seqlen']} | "
                   f"{r['measured_tflops']} | {cells} |")
    for g in gpus:
        for backend in ("FLASH", "CUDNN", "MATH"):
            errs = [abs(r[f"err_{g}"]) for r in table if r["backend"] == backend]
            out.append(f"\n{g}, {backend}: mean |error| {sum(errs) / len(errs):.0%} over {len(errs)} shapes")
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", default="h100,h100.measured")
    parser.add_argument("--out", default=str(ROOT / "experiments/results/anchors_h100.md"))
    a = parser.parse_args(argv)
    gpus = a.gpus.split(",")
    table = list(rows(gpus))
    atomic_write_text(a.out, markdown(table, gpus))
    write_csv(Path(a.out).with_suffix(".csv"), table)
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
