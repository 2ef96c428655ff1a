"""FlashAttention-3 forward (arXiv 2407.08608), Hopper only.

Grid and loop order as FA2: (cdiv(N_q, block_m), B·H), Q block fastest; each
CTA loops over the K/V blocks its Q block sees. Causal: a head's Q blocks are
launched heaviest first (the last Q block, which sees every K/V block, leads),
as kernels/fa3_gluon.py and FA3's longest-first tile order do, so the light
blocks fill the tail. Inside the CTA the warps specialise:
- a producer warpgroup issues TMA loads of Q once and of K_j, V_j into
  num_stages-deep SMEM rings, one for K and one for V; every consumer has its
  own "full" and "empty" barrier per ring (mbarriers), so no consumer can
  run ahead of the data, and it frees K_j's slot once S_j is done, V_j's once
  P_j V_j is;
- `consumer_warpgroups` consumer warpgroups each own block_m / consumers rows
  of the Q tile and run wgmma (asynchronous: Mma(is_async) + MmaWait).
- pingpong: consumers take turns issuing their GEMMs (named barriers
  "turn.w"), so one's softmax runs while the other's GEMMs occupy the tensor
  cores (Section 3.1 of the paper);
- intra-warpgroup overlap (Algorithm 2): iteration j issues QKᵀ_j and
  P_{j-1}V_{j-1} together and computes softmax(j) while P_{j-1}V_{j-1} runs.
- P, the A operand of P V, stays in registers with one or two consumers and
  goes through an SMEM buffer per consumer with three (p_in_smem), as in
  kernels/fa3_gluon.py and FA3's 192-row tile; O leaves through SMEM and TMA
  stores where its buffers fit (o_in_smem).
Where kernels/fa3_gluon.py differs: its CTAs are persistent, one an SM looping
over the tiles (causal ones from a host-made list schedule, heaviest last
rounds first), so its producer loads the next tile's Q, K and V during the
current tile's last steps; here each tile is a CTA of its own, handed out in
the same order as SMs free up, and pays its pipeline fill.
The fp8 variant is the same schedule with dtype "fp8" (twice the matmul rate);
the paper's in-kernel V transpose is not modelled (kernels/fa3.py lays V out
for the fp8 GEMM before the launch).
"""
from __future__ import annotations

from .compiled import fa3_gluon_compiled
from .errors import InvalidConfig
from .fa2 import (ALU_EPILOGUE_PER_OUT, block_is_masked, cta_cost_key, locate_q_block, softmax_exps,
                  softmax_other_instructions)
from .ops import (TMA, Alu, Arrive, Exp, Item, Load, Loop, Mma, MmaWait, SmemIO, StepLatency, Store,
                  Tile, Wait, shared_accesses)
from .problem import ACC_BYTES, AttentionProblem, TileConfig, cdiv
from .schedule import (WARPS_PER_WARPGROUP, attention_tensors, CtaProgram, Launch, Role, Schedule,
                       head_layout)
from .smem import MAX_REGISTERS_PER_THREAD, MBARRIER_BYTES, check_fits_block

WGMMA_M = 64  # one warpgroup's wgmma covers 64 rows
# The register file the kernel divides among its threads at launch (setmaxnreg
# then gives the producer's to the consumers, 24 and 240 a thread in the FA3
# paper's kernels and kernels/fa3_gluon.py).
REGISTERS_PER_SM = 65536  # cc 9.0; FA3 is Hopper-only
REGISTER_GRANULE = 8      # setmaxnreg and maxnreg take multiples of 8


def rows_per_consumer(cfg: TileConfig) -> int:
    return cfg.block_m // cfg.consumer_warpgroups


def p_in_smem(cfg: TileConfig) -> bool:
    """Where P, the A operand of O += P V, lives: in registers with one or two
    consumer warpgroups (240 registers a thread hold S, P and O), in an SMEM
    buffer per consumer with three (160 a thread do not hold P's 32 besides
    the 64 each of S and O: 128 x (3 x 160 + 32) fills the register file).
    FA3 makes the same choice for its 192-row tile (hopper/tile_size.h);
    kernels/fa3_gluon.py follows this rule."""
    return cfg.consumer_warpgroups == 3


