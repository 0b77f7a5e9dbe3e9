"""What a quantized checkpoint tensor shows, and how it compares with the original (docs/checkpoints.md).

:func:`inspect_group` makes one record per :class:`~fpsim.io.checkpoints.QuantizedGroup`: from the file alone
the code histogram, the zero-, subnormal- and max-scale blocks and the global scale; with the original tensor
the error of the file's decoded values against it and a conformance check (are the file's bytes what the
producer's convention, :mod:`fpsim.conventions`, gives the original?).  Every number is a number or None, with
the reason in ``notes``.  :func:`sharing` finds the tensors of a checkpoint stored with one global scale.
"""

from __future__ import annotations

import math

import numpy as np

from .checkpoints import QuantizedGroup, decode_quantized, read_codes, read_global
from .errors import InputError
from .readers import TensorRef

__all__ = ["inspect_group", "sharing", "original_amax"]

_E4M3_MAX_BYTE = 0x7E  # 448, the largest finite E4M3 value


def _scale_stats(scale_bytes: np.ndarray) -> dict:
    mag = scale_bytes & 0x7F
    return {"blocks": int(mag.size), "zero_scale_blocks": int(np.count_nonzero(mag == 0)),
            "subnormal_scale_blocks": int(np.count_nonzero((mag & 0x78 == 0) & (mag != 0))),
            "max_scale_blocks": int(np.count_nonzero(mag == _E4M3_MAX_BYTE)),
            "nan_scale_blocks": int(np.count_nonzero(mag == 0x7F))}


def _global(g: QuantizedGroup, value: float | None, rec: dict, notes: dict) -> None:
    rec["global_scale"] = value
    rec["global_scale_kind"] = g.global_kind
    rec["implied_amax"] = None
    if value is None:
        notes["global_scale"] = notes["implied_amax"] = notes["global_scale_kind"] = \
            f"{g.fmt.upper()} has no global scale"
        return
    if not (math.isfinite(value) and value > 0):
        notes["implied_amax"] = f"the global scale {value!r} is not a positive finite number"
        return
    rec["implied_amax"] = 2688.0 / value if g.global_kind == "encode" else value * 2688.0


class _Errors:
    """Running sums of the error metrics over row chunks: rel_error = ‖x − x̂‖/‖x‖, mse, max_abs_error, sqnr_db
    over the elements where both are finite (float64 sums)."""

    def __init__(self):
        self.ref2 = self.err2 = self.maxabs = 0.0
        self.n = self.total = 0

    def add(self, x: np.ndarray, xq: np.ndarray) -> None:
        ok = np.isfinite(x) & np.isfinite(xq)
        d = x[ok].astype(np.float64) - xq[ok].astype(np.float64)
        self.ref2 += float(np.sum(np.square(x[ok], dtype=np.float64)))
        self.err2 += float(np.sum(np.square(d)))
        self.maxabs = max(self.maxabs, float(np.max(np.abs(d)))) if d.size else self.maxabs
        self.n += int(d.size)
        self.total += int(x.size)

    def into(self, rec: dict, notes: dict, prefix: str = "") -> None:
        ref2, err2, n = self.ref2, self.err2, self.n
        rec[prefix + "rel_error"] = math.sqrt(err2 / ref2) if ref2 > 0 else None
        if ref2 == 0:
            notes[prefix + "rel_error"] = "the original is zero (or has no finite element)"
        rec[prefix + "mse"] = err2 / n if n else None
        rec[prefix + "max_abs_error"] = self.maxabs if n else None
        if not n:
            notes[prefix + "mse"] = notes[prefix + "max_abs_error"] = "no element is finite in both"
        if prefix:
            return
        rec["sqnr_db"] = 10 * math.log10(ref2 / err2) if ref2 > 0 and err2 > 0 else None
        if rec["sqnr_db"] is None:
            notes["sqnr_db"] = "exact (no error)" if err2 == 0 and ref2 > 0 else notes.get("rel_error", "undefined")
        rec["nonfinite_count"] = self.total - n


