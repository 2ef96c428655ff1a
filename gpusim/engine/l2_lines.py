"""L2's lines: an LRU of named tiles with a byte capacity, kept in arrays and
walked by numba-compiled loops.

MemorySystem (memory.py) decides what L2 does; this module only keeps its
lines. A line is a row of one float64 array `L` (tile ids from
MemorySystem's intern table; every field an integer below 2**53 but READY,
so float64 holds them exactly), the LRU order a doubly linked list through
its PREV/NEXT columns with row 0 as the sentinel (L[0, NEXT] the least
recently used line, L[0, PREV] the most recent). The scalars live in `S`;
an insertion records the dirty lines it evicts in `E` for MemorySystem to
write back.

Why arrays and numba: fast-forwarded work passes its tiles through L2 one
by one (MemorySystem.touch), millions of them for FA1 at N = 16k: as an
OrderedDict walked in Python that was 1 µs an access and 85% of FA1's
prediction; compiled, a few ns. A real load or store is one compiled call,
about 0.15 µs more than the OrderedDict's get and move_to_end were
(tests/test_l2_lines.py holds these lines to that OrderedDict).

Retention. The H100's L2 does not keep a working set whole up to its 50 MB
and drop it past them, as an LRU would: ncu's DRAM bytes of round trips
(each CTA reading its own part of a working set and writing it back, pass
after pass; experiments/l2_keep_ncu.py) show 2-3% of a pass missing at
34.6 MB, 9-24% at 41.1 MB, 19-67% at 45.4 MB and 44-96% at 49.7 MB (four
CTAs an SM, and one). So a load that finds its landed line at LRU depth d
(the bytes of it and of every line used since) past RAMP_START
(hw_profiles: l2.keep_all_bytes) misses the fraction
(d - RAMP_START) / (CAPACITY - RAMP_START) of its bytes: a tile's 128-byte
lines hit or miss one by one, so a tile partly gone is a tile whose load
waits for HBM, for that part of its bytes (and the same part of its dirty
bytes was written back when it left). The line stays, the most recent.
The depth is a Fenwick tree over the lines' stamps (their order of last
use), kept in S after the scalars; an S with no room after them (or
RAMP_START >= CAPACITY) is a plain LRU.
"""
from __future__ import annotations

import numpy as np
from numba import njit

# Columns of L
SIZE, READY, DIRTY, LAUNCH, PREV, NEXT, GEN, FLIGHT, STAMP = range(9)
N_FIELDS = 9
# DIRTY: 0 clean, ALL_DIRTY for a stored tile, else (a phantom, memory.py's
# anonymous entries) the count of its bytes that are dirty
ALL_DIRTY = -1.0
ABSENT = -1.0       # PREV of a row that holds no line

# Slots of S
USED, CAPACITY, CURRENT_LAUNCH, STALE_DIRTY = range(4)
# ... and touch()'s sums, written by it
T_REQUESTED, T_HITS, T_MISSED, T_WRITTEN, T_STALE_EVICTED = range(4, 9)
# ... the retention ramp's start (bytes) and the next stamp to give; load()'s
# PARTIAL: the bytes that missed and the dirty lines recorded in E
RAMP_START, NEXT_STAMP, PART_MISSED, PART_EVICTED = 9, 10, 11, 12
# ... the ramp's start as asked, and 1.0 once more lines than stamps had the
# ramp set aside (MemorySystem then gives S a longer tree: with_more_stamps)
RAMP_WANTED, OUT_OF_STAMPS = 13, 14
N_SCALARS = 15
# S[N_SCALARS + j - 1], j = 1 .. len(S) - N_SCALARS: the Fenwick tree of the
# lines' sizes by stamp (new_scalars(stamps))

# Codes of a replayed access (MemorySystem.encode)
LOAD, STORE, SCRATCH_STORE = 0, 1, 2

