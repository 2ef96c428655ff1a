"""How fast does HBM move FA1's traffic with nothing else in the way? A probe, timed on the GPU.

kernels/fa1.py's inner step reads a Q block (bf16) and the running O (fp32),
l and m of that block, and writes O, l and m back to the same addresses; its
CTAs (one a head) walk every Q block once per K/V block. This kernel does the
same loads and stores in the same order over the same buffers, one CTA a head
and the same grid, with no products and no softmax (O += Q, so that the
stores depend on the loads). Variants:
- `rmw`: FA1's traffic, O, l, m written back where they were read;
- `read`: the same loads, no stores;
- `copy`: the same loads, the stores to a second set of buffers;
- `fa1`: kernels/fa1.py itself on the same grid (bf16 Q, K, V; its bytes
  counted as `rmw`'s, FA1's K/V reads aside), to set the probe beside it.
With `--grids`, one batch and a head count per grid of 132, 264, 396 and 512
CTAs: one, two and three CTAs an SM and the validation's 512 (FA1 holds three
an SM at D = 64, two at D = 128: triton_smem_fa1.csv), `rmw` and `fa1` each,
so that the time FA1 and its traffic take can be read against how many CTAs
share an SM.
Each row: the launch's median time (triton.testing.do_bench, L2 flushed
between calls), the bytes its loads and stores move, and what that is a
second. Nothing here feeds a profile: it says whether FA1's time at a shape
is HBM's under FA1's mix of reads and writes (validation_notes.md, session 31).

    PYTHONPATH=. python experiments/fa1_traffic_probe.py --out $OUT/fa1_traffic_probe_h100.csv
    PYTHONPATH=. python experiments/fa1_traffic_probe.py --compare experiments/results/fa1_traffic_grids_h100.csv \
        [--out predicted.csv]      (CPU: the model's FA1 beside each measured `fa1` row)
"""
from __future__ import annotations

import argparse
import os
import sys

import triton
import triton.language as tl

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from algorithms.problem import ACC_BYTES, DTYPE_BYTES, TileConfig  # noqa: E402
import kernels.common  # noqa: E402,F401  (its fix lets Triton's interpreter loop over a scalar)

VARIANTS = ("rmw", "read", "copy")
GRID_VARIANTS = ("rmw", "fa1")
# --grids: (seqlen, head_dim) at batch 1 and these head counts (CTAs)
GRID_SHAPES = ((1024, 64), (2048, 64), (4096, 64), (1024, 128))
GRID_CTAS = (132, 264, 396, 512)
# (batch, heads, seqlen, head_dim): the FA1 validation shapes at 16k tokens
# where the model misses most (B16 H32 N1024 D64: the CI guard's FA1 row)
SHAPES = ((16, 32, 1024, 64), (32, 32, 512, 64), (8, 32, 2048, 64), (16, 16, 1024, 128))
BLOCK = 64      # kernels/fa1.py's default block_m and block_n
WARPS = 4


@triton.jit
def _fa1_traffic(Q, OW, LW, MW, OW2, LW2, MW2, n_q,
                 HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, STORE: tl.constexpr, ELSEWHERE: tl.constexpr):
    bh = tl.program_id(0)
    q_base = bh.to(tl.int64) * n_q * HEAD_DIM
    r_base = bh.to(tl.int64) * n_q
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    blocks = tl.cdiv(n_q, BLOCK_M)  # Q blocks, and K/V blocks (block_n = block_m, self-attention)
    kept = tl.zeros([BLOCK_M], dtype=tl.float32)     # what `read` keeps of its loads
    for j in range(0, blocks):
        for i in range(0, blocks):
            rows = i * BLOCK_M + offs_m
            ok = rows < n_q
            off = q_base + rows[:, None] * HEAD_DIM + offs_d[None, :]
            q = tl.load(Q + off, mask=ok[:, None], other=0.0)
            o = tl.load(OW + off, mask=ok[:, None], other=0.0)
            l_i = tl.load(LW + r_base + rows, mask=ok, other=0.0)
            m_i = tl.load(MW + r_base + rows, mask=ok, other=0.0)
            o = o + q.to(tl.float32)
            l_i = l_i + 1.0
            m_i = tl.maximum(m_i, tl.max(o, 1))
            if STORE:
                if ELSEWHERE:
                    tl.store(OW2 + off, o, mask=ok[:, None])
                    tl.store(LW2 + r_base + rows, l_i, mask=ok)
                    tl.store(MW2 + r_base + rows, m_i, mask=ok)
                else:
                    tl.store(OW + off, o, mask=ok[:, None])
                    tl.store(LW + r_base + rows, l_i, mask=ok)
                    tl.store(MW + r_base + rows, m_i, mask=ok)
            else:
                kept += m_i + l_i
    if not STORE:
        # the loads stay live through one small store a CTA (BLOCK_M floats)
        tl.store(MW2 + r_base + offs_m, kept, mask=offs_m < n_q)


