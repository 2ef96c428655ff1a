"""gpusim.predict: problem + config + GPU -> Prediction.

The exact accounting (algorithms.accounting) gives FLOPs, bytes requested and
SMEM; the engine (gpusim.engine) replays the same schedule on the profile for
runtime, HBM/L2 traffic, unit busy fractions and the bottleneck.
"""
from __future__ import annotations

import gc
import math
from dataclasses import asdict, dataclass, field

import algorithms
from algorithms.accounting import count
from algorithms.errors import GpusimError, InvalidConfig, InvalidProblem, UnsupportedAlgorithm
from algorithms.problem import AttentionProblem, TileConfig

from .occupancy import occupancy
from .profile import HardwareProfile, load_profile
from .symmetry import sliced, slices_for

# The keys DESIGN.md promises in `--json`, in SI units; extra keys may follow.
JSON_KEYS = ("runtime_us", "tflops", "hbm_read_bytes", "hbm_write_bytes", "l2_read_bytes",
             "l2_hit_rate", "flops_matmul", "flops_exp", "smem_bytes_per_cta", "ctas_per_sm",
             "waves", "bottleneck")


@dataclass
class LaunchPrediction:
    name: str
    grid: int
    threads: int
    smem_bytes: int
    regs_per_thread: int
    ctas_per_sm: int
    occupancy_limiter: str
    waves: float
    runtime_us: float | None = None
    bottleneck: str | None = None
    # of the CTAs of the part the engine simulated (Prediction.simulated_parts):
    # how many it ran op by op, and how many it fast-forwarded as a steady
    # class's ghosts (what a prediction's time goes to: bench_simulator.py)
    ctas_simulated: int | None = None
    ctas_ghosted: int | None = None


@dataclass
class Prediction:
    algo: str
    gpu: str
    problem: dict
    config: dict
    flops_matmul: int
    flops_exp: int
    flops_alu: int
    global_read_bytes: int       # bytes the SMs request from global memory (= L2 requests)
    global_write_bytes: int
    compulsory_read_bytes: int   # every tensor read once
    compulsory_write_bytes: int  # every tensor written once
    smem_bytes_per_cta: int
    ctas_per_sm: int
    waves: float
    launches: list[LaunchPrediction]
    load_bytes_by_tensor: dict[str, int]
    store_bytes_by_tensor: dict[str, int]
    # Filled by the engine:
    runtime_us: float | None = None
    tflops: float | None = None
    hbm_read_bytes: int | None = None
    hbm_write_bytes: int | None = None
    # of hbm_write_bytes, the dirty bytes L2 still holds when the run ends:
    # they reach HBM later, outside a profiler's count of the run's own DRAM
    # writes (ncu: fa2's O, 59.6 of 67 MB written during the kernel)
    l2_dirty_at_end_bytes: int | None = None
    l2_hit_rate: float | None = None
    bottleneck: str | None = None
    bottleneck_share: float | None = None
    unit_busy: dict[str, float] = field(default_factory=dict)
    # the equal parts of the GPU the engine simulated one of (symmetry.py; 1: all of it)
    simulated_parts: int | None = None

    @property
    def l2_read_bytes(self) -> int:
        return self.global_read_bytes

    def to_json(self) -> dict:
        out = asdict(self)
        out["l2_read_bytes"] = self.l2_read_bytes
        ordered = {k: out.pop(k) for k in JSON_KEYS}
        ordered.update(out)
        return ordered


def check_supported(algo: str, problem: AttentionProblem, gpu: HardwareProfile) -> None:
    if algo in algorithms.HOPPER_ONLY and not (gpu.features.wgmma and gpu.features.tma):
        raise UnsupportedAlgorithm(
            f"{algo} needs Hopper's wgmma and TMA, which {gpu.name} lacks "
            f"(features.wgmma={gpu.features.wgmma}, features.tma={gpu.features.tma})")
    if problem.dtype == "fp8" and not gpu.features.fp8:
        raise UnsupportedAlgorithm(f"{gpu.name} has no fp8 tensor cores (features.fp8 = false)")


def resolve_config(algo: str, problem: AttentionProblem, config: TileConfig | None,
                   gpu: HardwareProfile) -> TileConfig:
    hopper = gpu.features.wgmma
    return config if config is not None else algorithms.default_config(algo, problem, hopper)


def predict(problem: AttentionProblem, config: TileConfig | None, gpu, algo: str = "fa2",
            simulate: bool = True, fast: bool = True, progress=None) -> Prediction:
    """Predict `algo` on `gpu` (a profile name, path or HardwareProfile).

    config None takes the algorithm's default for this GPU and shape. Raises
    algorithms.errors.GpusimError subclasses on bad input, a config that does
    not fit (DoesNotFit names required and limit) or an algorithm the GPU
    cannot run. simulate=False returns the accounting only (runtime None).
    fast: use the engine's symmetry and steady-state fast-forward.
    progress(done, total): called as the simulated CTAs are dispatched (of
    the part the fast path simulates, see symmetry.py); it does not change
    the prediction.
    """
    # The cyclic garbage collector stays off until the schedule and the
    # engine are gone (engine.simulate: their millions of objects, scanned
    # again and again, took about 5% of a prediction, and when the collector
    # came back on with the schedule still alive, one scan of it took up to
    # 50 ms more). None of them is in a cycle: they go by reference counts.
    collecting = gc.isenabled()
    gc.disable()
    try:
        return _predict(problem, config, gpu, algo, simulate, fast, progress)
    finally:
        if collecting:
            gc.enable()


