"""FlashAttention-2 forward (arXiv 2307.08691) in Triton.

Schedule (algorithms/fa2.py replays exactly this order):
  grid = (cdiv(Nq, BM), B*H); program_id(0) = Q block i (fastest in launch
  order, so the CTAs of one head run together and share its K/V through L2),
  program_id(1) = b*H + h; K/V head = h // (H // KVH) (GQA/MQA).
  1. load Q_i [BM, D] once (plain loads);
  2. for j in 0 .. T-1, T = cdiv(Nkv, BN), or under causal
     T = min(cdiv(Nkv, BN), cdiv(last_row + Nkv - Nq + 1, BN)) with
     last_row = min((i+1)*BM, Nq) - 1 (blocks fully above the diagonal skipped):
       load K_j, V_j [BN, D] (plain tl.load; Triton pipelines them with
       cp.async over num_stages buffers), S = Q_i K_jᵀ, online softmax in the
       base-2 domain with sm_scale·log2(e) folded into one multiply, O += P V_j;
  3. write O_i (input dtype) once, and LSE_i (fp32, natural log).
Causal masking is bottom-right aligned: row r sees column c iff
c <= r + Nkv - Nq. The loop is split in two without changing the order:
blocks 0 .. n_full-1 need no mask (every row of the block sees every column,
and the block lies inside Nkv); blocks n_full .. T-1 (the diagonal blocks and
the Nkv tail) apply the mask. Padded tiles still run the full MMA.
No TMA here: that is fa3's difference.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from algorithms.problem import AttentionProblem, TileConfig, cdiv

from . import sass
from .clocks import global_timer, sm_clock, sm_id
from .common import LOG2E, launch, launch_hints, problem_of, resolve_config, resolve_scale
from .online_softmax import kv_block_range, mask_scores, softmax_update, store_output


@triton.jit
def _fa2_block(acc, l_i, m_i, q, k_ptrs, v_ptrs, start_n, offs_m, offs_n, n_kv, causal_off,
               qk_scale, MASKED: tl.constexpr, CAUSAL: tl.constexpr, HEAD_DIM: tl.constexpr,
               STAMPS=None, S_SLOT: tl.constexpr = 0, STRIDE: tl.constexpr = 0):
    cols = start_n + offs_n
    if MASKED:
        kv_ok = (cols < n_kv)[:, None]
        k = tl.load(k_ptrs, mask=kv_ok, other=0.0)
    else:
        k = tl.load(k_ptrs)
    qk = tl.dot(q, tl.trans(k))
    if S_SLOT:      # diagnostics: the global timer once the first S block exists (start_n 0)
        if start_n == 0:
            qk = _stamp_before_use(STAMPS, qk, S_SLOT, STRIDE)
    if MASKED:
        qk = mask_scores(qk, cols, offs_m, n_kv, causal_off, CAUSAL)
    p, alpha, l_i, m_new = softmax_update(qk, m_i, l_i, qk_scale)
    acc = acc * alpha[:, None]
    if MASKED:
        v = tl.load(v_ptrs, mask=kv_ok, other=0.0)
    else:
        v = tl.load(v_ptrs)
    acc = tl.dot(p.to(v.dtype), v, acc)
    return acc, l_i, m_new


# int64 slots a CTA fills with stamps=: the global timer at its start, after
# its K/V loop and at its end, its SM, and its SM's clock64 at start and end;
# a stamps tensor wider by STEP_STAMPS + 1 also takes the global timer as each
# of the CTA's first STEP_STAMPS K/V steps has its row sums (its softmax done)
# and, in the slot after them, as its Q block has arrived in registers; one
# wider by STEP_STAMPS + 2 also, in its last slot, as its first S = Q Kᵀ
# block exists (its first K block in, the product done; its softmax waits
# for the stamp) (ARRIVAL_STAMPS: how many of those arrival slots a width holds)
STAMP_SLOTS = 6
STEP_STAMPS = 16
ARRIVAL_STAMPS = {STAMP_SLOTS + STEP_STAMPS + 1: 1, STAMP_SLOTS + STEP_STAMPS + 2: 2}
_STAMP_SLOTS = tl.constexpr(STAMP_SLOTS)


@triton.jit
def _stamp(STAMPS, slot, value, BLOCK_M: tl.constexpr, STRIDE: tl.constexpr = _STAMP_SLOTS):
    """Diagnostics (experiments/fa2_stamps.py): STAMPS[cta, slot] = value (of row 0)."""
    cta = tl.program_id(1) * tl.num_programs(0) + tl.program_id(0)
    rows = tl.arange(0, BLOCK_M)
    tl.store(STAMPS + cta * STRIDE + slot + rows * 0, value.to(tl.int64), mask=rows == 0)


@triton.jit
def _stamp_step(STAMPS, j, l_i, BLOCK_M: tl.constexpr, STEPS: tl.constexpr, STRIDE: tl.constexpr):
    """Diagnostics: STAMPS[cta, STAMP_SLOTS + j] = the global timer once step
    j's row sums `l_i` exist, for the first STEPS steps."""
    if j < STEPS:
        _stamp(STAMPS, _STAMP_SLOTS + j, global_timer(l_i.to(tl.int32, bitcast=True)), BLOCK_M, STRIDE)


