"""L2 and HBM: where a tile's bytes come from and how long they take.

L2 is an LRU over named tiles (Tile records of the schedule) with a byte
capacity: a load of a tile that is present, or already on its way, is a hit;
otherwise the bytes come from HBM and the tile is inserted, evicting the
least recently used. Stores write back: a stored tile becomes dirty in L2 and
reaches HBM when evicted, or at the end of the run. With capacity 0 every load
misses and every store goes straight to HBM.

L2 and HBM bandwidth are SharedServers (processor sharing among the requests
in flight from all SMs); each SM also has its own port to L2, served in
order. Latencies add after the bandwidth wait.
"""
from __future__ import annotations

from collections import OrderedDict

from algorithms.ops import Store

from .servers import Server, SharedServer

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


def _dirty_bytes(size: int, dirty) -> int:
    """A line's dirty field is True for a stored tile (all of it dirty) or,
    for a phantom, the count of its bytes that are dirty."""
    return size if dirty is True else dirty


class MemorySystem:
    def __init__(self, gpu, env):
        clock = gpu.clock_hz
        self.capacity = gpu.l2.capacity_bytes
        self.l2 = SharedServer("l2_bandwidth", env)
        self.hbm = SharedServer("hbm_bandwidth", env)
        self.l2_s_per_byte = 1.0 / (gpu.l2.bandwidth_gbps * 1e9)
        self.hbm_s_per_byte = 1.0 / (gpu.hbm.sustained_bandwidth_gbps * 1e9)
        self.port_s_per_byte = 1.0 / (gpu.l2.sm_port_bytes_per_clk * clock)
        # an SM writes to L2 at half the rate it reads (calibrate.py l2_store: 31 against 59-103 B/clk)
        self.store_s_per_byte = 1.0 / (gpu.l2.sm_store_bytes_per_clk * clock)
        self.l2_latency = gpu.l2.hit_latency_cycles / clock
        self.dram_latency = gpu.hbm.latency_cycles / clock
        # tile -> [nbytes, ready, dirty, launch]; ready is the time the tile
        # is in L2, or while it is on its way from HBM, the list of its waiters
        self.lines: OrderedDict = OrderedDict()
        self.used = 0
        self.requested = 0
        self.hit_bytes = 0
        self.hbm_read = 0
        self.hbm_write = 0
        self._phantoms = 0
        # While set, write-backs are fast-forwarded work spread over this
        # window (background load) rather than requests queued now.
        self._spread_until: float | None = None
        self._spread_bytes = 0      # ... and the write-backs gathered so far
        self.launch = 0          # lines remember the launch that brought them
        self.stale_dirty = 0     # dirty bytes stored by earlier launches, still in L2
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

    def load(self, now: float, port: Server, tile, nbytes: int, then) -> bool:
        """Bytes of `tile` to an SM whose L2 port is `port`; then(t) learns
        when they arrive (t >= the time it is called). Returns whether L2 had
        the tile. A miss is paced by HBM and takes its share of L2 as it
        passes, unwaited; a hit on a tile still on its way waits for it."""
        self.requested += nbytes
        t_port = port.serve(now, nbytes * self.port_s_per_byte)
        lines = self.lines
        line = lines.get(tile)
        if line is not None:
            lines.move_to_end(tile)
            self.hit_bytes += nbytes
            ready = line[1]
            latency = self.l2_latency
            floor = t_port + latency
            if ready.__class__ is list:         # in flight: its waiters
                arrival = _Arrival(2, floor, latency, then)
                ready.append(arrival.ready)
            else:
                arrival = _Arrival(1, ready if ready > floor else floor, latency, then)
            self.l2.request(now, nbytes * self.l2_s_per_byte, arrival.served, port)
            return True
        self.hbm_read += nbytes
        self.l2.request(now, nbytes * self.l2_s_per_byte, None, port)
        waiters: list = []
        if nbytes > self.capacity:
            line = None     # (_insert keeps nothing: a clean tile larger than L2)
        else:
            # self._insert(now, tile, nbytes, waiters, False), inlined: the
            # new line is the newest, so it outlives the evictions it causes
            line = lines[tile] = [nbytes, waiters, False, self.launch]
            used = self.used + nbytes
            if used > self.capacity:
                self._evict(now, used)
            else:
                self.used = used
        latency = self.dram_latency

        def landed(t: float) -> None:
            done = (t if t > t_port else t_port) + latency
            if line is not None and line[1] is waiters:
                line[1] = done
            for waiter in waiters:
                waiter(done)
            then(done)

        self.hbm.request(now, nbytes * self.hbm_s_per_byte, landed, port)
        return False

    def touch(self, now: float, until: float, accesses) -> int:
        """Fast-forwarded loads and stores (Load and Store ops) in program
        order pass through L2 untimed (their time is extrapolated):
        hits refresh their tiles, misses insert them, stores dirty them, as
        real ones would -- so the CTAs beside them find the tiles they share
        (FA2's K/V) instead of an anonymous pollution. Write-backs they cause
        are spread over [now, until]. Returns the bytes that missed.

        The same bookkeeping as load/_write_tile/_insert/_write_back, inlined
        into one loop: FA1 replays millions of accesses here (5.8 of a 6.9 s
        N16k prediction went to the calls)."""
        lines, capacity, launch = self.lines, self.capacity, self.launch
        get, refresh, evict_oldest = lines.get, lines.move_to_end, lines.popitem
        scratch = self.scratch
        used = self.used
        requested = hits = missed = written = 0
        stale_dirty = self.stale_dirty
        stale_evicted = False
        for op in accesses:
            tile, nbytes = op.tile, op.nbytes
            line = get(tile)
            if op.__class__ is Store:
                if line is not None:
                    refresh(tile)
                    if tile[0] in scratch:
                        continue
                    dirty = line[2]
                    if dirty and line[3] != launch:
                        stale_dirty -= line[0] if dirty is True else dirty
                    line[2], line[3] = True, launch
                    continue
                dirty = tile[0] not in scratch
                if nbytes > capacity:
                    if dirty:
                        written += nbytes
                    continue
            else:
                requested += nbytes
                if line is not None:
                    refresh(tile)
                    hits += nbytes
                    continue
                missed += nbytes
                if nbytes > capacity:
                    continue
                dirty = False
            # insert the tile, evicting the least recently used
            lines[tile] = [nbytes, now, dirty, launch]
            used += nbytes
            while used > capacity:
                _, (size, _, old_dirty, old_launch) = evict_oldest(last=False)
                used -= size
                if old_dirty:
                    dirty_bytes = size if old_dirty is True else old_dirty
                    if old_launch != launch:
                        stale_dirty -= dirty_bytes
                        stale_evicted = True
                    written += dirty_bytes
        self.used = used
        self.requested += requested
        self.hit_bytes += hits
        self.hbm_read += missed
        self.stale_dirty = stale_dirty
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
        line = self.lines.get(tile)
        if tile[0] in self.scratch:
            if line is None:
                self._insert(now, tile, nbytes, now, False)
            else:
                self.lines.move_to_end(tile)
            return
        if line is None:
            self._insert(now, tile, nbytes, now, True)
            return
        self.lines.move_to_end(tile)
        if line[2] and line[3] != self.launch:
            self.stale_dirty -= _dirty_bytes(line[0], line[2])
        line[2], line[3] = True, self.launch

    def _insert(self, now, tile, nbytes, ready, dirty) -> None:
        if nbytes > self.capacity:
            if dirty:
                self._write_back(now, nbytes)
            return
        self.lines[tile] = [nbytes, ready, dirty, self.launch]
        self._evict(now, self.used + nbytes)

    def _evict(self, now, used) -> None:
        """Evict the least recently used lines while `used` bytes (the lines'
        and a line just inserted) exceed the capacity."""
        lines, capacity = self.lines, self.capacity
        while used > capacity:
            _, (size, _, dirty, launch) = lines.popitem(last=False)
            used -= size
            if dirty:
                stale = launch != self.launch
                if stale:
                    self.stale_dirty -= _dirty_bytes(size, dirty)
                self._write_back(now, _dirty_bytes(size, dirty), stale)
        self.used = used

    def begin_launch(self) -> None:
        self.launch += 1
        self.stale_dirty = sum(_dirty_bytes(size, dirty)
                               for size, _, dirty, _ in self.lines.values() if dirty)

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
            self._insert(now, ("phantom", self._phantoms), total, now, False)
            line = self.lines.get(("phantom", self._phantoms))
            if line is not None and written_bytes >= 1:
                line[2] = int(written_bytes)  # dirty bytes, written back on eviction

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
        left = 0
        for size, _, dirty, _ in self.lines.values():
            if dirty:
                left += _dirty_bytes(size, dirty)
        for line in self.lines.values():
            line[2] = False
        self.hbm_write += left
        return left
