"""experiments/l2_keep_probe.py's round trips, checked on the CPU through
Triton's interpreter: each CTA reads its own part and writes each piece back
once a pass (or, every k-th piece, only reads it), and its layouts put the
parts where they say."""

SCRIPT = """
import torch
from experiments.l2_keep_probe import _round_trip, layout
ctas, chunk, passes = 2, 64, 3
chunks, stride = layout(ctas, chunk, 2 * 5 * 64 * 4, "pow2")
assert (chunks, stride) == (5, 512), (chunks, stride)          # 5 pieces of 64, parts 2^9 apart
assert layout(ctas, chunk, 2 * 5 * 64 * 4, "packed") == (5, 320)
x = torch.zeros(ctas * stride)
_round_trip[(ctas,)](x, chunks, stride, passes, CHUNK=chunk)
parts = x.view(ctas, stride)
assert torch.all(parts[:, :chunks * chunk] == passes) and torch.all(parts[:, chunks * chunk:] == 0)
x = torch.zeros(ctas * stride)
_round_trip[(ctas,)](x, chunks, stride, passes, CHUNK=chunk, CLEAN_EVERY=2)
pieces = x.view(ctas, stride)[:, :chunks * chunk].reshape(ctas, chunks, chunk)
assert torch.all(pieces[:, 1::2] == passes)     # written back each pass
assert torch.all(pieces[:, 2::2] == 0)          # only read: untouched
print("ok")
"""


def test_round_trips_touch_what_they_say_in_the_interpreter(run_interpreted):
    run_interpreted(SCRIPT)
