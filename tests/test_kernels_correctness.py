"""Correctness of the Triton attention kernels against an fp64 reference.

On a machine without CUDA the kernels run in Triton's interpreter
(TRITON_INTERPRET=1, set by tests/conftest.py before triton is imported) on small shapes; on a GPU
the same tests also run the odd lengths 1000/4001 and the Hopper-only fa3.
Each test draws a fresh seed (printed in the failure message; set
KERNELS_TEST_SEED to replay one). Outputs and every scratch buffer are
allocated poisoned (NaN) so an element the kernel forgot to write fails.
Bound: max |kernel - fp64| <= 2 * max |torch low-precision - fp64| + 2e-4,
where the torch side is PyTorch's math attention in the same dtype.
"""
import contextlib
import os

import pytest
import torch

from algorithms.problem import TileConfig
from kernels import fa1, fa2, standard, testing
from kernels.common import make_inputs

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
HOPPER = CUDA and torch.cuda.get_device_capability()[0] == 9
EPS = 2e-4

MODULES = {"standard": standard, "fa1": fa1, "fa2": fa2}
# Small tiles keep the interpreter fast; on the GPU the default configs are
# tested as well (config=None).
SMALL = {
    "standard": TileConfig(block_m=32, block_n=32, block_k=16, num_warps=4, num_stages=2),
    "fa1": TileConfig(block_m=32, block_n=16, num_warps=4, num_stages=1),
    "fa2": TileConfig(block_m=32, block_n=16, num_warps=4, num_stages=2),
    "fa3": TileConfig(block_m=64, block_n=64, num_warps=4, num_stages=2),
}

# (batch, heads, kv_heads, seqlen_q, seqlen_kv, head_dim, causal, dtype)
CPU_CASES = [
    (1, 2, 2, 64, 64, 32, False, torch.bfloat16),
    (1, 4, 2, 67, 100, 64, True, torch.float16),     # GQA, odd lengths, Nq < Nkv
    (1, 4, 1, 67, 100, 16, False, torch.bfloat16),   # MQA, odd lengths
    (2, 2, 2, 130, 130, 32, True, torch.bfloat16),   # batch > 1, tail block
]
GPU_CASES = [
    (2, 8, 2, 1000, 1000, 128, True, torch.bfloat16),
    (1, 4, 4, 1000, 4001, 64, False, torch.float16),
    (1, 4, 1, 1000, 4001, 128, True, torch.bfloat16),
    (1, 2, 2, 257, 257, 256, False, torch.bfloat16),
]
CASES = CPU_CASES + (GPU_CASES if CUDA else [])


def _seed():
    return int(os.environ.get("KERNELS_TEST_SEED") or int.from_bytes(os.urandom(4), "little"))


@contextlib.contextmanager
def poisoned_allocations():
    """torch.empty / empty_like return NaN-filled float tensors while active."""
    empty, empty_like = torch.empty, torch.empty_like

    def fill(t):
        if t.is_floating_point():
            t.fill_(float("nan"))
        return t

    torch.empty = lambda *a, **k: fill(empty(*a, **k))
    torch.empty_like = lambda *a, **k: fill(empty_like(*a, **k))
    try:
        yield
    finally:
        torch.empty, torch.empty_like = empty, empty_like


def check(fwd, case, config, seed):
    b, h, kvh, nq, nkv, d, causal, dtype = case
    gen = torch.Generator().manual_seed(seed)
    q, k, v = make_inputs(b, h, nq, d, kv_heads=kvh, seqlen_kv=nkv, dtype=dtype, device=DEVICE,
                          generator=gen)
    with poisoned_allocations():
        o, lse = fwd(q, k, v, causal=causal, config=config, return_lse=True)
    tag = f"seed={seed} case={case} config={config}"
    assert o.shape == q.shape and o.dtype == q.dtype, tag
    assert lse.shape == q.shape[:3] and lse.dtype == torch.float32, tag
    assert not torch.isnan(o).any(), f"unwritten (NaN) output elements: {tag}"
    assert not torch.isnan(lse).any(), f"unwritten (NaN) LSE elements: {tag}"
    ref = testing.reference_fp64(q, k, v, causal=causal)
    err = testing.max_error(o, ref)
    err_torch = testing.max_error(testing.torch_lowp(q, k, v, causal=causal), ref)
    assert err <= 2 * err_torch + EPS, f"error {err:.3e} > 2 x torch {err_torch:.3e} + {EPS}: {tag}"
    _, ref_lse = testing.reference(q, k, v, causal=causal, return_lse=True)
    lse_err = (lse.double() - ref_lse.double()).abs().max().item()
    return lse_err, tag


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"b{c[0]}h{c[1]}kv{c[2]}q{c[3]}k{c[4]}d{c[5]}{'c' if c[6] else ''}{str(c[7])[6:]}")
@pytest.mark.parametrize("algo", ["standard", "fa1", "fa2"])
def test_kernel_matches_fp64(algo, case):
    seed = _seed()
    lse_err, tag = check(MODULES[algo].forward, case, SMALL[algo], seed)
    if algo == "standard":
        # S is rounded to the input dtype before the softmax, as PyTorch's math
        # path does: the LSE inherits that rounding (|S| <~ 6 here, bf16 ulp 2^-8 · 6)
        assert lse_err <= 0.05, f"LSE error {lse_err:.3e}: {tag}"
    else:
        assert lse_err <= 1e-3, f"LSE error {lse_err:.3e}: {tag}"


