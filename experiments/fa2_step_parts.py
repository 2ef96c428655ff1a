"""What a measured fa2 step is made of: a diagnostic, not a calibration.

For each fa2 config of the measured sweep at one shape (default N = 16384,
D = 64 and 128, non-causal; configs without register spills), a step's
measured time in SM cycles beside its parts, each at a rate measured apart
from attention (calibration_h100.csv) or read off the compiled kernel
(cross-compiled for sm_90 here, kernels/sass.py):
- products: the step's flops at the tensor pipe's rate in cycles (the bf16
  tl.dot loop's TFLOP/s over its own in-kernel clock);
- MUFU: the exp2 instructions of a sub-partition's warps, 32 lanes each at
  a quarter of the SM's exp2 rate;
- other issue: the rest of the instructions those warps issue;
- stall clocks: what ptxas scheduled into one warp's trip.
The measured step is compared with two compositions, products + MUFU +
other issue (no overlap) and products + the larger of MUFU and all issue
(full overlap of the two elementwise pipes): neither ratio is a constant
when the overlap depends on the config. Nothing here feeds a profile.

Also the reduction calibrate.py makes of the `dot_chain` rows (the flash
step's chain latency and the serial fraction of its softmax) at three
tensor rates: the `h100` profile's, `h100.measured`'s and the rate in cycles;
and, for the one-CTA 4-warp `dot_chain` rows, the rate their products must
at least reach given the softmax chain ptxas scheduled between them.

    PYTHONPATH=. python experiments/fa2_step_parts.py [--seqlen 16384] [--jobs 2]

Writes experiments/results/fa2_step_parts_h100.md and .csv (CPU only).
"""
from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
from concurrent.futures import ProcessPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from algorithms.fa2 import warpgroup_replicas  # noqa: E402
from algorithms.problem import AttentionProblem, TileConfig  # noqa: E402
from gpusim.artifacts import atomic_write_text, read_csv_rows, write_csv  # noqa: E402

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
SUB_PARTITIONS = 4      # an SM's schedulers, one warp instruction a clock each
LANES = 32


def _compile(args):
    bm, bn, warps, stages, d = args
    from kernels.fa2 import compiled_resources

    # the measured sweep's launch specialisation (N a multiple of 16, non-causal)
    p = AttentionProblem(batch=1, heads=16, seqlen_q=4096, head_dim=d)
    r = compiled_resources(p, TileConfig(block_m=bm, block_n=bn, num_warps=warps, num_stages=stages))
    return args, r.get("n_regs"), (r.get("loop_parts") or [None])[0], r.get("spill_load_bytes_per_iter")


def tensor_flop_per_clock(calibration: list[dict]) -> tuple[float, str]:
    row = next(r for r in calibration if r["bench"] == "tensor_wgmma_triton" and r["param"] == "bf16")
    clock = float(row["clock_mhz_kernel"])
    sms = int(row.get("sm_count") or 132)
    return float(row["value"]) * 1e12 / (sms * clock * 1e6), f"{float(row['value']):.1f} TFLOP/s at {clock:.0f} MHz"


def kernel_clock_mhz(stamps_csv: str) -> float:
    """The median SM clock fa2's CTAs ran at (fa2_stamps.py, clock64 over the global timer)."""
    return statistics.median(float(r["clock_mhz"]) for r in read_csv_rows(stamps_csv))


def step_rows(measured: list[dict], seqlen: int, parts: dict, flop_per_clk: float, exp2_per_clk: float,
              clock_mhz: float) -> list[dict]:
    out = []
    for r in measured:
        if r["algo"] != "fa2" or r["status"] != "ok" or int(r["seqlen"]) != seqlen or int(r["causal"]):
            continue
        bm, bn, warps, stages, d = (int(r[k]) for k in ("block_m", "block_n", "num_warps", "num_stages", "head_dim"))
        got = parts.get((bm, bn, warps, stages, d))
        if got is None or got[1] is None or got[2]:        # not compiled, no loop, or spilling
            continue
        regs, loop, _ = got
        steps_per_sm = math.ceil(seqlen / bm) * int(r["batch"]) * int(r["heads"]) * math.ceil(seqlen / bn) / 132
        step = float(r["ms"]) * 1e-3 * clock_mhz * 1e6 / steps_per_sm
        replicas = warpgroup_replicas(TileConfig(block_m=bm, block_n=bn, num_warps=warps, num_stages=stages))
        products = (replicas + 1) * 2 * bm * bn * d / flop_per_clk
        warps_per_sub = warps / SUB_PARTITIONS
        mufu = loop["mufu"] * warps_per_sub * LANES / (exp2_per_clk / SUB_PARTITIONS)
        other = (loop["issue"] - loop["mufu"]) * warps_per_sub
        issue = loop["issue"] * warps_per_sub
        out.append({"head_dim": d, "block_m": bm, "block_n": bn, "num_warps": warps, "num_stages": stages,
                    "registers": regs, "measured_cycles": round(step), "products": round(products),
                    "mufu": round(mufu), "other_issue": round(other),
                    "stall_clocks_per_warp": loop["stall_clocks"], "issue_per_warp": loop["issue"],
                    "over_serial": round(step / (products + mufu + other), 3),
                    "over_overlapped": round(step / (products + max(mufu, issue)), 3)})
    return sorted(out, key=lambda x: tuple(x[k] for k in ("head_dim", "block_m", "block_n", "num_warps",
                                                           "num_stages")))


