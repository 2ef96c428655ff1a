"""Co-resident CTAs taking an SM's units in turn or sharing them
(experiments/unit_sharing.py): calibrate.py's held dot_chain rows replayed in
a small model of one SM, the chain latency taken from each shape's one-CTA
row. Microbenchmark rows only; nothing here feeds a profile."""
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from experiments.unit_sharing import compare, main  # noqa: E402
from gpusim.profile import load_profile  # noqa: E402


@pytest.fixture(scope="module")
def widest():
    """128x128x128 with 8 warps: 3315 / 6379 / 12672 cycles a step at 1 / 2 / 4 CTAs an SM on the H100."""
    (row, ) = compare(load_profile("h100.measured"), [(128, 128, 128, 8)])
    return row


def test_every_rule_takes_the_one_cta_step_it_was_given(widest):
    for rule in ("in order + f", "in order", "shared"):
        assert widest[rule][1] == pytest.approx(widest["measured"][1], rel=0.01)


def test_only_shared_units_make_four_wide_ctas_as_slow_as_the_gpu(widest):
    """With the units shared, four CTAs keep in step: every softmax while the
    tensor pipe idles, as the GPU's 12672 cycles have it (-2.4%). Taken in
    turn, one CTA's softmax hides behind another's products: -35% without the
    serial fraction, -11% with the profile's 0.52 (the engine's composition)."""
    error = {rule: widest[rule][4] / widest["measured"][4] - 1 for rule in ("in order + f", "in order", "shared")}
    assert abs(error["shared"]) < 0.05
    assert -0.15 < error["in order + f"] < -0.08
    assert error["in order"] < -0.30


@pytest.mark.parametrize("argv, says", [
    (["--shapes", "128x64"], "--shapes takes"),
    (["--shapes", "96x64x128w4"], "no held dot_chain row for 96x64x128 with 4 warps"),
    (["--profile", "no_such_gpu"], "no_such_gpu"),
])
def test_bad_input_gets_one_line_and_exit_2(argv, says, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert says in err and len(err.strip().splitlines()) == 1
