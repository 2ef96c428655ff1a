"""The `gpusim` command. Bad input ends in one line on stderr and exit status 2."""
from __future__ import annotations

import argparse
import json
import sys
from contextlib import contextmanager

from algorithms.defaults import ALGORITHMS, SCHEDULES
from algorithms.errors import GpusimError
from algorithms.problem import DTYPE_BYTES, AttentionProblem, TileConfig

EXIT_BAD_INPUT = 2


class _Parser(argparse.ArgumentParser):
    """argparse that reports a usage error as one line, not usage + message."""

    def error(self, message):
        raise GpusimError(f"{self.prog}: {message}")


def add_problem_args(p: argparse.ArgumentParser, algo_choices=ALGORITHMS, algo_default="fa2"):
    p.add_argument("--gpu", default="h100", help="profile name (see `gpusim profiles`) or a .toml path")
    if algo_choices:
        p.add_argument("--algo", default=algo_default, choices=algo_choices)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--kv-heads", type=int, default=None, help="K/V heads (GQA/MQA); default --heads")
    p.add_argument("--seqlen", type=int, default=4096, help="query length N_q")
    p.add_argument("--seqlen-kv", type=int, default=None, help="key/value length; default --seqlen")
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--causal", action="store_true")
    p.add_argument("--dtype", default="bf16", choices=tuple(DTYPE_BYTES))


def add_config_args(p: argparse.ArgumentParser):
    g = p.add_argument_group("tile config (all or none; default: the algorithm's default)")
    g.add_argument("--block-m", type=int)
    g.add_argument("--block-n", type=int)
    g.add_argument("--warps", type=int)
    g.add_argument("--stages", type=int)
    g.add_argument("--block-k", type=int)
    g.add_argument("--consumer-warpgroups", type=int)
    g.add_argument("--no-pingpong", action="store_true", help="fa3: no inter-warpgroup pingpong")
    g.add_argument("--no-intra-overlap", action="store_true", help="fa3: no intra-warpgroup overlap")


def problem_from_args(a) -> AttentionProblem:
    return AttentionProblem(batch=a.batch, heads=a.heads, kv_heads=a.kv_heads, seqlen_q=a.seqlen,
                            seqlen_kv=a.seqlen_kv, head_dim=a.head_dim, causal=a.causal,
                            dtype=a.dtype)


def config_from_args(a, algo: str, problem: AttentionProblem, hopper: bool) -> TileConfig | None:
    """The config the flags describe: flags given override the algorithm's default."""
    from algorithms.defaults import default_config

    overrides = {k: v for k, v in (("block_m", a.block_m), ("block_n", a.block_n),
                                   ("num_warps", a.warps), ("num_stages", a.stages),
                                   ("block_k", a.block_k),
                                   ("consumer_warpgroups", a.consumer_warpgroups)) if v is not None}
    if a.no_pingpong:
        overrides["pingpong"] = False
    if a.no_intra_overlap:
        overrides["intra_wg_overlap"] = False
    if not overrides:
        return None
    return default_config(algo, problem, hopper).with_(**overrides)


def _fmt_bytes(n) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{n} B"
        n /= 1000
    return str(n)


def print_prediction(pred) -> None:
    p = pred.problem
    print(f"{pred.algo} on {pred.gpu}: B={p['batch']} H={p['heads']} KVH={p['kv_heads']} "
          f"Nq={p['seqlen_q']} Nkv={p['seqlen_kv']} D={p['head_dim']} causal={p['causal']} {p['dtype']}")
    c = pred.config
    print(f"  config     block_m={c['block_m']} block_n={c['block_n']} warps={c['num_warps']} "
          f"stages={c['num_stages']}")
    if pred.runtime_us is not None:
        print(f"  runtime    {pred.runtime_us:,.1f} us   {pred.tflops:,.1f} TFLOP/s "
              f"(4·B·H·Nq·Nkv·D{' ×0.5' if p['causal'] else ''})")
        print(f"  bottleneck {pred.bottleneck} ({pred.bottleneck_share:.0%} of the time)")
        print(f"  HBM        read {_fmt_bytes(pred.hbm_read_bytes)}, write {_fmt_bytes(pred.hbm_write_bytes)}"
              f"   L2 hit rate {pred.l2_hit_rate:.1%}")
        if pred.simulated_parts and pred.simulated_parts > 1:
            print(f"  simulated  1/{pred.simulated_parts} of the GPU with 1/{pred.simulated_parts} "
                  f"of the heads, standing for the whole (gpusim/symmetry.py)")
    print(f"  FLOPs      matmul {pred.flops_matmul:.4g}   exp {pred.flops_exp:.4g}")
    print(f"  global     requested {_fmt_bytes(pred.l2_read_bytes)} read, "
          f"{_fmt_bytes(pred.global_write_bytes)} written; compulsory "
          f"{_fmt_bytes(pred.compulsory_read_bytes)} + {_fmt_bytes(pred.compulsory_write_bytes)}")
    # a one-launch schedule whose kernel launches other warps than the config
    # counts (fa3_triton: Triton builds no producer warpgroup)
    launched = pred.launches[0].threads // 32 if len(pred.launches) == 1 else c["num_warps"]
    print(f"  on chip    {pred.smem_bytes_per_cta:,} B SMEM/CTA, {pred.ctas_per_sm} CTA/SM, "
          f"{pred.waves:.2f} waves"
          + (f", {launched} warps launched" if launched != c["num_warps"] else ""))
    if len(pred.launches) > 1:
        for lp in pred.launches:
            rt = f"{lp.runtime_us:,.1f} us, {lp.bottleneck}" if lp.runtime_us is not None else ""
            print(f"    {lp.name:<9} grid {lp.grid:>8}  {lp.ctas_per_sm} CTA/SM  {lp.waves:8.2f} waves  {rt}")


