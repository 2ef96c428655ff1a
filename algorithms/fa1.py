"""FlashAttention-1 forward: Algorithm 1 of arXiv 2205.14135.

Grid: one CTA per (batch, head), CTA b·H + h. Outer loop over K/V blocks j
(B_c = block_n columns): K_j and V_j are loaded to SMEM once. Inner loop over
Q blocks i (B_r = block_m rows), under causal from the first Q block that
sees column block j: load Q_i and the running O_i, l_i, m_i from HBM, update
them, write them back. O stays normalised as in the paper.

Inside the CTA the warps split K/V ("split-K"): each warp takes
block_n / num_warps columns, computes its partial row max, row sum and
partial P·V, and the warps combine them through SMEM. That combine is modelled
here (SmemIO ops, a combine buffer in SMEM). kernels/fa1.py cannot express it:
Triton distributes tl.dot across warps itself, so the real kernel splits rows
instead and skips the combine; the difference is written down in both files.

Differences from the paper's listing, in both this schedule and the kernel:
initialisation of O, l, m is folded into j == 0 (nothing is read then); O,
l, m are fp32 workspaces; the last K/V block a Q block sees writes the final O
in the input dtype and its logsumexp instead of the workspaces.
"""
from __future__ import annotations

from collections import Counter

from .compiled import compiled as compiled_kernel
from .errors import InvalidConfig
from .ops import LD, Alu, Exp, Load, Mma, SmemIO, StepLatency, Store, SyncThreads, Tile, Wait, spanned
from .problem import ACC_BYTES, AttentionProblem, TileConfig, cdiv
from .schedule import attention_tensors, CtaProgram, Launch, Loop, Role, Schedule, TensorSpec, head_layout
from .smem import check_fits_block, registers_per_thread
from .fa2 import ALU_EPILOGUE_PER_OUT, ALU_PER_ACC, ALU_PER_MASKED_SCORE, ALU_PER_SCORE

# Per Q row and split-K warp: the partial row max and row sum (fp32 each)
# exchanged through SMEM.
STATS_PER_ROW = 2


def first_q_block(problem: AttentionProblem, block_m: int, block_n: int, j: int) -> int:
    """First Q block with a row that sees K/V block j (causal), else 0."""
    if not problem.causal:
        return 0
    first_col = j * block_n
    return max(0, first_col - problem.causal_offset) // block_m


