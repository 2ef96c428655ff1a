"""Roofline: arithmetic intensity of each algorithm against each GPU's ridge.

Arithmetic intensity = matmul FLOPs the schedule executes (padded tiles
included) ÷ HBM bytes read + written. The bytes are the engine's predicted
HBM traffic (after L2) when the simulator runs, else the compulsory bytes
(every tensor the schedule touches read or written once) — a lower bound on
traffic, so an upper bound on intensity; each row says which
(`bytes_source`). Ridge point = peak dense 16-bit tensor FLOP/s ÷ peak HBM
bandwidth (datasheet numbers of the profile); the sustained ridge uses the
profile's sustained matmul fraction and measured bandwidth.
"""
from __future__ import annotations

from typing import Sequence

from algorithms.defaults import ALGORITHMS
from algorithms.problem import AttentionProblem

from .profile import HardwareProfile, load_profile

COLORS = {"standard": "#8c8c8c", "fa1": "#1f77b4", "fa2": "#ff7f0e", "fa3": "#d62728"}
MARKERS = {"standard": "o", "fa1": "s", "fa2": "D", "fa3": "^"}


def peak_flops(gpu: HardwareProfile, dtype: str = "bf16") -> float:
    tc = gpu.tensor_cores
    return (tc.peak_dense_tflops_fp8 if dtype == "fp8" else tc.peak_dense_tflops_16bit) * 1e12


def peak_bandwidth(gpu: HardwareProfile) -> float:
    return gpu.hbm.peak_bandwidth_gbps * 1e9


def ridge_point(gpu, dtype: str = "bf16") -> float:
    """FLOP per byte where the roofline bends: peak FLOP/s ÷ peak bandwidth."""
    gpu = load_profile(gpu)
    return peak_flops(gpu, dtype) / peak_bandwidth(gpu)


def sustained_ridge_point(gpu, dtype: str = "bf16") -> float:
    gpu = load_profile(gpu)
    return (peak_flops(gpu, dtype) * gpu.tensor_cores.sustained_fraction /
            (gpu.hbm.sustained_bandwidth_gbps * 1e9))


def attainable_flops(gpu, intensity: float, dtype: str = "bf16", sustained: bool = False) -> float:
    gpu = load_profile(gpu)
    if sustained:
        peak = peak_flops(gpu, dtype) * gpu.tensor_cores.sustained_fraction
        bw = gpu.hbm.sustained_bandwidth_gbps * 1e9
    else:
        peak, bw = peak_flops(gpu, dtype), peak_bandwidth(gpu)
    return min(peak, intensity * bw)


def points(rows: Sequence[dict]) -> list[dict]:
    """Roofline rows from prediction rows (gpusim.explore.evaluate)."""
    out = []
    for r in rows:
        gpu = load_profile(r["gpu_ref"] if "gpu_ref" in r else r["gpu"])
        base = {"gpu": r["gpu"], "algo": r["algo"], "batch": r["batch"], "heads": r["heads"],
                "seqlen_q": r["seqlen_q"], "head_dim": r["head_dim"], "causal": r["causal"],
                "dtype": r["dtype"], "ridge_flop_per_byte": ridge_point(gpu, r["dtype"]),
                "sustained_ridge_flop_per_byte": sustained_ridge_point(gpu, r["dtype"]),
                "peak_tflops": peak_flops(gpu, r["dtype"]) / 1e12,
                "peak_bandwidth_gbps": gpu.hbm.peak_bandwidth_gbps,
                "applicable": bool(r.get("feasible")), "reason": r.get("reason", "")}
        if not r.get("feasible"):
            out.append(base)
            continue
        if r.get("hbm_read_bytes") is not None:
            nbytes, source = r["hbm_read_bytes"] + r["hbm_write_bytes"], "engine HBM"
        else:
            nbytes, source = r["compulsory_read_bytes"] + r["compulsory_write_bytes"], "compulsory"
        ai = r["flops_matmul"] / nbytes
        achieved = r["flops_matmul"] / (r["runtime_us"] * 1e-6) / 1e12 if r.get("runtime_us") else None
        base.update(flops_matmul=r["flops_matmul"], hbm_bytes=nbytes, bytes_source=source,
                    intensity_flop_per_byte=ai,
                    attainable_tflops=attainable_flops(gpu, ai, r["dtype"]) / 1e12,
                    achieved_tflops=achieved,
                    bound="memory" if ai < base["ridge_flop_per_byte"] else "compute")
        out.append(base)
    return out


