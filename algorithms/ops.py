"""The vocabulary of a schedule: tile operations a CTA's warp roles execute.

Operations are small frozen records. They say *what* happens (which tile,
how many bytes, which engine, which matrix shape), never how long it takes:
durations come from a HardwareProfile inside gpusim. The accounting walks
these records; the SimPy engine replays them. Nothing else describes an
algorithm, so the two cannot drift apart.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, NamedTuple, Sequence, Union

# Copy engines. "ld": a plain load/store; the issuing warp waits for the data.
# "cp.async": Ampere+ asynchronous global->SMEM copy issued by the warps.
# "tma": Hopper's tensor memory accelerator, one thread issues a whole tile.
LD, CP_ASYNC, TMA = "ld", "cp.async", "tma"
COPY_ENGINES = (LD, CP_ASYNC, TMA)


class Tile(NamedTuple):
    """A rectangle of a global tensor, named so that reuse can be recognised:
    two loads of the same Tile are the same bytes (an L2 hit if still cached).
    `head` is the tensor's own head index (a K/V head under GQA). A named
    tuple, not a dataclass: the L2 model hashes one per access, and a
    tuple's hash is C code (a 16k causal fa2 prediction spent a fifth of its
    time in the dataclass's __hash__)."""

    tensor: str
    batch: int
    head: int
    row: int  # block index along the tensor's rows
    col: int = 0  # block index along its columns (0 when a tile spans all)


class Load(NamedTuple):
    """Global memory -> SM. Async engines deposit into an SMEM buffer and, when
    the bytes have arrived, add one token to each barrier in `signal` (FA3's
    producer signals every consumer warpgroup's own barrier). A plain (LD)
    load stalls its warp until its bytes arrive, or, given `signal`, does
    not and signals them as they arrive: independent loads the warp issues
    back to back and a Wait then takes together (FA1's O, l and m). A named tuple,
    as Tile: loads are built for every simulated or skipped iteration, and a
    tuple is made three times faster than a frozen dataclass (0.3 against
    0.8 µs)."""

    tile: Tile
    nbytes: int
    engine: str = LD
    signal: tuple[str, ...] = ()
    # LD only: SM clocks of other work the warp issues between the load and the
    # first instruction that needs its bytes (a spill reload's, kernels/sass.py):
    # the warp waits for the bytes that much less
    slack: float = 0.0


# tuple_new(Load, (tile, nbytes, engine, signal, slack)): a named tuple made
# without its Python-level __new__ (every field given), for the few places
# that build one per simulated or skipped step; equal to Load(...) in all
# respects.
tuple_new = tuple.__new__


class Store(NamedTuple):
    """SM -> global memory (write-back through L2). A named tuple, as Load."""

    tile: Tile
    nbytes: int
    engine: str = LD


@dataclass(frozen=True, slots=True)
class Mma:
    """`count` matrix products of [m, k] x [k, n] in `dtype` on the tensor cores.
    kind: "mma.sync", "wgmma" or "auto" (the GPU picks, as Triton would).
    is_async: wgmma-style issue; the role continues and later waits with MmaWait.

    How a wgmma reads its operands (the compiled kernel's instruction mix):
    a_in_smem: A comes from shared memory (Q Kᵀ) rather than registers (P V);
    instr_n: the N of each instruction (0: n, one instruction spans all
    columns). Narrow instructions re-read A for every slice of N, which is
    what bounds them by SMEM bandwidth. m counts every row the warpgroups
    compute, so a product that two warpgroups both compute has twice its rows.

    issued_with: how many warpgroups of the CTA issue this product at the
    same moment, released together by the CTA's barrier (fa2's Q Kᵀ with 8
    warps). The tensor pipe interleaves their instructions, so all of them
    end when the last would have: calibrate.py dot_chain_phase measured the
    two warpgroups' S landing 55-88 cycles apart, where served whole and in
    turn they would land a product (129-257 cycles) apart."""

    m: int
    n: int
    k: int
    dtype: str
    kind: str = "auto"
    count: int = 1
    is_async: bool = False
    a_in_smem: bool = True
    instr_n: int = 0
    issued_with: int = 1

    @property
    def flops(self) -> int:
        return 2 * self.m * self.n * self.k * self.count


@dataclass(frozen=True, slots=True)
class MmaWait:
    """Wait until at most `pending` of this role's asynchronous Mma ops are
    still running (wgmma.wait_group semantics: they finish in issue order)."""

    pending: int = 0


