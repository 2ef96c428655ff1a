"""What every GPU probe checks before its GPU work (the experiments that
time or profile kernels): that its results file can be written (a file that
cannot be written would lose the run), that a CUDA GPU is there and, for
those that profile, that ncu is.
No simulator import (runs on the GPU machine)."""
from __future__ import annotations

import os
import shutil
import sys


def start(script: str, out: str, argv, ncu: bool = False) -> dict | None:
    """The run's provenance for `python experiments/<script> <argv>`, or None
    after one line on stderr saying why it cannot run (the caller returns 2).
    ncu: the run profiles with Nsight Compute, which must be on PATH."""
    import torch

    from gpusim.artifacts import cannot_write
    from kernels.provenance import provenance

    name = os.path.splitext(script)[0]
    if cannot_write(name, out):
        return None
    if not torch.cuda.is_available():
        print(f"{name}: needs a CUDA GPU", file=sys.stderr)
        return None
    if ncu and shutil.which("ncu") is None:
        print(f"{name}: needs Nsight Compute's ncu on PATH", file=sys.stderr)
        return None
    args = argv if argv is not None else sys.argv[1:]
    return provenance(" ".join([f"python experiments/{script}", *args]))
