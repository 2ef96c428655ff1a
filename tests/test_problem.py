"""AttentionProblem and TileConfig refuse bad values with one clear line."""
import pytest

import algorithms
from algorithms.errors import DoesNotFit, GpusimError, InvalidConfig, InvalidProblem, ProfileError, UnsupportedAlgorithm
from algorithms.problem import AttentionProblem, TileConfig


@pytest.mark.parametrize("kwargs, message", [
    (dict(batch=0), "batch must be a positive integer"),
    (dict(heads=6, kv_heads=4), "must be a multiple of kv_heads"),
    (dict(head_dim=96), "head_dim must be one of"),
    (dict(dtype="fp32"), "dtype must be one of fp16, bf16, fp8"),
    (dict(causal=True, seqlen_q=200, seqlen_kv=100), "causal attention needs seqlen_q <= seqlen_kv"),
    (dict(causal="yes"), "causal must be True or False"),
    (dict(seqlen_q=2.5), "seqlen_q must be a positive integer"),
])
def test_bad_problems(kwargs, message):
    base = dict(batch=1, heads=4, seqlen_q=128, head_dim=64)
    base.update(kwargs)
    with pytest.raises(InvalidProblem, match=message):
        AttentionProblem(**base)


def test_problem_defaults_and_gqa():
    p = AttentionProblem(batch=2, heads=8, kv_heads=2, seqlen_q=100, head_dim=64)
    assert p.seqlen_kv == 100 and p.group_size == 4 and p.kv_head_of(5) == 1
    assert p.reference_flops() == 4 * 2 * 8 * 100 * 100 * 64


@pytest.mark.parametrize("kwargs, message", [
    (dict(block_m=96), "block_m must be a power of two"),
    (dict(block_m=192), "or 192 with consumer_warpgroups=3"),
    (dict(block_m=192, consumer_warpgroups=2), "block_m must be a power of two"),
    (dict(block_n=512), "block_n must be a power of two in \\[16, 256\\]"),
    (dict(num_stages=0), "num_stages must be a positive integer"),
    (dict(num_warps=64), "num_warps must be in \\[1, 32\\]"),
    (dict(mma="hmma"), "mma must be one of"),
])
def test_bad_configs(kwargs, message):
    with pytest.raises(InvalidConfig, match=message):
        TileConfig(**kwargs)


def test_check_refuses_what_does_not_fit_with_required_and_limit():
    p = AttentionProblem(batch=4, heads=16, seqlen_q=4096, head_dim=128)
    cfg = TileConfig(block_m=128, block_n=128, num_warps=8, num_stages=4)
    with pytest.raises(DoesNotFit) as err:
        algorithms.check("fa2", p, cfg, 232448)
    assert err.value.limit == 232448 and err.value.required > 232448
    assert "Required:" in str(err.value) and "Hardware limit: 232448" in str(err.value)


def test_unknown_algorithm_and_fp8_outside_fa3():
    p = AttentionProblem(batch=1, heads=1, seqlen_q=64, head_dim=64, dtype="fp8")
    with pytest.raises(UnsupportedAlgorithm, match="unknown algorithm 'fa4'"):
        algorithms.build("fa4", p)
    with pytest.raises(UnsupportedAlgorithm, match="fa2 has no fp8 kernel"):
        algorithms.check("fa2", p, TileConfig(), 232448)


def test_fa3_config_rules():
    p = AttentionProblem(batch=1, heads=1, seqlen_q=64, head_dim=128)
    good = algorithms.default_config("fa3", p)
    algorithms.check("fa3", p, good, 232448)
    with pytest.raises(InvalidConfig, match="needs num_warps=12"):
        algorithms.check("fa3", p, good.with_(num_warps=8), 232448)
    with pytest.raises(InvalidConfig, match="multiple of 64 rows"):
        algorithms.check("fa3", p, good.with_(block_m=64), 232448)


def test_192_row_tile_runs_only_in_fa3():
    """FA3's three-consumer tile (192 rows) is a TileConfig; the schedules whose
    Triton kernels need power-of-two shapes refuse it with one line."""
    p = AttentionProblem(batch=1, heads=16, seqlen_q=4096, head_dim=128)
    cfg = TileConfig(block_m=192, block_n=128, num_warps=16, num_stages=2, mma="wgmma",
                     consumer_warpgroups=3)
    algorithms.check("fa3", p, cfg, 232448)
    for algo in ("fa2", "fa1", "standard", "fa3_triton"):
        with pytest.raises(InvalidConfig, match="block_m to be a power of two, got 192"):
            algorithms.check(algo, p, cfg.with_(num_warps=8 if algo != "fa3_triton" else 16), 232448)


def test_a_problem_larger_than_the_gpus_memory_is_refused_at_once():
    """The schedule's global tensors against hbm.capacity_bytes, before the
    accounting (which walked a 1e11-token problem for hours): standard's S and
    P are N² a head, so it stops fitting long before FlashAttention does."""
    from gpusim import predict

    p = AttentionProblem(batch=8, heads=32, seqlen_q=16384, head_dim=64)      # S and P 275 GB, Q K V O 2 GB
    with pytest.raises(InvalidProblem, match=r"^standard needs 277\.0 GB of GPU memory for Q, K, V, O, S, P; "
                                             r"h100 has 85\.0 GB"):
        predict(p, None, "h100", "standard", simulate=False)
    assert predict(p, None, "h100", "fa2", simulate=False).global_read_bytes > 0   # 0.5 GB: fits
    with pytest.raises(InvalidProblem, match="h200 has 150.1 GB"):
        predict(AttentionProblem(batch=1, heads=1, seqlen_q=10**11, head_dim=64), None, "h200", "fa2",
                simulate=False)


@pytest.mark.parametrize("args, kwargs, error, says", [
    ((None, None, "h100"), {}, InvalidProblem, "problem must be an algorithms.problem.AttentionProblem, got NoneType"),
    (({"batch": 1}, None, "h100"), {}, InvalidProblem, "got dict"),
    (("P", "128x64", "h100"), {}, InvalidConfig, "config must be an algorithms.problem.TileConfig or None"),
    (("P", None, 123), {}, ProfileError, "a GPU is a profile name (a100-40gb, "),
    (("P", None, "h100"), {"progress": 5}, GpusimError, "progress must be a callable taking (done, total)"),
])
def test_predict_refuses_the_wrong_kind_of_argument_in_one_line(args, kwargs, error, says):
    """The API's misuse is a typed one-line error, not an AttributeError from
    deep inside ('NoneType' object has no attribute 'dtype')."""
    from gpusim import predict

    problem = AttentionProblem(batch=1, heads=2, seqlen_q=256, head_dim=64)
    args = tuple(problem if a == "P" else a for a in args)
    with pytest.raises(error) as err:
        predict(*args, **kwargs)
    assert says in str(err.value) and "\n" not in str(err.value)
