"""`validate.py ncu` (GPU machine): DRAM and L2 bytes of a representative subset
under Nsight Compute (--clock-control none), every case in one profiled
process fenced by marker kernels; `ncu-parse` rebuilds the CSV from ncu's raw
export.
"""
from __future__ import annotations

import csv
import os
import subprocess
import sys
import time

from algorithms.errors import ResultsFileError
from algorithms.problem import AttentionProblem
from kernels.provenance import provenance, write_csv_atomic

from . import ROOT
from .measure import _call
from .suite import HEAD_DIMS, HIDDEN, PROV, TOKENS, log


# L2 reads at both ends of the crossbar: the sectors the L2 slices look up for
# the SMs (lts__t_sectors_srcunit_tex_op_read) and the bytes the SMs receive
# (l1tex__m_xbar2l1tex_read_bytes). They differ by what the L2 request
# coalescer merges: requests of several SMs for one sector in flight at once
# (experiments/l2_request_probe.py: 26-48% of fa2's and Triton fa3's reads
# non-causal, 6-10% causal).
NCU_METRICS = ("dram__bytes_read.sum", "dram__bytes_write.sum", "lts__t_sectors_srcunit_tex_op_read.sum",
               "lts__t_sectors_op_read.sum", "l1tex__m_xbar2l1tex_read_bytes.sum", "gpu__time_duration.sum")

NCU_COLUMNS = (["case", "algo", "dtype", "batch", "heads", "seqlen", "head_dim", "causal", "block_m",
                "block_n", "num_warps", "num_stages", "kernels", "dram_read_bytes", "dram_write_bytes",
                "l2_read_bytes_from_sm", "l2_read_bytes_all", "sm_read_bytes_from_l2", "gpu_time_us", "status",
                "error"] + PROV)


def ncu_cases():
    from algorithms.defaults import default_config

    cases = []
    for algo in ("standard", "fa1", "fa2", "fa3"):
        for d in HEAD_DIMS:
            for causal in (False, True):
                n = 1024 if (causal ^ (d == 128)) else 4096
                if algo == "standard":  # S and P in HBM: keep them small under replay
                    n = min(n, 2048)
                p = AttentionProblem(batch=TOKENS // n, heads=HIDDEN // d, seqlen_q=n, head_dim=d, causal=causal)
                cases.append((algo, p, default_config(algo, p, hopper=True)))
    return cases


def cmd_ncu_target(args) -> int:
    """Runs under ncu: each case once, after a marker kernel whose grid is the case number + 1."""
    import torch
    import triton
    import triton.language as tl

    @triton.jit
    def _ncu_case_marker(X):
        tl.store(X + tl.program_id(0), 1.0)

    cases = ncu_cases()
    marker = torch.empty(len(cases) + 1, device="cuda")
    for i, (algo, p, cfg) in enumerate(cases):
        try:
            q, k, v = (torch.randn(p.batch, p.heads, p.seqlen_q, p.head_dim, device="cuda",
                                   dtype=torch.bfloat16) for _ in range(3))
            torch.cuda.synchronize()
            _ncu_case_marker[(i + 1,)](marker)
            _call(algo, p.dtype, q, k, v, p.causal, cfg)
            torch.cuda.synchronize()
            del q, k, v
        except Exception as e:
            log(f"[ncu-target] case {i} {algo}: {type(e).__name__}: {e}")
    _ncu_case_marker[(len(cases) + 1,)](marker)
    torch.cuda.synchronize()
    return 0

_PREFIX = {"": 1.0, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}
_TIME_NS = {"ns": 1.0, "nsecond": 1.0, "us": 1e3, "usecond": 1e3, "ms": 1e6, "msecond": 1e6,
            "s": 1e9, "second": 1e9}


def unit_scale(unit):
    """Factor to base units (bytes, sectors, nanoseconds) of an ncu unit such as Gbyte or ms."""
    u = (unit or "").strip()
    if u in _TIME_NS:
        return _TIME_NS[u]
    for base in ("byte", "sector"):
        if u.endswith(base) and u[: -len(base)] in _PREFIX:
            return _PREFIX[u[: -len(base)]]
    return 1.0


def parse_ncu_raw(text):
    """ncu --csv --page raw output -> list of dicts (one per profiled kernel); numeric values of
    the metrics we read are converted to bytes, sectors and nanoseconds with the units line."""
    lines = [ln for ln in text.splitlines() if ln.startswith('"')]
    if not lines:
        raise ResultsFileError("ncu produced no CSV rows")
    rdr = list(csv.reader(lines))
    head, body = rdr[0], rdr[1:]
    units = [""] * len(head)
    if body and (not body[0][0] or not body[0][0].strip().isdigit()):
        units, body = body[0], body[1:]
    out = []
    for r in body:
        d = dict(zip(head, r))
        for i, name in enumerate(head):
            if name in NCU_METRICS and i < len(r):
                d[name] = _num(r[i]) * unit_scale(units[i] if i < len(units) else "")
        out.append(d)
    return out


def _num(s):
    try:
        return float(str(s).replace(",", ""))
    except ValueError:
        return float("nan")


def group_ncu(kernels, n_cases):
    """Sum each case's kernels: a marker with grid (i+1) opens case i."""
    per = {}
    cur = None
    for kr in kernels:
        name = kr.get("Kernel Name", "")
        grid = kr.get("launch__grid_size") or kr.get("Grid Size", "")
        if "_ncu_case_marker" in name:
            g = int(_num(grid)) if str(grid).replace(".", "").isdigit() else int(_num(str(grid).strip("()").split(",")[0]))
            cur = g - 1 if g - 1 < n_cases else None
            continue
        if cur is None:
            continue
        agg = per.setdefault(cur, {"kernels": [], **{m: 0.0 for m in NCU_METRICS}})
        agg["kernels"].append(name.split("(")[0])
        for m in NCU_METRICS:
            agg[m] += _num(kr.get(m, "nan"))
    return per


def cmd_ncu(args) -> int:
    import shutil
    import tempfile

    from experiments import gpu_probe

    if gpu_probe.start("validate.py", args.out, None, ncu=True) is None:
        return 2
    t0 = time.time()
    command = "PYTHONPATH=. python3 experiments/validate.py " + " ".join(sys.argv[1:])
    prov = provenance(command)
    cases = ncu_cases()
    rows = []
    ncu = shutil.which("ncu") or "ncu"
    with tempfile.TemporaryDirectory() as d:
        rep = os.path.join(d, "rep")
        cmd = [ncu, "--clock-control", "none", "--metrics", ",".join(NCU_METRICS + ("launch__grid_size",)),
               "--kernel-name-base", "function", "--kernel-name", "regex:^_", "--target-processes", "all",
               "--export", rep, "--force-overwrite", sys.executable, os.path.join(ROOT, "experiments", "validate.py"), "ncu-target"]
        log(f"[validate] {' '.join(cmd)}")
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout_s, cwd=ROOT)
        log(r.stdout[-3000:] + r.stderr[-3000:])
        imp = subprocess.run([ncu, "--import", rep + ".ncu-rep", "--csv", "--page", "raw"],
                             capture_output=True, text=True, timeout=120)
        raw_path = os.path.join(os.path.dirname(os.path.abspath(args.out)), "ncu_h100_raw.csv")
        with open(raw_path, "w") as f:
            f.write(imp.stdout)
        per = group_ncu(parse_ncu_raw(imp.stdout), len(cases))
    rows = ncu_rows_from(per, cases, prov)
    write_csv_atomic(args.out, rows, NCU_COLUMNS)
    log(f"[validate] wrote {args.out} ({sum(r['status'] == 'ok' for r in rows)}/{len(rows)} ok) "
        f"in {time.time() - t0:.0f} s")
    return 0


