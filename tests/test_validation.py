"""The validation metrics, the results loaders, and the regression guard.

The guard re-predicts a deterministic subset of the committed H100 measurements
(experiments/validate.py guard_subset) and fails if an error rises above the bounds
stored in experiments/results/validation_bounds.json (the values the first real report
reached, rounded up slightly). No GPU needed.
"""
from __future__ import annotations

import csv
import json
import math
import os
import random

import pytest

from algorithms.errors import ResultsFileError
from experiments import validate as V
from experiments.validation import loading, metrics, ncu, predictions, report, suite

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# --------------------------------------------------------------------------- metrics
def test_mape_and_summary():
    assert metrics.mape([110, 90], [100, 100]) == pytest.approx(0.10)
    s = metrics.error_summary([110, 95, 100, 150], [100, 100, 100, 100])
    assert s["n"] == 4
    assert s["mape"] == pytest.approx((0.10 + 0.05 + 0 + 0.5) / 4)
    assert s["median"] == pytest.approx(0.075)
    assert s["max"] == pytest.approx(0.5)
    assert s["bias"] == pytest.approx((0.10 - 0.05 + 0 + 0.5) / 4)
    assert math.isnan(metrics.error_summary([], [])["mape"])


def test_mape_refuses_bad_measurements():
    with pytest.raises(ValueError):
        metrics.mape([1.0], [0.0])
    with pytest.raises(ValueError):
        metrics.mape([float("nan")], [1.0])
    with pytest.raises(ValueError):
        metrics.mape([1.0, 2.0], [1.0])


def test_ranks_average_ties():
    assert metrics.ranks([10, 30, 20]) == [1, 3, 2]
    assert metrics.ranks([5, 5, 1, 7]) == [2.5, 2.5, 1, 4]


def test_spearman_known_values():
    assert metrics.spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert metrics.spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    # no ties: 1 - 6 sum d^2 / (n (n^2 - 1))
    x, y = [1, 2, 3, 4, 5], [2, 1, 4, 3, 5]
    d2 = sum((a - b) ** 2 for a, b in zip(x, y))
    assert metrics.spearman(x, y) == pytest.approx(1 - 6 * d2 / (5 * 24))
    # monotone transforms do not change it
    rng = random.Random(3)
    a = [rng.random() for _ in range(30)]
    b = [v + rng.gauss(0, 0.2) for v in a]
    assert metrics.spearman(a, b) == pytest.approx(metrics.spearman([math.exp(v) for v in a], [v ** 3 for v in b]))
    assert math.isnan(metrics.spearman([1], [1]))
    assert math.isnan(metrics.spearman([1, 1, 1], [1, 2, 3]))


def test_spearman_with_ties_matches_pearson_of_ranks():
    x, y = [1, 2, 2, 3, 4], [1, 3, 2, 2, 5]
    rx, ry = metrics.ranks(x), metrics.ranks(y)
    n = len(x)
    mx, my = sum(rx) / n, sum(ry) / n
    num = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    den = math.sqrt(sum((a - mx) ** 2 for a in rx) * sum((b - my) ** 2 for b in ry))
    assert metrics.spearman(x, y) == pytest.approx(num / den)


def test_top1_loss():
    meas = [1.00, 1.20, 1.05, 2.0]
    assert metrics.top1_loss([5, 6, 7, 8], meas) == pytest.approx(0.0)      # picks the measured best
    assert metrics.top1_loss([6, 5, 7, 8], meas) == pytest.approx(0.20)     # picks the 1.20 one
    assert metrics.top1_loss([3, 3, 1, 8], meas) == pytest.approx(0.05)
    assert metrics.top1_loss([2, 2, 3, 3], meas) == pytest.approx(0.0)      # tie: first listed
    with pytest.raises(ValueError):
        metrics.top1_loss([], [])


