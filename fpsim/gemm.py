"""Block-scaled GEMM emulation (SPEC §8).

``gemm(qa, qb)`` computes ``A · Bᵀ`` for two operands whose *last* axis is the
reduction axis K (the "TN" layout of cuBLAS's FP8/FP4 GEMMs): ``A`` is M×K,
``B`` is N×K, each a :class:`~fpsim.scaling.QuantizedTensor` quantized along
axis −1 (any mix of NVFP4, MX, FP8, BF16) or a plain float array (scale 1).

SPEC §8's accumulation, model ``"fp32"`` (the default, bit-defined)::

    for each K-chunk c, ascending:
        P      = Σ_{t in c} e_a[i, t] · e_b[j, t]          (block dot product of element values)
        term   = fl(fl(s_a[i, c] · s_b[j, c]) · fl(P))
        acc    = fl(acc + term)                          (one FP32 rounding per chunk)
    out = fl(acc · alpha)

The chunk is the largest K-run on which both operands' block scales are
constant (the gcd of their block widths; 16 for NVFP4 × NVFP4; 32 when neither
operand has block scales).  ``P`` is summed in float64, which is exact for
every ≤ 8-bit element format but E5M2 (whose extreme products can span more
than 53 bits) and then rounded once: for E2M1 × E2M1 every product and every
16-term sum is exact in FP32, so this is the tensor core's exact block sum.
``alpha`` is the second-level factor: for two-level (NVFP4) operands
``fl(fl(amax_a · amax_b) / fl(N_a · N_b))`` with ``N = 6 · 448 = 2688`` (so
``7225344`` for NVFP4 × NVFP4), equal to ``S_dec_a · S_dec_b`` up to the last
bit; where an amax is 0, inf or NaN, or S_enc hit its FLT_MAX cap, the exact
``fl(S_dec_a · S_dec_b)`` is used instead (the amax formula would give 0/inf).

Other accumulator models: ``"exact"`` (float64 throughout, returns float64),
``"truncated"`` (the FP32 model with an accumulator of ``acc_bits`` fraction
bits: each chunk's exact sum ``acc + term`` is truncated toward zero to that
width — a model of narrow tensor-core accumulators), and ``"blas"`` (fast: the
operands multiplied by their block scales — exact in float32 — and one float32
BLAS matmul, whose summation order is BLAS's own: equal to the others only to
float32 rounding).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ._jit import pjit, prange
from ._kernels import bits_f32, f32_bits
from .packing import unpack_fp4
from .plan import lower
from .scaling import POW2_POS, s_enc_dec
from .schemes import Kind
from .tensor import QuantizedTensor

__all__ = ["gemm", "ACCUMULATORS", "Operand", "operand"]

ACCUMULATORS = ("fp32", "exact", "truncated", "blas")
_FLT_MAX = np.float32(np.finfo(np.float32).max)


@dataclass(frozen=True)
class Operand:
    """A GEMM operand as element values, block-scale values and second-level factors.

    ``values``: float32 (R, K) element values (unscaled codes decoded);
    ``scales``: float32 (R, nb) block scale values; ``block``: scale block width
    along K (0 = one scale for the whole row); ``s_dec``: float32 (R,) second
    level decode scale; ``amax``: float32 (R,) tensor amax (NaN without a
    second level); ``two_level``: whether alpha comes from the amax formula.
    """

    values: np.ndarray
    scales: np.ndarray
    block: int
    s_dec: np.ndarray
    amax: np.ndarray
    two_level: bool
    num: float  # N = max_elem · scale bound of the two-level scheme (2688 for NVFP4)


def operand(q: QuantizedTensor | np.typing.ArrayLike) -> Operand:
    """Split a quantized (or plain) 2-D operand, reduction axis last, into values and scales."""
    if not isinstance(q, QuantizedTensor):
        x = np.asarray(q, dtype=np.float32)
        if x.ndim != 2:
            raise ValueError(f"GEMM operands must be 2-D, got shape {x.shape}")
        r = x.shape[0]
        return Operand(x, np.ones((r, 1), np.float32), 0, np.ones(r, np.float32), np.full(r, np.nan, np.float32),
                       False, 1.0)
    if len(q.shape) != 2 or q.axis != 1:
        raise ValueError(
            f"GEMM operands must be 2-D and quantized along their last axis (K); got shape {q.shape}, axis {q.axis}. "
            "Quantize the transpose for a column-wise operand."
        )
    sch = q.scheme
    el = sch.element
    rows, k = q.shape
    kind = sch.kind
    codes = q.data
    if kind is Kind.CAST:
        values = el.decode_table()[codes] if el.bits <= 16 else codes.view(np.float32)
        return Operand(values.astype(np.float32), np.ones((rows, 1), np.float32), 0, np.ones(rows, np.float32),
                       np.full(rows, np.nan, np.float32), False, 1.0)
    if el.bits == 4:
        codes = unpack_fp4(codes)
    values = el.decode_table()[codes[:, :k]]
    two_level = False
    num = 1.0
    amax = np.full(rows, np.nan, np.float32)
    s_dec = np.ones(rows, np.float32)
    if kind is Kind.TWO_LEVEL:
        assert sch.scale is not None and sch.block is not None
        scales = sch.scale.decode_table()[q.scales]
        if sch.tensor_scale:
            a = np.asarray(q.amax, np.float32)
            amax = a.reshape(rows) if sch.per_row_scale else np.full(rows, a.reshape(()), np.float32)
            plan = lower(sch)
            _, s_dec = s_enc_dec(plan, amax)
            two_level = True
            assert plan.two_level is not None
            num = float(plan.two_level.num)
        block = sch.block[1]
    elif kind is Kind.POW2:
        assert sch.block is not None
        scales = POW2_POS[q.scales]
        block = sch.block[1]
    else:  # FP32 scales: blockwise, or one per tensor
        if sch.block is None:
            scales = np.full((rows, 1), np.float32(q.scales), np.float32)
            block = 0
        else:
            scales = np.asarray(q.scales, np.float32)
            block = sch.block[1]
    return Operand(np.ascontiguousarray(values, np.float32), np.ascontiguousarray(scales, np.float32), block,
                   s_dec.astype(np.float32), amax, two_level, num)


def _chunk(a: Operand, b: Operand) -> int:
    blocks = [x.block for x in (a, b) if x.block]
    return math.gcd(*blocks) if blocks else 32


def _chunk_scales(op: Operand, chunk: int, nchunks: int) -> np.ndarray:
    """Scale value of each K-chunk, shape (R, nchunks)."""
    if op.block == 0:
        return np.repeat(op.scales[:, :1], nchunks, axis=1)
    idx = (np.arange(nchunks) * chunk) // op.block
    return np.ascontiguousarray(op.scales[:, idx])


def chunked_operands(qa, qb) -> tuple[Operand, Operand, int, int, int, np.ndarray, np.ndarray]:
    """Both operands split (:func:`operand`), K, the chunk width, the chunk count and each operand's
    per-chunk scales: the set-up every accumulator model shares (the Numba kernels and the torch model)."""
    a, b = operand(qa), operand(qb)
    k = a.values.shape[1]
    if b.values.shape[1] != k:
        raise ValueError(f"reduction lengths differ: A is {a.values.shape}, B is {b.values.shape} (both K last)")
    chunk = _chunk(a, b)
    nch = -(-k // chunk)
    return a, b, k, chunk, nch, _chunk_scales(a, chunk, nch), _chunk_scales(b, chunk, nch)


def alpha_factor(a: Operand, b: Operand) -> np.ndarray:
    """Second-level factor per output element (M, N), float32 (SPEC §8)."""
    if not (a.two_level or b.two_level):
        return np.ones((1, 1), np.float32)
    sd = a.s_dec[:, None] * b.s_dec[None, :]  # fl(S_dec_a · S_dec_b)
    if not (a.two_level and b.two_level):
        return sd.astype(np.float32)
    with np.errstate(all="ignore"):
        prod = a.amax[:, None] * b.amax[None, :]
        alpha = prod / (np.float32(a.num) * np.float32(b.num))
        ok_a = np.isfinite(a.amax) & (a.amax > 0) & (np.float32(a.num) / a.amax < _FLT_MAX)
        ok_b = np.isfinite(b.amax) & (b.amax > 0) & (np.float32(b.num) / b.amax < _FLT_MAX)
    ok = ok_a[:, None] & ok_b[None, :] & np.isfinite(alpha) & (alpha > 0)
    return np.where(ok, alpha, sd).astype(np.float32)


@pjit
def _gemm_blocked(ea, ebt, bfin, sa, sbt, chunk, mode, acc_bits, out32, out64):
    """Ascending-chunk block-scaled GEMM (mode 0 = fp32, 1 = exact float64, 2 = truncated accumulator).

    ``ebt`` is B's element values transposed (K × N) and ``sbt`` its chunk
    scales (chunks × N), so the innermost loops run contiguously over N and
    vectorise; the arithmetic per output element is exactly the ascending
    per-chunk sequence of the module docstring.  ``bfin[t]``: row t of ``ebt``
    is all finite, so a zero element of A may skip it (0 · ±inf and 0 · NaN
    are NaN and must reach the sum: SPEC §9, no silent finite garbage).
    """
    m, kp = ea.shape
    n = ebt.shape[1]
    nch = kp // chunk
    keep = np.uint32(0xFFFFFFFF) << np.uint32(23 - acc_bits) if mode == 2 else np.uint32(0xFFFFFFFF)
    for i in prange(m):
        p = np.empty(n, np.float64)
        acc32 = np.zeros(n, np.float32)
        acc64 = np.zeros(n, np.float64)
        for c in range(nch):
            p[:] = 0.0
            for t in range(c * chunk, c * chunk + chunk):
                a = np.float64(ea[i, t])
                if a != 0.0 or not bfin[t]:
                    for j in range(n):
                        p[j] += a * np.float64(ebt[t, j])
            s_a = sa[i, c]
            if mode == 1:
                for j in range(n):
                    acc64[j] += (np.float64(s_a) * np.float64(sbt[c, j])) * p[j]
            elif mode == 0:
                for j in range(n):
                    acc32[j] = acc32[j] + (s_a * sbt[c, j]) * np.float32(p[j])
            else:
                for j in range(n):
                    term = (s_a * sbt[c, j]) * np.float32(p[j])
                    a64 = np.float64(acc32[j])
                    t64 = np.float64(term)
                    s = a64 + t64  # not always exact: the exponents of two float32 values may be > 29 apart
                    bb = s - a64
                    e = (a64 - (s - bb)) + (t64 - bb)  # TwoSum: s + e is the exact sum
                    r = np.float32(s)
                    u = f32_bits(r)
                    # RTZ of the exact sum: step back one ulp when RNE went away from zero, judged on s + e
                    # (s alone misses e.g. 1 - 2^-60, which float64 rounds to 1)
                    if abs(np.float64(r)) > abs(s) or (
                        np.float64(r) == s and math.isfinite(s) and e != 0.0 and (e < 0.0) != (s < 0.0)
                    ):
                        u -= np.uint32(1)
                    acc32[j] = bits_f32(u & keep)
        if mode == 1:
            out64[i, :] = acc64
        else:
            out32[i, :] = acc32


def gemm(
    qa: QuantizedTensor | np.typing.ArrayLike,
    qb: QuantizedTensor | np.typing.ArrayLike,
    accumulator: str = "fp32",
    acc_bits: int = 23,
) -> np.ndarray:
    """Emulated block-scaled GEMM ``A · Bᵀ`` (SPEC §8); see the module docstring for the models.

    Parameters
    ----------
    qa, qb
        M×K and N×K operands, quantized along their last axis (or plain arrays).
    accumulator
        ``"fp32"`` (default, bit-defined), ``"exact"`` (float64 result),
        ``"truncated"`` (``acc_bits`` fraction bits, truncating), ``"blas"`` (fast).
    acc_bits
        Fraction bits of the truncated accumulator (1–23; 23 = float32 with RTZ).

    Returns
    -------
    numpy.ndarray
        M×N, float32 (float64 for ``"exact"``).

    Examples
    --------
    >>> import fpsim
    >>> a = fpsim.quantize(np.ones((2, 32), np.float32), "nvfp4")
    >>> gemm(a, a)
    array([[32., 32.],
           [32., 32.]], dtype=float32)
    """
    if accumulator not in ACCUMULATORS:
        raise ValueError(f"unknown accumulator {accumulator!r}; known: {', '.join(ACCUMULATORS)}")
    if accumulator == "truncated" and not 1 <= int(acc_bits) <= 23:
        raise ValueError("acc_bits must be in 1..23")
    a, b, k, chunk, nch, sa, sb = chunked_operands(qa, qb)
    kp = nch * chunk
    alpha = alpha_factor(a, b)
    m, n = a.values.shape[0], b.values.shape[0]

    if accumulator == "blas":
        wa = a.values * np.repeat(sa, chunk, axis=1)[:, :k]  # exact: element × scale fits float32
        wb = b.values * np.repeat(sb, chunk, axis=1)[:, :k]
        with np.errstate(all="ignore"):
            return (wa @ wb.T) * alpha

    ea = np.zeros((m, kp), np.float32)
    ea[:, :k] = a.values
    ebt = np.zeros((kp, n), np.float32)
    ebt[:k, :] = b.values.T
    mode = {"fp32": 0, "exact": 1, "truncated": 2}[accumulator]
    out32 = np.empty((m, n) if mode != 1 else (1, 1), np.float32)
    out64 = np.empty((m, n) if mode == 1 else (1, 1), np.float64)
    bfin = np.isfinite(ebt).all(axis=1)
    _gemm_blocked(ea, ebt, bfin, sa, np.ascontiguousarray(sb.T), chunk, mode, int(acc_bits), out32, out64)
    with np.errstate(all="ignore"):
        if accumulator == "exact":
            s_dec = a.s_dec[:, None].astype(np.float64) * b.s_dec[None, :].astype(np.float64)
            return out64 * s_dec
        return out32 * alpha
