"""Validate the simulator against the Triton kernels on a real GPU.

    # GPU machine (imports algorithms/ and kernels/ only: no simpy there)
    PYTHONPATH=. python3 experiments/validate.py measure [--quick] [--budget-s 300] [--out CSV]
    PYTHONPATH=. python3 experiments/validate.py ncu [--out experiments/results/ncu_h100.csv]
    # CPU
    PYTHONPATH=. python experiments/validate.py report [--gpu h100 --gpu h100.measured]

measure: every kernel of the suite (standard, fa1, fa2, fa3, fa3 fp8) with its default config,
and fa2 with every config of block_m {64,128} x block_n {32,64,128} x warps {4,8} x stages
{2,3,4} that fits, over head_dim {64,128} x N {512..16384} at 16k tokens (batch = 16384/N,
heads = 2048/head_dim), causal and not, bf16. Time: triton.testing.do_bench median (it
flushes L2 between calls) on random N(0,1) inputs rotated over two sets (192 MB each, more
than the 50 MB L2). Each row's output is checked against torch SDPA first. Failures are
rows with a status, not exceptions. The CSV is rewritten atomically as rows come in;
--budget-s stops cleanly before a deadline.

ncu: DRAM bytes read/written and L2 read sectors from the SMs for a representative subset,
under Nsight Compute with --clock-control none (one process; each case fenced by a marker
kernel whose grid size is the case number).

report: predicts every measured row with gpusim.predict on each profile and writes
experiments/results/validation_report.md (+ validation_*.png). No model parameter is fitted
to these timings.
"""
from __future__ import annotations

import argparse
import csv
import json
import math
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from algorithms.errors import GpusimError, ResultsFileError  # noqa: E402
from algorithms.problem import AttentionProblem, TileConfig  # noqa: E402
from kernels.gpu_monitor import GpuMonitor  # noqa: E402
from kernels.provenance import nvidia_smi, provenance, write_csv_atomic  # noqa: E402

RESULTS = os.path.join(ROOT, "experiments", "results")
DEFAULT_OUT = os.path.join(RESULTS, "validation_h100.csv")
DEFAULT_NCU = os.path.join(RESULTS, "ncu_h100.csv")
DEFAULT_REPORT = os.path.join(RESULTS, "validation_report.md")
DEFAULT_BOUNDS = os.path.join(RESULTS, "validation_bounds.json")
DEFAULT_GLUON = os.path.join(RESULTS, "kernels_bench_fa3_gluon.csv")
# The schedule that replays each measured kernel, where it is not the kernel's own
# name: Triton 3.6 does not warp-specialise kernels/fa3.py on sm_90, so it runs
# fa2's structure with TMA copies (algorithms/fa3_triton.py), not FA3's schedule;
# FA3's schedule is checked against kernels/fa3_gluon.py, which runs it (gluon_rows).
KERNEL_SCHEDULE = {"fa3": "fa3_triton"}
H100_SMEM_PER_BLOCK = 232448

TOKENS, HIDDEN = 16384, 2048
SEQLENS = (512, 1024, 2048, 4096, 8192, 16384)
HEAD_DIMS = (64, 128)
FA2_GRID = dict(block_m=(64, 128), block_n=(32, 64, 128), num_warps=(4, 8), num_stages=(2, 3, 4))

PROV = ["gpu", "sm_clock_mhz", "driver", "torch", "triton", "git_commit", "date", "command"]
COLUMNS = (["algo", "dtype", "batch", "heads", "kv_heads", "seqlen", "head_dim", "causal",
            "block_m", "block_n", "num_warps", "num_stages", "block_k", "consumer_warpgroups",
            "pingpong", "intra_wg_overlap", "mma", "default_config", "ms", "ms_p20", "ms_p80",
            "tflops", "rel_err", "status", "error",
            # NVML over the row's do_bench (kernels/gpu_monitor.py, blank before session 29): the SM
            # clock NVML reports, the board's power, the share of samples the power cap held the
            # clock. NVML's clock is not what the SMs count under load: fa2 rows read 1980 MHz there
            # while their SMs count 1755-1790 cycles a µs (clock_span_h100.csv, validation_notes.md)
            "run_clock_mhz", "run_power_w", "run_power_cap_share"] + PROV)
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

TARGETS = {"mape": 0.10, "mape_goal": 0.05, "spearman": 0.8, "spearman_goal": 0.9, "top1_loss": 0.05,
           "hbm_bytes": 0.10, "l2_bytes": 0.15}


