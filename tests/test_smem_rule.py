"""The fa2 schedule's and standard's QKᵀ SMEM and registers equal what Triton allocates, row by row of the probe."""
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
        # the sm_90 build runs with ptxas's registers (they set CTAs per SM)
        assert schedule.launches[0].regs_per_thread == int(r["n_regs"]), r


def test_standard_qk_takes_what_triton_allocates():
    """standard's QKᵀ launch (one CTA a row block of S) takes SMEM and
    registers from the probe table, row by row; its rule for configs the
    table lacks is exact at 8 warps with 2-4 stages and never below Triton."""
    from algorithms.standard import qk_rows_smem_bytes

    rows = list(csv.DictReader(CSV.with_name("triton_smem_standard_qk.csv").open()))
    assert len(rows) == 144
    for r in rows:
        for causal in (False, True):     # every tile computed either way: one row serves both
            p = AttentionProblem(batch=1, heads=1, seqlen_q=4096, head_dim=int(r["head_dim"]), causal=causal)
            cfg = TileConfig(block_m=int(r["block_m"]), block_n=int(r["block_n"]),
                             num_warps=int(r["num_warps"]), num_stages=int(r["num_stages"]))
            qk = algorithms.build("standard", p, cfg).launches[0]
            assert (qk.name, qk.smem_bytes, qk.regs_per_thread) == ("qk_gemm", int(r["smem_bytes"]), int(r["n_regs"])), r
        rule = qk_rows_smem_bytes(p, cfg)
        assert rule >= int(r["smem_bytes"]), r
        if cfg.num_warps == 8 and cfg.num_stages >= 2:
            assert rule == int(r["smem_bytes"]), r


def test_issue_examples():
    p = AttentionProblem(batch=4, heads=16, seqlen_q=4096, head_dim=128)
    fits = TileConfig(block_m=128, block_n=64, num_warps=8, num_stages=3)
    assert algorithms.build("fa2", p, fits).launches[0].smem_bytes == 131072
    too_big = fits.with_(block_n=128, num_stages=4)
    assert algorithms.module("fa2").smem_bytes(p, too_big) == 294912


def test_registers_are_allocated_per_warp_in_whole_units():
    """82 registers a thread take 88 (a warp's 2624 round up to 2816, units of
    256): 128-thread CTAs fit 5 to an SM, not the 6 that 82 x 128 would give."""
    import dataclasses

    from gpusim.occupancy import occupancy
    from gpusim.profile import load_profile

    gpu = load_profile("h100")
    assert gpu.residency.register_alloc_unit == 256
    p = AttentionProblem(batch=1, heads=32, seqlen_q=4096, head_dim=64)
    launch = algorithms.build("fa2", p, TileConfig(64, 32, 4, 2)).launches[0]
    tiny = dataclasses.replace(launch, smem_bytes=1024)   # registers alone limit it
    assert occupancy(dataclasses.replace(tiny, regs_per_thread=82), gpu).ctas_per_sm == 5
    assert occupancy(dataclasses.replace(tiny, regs_per_thread=80), gpu).ctas_per_sm == 6
    assert occupancy(dataclasses.replace(tiny, regs_per_thread=82), gpu).limiter == "registers"
