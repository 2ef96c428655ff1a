"""Block-size explorer: predict every (block_m, block_n, warps, stages) of a
problem on a GPU, in parallel, and draw the result.

`evaluate(task)` predicts one (algo, problem, config, gpu) and returns a flat
row; configs that cannot run become rows with feasible=0 and the reason (a
DoesNotFit message names the resource, what the config requires and the
limit, as Triton says it). `run_tasks` maps evaluate over all local cores
(ProcessPoolExecutor), a Dask cluster, or in-process, with a progress bar on
stderr, and returns rows in task order. The same runner serves `gpusim
compare` and experiments/top_pick.py.
"""
from __future__ import annotations

import math
import os
import sys
from dataclasses import dataclass
from functools import lru_cache
from typing import Iterable, Sequence

import algorithms
from algorithms.compiled import from_compiler
from algorithms.errors import DoesNotFit, GpusimError
from algorithms.problem import THREE_CONSUMER_BLOCK_M, AttentionProblem, TileConfig

BLOCK_M = (16, 32, 64, 128, 256)
BLOCK_N = (16, 32, 64, 128, 256)
WARPS = (2, 4, 8, 16)
STAGES = (1, 2, 3, 4, 5)
EXECUTORS = ("process", "dask", "serial")

# Columns of a sweep row, in CSV order.
ROW_FIELDS = ("algo", "gpu", "batch", "heads", "kv_heads", "seqlen_q", "seqlen_kv", "head_dim",
              "causal", "dtype", "block_m", "block_n", "num_warps", "num_stages",
              "consumer_warpgroups", "feasible", "reason", "short_reason", "smem_bytes",
              "smem_limit", "runtime_us", "tflops", "hbm_read_bytes", "hbm_write_bytes",
              "l2_read_bytes", "global_write_bytes", "l2_hit_rate", "compulsory_read_bytes", "compulsory_write_bytes",
              "flops_matmul", "ctas_per_sm", "waves", "bottleneck", "bottleneck_share",
              "from_compiler")


@dataclass(frozen=True)
class Task:
    """One prediction to make. gpu is a profile name or a .toml path (a
    string, so tasks pickle cheaply to worker processes and Dask workers).
    config None takes the algorithm's default for the GPU and shape."""

    algo: str
    problem: AttentionProblem
    config: TileConfig | None
    gpu: str
    simulate: bool = True
    tag: str = ""


def gpu_ref(gpu) -> str:
    """What to send to a worker for `gpu`: its name if it is a shipped
    profile, else the path of its file."""
    from .profile import HardwareProfile

    if isinstance(gpu, HardwareProfile):
        return gpu.name if _is_shipped(gpu) else os.path.abspath(gpu.path)
    return str(gpu)


def _is_shipped(gpu) -> bool:
    from .profile import profiles_dir

    try:
        return os.path.samefile(gpu.path, profiles_dir() / f"{gpu.name}.toml")
    except OSError:
        return False


@lru_cache(maxsize=32)
def _profile(ref: str):
    from .profile import load_profile

    return load_profile(ref)


def engine_available() -> bool:
    """Whether gpusim.engine (the SimPy replay behind runtime predictions) is
    importable here."""
    try:
        from gpusim.engine import simulate  # noqa: F401
    except ImportError:
        return False
    return True


def sweep_config(algo: str, problem: AttentionProblem, gpu, block_m: int, block_n: int,
                 num_warps: int, num_stages: int) -> TileConfig:
    """The algorithm's default config for the GPU with the four sweep knobs
    replaced. For fa3, num_warps = 4 × (1 producer + consumer warpgroups)."""
    hopper = _profile(gpu_ref(gpu)).features.wgmma
    base = algorithms.default_config(algo, problem, hopper)
    changes = dict(block_m=block_m, block_n=block_n, num_warps=num_warps, num_stages=num_stages)
    if algo == "fa3" and num_warps % 4 == 0 and 2 <= num_warps // 4 <= 4:
        changes["consumer_warpgroups"] = num_warps // 4 - 1
    if algo == "fa3" and block_m == THREE_CONSUMER_BLOCK_M:
        # FA3's 192-row tile is three consumers' whatever the warps knob says;
        # other warp counts then come out infeasible, with fa3's reason
        changes["consumer_warpgroups"] = 3
    return base.with_(**changes)


