"""Standard (unfused) attention: three Triton launches, S and P through HBM.

Schedule (algorithms/standard.py replays exactly this):
  1. QKᵀ GEMM (_qk_gemm_rows), grid = (cdiv(Nq, BM), B*H) with BM = block_m:
     one CTA a row block of S loads its Q rows once and streams the head's K
     in blocks of BN = block_n through num_stages buffers, each step one
     product over the whole head dim, writing that tile of S = sm_scale · Q Kᵀ
     in the input dtype with masked stores. Every tile is computed, causal or
     not (as PyTorch's math path does); num_warps/num_stages from the config,
     block_k unused here. On the H100 1.19-1.23x its bound at D = 128, N =
     4096-16384, where one CTA a tile (_qk_gemm, reading a Q and a K tile from
     L2 for every tile of S) took 1.44-1.46x (experiments/qk_store_probe.py
     --variants rows). qk_rows=False launches the tiled kernel, its reduction
     over D in steps of min(block_k, D), with its options: tma_store (S through
     the TMA unit) and qk_programs (persistent CTAs), both measured slower.
  2. Row softmax, one program per row, grid = (B*H*Nq,), num_warps =
     algorithms.defaults.softmax_num_warps(Nkv): reads a whole S row, applies
     the causal mask there (bottom-right aligned: column c visible iff
     c <= r + Nkv - Nq), writes P = softmax(row) in the input dtype.
  3. PV GEMM, grid = (cdiv(Nq, BM) * cdiv(D, BD), B*H) with BD = min(D, 128);
     pid0 -> m = pid0 // cdiv(D, BD), n = pid0 % cdiv(D, BD); the reduction over
     Nkv runs in steps of block_k; writes O in the input dtype.
GQA: query head h reads K/V head h // (H // KVH). Tails are masked loads and
stores; padded tiles still run the full MMA. The LSE (return_lse) is computed
by the softmax kernel from the row it already holds.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from algorithms.defaults import softmax_num_warps
from algorithms.errors import InvalidConfig, InvalidProblem
from algorithms.problem import TileConfig, cdiv

from . import sass
from .common import (ensure_tma_allocator, launch, launch_hints, problem_of, require_hopper, resolve_config,
                     resolve_scale)


@triton.jit
def _qk_tile(Q, K, S, scale, n_q, n_kv, bh, pid_m, pid_n, H: tl.constexpr, GROUP: tl.constexpr,
             HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """Tile (pid_m, pid_n) of head bh's S = scale · Q Kᵀ in S's dtype, with its
    row and column offsets (the tiled and the persistent kernel share it)."""
    kvh = (bh // H) * (H // GROUP) + (bh % H) // GROUP
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    q_ptrs = Q + bh.to(tl.int64) * n_q * HEAD_DIM + offs_m[:, None] * HEAD_DIM + offs_k[None, :]
    k_ptrs = K + kvh.to(tl.int64) * n_kv * HEAD_DIM + offs_n[None, :] * HEAD_DIM + offs_k[:, None]
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for kk in range(0, HEAD_DIM // BLOCK_K):
        a = tl.load(q_ptrs + kk * BLOCK_K, mask=(offs_m < n_q)[:, None], other=0.0)
        b = tl.load(k_ptrs + kk * BLOCK_K, mask=(offs_n < n_kv)[None, :], other=0.0)
        acc = tl.dot(a, b, acc)
    return (acc * scale).to(S.dtype.element_ty), offs_m, offs_n


@triton.jit
def _store_s_tile(S, s, bh, offs_m, offs_n, n_q, n_kv):
    """A tile of S from registers, masked at the head's last row and column."""
    s_ptrs = S + bh.to(tl.int64) * n_q * n_kv + offs_m[:, None].to(tl.int64) * n_kv + offs_n[None, :]
    tl.store(s_ptrs, s, mask=(offs_m < n_q)[:, None] & (offs_n < n_kv)[None, :])