@contextmanager
def _simulation_bar(enabled: bool):
    """A progress bar on stderr over a prediction's CTAs, shown only once it
    has run for a second (a 16k-token prediction takes seconds; a long
    sequence or a large batch, minutes); yields the callback for predict."""
    from tqdm import tqdm

    with tqdm(total=0, desc="simulating", unit="CTA", file=sys.stderr, delay=1.0, disable=not enabled,
              dynamic_ncols=True, leave=False) as bar:
        def progress(done: int, total: int) -> None:
            if bar.total != total:
                bar.total = total
            bar.update(done - bar.n)

        yield progress if enabled else None


def cmd_predict(a) -> int:
    from .predict import predict
    from .profile import load_profile

    gpu = load_profile(a.gpu)
    problem = problem_from_args(a)
    config = config_from_args(a, a.algo, problem, gpu.features.wgmma)
    with _simulation_bar(enabled=not (a.no_sim or a.no_progress)) as progress:
        pred = predict(problem, config, gpu, algo=a.algo, simulate=not a.no_sim, progress=progress)
    if a.json:
        print(json.dumps(pred.to_json(), indent=None if a.compact else 2))
    else:
        print_prediction(pred)
    return 0


def cmd_profiles(a) -> int:
    from .profile import available_profiles, load_profile

    rows = [load_profile(n).summary() for n in available_profiles()]
    if a.json:
        print(json.dumps(rows, indent=2))
        return 0
    width = max(12, max(len(r["name"]) for r in rows))
    head = f"{'name':<{width}} {'SMs':>4} {'MHz':>5} {'TF16 peak':>9} {'TF16 sust.':>10} {'HBM GB':>6} " \
           f"{'HBM GB/s':>9} {'L2 MB':>6} {'SMEM/CTA KB':>11}  features"
    print(head)
    for r in rows:
        feats = ",".join(k for k in ("wgmma", "tma", "fp8") if r[k]) or "-"
        print(f"{r['name']:<{width}} {r['sms']:>4} {r['clock_mhz']:>5.0f} {r['peak_tflops_16bit']:>9.1f} "
              f"{r['sustained_tflops_16bit']:>10.1f} {r['hbm_gb']:>6.1f} {r['hbm_gbps']:>9.0f} {r['l2_mb']:>6.0f} "
              f"{r['smem_per_block_kb']:>11.0f}  {feats}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="gpusim", description="Predict and explain tiled attention on GPUs.")
    sub = parser.add_subparsers(dest="command", parser_class=_Parser, required=True)

    p = sub.add_parser("predict", help="predict runtime, traffic and bottleneck of one config")
    add_problem_args(p, algo_choices=SCHEDULES)
    add_config_args(p)
    p.add_argument("--json", action="store_true", help="print one JSON object (SI units)")
    p.add_argument("--compact", action="store_true", help="with --json: on one line")
    p.add_argument("--no-sim", action="store_true", help="accounting only, skip the simulator")
    p.add_argument("--no-progress", action="store_true",
                   help="no progress bar on stderr (it shows once a prediction has run for a second)")
    p.set_defaults(func=cmd_predict)

    p = sub.add_parser("profiles", help="list hardware profiles and their key numbers")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_profiles)

    from .commands import register
    register(sub)
    return parser


def main(argv=None) -> int:
    try:
        args = build_parser().parse_args(argv)
        return args.func(args)
    except GpusimError as exc:
        print(f"gpusim: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("gpusim: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
