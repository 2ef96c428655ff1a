"""experiments/top_pick.py on a synthetic measured sweep; autotune_prune's
report on synthetic results."""
import csv

from algorithms.problem import AttentionProblem
from experiments import top_pick
from gpusim import predict
from gpusim.explore import sweep_config

SHAPES = [(256, 64, False), (256, 64, True)]


def _predicted(n, d, causal):
    p = AttentionProblem(batch=1, heads=2, seqlen_q=n, head_dim=d, causal=causal)
    out = {}
    for c in top_pick.grid_configs():
        out[c] = predict(p, sweep_config("fa2", p, "h100", *c), "h100").runtime_us
    return out


def _write(path, rows):
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


def _rows(times_by_shape, drop=()):
    rows = []
    for (n, d, causal), times in times_by_shape.items():
        for (m, bn, w, s), t in times.items():
            if (n, d, causal, (m, bn, w, s)) in drop:
                continue
            rows.append({"algo": "fa2", "head_dim": d, "seqlen": n, "causal": int(causal),
                         "batch": 1, "heads": 2, "dtype": "bf16", "block_m": m, "block_n": bn,
                         "num_warps": w, "num_stages": s, "median_ms": t, "status": "ok"})
    rows.append({**rows[0], "algo": "fa3", "median_ms": 1e-6})  # other algorithms are ignored
    rows.append({**rows[0], "median_ms": "", "status": "failed"})  # failed rows are ignored
    return rows


