"""The SMEM side of wgmma (HardwareProfile.wgmma_operand_bytes) against our
tensor-core microbenchmark (experiments/calibrate.py wgmma_shapes, committed in
experiments/results/calibration_h100.csv): narrow instructions re-read A from
SMEM for every N slice, so their rate is the SMEM bandwidth's, not the tensor
cores'. No attention timing is involved."""
import csv
import os
import re

from gpusim.profile import load_profile

CSV = os.path.join(os.path.dirname(__file__), "..", "experiments", "results", "calibration_h100.csv")


def _ss_rows():
    rows = []
    for r in csv.DictReader(open(CSV)):
        m = re.fullmatch(r"SS_(\d+)x(\d+)x(\d+)_w(\d+)", r["param"]) if r["bench"] == "wgmma_shape" else None
        if m:
            bm, bn, bk, w = map(int, m.groups())
            n = int(re.search(r"m64n(\d+)k16", r["detail"]).group(1))
            rows.append((bm, bn, bk, w, n, float(r["value"])))
    return rows


def _predicted_tflops(gpu, bm, bn, bk, n):
    """One SM's rate for a loop of [bm, bk] x [bk, bn] products in instructions of N = n,
    limited by the tensor cores or by the SMEM operand reads, times the SMs."""
    flops = 2 * bm * bn * bk
    tensor_s = flops / gpu.matmul_flops_per_s_per_sm("wgmma", "bf16")
    smem_rate = gpu.units.smem_bytes_per_clk_per_sm * gpu.clock_hz
    smem_s = gpu.wgmma_operand_bytes(bm, bn, bk, 2, True, n) / smem_rate
    return flops / max(tensor_s, smem_s) * gpu.gpu.sm_count / 1e12


def test_narrow_wgmma_is_smem_bound_as_measured():
    gpu = load_profile("h100")
    rows = [r for r in _ss_rows() if not (r[0] == 128 and r[1] == 256 and r[3] == 4)]  # that one spills
    assert len(rows) >= 30
    for bm, bn, bk, w, n, measured in rows:
        pred = _predicted_tflops(gpu, bm, bn, bk, n)
        if n <= 32:
            # SMEM-bound: the model's rate is the measured one within 15%
            assert abs(pred / measured - 1) <= 0.15, (bm, bn, bk, w, n, pred, measured)
        else:
            # tensor-bound: the profile's sustained rate (cuBLAS 8192^3) sits below
            # what an on-chip loop reaches, never above
            assert pred <= measured * 1.02, (bm, bn, bk, w, n, pred, measured)


def test_operand_bytes_count_rereads():
    gpu = load_profile("h100")
    # one m64n64k16 instruction: A 64x32 B, B 64x32 B
    assert gpu.wgmma_operand_bytes(64, 64, 16, 2, True) == 64 * 32 + 64 * 32
    # two N slices re-read A; 128 rows re-read B
    assert gpu.wgmma_operand_bytes(128, 64, 16, 2, True, 32) == 128 * 32 * 2 + 64 * 32 * 2
    # A in registers: only B
    assert gpu.wgmma_operand_bytes(64, 128, 64, 2, False) == 128 * 64 * 2
