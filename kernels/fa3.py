"""FlashAttention-3-style forward (arXiv 2407.08608) for Hopper (sm_90) in Triton.

Schedule: the grid and loop order of
fa2 -- grid = (cdiv(Nq, BM), B*H), program_id(0) = Q block i, program_id(1) =
b*H + h, K/V head h // (H // KVH); Q_i loaded once; for j in 0 .. T-1 (causal:
T = min(cdiv(Nkv, BN), cdiv(last_row + Nkv - Nq + 1, BN))) S = Q_i K_jᵀ,
online softmax (exp2, folded scale), O += P V_j; O_i and LSE_i written once.
What differs from fa2 is how K_j/V_j arrive and who does what:
  * K/V (and Q) come through TMA tensor descriptors built on the device
    (tl.make_tensor_descriptor over the [B*KVH*Nkv, D] view) into a
    num_stages-deep SMEM ring guarded by mbarriers;
  * the unmasked part of the loop is a tl.range(..., warp_specialize=...)
    loop, asking Triton for a producer partition that issues the TMA loads and
    consumer warps that run wgmma and the softmax. Triton 3.6 builds none on
    sm_90 (kernels/NOTES.md): every warp computes, as in fa2, and
    algorithms/fa3_triton.py replays that build (FA3's own schedule,
    algorithms/fa3.py, is what kernels/fa3_gluon.py runs);
  * the diagonal / tail blocks (n_full .. T-1) run in a second, masked loop.
Rows of the flattened view past a head's Nkv belong to the next head (or are
zero-filled by TMA at the end of the tensor); they are masked to -inf in S, so
P is 0 there. O is stored with masked plain stores so a tail tile never
writes into the next head's rows.

forward_fp8: e4m3 Q, K, V with one fp32 scale per (batch, head, row block)
(block_m rows for Q, block_n rows for K and V); S is descaled by q_scale·k_scale,
P is rounded to e4m3 (it lies in [0, 1]) and P·V_j is descaled by v_scale_j,
folded into the accumulator's rescale: the accumulator holds O in units of the
last V scale (acc·alpha·v_scale_{j-1}/v_scale_j + P·V_j), so each P·V_j adds
into it asynchronously as in the bf16 loop, and the loops are the bf16 ones
(unmasked blocks, then the masked ones). V scales must be non-zero
(quantize_fp8's are at least 1e-12 / 448).
wgmma needs both fp8 operands K-major, so V is stored transposed
([B, KVH, D, Nkv]) by quantize_fp8 -- FA3 transposes V in the kernel instead.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from algorithms.defaults import fa3_triton_warps
from algorithms.errors import InvalidProblem
from algorithms.problem import AttentionProblem, TileConfig, cdiv

from .common import (LOG2E, ensure_tma_allocator, launch, launch_hints, problem_of, require_hopper, resolve_config,
                     resolve_scale)
from .clocks import global_timer, sm_clock
from .fa2 import STAMP_SLOTS, _stamp_cta
from .online_softmax import kv_block_range, mask_scores, softmax_update, store_output

FP8 = getattr(torch, "float8_e4m3fn", None)
FP8_MAX = 448.0  # largest finite e4m3fn value


@triton.jit
def _fa3_block(acc, l_i, m_i, q, desc_k, desc_v, kv_row0, start_n, offs_m, offs_n, n_kv,
               causal_off, qk_scale, MASKED: tl.constexpr, CAUSAL: tl.constexpr):
    k = desc_k.load([kv_row0 + start_n, 0])
    qk = tl.dot(q, k.T)
    if MASKED:
        qk = mask_scores(qk, start_n + offs_n, offs_m, n_kv, causal_off, CAUSAL)
    p, alpha, l_i, m_new = softmax_update(qk, m_i, l_i, qk_scale)
    acc = acc * alpha[:, None]
    v = desc_v.load([kv_row0 + start_n, 0])
    acc = tl.dot(p.to(v.dtype), v, acc)
    return acc, l_i, m_new


@triton.jit
def _fa3_fwd(Q, K, V, O, LSE, qk_scale, n_q, n_kv, causal_off, n_q_rows, n_kv_rows,
             H: tl.constexpr, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr,
             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
             WARP_SPEC: tl.constexpr):
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    kvh = b * (H // GROUP) + h // GROUP
    desc_q = tl.make_tensor_descriptor(Q, shape=[n_q_rows, HEAD_DIM], strides=[HEAD_DIM, 1],
                                       block_shape=[BLOCK_M, HEAD_DIM])
    desc_k = tl.make_tensor_descriptor(K, shape=[n_kv_rows, HEAD_DIM], strides=[HEAD_DIM, 1],
                                       block_shape=[BLOCK_N, HEAD_DIM])
    desc_v = tl.make_tensor_descriptor(V, shape=[n_kv_rows, HEAD_DIM], strides=[HEAD_DIM, 1],
                                       block_shape=[BLOCK_N, HEAD_DIM])
    q_row0 = bh * n_q
    kv_row0 = kvh * n_kv
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    q = desc_q.load([q_row0 + pid_m * BLOCK_M, 0])

    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    n_full, n_blocks = kv_block_range(pid_m, n_q, n_kv, causal_off, BLOCK_M, BLOCK_N, CAUSAL)

    for j in tl.range(0, n_full, warp_specialize=WARP_SPEC):
        acc, l_i, m_i = _fa3_block(acc, l_i, m_i, q, desc_k, desc_v, kv_row0, j * BLOCK_N, offs_m,
                                   offs_n, n_kv, causal_off, qk_scale, False, CAUSAL)
    for j in range(n_full, n_blocks):
        acc, l_i, m_i = _fa3_block(acc, l_i, m_i, q, desc_k, desc_v, kv_row0, j * BLOCK_N, offs_m,
                                   offs_n, n_kv, causal_off, qk_scale, True, CAUSAL)

    store_output(O, LSE, bh, n_q, offs_m, acc, l_i, m_i, HEAD_DIM)


@triton.jit
def _fa3_fp8_block(acc, l_i, m_i, c_i, q, q_scale, desc_k, desc_vt, KS, VS, kv_row0, vt_row0, blk0, j,
                   offs_m, offs_n, n_kv, causal_off, BLOCK_N: tl.constexpr, MASKED: tl.constexpr,
                   CAUSAL: tl.constexpr):
    # S descaled before the softmax step, which holds for scales of any sign
    k = desc_k.load([kv_row0 + j * BLOCK_N, 0])
    qk = tl.dot(q, k.T) * (q_scale * tl.load(KS + blk0 + j))
    if MASKED:
        qk = mask_scores(qk, j * BLOCK_N + offs_n, offs_m, n_kv, causal_off, CAUSAL)
    p, alpha, l_i, m_new = softmax_update(qk, m_i, l_i, 1.0)
    # O = c·acc: the accumulator holds O in units of the last block's V scale,
    # so P·V_j adds into it as it comes out of the tensor cores (no wait for
    # the product to descale it, one more factor in the rescale a row)
    v_scale = tl.load(VS + blk0 + j)
    acc = acc * (alpha * (c_i / v_scale))[:, None]
    vt = desc_vt.load([vt_row0, j * BLOCK_N])
    acc = tl.dot(p.to(vt.dtype), vt.T, acc)
    return acc, l_i, m_new, v_scale


@triton.jit
def _fa3_fp8_fwd(Q, K, VT, QS, KS, VS, O, LSE, qk_scale, n_q, n_kv, causal_off, n_q_rows,
                 n_kv_rows, n_vt_rows, vt_stride, STAMPS,
                 H: tl.constexpr, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
                 WARP_SPEC: tl.constexpr, STAMPED: tl.constexpr = False):
    # STAMPED (diagnostics only; compiled out otherwise): fa2's stamps (kernels/fa2.py
    # STAMP_SLOTS) but for the loop's end, which holds the CTA's end here
    if STAMPED:
        started = global_timer(tl.zeros([BLOCK_M], dtype=tl.int32) + tl.program_id(0))
        started_clk = sm_clock(tl.zeros([BLOCK_M], dtype=tl.int32) + tl.program_id(0))
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    kvh = b * (H // GROUP) + h // GROUP
    # VT is [B*KVH*D, Nkv_pad]: row = (kv head, d), column = key position; its
    # rows are vt_stride = Nkv_pad apart (Nkv rounded up to 16 for TMA's
    # 16-byte row alignment), not Nkv: with Nkv % 16 != 0 a stride of Nkv read
    # every row but the first shifted (relative error 1.4 at N = 1000)
    desc_q = tl.make_tensor_descriptor(Q, shape=[n_q_rows, HEAD_DIM], strides=[HEAD_DIM, 1],
                                       block_shape=[BLOCK_M, HEAD_DIM])
    desc_k = tl.make_tensor_descriptor(K, shape=[n_kv_rows, HEAD_DIM], strides=[HEAD_DIM, 1],
                                       block_shape=[BLOCK_N, HEAD_DIM])
    desc_vt = tl.make_tensor_descriptor(VT, shape=[n_vt_rows, n_kv], strides=[vt_stride, 1],
                                        block_shape=[HEAD_DIM, BLOCK_N])
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    q = desc_q.load([bh * n_q + pid_m * BLOCK_M, 0])
    blk0 = kvh * tl.cdiv(n_kv, BLOCK_N)     # this K/V head's first block scale
    q_scale = tl.load(QS + bh * tl.cdiv(n_q, BLOCK_M) + pid_m) * qk_scale
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    c_i = 1.0
    n_full, n_blocks = kv_block_range(pid_m, n_q, n_kv, causal_off, BLOCK_M, BLOCK_N, CAUSAL)
    for j in tl.range(0, n_full, warp_specialize=WARP_SPEC):
        acc, l_i, m_i, c_i = _fa3_fp8_block(acc, l_i, m_i, c_i, q, q_scale, desc_k, desc_vt, KS, VS,
                                            kvh * n_kv, kvh * HEAD_DIM, blk0, j, offs_m, offs_n, n_kv,
                                            causal_off, BLOCK_N, False, CAUSAL)
    for j in range(n_full, n_blocks):
        acc, l_i, m_i, c_i = _fa3_fp8_block(acc, l_i, m_i, c_i, q, q_scale, desc_k, desc_vt, KS, VS,
                                            kvh * n_kv, kvh * HEAD_DIM, blk0, j, offs_m, offs_n, n_kv,
                                            causal_off, BLOCK_N, True, CAUSAL)
    store_output(O, LSE, bh, n_q, offs_m, acc * c_i, l_i, m_i, HEAD_DIM)
    if STAMPED:
        _stamp_cta(STAMPS, started, started, started_clk, l_i.to(tl.int32, bitcast=True), offs_m, BLOCK_M,
                   LOOPED=False)


def _use_warp_spec(cfg: TileConfig) -> bool:
    # the producer warpgroup of the config is Triton's own partition: ask for
    # warp specialisation whenever the config has more than one warpgroup
    return cfg.num_warps >= 8


def forward(q, k, v, *, causal=False, config: TileConfig | None = None, sm_scale=None,
            return_lse=False):
    """FA3-style attention on Hopper. Same contract as kernels.fa2.forward.

    config.num_warps counts all warps of the CTA (producer + consumers), as
    TileConfig documents; the Triton launch gets num_warps // (1 + consumer_warpgroups)
    * consumer_warpgroups compute warps when warp specialisation is on, since
    Triton adds the producer partition's warps itself."""
    problem = problem_of(q, k, v, causal)
    require_hopper(q.device, "fa3")
    cfg = resolve_config("fa3", problem, config, q.device)
    scale = resolve_scale(sm_scale, problem.head_dim)
    ensure_tma_allocator()
    o = torch.empty_like(q)
    lse = torch.empty(q.shape[:3], dtype=torch.float32, device=q.device)
    ws = _use_warp_spec(cfg)
    warps = fa3_triton_warps(cfg)
    grid = (cdiv(problem.seqlen_q, cfg.block_m), problem.batch * problem.heads)
    launch(_fa3_fwd[grid], q, k, v, o, lse, scale * LOG2E, problem.seqlen_q, problem.seqlen_kv,
           problem.causal_offset, q.shape[0] * q.shape[1] * q.shape[2],
           k.shape[0] * k.shape[1] * k.shape[2],
           H=problem.heads, GROUP=problem.group_size, HEAD_DIM=problem.head_dim,
           BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, CAUSAL=problem.causal, WARP_SPEC=ws,
           num_warps=warps, num_stages=cfg.num_stages)
    return (o, lse) if return_lse else o


