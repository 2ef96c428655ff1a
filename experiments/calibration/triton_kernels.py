"""Triton microkernels of the calibration, defined lazily (triton_kernels()):
importing this module does not need triton. memory_benches.py and
compute_benches.py run them.
"""
from __future__ import annotations


def triton_kernels():
    import triton
    import triton.language as tl

    from kernels.online_softmax import softmax_update

    @triton.jit
    def hbm_read(X, OUT, BLOCK: tl.constexpr):
        pid = tl.program_id(0).to(tl.int64)
        x = tl.load(X + pid * BLOCK + tl.arange(0, BLOCK))
        tl.store(OUT + pid, tl.sum(x, axis=0))

    @triton.jit
    def hbm_write(Y, val, BLOCK: tl.constexpr):
        pid = tl.program_id(0).to(tl.int64)
        offs = tl.arange(0, BLOCK)
        tl.store(Y + pid * BLOCK + offs, offs.to(tl.float32) * val + pid.to(tl.float32))

    @triton.jit
    def tile_write(Y, n_cols, BM: tl.constexpr, BN: tl.constexpr):
        # standard's QKᵀ store pattern without its products: a CTA a block of
        # BM rows of a row-major [rows, n_cols] bf16 matrix, walking its columns
        # BN at a time, each step a [BM, BN] tile: BM runs of BN x 2 bytes, the
        # rows n_cols x 2 bytes apart
        pid = tl.program_id(0).to(tl.int64)
        rows = pid * BM + tl.arange(0, BM)
        cols = tl.arange(0, BN)
        for j in range(0, n_cols, BN):
            val = (rows[:, None] + cols[None, :] + j).to(tl.bfloat16)
            tl.store(Y + rows[:, None] * n_cols + j + cols[None, :], val)

    @triton.jit
    def tma_setup(X, OUT, CLK, n_rows, ROWS: tl.constexpr, COLS: tl.constexpr, TMA: tl.constexpr):
        # what kernels/fa3.py does before its first copy: three device-side
        # tensor descriptors (Q, K, V), each built in SMEM, written to the CTA's
        # global scratch and fenced (SASS: ATOMG.E.EXCH.STRONG.GPU, DEPBAR,
        # UTMACCTL.IV, UTMACMDFLUSH), then a [ROWS, COLS] tile through each; TMA
        # False: the same three tiles by plain loads. CLK[cta] = the clock64
        # cycles from the CTA's start to the sum of its tiles.
        pid = tl.program_id(0)
        t0 = tl.inline_asm_elementwise("mov.u64 $0, %clock64;", "=l,r", [pid], dtype=tl.int64,
                                       is_pure=False, pack=1)
        row0 = (pid * ROWS) % n_rows
        if TMA:
            da = tl.make_tensor_descriptor(X, shape=[n_rows, COLS], strides=[COLS, 1], block_shape=[ROWS, COLS])
            db = tl.make_tensor_descriptor(X + COLS, shape=[n_rows - 1, COLS], strides=[COLS, 1],
                                           block_shape=[ROWS, COLS])
            dc = tl.make_tensor_descriptor(X + 2 * COLS, shape=[n_rows - 2, COLS], strides=[COLS, 1],
                                           block_shape=[ROWS, COLS])
            tiles = da.load([row0, 0]) + db.load([row0, 0]) + dc.load([row0, 0])
        else:
            offs = (row0 + tl.arange(0, ROWS))[:, None] * COLS + tl.arange(0, COLS)[None, :]
            tiles = tl.load(X + offs) + tl.load(X + COLS + offs) + tl.load(X + 2 * COLS + offs)
        total = tl.sum(tl.sum(tiles.to(tl.float32), 1), 0)
        t1 = tl.inline_asm_elementwise("mov.u64 $0, %clock64;", "=l,r", [total.to(tl.int32, bitcast=True)],
                                       dtype=tl.int64, is_pure=False, pack=1)
        tl.store(OUT + pid, total)
        tl.store(CLK + pid, t1 - t0)

    @triton.jit
    def store_overlap(Y, CLK, iters, WORK: tl.constexpr, STORE: tl.constexpr, STORES: tl.constexpr):
        # Does a warp wait for its stores to leave the SM? Per iteration: a
        # chain of WORK dependent FMAs on one value a thread, and STORE fp32 a
        # CTA stored from registers to the CTA's own L2-resident slot (values
        # of the iteration, not of the chain: tied to it, the compiler
        # recomputed the chain for every stored register). Posted stores let
        # the chain run while they drain (an iteration takes the longer of the
        # two); a warp that waits for them takes the sum. CLK[cta] = clock64
        # over the loop. STORES False: the chain alone.
        pid = tl.program_id(0)
        x = tl.arange(0, 128).to(tl.float32) * 1e-3 + pid
        tile = tl.arange(0, STORE).to(tl.float32)
        t0 = tl.inline_asm_elementwise("mov.u64 $0, %clock64;", "=l,r", [pid], dtype=tl.int64,
                                       is_pure=False, pack=1)
        for i in range(iters):
            for _ in tl.static_range(WORK):
                x = x * 0.999 + 0.001
            if STORES:
                tl.store(Y + pid * STORE + tl.arange(0, STORE), tile + i)
        t1 = tl.inline_asm_elementwise("mov.u64 $0, %clock64;", "=l,r", [tl.sum(x, 0).to(tl.int32, bitcast=True)],
                                       dtype=tl.int64, is_pure=False, pack=1)
        tl.store(CLK + pid, t1 - t0)

    @triton.jit
    def hbm_copy(X, Y, BLOCK: tl.constexpr):
        pid = tl.program_id(0).to(tl.int64)
        offs = pid * BLOCK + tl.arange(0, BLOCK)
        tl.store(Y + offs, tl.load(X + offs))

    @triton.jit
    def l2_read(X, OUT, nblocks, iters, BLOCK: tl.constexpr, UNROLL: tl.constexpr):
        # UNROLL independent BLOCK-wide loads per step, so several are in flight.
        pid = tl.program_id(0)
        nprog = tl.num_programs(0)
        offs = tl.arange(0, BLOCK)
        acc = tl.zeros([BLOCK], tl.float32)
        for i in range(iters):
            base = (pid + i * nprog) * UNROLL
            for u in tl.static_range(UNROLL):
                b = ((base + u) % nblocks).to(tl.int64)
                acc += tl.load(X + b * BLOCK + offs, cache_modifier=".cg")
        tl.store(OUT + pid * BLOCK + offs, acc)

    @triton.jit
    def l2_shared_read(X, OUT, nblocks, iters, lag, BLOCK: tl.constexpr, UNROLL: tl.constexpr):
        # As l2_read, but every CTA walks the same blocks in the same order,
        # CTA c `lag` blocks ahead of CTA c - 1 (lag 0: all on one block at
        # once, as the CTAs of an attention head step through its K/V tiles)
        pid = tl.program_id(0)
        offs = tl.arange(0, BLOCK)
        acc = tl.zeros([BLOCK], tl.float32)
        start = pid * lag
        for i in range(iters):
            for u in tl.static_range(UNROLL):
                b = ((start + i * UNROLL + u) % nblocks).to(tl.int64)
                acc += tl.load(X + b * BLOCK + offs, cache_modifier=".cg")
        tl.store(OUT + pid * BLOCK + offs, acc)

    @triton.jit
    def l2_write(Y, nblocks, iters, BLOCK: tl.constexpr, UNROLL: tl.constexpr):
        # UNROLL BLOCK-wide stores per step into an L2-resident set: the write
        # path from the SMs into L2 (write-back: the lines never leave L2)
        pid = tl.program_id(0)
        nprog = tl.num_programs(0)
        offs = tl.arange(0, BLOCK)
        val = offs.to(tl.float32)
        for i in range(iters):
            base = (pid + i * nprog) * UNROLL
            for u in tl.static_range(UNROLL):
                b = ((base + u) % nblocks).to(tl.int64)
                tl.store(Y + b * BLOCK + offs, val + i)

    @triton.jit
    def l2_round_trip(X, chunks, passes, CHUNK: tl.constexpr):
        # Each CTA reads its own `chunks` CHUNK-wide pieces of X and writes each
        # back where it was read (x + 1), piece after piece, `passes` times over:
        # data read and written back every pass (FA1's running O, l, m; a
        # working set the next pass finds in L2 or not). Plain ld/st.global.
        pid = tl.program_id(0)
        offs = tl.arange(0, CHUNK)
        base = pid.to(tl.int64) * chunks * CHUNK
        for p in range(passes):
            for c in range(chunks):
                ptr = X + base + c * CHUNK + offs
                tl.store(ptr, tl.load(ptr) + 1.0)

    @triton.jit
    def tile(P, ROWS: tl.constexpr, COLS: tl.constexpr):
        # the [ROWS, COLS] row-major operand tile at P, loaded once into registers
        return tl.load(P + tl.arange(0, ROWS)[:, None] * COLS + tl.arange(0, COLS)[None, :])

    @triton.jit
    def operand(P, ROWS: tl.constexpr, COLS: tl.constexpr, K_MAJOR: tl.constexpr):
        # a product's [ROWS, COLS] B operand (K = ROWS): row-major at P, or
        # (K_MAJOR) stored transposed, [COLS, ROWS] row-major
        if K_MAJOR:
            return tl.trans(tile(P, COLS, ROWS))
        return tile(P, ROWS, COLS)

    @triton.jit
    def sm_id(after):
        # the SM this CTA runs on, read once `after` (an int32 scalar) is computed
        return tl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r,r", [after], dtype=tl.int32, is_pure=False,
                                         pack=1)

    @triton.jit
    def clock_stamp(CLK, slot: tl.constexpr, after):
        # CLK[cta, slot], CLK[cta, slot + 1] = the SM's clock64 and the global
        # timer (ns), read once `after` (an int32 scalar) is computed: cycles
        # counted by the SM that ran the work, whatever clock NVML reports
        # around the launch (its 5 ms samples of sub-ms launches read 1335-1980
        # MHz for the same kernel in session 12)
        cta = tl.program_id(0)
        c = tl.inline_asm_elementwise("mov.u64 $0, %clock64;", "=l,r", [after], dtype=tl.int64,
                                      is_pure=False, pack=1)
        t = tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l,r", [after], dtype=tl.int64,
                                      is_pure=False, pack=1)
        tl.store(CLK + cta * 4 + slot, c)
        tl.store(CLK + cta * 4 + slot + 1, t)

    @triton.jit
    def dot_shape(A, B, C, iters, CLK, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                  A_IN_REGS: tl.constexpr, CLOCKED: tl.constexpr = False):
        # One product per iteration on operands held on chip. A_IN_REGS: A is rebuilt in
        # registers every iteration (as FA's P is), so wgmma takes it from registers
        # and reads only B from SMEM; otherwise both operands sit in SMEM (Q Kᵀ).
        # CLOCKED: CLK gets each CTA's clock64 and global timer at start and end.
        pid = tl.program_id(0)
        if CLOCKED:
            clock_stamp(CLK, 0, pid)
        rm = tl.arange(0, BM)
        rn = tl.arange(0, BN)
        a = tile(A, BM, BK)
        b = tile(B, BK, BN)
        acc = tl.zeros([BM, BN], tl.float32)
        for i in range(iters):
            if A_IN_REGS:
                acc = tl.dot(a + (i & 1).to(a.dtype), b, acc)
            else:
                acc = tl.dot(a, b, acc)
        tl.store(C + pid * BM * BN + rm[:, None] * BN + rn[None, :], acc)
        if CLOCKED:
            clock_stamp(CLK, 2, tl.sum(tl.sum(acc, 1), 0).to(tl.int32, bitcast=True))

    @triton.jit
    def dot_stream(A, B, C, iters, tiles, spread, group, CLK, SMID, BM: tl.constexpr, BN: tl.constexpr,
                   BK: tl.constexpr, STREAM: tl.constexpr):
        # Do tiles streaming into SMEM take bandwidth from the tensor cores'
        # operand reads? One SS product an iteration, [BM, BK] x [BK, BN], A
        # held in SMEM. STREAM: B is a fresh tile every iteration (one of
        # `tiles` L2-resident ones, a power of two), which Triton's pipeliner
        # copies into SMEM stages ahead with cp.async, as fa2's K/V; CTA c
        # starts at tile `spread` x (c // `group`) (spread 0: every CTA reads
        # the same tile at the same time, as a head's CTAs read its K/V).
        # Else B is loaded once and held in SMEM. CLK: each CTA's clock64 and
        # global timer at start and end (clock_stamp); SMID: the SM it ran on.
        pid = tl.program_id(0)
        clock_stamp(CLK, 0, pid)
        sm = sm_id(pid)
        tl.store(SMID + pid, sm)
        a = tile(A, BM, BK)
        acc = tl.zeros([BM, BN], tl.float32)
        if STREAM:
            rk = tl.arange(0, BK)
            rn = tl.arange(0, BN)
            for i in range(iters):
                b = tl.load(B + (((pid // group) * spread + i) % tiles) * BK * BN + rk[:, None] * BN + rn[None, :])
                acc = tl.dot(a, b, acc)
        else:
            b = tile(B, BK, BN)
            for i in range(iters):
                acc = tl.dot(a, b, acc)
        out = tl.sum(tl.sum(acc, 1), 0)
        tl.store(C + pid, out)
        clock_stamp(CLK, 2, out.to(tl.int32, bitcast=True))

    @triton.jit
    def elementwise(x, FMA: tl.constexpr):
        if FMA:  # four dependent fp32 FMAs
            return (((x * 0.999 + 1e-3) * 0.999 + 1e-3) * 0.999 + 1e-3) * 0.999 + 1e-3
        else:  # one MUFU.EX2
            return tl.exp2(-x)

    @triton.jit
    def dot_exp_mix(A, B, C, iters, sms, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                    DOT: tl.constexpr, EXP: tl.constexpr, SPLIT: tl.constexpr,
                    FMA: tl.constexpr = False):
        # Can an SM run the tensor cores and the SFU at once? Each iteration does one
        # [BM, BK] x [BK, BN] product (DOT) and/or one exp2 per element of a
        # [BM, BN] fp32 tile (EXP), on independent data. SPLIT: CTAs of even
        # "rounds" (pid // sms: the hardware hands out one CTA per SM per round)
        # only multiply, those of odd rounds only exponentiate, so every SM holds
        # both kinds and the work comes from different warps of the same SM.
        # FMA: the elementwise work is four dependent fp32 FMAs instead of an exp2.
        pid = tl.program_id(0)
        rm = tl.arange(0, BM)
        rn = tl.arange(0, BN)
        a = tile(A, BM, BK)
        b = tile(B, BK, BN)
        acc = tl.zeros([BM, BN], tl.float32)
        x = (rm[:, None] * BN + rn[None, :] + pid).to(tl.float32) * 1e-6
        if SPLIT:
            if (pid // sms) % 2 == 0:
                for i in range(iters):
                    acc = tl.dot(a, b, acc)
            else:
                for i in range(iters):
                    x = elementwise(x, FMA)
        elif DOT and EXP:
            for i in range(iters):
                acc = tl.dot(a, b, acc)
                x = elementwise(x, FMA)
        elif DOT:
            for i in range(iters):
                acc = tl.dot(a, b, acc)
        else:
            for i in range(iters):
                x = elementwise(x, FMA)
        tl.store(C + pid * BM * BN + rm[:, None] * BN + rn[None, :], acc + x)

    @triton.jit
    def dot_exp_timing(A, B, C, STAMPS, iters, sms, bursts, BURST: tl.constexpr, GAP: tl.constexpr,
                       BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, FMA: tl.constexpr,
                       PAIR: tl.constexpr = False):
        # When does elementwise work hold an SM's tensor pipe: while it runs,
        # or after? CTAs of even rounds (pid // sms) run [BM, BK] x [BK, BN]
        # products back to back, each on the last, and stamp the SM's clock64
        # once each is in (its row maxima); CTAs of odd rounds, beside them on
        # the same SMs, wait GAP cycles, then run BURST iterations of one exp2
        # (or four FMAs) an element of a [BM, BN] tile, `bursts` times, and
        # stamp each burst's start and end. STAMPS[pid]: iters slots (a
        # product CTA's ends; a burst CTA's starts and ends, two a burst),
        # then its SM. C[pid]: a sum of its results, which keeps the work
        # from being compiled away (stamps alone left one empty 64x8x16 HGMMA
        # in the loop). PAIR: every CTA runs the products (two product CTAs an
        # SM: does the tensor pipe take their products in turn or together?).
        pid = tl.program_id(0)
        rm = tl.arange(0, BM)
        first = rm == 0
        base = STAMPS + pid * (iters + 1)
        tl.store(base + iters + rm * 0, sm_id(pid).to(tl.int64) + rm * 0, mask=first)
        if PAIR or (pid // sms) % 2 == 0:
            a = tile(A, BM, BK)
            b = tile(B, BK, BN)
            acc = tl.zeros([BM, BN], tl.float32)
            for i in range(iters):
                acc = tl.dot(a, b, acc)
                m = tl.max(acc, 1)
                clk = tl.inline_asm_elementwise("mov.u64 $0, %clock64;", "=l,r", [m.to(tl.int32, bitcast=True)],
                                                dtype=tl.int64, is_pure=False, pack=1)
                tl.store(base + i + rm * 0, clk, mask=first)
            tl.store(C + pid, tl.sum(tl.sum(acc, 1), 0))
        else:
            rn = tl.arange(0, BN)
            x = (rm[:, None] * BN + rn[None, :] + pid).to(tl.float32) * 1e-6
            for k in range(bursts):
                t0 = tl.inline_asm_elementwise("mov.u64 $0, %clock64;", "=l,r", [k], dtype=tl.int64,
                                               is_pure=False, pack=1)
                t = t0
                while t - t0 < GAP:
                    t = tl.inline_asm_elementwise("mov.u64 $0, %clock64;", "=l,r", [k], dtype=tl.int64,
                                                  is_pure=False, pack=1)
                x = x + (t & 0).to(tl.float32)      # the burst starts once the wait is over
                for j in range(BURST):
                    x = elementwise(x, FMA)
                done = tl.max(tl.max(x, 1), 0)
                e = tl.inline_asm_elementwise("mov.u64 $0, %clock64;", "=l,r", [done.to(tl.int32, bitcast=True)],
                                              dtype=tl.int64, is_pure=False, pack=1)
                tl.store(base + 2 * k, t)
                tl.store(base + 2 * k + 1, e)
            tl.store(C + pid, tl.sum(tl.sum(x, 1), 0))

    @triton.jit
    def dot_pair(A, B1, B2, C, iters1, iters2, sms, BM: tl.constexpr, BK: tl.constexpr,
                 BN1: tl.constexpr, BN2: tl.constexpr, MODE: tl.constexpr):
        # Does a wgmma starved of SMEM operands hold the tensor pipe against other
        # CTAs' products? Two products from SMEM: [BM, BK] x [BK, BN1] (narrow:
        # SMEM-bound) and [BM, BK] x [BK, BN2] (wide: tensor-bound). MODE 1 or 2:
        # every CTA runs product 1 (iters1 times) or product 2 (iters2); MODE 3:
        # CTAs of even rounds (pid // sms) run product 1, odd rounds product 2,
        # so every SM holds both kinds.
        pid = tl.program_id(0)
        a = tile(A, BM, BK)
        first = MODE == 1
        if MODE == 3:
            first = (pid // sms) % 2 == 0
        if first:
            b = tile(B1, BK, BN1)
            acc = tl.zeros([BM, BN1], tl.float32)
            for i in range(iters1):
                acc = tl.dot(a, b, acc)
            tl.store(C + pid, tl.sum(tl.sum(acc, 1), 0))   # a scalar: no SMEM staging
        else:
            b2 = tile(B2, BK, BN2)
            acc2 = tl.zeros([BM, BN2], tl.float32)
            for i in range(iters2):
                acc2 = tl.dot(a, b2, acc2)
            tl.store(C + pid, tl.sum(tl.sum(acc2, 1), 0))

    @triton.jit
    def phase_stamp(STAMPS, step, m, BM: tl.constexpr, STEPS: tl.constexpr):
        # every row's clock64 once its row max m (which needs S) is in, into
        # STAMPS[cta, step] for steps 0..STEPS-1 (steps before write slot 0,
        # which step 0 overwrites; steps after, the dump slot STEPS). Stored
        # from PTX with the address in m's own layout: a tl.store is given a
        # coalesced layout, and converting the stamps to it went through SMEM
        # with a second CTA barrier mid-step, which would hold the warpgroups
        # together after S (SASS of the cross-compiled kernel).
        clk = tl.inline_asm_elementwise("mov.u64 $0, %clock64;", "=l,r", [m.to(tl.int32, bitcast=True)],
                                        dtype=tl.int64, is_pure=False, pack=1)
        slot = tl.minimum(tl.maximum(step, 0), STEPS)
        row = (m.to(tl.int32, bitcast=True) & 0) + tl.arange(0, BM)
        addr = (STAMPS + (tl.program_id(0) * (STEPS + 1) + slot) * BM + row).to(tl.int64, bitcast=True)
        tl.inline_asm_elementwise("st.global.b64 [$1], $2;\n\tmov.u32 $0, 0;", "=r,l,l", [addr, clk],
                                  dtype=tl.int32, is_pure=False, pack=1)

    @triton.jit
    def stagger_start(ARRIVED, PER_SM: tl.constexpr, SPIN: tl.constexpr, after):
        # The k-th of the PER_SM CTAs an SM takes in this launch (counted in
        # ARRIVED[its SM], which grows by PER_SM a launch) spins k x SPIN
        # cycles of its SM's clock before going on: CTAs side by side start
        # their loops that far apart. (A scalar atomic: one thread adds, all
        # get the old count.)
        sm = sm_id(after)
        rank = tl.atomic_add(ARRIVED + sm, 1) % PER_SM
        t0 = tl.inline_asm_elementwise("mov.u64 $0, %clock64;", "=l,r", [rank], dtype=tl.int64, is_pure=False,
                                       pack=1)
        t = t0
        while t - t0 < rank * SPIN:
            t = tl.inline_asm_elementwise("mov.u64 $0, %clock64;", "=l,r", [rank], dtype=tl.int64,
                                          is_pure=False, pack=1)
        return t

    @triton.jit
    def dot_chain(A, B, V, C, iters, CLK, STAMPS, first, BM: tl.constexpr, BN: tl.constexpr,
                  BK: tl.constexpr, D: tl.constexpr, CLOCKED: tl.constexpr = False,
                  PHASE_STEPS: tl.constexpr = 0, TILES: tl.constexpr = 0, SPREAD: tl.constexpr = 0,
                  FP8: tl.constexpr = False, ONLINE: tl.constexpr = False, SMID=None, ARRIVED=None,
                  PER_SM: tl.constexpr = 1, SPIN: tl.constexpr = 0, SYNC: tl.constexpr = 0,
                  PARTS: tl.constexpr = 0):
        # A dependent chain per iteration, operands on chip: S = A·B (SMEM
        # operands), an exp2 and a row max on S, then acc += P·V with P from
        # registers -- the shape of a flash-attention step without its loads.
        # Timed at 1, 2, 4 CTAs per SM: how much of the chain's latency other
        # CTAs hide (an SM's throughput vs one warpgroup's round trip).
        # CLOCKED: CLK gets each CTA's clock64 and global timer at start and end.
        # PHASE_STEPS: for that many steps from `first`, STAMPS gets every row's
        # clock64 once its S is in (phase_stamp): with 8 warps rows 0-63 are
        # warpgroup 0's and 64-127 warpgroup 1's, so the two stamps of a step
        # say in which order the SM's tensor pipe served the two warpgroups'
        # S products, issued together after the step's CTA barrier (BAR.SYNC
        # heads the loop): whole products in order, one lands a product's
        # time after the other; instructions interleaved, both together.
        # TILES: B and V streamed instead, step i of CTA c reading tile
        # (i + SPREAD x c) % TILES of each (SPREAD 0: every CTA the same one at
        # once, as a head's CTAs read its K/V), copied into SMEM ahead by
        # Triton's pipeliner (cp.async, num_stages).
        # FP8: e4m3 operands and P converted to e4m3 for P·V. wgmma takes
        # both fp8 operands K-major, so B holds Bᵀ ([BN, BK] tiles) and V
        # holds Vᵀ ([D, BN]), as kernels/fa3.py's fp8 kernel reads K and Vᵀ.
        # ONLINE: fa2's whole online softmax instead of the bare chain (the
        # scale, the correction exp2, the row sum and the rescale of acc:
        # kernels/online_softmax.softmax_update, as kernels/fa2.py's step).
        # SMID: the SM each CTA ran on, stored at its end (which CTAs shared
        # an SM, for the phase stamps of several CTAs an SM). SPIN: the CTAs
        # an SM takes start their loops SPIN cycles apart (stagger_start).
        # SYNC: that many more CTA-wide barriers (BAR.SYNC) a step, the first
        # between the softmax and P·V, the second between S = A·B and the
        # softmax: what a barrier costs a CTA whose warps its neighbours' warps
        # hold back on some sub-partitions and not others.
        # PARTS (ONLINE): 1 runs the two products without the softmax (P = S
        # scaled), still on every streamed tile: do the K/V copies slow the
        # products, or the softmax? (A softmax alone cannot be streamed the
        # same way: without a product to feed, Triton loads the tiles into
        # registers, not by cp.async into SMEM.)
        pid = tl.program_id(0)
        if CLOCKED:
            clock_stamp(CLK, 0, pid)
        a = tile(A, BM, BK)
        b = operand(B, BK, BN, FP8)
        v = operand(V, BN, D, FP8)
        if SPIN:
            stagger_start(ARRIVED, PER_SM, SPIN, tl.sum(tl.sum(a.to(tl.float32), 1), 0).to(tl.int32, bitcast=True))
        acc = tl.zeros([BM, D], tl.float32)
        m = tl.zeros([BM], tl.float32)
        l = tl.zeros([BM], tl.float32)
        for i in range(iters):
            if TILES:
                j = (i + SPREAD * pid) % TILES
                b = operand(B + j * BK * BN, BK, BN, FP8)
                v = operand(V + j * BN * D, BN, D, FP8)
            s = tl.dot(a, b)
            if SYNC == 2:
                tl.debug_barrier()
            if PARTS == 1:
                p = s * 0.01
            elif ONLINE:
                p, alpha, l, m = softmax_update(s, m, l, 0.01)
                acc = acc * alpha[:, None]
            else:
                m = tl.maximum(m, tl.max(s, 1))
                if PHASE_STEPS:
                    phase_stamp(STAMPS, i - first, m, BM, PHASE_STEPS)
                p = tl.exp2(s * 0.01 - m[:, None] * 0.01)
            if SYNC:
                tl.debug_barrier()
            acc = tl.dot(p.to(v.dtype), v, acc)
        out = tl.sum(tl.sum(acc, 1), 0) + tl.sum(m, 0)
        if ONLINE:
            out += tl.sum(l, 0)
        tl.store(C + pid, out)
        if CLOCKED:
            clock_stamp(CLK, 2, out.to(tl.int32, bitcast=True))
        if SMID is not None:
            tl.store(SMID + pid, sm_id(out.to(tl.int32, bitcast=True)))

    @triton.jit
    def softmax_mix(X, OUT, iters, BM: tl.constexpr, BN: tl.constexpr, EXP: tl.constexpr):
        # A flash step's elementwise part alone, its tile in registers: the
        # row max, exp2 of the scores and of the correction, the row sum and
        # the rescale of an accumulator, no products and no loads. Its loop's
        # instructions (SASS) against its time tell whether the SM's issue
        # slots (4 warp instructions a clock) or the MUFU (16 exp2 a clock)
        # bound the mix, or their sum. EXP=False puts an FFMA where each
        # exp2 was: the same instructions less the MUFU.
        pid = tl.program_id(0)
        s = tile(X, BM, BN)
        m = tl.full([BM], -1.0e30, tl.float32)
        l = tl.zeros([BM], tl.float32)
        acc = tl.zeros([BM, BN], tl.float32)
        for i in range(iters):
            m_new = tl.maximum(m, tl.max(s, 1))
            if EXP:
                alpha = tl.exp2(m - m_new)
                p = tl.exp2(s - m_new[:, None])
            else:
                alpha = (m - m_new) * 0.5 + 1.0
                p = (s - m_new[:, None]) * 0.5 + 1.0
            l = l * alpha + tl.sum(p, 1)
            acc = acc * alpha[:, None] + p
            s = s + p * 0.001      # the next step depends on this one
            m = m_new
        tl.store(OUT + pid * BM + tl.arange(0, BM), l + tl.sum(acc, 1))

    @triton.jit
    def exp2_loop(OUT, iters, BLOCK: tl.constexpr):
        pid = tl.program_id(0)
        offs = tl.arange(0, BLOCK)
        x = (offs + pid).to(tl.float32) * 1e-4
        for i in range(iters):
            x = tl.exp2(-x)
        tl.store(OUT + pid * BLOCK + offs, x)

    @triton.jit
    def empty():
        pass

    return dict(hbm_read=hbm_read, hbm_write=hbm_write, hbm_copy=hbm_copy, tile_write=tile_write,
                tma_setup=tma_setup, store_overlap=store_overlap, l2_read=l2_read, l2_shared_read=l2_shared_read,
                l2_write=l2_write, l2_round_trip=l2_round_trip,
                dot_shape=dot_shape, dot_stream=dot_stream, dot_exp_mix=dot_exp_mix, dot_exp_timing=dot_exp_timing, dot_pair=dot_pair, dot_chain=dot_chain,
                softmax_mix=softmax_mix, exp2_loop=exp2_loop, empty=empty)

DOT_SHAPES = {"bf16": (128, 256, 64), "fp16": (128, 256, 64), "fp8": (128, 256, 128)}

DOT_WARPS = 8