@pytest.mark.skipif(not CUDA, reason="default configs use GPU-sized tiles; too slow for the interpreter")
@pytest.mark.parametrize("algo", ["standard", "fa1", "fa2"])
def test_default_config_on_gpu(algo):
    seed = _seed()
    check(MODULES[algo].forward, (2, 8, 2, 1000, 1000, 128, True, torch.bfloat16), None, seed)
    check(MODULES[algo].forward, (1, 16, 16, 4001, 4001, 64, False, torch.float16), None, seed)


def test_sm_scale_and_no_lse():
    seed = _seed()
    gen = torch.Generator().manual_seed(seed)
    q, k, v = make_inputs(1, 2, 48, 32, dtype=torch.float16, device=DEVICE, generator=gen)
    o = fa2.forward(q, k, v, sm_scale=0.3, config=SMALL["fa2"])
    assert isinstance(o, torch.Tensor)
    ref = testing.reference_fp64(q, k, v, sm_scale=0.3)
    err_torch = testing.max_error(testing.torch_lowp(q, k, v, sm_scale=0.3), ref)
    assert testing.max_error(o, ref) <= 2 * err_torch + EPS, f"seed={seed}"


def test_standard_writes_s_and_p():
    """Standard keeps S (scaled scores) and P (probabilities) in HBM in the input dtype."""
    seed = _seed()
    gen = torch.Generator().manual_seed(seed)
    q, k, v = make_inputs(1, 2, 40, 32, seqlen_kv=56, dtype=torch.bfloat16, device=DEVICE, generator=gen)
    _, (s, p) = standard.forward(q, k, v, causal=True, config=SMALL["standard"], keep_intermediates=True)
    assert s.dtype == p.dtype == torch.bfloat16 and s.shape == (1, 2, 40, 56)
    s_ref = (q.double() @ k.double().transpose(-1, -2)) / 32 ** 0.5
    assert (s.double() - s_ref).abs().max().item() <= 2 ** -7 * s_ref.abs().max().item() + 1e-3, f"seed={seed}"
    rows = p.double().sum(-1)
    assert (rows - 1).abs().max().item() < 0.05, f"seed={seed}"
    i = torch.arange(40, device=p.device)[:, None]
    j = torch.arange(56, device=p.device)[None, :]
    assert (p[..., j > i + 16] == 0).all(), f"causal mask not applied, seed={seed}"


@pytest.mark.parametrize("variant", [dict(qk_rows=False), dict(qk_rows=False, qk_programs=3)],
                         ids=["tiled", "persistent"])
def test_standard_qk_variants_write_the_same_s(variant):
    """The QKᵀ kernels experiments/qk_store_probe.py compares: one CTA a tile
    and a persistent kernel write the S the default (one CTA a row block of
    S) writes, GQA and odd lengths included; the tiled ones sum over D in
    steps of block_k, so bf16 rounding apart."""
    seed = _seed()
    gen = torch.Generator().manual_seed(seed)
    q, k, v = make_inputs(1, 4, 67, 32, kv_heads=2, seqlen_kv=100, dtype=torch.bfloat16, device=DEVICE,
                          generator=gen)
    _, (s_rows, _) = standard.forward(q, k, v, config=SMALL["standard"], keep_intermediates=True)
    _, (s_other, _) = standard.forward(q, k, v, config=SMALL["standard"], keep_intermediates=True, **variant)
    limit = 2 ** -7 * s_rows.double().abs().max().item() + 1e-3
    assert (s_other.double() - s_rows.double()).abs().max().item() <= limit, f"seed={seed}"


