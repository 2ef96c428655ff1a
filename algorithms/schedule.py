"""A schedule: the launches of an algorithm and, per CTA, its warp roles' programs.

Schedules are data built lazily: `Launch.program(cta)` makes one CTA's program
on demand and loops expand only when walked. Launch order is the CTA index.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import Callable, Iterable, Sequence

from .ops import CP_ASYNC, LD, Arrive, Item, Load, Loop, Op, PrefixAccesses, Wait, shared_accesses, tuple_new
from .problem import ACC_BYTES, AttentionProblem, TileConfig


# A warpgroup: the 4 consecutive warps a Hopper wgmma or an FA3 role spans.
WARPS_PER_WARPGROUP = 4


@dataclass(frozen=True)
class Role:
    """A group of warps running one program (FA3: producer or a consumer warpgroup)."""

    name: str
    warps: int
    items: tuple[Item, ...]


@dataclass(frozen=True)
class CtaProgram:
    """What one CTA does: its roles and its barriers' initial token counts."""

    roles: tuple[Role, ...]
    barriers: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class TensorSpec:
    """A global tensor the schedule touches. `instances` is how many (batch,
    head) copies it has (B·H for Q, B·KVH for K under GQA)."""

    name: str
    instances: int
    rows: int
    row_bytes: int
    kind: str  # "input", "output", "intermediate" (S, P), "workspace" (FA1's O, l, m) or "local" (spills)

    @property
    def nbytes(self) -> int:
        return self.instances * self.rows * self.row_bytes


@dataclass(frozen=True)
class Launch:
    """One kernel launch. CTAs are numbered in launch order (the order the
    hardware dispatches them). `classes()` yields (representative CTA,
    multiplicity): CTAs whose programs are equal apart from which tiles they
    touch, so counting one and multiplying is exact."""

    name: str
    grid: int
    threads: int
    smem_bytes: int
    regs_per_thread: int
    program: Callable[[int], CtaProgram]
    classes: Callable[[], Iterable[tuple[int, int]]]
    # cost_key(cta): equal for CTAs whose programs cost the same (tiles aside).
    cost_key: Callable[[int], object]


@dataclass(frozen=True)
class Schedule:
    algo: str
    problem: AttentionProblem
    config: TileConfig
    launches: tuple[Launch, ...]
    tensors: dict[str, TensorSpec]

    @property
    def global_bytes(self) -> int:
        """Every global tensor's bytes: what the run holds in GPU memory (and
        the footprint L2 measures itself against)."""
        return sum(t.nbytes for t in self.tensors.values())


def attention_tensors(problem: AttentionProblem, out_elem_bytes: int | None = None,
                      lse: bool = True) -> dict[str, TensorSpec]:
    """Q, K, V (K/V with the kv heads), O in the output dtype and, for the
    fused algorithms, the fp32 logsumexp per query row."""
    p, d = problem, problem.head_dim
    e = problem.elem_bytes
    out_e = out_elem_bytes or e
    bh, kvi = p.batch * p.heads, p.batch * p.kv_heads
    tensors = {
        "Q": TensorSpec("Q", bh, p.seqlen_q, d * e, "input"),
        "K": TensorSpec("K", kvi, p.seqlen_kv, d * e, "input"),
        "V": TensorSpec("V", kvi, p.seqlen_kv, d * e, "input"),
        "O": TensorSpec("O", bh, p.seqlen_q, d * out_e, "output"),
    }
    if lse:
        tensors["LSE"] = TensorSpec("LSE", bh, p.seqlen_q, ACC_BYTES, "output")
    return tensors


# Wait(barrier, count), one op for all the steps and CTAs that wait alike
# (ops are immutable; a frozen dataclass is slow to build, and a pipelined
# loop's every step built one)
_wait = lru_cache(maxsize=1024)(Wait)
_COPIES = object()      # (a key of pipelined_loop's in a `share` cache)


