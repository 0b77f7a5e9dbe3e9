"""Per-tensor quantization metrics (SPEC §10) for captured tensors, in bounded memory.

:func:`analyze_tensor` takes one array (or memmap) and a list of schemes and
returns one row per scheme: the tensor's statistics (shape, kurtosis,
max|x|/std, non-finite counts) and the quantization metrics — MSE, SQNR (dB),
relative Frobenius error, max abs error, fraction of non-zeros flushed to zero,
fraction saturated (clipped at the element max), fraction of blocks with a
subnormal or zero scale, mean block dynamic range (log2 of block amax over the
block's smallest non-zero |x|) and, for gradients, the bias of SR and RNE
(mean(x̂ − x) over ``seeds`` SR draws, with a 95 % interval).

Tensors are viewed as 2-D (rows × last axis; blocks run along the last axis)
and processed in chunks of whole rows with the tensor's global amax
(``quantize(..., tensor_amax=)``), so results equal those of quantizing the
tensor whole while memory stays bounded by the chunk size.  Recipe rows
("recipe:fprop_w" …) quantize the copies a linear layer's GEMMs would use
(SPEC §8; 2-D tensors only, whole tensor in memory, up to ``recipe_max_bytes``).

``+rhtD`` rows rotate each row's D-tiles (the recipe's signs for D = 16, seed-0
signs otherwise; BF16 in/out as the recipe does) and measure the error of the
rotated tensor: R is orthogonal, so the MSE is the same in either basis.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ._arrays import as_float32
from ._jit import pjit, prange
from .random import stream_width
from .recipe import ROLE_TENSOR, ROLES, get_recipe, quantize_operand
from .scaling import QuantizedTensor, _Kind, get_scheme, quantize
from .transforms import rht

__all__ = ["guess_role", "analyze_tensor", "METRIC_COLUMNS", "TensorSkipped", "DEFAULT_SCHEMES"]

DEFAULT_SCHEMES = ("nvfp4", "mxfp4", "mxfp8_e4m3", "fp8_e4m3", "bf16")
#: Columns of one result row, in order.
METRIC_COLUMNS = (
    "tensor", "role", "scheme", "shape", "numel", "kurtosis", "amax_over_std", "nan_count", "inf_count",
    "mse", "sqnr_db", "rel_error", "max_abs_error", "flushed_frac", "saturated_frac", "small_scale_block_frac",
    "block_dyn_range_log2", "bits_per_element", "bias_rne", "bias_sr", "bias_sr_ci95",
)
_CHUNK_BYTES = 64 << 20


class TensorSkipped(Exception):
    """A tensor that is not analysed by design (one-line reason)."""


def guess_role(name: str) -> str:
    """``"gradient"``, ``"weight"`` or ``"activation"`` from a tensor's name (override with --role)."""
    n = name.lower()
    if "grad" in n or n.startswith("d") and n[1:2] in ("y", "x", "w", "_") or ".dy" in n:
        return "gradient"
    if "weight" in n or n.endswith(".w") or n.endswith("_w") or n == "w":
        return "weight"
    return "activation"


