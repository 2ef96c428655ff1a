"""How far is the engine from a flash step's chain measured alone, and do those errors drive fa2's? A CPU report.

calibrate.py's dot_chain benches time one flash step's dependent chain
(S = A·B on operands held on chip, row max, exp2, acc += P·V; no loads, not
the attention kernel) on the H100 at 1, 2 and 4 CTAs an SM: `dot_chain` (the
six shapes the profile's step numbers were reduced from), `dot_chain_wide`
and `dot_chain_more` (the other 17 shapes of fa2's config grid, held out).
This replays each row in the engine as fa2's schedule runs its compute
(tests/test_dot_chain.py asserts on the same replay) and prints the engine's
error by shape and occupancy. With --predictions, it also sets each fa2 row
of the measured sweep (N >= --min-seqlen) beside its step shape's error at
the config's CTAs an SM, and prints their correlation: near zero, the
config errors of fa2 are not its step chain's (validation_notes.md, session 33).

    PYTHONPATH=. python experiments/step_errors.py [--profile h100.measured]
        [--predictions experiments/results/validation_predictions_h100_measured.csv]
    PYTHONPATH=. python experiments/step_errors.py --stream [--sass]    # calibrate.py's dot_chain_stream rows

--full replays in the engine's full simulation instead of its fast path;
--sm-offsets gives every SM its own L2 round trip, as measured
(latency_per_sm_h100.csv), which the shipped profiles leave out (session 41:
with SMs alike, CTAs that start together stay in lock-step at L2).
"""
from __future__ import annotations

import argparse
import csv
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

CSV = os.path.join(ROOT, "experiments", "results", "calibration_h100.csv")
# each SM's own L2 round trip (calibrate.py latency_per_sm; not in the shipped profiles)
LATENCY_PER_SM = os.path.join(ROOT, "experiments", "results", "latency_per_sm_h100.csv")
MEASURED = os.path.join(ROOT, "experiments", "results", "validation_h100.csv")
BENCHES = ("dot_chain", "dot_chain_wide", "dot_chain_more")
ITERATIONS = 2048  # as the microbenchmark runs them


def chain_rows(bench: str = "dot_chain", path: str = CSV) -> list[tuple]:
    """(block_m, block_n, D, warps, CTAs an SM, registers, SMEM, measured cycles a
    step) of each row of `bench` (dot_chain, dot_chain_wide, dot_chain_more)."""
    out = []
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    for r in rows:
        if r["bench"] != bench:
            continue
        bm, bn, d, warps, per_sm = map(int, re.fullmatch(r"(\d+)x(\d+)x(\d+)_w(\d+)_x(\d+)", r["param"]).groups())
        regs = int(re.search(r"allow: (\d+) a thread", r["detail"]).group(1))
        smem = int(re.search(r"smem (\d+) B", r["detail"]).group(1))
        # in cycles: the launches ran at clocks 1335-1980 MHz (session 12), the
        # clock read in the kernel where the row has it
        clock = float(r["clock_mhz_kernel"] or r["clock_mhz_nvml"])
        out.append((bm, bn, d, warps, per_sm, regs, smem, float(r["value"]) * clock))
    return out


