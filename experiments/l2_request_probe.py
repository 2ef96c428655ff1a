"""Where do fa2's K/V requests go between the SM and L2? Nsight Compute counters
for the ncu cases of fa2 and Triton's fa3 (experiments/validate.py ncu_cases).

The report compares the model's L2 read bytes (every K/V tile a CTA copies)
with ncu's lts__t_sectors_srcunit_tex_op_read x 32. On the causal cases they
agree within 10%; on the non-causal ones ncu counts 26-45% fewer
(validation_report.md, session 16). This probe reads the same kernels' bytes
at each stage of the path -- what the SMs' copies ask for (L1TEX's
cp.async sectors), what comes back over the crossbar, what the L2 request
coalescer (lrc__, where this ncu has it) and the L2 slices see -- to tell
requests merged on the way from requests never made. Counters, not timings;
nothing here feeds a profile.

    PYTHONPATH=. python3 experiments/l2_request_probe.py [--out $OUT/l2_request_probe_h100.csv]   (GPU)

No simulator import (runs where simpy is absent).
"""
from __future__ import annotations

import argparse
import csv
import os
import re
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from experiments.ncu_counters import second_launch  # noqa: E402
from kernels.provenance import provenance, write_csv_atomic  # noqa: E402
from experiments import gpu_probe  # noqa: E402

# Counters by the stage of the path they count, where this ncu has them
# (base names; .sum is read). Missing ones are left out and listed.
WANTED = [
    "lts__t_sectors_srcunit_tex_op_read",       # what the report compares with
    "lts__t_requests_srcunit_tex_op_read",
    "lts__t_sectors_srcunit_tex_op_read_lookup_hit",
    "l1tex__m_xbar2l1tex_read_bytes",           # bytes back from L2 over the crossbar
    "l1tex__t_sectors_pipe_lsu_mem_global_op_ldgsts",            # cp.async, at L1TEX
    "l1tex__t_sectors_pipe_lsu_mem_global_op_ldgsts_lookup_hit",
    "smsp__inst_executed_op_ldgsts",
    "dram__bytes_read",
    "gpu__time_duration",
]
LRC_PATTERN = re.compile(r"^lrc__\S*(sectors|requests)\S*")
MAX_LRC = 8
ALGOS = ("fa2", "fa3")      # the ncu cases' fa3 rows run Triton's kernels/fa3.py (fa3_triton)
NCU_ROWS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "ncu_h100.csv")


def cases():
    """The committed ncu rows of ALGOS, with the configs they ran."""
    from algorithms.problem import AttentionProblem, TileConfig

    out = []
    with open(NCU_ROWS, newline="") as f:
        for r in csv.DictReader(f):
            if r["algo"] in ALGOS:
                p = AttentionProblem(batch=int(r["batch"]), heads=int(r["heads"]), seqlen_q=int(r["seqlen"]),
                                     head_dim=int(r["head_dim"]), causal=r["causal"] == "1")
                cfg = TileConfig(block_m=int(r["block_m"]), block_n=int(r["block_n"]),
                                 num_warps=int(r["num_warps"]), num_stages=int(r["num_stages"]))
                out.append((int(r["case"]), r["algo"], p, cfg))
    return out


def target(case: int) -> None:
    """Runs under ncu: ncu case `case`, launched twice (the first compiles)."""
    import torch

    from experiments.validation.measure import _call

    _, algo, p, cfg = next(c for c in cases() if c[0] == case)
    q, k, v = (torch.randn(p.batch, p.heads, p.seqlen_q, p.head_dim, device="cuda", dtype=torch.bfloat16)
               for _ in range(3))
    for _ in range(2):
        _call(algo, p.dtype, q, k, v, p.causal, cfg)
        torch.cuda.synchronize()


def available(ncu: str) -> tuple[list[str], list[str]]:
    """The WANTED counters this ncu knows, then its lrc__ sector/request counters."""
    out = subprocess.run([ncu, "--query-metrics"], capture_output=True, text=True).stdout
    names = {ln.split()[0] for ln in out.splitlines() if ln.strip() and not ln.startswith(("-", "Device"))}
    lrc = sorted(n for n in names if LRC_PATTERN.match(n))[:MAX_LRC]
    return [m for m in WANTED if m in names], lrc


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "l2_request_probe_h100.csv"))
    ap.add_argument("--target", type=int, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.target is not None:
        target(a.target)
        return 0
    if gpu_probe.start("l2_request_probe.py", a.out, argv, ncu=True) is None:
        return 2
    ncu = shutil.which("ncu") or "ncu"
    known, lrc = available(ncu)
    missing = [m for m in WANTED if m not in known]
    print(f"counters: {known + lrc}; not in this ncu: {missing}", flush=True)
    metrics = [m + ".sum" for m in known + lrc]
    rows = []
    for index, algo, p, cfg in cases():
        kernel = "_fa2_fwd" if algo == "fa2" else "_fa3_fwd"
        got = second_launch(os.path.abspath(__file__), str(index), kernel, metrics)
        row = {"case": index, "algo": "fa3_triton" if algo == "fa3" else algo, "batch": p.batch,
               "heads": p.heads, "seqlen": p.seqlen_q, "head_dim": p.head_dim, "causal": int(p.causal),
               "block_m": cfg.block_m, "block_n": cfg.block_n, "num_warps": cfg.num_warps,
               "num_stages": cfg.num_stages}
        for m in metrics:
            row[m], row[m + ".unit"] = got.get(m, ("", ""))
        row.update(provenance(command="PYTHONPATH=. python3 experiments/l2_request_probe.py"))
        rows.append(row)
        print(row, flush=True)
    write_csv_atomic(a.out, rows, list(rows[0]))
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
