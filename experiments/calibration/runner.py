"""The GPU side's harness: a Runner holds the device, its provenance and the rows
measured; ClockSampler reads NVML's SM clock on a thread while a benchmark runs;
the clock helpers turn a kernel's clock64 and global-timer stamps into the clock
its SMs ran at.
"""
from __future__ import annotations

import datetime as _dt
import os
import statistics
import subprocess
import sys
import threading
import time

from . import ROOT

# SMEM the driver reserves for every resident CTA on sm_80 and later (CUDA C++
# Programming Guide, compute capabilities table: 1 KB reserved shared memory
# per block); hw_profiles' residency.smem_reserved_per_cta_bytes is the same
SMEM_RESERVED_PER_CTA = 1024


class ClockSampler:
    """Samples the SM clock through NVML on a thread while a benchmark runs."""

    def __init__(self, handle, period_s=0.005):
        self.h, self.period, self.samples = handle, period_s, []
        self._stop = threading.Event()

    def __enter__(self):
        import pynvml

        def loop():
            while not self._stop.is_set():
                try:
                    self.samples.append(pynvml.nvmlDeviceGetClockInfo(self.h, pynvml.NVML_CLOCK_SM))
                except Exception:
                    pass
                time.sleep(self.period)

        self._t = threading.Thread(target=loop, daemon=True)
        self._t.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()

    @property
    def mhz(self):
        s = [x for x in self.samples if x > 0]
        return float(statistics.median(s)) if s else None


class Runner:
    def __init__(self, args):
        import torch

        self.args = args
        self.torch = torch
        self.rows: list[dict] = []
        self.dev = torch.device("cuda")
        props = torch.cuda.get_device_properties(0)
        self.props = props
        self.sms = props.multi_processor_count
        self.nvml = None
        try:
            import pynvml
            pynvml.nvmlInit()
            self.nvml = pynvml.nvmlDeviceGetHandleByIndex(0)
        except Exception as e:  # pragma: no cover
            print(f"[calibrate] NVML unavailable: {e}", file=sys.stderr)
        self.prov = self._provenance()
        self.timing = None      # set by event_loop, noted by the next add()

    def _provenance(self):
        import torch
        import triton
        try:
            import cupy
            cupy_v = cupy.__version__
        except Exception:
            cupy_v = ""
        driver = clock = maxclock = ""
        if self.nvml is not None:
            import pynvml
            driver = pynvml.nvmlSystemGetDriverVersion()
            driver = driver.decode() if isinstance(driver, bytes) else driver
            clock = pynvml.nvmlDeviceGetClockInfo(self.nvml, pynvml.NVML_CLOCK_SM)
            maxclock = pynvml.nvmlDeviceGetMaxClockInfo(self.nvml, pynvml.NVML_CLOCK_SM)
        commit = os.environ.get("GPUSIM_GIT_COMMIT", "")
        if not commit:
            try:
                commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "HEAD"], capture_output=True,
                                        text=True).stdout.strip()
            except Exception:
                commit = ""
        return {"gpu": self.props.name, "sm_count": self.sms, "sm_clock_mhz": clock,
                "max_sm_clock_mhz": maxclock, "driver": driver, "cuda": torch.version.cuda,
                "torch": torch.__version__, "triton": triton.__version__, "cupy": cupy_v,
                "git_commit": commit or "unknown",
                "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
                "command": "PYTHONPATH=. python3 experiments/calibrate.py " + " ".join(sys.argv[1:])}

    def nvml_clock(self):
        """NVML's SM clock now (MHz), None without NVML. Under a tl.dot loop held by the
        power cap it matches the clock the SMs count (clock_stamped_h100.csv)."""
        if self.nvml is None:
            return None
        import pynvml
        try:
            return float(pynvml.nvmlDeviceGetClockInfo(self.nvml, pynvml.NVML_CLOCK_SM))
        except Exception:
            return None

    def sampler(self):
        if self.nvml is None:
            class _Null:
                mhz = None

                def __enter__(s):
                    return s

                def __exit__(s, *e):
                    pass
            return _Null()
        return ClockSampler(self.nvml)

    def smem_fits(self, per_sm: int, smem_bytes: int) -> bool:
        """Do `per_sm` CTAs of `smem_bytes` each fit one SM's shared memory?"""
        return per_sm * (smem_bytes + SMEM_RESERVED_PER_CTA) <= int(self.props.shared_memory_per_multiprocessor)

    def add(self, bench, param, value, unit, clock=None, kclock=None, detail=""):
        if self.timing:     # how the figure was timed, when event_loop timed it
            detail = f"{detail}; timed by {self.timing}" if detail else f"timed by {self.timing}"
            self.timing = None
        row = {"bench": bench, "param": param, "value": f"{value:.6g}" if isinstance(value, float) else value,
               "unit": unit, "clock_mhz_nvml": f"{clock:.0f}" if clock else "",
               "clock_mhz_kernel": f"{kclock:.0f}" if kclock else "", "detail": detail}
        row.update(self.prov)
        self.rows.append(row)
        print(f"  {bench:<22} {str(param):<26} {row['value']:>12} {unit:<12} "
              f"nvml {row['clock_mhz_nvml'] or '-':>5} MHz  kernel {row['clock_mhz_kernel'] or '-':>5} MHz"
              f"  {detail}", file=sys.stderr, flush=True)

    # timing helpers -------------------------------------------------------
    def do_bench(self, fn, warmup=25, rep=200):
        import triton
        return triton.testing.do_bench(fn, warmup=warmup, rep=rep, return_mode="median")

    def event_loop(self, fn, n=20, warm=3, host_cover=True):
        """Median ms of fn over n calls with events around each, no cache flush (for
        working sets that should stay in L2). Each call waits for the last, so
        without cover the GPU sits idle between the start event and the kernel
        while the host launches it: some 30 us of Triton's launch path in every
        figure (an empty launch: 33-39 us in two runs, against do_bench's
        4.8-5.0; calibrate.py launch_fill).
        host_cover (the default since session 12) queues a 100 us GPU sleep
        before the start event, so the host has launched fn before the GPU
        reaches it. Rows timed before session 12 were taken without it; every
        row says which (Runner.add appends the timing)."""
        torch = self.torch
        self.timing = "event_loop behind a 100 us GPU sleep" if host_cover else "event_loop, uncovered"
        for _ in range(warm):
            fn()
        # 100 us of GPU clocks at the device's top clock from NVML, else the H100's
        # 1980 MHz (torch.cuda._sleep counts clocks)
        cover = int(100e-6 * float(self.prov.get("max_sm_clock_mhz") or 1980) * 1e6)
        times = []
        for _ in range(n):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            if host_cover:
                torch.cuda._sleep(cover)
            s.record()
            fn()
            e.record()
            e.synchronize()
            times.append(s.elapsed_time(e))
        return statistics.median(times)


