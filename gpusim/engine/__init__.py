"""The SimPy engine: replay a schedule on a hardware profile (see core.py)."""
from __future__ import annotations

from algorithms.schedule import Schedule

from ..occupancy import occupancy
from ..profile import HardwareProfile
from .core import UNITS, Engine, LaunchResult, SimResult, bottleneck_of


def simulate(schedule: Schedule, gpu: HardwareProfile, fast: bool = True, tracer=None) -> SimResult:
    """Replay every launch of `schedule` on `gpu`. Deterministic: the same
    inputs give bit-identical results. fast=False simulates every operation."""
    ctas_per_sm = [occupancy(launch, gpu).ctas_per_sm for launch in schedule.launches]
    return Engine(schedule, gpu, fast=fast, tracer=tracer).run(ctas_per_sm)


__all__ = ["simulate", "SimResult", "LaunchResult", "UNITS", "bottleneck_of"]
