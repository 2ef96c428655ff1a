"""At which SM clock, and drawing how much power, does each kind of work run?

The H100 lowers its SM clock when a kernel draws too much power, while the
profiles take one clock (validation_notes.md, sessions 17, 28 and 29). This
script reads NVML on a thread -- the SM clock, the board's power, and whether
the power cap is what holds the clock down (clock event reasons;
kernels/gpu_monitor.py) -- while each case runs, and sets the clock the
kernels count beside it. What it found on the H100 (session 29): NVML reads
1980 MHz through validation-style runs of fa2 and fp8, yet their SMs count
1700-1820 cycles a µs of event time (`span`); only under the power cap (a
tl.dot loop, 1665 MHz) do the two agree. Take a kernel's clock from `span`.

Modes (--only):

- microbenchmarks (`micro`): idle; a tl.dot loop (bf16, fp8) on all SMs and on
  a quarter, half and three quarters of them (one CTA an SM); HBM copy and
  read; an L2-resident read; an exp2 loop; cuBLAS's bf16 8192^3 product. Each
  runs back to back for SUSTAIN_S and its throughput is timed with events.
  These may calibrate a clock model later.
- attention kernels (`attention`): default configs at 16k tokens, each run
  (1) back to back for SUSTAIN_S and (2) as `validate.py measure` times a row
  (do_bench, 10 ms warm-up, 40 ms or 8 calls, inputs alternated). They
  validate; nothing here is fitted to them.
- stamped (`stamped`): does the clock the kernel counts (clock64 over the
  global timer, median CTA of the last launch) agree with NVML's? The tl.dot
  loop with calibrate.py's clock stamps, and fa2 launched with stamps=, in
  both regimes.
- probe (`probe`): a kernel of a fixed cycle count (an exp2 chain), timed on
  CUDA events right behind ~50 ms of a case's launches, against its time at
  the top clock: the clock the case left, with no timer read in a kernel.
- span (`span`): one stamped fa2 (or fp8 fa3) launch timed on CUDA events, cold and after
  ~50 ms of launches: each SM's clock64 from its first CTA's start to its last
  CTA's end over the event time (a lower bound on the clock its SMs counted),
  beside the global-timer reading.

The clock and power of a case are the medians of its samples after SETTLE_S
(the controller moves the clock over milliseconds to tens of milliseconds).

    GPU:  PYTHONPATH=. python3 experiments/clock_power.py --out $OUT/clock_power_h100.csv
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SUSTAIN_S = 1.2      # back-to-back run of each case
SETTLE_S = 0.3       # samples before this are left out of a sustained case
IDLE_GAP_S = 0.5     # idle between cases, so each starts from a cool clock
DOT_ITERS = 65536    # per CTA, for the one-CTA-an-SM tl.dot runs (~40 ms a launch)
FIELDS = ("kind", "case", "mode", "clock_mhz", "kernel_clock_mhz", "clock_p10", "clock_p90", "power_w", "power_cap_share",
          "samples", "seconds", "throughput", "unit", "detail",
          "gpu", "driver", "power_limit_w", "git_commit", "date", "command")

# (label, algo module, dtype, head_dim, seqlen, causal, (block_m, block_n, warps, stages) or None)
ATTENTION = [
    ("fa2 D64 N4096", "fa2", "bf16", 64, 4096, False, None),
    ("fa2 D128 N4096", "fa2", "bf16", 128, 4096, False, None),
    ("fa2 D128 N4096 causal", "fa2", "bf16", 128, 4096, True, None),
    ("fa2 D64 N16384 64x128w4s2", "fa2", "bf16", 64, 16384, False, (64, 128, 4, 2)),
    ("fa2 D64 N16384 64x128w4s3", "fa2", "bf16", 64, 16384, False, (64, 128, 4, 3)),
    ("fa2 D64 N16384 128x64w8s4 causal", "fa2", "bf16", 64, 16384, True, (128, 64, 8, 4)),
    ("fa2 D64 N16384 64x128w4s3 causal", "fa2", "bf16", 64, 16384, True, (64, 128, 4, 3)),
    ("fa3_triton bf16 D64 N4096", "fa3", "bf16", 64, 4096, False, None),
    ("fa3_triton bf16 D128 N4096", "fa3", "bf16", 128, 4096, False, None),
    ("fa3_triton fp8 D64 N4096", "fa3", "fp8", 64, 4096, False, None),
    ("fa3_triton fp8 D128 N4096", "fa3", "fp8", 128, 4096, False, None),
    ("fa3_triton fp8 D64 N16384 causal", "fa3", "fp8", 64, 16384, True, None),
    ("fa3 gluon D128 N4096", "fa3_gluon", "bf16", 128, 4096, False, None),
    ("fa3 gluon D64 N4096", "fa3_gluon", "bf16", 64, 4096, False, None),
    ("standard D128 N4096", "standard", "bf16", 128, 4096, False, None),
    ("fa1 D64 N4096", "fa1", "bf16", 64, 4096, False, None),
]


def _problem(n: int, d: int, causal: bool, dtype: str = "bf16"):
    """The sweep's shape at sequence length n and head dim d (validate.py's tokens and hidden size)."""
    from algorithms.problem import AttentionProblem
    from experiments.validation.suite import HIDDEN, TOKENS
    return AttentionProblem(batch=TOKENS // n, heads=HIDDEN // d, seqlen_q=n, head_dim=d, causal=causal,
                            dtype=dtype)


def _timer_mhz(stamps) -> float:
    """The median CTA's clock64 over its global-timer span (kernels/fa2.py STAMP_SLOTS), MHz."""
    s = stamps.cpu().double()
    ns, cycles = s[:, 2] - s[:, 0], s[:, 5] - s[:, 4]
    good = (ns > 0) & (cycles > 0)
    return float((cycles[good] / ns[good]).median()) * 1e3


