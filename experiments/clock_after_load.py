"""At which SM clock does a kernel run once it has run for a while? A diagnostic.

The H100's clock gives way under power: calibrate.py's tl.dot loop reads 1647 MHz
in the kernel, its exp2 loop 2079, and the stamped fa2 runs 1694-1844 MHz by config
(validation_notes.md, session 28). Kernels without stamps (Triton's fa3, bf16 and
fp8) can still be asked: run one back to back for LOAD_MS, then, on the same
stream with no gap, a one-CTA probe that reads the SM's cycle counter against the
global timer over PROBE_NS. The power controller moves the clock over milliseconds,
so the probe sees the clock the kernel left. A probe after an idle GPU reads the top.

    GPU:  PYTHONPATH=. python experiments/clock_after_load.py --out $OUT/clock_after_load_h100.csv

Nothing here feeds a profile: attention kernels validate the model, never tune it.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

LOAD_MS = 300       # back-to-back launches before each probe
PROBE_NS = 50_000   # the probe's own length (a clock read at each end)
REPEATS = 3
# (label, algo, dtype, batch, heads, seqlen, head_dim): default configs at 16k tokens
CASES = [
    ("idle", None, None, 0, 0, 0, 0),
    ("fa2 bf16 D64", "fa2", "bf16", 4, 32, 4096, 64),
    ("fa2 bf16 D128", "fa2", "bf16", 4, 16, 4096, 128),
    ("fa3_triton bf16 D64", "fa3", "bf16", 4, 32, 4096, 64),
    ("fa3_triton fp8 D64", "fa3", "fp8", 4, 32, 4096, 64),
    ("fa3_triton bf16 D128", "fa3", "bf16", 4, 16, 4096, 128),
    ("fa3_triton fp8 D128", "fa3", "fp8", 4, 16, 4096, 128),
]
FIELDS = ("case", "rep", "probe_mhz", "launches", "load_ms", "gpu", "git_commit", "date", "command")


def _probe_kernel():
    import triton
    import triton.language as tl

    from kernels.clocks import global_timer, sm_clock

    @triton.jit
    def _probe(OUT, span_ns):
        pid = tl.program_id(0)
        t0 = global_timer(pid)
        c0 = sm_clock(pid)
        t = t0
        while t - t0 < span_ns:
            t = global_timer(pid)
        c1 = sm_clock(t.to(tl.int32))
        tl.store(OUT, t - t0)
        tl.store(OUT + 1, c1 - c0)

    return _probe


def _runner(case):
    """A function launching the case's kernel once (None for `idle`)."""
    import torch

    from kernels import fa2, fa3
    from kernels.common import make_inputs

    _, algo, dtype, b, h, n, d = case
    if algo is None:
        return None
    q, k, v = make_inputs(b, h, n, d)
    if algo == "fa2":
        return lambda: fa2.forward(q, k, v)
    if dtype == "fp8":     # (quantised in each call: three small kernels beside it)
        return lambda: fa3.forward_fp8(q, k, v)
    return lambda: fa3.forward(q, k, v)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="experiments/results/clock_after_load_h100.csv")
    args = ap.parse_args(argv)
    from experiments import gpu_probe

    prov = gpu_probe.start("clock_after_load.py", args.out, None)
    if prov is None:
        return 2
    import torch

    from kernels.provenance import write_csv_atomic

    probe = _probe_kernel()
    out = torch.zeros(2, dtype=torch.int64, device="cuda")
    rows = []
    for case in CASES:
        fn = _runner(case)
        if fn is not None:
            for _ in range(3):      # compile and warm
                fn()
        torch.cuda.synchronize()
        for rep in range(REPEATS):
            launches = 0
            if fn is None:
                time.sleep(LOAD_MS / 1e3)
            else:
                t_end = time.perf_counter() + LOAD_MS / 1e3
                while time.perf_counter() < t_end:
                    fn()
                    launches += 1
            probe[(1,)](out, PROBE_NS)
            torch.cuda.synchronize()
            ns, cycles = out.tolist()
            mhz = cycles / ns * 1e3
            rows.append({"case": case[0], "rep": rep, "probe_mhz": round(mhz, 1), "launches": launches,
                         "load_ms": LOAD_MS, **{k: prov.get(k, "") for k in ("gpu", "git_commit", "date", "command")}})
        got = [r["probe_mhz"] for r in rows if r["case"] == case[0]]
        print(f"{case[0]:24s} {statistics.median(got):7.1f} MHz ({', '.join(f'{m:.0f}' for m in got)})", flush=True)
    write_csv_atomic(args.out, rows, FIELDS)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
