"""Provenance of a measurement on the GPU machine, and atomic CSV writing.

Every measured number carries: GPU name, SM clock, driver, torch, triton, git
commit, date and command (DESIGN.md). Imports nothing of the simulator, so the
measuring scripts run on the GPU image, which has no simpy.
"""
from __future__ import annotations

import csv
import datetime as _dt
import os
import re
import subprocess

PROVENANCE_FIELDS = ("gpu", "sm_clock_mhz", "driver", "torch", "triton", "git_commit", "date",
                     "command")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
UNKNOWN_COMMIT = "unknown (set GPUSIM_GIT_COMMIT)"


def nvidia_smi(field: str) -> str:
    """One `nvidia-smi --query-gpu` field of the first GPU, '' where unavailable."""
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={field}", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=20).stdout.strip().splitlines()
        return out[0].strip() if out else ""
    except Exception:
        return ""


def git_commit() -> str:
    """The checkout's commit: $GPUSIM_GIT_COMMIT first (the GPU machine gets a copy
    without .git, where `git rev-parse` prints 'HEAD' or nothing: not a commit)."""
    if os.environ.get("GPUSIM_GIT_COMMIT"):
        return os.environ["GPUSIM_GIT_COMMIT"]
    try:
        out = subprocess.run(["git", "-C", ROOT, "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=10).stdout.strip()
    except Exception:
        return UNKNOWN_COMMIT
    return out if re.fullmatch(r"[0-9a-f]{40}", out) else UNKNOWN_COMMIT


def provenance(command: str) -> dict:
    """The provenance columns of one run, read now."""
    prov = dict.fromkeys(PROVENANCE_FIELDS, "")
    try:
        import torch
        import triton
        prov["torch"], prov["triton"] = torch.__version__, triton.__version__
        if torch.cuda.is_available():
            prov["gpu"] = torch.cuda.get_device_name(0)
    except Exception:
        pass
    prov.update(sm_clock_mhz=nvidia_smi("clocks.sm"), driver=nvidia_smi("driver_version"),
                git_commit=git_commit(), command=command,
                date=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"))
    return prov


def write_csv_atomic(path: str, rows, columns) -> None:
    """Rows (dicts) as CSV with `columns`, missing cells empty; a reader never
    sees a half-written file."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(columns))
        w.writeheader()
        for r in rows:
            w.writerow({k: r.get(k, "") for k in columns})
    os.replace(tmp, path)
