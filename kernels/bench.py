"""Benchmark the kernel suite against torch SDPA (tritonbench conventions).

    PYTHONPATH=. python -m kernels.bench [--quick] [--kernels fa2,fa3,sdpa_cudnn]
        [--seqlens 4096,16384] [--head-dims 128] [--causal 0,1] [--out PATH]

Sweep: 16k tokens at hidden 2048 -- batch = 16384 / N, heads = 2048 / D --
for N in 512 .. 16384, D in {64, 128}, causal 0/1, bf16 forward.
FLOPs = 4·B·H·N²·D, halved when causal. Time: triton.testing.do_bench
(median) after a warm-up, on random N(0,1) inputs rotated among several sets
so that L2 never holds the next call's inputs. All kernels run in the same
process and run. Kernel names: standard, fa1, fa2, fa3, fa3_gluon, fa3_fp8, sdpa_flash,
sdpa_cudnn, sdpa_efficient; a config can be pinned with
name@block_mxblock_nxnum_warpsxnum_stages (e.g. fa2@128x64x8x3; fa3_gluon@128x128x12x2+pp
with pingpong), and fa3_gluon's launch chosen with +persistent / +grid (one CTA per SM
looping over tiles, or one per tile), +lpt / +headorder (causal tile order) and
+balanced / +roundrobin (how persistent CTAs share the tiles), +psmem / +preg (P, the
A operand of P V, through SMEM or in registers), +qreg / +qsmem (Q, the A operand of Q Kᵀ,
in registers or read from SMEM each step), +otma / +ostore (O out through SMEM and TMA
stores, or stored from registers).
Writes a CSV with provenance (atomically) and a PNG of TFLOP/s vs N.
No simulator import: runs on a machine with only torch and triton.
"""
from __future__ import annotations

import argparse
import csv
import itertools
import os
import statistics
import sys
import time

from kernels.provenance import provenance, write_csv_atomic

COLUMNS = ["kernel", "config", "batch", "heads", "seqlen", "head_dim", "causal", "dtype",
           "ms", "tflops", "ms_rounds", "status", "gpu", "sm_clock_mhz", "driver", "torch", "triton",
           "git_commit", "date", "command"]
ALL_KERNELS = ["standard", "fa1", "fa2", "fa3", "fa3_gluon", "fa3_fp8", "sdpa_flash", "sdpa_cudnn",
               "sdpa_efficient"]
SEQLENS = [512, 1024, 2048, 4096, 8192, 16384]


def log(msg):
    print(msg, file=sys.stderr, flush=True)


# fa3_gluon launch options a spec can name after '+' (forward's keyword arguments)
LAUNCH_FLAGS = {"persistent": ("persistent", True), "grid": ("persistent", False),
                "lpt": ("lpt", True), "headorder": ("lpt", False),
                "balanced": ("balanced", True), "roundrobin": ("balanced", False),
                "psmem": ("p_smem", True), "preg": ("p_smem", False),
                "qreg": ("q_regs", True), "qsmem": ("q_regs", False),
                "otma": ("o_tma", True), "ostore": ("o_tma", False)}


def int_list(flag: str, text: str, allowed=None) -> list[int]:
    """'512,1024' -> [512, 1024]; one line (SystemExit) naming the flag on anything else."""
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise SystemExit(f"kernels.bench: {flag} takes comma-separated integers, got {text!r}") from None
    bad = [v for v in values if (v not in allowed if allowed else v < 1)]
    if bad:
        raise SystemExit(f"kernels.bench: {flag} takes {'/'.join(map(str, allowed)) if allowed else 'positive'}"
                         f" values, got {bad[0]}")
    return values


