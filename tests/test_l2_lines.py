"""L2's lines in arrays (gpusim/engine/l2_lines.py) against the LRU they
replace, written out here as a plain OrderedDict: the same hits, misses,
evictions, dirty write-backs and order, over random mixes of real loads and
stores, fast-forwarded accesses, anonymous entries and launches. The
compiled loops index arrays unchecked, so a wrong link would not raise: it
would quietly change what L2 holds."""
import math
from collections import OrderedDict

import pytest

import simpy
from hypothesis import given, settings, strategies as st

from algorithms.ops import Load, Store, Tile
from gpusim.engine import l2_lines
from gpusim.engine.memory import MemorySystem
from gpusim.engine.servers import Server
from gpusim.profile import load_profile

H100 = load_profile("h100")
SIZES = (1, 3, 4, 7)        # bytes a tile, in units of UNIT
UNIT = 4096


class ReferenceL2:
    """What L2 keeps, as an OrderedDict tile -> [bytes, dirty, launch] (dirty:
    False, True, or a phantom's dirty byte count), oldest first."""

    def __init__(self, capacity: int, scratch=()):
        self.capacity, self.scratch = capacity, set(scratch)
        self.lines: OrderedDict = OrderedDict()
        self.launch = 0
        self.stale_dirty = self.hit = self.missed = self.requested = self.written = 0

    def _insert(self, tile, nbytes, dirty):
        self.lines[tile] = [nbytes, dirty, self.launch]
        used = sum(line[0] for line in self.lines.values())
        while used > self.capacity:
            _, (size, old_dirty, launch) = self.lines.popitem(last=False)
            used -= size
            if old_dirty:
                dirty_bytes = size if old_dirty is True else old_dirty
                if launch != self.launch:
                    self.stale_dirty -= dirty_bytes
                self.written += dirty_bytes

    def load(self, tile, nbytes):
        self.requested += nbytes
        if tile in self.lines:
            self.lines.move_to_end(tile)
            self.hit += nbytes
            return
        self.missed += nbytes
        if nbytes <= self.capacity:
            self._insert(tile, nbytes, False)

    def sm_load(self, tile, nbytes):
        """A load MemorySystem.load makes (its miss stays on its way: see RampReference)."""
        self.load(tile, nbytes)

    def store(self, tile, nbytes):
        scratch = tile[0] in self.scratch
        line = self.lines.get(tile)
        if line is not None:
            self.lines.move_to_end(tile)
            if scratch:
                return
            if line[1] and line[2] != self.launch:
                self.stale_dirty -= line[0] if line[1] is True else line[1]
            line[1], line[2] = True, self.launch
        elif nbytes > self.capacity:
            if not scratch:
                self.written += nbytes
        else:
            self._insert(tile, nbytes, not scratch)

    def phantom(self, key, nbytes, dirty):
        self._insert(key, nbytes, False)
        if dirty:
            self.lines[key][1] = dirty

    def begin_launch(self):
        self.launch += 1
        self.stale_dirty = sum(size if d is True else d for size, d, _ in self.lines.values() if d)

    def flush(self):
        left = sum(size if d is True else d for size, d, _ in self.lines.values() if d)
        for line in self.lines.values():
            line[1] = False
        self.written += left
        return left


def held(memory: MemorySystem) -> list:
    """The tiles L2 holds, oldest first, with their bytes, dirty state and launch."""
    tile_of = {i: tile for tile, i in memory._ids.items()}
    lines, out = memory._lines, []
    i = int(lines[0, l2_lines.NEXT])
    while i != 0:
        dirty = lines[i, l2_lines.DIRTY]
        out.append((tile_of[i], int(lines[i, l2_lines.SIZE]),
                    True if dirty == l2_lines.ALL_DIRTY else int(dirty), int(lines[i, l2_lines.LAUNCH])))
        i = int(lines[i, l2_lines.NEXT])
    return out


def reference_held(ref: ReferenceL2) -> list:
    return [(tile, size, dirty if dirty else 0, launch) for tile, (size, dirty, launch) in ref.lines.items()]


tiles = st.builds(lambda t, j, s: (Tile(t, 0, 0, j), SIZES[s] * UNIT),
                  st.sampled_from(["K", "V", "spill"]), st.integers(0, 12), st.integers(0, len(SIZES) - 1))
actions = st.one_of(
    st.tuples(st.just("load"), tiles),
    st.tuples(st.just("store"), tiles),
    st.tuples(st.just("touch"), st.lists(st.tuples(tiles, st.booleans()), max_size=30)),
    st.tuples(st.just("phantom"), st.integers(1, 12), st.integers(0, 5)),
    st.tuples(st.just("launch"),),
)


