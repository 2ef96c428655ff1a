"""The SimPy engine: replay a schedule on a hardware profile (see core.py)."""
from __future__ import annotations

import gc

from algorithms.schedule import Schedule

from ..occupancy import occupancy
from ..profile import HardwareProfile
from .core import UNITS, Engine, LaunchResult, SimResult, bottleneck_of


def simulate(schedule: Schedule, gpu: HardwareProfile, fast: bool = True, tracer=None,
             slices: int = 1, progress=None) -> SimResult:
    """Replay every launch of `schedule` on `gpu`. Deterministic: the same
    inputs give bit-identical results. fast=False simulates every operation.
    slices: `schedule` is one of that many equal parts of the run
    (gpusim/symmetry.py), given that share of the GPU; the result is the
    part's (its bytes 1/slices of the run's). progress(done, total): called
    as the part's CTAs are dispatched (Engine)."""
    ctas_per_sm = [occupancy(launch, gpu).ctas_per_sm for launch in schedule.launches]
    # The cyclic garbage collector stays off while the engine runs: a replay
    # allocates millions of objects (events, ops, L2 lines), and collections
    # scanned the live ones again and again (about 5% of a prediction). It
    # is back on once the engine is gone, so that it finds only what is left.
    collecting = gc.isenabled()
    gc.disable()
    try:
        return Engine(schedule, gpu, fast=fast, tracer=tracer, slices=slices, progress=progress).run(ctas_per_sm)
    finally:
        if collecting:
            gc.enable()


__all__ = ["simulate", "SimResult", "LaunchResult", "UNITS", "bottleneck_of"]
