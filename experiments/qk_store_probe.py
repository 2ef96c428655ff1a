"""How standard's QKᵀ GEMM writes S, timed on the GPU: masked stores from
registers against one TMA bulk store per tile (kernels/standard.py,
TMA_STORE), one CTA a tile against a persistent kernel whose CTAs loop
over tiles (qk_programs) or against one CTA a row block of S that loads Q
once and streams K (qk_rows), over a few tile configs. QKᵀ is the launch of
standard that missed its bound by most (1.46x, kernels/NOTES.md): its bound
is writing S.

    PYTHONPATH=. python experiments/qk_store_probe.py --out $OUT/qk_store_probe_h100.csv [--variants tma|persistent|rows]

Each row: the launch's median time (do_bench), its bound max(FLOPs / 703
TFLOP/s, bytes / 3.02 TB/s) as kernels.bench computes it, and S's largest
difference from the first variant's S.
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from algorithms.problem import TileConfig  # noqa: E402
from experiments import gpu_probe  # noqa: E402

SEQLENS = (4096, 8192, 16384)
HEAD_DIM = 128
DEFAULT = TileConfig(block_m=128, block_n=128, num_warps=8, num_stages=3, block_k=64)
W8S2 = TileConfig(block_m=128, block_n=128, num_warps=8, num_stages=2, block_k=64)
W4S2 = TileConfig(block_m=128, block_n=128, num_warps=4, num_stages=2, block_k=64)
# (config, tma_store, persistent CTAs per SM or None, qk_rows) per run of the probe
VARIANTS = {
    # session 9: masked against TMA stores
    "tma": [(cfg, tma, None, False) for cfg in (
        DEFAULT, TileConfig(block_m=128, block_n=128, num_warps=4, num_stages=3, block_k=64),
        TileConfig(block_m=128, block_n=256, num_warps=8, num_stages=3, block_k=64),
        TileConfig(block_m=128, block_n=128, num_warps=8, num_stages=2, block_k=128)) for tma in (False, True)],
    # session 11: one CTA a tile against persistent CTAs (8 warps at 130-148
    # registers a thread fit one CTA an SM; 4 warps, two or three)
    "persistent": [(DEFAULT, False, None, False), (W8S2, False, None, False), (W4S2, False, None, False),
                   (TileConfig(block_m=128, block_n=64, num_warps=4, num_stages=2, block_k=64), False, None, False),
                   (DEFAULT, False, 1, False), (W8S2, False, 1, False), (W8S2, False, 2, False),
                   (W4S2, False, 2, False), (W4S2, False, 3, False)],
    # session 13: one CTA a row block of S (Q once, K streamed) against the tiled default
    "rows": [(DEFAULT, False, None, False)] + [
        (TileConfig(block_m=bm, block_n=bn, num_warps=w, num_stages=st, block_k=64), False, None, True)
        for bm, bn, w, st in ((128, 128, 8, 3), (128, 128, 8, 2), (128, 64, 8, 3), (128, 64, 8, 4),
                              (128, 64, 4, 3), (64, 128, 4, 3), (64, 64, 4, 4), (128, 128, 4, 2))],
}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--variants", choices=sorted(VARIANTS), default="persistent")
    a = ap.parse_args(argv)
    if gpu_probe.start("qk_store_probe.py", a.out, argv) is None:
        return 2
    import torch
    import triton

    from kernels import standard
    from kernels.bench import HBM_CEILING, MATMUL_CEILING
    from kernels.provenance import provenance, write_csv_atomic

    prov = provenance(f"python experiments/qk_store_probe.py --variants {a.variants}")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows = []
    for n in SEQLENS:
        b, h = 16384 // n, 2048 // HEAD_DIM
        q, k, v = (torch.randn(b, h, n, HEAD_DIM, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        reference = None
        for cfg, tma, per_sm, rows_kernel in VARIANTS[a.variants]:
            programs = None if per_sm is None else per_sm * sms
            label = _label(cfg) + ("" if per_sm is None else f"_persistent{per_sm}") + ("_rows" if rows_kernel else "")
            try:
                name, fn, flops, nbytes = standard.launches(q, k, v, config=cfg, tma_store=tma,
                                                            qk_programs=programs, qk_rows=rows_kernel)[0]
                fn()
                torch.cuda.synchronize()
                ms = triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")
            except Exception as e:  # noqa: BLE001 (a config that does not fit is a row too)
                rows.append({"seqlen": n, "config": label, "tma_store": int(tma), "ms": "",
                             "bound_ms": "", "ratio": "", "error": f"{type(e).__name__}: {e}"[:200],
                             **prov})
                print(f"N{n} {label} tma={int(tma)}: {type(e).__name__}", flush=True)
                continue
            del fn
            # S against the first config's masked stores (block_k changes
            # the order of the sums: bf16 rounding apart, they agree)
            out = standard.forward(q, k, v, config=cfg, tma_store=tma, qk_programs=programs,
                                   qk_rows=rows_kernel, keep_intermediates=True)[1][0]
            if reference is None:
                reference = out
            diff = (out - reference).abs().max().item()
            bound_ms = max(flops / MATMUL_CEILING, nbytes / HBM_CEILING) * 1e3
            rows.append({"seqlen": n, "config": label, "tma_store": int(tma), "ms": f"{ms:.5f}",
                         "bound_ms": f"{bound_ms:.5f}", "ratio": f"{ms / bound_ms:.3f}",
                         "s_max_abs_diff": diff, "error": "", **prov})
            print(f"N{n} {label} tma={int(tma)}: {ms:.3f} ms, bound {bound_ms:.3f}, "
                  f"ratio {ms / bound_ms:.2f}, S max |diff| {diff:.3g}", flush=True)
            del out
            torch.cuda.empty_cache()
        del q, k, v, reference
        torch.cuda.empty_cache()
    fields = sorted({key for row in rows for key in row}, key=lambda f: (f in prov, f))
    write_csv_atomic(a.out, rows, fields)
    print(f"wrote {a.out}")
    return 0


def _label(cfg: TileConfig) -> str:
    return f"{cfg.block_m}x{cfg.block_n}w{cfg.num_warps}s{cfg.num_stages}k{cfg.block_k}"


if __name__ == "__main__":
    sys.exit(main())
