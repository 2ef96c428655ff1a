"""FlashAttention-2 forward (arXiv 2307.08691), as kernels/fa2.py runs it.

Grid: (cdiv(N_q, block_m), B·H), Q block fastest in launch order. Each CTA
loads its Q tile once, loops over K/V blocks (skipping blocks wholly above the
causal diagonal), keeps O, m, l in registers (warps split the Q rows: no SMEM
exchange) and writes O and its logsumexp once. K/V loads go through Triton's
software pipeline: cp.async into a num_stages-deep ring. On Hopper a step's
elementwise work is the compiled loop's instruction count, and where the sm_90
build runs out of registers (4 warps on 128-row tiles at head dim 128 above
all; the probe table lists every config), each iteration also stores and
reloads its spilled registers through L2 (algorithms/compiled.py).
build_variant builds other kernels of this structure (algorithms/fa3_triton.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from .compiled import NOTHING, Compiled, fa2_compiled
from .ops import (CP_ASYNC, LD, TMA, Alu, DescriptorSetup, Exp, IssueStalls, Load, Mma, MmaWait, StepLatency, Store,
                  Tile, Wait)
from .problem import ACC_BYTES, AttentionProblem, TileConfig, cdiv
from .schedule import (WARPS_PER_WARPGROUP, attention_tensors, CtaProgram, Launch, Role, Schedule, TensorSpec,
                       head_layout, pipelined_loop, plain_load)
from .smem import check_fits_block, registers_per_thread, triton_fa_smem_bytes

# FMA-pipe operations per score element besides the exp2: scale-and-subtract
# (one FMA, the scale folded into log2 space), the row max, the row sum and the
# conversion of P to 16 bits. A masked block adds one select per element.
ALU_PER_SCORE = 4
ALU_PER_MASKED_SCORE = 1
# Per output element and K/V block: the rescale of the accumulator by alpha.
ALU_PER_ACC = 1
# Epilogue per output element: divide by l and convert.
ALU_EPILOGUE_PER_OUT = 2
# Triton 3.6's sm_90 layout gives each warpgroup (4 warps) 64-row slices of
# the Q block (wgmma is m64). Warpgroups beyond block_m / 64 do not split the
# rows: each computes all of S = Q Kᵀ and its softmax, in instructions of
# N = block_n / replicas, and they split P V along the head dim. Read off the
# PTX of cross-compiled kernels (64x64, 8 warps: every thread issues
# 16 m64n32k16 wgmma and 32 ex2 per iteration, as many as with 4 warps);
# experiments/triton_smem_probe.py records it per config and a test checks it.
TRITON_WARPGROUP_ROWS = 64


def warpgroup_replicas(cfg: TileConfig) -> int:
    """How many warpgroups compute each row of S (1 unless 8 warps share 64 rows)."""
    warpgroups = max(1, cfg.num_warps // WARPS_PER_WARPGROUP)
    slices = max(1, cfg.block_m // TRITON_WARPGROUP_ROWS)
    return max(1, warpgroups // slices)


def kv_trips(problem: AttentionProblem, block_n: int, last_row: int) -> int:
    """K/V blocks a Q block whose last row is `last_row` must visit."""
    blocks = cdiv(problem.seqlen_kv, block_n)
    if not problem.causal:
        return blocks
    last_col = last_row + problem.causal_offset
    return min(blocks, cdiv(last_col + 1, block_n))


def block_is_masked(problem: AttentionProblem, cfg: TileConfig, qb: int, j: int) -> bool:
    """Whether K/V block j of Q block qb needs masking: it straddles the causal
    diagonal or runs past the end of the keys."""
    col_end = (j + 1) * cfg.block_n  # one past the block's last column
    if col_end > problem.seqlen_kv:
        return True
    if problem.causal:
        first_row = qb * cfg.block_m
        return col_end - 1 > first_row + problem.causal_offset
    return False


def first_masked_block(problem: AttentionProblem, cfg: TileConfig, qb: int, trips: int) -> int:
    """Index of Q block qb's first masked K/V block (trips if none): the first
    j whose end passes the keys, (j + 1)·block_n > N_kv, or, under causal, the
    diagonal, (j + 1)·block_n > first_row + offset + 1 (block_is_masked)."""
    first = problem.seqlen_kv // cfg.block_n
    if problem.causal:
        first = min(first, (qb * cfg.block_m + problem.causal_offset + 1) // cfg.block_n)
    return min(trips, max(0, first))


def cta_cost_key(problem: AttentionProblem, cfg: TileConfig):
    """Q blocks with equal rows, trips and masked tail cost the same."""
    def key(qb: int):
        rows_q = min(cfg.block_m, problem.seqlen_q - qb * cfg.block_m)
        trips = kv_trips(problem, cfg.block_n, qb * cfg.block_m + rows_q - 1)
        return rows_q, trips, first_masked_block(problem, cfg, qb, trips)
    return key


def locate_q_block(problem: AttentionProblem, cfg: TileConfig, cta: int):
    """CTA `cta` of the (cdiv(N_q, block_m), B·H) grid, Q block fastest (FA2 and
    FA3): its Q block, batch, head, K/V head, Q rows and K/V blocks to visit."""
    p, bm = problem, cfg.block_m
    n_qb = cdiv(p.seqlen_q, bm)
    qb, pair = cta % n_qb, cta // n_qb
    b, h = divmod(pair, p.heads)
    rows_q = min(bm, p.seqlen_q - qb * bm)
    return qb, b, h, p.kv_head_of(h), rows_q, kv_trips(p, cfg.block_n, qb * bm + rows_q - 1)


def softmax_exps(rows: int, block_n: int) -> int:
    """The exp2s of a step's online softmax on `rows` rows of S: P = exp2(S - m), and alpha a row."""
    return rows * block_n + rows


