"""What fa2's two-stage step waits for on the GPU: L2 in lock-step, the frontier, the copy.

Do CTAs in lock-step wait on L2's bandwidth, or on reading the same tiles?
A diagnostic, not a calibration (nothing here feeds a profile). At causal
N16k D128 with two stages, fa2's first wave -- 128 CTAs of one head started
together -- steps ~25% slower than every CTA started later, with the head's
K/V in L2 or not (experiments/results/fa2_stamps_warmth_h100.csv, session
26). Two explanations: the SMs' loads come in bursts, all at once, and wait
for L2's bandwidth (what the engine models), or many SMs reading the same
tile at the same moment are served slower than the same bytes spread over
many tiles (which it does not).

Here one CTA an SM (132 on the H100) streams an L2-resident ring of K/V
tiles through an fa2-like step (S = Q Kᵀ, P = exp2(S), acc += P V) in a
two- or three-stage pipeline; every CTA starts together. `shared`: all read
tile j at step j; `distinct`: CTA c reads tile (c + j) mod the ring, so no
two read the same tile at once; `staggered`: as shared, but CTA c first
waits c·(step / 132) -- the same tiles, out of step. Each CTA records the
global timer before and after its loop. `waves`: the shared run with three
CTAs an SM's worth of CTAs, one an SM at a time: do the later waves step
as the first?

`--where`: one pass over the ring (256 steps, shared, two stages) with L2
flushed first (every tile from HBM, all CTAs at its frontier), with the ring
read by every SM before (`all`), and with it read by one CTA alone after a
flush (`one`): is a tile that one SM brought into L2 as near to the others
as one they all read before? (H100's L2 is two partitions.)

    PYTHONPATH=. python experiments/lockstep_probe.py --out $OUT/lockstep_probe_h100.csv
    PYTHONPATH=. python experiments/lockstep_probe.py --where --out $OUT/lockstep_where_h100.csv
    PYTHONPATH=. python experiments/lockstep_probe.py --sizes --out $OUT/lockstep_sizes_h100.csv
    PYTHONPATH=. python experiments/lockstep_probe.py --rows --out $OUT/lockstep_rows_h100.csv

`--predict` (CPU, no GPU): the engine's full simulation of the same probe,
its steps as fa2's 128x64 8-warp steps (two warpgroups, the online softmax's
instructions with them), over one pass of the ring (L2 empty at the start:
the flushed pass) and two (the second pass warm), shared, distinct and
staggered (a stagger is warpgroup 0's ALU work before the loop):

    PYTHONPATH=. python experiments/lockstep_probe.py --predict [--profile h100] [--results DIR]

prints the GPU's committed steps (lockstep_probe_h100.csv, lockstep_where_h100.csv) beside.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

BLOCK_M, BLOCK_N, HEAD_DIM, WARPS = 128, 64, 128, 8
RING_TILES = 256        # 256 x 2 x 16 KB = 8 MB of K and V: L2-resident (50 MB)
STAGGER_NS = 1235       # --predict's stagger: the GPU's shared step at two stages (lockstep_probe_h100.csv)
STEPS = 512
MODES = {"shared": 0, "distinct": 1, "staggered": 2, "waves": 0}
WAVES = 3
FIELDS = ("mode", "stages", "rep", "cta", "sm", "start_ns", "loop_ns", "step_ns", "gpu", "git_commit", "date", "command")


def _kernel():
    import triton
    import triton.language as tl

    from kernels.clocks import global_timer, sm_id

    @triton.jit
    def _stream(Q, K, V, OUT, STAMPS, steps, ring, wait_ns, MODE: tl.constexpr, STAGES: tl.constexpr,
                BM: tl.constexpr, BN: tl.constexpr, D: tl.constexpr, PV: tl.constexpr = True):
        cta = tl.program_id(0)
        offs_m, offs_n, offs_d = tl.arange(0, BM), tl.arange(0, BN), tl.arange(0, D)
        q = tl.load(Q + offs_m[:, None] * D + offs_d[None, :])
        if MODE == 2:   # staggered: spin until this CTA's offset has passed
            t0 = global_timer(cta)
            now = t0
            while now - t0 < cta * wait_ns:
                now = global_timer(cta)
        if MODE == 1:
            first = cta
        else:
            first = cta * 0
        acc = tl.zeros([BM, D], dtype=tl.float32)
        started = global_timer(tl.sum(q.to(tl.float32), axis=1).to(tl.int32, bitcast=True))
        for j in tl.range(0, steps, num_stages=STAGES):
            t = (first + j) % ring
            k = tl.load(K + t * BN * D + offs_n[:, None] * D + offs_d[None, :])
            s = tl.dot(q, tl.trans(k))
            p = tl.exp2(s * 0.001).to(tl.bfloat16)
            v = tl.load(V + t * BN * D + offs_n[:, None] * D + offs_d[None, :])
            if PV:
                acc += tl.dot(p, v)
            else:   # V read, no product: what is exposed with nothing to overlap the copies
                acc += tl.sum(v.to(tl.float32), axis=0)[None, :] + tl.sum(p.to(tl.float32), axis=1)[:, None]
        ended = global_timer(tl.sum(acc, axis=1).to(tl.int32, bitcast=True))
        tl.store(OUT + cta * BM * D + offs_m[:, None] * D + offs_d[None, :], acc.to(tl.bfloat16))
        rows = tl.arange(0, BM)
        tl.store(STAMPS + cta * 3 + 0 + rows * 0, started, mask=rows == 0)
        tl.store(STAMPS + cta * 3 + 1 + rows * 0, ended, mask=rows == 0)
        tl.store(STAMPS + cta * 3 + 2 + rows * 0, sm_id(offs_m).to(tl.int64), mask=rows == 0)

    return _stream


def _on_gpu(out: str):
    """(provenance, the probe's kernel, the GPU's SM count), or None, said in
    one line, where `out` cannot be written or there is no CUDA GPU."""
    import torch

    from experiments import gpu_probe

    prov = gpu_probe.start("lockstep_probe.py", out, None)
    if prov is None:
        return None
    return prov, _kernel(), torch.cuda.get_device_properties(0).multi_processor_count


def _ring(rows_q: int, block_n: int, tiles: int):
    """Q (rows_q x HEAD_DIM) and a ring of `tiles` K and V tiles of block_n rows, bf16 on the GPU."""
    import torch

    q = torch.randn(rows_q, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(tiles * block_n, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
    return q, k, torch.randn_like(k)


def _outputs(ctas: int):
    """O (a BLOCK_M x HEAD_DIM tile a CTA) and the stamps (start, end, SM a CTA) for `ctas` CTAs."""
    import torch

    return (torch.empty(ctas, BLOCK_M, HEAD_DIM, device="cuda", dtype=torch.bfloat16),
            torch.zeros(ctas, 3, dtype=torch.int64, device="cuda"))


def _stamped_rows(stamps, prov: dict, steps: int, **fields) -> list[dict]:
    """A CSV row per CTA of the last launch, from its stamps (start, end, SM):
    `fields` (mode, stages, rep), its loop's time and time a step, and the provenance."""
    made = {key: prov.get(key, "") for key in ("gpu", "git_commit", "date", "command")}
    return [{**fields, "cta": c, "sm": sm, "start_ns": start, "loop_ns": end - start,
             "step_ns": round((end - start) / steps, 1), **made}
            for c, (start, end, sm) in enumerate(stamps.cpu().tolist())]


