"""gpusim: a cycle-approximate GPU memory-hierarchy simulator for tiled attention.

    import gpusim
    problem = gpusim.AttentionProblem(batch=4, heads=16, seqlen_q=4096, head_dim=128)
    pred = gpusim.predict(problem, None, "h100", algo="fa2")
    pred.runtime_us, pred.bottleneck, pred.hbm_read_bytes
"""
from algorithms.errors import (DoesNotFit, GpusimError, InvalidConfig, InvalidProblem,
                               ProfileError, ResultsFileError, UnsupportedAlgorithm)
from algorithms.problem import AttentionProblem, TileConfig

from .predict import Prediction, predict
from .profile import HardwareProfile, available_profiles, load_profile

__all__ = ["AttentionProblem", "TileConfig", "Prediction", "predict", "HardwareProfile",
           "load_profile", "available_profiles", "GpusimError", "InvalidProblem",
           "InvalidConfig", "DoesNotFit", "UnsupportedAlgorithm", "ProfileError",
           "ResultsFileError"]
