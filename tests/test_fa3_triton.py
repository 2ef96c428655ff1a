"""algorithms/fa3_triton: the schedule kernels/fa3.py compiles to under Triton
3.6 (no warp specialisation on sm_90): fa2's structure, TMA copies, the
launch's own warps, and the fp8 kernel on the bf16 kernel's loops."""
import dataclasses

import pytest

import algorithms
from algorithms.accounting import count
from algorithms.errors import InvalidConfig, UnsupportedAlgorithm
from algorithms.ops import TMA, Alu, DescriptorSetup, Load, Loop, Mma, MmaWait, Wait, walk
from algorithms.problem import AttentionProblem, TileConfig
from gpusim import predict
from gpusim.cli import main

PROBLEM = AttentionProblem(batch=2, heads=4, seqlen_q=1024, head_dim=64, causal=True)
CONFIG = TileConfig(block_m=128, block_n=128, num_warps=12, num_stages=2, mma="wgmma", consumer_warpgroups=2)


def _roles(problem, cta=3):
    schedule = algorithms.build("fa3_triton", problem, CONFIG)
    return schedule, schedule.launches[0].program(cta).roles


def test_launches_the_warps_triton_builds_and_copies_by_tma():
    schedule, roles = _roles(PROBLEM)
    launch = schedule.launches[0]
    assert launch.threads == 8 * 32            # 12 counted, the producer warpgroup never built
    assert len(roles) == 2                     # two 64-row warpgroups, as in fa2
    loads = [op for op in walk(roles[0].items) if isinstance(op, Load)]
    assert loads and {op.engine for op in loads} == {TMA}
    items = roles[0].items
    q = next(k for k, it in enumerate(items) if isinstance(it, Load) and it.tile.tensor == "Q")
    assert isinstance(items[q + 1], Wait)      # Q's mbarrier


@pytest.mark.parametrize("dtype", ["bf16", "fp8"])
def test_every_cta_first_builds_its_three_descriptors(dtype):
    """Both kernels build their Q, K and V (fp8: Vᵀ) descriptors on the device,
    each fenced on its own (three UTMACCTL.IV in the cross-compiled SASS):
    every warpgroup's program starts by waiting for them, and fa2, which
    copies by cp.async, does not."""
    from algorithms.fa3_triton import DEVICE_DESCRIPTORS
    from kernels import fa3

    problem = dataclasses.replace(PROBLEM, dtype=dtype)
    _, roles = _roles(problem)
    assert all(role.items[0] == DescriptorSetup(DEVICE_DESCRIPTORS) for role in roles)
    fa2_roles = algorithms.build("fa2", PROBLEM, CONFIG.with_(num_warps=8, mma="auto")).launches[0].program(3).roles
    assert not any(isinstance(op, DescriptorSetup) for role in fa2_roles for op in walk(role.items))
    assert fa3.compiled_resources(problem, CONFIG.with_(num_warps=8))["tma_descriptors"] == DEVICE_DESCRIPTORS


def test_descriptor_setup_is_waited_out_at_the_profiles_cycles():
    """A CTA that builds three descriptors takes 3 x copy.tma_descriptor_setup_cycles
    longer than the same CTA without them, and holds no unit meanwhile."""
    from algorithms.ops import IssueStalls
    from algorithms.schedule import CtaProgram, Launch, Role, Schedule
    from gpusim.engine import simulate
    from gpusim.engine.counters import DISPATCH_UNIT
    from gpusim.profile import load_profile

    gpu = load_profile("h100")

    def runtime(items):
        launch = Launch("one", 1, 128, 0, 32, lambda cta: CtaProgram((Role("warps", 4, tuple(items)),)),
                        classes=lambda: [(0, 1)], cost_key=lambda cta: 0)
        result = simulate(Schedule("probe", PROBLEM, None, (launch,), {}), gpu)
        return result.runtime_s, result.unit_busy
    base, _ = runtime([IssueStalls(100)])
    with_setup, busy = runtime([DescriptorSetup(3), IssueStalls(100)])
    assert gpu.copy.tma_descriptor_setup_cycles > 0
    assert with_setup - base == pytest.approx(3 * gpu.copy.tma_descriptor_setup_cycles / gpu.clock_hz, rel=1e-9)
    # (but the SM's warp dispatch, which launched the CTA)
    assert max(share for unit, share in busy.items() if unit != DISPATCH_UNIT) == 0.0


def test_same_bytes_as_fa2_at_the_launched_config():
    """Only the copy engine and the compiled counts differ: the global bytes
    are fa2's at 128x128 with 8 warps."""
    fa2 = count(algorithms.build("fa2", PROBLEM, CONFIG.with_(num_warps=8, mma="auto")))
    mine = count(algorithms.build("fa3_triton", PROBLEM, CONFIG))
    assert mine.global_read_bytes == fa2.global_read_bytes
    assert mine.global_write_bytes == fa2.global_write_bytes
    assert mine.flops_matmul == fa2.flops_matmul


def test_fp8_runs_the_bf16_loops_leaving_p_v_running():
    """The fp8 kernel folds each block's V scale into the accumulator's
    rescale, so its steps are the bf16 ones: unmasked blocks, then the
    masked ones, each P V left running into the next step; its steps issue
    more (the descale of S, P's layout change for the fp8 product)."""
    p8 = PROBLEM.with_(dtype="fp8")
    _, roles = _roles(p8)
    loops = [it for it in roles[0].items if isinstance(it, Loop)]
    assert [lp.name for lp in loops] == ["kv", "kv_masked"]
    for loop in loops:
        body = list(loop.body(0))
        pv = max(k for k, op in enumerate(body) if isinstance(op, Mma))
        assert not any(isinstance(op, MmaWait) for op in body[pv + 1:])
    bf16_steps = [op for it in _roles(PROBLEM)[1][0].items if isinstance(it, Loop)
                  for op in it.body(0) if isinstance(op, Alu)]
    fp8_steps = [op for it in loops for op in it.body(0) if isinstance(op, Alu)]
    assert [a.flops > b.flops for a, b in zip(fp8_steps, bf16_steps)] == [True, True]


def test_refuses_bad_configs_and_non_hopper_gpus():
    with pytest.raises(InvalidConfig, match="num_warps"):
        algorithms.check("fa3_triton", PROBLEM, CONFIG.with_(num_warps=6), 232448)
    with pytest.raises(InvalidConfig, match="num_stages"):
        algorithms.check("fa3_triton", PROBLEM, CONFIG.with_(num_stages=1), 232448)
    with pytest.raises(UnsupportedAlgorithm, match="fa3_triton needs Hopper"):
        predict(PROBLEM, None, "a100-80gb", algo="fa3_triton", simulate=False)


def test_cli_predicts_it_and_refuses_it_on_ampere(capsys):
    assert main(["predict", "--algo", "fa3_triton", "--batch", "1", "--heads", "2", "--seqlen", "512",
                 "--head-dim", "64", "--no-sim"]) == 0
    out = capsys.readouterr().out
    assert "fa3_triton on h100" in out and "warps=12" in out and "8 warps launched" in out
    assert main(["predict", "--algo", "fa3_triton", "--gpu", "a100-80gb", "--seqlen", "512", "--no-sim"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "needs Hopper" in err[0]
