"""`gpusim memory`: KV-cache bytes and attention workspace for a model shape.

    gpusim memory --model llama2-70b [--mha] [--batch 1] [--seqlen 4096] [--dtype fp16]
    gpusim memory --layers 32 --heads 32 --kv-heads 8 --head-dim 128 [--name my-model]

Writes <out>/memory_<model>.csv (one row per sequence length) and .png (bytes
over sequence length: KV cache with the model's K/V heads and with MHA,
workspace of standard attention vs FlashAttention).
"""
from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

from algorithms.errors import GpusimError
from algorithms.problem import DTYPE_BYTES

from ..artifacts import DEFAULT_RESULTS, parse_int_list, save_figure, write_csv
from ..memory import PRESETS, ModelShape, human, plot, preset, table

SEQLENS = ",".join(str(1 << k) for k in range(9, 18))  # 512 .. 131072


def register(subparsers) -> None:
    p = subparsers.add_parser("memory", help="KV-cache and attention-workspace bytes for a model shape")
    p.add_argument("--model", default=None,
                   help=f"preset: {', '.join(PRESETS)} (default llama2-70b unless all of "
                        "--layers --heads --head-dim are given)")
    p.add_argument("--name", default=None, help="name of a custom model")
    p.add_argument("--layers", type=int)
    p.add_argument("--heads", type=int)
    p.add_argument("--kv-heads", type=int, help="K/V heads (GQA/MQA); custom default: --heads")
    p.add_argument("--head-dim", type=int)
    p.add_argument("--mha", action="store_true", help="force one K/V head per query head")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--seqlen", type=int, default=4096, help="the sequence length to print")
    p.add_argument("--seqlens", default=SEQLENS, help="sequence lengths of the figure and CSV")
    p.add_argument("--dtype", default="fp16", choices=tuple(DTYPE_BYTES),
                   help="element type of K/V cache and of S/P (default fp16)")
    p.add_argument("--out", default=str(DEFAULT_RESULTS), help="output folder (default results/)")
    p.set_defaults(func=cmd_memory)


def model_from_args(a) -> ModelShape:
    custom = {k: getattr(a, k) for k in ("layers", "heads", "kv_heads", "head_dim")
              if getattr(a, k) is not None}
    if a.model is None and all(k in custom for k in ("layers", "heads", "head_dim")):
        model = ModelShape(a.name or "custom", custom["layers"], custom["heads"],
                           custom.get("kv_heads", custom["heads"]), custom["head_dim"])
    else:
        model = preset(a.model or "llama2-70b")
        if custom:
            model = replace(model, name=a.name or f"{model.name} (modified)", **custom)
    return model.mha() if a.mha else model


def cmd_memory(a) -> int:
    model = model_from_args(a)
    if a.batch < 1 or a.seqlen < 1:
        raise GpusimError(f"--batch and --seqlen must be positive, got {a.batch} and {a.seqlen}")
    seqlens = sorted(set(parse_int_list(a.seqlens, "--seqlens", minimum=1)))
    rows = table(model, seqlens, a.batch, a.dtype)
    here = table(model, [a.seqlen], a.batch, a.dtype)[0]
    print(f"{model.name}: {model.layers} layers, {model.heads} heads, {model.kv_heads} KV heads "
          f"({model.attention_kind}), head dim {model.head_dim}, {a.dtype}")
    if model.source != "custom":
        print(f"  source: {model.source}")
    per = here["kv_bytes_per_token_per_layer"]
    mha_per = per * model.heads // model.kv_heads
    print(f"  KV cache per token per layer: {human(per)} ({per} B)"
          + (f"; with MHA: {human(mha_per)} ({mha_per} B)" if mha_per != per else ""))
    print(f"  KV cache per token, all layers: {human(per * model.layers)}")
    print(f"  at batch {a.batch} x {a.seqlen} tokens: KV cache {human(here['kv_cache_bytes'])}"
          + (f" (MHA: {human(here['kv_cache_mha_bytes'])})" if mha_per != per else ""))
    print(f"  attention workspace of one layer's prefill ({a.seqlen} tokens, causal): "
          f"standard {human(here['workspace_standard_bytes'])} (S and P), "
          f"FA1 {human(here['workspace_fa1_bytes'])}, FA2/FA3 {human(here['workspace_fa2_bytes'])} "
          f"(logsumexp)")
    slug = re.sub(r"[^a-z0-9]+", "-", model.name.lower()).strip("-")
    out = Path(a.out)
    csv_path = write_csv(out / f"memory_{slug}.csv", rows)
    title = (f"{model.name}: {model.layers} layers, {model.heads} heads, {model.kv_heads} KV heads, "
             f"d={model.head_dim}, {a.dtype}, batch {a.batch}")
    png_path = save_figure(plot(rows, title), out / f"memory_{slug}.png")
    print(f"wrote {csv_path}\nwrote {png_path}")
    return 0
