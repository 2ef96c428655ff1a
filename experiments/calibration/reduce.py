"""Measured rows -> hw_profiles/h100.measured.toml: which row sets which profile
key (mapping) and the reductions behind them (the L2 knee, latencies at the
profile's clock, the flash step's chain latency and serial fraction from the
dot_chain rows); every other key is copied from h100.toml with its source.
"""
from __future__ import annotations

import math
import os
import statistics
import sys

from . import ROOT
from .cross_compile import dot_chain_loop
from .cuda_benches import CTA_CYCLE_ROUNDS, CTA_CYCLE_THREADS
from .memory_benches import STORE_OVERLAP_DRAINED, STORE_OVERLAP_WARPS, TMA_SETUP_DESCRIPTORS

DEFAULT_PROFILE = os.path.join(ROOT, "hw_profiles", "h100.measured.toml")
# cta_dispatch rows whose rounds the SMs' warp launch bounds (launch.warp_dispatch_cycles)
DISPATCH_THREADS = 128
DISPATCH_BOUND_PER_SM = (8, 12, 16)

BASE_PROFILE = os.path.join(ROOT, "hw_profiles", "h100.toml")


def _val(rows, bench, param):
    for row in rows:
        if row["bench"] == bench and row["param"] == param:
            try:
                v = float(row["value"])
            except ValueError:
                return None, row
            return (v if math.isfinite(v) else None), row
    return None, None


def l2_plateau_and_knee(rows):
    """The L2 plateau: the median bandwidth over working sets of 4-32 MB, the range of
    the K/V an attention wave keeps hot (the heads 132 CTAs cover: 4-8 MB here) and well
    inside the 50 MB. Sets of 1-2 MB read faster (11 TB/s in the first run; likely
    served by the near L2 partition), which attention's hot sets do not fit, so they
    are left out (the CSV keeps them). The knee: the smallest working set whose bandwidth
    falls below half-way between the plateau and the largest working set's (HBM)."""
    pts = []
    for row in rows:
        if row["bench"] == "l2_read_bandwidth":
            try:
                pts.append((int(row["param"].rstrip("MB")), float(row["value"])))
            except ValueError:
                pass
    pts.sort()
    if len(pts) < 3:
        return None, None, pts
    plateau = statistics.median([bw for mb, bw in pts if 4 <= mb <= 32] or [pts[0][1]])
    floor = pts[-1][1]
    mid = (plateau + floor) / 2
    knee = next((mb for mb, bw in pts if bw < mid), None)
    return plateau, knee, pts


def latency_at_clock(rows, regime: str, profile_mhz: float):
    """A load's latency in cycles at the profile's clock, from latency_clock's
    two chases (alone at the top clock, and with the power cap holding the
    clock down): cycles = c + t x f, c the part that runs on the SM's clock
    (cycles) and t the part that does not (ns: L2's and HBM's own clocks),
    solved from the two (clock, cycles) points and taken at profile_mhz.
    (cycles, how it was found, the row) or None without both rows."""
    c1, alone = _val(rows, "latency_clock", f"{regime}_alone_cycles")
    c2, capped = _val(rows, "latency_clock", f"{regime}_capped_cycles")
    try:
        f1, f2 = float(alone["clock_mhz_nvml"]), float(capped["clock_mhz_nvml"])
    except (TypeError, ValueError, KeyError):
        return None
    if c1 is None or c2 is None:
        return None
    if not (f1 > f2 > 0) or not (c1 > 0 and c2 > 0):
        return None
    t = (c1 - c2) / (f1 - f2)           # cycles a MHz: ns of the part off the SM's clock
    c = c1 - t * f1
    if t < 0 or c < 0:                  # (outside the model: keep the plain chase)
        return None
    cycles = c + t * profile_mhz
    how = (f"{c1:.0f} cycles at {f1:.0f} MHz alone and {c2:.0f} at {f2:.0f} MHz beside a tl.dot loop held "
           f"by the power cap (latency_clock): {c:.0f} cycles on the SM's clock + {t * 1e3:.0f} ns off it, "
           f"= {cycles:.0f} cycles at the profile's {profile_mhz:.0f} MHz")
    return cycles, how, capped


