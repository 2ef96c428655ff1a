"""gpusim trace: a Chrome/Perfetto timeline of one simulated run (and a Gantt PNG)."""
from __future__ import annotations

import algorithms
from algorithms.defaults import SCHEDULES

from ..artifacts import ensure_folder_of
from ..cli import add_config_args, add_problem_args, config_from_args, problem_from_args


def register(subparsers) -> None:
    p = subparsers.add_parser("trace", help="write a Chrome/Perfetto trace of one simulated run")
    add_problem_args(p, algo_choices=SCHEDULES)
    add_config_args(p)
    p.add_argument("-o", "--output", default="trace.json", help="trace file (open in ui.perfetto.dev)")
    p.add_argument("--png", metavar="PATH", help="also draw a Gantt chart of the traced SMs")
    p.add_argument("--sms", type=int, default=4, help="SMs to trace (default 4)")
    p.add_argument("--fast", action="store_true",
                   help="trace the fast path (fast-forwarded spans appear as single slices)")
    p.set_defaults(func=run)


def run(a) -> int:
    from algorithms.errors import GpusimError

    from ..engine import simulate
    from ..engine.trace import Tracer
    from ..predict import check_fits_hbm, check_supported, resolve_config
    from ..profile import load_profile

    if a.sms < 1:
        raise GpusimError(f"--sms must be at least 1, got {a.sms}")
    gpu = load_profile(a.gpu)
    if a.sms > gpu.gpu.sm_count:
        raise GpusimError(f"--sms {a.sms}: {gpu.name} has {gpu.gpu.sm_count} SMs")
    problem = problem_from_args(a)
    config = resolve_config(a.algo, problem, config_from_args(a, a.algo, problem, gpu.features.wgmma), gpu)
    check_supported(a.algo, problem, gpu)
    algorithms.check(a.algo, problem, config, gpu.residency.smem_per_block_bytes)
    # the outputs' folders before the simulation, not after it
    for path in filter(None, (a.output, a.png)):
        ensure_folder_of(path)
    tracer = Tracer(max_sms=a.sms)
    schedule = algorithms.build(a.algo, problem, config, hopper=gpu.features.wgmma)
    check_fits_hbm(schedule, gpu)
    result = simulate(schedule, gpu, fast=a.fast, tracer=tracer)
    tracer.write_chrome(a.output)
    print(f"{a.algo} on {gpu.name}: {result.runtime_s * 1e6:,.1f} us, {len(tracer.slices):,} slices "
          f"of {a.sms} SMs -> {a.output}")
    if a.png:
        tracer.write_png(a.png, f"{a.algo} on {gpu.name}, {problem}")
        print(f"Gantt chart -> {a.png}")
    return 0
