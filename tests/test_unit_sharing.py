"""Co-resident CTAs taking an SM's units in turn or sharing them
(experiments/unit_sharing.py): calibrate.py's held dot_chain rows replayed in
a small model of one SM, the chain latency taken from each shape's one-CTA
row, and the phases two CTAs keep against dot_chain_sm_phase's stamps on the
H100. Microbenchmark rows only; nothing here feeds a profile."""
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from experiments.unit_sharing import RULES, compare, main, pair_timing  # noqa: E402
from gpusim.profile import load_profile  # noqa: E402


@pytest.fixture(scope="module")
def rows():
    """64x64x64 with 4 warps (four CTAs an SM at once; the H100 stamped two a
    sixth of a period apart) and 128x128x128 with 8 warps (one at a time: 186
    registers a thread)."""
    small, wide = compare(load_profile("h100.measured"), [(64, 64, 64, 4), (128, 128, 128, 8)])
    return small, wide


def test_every_rule_takes_the_one_cta_step_it_was_given(rows):
    """... or, where its work alone outlasts it (the engine's composition at
    64x64x64 w4: 760 cycles against 749), takes no chain latency."""
    for row in rows:
        for rule in RULES:
            one, measured = row[rule][1], row["measured"][1]
            assert one == pytest.approx(measured, rel=0.01) or one > measured


def test_ctas_the_sm_holds_one_at_a_time_run_in_waves(rows):
    """The bench's 2 and 4 CTAs an SM of 128x128x128 w8 never meet: whatever
    the rule, 2 and 4 lone steps (the H100: 6379 and 12672 cycles against 3315)."""
    _, wide = rows
    assert wide["held"] == 1
    for rule in RULES:
        assert wide[rule][2] == pytest.approx(2 * wide[rule][1], rel=1e-6)
        assert wide[rule][4] == pytest.approx(4 * wide[rule][1], rel=1e-6)


def test_shared_units_keep_the_offset_ctas_start_with(rows):
    """Two CTAs side by side: the H100 stamped them 0.17 of a period apart on
    every SM. Units in order push them apart (the engine's rule: half a
    period here); shared units keep them in step, or a product apart where
    their first products were served in turn."""
    small, _ = rows
    phase = small["phase"]
    gpu = phase["measured"][2]
    assert gpu == pytest.approx(0.17, abs=0.01)
    assert phase["shared"][2] < 0.02
    assert phase["shared, staggered"][2] == pytest.approx(gpu, abs=0.05)
    # the engine's own full simulation settles them where its in-order units
    # put them (0.29), and so does its composition here
    assert phase["engine"][2] > gpu + 0.08
    assert phase["in order + f"][2] == pytest.approx(phase["engine"][2], abs=0.01)


def test_a_shared_tensor_pipe_settles_two_ctas_as_the_h100_only_if_the_softmax_blocks_it_after(rows):
    """The tensor pipe shared by the warpgroups with a product in it (as it
    interleaves two warpgroups of one CTA), issue slots and MUFU in order,
    the serial fraction's block one more sharer. Charged as each softmax
    phase ends, two CTAs settle 0.16 of a period apart (the H100 0.17), and
    back there when the second starts 150-900 cycles late, as the H100's did
    (session 42); in step they fill each other's gaps less: 1017 cycles a
    step (+4.7% on the H100's 971). Charged from each phase's start, as the
    engine charges it, they settle half a period apart whatever the start,
    as in order, at in order's step; saturated at four CTAs, the serial
    fraction sets all of them alike."""
    small, _ = rows
    phase, delayed, measured = small["phase"], small["phase"]["delayed"], small["measured"]
    settled = phase["tensor shared + f after"][2]
    assert settled == pytest.approx(phase["measured"][2], abs=0.03)
    assert all(p == pytest.approx(settled, abs=0.01) for p in delayed["tensor shared + f after"].values())
    assert all(p > 0.45 for p in delayed["tensor shared + f"].values())
    assert small["tensor shared + f after"][2] / measured[2] - 1 == pytest.approx(0.047, abs=0.01)
    assert small["tensor shared + f"][2] == pytest.approx(small["in order + f"][2], rel=0.001)
    assert small["in order + f"][2] / measured[2] - 1 < -0.05
    for rule in ("tensor shared + f", "tensor shared + f after"):
        assert small[rule][4] == pytest.approx(small["in order + f"][4], rel=0.01)


def test_the_tensor_pipe_takes_ctas_products_in_turn_as_the_engines_does():
    """calibrate.py dot_pair_timing (H100, session 43): products alone, each
    on the last, at 1, 2 and 4 CTAs an SM. The H100's CTAs take them in turn
    (two 0.38-0.46 of a period apart, four a quarter), as the engine's
    in-order pipe does, not together as it interleaves one CTA's two
    warpgroups. 512-cycle products take their tensor time at every count in
    both; the 128- and 256-cycle ones, whose operands take the SMEM's whole
    128 B a clock, cost the H100 more beside other CTAs than the engine
    (-32% and -19% at two CTAs an SM): the rest of the loop (the stamp
    passes through SMEM) is not the pure wait the replay makes it."""
    rows = {(r["shape"], r["n"]): r for r in pair_timing(load_profile("h100.measured"))}
    assert len(rows) == 9
    for (shape, n), r in rows.items():
        if n > 1:
            assert r["engine_phase"] == pytest.approx(r["gpu_phase"], abs=0.13), (shape, n, r)
            assert r["gpu_phase"] > 0.35 if n == 2 else r["gpu_phase"] < 0.3
        else:
            assert r["engine"] == pytest.approx(r["gpu"], rel=1e-6)
    wide = [rows["64x128x128_w4", n] for n in (2, 4)]
    assert all(r["engine"] == pytest.approx(r["gpu"], rel=0.01) for r in wide)
    assert rows["64x64x64_w4", 2]["engine"] / rows["64x64x64_w4", 2]["gpu"] - 1 < -0.25


@pytest.mark.parametrize("argv, says", [
    (["--shapes", "128x64"], "--shapes takes"),
    (["--shapes", "96x64x128w4"], "no held dot_chain row for 96x64x128 with 4 warps"),
    (["--profile", "no_such_gpu"], "no_such_gpu"),
])
def test_bad_input_gets_one_line_and_exit_2(argv, says, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert says in err and len(err.strip().splitlines()) == 1
