"""Exact accounting of a schedule, by walking its operations.

FLOPs, bytes requested from global memory per tensor, the compulsory HBM
bytes (every tensor the schedule reads, read once; every tensor it writes,
written once), SMEM per CTA. The same ops feed the simulator: there is no
second formula. CTAs that differ only in which (batch, head) they touch are
counted once and multiplied (Launch.classes), and so are loop iterations of
equal Loop.key; both are exact by the schedules' contract.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from .ops import Alu, Exp, Load, Loop, Mma, SmemIO, Store
from .schedule import Launch, Schedule


@dataclass
class LaunchCounts:
    name: str
    grid: int
    threads: int
    smem_bytes: int
    regs_per_thread: int
    flops_matmul: int = 0
    flops_exp: int = 0
    flops_alu: int = 0
    smem_io_bytes: int = 0
    load_bytes: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    store_bytes: dict[str, int] = field(default_factory=lambda: defaultdict(int))


@dataclass
class Counts:
    launches: list[LaunchCounts]
    compulsory_read_bytes: int
    compulsory_write_bytes: int

    def _total(self, attr: str) -> int:
        return sum(getattr(lc, attr) for lc in self.launches)

    @property
    def flops_matmul(self) -> int:
        return self._total("flops_matmul")

    @property
    def flops_exp(self) -> int:
        return self._total("flops_exp")

    @property
    def flops_alu(self) -> int:
        return self._total("flops_alu")

    @property
    def smem_io_bytes(self) -> int:
        return self._total("smem_io_bytes")

    def _by_tensor(self, attr: str) -> dict[str, int]:
        out: dict[str, int] = defaultdict(int)
        for lc in self.launches:
            for name, n in getattr(lc, attr).items():
                out[name] += n
        return dict(out)

    @property
    def load_bytes(self) -> dict[str, int]:
        """Bytes requested from global memory (L2), per tensor."""
        return self._by_tensor("load_bytes")

    @property
    def store_bytes(self) -> dict[str, int]:
        return self._by_tensor("store_bytes")

    @property
    def global_read_bytes(self) -> int:
        return sum(self.load_bytes.values())

    @property
    def global_write_bytes(self) -> int:
        return sum(self.store_bytes.values())

    @property
    def smem_bytes_per_cta(self) -> int:
        return max(lc.smem_bytes for lc in self.launches)


def _walk_into(items, acc: LaunchCounts, mult: int) -> None:
    for op in items:
        kind = type(op)
        if kind is Loop:
            _walk_loop(op, acc, mult)
        elif kind is Mma:
            acc.flops_matmul += op.flops * mult
        elif kind is Load:
            acc.load_bytes[op.tile.tensor] += op.nbytes * mult
        elif kind is Store:
            acc.store_bytes[op.tile.tensor] += op.nbytes * mult
        elif kind is Exp:
            acc.flops_exp += op.count * mult
        elif kind is Alu:
            acc.flops_alu += op.flops * mult
        elif kind is SmemIO:
            acc.smem_io_bytes += op.nbytes * mult


def _walk_loop(loop: Loop, acc: LaunchCounts, mult: int) -> None:
    """A run of iterations with equal Loop.key has equal ops, nested loops
    included (tests/test_engine.py holds the schedules to that): walk the
    first of each run and multiply, which keeps FA1's trips x trips nest of
    16k iterations per CTA at N=16k to a handful of walks."""
    key_of, trips = loop.key, loop.trips
    if key_of is None:
        for i in range(trips):
            _walk_into(loop.body(i), acc, mult)
        return
    i = 0
    while i < trips:
        key, end = key_of(i), i + 1
        while end < trips and key_of(end) == key:
            end += 1
        _walk_into(loop.body(i), acc, mult * (end - i))
        i = end


def count_launch(launch: Launch) -> LaunchCounts:
    acc = LaunchCounts(launch.name, launch.grid, launch.threads, launch.smem_bytes,
                       launch.regs_per_thread)
    seen = 0
    for cta, mult in launch.classes():
        seen += mult
        for role in launch.program(cta).roles:
            _walk_into(role.items, acc, mult)
    assert seen == launch.grid, f"{launch.name}: classes cover {seen} of {launch.grid} CTAs"
    acc.load_bytes, acc.store_bytes = dict(acc.load_bytes), dict(acc.store_bytes)
    return acc


def count(schedule: Schedule) -> Counts:
    launches = [count_launch(launch) for launch in schedule.launches]
    read = {name for lc in launches for name in lc.load_bytes}
    written = {name for lc in launches for name in lc.store_bytes}
    tensors = schedule.tensors
    unknown = (read | written) - tensors.keys()
    assert not unknown, f"{schedule.algo}: ops touch undeclared tensors {sorted(unknown)}"
    # thread stacks (register spills) are scratch that never needs to reach HBM
    scratch = {t for t in tensors if tensors[t].kind == "local"}
    return Counts(launches,
                  compulsory_read_bytes=sum(tensors[t].nbytes for t in read - scratch),
                  compulsory_write_bytes=sum(tensors[t].nbytes for t in written - scratch))
