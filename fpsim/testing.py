"""fpsim as a reference oracle inside another project's tests: assertions whose failure message is ``fpsim diff``'s
diagnosis.

::

    from fpsim.testing import assert_quantized_equal

    def test_my_nvfp4_kernel():
        x = torch.randn(128, 256, dtype=torch.bfloat16)
        codes, scales, g = my_kernel(x)                       # one E2M1 code per element (or packed), E4M3 scales
        assert_quantized_equal(codes, scales, x, "nvfp4", convention="te-cuda", global_scale=g)

The reference is :func:`fpsim.quantize` under ``convention`` (a producer's arithmetic, docs/spec.md §4.1; default
fpsim's own).  On a mismatch the :class:`AssertionError` says how many codes, block scales, values and which global
scale differ, lists the first differing blocks, and names the cause of every differing byte: the producer-convention
parts that reproduce it (:mod:`fpsim.oracle.producers`, NVFP4) or :func:`fpsim.oracle.diff`'s hypotheses (other
block formats, fpsim's convention), or "not explained".  numpy arrays and torch tensors (any device, bfloat16 and
float8 included) are accepted.  docs/testing.md has a pytest example.
"""

from __future__ import annotations

import numpy as np

from ._arrays import from_torch
from .conventions import get_convention, names, stored_global
from .dispatch import quantize
from .oracle import diff
from .oracle.producers import applies, diagnose
from .packing import unpack_fp4
from .schemes import get_scheme

__all__ = ["assert_quantized_equal", "assert_dequantized_equal"]

F32 = np.float32


def _np(a, what: str) -> np.ndarray:
    a = from_torch(a)
    if a is None:
        raise TypeError(f"{what} is None")
    return np.asarray(a)


def _bytes(a: np.ndarray) -> np.ndarray:
    """Raw bytes of scale or code arrays (float8 / uint8 / int8), as uint8 of the same shape."""
    if a.dtype.itemsize == 1:
        return np.ascontiguousarray(a).view(np.uint8)
    if a.dtype.kind in "iu":
        return a.astype(np.uint8)
    raise TypeError(f"expected one byte per code or scale, got dtype {a.dtype}")


def _same(a, b) -> np.ndarray:
    a, b = np.asarray(a, F32), np.asarray(b, F32)
    return (a.view(np.uint32) == b.view(np.uint32)) | (np.isnan(a) & np.isnan(b))


def _view(a: np.ndarray, axis: int) -> np.ndarray:
    """[R, C] with the quantized axis last."""
    m = np.moveaxis(a, axis, -1)
    return m.reshape(-1, m.shape[-1]) if m.ndim else m.reshape(1, 1)


def _expected(x, scheme, convention, axis):
    """fpsim's quantization of x under the convention: (q, codes [R, C] one per byte, scale bytes [R, nb])."""
    q = quantize(x, scheme, axis=axis, convention=convention)
    sch = get_scheme(scheme)
    n = np.moveaxis(np.asarray(x), axis, -1).shape[-1] if np.ndim(x) else 1
    data = np.asarray(q.data)
    codes = unpack_fp4(data) if sch.element.bits == 4 else data
    codes = codes.reshape(-1, codes.shape[-1])[:, :n]
    return q, codes, np.asarray(q.scales).reshape(codes.shape[0], -1)


def _first_blocks(bad_c, bad_s, ours_c, cand_c, ours_s, cand_s, block, show=4) -> list[str]:
    R, nb = bad_s.shape
    blk = bad_s.copy()
    pad = nb * block - bad_c.shape[1]
    bc = np.pad(bad_c, ((0, 0), (0, pad))).reshape(R, nb, block)
    blk |= bc.any(axis=-1)
    out = []
    for r, j in list(zip(*np.nonzero(blk)))[:show]:
        sl = slice(j * block, min((j + 1) * block, ours_c.shape[1]))
        out.append(f"  block ({r}, {j}): scale ours 0x{int(ours_s[r, j]):02X} candidate 0x{int(cand_s[r, j]):02X}; "
                   f"codes ours {' '.join(f'{int(v):X}' for v in ours_c[r, sl])} | candidate "
                   f"{' '.join(f'{int(v):X}' for v in cand_c[r, sl])}")
    return out


