"""Microbenchmarks through the CUDA C kernels (cuda_kernels.py): mma.sync, exp2,
FMA and SMEM rates, pointer-chase latencies (alone, per SM, under load,
against the clock), cp.async copies into an SMEM ring, a CTA's turnover and
its stamps, and the cost of a launch.
"""
from __future__ import annotations

import os
import statistics
import time

from kernels.provenance import write_csv_atomic

from .runner import SMEM_RESERVED_PER_CTA, Runner, _clock_of, spanned_rate
from .triton_kernels import DOT_SHAPES, DOT_WARPS


def bench_cuda(r: Runner, mod):
    import cupy
    import numpy as np

    sms = r.sms
    grid, threads = sms * 8, 256

    def run(name, iters, extra=(), n=5):
        k = mod.get_function(name)
        out = cupy.empty(grid * threads, dtype=cupy.float32)
        clk = cupy.zeros(4 * grid, dtype=cupy.uint64)   # (stamp_span's; stamp fills the first half)
        args = (out, np.int32(iters)) + tuple(extra) + (clk,)
        k((grid,), (threads,), args)
        cupy.cuda.Device().synchronize()
        times = []
        with r.sampler() as s:
            for _ in range(n):
                st, en = cupy.cuda.Event(), cupy.cuda.Event()
                st.record()
                k((grid,), (threads,), args)
                en.record()
                en.synchronize()
                times.append(cupy.cuda.get_elapsed_time(st, en))
        ms = statistics.median(times)
        raw = clk.get()
        kmhz, cycles = _clock_of(raw[:2 * grid])
        return ms, kmhz, cycles, s.mhz, raw

    def spanned(bench, per_block, unit, nv, kmhz, raw):
        # the same launch's rate a clock by each SM's own cycles (spanned_rate)
        v, n = spanned_rate(raw, per_block)
        r.add(bench, "per_clk_per_sm_spanned", v, unit, nv, kmhz,
              detail=f"each SM's blocks' work / its clock64 cycles from its first block's start to "
                     f"its last one's end (no timer), median over {n} SMs")

    # exp2 (MUFU)
    iters = 4096
    ms, kmhz, cyc, nv, raw = run("ex2_loop", iters)
    total = grid * threads * iters * 8.0
    r.add("exp2_cuda", "ex2.approx.ftz.f32 /s", total / (ms * 1e-3), "1/s", nv, kmhz,
          detail=f"{grid}x{threads} threads x {iters} x 8 chains; {ms:.3f} ms")
    per_clk = total / (ms * 1e-3) / (sms * kmhz * 1e6)
    r.add("exp2_cuda", "per_clk_per_sm", per_clk, "1/clk/SM", nv, kmhz,
          detail="rate / (SMs x SM clock read in-kernel: clock64 / globaltimer)")
    spanned("exp2_cuda", total / grid, "1/clk/SM", nv, kmhz, raw)
    # FFMA
    ms, kmhz, cyc, nv, raw = run("ffma_loop", iters, (np.float32(0.999), np.float32(0.001)))
    total = grid * threads * iters * 8.0
    r.add("ffma_cuda", "per_clk_per_sm", total / (ms * 1e-3) / (sms * kmhz * 1e6), "FMA/clk/SM", nv,
          kmhz, detail=f"{total / (ms * 1e-3) / 1e12:.2f} T FMA/s; 8 independent chains")
    spanned("ffma_cuda", total / grid, "FMA/clk/SM", nv, kmhz, raw)
    # SMEM
    iters = 2048
    ms, kmhz, cyc, nv, raw = run("smem_read", iters)
    total = grid * threads * iters * 8 * 16.0
    r.add("smem_read_cuda", "per_clk_per_sm", total / (ms * 1e-3) / (sms * kmhz * 1e6), "B/clk/SM",
          nv, kmhz, detail=f"ld.shared.v4 conflict-free; {total / (ms * 1e-3) / 1e12:.1f} TB/s total")
    spanned("smem_read_cuda", total / grid, "B/clk/SM", nv, kmhz, raw)
    # mma.sync
    for name, dt, flop_per in (("mma_bf16", "bf16", 2 * 16 * 8 * 16), ("mma_f16", "fp16", 2 * 16 * 8 * 16),
                               ("mma_e4m3", "fp8", 2 * 16 * 8 * 32)):
        try:
            iters = 4096
            ms, kmhz, cyc, nv, _ = run(name, iters)
            warps = grid * threads // 32
            flops = warps * iters * 8.0 * flop_per
            r.add("tensor_mma_sync_cuda", dt, flops / (ms * 1e-3) / 1e12, "TFLOP/s", nv, kmhz,
                  detail=f"mma.sync m16n8k{flop_per // 256}, 8 independent accumulators/warp, "
                         f"{grid}x{threads}; {ms:.2f} ms")
        except Exception as e:
            r.add("tensor_mma_sync_cuda", dt, "nan", "TFLOP/s", detail=f"failed: {str(e)[:200]}")


def _chase_chain(torch, ws_bytes: int, seed: int):
    """A random cycle through the 128 B lines of a ws_bytes buffer for
    chase_plain: element 32·i holds the index of the next line's element.
    Returns (buffer, start index, lines)."""
    lines = ws_bytes // 128
    g = torch.Generator(device="cuda")
    g.manual_seed(seed)
    perm = torch.randperm(lines, device="cuda", generator=g).to(torch.int64)
    arr = torch.zeros(lines * 32, dtype=torch.int32, device="cuda")
    arr[perm * 32] = (torch.roll(perm, -1) * 32).to(torch.int32)
    return arr, int(perm[0].item()) * 32, lines


