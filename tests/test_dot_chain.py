"""One flash step's dependent chain (calibrate.py dot_chain: S = A·B on
operands held on chip, row max, exp2, acc += P·V; no loads, not the attention
kernel) replayed by the engine against its H100 timings at 1, 2 and 4 CTAs
per SM (experiments/results/calibration_h100.csv). Two profile numbers come
from these rows -- the chain's latency from the one-CTA 4-warp rows, the
softmax/tensor overlap from the saturated ones -- so the rows they were not
taken from are the test: the 8-warp one-CTA rows, where two warpgroups fill
each other's latency (the engine runs them as two roles), and every row's
error stays bounded."""
import csv
import os
import re
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from experiments.step_errors import CSV, chain_rows as _rows, replay as _replay  # noqa: E402


@pytest.fixture(scope="module")
def replayed():
    rows = _rows()
    assert len(rows) >= 18
    return _replay(rows)


def test_two_warpgroups_fill_each_others_chain(replayed):
    """128x64 with 8 warps, one CTA per SM: not used for either number, and
    without the two roles the engine took 19% too long here. Open from
    session 12 to 26 at -11...-16%: the tensor pipe served the two
    warpgroups' S whole and in turn, so the first began its softmax a
    product early, beside the second's products. Interleaved as
    calibrate.py dot_chain_phase measured (Mma.issued_with), -6.9% and
    -2.4% (session 27)."""
    held_out = [(k, p, m) for k, p, m in replayed if k[3] == 8 and k[4] == 1]
    assert len(held_out) == 2
    for key, predicted, measured in held_out:
        assert abs(predicted / measured - 1) <= 0.12, (key, predicted, measured)


def test_chain_rows_within_bounds(replayed):
    """Every row within 25%, their mean error within 10% (the engine before
    the chain's latency and two-role split: 12.3%, rows up to 33% off)."""
    errors = {key: predicted / measured - 1 for key, predicted, measured in replayed}
    assert max(abs(e) for e in errors.values()) <= 0.25, errors
    assert sum(abs(e) for e in errors.values()) / len(errors) <= 0.10, errors


def test_held_out_step_shapes():
    """calibrate.py dot_chain_wide and dot_chain_more (H100, session 33): the
    17 other step shapes of fa2's config grid, which no profile number was
    reduced from, at 1, 2 and 4 CTAs an SM. The engine held them to a mean
    |error| of 9.1%, every row within 29% (validation_notes.md, session 33):
    128x128 steps 2-13% slow on the GPU against it, 64x128 at D = 128 with
    two CTAs an SM hiding its softmax under the other CTA's products (+29%
    in the engine), 64-row steps with 8 warps 12-17% slower alone. Their
    errors do not follow fa2's own by config in the measured sweep
    (correlation -0.02), so one overlap fraction stays."""
    replayed = _replay(_rows("dot_chain_wide") + _rows("dot_chain_more"))
    assert len(replayed) == 51
    errors = {key: predicted / measured - 1 for key, predicted, measured in replayed}
    assert max(abs(e) for e in errors.values()) <= 0.30, errors
    assert sum(abs(e) for e in errors.values()) / len(errors) <= 0.10, errors


def test_fp8_chain_rows():
    """calibrate.py dot_chain_fp8 (H100, session 40): the six shapes with e4m3
    products, from whose rows the profile's fp8 serial fraction and chain
    latency were reduced as the bf16 pair is from dot_chain's. Replayed as
    fp8 (the engine takes the fp8 pair), they hold the bf16 rows' bounds;
    the two 8-warp one-CTA rows, which neither number comes from, -3.7% and
    -4.9%. With the bf16 pair (0.52, 110 cycles) the engine took them 9.0%
    off on average, 16 of 18 fast, 128x64x64 w8 at two CTAs an SM -21.8%:
    fp8's softmax is the bf16 one's and more (P converted to e4m3), its
    products half as long, and less of the one hides under the other."""
    replayed = _replay(_rows("dot_chain_fp8"), dtype="fp8")
    assert len(replayed) == 18
    errors = {key: predicted / measured - 1 for key, predicted, measured in replayed}
    held_out = [e for key, e in errors.items() if key[3] == 8 and key[4] == 1]
    assert len(held_out) == 2 and max(map(abs, held_out)) <= 0.12, errors
    assert max(abs(e) for e in errors.values()) <= 0.25, errors
    assert sum(abs(e) for e in errors.values()) / len(errors) <= 0.10, errors


def test_online_softmax_chains_held_out():
    """calibrate.py dot_chain_online (H100, session 40): the chain with fa2's
    whole online softmax (the correction exp2, the row sum, the rescale of
    acc: 211 instructions a warp a step at 64x64, D = 64, 4 warps, against
    the bare chain's 133 and fa2's 266), seven shapes at 1-4 CTAs an SM,
    which no profile number comes from. The engine runs them as fa2's steps
    (their compiled instructions) within 4.6% on average, every row within
    18.2% (64x32 w4 at two CTAs an SM). So fa2's 4-warp steps at D = 64,
    20-29% longer on the GPU than in the engine at three and four CTAs an
    SM (fa2_stamps_small_n_h100.csv.gz), do not come from its softmax: at
    64x64 w4 the online chain is +0.5% and +5.1% there."""
    replayed = _replay(_rows("dot_chain_online"), online=True)
    assert len(replayed) == 28
    errors = {key: predicted / measured - 1 for key, predicted, measured in replayed}
    assert max(abs(e) for e in errors.values()) <= 0.20, errors
    assert sum(abs(e) for e in errors.values()) / len(errors) <= 0.06, errors
    assert all(abs(errors[64, 64, 64, 4, n]) <= 0.06 for n in (3, 4)), errors


