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
from .packing import unpack_fp4
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
        x64 = x.astype(np.float64)
        d = x64 - xq.astype(np.float64)
        self.n += x.size
        self.sq += float(np.sum(x64 * x64))
        self.err_sq += float(np.sum(d * d))
        self.err_sum += float(np.sum(d))
        if d.size:
            self.max_abs_err = max(self.max_abs_err, float(np.max(np.abs(d))))
        nz = x != 0
        self.nonzero += int(nz.sum())
        self.flushed += int((nz & (xq == 0)).sum())
        if q is not None:
            self._block_stats(x, xq, q)

    def _block_stats(self, x, xq, q):
        sch = q.scheme
        el = sch.element
        codes = q.data if el.bits != 4 else unpack_fp4(q.data)
        codes = codes.reshape(x.shape[0], -1)[:, : x.shape[1]]
        at_max = (codes & el.magnitude_mask) == el.max_code
        self.saturated += int((at_max & (np.abs(x) > np.abs(xq))).sum())
        if sch.kind is _Kind.TWO_LEVEL:
            sc = q.scales.reshape(-1)
            exp_field = sch.scale.magnitude_mask & ~((1 << sch.scale.mbits) - 1)
            self.small_scale += int(((sc & exp_field) == 0).sum())  # subnormal or zero scale
            self.blocks += sc.size
        if sch.block is not None and sch.block[0] == 1:
            bc = sch.block[1]
            pad = -x.shape[1] % bc
            a = np.abs(np.pad(x, ((0, 0), (0, pad)))).reshape(x.shape[0], -1, bc)
            amax = a.max(axis=-1)
            amin = np.where(a > 0, a, np.inf).min(axis=-1)
            ok = (amax > 0) & np.isfinite(amin) & np.isfinite(amax)
            self.dyn_sum += float(np.sum(np.log2(amax[ok].astype(np.float64) / amin[ok])))
            self.dyn_n += int(ok.sum())


def _moments(x2d: np.ndarray, chunk_rows: int) -> dict:
    """amax, std, kurtosis (Pearson, 3 for a Gaussian), NaN/inf counts — one pass, float64 sums."""
    n = 0
    s1 = s2 = 0.0
    amax = 0.0
    nan = inf = 0
    for i in range(0, x2d.shape[0], chunk_rows):
        c = as_float32(x2d[i : i + chunk_rows])
        fin = np.isfinite(c)
        nan += int(np.isnan(c).sum())
        inf += int(np.isinf(c).sum())
        v = c[fin].astype(np.float64)
        n += v.size
        s1 += float(v.sum())
        s2 += float((v * v).sum())
        if v.size:
            amax = max(amax, float(np.abs(v).max()))
    mean = s1 / n if n else math.nan
    var = max(s2 / n - mean * mean, 0.0) if n else math.nan
    s4 = 0.0
    if n and var > 0:
        for i in range(0, x2d.shape[0], chunk_rows):
            c = as_float32(x2d[i : i + chunk_rows])
            v = c[np.isfinite(c)].astype(np.float64) - mean
            s4 += float((v**4).sum())
    std = math.sqrt(var) if n else math.nan
    kurt = (s4 / n) / (var * var) if n and var > 0 else math.nan
    return {"amax": amax, "std": std, "kurtosis": kurt, "nan_count": nan, "inf_count": inf}


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
    r["sqnr_db"] = 10 * math.log10(acc.sq / acc.err_sq) if acc.err_sq > 0 and acc.sq > 0 else (
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