def pipelined_loop(
    name: str,
    trips: int,
    loads_of: Callable[[int], Sequence[Load]],
    compute_of: Callable[[int], Sequence[Item]],
    stages: int,
    key_of: Callable[[int], object] | None = None,
    compute_memory: Callable[[int], Sequence[Op]] | None = None,
    role: int = 0,
    roles: int = 1,
    engine: str = CP_ASYNC,
    share: tuple[dict, object] | None = None,
) -> list[Item]:
    """A loop whose loads run ahead of its compute, as Triton's software
    pipeliner arranges it with cp.async (num_stages buffers).

    With stages == 1 the loads are plain and synchronous. Otherwise the
    prologue issues iterations 0..stages-2; iteration i waits for its own
    loads, computes, and only then issues the loads of i + stages - 1 into
    the buffer iteration i - 1 read. So a load has stages - 2 whole
    iterations, plus what of its issuing iteration's compute is still
    running asynchronously (wgmma), to land: with 2 stages it is waited for
    as soon as it is issued. That is the order of Triton 3.6's TTGIR for our
    fa2 and GEMM kernels, sm_80 and sm_90 alike (async_wait, the dots,
    then async_copy_global_to_local for the future iteration at the end of
    the body; kernels/fa2.py, kernels/standard.py cross-compiled). The
    barrier `name.ready` counts arrived tiles.
    key_of(i): the cost label of iteration i's loads and compute (see Loop.key).
    compute_memory(i): the Loads and Stores inside compute_of(i), if any (fa2's
    register spills), for Loop.memory.

    engine: the copies' engine, cp.async or TMA (Triton's descriptor loads,
    pipelined the same way).

    share: (a launch's dict, a key) where other CTAs run loops over the same
    tiles: loops whose keys, names, trips and stages are equal share one
    Loop.accesses sequence (ops.shared_accesses).

    roles > 1: this is role `role` of `roles` warpgroups sharing the loop (fa2
    with 8 warps). Every thread copies its part of each tile, so loads_of(i)
    gives this role's part. Each iteration the role waits for its own copies
    (cp.async.wait_group), meets the other roles at the CTA's barrier (their
    parts are in SMEM), computes, meets them again (the buffer the next
    copies overwrite is no longer read by anyone), then issues its next
    copies: the two BAR.SYNCs of every trip of Triton 3.6's sm_90 loop
    (kernels/fa2.py cross-compiled, 2 and 3 stages alike: DEPBAR.LE SB0,
    BAR.SYNC, the products and softmax, BAR.SYNC, LDGSTS). Between two
    barriers the roles run, and share the SM's units, freely.
    """
    extra = compute_memory or (lambda i: ())
    if trips <= 0:
        return []
    sync: list[Op] = []     # the barrier after the wait for this trip's tiles
    reuse: list[Op] = []    # ... and the one before the copies into a buffer a role may still read
    if roles > 1:
        sync = [*(Arrive(f"{name}.sync.{other}") for other in range(roles) if other != role),
                Wait(f"{name}.sync.{role}", roles - 1)]
        reuse = [*(Arrive(f"{name}.reuse.{other}") for other in range(roles) if other != role),
                 Wait(f"{name}.reuse.{role}", roles - 1)]
    if stages <= 1:
        def body(i: int) -> list[Item]:
            return [*loads_of(i), *sync, *compute_of(i)]
        return [Loop(name, trips, body, key_of, memory=lambda i: [*loads_of(i), *extra(i)])]

    barrier = f"{name}.ready" if roles == 1 else f"{name}.ready.{role}"
    lookahead = stages - 1

    signal = (barrier,)
    issued: dict[int, int] = {}     # iteration -> its loads, counted when issued

    # Where loops share a stream of tiles (share), the copies of a step are
    # built once for all of them: iteration -> its copies (a list no one changes)
    copies = None if share is None else share[0].setdefault((_COPIES, name, stages, share[1], barrier, engine), {})

    def issue(i: int) -> list[Op]:
        loads = None if copies is None else copies.get(i)
        if loads is None:
            # [Load(ld.tile, ld.nbytes, engine, signal) ...], without Load's Python-level __new__
            loads = [tuple_new(Load, (ld[0], ld[1], engine, signal, 0.0)) for ld in loads_of(i)]
            if copies is not None:
                copies[i] = loads
        issued[i] = len(loads)
        return loads

    def body(i: int) -> list[Item]:
        # (the count of the loads issued for i, not loads_of(i) rebuilt for it)
        count = issued.pop(i, None)
        ready = _wait(barrier, len(loads_of(i)) if count is None else count)
        ahead = issue(i + lookahead) if i + lookahead < trips else []
        if roles == 1:
            return [ready, *compute_of(i), *ahead]
        return [ready, *sync, *compute_of(i), *reuse, *ahead]

    def key(i: int):
        ahead = key_of(i + lookahead) if i + lookahead < trips else None
        return (key_of(i), ahead)

    prologue: list[Item] = []
    for i in range(min(lookahead, trips)):
        prologue.extend(issue(i))
    def memory(i: int) -> Sequence[Op]:
        # in program order: the iteration's own accesses (stores, spills),
        # then the copies it issues for a later one
        ahead = loads_of(i + lookahead) if i + lookahead < trips else ()
        return [*compute_memory(i), *ahead] if compute_memory else ahead

    accesses = None
    if share is not None:
        cache, tiles = share
        if compute_memory is None:     # memory(i) is loads_of(i + lookahead): prefixes of one stream
            accesses = PrefixAccesses(cache, (name, trips, stages, tiles), (PrefixAccesses, name, stages, tiles),
                                      loads_of, lookahead, trips)
        else:
            accesses = shared_accesses(cache, (name, trips, stages, tiles), memory, trips)
    return [*prologue, Loop(name, trips, body, key if key_of else None, memory=memory, accesses=accesses)]


def head_layout(grid_per_head: int, heads_total: int, key: Callable[[int], object] | None = None):
    """`classes` and `cost_key` for a Launch whose grid is laid out as
    [batch·heads][per-head CTAs], the per-head index fastest (CTA c is
    per-head index c % grid_per_head). `key(t)` of per-head index t must be
    equal for CTAs whose programs cost the same (same op sizes, tile names
    aside); None keeps every per-head index apart."""
    label = key if key is not None else (lambda t: t)

    def cost_key(cta: int):
        return label(cta % grid_per_head)

    def classes():
        if key is None:
            for t in range(grid_per_head):
                yield t, heads_total
            return
        groups: dict[object, list[int]] = {}
        for t in range(grid_per_head):
            group = groups.setdefault(key(t), [t, 0])
            group[1] += 1
        for rep, n in groups.values():
            yield rep, n * heads_total

    return {"classes": classes, "cost_key": cost_key}


def plain_load(tile, nbytes) -> Load:
    return Load(tile, nbytes, LD)
