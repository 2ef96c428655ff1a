"""The validation's parts (experiments/validate.py is its command line).

- suite.py: what is measured (shapes, fa2's config grid, the CSV's columns);
- measure.py, ncu.py: the GPU machine's timings and Nsight Compute's bytes;
- loading.py: the committed measurements read back;
- predictions.py: a prediction for every measured row, saved and reused;
- metrics.py: MAPE, Spearman, top-1 loss, the targets;
- report.py: the markdown report, its figures and the CI guard's bounds.

No model parameter is fitted to these timings: they validate the model.
"""
from .. import ROOT  # noqa: F401 (the results' default paths start from it)