@dataclass
class _Acc:
    """Running sums over chunks (float64)."""

    n: int = 0
    sq: float = 0.0
    err_sq: float = 0.0
    max_abs_err: float = 0.0
    nonzero: int = 0
    flushed: int = 0
    saturated: int = 0
    blocks: int = 0
    small_scale: int = 0
    dyn_sum: float = 0.0
    dyn_n: int = 0
    err_sum: float = 0.0
    nan_out: bool = False

    def add(self, x: np.ndarray, xq: np.ndarray, q: QuantizedTensor | None) -> None:
        x2 = np.ascontiguousarray(x, np.float32).reshape(-1, x.shape[-1] if x.ndim else 1)
        q2 = np.ascontiguousarray(xq, np.float32).reshape(x2.shape)
        f = np.empty((x2.shape[0], 4), np.float64)
        k = np.empty((x2.shape[0], 3), np.int64)
        if x2.size:
            _err_rows(x2, q2, f, k)
        self.n += x.size
        self.sq += float(f[:, 0].sum())
        self.err_sq += float(f[:, 1].sum())
        self.err_sum += float(f[:, 2].sum())
        if x2.size:
            m = math.nan if k[:, 2].any() else float(f[:, 3].max())
            self.max_abs_err = math.nan if math.isnan(m) or math.isnan(self.max_abs_err) else max(
                self.max_abs_err, m)
        self.nonzero += int(k[:, 0].sum())
        self.flushed += int(k[:, 1].sum())
        if q is not None:
            self._block_stats(x, xq, q)

    def _block_stats(self, x, xq, q):
        sch = q.scheme
        el = sch.element
        x2 = np.ascontiguousarray(x, np.float32)
        codes = np.ascontiguousarray(q.data).reshape(x2.shape[0], -1)
        bc = sch.block[1] if sch.block is not None and sch.block[0] == 1 else 0
        f = np.empty(x2.shape[0])
        k = np.empty((x2.shape[0], 2), np.int64)
        if x2.size:
            _block_rows(x2, np.ascontiguousarray(xq, np.float32).reshape(x2.shape), codes, el.bits == 4,
                        el.magnitude_mask, el.max_code, bc, f, k)
        self.saturated += int(k[:, 0].sum())
        if sch.kind is _Kind.TWO_LEVEL:
            sc = q.scales.reshape(-1)
            exp_field = sch.scale.magnitude_mask & ~((1 << sch.scale.mbits) - 1)
            self.small_scale += int(((sc & exp_field) == 0).sum())  # subnormal or zero scale
            self.blocks += sc.size
        if bc:
            self.dyn_sum += float(f.sum())
            self.dyn_n += int(k[:, 1].sum())


@pjit
def _block_rows(x, xq, codes, packed, mag_mask, max_code, bc, f, k):
    """Per row: k[r, 0] = elements whose code is the largest magnitude and whose |x| exceeds |x̂| (saturated);
    with 1 × bc blocks (bc > 0), f[r] = Σ log2(amax / smallest nonzero |x|) over the row's blocks whose amax is
    finite, positive and NaN-free, and k[r, 1] their number (the block dynamic range, float64)."""
    R, C = x.shape
    for r in prange(R):
        sat = 0
        for c in range(C):
            code = (codes[r, c >> 1] >> (4 * (c & 1))) & 0xF if packed else codes[r, c]
            if (code & mag_mask) == max_code and abs(x[r, c]) > abs(xq[r, c]):
                sat += 1
        k[r, 0] = sat
        dyn = 0.0
        nb = 0
        if bc > 0:
            for c0 in range(0, C, bc):
                amax = np.float32(0.0)
                amin = np.float32(np.inf)
                nan = False
                for c in range(c0, min(c0 + bc, C)):
                    a = abs(x[r, c])
                    if a != a:
                        nan = True
                    else:
                        amax = max(amax, a)
                        if a > 0:
                            amin = min(amin, a)
                if not nan and amax > 0 and amax < np.inf and amin < np.inf:
                    dyn += np.log2(np.float64(amax) / np.float64(amin))
                    nb += 1
        f[r] = dyn
        k[r, 1] = nb


