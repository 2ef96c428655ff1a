"""fa2's CTA prologue: calibrate.py prologue_probe's GPU rows beside the engine.

The probe (experiments/calibration/cuda_kernels.py) times, per probe CTA, from
its Q block being in registers to its first K/V stage being in SMEM, as fa2's
prologue issues them: Q by plain loads from HBM, then two stages of two 8 KB
cp.async tiles from an L2-resident set, the first stage awaited. One probe CTA
an SM alone, or beside two busy CTAs an SM that stream 16 KB of cp.async a
step and/or run exp2s (`copy`, `mufu`, `mixed`). This replays the same launch
in the engine (full simulation; a warm launch first brings the K/V set into
L2, as the probe's own warm-up launch does) and prints both, in cycles (the
GPU's at its clock, the engine's at the profile's). No attention kernel, and
nothing here feeds a profile.

    PYTHONPATH=. python experiments/prologue_compare.py [--measured CSV] [--profile h100.measured]
"""
from __future__ import annotations

import argparse
import csv
import os
import re
import statistics
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

DEFAULT_CSV = os.path.join(ROOT, "experiments", "results", "prologue_probe_h200.csv")
THREADS = 128
TILE = 8192             # a Q block, a K or V tile: 64 x 64 bf16
PROBES = 24             # a probe CTA's probes; its first is left out, as on the GPU
KV_TILES = (4 << 20) // TILE
# busy CTAs: (16 KB copies a step, exp2s and FFMAs a thread a step), as cuda_kernels.py's PROLOGUE_PROBE
BUSY = {"copy": (True, 32, 0), "mufu": (False, 128, 0), "mufu32": (False, 32, 0), "mixed": (True, 128, 0),
        "ffma": (False, 0, 1024), "ffma256": (False, 0, 256),
        # (the engine has no integer pipe of its own: integer work is Alu work too)
        "ialu": (False, 0, 1024)}
BUSY_STEPS = 200        # long enough to outlast the probes in the engine (checked)
# Probe CTA i starts i x this many cycles late: on the GPU the probes' CTAs drift apart, and in
# step (the engine's, unstaggered) their Q blocks came from HBM as one burst, every probe's
# 1305 cycles after issue against 547 on the GPU. 132 x 16 cycles is about a probe's period.
STAGGER_CYCLES = 16


def measured_rows(path: str) -> dict:
    """{param: cycles} of the prologue_probe rows of a calibration CSV."""
    with open(path) as f:
        return {r["param"]: float(r["value"]) for r in csv.DictReader(f) if r["bench"] == "prologue_probe"}


class _ProbeTracer:
    """Per probe CTA, when each of its Q blocks and K/V tiles arrived."""

    max_sms = 10 ** 9

    def __init__(self, first_probe_cta: int):
        self.first = first_probe_cta
        self.arrived: dict = {}     # (cta, tile) -> arrival (s)
        self.issued: dict = {}      # (cta, tile) -> issue (s)
        self.ctas: dict = {}        # cta -> (start, end) (s), from the CTA slices

    def slice(self, sm, track, label, start, end):
        if track == "ctas" and "#" in label:
            self.ctas[int(label.rsplit("#", 1)[1])] = (start, end)

    def load(self, sm, cta, tile, issued, arrived):
        if cta >= self.first:
            self.arrived[cta, tile] = arrived
            self.issued[cta, tile] = issued


