"""experiments/calibrate.py on the CPU: the measured profile is a pure function
of the committed CSV, repeated runs merge by their median, and clocks are
read in the kernel where a row has them."""
import math
import tomllib

import pytest

from experiments.calibration import reduce as calibration_reduce
from experiments.calibration import rows as calibration_rows
from experiments.calibration import runner as calibration_runner
from gpusim.profile import profiles_dir

# h100.toml takes these from our microbenchmarks (the rest: datasheets, papers);
# they must be the numbers h100.measured.toml derives from the same CSV
# (Not the dot_chain reduction's chain latency and serial fraction: h100.toml
# keeps session 22's reduction, with the unit rates then timed against the
# global timer; h100.measured.toml reduces with each SM's own cycles since
# session 30. Nor the CTA's launch costs: h100.toml keeps the turnover of
# 2026-11-22 and no warp dispatch, h100.measured.toml takes session 39's. Their
# cites say why: its CI guard.)
MEASURED_IN_H100 = [("l2", "bandwidth_gbps"), ("l2", "sm_port_bytes_per_clk"),
                    ("l2", "sm_store_bytes_per_clk"), ("launch", "kernel_launch_us"),
                    ("copy", "tma_descriptor_setup_cycles"),
                    ("l2", "sm_store_bytes_per_clk_per_warp")]


@pytest.fixture(scope="module")
def calibrate():
    from experiments import calibrate   # (imports the kernels' provenance helpers: inside the fixture)
    return calibrate


def _profile(name):
    return tomllib.loads((profiles_dir() / f"{name}.toml").read_text())


def test_measured_profile_is_derived_from_the_committed_csv(calibrate, tmp_path):
    """`calibrate.py profile` on experiments/results/calibration_h100.csv writes
    the committed h100.measured.toml byte for byte: no number in it was typed in."""
    out = tmp_path / "h100.measured.toml"
    assert calibrate.main(["profile", "--out", str(out)]) == 0
    assert out.read_text() == (profiles_dir() / "h100.measured.toml").read_text()


@pytest.mark.parametrize("section, key", MEASURED_IN_H100)
def test_h100_takes_the_measured_numbers_as_measured(section, key):
    h100, measured = _profile("h100"), _profile("h100.measured")
    assert h100[section][key] == pytest.approx(measured[section][key], rel=1e-9), (section, key)
    assert "our microbenchmark" in h100["sources"][f"{section}.{key}"]


def _row(bench, param, value, **extra):
    return {"bench": bench, "param": param, "value": value, "detail": extra.pop("detail", "d"), **extra}


def test_median_rows_keeps_the_median_runs_row_and_every_value():
    runs = [[_row("l2", "16MB", "7900", clock_mhz_kernel="1800", detail="run a")],
            [_row("l2", "16MB", "7500", clock_mhz_kernel="1700", detail="run b"), _row("hbm", "copy", "2976")],
            [_row("l2", "16MB", "8100", clock_mhz_kernel="1900", detail="run c")]]
    rows = {(r["bench"], r["param"]): r for r in calibration_rows.median_rows(runs)}
    l2 = rows["l2", "16MB"]
    # the run whose value is the median keeps its clock and detail with it
    assert (l2["value"], l2["clock_mhz_kernel"]) == ("7900", "1800")
    assert l2["detail"].startswith("run a") and "median of 3 runs: 7900 / 7500 / 8100" in l2["detail"]
    assert rows["hbm", "copy"]["value"] == "2976"      # in one run only: as it is


def test_median_of_an_even_count_is_the_lower_middle():
    runs = [[_row("x", "p", v)] for v in ("4", "1", "3", "2")]
    assert calibration_rows.median_rows(runs)[0]["value"] == "2"


def test_merge_replaces_a_key_in_place_and_appends_new_ones():
    old = [_row("a", "1", "10"), _row("b", "1", "20"), _row("c", "1", "30")]
    rows, changes = calibration_rows.merge_rows(old, [_row("b", "1", "21"), _row("d", "1", "40")])
    assert [(r["bench"], r["value"]) for r in rows] == [("a", "10"), ("b", "21"), ("c", "30"), ("d", "40")]
    assert changes == [("b", "1", "20", "21"), ("d", "1", None, "40")]
    assert [r["value"] for r in old] == ["10", "20", "30"]     # the old rows are not touched