# Results of load() other than a time: a hit on a tile still on its way; a
# miss not kept (a tile larger than L2); a tile partly gone (the retention
# ramp: S[PART_MISSED], S[PART_EVICTED]); a miss kept is KEPT - (the number
# of dirty lines its insertion evicted, recorded in E)
IN_FLIGHT, NOT_KEPT, PARTIAL, KEPT = -1.0, -2.0, -2.5, -3.0
# store(): the tile is larger than L2 and not in it (the caller writes it back if dirty)
TOO_LARGE = -1


def compiled(signature: str):
    """numba.njit for one signature, compiled once (cached on disk) and
    called without numba's dispatch: its entry point takes the arguments as
    typed, 0.15 against 0.27 µs a call with three arrays (the engine makes
    one a real load or store). Arguments must have the signature's types."""
    def wrap(function):
        dispatcher = njit(signature, cache=True)(function)
        entry = getattr(dispatcher.overloads.get(dispatcher.signatures[0]), "entry_point", None)
        return entry if entry is not None else dispatcher
    return wrap


def new_scalars(capacity: float, ramp_start: float, stamps: int = 1 << 16) -> np.ndarray:
    """S for an L2 of `capacity` bytes whose loads start to miss past
    `ramp_start` bytes of depth (none if ramp_start >= capacity: no tree);
    `stamps`: the tree's length (stamps given before they are renumbered)."""
    ramp = ramp_start < capacity
    S = np.zeros(N_SCALARS + (stamps if ramp else 0))
    S[CAPACITY], S[RAMP_START], S[NEXT_STAMP] = capacity, ramp_start, 1.0
    S[RAMP_WANTED] = ramp_start
    return S


def with_more_stamps(L: np.ndarray, S: np.ndarray) -> np.ndarray:
    """S with a tree four times as long, the ramp back on, the lines
    restamped (after OUT_OF_STAMPS: more lines in L2 than the tree had
    stamps; the accesses of the call that ran out went without the ramp)."""
    bigger = np.zeros(N_SCALARS + 4 * (len(S) - N_SCALARS))
    bigger[:N_SCALARS] = S[:N_SCALARS]
    bigger[RAMP_START], bigger[OUT_OF_STAMPS] = bigger[RAMP_WANTED], 0.0
    restamp(L, bigger)
    return bigger


def new_lines(rows: int) -> np.ndarray:
    lines = np.zeros((rows, N_FIELDS))
    lines[:, PREV] = ABSENT
    lines[0, PREV] = lines[0, NEXT] = 0.0    # the sentinel: an empty ring
    return lines


def grown(lines: np.ndarray, rows: int) -> np.ndarray:
    """`lines` with room for `rows` ids (the new rows absent; a row's other
    fields are written when its line is inserted, but its GEN, which counts
    insertions)."""
    bigger = np.empty((rows, N_FIELDS))
    n = len(lines)
    bigger[:n] = lines
    bigger[n:, PREV] = ABSENT
    bigger[n:, GEN] = 0.0
    return bigger


@njit(cache=True, inline="always")
def _ramped(S):
    return len(S) > N_SCALARS and S[RAMP_START] < S[CAPACITY]


@njit(cache=True, inline="always")
def _tree_add(S, j, v):
    m = len(S) - N_SCALARS
    while j <= m:
        S[N_SCALARS + j - 1] += v
        j += j & -j


@njit(cache=True, inline="always")
def _tree_prefix(S, j):
    total = 0.0
    while j > 0:
        total += S[N_SCALARS + j - 1]
        j -= j & -j
    return total


@njit(cache=True)
def _restamp(L, S):
    """Stamps 1 .. n for the n lines in LRU order, the tree rebuilt (the
    stamps given had reached its length)."""
    S[N_SCALARS:] = 0.0
    k = 0
    i = int(L[0, NEXT])
    while i != 0:
        k += 1
        L[i, STAMP] = k
        _tree_add(S, k, L[i, SIZE])
        i = int(L[i, NEXT])
    S[NEXT_STAMP] = k + 1
    if k + 1 > len(S) - N_SCALARS:      # more lines than stamps: a plain LRU until S grows
        S[RAMP_START] = S[CAPACITY]
        S[OUT_OF_STAMPS] = 1.0


