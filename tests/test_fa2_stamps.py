"""experiments/fa2_stamps.py: the phase arithmetic, bad input, and (GPU) the stamps themselves."""
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "experiments"))
import fa2_stamps  # noqa: E402


def test_phases_from_two_ctas_on_one_sm_and_one_on_another():
    ctas = [(0, 0.0, 3.0, 4.0), (0, 4.5, 7.0, 8.0), (1, 0.0, 2.0, 6.0)]
    got = fa2_stamps.phases(ctas)
    assert got["loop_us"] == pytest.approx(2.5)       # median of 3, 2.5, 2
    assert got["epilogue_us"] == pytest.approx(1.0)   # median of 1, 1, 4
    assert got["cta_us"] == pytest.approx(4.0)        # median of 4, 3.5, 6
    assert got["gap_us"] == pytest.approx(0.5)        # SM 0: 4.0 -> 4.5
    assert got["span_us"] == pytest.approx(8.0)


def test_per_step_fit_recovers_a_line_in_the_ctas_k_v_steps():
    """Causal N = 512, 64-row Q blocks over 32-column K/V blocks: Q block q
    (CTA index mod 8) visits 2(q + 1) blocks; CTAs taking 3.5 + 0.9 × steps µs
    give back (3.5, 0.9), and a non-causal case, one step count, gives None."""
    case = (512, 128, True, 64, 32, 4, 3)
    durations = [(cta, 3.5 + 0.9 * 2 * (cta % 8 + 1)) for cta in range(64)]
    a, b = fa2_stamps.per_step_fit(case, durations)
    assert (a, b) == (pytest.approx(3.5), pytest.approx(0.9))
    assert fa2_stamps.per_step_fit((512, 128, False, 64, 32, 4, 3), durations) is None


@pytest.mark.parametrize("command, text", [
    ("compare", "case,cta\nx,1\n"),
    ("lone-compare", "case,cta\nx,1\n"),
    # the columns `measure` writes, but not the step stamps
    ("steps-compare", "case,cta,sm,start_ns,clock_mhz\nx,1,0,0,1800\n"),
])
def test_a_compare_rejects_a_file_without_its_columns(tmp_path, capsys, command, text):
    bad = tmp_path / "bad.csv"
    bad.write_text(text)
    assert fa2_stamps.main([command, "--measured", str(bad)]) == 2
    assert "cannot read" in capsys.readouterr().err


@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs a CUDA GPU")
def test_stamps_are_ordered_and_name_real_sms():
    import torch

    from kernels import fa2
    from kernels.common import make_inputs

    problem, cfg = fa2_stamps.problem_config((512, 64, False, 64, 64, 4, 3))
    q, k, v = make_inputs(2, 4, 512, 64)
    stamps = torch.zeros(8 * 8, fa2.STAMP_SLOTS, dtype=torch.int64, device="cuda")
    out = fa2.forward(q, k, v, config=cfg, stamps=stamps)
    ref = fa2.forward(q, k, v, config=cfg)
    torch.cuda.synchronize()
    s = stamps.cpu()
    assert torch.equal(out, ref)                       # the stamps change nothing computed
    assert bool((s[:, 0] > 0).all() and (s[:, 0] <= s[:, 1]).all() and (s[:, 1] <= s[:, 2]).all())
    assert bool((s[:, 3] >= 0).all() and (s[:, 3] < torch.cuda.get_device_properties(0).multi_processor_count).all())
    # the SM's cycle counter runs at a clock between 0.5 and 2.5 GHz over the CTA
    mhz = (s[:, 5] - s[:, 4]).double() / (s[:, 2] - s[:, 0]).double() * 1e3
    assert bool(((mhz > 500) & (mhz < 2500)).all()), mhz
    with pytest.raises(ValueError, match="stamps must be an int64 tensor"):
        fa2.forward(q, k, v, config=cfg, stamps=stamps[:3])
    with pytest.raises(ValueError, match="stamps must be an int64 tensor"):
        fa2.forward(q, k, v, config=cfg, stamps=stamps.float())


