"""What ptxas made of a compiled Triton kernel, read off its cubin with the
cuobjdump Triton bundles (no GPU needed): registers per thread, and the loops
that issue tensor-core instructions (wgmma is HGMMA in SASS, QGMMA for fp8)
-- their register spills and how many instructions a warp issues per trip --
and the stall clocks ptxas scheduled into the code outside those loops.

The schedules take these counts instead of estimating them
(algorithms/compiled.py reads the table experiments/triton_smem_probe.py
writes from them)."""
from __future__ import annotations

import os
import re
import subprocess
import tempfile

import triton

_INSTRUCTION = re.compile(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);")
# an instruction with its two 64-bit words: cuobjdump prints the second, which
# holds the control code, on the line below
_CONTROL = re.compile(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);\s*/\* 0x[0-9a-f]{16} \*/\s*\n\s*/\* 0x([0-9a-f]{16}) \*/")
# Volta's control-code layout, kept through Hopper (Jia et al. 2018, "Dissecting the NVIDIA
# Volta GPU Architecture via Microbenchmarking", on the control information: the 128-bit
# word's bits 105-108, bits 41-44 of its second half): the clocks the warp waits after this instruction
# before it issues its next one, as ptxas scheduled them for fixed-latency results
_STALL_SHIFT, _STALL_MASK = 41, 0xF
_BACK_BRANCH = re.compile(r"\bBRA\s+0x([0-9a-f]+)")
_PREDICATE = re.compile(r"^@!?U?P\w+\s+")


def cuobjdump(compiled, flag: str) -> str | None:
    """cuobjdump's output (`-res-usage`, `-sass`) for the compiled cubin, with
    the tool Triton bundles; None without a cubin or the tool."""
    cubin = compiled.asm.get("cubin")
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    if cubin is None or not os.path.exists(tool):
        return None
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return subprocess.run([tool, flag, f.name], capture_output=True, text=True).stdout


def registers(compiled, res_usage: str | None = None) -> int | None:
    """Registers per thread: n_regs is only filled in when a driver loads the
    binary, so read it from the cubin's .nv.info with cuobjdump (bundled);
    res_usage: that tool's -res-usage output, when the caller has it."""
    out = res_usage if res_usage is not None else cuobjdump(compiled, "-res-usage")
    m = re.search(r"REG:(\d+)", out or "")
    return int(m.group(1)) if m else None


def opcode(instruction: str) -> str:
    """'FFMA' of '@P0 FFMA.FTZ R1, R2, R3, R4'."""
    return _PREDICATE.sub("", instruction).split()[0].split(".")[0]


def _is_tensor(instruction: str) -> bool:
    return opcode(instruction).endswith("GMMA")


def loops(sass: str, holding=lambda body: True) -> list[list[str]]:
    """The bodies (from a backward branch's target to the branch) of the
    innermost loops whose bodies satisfy `holding`, in address order. A
    backward branch from past the kernel's EXIT (a retry stub jumping back
    into a loop) spans code that is no loop and is left out."""
    code = [(int(m.group(1), 16), m.group(2).strip()) for m in _INSTRUCTION.finditer(sass)]
    return [[i for _, i in code[a:b + 1]] for a, b in _loop_spans(code, holding)]


def _loop_spans(code: list[tuple[int, str]], holding) -> list[tuple[int, int]]:
    """loops()'s bodies as (first, last) indices into code, [(address, instruction)]."""
    at = {addr: k for k, (addr, _) in enumerate(code)}
    spans = []
    for k, (addr, ins) in enumerate(code):
        m = _BACK_BRANCH.search(ins)
        target = int(m.group(1), 16) if m else None
        if target is not None and target <= addr and target in at:
            body = [i for _, i in code[at[target]:k + 1]]
            if holding(body) and not any(opcode(i) == "EXIT" for i in body):
                spans.append((at[target], k))
    inner = [(a, b) for a, b in spans
             if not any((a, b) != (c, d) and a <= c and d <= b for c, d in spans)]
    return sorted(inner)


def _holds_tensor(body: list[str]) -> bool:
    return any(_is_tensor(i) for i in body)


def tensor_loops(sass: str) -> list[list[str]]:
    """The innermost loops that issue tensor-core instructions, in address
    order. Spin loops on a barrier hold none and are left out, and so are
    backward branches around the tensor loops."""
    return loops(sass, holding=_holds_tensor)


def tensor_loop_spans(words: list[tuple[int, str, int]]) -> list[tuple[int, int]]:
    """tensor_loops' bodies as (first, last) indices into stall_counts' words."""
    return _loop_spans([(a, i) for a, i, _ in words], _holds_tensor)


def issue_slots(body: list[str]) -> int:
    """Instructions a warp issues per trip of a loop besides its tensor-core
    ones (which the tensor pipe's own rate covers): the softmax's FFMA, FMNMX,
    MUFU, conversions and shuffles, masks, address arithmetic, copies and
    barriers. Each takes one of its SM sub-partition's issue slots (one warp
    instruction per clock)."""
    return sum(not _is_tensor(i) for i in body)


