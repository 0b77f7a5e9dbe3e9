"""Input validation shared by the public API: one place decides what an array may be."""

from __future__ import annotations

import numpy as np

from .formats import FormatSpec

_FLOAT_KINDS = "fbiu"  # float, bool, signed, unsigned: convertible to float32 by value


#: torch dtypes numpy lacks, read as their bits and viewed as the ml_dtypes type of the same name
_TORCH_BITS = {"bfloat16": ("int16", "bfloat16"), "float8_e4m3fn": ("uint8", "float8_e4m3fn"),
               "float8_e5m2": ("uint8", "float8_e5m2"), "float8_e4m3fnuz": ("uint8", "float8_e4m3fnuz"),
               "float8_e5m2fnuz": ("uint8", "float8_e5m2fnuz"), "float8_e8m0fnu": ("uint8", "float8_e8m0fnu")}


def from_torch(x):
    """A torch tensor (any device, with or without grad) as a numpy array of the same dtype — bfloat16 and the
    float8 types as ml_dtypes arrays, by their bits — so that every public function takes torch tensors as
    :func:`fpsim.encode` does; anything else is returned unchanged.  torch is never imported here: a torch
    tensor's own module is already loaded."""
    if not type(x).__module__.startswith("torch") or not hasattr(x, "detach"):
        return x
    import sys

    torch = sys.modules["torch"]
    t = x.detach().cpu()
    name = str(t.dtype).removeprefix("torch.")
    if name in _TORCH_BITS:
        import ml_dtypes

        bits, ml = _TORCH_BITS[name]
        return t.contiguous().view(getattr(torch, bits)).numpy().view(getattr(ml_dtypes, ml))
    return t.numpy()


def as_float32(x: np.typing.ArrayLike) -> np.ndarray:
    """Return ``x`` as a C-contiguous float32 array (a view when it already is one).

    float64 / float16 / bfloat16 / float8 inputs are converted by value, with
    round-to-nearest-even where float32 cannot hold them (numpy's and
    ml_dtypes' casts; beyond float32's range, ±inf).  Complex, object, string and structured data raise
    ``TypeError``: silently dropping an imaginary part or parsing strings is
    never what a numerics user wants.
    """
    arr = np.asarray(from_torch(x))
    kind = arr.dtype.kind
    if kind == "V" and arr.dtype.names is None and arr.dtype.itemsize <= 4:
        pass  # ml_dtypes floats (bfloat16, float8_*, float4_*) report kind 'V'
    elif kind not in _FLOAT_KINDS:
        raise TypeError(f"expected real numbers, got an array of dtype {arr.dtype}")
    # a float64 beyond float32's range becomes ±inf, the cast's defined result (IEEE 754 RNE overflow, as
    # cvt.rn.f32.f64): numpy's RuntimeWarning about it would be noise on every caller's stderr
    with np.errstate(over="ignore"):
        return np.asarray(arr, dtype=np.float32, order="C")  # keeps 0-d (ascontiguousarray would not)


def as_codes(codes: np.typing.ArrayLike, spec: FormatSpec) -> np.ndarray:
    """Return codes as a C-contiguous unsigned array of ``spec.code_dtype``.

    Accepts integer arrays (range-checked by the decoder), or arrays whose
    dtype *is* the format's ml_dtypes / numpy dtype, which are read as bits.
    """
    arr = np.asarray(codes)
    if arr.dtype.kind not in "iu":
        try:
            same = arr.dtype == spec.ml_dtype
        except (ImportError, AttributeError):
            same = False
        if not same:
            raise TypeError(f"expected integer codes of {spec.name}, got dtype {arr.dtype}")
        arr = arr.view(f"u{arr.dtype.itemsize}")
    if arr.dtype.kind == "i" and arr.size and arr.min() < 0:
        raise ValueError(f"negative code in codes of {spec.name}")
    if arr.dtype.itemsize > spec.code_dtype.itemsize and arr.size and int(arr.max()) >> spec.bits:
        raise ValueError(f"code(s) outside the {spec.bits}-bit range of {spec.name}")
    return np.asarray(arr, dtype=spec.code_dtype, order="C")