def _spread(steps: list) -> str:
    return (f"step median {statistics.median(steps):.0f} ns (p10 {sorted(steps)[len(steps) // 10]:.0f}, "
            f"p90 {sorted(steps)[9 * len(steps) // 10]:.0f})")


def _write(out: str, rows: list) -> int:
    from kernels.provenance import write_csv_atomic

    write_csv_atomic(out, rows, FIELDS)
    print(f"wrote {out}")
    return 0


def measure(out: str) -> int:
    import torch

    gpu = _on_gpu(out)
    if gpu is None:
        return 2
    prov, kernel, ctas = gpu
    q, k, v = _ring(BLOCK_M, BLOCK_N, RING_TILES)
    o, stamps = _outputs(WAVES * ctas)
    rows = []
    for stages in (2, 3):
        for mode, code in MODES.items():
            # the staggered CTAs' offsets spread over one step of the shared run
            wait = 0
            if code == 2:
                shared = [r for r in rows if r["mode"] == "shared" and r["stages"] == stages]
                wait = int(statistics.median(r["step_ns"] for r in shared) / ctas)
            for rep in range(4):    # the first warms L2 and compiles; kept, marked rep 0
                grid = WAVES * ctas if mode == "waves" else ctas
                kernel[(grid,)](q, k, v, o, stamps, STEPS, RING_TILES, wait, MODE=code, STAGES=stages,
                                BM=BLOCK_M, BN=BLOCK_N, D=HEAD_DIM, num_warps=WARPS)
                torch.cuda.synchronize()
                rows += _stamped_rows(stamps[:grid], prov, STEPS, mode=mode, stages=stages, rep=rep)
            last = [r["step_ns"] for r in rows if r["mode"] == mode and r["stages"] == stages and r["rep"] > 0]
            print(f"{mode:9s} stages {stages}: {_spread(last)}", flush=True)
            if mode == "waves":
                for w in range(WAVES):
                    part = [r["step_ns"] for r in rows if r["mode"] == mode and r["stages"] == stages
                            and r["rep"] > 0 and w * ctas <= r["cta"] < (w + 1) * ctas]
                    print(f"  wave {w}: step median {statistics.median(part):.0f} ns", flush=True)
    return _write(out, rows)


