"""NVML read on a thread while GPU work runs: the SM clock, the board's power,
and whether the power cap is what holds the clock down.

The H100 runs short bursts at its top clock (1980 MHz) and lowers the clock
once its power stays over the 700 W limit: a tl.dot loop on every SM settles at
1650 MHz, fa2 at 1710-1920 by config, after a few hundred ms of back-to-back
launches (experiments/clock_power.py, clock_power_h100.csv).

NVML's clock is the one the power controller sets, not always the one the SMs
count: under fa2 it reads 1980 MHz while the SMs count 1755-1790 cycles a µs of
event time (clock64 from each SM's first CTA start to its last CTA end,
clock_span_h100.csv); under a tl.dot loop capped at 1665 MHz the two agree.
Take the clock a kernel runs at from its own counters against CUDA events, not
from here; what this gives is the controller's state and the board's power.

    monitor = GpuMonitor.open()      # None where NVML is missing
    monitor.start(); ...; t0 = time.perf_counter(); work(); t1 = ...
    monitor.window(t0, t1)           # medians over [t0, t1]
    monitor.stop()

Imports nothing of the simulator (the GPU image has no simpy).
"""
from __future__ import annotations

import statistics
import threading
import time

SAMPLE_S = 0.002     # read period; NVML answers in ~20 us
# NVML clock event reasons (nvml.h, nvmlClocksEventReason*) meaning the power cap holds the clock
SW_POWER_CAP = 0x4
HW_POWER_BRAKE = 0x80
WINDOW_FIELDS = ("clock_mhz", "clock_p10", "clock_p90", "power_w", "power_cap_share", "samples")


class GpuMonitor:
    """(time, SM MHz, board W, clock event reasons) of GPU 0 every SAMPLE_S."""

    def __init__(self, nvml, handle):
        self.nv, self.h = nvml, handle
        self.samples: list[tuple] = []
        self._stop = threading.Event()
        self._thread = None
        self._reasons = (getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
                         or getattr(nvml, "nvmlDeviceGetCurrentClocksThrottleReasons"))

    @classmethod
    def open(cls):
        """A monitor of GPU 0, or None where NVML cannot be used."""
        try:
            import pynvml
            pynvml.nvmlInit()
            return cls(pynvml, pynvml.nvmlDeviceGetHandleByIndex(0))
        except Exception:
            return None

    def power_limit_w(self) -> float | str:
        try:
            return self.nv.nvmlDeviceGetEnforcedPowerLimit(self.h) / 1e3
        except Exception:
            return ""

    def _loop(self) -> None:
        nv, h, reasons = self.nv, self.h, self._reasons
        while not self._stop.is_set():
            try:
                self.samples.append((time.perf_counter(), nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM),
                                     nv.nvmlDeviceGetPowerUsage(h) / 1e3, reasons(h)))
            except Exception:
                pass
            time.sleep(SAMPLE_S)

    def start(self) -> "GpuMonitor":
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def window(self, t0: float, t1: float) -> dict:
        """Medians (and the clock's 10th/90th percentiles) of the samples in
        [t0, t1] (time.perf_counter()), the share of them the power cap held;
        blanks where there are none. Samples before t0 are dropped."""
        got = [s for s in self.samples if t0 <= s[0] <= t1]
        self.samples = [s for s in self.samples if s[0] >= t0]
        if not got:
            return {**{k: "" for k in WINDOW_FIELDS}, "samples": 0}
        clocks = sorted(s[1] for s in got)
        capped = sum(1 for s in got if s[3] & (SW_POWER_CAP | HW_POWER_BRAKE))
        return {"clock_mhz": statistics.median(clocks), "clock_p10": clocks[len(clocks) // 10],
                "clock_p90": clocks[(9 * len(clocks)) // 10],
                "power_w": round(statistics.median(s[2] for s in got), 1),
                "power_cap_share": round(capped / len(got), 3), "samples": len(got)}
