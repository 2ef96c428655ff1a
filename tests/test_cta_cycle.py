"""Short CTAs (calibrate.py cta_cycle and cta_dispatch; not attention kernels)
replayed by the engine against their H100 timings
(experiments/results/calibration_h100.csv).

cta_cycle: CTAs that copy a tile in from HBM and out again through SMEM, then
retire. cta_dispatch: empty CTAs of 128 and 256 threads at 1-16 an SM.

Two profile numbers come from these rows: launch.warp_dispatch_cycles, from
empty 4-warp CTAs at 8, 12 and 16 an SM (the SM starts their warps one after
another), and launch.cta_turnover_cycles, from empty 8-warp CTAs at one an
SM less their warps' dispatch. The rows they were not taken from are the
test: 8-warp CTAs at 4 and 8 an SM must be bound by the same dispatch rate,
and with two and four CTAs per SM a copy round is bound by HBM, which the
engine must get from the bandwidth measured by other kernels (hbm_copy)."""
import csv
import os
import re

import pytest

CSV = os.path.join(os.path.dirname(__file__), "..", "experiments", "results", "calibration_h100.csv")
ROUNDS = (8, 40)   # as the microbenchmark launches them: the slope cancels the launch


def _rows(bench="cta_cycle"):
    """(bytes a CTA copies, CTAs an SM, dynamic SMEM, threads, us a round, NVML MHz) of a bench."""
    out = []
    for r in csv.DictReader(open(CSV)):
        if r["bench"] != bench:
            continue
        nbytes, per_sm = map(int, re.search(r"(\d+)B_x(\d+)$", r["param"]).groups())
        smem = int(re.search(r"dynamic smem (\d+) B", r["detail"]).group(1))
        threads = int(re.match(r"(\d+) threads", r["detail"]).group(1))
        out.append((nbytes, per_sm, smem, threads, float(r["value"]), float(r["clock_mhz_nvml"])))
    return out


