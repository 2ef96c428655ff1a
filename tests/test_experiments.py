"""Every experiment command from the CLI: exit 0 and its files in tmp_path;
bad input ends in one line on stderr and exit 2. Small problems only."""
import csv

import pytest

from gpusim.cli import main

SMALL = ["--batch", "1", "--heads", "2", "--seqlen", "256", "--head-dim", "64"]


def _rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _bad(capsys, argv, needle):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("gpusim: error:"), err
    assert needle in err, err


def test_sweep_writes_csv_png_and_lists_best_with_bottleneck(tmp_path, capsys):
    argv = ["sweep", *SMALL, "--head-dim", "128", "--block-m", "64,128", "--block-n", "64,256",
            "--warps", "4", "--stages", "1,4", "--jobs", "1", "--no-progress", "--top", "3",
            "--out", str(tmp_path)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    stem = "sweep_h100_fa2_b1-h2-n256-d128-bf16"
    rows = _rows(tmp_path / f"{stem}.csv")
    assert len(rows) == 2 * 2 * 1 * 2
    assert (tmp_path / f"{stem}.png").stat().st_size > 10_000
    assert "bottleneck" in out and "8 configs" in out
    # the autotune shortlist: every feasible config here (fewer than 8), fastest first
    short = out.split("to autotune: the ")[1]
    good = sorted((r for r in _rows(tmp_path / f"{stem}.csv") if r["feasible"] == "1"),
                  key=lambda r: float(r["runtime_us"]))
    assert short.startswith(f"{len(good)} fastest predicted")
    labels = short.split("): ")[1].splitlines()[0].split(", ")
    # marked where the compiled tables lack the config (block_n 256 here): its registers
    # and spills are estimates
    assert labels == [f"{r['block_m']}x{r['block_n']} w{r['num_warps']} s{r['num_stages']}"
                      + ("*" if r["from_compiler"] == "0" else "") for r in good]
    assert {r["from_compiler"] for r in good if r["block_n"] == "64"} == {"1"}
    assert {r["from_compiler"] for r in good if r["block_n"] == "256"} == {"0"}
    assert "* not in the compiled tables" in out
    bad = [r for r in rows if r["feasible"] == "0"]
    # 128x256 with 4 stages: 2 B x 128 x (128 + 256 x 8) = 557056 B of SMEM > 232448
    big = next(r for r in bad if (r["block_m"], r["block_n"], r["num_stages"]) == ("128", "256", "4"))
    assert "shared memory" in big["reason"]
    assert "Required: 557056" in big["reason"] and "Hardware limit: 232448" in big["reason"]
    assert big["short_reason"] == "SMEM 544K>227K"
    good = [r for r in rows if r["feasible"] == "1"]
    assert good and all(float(r["runtime_us"]) > 0 and r["bottleneck"] for r in good)


def test_sweep_no_sim_ranks_by_requested_bytes(tmp_path, capsys):
    argv = ["sweep", *SMALL, "--block-m", "64", "--block-n", "32,64", "--warps", "4",
            "--stages", "2", "--no-sim", "--jobs", "1", "--no-progress", "--out", str(tmp_path)]
    assert main(argv) == 0
    assert "accounting only" in capsys.readouterr().out


@pytest.mark.parametrize("argv, needle", [
    (["sweep", "--block-m", "48", "--no-sim"], "block_m must be a power of two"),
    (["sweep", "--block-m", "64,x", "--no-sim"], "--block-m: 'x' is not an integer"),
    (["sweep", "--gpu", "b200", "--no-sim"], "unknown GPU 'b200'"),
    (["sweep", "--scheduler", "tcp://127.0.0.1:1", "--no-sim"], "--scheduler needs --executor dask"),
    (["sweep", "--jobs", "0", "--no-sim"], "--jobs must be at least 1"),
    (["sweep", "--executor", "spark"], "invalid choice"),
    (["sweep", "--algo", "fa3", "--gpu", "a100-40gb", "--block-m", "128", "--block-n", "64",
      "--warps", "12", "--stages", "2", "--no-sim", "--jobs", "1", "--no-progress"], None),
    (["compare", "--gpus", "h100,b200", "--no-sim"], "unknown GPU 'b200'"),
    (["compare", "--algos", "fa9", "--no-sim"], "unknown value 'fa9'"),
    (["compare", "--causal", "2", "--no-sim"], "--causal takes 0, 1"),
    (["compare", "--seqlens", "1000", "--no-sim"], "must be a multiple of N"),
    (["memory", "--model", "gpt5"], "unknown model 'gpt5'"),
    (["memory", "--heads", "6", "--kv-heads", "4", "--layers", "2", "--head-dim", "64"],
     "multiple of kv_heads"),
    (["memory", "--seqlens", "512,abc"], "not an integer"),
    (["roofline", "--gpus", "b200"], "unknown GPU 'b200'"),
    (["roofline", "--head-dim", "100"], "head_dim must be one of"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, argv, needle):
    argv = [*argv, "--out", str(tmp_path)]
    if needle is None:
        # fa3 on an A100 is not bad input for a sweep: every row says why
        assert main(argv) == 0
        rows = _rows(next(tmp_path.glob("sweep_*.csv")))
        assert rows and all("wgmma" in r["reason"] for r in rows)
        return
    _bad(capsys, argv, needle)


def test_compare_writes_table_figures_and_fa3_on_a100_is_not_applicable(tmp_path, capsys):
    argv = ["compare", "--gpus", "a100-80gb,h100", "--seqlens", "256,512", "--head-dims", "64",
            "--tokens", "512", "--hidden", "128", "--jobs", "2", "--no-progress",
            "--out", str(tmp_path)]
    assert main(argv) == 0
    for name in ("speedups.csv", "speedups.md", "compare_tflops.png", "compare_hbm.png"):
        assert (tmp_path / name).stat().st_size > 200, name
    rows = _rows(tmp_path / "speedups.csv")
    assert len(rows) == 2 * 4 * 2 * 2
    fa3_a100 = [r for r in rows if r["algo"] == "fa3" and r["gpu"] == "a100-80gb"]
    assert fa3_a100 and all(r["applicable"] == "0" and "wgmma" in r["reason"] for r in fa3_a100)
    fa2 = [r for r in rows if r["algo"] == "fa2"]
    assert all(float(r["speedup_vs_standard"]) > 0 and float(r["tflops"]) > 0 for r in fa2)
    std = [r for r in rows if r["algo"] == "standard"]
    # standard's workspace is S and P: 2 x B x H x N^2 x 2 bytes
    for r in std:
        b, h, n = int(r["batch"]), int(r["heads"]), int(r["seqlen_q"])
        assert int(r["workspace_bytes"]) == 2 * b * h * n * n * 2
    md = (tmp_path / "speedups.md").read_text()
    assert "## a100-80gb" in md and "## h100" in md and "needs Hopper's wgmma and TMA" in md
    assert "fa2 speedup" in md


def test_memory_cli_prints_llama2_70b_and_writes_files(tmp_path, capsys):
    assert main(["memory", "--model", "llama2-70b", "--seqlens", "512,1024,2048",
                 "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "KV cache per token per layer: 4 KiB (4096 B); with MHA: 32 KiB (32768 B)" in out
    rows = _rows(tmp_path / "memory_llama-2-70b.csv")
    assert [int(r["seqlen"]) for r in rows] == [512, 1024, 2048]
    assert (tmp_path / "memory_llama-2-70b.png").stat().st_size > 10_000
    assert main(["memory", "--layers", "2", "--heads", "4", "--head-dim", "64", "--name", "tiny",
                 "--seqlens", "128", "--out", str(tmp_path)]) == 0
    assert (tmp_path / "memory_tiny.csv").exists()


def test_roofline_cli(tmp_path, capsys):
    argv = ["roofline", *SMALL, "--gpus", "a100-80gb,h100", "--jobs", "1", "--no-progress",
            "--out", str(tmp_path)]
    assert main(argv) == 0
    rows = _rows(tmp_path / "roofline_b1-h2-n256-d64-bf16.csv")
    assert len(rows) == 8
    ok = [r for r in rows if r["applicable"] == "1"]
    assert ok and all(r["bytes_source"] == "engine HBM" for r in ok)
    assert all(float(r["achieved_tflops"]) > 0 for r in ok)
    assert (tmp_path / "roofline_b1-h2-n256-d64-bf16.png").stat().st_size > 10_000
    assert main([*argv, "--no-sim"]) == 0
    rows = _rows(tmp_path / "roofline_b1-h2-n256-d64-bf16.csv")
    assert all(r["bytes_source"] == "compulsory" for r in rows if r["applicable"] == "1")


@pytest.mark.parametrize("content, needle", [(None, "cannot read"),
                                             (b"\x80\x81\xff\xfe", "not a readable CSV")])
def test_calibrate_profile_bad_csv_is_one_line_and_exit_2(tmp_path, capsys, content, needle):
    from experiments import calibrate   # (imports the kernels' provenance helpers: inside the test)

    csv_path = tmp_path / "calibration.csv"
    if content is not None:
        csv_path.write_bytes(content)
    out = tmp_path / "measured.toml"
    assert calibrate.main(["profile", "--csv", str(csv_path), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("calibrate: ") and needle in err, err
    assert not out.exists()


def test_fingerprints_compare_runs(tmp_path, capsys, monkeypatch):
    """experiments/fingerprints.py on one small case: a run equals itself
    (exit 0), a changed prediction is named (exit 1), an unreadable earlier
    file is one line on stderr and exit 2."""
    import json

    from algorithms.problem import TileConfig
    from experiments import fingerprints

    monkeypatch.setattr(fingerprints, "cases", lambda: [
        ("fa2", dict(batch=1, heads=2, seqlen_q=256, head_dim=64), TileConfig(64, 64, 4, 2), True)])
    first, second = tmp_path / "a.json", tmp_path / "b.json"
    assert fingerprints.main(["--out", str(first)]) == 0
    assert fingerprints.main(["--out", str(second), "--compare", str(first)]) == 0
    assert "1 of 1 predictions bit-identical" in capsys.readouterr().out
    changed = json.loads(first.read_text())
    (key,) = changed
    changed[key]["runtime_us"] *= 1.01
    first.write_text(json.dumps(changed))
    assert fingerprints.main(["--out", str(second), "--compare", str(first)]) == 1
    assert f"differs: {key}" in capsys.readouterr().out
    assert fingerprints.main(["--out", str(second), "--compare", str(tmp_path / "missing.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("fingerprints: cannot read")


def test_clock_power_refuses_bad_input(capsys):
    """(Without a GPU, it says so in one line: GPU_RUNS below.)"""
    from experiments import clock_power
    assert clock_power.main(["--only", "everything"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["clock_power: --only takes micro, attention, stamped, probe and/or span, got 'everything'"]
    assert clock_power.main(["--only", "span", "--span-configs", "16384:128:0:128x64w8s3,16384:96:0:64x64w4s3"]) == 2
    assert capsys.readouterr().err.strip() == ("clock_power: --span-configs: '16384:96:0:64x64w4s3' is not "
                                               "N:D:causal:BMxBNwWsS (e.g. 16384:128:0:128x64w8s3)")
    for bad in ("12,-1", "12,a", ""):
        assert clock_power.main(["--only", "span", "--span-before", bad]) == 2
        assert "--span-before takes counts >= 0, comma-separated" in capsys.readouterr().err
    assert clock_power.parse_span_configs("16384:64:1:64x128w4s2") == [
        ("fa2 D64 N16384 causal 64x128w4s2", 16384, 64, True, (64, 128, 4, 2))]


def test_gpu_monitor_window_medians_and_cap_share():
    from kernels.gpu_monitor import HW_POWER_BRAKE, SW_POWER_CAP, GpuMonitor

    class FakeNvml:
        @staticmethod
        def nvmlDeviceGetCurrentClocksEventReasons(handle):
            return 0

    m = GpuMonitor(FakeNvml, handle=None)
    # (t, MHz, W, reasons): the first sample falls before the window and is dropped
    m.samples = [(0.5, 345, 70.0, 0), (1.0, 1980, 300.0, 0), (1.1, 1800, 650.0, SW_POWER_CAP),
                 (1.2, 1650, 690.0, SW_POWER_CAP | 0x1), (1.3, 1980, 400.0, HW_POWER_BRAKE), (2.5, 1980, 80.0, 0)]
    w = m.window(0.9, 1.35)
    assert w["samples"] == 4 and w["clock_mhz"] == 1890 and w["power_w"] == 525.0
    assert w["power_cap_share"] == 0.75
    assert m.window(1.4, 2.0) == {"clock_mhz": "", "clock_p10": "", "clock_p90": "", "power_w": "",
                                  "power_cap_share": "", "samples": 0}
    assert [s[0] for s in m.samples] == [2.5]


def test_long_runs_refuse_an_unwritable_output_before_they_start(capsys):
    """gpusim compare and sweep, top_pick.py, validate.py report,
    autotune_prune.py precompute, triton_smem_probe.py and fast_vs_full.py
    predict or compile for minutes before they write: an output they cannot
    write is refused first, in one line (compare had predicted for 22 s on
    one small shape, sweep for 51 s on a small problem, precompute 78 s, then
    failed)."""
    assert main(["compare", "--out", "/proc/no/such", "--no-progress"]) == 2
    assert "cannot create output folder /proc/no/such" in capsys.readouterr().err
    assert main(["sweep", "--seqlen", "1024", "--out", "/proc/no/such", "--no-progress"]) == 2
    assert "cannot create output folder /proc/no/such" in capsys.readouterr().err
    assert _experiment("top_pick").main(["--out", "/proc/no/such", "--no-progress"]) == 2
    assert "cannot create output folder /proc/no/such" in capsys.readouterr().err
    assert _experiment("validate").main(["report", "--report", "/proc/no/such/r.md", "--no-plots"]) == 2
    assert capsys.readouterr().err.strip() == "validate: cannot create output folder /proc/no/such: No such file or directory"
    assert _experiment("autotune_prune").main(["precompute", "--predictions", "/proc/no/such/p.json", "--no-progress"]) == 2
    assert "cannot create output folder /proc/no/such" in capsys.readouterr().err
    assert _experiment("triton_smem_probe").main(["--outdir", "/proc/no/such"]) == 2
    assert "triton_smem_probe: cannot write /proc/no/such" in capsys.readouterr().err
    assert _experiment("fast_vs_full").main(["--out", "/proc/no/such/fvf.csv"]) == 2
    assert capsys.readouterr().err.strip().startswith("fast_vs_full: cannot write /proc/no/such/fvf.csv")
    # roofline predicted its 20 configs (a minute) and trace ran its
    # simulation before they failed to write
    assert main(["roofline", "--out", "/proc/no/such", "--no-progress"]) == 2
    assert "cannot create output folder /proc/no/such" in capsys.readouterr().err
    assert main(["trace", "--seqlen", "512", "-o", "/proc/no/such/t.json"]) == 2
    assert "cannot create output folder /proc/no/such" in capsys.readouterr().err
    assert main(["trace", "--seqlen", "512", "--png", "/proc/no/such/t.png"]) == 2
    assert "cannot create output folder /proc/no/such" in capsys.readouterr().err


def test_a_write_the_system_refuses_is_one_line(tmp_path):
    """/proc is a folder root may write into that takes no new files: the
    temporary file of an atomic write fails, and says so in one line (trace
    -o /proc/t.json printed a FileNotFoundError traceback); nothing is left
    behind where a write fails after its temporary file was made."""
    from algorithms.errors import GpusimError
    from gpusim.artifacts import atomic_write_text

    with pytest.raises(GpusimError, match=r"^cannot write /proc/t\.json: "):
        atomic_write_text("/proc/t.json", "{}")
    target = tmp_path / "kept.txt"
    target.write_text("before")
    (tmp_path / "kept.txt.d").mkdir()
    with pytest.raises(GpusimError, match="cannot write"):
        atomic_write_text(tmp_path / "kept.txt.d", "after")     # a folder stands where the file would go
    assert target.read_text() == "before" and sorted(p.name for p in tmp_path.iterdir()) == ["kept.txt", "kept.txt.d"]


@pytest.mark.parametrize("argv, says", [
    (["compare", "--seqlens", "0", "--no-progress"], "--seqlens: 0 is below 1, the least allowed"),
    (["compare", "--head-dims", "64,-128", "--no-progress"], "--head-dims: -128 is below 1, the least allowed"),
    (["memory", "--seqlens", "1024,0"], "--seqlens: 0 is below 1, the least allowed"),
    (["trace", "--seqlen", "512", "--sms", "133"], "--sms 133: h100 has 132 SMs"),
    (["trace", "--seqlen", "100000000000", "-o", "/tmp/never.json"], "fa2 needs 6,579,200.0 GB of GPU memory"),
    (["predict", "--batch", "1", "--heads", "16", "--seqlen", "100000000000", "--head-dim", "128"],
     "fa2 needs 1,644,800.0 GB of GPU memory for Q, K, V, O, LSE; h100 has 85.0 GB"),
    (["predict", "--algo", "standard", "--batch", "64", "--heads", "32", "--seqlen", "16384", "--head-dim", "64",
      "--no-sim"], "standard needs 2,216.2 GB of GPU memory for Q, K, V, O, S, P"),
])
def test_cli_refuses_in_one_line(argv, says, capsys):
    """compare --seqlens 0 was a ZeroDivisionError traceback; trace --sms past
    the GPU's SMs traced 'of 100000 SMs'; a problem larger than the GPU's
    memory was counted for hours (N = 1e11)."""
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert says in err and "\n" not in err


# The GPU machine's experiments, and the argv that names their output.
GPU_RUNS = [("pipe_counters", ["--out"]), ("spill_counters", ["--out"]), ("l2_request_probe", ["--out"]),
            ("fa3_gluon_ncu", ["--out"]), ("launch_timing_probe", ["--out"]), ("qk_store_probe", ["--out"]),
            ("fa3_gluon_small_n_probe", ["--out"]), ("validate", ["measure", "--out"]),
            ("validate", ["ncu", "--out"]), ("calibrate", ["run", "--out-dir"]), ("fa2_stamps", ["measure", "--out"]),
            ("fa2_stamps", ["warmth", "--out"]), ("fa2_stamps", ["lone", "--out"]),
            ("clock_power", ["--out"]), ("clock_after_load", ["--out"]), ("lockstep_probe", ["--out"]),
            ("autotune_prune", ["run", "--out"]), ("flush_probe", ["--out"]), ("fa1_traffic_probe", ["--out"]),
            ("l2_keep_probe", ["--out"]), ("l2_keep_ncu", ["--out"])]


def _experiment(script: str):
    import importlib
    import os
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    return importlib.import_module(f"experiments.{script}")


@pytest.mark.parametrize("script, argv", GPU_RUNS)
def test_gpu_runs_refuse_an_unwritable_output_before_gpu_work(script, argv, capsys):
    """Each checks first (experiments/gpu_probe.start) that its results can be
    written: one line, exit 2, with a GPU or without."""
    out = "/proc/no/such" + ("" if argv[-1] == "--out-dir" else "/out.csv")
    assert _experiment(script).main([*argv, out]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith(f"{script}: cannot write /proc/no/such"), err


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="on a GPU these would run")
@pytest.mark.parametrize("script, argv", GPU_RUNS)
def test_gpu_runs_say_they_need_a_gpu_in_one_line(script, argv, tmp_path, capsys):
    out = tmp_path if argv[-1] == "--out-dir" else tmp_path / "out.csv"
    assert _experiment(script).main([*argv, str(out)]) == 2
    assert capsys.readouterr().err.strip() == f"{script}: needs a CUDA GPU"


def test_predict_progress_bar_goes_to_stderr_only(capsys):
    """gpusim predict's progress bar (shown once a prediction has run for a
    second) never mixes into its JSON on stdout; --no-progress leaves stderr
    empty."""
    import json

    argv = ["predict", "--batch", "1", "--heads", "2", "--seqlen", "512", "--head-dim", "64", "--json", "--compact"]
    assert main(argv + ["--no-progress"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["runtime_us"] > 0 and err == ""


def test_the_experiments_index_names_every_script():
    """experiments/README.md says what each script is for and where it runs:
    a script missing from it is a script a newcomer cannot place."""
    from pathlib import Path

    folder = Path(__file__).resolve().parents[1] / "experiments"
    index = (folder / "README.md").read_text()
    scripts = sorted(p.name for p in folder.glob("*.py") if p.name != "__init__.py")
    assert scripts and [s for s in scripts if f"`{s}`" not in index] == []
