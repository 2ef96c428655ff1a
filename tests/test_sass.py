"""kernels/sass.py finds a kernel's tensor loops in its SASS and counts what a
warp issues per trip (synthetic listings in cuobjdump's format; the live
compiles are in test_kernels_smem.py)."""
import pytest

pytest.importorskip("triton")
from kernels import sass  # noqa: E402


def _listing(lines):
    return "\n".join(f"        /*{16 * k:04x}*/                   {ins} ;" for k, ins in enumerate(lines))


SASS = _listing([
    "MOV R1, c[0x0][0x28]",                       # 0x0000
    "SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR4], R2",  # 0x0010: a spin loop, no tensor op
    "@!P0 BRA 0x10",                              # 0x0020
    "HGMMA.64x64x16.F32.BF16 R24, gdesc[UR8], RZ",  # 0x0030: loop 1 (unmasked)
    "FMNMX R3, R24, R25, !PT",
    "MUFU.EX2 R4, R3",
    "@P1 BRA 0x30",                               # 0x0060
    "HGMMA.64x64x16.F32.BF16 R24, gdesc[UR8], RZ",  # 0x0070: loop 2 (masked)
    "FSEL R5, R24, -INF, P2",
    "ISETP.GE.AND P2, PT, R6, R7, PT",
    "MUFU.EX2 R4, R5",
    "@P1 BRA 0x70",                               # 0x00b0
    "STG.E [R8.64], R4",
    "EXIT",                                       # 0x00d0
    "SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR4], R2",  # 0x00e0: retry stub
    "BRA 0x40",                                   # 0x00f0: back into loop 1, past the EXIT
])


def test_tensor_loops_in_address_order_innermost_only():
    loops = sass.tensor_loops(SASS)
    assert [len(body) for body in loops] == [4, 5]
    assert [sass.issue_slots(body) for body in loops] == [3, 4]
    assert sass.opcode(loops[1][1]) == "FSEL"


def test_an_outer_branch_around_the_loops_is_not_a_loop():
    outer = SASS.replace("STG.E [R8.64], R4", "@P3 BRA 0x30")
    assert [len(body) for body in sass.tensor_loops(outer)] == [4, 5]


def test_opcode_strips_predicates_and_modifiers():
    assert sass.opcode("@!P0 FFMA.FTZ R1, R2, R3, R4") == "FFMA"
    assert sass.opcode("@UP1 UTMALDG.2D [UR8], [UR22]") == "UTMALDG"
    assert sass.opcode("QGMMA.64x128x32.F32.E4M3.E4M3 R24, gdesc[UR16], RZ, !UPT") == "QGMMA"


def _with_control(lines_and_stalls):
    """cuobjdump's two-line form: the instruction with its first word, the
    second word (the control code, stall count at bits 41-44) below."""
    out = []
    for k, (ins, stall) in enumerate(lines_and_stalls):
        out.append(f"        /*{16 * k:04x}*/                   {ins} ;   /* 0x000000000000794d */")
        out.append(f"                                                  /* 0x{(0x7e0 | stall << 1) << 40:016x} */")
    return "\n".join(out)


def test_stall_counts_read_the_control_code():
    """The second word of the first instruction of fa2's sm_90 build
    (0x000fe2000001ff00: stall 1) and of a dependent FFMA pair (stall 4)."""
    real = ("        /*0000*/                   LDC R1, c[0x0][0x28] ;   /* 0x00000a00ff017b82 */\n"
            "                                                            /* 0x000fe2000001ff00 */")
    assert sass.stall_counts(real) == [(0, "LDC R1, c[0x0][0x28]", 1)]
    listing = _with_control([("FFMA R1, R2, R3, R4", 4), ("FFMA R5, R1, R3, R4", 15)])
    assert [c for *_, c in sass.stall_counts(listing)] == [4, 15]


def test_outside_stalls_split_at_the_tensor_loops():
    """Before the first tensor loop, between the loops, after the last up to
    the last EXIT (the retry stub after it is left out); a spin loop without
    a tensor op counts as straight code."""
    stalls = [1, 2, 3, 1, 1, 1, 4, 1, 1, 1, 1, 5, 6, 7, 8, 9]
    lines = [ins for ins in SASS.splitlines()]
    texts = [line.split("*/", 1)[1].strip().rstrip(";").strip() for line in lines]
    listing = _with_control(list(zip(texts, stalls)))
    got = sass.outside_stalls(listing)
    # prologue: 0x00-0x20 (1+2+3); loop 1 0x30-0x60; loop 2 0x70-0xb0 right after it (between 0);
    # epilogue: STG and EXIT (6+7)
    assert got == {"stall_prologue": 6, "stall_between": 0, "stall_epilogue": 13}
    assert sass.outside_stalls(SASS) == {}     # no control words: unknown, not 0