def softmax_chain_clocks(sass_text: str) -> tuple[int, int] | None:
    """(stall clocks from the wait for S to the issue of P V, stall clocks of
    the whole trip) of the first tensor loop: the part of a one-warpgroup
    step nothing overlaps (the products wait on it and it on them), against
    the trip (whose rest runs while P V computes)."""
    from kernels import sass

    words = sass.stall_counts(sass_text)
    spans = sass.tensor_loop_spans(words)
    if not spans:
        return None
    first, last = spans[0]
    body = words[first:last + 1]
    ops = [sass.opcode(i) for _, i, _ in body]
    tensor = [k for k, o in enumerate(ops) if o.endswith("GMMA")]
    wait = next((k for k in range(tensor[0], len(body)) if "DEPBAR" in body[k][1]), None)
    start = tensor[-1]      # back from the last product to the arrive that opens its group
    while start > 0 and (ops[start - 1].endswith("GMMA") or ops[start - 1] == "WARPGROUP"):
        start -= 1
    if wait is None or wait >= start:
        return None
    return sum(c for _, _, c in body[wait + 1:start]), sum(c for _, _, c in body)


def dot_chain_one_cta(calibration: list[dict]) -> list[dict]:
    """The one-CTA 4-warp dot_chain rows: cycles a step, the softmax chain's
    stall clocks (cross-compiled here) and the flop a clock the products
    must then reach at least."""
    from experiments.calibration.cross_compile import compile_dot_chain
    from kernels import sass

    out = []
    for r in calibration:
        if r["bench"] != "dot_chain_cta_cycles" or not r["param"].endswith("_w4_x1"):
            continue
        bm, bn, d = map(int, r["param"].split("_")[0].split("x"))
        chain = softmax_chain_clocks(sass.cuobjdump(compile_dot_chain(bm, bn, d, 4), "-sass") or "")
        if chain is None:
            continue
        cycles = float(r["value"])
        flops = 2 * 2 * bm * bn * d
        out.append({"shape": r["param"], "cycles": round(cycles), "softmax_chain": chain[0], "trip": chain[1],
                    "flop_per_clk_at_least": round(flops / (cycles - chain[0])) if cycles > chain[0] else None})
    return out