def softmax_other_instructions(rows: int, block_n: int, cols: int, masked: bool, issued: int | None) -> int:
    """A step's softmax instructions besides its exp2s (max, scale, sum,
    convert, masks, bookkeeping), on `rows` rows of S and `cols` columns of
    O: from `issued`, the thread-instructions the compiled loop issues a
    step (all but the exp2s, which are the MUFU's), else estimated from the
    softmax's arithmetic (ALU_PER_SCORE...)."""
    if issued is not None:
        return max(0, issued - softmax_exps(rows, block_n))
    scores = rows * block_n
    return (scores * ALU_PER_SCORE + rows * cols * ALU_PER_ACC
            + (scores * ALU_PER_MASKED_SCORE if masked else 0))


@lru_cache(maxsize=256)   # ops are immutable: one tuple serves every step alike
def step_ops(dtype: str, mma: str, rows: int, block_n: int, head_dim: int, replicas: int = 1,
             masked: bool = False, issued: int | None = None, warpgroups: int = 1) -> tuple:
    """One warpgroup's share of a K/V step: its `rows` of S = Q Kᵀ (Q from
    SMEM), the online softmax on them, the chain's latency, and O += P V (P
    in registers) over its share of the head dim (all of it unless
    `replicas` warpgroups compute the same rows of S; warpgroup_replicas).

    Both products are issued asynchronously, as Triton 3.6 compiles the
    kernel for sm_90 (TTGIR: warp_group_dot, warp_group_dot_wait
    {pendings = 0} right after Q Kᵀ, P V left running): the wait after
    the next step's Q Kᵀ also waits for this step's P V, which meanwhile
    overlaps the next step's wait for its K/V tiles. On GPUs without wgmma
    the engine runs them synchronously (mma.sync).

    The softmax's instructions run in dependent phases (row max and scale,
    then the exp2s, then the row sum and the conversion of P), so a step
    takes its other instructions (Alu, on the SM's issue slots) and then its
    exp2s (Exp, on the MUFU) one after the other; other CTAs' and
    warpgroups' phases fill the units meanwhile. (Side by side, the step took
    the longer of the two: every tensor-bound config came out 10-20% fast,
    and the profile's slow tensor rate stood in for the difference,
    validation_notes.md session 17.) The serial fraction and the chain's
    latency of the profile are reduced from calibrate.py's dot_chain rows
    with the same composition (experiments/calibration/reduce.py, _dot_chain_steps).

    warpgroups: the CTA's warpgroups, which issue their Q Kᵀ together after
    the trip's barrier (Mma.issued_with); their P V each issues after its own
    softmax.

    issued: the thread-instructions the warpgroup issues per step besides
    its wgmma, from the compiled loop (algorithms/compiled.py), of which all
    but the exp2s (one a score and one a row) are the Alu phase's; without
    it, an estimate from the softmax's arithmetic alone (ALU_PER_SCORE...),
    also without the exp2s. The compiled loops issue
    more: 64x32 blocks with 4 warps at D = 64 issue 184 instructions a warp
    and step, 11.5 for each of a thread's 16 scores, against the
    estimate's 6 (4 a score and 2 for its share of the rescale),
    and a step masked on the causal diagonal 26-118% (median 63%) more
    than an unmasked one, against 25% (10-40% on a key tail)."""
    cols = head_dim // replicas
    exps = softmax_exps(rows, block_n)
    alu = softmax_other_instructions(rows, block_n, cols, masked, issued)
    return (Mma(rows, block_n, head_dim, dtype, mma, instr_n=block_n // replicas, is_async=True,
                issued_with=warpgroups),
            MmaWait(0),                              # S, and the previous step's P V
            Alu(alu),                                # max, scale, sum, convert, masks, bookkeeping
            Exp(exps),
            StepLatency(),                           # the chain's round trip
            Mma(rows, cols, block_n, dtype, mma, a_in_smem=False, instr_n=cols, is_async=True))