def test_merge_of_a_file_without_the_columns_is_one_line_and_exit_2(calibrate, tmp_path, capsys):
    csv_path = tmp_path / "calibration.csv"
    csv_path.write_text("bench,param,value\nl2,16MB,7900\n")
    before = csv_path.read_text()
    new = tmp_path / "run.csv"
    new.write_text("what,when\nx,y\n")
    assert calibrate.main(["merge", "--csv", str(csv_path), "--new", str(new)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("calibrate: ") and "no column 'bench'" in err, err
    assert csv_path.read_text() == before      # nothing written


def test_merge_writes_the_merged_rows(calibrate, tmp_path):
    header = ",".join(calibration_rows.COLUMNS)
    csv_path = tmp_path / "calibration.csv"
    csv_path.write_text(f"{header}\nl2,16MB,7600,GB/s,1980,,old,,,,,,,\n")
    runs = []
    for k, v in enumerate(("7921", "7800", "8000")):
        path = tmp_path / f"run{k}.csv"
        path.write_text(f"{header}\nl2,16MB,{v},GB/s,1980,,new {k},,,,,,,\n")
        runs += ["--new", str(path)]
    assert calibrate.main(["merge", "--csv", str(csv_path), *runs]) == 0
    from gpusim.artifacts import read_csv_rows
    (row,) = read_csv_rows(csv_path)
    assert row["value"] == "7921" and row["detail"].startswith("new 0")


@pytest.mark.parametrize("row, clock", [
    ({"clock_mhz_kernel": "1816.5", "clock_mhz_nvml": "1980"}, 1816.5),   # the kernel's own reading first
    ({"clock_mhz_kernel": "", "clock_mhz_nvml": "1980"}, 1980.0),
    ({"clock_mhz_kernel": "nan", "clock_mhz_nvml": "1755"}, 1755.0),
    ({"clock_mhz_kernel": "", "clock_mhz_nvml": ""}, None),
    ({"clock_mhz_nvml": "fast"}, None),
])
def test_row_clock_prefers_the_clock_read_in_the_kernel(row, clock):
    assert calibration_reduce.row_clock(row) == clock


def test_stamped_clock_is_cycles_over_the_global_timer():
    torch = pytest.importorskip("torch")
    # three CTAs: [clock64 at start, timer ns at start, clock64 at end, timer ns at end]
    stamps = torch.tensor([[100, 0, 1_800_100, 1_000_000],      # 1800 MHz, 1.8M cycles
                           [0, 50, 1_900_000, 1_000_050],       # 1900 MHz
                           [0, 0, 1_700_000, 1_000_000],        # 1700 MHz
                           [5, 5, 5, 5]], dtype=torch.int64)    # never ran: left out
    mhz, cycles = calibration_runner.stamped_clock(stamps.flatten())
    assert mhz == pytest.approx(1800.0) and cycles == pytest.approx(1_800_000)
    mhz, cycles = calibration_runner.stamped_clock(torch.zeros(8, dtype=torch.int64))
    assert math.isnan(mhz) and math.isnan(cycles)


def _store_overlap():
    import csv

    path = profiles_dir().parent / "experiments" / "results" / "calibration_h100.csv"
    return {r["param"]: float(r["value"]) for r in csv.DictReader(open(path)) if r["bench"] == "store_overlap"}


@pytest.mark.parametrize("nbytes", [16384, 32768, 65536])
def test_stores_are_posted(nbytes):
    """calibrate.py store_overlap (H100): a warp does not wait for its stores
    to leave the SM. A chain of dependent FMAs and a store of 16-64 KB an
    iteration take the longer of the two (within 10%), not their sum, as the
    engine has it (Store holds no role)."""
    rows = _store_overlap()
    chain, store, both = (rows[f"{nbytes}B_{case}"] for case in ("chain", "store", "both"))
    assert both <= 1.1 * max(chain, store) < 0.9 * (chain + store)


def test_latency_per_sm_rows_become_offsets_from_the_median_sm(calibrate, tmp_path):
    """Merged into the CSV, calibrate.py latency_per_sm's rows (one an SM)
    would give l2.sm_latency_offsets_cycles: each SM's chase less the median
    SM's, by SM id; the profile keeps [] while the CSV has none (session 28
    left them in latency_per_sm_h100.csv, not applied)."""
    import csv
    import os

    from experiments.calibration.rows import DEFAULT_CSV
    rows = list(csv.DictReader(open(DEFAULT_CSV)))
    assert not any(r["bench"] == "latency_per_sm" for r in rows)
    assert _profile("h100.measured")["l2"]["sm_latency_offsets_cycles"] == []
    per_sm = list(csv.DictReader(open(os.path.join(os.path.dirname(DEFAULT_CSV),
                                                   "latency_per_sm_h100.csv"))))
    assert len(per_sm) == 132
    out = tmp_path / "with_offsets.toml"
    src = tmp_path / "cal.csv"
    with open(src, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows + [{k: r.get(k, "") for k in rows[0]} for r in per_sm])
    assert calibrate.main(["profile", "--csv", str(src), "--out", str(out)]) == 0
    offsets = tomllib.loads(out.read_text())["l2"]["sm_latency_offsets_cycles"]
    cycles = {int(r["param"][3:]): float(r["value"]) for r in per_sm}
    middle = sorted(cycles.values())[65:67]
    assert len(offsets) == 132 and min(offsets) < 0 < max(offsets)
    for sm in (0, 44, 131):
        assert offsets[sm] == pytest.approx(cycles[sm] - sum(middle) / 2, abs=0.051)


def test_latency_at_clock_splits_sm_cycles_from_memory_ns():
    from experiments.calibration.reduce import latency_at_clock

    # 90 cycles on the SM's clock + 100 ns off it: 288 cycles at 1980 MHz, 261 at 1710
    rows = [_row("latency_clock", "l2_alone_cycles", "288", clock_mhz_nvml="1980"),
            _row("latency_clock", "l2_capped_cycles", "261", clock_mhz_nvml="1710")]
    cycles, how, _ = latency_at_clock(rows, "l2", 1816.0)
    assert cycles == pytest.approx(90 + 0.1 * 1816)
    assert "90 cycles on the SM's clock + 100 ns off it" in how
    assert latency_at_clock(rows, "dram", 1816.0) is None           # no rows for it
    # a latency that grew as the clock fell is outside the split: the plain chase stands
    rows[1] = _row("latency_clock", "l2_capped_cycles", "300", clock_mhz_nvml="1710")
    assert latency_at_clock(rows, "l2", 1816.0) is None


def test_a_rate_a_clock_comes_from_each_sms_own_cycles():
    """spanned_rate: an SM's blocks' work over the cycles from its first
    block's start to its last one's end, by its own clock64 (stamp_span's
    buffer: per block cycles and ns, then per block start and SM), whatever
    the timer says; the median over SMs. SM 0 ran two blocks of 100 units
    side by side over 50 cycles (4 a clock), SM 1 two one after the other
    (200 over 100 cycles: 2 a clock), SM 2 one alone (100 over 40: 2.5)."""
    blocks = [(50, 1000, 0), (50, 1000, 0), (40, 1000, 1), (60, 1000, 1), (40, 7, 2)]
    starts = [10, 10, 5, 45, 0]
    first_half = [v for cycles, ns, _ in blocks for v in (cycles, ns)]
    second_half = [v for (_, _, sm), start in zip(blocks, starts) for v in (start, sm)]
    rate, sms = calibration_runner.spanned_rate(first_half + second_half, 100.0)
    assert sms == 3
    assert rate == pytest.approx(2.5)
    assert calibration_runner._clock_of(first_half)[1] == 50.0     # (stamp's half, as bench_cuda passes it)


def test_co_resident_phases_tell_ctas_in_step_from_ctas_taking_turns():
    """calibrate.py dot_chain_sm_phase's reduction: SM 7's two CTAs stamp
    their steps together, SM 3's half a period apart; SM 5 ran one CTA, and
    SM 9 two one after the other (waves), which never met."""
    from experiments.calibration.compute_benches import co_resident_phases
    period, steps = 1000.0, 16
    base = [5000.0 + period * k for k in range(steps)]
    later = [t + 40 * period for t in base]
    stamps = [base, [t + 12 for t in base],                # SM 7: in step
              [t + 300 for t in base], [t + 800 for t in base],    # SM 3: half a period apart
              base,                                        # SM 5: alone
              base, later]                                 # SM 9: one after the other
    shares, periods = co_resident_phases(stamps, [7, 7, 3, 3, 5, 9, 9])
    assert sorted(shares) == pytest.approx([0.012, 0.5])
    assert periods == pytest.approx([period] * 4)


def test_sm_spans_tell_ctas_that_start_together_and_end_apart():
    """dot_chain_sm_phase's detail: SM 4's CTAs start 10 cycles apart and end
    200 apart; SM 2's lone CTA says nothing of either."""
    from experiments.calibration.compute_benches import sm_spans
    said = sm_spans([(0, 100), (10, 300), (5, 50)], [4, 4, 2])
    assert "start 10 clk apart and end 200 apart" in said and "run 100 clk" in said
    assert sm_spans([(0, 100)], [4]) == "one CTA an SM"


def test_hold_windows_sets_products_during_and_after_bursts_against_the_gaps():
    """dot_exp_timing's reduction: products every 100 cycles, one burst
    [1000, 1400] that stretches the products ending in it to 200 cycles
    (a hold while it runs) and those right after to 150."""
    from experiments.calibration.compute_benches import hold_windows

    ends, t = [], 0
    while t < 3000:
        t += 200 if 1000 < t + 100 <= 1400 else 150 if 1400 < t + 75 <= 1800 else 100
        ends.append(t)
    w = hold_windows(ends, [(1000, 1400)])
    assert w["idle"] == 100 and w["during"] == 200 and w["after"] == 150
    assert w["n_during"] >= 1 and w["n_after"] >= 1
    assert w["n_idle"] + w["n_during"] + w["n_after"] == len(ends) - 1
    assert "during" not in hold_windows(ends, [])


def test_elementwise_work_holds_the_tensor_pipe_while_it_runs():
    """calibrate.py dot_exp_timing on the H100 (session 43, two runs alike):
    a product CTA's products beside an exp2 or FMA burst on their SM take 8%
    longer while the burst runs and 1% in the window as long right after it,
    as the engine charges the serial fraction (from the start of each
    softmax phase), not after it (experiments/unit_sharing.py's `tensor
    shared + f after`)."""
    rows = calibration_rows.bench_values("dot_exp_timing")
    for kind in ("exp", "fma"):
        during, after = rows[f"64x64x128_w4_{kind}_during"], rows[f"64x64x128_w4_{kind}_after"]
        assert during > 1.05 and abs(after - 1) < 0.02 and during - 1 > 4 * (after - 1)


def test_a_barrier_costs_a_one_warpgroup_cta_nothing_beside_its_neighbours():
    """calibrate.py dot_chain_online_sync on the H100 (session 44): one or two
    more CTA-wide barriers a step leave fa2's online step held on chip within
    5% of none at one to four 4-warp CTAs an SM (one warp a sub-partition
    each), so a 4-warp CTA waiting for its slowest sub-partition is not what
    the engine's short steps there miss; two 8-warp CTAs an SM pay 1-2.5% a
    barrier (their two warpgroups meet)."""
    rows = calibration_rows.bench_values("dot_chain_online_sync")
    for shape, counts in (("64x64x64_w4", (1, 2, 3, 4)), ("128x64x64_w4", (1, 2))):
        for per_sm in counts:
            none = rows[f"{shape}_x{per_sm}_sync0"]
            for sync in (1, 2):
                assert abs(rows[f"{shape}_x{per_sm}_sync{sync}"] / none - 1) < 0.05, (shape, per_sm, sync)
    none, one, two = (rows[f"128x64x64_w8_x2_sync{n}"] for n in (0, 1, 2))
    assert none < one < two and 0.005 < one / none - 1 < 0.03 and 0.005 < two / one - 1 < 0.03


def test_the_k_v_copies_slow_the_softmax_not_the_products_beside_other_ctas():
    """calibrate.py dot_chain_parts on the H100 (session 44): streaming B and
    V at three stages costs fa2's whole 64x64x64 4-warp step 170-215 cycles
    an iteration at two to four CTAs an SM, and its two products alone 38-66
    (132 alone on the SM, where nothing hides them): beside other CTAs the
    copies cost what they cost only where there is a softmax."""
    rows = calibration_rows.bench_values("dot_chain_parts")

    def added(per_sm, part):
        return rows[f"64x64x64_w4_x{per_sm}_{part}_stream"] - rows[f"64x64x64_w4_x{per_sm}_{part}_held"]

    assert 100 < added(1, "products") < 160
    for per_sm in (2, 3, 4):
        assert 160 < added(per_sm, "full") < 230 and added(per_sm, "products") < 80, per_sm
        assert added(per_sm, "full") > 2 * added(per_sm, "products"), per_sm
