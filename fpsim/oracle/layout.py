"""The layout readings of :func:`fpsim.oracle.diff`: a candidate's code and scale bytes read as given, and read back
through the layout mistakes a kernel may make (nibble order, codes shifted or transposed, scales swizzled, transposed
or shifted), the reading that fixes most of the differing bytes becoming a finding.
"""

from __future__ import annotations

import numpy as np

from ..packing import unpack_fp4
from ..scaling import unswizzle_scales
from ..schemes import BlockScheme, Kind
from .model import TensorView
from .shifts import best_shifts

__all__ = ["code_readings", "codes_layout", "scales_layout"]


def codes_layout(candidate_codes, ours_p, view: TensorView, sch: BlockScheme, packed: bool, what: str,
                 findings: list) -> tuple[np.ndarray, np.ndarray, np.ndarray, str | None]:
    """The candidate's codes as given, as compared (read back through the layout mistake of
    :func:`_code_readings` that fixes most of them, with a finding), the mask [R, nb·BC] of the codes the
    layout explains, and the layout's cause (None: the bytes are in fpsim's layout)."""
    C = view.C
    cand, b, is_packed = _candidate_codes(candidate_codes, view.R, C, view.nb, view.BC, sch.element, packed, what)
    ours = ours_p[:, :C]
    layout_c = np.zeros(ours_p.shape, bool)
    n_plain = int(np.count_nonzero(cand != ours))
    best = None
    readings = _code_readings(b, view.R, C, is_packed, _searched(b, ours, is_packed, view.BR)) if n_plain else ()
    for cause, note, read in readings:
        alt, lost = read()
        # the codes a shift moves out of the stream count as mismatches: unknown, they cannot be credited to it
        n = int(np.count_nonzero((alt != ours) if lost is None else (alt != ours) | lost))
        # a layout mistake scrambles codes: it must fix most of them (at least half), and the best reading wins
        # (ties: the order above, nibble order first)
        if n < n_plain / 2 and (best is None or n < best[0]):
            best = (n, cause, note, alt, lost)
    if best is None:
        return cand, cand, layout_c, None
    _, cause, note, alt, lost = best
    findings.append(f"{cause}: {note}")
    fixed = (cand != ours) & (alt == ours)
    if lost is not None:  # the codes shifted out of the stream: the shift explains them, whatever they hold
        fixed |= (cand != ours) & lost
        alt = np.where(lost, ours, alt)
    layout_c[:, :C] = fixed
    return cand, alt, layout_c, cause


def scales_layout(candidate_scales, ours_s, view: TensorView, sch: BlockScheme, swizzled: bool, what: str,
                  findings: list) -> tuple[np.ndarray, np.ndarray, np.ndarray, str | None]:
    """The candidate's scale bytes as given, as compared (the other layout where that matches, with a finding),
    the mask of the bytes the layout explains and the layout's cause (None: fpsim's layout)."""
    cand_s, alt_s, note, lost = _candidate_scales(candidate_scales, view.R, view.nb, view.BR, sch, ours_s, swizzled,
                                                  what)
    if note is None:
        return cand_s, cand_s, np.zeros(ours_s.shape, bool), None
    findings.append(note)
    fixed = (cand_s != ours_s) & (alt_s == ours_s)
    if lost is not None:  # the bytes a shift moves out of the stream: the shift explains them, whatever they hold
        fixed |= (cand_s != ours_s) & lost
        alt_s = np.where(lost, ours_s, alt_s)
    return cand_s, alt_s, fixed, note.split(":")[0]