@triton.jit
def _qk_gemm(Q, K, S, scale, n_q, n_kv, n_bh, H: tl.constexpr, GROUP: tl.constexpr,
             HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
             BLOCK_K: tl.constexpr, TMA_STORE: tl.constexpr):
    pid = tl.program_id(0)
    bh = tl.program_id(1)
    n_tiles_n = tl.cdiv(n_kv, BLOCK_N)
    pid_m = pid // n_tiles_n
    pid_n = pid % n_tiles_n
    s, offs_m, offs_n = _qk_tile(Q, K, S, scale, n_q, n_kv, bh, pid_m, pid_n, H, GROUP, HEAD_DIM,
                                 BLOCK_M, BLOCK_N, BLOCK_K)
    if TMA_STORE:
        # S through the TMA unit: one bulk copy of the tile from SMEM, clipped
        # at the head's last row and column by the [B*H, Nq, Nkv] box
        desc = tl.make_tensor_descriptor(S, shape=[n_bh, n_q, n_kv], strides=[n_q * n_kv, n_kv, 1],
                                         block_shape=[1, BLOCK_M, BLOCK_N])
        desc.store([bh, pid_m * BLOCK_M, pid_n * BLOCK_N], s.reshape([1, BLOCK_M, BLOCK_N]))
    else:
        _store_s_tile(S, s, bh, offs_m, offs_n, n_q, n_kv)


@triton.jit
def _qk_gemm_persistent(Q, K, S, scale, n_q, n_kv, n_bh, H: tl.constexpr, GROUP: tl.constexpr,
                        HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                        BLOCK_K: tl.constexpr, PROGRAMS: tl.constexpr):
    # _qk_gemm's tiles in _qk_gemm's launch order (a head's tiles adjacent,
    # n fastest), PROGRAMS CTAs taking tiles pid, pid + PROGRAMS, ...: the
    # flattened loop lets the pipeliner load the next tile's Q and K while
    # this tile's S is still being stored.
    n_tiles_n = tl.cdiv(n_kv, BLOCK_N)
    per_head = tl.cdiv(n_q, BLOCK_M) * n_tiles_n
    for tile in tl.range(tl.program_id(0), per_head * n_bh, PROGRAMS, flatten=True):
        bh = tile // per_head
        pid_m = (tile % per_head) // n_tiles_n
        pid_n = (tile % per_head) % n_tiles_n
        s, offs_m, offs_n = _qk_tile(Q, K, S, scale, n_q, n_kv, bh, pid_m, pid_n, H, GROUP, HEAD_DIM,
                                     BLOCK_M, BLOCK_N, BLOCK_K)
        _store_s_tile(S, s, bh, offs_m, offs_n, n_q, n_kv)


