"""How many CTAs of a launch fit on one SM, and what limits them."""
from __future__ import annotations

from dataclasses import dataclass

from algorithms.errors import DoesNotFit
from algorithms.schedule import Launch

from .profile import HardwareProfile

WARP_SIZE = 32


@dataclass(frozen=True)
class Occupancy:
    ctas_per_sm: int
    limiter: str  # "smem", "registers", "threads" or "cta_slots"

    def waves(self, grid: int, sm_count: int) -> float:
        """grid ÷ (SMs × CTAs per SM): 2.25 means two full waves and a quarter-full tail."""
        return grid / (sm_count * self.ctas_per_sm)


def occupancy(launch: Launch, gpu: HardwareProfile) -> Occupancy:
    res = gpu.residency
    if launch.smem_bytes > res.smem_per_block_bytes:
        raise DoesNotFit("shared memory", launch.smem_bytes, res.smem_per_block_bytes, launch.name)
    # a warp's registers are allocated in whole units (256 on sm_80/sm_90)
    unit = res.register_alloc_unit
    regs_per_warp = -(-launch.regs_per_thread * WARP_SIZE // unit) * unit
    regs_per_cta = regs_per_warp * -(-launch.threads // WARP_SIZE)
    if launch.threads > res.max_threads_per_sm or regs_per_cta > res.registers_per_sm:
        raise DoesNotFit("registers", regs_per_cta, res.registers_per_sm, launch.name)
    limits = {
        "cta_slots": res.max_ctas_per_sm,
        "threads": res.max_threads_per_sm // launch.threads,
        "registers": res.registers_per_sm // regs_per_cta,
        # CUDA reserves smem_reserved_per_cta_bytes for every resident CTA.
        "smem": res.smem_per_sm_bytes // (launch.smem_bytes + res.smem_reserved_per_cta_bytes),
    }
    limiter = min(limits, key=lambda k: (limits[k], k != "smem"))
    return Occupancy(limits[limiter], limiter)
