"""Do CTAs on one SM take its units in turn or share them? A CPU diagnostic.

The engine serves an SM's tensor pipe, issue slots and MUFU in arrival order
(gpusim/engine/servers.Server), and stands for what that order misses with
one measured number, the serial fraction (a step's softmax keeps the tensor
pipe idle for that share of its work; h100.measured: 0.52). This replays
calibrate.py's held dot_chain rows (one flash step's chain on operands held
on chip, 1, 2 and 4 CTAs an SM; calibration_h100.csv) in a small model of
one SM under six rules, the chain's latency taken for each rule and shape
from its one-CTA row (where no two CTAs meet), and sets the phases its CTAs
keep against those calibrate.py dot_chain_sm_phase stamped on the H100 and
those the engine's own full simulation settles into:

- `in order + f`: the engine's composition: units in arrival order, the
  softmax's other instructions then its exp2s then the latency, and the
  profile's serial fraction blocking the tensor pipe from the start of each
  (core.Engine._alu/_exp). Its two CTAs settle where the engine's full
  simulation puts them (0.29-0.50 of a period, five of six shapes to the
  hundredth; until session 43 it charged the block as each phase ended,
  which put them 0.44-0.50 apart);
- `in order`: units in arrival order, no serial fraction, a softmax lasting
  its latency or its work on the issue slots and the MUFU, the longer;
- `shared`: the same, the units shared equally by the warpgroups using them
  (processor sharing, as servers.SharedServer shares L2 and HBM); CTAs that
  start together stay together;
- `shared, staggered`: shared units, CTA c starting c S-products after the
  first, where serving the CTAs' first products in turn would put them.
  Shared units keep whatever offset CTAs start with; units in order push
  them apart (0.29-0.50 of a period here). The H100 does neither: it pulls
  two CTAs into one of a few stable offsets, mostly 0.11-0.18
  (validation_notes.md, session 42);
- `tensor shared + f`: the engine's composition, but the tensor pipe shared
  by the warpgroups with a product in it (as it interleaves two warpgroups
  of one CTA, session 27's dot_chain_phase; the engine does that within a
  CTA only, Mma.issued_with), the serial fraction's block one more sharer:
  two CTAs 0.35-0.50 apart, its steps those of `in order + f` within 1.1%;
- `tensor shared + f after`: the same, the block charged as each phase
  ends. Two CTAs settle 0.10-0.21 of a period apart whatever offset they
  start with, as the H100's do, but for 64x128x64 w4 (0.17; the H100 0.42
  in one build, 0.20 in the other); its 4-warp steps at two CTAs an SM are
  7-17% slower than in order. The match rests on that timing, and the
  H100 says otherwise: calibrate.py dot_exp_timing (session 43) slows a
  product CTA's products 8% while an exp2 or FMA burst runs beside it on
  its SM and 1% in the window as long right after. The softmax holds the
  pipe while it works, as the engine charges it; what settles the H100's
  CTAs near each other is still to be found.

A launch of more CTAs an SM than the SM holds (registers, SMEM) runs in
waves of what it holds, as the bench's did. Only rates and the compiled
loops' instruction counts go in (the profile's and dot_chain_loops_sm90.csv);
nothing is fitted to the rows of 2 or more CTAs an SM whose errors and phases
it prints. A diagnostic only: no profile number comes from it.

    PYTHONPATH=. python experiments/unit_sharing.py [--profile h100.measured] [--shapes 64x64x64w4,...]
    PYTHONPATH=. python experiments/unit_sharing.py --pairs    # calibrate.py dot_pair_timing in the engine

--pairs replays calibrate.py's dot_pair_timing rows (products alone, one CTA
on the last, at 1, 2 and 4 CTAs an SM) in the engine's full simulation
(pair_timing): does its tensor pipe take several CTAs' products in turn, as
the H100's does?
"""
from __future__ import annotations

import argparse
import os
import re
import statistics
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import simpy  # noqa: E402

