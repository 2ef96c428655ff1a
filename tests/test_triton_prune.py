"""gpusim.triton: the autotune pruning hook, on CPU with fake and real configs."""
import inspect
import json
from types import SimpleNamespace

import pytest
import torch

import gpusim.triton as gt
from algorithms.errors import DoesNotFit, GpusimError
from algorithms.problem import AttentionProblem
from gpusim import predict


def cfg(m, n, w=4, s=2):
    return SimpleNamespace(kwargs={"BLOCK_M": m, "BLOCK_N": n}, num_warps=w, num_stages=s)


class FakeTensor:
    def __init__(self, shape, dtype=torch.bfloat16):
        self.shape, self.dtype = shape, dtype


ARGS = {"Q": FakeTensor((1, 4, 512, 64)), "K": FakeTensor((1, 2, 512, 64))}


def test_keeps_the_top_k_in_predicted_order_and_drops_refused():
    times = {(64, 32): 30.0, (64, 64): 10.0, (128, 64): 20.0, (128, 128): 5.0, (16, 16): 40.0}

    def predictor(problem, tile):
        if tile.block_n == 128:
            raise DoesNotFit("shared memory", 300000, 232448)
        return times[(tile.block_m, tile.block_n)]

    configs = [cfg(m, n) for m, n in times]
    hook = gt.prune_configs_by(top_k=3, predictor=predictor)["early_config_prune"]
    kept = hook(configs, ARGS, CAUSAL=True, grid=None, warmup=False)
    assert [(c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"]) for c in kept] == [(64, 64), (128, 64), (64, 32)]
    assert hook.last_problem == AttentionProblem(batch=1, heads=4, kv_heads=2, seqlen_q=512,
                                                 head_dim=64, causal=True, dtype="bf16")
    refused = [r for r in hook.last if not r.feasible]
    assert len(refused) == 1 and "Required: 300000" in refused[0].reason


def test_all_refused_returns_every_config():
    def predictor(problem, tile):
        raise DoesNotFit("shared memory", 1, 0)

    configs = [cfg(64, 32), cfg(64, 64)]
    hook = gt.SimulatorPrune(top_k=1, predictor=predictor)
    assert hook(configs, ARGS) == configs


def test_problem_from_args_and_errors():
    with pytest.raises(GpusimError, match="no 4-d Q and K"):
        gt.problem_from_args({"x": 1}, {})
    with pytest.raises(GpusimError, match="top_k must be a positive integer"):
        gt.SimulatorPrune(top_k=0, predictor=lambda p, c: 1.0)
    # refused when the hook is made, not when autotune first calls it
    with pytest.raises(GpusimError, match="unknown GPU 'x100'"):
        gt.prune_configs_by(gpu="x100")
    with pytest.raises(GpusimError, match="prune_configs_by: unknown option 'top'; allowed: gpu, algo, top_k"):
        gt.prune_configs_by(top=3)
    p = gt.problem_from_args({"q": FakeTensor((2, 8, 100, 128), torch.float16),
                              "k": FakeTensor((2, 8, 300, 128), torch.float16)}, {"causal": 1})
    assert (p.seqlen_q, p.seqlen_kv, p.dtype, p.causal) == (100, 300, "fp16", True)


def test_simulator_hook_keeps_the_predicted_best():
    problem = AttentionProblem(batch=1, heads=2, seqlen_q=256, head_dim=64)
    configs = [cfg(m, n, w, s) for m in (64, 128) for n in (32, 64) for w in (4,) for s in (2, 3)]
    hook = gt.SimulatorPrune(gpu="h100", algo="fa2", top_k=2, problem=problem)
    kept = hook(configs, {})
    runtimes = []
    for c in configs:
        tile = hook.tile_config(c, problem)
        runtimes.append((predict(problem, tile, "h100", algo="fa2").runtime_us, id(c)))
    best_two = [i for _, i in sorted(runtimes)[:2]]
    assert [id(c) for c in kept] == best_two


def test_precomputed_predictions_round_trip(tmp_path):
    problem = AttentionProblem(batch=1, heads=2, seqlen_q=256, head_dim=64)
    tiles = [gt.SimulatorPrune(problem=problem, predictor=lambda p, c: 0.0).tile_config(c, problem)
             for c in (cfg(64, 32), cfg(64, 64), cfg(128, 64, 8, 3))]
    path = tmp_path / "pred.json"
    data = gt.write_predictions(path, [problem], tiles, gpu="h100", executor="serial", progress=False)
    assert json.loads(path.read_text()) == data
    pre = gt.PrecomputedPredictor(str(path))
    for tile in tiles:
        assert pre(problem, tile) == pytest.approx(predict(problem, tile, "h100").runtime_us)
    with pytest.raises(KeyError, match="no precomputed prediction"):
        pre(problem.with_(seqlen_q=512, seqlen_kv=512), tiles[0])


def test_real_triton_autotuner_calls_the_hook():
    """Triton 3.6's Autotuner.prune_configs with the hook, around kernels/fa2.py's
    jit kernel (no GPU needed: pruning happens before any compile)."""
    import triton

    from experiments.autotune_prune import launch_args
    from kernels import fa2 as K

    problem = AttentionProblem(batch=1, heads=2, seqlen_q=256, head_dim=64, causal=True)
    configs = gt.configs(block_m=(64, 128), block_n=(32, 64), warps=(4,), stages=(2,))
    times = {f"m{m}-n{n}-w4-s2": t for (m, n), t in
             {(64, 32): 4.0, (64, 64): 1.0, (128, 32): 3.0, (128, 64): 2.0}.items()}
    key = gt.problem_key(problem)
    pre = gt.PrecomputedPredictor({"entries": [{"problem_key": key, "config_key": k, "runtime_us": t}
                                               for k, t in times.items()]})
    tuner = triton.autotune(configs=configs, key=["n_q"],
                            prune_configs_by=gt.prune_configs_by(top_k=2, predictor=pre))(K._fa2_fwd)
    q = FakeTensor((1, 2, 256, 64))
    args, kwargs = launch_args(problem, q, q, q, None, None)
    # every kernel parameter is given but those the configs set (launch_args had
    # fallen behind the kernel's STAMPS and failed every autotune on the GPU)
    inspect.signature(K._fa2_fwd.fn).bind(*args, **kwargs, BLOCK_M=64, BLOCK_N=64)
    tuner.nargs = dict(zip(tuner.arg_names, args))
    kept = tuner.prune_configs(kwargs)
    assert [(c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"]) for c in kept] == [(64, 64), (128, 64)]
