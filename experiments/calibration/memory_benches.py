"""Microbenchmarks of the memory system: the device query, HBM bandwidth, L2
(bandwidth and its capacity knee, lines read by every SM at once, retention,
round trips, stores), tile writes, TMA descriptor setup, stores beside
compute, and how fast a launch fills the SMs.
"""
from __future__ import annotations

import statistics
import sys

from .runner import Runner, cta_clock_runs


def bench_device(r: Runner):
    p = r.props
    for key, attr in (("multi_processor_count", "multi_processor_count"),
                      ("l2_cache_size", "L2_cache_size"),
                      ("shared_memory_per_multiprocessor", "shared_memory_per_multiprocessor"),
                      ("shared_memory_per_block_optin", "shared_memory_per_block_optin"),
                      ("regs_per_multiprocessor", "regs_per_multiprocessor"),
                      ("max_threads_per_multi_processor", "max_threads_per_multi_processor"),
                      ("total_memory", "total_memory")):
        v = getattr(p, attr, None)
        if v is not None:
            r.add("device", key, int(v), "count" if "count" in key or "regs" in key or "threads" in key
                  else "bytes", detail="torch.cuda.get_device_properties")
    try:
        import cupy
        cp = cupy.cuda.runtime.getDeviceProperties(0)
        for k in ("reservedSharedMemPerBlock", "clockRate", "memoryClockRate", "memoryBusWidth"):
            if k in cp:
                r.add("device", k, int(cp[k]), "kHz" if "Rate" in k else ("bits" if "Width" in k else "bytes"),
                      detail="cudaGetDeviceProperties")
    except Exception as e:
        print(f"[calibrate] cupy device properties: {e}", file=sys.stderr)