@pytest.mark.skipif(not HOPPER, reason="fa3 needs a Hopper GPU (sm_90)")
@pytest.mark.parametrize("case", CASES, ids=str)
@pytest.mark.parametrize("config", [SMALL["fa3"], None], ids=["small", "default"])
def test_fa3_matches_fp64(case, config):
    from kernels import fa3

    if config is None and case[5] == 256:
        config = TileConfig(block_m=64, block_n=64, num_warps=4, num_stages=2)
    lse_err, tag = check(fa3.forward, case, config, _seed())
    assert lse_err <= 1e-3, f"LSE error {lse_err:.3e}: {tag}"


@pytest.mark.skipif(not HOPPER, reason="fp8 forward needs a Hopper GPU (sm_90)")
@pytest.mark.parametrize("causal", [False, True])
def test_fa3_fp8_on_outlier_inputs(causal):
    """Stated bound: RMSE vs fp64 <= 3e-2 on the FA3 paper's outlier inputs
    (the paper reports 2.4e-2 for per-tensor FP8 without incoherent
    processing; per-block scales should do no worse)."""
    from kernels import fa3

    seed = _seed()
    gen = torch.Generator().manual_seed(seed)
    q, k, v = testing.outlier_inputs(2, 8, 2048, 128, dtype=torch.bfloat16, device="cuda", generator=gen)
    with poisoned_allocations():
        o = fa3.forward_fp8(q, k, v, causal=causal)
    assert not torch.isnan(o).any(), f"seed={seed}"
    ref = testing.reference_fp64(q, k, v, causal=causal)
    rmse = ((o.double() - ref) ** 2).mean().sqrt().item()
    rmse_bf16 = ((testing.torch_lowp(q, k, v, causal=causal).double() - ref) ** 2).mean().sqrt().item()
    print(f"fp8 rmse={rmse:.3e} (torch bf16 {rmse_bf16:.3e}) seed={seed}")
    assert rmse <= 3e-2, f"fp8 RMSE {rmse:.3e} > 3e-2, seed={seed}"


@pytest.mark.skipif(not HOPPER, reason="fp8 forward needs a Hopper GPU (sm_90)")
@pytest.mark.parametrize("causal", [False, True])
def test_fa3_fp8_scales_of_any_sign(causal):
    """A caller's scales need not be positive: K negated with its scales
    negated is the same K, and the output must not change (the kernel
    descales S before its row max)."""
    from kernels import fa3

    seed = _seed()
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, 4, 300, 64, generator=gen).to("cuda", torch.bfloat16) for _ in range(3))
    cfg = TileConfig(block_m=128, block_n=64, num_warps=8, num_stages=2)
    q8, qs = fa3.quantize_fp8(q, cfg.block_m)
    k8, ks = fa3.quantize_fp8(k, cfg.block_n)
    v8, vs = fa3.quantize_fp8(v, cfg.block_n, transpose=True)
    o = fa3.forward_fp8(q8, k8, v8, causal=causal, config=cfg, scales=(qs, ks, vs))
    flipped = fa3.forward_fp8(q8, (-k8.float()).to(k8.dtype), v8, causal=causal, config=cfg,
                              scales=(qs, -ks, vs))
    assert torch.equal(o, flipped), f"seed={seed}: max |diff| {(o.float() - flipped.float()).abs().max():.3e}"
    # V's scales fold into the accumulator's rescale (O kept in units of the
    # last block's V scale): V negated with its scales negated is the same V
    flipped_v = fa3.forward_fp8(q8, k8, (-v8.float()).to(v8.dtype), causal=causal, config=cfg,
                                scales=(qs, ks, -vs))
    assert torch.equal(o, flipped_v), f"seed={seed}: max |diff| {(o.float() - flipped_v.float()).abs().max():.3e}"