@dataclass(frozen=True, slots=True)
class Exp:
    """`count` exponentials (exp2) on the special-function unit. A softmax's
    other instructions (max, scale, sum, conversions) are an Alu op before it:
    within a warp the two run in dependent phases, one after the other
    (algorithms/fa2.step_ops); other warps' phases overlap them."""

    count: int


@dataclass(frozen=True, slots=True)
class Alu:
    """`flops` other floating-point operations (max, scale, FMA) on the FMA pipe."""

    flops: int


@dataclass(frozen=True, slots=True)
class StepLatency:
    """The part of one flash-attention step's dependent chain (S = Q Kᵀ on
    the tensor cores -> wait for it -> row max and sum across a quad's
    shuffles -> exp2 -> P to 16 bits -> P V) that is latency, not work:
    one warpgroup running the chain alone takes this much longer per step
    than the SM's throughput allows. The role waits it out without holding
    a unit, so other CTAs and warpgroups on the SM can fill it. Its length
    is the profile's units.flash_step_latency_cycles (measured by
    experiments/calibrate.py dot_chain: one CTA per SM against several)."""


@dataclass(frozen=True, slots=True)
class IssueStalls:
    """`cycles` SM clocks a role spends in straight-line code outside its
    loops (a kernel's prologue, epilogue, the code between two loops) waiting
    out the fixed latencies ptxas scheduled between its instructions: the
    stall counts of the SASS control codes (kernels/sass.py). The role waits
    without holding a unit, so other CTAs on the SM can fill the time; the
    variable-latency waits (loads, MUFU, shuffles) are not in it."""

    cycles: float


@dataclass(frozen=True, slots=True)
class DescriptorSetup:
    """A CTA builds `count` TMA tensor descriptors on the device before its
    first copy (Triton's tl.make_tensor_descriptor: each written to global
    scratch by a GPU-scope atomic and fenced, one after the other). The role
    waits count x the profile's copy.tma_descriptor_setup_cycles
    (experiments/calibrate.py tma_setup), holding no unit."""

    count: int


@dataclass(frozen=True, slots=True)
class SmemIO:
    """Warps reading or writing `nbytes` of shared memory (not counting what
    the tensor cores and copy engines move), e.g. FA1's split-K combine."""

    nbytes: int


@dataclass(frozen=True, slots=True)
class Arrive:
    """Add `count` tokens to a barrier (an mbarrier arrive or a named-barrier signal)."""

    barrier: str
    count: int = 1


@dataclass(frozen=True, slots=True)
class Wait:
    """Take `count` tokens from a barrier, blocking until they are there."""

    barrier: str
    count: int = 1


@dataclass(frozen=True, slots=True)
class SyncThreads:
    """__syncthreads: every role of the CTA reaches this point before any goes on."""


Op = Union[Load, Store, Mma, MmaWait, Exp, Alu, StepLatency, IssueStalls, DescriptorSetup, SmemIO, Arrive, Wait,
           SyncThreads]


@dataclass(frozen=True)
class Loop:
    """`trips` iterations of `body(i)`, built only when walked (laziness: a 16k
    problem never materialises its millions of ops).

    key(i), when given, is a cheap label of iteration i's cost: iterations
    with equal keys have equal ops apart from tile identity (same sizes,
    same engines). The engine times a few of a run of equal keys and
    fast-forwards the rest; tests check the labels against the ops."""

    name: str
    trips: int
    body: Callable[[int], Sequence["Item"]]
    key: Callable[[int], object] | None = None
    # memory(i): iteration i's Loads and Stores alone, in program order -- a
    # cheaper way to them than body(i) for the engine, which passes skipped
    # iterations' tiles through L2. None: filter body(i).
    memory: Callable[[int], Sequence["Item"]] | None = None
    # accesses(): every iteration's memory(i) in order, as one sequence that
    # loops of other CTAs touching the same tiles in the same order share
    # (shared_accesses); the engine replays a ghost CTA's loop, and a skipped
    # run of iterations (accesses.spans), from it.
    accesses: "SharedAccesses | None" = None
    # spans(first, count): iterations first .. first + count - 1's memory(i)
    # chained, as slices (seq, lo, hi) of sequences that live as long as the
    # schedule, unchanged but for growing at their end: the engine encodes
    # each of them once for its L2
    # (a skipped run of FA1's outer loop replays 1.8k accesses a K/V block,
    # cut from the same few lists of its CTA). None: from accesses, else
    # from memory(i).
    spans: Callable[[int, int], list] | None = None


