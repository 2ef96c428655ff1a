"""kernels.fa2.compiled_resources reproduces the committed SMEM probe CSV
(a live cross-compilation for sm_90; no GPU needed)."""
import csv
import os

import pytest

from algorithms.problem import AttentionProblem, TileConfig

CSV = os.path.join(os.path.dirname(__file__), "..", "experiments", "results", "triton_smem_fa2.csv")


def _row(bm, bn, w, s, d, c):
    for r in csv.DictReader(open(CSV)):
        if (int(r["block_m"]), int(r["block_n"]), int(r["num_warps"]), int(r["num_stages"]),
                int(r["head_dim"]), int(r["causal"])) == (bm, bn, w, s, d, c):
            return r
    raise LookupError((bm, bn, w, s, d, c))


@pytest.mark.parametrize("cfg", [(128, 64, 8, 3, 128, 0), (64, 32, 4, 1, 64, 1)])
def test_live_compile_matches_csv(cfg):
    pytest.importorskip("triton")
    from kernels.fa2 import compiled_resources

    bm, bn, w, s, d, c = cfg
    got = compiled_resources(AttentionProblem(1, 16, 4096, d, causal=bool(c)),
                             TileConfig(block_m=bm, block_n=bn, num_warps=w, num_stages=s))
    assert got["smem_bytes"] == int(_row(*cfg)["smem_bytes"])
    # the rule in kernels/NOTES.md
    buffers = 2 * s if s >= 2 else 1
    assert got["smem_bytes"] == 2 * d * (bm + bn * buffers)


@pytest.mark.parametrize("cfg", [(64, 64, 8, 128), (128, 64, 8, 128), (64, 32, 4, 64),
                                 (64, 128, 8, 64), (128, 32, 4, 128)])