@pytest.mark.skipif(not HOPPER, reason="fp8 forward needs a Hopper GPU (sm_90)")
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_fa3_fp8_odd_lengths_and_gqa(causal, head_dim):
    """Tails (N = 1000 and 4001, not multiples of any block or of 16) and GQA
    (8 heads on 2 K/V heads) at the default configs, V's scales differing
    block to block (rows scaled by 1-30x): RMS error against fp64 at most
    twice that of PyTorch at the kernel's precision (testing.torch_fp8: the
    same e4m3 quantisation, exact arithmetic but for P rounded to e4m3),
    plus 1e-3."""
    from algorithms.problem import AttentionProblem
    from kernels import fa3
    from kernels.common import resolve_config

    seed = _seed()
    gen = torch.Generator().manual_seed(seed)
    for n in (1000, 4001):
        q = torch.randn(2, 8, n, head_dim, generator=gen)
        k = torch.randn(2, 2, n, head_dim, generator=gen)
        v = torch.randn(2, 2, n, head_dim, generator=gen) * torch.rand(1, 1, n, 1, generator=gen).mul(29).add(1)
        q, k, v = (t.to("cuda", torch.bfloat16) for t in (q, k, v))
        cfg = resolve_config("fa3", AttentionProblem(2, 8, n, head_dim, causal=causal, kv_heads=2, dtype="fp8"),
                             None, q.device)
        with poisoned_allocations():
            o = fa3.forward_fp8(q, k, v, causal=causal)
        assert not torch.isnan(o).any(), f"seed={seed} n={n}"
        ref = testing.reference_fp64(q, k, v, causal=causal)
        yardstick = testing.rms_error(testing.torch_fp8(q, k, v, causal=causal, block_m=cfg.block_m,
                                                        block_n=cfg.block_n), ref)
        err = testing.rms_error(o, ref)
        assert err <= 2 * yardstick + 1e-3, \
            f"fp8 RMS error {err:.3e} > 2 x {yardstick:.3e} + 1e-3 (PyTorch at fp8), seed={seed} n={n}"


def _gluon_hopper():
    if not HOPPER:
        return False
    from kernels import fa3_gluon

    return fa3_gluon.HAVE_GLUON


# fa3_gluon (Gluon, explicit warp specialisation): Hopper only, no interpreter.
FA3_GLUON_CASES = [
    (2, 8, 2, 1000, 1000, 128, True, torch.bfloat16),   # GQA, causal, tail tile
    (1, 4, 4, 1000, 4001, 64, False, torch.float16),    # Nq < Nkv, K/V tail, fp16
    (1, 4, 1, 1000, 4001, 128, True, torch.bfloat16),   # MQA, bottom-right causal
    (1, 4, 4, 4001, 4001, 64, True, torch.bfloat16),    # odd length, causal, D=64
    (2, 4, 2, 1024, 1024, 128, False, torch.float16),   # exact tiles, fp16
    (1, 2, 2, 64, 100, 128, False, torch.bfloat16),     # one partial Q tile, two K/V blocks
    (4, 16, 4, 1000, 1000, 64, False, torch.float16),   # 512 tiles: > 1 tile per persistent CTA
]
FA3_GLUON_CONFIGS = {
    "default": None,
    "bn64": TileConfig(block_m=128, block_n=64, num_warps=12, num_stages=2, consumer_warpgroups=2),
    "s3_nopingpong": TileConfig(block_m=128, block_n=128, num_warps=12, num_stages=3,
                                consumer_warpgroups=2, pingpong=False),
    # three consumer warpgroups, 192 rows, P through SMEM (p_in_smem)
    "c3": TileConfig(block_m=192, block_n=128, num_warps=16, num_stages=2, consumer_warpgroups=3,
                     pingpong=False),
    "c3_bn64_s3": TileConfig(block_m=192, block_n=64, num_warps=16, num_stages=3,
                             consumer_warpgroups=3, pingpong=False),
}


@pytest.mark.skipif(not _gluon_hopper(), reason="fa3_gluon needs a Hopper GPU (sm_90) and Gluon")
@pytest.mark.parametrize("case", FA3_GLUON_CASES, ids=str)
@pytest.mark.parametrize("config", list(FA3_GLUON_CONFIGS), ids=str)
def test_fa3_gluon_matches_fp64(case, config):
    from kernels import fa3_gluon

    lse_err, tag = check(fa3_gluon.forward, case, FA3_GLUON_CONFIGS[config], _seed())
    assert lse_err <= 1e-3, f"LSE error {lse_err:.3e}: {tag}"


@pytest.mark.skipif(not _gluon_hopper(), reason="fa3_gluon needs a Hopper GPU (sm_90) and Gluon")
@pytest.mark.parametrize("launch", [dict(persistent=False, lpt=False), dict(persistent=False, lpt=True),
                                    dict(persistent=True, lpt=False, balanced=False),
                                    dict(persistent=True, lpt=True),
                                    dict(persistent=True, lpt=False, balanced=True),
                                    dict(persistent=True, balanced=True, o_tma=True),
                                    dict(persistent=False, o_tma=True)], ids=str)
@pytest.mark.parametrize("case", [(4, 16, 4, 1000, 1000, 128, True, torch.bfloat16),
                                  (3, 16, 2, 2000, 2000, 64, True, torch.float16),
                                  (2, 16, 2, 2000, 2000, 128, False, torch.bfloat16)], ids=str)
