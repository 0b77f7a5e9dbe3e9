"""Per-tensor quantization metrics (SPEC §10) for captured tensors, in bounded memory.

:func:`analyze_tensor` takes one array (or memmap) and a list of schemes and returns one row per
scheme: statistics of the tensor that was quantized and the quantization metrics.  :data:`LEGEND`
says what each column measures, with its denominator; ``fpsim analyze --help`` prints it and docs/analyze.md holds it.

Conventions.  Error metrics (MSE, SQNR, relative error, max abs error, biases) are taken over the
*measured* elements: finite inputs whose decoded value is finite.  The input's NaN/±inf counts and the
finite inputs that decode to NaN/±inf (``nonfinite_out_count``: a NaN tensor amax propagates to every
element, SPEC §9; an MX block holding a NaN) are reported beside them.  A metric that cannot be
computed is ``nan`` in the row and its reason is in ``row["notes"][column]`` (JSON writes ``null``
beside a ``notes`` object); a zero is never a placeholder.  Zeros are written +0.0.

Tensors are viewed as 2-D (rows × last axis; blocks run along the last axis) and processed in chunks of
whole rows with the tensor's global amax (``quantize(..., tensor_amax=)``), so results equal those of
quantizing the tensor whole while memory stays bounded: by the chunk size, and by ``keep_bytes`` for a tensor
held between its two passes.  Recipe rows
("nvfp4_paper:fprop_w" …) quantize the copies a linear layer's GEMMs would use (SPEC §8; the tensor
as rows × last axis, whole in memory, up to ``recipe_max_bytes``).

``+rhtD`` rows rotate each row's D-tiles (the recipe's signs for D = 16, seed-0 signs otherwise; BF16
in/out as the recipe does) and measure the rotated tensor (its kurtosis too): R is orthogonal, so the
MSE is the same in either basis.  Recipe rows with an RHT measure errors in the original basis (the
dequantized copy rotated back exactly) and element/block statistics on the rotated copy that was
quantized.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator

import numpy as np

from ._analysis_sums import BlockRanges as _BlockRanges
from ._analysis_sums import ErrorSums as _Acc
from ._analysis_sums import MomentSums as _MomentSums
from ._arrays import as_float32
from .dispatch import quantize, rht
from .random import stream_width
from .recipe import ROLE_TENSOR, ROLES, get_recipe, operand_steps, quantize_operand
from .roles import guess_role as _guess_role
from .schemes import Kind, get_scheme
from .tensor import QuantizedTensor

__all__ = ["guess_role", "analyze_tensor", "check_analyzable", "METRIC_COLUMNS", "LEGEND", "TensorSkipped",
           "DEFAULT_SCHEMES", "mean_ci95"]

DEFAULT_SCHEMES = ("nvfp4", "mxfp4", "mxfp8_e4m3", "fp8_e4m3", "bf16")
#: Columns of one result row, in order (each row also has ``notes``: column → why it is nan/null).
METRIC_COLUMNS = (
    "tensor", "role", "scheme", "shape", "numel", "kurtosis", "amax_over_std", "nan_count", "inf_count",
    "nonfinite_out_count", "mse", "sqnr_db", "rel_error", "bulk_rel_error", "max_abs_error", "flushed_frac",
    "saturated_frac",
    "small_scale_block_frac", "block_dyn_range_log2", "bits_per_element", "bias_rne", "bias_sr", "bias_sr_ci95",
)
#: What each column measures (denominators, units, when it is empty).
LEGEND = {
    "tensor": "file:name of the tensor",
    "role": "weight, activation or gradient (GEMM operands), or norm, bias, rotary or embedding (never quantized "
            "by the recipe, not ranked); guessed from the name or a Transformer Engine dump's file name (the rule is "
            "in the summary), --role overrides",
    "scheme": "format (e.g. nvfp4), format+rhtD (after a D-point Hadamard transform) or recipe:role "
              "(the copy that GEMM role of the recipe quantizes; with SR, the error columns are of the seed-0 draw); "
              "RHT rows compare the rotated tensor with its quantization (mse, sqnr, rel_error as in the input's "
              "basis, the rotation being orthogonal; bias, max error and flushed are the rotated basis's)",
    "shape": "shape of the tensor (JSON: a list of ints)",
    "numel": "number of elements",
    "kurtosis": "Pearson kurtosis (3 for a Gaussian) of the finite elements of the tensor that was quantized "
                "(the rotated one on RHT rows); empty for a constant tensor",
    "amax_over_std": "max|x| / standard deviation over the finite elements (same tensor as kurtosis)",
    "nan_count": "NaN elements of the input",
    "inf_count": "±inf elements of the input as float32 (a note counts finite float64 values among them)",
    "nonfinite_out_count": "finite elements whose decoded value is NaN or ±inf (a NaN tensor amax makes every "
                           "element NaN, SPEC §9); excluded from the error metrics",
    "mse": "mean (x − x̂)² over the measured elements (finite x with finite x̂), in the tensor's units squared",
    "sqnr_db": "10·log10(Σx² / Σ(x − x̂)²) over the measured elements, dB; empty when exact (no error)",
    "rel_error": "‖x − x̂‖ / ‖x‖ over the measured elements",
    "bulk_rel_error": "‖x − x̂‖ / ‖x‖ over the measured elements with |x| ≤ 8·median|x| (the bulk; the median over "
                      "the finite non-zero |x|, to bfloat16 precision, rounded up): what outliers cannot hide; the "
                      "ranking's key over its value on a standard Gaussian (fpsim.ranking); plain scheme rows only",
    "max_abs_error": "max |x − x̂| over the measured elements",
    "flushed_frac": "non-zero x decoded to 0, over the measured non-zero elements",
    "saturated_frac": "x clipped at its block's largest magnitude (|x| > |x̂|, x̂ = ± the element max times a "
                      "finite non-zero scale; ±inf inputs included), over all elements; disjoint from flushed; "
                      "empty for casts (no block scale) and when no element is measured",
    "small_scale_block_frac": "blocks whose E4M3 scale is subnormal or zero (their elements lose precision or "
                              "flush), over the stored block scales (a 16×16 tile's counts once per row); "
                              "empty for schemes without E4M3 block scales",
    "block_dyn_range_log2": "mean over 1×n blocks of log2(block max|x| / block min non-zero |x|): the "
                            "dynamic range one block scale must cover, in binades (blocks holding NaN or ±inf, "
                            "or only zeros, left out); empty for 2-D tiles and schemes without blocks",
    "bits_per_element": "storage bits per element: codes + block scales + the FP32 tensor scale",
    "bias_rne": "mean(x̂ − x) under round-to-nearest-even over the measured elements; empty on rows "
                "quantized with stochastic rounding",
    "bias_sr": "mean(x̂ − x) under stochastic rounding, averaged over --seeds draws; gradient rows only "
               "(empty for weights, activations, casts, +rht rows and --seeds 0)",
    "bias_sr_ci95": "half-width of the 95 % t-interval of bias_sr (t·s/√seeds, t the 97.5 % quantile of Student's t "
                    "with seeds − 1 degrees of freedom); empty with one draw",
}
#: Chunks of about 16 MB: small enough for numpy's buffers to be reused from the heap rather than mapped afresh
#: (and zero-filled by the kernel) for every chunk and scheme, large enough that the calls per chunk cost little.
_CHUNK_BYTES = 16 << 20
#: A tensor of up to this many bytes as float32 is read once: the moments' first pass keeps its chunks for the
#: second (every plain scheme row shares that one); larger tensors are read twice, holding one chunk at a time.
_KEEP_BYTES = 256 << 20
#: The bulk of bulk_rel_error: |x| ≤ BULK_MEDIANS · median|x| (a Gaussian's is 5.4 σ: all but 7e-8 of it).
BULK_MEDIANS = 8.0


class TensorSkipped(Exception):
    """A tensor that is not analysed by design (one-line reason)."""


def guess_role(name: str, source: str | None = None) -> str:
    """The role of a tensor from its name (and a Transformer Engine dump's file name):
    :func:`fpsim.roles.role_guess`."""
    return _guess_role(name, source)


def mean_ci95(samples) -> tuple[float, float]:
    """Mean and half-width of the 95 % t-interval of ``samples`` (t·s/√n: s with n − 1, t the 97.5 % quantile of
    Student's t with n − 1 degrees of freedom, so the interval is right for a handful of seeds, where the normal
    1.96 would be too narrow: 3.18 at n = 4), computed about the first sample.

    Shifting by the first sample makes results equal in exact arithmetic come out equal: identical samples
    give exactly that value and a half-width of exactly 0 (the textbook formula leaves a rounding residue
    such as 5.8e-24).  The half-width is NaN for fewer than two samples.
    """
    v = np.asarray(samples, np.float64).reshape(-1)
    if v.size == 0:
        return math.nan, math.nan
    d = v - v[0]
    mean = float(v[0] + d.mean()) if d.any() else float(v[0])
    if v.size < 2:
        return mean, math.nan
    dm = d - d.mean() if d.any() else d
    var = float(np.dot(dm, dm)) / (v.size - 1)
    from scipy import stats  # here: importing scipy.stats costs ~0.3 s, which `fpsim` alone should not pay

    return mean, float(stats.t.ppf(0.975, v.size - 1)) * math.sqrt(var) / math.sqrt(v.size)


def _moment_chunks(chunks: Iterator[np.ndarray], mean: float, hist: np.ndarray | None = None):
    """:meth:`_MomentSums.result` over the chunks (float32 2-D arrays)."""
    m = _MomentSums(mean, hist)
    for c in chunks:
        m.add(c)
    return m.result()


def _moments(chunks: Callable[[], Iterator[np.ndarray]] | np.ndarray, chunk_rows: int = 0,
             also: Callable[[dict, Iterator[np.ndarray]], None] | None = None, keep_bytes: int = 0) -> dict:
    """amax, std, kurtosis (Pearson, 3 for a Gaussian), NaN/inf counts over the finite values: float64 sums,
    two passes (the mean first; then Σ(v − mean)² and Σ(v − mean)⁴, so a tiny spread about a large mean is not
    lost to cancellation as in Σv²/n − mean²).  A constant tensor (min = max) has variance exactly 0.
    ``chunks``: a function giving a fresh iterator of float32 row chunks, or a 2-D array (read in chunks of
    ``chunk_rows`` rows; ``beyond_f32`` then counts, in the first pass, the finite elements of a wider float array
    that are ±inf as float32; a tensor of one chunk, or of at most ``keep_bytes`` as float32, is read once and its
    chunks kept for the second pass).
    ``also(first, chunks)``: called after the first pass with its results (amax, NaN/inf counts, median|x|) and the
    second pass's chunks, which it must consume, so other work on the tensor shares the second read."""
    beyond = [0]
    if not callable(chunks):
        arr, cr = chunks, max(chunk_rows, 1)
        wide = np.dtype(arr.dtype).kind == "f" and np.dtype(arr.dtype).itemsize > 4
        kept: list[np.ndarray] = []

        keep = arr.shape[0] <= cr or 4 * arr.shape[0] * (arr.shape[1] if arr.ndim > 1 else 1) <= keep_bytes

        def chunks(count: bool = False) -> Iterator[np.ndarray]:
            if kept:
                yield from kept
                return
            for i in range(0, arr.shape[0], cr):
                c = arr[i : i + cr]
                c32 = as_float32(c)
                if count and wide:  # |x| ≥ FLT_MAX + ½ ulp rounds to ±inf: counted where the chunk is read anyway
                    beyond[0] += int(np.count_nonzero(np.isfinite(c) & np.isinf(c32)))
                if count and keep:
                    kept.append(c32)
                yield c32

        first = chunks(True)
    else:
        first = chunks()
    hist = np.zeros(0x7F80, np.int64)
    (s1, _, _), (n, nan, inf), amax, lo, hi = _moment_chunks(first, 0.0, hist)
    n = int(n)
    mean = s1 / n if n else math.nan
    second = _MomentSums(mean) if n and lo < hi else None
    median = _median_bin(hist)
    if also is not None:
        def fed() -> Iterator[np.ndarray]:
            for c in chunks():
                if second is not None:
                    second.add(c)
                yield c

        # the tensor amax as quantize measures it: NaN-propagating (SPEC §9), ±inf where an element is infinite
        also(_quantize_amax({"amax": amax, "nan_count": nan, "inf_count": inf, "median_abs": median}), fed())
    elif second is not None:
        for c in chunks():
            second.add(c)
    var = s4 = 0.0
    if second is not None:
        (_, s2, s4), _, _, _, _ = second.result()
        var = float(s2) / n
    var = var if n else math.nan
    std = math.sqrt(var) if n else math.nan
    kurt = (float(s4) / n) / (var * var) if n and var > 0 else math.nan
    return {"amax": float(amax), "std": float(std), "kurtosis": float(kurt), "nan_count": int(nan),
            "inf_count": int(inf), "n": n, "beyond_f32": beyond[0], "median_abs": median}


def _quantize_amax(mom: dict) -> dict:
    """``mom`` with the tensor amax as quantize measures it: NaN-propagating (SPEC §9), ±inf where an element is
    infinite, else the largest finite |x| (the moments' amax)."""
    return dict(mom, amax=math.nan if mom["nan_count"] else math.inf if mom["inf_count"] else float(mom["amax"]))


def _median_bin(hist: np.ndarray) -> float:
    """The upper edge of the bin holding the median (the ⌈n/2⌉-th smallest) of the counted |x|; nan when none."""
    n = int(hist.sum())
    if not n:
        return math.nan
    i = int(np.searchsorted(np.cumsum(hist), (n + 1) // 2))
    return float(np.array([(i + 1) << 16], np.uint32).view(np.float32)[0])


def _as_2d(arr):
    if hasattr(arr, "as_2d"):  # a fpsim.io.RowSource: rows are read from disk on demand
        return arr.as_2d()
    if arr.ndim == 1:
        return arr.reshape(1, -1)
    return arr.reshape(-1, arr.shape[-1])


def _plus0(v):
    """+0.0 for a zero float (the sign of a zero metric carries no information)."""
    return v + 0.0 if isinstance(v, float) else v


def _stats(base: dict, mom: dict) -> dict:
    """The tensor-statistics columns from :func:`_moments`, with the reason of each nan."""
    notes = {}
    r = dict(base, kurtosis=mom["kurtosis"], nan_count=mom["nan_count"], inf_count=mom["inf_count"])
    r["amax_over_std"] = mom["amax"] / mom["std"] if mom["std"] else math.nan
    if not mom["n"]:
        notes["kurtosis"] = notes["amax_over_std"] = "no finite element"
    elif not mom["std"]:
        notes["kurtosis"] = notes["amax_over_std"] = "constant tensor (zero variance)"
    r["notes"] = notes
    return r


def _rotated_stats(stats0: dict, mom: dict) -> dict:
    """The statistics columns of an RHT row: kurtosis and max|x|/std of the rotated tensor (what was quantized),
    NaN/±inf counts (and their notes) of the input, as LEGEND says: the rotation spreads one NaN or inf over its
    whole tile, so the rotated copy's counts describe the transform, not the data."""
    r = _stats({k: stats0[k] for k in ("tensor", "role", "shape", "numel")}, mom)
    r["nan_count"], r["inf_count"] = stats0["nan_count"], stats0["inf_count"]
    r["notes"].update({c: stats0["notes"][c] for c in ("nan_count", "inf_count") if c in stats0["notes"]})
    return r


def _empty_row(stats: dict, scheme: str, reason: str) -> dict:
    """A row whose quantization metrics are all absent for one reason (e.g. the RHT needs whole tiles)."""
    r = dict(stats, scheme=scheme, notes=dict(stats["notes"]))
    for c in METRIC_COLUMNS[METRIC_COLUMNS.index("nonfinite_out_count"):]:
        r[c] = math.nan
        r["notes"][c] = reason
    return r


def _row(acc: _Acc, stats: dict, scheme: str, bits: float, sch, amax_nan: bool) -> dict:
    """One result row from the accumulated sums; every nan gets its reason in ``notes``."""
    r = dict(stats, scheme=scheme, bits_per_element=bits, nonfinite_out_count=acc.nonfinite_out)
    notes = r["notes"] = dict(stats["notes"])
    m = acc.measured
    err = ("mse", "sqnr_db", "rel_error", "max_abs_error", "bias_rne")
    if m:
        r["mse"] = acc.err_sq / m
        r["sqnr_db"] = 10 * math.log10(acc.sq / acc.err_sq) if acc.err_sq > 0 and acc.sq > 0 else math.nan
        r["rel_error"] = math.sqrt(acc.err_sq / acc.sq) if acc.sq > 0 else math.nan
        r["max_abs_error"] = acc.max_abs_err
        r["bias_rne"] = -acc.err_sum / m
        if acc.sq == 0:
            notes["sqnr_db"] = notes["rel_error"] = "all measured elements are zero"
        elif acc.err_sq == 0:
            notes["sqnr_db"] = "exact (no error)"
    else:
        for c in err:
            r[c] = math.nan
        why = ("the tensor amax is NaN (a NaN element propagates, SPEC §9): every element decodes to NaN"
               if amax_nan else "no finite element" if not acc.nonfinite_out
               else "every finite element decodes to NaN or ±inf")
        notes.update(dict.fromkeys(err, why))
    if acc.bound is None:
        r["bulk_rel_error"] = math.nan
        notes.setdefault("bulk_rel_error", "measured on the plain scheme rows only (the ranking's)")
    elif acc.bulk_sq > 0:
        r["bulk_rel_error"] = math.sqrt(acc.bulk_err_sq / acc.bulk_sq)
    else:
        r["bulk_rel_error"] = math.nan
        notes["bulk_rel_error"] = notes.get("mse") or "no non-zero measured element in the bulk"
    if acc.nonfinite_out and m:
        notes["nonfinite_out_count"] = "finite elements decoded to NaN/±inf; the error metrics exclude them"
    finite_nz = acc.nonzero
    r["flushed_frac"] = acc.flushed / finite_nz if finite_nz and m else math.nan
    if not r["flushed_frac"] == r["flushed_frac"]:
        notes["flushed_frac"] = notes.get("mse") if not m else "no non-zero element"
    if sch is None:
        r["saturated_frac"] = math.nan
        notes["saturated_frac"] = "cast: no block scale (IEEE overflow decodes to inf)"
    elif not m:
        r["saturated_frac"] = math.nan
        notes["saturated_frac"] = notes["mse"]
    else:
        r["saturated_frac"] = acc.saturated / acc.n
    r["small_scale_block_frac"] = acc.small_scale / acc.blocks if acc.blocks else math.nan
    if not acc.blocks:
        notes["small_scale_block_frac"] = "no E4M3 block scales in this scheme"
    r["block_dyn_range_log2"] = acc.dyn_sum / acc.dyn_n if acc.dyn_n else math.nan
    if not acc.dyn_n:
        notes["block_dyn_range_log2"] = (
            "no blocks (cast)" if sch is None else "per-tensor scale: no blocks" if sch.block is None
            else "2-D tiles: measured for 1×n blocks only" if sch.block[0] != 1
            else "no block with a finite non-zero max")
    r["bias_sr"] = r["bias_sr_ci95"] = math.nan
    return r


def _finish(r: dict) -> dict:
    return {k: _plus0(v) for k, v in r.items() if k != "median_abs"}


def check_analyzable(name: str, dtype, shape: tuple[int, ...]) -> None:
    """Raise :class:`TensorSkipped` for a tensor not analysed by design (non-float, 0-d, empty), from its dtype and
    shape alone, so a caller can skip it before reading it or checking options such as the row axis."""
    dtype = np.dtype(dtype)
    if dtype.kind not in "fV" or dtype.kind == "V" and dtype.itemsize > 4:
        raise TensorSkipped(f"{name}: not a floating-point tensor (dtype {dtype})")
    if len(shape) == 0:
        raise TensorSkipped(f"{name}: 0-d tensor (a scalar): nothing to quantize")
    if math.prod(shape) == 0:
        raise TensorSkipped(f"{name}: empty tensor {tuple(shape)}")


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
    keep_bytes: int = _KEEP_BYTES,
) -> list[dict]:
    """Metrics of one tensor under each scheme (columns: :data:`METRIC_COLUMNS`, meanings: :data:`LEGEND`).

    ``arr``: an array, a memmap, or a :class:`fpsim.io.RowSource` (read in row chunks of about ``chunk_bytes``,
    bounded memory; a tensor of at most ``keep_bytes`` as float32 is read once and held, larger ones twice).
    Each row has the columns plus ``notes`` (column → why that value is nan).  Raises
    :class:`TensorSkipped` for tensors not analysed by design (non-float, 0-d, empty).
    """
    check_analyzable(name, arr.dtype, arr.shape)
    role = role or guess_role(name)
    x2d = _as_2d(arr)
    rows, cols = x2d.shape
    chunk_rows = _chunk_rows(cols, chunk_bytes)
    base = {"tensor": name, "role": role, "shape": [int(n) for n in arr.shape], "numel": int(arr.size)}
    # The moments do not depend on the blocks' axis, so they are summed in the stored order (a file's tensor read
    # along its last axis): equal bit for bit whichever --axis, where the axis-moved rows' order changed the last
    # digits (float64 sums in another order).
    stored = arr.stored_2d() if hasattr(arr, "stored_2d") else x2d
    # Every plain scheme row is taken from one read of the tensor: the second pass of the moments where the stored
    # order is the rows' order (--axis -1), else one read of the rows after the moments.
    runs: list[_SchemeRun] = []

    def quantize_all(first: dict, chunks: Iterator[np.ndarray]) -> None:
        bound = BULK_MEDIANS * first["median_abs"] if math.isfinite(first["median_abs"]) else None
        runs.extend(_SchemeRun(s, first["amax"], bound) for s in schemes)
        for c in chunks:
            ranges = _BlockRanges(c)  # NVFP4's and MX's block ranges, once per block width
            for run in runs:
                run.add(c, ranges)

    same_order = stored.shape == x2d.shape and getattr(arr, "axis", -1) in (-1, len(arr.orig_shape) - 1) \
        if hasattr(arr, "stored_2d") else True
    mom = _moments(stored, _chunk_rows(stored.shape[1], chunk_bytes), also=quantize_all if same_order else None,
                   keep_bytes=keep_bytes)
    if not same_order:
        quantize_all(_quantize_amax(mom), _chunks(x2d, chunk_rows))
    stats0 = dict(_stats(base, mom), median_abs=mom["median_abs"])
    wide = mom["beyond_f32"]
    if wide:  # the analysis runs on float32, where these are ±inf: say so rather than let inf_count mislead
        stats0["notes"]["inf_count"] = (f"includes {wide} finite {np.dtype(arr.dtype).name} elements beyond "
                                        "float32's range, which are ±inf once cast to float32 (as analysed)")
    out = [_scheme_finish(run, x2d, chunk_rows, stats0, role, seeds) for run in runs]
    if rht_d:
        for scheme in schemes:
            if get_scheme(scheme).kind is Kind.CAST:
                continue  # a cast has no scale for the rotation to help
            if cols % rht_d:
                out.append(_empty_row(stats0, f"{scheme}+rht{rht_d}",
                                      f"last axis ({cols}) is not a multiple of the Hadamard size {rht_d}"))
                continue
            st = _rotated_stats(stats0, _moments(lambda: _chunks(x2d, chunk_rows, rht_d)))
            out.append(_scheme_row(x2d, chunk_rows, scheme, rht_d, st, role, seeds))
    if recipe:
        out += _recipe_rows(name, x2d, role, recipe, stats0, seeds, recipe_max_bytes)
    return [_finish(r) for r in out]


def _chunk_rows(cols: int, chunk_bytes: int) -> int:
    """Rows of ``cols`` float32 elements per chunk: about ``chunk_bytes``, a multiple of 128, at least 16."""
    return max(16, (chunk_bytes // max(4 * cols, 1)) // 128 * 128 or 16)


def _chunks(x2d, chunk_rows: int, d: int = 0) -> Iterator[np.ndarray]:
    """float32 chunks of whole rows, Hadamard-rotated along the last axis when ``d``."""
    for i in range(0, x2d.shape[0], chunk_rows):
        c = as_float32(x2d[i : i + chunk_rows])
        yield rht(c, d, _rht_signs(d), axis=-1) if d else c


def _per_tensor(sch) -> bool:
    """Whether the scheme scales by the tensor amax (a per-tensor FP8 scale or NVFP4's second level)."""
    return sch.kind is not Kind.CAST and (sch.block is None or (sch.tensor_scale and not sch.per_row_scale))


class _SchemeRun:
    """One scheme (or scheme+rhtD) quantized chunk by chunk with the global amax (``amax``: the tensor's, used by
    schemes with a per-tensor scale), its statistics accumulated; ``bound``: the bulk's |x| bound or None."""

    def __init__(self, scheme: str, amax: float, bound: float | None, d: int = 0):
        self.sch = sch = get_scheme(scheme)
        self.label, self.d = scheme if not d else f"{scheme}+rht{d}", d
        self.cast = sch.kind is Kind.CAST
        per_tensor = _per_tensor(sch)
        self.amax = amax if per_tensor else None
        self.kw = {"tensor_amax": amax} if per_tensor else {}
        self.acc = _Acc(bound=bound)
        self.nbytes = 4 if per_tensor else 0  # the one FP32 tensor amax / scale

    def add(self, c: np.ndarray, ranges: _BlockRanges | None = None) -> None:
        q = quantize(c, self.sch, **self.kw)
        # block and per-tensor schemes: x̂ decoded inside the error kernel, a row at a time (never written out)
        self.acc.add(c, q.dequantize() if self.cast else None, None if self.cast else q, ranges=ranges)
        self.nbytes += q.stored_bytes(tensor_scale=False)


def _scheme_row(x2d, chunk_rows: int, scheme: str, d: int, stats: dict, role: str, seeds: int) -> dict:
    """One scheme+rhtD row: the rotated chunks' amax (NaN-propagating, SPEC §9), then quantize and accumulate."""
    amax = 0.0
    for c in _chunks(x2d, chunk_rows, d) if _per_tensor(get_scheme(scheme)) else ():
        m = float(np.max(np.abs(c))) if c.size else 0.0
        amax = math.nan if math.isnan(m) or math.isnan(amax) else max(amax, m)
    run = _SchemeRun(scheme, amax, None, d)
    for c in _chunks(x2d, chunk_rows, d):
        run.add(c)
    return _scheme_finish(run, x2d, chunk_rows, stats, role, seeds)


def _scheme_finish(run: _SchemeRun, x2d, chunk_rows: int, stats: dict, role: str, seeds: int) -> dict:
    """The row of a :class:`_SchemeRun`; a gradient's SR draws (``seeds``) are quantized here, chunk by chunk."""
    sch, cast, d, kw = run.sch, run.cast, run.d, run.kw
    cols = x2d.shape[1]
    amax_nan = run.amax is not None and math.isnan(run.amax)
    row = _row(run.acc, stats, run.label, 8.0 * run.nbytes / x2d.size, None if cast else sch, amax_nan)
    notes = row["notes"]
    if role != "gradient":
        notes["bias_sr"] = "not a gradient (SR is for gradients)"
    elif cast:
        notes["bias_sr"] = "cast: not stochastically rounded here"
    elif d:
        notes["bias_sr"] = "measured on the untransformed row"
    elif not seeds:
        notes["bias_sr"] = "--seeds 0"
    else:
        draws = []
        for s in range(seeds):
            a = _Acc()
            for i, c in enumerate(_chunks(x2d, chunk_rows)):
                q = quantize(c, sch, rounding="sr", seed=s, counter=_sr_counter(sch, i * chunk_rows, cols), **kw)
                a.add(c, q.dequantize(), None, elements=False)
            draws.append(-a.err_sum / a.measured if a.measured else math.nan)
        _set_sr_bias(row, draws)
    if "bias_sr_ci95" not in notes and not row["bias_sr_ci95"] == row["bias_sr_ci95"]:
        notes["bias_sr_ci95"] = notes.get("bias_sr", "one draw: no interval")
    return row


def _set_sr_bias(row: dict, draws: list[float]) -> None:
    notes = row["notes"]
    if any(math.isnan(b) for b in draws):  # both columns empty: both say why
        notes["bias_sr"] = notes["bias_sr_ci95"] = notes.get("mse", "no measured element")
        return
    row["bias_sr"], row["bias_sr_ci95"] = mean_ci95(draws)
    if len(draws) < 2:
        notes["bias_sr_ci95"] = "one draw: no interval"


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


def _recipe_rows(name, x2d, role, recipe, stats0, seeds, max_bytes) -> list[dict]:
    """Rows for the recipe's GEMM copies of this tensor (SPEC §8), as rows × last axis."""
    rec = get_recipe(recipe)
    if role not in ("weight", "activation", "gradient"):
        return []  # not a GEMM operand: no recipe copy (fpsim.ranking.UNQUANTIZED_ROLES)
    tensor = {"weight": "w", "activation": "x", "gradient": "dy"}[role]
    roles = [r for r in ROLES if ROLE_TENSOR[r] == tensor]
    nbytes = 4 * x2d.shape[0] * x2d.shape[1]
    if nbytes > max_bytes:
        why = f"recipe rows hold the whole tensor in memory: {nbytes >> 20} MiB > {max_bytes >> 20} MiB"
        return [_empty_row(stats0, f"{rec.name}:{r}", why) for r in roles]
    x = np.ascontiguousarray(as_float32(x2d[0 : x2d.shape[0]]))
    rows = []
    for r in roles:
        pol = rec.policy(r)
        label = f"{rec.name}:{r}"
        # Wgrad copies are the transpose (K = tokens); the Dgrad weight is Wᵀ (K = out).
        copy = np.ascontiguousarray(x.T if r in ("dgrad_w", "wgrad_dy", "wgrad_x") else x)
        if pol.rht and copy.shape[-1] % pol.rht:
            rows.append(_empty_row(stats0, label, f"the RHT runs along K ({copy.shape[-1]}), not a multiple of "
                                                  f"its Hadamard size {pol.rht}"))
            continue
        st0 = operand_steps(pol, seed=0, layer=name, role=r)
        xin = rht(copy, st0.rht, st0.signs, axis=-1) if st0.rht else copy  # what the quantizer sees
        stats = _rotated_stats(stats0, _moments(xin, max(1, xin.shape[0]))) if st0.rht else stats0
        sr = st0.seed is not None
        draws, acc, q0 = [], None, None
        for s in range(max(seeds, 1) if sr else 1):
            q = quantize_operand(copy, pol, seed=s, layer=name, role=r)
            is_q = isinstance(q, QuantizedTensor)
            xq = q.dequantize() if is_q else q
            a = _Acc()
            if st0.rht:  # errors in the original basis (rotate back exactly), elements on the rotated copy
                signs = operand_steps(pol, seed=s, layer=name, role=r).signs
                back = rht(xq, st0.rht, signs, axis=-1, bf16_in=False, bf16_out=False, inverse=True)
                a.add(copy, back, None, elements=False)
                if s == 0:
                    a.add(xin, xq, q if is_q else None, errors=False)
            else:
                a.add(copy, xq, q if is_q else None, elements=s == 0)
            draws.append(-a.err_sum / a.measured if a.measured else math.nan)
            if acc is None:
                acc, q0 = a, q
        is_q = isinstance(q0, QuantizedTensor)
        cast = not is_q or q0.scheme.kind is Kind.CAST
        bits = q0.bits_per_element if is_q else 32.0
        row = _row(acc, stats, label, bits, None if cast else q0.scheme, False)
        notes = row["notes"]
        if not is_q:
            notes["saturated_frac"] = "not quantized by this recipe (kept in float32)"
        if sr:
            row["bias_rne"] = math.nan
            notes["bias_rne"] = "quantized with SR (its bias is bias_sr)"
            if seeds:
                _set_sr_bias(row, draws)
            else:
                notes["bias_sr"] = notes["bias_sr_ci95"] = "--seeds 0"
        else:
            notes["bias_sr"] = notes["bias_sr_ci95"] = "rounded to nearest (RNE) by this recipe"
        rows.append(row)
    return rows
