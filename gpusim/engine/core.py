"""Replay a Schedule on a HardwareProfile with SimPy.

Granularity is the tile operation. Each SM has FIFO servers for its tensor
cores, special-function unit (exp2), FMA pipe, shared memory and its port to
L2; L2 and HBM bandwidth are servers shared by all SMs (memory.py). CTAs are
dispatched in launch order to free slots (slot order: SM 0..n-1 for the first
CTA of each SM, then second CTAs, ...) as residency allows; each warp role of
a CTA is a SimPy process interpreting its ops:

- Mma / Exp / Alu / SmemIO occupy their unit for work ÷ rate; a role with
  fewer than 4 warps reaches only warps/4 of the SM's rate (an SM has four
  sub-partitions and a warp runs on one). Async Mma (wgmma) keeps going;
  MmaWait waits for all but the last `pending`. StepLatency: the role waits
  out a flash step's chain latency (profile) holding no unit; IssueStalls:
  the stall clocks ptxas scheduled into straight-line code, the same way;
  DescriptorSetup: device-side TMA descriptors built at a CTA's start (profile).
- Load: plain loads stall the role until the bytes arrive, or, given
  barriers, signal them as cp.async and TMA loads do (independent loads a
  Wait takes together: FA1's); those signal their barriers on arrival (TMA
  adds its extra latency).
- Store: through the SM port into L2 (write-back); the CTA ends after its
  last store has left the SM.
- Arrive / Wait: counting barriers (mbarriers, named barriers).

Fast path (fast=True), in two levels, both extrapolating measured time:
1. Loop fast-forward (skipping.py): once a loop's iterations repeat, a CTA
   waits out the rest of the run at the measured period, its work a
   background load on the units and its tiles passed through L2.
2. CTA ghosting (ghosting.py): once a cost class's CTAs take the same time
   under steady contention, later ones hold their slot for that time, their
   work a background load; the launch's last waves are simulated.
Engine mixes both in. Fast-forwarded work loads the units as background
(_background) and waits for what they have not served (_served_by), here.
fast=False simulates every operation; tests hold the two paths together.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from heapq import heappush
from math import fsum

import simpy
from simpy.events import NORMAL, Timeout

from algorithms.ops import (LD, TMA, Alu, Arrive, DescriptorSetup, Exp, IssueStalls, Load, Loop, Mma, MmaWait, SmemIO,
                            StepLatency, Store, SyncThreads, Wait)
from algorithms.problem import DTYPE_BYTES
from algorithms.schedule import Launch, Schedule

from ..occupancy import WARP_SIZE
from .counters import (ALU, DISPATCH_UNIT, GLOBAL_UNITS, HBM, L2, MISS, N_COUNTERS, PORT, REQ, SCRATCH, SFU,
                       SM_UNITS, SMEM, STORE, TENSOR, UNITS)
from .environment import EngineEnvironment
from .ghosting import GHOST_SAMPLES, CtaGhosting
from .memory import MemorySystem
from .servers import Barrier, Server
from .skipping import LoopSkipping, _Together

SUBPARTITIONS = 4           # an SM's warp schedulers, each with 1/4 of its units
# A run is bottlenecked by a unit busy at least half of the time; below that
# no unit is saturated and latency (too little work in flight) bounds it.
SATURATION = 0.5



@dataclass
class LaunchResult:
    name: str
    runtime_s: float
    unit_busy: dict[str, float]
    bottleneck: str
    bottleneck_share: float
    ctas_simulated: int = 0
    ctas_ghosted: int = 0


@dataclass
class SimResult:
    runtime_s: float
    requested_bytes: int
    store_bytes: int
    hbm_read_bytes: int
    hbm_write_bytes: int          # everything the run writes, its dirty lines in L2 at the end included
    l2_hit_rate: float
    unit_busy: dict[str, float]
    bottleneck: str
    bottleneck_share: float
    launches: list[LaunchResult] = field(default_factory=list)
    events: int = 0
    l2_dirty_at_end_bytes: int = 0  # ... of which L2 still held this much dirty when it ended


def bottleneck_of(busy: dict[str, float]) -> tuple[str, float]:
    unit = max(busy, key=lambda u: (busy[u], u))
    if busy[unit] < SATURATION:
        return "latency", 1.0 - busy[unit]
    return unit, busy[unit]


class _SM:
    __slots__ = ("index", "units", "tensor", "sfu", "alu", "smem", "port", "skippers", "residents_changed",
                 "dispatch")

    def __init__(self, index: int):
        self.index = index
        self.dispatch = Server(DISPATCH_UNIT)   # launches its CTAs' warps, one after another (_run_cta)
        self.residents_changed = 0      # _disturb calls so far: iterations timed across one are mixed
        # wait events of CTAs skipping loop iterations here, in the order they
        # began (a dict, not a set: a set of events iterates in memory-address
        # order, which made predictions differ from one process to the next)
        self.skippers: dict = {}
        self.units = [Server(name) for name in SM_UNITS]
        self.tensor, self.sfu, self.alu, self.smem, self.port = self.units


class _Role:
    __slots__ = ("name", "index", "warps", "factor", "pending", "c", "keys", "stores")

    def __init__(self, name: str, index: int, warps: int, keys: dict):
        self.name = name
        self.index = index                # its place among the CTA's roles
        self.warps = warps
        self.factor = min(1.0, warps / SUBPARTITIONS)
        # its warps issue stores at a rate of their own (l2.sm_store_bytes_per_clk_per_warp),
        # in order, beside the SM's write path that every role's stores share
        self.stores = Server("role_stores")
        self.pending: list[float] = []
        self.c = [0.0] * N_COUNTERS       # real + extrapolated work
        # (loop name, trips) -> [key(i) for every i] of this role's top-level
        # loops, shared by the CTAs of its cost class (equal costs, equal keys)
        self.keys = keys


class _Cta:
    __slots__ = ("sm", "barriers", "last_store", "roles", "env", "stores", "all_stored", "together", "arrivals",
                 "exact", "carries", "issued_at", "issued_left", "index")

    def __init__(self, sm, barriers, env, index: int = -1):
        self.sm = sm
        self.index = index          # its place in the launch's order
        self.exact = False          # simulate every iteration (Engine._round_trip)
        self.carries = False        # its loop carries tiles through L2: skips replay them in small chunks (_chunks)
        self.arrivals: dict = {}    # (signal, engine) -> a load's then(t) (Engine._load)
        self.together = None        # a _Together for multi-role CTAs (set by _run_cta)
        self.barriers = barriers
        self.last_store = 0.0
        self.roles: list[_Role] = []
        self.env = env
        self.stores = 0             # stores the SM has not yet handed to L2
        self.all_stored = None      # an event the CTA's end waits on, while some are out
        # a product its warpgroups issue together (Mma.issued_with): when the
        # first was issued, and how many of the others are still to come
        self.issued_at = -1.0
        self.issued_left = 0

    def stored(self, t: float) -> None:
        """A store has left the SM at t."""
        if t > self.last_store:
            self.last_store = t
        self.stores -= 1
        if self.stores == 0 and self.all_stored is not None:
            self.env.trigger_at(self.all_stored, self.last_store)


class Engine(LoopSkipping, CtaGhosting):
    def __init__(self, schedule: Schedule, gpu, fast: bool = True, tracer=None, slices: int = 1,
                 progress=None):
        """slices: the schedule is one of that many equal parts of the run
        (gpusim/symmetry.py); the engine gives it that share of the SMs, of
        L2's capacity and of L2's and HBM's bandwidth. progress(done, total):
        called as CTAs are dispatched (simulated or fast-forwarded), counted
        over all launches; it only watches."""
        self.schedule, self.gpu, self.fast, self.tracer = schedule, gpu, fast, tracer
        self.progress = progress
        self.ctas_total = sum(launch.grid for launch in schedule.launches)
        self.ctas_before = 0        # of the launches before the running one
        self.env = EngineEnvironment()
        self.mem = MemorySystem(gpu, self.env, slices)
        self.mem.footprint = schedule.global_bytes
        self.mem.scratch = {name for name, t in schedule.tensors.items() if t.kind == "local"}
        self.sms = [_SM(i) for i in range(gpu.gpu.sm_count // slices)]
        clock = gpu.clock_hz
        # SMs differ in their round trip to L2 (calibrate.py latency_per_sm:
        # 278-302 cycles on an H200, alike within a TPC, apart by GPC). Alike,
        # the CTAs of a launch stayed in lock-step for good and met at L2 at
        # every step: fa2 128x64 w8 with two stages at D = 128, its copy
        # waited for as it is issued, took 399 us a CTA at one CTA an SM
        # where the H200 took 303 (fa2_stamps.py lone), as the H100's first
        # wave did (378 us) before its CTAs drifted apart (295 us from the
        # third wave on). A part of the GPU (slices) takes every slices-th SM's.
        # The shipped profiles leave them out ([]): with them the fast path
        # parted from the full simulation by up to 8% (validation_notes.md,
        # session 28).
        offsets = gpu.l2.sm_latency_offsets_cycles
        if offsets:
            for sm in self.sms:
                sm.port.latency_extra = offsets[sm.index * slices % len(offsets)] / clock
        self.exp_rate = gpu.units.exp2_per_clk_per_sm * clock
        self.alu_rate = gpu.units.alu_ops_per_clk_per_sm * clock
        self.smem_rate = gpu.units.smem_bytes_per_clk_per_sm * clock
        # the flash step's serial fraction and chain latency, measured apart
        # for fp8 products: faster products, the same softmax and a little
        # more of it (P converted to e4m3) make them 0.64 and 137 cycles
        # against bf16's 0.52 and 110 (calibrate.py dot_chain_fp8, session 40;
        # h100.measured)
        fp8 = schedule.problem.dtype == "fp8"
        units = gpu.units
        self.tensor_alu_serial = units.tensor_alu_serial_fraction_fp8 if fp8 else units.tensor_alu_serial_fraction
        self.tma_extra = gpu.copy.tma_extra_latency_cycles / clock
        self.step_latency = (units.flash_step_latency_cycles_fp8 if fp8 else units.flash_step_latency_cycles) / clock
        self.clock = clock
        self.launch_gap = gpu.launch.kernel_launch_us * 1e-6
        self.cta_turnover = gpu.launch.cta_turnover_cycles / clock
        self.warp_dispatch = gpu.launch.warp_dispatch_cycles / clock
        self.store_s_per_warp_byte = 1.0 / (gpu.l2.sm_store_bytes_per_clk_per_warp * clock)
        self._mma_rates: dict[tuple, float] = {}
        self._wgmma_smem: dict[tuple, float] = {}
        self._mma_cost_cache: dict[tuple, tuple[float, float]] = {}
        self._mma_by_op: dict[int, tuple] = {}      # id(op) -> (op, factor, warps, costs)
        # a shared access sequence's loads, by the sequence (_ghost_load_segments)
        self._shared_loads: dict[int, tuple] = {}
        self.totals = [0.0] * N_COUNTERS
        self.events = 0
        self._ops = {Mma: self._mma, Load: self._load, Store: self._store, Exp: self._exp,
                     Alu: self._alu, SmemIO: self._smem, MmaWait: self._mma_wait,
                     StepLatency: self._step_latency, IssueStalls: self._issue_stalls,
                     DescriptorSetup: self._descriptor_setup,
                     Arrive: self._arrive, Wait: self._wait, SyncThreads: self._nothing}
        if tracer is None:
            self._ops.update({Mma: self._mma_fast, Exp: self._exp_fast, Alu: self._alu_fast,
                              SmemIO: self._smem_fast})

    # ------------------------------------------------------------------ ops
    def _mma_rate(self, kind: str, dtype: str, warps_factor: float, num_warps: int) -> float:
        key = (kind, dtype, warps_factor, num_warps)
        rate = self._mma_rates.get(key)
        if rate is None:
            resolved = self.gpu.resolve_mma(kind, num_warps)
            rate = self.gpu.matmul_flops_per_s_per_sm(resolved, dtype) * warps_factor
            self._mma_rates[key] = rate
        return rate

    def _wgmma_smem_s(self, op: Mma) -> float:
        """Seconds of SMEM bandwidth a wgmma's operand reads take (0 for mma.sync,
        whose operands the warps stage in registers with their own SmemIO)."""
        key = (op, self._num_warps)
        s = self._wgmma_smem.get(key)
        if s is None:
            s = 0.0
            if self.gpu.resolve_mma(op.kind, self._num_warps) == "wgmma":
                nbytes = op.count * self.gpu.wgmma_operand_bytes(
                    op.m, op.n, op.k, DTYPE_BYTES[op.dtype], op.a_in_smem, op.instr_n)
                s = nbytes / self.smem_rate
            self._wgmma_smem[key] = s
        return s

    def _unit(self, server: Server, slot: int, work_s: float, role: _Role, cta: _Cta, label):
        now = self.env._now
        end = server.serve(now, work_s)
        role.c[slot] += work_s
        if self.tracer is not None:
            self.tracer.slice(cta.sm.index, server.name, label, end - work_s, end)
        return end

    def _mma_costs(self, op: Mma, factor: float) -> tuple[float, float, bool]:
        """Seconds an Mma holds the tensor cores and the SMEM, and whether it
        can be asynchronous (wgmma; mma.sync holds its warps). wgmma streams its
        operands from SMEM as it computes: an operand-starved product holds the
        tensor pipe until its reads are done (other CTAs' products queue behind
        it, as in the wgmma_shape microbenchmark), and its reads share the SMEM
        with cp.async/TMA fills. Cached by the op's fields (algorithms build a
        fresh op every iteration; a field tuple hashes in C, the frozen
        dataclass in Python)."""
        # First by the op itself: schedules reuse one op for every step alike
        # (the entry holds the op, so its id stays its own)
        known = self._mma_by_op.get(id(op))
        if known is not None and known[0] is op and known[1] == factor and known[2] == self._num_warps:
            return known[3]
        key = (op.m, op.n, op.k, op.count, op.dtype, op.kind, op.a_in_smem, op.instr_n, factor,
               self._num_warps)
        costs = self._mma_cost_cache.get(key)
        if costs is None:
            rate = self._mma_rate(op.kind, op.dtype, factor, self._num_warps)
            smem_s = self._wgmma_smem_s(op)
            wgmma = self.gpu.resolve_mma(op.kind, self._num_warps) == "wgmma"
            costs = self._mma_cost_cache[key] = (max(op.flops / rate, smem_s), smem_s, wgmma)
        self._mma_by_op[id(op)] = (op, factor, self._num_warps, costs)
        return costs

    def _mma(self, op: Mma, role, cta):
        tensor_s, smem_s, can_be_async = self._mma_costs(op, role.factor)
        end = self._unit(cta.sm.tensor, TENSOR, tensor_s, role, cta, "mma")
        if smem_s:
            end = max(end, self._unit(cta.sm.smem, SMEM, smem_s, role, cta, "wgmma operands"))
        if op.is_async and can_be_async:
            if op.issued_with > 1:
                end = self._interleaved_end(op, cta, end, tensor_s)
            role.pending.append(end)
            return None
        return self.env.timeout(end - self.env._now)

    def _interleaved_end(self, op: Mma, cta: _Cta, end: float, tensor_s: float) -> float:
        """When a product that `op.issued_with` warpgroups issue together ends
        for this one: the tensor pipe interleaves their instructions, so the
        first issued ends when the last would have, served whole and in turn
        (the others queue behind it and end there anyway). A FIFO of whole
        products let the first warpgroup start its softmax a product early,
        beside the second's: the 8-warp one-CTA dot_chain steps came out
        13% short (128x64x128: 1446 cycles against 1664 measured; 128x64x64:
        1016 against 1177), -6.9% and -2.4% this way."""
        now = self.env._now
        if cta.issued_at == now and cta.issued_left > 0:
            cta.issued_left -= 1
            return end
        cta.issued_at, cta.issued_left = now, op.issued_with - 1
        return end + (op.issued_with - 1) * tensor_s

    def _exp(self, op: Exp, role, cta):
        work = op.count / (self.exp_rate * role.factor)
        end = self._unit(cta.sm.sfu, SFU, work, role, cta, "exp2")
        self._block_tensor_cores(work, role, cta)
        return self.env.timeout(end - self.env._now)

    def _alu(self, op: Alu, role, cta):
        work = op.flops / (self.alu_rate * role.factor)
        end = self._unit(cta.sm.alu, ALU, work, role, cta, "alu")
        self._block_tensor_cores(work, role, cta)
        return self.env.timeout(end - self.env._now)

    # The same four ops without a tracer: _unit inlined (a call less per unit)
    # (Server.serve, inlined where it is called most: server.busy += work;
    # the background that arrived is queued; the work ends at
    # max(free_at, now) + work)
    def _mma_fast(self, op: Mma, role, cta):
        tensor_s, smem_s, can_be_async = self._mma_costs(op, role.factor)
        sm, c, now = cta.sm, role.c, self.env._now
        server = sm.tensor
        server.busy += tensor_s
        if server._bg and now > server._bg_since:
            server._queue_background(now)
        end = server.free_at
        end = server.free_at = (end if end > now else now) + tensor_s
        c[TENSOR] += tensor_s
        if smem_s:
            server = sm.smem
            server.busy += smem_s
            if server._bg and now > server._bg_since:
                server._queue_background(now)
            smem_end = server.free_at
            smem_end = server.free_at = (smem_end if smem_end > now else now) + smem_s
            c[SMEM] += smem_s
            if smem_end > end:
                end = smem_end
        if op.is_async and can_be_async:
            if op.issued_with > 1:
                end = self._interleaved_end(op, cta, end, tensor_s)
            role.pending.append(end)
            return None
        return self.env.timeout(end - now)

    def _exp_fast(self, op: Exp, role, cta):
        work = op.count / (self.exp_rate * role.factor)
        sm, c, now = cta.sm, role.c, self.env._now
        server = sm.sfu
        server.busy += work
        if server._bg and now > server._bg_since:
            server._queue_background(now)
        end = server.free_at
        end = server.free_at = (end if end > now else now) + work
        c[SFU] += work
        if self.tensor_alu_serial:
            blocked = work * self.tensor_alu_serial
            sm.tensor.serve(now, blocked)
            c[TENSOR] += blocked
        return self.env.timeout(end - now)

    def _alu_fast(self, op: Alu, role, cta):
        work = op.flops / (self.alu_rate * role.factor)
        sm, c, now = cta.sm, role.c, self.env._now
        end = sm.alu.serve(now, work)
        c[ALU] += work
        if self.tensor_alu_serial:
            blocked = work * self.tensor_alu_serial
            sm.tensor.serve(now, blocked)
            c[TENSOR] += blocked
        return self.env.timeout(end - now)

    def _smem_fast(self, op: SmemIO, role, cta):
        work = op.nbytes / self.smem_rate
        now = self.env._now
        end = cta.sm.smem.serve(now, work)
        role.c[SMEM] += work
        return self.env.timeout(end - now)

    def _block_tensor_cores(self, work_s: float, role, cta) -> None:
        """Elementwise work keeps the SM's tensor cores from running for
        `tensor_alu_serial` of its time (measured: experiments/calibrate.py
        dot_chain with the SM saturated), so MMAs queued behind it wait; the
        elementwise op itself is not delayed."""
        if self.tensor_alu_serial:
            self._unit(cta.sm.tensor, TENSOR, work_s * self.tensor_alu_serial, role, cta, "blocked")

    def _step_latency(self, op: StepLatency, role, cta):
        """The chain's latency: the role waits, the SM's units stay free for others."""
        return self.env.timeout(self.step_latency) if self.step_latency else None

    def _descriptor_setup(self, op: DescriptorSetup, role, cta):
        """Device-side TMA descriptors built one after the other: the role waits, no unit is held."""
        cycles = op.count * self.gpu.copy.tma_descriptor_setup_cycles
        return self.env.timeout(cycles / self.clock) if cycles > 0 else None

    def _issue_stalls(self, op: IssueStalls, role, cta):
        """Straight-line code's scheduled stalls: the role waits, no unit is held."""
        return self.env.timeout(op.cycles / self.clock) if op.cycles > 0 else None

    def _smem(self, op: SmemIO, role, cta):
        end = self._unit(cta.sm.smem, SMEM, op.nbytes / self.smem_rate, role, cta, "smem")
        return self.env.timeout(end - self.env._now)

    def _mma_wait(self, op: MmaWait, role, cta):
        pending = role.pending
        if len(pending) <= op.pending:
            return None
        done = pending[len(pending) - op.pending - 1]
        del pending[: len(pending) - op.pending]
        now = self.env._now
        return self.env.timeout(done - now) if done > now else None

    def _count_transfer(self, role: _Role, nbytes: int, port_s_per_byte: float) -> None:
        c = role.c
        c[PORT] += nbytes * port_s_per_byte
        c[L2] += nbytes * self.mem.l2_s_per_byte

    def _load(self, op: Load, role, cta):
        env = self.env
        now = env._now
        mem, nbytes, engine = self.mem, op.nbytes, op.engine
        event = None
        if engine == LD and not op.signal:
            event = simpy.Event(env)
            arrived = self._ld_arrival(event, op.slack / self.clock)    # the warp's own work meanwhile
        elif op.signal:
            # (cp.async, TMA, or plain loads the warp issues back to back and
            # a Wait then takes together: FA1's)
            # one callback per CTA, barriers and engine (built per load, its
            # closure's cells were a fifth of a load's cost)
            arrived = cta.arrivals.get((op.signal, engine))
            if arrived is None:
                arrived = cta.arrivals[op.signal, engine] = self._signal_arrival(cta, op.signal, engine)
        else:
            arrived = _ignore
        if self.tracer is not None:
            arrived = self._traced_arrival(arrived, cta, op, now)
        sm = cta.sm
        missed = mem.load(now, sm.port, op.tile, nbytes, arrived)
        c = role.c
        c[REQ] += nbytes
        # self._count_transfer(role, nbytes, mem.port_s_per_byte), inlined
        c[PORT] += nbytes * mem.port_s_per_byte
        c[L2] += nbytes * mem.l2_s_per_byte
        if missed:
            c[MISS] += missed
            c[HBM] += missed * mem.hbm_s_per_byte
        if engine != LD:
            # cp.async and TMA deposit the tile in SMEM: its write bandwidth is
            # the same the wgmma operand reads use. calibrate.py dot_fill (two
            # CTAs an SM) has a streamed tile cost 0.54-0.80 of its bytes' time
            # beside the operand reads, so this full charge is 4-18% over those
            # rows; charged at 0.7, fa2's ranking got worse (validation_notes.md,
            # session 36; tests/test_wgmma_operands.py).
            work = nbytes / self.smem_rate
            if self.tracer is None:     # (self._unit, inlined)
                sm.smem.serve(now, work)
                c[SMEM] += work
            else:
                self._unit(sm.smem, SMEM, work, role, cta, "smem fill")
        return event

    def _ld_arrival(self, event, early: float):
        """then(t) of a plain load: the warp waits for the bytes, less its own work meanwhile."""
        env = self.env

        def arrived(t):
            env.trigger_at(event, t - early)
        return arrived

    def _signal_arrival(self, cta: _Cta, signal, engine: str):
        """then(t) of a cp.async/TMA load signalling the CTA's barriers `signal`
        (TMA adds its extra latency)."""
        env = self.env
        extra = self.tma_extra if engine == TMA else 0.0
        if len(signal) == 1:     # (the usual case: no list of barriers to build)
            arrive = cta.barriers[signal[0]].arrive_one
        else:
            barriers = [cta.barriers[name] for name in signal]

            def arrive(_event, bs=barriers):
                for b in bs:
                    b.arrive(1)
        queue, eid = env._queue, env._eid

        def arrived(t):
            # env.call_at(t + extra, arrive), inlined
            t = t + extra
            now = env._now
            delay = t - now if t > now else 0.0
            arrival = Timeout.__new__(Timeout)
            arrival.env = env
            arrival.callbacks = [arrive]
            arrival._value = None
            arrival._delay = delay
            arrival._ok = True
            heappush(queue, (now + delay, NORMAL, next(eid), arrival))
        return arrived

    def _traced_arrival(self, deliver, cta: _Cta, op: Load, now: float):
        """deliver(t), the load's slice traced first; a tracer with a load()
        method also learns the CTA and the tile (experiments/fa2_stamps.py)."""
        extra = self.tma_extra if op.engine == TMA else 0.0
        tracer, sm_index, tensor, engine = self.tracer, cta.sm.index, op.tile.tensor, op.engine
        per_load = getattr(tracer, "load", None)

        def arrived(t):
            tracer.slice(sm_index, f"load {engine}", tensor, now, t + extra)
            if per_load is not None:
                per_load(sm_index, cta.index, op.tile, now, t + extra)
            deliver(t)
        return arrived

    def _store(self, op: Store, role, cta):
        """A store leaves the SM once its warps have issued it, at their own
        rate (one 4-warp CTA alone: 15.9-16.1 B/clk, calibrate.py
        store_overlap), and the SM's write path, shared by all its CTAs, has
        passed it (31.8 B/clk, l2_store, which 8 warps reach): stores are
        posted, the role goes on (store_overlap: a chain of FMAs beside them
        takes the longer of the two)."""
        now = self.env._now
        cta.stores += 1
        issued = role.stores.serve(now, op.nbytes * self.store_s_per_warp_byte / role.warps)
        self.mem.store(now, cta.sm.port, op.tile, op.nbytes, cta.stored, issued)
        role.c[SCRATCH if op.tile.tensor in self.mem.scratch else STORE] += op.nbytes
        self._count_transfer(role, op.nbytes, self.mem.store_s_per_byte)
        return None

    def _arrive(self, op: Arrive, role, cta):
        cta.barriers[op.barrier].arrive(op.count)
        return None

    def _wait(self, op: Wait, role, cta):
        return cta.barriers[op.barrier].take(op.count)

    def _nothing(self, op, role, cta):
        return None

    # ---------------------------------------------------------- interpreter
    def _run(self, items, role: _Role, cta: _Cta, top: bool = False):
        ops = self._ops
        for item in items:
            if item.__class__ is Loop:
                yield from self._loop(item, role, cta, top)
                continue
            event = ops[item.__class__](item, role, cta)
            if event is not None:
                self.events += 1
                yield event

    def _run_cta(self, launch: Launch, index: int, sm: _SM, cost_class):
        env = self.env
        program = launch.program(index)
        barriers = _Barriers(env)
        for name, tokens in program.barriers.items():
            barriers[name] = Barrier(env, tokens)
        cta = _Cta(sm, barriers, env, index)
        # What CTAs of one cost class share: their loop keys and how their roles skip
        known = self._class_cache.get(cost_class)
        if known is None:
            near, carried = self._round_trip(program) if self.fast else (False, False)
            known = self._class_cache[cost_class] = (self._together_plan(program),
                                                     [{} for _ in program.roles], near, carried)
        plan, role_keys, cta.exact, cta.carries = known
        if plan is not None and not cta.exact:
            cta.together = _Together(*plan)

        start = env._now
        if self.warp_dispatch > 0.0:
            # An SM launches its CTAs' warps one at a time: with many short CTAs
            # resident it starts a 4-warp CTA every 0.10 us and an 8-warp one
            # every 0.20 (calibrate.py cta_dispatch), which bounds launches of
            # many small CTAs (standard's softmax: one a row of S).
            yield env.timeout(sm.dispatch.serve(start, self.warp_dispatch * self._num_warps) - start)
        if self.cta_turnover > 0.0:
            # Starting and retiring a CTA holds its slot besides its warps'
            # launch (calibrate.py cta_cycle: a round of one empty CTA per SM,
            # less its warps' dispatch); no unit busy.
            yield env.timeout(self.cta_turnover)
        self._disturb(sm)
        procs = []
        for k, (spec, keys) in enumerate(zip(program.roles, role_keys)):
            state = _Role(spec.name, k, spec.warps, keys)
            cta.roles.append(state)
            procs.append(env.process(self._run(spec.items, state, cta, True)))
        yield env.all_of(procs)
        if cta.stores:
            cta.all_stored = simpy.Event(env)
            yield cta.all_stored
        if cta.last_store > env._now:
            yield env.timeout(cta.last_store - env._now)
        self._disturb(sm)
        totals = [fsum(slot) for slot in zip(*(role.c for role in cta.roles))]    # (each slot's, summed over roles)
        for s in range(N_COUNTERS):
            self.totals[s] += totals[s]
        if self.tracer is not None:
            self.tracer.slice(sm.index, "ctas", f"{launch.name} #{index}", start, env._now)
        return env._now - start, totals

    def _dispatched(self, upto: int) -> None:
        """The running launch's CTAs before `upto` are dispatched: tell progress."""
        if self.progress is not None:
            self.progress(self.ctas_before + upto, self.ctas_total)

    # ------------------- fast-forwarded work (skipping.py, ghosting.py)
    def _background(self, sm: _SM, start: float, end: float, busy) -> list:
        """Fast-forwarded work over [start, end] counts as busy time of the
        units it would have used (busy fractions, bottleneck) and loads them
        as background over the window: real requests beside it -- the SM's
        other CTAs, and every SM's requests to L2 and HBM -- are served at
        the rate it leaves. Without the global part, a machine of mostly
        fast-forwarded CTAs leaves HBM idle for the few real ones, whose
        shorter times then time the next ghosts (standard's PV GEMM came out
        at half of HBM's bound that way)."""
        handles = [server.add_background(start, end, busy[slot])
                   for server, slot in zip(sm.units, (TENSOR, SFU, ALU, SMEM, PORT))]
        handles.append(self.mem.l2.add_background(start, end, busy[L2], sm.port))
        handles.append(self.mem.hbm.add_background(start, end, busy[HBM], sm.port))
        return handles

    def _served_by(self, sm: _SM | None, work, hbm: bool = False, shared: bool = True) -> float:
        """When the units `work` loaded (the global ones, and this SM's unless
        `sm` is None; HBM also for the write-backs of its stores, or when
        `hbm`) have served what is queued. Loop skips check only the global
        units: on an SM, _disturb keeps their periods fair, and waiting for
        an SM unit's queue means waiting for the other CTAs' requests queued
        behind the skip's fluid (fa2 64x32 w4, five CTAs an SM: +10%)."""
        now = self.env._now
        servers = [] if sm is None else [
            server for server, slot in zip(sm.units, (TENSOR, SFU, ALU, SMEM, PORT)) if work[slot] > 0.0]
        if shared and work[L2] > 0.0:
            servers.append(self.mem.l2)
        if shared and (hbm or work[HBM] > 0.0 or work[STORE] > 0.0):
            servers.append(self.mem.hbm)
        return max((server.served_by(now) for server in servers), default=now)

    # ----------------------------------------------------------------- run
    def _launch(self, launch: Launch, ctas_per_sm: int, results: list):
        env = self.env
        yield env.timeout(self.launch_gap)
        self.mem.begin_launch()
        start = env._now
        busy0 = self._busy_snapshot()
        self._num_warps = -(-launch.threads // WARP_SIZE)
        # cost class -> (_together_plan, per-role loop keys, simulated in full, carries tiles: _round_trip)
        self._class_cache: dict = {}
        slots = [(slot, sm) for slot in range(ctas_per_sm) for sm in self.sms]
        self._slots = min(len(slots), launch.grid)    # CTAs that can run at once
        left: dict = {}     # class -> its CTAs not yet dispatched
        for rep, n in launch.classes():
            key = launch.cost_key(rep)
            left[key] = left.get(key, 0) + n
        # A class's wave: how many of its CTAs run at once, on average (its
        # share of the slots). A causal Q block of 64 has 128 CTAs at B4 H32
        # N4096, 6 of 396 slots at a time: waiting for two waves of the
        # launch (792) meant waiting for all of it, unless its CTAs agreed
        # by chance (fa2 64x32 w8: 4002 of 8192 CTAs simulated, 2994 now).
        wave = {key: max(GHOST_SAMPLES, round(len(slots) * n / launch.grid)) for key, n in left.items()}
        state = {"next": 0, "samples": {}, "slots": len(slots), "simulated": 0, "ghosted": 0,
                 "warm": False, "one_class": len(left) == 1, "left": left, "wave": wave,
                 # steady class -> the duration its ghosts take; slot-seconds
                 # of the undispatched CTAs of steady classes
                 "class_s": {}, "ahead_s": 0.0,
                 # when the next ghost CTA in launch order would start on the GPU (_ghost)
                 "ghost_clock": 0.0}
        procs = [env.process(self._slot(launch, sm, state)) for _, sm in slots]
        yield env.all_of(procs)
        # The launch ends when L2 and HBM have served its fast-forwarded work
        # (a ghost batch itself waits only for its SM's units: see _ghost).
        drained = max(self.mem.l2.served_by(env._now), self.mem.hbm.served_by(env._now))
        if drained > env._now:
            self.events += 1
            yield env.timeout(drained - env._now)
        runtime = env._now - start
        busy = self._busy_fractions(busy0, runtime)
        unit, share = bottleneck_of(busy)
        results.append(LaunchResult(launch.name, runtime, busy, unit, share,
                                    state["simulated"], state["ghosted"]))

    def _busy_snapshot(self) -> dict[str, float]:
        snap = {name: 0.0 for name in UNITS}
        for sm in self.sms:
            for server in sm.units:
                snap[server.name] += server.busy
            snap[DISPATCH_UNIT] += sm.dispatch.busy
        snap["l2_bandwidth"] = self.mem.l2.busy
        snap["hbm_bandwidth"] = self.mem.hbm.busy
        return snap

    def _busy_fractions(self, before: dict[str, float], runtime: float) -> dict[str, float]:
        now = self._busy_snapshot()
        n_sm = len(self.sms)
        out = {}
        for name in UNITS:
            span = runtime * (1 if name in GLOBAL_UNITS else n_sm)     # the others: each SM's
            out[name] = min(1.0, (now[name] - before[name]) / span) if span > 0 else 0.0
        return out

    def run(self, ctas_per_sm: list[int]) -> SimResult:
        results: list[LaunchResult] = []
        launches = self.schedule.launches

        def main():
            for launch, cps in zip(launches, ctas_per_sm):
                yield from self._launch(launch, cps, results)
                self.ctas_before += launch.grid

        busy0 = self._busy_snapshot()
        self.env.run_until_processed(self.env.process(main()))
        # Cycles through the engine (its op table's bound methods, the events
        # still queued, which know the environment) broken: with them the
        # whole engine and its schedule waited for the cyclic garbage
        # collector, which then spent up to a tenth of a second on them.
        self.env._queue.clear()
        self._ops = None
        dirty_at_end = self.mem.flush()
        runtime = self.env._now
        busy = self._busy_fractions(busy0, runtime)
        unit, share = bottleneck_of(busy)
        requested = int(round(self.totals[REQ]))
        hbm_read = int(round(self.totals[MISS]))
        hbm_write = int(round(self.mem.hbm_write))
        return SimResult(runtime_s=runtime, requested_bytes=requested,
                         store_bytes=int(round(self.totals[STORE] + self.totals[SCRATCH])),
                         hbm_read_bytes=hbm_read,
                         hbm_write_bytes=hbm_write,
                         l2_dirty_at_end_bytes=dirty_at_end,
                         # (a skip cut short has passed its whole chunk through L2 already, and the
                         # iterations timed again after it can miss once more: where nearly every
                         # load misses, the misses can pass the requests)
                         l2_hit_rate=max(0.0, 1.0 - hbm_read / requested) if requested else 0.0,
                         unit_busy=busy, bottleneck=unit, bottleneck_share=share,
                         launches=results, events=self.events)


def _ignore(t) -> None:
    """then(t) of a load nobody waits for."""


class _Barriers(dict):
    """A CTA's barriers: those the program declares with initial tokens, and
    any other name on first use with none (loops are built lazily)."""

    def __init__(self, env):
        super().__init__()
        self.env = env

    def __missing__(self, name):
        barrier = self[name] = Barrier(self.env, 0)
        return barrier
