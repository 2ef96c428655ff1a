"""Loop fast-forward: a CTA skips the iterations of a loop once they repeat.

The first of the engine's two fast-path levels (the other, ghosting.py, does
the same for whole CTAs). Mixed into core.Engine, whose state it uses.

In a run of iterations with equal Loop.key (equal ops,
tiles aside), once two consecutive iterations take the same time (1%), or
after 8, the rest of the run is skipped: the CTA waits out the skipped
count × the measured period in place. The roles of a multi-role CTA (FA3,
8-warp fa2) skip together, once all are steady: the same iterations of
their shared loop, so barrier tokens stay balanced (_Together). The
skipped work is background load on every unit it would have used, SM and
global, arriving as a fluid chunk by chunk (servers.Server). Requested
bytes are exact (equal keys mean equal sizes); loops that declare their
accesses (Loop.memory) pass the skipped tiles through L2 untimed, in 8
chunks near their own time, for the HBM bytes; others take the sampled
miss rate. A period holds for the contention it was timed under: when a
CTA arrives on or leaves an SM, the skips there stop and time the rest
again (_disturb; a multi-role CTA's roles all at once), and so does a skip whose
period HBM set once HBM has nothing queued; a skip chunk whose work its
global units have not served by its end waits for them.

Neither is done for a CTA whose loop carries tiles from one iteration to the
next through L2 while an iteration's tiles of all CTAs in flight come within
ROUND_TRIP_BAND of L2's capacity (FA1 near its L2 edge): their hits turn on
the CTAs' relative timing, finer than extrapolated periods keep it. Away
from that edge such a CTA's skips pass their tiles through L2 in chunks of
at most CARRIED_CHUNK of it (LoopSkipping._chunks).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from math import ceil, fsum, inf
from itertools import chain

from algorithms.ops import Load, Loop, Store

from .counters import HBM, MISS, N_COUNTERS, REQ, SCRATCH, STORE

if TYPE_CHECKING:    # (annotations only: core imports this module)
    from .core import _Cta, _Role, _SM


STEADY_TOLERANCE = 0.01     # two iterations/CTAs "take the same time" within 1%
MIN_SAMPLES = 3             # iterations timed before a run may be skipped
MAX_SAMPLES = 8             # ... skipped at the latest after this many
# A skip's loads pass through L2 in this many chunks, each near its own time.
REPLAY_CHUNKS = 8
# ... and, for a CTA whose loop carries tiles through L2, in chunks whose
# accesses, times the CTAs in flight, come to at most this share of L2
# (_chunks). FA1 against its full simulation (session 30, this CPU): at 0.5,
# B4 H32 N4096 D64 causal -18.0%, B8 H32 N2048 D64 causal -14.6%; at 0.25
# -0.3% and +0.9%, as at 0.125 and at one iteration a chunk.
CARRIED_CHUNK = 0.25
# ... and of the width of L2's retention ramp where it has one, for loops
# whose iterations across the CTAs in flight come to at most RAMP_REACH times
# L2 (Engine._chunks)
RAMP_CHUNK = 0.05
RAMP_REACH = 2.0
# A skipped loop's period counts as set by HBM when HBM was asked for at least
# this share of its time while the period was timed (then the skip is timed
# again once HBM has nothing queued).
HBM_PACED = 0.9
# A loop that carries tiles from one iteration to the next through L2 (FA1's
# running O, l, m and its Q blocks, read again at every K/V block) finds them
# there only while an iteration's tiles of every CTA in flight fit; where they
# come within this share of L2's capacity either way, the CTAs are simulated
# without skipping. A tile's reuse distance is the bytes all CTAs touch in one
# of its CTA's iterations, so a CTA whose skipped period is off by a fraction e
# sees its tiles' distances off by about e. FA1 B4 H32 N1024 D64 (128 CTAs of
# 408 KB an iteration: 1.02x L2's 52.4 MB) timed its K/V blocks at 32.8-45.7
# us a CTA (mean 37.5: -12%/+22%; L2 still settling in those first
# iterations, the full simulation's CTAs then take 33 or 50 us) and came out
# -12.3% (runtime) and -13.7% (HBM reads) off its full simulation, which
# itself reads 821 MB in 990 us with 0.995x that L2 and 398 MB in 751 us with
# 1.005x. The band is that spread, rounded up. With L2 scaled so that an
# iteration's tiles are 0.73x of it, the same shape's fast path matched its
# full simulation (-0.05%, HBM bytes exact); at 1.28x -0.9% and 1.46x -0.5%
# (HBM reads -4.6% and -3.4%); inside the band -1.3% at 0.85x, -2.4% at 0.97x
# (HBM reads -19%), -23% at 1.04x, +0.6% at 1.07x (HBM reads -7%).
# Beyond it the same cause remains, smaller: B5, B6 and B8 of that shape
# (1.28x, 1.53x, 2.04x) came out -2.0%, +5.7%, -2.3% (HBM reads -15%, -4.7%,
# -4.3%). Skipping only chunks whose tiles would miss as the timed iterations'
# did (tried) made those -4.3%, +1.3%, +0.8% and the 1.02x case worse: not kept.
ROUND_TRIP_BAND = 0.25


class LoopSkipping:
    """Engine methods that run a keyed loop and skip its steady iterations.

    From core.Engine they use its environment and memory (env, mem), its
    op table and interpreter (_ops, _run), `fast`, the slots of the running
    launch (_slots), its event count, and the fast-forwarded work's load
    (_background, _served_by)."""

    def _loop(self, loop: Loop, role: _Role, cta: _Cta, top: bool = False):
        key_of = loop.key if self.fast and not cta.exact else None
        together = cta.together
        if together is not None and not (top and loop.name == together.name):
            key_of = None   # a multi-role CTA skips only in the top-level loop its roles share
        if key_of is None:
            for i in range(loop.trips):
                yield from self._run(loop.body(i), role, cta)
            return
        env, trips, ops, sm = self.env, loop.trips, self._ops, cta.sm
        run_ends = None
        if top:     # the class's key list, made by its first CTA
            keys, run_ends = _class_keys(role.keys, loop)
            key_of = keys.__getitem__
        i, run_key, samples, skipped_run, run_end = 0, object(), [], None, None
        if together is not None:
            r, offset = role.index, together.offsets[role.index]
        while i < trips:
            if together is not None:
                skip = together.skip
                if skip is not None and skip.first == i + offset and skip.at[r] is None:
                    pair = samples[-2:] if len(samples) >= 2 else together.pairs[r]
                    done = yield from self._skip_together(loop, i, skip, pair, role, cta)
                    i += done
                    samples = []
                    if skip.stop is None:
                        skipped_run = run_key
                    continue
                together.started[r] = i + 1 + offset
            key = key_of(i)
            if key != run_key:
                run_key, samples, run_end = key, [], None
                if together is not None:
                    together.ready[r] = None
                if top:
                    # a new run of iteration costs (fa2's masked steps after its
                    # unmasked ones, a loop's first run) changes what this CTA
                    # asks of the SM's units: its neighbours' skips were timed
                    # beside the old mix (since causal masked steps issue 26-118% more
                    # instructions than unmasked ones, a causal 8-warp fa2 came
                    # out -6.6% against its full simulation without this)
                    self._disturb(sm)
            t0, c0, changes, hbm0 = env._now, tuple(role.c), sm.residents_changed, self.mem.hbm.busy
            # _run's loop, inlined: a generator less to resume at every event
            for item in loop.body(i):
                if item.__class__ is Loop:
                    yield from self._loop(item, role, cta)
                    continue
                event = ops[item.__class__](item, role, cta)
                if event is not None:
                    self.events += 1
                    yield event
            i += 1
            if sm.residents_changed != changes:
                # a CTA arrived on or left the SM during this iteration: the
                # samples so far were timed under other contention (timed
                # alone before its neighbours came, a CTA once kept that period
                # for its whole loop: 36 µs against the full simulation's 62,
                # fa2 B2 H32 N2048 D64 128x32 w4 s3)
                samples = []
                if together is not None:
                    together.ready[r] = None
                continue
            # the counters before and after: their difference, the iteration's
            # work, is taken only for the two iterations a skip extrapolates;
            # and the work asked of HBM by then (_hbm_paced)
            samples.append((env._now - t0, c0, tuple(role.c), hbm0, self.mem.hbm.busy))
            if skipped_run == run_key or len(samples) < MIN_SAMPLES:
                continue
            d1, d2 = samples[-2][0], samples[-1][0]
            if abs(d1 - d2) > STEADY_TOLERANCE * max(d1, d2) and len(samples) < MAX_SAMPLES:
                if together is not None:
                    together.ready[r] = None
                continue
            if run_end is None:     # found once per run (a disturbed skip resumes it)
                if run_ends is not None:
                    run_end = run_ends[i - 1]   # (iteration i - 1's run: run_key's)
                else:
                    run_end = i
                    while run_end < trips and key_of(run_end) == run_key:
                        run_end += 1
            period = (d1 + d2) / 2
            if together is not None:    # steady: skip once every role is
                together.pairs[r] = samples[-2:]
                together.ready[r] = (period, run_end + offset)
                together.decide(sm.residents_changed)
                continue
            count = run_end - i
            if count > 0:
                per_iteration = self._per_iteration(samples[-2:])
                # (a CTA whose loop carries tiles through L2, FA1's, is not
                # timed again when HBM idles: its period set in HBM's burst
                # came out 2.1 us a step in an idle spell against the full
                # simulation's steady 3.4, B4 H32 N4096 D64, -28% on the run)
                done = yield from self._skip_in_place(loop, i, count, period, per_iteration,
                                                      self._hbm_paced(samples[-2:]) and not cta.carries, role, cta)
                i += done
                if done < count:    # disturbed: time the rest of the run afresh
                    samples = []
                    continue
            skipped_run = run_key

    @staticmethod
    def _per_iteration(samples) -> list[float]:
        """One skipped iteration's work: the mean of the last two timed ones
        (requested and stored bytes are equal in every iteration of a run)."""
        (_, first0, first1, _, _), (_, last0, last1, _, _) = samples
        first = [a - b for a, b in zip(first1, first0)]
        last = [a - b for a, b in zip(last1, last0)]
        work = [(a + b) / 2 for a, b in zip(first, last)]
        work[REQ], work[STORE], work[SCRATCH] = last[REQ], last[STORE], last[SCRATCH]
        return work

    def _skip_in_place(self, loop: Loop, first: int, count: int, period: float, per_iteration,
                       hbm_paced: bool, role: _Role, cta: _Cta):
        """A single-role CTA skips `count` iterations: it waits them out at the
        measured period, chunk by chunk (_chunks), their work a background
        load over the wait and their loads and stores passing through L2 chunk
        by chunk: replayed tile by tile for loops that declare their accesses
        (Loop.memory), as an anonymous entry for the others.

        A period holds only for the load it was timed under. The rest of a
        run is timed again (the iterations done are charged) when
        - the SM's residents change (_disturb; declared loops only): a CTA
          that timed its period alone between two waves once kept it for its
          whole loop, its successors queued behind its background and the
          launch came out 35% fast (fa2 B1 H32 N16384 D64 128x32);
        - its period was set by HBM and HBM now has nothing queued:
          FA1's outer loop timed during the first wave's burst kept periods
          of 90-430 µs while HBM sat two-thirds idle (B8 H32 N2048 D64: 2.5x
          the full simulation).
        A chunk whose work its units have not served by its end (a period
        timed under lighter load) waits for them, as a ghost batch does
        (standard's PV GEMM: +48% over the full simulation before). The
        background load is laid chunk by chunk, so that the next chunk's
        comes only after that wait, as a stalled CTA's requests would:
        laid over the whole skip at once, it kept arriving at the timed
        rate while the CTA waited, the CTA ended up to a wait per chunk
        after its load, and on an L2 kept near saturation (fa2 64x64 w4 s3
        B2 H16 N8192 D128, L2 96% busy in its full simulation) the CTAs
        waited 2.9% of their time for the backlog; skips alone came out
        +2.7% against the full simulation, +0.5% chunk by chunk (+0.1%
        with SharedServer.add_background's sources).
        Returns the number of iterations done."""
        env, sm = self.env, cta.sm
        replayed = loop.memory is not None
        done, missed = 0, 0
        for lo, hi in self._chunks(count, per_iteration, cta.carries, loop.trips):
            chunk_start, chunk_end = env._now, env._now + (hi - lo) * period
            work, handles = self._skip_load(sm, per_iteration, hi - lo, period, replayed)
            missed += self._skip_memory(loop, first, lo, hi, per_iteration, chunk_end, replayed, sm)
            if replayed:
                disturbed = yield self._skip_wait(sm, chunk_end - chunk_start)
            else:
                disturbed = yield env.timeout(chunk_end - chunk_start, False)
            self.events += 1
            if not disturbed:
                done = hi
                served = self._served_by(None, work, hbm=missed > 0)
                if served > env._now:
                    yield env.timeout(served - env._now)
                if hi == count or not (hbm_paced and self.mem.hbm.idle(env._now)):
                    continue
            else:
                done = lo + (min(hi - lo, int((env._now - chunk_start) / period)) if period > 0 else 0)
            self._stop_skip_load(sm, handles, replayed)
            break
        self._charge(role, per_iteration, done, missed if replayed else None)
        return done

    def _skip_load(self, sm: _SM, per_iteration, count: int, period: float, replayed: bool):
        """`count` skipped iterations' work as background load over their
        window from now (HBM's comes chunk by chunk from the replay when
        `replayed`): (the work, the background handles)."""
        work = [w * count for w in per_iteration]
        if replayed:
            work[MISS] = work[HBM] = 0.0
        now = self.env._now
        return work, self._background(sm, now, now + count * period, work)

    def _skip_memory(self, loop: Loop, first: int, lo: int, hi: int, per_iteration, until: float,
                     replayed: bool, sm: _SM) -> int:
        """Skipped iterations first+lo .. first+hi through L2 by `until`: their
        tiles replayed (declared loops), or an anonymous entry of their
        sampled bytes. Returns the HBM bytes the replay missed (0 otherwise)."""
        if replayed:
            return self._replay_memory(loop, first + lo, hi - lo, until, sm)
        self.mem.pollute(self.env._now, until, per_iteration[MISS] * (hi - lo),
                         per_iteration[STORE] * (hi - lo))
        return 0

    def _stop_skip_load(self, sm: _SM, handles, replayed: bool) -> None:
        """A skip cut short: the rest is timed again, its loads served again,
        so its SM and L2 background stops now, and HBM's unless replayed
        (those tiles now sit in L2); an anonymous entry already covers its
        chunk."""
        for server, handle in zip(sm.units + [self.mem.l2, self.mem.hbm],
                                  handles if not replayed else handles[:-1]):
            server.cancel_background(handle, self.env._now)

    def _hbm_paced(self, pair) -> bool:
        """Did HBM set the period of these two timed iterations? Yes when the
        work asked of HBM (every SM's, fast-forwarded or not) while they ran
        came to at least HBM_PACED of its time: HBM was saturated and the
        period holds only while it stays so. (Judged before by the CTA's own
        misses times the CTAs in flight, which marked whichever CTA first
        fetched a K/V tile its head shares as HBM-bound, and not its
        neighbours that hit the same tile: their skips ran on, its own were
        cut short, and SMs that are alike in the full simulation came apart:
        fa2 B2 H32 N2048 D64 128x32 w4 s2, +1.4% against the full simulation.)"""
        (first, _, _, asked_before, _), (last, _, _, _, asked_after) = pair
        window = first + last
        return window > 0.0 and asked_after - asked_before >= HBM_PACED * window

    def _charge(self, role: _Role, per_iteration, done: int, missed: int | None) -> None:
        """Count `done` skipped iterations' work to the role; `missed`: the HBM
        bytes their replay through L2 missed (None: not replayed, the
        sampled miss rate stands)."""
        charged = [w * done for w in per_iteration]
        if missed is not None:
            charged[MISS], charged[HBM] = missed, missed * self.mem.hbm_s_per_byte
        for slot in range(N_COUNTERS):
            role.c[slot] += charged[slot]

    def _chunks(self, count: int, per_iteration, carries: bool = False, trips: int = 0):
        """[lo, hi) iteration ranges a skip is waited in, its loads and stores
        passing through L2 chunk by chunk, near their own time (all at once,
        a causal fa2 CTA's whole K/V stream entered L2 at its skip and evicted
        what its neighbours were sharing: HBM reads +43% over the full
        simulation): REPLAY_CHUNKS of them, or one per iteration when an
        iteration alone moves more than this CTA's share of L2 (capacity /
        CTAs in flight). A burst larger than that sweeps through L2 in one
        piece where the real CTAs interleave their accesses, and the reuse
        distances of the tiles they revisit come out wrong: FA1's outer loop
        (B1 H16 N4096 D128: 5 MB of Q/O tiles an iteration, 16 CTAs) read
        4.5x and wrote 5.8x the full simulation's HBM bytes in 8 chunks.
        (Chunks sized to the share for every loop moved fa2 64x64 w4 s3 N8192
        D128 from +4.9% to +11.2% against its full simulation: not done.)
        Finer, too, for a CTA whose loop carries tiles through L2
        (`carries`, Engine._round_trip: FA1's running O, l, m): whether a
        carried tile is still there when its CTA comes back for it turns on
        how every CTA's accesses interleave, which eight-iteration pieces
        coarsen; FA1's inner loops over Q blocks, skipped in eight, found
        more in L2 and ran 1.5-17% under the full simulation
        (fast_vs_full.py --fa1: B4 H32 N4096 D64 causal -16.9%, HBM reads
        -4.8%; an iteration a chunk: -0.1% and -0.2%). Chunks of at most
        CARRIED_CHUNK of L2 across the CTAs in flight keep that, in a
        quarter of the chunks (FA1 causal B1 H16 N16k D128: 2.6 s fast, 9.0
        an iteration a chunk). Where L2's retention ramps (l2_lines.py: a
        carried tile partly gone past mem.keep_all), a chunk shifts a tile's
        depth along the ramp, not only across the capacity: chunks of
        RAMP_CHUNK of the ramp's width then (FA1 causal B1 H14 N4096 D128,
        44.5 MB of Q/O tiles: HBM reads -24% against the full simulation in
        chunks of a quarter of L2, -1.5% an iteration a chunk), while the
        loop's `trips` iterations across the CTAs in flight come to at most
        RAMP_REACH times L2 (beyond, a carried tile is gone whatever the
        chunks: FA1 causal B1 H16 N16k D128, 203 MB, took 10.9 s an
        iteration a chunk against 2.5)."""
        mem = self.mem
        burst = (per_iteration[REQ] + per_iteration[STORE]) * self._slots
        if burst > mem.capacity:
            n = count
        elif carries:
            on_ramp = 0 <= mem.keep_all < mem.capacity and burst * trips <= RAMP_REACH * mem.capacity
            scale = RAMP_CHUNK * (mem.capacity - mem.keep_all) if on_ramp else CARRIED_CHUNK * mem.capacity
            n = min(count, max(REPLAY_CHUNKS, ceil(count * burst / scale)))
        else:
            n = min(count, REPLAY_CHUNKS)
        bounds = [count * j // n for j in range(n + 1)]
        return [(lo, hi) for lo, hi in zip(bounds, bounds[1:]) if hi > lo]

    def _replay_memory(self, loop: Loop, first: int, count: int, until: float, sm: _SM) -> int:
        """The skipped iterations' loads and stores through L2 (MemorySystem.touch),
        their write-backs and the HBM reads they miss spread over [now, until];
        returns the missed bytes. Only for loops that declare their accesses
        (Loop.memory: the pipelined K/V and GEMM loops, whose tiles other
        CTAs share, and FA1's loops, whose running O/l/m a CTA rewrites)."""
        now = self.env._now
        # slices of sequences the schedule keeps, not rebuilt (their tiles encoded once)
        spans = (loop.accesses.spans(first, count) if loop.accesses is not None
                 else loop.spans(first, count) if loop.spans is not None else None)
        if spans is not None:
            missed = self.mem.touch_spans(now, until, spans)
        else:
            missed = self.mem.touch(now, until, chain.from_iterable(map(loop.memory, range(first, first + count))))
        self.mem.hbm.add_background(now, until, missed * self.mem.hbm_s_per_byte, sm.port)
        return missed

    def _skip_together(self, loop: Loop, first: int, skip: "_Skip", pair, role: _Role, cta: _Cta):
        """A role of a multi-role CTA (FA3, 8-warp fa2) skips its share of the
        CTA's skip in place: the iterations every role skips, from the same
        aligned index (_Together), at the roles' mean period, its work a
        background load and its loads replayed through L2 chunk by chunk, as
        _skip_in_place does. Its roles' barrier tokens stay balanced because
        all skip the same count and none depends on another's later
        iterations. A change of the SM's residents cuts the skip short for
        all of its roles at once: every role skips as far as the furthest
        one had come (skip.stop), then times the rest again. (Skipped at the
        CTA's end instead, with a period timed in the first eight iterations,
        the extension's load could not follow its neighbours' coming and
        going: periods timed while the SM was oversubscribed by stale
        extensions reached 36 µs against 1.4, fa2 64x32 w8 causal N16k came
        out 4x its full simulation.) pair: the role's last two timed
        iterations. Returns the number of iterations skipped."""
        env, sm, r = self.env, cta.sm, role.index
        if skip.stop is None and sm.residents_changed != skip.changes:
            # the SM's residents changed after the skip was decided and
            # before any role began to wait it out (a role waiting would
            # have been stopped): its period was timed under the old
            # contention. Every role stops where the furthest is, and times
            # again. (The last CTA on an SM once skipped 115 iterations at the
            # 995 ns its three residents had taken, alone from 0.3 µs before:
            # fa2 64x32 w8 causal B1 H12 N4096, +9.7% over the full simulation.)
            skip.stop = skip.furthest(env._now)
        period = skip.period
        count = skip.count if skip.stop is None else skip.stop
        per_iteration = self._per_iteration(pair)
        replayed = loop.memory is not None
        hbm_paced = self._hbm_paced(pair)
        done, missed = 0, 0
        for lo, hi in self._chunks(count, per_iteration, cta.carries, loop.trips) if count > 0 else ():
            if skip.stop is not None:
                if lo >= skip.stop:
                    break
                hi = min(hi, skip.stop)
            chunk_start = env._now
            chunk_end = chunk_start + (hi - lo) * period
            chunk_hi = hi
            work, handles = self._skip_load(sm, per_iteration, hi - lo, period, replayed)
            skip.at[r] = (lo, hi, chunk_start)
            missed += self._skip_memory(loop, first, lo, hi, per_iteration, chunk_end, replayed, sm)
            if skip.stop is None:
                disturbed = yield self._skip_wait(sm, chunk_end - chunk_start)
            else:
                disturbed = yield env.timeout(chunk_end - chunk_start, False)
            self.events += 1
            if disturbed:
                if skip.stop is None:
                    skip.stop = skip.furthest(env._now)
                hi = min(hi, skip.stop)
                rest = chunk_start + (hi - lo) * period - env._now
                if rest > 0.0:
                    self.events += 1
                    yield env.timeout(rest)
            else:
                served = self._served_by(None, work, hbm=missed > 0)
                if served > env._now:
                    yield env.timeout(served - env._now)
                if skip.stop is None and hi < count and hbm_paced and self.mem.hbm.idle(env._now):
                    # as far as any role has come or is waiting out now
                    skip.stop = skip.furthest(inf)
                elif skip.stop is not None and hi > skip.stop:
                    hi = skip.stop      # stopped by another role while this one waited
            done = hi
            if hi < chunk_hi:   # cut short: the chunk's load stops where its roles stop
                self._stop_skip_load(sm, handles, replayed)
        skip.at[r] = done
        skip.left -= 1
        if skip.left == 0:
            cta.together.skip = None
        self._charge(role, per_iteration, done, missed if replayed else None)
        return done

    def _skip_wait(self, sm: "_SM", duration: float):
        """An event that fires after `duration`, with False, or earlier, with
        True, when the SM's residents change (_disturb)."""
        event = self.env.event()
        timer = self.env.timeout(duration)
        timer.callbacks.append(lambda _t: None if event.triggered else event.succeed(False))
        event.callbacks.append(lambda _e: sm.skippers.pop(event, None))
        sm.skippers[event] = None
        return event

    def _disturb(self, sm: "_SM") -> None:
        """A CTA or ghost batch arrives on or leaves `sm`, or a resident
        starts a new run of iteration costs: the contention its skipping CTAs
        timed their period under is gone, and iterations timed across the
        change (_loop) stand for neither side."""
        sm.residents_changed += 1
        for event in list(sm.skippers):
            if not event.triggered:
                event.succeed(True)
        sm.skippers.clear()

    # ------------------------------------------- what a CTA's roles skip together
    def _together_plan(self, program):
        """For multi-role CTAs on the fast path: the loop their roles skip in
        together -- the first keyed top-level loop of each, one name for all
        -- and each role's offset aligning its iterations with the others'
        (a loop that peels its first iterations, FA3's overlapped consumers,
        is that many shorter: aligned at their ends). ("", ()) when the roles
        share no such loop (nothing is skipped); None for single-role CTAs."""
        if not self.fast or len(program.roles) == 1:
            return None
        loops = [next((it for it in role.items if it.__class__ is Loop and it.key), None)
                 for role in program.roles]
        if any(loop is None or loop.name != loops[0].name for loop in loops):
            return ("", ())
        longest = max(loop.trips for loop in loops)
        return (loops[0].name, tuple(longest - loop.trips for loop in loops))

    def _round_trip(self, program) -> tuple[bool, bool]:
        """(near capacity, carried): does a top-level loop of `program` carry
        tiles from one iteration to the next (the next touches a tile this
        one did: FA1's running O, l, m), and do one iteration's tiles, times
        the CTAs in flight, come within ROUND_TRIP_BAND of L2's capacity?
        Near it, whether they are still in L2 turns on the CTAs' relative
        timing to within that band, finer than skipped periods hold it, and
        a fast-forward can flip their hits into misses or back
        (ROUND_TRIP_BAND's note). Judged on a middle iteration and the one
        after it."""
        carried = False
        for role in program.roles:
            for item in role.items:
                if item.__class__ is not Loop or item.memory is None or item.trips < 2:
                    continue
                i = item.trips // 2 - 1
                tiles = {op.tile: op.nbytes for op in item.memory(i)}
                if not _reads_back(item.memory(i + 1), tiles):
                    continue
                carried = True
                footprint = sum(tiles.values()) * self._slots
                # (without an L2, capacity 0, nothing is carried: never near)
                if abs(footprint - self.mem.capacity) < ROUND_TRIP_BAND * self.mem.capacity:
                    return True, True
        return False, carried


class _Together:
    """The roles of one multi-role CTA skipping iterations of their shared loop
    together (Engine._skip_together). Indices are aligned: role r's
    iteration i is i + offsets[r]."""

    __slots__ = ("name", "offsets", "started", "ready", "pairs", "skip")

    def __init__(self, name: str, offsets: tuple):
        self.name = name
        self.offsets = offsets
        roles = len(offsets)
        self.started = [0] * roles      # aligned index after the last iteration each role began
        self.ready: list = [None] * roles   # (period, aligned end of its run) once its timing is steady
        self.pairs: list = [None] * roles   # its last two timed iterations then
        self.skip: _Skip | None = None      # the skip under way, until every role has done it

    def decide(self, changes: int) -> None:
        """Once every role is steady: all skip from the furthest a role has
        come, as far as every role's run of equal keys goes, at the mean of
        their periods (roles held in step by their barriers take the same
        time an iteration; the mean of their samples is the estimate).
        changes: the SM's residents_changed now, when the periods held."""
        if self.skip is not None or None in self.ready:
            return
        first = max(self.started)
        count = min(end for _, end in self.ready) - first
        if count > 0:
            self.skip = _Skip(first, count, fsum(period for period, _ in self.ready) / len(self.ready),
                              len(self.ready), changes)


class _Skip:
    """Iterations [first, first + count) (aligned) that every role of a CTA skips."""

    __slots__ = ("first", "count", "period", "stop", "at", "left", "changes")

    def __init__(self, first: int, count: int, period: float, roles: int, changes: int):
        self.first, self.count, self.period = first, count, period
        self.changes = changes          # the SM's residents_changed when the period was taken
        self.stop: int | None = None    # once cut short: the count every role skips
        self.at: list = [None] * roles  # per role: (lo, hi, start) of its chunk, or its count once done
        self.left = roles               # roles yet to finish

    def furthest(self, now: float) -> int:
        """The most iterations any role has waited out by `now` (inf: is
        committed to): where a skip cut short stops for every role."""
        return max(self.progress(k, now) for k in range(len(self.at)))

    def progress(self, role: int, now: float) -> int:
        """Iterations role `role` has waited out by `now` (now = inf: those it
        is committed to, its current chunk's end)."""
        at = self.at[role]
        if at is None or at.__class__ is int:
            return at or 0
        lo, hi, start = at
        return lo + int(min(hi - lo, (now - start) / self.period)) if self.period > 0.0 else hi


def _accesses(items):
    """A role program's Loads and Stores in program order (a loop's through
    Loop.memory where it declares them)."""
    for item in items:
        kind = item.__class__
        if kind is Loop:
            if item.accesses is not None:
                yield from item.accesses()
            elif item.memory is not None:
                yield from chain.from_iterable(map(item.memory, range(item.trips)))
            else:
                for i in range(item.trips):
                    yield from _accesses(item.body(i))
        elif kind is Load or kind is Store:
            yield item


def _reads_back(accesses, earlier) -> bool:
    """Does an iteration whose loads and stores are `accesses` load a tile of
    `earlier` (the previous iteration's) before storing it? Only then does
    the loop carry a tile through L2 (FA1's running O, l, m). A tile it
    stores first -- a spilling fa2 step's stack, stored and reloaded every
    step -- is in L2 for its reloads whatever happened to it since the last
    iteration, so skips need not replay it in small chunks: marked carried,
    fa2 128x64 w4 s2 B1 H16 N16k D128 (260 spilled bytes a thread a step)
    replayed its skips a step a chunk, 423k chunks (18.9 s in session 33's
    sweep, 9.6 s in session 34's in a slower hour)."""
    stored = set()
    for op in accesses:
        if op.tile in stored:
            continue
        if op.__class__ is Store:
            stored.add(op.tile)
        elif op.tile in earlier:
            return True
    return False


def _class_keys(keys: dict, loop: Loop) -> tuple[list, list]:
    """[loop.key(i) for every i] of a role's top-level loop, and for every i
    the end (exclusive) of the run of equal keys that holds i, kept in `keys`
    (a role's dict shared by the CTAs of its cost class: equal costs, equal
    keys) so that the class's first CTA alone computes them."""
    cached = keys.get((loop.name, loop.trips))
    if cached is None:
        labels = [loop.key(j) for j in range(loop.trips)]
        ends = [loop.trips] * loop.trips
        for j in range(loop.trips - 2, -1, -1):
            if labels[j + 1] == labels[j]:
                ends[j] = ends[j + 1]
            else:
                ends[j] = j + 1
        cached = keys[loop.name, loop.trips] = (labels, ends)
    return cached
