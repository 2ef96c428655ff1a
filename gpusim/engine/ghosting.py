"""CTA ghosting: once a cost class's CTAs take the same time, later ones are
fast-forwarded whole.

The second of the engine's two fast-path levels (the first, skipping.py,
skips a loop's repeating iterations inside a CTA). Mixed into core.Engine,
whose state it uses: Engine._launch starts a process per slot (_slot) that
takes the next CTA in launch order and either simulates it or, with its
class steady, ghosts a batch of them (_ghost).

Once a whole wave of the CTAs of a cost class
(Launch.cost_key) that started under steady contention -- after the first
wave, with L2 settled (full, and rid of an earlier launch's dirty tiles)
-- have ended (with none started before them still running) and take the
same time, later CTAs of that class hold their slot for that time with
their mean work as background load, in batches over long runs (at most a slot's share of the
remaining CTAs, in number and in time); a batch ends when its SM's
units have served it, the launch when L2 and HBM have served all of it.
The launch's last wave is simulated: its CTAs run as the slots empty.
Neither is done for a CTA whose loop carries tiles near L2's capacity
(skipping.ROUND_TRIP_BAND).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from bisect import bisect_left, insort
from itertools import chain
from math import fsum

from algorithms.ops import Load, Loop
from algorithms.schedule import Launch

from .counters import HBM, MISS, N_COUNTERS, REQ, SCRATCH, STORE
from .skipping import REPLAY_CHUNKS, STEADY_TOLERANCE, _accesses

if TYPE_CHECKING:    # (annotations only: core imports this module)
    from .core import _SM


GHOST_SAMPLES = 3           # real CTAs of a class before later ones are ghosted
# The launch's last waves, simulated and never ghosted (Engine._slot). With
# one, fa2 64x32 w8 s3 causal B4 H32 N2048 D64 (three CTAs an SM) once
# started three of its heaviest Q blocks together on one SM as the ghost
# batches of its slots ended at once: 60-70 us each against 35-49 in the
# full simulation, and the launch +3.0% over it (+0.3% with two; both with
# Mma.issued_with, session 27). It costs one more wave of real CTAs a launch.
TAIL_WAVES = 2
# ... and, steady or not, a class stops being simulated after this many waves
# of it (a class's wave: its share of the launch's slots, at least
# GHOST_SAMPLES): later CTAs take the mean of its latest wave.
GHOST_WAVES = 2
# The latest wave's two halves agree this well: contention has settled.
CONVERGED = 0.02
# A class whose real CTAs found more than this share of their bytes in L2
# shares tiles: its ghosts' loads are replayed (Engine._replay_ghost_loads).
SHARED_HITS = 0.01


class CtaGhosting:
    """Engine methods that dispatch a launch's CTAs to a slot and ghost steady ones.

    From core.Engine they use its environment and memory (env, mem), its
    totals, tracer and event count, the running launch's slots and class
    cache (_slots, _class_cache, set by _launch), _run_cta for the CTAs it
    simulates, and the fast-forwarded work's load (_background, _served_by);
    from LoopSkipping, _disturb."""

    def _slot(self, launch: Launch, sm: _SM, state: dict):
        grid = launch.grid
        samples: dict = state["samples"]
        # The launch's last wave is simulated, never ghosted: a class's
        # duration was timed under the launch's steady contention, and as the
        # slots empty at its end the last CTAs run faster than that. fa2
        # 64x32 w4 s2 causal B1 H32 N16k: its last CTAs (the heaviest causal
        # Q blocks) were ghosted at their class's 440 us while, simulated,
        # they take 313 us, and the launch came out 3087 us against the full
        # simulation's 2961 (+4.3%); 2958 us (-0.1%) with its last wave
        # simulated. The wave before it too (TAIL_WAVES): ghost batches are
        # sized to end together, so slots freed at once took the last wave
        # all at once and packed heavy CTAs onto one SM. (A batch of ghosts
        # stops short of them.)
        last_wave = grid - TAIL_WAVES * state["slots"]
        while state["next"] < grid:
            index = state["next"]
            key = launch.cost_key(index)
            seen = samples.get(key)
            # A class turns steady only with L2 settled; once steady it stays so
            # (L2 dipping below full as ghost batches' anonymous entries leave
            # kept standard's softmax simulating a tenth of its 131k CTAs).
            if (index < last_wave and self.fast and seen is not None and not self._class_cache[key][2]
                    and (seen.steady or (self.mem.settled() and seen.ready()))):
                # Take this slot's share of what is left, as long as every
                # CTA in it belongs to a steady class (classes interleave:
                # edge tiles, causal Q blocks).
                share = max(1, (grid - index) // state["slots"])
                batch: dict = {}    # class -> [stats, count]
                end = index
                slots, cost_key = state["slots"], launch.cost_key
                if state["one_class"]:      # (the loop below, without a cost_key per CTA)
                    end = min(last_wave, index + share)
                    batch[key] = [seen, end - index]
                left, class_s = state["left"], state["class_s"]
                spent, budget = 0.0, 0.0
                while end < last_wave and end - index < share:
                    k = key if end == index else cost_key(end)
                    entry = batch.get(k)
                    if entry is None:   # (a class in the batch is steady: ready() latches)
                        stats = samples.get(k)
                        if stats is None or self._class_cache[k][2] or not stats.ready():
                            break
                        entry = batch[k] = [stats, 0]
                        if k not in class_s:
                            class_s[k] = stats.recent_duration()
                            state["ahead_s"] += left[k] * class_s[k]
                    # ... and no more than a slot's share of the time the
                    # steady classes' undispatched CTAs take: unequal classes
                    # (causal Q blocks) batched by count alone left one slot
                    # with eight of the heaviest CTAs, 517 µs, while the others
                    # ran out of work (fa2 64x32 causal N2048: +11% over the
                    # full simulation)
                    d = class_s[k]
                    if end == index:
                        budget = max(d, state["ahead_s"] / slots)
                    elif spent + d > budget:
                        break
                    spent += d
                    left[k] -= 1
                    state["ahead_s"] -= d
                    entry[1] += 1
                    end += 1
                state["next"] = end
                state["ghosted"] += end - index
                self._dispatched(end)
                yield from self._ghost(sm, batch.values(), launch, range(index, end), state)
                continue
            state["next"] = index + 1
            state["simulated"] += 1
            self._dispatched(index + 1)
            if not state["one_class"]:
                state["left"][key] -= 1
                if key in state["class_s"]:
                    state["ahead_s"] -= state["class_s"][key]
            # Only CTAs that started once others had finished, with L2
            # settled, ran under the launch's steady contention; the first
            # wave starts all at once.
            warm = state["warm"] and self.mem.settled()
            if seen is None:
                seen = samples[key] = _ClassStats(state["wave"][key])
            start = self.env._now
            if warm:
                seen.running.append(start)
            duration, totals = yield from self._run_cta(launch, index, sm, key)
            state["warm"] = True
            seen.add(start, duration, totals, warm)

    def _ghost(self, sm: _SM, batch, launch: Launch, ctas: range, state: dict):
        """CTAs `ctas` of steady classes, (class stats, count) in `batch`:
        their time from the latest real ones of their class, their work from
        all of them -- but for their HBM reads, which come from passing their
        own tiles through L2 (_replay_ghosts): who fetched a tile first and
        who found it differs from CTA to CTA."""
        env = self.env
        name = launch.name
        duration = 0.0
        work = [0.0] * N_COUNTERS
        n = 0
        batch = list(batch)
        for stats, count in batch:
            n += count
            duration += stats.recent_duration() * count
            for s, w in enumerate(stats.mean_work(count)):
                work[s] += w
        start = env._now
        self._disturb(sm)
        replayed = any(stats.shares() for stats, _ in batch)
        if replayed:    # (their HBM reads are the replay's, spread over the window)
            work[MISS] = work[HBM] = 0.0
        self._background(sm, start, start + duration, work)
        if self.warp_dispatch > 0.0:    # (their warps' launch, as _run_cta's)
            sm.dispatch.add_background(start, start + duration, n * self.warp_dispatch * self._num_warps)
        if replayed:
            # On the GPU the batch's CTAs start as their turns in launch order
            # come: slots take the next CTA at `slots` CTAs a CTA's duration,
            # after the ghosts other slots took before this batch.
            begins = max(state["ghost_clock"], start)
            state["ghost_clock"] = begins + duration / self._slots
            self._replay_ghost_loads(launch, ctas, start, duration, work[STORE],
                                     max(stats.recent_duration() for stats, _ in batch), begins)
        else:
            self.mem.pollute(start, start + duration, work[MISS], work[STORE])
        for s in range(N_COUNTERS):
            self.totals[s] += work[s]
        if self.tracer is not None:
            self.tracer.slice(sm.index, "ctas", f"{name} x{n} (fast-forwarded)", start,
                              start + duration)
        self.events += 1
        yield env.timeout(duration)
        # Its work arrived as a fluid over the batch; where one of its SM's
        # units could not keep up, the batch ends when that unit has served
        # it (FIFO, as a real request would wait). L2's and HBM's backlog is
        # waited for at the launch's end (_launch): waited for here, every
        # batch on a saturated HBM also waited for the backlog of all the
        # others and the launch came out 10-18% slow (calibrate.py cta_cycle
        # copies at 4 CTAs per SM); not waited for at all, ghosts beyond
        # HBM's rate left their backlog to the next launch (standard's QK
        # GEMM 46% fast, its softmax 62% slow, B4 H16 N2048 D64 causal).
        served = self._served_by(sm, work, shared=False)
        if served > env._now:
            self.events += 1
            yield env.timeout(served - env._now)
        self._disturb(sm)

    def _replay_ghost_loads(self, launch: Launch, ctas: range, start: float, duration: float,
                            stored: float, longest: float, begins: float) -> None:
        """The loads of ghost CTAs whose classes share tiles pass through L2
        as skipped loops' do (MemorySystem.touch): each CTA's loads in
        program order (its roles side by side) cut into REPLAY_CHUNKS
        pieces, piece c holding the c-th part of every CTA's. As one
        anonymous entry of their classes' mean misses they hid the K/V tiles
        they fetched from the real CTAs of their heads, which then fetched
        them again, and their class means grew with it: causal fa2 B4 H16
        N4096 D128 read 253 MB from HBM against the full simulation's 201
        (+26%). Their `stored` bytes enter as anonymous entries, one a
        piece: no one loads a tile another CTA of the launch stored, and as
        named tiles they moved standard's QK GEMM 9% off its full
        simulation; all at the window's start, they evicted the K/V tiles
        the pieces then missed (fa2 64x64 N8192 D128: +83% HBM reads).
        (Each CTA cut into the pieces instead, a batch of a thousand short
        CTAs read all its rows in one piece, a burst eight times their
        rate.)"""
        # Each piece: tile -> its load's bytes, in the order the tiles first
        # come up (a tile the batch's CTAs share is touched once a piece: the
        # first fetches it, the others would only refresh it; fa2 N16k: a K/V
        # tile comes up 2-10 times a piece). Tiles by their L2 ids
        # (MemorySystem.encode), a shared sequence's encoded once: hundreds
        # of thousands of loads pass here in a causal 16k prediction.
        pieces: list[dict] = [{} for _ in range(REPLAY_CHUNKS)]
        # The CTAs of a head stream one shared K/V sequence (Loop.accesses).
        # Where a CTA's loads lie out as an earlier one's -- as many, the same
        # shared sequences at the same places -- its pieces hold the same
        # slices of them, whose tiles are in already: only its own loads (its
        # Q tile) can add to its pieces, in their order, so only they are
        # visited (a 64x32 fa2 CTA at N = 16k has 2048 shared loads, 1 own).
        #
        # Each CTA runs its own duration (`longest`, the batch's longest
        # class), side by side with its neighbours in launch order: they
        # start as their turns come, one every `slots`-th of a CTA's duration
        # (`begins`: the first's turn), so the k-th CTA's c-th part falls in
        # piece c + shift, shift = its start in pieces.
        width = longest / REPLAY_CHUNKS
        spacing = duration / len(ctas) / self._slots
        laid_out: set = set()
        bounds = [0] * (REPLAY_CHUNKS + 1)      # part c: loads bounds[c] .. bounds[c + 1] - 1
        for k, index in enumerate(ctas):
            shift = int(k * spacing / width)
            while len(pieces) < shift + REPLAY_CHUNKS:
                pieces.append({})
            for role in launch.program(index).roles:
                segments, n = self._ghost_load_segments(role.items)
                layout = (n, shift, tuple((id(seq), at) for seq, at, shared in segments if shared))
                for c in range(REPLAY_CHUNKS + 1):
                    bounds[c] = n * c // REPLAY_CHUNKS
                if layout in laid_out:
                    c = 0
                    for seq, at, shared in segments:
                        if shared:
                            continue
                        ids, nbytes, _ = self.mem.encode(seq)
                        for j, (i, nb) in enumerate(zip(ids.tolist(), nbytes.tolist()), at):
                            while bounds[c + 1] <= j:
                                c += 1
                            pieces[shift + c][i] = nb
                    continue
                laid_out.add(layout)
                for seq, at, shared in segments:
                    ids, nbytes, _ = self.mem.encode_sequence(seq, len(seq)) if shared else self.mem.encode(seq)
                    for c in range(REPLAY_CHUNKS):
                        lo, hi = max(bounds[c], at) - at, min(bounds[c + 1], at + len(seq)) - at
                        if hi > lo:     # (piece[i] = nb for each, in C)
                            pieces[shift + c].update(zip(ids[lo:hi].tolist(), nbytes[lo:hi].tolist()))
        # The pieces pass through L2 when the batch's CTAs would run on the
        # GPU. Paced one after the other, as the batch holds its slot, a
        # causal head's CTAs (loops of different lengths) met its K/V tiles
        # up to a batch apart, and the whole machine's traffic between
        # evicted them: fa2 64x32 w8 causal B8 H32 N2048 D64 read 208 MB
        # from HBM against its full simulation's 201 (every tile once),
        # 201.4 side by side. Side by side from the batch's start, every
        # slot's batch at once (taken as one class turned steady) met the
        # heads of many waves in one piece: fa2 64x128 w4 s2 B1 H16 N16k
        # D128, +5.2% (+8.9% from the batch's start, before L2 settled).
        # What they miss, and their stores' write-backs, load HBM over the
        # batch's own window, cut alike: at the GPU's steady pace, not as a
        # burst. (No piece passes after the batch's end, which may end the
        # launch.)
        step, stored = duration / len(pieces), stored / len(pieces)
        for c, tiles in enumerate(pieces):
            t = min(begins + c * width, start + duration)
            self.env.call_at(t, lambda _event, tiles=tiles, t=t: self._replay_piece(tiles, t, t + step, stored))

    def _ghost_load_segments(self, items) -> tuple[list, int]:
        """A role program's Loads in program order (_accesses, Stores left
        out), as segments (loads, where they start, whether shared): a loop's
        shared access sequence filtered once for every CTA that shares it
        (kept per sequence), the rest as the role's own. Returns the
        segments and the number of loads."""
        segments: list = []
        own: list = []
        n = 0
        shared_loads = self._shared_loads
        for item in items:
            kind = item.__class__
            if kind is Loop and item.accesses is not None:
                seq = item.accesses()
                # (held beside its loads, the sequence keeps its id to itself)
                hit = shared_loads.get(id(seq))
                if hit is None:
                    hit = shared_loads[id(seq)] = (seq, seq if item.accesses.loads_only
                                                   else tuple(op for op in seq if op.__class__ is Load))
                loads = hit[1]
                if own:
                    segments.append((own, n, False))
                    n += len(own)
                    own = []
                if loads:
                    segments.append((loads, n, True))
                    n += len(loads)
            elif kind is Loop:
                # (_accesses((item, )), without its generator where the loop declares its memory)
                accesses = (chain.from_iterable(map(item.memory, range(item.trips))) if item.memory is not None
                            else _accesses((item, )))
                own += [op for op in accesses if op.__class__ is Load]
            elif kind is Load:
                own.append(item)
        if own or not segments:
            segments.append((own, n, False))
            n += len(own)
        return segments, n

    def _replay_piece(self, tiles: dict, now: float, until: float, stored: float) -> None:
        """A piece of ghost CTAs' loads (tile id -> bytes) through L2 at `now`."""
        missed = self.mem.touch_loads(now, until, tiles)
        self.mem.pollute(now, until, 0.0, stored)
        if missed:
            self.mem.hbm.add_background(now, until, missed * self.mem.hbm_s_per_byte)
            self.totals[MISS] += missed
            self.totals[HBM] += missed * self.mem.hbm_s_per_byte


