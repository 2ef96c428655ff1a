"""fa2's CTA prologue, timed by calibrate.py prologue_probe (CUDA, no attention
kernel; experiments/results/prologue_probe_h200.csv, an H200's SMs) and replayed
by the engine (experiments/prologue_compare.py)."""
import os

from experiments import prologue_compare

CSV = os.path.join(os.path.dirname(__file__), "..", "experiments", "results", "prologue_probe_h200.csv")


def test_what_delays_a_new_ctas_first_copies():
    """The committed rows (cycles from the Q block in registers to the first
    K/V stage in SMEM; `_q`: from the probe's start to Q in):
    - neighbours that only run exp2s delay the copies little, however many;
    - neighbours that only run FFMAs or integer instructions delay them by a
      few hundred cycles or more (the instructions that issue the copies wait
      for the pipe they keep busy);
    - neighbours that copy as a fa2 step does (and run exp2s) delay the Q
      block and the copies alike, and neighbours that copy at the whole L2's
      rate more than double both: the memory, not the SM's queues;
    - alone, the second stage's copies cost the first some cycles and Q's
      STS none."""
    rows = prologue_compare.measured_rows(CSV)
    lone, lone_q = rows["lone"], rows["lone_q"]
    for busy in ("busy2_mufu", "busy1_mufu", "busy2_mufu32"):
        assert rows[busy] < 1.15 * lone, (busy, rows)
    for busy in ("busy2_ffma", "busy1_ffma", "busy2_ffma256", "busy1_ialu", "busy2_ialu"):
        assert rows[busy] > 1.25 * lone, (busy, rows)
    assert rows["busy2_mixed"] > 1.4 * lone and rows["busy2_mixed_q"] > 1.4 * lone_q, rows
    assert rows["busy2_copy"] > 2 * lone and rows["busy2_copy_q"] > 2 * lone_q, rows
    assert rows["lone_groups2"] < 0.95 * lone, rows
    assert abs(rows["lone_nosts"] / lone - 1) < 0.05, rows


def test_the_replayed_probe_waits_for_hbm_then_for_its_first_stage():
    """Alone on its SM the engine's probe has its Q block from HBM no sooner
    than the profile's DRAM latency after issue, and its first stage (16 KB of
    L2 hits) after it, no sooner than L2's latency."""
    from gpusim.profile import load_profile

    gpu = load_profile("h100.measured")
    q, kv = prologue_compare.replay(None, "h100.measured")
    assert q >= gpu.hbm.latency_cycles
    assert kv >= gpu.l2.hit_latency_cycles


def test_an_unreadable_or_empty_file_is_one_line_and_exit_2(tmp_path, capsys):
    assert prologue_compare.main(["--measured", str(tmp_path / "none.csv")]) == 2
    empty = tmp_path / "empty.csv"
    empty.write_text("bench,param,value\ncp_async,x,1\n")
    assert prologue_compare.main(["--measured", str(empty)]) == 2
    assert prologue_compare.main(["--profile", "no-such-gpu"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 3 and "cannot read" in err and "no prologue_probe rows" in err and "no-such-gpu" in err
