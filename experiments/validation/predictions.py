"""A prediction for every measured row (gpusim.predict, in parallel), saved beside
the report with the commit each was made at, and reused where asked
(--reuse-predictions: only the rows they lack are predicted).
"""
from __future__ import annotations

import csv
import json
import os
import subprocess
import time

from kernels.provenance import write_csv_atomic

from . import ROOT
from .suite import RESULTS, log


def _predict_one(args):
    gpu, algo, p, cfg = args
    import gpusim
    try:
        pred = gpusim.predict(p, cfg, gpu, algo=algo)
        return {"runtime_us": pred.runtime_us, "hbm_read_bytes": pred.hbm_read_bytes,
                "hbm_write_bytes": pred.hbm_write_bytes, "l2_read_bytes": pred.l2_read_bytes,
                "l2_dirty_at_end_bytes": pred.l2_dirty_at_end_bytes,
                "bottleneck": pred.bottleneck, "error": ""}
    except Exception as e:  # a row the model cannot predict is reported, not fatal
        return {"runtime_us": None, "error": f"{type(e).__name__}: {' '.join(str(e).split())[:200]}"}


def _cost_estimate(row):
    """A prediction's cost grows with the tile steps simulated: submit the
    dearest first so that 16 workers do not wait on one N=16k row at the end."""
    p, c = row["problem"], row["config"]
    return p.batch * p.heads * p.seqlen_q * p.seqlen_kv / (c.block_m * c.block_n)


def predict_rows(rows, gpu, jobs=1, checkpoint=None, checkpoint_s=30.0):
    """Predictions aligned with rows. checkpoint(preds), where given, is called
    every checkpoint_s with the predictions made so far (None for the rest), so
    a run stopped at a time limit keeps its work for --reuse-predictions."""
    tasks = [(gpu, r["algo"], r["problem"], r["config"]) for r in rows]
    t0, out = time.time(), [None] * len(tasks)
    if jobs > 1 and len(tasks) > 20:
        from concurrent.futures import ProcessPoolExecutor, as_completed
        order = sorted(range(len(tasks)), key=lambda i: -_cost_estimate(rows[i]))
        last_save = time.time()
        with ProcessPoolExecutor(max_workers=jobs) as ex:
            futures = {ex.submit(_predict_one, tasks[i]): i for i in order}
            for n, fut in enumerate(as_completed(futures), 1):
                out[futures[fut]] = fut.result()
                if n % 100 == 0:
                    log(f"[report] {gpu}: {n}/{len(tasks)} predicted [{time.time() - t0:.0f} s]")
                if checkpoint and time.time() - last_save > checkpoint_s:
                    checkpoint(out)
                    last_save = time.time()
        return out
    for i, t in enumerate(tasks):
        out[i] = _predict_one(t)
    return out

PRED_FIELDS = ("runtime_us", "hbm_read_bytes", "hbm_write_bytes", "l2_read_bytes", "bottleneck", "error",
               "l2_dirty_at_end_bytes")


def _row_key(r):
    p, c = r["problem"], r["config"]
    return "|".join(str(x) for x in (r["algo"], p.dtype, p.batch, p.heads, p.seqlen_q, p.head_dim, int(p.causal),
                                     c.block_m, c.block_n, c.num_warps, c.num_stages))


def _kept_bounds(path: str, profile: str) -> dict:
    """The guard bounds already at `path` for `profile` ({} if none or unreadable)."""
    try:
        with open(path) as f:
            stored = json.load(f)
    except (OSError, ValueError):
        return {}
    return stored.get("bounds", {}) if stored.get("profile") == profile else {}


def predictions_path(profile, kind="validation", outdir=RESULTS):
    """Saved predictions live beside the report."""
    return os.path.join(outdir, f"{kind}_predictions_{profile.replace('.', '_')}.csv")


def _commit() -> str:
    """The commit whose model predicts: GPUSIM_GIT_COMMIT where the tree has no .git
    (a clean export), else git's HEAD."""
    commit = os.environ.get("GPUSIM_GIT_COMMIT", "")
    if commit:
        return commit
    try:
        return subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=10).stdout.strip()
    except Exception:
        return ""


def save_predictions(path, rows, preds, profile):
    """One line per row; a reused prediction keeps the commit it was made at."""
    commit = _commit()
    out = [{"key": _row_key(r), **{k: pr.get(k, "") if pr.get(k) is not None else "" for k in PRED_FIELDS},
            "profile": profile, "git_commit": pr.get("git_commit") or commit}
           for r, pr in zip(rows, preds) if pr is not None]  # None: not predicted yet (a checkpoint)
    write_csv_atomic(path, out, ["key", *PRED_FIELDS, "profile", "git_commit"])


def load_predictions(path, rows):
    """Predictions saved by an earlier report, aligned with rows: None for a
    row the file lacks; None for all without the file."""
    if not os.path.exists(path):
        return None
    with open(path, newline="") as f:
        saved = {r["key"]: r for r in csv.DictReader(f)}
    out = []
    for r in rows:
        s = saved.get(_row_key(r))
        if s is None:
            out.append(None)
            continue
        d = {k: s.get(k, "") for k in PRED_FIELDS}
        for k in ("runtime_us", "hbm_read_bytes", "hbm_write_bytes", "l2_read_bytes", "l2_dirty_at_end_bytes"):
            # (byte counts stay integers: rewritten as floats, every reused line changed)
            d[k] = (float(d[k]) if k == "runtime_us" else int(float(d[k]))) if d[k] not in ("", None) else None
        d["git_commit"] = s.get("git_commit", "")
        out.append(d)
    return out


def reuse_or_predict(path, rows, profile, jobs, reuse):
    """Predictions for rows: with reuse, those saved at path and the rows it
    lacks predicted now (delete a profile's lines of one algorithm to re-predict
    only them); without, all predicted. Saves the file when anything was
    predicted."""
    preds = load_predictions(path, rows) if reuse else None
    if preds is None:
        preds = [None] * len(rows)
    missing = [i for i, pr in enumerate(preds) if pr is None]
    if missing:
        if reuse and len(missing) < len(rows):
            log(f"[report] {profile}: {len(rows) - len(missing)} predictions reused, {len(missing)} to make")
        def checkpoint(done):
            for i, pr in zip(missing, done):
                if pr is not None:
                    preds[i] = pr
            save_predictions(path, rows, preds, profile)

        for i, pr in zip(missing, predict_rows([rows[i] for i in missing], profile, jobs, checkpoint)):
            preds[i] = pr
        save_predictions(path, rows, preds, profile)
    return preds


def algo_label(row):
    return f"{row['algo']}_fp8" if row["problem"].dtype == "fp8" else row["algo"]
