"""experiments/lockstep_probe.py: the engine's replay of the probe (the GPU runs skip without one)."""
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from experiments import lockstep_probe  # noqa: E402
from gpusim.engine import simulate  # noqa: E402
from gpusim.profile import load_profile  # noqa: E402

H100 = load_profile("h100")


def _loads(program):
    """Role 0's tiles in program order (its loop's copies included)."""
    from algorithms.ops import Load, walk
    return [op.tile for op in walk(program.roles[0].items) if isinstance(op, Load)]


def test_the_probe_has_one_cta_an_sm_each_on_its_own_tiles_or_the_same():
    shared = lockstep_probe.probe_schedule("shared", 2, 4, H100).launches[0]
    distinct = lockstep_probe.probe_schedule("distinct", 2, 4, H100).launches[0]
    assert shared.grid == distinct.grid == H100.gpu.sm_count
    rows = lambda launch, cta: [t.row for t in _loads(launch.program(cta))]
    assert rows(shared, 0) == rows(shared, 5) == [0, 0, 1, 1, 2, 2, 3, 3]
    assert rows(distinct, 5) == [5, 5, 6, 6, 7, 7, 8, 8]
    assert rows(distinct, 131)[:2] == [131, 131]
    # the ring wraps after its last tile
    wrap = lockstep_probe.probe_schedule("distinct", 2, lockstep_probe.RING_TILES, H100).launches[0]
    assert rows(wrap, 131)[-2:] == [(131 + lockstep_probe.RING_TILES - 1) % lockstep_probe.RING_TILES] * 2


def test_staggered_ctas_wait_in_proportion_and_one_pass_reads_the_ring_once_from_hbm():
    from algorithms.ops import Alu
    launch = lockstep_probe.probe_schedule("staggered", 2, 8, H100).launches[0]
    first = [launch.program(c).roles[0].items[0] for c in (0, 66, 131)]
    assert not isinstance(first[0], Alu)            # CTA 0 starts at once
    assert isinstance(first[1], Alu) and isinstance(first[2], Alu)
    assert not isinstance(launch.program(131).roles[1].items[0], Alu)    # warpgroup 1 meets it at the barrier
    assert first[2].flops / first[1].flops == pytest.approx(131 / 66, rel=0.01)
    steps = 8
    result = simulate(lockstep_probe.probe_schedule("shared", 2, steps, H100), H100, fast=False)
    tile_bytes = 2 * lockstep_probe.BLOCK_N * lockstep_probe.HEAD_DIM * 2   # K and V of one step
    # every CTA reads the same steps' tiles: HBM once, L2 every CTA's request
    assert result.hbm_read_bytes == steps * tile_bytes
    assert result.requested_bytes == steps * tile_bytes * H100.gpu.sm_count


@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs a CUDA GPU")
def test_the_probe_runs_on_the_gpu(tmp_path):
    assert lockstep_probe.main(["--where", "--out", str(tmp_path / "where.csv")]) == 0
    assert (tmp_path / "where.csv").read_text().count("\n") > 3 * 132


def test_the_gpu_steps_come_from_the_runs_after_the_first_and_the_flushed_pass(tmp_path):
    head = "mode,stages,rep,cta,sm,start_ns,loop_ns,step_ns\n"
    (tmp_path / "lockstep_probe_h100.csv").write_text(
        head + "shared,2,0,0,0,0,0,9999\nshared,2,1,0,0,0,0,1200\nshared,2,2,1,1,0,0,1300\n"
        "staggered,3,1,0,0,0,0,1000\n")
    (tmp_path / "lockstep_where_h100.csv").write_text(
        head + "where_flushed,2,0,0,0,0,0,1600\nwhere_all,2,0,0,0,0,0,1234\n")
    got = lockstep_probe.measured_steps(str(tmp_path))
    assert got == {("shared", 2, "warm"): 1250, ("staggered", 3, "warm"): 1000, ("shared", 2, "flushed"): 1600}
    assert lockstep_probe.measured_steps(str(tmp_path / "none")) == {}
