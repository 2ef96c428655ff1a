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
    monkeypatch.setattr(pipe_counters, "available", lambda: set())
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
