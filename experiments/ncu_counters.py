"""Nsight Compute counters of one kernel launch, for the probes that read a
few counters per case (spill_counters.py, pipe_counters.py, l2_request_probe.py): ncu with
`--clock-control none` (the machine's clocks are never changed) runs a script
with its own target argument, skips the kernel's first launch (it compiles)
and reads the second.

No simulator import (runs on the GPU machine).
"""
from __future__ import annotations

import csv
import shutil
import subprocess
import sys


def second_launch(script: str, target: str, kernel_regex: str, metrics: list[str],
                  cache_control: str = "all") -> dict:
    """{counter: (value, unit)} of the second launch of the kernel matching
    kernel_regex that `python script --target target` makes; counters ncu
    does not report are left out. Ends the run with ncu's output when it
    reports nothing. cache_control "all": ncu flushes the caches before the
    launch; "none": the launch finds L2 as the script left it."""
    ncu = shutil.which("ncu") or "ncu"
    cmd = [ncu, "--clock-control", "none", "--cache-control", cache_control,
           "--kernel-name", f"regex:{kernel_regex}", "--launch-skip", "1",
           "--launch-count", "1", "--metrics", ",".join(metrics), "--csv", "--page", "raw",
           sys.executable, script, "--target", target]
    out = subprocess.run(cmd, capture_output=True, text=True)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith('"')]
    if len(lines) < 3:
        print(out.stdout[-2000:], out.stderr[-2000:], file=sys.stderr)
        raise SystemExit(f"ncu gave no counters for {script} --target {target}")
    header, units, values = (next(csv.reader([ln])) for ln in lines[:3])
    return {hd: (val, unit) for hd, unit, val in zip(header, units, values) if hd in metrics}


def counter_bytes(got: dict, metric: str) -> float:
    """A byte counter of second_launch's answer in bytes (ncu scales each
    counter's unit on its own: Mbyte beside Gbyte)."""
    from experiments.validation.ncu import unit_scale

    value, unit = got[metric]
    return float(value.replace(",", "")) * unit_scale(unit)


def fa2_spec(block_m: int, block_n: int, warps: int, stages: int, causal: int) -> str:
    """The --target argument naming one fa2 config (fa2_launch reads it back)."""
    return f"{block_m}x{block_n}x{warps}x{stages}x{causal}"


def fa2_launch(spec: str, shape: dict) -> None:
    """Runs under ncu: fa2 of config `spec` (fa2_spec) on `shape` (batch,
    heads, seqlen, head_dim), launched twice: the first compiles outside the
    profiled launch, the second is the one second_launch reads."""
    import torch

    from algorithms.problem import TileConfig
    from kernels import fa2

    bm, bn, w, s, causal = map(int, spec.split("x"))
    b, h, n, d = shape["batch"], shape["heads"], shape["seqlen"], shape["head_dim"]
    q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    cfg = TileConfig(block_m=bm, block_n=bn, num_warps=w, num_stages=s)
    for _ in range(2):
        fa2.forward(q, k, v, causal=bool(causal), config=cfg)
        torch.cuda.synchronize()


def fa2_counter_rows(script: str, configs, shape: dict, metrics: list[str], command: str, units: bool):
    """Yields a row a config of `configs` ((block_m, block_n, warps, stages,
    causal) each): its counters under ncu, from the second launch of _fa2_fwd
    that `script --target` makes (fa2_launch; the first compiles), beside the
    config, the shape and the provenance. units: each metric's unit as a
    column of its own (`<metric>.unit`)."""
    from kernels.provenance import provenance

    for bm, bn, w, s, causal in configs:
        got = second_launch(script, fa2_spec(bm, bn, w, s, causal), "_fa2_fwd", metrics)
        row = {"block_m": bm, "block_n": bn, "num_warps": w, "num_stages": s, **shape, "causal": causal}
        for m in metrics:
            value, unit = got.get(m, ("", ""))
            row[m] = value
            if units:
                row[m + ".unit"] = unit
        row.update(provenance(command=command))
        yield row