def _candidate_codes(candidate_codes, R: int, C: int, nb: int, BC: int, el, packed: bool, what: str):
    """Candidate codes [R, C] (uint8), its bytes [R, W] and whether they hold two codes each."""
    cc = np.asarray(candidate_codes)
    if cc.dtype.kind not in "iu":
        raise ValueError(f"candidate codes must be integers (raw code bytes), got dtype {cc.dtype}")
    four = el.bits == 4
    is_packed = four and packed
    lengths = {-(-C // 2), nb * BC // 2} if is_packed else {C, nb * BC}
    if R == 0 or cc.size % max(R, 1) or cc.size // max(R, 1) not in lengths:
        want = " or ".join(f"{R}×{n}" for n in sorted(lengths))
        raise ValueError(f"candidate codes have {cc.size} values (shape {cc.shape}); expected {want} "
                         f"{'packed bytes' if is_packed else 'codes'} for {what}")
    cc = cc.reshape(R, -1)
    if cc.size and (cc.min() < 0 or cc.max() > (0xFF if is_packed else (1 << el.bits) - 1)):
        hint = " (packed 4-bit codes? then do not pass packed=False)" if four and not packed else ""
        raise ValueError(f"candidate codes out of range for {el.name}{hint}")
    b = cc.astype(np.uint8, copy=False)
    return (unpack_fp4(b) if is_packed else b)[:, :C], b, is_packed


def _fixed_shifts(R: int, row: int, is_packed: bool) -> tuple[int, ...]:
    """The off-by-one offsets always tried: one element, one byte (packed codes), one row of ``row`` codes."""
    return (1, -1) + ((2, -2) if is_packed else ()) + ((row, -row) if R > 1 and row > 2 else ())


def _searched(b: np.ndarray, ours: np.ndarray, is_packed: bool, BR: int) -> list[int]:
    """Other offsets of the code stream (:func:`~fpsim.oracle.shifts.best_shifts`, up to one row of blocks: ``BR``
    rows of the candidate's stream) under which most sampled codes are fpsim's."""
    R, C = ours.shape
    u = (unpack_fp4(b) if is_packed else b).reshape(R, -1)
    row = u.shape[1]
    o = np.zeros(u.shape, np.uint8)
    o[:, :C] = ours
    real = np.zeros(u.shape, bool)
    real[:, :C] = True
    return best_shifts(u.reshape(-1), o.reshape(-1), real.reshape(-1), BR * row, _fixed_shifts(R, row, is_packed))


def _shift_unit(s: int, row: int, per: int) -> str:
    """The offset ``s`` (in codes) in words."""
    a = abs(s)
    if a == 1:
        return "one element"
    if a == 2 == per:
        return "one byte (two codes)"
    if a == row:
        return f"one row ({row} codes)"
    if a % row == 0:
        return f"{a // row} rows ({a} codes)"
    if per == 2:
        return f"{a} codes ({a // 2} bytes)" if a % 2 == 0 else f"{a} codes ({a / 2:g} bytes: the nibbles misaligned)"
    return f"{a} codes"


def _code_readings(b: np.ndarray, R: int, C: int, is_packed: bool, more=()) -> list[tuple[str, str, object]]:
    """The layout mistakes a kernel's code bytes ``b`` [R, W] may hold, as ``(cause, finding, read)``; ``read()``
    gives the codes [R, C] fpsim would compare if the candidate made that mistake, and the mask of the codes the
    mistake leaves unknown (shifted out of the stream), or None where the bytes cannot hold it.

    Nibble order (element 2j in the high nibble), the whole stream shifted by one element or one byte (an
    off-by-one pointer) or one row, and rows and columns transposed (the code matrix stored [C, R], or for packed codes
    the byte matrix [R, C/2] stored transposed); ``more``: other offsets to try (found by :func:`_searched`)."""
    W = b.shape[1]
    unpack = unpack_fp4 if is_packed else (lambda a: a)
    per = 2 if is_packed else 1  # codes per byte

    def shifted(s: int):
        def read():
            u = unpack(b).reshape(-1)
            # the candidate's code j is fpsim's code j − s: read it back s codes later; the s codes at the
            # stream's end have no candidate byte (and the first s candidate codes no fpsim code)
            out = np.roll(u, -s)
            lost = np.zeros(u.size, bool)
            if s > 0:
                lost[-s:] = True
            else:
                lost[:-s] = True
            return out.reshape(R, -1)[:, :C], lost.reshape(R, -1)[:, :C]
        return read

    out: list[tuple[str, str, object]] = []
    if is_packed:
        out.append(("nibble packing order", "the candidate puts element 2j in the HIGH nibble (fpsim, cvt.*.e2m1x2 "
                    "and cuBLAS: low nibble)", lambda: (unpack_fp4(((b << 4) | (b >> 4)).astype(np.uint8))[:, :C],
                                                         None)))
    row = W * per  # codes per candidate row: a row offset is a shift by one row of the stream
    fixed = _fixed_shifts(R, row, is_packed)
    for s in fixed + tuple(more):
        where = "i−" if s > 0 else "i+"
        what = "an off-by-one offset" if s in fixed else f"an offset of {abs(s)} codes, found by correlation"
        out.append(("shifted codes", f"the candidate's codes are fpsim's shifted by {_shift_unit(s, row, per)}: code "
                    f"i holds fpsim's code {where}{abs(s)} of the row-major stream ({what})", shifted(s)))
    if R > 1 and C > 1:
        if b.size == C * (-(-R // per)):
            out.append(("transposed code layout", "the candidate's codes are fpsim's with rows and columns "
                        f"transposed (the code matrix stored [{C}, {R}] instead of [{R}, {C}])",
                        lambda: (unpack(b.reshape(C, -1))[:, :R].T, None)))
        if is_packed and W > 1:
            out.append(("transposed code layout", f"the candidate's packed bytes are fpsim's [{R}, {W}] byte matrix "
                        f"stored transposed ([{W}, {R}])", lambda: (unpack_fp4(b.reshape(W, R).T)[:, :C], None)))
    return out


def _scale_readings(cs: np.ndarray, R: int, nb: int, BR: int, ours_s) -> list[tuple[np.ndarray, str, np.ndarray]]:
    """The layout mistakes the plain scale bytes ``cs`` (flat, R·nb) may hold, as ``(reading [R, nb], finding, mask
    of the bytes the mistake leaves unknown)``: transposed ([blocks, rows] flattened), shifted by one byte (an
    off-by-one offset), or shifted by another offset up to one row of blocks that correlation finds
    (:func:`~fpsim.oracle.shifts.best_shifts`).  Byte i of a stream shifted by s holds fpsim's byte i − s."""
    none = np.zeros((R, nb), bool)
    out = []
    if R > 1 and nb > 1:
        out.append((cs.reshape(nb, R).T, f"transposed scale layout: the candidate's scales are fpsim's [{R}, {nb}] "
                    f"scales stored transposed ([{nb}, {R}], blocks-major)", none))
    flat = ours_s.reshape(-1)
    more = best_shifts(cs, flat, np.ones(flat.size, bool), max(BR, 1) * nb, (1, -1))
    for sh in (1, -1) + tuple(more):
        lost = np.zeros(cs.size, bool)
        if sh > 0:
            lost[-sh:] = True
        else:
            lost[:-sh] = True
        rows = abs(sh) // nb if abs(sh) % nb == 0 else 0
        unit = "one byte" if abs(sh) == 1 else f"{abs(sh)} bytes" + (f" ({rows} row{'s' * (rows > 1)} of scales)"
                                                                    if rows else "")
        what = "an off-by-one offset" if abs(sh) == 1 else "an offset found by correlation"
        out.append((np.roll(cs, -sh).reshape(R, nb), f"shifted scales: the candidate's scale bytes are fpsim's "
                    f"shifted by {unit} (byte i holds fpsim's byte i{'−' if sh > 0 else '+'}{abs(sh)}: {what})",
                    lost.reshape(R, nb)))
    return out


def _candidate_scales(candidate_scales, R: int, nb: int, BR: int, sch: BlockScheme, ours_s, swizzled: bool,
                      what: str):
    """Candidate scales [R, nb] in the plain layout, the reading through the layout mistake that fixes most of them
    and its finding (None, None where the layout is the declared one), and the mask of the scales a shift leaves
    unknown (None: not a shift)."""
    kind = sch.kind
    cs = np.asarray(candidate_scales)
    if kind is Kind.FP32:
        if cs.dtype != np.float32:
            raise ValueError(f"candidate scales of {sch.name} must be float32, got {cs.dtype}")
    elif cs.dtype.kind not in "iu" or (cs.size and (cs.min() < 0 or cs.max() > 0xFF)):
        raise ValueError(f"candidate scales must be raw scale bytes (uint8), got dtype {cs.dtype}")
    cs = cs.reshape(-1).astype(ours_s.dtype)
    n_sw = (128 * -(-R // 128)) * (4 * -(-nb // 4))
    closer = lambda a, b: np.count_nonzero(a != ours_s) * 2 < np.count_nonzero(b != ours_s)  # noqa: E731
    if swizzled:
        if kind is Kind.FP32:
            raise ValueError("FP32 scales have no swizzled layout")
        if cs.size != n_sw:
            extra = " (that is the plain [rows, blocks] size: drop swizzled)" if cs.size == R * nb else ""
            raise ValueError(f"expected {n_sw} swizzled scale bytes for [{R}, {nb}] scales, got {cs.size}{extra}")
        un = unswizzle_scales(cs, R, nb)
        if n_sw == R * nb and closer(cs.reshape(R, nb), un):
            return un, cs.reshape(R, nb), ("swizzled scale layout: the scales are in the plain [rows, blocks] "
                                           "layout, not swizzled as declared"), None
        return un, None, None, None
    if cs.size == R * nb:
        plain = cs.reshape(R, nb)
        if kind is not Kind.FP32 and n_sw == R * nb:
            un = unswizzle_scales(cs, R, nb)
            if closer(un, plain):
                return plain, un, ("swizzled scale layout: the candidate's scales are fpsim's in the Blackwell "
                                   "swizzled layout (pass swizzled=True / --swizzled)"), None
        if np.count_nonzero(plain != ours_s):
            alt, note, lost = min(_scale_readings(cs, R, nb, BR, ours_s),
                                  key=lambda a: np.count_nonzero((a[0] != ours_s) | a[2]))
            if np.count_nonzero((alt != ours_s) | lost) * 2 < np.count_nonzero(plain != ours_s):
                return plain, alt, note, (lost if lost.any() else None)
        return plain, None, None, None
    if kind is not Kind.FP32 and cs.size == n_sw:
        un = unswizzle_scales(cs, R, nb)
        plain = np.zeros((R, nb), ours_s.dtype)
        plain.reshape(-1)[:] = cs[: R * nb]
        note = (f"swizzled scale layout: {cs.size} scale bytes is the swizzled size of [{R}, {nb}] (pass "
                "swizzled=True / --swizzled)" + ("; unswizzled they equal fpsim's" if np.array_equal(un, ours_s)
                                                 else ""))
        return plain, un, note, None
    # a kernel with another block width (1×32 where NVFP4 has 1×16, or 1×16 for MX) is a usage error, but say so
    width = nb * sch.block[1]
    other = [w for w in (16, 32, 64, 128) if w != sch.block[1] and width and cs.size == R * -(-width // w)]
    hint = f"; that is one per 1×{other[0]} block: another block size (--block)" if other else ""
    raise ValueError(f"candidate scales have {cs.size} values; expected {R}×{nb} = {R * nb} (one per block) "
                     f"for {what}{hint}")


def code_readings(candidate_codes, view: TensorView, sch: BlockScheme, packed: bool, what: str) -> list[np.ndarray]:
    """The candidate's codes [R, C] as given and through each layout mistake of :func:`_code_readings` (the fixed
    offsets only): what a check that needs the codes read right (the RHT's implied signs) may try."""
    cand, b, is_packed = _candidate_codes(candidate_codes, view.R, view.C, view.nb, view.BC, sch.element, packed, what)
    return [cand] + [read()[0] for _, _, read in _code_readings(b, view.R, view.C, is_packed)]
