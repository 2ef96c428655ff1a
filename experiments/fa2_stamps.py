"""Where a fa2 CTA's time goes on the GPU, beside the engine's replay of it.

A diagnostic, not a calibration: nothing here feeds a profile (attention
timings validate the model, they never tune it). The fa2 kernel, launched
with `stamps=`, records per CTA the global timer at its start, after its K/V
loop and at its end, and its SM (kernels/fa2.py, STAMPED; compiled out
otherwise). The engine replays the same launch in full (fast=False) and its
CTA slices give the same three phases.

  GPU:  PYTHONPATH=. python experiments/fa2_stamps.py measure --out $OUT/fa2_stamps_h100.csv
  CPU:  PYTHONPATH=. python experiments/fa2_stamps.py compare \
            --measured experiments/results/fa2_stamps_h100.csv

`measure` writes one row per (case, CTA) of the last of 3 stamped runs, plus
the kernel's do_bench time with and without stamps; `compare` prints, per
case, the median CTA phases measured and predicted.

  GPU:  PYTHONPATH=. python experiments/fa2_stamps.py lone --out $OUT/fa2_stamps_lone_h100.csv
  CPU:  PYTHONPATH=. python experiments/fa2_stamps.py lone-compare

`lone` runs the N = 16384 non-causal cases (D = 64; D = 128 with 8 warps)
one CTA an SM (a step's chain with nothing to
fill it); `lone-compare` sets those CTAs beside the engine's full simulation
and beside products + the loop's SASS stall clocks.
"""
from __future__ import annotations

import argparse
import csv
import gzip
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from algorithms.problem import AttentionProblem, TileConfig  # noqa: E402
from experiments.validation.suite import HIDDEN, TOKENS  # noqa: E402 (the measured sweep's shapes)
from experiments import gpu_probe  # noqa: E402
# (seqlen, head_dim, causal, block_m, block_n, warps, stages): the measured best
# configs of N = 512 and 16384 shapes (experiments/results/validation_h100.csv)
CASES = [
    (512, 128, False, 128, 64, 8, 3),
    (512, 64, False, 64, 64, 4, 3),
    (512, 128, True, 64, 32, 4, 3),
    (16384, 128, False, 128, 64, 8, 3),
    # two stages against three: measured 13% apart at N = 1024, predicted equal
    (1024, 128, False, 128, 128, 8, 2),
    (1024, 128, False, 128, 128, 8, 3),
    # causal N = 16k, two stages against three (session 26): the fast path
    # timed later CTAs' steps ~25% shorter than the first wave's, the full
    # simulation kept the first wave's; which does the GPU do?
    (16384, 128, True, 128, 64, 8, 2),
    (16384, 128, True, 128, 64, 8, 3),
    (16384, 128, True, 128, 128, 8, 2),
    (16384, 128, True, 128, 128, 8, 3),
    # ... and not causal: every wave starts (nearly) together
    (16384, 128, False, 128, 64, 8, 2),
    # one warpgroup a CTA (4 warps): is the first wave still slower?
    (16384, 128, False, 128, 64, 4, 2),
    (16384, 128, False, 64, 64, 4, 2),
    (16384, 128, True, 128, 64, 4, 2),
    # D = 64, the shapes whose explorer picks lose most (session 27): the
    # measured best (128x64) predicted 7-9% slow, 128x128 with 8 warps and
    # 64x128 predicted 10-16% fast. Does the SM run these configs at one clock?
    (16384, 64, False, 128, 64, 4, 3),
    (16384, 64, False, 128, 64, 8, 3),
    (16384, 64, False, 128, 128, 4, 3),
    (16384, 64, False, 128, 128, 8, 3),
    (16384, 64, False, 64, 128, 4, 3),
    (16384, 64, False, 64, 128, 8, 3),
    (16384, 64, False, 64, 64, 4, 3),
    # D = 128, one CTA an SM whatever the stages (session 28): 128x128 with
    # 8 warps measures 11-17% slower than predicted at three stages and 7-17%
    # faster at two; 128x64's two stages 7-26% faster than predicted
    (16384, 128, False, 128, 128, 8, 3),
    (16384, 128, False, 128, 128, 8, 2),
    # two stages at several 4-warp CTAs an SM (session 28): 64x128 w4 at D64
    # measures 6.20 ms with two stages and 5.56 with three (two CTAs an SM
    # either way); the model, its CTAs out of step, loses nothing
    (16384, 64, False, 64, 128, 4, 2),
    # N = 512 and 2048 at D = 64 (session 39): on h100.measured every config
    # is predicted fast there, 4-warp CTAs most (64x64 w4 s3 causal -26% at N
    # = 512, w8 -19%); are a CTA's steps too fast, or its fixed part?
    (512, 64, True, 64, 64, 4, 3),
    (512, 64, True, 64, 64, 8, 3),
    (512, 64, False, 64, 64, 8, 3),
    (2048, 64, True, 64, 64, 4, 3),
]
FIELDS = ("case", "cta", "sm", "start_ns", "looped_ns", "end_ns", "clock_mhz", "kernel_us",
          "kernel_stamped_us", "gpu", "git_commit", "date", "command")


