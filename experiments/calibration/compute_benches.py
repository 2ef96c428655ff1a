"""Microbenchmarks of an SM's compute through Triton: tl.dot (wgmma) rates by
dtype and instruction shape, tl.dot beside exp2, pairs and chains of flash
steps (dot_chain: S = A·B, row max, exp2, acc += P·V on operands held on
chip), their two warpgroups' phases, Triton's exp2, and the softmax's mix.
"""
from __future__ import annotations

import itertools
import os

from kernels.provenance import write_csv_atomic

from .runner import Runner, spanned_rate, stamped_clock
from .triton_kernels import DOT_SHAPES, DOT_WARPS


def _dot_tflops(r: Runner, K, dt: str):
    torch = r.torch
    bm, bn, bk = DOT_SHAPES[dt]
    tdt = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp8": torch.float8_e4m3fn}[dt]
    a = (torch.randn(bm, bk, device="cuda") * 0.1).to(tdt)
    b = (torch.randn(bk, bn, device="cuda") * 0.1).to(tdt)
    grid = r.sms * 8
    c = torch.empty(grid * bm * bn, device="cuda", dtype=torch.float32)
    clk = torch.zeros(grid * 4, device="cuda", dtype=torch.int64)
    iters = 4096 if not r.args.quick else 1024

    def fn():
        K["dot_shape"][(grid,)](a, b, c, iters, clk, BM=bm, BN=bn, BK=bk, A_IN_REGS=False,
                                CLOCKED=True, num_warps=DOT_WARPS, num_stages=1)

    fn()
    torch.cuda.synchronize()
    with r.sampler() as s:
        ms = r.event_loop(fn, n=9)
    kmhz, _ = stamped_clock(clk)
    flops = 2.0 * bm * bn * bk * iters * grid
    r.add("tensor_wgmma_triton", dt, flops / (ms * 1e-3) / 1e12, "TFLOP/s", s.mhz, kmhz,
          detail=f"tl.dot loop {bm}x{bn}x{bk}, {DOT_WARPS} warps, operands on chip, {grid} CTAs x "
                 f"{iters} iters; {ms:.2f} ms; kernel clock: clock64 over the global timer in each CTA "
                 f"of the last launch, median")


# Attention-sized products (bf16): (BM, BN, BK, warps, A in registers).
# SS rows are Q Kᵀ (BK = head dim, BN = block_n); RS rows are P V (BK = block_n,
# BN = head dim, P in registers). Enough CTAs per SM to hide issue latency, so
# each figure is the tensor cores' sustained rate for that instruction mix.
WGMMA_SHAPES = ([(bm, bn, bk, w, 0) for bm in (64, 128) for bn in (16, 32, 64, 128, 256)
                 for bk in (64, 128) for w in (4, 8)]
                + [(bm, bn, bk, w, 1) for bm in (64, 128) for bn in (64, 128)
                   for bk in (16, 32, 64, 128) for w in (4, 8)])