def test_compute_metrics_groups_by_algo_and_shape():
    from algorithms.problem import AttentionProblem, TileConfig

    p = AttentionProblem(batch=16, heads=16, seqlen_q=1024, head_dim=128)
    rows, preds = [], []
    for i, bm in enumerate((64, 128)):
        for j, bn in enumerate((32, 64, 128)):
            ms = 1.0 + 0.1 * (i * 3 + j)
            rows.append({"algo": "fa2", "problem": p, "config": TileConfig(block_m=bm, block_n=bn),
                         "ms": ms, "default_config": bm == 128 and bn == 64})
            preds.append({"runtime_us": ms * 1e3 * 1.1})
    rows.append({"algo": "fa3", "problem": p.with_(dtype="fp8"), "config": TileConfig(), "ms": 0.5,
                 "default_config": True})
    preds.append({"runtime_us": 400.0})
    rows.append({"algo": "fa1", "problem": p, "config": TileConfig(), "ms": 0.5, "default_config": True})
    preds.append({"runtime_us": None, "error": "boom"})
    m = report.compute_metrics(rows, preds)
    assert m["errors"]["fa2"]["mape"] == pytest.approx(0.10)
    assert m["errors"]["fa3_fp8"]["mape"] == pytest.approx(0.20)
    assert m["errors_default"]["fa2"]["n"] == 1
    assert len(m["failed"]) == 1
    (k, rk), = m["ranking"].items()
    assert rk["spearman"] == pytest.approx(1.0) and rk["top1_loss"] == 0.0
    gm = report.guard_metrics(rows, preds)
    assert gm["mape.fa2"] == pytest.approx(0.10) and gm["unpredicted_rows"] == 1.0


def _fa2_rows_by_block_n(block_ns=(32, 64, 128)):
    """Measured-row stand-ins of one shape, fa2 64xN for each N (the saved
    predictions' key holds block_n as its 9th field)."""
    from algorithms.problem import AttentionProblem, TileConfig

    p = AttentionProblem(batch=16, heads=16, seqlen_q=1024, head_dim=128)
    return [{"algo": "fa2", "problem": p, "config": TileConfig(block_m=64, block_n=bn), "ms": 1.0}
            for bn in block_ns]


def test_reuse_predicts_only_the_rows_the_saved_file_lacks(tmp_path, monkeypatch):
    """report --reuse-predictions: the saved lines are reused and keep their
    commit; a row whose line was deleted is predicted again, alone."""
    rows = _fa2_rows_by_block_n()
    asked = []

    def fake_predict(rs, gpu, jobs=1, checkpoint=None):
        asked.append([r["config"].block_n for r in rs])
        return [{"runtime_us": 100.0 * r["config"].block_n, "bottleneck": "tensor_cores", "error": ""}
                for r in rs]

    monkeypatch.setattr(predictions, "predict_rows", fake_predict)
    path = str(tmp_path / "validation_predictions_h100.csv")
    monkeypatch.setenv("GPUSIM_GIT_COMMIT", "aaaaaaa")
    predictions.reuse_or_predict(path, rows, "h100", 1, reuse=True)        # no file yet: all predicted
    lines = open(path).read().splitlines()
    with open(path, "w") as f:
        # (key: algo|dtype|batch|heads|N|D|causal|block_m|block_n|warps|stages)
        f.write("\n".join(line for line in lines if line.split(",")[0].split("|")[8:9] != ["64"]) + "\n")
    monkeypatch.setenv("GPUSIM_GIT_COMMIT", "bbbbbbb")
    preds = predictions.reuse_or_predict(path, rows, "h100", 1, reuse=True)
    assert asked == [[32, 64, 128], [64]]
    assert [pr["runtime_us"] for pr in preds] == [3200.0, 6400.0, 12800.0]
    saved = {r["key"].split("|")[8]: r["git_commit"] for r in csv.DictReader(open(path))}
    assert saved == {"32": "aaaaaaa", "64": "bbbbbbb", "128": "aaaaaaa"}
    predictions.reuse_or_predict(path, rows, "h100", 1, reuse=True)         # nothing missing: nothing asked
    assert len(asked) == 2


def test_a_run_stopped_mid_way_keeps_its_checkpointed_predictions(tmp_path, monkeypatch):
    """A report killed at a time limit after a checkpoint leaves the rows
    predicted so far in the file; the next --reuse-predictions run predicts
    only the others."""
    rows = _fa2_rows_by_block_n()
    asked = []

    def killed_after_two(rs, gpu, jobs=1, checkpoint=None):
        asked.append([r["config"].block_n for r in rs])
        done = [{"runtime_us": 100.0 * r["config"].block_n, "error": ""} for r in rs]
        checkpoint([done[0], None, done[2]])
        raise KeyboardInterrupt  # what `timeout` leaves of the run

    monkeypatch.setattr(predictions, "predict_rows", killed_after_two)
    path = str(tmp_path / "validation_predictions_h100.csv")
    with pytest.raises(KeyboardInterrupt):
        predictions.reuse_or_predict(path, rows, "h100", 1, reuse=True)
    assert sorted(r["key"].split("|")[8] for r in csv.DictReader(open(path))) == ["128", "32"]

    def finish(rs, gpu, jobs=1, checkpoint=None):
        asked.append([r["config"].block_n for r in rs])
        return [{"runtime_us": 1.0, "error": ""} for r in rs]

    monkeypatch.setattr(predictions, "predict_rows", finish)
    preds = predictions.reuse_or_predict(path, rows, "h100", 1, reuse=True)
    assert asked == [[32, 64, 128], [64]]
    assert [pr["runtime_us"] for pr in preds] == [3200.0, 1.0, 12800.0]