def smem_bytes(problem: AttentionProblem, cfg: TileConfig) -> int:
    return triton_fa_smem_bytes(problem, cfg)


@dataclass(frozen=True)
class Variant:
    """How a kernel with fa2's structure is built: the schedule's and the
    launch's names, the copy engine filling its K/V ring (and bringing Q)."""

    name: str = "fa2"
    launch: str = "fa2_fwd"
    engine: str = CP_ASYNC
    # TMA descriptors a CTA builds on the device before its first copy
    # (Triton's tl.make_tensor_descriptor; none for cp.async)
    device_descriptors: int = 0


FA2 = Variant()


def build(problem: AttentionProblem, cfg: TileConfig, hopper: bool = True) -> Schedule:
    """hopper: the sm_90 build of the kernel, whose registers, register spills
    (each iteration stores and reloads them through L2) and instructions per
    step come from its cubin (algorithms/compiled.py).

    Each warpgroup is a role: with 8 warps the two run their own dependent
    chains (wgmma, softmax, wgmma) between the loop's per-iteration barriers,
    so one's softmax can overlap the other's products (calibrate.py dot_chain,
    128x64 with 8 warps: 0.92 µs a step against 1.03 µs for the same tile
    with 4 warps, at one CTA per SM)."""
    # what ptxas made of the sm_90 build (probe table); the sm_80 one differs
    # (mma.sync, no wgmma) and runs on the estimates
    return build_variant(problem, cfg, fa2_compiled(problem, cfg) if hopper else NOTHING, FA2)