@pjit
def _err_rows(x, xq, f, k):
    """Per row of float32 ``x`` and its quantized ``xq``, with d = x − x̂ exact in float64: f = (Σx², Σd², Σd,
    max|d|), k = (#x ≠ 0, #(x ≠ 0 and x̂ = 0), #NaN d).  One pass instead of NumPy's float64 temporaries."""
    R, C = x.shape
    for r in prange(R):
        sq = 0.0
        esq = 0.0
        es = 0.0
        mx = 0.0
        nz = 0
        fl = 0
        nan = 0
        for c in range(C):
            a = np.float64(x[r, c])
            d = a - np.float64(xq[r, c])
            sq += a * a
            esq += d * d
            es += d
            ad = abs(d)
            if ad > mx:
                mx = ad
            nan += d != d
            z = x[r, c] != 0
            nz += z
            fl += z and xq[r, c] == 0
        f[r, 0] = sq
        f[r, 1] = esq
        f[r, 2] = es
        f[r, 3] = mx
        k[r, 0] = nz
        k[r, 1] = fl
        k[r, 2] = nan


@pjit
def _moment_rows(x, mean, f, k):
    """Per row over the finite values: f = (Σv, Σv², max|v|, Σ(v − mean)⁴) in float64, k = (#finite, #NaN, #inf)."""
    R, C = x.shape
    for r in prange(R):
        s1 = 0.0
        s2 = 0.0
        s4 = 0.0
        mx = 0.0
        n = 0
        nan = 0
        inf = 0
        for c in range(C):
            v = np.float64(x[r, c])
            if v != v:
                nan += 1
            elif abs(v) == np.inf:
                inf += 1
            else:
                n += 1
                s1 += v
                s2 += v * v
                if abs(v) > mx:
                    mx = abs(v)
                dv = v - mean
                s4 += (dv * dv) * (dv * dv)
        f[r, 0] = s1
        f[r, 1] = s2
        f[r, 2] = mx
        f[r, 3] = s4
        k[r, 0] = n
        k[r, 1] = nan
        k[r, 2] = inf


def _moment_chunks(x2d: np.ndarray, chunk_rows: int, mean: float):
    """Sums of :func:`_moment_rows` over the chunks of rows of ``x2d`` (read once per chunk)."""
    tf = np.zeros(4)
    tk = np.zeros(3, np.int64)
    amax = 0.0
    for i in range(0, x2d.shape[0], chunk_rows):
        c = np.ascontiguousarray(as_float32(x2d[i : i + chunk_rows]))
        c = c.reshape(-1, c.shape[-1] if c.ndim else 1)
        if not c.size:
            continue
        f = np.empty((c.shape[0], 4))
        k = np.empty((c.shape[0], 3), np.int64)
        _moment_rows(c, np.float64(mean), f, k)
        tf += f.sum(axis=0)
        tk += k.sum(axis=0)
        amax = max(amax, float(f[:, 2].max()))
    return tf, tk, amax


def _moments(x2d: np.ndarray, chunk_rows: int) -> dict:
    """amax, std, kurtosis (Pearson, 3 for a Gaussian), NaN/inf counts over the finite values: float64 sums,
    two passes (the fourth moment about the mean needs the mean)."""
    (s1, s2, _, _), (n, nan, inf), amax = _moment_chunks(x2d, chunk_rows, 0.0)
    n = int(n)
    mean = s1 / n if n else math.nan
    var = max(s2 / n - mean * mean, 0.0) if n else math.nan
    s4 = 0.0
    if n and var > 0:
        s4 = float(_moment_chunks(x2d, chunk_rows, mean)[0][3])
    std = math.sqrt(var) if n else math.nan
    kurt = (s4 / n) / (var * var) if n and var > 0 else math.nan
    return {"amax": amax, "std": std, "kurtosis": kurt, "nan_count": int(nan), "inf_count": int(inf)}


def _as_2d(arr):
    if hasattr(arr, "as_2d"):  # a fpsim.io.RowSource: rows are read from disk on demand
        return arr.as_2d()
    if arr.ndim == 1:
        return arr.reshape(1, -1)
    return arr.reshape(-1, arr.shape[-1])