def log(msg):
    print(msg, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------
# the sweep
# ---------------------------------------------------------------------------
def shapes(quick=False):
    seqlens = (1024, 4096, 16384) if quick else SEQLENS
    out = []
    for d in HEAD_DIMS:
        for causal in (False, True):
            for n in seqlens:
                out.append(AttentionProblem(batch=TOKENS // n, heads=HIDDEN // d, seqlen_q=n, head_dim=d,
                                            causal=causal, dtype="bf16"))
    return out


def fa2_configs(problem, quick=False):
    """Every fa2 config of the grid that fits the H100's SMEM per block (algorithms.check)."""
    import algorithms
    import itertools

    grid = FA2_GRID if not quick else dict(block_m=(64, 128), block_n=(32, 64, 128), num_warps=(4, 8),
                                           num_stages=(3,))
    out = []
    for bm, bn, w, s in itertools.product(*grid.values()):
        cfg = TileConfig(block_m=bm, block_n=bn, num_warps=w, num_stages=s)
        try:
            algorithms.check("fa2", problem, cfg, H100_SMEM_PER_BLOCK)
        except GpusimError:
            continue
        out.append(cfg)
    return out


def suite_cases(quick=False):
    """(algo, problem, config, is_default) in the order they are measured: first every algorithm's
    default config on every shape (so a cut-short run still covers every algorithm), then the
    fa2 config sweep shape by shape."""
    from algorithms.defaults import default_config

    first, sweep = [], []
    for p in shapes(quick):
        for algo in ("standard", "fa1", "fa2", "fa3"):
            first.append((algo, p, default_config(algo, p, hopper=True), True))
        p8 = p.with_(dtype="fp8")
        first.append(("fa3", p8, default_config("fa3", p8, hopper=True), True))
    for p in shapes(quick):
        dflt = default_config("fa2", p, hopper=True)
        for cfg in fa2_configs(p, quick):
            if cfg != dflt:
                sweep.append(("fa2", p, cfg, False))
    return first + sweep


def _row(algo, p, cfg, is_default, prov):
    r = {"algo": algo, "dtype": p.dtype, "batch": p.batch, "heads": p.heads, "kv_heads": p.kv_heads,
         "seqlen": p.seqlen_q, "head_dim": p.head_dim, "causal": int(p.causal), "block_m": cfg.block_m,
         "block_n": cfg.block_n, "num_warps": cfg.num_warps, "num_stages": cfg.num_stages,
         "block_k": cfg.block_k, "consumer_warpgroups": cfg.consumer_warpgroups,
         "pingpong": int(cfg.pingpong), "intra_wg_overlap": int(cfg.intra_wg_overlap), "mma": cfg.mma,
         "default_config": int(is_default), "ms": "", "ms_p20": "", "ms_p80": "", "tflops": "",
         "rel_err": "", "status": "", "error": "", "run_clock_mhz": "", "run_power_w": "",
         "run_power_cap_share": ""}
    r.update(prov)
    return r


def _compile_worker(tasks):
    """Run each (algo, D, causal, dtype, cfg) once on a tiny problem with the sweep's
    specialisation (same heads, lengths divisible by 16) so Triton's disk cache holds the
    binary before the timing process asks for it."""
    import torch
    out = []
    for algo, d, causal, dtype, cfgd in tasks:
        cfg = TileConfig(**cfgd)
        try:
            q, k, v = (torch.randn(1, HIDDEN // d, 512, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
            _call(algo, dtype, q, k, v, causal, cfg)
            torch.cuda.synchronize()
            out.append("ok")
        except Exception as e:  # recorded by the timing pass, which hits the same error
            out.append(f"{type(e).__name__}: {str(e)[:200]}")
    return out


def precompile(cases, workers):
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    seen, tasks = set(), []
    for algo, p, cfg, _ in cases:
        key = (algo, p.head_dim, p.causal, p.dtype, cfg)
        if key not in seen:
            seen.add(key)
            tasks.append((algo, p.head_dim, p.causal, p.dtype, cfg.__dict__.copy()))
    chunks = [tasks[i::workers] for i in range(workers)]
    t0 = time.time()
    try:
        with ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn")) as ex:
            res = list(ex.map(_compile_worker, [c for c in chunks if c]))
        n_ok = sum(x == "ok" for r in res for x in r)
        log(f"[validate] precompiled {n_ok}/{len(tasks)} kernels in {time.time() - t0:.0f} s with {workers} workers")
    except Exception as e:
        log(f"[validate] precompile failed ({e}); compiling on demand")


def _quant(q, k, v, cfg):
    from kernels import fa3
    q8, qs = fa3.quantize_fp8(q, cfg.block_m)
    k8, ks = fa3.quantize_fp8(k, cfg.block_n)
    v8, vs = fa3.quantize_fp8(v, cfg.block_n, transpose=True)
    return q8, k8, v8, (qs, ks, vs)


def _call(algo, dtype, q, k, v, causal, cfg, quantised=None):
    import importlib
    if dtype == "fp8":
        from kernels import fa3
        q8, k8, v8, sc = quantised or _quant(q, k, v, cfg)
        return fa3.forward_fp8(q8, k8, v8, causal=causal, config=cfg, scales=sc)
    mod = importlib.import_module(f"kernels.{algo}")
    return mod.forward(q, k, v, causal=causal, config=cfg)


def cmd_measure(args) -> int:
    from experiments import gpu_probe

    if gpu_probe.start("validate.py", args.out, None) is None:
        return 2
    import torch
    import triton

    t0 = time.time()
    deadline = t0 + args.budget_s if args.budget_s else None
    command = "PYTHONPATH=. python3 experiments/validate.py " + " ".join(sys.argv[1:])
    prov = provenance(command)
    cases = suite_cases(args.quick)
    if args.algos:
        keep = set(args.algos.split(","))
        cases = [c for c in cases if c[0] in keep]
    if args.limit:
        cases = cases[: args.limit]
    log(f"[validate] {len(cases)} rows on {prov['gpu']} (driver {prov['driver']}, SM clock {prov['sm_clock_mhz']} MHz)")
    if args.precompile_workers > 0:
        precompile(cases, args.precompile_workers)
    rows, inputs_key, inputs, ref = [], None, None, None
    last_write = time.time()
    monitor = GpuMonitor.open()
    if monitor is None:
        log("[validate] NVML unavailable: rows get no run_clock_mhz")
    else:
        monitor.start()
    gen = torch.Generator(device="cuda")
    for i, (algo, p, cfg, is_default) in enumerate(cases):
        if deadline and time.time() > deadline - args.margin_s:
            log(f"[validate] budget reached after {i} of {len(cases)} rows; stopping")
            break
        row = _row(algo, p, cfg, is_default, prov)
        key = (p.batch, p.heads, p.seqlen_q, p.head_dim, p.causal)
        try:
            if key != inputs_key:
                inputs = ref = None
                torch.cuda.empty_cache()
                gen.manual_seed(hash(key) & 0xFFFF)
                inputs = [tuple(torch.randn(p.batch, p.heads, p.seqlen_q, p.head_dim, generator=gen,
                                            device="cuda", dtype=torch.float32).to(torch.bfloat16)
                                for _ in range(3)) for _ in range(2)]
                q, k, v = inputs[0]
                ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=p.causal).float()
                inputs_key = key
            quant = [_quant(*x, cfg) for x in inputs] if p.dtype == "fp8" else [None, None]
            out = _call(algo, p.dtype, *inputs[0], p.causal, cfg, quant[0]).float()
            rel = float((out - ref).norm() / ref.norm())
            del out
            row["rel_err"] = f"{rel:.3g}"
            tol = 0.1 if p.dtype == "fp8" else 2e-2
            if not math.isfinite(rel) or rel > tol:
                row["status"], row["error"] = "wrong", f"relative error {rel:.3g} vs SDPA exceeds {tol}"
            else:
                state = {"i": 0}

                def fn():
                    state["i"] ^= 1
                    return _call(algo, p.dtype, *inputs[state["i"]], p.causal, cfg, quant[state["i"]])

                # at least ~8 timed calls even for the slowest kernels (do_bench sizes its
                # repetitions from rep / estimated time)
                ev0, ev1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                ev0.record()
                fn()
                ev1.record()
                ev1.synchronize()
                est = ev0.elapsed_time(ev1)
                rep = min(max(args.rep_ms, 8 * est), 2000)
                t_bench = time.perf_counter()
                ms, p20, p80 = triton.testing.do_bench(fn, warmup=args.warmup_ms, rep=rep,
                                                       quantiles=[0.5, 0.2, 0.8])
                if monitor is not None:
                    w = monitor.window(t_bench, time.perf_counter())
                    row.update(run_clock_mhz=w["clock_mhz"], run_power_w=w["power_w"],
                               run_power_cap_share=w["power_cap_share"])
                row.update(ms=f"{ms:.5g}", ms_p20=f"{p20:.5g}", ms_p80=f"{p80:.5g}",
                           tflops=f"{p.reference_flops() / (ms * 1e-3) / 1e12:.4g}", status="ok")
            del quant
        except Exception as e:
            msg = " ".join(str(e).split())[:300]
            row["status"] = "does_not_fit" if "out of resource" in msg.lower() else "error"
            row["error"] = f"{type(e).__name__}: {msg}"
            if "out of memory" in msg.lower():
                inputs_key = inputs = ref = None
                torch.cuda.empty_cache()
        rows.append(row)
        log(f"[validate] {i + 1}/{len(cases)} {algo:<8} {p.dtype} D={p.head_dim:<3} N={p.seqlen_q:<5} "
            f"causal={int(p.causal)} {cfg.block_m}x{cfg.block_n}x{cfg.num_warps}x{cfg.num_stages} "
            f"{row['status']:<6} {row['ms'] or '':>9} ms {row['tflops'] or '':>6} TF/s  "
            f"err {row['rel_err']} {row['error'][:80]}  [{time.time() - t0:.0f} s]")
        if time.time() - last_write > 15:
            write_csv_atomic(args.out, rows, COLUMNS)
            last_write = time.time()
    if monitor is not None:
        monitor.stop()
    clock_end = nvidia_smi("clocks.sm")
    for r in rows:
        r["sm_clock_mhz"] = f"{r['sm_clock_mhz']}->{clock_end}" if clock_end else r["sm_clock_mhz"]
    write_csv_atomic(args.out, rows, COLUMNS)
    n_ok = sum(r["status"] == "ok" for r in rows)
    log(f"[validate] wrote {args.out}: {len(rows)} rows, {n_ok} ok, in {time.time() - t0:.0f} s")
    return 0


# ---------------------------------------------------------------------------
# ncu
# ---------------------------------------------------------------------------
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
               "--export", rep, "--force-overwrite", sys.executable, os.path.abspath(__file__), "ncu-target"]
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


# ---------------------------------------------------------------------------
# metrics (pure Python + numpy; unit-tested in tests/test_validation.py)
# ---------------------------------------------------------------------------
def abs_pct_errors(pred, meas):
    if len(pred) != len(meas):
        raise ValueError("pred and meas differ in length")
    out = []
    for p, m in zip(pred, meas):
        if not (m > 0) or not math.isfinite(p):
            raise ValueError(f"cannot compare prediction {p} with measurement {m}")
        out.append(abs(p - m) / m)
    return out


def mape(pred, meas):
    e = abs_pct_errors(pred, meas)
    return sum(e) / len(e) if e else float("nan")


def error_summary(pred, meas):
    e = abs_pct_errors(pred, meas)
    if not e:
        return {"n": 0, "mape": float("nan"), "median": float("nan"), "max": float("nan"), "bias": float("nan")}
    signed = [(p - m) / m for p, m in zip(pred, meas)]
    return {"n": len(e), "mape": sum(e) / len(e), "median": statistics.median(e), "max": max(e),
            "bias": sum(signed) / len(signed)}


def ranks(xs):
    """Average ranks (1-based), ties sharing the mean of their positions."""
    order = sorted(range(len(xs)), key=lambda i: xs[i])
    r = [0.0] * len(xs)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and xs[order[j + 1]] == xs[order[i]]:
            j += 1
        avg = (i + j) / 2 + 1
        for k in range(i, j + 1):
            r[order[k]] = avg
        i = j + 1
    return r


def spearman(x, y):
    """Spearman's rank correlation (Pearson of average ranks); nan when undefined."""
    if len(x) != len(y):
        raise ValueError("x and y differ in length")
    n = len(x)
    if n < 2:
        return float("nan")
    rx, ry = ranks(list(x)), ranks(list(y))
    mx, my = sum(rx) / n, sum(ry) / n
    sxy = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    sxx = sum((a - mx) ** 2 for a in rx)
    syy = sum((b - my) ** 2 for b in ry)
    if sxx == 0 or syy == 0:
        return float("nan")
    return sxy / math.sqrt(sxx * syy)


def top1_loss(pred, meas):
    """Measured time of the config the model ranks first over the best measured time, minus 1.
    Ties in the prediction go to the first listed."""
    if not pred or len(pred) != len(meas):
        raise ValueError("need equally long, non-empty pred and meas")
    best_pred = min(range(len(pred)), key=lambda i: (pred[i], i))
    return meas[best_pred] / min(meas) - 1.0


# ---------------------------------------------------------------------------
# loading
# ---------------------------------------------------------------------------
REQUIRED = ["algo", "dtype", "batch", "heads", "seqlen", "head_dim", "causal", "block_m", "block_n",
            "num_warps", "num_stages", "ms", "status"]
NCU_REQUIRED = ["algo", "dtype", "batch", "heads", "seqlen", "head_dim", "causal", "block_m", "block_n",
                "num_warps", "num_stages", "dram_read_bytes", "dram_write_bytes", "l2_read_bytes_from_sm",
                "status"]


def _read(path, required):
    if not os.path.isfile(path):
        raise ResultsFileError(f"{path}: no such results file (run `validate.py measure` on the GPU machine)")
    try:
        with open(path, newline="") as f:
            rows = list(csv.DictReader(f))
            header = rows[0].keys() if rows else (csv.DictReader(open(path)).fieldnames or [])
    except (csv.Error, UnicodeDecodeError) as e:
        raise ResultsFileError(f"{path}: not a readable CSV ({e})") from None
    missing = [c for c in required if c not in (header or [])]
    if missing:
        raise ResultsFileError(f"{path}: missing column(s) {', '.join(missing)}")
    return rows


def _int(row, key, path, lineno):
    try:
        return int(row[key])
    except (TypeError, ValueError):
        raise ResultsFileError(f"{path}: line {lineno}: {key} = {row.get(key)!r} is not an integer") from None


def problem_config(row, path="?", lineno=0):
    """(algo, AttentionProblem, TileConfig) of a results row."""
    def opt(key, default, conv=int):
        v = row.get(key, "")
        return conv(v) if v not in ("", None) else default

    try:
        kvh = opt("kv_heads", None)
        p = AttentionProblem(batch=_int(row, "batch", path, lineno), heads=_int(row, "heads", path, lineno),
                             kv_heads=kvh, seqlen_q=_int(row, "seqlen", path, lineno),
                             head_dim=_int(row, "head_dim", path, lineno),
                             causal=bool(_int(row, "causal", path, lineno)), dtype=row["dtype"])
        cfg = TileConfig(block_m=_int(row, "block_m", path, lineno), block_n=_int(row, "block_n", path, lineno),
                         num_warps=_int(row, "num_warps", path, lineno),
                         num_stages=_int(row, "num_stages", path, lineno), block_k=opt("block_k", 64),
                         consumer_warpgroups=opt("consumer_warpgroups", 2),
                         pingpong=bool(opt("pingpong", 1)), intra_wg_overlap=bool(opt("intra_wg_overlap", 1)),
                         mma=row.get("mma") or "auto")
    except GpusimError as e:
        if isinstance(e, ResultsFileError):
            raise
        raise ResultsFileError(f"{path}: line {lineno}: {e}") from None
    return KERNEL_SCHEDULE.get(row["algo"], row["algo"]), p, cfg


def _ms(row, path, lineno) -> float:
    try:
        ms = float(row["ms"])
    except ValueError:
        raise ResultsFileError(f"{path}: line {lineno}: ms = {row['ms']!r} is not a number") from None
    if not (ms > 0 and math.isfinite(ms)):
        raise ResultsFileError(f"{path}: line {lineno}: ms = {row['ms']!r} must be positive")
    return ms


def gluon_rows(path=DEFAULT_GLUON):
    """The Gluon FA3 kernel's measured rows (kernels.bench CSV, ok bf16 rows of
    kernel fa3_gluon) as validation rows of the FA3 schedule at the kernel's own
    default config; [] without the file."""
    if not os.path.exists(path):
        return []
    from kernels.fa3_gluon import default_config

    out = []
    for lineno, r in enumerate(_read(path, ("kernel", "status", "dtype", "batch", "heads", "seqlen",
                                            "head_dim", "causal", "ms")), start=2):
        if r["kernel"] != "fa3_gluon" or r["status"] != "ok" or r["dtype"] != "bf16":
            continue
        p = AttentionProblem(batch=_int(r, "batch", path, lineno), heads=_int(r, "heads", path, lineno),
                             seqlen_q=_int(r, "seqlen", path, lineno),
                             head_dim=_int(r, "head_dim", path, lineno),
                             causal=bool(_int(r, "causal", path, lineno)))
        ms = _ms(r, path, lineno)
        out.append({**r, "algo": "fa3", "kernel": "fa3_gluon", "problem": p, "config": default_config(p),
                    "ms": ms, "default_config": True})
    return out


def load_measurements(path=DEFAULT_OUT):
    """Rows with status ok, each with 'problem', 'config', 'ms' parsed; ResultsFileError on a
    missing or malformed file."""
    rows = _read(path, REQUIRED)
    out = []
    for lineno, r in enumerate(rows, start=2):
        if r["status"] != "ok":
            continue
        algo, p, cfg = problem_config(r, path, lineno)
        ms = _ms(r, path, lineno)
        out.append({**r, "algo": algo, "kernel": r["algo"], "problem": p, "config": cfg, "ms": ms,
                    "default_config": r.get("default_config", "0") in ("1", "True", "true")})
    if not out:
        raise ResultsFileError(f"{path}: no row with status ok")
    return out


def load_ncu(path=DEFAULT_NCU):
    rows = _read(path, NCU_REQUIRED)
    out = []
    for lineno, r in enumerate(rows, start=2):
        if r["status"] != "ok":
            continue
        algo, p, cfg = problem_config(r, path, lineno)
        vals = {}
        # (sm_read_bytes_from_l2 since session 16: older files lack it)
        for k in ("dram_read_bytes", "dram_write_bytes", "l2_read_bytes_from_sm", "sm_read_bytes_from_l2"):
            if k == "sm_read_bytes_from_l2" and not r.get(k):
                vals[k] = float("nan")
                continue
            try:
                vals[k] = float(r[k])
            except ValueError:
                raise ResultsFileError(f"{path}: line {lineno}: {k} = {r[k]!r} is not a number") from None
        out.append({**r, **vals, "algo": algo, "problem": p, "config": cfg})
    return out


def shape_key(p):
    return (p.head_dim, int(p.causal), p.seqlen_q, p.dtype)


# ---------------------------------------------------------------------------
# report
# ---------------------------------------------------------------------------
def _predict_one(args):
    gpu, algo, p, cfg = args
    import gpusim
    try:
        pred = gpusim.predict(p, cfg, gpu, algo=algo)
        return {"runtime_us": pred.runtime_us, "hbm_read_bytes": pred.hbm_read_bytes,
                "hbm_write_bytes": pred.hbm_write_bytes, "l2_read_bytes": pred.l2_read_bytes,
                "l2_dirty_at_end_bytes": pred.l2_dirty_at_end_bytes,
                "bottleneck": pred.bottleneck, "error": ""}
    except Exception as e:  # a row the model cannot predict is reported, not fatal
        return {"runtime_us": None, "error": f"{type(e).__name__}: {' '.join(str(e).split())[:200]}"}


def _cost_estimate(row):
    """A prediction's cost grows with the tile steps simulated: submit the
    dearest first so that 16 workers do not wait on one N=16k row at the end."""
    p, c = row["problem"], row["config"]
    return p.batch * p.heads * p.seqlen_q * p.seqlen_kv / (c.block_m * c.block_n)


def predict_rows(rows, gpu, jobs=1, checkpoint=None, checkpoint_s=30.0):
    """Predictions aligned with rows. checkpoint(preds), where given, is called
    every checkpoint_s with the predictions made so far (None for the rest), so
    a run stopped at a time limit keeps its work for --reuse-predictions."""
    tasks = [(gpu, r["algo"], r["problem"], r["config"]) for r in rows]
    t0, out = time.time(), [None] * len(tasks)
    if jobs > 1 and len(tasks) > 20:
        from concurrent.futures import ProcessPoolExecutor, as_completed
        order = sorted(range(len(tasks)), key=lambda i: -_cost_estimate(rows[i]))
        last_save = time.time()
        with ProcessPoolExecutor(max_workers=jobs) as ex:
            futures = {ex.submit(_predict_one, tasks[i]): i for i in order}
            for n, fut in enumerate(as_completed(futures), 1):
                out[futures[fut]] = fut.result()
                if n % 100 == 0:
                    log(f"[report] {gpu}: {n}/{len(tasks)} predicted [{time.time() - t0:.0f} s]")
                if checkpoint and time.time() - last_save > checkpoint_s:
                    checkpoint(out)
                    last_save = time.time()
        return out
    for i, t in enumerate(tasks):
        out[i] = _predict_one(t)
    return out


PRED_FIELDS = ("runtime_us", "hbm_read_bytes", "hbm_write_bytes", "l2_read_bytes", "bottleneck", "error",
               "l2_dirty_at_end_bytes")


def _row_key(r):
    p, c = r["problem"], r["config"]
    return "|".join(str(x) for x in (r["algo"], p.dtype, p.batch, p.heads, p.seqlen_q, p.head_dim, int(p.causal),
                                     c.block_m, c.block_n, c.num_warps, c.num_stages))


def _kept_bounds(path: str, profile: str) -> dict:
    """The guard bounds already at `path` for `profile` ({} if none or unreadable)."""
    try:
        with open(path) as f:
            stored = json.load(f)
    except (OSError, ValueError):
        return {}
    return stored.get("bounds", {}) if stored.get("profile") == profile else {}


def predictions_path(profile, kind="validation", outdir=RESULTS):
    """Saved predictions live beside the report."""
    return os.path.join(outdir, f"{kind}_predictions_{profile.replace('.', '_')}.csv")


def _commit() -> str:
    """The commit whose model predicts: GPUSIM_GIT_COMMIT where the tree has no .git
    (a clean export), else git's HEAD."""
    commit = os.environ.get("GPUSIM_GIT_COMMIT", "")
    if commit:
        return commit
    try:
        return subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=10).stdout.strip()
    except Exception:
        return ""


