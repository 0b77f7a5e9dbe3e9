"""The wrong-axis reading of :func:`fpsim.oracle.diff`: a candidate that formed its blocks down the columns of the
quantized [R, C] view instead of along its rows — fpsim's rules applied to the transpose — stored either in the
view's orientation (codes [R, C], scales [⌈R/BR⌉·…, C]) or in the transpose's layout (codes [C, R], scales
[C, ⌈R/BC⌉]), whichever its bytes support.

The candidate's bytes and the wrong-axis bytes are both read the way fpsim reads a candidate (its [R, C] codes and
[R, nb] scales where the sizes are fpsim's, else the first R·C codes and R·nb scale bytes of the stream, the bytes a
shorter stream lacks counted as differing and credited to the reading), so that every byte that differs from
fpsim's gets the wrong axis as its cause exactly where the wrong-axis bytes hold the candidate's.  With square tiles
(16×16) the transpose changes no value — a tile's amax is the same either way — so a candidate in the view's
orientation is IDENTICAL under round-to-nearest; its codes still differ under stochastic rounding with a seed (each
block draws its random bits by its index and its elements' positions, and the transpose renumbers both), and a
candidate stored in the transpose's layout differs in both codes and scales.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..packing import pack_fp4, unpack_fp4
from ..scaling import swizzle_scales, unswizzle_scales
from ..schemes import BlockScheme, Kind
from .model import Convention
from .reference import reference, same_scales

__all__ = ["WRONG_AXIS", "WRONG_AXIS_RATE", "AxisReading", "axis_reading"]

#: The cause a wrong-axis reading gives the bytes it explains (a key of :data:`fpsim.oracle.diff.CAUSES`).
WRONG_AXIS = "quantized along the wrong axis"
#: Code or scale mismatch rate above which :func:`fpsim.oracle.diff` also reads the candidate as quantized along the
#: wrong axis (always where its sizes fit only that reading).
WRONG_AXIS_RATE = 0.05


@dataclass
class AxisReading:
    """The candidate read as a wrong-axis quantization: as given and as compared (the bytes the reading explains
    replaced by fpsim's), masks of the explained bytes, the finding and the bytes left unexplained."""

    cand: np.ndarray
    fixed: np.ndarray
    layout_c: np.ndarray
    cand_s: np.ndarray
    fixed_s: np.ndarray
    layout_s: np.ndarray
    finding: str
    n_left: int


def _read_codes(raw: np.ndarray, R: int, C: int, widths: set, is_packed: bool) -> tuple[np.ndarray, np.ndarray]:
    """Codes [R, C] of flat candidate bytes ``raw`` read as fpsim reads them (rows of one of ``widths`` bytes), or
    the first R·C codes of the stream; and the mask of the codes a shorter stream lacks (read as 0)."""
    unpack = unpack_fp4 if is_packed else (lambda a: a)
    lost = np.zeros((R, C), bool)
    if raw.size % R == 0 and raw.size // R in widths:
        return unpack(raw.reshape(R, -1))[:, :C], lost
    stream = unpack(raw.reshape(1, -1)).reshape(-1)[: R * C]
    out = np.zeros(R * C, np.uint8)
    out[: stream.size] = stream
    lost.reshape(-1)[stream.size:] = True
    return out.reshape(R, C), lost


def _read_scales(raw: np.ndarray, R: int, nb: int, swizzled: bool, dtype) -> tuple[np.ndarray, np.ndarray]:
    """Scales [R, nb] of flat candidate scale bytes read as fpsim reads them, or the first R·nb of the stream; and
    the mask of the bytes a shorter stream lacks (read as 0)."""
    lost = np.zeros((R, nb), bool)
    n_sw = (128 * -(-R // 128)) * (4 * -(-nb // 4))
    if swizzled and raw.size == n_sw:
        return unswizzle_scales(raw, R, nb).astype(dtype), lost
    if not swizzled and raw.size == R * nb:
        return raw.reshape(R, nb).astype(dtype), lost
    out = np.zeros(R * nb, dtype)
    out[: min(raw.size, R * nb)] = raw[: R * nb]
    lost.reshape(-1)[raw.size:] = True
    return out.reshape(R, nb), lost


def _valid(cc: np.ndarray, cs: np.ndarray, sch: BlockScheme, is_packed: bool) -> bool:
    """Whether the candidate's arrays hold raw code and scale bytes at all (else fpsim's own reading reports them)."""
    top = 0xFF if is_packed else (1 << sch.element.bits) - 1
    if cc.dtype.kind not in "iu" or (cc.size and (cc.min() < 0 or cc.max() > top)):
        return False
    if sch.kind is Kind.FP32:
        return cs.dtype == np.float32
    return cs.dtype.kind in "iu" and not (cs.size and (cs.min() < 0 or cs.max() > 0xFF))


def _best(options, cand, lost, ours, same):
    """The option (description, bytes read like the candidate's) that explains most of the differing bytes, with
    the mask of the bytes it explains; None where no option has the candidate's size."""
    bad = ~same(cand, ours) | lost
    best = None
    for name, exp in options:
        hit = bad & (same(cand, exp) | lost)
        if best is None or hit.sum() > best[2].sum():
            best = (name, exp, hit)
    return None if best is None else (best[0], best[2], bad)


def axis_reading(candidate_codes, candidate_scales, X: np.ndarray, sch: BlockScheme, ref: Convention, packed: bool,
                 swizzled: bool, ours_p: np.ndarray, ours_s: np.ndarray, seed: int | None = None) -> AxisReading | None:
    """The candidate read as fpsim's bytes of the transposed view ``X.T`` (``seed``: stochastic rounding's), stored
    in either orientation, when that leaves fewer than half of the bytes that differ from fpsim's ``ours_p`` /
    ``ours_s`` unexplained; None otherwise (or where the arrays cannot be raw bytes of that reading)."""
    R, C = X.shape
    cc, cs = np.asarray(candidate_codes), np.asarray(candidate_scales)
    el = sch.element
    is_packed = el.bits == 4 and packed
    if R < 2 or C < 1 or not _valid(cc, cs, sch, is_packed):
        return None
    _, pT, sT, _ = reference(np.ascontiguousarray(X.T), sch, 1, ref, seed)
    BR, BC, nb = sch.block[0], sch.block[1], ours_s.shape[1]
    raw = cc.reshape(-1).astype(np.uint8)
    raw_s = cs.reshape(-1).astype(ours_s.dtype)
    pack = pack_fp4 if is_packed else (lambda a: a)
    # the code matrices a wrong-axis kernel may store: the transpose's rows (plain or padded to whole blocks), or
    # the view's orientation (plain, or padded to fpsim's whole blocks)
    mats = {f"[{C}, {R}] (the transpose's layout)": pT[:, :R], f"[{C}, {pT.shape[1]}] (the transpose's layout, "
            "padded to whole blocks)": pT, f"[{R}, {C}] (the view's orientation)": pT[:, :R].T}
    padded = np.zeros((R, nb * BC), np.uint8)
    padded[:, :C] = pT[:, :R].T
    mats[f"[{R}, {nb * BC}] (the view's orientation, padded to whole blocks)"] = padded
    widths = {-(-C // 2), nb * BC // 2} if is_packed else {C, nb * BC}
    opts_c = []
    for name, m in mats.items():
        b = pack(np.ascontiguousarray(m)).reshape(-1)
        if b.size == raw.size:
            opts_c.append((name, _read_codes(b, R, C, widths, is_packed)[0]))
    if is_packed:  # the same kernel writing element 2j in the high nibble: both bugs at once (after: no tie wins)
        for name, m in mats.items():
            b = pack(np.ascontiguousarray(m)).reshape(-1)
            if b.size == raw.size:
                b = ((b >> 4) | (b << 4)).astype(np.uint8)
                opts_c.append((f"{name} with the two nibbles of each byte swapped (element 2j in the high nibble; "
                               "fpsim, cvt.*.e2m1x2 and cuBLAS: low nibble)", _read_codes(b, R, C, widths, True)[0]))
    sw = swizzled and sch.kind is not Kind.FP32
    opts_s = []
    for name, m in ((f"[{C}, {sT.shape[1]}] (the transpose's layout)", sT),
                    (f"[{sT.shape[1]}, {C}] (the view's orientation)", np.ascontiguousarray(sT.T))):
        b = swizzle_scales(m) if sw else m.reshape(-1)
        if b.size == raw_s.size:
            opts_s.append((name + (", swizzled" if sw else ""), _read_scales(b, R, nb, swizzled, ours_s.dtype)[0]))
    if BR > 1 and raw_s.size == ours_s.size:  # square tiles: the tile scales are fpsim's, whichever the axis
        opts_s.insert(0, (f"[{R}, {nb}] as fpsim's (a tile's scale is the same either way)",
                          ours_s))
    cand, lost = _read_codes(raw, R, C, widths, is_packed)
    cand_s, lost_s = _read_scales(raw_s, R, nb, swizzled, ours_s.dtype)
    got_c = _best(opts_c, cand, lost, ours_p[:, :C], np.equal)
    got_s = _best(opts_s, cand_s, lost_s, ours_s, same_scales)
    if got_c is None or got_s is None:
        return None
    (how_c, hit_c, bad_c), (how_s, hit_s, bad_s) = got_c, got_s
    if not bad_s.any():
        how_s = "as fpsim's (none differs)"
    n_plain = int(bad_c.sum() + bad_s.sum())
    n_left = n_plain - int(hit_c.sum() + hit_s.sum())
    if not n_plain or n_left * 2 >= n_plain:
        return None
    layout_c = np.zeros(ours_p.shape, bool)
    layout_c[:, :C] = hit_c
    tile = f"{BR}×{BC}"
    what = (f"the candidate formed its {tile} blocks down the columns of the [{R}, {C}] view (the quantized axis "
            f"last) instead of along its rows: fpsim's rules applied to the transpose" if BR == 1 else
            f"the candidate quantized the transpose of the [{R}, {C}] view (with {tile} tiles that changes no "
            f"value{'' if seed is None else ' but the random bits of stochastic rounding'}) and stored its bytes")
    finding = (f"{WRONG_AXIS}: {what}; codes stored {how_c}, scales {how_s}: that reproduces {n_plain - n_left} of "
               f"the {n_plain} differing bytes")
    return AxisReading(cand, np.where(hit_c, ours_p[:, :C], cand), layout_c, cand_s,
                       np.where(hit_s, ours_s, cand_s), hit_s, finding, n_left)
