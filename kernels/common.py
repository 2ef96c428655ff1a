"""Launcher helpers shared by the kernel modules.

Every public kernel validates its inputs here first, so a predictable mistake
(wrong rank, dtype, head counts, a config that does not suit the kernel) ends
in one typed exception from algorithms.errors with a one-line message instead
of a Triton traceback from deep inside a compile.
"""
from __future__ import annotations

import math
import os

import torch

from algorithms.defaults import default_config
from algorithms.errors import DoesNotFit, InvalidConfig, InvalidProblem, UnsupportedAlgorithm
from algorithms.problem import AttentionProblem, TileConfig

TORCH_DTYPES = {torch.bfloat16: "bf16", torch.float16: "fp16"}
FP8_DTYPES = {getattr(torch, "float8_e4m3fn", None): "fp8"} if hasattr(torch, "float8_e4m3fn") else {}
LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def _fix_interpreter_scalar_index() -> None:
    """Triton 3.6's interpreter holds scalars as 1-element 1-d numpy arrays and
    converts them with int(array), which NumPy >= 2.4 rejects ("only
    0-dimensional arrays can be converted"), so `range(n_blocks)` over a
    runtime bound fails under TRITON_INTERPRET=1. Re-register __index__ with
    .item(); a no-op on the GPU path. Remove once Triton or a NumPy < 2.4 pin
    makes it unnecessary."""
    try:
        from triton.runtime import interpreter as _interp
    except Exception:  # pragma: no cover - triton missing or reorganised
        return
    original = getattr(_interp, "_patch_lang_tensor", None)
    if original is None or getattr(original, "_gpusim_fixed", False):
        return

    def patched(tensor, scope):
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    patched._gpusim_fixed = True
    _interp._patch_lang_tensor = patched

    # The interpreter stores bf16 as raw uint16 bits and its create_dot calls
    # np.matmul on them as integers (garbage). Widen bf16 operands to fp32
    # exactly (bf16 is the top half of an fp32) before the product; the
    # accumulator stays fp32, as on the tensor cores.
    import numpy as np
    import triton.language as tl

    builder = _interp.InterpreterBuilder
    dot = builder.create_dot

    def _widen(h):
        if h.dtype == tl.bfloat16:
            bits = h.data.astype(np.uint32) << np.uint32(16)
            return _interp.TensorHandle(bits.view(np.float32), tl.float32)
        return h

    def create_dot(self, a, b, d, *args, **kwargs):
        return dot(self, _widen(a), _widen(b), d, *args, **kwargs)

    builder.create_dot = create_dot

    # Its fp32 -> bf16 cast truncates (rounds toward zero) where the GPU's
    # cvt.rn.bf16.f32 rounds to nearest even: that doubles the rounding error
    # of every bf16 store and P cast under the interpreter (measured: RMS error
    # 2.5x PyTorch's on standard attention, 1.0x once fixed). Round like the GPU.
    cast = builder.cast_impl

    def cast_impl(self, src, dst_type):
        if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16:
            bits = np.ascontiguousarray(src.data, dtype=np.float32).view(np.uint32)
            rounded = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
            rounded = np.where(np.isnan(src.data), np.uint32(0x7FC0), rounded)
            return _interp.TensorHandle(rounded.astype(np.uint16), tl.bfloat16)
        return cast(self, src, dst_type)

    builder.cast_impl = cast_impl


if interpreting():
    _fix_interpreter_scalar_index()


def require_hopper(device, what: str, needs: str = "TMA and wgmma") -> None:
    """UnsupportedAlgorithm (one line) unless `device` is a Hopper GPU (sm_90),
    run compiled: `what` needs its `needs`."""
    if interpreting() or not torch.cuda.is_available() or device.type != "cuda":
        raise UnsupportedAlgorithm(f"{what} needs a Hopper GPU (sm_90: {needs}); "
                                   f"no CUDA device here, or the Triton interpreter")
    cap = torch.cuda.get_device_capability(device)
    if cap[0] != 9:
        raise UnsupportedAlgorithm(f"{what} needs a Hopper GPU (sm_90: {needs}), got sm_{cap[0]}{cap[1]}")


def is_hopper(device=None) -> bool:
    """True on sm_90 (H100/H200): wgmma and TMA are available."""
    if interpreting() or not torch.cuda.is_available():
        return False
    return torch.cuda.get_device_capability(device)[0] == 9