@njit(cache=True, inline="always")
def _unlink(L, S, i):
    p, n = int(L[i, PREV]), int(L[i, NEXT])
    L[p, NEXT] = n
    L[n, PREV] = p
    if _ramped(S):
        _tree_add(S, int(L[i, STAMP]), -L[i, SIZE])


@njit(cache=True, inline="always")
def _append(L, S, i):
    last = int(L[0, PREV])
    L[i, PREV] = last
    L[i, NEXT] = 0.0
    L[last, NEXT] = i
    L[0, PREV] = i
    if _ramped(S):
        if S[NEXT_STAMP] > len(S) - N_SCALARS:
            L[i, PREV] = ABSENT         # (not yet stamped: out of the walk)
            L[last, NEXT] = 0.0
            L[0, PREV] = last
            _restamp(L, S)
            last = int(L[0, PREV])
            L[i, PREV] = last
            L[last, NEXT] = i
            L[0, PREV] = i
            if not _ramped(S):
                return
        stamp = S[NEXT_STAMP]
        S[NEXT_STAMP] = stamp + 1.0
        L[i, STAMP] = stamp
        _tree_add(S, int(stamp), L[i, SIZE])


@njit(cache=True, inline="always")
def _ramp_gone(L, S, i):
    """The fraction of landed line i that a load finds gone: what its LRU
    depth gives past RAMP_START (module docstring), at most 1."""
    depth = S[USED] - _tree_prefix(S, int(L[i, STAMP])) + L[i, SIZE]
    start = S[RAMP_START]
    if depth <= start:
        return 0.0
    f = (depth - start) / (S[CAPACITY] - start)
    return 1.0 if f >= 1.0 else f


@njit(cache=True, inline="always")
def _part(f, nbytes):
    """Whole bytes of nbytes that a fraction f of them is."""
    return nbytes if f >= 1.0 else np.floor(f * nbytes)


@njit(cache=True, inline="always")
def _lose_dirty(L, S, i, f):
    """The dirty bytes of line i that left with the fraction f of it, now
    clean again; returns them."""
    d = L[i, DIRTY]
    if d == 0.0:
        return 0.0
    dirty = L[i, SIZE] if d < 0.0 else d
    lost = _part(f, dirty)
    L[i, DIRTY] = ALL_DIRTY if lost == 0.0 and d < 0.0 else dirty - lost
    if L[i, LAUNCH] != S[CURRENT_LAUNCH]:
        S[STALE_DIRTY] -= lost
    return lost


@njit(cache=True, inline="always")
def _dirty_bytes(L, i):
    d = L[i, DIRTY]
    return L[i, SIZE] if d < 0.0 else d


@njit(cache=True, inline="always")
def _place(L, S, i, nbytes, ready, flight, dirty, launch):
    """Line i (absent) holds a tile again, as the most recent line (its
    generation counts the insertions: landed() knows a line refilled since)."""
    L[i, SIZE] = nbytes
    L[i, READY] = ready
    L[i, FLIGHT] = flight
    L[i, DIRTY] = dirty
    L[i, LAUNCH] = launch
    L[i, GEN] += 1.0
    _append(L, S, i)


@njit(cache=True, inline="always")
def _evict_oldest(L, S):
    """The least recently used line leaves; returns its row."""
    o = int(L[0, NEXT])
    _unlink(L, S, o)
    L[o, PREV] = ABSENT
    return o