def parse_kernel(spec):
    """'name[@BMxBNxWxS][+flag...]' -> (spec, name, TileConfig or None, launch
    keyword arguments). '+pp' turns pingpong on (fa3 kernels); fa3_gluon also
    takes the LAUNCH_FLAGS (e.g. fa3_gluon+lpt+persistent)."""
    from algorithms.problem import TileConfig

    head, *flags = spec.split("+")
    name, _, cfg = head.partition("@")
    if name not in ALL_KERNELS:
        raise SystemExit(f"unknown kernel {name!r}; choose from {', '.join(ALL_KERNELS)}")
    allowed = (["pp", *LAUNCH_FLAGS] if name == "fa3_gluon" else ["pp"] if name.startswith("fa3")
               else [])
    bad = [f for f in flags if f not in allowed]
    if bad:
        raise SystemExit(f"bad suffix '+{bad[0]}' in {spec!r}; {name} takes "
                         + (", ".join("+" + f for f in allowed) if allowed else "none"))
    pingpong = "pp" in flags
    launch = dict(LAUNCH_FLAGS[f] for f in flags if f != "pp")
    if not cfg:
        if pingpong:
            launch["pingpong"] = True
        return spec, name, None, launch
    try:
        bm, bn, w, s = (int(x) for x in cfg.split("x"))
    except ValueError:
        raise SystemExit(f"bad config in {spec!r}: block_mxblock_nxwarpsxstages, e.g. fa2@128x64x8x3 "
                         f"(fa3: a '+pp' suffix turns pingpong on)") from None
    # fa3: consumers = warps / 4 less the producer's warpgroup; pingpong off unless
    # '+pp' (the Gluon kernel's default_config has it off: kernels/NOTES.md)
    extra = ({"mma": "wgmma", "consumer_warpgroups": max(1, w // 4 - 1), "pingpong": pingpong}
             if name.startswith("fa3") else {})
    return spec, name, TileConfig(block_m=bm, block_n=bn, num_warps=w, num_stages=s, **extra), launch


def make_fn(name, cfg, inputs, causal, launch=None):
    """A zero-argument callable running one forward on the next input set
    (launch: extra keyword arguments of the kernel's forward)."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    state = {"i": 0}

    def rotate():
        state["i"] = (state["i"] + 1) % len(inputs)
        return inputs[state["i"]]

    if name.startswith("sdpa_"):
        backend = {"sdpa_flash": SDPBackend.FLASH_ATTENTION, "sdpa_cudnn": SDPBackend.CUDNN_ATTENTION,
                   "sdpa_efficient": SDPBackend.EFFICIENT_ATTENTION}[name]

        def fn():
            q, k, v = rotate()
            with sdpa_kernel([backend]):
                return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
        return fn
    if name == "fa3_fp8":
        from algorithms.defaults import default_config
        from algorithms.problem import AttentionProblem
        from kernels import fa3

        q0 = inputs[0][0]
        problem = AttentionProblem(q0.shape[0], q0.shape[1], q0.shape[2], q0.shape[3], causal=causal,
                                   dtype="fp8")
        c = cfg or default_config("fa3", problem, hopper=True)
        # quantisation is a separate step (as FA3's), outside the timed kernel
        quant = []
        for q, k, v in inputs:
            q8, qs = fa3.quantize_fp8(q, c.block_m)
            k8, ks = fa3.quantize_fp8(k, c.block_n)
            v8, vs = fa3.quantize_fp8(v, c.block_n, transpose=True)
            quant.append((q8, k8, v8, (qs, ks, vs)))
        st = {"i": 0}

        def fn():
            st["i"] = (st["i"] + 1) % len(quant)
            q8, k8, v8, sc = quant[st["i"]]
            return fa3.forward_fp8(q8, k8, v8, causal=causal, config=c, scales=sc)
        return fn
    import importlib

    mod = importlib.import_module(f"kernels.{name}")

    def fn():
        q, k, v = rotate()
        return mod.forward(q, k, v, causal=causal, config=cfg, **(launch or {}))
    return fn


def main(argv=None):
    ap = argparse.ArgumentParser(description="Benchmark kernels/ against torch SDPA")
    ap.add_argument("--kernels", default=",".join(ALL_KERNELS))
    ap.add_argument("--seqlens", default=",".join(map(str, SEQLENS)))
    ap.add_argument("--head-dims", default="64,128")
    ap.add_argument("--causal", default="0,1")
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--quick", action="store_true", help="N in {4096, 16384}, D=128 only")
    ap.add_argument("--out", default=os.path.join("experiments", "results", "kernels_bench.csv"))
    ap.add_argument("--png", default=None, help="figure path (default: --out with .png)")
    ap.add_argument("--rep", type=int, default=100, help="do_bench rep (ms)")
    ap.add_argument("--rounds", type=int, default=1,
                    help="time every kernel of a shape this many times, interleaved (round 1: each "
                         "kernel once, round 2: each again, ...); a row gives the median round and "
                         "all of them, so a slow drift of the clock weighs on every kernel alike")
    ap.add_argument("--plot-only", action="store_true", help="redraw the figure from --out")
    ap.add_argument("--standard-parts", default=None, metavar="CSV",
                    help="also time standard's three launches against their bounds (measured H100 "
                         "anchors) at each head dim of --head-dims and each N >= 4096 of --seqlens, "
                         "and write them to CSV")
    ap.add_argument("--standard-parts-seqlens", default=None, metavar="N,N,...",
                    help="the N of --standard-parts instead (any N, e.g. 512,1024)")
    a = ap.parse_args(argv)
    if a.rounds < 1:
        raise SystemExit(f"--rounds must be at least 1, got {a.rounds}")
    png = a.png or os.path.splitext(a.out)[0] + ".png"
    if a.plot_only:
        plot(a.out, png)
        return
    for path in filter(None, (a.out, png, a.standard_parts)):     # (before the GPU's minutes, not after)
        folder = os.path.dirname(os.path.abspath(path))
        try:
            os.makedirs(folder, exist_ok=True)
        except OSError as e:
            raise SystemExit(f"kernels.bench: cannot write {path}: {e.strerror}") from None
        if not os.access(folder, os.W_OK):
            raise SystemExit(f"kernels.bench: cannot write {path}: {folder} is not writable")
    seqlens = [4096, 16384] if a.quick else int_list("--seqlens", a.seqlens)
    parts_seqlens = int_list("--standard-parts-seqlens", a.standard_parts_seqlens or "")
    dims = [128] if a.quick else int_list("--head-dims", a.head_dims)
    causals = [bool(c) for c in int_list("--causal", a.causal, allowed=(0, 1))]
    import torch
    import triton

    if not torch.cuda.is_available():
        raise SystemExit("kernels.bench needs a CUDA GPU")
    kernels = [parse_kernel(s) for s in a.kernels.split(",") if s]
    prov = provenance("python -m kernels.bench " + " ".join(argv if argv is not None else sys.argv[1:]))
    rows = []
    gen = torch.Generator(device="cuda").manual_seed(1234)
    t0 = time.time()
    for d in dims:
        for n in seqlens:
            b, h = max(1, a.tokens // n), max(1, a.hidden // d)
            # 3 input sets: at 16k tokens x hidden 2048 one set is 201 MB of bf16, > 50 MB L2
            inputs = [tuple(torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16, generator=gen)
                            for _ in range(3)) for _ in range(3)]
            for causal in causals:
                flops = 4.0 * b * h * n * n * d * (0.5 if causal else 1.0)
                shape_rows, fns, times = [], {}, {}
                for spec, name, cfg, _ in kernels:
                    shape_rows.append({"kernel": spec, "config": "" if cfg is None else
                                       f"{cfg.block_m}x{cfg.block_n} w{cfg.num_warps} s{cfg.num_stages}",
                                       "batch": b, "heads": h, "seqlen": n, "head_dim": d,
                                       "causal": int(causal), "dtype": "bf16", "ms": "", "tflops": "",
                                       "ms_rounds": "", "status": "ok", **prov})
                for _ in range(a.rounds):
                    for row, (spec, name, cfg, launch) in zip(shape_rows, kernels):
                        if row["status"] != "ok":
                            continue
                        try:
                            if name == "standard" and 2 * b * h * n * n * 2 > 40e9:
                                raise RuntimeError("S and P would take more than 40 GB")
                            if spec not in fns:
                                fns[spec] = make_fn(name, cfg, inputs, causal, launch)
                                fns[spec]()
                                torch.cuda.synchronize()
                            times.setdefault(spec, []).append(
                                triton.testing.do_bench(fns[spec], warmup=25, rep=a.rep, return_mode="median"))
                        except Exception as e:  # record and go on: one failure must not end the sweep
                            row["status"] = f"{type(e).__name__}: {str(e).splitlines()[0][:150] if str(e) else ''}"
                            torch.cuda.empty_cache()
                for row, (spec, *_) in zip(shape_rows, kernels):
                    if row["status"] == "ok":
                        ms = statistics.median(times[spec])
                        row["ms"] = f"{ms:.5f}"
                        row["tflops"] = f"{flops / ms / 1e9:.1f}"
                        row["ms_rounds"] = " ".join(f"{t:.5f}" for t in times[spec])
                    rows.append(row)
                    log(f"[{time.time() - t0:6.1f}s] D={d} N={n} causal={int(causal)} {row['kernel']:22s} "
                        f"{row['tflops'] or row['status']}"
                        + (f"  (rounds {min(times[row['kernel']]):.4f}-{max(times[row['kernel']]):.4f} ms)"
                           if a.rounds > 1 and row["status"] == "ok" else ""))
                del fns
            del inputs
            torch.cuda.empty_cache()
    if a.standard_parts:
        parts_n = (parts_seqlens if a.standard_parts_seqlens is not None
                   else [n for n in seqlens if n >= STANDARD_PARTS_MIN_N])
        standard_parts(a.standard_parts, prov, parts_n, dims, a.tokens, a.hidden)
    write_csv_atomic(a.out, rows, COLUMNS)
    log(f"wrote {a.out}")
    plot(a.out, png)


# Ceilings measured on the lent H100 (shared/reference/h100-anchors.md, 2026-11-21):
# cuBLAS bf16 8192³ matmul and a device-to-device copy (bytes read + written).
MATMUL_CEILING = 703e12
HBM_CEILING = 3.02e12


# The standard target: each launch within 1.3x of its own bound, D = 128, N >= 4096
STANDARD_PARTS_MIN_N = 4096


def standard_parts(path, prov, seqlens=(4096,), dims=(128,), tokens=16384, hidden=2048):
    """Each launch of standard vs its own bound max(FLOPs/703 TFLOP/s, bytes/3.02
    TB/s), at `tokens` tokens, each head dim of `dims` (hidden // D heads) and N of `seqlens`."""
    import torch
    import triton

    from kernels import standard

    rows = []
    for d, n, causal in itertools.product(dims, seqlens or (STANDARD_PARTS_MIN_N,), (False, True)):
        b, h = max(1, tokens // n), max(1, hidden // d)
        q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        parts = standard.launches(q, k, v, causal=causal)
        for name, fn, flops, nbytes in parts:
            fn()
            torch.cuda.synchronize()
            ms = triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")
            bound_ms = max(flops / MATMUL_CEILING, nbytes / HBM_CEILING) * 1e3
            rows.append({"launch": name, "batch": b, "heads": h, "seqlen": n, "head_dim": d,
                         "causal": int(causal), "ms": f"{ms:.5f}", "bound_ms": f"{bound_ms:.5f}",
                         "ratio": f"{ms / bound_ms:.3f}", "flops": f"{flops:.4g}", "bytes": f"{nbytes:.4g}",
                         **prov})
            log(f"standard {name} N={n} causal={int(causal)}: {ms:.3f} ms, bound {bound_ms:.3f} ms, "
                f"ratio {ms / bound_ms:.2f}")
        del parts, q, k, v      # S and P: 2 x 8.6 GB at N = 16384
        torch.cuda.empty_cache()
    tmp = path + ".tmp"
    with open(tmp, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    os.replace(tmp, path)


def plot(csv_path, png):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log("matplotlib not available: no figure (redraw later with --plot-only)")
        return
    rows = [r for r in csv.DictReader(open(csv_path)) if r["tflops"]]
    panels = sorted({(int(r["head_dim"]), int(r["causal"])) for r in rows})
    if not panels:
        return
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4), squeeze=False)
    for ax, (d, c) in zip(axes[0], panels):
        sel = [r for r in rows if int(r["head_dim"]) == d and int(r["causal"]) == c]
        for k in dict.fromkeys(r["kernel"] for r in sel):
            pts = sorted((int(r["seqlen"]), float(r["tflops"])) for r in sel if r["kernel"] == k)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=k)
        ax.set_xscale("log", base=2)
        ax.set_title(f"head_dim {d}, {'causal' if c else 'non-causal'}")
        ax.set_xlabel("sequence length N (16k tokens, hidden 2048)")
        ax.set_ylabel("TFLOP/s (4·B·H·N²·D, ×0.5 causal)")
        ax.grid(alpha=0.3)
    axes[0][-1].legend(fontsize=7)
    gpu = rows[0]["gpu"]
    fig.suptitle(f"Attention forward, bf16, {gpu}, triton {rows[0]['triton']}, torch {rows[0]['torch']}")
    fig.tight_layout()
    tmp = png + ".tmp.png"
    fig.savefig(tmp, dpi=120)
    os.replace(tmp, png)
    log(f"wrote {png}")


if __name__ == "__main__":
    main()