def test_an_unknown_case_is_one_line_and_exit_2(capsys):
    assert fa2_stamps.main(["compare", "--cases", "N16384_D128_c1_128x64w8s2,nope"]) == 2
    err = capsys.readouterr().err
    assert "unknown case nope" in err and "N16384_D128_c1_128x64w8s2" in err and err.count("\n") == 1


def test_named_cases_are_taken_in_the_order_given():
    names = "N16384_D128_c1_128x64w8s3,N512_D128_c0_128x64w8s3"
    assert [fa2_stamps.case_name(c) for c in fa2_stamps.selected(names)] == names.split(",")
    assert fa2_stamps.selected(None) == fa2_stamps.CASES


def test_lone_cases_are_one_head_of_128_ctas_one_an_sm():
    """Each D = 64 case, and D = 128's 8-warp ones, alone on its SMs: one
    head, 128 CTAs (fewer than the H100's 132 SMs), whatever its block_m."""
    assert len(fa2_stamps.LONE_CASES) == 11
    for case in fa2_stamps.LONE_CASES:
        problem, cfg = fa2_stamps.lone_problem(case)
        assert problem.batch * problem.heads == 1 and not problem.causal
        assert problem.head_dim == 64 or cfg.num_warps == 8
        assert problem.seqlen_q // cfg.block_m == fa2_stamps.LONE_CTAS


def test_lone_measured_takes_the_last_rep(tmp_path):
    f = tmp_path / "lone.csv"
    f.write_text("case,rep,steps,cta,sm,start_ns,looped_ns,end_ns,clock_mhz\n"
                 "a,0,10,0,0,0,900,1000,1800\n"
                 "a,1,10,0,0,0,1900,2000,1700\n"
                 "a,1,10,1,1,0,3900,4000,1900\n")
    assert fa2_stamps.lone_measured(str(f)) == {"a": (3.0, 10, 1800.0)}


def test_committed_lone_run_had_one_cta_on_each_sm():
    """The premise of the lone rows: in every rep, 128 CTAs on 128 distinct SMs
    (the D = 64 cases on the H100, session 27; D = 128's on an H200, session 28)."""
    import csv
    sms: dict = {}
    for name in ("fa2_stamps_lone_h100.csv", "fa2_stamps_lone_d128_h200.csv"):
        path = os.path.join(os.path.dirname(__file__), "..", "experiments", "results", name)
        for r in csv.DictReader(open(path)):
            sms.setdefault((r["case"], r["rep"]), []).append(int(r["sm"]))
    assert {case for case, _ in sms} == {f"lone_{fa2_stamps.case_name(c)}" for c in fa2_stamps.LONE_CASES}
    assert len(sms) == 3 * len(fa2_stamps.LONE_CASES)
    for key, got in sms.items():
        assert len(got) == len(set(got)) == fa2_stamps.LONE_CTAS, key


def test_lone_cases_are_checked_against_the_lone_list():
    # a case `measure` knows but `lone` does not run is refused, not silently skipped
    assert fa2_stamps.main(["lone-compare", "--cases", "N512_D64_c0_64x64w4s3"]) == 2
    names = "N16384_D128_c0_128x128w8s2,N16384_D64_c0_128x64w4s3"
    assert [fa2_stamps.case_name(c) for c in fa2_stamps.lone_selected(names)] == \
        ["N16384_D64_c0_128x64w4s3", "N16384_D128_c0_128x128w8s2"]


