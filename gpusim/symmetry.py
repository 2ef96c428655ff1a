"""Symmetry: simulate half of the GPU, standing for the whole.

A forward attention's heads share nothing but the GPU: a head's CTAs read
its own Q, K and V (a GQA group's K/V is shared by its query heads), write
its own O, and meet other heads only on the SMs, in L2 and at HBM. Cut the
K/V groups into k equal parts and the SMs, L2 capacity and L2 and HBM
bandwidth likewise, and a part runs its heads much as the whole GPU runs all
of them: the same waves (grid / k CTAs on slots / k), the same load per SM,
the same share of L2 and HBM per SM. The fast path simulates one part; its
time is the run's, its bytes 1/k of the run's.

It is not exact: a wave of the part holds 1/k as many heads, so which Q
blocks run side by side, and how long a head's K/V tiles wait in L2 for
their next reader, differ. Measured against the whole H100 on this CPU
(session 25, experiments/results/validation_notes.md), the part's full
simulation against the whole GPU's unless said:
- many heads a wave: fa2 B32 H32 N512 D64 128x64 w8 s3 (four CTAs a head,
  two an SM) -7.8% on four parts (33 SMs: a part's wave of 66 CTAs ends
  in the middle of a head, the whole GPU's of 264 between two) and +0.4% on
  two; but the fast path on two parts came out -15.5% against that part's
  full simulation (its eight-step CTAs leave their waves' lockstep), where
  on the whole GPU it is within 0.1%. Over the 936 validation rows, every
  fast prediction on four parts took fa2's MAPE from 9.7 to 10.2% (`h100`),
  on two parts to 9.9%, and the CI guard's rows (N1024 D64) ranked worse
  (Spearman 0.835 -> 0.804 on two parts);
- a short launch: a part's last SM ends earlier than the whole GPU's (fa3
  causal B4 H16 N2048 D128, 7.8 waves: mean SM end 155.4 us against
  155.3, the last 170.3 against 176.5: -3.5% on four parts, -1.1% on two);
  fa2 causal B1 H2 N16k D128, 1.9 waves, -6.9% on two parts;
- a head's K, V, Q and O (16 MB at N16k D128) that fit the whole L2 but not
  a quarter of it were read again from HBM at every wave of the part (fa2
  non-causal B1 H16 N16k D128, four parts: HBM reads 338 MB against 201).
- The benchmark's singles (experiments/bench_simulator.py: B1 H16 N16k
  D128, 128 CTAs a head, one an SM, 15.5 waves), fa2 and fa3, causal and
  not, on two parts: within 0.8% of the whole GPU, HBM reads equal.
So: two parts, where a K/V group's tensors fit in a part's L2 and every
launch has MIN_WAVES waves and a part's slots of CTAs a head or more.

Lone CTAs. A launch of no more CTAs than SMs (FA1, one CTA a head: 16 at
B1 H16) starts them all at once, each alone on its SM, and a part holds
half of them on half of the SMs with half of L2 and of its bandwidths: the
same CTAs meeting the same share of everything. With every SM alike (no
l2.sm_latency_offsets_cycles, as every profile has it) the part's full
simulation is the whole GPU's to 1e-9 of its time and to the byte (session
37: three cases in tests/test_symmetry.py), so such launches are cut in
parts however few their waves. FA1's 14 validation shapes of at most 132 CTAs, fast path
on half the GPU against the whole GPU's full simulation: within 0.65%, as
on the whole GPU, HBM bytes within 0.24% (experiments/results/
fast_vs_full_fa1.csv); its benchmark single (B1 H16 N16k D128) takes half
the CPU time.
"""
from __future__ import annotations

from dataclasses import replace

from algorithms.problem import AttentionProblem
from algorithms.schedule import attention_tensors

PARTS = 2
# waves a launch must have to be simulated in parts (fa2 causal on two parts:
# -6.9% at 1.9 waves, -0.8% at 15.5: about 12% over the waves)
MIN_WAVES = 12


def group_bytes(problem: AttentionProblem) -> int:
    """The bytes of one K/V group's tensors: its K and V, and the Q and O of
    the query heads that read them."""
    tensors = attention_tensors(problem, problem.out_elem_bytes, lse=False)
    return sum(t.nbytes for t in tensors.values()) // (problem.batch * problem.kv_heads)


def slices_for(problem: AttentionProblem, sm_count: int, l2_bytes: int,
               launches: list[tuple[int, int]]) -> int:
    """How many equal parts the run is simulated as (1: the whole GPU):
    PARTS where they divide the SMs and the batch or the K/V heads (GQA
    groups kept whole), a K/V group's tensors fit in a part's L2, and each
    of `launches` -- (grid, CTAs an SM) -- has a part's slots of CTAs a head
    or more and MIN_WAVES waves, or no more CTAs than SMs."""
    k = PARTS
    if sm_count % k or (problem.batch % k and problem.kv_heads % k):
        return 1
    if group_bytes(problem) > l2_bytes // k:
        return 1
    heads = problem.batch * problem.heads
    for grid, per_sm in launches:
        if grid <= sm_count:
            continue    # lone CTAs (above): a part is a replica
        slots = sm_count * per_sm
        if grid // heads < slots // k or grid < MIN_WAVES * slots:
            return 1
    return k


def sliced(problem: AttentionProblem, k: int) -> AttentionProblem:
    """One of the k parts of `problem`: 1/k of its batch, or of its heads
    (query and K/V alike) where the batch does not divide."""
    if k == 1:
        return problem
    if problem.batch % k == 0:
        return replace(problem, batch=problem.batch // k)
    return replace(problem, heads=problem.heads // k, kv_heads=problem.kv_heads // k)
