"""Hypothesis profiles. Locally the property tests draw fresh examples every
run, which is how they find new counterexamples; CI (`.ci/run`) loads the
'ci' profile, whose draws are fixed, so a submission's CI result does not
depend on a lucky draw. A counterexample found locally becomes an @example."""
import os

from hypothesis import settings

settings.register_profile("ci", derandomize=True, print_blob=True)
settings.load_profile(os.environ.get("GPUSIM_HYPOTHESIS_PROFILE", "default"))
