"""The block step every Triton FlashAttention kernel here shares (fa2, fa3 and
fa3's FP8 path), as @triton.jit helpers that Triton inlines into each kernel:

  kv_block_range  which K/V blocks a Q block visits, and which of them need a mask;
  mask_scores     the causal (bottom-right aligned) and key-tail mask on S;
  softmax_update  one online-softmax step in the base-2 domain;
  store_output    O = acc / l and LSE = ln 2 · (m + log2 l), rows past Nq masked.

Scores are kept in scaled base-2 units: m is max(S)·scale and P = exp2(S·scale
− m), one FMA per score and exp2 on the MUFU instead of exp (FA2's trick).
fa1 (whose statistics round-trip through HBM) and the Gluon kernel (explicit
layouts) keep their own versions.
"""
import triton
import triton.language as tl

from .common import LN2 as _LN2

LN2 = tl.constexpr(_LN2)   # the LSE is returned in natural log


@triton.jit
def kv_block_range(pid_m, n_q, n_kv, causal_off, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                   CAUSAL: tl.constexpr):
    """(n_full, n_blocks): Q block pid_m visits K/V blocks 0 .. n_blocks-1;
    blocks 0 .. n_full-1 need no mask (every row of the Q block sees every
    column, and the block lies inside Nkv). Under causal, blocks wholly above
    the diagonal are not visited: last_row + causal_off is the last column
    the Q block's last row sees."""
    n_blocks = tl.cdiv(n_kv, BLOCK_N)
    n_full = n_kv // BLOCK_N
    if CAUSAL:
        last_row = tl.minimum((pid_m + 1) * BLOCK_M, n_q) - 1
        n_blocks = tl.minimum(n_blocks, tl.cdiv(last_row + causal_off + 1, BLOCK_N))
        # unmasked when even the block's first row sees its last column
        n_full = tl.maximum(tl.minimum(n_full, (pid_m * BLOCK_M + causal_off + 1) // BLOCK_N), 0)
    return n_full, n_blocks


@triton.jit
def mask_scores(qk, cols, offs_m, n_kv, causal_off, CAUSAL: tl.constexpr):
    """−inf where the column is past the keys or (causal) row r may not see
    column c: c > r + causal_off, causal_off = Nkv − Nq."""
    keep = (cols < n_kv)[None, :]
    if CAUSAL:
        keep = keep & (cols[None, :] <= offs_m[:, None] + causal_off)
    return tl.where(keep, qk, float("-inf"))


@triton.jit
def softmax_update(qk, m_i, l_i, scale):
    """One online-softmax step over scores qk (unscaled): returns P, the factor
    alpha that rescales the running O, and the new l and m."""
    m_new = tl.maximum(m_i, tl.max(qk, 1) * scale)
    p = tl.math.exp2(qk * scale - m_new[:, None])
    alpha = tl.math.exp2(m_i - m_new)
    l_new = l_i * alpha + tl.sum(p, 1)
    return p, alpha, l_new, m_new


@triton.jit
def store_output(O, LSE, bh, n_q, offs_m, acc, l_i, m_i, HEAD_DIM: tl.constexpr):
    """O_i = acc / l in O's dtype and the fp32 natural-log LSE, for the rows
    offs_m < Nq of head bh (O is [B·H, Nq, D], LSE [B·H, Nq])."""
    offs_d = tl.arange(0, HEAD_DIM)
    row_ok = offs_m < n_q
    o = acc / l_i[:, None]
    o_ptrs = O + bh.to(tl.int64) * n_q * HEAD_DIM + offs_m[:, None] * HEAD_DIM + offs_d[None, :]
    tl.store(o_ptrs, o.to(O.dtype.element_ty), mask=row_ok[:, None])
    tl.store(LSE + bh.to(tl.int64) * n_q + offs_m, (m_i + tl.math.log2(l_i)) * LN2, mask=row_ok)