@njit(cache=True, inline="always")
def _insert(L, S, E, i, nbytes, ready, flight, dirty, k):
    """Line i (absent, nbytes <= capacity) becomes the most recent; the
    least recent leave while the lines exceed the capacity. Each dirty line
    that leaves is recorded in E from row k on as (its dirty bytes, 1.0 if
    an earlier launch stored it); returns k plus the number recorded."""
    _place(L, S, i, nbytes, ready, flight, dirty, S[CURRENT_LAUNCH])
    used = S[USED] + nbytes
    while used > S[CAPACITY]:
        o = _evict_oldest(L, S)
        used -= L[o, SIZE]
        if L[o, DIRTY] != 0.0:
            nb = _dirty_bytes(L, o)
            stale = L[o, LAUNCH] != S[CURRENT_LAUNCH]
            if stale:
                S[STALE_DIRTY] -= nb
            E[k, 0] = nb
            E[k, 1] = 1.0 if stale else 0.0
            k += 1
    S[USED] = used
    return k


@compiled("float64(float64[:, ::1], float64[::1], float64[:, ::1], int64, int64)")
def load(L, S, E, i, nbytes):
    """A load of tile i. A hit makes its line the most recent, and returns
    IN_FLIGHT while the tile is on its way from HBM, or the time it has been
    in L2 since. A miss inserts the line, on its way (landed() ends that),
    and returns KEPT less the dirty lines that left for it (in E), or
    NOT_KEPT for a tile larger than L2. A landed line past the retention
    ramp's start returns PARTIAL when part of it is gone (module docstring):
    S[PART_MISSED] those bytes, S[PART_EVICTED] the dirty lines recorded in
    E (its own share written back, if any)."""
    if L[i, PREV] >= 0.0:
        f = 0.0
        if L[i, FLIGHT] == 0.0 and _ramped(S):
            f = _ramp_gone(L, S, i)
        _unlink(L, S, i)
        _append(L, S, i)
        missed = _part(f, float(nbytes))
        if missed > 0.0:
            stale = L[i, LAUNCH] != S[CURRENT_LAUNCH]
            lost = _lose_dirty(L, S, i, f)
            S[PART_MISSED] = missed
            S[PART_EVICTED] = 0.0
            if lost > 0.0:
                E[0, 0] = lost
                E[0, 1] = 1.0 if stale else 0.0
                S[PART_EVICTED] = 1.0
            return PARTIAL
        if L[i, FLIGHT] != 0.0:
            return IN_FLIGHT
        return L[i, READY]
    if nbytes > S[CAPACITY]:
        return NOT_KEPT
    return KEPT - _insert(L, S, E, i, nbytes, 0.0, 1.0, 0.0, 0)


@compiled("int64(float64[:, ::1], float64[::1], float64[:, ::1], int64, int64, float64, int64)")
def insert_phantom(L, S, E, i, nbytes, now, dirty):
    """An anonymous entry (memory.py's pollute), in L2 from `now`, its
    `dirty` bytes written back when it leaves; returns the evictions
    recorded in E."""
    k = _insert(L, S, E, i, nbytes, now, 0.0, 0.0, 0)
    L[i, DIRTY] = dirty
    return k


@compiled("int64(float64[:, ::1], float64[::1], float64[:, ::1], int64, int64, boolean, float64)")
def store(L, S, E, i, nbytes, scratch, now):
    """A stored tile becomes dirty in L2 and this launch's (scratch stays
    clean). Returns the number of evicted dirty lines recorded in E, or
    TOO_LARGE for a tile not in L2 and larger than it."""
    if L[i, PREV] >= 0.0:
        _unlink(L, S, i)
        _append(L, S, i)
        if scratch:
            return 0
        if L[i, DIRTY] != 0.0 and L[i, LAUNCH] != S[CURRENT_LAUNCH]:
            S[STALE_DIRTY] -= _dirty_bytes(L, i)
        L[i, DIRTY] = ALL_DIRTY
        L[i, LAUNCH] = S[CURRENT_LAUNCH]
        return 0
    if nbytes > S[CAPACITY]:
        return TOO_LARGE
    return _insert(L, S, E, i, nbytes, now, 0.0, 0.0 if scratch else ALL_DIRTY, 0)


