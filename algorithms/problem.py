"""What to compute (AttentionProblem) and how to tile it (TileConfig).

Both are frozen dataclasses validated on construction: a schedule, the
simulator and a Triton kernel can take one without checking it again.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from .errors import InvalidConfig, InvalidProblem

# Bytes per element of the input/output dtype. Softmax statistics (m, l,
# logsumexp) and accumulators are always fp32 (4 bytes).
DTYPE_BYTES = {"fp16": 2, "bf16": 2, "fp8": 1}
ACC_BYTES = 4
MMA_KINDS = ("auto", "mma.sync", "wgmma")


def _positive_int(cls, name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise cls(f"{name} must be a positive integer, got {value!r}")


def _power_of_two(cls, name: str, value: int, low: int, high: int, also: str = "") -> None:
    _positive_int(cls, name, value)
    if value & (value - 1) or not low <= value <= high:
        raise cls(f"{name} must be a power of two in [{low}, {high}]{also}, got {value}")


# FA3's 192-row tile: three consumer warpgroups of 64 rows (one wgmma M each).
# FlashAttention-3 names 192 x 128 among its good hdim-128 tiles
# (hopper/tile_size.h); only the fa3 schedule and kernels/fa3_gluon.py take it,
# since Triton's tl.arange needs power-of-two shapes (algorithms.check).
THREE_CONSUMER_BLOCK_M = 192


@dataclass(frozen=True)
class AttentionProblem:
    """A forward multi-head attention: O = softmax(Q Kᵀ / sqrt(d)) V per head.

    Q and O are [batch, heads, seqlen_q, head_dim]; K and V are
    [batch, kv_heads, seqlen_kv, head_dim]. kv_heads < heads is GQA (MQA at 1):
    query head h reads K/V head h // (heads // kv_heads). Causal masking is
    aligned bottom-right (query i sees keys j <= i + seqlen_kv - seqlen_q), the
    FlashAttention >= 2.1 convention, so it needs seqlen_q <= seqlen_kv.
    """

    batch: int
    heads: int
    seqlen_q: int
    head_dim: int
    kv_heads: int | None = None
    seqlen_kv: int | None = None
    causal: bool = False
    dtype: str = "bf16"

    def __post_init__(self):
        for name in ("batch", "heads", "seqlen_q"):
            _positive_int(InvalidProblem, name, getattr(self, name))
        if self.kv_heads is None:
            object.__setattr__(self, "kv_heads", self.heads)
        if self.seqlen_kv is None:
            object.__setattr__(self, "seqlen_kv", self.seqlen_q)
        _positive_int(InvalidProblem, "kv_heads", self.kv_heads)
        _positive_int(InvalidProblem, "seqlen_kv", self.seqlen_kv)
        if self.head_dim not in (16, 32, 64, 128, 256):
            raise InvalidProblem(
                f"head_dim must be one of 16, 32, 64, 128, 256, got {self.head_dim!r}"
            )
        if self.heads % self.kv_heads:
            raise InvalidProblem(
                f"heads ({self.heads}) must be a multiple of kv_heads ({self.kv_heads})"
            )
        if not isinstance(self.causal, bool):
            raise InvalidProblem(f"causal must be True or False, got {self.causal!r}")
        if self.dtype not in DTYPE_BYTES:
            raise InvalidProblem(
                f"dtype must be one of {', '.join(DTYPE_BYTES)}, got {self.dtype!r}"
            )
        if self.causal and self.seqlen_q > self.seqlen_kv:
            raise InvalidProblem(
                f"causal attention needs seqlen_q <= seqlen_kv (bottom-right aligned), "
                f"got {self.seqlen_q} > {self.seqlen_kv}"
            )

    @property
    def elem_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def out_elem_bytes(self) -> int:
        """Bytes per output element: fp8 attention writes bf16 (2 bytes)."""
        return 2 if self.dtype == "fp8" else self.elem_bytes

    @property
    def group_size(self) -> int:
        """Query heads per K/V head (1 for MHA)."""
        return self.heads // self.kv_heads

    def kv_head_of(self, head: int) -> int:
        return head // self.group_size

    @property
    def causal_offset(self) -> int:
        """Query row i may attend key column j iff j <= i + causal_offset."""
        return self.seqlen_kv - self.seqlen_q

    def reference_flops(self) -> float:
        """4·B·H·N_q·N_kv·D, halved when causal: the tritonbench convention used
        for every TFLOP/s figure, whatever work a kernel really does."""
        flops = 4.0 * self.batch * self.heads * self.seqlen_q * self.seqlen_kv * self.head_dim
        return flops * 0.5 if self.causal else flops

    def with_(self, **changes) -> "AttentionProblem":
        return replace(self, **changes)


@dataclass(frozen=True)
class TileConfig:
    """How an algorithm tiles a problem and how many warps/stages a CTA uses.

    block_m: query rows per tile (FA1's B_r); block_n: key/value columns per
    tile (FA1's B_c); num_warps: warps per CTA (for FA3, including the producer
    warpgroup); num_stages: depth of the K/V SMEM ring (software pipelining).
    block_k: reduction step of standard's GEMM kernels.
    mma: the matrix instruction; "auto" lets the GPU choose what Triton would
    (wgmma on Hopper when warps come in warpgroups, mma.sync otherwise).
    FA3 only: consumer_warpgroups, pingpong (consumer warpgroups alternate so
    one's softmax hides under the other's GEMMs) and intra_wg_overlap (softmax
    of block j overlaps the GEMM of block j+1 inside a warpgroup).
    """

    block_m: int = 128
    block_n: int = 64
    num_warps: int = 4
    num_stages: int = 2
    block_k: int = 64
    mma: str = "auto"
    consumer_warpgroups: int = 2
    pingpong: bool = True
    intra_wg_overlap: bool = True

    def __post_init__(self):
        if not (self.block_m == THREE_CONSUMER_BLOCK_M and self.consumer_warpgroups == 3):
            _power_of_two(InvalidConfig, "block_m", self.block_m, 16, 256,
                          also=f" (or {THREE_CONSUMER_BLOCK_M} with consumer_warpgroups=3, FA3's tile)")
        _power_of_two(InvalidConfig, "block_n", self.block_n, 16, 256)
        _power_of_two(InvalidConfig, "block_k", self.block_k, 16, 256)
        _positive_int(InvalidConfig, "num_warps", self.num_warps)
        if self.num_warps > 32:
            raise InvalidConfig(f"num_warps must be in [1, 32] (1024 threads), got {self.num_warps}")
        _positive_int(InvalidConfig, "num_stages", self.num_stages)
        if self.num_stages > 8:
            raise InvalidConfig(f"num_stages must be in [1, 8], got {self.num_stages}")
        if self.mma not in MMA_KINDS:
            raise InvalidConfig(f"mma must be one of {', '.join(MMA_KINDS)}, got {self.mma!r}")
        if self.consumer_warpgroups not in (1, 2, 3):
            raise InvalidConfig(
                f"consumer_warpgroups must be 1, 2 or 3, got {self.consumer_warpgroups!r}"
            )
        for name in ("pingpong", "intra_wg_overlap"):
            if not isinstance(getattr(self, name), bool):
                raise InvalidConfig(f"{name} must be True or False, got {getattr(self, name)!r}")

    @property
    def threads(self) -> int:
        return 32 * self.num_warps

    def with_(self, **changes) -> "TileConfig":
        return replace(self, **changes)


def cdiv(a: int, b: int) -> int:
    return -(-a // b)
