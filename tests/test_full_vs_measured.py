"""experiments/full_vs_measured.py: shapes, bad input, and one small shape end to end."""
import csv
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from experiments import full_vs_measured  # noqa: E402


def test_shapes_parse_and_bad_ones_are_one_line_and_exit_2(tmp_path, capsys):
    assert full_vs_measured.parse_shapes("64:0:2048,128:1:512") == [(64, 0, 2048), (128, 1, 512)]
    assert full_vs_measured.main(["--out", str(tmp_path / "x.csv"), "--shapes", "64-0-2048"]) == 2
    err = capsys.readouterr().err
    assert "is not D:causal:N" in err and err.count("\n") == 1
    assert full_vs_measured.main(["--out", str(tmp_path / "x.csv"), "--shapes", "96:0:512"]) == 2
    assert "no fa2 rows" in capsys.readouterr().err
    assert not (tmp_path / "x.csv").exists()


def test_full_simulations_of_a_shape_are_written_beside_their_measurements(tmp_path, capsys, monkeypatch):
    """The four 64-row, 64-column configs of D64 non-causal N512 (the measured
    sweep has 36 there), full simulations on this machine: each row keeps its
    measurement and a positive prediction, and the summary names the shape."""
    real = full_vs_measured.load_measurements

    def few():
        return [r for r in real() if r["config"].block_m == 64 and r["config"].block_n == 64
                and r["config"].num_stages == 2]
    monkeypatch.setattr(full_vs_measured, "load_measurements", few)
    out = tmp_path / "full.csv"
    assert full_vs_measured.main(["--out", str(out), "--shapes", "64:0:512", "--jobs", "2", "--label", "t"]) == 0
    rows = list(csv.DictReader(open(out)))
    assert len(rows) == 2 and {r["config"] for r in rows} == {"64x64x4x2", "64x64x8x2"}
    assert all(float(r["full_us"]) > 0 and float(r["measured_us"]) > 0 and r["label"] == "t" for r in rows)
    assert "D64 causal 0 N512: 2 configs; full: MAPE" in capsys.readouterr().out