def save_predictions(path, rows, preds, profile):
    """One line per row; a reused prediction keeps the commit it was made at."""
    commit = _commit()
    out = [{"key": _row_key(r), **{k: pr.get(k, "") if pr.get(k) is not None else "" for k in PRED_FIELDS},
            "profile": profile, "git_commit": pr.get("git_commit") or commit}
           for r, pr in zip(rows, preds) if pr is not None]  # None: not predicted yet (a checkpoint)
    write_csv_atomic(path, out, ["key", *PRED_FIELDS, "profile", "git_commit"])


def load_predictions(path, rows):
    """Predictions saved by an earlier report, aligned with rows: None for a
    row the file lacks; None for all without the file."""
    if not os.path.exists(path):
        return None
    with open(path, newline="") as f:
        saved = {r["key"]: r for r in csv.DictReader(f)}
    out = []
    for r in rows:
        s = saved.get(_row_key(r))
        if s is None:
            out.append(None)
            continue
        d = {k: s.get(k, "") for k in PRED_FIELDS}
        for k in ("runtime_us", "hbm_read_bytes", "hbm_write_bytes", "l2_read_bytes", "l2_dirty_at_end_bytes"):
            # (byte counts stay integers: rewritten as floats, every reused line changed)
            d[k] = (float(d[k]) if k == "runtime_us" else int(float(d[k]))) if d[k] not in ("", None) else None
        d["git_commit"] = s.get("git_commit", "")
        out.append(d)
    return out