def traffic_bytes(batch: int, heads: int, seqlen: int, head_dim: int, variant: str) -> int:
    """Bytes FA1's inner loop moves over the whole launch (every Q block at
    every K/V block): Q (bf16) and O, l, m (fp32) read, O, l, m written
    unless `read`."""
    steps = batch * heads * seqlen // BLOCK * seqlen // BLOCK
    q = BLOCK * head_dim * DTYPE_BYTES["bf16"]
    olm = BLOCK * head_dim * ACC_BYTES + 2 * BLOCK * ACC_BYTES
    return steps * (q + olm + (0 if variant == "read" else olm))  # fa1: counted as rmw


def run(batch: int, heads: int, seqlen: int, head_dim: int, variant: str, device="cuda", buffers=None) -> float:
    """The launch's median time in ms (on the CPU, under TRITON_INTERPRET=1:
    one launch, nan). buffers: a dict that receives the workspaces, to check."""
    import torch

    bh = batch * heads
    q = torch.randn(bh, seqlen, head_dim, device=device, dtype=torch.bfloat16)
    ws = [torch.zeros(bh, seqlen, head_dim, device=device), torch.zeros(bh, seqlen, device=device),
          torch.zeros(bh, seqlen, device=device)]
    other = [torch.zeros_like(t) for t in ws]
    if buffers is not None:
        buffers.update(q=q, ws=ws, other=other)

    if variant == "fa1":
        from kernels.fa1 import forward

        k, v = (torch.randn_like(q).view(batch, heads, seqlen, head_dim) for _ in range(2))
        q4 = q.view(batch, heads, seqlen, head_dim)

        def launch():
            forward(q4, k, v, config=TileConfig(BLOCK, BLOCK, WARPS, 1))
    else:
        def launch():
            _fa1_traffic[(bh,)](q, *ws, *other, seqlen, HEAD_DIM=head_dim,
                                BLOCK_M=BLOCK, STORE=variant != "read", ELSEWHERE=variant == "copy",
                                num_warps=WARPS, num_stages=1)

    if device != "cuda":
        launch()
        return float("nan")
    return triton.testing.do_bench(launch, warmup=5, rep=50)