def _as_cupy_u32(arr):
    """A chain from _chase_chain as the uint32 CuPy array the CUDA chases take
    (a view of the torch buffer, which it keeps alive)."""
    import cupy
    ptr = cupy.cuda.MemoryPointer(cupy.cuda.UnownedMemory(arr.data_ptr(), arr.numel() * 4, arr), 0)
    return cupy.ndarray((arr.numel(),), dtype=cupy.uint32, memptr=ptr)


def bench_latency(r: Runner, mod):
    import cupy
    import numpy as np
    torch = r.torch

    out = cupy.zeros(2, dtype=cupy.uint64)
    steps = 4096
    rng = np.random.default_rng(7)
    for regime, ws in (("l2", 4 << 20), ("dram", 1 << 30)):
        arr, start, lines = _chase_chain(torch, ws, 1 if regime == "l2" else 2)
        carr = _as_cupy_u32(arr)
        warm = lines if regime == "l2" else 64  # l2: touch every line first; dram: only a few
        res = {}
        for kind in ("plain", "tma"):
            try:
                k = mod.get_function(f"chase_{kind}")
                vals = []
                with r.sampler() as s:
                    for rep in range(3):
                        # dram: every (kind, repetition) starts at its own random line, so no
                        # chase walks lines an earlier one left in L2
                        st = start if regime == "l2" else int(rng.integers(lines)) * 32
                        k((1,), (32,), (carr, np.int32(warm), np.int32(steps), np.uint32(st), out))
                        cupy.cuda.Device().synchronize()
                        vals.append(int(out[0].get()) / steps)
                res[kind] = statistics.median(vals)
                r.add("latency", f"{kind}_{regime}", res[kind], "cycles", s.mhz,
                      detail=f"1-thread pointer chase over {ws >> 20} MB of 128 B lines, random order, "
                             f"{steps} steps, clock64; " +
                             ("ld.global.cg" if kind == "plain" else
                              "cp.async.bulk 16 B -> SMEM + mbarrier expect_tx/try_wait") +
                             f"; reps {', '.join(f'{v:.0f}' for v in vals)}")
            except Exception as e:
                r.add("latency", f"{kind}_{regime}", "nan", "cycles", detail=f"failed: {str(e)[:200]}")
        if "plain" in res and "tma" in res:
            r.add("latency", f"tma_extra_{regime}", res["tma"] - res["plain"], "cycles",
                  detail="TMA chase minus plain chase, same chain")
        del arr


