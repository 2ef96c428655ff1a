"""FlashAttention-3 forward (arXiv 2407.08608) for Hopper in Gluon, with explicit warp specialisation.

Why Gluon: Triton 3.6 ignores `warp_specialize=True` on sm_90 (kernels/NOTES.md),
so kernels/fa3.py runs TMA waits, both GEMMs and the softmax in the same warps.
Gluon (triton.experimental.gluon, Triton 3.6) lets us write the partitions,
the SMEM ring, the mbarriers and the wgmma waits by hand.

CTA = one 128-row Q tile (192 with three consumers) of one (batch, head) at a
time: a 1-D grid over tiles t = (b*H + h) * cdiv(Nq, block_m) + m (Q tiles of a head adjacent, for L2 reuse of
its K/V), causal tiles of a head heaviest first. Persistent: one CTA per SM
(the producer loads the next tile's Q and K/V while the consumers finish the
current one), taking tiles pid, pid + #SMs, ... when they are equal
(non-causal), or those a host-made list schedule gives it (causal: head order,
the last rounds heaviest first; list_schedule). forward() can also launch one
tile per CTA.
Three partitions (gl.warp_specialize), 12 warp slots in all (four partitions and 16
slots with three consumers):
  * consumer 0 (the default partition, 4 warps = warpgroup 0) owns query rows
    [0, 64) of the tile, consumer 1 (a 4-warp worker = warpgroup 1) rows
    [64, 128). Each holds its own 64 x D fp32 accumulator: a warpgroup's wgmma
    covers 64 rows, and 64 rows keep S (64 x BN fp32), P and O in registers
    within the 240 registers setmaxnreg grants (FA3's split of block_m = 128).
    With three consumers (block_m 192, FA3's other hdim-128 tile) each gets
    160 registers, and P goes through an SMEM buffer per consumer
    (algorithms.fa3.p_in_smem; an option with two as well). Q can be held in
    registers as the A operand of Q Kᵀ (q_regs, off by default).
  * producer (a 1-warp worker, 24 registers): TMA loads of the consumers' Q
    tiles, then K_j and V_j into a `num_stages`-deep ring. Each stage has a
    ready barrier (completed by the TMA transaction count) and an empty barrier
    (count: the consumers, each releases the slot). K and V have separate
    barriers so that S_j = Q K_jᵀ can start before V_j has landed.
  What each variant measured on the H100: kernels/NOTES.md (session 19).
Consumer loop (FA3 Algorithm 2, intra-warpgroup overlap): turn j issues the
wgmma for S_j and the wgmma for O += P_{j-1} V_{j-1} back to back (both async),
waits for S_j only (warpgroup_mma_wait(1)), runs the online softmax of block j
(exp2 with sm_scale·log2 e folded into one FMA, as fa2) while P_{j-1} V_{j-1}
is still on the tensor cores, then waits for it and rescales O.
Pingpong (PINGPONG; TileConfig.pingpong, off in default_config): the two consumers take turns issuing their
GEMMs through two mbarriers ("turn"): consumer c waits turn[c] before issuing
and arrives on turn[1-c] right after, so one warpgroup's softmax runs while
the other's GEMMs occupy the tensor cores (FA3 §3.1). FA3 uses named barriers
(bar.sync id) for this; Gluon 3.6 exposes none, so mbarriers stand in.
Causal masking is bottom-right aligned (row r sees column c iff
c <= r + Nkv - Nq), as kernels/fa2.py; blocks entirely above the diagonal of
the tile's last row are never loaded; a block gets the mask only from the
first block that the consumer's first row cannot see fully (or the Nkv tail).
Tails: K/V/Q go through 2-D TMA descriptors over the [B*H*N, D] views; rows
past a head's N belong to the next head (or are zero-filled at the end of the
tensor); their columns are masked to -inf, and O rows past Nq are not stored
(masked plain stores from the wgmma accumulator layout).
GQA: K/V head = h // (H // KVH).
O is written once in the input dtype, LSE (fp32, natural log) as kernels/fa2.py.
"""
from __future__ import annotations

import functools
import heapq
import re
from dataclasses import dataclass

import torch
import triton

from algorithms import fa3 as fa3_schedule
from algorithms.errors import InvalidConfig, InvalidProblem, UnsupportedAlgorithm
from algorithms.fa3 import o_in_smem, p_in_smem  # where P and O go: the schedule's rules
from algorithms.problem import AttentionProblem, TileConfig, cdiv

from .common import LOG2E, launch, launch_hints, problem_of, require_hopper, resolve_scale

try:  # Gluon ships with Triton >= 3.5; importing it needs no GPU
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma,
                                                                  warpgroup_mma, warpgroup_mma_wait)
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    HAVE_GLUON = True
except ImportError:  # pragma: no cover - older Triton
    HAVE_GLUON = False

ROWS_PER_CONSUMER = 64  # one warpgroup's wgmma M
CONSUMERS = 2           # the default: block_m = 128
BLOCK_M = ROWS_PER_CONSUMER * CONSUMERS
# Register budgets by consumer warpgroups, FA3's own (hopper/flash_fwd_kernel_sm90.h:
# 24 / 240 with two consumer warpgroups, 32 / 160 with three). The CTA launches
# (consumers + 1) warpgroups' worth of warps (the 1-warp producer's partition is
# padded to a warpgroup) at MAXNREG each; setmaxnreg then moves the producer's
# registers to the consumers: 128 x (2 x 240 + 24) = 64512 and
# 128 x (3 x 160 + 32) = 65536 <= 65536 registers.
#   consumers: (MAXNREG, consumer registers, producer registers)
REGISTERS = {2: (168, 240, 24), 3: (128, 160, 32)}


