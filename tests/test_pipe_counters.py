"""experiments/pipe_counters.py: which counters it asks ncu for, and the
committed H100 rows (the diagnostic behind session 27's D = 64 analysis)."""
import csv
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "experiments"))
import pipe_counters  # noqa: E402

COMMITTED = os.path.join(os.path.dirname(__file__), "..", "experiments", "results", "pipe_counters_h100.csv")


def test_metrics_keep_the_known_wishes_and_every_stall_reason():
    known = {"gpu__time_duration", "sm__cycles_elapsed", "unrelated__thing",
             "smsp__average_warps_issue_stalled_wait_per_issue_active",
             "smsp__average_warps_issue_stalled_barrier_per_issue_active",
             "smsp__average_warps_issue_stalled_wait"}     # (no _per_issue_active: not a ratio we read)
    assert pipe_counters.metrics(known) == [
        "gpu__time_duration.sum", "sm__cycles_elapsed.avg.per_second",
        "smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio",
        "smsp__average_warps_issue_stalled_wait_per_issue_active.ratio"]


def test_available_reads_the_first_word_of_ncus_metric_lines(monkeypatch):
    listing = ("Device NVIDIA H100 (GH100)\n------ ---- ----\nMetric Name   Metric Type   Description\n"
               "------ ---- ----\ndram__bytes   Counter   # of bytes\nsm__cycles_elapsed   Counter   cycles\n")
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(a, 0, listing, ""))
    assert {"dram__bytes", "sm__cycles_elapsed"} <= pipe_counters.available()


def test_main_refuses_when_ncu_knows_none_of_them(monkeypatch, capsys):
    """(Past the GPU's preflight, which a machine without one stops at first.)"""
    monkeypatch.setattr(pipe_counters, "available", lambda: set())
    monkeypatch.setattr(pipe_counters.gpu_probe, "start", lambda *a, **k: {})
    assert pipe_counters.main(["--out", os.devnull]) == 2
    assert "none of the wished metrics" in capsys.readouterr().err


def test_committed_rows_cover_every_config_at_a_plausible_clock():
    rows = list(csv.DictReader(open(COMMITTED)))
    got = {(int(r["block_m"]), int(r["block_n"]), int(r["num_warps"]), int(r["num_stages"]), int(r["causal"]))
           for r in rows}
    assert got == set(pipe_counters.CONFIGS)
    for r in rows:
        mhz = float(r["sm__cycles_elapsed.avg.per_second"].replace(",", "")) / 1e6
        assert 1000 < mhz < 2100, r
        # the counters add up: a launch's SM cycles over its clock is its duration (within 5%)
        cycles = float(r["sm__cycles_active.avg"].replace(",", ""))
        ns = float(r["gpu__time_duration.sum"].replace(",", ""))
        assert cycles / mhz * 1e3 <= ns * 1.05, r


def test_fa2_counter_rows_name_each_config_its_counters_and_units(monkeypatch):
    """The loop spill_counters.py and pipe_counters.py share: one ncu run a
    config (its --target spec), the counters read, a missing one left blank."""
    from experiments import ncu_counters
    asked = []

    def fake(script, target, kernel, metrics):
        asked.append((target, kernel))
        return {"a.sum": ("12", "byte")}
    monkeypatch.setattr(ncu_counters, "second_launch", fake)
    shape = dict(batch=1, heads=2, seqlen=128, head_dim=64)
    rows = list(ncu_counters.fa2_counter_rows("x.py", [(128, 64, 8, 3, 0), (64, 32, 4, 2, 1)], shape,
                                              ["a.sum", "b.pct"], "cmd", units=True))
    assert asked == [("128x64x8x3x0", "_fa2_fwd"), ("64x32x4x2x1", "_fa2_fwd")]
    assert rows[1]["block_m"] == 64 and rows[1]["causal"] == 1 and rows[1]["heads"] == 2
    assert (rows[0]["a.sum"], rows[0]["a.sum.unit"], rows[0]["b.pct"], rows[0]["b.pct.unit"]) == ("12", "byte", "", "")
    assert rows[0]["command"] == "cmd"
    plain = next(ncu_counters.fa2_counter_rows("x.py", [(128, 64, 8, 3, 0)], shape, ["a.sum"], "cmd", units=False))
    assert plain["a.sum"] == "12" and "a.sum.unit" not in plain