def bench_latency_per_sm(r: Runner, mod):
    """chase_plain's L2 latency from each SM (rows `latency_per_sm`,
    param sm_<id>): one block an SM, all at once, each chasing its own
    stretch of one random cycle through a 4 MB L2-resident set (ld.global.cg),
    the second of two launches timed (the first leaves the set in L2). A
    single thread's chase puts next to no load on L2. Do SMs differ? (CTAs
    that stay in lock-step collide at L2 every step; on the H100 they drift
    apart: fa2_stamps.py lone, session 28.)"""
    import cupy
    import numpy as np
    torch = r.torch
    steps = 2048
    arr, start, lines = _chase_chain(torch, 4 << 20, 1)
    # the chain's order: walk it once on the host to space the blocks' starts along it
    nxt = arr.view(-1, 32)[:, 0].cpu().numpy() // 32
    order = np.empty(lines, dtype=np.int64)
    j = start // 32
    for k in range(lines):
        order[k] = j
        j = nxt[j]
    blocks = r.sms
    starts = cupy.asarray((order[np.arange(blocks) * (lines // blocks)] * 32).astype(np.uint32))
    carr = _as_cupy_u32(arr)
    out = cupy.zeros(3 * blocks, dtype=cupy.uint64)
    k = mod.get_function("chase_per_sm")
    per_sm: dict = {}
    with r.sampler() as s:
        for rep in range(4):
            k((blocks,), (32,), (carr, np.int32(steps), starts, out))
            cupy.cuda.Device().synchronize()
            if rep == 0:
                continue        # (the set enters L2)
            got = out.get().reshape(blocks, 3)
            for cycles, sm, _ in got:
                per_sm.setdefault(int(sm), []).append(int(cycles) / steps)
    for sm in sorted(per_sm):
        vals = per_sm[sm]
        r.add("latency_per_sm", f"sm_{sm}", statistics.median(vals), "cycles", s.mhz,
              detail=f"1-thread pointer chase, {steps} steps over a 4 MB L2-resident set (ld.global.cg), "
                     f"{blocks} blocks at once; median of {len(vals)} blocks/launches: "
                     + ", ".join(f"{v:.0f}" for v in vals))
    del arr


# Background readers for loaded_latency: CTAs of 8 warps streaming ld.global.cg
# (0 = the chase alone, 528 = 4 an SM: every SM reading as hard as it can)
LOADED_BACKGROUND_CTAS = (0, 16, 33, 66, 132, 264, 528)


def bench_loaded_latency(r: Runner, K, mod):
    """The pointer chase of `latency` (one thread, ld.global.cg, random 128 B
    lines) timed while other CTAs stream reads: from HBM (a 2 GB buffer; the
    chase over 1 GB, so both miss L2) and from L2 (a 16 MB buffer; the chase
    over 4 MB, both L2-resident). Rows `loaded_latency`: the chase's cycles a
    step beside the background's own bandwidth, for LOADED_BACKGROUND_CTAS
    readers. The model's HBM and L2 are bandwidth shared among requests plus
    a fixed latency; this tells how much later a load lands when the memory
    is busy than that sharing alone makes it (a 128 B chase step takes no
    bandwidth to speak of)."""
    import cupy
    import numpy as np
    torch = r.torch
    chase = mod.get_function("chase_plain")
    BLOCK, UNROLL = 2048, 4
    out = cupy.zeros(2, dtype=cupy.uint64)
    steps = 2048 if not r.args.quick else 256
    rng = np.random.default_rng(11)
    bg_stream, chase_stream = torch.cuda.Stream(), torch.cuda.Stream()
    for regime, ws_chase, ws_bg in (("dram", 1 << 30, 2 << 30), ("l2", 4 << 20, 16 << 20)):
        arr, start, lines = _chase_chain(torch, ws_chase, 3 if regime == "dram" else 4)
        carr = _as_cupy_u32(arr)
        big = torch.randn(ws_bg // 4, device="cuda", dtype=torch.float32)
        nblocks = ws_bg // (BLOCK * 4)
        warm = lines if regime == "l2" else 64
        for ctas in LOADED_BACKGROUND_CTAS:
            part = torch.empty(max(ctas, 1) * BLOCK, device="cuda", dtype=torch.float32)
            # enough background to outlast the chase several times over, even slowed
            per_launch = (24 << 30) if regime == "dram" else (96 << 30)
            iters = max(1, per_launch // (max(ctas, 1) * UNROLL * BLOCK * 4))
            vals, bws, margins = [], [], []
            with r.sampler() as smp:
                for rep in range(3):
                    torch.cuda.synchronize()
                    if ctas:
                        t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                        with torch.cuda.stream(bg_stream):
                            t0.record()
                            K["l2_read"][(ctas,)](big, part, nblocks, iters, BLOCK=BLOCK, UNROLL=UNROLL,
                                                  num_warps=8)
                            t1.record()
                        time.sleep(0.002)   # the readers in full swing before the chase starts
                    st = start if regime == "l2" else int(rng.integers(lines)) * 32
                    done = torch.cuda.Event(enable_timing=True)
                    with cupy.cuda.ExternalStream(chase_stream.cuda_stream):
                        chase((1,), (32,), (carr, np.int32(warm), np.int32(steps), np.uint32(st), out))
                    done.record(chase_stream)
                    torch.cuda.synchronize()
                    vals.append(int(out[0].get()) / steps)
                    if ctas:
                        bws.append(iters * ctas * UNROLL * BLOCK * 4 / (t0.elapsed_time(t1) * 1e-3) / 1e9)
                        # > 0: the chase ended while the readers still ran (it was loaded throughout)
                        margins.append(done.elapsed_time(t1))
            bw = statistics.median(bws) if bws else 0.0
            overlap = (f"; the chase ended {min(margins):.1f}-{max(margins):.1f} ms before the readers"
                       if margins else "")
            r.add("loaded_latency", f"{regime}_{ctas}ctas", statistics.median(vals), "cycles", smp.mhz,
                  detail=f"1-thread chase over {ws_chase >> 20} MB ({steps} steps, clock64) while {ctas} CTAs "
                         f"of 8 warps re-read {ws_bg >> 20} MB (ld.global.cg) at {bw:.0f} GB/s; "
                         f"reps {', '.join(f'{v:.0f}' for v in vals)}{overlap}")
        del arr, big


# latency_clock: the tl.dot loop on every SM for this long before the chase, so
# the power cap has lowered the clock (1650 MHz sustained, clock_power_h100.csv)
LATENCY_CLOCK_HEAT_S = 0.3


# ... on all SMs but these, left free for the chase (a tl.dot CTA may hold all of an SM's registers)
LATENCY_CLOCK_FREE_SMS = 4


def bench_latency_clock(r: Runner, K, mod):
    """Does a load's latency follow the SM clock? The pointer chase of
    `latency` (one thread, ld.global.cg), from L2 and from HBM, timed two
    ways: in cycles (clock64) and in ns (CUDA events around it), alone (the
    top clock) and while a tl.dot loop runs on every SM and the power cap
    holds the clock down. Rows `latency_clock`: cycles and ns a step, NVML's
    clock read right before and after the chases (clock_mhz_nvml), and the
    clock cycles over ns imply. A latency fixed in ns (memory-side) takes fewer cycles
    at the lower clock; one fixed in cycles (SM-side) takes more ns. The
    profiles keep latencies in cycles, measured at the top clock, and the
    engine turns them into time at the profile's clock (1816 MHz), which is
    right only for the SM-side part."""
    import cupy
    import numpy as np
    torch = r.torch
    chase = mod.get_function("chase_plain")
    out = cupy.zeros(2, dtype=cupy.uint64)
    steps = 4096
    rng = np.random.default_rng(13)
    bm, bn, bk = DOT_SHAPES["bf16"]
    a = (torch.randn(bm, bk, device="cuda") * 0.1).to(torch.bfloat16)
    b = (torch.randn(bk, bn, device="cuda") * 0.1).to(torch.bfloat16)
    c = torch.empty(r.sms * bm * bn, device="cuda", dtype=torch.float32)
    clk = torch.zeros(r.sms * 4, device="cuda", dtype=torch.int64)
    # ~0.6 s of products, one CTA an SM
    heat_iters = int(0.6 / 0.57e-6)
    bg_stream, chase_stream = torch.cuda.Stream(), torch.cuda.Stream()
    for regime, ws in (("l2", 4 << 20), ("dram", 1 << 30)):
        arr, start, lines = _chase_chain(torch, ws, 5 if regime == "l2" else 6)
        carr = _as_cupy_u32(arr)
        warm = lines if regime == "l2" else 64
        for state in ("alone", "capped"):
            cycles, nss, clocks = [], [], []      # clocks: NVML's, read right before and after the chases
            with r.sampler() as smp:
                for rep in range(3):
                    torch.cuda.synchronize()
                    time.sleep(0.2)
                    if state == "capped":
                        with torch.cuda.stream(bg_stream):
                            K["dot_shape"][(r.sms - LATENCY_CLOCK_FREE_SMS,)](a, b, c, heat_iters, clk,
                                                                               BM=bm, BN=bn, BK=bk,
                                                     A_IN_REGS=False, CLOCKED=False, num_warps=DOT_WARPS,
                                                     num_stages=1)
                        time.sleep(LATENCY_CLOCK_HEAT_S)
                    # two chases back to back, short then long: the difference of their
                    # event times over the difference of their steps is ns a step, free of
                    # the launch and of the warm-up walk
                    times, counted = [], 0
                    clocks.append(r.nvml_clock())
                    for n in (steps, 3 * steps):
                        st = start if regime == "l2" else int(rng.integers(lines)) * 32
                        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                        e0.record(chase_stream)
                        with cupy.cuda.ExternalStream(chase_stream.cuda_stream):
                            chase((1,), (32,), (carr, np.int32(warm), np.int32(n), np.uint32(st), out))
                        e1.record(chase_stream)
                        e1.synchronize()
                        times.append(e0.elapsed_time(e1) * 1e6)
                        counted = int(out[0].get())
                    clocks.append(r.nvml_clock())
                    cycles.append(counted / (3 * steps))
                    nss.append((times[1] - times[0]) / (2 * steps))
                    torch.cuda.synchronize()
            cyc, ns = statistics.median(cycles), statistics.median(nss)
            at = statistics.median([x for x in clocks if x]) if any(clocks) else smp.mhz
            r.add("latency_clock", f"{regime}_{state}_cycles", cyc, "cycles", at,
                  detail=f"1-thread chase over {ws >> 20} MB, {3 * steps} steps, clock64; " +
                         ("alone" if state == "alone" else
                          f"beside a tl.dot loop on {r.sms - LATENCY_CLOCK_FREE_SMS} SMs, started "
                          f"{LATENCY_CLOCK_HEAT_S} s before") +
                         f"; reps {', '.join(f'{v:.0f}' for v in cycles)}")
            r.add("latency_clock", f"{regime}_{state}_ns", ns, "ns", at,
                  detail=f"the chase of {steps} and of {3 * steps} steps on CUDA events: their difference "
                         f"over {2 * steps} steps; implied clock {cyc / ns * 1e3:.0f} MHz; "
                         f"reps {', '.join(f'{v:.1f}' for v in nss)}")
        del arr


# cp_async: ring depths, threads a CTA, 16 B vectors a thread a tile (kernels
# cp_async_d{depth}_v{vpt}: 4-64 KB tiles; 0: the loop without copies)
CP_ASYNC_DEPTHS = (1, 2, 3, 4)

CP_ASYNC_VPT = {128: (0, 2, 4, 8, 16, 32), 256: (0, 1, 2, 4, 8, 16)}

CP_ASYNC_SET_BYTES = 4 << 20     # L2-resident (50 MB L2)

CP_ASYNC_TILES_PER_CTA = 512


def bench_cp_async(r: Runner, mod):
    """Tile copies global -> SMEM with cp.async, as Triton's fa2 and standard
    kernels pipeline their K/V tiles (CUDA kernels cp_async_d{depth}_v{vpt};
    tiles from a 4 MB L2-resident set). Rows `cp_async`: the median CTA's
    clock64 cycles a tile (its loop's iteration).
    - one CTA alone (`1cta_...`): with depth 1 a tile's whole round trip is
      exposed, so cycles against bytes give the copy's fixed cost (the
      intercept, less the loop's own skeleton: the `0KB` rows) and the rate a
      CTA fills its SMEM at (the slope): rows `cp_async_fit`. Deeper rings show
      how much of it a pipeline hides;
    - every SM busy (`{1,2}x132cta_...`): the same copies when all SMs share
      the L2, and the launch's aggregate rate (detail)."""
    import cupy
    import numpy as np

    src = cupy.random.random(CP_ASYNC_SET_BYTES // 4, dtype=cupy.float32)
    smem_max = int(r.props.shared_memory_per_block_optin)
    tiles = CP_ASYNC_TILES_PER_CTA if not r.args.quick else 64

    def launch(depth, grid, threads, vpt, reps=3):
        k = mod.get_function(f"cp_async_d{depth}_v{vpt}")
        tile_bytes = vpt * threads * 16
        smem = max(depth * tile_bytes, 16 * threads)
        k.max_dynamic_shared_size_bytes = smem
        set_tiles = CP_ASYNC_SET_BYTES // tile_bytes if tile_bytes else 1
        out = cupy.empty(grid * threads, dtype=cupy.float32)
        clk = cupy.zeros(2 * grid, dtype=cupy.uint64)
        args = (src, np.int32(set_tiles), np.int32(tiles), out, clk)
        k((grid,), (threads,), args, shared_mem=smem)     # warm: the set into L2
        cupy.cuda.Device().synchronize()
        cycles, mhz, spans = [], [], []
        for _ in range(reps):
            k((grid,), (threads,), args, shared_mem=smem)
            cupy.cuda.Device().synchronize()
            c = clk.get()
            kmhz, cyc = _clock_of(c)
            cycles.append(cyc / tiles)
            mhz.append(kmhz)
            spans.append(float(c.reshape(-1, 2)[:, 1].max()))
        i = int(np.argsort(cycles)[len(cycles) // 2])
        return cycles[i], mhz[i], spans[i], cycles

    depth1: dict = {}
    with r.sampler() as s:
        for threads, vpts in CP_ASYNC_VPT.items():
            for depth in CP_ASYNC_DEPTHS:
                for vpt in vpts:
                    nbytes = vpt * threads * 16
                    if depth * nbytes > smem_max:
                        continue
                    cyc, kmhz, _, reps = launch(depth, 1, threads, vpt)
                    if depth == 1:
                        depth1.setdefault(threads, []).append((nbytes, cyc))
                    rate = f"{nbytes / cyc:.1f} B/clk" if nbytes else "no copies: the loop's waits, barriers and read"
                    r.add("cp_async", f"1cta_{threads}t_{nbytes // 1024}KB_d{depth}", cyc, "clk/tile", s.mhz, kmhz,
                          detail=f"one CTA of {threads} threads alone, {nbytes // 1024} KB tiles by cp.async.cg 16 B "
                                 f"({vpt} a thread), ring depth {depth}, {tiles} tiles, clock64: {rate}; "
                                 f"reps {', '.join(f'{v:.0f}' for v in reps)}")
        threads, vpt = 256, 8       # 32 KB tiles
        for per_sm in (1, 2):
            for depth in CP_ASYNC_DEPTHS:
                nbytes = vpt * threads * 16
                if not r.smem_fits(per_sm, depth * nbytes):
                    continue
                grid = r.sms * per_sm
                cyc, kmhz, span_ns, reps = launch(depth, grid, threads, vpt)
                rate = grid * tiles * nbytes / (span_ns * 1e-9) / 1e9
                r.add("cp_async", f"{per_sm}x{r.sms}cta_{threads}t_{nbytes // 1024}KB_d{depth}", cyc, "clk/tile",
                      s.mhz, kmhz,
                      detail=f"{grid} CTAs of {threads} threads ({per_sm} an SM), {nbytes // 1024} KB tiles by "
                             f"cp.async.cg 16 B, ring depth {depth}, {tiles} tiles each: {nbytes / cyc:.1f} B/clk "
                             f"a CTA, {rate:.0f} GB/s in all (the slowest CTA's span); "
                             f"reps {', '.join(f'{v:.0f}' for v in reps)}")
    for threads, pts in depth1.items():
        skeleton = next((c for b, c in pts if b == 0), None)
        pts = [(b, c) for b, c in pts if b]
        if len(pts) < 2 or skeleton is None:
            continue
        xs, ys = [p[0] for p in pts], [p[1] for p in pts]
        mx, my = statistics.fmean(xs), statistics.fmean(ys)
        slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
        intercept = my - slope * mx
        pts_s = ", ".join(f"{x // 1024} KB {y:.0f}" for x, y in pts)
        r.add("cp_async_fit", f"1cta_{threads}t_latency", intercept - skeleton, "cycles",
              detail=f"depth-1 cycles a tile = skeleton + latency + bytes / rate, least squares over {pts_s}: "
                     f"intercept {intercept:.0f} less the loop's skeleton without copies {skeleton:.0f}")
        r.add("cp_async_fit", f"1cta_{threads}t_rate", 1.0 / slope, "B/clk",
              detail=f"the same fit's slope: one CTA of {threads} threads ({threads // 32} warps) fills its SMEM "
                     f"from L2 at {1.0 / slope:.1f} B/clk ({pts_s})")
    del src

# prologue_probe: fa2's CTA prologue (the Q block in, the first K/V stages copied); see
# cuda_kernels.py. A Q set larger than L2 (each probe's Q block from HBM), an L2-resident K/V
# set, each probe CTA's first probe left out (its code and SMEM cold); CTAs of 72 KB SMEM, so
# that an SM holds three: two busy ones and a probe.
PROBE_Q_BYTES = 256 << 20
PROBE_KV_BYTES = 4 << 20
PROBE_REPS = 24
PROBE_SMEM = 72 * 1024
PROBE_BUSY_STEPS = 600
# the busy CTAs' kinds (cuda_kernels.py's PROLOGUE_PROBE), two an SM; and those also run one an SM
PROBE_BUSY = ("copy", "mufu", "mufu32", "mixed", "ffma", "ffma256", "ialu")
PROBE_BUSY_ONE = ("mufu", "ffma", "ialu")
# the probe alone, changed (cuda_kernels.py's PROLOGUE_PROBE_LONE)
PROBE_LONE = ("groups2", "nosts")


def bench_prologue_probe(r: Runner, mod):
    """Rows `prologue_probe` (held out: diagnostics, no profile key reads them):
    cycles from a CTA's Q block being in its registers to its first K/V stage
    being in SMEM, as fa2's prologue issues them (Q's loads, its STS, two
    stages of two 8 KB cp.async tiles, Triton's fence.proxy.async, the wait
    for the first stage and the barrier); `..._q`: from the probe's start to Q
    being in. One probe CTA an SM alone (`lone`), beside two busy CTAs an SM
    (`busy2_...`: cuda_kernels.py's PROLOGUE_PROBE, `copy`, `mufu`, `mufu32`,
    `mixed`, `ffma`, `ffma256`, and `ialu`) or one (`busy1_mufu`, `busy1_ffma`,
    `busy1_ialu`);
    `..._step`: the busy CTAs' cycles a step; `lone_groups2`, `lone_nosts`:
    alone, without the second stage's copies or without Q's STS."""
    import cupy
    import numpy as np

    q_src = cupy.random.random(PROBE_Q_BYTES // 4, dtype=cupy.float32)
    kv_src = cupy.random.random(PROBE_KV_BYTES // 4, dtype=cupy.float32)
    q_blocks, kv_tiles = PROBE_Q_BYTES // 8192, PROBE_KV_BYTES // 8192     # (powers of 2: the kernel masks)
    if not r.smem_fits(3, PROBE_SMEM) or r.smem_fits(4, PROBE_SMEM):   # (so a probe takes the slot left)
        r.add("prologue_probe", "skipped", "nan", "", detail=f"{PROBE_SMEM} B of SMEM a CTA does not make three an SM")
        return
    with r.sampler() as s:
        for name, mode, busy_per_sm in (("lone", "copy", 0), *((f"busy2_{m}", m, 2) for m in PROBE_BUSY),
                                        *((f"busy1_{m}", m, 1) for m in PROBE_BUSY_ONE),
                                        *((f"lone_{m}", m, 0) for m in PROBE_LONE)):
            k = mod.get_function(f"prologue_probe_{mode}")
            k.max_dynamic_shared_size_bytes = PROBE_SMEM
            busy = busy_per_sm * r.sms
            grid = busy + r.sms
            out = cupy.zeros(2 * r.sms * PROBE_REPS, dtype=cupy.uint64)
            spans = cupy.zeros(4 * grid, dtype=cupy.uint64)
            args = (q_src, np.int32(q_blocks), kv_src, np.int32(kv_tiles), np.int32(PROBE_REPS),
                    np.int32(busy), np.int32(PROBE_BUSY_STEPS), out, spans)
            k((grid,), (128,), args, shared_mem=PROBE_SMEM)        # warm: the K/V set into L2
            k((grid,), (128,), args, shared_mem=PROBE_SMEM)
            cupy.cuda.Device().synchronize()
            o = out.get().reshape(r.sms, PROBE_REPS, 2)[:, 1:, :].astype(np.float64)
            sp = spans.get().reshape(grid, 4).astype(np.int64)
            # a probe CTA shares its SM with busy CTAs for all of its run
            beside = [int(((sp[:busy, 0] == sm) & (sp[:busy, 1] <= t0) & (sp[:busy, 2] >= t1)).sum())
                      for sm, t0, t1, _ in sp[busy:]]
            where = (f"probe CTAs beside 0/1/2 busy CTAs on their SM for all their run: "
                     f"{beside.count(0)}/{beside.count(1)}/{beside.count(2)}")
            for part, what in ((1, "Q in -> first K/V stage in"), (0, "start -> Q in")):
                v = o[:, :, part].ravel()
                p10, p50, p90 = np.percentile(v, (10, 50, 90))
                r.add("prologue_probe", name if part else f"{name}_q", float(p50), "cycles", s.mhz,
                      detail=f"{what}, median of {v.size} probes ({r.sms} probe CTAs x {PROBE_REPS - 1}), "
                             f"p10 {p10:.0f}, p90 {p90:.0f}; {busy} busy CTAs ({mode}); {where}; Q from a "
                             f"{PROBE_Q_BYTES >> 20} MB set, K/V from a {PROBE_KV_BYTES >> 20} MB one")
            if busy:
                step = float(np.median(sp[:busy, 3])) / PROBE_BUSY_STEPS
                r.add("prologue_probe", f"{name}_step", step, "cycles", s.mhz,
                      detail=f"a busy CTA's cycles a step ({mode}), median of {busy} over {PROBE_BUSY_STEPS} steps")
    del q_src, kv_src


CTA_CYCLE_TILES = (0, 16384, 32768)   # bytes per CTA: none, a 128x64 and a 128x128 bf16 tile

CTA_CYCLE_PER_SM = (1, 2, 4)

CTA_CYCLE_THREADS = 256

CTA_CYCLE_ROUNDS = (8, 40)


def bench_cta_cycle(r: Runner, mod):
    """Time of one round of CTAs per SM that each copy a tile in and out through
    SMEM (rows `cta_cycle`): the slope between launches of 8 and 40 rounds, so
    the kernel's launch and ramp cancel. 1, 2 and 4 CTAs per SM, set by the
    launch's dynamic SMEM. With no bytes it is the SM's cost of starting and
    retiring a CTA; with a tile, what a load and a store round trip add."""
    import cupy
    import numpy as np

    k = mod.get_function("cta_cycle")
    per_sm_smem = int(r.props.shared_memory_per_multiprocessor)
    most = max(CTA_CYCLE_PER_SM) * max(CTA_CYCLE_ROUNDS) * r.sms * max(CTA_CYCLE_TILES)
    src = cupy.random.random(most // 4, dtype=cupy.float32)
    dst = cupy.empty_like(src)
    for nbytes in CTA_CYCLE_TILES:
        for per_sm in CTA_CYCLE_PER_SM:
            smem = per_sm_smem // per_sm - SMEM_RESERVED_PER_CTA
            k.max_dynamic_shared_size_bytes = smem
            times = {}
            with r.sampler() as s:
                for rounds in CTA_CYCLE_ROUNDS:
                    grid = r.sms * per_sm * rounds

                    def fn():
                        k((grid,), (CTA_CYCLE_THREADS,), (src, dst, np.int32(nbytes // 16)),
                          shared_mem=smem)

                    times[rounds] = r.event_loop(fn, n=9)
            lo, hi = CTA_CYCLE_ROUNDS
            per_round = (times[hi] - times[lo]) / (hi - lo) * 1e3
            r.add("cta_cycle", f"{nbytes}B_x{per_sm}", per_round, "us/round", s.mhz,
                  detail=f"{CTA_CYCLE_THREADS} threads, dynamic smem {smem} B ({per_sm} CTA(s) per SM); "
                         f"{lo} rounds {times[lo] * 1e3:.2f} us, {hi} rounds {times[hi] * 1e3:.2f} us; "
                         f"tile {nbytes} B read from HBM and written back per CTA")
    del src, dst

CTA_STAMP_ROUNDS = 8


def bench_cta_stamps(r: Runner, mod, out_dir: str):
    """Per-CTA timestamps of the copy at one CTA per SM (16 and 32 KB tiles), written
    to cta_stamps_h100.csv beside the calibration CSV; rows `cta_stamps` summarise,
    per round, how spread the SMs' tile arrivals are (FIFO service would spread the
    first round's arrivals over its whole transfer, shared bandwidth bunches them)."""
    import cupy
    import numpy as np

    k = mod.get_function("cta_cycle_stamped")
    smem = int(r.props.shared_memory_per_multiprocessor) - SMEM_RESERVED_PER_CTA
    k.max_dynamic_shared_size_bytes = smem
    grid = r.sms * CTA_STAMP_ROUNDS
    # every repetition reads and writes its own slices, beyond what L2 (50 MB) keeps
    # of the one before: a repetition's loads miss L2 (the first also misses the TLB)
    reps, words = 3, grid * max(CTA_CYCLE_TILES) // 4
    src = cupy.random.random(reps * words, dtype=cupy.float32)
    dst = cupy.empty_like(src)
    stamps = cupy.zeros(4 * grid, dtype=cupy.uint64)
    lines = ["tile_bytes,rep,cta,sm,start_ns,arrived_ns,end_ns"]
    for nbytes in CTA_CYCLE_TILES[1:]:
        for rep in range(reps):
            k((grid,), (CTA_CYCLE_THREADS,), (src[rep * words:], dst[rep * words:], np.int32(nbytes // 16),
                                             stamps), shared_mem=smem)
            cupy.cuda.Device().synchronize()
            a = stamps.get().reshape(grid, 4).astype(np.int64)
            t0 = a[:, 0].min()
            for c in range(grid):
                lines.append(f"{nbytes},{rep},{c},{a[c, 3]},{a[c, 0] - t0},{a[c, 1] - t0},{a[c, 2] - t0}")
            if rep != 1:   # summarise a warm-TLB, cold-L2 repetition
                continue
            for rnd in (0, 1, CTA_STAMP_ROUNDS - 1):
                part = a[rnd * r.sms:(rnd + 1) * r.sms]
                start, arrive = part[:, 0] - t0, part[:, 1] - part[:, 0]
                r.add("cta_stamps", f"{nbytes}B_round{rnd}", float(np.median(arrive)) / 1e3, "us",
                      detail=f"tile arrival after CTA start, median over the round's {r.sms} CTAs; "
                             f"p10 {np.percentile(arrive, 10) / 1e3:.3f} p90 {np.percentile(arrive, 90) / 1e3:.3f} us; "
                             f"CTA starts spread p10-p90 {np.percentile(start, 10) / 1e3:.3f}-"
                             f"{np.percentile(start, 90) / 1e3:.3f} us after the first")
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "cta_stamps_h100.csv"), "w") as f:
        f.write("\n".join(lines) + "\n")
    del src, dst


def bench_launch(r: Runner, K, mod):
    torch = r.torch
    fn = lambda: K["empty"][(1,)]()  # noqa: E731
    fn()
    torch.cuda.synchronize()
    ms = r.do_bench(fn, warmup=25, rep=200)
    r.add("launch", "do_bench_empty_triton", ms * 1e3, "us",
          detail="triton.testing.do_bench median of an empty Triton kernel (grid 1): the fixed cost "
                 "a do_bench-timed kernel pays")
    n = 2000
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(n):
        fn()
    e.record()
    e.synchronize()
    r.add("launch", "back_to_back_eager_triton", s.elapsed_time(e) * 1e3 / n, "us",
          detail=f"{n} empty Triton launches back to back, events around all (host launch path included)")
    try:
        g = torch.cuda.CUDAGraph()
        st = torch.cuda.Stream()
        with torch.cuda.stream(st):
            for _ in range(3):
                fn()
        torch.cuda.synchronize()
        with torch.cuda.graph(g):
            for _ in range(200):
                fn()
        g.replay()
        torch.cuda.synchronize()
        times = []
        for _ in range(10):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            g.replay()
            e.record()
            e.synchronize()
            times.append(s.elapsed_time(e) * 1e3 / 200)
        r.add("launch", "back_to_back_graph_triton", statistics.median(times), "us",
              detail="CUDA graph of 200 empty Triton kernels, replay time / 200")
    except Exception as ex:
        r.add("launch", "back_to_back_graph_triton", "nan", "us", detail=f"failed: {str(ex)[:200]}")
    if mod is not None:
        import cupy
        k = mod.get_function("empty_kernel")
        for _ in range(50):
            k((1,), (32,), ())
        cupy.cuda.Device().synchronize()
        st, en = cupy.cuda.Event(), cupy.cuda.Event()
        st.record()
        for _ in range(n):
            k((1,), (32,), ())
        en.record()
        en.synchronize()
        r.add("launch", "back_to_back_eager_cupy", cupy.cuda.get_elapsed_time(st, en) * 1e3 / n, "us",
              detail=f"{n} empty CuPy RawKernel launches back to back")


# How fast can an SM take new CTAs when many are resident? cta_cycle's empty
# rows (256 threads) take 0.46, 0.52 and 0.81 us a round at 1, 2 and 4 CTAs an
# SM (session 39): more CTAs an SM cost more than one turnover a round.
# standard's softmax launch (one 4-warp CTA a row of S: 262k-524k CTAs at 16k
# tokens, N = 512) is made of such CTAs.
CTA_DISPATCH_THREADS = (128, 256)
CTA_DISPATCH_PER_SM = (1, 2, 4, 8, 12, 16)
CTA_DISPATCH_TILES = (0, 1024)      # bytes a CTA reads and writes back: none, a 512-key row of bf16 S


def bench_cta_dispatch(r: Runner, mod, out_dir: str):
    """Rounds of short CTAs at 1-16 CTAs an SM (set by dynamic SMEM), 128 and
    256 threads, empty or copying 1 KB: us a round (the slope between 8 and 40
    rounds, as cta_cycle), rows `cta_dispatch`. Then, stamped (global timer), a
    40-round launch of each: per SM, the interval between consecutive CTA
    starts and how long a CTA ran, rows `cta_dispatch_stamps`; every CTA's
    stamps go to cta_dispatch_stamps_h100.csv beside the calibration CSV."""
    import cupy
    import numpy as np

    plain, stamped = mod.get_function("cta_cycle"), mod.get_function("cta_cycle_stamped")
    per_sm_smem = int(r.props.shared_memory_per_multiprocessor)
    lo, hi = CTA_CYCLE_ROUNDS
    most = max(CTA_DISPATCH_PER_SM) * hi * r.sms
    src = cupy.random.random(most * max(CTA_DISPATCH_TILES) // 4, dtype=cupy.float32)
    dst = cupy.empty_like(src)
    stamps = cupy.zeros(4 * most, dtype=cupy.uint64)
    stamp_rows = []
    for threads in CTA_DISPATCH_THREADS:
        for nbytes in CTA_DISPATCH_TILES:
            for per_sm in CTA_DISPATCH_PER_SM:
                if per_sm * threads > int(r.props.max_threads_per_multi_processor):
                    continue
                smem = per_sm_smem // per_sm - SMEM_RESERVED_PER_CTA
                vecs = np.int32(nbytes // 16)
                times = {}
                with r.sampler() as s:
                    for k in (plain, stamped):
                        k.max_dynamic_shared_size_bytes = smem
                    for rounds in CTA_CYCLE_ROUNDS:
                        grid = r.sms * per_sm * rounds

                        def fn():
                            plain((grid,), (threads,), (src, dst, vecs), shared_mem=smem)

                        times[rounds] = r.event_loop(fn, n=9)
                    per_round = (times[hi] - times[lo]) / (hi - lo) * 1e3
                    param = f"{threads}t_{nbytes}B_x{per_sm}"
                    r.add("cta_dispatch", param, per_round, "us/round", s.mhz,
                          detail=f"{threads} threads, dynamic smem {smem} B ({per_sm} CTA(s) an SM), "
                                 f"{nbytes} B read and written back a CTA; {lo} rounds "
                                 f"{times[lo] * 1e3:.2f} us, {hi} rounds {times[hi] * 1e3:.2f} us")
                    grid = r.sms * per_sm * hi
                    stamped((grid,), (threads,), (src, dst, vecs, stamps), shared_mem=smem)
                    cupy.cuda.Device().synchronize()
                    stamped((grid,), (threads,), (src, dst, vecs, stamps), shared_mem=smem)
                    cupy.cuda.Device().synchronize()
                a = stamps[:4 * grid].get().reshape(grid, 4).astype(np.int64)
                t0 = a[:, 0].min()
                stamp_rows += [{"threads": threads, "per_sm": per_sm, "tile_bytes": nbytes, "cta": c,
                                "sm": a[c, 3], "start_ns": a[c, 0] - t0, "end_ns": a[c, 2] - t0} for c in range(grid)]
                gaps, runs = [], (a[:, 2] - a[:, 0]) / 1e3
                for sm in np.unique(a[:, 3]):
                    starts = np.sort(a[a[:, 3] == sm, 0])
                    # the middle half of the launch: past its ramp, before its tail
                    n = len(starts)
                    gaps.extend(np.diff(starts[n // 4: 3 * n // 4]) / 1e3)
                r.add("cta_dispatch_stamps", param, float(np.median(gaps)), "us",
                      detail=f"a {hi}-round launch stamped by the global timer: median interval between "
                             f"consecutive CTA starts on an SM over the middle half of its CTAs "
                             f"(p10 {np.percentile(gaps, 10):.3f}, p90 {np.percentile(gaps, 90):.3f} us; "
                             f"mean {np.mean(gaps):.3f}); a CTA ran median {np.median(runs):.3f} us "
                             f"(p90 {np.percentile(runs, 90):.3f}); the launch's CTA starts spanned "
                             f"{(a[:, 0].max() - t0) / 1e3:.2f} us")
    write_csv_atomic(os.path.join(out_dir, "cta_dispatch_stamps_h100.csv"), stamp_rows,
                     ("threads", "per_sm", "tile_bytes", "cta", "sm", "start_ns", "end_ns"))
    del src, dst, stamps
