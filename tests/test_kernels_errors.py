"""Predictable mistakes end in one typed exception from algorithms.errors."""
import pytest
import torch

from algorithms.errors import DoesNotFit, GpusimError, InvalidConfig, InvalidProblem, UnsupportedAlgorithm
from algorithms.problem import TileConfig
from kernels import fa1, fa2, fa3, standard
from kernels.common import make_inputs, problem_of

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
MODS = [standard, fa1, fa2]


def qkv(**kw):
    args = dict(batch=1, heads=2, seqlen_q=32, head_dim=32, dtype=torch.bfloat16, device=DEVICE)
    args.update(kw)
    return make_inputs(args.pop("batch"), args.pop("heads"), args.pop("seqlen_q"), args.pop("head_dim"), **args)


@pytest.mark.parametrize("mod", MODS, ids=lambda m: m.__name__)
def test_bad_inputs_raise_typed_one_line(mod):
    q, k, v = qkv()
    bad = [
        ((q[0], k, v), {}, InvalidProblem, "rank 4"),
        ((q.float(), k.float(), v.float()), {}, InvalidProblem, "dtype"),
        ((q, k.half(), v.half()), {}, InvalidProblem, "share one dtype"),
        ((q.transpose(1, 2), k, v), {}, InvalidProblem, "contiguous"),
        ((q, k[:, :, :16].contiguous(), v), {}, InvalidProblem, "same shape"),
        ((q, k, v), {"config": "big"}, InvalidConfig, "TileConfig"),
        ((q, k, v), {"sm_scale": -1.0}, InvalidProblem, "sm_scale"),
    ]
    for args, kw, exc, words in bad:
        with pytest.raises(exc) as info:
            mod.forward(*args, **kw)
        msg = str(info.value)
        assert words in msg and "\n" not in msg, msg


def test_gqa_heads_must_divide():
    q, _, _ = qkv(heads=3)
    _, k, v = qkv(heads=2)
    with pytest.raises(InvalidProblem, match="multiple"):
        fa2.forward(q, k, v)


def test_causal_needs_nq_le_nkv():
    q, _, _ = qkv(seqlen_q=64)
    _, k, v = qkv(seqlen_q=32)
    with pytest.raises(InvalidProblem, match="seqlen_q <= seqlen_kv"):
        fa2.forward(q, k, v, causal=True)


def test_head_dim_checked():
    q, k, v = qkv(head_dim=48)
    with pytest.raises(InvalidProblem, match="head_dim"):
        fa2.forward(q, k, v)


def test_problem_of_reports_shapes():
    q, k, v = qkv(heads=4, kv_heads=2, seqlen_kv=40)
    p = problem_of(q, k, v, causal=True)
    assert (p.batch, p.heads, p.kv_heads, p.seqlen_q, p.seqlen_kv, p.head_dim, p.dtype) == (1, 4, 2, 32, 40, 32, "bf16")


@pytest.mark.skipif(CUDA and torch.cuda.get_device_capability()[0] == 9, reason="this GPU is Hopper")
def test_fa3_unsupported_off_hopper():
    q, k, v = qkv()
    with pytest.raises(UnsupportedAlgorithm, match="Hopper"):
        fa3.forward(q, k, v)


@pytest.mark.skipif(not CUDA, reason="the SMEM limit is enforced by a real GPU")
def test_config_too_big_is_does_not_fit():
    q, k, v = qkv(seqlen_q=512, head_dim=256)
    cfg = TileConfig(block_m=128, block_n=128, num_warps=8, num_stages=4)  # 64 KB Q + 512 KB of K/V ring
    with pytest.raises(DoesNotFit) as info:
        fa2.forward(q, k, v, config=cfg)
    assert info.value.resource == "shared memory" and info.value.required > info.value.limit
    assert isinstance(info.value, GpusimError)


def test_standard_tma_store_says_what_it_needs():
    """S through the TMA unit needs Hopper and 16-byte rows of S."""
    q, k, v = qkv()
    from kernels.common import interpreting

    hopper = CUDA and torch.cuda.get_device_capability()[0] >= 9 and not interpreting()
    if not hopper:
        with pytest.raises(UnsupportedAlgorithm, match="Hopper"):
            standard.forward(q, k, v, tma_store=True, qk_rows=False)
    else:
        q, k, v = qkv(seqlen_q=30)
        with pytest.raises(InvalidProblem, match="multiple of 8"):
            standard.forward(q, k, v, tma_store=True, qk_rows=False)


@pytest.mark.parametrize("option", [dict(tma_store=True), dict(qk_programs=4)])
def test_standard_tiled_options_need_the_tiled_kernel(option):
    """tma_store and qk_programs belong to the one-CTA-a-tile QKᵀ kernel; with
    the default (a row block of S a CTA) they are refused in one line."""
    q, k, v = qkv()
    with pytest.raises(InvalidConfig, match="pass qk_rows=False") as info:
        standard.forward(q, k, v, **option)
    assert "\n" not in str(info.value)


def test_bench_kernel_specs_parse_or_name_what_is_allowed():
    """kernels.bench names: a config after '@', flags after '+'; a flag the
    kernel does not take ends the run with one line listing those it takes."""
    from kernels.bench import parse_kernel

    spec, name, cfg, launch = parse_kernel("fa3_gluon+lpt+persistent")
    assert (name, cfg, launch) == ("fa3_gluon", None, {"lpt": True, "persistent": True})
    _, _, cfg, launch = parse_kernel("fa3_gluon@128x64x12x3+pp+grid")
    assert (cfg.block_n, cfg.num_stages, cfg.pingpong, launch) == (64, 3, True, {"persistent": False})
    _, _, cfg, launch = parse_kernel("fa2@128x64x8x3")
    assert (cfg.block_m, cfg.num_warps, launch) == (128, 8, {})
    for bad, words in [("fa2+lpt", "fa2 takes none"), ("fa3+lpt", "fa3 takes +pp"),
                       ("fa3_gluon+fast", "+lpt"), ("fa2@128x64", "block_mxblock_n"), ("fa9", "unknown kernel")]:
        with pytest.raises(SystemExit) as info:
            parse_kernel(bad)
        assert words in str(info.value) and "\n" not in str(info.value)


def test_bench_refuses_an_output_it_cannot_write_before_any_gpu_work():
    from kernels.bench import main

    with pytest.raises(SystemExit) as info:
        main(["--out", "/proc/no/such/bench.csv"])
    assert str(info.value).startswith("kernels.bench: cannot write /proc/no/such/bench.csv")