def probe_schedule(mode: str, stages: int, steps: int, gpu):
    """The probe as a Schedule the engine replays (see --predict)."""
    from algorithms.fa2 import step_ops
    from algorithms.ops import Alu, Load, MmaWait, Tile
    from algorithms.problem import AttentionProblem, TileConfig
    from algorithms.schedule import CtaProgram, Launch, Role, Schedule, head_layout, pipelined_loop

    ctas, roles, warps = gpu.gpu.sm_count, 2, WARPS // 2
    problem = AttentionProblem(batch=1, heads=ctas, seqlen_q=BLOCK_M, head_dim=HEAD_DIM, kv_heads=1,
                               seqlen_kv=RING_TILES * BLOCK_N)
    cfg = TileConfig(block_m=BLOCK_M, block_n=BLOCK_N, num_warps=WARPS, num_stages=stages)
    rows, part = BLOCK_M // roles, BLOCK_N * HEAD_DIM * 2 // roles
    step = step_ops("bf16", cfg.mma, rows, BLOCK_N, HEAD_DIM, warpgroups=roles)
    # a stagger of one step of the shared probe over the CTAs, as ALU work on the CTA's own SM
    alu_per_ns = gpu.units.alu_ops_per_clk_per_sm * gpu.clock_hz / 1e9

    def program(c: int) -> CtaProgram:
        first = c if mode == "distinct" else 0

        def role(k: int) -> Role:
            def loads_of(j: int):     # role k's half of the step's K and V tiles
                t = (first + j) % RING_TILES
                return [Load(Tile("K", 0, 0, t, k), part), Load(Tile("V", 0, 0, t, k), part)]
            # (warpgroup 0 waits; warpgroup 1 meets it at the loop's first barrier)
            delay = ([Alu(int(c * STAGGER_NS / ctas * alu_per_ns))] if mode == "staggered" and c and k == 0
                     else [])
            loop = pipelined_loop("ring", steps, loads_of, lambda j: step, stages, lambda j: 0,
                                  role=k, roles=roles)
            return Role(f"warpgroup{k}", warps, (*delay, *loop, MmaWait(0)))
        return CtaProgram(tuple(role(k) for k in range(roles)))

    # 96 KB of SMEM (Q and two stages of K and V) or more: one CTA an SM, as on the GPU
    launch = Launch("lockstep_probe", ctas, WARPS * 32, gpu.residency.smem_per_block_bytes, 128, program,
                    **head_layout(1, ctas, key=None))
    return Schedule("lockstep_probe", problem, cfg, (launch,), {})