def loop_spills(sass: str | None, res_usage: str | None) -> dict:
    """Register spills, from the SASS: the stack frame ptxas gave a thread
    (STACK in -res-usage) and the bytes a thread stores to and loads from it
    (STL/LDL, 4 bytes unless a width modifier says otherwise, LDL.LU.64
    included) in one iteration of the hot loop -- the tensor loop with the
    most wgmma instructions; the unmasked loop comes first. sass and
    res_usage: cuobjdump's -sass and -res-usage output. Empty without them
    or without such a loop (unknown, not 0)."""
    if res_usage is None or sass is None:
        return {}
    stack = re.search(r"STACK:(\d+)", res_usage)
    best, hot = 0, []
    for body in tensor_loops(sass):
        wgmma = sum(_is_tensor(i) for i in body)
        if wgmma > best:
            best, hot = wgmma, body
    if not best:
        return {}

    def nbytes(i):
        # STL/LDL with any modifiers (.LU: last use, .U8, .S16, .64, .128)
        width = re.search(r"\b(?:STL|LDL)(?:\.[A-Z]+)*\.(U8|S8|U16|S16|64|128)\b", i)
        if not width:
            return 4
        return {"U8": 1, "S8": 1, "U16": 2, "S16": 2, "64": 8, "128": 16}[width.group(1)]

    stores = sum(nbytes(i) for i in hot if re.search(r"\bSTL\b|\bSTL\.", i))
    loads = sum(nbytes(i) for i in hot if re.search(r"\bLDL\b|\bLDL\.", i))
    return {"stack_bytes": int(stack.group(1)) if stack else None,
            "spill_store_bytes_per_iter": stores, "spill_load_bytes_per_iter": loads,
            "spill_wait_slacks": spill_wait_slacks(sass, best)}


_REGISTER = re.compile(r"(?<![\w.])R(\d+)\b")
_LDL_REGISTERS = {"64": 2, "128": 4}   # LDL.64 / LDL.128 fill 2 / 4 consecutive registers


def spill_wait_slacks(sass: str, tensor_count: int) -> str:
    """Where a warp waits for its spilled registers in one trip of the hot loop
    (the tensor loop with `tensor_count` tensor instructions), as the clocks
    it issues between the reload (LDL) and the first instruction that reads
    a reloaded register, space-separated in program order: each such reader
    waits on the scoreboard for every LDL in flight, and a reload whose
    reader follows at once waits out a whole round trip to the cache. The
    clocks count each instruction's issue slot or its stall count
    (stall_counts), whichever is more; reloads still in flight at the
    loop's back edge are not followed into the next trip. ptxas reloads in several
    places between the products (fa2 128x64, 4 warps, D = 128: 7 waits with
    31-637 clocks of slack in the non-causal loop; 21 in the causal
    kernel's first loop, 15 of them a chain of LDL-then-use 2 clocks
    apart). Empty without control words."""
    words = stall_counts(sass)
    spans = tensor_loop_spans(words)
    hot = [(a, b) for a, b in spans if sum(_is_tensor(i) for _, i, _ in words[a:b + 1]) == tensor_count]
    if not hot:
        return ""
    a, b = hot[0]
    pending: dict[int, int] = {}   # register -> clock its LDL issued
    clock, slacks = 0, []
    for _, instruction, stall in words[a:b + 1]:
        text = _PREDICATE.sub("", instruction).strip()
        op = text.split()[0] if text else ""
        registers = [int(r) for r in _REGISTER.findall(text)]
        if op.startswith("LDL"):
            if registers:
                width = _LDL_REGISTERS.get(op.split(".")[-1], 1)
                pending.update((r, clock) for r in range(registers[0], registers[0] + width))
        else:
            # an instruction's first register operand is the one it writes, unless it stores
            sources = registers if op.startswith("ST") else registers[1:]
            issued = [pending[r] for r in sources if r in pending]
            if issued:
                slacks.append(clock - max(issued))
                pending.clear()
        clock += max(stall, 1)
    return " ".join(map(str, slacks))


def _last_exit(code: list[str]) -> int:
    """Index of the kernel's last EXIT (the retry stubs after it seldom run);
    the last instruction without one."""
    return max((k for k, i in enumerate(code) if opcode(i) == "EXIT"), default=len(code) - 1)


def outside_loops(sass: str, tensor_bodies: list[list[str]]) -> int:
    """Instructions of the kernel's body (up to its last EXIT; the retry stubs
    after it seldom run) outside its tensor loops (tensor_loops(sass)), NOPs
    aside: a warp's setup, its pipelines' prologues and drains, the epilogue
    and the stores, each issued once per CTA (branches not taken counted all
    the same)."""
    code = [m.group(2).strip() for m in _INSTRUCTION.finditer(sass)]
    body = [i for i in code[:_last_exit(code) + 1] if opcode(i) != "NOP"]
    in_loops = sum(sum(opcode(i) != "NOP" for i in loop) for loop in tensor_bodies)
    return len(body) - in_loops