def bench_wgmma_shapes(r: Runner, K):
    """Tensor-core throughput per attention-sized tl.dot shape: how the rate falls
    with narrow wgmma instructions (small N) and with A read from SMEM."""
    import re

    torch = r.torch
    for bm, bn, bk, warps, a_regs in WGMMA_SHAPES:
        a = (torch.randn(bm, bk, device="cuda") * 0.1).to(torch.bfloat16)
        b = (torch.randn(bk, bn, device="cuda") * 0.1).to(torch.bfloat16)
        grid = r.sms * 8
        c = torch.empty(grid * bm * bn, device="cuda", dtype=torch.float32)
        iters = max(64, int(4e11 / (grid * 2 * bm * bn * bk)))
        if r.args.quick:
            iters = max(16, iters // 8)

        def fn():
            return K["dot_shape"][(grid,)](a, b, c, iters, c, BM=bm, BN=bn, BK=bk, A_IN_REGS=a_regs,
                                          num_warps=warps, num_stages=1)

        compiled = fn()
        torch.cuda.synchronize()
        ptx = compiled.asm.get("ptx", "")
        instr = sorted(set(re.findall(r"wgmma\.mma_async\.sync\.aligned\.(m\d+n\d+k\d+)", ptx)))
        with r.sampler() as s:
            ms = r.event_loop(fn, n=7)
        flops = 2.0 * bm * bn * bk * iters * grid
        mode = "RS" if a_regs else "SS"
        r.add("wgmma_shape", f"{mode}_{bm}x{bn}x{bk}_w{warps}", flops / (ms * 1e-3) / 1e12, "TFLOP/s",
              s.mhz, detail=f"bf16 tl.dot loop, A {'in registers' if a_regs else 'in SMEM'}, "
                            f"instructions {'/'.join(instr) or '?'}, smem {compiled.metadata.shared} B, "
                            f"{grid} CTAs x {iters} iters; {ms:.3f} ms")


def bench_dot_exp_overlap(r: Runner, K):
    """Whether tensor-core and exp2 work overlap on an SM: time per iteration of a
    product alone, exp2 alone, both in the same warps, and both from different CTAs
    on the same SM (SPLIT, twice the CTAs so each SM gets the same work as 'both').
    Overlap would make 'both' close to max(dot, exp); none makes it their sum."""
    torch = r.torch
    for bm, bn, bk, warps in ((64, 64, 128, 4), (128, 64, 128, 8), (64, 128, 64, 4)):
        a = (torch.randn(bm, bk, device="cuda") * 0.1).to(torch.bfloat16)
        b = (torch.randn(bk, bn, device="cuda") * 0.1).to(torch.bfloat16)
        iters = 2048 if not r.args.quick else 256
        per_sm = 2
        modes = {"dot": (1, 0, 0, 0), "exp": (0, 1, 0, 0), "both": (1, 1, 0, 0), "split": (1, 1, 1, 0),
                 "fma": (0, 1, 0, 1), "split_fma": (1, 1, 1, 1)}
        for mode, (dot, ex, split, fma) in modes.items():
            grid = r.sms * per_sm * (2 if split else 1)
            c = torch.empty(grid * bm * bn, device="cuda", dtype=torch.float32)

            def fn():
                K["dot_exp_mix"][(grid,)](a, b, c, iters, r.sms, BM=bm, BN=bn, BK=bk, DOT=dot, EXP=ex,
                                          SPLIT=split, FMA=fma, num_warps=warps, num_stages=1)

            fn()
            torch.cuda.synchronize()
            with r.sampler() as s:
                ms = r.event_loop(fn, n=7)
            # wall time per iteration: every SM runs per_sm CTAs (x2 when split) at once
            r.add("dot_exp_overlap", f"{bm}x{bn}x{bk}_w{warps}_{mode}", ms * 1e3 / iters, "us/iter",
                  s.mhz, detail=f"{grid} CTAs ({per_sm} per SM{', x2: half dot, half exp' if split else ''}) "
                               f"x {iters} iters; {ms:.3f} ms")


# dot_exp_timing (session 43): a 64x64x128 product CTA beside an exp2 (or
# FMA) CTA on each SM, the elementwise work in bursts of 8 tile iterations
# (8 x 4096 exp2s: 2048 cycles at the MUFU's rate, ~6950 as the H100 runs
# their dependent chains) GAP cycles apart, the products during and right
# after each burst set against those in the gaps
TIMING_SHAPE = (64, 64, 128, 4)
TIMING_ITERS = 512
TIMING_BURSTS = 16
TIMING_BURST = 8
TIMING_GAP = 4000


def hold_windows(product_ends, bursts) -> dict:
    """Where elementwise bursts slow the products beside them: each product's
    interval (from the previous one's end to its own, SM clock cycles) by
    where its midpoint falls: `during` a burst [start, end], `after` one
    (from its end for as long again), else `idle`. Returns {kind: median
    interval} for the kinds that occur, and `n_<kind>` counts."""
    import statistics

    bursts = sorted(bursts)
    kinds: dict = {"idle": [], "during": [], "after": []}
    for t0, t1 in zip(product_ends, product_ends[1:]):
        mid = (t0 + t1) / 2
        kind = "idle"
        for start, end in bursts:
            if start <= mid <= end:
                kind = "during"
                break
            if end < mid <= end + (end - start):
                kind = "after"
                break
        kinds[kind].append(t1 - t0)
    out = {kind: statistics.median(v) for kind, v in kinds.items() if v}
    out.update({f"n_{kind}": len(v) for kind, v in kinds.items()})
    return out


def _timing_stamps(r: Runner, K, a, b, grid: int, bursts: int, **constexprs) -> list[list[int]]:
    """One launch of dot_exp_timing on operands a, b over `grid` CTAs: each
    CTA's STAMPS row (TIMING_ITERS slots, then its SM)."""
    torch = r.torch
    bm, bk = a.shape
    bn = b.shape[1]
    stamps = torch.zeros(grid * (TIMING_ITERS + 1), device="cuda", dtype=torch.int64)
    c = torch.empty(grid, device="cuda", dtype=torch.float32)
    K["dot_exp_timing"][(grid,)](a, b, c, stamps, TIMING_ITERS, r.sms, bursts, BM=bm, BN=bn, BK=bk,
                                 num_stages=1, **constexprs)
    torch.cuda.synchronize()
    return stamps.cpu().view(grid, TIMING_ITERS + 1).tolist()


def bench_dot_exp_timing(r: Runner, K):
    """When does elementwise work hold the SM's tensor pipe: while it runs, or
    after? (The engine charges the serial fraction from the start of each
    softmax phase; a shared tensor pipe settles CTAs as the H100 does only if
    it comes after: experiments/unit_sharing.py, session 43.) One product CTA
    and one elementwise CTA an SM (dot_exp_timing); rows
    `dot_exp_timing`, per elementwise kind: the median product interval
    during a burst and in the window as long right after it, over the one
    in the gaps (per SM, then the median SM), and the SMs that held one of
    each."""
    import statistics

    torch = r.torch
    bm, bn, bk, warps = TIMING_SHAPE
    a = (torch.randn(bm, bk, device="cuda") * 0.1).to(torch.bfloat16)
    b = (torch.randn(bk, bn, device="cuda") * 0.1).to(torch.bfloat16)
    grid = 2 * r.sms
    for kind, fma in (("exp", False), ("fma", True)):
        rows = _timing_stamps(r, K, a, b, grid, TIMING_BURSTS, BURST=TIMING_BURST, GAP=TIMING_GAP, FMA=fma,
                              num_warps=warps)
        products, bursts = {}, {}
        for pid, row in enumerate(rows):
            sm = row[-1]
            if (pid // r.sms) % 2 == 0:
                products.setdefault(sm, []).append(row[:TIMING_ITERS])
            else:
                bursts.setdefault(sm, []).append([(row[2 * k], row[2 * k + 1]) for k in range(TIMING_BURSTS)])
        during, after, idle, lengths = [], [], [], []
        for sm, ends in products.items():
            if len(ends) != 1 or len(bursts.get(sm, ())) != 1:
                continue    # (an SM with other than one of each)
            w = hold_windows(ends[0], bursts[sm][0])
            if "idle" in w and "during" in w and "after" in w:
                during.append(w["during"] / w["idle"])
                after.append(w["after"] / w["idle"])
                idle.append(w["idle"])
                lengths.append(statistics.median(e - s for s, e in bursts[sm][0]))
        if not during:
            r.add("dot_exp_timing", f"{bm}x{bn}x{bk}_w{warps}_{kind}", float("nan"), "ratio",
                  detail="no SM held one product CTA and one burst CTA")
            continue
        for when, ratios in (("during", during), ("after", after)):
            r.add("dot_exp_timing", f"{bm}x{bn}x{bk}_w{warps}_{kind}_{when}", statistics.median(ratios), "ratio",
                  detail=f"median product interval {when} a {kind} burst over the one in the gaps, per SM, "
                         f"median of {len(ratios)} SMs (p10 {sorted(ratios)[len(ratios) // 10]:.3f}, "
                         f"p90 {sorted(ratios)[len(ratios) * 9 // 10]:.3f}); idle interval "
                         f"{statistics.median(idle):.0f} clk, burst {statistics.median(lengths):.0f} clk "
                         f"({TIMING_BURST} iterations), gap {TIMING_GAP} clk, {TIMING_BURSTS} bursts")


# (BM, BN, BK, warps) of dot_fill: Q Kᵀ-sized SS products. 64x64x128 reads
# its operands from SMEM at the SMEM's 128 B a clock (8 m64n64k16 a warpgroup:
# 32 KB in the 256 cycles of its tensor time), so any bandwidth its B tile's
# fill takes (16 KB an iteration) slows it; 64x128x128 reads 48 KB in 512
# cycles, 96 B a clock, and has 32 B a clock to spare for its 32 KB fill of
# 64 B a clock; 128x64x128 with 8 warps is fa2's 128x64 step's Q Kᵀ.
DOT_FILL_SHAPES = ((64, 64, 128, 4), (64, 128, 128, 4), (128, 64, 128, 8))


def bench_dot_fill(r: Runner, K, per_sms=(1, 2)):
    """An SS tl.dot loop whose B tile is held in SMEM ('held') or streamed in
    every iteration by cp.async, every CTA the same tile at once ('stream',
    as a head's CTAs read its K/V), each its own ('distinct': CTA c 13
    tiles on in a 512-tile set, 8-16 MB) or groups of 8 or 33 CTAs each on
    their own ('group8', 'group33': as the heads of a launch whose resident
    CTAs hold 16 or 4 heads), with 1 and 2 CTAs an SM: the SM's
    cycles an iteration (each SM's clock64 from its first CTA's start to its
    last one's end over the iterations of its CTAs, median SM). Whether a
    K/V tile's fill shares the SMEM bandwidth the wgmma operand reads use,
    as the engine charges it (Engine._load, 'smem fill'), and how fast L2
    serves tiles that many SMs read at once (tests/test_wgmma_operands.py)."""
    import re

    torch = r.torch
    # (kind, B tiles, spread, group): CTA c starts at tile spread x (c //
    # group) of 8 tiles (128-256 KB) every CTA reads in step, or of 512
    # (8-16 MB, L2-resident) each CTA or group of CTAs its own way
    variants = (("held", 8, 0, 1), ("stream", 8, 0, 1), ("distinct", 512, 13, 1), ("group8", 512, 13, 8),
                ("group33", 512, 13, 33))
    for bm, bn, bk, warps in DOT_FILL_SHAPES:
        a = (torch.randn(bm, bk, device="cuda") * 0.1).to(torch.bfloat16)
        b = (torch.randn(512 * bk, bn, device="cuda") * 0.1).to(torch.bfloat16)
        iters = 4096 if not r.args.quick else 512
        for per_sm in per_sms:
            grid = r.sms * per_sm
            c = torch.empty(grid, device="cuda", dtype=torch.float32)
            clk = torch.zeros(grid * 4, device="cuda", dtype=torch.int64)
            smid = torch.zeros(grid, device="cuda", dtype=torch.int32)
            for kind, tiles, spread, group in variants:
                stream = kind != "held"

                def fn():
                    return K["dot_stream"][(grid,)](a, b, c, iters, tiles, spread, group, clk, smid, BM=bm, BN=bn,
                                                   BK=bk, STREAM=stream, num_warps=warps, num_stages=3)

                compiled = fn()
                torch.cuda.synchronize()
                ptx = compiled.asm.get("ptx", "")
                instr = sorted(set(re.findall(r"wgmma\.mma_async\.sync\.aligned\.(m\d+n\d+k\d+)", ptx)))
                copies = "tma" if "cp.async.bulk" in ptx else "cp.async" if "cp.async" in ptx else "none"
                with r.sampler() as s:
                    ms = r.event_loop(fn, n=5)
                kmhz, cta_cycles = stamped_clock(clk)
                sm_cycles, ctas_an_sm = _sm_cycles_an_iteration(clk, smid, iters)
                b_is = (f"streamed from L2 ({copies}, 3 stages), {tiles} tiles, CTA c from tile {spread} x "
                        f"(c // {group})") if stream else "held in SMEM"
                r.add("dot_fill", f"{bm}x{bn}x{bk}_w{warps}_x{per_sm}_{kind}",
                      sm_cycles, "cycles/iter", s.mhz, kmhz,
                      detail=f"bf16 tl.dot loop, A in SMEM, B {b_is}, "
                             f"instructions {'/'.join(instr) or '?'}, smem {compiled.metadata.shared} B, "
                             f"{grid} CTAs ({per_sm} an SM; the SMs held {ctas_an_sm}) x {iters} iters; "
                             f"{ms:.3f} ms; a CTA's own cycles an iteration {cta_cycles / iters:.1f} (median CTA)")


def _sm_cycles_an_iteration(clk, smid, iters: int) -> tuple[float, str]:
    """(an SM's clock64 cycles from its first CTA's start to its last one's
    end over its CTAs' iterations, by spanned_rate; how many CTAs the SMs
    held: 'min-max') from clock_stamp's CLK and each CTA's SM id."""
    import numpy as np
    a = clk.cpu().numpy().reshape(-1, 4).astype(np.float64)
    sm = smid.cpu().numpy().astype(np.float64)
    # stamp_span's layout: (cycles, ns) of every CTA, then (start, SM) of every CTA
    spans = np.concatenate([np.stack([a[:, 2] - a[:, 0], a[:, 3] - a[:, 1]], 1).ravel(),
                            np.stack([a[:, 0], sm], 1).ravel()])
    rate, _ = spanned_rate(spans, iters)
    held = np.unique(sm, return_counts=True)[1]
    return 1.0 / rate, f"{held.min()}-{held.max()}"


# (narrow BN1, wide BN2, narrow products per wide one, CTAs of each kind per
# SM) at BM = 64, BK = 64, 4 warps. SS 64x16x64 reads 10 KB of SMEM per 0.13
# MFLOP (SMEM-bound: the wgmma_shape rows); SS 64x256x64 reads 40 KB per 2.1
# MFLOP and SS 64x128x64 24 KB per 1 MFLOP (tensor-bound). With 6 (3) narrow
# products per wide one, the narrow CTAs' SMEM time about equals the wide
# ones' tensor time, so a starved wgmma that holds the pipe makes the mix take
# their sum, independent tensor and SMEM queues 15-20% less. Residency: the
# kernel holds both branches' operands (40 KB) and the 64x256 accumulator
# takes 154 registers a thread, so that pair runs one CTA of each kind per SM.
DOT_PAIRS = ((16, 256, 6, 1), (16, 128, 3, 2))


def bench_dot_pair(r: Runner, K):
    """A narrow (SMEM-bound) and a wide (tensor-bound) wgmma product in different
    CTAs of one SM: time of each alone and of the two together (split), per
    round of `iters2` wide products. Rows `dot_pair`; tests/test_wgmma_operands.py
    replays them in the engine."""
    torch = r.torch
    bm, bk, warps = 64, 64, 4
    for bn1, bn2, ratio, per_sm in DOT_PAIRS:
        a = (torch.randn(bm, bk, device="cuda") * 0.1).to(torch.bfloat16)
        b1 = (torch.randn(bk, bn1, device="cuda") * 0.1).to(torch.bfloat16)
        b2 = (torch.randn(bk, bn2, device="cuda") * 0.1).to(torch.bfloat16)
        iters2 = 1024 if not r.args.quick else 128
        iters1 = iters2 * ratio
        for mode, name in ((1, "narrow"), (2, "wide"), (3, "split")):
            grid = r.sms * per_sm * (2 if mode == 3 else 1)
            c = torch.empty(grid, device="cuda", dtype=torch.float32)

            def fn():
                return K["dot_pair"][(grid,)](a, b1, b2, c, iters1, iters2, r.sms, BM=bm, BK=bk,
                                              BN1=bn1, BN2=bn2, MODE=mode, num_warps=warps,
                                              num_stages=1)

            compiled = fn()
            torch.cuda.synchronize()
            with r.sampler() as s:
                ms = r.event_loop(fn, n=7)
            r.add("dot_pair", f"{bm}x{bn1}x{bk}_{bm}x{bn2}x{bk}_r{ratio}_w{warps}_x{per_sm}_{name}",
                  ms * 1e3, "us", s.mhz,
                  detail=f"{grid} CTAs ({per_sm} per SM{', x2: half narrow, half wide' if mode == 3 else ''}); "
                         f"narrow {iters1} iters, wide {iters2}; smem {compiled.metadata.shared} B; "
                         f"{ms:.3f} ms")


# (BM, BN, D, warps): flash-attention step shapes (block_m, block_n, head dim).
DOT_CHAINS = ((64, 32, 128, 4), (64, 64, 128, 4), (128, 64, 128, 8), (128, 64, 128, 4),
              (64, 64, 64, 4), (128, 64, 64, 8))


# Held out (rows `dot_chain_wide`, which no profile number is reduced from):
# steps 128 keys wide, whose fa2 configs the model takes 5-8% faster than
# their 64-wide twins against the measured sweep (validation_notes.md, session
# 33); 128x128 at D = 128 only with 8 warps (4 would spill).
WIDE_DOT_CHAINS = ((64, 128, 64, 4), (64, 128, 128, 4), (128, 128, 64, 4), (128, 128, 64, 8),
                   (128, 128, 128, 8))


# ... and the other step shapes of fa2's config grid (block_m 64/128, block_n
# 32/64/128, 4/8 warps, D 64/128; rows `dot_chain_more`), but 128x128 with 4
# warps at D = 128, which spills: with the two lists above, every one the
# validation sweep runs (session 33)
MORE_DOT_CHAINS = ((64, 32, 64, 4), (64, 32, 64, 8), (64, 32, 128, 8), (64, 64, 64, 8), (64, 64, 128, 8),
                   (64, 128, 64, 8), (64, 128, 128, 8), (128, 32, 64, 4), (128, 32, 64, 8), (128, 32, 128, 4),
                   (128, 32, 128, 8), (128, 64, 64, 4))


# The fp8 chains (rows `dot_chain_fp8`): the bf16 shapes again with e4m3
# operands, P converted to e4m3. fa3_triton's fp8 rows are 12-21% fast on
# `h100.measured` at D = 64 (mean signed -13.2%, validation_notes.md session
# 39) where the GPU runs the fp8 kernel 5-8% slower than the bf16 one and the
# model 5-15% faster: does the softmax keep the faster products from
# paying off in the chain as well?
FP8_DOT_CHAINS = DOT_CHAINS

# The chains with fa2's whole online softmax (rows `dot_chain_online`, held
# out: no profile number is reduced from them), at 1-4 CTAs an SM: fa2's
# stamps have its 4-warp steps at D = 64 20-29% longer on the GPU than in the
# engine with three or four CTAs an SM, where the bare chain is within 4%
# and streaming K/V costs the GPU less than the engine (validation_notes.md,
# session 39). fa2's compiled step issues twice the bare chain's
# instructions (266 against 133 a warp at 64x64, D = 64, 4 warps).
ONLINE_DOT_CHAINS = ((64, 64, 64, 4), (64, 32, 64, 4), (128, 64, 64, 4), (64, 64, 128, 4),
                     (64, 64, 64, 8), (128, 64, 64, 8), (128, 64, 128, 8))
ONLINE_PER_SM = (1, 2, 3, 4)


def bench_dot_chain(r: Runner, K, shapes=None, bench: str = "dot_chain", dtype: str = "bf16",
                    online: bool = False, per_sms=(1, 2, 4)):
    """Time per iteration of the dependent chain S = A·B -> exp2, row max ->
    acc += P·V with `per_sms` CTAs per SM (rows `bench`). With one CTA an
    iteration costs the chain's round trip; with more, the SM's throughput.
    shapes: (BM, BN, D, warps), DOT_CHAINS unless given. dtype: the
    operands', bf16 or fp8 (e4m3; B and V stored transposed, K-major as fp8
    wgmma takes them). online: fa2's whole online softmax in each step."""
    torch = r.torch
    fp8 = dtype == "fp8"
    elem = torch.float8_e4m3fn if fp8 else torch.bfloat16
    for bm, bn, d, warps in shapes or DOT_CHAINS:
        a = (torch.randn(bm, d, device="cuda") * 0.1).to(elem)
        b = (torch.randn(*((bn, d) if fp8 else (d, bn)), device="cuda") * 0.1).to(elem)
        v = (torch.randn(*((d, bn) if fp8 else (bn, d)), device="cuda") * 0.1).to(elem)
        iters = 2048 if not r.args.quick else 256
        for per_sm in per_sms:
            grid = r.sms * per_sm
            c = torch.empty(grid, device="cuda", dtype=torch.float32)
            clk = torch.zeros(grid * 4, device="cuda", dtype=torch.int64)

            def fn():
                return K["dot_chain"][(grid,)](a, b, v, c, iters, clk, clk, 0, BM=bm, BN=bn, BK=d, D=d,
                                               CLOCKED=True, FP8=fp8, ONLINE=online, num_warps=warps,
                                               num_stages=1)

            compiled = fn()
            torch.cuda.synchronize()
            with r.sampler() as s:
                ms = r.event_loop(fn, n=7)
            kmhz, cta_cycles = stamped_clock(clk)
            r.add(bench, f"{bm}x{bn}x{d}_w{warps}_x{per_sm}", ms * 1e3 / iters, "us/iter", s.mhz, kmhz,
                  detail=f"{dtype}{', online softmax' if online else ''}: "
                         f"{grid} CTAs ({per_sm} per SM, if registers allow: "
                         f"{getattr(compiled, 'n_regs', '?')} a thread) x {iters} iters; "
                         f"smem {compiled.metadata.shared} B; {ms:.3f} ms; flops/iter/CTA {4 * bm * bn * d}; "
                         f"kernel clock: clock64 over the global timer in each CTA of the last launch, median")
            r.add(f"{bench}_cta_cycles", f"{bm}x{bn}x{d}_w{warps}_x{per_sm}", cta_cycles / iters,
                  "clk/iter", s.mhz, kmhz,
                  detail="a CTA's clock64 from its start to its end over its iterations (median CTA of "
                         "the last launch): cycles on the SM that ran it, whatever its clock")


# (BM, BN, D, warps) of dot_chain_stream: fa2's steps at D = 128 that the GPU
# and the engine rank apart (128x64 and 128x128 with 8 warps, the GPU's best
# and the explorer's pick at N16k; 64x64 and 64x128 with 4 warps)
STREAM_CHAINS = ((128, 64, 128, 8), (128, 128, 128, 8), (64, 64, 128, 4), (64, 128, 128, 4))
# ... and 64x64 at D = 64 with one and two warpgroups at 1-4 CTAs an SM
# (dot_chain_stream_d64, session 39): fa2's stamps at D = 64 have the GPU's
# 4-warp steps 20-29% longer than the engine's at three CTAs an SM, the
# 8-warp ones within 9% (fa2_stamps_small_n_h100.csv.gz)
STREAM_CHAINS_D64 = ((64, 64, 64, 4), (64, 64, 64, 8))
STREAM_PER_SM_D64 = (1, 2, 3, 4)
STREAM_TILES = 8        # B and V tiles every CTA cycles through in step: 0.5-2 MB, L2-resident
STREAM_STAGES = 3       # as fa2's best configs
# (kind, tiles, CTA c's first tile / c, stages): held; streamed in step at 3
# stages (the replayed rows), at 2 and 4; each CTA on its own tiles, 13 apart
# in a 512-tile set (16-32 MB, L2-resident), at 3
STREAM_VARIANTS = (("held", 0, 0, 1), ("stream", STREAM_TILES, 0, STREAM_STAGES),
                   ("stream_s2", STREAM_TILES, 0, 2), ("stream_s4", STREAM_TILES, 0, 4),
                   ("distinct", 512, 13, STREAM_STAGES))


# ... and 64x64 and 128x64 at D = 64 with fa2's whole online softmax
# (dot_chain_online_stream, session 40): at N16k fa2's 4-warp configs with
# two warps a sub-partition come out 10-16% fast in cycles, those with four
# within 2.5%, while the online chain held on chip is within 1-10% at every
# count (validation_notes.md, session 40)
ONLINE_STREAM_CHAINS = ((64, 64, 64, 4), (128, 64, 64, 4), (128, 64, 64, 8))
# dot_pair_timing (session 43): product shapes whose tensor time is 128, 256
# and 512 cycles (4096 flop a clock), at 1, 2 and 4 CTAs an SM
PAIR_SHAPES = ((64, 64, 64, 4), (64, 64, 128, 4), (64, 128, 128, 4))
PAIR_PER_SM = (1, 2, 4)


def bench_dot_pair_timing(r: Runner, K):
    """Does an SM's tensor pipe take several CTAs' products in turn or
    together? dot_exp_timing's product loop (PAIR: every CTA runs it; each
    product on the last, each one's end stamped) at 1, 2 and 4 CTAs an SM.
    In turn, whole products alternating, two CTAs settle half a period
    apart; together, interleaved as the pipe takes one CTA's two warpgroups
    (dot_chain_phase, session 27), in step. Rows `dot_pair_timing`:
    `{shape}_x{n}` a CTA's median product interval (clk, median CTA) and,
    from two CTAs an SM on, `{shape}_x{n}_phase` the phase apart of an SM's
    CTAs (co_resident_phases over the middle half; 0 in step, 0.5 furthest)."""
    import statistics

    torch = r.torch
    middle = slice(TIMING_ITERS // 4, 3 * TIMING_ITERS // 4)
    for bm, bn, bk, warps in PAIR_SHAPES:
        a = (torch.randn(bm, bk, device="cuda") * 0.1).to(torch.bfloat16)
        b = (torch.randn(bk, bn, device="cuda") * 0.1).to(torch.bfloat16)
        name = f"{bm}x{bn}x{bk}_w{warps}"
        for per_sm in PAIR_PER_SM:
            grid = per_sm * r.sms
            rows = _timing_stamps(r, K, a, b, grid, 0, BURST=1, GAP=0, FMA=False, PAIR=True, num_warps=warps)
            intervals = sorted(statistics.median(t1 - t0 for t0, t1 in zip(row[middle], row[middle][1:]))
                               for row in rows)
            r.add("dot_pair_timing", f"{name}_x{per_sm}", statistics.median(intervals), "clk",
                  detail=f"{grid} CTAs ({per_sm} an SM) x {TIMING_ITERS} products of {4 * bm * bn * bk // 2} "
                         f"flop, each one's end stamped; a CTA's median interval over the middle half, median "
                         f"CTA (p10 {intervals[grid // 10]:.0f}, p90 {intervals[grid * 9 // 10]:.0f})")
            if per_sm > 1:
                shares, _ = co_resident_phases([row[middle] for row in rows], [row[-1] for row in rows])
                if shares:
                    shares.sort()
                    r.add("dot_pair_timing", f"{name}_x{per_sm}_phase", statistics.median(shares), "share",
                          detail=f"{per_sm} product CTAs an SM: the phase apart of each pair of an SM's CTAs "
                                 f"whose products overlapped, median of {len(shares)} pairs (p10 "
                                 f"{shares[len(shares) // 10]:.2f}, p90 {shares[len(shares) * 9 // 10]:.2f}); "
                                 f"0 in step, 0.5 furthest")


# ... and the wide D = 64 steps whose configs the model rates 10-20% faster
# than the GPU at two CTAs an SM (dot_chain_online_stream_wide, session 43):
# at D64 causal N8192, h100.measured is -21% on 64x128 w4 s3 (two CTAs an
# SM) and -5% on s4 (one), -19% and -10% on 128x128 w4; its top pick there,
# 64x128 w4 s3, runs 16.9% behind the GPU's best (validation_report.md)
ONLINE_STREAM_WIDE_CHAINS = ((64, 128, 64, 4), (128, 128, 64, 4), (128, 128, 64, 8))
ONLINE_STREAM_WIDE_PER_SM = (1, 2)


def _timed_side_by_side(r: Runner, fn, per_sm: int, warps: int, clk):
    """Compile and launch `fn` (a dot_chain launch of `per_sm` CTAs an SM
    stamping `clk`), then time it (event_loop, 5 launches), unless its CTAs
    would not fit an SM together (SMEM, registers: a second wave would run
    alone). None then, else (compiled, registers a thread, ms a launch, the
    NVML clock, the clock read in the kernel, the median CTA's own cycles)."""
    compiled = fn()
    r.torch.cuda.synchronize()
    regs = getattr(compiled, "n_regs", 0) or 0
    if per_sm > 1 and (not r.smem_fits(per_sm, compiled.metadata.shared)
                       or per_sm * regs * 32 * warps > r.props.regs_per_multiprocessor):
        return None
    with r.sampler() as s:
        ms = r.event_loop(fn, n=5)
    kmhz, cta_cycles = stamped_clock(clk)
    return compiled, regs, ms, s.mhz, kmhz, cta_cycles


def _add_launch_and_cta_rows(r: Runner, bench: str, param: str, timed, iters: int, grid: int, per_sm: int,
                             what: str) -> None:
    """Rows `bench` (the launch's time an iteration, in cycles at the clock
    read in the kernel) and `{bench}_cta` (the median CTA's own clock64
    cycles an iteration) of a launch _timed_side_by_side timed; `what` says
    what the launch runs."""
    compiled, regs, ms, mhz, kmhz, cta_cycles = timed
    r.add(bench, param, ms * 1e3 / iters * kmhz, "clk/iter", mhz, kmhz,
          detail=f"{what}: the launch's time an iteration, {ms:.3f} ms / {iters} iters, in cycles at the clock "
                 f"read in the kernel ({kmhz:.0f} MHz); {grid} CTAs ({per_sm} an SM; {regs} registers a "
                 f"thread), smem {compiled.metadata.shared} B")
    r.add(f"{bench}_cta", param, cta_cycles / iters, "clk/iter", mhz, kmhz,
          detail="a CTA's clock64 from its start to its end over its iterations (median CTA)")


def bench_dot_chain_stream(r: Runner, K, chains=STREAM_CHAINS, per_sms=(1, 2), bench="dot_chain_stream",
                           online: bool = False):
    """What do a flash step's K/V loads add to its chain? dot_chain with B
    and V held on chip ('held', one stage, as dot_chain) and streamed from L2
    every step by cp.async (STREAM_VARIANTS: in step at 2, 3 and 4 stages,
    each CTA on its own tiles at 3), at each of `per_sms` CTAs an SM where
    they fit: rows `bench`, a CTA's own clock64 cycles an iteration (median
    CTA), and `{bench}_kernel`, the launch's time an iteration in cycles at
    the clock read in the kernel (above the median CTA's where the CTAs an
    SM do not run side by side throughout). online: fa2's whole online
    softmax in each step. The engine replays the same loops
    (experiments/step_errors.py --stream; tests/test_dot_chain_stream.py)."""
    from triton.runtime.errors import OutOfResources

    torch = r.torch
    for bm, bn, d, warps in chains:
        a = (torch.randn(bm, d, device="cuda") * 0.1).to(torch.bfloat16)
        most = max(tiles for _, tiles, _, _ in STREAM_VARIANTS)
        b = (torch.randn(most * d, bn, device="cuda") * 0.1).to(torch.bfloat16)
        v = (torch.randn(most * bn, d, device="cuda") * 0.1).to(torch.bfloat16)
        iters = 2048 if not r.args.quick else 256
        for per_sm in per_sms:
            grid = r.sms * per_sm
            c = torch.empty(grid, device="cuda", dtype=torch.float32)
            clk = torch.zeros(grid * 4, device="cuda", dtype=torch.int64)
            for kind, tiles, spread, stages in STREAM_VARIANTS:

                def fn():
                    return K["dot_chain"][(grid,)](a, b, v, c, iters, clk, clk, 0, BM=bm, BN=bn, BK=d, D=d,
                                                   CLOCKED=True, TILES=tiles, SPREAD=spread, ONLINE=online,
                                                   num_warps=warps, num_stages=stages)

                try:
                    timed = _timed_side_by_side(r, fn, per_sm, warps, clk)
                except OutOfResources:
                    continue    # its stages do not fit an SM's SMEM (128x128 with four)
                if timed is None:
                    continue
                compiled, regs, ms, mhz, kmhz, cta_cycles = timed
                param = f"{bm}x{bn}x{d}_w{warps}_x{per_sm}_{kind}"
                chain = "dot_chain with fa2's online softmax" if online else "dot_chain"
                r.add(f"{bench}_kernel", param, ms * 1e3 / iters * kmhz, "clk/iter", mhz, kmhz,
                      detail=f"{chain}: the launch's time an iteration, {ms:.3f} ms / {iters} iters, "
                             f"in cycles at the clock read in the kernel ({kmhz:.0f} MHz)")
                r.add(bench, param, cta_cycles / iters,
                      "clk/iter", mhz, kmhz,
                      detail=f"{chain}, B and V {'held on chip' if not tiles else f'streamed: {tiles} tiles, CTA c from tile {spread} x c, {stages} stages'}; "
                             f"{grid} CTAs ({per_sm} an SM; {regs} registers a thread), "
                             f"smem {compiled.metadata.shared} B, {iters} iters, {ms:.3f} ms; a CTA's clock64 "
                             f"from its start to its end over its iterations (median CTA)")


# dot_chain_online_sync (session 44): the online chain held on chip with 0, 1
# or 2 more CTA-wide barriers a step, at 1-4 CTAs an SM. fa2's 4-warp CTAs run
# one warp a sub-partition and meet at two barriers a step; the engine runs a
# warpgroup's four warps as one and charges a barrier nothing, and fa2's steps
# with three 4-warp CTAs an SM come out 15-40% short (two 8-warp CTAs, four
# warps a sub-partition: within 6%; validation_notes.md, session 44). Held
# out: no profile number is reduced from these rows.
SYNC_CHAINS = ((64, 64, 64, 4), (128, 64, 64, 4), (128, 64, 64, 8))
SYNC_PER_SM = (1, 2, 3, 4)
SYNC_COUNTS = (0, 1, 2)


def bench_dot_chain_sync(r: Runner, K):
    """What does a CTA-wide barrier cost a flash step beside other CTAs?
    dot_chain with fa2's online softmax, B and V held on chip, and SYNC_COUNTS
    more barriers a step (SYNC: BAR.SYNC between the softmax and P·V, and
    between S = A·B and the softmax), at
    SYNC_PER_SM CTAs an SM where they fit together: rows
    `dot_chain_online_sync`, the launch's time an iteration in cycles at the
    clock read in the kernel, and `dot_chain_online_sync_cta`, the median
    CTA's own clock64 cycles an iteration."""
    torch = r.torch
    for bm, bn, d, warps in SYNC_CHAINS:
        a = (torch.randn(bm, d, device="cuda") * 0.1).to(torch.bfloat16)
        b = (torch.randn(d, bn, device="cuda") * 0.1).to(torch.bfloat16)
        v = (torch.randn(bn, d, device="cuda") * 0.1).to(torch.bfloat16)
        iters = 2048 if not r.args.quick else 256
        for per_sm in SYNC_PER_SM:
            grid = r.sms * per_sm
            c = torch.empty(grid, device="cuda", dtype=torch.float32)
            clk = torch.zeros(grid * 4, device="cuda", dtype=torch.int64)
            for sync in SYNC_COUNTS:

                def fn():
                    return K["dot_chain"][(grid,)](a, b, v, c, iters, clk, clk, 0, BM=bm, BN=bn, BK=d, D=d,
                                                   CLOCKED=True, ONLINE=True, SYNC=sync, num_warps=warps,
                                                   num_stages=1)

                timed = _timed_side_by_side(r, fn, per_sm, warps, clk)
                if timed is not None:
                    _add_launch_and_cta_rows(
                        r, "dot_chain_online_sync", f"{bm}x{bn}x{d}_w{warps}_x{per_sm}_sync{sync}", timed, iters,
                        grid, per_sm, f"dot_chain with fa2's online softmax, held on chip, {sync} more BAR.SYNC a step")


# dot_chain_parts (session 44): which part of the online step do the K/V
# copies slow? fa2's 64x64 4-warp step at D = 64 pays the GPU 182-217 cycles a
# step for its three-stage copies at every count of 1-4 CTAs an SM, where the
# engine's co-resident CTAs hide most of them (dot_chain_online_stream). The
# whole step and its two products without the softmax, each held and
# streamed. Held out.
PARTS_PER_SM = (1, 2, 3, 4)
PARTS_KINDS = ((0, "full"), (1, "products"))


def bench_dot_chain_parts(r: Runner, K):
    """dot_chain 64x64x64 with 4 warps and fa2's online softmax, whole
    (PARTS 0) and its two products alone (1), with B
    and V held on chip and streamed at STREAM_STAGES stages (every CTA the
    same STREAM_TILES tiles in step), at PARTS_PER_SM CTAs an SM: rows
    `dot_chain_parts`, the launch's time an iteration in cycles at the clock
    read in the kernel, and `dot_chain_parts_cta`, the median CTA's own."""
    torch = r.torch
    bm = bn = d = 64
    warps = 4
    a = (torch.randn(bm, d, device="cuda") * 0.1).to(torch.bfloat16)
    b = (torch.randn(STREAM_TILES * d, bn, device="cuda") * 0.1).to(torch.bfloat16)
    v = (torch.randn(STREAM_TILES * bn, d, device="cuda") * 0.1).to(torch.bfloat16)
    iters = 2048 if not r.args.quick else 256
    for per_sm in PARTS_PER_SM:
        grid = r.sms * per_sm
        c = torch.empty(grid, device="cuda", dtype=torch.float32)
        clk = torch.zeros(grid * 4, device="cuda", dtype=torch.int64)
        for parts, part_name in PARTS_KINDS:
            for kind, tiles, stages in (("held", 0, 1), ("stream", STREAM_TILES, STREAM_STAGES)):

                def fn():
                    return K["dot_chain"][(grid,)](a, b, v, c, iters, clk, clk, 0, BM=bm, BN=bn, BK=d, D=d,
                                                   CLOCKED=True, ONLINE=True, PARTS=parts, TILES=tiles,
                                                   num_warps=warps, num_stages=stages)

                timed = _timed_side_by_side(r, fn, per_sm, warps, clk)
                if timed is not None:
                    _add_launch_and_cta_rows(
                        r, "dot_chain_parts", f"{bm}x{bn}x{d}_w{warps}_x{per_sm}_{part_name}_{kind}", timed, iters,
                        grid, per_sm, f"dot_chain, online softmax step's {part_name}, B and V {kind}"
                                      f"{f' ({tiles} tiles, {stages} stages)' if tiles else ''}")


# The dot_chain shapes with two warpgroups: where the engine and the GPU part
# (tests/test_dot_chain.py's held-out rows)
PHASE_CHAINS = ((128, 64, 128, 8), (128, 64, 64, 8))

PHASE_STEPS = 16


def bench_dot_chain_phase(r: Runner, K):
    """In which order does an SM's tensor pipe serve two warpgroups' products
    issued together? dot_chain with PHASE_STEPS stamps every row's clock64
    once its S is in, for PHASE_STEPS steps in the middle of the run, one
    8-warp CTA an SM.
    Rows `dot_chain_phase`: the median over CTAs and steps of warpgroup 1's
    stamp less warpgroup 0's (each the median of its 64 rows), in cycles;
    the detail gives the step's period, the spread, and how often each
    warpgroup's S came first. The raw stamps go to dot_chain_phase.csv."""
    import numpy as np

    torch = r.torch
    raw = []
    for bm, bn, d, warps in PHASE_CHAINS:
        a = (torch.randn(bm, d, device="cuda") * 0.1).to(torch.bfloat16)
        b = (torch.randn(d, bn, device="cuda") * 0.1).to(torch.bfloat16)
        v = (torch.randn(bn, d, device="cuda") * 0.1).to(torch.bfloat16)
        iters = 2048 if not r.args.quick else 256
        first = iters // 2
        grid = r.sms
        c = torch.empty(grid, device="cuda", dtype=torch.float32)
        stamps = torch.zeros(grid * (PHASE_STEPS + 1) * bm, device="cuda", dtype=torch.int64)

        def fn():
            return K["dot_chain"][(grid,)](a, b, v, c, iters, stamps, stamps, first, BM=bm, BN=bn, BK=d, D=d,
                                           PHASE_STEPS=PHASE_STEPS, num_warps=warps, num_stages=1)

        compiled = fn()
        torch.cuda.synchronize()
        with r.sampler() as smp:
            ms = r.event_loop(fn, n=5)
        t = stamps.cpu().numpy().reshape(grid, PHASE_STEPS + 1, bm)[:, :PHASE_STEPS].astype(np.float64)
        half = bm // 2
        wg0, wg1 = np.median(t[:, :, :half], axis=2), np.median(t[:, :, half:], axis=2)   # [cta, step]
        offset = wg1 - wg0
        period = np.diff(wg0, axis=1)
        spread = np.max(t[:, :, :half], axis=2) - np.min(t[:, :, :half], axis=2)
        shape = f"{bm}x{bn}x{d}_w{warps}_x1"
        r.add("dot_chain_phase", shape, float(np.median(offset)), "clk", smp.mhz,
              detail=f"{grid} CTAs (one an SM) x {iters} steps, stamps at steps {first}-{first + PHASE_STEPS - 1}: "
                     f"warpgroup 1's S in less warpgroup 0's, median {np.median(offset):.0f} clk, "
                     f"p10 {np.percentile(offset, 10):.0f}, p90 {np.percentile(offset, 90):.0f}; |offset| median "
                     f"{np.median(np.abs(offset)):.0f}; warpgroup 0 first in {np.mean(offset > 0):.0%} of steps, "
                     f"together (within 16 clk) in {np.mean(np.abs(offset) <= 16):.0%}; step period median "
                     f"{np.median(period):.0f} clk; rows of one warpgroup within {np.median(spread):.0f} clk "
                     f"(median); {getattr(compiled, 'n_regs', '?')} registers a thread, smem "
                     f"{compiled.metadata.shared} B; {ms:.3f} ms a launch ({ms * 1e3 / iters:.3f} us a step)")
        for cta in range(grid):
            for k in range(PHASE_STEPS):
                raw.append({"shape": shape, "cta": cta, "step": first + k, "wg0_clk": int(wg0[cta, k]),
                            "wg1_clk": int(wg1[cta, k])})
    os.makedirs(r.args.out_dir, exist_ok=True)
    write_csv_atomic(os.path.join(r.args.out_dir, "dot_chain_phase.csv"), raw,
                     ["shape", "cta", "step", "wg0_clk", "wg1_clk"])


# Several CTAs an SM side by side, their steps' phases against each other:
# (block_m, block_n, D, warps, CTAs an SM, how B and V come: a kind of
# STREAM_VARIANTS), each at most what the SM holds at once (registers; a
# launch of more runs in waves, whose CTAs never meet; at 3 and 4 an SM the
# CTAs of one SM reach the stamped steps far apart, and few or no pairs are
# stamped together). Streamed at 2 and 3 stages: do two CTAs wait for their
# copies at once (session 41: the GPU pays 171-213 cycles a step for two
# stages at 2-4 CTAs an SM, the engine with its SMs apart −9…+71)?
SM_PHASE_CHAINS = ((64, 64, 64, 4, 2, "held"), (64, 64, 64, 4, 4, "held"), (64, 32, 64, 4, 2, "held"),
                   (64, 32, 64, 4, 4, "held"), (64, 128, 64, 4, 2, "held"), (64, 128, 64, 4, 3, "held"),
                   (128, 64, 64, 4, 2, "held"), (128, 32, 64, 8, 2, "held"), (64, 64, 128, 4, 2, "held"),
                   (64, 64, 128, 4, 3, "held"),
                   (64, 64, 64, 4, 2, "stream"), (64, 64, 64, 4, 2, "stream_s2"),
                   (128, 64, 64, 4, 2, "stream"), (128, 64, 64, 4, 2, "stream_s2"),
                   (64, 64, 128, 4, 2, "stream"), (64, 64, 128, 4, 2, "stream_s2"))
# ... and two CTAs an SM made to start their loops SPIN cycles apart
# (stagger_start): is the offset they start with the one they keep, and
# does the step follow it? (Session 42: two builds of 64x128x64 fell into
# 0.20 and 0.42 of a period and took 1832 and 1693 cycles a step.)
SM_PHASE_SPINS = ((64, 128, 64, 4, (0, 300, 600, 900)), (128, 64, 64, 4, (0, 300, 600, 900)),
                  (64, 64, 64, 4, (0, 150, 300, 500)))


def _ctas_by_sm(smids) -> list[list[int]]:
    """The CTAs each SM ran, by the SM ids the kernel stored (smids[cta])."""
    by_sm: dict = {}
    for cta, sm in enumerate(smids):
        by_sm.setdefault(int(sm), []).append(cta)
    return list(by_sm.values())


def co_resident_phases(stamps, smids) -> tuple[list[float], list[float]]:
    """How far apart in phase do CTAs running side by side on one SM take
    their steps? stamps[cta][k]: the clock64 (the SM's own counter) at which
    CTA cta's S of step k was in; smids[cta]: its SM. For each pair of CTAs
    of one SM whose stamped steps overlap in time: the median over steps of
    the second's stamp less the first's, as a share of a step's period taken
    round the circle to the nearer in-phase point (0: in step, 0.5: as far
    apart as two can be). Returns (those shares, the median step period in
    cycles of each CTA in a pair)."""
    import numpy as np

    t = np.asarray(stamps, dtype=np.float64)
    shares, periods = [], {}
    for ctas in _ctas_by_sm(smids):
        for i, j in itertools.combinations(ctas, 2):
            if max(t[i][0], t[j][0]) >= min(t[i][-1], t[j][-1]):
                continue        # one after the other (waves): never side by side
            for c in (i, j):
                periods[c] = float(np.median(np.diff(t[c])))
            period = (periods[i] + periods[j]) / 2
            phase = np.mod(t[j] - t[i], period) / period
            shares.append(float(np.median(np.minimum(phase, 1.0 - phase))))
    return shares, list(periods.values())


def sm_spans(ends, smids) -> str:
    """Do the CTAs of an SM start together and end together? ends[cta] = (its
    clock64 at start, at end); per SM with several CTAs, the spread of their
    starts and of their ends, and each CTA's run, in cycles (medians over SMs)."""
    import numpy as np

    e = np.asarray(ends, dtype=np.float64)
    starts, stops = [], []
    for ctas in _ctas_by_sm(smids):
        if len(ctas) > 1:
            starts.append(np.ptp(e[ctas, 0]))
            stops.append(np.ptp(e[ctas, 1]))
    if not starts:
        return "one CTA an SM"
    return (f"the CTAs of an SM start {np.median(starts):.0f} clk apart and end {np.median(stops):.0f} apart, "
            f"a CTA's run {np.median(e[:, 1] - e[:, 0]):.0f} clk (medians)")


def bench_dot_chain_sm_phase(r: Runner, K):
    """Do the CTAs an SM runs at once keep in step or take turns? dot_chain
    (operands held on chip, or B and V streamed) as SM_PHASE_CHAINS lists
    it, every row's clock64 stamped once its S is in for PHASE_STEPS steps
    in the middle of the run, and each CTA's SM. Held out: no profile number comes from it (experiments/
    unit_sharing.py asks the same of the engine's rules).
    Rows `dot_chain_sm_phase`: the median over SMs and pairs of co-resident
    CTAs of their phase apart (co_resident_phases: 0 in step, 0.5 furthest);
    the detail gives its spread and the step's period. The raw stamps (a CTA's
    median row a step) go to dot_chain_sm_phase.csv."""
    import numpy as np

    torch = r.torch
    raw = []
    variants = {kind: (tiles, spread, stages) for kind, tiles, spread, stages in STREAM_VARIANTS}
    cases = [(*chain, 0) for chain in SM_PHASE_CHAINS]
    cases += [(bm, bn, d, warps, 2, "held", spin) for bm, bn, d, warps, spins in SM_PHASE_SPINS for spin in spins]
    for bm, bn, d, warps, per_sm, kind, spin in cases:
        tiles, spread, stages = variants[kind]
        a = (torch.randn(bm, d, device="cuda") * 0.1).to(torch.bfloat16)
        b = (torch.randn(max(1, tiles) * d, bn, device="cuda") * 0.1).to(torch.bfloat16)
        v = (torch.randn(max(1, tiles) * bn, d, device="cuda") * 0.1).to(torch.bfloat16)
        iters = 2048 if not r.args.quick else 256
        first = iters // 2
        grid = r.sms * per_sm
        c = torch.empty(grid, device="cuda", dtype=torch.float32)
        stamps = torch.zeros(grid * (PHASE_STEPS + 1) * bm, device="cuda", dtype=torch.int64)
        smid = torch.full((grid, ), -1, device="cuda", dtype=torch.int32)
        clk = torch.zeros(grid * 4, device="cuda", dtype=torch.int64)     # each CTA's start and end
        arrived = torch.zeros(r.sms, device="cuda", dtype=torch.int32) if spin else None

        def fn():
            return K["dot_chain"][(grid,)](a, b, v, c, iters, clk, stamps, first, BM=bm, BN=bn, BK=d, D=d,
                                           CLOCKED=True, PHASE_STEPS=PHASE_STEPS, TILES=tiles, SPREAD=spread,
                                           SMID=smid, ARRIVED=arrived, PER_SM=per_sm, SPIN=spin,
                                           num_warps=warps, num_stages=stages)

        compiled = fn()
        torch.cuda.synchronize()
        with r.sampler() as smp:
            ms = r.event_loop(fn, n=5)
        t = np.median(stamps.cpu().numpy().reshape(grid, PHASE_STEPS + 1, bm)[:, :PHASE_STEPS], axis=2)
        sms = smid.cpu().numpy()
        ends = clk.cpu().numpy().reshape(grid, 4)[:, [0, 2]]      # clock64 at a CTA's start and end
        spans = sm_spans(ends, sms)
        shares, periods = co_resident_phases(t, sms)
        shape = f"{bm}x{bn}x{d}_w{warps}_x{per_sm}" + ("" if kind == "held" else f"_{kind}") + \
            (f"_spin{spin}" if spin else "")
        for cta in range(grid):
            for k in range(PHASE_STEPS):
                raw.append({"shape": shape, "cta": cta, "sm": int(sms[cta]), "start_clk": int(ends[cta, 0]),
                            "end_clk": int(ends[cta, 1]), "step": first + k, "clk": int(t[cta, k])})
        if not shares:
            r.add("dot_chain_sm_phase", shape, "nan", "share of a period", smp.mhz,
                  detail=f"no two CTAs of an SM took their stamped steps at the same time ({spans}; "
                         f"registers {getattr(compiled, 'n_regs', '?')} a thread, smem {compiled.metadata.shared} B)")
            continue
        shares_a = np.array(shares)
        r.add("dot_chain_sm_phase", shape, float(np.median(shares_a)), "share of a period", smp.mhz,
              detail=f"B and V {'held on chip' if not tiles else f'streamed, every CTA the same tile at once, {stages} stages'}; "
                     f"{f'the second CTA on an SM starts its loop {spin} clk after the first; ' if spin else ''}"
                     f"{grid} CTAs x {iters} steps, stamps at steps {first}-{first + PHASE_STEPS - 1}; "
                     f"{len(shares)} pairs of CTAs side by side on an SM: phase apart p10 "
                     f"{np.percentile(shares_a, 10):.2f}, p90 {np.percentile(shares_a, 90):.2f}, within 0.05 "
                     f"of in step {np.mean(shares_a <= 0.05):.0%}, beyond 0.4 {np.mean(shares_a >= 0.4):.0%}; "
                     f"step period median {np.median(periods):.0f} clk; {spans}; "
                     f"{getattr(compiled, 'n_regs', '?')} registers a thread, smem {compiled.metadata.shared} B; "
                     f"{ms:.3f} ms a launch")
    os.makedirs(r.args.out_dir, exist_ok=True)
    write_csv_atomic(os.path.join(r.args.out_dir, "dot_chain_sm_phase.csv"), raw,
                     ["shape", "cta", "sm", "start_clk", "end_clk", "step", "clk"])


def bench_exp2_triton(r: Runner, K):
    torch = r.torch
    BLOCK, grid, iters = 1024, r.sms * 16, 2048
    out = torch.empty(grid * BLOCK, device="cuda", dtype=torch.float32)

    def fn():
        K["exp2_loop"][(grid,)](out, iters, BLOCK=BLOCK, num_warps=4)

    fn()
    torch.cuda.synchronize()
    with r.sampler() as s:
        ms = r.event_loop(fn, n=7)
    rate = grid * BLOCK * iters / (ms * 1e-3)
    r.add("exp2_triton", "tl.exp2 /s", rate, "1/s", s.mhz,
          detail=f"dependent chain x <- exp2(-x), {grid} CTAs x {BLOCK} x {iters}; {ms:.3f} ms "
                 f"(per clk per SM at the NVML clock: {rate / (r.sms * (s.mhz or 1) * 1e6):.2f})")

SOFTMAX_MIX_TILES = ((16, 64), (32, 64), (32, 128), (64, 64), (64, 128), (128, 64))

SOFTMAX_MIX_WARPS = 4


def bench_softmax_mix(r: Runner, K):
    """Time per loop iteration of softmax_mix (rows `softmax_mix`) with 1, 2, 4
    and 8 CTAs per SM, beside its loop's SASS: instructions a warp issues per
    iteration and how many are MUFU. With the SM saturated, SM clocks per CTA
    iteration against the issue bound (instructions x warps / 4 schedulers)
    and the MUFU bound (MUFU x 32 lanes x warps / 16 a clock)."""
    from kernels import sass

    torch = r.torch
    iters = 1024 if not r.args.quick else 128
    for (bm, bn), exp in itertools.product(SOFTMAX_MIX_TILES, (True, False)):
        x = torch.randn(bm * bn, device="cuda", dtype=torch.float32)
        counts = None
        for per_sm in (1, 2, 4, 8, 16):
            grid = r.sms * per_sm
            out = torch.empty(grid * bm, device="cuda", dtype=torch.float32)

            def fn():
                return K["softmax_mix"][(grid,)](x, out, iters, BM=bm, BN=bn, EXP=exp,
                                                 num_warps=SOFTMAX_MIX_WARPS, num_stages=1)

            compiled = fn()
            torch.cuda.synchronize()
            if counts is None:
                bodies = sass.loops(sass.cuobjdump(compiled, "-sass") or "")
                body = max(bodies, key=len) if bodies else []
                counts = (len(body), sum(sass.opcode(i) == "MUFU" for i in body))
            with r.sampler() as smp:
                ms = r.event_loop(fn, n=7)
            mhz = smp.mhz or float(r.prov["sm_clock_mhz"] or 0) or None
            instr, mufu = counts
            cycles = ms * 1e-3 / iters * (mhz or 0) * 1e6 / per_sm     # SM clocks per CTA iteration
            issue = instr * SOFTMAX_MIX_WARPS / 4
            mufu_bound = mufu * 32 * SOFTMAX_MIX_WARPS / 16
            r.add("softmax_mix", f"{bm}x{bn}_w{SOFTMAX_MIX_WARPS}{'' if exp else '_noexp'}_x{per_sm}", cycles,
                  "clk/cta-iter", mhz,
                  detail=f"{grid} CTAs ({per_sm} per SM, {getattr(compiled, 'n_regs', '?')} registers a thread) "
                         f"x {iters} iters, {ms:.3f} ms; loop: {instr} instructions a warp, {mufu} MUFU; "
                         f"issue bound {issue:.0f}, MUFU bound {mufu_bound:.0f} clk per CTA iteration")