def test_parallel_predictions_come_back_in_row_order():
    """predict_rows submits the dearest rows first; its answers still line up
    with the rows it was given."""
    from algorithms.problem import AttentionProblem, TileConfig

    rows = [{"algo": "standard", "problem": AttentionProblem(batch=1, heads=1, seqlen_q=n, head_dim=64),
             "config": TileConfig(block_m=64, block_n=64), "ms": 1.0} for n in [128, 512, 256] * 8]
    preds = predictions.predict_rows(rows, "h100", jobs=2)
    serial = [predictions._predict_one(("h100", r["algo"], r["problem"], r["config"])) for r in rows]
    assert [pr["runtime_us"] for pr in preds] == [pr["runtime_us"] for pr in serial]
    assert len({pr["runtime_us"] for pr in preds}) == 3


# --------------------------------------------------------------------------- files
HEADER = suite.COLUMNS


def _row(**kw):
    r = {c: "" for c in HEADER}
    r.update(algo="fa2", dtype="bf16", batch=16, heads=16, kv_heads=16, seqlen=1024, head_dim=128,
             causal=0, block_m=128, block_n=64, num_warps=8, num_stages=3, block_k=64,
             consumer_warpgroups=2, pingpong=1, intra_wg_overlap=1, mma="auto", default_config=1,
             ms="0.5", status="ok")
    r.update(kw)
    return r


def _write(path, rows, header=HEADER):
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=header, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow(r)
    return str(path)


def test_load_measurements_ok(tmp_path):
    path = _write(tmp_path / "v.csv", [_row(), _row(status="error", ms=""), _row(block_n=32, ms="0.7",
                                                                                 default_config=0)])
    rows = loading.load_measurements(path)
    assert len(rows) == 2
    assert rows[0]["problem"].seqlen_q == 1024 and rows[0]["config"].block_n == 64
    assert rows[0]["default_config"] and not rows[1]["default_config"]


@pytest.mark.parametrize("rows,header,msg", [
    ([_row()], [c for c in HEADER if c != "ms"], "missing column"),
    ([_row(batch="x")], HEADER, "not an integer"),
    ([_row(ms="fast")], HEADER, "not a number"),
    ([_row(ms="-1")], HEADER, "must be positive"),
    ([_row(status="error")], HEADER, "no row with status ok"),
    ([_row(head_dim=100)], HEADER, "head_dim"),
    ([_row(block_m=96)], HEADER, "block_m"),
])
def test_load_measurements_bad_files(tmp_path, rows, header, msg):
    path = _write(tmp_path / "v.csv", rows, header)
    with pytest.raises(ResultsFileError, match=msg) as e:
        loading.load_measurements(path)
    assert "\n" not in str(e.value)


def test_missing_and_binary_files(tmp_path):
    with pytest.raises(ResultsFileError, match="no such results file"):
        loading.load_measurements(str(tmp_path / "nope.csv"))
    bad = tmp_path / "bad.csv"
    bad.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(ResultsFileError):
        loading.load_measurements(str(bad))
    with pytest.raises(ResultsFileError, match="no such results file"):
        loading.load_ncu(str(tmp_path / "nope.csv"))


def test_report_cli_bad_file_is_one_line(tmp_path, capsys):
    rc = V.main(["report", "--measurements", str(tmp_path / "missing.csv"), "--no-plots",
                 "--report", str(tmp_path / "r.md")])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and err.startswith("validate: ") and "\n" not in err


def test_parse_and_group_ncu():
    text = "\n".join([
        '==PROF== Connected to process 1',
        '"ID","Kernel Name","Grid Size","dram__bytes_read.sum","dram__bytes_write.sum",'
        '"lts__t_sectors_srcunit_tex_op_read.sum","lts__t_sectors_op_read.sum","gpu__time_duration.sum",'
        '"launch__grid_size"',
        '"","","","byte","byte","sector","sector","nsecond",""',
        '"0","_ncu_case_marker","(1, 1, 1)","0","0","0","0","1000","1"',
        '"1","_qk_gemm","(8, 16, 1)","1,000","2000","100","110","5000","128"',
        '"2","_pv_gemm","(8, 16, 1)","500","100","10","12","3000","128"',
        '"3","_ncu_case_marker","(2, 1, 1)","0","0","0","0","1000","2"',
        '"4","_fa2_fwd","(8, 16, 1)","300","50","20","21","2000","128"',
        '"5","_ncu_case_marker","(3, 1, 1)","0","0","0","0","1000","3"',
    ])
    kernels = ncu.parse_ncu_raw(text)
    assert len(kernels) == 6
    per = ncu.group_ncu(kernels, 2)
    assert per[0]["kernels"] == ["_qk_gemm", "_pv_gemm"]
    assert per[0]["dram__bytes_read.sum"] == 1500 and per[0]["lts__t_sectors_srcunit_tex_op_read.sum"] == 110
    assert per[1]["kernels"] == ["_fa2_fwd"] and per[1]["dram__bytes_write.sum"] == 50
    with pytest.raises(ResultsFileError):
        ncu.parse_ncu_raw("no csv here")


