"""FIFO servers and barriers: the engine's two synchronisation primitives.

A Server is a unit of fixed throughput (tensor cores, SFU, HBM, ...). Work
is given as service time; requests are served in arrival order, so a request
arriving at `now` finishes at max(now, free_at) + service. Reserving at
request time costs one SimPy event per operation (the caller's timeout)
instead of a request/hold/release triple.

Background load stands for work the engine fast-forwarded instead of
simulating: for its window, that work keeps `utilisation` of the server
busy, and real requests are served at the remaining rate.
"""
from __future__ import annotations

import heapq

# Fast-forwarded work never takes the whole server: real requests keep at
# least 5% of it, so a skipped CTA cannot stall its neighbours forever.
MAX_BACKGROUND = 0.95


class Server:
    __slots__ = ("name", "free_at", "busy", "_bg", "_bg_load")

    def __init__(self, name: str):
        self.name = name
        self.free_at = 0.0
        self.busy = 0.0  # seconds of service given, real and background
        self._bg: list[tuple[float, float]] = []  # heap of (end, utilisation)
        self._bg_load = 0.0

    def serve(self, now: float, service: float) -> float:
        """Queue `service` seconds of work arriving at `now`; return its end time."""
        self.busy += service
        if self._bg:
            load = self._background(now)
            if load > 0.0:
                service /= 1.0 - load
        start = self.free_at if self.free_at > now else now
        self.free_at = start + service
        return self.free_at

    def add_background(self, start: float, end: float, busy: float) -> None:
        """`busy` seconds of fast-forwarded work spread evenly over [start, end]."""
        if busy <= 0.0:
            return
        self.busy += busy
        if end <= start:
            return
        heapq.heappush(self._bg, (end, busy / (end - start)))
        self._bg_load += busy / (end - start)

    def _background(self, now: float) -> float:
        bg = self._bg
        while bg and bg[0][0] <= now:
            self._bg_load -= heapq.heappop(bg)[1]
        if not bg:
            self._bg_load = 0.0
        return min(MAX_BACKGROUND, self._bg_load)


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

    def take(self, count: int = 1):
        """None if the tokens are there (taken), else an event to wait on."""
        if not self.waiters and self.tokens >= count:
            self.tokens -= count
            return None
        event = self.env.event()
        self.waiters.append((count, event))
        return event
