"""Hypothesis profiles. Locally the property tests draw fresh examples every
run, which is how they find new counterexamples; CI (`.ci/run`) loads the
'ci' profile, whose draws are fixed, so a submission's CI result does not
depend on a lucky draw. A counterexample found locally becomes an @example."""
import os

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