def test_l2_reads_are_compared_at_both_ends_of_the_crossbar(tmp_path):
    """The model's L2 reads against what the SMs received and what the L2
    slices looked up, its HBM writes with and without what L2 holds dirty at
    the end; a file from before the SMs' count has '–' there."""
    head = ("case,algo,dtype,batch,heads,seqlen,head_dim,causal,block_m,block_n,num_warps,num_stages,"
            "dram_read_bytes,dram_write_bytes,l2_read_bytes_from_sm,l2_read_bytes_all,sm_read_bytes_from_l2,status")
    path = tmp_path / "ncu.csv"
    path.write_text(head + "\n8,fa2,bf16,4,32,4096,64,0,128,64,4,3,200,50,600,700,1000,ok\n"
                    "9,fa2,bf16,4,32,4096,64,1,128,64,4,3,200,50,600,700,,ok\n")
    rows = loading.load_ncu(str(path))
    pred = {"runtime_us": 1.0, "hbm_read_bytes": 220.0, "hbm_write_bytes": 60.0, "l2_read_bytes": 1000.0,
            "l2_dirty_at_end_bytes": 10}
    new, old = report.byte_metrics(rows, [pred, {**pred, "l2_dirty_at_end_bytes": None}])
    assert new["l2_read"][2] == 0.0 and new["l2_slice_read"][2] == pytest.approx(1000 / 600 - 1)
    assert new["hbm_read"][2] == pytest.approx(0.1)
    # HBM writes: all of them, and those before the run ended (L2's dirty bytes left out)
    assert new["hbm_write"][2] == pytest.approx(0.2) and new["hbm_write_in_run"][2] == 0.0
    assert math.isnan(old["hbm_write_in_run"][2])
    assert math.isnan(old["l2_read"][2]) and old["l2_slice_read"][2] == pytest.approx(1000 / 600 - 1)
    path.write_text(head + "\n8,fa2,bf16,4,32,4096,64,0,128,64,4,3,200,50,600,700,lots,ok\n")
    with pytest.raises(ResultsFileError, match="sm_read_bytes_from_l2"):
        loading.load_ncu(str(path))


def test_errors_by_group_mean_and_mape():
    rows = [{"ms": 1.0, "g": "a"}, {"ms": 2.0, "g": "a"}, {"ms": 1.0, "g": "b"}, {"ms": 1.0, "g": "c"}]
    preds = [{"runtime_us": 1100.0}, {"runtime_us": 1800.0}, {"runtime_us": 500.0}, {"runtime_us": None}]
    out = report.errors_by(rows, preds, lambda r, pr: r["g"] if r["g"] != "b" or pr else None)
    assert list(out) == ["a", "b"]
    n, bias, mape = out["a"]
    assert n == 2 and bias == pytest.approx(0.0) and mape == pytest.approx(0.1)
    assert out["b"] == (1, pytest.approx(-0.5), pytest.approx(0.5))
    assert report.errors_by(rows, preds, lambda r, pr: None) == {}


def test_suite_covers_the_issue():
    cases = suite.suite_cases()
    algos = {(a, p.dtype) for a, p, _, _ in cases}
    assert {("standard", "bf16"), ("fa1", "bf16"), ("fa2", "bf16"), ("fa3", "bf16"), ("fa3", "fp8")} <= algos
    shapes = {(p.head_dim, p.seqlen_q, p.causal) for _, p, _, _ in cases}
    assert len(shapes) == 2 * 6 * 2
    for _, p, _, _ in cases:
        assert p.batch * p.seqlen_q == 16384 and p.heads * p.head_dim == 2048
    fa2 = [c for a, p, c, _ in cases if a == "fa2" and p.head_dim == 128 and p.seqlen_q == 4096 and not p.causal]
    assert len(fa2) == len(set(fa2)) == len(suite.fa2_configs(suite.shapes()[0].with_(head_dim=128, heads=16, kv_heads=16)))
    # the default configs come first, so a run cut short still covers every algorithm
    assert all(d for _, _, _, d in cases[:120])


