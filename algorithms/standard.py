"""Standard (materialised) attention: three launches with S and P in HBM.

1. qk_gemm: S = scale·Q Kᵀ, one CTA a row block of S (block_m rows, grid
   (row blocks per head, B·H)): Q's rows loaded once, then the head's K in
   blocks of block_n through the pipeline, each step one product over the
   whole head dim, its tile of S scaled, converted to a coalesced layout
   through SMEM and stored.
2. softmax: one CTA per row of S (B·H·N_q CTAs), the causal mask applied here
   (the GEMMs compute every tile, as PyTorch's math path does): it reads the
   row's columns left of the mask and writes the whole row of P.
3. pv_gemm: O = P V, tiles block_m x min(d, 128), reduction over N_kv in steps
   of block_k.
S and P are stored in the input dtype, as kernels/standard.py writes them.

Tiles of S are named per GEMM tile when written and per row when the softmax
reads them, so the L2 model sees no reuse between the two launches: S is
2·B·H·N_q·N_kv bytes, hundreds of MB at the sizes of interest, far beyond L2.
"""
from __future__ import annotations

from .defaults import softmax_num_warps
from .compiled import compiled as compiled_kernel
from .ops import LD, Alu, Exp, Load, Mma, MmaWait, SmemIO, Store, Tile, tuple_new
from .problem import AttentionProblem, TileConfig, cdiv
from .schedule import (attention_tensors, CtaProgram, Launch, Role, Schedule, TensorSpec, head_layout,
                       pipelined_loop, plain_load)
from .smem import check_fits_block, registers_per_thread

# Row softmax per element: max, subtract, sum, divide (+1 select under causal).
SOFTMAX_ALU_PER_ELEMENT = 4
SOFTMAX_ALU_PER_MASKED = 1
# Causal rows of the softmax read as far as the mask (visible() below), all
# of a band of N_q / SOFTMAX_ROW_BANDS rows as far as its last row: a band's
# rows are one cost class for the engine, and S's reads come out up to
# 1/SOFTMAX_ROW_BANDS too high (half that on average). A class a row took
# 65 s for B16 H32 N1024 D64 on a 2-core CPU, against 3.7 s with one class.
SOFTMAX_ROW_BANDS = 32
# Cross-warp reductions (tl.max, tl.sum) stage one fp32 per warp in SMEM.
REDUCTION_BYTES_PER_WARP = 4
PV_MAX_BLOCK_D = 128


def gemm_smem_bytes(block_m: int, block_n: int, block_k: int, stages: int, elem_bytes: int) -> int:
    """Triton's pipelined matmul keeps num_stages copies of both operand tiles."""
    return max(1, stages) * (block_m + block_n) * block_k * elem_bytes


def _pv_block_d(problem: AttentionProblem) -> int:
    return min(problem.head_dim, PV_MAX_BLOCK_D)


def qk_rows_smem_bytes(problem: AttentionProblem, cfg: TileConfig) -> int:
    """SMEM for kernels/standard.py's _qk_gemm_rows on sm_90 where the probe
    table (triton_smem_standard_qk.csv) lacks the config: Q's rows once,
    num_stages K blocks, and one S tile for its change of layout (bf16, out
    of the wgmma layout into a coalesced one). Exact for 72 of the 144
    probed configs (8 warps, 2-4 stages among them), never below what Triton
    allocates: with one stage (no pipeline) or with 4 warps on some tiles
    (the change done in parts) it allocates 4-32 KB less."""
    e, d = problem.elem_bytes, problem.head_dim
    return (cfg.block_m + max(1, cfg.num_stages) * cfg.block_n) * d * e + cfg.block_m * cfg.block_n * e


def smem_bytes(problem: AttentionProblem, cfg: TileConfig) -> int:
    """The largest SMEM of the three launches (they never run together)."""
    known = compiled_kernel("standard_qk", problem, cfg.num_warps, cfg).smem_bytes
    qk = known or qk_rows_smem_bytes(problem, cfg)
    pv = gemm_smem_bytes(cfg.block_m, _pv_block_d(problem), cfg.block_k, cfg.num_stages, problem.elem_bytes)
    return max(qk, pv)


