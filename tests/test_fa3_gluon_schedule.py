"""The host-side tile schedule of kernels/fa3_gluon.py's balanced persistent
launch (no GPU: the table is built on the CPU before the launch), and what
FA3's schedule takes from the kernel as compiled."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from algorithms.problem import AttentionProblem
from kernels import fa3_gluon as g

SMS = 132


def _makespan(costs, rows):
    return max(sum(costs[t] for t in row) for row in rows)


def _costs(problem, block_n=128):
    per_head = g.tile_blocks(problem, block_n)
    return [per_head[t % len(per_head)] + g.TILE_OVERHEAD_BLOCKS
            for t in range(len(per_head) * problem.batch * problem.heads)]


def test_tile_blocks_follow_the_causal_diagonal():
    """Causal N=1000 (8 Q tiles, the last one 104 rows): the first tile in
    launch order is the heaviest (all 8 K/V blocks of 128), the last sees one."""
    p = AttentionProblem(batch=1, heads=1, seqlen_q=1000, head_dim=128, causal=True)
    assert g.tile_blocks(p, 128) == [8, 7, 6, 5, 4, 3, 2, 1]
    # bottom-right aligned: Nkv = 4001 > Nq = 1000 lets every row see 3001 more keys
    p = AttentionProblem(batch=1, heads=1, seqlen_q=1000, seqlen_kv=4001, head_dim=128, causal=True)
    assert g.tile_blocks(p, 128)[0] == 32 and g.tile_blocks(p, 128)[-1] == 25
    p = AttentionProblem(batch=1, heads=1, seqlen_q=1000, head_dim=128, causal=False)
    assert g.tile_blocks(p, 64) == [16] * 8


@pytest.mark.parametrize("n, d", [(1024, 128), (4096, 128), (8192, 128), (4096, 64)])
def test_balanced_schedule_is_close_to_even(n, d):
    """Every tile exactly once; the busiest CTA within 2.5% of the average
    (the sweep's causal shapes, 132 SMs), where taking the tiles in head order,
    as the hardware does with one tile per CTA, leaves it 3-7% above."""
    p = AttentionProblem(batch=16384 // n, heads=2048 // d, seqlen_q=n, head_dim=d, causal=True)
    costs = _costs(p)
    rows = g.list_schedule(costs, g.tile_order(costs, SMS), SMS)
    assert sorted(t for row in rows for t in row) == list(range(len(costs)))
    average = sum(costs) / SMS
    head_order = _makespan(costs, g.list_schedule(costs, list(range(len(costs))), SMS))
    assert _makespan(costs, rows) <= 1.025 * average
    assert head_order >= 1.03 * average


def test_tile_order_sorts_only_the_tail():
    """One worker: the last TAIL_ROUNDS (4) tiles heaviest first, the rest as launched."""
    costs = [1, 5, 2, 9, 3, 7, 4]
    assert g.TAIL_ROUNDS == 4
    assert g.tile_order(costs, 1) == [0, 1, 2, 3, 5, 6, 4]
    assert g.tile_order(costs, 100) == [3, 5, 1, 6, 4, 2, 0]


@pytest.mark.parametrize("block_m, tiles_per_head", [(128, 8), (192, 6)])
def test_schedule_table_layout(block_m, tiles_per_head):
    """Row w: the count of CTA w's tiles, its tiles, then -1; every tile once
    (N=1000: 8 tiles of 128 rows a head, or 6 of 192)."""
    p = AttentionProblem(batch=2, heads=3, seqlen_q=1000, head_dim=64, causal=True)
    table = g._schedule_table(p, block_m, 128, 5, torch.device("cpu"))
    assert table.dtype == torch.int32 and table.shape[0] == 5
    seen = []
    for row in table.tolist():
        count = row[0]
        seen += row[1:1 + count]
        assert all(x == -1 for x in row[1 + count:])
    assert sorted(seen) == list(range(2 * 3 * tiles_per_head))


def test_tile_blocks_of_the_192_row_tile():
    """Three consumers' 192-row tiles, causal N=1000, block_n 128: the last
    tile (rows 960-999) sees 8 blocks, the first (rows 0-191) 2."""
    p = AttentionProblem(batch=1, heads=1, seqlen_q=1000, head_dim=128, causal=True)
    assert g.tile_blocks(p, 128, 192) == [8, 8, 6, 5, 3, 2]


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("consumers", [2, 3])
def test_compiled_smem_is_the_schedules(head_dim, consumers):
    """Cross-compiled for sm_90 on the CPU (bundled ptxas), the kernel's SMEM is
    the fa3 schedule's count (Q, the K/V ring, P's buffers with three
    consumers, O's where they fit, mbarriers) to within 512 B: the compiler
    pads the barriers and aligns each of up to five buffers (212-264 B over
    the count in these four builds), and the kernel is warp-specialised."""
    from algorithms import fa3
    from algorithms.problem import TileConfig

    p = AttentionProblem(batch=4, heads=16, seqlen_q=4096, head_dim=head_dim)
    cfg = (g.default_config(p) if consumers == 2 else
           TileConfig(block_m=192, block_n=128, num_warps=16, num_stages=2, mma="wgmma",
                      consumer_warpgroups=3, pingpong=False))
    info = g.compiled_info(p, cfg, pingpong=False)
    assert info["warp_specialized"]
    assert 0 <= info["smem_bytes"] - fa3.smem_bytes(p, cfg) <= 512, (info["smem_bytes"],
                                                                    fa3.smem_bytes(p, cfg))


def _consumer_softmax(problem, cfg):
    """(Alu, Exp) of a consumer's unmasked and masked steps, from FA3's schedule."""
    import algorithms
    from algorithms.ops import Alu, Exp, Loop

    launch = algorithms.build("fa3", problem, cfg).launches[0]
    consumer = launch.program(0).roles[1]
    (loop,) = [it for it in consumer.items if isinstance(it, Loop)]
    out = {}
    for k in range(loop.trips):
        ops = [op for op in loop.body(k) if isinstance(op, (Alu, Exp))]
        out.setdefault(loop.key(k), ops)     # (a step's key: whether it is masked)
    return out


def test_fa3_schedule_takes_the_gluon_kernels_compiled_instructions():
    """Where the probe compiled the config (triton_smem_fa3_gluon.csv), a
    consumer's step issues what the Gluon kernel's loop issues, its exp2s on
    the MUFU and the rest on the issue slots: unmasked the loop's shortest
    path, masked all of it. Elsewhere the estimate stands."""
    from algorithms.compiled import fa3_gluon_compiled
    from algorithms.fa2 import ALU_PER_ACC, ALU_PER_SCORE

    p = AttentionProblem(batch=1, heads=2, seqlen_q=1000, head_dim=128, causal=True)
    cfg = g.default_config(p)
    compiled = fa3_gluon_compiled(p, cfg)
    assert compiled.issue is not None and compiled.issue_masked > compiled.issue
    steps = _consumer_softmax(p, cfg)
    rows, exps = 64, 64 * cfg.block_n + 64
    for masked, per_warp in ((False, compiled.issue), (True, compiled.issue_masked)):
        alu, exp = steps[masked]
        assert exp.count == exps and alu.flops + exp.count == per_warp * 128
    # a config the Gluon kernel does not run (block_n 32): the softmax's arithmetic, estimated
    odd = dataclasses.replace(cfg, block_n=32)
    assert fa3_gluon_compiled(p, odd).issue is None
    alu, _ = _consumer_softmax(p, odd)[False]
    assert alu.flops == rows * 32 * ALU_PER_SCORE + rows * 128 * ALU_PER_ACC
