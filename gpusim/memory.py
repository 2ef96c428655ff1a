"""Memory calculator: KV-cache bytes and attention workspace for a model shape.

KV cache (inference): 2 (K and V) × kv_heads × head_dim × bytes × layers ×
seq × batch. GQA/MQA shrink it by heads / kv_heads.

Attention workspace: what one attention call keeps in HBM besides Q, K, V
and O, read off the algorithm's schedule (algorithms.build(...).tensors), so
it is the same source of truth as the accounting: standard attention writes
the N×N scores S and probabilities P per head (O(N²)); FlashAttention-2/3
write only the per-row logsumexp (O(N)); FA1 keeps an fp32 O accumulator and
the row statistics m and l in HBM (O(N·d)). Layers run one after another, so
the workspace of one layer is the peak.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import algorithms
from algorithms.errors import GpusimError
from algorithms.problem import DTYPE_BYTES, AttentionProblem

IO_TENSORS = ("Q", "K", "V", "O")
WORKSPACE_ALGOS = ("standard", "fa1", "fa2", "fa3")


@dataclass(frozen=True)
class ModelShape:
    name: str
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    source: str = "custom"

    def __post_init__(self):
        for field in ("layers", "heads", "kv_heads", "head_dim"):
            v = getattr(self, field)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise GpusimError(f"{field} must be a positive integer, got {v!r}")
        if self.heads % self.kv_heads:
            raise GpusimError(f"heads ({self.heads}) must be a multiple of kv_heads ({self.kv_heads})")

    @property
    def attention_kind(self) -> str:
        if self.kv_heads == self.heads:
            return "MHA"
        return "MQA" if self.kv_heads == 1 else f"GQA, {self.heads // self.kv_heads} query heads per KV head"

    def mha(self) -> "ModelShape":
        """The same model with one K/V head per query head."""
        return replace(self, name=f"{self.name} (MHA)", kv_heads=self.heads)


# Architecture numbers from each model's published config (Hugging Face
# config.json: num_hidden_layers, num_attention_heads, num_key_value_heads,
# hidden_size / num_attention_heads).
PRESETS = {
    "llama2-7b": ModelShape("Llama-2-7B", 32, 32, 32, 128,
                            "meta-llama/Llama-2-7b-hf config.json: 32 layers, 32 heads, hidden 4096, MHA"),
    "llama2-13b": ModelShape("Llama-2-13B", 40, 40, 40, 128,
                             "meta-llama/Llama-2-13b-hf config.json: 40 layers, 40 heads, hidden 5120, MHA"),
    "llama2-70b": ModelShape("Llama-2-70B", 80, 64, 8, 128,
                             "Touvron et al. 2023 (Llama 2) and meta-llama/Llama-2-70b-hf config.json: "
                             "80 layers, 64 heads, 8 KV heads (GQA), hidden 8192"),
    "llama3-8b": ModelShape("Llama-3-8B", 32, 32, 8, 128,
                            "meta-llama/Meta-Llama-3-8B config.json: 32 layers, 32 heads, 8 KV heads, hidden 4096"),
    "mistral-7b": ModelShape("Mistral-7B", 32, 32, 8, 128,
                             "Jiang et al. 2023 (Mistral 7B), Table 1: 32 layers, 32 heads, 8 KV heads, head dim 128"),
}


def preset(name: str) -> ModelShape:
    try:
        return PRESETS[name]
    except KeyError:
        raise GpusimError(f"unknown model {name!r}; presets: {', '.join(PRESETS)} "
                          f"(or give --layers --heads --kv-heads --head-dim)") from None


def dtype_bytes(dtype: str) -> int:
    try:
        return DTYPE_BYTES[dtype]
    except KeyError:
        raise GpusimError(f"dtype must be one of {', '.join(DTYPE_BYTES)}, got {dtype!r}") from None


def kv_bytes_per_token_per_layer(model: ModelShape, dtype: str = "fp16") -> int:
    """2 (K and V) × kv_heads × head_dim × bytes."""
    return 2 * model.kv_heads * model.head_dim * dtype_bytes(dtype)


def kv_cache_bytes(model: ModelShape, seqlen: int, batch: int = 1, dtype: str = "fp16") -> int:
    """2 × kv_heads × head_dim × bytes × layers × seq × batch."""
    if seqlen < 1 or batch < 1:
        raise GpusimError(f"seqlen and batch must be positive, got {seqlen} and {batch}")
    return kv_bytes_per_token_per_layer(model, dtype) * model.layers * seqlen * batch


def attention_problem(model: ModelShape, seqlen: int, batch: int = 1, dtype: str = "fp16") -> AttentionProblem:
    """One layer's prefill attention over `seqlen` tokens (causal)."""
    return AttentionProblem(batch=batch, heads=model.heads, kv_heads=model.kv_heads, seqlen_q=seqlen,
                            head_dim=model.head_dim, causal=True, dtype=dtype)