def ncu_rows_from(per, cases, prov):
    rows = []
    for i, (algo, p, cfg) in enumerate(cases):
        row = {"case": i, "algo": algo, "dtype": p.dtype, "batch": p.batch, "heads": p.heads,
               "seqlen": p.seqlen_q, "head_dim": p.head_dim, "causal": int(p.causal), "block_m": cfg.block_m,
               "block_n": cfg.block_n, "num_warps": cfg.num_warps, "num_stages": cfg.num_stages, **prov}
        agg = per.get(i)
        if not agg or not agg["kernels"]:
            row.update(status="error", error="no profiled kernel for this case")
        else:
            row.update(kernels="+".join(agg["kernels"]),
                       dram_read_bytes=f"{agg['dram__bytes_read.sum']:.0f}",
                       dram_write_bytes=f"{agg['dram__bytes_write.sum']:.0f}",
                       l2_read_bytes_from_sm=f"{agg['lts__t_sectors_srcunit_tex_op_read.sum'] * 32:.0f}",
                       l2_read_bytes_all=f"{agg['lts__t_sectors_op_read.sum'] * 32:.0f}",
                       sm_read_bytes_from_l2=f"{agg['l1tex__m_xbar2l1tex_read_bytes.sum']:.0f}",
                       gpu_time_us=f"{agg['gpu__time_duration.sum'] / 1e3:.1f}", status="ok", error="")
        rows.append(row)
    return rows


def cmd_ncu_parse(args) -> int:
    """Rebuild the ncu CSV from the raw export (CPU), keeping the provenance of the run."""
    with open(args.raw) as f:
        per = group_ncu(parse_ncu_raw(f.read()), len(ncu_cases()))
    prov = {}
    if os.path.exists(args.out):
        with open(args.out, newline="") as f:
            first = next(csv.DictReader(f), None)
        prov = {k: (first or {}).get(k, "") for k in PROV}
    rows = ncu_rows_from(per, ncu_cases(), prov)
    write_csv_atomic(args.out, rows, NCU_COLUMNS)
    log(f"[validate] rebuilt {args.out} from {args.raw}")
    return 0