def check_fits_hbm(schedule, gpu) -> None:
    """InvalidProblem (one line) when the schedule's global tensors -- Q, K,
    V, O and what the algorithm keeps beside them (standard's S and P, FA1's
    running output) -- need more than the GPU's memory: no such run exists
    to predict (and counting one of petabytes would take hours)."""
    need, have = schedule.global_bytes, gpu.hbm.capacity_bytes
    if need > have:
        raise InvalidProblem(f"{schedule.algo} needs {need / 1e9:,.1f} GB of GPU memory for "
                             f"{', '.join(schedule.tensors)}; {gpu.name} has {have / 1e9:,.1f} GB "
                             f"(hbm.capacity_bytes): a smaller batch, fewer heads or a shorter sequence")


def _check_arguments(problem, config, progress) -> None:
    """A wrong kind of argument is a one-line GpusimError, not an AttributeError deep inside."""
    if not isinstance(problem, AttentionProblem):
        raise InvalidProblem(f"problem must be an algorithms.problem.AttentionProblem, got {type(problem).__name__}")
    if config is not None and not isinstance(config, TileConfig):
        raise InvalidConfig(f"config must be an algorithms.problem.TileConfig or None (the default), "
                            f"got {type(config).__name__}")
    if progress is not None and not callable(progress):
        raise GpusimError(f"progress must be a callable taking (done, total) or None, got {type(progress).__name__}")


def _predict(problem: AttentionProblem, config: TileConfig | None, gpu, algo: str,
             simulate: bool, fast: bool, progress=None) -> Prediction:
    _check_arguments(problem, config, progress)
    gpu = load_profile(gpu)
    algorithms.module(algo)
    check_supported(algo, problem, gpu)
    cfg = resolve_config(algo, problem, config, gpu)
    algorithms.check(algo, problem, cfg, gpu.residency.smem_per_block_bytes)
    schedule = algorithms.build(algo, problem, cfg, hopper=gpu.features.wgmma)
    check_fits_hbm(schedule, gpu)
    counts = count(schedule)
    launches = []
    for launch in schedule.launches:
        occ = occupancy(launch, gpu)
        launches.append(LaunchPrediction(launch.name, launch.grid, launch.threads,
                                         launch.smem_bytes, launch.regs_per_thread,
                                         occ.ctas_per_sm, occ.limiter,
                                         occ.waves(launch.grid, gpu.gpu.sm_count)))
    main = max(launches, key=lambda lp: lp.smem_bytes)
    pred = Prediction(
        algo=algo, gpu=gpu.name, problem=asdict(problem), config=asdict(cfg),
        flops_matmul=counts.flops_matmul, flops_exp=counts.flops_exp, flops_alu=counts.flops_alu,
        global_read_bytes=counts.global_read_bytes, global_write_bytes=counts.global_write_bytes,
        compulsory_read_bytes=counts.compulsory_read_bytes,
        compulsory_write_bytes=counts.compulsory_write_bytes,
        smem_bytes_per_cta=counts.smem_bytes_per_cta, ctas_per_sm=main.ctas_per_sm,
        waves=main.waves, launches=launches,
        load_bytes_by_tensor=counts.load_bytes, store_bytes_by_tensor=counts.store_bytes)
    if simulate:
        from .engine import simulate as run_engine
        # The fast path simulates one of k equal parts of the run (symmetry.py);
        # the full simulation, its reference, always the whole GPU.
        k = (slices_for(problem, gpu.gpu.sm_count, gpu.l2.capacity_bytes,
                        [(lp.grid, lp.ctas_per_sm) for lp in launches]) if fast else 1)
        part = schedule if k == 1 else algorithms.build(algo, sliced(problem, k), cfg,
                                                        hopper=gpu.features.wgmma)
        result = run_engine(part, gpu, fast=fast, slices=k, progress=progress)
        pred.simulated_parts = k
        pred.runtime_us = result.runtime_s * 1e6
        pred.tflops = problem.reference_flops() / result.runtime_s / 1e12
        pred.hbm_read_bytes = result.hbm_read_bytes * k
        pred.hbm_write_bytes = result.hbm_write_bytes * k
        pred.l2_dirty_at_end_bytes = result.l2_dirty_at_end_bytes * k
        pred.l2_hit_rate = result.l2_hit_rate
        pred.bottleneck, pred.bottleneck_share = result.bottleneck, result.bottleneck_share
        pred.unit_busy = result.unit_busy
        for lp, lr in zip(launches, result.launches):
            lp.runtime_us, lp.bottleneck = lr.runtime_s * 1e6, lr.bottleneck
            lp.ctas_simulated, lp.ctas_ghosted = lr.ctas_simulated, lr.ctas_ghosted
        longest = max(launches, key=lambda lp: lp.runtime_us)
        pred.ctas_per_sm, pred.waves = longest.ctas_per_sm, longest.waves
        assert math.isfinite(pred.runtime_us) and pred.runtime_us > 0
    return pred