@compiled("void(float64[:, ::1], int64, float64, float64)")
def landed(L, i, gen, t):
    """The load that inserted line i (at generation gen) has its bytes in L2
    at t, unless the line has left since."""
    if L[i, PREV] >= 0.0 and L[i, GEN] == gen:
        L[i, READY] = t
        L[i, FLIGHT] = 0.0


@compiled("float64(float64[:, ::1], float64[::1], int64[::1], float64[::1], int8[::1], int64, int64, float64)")
def touch(L, S, ids, nbytes, codes, lo, hi, now):
    """Accesses lo .. hi - 1 of an encoded sequence pass through L2 untimed
    (MemorySystem.touch): hits refresh their lines, missed loads and stores
    insert theirs (in L2 since `now`), stores dirty them; a load past the
    retention ramp's start misses part of its line as load() would. Their sums go to
    S[T_*]: bytes requested, hit, missed, written back (and whether an
    earlier launch's dirty line left)."""
    capacity, launch = S[CAPACITY], S[CURRENT_LAUNCH]
    ramped = _ramped(S)
    requested = hits = missed = written = 0.0
    stale_evicted = False
    for a in range(lo, hi):
        i, nb, code = ids[a], nbytes[a], codes[a]
        present = L[i, PREV] >= 0.0
        if code != LOAD:
            if present:
                _unlink(L, S, i)
                _append(L, S, i)
                if code == SCRATCH_STORE:
                    continue
                if L[i, DIRTY] != 0.0 and L[i, LAUNCH] != launch:
                    stale_dirty_bytes = _dirty_bytes(L, i)
                    S[STALE_DIRTY] -= stale_dirty_bytes
                L[i, DIRTY] = ALL_DIRTY
                L[i, LAUNCH] = launch
                continue
            dirty = code != SCRATCH_STORE
            if nb > capacity:
                if dirty:
                    written += nb
                continue
        else:
            requested += nb
            if present:
                f = 0.0
                if ramped and L[i, FLIGHT] == 0.0:
                    f = _ramp_gone(L, S, i)
                _unlink(L, S, i)
                _append(L, S, i)
                part = _part(f, nb)
                if part > 0.0:
                    lost = _lose_dirty(L, S, i, f)
                    if lost > 0.0 and L[i, LAUNCH] != launch:
                        stale_evicted = True
                    written += lost
                    missed += part
                hits += nb - part
                continue
            missed += nb
            if nb > capacity:
                continue
            dirty = False
        _place(L, S, i, nb, now, 0.0, ALL_DIRTY if dirty else 0.0, launch)
        S[USED] += nb
        while S[USED] > capacity:
            o = _evict_oldest(L, S)
            S[USED] -= L[o, SIZE]
            if L[o, DIRTY] != 0.0:
                db = _dirty_bytes(L, o)
                if L[o, LAUNCH] != launch:
                    S[STALE_DIRTY] -= db
                    stale_evicted = True
                written += db
    S[T_REQUESTED], S[T_HITS], S[T_MISSED], S[T_WRITTEN] = requested, hits, missed, written
    S[T_STALE_EVICTED] = 1.0 if stale_evicted else 0.0
    return missed


@compiled("void(float64[:, ::1], float64[::1])")
def restamp(L, S):
    """_restamp for with_more_stamps."""
    _restamp(L, S)


@compiled("float64(float64[:, ::1])")
def dirty_total(L):
    """The dirty bytes of every line in L2."""
    total = 0.0
    i = int(L[0, NEXT])
    while i != 0:
        if L[i, DIRTY] != 0.0:
            total += _dirty_bytes(L, i)
        i = int(L[i, NEXT])
    return total


@compiled("void(float64[:, ::1])")
def clean_all(L):
    """Every line clean (the end of a run: its dirty bytes have gone to HBM)."""
    i = int(L[0, NEXT])
    while i != 0:
        L[i, DIRTY] = 0.0
        i = int(L[i, NEXT])