def dot_chain_reductions(calibration: list[dict], rates: dict) -> list[tuple]:
    """calibrate.py's dot_chain reduction at each tensor rate (flop a clock)."""
    from experiments.calibration import reduce
    from gpusim.profile import load_profile

    measured = load_profile("h100.measured")
    units = {"exp2": measured.units.exp2_per_clk_per_sm, "alu": measured.units.alu_ops_per_clk_per_sm,
             "smem": measured.units.smem_bytes_per_clk_per_sm, "operand_bytes": measured.wgmma_operand_bytes}
    out = []
    for name, rate in rates.items():
        steps = reduce._dot_chain_steps(calibration, {**units, "tensor": rate})
        out.append((name, rate, reduce.flash_step_latencies(steps), reduce.chain_serial_fractions(steps)))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--measured", default=os.path.join(RESULTS, "validation_h100.csv"))
    ap.add_argument("--calibration", default=os.path.join(RESULTS, "calibration_h100.csv"))
    ap.add_argument("--stamps", default=os.path.join(RESULTS, "fa2_stamps_h100.csv"))
    ap.add_argument("--seqlen", type=int, default=16384)
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--out", default=os.path.join(RESULTS, "fa2_step_parts_h100"))
    a = ap.parse_args(argv)
    from gpusim.profile import load_profile

    measured = read_csv_rows(a.measured)
    calibration = read_csv_rows(a.calibration)
    flop_per_clk, tensor_source = tensor_flop_per_clock(calibration)
    clock = kernel_clock_mhz(a.stamps)
    exp2 = load_profile("h100.measured").units.exp2_per_clk_per_sm
    configs = sorted({tuple(int(r[k]) for k in ("block_m", "block_n", "num_warps", "num_stages", "head_dim"))
                      for r in measured if r["algo"] == "fa2" and int(r["seqlen"]) == a.seqlen})
    parts = {}
    with ProcessPoolExecutor(max_workers=a.jobs) as ex:
        for n, (args, regs, loop, spill) in enumerate(ex.map(_compile, configs), 1):
            parts[args] = (regs, loop, spill)
            print(f"[{n}/{len(configs)}] compiled {args}", file=sys.stderr, flush=True)
    rows = step_rows(measured, a.seqlen, parts, flop_per_clk, exp2, clock)
    write_csv(a.out + ".csv", rows)

    h100, h100m = load_profile("h100"), load_profile("h100.measured")
    rates = {"h100 profile": h100.matmul_flops_per_s_per_sm("wgmma", "bf16") / h100.clock_hz,
             "h100.measured profile": h100m.matmul_flops_per_s_per_sm("wgmma", "bf16") / h100m.clock_hz,
             "in cycles (tl.dot loop)": flop_per_clk}
    lines = ["# What a measured fa2 step is made of", "",
             f"Generated by `PYTHONPATH=. python experiments/fa2_step_parts.py --seqlen {a.seqlen}` "
             f"(a diagnostic: nothing here feeds a profile). Steps of `{os.path.basename(a.measured)}` "
             f"(fa2, N = {a.seqlen}, non-causal, configs without spills) in SM cycles at {clock:.0f} MHz, "
             f"the median clock fa2's CTAs ran at (`{os.path.basename(a.stamps)}`). Products at "
             f"{flop_per_clk:.0f} flop a clock an SM (bf16 tl.dot loop, {tensor_source} in the kernel); "
             f"MUFU at {exp2:g} exp2 a clock an SM; instructions and stall clocks per warp and trip "
             "from the cross-compiled sm_90 kernel (kernels/sass.py).", "",
             "| D | config | regs | measured | products | MUFU | other issue | stall clocks / issue a warp "
             "| measured / (products + MUFU + other) | measured / (products + max(MUFU, issue)) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['head_dim']} | {r['block_m']}x{r['block_n']} w{r['num_warps']} s{r['num_stages']} | "
                     f"{r['registers']} | {r['measured_cycles']} | {r['products']} | {r['mufu']} | "
                     f"{r['other_issue']} | {r['stall_clocks_per_warp']} / {r['issue_per_warp']} | "
                     f"{r['over_serial']:.2f} | {r['over_overlapped']:.2f} |")
    if rows:
        for key, what in (("over_serial", "no overlap"), ("over_overlapped", "full overlap")):
            v = [r[key] for r in rows]
            lines.append("")
            lines.append(f"{what}: {len(v)} configs, median {statistics.median(v):.2f}, "
                         f"{min(v):.2f}-{max(v):.2f}")
        ratio = [r["stall_clocks_per_warp"] / r["issue_per_warp"] for r in rows]
        lines.append("")
        lines.append(f"stall clocks over issued instructions, a warp's trip: {min(ratio):.2f}-{max(ratio):.2f}")
    lines += ["", "## calibrate.py's dot_chain reduction at three tensor rates", "",
              "The chain's latency (one 4-warp CTA an SM, cycles) and the serial fraction of the softmax "
              "(SM saturated) as calibrate.py derives them, with the products at each rate:", "",
              "| tensor rate | flop a clock | chain latency, cycles | serial fraction |", "|---|---|---|---|"]
    for name, rate, lat, frac in dot_chain_reductions(calibration, rates):
        lines.append(f"| {name} | {rate:.0f} | " + ", ".join(f"{k} {v:.0f}" for k, v in lat.items()) + " | "
                     + ", ".join(f"{k} {v:.2f}" for k, v in frac.items()) + " |")
    lines += ["", "## One warpgroup alone: what its products must reach", "",
              "`dot_chain` with one 4-warp CTA an SM (clock64 cycles a step, calibration_h100.csv): the "
              "softmax's stall clocks from the wait for S to the issue of P V lie between the two "
              "products of a step, which nothing else on the SM overlaps; the rest of the step is the "
              "products (and latencies), so they run at least this fast:", "",
              "| shape | cycles a step | softmax chain (stall clocks) | whole trip (stall clocks) | "
              "products at least, flop a clock |", "|---|---|---|---|---|"]
    for r in dot_chain_one_cta(calibration):
        lines.append(f"| {r['shape']} | {r['cycles']} | {r['softmax_chain']} | {r['trip']} | "
                     f"{r['flop_per_clk_at_least']} |")
    atomic_write_text(a.out + ".md", "\n".join(lines) + "\n")
    print(f"wrote {a.out}.md and .csv ({len(rows)} configs)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