def assert_quantized_equal(codes, scales, x, scheme: str = "nvfp4", *, convention: str | None = None,
                           global_scale=None, values=None, axis: int = -1, packed: bool | None = None) -> None:
    """Assert that ``codes``, ``scales`` (and ``global_scale``, ``values`` if given) are what ``convention``'s
    producer writes for ``x``, bit for bit; otherwise raise AssertionError with ``fpsim diff``'s diagnosis.

    Parameters
    ----------
    codes
        Element codes with the quantized axis last ([rows, C]); for 4-bit elements one per byte or two per byte
        (element 2j in the low nibble; ``packed=None`` tells them apart by the row length).
    scales
        Block scale bytes [rows, C / block] (uint8 or a float8 dtype, viewed as bytes).
    x
        The input (numpy or torch; a bfloat16 input is quantized as bfloat16, as the producers do).
    scheme, axis
        As for :func:`fpsim.quantize`.
    convention
        The reference arithmetic: a name of :func:`fpsim.conventions.names` (NVFP4), default fpsim's own.
    global_scale
        NVFP4: the FP32 global scale the candidate stores (compared with :func:`fpsim.conventions.stored_global`).
    values
        The candidate's decoded values (compared with the reference's dequantization, bit for bit, NaN = NaN).
    """
    conv = get_convention(convention)
    xa = _np(x, "x")
    q, ours_c, ours_s = _expected(xa, scheme, conv.name, axis)
    sch = get_scheme(scheme)
    c = _bytes(_np(codes, "codes"))
    c = c.reshape(-1, c.shape[-1]) if c.ndim else c.reshape(1, 1)
    n = ours_c.shape[1]
    if sch.element.bits == 4 and (packed or (packed is None and c.shape[-1] * 2 in (n, n + 1))):
        c = unpack_fp4(c).reshape(c.shape[0], -1)
    c = c[:, :n]
    s = _np(scales, "scales")
    s = (s.astype(F32) if sch.scale is not None and sch.scale.bits == 32 else _bytes(s)).reshape(ours_s.shape) \
        if s.size == ours_s.size else s
    if c.shape != ours_c.shape or s.shape != ours_s.shape:
        raise AssertionError(f"shapes differ: codes {c.shape} (expected {ours_c.shape}), scales {s.shape} "
                             f"(expected {ours_s.shape}) for x of shape {xa.shape} along axis {axis}")
    bad_c = c != ours_c
    bad_s = ~_same(s, ours_s) if s.dtype == F32 else s != ours_s
    head = []
    if bad_c.any():
        head.append(f"codes: {int(bad_c.sum())} of {bad_c.size} differ")
    if bad_s.any():
        head.append(f"scales: {int(bad_s.sum())} of {bad_s.size} differ")
    g_bad = False
    if global_scale is not None:
        g_ours = stored_global(q)
        g = F32(np.asarray(_np(global_scale, "global_scale"), F32).reshape(-1)[0])
        g_bad = not bool(_same(g, g_ours).all())
        if g_bad:
            head.append(f"global scale: {float(g)!r} (expected {float(np.asarray(g_ours).reshape(-1)[0])!r}, "
                        f"{conv.stored.value} stored by {conv.name})")
    vals = None
    if values is not None:
        vals = _view(np.asarray(from_torch(values)).astype(F32), axis)
        ours_v = _view(np.asarray(q.dequantize(), F32), axis)
        bad_v = ~_same(vals, ours_v)
        if bad_v.any():
            head.append(f"values: {int(bad_v.sum())} of {bad_v.size} differ")
    if not head:
        return
    msg = [f"{sch.name} under convention {conv.name!r}: " + "; ".join(head)]
    msg += ["first differing blocks (codes in hex):"] + _first_blocks(bad_c, bad_s, ours_c, c, ours_s, s,
                                                                       sch.block[1] if sch.block else 1)
    msg += _diagnosis(xa, c, s, sch, conv, axis, global_scale, vals)
    raise AssertionError("\n".join(msg))


def _diagnosis(xa, c, s, sch, conv, axis, global_scale, vals) -> list[str]:
    """The causes: producer parts against the reference convention (NVFP4), else diff's hypotheses."""
    bf16 = str(xa.dtype) == "bfloat16"
    x2 = _view(np.asarray(xa).astype(F32), axis)
    if applies(sch) and s.dtype == np.uint8:
        cd = diagnose(x2, c, s, bf16=bf16, reference=conv.name, candidate_global=global_scale, candidate_values=vals)
        if cd.explained_by or cd.decoded_by or cd.global_cause or conv.name != "fpsim":
            return ["diagnosis (fpsim.oracle.producers):"] + ["  " + line for line in cd.lines()]
    rep = diff(c, s, xa, sch, axis=axis, packed=False, show=5)
    return ["diagnosis (fpsim.oracle.diff):"] + ["  " + line for line in rep.format_table().splitlines()]


def assert_dequantized_equal(values, x, scheme: str = "nvfp4", *, convention: str | None = None,
                             axis: int = -1) -> None:
    """Assert that ``values`` are ``fpsim.quantize(x, scheme, convention=...).dequantize()`` bit for bit (NaN =
    NaN, −0 ≠ +0); otherwise raise AssertionError naming the first differing elements and, for NVFP4, the decode
    parts or the producer convention whose values they are."""
    conv = get_convention(convention)
    xa = _np(x, "x")
    q = quantize(xa, scheme, axis=axis, convention=conv.name)
    ours = np.asarray(q.dequantize(), F32)
    v = np.asarray(from_torch(values)).astype(F32)
    if v.shape != ours.shape:
        raise AssertionError(f"values have shape {v.shape}, expected {ours.shape}")
    bad = ~_same(v, ours)
    if not bad.any():
        return
    idx = list(zip(*np.nonzero(bad)))[:5]
    msg = [f"{get_scheme(scheme).name} under convention {conv.name!r}: {int(bad.sum())} of {bad.size} values differ",
           "first differing values: " + "; ".join(f"{tuple(int(i) for i in k)}: {float(v[k])!r} (expected "
                                                   f"{float(ours[k])!r})" for k in idx)]
    same_as = [n for n in names() if n != conv.name and _same(
        np.asarray(quantize(xa, scheme, axis=axis, convention=n).dequantize(), F32), v).all()]
    if same_as:
        msg.append(f"they are exactly the values of convention {' and '.join(same_as)}")
    if applies(get_scheme(scheme)):
        _, oc, os_ = _expected(xa, scheme, conv.name, axis)
        cd = diagnose(_view(xa.astype(F32), axis), oc, os_, bf16=str(xa.dtype) == "bfloat16", reference=conv.name,
                      candidate_values=_view(v, axis))
        msg += ["diagnosis (the reference's bytes, other decode parts):"] + ["  " + line for line in cd.lines()]
    raise AssertionError("\n".join(msg))
