"""FlashAttention (v1) forward, Algorithm 1 of arXiv 2205.14135, in Triton.

Schedule (algorithms/fa1.py replays exactly this order):
  grid = (B*H,), pid = b*H + h; K/V head h // (H // KVH).
  for j in 0 .. Tc-1 (K/V blocks of block_n = B_c columns):        # outer
      load K_j, V_j once (plain loads)
      for i in i0(j) .. Tr-1 (Q blocks of block_m = B_r rows):      # inner
          load Q_i; if j > 0 load O_i (fp32 workspace [B,H,Nq,D]) and
          l_i, m_i (fp32 workspaces [B,H,Nq])
          S_ij = Q_i K_jᵀ; m_new = max(m_i, rowmax S_ij);
          l_new = e^(m_i - m_new) l_i + rowsum e^(S_ij - m_new);
          O_i  = (l_i e^(m_i - m_new) O_i + e^(S_ij - m_new) V_j) / l_new
          if j == last(i): write O_i in the input dtype and LSE_i
          else: write O_i (fp32), l_i, m_i back to the workspaces
  i0(j) = 0, or under causal the first Q block holding a row that sees a
  column of block j: max(0, j*BN - (Nkv - Nq)) // BM.
  last(i) = Tc-1, or under causal min(Tc-1, (min((i+1)*BM, Nq) - 1 + Nkv - Nq) // BN).
Differences from the paper, written down here and in algorithms/fa1.py:
  * the initialisation of O, l, m (O = 0, l = 0, m = -inf in HBM) is folded
    into j == 0: nothing is read there, the block starts from those values;
  * O accumulates in fp32 (the workspace) and is rounded to the input dtype
    only when final; S is kept in scaled base-2 units and exp2 used (the same
    values as e^x with the scale folded in);
  * e^(S - m_new) replaces e^(m_ij - m_new)·e^(S - m_ij) (algebraically equal;
    it avoids -inf - -inf for a row with no visible column in a causal block);
  * Triton cannot express FA1's warp-level split of K/V (the "split-K" where
    each warp takes a slice of B_c and the partial results are combined
    through SMEM): tl.dot distributes the tile across warps as the compiler
    chooses. The schedule models the split-K combine; the kernel does not.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from algorithms.problem import AttentionProblem, TileConfig

from . import sass
from .common import LOG2E, launch, launch_hints, problem_of, resolve_config, resolve_scale


@triton.jit
def _fa1_fwd(Q, K, V, O, LSE, OW, LW, MW, qk_scale, n_q, n_kv, causal_off,
             H: tl.constexpr, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr,
             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
    bh = tl.program_id(0)
    kvh = (bh // H) * (H // GROUP) + (bh % H) // GROUP
    q_base = bh.to(tl.int64) * n_q * HEAD_DIM
    kv_base = kvh.to(tl.int64) * n_kv * HEAD_DIM
    r_base = bh.to(tl.int64) * n_q
    offs_m0 = tl.arange(0, BLOCK_M)
    offs_n0 = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    t_c = tl.cdiv(n_kv, BLOCK_N)
    t_r = tl.cdiv(n_q, BLOCK_M)
    for j in range(0, t_c):
        cols = j * BLOCK_N + offs_n0
        col_ok = cols < n_kv
        kv_off = kv_base + cols[:, None] * HEAD_DIM + offs_d[None, :]
        k = tl.load(K + kv_off, mask=col_ok[:, None], other=0.0)
        v = tl.load(V + kv_off, mask=col_ok[:, None], other=0.0)
        i0 = 0
        if CAUSAL:
            i0 = tl.maximum(j * BLOCK_N - causal_off, 0) // BLOCK_M
        for i in range(i0, t_r):
            rows = i * BLOCK_M + offs_m0
            row_ok = rows < n_q
            q_off = q_base + rows[:, None] * HEAD_DIM + offs_d[None, :]
            q = tl.load(Q + q_off, mask=row_ok[:, None], other=0.0)
            if j > 0:
                o_i = tl.load(OW + q_off, mask=row_ok[:, None], other=0.0)
                l_i = tl.load(LW + r_base + rows, mask=row_ok, other=1.0)
                m_i = tl.load(MW + r_base + rows, mask=row_ok, other=0.0)
            else:
                o_i = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
                l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
                m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
            s = tl.dot(q, tl.trans(k)) * qk_scale
            keep = col_ok[None, :]
            if CAUSAL:
                keep = keep & (cols[None, :] <= rows[:, None] + causal_off)
            s = tl.where(keep, s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            p = tl.math.exp2(s - m_new[:, None])
            alpha = tl.math.exp2(m_i - m_new) * l_i
            l_new = alpha + tl.sum(p, 1)
            pv = tl.dot(p.to(v.dtype), v)
            o_i = (o_i * alpha[:, None] + pv) / l_new[:, None]
            last = t_c - 1
            if CAUSAL:
                last = tl.minimum(last, (tl.minimum((i + 1) * BLOCK_M, n_q) - 1 + causal_off) // BLOCK_N)
            if j == last:
                tl.store(O + q_off, o_i.to(O.dtype.element_ty), mask=row_ok[:, None])
                # m is in base-2 units of the scaled scores: lse = ln2·(m + log2 l)
                tl.store(LSE + r_base + rows, (m_new + tl.math.log2(l_new)) * 0.6931471805599453,
                         mask=row_ok)
            else:
                tl.store(OW + q_off, o_i, mask=row_ok[:, None])
                tl.store(LW + r_base + rows, l_new, mask=row_ok)
                tl.store(MW + r_base + rows, m_new, mask=row_ok)


def forward(q, k, v, *, causal=False, config: TileConfig | None = None, sm_scale=None,
            return_lse=False):
    """Attention with Algorithm 1's loop order. Same contract as kernels.fa2.forward."""
    problem = problem_of(q, k, v, causal)
    cfg = resolve_config("fa1", problem, config, q.device)
    scale = resolve_scale(sm_scale, problem.head_dim)
    b, h, nq, d = q.shape
    o = torch.empty_like(q)
    lse = torch.empty(b, h, nq, dtype=torch.float32, device=q.device)
    ow = torch.empty(b, h, nq, d, dtype=torch.float32, device=q.device)
    lw = torch.empty(b, h, nq, dtype=torch.float32, device=q.device)
    mw = torch.empty_like(lw)
    launch(_fa1_fwd[(b * h,)], q, k, v, o, lse, ow, lw, mw, scale * LOG2E, nq, k.shape[2],
           problem.causal_offset, H=h, GROUP=problem.group_size, HEAD_DIM=d,
           BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, CAUSAL=problem.causal,
           num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    return (o, lse) if return_lse else o


def compiled_resources(problem: AttentionProblem, config: TileConfig, target=(90,)) -> dict:
    """Cross-compile _fa1_fwd for `target` without a GPU: {"smem_bytes":
    metadata.shared, "n_regs": registers per thread from ptxas}.
    algorithms/fa1.py reads the registers back through
    experiments/results/triton_smem_fa1.csv (experiments/triton_smem_probe.py
    --fa1-only): at 64x64, 4 warps, ptxas gives 150 a thread at D = 64
    (184 causal) and 227 at D = 128, where the schedule's estimate was 112
    and 144."""
    from .common import interpreting

    if interpreting():
        from .fa2 import _compile_in_subprocess
        return _compile_in_subprocess("kernels.fa1", problem, config, target)
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    dt = {"bf16": "*bf16", "fp16": "*fp16"}[problem.dtype]
    sig = {"Q": dt, "K": dt, "V": dt, "O": dt, "LSE": "*fp32", "OW": "*fp32", "LW": "*fp32", "MW": "*fp32",
           "qk_scale": "fp32", "n_q": "i32", "n_kv": "i32", "causal_off": "i32",
           "H": "constexpr", "GROUP": "constexpr", "HEAD_DIM": "constexpr",
           "BLOCK_M": "constexpr", "BLOCK_N": "constexpr", "CAUSAL": "constexpr"}
    consts = {"H": problem.heads, "GROUP": problem.group_size, "HEAD_DIM": problem.head_dim,
              "BLOCK_M": config.block_m, "BLOCK_N": config.block_n, "CAUSAL": problem.causal}
    attrs = launch_hints(sig, ("Q", "K", "V", "O", "LSE", "OW", "LW", "MW"),
                         {"n_q": problem.seqlen_q, "n_kv": problem.seqlen_kv, "causal_off": problem.causal_offset})
    cap = target[0] if isinstance(target, (tuple, list)) else int(target)
    compiled = triton.compile(ASTSource(fn=_fa1_fwd, signature=sig, constexprs=consts, attrs=attrs),
                              target=GPUTarget("cuda", cap, 32),
                              options={"num_warps": config.num_warps, "num_stages": config.num_stages})
    return {"smem_bytes": int(compiled.metadata.shared),
            "n_regs": sass.registers(compiled, sass.cuobjdump(compiled, "-res-usage"))}