Item = Union[Op, Loop]


class SharedAccesses:
    """A Loop's `accesses`, shared: memory(0..trips-1) chained, built once
    under `key` in `cache` (a launch's dict) for every loop that touches the
    same tiles in the same order -- the K/V loops of a head's Q blocks, say.
    key must tell such loops apart from all others of the launch. Calling it
    gives the whole sequence; window(first, count) the accesses of
    iterations first .. first + count - 1 alone, a slice of it (the engine
    replays a skipped run of iterations from it without rebuilding them)."""

    __slots__ = ("cache", "key", "memory", "trips")
    # every access a Load (the engine's ghost replay then takes the sequence as its loads)
    loads_only = False

    def __init__(self, cache: dict, key, memory: Callable[[int], Sequence[Item]], trips: int):
        self.cache, self.key, self.memory, self.trips = cache, key, memory, trips

    def _built(self) -> tuple[tuple, list[int]]:
        built = self.cache.get(self.key)
        if built is None:
            ops: list = []
            offsets = [0]      # offsets[i]: where iteration i's accesses start
            for i in range(self.trips):
                ops += self.memory(i)
                offsets.append(len(ops))
            built = self.cache[self.key] = (tuple(ops), offsets)
        return built

    def __call__(self) -> Sequence[Item]:
        return self._built()[0]

    def window(self, first: int, count: int) -> Sequence[Item]:
        ops, offsets = self._built()
        return ops[offsets[first]:offsets[first + count]]

    def spans(self, first: int, count: int) -> list[tuple]:
        """window(first, count) as Loop.spans gives it: one slice of the sequence."""
        ops, offsets = self._built()
        return [(ops, offsets[first], offsets[first + count])]


def spanned(spans) -> list:
    """The ops of Loop.spans' slices, one after the other."""
    return [op for seq, lo, hi in spans for op in seq[lo:hi]]


class PrefixAccesses(SharedAccesses):
    """SharedAccesses of a pipelined loop whose iteration i copies
    loads_of(i + lookahead) and nothing else (none in its last lookahead
    iterations): the loops over one stream of tiles (a head's K/V blocks)
    that differ in trips (causal Q blocks) have sequences that are prefixes
    of one another. Each still has its own sequence and offsets, equal to
    SharedAccesses' (memory(i) chained), but they are cut from one list per
    stream, kept under `stream` in the cache, which grows as longer loops
    ask (built per loop, every causal CTA's K/V loop called loads_of again
    for each of its steps: a tenth of a causal fa2 prediction)."""

    __slots__ = ("stream", "loads_of", "lookahead")
    loads_only = True

    def __init__(self, cache: dict, key, stream, loads_of: Callable[[int], Sequence[Load]],
                 lookahead: int, trips: int):
        super().__init__(cache, key, None, trips)
        self.stream, self.loads_of, self.lookahead = stream, loads_of, lookahead

    def _built(self) -> tuple[tuple, list[int]]:
        built = self.cache.get(self.key)
        if built is None:
            grown = self.cache.get(self.stream)
            if grown is None:
                grown = self.cache[self.stream] = ([], [0])
            ops, ends = grown       # ends[k]: the accesses of loads_of(lookahead + m), m < k
            issuing = max(0, self.trips - self.lookahead)   # iterations that copy
            while len(ends) <= issuing:
                ops += self.loads_of(self.lookahead + len(ends) - 1)
                ends.append(len(ops))
            end = ends[issuing]
            built = self.cache[self.key] = (tuple(ops[:end]), ends[:issuing + 1] + [end] * (self.trips - issuing))
        return built

    def spans(self, first: int, count: int) -> list[tuple]:
        """A slice of the stream itself, which this loop's sequence begins
        (the stream only grows: Loop.spans' sequences may, at their end), so
        that the engine encodes a head's K/V stream once for all its loops."""
        _, offsets = self._built()
        return [(self.cache[self.stream][0], offsets[first], offsets[first + count])]


def shared_accesses(cache: dict, key, memory: Callable[[int], Sequence[Item]], trips: int) -> SharedAccesses:
    """A Loop's `accesses` shared by the loops built under `key` (SharedAccesses)."""
    return SharedAccesses(cache, key, memory, trips)


def walk(items: Sequence[Item]):
    """Yield every op of a role program in program order, expanding loops."""
    for item in items:
        if isinstance(item, Loop):
            for i in range(item.trips):
                yield from walk(item.body(i))
        else:
            yield item
