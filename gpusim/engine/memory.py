"""L2 and HBM: where a tile's bytes come from and how long they take.

L2 is an LRU over named tiles (Tile records of the schedule) with a byte
capacity: a load of a tile that is present, or already on its way, is a hit;
otherwise the bytes come from HBM and the tile is inserted, evicting the
least recently used. Stores write back: a stored tile becomes dirty in L2 and
reaches HBM when evicted, or at the end of the run. With capacity 0 every load
misses and every store goes straight to HBM.

L2 and HBM bandwidth are SharedServers (processor sharing among the requests
in flight from all SMs); each SM also has its own port to L2, served in
order. Latencies add after the bandwidth wait; an SM's own round trip to L2
(l2.sm_latency_offsets_cycles: 275-308 cycles across the SMs of an H100;
[] in the shipped profiles) adds to both L2's and HBM's.
"""
from __future__ import annotations

from operator import itemgetter

import numpy as np

from algorithms.ops import Store

from . import l2_lines as lines_
from .l2_lines import (CURRENT_LAUNCH, GEN, IN_FLIGHT, KEPT, NOT_KEPT, OUT_OF_STAMPS, PART_EVICTED, PART_MISSED,
                       PARTIAL, STALE_DIRTY, USED)
from .servers import Server, SharedServer

# a Load's or Store's tile and bytes (named tuples: fields 0 and 1)
_TILE, _NBYTES = itemgetter(0), itemgetter(1)

# L2 counts as full above this share of its capacity, and as rid of an earlier
# launch's dirty tiles below this share of it.
FULL = 0.95
STALE_DIRTY_TOLERANCE = 0.02


class _Arrival:
    """A load's bytes: in after all of its `parts` have come (L2's share of
    bandwidth, and for a hit on a tile still on its way, that tile), and
    no earlier than `floor`; then(t) is told once."""

    __slots__ = ("parts", "at", "latency", "then")

    def __init__(self, parts: int, floor: float, latency: float, then):
        self.parts, self.at, self.latency, self.then = parts, floor, latency, then

    def served(self, t: float) -> None:
        """L2 has served the request at t: the bytes follow after its latency."""
        self.ready(t + self.latency)

    def ready(self, t: float) -> None:
        if t > self.at:
            self.at = t
        self.parts -= 1
        if self.parts == 0:
            self.then(self.at)