def reuse_or_predict(path, rows, profile, jobs, reuse):
    """Predictions for rows: with reuse, those saved at path and the rows it
    lacks predicted now (delete a profile's lines of one algorithm to re-predict
    only them); without, all predicted. Saves the file when anything was
    predicted."""
    preds = load_predictions(path, rows) if reuse else None
    if preds is None:
        preds = [None] * len(rows)
    missing = [i for i, pr in enumerate(preds) if pr is None]
    if missing:
        if reuse and len(missing) < len(rows):
            log(f"[report] {profile}: {len(rows) - len(missing)} predictions reused, {len(missing)} to make")
        def checkpoint(done):
            for i, pr in zip(missing, done):
                if pr is not None:
                    preds[i] = pr
            save_predictions(path, rows, preds, profile)

        for i, pr in zip(missing, predict_rows([rows[i] for i in missing], profile, jobs, checkpoint)):
            preds[i] = pr
        save_predictions(path, rows, preds, profile)
    return preds


def algo_label(row):
    return f"{row['algo']}_fp8" if row["problem"].dtype == "fp8" else row["algo"]


def compute_metrics(rows, preds):
    """Errors per algorithm, fa2 ranking per shape. rows/preds aligned."""
    by_algo, by_algo_default = {}, {}
    failed = []
    for r, pr in zip(rows, preds):
        if pr.get("runtime_us") is None:
            failed.append((r, pr.get("error", "")))
            continue
        lab = algo_label(r)
        by_algo.setdefault(lab, ([], []))
        by_algo[lab][0].append(pr["runtime_us"] / 1e3)
        by_algo[lab][1].append(r["ms"])
        if r["default_config"]:
            by_algo_default.setdefault(lab, ([], []))
            by_algo_default[lab][0].append(pr["runtime_us"] / 1e3)
            by_algo_default[lab][1].append(r["ms"])
    errors = {a: error_summary(*v) for a, v in sorted(by_algo.items())}
    errors_default = {a: error_summary(*v) for a, v in sorted(by_algo_default.items())}
    allp = [x for v in by_algo.values() for x in v[0]]
    allm = [x for v in by_algo.values() for x in v[1]]
    overall = error_summary(allp, allm) if allp else None
    shapes_ = {}
    for r, pr in zip(rows, preds):
        if r["algo"] == "fa2" and r["problem"].dtype != "fp8" and pr.get("runtime_us") is not None:
            shapes_.setdefault(shape_key(r["problem"]), []).append((pr["runtime_us"] / 1e3, r["ms"], r))
    ranking = {}
    for k, items in sorted(shapes_.items()):
        if len(items) < 3:
            continue
        pp, mm = [x[0] for x in items], [x[1] for x in items]
        ranking[k] = {"n": len(items), "spearman": spearman(pp, mm), "top1_loss": top1_loss(pp, mm)}
    return {"errors": errors, "errors_default": errors_default, "overall": overall, "ranking": ranking,
            "failed": failed}


