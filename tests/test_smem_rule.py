"""The fa2 schedule's SMEM equals what Triton allocates, row by row of the probe."""
import csv
from pathlib import Path

import algorithms
from algorithms.problem import AttentionProblem, TileConfig

CSV = Path(__file__).resolve().parents[1] / "experiments/results/triton_smem_fa2.csv"


def test_fa2_smem_rule_matches_every_compiled_config():
    rows = list(csv.DictReader(CSV.open()))
    assert len(rows) >= 200
    for r in rows:
        p = AttentionProblem(batch=1, heads=1, seqlen_q=4096, head_dim=int(r["head_dim"]),
                             causal=r["causal"] == "1", dtype=r["dtype"])
        cfg = TileConfig(block_m=int(r["block_m"]), block_n=int(r["block_n"]),
                         num_warps=int(r["num_warps"]), num_stages=int(r["num_stages"]))
        schedule = algorithms.build("fa2", p, cfg)
        assert schedule.launches[0].smem_bytes == int(r["smem_bytes"]), r


def test_issue_examples():
    p = AttentionProblem(batch=4, heads=16, seqlen_q=4096, head_dim=128)
    fits = TileConfig(block_m=128, block_n=64, num_warps=8, num_stages=3)
    assert algorithms.build("fa2", p, fits).launches[0].smem_bytes == 131072
    too_big = fits.with_(block_n=128, num_stages=4)
    assert algorithms.module("fa2").smem_bytes(p, too_big) == 294912