def test_report_end_to_end_small(tmp_path):
    """A tiny synthetic results file through the whole report path (predictions
    included), with one Gluon FA3 row: small shapes, so that it takes seconds
    (the committed Gluon file's 24 rows, up to N = 16k, took a minute of CI)."""
    rows = [_row(block_m=bm, block_n=bn, ms=f"{0.03 + 0.001 * i}", default_config=int(bm == 128 and bn == 64),
                 batch=2, seqlen=1024, heads=8, kv_heads=8, head_dim=64, num_warps=4)
            for i, (bm, bn) in enumerate([(64, 32), (64, 64), (128, 64), (128, 32)])]
    path = _write(tmp_path / "v.csv", rows)
    gluon = tmp_path / "gluon.csv"
    gluon.write_text("kernel,status,dtype,batch,heads,seqlen,head_dim,causal,ms\n"
                     "fa3_gluon,ok,bf16,2,8,1024,64,0,0.02\n")
    rc = V.main(["report", "--measurements", path, "--ncu", str(tmp_path / "none.csv"), "--gpu", "h100",
                 "--no-plots", "--jobs", "1", "--gluon", str(gluon), "--report", str(tmp_path / "r.md")])
    assert rc == 0
    text = (tmp_path / "r.md").read_text()
    assert "Profile `h100`" in text and "| fa2 | 4 |" in text and "| fa3 | 1 |" in text


# --------------------------------------------------------------------------- the guard
MEASURED = os.path.join(ROOT, "experiments", "results", "validation_h100.csv")
BOUNDS = os.path.join(ROOT, "experiments", "results", "validation_bounds.json")


@pytest.mark.skipif(not os.path.exists(MEASURED), reason="no committed H100 measurements yet")
def test_regression_guard():
    if not os.path.exists(BOUNDS):
        pytest.skip("no bounds yet: run `validate.py report --write-bounds` after the first real report")
    bounds = json.load(open(BOUNDS))
    rows = report.guard_subset(loading.load_measurements(MEASURED) + loading.gluon_rows())
    assert rows, "the guard subset of the committed measurements is empty"
    preds = predictions.predict_rows(rows, bounds["profile"], jobs=min(4, os.cpu_count() or 1))
    got = report.guard_metrics(rows, preds)
    over = {k: (round(got.get(k, float("inf")), 4), b) for k, b in bounds["bounds"].items()
            if not got.get(k, float("inf")) <= b}
    assert not over, f"validation errors rose above their bounds (metric: (now, bound)): {over}"


def test_measured_fa3_rows_take_the_schedule_the_kernel_compiles_to(tmp_path):
    """kernels/fa3.py rows are replayed by fa3_triton (Triton 3.6 builds no
    producer warpgroup); the Gluon kernel's rows are FA3's schedule's."""
    rows = loading.load_measurements(_write(tmp_path / "v.csv", [_row(algo="fa3", num_warps=12)]))
    assert rows[0]["algo"] == "fa3_triton" and rows[0]["kernel"] == "fa3"
    gluon = loading.gluon_rows()
    assert gluon and {r["algo"] for r in gluon} == {"fa3"} and all(r["default_config"] for r in gluon)
    assert loading.gluon_rows(str(tmp_path / "none.csv")) == []


@pytest.mark.parametrize("ms, msg", [("fast", "not a number"), ("0", "must be positive")])
def test_gluon_rows_refuse_bad_times_in_one_line(tmp_path, ms, msg):
    path = tmp_path / "g.csv"
    path.write_text("kernel,status,dtype,batch,heads,seqlen,head_dim,causal,ms\n"
                    f"fa3_gluon,ok,bf16,16,32,1024,64,0,{ms}\n")
    with pytest.raises(ResultsFileError, match=msg) as e:
        loading.gluon_rows(str(path))
    assert "\n" not in str(e.value)


def test_kept_bounds_are_read_for_their_own_profile_only(tmp_path):
    """--write-bounds never raises a bound: it takes the lesser of the new
    rounding and the bound already kept for the same profile."""
    path = tmp_path / "bounds.json"
    path.write_text(json.dumps({"profile": "h100", "bounds": {"mape.fa2": 0.05}}))
    assert predictions._kept_bounds(str(path), "h100") == {"mape.fa2": 0.05}
    assert predictions._kept_bounds(str(path), "h100.measured") == {}
    path.write_text("{not json")
    assert predictions._kept_bounds(str(path), "h100") == {}
    assert predictions._kept_bounds(str(tmp_path / "missing.json"), "h100") == {}