@triton.jit
def _stamp_arrival(STAMPS, tile, slot: tl.constexpr, STRIDE: tl.constexpr):
    """Diagnostics: STAMPS[cta, slot] = the global timer once `tile` (a block
    of rows) has arrived (a row sum of it computed); returns the timer."""
    arrived = tl.sum(tile.to(tl.float32), 1).to(tl.int32, bitcast=True)
    timer = global_timer(arrived)
    _stamp(STAMPS, slot, timer, tile.shape[0], STRIDE)
    return timer


@triton.jit
def _stamp_before_use(STAMPS, tile, slot: tl.constexpr, STRIDE: tl.constexpr):
    """_stamp_arrival of an fp32 `tile`, returned plus a zero computed from
    the timer (its sign bit: the timer counts ns from 0), so that whatever
    uses it waits for the timer's read: the compiler would otherwise read it
    where it likes (a row sum of the first K block, tried, was read after the
    step's P V product)."""
    timer = _stamp_arrival(STAMPS, tile, slot, STRIDE)
    return tile + (timer >> 63).to(tl.float32)[:, None]


@triton.jit
def _stamp_cta(STAMPS, started, looped, started_clk, after, offs_m, BLOCK_M: tl.constexpr,
               LOOPED: tl.constexpr = True, STRIDE: tl.constexpr = _STAMP_SLOTS):
    """Diagnostics: the CTA's STAMP_SLOTS, its end read once `after` (int32) is
    computed: the global timer at its start, at its loop's end (`looped`; its
    end where the kernel has no such mark, LOOPED False) and at its end, its
    SM, and its SM's clock64 at its start and end (in rows of STRIDE slots)."""
    ended = global_timer(after)
    ended_clk = sm_clock(after)
    _stamp(STAMPS, 0, started, BLOCK_M, STRIDE)
    if LOOPED:
        _stamp(STAMPS, 1, looped, BLOCK_M, STRIDE)
    else:
        _stamp(STAMPS, 1, ended, BLOCK_M, STRIDE)
    _stamp(STAMPS, 2, ended, BLOCK_M, STRIDE)
    _stamp(STAMPS, 3, sm_id(offs_m), BLOCK_M, STRIDE)
    _stamp(STAMPS, 4, started_clk, BLOCK_M, STRIDE)
    _stamp(STAMPS, 5, ended_clk, BLOCK_M, STRIDE)


