"""Triton attention kernels executing the schedules of algorithms/.

One module per algorithm (standard, fa1, fa2, fa3), each with a public
`forward(q, k, v, *, causal, config, sm_scale, return_lse)`; fp64 references
in kernels.testing; the benchmark harness is `python -m kernels.bench`.
Importing this package never imports the simulator.
"""
ALGORITHMS = ("standard", "fa1", "fa2", "fa3")
