"""Helpers shared by the oracle modules: float32 fields and code spellings, reading user files."""

from __future__ import annotations

import math
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from ..codecs import decode
from ..formats import FormatSpec

__all__ = ["F32", "FLT_MAX", "code_bits", "code_info", "f32_fields", "fmin_nan", "f32_class", "hex32",
           "load_arrays", "positive_codes"]

F32 = np.float32
FLT_MAX = F32(np.finfo(np.float32).max)


class DiagnosisError(RuntimeError):
    """:func:`fpsim.oracle.diff` failed after its inputs were checked: a bug in fpsim, not a bad input (the message
    names the original exception, chained as ``__cause__``)."""


def exception_line(e: BaseException) -> str:
    """``Type: first line of the message`` (``Type`` alone for an empty message): an exception in one line."""
    msg = str(e).splitlines()[0] if str(e) else ""
    return f"{type(e).__name__}{': ' + msg if msg else ''}"


@contextmanager
def internal_errors():
    """Inputs checked: any exception in the block (but MemoryError) is fpsim's bug, raised as DiagnosisError."""
    try:
        yield
    except MemoryError:
        raise
    except Exception as e:
        raise DiagnosisError(f"fpsim's diagnosis failed ({exception_line(e)}): a bug in fpsim, not in the inputs; "
                             "please report it with them") from e


def hex32(v) -> str:
    """The float32 bits of ``v`` as ``0xXXXXXXXX``."""
    return f"0x{int(np.asarray(v, np.float32).view(np.uint32)):08X}"


def f32_class(v) -> str:
    """``"nan"``, ``"inf"`` (either sign), ``"zero"``, ``"subnormal"`` or ``"normal"``: the class of float32 ``v``.

    JSON output writes NaN and ±inf as ``null`` (``fpsim.io.to_json``); this class, next to the value, says why.
    """
    b = int(np.asarray(v, np.float32).view(np.uint32))
    e, m = (b >> 23) & 0xFF, b & 0x7FFFFF
    if e == 0xFF:
        return "nan" if m else "inf"
    if e == 0:
        return "subnormal" if m else "zero"
    return "normal"


def f32_fields(v) -> dict:
    """The float32 ``v``: value, bits in hex, sign / exponent / mantissa fields and class (:func:`f32_class`)."""
    v = F32(v)
    b = int(np.asarray(v).view(np.uint32))
    s, e, m = b >> 31, (b >> 23) & 0xFF, b & 0x7FFFFF
    cls = f32_class(v)
    return {
        "value": float(v),
        "hex": f"0x{b:08X}",
        "sign": s,
        "exponent_field": e,
        "mantissa_field": f"0x{m:06X}",
        "unbiased_exponent": (e - 127) if cls == "normal" else (-126 if cls == "subnormal" else None),
        "class": cls,
    }


def code_bits(code: int, spec: FormatSpec) -> str:
    """Code as its fields separated by dots: s.ee.m for E2M1, eeeeeeee for E8M0."""
    b = format(code, f"0{spec.bits}b")
    parts = []
    i = 0
    if spec.signed:
        parts.append(b[0])
        i = 1
    parts.append(b[i : i + spec.ebits])
    if spec.mbits:
        parts.append(b[i + spec.ebits :])
    return ".".join(parts)


def code_info(code: int, spec: FormatSpec) -> dict:
    """Code, hex spelling, fields in binary, decoded value and its class (:func:`f32_class`) of one code."""
    v = decode(np.array([code]), spec)[0]
    return {
        "code": int(code),
        "hex": f"0x{code:0{(spec.bits + 3) // 4}X}",
        "binary": code_bits(int(code), spec),
        "value": float(v),
        "class": f32_class(v),
    }


def positive_codes(spec: FormatSpec) -> tuple[np.ndarray, np.ndarray]:
    """Finite non-negative grid values (ascending, float64) and the positive code of each."""
    table = spec.decode_table()
    n = 1 << (spec.bits - 1 if spec.signed else spec.bits)
    vals, codes = [], []
    for c in range(n):
        v = float(table[c])
        if math.isfinite(v) and (not vals or v > vals[-1]):
            vals.append(v)
            codes.append(c)
    return np.array(vals), np.array(codes)


def fmin_nan(a, b):
    """min with a NaN first argument propagating (CUDA ``fminf`` would drop it)."""
    return a if (a != a or a <= b) else b



def load_arrays(path) -> dict[str, np.ndarray]:
    """All arrays of a ``.npz`` (``allow_pickle=False``), ``.npy`` or ``.safetensors`` file; never unpickles.

    Raises ``ValueError`` with a one-line message for a missing, unreadable or pickled file.
    """
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"{p}: no such file")
    suffix = p.suffix.lower()
    try:
        if suffix in (".npz", ".npy"):
            loaded = np.load(p, allow_pickle=False)
            if isinstance(loaded, np.ndarray):
                return {"": loaded}
            with loaded as z:
                return {k: z[k] for k in z.files}
        if suffix == ".safetensors":
            from safetensors.numpy import load_file

            return dict(load_file(str(p)))
    except ValueError as e:
        if "pickle" in str(e).lower():
            raise ValueError(f"{p}: refusing to load pickled data (allow_pickle=False)") from None
        raise ValueError(f"{p}: cannot read: {str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
    except Exception as e:  # zipfile.BadZipFile, OSError, SafetensorError …: one line, no traceback
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ValueError(f"{p}: cannot read ({type(e).__name__}: {msg})") from None
    raise ValueError(f"{p}: unsupported file type {suffix!r} (use .npz, .npy or .safetensors)")