def chain_schedule(bm, bn, d, warps, grid, regs, smem, tiles: int = 0, stages: int = 1, spread: int = 0,
                   dtype: str = "bf16", online: bool = False, variant: str = "held", iterations: int = ITERATIONS):
    """The dot_chain kernel as fa2 runs its compute: one role per warpgroup,
    each its share of the rows (all of them, where 8 warps share 64 rows),
    meeting at a barrier every step. tiles: B and V streamed as fa2 streams
    K and V (cp.async, `stages` stages, each role copying its part), step i
    of CTA c reading tile (i + spread x c) % tiles of each (dot_chain_stream).
    dtype: the products' (fp8: dot_chain_fp8, whose problem is fp8 so the
    engine takes the profile's fp8 step numbers). online: fa2's whole online
    softmax (dot_chain_online). The step issues the instructions of the
    loop as compiled: `variant`'s (a kind of STREAM_VARIANTS), copies and
    all, as fa2's steps issue those of fa2's loop."""
    from algorithms.fa2 import step_ops, warpgroup_replicas
    from algorithms.ops import Load, MmaWait, Tile
    from algorithms.problem import AttentionProblem, TileConfig
    from algorithms.schedule import CtaProgram, Launch, Role, Schedule, pipelined_loop

    from experiments.calibration.cross_compile import dot_chain_loop
    roles = warps // 4
    reps = warpgroup_replicas(TileConfig(block_m=bm, block_n=bn, num_warps=warps, num_stages=1))
    # its instructions a step as ptxas compiled them, as fa2's come from its probe table
    issued = dot_chain_loop(bm, bn, d, warps, dtype, online, variant)["issue"] * 4 * 32
    chain = step_ops(dtype, "wgmma", bm * reps // roles, bn, d, reps, issued=issued, warpgroups=roles)

    def compute(i):
        return chain

    part = bn * d * 2 // roles      # a role's share of a B or V tile (bf16)
    streamed = [[[Load(Tile(name, 0, 0, j, k), part) for name in ("B", "V")] for j in range(tiles)]
                for k in range(roles)]

    def loads(k, cta):
        first = spread * cta
        return (lambda i: streamed[k][(i + first) % tiles]) if tiles else (lambda i: [])

    def program(cta):
        return CtaProgram(tuple(
            Role(f"warpgroup{k}", 4, (*pipelined_loop("chain", iterations, loads(k, cta), compute,
                                                      stages if tiles else 1, lambda i: 0, role=k, roles=roles),
                                      MmaWait(0)))      # the last P V, as fa2's epilogue waits
            for k in range(roles)))

    launch = Launch("dot_chain", grid, 32 * warps, smem, regs, program,
                    classes=lambda: [(0, grid)], cost_key=lambda cta: 0)
    problem = AttentionProblem(batch=1, heads=1, seqlen_q=bm, head_dim=d, dtype=dtype)
    return Schedule("dot_chain", problem, None, (launch,), {})


def replay(rows, profile="h100.measured", dtype: str = "bf16", online: bool = False,
           fast: bool = True) -> list[tuple]:
    """(shape and CTAs an SM, the engine's cycles a step, the measured ones) of
    each row; h100.measured: the on-chip rates the rows were reduced with
    (a profile name, path or HardwareProfile). dtype: the rows' (fp8 for
    dot_chain_fp8's); online: dot_chain_online's. fast=False: the engine's
    full simulation."""
    from gpusim.engine import simulate
    from gpusim.profile import load_profile

    gpu = load_profile(profile)
    out = []
    for bm, bn, d, warps, per_sm, regs, smem, measured in rows:
        schedule = chain_schedule(bm, bn, d, warps, gpu.gpu.sm_count * per_sm, regs, smem, dtype=dtype,
                                  online=online)
        predicted = simulate(schedule, gpu, fast=fast).runtime_s * gpu.clock_hz / ITERATIONS   # cycles a step
        out.append(((bm, bn, d, warps, per_sm), predicted, measured))
    return out


def resident(gpu, bm: int, bn: int, d: int, warps: int, regs: int, smem: int) -> int:
    """How many of a dot_chain bench's CTAs an SM holds at once (registers,
    SMEM): where a row asks for more, its launch runs in waves of lone or
    fewer CTAs (the 8-warp 128-row shapes hold one: their 2- and 4-CTA rows
    are their one-CTA step in turn)."""
    from gpusim.occupancy import occupancy
    return occupancy(chain_schedule(bm, bn, d, warps, gpu.gpu.sm_count, regs, smem).launches[0], gpu).ctas_per_sm


def with_sm_offsets(profile, path: str | None = None):
    """`profile` (as load_profile takes it) with each SM's own L2 round trip,
    as calibrate.py latency_per_sm measured it (`path`, by default
    LATENCY_PER_SM), for l2.sm_latency_offsets_cycles, which the shipped
    profiles leave at []: SMs alike, whose CTAs can stay in lock-step at L2
    for good (validation_notes.md, sessions 28 and 41). ProfileError,
    OSError, ValueError or KeyError where either does not serve."""
    from experiments.calibration.reduce import sm_latency_offsets
    from gpusim.profile import ProfileError, load_profile, parse_profile

    gpu = load_profile(profile)
    path = path or LATENCY_PER_SM
    with open(path, newline="") as f:
        measured = sm_latency_offsets(list(csv.DictReader(f)), gpu.gpu.sm_count)
    if measured is None:
        raise ProfileError(f"{path}: no latency_per_sm row for every one of {gpu.gpu.sm_count} SMs")
    # the profile's own values again (parse_profile keeps lists as tuples), the offsets replaced
    data = {name: {key: list(v) if isinstance(v, tuple) else v for key, v in section.as_dict().items()}
            for name, section in gpu.sections.items()}
    data["sources"] = dict(gpu.sources)
    data["l2"]["sm_latency_offsets_cycles"] = measured[0]
    return parse_profile(data, gpu.path)


# the stream benches (calibrate.py), and whether their steps run fa2's whole online softmax
STREAM_BENCHES = {"dot_chain_stream": False, "dot_chain_stream_d64": False, "dot_chain_online_stream": True,
                  "dot_chain_online_stream_wide": True}


def stream_rows(path: str = CSV, bench: str = "dot_chain_stream", kernel: bool = False) -> list[tuple]:
    """(block_m, block_n, D, warps, CTAs an SM, how B and V come (a kind of
    compute_benches.STREAM_VARIANTS), registers, SMEM, measured cycles a step:
    a CTA's own clock64) of each row of `bench` (STREAM_BENCHES); kernel: the
    measured cycles are the launch's instead (its `{bench}_kernel` rows, where
    the run has them: from session 40)."""
    out = []
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    launch = {r["param"]: float(r["value"]) for r in rows if r["bench"] == f"{bench}_kernel"}
    for r in rows:
        if r["bench"] != bench or (kernel and r["param"] not in launch):
            continue
        m = re.fullmatch(r"(\d+)x(\d+)x(\d+)_w(\d+)_x(\d+)_(\w+)", r["param"])
        bm, bn, d, warps, per_sm = map(int, m.groups()[:5])
        regs = int(re.search(r"(\d+) registers a thread", r["detail"]).group(1))
        smem = int(re.search(r"smem (\d+) B", r["detail"]).group(1))
        measured = launch[r["param"]] if kernel else float(r["value"])
        out.append((bm, bn, d, warps, per_sm, m.group(6), regs, smem, measured))
    return out


def replay_stream(rows, profile="h100.measured", online: bool = False, fast: bool = True,
                  iterations: int = ITERATIONS) -> list[tuple]:
    """(the row's key, the engine's cycles a step, the measured ones) of each
    dot_chain_stream row, its B and V streamed as the bench streams them
    (online: dot_chain_online_stream's, fa2's whole online softmax).
    fast=False: the engine's full simulation; iterations: fewer steps than
    the bench ran, for a quicker replay of a steady loop."""
    from gpusim.engine import simulate
    from gpusim.profile import load_profile

    from experiments.calibration.compute_benches import STREAM_VARIANTS
    variants = {kind: (tiles, spread, stages) for kind, tiles, spread, stages in STREAM_VARIANTS}
    gpu = load_profile(profile)
    out = []
    for bm, bn, d, warps, per_sm, kind, regs, smem, measured in rows:
        tiles, spread, stages = variants[kind]
        schedule = chain_schedule(bm, bn, d, warps, gpu.gpu.sm_count * per_sm, regs, smem, tiles, stages, spread,
                                  online=online, variant=kind, iterations=iterations)
        # (its CTAs all run at once: the launch's time is a CTA's)
        predicted = simulate(schedule, gpu, fast=fast).runtime_s * gpu.clock_hz / iterations
        out.append(((bm, bn, d, warps, per_sm, kind), predicted, measured))
    return out


def step_error_by_occupancy(replayed) -> dict:
    """{(block_m, block_n, D, warps): {CTAs an SM: engine / measured - 1}}, 3
    CTAs an SM, where no row has it, taken as the mean of 2 and 4 (marked by
    measured_counts)."""
    out: dict = {}
    for (bm, bn, d, warps, per_sm), predicted, measured in replayed:
        out.setdefault((bm, bn, d, warps), {})[per_sm] = predicted / measured - 1
    for errors in out.values():
        if 3 not in errors and 2 in errors and 4 in errors:
            errors[3] = (errors[2] + errors[4]) / 2
    return out


def measured_counts(replayed) -> list[int]:
    """The CTAs an SM the rows were measured at."""
    return sorted({key[4] for key, _, _ in replayed})


def fa2_pairs(by_shape: dict, predictions: str, measured: str = MEASURED, min_seqlen: int = 4096):
    """[(step error at the config's CTAs an SM, the fa2 row's error)] over the
    sweep's fa2 rows at N >= min_seqlen whose step shape was measured."""
    from algorithms.problem import AttentionProblem, TileConfig
    from gpusim import predict

    with open(predictions, newline="") as f:
        pred = {r["key"]: r for r in csv.DictReader(f)}
    occupancy: dict = {}
    pairs = []
    with open(measured, newline="") as f:
        for r in csv.DictReader(f):
            if r["algo"] != "fa2" or r["status"] != "ok" or int(r["seqlen"]) < min_seqlen:
                continue
            key = "|".join(r[k] for k in ("algo", "dtype", "batch", "heads", "seqlen", "head_dim", "causal",
                                          "block_m", "block_n", "num_warps", "num_stages"))
            p = pred.get(key)
            cfg = TileConfig(block_m=int(r["block_m"]), block_n=int(r["block_n"]), num_warps=int(r["num_warps"]),
                             num_stages=int(r["num_stages"]))
            shape = (cfg.block_m, cfg.block_n, int(r["head_dim"]), cfg.num_warps)
            if p is None or not p["runtime_us"] or shape not in by_shape:
                continue
            if (cfg, shape) not in occupancy:    # CTAs an SM: the accounting alone
                problem = AttentionProblem(batch=1, heads=16, seqlen_q=min_seqlen, head_dim=shape[2])
                occupancy[cfg, shape] = predict(problem, cfg, "h100", simulate=False).ctas_per_sm
            errors = by_shape[shape]
            per_sm = min(occupancy[cfg, shape], 4)
            if per_sm in errors:
                pairs.append((errors[per_sm], float(p["runtime_us"]) / 1e3 / float(r["ms"]) - 1))
    return pairs


def correlation(pairs) -> float:
    n = len(pairs)
    mx, my = sum(x for x, _ in pairs) / n, sum(y for _, y in pairs) / n
    sxy = sum((x - mx) * (y - my) for x, y in pairs)
    sxx, syy = sum((x - mx) ** 2 for x, _ in pairs), sum((y - my) ** 2 for _, y in pairs)
    return sxy / (sxx * syy) ** 0.5


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="h100.measured")
    ap.add_argument("--predictions", help="validate.py's validation_predictions_<profile>.csv: correlate with fa2's errors")
    ap.add_argument("--min-seqlen", type=int, default=4096)
    rows = ap.add_mutually_exclusive_group()
    rows.add_argument("--stream", action="store_true",
                      help="the dot_chain_stream rows instead: what streaming B and V adds to a step, GPU and engine")
    ap.add_argument("--stream-bench", default="dot_chain_stream", choices=tuple(STREAM_BENCHES),
                    help="with --stream: which bench's rows")
    rows.add_argument("--fp8", action="store_true",
                      help="the dot_chain_fp8 rows instead (e4m3 products, the profile's fp8 step numbers)")
    rows.add_argument("--online", action="store_true",
                      help="the dot_chain_online rows instead (fa2's whole online softmax, held out)")
    ap.add_argument("--kernel-time", action="store_true",
                    help="with --stream: the GPU's cycles a step as the launch's time, not the median CTA's "
                         "(rows from session 40 on)")
    ap.add_argument("--full", action="store_true",
                    help="the engine's full simulation, not its fast path (minutes a bench)")
    ap.add_argument("--sm-offsets", action="store_true",
                    help="each SM's own L2 round trip (experiments/results/latency_per_sm_h100.csv) on top of "
                         "the profile, as l2.sm_latency_offsets_cycles")
    ap.add_argument("--sass", action="store_true",
                    help="with --stream: also what streaming adds to a warp's trip of the loop in the sm_90 SASS "
                         "(experiments/results/dot_chain_loops_sm90.csv)")
    a = ap.parse_args(argv)
    from algorithms.errors import GpusimError

    profile = a.profile
    if a.sm_offsets:
        try:
            profile = with_sm_offsets(a.profile)
        except (GpusimError, OSError, ValueError, KeyError) as e:
            print(f"step_errors: {e}", file=sys.stderr)
            return 2
    fast = not a.full
    if a.stream:
        return print_stream(profile, a.sass, a.stream_bench, a.kernel_time, fast)
    if a.predictions and not os.path.exists(a.predictions):
        print(f"step_errors: no predictions file {a.predictions}", file=sys.stderr)
        return 2
    try:
        from gpusim.profile import load_profile
        if a.fp8:
            rows, dtype = chain_rows("dot_chain_fp8"), "fp8"
        elif a.online:
            rows, dtype = chain_rows("dot_chain_online"), "bf16"
        else:
            rows, dtype = [row for bench in BENCHES for row in chain_rows(bench)], "bf16"
        gpu = load_profile(profile)
        replayed = replay(rows, gpu, dtype, online=a.online, fast=fast)
        held = {row[:4]: resident(gpu, *row[:4], *row[5:7]) for row in rows}
    except (GpusimError, OSError) as e:
        print(f"step_errors: {e}", file=sys.stderr)
        return 2
    by_shape = step_error_by_occupancy(replayed)
    counts = measured_counts(replayed)
    print("shape (block_m x block_n x D, warps; CTAs an SM holds at once): engine error at "
          + " / ".join(map(str, counts)) + " CTAs an SM (more than it holds: waves)")
    for (bm, bn, d, warps), errors in sorted(by_shape.items()):
        print(f"  {bm}x{bn}x{d} w{warps} ({held[bm, bn, d, warps]}): "
              + " / ".join(f"{100 * errors[n]:+5.1f}%" for n in counts))
    errors = [e for row in by_shape.values() for n, e in row.items() if n in counts]
    print(f"{len(errors)} rows: mean |error| {100 * sum(map(abs, errors)) / len(errors):.1f}%, "
          f"max {100 * max(map(abs, errors)):.1f}%")
    if a.predictions:
        pairs = fa2_pairs(by_shape, a.predictions, min_seqlen=a.min_seqlen)
        if len(pairs) < 3:
            print(f"step_errors: only {len(pairs)} fa2 rows to correlate", file=sys.stderr)
            return 2
        print(f"fa2 rows at N >= {a.min_seqlen}: {len(pairs)}; correlation of their errors with their step "
              f"shape's: {correlation(pairs):+.2f}")
    return 0