def replay(memory: MemorySystem, ref: ReferenceL2, script, capacity: int) -> None:
    """Runs `script` (actions) on the lines and on the reference side by
    side and asks, after each action and at the flush, that they hold and
    count the same."""
    port = Server("port")
    phantoms = 0
    for action in script:
        kind = action[0]
        if kind == "load":
            (tile, nbytes) = action[1]
            memory.load(0.0, port, tile, nbytes, lambda t: None)
            ref.sm_load(tile, nbytes)
        elif kind == "store":
            (tile, nbytes) = action[1]
            memory.store(0.0, port, tile, nbytes, lambda t: None)
            ref.store(tile, nbytes)
        elif kind == "touch":
            ops = [(Store if is_store else Load)(tile, nbytes) for (tile, nbytes), is_store in action[1]]
            missed = memory.touch(0.0, 1.0, ops)
            before = ref.missed
            for op in ops:
                (ref.store if op.__class__ is Store else ref.load)(op.tile, op.nbytes)
            assert missed == ref.missed - before
        elif kind == "phantom":
            total, dirty_units = action[1] * UNIT, action[2] * UNIT
            if total <= capacity:
                phantoms += 1
                memory._pollute(0.0, total, dirty_units)
                ref.phantom(("phantom", phantoms), total, dirty_units)
        else:
            memory.begin_launch()
            ref.begin_launch()
        assert held(memory) == reference_held(ref)
        assert memory.used == sum(size for size, _, _ in ref.lines.values())
        assert memory.stale_dirty == ref.stale_dirty
        assert (memory.requested, memory.hit_bytes, memory.hbm_read) == (ref.requested, ref.hit, ref.missed)
        assert memory.hbm_write == ref.written
    assert memory.flush() == ref.flush()
    assert memory.hbm_write == ref.written
    assert all(dirty == 0 for _, _, dirty, _ in held(memory))


@settings(max_examples=150, deadline=None)
@given(capacity_units=st.integers(0, 40), script=st.lists(actions, max_size=60))
def test_lines_follow_the_lru_they_replace(capacity_units, script):
    capacity = capacity_units * UNIT
    memory = MemorySystem(H100, simpy.Environment())
    memory.capacity = capacity
    memory._scalars[l2_lines.CAPACITY] = capacity
    memory.scratch = {"spill"}
    replay(memory, ReferenceL2(capacity, {"spill"}), script, capacity)


def test_the_lines_grow_past_their_first_rows():
    """Tiles beyond the arrays' first rows get rows of their own, and what
    the early rows held survives the growth."""
    env = simpy.Environment()
    memory = MemorySystem(H100, env)
    port = Server("port")
    first = len(memory._lines)
    for j in range(3 * first):
        memory.load(0.0, port, Tile("K", 0, 0, j), 4096, lambda t: None)
    assert len(memory._lines) > 3 * first
    assert [tile.row for tile, *_ in held(memory)] == list(range(3 * first))
    memory.load(0.0, port, Tile("K", 0, 0, 0), 4096, lambda t: None)
    assert memory.hit_bytes == 4096


def test_a_hit_on_a_tile_on_its_way_waits_for_it():
    """A load that finds its tile still coming from HBM gets its bytes after
    that tile lands; once landed, a later load gets them after L2's latency."""
    env = simpy.Environment()
    memory = MemorySystem(H100, env)
    port = Server("port")
    arrived = {}
    memory.load(0.0, port, Tile("K", 0, 0, 0), 16384, lambda t: arrived.setdefault("first", t))
    assert memory.load(0.0, port, Tile("K", 0, 0, 0), 16384, lambda t: arrived.setdefault("second", t)) == 0
    env.run()
    assert arrived["second"] >= arrived["first"] > memory.dram_latency
    env.run(until=arrived["first"] + 1e-6)
    later = env.now
    memory.load(later, port, Tile("K", 0, 0, 0), 16384, lambda t: arrived.setdefault("third", t))
    env.run()
    assert memory.l2_latency <= arrived["third"] - later < memory.dram_latency


def test_a_growing_sequence_is_encoded_as_far_as_asked():
    """encode_sequence keeps a sequence's encoding and extends it when the
    sequence (a head's K/V stream, which longer causal loops extend) has
    grown and more of it is asked for: always the encoding of its prefix."""
    memory = MemorySystem(H100, simpy.Environment())
    stream = [Load(Tile("K", 0, 0, j), 4096 * (1 + j % 3)) for j in range(10)]
    ids, nbytes, codes = memory.encode_sequence(stream, 3)
    assert len(ids) >= 3 and list(nbytes[:3]) == [4096, 8192, 12288]
    stream += [Store(Tile("spill", 0, 0, 0), 64), *(Load(Tile("V", 0, 0, j), 4096) for j in range(200))]
    memory.scratch = {"spill"}
    ids, nbytes, codes = memory.encode_sequence(stream, 150)
    fresh = MemorySystem(H100, simpy.Environment())
    fresh.scratch = {"spill"}
    fresh._ids = dict(memory._ids)     # the same numbering
    want = fresh.encode(stream[:len(ids)])
    assert len(ids) >= 150
    assert (ids == want[0]).all() and (nbytes == want[1]).all() and (codes == want[2]).all()
    assert codes[10] == l2_lines.SCRATCH_STORE


