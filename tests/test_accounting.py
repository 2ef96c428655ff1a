"""The accounting, checked against closed forms over random problems."""
from hypothesis import example, given, settings, strategies as st

import algorithms
from algorithms.accounting import count
from algorithms.fa1 import last_kv_block, paper_block_sizes
from algorithms.compiled import fa2_spills
from algorithms.errors import GpusimError
from algorithms.ops import Loop, spanned
from algorithms import standard
from algorithms.fa2 import kv_trips
from algorithms.problem import AttentionProblem, TileConfig, cdiv

blocks = st.sampled_from([16, 32, 64, 128])


@st.composite
def problems(draw, causal=None):
    kv_heads = draw(st.sampled_from([1, 2, 4]))
    group = draw(st.sampled_from([1, 2, 4]))
    nq = draw(st.integers(1, 700))
    nkv = draw(st.integers(nq, 900)) if draw(st.booleans()) else nq
    c = draw(st.booleans()) if causal is None else causal
    return AttentionProblem(batch=draw(st.integers(1, 3)), heads=kv_heads * group, kv_heads=kv_heads,
                            seqlen_q=nq, seqlen_kv=nkv, head_dim=draw(st.sampled_from([32, 64, 128])),
                            causal=c, dtype=draw(st.sampled_from(["fp16", "bf16"])))


@st.composite
def configs(draw):
    return TileConfig(block_m=draw(blocks), block_n=draw(blocks), num_warps=4,
                      num_stages=draw(st.integers(1, 4)), block_k=draw(st.sampled_from([32, 64])))


def sizes(p):
    e, d = p.elem_bytes, p.head_dim
    return dict(q=p.batch * p.heads * p.seqlen_q * d * e,
                kv=p.batch * p.kv_heads * p.seqlen_kv * d * e,
                o=p.batch * p.heads * p.seqlen_q * d * e,
                rows=p.batch * p.heads * p.seqlen_q)


@settings(max_examples=60, deadline=None)
@given(problems(causal=False), configs())
# a config whose sm_90 build reloads spilled registers every iteration but
# stores them only before the loop (triton_smem_fa2.csv: 64x128 w4 s1 D128)
@example(AttentionProblem(batch=1, heads=1, seqlen_q=1, head_dim=128, causal=False, dtype="fp16"),
         TileConfig(block_m=64, block_n=128, num_warps=4, num_stages=1))
def test_fa2_noncausal_reads_q_once_kv_once_per_q_block(p, cfg):
    c = count(algorithms.build("fa2", p, cfg))
    n_qb, n_kb = cdiv(p.seqlen_q, cfg.block_m), cdiv(p.seqlen_kv, cfg.block_n)
    bh, row = p.batch * p.heads, p.head_dim * p.elem_bytes
    s = sizes(p)
    assert c.load_bytes["Q"] == s["q"]
    assert c.load_bytes["K"] == c.load_bytes["V"] == bh * n_qb * p.seqlen_kv * row
    # registers the sm_90 build spills go to the CTA's stack every iteration
    # (some configs only reload: their stores happen once, before the loop)
    spills = fa2_spills(p, cfg)
    spilled = {"local": spills.store_bytes * cfg.threads * bh * n_qb * n_kb} if spills and spills.store_bytes else {}
    assert c.store_bytes == {"O": s["o"], "LSE": 4 * s["rows"], **spilled}
    assert c.flops_matmul == 4 * bh * n_qb * cfg.block_m * n_kb * cfg.block_n * p.head_dim
    assert c.compulsory_read_bytes == s["q"] + 2 * s["kv"]
    assert c.compulsory_write_bytes == s["o"] + 4 * s["rows"]