def short_reason(exc: Exception) -> str:
    """A cell label for a heatmap: 'SMEM 288K>227K', 'regs 72K>64K', ..."""
    if isinstance(exc, DoesNotFit):
        name = {"shared memory": "SMEM", "registers": "regs"}.get(exc.resource, exc.resource)
        return f"{name} {exc.required / 1024:.0f}K>{exc.limit / 1024:.0f}K"
    text = str(exc)
    return text if len(text) <= 24 else text[:23] + "…"


def _base_row(task: Task) -> dict:
    p = task.problem
    row = {"algo": task.algo, "gpu": _profile(task.gpu).name, "batch": p.batch, "heads": p.heads,
           "kv_heads": p.kv_heads, "seqlen_q": p.seqlen_q, "seqlen_kv": p.seqlen_kv,
           "head_dim": p.head_dim, "causal": p.causal, "dtype": p.dtype}
    if task.tag:
        row["tag"] = task.tag
    cfg = task.config
    if cfg is not None:
        row.update(block_m=cfg.block_m, block_n=cfg.block_n, num_warps=cfg.num_warps,
                   num_stages=cfg.num_stages, consumer_warpgroups=cfg.consumer_warpgroups)
    return row


def evaluate(task: Task) -> dict:
    """Predict one task; a config or algorithm the GPU cannot run gives a row
    with feasible=0 and the one-line reason instead of raising."""
    from .predict import predict

    row = _base_row(task)
    gpu = _profile(task.gpu)
    try:
        pred = predict(task.problem, task.config, gpu, algo=task.algo, simulate=task.simulate)
    except GpusimError as exc:
        row.update(feasible=False, reason=str(exc), short_reason=short_reason(exc))
        if isinstance(exc, DoesNotFit) and exc.resource == "shared memory":
            row.update(smem_bytes=exc.required, smem_limit=exc.limit)
        return row
    c = pred.config
    row.update(block_m=c["block_m"], block_n=c["block_n"], num_warps=c["num_warps"],
               num_stages=c["num_stages"], consumer_warpgroups=c["consumer_warpgroups"],
               feasible=True, reason="", short_reason="", smem_bytes=pred.smem_bytes_per_cta,
               smem_limit=gpu.residency.smem_per_block_bytes, runtime_us=pred.runtime_us,
               tflops=pred.tflops, hbm_read_bytes=pred.hbm_read_bytes,
               hbm_write_bytes=pred.hbm_write_bytes, l2_read_bytes=pred.l2_read_bytes,
               global_write_bytes=pred.global_write_bytes,
               l2_hit_rate=pred.l2_hit_rate, compulsory_read_bytes=pred.compulsory_read_bytes,
               compulsory_write_bytes=pred.compulsory_write_bytes,
               flops_matmul=pred.flops_matmul, ctas_per_sm=pred.ctas_per_sm, waves=pred.waves,
               bottleneck=pred.bottleneck, bottleneck_share=pred.bottleneck_share)
    known = from_compiler(task.algo, task.problem, task.config) if task.config is not None else None
    if known is not None:
        row["from_compiler"] = int(known)
    return row


def evaluate_chunk(tasks: Sequence[Task]) -> list[dict]:
    return [evaluate(t) for t in tasks]


def _chunks(tasks: Sequence[Task], n_chunks: int) -> list[list[Task]]:
    size = max(1, math.ceil(len(tasks) / max(1, n_chunks)))
    return [list(tasks[i:i + size]) for i in range(0, len(tasks), size)]


def default_jobs() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


def _progress(total: int, desc: str, enabled: bool):
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="cfg", file=sys.stderr, disable=not enabled,
                dynamic_ncols=True, leave=False)