def ranking_summary(ranking):
    rhos = [v["spearman"] for v in ranking.values() if not math.isnan(v["spearman"])]
    losses = [v["top1_loss"] for v in ranking.values()]
    if not rhos:
        return {"n_shapes": 0}
    return {"n_shapes": len(ranking), "spearman_min": min(rhos), "spearman_median": statistics.median(rhos),
            "spearman_mean": sum(rhos) / len(rhos), "top1_loss_max": max(losses),
            "top1_loss_mean": sum(losses) / len(losses)}


def errors_by(rows, preds, group):
    """{group(row, prediction): (rows, mean signed error, MAPE)} over the
    predicted rows, groups in sorted order; group returns None to leave a
    row out. Errors are (predicted − measured) / measured."""
    acc: dict = {}
    for r, pr in zip(rows, preds):
        if pr is None or pr.get("runtime_us") is None:
            continue
        g = group(r, pr)
        if g is not None:
            acc.setdefault(g, []).append((pr["runtime_us"] / 1e3 - r["ms"]) / r["ms"])
    return {g: (len(e), sum(e) / len(e), sum(map(abs, e)) / len(e)) for g, e in sorted(acc.items())}


BYTE_COUNTS = ("hbm_read", "hbm_write", "hbm_write_in_run", "l2_read", "l2_slice_read")


def byte_metrics(ncu_rows, preds):
    out = []
    for r, pr in zip(ncu_rows, preds):
        if pr.get("runtime_us") is None and pr.get("hbm_read_bytes") is None:
            out.append({"row": r, "error": pr.get("error", "")})
            continue
        e = {"row": r, "error": ""}
        # The model's L2 reads are the bytes the SMs ask L2 for; the L2
        # slices look up fewer where the request coalescer merged requests
        # (NCU_METRICS): both ends are compared, the SMs' first.
        # HBM writes likewise: all the run's, and those made before it ends
        # (ncu counts no later write-back of what L2 still holds dirty)
        if pr.get("hbm_write_bytes") is not None and pr.get("l2_dirty_at_end_bytes") is not None:
            pr = {**pr, "hbm_write_in_run": pr["hbm_write_bytes"] - pr["l2_dirty_at_end_bytes"]}
        for name, pk, mk in (("hbm_read", "hbm_read_bytes", "dram_read_bytes"),
                             ("hbm_write", "hbm_write_bytes", "dram_write_bytes"),
                             ("hbm_write_in_run", "hbm_write_in_run", "dram_write_bytes"),
                             ("l2_read", "l2_read_bytes", "sm_read_bytes_from_l2"),
                             ("l2_slice_read", "l2_read_bytes", "l2_read_bytes_from_sm")):
            pv, mv = pr.get(pk), r.get(mk, float("nan"))
            e[name] = (pv, mv, (pv - mv) / mv if pv is not None and mv > 0 else float("nan"))
        out.append(e)
    return out


GUARD_SEQLEN = 1024
GUARD_FA2_SHAPE = (64, False)


def guard_subset(rows):
    """The deterministic subset the CI guard re-predicts (the engine takes ~1-10 s a row on a
    CPU, so all ~900 rows take far longer than CI allows): the default config of every
    algorithm at N = 1024, D = 64, non-causal, and every fa2 config with block_m = 128 of
    that shape (for the ranking metrics)."""
    out = []
    for r in rows:
        p = r["problem"]
        if p.seqlen_q != GUARD_SEQLEN or (p.head_dim, p.causal) != GUARD_FA2_SHAPE:
            continue
        if r["default_config"] or (r["algo"] == "fa2" and r["config"].block_m == 128):
            out.append(r)
    return out


def headline_subset(rows):
    """Every algorithm's default config on all 24 shapes, plus every fa2 config of the four
    N = 1024 shapes (D 64/128, causal 0/1): what the report predicts when the full sweep
    would take too long on a CPU."""
    return [r for r in rows if r["default_config"] or
            (r["algo"] == "fa2" and r["problem"].seqlen_q == GUARD_SEQLEN)]