def case_name(case) -> str:
    n, d, causal, bm, bn, w, s = case
    return f"N{n}_D{d}_c{int(causal)}_{bm}x{bn}w{w}s{s}"


def problem_config(case):
    n, d, causal, bm, bn, w, s = case
    problem = AttentionProblem(batch=TOKENS // n, heads=HIDDEN // d, seqlen_q=n, head_dim=d,
                               causal=causal)
    return problem, TileConfig(block_m=bm, block_n=bn, num_warps=w, num_stages=s)


def stamp_rows(stamps, prov: dict, **fields) -> list[dict]:
    """A CSV row per CTA of the last stamped launch (kernels/fa2.py's STAMP_SLOTS):
    `fields`, its times from the launch's first start, the SM's clock over the
    CTA (clock64 over the global timer: the clock the kernel ran at) and the
    provenance."""
    s = stamps.cpu().tolist()
    t0 = min(r[0] for r in s)
    made = {key: prov.get(key, "") for key in ("gpu", "git_commit", "date", "command")}
    rows = []
    for i, (start, looped, end, sm, start_clk, end_clk) in enumerate(s):
        mhz = (end_clk - start_clk) / (end - start) * 1e3 if end > start else float("nan")
        rows.append({**fields, "cta": i, "sm": sm, "start_ns": start - t0, "looped_ns": looped - t0,
                     "end_ns": end - t0, "clock_mhz": round(mhz, 1), **made})
    return rows


def _stamped_inputs(problem: AttentionProblem, cfg: TileConfig):
    """Random q, k, v for `problem` and the int64 stamps tensor its fa2 launch fills (a row a CTA)."""
    import torch

    from algorithms.problem import cdiv
    from kernels import fa2
    from kernels.common import make_inputs

    q, k, v = make_inputs(problem.batch, problem.heads, problem.seqlen_q, problem.head_dim)
    ctas = cdiv(problem.seqlen_q, cfg.block_m) * problem.batch * problem.heads
    return q, k, v, torch.zeros(ctas, fa2.STAMP_SLOTS, dtype=torch.int64, device="cuda")


def _time_and_stamp(problem: AttentionProblem, cfg: TileConfig, q, k, v, stamps) -> tuple[float, float]:
    """do_bench's ms of the fa2 launch, plain and filling `stamps`, then three
    more stamped launches (`stamps` zeroed before each: the rows hold the
    last's)."""
    import torch
    import triton

    from kernels import fa2

    plain = triton.testing.do_bench(lambda: fa2.forward(q, k, v, causal=problem.causal, config=cfg))
    stamped = triton.testing.do_bench(
        lambda: fa2.forward(q, k, v, causal=problem.causal, config=cfg, stamps=stamps))
    for _ in range(3):
        stamps.zero_()
        fa2.forward(q, k, v, causal=problem.causal, config=cfg, stamps=stamps)
    torch.cuda.synchronize()
    return plain, stamped


def cmd_measure(args) -> int:
    from kernels.provenance import write_csv_atomic

    prov = gpu_probe.start("fa2_stamps.py", args.out, None)
    if prov is None:
        return 2
    rows = []
    for case in selected(args.cases):
        problem, cfg = problem_config(case)
        q, k, v, stamps = _stamped_inputs(problem, cfg)
        ctas = len(stamps)
        plain, stamped = _time_and_stamp(problem, cfg, q, k, v, stamps)
        rows += stamp_rows(stamps, prov, case=case_name(case), kernel_us=round(plain * 1e3, 2),
                           kernel_stamped_us=round(stamped * 1e3, 2))
        print(f"{case_name(case)}: {plain * 1e3:.1f} us ({stamped * 1e3:.1f} us stamped), {ctas} CTAs",
              flush=True)
    write_csv_atomic(args.out, rows, FIELDS)
    print(f"wrote {args.out}")
    return 0


STEP_FIELDS = ("case", "cta", "sm", "start_ns", "looped_ns", "end_ns", "clock_mhz",
               *(f"step{j}_ns" for j in range(16)), "q_ready_ns", "s0_ready_ns", "kernel_us", "kernel_stamped_us",
               "gpu", "git_commit", "date", "command")