def chase_latency(rows, regime: str, plain: str, profile_mhz: float):
    """(cycles, how, row) of a pointer chase for the profile: latency_at_clock's
    split where the CSV has it, else `latency`'s plain chase (`plain`) as
    measured; (None, '', None) without either. `how` continues the source's text."""
    at_clock = latency_at_clock(rows, regime, profile_mhz)
    if at_clock:
        cycles, how, row = at_clock
        return cycles, f", {how}", row
    v, row = _val(rows, "latency", plain)
    return (v, f" = {v:.0f} cycles", row) if v else (None, "", None)


def sm_latency_offsets(rows, n_sms: int):
    """(each SM's L2 round trip less the median SM's, by SM id; the round
    trips, cycles; SM 0's row) from `latency_per_sm` rows, or None unless
    all `n_sms` SMs have one."""
    per_sm = {}
    for r in rows:
        if r["bench"] == "latency_per_sm" and r["param"].startswith("sm_"):
            v, row = _val(rows, "latency_per_sm", r["param"])
            if v:
                per_sm[int(r["param"][3:])] = (v, row)
    if sorted(per_sm) != list(range(n_sms)):
        return None
    cycles = [per_sm[i][0] for i in range(n_sms)]
    middle = statistics.median(cycles)
    return [round(c - middle, 1) + 0.0 for c in cycles], cycles, per_sm[0][1]


def tensor_alu_serial_fractions(rows):
    """{shape/kind: f} from the dot_exp_overlap rows: with product CTAs and elementwise
    CTAs sharing each SM, T_split = T_dot + f x T_elementwise (f = 0: the units overlap
    fully, 1: not at all)."""
    t = {r["param"]: float(r["value"]) for r in rows if r["bench"] == "dot_exp_overlap"}
    out = {}
    for key in t:
        if not key.endswith("_dot"):
            continue
        shape = key[: -len("_dot")]
        for kind, split in (("exp", "split"), ("fma", "split_fma")):
            alone, both = t.get(f"{shape}_{kind}"), t.get(f"{shape}_{split}")
            if alone and both:
                out[f"{shape}_{kind}"] = (both - t[key]) / alone
    return out


# the dot_chain bench of each operand type (compute_benches.bench_dot_chain)
DOT_CHAIN_BENCHES = {"bf16": "dot_chain", "fp8": "dot_chain_fp8"}


def _dot_chain_steps(rows, rates, dtype: str = "bf16"):
    """{shape_wN: (cycles a step with one CTA per SM, with the SM saturated
    (the lesser of the 2- and 4-CTA times per CTA), its products' cycles,
    its softmax's cycles)} from the dot_chain rows (dot_chain_fp8's for
    dtype fp8), the parts at the SM's measured rates: each product its
    tensor time or its SMEM operand reads, whichever is longer; the softmax
    its exp2s on the MUFU and then its other instructions on the issue
    slots, as the compiled loop has them (dot_chain_loop), one after the
    other as fa2's steps charge them (algorithms/fa2.step_ops). rates: per
    SM per clock, 'tensor' (flops of the dtype), 'exp2', 'alu' (issue
    slots, thread-instructions), 'smem' (bytes), and 'operand_bytes'
    (HardwareProfile.wgmma_operand_bytes)."""
    bench = DOT_CHAIN_BENCHES[dtype]
    elem_bytes = 1 if dtype == "fp8" else 2
    timed, alone = {}, {}
    for r in rows:
        clock = row_clock(r)
        if r["bench"] == bench and clock:
            shape, warps, ctas = r["param"].rsplit("_", 2)
            timed.setdefault((shape, warps), {})[int(ctas[1:])] = float(r["value"]) * clock   # µs x MHz
        elif r["bench"] == f"{bench}_cta_cycles" and r["param"].endswith("_x1"):
            # one CTA an SM: its own clock64 count, launch and clock aside
            shape, warps, _ = r["param"].rsplit("_", 2)
            alone[(shape, warps)] = float(r["value"])
    out = {}
    for (shape, warps), t in timed.items():
        if not {1, 2, 4} <= set(t):
            continue
        bm, bn, d = map(int, shape.split("x"))
        n_warps = int(warps[1:])

        def product(m, n, k, a_in_smem):
            return max(2 * m * n * k / rates["tensor"],
                       rates["operand_bytes"](m, n, k, elem_bytes, a_in_smem, n) / rates["smem"])

        loop = dot_chain_loop(bm, bn, d, n_warps, dtype)
        lanes = n_warps * 32
        softmax = (loop["mufu"] * lanes / rates["exp2"]
                   + (loop["issue"] - loop["mufu"]) * lanes / rates["alu"])
        out[f"{shape}_{warps}"] = (alone.get((shape, warps), t[1]), min(t[2] / 2, t[4] / 4),
                                   product(bm, bn, d, True) + product(bm, d, bn, False), softmax)
    return out


