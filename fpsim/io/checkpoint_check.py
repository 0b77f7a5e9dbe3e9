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


def _errors(x: np.ndarray, xq: np.ndarray, rec: dict, notes: dict, prefix: str = "") -> None:
    """rel_error = ‖x − x̂‖/‖x‖, mse, max_abs_error, sqnr_db over the elements where both are finite (float64 sums)."""
    ok = np.isfinite(x) & np.isfinite(xq)
    d = (x[ok].astype(np.float64) - xq[ok].astype(np.float64))
    ref2 = float(np.sum(np.square(x[ok], dtype=np.float64)))
    err2 = float(np.sum(np.square(d)))
    n = int(np.count_nonzero(ok))
    rec[prefix + "rel_error"] = math.sqrt(err2 / ref2) if ref2 > 0 else None
    if ref2 == 0:
        notes[prefix + "rel_error"] = "the original is zero (or has no finite element)"
    rec[prefix + "mse"] = err2 / n if n else None
    rec[prefix + "max_abs_error"] = float(np.max(np.abs(d))) if n else None
    if not n:
        notes[prefix + "mse"] = notes[prefix + "max_abs_error"] = "no element is finite in both"
    if prefix:
        return
    rec["sqnr_db"] = 10 * math.log10(ref2 / err2) if ref2 > 0 and err2 > 0 else None
    if rec["sqnr_db"] is None:
        notes["sqnr_db"] = "exact (no error)" if err2 == 0 and ref2 > 0 else notes.get("rel_error", "undefined")
    rec["nonfinite_count"] = int(x.size - n)


def original_amax(ref: TensorRef) -> float:
    """max |x| over the finite elements of an original tensor (0.0 when it has none)."""
    x = np.abs(np.asarray(ref.load(), np.float32))
    x = x[np.isfinite(x)]
    return float(x.max()) if x.size else 0.0


def _quantize(g: QuantizedGroup, x, glob_, fused_amax, convention, rec: dict, notes: dict):
    """fpsim's quantization of ``x`` under ``g``'s producer convention, with the global scale the file holds when
    the convention gives it from the tensor's own amax or from the largest amax of the tensors sharing it; under
    ``convention`` instead (the same tensor amax) when one is named."""
    from ..conventions import stored_global
    from ..dispatch import quantize

    own = quantize(x, "nvfp4", convention=g.producer)
    rec["expected_global_scale"] = float(stored_global(own))
    tries = [("the tensor's own amax", own)]
    if fused_amax is not None and fused_amax != float(own.amax):
        tries.append(("the largest amax of the tensors sharing its global scale",
                      quantize(x, "nvfp4", convention=g.producer, tensor_amax=fused_amax)))
    for why, q in tries:
        if glob_ is not None and np.float32(stored_global(q)) == np.float32(glob_):
            rec["global_scale_equal"], rec["global_scale_from"] = True, why
            break
    else:
        rec["global_scale_equal"], rec["global_scale_from"] = False, None
        notes["global_scale_from"] = ("the file's global scale is not what the convention gives from the tensor's "
                                      "own amax" + (" or its group's largest" if len(tries) > 1 else "")
                                      + "; the blocks are checked under the amax it implies")
        implied = rec.get("implied_amax")
        q = quantize(x, "nvfp4", convention=g.producer, tensor_amax=implied) if implied is not None else own
    if convention in (None, g.producer):
        return q
    return quantize(x, "nvfp4", convention=convention, tensor_amax=float(q.amax))  # the same amax, another order


def _conformance(g: QuantizedGroup, x, codes, scale_bytes, glob_, fused_amax, convention, rec: dict,
                 notes: dict) -> None:
    """Compare the file's codes, block-scale bytes and global scale with the producer convention's quantization
    of ``x`` (the original, in its own dtype: a BF16 original selects a convention's BF16 arithmetic)."""
    rec["conformance_convention"] = convention or g.producer
    q = _quantize(g, x, glob_, fused_amax, convention, rec, notes)
    exp_codes = np.empty((q.data.shape[0], 2 * q.data.shape[1]), np.uint8)
    exp_codes[:, 0::2] = q.data & 0x0F
    exp_codes[:, 1::2] = q.data >> 4
    exp_codes = exp_codes[:, : codes.shape[1]]
    blocks = scale_bytes.shape[1]
    pad = blocks * 16 - codes.shape[1]
    diff_codes = np.pad(codes != exp_codes, ((0, 0), (0, pad))).reshape(codes.shape[0], blocks, 16).any(axis=2)
    diff_scale = scale_bytes != q.scales
    bad = diff_codes | diff_scale
    rec["blocks_differing"] = int(np.count_nonzero(bad))
    rec["blocks_scale_differing"] = int(np.count_nonzero(diff_scale))
    rec["conformant"] = bool(rec["blocks_differing"] == 0 and rec["global_scale_equal"])
    rec["first_difference"] = None
    if rec["blocks_differing"]:
        r, b = (int(v) for v in np.argwhere(bad)[0])
        lo, hi = 16 * b, min(16 * b + 16, codes.shape[1])
        rec["first_difference"] = {
            "row": r, "block": b, "columns": [lo, hi], "scale_file": int(scale_bytes[r, b]),
            "scale_expected": int(q.scales[r, b]), "codes_file": [int(c) for c in codes[r, lo:hi]],
            "codes_expected": [int(c) for c in exp_codes[r, lo:hi]]}
    else:
        notes["first_difference"] = "no block differs"


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
    xq = decode_quantized(g, codes, scale, glob_)
    rec["decoded_amax"] = float(np.max(np.abs(xq))) if xq.size and np.isfinite(xq).all() else None
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
    x = np.asarray(raw, np.float32)
    if tuple(x.shape) != tuple(codes.shape):
        raise InputError(f"{label}: the reference's {original.key} has shape {list(x.shape)}, the file's "
                         f"tensor {list(codes.shape)}")
    rec["reference"] = original.key
    _errors(x, xq, rec, notes)
    from ..dispatch import fake_quantize

    scheme = {"nvfp4": "nvfp4", "mxfp4": "mxfp4", "mxfp8": "mxfp8_e4m3", "fp8": "fp8_e4m3"}[g.fmt]
    _errors(x, fake_quantize(x, scheme), rec, notes, prefix="fpsim_")
    if g.fmt == "nvfp4":
        bf16 = getattr(raw, "dtype", None) is not None and raw.dtype.name == "bfloat16"
        _conformance(g, raw if bf16 else x, codes, scale, glob_, fused_amax, convention, rec, notes)
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
