"""The sweep runner: executors agree, Dask against a LocalCluster, infeasible
configs carry their reason; memory calculator and roofline numbers."""
import pytest

from algorithms.problem import AttentionProblem
from gpusim.cli import main
from gpusim.explore import best_rows, evaluate, run_tasks, sweep_tasks
from gpusim.memory import (PRESETS, kv_bytes_per_token_per_layer, kv_cache_bytes, workspace_bytes)
from gpusim.roofline import ridge_point, sustained_ridge_point
from gpusim.profile import load_profile

P = AttentionProblem(batch=1, heads=2, seqlen_q=256, head_dim=64)


def _tasks():
    return sweep_tasks("fa2", P, "h100", block_ms=(64, 128), block_ns=(64, 256), warps=(4,),
                       stages=(2, 5))


def _key(r):
    return (r["block_m"], r["block_n"], r["num_warps"], r["num_stages"])


def test_process_pool_and_serial_agree_bit_for_bit():
    tasks = _tasks()
    serial = run_tasks(tasks, executor="serial", progress=False)
    pooled = run_tasks(tasks, executor="process", jobs=2, progress=False)
    assert serial == pooled
    assert [_key(r) for r in serial] == [(t.config.block_m, t.config.block_n, t.config.num_warps,
                                          t.config.num_stages) for t in tasks]


def test_infeasible_config_row_names_required_and_limit():
    cfg = [t for t in _tasks() if (t.config.block_m, t.config.block_n, t.config.num_stages)
           == (128, 256, 5)][0]
    row = evaluate(cfg)
    # 2 B x 64 x (128 + 256 x 10) = 344064 > 232448
    assert row["feasible"] is False
    assert row["reason"] == ("out of resource: shared memory, Required: 344064, Hardware limit: "
                             "232448 (fa2: reduce block_m, block_n or num_stages)")
    assert row["smem_bytes"] == 344064 and row["smem_limit"] == 232448
    assert all(r["feasible"] for r in best_rows(run_tasks(_tasks(), executor="serial",
                                                          progress=False), 10))


def test_fa3_sweep_takes_the_192_row_tile_with_three_consumers():
    """A fa3 grid over block_m 128/192 and 12/16 warps: the 192-row tile is three
    consumers', so with 12 warps it is infeasible (one line, fa3's reason), not
    a refused sweep; with 16 it is feasible, as 128 rows are with 12."""
    p = AttentionProblem(batch=1, heads=16, seqlen_q=4096, head_dim=128)
    rows = run_tasks(sweep_tasks("fa3", p, "h100", block_ms=(128, 192), block_ns=(128,),
                                 warps=(12, 16), stages=(2,), simulate=False),
                     executor="serial", progress=False)
    feasible = {(r["block_m"], r["num_warps"]): r["feasible"] for r in rows}
    assert feasible == {(128, 12): True, (128, 16): False, (192, 12): False, (192, 16): True}
    reason = [r["reason"] for r in rows if (r["block_m"], r["num_warps"]) == (192, 12)][0]
    assert reason.startswith("fa3 with 3 consumer warpgroups needs num_warps=16")


def test_dask_executor_against_a_local_cluster(tmp_path, capsys):
    distributed = pytest.importorskip("distributed")
    tasks = _tasks()
    serial = run_tasks(tasks, executor="serial", progress=False)
    with distributed.LocalCluster(processes=False, n_workers=1, threads_per_worker=2,
                                  dashboard_address=None) as cluster:
        rows = run_tasks(tasks, executor="dask", scheduler=cluster.scheduler_address,
                         progress=False)
        assert rows == serial
        argv = ["sweep", "--batch", "1", "--heads", "2", "--seqlen", "256", "--head-dim", "64",
                "--block-m", "64", "--block-n", "32,64", "--warps", "4", "--stages", "2",
                "--executor", "dask", "--scheduler", cluster.scheduler_address, "--no-progress",
                "--out", str(tmp_path)]
        assert main(argv) == 0
    assert "2 configs, 2 feasible" in capsys.readouterr().out


def test_kv_cache_llama2_70b_mha_and_gqa():
    gqa = PRESETS["llama2-70b"]
    assert (gqa.layers, gqa.heads, gqa.kv_heads, gqa.head_dim) == (80, 64, 8, 128)
    assert kv_bytes_per_token_per_layer(gqa.mha(), "fp16") == 32 * 1024   # 2 x 64 x 128 x 2 B
    assert kv_bytes_per_token_per_layer(gqa, "fp16") == 4 * 1024          # 8 KV heads
    assert kv_cache_bytes(gqa, seqlen=4096, batch=2, dtype="fp16") == 2 * 8 * 128 * 2 * 80 * 4096 * 2
    assert kv_cache_bytes(gqa.mha(), 1, 1, "fp8") == 2 * 64 * 128 * 1 * 80


def test_workspace_standard_quadratic_flash_linear():
    m = PRESETS["llama2-7b"]
    n = 1024
    assert workspace_bytes("standard", m, n, 1, "fp16") == 2 * m.heads * n * n * 2  # S and P
    assert workspace_bytes("fa2", m, n, 1, "fp16") == m.heads * n * 4             # fp32 logsumexp
    assert workspace_bytes("fa2", m, 2 * n) == 2 * workspace_bytes("fa2", m, n)
    assert workspace_bytes("standard", m, 2 * n) == 4 * workspace_bytes("standard", m, n)


@pytest.mark.parametrize("name", ["a100-40gb", "a100-80gb", "h100", "h200"])
def test_ridge_is_peak_over_bandwidth(name):
    gpu = load_profile(name)
    assert ridge_point(name) == pytest.approx(
        gpu.tensor_cores.peak_dense_tflops_16bit * 1e12 / (gpu.hbm.peak_bandwidth_gbps * 1e9))
    assert sustained_ridge_point(name) == pytest.approx(
        gpu.tensor_cores.peak_dense_tflops_16bit * gpu.tensor_cores.sustained_fraction * 1e12
        / (gpu.hbm.sustained_bandwidth_gbps * 1e9))


def test_h100_ridge_number():
    assert ridge_point("h100") == pytest.approx(989.4 / 3.35, rel=1e-9)


def test_heatmap_marks_estimated_cells():
    """Cells whose config the compiled tables lack carry a * and the title says why."""
    from gpusim.explore import plot_heatmaps

    def row(bm, known):
        return {"block_m": bm, "block_n": 64, "num_warps": 4, "num_stages": 3, "feasible": True,
                "runtime_us": 10.0 + bm, "from_compiler": known}

    fig = plot_heatmaps([row(64, 1), row(256, 0)], "t")
    assert sorted(t.get_text() for ax in fig.axes for t in ax.texts) == ["266*", "74"]
    assert "estimated" in fig._suptitle.get_text()
    fig = plot_heatmaps([row(64, 1)], "t")
    assert "estimated" not in fig._suptitle.get_text()
