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

__all__ = ["codes_layout", "scales_layout"]


def codes_layout(candidate_codes, ours_p, view: TensorView, sch: BlockScheme, packed: bool, what: str,
                 findings: list) -> tuple[np.ndarray, np.ndarray, np.ndarray, str | None]:
    """The candidate's codes as given, as compared (read back through the layout mistake of
    :func:`_code_readings` that fixes most of them, with a finding), the mask [R, nb·BC] of the codes the
    layout explains, and the layout's cause (None: the bytes are in fpsim's layout)."""
    C = view.C
    cand, readings = _candidate_codes(candidate_codes, view.R, C, view.nb, view.BC, sch.element, packed, what)
    ours = ours_p[:, :C]
    layout_c = np.zeros(ours_p.shape, bool)
    n_plain = int(np.count_nonzero(cand != ours))
    best = None
    for cause, note, read in readings if n_plain else ():
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
    cand_s, alt_s, note = _candidate_scales(candidate_scales, view.R, view.nb, sch, ours_s, swizzled, what)
    if note is None:
        return cand_s, cand_s, np.zeros(ours_s.shape, bool), None
    findings.append(note)
    return cand_s, alt_s, (cand_s != ours_s) & (alt_s == ours_s), note.split(":")[0]


def _candidate_codes(candidate_codes, R: int, C: int, nb: int, BC: int, el, packed: bool, what: str):
    """Candidate codes [R, C] (uint8) and the other readings of its bytes (:func:`_code_readings`)."""
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
    return (unpack_fp4(b) if is_packed else b)[:, :C], _code_readings(b, R, C, is_packed)


def _code_readings(b: np.ndarray, R: int, C: int, is_packed: bool) -> list[tuple[str, str, object]]:
    """The layout mistakes a kernel's code bytes ``b`` [R, W] may hold, as ``(cause, finding, read)``; ``read()``
    gives the codes [R, C] fpsim would compare if the candidate made that mistake, and the mask of the codes the
    mistake leaves unknown (shifted out of the stream), or None where the bytes cannot hold it.

    Nibble order (element 2j in the high nibble), the whole stream shifted by one element or one byte (an
    off-by-one pointer) or one row, and rows and columns transposed (the code matrix stored [C, R], or for packed codes
    the byte matrix [R, C/2] stored transposed)."""
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
    for s in (1, -1) + ((2, -2) if is_packed else ()) + ((row, -row) if R > 1 and row > 2 else ()):
        unit = ("one element" if abs(s) == 1 else "one byte (two codes)" if abs(s) == 2 == per
                else f"one row ({row} codes)")
        where = "i−" if s > 0 else "i+"
        out.append(("shifted codes", f"the candidate's codes are fpsim's shifted by {unit}: code i holds fpsim's "
                    f"code {where}{abs(s)} of the row-major stream (an off-by-one offset)", shifted(s)))
    if R > 1 and C > 1:
        if b.size == C * (-(-R // per)):
            out.append(("transposed code layout", "the candidate's codes are fpsim's with rows and columns "
                        f"transposed (the code matrix stored [{C}, {R}] instead of [{R}, {C}])",
                        lambda: (unpack(b.reshape(C, -1))[:, :R].T, None)))
        if is_packed and W > 1:
            out.append(("transposed code layout", f"the candidate's packed bytes are fpsim's [{R}, {W}] byte matrix "
                        f"stored transposed ([{W}, {R}])", lambda: (unpack_fp4(b.reshape(W, R).T)[:, :C], None)))
    return out


def _candidate_scales(candidate_scales, R: int, nb: int, sch: BlockScheme, ours_s, swizzled: bool, what: str):
    """Candidate scales [R, nb] in the plain layout, and a finding when the layout was not the declared one."""
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
                                           "layout, not swizzled as declared")
        return un, None, None
    if cs.size == R * nb:
        plain = cs.reshape(R, nb)
        if kind is not Kind.FP32 and n_sw == R * nb:
            un = unswizzle_scales(cs, R, nb)
            if closer(un, plain):
                return plain, un, ("swizzled scale layout: the candidate's scales are fpsim's in the Blackwell "
                                   "swizzled layout (pass swizzled=True / --swizzled)")
        if np.count_nonzero(plain != ours_s):
            # transposed ([blocks, rows] flattened) or shifted by one byte (an off-by-one offset): the reading
            # that fixes more than half of the differing bytes, the transpose first
            alts = []
            if R > 1 and nb > 1:
                alts.append((cs.reshape(nb, R).T, f"transposed scale layout: the candidate's scales are fpsim's "
                             f"[{R}, {nb}] scales stored transposed ([{nb}, {R}], blocks-major)"))
            for sh in (1, -1):
                alts.append((np.roll(cs, -sh).reshape(R, nb), f"shifted scales: the candidate's scale bytes are "
                             f"fpsim's shifted by one byte (byte i holds fpsim's byte i{'−' if sh > 0 else '+'}1)"))
            alt, note = min(alts, key=lambda a: np.count_nonzero(a[0] != ours_s))
            if closer(alt, plain):
                return plain, alt, note
        return plain, None, None
    if kind is not Kind.FP32 and cs.size == n_sw:
        un = unswizzle_scales(cs, R, nb)
        plain = np.zeros((R, nb), ours_s.dtype)
        plain.reshape(-1)[:] = cs[: R * nb]
        note = (f"swizzled scale layout: {cs.size} scale bytes is the swizzled size of [{R}, {nb}] (pass "
                "swizzled=True / --swizzled)" + ("; unswizzled they equal fpsim's" if np.array_equal(un, ours_s)
                                                 else ""))
        return plain, un, note
    # a kernel with another block width (1×32 where NVFP4 has 1×16, or 1×16 for MX) is a usage error, but say so
    width = nb * sch.block[1]
    other = [w for w in (16, 32, 64, 128) if w != sch.block[1] and width and cs.size == R * -(-width // w)]
    hint = f"; that is one per 1×{other[0]} block: another block size (--block)" if other else ""
    raise ValueError(f"candidate scales have {cs.size} values; expected {R}×{nb} = {R * nb} (one per block) "
                     f"for {what}{hint}")