@settings(max_examples=60, deadline=None)
@given(problems(causal=True), configs())
def test_fa2_causal_skips_blocks_above_the_diagonal(p, cfg):
    c = count(algorithms.build("fa2", p, cfg))
    bh, row = p.batch * p.heads, p.head_dim * p.elem_bytes
    kv_rows = flops = 0
    for qb in range(cdiv(p.seqlen_q, cfg.block_m)):
        last_row = min((qb + 1) * cfg.block_m, p.seqlen_q) - 1
        visible_cols = min(p.seqlen_kv, last_row + p.seqlen_kv - p.seqlen_q + 1)
        trips = cdiv(visible_cols, cfg.block_n)
        assert trips == kv_trips(p, cfg.block_n, last_row)
        kv_rows += min(p.seqlen_kv, trips * cfg.block_n)
        flops += 4 * cfg.block_m * trips * cfg.block_n * p.head_dim
    assert c.load_bytes["K"] == bh * kv_rows * row
    assert c.flops_matmul == bh * flops
    assert c.load_bytes["Q"] == sizes(p)["q"]


@settings(max_examples=60, deadline=None)
@given(problems(causal=False), configs())
def test_fa1_round_trips_o_l_m_for_every_kv_block(p, cfg):
    c = count(algorithms.build("fa1", p, cfg))
    tc = cdiv(p.seqlen_kv, cfg.block_n)
    bh, d, e = p.batch * p.heads, p.head_dim, p.elem_bytes
    rows = bh * p.seqlen_q
    assert c.load_bytes["K"] == c.load_bytes["V"] == bh * p.seqlen_kv * d * e  # once per CTA
    assert c.load_bytes["Q"] == tc * rows * d * e
    assert c.load_bytes.get("O_acc", 0) == (tc - 1) * rows * d * 4
    assert c.load_bytes.get("l", 0) == c.load_bytes.get("m", 0) == (tc - 1) * rows * 4
    assert c.store_bytes.get("O_acc", 0) == (tc - 1) * rows * d * 4
    assert c.store_bytes["O"] == rows * d * e


@settings(max_examples=40, deadline=None)
@given(problems(), configs(), st.data())
def test_fa1_loops_spans_are_their_own_accesses(p, cfg, data):
    """What the engine replays for a skipped run of FA1's outer loop (Loop.spans)
    or inner loop (its accesses' spans): the run's iterations' memory(i), in order."""
    (role,) = algorithms.build("fa1", p, cfg).launches[0].program(0).roles
    (outer,) = [it for it in role.items if isinstance(it, Loop)]
    first = data.draw(st.integers(0, outer.trips - 1))
    count = data.draw(st.integers(1, outer.trips - first))
    assert spanned(outer.spans(first, count)) == [op for j in range(first, first + count) for op in outer.memory(j)]
    (inner,) = [it for it in outer.body(first) if isinstance(it, Loop)]
    lo = data.draw(st.integers(0, inner.trips - 1))
    n = data.draw(st.integers(1, inner.trips - lo))
    assert spanned(inner.accesses.spans(lo, n)) == [op for k in range(lo, lo + n) for op in inner.memory(k)]


@settings(max_examples=30, deadline=None)
@given(problems(), configs())
def test_fa1_steps_wait_as_the_compiled_kernel_does(p, cfg):
    """kernels/fa1.py's SASS (sm_90): a step waits for Q's loads (its STS into
    SMEM), then for O's, l's and m's issued back to back, together; an outer
    iteration for K's and V's together. So a plain Q load that stalls, the
    others signalling one barrier that a Wait then takes: two round trips a
    step, one for K/V."""
    from algorithms.fa1 import LOADED
    from algorithms.ops import LD, Load, Wait

    (role,) = algorithms.build("fa1", p, cfg).launches[0].program(0).roles
    (outer,) = [it for it in role.items if isinstance(it, Loop)]
    for j in sorted({0, outer.trips - 1}):
        body = outer.body(j)
        k, v, wait_kv = body[:3]
        assert all(op.engine == LD and op.signal == (LOADED,) for op in (k, v))
        assert wait_kv == Wait(LOADED, 2)
        (inner,) = [it for it in body if isinstance(it, Loop)]
        step = inner.body(inner.trips - 1)
        loads = [op for op in step if isinstance(op, Load)]
        assert loads[0].tile.tensor == "Q" and loads[0].engine == LD and not loads[0].signal
        together = loads[1:]
        assert [op.tile.tensor for op in together] == ([] if j == 0 else ["O_acc", "l", "m"])
        assert all(op.signal == (LOADED,) for op in together)
        waits = [op for op in step if isinstance(op, Wait)]
        assert waits == ([Wait(LOADED, 3)] if together else [])
        assert step.index(waits[0]) == len(loads) if waits else True


