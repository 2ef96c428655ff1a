"""`validate.py report` (CPU): predictions against measurements per algorithm and
profile, the fa2 config ranking per shape, errors by bottleneck and config,
bytes against ncu, figures, the markdown report and the CI guard's bounds.
"""
from __future__ import annotations

import json
import math
import os
import statistics
import time

from . import ROOT
from .loading import gluon_rows, load_measurements, load_ncu, shape_key
from .metrics import TARGETS, error_summary, spearman, top1_loss
from .predictions import _kept_bounds, algo_label, predictions_path, reuse_or_predict
from .suite import RESULTS, SEQLENS, log


def compute_metrics(rows, preds):
    """Errors per algorithm, fa2 ranking per shape. rows/preds aligned."""
    by_algo, by_algo_default = {}, {}
    failed = []
    for r, pr in zip(rows, preds):
        if pr.get("runtime_us") is None:
            failed.append((r, pr.get("error", "")))
            continue
        lab = algo_label(r)
        by_algo.setdefault(lab, ([], []))
        by_algo[lab][0].append(pr["runtime_us"] / 1e3)
        by_algo[lab][1].append(r["ms"])
        if r["default_config"]:
            by_algo_default.setdefault(lab, ([], []))
            by_algo_default[lab][0].append(pr["runtime_us"] / 1e3)
            by_algo_default[lab][1].append(r["ms"])
    errors = {a: error_summary(*v) for a, v in sorted(by_algo.items())}
    errors_default = {a: error_summary(*v) for a, v in sorted(by_algo_default.items())}
    allp = [x for v in by_algo.values() for x in v[0]]
    allm = [x for v in by_algo.values() for x in v[1]]
    overall = error_summary(allp, allm) if allp else None
    shapes_ = {}
    for r, pr in zip(rows, preds):
        if r["algo"] == "fa2" and r["problem"].dtype != "fp8" and pr.get("runtime_us") is not None:
            shapes_.setdefault(shape_key(r["problem"]), []).append((pr["runtime_us"] / 1e3, r["ms"], r))
    ranking = {}
    for k, items in sorted(shapes_.items()):
        if len(items) < 3:
            continue
        pp, mm = [x[0] for x in items], [x[1] for x in items]
        ranking[k] = {"n": len(items), "spearman": spearman(pp, mm), "top1_loss": top1_loss(pp, mm)}
    return {"errors": errors, "errors_default": errors_default, "overall": overall, "ranking": ranking,
            "failed": failed}


def ranking_summary(ranking):
    rhos = [v["spearman"] for v in ranking.values() if not math.isnan(v["spearman"])]
    losses = [v["top1_loss"] for v in ranking.values()]
    if not rhos:
        return {"n_shapes": 0}
    return {"n_shapes": len(ranking), "spearman_min": min(rhos), "spearman_median": statistics.median(rhos),
            "spearman_mean": sum(rhos) / len(rhos), "top1_loss_max": max(losses),
            "top1_loss_mean": sum(losses) / len(losses)}


def errors_by(rows, preds, group):
    """{group(row, prediction): (rows, mean signed error, MAPE)} over the
    predicted rows, groups in sorted order; group returns None to leave a
    row out. Errors are (predicted − measured) / measured."""
    acc: dict = {}
    for r, pr in zip(rows, preds):
        if pr is None or pr.get("runtime_us") is None:
            continue
        g = group(r, pr)
        if g is not None:
            acc.setdefault(g, []).append((pr["runtime_us"] / 1e3 - r["ms"]) / r["ms"])
    return {g: (len(e), sum(e) / len(e), sum(map(abs, e)) / len(e)) for g, e in sorted(acc.items())}

BYTE_COUNTS = ("hbm_read", "hbm_write", "hbm_write_in_run", "l2_read", "l2_slice_read")


