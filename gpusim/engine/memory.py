"""L2 and HBM: where a tile's bytes come from and how long they take.

L2 is an LRU over named tiles (Tile records of the schedule) with a byte
capacity: a load of a tile that is present, or already on its way, is a hit;
otherwise the bytes come from HBM and the tile is inserted, evicting the
least recently used. Stores write back: a stored tile becomes dirty in L2 and
reaches HBM when evicted, or at the end of the run. With capacity 0 every load
misses and every store goes straight to HBM.

Bandwidths are FIFO Servers shared by all SMs; each SM also has its own port
to L2. Latencies add after the bandwidth wait.
"""
from __future__ import annotations

from collections import OrderedDict

from .servers import Server


class MemorySystem:
    def __init__(self, gpu):
        clock = gpu.clock_hz
        self.capacity = gpu.l2.capacity_bytes
        self.l2 = Server("l2_bandwidth")
        self.hbm = Server("hbm_bandwidth")
        self.l2_s_per_byte = 1.0 / (gpu.l2.bandwidth_gbps * 1e9)
        self.hbm_s_per_byte = 1.0 / (gpu.hbm.sustained_bandwidth_gbps * 1e9)
        self.port_s_per_byte = 1.0 / (gpu.l2.sm_port_bytes_per_clk * clock)
        self.l2_latency = gpu.l2.hit_latency_cycles / clock
        self.dram_latency = gpu.hbm.latency_cycles / clock
        self.lines: OrderedDict = OrderedDict()  # tile -> [nbytes, ready_time, dirty]
        self.used = 0
        self.requested = 0
        self.hit_bytes = 0
        self.hbm_read = 0
        self.hbm_write = 0
        self._phantoms = 0

    def load(self, now: float, port: Server, tile, nbytes: int) -> tuple[float, bool]:
        """Bytes of `tile` to an SM whose L2 port is `port`: (arrival time, hit)."""
        self.requested += nbytes
        t_port = port.serve(now, nbytes * self.port_s_per_byte)
        t_l2 = self.l2.serve(now, nbytes * self.l2_s_per_byte)
        line = self.lines.get(tile)
        if line is not None:
            self.lines.move_to_end(tile)
            self.hit_bytes += nbytes
            done = max(t_port, t_l2) + self.l2_latency
            return (line[1] if line[1] > done else done), True
        self.hbm_read += nbytes
        t_hbm = self.hbm.serve(now, nbytes * self.hbm_s_per_byte)
        done = max(t_port, t_l2, t_hbm) + self.dram_latency
        self._insert(now, tile, nbytes, done, False)
        return done, False

    def store(self, now: float, port: Server, tile, nbytes: int) -> float:
        """A tile written back to global memory through L2; returns when the SM is done with it."""
        t_port = port.serve(now, nbytes * self.port_s_per_byte)
        t_l2 = self.l2.serve(now, nbytes * self.l2_s_per_byte)
        line = self.lines.get(tile)
        if line is not None:
            self.lines.move_to_end(tile)
            line[2] = True
        else:
            self._insert(now, tile, nbytes, now, True)
        return t_port if t_port > t_l2 else t_l2

    def _insert(self, now, tile, nbytes, ready, dirty) -> None:
        if nbytes > self.capacity:
            if dirty:
                self._write_back(now, nbytes)
            return
        self.lines[tile] = [nbytes, ready, dirty]
        self.used += nbytes
        while self.used > self.capacity:
            _, (size, _, dirty) = self.lines.popitem(last=False)
            self.used -= size
            if dirty:  # True for a stored tile; a phantom holds its dirty byte count
                self._write_back(now, size if dirty is True else dirty)

    def pollute(self, now: float, read_bytes: float, written_bytes: float) -> None:
        """Fast-forwarded work: the tiles it would have fetched (read_bytes)
        and stored (written_bytes) occupy L2 as one anonymous entry that no
        one can hit, evicting what they would have evicted; the written part
        reaches HBM when the entry is evicted or flushed."""
        total = int(read_bytes + written_bytes)
        if total <= 0:
            return
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

    def _write_back(self, now: float, nbytes: int) -> None:
        self.hbm_write += nbytes
        self.hbm.serve(now, nbytes * self.hbm_s_per_byte)

    def flush(self) -> None:
        """End of the run: dirty lines reach HBM (counted, not timed)."""
        for size, _, dirty in self.lines.values():
            if dirty:
                self.hbm_write += size if dirty is True else dirty
        for line in self.lines.values():
            line[2] = False