@triton.jit
def _fa2_fwd(Q, K, V, O, LSE, qk_scale, n_q, n_kv, causal_off, STAMPS,
             H: tl.constexpr, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr,
             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
             STAMPED: tl.constexpr = False, STEPS_STAMPED: tl.constexpr = 0,
             S_SLOT: tl.constexpr = 0, STAMP_STRIDE: tl.constexpr = _STAMP_SLOTS):
    # STAMPED (diagnostics only; compiled out otherwise): the global timer at
    # the CTA's start, after its K/V loop and at its end, its SM, and the
    # SM's cycle counter at its start and end (its clock: cycles over ns), in
    # rows of STAMP_STRIDE slots; STEPS_STAMPED and S_SLOT (the slot of the
    # first S block's existence, 0: none; a cross-compile that does not pass
    # it leaves it None, so tests of it are truthiness tests): see STAMP_SLOTS
    if STAMPED:
        started = global_timer(tl.zeros([BLOCK_M], dtype=tl.int32) + tl.program_id(0))
        started_clk = sm_clock(tl.zeros([BLOCK_M], dtype=tl.int32) + tl.program_id(0))
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    kvh = b * (H // GROUP) + h // GROUP
    q_base = bh.to(tl.int64) * n_q * HEAD_DIM
    kv_base = kvh.to(tl.int64) * n_kv * HEAD_DIM

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    row_ok = (offs_m < n_q)[:, None]
    q = tl.load(Q + q_base + offs_m[:, None] * HEAD_DIM + offs_d[None, :], mask=row_ok, other=0.0)
    if STEPS_STAMPED:
        _stamp_arrival(STAMPS, q, _STAMP_SLOTS + STEPS_STAMPED, STAMP_STRIDE)
    k_ptrs = K + kv_base + offs_n[:, None] * HEAD_DIM + offs_d[None, :]
    v_ptrs = V + kv_base + offs_n[:, None] * HEAD_DIM + offs_d[None, :]

    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)

    n_full, n_blocks = kv_block_range(pid_m, n_q, n_kv, causal_off, BLOCK_M, BLOCK_N, CAUSAL)

    for j in range(0, n_full):
        acc, l_i, m_i = _fa2_block(acc, l_i, m_i, q, k_ptrs + j * BLOCK_N * HEAD_DIM,
                                   v_ptrs + j * BLOCK_N * HEAD_DIM, j * BLOCK_N, offs_m, offs_n,
                                   n_kv, causal_off, qk_scale, False, CAUSAL, HEAD_DIM,
                                   STAMPS, S_SLOT, STAMP_STRIDE)
        if STEPS_STAMPED:
            _stamp_step(STAMPS, j, l_i, BLOCK_M, STEPS_STAMPED, STAMP_STRIDE)
    for j in range(n_full, n_blocks):
        acc, l_i, m_i = _fa2_block(acc, l_i, m_i, q, k_ptrs + j * BLOCK_N * HEAD_DIM,
                                   v_ptrs + j * BLOCK_N * HEAD_DIM, j * BLOCK_N, offs_m, offs_n,
                                   n_kv, causal_off, qk_scale, True, CAUSAL, HEAD_DIM,
                                   STAMPS, S_SLOT, STAMP_STRIDE)
        if STEPS_STAMPED:
            _stamp_step(STAMPS, j, l_i, BLOCK_M, STEPS_STAMPED, STAMP_STRIDE)

    if STAMPED:
        # read once the last block's row sums exist (its P·V product may still run)
        looped = global_timer(l_i.to(tl.int32, bitcast=True))
    store_output(O, LSE, bh, n_q, offs_m, acc, l_i, m_i, HEAD_DIM)
    if STAMPED:
        _stamp_cta(STAMPS, started, looped, started_clk, l_i.to(tl.int32, bitcast=True), offs_m, BLOCK_M,
                   True, STAMP_STRIDE)