@settings(max_examples=40, deadline=None)
@given(problems(causal=True), configs())
def test_fa1_causal_visits_the_same_blocks_as_fa2(p, cfg):
    """Both skip exactly the (Q block, K/V block) pairs above the diagonal."""
    fa1, fa2 = (count(algorithms.build(a, p, cfg)) for a in ("fa1", "fa2"))
    assert fa1.flops_matmul == fa2.flops_matmul
    bh = p.batch * p.heads
    visits = sum(last_kv_block(p, cfg.block_m, cfg.block_n, i) + 1
                 for i in range(cdiv(p.seqlen_q, cfg.block_m)))
    q_rows = sum(min(cfg.block_m, p.seqlen_q - i * cfg.block_m) * (last_kv_block(p, cfg.block_m, cfg.block_n, i) + 1)
                 for i in range(cdiv(p.seqlen_q, cfg.block_m)))
    assert fa1.load_bytes["Q"] == bh * q_rows * p.head_dim * p.elem_bytes
    assert visits >= cdiv(p.seqlen_q, cfg.block_m)


@settings(max_examples=40, deadline=None)
@given(problems(), configs())
def test_standard_moves_s_and_p_through_hbm(p, cfg):
    c = count(algorithms.build("standard", p, cfg))
    bh, e = p.batch * p.heads, p.elem_bytes
    sp = bh * p.seqlen_q * p.seqlen_kv * e
    assert c.store_bytes["S"] == sp
    assert c.store_bytes["P"] == c.load_bytes["P"] == sp
    # the softmax reads a row of S only left of the causal mask (its load is
    # masked), each row of a band as far as the band's last row
    visible = bh * e * sum(min(p.seqlen_kv, max(0, r + p.causal_offset + 1)) if p.causal else p.seqlen_kv
                           for r in range(p.seqlen_q))
    band = cdiv(p.seqlen_q, standard.SOFTMAX_ROW_BANDS)
    assert visible <= c.load_bytes["S"] <= min(sp, visible + bh * p.seqlen_q * (band - 1) * e)
    if not p.causal:
        assert c.load_bytes["S"] == sp
    # QKᵀ: a CTA a row block of S reads its rows of Q once and its head's K once
    tm = cdiv(p.seqlen_q, cfg.block_m)
    assert c.load_bytes["Q"] == sizes(p)["q"]
    assert c.load_bytes["K"] == tm * p.batch * p.heads * p.seqlen_kv * p.head_dim * p.elem_bytes
    assert c.compulsory_read_bytes == sizes(p)["q"] + 2 * sizes(p)["kv"] + 2 * sp
    assert c.flops_exp == p.batch * p.heads * p.seqlen_q * p.seqlen_kv


@settings(max_examples=30, deadline=None)
@given(problems(), st.sampled_from([64, 128]))
def test_fa3_moves_the_same_bytes_as_fa2_with_the_same_tiles(p, block_n):
    fa3_cfg = algorithms.default_config("fa3", p).with_(block_n=block_n)
    fa2_cfg = TileConfig(block_m=fa3_cfg.block_m, block_n=block_n)
    a, b = count(algorithms.build("fa3", p, fa3_cfg)), count(algorithms.build("fa2", p, fa2_cfg))
    # fa2's sm_90 build spills registers at 4 warps on 128 rows (its stack,
    # tensor "local"); the tensors both read and write are the same bytes
    tensors = lambda by: {t: n for t, n in by.items() if t != "local"}
    assert a.load_bytes == tensors(b.load_bytes) and a.store_bytes == tensors(b.store_bytes)
    assert a.flops_matmul == b.flops_matmul