def plot(rows: Sequence[dict], title: str):
    """One log-log panel per GPU: the datasheet roof (solid), the sustained
    roof (dashed), the ridge, and a marker per algorithm at its intensity —
    at its predicted achieved FLOP/s when simulated, else on the roof
    (hollow: the bound, not a prediction)."""
    from .artifacts import pyplot

    plt = pyplot()
    gpus = list(dict.fromkeys(r["gpu"] for r in rows))
    fig, axes = plt.subplots(1, len(gpus), squeeze=False, figsize=(4.2 * len(gpus), 3.9),
                             sharey=True)
    ais = [r["intensity_flop_per_byte"] for r in rows if r.get("applicable")]
    lo = min(ais + [r["ridge_flop_per_byte"] for r in rows]) / 4
    hi = max(ais + [r["ridge_flop_per_byte"] for r in rows]) * 4
    xs = [lo * (hi / lo) ** (i / 200) for i in range(201)]
    for ax, gpu_name in zip(axes[0], gpus):
        mine = [r for r in rows if r["gpu"] == gpu_name]
        gpu = load_profile(mine[0].get("gpu_ref", gpu_name))
        dtype = mine[0]["dtype"]
        ax.plot(xs, [attainable_flops(gpu, x, dtype) / 1e12 for x in xs], "k-", lw=1.2,
                label="roof (datasheet peak, peak BW)")
        ax.plot(xs, [attainable_flops(gpu, x, dtype, sustained=True) / 1e12 for x in xs], "k--",
                lw=0.8, label="sustained roof (profile)")
        ridge = mine[0]["ridge_flop_per_byte"]
        ax.axvline(ridge, color="0.5", lw=0.7, ls=":")
        ax.text(ridge * 1.08, peak_flops(gpu, dtype) / 1e12 * 0.06, f"ridge {ridge:.0f} FLOP/B",
                rotation=90, fontsize=7, color="0.3")
        na = []
        for r in mine:
            if not r.get("applicable"):
                na.append(r["algo"])
                continue
            y = r["achieved_tflops"] if r.get("achieved_tflops") else r["attainable_tflops"]
            hollow = r.get("achieved_tflops") is None
            ax.plot(r["intensity_flop_per_byte"], y, MARKERS[r["algo"]], ms=7,
                    color=COLORS[r["algo"]], mfc="none" if hollow else COLORS[r["algo"]],
                    mew=1.5, label=f"{r['algo']} ({r['bytes_source']} bytes)")
        if na:
            ax.text(0.98, 0.03, ", ".join(na) + ": n/a", transform=ax.transAxes, ha="right",
                    fontsize=7, color="0.3")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_title(gpu_name, fontsize=9)
        ax.set_xlabel("arithmetic intensity (matmul FLOP / HBM byte)", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(True, which="major", alpha=0.3)
    axes[0][0].set_ylabel("TFLOP/s", fontsize=8)
    handles, labels = [], []
    for ax in axes.flat:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            if lab not in labels:
                handles.append(h)
                labels.append(lab)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.legend(handles, labels, loc="upper center", ncol=min(3, len(labels)), fontsize=7,
               bbox_to_anchor=(0.5, 0.0))
    return fig


def roofline_tasks(problem: AttentionProblem, gpus: Sequence[str], algos=ALGORITHMS,
                   simulate: bool = True):
    from .explore import Task

    return [Task(algo, problem, None, g, simulate) for g in gpus for algo in algos]