def kernel_arguments(problem: AttentionProblem, q, k, v, o, lse, scale: float, stamps=None):
    """_fa2_fwd's arguments but the tile config's (BLOCK_M, BLOCK_N, warps,
    stages), as (args, kwargs): forward() launches with them, and so does
    experiments/autotune_prune.py's triton.autotune around the same kernel."""
    args = (q, k, v, o, lse, scale * LOG2E, problem.seqlen_q, problem.seqlen_kv,
            problem.causal_offset, stamps if stamps is not None else lse)
    arrivals = 0 if stamps is None else ARRIVAL_STAMPS.get(stamps.shape[1], 0)
    kwargs = dict(H=problem.heads, GROUP=problem.group_size, HEAD_DIM=problem.head_dim,
                  CAUSAL=problem.causal, STAMPED=stamps is not None,
                  STEPS_STAMPED=STEP_STAMPS if arrivals else 0,
                  S_SLOT=STAMP_SLOTS + STEP_STAMPS + 1 if arrivals == 2 else 0,
                  STAMP_STRIDE=STAMP_SLOTS if stamps is None else stamps.shape[1])
    return args, kwargs


def forward(q, k, v, *, causal=False, config: TileConfig | None = None, sm_scale=None,
            return_lse=False, stamps=None):
    """O = softmax(scale·QKᵀ [causal mask]) V with FlashAttention-2's schedule.

    q [B,H,Nq,D], k/v [B,KVH,Nkv,D] contiguous bf16/fp16. Returns O in q's
    dtype, and LSE [B,H,Nq] fp32 (natural log) when return_lse. `stamps`, an
    int64 tensor [CTAs, STAMP_SLOTS] (diagnostics), receives per CTA in launch
    order the global timer (ns) at start, after the K/V loop and at the end,
    its SM, and its SM's clock64 at start and end; [CTAs, STAMP_SLOTS +
    STEP_STAMPS + 1] also the global timer as each of its first STEP_STAMPS
    K/V steps has its row sums, and as its Q block has arrived; [CTAs,
    STAMP_SLOTS + STEP_STAMPS + 2] also as its first S = Q Kᵀ block exists."""
    problem = problem_of(q, k, v, causal)
    cfg = resolve_config("fa2", problem, config, q.device)
    scale = resolve_scale(sm_scale, problem.head_dim)
    o = torch.empty_like(q)
    lse = torch.empty(q.shape[:3], dtype=torch.float32, device=q.device)
    grid = (cdiv(problem.seqlen_q, cfg.block_m), problem.batch * problem.heads)
    widths = (STAMP_SLOTS, *ARRIVAL_STAMPS)
    if stamps is not None and (stamps.dim() != 2 or stamps.shape[0] != grid[0] * grid[1]
                               or stamps.shape[1] not in widths
                               or stamps.dtype != torch.int64 or stamps.device != q.device):
        raise ValueError(f"stamps must be an int64 tensor of shape ({grid[0] * grid[1]}, W) (CTAs, stamp "
                         f"slots), W one of {', '.join(map(str, widths))}, on {q.device}; got {stamps.dtype} "
                         f"{tuple(stamps.shape)} on {stamps.device}")
    args, kwargs = kernel_arguments(problem, q, k, v, o, lse, scale, stamps)
    launch(_fa2_fwd[grid], *args, **kwargs, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
           num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    return (o, lse) if return_lse else o


def compiled_resources(problem: AttentionProblem, config: TileConfig, target=(90,)) -> dict:
    """Cross-compile the fa2 kernel for `target` (compute capability, e.g.
    (90,) for H100) without a GPU and report what Triton allocates:
    {"smem_bytes": metadata.shared, "n_regs": registers per thread from ptxas
    (None if unavailable), the wgmma mix from the PTX (_wgmma_mix), the hot
    loop's register spill traffic, the instructions a warp issues per trip
    of the unmasked and the masked loop and the stall clocks ptxas scheduled
    into the code outside them, and "loop_parts": per tensor loop, a trip's
    instructions, stall clocks and MUFUs, from the SASS (kernels/sass.py)}."""
    from .common import interpreting

    if interpreting():
        # under TRITON_INTERPRET=1 @triton.jit gives interpreter objects that
        # cannot be compiled: compile in a clean child process instead
        return _compile_in_subprocess("kernels.fa2", problem, config, target)
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    dt = {"bf16": "*bf16", "fp16": "*fp16"}[problem.dtype]
    sig = {"Q": dt, "K": dt, "V": dt, "O": dt, "LSE": "*fp32", "qk_scale": "fp32",
           "n_q": "i32", "n_kv": "i32", "causal_off": "i32", "STAMPS": "*fp32",
           "H": "constexpr", "GROUP": "constexpr", "HEAD_DIM": "constexpr",
           "BLOCK_M": "constexpr", "BLOCK_N": "constexpr", "CAUSAL": "constexpr"}
    consts = {"H": problem.heads, "GROUP": problem.group_size, "HEAD_DIM": problem.head_dim,
              "BLOCK_M": config.block_m, "BLOCK_N": config.block_n, "CAUSAL": problem.causal}
    attrs = launch_hints(sig, ("Q", "K", "V", "O", "LSE"),
                         {"n_q": problem.seqlen_q, "n_kv": problem.seqlen_kv, "causal_off": problem.causal_offset})
    src = ASTSource(fn=_fa2_fwd, signature=sig, constexprs=consts, attrs=attrs)
    cap = target[0] if isinstance(target, (tuple, list)) else int(target)
    compiled = triton.compile(src, target=GPUTarget("cuda", cap, 32),
                              options={"num_warps": config.num_warps,
                                       "num_stages": config.num_stages})
    res_usage, listing = sass.cuobjdump(compiled, "-res-usage"), sass.cuobjdump(compiled, "-sass")
    return {"smem_bytes": int(compiled.metadata.shared), "n_regs": sass.registers(compiled, res_usage),
            **_wgmma_mix(compiled.asm.get("ptx", "")), **sass.loop_spills(listing, res_usage),
            **sass.loop_issue_slots(listing), **sass.outside_stalls(listing),
            "loop_parts": sass.tensor_loop_parts(listing)}


def _wgmma_mix(ptx: str) -> dict:
    """The wgmma instructions the kernel issues, from its PTX: the N of the ones
    reading A from SMEM (Q Kᵀ) and from registers (P V), and how many of each a
    thread issues per loop iteration (the kernel body holds two copies of the
    loop, unmasked and masked, so totals are halved). Empty before sm_90."""
    import re

    ss, rs = [], []
    for line in ptx.splitlines():
        m = re.search(r"wgmma\.mma_async\S*\.m64n(\d+)k\d+", line)
        if m:
            # A from registers is a {...} register list right after the accumulator list
            (rs if re.search(r"\},\s*\{", line) else ss).append(int(m.group(1)))
    if not ss:
        return {}
    return {"qk_instr_n": max(ss), "pv_instr_n": max(rs) if rs else None,
            "qk_instrs_per_iter": len(ss) // 2, "pv_instrs_per_iter": len(rs) // 2}


def _compile_in_subprocess(module, problem, config, target, function="compiled_resources", **kwargs):
    """`module`.`function`(problem, config, target=..., **kwargs) in a child
    process without TRITON_INTERPRET (kwargs: JSON values); its dict less
    "ttgir"."""
    import dataclasses
    import json
    import os
    import subprocess
    import sys

    code = ("import json, sys; from algorithms.problem import AttentionProblem, TileConfig; "
            f"from {module} import {function} as f; a = json.loads(sys.argv[1]); "
            "t = a['t'] if isinstance(a['t'], int) else tuple(a['t']); "
            "r = f(AttentionProblem(**a['p']), TileConfig(**a['c']), target=t, **a['k']); "
            "print(json.dumps({k: v for k, v in r.items() if k != 'ttgir'}))")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    arg = json.dumps({"p": dataclasses.asdict(problem), "c": dataclasses.asdict(config),
                      "t": list(target) if isinstance(target, (tuple, list)) else int(target),
                      "k": kwargs})
    out = subprocess.run([sys.executable, "-c", code, arg], capture_output=True, text=True, env=env,
                         check=True).stdout
    return json.loads(out.strip().splitlines()[-1])
