"""The committed measurements read back: the measured CSV's rows (and FA3's Gluon
kernel rows from kernels.bench's CSV) as (problem, config, time), ncu's rows;
bad files are one-line ResultsFileErrors.
"""
from __future__ import annotations

import csv
import math
import os

from algorithms.errors import GpusimError, ResultsFileError
from algorithms.problem import AttentionProblem, TileConfig

from .suite import DEFAULT_GLUON, DEFAULT_NCU, DEFAULT_OUT, KERNEL_SCHEDULE

REQUIRED = ["algo", "dtype", "batch", "heads", "seqlen", "head_dim", "causal", "block_m", "block_n",
            "num_warps", "num_stages", "ms", "status"]

NCU_REQUIRED = ["algo", "dtype", "batch", "heads", "seqlen", "head_dim", "causal", "block_m", "block_n",
                "num_warps", "num_stages", "dram_read_bytes", "dram_write_bytes", "l2_read_bytes_from_sm",
                "status"]


def _read(path, required):
    if not os.path.isfile(path):
        raise ResultsFileError(f"{path}: no such results file (run `validate.py measure` on the GPU machine)")
    try:
        with open(path, newline="") as f:
            rows = list(csv.DictReader(f))
            header = rows[0].keys() if rows else (csv.DictReader(open(path)).fieldnames or [])
    except (csv.Error, UnicodeDecodeError) as e:
        raise ResultsFileError(f"{path}: not a readable CSV ({e})") from None
    missing = [c for c in required if c not in (header or [])]
    if missing:
        raise ResultsFileError(f"{path}: missing column(s) {', '.join(missing)}")
    return rows


def _int(row, key, path, lineno):
    try:
        return int(row[key])
    except (TypeError, ValueError):
        raise ResultsFileError(f"{path}: line {lineno}: {key} = {row.get(key)!r} is not an integer") from None


def problem_config(row, path="?", lineno=0):
    """(algo, AttentionProblem, TileConfig) of a results row."""
    def opt(key, default, conv=int):
        v = row.get(key, "")
        return conv(v) if v not in ("", None) else default

    try:
        kvh = opt("kv_heads", None)
        p = AttentionProblem(batch=_int(row, "batch", path, lineno), heads=_int(row, "heads", path, lineno),
                             kv_heads=kvh, seqlen_q=_int(row, "seqlen", path, lineno),
                             head_dim=_int(row, "head_dim", path, lineno),
                             causal=bool(_int(row, "causal", path, lineno)), dtype=row["dtype"])
        cfg = TileConfig(block_m=_int(row, "block_m", path, lineno), block_n=_int(row, "block_n", path, lineno),
                         num_warps=_int(row, "num_warps", path, lineno),
                         num_stages=_int(row, "num_stages", path, lineno), block_k=opt("block_k", 64),
                         consumer_warpgroups=opt("consumer_warpgroups", 2),
                         pingpong=bool(opt("pingpong", 1)), intra_wg_overlap=bool(opt("intra_wg_overlap", 1)),
                         mma=row.get("mma") or "auto")
    except GpusimError as e:
        if isinstance(e, ResultsFileError):
            raise
        raise ResultsFileError(f"{path}: line {lineno}: {e}") from None
    return KERNEL_SCHEDULE.get(row["algo"], row["algo"]), p, cfg


def _ms(row, path, lineno) -> float:
    try:
        ms = float(row["ms"])
    except ValueError:
        raise ResultsFileError(f"{path}: line {lineno}: ms = {row['ms']!r} is not a number") from None
    if not (ms > 0 and math.isfinite(ms)):
        raise ResultsFileError(f"{path}: line {lineno}: ms = {row['ms']!r} must be positive")
    return ms


def gluon_rows(path=DEFAULT_GLUON):
    """The Gluon FA3 kernel's measured rows (kernels.bench CSV, ok bf16 rows of
    kernel fa3_gluon) as validation rows of the FA3 schedule at the kernel's own
    default config; [] without the file."""
    if not os.path.exists(path):
        return []
    from kernels.fa3_gluon import default_config

    out = []
    for lineno, r in enumerate(_read(path, ("kernel", "status", "dtype", "batch", "heads", "seqlen",
                                            "head_dim", "causal", "ms")), start=2):
        if r["kernel"] != "fa3_gluon" or r["status"] != "ok" or r["dtype"] != "bf16":
            continue
        p = AttentionProblem(batch=_int(r, "batch", path, lineno), heads=_int(r, "heads", path, lineno),
                             seqlen_q=_int(r, "seqlen", path, lineno),
                             head_dim=_int(r, "head_dim", path, lineno),
                             causal=bool(_int(r, "causal", path, lineno)))
        ms = _ms(r, path, lineno)
        out.append({**r, "algo": "fa3", "kernel": "fa3_gluon", "problem": p, "config": default_config(p),
                    "ms": ms, "default_config": True})
    return out


def _ok_rows(path, required):
    """(line number, row, algorithm, problem, config) of the rows with status ok."""
    for lineno, r in enumerate(_read(path, required), start=2):
        if r["status"] == "ok":
            yield (lineno, r, *problem_config(r, path, lineno))


def load_measurements(path=DEFAULT_OUT):
    """Rows with status ok, each with 'problem', 'config', 'ms' parsed; ResultsFileError on a
    missing or malformed file."""
    out = []
    for lineno, r, algo, p, cfg in _ok_rows(path, REQUIRED):
        ms = _ms(r, path, lineno)
        out.append({**r, "algo": algo, "kernel": r["algo"], "problem": p, "config": cfg, "ms": ms,
                    "default_config": r.get("default_config", "0") in ("1", "True", "true")})
    if not out:
        raise ResultsFileError(f"{path}: no row with status ok")
    return out


def load_ncu(path=DEFAULT_NCU):
    out = []
    for lineno, r, algo, p, cfg in _ok_rows(path, NCU_REQUIRED):
        vals = {}
        # (sm_read_bytes_from_l2 since session 16: older files lack it)
        for k in ("dram_read_bytes", "dram_write_bytes", "l2_read_bytes_from_sm", "sm_read_bytes_from_l2"):
            if k == "sm_read_bytes_from_l2" and not r.get(k):
                vals[k] = float("nan")
                continue
            try:
                vals[k] = float(r[k])
            except ValueError:
                raise ResultsFileError(f"{path}: line {lineno}: {k} = {r[k]!r} is not a number") from None
        out.append({**r, **vals, "algo": algo, "problem": p, "config": cfg})
    return out


def shape_key(p):
    return (p.head_dim, int(p.causal), p.seqlen_q, p.dtype)
