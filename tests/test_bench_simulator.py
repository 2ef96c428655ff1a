"""experiments/bench_simulator.py on a two-job sweep: the sweep's row, and
each job's own wall time, slowest first (--jobs-out)."""
import csv
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def test_short_sweep_writes_each_jobs_time(tmp_path, monkeypatch):
    from experiments import bench_simulator

    # the sweep's first two configs on a smaller problem than its B16 H32 N1024
    # D64 (one wave of 256 CTAs, not 8192: 25 s less of CI)
    sweep_jobs = bench_simulator.sweep_jobs
    monkeypatch.setattr(bench_simulator, "sweep_jobs",
                        lambda size: [((1, 16, 1024, 64, False), cfg) for _, cfg in sweep_jobs(size)])
    out, jobs = tmp_path / "bench.csv", tmp_path / "jobs.csv"
    assert bench_simulator.main(["--skip-singles", "--sweep-size", "2", "--out", str(out),
                                 "--jobs-out", str(jobs)]) == 0
    (sweep,) = list(csv.DictReader(open(out)))
    assert sweep["what"].startswith("sweep of 2 fa2 configs")
    assert "--sweep-size 2" in sweep["command"]
    rows = list(csv.DictReader(open(jobs)))
    assert len(rows) == 2 and {r["outcome"] for r in rows} <= {"ok", "does not fit"}
    walls = [float(r["wall_s"]) for r in rows]
    assert walls == sorted(walls, reverse=True) and walls[0] > 0
    assert {r["config"] for r in rows} == {"64x32x4x2", "64x32x4x3"}   # the sweep's first two jobs
    for r in rows:      # B1 H16 N1024 D64 at block_m 64: 16 Q blocks x 16 heads, cut into parts
        assert (r["batch"], r["heads"], r["seqlen"]) == ("1", "16", "1024")
        if r["outcome"] == "ok":
            assert int(r["ctas_simulated"]) + int(r["ctas_ghosted"]) == 16 * 16 // int(r["parts"])
            assert int(r["ctas_simulated"]) > 0


def test_bad_sweep_size_is_refused(capsys):
    import pytest

    from experiments import bench_simulator

    with pytest.raises(SystemExit) as exit_info:
        bench_simulator.main(["--skip-singles", "--sweep-size", "0"])
    assert exit_info.value.code == 2
    assert "--sweep-size must be at least 1" in capsys.readouterr().err


def test_an_unwritable_output_is_refused_before_the_run(tmp_path, capsys):
    from experiments import bench_simulator

    assert bench_simulator.main(["--skip-singles", "--sweep-size", "1", "--out", str(tmp_path / "bench.csv"),
                                 "--jobs-out", "/proc/no/such/jobs.csv"]) == 2
    assert not (tmp_path / "bench.csv").exists()
    assert capsys.readouterr().err.strip().startswith("bench_simulator: cannot write /proc/no/such/jobs.csv")