def cmd_steps(args) -> int:
    """Each CTA's phases as `measure` stamps them, the global timer as each
    of its first fa2.STEP_STAMPS K/V steps has its row sums (the interval
    between two is a step as the CTA ran it beside its neighbours), and as
    its Q block has arrived; with --s-ready also as its first S = Q Kᵀ block
    exists (its first K block in and the product done; the step's softmax
    waits for the stamp)."""
    import torch

    from kernels import fa2
    from kernels.provenance import write_csv_atomic

    prov = gpu_probe.start("fa2_stamps.py", args.out, None)
    if prov is None:
        return 2
    rows = []
    for case in selected(args.cases):
        problem, cfg = problem_config(case)
        q, k, v, stamps = _stamped_inputs(problem, cfg)
        width = fa2.STAMP_SLOTS + fa2.STEP_STAMPS + (2 if args.s_ready else 1)
        wide = torch.zeros(len(stamps), width, dtype=torch.int64, device="cuda")
        plain, stamped = _time_and_stamp(problem, cfg, q, k, v, wide)
        made = stamp_rows(wide[:, :fa2.STAMP_SLOTS].contiguous(), prov, case=case_name(case),
                          kernel_us=round(plain * 1e3, 2), kernel_stamped_us=round(stamped * 1e3, 2))
        t0 = int(wide[:, 0].min())
        for row, steps in zip(made, wide[:, fa2.STAMP_SLOTS:].cpu().tolist()):
            for j, t in enumerate(steps[:fa2.STEP_STAMPS]):
                row[f"step{j}_ns"] = t - t0 if t else ""
            row["q_ready_ns"] = steps[fa2.STEP_STAMPS] - t0
            row["s0_ready_ns"] = steps[fa2.STEP_STAMPS + 1] - t0 if args.s_ready else ""
        rows += made
        print(f"{case_name(case)}: {plain * 1e3:.1f} us ({stamped * 1e3:.1f} us with step stamps), "
              f"{len(wide)} CTAs", flush=True)
    write_csv_atomic(args.out, rows, STEP_FIELDS)
    print(f"wrote {args.out}")
    return 0


# The lockstep question (session 26): at causal N16k D128 with two stages the
# first wave, 128 CTAs of one head started together, steps ~25% slower than
# every later CTA. Either they wait on L2's bandwidth in bursts (all load at
# once), or on HBM (all stand at the frontier of the head's K/V, so every
# tile they load is a miss). Two heads' Q, K, V and O (32 MB) fit L2 (50 MB):
# launched again without a flush, the first wave's tiles hit; if its steps
# stay slow, the bursts are the cause.
WARMTH_HEADS = 2
WARMTH_CASES = [(16384, 128, True, 128, 64, 8, 2), (16384, 128, True, 128, 64, 8, 3)]
L2_FLUSH_BYTES = 256 << 20


def cmd_warmth(args) -> int:
    import torch

    from kernels import fa2
    from kernels.provenance import write_csv_atomic

    prov = gpu_probe.start("fa2_stamps.py", args.out, None)
    if prov is None:
        return 2
    flush = torch.empty(L2_FLUSH_BYTES, dtype=torch.int8, device="cuda")
    rows = []
    for case in WARMTH_CASES:
        problem, cfg = problem_config(case)
        problem = AttentionProblem(batch=1, heads=WARMTH_HEADS, seqlen_q=problem.seqlen_q,
                                   head_dim=problem.head_dim, causal=problem.causal)
        q, k, v, stamps = _stamped_inputs(problem, cfg)
        for rep in range(3):
            for warm in (False, True):
                if not warm:
                    flush.zero_()
                    torch.cuda.synchronize()
                fa2.forward(q, k, v, causal=True, config=cfg, stamps=stamps)
                torch.cuda.synchronize()
                variant = f"{case_name(case)}_H{WARMTH_HEADS}_{'warm' if warm else 'cold'}"
                made = stamp_rows(stamps, prov, case=variant, rep=rep)
                rows += made
                print(f"{variant} rep {rep}: span {max(r['end_ns'] for r in made) / 1e3:.1f} us", flush=True)
    write_csv_atomic(args.out, rows, ("case", "rep", "cta", "sm", "start_ns", "looped_ns", "end_ns",
                                      "clock_mhz", "gpu", "git_commit", "date", "command"))
    print(f"wrote {args.out}")
    return 0


def selected(names: str | None) -> list:
    """CASES, or those named in a comma-separated list (main checks the names)."""
    if not names:
        return CASES
    by_name = {case_name(c): c for c in CASES}
    return [by_name[n] for n in names.split(",")]