def _row(acc: _Acc, base: dict, scheme: str, bits: float) -> dict:
    r = dict(base, scheme=scheme, bits_per_element=bits)
    n = max(acc.n, 1)
    r["mse"] = acc.err_sq / n
    ratio = acc.sq / acc.err_sq if acc.err_sq > 0 and acc.sq > 0 else math.nan
    # an infinite error (x̂ = ±inf where x is finite, e.g. FLT_MAX under MXFP4) has ratio 0: SQNR is -inf dB
    r["sqnr_db"] = (10 * math.log10(ratio) if ratio > 0 else -math.inf) if ratio == ratio else (
        math.inf if acc.sq > 0 else math.nan)
    r["rel_error"] = math.sqrt(acc.err_sq / acc.sq) if acc.sq > 0 else math.nan
    r["max_abs_error"] = acc.max_abs_err
    r["flushed_frac"] = acc.flushed / acc.nonzero if acc.nonzero else 0.0
    r["saturated_frac"] = acc.saturated / n
    r["small_scale_block_frac"] = acc.small_scale / acc.blocks if acc.blocks else math.nan
    r["block_dyn_range_log2"] = acc.dyn_sum / acc.dyn_n if acc.dyn_n else math.nan
    r["bias_rne"] = math.nan
    r["bias_sr"] = math.nan
    r["bias_sr_ci95"] = math.nan
    return r


