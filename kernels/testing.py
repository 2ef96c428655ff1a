"""References and inputs for testing the kernels.

`reference` is an fp64 PyTorch attention with the kernels' signature (the
config is accepted and ignored); `torch_lowp` is PyTorch's own math attention
in the input dtype (GEMMs and softmax output rounded to bf16/fp16, as the SDPA
MATH backend does), whose error against fp64 is the yardstick of the tests:
a kernel may be at most 2x as wrong as PyTorch itself, plus a small epsilon.
"""
from __future__ import annotations

import math

import torch


def _expand_kv(k, v, heads):
    group = heads // k.shape[1]
    if group > 1:
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
    return k, v


def _mask(nq, nkv, device):
    """Bottom-right aligned causal mask: row i sees column j iff j <= i + nkv - nq."""
    i = torch.arange(nq, device=device)[:, None]
    j = torch.arange(nkv, device=device)[None, :]
    return j <= i + (nkv - nq)


def _scores64(q, k, v, causal, sm_scale):
    """fp64 scaled scores S (masked to -inf above the causal diagonal) and V,
    K/V expanded to the query heads."""
    d = q.shape[-1]
    scale = 1.0 / math.sqrt(d) if sm_scale is None else float(sm_scale)
    q64, k64, v64 = (t.to(torch.float64) for t in (q, k, v))
    k64, v64 = _expand_kv(k64, v64, q.shape[1])
    s = (q64 @ k64.transpose(-1, -2)) * scale
    if causal:
        s = s.masked_fill(~_mask(q.shape[2], k.shape[2], q.device), float("-inf"))
    return s, v64


def reference(q, k, v, *, causal=False, config=None, sm_scale=None, return_lse=False):
    """fp64 attention; O in q's dtype (plus fp32 LSE [B,H,Nq], natural log)."""
    del config
    s, v64 = _scores64(q, k, v, causal, sm_scale)
    lse = torch.logsumexp(s, dim=-1)
    o = torch.exp(s - lse[..., None]) @ v64
    out = o if q.dtype == torch.float64 else o.to(q.dtype)
    return (out, lse.to(torch.float32)) if return_lse else out


def reference_fp64(q, k, v, *, causal=False, sm_scale=None):
    """The fp64 output itself (not rounded), for error measurements."""
    s, v64 = _scores64(q, k, v, causal, sm_scale)
    return torch.softmax(s, dim=-1) @ v64


def torch_lowp(q, k, v, *, causal=False, sm_scale=None):
    """PyTorch's math attention in the input dtype: S = QKᵀ·scale rounded to the
    dtype, softmax (fp32 inside, output rounded), P V rounded. The matmuls run
    in fp32 on the CPU (bf16 GEMMs there accumulate in fp32, like tensor cores)."""
    d = q.shape[-1]
    dt = q.dtype
    scale = 1.0 / math.sqrt(d) if sm_scale is None else float(sm_scale)
    k, v = _expand_kv(k, v, q.shape[1])
    s = ((q.float() @ k.float().transpose(-1, -2)) * scale).to(dt)
    if causal:
        s = s.masked_fill(~_mask(q.shape[2], k.shape[2], q.device), float("-inf"))
    p = torch.softmax(s.float(), dim=-1).to(dt)
    return (p.float() @ v.float()).to(dt)


def torch_fp8(q, k, v, *, causal=False, block_m=128, block_n=128, sm_scale=None):
    """PyTorch's attention at the FP8 kernel's precision, the yardstick of
    kernels.fa3.forward_fp8 as torch_lowp is of the 16-bit kernels: Q, K, V
    quantised as the kernel's are (e4m3, one scale per block of block_m /
    block_n rows: kernels.fa3.quantize_fp8), then exact (fp64) scores and
    softmax, P rounded to e4m3 before P V (the kernel rounds its P so, and
    sums the unrounded P into the row sum). Returns fp64."""
    from .fa3 import quantize_fp8

    d = q.shape[-1]
    scale = 1.0 / math.sqrt(d) if sm_scale is None else float(sm_scale)

    def dequantized(x, rows):
        x8, scales = quantize_fp8(x, rows)
        n = x.shape[2]
        per_row = scales.to(torch.float64).repeat_interleave(rows, dim=-1)[..., :n, None]
        return x8.to(torch.float64) * per_row

    q64, k64, v64 = dequantized(q, block_m), dequantized(k, block_n), dequantized(v, block_n)
    k64, v64 = _expand_kv(k64, v64, q.shape[1])
    s = (q64 @ k64.transpose(-1, -2)) * scale
    if causal:
        s = s.masked_fill(~_mask(q.shape[2], k.shape[2], q.device), float("-inf"))
    p = torch.exp(s - s.amax(dim=-1, keepdim=True))
    p8 = p.to(torch.float32).to(torch.float8_e4m3fn).to(torch.float64)
    return (p8 @ v64) / p.sum(dim=-1, keepdim=True)


def outlier_inputs(batch, heads, seqlen, head_dim, *, kv_heads=None, dtype=torch.bfloat16,
                   device="cuda", generator=None):
    """The FA3 paper's FP8 stress inputs (arXiv 2407.08608 §4.3):
    N(0,1) + N(0,100)·Bernoulli(0.001), i.e. 0.1% of entries get an extra
    term of standard deviation 10."""
    kv_heads = kv_heads or heads

    def one(*shape):
        base = torch.randn(*shape, generator=generator)
        big = torch.randn(*shape, generator=generator) * 10.0
        hit = torch.rand(*shape, generator=generator) < 0.001
        return (base + big * hit).to(device=device, dtype=dtype)

    return (one(batch, heads, seqlen, head_dim), one(batch, kv_heads, seqlen, head_dim),
            one(batch, kv_heads, seqlen, head_dim))


def max_error(out, ref64):
    return (out.to(torch.float64) - ref64.to(out.device)).abs().max().item()


def rms_error(out, ref64):
    """Root-mean-square error over all elements: the tests' yardstick. The
    max-abs error of a bf16 output is a few ulps of one unlucky element and
    swings by 3x between seeds for the same kernel; the RMS is stable."""
    return (out.to(torch.float64) - ref64.to(out.device)).pow(2).mean().sqrt().item()
