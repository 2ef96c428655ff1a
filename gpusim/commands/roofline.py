"""`gpusim roofline`: each algorithm's arithmetic intensity against each
GPU's ridge point (peak FLOP/s ÷ HBM bandwidth).

    gpusim roofline [--gpus a100-40gb,a100-80gb,h100,h200] [--algos ...] \
        [--batch 4 --heads 16 --seqlen 4096 --head-dim 128 --causal] [--no-sim] [--out results/]

Writes <out>/roofline_<shape>.csv and .png. Bytes are the engine's predicted
HBM traffic when the simulator runs, else the compulsory bytes (each row and
the figure's legend say which).
"""
from __future__ import annotations

from algorithms.defaults import ALGORITHMS

from ..artifacts import DEFAULT_RESULTS, ensure_dir, parse_str_list, save_figure, write_csv
from ..cli import add_problem_args, problem_from_args
from .sweep import add_executor_args


def register(subparsers) -> None:
    from ..profile import available_profiles

    p = subparsers.add_parser("roofline", help="arithmetic intensity of each algorithm vs each GPU's ridge")
    add_problem_args(p, algo_choices=())
    p.add_argument("--gpus", default=",".join(available_profiles()),
                   help="profiles, comma-separated (default: all shipped)")
    p.add_argument("--algos", default=",".join(ALGORITHMS))
    p.add_argument("--no-sim", action="store_true",
                   help="no simulator: compulsory bytes and the attainable bound only")
    p.add_argument("--out", default=str(DEFAULT_RESULTS), help="output folder (default results/)")
    add_executor_args(p)
    p.set_defaults(func=cmd_roofline)


def cmd_roofline(a) -> int:
    from ..explore import engine_available, run_tasks
    from ..profile import load_profile
    from ..roofline import plot, points, roofline_tasks

    gpus = parse_str_list(a.gpus, "--gpus")
    for g in gpus:
        load_profile(g)
    algos = parse_str_list(a.algos, "--algos", ALGORITHMS)
    problem = problem_from_args(a)
    out = ensure_dir(a.out)     # (before the predictions, not after)
    # The roofline is useful without the simulator (compulsory bytes), so a
    # missing engine falls back to it and says so rather than failing.
    simulate = not a.no_sim and engine_available()
    if not a.no_sim and not simulate:
        print("note: the simulator (gpusim.engine) is not importable; using compulsory bytes")
    rows = run_tasks(roofline_tasks(problem, gpus, algos, simulate), executor=a.executor,
                     jobs=a.jobs, scheduler=a.scheduler, progress=not a.no_progress,
                     desc="roofline")
    for r, g in zip(rows, [g for g in gpus for _ in algos]):
        r["gpu_ref"] = g
    pts = points(rows)
    p = problem
    stem = (f"roofline_b{p.batch}-h{p.heads}-n{p.seqlen_q}-d{p.head_dim}"
            f"{'-causal' if p.causal else ''}-{p.dtype}")
    csv_path = write_csv(out / f"{stem}.csv", pts)
    title = (f"Roofline: B={p.batch} H={p.heads} N={p.seqlen_q} D={p.head_dim}"
             f"{' causal' if p.causal else ''} {p.dtype}, default configs"
             + ("" if simulate else " (no simulator: compulsory bytes; markers on the roof)"))
    png_path = save_figure(plot(pts, title), out / f"{stem}.png")
    print(f"{'gpu':<10} {'ridge':>7}  {'algo':<8} {'FLOP/B':>8} {'bytes from':<11} {'bound':<8} "
          f"{'attainable':>10} {'predicted':>9}")
    for r in pts:
        if not r["applicable"]:
            print(f"{r['gpu']:<10} {r['ridge_flop_per_byte']:>7.0f}  {r['algo']:<8} n/a: {r['reason']}")
            continue
        ach = f"{r['achieved_tflops']:>9.0f}" if r.get("achieved_tflops") else f"{'-':>9}"
        print(f"{r['gpu']:<10} {r['ridge_flop_per_byte']:>7.0f}  {r['algo']:<8} "
              f"{r['intensity_flop_per_byte']:>8.0f} {r['bytes_source']:<11} {r['bound']:<8} "
              f"{r['attainable_tflops']:>10.0f} {ach}")
    print("(FLOP/B = matmul FLOPs executed / HBM bytes; ridge = peak 16-bit TFLOP/s / peak HBM "
          "bandwidth; TFLOP/s here count executed matmul FLOPs)")
    print(f"wrote {csv_path}\nwrote {png_path}")
    return 0