def quantize_fp8(x, block_rows: int, transpose: bool = False):
    """e4m3 copy of x [B, H, N, D] with one fp32 scale per (b, h, block of
    block_rows rows): scale = amax(block) / 448, x8 = x / scale. Returns
    (x8, scales [B, H, cdiv(N, block_rows)]); with transpose, x8 is
    [B, H, D, N_pad] (N padded to a multiple of 16 so TMA rows stay 16-byte
    aligned), the K-major layout wgmma needs for the V operand."""
    b, h, n, d = x.shape
    nb = cdiv(n, block_rows)
    pad = nb * block_rows - n
    xf = torch.nn.functional.pad(x.float(), (0, 0, 0, pad)).view(b, h, nb, block_rows, d)
    amax = xf.abs().amax(dim=(-1, -2)).clamp_min(1e-12)
    scales = (amax / FP8_MAX).contiguous()
    x8 = (xf / scales[..., None, None]).view(b, h, nb * block_rows, d)[:, :, :n]
    x8 = x8.to(FP8)
    if transpose:
        npad = cdiv(n, 16) * 16
        t = torch.zeros(b, h, d, npad, dtype=FP8, device=x.device)
        t[..., :n] = x8.transpose(-1, -2)
        x8 = t
    return x8.contiguous(), scales