def guard_metrics(rows, preds):
    m = compute_metrics(rows, preds)
    rs = ranking_summary(m["ranking"])
    out = {f"mape.{a}": v["mape"] for a, v in m["errors"].items()}
    out.update({f"max_ape.{a}": v["max"] for a, v in m["errors"].items()})
    if rs.get("n_shapes"):
        out["spearman_min_neg"] = -rs["spearman_min"]   # bounds are upper bounds
        out["top1_loss_max"] = rs["top1_loss_max"]
    out["unpredicted_rows"] = float(len(m["failed"]))
    return out


def _fmt_pct(x):
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * x:.1f}%"


def _plots(profile, rows, preds, metrics, outdir):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    files = []
    fig, ax = plt.subplots(figsize=(6.5, 6))
    colors = {"standard": "tab:gray", "fa1": "tab:blue", "fa2": "tab:orange", "fa3": "tab:green",
              "fa3_triton": "tab:olive", "fa3_triton_fp8": "tab:red"}
    lo, hi = float("inf"), 0
    for lab in colors:
        pts = [(r["ms"], pr["runtime_us"] / 1e3) for r, pr in zip(rows, preds)
               if algo_label(r) == lab and pr.get("runtime_us") is not None]
        if not pts:
            continue
        xs, ys = zip(*pts)
        lo, hi = min(lo, *xs, *ys), max(hi, *xs, *ys)
        ax.scatter(xs, ys, s=10 if lab == "fa2" else 24, alpha=0.6, label=f"{lab} ({len(pts)})", c=colors.get(lab, "tab:purple"))
    if hi > 0:
        line = [lo * 0.8, hi * 1.25]
        ax.plot(line, line, "k-", lw=0.8)
        ax.fill_between(line, [x * 0.9 for x in line], [x * 1.1 for x in line], color="k", alpha=0.08,
                        label="±10%")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("measured (ms, do_bench median)")
    ax.set_ylabel(f"predicted (ms, profile {profile})")
    ax.set_title(f"H100: predicted vs measured, profile {profile}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    f1 = os.path.join(outdir, f"validation_pred_vs_meas_{profile.replace('.', '_')}.png")
    fig.savefig(f1, dpi=110)
    plt.close(fig)
    files.append(f1)

    shapes_ = {}
    for r, pr in zip(rows, preds):
        if r["algo"] == "fa2" and pr.get("runtime_us") is not None:
            shapes_.setdefault(shape_key(r["problem"]), []).append((r["ms"], pr["runtime_us"] / 1e3))
    keys = sorted(shapes_)
    if keys:
        ncol = 6
        nrow = math.ceil(len(keys) / ncol)
        fig, axes = plt.subplots(nrow, ncol, figsize=(3 * ncol, 2.4 * nrow), squeeze=False)
        for ax, k in zip(axes.flat, keys):
            items = sorted(shapes_[k])
            m0, p0 = min(x[0] for x in items), min(x[1] for x in items)
            ax.plot(range(len(items)), [x[0] / m0 for x in items], "o-", ms=3, label="measured")
            ax.plot(range(len(items)), [x[1] / p0 for x in items], "s", ms=3, label="predicted")
            rk = metrics["ranking"].get(k, {})
            ax.set_title(f"D={k[0]} c={k[1]} N={k[2]}\nρ={rk.get('spearman', float('nan')):.2f} "
                         f"top1 {_fmt_pct(rk.get('top1_loss'))}", fontsize=8)
            ax.tick_params(labelsize=6)
        for ax in list(axes.flat)[len(keys):]:
            ax.axis("off")
        axes.flat[0].legend(fontsize=6)
        fig.suptitle(f"fa2 configs per shape, sorted by measured time (time / best), profile {profile}")
        fig.tight_layout()
        f2 = os.path.join(outdir, f"validation_fa2_ranking_{profile.replace('.', '_')}.png")
        fig.savefig(f2, dpi=100)
        plt.close(fig)
        files.append(f2)
    return files


def cmd_report(args) -> int:
    import gpusim.profile as gprof
    from gpusim.artifacts import atomic_write_text, ensure_dir

    t0 = time.time()
    # the report's folder, where its predictions are saved as they come: checked
    # before they are made (an hour on two cores), not at their first save
    ensure_dir(os.path.dirname(os.path.abspath(args.report)))
    rows = load_measurements(args.measurements)
    gluon = gluon_rows(args.gluon) if args.gluon else []
    rows += gluon
    ncu_rows = []
    if os.path.exists(args.ncu):
        ncu_rows = load_ncu(args.ncu)
    profiles = args.gpu or ["h100"] + (["h100.measured"] if "h100.measured" in gprof.available_profiles() else [])
    if args.subset == "guard":
        rows = guard_subset(rows)
    elif args.subset == "headline":
        rows = headline_subset(rows)
    lines = ["# Validation of the simulator on the H100", "",
             f"Generated by `PYTHONPATH=. python experiments/validate.py report` from "
             f"`{os.path.relpath(args.measurements, ROOT)}` ({len(rows)} measured rows with status ok, subset "
             f"`{args.subset}`" + (": every algorithm's default config on all 24 shapes + every fa2 config at N=1024"
                                   if args.subset == "headline" else "")
             + (f"; `{os.path.relpath(args.ncu, ROOT)}`, {len(ncu_rows)} ncu rows" if ncu_rows else "") + ").",
             f"Measured on {rows[0].get('gpu', '?')}, driver {rows[0].get('driver', '?')}, torch "
             f"{rows[0].get('torch', '?')}, triton {rows[0].get('triton', '?')}, commit "
             f"{rows[0].get('git_commit', '?')}, {rows[0].get('date', '?')}; SM clock "
             f"{rows[0].get('sm_clock_mhz', '?')} MHz (nvidia-smi at start->end).",
             *([f"FA3's schedule (`fa3`) is checked against the kernel that runs it, kernels/fa3_gluon.py: "
                f"{len(gluon)} rows of `{os.path.relpath(args.gluon, ROOT)}` (commit "
                f"{gluon[0].get('git_commit', '?')}, {gluon[0].get('gpu', '?')}), at its default config. "
                f"The rows of Triton's fa3 kernel (kernels/fa3.py), which Triton 3.6 does not "
                f"warp-specialise, are predicted by the schedule it compiles to, `fa3_triton` "
                f"(algorithms/fa3_triton.py)."] if gluon else []),
             "Time: `triton.testing.do_bench` median, L2 flushed between calls, inputs rotated over two "
             "random sets. No model parameter was fitted to these timings: the profiles come from "
             "datasheets, papers and our microbenchmarks (experiments/calibrate.py).", "",
             f"Targets (issue 5): runtime MAPE ≤ {TARGETS['mape']:.0%} per algorithm (goal "
             f"{TARGETS['mape_goal']:.0%}); Spearman ≥ {TARGETS['spearman']} (goal {TARGETS['spearman_goal']}) "
             f"over fa2 configs within each shape; top-1 loss ≤ {TARGETS['top1_loss']:.0%}; HBM bytes within "
             f"{TARGETS['hbm_bytes']:.0%} of ncu's DRAM bytes; L2 request bytes within {TARGETS['l2_bytes']:.0%}.",
             ""]
    summary = {}
    for prof in profiles:
        tp = time.time()
        preds = reuse_or_predict(predictions_path(prof, "validation", os.path.dirname(os.path.abspath(args.report))),
                                 rows, prof, args.jobs, args.reuse_predictions)
        m = compute_metrics(rows, preds)
        rs = ranking_summary(m["ranking"])
        summary[prof] = {"errors": m["errors"], "ranking": rs}
        log(f"[report] {prof}: {len(rows)} predictions in {time.time() - tp:.0f} s")
        lines += [f"## Profile `{prof}`", "",
                  "| algorithm | rows | MAPE | median APE | max APE | mean signed error | MAPE, default config only | target |",
                  "|---|---|---|---|---|---|---|---|"]
        for a, e in m["errors"].items():
            ed = m["errors_default"].get(a)
            ok = "met" if e["mape"] <= TARGETS["mape"] else "**missed**"
            lines.append(f"| {a} | {e['n']} | {_fmt_pct(e['mape'])} | {_fmt_pct(e['median'])} | "
                         f"{_fmt_pct(e['max'])} | {'+' if e['bias'] >= 0 else ''}{_fmt_pct(e['bias'])} | "
                         f"{_fmt_pct(ed['mape']) if ed else '–'} | {ok} |")
        if m["overall"]:
            o = m["overall"]
            lines.append(f"| **all** | {o['n']} | {_fmt_pct(o['mape'])} | {_fmt_pct(o['median'])} | "
                         f"{_fmt_pct(o['max'])} | {_fmt_pct(o['bias'])} | | |")
        if m["failed"]:
            lines += ["", f"{len(m['failed'])} measured rows could not be predicted, e.g. "
                          f"`{m['failed'][0][1]}`."]
        lines.append("")
        if rs.get("n_shapes"):
            lines += [f"fa2 config ranking over {rs['n_shapes']} shapes: Spearman min "
                      f"{rs['spearman_min']:.2f}, median {rs['spearman_median']:.2f} (target ≥ "
                      f"{TARGETS['spearman']}: {'met' if rs['spearman_min'] >= TARGETS['spearman'] else '**missed** in ' + str(sum(v['spearman'] < TARGETS['spearman'] for v in m['ranking'].values())) + ' shapes'}); "
                      f"top-1 loss max {_fmt_pct(rs['top1_loss_max'])}, mean {_fmt_pct(rs['top1_loss_mean'])} "
                      f"(target ≤ {TARGETS['top1_loss']:.0%}: "
                      f"{'met' if rs['top1_loss_max'] <= TARGETS['top1_loss'] else '**missed** in ' + str(sum(v['top1_loss'] > TARGETS['top1_loss'] for v in m['ranking'].values())) + ' shapes'}).", "",
                      "| D | causal | N | configs | Spearman | top-1 loss |", "|---|---|---|---|---|---|"]
            for k, v in m["ranking"].items():
                lines.append(f"| {k[0]} | {k[1]} | {k[2]} | {v['n']} | {v['spearman']:.2f} | {_fmt_pct(v['top1_loss'])} |")
            lines.append("")
        # where the errors sit
        lines += ["Signed error by group (mean of (predicted − measured) / measured; + = model too slow):", "",
                  "| algorithm | D | causal | N=512 | 1024 | 2048 | 4096 | 8192 | 16384 |", "|---|---|---|---|---|---|---|---|---|"]
        groups = {}
        for r, pr in zip(rows, preds):
            if pr.get("runtime_us") is None:
                continue
            if r["algo"] == "fa2" and not r["default_config"]:
                continue
            p = r["problem"]
            groups.setdefault((algo_label(r), p.head_dim, int(p.causal)), {})[p.seqlen_q] = \
                (pr["runtime_us"] / 1e3 - r["ms"]) / r["ms"]
        for (a, d, c), byn in sorted(groups.items()):
            cells = [(f"{100 * byn[n]:+.0f}%" if n in byn else "–") for n in SEQLENS]
            lines.append(f"| {a} | {d} | {c} | " + " | ".join(cells) + " |")
        lines.append("")
        # which unit the model said bounds a row, and fa2's config shape: where
        # the model runs fast or slow (validation_notes.md reads these)
        lines += ["Error by the model's bottleneck:", "",
                  "| algorithm | bottleneck | rows | mean signed error | MAPE |", "|---|---|---|---|---|"]
        for (a, b), (n, bias, mape) in errors_by(rows, preds, lambda r, pr: (algo_label(r), pr.get("bottleneck") or "–")).items():
            lines.append(f"| {a} | {b} | {n} | {100 * bias:+.1f}% | {_fmt_pct(mape)} |")
        lines += ["", "fa2's error by config over all shapes (block_m x block_n x warps x stages):", "",
                  "| config | rows | mean signed error | MAPE |", "|---|---|---|---|"]
        for cfg, (n, bias, mape) in errors_by(
                rows, preds, lambda r, pr: (r["config"].block_m, r["config"].block_n, r["config"].num_warps,
                                            r["config"].num_stages) if algo_label(r) == "fa2" else None).items():
            lines.append(f"| {'x'.join(map(str, cfg))} | {n} | {100 * bias:+.1f}% | {_fmt_pct(mape)} |")
        lines.append("")
        worst = sorted(((abs(pr["runtime_us"] / 1e3 - r["ms"]) / r["ms"], r, pr) for r, pr in zip(rows, preds)
                        if pr.get("runtime_us") is not None), key=lambda t: -t[0])[:8]
        if worst:
            lines += ["Largest errors:", "", "| algorithm | D | causal | N | config | measured ms | predicted ms | error | model's bottleneck |",
                      "|---|---|---|---|---|---|---|---|---|"]
            for e, r, pr in worst:
                p, c = r["problem"], r["config"]
                lines.append(f"| {algo_label(r)} | {p.head_dim} | {int(p.causal)} | {p.seqlen_q} | "
                             f"{c.block_m}x{c.block_n}x{c.num_warps}x{c.num_stages} | {r['ms']:.3f} | "
                             f"{pr['runtime_us'] / 1e3:.3f} | {100 * (pr['runtime_us'] / 1e3 - r['ms']) / r['ms']:+.0f}% | "
                             f"{pr.get('bottleneck') or '–'} |")
            lines.append("")
        if ncu_rows:
            npreds = reuse_or_predict(predictions_path(prof, "ncu", os.path.dirname(os.path.abspath(args.report))),
                                      ncu_rows, prof, args.jobs, args.reuse_predictions)
            bm = byte_metrics(ncu_rows, npreds)
            summary[prof]["bytes"] = bm
            lines += ["Bytes, predicted vs ncu (`--clock-control none`, caches flushed before each kernel). "
                      "L2 read, SMs: the bytes the SMs receive from L2 (l1tex__m_xbar2l1tex_read_bytes), what "
                      "the model counts; L2 read, slices: the sectors the L2 slices look up for them "
                      "(lts__t_sectors_srcunit_tex_op_read × 32), fewer where the L2 request coalescer merged "
                      "requests for a sector in flight from several SMs, which the model does not "
                      "(experiments/l2_request_probe.py):", "",
                      "HBM write, in run: the model's HBM writes less the dirty bytes L2 still holds "
                      "at the end, which reach HBM after the kernel, where ncu's count ends:", "",
                      "| algorithm | D | causal | N | HBM read: ncu | err | HBM write: ncu | err | "
                      "HBM write, in run: ncu | err | L2 read, SMs: ncu | err | L2 read, slices: ncu | err |",
                      "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
            for e in bm:
                r = e["row"]
                p = r["problem"]
                if e["error"]:
                    lines.append(f"| {algo_label(r)} | {p.head_dim} | {int(p.causal)} | {p.seqlen_q} | "
                                 f"prediction failed: {e['error']} |||||||||| ")
                    continue
                cells = []
                for name in BYTE_COUNTS:
                    pv, mv, err = e[name]
                    cells += [f"{mv / 1e6:,.1f} MB" if not math.isnan(mv) else "–",
                              _fmt_pct(err) if not math.isnan(err) else "–"]
                lines.append(f"| {algo_label(r)} | {p.head_dim} | {int(p.causal)} | {p.seqlen_q} | " + " | ".join(cells) + " |")
            for name, tgt in (("hbm_read", TARGETS["hbm_bytes"]), ("hbm_write", TARGETS["hbm_bytes"]),
                              ("hbm_write_in_run", TARGETS["hbm_bytes"]),
                              ("l2_read", TARGETS["l2_bytes"]), ("l2_slice_read", TARGETS["l2_bytes"])):
                errs = [abs(e[name][2]) for e in bm if not e["error"] and not math.isnan(e[name][2])]
                if errs:
                    within = sum(x <= tgt for x in errs)
                    lines.append(f"\n{name}: mean |error| {_fmt_pct(sum(errs) / len(errs))}, max {_fmt_pct(max(errs))}; "
                                 f"{within}/{len(errs)} rows within {tgt:.0%}.")
            lines.append("")
        if not args.no_plots:
            for f in _plots(prof, rows, preds, m, os.path.dirname(os.path.abspath(args.report))):
                lines.append(f"![{os.path.basename(f)}]({os.path.basename(f)})")
            lines.append("")
        if args.write_bounds and prof == profiles[0]:
            sub = guard_subset(rows)
            idx = {id(r): i for i, r in enumerate(rows)}
            gm = guard_metrics(sub, [preds[idx[id(r)]] for r in sub])
            reached = {k: round(v + abs(v) * 0.02 + 0.005, 4) for k, v in gm.items()}
            # a bound only ever tightens: where the rounding lands above the bound
            # already kept, the kept one stays (the errors must not creep up)
            kept = _kept_bounds(args.bounds, prof)
            bounds = {"profile": prof, "subset": "guard_subset (experiments/validate.py)",
                      "note": "upper bounds: the values the report reached, rounded up by 2% + 0.005, "
                              "never above the bounds they replace; spearman_min_neg is -(minimum Spearman)",
                      "bounds": {k: min(v, kept.get(k, v)) for k, v in reached.items()}}
            atomic_write_text(args.bounds, json.dumps(bounds, indent=1, sort_keys=True))
            log(f"[report] wrote {args.bounds}")
    notes = os.path.join(RESULTS, "validation_notes.md")
    if os.path.exists(notes):
        lines += ["## Where the targets are missed, and why", "", open(notes).read().strip(), ""]
    atomic_write_text(args.report, "\n".join(lines) + "\n")
    log(f"[report] wrote {args.report} in {time.time() - t0:.0f} s")
    for prof, s in summary.items():
        print(f"{prof}: " + ", ".join(f"{a} MAPE {_fmt_pct(e['mape'])}" for a, e in s["errors"].items())
              + (f"; Spearman min {s['ranking']['spearman_min']:.2f} median {s['ranking']['spearman_median']:.2f},"
                 f" top-1 loss max {_fmt_pct(s['ranking']['top1_loss_max'])}" if s["ranking"].get("n_shapes") else ""))
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="Measure the kernels and validate the simulator against them.")
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("measure", help="GPU: time the suite and the fa2 config sweep")
    p.add_argument("--out", default=DEFAULT_OUT)
    p.add_argument("--quick", action="store_true", help="N in {1024,4096,16384}, fa2 with stages=3 only")
    p.add_argument("--budget-s", type=float, default=0, help="stop starting rows this many seconds after start")
    p.add_argument("--margin-s", type=float, default=8, help="stop this long before the budget")
    p.add_argument("--algos", default="", help="comma-separated subset of standard,fa1,fa2,fa3")
    p.add_argument("--limit", type=int, default=0, help="first N rows only (debugging)")
    p.add_argument("--warmup-ms", type=float, default=10)
    p.add_argument("--rep-ms", type=float, default=40)
    p.add_argument("--precompile-workers", type=int, default=12)
    p.set_defaults(func=cmd_measure)
    p = sub.add_parser("ncu", help="GPU: DRAM and L2 bytes of a representative subset under Nsight Compute")
    p.add_argument("--out", default=DEFAULT_NCU)
    p.add_argument("--timeout-s", type=float, default=240)
    p.set_defaults(func=cmd_ncu)
    p = sub.add_parser("ncu-parse", help="CPU: rebuild the ncu CSV from its raw export")
    p.add_argument("--raw", default=os.path.join(RESULTS, "ncu_h100_raw.csv"))
    p.add_argument("--out", default=DEFAULT_NCU)
    p.set_defaults(func=cmd_ncu_parse)
    p = sub.add_parser("ncu-target", help=argparse.SUPPRESS)
    p.set_defaults(func=cmd_ncu_target)
    p = sub.add_parser("report", help="CPU: predictions vs measurements, figures, markdown")
    p.add_argument("--measurements", default=DEFAULT_OUT)
    p.add_argument("--ncu", default=DEFAULT_NCU)
    p.add_argument("--gpu", action="append", help="profile(s) to predict with (default h100 and h100.measured)")
    p.add_argument("--report", default=DEFAULT_REPORT)
    p.add_argument("--bounds", default=DEFAULT_BOUNDS)
    p.add_argument("--gluon", default=DEFAULT_GLUON,
                   help="kernels.bench CSV with fa3_gluon rows: FA3's schedule against the kernel that "
                        "runs it ('' to leave them out)")
    p.add_argument("--write-bounds", action="store_true", help="store the guard subset's errors as CI bounds")
    p.add_argument("--subset", choices=("all", "headline", "guard"), default="all",
                   help="all measured rows; headline: defaults on every shape + fa2 configs at N=1024; "
                        "guard: the CI guard's rows")
    p.add_argument("--jobs", type=int, default=max(1, (os.cpu_count() or 2)))
    p.add_argument("--no-plots", action="store_true")
    p.add_argument("--reuse-predictions", action="store_true",
                   help="reuse the predictions saved beside the report (*_predictions_<profile>.csv), "
                        "predicting only the rows they lack (each line keeps the commit it was made at)")
    p.set_defaults(func=cmd_report)
    args = ap.parse_args(argv)
    try:
        return args.func(args)
    except GpusimError as e:    # (a results file that cannot be read or written, among others)
        print(f"validate: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