class RampReference(ReferenceL2):
    """ReferenceL2 with the retention ramp (l2_lines.py): a load that finds
    its landed line at LRU depth d (its bytes and every newer line's) past
    `start` misses the fraction f = (d - start) / (capacity - start) of its
    bytes, floor(f x bytes) (all of them from f = 1 on), and the same share
    of its dirty bytes goes back to HBM; the line stays, the most recent."""

    def __init__(self, capacity, start, scratch=()):
        super().__init__(capacity, scratch)
        self.start = start
        self.flight: dict = {}      # tile -> still on its way from HBM (no ramp for it)
        self.landing = False        # inserting memory.load's misses, which stay on their way

    def _insert(self, tile, nbytes, dirty):
        self.flight[tile] = self.landing
        super()._insert(tile, nbytes, dirty)

    def sm_load(self, tile, nbytes):
        """memory.load's misses stay on their way here (the test never runs
        the clock); touch()'s, stores' and phantoms' lines have landed."""
        self.landing = True
        self.load(tile, nbytes)
        self.landing = False

    def load(self, tile, nbytes):
        line = self.lines.get(tile)
        if line is None or self.flight[tile]:
            return super().load(tile, nbytes)
        keys = list(self.lines)
        depth = sum(self.lines[k][0] for k in keys[keys.index(tile):])
        f = 0.0 if depth <= self.start else min(1.0, (depth - self.start) / (self.capacity - self.start))
        missed = nbytes if f >= 1 else math.floor(f * nbytes)
        self.lines.move_to_end(tile)
        self.requested += nbytes
        self.hit += nbytes - missed
        self.missed += missed
        size, dirty, launch = line
        if missed and dirty:
            dirty_bytes = size if dirty is True else dirty
            lost = dirty_bytes if f >= 1 else math.floor(f * dirty_bytes)
            line[1] = True if (lost == 0 and dirty is True) else dirty_bytes - lost
            if launch != self.launch:
                self.stale_dirty -= lost
            self.written += lost


@settings(max_examples=150, deadline=None)
@given(capacity_units=st.integers(1, 40), start_frac=st.floats(0.0, 0.95), script=st.lists(actions, max_size=60))
def test_lines_with_the_retention_ramp_follow_their_reference(capacity_units, start_frac, script):
    """The ramp's depths (a Fenwick tree over stamps, renumbered every few
    dozen insertions here) and the bytes they miss, against the OrderedDict
    walked."""
    capacity = capacity_units * UNIT
    start = int(start_frac * capacity)
    memory = MemorySystem(H100, simpy.Environment())
    memory.capacity = capacity
    memory._scalars = l2_lines.new_scalars(capacity, start, stamps=64)
    memory.scratch = {"spill"}
    replay(memory, RampReference(capacity, start, {"spill"}), script, capacity)


@pytest.mark.parametrize("stamps", [1 << 16, 4])
def test_round_trips_miss_along_the_ramp(stamps):
    """Pieces read and written back, pass after pass (as
    experiments/l2_keep_ncu.py's round trips): a working set within the
    ramp's start misses nothing after its first pass, one beyond the
    capacity everything, and one between them the ramp's fraction. With 4
    stamps the first pass runs out of them and the tree grows
    (MemorySystem._more_stamps), the ramp back on from the second."""
    capacity, start = 400 * UNIT, 200 * UNIT
    for units, want in ((150, 0.0), (300, 0.5), (350, 0.75), (480, 1.0)):
        memory = MemorySystem(H100, simpy.Environment())
        memory.capacity = capacity
        memory._scalars = l2_lines.new_scalars(capacity, start, stamps=stamps)
        passes = 40
        for p in range(passes):
            ops = []
            for j in range(units):
                ops += [Load(Tile("O", 0, 0, j), UNIT), Store(Tile("O", 0, 0, j), UNIT)]
            memory.touch(0.0, 1.0, ops)
            if p == 0:
                first = memory.hbm_read
        missed = (memory.hbm_read - first) / ((passes - 1) * units * UNIT)
        assert abs(missed - want) < 0.06, (units, missed, want)
        if units < 400:
            assert len(memory._scalars) - l2_lines.N_SCALARS > units >= stamps or stamps > units
