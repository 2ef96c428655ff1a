"""FIFO servers and barriers: the engine's two synchronisation primitives.

A Server is a unit of fixed throughput (tensor cores, SFU, HBM, ...). Work
is given as service time; requests are served in arrival order, so a request
arriving at `now` finishes at max(now, free_at) + service. Reserving at
request time costs one SimPy event per operation (the caller's timeout)
instead of a request/hold/release triple.

Background load stands for work the engine fast-forwarded instead of
simulating: it arrives as a fluid over its window and is queued in FIFO
order with the real requests, so it delays them only when the two together
exceed the server's rate.
"""
from __future__ import annotations

import heapq

class Server:
    __slots__ = ("name", "free_at", "busy", "_bg", "_bg_load", "_bg_since")

    def __init__(self, name: str):
        self.name = name
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