def row_clock(row) -> float | None:
    """The SM clock (MHz) a row's launch ran at: read in the kernel (clock64
    over the global timer) where the row has it, else NVML's samples around
    it (unreliable for sub-ms launches: 1335-1980 MHz for one kernel whose
    in-kernel cycles agreed to 0.01%, session 12)."""
    for key in ("clock_mhz_kernel", "clock_mhz_nvml"):
        try:
            v = float(row.get(key) or "nan")
        except ValueError:
            continue
        if math.isfinite(v) and v > 0:
            return v
    return None


def flash_step_latencies(steps):
    """{shape: cycles}: a one-warpgroup (4-warp) step alone on its SM, less
    its parts -- the chain's latency, which a lone warpgroup waits out and
    other CTAs or warpgroups can fill. The 8-warp rows are left out: their
    two warpgroups already fill part of it."""
    return {k: alone - products - softmax for k, (alone, _, products, softmax) in steps.items()
            if k.endswith("_w4")}


def chain_serial_fractions(steps):
    """{shape: f}: with the SM saturated, a step takes its products plus f
    times its softmax (f = 0: the tensor cores never wait for the softmax
    pipes, 1: never overlap them)."""
    return {k: (saturated - products) / softmax for k, (_, saturated, products, softmax) in steps.items()}


