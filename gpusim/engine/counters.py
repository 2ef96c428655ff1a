"""What the engine counts: each role's counter slots, and the units it reports.

A role's counters (core._Role.c) hold bytes, then seconds of service per
unit; a skipped loop or a ghost batch adds its extrapolated work to the same
slots. Sums of floats (durations, periods, counters) go through math.fsum,
which rounds exactly on every Python: 3.12's sum() compensates its rounding
and 3.11's does not, and the fast path's thresholds (skipping.STEADY_TOLERANCE,
ghosting.CONVERGED) turned that last bit into different predictions (standard
B1 H16 N16k D128: 12234 us on Python 3.12, 12884 on 3.11).
"""

# Counter slots per role: bytes, then seconds of service per unit.
REQ, MISS, STORE = 0, 1, 2
TENSOR, SFU, ALU, SMEM, PORT, L2, HBM = range(3, 10)
SCRATCH = 10       # bytes stored to scratch (spills): never dirty in L2
N_COUNTERS = 11

# The units a prediction reports busy fractions for: each SM's, then the shared ones.
SM_UNITS = ("tensor_cores", "sfu_exp2", "fma_pipe", "smem", "sm_l2_port")
# Each SM's launch of its CTAs' warps (core._SM.dispatch): busy per CTA, not per role's work.
DISPATCH_UNIT = "warp_dispatch"
GLOBAL_UNITS = ("l2_bandwidth", "hbm_bandwidth")
UNITS = SM_UNITS + (DISPATCH_UNIT,) + GLOBAL_UNITS
