"""What calibrate.py's memory microbenchmarks measured on the H100, read from
the committed rows (experiments/results/calibration_h100.csv). The model's
memory is bandwidth shared among requests plus a fixed latency
(gpusim/engine/memory.py), with the L2's bandwidth one constant; these rows
say how far a lone load's latency moves when the memory is busy
(loaded_latency), and how the L2's rate moves over a launch (l2_ramp)."""
import csv
import re
from pathlib import Path

import pytest

from gpusim.profile import load_profile

CSV = Path(__file__).resolve().parents[1] / "experiments/results/calibration_h100.csv"


def _rows(regime: str) -> list[tuple[int, float, float]]:
    """(background CTAs, background GB/s, chase cycles) in CTA order."""
    out = []
    for r in csv.DictReader(open(CSV)):
        m = re.fullmatch(rf"{regime}_(\d+)ctas", r["param"]) if r["bench"] == "loaded_latency" else None
        if m:
            gbps = float(re.search(r"at (\d+) GB/s", r["detail"]).group(1))
            out.append((int(m.group(1)), gbps, float(r["value"])))
    return sorted(out)


@pytest.mark.parametrize("regime", ["dram", "l2"])
def test_rows_cover_idle_to_saturated(regime):
    rows = _rows(regime)
    assert [c for c, _, _ in rows] == [0, 16, 33, 66, 132, 264, 528], rows
    # more readers never read slower, and never make a lone load land sooner
    # (2% for the run-to-run spread of the repetitions)
    for (_, bw0, lat0), (_, bw1, lat1) in zip(rows, rows[1:]):
        assert bw1 >= 0.98 * bw0 and lat1 >= 0.98 * lat0, rows


def _latency_clock(param: str) -> tuple[float, float]:
    """(cycles, NVML MHz) of a latency_clock row."""
    row = next(r for r in csv.DictReader(open(CSV)) if r["bench"] == "latency_clock" and r["param"] == param)
    return float(row["value"]), float(row["clock_mhz_nvml"])


def test_hbm_latency_quadruples_at_saturation():
    """Idle, the chase matches latency_clock's lone chase at the top clock,
    whose split into SM cycles and memory ns gives the profile's figure at its
    own clock; with every SM streaming from HBM at its sustained bandwidth, a
    load waits 4.5x as long (696 -> 3124 cycles), where a bandwidth share
    alone would delay a 128 B request little (the model's shared server gives
    it 1/n of 3 TB/s: about 40 cycles with 528 requests in flight)."""
    measured = load_profile("h100.measured")
    rows = _rows("dram")
    _, _, idle = rows[0]
    _, bw_full, full = rows[-1]
    (alone, f_alone), (capped, f_capped) = _latency_clock("dram_alone_cycles"), _latency_clock("dram_capped_cycles")
    assert idle == pytest.approx(alone, rel=0.05)
    per_mhz = (alone - capped) / (f_alone - f_capped)
    at_profile = alone - per_mhz * (f_alone - measured.gpu.sm_clock_mhz)
    assert measured.hbm.latency_cycles == pytest.approx(at_profile, abs=1.0)
    assert measured.hbm.latency_cycles < idle      # fewer SM cycles at the profile's lower clock
    assert bw_full >= 0.98 * measured.hbm.sustained_bandwidth_gbps
    assert full >= 3 * idle
    # below 60% of the bandwidth the latency stays within 10% of idle
    for _, bw, lat in rows:
        if bw < 0.6 * bw_full:
            assert lat <= 1.1 * idle, rows


def test_l2_latency_moves_little():
    """L2 hits: 283 cycles idle, at most 40% more with 528 readers pulling
    10.9 TB/s out of a 16 MB set."""
    rows = _rows("l2")
    idle = rows[0][2]
    assert all(lat <= 1.4 * idle for _, _, lat in rows), rows