# SMEM a block may opt into on every Hopper part (H100, H200: 227 KB,
# cudaDevAttrMaxSharedMemoryPerBlockOptin; calibration_h100.csv's device rows)
SMEM_PER_BLOCK_SM90 = 232448


def p_buffer_bytes(problem: AttentionProblem, cfg: TileConfig) -> int:
    """P's SMEM buffers, one rows x block_n tile a consumer."""
    return cfg.block_m * cfg.block_n * problem.elem_bytes


def o_buffer_bytes(problem: AttentionProblem, cfg: TileConfig) -> int:
    """O's SMEM buffers, one rows x D tile a consumer."""
    return cfg.block_m * problem.head_dim * problem.elem_bytes


def _smem_without_o(problem: AttentionProblem, cfg: TileConfig) -> int:
    e, d = problem.elem_bytes, problem.head_dim
    q = cfg.block_m * d * e
    ring = cfg.num_stages * 2 * cfg.block_n * d * e
    p_buffers = p_buffer_bytes(problem, cfg) if p_in_smem(cfg) else 0
    barriers = (1 + 3 * cfg.num_stages) * cfg.consumer_warpgroups * MBARRIER_BYTES
    return q + ring + p_buffers + barriers


def o_in_smem(problem: AttentionProblem, cfg: TileConfig) -> bool:
    """O leaves through an SMEM buffer per consumer and TMA stores wherever
    those buffers fit beside Q, the K/V ring and P (kernels/fa3_gluon.py's
    o_tma default: 1-11% faster on the H100 than stores from registers,
    kernels/NOTES.md); otherwise each thread stores its part of O."""
    return _smem_without_o(problem, cfg) + o_buffer_bytes(problem, cfg) <= SMEM_PER_BLOCK_SM90


def smem_bytes(problem: AttentionProblem, cfg: TileConfig) -> int:
    """Q tile, the K/V ring, P's buffers (p_in_smem), O's (o_in_smem) and the
    mbarriers (q, full and empty per stage and consumer)."""
    o_buffers = o_buffer_bytes(problem, cfg) if o_in_smem(problem, cfg) else 0
    return _smem_without_o(problem, cfg) + o_buffers


def check(problem: AttentionProblem, cfg: TileConfig, smem_limit: int) -> None:
    want = WARPS_PER_WARPGROUP * (1 + cfg.consumer_warpgroups)
    if cfg.num_warps != want:
        raise InvalidConfig(
            f"fa3 with {cfg.consumer_warpgroups} consumer warpgroups needs num_warps={want} "
            f"(one producer warpgroup + consumers, 4 warps each), got {cfg.num_warps}")
    if cfg.block_m % (WGMMA_M * cfg.consumer_warpgroups):
        raise InvalidConfig(
            f"fa3 block_m ({cfg.block_m}) must give each of the {cfg.consumer_warpgroups} "
            f"consumer warpgroups a multiple of {WGMMA_M} rows")
    if cfg.num_stages < 2:
        raise InvalidConfig(f"fa3 needs num_stages >= 2 for its TMA ring, got {cfg.num_stages}")
    if cfg.mma not in ("auto", "wgmma"):
        raise InvalidConfig(f"fa3 runs on wgmma, got mma={cfg.mma!r}")
    check_fits_block(smem_bytes(problem, cfg), smem_limit, "fa3")


