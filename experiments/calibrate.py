"""Calibrate the H100 profile from microbenchmarks (never from attention kernels).

    # on the GPU machine (torch, Triton, CuPy, nvcc, pynvml):
    PYTHONPATH=. GPUSIM_GIT_COMMIT=<sha> python3 experiments/calibrate.py run --out-dir $OUT
    # here, on a CPU: compile every microkernel for sm_90 and check its SASS
    PYTHONPATH=. python experiments/calibrate.py check
    # here: rebuild the measured profile from the committed CSV
    PYTHONPATH=. python experiments/calibrate.py profile \
        --csv experiments/results/calibration_h100.csv --out hw_profiles/h100.measured.toml

`run` measures, one microkernel each:
  * HBM read, write and copy bandwidth (Triton streaming kernels over 2 GiB; torch copy_
    as a cross-check);
  * L2 read bandwidth against working-set size, 1 MB ... 1 GB (a persistent Triton kernel
    re-reading a buffer with ld.global.cg, so L1 is bypassed): the plateau and the knee;
    and with every SM reading the same lines at once, or a few blocks apart (l2_shared):
    what the L2 request coalescer's merged lookups do to the rate;
  * tensor-core throughput: a Triton tl.dot loop on operands held on chip (wgmma; bf16,
    fp16, fp8 e4m3) and a CUDA C mma.sync.aligned.m16n8k16 loop (bf16, fp16) and
    m16n8k32 (e4m3) with independent accumulators;
  * exp2 throughput: CUDA C ex2.approx.ftz.f32 (one MUFU.EX2 each) and Triton tl.exp2;
  * fp32 FMA throughput; shared-memory read bandwidth (ld.shared.v4, conflict-free);
  * pointer-chase latency of a plain load (ld.global.cg) in L2 and in DRAM, and of the
    same chase through the TMA unit (cp.async.bulk 16 B into SMEM completing on an
    mbarrier): the TMA's extra latency is the difference;
  * the same plain chase while 16-528 other CTAs stream reads from HBM or from L2
    (loaded_latency): how much later a load lands when the memory is busy; and from
    every SM at once, per SM (latency_per_sm): SMs nearer to L2 and farther from it;
  * cp.async tile copies into a 1-4 deep SMEM ring in Triton's loop order (cp_async): a
    copy's latency and the rate a CTA fills its SMEM at, one CTA alone and every SM busy;
  * fa2's CTA prologue (prologue_probe, held out): from its Q block's arrival to its first
    K/V stage's, with and without Triton's fence.proxy.async, alone on an SM and beside two
    CTAs streaming copies and running exp2s;
  * launch cost: do_bench of an empty kernel (the fixed cost of every kernel timed the
    way the validation sweep times attention), plus back-to-back eager and graph launches;
  * the device's own report (SMs, SMEM per SM and per block, registers, L2 size).
Every figure goes to calibration_h100.csv with provenance; the profile writer maps a
subset onto hw_profiles/h100.measured.toml (calibration/reduce.py, mapping) and copies
the rest from h100.toml with its sources. The microkernels, the benchmarks and the
reduction live in experiments/calibration/ (its __init__ says which file holds what);
this file is their command line.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import traceback

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)

from algorithms.errors import ResultsFileError  # noqa: E402
from kernels.provenance import write_csv_atomic  # noqa: E402

from experiments.calibration.compute_benches import (FP8_DOT_CHAINS, MORE_DOT_CHAINS,  # noqa: E402
                                                     ONLINE_DOT_CHAINS, ONLINE_PER_SM, ONLINE_STREAM_CHAINS,
                                                     ONLINE_STREAM_WIDE_CHAINS, ONLINE_STREAM_WIDE_PER_SM,
                                                     STREAM_CHAINS_D64, STREAM_PER_SM_D64, WIDE_DOT_CHAINS, _dot_tflops,
                                                     bench_dot_chain, bench_dot_chain_phase, bench_dot_chain_sm_phase,
                                                     bench_dot_chain_parts, bench_dot_chain_stream,
                                                     bench_dot_chain_sync,
                                                     bench_dot_exp_overlap, bench_dot_exp_timing, bench_dot_pair_timing,
                                                     bench_dot_fill, bench_dot_pair, bench_exp2_triton, bench_softmax_mix,
                                                     bench_wgmma_shapes)
from experiments.calibration.cross_compile import DOT_CHAIN_LOOPS, cmd_check, cmd_loops  # noqa: E402
from experiments.calibration.cuda_benches import (bench_cp_async, bench_cta_cycle, bench_cta_dispatch,  # noqa: E402
                                                  bench_cta_stamps, bench_cuda, bench_latency, bench_latency_clock,
                                                  bench_latency_per_sm, bench_launch, bench_loaded_latency,
                                                  bench_prologue_probe)
from experiments.calibration.cuda_kernels import CUDA_SRC, compile_cuda  # noqa: E402
from experiments.calibration.memory_benches import (bench_device, bench_hbm, bench_l2, bench_l2_duration,  # noqa: E402
                                                    bench_l2_ramp, bench_l2_round_trip, bench_l2_shared,
                                                    bench_l2_store, bench_launch_fill, bench_store_overlap,
                                                    bench_tile_write, bench_tma_setup)
from experiments.calibration.reduce import DEFAULT_PROFILE, from_profile_check, write_profile  # noqa: E402
from experiments.calibration.rows import COLUMNS, DEFAULT_CSV, median_rows, merge_rows  # noqa: E402
from experiments.calibration.runner import Runner  # noqa: E402
from experiments.calibration.triton_kernels import triton_kernels  # noqa: E402


def cmd_run(args) -> int:
    import torch

    from experiments import gpu_probe

    if gpu_probe.start("calibrate.py", os.path.join(args.out_dir, "calibration_h100.csv"), None) is None:
        return 2
    t_start = time.time()
    r = Runner(args)
    print(f"[calibrate] {r.prov['gpu']}, {r.sms} SMs, driver {r.prov['driver']}, clock "
          f"{r.prov['sm_clock_mhz']} MHz (max {r.prov['max_sm_clock_mhz']})", file=sys.stderr)
    K = triton_kernels()
    mod = None
    try:
        import cupy
        work = tempfile.mkdtemp()
        try:
            mod = cupy.RawModule(path=compile_cuda(work))
        except Exception as e:
            print(f"[calibrate] nvcc path failed ({e}); trying NVRTC through CuPy", file=sys.stderr)
            mod = cupy.RawModule(code=CUDA_SRC, options=("-std=c++17",))
            mod.get_function("empty_kernel")
    except Exception as e:
        print(f"[calibrate] CUDA C microkernels unavailable: {e}", file=sys.stderr)
        r.add("cuda_build", "nvcc", "nan", "", detail=f"failed: {str(e)[:300]}")
    steps = [("device", lambda: bench_device(r)), ("hbm", lambda: bench_hbm(r, K)),
             ("tile_write", lambda: bench_tile_write(r, K)),
             ("tma_setup", lambda: bench_tma_setup(r, K)),
             ("store_overlap", lambda: bench_store_overlap(r, K)),
             ("l2", lambda: bench_l2(r, K)),
             ("l2_store", lambda: bench_l2_store(r, K)),
             ("l2_round_trip", lambda: bench_l2_round_trip(r, K)),
             ("l2_duration", lambda: bench_l2_duration(r, K)),
             ("l2_shared", lambda: bench_l2_shared(r, K)),
             ("l2_ramp", lambda: bench_l2_ramp(r, K)),
             ("launch_fill", lambda: bench_launch_fill(r, K)),
             ("wgmma", lambda: [_dot_tflops(r, K, dt) for dt in ("bf16", "fp16", "fp8")]),
             ("wgmma_shapes", lambda: bench_wgmma_shapes(r, K)),
             ("dot_exp_overlap", lambda: bench_dot_exp_overlap(r, K)),
             ("dot_exp_timing", lambda: bench_dot_exp_timing(r, K)),
             ("dot_pair_timing", lambda: bench_dot_pair_timing(r, K)),
             ("dot_pair", lambda: bench_dot_pair(r, K)),
             ("dot_fill", lambda: bench_dot_fill(r, K)),
             ("dot_chain", lambda: bench_dot_chain(r, K)),
             ("dot_chain_wide", lambda: bench_dot_chain(r, K, WIDE_DOT_CHAINS, "dot_chain_wide")),
             ("dot_chain_more", lambda: bench_dot_chain(r, K, MORE_DOT_CHAINS, "dot_chain_more")),
             ("dot_chain_fp8", lambda: bench_dot_chain(r, K, FP8_DOT_CHAINS, "dot_chain_fp8", "fp8")),
             ("dot_chain_online", lambda: bench_dot_chain(r, K, ONLINE_DOT_CHAINS, "dot_chain_online", online=True,
                                                          per_sms=ONLINE_PER_SM)),
             ("dot_chain_phase", lambda: bench_dot_chain_phase(r, K)),
             ("dot_chain_sm_phase", lambda: bench_dot_chain_sm_phase(r, K)),
             ("dot_chain_stream", lambda: bench_dot_chain_stream(r, K)),
             ("dot_chain_online_stream", lambda: bench_dot_chain_stream(r, K, ONLINE_STREAM_CHAINS, STREAM_PER_SM_D64,
                                                                        "dot_chain_online_stream", online=True)),
             ("dot_chain_online_stream_wide", lambda: bench_dot_chain_stream(r, K, ONLINE_STREAM_WIDE_CHAINS,
                                                                             ONLINE_STREAM_WIDE_PER_SM,
                                                                             "dot_chain_online_stream_wide",
                                                                             online=True)),
             ("dot_chain_online_sync", lambda: bench_dot_chain_sync(r, K)),
             ("dot_chain_parts", lambda: bench_dot_chain_parts(r, K)),
             ("dot_chain_stream_d64", lambda: bench_dot_chain_stream(r, K, STREAM_CHAINS_D64, STREAM_PER_SM_D64,
                                                                     "dot_chain_stream_d64")),
             ("cuda", lambda: mod and bench_cuda(r, mod)),
             ("exp2_triton", lambda: bench_exp2_triton(r, K)),
             ("softmax_mix", lambda: bench_softmax_mix(r, K)),
             ("latency", lambda: mod and bench_latency(r, mod)),
             ("latency_per_sm", lambda: mod and bench_latency_per_sm(r, mod)),
             ("loaded_latency", lambda: mod and bench_loaded_latency(r, K, mod)),
             ("latency_clock", lambda: mod and bench_latency_clock(r, K, mod)),
             ("launch", lambda: bench_launch(r, K, mod)),
             ("cta_cycle", lambda: mod and bench_cta_cycle(r, mod)),
             ("cp_async", lambda: mod and bench_cp_async(r, mod)),
             ("prologue_probe", lambda: mod and bench_prologue_probe(r, mod)),
             ("cta_stamps", lambda: mod and bench_cta_stamps(r, mod, args.out_dir)),
             ("cta_dispatch", lambda: mod and bench_cta_dispatch(r, mod, args.out_dir))]
    only = set(args.only.split(",")) if args.only else None
    for name, step in steps:
        if only and name not in only:
            continue
        t0 = time.time()
        print(f"[calibrate] {name} ...", file=sys.stderr, flush=True)
        try:
            step()
        except Exception as e:
            traceback.print_exc()
            r.add(name, "error", "nan", "", detail=f"failed: {type(e).__name__}: {str(e)[:300]}")
        torch.cuda.synchronize()
        print(f"[calibrate] {name} done in {time.time() - t0:.1f} s", file=sys.stderr, flush=True)
    os.makedirs(args.out_dir, exist_ok=True)
    csv_path = os.path.join(args.out_dir, "calibration_h100.csv")
    write_csv_atomic(csv_path, r.rows, COLUMNS)
    prof = os.path.join(args.out_dir, "h100.measured.toml")
    try:
        write_profile(r.rows, prof)
        from_profile_check(prof)
    except Exception as e:
        print(f"[calibrate] profile not written: {e}", file=sys.stderr)
    print(f"[calibrate] wrote {csv_path} and {prof} in {time.time() - t_start:.0f} s", file=sys.stderr)
    print_summary(r.rows)
    return 0


def print_summary(rows):
    print(f"{'bench':<22} {'param':<28} {'value':>12} unit")
    for row in rows:
        if row["bench"] == "device":
            continue
        print(f"{row['bench']:<22} {row['param']:<28} {row['value']:>12} {row['unit']}")


def cmd_profile(args) -> int:
    from gpusim.artifacts import read_csv_rows   # (CPU side: `run` on the GPU machine needs no gpusim)

    rows = read_csv_rows(args.csv)
    m = write_profile(rows, args.out)
    from_profile_check(args.out)
    print(f"wrote {args.out}: {len(m)} measured keys")
    for (s, k), (v, _) in sorted(m.items()):
        print(f"  {s}.{k} = {v}")
    return 0


def cmd_merge(args) -> int:
    from gpusim.artifacts import read_csv_rows

    old = read_csv_rows(args.csv)
    runs = [read_csv_rows(path) for path in args.new]
    for name, rows in ((args.csv, old), *zip(args.new, runs)):
        missing = [c for c in ("bench", "param", "value") if rows and c not in rows[0]]
        if missing:
            raise ResultsFileError(f"{name}: no column {missing[0]!r}; a calibration CSV has {', '.join(COLUMNS)}")
    new = median_rows(runs)
    rows, changes = merge_rows(old, new)
    write_csv_atomic(args.csv, rows, COLUMNS)
    for bench, param, before, after in changes:
        print(f"  {bench:<22} {param:<28} {before if before is not None else '(new)':>12} -> {after}")
    print(f"merged {len(new)} rows of {len(runs)} run(s) into {args.csv} ({len(rows)} rows)")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("run", help="measure on the GPU machine")
    p.add_argument("--out-dir", default=os.environ.get("OUT") or os.path.join(ROOT, "experiments", "results"))
    p.add_argument("--quick", action="store_true", help="smaller buffers and fewer sizes")
    p.add_argument("--only", default="", help="comma-separated steps: device,hbm,tile_write,tma_setup,store_overlap,l2,wgmma,cuda,softmax_mix,"
                                              "l2_store,l2_round_trip,l2_duration,l2_ramp,launch_fill,wgmma_shapes,dot_exp_overlap,dot_exp_timing,dot_pair_timing,dot_pair,dot_fill,dot_chain,dot_chain_wide,dot_chain_more,dot_chain_fp8,dot_chain_online,dot_chain_phase,dot_chain_sm_phase,"
                                              "dot_chain_stream,dot_chain_stream_d64,dot_chain_online_stream,dot_chain_online_stream_wide,"
                                              "dot_chain_online_sync,dot_chain_parts,"
                                              "exp2_triton,latency,loaded_latency,"
                                              "launch,cta_cycle,cta_stamps,cta_dispatch,prologue_probe")
    p.set_defaults(func=cmd_run)
    p = sub.add_parser("check", help="compile every microkernel for sm_90 here and show its SASS")
    p.set_defaults(func=cmd_check)
    p = sub.add_parser("merge", help="merge a later run's CSV into the committed one (same bench and param: replaced)")
    p.add_argument("--new", required=True, action="append",
                   help="a run's calibration CSV; repeat for repeated runs (each key: the median run's row)")
    p.add_argument("--csv", default=DEFAULT_CSV)
    p.set_defaults(func=cmd_merge)
    p = sub.add_parser("loops", help="cross-compile the dot_chain kernels for sm_90 here and write their loops' "
                                     "instruction counts (the profile's reduction reads them)")
    p.add_argument("--out", default=DOT_CHAIN_LOOPS)
    p.set_defaults(func=cmd_loops)
    p = sub.add_parser("profile", help="write the measured profile from the CSV")
    p.add_argument("--csv", default=DEFAULT_CSV)
    p.add_argument("--out", default=DEFAULT_PROFILE)
    p.set_defaults(func=cmd_profile)
    args = ap.parse_args(argv)
    try:
        return args.func(args)
    except ResultsFileError as e:
        print(f"calibrate: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
