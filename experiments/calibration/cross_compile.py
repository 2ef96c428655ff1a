"""The microkernels compiled for sm_90 on a CPU, no GPU needed: `calibrate.py
check` shows their SASS, and `calibrate.py loops` counts the instructions of the
dot_chain kernels' loops, which the profile's reduction (reduce.py) reads.
"""
from __future__ import annotations

import csv
import datetime as _dt
import functools
import os
import subprocess
import tempfile

from algorithms.errors import ResultsFileError
from kernels.provenance import write_csv_atomic

from . import ROOT
from .compute_benches import (DOT_CHAINS, FP8_DOT_CHAINS, MORE_DOT_CHAINS, ONLINE_DOT_CHAINS, ONLINE_STREAM_CHAINS,
                              ONLINE_STREAM_WIDE_CHAINS, STREAM_CHAINS, STREAM_CHAINS_D64, STREAM_VARIANTS, WIDE_DOT_CHAINS)
from .cuda_kernels import compile_cuda
from .triton_kernels import DOT_SHAPES, DOT_WARPS, triton_kernels


def _sass_ops(cubin_path: str, tool: str) -> str:
    return subprocess.run([tool, "-sass", cubin_path], capture_output=True, text=True).stdout


def compile_sm90(fn, sig: dict, consts: dict, warps: int = 8, stages: int = 3):
    """Cross-compile a microkernel for sm_90 here (no GPU), its pointers
    16-byte aligned as torch allocates them."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    names = list(sig)
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n, t in sig.items() if t.startswith("*")}
    src = ASTSource(fn=fn, signature=sig, constexprs=consts, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps, "num_stages": stages})


def cmd_check(args) -> int:
    import re

    import triton

    tools = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    cuobjdump = os.path.join(tools, "cuobjdump")
    ok = True
    with tempfile.TemporaryDirectory() as d:
        cubin = compile_cuda(d)
        sass = _sass_ops(cubin, cuobjdump)
        funcs = re.split(r"\n\s*Function : ", sass)
        for f in funcs[1:]:
            name = f.split("\n", 1)[0].strip()
            ops = sorted(set(re.findall(r"\b(MUFU\.EX2|HMMA\.[\w.]+|QMMA[\w.]*|LDS\.128|FFMA|"
                                        r"LDG\.E\.STRONG\.GPU|LDG[\w.]*|UBLKCP[\w.]*|SYNCS[\w.]*)",
                                        f)))
            print(f"cuda {name}: {' '.join(ops)}")
    kernels = triton_kernels()

    def sass_of(compiled) -> str:
        with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
            f.write(compiled.asm["cubin"])
            f.flush()
            return _sass_ops(f.name, cuobjdump)

    for dt, (bm, bn, bk) in DOT_SHAPES.items():
        tdt = {"bf16": "*bf16", "fp16": "*fp16", "fp8": "*fp8e4nv"}[dt]
        c = compile_sm90(kernels["dot_shape"], {"A": tdt, "B": tdt, "C": "*fp32", "iters": "i32", "CLK": "*i64",
                                         "BM": "constexpr", "BN": "constexpr", "BK": "constexpr",
                                         "A_IN_REGS": "constexpr", "CLOCKED": "constexpr"},
                  {"BM": bm, "BN": bn, "BK": bk, "A_IN_REGS": False, "CLOCKED": True}, warps=DOT_WARPS)
        s = sass_of(c)
        mma = re.findall(r"\b([HQ]GMMA\.[\w.]+|HMMA\.[\w.]+)", s)
        has = any(m.startswith(("HGMMA", "QGMMA")) for m in mma)
        ok &= has
        print(f"triton dot_shape {dt} {bm}x{bn}x{bk}: {len(mma)} MMA instructions, kinds "
              f"{sorted(set(mma))[:4]}, smem {c.metadata.shared} B; wgmma={'yes' if has else 'NO'}")
    c = compile_sm90(kernels["exp2_loop"], {"OUT": "*fp32", "iters": "i32", "BLOCK": "constexpr"},
              {"BLOCK": 1024}, warps=4)
    s = sass_of(c)
    n_mufu, n_fix = len(re.findall("MUFU.EX2", s)), len(re.findall(r"FMUL|FSETP|FSEL", s))
    print(f"triton exp2_loop: MUFU.EX2 x{n_mufu}, other FP ops {n_fix}")
    unrolled = {"nblocks": "i32", "iters": "i32", "BLOCK": "constexpr", "UNROLL": "constexpr"}
    for name, pointers, op, what in (("l2_read", {"X": "*fp32", "OUT": "*fp32"}, "LDG", "loads"),
                                     ("l2_write", {"Y": "*fp32"}, "STG", "stores")):
        found = re.findall(op + r"[\w.]*", sass_of(compile_sm90(kernels[name], {**pointers, **unrolled},
                                                          {"BLOCK": 2048, "UNROLL": 4})))
        print(f"triton {name}: {len(found)} {what} {sorted(set(found))}")
    return 0 if ok else 1

DOT_CHAIN_LOOPS = os.path.join(ROOT, "experiments", "results", "dot_chain_loops_sm90.csv")


# the dot_chain kernel's operand types by dtype (bench_dot_chain's `dtype`)
DOT_CHAIN_OPERANDS = {"bf16": "*bf16", "fp8": "*fp8e4nv"}


def compile_dot_chain(bm: int, bn: int, d: int, warps: int, tiles: int = 0, stages: int = 1,
                      dtype: str = "bf16", online: bool = False, spread: int = 0):
    """The dot_chain kernel cross-compiled for sm_90 here, as bench_dot_chain
    launches it (tiles, stages, spread: B and V streamed, as
    bench_dot_chain_stream's variants launch it; dtype: its operands', bf16 or
    fp8; online: fa2's whole online softmax)."""
    operand = DOT_CHAIN_OPERANDS[dtype]
    sig = {"A": operand, "B": operand, "V": operand, "C": "*fp32", "iters": "i32", "CLK": "*i64",
           "STAMPS": "*i64", "first": "i32", "BM": "constexpr", "BN": "constexpr", "BK": "constexpr",
           "D": "constexpr", "CLOCKED": "constexpr", "PHASE_STEPS": "constexpr", "TILES": "constexpr",
           "SPREAD": "constexpr", "FP8": "constexpr", "ONLINE": "constexpr"}
    return compile_sm90(triton_kernels()["dot_chain"], sig,
                        dict(BM=bm, BN=bn, BK=d, D=d, CLOCKED=True, PHASE_STEPS=0, TILES=tiles, SPREAD=spread,
                             FP8=dtype == "fp8", ONLINE=online), warps=warps, stages=stages)


def compile_dot_chain_loop(bm: int, bn: int, d: int, warps: int, tiles: int = 0, stages: int = 1,
                           dtype: str = "bf16", online: bool = False, spread: int = 0) -> dict:
    """The dot_chain kernel's loop as ptxas compiles it for sm_90
    (compile_dot_chain): per warp and trip, the instructions it issues
    besides its wgmma ('issue'), of which MUFU ('mufu'), and the stall
    clocks ptxas scheduled ('stall_clocks'); kernels/sass.py."""
    from kernels import sass
    cubin = compile_dot_chain(bm, bn, d, warps, tiles, stages, dtype, online, spread)
    parts = sass.tensor_loop_parts(sass.cuobjdump(cubin, "-sass"))
    if not parts:
        raise RuntimeError(f"dot_chain {dtype} {bm}x{bn}x{d} w{warps}: no tensor loop in its sm_90 SASS")
    return parts[0]


def cmd_loops(args) -> int:
    """Write DOT_CHAIN_LOOPS: the compiled loop of every dot_chain shape, of
    the fp8 and online-softmax ones (benches dot_chain_fp8 and
    dot_chain_online), and of the stream benches' variants (B and V streamed:
    STREAM_VARIANTS) (CPU only)."""
    import triton
    from kernels.provenance import git_commit
    rows = []
    held = ("held", 0, 0, 1)
    shapes = [("bf16", False, shape, held) for shape in DOT_CHAINS + WIDE_DOT_CHAINS + MORE_DOT_CHAINS]
    shapes += [("fp8", False, shape, held) for shape in FP8_DOT_CHAINS]
    shapes += [("bf16", True, shape, held) for shape in ONLINE_DOT_CHAINS]
    shapes += [("bf16", True, shape, held) for shape in ONLINE_STREAM_WIDE_CHAINS if shape not in ONLINE_DOT_CHAINS]
    streamed = [variant for variant in STREAM_VARIANTS if variant[0] != "held"]
    for online, chains in ((False, STREAM_CHAINS + STREAM_CHAINS_D64), (True, ONLINE_STREAM_CHAINS + ONLINE_STREAM_WIDE_CHAINS)):
        shapes += [("bf16", online, shape, variant) for shape in chains for variant in streamed]
    for dtype, online, (bm, bn, d, warps), (variant, tiles, spread, stages) in shapes:
        loop = compile_dot_chain_loop(bm, bn, d, warps, tiles, stages, dtype, online, spread)
        rows.append({"shape": f"{bm}x{bn}x{d}", "num_warps": warps, "dtype": dtype,
                     "softmax": "online" if online else "chain", "variant": variant,
                     "issue_per_iter": loop["issue"],
                     "mufu_per_iter": loop["mufu"], "stall_clocks_per_iter": loop["stall_clocks"],
                     "triton": triton.__version__, "target": "cuda:90",
                     "git_commit": git_commit(), "date": _dt.date.today().isoformat(),
                     "command": "python experiments/calibrate.py loops"})
        print(f"dot_chain {dtype} {rows[-1]['softmax']} {variant} {rows[-1]['shape']} w{warps}: {loop}")
    write_csv_atomic(args.out, rows, list(rows[0]))
    print(f"wrote {args.out}")
    return 0


@functools.lru_cache(maxsize=4)
def _dot_chain_loops(path: str) -> dict:
    try:
        with open(path, newline="") as f:
            rows = list(csv.DictReader(f))
        return {(r["shape"], int(r["num_warps"]), r["dtype"], r["softmax"] == "online", r["variant"]):
                {"issue": int(r["issue_per_iter"]), "mufu": int(r["mufu_per_iter"]),
                 "stall_clocks": int(r["stall_clocks_per_iter"])} for r in rows}
    except (OSError, KeyError, ValueError) as e:
        raise ResultsFileError(f"{path}: not a dot_chain loop table ({type(e).__name__}: {e}); "
                               f"write it with `python experiments/calibrate.py loops`") from None


def dot_chain_loop(bm: int, bn: int, d: int, warps: int, dtype: str = "bf16", online: bool = False,
                   variant: str = "held", path: str = DOT_CHAIN_LOOPS) -> dict:
    """compile_dot_chain_loop's counts for one shape, from the committed table
    (tests run Triton's interpreter, which cannot compile for sm_90);
    variant: how B and V come (a kind of STREAM_VARIANTS)."""
    loop = _dot_chain_loops(path).get((f"{bm}x{bn}x{d}", warps, dtype, online, variant))
    if loop is None:
        raise ResultsFileError(f"{path} has no {dtype}{' online' if online else ''} {variant} dot_chain "
                               f"{bm}x{bn}x{d} with {warps} warps; "
                               f"write it with `python experiments/calibrate.py loops`")
    return loop