def build(problem: AttentionProblem, cfg: TileConfig) -> Schedule:
    p, e, d = problem, problem.elem_bytes, problem.head_dim
    out_e = p.out_elem_bytes
    bm, bn, cw = cfg.block_m, cfg.block_n, cfg.consumer_warpgroups
    rows = rows_per_consumer(cfg)
    p_smem = p_in_smem(cfg)
    o_smem = o_in_smem(p, cfg)
    n_qb = cdiv(p.seqlen_q, bm)
    bh = p.batch * p.heads
    consumers = range(cw)

    q_block_key = cta_cost_key(p, cfg)

    def launch_order(cta: int) -> int:
        """The fa2-grid CTA whose Q block runs as CTA `cta`: heaviest first under causal."""
        if not p.causal:
            return cta
        return cta - cta % n_qb + (n_qb - 1 - cta % n_qb)

    def full(name: str) -> tuple[str, ...]:
        return tuple(f"{name}.{w}" for w in consumers)

    k_empty, v_empty = [Wait(f"k_empty.{w}") for w in consumers], [Wait(f"v_empty.{w}") for w in consumers]
    k_full, v_full = full("k_full"), full("v_full")
    # A head's K/V loads, built once for the launch: its Q blocks' CTAs all
    # stream them, and the engine replays them for skipped steps and ghost
    # CTAs (built per step, they took half of a 16k prediction)
    kv_loads: dict = {}
    kv_loops: dict = {}     # (batch, K/V head, trips) -> a producer loop's loads, shared (Loop.accesses)

    # a consumer's softmax ops per step, unmasked and masked (one op each for every step alike):
    # its other instructions, then its exp2s, as fa2's steps (algorithms/fa2.step_ops). The
    # instructions are kernels/fa3_gluon.py's as compiled for sm_90 where the probe has the
    # config (all but the exp2s, one a score and one a row, are the Alu's), else an estimate
    # from the softmax's arithmetic. The compiled loop issues more: at the default 128x128,
    # D = 128, a consumer warp issues 446 a step unmasked and 576-711 masked (the key tail,
    # the causal diagonal), against the estimate's 385 and 449 (exp2s included).
    compiled_loop = fa3_gluon_compiled(p, cfg)
    lanes = WARPS_PER_WARPGROUP * 32

    def other_instructions(masked: bool) -> int:
        per_warp = compiled_loop.issue_masked if masked else compiled_loop.issue
        return softmax_other_instructions(rows, bn, d, masked, None if per_warp is None else per_warp * lanes)

    softmax_ops = {masked: (Alu(other_instructions(masked)), Exp(softmax_exps(rows, bn)), StepLatency())
                   for masked in (False, True)}

    def program(cta: int) -> CtaProgram:
        qb, b, h, kvh, rows_q, trips = locate_q_block(p, cfg, launch_order(cta))

        def loads(j: int) -> list[Load]:
            # the producer's K_j and V_j, also for the engine to pass through
            # L2 when it skips iterations
            pair = kv_loads.get((b, kvh, j))
            if pair is None:
                nbytes = min(bn, p.seqlen_kv - j * bn) * d * e
                pair = kv_loads[b, kvh, j] = [Load(Tile("K", b, kvh, j), nbytes, TMA, signal=k_full),
                                              Load(Tile("V", b, kvh, j), nbytes, TMA, signal=v_full)]
            return pair

        def produce(j: int) -> list[Item]:
            k, v = loads(j)
            return [*k_empty, k, *v_empty, v]

        def load_key(j: int):
            return min(bn, p.seqlen_kv - j * bn)

        producer = Role("producer", WARPS_PER_WARPGROUP, (
            Load(Tile("Q", b, h, qb), rows_q * d * e, TMA, signal=full("q_full")),
            Loop("kv", trips, produce, load_key, memory=loads,
                 accesses=shared_accesses(kv_loops, (b, kvh, trips), loads, trips))))

        def no_accesses(_k: int) -> tuple:
            return ()   # a consumer's loop reads SMEM only

        def consumer(w: int) -> Role:
            nxt = (w + 1) % cw
            take_turn = [Wait(f"turn.{w}")] if cfg.pingpong and cw > 1 else []
            give_turn = [Arrive(f"turn.{nxt}")] if cfg.pingpong and cw > 1 else []
            qk = Mma(rows, bn, d, p.dtype, "wgmma", is_async=True)
            pv = Mma(rows, d, bn, p.dtype, "wgmma", is_async=True, a_in_smem=p_smem)
            # P through SMEM: the warps write it there once P_{j-1} V_{j-1} has
            # retired, and the wgmma reads it back as its A operand
            write_p = [SmemIO(rows * bn * e)] if p_smem else []

            def softmax(j: int) -> tuple[Item, ...]:
                return softmax_ops[block_is_masked(p, cfg, qb, j)]

            # K's slot is released as soon as S = Q Kᵀ is done, V's once P V is:
            # separate rings, as in the FA3 paper's code and kernels/fa3_gluon.py
            # (one release for both held K_j's slot until P V finished, so with
            # 2 stages the next K load waited out a whole step: the D=128
            # default came out 36% slower than the Gluon kernel at N = 16k)
            release_k, release_v = Arrive(f"k_empty.{w}"), Arrive(f"v_empty.{w}")
            # a step's ops, built once (ops are immutable; every step built them anew)
            k_ready, v_ready = Wait(f"k_full.{w}"), Wait(f"v_full.{w}")
            wait_one, wait_all = MmaWait(pending=1), MmaWait()
            if cfg.intra_wg_overlap:
                def step(k: int) -> list[Item]:
                    j = k + 1  # QKᵀ_j with P_{j-1}V_{j-1}; softmax(j) under the PV GEMM
                    return [k_ready, *take_turn, qk,
                            v_ready, pv, *give_turn,
                            wait_one, release_k, *softmax(j), wait_all, release_v,
                            *write_p]
                body = [Wait(f"k_full.{w}"), *take_turn, qk, *give_turn, MmaWait(), release_k,
                        *softmax(0), *write_p,
                        Loop("kv", trips - 1, step, lambda k: block_is_masked(p, cfg, qb, k + 1),
                             memory=no_accesses),
                        Wait(f"v_full.{w}"), *take_turn, pv, *give_turn, MmaWait(), release_v]
            else:
                def step(j: int) -> list[Item]:
                    return [k_ready, *take_turn, qk, wait_all, *give_turn, release_k,
                            *softmax(j), *write_p,
                            v_ready, *take_turn, pv, wait_all, *give_turn,
                            release_v]
                body = [Loop("kv", trips, step, lambda j: block_is_masked(p, cfg, qb, j),
                             memory=no_accesses)]
            my_rows = max(0, min(rows, rows_q - w * rows))
            stage_o = [SmemIO(rows * d * out_e)] if o_smem else []  # O into SMEM for its TMA store
            return Role(f"consumer{w}", WARPS_PER_WARPGROUP, (
                Wait(f"q_full.{w}"), *body,
                Alu(rows * d * ALU_EPILOGUE_PER_OUT), *stage_o,
                Store(Tile("O", b, h, qb, w), my_rows * d * out_e, TMA),
                Store(Tile("LSE", b, h, qb, w), my_rows * ACC_BYTES)))

        barriers = {f"{ring}_empty.{w}": cfg.num_stages for ring in "kv" for w in consumers}
        barriers.update({f"turn.{w}": int(w == 0) for w in consumers})
        return CtaProgram((producer, *(consumer(w) for w in consumers)), barriers)

    # The kernel launches with the whole register file over its threads
    # (maxnreg 168 for 384 threads in kernels/fa3_gluon.py), which setmaxnreg
    # then moves from the producer to the consumers: one CTA an SM, whatever
    # the consumers need (their average had let two D = 64 CTAs share an SM)
    regs = min(MAX_REGISTERS_PER_THREAD,
               REGISTERS_PER_SM // cfg.threads // REGISTER_GRANULE * REGISTER_GRANULE)
    launch = Launch("fa3_fwd", n_qb * bh, cfg.threads, smem_bytes(p, cfg), regs, program,
                    **head_layout(n_qb, bh, lambda t: q_block_key(launch_order(t))))
    tensors = attention_tensors(p, out_e)
    return Schedule("fa3", p, cfg, (launch,), tensors)