def phases(ctas):
    """Medians (µs) of a CTA's phases from (sm, start, looped, end) in seconds or ns-scaled
    units: start->looped, looped->end, whole CTA, and the gap from a CTA's end to the
    next start on its SM; plus the span of the launch."""
    by_sm: dict = {}
    for sm, start, looped, end in ctas:
        by_sm.setdefault(sm, []).append((start, end))
    gaps = []
    for spans in by_sm.values():
        spans.sort()
        gaps += [b[0] - a[1] for a, b in zip(spans, spans[1:]) if b[0] >= a[1]]
    med = statistics.median
    return {"loop_us": med(lo - st for _, st, lo, _ in ctas),
            "epilogue_us": med(en - lo for _, _, lo, en in ctas),
            "cta_us": med(en - st for _, st, _, en in ctas),
            "gap_us": med(gaps) if gaps else float("nan"),
            "span_us": max(en for *_, en in ctas) - min(st for _, st, _, _ in ctas)}


def per_step_fit(case, durations):
    """(a, b) of a CTA's time = a + b × its K/V steps, least squares over the
    medians of the CTAs of each step count; durations: [(CTA index in launch
    order, µs)]. None where every CTA has the same count (non-causal)."""
    from algorithms.fa2 import locate_q_block

    problem, cfg = problem_config(case)
    by_trips: dict = {}
    for cta, us in durations:
        by_trips.setdefault(locate_q_block(problem, cfg, cta)[5], []).append(us)
    if len(by_trips) < 2:
        return None
    xs = sorted(by_trips)
    ys = [statistics.median(by_trips[x]) for x in xs]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return my - b * mx, b


class _CtaTracer:
    """Engine tracer keeping each CTA's SM, start and end, and its index."""

    max_sms = 10 ** 9

    def __init__(self):
        self.ctas: list = []
        self.index: list = []

    def slice(self, sm, track, label, start, end):
        if track == "ctas" and "#" in label:
            self.ctas.append((sm, start * 1e6, None, end * 1e6))
            self.index.append(int(label.rsplit("#", 1)[1]))


def predicted_phases(case, profile: str):
    """The engine's launch time and CTA phases (full simulation; its CTAs have
    no loop-end mark, so only the whole CTA and the gaps)."""
    import algorithms
    from gpusim.engine import simulate
    from gpusim.profile import load_profile

    problem, cfg = problem_config(case)
    tracer = _CtaTracer()
    result = simulate(algorithms.build("fa2", problem, cfg), load_profile(profile), fast=False,
                      tracer=tracer)
    ctas = [(sm, start, start, end) for sm, start, _, end in tracer.ctas]
    fit = per_step_fit(case, [(i, end - start) for i, (_, start, _, end) in zip(tracer.index, tracer.ctas)])
    return result.runtime_s * 1e6, phases(ctas), fit


class _CopyTracer(_CtaTracer):
    """_CtaTracer that also keeps, per CTA, when its first role issued each K
    copy, when its first K copy arrived and when its Q block arrived (the
    engine's tracer calls load() per load)."""

    def __init__(self):
        super().__init__()
        self.k_issued: dict = {}    # CTA -> issue times (s) of its K copies, in order
        self.k_arrived: dict = {}   # CTA -> when its (first role's part of its) first K block arrived (s)
        self.q_arrived: dict = {}   # CTA -> when its (first role's) Q block arrived (s)

    def load(self, sm, cta, tile, issued, arrived):
        if tile.tensor == "K" and tile.col == 0:     # (the first role's part: fa2.part)
            self.k_issued.setdefault(cta, []).append(issued)
            self.k_arrived.setdefault(cta, arrived)
        elif tile.tensor == "Q":
            self.q_arrived.setdefault(cta, arrived)


def step_periods(times: list, first: int = 0) -> dict:
    """{position: [interval]} between consecutive entries of each CTA's list of
    times, from its entry `first` on (position 1 is the first interval)."""
    out: dict = {}
    for seq in times:
        seq = seq[first:]
        for j, (a, b) in enumerate(zip(seq, seq[1:]), start=1):
            out.setdefault(j, []).append(b - a)
    return out


def _state(cta: dict, t: float):
    """What a CTA is doing at time t: waiting for its Q block ("preQ"), in its
    first step ("first": Q in, its first K/V wait and step; from its start
    where its Q block's arrival was not stamped), in its later steps
    ("loop"), after them ("epi"), or not on its SM (None)."""
    if t < cta["start"] or t >= cta["end"]:
        return None
    if cta["q"] is not None and t < cta["q"]:
        return "preQ"
    if t < cta["steps"][0]:
        return "first"
    return "loop" if t < cta["looped"] else "epi"


