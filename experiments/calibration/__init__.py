"""The calibration's parts (experiments/calibrate.py is its command line).

- cuda_kernels.py, triton_kernels.py: the microkernels;
- runner.py: the GPU side's harness (device, provenance, clocks);
- memory_benches.py, compute_benches.py, cuda_benches.py: the measurements, one
  function a step of `calibrate.py run`;
- cross_compile.py: the kernels compiled for sm_90 on a CPU (`check`, `loops`);
- rows.py: the CSV's columns, repeated runs' medians, merging;
- reduce.py: measured rows -> the measured profile.

Nothing here is an attention kernel: attention timings validate the model and
never feed a profile.
"""
from .. import ROOT  # noqa: F401 (the results' default paths start from it)
