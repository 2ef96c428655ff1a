"""experiments/fa3_gluon_check.py: the FA3 schedule predicted at the Gluon
kernel's config beside that kernel's measured rows."""
import csv

import pytest

FIELDS = ["kernel", "config", "batch", "heads", "seqlen", "head_dim", "causal", "dtype", "ms", "tflops",
          "status", "gpu", "git_commit"]


def _bench_csv(path, rows):
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, FIELDS)
        w.writeheader()
        for r in rows:
            w.writerow({"config": "", "dtype": "bf16", "tflops": 0, "status": "ok", "gpu": "test GPU",
                        "git_commit": "abc", **r})


def test_errors_are_against_the_kernel_that_runs_the_schedule(tmp_path):
    from experiments import fa3_gluon_check as check   # (imports the kernels: see compare())
    path = tmp_path / "bench.csv"
    shape = {"batch": 16, "heads": 16, "seqlen": 1024, "head_dim": 128, "causal": 0}
    _bench_csv(path, [{"kernel": "fa3_gluon", "ms": 0.5, **shape}, {"kernel": "fa3", "ms": 1.0, **shape},
                      {"kernel": "sdpa_cudnn", "ms": 0.4, **shape}])
    out = tmp_path / "check.md"
    assert check.main(["--measured", str(path), "--out", str(out)]) == 0
    (row,) = list(csv.DictReader(open(out.with_suffix(".csv"))))
    predicted = float(row["predicted_ms"])
    assert float(row["error_vs_gluon"]) == pytest.approx(predicted / 0.5 - 1, abs=1e-3)
    assert float(row["error_vs_triton_fa3"]) == pytest.approx(predicted / 1.0 - 1, abs=1e-3)
    assert row["config"] == "128x128 s2 pingpong=0" and row["persistent"] == "1"
    assert "MAPE" in out.read_text()


@pytest.mark.parametrize("content, needle", [
    (None, "cannot read"),
    (b"\x80\x81\xff\xfe", "not a readable CSV"),
    ("kernel,seqlen\nfa3_gluon,512\n", "not a kernels.bench CSV"),
    ("kernel,status,dtype,seqlen,head_dim,causal,ms\nfa3,ok,bf16,512,64,0,1.0\n", "no ok bf16 fa3_gluon rows"),
])
def test_bad_measured_file_is_one_line_and_exit_2(tmp_path, capsys, content, needle):
    from experiments import fa3_gluon_check as check
    path = tmp_path / "bench.csv"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)
    assert check.main(["--measured", str(path), "--out", str(tmp_path / "x.md")]) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and len(err.splitlines()) == 1
    assert not (tmp_path / "x.md").exists()