def test_fa3_gluon_persistent_and_grid(case, launch):
    """Every launch mode and tile order on every problem: one tile per CTA
    and one CTA per SM looping over tiles; tiles per head or heaviest first
    over the grid (the snake's odd rounds and a partial last round: 3 x 16
    heads x 16 Q tiles = 768 tiles on 132 SMs); round-robin or the host's
    list schedule (balanced: a CTA's tiles read from a table). A tile
    visited twice or never leaves poisoned rows."""
    import functools

    from kernels import fa3_gluon

    fwd = functools.partial(fa3_gluon.forward, **launch)
    lse_err, tag = check(fwd, case, None, _seed())
    assert lse_err <= 1e-3, f"LSE error {lse_err:.3e}: {tag}"


@pytest.mark.skipif(not _gluon_hopper(), reason="fa3_gluon needs a Hopper GPU (sm_90) and Gluon")
@pytest.mark.parametrize("variant", [("default", dict(p_smem=True)), ("c3", dict(p_smem=False)),
                                     ("default", dict(q_regs=True)), ("bn64", dict(q_regs=True)),
                                     ("default", dict(o_tma=True)),
                                     ("bn64", dict(o_tma=True, q_regs=True)),
                                     ("default", dict(o_tma=False, q_regs=False)),
                                     ("c3", dict(pingpong=True)),
                                     ("c3", dict(persistent=False))], ids=str)
@pytest.mark.parametrize("case", [(2, 8, 2, 1000, 1000, 128, True, torch.bfloat16),
                                  (1, 4, 4, 1000, 4001, 64, False, torch.float16),
                                  (4, 16, 4, 1000, 1000, 128, False, torch.bfloat16)], ids=str)
def test_fa3_gluon_p_placement_and_consumers(case, variant):
    """P through SMEM with two consumers and in registers with three (each
    config's other choice); Q held in registers (its buffer released at the
    tile's start, so the next tile's Q lands during this one); O out through
    SMEM and TMA stores (whole 64-row slices; partial ones masked); three consumers taking turns (pingpong's turn
    barrier passed round a ring of three) and one tile per CTA."""
    import functools

    from kernels import fa3_gluon

    config, launch = variant
    fwd = functools.partial(fa3_gluon.forward, **launch)
    lse_err, tag = check(fwd, case, FA3_GLUON_CONFIGS[config], _seed())
    assert lse_err <= 1e-3, f"LSE error {lse_err:.3e}: {tag}"


@pytest.mark.skipif(not _gluon_hopper(), reason="fa3_gluon needs a Hopper GPU (sm_90) and Gluon")
def test_fa3_gluon_host_plans_follow_every_argument():
    """forward plans its launch once per signature (_PLANS): the same tensors
    called with other options, in turn, each get their own answer; a tensor
    that fails the checks of a cached shape (not contiguous) is still refused."""
    from algorithms.errors import InvalidProblem
    from kernels import fa3_gluon

    gen = torch.Generator().manual_seed(_seed())
    q, k, v = make_inputs(2, 8, 1000, 128, kv_heads=2, dtype=torch.bfloat16, device=DEVICE, generator=gen)
    calls = [dict(causal=False), dict(causal=True), dict(causal=True, sm_scale=0.05),
             dict(causal=False, o_tma=False), dict(causal=False)]
    for _ in range(2):
        for kw in calls:
            o = fa3_gluon.forward(q, k, v, **kw)
            ref = testing.reference_fp64(q, k, v, causal=kw["causal"], sm_scale=kw.get("sm_scale"))
            err_torch = testing.max_error(testing.torch_lowp(q, k, v, causal=kw["causal"],
                                                             sm_scale=kw.get("sm_scale")), ref)
            err = testing.max_error(o, ref)
            assert err <= 2 * err_torch + EPS, f"{kw}: error {err:.3e} > 2 x torch {err_torch:.3e} + {EPS}"
    assert len(fa3_gluon._PLANS) >= len(calls) - 1
    with pytest.raises(InvalidProblem):
        fa3_gluon.forward(q.transpose(1, 2).contiguous().transpose(1, 2), k, v)


def test_fa3_gluon_refuses_without_hopper():
    """Importing kernels.fa3_gluon works anywhere; running it off Hopper raises
    UnsupportedAlgorithm instead of failing inside Triton."""
    from algorithms.errors import UnsupportedAlgorithm
    from kernels import fa3_gluon

    if _gluon_hopper():
        pytest.skip("Hopper present: the kernel runs")
    q, k, v = make_inputs(1, 2, 64, 64, dtype=torch.bfloat16, device=DEVICE)
    with pytest.raises(UnsupportedAlgorithm):
        fa3_gluon.forward(q, k, v)