def last_kv_block(problem: AttentionProblem, block_m: int, block_n: int, i: int) -> int:
    """Last K/V block that Q block i sees."""
    blocks = cdiv(problem.seqlen_kv, block_n)
    if not problem.causal:
        return blocks - 1
    last_row = min((i + 1) * block_m, problem.seqlen_q) - 1
    return min(blocks - 1, (last_row + problem.causal_offset) // block_n)


def combine_bytes(cfg: TileConfig, head_dim: int) -> int:
    """SMEM of the split-K combine: one fp32 O partial (the warps add into it
    in turn) plus every warp's row statistics."""
    return cfg.block_m * head_dim * ACC_BYTES + cfg.num_warps * cfg.block_m * STATS_PER_ROW * ACC_BYTES


# The barrier that loads issued back to back signal as their bytes arrive; a
# Wait then takes them together (the kernel's SASS, sm_90: see build).
LOADED = "loaded"


def smem_bytes(problem: AttentionProblem, cfg: TileConfig) -> int:
    e, d = problem.elem_bytes, problem.head_dim
    kv = 2 * cfg.block_n * d * e
    q = cfg.block_m * d * e
    return kv + q + combine_bytes(cfg, d)


def paper_block_sizes(sram_bytes: int, head_dim: int, elem_bytes: int) -> tuple[int, int]:
    """Algorithm 1's B_c = ceil(M / 4d) and B_r = min(B_c, d), M in elements."""
    m_elems = sram_bytes // elem_bytes
    block_c = cdiv(m_elems, 4 * head_dim)
    return min(block_c, head_dim), block_c


class _Blocks:
    """Loop.accesses of the inner loop at K/V block j (its steps k are Q
    blocks first + k): spans(first, count), steps first .. first + count - 1's
    step_memory chained, as slices of the CTA's sequences (blocks_spans)
    rather than built step by step when the engine replays skipped steps."""

    __slots__ = ("blocks_spans", "j", "first", "trips")

    def __init__(self, blocks_spans, j: int, first: int, trips: int):
        self.blocks_spans, self.j, self.first, self.trips = blocks_spans, j, first, trips

    def __call__(self) -> list:
        return self.window(0, self.trips)

    def window(self, first: int, count: int) -> list:
        return spanned(self.spans(first, count))

    def spans(self, first: int, count: int) -> list[tuple]:
        lo = self.first + first
        return self.blocks_spans(self.j, lo, lo + count)


def build(problem: AttentionProblem, cfg: TileConfig) -> Schedule:
    p, e, d = problem, problem.elem_bytes, problem.head_dim
    bm, bn, w = cfg.block_m, cfg.block_n, cfg.num_warps
    n_qb, n_kb = cdiv(p.seqlen_q, bm), cdiv(p.seqlen_kv, bn)
    bh = p.batch * p.heads
    combine_io = 2 * (w * bm * d * ACC_BYTES + w * bm * STATS_PER_ROW * ACC_BYTES)

    # Per Q block, computed once: its rows, its last K/V block, and how many Q
    # blocks finish (see their last K/V block) at each K/V block. (The engine
    # reads an inner loop's keys once per step; recomputing these made a 16k
    # causal prediction spend a third of its time in last_kv_block.)
    rows_of = [min(bm, p.seqlen_q - i * bm) for i in range(n_qb)]
    last_of = [last_kv_block(p, bm, bn, i) for i in range(n_qb)]
    finishing_at = Counter(last_of)
    finishing_blocks: dict[int, list[int]] = {}     # K/V block -> the Q blocks that see it last, in order
    for i, last in enumerate(last_of):
        finishing_blocks.setdefault(last, []).append(i)

    def program(cta: int) -> CtaProgram:
        b, h = divmod(cta, p.heads)
        kvh = p.kv_head_of(h)
        # Each Q block's global accesses, built once per CTA (every K/V block
        # repeats them, and the engine replays them when it skips steps):
        # Q, then the running O, l, m it reads back (from K/V block 1 on)...
        # As kernels/fa1.py compiles for sm_90 (Triton 3.6, D = 64 and 128,
        # causal or not): Q's LDGs, then its STS into SMEM, which waits for
        # them; then O's, l's and m's LDGs back to back, waited for together
        # where O goes through SMEM before the first product. Two round trips
        # a step: Q's, then O's, l's and m's at once.
        reads = [[Load(Tile("Q", b, h, i), rows * d * e),
                  Load(Tile("O_acc", b, h, i), rows * d * ACC_BYTES, LD, (LOADED,)),
                  Load(Tile("l", b, h, i), rows * ACC_BYTES, LD, (LOADED,)),
                  Load(Tile("m", b, h, i), rows * ACC_BYTES, LD, (LOADED,))] for i, rows in enumerate(rows_of)]
        # ... and what it writes: the running O, l, m, or at its last K/V
        # block the final O (input dtype) and logsumexp
        running = [[Store(Tile("O_acc", b, h, i), rows * d * ACC_BYTES),
                    Store(Tile("l", b, h, i), rows * ACC_BYTES),
                    Store(Tile("m", b, h, i), rows * ACC_BYTES)] for i, rows in enumerate(rows_of)]
        final = [[Store(Tile("O", b, h, i), rows * d * e),
                  Store(Tile("LSE", b, h, i), rows * ACC_BYTES)] for i, rows in enumerate(rows_of)]

        def accesses(j: int, i: int):
            # Q block i's global reads (its Q, and from K/V block 1 on the
            # running O, l, m) and writes at K/V block j
            return reads[i][:4 if j > 0 else 1], final[i] if j == last_of[i] else running[i]

        kv_blocks: dict[int, list] = {}      # j -> K_j, V_j's loads, built once (Loop.spans keeps them)

        def kv_loads(j: int):
            pair = kv_blocks.get(j)
            if pair is None:
                rows_k = min(bn, p.seqlen_kv - j * bn)
                # (K's and V's LDGs back to back, then their STS: one round trip)
                pair = kv_blocks[j] = [Load(Tile("K", b, kvh, j), rows_k * d * e, LD, (LOADED,)),
                                       Load(Tile("V", b, kvh, j), rows_k * d * e, LD, (LOADED,))]
            return pair

        def inner(j: int):
            i0 = first_q_block(p, bm, bn, j)

            past_keys = (j + 1) * bn > p.seqlen_kv
            # block j crosses the diagonal of Q block i when its last column
            # passes i's first row: (j + 1)·bn − 1 > i·bm + causal_offset
            diagonal_row = (j + 1) * bn - 1 - p.causal_offset if p.causal else None

            def is_masked(i: int) -> bool:
                return past_keys or (diagonal_row is not None and diagonal_row > i * bm)

            def step_key(k: int):
                i = i0 + k
                return rows_of[i], is_masked(i), j == last_of[i]

            def step(k: int):
                i = i0 + k
                loads, stores = accesses(j, i)
                scores = bm * bn
                alu = scores * ALU_PER_SCORE + bm * d * (ALU_PER_ACC + ALU_EPILOGUE_PER_OUT)
                if is_masked(i):
                    alu += scores * ALU_PER_MASKED_SCORE
                waits = [Wait(LOADED, len(loads) - 1)] if len(loads) > 1 else []   # O, l, m
                return [*loads, *waits,
                        Mma(bm, bn, d, p.dtype, cfg.mma),   # each warp: bm x (bn/w) of S
                        Alu(alu),                           # then the exp2s, as fa2.step_ops
                        Exp(scores + bm),
                        StepLatency(),                      # the chain's round trip
                        Mma(bm, d, bn, p.dtype, cfg.mma),   # each warp: partial P V
                        SmemIO(combine_io),                 # split-K combine
                        SyncThreads(),
                        *stores]

            def step_memory(k: int):
                # Q, O, l, m through L2 when the engine skips steps: the
                # running O/l/m a CTA rewrites every K/V block stay in L2 when
                # they fit, and only the real accesses can tell (as an
                # anonymous entry, causal B1 H16 N4096 D128 wrote 20x the
                # full simulation's HBM bytes)
                loads, stores = accesses(j, i0 + k)
                return [*loads, *stores]

            return [*kv_loads(j), Wait(LOADED, 2), SyncThreads(),
                    Loop("q", n_qb - i0, step, step_key, memory=step_memory,
                         accesses=_Blocks(blocks_spans, j, i0, n_qb - i0))]

        def outer_key(j: int):
            # Outer iterations cost the same when their inner loops do: same
            # K/V rows, same first Q block, same reads (j > 0), and the same
            # set of Q blocks finishing at j.
            # (A Q block finishing at j starts at or before it: first_q_block <= i.)
            i0 = first_q_block(p, bm, bn, j)
            return min(bn, p.seqlen_kv - j * bn), i0, j > 0, finishing_at[j], \
                (j + 1) * bn > p.seqlen_kv

        # From K/V block 1 on, Q block i's accesses are reads[i] and its
        # running writes but at its last K/V block: all Q blocks' of those,
        # one after the other, are cut from one sequence (at[i]: where block
        # i's start), built once per CTA
        steady = [op for i in range(n_qb) for op in (*reads[i], *running[i])]
        at = [0]
        for i in range(n_qb):
            at.append(at[-1] + len(reads[i]) + len(running[i]))

        def blocks_spans(j: int, lo: int, hi: int) -> list[tuple]:
            """Q blocks lo .. hi - 1's accesses at K/V block j (step_memory
            chained) as Loop.spans: slices of the CTA's lists, the blocks
            between two that finish at j in one slice of `steady`."""
            if j == 0:
                spans = []
                for i in range(lo, hi):
                    _, stores = accesses(j, i)      # (its loads, Q alone: the first of reads[i])
                    spans += [(reads[i], 0, 1), (stores, 0, len(stores))]
                return spans
            spans = []
            start = lo
            for i in finishing_blocks.get(j, ()):
                if i < lo or i >= hi:
                    continue
                spans += [(steady, at[start], at[i]), (reads[i], 0, len(reads[i])), (final[i], 0, len(final[i]))]
                start = i + 1
            spans.append((steady, at[start], at[hi]))
            return spans

        def outer_spans(first: int, count: int) -> list[tuple]:
            # whole K/V blocks' accesses, for skips of the outer loop: their
            # inner loops' step_memory for every step, cut without the loops
            # (FA1 N16k replays 7 million accesses)
            spans = []
            for j in range(first, first + count):
                spans.append((kv_loads(j), 0, 2))
                spans += blocks_spans(j, first_q_block(p, bm, bn, j), n_qb)
            return spans

        def outer_memory(j: int):
            return spanned(outer_spans(j, 1))

        return CtaProgram((Role("warps", w, (Loop("kv", n_kb, inner, outer_key, memory=outer_memory,
                                                 spans=outer_spans),)),))

    # Registers as ptxas assigns them to kernels/fa1.py where the probe compiled
    # this config (experiments/results/triton_smem_fa1.csv): 150 a thread at
    # 64x64, 4 warps, D = 64 (184 causal), 227 at D = 128, three and two CTAs
    # an SM, where this estimate gives 112 and 144 (four at D = 64). SMEM stays
    # the schedule's: it holds the split-K combine the kernel cannot express.
    regs = (compiled_kernel("fa1", p, cfg.num_warps, cfg).registers
            or registers_per_thread(cfg.threads, fp32_values=bm * d + bm * bn, packed16_values=bm * bn))
    launch = Launch("fa1_fwd", bh, cfg.threads, smem_bytes(p, cfg), regs, program,
                    **head_layout(1, bh))
    tensors = attention_tensors(p)
    tensors.update({
        "O_acc": TensorSpec("O_acc", bh, p.seqlen_q, d * ACC_BYTES, "workspace"),
        "l": TensorSpec("l", bh, p.seqlen_q, ACC_BYTES, "workspace"),
        "m": TensorSpec("m", bh, p.seqlen_q, ACC_BYTES, "workspace"),
    })
    return Schedule("fa1", p, cfg, (launch,), tensors)


def check(problem: AttentionProblem, cfg: TileConfig, smem_limit: int) -> None:
    if cfg.block_n % cfg.num_warps:
        raise InvalidConfig(f"fa1 splits block_n ({cfg.block_n}) across num_warps "
                            f"({cfg.num_warps}) warps: block_n must be a multiple of num_warps")
    check_fits_block(smem_bytes(problem, cfg), smem_limit, "fa1")