class MemorySystem:
    def __init__(self, gpu, env, slices: int = 1):
        """slices: this is one of that many equal parts of the GPU's L2 and
        HBM (gpusim/symmetry.py)."""
        clock = gpu.clock_hz
        self.capacity = gpu.l2.capacity_bytes // slices
        # past this depth a load may miss (l2_lines.py: the retention ramp)
        self.keep_all = gpu.l2.keep_all_bytes // slices
        self.l2 = SharedServer("l2_bandwidth", env)
        self.hbm = SharedServer("hbm_bandwidth", env)
        self.l2_s_per_byte = slices / (gpu.l2.bandwidth_gbps * 1e9)
        self.hbm_s_per_byte = slices / (gpu.hbm.sustained_bandwidth_gbps * 1e9)
        self.port_s_per_byte = 1.0 / (gpu.l2.sm_port_bytes_per_clk * clock)
        # an SM writes to L2 at half the rate it reads (calibrate.py l2_store: 31 against 59-103 B/clk)
        self.store_s_per_byte = 1.0 / (gpu.l2.sm_store_bytes_per_clk * clock)
        self.l2_latency = gpu.l2.hit_latency_cycles / clock
        self.dram_latency = gpu.hbm.latency_cycles / clock
        # L2's lines (l2_lines.py): a row of _lines per tile id, ids from
        # _ids (tile -> id, the phantoms' keys too; id 0 is the ring's
        # sentinel), the scalars (bytes held, capacity, launch, stale dirty
        # bytes) in _scalars; _evicted receives the dirty lines an insertion
        # evicts. A tile on its way from HBM has its waiters in _waiting.
        self._ids: dict = {}
        self._lines = lines_.new_lines(1024)
        self._evicted = np.empty((1024, 2))
        self._scalars = lines_.new_scalars(self.capacity, self.keep_all)
        self._waiting: dict[int, list] = {}
        # encoded access sequences (encode_sequence), by id(sequence) (the entry holds the sequence)
        self._encoded: dict[int, tuple] = {}
        self.requested = 0
        self.hit_bytes = 0
        self.hbm_read = 0
        self.hbm_write = 0
        self._phantoms = 0
        # While set, write-backs are fast-forwarded work spread over this
        # window (background load) rather than requests queued now.
        self._spread_until: float | None = None
        self._spread_bytes = 0      # ... and the write-backs gathered so far
        # ... and the write-backs of those that have left: requests still in
        # flight, and the end of the windows fast-forwarded ones are spread over
        self.stale_in_flight = 0
        self.stale_spread_until = 0.0
        self.env = env
        self.footprint = 0       # bytes of every tensor the schedule touches
        # Tensors of scratch (thread stacks holding register spills): every
        # iteration, and the next CTA on the same slot, overwrite them in
        # place, so their lines are kept clean rather than written back.
        self.scratch: set[str] = set()

    # The scalars L2's lines keep (l2_lines.py), as attributes
    @property
    def used(self) -> int:
        """Bytes of the lines in L2."""
        return int(self._scalars[USED])

    @property
    def launch(self) -> int:
        """The launch running now (lines remember the launch that brought them)."""
        return int(self._scalars[CURRENT_LAUNCH])

    @property
    def stale_dirty(self) -> int:
        """Dirty bytes stored by earlier launches, still in L2."""
        return int(self._scalars[STALE_DIRTY])

    def _id(self, tile) -> int:
        """The row of `tile` in L2's lines (a new one for a tile never seen)."""
        i = self._ids.get(tile)
        if i is None:
            i = self._ids[tile] = len(self._ids) + 1
            if i >= len(self._lines):
                self._grow(4 * i)
        return i

    def _grow(self, rows: int) -> None:
        self._lines = lines_.grown(self._lines, rows)
        self._evicted = np.empty((rows, 2))

    def _more_stamps(self) -> None:
        """More lines in L2 than the retention ramp's tree had stamps for: a
        longer one (l2_lines.with_more_stamps)."""
        self._scalars = lines_.with_more_stamps(self._lines, self._scalars)

    def _write_backs(self, now: float, count: int) -> None:
        """The `count` dirty lines an insertion just evicted go to HBM."""
        evicted = self._evicted
        for k in range(count):
            self._write_back(now, int(evicted[k, 0]), evicted[k, 1] != 0.0)

    def load(self, now: float, port: Server, tile, nbytes: int, then) -> int:
        """Bytes of `tile` to an SM whose L2 port is `port`; then(t) learns
        when they arrive (t >= the time it is called). Returns the bytes L2
        did not have (0: a hit). A miss is paced by HBM and takes its share
        of L2 as it passes, unwaited; a hit on a tile still on its way waits
        for it; a tile partly gone (l2_lines.py's retention ramp) waits for
        HBM to bring that part."""
        self.requested += nbytes
        t_port = port.serve(now, nbytes * self.port_s_per_byte)
        i = self._ids.get(tile)
        if i is None:
            i = self._id(tile)
        ready = lines_.load(self._lines, self._scalars, self._evicted, i, nbytes)
        if self._scalars[OUT_OF_STAMPS]:
            self._more_stamps()
        if ready == PARTIAL:
            return self._load_part(now, port, t_port, nbytes, then)
        if ready >= 0.0 or ready == IN_FLIGHT:
            self.hit_bytes += nbytes
            latency = self.l2_latency + port.latency_extra
            floor = t_port + latency
            if ready == IN_FLIGHT:
                arrival = _Arrival(2, floor, latency, then)
                self._waiting[i].append(arrival.ready)
            else:
                arrival = _Arrival(1, ready if ready > floor else floor, latency, then)
            self.l2.request(now, nbytes * self.l2_s_per_byte, arrival.served, port)
            return 0
        self.hbm_read += nbytes
        self.l2.request(now, nbytes * self.l2_s_per_byte, None, port)
        waiters: list = []
        gen = None      # (a clean tile larger than L2 is not kept)
        if ready != NOT_KEPT:
            # the new line is the newest, so it outlives the evictions it causes
            gen = self._lines[i, GEN]
            self._waiting[i] = waiters
            if ready != KEPT:
                self._write_backs(now, int(KEPT - ready))
        latency = self.dram_latency + port.latency_extra

        def landed(t: float) -> None:
            done = (t if t > t_port else t_port) + latency
            if gen is not None:
                lines_.landed(self._lines, i, gen, done)
                if self._waiting.get(i) is waiters:
                    del self._waiting[i]
            for waiter in waiters:
                waiter(done)
            then(done)

        self.hbm.request(now, nbytes * self.hbm_s_per_byte, landed, port)
        return nbytes

    def _load_part(self, now: float, port: Server, t_port: float, nbytes: int, then) -> int:
        """load() of a tile whose line is in L2 but part of whose bytes are
        gone (l2_lines.PARTIAL): those come from HBM and the load waits for
        them; the share of its dirty bytes that went with them was written
        back (recorded in the lines' evictions)."""
        scalars = self._scalars
        missed = int(scalars[PART_MISSED])
        if scalars[PART_EVICTED]:
            self._write_backs(now, 1)
        self.hit_bytes += nbytes - missed
        self.hbm_read += missed
        self.l2.request(now, nbytes * self.l2_s_per_byte, None, port)
        latency = self.dram_latency + port.latency_extra

        def landed(t: float) -> None:
            then((t if t > t_port else t_port) + latency)

        self.hbm.request(now, missed * self.hbm_s_per_byte, landed, port)
        return missed

    def encode(self, accesses) -> tuple:
        """Loads and Stores as touch() takes them: (tile ids, bytes, codes).
        (Field by field through C-level maps: a ghost batch's pieces pass
        hundreds of thousands of loads, at 1.4 µs each op by op.)"""
        ops = accesses if accesses.__class__ is list or accesses.__class__ is tuple else list(accesses)
        tiles = list(map(_TILE, ops))
        ids = list(map(self._ids.get, tiles))
        if None in ids:     # tiles never seen: new rows, numbered in order of first sight
            known = self._ids
            fresh = dict.fromkeys(tile for tile, i in zip(tiles, ids) if i is None)
            first = len(known) + 1
            known.update(zip(fresh, range(first, first + len(fresh))))
            if len(known) >= len(self._lines):
                self._grow(4 * len(known))
            ids = list(map(known.get, tiles))
        codes = np.zeros(len(ops), dtype=np.int8)
        if Store in set(map(type, ops)):
            scratch = self.scratch
            for k, op in enumerate(ops):
                if op.__class__ is Store:
                    codes[k] = lines_.SCRATCH_STORE if op.tile[0] in scratch else lines_.STORE
        return (np.array(ids, dtype=np.int64), np.fromiter(map(_NBYTES, ops), dtype=np.float64, count=len(ops)),
                codes)

    def encode_sequence(self, seq, upto: int) -> tuple:
        """encode(seq), kept and extended as asked: at least its first `upto`
        accesses. `seq` must outlive the run and change only by growing at
        its end (a loop's shared access sequence, a head's K/V stream, a
        CTA's own lists of tiles). Encoded ahead (twice what was) so that a
        loop's skips, which move forward, extend it a few times only; only
        what is replayed is encoded (a causal 16k prediction's K/V loops,
        encoded whole, cost a tenth of it)."""
        known = self._encoded.get(id(seq))
        done = 0 if known is None else len(known[1])
        if upto > done:
            upto = min(len(seq), max(upto, 2 * done, 64))
            more = self.encode(seq[done:upto])
            known = self._encoded[id(seq)] = (seq, *more) if known is None else \
                (seq, *(np.concatenate((old, new)) for old, new in zip(known[1:], more)))
        return known[1:]

    def touch(self, now: float, until: float, accesses) -> int:
        """Fast-forwarded loads and stores (Load and Store ops) in program
        order pass through L2 untimed (their time is extrapolated):
        hits refresh their tiles, misses insert them, stores dirty them, as
        real ones would -- so the CTAs beside them find the tiles they share
        (FA2's K/V) instead of an anonymous pollution. Write-backs they cause
        are spread over [now, until]. Returns the bytes that missed."""
        ops = accesses if accesses.__class__ is list or accesses.__class__ is tuple else list(accesses)
        if not ops:     # (a loop that reads SMEM only: FA3's consumers)
            return 0
        ids, nbytes, codes = self.encode(ops)
        return self._touch(now, until, ((ids, nbytes, codes, 0, len(ids)),))

    def touch_spans(self, now: float, until: float, spans) -> int:
        """touch() of the accesses seq[lo:hi] for each (seq, lo, hi) of
        `spans` in turn, their sequences encoded once (encode_sequence)."""
        return self._touch(now, until, [(*self.encode_sequence(seq, hi), lo, hi) for seq, lo, hi in spans if hi > lo])

    def touch_loads(self, now: float, until: float, tiles: dict) -> int:
        """touch() of loads given as {tile id: bytes} (ids from encode), in the dict's order."""
        n = len(tiles)
        ids = np.fromiter(tiles.keys(), dtype=np.int64, count=n)
        nbytes = np.fromiter(tiles.values(), dtype=np.float64, count=n)
        return self._touch(now, until, ((ids, nbytes, np.zeros(n, dtype=np.int8), 0, n),))

    def _touch(self, now: float, until: float, encoded) -> int:
        lines, scalars = self._lines, self._scalars
        missed = written = 0
        stale_evicted = False
        for ids, nbytes, codes, lo, hi in encoded:
            lines_.touch(lines, scalars, ids, nbytes, codes, lo, hi, now)
            if scalars[OUT_OF_STAMPS]:
                self._more_stamps()
                scalars = self._scalars
            self.requested += int(scalars[lines_.T_REQUESTED])
            self.hit_bytes += int(scalars[lines_.T_HITS])
            missed += int(scalars[lines_.T_MISSED])
            written += int(scalars[lines_.T_WRITTEN])
            stale_evicted = stale_evicted or scalars[lines_.T_STALE_EVICTED] != 0.0
        self.hbm_read += missed
        if written:
            self.hbm_write += written
            self.hbm.add_background(now, until, written * self.hbm_s_per_byte)
        if stale_evicted and until > self.stale_spread_until:
            self.stale_spread_until = until
        return missed

    def store(self, now: float, port: Server, tile, nbytes: int, then, issued: float = 0.0) -> None:
        """A tile written back to global memory through L2; then(t) learns
        when the SM is done with it: no earlier than its warps can have
        issued it (`issued`), nor than the SM's write path has passed it."""
        t_port = port.serve(now, nbytes * self.store_s_per_byte)
        if issued > t_port:
            t_port = issued
        self._write_tile(now, tile, nbytes)
        self.l2.request(now, nbytes * self.l2_s_per_byte,
                        lambda t: then(t if t > t_port else t_port), port)

    def _write_tile(self, now: float, tile, nbytes: int) -> None:
        """A stored tile becomes dirty in L2 (and this launch's); scratch stays clean."""
        scratch = tile[0] in self.scratch
        i = self._ids.get(tile)
        if i is None:
            i = self._id(tile)      # (before the arrays are passed: it may grow them)
        evicted = lines_.store(self._lines, self._scalars, self._evicted, i, nbytes, scratch, now)
        if self._scalars[OUT_OF_STAMPS]:
            self._more_stamps()
        if evicted == lines_.TOO_LARGE:
            if not scratch:
                self._write_back(now, nbytes)
        elif evicted:
            self._write_backs(now, evicted)

    def begin_launch(self) -> None:
        self._scalars[CURRENT_LAUNCH] += 1
        self._scalars[STALE_DIRTY] = lines_.dirty_total(self._lines)

    def settled(self) -> bool:
        """Has L2 reached the content it keeps for the rest of a launch? Not
        while it is still filling (stores are absorbed, nothing is written
        back yet: standard's QK GEMM runs twice as fast for its first four
        waves) nor while dirty tiles of the previous launch are being
        written back (its softmax, 1.4x slower for 17 waves), nor until those
        write-backs have reached HBM: a fast-forwarded launch leaves its dirty
        bytes in a few large anonymous entries, and one evicted is one long
        request on HBM (standard's row softmax after a ghosted QKᵀ turned
        steady while those drained, at 3.6 us a CTA against the full
        simulation's 2.15: +33% on B16 H32 N1024 D64). Durations timed before
        then do not stand for later CTAs."""
        if self.stale_dirty > STALE_DIRTY_TOLERANCE * self.capacity:
            return False
        if self.stale_in_flight or self.env._now < self.stale_spread_until:
            return False
        return self.used >= FULL * self.capacity or self.footprint <= FULL * self.capacity

    def pollute(self, now: float, until: float, read_bytes: float, written_bytes: float) -> None:
        """Fast-forwarded work over [now, until]: the tiles it would have
        fetched (read_bytes) and stored (written_bytes) occupy L2 as one
        anonymous entry that no one can hit, evicting what they would have
        evicted; the written part reaches HBM when the entry is evicted or
        flushed. The write-backs it causes now are spread over the window:
        queued at one instant they would stall every real request behind
        them (a batch of ghost CTAs can evict tens of MB at once)."""
        total = int(read_bytes + written_bytes)
        if total <= 0:
            return
        self._spread_until = until
        try:
            self._pollute(now, total, written_bytes)
        finally:
            self._end_spread(now)

    def _pollute(self, now: float, total: int, written_bytes: float) -> None:
        self._phantoms += 1
        if total > self.capacity:
            # more than the whole L2 streamed through: everything older leaves,
            # and so do the written bytes that did not fit
            kept = self.capacity
            overflow_written = written_bytes * (1 - kept / total)
            if overflow_written:
                self._write_back(now, int(overflow_written))
            written_bytes -= overflow_written
            total = kept
        if total > 0:
            i = self._id(("phantom", self._phantoms))
            # its written bytes dirty, written back when it leaves
            evicted = lines_.insert_phantom(self._lines, self._scalars, self._evicted, i, total, now,
                                            int(written_bytes) if written_bytes >= 1 else 0)
            if self._scalars[OUT_OF_STAMPS]:
                self._more_stamps()
            if evicted:
                self._write_backs(now, evicted)

    def _write_back(self, now: float, nbytes: int, stale: bool = False) -> None:
        """nbytes of dirty lines to HBM; `stale`: stored by an earlier launch
        (settled() waits for them)."""
        self.hbm_write += nbytes
        if self._spread_until is None:
            callback = None
            if stale:
                self.stale_in_flight += 1
                callback = self._stale_written
            self.hbm.request(now, nbytes * self.hbm_s_per_byte, callback)
        else:
            self._spread_bytes += nbytes
            if stale and self._spread_until > self.stale_spread_until:
                self.stale_spread_until = self._spread_until

    def _end_spread(self, now: float) -> None:
        """The write-backs of one fast-forwarded window reach HBM as one
        background load over it (one per evicted line cost a heap update
        each: 3.1 million of them, two-thirds of FA1's N16k prediction)."""
        if self._spread_bytes:
            self.hbm.add_background(now, self._spread_until, self._spread_bytes * self.hbm_s_per_byte)
            self._spread_bytes = 0
        self._spread_until = None

    def _stale_written(self, _t: float) -> None:
        self.stale_in_flight -= 1

    def flush(self) -> int:
        """End of the run: dirty lines reach HBM (counted, not timed).
        Returns their bytes: written after the run, where a profiler's count
        of the run's DRAM writes does not see them."""
        left = int(lines_.dirty_total(self._lines))
        lines_.clean_all(self._lines)
        self.hbm_write += left
        return left