def _schedule(mode: str | None, sms: int, per_sm: int = 2):
    """The warm launch and the probe launch: busy CTAs first (`per_sm` an SM),
    then one probe CTA an SM (72 KB of SMEM each: three an SM)."""
    from algorithms.ops import CP_ASYNC, LD, Alu, Exp, IssueStalls, Load, Tile, Wait
    from algorithms.problem import AttentionProblem
    from algorithms.schedule import CtaProgram, Launch, Role, Schedule, TensorSpec, pipelined_loop

    busy = 0 if mode is None else per_sm * sms
    copies, ex2, fma = BUSY[mode] if mode else (False, 0, 0)
    work = ([Exp(ex2 * THREADS)] if ex2 else []) + ([Alu(fma * THREADS)] if fma else [])

    def warm(cta):
        loads = [Load(Tile("K", 0, 0, i), TILE) for i in range(KV_TILES)]
        return CtaProgram((Role("warps", THREADS // 32, tuple(loads)),))

    def busy_program(cta):
        def loads_of(i):
            return [Load(Tile("K", 0, 0, (cta * 5 + 2 * i) % (KV_TILES - 2)), 2 * TILE)] if copies else []
        items = pipelined_loop("busy", BUSY_STEPS, loads_of, lambda i: work, 3, lambda i: 0)
        return CtaProgram((Role("warps", THREADS // 32, tuple(items)),))

    def probe_program(cta):
        index = cta - busy
        items = [IssueStalls(index * STAGGER_CYCLES)]
        for it in range(PROBES):
            kv = (index * 7 + it * 4) & (KV_TILES // 2 - 1)
            items.append(Load(Tile("Q", 0, 0, index * PROBES + it), TILE, LD))
            items += [Load(Tile("K", 0, 0, kv + g), TILE, CP_ASYNC, (f"p{it}.s{g // 2}",)) for g in range(4)]
            items += [Wait(f"p{it}.s0", 2), Wait(f"p{it}.s1", 2)]
        return CtaProgram((Role("warps", THREADS // 32, tuple(items)),))

    def program(cta):
        return busy_program(cta) if cta < busy else probe_program(cta)

    smem = 72 * 1024
    warm_launch = Launch("warm", 1, THREADS, smem, 32, warm, classes=lambda: [(0, 1)], cost_key=lambda c: 0)
    probe_launch = Launch("probe", busy + sms, THREADS, smem, 32, program,
                          classes=lambda: [(0, busy), (busy, sms)] if busy else [(0, sms)],
                          cost_key=lambda c: c < busy)
    problem = AttentionProblem(batch=1, heads=1, seqlen_q=128, head_dim=64)
    tensors = {"K": TensorSpec("K", 1, KV_TILES, TILE, "input"),
               "Q": TensorSpec("Q", 1, sms * PROBES, TILE, "input")}
    return Schedule("prologue_probe", problem, None, (warm_launch, probe_launch), tensors), busy


def replay(mode: str | None, profile: str, per_sm: int = 2) -> tuple[float, float]:
    """The engine's medians (cycles): start -> Q in, Q in -> first stage in,
    over every probe CTA's probes but its first, beside `per_sm` busy CTAs
    an SM of kind `mode` (None: alone)."""
    from algorithms.ops import Tile
    from gpusim.engine import simulate
    from gpusim.profile import load_profile

    gpu = load_profile(profile)
    schedule, busy = _schedule(mode, gpu.gpu.sm_count, per_sm)
    tracer = _ProbeTracer(busy)
    simulate(schedule, gpu, fast=False, tracer=tracer)
    q_waits, kv_waits = [], []
    for index in range(gpu.gpu.sm_count):
        cta = busy + index
        for it in range(1, PROBES):
            kv = (index * 7 + it * 4) & (KV_TILES // 2 - 1)
            q_tile = Tile("Q", 0, 0, index * PROBES + it)
            q_in = tracer.arrived[cta, q_tile]
            stage = max(tracer.arrived[cta, Tile("K", 0, 0, kv + g)] for g in range(2))
            q_waits.append((q_in - tracer.issued[cta, q_tile]) * gpu.clock_hz)
            kv_waits.append((stage - q_in) * gpu.clock_hz)
    if busy:    # the busy CTAs outlast the probes, as on the GPU
        probes_end = max(tracer.ctas[busy + i][1] for i in range(gpu.gpu.sm_count))
        if min(tracer.ctas[c][1] for c in range(busy)) < probes_end:
            raise RuntimeError(f"the engine's busy CTAs ({mode}) ended before its probes: raise BUSY_STEPS")
    return statistics.median(q_waits), statistics.median(kv_waits)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--measured", default=DEFAULT_CSV)
    ap.add_argument("--profile", default="h100.measured")
    args = ap.parse_args(argv)
    try:
        gpu_rows = measured_rows(args.measured)
    except (OSError, KeyError, ValueError) as e:
        print(f"prologue_compare: cannot read {args.measured}: {e}", file=sys.stderr)
        return 2
    if "lone" not in gpu_rows:
        print(f"prologue_compare: {args.measured} has no prologue_probe rows (calibrate.py run --only "
              f"device,prologue_probe writes them)", file=sys.stderr)
        return 2
    from algorithms.errors import GpusimError
    from gpusim.profile import load_profile

    try:
        load_profile(args.profile)
    except (GpusimError, OSError) as e:
        print(f"prologue_compare: {e}", file=sys.stderr)
        return 2
    print(f"cycles, GPU ({args.measured}) | engine (`{args.profile}`, full simulation)")
    print(f"{'neighbours':<14} {'start -> Q in':>22} {'Q in -> first K/V stage':>28}")
    for name in gpu_rows:
        kind = re.fullmatch(r"lone|busy(\d)_([a-z0-9]+)", name)
        if kind is None or (kind.group(2) is not None and kind.group(2) not in BUSY):
            continue        # (the `_q` and `_step` rows, and kinds this replay does not know)
        mode, per_sm = (kind.group(2), int(kind.group(1))) if kind.group(1) else (None, 0)
        try:
            q, kv = replay(mode, args.profile, per_sm)
        except RuntimeError as e:
            print(f"prologue_compare: {e}", file=sys.stderr)
            return 2
        print(f"{name:<14} {gpu_rows[name + '_q']:>10.0f} | {q:>9.0f} {gpu_rows[name]:>14.0f} | {kv:>11.0f}",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