def forward_fp8(q, k, v, *, causal=False, config: TileConfig | None = None, sm_scale=None,
                return_lse=False, scales=None, out_dtype=torch.bfloat16, stamps=None):
    """FP8 (e4m3) forward with per-block scales, at twice the bf16 matmul rate.

    Either pass bf16/fp16 q, k, v (quantised here with quantize_fp8), or
    already-quantised e4m3 q [B,H,Nq,D], k [B,KVH,Nkv,D], vT [B,KVH,D,Nkv_pad]
    with scales=(q_scale, k_scale, v_scale) from quantize_fp8 (block_m rows for
    q, block_n for k and v). Returns O in out_dtype. `stamps` (diagnostics): an
    int64 tensor [CTAs, fa2.STAMP_SLOTS] filled as fa2.forward's is, per CTA in
    launch order (slot 1, the loop's end there, holds the CTA's end here)."""
    if q.dtype in (torch.bfloat16, torch.float16):
        problem = problem_of(q, k, v, causal)
        require_hopper(q.device, "fa3")
        cfg = resolve_config("fa3", problem.with_(dtype="fp8"), config, q.device)
        out_dtype = q.dtype
        q8, qs = quantize_fp8(q, cfg.block_m)
        k8, ks = quantize_fp8(k, cfg.block_n)
        v8, vs = quantize_fp8(v, cfg.block_n, transpose=True)
    else:
        if FP8 is None or q.dtype != FP8 or scales is None:
            raise InvalidProblem("forward_fp8 takes bf16/fp16 q, k, v, or float8_e4m3fn ones with "
                                 "scales=(q_scale, k_scale, v_scale) from quantize_fp8")
        q8, k8, v8 = q, k, v
        qs, ks, vs = scales
        problem = problem_of(q8, k8, k8, causal, dtypes=(FP8,))
        require_hopper(q.device, "fa3")
        cfg = resolve_config("fa3", problem, config, q.device)
    if problem.head_dim < 32:
        raise InvalidProblem(f"forward_fp8 needs head_dim >= 32 (fp8 wgmma K step), got {problem.head_dim}")
    scale = resolve_scale(sm_scale, problem.head_dim)
    ensure_tma_allocator()
    b, h, nq, d = q8.shape
    kvh, nkv = k8.shape[1], k8.shape[2]
    vt_cols = cdiv(nkv, 16) * 16
    if tuple(v8.shape) != (b, kvh, d, vt_cols) or v8.dtype != k8.dtype:
        raise InvalidProblem(f"forward_fp8's v must be Vᵀ as quantize_fp8(v, block_n, transpose=True) "
                             f"gives it, e4m3 [B, KVH, D, Nkv rounded up to 16] = {[b, kvh, d, vt_cols]}, "
                             f"got {v8.dtype} {list(v8.shape)}")
    o = torch.empty(b, h, nq, d, dtype=out_dtype, device=q8.device)
    lse = torch.empty(b, h, nq, dtype=torch.float32, device=q8.device)
    grid = (cdiv(nq, cfg.block_m), b * h)
    if stamps is not None and (stamps.dtype != torch.int64 or tuple(stamps.shape) != (grid[0] * grid[1], STAMP_SLOTS)):
        raise InvalidProblem(f"forward_fp8's stamps must be int64 [{grid[0] * grid[1]}, {STAMP_SLOTS}] "
                             f"(a row a CTA), got {stamps.dtype} {list(stamps.shape)}")
    warps = fa3_triton_warps(cfg, fp8=True)
    launch(_fa3_fp8_fwd[grid], q8, k8, v8, qs, ks, vs, o, lse, scale * LOG2E, nq, nkv,
           problem.causal_offset, b * h * nq, b * kvh * nkv, b * kvh * d, v8.shape[-1],
           stamps if stamps is not None else lse,
           H=h, GROUP=h // kvh, HEAD_DIM=d, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
           CAUSAL=problem.causal, WARP_SPEC=_use_warp_spec(cfg), num_warps=warps,
           num_stages=cfg.num_stages, STAMPED=stamps is not None)
    return (o, lse) if return_lse else o