def steps_by_neighbours(ctas: list[dict]) -> dict:
    """{(what the SM's other CTAs are doing, as sorted (state, count) pairs):
    [cycles]} of every step (between two step ends) of every CTA, each by
    the state of its SM's other CTAs at the step's middle. A CTA is a dict
    of sm, start, q, steps (its step ends), looped, end (one time unit) and
    cycles (cycles a time unit)."""
    by_sm: dict = {}
    for c in ctas:
        by_sm.setdefault(c["sm"], []).append(c)
    out: dict = {}
    for c in ctas:
        for a, b in zip(c["steps"], c["steps"][1:]):
            states: dict = {}
            for other in by_sm[c["sm"]]:
                state = _state(other, (a + b) / 2) if other is not c else None
                if state is not None:
                    states[state] = states.get(state, 0) + 1
            out.setdefault(tuple(sorted(states.items())), []).append((b - a) * c["cycles"])
    return out


def _measured_ctas(rows: list[dict]) -> list[dict]:
    """steps_by_neighbours' CTAs from a `steps` file's rows of one case (ns;
    cycles at each CTA's own clock), with `q` and `s0` where the run stamped
    them (Q from session 44's second run on, S from session 45's)."""
    out = []
    for r in rows:
        steps = [int(r[f"step{j}_ns"]) for j in range(16) if r[f"step{j}_ns"]]
        if steps:
            out.append({"sm": int(r["sm"]), "start": int(r["start_ns"]),
                        "q": int(r["q_ready_ns"]) if r.get("q_ready_ns") else None,
                        "s0": int(r["s0_ready_ns"]) if r.get("s0_ready_ns") else None, "steps": steps,
                        "looped": int(r["looped_ns"]), "end": int(r["end_ns"]),
                        "cycles": float(r["clock_mhz"]) / 1e3})
    return out


def _engine_ctas(tracer: _CopyTracer, stages: int, setup_s: float, clock_hz: float) -> list[dict]:
    """The same from the engine's full simulation (s): its code starts `setup_s`
    after its slot is taken, a step ends as the CTA issues the copy for the
    step stages - 1 on, and its loop ends stages - 1 median steps after its
    last copy (no copy marks the last steps' ends)."""
    out = []
    for index, (sm, start, _, end) in zip(tracer.index, tracer.ctas):
        steps = tracer.k_issued.get(index, [])[stages - 1:]
        if not steps or index not in tracer.q_arrived:
            continue
        step = statistics.median(b - a for a, b in zip(steps, steps[1:])) if len(steps) > 1 else 0.0
        out.append({"sm": sm, "start": start / 1e6 + setup_s, "q": tracer.q_arrived[index],
                    "k": tracer.k_arrived[index], "steps": steps, "looped": steps[-1] + (stages - 1) * step,
                    "end": end / 1e6, "cycles": clock_hz})
    return out


