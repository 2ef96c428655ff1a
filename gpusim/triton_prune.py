"""Prune a `triton.autotune` search with gpusim's predictions.

    import triton
    from gpusim.triton import prune_configs_by

    @triton.autotune(configs=[triton.Config({"BLOCK_M": 128, "BLOCK_N": 64}, num_warps=8,
                                            num_stages=3), ...],
                     key=["n_q", "n_kv"],
                     prune_configs_by=prune_configs_by(gpu="h100", algo="fa2", top_k=8))
    @triton.jit
    def attention_kernel(Q, K, V, ..., BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr): ...

Triton 3.6's Autotuner calls `early_config_prune(configs, named_args,
**kwargs)` once per new autotune key, before compiling or benchmarking
anything; it must return at least one config. The hook maps each
triton.Config (kwargs BLOCK_M / BLOCK_N, num_warps, num_stages) and the
launch's arguments (Q [B,H,Nq,D], K [B,KVH,Nkv,D], CAUSAL) to a TileConfig
and an AttentionProblem, predicts each, drops configs the model says cannot
run (SMEM/registers), and keeps the `top_k` fastest predicted. If the model
refuses every config, all are returned unchanged: Triton then decides.

Nothing here imports triton: configs are duck-typed (.kwargs, .num_warps,
.num_stages), so the hook is testable without a GPU. Predictions come from
`gpusim.predict` (needs simpy), or from a JSON written beforehand on another
machine (`PrecomputedPredictor`), for GPU machines without simpy.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Sequence

import algorithms
from algorithms.errors import GpusimError, InvalidProblem
from algorithms.problem import AttentionProblem, TileConfig

# Configs kept by default. Of fa2's 36 on the H100, the fastest measured among
# the model's 8 fastest came within 5% of the measured sweep's best in 23 of
# 24 shapes (18 with 3), and live pruned autotunes picked within 5% of full
# autotune's in 7 of 8 shapes (5 with 3) for 4.4x less autotune time (9.6x
# with 3): experiments/results/top_pick_h100.md, autotune_prune_h100.md.
DEFAULT_TOP_K = 8

# torch dtype names -> AttentionProblem dtypes
_DTYPES = {"bfloat16": "bf16", "float16": "fp16", "half": "fp16", "float8_e4m3fn": "fp8",
           "float8_e5m2": "fp8", "bf16": "bf16", "fp16": "fp16", "fp8": "fp8"}
_Q_NAMES = ("Q", "q", "q_ptr", "Q_ptr")
_K_NAMES = ("K", "k", "k_ptr", "K_ptr")
_CAUSAL_NAMES = ("CAUSAL", "causal", "IS_CAUSAL", "is_causal")


def _dtype_name(t) -> str:
    name = str(getattr(t, "dtype", "")).replace("torch.", "")
    try:
        return _DTYPES[name]
    except KeyError:
        raise InvalidProblem(f"cannot map tensor dtype {name!r} to bf16/fp16/fp8") from None


def problem_from_args(named_args: dict, kwargs: dict) -> AttentionProblem:
    """The AttentionProblem of a launch whose arguments include Q [B,H,Nq,D]
    and K [B,KVH,Nkv,D] tensors (named Q/q, K/k) and optionally a CAUSAL
    flag — the signature of kernels/fa2.py and most Triton attention kernels."""
    args = {**named_args, **kwargs}
    q = next((args[n] for n in _Q_NAMES if n in args), None)
    k = next((args[n] for n in _K_NAMES if n in args), None)
    if q is None or k is None or len(getattr(q, "shape", ())) != 4 or len(getattr(k, "shape", ())) != 4:
        raise InvalidProblem("the kernel's arguments hold no 4-d Q and K tensors; "
                             "pass problem= or problem_fn= to the pruning hook")
    b, h, nq, d = (int(x) for x in q.shape)
    _, kvh, nkv, _ = (int(x) for x in k.shape)
    causal = bool(next((args[n] for n in _CAUSAL_NAMES if n in args), False))
    return AttentionProblem(batch=b, heads=h, kv_heads=kvh, seqlen_q=nq, seqlen_kv=nkv,
                            head_dim=d, causal=causal, dtype=_dtype_name(q))


def problem_key(problem: AttentionProblem) -> str:
    p = problem
    return (f"b{p.batch}-h{p.heads}-kvh{p.kv_heads}-nq{p.seqlen_q}-nkv{p.seqlen_kv}-d{p.head_dim}-"
            f"c{int(p.causal)}-{p.dtype}")


def config_key(cfg: TileConfig) -> str:
    return f"m{cfg.block_m}-n{cfg.block_n}-w{cfg.num_warps}-s{cfg.num_stages}"


class Predictor:
    """predicted runtime in µs of (problem, config); raises GpusimError when
    the config cannot run."""

    def __call__(self, problem: AttentionProblem, config: TileConfig) -> float:  # pragma: no cover
        raise NotImplementedError


class SimulatorPredictor(Predictor):
    """gpusim.predict with the engine (simpy needed)."""

    def __init__(self, gpu="h100", algo="fa2"):
        self.gpu, self.algo = gpu, algo

    def __call__(self, problem, config):
        from .predict import predict

        return predict(problem, config, self.gpu, algo=self.algo, simulate=True).runtime_us


class PrecomputedPredictor(Predictor):
    """Runtimes predicted beforehand (write_predictions), read from JSON: for
    machines without simpy. A (problem, config) not in the file is an error."""

    def __init__(self, data_or_path):
        if isinstance(data_or_path, dict):
            data = data_or_path
        else:
            try:
                with open(data_or_path) as f:
                    data = json.load(f)
            except (OSError, json.JSONDecodeError) as exc:
                raise GpusimError(f"cannot read predictions {data_or_path}: {exc}") from None
        self.gpu, self.algo = data.get("gpu"), data.get("algo")
        self.table: dict[tuple[str, str], dict] = {}
        for e in data["entries"]:
            self.table[(e["problem_key"], e["config_key"])] = e

    def __call__(self, problem, config):
        key = (problem_key(problem), config_key(config))
        e = self.table.get(key)
        if e is None:
            raise KeyError(f"no precomputed prediction for {key[0]} {key[1]}")
        if e.get("runtime_us") is None:
            raise GpusimError(e.get("reason") or "infeasible")
        return float(e["runtime_us"])


def write_predictions(path, problems: Sequence[AttentionProblem], configs: Sequence[TileConfig],
                      gpu="h100", algo="fa2", executor="process", jobs=None, progress=True,
                      simulate=True, meta: dict | None = None) -> dict:
    """Predict every (problem, config) and write a JSON PrecomputedPredictor
    reads. configs are the sweep knobs; each is applied to the algorithm's
    default config for the GPU (gpusim.explore.sweep_config)."""
    from .artifacts import ensure_folder_of, write_json
    from .explore import Task, run_tasks, sweep_config

    ensure_folder_of(path)   # (before the predictions, not after)
    tasks, keys = [], []
    for p in problems:
        for c in configs:
            full = sweep_config(algo, p, gpu, c.block_m, c.block_n, c.num_warps, c.num_stages)
            tasks.append(Task(algo, p, full, str(gpu), simulate))
            keys.append((problem_key(p), config_key(full), p, full))
    rows = run_tasks(tasks, executor=executor, jobs=jobs, progress=progress, desc="precompute")
    entries = []
    for (pk, ck, p, c), r in zip(keys, rows):
        entries.append({"problem_key": pk, "config_key": ck, "problem": asdict(p),
                        "config": {"block_m": c.block_m, "block_n": c.block_n,
                                   "num_warps": c.num_warps, "num_stages": c.num_stages},
                        "runtime_us": r.get("runtime_us") if r.get("feasible") else None,
                        "bottleneck": r.get("bottleneck"), "reason": r.get("reason", "")})
    data = {"gpu": str(gpu), "algo": algo, "simulated": simulate, **(meta or {}),
            "entries": entries}
    write_json(path, data)
    return data


@dataclass
class Ranked:
    """One config as the hook saw it: the prediction or why it was refused."""

    config: Any
    tile: TileConfig | None
    runtime_us: float | None
    reason: str = ""

    @property
    def feasible(self) -> bool:
        return self.runtime_us is not None and math.isfinite(self.runtime_us)


@dataclass
class SimulatorPrune:
    """The `early_config_prune` callable. After each call, `.last` holds every
    config ranked (feasible ones fastest first, then refused ones with their
    reason) and `.last_problem` the problem it predicted."""

    gpu: Any = "h100"
    algo: str = "fa2"
    top_k: int = DEFAULT_TOP_K
    problem: AttentionProblem | None = None
    problem_fn: Callable[[dict, dict], AttentionProblem] | None = None
    predictor: Callable[[AttentionProblem, TileConfig], float] | None = None
    block_m_key: str = "BLOCK_M"
    block_n_key: str = "BLOCK_N"
    last: list[Ranked] = field(default_factory=list)
    last_problem: AttentionProblem | None = None
    _cache: dict = field(default_factory=dict, repr=False)

    def __post_init__(self):
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 1:
            raise GpusimError(f"top_k must be a positive integer, got {self.top_k!r}")
        algorithms.module(self.algo)
        from .profile import load_profile
        load_profile(self.gpu)      # (an unknown GPU refused when the hook is made, not at autotune time)
        if self.predictor is None:
            self.predictor = SimulatorPredictor(self.gpu, self.algo)

    def tile_config(self, config, problem: AttentionProblem) -> TileConfig:
        """A triton.Config as the TileConfig it launches."""
        from .profile import load_profile

        kw = getattr(config, "kwargs", {}) or {}
        missing = [k for k in (self.block_m_key, self.block_n_key) if k not in kw]
        if missing:
            raise GpusimError(f"config {config} has no {' or '.join(missing)}")
        hopper = load_profile(self.gpu).features.wgmma
        base = algorithms.default_config(self.algo, problem, hopper)
        return base.with_(block_m=int(kw[self.block_m_key]), block_n=int(kw[self.block_n_key]),
                          num_warps=int(config.num_warps), num_stages=int(config.num_stages))

    def rank(self, configs: Sequence, problem: AttentionProblem) -> list[Ranked]:
        ranked = []
        for cfg in configs:
            try:
                tile = self.tile_config(cfg, problem)
            except GpusimError as exc:
                ranked.append(Ranked(cfg, None, None, str(exc)))
                continue
            key = (problem, tile)
            if key not in self._cache:
                try:
                    self._cache[key] = (float(self.predictor(problem, tile)), "")
                except GpusimError as exc:
                    self._cache[key] = (None, str(exc))
            rt, reason = self._cache[key]
            ranked.append(Ranked(cfg, tile, rt, reason))
        order = sorted(range(len(ranked)),
                       key=lambda i: (not ranked[i].feasible,
                                      ranked[i].runtime_us if ranked[i].feasible else 0.0, i))
        return [ranked[i] for i in order]

    def __call__(self, configs, named_args, **kwargs):
        if self.problem is not None:
            problem = self.problem
        elif self.problem_fn is not None:
            problem = self.problem_fn(named_args, kwargs)
        else:
            problem = problem_from_args(named_args, kwargs)
        self.last_problem = problem
        self.last = self.rank(list(configs), problem)
        kept = [r.config for r in self.last if r.feasible][: self.top_k]
        return kept if kept else list(configs)


def prune_configs_by(gpu="h100", algo: str = "fa2", top_k: int = DEFAULT_TOP_K, **options) -> dict:
    """The `prune_configs_by=` argument of triton.autotune: {"early_config_prune":
    SimulatorPrune(...)}. options: problem, problem_fn, predictor (e.g.
    PrecomputedPredictor(path)), block_m_key, block_n_key."""
    allowed = ("problem", "problem_fn", "predictor", "block_m_key", "block_n_key")
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise GpusimError(f"prune_configs_by: unknown option {unknown[0]!r}; allowed: gpu, algo, top_k, "
                          f"{', '.join(allowed)}")
    return {"early_config_prune": SimulatorPrune(gpu=gpu, algo=algo, top_k=top_k, **options)}