from algorithms.errors import GpusimError  # noqa: E402
from experiments.calibration.rows import bench_values  # noqa: E402
from experiments.step_errors import BENCHES, CSV, chain_rows, resident  # noqa: E402

RULES = ("in order + f", "in order", "shared", "shared, staggered", "tensor shared + f",
         "tensor shared + f after")
# the second CTA of an SM started this many cycles late (calibrate.py
# dot_chain_sm_phase's stagger_start): does a rule keep the offset? (compare
# and report give each + f rule's phases after such starts)
DELAYS = (150, 300, 600, 900)
STEPS = 48              # a CTA's steps simulated; periods over the last two thirds, phases the last third
LATENCY_SEARCH = 4000.0  # cycles: the chain latencies searched for (the rows need at most ~2500)


class InOrder:
    """A unit serving requests in arrival order, as the engine's Server."""

    def __init__(self, env):
        self.env, self.free_at = env, 0.0

    def request(self, work: float, source):
        now = self.env.now
        self.free_at = max(now, self.free_at) + work
        return self.env.timeout(self.free_at - now)


class Shared:
    """A unit shared equally by the sources using it (servers.SharedServer)."""

    def __init__(self, env):
        from gpusim.engine.servers import SharedServer
        self.env, self.server = env, SharedServer("unit", env)

    def request(self, work: float, source):
        done = self.env.event()
        self.server.request(self.env.now, work, lambda t: done.succeed(), source)
        return done