# bytes one step of calibrate.py's l2_read moves with 528 CTAs (4 loads of 2048 fp32 a CTA)
L2_READ_STEP = 528 * 4 * 2048 * 4


def _ramp() -> dict[str, float]:
    return {r["param"]: float(r["value"]) for r in csv.DictReader(open(CSV)) if r["bench"] == "l2_ramp"}


def _ramp_rate(ms: dict, working_set: str, a: float, b: float) -> float:
    """GB/s added between l2_ramp's launches of a and b GB over working_set
    ("16MB", "2048MB"): whole steps a launch (calibrate.bench_l2_ramp), and
    the launches' fixed costs cancel in the difference."""
    def moved(gb):
        return int(gb * (1 << 30)) // L2_READ_STEP * L2_READ_STEP
    return (moved(b) - moved(a)) / ((ms[f"{working_set}_{b}GB"] - ms[f"{working_set}_{a}GB"]) * 1e-3) / 1e9


def test_l2_rate_climbs_over_a_launch():
    """Re-reading 16 MB with 528 CTAs, launches of 0.5-8 GB add bytes at the
    rate the profile takes for the L2 (7.6 TB/s, measured with 4 GB launches:
    within 10%); from 16 GB (2 ms) on the rate climbs, to 1.3x that between
    the 32 and the 64 GB launches (3.7 -> 6.7 ms). Kernels of a few ms (fa2
    at N = 16k) see an L2 faster than the profile's; short ones do not."""
    ms = _ramp()
    l2 = load_profile("h100").l2.bandwidth_gbps
    for a, b in ((0.5, 1), (1, 2), (2, 4), (4, 8)):
        rate = _ramp_rate(ms, "16MB", a, b)
        assert rate == pytest.approx(l2, rel=0.10), (a, b, rate)
    assert _ramp_rate(ms, "16MB", 32, 64) >= 1.3 * l2


def test_hbm_rate_holds_over_a_launch():
    """From HBM (a 2 GB set) the same launches add bytes at 2.7-3.0 TB/s
    whatever their length: no climb (within 10% of the profile's sustained
    bandwidth from 0.5 GB on)."""
    ms = _ramp()
    hbm = load_profile("h100").hbm.sustained_bandwidth_gbps
    sizes = (0.5, 1, 2, 4, 8)
    for a, b in zip(sizes, sizes[1:]):
        rate = _ramp_rate(ms, "2048MB", a, b)
        assert rate == pytest.approx(hbm, rel=0.10), (a, b, rate)


def test_event_loop_times_include_the_host_launch():
    """calibrate.py's event_loop (events around each call, a sync between
    calls) times an l2_read launch with no work at 34-37 us, do_bench (which
    keeps the GPU busy while the host submits) at 5.0 us: the event_loop
    figures carry some 30 us of Triton's host launch path, so rates from
    them (l2, l2_duration, l2_ramp) are read from differences between
    launches of different lengths, where it cancels. Timed by do_bench, the
    rate between 8 and 64 steps a CTA is the profile's L2 bandwidth (10%)."""
    rows = {r["param"]: float(r["value"]) for r in csv.DictReader(open(CSV)) if r["bench"] == "launch_fill"}
    assert rows["528ctas_0steps"] >= 5 * rows["528ctas_0steps_do_bench"]
    # behind a GPU sleep (event_loop(host_cover=True)) the host launch is hidden
    for grid in (132, 528):
        assert rows[f"{grid}ctas_0steps_covered"] <= 1.5 * rows["528ctas_0steps_do_bench"]
        assert rows[f"{grid}ctas_0steps"] - rows[f"{grid}ctas_0steps_covered"] >= 20
    rate = 56 * L2_READ_STEP / ((rows["528ctas_64steps_do_bench"] - rows["528ctas_8steps_do_bench"]) * 1e-6) / 1e9
    assert rate == pytest.approx(load_profile("h100").l2.bandwidth_gbps, rel=0.10), rate
