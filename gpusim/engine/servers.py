"""Servers and barriers: the engine's synchronisation primitives.

A Server is a unit of fixed throughput owned by one SM (tensor cores, SFU,
its port to L2, ...). Work is given as service time; requests are served in
arrival order, so a request arriving at `now` finishes at max(now, free_at)
+ service. Reserving at request time costs one SimPy event per operation
(the caller's timeout) instead of a request/hold/release triple.

A SharedServer is bandwidth shared by all SMs (L2, HBM): each SM's requests
go through its port in order, one at a time, and the SMs with a request in
flight share the bandwidth equally (processor sharing). A burst of loads
from every SM then ends for all of them near the end of the burst, as on
the H100 (calibrate.py cta_stamps: 132 CTAs' 16 KB tiles arrive p10-p90
1.1-1.8 us after a round's start). Served in arrival order instead, the
first SM had its tile after the latency alone and ran ahead, one SM's loads
hid behind another's compute, and a copy round at one CTA per SM came out
21-35% fast (calibrate.py cta_cycle; 10-11% with sharing). Shared per
request rather than per SM, CTAs resident on one SM stayed in lock-step and
left HBM idle between their bursts: copy rounds at 2 and 4 CTAs per SM,
HBM-bound on the GPU, came out 9-25% slow (within 4% per SM).

Background load stands for work the engine fast-forwarded instead of
simulating: it arrives as a fluid over its window. A Server queues it in
FIFO order with the real requests, so it delays them only when the two
together exceed the server's rate; a SharedServer gives it its max-min
share beside them.
"""
from __future__ import annotations

import heapq
from collections import deque
from heapq import heappop, heappush
from itertools import count
from math import inf

from simpy.events import NORMAL, Timeout

class Server:
    __slots__ = ("name", "free_at", "busy", "_bg", "_bg_load", "_bg_since", "latency_extra")

    def __init__(self, name: str):
        self.name = name
        # (an SM's port to L2: what its round trip takes beyond the profile's, s)
        self.latency_extra = 0.0
        self.free_at = 0.0
        self.busy = 0.0  # seconds of service given, real and background
        self._bg: list[list] = []  # heap of [end, utilisation, arriving]
        self._bg_load = 0.0
        self._bg_since = 0.0  # background work before this time is queued

    def serve(self, now: float, service: float) -> float:
        """Queue `service` seconds of work arriving at `now`; return its end time."""
        self.busy += service
        if self._bg and now > self._bg_since:   # (the check _queue_background starts with, inlined)
            self._queue_background(now)
        free_at = self.free_at
        free_at = (free_at if free_at > now else now) + service
        self.free_at = free_at
        return free_at

    def served_by(self, now: float) -> float:
        """When the work queued by `now`, background included, is served."""
        if self._bg and now > self._bg_since:
            self._queue_background(now)
        return self.free_at if self.free_at > now else now

    def add_background(self, start: float, end: float, busy: float):
        """`busy` seconds of fast-forwarded work arriving evenly over [start, end]
        (start is the present: the engine adds it as it skips). Returns a
        handle for cancel_background, or None when there is nothing to cancel."""
        if busy <= 0.0:
            return None
        self.busy += busy
        if end <= start:
            return None
        self._queue_background(start)
        entry = [end, busy / (end - start), True]   # end, utilisation, still arriving
        heapq.heappush(self._bg, entry)
        self._bg_load += entry[1]
        return entry

    def cancel_background(self, entry, now: float) -> None:
        """Stop a background stream at `now`: what arrived until then stays
        queued, the rest never comes (the engine re-times that work)."""
        if entry is None or not entry[2] or entry[0] <= now:
            return
        self._queue_background(now)
        entry[2] = False
        self._bg_load -= entry[1]
        self.busy -= entry[1] * (entry[0] - now)

    def _queue_background(self, now: float) -> None:
        """Put the background work that arrived since the last call into the
        FIFO queue, as a fluid: over a stretch [a, b] of load u it adds
        u·(b − a) of work behind whatever was queued at a. An unsaturated
        server finishes it by b, so later requests do not wait for it; a
        saturated one queues it, and real requests wait their turn."""
        bg, t = self._bg, self._bg_since
        if now <= t:
            return
        load, free_at = self._bg_load, self.free_at     # (locals: a hot loop)
        while t < now:
            seg_end = bg[0][0] if bg and bg[0][0] < now else now
            if load > 0.0:
                if free_at < t:
                    free_at = t
                free_at += load * (seg_end - t)
            t = seg_end
            while bg and bg[0][0] <= t:
                ended = heapq.heappop(bg)
                if ended[2]:
                    load -= ended[1]
            if not bg:
                load = 0.0
                break
        self._bg_load, self.free_at = load, free_at
        self._bg_since = now