def compare(path: str, gpu: str, out: str | None) -> int:
    """The model's FA1 (kernels/fa1.py's default config, fast path) at each
    measured `fa1` row of `path`, printed and, given `out`, written."""
    import csv

    import gpusim
    from algorithms.errors import GpusimError
    from algorithms.problem import AttentionProblem
    from gpusim.artifacts import write_csv

    try:
        measured = [r for r in csv.DictReader(open(path)) if r.get("variant") == "fa1"]
        shapes = [(int(r["batch"]), int(r["heads"]), int(r["seqlen"]), int(r["head_dim"]), float(r["ms"]))
                  for r in measured]
    except (OSError, KeyError, ValueError) as e:
        print(f"fa1_traffic_probe: cannot read {path}: {e}", file=sys.stderr)
        return 2
    if not shapes:
        print(f"fa1_traffic_probe: {path} has no `fa1` rows to compare", file=sys.stderr)
        return 2
    rows = []
    for b, h, n, d, ms in shapes:
        problem = AttentionProblem(batch=b, heads=h, seqlen_q=n, head_dim=d)
        try:
            pred = gpusim.predict(problem, TileConfig(BLOCK, BLOCK, WARPS, 1), gpu, algo="fa1")
        except GpusimError as e:
            print(f"fa1_traffic_probe: {e}", file=sys.stderr)
            return 2
        err = pred.runtime_us / 1e3 / ms - 1
        rows.append({"batch": b, "heads": h, "seqlen": n, "head_dim": d, "measured_ms": ms,
                     "predicted_ms": round(pred.runtime_us / 1e3, 5), "error": round(err, 4),
                     "predicted_hbm_read_bytes": pred.hbm_read_bytes, "profile": gpu})
        print(f"B{b} H{h} N{n} D{d}: measured {ms:.3f} ms, predicted {pred.runtime_us / 1e3:.3f} ms "
              f"({err:+.1%}), HBM reads {pred.hbm_read_bytes / 1e9:.2f} GB", flush=True)
    if out:
        write_csv(out, rows)
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="the results CSV (required but with --compare, where it is optional)")
    ap.add_argument("--compare", metavar="CSV", help="no GPU: predict FA1 (profile --gpu) at each `fa1` row of "
                                                     "this results file and print it beside the measured time")
    ap.add_argument("--gpu", default="h100", help="the profile --compare predicts with (default h100)")
    ap.add_argument("--grids", action="store_true",
                    help="batch 1 at 132, 264, 396 and 512 CTAs, rmw and fa1 (see the docstring)")
    ap.add_argument("--cases", nargs="+", metavar="HxN",
                    help="batch 1, H heads (CTAs) at seqlen N, D = 64, rmw and fa1: e.g. 116x1024 "
                         "(one CTA an SM whose running O, l, m fill 45 MB of the 50 MB L2)")
    a = ap.parse_args(argv)
    if a.compare:
        return compare(a.compare, a.gpu, a.out)
    if not a.out:
        print("fa1_traffic_probe: --out is required (the results CSV)", file=sys.stderr)
        return 2
    try:
        picked = [tuple(int(x) for x in c.lower().split("x")) for c in a.cases or ()]
        if any(len(c) != 2 or min(c) < 1 for c in picked):
            raise ValueError
    except ValueError:
        print(f"fa1_traffic_probe: --cases takes HEADSxSEQLEN with positive integers, e.g. 116x1024; "
              f"got {' '.join(a.cases)}", file=sys.stderr)
        return 2
    from experiments.gpu_probe import start
    from gpusim.artifacts import write_csv

    prov = start("fa1_traffic_probe.py", a.out, argv)
    if prov is None:
        return 2
    rows = []
    if picked:
        cases = [(1, h, n, 64, v) for h, n in picked for v in GRID_VARIANTS]
    elif a.grids:
        cases = [(1, ctas, n, d, v) for n, d in GRID_SHAPES for ctas in GRID_CTAS for v in GRID_VARIANTS]
    else:
        cases = [(b, h, n, d, v) for b, h, n, d in SHAPES for v in VARIANTS]
    for b, h, n, d, variant in cases:
        ms = run(b, h, n, d, variant)
        nbytes = traffic_bytes(b, h, n, d, variant)
        rows.append({"batch": b, "heads": h, "seqlen": n, "head_dim": d, "variant": variant,
                     "ctas": b * h, "ms": round(ms, 5), "bytes": nbytes,
                     "tb_per_s": round(nbytes / ms / 1e9, 3), **prov})
        print(f"B{b} H{h} N{n} D{d} {variant:5s}: {ms:.4f} ms, {nbytes / 1e9:.2f} GB, "
              f"{nbytes / ms / 1e9:.2f} TB/s", flush=True)
    write_csv(a.out, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