def _check_tensor(name: str, t, dtypes) -> None:
    if not isinstance(t, torch.Tensor):
        raise InvalidProblem(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != 4:
        raise InvalidProblem(
            f"{name} must have rank 4 [batch, heads, seqlen, head_dim], got shape {tuple(t.shape)}"
        )
    if t.dtype not in dtypes:
        allowed = ", ".join(str(d).replace("torch.", "") for d in dtypes)
        raise InvalidProblem(f"{name} dtype must be one of {allowed}, got {str(t.dtype).replace('torch.', '')}")
    if not t.is_contiguous():
        raise InvalidProblem(f"{name} must be contiguous (call .contiguous()), got strides {t.stride()}")


def problem_of(q, k, v, causal: bool = False, dtypes=None) -> AttentionProblem:
    """The AttentionProblem of q [B,H,Nq,D], k/v [B,KVH,Nkv,D]; raises
    InvalidProblem (one line) for anything a kernel cannot take."""
    dtypes = dtypes or tuple(TORCH_DTYPES)
    for name, t in (("q", q), ("k", k), ("v", v)):
        _check_tensor(name, t, dtypes)
    if not (q.dtype == k.dtype == v.dtype):
        raise InvalidProblem(f"q, k, v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise InvalidProblem(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    if q.device.type != "cuda" and not interpreting():
        raise InvalidProblem(
            f"tensors are on {q.device}; Triton kernels need CUDA tensors (or TRITON_INTERPRET=1 for CPU)"
        )
    if k.shape != v.shape:
        raise InvalidProblem(f"k and v must have the same shape, got {tuple(k.shape)} and {tuple(v.shape)}")
    b, h, nq, d = q.shape
    bk, kvh, nkv, dk = k.shape
    if bk != b:
        raise InvalidProblem(f"q and k batch differ: {b} vs {bk}")
    if dk != d:
        raise InvalidProblem(f"q and k head_dim differ: {d} vs {dk}")
    if kvh == 0 or h % kvh:
        raise InvalidProblem(f"query heads ({h}) must be a multiple of k/v heads ({kvh})")
    dtype = TORCH_DTYPES.get(q.dtype) or FP8_DTYPES.get(q.dtype)
    return AttentionProblem(batch=b, heads=h, seqlen_q=nq, head_dim=d, kv_heads=kvh,
                            seqlen_kv=nkv, causal=bool(causal), dtype=dtype)


def resolve_config(algo: str, problem: AttentionProblem, config, device=None) -> TileConfig:
    if config is None:
        return default_config(algo, problem, hopper=is_hopper(device))
    if not isinstance(config, TileConfig):
        raise InvalidConfig(f"config must be an algorithms.problem.TileConfig, got {type(config).__name__}")
    return config


def resolve_scale(sm_scale, head_dim: int) -> float:
    if sm_scale is None:
        return 1.0 / math.sqrt(head_dim)
    try:
        s = float(sm_scale)
    except (TypeError, ValueError):
        raise InvalidProblem(f"sm_scale must be a positive number, got {sm_scale!r}") from None
    if not (s > 0 and math.isfinite(s)):
        raise InvalidProblem(f"sm_scale must be a positive finite number, got {sm_scale!r}")
    return s


_TMA_ALLOCATOR_SET = False


def ensure_tma_allocator() -> None:
    """Device-side tensor descriptors (tl.make_tensor_descriptor) need a
    scratch buffer per CTA (128 B each) from a user allocator."""
    import triton

    global _TMA_ALLOCATOR_SET
    if not _TMA_ALLOCATOR_SET:
        triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8,
                                                                     device="cuda"))
        _TMA_ALLOCATOR_SET = True


def launch(kernel_grid, *args, **kwargs):
    """Run a Triton launch, turning Triton's out-of-resource errors (the config
    needs more SMEM or registers than the GPU has) into DoesNotFit."""
    from triton.runtime.errors import OutOfResources

    try:
        return kernel_grid(*args, **kwargs)
    except OutOfResources as e:
        raise DoesNotFit(str(e.name), int(e.required), int(e.limit),
                         "reduce block sizes or num_stages") from None


def launch_hints(signature: dict, pointers, ints: dict) -> dict:
    """The attrs a cross-compile (triton.compile of an ASTSource) needs to
    build what the launcher builds: torch allocations are 16-byte aligned, and
    an int argument divisible by 16 gets the same hint (without them loads
    are not vectorised and the pipeliner skips them). pointers: the pointer
    arguments' names; ints: int arguments' names -> their values."""
    names = list(signature)
    return {(names.index(n),): [["tt.divisibility", 16]]
            for n in (*pointers, *(n for n, val in ints.items() if val % 16 == 0))}


def make_inputs(batch, heads, seqlen_q, head_dim, *, kv_heads=None, seqlen_kv=None,
                dtype=torch.bfloat16, device="cuda", generator=None, scale=1.0):
    """Random q [B,H,Nq,D], k/v [B,KVH,Nkv,D] ~ N(0, scale²) (never zeros)."""
    kv_heads = kv_heads or heads
    seqlen_kv = seqlen_kv or seqlen_q

    def rnd(*shape):
        t = torch.randn(*shape, generator=generator, dtype=torch.float32, device="cpu") * scale
        return t.to(device=device, dtype=dtype)

    return (rnd(batch, heads, seqlen_q, head_dim), rnd(batch, kv_heads, seqlen_kv, head_dim),
            rnd(batch, kv_heads, seqlen_kv, head_dim))


def triton_dtype(torch_dtype):
    import triton.language as tl

    return {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}[torch_dtype]