def cmd_steps_compare(args) -> int:
    """Per case: a CTA's code start to its Q block's arrival, its first S
    block's existence (GPU, where the run stamped it) or first K block's
    arrival (engine), and its first step's end, GPU and engine (full
    simulation); the median step (cycles) at each of a CTA's
    first positions, GPU (step stamps, at the CTA's own clock) and engine
    (intervals between its K copies, each issued as a step ends); and the
    median step by what the SM's other CTAs were doing (steps_by_neighbours)."""
    try:
        opener = gzip.open if args.measured.endswith(".gz") else open
        with opener(args.measured, "rt") as f:
            rows = list(csv.DictReader(f))
        by_case: dict = {}
        for r in rows:
            by_case.setdefault(r["case"], []).append(r)
        measured_ctas = {name: _measured_ctas(case_rows) for name, case_rows in by_case.items()}
    except (OSError, KeyError, ValueError) as e:
        print(f"fa2_stamps steps-compare: cannot read {args.measured}: {e}", file=sys.stderr)
        return 2
    import algorithms
    from gpusim.engine import simulate
    from gpusim.profile import load_profile

    gpu = load_profile(args.profile)
    med = statistics.median
    for case in selected(args.cases):
        name = case_name(case)
        if not measured_ctas.get(name):
            continue
        problem, cfg = problem_config(case)
        tracer = _CopyTracer()
        simulate(algorithms.build("fa2", problem, cfg), gpu, fast=False, tracer=tracer)
        # the engine's CTA slice starts as its slot is taken: its code starts after
        # its warps' launch and the CTA's turnover (at least; the SM may launch
        # another CTA's warps first)
        setup = (gpu.launch.warp_dispatch_cycles * cfg.num_warps + gpu.launch.cta_turnover_cycles) / gpu.clock_hz
        sides = {"GPU": (measured_ctas[name], 1e3), "engine": (_engine_ctas(tracer, cfg.num_stages, setup,
                                                                             gpu.clock_hz), 1e-6)}
        print(f"{name}: from a CTA's code start, µs, GPU | engine")
        for what, keys in (("Q block in", ("q", "q")), ("first S | K in", ("s0", "k"))):
            if all(c[keys[0]] is not None for c in sides["GPU"][0]):
                print(f"  {what:<17}" + " | ".join(f"{med((c[key] - c['start']) / unit for c in ctas):.2f}"
                                                   for key, (ctas, unit) in zip(keys, sides.values())))
        print(f"  {'first step ends':<17}" + " | ".join(f"{med((c['steps'][0] - c['start']) / unit for c in ctas):.2f}"
                                                     for ctas, unit in sides.values()))
        periods = {side: step_periods([[t * c["cycles"] for t in c["steps"]] for c in ctas])
                   for side, (ctas, _) in sides.items()}
        shown = [j for j in range(1, 16) if all(p.get(j) for p in periods.values())]
        print("  position " + " ".join(f"{j:>5}" for j in shown))
        for side, p in periods.items():
            print(f"  {side:<9}" + " ".join(f"{med(p[j]):5.0f}" for j in shown))
        by_state = {side: steps_by_neighbours(ctas) for side, (ctas, _) in sides.items()}
        print("  a step's median cycles (steps) by what the SM's other CTAs do, GPU | engine")
        for state in sorted(by_state["GPU"], key=lambda k: -len(by_state["GPU"][k]))[:6]:
            label = ", ".join(f"{n} {s}" for s, n in state) or "none"
            cells = [f"{med(v):5.0f} ({len(v)})" if (v := by_state[side].get(state)) else "    -"
                     for side in sides]
            print(f"    {label:<18} " + " | ".join(cells))
        sys.stdout.flush()
    return 0


# One CTA an SM (session 27): each config of the D = 64 cases alone on its SM,
# one head of 128 CTAs (N = 16384 at block_m 128, 8192 at 64), so a step's
# time is the chain of one CTA's warps with no other CTA to fill the SM.
# Set beside the SASS (the loop's stall clocks) and the products, on the CPU.
# Session 28 added D = 128's 8-warp configs (one CTA an SM in the sweep too:
# alone, their K/V tiles have L2 to themselves).
LONE_CASES = [c for c in CASES if not c[2] and c[0] == 16384 and ((c[1] == 64 and c[6] == 3) or c[5] == 8)]
LONE_CTAS = 128


def lone_problem(case) -> tuple[AttentionProblem, TileConfig]:
    _, d, causal, bm, bn, w, s = case
    return (AttentionProblem(batch=1, heads=1, seqlen_q=LONE_CTAS * bm, head_dim=d, causal=causal),
            TileConfig(block_m=bm, block_n=bn, num_warps=w, num_stages=s))


def cmd_lone(args) -> int:
    import torch

    from kernels import fa2
    from kernels.provenance import write_csv_atomic

    prov = gpu_probe.start("fa2_stamps.py", args.out, None)
    if prov is None:
        return 2
    rows = []
    for case in lone_selected(args.cases):
        problem, cfg = lone_problem(case)
        q, k, v, stamps = _stamped_inputs(problem, cfg)
        steps = problem.seqlen_kv // cfg.block_n
        for rep in range(3):
            fa2.forward(q, k, v, causal=False, config=cfg, stamps=stamps)
            torch.cuda.synchronize()
            rows += stamp_rows(stamps, prov, case=f"lone_{case_name(case)}", rep=rep, steps=steps)
        last = rows[-LONE_CTAS:]
        loop_ns = statistics.median(r["looped_ns"] - r["start_ns"] for r in last)
        mhz = statistics.median(r["clock_mhz"] for r in last)
        print(f"lone {case_name(case)}: {len({r['sm'] for r in last})} SMs, loop {loop_ns / 1e3:.1f} us, "
              f"{loop_ns / steps:.0f} ns = {loop_ns / steps * mhz / 1e3:.0f} cycles a step at {mhz:.0f} MHz",
              flush=True)
    write_csv_atomic(args.out, rows, ("case", "rep", "steps", "cta", "sm", "start_ns", "looped_ns", "end_ns",
                                      "clock_mhz", "gpu", "git_commit", "date", "command"))
    print(f"wrote {args.out}")
    return 0


def lone_selected(names: str | None) -> list:
    """LONE_CASES, or those of them named in a comma-separated list."""
    wanted = set(names.split(",")) if names else None
    return [c for c in LONE_CASES if wanted is None or case_name(c) in wanted]


