"""What does do_bench's L2 flush leave for the timed kernel to write back? A probe, timed on the GPU (and counted by ncu).

triton.testing.do_bench clears L2 before each timed call by zeroing a
256 MB buffer (Triton 3.6: driver.clear_cache is cache.zero_()), then
records the start event and calls the kernel. L2 is write-back: the
zeroing's last lines may still sit in it, dirty, when the timed kernel
starts, and the kernel's own lines then evict them to HBM inside the timed
window. Every validation row was timed that way (validate.py measure,
kernels/bench.py). The model starts each prediction from an empty L2.

The probe times a kernel that only reads S bytes (each CTA its own part, in
16 KB pieces) after each of three flushes, with events placed as do_bench
places them:
- `zero`: do_bench's own (the 256 MB buffer zeroed);
- `read`: the 256 MB buffer read instead (L2 then holds clean lines);
- `zero_idle`: do_bench's, then the GPU sleeps IDLE_CYCLES before the timed read
  (does L2 write its dirty lines back while nothing else runs?).
With --ncu, ncu (`--cache-control none`, so that it keeps the flush's lines;
`--clock-control none`) counts the read kernel's DRAM bytes after `zero` and
after `read`. Nothing here is an attention kernel: rows may feed the model.

    PYTHONPATH=. python experiments/flush_probe.py --out $OUT/flush_probe_h100.csv [--ncu]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys

import triton
import triton.language as tl

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import kernels.common  # noqa: E402,F401  (its fix lets Triton's interpreter loop over a scalar)

FLUSH_BYTES = 256 * 2 ** 20     # Triton 3.6's get_empty_cache_for_benchmark buffer
PIECE = 4096                    # fp32 elements a CTA reads at once (16 KB)
CTAS_PER_SM = 4
READ_MB = (2, 8, 16, 32, 48, 64, 96, 128, 256)
NCU_READ_MB = (8, 32, 64, 256)
IDLE_CYCLES = 400_000          # the zero_idle flush's sleep: at least 200 us at the H100's clocks (<= 1.98 GHz)
REPS = 30
FLUSHES = ("zero", "read", "zero_idle")
NCU_METRICS = ["dram__bytes_read.sum", "dram__bytes_write.sum"]


@triton.jit
def _stream_read(X, OUT, pieces, PIECE: tl.constexpr):
    pid = tl.program_id(0)
    offs = tl.arange(0, PIECE)
    base = pid.to(tl.int64) * pieces * PIECE
    acc = tl.zeros([PIECE], dtype=tl.float32)
    for c in range(pieces):
        acc += tl.load(X + base + c * PIECE + offs)
    tl.store(OUT + pid, tl.sum(acc, axis=0))    # one value a CTA: the kernel's writes stay negligible


def read_layout(nbytes: int, sms: int, piece: int = PIECE) -> tuple[int, int]:
    """(CTAs, pieces a CTA) reading nbytes of fp32 in pieces of `piece`
    elements: up to CTAS_PER_SM CTAs an SM, each at least one piece."""
    per_piece = piece * 4
    ctas = max(1, min(CTAS_PER_SM * sms, nbytes // per_piece))
    return ctas, max(1, nbytes // (ctas * per_piece))


class Case:
    """A read of about `mb` MB (whole pieces: nbytes) and the three flushes, on the GPU."""

    def __init__(self, mb: int):
        import torch

        self.torch = torch
        sms = torch.cuda.get_device_properties(0).multi_processor_count
        self.ctas, self.pieces = read_layout(mb << 20, sms)
        self.nbytes = self.ctas * self.pieces * PIECE * 4
        self.x = torch.randn(self.ctas * self.pieces * PIECE, device="cuda", dtype=torch.float32)
        self.out = torch.empty(self.ctas, device="cuda", dtype=torch.float32)
        # as do_bench's: int32, zeroed by cache.zero_()
        self.cache = torch.empty(FLUSH_BYTES // 4, device="cuda", dtype=torch.int32)

    def read(self) -> None:
        _stream_read[(self.ctas,)](self.x, self.out, self.pieces, PIECE=PIECE, num_warps=4)

    def flush(self, how: str) -> None:
        if how == "read":
            self.cache.sum()            # (a torch kernel: ncu's filter sees only _stream_read)
            return
        self.cache.zero_()
        if how == "zero_idle":
            self.torch.cuda._sleep(IDLE_CYCLES)

    def time_ms(self, how: str, reps: int = REPS) -> list[float]:
        torch = self.torch
        self.read()                     # compiled and warm
        torch.cuda.synchronize()
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        for s, e in zip(starts, ends):
            self.flush(how)
            s.record()
            self.read()
            e.record()
        torch.cuda.synchronize()
        return [s.elapsed_time(e) for s, e in zip(starts, ends)]


def target(spec: str) -> None:
    """Runs under ncu: `flush:mb` -- the read (compiles), the flush, the read again."""
    how, mb = spec.split(":")
    case = Case(int(mb))
    case.read()
    case.flush(how)
    case.read()
    case.torch.cuda.synchronize()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="results CSV")
    ap.add_argument("--ncu", action="store_true", help="also count DRAM bytes with ncu (--cache-control none)")
    ap.add_argument("--target", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.target:
        target(a.target)
        return 0
    if not a.out:
        print("flush_probe: --out is required (the results CSV)", file=sys.stderr)
        return 2
    import torch

    from experiments.gpu_probe import start
    from gpusim.artifacts import write_csv

    prov = start("flush_probe.py", a.out, argv, ncu=a.ncu)
    if prov is None:
        return 2
    rows = []
    for mb in READ_MB:
        case = Case(mb)
        for how in FLUSHES:
            times = case.time_ms(how)
            ms = statistics.median(times)
            rows.append({"flush": how, "read_bytes": case.nbytes, "ctas": case.ctas, "reps": len(times),
                         "ms": round(ms, 5), "ms_min": round(min(times), 5), "ms_max": round(max(times), 5),
                         "gb_per_s": round(case.nbytes / (ms * 1e-3) / 1e9, 1),
                         "dram_read_bytes": "", "dram_write_bytes": "", **prov})
            print(f"{how:9s} {case.nbytes / 1e6:6.1f} MB: {ms * 1e3:8.1f} us "
                  f"({case.nbytes / (ms * 1e-3) / 1e9:6.0f} GB/s)", flush=True)
        del case
        torch.cuda.empty_cache()
    if a.ncu:
        from experiments.ncu_counters import counter_bytes, second_launch

        sms = torch.cuda.get_device_properties(0).multi_processor_count
        for mb in NCU_READ_MB:
            ctas, pieces = read_layout(mb << 20, sms)     # as target()'s Case reads
            for how in ("zero", "read"):
                got = second_launch(os.path.abspath(__file__), f"{how}:{mb}", "_stream_read", NCU_METRICS,
                                    cache_control="none")
                rows.append({"flush": f"ncu_{how}", "read_bytes": ctas * pieces * PIECE * 4, "ctas": ctas, "reps": 1,
                             "ms": "", "ms_min": "", "ms_max": "", "gb_per_s": "",
                             "dram_read_bytes": counter_bytes(got, NCU_METRICS[0]),
                             "dram_write_bytes": counter_bytes(got, NCU_METRICS[1]), **prov})
                print(f"ncu {how:5s} {ctas * pieces * PIECE * 4 / 1e6:6.1f} MB: DRAM read {rows[-1]['dram_read_bytes'] / 1e6:.1f} MB, "
                      f"write {rows[-1]['dram_write_bytes'] / 1e6:.1f} MB", flush=True)
    write_csv(a.out, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