def test_fa1_traffic_falls_as_smem_grows_theorem_2():
    """Theorem 2: Θ(N²d²/M) HBM accesses. Doubling M roughly halves the traffic."""
    p = AttentionProblem(batch=1, heads=1, seqlen_q=4096, head_dim=64)
    totals = []
    for sram in (16 * 1024, 32 * 1024, 64 * 1024, 128 * 1024):
        br, bc = paper_block_sizes(sram, p.head_dim, p.elem_bytes)
        cfg = TileConfig(block_m=br, block_n=bc, num_warps=4, num_stages=1)
        c = count(algorithms.build("fa1", p, cfg))
        totals.append(c.global_read_bytes + c.global_write_bytes)
    assert all(a > b for a, b in zip(totals, totals[1:])), totals
    # dominated by Q/O re-reads ∝ 1/B_c: each doubling of M saves at least 40%
    assert all(b / a < 0.6 for a, b in zip(totals, totals[1:])), totals


def test_issue_example_exact_matmul_flops():
    p = AttentionProblem(batch=4, heads=16, seqlen_q=4096, head_dim=128)
    for algo in algorithms.ALGORITHMS:
        c = count(algorithms.build(algo, p))
        assert c.flops_matmul == 4 * 4 * 16 * 4096 ** 2 * 128, algo


def test_lazy_schedule_builds_fast_at_16k():
    """A 16k-token problem never materialises its millions of ops up front."""
    import time
    p = AttentionProblem(batch=1, heads=16, seqlen_q=16384, head_dim=128, causal=True)
    t = time.perf_counter()
    for algo in algorithms.ALGORITHMS:
        s = algorithms.build(algo, p)
        s.launches[0].program(s.launches[0].grid - 1)
    assert time.perf_counter() - t < 0.1


@settings(max_examples=200, deadline=None)
@given(n_q=st.integers(1, 700), n_kv=st.integers(1, 700), causal=st.booleans(),
       bm=st.sampled_from([64, 128]), bn=st.sampled_from([32, 64, 128]))