def lone_measured(path: str) -> dict:
    """{case name: (median CTA µs, K/V steps, median SM clock MHz)} of the
    last rep of each case in a `lone` CSV."""
    by_case: dict = {}
    with open(path) as f:
        for r in csv.DictReader(f):
            by_case.setdefault(r["case"], {}).setdefault(int(r["rep"]), []).append(
                (int(r["end_ns"]) - int(r["start_ns"]), int(r["steps"]), float(r["clock_mhz"])))
    out = {}
    for name, reps in by_case.items():
        last = reps[max(reps)]
        out[name] = (statistics.median(d for d, _, _ in last) / 1e3, last[0][1],
                     statistics.median(c for _, _, c in last))
    return out


def sass_chain_cycles(case) -> float | None:
    """A step of one CTA alone as its SASS and the tensor pipe would have it:
    its products at the tl.dot loop's rate (calibrate.py wgmma, ~4074 flop a
    clock an SM, as h100.measured has it) plus the stall clocks ptxas scheduled into a trip of the loop
    (kernels/sass.py tensor_loop_parts: the least time one warp takes, its
    variable-latency waits aside). None without the SASS."""
    from algorithms.fa2 import warpgroup_replicas
    from gpusim.profile import load_profile
    from kernels.fa2 import compiled_resources

    problem, cfg = lone_problem(case)
    parts = compiled_resources(problem, cfg).get("loop_parts") or []
    if not parts:
        return None
    # the tl.dot loop's rate a clock: h100.measured takes it from calibrate.py's
    # wgmma rows (885.8 TFLOP/s at the 1647 MHz read in the kernel)
    gpu = load_profile("h100.measured")
    flop_per_clk = gpu.matmul_flops_per_s_per_sm("wgmma", "bf16") / gpu.clock_hz
    # Q Kᵀ (computed once per replica: 64-row CTAs with two warpgroups compute S twice) and P V
    flops = 2 * cfg.block_m * cfg.block_n * problem.head_dim * (warpgroup_replicas(cfg) + 1)
    return flops / flop_per_clk + parts[0]["stall_clocks"]


def cmd_lone_compare(args) -> int:
    try:
        measured = lone_measured(args.measured)
    except (OSError, KeyError, ValueError) as e:
        print(f"fa2_stamps lone-compare: cannot read {args.measured}: {e}", file=sys.stderr)
        return 2
    from gpusim import predict

    profiles = args.profiles.split(",")
    print("| config (one CTA an SM) | CTA µs meas | " + " | ".join(f"engine `{p}`" for p in profiles)
          + " | step cycles meas | products + SASS stall clocks |")
    print("|---|---|" + "---|" * len(profiles) + "---|---|")
    for case in lone_selected(args.cases):
        name = f"lone_{case_name(case)}"
        if name not in measured:
            continue
        cta_us, steps, mhz = measured[name]
        problem, cfg = lone_problem(case)
        cells = []
        for profile in profiles:
            us = predict(problem, cfg, profile, fast=False).runtime_us
            cells.append(f"{us:.1f} ({us / cta_us - 1:+.1%})")
        chain = sass_chain_cycles(case)
        print(f"| {case_name(case)} | {cta_us:.1f} | " + " | ".join(cells)
              + f" | {cta_us * 1e3 / steps * mhz / 1e3:.0f} | " + (f"{chain:.0f} |" if chain else "– |"), flush=True)
    return 0