def mapping(rows):
    """{(section, key): (value, source)} for every profile key a measurement sets."""
    import tomllib

    base = tomllib.loads(open(BASE_PROFILE).read())
    out = {}
    any_row = rows[0] if rows else {}
    gpu_desc = f"{any_row.get('gpu', '?')}, {any_row.get('sm_count', '?')} SMs, driver {any_row.get('driver', '?')}"
    date = (any_row.get("date") or "")[:10]
    cmd = any_row.get("command", "experiments/calibrate.py run")

    def cite(what, row, clock=None):
        clk = clock or (row or {}).get("clock_mhz_kernel") or (row or {}).get("clock_mhz_nvml") or "?"
        command = (row or {}).get("command") or cmd
        when = ((row or {}).get("date") or "")[:10] or date
        return (f"our microbenchmark, {when}, `{command}`, {gpu_desc}, SM clock {clk} MHz read during the run: "
                f"{what} (experiments/results/calibration_h100.csv)")

    # device query
    for key, param in (("gpu.sm_count", "multi_processor_count"),
                       ("residency.smem_per_sm_bytes", "shared_memory_per_multiprocessor"),
                       ("residency.smem_per_block_bytes", "shared_memory_per_block_optin"),
                       ("residency.registers_per_sm", "regs_per_multiprocessor"),
                       ("residency.max_threads_per_sm", "max_threads_per_multi_processor"),
                       ("residency.smem_reserved_per_cta_bytes", "reservedSharedMemPerBlock"),
                       ("l2.capacity_bytes", "l2_cache_size"),
                       ("hbm.capacity_bytes", "total_memory")):
        v, row = _val(rows, "device", param)
        if v is not None:
            out[tuple(key.split("."))] = (int(v), f"device query on the lent GPU, {date} ({gpu_desc}): "
                                                  f"{row['detail']} {param} = {int(v)}")
    # tensor cores
    peak16 = base["tensor_cores"]["peak_dense_tflops_16bit"]
    n_sms = int(any_row.get("sm_count") or base["gpu"]["sm_count"])
    bf16, row_bf = _val(rows, "tensor_wgmma_triton", "bf16")
    if bf16:
        mix = [(row_clock(r), r) for r in rows if r["bench"] == "dot_chain"
               and not r["param"].endswith("_x1") and r.get("clock_mhz_kernel")]
        if mix:
            # the clock the flash-step mix runs at with the SM saturated, read in the
            # kernel: the per-clock rates and cycle counts of the profile become
            # seconds at it. (The bf16 tl.dot loop alone, every SM's tensor pipe
            # busy, runs slower: its own row says at which clock.)
            clocks = sorted(c for c, _ in mix)
            clk = statistics.median(clocks)
            row_clk = min(mix, key=lambda t: abs(t[0] - clk))[1]
            out[("gpu", "sm_clock_mhz")] = (round(clk, 0), cite(
                f"SM clock read in the kernel (clock64 over the global timer, median CTA) while the "
                f"dot_chain flash-step mix ran with 2 and 4 CTAs an SM, median of {len(clocks)} launches "
                f"({clocks[0]:.0f}-{clocks[-1]:.0f} MHz); per-clock rates and cycle counts become seconds "
                f"at it", row_clk, clk))
        elif row_bf.get("clock_mhz_nvml"):     # a CSV from before in-kernel clocks
            clk = row_bf["clock_mhz_nvml"]
            out[("gpu", "sm_clock_mhz")] = (float(clk), cite(
                "median SM clock NVML reported while the tensor cores ran the bf16 tl.dot loop "
                "(the regime attention kernels run in); per-clock rates below use it", row_bf, clk))
        # The tensor pipe's rate in flop a clock, over the clock the tl.dot loop ran
        # at (read in the kernel: with every SM's tensor pipe busy the clock drops,
        # 1647 MHz on the lent H100, against the flash-step mix's 1816), and at the
        # profile's clock. Taken as TFLOP/s over peak, the loop's 885.8 TFLOP/s at
        # 1647 MHz became 3695 flop a clock at 1816 MHz, 9% under the 4074 the loop
        # ran at, and the chain latency and serial fraction reduced from dot_chain
        # with it (below) absorbed the difference (experiments/fa2_step_parts.py).
        profile_clk = float(out[("gpu", "sm_clock_mhz")][0]) if ("gpu", "sm_clock_mhz") in out \
            else float(base["gpu"]["sm_clock_mhz"])
        per_clk = bf16 * 1e12 / (n_sms * (row_clock(row_bf) or profile_clk) * 1e6)
        out[("tensor_cores", "sustained_fraction")] = (
            round(min(1.0, per_clk * n_sms * profile_clk * 1e6 / (peak16 * 1e12)), 4),
            cite(f"Triton tl.dot loop (wgmma) on operands held on chip, bf16 {bf16:.1f} TFLOP/s at "
                 f"{row_clock(row_bf) or profile_clk:.0f} MHz: {per_clk:.0f} flop a clock an SM, at the profile's "
                 f"{profile_clk:.0f} MHz / datasheet {peak16} dense", row_bf))
    ms_bf, row_ms = _val(rows, "tensor_mma_sync_cuda", "bf16")
    if bf16 and ms_bf:
        # per clock, each loop at the clock it ran at (mma.sync's at 1830 MHz, the
        # tl.dot loop's at 1647 on the lent H100)
        ms_per_clk = ms_bf * 1e12 / (n_sms * (row_clock(row_ms) or profile_clk) * 1e6)
        out[("tensor_cores", "mma_sync_relative_rate")] = (
            round(min(1.0, ms_per_clk / per_clk), 4),
            cite(f"CUDA C mma.sync.m16n8k16 bf16 loop {ms_bf:.1f} TFLOP/s at {row_clock(row_ms) or profile_clk:.0f} MHz "
                 f"({ms_per_clk:.0f} flop a clock an SM) / wgmma tl.dot loop's {per_clk:.0f}", row_ms))
    # units
    # (each SM's own cycles where the run has them: the in-kernel clock,
    # clock64 over the global timer, read 2025-2085 MHz around these loops in
    # session 22, above the H100's 1980 MHz top, and the per-second rates it
    # divides take the launch's ramp and tail in: 1-7% low against the span)
    for key, bench, what in (
            ("exp2_per_clk_per_sm", "exp2_cuda", "ex2.approx.ftz.f32 (MUFU.EX2) throughput"),
            ("alu_ops_per_clk_per_sm", "ffma_cuda", "fp32 FMA throughput"),
            ("smem_bytes_per_clk_per_sm", "smem_read_cuda", "conflict-free ld.shared.v4 bytes")):
        v, row = _val(rows, bench, "per_clk_per_sm_spanned")
        how = "a clock an SM, by each SM's clock64 over its blocks' span (no timer; median over SMs)"
        if not v:
            v, row = _val(rows, bench, "per_clk_per_sm")
            how = "/ (SMs x SM clock read in-kernel: clock64 over the global timer)"
        if v:
            out[("units", key)] = (round(v, 2), cite(f"{what} {how} = {v:.2f}", row))
    serial = tensor_alu_serial_fractions(rows)
    if serial:   # the fallback where the CSV has no dot_chain rows (replaced below)
        row = next(r for r in rows if r["bench"] == "dot_exp_overlap")
        v = min(1.0, statistics.median(serial.values()))
        out[("units", "tensor_alu_serial_fraction")] = (round(v, 2), cite(
            "wgmma CTAs beside exp2-only or FMA-only CTAs on one SM take T_dot + f x T_elementwise; "
            "f per shape " + ", ".join(f"{k} {x:.2f}" for k, x in serial.items())
            + f"; median {v:.2f}", row, row.get("clock_mhz_nvml")))
    # the dependent chain of a flash step, beyond its parts' throughput times
    units = {k: out[("units", k)][0] for k in ("exp2_per_clk_per_sm", "alu_ops_per_clk_per_sm",
                                              "smem_bytes_per_clk_per_sm") if ("units", k) in out}
    if bf16 and len(units) == 3:
        # every part in cycles, as dot_chain counts them: the tensor pipe at its
        # rate a clock (so the engine, charging products at that rate and the
        # latency at the profile's clock, gives back the one-CTA step it was taken from);
        # fp8's products at the datasheet's fp8 / bf16 ratio of it, as the engine charges them
        fp8_ratio = base["tensor_cores"]["peak_dense_tflops_fp8"] / peak16
        operand_bytes = _profile_module().parse_profile(base, BASE_PROFILE).wgmma_operand_bytes
        for dtype, suffix, tensor_rate, what in (
                ("bf16", "", per_clk, ""),
                ("fp8", "_fp8", per_clk * fp8_ratio,
                 f"the fp8 chain (e4m3 operands, P converted to e4m3; products at {fp8_ratio:g} x the bf16 "
                 f"loop's rate a clock, the datasheet's ratio): ")):
            bench = DOT_CHAIN_BENCHES[dtype]
            chain_clocks = sorted(c for c in (row_clock(r) for r in rows if r["bench"] == bench) if c)
            chain_clock = f"{chain_clocks[0]:.0f}-{chain_clocks[-1]:.0f} (per launch, in the kernel)" if chain_clocks else None
            rates = {"tensor": tensor_rate, "exp2": units["exp2_per_clk_per_sm"],
                     "alu": units["alu_ops_per_clk_per_sm"], "smem": units["smem_bytes_per_clk_per_sm"],
                     "operand_bytes": operand_bytes}
            steps = _dot_chain_steps(rows, rates, dtype)
            latencies = flash_step_latencies(steps)
            row = next((r for r in rows if r["bench"] == bench), None)
            if latencies:
                v = max(0.0, statistics.median(latencies.values()))
                out[("units", f"flash_step_latency_cycles{suffix}")] = (round(v, 0), cite(
                    what + "one flash step's dependent chain on operands held on chip (S = A·B, row max, exp2, "
                    "acc += P·V), timed with one 4-warp CTA per SM, less its parts at the rates measured "
                    "here (tl.dot loop, SMEM operand reads; its exp2s on the MUFU, then its other "
                    "instructions, as its sm_90 loop has them, on the issue slots), in SM clocks: "
                    + ", ".join(f"{k} {x:.0f}" for k, x in latencies.items()) + f"; median {v:.0f}",
                    row, chain_clock))
            fractions = chain_serial_fractions(steps)
            if fractions:
                v = min(1.0, max(0.0, statistics.median(fractions.values())))
                earlier = ", ".join(f"{k} {x:.2f}" for k, x in serial.items())
                aside = "" if suffix else (
                    " (dot_exp_overlap, with exp2-only or FMA-only CTAs beside product-only CTAs, gave "
                    + (earlier or "no rows") + ": separate streams of back-to-back MUFU or FFMA "
                    "instructions, not the attention mix, where each warp interleaves them with its "
                    "wgmma waits; the profile takes the chain's figure.)")
                out[("units", f"tensor_alu_serial_fraction{suffix}")] = (round(v, 2), cite(
                    what + "the same dot_chain kernel with 2 and 4 CTAs per SM (the SM saturated) takes its "
                    "products plus f x its softmax (its exp2s, then its other instructions, as its sm_90 "
                    "loop has them), the parts at the rates measured here; f per shape "
                    + ", ".join(f"{k} {x:.2f}" for k, x in fractions.items()) + f"; median {v:.2f}."
                    + aside, row, chain_clock))
    # L2
    plateau, knee, pts = l2_plateau_and_knee(rows)
    if plateau:
        row = next(r for r in rows if r["bench"] == "l2_read_bandwidth")
        out[("l2", "bandwidth_gbps")] = (round(plateau, 0), cite(
            f"persistent Triton ld.global.cg re-read of a working set, median over working sets "
            f"of 4-32 MB = {plateau:.0f} GB/s (bandwidth falls below half-way to HBM at {knee} MB)",
            row, row.get("clock_mhz_nvml")))
    port = [(float(r["value"]), r) for r in rows if r["bench"] == "l2_sm_port"
            and _val(rows, "l2_sm_port", r["param"])[0]]
    if port and ("l2", "sm_port_bytes_per_clk") in {(s, k) for s in base for k in base[s]
                                                     if isinstance(base[s], dict)}:
        v, row = max(port, key=lambda t: t[0])
        out[("l2", "sm_port_bytes_per_clk")] = (round(v, 1), cite(
            f"a single CTA re-reading a 4 MB L2-resident set (ld.global.cg), best of the single-CTA probes in the CSV "
            f"= {v:.1f} B/clk at the NVML clock", row, row.get("clock_mhz_nvml")))
    store = [(float(r["value"]), r) for r in rows if r["bench"] == "l2_sm_store"
             and _val(rows, "l2_sm_store", r["param"])[0]]
    if store:
        v, row = max(store, key=lambda t: t[0])
        out[("l2", "sm_store_bytes_per_clk")] = (round(v, 1), cite(
            f"a single CTA storing into a 4 MB L2-resident set (STG.E.128), best of the single-CTA probes in "
            f"the CSV = {v:.1f} B/clk at the NVML clock", row, row.get("clock_mhz_nvml")))
    profile_mhz = float(out[("gpu", "sm_clock_mhz")][0]) if ("gpu", "sm_clock_mhz") in out \
        else float(base["gpu"]["sm_clock_mhz"])
    cycles, how, row = chase_latency(rows, "l2", "plain_l2", profile_mhz)
    if cycles:
        out[("l2", "hit_latency_cycles")] = (round(cycles, 0), cite(
            f"1-thread pointer chase, ld.global.cg, 4 MB working set (L2 hits){how}", row))
    per_sm = sm_latency_offsets(rows, n_sms)
    if per_sm:
        offsets, cycles, row = per_sm
        out[("l2", "sm_latency_offsets_cycles")] = (offsets, cite(
            f"1-thread pointer chase from every SM at once (calibrate.py latency_per_sm), ld.global.cg, 4 MB "
            f"L2-resident set: {min(cycles):.0f}-{max(cycles):.0f} cycles, median {statistics.median(cycles):.0f}; "
            f"each SM's less the median, by SM id", row))
    # HBM
    v, row = _val(rows, "hbm_bandwidth", "copy")
    if v:
        peak = base["hbm"]["peak_bandwidth_gbps"]
        out[("hbm", "sustained_bandwidth_gbps")] = (round(min(v, peak), 0), cite(
            f"Triton 2 GiB device-to-device copy, bytes read + written / time = {v:.0f} GB/s "
            f"(read-only and write-only kernels in the CSV)", row, row.get("clock_mhz_nvml")))
    cycles, how, row = chase_latency(rows, "dram", "plain_dram", profile_mhz)
    if cycles:
        out[("hbm", "latency_cycles")] = (round(cycles, 0), cite(
            f"1-thread pointer chase, ld.global.cg, random 128 B lines over 1 GB (L2 misses, TLB "
            f"misses included){how}", row))
        out[("copy", "plain_load_latency_cycles")] = (round(cycles, 0), cite(
            f"a global load that misses L2: the DRAM pointer chase{how}", row))
    v, row = _val(rows, "latency", "tma_extra_dram")
    if v is not None and v >= 0:
        out[("copy", "tma_extra_latency_cycles")] = (round(v, 0), cite(
            f"the same DRAM chase through cp.async.bulk + mbarrier minus the plain chase = {v:.0f} cycles",
            row))
    alone = [(float(r["value"]), r) for r in rows if r["bench"] == "store_overlap"
             and r["param"].endswith("B_store") and int(r["param"].split("B_")[0]) >= STORE_OVERLAP_DRAINED]
    if alone:
        per_warp = sorted((int(r["param"].split("B_")[0]) / v / STORE_OVERLAP_WARPS, r) for v, r in alone if v > 0)
        v, row = per_warp[(len(per_warp) - 1) // 2]
        out[("l2", "sm_store_bytes_per_clk_per_warp")] = (round(v, 2), cite(
            f"one {STORE_OVERLAP_WARPS}-warp CTA an SM storing 16-64 KB from registers an iteration "
            f"(store_overlap): " + ", ".join(f"{b:.2f}" for b, _ in per_warp) + f" B/clk a warp, median "
            f"{v:.2f}, where 8-32 warps of one CTA reach the SM's write path (l2_store, 31.3-31.9 B/clk)",
            row))
    v, row = _val(rows, "tma_setup", "descriptors_x1")
    if v is not None and v >= 0:
        out[("copy", "tma_descriptor_setup_cycles")] = (round(v / TMA_SETUP_DESCRIPTORS, 0), cite(
            f"a CTA (one an SM) building {TMA_SETUP_DESCRIPTORS} device-side tensor descriptors as "
            f"kernels/fa3.py does (each written to global scratch by a GPU-scope atomic, waited "
            f"for, UTMACCTL.IV, UTMACMDFLUSH) and loading a tile through each, less the same tiles "
            f"by plain loads: {v:.0f} clock64 cycles, {v / TMA_SETUP_DESCRIPTORS:.0f} a descriptor "
            f"(with eight CTAs an SM building at once: "
            f"{(_val(rows, 'tma_setup', 'descriptors_x8')[0] or float('nan')) / TMA_SETUP_DESCRIPTORS:.0f})",
            row))
    dispatch = _warp_dispatch(rows)
    if dispatch is not None:
        per_warp, how, row, clk = dispatch
        out[("launch", "warp_dispatch_cycles")] = (round(per_warp, 1), cite(how, row, clk))
    v, row = _val(rows, "cta_cycle", "0B_x1")
    if v and row.get("clock_mhz_nvml"):
        clk = float(row["clock_mhz_nvml"])
        warps = CTA_CYCLE_THREADS // 32
        # the round less its warps' dispatch where that was measured (the engine
        # adds it per CTA); without cta_dispatch rows, the whole round
        launched = warps * dispatch[0] if dispatch is not None else 0.0
        less = (f", less its {warps} warps' dispatch ({warps} x {dispatch[0]:.1f}, "
                f"launch.warp_dispatch_cycles) = {v * clk - launched:.0f}") if dispatch is not None else ""
        out[("launch", "cta_turnover_cycles")] = (round(v * clk - launched, 0), cite(
            f"CTAs of {CTA_CYCLE_THREADS} threads that do nothing, one per SM (all of an SM's SMEM "
            f"each), {v:.3f} us a round (slope between launches of {CTA_CYCLE_ROUNDS[0]} and "
            f"{CTA_CYCLE_ROUNDS[1]} rounds; {row.get('date', '')[:10]}) x {clk:.0f} MHz = "
            f"{v * clk:.0f} cycles to start and retire a CTA{less}", row, clk))
    v, row = _val(rows, "launch", "do_bench_empty_triton")
    if v:
        out[("launch", "kernel_launch_us")] = (round(v, 2), cite(
            f"triton.testing.do_bench median of an empty kernel = {v:.2f} us: the fixed cost every "
            f"do_bench-timed kernel pays (back-to-back eager and graph launches in the CSV)", row))
    return out


def _warp_dispatch(rows):
    """(cycles an SM takes to launch a warp, how, row, clock) from the
    cta_dispatch rows where the SM's dispatch bounds the round: empty 4-warp
    CTAs at 8 or more an SM, whose slots (turnover about 700 cycles) would
    allow one every 90 cycles or less; None without them."""
    fits = []
    for per_sm in DISPATCH_BOUND_PER_SM:
        v, row = _val(rows, "cta_dispatch", f"{DISPATCH_THREADS}t_0B_x{per_sm}")
        if v and row.get("clock_mhz_nvml"):
            clk = float(row["clock_mhz_nvml"])
            fits.append((v / per_sm * clk / (DISPATCH_THREADS // 32), per_sm, v, row, clk))
    if not fits:
        return None
    per_warp = statistics.median(f[0] for f in fits)
    _, _, _, row, clk = fits[0]
    how = (f"empty CTAs of {DISPATCH_THREADS} threads at " +
           ", ".join(f"{n} ({v:.3f} us a round)" for _, n, v, _, _ in fits) +
           f" an SM (slope between launches of {CTA_CYCLE_ROUNDS[0]} and {CTA_CYCLE_ROUNDS[1]} rounds): "
           "an SM starts one every " + ", ".join(f"{v / n:.4f}" for _, n, v, _, _ in fits) +
           f" us, x {clk:.0f} MHz / {DISPATCH_THREADS // 32} warps = "
           + ", ".join(f"{w:.1f}" for w, *_ in fits) + f" cycles a warp, median {per_warp:.1f}")
    stamps, _ = _val(rows, "cta_dispatch_stamps", f"{DISPATCH_THREADS}t_0B_x{fits[-1][1]}")
    if stamps:
        how += (f"; stamped by the global timer, the same launch at {fits[-1][1]} an SM started its CTAs "
                f"{stamps:.3f} us apart on an SM (median, cta_dispatch_stamps)")
    return per_warp, how, row, clk


def _toml_value(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(v, float):
        return repr(float(v))
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    return str(v)


def write_profile(rows, path):
    import tomllib

    SCHEMA = _profile_module().SCHEMA

    base = tomllib.loads(open(BASE_PROFILE).read())
    m = mapping(rows)
    data = {s: dict(base[s]) for s in base if s != "sources"}
    sources = dict(base["sources"])
    for (sec, key), (v, src) in m.items():
        typ = SCHEMA[sec][key][0]
        data[sec][key] = typ(v)
        sources[f"{sec}.{key}"] = src
    data["gpu"]["name"] = "h100.measured"
    data["gpu"]["description"] = base["gpu"]["description"] + " (calibrated from our microbenchmarks)"
    if data["hbm"]["sustained_bandwidth_gbps"] > data["hbm"]["peak_bandwidth_gbps"]:
        data["hbm"]["sustained_bandwidth_gbps"] = data["hbm"]["peak_bandwidth_gbps"]
    lines = ["# NVIDIA H100 SXM5, calibrated: written by experiments/calibrate.py from",
             "# experiments/results/calibration_h100.csv. Keys whose source begins with",
             "# \"our microbenchmark\" or \"device query\" were measured on the lent GPU; the others",
             "# are copied from h100.toml with their sources. Attention kernels never feed it.",
             f"# measured keys: {', '.join(sorted(f'{s}.{k}' for s, k in m))}", ""]
    for sec, keys in SCHEMA.items():
        lines.append(f"[{sec}]")
        for key in keys:
            lines.append(f"{key} = {_toml_value(data[sec][key])}")
        lines.append("")
    lines.append("[sources]")
    for sec, keys in SCHEMA.items():
        for key in keys:
            k = f"{sec}.{key}"
            if k in sources:
                lines.append(f"{_toml_value(k)} = {_toml_value(sources[k])}")
    text = "\n".join(lines) + "\n"
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)
    return m


def _profile_module():
    """gpusim/profile.py loaded by path: the GPU machine has no simpy, and the package's
    __init__ may pull the engine in; profile.py itself needs only algorithms/."""
    import importlib.util
    if "_gpusim_profile" in sys.modules:
        return sys.modules["_gpusim_profile"]
    spec = importlib.util.spec_from_file_location("_gpusim_profile",
                                                  os.path.join(ROOT, "gpusim", "profile.py"))
    mod = importlib.util.module_from_spec(spec)
    sys.modules["_gpusim_profile"] = mod
    spec.loader.exec_module(mod)
    return mod


def from_profile_check(path):
    return _profile_module().load_profile(path)