if HAVE_GLUON:
    @gluon.jit
    def _fa3g_tile(t, n_m, n_tiles, n_q, n_kv, causal_off, H: gl.constexpr, GROUP: gl.constexpr,
                   ROWS: gl.constexpr, NC: gl.constexpr, BLOCK_N: gl.constexpr,
                   CAUSAL: gl.constexpr, LPT: gl.constexpr):
        """Tile t -> (b*H + h, K/V head row base, first query row, K/V blocks to visit).
        Head-major order (LPT off): Q tiles of one head are adjacent in t, so
        CTAs running together share that head's K/V through L2 (as fa2's grid
        with the Q block fastest); causal takes each head's heaviest tile first.
        LPT (causal): the whole grid heaviest first (all heads' last Q tile, then
        the one before, ...), and a persistent CTA walks its rounds as a snake
        (pid in even rounds, grid - 1 - pid in odd ones), so each CTA's
        heavy-tile rounds pair with light ones: longest-processing-time-first,
        a static schedule that balances without an atomic tile counter."""
        if LPT:
            grid = gl.num_programs(0)
            r = t // grid
            if (r % 2) == 1:
                if (r + 1) * grid <= n_tiles:  # a full round: walk it backwards
                    t = r * grid + grid - 1 - t % grid
            n_bh = n_tiles // n_m
            m = n_m - 1 - t // n_bh
            bh = t % n_bh
        else:
            bh = t // n_m
            m = t % n_m
            if CAUSAL:
                m = n_m - 1 - m  # the heaviest tiles (most K/V blocks) first
        b = bh // H
        h = bh % H
        kvh = b * (H // GROUP) + h // GROUP
        row0 = m * (NC * ROWS)
        n_blocks = gl.cdiv(n_kv, BLOCK_N)
        if CAUSAL:
            last_row = gl.minimum(row0 + NC * ROWS, n_q) - 1
            n_blocks = gl.minimum(n_blocks, gl.cdiv(last_row + causal_off + 1, BLOCK_N))
        # at least one block: a tile whose rows see no key (causal with Nq > Nkv)
        # runs block 0 fully masked, which yields NaN rows as the fp64 reference does
        return bh, kvh * n_kv, row0, gl.maximum(n_blocks, 1)

    @gluon.jit
    def _fa3g_tile_count(sched, sched_stride, n_tiles, SCHEDULED: gl.constexpr):
        """How many tiles this CTA takes: its row of the host's list schedule
        (SCHEDULED), or every grid-th tile from its program id."""
        pid = gl.program_id(0)
        if SCHEDULED:
            n = gl.load(sched + pid * sched_stride)
        else:
            n = gl.cdiv(n_tiles - pid, gl.num_programs(0))
        return n

    @gluon.jit
    def _fa3g_tile_at(sched, sched_stride, i, SCHEDULED: gl.constexpr):
        """This CTA's i-th tile."""
        pid = gl.program_id(0)
        if SCHEDULED:
            t = gl.load(sched + pid * sched_stride + 1 + i)
        else:
            t = pid + i * gl.num_programs(0)
        return t

    @gluon.jit
    def _fa3g_producer(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_ready, q_empty, k_ready,
                       k_empty, v_ready, v_empty, n_q, n_kv, causal_off, n_m, n_tiles, sched,
                       sched_stride, H: gl.constexpr, GROUP: gl.constexpr, ROWS: gl.constexpr,
                       NC: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                       CAUSAL: gl.constexpr, LPT: gl.constexpr, SCHEDULED: gl.constexpr):
        it = 0  # K/V blocks issued so far: the ring position runs on across tiles
        tc = 0  # tiles done by this CTA
        for i in range(_fa3g_tile_count(sched, sched_stride, n_tiles, SCHEDULED)):
            t = _fa3g_tile_at(sched, sched_stride, i, SCHEDULED)
            bh, kv_row0, row0, n_iter = _fa3g_tile(t, n_m, n_tiles, n_q, n_kv, causal_off, H, GROUP,
                                                   ROWS, NC, BLOCK_N, CAUSAL, LPT)
            # Q: one tile per consumer, each with its own barriers; a consumer
            # frees its Q buffer once the last S GEMM of its previous tile retired.
            # Empty barriers start "phase 1 complete": the first lap passes at once.
            for c in gl.static_range(NC):
                mbarrier.wait(q_empty.index(c), (tc & 1) ^ 1)
                mbarrier.expect(q_ready.index(c), q_desc.block_type.nbytes)
                tma.async_copy_global_to_shared(q_desc, [bh * n_q + row0 + c * ROWS, 0],
                                                q_ready.index(c), q_smem.index(c))
            for j in range(n_iter):
                s = it % STAGES
                ph = ((it // STAGES) & 1) ^ 1
                mbarrier.wait(k_empty.index(s), ph)
                mbarrier.expect(k_ready.index(s), k_desc.block_type.nbytes)
                tma.async_copy_global_to_shared(k_desc, [kv_row0 + j * BLOCK_N, 0],
                                                k_ready.index(s), k_smem.index(s))
                mbarrier.wait(v_empty.index(s), ph)
                mbarrier.expect(v_ready.index(s), v_desc.block_type.nbytes)
                tma.async_copy_global_to_shared(v_desc, [kv_row0 + j * BLOCK_N, 0],
                                                v_ready.index(s), v_smem.index(s))
                it += 1
            tc += 1

    @gluon.jit
    def _fa3g_mask(s, j, n_kv, causal_off, offs_m, offs_n, BLOCK_N: gl.constexpr,
                   CAUSAL: gl.constexpr):
        cols = gl.expand_dims(j * BLOCK_N + offs_n, 0)
        keep = cols < n_kv
        if CAUSAL:
            keep = keep & (cols <= gl.expand_dims(offs_m, 1) + causal_off)
        return gl.where(keep, s, float("-inf"))

    @gluon.jit
    def _fa3g_p_operand(p, p_buf, p_layout: gl.constexpr, dtype: gl.constexpr,
                        P_SMEM: gl.constexpr):
        """P in the input dtype as the A operand of O += P V: in registers, in
        the dot-operand layout (returned), or (P_SMEM) written into this
        warpgroup's SMEM buffer for an SS wgmma, returning 0 in its place.
        fence_async_shared makes the generic-proxy stores visible to the tensor
        cores' async proxy; each warp's 16 rows of P are the A rows of its own
        share of the wgmma, so no warpgroup barrier is needed (FA3's
        write_P_to_smem: fence, then __syncwarp)."""
        if P_SMEM:
            p_buf.store(p.to(dtype))
            fence_async_shared()
            p_op = 0
        else:
            p_op = gl.convert_layout(p.to(dtype), p_layout)
        return p_op

    @gluon.jit
    def _fa3g_issue_pv(p_op, p_buf, v, acc, P_SMEM: gl.constexpr):
        """Issue O += P V (async), P from registers or from its SMEM buffer."""
        if P_SMEM:
            acc = warpgroup_mma(p_buf, v, acc, is_async=True)
        else:
            acc = warpgroup_mma(p_op, v, acc, is_async=True)
        return acc

    @gluon.jit
    def _fa3g_wait_pv(acc, p_op, P_SMEM: gl.constexpr):
        """Wait for O += P V. P in registers must stay live until its wgmma
        retires, so it is passed as a dep; P in SMEM needs no register dep."""
        if P_SMEM:
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
        else:
            acc, p_op = warpgroup_mma_wait(num_outstanding=0, deps=(acc, p_op))
        return acc, p_op

    @gluon.jit
    def _fa3g_consumer(q_smem, k_smem, v_smem, p_smem, o_smem, o_desc, q_ready, q_empty, k_ready,
                       k_empty, v_ready, v_empty, turn, O, LSE, qk_scale, n_q, n_kv, causal_off,
                       n_m, n_tiles, sched, sched_stride, C: gl.constexpr, H: gl.constexpr,
                       GROUP: gl.constexpr, HEAD_DIM: gl.constexpr, ROWS: gl.constexpr,
                       NC: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                       CAUSAL: gl.constexpr, PINGPONG: gl.constexpr, P_SMEM: gl.constexpr,
                       Q_REGS: gl.constexpr, O_TMA: gl.constexpr, LPT: gl.constexpr,
                       SCHEDULED: gl.constexpr):
        # wgmma accumulator layouts of one warpgroup (4 warps along M): S is
        # ROWS x BLOCK_N, O is ROWS x HEAD_DIM; P feeds the second wgmma from
        # registers (A operand), so it takes the dot-operand layout of O's MMA,
        # or (P_SMEM) from this consumer's ROWS x BLOCK_N buffer in SMEM, which
        # frees its 32 registers a thread (three consumers get 160 each, not 240).
        s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                           instr_shape=[16, BLOCK_N, 16])
        o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                           instr_shape=[16, HEAD_DIM, 16])
        p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
        # Q_REGS: Q as the register A operand of S = Q Kᵀ (loaded once a tile),
        # so a step's QKᵀ reads only K from SMEM, 16 KB less a consumer and step
        q_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=s_layout, k_width=2)
        row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
        row_o: gl.constexpr = gl.SliceLayout(1, o_layout)
        dtype: gl.constexpr = q_smem.dtype
        q = q_smem.index(C)
        p_buf = p_smem.index(C if P_SMEM else 0)
        s_zero = gl.zeros([ROWS, BLOCK_N], gl.float32, s_layout)
        # turn barriers start "phase 1 complete": consumer 0 passes its first
        # wait at once, consumer c waits for consumer c-1's first arrive. All
        # consumers take n_iter + 1 turns per tile, so the phases stay paired.
        turn_phase = 1 if C == 0 else 0
        it = 0  # ring position (K/V blocks consumed so far), as the producer's
        tc = 0
        for i in range(_fa3g_tile_count(sched, sched_stride, n_tiles, SCHEDULED)):
            t = _fa3g_tile_at(sched, sched_stride, i, SCHEDULED)
            bh, kv_row0, row0, n_iter = _fa3g_tile(t, n_m, n_tiles, n_q, n_kv, causal_off, H, GROUP,
                                                   ROWS, NC, BLOCK_N, CAUSAL, LPT)
            row_first = row0 + C * ROWS  # this consumer's first query row within the head
            offs_m = row_first + gl.arange(0, ROWS, layout=row_s)
            offs_n = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
            # blocks before n_full need no mask: inside Nkv and fully visible to row_first
            n_full = n_kv // BLOCK_N
            if CAUSAL:
                n_full = gl.maximum(gl.minimum(n_full, (row_first + causal_off + 1) // BLOCK_N), 0)
            acc = gl.zeros([ROWS, HEAD_DIM], gl.float32, o_layout)
            mbarrier.wait(q_ready.index(C), tc & 1)
            if Q_REGS:  # Q now lives in registers: its buffer may take the next tile's Q
                q_op = q.load(q_layout)
                mbarrier.arrive(q_empty.index(C), count=1)
            else:
                q_op = q

            # ---- block 0: S_0 only (no P V yet)
            st = it % STAGES
            mbarrier.wait(k_ready.index(st), (it // STAGES) & 1)
            if PINGPONG:
                mbarrier.wait(turn.index(C), turn_phase)
            s = warpgroup_mma(q_op, k_smem.index(st).permute((1, 0)), s_zero, use_acc=False,
                              is_async=True)
            if PINGPONG:
                mbarrier.arrive(turn.index((C + 1) % NC), count=1)
            turn_phase ^= 1
            s = warpgroup_mma_wait(num_outstanding=0, deps=(s, ))
            mbarrier.arrive(k_empty.index(st), count=1)
            if n_full == 0:
                s = _fa3g_mask(s, 0, n_kv, causal_off, offs_m, offs_n, BLOCK_N, CAUSAL)
            m_i = gl.max(s, 1) * qk_scale
            p = gl.exp2(s * qk_scale - gl.expand_dims(m_i, 1))
            l_i = gl.sum(p, 1)
            p_op = _fa3g_p_operand(p, p_buf, p_layout, dtype, P_SMEM)

            # ---- blocks 1 .. n_iter-1: issue S_j and P_{j-1} V_{j-1}; softmax(j) under the PV
            for j in range(1, n_iter):
                st = (it + j) % STAGES
                prev = (it + j - 1) % STAGES
                # wait for the data before taking the turn, so a turn is never held idle
                mbarrier.wait(k_ready.index(st), ((it + j) // STAGES) & 1)
                mbarrier.wait(v_ready.index(prev), ((it + j - 1) // STAGES) & 1)
                if PINGPONG:
                    mbarrier.wait(turn.index(C), turn_phase)
                s = warpgroup_mma(q_op, k_smem.index(st).permute((1, 0)), s_zero, use_acc=False,
                                  is_async=True)
                acc = _fa3g_issue_pv(p_op, p_buf, v_smem.index(prev), acc, P_SMEM)
                if PINGPONG:
                    mbarrier.arrive(turn.index((C + 1) % NC), count=1)
                turn_phase ^= 1
                # S_j done (P_{j-1} V_{j-1} may still run): release K_j's slot
                s = warpgroup_mma_wait(num_outstanding=1, deps=(s, ))
                mbarrier.arrive(k_empty.index(st), count=1)
                if j >= n_full:
                    s = _fa3g_mask(s, j, n_kv, causal_off, offs_m, offs_n, BLOCK_N, CAUSAL)
                m_new = gl.maximum(m_i, gl.max(s, 1) * qk_scale)
                alpha = gl.exp2(m_i - m_new)
                p = gl.exp2(s * qk_scale - gl.expand_dims(m_new, 1))
                l_i = l_i * alpha + gl.sum(p, 1)
                m_i = m_new
                acc, p_op = _fa3g_wait_pv(acc, p_op, P_SMEM)
                mbarrier.arrive(v_empty.index(prev), count=1)
                acc = acc * gl.expand_dims(gl.convert_layout(alpha, row_o), 1)
                # (P_{j-1}'s product has retired: with P_SMEM its buffer takes P_j)
                p_op = _fa3g_p_operand(p, p_buf, p_layout, dtype, P_SMEM)
            if not Q_REGS:  # every S GEMM of this tile has retired: the producer may load the next Q
                mbarrier.arrive(q_empty.index(C), count=1)

            # ---- last P V
            last = (it + n_iter - 1) % STAGES
            mbarrier.wait(v_ready.index(last), ((it + n_iter - 1) // STAGES) & 1)
            if PINGPONG:
                mbarrier.wait(turn.index(C), turn_phase)
            acc = _fa3g_issue_pv(p_op, p_buf, v_smem.index(last), acc, P_SMEM)
            if PINGPONG:
                mbarrier.arrive(turn.index((C + 1) % NC), count=1)
            turn_phase ^= 1
            acc, p_op = _fa3g_wait_pv(acc, p_op, P_SMEM)
            mbarrier.arrive(v_empty.index(last), count=1)
            it += n_iter
            tc += 1

            # ---- epilogue: O = acc / l (input dtype), LSE = (m + log2 l) ln 2
            o = (acc / gl.expand_dims(gl.convert_layout(l_i, row_o), 1)).to(dtype)
            if O_TMA and row_first + ROWS <= n_q:
                # a whole 64-row slice inside the head: one TMA store from SMEM
                # (rows past Nq would belong to the next head, so partial slices
                # take the masked stores); the slice's buffer is free once the
                # store of this consumer's previous tile has read it
                o_buf = o_smem.index(C)
                tma.store_wait(0)
                o_buf.store(o)
                fence_async_shared()
                tma.async_copy_shared_to_global(o_desc, [bh * n_q + row_first, 0], o_buf)
            else:
                offs_mo = row_first + gl.arange(0, ROWS, layout=row_o)
                offs_d = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, o_layout))
                rows = gl.expand_dims(offs_mo, 1)
                o_base = bh.to(gl.int64) * n_q * HEAD_DIM
                ptrs = O + o_base + rows * HEAD_DIM + gl.expand_dims(offs_d, 0)
                gl.store(ptrs, o, mask=(rows < n_q) & (gl.expand_dims(offs_d, 0) < HEAD_DIM))
            lse = (m_i + gl.log2(l_i)) * 0.6931471805599453
            gl.store(LSE + bh.to(gl.int64) * n_q + offs_m, lse, mask=offs_m < n_q)
        if O_TMA:  # the last tile's O store must land before the CTA exits
            tma.store_wait(0)

    @gluon.jit
    def _fa3g_fwd(q_desc, k_desc, v_desc, o_desc, O, LSE, qk_scale, n_q, n_kv, causal_off, n_tiles,
                  sched,
                  sched_stride, H: gl.constexpr, GROUP: gl.constexpr, HEAD_DIM: gl.constexpr,
                  ROWS: gl.constexpr, NC: gl.constexpr, BLOCK_N: gl.constexpr,
                  STAGES: gl.constexpr, CAUSAL: gl.constexpr, PINGPONG: gl.constexpr,
                  P_SMEM: gl.constexpr, P_LAYOUT: gl.constexpr, Q_REGS: gl.constexpr,
                  O_TMA: gl.constexpr, LPT: gl.constexpr,
                  SCHEDULED: gl.constexpr, CONSUMER_REGS: gl.constexpr,
                  PRODUCER_REGS: gl.constexpr):
        # 1-D grid over tiles t = (b*H + h) * n_m + m; a CTA takes tiles
        # pid, pid + grid, ... (persistent when the grid is smaller than n_tiles)
        n_m = gl.cdiv(n_q, NC * ROWS)
        dtype: gl.constexpr = q_desc.dtype
        q_smem = gl.allocate_shared_memory(dtype, [NC, ROWS, HEAD_DIM], q_desc.layout)
        k_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], k_desc.layout)
        v_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], v_desc.layout)
        if P_SMEM:
            p_smem = gl.allocate_shared_memory(dtype, [NC, ROWS, BLOCK_N], P_LAYOUT)
        else:
            p_smem = q_smem  # unused: P stays in registers
        if O_TMA:
            o_smem = gl.allocate_shared_memory(dtype, [NC, ROWS, HEAD_DIM], o_desc.layout)
        else:
            o_smem = q_smem  # unused: O goes out with plain stores
        q_ready = gl.allocate_shared_memory(gl.int64, [NC, 1], mbarrier.MBarrierLayout())
        q_empty = gl.allocate_shared_memory(gl.int64, [NC, 1], mbarrier.MBarrierLayout())
        turn = gl.allocate_shared_memory(gl.int64, [NC, 1], mbarrier.MBarrierLayout())
        k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        v_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(NC):
            mbarrier.init(q_ready.index(i), count=1)
            mbarrier.init(q_empty.index(i), count=1)
            mbarrier.init(turn.index(i), count=1)
        for i in gl.static_range(STAGES):
            mbarrier.init(k_ready.index(i), count=1)
            mbarrier.init(v_ready.index(i), count=1)
            mbarrier.init(k_empty.index(i), count=NC)  # every consumer releases a slot
            mbarrier.init(v_empty.index(i), count=NC)

        # consumer 0 is the default partition (the launch's num_warps=4); the
        # others and the 1-warp producer are workers. (Gluon takes the partitions
        # as literal (function, arguments) pairs, hence the two spelled-out lists.)
        if NC == 2:
            gl.warp_specialize([
                (_fa3g_consumer, (q_smem, k_smem, v_smem, p_smem, o_smem, o_desc, q_ready, q_empty,
                                  k_ready, k_empty, v_ready, v_empty, turn, O, LSE, qk_scale, n_q,
                                  n_kv, causal_off,
                                  n_m, n_tiles, sched, sched_stride, 0, H, GROUP, HEAD_DIM, ROWS, NC,
                                  BLOCK_N, STAGES, CAUSAL, PINGPONG, P_SMEM, Q_REGS, O_TMA,
                                  LPT, SCHEDULED)),
                (_fa3g_consumer, (q_smem, k_smem, v_smem, p_smem, o_smem, o_desc, q_ready, q_empty,
                                  k_ready, k_empty, v_ready, v_empty, turn, O, LSE, qk_scale, n_q,
                                  n_kv, causal_off,
                                  n_m, n_tiles, sched, sched_stride, 1, H, GROUP, HEAD_DIM, ROWS, NC,
                                  BLOCK_N, STAGES, CAUSAL, PINGPONG, P_SMEM, Q_REGS, O_TMA,
                                  LPT, SCHEDULED)),
                (_fa3g_producer, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_ready, q_empty,
                                  k_ready, k_empty, v_ready, v_empty, n_q, n_kv, causal_off, n_m,
                                  n_tiles, sched, sched_stride, H, GROUP, ROWS, NC, BLOCK_N, STAGES,
                                  CAUSAL, LPT, SCHEDULED)),
            ], [4, 1], [CONSUMER_REGS, PRODUCER_REGS])
        else:
            gl.warp_specialize([
                (_fa3g_consumer, (q_smem, k_smem, v_smem, p_smem, o_smem, o_desc, q_ready, q_empty,
                                  k_ready, k_empty, v_ready, v_empty, turn, O, LSE, qk_scale, n_q,
                                  n_kv, causal_off,
                                  n_m, n_tiles, sched, sched_stride, 0, H, GROUP, HEAD_DIM, ROWS, NC,
                                  BLOCK_N, STAGES, CAUSAL, PINGPONG, P_SMEM, Q_REGS, O_TMA,
                                  LPT, SCHEDULED)),
                (_fa3g_consumer, (q_smem, k_smem, v_smem, p_smem, o_smem, o_desc, q_ready, q_empty,
                                  k_ready, k_empty, v_ready, v_empty, turn, O, LSE, qk_scale, n_q,
                                  n_kv, causal_off,
                                  n_m, n_tiles, sched, sched_stride, 1, H, GROUP, HEAD_DIM, ROWS, NC,
                                  BLOCK_N, STAGES, CAUSAL, PINGPONG, P_SMEM, Q_REGS, O_TMA,
                                  LPT, SCHEDULED)),
                (_fa3g_consumer, (q_smem, k_smem, v_smem, p_smem, o_smem, o_desc, q_ready, q_empty,
                                  k_ready, k_empty, v_ready, v_empty, turn, O, LSE, qk_scale, n_q,
                                  n_kv, causal_off,
                                  n_m, n_tiles, sched, sched_stride, 2, H, GROUP, HEAD_DIM, ROWS, NC,
                                  BLOCK_N, STAGES, CAUSAL, PINGPONG, P_SMEM, Q_REGS, O_TMA,
                                  LPT, SCHEDULED)),
                (_fa3g_producer, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_ready, q_empty,
                                  k_ready, k_empty, v_ready, v_empty, n_q, n_kv, causal_off, n_m,
                                  n_tiles, sched, sched_stride, H, GROUP, ROWS, NC, BLOCK_N, STAGES,
                                  CAUSAL, LPT, SCHEDULED)),
            ], [4, 4, 1], [CONSUMER_REGS, CONSUMER_REGS, PRODUCER_REGS])


def default_config(problem: AttentionProblem) -> TileConfig:
    """128 query rows (2 consumers x 64), block_n 128; 2 stages at D=128 (FA3's
    choice for hdim 128: Q 32 KB + 2 x 64 KB), 3 at D=64. Pingpong off: on the
    H100 the mbarrier-based turn-taking measured no gain (equal or up to a few
    % slower, kernels/NOTES.md); pass a TileConfig with pingpong=True for it."""
    stages = 2 if problem.head_dim > 64 else 3
    return TileConfig(block_m=BLOCK_M, block_n=128, num_warps=12, num_stages=stages, mma="wgmma",
                      consumer_warpgroups=CONSUMERS, pingpong=False)


def cfg_persistent(problem: AttentionProblem) -> bool:
    """One CTA per SM looping over tiles, causal too: with the tiles shared by
    list_schedule (cfg_balanced) a causal CTA loads its next tile while it
    finishes the current one, and the last rounds go heaviest first (B=16384/N,
    H=16, D=128: +4.2% at N=4096, +2.1% at 8192 over one tile per CTA,
    -1.6% at 16384; kernels/NOTES.md)."""
    return True


def cfg_lpt(problem: AttentionProblem) -> bool:
    """The causal grid's tile order: heaviest first over the whole grid (True)
    or per head (False)."""
    return False


def cfg_balanced(problem: AttentionProblem) -> bool:
    """Persistent CTAs take their tiles from the host's list schedule (True)
    or round-robin (False)."""
    return problem.causal


# A tile costs its K/V blocks plus about one block's worth of start and end
# (its Q load, the first S without a P V beside it, the epilogue). Only the
# schedule's balance depends on it.
TILE_OVERHEAD_BLOCKS = 1
# The last TAIL_ROUNDS x grid tiles go heaviest first. In head order the
# grid ends on the last heads' heavy tiles, and one CTA finishes up to 7%
# after the average (causal D=128, N 1k-8k, 132 SMs; 0.5-1% with the tail
# sorted). Their K/V, 64 KB a tile at D=128 (33 MB for 528 tiles), stays in
# the 50 MB L2, which heaviest first over the whole grid does not (NOTES.md).
TAIL_ROUNDS = 4


def tile_blocks(problem: AttentionProblem, block_n: int, block_m: int = BLOCK_M) -> list[int]:
    """K/V blocks of each Q tile position m of a head, in launch order
    (causal: heaviest first), as _fa3g_tile counts them."""
    n_m = cdiv(problem.seqlen_q, block_m)
    blocks = []
    for i in range(n_m):
        m = n_m - 1 - i if problem.causal else i
        n = cdiv(problem.seqlen_kv, block_n)
        if problem.causal:
            last_row = min((m + 1) * block_m, problem.seqlen_q) - 1
            n = min(n, cdiv(last_row + problem.causal_offset + 1, block_n))
        blocks.append(max(n, 1))
    return blocks


def tile_order(costs: list[int], workers: int) -> list[int]:
    """Tiles in launch order (head by head), but for the last TAIL_ROUNDS x
    workers, which go heaviest first."""
    tail = max(0, len(costs) - TAIL_ROUNDS * workers)
    return list(range(tail)) + sorted(range(tail, len(costs)), key=lambda t: -costs[t])


def list_schedule(costs: list[int], order: list[int], workers: int) -> list[list[int]]:
    """The tiles in `order`, each to the worker that frees first (ties: the
    lowest index): what the hardware's block scheduler does with a grid of
    one tile per CTA, decided ahead, so that a persistent CTA can load its
    next tile while it computes the current one. costs[t]: tile t's cost."""
    free = [(0, w) for w in range(workers)]
    out: list[list[int]] = [[] for _ in range(workers)]
    for t in order:
        load, w = heapq.heappop(free)
        out[w].append(t)
        heapq.heappush(free, (load + costs[t], w))
    return out


_TABLES: dict = {}


def _schedule_table(problem: AttentionProblem, block_m: int, block_n: int, grid: int,
                    device) -> torch.Tensor:
    """int32 [grid, 1 + most tiles]: a CTA's tile count, then its tiles
    (list_schedule of tile_order), -1 after; built once per shape and device."""
    key = (problem.batch * problem.heads, problem.seqlen_q, problem.seqlen_kv, problem.causal,
           problem.causal_offset, block_m, block_n, grid, str(device))
    table = _TABLES.get(key)
    if table is None:
        per_head = tile_blocks(problem, block_n, block_m)
        costs = [per_head[t % len(per_head)] + TILE_OVERHEAD_BLOCKS
                 for t in range(len(per_head) * problem.batch * problem.heads)]
        rows = list_schedule(costs, tile_order(costs, grid), grid)
        width = 1 + max(len(r) for r in rows)
        table = torch.full((grid, width), -1, dtype=torch.int32)
        for w, r in enumerate(rows):
            table[w, 0] = len(r)
            table[w, 1:1 + len(r)] = torch.tensor(r, dtype=torch.int32)
        table = _TABLES[key] = table.to(device)
    return table


_SMS = {}


def _sm_count(device) -> int:
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _SMS:
        _SMS[idx] = torch.cuda.get_device_properties(idx).multi_processor_count
    return _SMS[idx]


def cfg_q_regs(cfg: TileConfig) -> bool:
    """Q in registers (RS wgmma for Q Kᵀ) or read from SMEM every step. On with
    two consumers (kernels/NOTES.md, session 19: with o_tma, D=128 +2.7..+11%
    non-causal over neither); three consumers' 160 registers cannot hold it."""
    return cfg.consumer_warpgroups == 2


def cfg_o_tma(cfg: TileConfig, problem: AttentionProblem) -> bool:
    """O through SMEM and TMA stores, or plain stores from registers: the
    schedule's rule (algorithms.fa3.o_in_smem), TMA wherever the O buffers fit
    (fa3_gluon_otma_h100.csv: +1..+11% at D=128, N=2048-16384, +1..+9% at D=64)."""
    return o_in_smem(problem, cfg)


def _smem_needed(problem: AttentionProblem, cfg: TileConfig, p_smem: bool, o_tma: bool) -> int:
    """The schedule's count (algorithms/fa3.py), with P's and O's buffers as
    this launch places them."""
    smem = fa3_schedule.smem_bytes(problem, cfg)
    if p_smem != p_in_smem(cfg):
        smem += (1 if p_smem else -1) * fa3_schedule.p_buffer_bytes(problem, cfg)
    if o_tma != o_in_smem(problem, cfg):
        smem += (1 if o_tma else -1) * fa3_schedule.o_buffer_bytes(problem, cfg)
    return smem


def _placement(problem: AttentionProblem, cfg: TileConfig, p_smem, q_regs, o_tma) -> tuple:
    """(p_smem, q_regs, o_tma), each the caller's or its default, after _check."""
    p_smem = p_in_smem(cfg) if p_smem is None else bool(p_smem)
    q_regs = cfg_q_regs(cfg) if q_regs is None else bool(q_regs)
    o_tma = cfg_o_tma(cfg, problem) if o_tma is None else bool(o_tma)
    _check(problem, cfg, p_smem, o_tma)
    return p_smem, q_regs, o_tma


def _check(problem: AttentionProblem, cfg: TileConfig, p_smem: bool, o_tma: bool) -> None:
    if problem.head_dim not in (64, 128):
        raise InvalidProblem(f"fa3_gluon supports head_dim 64 and 128, got {problem.head_dim}")
    if cfg.consumer_warpgroups not in REGISTERS or \
            cfg.block_m != ROWS_PER_CONSUMER * cfg.consumer_warpgroups:
        raise InvalidConfig(f"fa3_gluon runs 2 or 3 consumer warpgroups of {ROWS_PER_CONSUMER} rows: "
                            f"block_m must be 128 with consumer_warpgroups 2, or 192 with 3; got "
                            f"{cfg.block_m} and {cfg.consumer_warpgroups}")
    if cfg.block_n not in (64, 128) or cfg.num_stages < 2:
        raise InvalidConfig(f"fa3_gluon needs block_n in (64, 128) and num_stages >= 2, got "
                            f"{cfg.block_n} and {cfg.num_stages}")
    smem = _smem_needed(problem, cfg, p_smem, o_tma)
    if smem > fa3_schedule.SMEM_PER_BLOCK_SM90:
        raise InvalidConfig(f"fa3_gluon: Q + {cfg.num_stages}-stage K/V ring"
                            f"{' + P' if p_smem else ''}{' + O' if o_tma else ''} need {smem} B "
                            f"of SMEM (> 227 KB); "
                            f"reduce num_stages or block_n")


def _require_hopper(device):
    if not HAVE_GLUON:
        raise UnsupportedAlgorithm("fa3_gluon needs triton.experimental.gluon (Triton >= 3.5)")
    require_hopper(device, "fa3_gluon", "TMA and wgmma; Gluon has no interpreter")


@functools.lru_cache(maxsize=None)
def _shared_layout(block: tuple, torch_dtype):
    gdt = {torch.bfloat16: gl.bfloat16, torch.float16: gl.float16}[torch_dtype]
    return gl.NVMMASharedLayout.get_default_for(list(block), gdt)


def _layout(block, torch_dtype):
    """The NVMMA shared layout of a [rows, cols] tile, made once per shape and
    dtype: forward runs on the host before every launch, and at N = 512 a
    launch's host work is about as long as the kernel (about 7 us a layout)."""
    return _shared_layout(tuple(block), torch_dtype)


# forward's host work but for the tensors' addresses (checks, config, P/O/Q
# placement, grid, schedule table, the kernel's constants), made once per
# launch signature. At N = 512 a call's host path took 0.13 ms on the H100
# against a 0.13-0.14 ms kernel (fa3_gluon_small_n_probe_h100.csv; cuDNN's
# 0.04), and kernels.bench's rounds came out bimodal where the GPU waited
# for it.
_PLANS: dict = {}
_PLANS_MAX = 256


@dataclass(frozen=True)
class _Plan:
    grid: tuple
    q_block: list          # Q's and O's TMA box, [rows, head_dim]
    kv_block: list
    q_layout: object       # their NVMMA shared layouts
    kv_layout: object
    o_tma: bool
    scalars: tuple         # qk_scale, n_q, n_kv, causal_off, n_tiles
    sched: torch.Tensor | None   # the balanced list schedule, or None
    constexprs: dict


def _constexprs(problem: AttentionProblem, cfg: TileConfig, torch_dtype, *, pingpong: bool, lpt: bool,
                scheduled: bool, p_smem: bool, q_regs: bool, o_tma: bool) -> dict:
    """_fa3g_fwd's constexpr arguments, for forward's launch and for
    compiled_info's cross-compile alike (so the build the probe reads is the
    one forward runs). P_LAYOUT is None unless P goes through SMEM (the
    kernel reads it only then)."""
    _, consumer_regs, producer_regs = REGISTERS[cfg.consumer_warpgroups]
    return dict(H=problem.heads, GROUP=problem.group_size, HEAD_DIM=problem.head_dim, ROWS=ROWS_PER_CONSUMER,
                NC=cfg.consumer_warpgroups, BLOCK_N=cfg.block_n, STAGES=cfg.num_stages, CAUSAL=problem.causal,
                PINGPONG=bool(pingpong), P_SMEM=p_smem,
                P_LAYOUT=_layout([ROWS_PER_CONSUMER, cfg.block_n], torch_dtype) if p_smem else None,
                Q_REGS=q_regs, O_TMA=o_tma, LPT=bool(lpt), SCHEDULED=bool(scheduled),
                CONSUMER_REGS=consumer_regs, PRODUCER_REGS=producer_regs)


def _plan_key(q, k, v, options: tuple):
    """What a plan depends on, or None where it cannot be a key (then forward
    plans afresh, and its checks say what is wrong with the arguments)."""
    if not all(isinstance(t, torch.Tensor) for t in (q, k, v)):
        return None
    sm_scale = options[2]
    if sm_scale is not None and type(sm_scale) not in (int, float):
        return None     # (a tensor would be keyed by identity, and could change)
    key = (q.shape, k.shape, v.shape, q.dtype, k.dtype, v.dtype, q.device, k.device, v.device,
           q.is_contiguous(), k.is_contiguous(), v.is_contiguous(), options)
    try:
        hash(key)
    except TypeError:
        return None
    return key


def _plan(q, k, v, causal, config, sm_scale, pingpong, persistent, lpt, balanced, p_smem, q_regs,
          o_tma) -> _Plan:
    problem = problem_of(q, k, v, causal)
    _require_hopper(q.device)
    cfg = config if config is not None else default_config(problem)
    if not isinstance(cfg, TileConfig):
        raise InvalidConfig(f"config must be an algorithms.problem.TileConfig, got {type(cfg).__name__}")
    p_smem, q_regs, o_tma = _placement(problem, cfg, p_smem, q_regs, o_tma)
    pp = cfg.pingpong if pingpong is None else bool(pingpong)
    scale = resolve_scale(sm_scale, problem.head_dim)
    b, h, nq, d = q.shape
    nkv = k.shape[2]
    n_tiles = cdiv(nq, cfg.block_m) * b * h
    persistent = cfg_persistent(problem) if persistent is None else bool(persistent)
    lpt = cfg_lpt(problem) if lpt is None else bool(lpt)
    if balanced is None:
        balanced = persistent and not lpt and cfg_balanced(problem)
    elif balanced and (not persistent or lpt):
        raise InvalidConfig("fa3_gluon: balanced=True is a persistent launch in head order; "
                            f"got persistent={persistent}, lpt={lpt}")
    grid = (min(n_tiles, _sm_count(q.device)) if persistent else n_tiles, )
    sched = _schedule_table(problem, cfg.block_m, cfg.block_n, grid[0], q.device) if balanced else None
    q_block, kv_block = [ROWS_PER_CONSUMER, d], [cfg.block_n, d]
    return _Plan(
        grid=grid, q_block=q_block, kv_block=kv_block, q_layout=_layout(q_block, q.dtype),
        kv_layout=_layout(kv_block, q.dtype), o_tma=o_tma,
        scalars=(scale * LOG2E, nq, nkv, problem.causal_offset, n_tiles),
        sched=sched,
        constexprs=dict(_constexprs(problem, cfg, q.dtype, pingpong=pp, lpt=lpt, scheduled=balanced,
                                    p_smem=p_smem, q_regs=q_regs, o_tma=o_tma),
                        num_warps=4, maxnreg=REGISTERS[cfg.consumer_warpgroups][0]))


def forward(q, k, v, *, causal=False, config: TileConfig | None = None, sm_scale=None,
            return_lse=False, pingpong=None, persistent=None, lpt=None, balanced=None,
            p_smem=None, q_regs=None, o_tma=None):
    """FA3 forward with explicit producer / consumer warp specialisation.
    Same contract as kernels.fa3.forward (q [B,H,Nq,D], k/v [B,KVH,Nkv,D];
    returns O, or (O, LSE) with return_lse). config: consumer_warpgroups 2
    with block_m 128, or 3 with block_m 192; block_n and num_stages are used;
    num_warps is not (the CTA always has its consumer warpgroups + a 1-warp
    producer). pingpong defaults to config.pingpong (default_config: False).
    p_smem: P through SMEM rather than registers (default: p_in_smem).
    q_regs: Q held in registers as the A operand of Q Kᵀ (default: cfg_q_regs).
    o_tma: O written through an SMEM buffer per consumer with TMA stores
    (default: cfg_o_tma), rather than stored from registers.
    persistent: one CTA per SM looping over the tiles (default: cfg_persistent,
    always), or one tile per CTA, which the hardware hands out as SMs free up
    (causal tiles differ in length; a static round-robin balances them worse
    than that, the list schedule of `balanced` better). lpt: causal tiles heaviest first over the whole grid,
    walked as a snake when persistent (default: cfg_lpt; _fa3g_tile says how).
    balanced: persistent CTAs take the tiles list_schedule gives them (head
    order, the last rounds heaviest first: tile_order) instead of every
    grid-th (default: cfg_balanced, when persistent and not lpt)."""
    # (the order of _plan's parameters)
    options = (bool(causal), config, sm_scale, pingpong, persistent, lpt, balanced, p_smem, q_regs, o_tma)
    key = _plan_key(q, k, v, options)
    plan = _PLANS.get(key) if key is not None else None
    if plan is None:
        plan = _plan(q, k, v, *options)
        if key is not None:
            if len(_PLANS) >= _PLANS_MAX:
                _PLANS.clear()
            _PLANS[key] = plan
    b, h, nq, d = q.shape
    kvh, nkv = k.shape[1], k.shape[2]
    o = torch.empty_like(q)
    lse = torch.empty(b, h, nq, dtype=torch.float32, device=q.device)
    q_desc = TensorDescriptor.from_tensor(q.view(b * h * nq, d), plan.q_block, plan.q_layout)
    k_desc = TensorDescriptor.from_tensor(k.view(b * kvh * nkv, d), plan.kv_block, plan.kv_layout)
    v_desc = TensorDescriptor.from_tensor(v.view(b * kvh * nkv, d), plan.kv_block, plan.kv_layout)
    o_desc = (TensorDescriptor.from_tensor(o.view(b * h * nq, d), plan.q_block, plan.q_layout)
              if plan.o_tma else q_desc)  # (unread without o_tma)
    sched = plan.sched if plan.sched is not None else lse  # (unread unless SCHEDULED)
    launch(_fa3g_fwd[plan.grid], q_desc, k_desc, v_desc, o_desc, o, lse, *plan.scalars, sched,
           sched.stride(0) if plan.sched is not None else 0, **plan.constexprs)
    return (o, lse) if return_lse else o


def compiled_info(problem: AttentionProblem, config: TileConfig | None = None, pingpong=True,
                  target=90, p_smem=None, q_regs=None, o_tma=None) -> dict:
    """Cross-compile _fa3g_fwd for sm_90 without a GPU (bundled ptxas):
    {"smem_bytes", "n_regs", "stack_bytes", "warp_specialized", "ttgir", "ptx",
    "issue_per_iter", "issue_per_iter_masked"} (stack_bytes: a thread's
    local-memory frame, where ptxas spills; the last two: the instructions
    a consumer warp issues per K/V step besides its wgmma, on an unmasked
    step and on a masked one -- the consumers' loop masks behind a branch,
    kernels/sass.py tensor_loop_paths --, the most over the consumers'
    copies of the loop; None without the bundled cuobjdump)."""
    from .common import interpreting
    from .fa2 import _compile_in_subprocess

    cfg = config or default_config(problem)
    if interpreting():
        # under TRITON_INTERPRET=1 the kernels' jit objects cannot be compiled:
        # compile in a clean child process instead
        return _compile_in_subprocess("kernels.fa3_gluon", problem, cfg, target, "compiled_info",
                                      pingpong=pingpong, p_smem=p_smem, q_regs=q_regs, o_tma=o_tma)
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    from . import sass

    p_smem, q_regs, o_tma = _placement(problem, cfg, p_smem, q_regs, o_tma)
    tdt = {"bf16": torch.bfloat16, "fp16": torch.float16}[problem.dtype]
    d = problem.head_dim

    def desc(block):
        return f"tensordesc<{problem.dtype}[{block[0]}, {block[1]}],{_layout(block, tdt)!r}>"

    pdt = "*" + problem.dtype
    sig = {"q_desc": desc([ROWS_PER_CONSUMER, d]), "k_desc": desc([cfg.block_n, d]),
           "v_desc": desc([cfg.block_n, d]), "o_desc": desc([ROWS_PER_CONSUMER, d]), "O": pdt, "LSE": "*fp32", "qk_scale": "fp32",
           "n_q": "i32", "n_kv": "i32", "causal_off": "i32", "n_tiles": "i32", "sched": "*i32",
           "sched_stride": "i32",
           **{name: "constexpr" for name in ("H", "GROUP", "HEAD_DIM", "ROWS", "NC", "BLOCK_N",
                                             "STAGES", "CAUSAL", "PINGPONG", "P_SMEM", "P_LAYOUT", "Q_REGS", "O_TMA",
                                             "LPT", "SCHEDULED", "CONSUMER_REGS",
                                             "PRODUCER_REGS")}}
    maxnreg = REGISTERS[cfg.consumer_warpgroups][0]
    # forward's defaults for the launch order (_plan: balanced when persistent and not lpt)
    lpt = cfg_lpt(problem)
    consts = _constexprs(problem, cfg, tdt, pingpong=pingpong, lpt=lpt,
                         scheduled=cfg_persistent(problem) and not lpt and cfg_balanced(problem),
                         p_smem=p_smem, q_regs=q_regs, o_tma=o_tma)
    attrs = launch_hints(sig, ("O", "LSE"), {})
    src = GluonASTSource(fn=_fa3g_fwd, signature=sig, constexprs=consts, attrs=attrs)
    compiled = triton.compile(src, target=GPUTarget("cuda", target, 32),
                              options={"num_warps": 4, "maxnreg": maxnreg})
    ttgir = compiled.asm.get("ttgir", "")
    res_usage = sass.cuobjdump(compiled, "-res-usage")
    stack = re.search(r"STACK:(\d+)", res_usage or "")
    paths = sass.tensor_loop_paths(sass.cuobjdump(compiled, "-sass"))
    return {"smem_bytes": int(compiled.metadata.shared), "n_regs": sass.registers(compiled, res_usage),
            "stack_bytes": int(stack.group(1)) if stack else None,
            "warp_specialized": "ttg.warp_specialize" in ttgir, "ttgir": ttgir,
            "ptx": compiled.asm.get("ptx", ""),
            "issue_per_iter": max((p["shortest"] for p in paths), default=None),
            "issue_per_iter_masked": max((p["longest"] for p in paths), default=None)}
