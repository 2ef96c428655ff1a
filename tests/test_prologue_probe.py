"""fa2's CTA prologue, timed by calibrate.py prologue_probe (CUDA, no attention
kernel; experiments/results/prologue_probe_h200.csv, an H200's SMs) and replayed
by the engine (experiments/prologue_compare.py)."""
import os

from experiments import prologue_compare

CSV = os.path.join(os.path.dirname(__file__), "..", "experiments", "results", "prologue_probe_h200.csv")


def test_busy_neighbours_delay_a_new_ctas_copies_but_not_its_plain_loads():
    """The committed rows: beside two CTAs an SM that copy nothing but run
    exp2s (busy2_mufu) or FFMAs (busy2_ffma) back to back, a CTA's first K/V
    stage lands well after it does alone, while its Q block (plain loads)
    comes as fast: the work between Q's arrival and the copies' (their
    LDGSTS, the STS of Q, the address arithmetic) waits for the SM's MIO
    queue or its issue slots, the loads themselves do not."""
    rows = prologue_compare.measured_rows(CSV)
    for busy in ("busy2_mufu", "busy2_ffma"):
        assert rows[busy] > 1.5 * rows["lone"], (busy, rows)
        assert rows[f"{busy}_q"] <= 1.1 * rows["lone_q"], (busy, rows)
    # a quarter of the exp2s or FFMAs a step, a smaller delay; one busy CTA an SM (a warp a
    # sub-partition beside the probe's), next to none
    assert rows["lone"] < rows["busy2_mufu32"] < rows["busy2_mufu"], rows
    assert rows["lone"] < rows["busy2_ffma256"] < rows["busy2_ffma"], rows
    for busy in ("busy1_mufu", "busy1_ffma"):
        assert rows[busy] < 1.15 * rows["lone"], (busy, rows)
    # neighbours that stream copies at the whole L2's rate delay both
    assert rows["busy2_copy"] > 2 * rows["lone"] and rows["busy2_copy_q"] > 2 * rows["lone_q"], rows


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
