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
1. Loop fast-forward: in a run of iterations with equal Loop.key (equal ops,
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
2. CTA ghosting: once a whole wave of the CTAs of a cost class
   (Launch.cost_key) that started under steady contention -- after the first
   wave, with L2 settled (full, and rid of an earlier launch's dirty tiles)
   -- have ended (with none started before them still running) and take the
   same time, later CTAs of that class hold their slot for that time with
   their mean work as background load, in batches over long runs (at most a slot's share of the
   remaining CTAs, in number and in time); a batch ends when its SM's
   units have served it, the launch when L2 and HBM have served all of it.
   The launch's last wave is simulated: its CTAs run as the slots empty.
Neither is done for a CTA whose loop carries tiles from one iteration to the
next through L2 while an iteration's tiles of all CTAs in flight come within
ROUND_TRIP_BAND of L2's capacity (FA1 near its L2 edge): their hits turn on
the CTAs' relative timing, finer than extrapolated periods keep it. Away
from that edge such a CTA's skips pass their tiles through L2 in chunks of
at most CARRIED_CHUNK of it (Engine._chunks).
fast=False simulates every operation; tests hold the two paths together.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from bisect import bisect_left, insort
from heapq import heappop, heappush
from itertools import chain
from math import ceil, fsum, inf

import simpy
from simpy.events import NORMAL, Initialize, Process, Timeout

from algorithms.ops import (LD, TMA, Alu, Arrive, DescriptorSetup, Exp, IssueStalls, Load, Loop, Mma, MmaWait, SmemIO,
                            StepLatency, Store, SyncThreads, Wait)
from algorithms.problem import DTYPE_BYTES
from algorithms.schedule import Launch, Schedule

from .memory import MemorySystem
from .servers import Barrier, Server

# Counter slots per role: bytes, then seconds of service per unit.
REQ, MISS, STORE = 0, 1, 2
SCRATCH = 10       # bytes stored to scratch (spills): never dirty in L2
# Sums of floats (durations, periods, counters) go through math.fsum, which
# rounds exactly on every Python: 3.12's sum() compensates its rounding and
# 3.11's does not, and the fast path's thresholds (STEADY_TOLERANCE,
# CONVERGED) turned that last bit into different predictions (standard B1
# H16 N16k D128: 12234 us on Python 3.12, 12884 on 3.11).
SM_UNITS = ("tensor_cores", "sfu_exp2", "fma_pipe", "smem", "sm_l2_port")
GLOBAL_UNITS = ("l2_bandwidth", "hbm_bandwidth")
UNITS = SM_UNITS + GLOBAL_UNITS
TENSOR, SFU, ALU, SMEM, PORT, L2, HBM = range(3, 10)
N_COUNTERS = 11

SUBPARTITIONS = 4           # an SM's warp schedulers, each with 1/4 of its units
STEADY_TOLERANCE = 0.01     # two iterations/CTAs "take the same time" within 1%
MIN_SAMPLES = 3             # iterations timed before a run may be skipped
MAX_SAMPLES = 8             # ... skipped at the latest after this many
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
# A class whose real CTAs found more than this share of their bytes in L2
# shares tiles: its ghosts' loads are replayed (Engine._replay_ghost_loads).
SHARED_HITS = 0.01
# A run is bottlenecked by a unit busy at least half of the time; below that
# no unit is saturated and latency (too little work in flight) bounds it.
SATURATION = 0.5
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


class _Process(Process):
    """simpy.Process with a leaner _resume, its order of events unchanged:
    the generator's next event gets this process's one bound _resume as its
    callback (SimPy makes a new bound method every time), and the
    environment's active process is not kept (nothing here reads it)."""

    def __init__(self, env, generator):
        self.env = env
        self.callbacks = []
        self._generator = generator
        self._resumer = self._resume
        self._target = Initialize(env, self)

    def _resume(self, event) -> None:
        send = self._generator.send
        while True:
            try:
                if event._ok:
                    event = send(event._value)
                else:
                    event._defused = True
                    exc = type(event._value)(*event._value.args)
                    exc.__cause__ = event._value
                    event = self._generator.throw(exc)
            except StopIteration as e:
                event = None
                self._ok = True
                self._value = e.args[0] if len(e.args) else None
                self.env.schedule(self)
                self._resumer = None    # (a cycle, process -> its own bound method)
                break
            except BaseException as e:
                event = None
                self._ok = False
                e.__traceback__ = e.__traceback__.tb_next
                self._value = e
                self.env.schedule(self)
                self._resumer = None
                break
            callbacks = event.callbacks
            if callbacks is not None:
                callbacks.append(self._resumer)
                break
        self._target = event


class _Environment(simpy.Environment):
    """simpy.Environment with its two hot paths inlined, event order unchanged.

    A Timeout built through SimPy's BoundClass costs three Python calls
    (2.5 us against 1.0 us built here), and every event one more for step().
    The events are SimPy's own, queued under the same (time, priority,
    insertion id) key, so they are processed in the same order."""

    def timeout(self, delay, value=None):
        if delay < 0:
            raise ValueError(f"Negative delay {delay}")
        event = Timeout.__new__(Timeout)
        event.env = self
        event.callbacks = []
        event._value = value
        event._delay = delay
        event._ok = True
        heappush(self._queue, (self._now + delay, NORMAL, next(self._eid), event))
        return event

    def process(self, generator):
        return _Process(self, generator)

    def trigger_at(self, event, t: float) -> None:
        """Succeed the pending `event` at time t (now, if t is past)."""
        event._ok = True
        event._value = None
        heappush(self._queue, (t if t > self._now else self._now, NORMAL, next(self._eid), event))

    def call_at(self, t: float, callback) -> None:
        """callback(event) at time t (now, if t is past)."""
        self.timeout(t - self._now if t > self._now else 0.0).callbacks.append(callback)

    def run_until_processed(self, until) -> None:
        """env.run(until) for an event `until`, with step() inlined: process
        events in order until `until` has been."""
        queue = self._queue
        while until.callbacks is not None:
            if not queue:
                raise RuntimeError(f"No scheduled events left but \"until\" event was not triggered: {until}")
            self._now, _, _, event = heappop(queue)
            callbacks, event.callbacks = event.callbacks, None
            for callback in callbacks:
                callback(event)
            if not event._ok and not hasattr(event, "_defused"):
                exc = type(event._value)(*event._value.args)
                exc.__cause__ = event._value
                raise exc


class _SM:
    __slots__ = ("index", "units", "tensor", "sfu", "alu", "smem", "port", "skippers", "residents_changed")

    def __init__(self, index: int):
        self.index = index
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
                 "exact", "carries", "issued_at", "issued_left")

    def __init__(self, sm, barriers, env):
        self.sm = sm
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


class Engine:
    def __init__(self, schedule: Schedule, gpu, fast: bool = True, tracer=None, slices: int = 1):
        """slices: the schedule is one of that many equal parts of the run
        (gpusim/symmetry.py); the engine gives it that share of the SMs, of
        L2's capacity and of L2's and HBM's bandwidth."""
        self.schedule, self.gpu, self.fast, self.tracer = schedule, gpu, fast, tracer
        self.env = _Environment()
        self.mem = MemorySystem(gpu, self.env, slices)
        self.mem.footprint = sum(t.nbytes for t in schedule.tensors.values())
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
        self.tensor_alu_serial = gpu.units.tensor_alu_serial_fraction
        self.tma_extra = gpu.copy.tma_extra_latency_cycles / clock
        self.step_latency = gpu.units.flash_step_latency_cycles / clock
        self.clock = clock
        self.launch_gap = gpu.launch.kernel_launch_us * 1e-6
        self.cta_turnover = gpu.launch.cta_turnover_cycles / clock
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
            # the same the wgmma operand reads use.
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
        extra = self.tma_extra if op.engine == TMA else 0.0
        tracer, sm_index, tensor, engine = self.tracer, cta.sm.index, op.tile.tensor, op.engine

        def arrived(t):
            tracer.slice(sm_index, f"load {engine}", tensor, now, t + extra)
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

    # ------------------------------------------------------- CTAs and slots
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

    def _run_cta(self, launch: Launch, index: int, sm: _SM, cost_class):
        env = self.env
        program = launch.program(index)
        barriers = _Barriers(env)
        for name, tokens in program.barriers.items():
            barriers[name] = Barrier(env, tokens)
        cta = _Cta(sm, barriers, env)
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
        if self.cta_turnover > 0.0:
            # Starting and retiring a CTA holds its slot: 0.29 us a round with
            # one empty CTA per SM (calibrate.py cta_cycle), no unit busy.
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
                yield from self._ghost(sm, batch.values(), launch, range(index, end), state)
                continue
            state["next"] = index + 1
            state["simulated"] += 1
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
        self._num_warps = launch.threads // 32
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
        snap["l2_bandwidth"] = self.mem.l2.busy
        snap["hbm_bandwidth"] = self.mem.hbm.busy
        return snap

    def _busy_fractions(self, before: dict[str, float], runtime: float) -> dict[str, float]:
        now = self._busy_snapshot()
        n_sm = len(self.sms)
        out = {}
        for name in UNITS:
            span = runtime * (n_sm if name in SM_UNITS else 1)
            out[name] = min(1.0, (now[name] - before[name]) / span) if span > 0 else 0.0
        return out

    def run(self, ctas_per_sm: list[int]) -> SimResult:
        results: list[LaunchResult] = []
        launches = self.schedule.launches

        def main():
            for launch, cps in zip(launches, ctas_per_sm):
                yield from self._launch(launch, cps, results)

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


def _ignore(t) -> None:
    """then(t) of a load nobody waits for."""


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


class _Barriers(dict):
    """A CTA's barriers: those the program declares with initial tokens, and
    any other name on first use with none (loops are built lazily)."""

    def __init__(self, env):
        super().__init__()
        self.env = env

    def __missing__(self, name):
        barrier = self[name] = Barrier(self.env, 0)
        return barrier
