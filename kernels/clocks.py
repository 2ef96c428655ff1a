"""Reading the GPU's clocks and an SM's id from inside a Triton kernel, for
diagnostics (kernels/fa2.py's `stamps=`, experiments/lockstep_probe.py).

Each reads its register once `after` (int32, scalar or tensor) is computed:
the dependence is what places the read in the kernel's order.

  global_timer  the global timer, ns (%globaltimer);
  sm_clock      the SM's cycle counter (%clock64);
  sm_id         the SM the CTA runs on (%smid).
"""
import triton
import triton.language as tl


@triton.jit
def global_timer(after):
    return tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l,r", [after], dtype=tl.int64,
                                     is_pure=False, pack=1)


@triton.jit
def sm_clock(after):
    return tl.inline_asm_elementwise("mov.u64 $0, %clock64;", "=l,r", [after], dtype=tl.int64,
                                     is_pure=False, pack=1)


@triton.jit
def sm_id(after):
    return tl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r,r", [after], dtype=tl.int32,
                                     is_pure=False, pack=1)