def stall_counts(sass: str) -> list[tuple[int, str, int]]:
    """(address, instruction, stall count) of each instruction whose second
    word cuobjdump printed: the clocks ptxas has the warp wait after issuing
    it (_STALL_SHIFT); results of variable latency (loads, MUFU, shuffles)
    are waited for through scoreboards instead, not counted here."""
    return [(int(m.group(1), 16), m.group(2).strip(), (int(m.group(3), 16) >> _STALL_SHIFT) & _STALL_MASK)
            for m in _CONTROL.finditer(sass)]


def outside_stalls(sass: str | None) -> dict:
    """The stall counts (stall_counts) summed over the kernel's code outside
    its tensor loops, in SM clocks a warp spends there at the least: before
    the first loop (setup, the Q load, the first stages' copies),
    between loops (the first loop's drain, the second one's fill) and after
    the last, up to the kernel's last EXIT (the epilogue and the stores).
    Code a warp skips at a branch is counted all the same. Empty without
    the SASS's control words or without tensor loops."""
    words = stall_counts(sass) if sass else []
    spans = tensor_loop_spans(words)
    if not spans:
        return {}
    stall = [c for _, _, c in words]
    last_exit = _last_exit([i for _, i, _ in words])
    return {"stall_prologue": sum(stall[:spans[0][0]]),
            "stall_between": sum(sum(stall[b + 1:a]) for (_, b), (a, _) in zip(spans, spans[1:])),
            "stall_epilogue": sum(stall[spans[-1][1] + 1:last_exit + 1])}


def tensor_loop_parts(sass: str | None) -> list[dict]:
    """Per tensor loop, in address order, what a warp spends on one trip:
    the instructions it issues besides the tensor-core ones (issue_slots),
    the stall clocks ptxas scheduled into the trip (stall_counts: the least
    time one warp alone takes, variable-latency waits aside) and its MUFU
    instructions (the exp2s). Empty without the SASS's control words."""
    words = stall_counts(sass) if sass else []
    spans = tensor_loop_spans(words)
    out = []
    for first, last in spans:
        body = words[first:last + 1]
        out.append({"issue": issue_slots([i for _, i, _ in body]),
                    "stall_clocks": sum(c for _, _, c in body),
                    "mufu": sum(opcode(i) == "MUFU" for _, i, _ in body)})
    return out


def tensor_loop_paths(sass: str | None) -> list[dict]:
    """Per tensor loop, in address order, the instructions a warp issues per
    trip besides the tensor-core ones along its shortest path ("shortest":
    every forward branch inside the loop taken, the blocks it jumps over
    left out) and along all of it ("longest"), and its MUFU instructions on
    each. A loop that masks some steps inside its body, behind a branch, as
    kernels/fa3_gluon.py does (`if j >= n_full: mask`), issues the first on
    its unmasked steps and the second on its masked ones. Branches out of the
    loop (to out-of-line spin loops that retry an mbarrier wait) are the slow
    path and skip nothing. Empty without tensor loops."""
    code = [(int(m.group(1), 16), m.group(2).strip()) for m in _INSTRUCTION.finditer(sass or "")]
    out = []
    for first, last in _loop_spans(code, _holds_tensor):
        body = code[first:last + 1]
        end = body[-1][0]
        skipped: set[int] = set()
        for addr, ins in body[:-1]:     # (the last is the loop's own backward branch)
            m = _BACK_BRANCH.search(ins)
            if m and _PREDICATE.match(ins) and addr < int(m.group(1), 16) <= end:
                skipped.update(a for a, _ in body if addr < a < int(m.group(1), 16))
        shortest = [i for a, i in body if a not in skipped]
        out.append({"shortest": issue_slots(shortest), "longest": issue_slots([i for _, i in body]),
                    "mufu_shortest": sum(opcode(i) == "MUFU" for i in shortest),
                    "mufu_longest": sum(opcode(i) == "MUFU" for _, i in body)})
    return out


def loop_issue_slots(sass: str | None) -> dict:
    """Per warp and trip, the non-tensor instructions of the kernel's first two
    tensor loops: fa2 and Triton's fa3 run the unmasked K/V blocks, then the
    masked ones (causal diagonal, key tail), in two loops in that order; and
    per warp and CTA, those outside them (outside_loops). sass: cuobjdump's
    -sass output. Empty without it or without such loops."""
    loops = tensor_loops(sass) if sass else []
    if not loops:
        return {}
    out = {"issue_per_iter": issue_slots(loops[0]), "issue_outside_loops": outside_loops(sass, loops)}
    if len(loops) > 1:
        out["issue_per_iter_masked"] = issue_slots(loops[1])
    return out
