"""The validation's metrics, pure Python: absolute percentage errors and their
mean, Spearman's rank correlation of configs within a shape, top-1 loss; and
the issue's targets.
"""
from __future__ import annotations

import math
import statistics

TARGETS = {"mape": 0.10, "mape_goal": 0.05, "spearman": 0.8, "spearman_goal": 0.9, "top1_loss": 0.05,
           "hbm_bytes": 0.10, "l2_bytes": 0.15}


def abs_pct_errors(pred, meas):
    if len(pred) != len(meas):
        raise ValueError("pred and meas differ in length")
    out = []
    for p, m in zip(pred, meas):
        if not (m > 0) or not math.isfinite(p):
            raise ValueError(f"cannot compare prediction {p} with measurement {m}")
        out.append(abs(p - m) / m)
    return out


def mape(pred, meas):
    e = abs_pct_errors(pred, meas)
    return sum(e) / len(e) if e else float("nan")


def error_summary(pred, meas):
    e = abs_pct_errors(pred, meas)
    if not e:
        return {"n": 0, "mape": float("nan"), "median": float("nan"), "max": float("nan"), "bias": float("nan")}
    signed = [(p - m) / m for p, m in zip(pred, meas)]
    return {"n": len(e), "mape": sum(e) / len(e), "median": statistics.median(e), "max": max(e),
            "bias": sum(signed) / len(signed)}


def ranks(xs):
    """Average ranks (1-based), ties sharing the mean of their positions."""
    order = sorted(range(len(xs)), key=lambda i: xs[i])
    r = [0.0] * len(xs)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and xs[order[j + 1]] == xs[order[i]]:
            j += 1
        avg = (i + j) / 2 + 1
        for k in range(i, j + 1):
            r[order[k]] = avg
        i = j + 1
    return r


def spearman(x, y):
    """Spearman's rank correlation (Pearson of average ranks); nan when undefined."""
    if len(x) != len(y):
        raise ValueError("x and y differ in length")
    n = len(x)
    if n < 2:
        return float("nan")
    rx, ry = ranks(list(x)), ranks(list(y))
    mx, my = sum(rx) / n, sum(ry) / n
    sxy = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    sxx = sum((a - mx) ** 2 for a in rx)
    syy = sum((b - my) ** 2 for b in ry)
    if sxx == 0 or syy == 0:
        return float("nan")
    return sxy / math.sqrt(sxx * syy)


def top1_loss(pred, meas):
    """Measured time of the config the model ranks first over the best measured time, minus 1.
    Ties in the prediction go to the first listed."""
    if not pred or len(pred) != len(meas):
        raise ValueError("need equally long, non-empty pred and meas")
    best_pred = min(range(len(pred)), key=lambda i: (pred[i], i))
    return meas[best_pred] / min(meas) - 1.0