def measured_steps(results_dir: str) -> dict:
    """The GPU's median step (ns) by (mode, stages, pass) from the committed
    runs (lockstep_probe_h100.csv: warm, repetitions after the first;
    lockstep_where_h100.csv: the flushed pass), where they are present."""
    import csv

    got: dict = {}
    for name, warm in (("lockstep_probe_h100.csv", True), ("lockstep_where_h100.csv", False)):
        try:
            with open(os.path.join(results_dir, name)) as f:
                rows = [r for r in csv.DictReader(f) if (warm and r["rep"] != "0") or r["mode"] == "where_flushed"]
        except (OSError, KeyError):
            continue
        for r in rows:
            mode = "shared" if r["mode"] == "where_flushed" else r["mode"]
            got.setdefault((mode, int(r["stages"]), "warm" if warm else "flushed"), []).append(float(r["step_ns"]))
    return {k: statistics.median(v) for k, v in got.items()}


def predict(profile: str, results_dir: str) -> int:
    from gpusim.engine import simulate
    from gpusim.profile import load_profile

    gpu = load_profile(profile)
    ctas = gpu.gpu.sm_count
    gpu_ns = measured_steps(results_dir)
    fmt = lambda x: f"{x:.0f}" if x is not None else "–"
    print(f"ns a step, flushed pass / warm pass, engine ({profile}) against the GPU ({results_dir}):")
    for stages in (2, 3):
        for mode in ("shared", "distinct", "staggered"):
            ns = {}
            t0 = time.time()
            for steps in (RING_TILES, 2 * RING_TILES):
                result = simulate(probe_schedule(mode, stages, steps, gpu), gpu, fast=False)
                ns[steps] = result.runtime_s * 1e9
            flushed = ns[RING_TILES] / RING_TILES
            warm = (ns[2 * RING_TILES] - ns[RING_TILES]) / RING_TILES
            print(f"{mode:9s} stages {stages}: engine {flushed:.0f} / {warm:.0f}, GPU "
                  f"{fmt(gpu_ns.get((mode, stages, 'flushed')))} / {fmt(gpu_ns.get((mode, stages, 'warm')))} "
                  f"({ctas} CTAs, {time.time() - t0:.0f} s)", flush=True)
    return 0


L2_FLUSH_BYTES = 256 << 20
WHERE = ("flushed", "all", "one")
SIZES = (32, 64, 128)      # block_n: 8, 16 and 32 KB of K and of V a step


def measure_rows(out: str) -> int:
    """Warm, shared, two stages against three with 64 rows of Q on 4 warps and
    128 on 8 (block_n 64): the copy is the same 32 KB, the products halve.
    If the P·V hid part of the copy's wait, halving it would show more."""
    return measure_sizes(out, variants=[(64, 4), (128, 8)], sizes=(BLOCK_N,), pvs=(True,), label="rows")


