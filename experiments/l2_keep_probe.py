"""Which data read and written back does the H100's L2 keep from one pass to the next? A probe, timed on the GPU.

calibrate.py's l2_round_trip (4 CTAs an SM, each walking its own packed part
of the working set in 4 KB pieces) keeps about 50 MB: a byte's time is
half-way from L2's pace to HBM's at about 52 MB. FA1's traffic alone
(fa1_traffic_probe.py --cases: one CTA an SM, 16 KB tiles of O, each head's
part 2^k bytes apart) stops fitting near 35-40 MB. This probe walks the same
round trips and changes one thing at a time between the two: CTAs an SM
(1 or 4), the piece (4 or 16 KB), and the distance between CTAs' parts
(`packed`: each part right after the last; `pow2`: each part at the next
power of two, as a head's tensors are). Each row: the working set, the
launch's median time (triton.testing.do_bench) and the bytes a second read
and written. Nothing here feeds a profile by itself; it says which pattern
the profile's L2 capacity holds for (validation_notes.md, session 32).

    PYTHONPATH=. python experiments/l2_keep_probe.py --out $OUT/l2_keep_probe_h100.csv
"""
from __future__ import annotations

import argparse
import os
import sys

import triton
import triton.language as tl

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import kernels.common  # noqa: E402,F401  (its fix lets Triton's interpreter loop over a scalar)

# (CTAs an SM, piece in fp32 elements, layout): calibrate.py's pattern first,
# then one change at a time towards FA1's
PATTERNS = ((4, 1024, "packed"), (1, 1024, "packed"), (1, 4096, "packed"), (1, 4096, "pow2"),
            (4, 4096, "pow2"))
WORKING_SETS_MB = (16, 24, 32, 36, 40, 44, 48, 52, 56, 64, 96)


@triton.jit
def _round_trip(X, chunks, stride, passes, CHUNK: tl.constexpr, CLEAN_EVERY: tl.constexpr = 0):
    # CLEAN_EVERY k > 0: every k-th piece is only read (its lines stay clean,
    # as FA1's Q), the others read and written back (dirty, as its O)
    pid = tl.program_id(0)
    offs = tl.arange(0, CHUNK)
    base = pid.to(tl.int64) * stride
    kept = tl.zeros([CHUNK], dtype=tl.float32)
    for p in range(passes):
        for c in range(chunks):
            ptr = X + base + c * CHUNK + offs
            x = tl.load(ptr)
            if CLEAN_EVERY > 0 and c % CLEAN_EVERY == 0:
                kept += x
            else:
                tl.store(ptr, x + 1.0)
    if CLEAN_EVERY > 0:   # keeps the clean pieces' loads: one store a CTA, into its first piece
        tl.store(X + base + offs, kept)


def layout(ctas: int, chunk: int, ws_bytes: int, how: str) -> tuple[int, int]:
    """(pieces a CTA, elements between two CTAs' parts) for a working set of
    about ws_bytes over `ctas` CTAs."""
    chunks = max(1, round(ws_bytes / (ctas * chunk * 4)))
    part = chunks * chunk
    return chunks, part if how == "packed" else 1 << (part - 1).bit_length()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--patterns", nargs="+", metavar="CTAS:PIECE:LAYOUT",
                    help="instead of PATTERNS: CTAs an SM, piece in bytes (a multiple of 128), packed or pow2; "
                         "e.g. 2:4096:packed")
    a = ap.parse_args(argv)
    patterns = PATTERNS
    if a.patterns:
        try:
            patterns = []
            for spec in a.patterns:
                per_sm, piece, how = spec.split(":")
                per_sm, piece = int(per_sm), int(piece)
                if per_sm < 1 or piece < 128 or piece % 128 or piece & (piece - 1) or how not in ("packed", "pow2"):
                    raise ValueError
                patterns.append((per_sm, piece // 4, how))
        except ValueError:
            print(f"l2_keep_probe: --patterns takes CTAS:PIECE:LAYOUT (CTAs an SM >= 1, piece a power of two "
                  f">= 128 bytes, packed or pow2), e.g. 2:4096:packed; got {' '.join(a.patterns)}", file=sys.stderr)
            return 2
    import torch

    from experiments.gpu_probe import start
    from gpusim.artifacts import write_csv

    prov = start("l2_keep_probe.py", a.out, argv)
    if prov is None:
        return 2
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows = []
    for per_sm, chunk, how in patterns:
        ctas = sms * per_sm
        for mb in WORKING_SETS_MB:
            chunks, stride = layout(ctas, chunk, mb << 20, how)
            ws = ctas * chunks * chunk * 4
            x = torch.zeros(ctas * stride, device="cuda", dtype=torch.float32)
            passes = max(8, -(-(1 << 30) // (2 * ws)))

            def fn():
                _round_trip[(ctas,)](x, chunks, stride, passes, CHUNK=chunk, num_warps=4)

            ms = triton.testing.do_bench(fn, warmup=3, rep=30)
            rate = 2 * passes * ws / (ms * 1e-3) / 1e9
            rows.append({"ctas_per_sm": per_sm, "piece_bytes": chunk * 4, "layout": how, "ctas": ctas,
                         "pieces_per_cta": chunks, "part_stride_bytes": stride * 4, "working_set_bytes": ws,
                         "passes": passes, "ms": round(ms, 5), "gb_per_s": round(rate, 1), **prov})
            print(f"{per_sm}/SM {chunk * 4 // 1024:2d} KB {how:6s} {ws / 2**20:6.1f} MB: {ms:.4f} ms, "
                  f"{rate:.0f} GB/s", flush=True)
            del x
    write_csv(a.out, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