@triton.jit
def _qk_gemm_rows(Q, K, S, scale, n_q, n_kv, H: tl.constexpr, GROUP: tl.constexpr,
                  HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    # One CTA a row block of S: Q's BLOCK_M rows loaded once, then the head's
    # K blocks streamed through the pipeline, an S tile written a step. The
    # tiled kernel reads a Q and a K tile from L2 for every S tile it writes
    # (64 KB for 32 KB at 128x128, D = 128); this one reads a K tile (and Q
    # once), about half of that.
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    kvh = (bh // H) * (H // GROUP) + (bh % H) // GROUP
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    rows_ok = offs_m < n_q
    q = tl.load(Q + bh.to(tl.int64) * n_q * HEAD_DIM + offs_m[:, None] * HEAD_DIM + offs_d[None, :],
                mask=rows_ok[:, None], other=0.0)
    k_head = K + kvh.to(tl.int64) * n_kv * HEAD_DIM
    s_rows = S + bh.to(tl.int64) * n_q * n_kv + offs_m[:, None].to(tl.int64) * n_kv
    for start_n in range(0, n_kv, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        cols_ok = offs_n < n_kv
        k = tl.load(k_head + offs_n[None, :] * HEAD_DIM + offs_d[:, None], mask=cols_ok[None, :], other=0.0)
        s = (tl.dot(q, k) * scale).to(S.dtype.element_ty)
        tl.store(s_rows + offs_n[None, :], s, mask=rows_ok[:, None] & cols_ok[None, :])


@triton.jit
def _row_softmax(S, P, LSE, n_q, n_kv, causal_off, CAUSAL: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    r = row % n_q
    cols = tl.arange(0, BLOCK)
    keep = cols < n_kv
    if CAUSAL:
        keep = keep & (cols <= r + causal_off)
    base = row.to(tl.int64) * n_kv
    s = tl.load(S + base + cols, mask=keep, other=float("-inf")).to(tl.float32)
    m = tl.max(s, 0)
    e = tl.exp(s - m)
    denom = tl.sum(e, 0)
    tl.store(P + base + cols, (e / denom).to(P.dtype.element_ty), mask=cols < n_kv)
    tl.store(LSE + row, m + tl.log(denom))


@triton.jit
def _pv_gemm(P, V, O, n_q, n_kv, H: tl.constexpr, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr,
             BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_K: tl.constexpr):
    pid = tl.program_id(0)
    bh = tl.program_id(1)
    n_tiles_d: tl.constexpr = HEAD_DIM // BLOCK_D
    pid_m = pid // n_tiles_d
    pid_d = pid % n_tiles_d
    kvh = (bh // H) * (H // GROUP) + (bh % H) // GROUP
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = pid_d * BLOCK_D + tl.arange(0, BLOCK_D)
    offs_k = tl.arange(0, BLOCK_K)
    p_ptrs = P + bh.to(tl.int64) * n_q * n_kv + offs_m[:, None].to(tl.int64) * n_kv + offs_k[None, :]
    v_ptrs = V + kvh.to(tl.int64) * n_kv * HEAD_DIM + offs_k[:, None] * HEAD_DIM + offs_d[None, :]
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    for kk in range(0, tl.cdiv(n_kv, BLOCK_K)):
        k_ok = kk * BLOCK_K + offs_k < n_kv
        a = tl.load(p_ptrs + kk * BLOCK_K, mask=(offs_m < n_q)[:, None] & k_ok[None, :], other=0.0)
        b = tl.load(v_ptrs + kk * BLOCK_K * HEAD_DIM, mask=k_ok[:, None], other=0.0)
        acc = tl.dot(a, b, acc)
    o_ptrs = O + bh.to(tl.int64) * n_q * HEAD_DIM + offs_m[:, None] * HEAD_DIM + offs_d[None, :]
    tl.store(o_ptrs, acc.to(O.dtype.element_ty), mask=(offs_m < n_q)[:, None])


def _plan(q, k, v, causal, config, sm_scale, tma_store, qk_programs=None, qk_rows=True):
    """The three launches on fresh S, P, O, LSE: (o, lse, s, p, [(name, fn,
    matmul_flops, hbm_bytes)]), bytes being the compulsory traffic (each
    tensor read or written once). qk_programs: run QKᵀ persistent on that
    many CTAs (_qk_gemm_persistent) instead of one CTA a tile."""
    problem = problem_of(q, k, v, causal)
    cfg = resolve_config("standard", problem, config, q.device)
    scale = resolve_scale(sm_scale, problem.head_dim)
    b, h, nq, d = q.shape
    nkv = k.shape[2]
    e = q.element_size()
    tma = bool(tma_store)
    if qk_rows and (tma or qk_programs is not None):
        raise InvalidConfig("tma_store and qk_programs are options of the tiled QKᵀ kernel: "
                            "pass qk_rows=False with them")
    if tma:
        require_hopper(q.device, "standard with tma_store=True", "TMA")
        if nkv % 8:
            raise InvalidProblem(f"tma_store=True needs N_kv a multiple of 8 (16-byte rows of S), "
                                 f"got {nkv}")
        ensure_tma_allocator()
    if qk_programs is not None and (tma or not isinstance(qk_programs, int) or qk_programs < 1):
        raise InvalidConfig(f"qk_programs must be a positive int of CTAs (and not with tma_store), "
                            f"got {qk_programs!r}")
    kw = dict(H=h, GROUP=problem.group_size, HEAD_DIM=d)
    s = torch.empty(b, h, nq, nkv, dtype=q.dtype, device=q.device)
    p = torch.empty_like(s)
    o = torch.empty_like(q)
    lse = torch.empty(b, h, nq, dtype=torch.float32, device=q.device)
    bk, bd = min(cfg.block_k, d), min(d, 128)
    g1 = (cdiv(nq, cfg.block_m) * cdiv(nkv, cfg.block_n), b * h)
    g3 = (cdiv(nq, cfg.block_m) * cdiv(d, bd), b * h)
    qkv_bytes = (q.numel() + k.numel()) * e
    sp_bytes = b * h * nq * nkv * e
    tiled = dict(BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=bk, num_warps=cfg.num_warps,
                 num_stages=cfg.num_stages, **kw)
    if qk_rows:
        def qk():
            return launch(_qk_gemm_rows[(cdiv(nq, cfg.block_m), b * h)], q, k, s, scale, nq, nkv,
                          BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, num_warps=cfg.num_warps,
                          num_stages=cfg.num_stages, **kw)
    elif qk_programs is None:
        def qk():
            return launch(_qk_gemm[g1], q, k, s, scale, nq, nkv, b * h, TMA_STORE=tma, **tiled)
    else:
        programs = min(qk_programs, g1[0] * g1[1])

        def qk():
            return launch(_qk_gemm_persistent[(programs,)], q, k, s, scale, nq, nkv, b * h,
                          PROGRAMS=programs, **tiled)
    parts = [
        ("qk_gemm", qk, 2.0 * b * h * nq * nkv * d, qkv_bytes + sp_bytes),
        ("row_softmax", lambda: launch(_row_softmax[(b * h * nq,)], s, p, lse, nq, nkv,
                                       problem.causal_offset, CAUSAL=problem.causal,
                                       BLOCK=triton.next_power_of_2(nkv),
                                       num_warps=softmax_num_warps(nkv)),
         0.0, 2 * sp_bytes + lse.numel() * 4),
        ("pv_gemm", lambda: launch(_pv_gemm[g3], p, v, o, nq, nkv, BLOCK_M=cfg.block_m, BLOCK_D=bd,
                                   BLOCK_K=cfg.block_k, num_warps=cfg.num_warps,
                                   num_stages=cfg.num_stages, **kw),
         2.0 * b * h * nq * nkv * d, sp_bytes + (v.numel() + o.numel()) * e),
    ]
    return o, lse, s, p, parts


def launches(q, k, v, *, causal=False, config: TileConfig | None = None, sm_scale=None,
             tma_store: bool = False, qk_programs: int | None = None, qk_rows: bool = True):
    """The three launches as separate zero-argument callables, for timing each
    against its own bound: [(name, fn, matmul_flops, hbm_bytes)]. qk_rows
    (the default): QKᵀ one CTA a row block of S, Q loaded once and K streamed
    (_qk_gemm_rows); False: one CTA a tile (_qk_gemm), with tma_store (write S
    through the TMA unit; Hopper, Nkv a multiple of 8) or qk_programs (a
    persistent kernel on that many CTAs), each measured slower on the H100
    (experiments/qk_store_probe.py)."""
    return _plan(q, k, v, causal, config, sm_scale, tma_store, qk_programs, qk_rows)[-1]


def forward(q, k, v, *, causal=False, config: TileConfig | None = None, sm_scale=None,
            return_lse=False, keep_intermediates=False, tma_store: bool = False,
            qk_programs: int | None = None, qk_rows: bool = True):
    """Unfused attention in three launches. Same contract as kernels.fa2.forward;
    keep_intermediates=True also returns (S, P) for inspection; qk_programs
    and qk_rows as launches()."""
    o, lse, s, p, parts = _plan(q, k, v, causal, config, sm_scale, tma_store, qk_programs, qk_rows)
    for _, fn, _, _ in parts:
        fn()
    out = (o, lse) if return_lse else o
    if keep_intermediates:
        return out, (s, p)
    return out


def compiled_resources(problem: AttentionProblem, config: TileConfig, target=(90,)) -> dict:
    """Cross-compile the QKᵀ kernel standard launches (_qk_gemm_rows) for
    `target` without a GPU: {"smem_bytes": metadata.shared, "n_regs":
    registers per thread from ptxas, its loop's register spills and the
    instructions a warp issues per trip (kernels/sass.py)}. algorithms/standard.py
    reads them back through experiments/results/triton_smem_standard_qk.csv."""
    from .common import interpreting

    if interpreting():
        from .fa2 import _compile_in_subprocess
        return _compile_in_subprocess("kernels.standard", problem, config, target)
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    dt = {"bf16": "*bf16", "fp16": "*fp16"}[problem.dtype]
    sig = {"Q": dt, "K": dt, "S": dt, "scale": "fp32", "n_q": "i32", "n_kv": "i32",
           "H": "constexpr", "GROUP": "constexpr", "HEAD_DIM": "constexpr",
           "BLOCK_M": "constexpr", "BLOCK_N": "constexpr"}
    consts = {"H": problem.heads, "GROUP": problem.group_size, "HEAD_DIM": problem.head_dim,
              "BLOCK_M": config.block_m, "BLOCK_N": config.block_n}
    attrs = launch_hints(sig, ("Q", "K", "S"), {"n_q": problem.seqlen_q, "n_kv": problem.seqlen_kv})
    cap = target[0] if isinstance(target, (tuple, list)) else int(target)
    compiled = triton.compile(ASTSource(fn=_qk_gemm_rows, signature=sig, constexprs=consts, attrs=attrs),
                              target=GPUTarget("cuda", cap, 32),
                              options={"num_warps": config.num_warps, "num_stages": config.num_stages})
    res_usage, listing = sass.cuobjdump(compiled, "-res-usage"), sass.cuobjdump(compiled, "-sass")
    return {"smem_bytes": int(compiled.metadata.shared), "n_regs": sass.registers(compiled, res_usage),
            **sass.loop_spills(listing, res_usage), **sass.loop_issue_slots(listing)}
