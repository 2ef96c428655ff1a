"""Where do fa3_gluon and cuDNN's attention spend an SM's cycles? Nsight Compute
counters of one launch of each (B4 H16 N4096 D128 bf16, causal and not: the
cells where fa3_gluon / cuDNN sits at parity, issue 4): the SM clock the launch
ran at, the tensor pipe's active cycles, issue-slot use, instructions per pipe
and the warps' stall reasons. Counters, not timings: they say which unit or
wait separates the two kernels, so a change to kernels/fa3_gluon.py can aim at it.

    PYTHONPATH=. python3 experiments/fa3_gluon_ncu.py [--out $OUT/fa3_gluon_ncu_h100.csv]   (GPU)

ncu runs with `--clock-control none` (the machine's clocks are never changed)
and `--profile-from-start off`: the target script compiles and warms the
kernel, then profiles one launch between cudaProfilerStart and Stop, so no
kernel name is needed (cuDNN's differ by version). No simulator import.
"""
from __future__ import annotations

import argparse
import csv
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from kernels.provenance import provenance, write_csv_atomic  # noqa: E402
from experiments import gpu_probe  # noqa: E402

SHAPE = dict(batch=4, heads=16, seqlen=4096, head_dim=128)
KERNELS = ("fa3_gluon", "sdpa_cudnn")
# regex: entries match every counter of that name pattern the ncu version has
METRICS = [
    "gpu__time_duration.sum",
    "sm__cycles_elapsed.avg.per_second",
    "smsp__issue_active.avg.pct_of_peak_sustained_active",
    "smsp__inst_executed.sum",
    "launch__registers_per_thread",
    "launch__grid_size",
    "launch__block_size",
    "dram__bytes_read.sum",
    "regex:^sm__pipe_tensor.*_cycles_active\\.avg\\.pct_of_peak_sustained_active$",
    "regex:^sm__inst_executed_pipe_(xu|fma|fmaheavy|fmalite|alu|lsu|uniform|adu|cbu)\\.sum$",
    "regex:^smsp__warp_issue_stalled_.*_per_warp_active\\.pct$",
]


def target(spec: str) -> None:
    """Runs under ncu: warm `kernel` up, then one profiled launch."""
    import torch

    kernel, causal = spec.split(":")
    causal = bool(int(causal))
    b, h, n, d = SHAPE["batch"], SHAPE["heads"], SHAPE["seqlen"], SHAPE["head_dim"]
    q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    if kernel == "fa3_gluon":
        from kernels import fa3_gluon

        def run():
            return fa3_gluon.forward(q, k, v, causal=causal)
    else:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        def run():
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
    for _ in range(3):
        run()
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    run()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()


def profile(spec: str) -> list[dict]:
    """One dict of counters per kernel launched between start and stop."""
    ncu = shutil.which("ncu") or "ncu"
    cmd = [ncu, "--clock-control", "none", "--profile-from-start", "off", "--metrics", ",".join(METRICS),
           "--csv", "--page", "raw", sys.executable, os.path.abspath(__file__), "--target", spec]
    out = subprocess.run(cmd, capture_output=True, text=True)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith('"')]
    if len(lines) < 3:
        print(out.stdout[-3000:], out.stderr[-3000:], file=sys.stderr)
        raise SystemExit(f"ncu gave no counters for --target {spec}")
    header, units = (next(csv.reader([ln])) for ln in lines[:2])
    rows = []
    for ln in lines[2:]:
        values = next(csv.reader([ln]))
        row = {"kernel_name": values[header.index("Kernel Name")] if "Kernel Name" in header else ""}
        for hd, unit, val in zip(header, units, values):
            if "__" in hd:   # counters; ncu's own columns (ID, stream, ...) aside
                row[f"{hd} ({unit})" if unit else hd] = val
        rows.append(row)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "fa3_gluon_ncu_h100.csv"))
    ap.add_argument("--target", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.target:
        target(a.target)
        return 0
    if gpu_probe.start("fa3_gluon_ncu.py", a.out, argv, ncu=True) is None:
        return 2
    prov = provenance("PYTHONPATH=. python3 experiments/fa3_gluon_ncu.py")
    rows = []
    for causal in (0, 1):
        for kernel in KERNELS:
            for r in profile(f"{kernel}:{causal}"):
                rows.append({"kernel": kernel, "causal": causal, **SHAPE, **r, **prov})
                print(kernel, causal, r.get("kernel_name", "")[:60],
                      r.get("gpu__time_duration.sum (usecond)") or r.get("gpu__time_duration.sum (msecond)"),
                      flush=True)
    write_csv_atomic(a.out, rows, list(dict.fromkeys(k for r in rows for k in r)))
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