def test_perfect_predictions_lose_nothing(tmp_path, capsys):
    times = {s: {c: t / 1000 for c, t in _predicted(*s).items()} for s in SHAPES}
    _write(tmp_path / "m.csv", _rows(times))
    assert top_pick.main(["--measured", str(tmp_path / "m.csv"), "--out", str(tmp_path),
                          "--jobs", "1", "--no-progress"]) == 0
    md = (tmp_path / "top_pick_h100.md").read_text()
    assert "**2 of 2 shapes within 5%**" in md
    with open(tmp_path / "top_pick_h100.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 2
    for r in rows:
        assert float(r["loss_pct"]) == 0 and r["pick"] == r["best"]
        assert float(r["spearman"]) > 0.999 and r["pick_measured_rank"] == "1"


def test_unmeasured_pick_is_replaced_and_loss_is_reported(tmp_path):
    pred = {s: _predicted(*s) for s in SHAPES}
    # measured: the reverse of the predicted order, and the predicted best not measured
    times = {s: {c: 1.0 / t for c, t in p.items()} for s, p in pred.items()}
    best = {s: min(p, key=p.get) for s, p in pred.items()}
    drop = {(*s, best[s]) for s in SHAPES[:1]}
    _write(tmp_path / "m.csv", _rows(times, drop))
    measured = top_pick.read_measured(tmp_path / "m.csv")
    rows = top_pick.analyse(measured, jobs=1, executor="serial", progress=False)
    first = rows[0]
    assert first["pick_was_measured"] is False and "not measured" in first["pick"]
    assert first["loss_pct"] > 5 and first["within_bar"] is False
    assert rows[1]["pick_was_measured"] is True


def test_missing_columns_or_file_exit_2(tmp_path, capsys):
    _write(tmp_path / "bad.csv", [{"algo": "fa2", "seqlen": 256}])
    assert top_pick.main(["--measured", str(tmp_path / "bad.csv"), "--out", str(tmp_path)]) == 2
    assert "missing columns head_dim" in capsys.readouterr().err
    assert top_pick.main(["--measured", str(tmp_path / "none.csv"), "--out", str(tmp_path)]) == 2


def test_autotune_prune_report_from_synthetic_results():
    from experiments.autotune_prune import grid_tile_configs, markdown

    prov = {"gpu": "H100", "sm_clock_mhz": "1980", "driver": "580", "torch": "2.11", "triton": "3.6.0",
            "git_commit": "abc", "date": "today", "command": "x"}
    common = {"seqlen": 4096, "head_dim": 128, "causal": 0, "status": "ok", "block_n": 64,
              "num_warps": 8, "num_stages": 3}
    rows = [{**common, "mode": "full", "top_k": "", "autotune_s": 60.0, "median_ms": 1.0, "block_m": 128},
            {**common, "mode": "pruned", "top_k": 3, "autotune_s": 6.0, "median_ms": 1.08, "block_m": 64},
            {**common, "mode": "pruned", "top_k": 8, "autotune_s": 15.0, "median_ms": 1.02, "block_m": 64}]
    md = markdown(rows, prov)
    assert "| 4096 | 128 | 0 | 3 | 60.0 | 6.0 | 10.0× | 128x64 w8 s3 | 1.000 | 64x64 w8 s3 | 1.080 | +8.0% |" in md
    assert "| 4096 | 128 | 0 | 8 | 60.0 | 15.0 | 4.0× | 128x64 w8 s3 | 1.000 | 64x64 w8 s3 | 1.020 | +2.0% |" in md
    assert "- k = 3: autotune 10.0× faster (mean); the pruned pick within 5% of full autotune's in 0 of 1" in md
    assert "- k = 8: autotune 4.0× faster (mean); the pruned pick within 5% of full autotune's in 1 of 1" in md
    assert len(grid_tile_configs()) == 36


def test_autotune_prune_bad_lists_exit_2_before_the_gpu(capsys):
    from experiments import autotune_prune

    for args, said in ((["--top-k", "0"], "--top-k: 0 is below 1"),
                       (["--seqlens", "4k"], "--seqlens: '4k' is not an integer"),
                       (["--causal", "2"], "--causal: unknown value '2'; choose from 0, 1")):
        assert autotune_prune.main(["run", *args]) == 2
        assert said in capsys.readouterr().err


def test_predictions_read_from_validate_csv(tmp_path):
    """validate.py's saved predictions (key = algo|dtype|B|H|N|D|causal|bm|bn|w|s) stand in
    for the simulator."""
    times = {SHAPES[0]: {c: 1.0 + i for i, c in enumerate(top_pick.grid_configs())}}
    _write(tmp_path / "m.csv", _rows(times))
    preds = [{"key": "|".join(str(x) for x in ("fa2", "bf16", 1, 2, 256, 64, 0, *c)),
              "runtime_us": 100.0 - i, "bottleneck": "tensor_cores"}
             for i, c in enumerate(top_pick.grid_configs())]
    _write(tmp_path / "validation_predictions_h100.csv", preds)
    assert top_pick.main(["--measured", str(tmp_path / "m.csv"), "--out", str(tmp_path),
                          "--predictions", str(tmp_path / "validation_predictions_h100.csv")]) == 0
    with open(tmp_path / "top_pick_h100.csv") as f:
        (row,) = list(csv.DictReader(f))
    # predicted order is the reverse of the measured one: the pick is the slowest measured
    assert row["pick"] == top_pick.label(top_pick.grid_configs()[-1])
    assert float(row["loss_pct"]) == (36.0 / 1.0 - 1) * 100 and row["within_bar"] == "0"


def test_a_shape_is_scored_only_when_every_measured_config_was_predicted():
    from experiments import top_pick
    shape = (1024, 64, False, 16, 32, "bf16")
    configs = top_pick.grid_configs()[:3]
    measured = {shape: {c: 1.0 + i for i, c in enumerate(configs)}}
    partial = {shape: {configs[0]: (10.0, "tensor_cores")}}
    row = top_pick.analyse(measured, predicted=partial, progress=False)[0]
    assert row.get("loss_pct") is None and row["pick"].startswith("not scored: 2 of 3")
    full = {shape: {c: (10.0 - i, "tensor_cores") for i, c in enumerate(configs)}}
    row = top_pick.analyse(measured, predicted=full, progress=False)[0]
    assert row["loss_pct"] == 200.0 and row["within_bar"] is False


def _live_files(tmp_path, pick_ms, best_ms):
    picks = tmp_path / "picks.csv"
    picks.write_text("seqlen,head_dim,causal,pick,best\n512,64,0,64x64 w4 s3,128x64 w8 s3\n"
                     "1024,64,0,128x64 w8 s3,128x64 w8 s3\n")
    live = tmp_path / "live.csv"
    rows = ["kernel,config,seqlen,head_dim,causal,ms,status,gpu,driver,git_commit,date"]
    for n, cfg, ms in ((512, "64x64 w4 s3", pick_ms), (512, "128x64 w8 s3", best_ms),
                       (1024, "128x64 w8 s3", 0.3), (1024, "64x64 w4 s3", 0.2)):
        spec = "fa2@" + cfg.split()[0] + "x" + cfg.split()[1][1:] + "x" + cfg.split()[2][1:]
        rows.append(f"{spec},{cfg},{n},64,0,{ms},ok,H100,580,abc,2026")
    live.write_text("\n".join(rows) + "\n")
    return picks, live


def test_live_picks_lose_against_the_fastest_of_the_same_run(tmp_path):
    from experiments.top_pick_live import analyse, plan

    picks, live = _live_files(tmp_path, pick_ms=0.21, best_ms=0.20)
    rows, md = analyse(picks, live)
    by_n = {r["seqlen"]: r for r in rows}
    assert by_n[512]["loss_pct"] == 5.0 and by_n[512]["best"] == "128x64 w8 s3"
    # the pick is the measured best of the sweep, but the live run found a faster config
    assert by_n[1024]["loss_pct"] == 50.0 and by_n[1024]["best"] == "64x64 w4 s3"
    assert "1 of 2 picks within 5%" in md
    assert plan(picks).startswith("python -m kernels.bench --kernels fa2@128x64x8x3,fa2@64x64x4x3 ")


def test_live_analysis_bad_input_exits_2(tmp_path, capsys):
    from experiments.top_pick_live import main

    picks, _ = _live_files(tmp_path, 0.2, 0.2)
    assert main(["analyse", "--picks", str(picks), "--live", str(tmp_path / "absent.csv")]) == 2
    assert "cannot read" in capsys.readouterr().err
    binary = tmp_path / "binary.csv"
    binary.write_bytes(b"\x80\x81\xff\xfe")
    assert main(["analyse", "--picks", str(picks), "--live", str(binary)]) == 2
    assert "not a readable CSV" in capsys.readouterr().err
    bad = tmp_path / "bad.csv"
    bad.write_text("seqlen,head_dim,causal,pick,best\n512,64,0,64x64-w4,64x64 w4 s3\n")
    assert main(["plan", "--picks", str(bad)]) == 2
    assert "is not like" in capsys.readouterr().err


def test_shortlist_losses_follow_the_predicted_order():
    """top{k}_loss_pct: the fastest measured config among the k fastest predicted,
    against the best; here the best is the model's fourth."""
    shape = (1024, 64, False, 16, 32, "bf16")
    configs = top_pick.grid_configs()[:6]
    measured = {shape: dict(zip(configs, (2.0, 1.6, 1.8, 1.0, 1.2, 3.0)))}
    predicted = {shape: {c: (float(i), "tensor_cores") for i, c in enumerate(configs)}}
    row = top_pick.analyse(measured, predicted=predicted, progress=False)[0]
    assert row["loss_pct"] == 100.0
    assert abs(row["top3_loss_pct"] - 60.0) < 1e-9
    assert row["top5_loss_pct"] == 0.0 and row["top8_loss_pct"] == 0.0
    table = top_pick.shortlist_table([row])
    assert "| 3 | 0 of 1 | 60.0% | 60.0% |" in table and "| 5 | 1 of 1 | 0.0% | 0.0% |" in table


def test_report_named_after_the_profile(tmp_path):
    """--gpu h100.measured writes top_pick_h100_measured.*, not over h100's report."""
    times = {SHAPES[0]: {c: 1.0 + i for i, c in enumerate(top_pick.grid_configs())}}
    _write(tmp_path / "m.csv", _rows(times))
    preds = [{"key": "|".join(str(x) for x in ("fa2", "bf16", 1, 2, 256, 64, 0, *c)),
              "runtime_us": 1.0 + i, "bottleneck": "tensor_cores"}
             for i, c in enumerate(top_pick.grid_configs())]
    _write(tmp_path / "p.csv", preds)
    assert top_pick.main(["--measured", str(tmp_path / "m.csv"), "--out", str(tmp_path),
                          "--predictions", str(tmp_path / "p.csv"), "--gpu", "h100.measured"]) == 0
    assert (tmp_path / "top_pick_h100_measured.md").is_file()
    assert not (tmp_path / "top_pick_h100.md").exists()


def test_autotune_prune_report_joins_split_runs(tmp_path, capsys):
    """Two calls' CSVs make one report; a CSV without the run's columns exits 2."""
    from experiments import autotune_prune

    def run_csv(name, seqlen, command):
        common = {"head_dim": 64, "causal": 0, "status": "ok", "block_n": 64, "num_warps": 8,
                  "num_stages": 3, "gpu": "H100", "git_commit": "abc", "command": command,
                  "predictions": "p.json (h100)"}
        rows = [{**common, "seqlen": seqlen, "mode": "full", "top_k": "", "autotune_s": 40.0,
                 "median_ms": 1.0, "block_m": 128},
                {**common, "seqlen": seqlen, "mode": "pruned", "top_k": 3, "autotune_s": 4.0,
                 "median_ms": 1.01, "block_m": 128}]
        _write(tmp_path / name, rows)
        return str(tmp_path / name)

    a, b = run_csv("a.csv", 2048, "run --causal 0"), run_csv("b.csv", 16384, "run --causal 1")
    assert autotune_prune.main(["report", a, b, "--out", str(tmp_path / "out")]) == 0
    md = (tmp_path / "out" / "autotune_prune_h100.md").read_text()
    assert "| 2048 | 64 | 0 | 3 |" in md and "| 16384 | 64 | 0 | 3 |" in md
    assert "in 2 of 2 shapes" in md and "run --causal 0`; `run --causal 1" in md
    assert "Predictions: p.json (h100)" in md
    assert "where both chose the same config (2 times), its two timings" in md and "+1.0…+1.0%" in md
    _write(tmp_path / "bad.csv", [{"seqlen": 1}])
    assert autotune_prune.main(["report", str(tmp_path / "bad.csv")]) == 2
    assert "missing columns" in capsys.readouterr().err


def test_noise_floor_times_one_runs_fastest_in_the_other():
    """A run's fastest config per shape, timed in another run, against that run's fastest."""
    shape = (1024, 64, False, 16, 32, "bf16")
    a, b, c = top_pick.grid_configs()[:3]
    runs = {"x": {shape: {a: 1.00, b: 1.02, c: 1.5}}, "y": {shape: {a: 1.10, b: 1.00, c: 1.4}}}
    floor = {(x, y): losses for x, y, losses in top_pick.noise_floor(runs)}
    assert abs(floor[("x", "y")][0] - 10.0) < 1e-9      # x's fastest (a) is 10% off in y
    assert abs(floor[("y", "x")][0] - 2.0) < 1e-9       # y's fastest (b) is 2% off in x
    table = top_pick.noise_table(top_pick.noise_floor(runs))
    assert "| `x` | `y` | 0 of 1 | 10.0% | 10.0% |" in table