def test_one_warpgroup_alone_pays_the_chain_latency(replayed):
    """With one 4-warp CTA per SM a step costs more than its share of the
    SM's throughput with four CTAs (the latency is there to fill)."""
    by_key = {key: predicted for key, predicted, _ in replayed}
    for (bm, bn, d, warps, per_sm), predicted in by_key.items():
        if warps == 4 and per_sm == 1 and (bm, bn, d, 4, 2) in by_key:
            assert predicted > by_key[(bm, bn, d, 4, 2)] / 2 * 1.1, (bm, bn, d)


def _softmax_mix_rows():
    out = {}
    for r in csv.DictReader(open(CSV)):
        if r["bench"] == "softmax_mix":
            m = re.fullmatch(r"(\d+)x(\d+)_w4(_noexp)?_x(\d+)", r["param"])
            instr, mufu = map(int, re.search(r"loop: (\d+) instructions a warp, (\d+) MUFU", r["detail"]).groups())
            out[(int(m.group(1)), int(m.group(2)), not m.group(3), int(m.group(4)))] = (float(r["value"]), instr, mufu)
    return out


def test_exp2_runs_beside_the_other_instructions():
    """What fa2's steps assume across CTAs (algorithms/fa2.step_ops: a step's
    other instructions and then its exp2s, each on its SM-wide unit, so
    CTAs in different phases keep both busy): calibrate.py softmax_mix, a
    flash step's elementwise part alone, takes no longer with its exp2s than
    with an FFMA in each one's place once 9-16 CTAs share an SM, though the
    MUFU's own time (instructions x 32 lanes / 16 a clock) is 80-90% of the
    issue slots'. At the same occupancy the loop takes 1.4x its issue slots
    (instructions x warps / 4 a clock): the model's issue rate is a bound."""
    rows = _softmax_mix_rows()
    assert rows, "calibration_h100.csv has no softmax_mix rows"
    for bm, bn in ((16, 64), (32, 64)):
        with_exp, instr, mufu = rows[(bm, bn, True, 16)]
        without, _, no_mufu = rows[(bm, bn, False, 16)]
        assert no_mufu == 0 and mufu * 32 * 4 / 16 >= 0.8 * instr
        assert with_exp <= 1.05 * without
        assert 1.2 * instr <= with_exp <= 1.6 * instr


def _phase_rows():
    return {r["param"]: r for r in csv.DictReader(open(CSV)) if r["bench"] == "dot_chain_phase"}


@pytest.mark.parametrize("shape, d", [("128x64x128_w8_x1", 128), ("128x64x64_w8_x1", 64)])
def test_two_warpgroups_products_are_served_interleaved(shape, d):
    """calibrate.py dot_chain_phase (H100): two warpgroups of one CTA issue
    their S = A·B (64 rows each, 64 columns, K = d: d/16 HGMMA.64x64x16 each)
    together after the step's barrier, and in every step measured the two
    land at most three instructions' time apart (85 cycles at d = 128,
    55-88 at d = 64). Served whole and in turn, one would land a whole
    product (8 or 4 instructions) after the other. Instruction time: the
    tl.dot loop's rate, 888 TFLOP/s over 132 SMs at the 1635-1664 MHz it
    ran at, ~4070 flop a clock."""
    from gpusim.profile import load_profile

    row = _phase_rows()[shape]
    gpu = load_profile("h100.measured")
    # the profile's tensor rate a clock (its sustained rate over its clock)
    flop_per_clk = gpu.matmul_flops_per_s_per_sm("wgmma", "bf16") / gpu.clock_hz
    instructions = d // 16
    instruction = 2 * 64 * 64 * 16 / flop_per_clk
    p10, p90 = map(float, re.search(r"p10 (-?\d+), p90 (-?\d+)", row["detail"]).groups())
    skew = max(abs(p10), abs(p90), abs(float(row["value"])))
    assert skew <= 3 * instruction < instructions * instruction, (row["detail"], instruction)


def test_step_errors_correlation_and_bad_input(capsys):
    """experiments/step_errors.py: its correlation is Pearson's, and a missing
    predictions file is one line and exit status 2."""
    from experiments import step_errors

    assert step_errors.correlation([(0, 1), (1, 3), (2, 5)]) == pytest.approx(1.0)
    assert step_errors.correlation([(0, 2), (1, 1), (2, 0)]) == pytest.approx(-1.0)
    by_shape = step_errors.step_error_by_occupancy([((64, 64, 64, 4, 2), 110.0, 100.0),
                                                    ((64, 64, 64, 4, 4), 90.0, 100.0)])
    assert by_shape[(64, 64, 64, 4)][3] == pytest.approx(0.0)
    assert step_errors.main(["--predictions", "/nonexistent/predictions.csv"]) == 2
    assert "no predictions file" in capsys.readouterr().err
