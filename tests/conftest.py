"""Hypothesis profiles. Locally the property tests draw fresh examples every
run, which is how they find new counterexamples; CI (`.ci/run`) loads the
'ci' profile, whose draws are fixed, so a submission's CI result does not
depend on a lucky draw. A counterexample found locally becomes an @example.
Also the run_interpreted fixture (a script under Triton's interpreter, in its
own process)."""
import os
import subprocess
import sys

import pytest
import torch
from hypothesis import settings

# Without CUDA the Triton kernels run in Triton's interpreter. TRITON_INTERPRET
# must be set before any test module imports triton or kernels/ (kernels.common
# patches the interpreter at import only when it is set), so it is set here,
# before collection, rather than in the modules that need it: a module that
# imports kernels/ earlier in collection order would otherwise import them
# uninterpreted for every later test.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

settings.register_profile("ci", derandomize=True, print_blob=True)
settings.load_profile(os.environ.get("GPUSIM_HYPOTHESIS_PROFILE", "default"))


@pytest.fixture
def run_interpreted():
    """run_interpreted(script): runs the Python `script` in a fresh process
    under Triton's interpreter (on a GPU machine too: probes whose kernels are
    checked on small CPU tensors) from the repository root, and asks that it
    exits 0 and prints "ok" last."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

    def run(script: str) -> None:
        env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": root}
        out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=root, env=env,
                             timeout=300)
        assert out.returncode == 0, out.stderr[-2000:]
        assert out.stdout.strip().endswith("ok")
    return run