def sustained(torch, fn, seconds: float = SUSTAIN_S):
    """Run fn back to back for `seconds` (the host waits for the GPU every few
    launches, so the queue stays short); returns (t_settled, t_end, launches
    timed after settling, their GPU ms)."""
    fn()
    torch.cuda.synchronize()
    t_start = time.perf_counter()
    t_settled = t_start + SETTLE_S
    launches, ev0 = 0, None
    while True:
        now = time.perf_counter()
        if now >= t_start + seconds:
            break
        if ev0 is None and now >= t_settled:
            torch.cuda.synchronize()
            t_settled = time.perf_counter()
            ev0 = torch.cuda.Event(enable_timing=True)
            ev0.record()
        fn()
        if ev0 is not None:
            launches += 1
        if launches % 4 == 0:
            torch.cuda.synchronize()
    ev1 = torch.cuda.Event(enable_timing=True)
    ev1.record()
    ev1.synchronize()
    t_end = time.perf_counter()
    return t_settled, t_end, launches, ev0.elapsed_time(ev1) if ev0 is not None else float("nan")


def micro_cases(torch, sms: int):
    """(label, fn, work per launch, unit, detail) of the microbenchmarks."""
    from experiments.calibration.triton_kernels import DOT_SHAPES, DOT_WARPS, triton_kernels

    K = triton_kernels()
    cases = []
    for dt, tdt in (("bf16", torch.bfloat16), ("fp8", torch.float8_e4m3fn)):
        bm, bn, bk = DOT_SHAPES[dt]
        a = (torch.randn(bm, bk, device="cuda") * 0.1).to(tdt)
        b = (torch.randn(bk, bn, device="cuda") * 0.1).to(tdt)
        c = torch.empty(sms * bm * bn, device="cuda", dtype=torch.float32)
        clk = torch.zeros(sms * 4, device="cuda", dtype=torch.int64)
        shares = (0.25, 0.5, 0.75, 1.0) if dt == "bf16" else (0.5, 1.0)
        for share in shares:
            grid = max(1, round(share * sms))
            iters = DOT_ITERS if dt == "bf16" else DOT_ITERS * 2

            def fn(grid=grid, iters=iters, a=a, b=b, c=c, clk=clk, bm=bm, bn=bn, bk=bk):
                K["dot_shape"][(grid,)](a, b, c, iters, clk, BM=bm, BN=bn, BK=bk, A_IN_REGS=False,
                                        CLOCKED=False, num_warps=DOT_WARPS, num_stages=1)
            cases.append((f"tl.dot {dt} {grid} SMs", fn, 2.0 * bm * bn * bk * iters * grid / 1e12, "TFLOP/s",
                          f"tl.dot loop {bm}x{bn}x{bk}, {DOT_WARPS} warps, operands on chip, one CTA on each "
                          f"of {grid} SMs, {iters} iterations"))
    n = (1 << 31) // 4
    x = torch.randn(n, device="cuda", dtype=torch.float32)
    y = torch.empty_like(x)
    block = 8192
    part = torch.empty(n // block, device="cuda", dtype=torch.float32)
    cases.append(("hbm copy", lambda: K["hbm_copy"][(n // block,)](x, y, BLOCK=block, num_warps=8),
                  2 * n * 4 / 1e9, "GB/s", "2 GiB fp32 read and written"))
    cases.append(("hbm read", lambda: K["hbm_read"][(n // block,)](x, part, BLOCK=block, num_warps=8),
                  n * 4 / 1e9, "GB/s", "2 GiB fp32 read"))
    l2_block, unroll, grid = 2048, 4, sms * 4
    ws_blocks = (16 << 20) // (l2_block * 4)
    steps = 2048
    out = torch.empty(grid * l2_block, device="cuda", dtype=torch.float32)
    cases.append(("l2 read 16MB", lambda: K["l2_read"][(grid,)](x, out, ws_blocks, steps, BLOCK=l2_block,
                                                                  UNROLL=unroll, num_warps=8),
                  steps * grid * unroll * l2_block * 4 / 1e9, "GB/s",
                  f"16 MB working set re-read by {grid} CTAs, ld.global.cg"))
    e_grid, e_iters = sms * 16, 8192
    e_out = torch.empty(e_grid * 1024, device="cuda", dtype=torch.float32)
    cases.append(("exp2 loop", lambda: K["exp2_loop"][(e_grid,)](e_out, e_iters, BLOCK=1024, num_warps=4),
                  e_grid * 1024 * e_iters / 1e9, "Gexp2/s", f"dependent exp2 chain, {e_grid} CTAs of 1024"))
    ma = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    mb = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    cases.append(("cuBLAS bf16 8192^3", lambda: ma @ mb, 2.0 * 8192 ** 3 / 1e12, "TFLOP/s",
                  "torch.matmul, random N(0,1) bf16"))
    return cases


# (label, seqlen, head_dim, causal, (block_m, block_n, warps, stages)): fa2 with stamps=, whose
# CTAs read clock64 and the global timer (kernels/fa2.py), beside NVML
STAMPED_FA2 = [("fa2 D64 N512 64x64w4s3 stamped", 512, 64, False, (64, 64, 4, 3)),
               ("fa2 D64 N4096 128x64w4s3 stamped", 4096, 64, False, (128, 64, 4, 3))]


def stamped_cases(torch, sms: int):
    """(label, fn, in-kernel MHz of fn's last launch): does the clock the kernel
    counts agree with NVML's? A tl.dot loop on every SM (calibrate.py's
    clock_stamp) and fa2 launched with stamps (the median CTA's clock64 over
    its global-timer span)."""
    from algorithms.problem import TileConfig
    from experiments.calibration.runner import stamped_clock
    from experiments.calibration.triton_kernels import DOT_SHAPES, DOT_WARPS, triton_kernels
    from experiments.fa2_stamps import _stamped_inputs
    from kernels import fa2

    K = triton_kernels()
    bm, bn, bk = DOT_SHAPES["bf16"]
    a = (torch.randn(bm, bk, device="cuda") * 0.1).to(torch.bfloat16)
    b = (torch.randn(bk, bn, device="cuda") * 0.1).to(torch.bfloat16)
    c = torch.empty(sms * bm * bn, device="cuda", dtype=torch.float32)
    clk = torch.zeros(sms * 4, device="cuda", dtype=torch.int64)
    cases = [(f"tl.dot bf16 {sms} SMs clocked",
              lambda: K["dot_shape"][(sms,)](a, b, c, DOT_ITERS, clk, BM=bm, BN=bn, BK=bk, A_IN_REGS=False,
                                             CLOCKED=True, num_warps=DOT_WARPS, num_stages=1),
              lambda: stamped_clock(clk)[0])]
    for label, n, d, causal, cfg in STAMPED_FA2:
        config = TileConfig(*cfg)
        q, k, v, stamps = _stamped_inputs(_problem(n, d, causal), config)

        def fn(q=q, k=k, v=v, config=config, stamps=stamps, causal=causal):
            return fa2.forward(q, k, v, causal=causal, config=config, stamps=stamps)
        cases.append((label, fn, lambda stamps=stamps: _timer_mhz(stamps)))
    return cases


PROBE_ITERS = 4096      # the probe's exp2 chain: ~60 µs at 1980 MHz
PROBE_REPEATS = 5       # load + probe rounds a case (median)


def probe_kernel(torch, sms: int):
    """A kernel whose time is a fixed number of SM cycles: one CTA an SM running
    a dependent exp2 chain (calibrate.py's exp2_loop, no memory in the loop).
    Its time on CUDA events gives the clock it ran at, against its time at a
    known clock: no global timer in the kernel (whose reading disagrees with
    NVML's by -10% to +6% across kernels, clock_stamped_h100.csv)."""
    from experiments.calibration.triton_kernels import triton_kernels
    K = triton_kernels()
    out = torch.empty(sms * 1024, device="cuda", dtype=torch.float32)
    return lambda: K["exp2_loop"][(sms,)](out, PROBE_ITERS, BLOCK=1024, num_warps=4)


def timed(torch, fn, cover: bool = False) -> float:
    """fn's GPU time in µs on CUDA events, queued right behind whatever runs;
    `cover`: behind a 100 µs GPU sleep first, so that on an idle GPU the host's
    launch latency falls before the start event, not inside the time."""
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    if cover:
        torch.cuda._sleep(int(100e-6 * 1980e6))
    e0.record()
    fn()
    e1.record()
    e1.synchronize()
    return e0.elapsed_time(e1) * 1e3


# fa2 launches whose CTAs fill every SM from start to end: per SM, clock64 from its first CTA's
# start to its last CTA's end, over the launch's time on CUDA events (no global timer)
# (and Triton's fa3 fp8 kernel at its default config: None)
SPAN_FA2 = [("fa2 D128 N4096 128x64w8s3", 4096, 128, False, (128, 64, 8, 3)),
            ("fa2 D64 N4096 128x64w4s3", 4096, 64, False, (128, 64, 4, 3)),
            ("fa2 D64 N512 64x64w4s3", 512, 64, False, (64, 64, 4, 3)),
            ("fa3_triton fp8 D64 N4096", 4096, 64, False, None),
            ("fa3_triton fp8 D128 N4096", 4096, 128, False, None)]


def parse_span_configs(text: str) -> list[tuple]:
    """'16384:128:0:128x64w8s3,...' -> SPAN_FA2-style cases; ValueError (one
    line) for an item of another form."""
    import re

    cases = []
    for item in text.split(","):
        m = re.fullmatch(r"(\d+):(64|128):([01]):(\d+)x(\d+)w(\d+)s(\d+)", item.strip())
        if m is None:
            raise ValueError(f"--span-configs: {item!r} is not N:D:causal:BMxBNwWsS (e.g. 16384:128:0:128x64w8s3)")
        n, d, causal, bm, bn, w, s = map(int, m.groups())
        cases.append((f"fa2 D{d} N{n}{' causal' if causal else ''} {bm}x{bn}w{w}s{s}", n, d, bool(causal),
                      (bm, bn, w, s)))
    return cases


def span_clocks(torch, case, launches_before: int) -> dict:
    """After `launches_before` back-to-back launches (a validation row's ~50 ms),
    one stamped launch timed on events: the median SM's clock64 span (first CTA
    start to last CTA end) over the event time, a lower bound on the clock the
    SMs counted (the launch's own start and drain fall outside the span); and
    the median CTA's clock64 over its global-timer span, as fa2_stamps reads it."""
    from algorithms.defaults import default_config
    from algorithms.problem import TileConfig
    from experiments.fa2_stamps import _stamped_inputs
    from experiments.validation.measure import _quant
    from kernels import fa2, fa3

    _, n, d, causal, cfg = case
    config = TileConfig(*cfg) if cfg else default_config("fa3", _problem(n, d, causal, "fp8"))
    # (fp8's CTAs fill the same stamp rows: one a Q block and head)
    q, k, v, stamps = _stamped_inputs(_problem(n, d, causal), config)
    if cfg:
        run = lambda: fa2.forward(q, k, v, causal=causal, config=config, stamps=stamps)
    else:
        q8, k8, v8, scales = _quant(q, k, v, config)
        run = lambda: fa3.forward_fp8(q8, k8, v8, causal=causal, config=config, scales=scales, stamps=stamps)
    run()
    torch.cuda.synchronize()
    time.sleep(IDLE_GAP_S)
    for _ in range(launches_before):
        run()
    us = timed(torch, run)
    s = stamps.cpu().double()
    spans = []
    for sm in s[:, 3].unique():
        mine = s[s[:, 3] == sm]
        spans.append(float(mine[:, 5].max() - mine[:, 4].min()))
    spans.sort()
    return {"event_us": round(us, 2), "span_mhz": round(spans[len(spans) // 2] / us, 1),
            "timer_mhz": round(_timer_mhz(stamps), 1)}


def attention_case(torch, case):
    """(fn, problem flops) for an attention row, inputs alternated as validate.py does."""
    from algorithms.defaults import default_config
    from algorithms.problem import TileConfig
    from experiments.validation.measure import _call, _quant

    label, algo, dtype, d, n, causal, cfg = case
    problem = _problem(n, d, causal, dtype)
    b, h = problem.batch, problem.heads
    # (the gluon kernel picks its own default config, as kernels.bench runs it)
    config = TileConfig(*cfg) if cfg else None if algo == "fa3_gluon" else default_config(algo, problem)
    inputs = [tuple(torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
              for _ in range(2)]
    quant = [_quant(*x, config) for x in inputs] if dtype == "fp8" else [None, None]
    state = {"i": 0}

    def fn():
        state["i"] ^= 1
        return _call(algo, dtype, *inputs[state["i"]], causal, config, quant[state["i"]])
    return fn, problem.reference_flops() / 1e12, config


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="experiments/results/clock_power_h100.csv")
    ap.add_argument("--only", default="micro,attention,stamped,probe,span",
                    help="micro, attention, stamped, probe, span, or several (comma-separated)")
    ap.add_argument("--span-configs", default="",
                    help="span: fa2 cases instead of the built-in ones, comma-separated N:D:causal:BMxBNwWsS "
                         "(e.g. 16384:128:0:128x64w8s3)")
    ap.add_argument("--span-before", default="0,40",
                    help="span: how many launches run back to back before the timed one (comma-separated)")
    args = ap.parse_args(argv)
    kinds = set(args.only.split(","))
    if not kinds <= {"micro", "attention", "stamped", "probe", "span"}:
        print(f"clock_power: --only takes micro, attention, stamped, probe and/or span, got {args.only!r}",
              file=sys.stderr)
        return 2
    try:
        span_cases = parse_span_configs(args.span_configs) if args.span_configs else SPAN_FA2
    except ValueError as e:
        print(f"clock_power: {e}", file=sys.stderr)
        return 2
    span_before = [x.strip() for x in args.span_before.split(",")]
    if not all(x.isdigit() for x in span_before):
        print(f"clock_power: --span-before takes counts >= 0, comma-separated, got {args.span_before!r}",
              file=sys.stderr)
        return 2
    span_before = [int(x) for x in span_before]
    from experiments import gpu_probe

    if gpu_probe.start("clock_power.py", args.out, None) is None:
        return 2
    import torch
    import triton

    from kernels.gpu_monitor import GpuMonitor
    from kernels.provenance import provenance, write_csv_atomic

    prov = provenance(" ".join(["python experiments/clock_power.py"] + sys.argv[1:] if argv is None
                               else ["python experiments/clock_power.py", *argv]))
    sampler = GpuMonitor.open()
    if sampler is None:
        print("clock_power: needs NVML (pynvml) to read the clock and power", file=sys.stderr)
        return 2
    limit_w = sampler.power_limit_w()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    common = {k: prov.get(k, "") for k in ("gpu", "driver", "git_commit", "date", "command")}
    common["power_limit_w"] = limit_w
    rows = []
    sampler.start()

    def add(kind, label, mode, window, seconds, throughput="", unit="", detail="", kernel_mhz=""):
        row = {"kind": kind, "case": label, "mode": mode, **window, "kernel_clock_mhz": kernel_mhz,
               "seconds": round(seconds, 3),
               "throughput": throughput, "unit": unit, "detail": detail, **common}
        rows.append(row)
        print(f"{kind:<9} {label:<36} {mode:<9} {row['clock_mhz']!s:>6} MHz ({row['clock_p10']}-{row['clock_p90']};"
              f" kernel {kernel_mhz or '-'})"
              f" {row['power_w']!s:>6} W cap {row['power_cap_share']!s:>5} {throughput!s:>9} {unit}", flush=True)
        write_csv_atomic(args.out, rows, FIELDS)

    try:
        time.sleep(IDLE_GAP_S)
        t0 = time.perf_counter()
        time.sleep(SUSTAIN_S)
        add("micro", "idle", "sustained", sampler.window(t0 + SETTLE_S, time.perf_counter()), SUSTAIN_S)
        if "micro" in kinds:
            for label, fn, work, unit, detail in micro_cases(torch, sms):
                time.sleep(IDLE_GAP_S)
                ts, te, launches, ms = sustained(torch, fn)
                rate = round(work * launches / (ms * 1e-3), 1) if launches else ""
                add("micro", label, "sustained", sampler.window(ts, te), te - ts, rate, unit,
                    f"{detail}; {launches} launches in {ms:.0f} ms after {SETTLE_S} s")
                torch.cuda.empty_cache()
        if "stamped" in kinds:
            for label, fn, mhz in stamped_cases(torch, sms):
                fn()
                torch.cuda.synchronize()
                time.sleep(IDLE_GAP_S)
                t0 = time.perf_counter()
                ms = triton.testing.do_bench(fn, warmup=10, rep=40, return_mode="median")
                t1 = time.perf_counter()
                add("stamped", label, "do_bench", sampler.window(t0, t1), t1 - t0, "", "",
                    f"do_bench median {ms:.4g} ms; kernel clock: its last launch's median CTA", round(mhz(), 1))
                time.sleep(IDLE_GAP_S)
                ts, te, launches, ms = sustained(torch, fn)
                add("stamped", label, "sustained", sampler.window(ts, te), te - ts, "", "",
                    f"{launches} launches in {ms:.0f} ms; kernel clock: the last launch's median CTA",
                    round(mhz(), 1))
                torch.cuda.empty_cache()
        if "probe" in kinds:
            probe = probe_kernel(torch, sms)
            # the probe's time at the top clock: back to back it draws little power and
            # NVML reads 1980 MHz throughout (the window's clock is recorded beside it)
            for _ in range(20):
                probe()
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            base = sorted(timed(torch, probe, cover=True) for _ in range(50))[25]
            window = sampler.window(t0, time.perf_counter())
            add("probe", "exp2 probe alone", "back to back", window, time.perf_counter() - t0, round(base, 2),
                "µs", f"one CTA on each of {sms} SMs, {PROBE_ITERS} dependent exp2; median of 50")
            base_mhz = window["clock_mhz"] or 1980.0
            loads = [("idle", None)] + [(label, fn) for label, fn, _ in stamped_cases(torch, sms)]
            for case in ATTENTION[:2] + [c for c in ATTENTION if "fp8" in c[0]][:1]:
                loads.append((case[0], attention_case(torch, case)[0]))
            for label, fn in loads:
                got = []
                # as a validation row: ~50 ms of launches queued back to back
                if fn is not None:
                    fn()        # (compiled and warm before it is timed)
                launches = 0 if fn is None else max(1, round(50e3 / timed(torch, fn, cover=True)))
                for _ in range(PROBE_REPEATS):
                    time.sleep(IDLE_GAP_S)
                    for _ in range(launches):
                        fn()
                    got.append(timed(torch, probe))
                us = sorted(got)[len(got) // 2]
                add("probe", label, "probe after 50 ms", {"clock_mhz": "", "clock_p10": "", "clock_p90": "",
                                                          "power_w": "", "power_cap_share": "", "samples": 0},
                    0.0, round(us, 2), "µs",
                    f"{launches} launches then the probe; probe times {', '.join(f'{t:.1f}' for t in got)} µs; "
                    f"clock = {base_mhz:.0f} MHz x "
                    f"{base:.2f} / probe µs", round(base_mhz * base / us, 1))
        if "span" in kinds:
            for case in span_cases:
                for before in span_before:
                    got = span_clocks(torch, case, before)
                    add("span", case[0], f"after {before} launches", {"clock_mhz": "", "clock_p10": "",
                        "clock_p90": "", "power_w": "", "power_cap_share": "", "samples": 0}, 0.0,
                        got["event_us"], "µs", f"median SM's clock64 span / event time {got['span_mhz']} MHz "
                        f"(lower bound); median CTA's clock64 / global timer {got['timer_mhz']} MHz",
                        got["span_mhz"])
                torch.cuda.empty_cache()
        if "attention" in kinds:
            for case in ATTENTION:
                try:
                    fn, tflop, config = attention_case(torch, case)
                except Exception as e:      # (one case that cannot run leaves the rest)
                    print(f"clock_power: {case[0]}: {type(e).__name__}: {e}", file=sys.stderr)
                    continue
                cfg = ("the kernel's default" if config is None else
                       f"{config.block_m}x{config.block_n}x{config.num_warps}x{config.num_stages}")
                fn()
                torch.cuda.synchronize()
                time.sleep(IDLE_GAP_S)
                # as validate.py measure times a row: do_bench, 10 ms warm-up, 40 ms or 8 calls
                ev0, ev1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                ev0.record()
                fn()
                ev1.record()
                ev1.synchronize()
                rep = min(max(40.0, 8 * ev0.elapsed_time(ev1)), 2000)
                t0 = time.perf_counter()
                ms = triton.testing.do_bench(fn, warmup=10, rep=rep, return_mode="median")
                t1 = time.perf_counter()
                add("attention", case[0], "do_bench", sampler.window(t0, t1), t1 - t0,
                    round(tflop / (ms * 1e-3), 1), "TFLOP/s", f"config {cfg}; do_bench median {ms:.4g} ms")
                time.sleep(IDLE_GAP_S)
                ts, te, launches, ms = sustained(torch, fn)
                add("attention", case[0], "sustained", sampler.window(ts, te), te - ts,
                    round(tflop * launches / (ms * 1e-3), 1) if launches else "", "TFLOP/s",
                    f"config {cfg}; {launches} launches in {ms:.0f} ms after {SETTLE_S} s")
                del fn
                torch.cuda.empty_cache()
    finally:
        sampler.stop()
    write_csv_atomic(args.out, rows, FIELDS)
    print(f"wrote {args.out}: {len(rows)} rows")
    return 0


if __name__ == "__main__":
    sys.exit(main())