class SharedServer:
    """Processor sharing with a fluid background, at max-min fair rates.

    Real requests (request()) in service each get an equal share of the
    rate left to them (one per source; a source's later ones wait); the
    background -- fast-forwarded work (add_background), arriving as a
    fluid -- counts as one requester per stream, takes what it demands
    up to that fair share and queues the excess as a backlog, served first
    when no real request is in flight. Rates change only when a request
    arrives or leaves, a stream starts or ends, or the backlog empties; in
    between, each real request's service grows at the same pace, so one
    number (the virtual time: service every request in flight has had) and
    each request's finishing tag (virtual time at arrival + its service)
    say who leaves next. A request's callback gets the time it left; the
    server wakes itself (a SimPy timeout) at the next departure."""

    # Tags within this much service (seconds) of the virtual time have left:
    # float sums of ~1e-6 s steps drift by ~1e-22 s.
    EPSILON = 1e-18

    def __init__(self, name: str, env):
        self.name = name
        self.env = env
        self._queues: dict = {}     # source -> its requests behind the one in service
        self.busy = 0.0     # seconds of service given, real and background
        self._t = 0.0       # the state below holds at this time
        self._v = 0.0       # virtual time: service each request in flight has had
        self._jobs: list = []      # heap of (tag, order, callback, source) in service
        self._order = count()
        self._bg: list[list] = []  # heap of [end, utilisation, arriving, order, source]
        self._bg_load = 0.0        # utilisation the arriving streams demand
        self._bg_streams = 0       # sources with streams arriving (add_background)
        self._bg_sources: dict = {}    # source -> its streams still arriving
        self._overlap = 0          # sources with streams arriving and a real request in service
        self._backlog = 0.0        # background work arrived and not yet served
        self._wake_at = inf

    # -------------------------------------------------------------- public
    def request(self, now: float, service: float, callback=None, source=None) -> None:
        """`service` seconds of work arriving at `now`; callback(t) when it is
        done. Requests of one `source` (an SM) are served one at a time, in
        order, each sharing the bandwidth with other sources' while it is."""
        self.busy += service
        self._advance(now)
        if source is not None:
            queue = self._queues.get(source)
            if queue is not None:
                queue.append((service, callback))
                return
            self._queues[source] = deque()
            if source in self._bg_sources:
                self._overlap += 1
        tag = self._v + service
        heappush(self._jobs, (tag, next(self._order), callback, source))
        self._wake()

    def served_by(self, now: float) -> float:
        """When the background that has arrived by `now` is served, at the
        full rate: fast-forwarded work waits for its own backlog, not for
        the real requests in flight beside it (always some on a saturated
        HBM: waiting for those too, every ghost batch of an HBM-bound copy
        ended late and the fast path came out 10-18% slow)."""
        self._advance(now)
        self._wake()
        return now + self._backlog

    def idle(self, now: float) -> bool:
        """Nothing in flight, waiting or in the backlog at `now`."""
        self._advance(now)
        self._wake()
        return not self._jobs and not self._backlog

    def add_background(self, start: float, end: float, busy: float, source=None):
        """`busy` seconds of fast-forwarded work arriving evenly over [start,
        end] (start is the present). Returns a handle for cancel_background,
        or None when there is nothing to cancel.

        Streams of one `source` (an SM's port, as its real requests give)
        count as one requester, and none while that source has a real
        request in service (it is one of those already): an SM's requests
        pass its port one at a time, whichever of its CTAs they come from.
        Counted per stream, an SM whose two CTAs skipped weighed twice as
        much as an SM whose two CTAs were being timed: while L2's backlog
        drained, each real request got 1/(streams + n) of L2 (1/262), half
        of what its SM would have had, and CTAs timed then took 2x the
        period (2130-2180 against the full simulation's 1070-1090 ns) and
        kept it for the rest of their loop (fa2 64x64 w4 s3 B2 H16 N8192
        D128; with per-chunk skip load, core._skip_in_place, skips alone
        +0.5% counted per stream, +1.0% per SM, +0.1% per SM but not while
        its port has a request in service)."""
        if busy <= 0.0:
            return None
        self.busy += busy
        self._advance(start)
        if end <= start:
            self._backlog += busy
            return None
        # end, utilisation, still arriving, (a tie-break), source
        entry = [end, busy / (end - start), True, next(self._order), source]
        heappush(self._bg, entry)
        self._bg_load += entry[1]
        self._stream_started(source)
        self._wake()
        return entry

    def _stream_started(self, source) -> None:
        if source is None:
            self._bg_streams += 1
            return
        sources = self._bg_sources
        n = sources.get(source, 0)
        if n == 0:
            self._bg_streams += 1
            if source in self._queues:
                self._overlap += 1
        sources[source] = n + 1

    def _stream_ended(self, source) -> None:
        if source is None:
            self._bg_streams -= 1
            return
        sources = self._bg_sources
        n = sources[source] - 1
        if n == 0:
            del sources[source]
            self._bg_streams -= 1
            if source in self._queues:
                self._overlap -= 1
        else:
            sources[source] = n

    def cancel_background(self, entry, now: float) -> None:
        """Stop a background stream at `now`: what arrived until then stays,
        the rest never comes (the engine re-times that work)."""
        if entry is None or not entry[2] or entry[0] <= now:
            return
        self._advance(now)
        entry[2] = False
        self._bg_load -= entry[1]
        self._stream_ended(entry[4])
        self.busy -= entry[1] * (entry[0] - now)
        self._wake()

    # ------------------------------------------------------------ internal
    def _advance(self, now: float) -> None:
        """Bring the state from self._t to `now`, letting requests leave on the way.
        Each pass takes the rates now -- every real request gets (1 - fair) / n
        of the server, fair = streams / (streams + n) being the background's
        max-min share (streams: the sources it comes from that have no real
        request in service, add_background), or (1 - load) / n when the background asks less than
        that and has no backlog; the backlog grows at load - fair -- and runs to
        the next change at those rates: a departure, a stream's end or an
        emptied backlog. (Written out inline, here and in _wake: this is the
        engine's hottest code.)"""
        jobs, bg = self._jobs, self._bg
        if now <= self._t and (not jobs or jobs[0][0] > self._v + self.EPSILON + 1e-12 * self._v):
            # nothing to do: the state holds at `now` already (a burst of
            # requests at one instant calls this for each; a quarter of the
            # calls in a causal fa2 prediction) -- streams that end by now
            # left at the last call, and no request in service has its tag
            return
        while True:
            # the rates now
            n, load, backlog = len(jobs), self._bg_load, self._backlog
            if n == 0:
                rate = 0.0
                growth = load - 1.0 if (backlog > 0.0 or load > 1.0) else 0.0
            else:
                streams = (self._bg_streams - self._overlap) or (1 if backlog > 0.0 or load > 0.0 else 0)
                fair = streams / (streams + n)
                if backlog > 0.0 or load > fair:
                    rate, growth = (1.0 - fair) / n, load - fair
                else:
                    rate, growth = (1.0 - load) / n, 0.0
            # the next change at those rates, at most `now`
            t = self._t
            t1 = bg[0][0] if bg else inf
            if n and rate > 0.0:
                d = jobs[0][0] - self._v
                c = t + (d if d > 0.0 else 0.0) / rate
                if c < t1:
                    t1 = c
            if growth < 0.0 and backlog > 0.0:
                c = t - backlog / growth
                if c < t1:
                    t1 = c
            if t1 > now:
                t1 = now
            span = t1 - t
            if span > 0.0:
                self._v += rate * span
                backlog = backlog + growth * span
                self._backlog = backlog if backlog > 1e-15 else 0.0
                self._t = t1
            changed = False
            while bg and bg[0][0] <= t1:
                ended = heappop(bg)
                if ended[2]:
                    self._bg_load -= ended[1]
                    self._stream_ended(ended[4])
                changed = True
            if not bg:
                self._bg_load, self._bg_streams = 0.0, 0
                self._bg_sources.clear()
                self._overlap = 0
            if jobs:
                v0 = self._v
                v = v0 + self.EPSILON + 1e-12 * v0
                t = self._t
                # due: its tag reached, or its departure rounds to this instant
                # (at t ~ 0.2 s one ulp is 3e-17 s: a step below it adds nothing)
                while jobs and (jobs[0][0] <= v or (rate > 0.0 and t + (jobs[0][0] - v0) / rate <= t1)):
                    _, _, callback, source = heappop(jobs)
                    changed = True
                    if source is not None:
                        queue = self._queues[source]
                        if queue:
                            service, later = queue.popleft()
                            heappush(jobs, (v0 + service, next(self._order), later, source))
                        else:
                            del self._queues[source]
                            if source in self._bg_sources:
                                self._overlap -= 1
                    if callback is not None:
                        callback(t1)
            if t1 >= now and not changed:
                return

    def _wake(self) -> None:
        """Make sure the server wakes at its next departure (or at a rate
        change before it); a wake-up that finds nothing due just advances.
        (The rates and the next change as in _advance.)"""
        jobs = self._jobs
        if not jobs:
            return
        n, load, backlog = len(jobs), self._bg_load, self._backlog
        streams = (self._bg_streams - self._overlap) or (1 if backlog > 0.0 or load > 0.0 else 0)
        fair = streams / (streams + n)
        if backlog > 0.0 or load > fair:
            rate, growth = (1.0 - fair) / n, load - fair
        else:
            rate, growth = (1.0 - load) / n, 0.0
        bg = self._bg
        t = bg[0][0] if bg else inf
        if rate > 0.0:
            d = jobs[0][0] - self._v
            c = self._t + (d if d > 0.0 else 0.0) / rate
            if c < t:
                t = c
        if growth < 0.0 and backlog > 0.0:
            c = self._t - backlog / growth
            if c < t:
                t = c
        if t >= self._wake_at or t == inf:
            return
        self._wake_at = t
        env = self.env
        event = Timeout.__new__(Timeout)
        event.env = env
        event.callbacks = [self._on_wake]
        event._value = None
        event._delay = t - env._now
        event._ok = True
        heappush(env._queue, (t, NORMAL, next(env._eid), event))

    def _on_wake(self, event) -> None:
        now = self.env._now
        if now >= self._wake_at:
            self._wake_at = inf
        self._advance(now)
        self._wake()


class Barrier:
    """A counting barrier: Arrive adds tokens, Wait takes them or blocks.
    Stands for mbarriers (TMA completion, ring slots) and named barriers."""

    __slots__ = ("env", "tokens", "waiters")

    def __init__(self, env, tokens: int = 0):
        self.env = env
        self.tokens = tokens
        self.waiters: list = []

    def arrive(self, count: int = 1) -> None:
        self.tokens += count
        while self.waiters and self.tokens >= self.waiters[0][0]:
            need, event = self.waiters.pop(0)
            self.tokens -= need
            event.succeed()

    def arrive_one(self, _event) -> None:
        """arrive(1), as an event's callback (a copy engine's tile has landed)."""
        self.arrive(1)

    def take(self, count: int = 1):
        """None if the tokens are there (taken), else an event to wait on."""
        if not self.waiters and self.tokens >= count:
            self.tokens -= count
            return None
        event = self.env.event()
        self.waiters.append((count, event))
        return event