def cmd_compare(args) -> int:
    by_case: dict = {}
    durations: dict = {}    # case -> [(CTA index, µs)]
    kernel: dict = {}
    clocks: dict = {}       # case -> the SM clock over each CTA (rows from session 12 on)
    try:
        # (a .csv.gz as written when a CSV was too large to bring back from the GPU machine)
        opener = gzip.open if args.measured.endswith(".gz") else open
        with opener(args.measured, "rt") as f:
            for r in csv.DictReader(f):
                by_case.setdefault(r["case"], []).append(
                    (int(r["sm"]), int(r["start_ns"]) / 1e3, int(r["looped_ns"]) / 1e3, int(r["end_ns"]) / 1e3))
                durations.setdefault(r["case"], []).append(
                    (int(r["cta"]), (int(r["end_ns"]) - int(r["start_ns"])) / 1e3))
                kernel[r["case"]] = (float(r["kernel_us"]), float(r["kernel_stamped_us"]))
                if r.get("clock_mhz"):
                    clocks.setdefault(r["case"], []).append(float(r["clock_mhz"]))
    except (OSError, KeyError, ValueError) as e:
        print(f"fa2_stamps compare: cannot read {args.measured}: {e}", file=sys.stderr)
        return 2
    from gpusim.profile import load_profile

    profile_mhz = load_profile(args.profile).clock_hz / 1e6
    print(f"| case | kernel µs (stamped) | engine µs | CTA µs meas / pred | start→loop end (meas) "
          f"| loop end→CTA end (meas) | gap to next CTA on the SM meas / pred | span µs meas / pred "
          f"| SM clock MHz meas (profile {profile_mhz:.0f}) | CTA kcycles meas / pred "
          f"| CTA µs = a + b × its K/V steps, meas / pred |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for case in selected(args.cases):
        name = case_name(case)
        if name not in by_case:
            continue
        m = phases(by_case[name])
        runtime, p, fit = predicted_phases(case, args.profile)
        measured_fit = per_step_fit(case, durations[name])
        fits = (f"{measured_fit[0]:.2f} + {measured_fit[1]:.3f} b / {fit[0]:.2f} + {fit[1]:.3f} b"
                if measured_fit and fit else "–")
        print(f"| {name} | {kernel[name][0]:.1f} ({kernel[name][1]:.1f}) | {runtime:.1f} | "
              f"{m['cta_us']:.2f} / {p['cta_us']:.2f} | {m['loop_us']:.2f} | {m['epilogue_us']:.2f} | "
              f"{m['gap_us']:.2f} / {p['gap_us']:.2f} | {m['span_us']:.1f} / {p['span_us']:.1f} | "
              + (f"{statistics.median(clocks[name]):.0f} | {m['cta_us'] * statistics.median(clocks[name]) / 1e3:.1f}"
                 f" / {p['cta_us'] * profile_mhz / 1e3:.1f} |" if name in clocks else "– | – |")
              + f" {fits} |", flush=True)
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("measure", help="GPU: stamp every CTA of the cases")
    p.add_argument("--out", default="experiments/results/fa2_stamps_h100.csv")
    p.add_argument("--cases", help="comma-separated case names (default: all)")
    p.set_defaults(func=cmd_measure)
    p = sub.add_parser("steps", help="GPU: stamp every CTA of the cases and its first 16 K/V steps")
    p.add_argument("--out", default="experiments/results/fa2_stamps_steps_q_h100.csv")
    p.add_argument("--cases", help="comma-separated case names (default: all)")
    p.add_argument("--s-ready", action="store_true",
                   help="also stamp as each CTA's first S = Q Kᵀ block exists (column s0_ready_ns)")
    p.set_defaults(func=cmd_steps)
    p = sub.add_parser("steps-compare", help="CPU: the GPU's steps (step stamps) beside the engine's, "
                                             "cycles at each of a CTA's first positions")
    p.add_argument("--measured", default="experiments/results/fa2_stamps_steps_q_h100.csv.gz")
    p.add_argument("--profile", default="h100.measured")
    p.add_argument("--cases", help="comma-separated case names (default: all)")
    p.set_defaults(func=cmd_steps_compare)
    p = sub.add_parser("warmth", help="GPU: the first wave's steps with the K/V in L2 or not")
    p.add_argument("--out", default="experiments/results/fa2_stamps_warmth_h100.csv")
    p.set_defaults(func=cmd_warmth, cases=None)
    p = sub.add_parser("lone", help="GPU: the N = 16384 non-causal cases (D = 64, and D = 128 with 8 warps) "
                                    "one CTA an SM (a step's chain alone)")
    p.add_argument("--out", default="experiments/results/fa2_stamps_lone_h100.csv")
    p.add_argument("--cases", help="comma-separated case names (default: every lone case)")
    p.set_defaults(func=cmd_lone)
    p = sub.add_parser("lone-compare", help="CPU: the lone CTAs beside the engine's full simulation")
    p.add_argument("--measured", default="experiments/results/fa2_stamps_lone_h100.csv")
    p.add_argument("--profiles", default="h100,h100.measured")
    p.add_argument("--cases", help="comma-separated case names (default: every lone case)")
    p.set_defaults(func=cmd_lone_compare)
    p = sub.add_parser("compare", help="CPU: measured CTA phases beside the engine's")
    p.add_argument("--measured", default="experiments/results/fa2_stamps_h100.csv")
    p.add_argument("--profile", default="h100")
    p.add_argument("--cases", help="comma-separated case names (default: all)")
    p.set_defaults(func=cmd_compare)
    args = ap.parse_args(argv)
    known = [case_name(c) for c in (LONE_CASES if args.cmd.startswith("lone") else CASES)]
    unknown = [n for n in (args.cases or "").split(",") if n and n not in known]
    if unknown:
        print(f"fa2_stamps: unknown case {', '.join(unknown)} for {args.cmd}; cases: {', '.join(known)}",
              file=sys.stderr)
        return 2
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