def run_tasks(tasks: Sequence[Task], executor: str = "process", jobs: int | None = None,
              scheduler: str | None = None, progress: bool = True, desc: str = "predict") -> list[dict]:
    """evaluate() every task and return the rows in task order.

    executor: "process" (a ProcessPoolExecutor over `jobs` local processes,
    default all cores), "dask" (a dask.distributed Client: `scheduler` is a
    scheduler address such as tcp://host:8786, or None for a LocalCluster of
    `jobs` workers on this machine) or "serial" (in this process)."""
    tasks = list(tasks)
    if executor not in EXECUTORS:
        raise GpusimError(f"unknown executor {executor!r}; choose one of {', '.join(EXECUTORS)}")
    if jobs is not None and jobs < 1:
        raise GpusimError(f"--jobs must be at least 1, got {jobs}")
    if scheduler and executor != "dask":
        raise GpusimError("--scheduler needs --executor dask")
    jobs = jobs or default_jobs()
    if not tasks:
        return []
    if executor == "process" and (jobs == 1 or len(tasks) == 1):
        executor = "serial"
    if executor == "serial":
        rows = []
        with _progress(len(tasks), desc, progress) as bar:
            for t in tasks:
                rows.append(evaluate(t))
                bar.update(1)
        return rows
    # A few chunks per worker: balances uneven configs, amortises dispatch.
    chunks = _chunks(tasks, jobs * 4)
    results: list[list[dict] | None] = [None] * len(chunks)
    if executor == "process":
        from concurrent.futures import ProcessPoolExecutor, as_completed

        with ProcessPoolExecutor(max_workers=min(jobs, len(chunks))) as pool, \
                _progress(len(tasks), desc, progress) as bar:
            futures = {pool.submit(evaluate_chunk, c): i for i, c in enumerate(chunks)}
            for fut in as_completed(futures):
                i = futures[fut]
                results[i] = fut.result()
                bar.update(len(chunks[i]))
    else:
        results = _run_dask(chunks, jobs, scheduler, progress, desc, len(tasks))
    return [row for chunk in results for row in chunk]


def _run_dask(chunks, jobs, scheduler, progress, desc, total):
    try:
        from distributed import Client, LocalCluster, as_completed
    except ImportError:
        raise GpusimError("--executor dask needs dask.distributed: pip install 'gpusim[dask]'") from None
    cluster = None
    try:
        if scheduler:
            try:
                client = Client(scheduler, timeout="10s")
            except (OSError, TimeoutError, ValueError) as exc:
                raise GpusimError(f"cannot reach the Dask scheduler at {scheduler}: {exc}") from None
        else:
            cluster = LocalCluster(n_workers=jobs, threads_per_worker=1, dashboard_address=None)
            client = Client(cluster)
        with client, _progress(total, desc, progress) as bar:
            futures = client.map(evaluate_chunk, chunks, pure=False)
            index = {f.key: i for i, f in enumerate(futures)}
            results = [None] * len(chunks)
            for fut in as_completed(futures):
                i = index[fut.key]
                results[i] = fut.result()
                bar.update(len(chunks[i]))
        return results
    finally:
        if cluster is not None:
            cluster.close()


# ---------------------------------------------------------------------------
# Sweeps

def sweep_tasks(algo: str, problem: AttentionProblem, gpu, block_ms: Iterable[int] = BLOCK_M,
                block_ns: Iterable[int] = BLOCK_N, warps: Iterable[int] = WARPS,
                stages: Iterable[int] = STAGES, simulate: bool = True) -> list[Task]:
    """One task per (block_m, block_n, warps, stages); configs that TileConfig
    itself refuses (e.g. block_m not a power of two) raise here, one line."""
    ref = gpu_ref(gpu)
    algorithms.module(algo)
    tasks = []
    for s in stages:
        for w in warps:
            for bm in block_ms:
                for bn in block_ns:
                    cfg = sweep_config(algo, problem, ref, bm, bn, w, s)
                    tasks.append(Task(algo, problem, cfg, ref, simulate))
    return tasks


def rank_key(row: dict):
    """Best first: feasible, then shortest predicted runtime; without runtimes
    (accounting only) fewest bytes requested from global memory."""
    if not row.get("feasible"):
        return (1, math.inf, math.inf)
    rt = row.get("runtime_us")
    return (0, rt if rt is not None else math.inf, row.get("l2_read_bytes") or math.inf)


def best_rows(rows: Sequence[dict], k: int = 5) -> list[dict]:
    return sorted((r for r in rows if r.get("feasible")), key=rank_key)[:k]


def config_label(row: dict) -> str:
    return (f"{row['block_m']}x{row['block_n']} w{row['num_warps']} s{row['num_stages']}")


def sweep_stem(algo: str, problem: AttentionProblem, gpu_name: str) -> str:
    p = problem
    kv = f"-kvh{p.kv_heads}" if p.kv_heads != p.heads else ""
    nkv = f"-nkv{p.seqlen_kv}" if p.seqlen_kv != p.seqlen_q else ""
    return (f"sweep_{gpu_name}_{algo}_b{p.batch}-h{p.heads}{kv}-n{p.seqlen_q}{nkv}-d{p.head_dim}"
            f"{'-causal' if p.causal else ''}-{p.dtype}")


def _compact(v: float) -> str:
    for scale, unit in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e4, "k")):
        if abs(v) >= scale:
            return f"{v / scale:.3g}{unit}" if unit != "k" else f"{v / 1e3:.3g}k"
    return f"{v:.3g}"


