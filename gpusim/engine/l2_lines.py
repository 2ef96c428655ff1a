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
"""
from __future__ import annotations

import numpy as np
from numba import njit

# Columns of L
SIZE, READY, DIRTY, LAUNCH, PREV, NEXT, GEN, FLIGHT = range(8)
N_FIELDS = 8
# DIRTY: 0 clean, ALL_DIRTY for a stored tile, else (a phantom, memory.py's
# anonymous entries) the count of its bytes that are dirty
ALL_DIRTY = -1.0
ABSENT = -1.0       # PREV of a row that holds no line

# Slots of S
USED, CAPACITY, CURRENT_LAUNCH, STALE_DIRTY = range(4)
# ... and touch()'s sums, written by it
T_REQUESTED, T_HITS, T_MISSED, T_WRITTEN, T_STALE_EVICTED = range(4, 9)
N_SCALARS = 9

# Codes of a replayed access (MemorySystem.encode)
LOAD, STORE, SCRATCH_STORE = 0, 1, 2

# Results of load() other than a time: a hit on a tile still on its way; a
# miss not kept (a tile larger than L2); a miss kept is KEPT - (the number of
# dirty lines its insertion evicted, recorded in E)
IN_FLIGHT, NOT_KEPT, KEPT = -1.0, -2.0, -3.0
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
def _unlink(L, i):
    p, n = int(L[i, PREV]), int(L[i, NEXT])
    L[p, NEXT] = n
    L[n, PREV] = p


@njit(cache=True, inline="always")
def _append(L, i):
    last = int(L[0, PREV])
    L[i, PREV] = last
    L[i, NEXT] = 0.0
    L[last, NEXT] = i
    L[0, PREV] = i


@njit(cache=True, inline="always")
def _dirty_bytes(L, i):
    d = L[i, DIRTY]
    return L[i, SIZE] if d < 0.0 else d


@njit(cache=True, inline="always")
def _place(L, i, nbytes, ready, flight, dirty, launch):
    """Line i (absent) holds a tile again, as the most recent line (its
    generation counts the insertions: landed() knows a line refilled since)."""
    L[i, SIZE] = nbytes
    L[i, READY] = ready
    L[i, FLIGHT] = flight
    L[i, DIRTY] = dirty
    L[i, LAUNCH] = launch
    L[i, GEN] += 1.0
    _append(L, i)


@njit(cache=True, inline="always")
def _evict_oldest(L):
    """The least recently used line leaves; returns its row."""
    o = int(L[0, NEXT])
    _unlink(L, o)
    L[o, PREV] = ABSENT
    return o


@njit(cache=True, inline="always")
def _insert(L, S, E, i, nbytes, ready, flight, dirty):
    """Line i (absent, nbytes <= capacity) becomes the most recent; the
    least recent leave while the lines exceed the capacity. Each dirty line
    that leaves is recorded in E as (its dirty bytes, 1.0 if an earlier
    launch stored it); returns the number recorded."""
    _place(L, i, nbytes, ready, flight, dirty, S[CURRENT_LAUNCH])
    used = S[USED] + nbytes
    k = 0
    while used > S[CAPACITY]:
        o = _evict_oldest(L)
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
    NOT_KEPT for a tile larger than L2."""
    if L[i, PREV] >= 0.0:
        _unlink(L, i)
        _append(L, i)
        if L[i, FLIGHT] != 0.0:
            return IN_FLIGHT
        return L[i, READY]
    if nbytes > S[CAPACITY]:
        return NOT_KEPT
    return KEPT - _insert(L, S, E, i, nbytes, 0.0, 1.0, 0.0)


@compiled("int64(float64[:, ::1], float64[::1], float64[:, ::1], int64, int64, float64, int64)")
def insert_phantom(L, S, E, i, nbytes, now, dirty):
    """An anonymous entry (memory.py's pollute), in L2 from `now`, its
    `dirty` bytes written back when it leaves; returns the evictions
    recorded in E."""
    k = _insert(L, S, E, i, nbytes, now, 0.0, 0.0)
    L[i, DIRTY] = dirty
    return k


@compiled("int64(float64[:, ::1], float64[::1], float64[:, ::1], int64, int64, boolean, float64)")
def store(L, S, E, i, nbytes, scratch, now):
    """A stored tile becomes dirty in L2 and this launch's (scratch stays
    clean). Returns the number of evicted dirty lines recorded in E, or
    TOO_LARGE for a tile not in L2 and larger than it."""
    if L[i, PREV] >= 0.0:
        _unlink(L, i)
        _append(L, i)
        if scratch:
            return 0
        if L[i, DIRTY] != 0.0 and L[i, LAUNCH] != S[CURRENT_LAUNCH]:
            S[STALE_DIRTY] -= _dirty_bytes(L, i)
        L[i, DIRTY] = ALL_DIRTY
        L[i, LAUNCH] = S[CURRENT_LAUNCH]
        return 0
    if nbytes > S[CAPACITY]:
        return TOO_LARGE
    return _insert(L, S, E, i, nbytes, now, 0.0, 0.0 if scratch else ALL_DIRTY)


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
    insert theirs (in L2 since `now`), stores dirty them. Their sums go to
    S[T_*]: bytes requested, hit, missed, written back (and whether an
    earlier launch's dirty line left)."""
    capacity, launch = S[CAPACITY], S[CURRENT_LAUNCH]
    used, stale_dirty = S[USED], S[STALE_DIRTY]
    requested = hits = missed = written = 0.0
    stale_evicted = False
    for a in range(lo, hi):
        i, nb, code = ids[a], nbytes[a], codes[a]
        present = L[i, PREV] >= 0.0
        if code != LOAD:
            if present:
                _unlink(L, i)
                _append(L, i)
                if code == SCRATCH_STORE:
                    continue
                if L[i, DIRTY] != 0.0 and L[i, LAUNCH] != launch:
                    stale_dirty -= _dirty_bytes(L, i)
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
                _unlink(L, i)
                _append(L, i)
                hits += nb
                continue
            missed += nb
            if nb > capacity:
                continue
            dirty = False
        _place(L, i, nb, now, 0.0, ALL_DIRTY if dirty else 0.0, launch)
        used += nb
        while used > capacity:
            o = _evict_oldest(L)
            used -= L[o, SIZE]
            if L[o, DIRTY] != 0.0:
                db = _dirty_bytes(L, o)
                if L[o, LAUNCH] != launch:
                    stale_dirty -= db
                    stale_evicted = True
                written += db
    S[USED], S[STALE_DIRTY] = used, stale_dirty
    S[T_REQUESTED], S[T_HITS], S[T_MISSED], S[T_WRITTEN] = requested, hits, missed, written
    S[T_STALE_EVICTED] = 1.0 if stale_evicted else 0.0
    return missed


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