def print_stream(profile, with_sass: bool = False, bench: str = "dot_chain_stream",
                 kernel: bool = False, fast: bool = True) -> int:
    from algorithms.errors import GpusimError

    online = STREAM_BENCHES[bench]
    try:
        rows = stream_rows(bench=bench, kernel=kernel)
        if not rows:
            print(f"step_errors: {CSV} has no {bench}{'_kernel' if kernel else ''} rows", file=sys.stderr)
            return 2
        replayed = {key: (predicted, measured)
                    for key, predicted, measured in replay_stream(rows, profile, online, fast)}
    except (GpusimError, OSError) as e:
        print(f"step_errors: {e}", file=sys.stderr)
        return 2
    print(f"shape, CTAs an SM, how B and V come: cycles a step ({'the launch' if kernel else 'the median CTA'} "
          f"on the GPU) held -> streamed (added), GPU | engine")
    for (bm, bn, d, warps, per_sm, kind), (predicted, measured) in sorted(replayed.items()):
        other = replayed.get((bm, bn, d, warps, per_sm, "held"))
        if kind == "held" or other is None:
            continue
        print(f"  {bm}x{bn}x{d} w{warps} x{per_sm} {kind:9s}: GPU {other[1]:.0f} -> {measured:.0f} "
              f"({measured - other[1]:+.0f}) | engine {other[0]:.0f} -> {predicted:.0f} ({predicted - other[0]:+.0f})")
    if with_sass:
        from experiments.calibration.cross_compile import dot_chain_loop
        print("a warp's trip of the loop, held -> streamed at 3 stages (sm_90 SASS): issue slots, ptxas's stall clocks")
        for bm, bn, d, warps in sorted({key[:4] for key in replayed}):
            held = dot_chain_loop(bm, bn, d, warps, online=online)
            streamed = dot_chain_loop(bm, bn, d, warps, online=online, variant="stream")
            print(f"  {bm}x{bn}x{d} w{warps}: issue {held['issue']} -> {streamed['issue']} "
                  f"({streamed['issue'] - held['issue']:+d}), stall clocks {held['stall_clocks']} -> "
                  f"{streamed['stall_clocks']} ({streamed['stall_clocks'] - held['stall_clocks']:+d})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