def step_work(gpu, bm: int, bn: int, d: int, warps: int) -> dict:
    """A warpgroup's share of one chain step, in cycles of each unit, as
    fa2's step_ops builds it (the issued instructions from the compiled loop)."""
    from algorithms.fa2 import step_ops, warpgroup_replicas
    from algorithms.ops import Alu, Exp, Mma
    from algorithms.problem import TileConfig
    from experiments.calibration.cross_compile import dot_chain_loop

    roles = warps // 4
    reps = warpgroup_replicas(TileConfig(block_m=bm, block_n=bn, num_warps=warps, num_stages=1))
    issued = dot_chain_loop(bm, bn, d, warps)["issue"] * 4 * 32
    ops = step_ops("bf16", "wgmma", bm * reps // roles, bn, d, reps, issued=issued, warpgroups=roles)
    clock = gpu.clock_hz
    tensor = gpu.matmul_flops_per_s_per_sm("wgmma", "bf16") / clock
    smem = gpu.units.smem_bytes_per_clk_per_sm
    products = [max(op.flops / tensor,
                    op.count * gpu.wgmma_operand_bytes(op.m, op.n, op.k, 2, op.a_in_smem, op.instr_n) / smem)
                for op in ops if isinstance(op, Mma)]
    alu = sum(op.flops for op in ops if isinstance(op, Alu)) / gpu.units.alu_ops_per_clk_per_sm
    exp = sum(op.count for op in ops if isinstance(op, Exp)) / gpu.units.exp2_per_clk_per_sm
    return {"qk": products[0], "pv": products[1], "alu": alu, "exp": exp, "roles": roles,
            "f": gpu.units.tensor_alu_serial_fraction}


def simulate(work: dict, ctas: int, latency: float, rule: str, steps: int = STEPS,
             delay: float = 0.0) -> tuple[dict, dict]:
    """`ctas` CTAs on one SM running the chain under `rule`, CTA c started c x
    `delay` cycles late: ({(cta, role): when each step ended}, {cta: when its
    first warpgroup's S of each step was in, as calibrate.py
    dot_chain_sm_phase stamps it})."""
    env = simpy.Environment()
    unit = Shared if rule.startswith("shared") else InOrder
    tensor, alu, mufu = (Shared(env) if rule.startswith("tensor shared") else unit(env)), unit(env), unit(env)
    roles, f = work["roles"], work["f"]
    stagger = work["qk"] if rule == "shared, staggered" else delay
    ends: dict = {}
    s_in: dict = {}
    # the CTA's roles meet at a barrier every step, as fa2's warpgroups do
    arrived = {c: [0] * steps for c in range(ctas)}
    gates = {c: [env.event() for _ in range(steps)] for c in range(ctas)}

    def role(c: int, r: int):
        if c and stagger:
            yield env.timeout(c * stagger)
        source, pv = (c, r), None
        for i in range(steps):
            arrived[c][i] += 1
            if arrived[c][i] == roles:
                gates[c][i].succeed()
            yield gates[c][i]
            yield tensor.request(work["qk"], source)
            if pv is not None and not pv.processed:
                yield pv                        # the wait for S also waits for the last P V
            if r == 0:
                s_in.setdefault(c, []).append(env.now)
            if "+ f" in rule:
                after = rule.endswith("after")
                for server, phase in ((alu, work["alu"]), (mufu, work["exp"])):
                    if not after:
                        tensor.request(f * phase, None)
                    yield server.request(phase, source)
                    if after:
                        tensor.request(f * phase, None)
                if latency > 0.0:
                    yield env.timeout(latency)
            else:
                yield env.all_of([env.timeout(latency), alu.request(work["alu"], source),
                                  mufu.request(work["exp"], source)])
            pv = tensor.request(work["pv"], source)     # left running
            ends.setdefault(source, []).append(env.now)

    for c in range(ctas):
        for r in range(roles):
            env.process(role(c, r))
    env.run()
    return ends, s_in


def period(work: dict, ctas: int, latency: float, rule: str, steps: int = STEPS) -> float:
    """Cycles a step of each of `ctas` CTAs side by side on an SM under `rule`."""
    ends, _ = simulate(work, ctas, latency, rule, steps)
    first = steps // 3
    return statistics.mean((t[-1] - t[first]) / (len(t) - 1 - first) for t in ends.values())


def phase_apart(work: dict, ctas: int, latency: float, rule: str, steps: int = STEPS,
                delay: float = 0.0) -> float:
    """How far apart in phase `ctas` CTAs side by side take their steps
    under `rule`, CTA c started c x `delay` cycles late, as
    dot_chain_sm_phase measures it on the GPU (co_resident_phases, median
    over pairs: 0 in step, 0.5 furthest)."""
    from experiments.calibration.compute_benches import co_resident_phases
    _, s_in = simulate(work, ctas, latency, rule, steps, delay)
    shares, _ = co_resident_phases([s_in[c][-(steps // 3):] for c in range(ctas)], [0] * ctas)
    return statistics.median(shares)


def chain_latency(work: dict, measured_one: float, rule: str) -> float:
    """The chain latency with which one CTA alone takes its measured cycles (bisection)."""
    lo, hi = 0.0, LATENCY_SEARCH
    if period(work, 1, lo, rule) >= measured_one:
        return 0.0
    for _ in range(30):
        mid = (lo + hi) / 2
        if period(work, 1, mid, rule) < measured_one:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def launch_step(work: dict, per_sm: int, held: int, latency: float, rule: str) -> float:
    """Cycles a step of a launch of `per_sm` CTAs an SM of which the SM holds
    `held` at once: its waves one after the other (the bench's time a step is
    the launch's), each running its CTAs side by side."""
    full, rest = divmod(per_sm, held)
    return full * period(work, held, latency, rule) + (period(work, rest, latency, rule) if rest else 0.0)


ENGINE_STEPS = 96      # the engine's full simulation of a launch: steps a CTA (phases over the last third)


def engine_phase(gpu, bm: int, bn: int, d: int, warps: int, regs: int, smem: int, per_sm: int) -> float:
    """How far apart in phase the engine itself settles `per_sm` CTAs side by
    side: its full simulation of the bench's launch (step_errors.chain_schedule,
    ENGINE_STEPS steps), the times SM 0's CTAs start their first warpgroup's
    softmax (its Alu: S is in), read by wrapping the engine's Alu handler
    while it runs; co_resident_phases' median."""
    from experiments.calibration.compute_benches import co_resident_phases
    from experiments.step_errors import chain_schedule

    starts = stamped_simulation(chain_schedule(bm, bn, d, warps, gpu.gpu.sm_count * per_sm, regs, smem,
                                               iterations=ENGINE_STEPS), gpu, "_alu_fast",
                                lambda engine, role, event: engine.env._now if role.index == 0 else None)
    shares, _ = co_resident_phases([t[-(ENGINE_STEPS // 3):] for t in starts], [0] * len(starts))
    return statistics.median(shares)


def stamped_simulation(schedule, gpu, handler: str, stamp) -> list[list[float]]:
    """The engine's full simulation of `schedule` with core.Engine's op
    handler `handler` wrapped: at every call by a CTA of SM 0,
    stamp(engine, role, the event the handler returned) gives a time in
    seconds, or None for none. Returns each such CTA's stamps, in cycles."""
    import gpusim.engine.core as core
    from gpusim.engine import simulate

    stamps: dict = {}
    original = getattr(core.Engine, handler)

    def stamped(engine, op, role, cta):
        event = original(engine, op, role, cta)
        if cta.sm.index == 0:
            t = stamp(engine, role, event)
            if t is not None:
                stamps.setdefault(id(cta), []).append(t * gpu.clock_hz)
        return event

    setattr(core.Engine, handler, stamped)
    try:
        simulate(schedule, gpu, fast=False)
    finally:
        setattr(core.Engine, handler, original)
    return list(stamps.values())


def measured_phases(path: str = CSV) -> dict:
    """{(block_m, block_n, D, warps, CTAs an SM): phase apart} of calibrate.py's
    dot_chain_sm_phase rows of held operands (H100)."""
    out = {}
    for param, value in bench_values("dot_chain_sm_phase", path).items():
        m = re.fullmatch(r"(\d+)x(\d+)x(\d+)_w(\d+)_x(\d+)", param)
        if m is not None:       # (the held rows; streamed ones end in their kind)
            out[tuple(map(int, m.groups()))] = value
    return out


def compare(gpu, shapes=None) -> list[dict]:
    """Per held dot_chain shape (all, or `shapes` as (bm, bn, d, warps)):
    the measured cycles at 1, 2, 4 CTAs an SM, how many the SM holds at once,
    each rule's cycles, and where the H100's phases were stamped, the
    measured and each rule's phase apart."""
    measured: dict = {}
    held: dict = {}
    sizes: dict = {}
    for bench in BENCHES:
        for bm, bn, d, warps, per_sm, regs, smem, cycles in chain_rows(bench):
            measured.setdefault((bm, bn, d, warps), {})[per_sm] = cycles
            held[bm, bn, d, warps] = resident(gpu, bm, bn, d, warps, regs, smem)
            sizes[bm, bn, d, warps] = (regs, smem)
    phases = measured_phases()
    out = []
    for shape in sorted(measured) if shapes is None else shapes:
        if shape not in measured:
            raise GpusimError(f"no held dot_chain row for {shape[0]}x{shape[1]}x{shape[2]} with {shape[3]} warps; "
                              f"the rows have {', '.join(f'{a}x{b}x{c}w{w}' for a, b, c, w in sorted(measured))}")
        rows = measured[shape]
        work = step_work(gpu, *shape)
        stamped = {k[4]: v for k, v in phases.items() if k[:4] == shape and k[4] <= held[shape]}
        row = {"shape": shape, "measured": rows, "held": held[shape], "phase": {"measured": stamped}}
        for rule in RULES:
            latency = chain_latency(work, rows[1], rule)
            row[rule] = {per_sm: launch_step(work, per_sm, held[shape], latency, rule) for per_sm in rows}
            row["phase"][rule] = {n: phase_apart(work, n, latency, rule) for n in stamped}
            if "+ f" in rule and 2 in stamped:
                row["phase"].setdefault("delayed", {})[rule] = {
                    d: phase_apart(work, 2, latency, rule, delay=d) for d in DELAYS}
        row["phase"]["engine"] = {n: engine_phase(gpu, *shape, *sizes[shape], n) for n in stamped}
        out.append(row)
    return out


PAIR_ITERATIONS = 64    # a CTA's products in the engine's replay (intervals over the middle half)


def pair_timing(gpu, path: str = CSV) -> list[dict]:
    """calibrate.py dot_pair_timing's rows beside the engine: per product
    shape, the loop's products (async wgmma, waited for at once) and the
    rest of its trip as a wait of its own (the one-CTA row less the engine's
    product alone), at 1, 2 and 4 CTAs an SM, full simulation. Per shape and
    count: {'shape', 'n', 'gpu', 'engine' (a CTA's product interval, clk),
    'gpu_phase', 'engine_phase' (two or more CTAs an SM; co_resident_phases)}."""
    from algorithms.ops import IssueStalls, Loop, Mma, MmaWait
    from algorithms.problem import AttentionProblem
    from algorithms.schedule import CtaProgram, Launch, Role, Schedule
    from experiments.calibration.compute_benches import PAIR_PER_SM, PAIR_SHAPES, co_resident_phases

    measured = bench_values("dot_pair_timing", path)
    out = []
    for bm, bn, bk, warps in PAIR_SHAPES:
        name = f"{bm}x{bn}x{bk}_w{warps}"
        if f"{name}_x1" not in measured:
            raise GpusimError(f"{path} has no dot_pair_timing row {name}_x1: run calibrate.py dot_pair_timing")
        mma = Mma(bm, bn, bk, "bf16", "wgmma", is_async=True)

        def run(per_sm: int, rest_cycles: float) -> tuple[float, float | None]:
            body = (mma, MmaWait(0), IssueStalls(rest_cycles))
            program = CtaProgram((Role("warpgroup", warps, (Loop("products", PAIR_ITERATIONS, lambda i: body,
                                                                  None),)),))
            grid = gpu.gpu.sm_count * per_sm
            launch = Launch("dot_pair_timing", grid, 32 * warps, (bm * bk + bk * bn) * 2, 64,
                            lambda cta: program, classes=lambda: [(0, grid)], cost_key=lambda cta: 0)
            problem = AttentionProblem(batch=1, heads=1, seqlen_q=bm, head_dim=64)
            ends = stamped_simulation(      # (when each product is in)
                Schedule("dot_pair_timing", problem, None, (launch,), {}), gpu, "_mma_wait",
                lambda engine, role, event: engine.env._now + (event._delay if event is not None else 0.0))
            series = [t[PAIR_ITERATIONS // 4: 3 * PAIR_ITERATIONS // 4] for t in ends]
            interval = statistics.median(statistics.median(b - a for a, b in zip(s, s[1:])) for s in series)
            phase = None
            if per_sm > 1:
                shares, _ = co_resident_phases(series, [0] * len(series))
                phase = statistics.median(shares)
            return interval, phase

        alone, _ = run(1, 0.0)
        rest = measured[f"{name}_x1"] - alone
        for per_sm in PAIR_PER_SM:
            interval, phase = run(per_sm, rest)
            out.append({"shape": name, "n": per_sm, "gpu": measured[f"{name}_x{per_sm}"], "engine": interval,
                        "gpu_phase": measured.get(f"{name}_x{per_sm}_phase"), "engine_phase": phase})
    return out


def parse_shapes(text: str) -> list[tuple]:
    shapes = []
    for item in text.split(","):
        m = re.fullmatch(r"(\d+)x(\d+)x(\d+)w(\d+)", item.strip())
        if m is None:
            raise ValueError(f"--shapes takes block_m x block_n x D w warps, e.g. 128x64x128w8; got {item!r}")
        shapes.append(tuple(map(int, m.groups())))
    return shapes


def report(rows: list[dict], profile: str) -> None:
    print(f"cycles a step, measured (calibration_h100.csv) and each rule's error; profile {profile}; "
          f"the chain latency from each shape's one-CTA row; (n): CTAs the SM holds at once")
    print(f"{'shape':18s} {'1 CTA':>6s} | " + " | ".join(
        f"{n} CTAs: {'meas':>6s} " + " ".join(f"{r:>17s}" for r in RULES) for n in (2, 4)))
    errors: dict = {rule: [] for rule in RULES}
    for row in rows:
        bm, bn, d, warps = row["shape"]
        line = f"{bm}x{bn}x{d} w{warps} ({row['held']})".ljust(18) + f" {row['measured'][1]:6.0f} |"
        for per_sm in (2, 4):
            meas = row["measured"].get(per_sm)
            if meas is None:
                continue
            line += f" {per_sm} CTAs: {meas:6.0f} "
            for rule in RULES:
                e = row[rule][per_sm] / meas - 1
                if row["held"] > 1:     # (one at a time: waves of lone CTAs, no two CTAs meet)
                    errors[rule].append(e)
                line += f" {e:+17.1%}"
            line += " |"
        print(line)
    for rule, es in errors.items():
        if es:
            print(f"{rule:>17s}: mean |error| {statistics.mean(map(abs, es)):.1%}, mean {statistics.mean(es):+.1%}, "
                  f"max |error| {max(map(abs, es)):.1%} over the {len(es)} rows of 2 and 4 CTAs an SM "
                  f"where two or more run at once")
    print("\nphase apart of CTAs side by side (0: in step, 0.5: furthest): H100 (dot_chain_sm_phase), "
          "the engine's full simulation, and each rule's")
    for row in rows:
        bm, bn, d, warps = row["shape"]
        for n, gpu_phase in sorted(row["phase"]["measured"].items()):
            print(f"{bm}x{bn}x{d} w{warps}, {n} CTAs:".ljust(24) + f" H100 {gpu_phase:.2f} | "
                  f"engine {row['phase']['engine'][n]:.2f} | " +
                  " | ".join(f"{rule} {row['phase'][rule][n]:.2f}" for rule in RULES))
    print(f"\n... the second CTA started {', '.join(map(str, DELAYS))} cycles late (the H100 went back to "
          f"its offset: validation_notes.md, session 42)")
    for row in rows:
        bm, bn, d, warps = row["shape"]
        for rule, phases in row["phase"].get("delayed", {}).items():
            print(f"{bm}x{bn}x{d} w{warps}, 2 CTAs, {rule}:".ljust(48) +
                  " ".join(f"{phases[delay]:.2f}" for delay in DELAYS))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="h100.measured", help="a profile name or path (its on-chip rates)")
    parser.add_argument("--shapes", help="only these, e.g. 128x64x128w8,64x64x64w4")
    parser.add_argument("--pairs", action="store_true",
                        help="calibrate.py dot_pair_timing's rows in the engine instead (pair_timing)")
    a = parser.parse_args(argv)
    from gpusim.profile import load_profile
    try:
        shapes = parse_shapes(a.shapes) if a.shapes else None
        gpu = load_profile(a.profile)
        if a.pairs:
            pairs = pair_timing(gpu)
        else:
            rows = compare(gpu, shapes)
    except (GpusimError, ValueError, OSError) as e:
        print(f"unit_sharing: {e}", file=sys.stderr)
        return 2
    if a.pairs:
        print(f"a CTA's product interval (clk) and CTAs' phase apart, H100 (dot_pair_timing) | engine "
              f"({gpu.name}, full simulation; the one-CTA row less its product alone taken as a wait)")
        for p in pairs:
            phases = "" if p["engine_phase"] is None else f"  phase {p['gpu_phase']:.2f} | {p['engine_phase']:.2f}"
            print(f"{p['shape']:14s} x{p['n']}: {p['gpu']:6.0f} | {p['engine']:6.0f} "
                  f"({p['engine'] / p['gpu'] - 1:+6.1%}){phases}")
        return 0
    report(rows, gpu.name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