class _ClassStats:
    """Real CTAs of one cost class: their durations and summed work."""

    __slots__ = ("wave", "samples", "running", "work", "count", "exact", "steady", "latched", "_done")

    def __init__(self, wave: int):
        self.wave = wave                   # of its CTAs running at once (Engine's launch state)
        # (start, duration) of CTAs started under steady contention, in start order
        self.samples: list[tuple[float, float]] = []
        self.running: list[float] = []     # starts of such CTAs still running, in start order
        self._done = (-1, [], [])          # _complete's last answer, by its count of samples
        self.work = [0.0] * N_COUNTERS     # of every real CTA
        self.count = 0
        self.exact = (0.0, 0.0, 0.0)
        self.steady = False
        self.latched: float | None = None  # recent_duration when the class turned steady

    def add(self, start: float, duration: float, totals, warm: bool) -> None:
        if warm:
            insort(self.samples, (start, duration))
            self.running.remove(start)
        self.count += 1
        for s in range(N_COUNTERS):
            self.work[s] += totals[s]
        self.exact = (totals[REQ], totals[STORE], totals[SCRATCH])

    def _complete(self) -> tuple[list[float], list[float]]:
        """(starts, durations) in start order of the samples no CTA still
        running started before: durations are known as CTAs end, and the short
        ones end first. Taken as they end, a wave's first samples are its
        shortest: fa2 64x128 w4 s2 B1 H16 N16k D128 (one CTA an SM, one class)
        turned steady on four CTAs of 166 us while the rest of their wave took
        261, and its fast path came out 28% under the full simulation."""
        # (CTAs start in time order: the first still running is running[0])
        n = bisect_left(self.samples, (self.running[0],)) if self.running else len(self.samples)
        if n != self._done[0]:
            done = self.samples[:n]
            self._done = (n, [s for s, _ in done], [d for _, d in done])
        return self._done[1], self._done[2]

    def ready(self) -> bool:
        """Steady once the CTAs started under steady contention agree: the
        last GHOST_SAMPLES within 1%, or the two halves of the latest wave
        within CONVERGED; after GHOST_WAVES waves of them, in any case."""
        if self.steady:
            return True   # latched: slots that flip between real and ghost CTAs unbalance the tail
        self.steady = self._steady()
        if self.steady:
            self.latched = self.recent_duration()
        return self.steady

    def _steady(self) -> bool:
        starts, d = self._complete()
        wave = self.wave
        n = len(d)
        if n >= GHOST_WAVES * wave:
            return True
        # A whole wave of the class first: fewer can all be the CTAs that
        # fell out of step with the rest (fa2 64x128 w4 s2 B1 H16 N16k D128,
        # one class, 132 CTAs at once in lockstep at 261 us, turned steady on
        # six that ran apart at 166 us each: its fast path came out 28% under
        # the full simulation)
        if n < max(wave, GHOST_SAMPLES):
            return False
        recent = d[-GHOST_SAMPLES:]
        if max(recent) - min(recent) > STEADY_TOLERANCE * max(recent):
            return False
        # the wave's CTAs must have started over at least one of their
        # durations, not in one instant: CTAs that start together agree
        # whatever the contention does next (standard's row softmax after QKᵀ
        # turned steady on three that started together as QKᵀ's dirty tiles
        # drained, at 2.90 us a CTA against the full simulation's 2.17: +33%)
        if starts[-1] - starts[-wave] < fsum(d[-wave:]) / wave:
            return False
        if wave < 2 * GHOST_SAMPLES:
            return True     # (too few at once for two halves)
        half = wave // 2
        older, newer = fsum(d[-wave:-half]) / (wave - half), fsum(d[-half:]) / half
        return abs(newer - older) <= CONVERGED * max(newer, older)

    def recent_duration(self) -> float:
        """Mean of the latest wave of durations when the class first became
        steady: under FIFO queueing single CTAs vary with their place in the
        queue, a wave's mean does not (Little's law: duration = slots ÷
        throughput). Fixed then: the real CTAs still running beside the
        class's first ghosts finish late, slowed by the ghosts' background
        load, and taken in they stretched the next ghosts, whose load slowed
        the next real CTAs. standard's row softmax (B16 H32 N1024 D64) ghosted
        at 1.07 us, then 12.6, then 14.9 us a CTA, with HBM 30% busy: 2356 us
        against 703 in the full simulation."""
        if self.latched is not None:
            return self.latched
        recent = self._complete()[1][-self.wave:]
        return fsum(recent) / len(recent)

    def shares(self) -> bool:
        """Did its real CTAs find some of their bytes in L2 (tiles other CTAs
        fetched, or they themselves)? A class that missed every byte (the
        row softmax's rows of S) has nothing to share, and its mean misses
        stand for its ghosts."""
        return self.work[REQ] - self.work[MISS] > SHARED_HITS * self.work[REQ]

    def mean_work(self, batch: int) -> list[float]:
        work = [w / self.count * batch for w in self.work]
        # requested and stored bytes are equal for every CTA of a class
        work[REQ], work[STORE], work[SCRATCH] = (b * batch for b in self.exact)
        return work
