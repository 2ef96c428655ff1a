"""experiments/fa1_traffic_probe.py moves FA1's inner-loop traffic: checked
on the CPU through Triton's interpreter on a small shape."""

SCRIPT = """
import torch
from experiments.fa1_traffic_probe import BLOCK, run, traffic_bytes
t_c = 3
for variant in ("rmw", "read", "copy"):
    got = {}
    run(1, 2, BLOCK * t_c, 16, variant, device="cpu", buffers=got)
    q, (o, l, m), (o2, l2, m2) = got["q"], got["ws"], got["other"]
    if variant == "rmw":     # O += Q at every K/V block, l counts them, where they were read
        assert torch.allclose(o, t_c * q.float()), variant
        assert torch.all(l == t_c), variant
    elif variant == "copy":  # each block's result lands in the other buffers, the first unchanged
        assert torch.allclose(o2, q.float()) and torch.all(l2 == 1) and torch.all(o == 0), variant
    else:
        assert torch.all(o == 0) and torch.all(l == 0) and torch.all(l2 == 0), variant
# FA1 itself on the probe's grid runs (off the GPU it returns nan, no time)
assert run(1, 2, BLOCK * t_c, 16, "fa1", device="cpu") != run(1, 2, BLOCK * t_c, 16, "fa1", device="cpu")
# per step: a bf16 Q block and O, l, m (fp32) read, and O, l, m written
steps = 2 * t_c * t_c
step_read = BLOCK * 16 * 2 + BLOCK * 16 * 4 + 2 * BLOCK * 4
step_write = BLOCK * 16 * 4 + 2 * BLOCK * 4
assert traffic_bytes(1, 2, BLOCK * t_c, 16, "read") == steps * step_read
assert traffic_bytes(1, 2, BLOCK * t_c, 16, "rmw") == steps * (step_read + step_write)
print("ok")
"""


def test_the_probe_moves_fa1s_traffic_in_the_interpreter(run_interpreted):
    run_interpreted(SCRIPT)