def cta_clock_runs(torch, fn, clk, launches: int) -> list[float]:
    """fn once to compile and warm, then `launches` more times: after each,
    the median over CTAs of the clock64 count each wrote into clk."""
    import numpy as np
    fn()
    torch.cuda.synchronize()
    runs = []
    for _ in range(launches):
        fn()
        torch.cuda.synchronize()
        runs.append(float(np.median(clk.cpu().numpy())))
    return runs


def stamped_clock(clk) -> tuple[float, float]:
    """(MHz, cycles) from CLK of clock_stamp: per CTA [clock64, timer ns] at its
    start and end; the medians over CTAs of cycles per ns (x 1000) and of
    cycles from start to end."""
    import numpy as np
    a = clk.cpu().numpy().reshape(-1, 4).astype(np.float64)
    cycles, ns = a[:, 2] - a[:, 0], a[:, 3] - a[:, 1]
    good = (ns > 0) & (cycles > 0)
    if not good.any():
        return float("nan"), float("nan")
    return float(np.median(cycles[good] / ns[good]) * 1e3), float(np.median(cycles[good]))


def _clock_of(clk):
    """SM clock (MHz) from per-block (clock64 cycles, globaltimer ns) pairs
    (stamp's; of stamp_span's buffer, pass its first half)."""
    import numpy as np
    a = np.asarray(clk).reshape(-1, 2).astype(np.float64)
    cyc, ns = a[:, 0], a[:, 1]
    good = ns > 0
    return float(np.median(cyc[good] / ns[good]) * 1e3), float(np.median(cyc[good]))


def spanned_rate(clk, work_per_block: float) -> tuple[float, int]:
    """Work a clock an SM, each SM by its own clock64 (stamp_span's buffer):
    its blocks' work over the cycles from its first block's start to its
    last one's end, whatever the clock ran at and however many blocks it
    held at once; the median over SMs, and how many SMs."""
    import numpy as np
    cycles_ns, start_sm = np.asarray(clk).reshape(2, -1)
    cycles = cycles_ns.reshape(-1, 2)[:, 0].astype(np.float64)
    start, sm = start_sm.reshape(-1, 2).T.astype(np.float64)
    rates = []
    for s in np.unique(sm):
        mine = sm == s
        span = float(np.max(start[mine] + cycles[mine]) - np.min(start[mine]))
        if span > 0:
            rates.append(work_per_block * int(mine.sum()) / span)
    return (float(np.median(rates)), len(rates)) if rates else (float("nan"), 0)