def _copy_schedule(nbytes, grid, smem, threads):
    """Every CTA loads its own tile (no reuse: each one misses L2) and stores it."""
    from algorithms.ops import LD, Load, Store, Tile
    from algorithms.problem import AttentionProblem
    from algorithms.schedule import CtaProgram, Launch, Role, Schedule

    def program(cta):
        ops = (Load(Tile("X", 0, 0, cta), nbytes, LD), Store(Tile("Y", 0, 0, cta), nbytes)) if nbytes else ()
        return CtaProgram((Role("threads", threads // 32, ops),))

    launch = Launch("cta_cycle", grid, threads, smem, 32, program,
                    classes=lambda: [(0, grid)], cost_key=lambda cta: 0)
    problem = AttentionProblem(batch=1, heads=1, seqlen_q=128, head_dim=64)
    return Schedule("cta_cycle", problem, None, (launch,), {})


def _round_us(gpu, nbytes, per_sm, smem, threads) -> float:
    """The engine's time a round: the slope between launches of ROUNDS rounds, as measured."""
    from gpusim.engine import simulate

    times = [simulate(_copy_schedule(nbytes, gpu.gpu.sm_count * per_sm * n, smem, threads), gpu).runtime_s
             for n in ROUNDS]
    return (times[1] - times[0]) / (ROUNDS[1] - ROUNDS[0]) * 1e6


@pytest.fixture(scope="module")
def gpu():
    from gpusim.profile import load_profile

    return load_profile("h100.measured")


@pytest.fixture(scope="module")
def replayed(gpu):
    rows = _rows()
    assert len(rows) == 9
    return {(nbytes, per_sm): (_round_us(gpu, nbytes, per_sm, smem, threads), measured, mhz)
            for nbytes, per_sm, smem, threads, measured, mhz in rows}


@pytest.fixture(scope="module")
def dispatched(gpu):
    """Empty CTAs (the 1 KB rows re-read what the launch before left in L2,
    which a replay from a cold L2 does not): (threads, CTAs an SM) ->
    (engine, GPU) cycles a round, the engine's at the profile's clock, the
    GPU's at the NVML clock of the run: the engine counts cycles, and the
    GPU held 1980 MHz through these short launches."""
    rows = [r for r in _rows("cta_dispatch") if r[0] == 0]
    assert len(rows) == 10
    return {(threads, per_sm): (_round_us(gpu, 0, per_sm, smem, threads) * gpu.gpu.sm_clock_mhz, measured * mhz)
            for _, per_sm, smem, threads, measured, mhz in rows}


def test_occupancy_follows_dynamic_smem(gpu):
    """The replay holds as many CTAs per SM as the launch's SMEM allowed on the GPU."""
    from gpusim.occupancy import occupancy

    for nbytes, per_sm, smem, threads, *_ in _rows() + _rows("cta_dispatch"):
        launch = _copy_schedule(nbytes, 1, smem, threads).launches[0]
        assert occupancy(launch, gpu).ctas_per_sm == per_sm


def test_empty_cta_costs_its_turnover(replayed, gpu):
    """Where the turnover comes from: an empty 8-warp CTA an SM, its warps'
    dispatch and then its turnover, gives the round back in cycles (the
    engine's at the profile's 1816 MHz, the GPU's at the run's 1980) within
    2%; with no turnover the engine predicted zero."""
    predicted_us, measured_us, mhz = replayed[(0, 1)]
    predicted, measured = predicted_us * gpu.gpu.sm_clock_mhz, measured_us * mhz
    assert abs(predicted / measured - 1) <= 0.02, (predicted, measured)


@pytest.mark.parametrize("threads,per_sm", [(128, 8), (128, 12), (128, 16), (256, 4), (256, 8)])
def test_many_short_ctas_wait_for_the_sms_warp_dispatch(dispatched, threads, per_sm):
    """With many empty CTAs an SM, a round takes their warps' dispatch, one
    warp after another (49.4 cycles each): within 2% in cycles for the 4-warp
    rows the number comes from, and for the 8-warp rows held out (which take
    twice as long a CTA: the cost is the warps', not the CTA's). Without
    the dispatch the engine gave every such round one turnover (576 cycles
    for 8 to 16 CTAs: -66 to -85%)."""
    predicted, measured = dispatched[(threads, per_sm)]
    assert abs(predicted / measured - 1) <= 0.02, (predicted, measured)


@pytest.mark.parametrize("threads,per_sm", [(128, 1), (128, 2), (128, 4), (256, 1), (256, 2)])
def test_few_empty_ctas_an_sm_within_a_fifth(dispatched, threads, per_sm):
    """Where neither bound holds alone the engine is rougher: turnover and
    dispatch in a row, slot by slot, against a GPU that overlaps them
    partly. In cycles: 128 threads -6 / -19 / -16% at 1 / 2 / 4 an SM, 256
    threads +1 / -12% at 1 / 2 (the 256-thread row at one an SM is the
    turnover's source)."""
    predicted, measured = dispatched[(threads, per_sm)]
    assert abs(predicted / measured - 1) <= 0.20, (predicted, measured)


@pytest.mark.parametrize("nbytes", [16384, 32768])
@pytest.mark.parametrize("per_sm", [2, 4])
def test_copy_rounds_bound_by_hbm(replayed, nbytes, per_sm):
    """Held out: two and four CTAs per SM keep HBM busy, so a round takes its
    bytes over the copy bandwidth; the engine within 5%."""
    predicted, measured, _ = replayed[(nbytes, per_sm)]
    assert abs(predicted / measured - 1) <= 0.05, (predicted, measured)


def test_a_launch_of_many_short_ctas_names_warp_dispatch_as_its_bound(gpu):
    """The prediction says what bounds such a launch: the SMs' warp
    dispatch, busy nearly all of the time (16 empty 4-warp CTAs an SM, 40
    rounds); with one CTA an SM it idles between turnovers."""
    from gpusim.engine import simulate
    from gpusim.engine.counters import DISPATCH_UNIT

    rows = {(threads, per_sm): smem for nbytes, per_sm, smem, threads, *_ in _rows("cta_dispatch") if nbytes == 0}
    many = simulate(_copy_schedule(0, gpu.gpu.sm_count * 16 * ROUNDS[1], rows[(128, 16)], 128), gpu)
    assert many.bottleneck == DISPATCH_UNIT and many.unit_busy[DISPATCH_UNIT] > 0.9, many.unit_busy
    one = simulate(_copy_schedule(0, gpu.gpu.sm_count * ROUNDS[1], rows[(128, 1)], 128), gpu)
    assert one.unit_busy[DISPATCH_UNIT] < 0.35, one.unit_busy