def _chunks(rows: int, cols: int):
    """Row ranges of about 2^20 elements: every comparison runs chunk by chunk, so memory follows the chunk."""
    step = max(1, (1 << 20) // max(1, cols))
    return [(r, min(r + step, rows)) for r in range(0, rows, step)]


def _amax(raw) -> float:
    """max |x| over the finite elements of an array (0.0 when it has none), chunk by chunk."""
    best = 0.0
    for r0, r1 in _chunks(raw.shape[0], int(np.prod(raw.shape[1:], dtype=np.int64)) if raw.ndim > 1 else 1):
        a = np.abs(np.asarray(raw[r0:r1], np.float32))
        a = a[np.isfinite(a)]
        best = max(best, float(a.max())) if a.size else best
    return best


def original_amax(ref: TensorRef) -> float:
    """max |x| over the finite elements of an original tensor (0.0 when it has none)."""
    return _amax(ref.load())


def _global_check(g: QuantizedGroup, raw, own_amax: float, glob_, fused_amax, rec: dict, notes: dict) -> float:
    """Is the file's global scale what ``g``'s producer convention gives from the tensor's own amax, or from the
    largest amax of the tensors sharing it?  Returns the tensor amax the blocks are then checked under."""
    from ..conventions import stored_global
    from ..dispatch import quantize

    def stored(amax: float) -> np.float32:  # the global scale depends on the amax and the input dtype only
        return np.float32(stored_global(quantize(raw[:1], "nvfp4", convention=g.producer, tensor_amax=amax)))

    rec["expected_global_scale"] = float(stored(own_amax))
    tries = [("the tensor's own amax", own_amax)]
    if fused_amax is not None and fused_amax != own_amax:
        tries.append(("the largest amax of the tensors sharing its global scale", fused_amax))
    for why, amax in tries:
        if glob_ is not None and stored(amax) == np.float32(glob_):
            rec["global_scale_equal"], rec["global_scale_from"] = True, why
            return amax
    rec["global_scale_equal"], rec["global_scale_from"] = False, None
    notes["global_scale_from"] = ("the file's global scale is not what the convention gives from the tensor's "
                                  "own amax" + (" or its group's largest" if len(tries) > 1 else "")
                                  + "; the blocks are checked under the amax it implies")
    implied = rec.get("implied_amax")
    return implied if implied is not None else own_amax


def _conformance(g: QuantizedGroup, raw, own_amax: float, codes, scale_bytes, glob_, fused_amax, convention,
                 rec: dict, notes: dict) -> None:
    """Compare the file's codes, block-scale bytes and global scale with the producer convention's quantization
    of the original ``raw`` in its own dtype (a BF16 original selects a convention's BF16 arithmetic), row chunk
    by row chunk under one tensor amax; ``convention`` names another convention for the blocks."""
    from ..dispatch import quantize

    conv = convention or g.producer
    rec["conformance_convention"] = conv
    amax = _global_check(g, raw, own_amax, glob_, fused_amax, rec, notes)
    blocks = scale_bytes.shape[1]
    pad = blocks * 16 - codes.shape[1]
    n_bad = n_scale = 0
    first = None
    for r0, r1 in _chunks(*codes.shape):
        q = quantize(raw[r0:r1], "nvfp4", convention=conv, tensor_amax=amax)
        exp = np.empty((r1 - r0, 2 * q.data.shape[1]), np.uint8)
        exp[:, 0::2] = q.data & 0x0F
        exp[:, 1::2] = q.data >> 4
        exp = exp[:, : codes.shape[1]]
        c = codes[r0:r1]
        diff_codes = np.pad(c != exp, ((0, 0), (0, pad))).reshape(r1 - r0, blocks, 16).any(axis=2)
        diff_scale = scale_bytes[r0:r1] != q.scales
        bad = diff_codes | diff_scale
        n_bad += int(np.count_nonzero(bad))
        n_scale += int(np.count_nonzero(diff_scale))
        if first is None and bad.any():
            r, b = (int(v) for v in np.argwhere(bad)[0])
            lo, hi = 16 * b, min(16 * b + 16, codes.shape[1])
            first = {"row": r0 + r, "block": b, "columns": [lo, hi], "scale_file": int(scale_bytes[r0 + r, b]),
                     "scale_expected": int(q.scales[r, b]), "codes_file": [int(v) for v in c[r, lo:hi]],
                     "codes_expected": [int(v) for v in exp[r, lo:hi]]}
    rec["blocks_differing"], rec["blocks_scale_differing"] = n_bad, n_scale
    rec["conformant"] = bool(n_bad == 0 and rec["global_scale_equal"])
    rec["first_difference"] = first
    if first is None:
        notes["first_difference"] = "no block differs"


def _scale_rows(g: QuantizedGroup, scale: np.ndarray, r0: int, r1: int) -> np.ndarray:
    return scale if g.fmt == "fp8" and scale.size == 1 else scale[r0:r1]


def inspect_group(g: QuantizedGroup, label: str, original: TensorRef | None = None,
                  reference_given: bool = False, fused_amax: float | None = None,
                  convention: str | None = None) -> dict:
    """One record for ``g`` (see the module docstring); raises :class:`InputError` with one line when unreadable.
    ``fused_amax``: the largest amax of the originals of the tensors that share ``g``'s global scale;
    ``convention``: check the blocks against this :mod:`fpsim.conventions` name instead of the producer's."""
    rec: dict = {"tensor": label, "producer": g.producer, "format": g.fmt, "decoded_dtype": g.dtype,
                 "parts": {k: r.name for k, r in g.parts.items()}, "shape": [int(s) for s in g.parts["codes"].shape]}
    notes: dict = {}
    rec["notes"] = notes
    if g.notes:
        notes["layout"] = "; ".join(g.notes)
    if g.error:
        raise InputError(f"{label}: {g.error}")
    codes, scale, glob_, inp = read_codes(g)
    rec["shape"] = [int(s) for s in codes.shape]
    rec["block"] = g.block
    hist = np.bincount(codes.reshape(-1), minlength=256)
    rec["code_histogram"] = [int(c) for c in hist[:16]] if g.fmt in ("nvfp4", "mxfp4") else None
    if rec["code_histogram"] is None:
        notes["code_histogram"] = "FP8 has 256 codes: not listed"
    rec["scale_min"] = rec["scale_max"] = None  # the smallest and largest finite scale value (MX and FP8)
    if g.fmt == "fp8":
        rec.update(blocks=None, zero_scale_blocks=None, subnormal_scale_blocks=None, max_scale_blocks=None,
                   nan_scale_blocks=None)
        for k in ("blocks", "zero_scale_blocks", "subnormal_scale_blocks", "max_scale_blocks", "nan_scale_blocks"):
            notes[k] = "FP8 with a float scale per tensor or per row has no E4M3 block scales"
        finite = scale[np.isfinite(scale)]
    elif g.fmt in ("mxfp4", "mxfp8"):
        rec.update(blocks=int(scale.size), zero_scale_blocks=None, subnormal_scale_blocks=None,
                   max_scale_blocks=None, nan_scale_blocks=int(np.count_nonzero(scale == 0xFF)))
        for k in ("zero_scale_blocks", "subnormal_scale_blocks", "max_scale_blocks"):
            notes[k] = "E8M0 scales are powers of two: no zero or subnormal scale"
        finite = np.ldexp(np.float64(1.0), scale[scale != 0xFF].astype(np.int64) - 127)
    else:
        rec.update(_scale_stats(scale))
        finite = np.empty(0)
        notes["scale_min"] = notes["scale_max"] = "NVFP4: see the block counts and the global scale"
    if g.fmt != "nvfp4":
        rec["scale_min"], rec["scale_max"] = (float(finite.min()), float(finite.max())) if finite.size else (None, None)
        if not finite.size:
            notes["scale_min"] = notes["scale_max"] = "no finite scale"
    _global(g, glob_, rec, notes)
    rec["input_scale"] = inp
    kind = "encode" if g.producer == "compressed-tensors" else "decode"
    rec["input_scale_kind"] = kind if inp is not None else None
    if inp is None:
        notes["input_scale"] = notes["input_scale_kind"] = "no static activation scale in the file"
    if g.block is None:
        notes["block"] = "FP8 scales are per tensor or per row, not per block"
    chunks = _chunks(*codes.shape)
    decoded_amax, finite = 0.0, True
    for r0, r1 in chunks:
        xq = decode_quantized(g, codes[r0:r1], _scale_rows(g, scale, r0, r1), glob_)
        finite = finite and bool(np.isfinite(xq).all())
        decoded_amax = max(decoded_amax, float(np.max(np.abs(xq)))) if xq.size and finite else decoded_amax
    rec["decoded_amax"] = decoded_amax if codes.size and finite else None
    if rec["decoded_amax"] is None:
        notes["decoded_amax"] = "empty, or a decoded value is not finite"
    ref_keys = ("rel_error", "mse", "max_abs_error", "sqnr_db", "nonfinite_count", "fpsim_rel_error", "fpsim_mse",
                "fpsim_max_abs_error", "conformant", "global_scale_equal", "global_scale_from", "expected_global_scale",
                "blocks_differing", "blocks_scale_differing", "first_difference", "conformance_convention")
    if original is None:
        why = (f"no tensor {g.name} in the reference" if reference_given else "no --reference given")
        for k in ref_keys:
            rec[k] = None
            notes[k] = why
        return rec
    raw = original.load()
    if tuple(raw.shape) != tuple(codes.shape):
        raise InputError(f"{label}: the reference's {original.key} has shape {list(raw.shape)}, the file's "
                         f"tensor {list(codes.shape)}")
    if not (raw.dtype.kind == "f" or raw.dtype.name == "bfloat16"):
        raise InputError(f"{label}: the reference's {original.key} is not a floating-point tensor ({raw.dtype})")
    rec["reference"] = original.key
    from ..dispatch import fake_quantize

    own_amax = _amax(raw)
    scheme = {"nvfp4": "nvfp4", "mxfp4": "mxfp4", "mxfp8": "mxfp8_e4m3", "fp8": "fp8_e4m3"}[g.fmt]
    kw = {"tensor_amax": own_amax} if g.fmt in ("nvfp4", "fp8") else {}  # one tensor scale over every chunk
    ours, theirs = _Errors(), _Errors()
    for r0, r1 in chunks:
        x = np.asarray(raw[r0:r1], np.float32)
        ours.add(x, decode_quantized(g, codes[r0:r1], _scale_rows(g, scale, r0, r1), glob_))
        theirs.add(x, fake_quantize(x, scheme, **kw))
    ours.into(rec, notes)
    theirs.into(rec, notes, prefix="fpsim_")
    if g.fmt == "nvfp4":
        bf16 = raw.dtype.name == "bfloat16"
        _conformance(g, raw if bf16 else np.asarray(raw, np.float32), own_amax, codes, scale, glob_, fused_amax,
                     convention, rec, notes)
    else:
        for k in ("conformant", "global_scale_equal", "global_scale_from", "expected_global_scale", "blocks_differing",
                  "blocks_scale_differing", "first_difference", "conformance_convention"):
            rec[k] = None
            notes[k] = f"checked for NVFP4 only, not {g.fmt.upper()}"
    return rec


def sharing(groups: list[QuantizedGroup]) -> dict[int, list[QuantizedGroup]]:
    """id(group) → the other groups of its checkpoint whose global scale has the same float32 bits (fused q/k/v
    and gate/up projections share one, as serving engines require); [] for a group without a global scale."""
    by: dict[tuple, list[QuantizedGroup]] = {}
    for g in groups:
        v = read_global(g)
        if v is not None:
            by.setdefault((g.directory, np.float32(v).tobytes()), []).append(g)
    out: dict[int, list[QuantizedGroup]] = {id(g): [] for g in groups}
    for members in by.values():
        for g in members:
            out[id(g)] = [m for m in members if m is not g]
    return out