def measure_sizes(out: str, variants=((BLOCK_M, WARPS),), sizes=None, pvs=(True, False), label="sizes") -> int:
    """Warm, shared, two stages against three, with and without the P·V
    product, at three tile sizes: is the two-stage penalty a latency (the
    same at every size) or bytes, and does the P·V hide any of it?"""
    import torch

    gpu = _on_gpu(out)
    if gpu is None:
        return 2
    prov, kernel, ctas = gpu
    ring_bytes = RING_TILES * BLOCK_N * HEAD_DIM * 2       # 4 MB of K, as the other runs
    o, stamps = _outputs(ctas)
    rows = []
    for (bm, warps), bn in ((v, bn) for v in variants for bn in (sizes or SIZES)):
        ring = ring_bytes // (bn * HEAD_DIM * 2)
        q, k, v = _ring(bm, bn, ring)
        for pv in pvs:
            name = f"{label}_bm{bm}w{warps}_bn{bn}_{'pv' if pv else 'nopv'}"
            for stages in (2, 3):
                try:
                    for rep in range(4):    # rep 0 warms L2 and compiles
                        kernel[(ctas,)](q, k, v, o, stamps, STEPS, ring, 0, MODE=0, STAGES=stages, BM=bm,
                                        BN=bn, D=HEAD_DIM, PV=pv, num_warps=warps)
                        torch.cuda.synchronize()
                        if rep == 0:
                            continue
                        rows += _stamped_rows(stamps, prov, STEPS, mode=name, stages=stages, rep=rep)
                    steps = [r["step_ns"] for r in rows if r["mode"] == name and r["stages"] == stages]
                    print(f"{name} stages {stages}: step median {statistics.median(steps):.0f} ns", flush=True)
                except Exception as e:  # a config that does not fit is a data point too
                    print(f"{name} stages {stages}: {type(e).__name__}: {str(e).splitlines()[0][:100]}",
                          flush=True)
    return _write(out, rows)


def measure_where(out: str) -> int:
    import torch

    gpu = _on_gpu(out)
    if gpu is None:
        return 2
    prov, kernel, ctas = gpu
    q, k, v = _ring(BLOCK_M, BLOCK_N, RING_TILES)
    o, stamps = _outputs(ctas)
    flush = torch.empty(L2_FLUSH_BYTES, dtype=torch.int8, device="cuda")

    def run(grid):
        kernel[(grid,)](q, k, v, o, stamps, RING_TILES, RING_TILES, 0, MODE=0, STAGES=2,
                        BM=BLOCK_M, BN=BLOCK_N, D=HEAD_DIM, num_warps=WARPS)
        torch.cuda.synchronize()

    run(ctas)   # compiles
    rows = []
    for rep in range(5):
        for where in WHERE:
            if where != "all":
                flush.zero_()
                torch.cuda.synchronize()
            if where == "one":
                run(1)
            elif where == "all":
                run(ctas)
            run(ctas)
            rows += _stamped_rows(stamps, prov, RING_TILES, mode=f"where_{where}", stages=2, rep=rep)
    for where in WHERE:
        steps = [r["step_ns"] for r in rows if r["mode"] == f"where_{where}"]
        print(f"ring {where:8s}: {_spread(steps)}", flush=True)
    return _write(out, rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="experiments/results/lockstep_probe_h100.csv")
    ap.add_argument("--where", action="store_true", help="the ring flushed, read by all SMs, or by one")
    ap.add_argument("--sizes", action="store_true", help="two stages against three by tile size, with and without P·V")
    ap.add_argument("--rows", action="store_true", help="two stages against three with 64 rows on 4 warps and 128 on 8")
    ap.add_argument("--predict", action="store_true", help="CPU: the engine's replay of the probe")
    ap.add_argument("--profile", default="h100")
    ap.add_argument("--results", default=os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                                     "experiments", "results"),
                    help="where --predict finds the GPU's runs to print beside the engine's")
    a = ap.parse_args(argv)
    if a.predict:
        return predict(a.profile, a.results)
    if a.sizes:
        return measure_sizes(a.out)
    if a.rows:
        return measure_rows(a.out)
    return measure_where(a.out) if a.where else measure(a.out)


if __name__ == "__main__":
    sys.exit(main())
