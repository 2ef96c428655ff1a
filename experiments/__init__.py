"""Experiments: the jobs that run gpusim against the GPU (README.md here says which is which)."""
import os

# the repository's root (the scripts compute their own before they can import this)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