def compiled_resources(problem: AttentionProblem, config: TileConfig, target=(90,)) -> dict:
    """Cross-compile _fa3_fwd (_fa3_fp8_fwd for fp8) for sm_90 without a GPU: {"smem_bytes", "n_regs",
    "warp_specialized", "ttgir", "tma_descriptors", and the instructions a warp issues per trip of
    the unmasked and the masked loop besides its wgmma (kernels/sass.py)}."""
    from .common import interpreting
    from . import sass
    from .fa2 import _compile_in_subprocess

    if interpreting():
        return _compile_in_subprocess("kernels.fa3", problem, config, target)
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    fp8 = problem.dtype == "fp8"
    ints = {"n_q": problem.seqlen_q, "n_kv": problem.seqlen_kv, "causal_off": problem.causal_offset,
            "n_q_rows": problem.batch * problem.heads * problem.seqlen_q,
            "n_kv_rows": problem.batch * problem.kv_heads * problem.seqlen_kv}
    consts = {"H": problem.heads, "GROUP": problem.group_size, "HEAD_DIM": problem.head_dim,
              "BLOCK_M": config.block_m, "BLOCK_N": config.block_n, "CAUSAL": problem.causal}
    if fp8:
        e4m3 = "*fp8e4nv"
        sig = {"Q": e4m3, "K": e4m3, "VT": e4m3, "QS": "*fp32", "KS": "*fp32", "VS": "*fp32",
               "O": "*bf16", "LSE": "*fp32", "qk_scale": "fp32", "n_q": "i32", "n_kv": "i32",
               "causal_off": "i32", "n_q_rows": "i32", "n_kv_rows": "i32", "n_vt_rows": "i32",
               "vt_stride": "i32", "STAMPS": "*i64"}
        consts["STAMPED"] = False
        ints["n_vt_rows"] = problem.batch * problem.kv_heads * problem.head_dim
        ints["vt_stride"] = cdiv(problem.seqlen_kv, 16) * 16   # quantize_fp8's padded Vᵀ rows
        pointers, fn = ("Q", "K", "VT", "QS", "KS", "VS", "O", "LSE"), _fa3_fp8_fwd
    else:
        dt = {"bf16": "*bf16", "fp16": "*fp16"}[problem.dtype]
        sig = {"Q": dt, "K": dt, "V": dt, "O": dt, "LSE": "*fp32", "qk_scale": "fp32",
               "n_q": "i32", "n_kv": "i32", "causal_off": "i32", "n_q_rows": "i32", "n_kv_rows": "i32"}
        pointers, fn = ("Q", "K", "V", "O", "LSE"), _fa3_fwd
    consts["WARP_SPEC"] = _use_warp_spec(config)
    sig.update({name: "constexpr" for name in consts})
    attrs = launch_hints(sig, pointers, ints)
    compiled = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=consts, attrs=attrs),
                              target=GPUTarget("cuda", target[0], 32),
                              options={"num_warps": fa3_triton_warps(config, fp8),
                                       "num_stages": config.num_stages})
    ttgir = compiled.asm.get("ttgir", "")
    listing = sass.cuobjdump(compiled, "-sass")
    return {"smem_bytes": int(compiled.metadata.shared), "n_regs": sass.registers(compiled),
            "warp_specialized": "ttg.warp_specialize" in ttgir, "ttgir": ttgir,
            # the device-side descriptors a CTA builds and fences before its first copy
            "tma_descriptors": (listing or "").count("UTMACCTL.IV"),
            **sass.loop_issue_slots(listing), **sass.outside_stalls(listing)}