def build_variant(problem: AttentionProblem, cfg: TileConfig, compiled: Compiled,
                  variant: Variant) -> Schedule:
    """A kernel with fa2's grid, loops and warps (cfg.num_warps as launched),
    as `variant` says; `compiled`: its registers, spills, instructions per
    step and stalls outside the loops (NOTHING: estimates, and no stalls)."""
    p, e, d = problem, problem.elem_bytes, problem.head_dim
    bm, bn = cfg.block_m, cfg.block_n
    n_qb = cdiv(p.seqlen_q, bm)
    bh = p.batch * p.heads
    reps = warpgroup_replicas(cfg)
    roles = max(1, cfg.num_warps // WARPS_PER_WARPGROUP)
    role_warps = cfg.num_warps // roles
    # a role's rows of S (all of them when its warpgroup replicates S)
    role_rows = bm * reps // roles
    n_kv = p.seqlen_kv
    spills = compiled.spills
    spilling = spills is not None and spills.bytes > 0
    lanes = role_warps * 32     # a role's threads: each instruction a warp issues is 32 lanes' work
    tma = variant.engine == TMA
    # the code before, between and after the two loops: the stalls ptxas
    # scheduled into it, waited out once per CTA (none where the probe has
    # no count); 185-2196 clocks a warp each. With them fa2's MAPE over the
    # measured sweep went 15.2 -> 13.3% (validation_notes.md, session 11).
    before, between, after = ([IssueStalls(c)] for c in compiled.stalls) if compiled.stalls else ([], [], [])
    # the descriptors are built before anything else, one after the other
    # (SASS of kernels/fa3.py: an ATOMG.E.EXCH.STRONG.GPU, UTMACCTL.IV and
    # UTMACMDFLUSH each, waited for): 2015 cycles a descriptor on the H100
    setup = [DescriptorSetup(variant.device_descriptors)] if variant.device_descriptors else []

    def part(tile: Tile, nbytes: int, k: int):
        """Role k's share of a tile every thread copies a part of (a TMA copy
        is one thread's, of the whole tile: the model splits it among the
        roles all the same, which changes when its bytes arrive by little)."""
        if roles == 1:
            return tile, nbytes
        # tile._replace(col=k), spelled out: _replace is several times slower,
        # and this runs for every K/V tile a simulated or skipped step loads
        return Tile(tile.tensor, tile.batch, tile.head, tile.row, k), nbytes // roles

    # A head's K/V copies, (batch, kv head, block, role) -> [Load K, Load V],
    # built once for the launch: its Q blocks' CTAs all stream them, and the
    # engine replays them for every skipped step (built per step, they took a
    # fifth of a 16k prediction)
    kv_loads: dict = {}
    # ... and a head's whole K/V loops, one sequence its Q blocks' CTAs share
    # where their loops cover the same blocks (pipelined_loop's `share`);
    # spilling loops hold their CTA's own stack tiles
    kv_loops: dict = {}

    def program(cta: int) -> CtaProgram:
        qb, b, h, kvh, rows_q, trips = locate_q_block(p, cfg, cta)
        n_full = first_masked_block(p, cfg, qb, trips)
        # Spilled registers live in the CTA's local memory (its threads'
        # stacks), which L1 keeps poorly: ncu counts 0.5% (128x128 w4), 12-20%
        # (128x64 w4, 2 stages: two CTAs an SM) and 40-65% (3-4 stages: one)
        # of those loads hitting L1 (spill_counters_h100.csv). The model sends
        # them all to L2 (scratch: kept clean there, never written back) and
        # waits to reload them where the SASS waits (spill_traffic), which
        # over-predicts the one-CTA configs (validation_notes.md, session 14).
        stack = Tile("local", b, h, qb)

        def role_program(k: int) -> Role:
            col = k if roles > 1 else 0     # the role's part of a tile (part())
            def loads_of(j: int):
                loads = kv_loads.get((b, kvh, j, col))
                if loads is None:
                    # part(Tile(...), ...) inlined
                    nbytes = min(bn, n_kv - j * bn) * d * e // roles
                    loads = kv_loads[b, kvh, j, col] = [Load(Tile("K", b, kvh, j, col), nbytes),
                                                        Load(Tile("V", b, kvh, j, col), nbytes)]
                return loads

            def spill_ops() -> list:
                """A step's spill traffic: the same stores and reloads of the
                CTA's stack at every step."""
                ops = [Store(*part(stack, spills.store_bytes * cfg.threads, k))] if spills.store_bytes else []
                if spills.load_bytes:
                    # the reload in as many parts as the SASS has waits for it, each
                    # waited for less the clocks the warp issues before it needs it
                    # (none recorded: one wait, no slack)
                    slacks = spills.wait_slacks or (0, )
                    tile, nbytes = part(stack, spills.load_bytes * cfg.threads, k)
                    share = nbytes // len(slacks)
                    ops += [Load(tile, share + (nbytes - share * len(slacks) if i == 0 else 0), LD, (), slack)
                            for i, slack in enumerate(slacks)]
                return ops

            spilled = spill_ops() if spilling else []     # built once for the role, not every step

            def spill_traffic(j: int):
                return spilled

            def compute_of(j: int):
                masked = block_is_masked(p, cfg, qb, j)
                per_warp = compiled.issue_masked if masked else compiled.issue
                step = step_ops(p.dtype, cfg.mma, role_rows, bn, d, reps, masked,
                                None if per_warp is None else per_warp * lanes, roles)
                if not spilling:
                    return step
                # registers spilled and reloaded: not while P V still owns its
                # accumulator registers (an in-flight wgmma's are not the
                # warp's to store), so after it
                return [*step, MmaWait(0), *spill_traffic(j)]

            def key_of(j: int):
                return block_is_masked(p, cfg, qb, j), min(bn, p.seqlen_kv - j * bn)

            share = None if spilling else (kv_loops, (b, kvh, col, 0))
            q_tile = part(Tile("Q", b, h, qb), rows_q * d * e, k)
            if tma:   # a descriptor load: the copy signals an mbarrier the warps wait on
                bring_q = [Load(*q_tile, TMA, (f"q.{k}",)), Wait(f"q.{k}")]
            else:
                bring_q = [plain_load(*q_tile)]
            # The kernel's two loops (kernels/fa2.py): the unmasked blocks, then
            # the masked ones (causal diagonal, key tail). Triton pipelines
            # each on its own: the first drains (waits for its last P V and
            # copies) and the second fills its stages afresh (TTGIR, sm_90
            # and sm_80 alike), so a causal CTA waits out one more load.
            items = [*setup, *before, *bring_q,
                     *pipelined_loop("kv", n_full, loads_of, compute_of, cfg.num_stages, key_of,
                                     spill_traffic if spilling else None, role=k, roles=roles,
                                     engine=variant.engine, share=share),
                     MmaWait(0),                                     # the first loop's last P V
                     *between,
                     *pipelined_loop("kv_masked", trips - n_full, lambda j: loads_of(n_full + j),
                                     lambda j: compute_of(n_full + j), cfg.num_stages,
                                     lambda j: key_of(n_full + j),
                                     (lambda j: spill_traffic(n_full + j)) if spilling else None,
                                     role=k, roles=roles, engine=variant.engine,
                                     share=(kv_loops, (b, kvh, col, n_full)) if share else None),
                     MmaWait(0),                                     # the last P V
                     *after,
                     Alu(bm * d * ALU_EPILOGUE_PER_OUT // roles),
                     Store(*part(Tile("O", b, h, qb), rows_q * d * p.out_elem_bytes, k)),
                     Store(*part(Tile("LSE", b, h, qb), rows_q * ACC_BYTES, k))]
            return Role("warps" if roles == 1 else f"warpgroup{k}", role_warps, tuple(items))

        return CtaProgram(tuple(role_program(k) for k in range(roles)))

    smem = compiled.smem_bytes or smem_bytes(p, cfg)
    # the compiled kernel's own count where the probe has it (the estimate
    # had 120 for fa2's 128x32 with 8 warps at D = 128, two CTAs an SM; ptxas
    # gives 137-158, one: measured 1.5x the 4-warp config's time at N =
    # 512-1024 with 2 stages, predicted equal)
    regs = compiled.registers or registers_per_thread(
        cfg.threads, fp32_values=bm * d + bm * bn, packed16_values=bm * bn)
    launch = Launch(variant.launch, n_qb * bh, cfg.threads, smem, regs, program,
                    **head_layout(n_qb, bh, cta_cost_key(p, cfg)))
    tensors = attention_tensors(p, p.out_elem_bytes)
    if spilling:
        tensors["local"] = TensorSpec("local", bh, n_qb, spills.stack_bytes * cfg.threads, "local")
    return Schedule(variant.name, p, cfg, (launch,), tensors)


def check(problem: AttentionProblem, cfg: TileConfig, smem_limit: int) -> None:
    check_fits_block(smem_bytes(problem, cfg), smem_limit, "fa2")