def plot_heatmaps(rows: Sequence[dict], title: str, metric: str = "runtime_us"):
    """Panels per (stages, warps) of `metric` over block_m × block_n;
    infeasible cells hatched and labelled with the reason; the best config
    starred. Returns the matplotlib figure."""
    import numpy as np

    from .artifacts import pyplot

    plt = pyplot()
    from matplotlib.patches import Rectangle

    bms = sorted({r["block_m"] for r in rows})
    bns = sorted({r["block_n"] for r in rows})
    ws = sorted({r["num_warps"] for r in rows})
    ss = sorted({r["num_stages"] for r in rows})
    vals = [r[metric] for r in rows if r.get("feasible") and r.get(metric) is not None]
    have = bool(vals)
    vmin, vmax = (min(vals), max(vals)) if have else (0.0, 1.0)
    norm = None
    if have and vmin > 0 and vmax / vmin > 20:
        from matplotlib.colors import LogNorm
        norm = LogNorm(vmin=vmin, vmax=vmax)
    best = best_rows(rows, 1)
    best = best[0] if best else None
    cell = 0.55
    fig, axes = plt.subplots(len(ss), len(ws), squeeze=False,
                             figsize=(max(4.0, len(ws) * (len(bns) * cell + 1.2)),
                                      max(3.0, len(ss) * (len(bms) * cell + 0.9))))
    index = {(r["num_stages"], r["num_warps"], r["block_m"], r["block_n"]): r for r in rows}
    image = None
    estimated: set = set()
    small = len(bms) * len(bns) <= 36
    for i, s in enumerate(ss):
        for j, w in enumerate(ws):
            ax = axes[i][j]
            grid = np.full((len(bms), len(bns)), np.nan)
            for a, bm in enumerate(bms):
                for b, bn in enumerate(bns):
                    r = index.get((s, w, bm, bn))
                    if r is None:
                        continue
                    if r.get("feasible") and r.get(metric) is not None:
                        grid[a, b] = r[metric]
                        if r.get("from_compiler") == 0:     # registers and spills estimated
                            estimated.add((s, w, a, b))
                            ax.add_patch(Rectangle((b - 0.45, a - 0.45), 0.9, 0.9, fill=False,
                                                   linestyle=":", edgecolor="0.2", linewidth=0.8))
                    elif not r.get("feasible"):
                        ax.add_patch(Rectangle((b - 0.5, a - 0.5), 1, 1, fill=False, hatch="///",
                                               edgecolor="0.55", linewidth=0))
                        if small:
                            ax.text(b, a, r.get("short_reason", "").replace(" ", "\n", 1),
                                    ha="center", va="center", fontsize=4.5, color="0.25")
            kw = {"norm": norm} if norm else {"vmin": vmin, "vmax": vmax}
            image = ax.imshow(grid, origin="lower", cmap="viridis_r", aspect="auto", **kw)
            if small and have:
                for a in range(len(bms)):
                    for b in range(len(bns)):
                        if not np.isnan(grid[a, b]):
                            # viridis_r: light (yellow) cells are the low values
                            shade = float(image.norm(grid[a, b]))
                            ax.text(b, a, _compact(grid[a, b]) + ("*" if (s, w, a, b) in estimated else ""),
                                    ha="center", va="center", fontsize=5.5,
                                    color="black" if shade < 0.6 else "white")
            if best and best["num_stages"] == s and best["num_warps"] == w:
                ax.plot(bns.index(best["block_n"]), bms.index(best["block_m"]), marker="*",
                        color="red", markersize=13, markeredgecolor="white")
            ax.set_xticks(range(len(bns)), [str(v) for v in bns], fontsize=7)
            ax.set_yticks(range(len(bms)), [str(v) for v in bms], fontsize=7)
            ax.set_title(f"stages={s}, warps={w}", fontsize=8)
            if i == len(ss) - 1:
                ax.set_xlabel("block_n", fontsize=8)
            if j == 0:
                ax.set_ylabel("block_m", fontsize=8)
    label = {"runtime_us": "predicted runtime (µs)", "tflops": "predicted TFLOP/s",
             "l2_read_bytes": "bytes requested from L2/HBM (accounting only)"}.get(metric, metric)
    if image is not None and have:
        fig.colorbar(image, ax=axes, shrink=0.6, label=label)
    note = "; dotted *: estimated (not in the compiled tables)" if estimated else ""
    fig.suptitle(f"{title}\nhatched: infeasible (reason); ★ best{note}", fontsize=9)
    return fig
