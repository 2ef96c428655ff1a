"""experiments/flush_probe.py's read kernel, checked on the CPU through
Triton's interpreter: each CTA sums its own part of the buffer, and the
layout covers the bytes asked for."""

SCRIPT = """
import torch
from experiments.flush_probe import _stream_read, read_layout
piece = 64
assert read_layout(15 * piece * 4, sms=1, piece=piece) == (4, 3)   # 4 CTAs an SM at most, whole pieces
assert read_layout(3 * piece * 4, sms=1, piece=piece) == (3, 1)
ctas, pieces = 3, 5
assert read_layout(10 * 1024 * piece * 4, sms=2, piece=piece) == (8, 1280)
assert read_layout(100, sms=132, piece=piece) == (1, 1)             # less than a piece: one piece
x = torch.randn(ctas * pieces * piece)
out = torch.empty(ctas)
_stream_read[(ctas,)](x, out, pieces, PIECE=piece)
assert torch.allclose(out, x.view(ctas, -1).sum(dim=1), rtol=1e-4, atol=1e-3), (out, x.view(ctas, -1).sum(dim=1))
print("ok")
"""


def test_stream_read_sums_each_ctas_part_in_the_interpreter(run_interpreted):
    run_interpreted(SCRIPT)


def test_flush_probe_needs_an_output_file(capsys):
    import os
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    from experiments import flush_probe

    assert flush_probe.main([]) == 2
    assert "--out is required" in capsys.readouterr().err


def test_ncu_byte_counters_in_their_own_units():
    """ncu_counters.counter_bytes: each counter by its own unit (ncu gives
    Mbyte beside Gbyte), thousands separators dropped."""
    import os
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    from experiments.ncu_counters import counter_bytes

    got = {"read": ("1,234.5", "Mbyte"), "write": ("2.5", "Gbyte"), "few": ("512", "byte")}
    assert counter_bytes(got, "read") == 1234.5e6
    assert counter_bytes(got, "write") == 2.5e9
    assert counter_bytes(got, "few") == 512
