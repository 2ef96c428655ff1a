"""The calibration's CUDA C microkernels (experiments/calibration/cuda_kernels.py)
compile for sm_90 with nvcc where this machine has it (the GPU machine builds
them the same way before running them), every kernel the benches ask for is in
the cubin, and the prologue probe has fa2's prologue in the order Triton 3.6
compiles it (kernels/fa2.py cross-compiled: Q's four LDG.E.128, their STS,
the LDGSTS of the first stages, MEMBAR.ALL.CTA and FENCE.VIEW.ASYNC.S before
the wait for the first stage)."""
import os
import re
import shutil
import subprocess

import pytest

from experiments.calibration.cuda_kernels import CUDA_KERNELS, compile_cuda

NVCC = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc" if os.path.exists("/usr/local/cuda/bin/nvcc") else None)


def _cuobjdump() -> str | None:
    import triton

    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    return tool if os.path.exists(tool) else None


@pytest.fixture(scope="module")
def sass(tmp_path_factory):
    if NVCC is None or _cuobjdump() is None:
        pytest.skip("needs nvcc and Triton's cuobjdump")
    cubin = compile_cuda(str(tmp_path_factory.mktemp("cuda")))
    return subprocess.run([_cuobjdump(), "-sass", cubin], capture_output=True, text=True, check=True).stdout


def _function(sass: str, name: str) -> list[str]:
    """The opcodes of kernel `name`'s SASS, in order."""
    body = sass.split(f"Function : {name}\n", 1)[1].split("Function : ", 1)[0]
    return re.findall(r"/\*[0-9a-f]{4,5}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]+)", body)


def test_every_microkernel_is_built(sass):
    built = set(re.findall(r"Function : (\w+)", sass))
    assert set(CUDA_KERNELS) <= built, sorted(set(CUDA_KERNELS) - built)


@pytest.mark.parametrize("mode", ["copy", "mufu", "mufu32", "mixed", "ffma"])
def test_the_prologue_probe_issues_fa2s_prologue_in_its_order(sass, mode):
    ops = _function(sass, f"prologue_probe_{mode}")
    q_loads = [i for i, op in enumerate(ops) if op == "LDG.E.128"]
    assert len(q_loads) == 4
    stores = [i for i, op in enumerate(ops) if op.startswith("STS.128")]
    copies = [i for i, op in enumerate(ops) if op.startswith("LDGSTS")]
    fence = ops.index("MEMBAR.ALL.CTA")
    assert q_loads[-1] < stores[0] < copies[0] and ops[fence + 1] == "FENCE.VIEW.ASYNC.S"
    # the probe's first 16 copies (two stages of two 8 KB tiles, 4 a thread each) come before the fence
    assert sum(1 for i in copies if i < fence) == 16
    assert ops[fence + 2].startswith("DEPBAR.LE")