def workspace_by_tensor(algo: str, problem: AttentionProblem) -> dict[str, int]:
    """Bytes of every HBM tensor of `algo`'s schedule other than Q, K, V, O."""
    tensors = algorithms.build(algo, problem).tensors
    return {name: t.nbytes for name, t in tensors.items() if name not in IO_TENSORS}


def workspace_bytes(algo: str, model: ModelShape, seqlen: int, batch: int = 1,
                    dtype: str = "fp16") -> int:
    """Peak attention workspace in HBM for one layer's prefill."""
    return sum(workspace_by_tensor(algo, attention_problem(model, seqlen, batch, dtype)).values())


def table(model: ModelShape, seqlens, batch: int = 1, dtype: str = "fp16",
          algos=WORKSPACE_ALGOS) -> list[dict]:
    """Rows per sequence length: KV cache of the model and of its MHA twin,
    and the attention workspace of each algorithm."""
    rows = []
    mha = model.mha()
    for n in seqlens:
        row = {"model": model.name, "layers": model.layers, "heads": model.heads,
               "kv_heads": model.kv_heads, "head_dim": model.head_dim, "dtype": dtype,
               "batch": batch, "seqlen": n,
               "kv_bytes_per_token_per_layer": kv_bytes_per_token_per_layer(model, dtype),
               "kv_cache_bytes": kv_cache_bytes(model, n, batch, dtype),
               "kv_cache_mha_bytes": kv_cache_bytes(mha, n, batch, dtype)}
        for algo in algos:
            row[f"workspace_{algo}_bytes"] = workspace_bytes(algo, model, n, batch, dtype)
        rows.append(row)
    return rows


def human(n: float) -> str:
    """Binary units: 32768 -> '32 KiB'."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(n) < 1024 or unit == "PiB":
            return f"{n:.0f} {unit}" if unit == "B" or n == int(n) else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


# GPU memory for reference lines in the figure (datasheets).
GPU_MEMORY = {"A100-40GB": 40e9, "H100 / A100-80GB": 80e9}


def plot(rows: list[dict], title: str):
    from .artifacts import pyplot

    plt = pyplot()
    seq = [r["seqlen"] for r in rows]
    fig, ax = plt.subplots(figsize=(7.2, 4.6))
    kind = "GQA" if rows[0]["kv_heads"] != rows[0]["heads"] else "MHA"
    ax.plot(seq, [r["kv_cache_bytes"] for r in rows], "-o", color="#2ca02c", ms=3,
            label=f"KV cache, all layers ({kind}, {rows[0]['kv_heads']} KV heads)")
    if kind != "MHA":
        ax.plot(seq, [r["kv_cache_mha_bytes"] for r in rows], "--o", color="#2ca02c", ms=3,
                alpha=0.6, label=f"KV cache, all layers (MHA, {rows[0]['heads']} KV heads)")
    styles = {"standard": ("#8c8c8c", "standard attention workspace (S and P, O(N²))"),
              "fa1": ("#1f77b4", "FA1 workspace (fp32 O, m, l: O(N·d))"),
              "fa2": ("#ff7f0e", "FA2/FA3 workspace (logsumexp: O(N))")}
    for algo, (color, label) in styles.items():
        key = f"workspace_{algo}_bytes"
        if key in rows[0]:
            ax.plot(seq, [r[key] for r in rows], "-s", color=color, ms=3, label=label + ", one layer")
    for i, (name, cap) in enumerate(GPU_MEMORY.items()):
        ax.axhline(cap, color="k", lw=0.7, ls=":")
        ax.text(seq[-1], cap * (0.9 if i == 0 else 1.1), f"{name} HBM", fontsize=7, ha="right",
                va="top" if i == 0 else "bottom")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("sequence length (tokens)")
    ax.set_ylabel("bytes")
    ax.set_title(title, fontsize=9)
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    return fig