def byte_metrics(ncu_rows, preds):
    out = []
    for r, pr in zip(ncu_rows, preds):
        if pr.get("runtime_us") is None and pr.get("hbm_read_bytes") is None:
            out.append({"row": r, "error": pr.get("error", "")})
            continue
        e = {"row": r, "error": ""}
        # The model's L2 reads are the bytes the SMs ask L2 for; the L2
        # slices look up fewer where the request coalescer merged requests
        # (NCU_METRICS): both ends are compared, the SMs' first.
        # HBM writes likewise: all the run's, and those made before it ends
        # (ncu counts no later write-back of what L2 still holds dirty)
        if pr.get("hbm_write_bytes") is not None and pr.get("l2_dirty_at_end_bytes") is not None:
            pr = {**pr, "hbm_write_in_run": pr["hbm_write_bytes"] - pr["l2_dirty_at_end_bytes"]}
        for name, pk, mk in (("hbm_read", "hbm_read_bytes", "dram_read_bytes"),
                             ("hbm_write", "hbm_write_bytes", "dram_write_bytes"),
                             ("hbm_write_in_run", "hbm_write_in_run", "dram_write_bytes"),
                             ("l2_read", "l2_read_bytes", "sm_read_bytes_from_l2"),
                             ("l2_slice_read", "l2_read_bytes", "l2_read_bytes_from_sm")):
            pv, mv = pr.get(pk), r.get(mk, float("nan"))
            e[name] = (pv, mv, (pv - mv) / mv if pv is not None and mv > 0 else float("nan"))
        out.append(e)
    return out

GUARD_SEQLEN = 1024
GUARD_FA2_SHAPE = (64, False)


def guard_subset(rows):
    """The deterministic subset the CI guard re-predicts (the engine takes ~1-10 s a row on a
    CPU, so all ~900 rows take far longer than CI allows): the default config of every
    algorithm at N = 1024, D = 64, non-causal, and every fa2 config with block_m = 128 of
    that shape (for the ranking metrics)."""
    out = []
    for r in rows:
        p = r["problem"]
        if p.seqlen_q != GUARD_SEQLEN or (p.head_dim, p.causal) != GUARD_FA2_SHAPE:
            continue
        if r["default_config"] or (r["algo"] == "fa2" and r["config"].block_m == 128):
            out.append(r)
    return out


def headline_subset(rows):
    """Every algorithm's default config on all 24 shapes, plus every fa2 config of the four
    N = 1024 shapes (D 64/128, causal 0/1): what the report predicts when the full sweep
    would take too long on a CPU."""
    return [r for r in rows if r["default_config"] or
            (r["algo"] == "fa2" and r["problem"].seqlen_q == GUARD_SEQLEN)]


def guard_metrics(rows, preds):
    m = compute_metrics(rows, preds)
    rs = ranking_summary(m["ranking"])
    out = {f"mape.{a}": v["mape"] for a, v in m["errors"].items()}
    out.update({f"max_ape.{a}": v["max"] for a, v in m["errors"].items()})
    if rs.get("n_shapes"):
        out["spearman_min_neg"] = -rs["spearman_min"]   # bounds are upper bounds
        out["top1_loss_max"] = rs["top1_loss_max"]
    out["unpredicted_rows"] = float(len(m["failed"]))
    return out


def _fmt_pct(x):
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * x:.1f}%"