def bench_hbm(r: Runner, K):
    torch = r.torch
    nbytes = (1 << 31) if not r.args.quick else (1 << 29)
    n = nbytes // 4
    x = torch.randn(n, device="cuda", dtype=torch.float32)
    y = torch.empty_like(x)
    BLOCK = 8192
    grid = (n // BLOCK,)
    part = torch.empty(grid[0], device="cuda", dtype=torch.float32)
    cases = {
        "read": (lambda: K["hbm_read"][grid](x, part, BLOCK=BLOCK, num_warps=8), nbytes),
        "write": (lambda: K["hbm_write"][grid](y, 1.5, BLOCK=BLOCK, num_warps=8), nbytes),
        "copy": (lambda: K["hbm_copy"][grid](x, y, BLOCK=BLOCK, num_warps=8), 2 * nbytes),
        "copy_torch": (lambda: y.copy_(x), 2 * nbytes),
    }
    for name, (fn, moved) in cases.items():
        fn()
        torch.cuda.synchronize()
        with r.sampler() as s:
            ms = r.do_bench(fn)
        r.add("hbm_bandwidth", name, moved / (ms * 1e-3) / 1e9, "GB/s", s.mhz,
              detail=f"{nbytes >> 20} MiB fp32 buffers, bytes read+written / do_bench median "
                     f"{ms * 1e3:.1f} us")
    del x, y


# Tile widths for tile_write, in bf16 columns: runs of 64 to 256 B (standard's
# QKᵀ at block_n = 128 writes 256 B runs). Wider tiles spill the pointer tensor
# (STL in the sm_90 SASS at 128x256 and 128x512, 255 registers) and measure that
# instead: 2436 and 307 GB/s on the H100.
TILE_WRITE_COLS = (32, 64, 128)


def bench_tile_write(r: Runner, K):
    """HBM write bandwidth for the store pattern of standard's QKᵀ (rows
    `tile_write`): 2 GB of bf16 written as [128, BN] tiles, a CTA a row block
    walking its columns, BN of TILE_WRITE_COLS (runs of 64-256 B); against
    hbm_bandwidth/write, 32 KB contiguous a CTA."""
    torch = r.torch
    n_cols = 4096
    n_rows = ((1 << 31) if not r.args.quick else (1 << 29)) // (2 * n_cols)
    y = torch.empty(n_rows, n_cols, device="cuda", dtype=torch.bfloat16)
    bm = 128
    for bn in TILE_WRITE_COLS:
        def fn():
            return K["tile_write"][(n_rows // bm,)](y, n_cols, BM=bm, BN=bn, num_warps=8)

        fn()
        torch.cuda.synchronize()
        with r.sampler() as s:
            ms = r.do_bench(fn)
        r.add("tile_write", f"{bm}x{bn}", y.numel() * 2 / (ms * 1e-3) / 1e9, "GB/s", s.mhz,
              detail=f"{y.numel() * 2 >> 20} MiB of bf16 rows {n_cols * 2} B long, {n_rows // bm} CTAs of 8 "
                     f"warps each writing {bm} rows as [{bm}, {bn}] tiles ({bn * 2} B runs); do_bench "
                     f"median {ms * 1e3:.1f} us")
    del y


# the descriptors tma_setup builds, as kernels/fa3.py (Q, K, V; fp8: Q, K, Vᵀ)
TMA_SETUP_DESCRIPTORS = 3


def bench_tma_setup(r: Runner, K):
    """The cycles a CTA spends building kernels/fa3.py's three device-side TMA
    descriptors before its first copy (rows `tma_setup`): tma_setup with TMA
    against the same three [64, 64] bf16 tiles by plain loads, clock64 per CTA
    from its start to the tiles' sum, median over CTAs, with one CTA an SM
    (grid = SMs) and with eight (grid = 8 x SMs, the descriptors' global
    atomics from every CTA at once)."""
    from kernels.common import ensure_tma_allocator

    torch = r.torch
    ensure_tma_allocator()
    rows, cols, n_rows = 64, 64, 1 << 16
    x = (torch.randn(n_rows, cols, device="cuda") * 0.1).to(torch.bfloat16)
    for per_sm in (1, 8):
        grid = r.sms * per_sm
        out = torch.empty(grid, device="cuda", dtype=torch.float32)
        clk = torch.zeros(grid, device="cuda", dtype=torch.int64)
        cycles = {}
        for tma in (False, True):
            def fn():
                return K["tma_setup"][(grid,)](x, out, clk, n_rows, ROWS=rows, COLS=cols, TMA=tma, num_warps=4)

            runs = cta_clock_runs(torch, fn, clk, 5)
            cycles[tma] = statistics.median(runs)
            r.add("tma_setup", f"{'tma' if tma else 'plain'}_x{per_sm}", cycles[tma], "clk",
                  detail=f"{grid} CTAs of 4 warps ({per_sm} an SM at most): clock64 from a CTA's start to "
                         f"the sum of three [{rows}, {cols}] bf16 tiles "
                         + ("loaded through three device-side tensor descriptors it builds first"
                            if tma else "loaded by plain loads") + "; median CTA, median of 5 launches: "
                         + " / ".join(f"{v:.0f}" for v in runs))
        r.add("tma_setup", f"descriptors_x{per_sm}", cycles[True] - cycles[False], "clk",
              detail=f"tma_x{per_sm} less plain_x{per_sm}: three device-side descriptors built and "
                     f"fenced, and their three copies' extra latency, a CTA")


# store_overlap: a chain of dependent FMAs (~1000 cycles at 4 a link) against
# stores of 4-64 KB a CTA an iteration (64 KB is 2060 cycles at the SM's 31.8 B/clk)
STORE_OVERLAP_WORK = 256

STORE_OVERLAP_BYTES = (4096, 8192, 16384, 32768, 65536)

STORE_OVERLAP_WARPS = 4


# stores of at least this many bytes an iteration run at the warps' rate; smaller
# ones wait out their latency (4 KB: 183 cycles, 22 B/clk)
STORE_OVERLAP_DRAINED = 16384


def bench_store_overlap(r: Runner, K):
    """Does a warp wait for its stores to leave the SM (rows `store_overlap`)?
    One 4-warp CTA an SM, each iteration a chain of STORE_OVERLAP_WORK
    dependent FMAs and a store of B bytes from registers: the chain alone,
    the store alone, and both, in clock64 cycles an iteration (median CTA).
    Posted stores: both take the longer of the two; waited-for: their sum."""
    torch = r.torch
    grid = r.sms
    iters = 256
    clk = torch.zeros(grid, device="cuda", dtype=torch.int64)
    for nbytes in STORE_OVERLAP_BYTES:
        floats = nbytes // 4
        y = torch.empty(grid * floats, device="cuda", dtype=torch.float32)
        cycles = {}
        for case, work, stores in (("chain", STORE_OVERLAP_WORK, False), ("store", 0, True),
                                   ("both", STORE_OVERLAP_WORK, True)):
            def fn():
                return K["store_overlap"][(grid,)](y, clk, iters, WORK=work, STORE=floats, STORES=stores,
                                                   num_warps=STORE_OVERLAP_WARPS)

            runs = [c / iters for c in cta_clock_runs(torch, fn, clk, 3)]
            cycles[case] = statistics.median(runs)
            r.add("store_overlap", f"{nbytes}B_{case}", cycles[case], "clk/iter",
                  detail=f"{grid} CTAs of 4 warps, one an SM, {iters} iterations of "
                         + {"chain": f"{work} dependent FMAs", "store": f"a {nbytes} B store from registers",
                            "both": f"{work} dependent FMAs and a {nbytes} B store"}[case]
                         + "; clock64 over the loop, median CTA, median of 3 launches: "
                         + " / ".join(f"{v:.1f}" for v in runs))
        longer, total = max(cycles["chain"], cycles["store"]), cycles["chain"] + cycles["store"]
        r.add("store_overlap", f"{nbytes}B_waited", (cycles["both"] - longer) / (total - longer), "",
              detail="(both - the longer part) / (sum - the longer part): 0 = the stores drain beside "
                     "the chain, 1 = the warp waits for them")
        del y


def bench_l2(r: Runner, K):
    torch = r.torch
    BLOCK, UNROLL = 2048, 4  # fp32: 4 loads of 8 KB in flight per program per step
    grid = r.sms * 4
    sizes_mb = [1, 2, 4, 8, 12, 16, 20, 24, 28, 32, 36, 40, 44, 48, 56, 64, 80, 96, 128, 256, 512, 1024]
    if r.args.quick:
        sizes_mb = [4, 16, 32, 48, 64, 256]
    big = torch.randn((1024 << 20) // 4, device="cuda", dtype=torch.float32)
    out = torch.empty(grid * BLOCK, device="cuda", dtype=torch.float32)
    target = 4 << 30  # bytes per launch
    for mb in sizes_mb:
        ws = mb << 20
        nblocks = ws // (BLOCK * 4)
        steps = max(2, -(-max(target, 4 * ws) // (grid * UNROLL * BLOCK * 4)))
        moved = steps * grid * UNROLL * BLOCK * 4

        def fn():
            K["l2_read"][(grid,)](big, out, nblocks, steps, BLOCK=BLOCK, UNROLL=UNROLL, num_warps=8)

        with r.sampler() as s:
            ms = r.event_loop(fn, n=7 if ws < (256 << 20) else 3)
        r.add("l2_read_bandwidth", f"{mb}MB", moved / (ms * 1e-3) / 1e9, "GB/s", s.mhz,
              detail=f"working set {mb} MB re-read {moved / ws:.0f}x by {grid} CTAs, ld.global.cg; "
                     f"{ms * 1e3:.0f} us per launch")
    # One SM alone: what the L2 -> SM path delivers to a single CTA (the per-SM port).
    ws = 4 << 20
    for block, unroll, warps in ((4096, 4, 32), (4096, 8, 32), (4096, 16, 32), (2048, 8, 16)):
        nblocks = ws // (block * 4)
        steps = (256 << 20) // (block * unroll * 4)
        o1 = torch.empty(block, device="cuda", dtype=torch.float32)

        def fn1():
            K["l2_read"][(1,)](big, o1, nblocks, steps, BLOCK=block, UNROLL=unroll, num_warps=warps)

        with r.sampler() as s:
            ms = r.event_loop(fn1, n=5)
        bw = steps * unroll * block * 4 / (ms * 1e-3)
        r.add("l2_sm_port", f"1cta_{warps}warps_{block * unroll * 4 // 1024}KB", bw / ((s.mhz or float("nan")) * 1e6),
              "B/clk/SM", s.mhz,
              detail=f"one CTA ({warps} warps, {block * unroll * 4 // 1024} KB of loads in flight per step) "
                     f"re-reading a 4 MB L2-resident set with ld.global.cg: {bw / 1e9:.1f} GB/s at the NVML clock")
    del big


# l2_shared: lags (in 8 KB blocks) between consecutive CTAs walking one block
# sequence; "spread" puts each CTA on its own part of the set (l2's pattern).
L2_SHARED_LAGS = (0, 1, 2, 4, 8, 32, "spread")


def bench_l2_shared(r: Runner, K):
    """Do requests from many SMs for the same lines cost L2 its bandwidth
    once or once each? ncu counts fewer sectors looked up at the L2 slices
    than the SMs receive for fa2 (26-48% fewer non-causal: the L2 request
    coalescer merges requests for a sector in flight); this measures what
    that does to the rate. One CTA an SM (8 warps, four 8 KB loads in flight
    each) re-reads a 16 MB L2-resident set, all CTAs walking the same block
    sequence, CTA c `lag` blocks ahead of CTA c - 1, and, as `l2` does, each
    on its own part of the set ("spread"). Rows `l2_shared`: bytes the SMs
    received / time, GB/s."""
    torch = r.torch
    BLOCK, UNROLL = 2048, 4
    grid = r.sms
    ws = 16 << 20
    nblocks = ws // (BLOCK * 4)
    buf = torch.randn(ws // 4, device="cuda", dtype=torch.float32)
    out = torch.empty(grid * BLOCK, device="cuda", dtype=torch.float32)
    iters = (2 << 30) // (grid * UNROLL * BLOCK * 4)     # 2 GB received a launch
    for lag in L2_SHARED_LAGS:
        step = nblocks // grid if lag == "spread" else lag

        def fn():
            K["l2_shared_read"][(grid,)](buf, out, nblocks, iters, step, BLOCK=BLOCK, UNROLL=UNROLL, num_warps=8)

        with r.sampler() as smp:
            ms = r.event_loop(fn, n=7, warm=2)
        moved = iters * grid * UNROLL * BLOCK * 4
        r.add("l2_shared", f"lag_{lag}", moved / (ms * 1e-3) / 1e9, "GB/s", smp.mhz,
              detail=f"{grid} CTAs (one an SM, 8 warps) re-reading a 16 MB set, ld.global.cg, "
                     + ("each on its own part of it" if lag == "spread" else
                        f"all walking one 8 KB block sequence, each {lag} blocks ahead of the last")
                     + f"; {moved >> 20} MB received a launch, {ms:.3f} ms")
    del buf


def bench_l2_duration(r: Runner, K):
    """Why `l2` and `loaded_latency` disagree on the L2's bandwidth (7.7 TB/s
    against 10.9 re-reading 16 MB with 528 CTAs): the same l2_read over 4-32 MB
    working sets, each held in a buffer of its own size or as the head of a
    1 GB buffer (as `l2` reads it), each launch moving 4 GB (as `l2`, about
    0.5 ms) or 64 GB (about 8 ms). Rows `l2_duration`, GB/s."""
    torch = r.torch
    BLOCK, UNROLL = 2048, 4
    grid = r.sms * 4
    out = torch.empty(grid * BLOCK, device="cuda", dtype=torch.float32)
    head = torch.randn((1024 << 20) // 4, device="cuda", dtype=torch.float32)
    for mb in (4, 8, 16, 24, 32):
        ws = mb << 20
        nblocks = ws // (BLOCK * 4)
        own = torch.randn(ws // 4, device="cuda", dtype=torch.float32)
        for where, buf in (("own", own), ("head1g", head)):
            for label, moved in (("4GB", 4 << 30), ("64GB", 64 << 30)):
                steps = max(2, moved // (grid * UNROLL * BLOCK * 4))

                def fn():
                    K["l2_read"][(grid,)](buf, out, nblocks, steps, BLOCK=BLOCK, UNROLL=UNROLL, num_warps=8)

                with r.sampler() as smp:
                    ms = r.event_loop(fn, n=5 if label == "4GB" else 3, warm=2)
                done = steps * grid * UNROLL * BLOCK * 4
                r.add("l2_duration", f"{mb}MB_{where}_{label}", done / (ms * 1e-3) / 1e9, "GB/s", smp.mhz,
                      detail=f"l2_read, {grid} CTAs of 8 warps, {mb} MB working set "
                             f"({'a buffer of its own' if where == 'own' else 'the head of a 1 GB buffer'}), "
                             f"{done >> 20} MB a launch, {ms:.3f} ms")
        del own
    del head


def bench_l2_ramp(r: Runner, K):
    """l2_duration's launches of 4 GB ran at 7.7 TB/s and of 64 GB at 10.3
    (16 MB working set): a per-launch cost, or a rate that climbs during a
    launch? The same l2_read moving 0.125-64 GB a launch over a 16 MB set,
    and over a 2 GB set (from HBM); then a 0.5 GB launch over the 16 MB set
    right after a 1 ms exp2 kernel on every SM (warm clocks, L2 untouched)
    and right after do_bench's own flush (zeroing 256 MB, as the validation
    sweep times its kernels). Rows `l2_ramp`: ms a launch (event pairs)."""
    torch = r.torch
    BLOCK, UNROLL = 2048, 4
    grid = r.sms * 4
    out = torch.empty(grid * BLOCK, device="cuda", dtype=torch.float32)
    chunk = grid * UNROLL * BLOCK * 4
    for ws_mb in (16, 2048):
        buf = torch.randn((ws_mb << 20) // 4, device="cuda", dtype=torch.float32)
        nblocks = (ws_mb << 20) // (BLOCK * 4)
        sizes = (0.125, 0.25, 0.5, 1, 2, 4, 8, 16, 32, 64) if ws_mb == 16 else (0.25, 0.5, 1, 2, 4, 8)
        for gb in sizes:
            steps = max(1, int(gb * (1 << 30)) // chunk)

            def fn():
                K["l2_read"][(grid,)](buf, out, nblocks, steps, BLOCK=BLOCK, UNROLL=UNROLL, num_warps=8)

            with r.sampler() as smp:
                ms = r.event_loop(fn, n=5, warm=2)
            r.add("l2_ramp", f"{ws_mb}MB_{gb}GB", ms, "ms", smp.mhz,
                  detail=f"l2_read, {grid} CTAs of 8 warps, {ws_mb} MB working set, {steps * chunk >> 20} MB "
                         f"a launch: {steps * chunk / (ms * 1e-3) / 1e9:.0f} GB/s")
        if ws_mb != 16:
            del buf
            continue
        steps = (1 << 29) // chunk
        spin_out = torch.empty(r.sms * 16 * 1024, device="cuda", dtype=torch.float32)
        flush = torch.empty(256 << 20, dtype=torch.int8, device="cuda")
        before = {"after_spin": lambda: K["exp2_loop"][(r.sms * 16,)](spin_out, 16384, BLOCK=1024, num_warps=4),
                  "after_flush": lambda: flush.zero_()}
        for name, pre in before.items():
            times = []
            with r.sampler() as smp:
                for _ in range(7):
                    pre()
                    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    s.record()
                    K["l2_read"][(grid,)](buf, out, nblocks, steps, BLOCK=BLOCK, UNROLL=UNROLL, num_warps=8)
                    e.record()
                    e.synchronize()
                    times.append(s.elapsed_time(e))
            ms = statistics.median(times)
            r.add("l2_ramp", f"16MB_0.5GB_{name}", ms, "ms", smp.mhz,
                  detail=f"the 0.5 GB launch over 16 MB timed alone right after "
                         f"{'a 1 ms exp2 loop on every SM' if name == 'after_spin' else 'zeroing 256 MB'}: "
                         f"{steps * chunk / (ms * 1e-3) / 1e9:.0f} GB/s; reps "
                         f"{', '.join(f'{t:.3f}' for t in times)}")
        del buf, flush


def bench_launch_fill(r: Runner, K):
    """l2_ramp's launches take about 23 us (from L2) and 28 us (from HBM)
    more than their bytes at the sustained rate, against 4 us for an empty
    kernel: where does a streaming launch lose that time? The same l2_read
    over a 16 MB L2-resident set with 0-128 steps a CTA (32 KB each), 132
    and 528 CTAs. Rows `launch_fill`: us a launch (event pairs, median)."""
    torch = r.torch
    BLOCK, UNROLL = 2048, 4
    buf = torch.randn((16 << 20) // 4, device="cuda", dtype=torch.float32)
    nblocks = (16 << 20) // (BLOCK * 4)
    for grid in (r.sms, r.sms * 4):
        out = torch.empty(grid * BLOCK, device="cuda", dtype=torch.float32)
        for steps in (0, 1, 2, 4, 8, 16, 32, 64, 128):
            def fn():
                K["l2_read"][(grid,)](buf, out, nblocks, steps, BLOCK=BLOCK, UNROLL=UNROLL, num_warps=8)

            moved = steps * grid * UNROLL * BLOCK * 4
            for cover in (False, True):
                with r.sampler() as smp:
                    ms = r.event_loop(fn, n=21, warm=3, host_cover=cover)
                r.add("launch_fill", f"{grid}ctas_{steps}steps" + ("_covered" if cover else ""), ms * 1e3, "us",
                      smp.mhz, detail=f"l2_read, {grid} CTAs of 8 warps, {steps} steps of 32 KB a CTA over a 16 MB "
                                      f"set: {moved >> 20} MB a launch")
            if grid == r.sms * 4 and steps in (0, 8, 64):
                # as the validation sweep times its kernels: do_bench, L2 flushed before each call
                with r.sampler() as smp:
                    ms = r.do_bench(fn)
                r.add("launch_fill", f"{grid}ctas_{steps}steps_do_bench", ms * 1e3, "us", smp.mhz,
                      detail=f"the same launch timed by triton.testing.do_bench (L2 flushed before each "
                             f"call, so the set comes from HBM): {moved >> 20} MB a launch")
    del buf


# l2_round_trip: 4 KB pieces (1024 fp32), 4 CTAs of 4 warps an SM; each CTA
# owns `chunks` pieces, so the working set is sms x 4 x chunks x 4 KB
# (2.06 MB a chunk on 132 SMs): 4 to 64 chunks span 8-132 MB around the 50 MB L2.
ROUND_TRIP_CHUNK = 1024

ROUND_TRIP_CTAS_PER_SM = 4

ROUND_TRIP_CHUNKS = (4, 8, 10, 12, 14, 16, 17, 18, 19, 20, 21, 22, 23, 24, 26, 28, 32, 40, 48, 64)


def bench_l2_round_trip(r: Runner, K):
    """How much data read and written back each pass L2 keeps for the next
    pass: every CTA walks its own part of a working set, reading each piece
    and writing it back, pass after pass. Below what L2 keeps, a pass runs at
    L2's pace; above it, at HBM's. The byte rate at each working set
    (l2_round_trip rows). No profile key reads it: l2.keep_all_bytes comes
    from ncu's DRAM bytes of the same round trips (experiments/l2_keep_ncu.py),
    which tell misses from waits; these times say where they begin."""
    torch = r.torch
    grid = r.sms * ROUND_TRIP_CTAS_PER_SM
    piece = ROUND_TRIP_CHUNK * 4
    big = torch.zeros(grid * max(ROUND_TRIP_CHUNKS) * ROUND_TRIP_CHUNK, device="cuda", dtype=torch.float32)
    for chunks in ROUND_TRIP_CHUNKS:
        ws = grid * chunks * piece
        passes = max(4, -(-(1 << 30) // (2 * ws)))   # at least 1 GB read and written a launch

        def fn():
            K["l2_round_trip"][(grid,)](big, chunks, passes, CHUNK=ROUND_TRIP_CHUNK, num_warps=4)

        with r.sampler() as s:
            ms = r.event_loop(fn, n=5)
        moved = 2 * passes * ws
        r.add("l2_round_trip", f"{ws}B", moved / (ms * 1e-3) / 1e9, "GB/s", s.mhz,
              detail=f"working set {ws / 2**20:.1f} MB ({grid} CTAs x {chunks} pieces of {piece} B) read and "
                     f"written back {passes} times, plain ld/st.global; {ms * 1e3:.0f} us per launch")
    del big


def bench_l2_store(r: Runner, K):
    """Stores into an L2-resident set: one CTA alone (the SM's write path to
    L2, l2_sm_store) and four CTAs per SM (L2's write bandwidth)."""
    torch = r.torch
    ws = 4 << 20
    y = torch.empty(ws // 4, device="cuda", dtype=torch.float32)
    for block, unroll, warps in ((4096, 4, 32), (4096, 8, 32), (2048, 8, 16), (1024, 8, 8)):
        nblocks = ws // (block * 4)
        steps = (256 << 20) // (block * unroll * 4)

        def fn1():
            K["l2_write"][(1,)](y, nblocks, steps, BLOCK=block, UNROLL=unroll, num_warps=warps)

        with r.sampler() as s:
            ms = r.event_loop(fn1, n=5)
        bw = steps * unroll * block * 4 / (ms * 1e-3)
        r.add("l2_sm_store", f"1cta_{warps}warps_{block * unroll * 4 // 1024}KB",
              bw / ((s.mhz or float("nan")) * 1e6), "B/clk/SM", s.mhz,
              detail=f"one CTA ({warps} warps, {block * unroll * 4 // 1024} KB of stores per step) "
                     f"writing a 4 MB L2-resident set (st.global, 16 B per thread per store): "
                     f"{bw / 1e9:.1f} GB/s at the NVML clock")
    block, unroll = 2048, 4
    grid = r.sms * 4
    nblocks = ws // (block * 4)
    steps = max(2, (4 << 30) // (grid * unroll * block * 4))

    def fn():
        K["l2_write"][(grid,)](y, nblocks, steps, BLOCK=block, UNROLL=unroll, num_warps=8)

    with r.sampler() as s:
        ms = r.event_loop(fn, n=5)
    bw = steps * grid * unroll * block * 4 / (ms * 1e-3)
    r.add("l2_write_bandwidth", "4MB", bw / 1e9, "GB/s", s.mhz,
          detail=f"{grid} CTAs (8 warps) writing a 4 MB L2-resident set, {ms * 1e3:.0f} us per launch")