def test_steps_by_neighbours_sorts_each_step_by_what_its_sm_s_other_ctas_do():
    """Two CTAs on SM 0 and one on SM 1 (times in ns, 2 cycles a ns): CTA a's
    steps (10-20, 20-40) meet b first in its first step, then looping; b's
    (25-30, 30-50) meet a looping and its last (50-52) a's epilogue; c is
    alone on its SM."""
    a = {"sm": 0, "start": 0, "q": 5, "steps": [10, 20, 40], "looped": 41, "end": 60, "cycles": 2.0}
    b = {"sm": 0, "start": 8, "q": 12, "steps": [25, 30, 50, 52], "looped": 53, "end": 70, "cycles": 2.0}
    c = {"sm": 1, "start": 0, "q": 1, "steps": [2, 6], "looped": 7, "end": 8, "cycles": 2.0}
    got = fa2_stamps.steps_by_neighbours([a, b, c])
    assert got == {(("first", 1),): [20.0], (("loop", 1),): [40.0, 10.0, 40.0], (("epi", 1),): [4.0],
                   (): [8.0]}
    # a run that did not stamp the Q block's arrival: its first step runs from the CTA's start
    unstamped = {"start": 0, "q": None, "steps": [5, 8], "looped": 9, "end": 10}
    assert [fa2_stamps._state(unstamped, t) for t in (0, 6, 9, 10)] == ["first", "loop", "epi", None]


def test_step_periods_are_consecutive_intervals_by_position():
    got = fa2_stamps.step_periods([[0, 10, 30, 33], [5, 6], [1, 2, 4, 8]], first=1)
    assert got == {1: [20, 2], 2: [3, 4]}


def test_the_engine_tells_a_tracer_each_ctas_k_copies():
    """The engine hands a tracer with load() every copy with its CTA: one fa2
    head at N = 512 (eight Q blocks of 64 rows), causal, so Q block q copies
    q + 1 K blocks, the first two in its prologue (three stages), in time order."""
    import algorithms
    from algorithms.problem import AttentionProblem, TileConfig
    from gpusim.engine import simulate
    from gpusim.profile import load_profile

    tracer = fa2_stamps._CopyTracer()
    problem = AttentionProblem(batch=1, heads=1, seqlen_q=512, head_dim=64, causal=True)
    simulate(algorithms.build("fa2", problem, TileConfig(block_m=64, block_n=64, num_warps=4, num_stages=3)),
             load_profile("h100.measured"), fast=False, tracer=tracer)
    assert {cta: len(times) for cta, times in tracer.k_issued.items()} == {q: q + 1 for q in range(8)}
    assert all(times == sorted(times) for times in tracer.k_issued.values())
    assert sorted(tracer.index) == list(range(8))


@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("arrivals", [1, 2])
def test_step_stamps_fall_between_a_ctas_start_and_its_loop_end(arrivals):
    """Causal N = 512, 64 x 64 blocks: Q block q runs q + 1 steps, each stamped
    (up to STEP_STAMPS) in order between its start and its loop's end, the
    slots after its last step left at zero, its Q block's arrival (and, in
    the wider tensor, its first K block's after it) between its start and its
    first step, and the output unchanged."""
    import torch

    from kernels import fa2
    from kernels.common import make_inputs

    problem, cfg = fa2_stamps.problem_config((512, 64, True, 64, 64, 4, 3))
    q, k, v = make_inputs(2, 4, 512, 64)
    width = fa2.STAMP_SLOTS + fa2.STEP_STAMPS + arrivals
    stamps = torch.zeros(8 * 8, width, dtype=torch.int64, device="cuda")
    out = fa2.forward(q, k, v, causal=True, config=cfg, stamps=stamps)
    ref = fa2.forward(q, k, v, causal=True, config=cfg)
    torch.cuda.synchronize()
    assert torch.equal(out, ref)
    for cta, row in enumerate(stamps.cpu().tolist()):
        steps, ready = row[fa2.STAMP_SLOTS:fa2.STAMP_SLOTS + fa2.STEP_STAMPS], row[fa2.STAMP_SLOTS + fa2.STEP_STAMPS:]
        assert row[0] <= ready[0] <= ready[-1] <= steps[0], (cta, row)
        taken = cta % 8 + 1
        assert all(t == 0 for t in steps[taken:]), (cta, steps)
        assert row[0] <= steps[0] and steps[:taken] == sorted(steps[:taken]) and steps[taken - 1] <= row[1], (cta, row)
    with pytest.raises(ValueError, match="stamps must be an int64 tensor"):
        fa2.forward(q, k, v, causal=True, config=cfg, stamps=torch.zeros(8 * 8, width + 2, dtype=torch.int64,
                                                                         device="cuda"))