def _plots(profile, rows, preds, metrics, outdir):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    files = []
    fig, ax = plt.subplots(figsize=(6.5, 6))
    colors = {"standard": "tab:gray", "fa1": "tab:blue", "fa2": "tab:orange", "fa3": "tab:green",
              "fa3_triton": "tab:olive", "fa3_triton_fp8": "tab:red"}
    lo, hi = float("inf"), 0
    for lab in colors:
        pts = [(r["ms"], pr["runtime_us"] / 1e3) for r, pr in zip(rows, preds)
               if algo_label(r) == lab and pr.get("runtime_us") is not None]
        if not pts:
            continue
        xs, ys = zip(*pts)
        lo, hi = min(lo, *xs, *ys), max(hi, *xs, *ys)
        ax.scatter(xs, ys, s=10 if lab == "fa2" else 24, alpha=0.6, label=f"{lab} ({len(pts)})", c=colors.get(lab, "tab:purple"))
    if hi > 0:
        line = [lo * 0.8, hi * 1.25]
        ax.plot(line, line, "k-", lw=0.8)
        ax.fill_between(line, [x * 0.9 for x in line], [x * 1.1 for x in line], color="k", alpha=0.08,
                        label="±10%")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("measured (ms, do_bench median)")
    ax.set_ylabel(f"predicted (ms, profile {profile})")
    ax.set_title(f"H100: predicted vs measured, profile {profile}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    f1 = os.path.join(outdir, f"validation_pred_vs_meas_{profile.replace('.', '_')}.png")
    fig.savefig(f1, dpi=110)
    plt.close(fig)
    files.append(f1)

    shapes_ = {}
    for r, pr in zip(rows, preds):
        if r["algo"] == "fa2" and pr.get("runtime_us") is not None:
            shapes_.setdefault(shape_key(r["problem"]), []).append((r["ms"], pr["runtime_us"] / 1e3))
    keys = sorted(shapes_)
    if keys:
        ncol = 6
        nrow = math.ceil(len(keys) / ncol)
        fig, axes = plt.subplots(nrow, ncol, figsize=(3 * ncol, 2.4 * nrow), squeeze=False)
        for ax, k in zip(axes.flat, keys):
            items = sorted(shapes_[k])
            m0, p0 = min(x[0] for x in items), min(x[1] for x in items)
            ax.plot(range(len(items)), [x[0] / m0 for x in items], "o-", ms=3, label="measured")
            ax.plot(range(len(items)), [x[1] / p0 for x in items], "s", ms=3, label="predicted")
            rk = metrics["ranking"].get(k, {})
            ax.set_title(f"D={k[0]} c={k[1]} N={k[2]}\nρ={rk.get('spearman', float('nan')):.2f} "
                         f"top1 {_fmt_pct(rk.get('top1_loss'))}", fontsize=8)
            ax.tick_params(labelsize=6)
        for ax in list(axes.flat)[len(keys):]:
            ax.axis("off")
        axes.flat[0].legend(fontsize=6)
        fig.suptitle(f"fa2 configs per shape, sorted by measured time (time / best), profile {profile}")
        fig.tight_layout()
        f2 = os.path.join(outdir, f"validation_fa2_ranking_{profile.replace('.', '_')}.png")
        fig.savefig(f2, dpi=100)
        plt.close(fig)
        files.append(f2)
    return files


def cmd_report(args) -> int:
    import gpusim.profile as gprof
    from gpusim.artifacts import atomic_write_text, ensure_folder_of

    t0 = time.time()
    # the report's folder, where its predictions are saved as they come: checked
    # before they are made (an hour on two cores), not at their first save
    ensure_folder_of(args.report)
    rows = load_measurements(args.measurements)
    gluon = gluon_rows(args.gluon) if args.gluon else []
    rows += gluon
    ncu_rows = []
    if os.path.exists(args.ncu):
        ncu_rows = load_ncu(args.ncu)
    profiles = args.gpu or ["h100"] + (["h100.measured"] if "h100.measured" in gprof.available_profiles() else [])
    if args.subset == "guard":
        rows = guard_subset(rows)
    elif args.subset == "headline":
        rows = headline_subset(rows)
    lines = ["# Validation of the simulator on the H100", "",
             f"Generated by `PYTHONPATH=. python experiments/validate.py report` from "
             f"`{os.path.relpath(args.measurements, ROOT)}` ({len(rows)} measured rows with status ok, subset "
             f"`{args.subset}`" + (": every algorithm's default config on all 24 shapes + every fa2 config at N=1024"
                                   if args.subset == "headline" else "")
             + (f"; `{os.path.relpath(args.ncu, ROOT)}`, {len(ncu_rows)} ncu rows" if ncu_rows else "") + ").",
             f"Measured on {rows[0].get('gpu', '?')}, driver {rows[0].get('driver', '?')}, torch "
             f"{rows[0].get('torch', '?')}, triton {rows[0].get('triton', '?')}, commit "
             f"{rows[0].get('git_commit', '?')}, {rows[0].get('date', '?')}; SM clock "
             f"{rows[0].get('sm_clock_mhz', '?')} MHz (nvidia-smi at start->end).",
             *([f"FA3's schedule (`fa3`) is checked against the kernel that runs it, kernels/fa3_gluon.py: "
                f"{len(gluon)} rows of `{os.path.relpath(args.gluon, ROOT)}` (commit "
                f"{gluon[0].get('git_commit', '?')}, {gluon[0].get('gpu', '?')}), at its default config. "
                f"The rows of Triton's fa3 kernel (kernels/fa3.py), which Triton 3.6 does not "
                f"warp-specialise, are predicted by the schedule it compiles to, `fa3_triton` "
                f"(algorithms/fa3_triton.py)."] if gluon else []),
             "Time: `triton.testing.do_bench` median, L2 flushed between calls, inputs rotated over two "
             "random sets. No model parameter was fitted to these timings: the profiles come from "
             "datasheets, papers and our microbenchmarks (experiments/calibrate.py).", "",
             f"Targets (issue 5): runtime MAPE ≤ {TARGETS['mape']:.0%} per algorithm (goal "
             f"{TARGETS['mape_goal']:.0%}); Spearman ≥ {TARGETS['spearman']} (goal {TARGETS['spearman_goal']}) "
             f"over fa2 configs within each shape; top-1 loss ≤ {TARGETS['top1_loss']:.0%}; HBM bytes within "
             f"{TARGETS['hbm_bytes']:.0%} of ncu's DRAM bytes; L2 request bytes within {TARGETS['l2_bytes']:.0%}.",
             ""]
    summary = {}
    for prof in profiles:
        tp = time.time()
        preds = reuse_or_predict(predictions_path(prof, "validation", os.path.dirname(os.path.abspath(args.report))),
                                 rows, prof, args.jobs, args.reuse_predictions)
        m = compute_metrics(rows, preds)
        rs = ranking_summary(m["ranking"])
        summary[prof] = {"errors": m["errors"], "ranking": rs}
        log(f"[report] {prof}: {len(rows)} predictions in {time.time() - tp:.0f} s")
        lines += [f"## Profile `{prof}`", "",
                  "| algorithm | rows | MAPE | median APE | max APE | mean signed error | MAPE, default config only | target |",
                  "|---|---|---|---|---|---|---|---|"]
        for a, e in m["errors"].items():
            ed = m["errors_default"].get(a)
            ok = "met" if e["mape"] <= TARGETS["mape"] else "**missed**"
            lines.append(f"| {a} | {e['n']} | {_fmt_pct(e['mape'])} | {_fmt_pct(e['median'])} | "
                         f"{_fmt_pct(e['max'])} | {'+' if e['bias'] >= 0 else ''}{_fmt_pct(e['bias'])} | "
                         f"{_fmt_pct(ed['mape']) if ed else '–'} | {ok} |")
        if m["overall"]:
            o = m["overall"]
            lines.append(f"| **all** | {o['n']} | {_fmt_pct(o['mape'])} | {_fmt_pct(o['median'])} | "
                         f"{_fmt_pct(o['max'])} | {_fmt_pct(o['bias'])} | | |")
        if m["failed"]:
            lines += ["", f"{len(m['failed'])} measured rows could not be predicted, e.g. "
                          f"`{m['failed'][0][1]}`."]
        lines.append("")
        if rs.get("n_shapes"):
            lines += [f"fa2 config ranking over {rs['n_shapes']} shapes: Spearman min "
                      f"{rs['spearman_min']:.2f}, median {rs['spearman_median']:.2f} (target ≥ "
                      f"{TARGETS['spearman']}: {'met' if rs['spearman_min'] >= TARGETS['spearman'] else '**missed** in ' + str(sum(v['spearman'] < TARGETS['spearman'] for v in m['ranking'].values())) + ' shapes'}); "
                      f"top-1 loss max {_fmt_pct(rs['top1_loss_max'])}, mean {_fmt_pct(rs['top1_loss_mean'])} "
                      f"(target ≤ {TARGETS['top1_loss']:.0%}: "
                      f"{'met' if rs['top1_loss_max'] <= TARGETS['top1_loss'] else '**missed** in ' + str(sum(v['top1_loss'] > TARGETS['top1_loss'] for v in m['ranking'].values())) + ' shapes'}).", "",
                      "| D | causal | N | configs | Spearman | top-1 loss |", "|---|---|---|---|---|---|"]
            for k, v in m["ranking"].items():
                lines.append(f"| {k[0]} | {k[1]} | {k[2]} | {v['n']} | {v['spearman']:.2f} | {_fmt_pct(v['top1_loss'])} |")
            lines.append("")
        # where the errors sit
        lines += ["Signed error by group (mean of (predicted − measured) / measured; + = model too slow):", "",
                  "| algorithm | D | causal | N=512 | 1024 | 2048 | 4096 | 8192 | 16384 |", "|---|---|---|---|---|---|---|---|---|"]
        groups = {}
        for r, pr in zip(rows, preds):
            if pr.get("runtime_us") is None:
                continue
            if r["algo"] == "fa2" and not r["default_config"]:
                continue
            p = r["problem"]
            groups.setdefault((algo_label(r), p.head_dim, int(p.causal)), {})[p.seqlen_q] = \
                (pr["runtime_us"] / 1e3 - r["ms"]) / r["ms"]
        for (a, d, c), byn in sorted(groups.items()):
            cells = [(f"{100 * byn[n]:+.0f}%" if n in byn else "–") for n in SEQLENS]
            lines.append(f"| {a} | {d} | {c} | " + " | ".join(cells) + " |")
        lines.append("")
        # which unit the model said bounds a row, and fa2's config shape: where
        # the model runs fast or slow (validation_notes.md reads these)
        lines += ["Error by the model's bottleneck:", "",
                  "| algorithm | bottleneck | rows | mean signed error | MAPE |", "|---|---|---|---|---|"]
        for (a, b), (n, bias, mape) in errors_by(rows, preds, lambda r, pr: (algo_label(r), pr.get("bottleneck") or "–")).items():
            lines.append(f"| {a} | {b} | {n} | {100 * bias:+.1f}% | {_fmt_pct(mape)} |")
        lines += ["", "fa2's error by config over all shapes (block_m x block_n x warps x stages):", "",
                  "| config | rows | mean signed error | MAPE |", "|---|---|---|---|"]
        for cfg, (n, bias, mape) in errors_by(
                rows, preds, lambda r, pr: (r["config"].block_m, r["config"].block_n, r["config"].num_warps,
                                            r["config"].num_stages) if algo_label(r) == "fa2" else None).items():
            lines.append(f"| {'x'.join(map(str, cfg))} | {n} | {100 * bias:+.1f}% | {_fmt_pct(mape)} |")
        lines.append("")
        worst = sorted(((abs(pr["runtime_us"] / 1e3 - r["ms"]) / r["ms"], r, pr) for r, pr in zip(rows, preds)
                        if pr.get("runtime_us") is not None), key=lambda t: -t[0])[:8]
        if worst:
            lines += ["Largest errors:", "", "| algorithm | D | causal | N | config | measured ms | predicted ms | error | model's bottleneck |",
                      "|---|---|---|---|---|---|---|---|---|"]
            for e, r, pr in worst:
                p, c = r["problem"], r["config"]
                lines.append(f"| {algo_label(r)} | {p.head_dim} | {int(p.causal)} | {p.seqlen_q} | "
                             f"{c.block_m}x{c.block_n}x{c.num_warps}x{c.num_stages} | {r['ms']:.3f} | "
                             f"{pr['runtime_us'] / 1e3:.3f} | {100 * (pr['runtime_us'] / 1e3 - r['ms']) / r['ms']:+.0f}% | "
                             f"{pr.get('bottleneck') or '–'} |")
            lines.append("")
        if ncu_rows:
            npreds = reuse_or_predict(predictions_path(prof, "ncu", os.path.dirname(os.path.abspath(args.report))),
                                      ncu_rows, prof, args.jobs, args.reuse_predictions)
            bm = byte_metrics(ncu_rows, npreds)
            summary[prof]["bytes"] = bm
            lines += ["Bytes, predicted vs ncu (`--clock-control none`, caches flushed before each kernel). "
                      "L2 read, SMs: the bytes the SMs receive from L2 (l1tex__m_xbar2l1tex_read_bytes), what "
                      "the model counts; L2 read, slices: the sectors the L2 slices look up for them "
                      "(lts__t_sectors_srcunit_tex_op_read × 32), fewer where the L2 request coalescer merged "
                      "requests for a sector in flight from several SMs, which the model does not "
                      "(experiments/l2_request_probe.py):", "",
                      "HBM write, in run: the model's HBM writes less the dirty bytes L2 still holds "
                      "at the end, which reach HBM after the kernel, where ncu's count ends:", "",
                      "| algorithm | D | causal | N | HBM read: ncu | err | HBM write: ncu | err | "
                      "HBM write, in run: ncu | err | L2 read, SMs: ncu | err | L2 read, slices: ncu | err |",
                      "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
            for e in bm:
                r = e["row"]
                p = r["problem"]
                if e["error"]:
                    lines.append(f"| {algo_label(r)} | {p.head_dim} | {int(p.causal)} | {p.seqlen_q} | "
                                 f"prediction failed: {e['error']} |||||||||| ")
                    continue
                cells = []
                for name in BYTE_COUNTS:
                    pv, mv, err = e[name]
                    cells += [f"{mv / 1e6:,.1f} MB" if not math.isnan(mv) else "–",
                              _fmt_pct(err) if not math.isnan(err) else "–"]
                lines.append(f"| {algo_label(r)} | {p.head_dim} | {int(p.causal)} | {p.seqlen_q} | " + " | ".join(cells) + " |")
            for name, tgt in (("hbm_read", TARGETS["hbm_bytes"]), ("hbm_write", TARGETS["hbm_bytes"]),
                              ("hbm_write_in_run", TARGETS["hbm_bytes"]),
                              ("l2_read", TARGETS["l2_bytes"]), ("l2_slice_read", TARGETS["l2_bytes"])):
                errs = [abs(e[name][2]) for e in bm if not e["error"] and not math.isnan(e[name][2])]
                if errs:
                    within = sum(x <= tgt for x in errs)
                    lines.append(f"\n{name}: mean |error| {_fmt_pct(sum(errs) / len(errs))}, max {_fmt_pct(max(errs))}; "
                                 f"{within}/{len(errs)} rows within {tgt:.0%}.")
            lines.append("")
        if not args.no_plots:
            for f in _plots(prof, rows, preds, m, os.path.dirname(os.path.abspath(args.report))):
                lines.append(f"![{os.path.basename(f)}]({os.path.basename(f)})")
            lines.append("")
        if args.write_bounds and prof == profiles[0]:
            sub = guard_subset(rows)
            idx = {id(r): i for i, r in enumerate(rows)}
            gm = guard_metrics(sub, [preds[idx[id(r)]] for r in sub])
            reached = {k: round(v + abs(v) * 0.02 + 0.005, 4) for k, v in gm.items()}
            # a bound only ever tightens: where the rounding lands above the bound
            # already kept, the kept one stays (the errors must not creep up)
            kept = _kept_bounds(args.bounds, prof)
            bounds = {"profile": prof, "subset": "guard_subset (experiments/validation/report.py)",
                      "note": "upper bounds: the values the report reached, rounded up by 2% + 0.005, "
                              "never above the bounds they replace; spearman_min_neg is -(minimum Spearman)",
                      "bounds": {k: min(v, kept.get(k, v)) for k, v in reached.items()}}
            atomic_write_text(args.bounds, json.dumps(bounds, indent=1, sort_keys=True))
            log(f"[report] wrote {args.bounds}")
    notes = os.path.join(RESULTS, "validation_notes.md")
    if os.path.exists(notes):
        lines += ["## Where the targets are missed, and why", "", open(notes).read().strip(), ""]
    atomic_write_text(args.report, "\n".join(lines) + "\n")
    log(f"[report] wrote {args.report} in {time.time() - t0:.0f} s")
    for prof, s in summary.items():
        print(f"{prof}: " + ", ".join(f"{a} MAPE {_fmt_pct(e['mape'])}" for a, e in s["errors"].items())
              + (f"; Spearman min {s['ranking']['spearman_min']:.2f} median {s['ranking']['spearman_median']:.2f},"
                 f" top-1 loss max {_fmt_pct(s['ranking']['top1_loss_max'])}" if s["ranking"].get("n_shapes") else ""))
    return 0