def test_spill_wait_slacks_follow_the_scoreboard():
    """A reload waits where an instruction first reads a register an LDL in
    flight fills (LDL.64: two registers), measured in the clocks issued since
    that LDL (an instruction's issue slot or its stall count, the larger); a
    store reading one waits too; a write to the register does not. Only the
    hot loop (the given tensor count) is read."""
    listing = _with_control([
        ("LDL R40, [R1+0x10]", 1),                       # 0x00: before the loop, not followed
        ("HGMMA.64x64x16.F32.BF16 R24, gdesc[UR8], RZ", 1),  # 0x10: loop top
        ("LDL.64 R30, [R1+0x20]", 1),                    # clock 1: R30, R31
        ("FFMA R2, R3, R4, R5", 6),                      # clock 2: independent
        ("FADD R31, R6, R7", 1),                         # clock 8: writes R31, no wait
        ("FMUL R8, R31, R9", 1),                         # clock 9: reads R31 -> slack 8
        ("LDL R12, [R1+0x30]", 1),                       # clock 10
        ("STL [R1+0x40], R12", 1),                       # clock 11: a store reading R12 -> slack 1
        ("@P1 BRA 0x10", 1),
        ("EXIT", 1),
    ])
    assert sass.spill_wait_slacks(listing, tensor_count=1) == "8 1"
    assert sass.spill_wait_slacks(listing, tensor_count=2) == ""     # no such loop
    assert sass.spill_wait_slacks(SASS, tensor_count=1) == ""        # no control words


def test_tensor_loop_parts_per_trip():
    """Each tensor loop's trip: its non-tensor instructions, its stall clocks
    and its MUFUs (loop 1: FMNMX, MUFU, BRA; loop 2 adds FSEL and ISETP)."""
    stalls = [1, 2, 3, 1, 1, 1, 4, 1, 1, 1, 1, 5, 6, 7, 8, 9]
    texts = [line.split("*/", 1)[1].strip().rstrip(";").strip() for line in SASS.splitlines()]
    parts = sass.tensor_loop_parts(_with_control(list(zip(texts, stalls))))
    assert parts == [{"issue": 3, "stall_clocks": 7, "mufu": 1}, {"issue": 4, "stall_clocks": 9, "mufu": 1}]
    assert sass.tensor_loop_parts(SASS) == []     # no control words: nothing to count


def test_softmax_chain_lies_between_the_wait_for_s_and_p_v():
    """experiments/fa2_step_parts.py: the stall clocks from the wait for S
    (the DEPBAR after Q Kᵀ) to the arrive that opens P V's group, against
    the whole trip's."""
    from experiments.fa2_step_parts import softmax_chain_clocks

    listing = _with_control([
        ("BAR.SYNC.DEFER_BLOCKING 0x0", 1),
        ("WARPGROUP.ARRIVE", 6),
        ("HGMMA.64x64x16.F32.BF16 R24, gdesc[UR8].tnspB, RZ, !UPT", 4),
        ("WARPGROUP.DEPBAR.LE gsb0, 0x0", 2),
        ("FMNMX R3, R24, R25, !PT", 3),           # the softmax: 3 + 8 + 1 clocks
        ("MUFU.EX2 R4, R3", 8),
        ("F2FP.BF16.F32.PACK_AB R5, R4, R4", 1),
        ("WARPGROUP.ARRIVE", 6),
        ("HGMMA.64x64x16.F32.BF16 R56, R5, gdesc[UR40].tnspB, R56", 1),
        ("@P0 BRA 0x0", 5),
    ])
    assert softmax_chain_clocks(listing) == (12, 37)


def test_loop_paths_leave_out_what_a_branch_inside_the_loop_skips():
    """A loop that masks behind a branch (kernels/fa3_gluon.py's consumers):
    its shortest path skips the masked block, its longest takes it; a branch
    out of the loop (a spin loop's retry, out of line) skips nothing."""
    listing = _listing([
        "HGMMA.64x64x16.F32.BF16 R24, gdesc[UR8], RZ",   # 0x0000: the loop's first
        "@!P0 BRA 0x00b0",                               # 0x0010: out of the loop: slow path
        "@P1 BRA 0x0050",                                # 0x0020: unmasked: over the mask
        "ISETP.GE.AND P2, PT, R6, R7, PT",               # 0x0030: the mask
        "FSEL R5, R24, -INF, P2",                        # 0x0040
        "MUFU.EX2 R4, R5",                               # 0x0050: the target
        "FADD R3, R4, R3",                               # 0x0060
        "@P3 BRA 0x0",                                   # 0x0070: the loop's backward branch
        "EXIT",                                          # 0x0080
    ])
    (paths,) = sass.tensor_loop_paths(listing)
    assert paths == {"shortest": 5, "longest": 7, "mufu_shortest": 1, "mufu_longest": 1}
    assert sass.tensor_loop_paths(SASS) == [
        {"shortest": 3, "longest": 3, "mufu_shortest": 1, "mufu_longest": 1},
        {"shortest": 4, "longest": 4, "mufu_shortest": 1, "mufu_longest": 1}]
    assert sass.tensor_loop_paths(None) == []