def _gemm_launch(name, p, cfg, m_rows, n_cols, red_len, block_n, block_k,
                 a_tensor, b_tile, c_tile) -> Launch:
    """C[m_rows, n_cols] = A[m_rows, red_len] · B[red_len, n_cols] per (batch, head).
    A's tiles are Tile(a_tensor, b, h, m, k); b_tile(b, h, n, k) / c_tile(b, h, m, n)
    name the others."""
    e, bm = p.elem_bytes, cfg.block_m
    tm, tn, tk = cdiv(m_rows, bm), cdiv(n_cols, block_n), cdiv(red_len, block_k)
    per_head = tm * tn
    bh = p.batch * p.heads
    # B's copies, (batch, head, column block, k) -> Load, built once for the
    # launch: a head's row blocks all stream them, and the engine replays
    # them for every skipped step (PV at N = 16384: 524k steps)
    b_loads: dict = {}
    depths = [min(block_k, red_len - k * block_k) for k in range(tk)]   # of each step's tiles
    # one product left running (Triton 3.6, sm_90 TTGIR: warp_group_dot,
    # then warp_group_dot_wait {pendings = 1}); synchronous on mma.sync GPUs.
    # The same ops every step (ops are immutable).
    step = (Mma(bm, block_n, block_k, p.dtype, cfg.mma, is_async=True), MmaWait(1))

    def program(cta: int) -> CtaProgram:
        t, pair = cta % per_head, cta // per_head
        b, h = divmod(pair, p.heads)
        m, n = divmod(t, tn)
        rows = min(bm, m_rows - m * bm)
        cols = min(block_n, n_cols - n * block_n)
        b_row = b_loads.get((b, h, n))     # k -> B's copy at step k
        if b_row is None:
            b_row = b_loads[b, h, n] = {}

        def loads_of(k: int):
            depth = depths[k]
            b_load = b_row.get(k)
            if b_load is None:
                b_load = b_row[k] = Load(b_tile(b, h, n, k), cols * depth * e)
            # Load(Tile(a_tensor, b, h, m, k), rows * depth * e), built without
            # the named tuples' Python-level __new__ (a load per step and CTA:
            # 524k at N = 16384)
            return [tuple_new(Load, (tuple_new(Tile, (a_tensor, b, h, m, k)), rows * depth * e, LD, (), 0.0)),
                    b_load]

        def compute_of(k: int):
            return step

        key_of = depths.__getitem__

        items = [*pipelined_loop("k", tk, loads_of, compute_of, cfg.num_stages, key_of),
                 MmaWait(0),
                 Alu(bm * block_n),  # scale (QK) or convert (PV) the accumulator
                 Store(c_tile(b, h, m, n), rows * cols * e)]
        return CtaProgram((Role("warps", cfg.num_warps, tuple(items)),))

    smem = gemm_smem_bytes(bm, block_n, block_k, cfg.num_stages, e)
    regs = registers_per_thread(cfg.threads, fp32_values=bm * block_n)
    # Tiles cost the same unless they sit on a partial last row or column.
    partial_m, partial_n = m_rows % bm != 0, n_cols % block_n != 0
    edge = lambda t: (partial_m and t // tn == tm - 1, partial_n and t % tn == tn - 1)
    return Launch(name, per_head * bh, cfg.threads, smem, regs, program,
                  **head_layout(per_head, bh, key=edge))


def _qk_rows_launch(p: AttentionProblem, cfg: TileConfig) -> Launch:
    """S = scale·Q Kᵀ, one CTA a row block of S (kernels/standard.py
    _qk_gemm_rows): Q's rows from L2 once, the head's K blocks pipelined
    (num_stages), each step S_j = Q K_jᵀ waited for at once (TTGIR: the
    warp_group_dot_wait with pendings = 0 right after it), scaled and
    converted, changed to a coalesced layout through SMEM (a convert_layout
    inside the loop) and stored."""
    e, d, bm, bn = p.elem_bytes, p.head_dim, cfg.block_m, cfg.block_n
    n_kv = p.seqlen_kv
    tm, tn = cdiv(p.seqlen_q, bm), cdiv(p.seqlen_kv, bn)
    bh = p.batch * p.heads
    kvh = p.kv_head_of
    k_loads: dict = {}      # (batch, K/V head, block) -> [Load]: a head's K copies, built once
    cols_of = [min(bn, n_kv - j * bn) for j in range(tn)]     # block j's columns
    # a step's work before its store: the same ops every step (ops are immutable)
    work = (Mma(bm, bn, d, p.dtype, cfg.mma, is_async=True), MmaWait(0),
            Alu(bm * bn),                   # scale, convert to the output dtype
            SmemIO(2 * bm * bn * e))        # the tile into SMEM and out in the store's layout

    def program(cta: int) -> CtaProgram:
        m, pair = cta % tm, cta // tm
        b, h = divmod(pair, p.heads)
        g = kvh(h)
        rows = min(bm, p.seqlen_q - m * bm)
        cols = cols_of.__getitem__

        def loads_of(j: int):
            loads = k_loads.get((b, g, j))
            if loads is None:
                loads = k_loads[b, g, j] = [Load(Tile("K", b, g, j), cols(j) * d * e)]
            return loads

        def store_of(j: int):
            # [Store(Tile("S", b, h, m, j), rows * cols(j) * e)], without the
            # named tuples' Python-level __new__ (one per step and CTA)
            return [tuple_new(Store, (tuple_new(Tile, ("S", b, h, m, j)), rows * cols_of[j] * e, LD))]

        def compute_of(j: int):
            return [*work, *store_of(j)]

        # the stores in an iteration's memory too: skipped iterations pass them through L2
        items = [plain_load(Tile("Q", b, h, m), rows * d * e),
                 *pipelined_loop("n", tn, loads_of, compute_of, cfg.num_stages, cols, compute_memory=store_of)]
        return CtaProgram((Role("warps", cfg.num_warps, tuple(items)),))

    built = compiled_kernel("standard_qk", p, cfg.num_warps, cfg)
    smem = built.smem_bytes or qk_rows_smem_bytes(p, cfg)
    regs = built.registers or registers_per_thread(cfg.threads, fp32_values=bm * bn)
    partial_m = p.seqlen_q % bm != 0
    return Launch("qk_gemm", tm * bh, cfg.threads, smem, regs, program,
                  **head_layout(tm, bh, key=lambda t: partial_m and t == tm - 1))


def _softmax_launch(p: AttentionProblem) -> Launch:
    e, n = p.elem_bytes, p.seqlen_kv
    warps = softmax_num_warps(n)
    threads = 32 * warps
    bh = p.batch * p.heads
    alu = n * (SOFTMAX_ALU_PER_ELEMENT + (SOFTMAX_ALU_PER_MASKED if p.causal else 0))

    band = cdiv(p.seqlen_q, SOFTMAX_ROW_BANDS)

    def visible(r: int) -> int:
        """Row r's columns left of the causal mask: the kernel's load is
        masked there, and masked lanes read nothing (ncu, B16 H32 N1024 D64
        causal: the softmax read 0.55 GB of the 1.07 GB S). Rows go in
        SOFTMAX_ROW_BANDS bands, each row reading as far as its band's last
        row does, so that a band is one cost class. Counted by the element;
        the DRAM sector the row's last column falls in (32 B) is left out."""
        if not p.causal:
            return n
        last = min(p.seqlen_q, (r // band + 1) * band) - 1
        return min(n, max(0, last + p.causal_offset + 1))

    # visible(r) of every row, once: it is each CTA's cost class, which the
    # engine asks for every CTA it batches (262k CTAs at B1 H16 N16k)
    visible_of = [visible(r) for r in range(p.seqlen_q)]
    # every lane, masked or not (one op each for every CTA); its other
    # instructions, then its exp2s, as fa2.step_ops
    elementwise = (Alu(alu), Exp(n))

    def program(cta: int) -> CtaProgram:
        r, pair = cta % p.seqlen_q, cta // p.seqlen_q
        b, h = divmod(pair, p.heads)
        items = (plain_load(Tile("S", b, h, r, -1), visible_of[r] * e),  # col -1: a whole row
                 *elementwise,
                 Store(Tile("P", b, h, r, -1), n * e))                  # zeros right of the mask too
        return CtaProgram((Role("warps", warps, items),))

    regs = registers_per_thread(threads, fp32_values=1 << (n - 1).bit_length())
    return Launch("softmax", p.seqlen_q * bh, threads, warps * REDUCTION_BYTES_PER_WARP, regs,
                  program, **head_layout(p.seqlen_q, bh, key=visible_of.__getitem__))


def build(problem: AttentionProblem, cfg: TileConfig) -> Schedule:
    p, d, e = problem, problem.head_dim, problem.elem_bytes
    kvh = p.kv_head_of
    qk = _qk_rows_launch(p, cfg)
    pv = _gemm_launch(
        "pv_gemm", p, cfg, p.seqlen_q, d, p.seqlen_kv, _pv_block_d(p), cfg.block_k,
        a_tensor="P",
        b_tile=lambda b, h, n, k: Tile("V", b, kvh(h), k, n),
        c_tile=lambda b, h, m, n: Tile("O", b, h, m, n))
    bh = p.batch * p.heads
    tensors = attention_tensors(p, lse=False)
    tensors["S"] = TensorSpec("S", bh, p.seqlen_q, p.seqlen_kv * e, "intermediate")
    tensors["P"] = TensorSpec("P", bh, p.seqlen_q, p.seqlen_kv * e, "intermediate")
    return Schedule("standard", p, cfg, (qk, _softmax_launch(p), pv), tensors)


def check(problem: AttentionProblem, cfg: TileConfig, smem_limit: int) -> None:
    check_fits_block(smem_bytes(problem, cfg), smem_limit, "standard GEMMs")