def test_fa2_schedule_follows_the_compiled_wgmma_layout(cfg):
    """The fa2 schedule's warpgroup rule (algorithms.fa2.warpgroup_replicas) is
    what Triton compiles: with more warpgroups than 64-row slices, each computes
    all of S in narrower instructions and P V splits the head dim."""
    pytest.importorskip("triton")
    from algorithms.fa2 import TRITON_WARPGROUP_ROWS, warpgroup_replicas
    from algorithms.schedule import WARPS_PER_WARPGROUP
    from kernels.fa2 import compiled_resources

    bm, bn, w, d = cfg
    tile = TileConfig(block_m=bm, block_n=bn, num_warps=w, num_stages=2)
    got = compiled_resources(AttentionProblem(1, 16, 4096, d), tile)
    reps = warpgroup_replicas(tile)
    assert got["qk_instr_n"] == bn // reps
    assert got["pv_instr_n"] == d // reps
    # per warpgroup and iteration: its 64-row slices x N slices x K steps of 16
    slices_per_wg = max(1, bm // TRITON_WARPGROUP_ROWS // max(1, w // WARPS_PER_WARPGROUP))
    assert got["qk_instrs_per_iter"] == slices_per_wg * reps * (d // 16)
    assert got["pv_instrs_per_iter"] == slices_per_wg * (bn // 16)


def _live_and_table(cfg):
    """A live sm_90 compile of the fa2 kernel at cfg = (block_m, block_n,
    warps, stages, head_dim, causal), and what the schedule reads for it from
    the committed probe table (algorithms/compiled.py)."""
    pytest.importorskip("triton")
    from algorithms.compiled import fa2_compiled
    from kernels.fa2 import compiled_resources

    bm, bn, w, s, d, c = cfg
    problem = AttentionProblem(1, 16, 4096, d, causal=bool(c))
    tile = TileConfig(block_m=bm, block_n=bn, num_warps=w, num_stages=s)
    return compiled_resources(problem, tile), fa2_compiled(problem, tile)


@pytest.mark.parametrize("cfg", [(128, 64, 4, 3, 128, 0), (128, 64, 8, 3, 128, 0)])
def test_spills_match_the_probe_table(cfg):
    """The spill traffic the fa2 schedule charges (algorithms/compiled.py, from
    the committed probe CSV) is what a live sm_90 compile shows: 4 warps on
    128 x 128 accumulators run out of registers and spill in the hot loop, 8
    warps do not."""
    got, compiled = _live_and_table(cfg)
    table, w = compiled.spills, cfg[2]
    assert table is not None
    assert (got["spill_store_bytes_per_iter"], got["spill_load_bytes_per_iter"]) == \
        (table.store_bytes, table.load_bytes)
    assert tuple(int(x) for x in got["spill_wait_slacks"].split()) == table.wait_slacks
    assert (table.bytes > 0) == (w == 4) == (len(table.wait_slacks) > 0)


def test_fa2_schedule_charges_spills_on_hopper_only():
    """Each iteration stores the spilled registers of every thread to the CTA's
    stack and reloads them, through L2 (L1 barely keeps them: ncu), on Hopper
    (the sm_90 build), the reload in one plain load a wait the SASS has for it,
    each with its slack; elsewhere the build differs and the probe says nothing."""
    import algorithms
    from algorithms.compiled import fa2_spills
    from algorithms.ops import LD, Load, Loop, Store

    problem = AttentionProblem(1, 16, 4096, 128)
    tile = TileConfig(block_m=128, block_n=64, num_warps=4, num_stages=3)
    spills = fa2_spills(problem, tile)

    def spill_ops(hopper):
        schedule = algorithms.build("fa2", problem, tile, hopper=hopper)
        role = schedule.launches[0].program(0).roles[0]
        loop = next(it for it in role.items if isinstance(it, Loop))
        ops = [op for op in loop.body(0) if isinstance(op, (Load, Store)) and op.tile.tensor == "local"]
        return ops, "local" in schedule.tensors

    ops, declared = spill_ops(True)
    assert len(spills.wait_slacks) >= 2 and declared
    assert (type(ops[0]), ops[0].nbytes) == (Store, spills.store_bytes * tile.threads)
    reloads = ops[1:]
    assert all(isinstance(op, Load) and op.engine == LD for op in reloads)
    assert sum(op.nbytes for op in reloads) == spills.load_bytes * tile.threads
    assert tuple(op.slack for op in reloads) == spills.wait_slacks
    assert spill_ops(False) == ([], False)


@pytest.mark.parametrize("cfg", [(64, 32, 4, 3, 64, 1), (128, 64, 8, 3, 128, 0)])
def test_issue_counts_match_the_probe_table(cfg):
    """The instructions per step the fa2 schedule charges (from the committed
    probe CSV) are a live sm_90 compile's: the unmasked loop, then the masked
    one, which issues more (its selects and compares)."""
    got, table = _live_and_table(cfg)
    assert (got["issue_per_iter"], got["issue_per_iter_masked"]) == (table.issue, table.issue_masked)
    assert table.issue_masked > table.issue > 0


@pytest.mark.parametrize("cfg", [(64, 64, 4, 2, 128, 0), (128, 64, 8, 3, 128, 1)])
def test_outside_stalls_match_the_probe_table(cfg):
    """The stall clocks the fa2 schedule waits out before, between and after
    its loops (from the committed probe CSV) are a live sm_90 compile's."""
    got, table = _live_and_table(cfg)
    assert (got["stall_prologue"], got["stall_between"], got["stall_epilogue"]) == table.stalls
    assert min(table.stalls) > 0


def test_fa2_schedule_waits_out_the_stalls_outside_its_loops():
    """Each role of a Hopper fa2 CTA waits the compiled prologue's stalls
    first, the stalls between its two loops after the first one's last P V,
    and the epilogue's after the last P V, before its stores; the Ampere
    build (no probe rows) waits none."""
    import algorithms
    from algorithms.compiled import fa2_compiled
    from algorithms.ops import IssueStalls, Loop, MmaWait, Store

    problem = AttentionProblem(1, 4, 1024, 64, causal=True)
    tile = TileConfig(block_m=64, block_n=64, num_warps=8, num_stages=3)
    stalls = fa2_compiled(problem, tile).stalls
    for role in algorithms.build("fa2", problem, tile).launches[0].program(5).roles:
        items = role.items
        waits = [k for k, it in enumerate(items) if isinstance(it, IssueStalls)]
        assert [items[k].cycles for k in waits] == list(stalls)
        loops = [k for k, it in enumerate(items) if isinstance(it, Loop)]
        first_store = next(k for k, it in enumerate(items) if isinstance(it, Store))
        assert waits[0] == 0 and loops[0] < waits[1] < loops[1] < waits[2] < first_store
        assert isinstance(items[waits[1] - 1], MmaWait) and isinstance(items[waits[2] - 1], MmaWait)
    ampere = algorithms.build("fa2", problem, tile, hopper=False).launches[0].program(5).roles[0]
    assert not any(isinstance(it, IssueStalls) for it in ampere.items)


def test_fa2_schedule_charges_the_compiled_instructions():
    """On Hopper a step's elementwise work is the compiled loop's instructions
    (per warp, x 32 lanes, x the role's warps), masked steps the masked loop's:
    its exp2s on the MUFU, then the rest on the issue slots (an Alu op before
    the Exp); on Ampere (another build) the estimate from the softmax's arithmetic."""
    import algorithms
    from algorithms.compiled import fa2_compiled
    from algorithms.ops import Alu, Exp, Loop, walk

    problem = AttentionProblem(1, 4, 1024, 64, causal=True)
    tile = TileConfig(block_m=64, block_n=64, num_warps=8, num_stages=3)
    compiled = fa2_compiled(problem, tile)

    def elementwise(hopper, loop_name):
        role = algorithms.build("fa2", problem, tile, hopper=hopper).launches[0].program(5).roles[1]
        loop = next(it for it in role.items if isinstance(it, Loop) and it.name == loop_name)
        ops = list(walk(loop.body(0)))
        k = next(i for i, op in enumerate(ops) if isinstance(op, Exp))
        assert isinstance(ops[k - 1], Alu)   # one after the other
        return ops[k - 1].flops + ops[k].count

    lanes = 4 * 32   # a role is one warpgroup
    assert elementwise(True, "kv") == compiled.issue * lanes
    assert elementwise(True, "kv_masked") == compiled.issue_masked * lanes
    assert elementwise(False, "kv") not in (compiled.issue * lanes, compiled.issue_masked * lanes)


@pytest.mark.parametrize("dtype", ["bf16", "fp8"])
def test_fa3_triton_probe_rows_match_a_live_compile(dtype):
    """triton_smem_fa3.csv (the fa3_triton schedule's registers, SMEM and
    instructions) is what kernels/fa3.py compiles to, bf16 and fp8, each
    with an unmasked and a masked loop."""
    pytest.importorskip("triton")
    from algorithms.compiled import compiled
    from kernels.fa3 import compiled_resources

    problem = AttentionProblem(1, 16, 4096, 64, causal=True, dtype=dtype)
    tile = TileConfig(block_m=128, block_n=128, num_warps=8, num_stages=2)
    got = compiled_resources(problem, tile)
    table = compiled("fa3", problem, 8, tile)
    assert not got["warp_specialized"]
    assert (got["n_regs"], got["smem_bytes"], got["issue_per_iter"]) == \
        (table.registers, table.smem_bytes, table.issue)
    assert (got["stall_prologue"], got["stall_between"], got["stall_epilogue"]) == table.stalls
    assert got["issue_per_iter_masked"] == table.issue_masked


@pytest.mark.parametrize("causal", [0, 1])
def test_fa1_probe_rows_match_a_live_compile_and_set_its_occupancy(causal):
    """triton_smem_fa1.csv is what kernels/fa1.py compiles to at its default
    tile, and the fa1 schedule launches with those registers: 150 a thread
    (184 causal) at D = 64, so three CTAs an SM on an H100 (two causal),
    where the schedule's own estimate, 112, gave four."""
    pytest.importorskip("triton")
    import algorithms
    from algorithms.compiled import compiled
    from gpusim.occupancy import occupancy
    from gpusim.profile import load_profile
    from kernels.fa1 import compiled_resources

    problem = AttentionProblem(1, 16, 4096, 64, causal=bool(causal))
    tile = TileConfig(block_m=64, block_n=64, num_warps=4, num_stages=1)
    got = compiled_resources(problem, tile)
    table = compiled("fa1", problem, 4, tile)
    assert (got["n_regs"], got["smem_bytes"]) == (table.registers, table.smem_bytes)
    launch = algorithms.build("fa1", problem, tile).launches[0]
    assert launch.regs_per_thread == got["n_regs"]
    assert occupancy(launch, load_profile("h100")).ctas_per_sm == (2 if causal else 3)