def analyze_tensor(
    name: str,
    arr,
    schemes: tuple[str, ...] = DEFAULT_SCHEMES,
    role: str | None = None,
    rht_d: int = 0,
    seeds: int = 0,
    recipe: str | None = None,
    chunk_bytes: int = _CHUNK_BYTES,
    recipe_max_bytes: int = 256 << 20,
) -> list[dict]:
    """Metrics of one tensor under each scheme (see the module docstring); raises :class:`TensorSkipped`.

    ``arr``: an array, a memmap, or a :class:`fpsim.io.RowSource` (read in row chunks, bounded memory).
    """
    if arr.dtype.kind not in "fV" or arr.dtype.kind == "V" and arr.dtype.itemsize > 4:
        raise TensorSkipped(f"{name}: not a floating-point tensor (dtype {arr.dtype})")
    if arr.ndim == 0:
        raise TensorSkipped(f"{name}: 0-d tensor (a scalar): nothing to quantize")
    if arr.size == 0:
        raise TensorSkipped(f"{name}: empty tensor {arr.shape}")
    role = role or guess_role(name)
    x2d = _as_2d(arr)
    rows, cols = x2d.shape
    chunk_rows = max(16, (chunk_bytes // max(4 * cols, 1)) // 128 * 128 or 16)
    mom = _moments(x2d, chunk_rows)
    base = {
        "tensor": name, "role": role, "shape": "x".join(map(str, arr.shape)), "numel": int(arr.size),
        "kurtosis": mom["kurtosis"], "amax_over_std": mom["amax"] / mom["std"] if mom["std"] else math.nan,
        "nan_count": mom["nan_count"], "inf_count": mom["inf_count"],
    }
    out = []
    variants = [(s, 0) for s in schemes]
    if rht_d:
        if cols % rht_d:
            pass  # the RHT needs whole tiles along the last axis; reported as absent rows
        else:
            variants += [(s, rht_d) for s in schemes if get_scheme(s).kind is not _Kind.CAST]
    for scheme, d in variants:
        sch = get_scheme(scheme)
        label = scheme if not d else f"{scheme}+rht{d}"
        acc = _Acc()
        amax = None
        if sch.block is None or (sch.tensor_scale and not sch.per_row_scale):
            amax = 0.0
            for i in range(0, rows, chunk_rows):
                c = as_float32(x2d[i : i + chunk_rows])
                if d:
                    c = rht(c, d, _rht_signs(d), axis=-1)
                m = float(np.max(np.abs(c))) if c.size else 0.0
                amax = m if (math.isnan(m) or math.isnan(amax)) else max(amax, m)
        nbytes = 0
        for i in range(0, rows, chunk_rows):
            c = as_float32(x2d[i : i + chunk_rows])
            if d:
                c = rht(c, d, _rht_signs(d), axis=-1)
            kw = {"tensor_amax": amax} if amax is not None and sch.kind is not _Kind.CAST else {}
            q = quantize(c, sch, **kw)
            xq = q.dequantize()
            acc.add(c, xq, q if sch.kind is not _Kind.CAST else None)
            nbytes += q.data.nbytes + (q.scales.nbytes if sch.block is not None else 0)
        if amax is not None and sch.kind is not _Kind.CAST:
            nbytes += 4  # the one FP32 tensor amax / scale
        row = _row(acc, base, label, 8.0 * nbytes / x2d.size)
        row["bias_rne"] = acc.err_sum / max(acc.n, 1) * -1.0
        if seeds and role == "gradient" and sch.kind is not _Kind.CAST and not d:
            draws = []
            for s in range(seeds):
                tot = 0.0
                for i in range(0, rows, chunk_rows):
                    c = as_float32(x2d[i : i + chunk_rows])
                    kw = {"tensor_amax": amax} if amax is not None else {}
                    q = quantize(c, sch, rounding="sr", seed=s, counter=_sr_counter(sch, i, cols), **kw)
                    tot += float(np.sum(q.dequantize().astype(np.float64) - c))
                draws.append(tot / x2d.size)
            row["bias_sr"] = float(np.mean(draws))
            row["bias_sr_ci95"] = 1.96 * float(np.std(draws, ddof=1)) / math.sqrt(seeds) if seeds > 1 else math.nan
        out.append(row)
    if recipe and arr.ndim == 2:
        out += _recipe_rows(name, as_float32(np.asarray(arr)) if arr.nbytes <= recipe_max_bytes else None, role, recipe,
                            base)
    return out


def _rht_signs(d: int):
    """The recipe's fixed vector for d = 16, seeded (seed 0) signs for other sizes."""
    return "recipe" if d == 16 else 0


def _sr_counter(sch, row0: int, cols: int) -> int:
    """First Philox counter of a chunk starting at ``row0``, so chunked SR draws the bits of a whole-tensor call."""
    width = stream_width(sch.k)
    if sch.block is None:  # flat element stream of fpsim.encode: 128 // width elements per counter
        return row0 * cols // (128 // width)
    bc = sch.block[1]
    calls = -(-bc // (128 // width))
    return row0 * (-(-cols // bc)) * calls


def _recipe_rows(name, x, role, recipe, base) -> list[dict]:
    if x is None:
        return []
    rec = get_recipe(recipe)
    tensor = {"weight": "w", "activation": "x", "gradient": "dy"}[role]
    rows = []
    for r in ROLES:
        if ROLE_TENSOR[r] != tensor:
            continue
        pol = rec.policy(r)
        # Wgrad copies are the transpose (K = tokens); the Dgrad weight is Wᵀ (K = out).
        copy = x.T if r in ("dgrad_w", "wgrad_dy", "wgrad_x") else x
        if pol.rht and copy.shape[-1] % pol.rht:
            continue
        ref = np.ascontiguousarray(copy)
        if pol.rht:
            ref = rht(ref, pol.rht, axis=-1, bf16_in=False, bf16_out=False)
        q = quantize_operand(np.ascontiguousarray(copy), pol, seed=0, layer=name, role=r)
        if not isinstance(q, QuantizedTensor):
            continue
        xq = q.dequantize()
        if pol.rht:  # compare in the original basis: rotate back exactly
            xq = rht(xq, pol.rht, axis=-1, bf16_in=False, bf16_out=False, inverse=True)
            ref = np.ascontiguousarray(copy)
        acc = _Acc()
        acc.add(ref, xq, None if pol.rht else q)
        row = _row(acc, base, f"{rec.name}:{r}", q.bits_per_element)
        row["bias_rne"] = -acc.err_sum / max(acc.n, 1)
        rows.append(row)
    return rows