def test_first_masked_block_is_the_first_block_that_needs_a_mask(n_q, n_kv, causal, bm, bn):
    from algorithms.fa2 import block_is_masked, first_masked_block

    if causal and n_q > n_kv:
        n_q, n_kv = n_kv, n_q     # causal needs N_q <= N_kv (bottom-right aligned)
    p = AttentionProblem(batch=1, heads=1, seqlen_q=n_q, seqlen_kv=n_kv, head_dim=64, causal=causal)
    cfg = TileConfig(block_m=bm, block_n=bn)
    for qb in range(-(-n_q // bm)):
        trips = kv_trips(p, bn, min(n_q, (qb + 1) * bm) - 1)
        brute = next((j for j in range(trips) if block_is_masked(p, cfg, qb, j)), trips)
        assert first_masked_block(p, cfg, qb, trips) == brute


@settings(max_examples=60, deadline=None)
@given(p=problems(), cfg=configs(), warps=st.sampled_from([4, 8]))
def test_fa2_runs_its_unmasked_and_masked_blocks_in_two_loops(p, cfg, warps):
    """As kernels/fa2.py does (Triton pipelines each loop on its own): a
    first loop over the blocks that need no mask, then one over those that
    do; together the K/V blocks the Q block visits, in order."""
    from algorithms.fa2 import block_is_masked, first_masked_block, locate_q_block
    from algorithms.ops import Loop, spanned

    cfg = cfg.with_(num_warps=warps)
    launch = algorithms.build("fa2", p, cfg).launches[0]
    for cta in {0, launch.grid // 2, launch.grid - 1}:
        qb, *_, trips = locate_q_block(p, cfg, cta)
        n_full = first_masked_block(p, cfg, qb, trips)
        for role in launch.program(cta).roles:
            loops = {it.name: it for it in role.items if isinstance(it, Loop)}
            assert loops.get("kv", Loop("kv", 0, None)).trips == n_full
            assert loops.get("kv_masked", Loop("kv_masked", 0, None)).trips == trips - n_full
            masked = [j for j in range(trips) if block_is_masked(p, cfg, qb, j)]
            assert masked == list(range(n_full, trips))


def test_fa3_causal_launches_each_heads_heaviest_q_block_first():
    p = AttentionProblem(batch=2, heads=4, seqlen_q=1024, head_dim=64, causal=True)
    launch = algorithms.build("fa3", p).launches[0]
    n_qb = cdiv(p.seqlen_q, algorithms.default_config("fa3", p).block_m)

    def visits(cta):
        (producer,) = [r for r in launch.program(cta).roles if r.name == "producer"]
        return next(it.trips for it in producer.items if getattr(it, "name", None) == "kv")

    for head in range(p.batch * p.heads):
        trips = [visits(head * n_qb + t) for t in range(n_qb)]
        assert trips == sorted(trips, reverse=True) and trips[0] > trips[-1]


@settings(max_examples=40, deadline=None)
@given(p=problems(), cfg=configs(), warps=st.sampled_from([4, 8]),
       algo=st.sampled_from(["fa2", "fa3", "fa3_triton"]))
def test_shared_loop_accesses_are_the_loops_own(p, cfg, warps, algo):
    """A loop's shared whole-loop accesses (Loop.accesses, what the engine
    replays for ghost CTAs, and a window of it for a skipped run of
    iterations) are its iterations' memory(i) in order, even when
    another CTA's loop built them; without causal a head's Q blocks share
    them."""
    cfg = TileConfig(block_m=cfg.block_m, block_n=cfg.block_n, num_warps=warps if algo != "fa3" else 12,
                     num_stages=max(2, cfg.num_stages))
    try:
        launch = algorithms.build(algo, p, cfg).launches[0]
    except GpusimError:
        return      # a config the algorithm refuses (SMEM, tile shape)
    seen = {}
    for cta in range(launch.grid):
        for role in launch.program(cta).roles:
            for item in role.items:
                if isinstance(item, Loop) and item.accesses is not None:
                    own = tuple(op for i in range(item.trips) for op in item.memory(i))
                    shared = item.accesses()
                    assert tuple(shared) == own
                    # a skipped run's window, and its spans, are its iterations' own accesses
                    first, count = item.trips // 3, (item.trips + 1) // 2
                    window = tuple(op for i in range(first, first + count) for op in item.memory(i))
                    assert tuple(item.accesses.window(first, count)) == window
                    assert tuple(spanned(item.accesses.spans(first, count))) == window
                    seen.setdefault(id(shared), set()).add(cta)
    if not p.causal and p.seqlen_q > 2 * cfg.block_m and seen:
        assert max(len(ctas) for ctas in seen.values()) > 1


@settings(max_examples=20, deadline=None)
@given(problems(causal=False))
def test_fa3_routes_p_and_o_through_smem_as_the_kernel_does(p):
    """Three consumers (192 rows) write P into SMEM every K/V step; O is
    staged in SMEM once per consumer and tile where its buffers fit. Each
    shows as warp SMEM traffic of exactly those bytes."""
    from algorithms import fa3

    e, d = p.elem_bytes, p.head_dim
    bn = 128 if d <= 64 else 64
    tiles = cdiv(p.seqlen_q, 192) * p.batch * p.heads
    steps = tiles * cdiv(p.seqlen_kv, bn)  # every consumer of every tile, one P a step
    cfg = TileConfig(block_m=192, block_n=bn, num_warps=16, num_stages=2, mma="wgmma",
                     consumer_warpgroups=3)
    assert fa3.p_in_smem(cfg)
    got = count(algorithms.build("fa3", p, cfg))
    p_bytes = 3 * steps * 64 * bn * e
    o_bytes = 3 * tiles * 64 * d * p.out_elem_bytes if fa3.o_in_smem(p, cfg) else 0
    assert got.smem_io_bytes == p_bytes + o_bytes
    two = algorithms.default_config("fa3", p)
    assert not fa3.p_in_smem(two)
    got2 = count(algorithms.build("fa3", p, two))
    tiles2 = cdiv(p.seqlen_q, two.block_m) * p.batch * p.heads
    assert got2.smem_io_bytes == (2 * tiles2 * 64 * d * p.out_elem_bytes
                                  if fa3.o_in_smem(p, two) else 0)
