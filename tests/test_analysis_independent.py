"""`fpsim analyze`'s columns against an independent plain-numpy implementation of their documented definitions
(LEGEND, docs/spec.md §10), over hostile tensors, every preset scheme, many chunks, RHT and recipe rows; and the
CSV / Markdown / table renderings against the JSON.

Only the quantization itself comes from fpsim (``quantize``/``dequantize``, ``rht``, ``recipe``); every metric is
recomputed here from x and x̂.  Counts and fractions of counts must be equal exactly.  Float sums get a relative
tolerance of 1e-12: analysis sums float64 values per row (sequentially, in a Numba kernel) and then over rows,
numpy here sums pairwise over the flattened tensor; each order's error is below n·2⁻⁵³ ≈ 1e-13 relative for
these sizes.  Biases are sums of signed errors that can cancel to ~0, so their tolerance is relative to
mean|x − x̂|.  Kurtosis and amax/std (fourth moments, ratios of sums) and the t-interval get 1e-9.
"""

import csv
import dataclasses
import io
import math

import ml_dtypes
import numpy as np
import pytest
from scipy import stats as sps

import fpsim
from cli.analyze_render import _TABLE
from fpsim.analysis import METRIC_COLUMNS, analyze_tensor, guess_role
from fpsim.io import write_safetensors
from fpsim.recipe import ROLE_TENSOR, ROLES, get_recipe, operand_steps, quantize_operand
from fpsim.schemes import SCHEMES, Kind, get_scheme
from tests.cliutil import run, strict_json

SEEDS = 3

# --- the independent reference -------------------------------------------------------------------------


def _to2d(arr) -> np.ndarray:
    with np.errstate(over="ignore"):
        a = np.asarray(arr).astype(np.float32)  # float64/float16/bfloat16 → float32, RNE (SPEC §9)
    return np.ascontiguousarray(a.reshape(-1, a.shape[-1]))


def _tensor_stats(x: np.ndarray) -> dict:
    f = x[np.isfinite(x)].astype(np.float64)
    if f.size == 0 or f.min() == f.max():
        return {"kurtosis": math.nan, "amax_over_std": math.nan}
    d = f - f.mean()
    var = np.mean(d * d)
    return {"kurtosis": float(np.mean(d**4) / var**2), "amax_over_std": float(np.abs(f).max() / math.sqrt(var))}


def _errors(x: np.ndarray, xq: np.ndarray) -> dict:
    """Error columns over the measured elements (x and x̂ finite); flushed over the measured non-zero ones."""
    a64, b64 = x.astype(np.float64), xq.astype(np.float64)
    meas = np.isfinite(a64) & np.isfinite(b64)
    r = {"nonfinite_out_count": int((np.isfinite(a64) & ~np.isfinite(b64)).sum())}
    a, b = a64[meas], b64[meas]
    nz = a != 0
    r["flushed_frac"] = float((nz & (b == 0)).sum() / nz.sum()) if nz.any() else math.nan
    if not a.size:
        return dict(r, **dict.fromkeys(("mse", "sqnr_db", "rel_error", "max_abs_error", "bias_rne"), math.nan))
    e = b - a
    sx, se = np.sum(a * a), np.sum(e * e)
    r.update(mse=float(se / a.size), max_abs_error=float(np.abs(e).max()), bias_rne=float(e.mean()),
             sqnr_db=float(10 * np.log10(sx / se)) if se > 0 and sx > 0 else math.nan,
             rel_error=float(np.sqrt(se / sx)) if sx > 0 else math.nan, _abs_err=float(np.abs(e).mean()))
    return r


def _elements(x: np.ndarray, xq: np.ndarray, q, measured: bool) -> dict:
    """saturated (over all elements), small-scale blocks (over all stored blocks), 1×n block dynamic range."""
    sch = q.scheme if isinstance(q, fpsim.QuantizedTensor) else None
    cast = sch is None or sch.kind is Kind.CAST
    r = {"saturated_frac": math.nan, "small_scale_block_frac": math.nan, "block_dyn_range_log2": math.nan}
    if not cast and measured:
        # the decoded element max of each element's block: the same scales with every code at the max magnitude
        mc = sch.element.max_code
        packed = sch.element.bits == 4 and sch.block is not None
        top = np.abs(dataclasses.replace(q, data=np.full_like(q.data, mc | mc << 4 if packed else mc)).dequantize())
        with np.errstate(invalid="ignore"):
            sat = (np.abs(xq) == top) & np.isfinite(top) & (top > 0) & (np.abs(x) > np.abs(xq))
        r["saturated_frac"] = float(sat.sum() / x.size)
    if sch is not None and sch.kind is Kind.TWO_LEVEL:  # E4M3 bytes below the smallest normal, 2⁻⁶
        r["small_scale_block_frac"] = float(np.mean(q.scales.view(ml_dtypes.float8_e4m3fn).astype(np.float32)
                                                    < 2.0**-6))
    if sch is not None and sch.block is not None and sch.block[0] == 1:
        bc = sch.block[1]
        R, C = x.shape
        p = np.zeros((R, -(-C // bc) * bc), np.float32)
        p[:, :C] = np.abs(x)
        p = p.reshape(R, -1, bc)
        nan = np.isnan(p).any(-1)
        p = np.where(np.isnan(p), 0, p)
        bmax, bmin = p.max(-1), np.where(p > 0, p, np.inf).min(-1)
        ok = ~nan & (bmax > 0) & np.isfinite(bmax)
        if ok.any():
            r["block_dyn_range_log2"] = float(np.mean(np.log2(bmax[ok].astype(np.float64) / bmin[ok])))
    return r


def _bits(q) -> float:
    """Codes + block scales + one FP32 tensor scale (NVFP4's second level, per-tensor FP8's scale)."""
    sch = q.scheme
    nbytes = q.data.nbytes + (q.scales.nbytes if sch.block is not None else 0)
    if sch.kind is not Kind.CAST and (sch.block is None or sch.tensor_scale):
        nbytes += 4
    return 8.0 * nbytes / q.size


def _ci95(draws: list[float]) -> tuple[float, float]:
    v = np.asarray(draws)
    return float(v.mean()), float(sps.t.ppf(0.975, v.size - 1) * v.std(ddof=1) / math.sqrt(v.size))


def ref_scheme_row(arr, scheme: str, role: str, d: int = 0) -> dict:
    sch = get_scheme(scheme)
    x0 = _to2d(arr)
    x = fpsim.rht(x0, d, "recipe", axis=-1) if d else x0
    q = fpsim.quantize(x, sch)
    xq = q.dequantize()
    r = {"numel": int(np.asarray(arr).size), "nan_count": int(np.isnan(x0).sum()),
         "inf_count": int(np.isinf(x0).sum()), "bits_per_element": _bits(q), "bias_sr": math.nan,
         "bias_sr_ci95": math.nan, **_tensor_stats(x), **_errors(x, xq)}
    r.update(_elements(x, xq, q, not math.isnan(r["mse"])))
    if role == "gradient" and sch.kind is not Kind.CAST and not d:
        draws = [_errors(x, fpsim.quantize(x, sch, rounding="sr", seed=s).dequantize())["bias_rne"]
                 for s in range(SEEDS)]
        if not any(map(math.isnan, draws)):
            r["bias_sr"], r["bias_sr_ci95"] = _ci95(draws)
    return r


def ref_recipe_rows(name: str, arr, role: str, recipe: str = "nvfp4_paper") -> dict:
    rec = get_recipe(recipe)
    x = _to2d(arr)
    out = {}
    for rl in [r for r in ROLES if ROLE_TENSOR[r] == {"weight": "w", "activation": "x", "gradient": "dy"}[role]]:
        pol = rec.policy(rl)
        copy = np.ascontiguousarray(x.T if rl in ("dgrad_w", "wgrad_dy", "wgrad_x") else x)
        st = operand_steps(pol, seed=0, layer=name, role=rl)
        if st.rht and copy.shape[-1] % st.rht:
            continue
        xin = fpsim.rht(copy, st.rht, st.signs, axis=-1) if st.rht else copy
        draws, r = [], None
        for s in range(SEEDS if st.seed is not None else 1):
            q = quantize_operand(copy, pol, seed=s, layer=name, role=rl)
            xq = q.dequantize() if isinstance(q, fpsim.QuantizedTensor) else q
            back = fpsim.rht(xq, st.rht, operand_steps(pol, seed=s, layer=name, role=rl).signs, axis=-1,
                             bf16_in=False, bf16_out=False, inverse=True) if st.rht else xq
            e = _errors(copy, back)  # errors in the original basis, element statistics on what was quantized
            draws.append(e["bias_rne"])
            if r is None:
                r = dict(e, flushed_frac=_errors(xin, xq)["flushed_frac"], nan_count=int(np.isnan(x).sum()),
                         inf_count=int(np.isinf(x).sum()), **_tensor_stats(xin))
                r.update(_elements(xin, xq, q, not math.isnan(e["mse"])))
                r["bits_per_element"] = _bits(q) if isinstance(q, fpsim.QuantizedTensor) else 32.0
        r["bias_sr"] = r["bias_sr_ci95"] = math.nan
        if st.seed is not None:
            r["bias_rne"] = math.nan
            if not any(map(math.isnan, draws)):
                r["bias_sr"], r["bias_sr_ci95"] = _ci95(draws)
        out[f"{rec.name}:{rl}"] = r
    return out


_EXACT = ("numel", "nan_count", "inf_count", "nonfinite_out_count", "flushed_frac", "saturated_frac",
          "small_scale_block_frac", "bits_per_element", "max_abs_error")


def mismatches(got: dict, ref: dict, ctx: str) -> list[str]:
    bad = []
    for c, want in ref.items():
        if c.startswith("_"):
            continue
        g = math.nan if got[c] is None else got[c]
        if math.isnan(g) or math.isnan(want):
            if math.isnan(g) != math.isnan(want):
                bad.append(f"{ctx} {c}: got {g!r}, want {want!r} ({got['notes'].get(c)})")
            elif c not in got["notes"]:
                bad.append(f"{ctx} {c}: empty without a reason in notes")
            continue
        if c in _EXACT:
            ok = g == want
        elif c in ("bias_rne", "bias_sr"):
            ok = abs(g - want) <= 1e-12 * max(ref.get("_abs_err", 0.0), abs(want))
        else:
            ok = math.isclose(g, want, rel_tol=1e-12 if c in ("mse", "sqnr_db", "rel_error",
                                                               "block_dyn_range_log2") else 1e-9)
        if not ok:
            bad.append(f"{ctx} {c}: got {g!r}, want {want!r}")
    return bad


# --- the tensors ---------------------------------------------------------------------------------------


def _tensors() -> dict:
    rng = np.random.default_rng(1)
    t = {"gauss.grad": rng.standard_normal((48, 48)).astype(np.float32),
         "heavy.weight": (rng.standard_t(2, (40, 64)) * 0.01).astype(np.float32),
         "zero.w": np.zeros((16, 32), np.float32), "const.dy": np.full((16, 32), 0.37, np.float32),
         "one.w": np.array([1.5], np.float32), "row.dy": rng.standard_normal(37).astype(np.float32),
         "odd.w": rng.standard_normal((33, 23)).astype(np.float32),
         "f16.x": (rng.standard_normal((32, 32)) * 100).astype(np.float16),
         "bf16.grad": rng.standard_normal((32, 32)).astype(ml_dtypes.bfloat16),
         "many.dy": (rng.standard_normal((160, 32)) * np.exp(2 * rng.standard_normal((160, 1)))).astype(np.float32)}
    o = rng.standard_normal((48, 32)).astype(np.float32)
    o[3, 5], o[10, :4] = 5e3, -300
    t["outlier.x"] = o
    s = rng.standard_normal((32, 48)).astype(np.float32)
    s[1, 1], s[2, 2], s[3, 3] = np.inf, -np.inf, -0.0
    s[4, :16] = np.float32(1e-40)  # float32 subnormals
    s[5, 16:32] = (rng.standard_normal(16) * 1e-42).astype(np.float32)
    s[6, :] = 3e38  # beyond BF16's range: the cast gives inf (nonfinite_out)
    t["inf_subnormal.grad"] = s
    nan = s.copy()
    nan[30, 0] = np.nan  # in the last chunk of 16 rows: the NaN amax must reach every chunk
    t["nan.grad"] = nan
    w = rng.standard_normal((32, 32))
    w[0, 0] = 1e39  # finite float64, inf as float32
    t["f64.x"] = w
    tiny = (rng.standard_normal((32, 32)) * 1e-30).astype(np.float32)
    tiny[0, 0] = 1.0  # most NVFP4 block scales subnormal or zero
    t["smallscale.x"] = tiny
    return t


TENSORS = _tensors()


@pytest.mark.parametrize("name", list(TENSORS))
def test_columns_match_the_independent_reference(name):
    """Every scheme, +rht16 and nvfp4_paper rows, one chunk and chunks of 16 rows (chunk_bytes=1)."""
    arr, role = TENSORS[name], guess_role(name)
    refs = {s: ref_scheme_row(arr, s, role) for s in SCHEMES}
    if arr.shape[-1] % 16 == 0:
        refs.update({f"{s}+rht16": ref_scheme_row(arr, s, role, 16) for s in SCHEMES
                     if get_scheme(s).kind is not Kind.CAST})
    refs.update(ref_recipe_rows(name, arr, role))
    bad = []
    for cb in (1, 64 << 20):
        rows = {r["scheme"]: r for r in analyze_tensor(name, arr, tuple(SCHEMES), rht_d=16, seeds=SEEDS,
                                                      recipe="nvfp4_paper", chunk_bytes=cb)}
        for label, ref in refs.items():
            bad += mismatches(rows[label], ref, f"chunk_bytes={cb} {label}")
        for r in rows.values():
            bad += [f"{r['scheme']} {c}: empty without a reason" for c in METRIC_COLUMNS
                    if isinstance(r[c], float) and math.isnan(r[c]) and c not in r["notes"]]
    assert not bad, "\n".join(bad)


# --- the defects, one test each --------------------------------------------------------------------------


def test_nan_amax_propagates_to_every_chunk():
    """SPEC §9: a NaN element makes the tensor amax NaN, so every element decodes to NaN, whatever the chunking
    (the running max took a later chunk's finite max over the NaN)."""
    x = np.random.default_rng(0).standard_normal((64, 16)).astype(np.float32)
    x[0, 0] = np.nan  # first chunk of 16 rows
    for cb in (1, 64 << 20):
        for r in analyze_tensor("t.grad", x, ("nvfp4", "fp8_e4m3"), chunk_bytes=cb, seeds=2):
            assert r["nonfinite_out_count"] == x.size - 1, (cb, r["scheme"])
            assert math.isnan(r["mse"]) and math.isnan(r["bias_sr"]) and "SPEC §9" in r["notes"]["mse"]


def test_rht_rows_count_the_inputs_nan_and_inf():
    """LEGEND: nan_count/inf_count are of the input (kurtosis is of the rotated tensor); the rotation spreads one
    NaN or inf over its 16-tile, so the rotated copy's counts are not the input's."""
    x = np.random.default_rng(0).standard_normal((16, 32)).astype(np.float64)
    x[0, 0], x[1, 1], x[2, 2] = np.nan, np.inf, 1e39  # 1e39: finite float64, inf once float32
    rows = analyze_tensor("t.grad", x, ("nvfp4",), rht_d=16, recipe="nvfp4_paper", seeds=0)
    for r in rows:
        assert (r["nan_count"], r["inf_count"]) == (1, 2), r["scheme"]
        assert "1 finite float64" in r["notes"]["inf_count"], r["scheme"]
    assert {r["scheme"] for r in rows} >= {"nvfp4+rht16", "nvfp4_paper:wgrad_dy"}


def test_recipe_sr_row_without_measured_elements_says_why_the_interval_is_empty():
    x = np.random.default_rng(0).standard_normal((32, 32)).astype(np.float32)
    x[0, 0] = np.nan
    for r in analyze_tensor("t.grad", x, ("nvfp4",), recipe="nvfp4_paper", seeds=3):
        assert math.isnan(r["bias_sr_ci95"]) and r["notes"]["bias_sr_ci95"], r["scheme"]


def test_recipe_rows_count_one_fp32_tensor_scale():
    """fp8_current's copies are per-tensor FP8: 8 bits + one FP32 scale, as the fp8_e4m3 row says (not two)."""
    x = np.random.default_rng(0).standard_normal((16, 16)).astype(np.float32)
    rows = {r["scheme"]: r["bits_per_element"] for r in analyze_tensor("t.x", x, ("fp8_e4m3",), recipe="fp8_current")}
    assert rows == dict.fromkeys(("fp8_e4m3", "fp8_current:fprop_x", "fp8_current:wgrad_x"), 8 + 32 / 256)


# --- the CLI: JSON against the reference, every rendering against the JSON ---------------------------------


def _cells(out: dict) -> tuple[list[dict], dict]:
    """Markdown rows (header → cell) in order, and table cells by (tensor, scheme)."""
    md, hdr = [], None
    for ln in out["markdown"].splitlines():
        if ln.startswith("| scheme"):
            hdr = [h.strip() for h in ln.strip("|").split("|")]
        elif ln.startswith("| ") and hdr:
            md.append(dict(zip(hdr, [c.strip() for c in ln.strip("|").split("|")])))
    table, tensor, heads = {}, None, None
    for ln in out["table"].splitlines():
        if ln.startswith("t.safetensors:"):
            tensor = ln.split("  (")[0]
        elif not ln.strip() or not ln.startswith("  ") or tensor is None:
            tensor = None if not ln.strip() else tensor
        elif ln.split()[0] == "scheme":
            heads = ln.split()
        else:
            toks = ln.split()
            table.setdefault((tensor, toks[0]), {}).update(zip(heads[1:], toks[1:]))
    return md, table


def _same_rounded(cell: str, v, col: str) -> bool:
    if v is None:
        return cell == "–"
    if isinstance(v, str):
        return cell == v
    sig = 3 if col.startswith("bias") else 4  # _fmt3 / _fmt
    return math.isclose(float(cell), v, rel_tol=0.51 * 10.0 ** (1 - sig))


def test_cli_json_matches_reference_and_renderings_match_json(tmp_path):
    rng = np.random.default_rng(5)
    nan = rng.standard_normal((32, 32)).astype(np.float32)
    nan[0, 0], nan[1, 1] = np.nan, np.inf
    t = {"a.weight": rng.standard_normal((32, 48)).astype(np.float32),
         "b.grad_output": (rng.standard_normal((48, 32)) * 1e-3).astype(ml_dtypes.bfloat16),
         "c.input": rng.standard_t(3, (16, 32, 8)).astype(np.float32), "d.input": np.zeros((16, 16), np.float32),
         "e.weight": rng.standard_normal((48, 20)).astype(np.float16), "f.grad": nan}
    p = tmp_path / "t.safetensors"
    write_safetensors(p, t)
    out = {}
    for fmt in ("json", "csv", "markdown", "table"):
        r = run(p, "--formats", "nvfp4,mxfp4,fp8_e4m3,bf16,fp8_block128", "--rht", "16", "--recipe", "nvfp4_paper",
                "--axis", "0", "--seeds", str(SEEDS), "--format", fmt)
        assert r.exit_code == 0, r.output
        out[fmt] = r.stdout
    j = strict_json(out["json"])
    bad = []
    for row in j["rows"]:
        name, sc = row["tensor"].split(":", 1)[1], row["scheme"]
        a = np.moveaxis(t[name], 0, -1)  # --axis 0: blocks along the first axis
        if ":" in sc:
            ref = ref_recipe_rows(row["tensor"], a, guess_role(name)).get(sc)
        elif "+rht" in sc:
            ref = ref_scheme_row(a, sc.split("+")[0], guess_role(name), 16) if a.shape[-1] % 16 == 0 else None
        else:
            ref = ref_scheme_row(a, sc, guess_role(name))
        if ref is not None:
            bad += mismatches(row, ref, f"{name} {sc}")
        bad += [f"{name} {sc} {c}: null without a reason" for c in METRIC_COLUMNS
                if row[c] is None and c not in row["notes"]]
    for cr, jr in zip(csv.DictReader(io.StringIO(out["csv"])), j["rows"], strict=True):
        for c in METRIC_COLUMNS:  # CSV writes repr: equal to the JSON number exactly
            v = jr[c]
            want = "" if v is None else "x".join(map(str, v)) if isinstance(v, list) else v
            if (float(cr[c]) if isinstance(want, float) else cr[c] if isinstance(want, str) else int(cr[c])) != want:
                bad.append(f"csv {jr['tensor']} {jr['scheme']} {c}: {cr[c]!r} vs {v!r}")
        bad += [f"csv notes lack {c}" for c, why in jr["notes"].items() if why not in cr["notes"]]
        assert (cr["keep_bf16"] == "true") == (jr["tensor"] in j["summary"]["keep_bf16"])
    md, table = _cells(out)
    for mr, jr in zip(md, j["rows"], strict=True):
        bad += [f"md {jr['tensor']} {jr['scheme']} {c}: {mr[h]} vs {jr[c]}" for h, c in _TABLE
                if not _same_rounded(mr[h], jr[c], c)]
    cols = dict(_TABLE, nonfinite_out="nonfinite_out_count")
    for jr in j["rows"]:
        cells = table[(jr["tensor"], jr["scheme"])]
        assert set(cells) == {h for h, _ in _TABLE[1:]} | {"nonfinite_out"}
        bad += [f"table {jr['tensor']} {jr['scheme']} {h}: {v} vs {jr[cols[h]]}" for h, v in cells.items()
                if not _same_rounded(v, jr[cols[h]], cols[h])]
    # the ranking: the first scheme's bulk error over its Gaussian yardstick, highest first; flagged above 1.5
    first = [r for r in j["rows"] if r["scheme"] == j["rows"][0]["scheme"]]
    ref = j["summary"]["gaussian_bulk_rel_error"]
    ranked = sorted((r for r in first if r["bulk_rel_error"] is not None), key=lambda r: -r["bulk_rel_error"])
    assert [e["tensor"] for e in j["summary"]["ranking"]] == [r["tensor"] for r in ranked]
    assert j["summary"]["keep_bf16"] == [r["tensor"] for r in ranked if r["bulk_rel_error"] / ref > 1.5]
    assert {e["tensor"] for e in j["summary"]["unranked"]} == {r["tensor"] for r in first
                                                               if r["bulk_rel_error"] is None}
    assert not bad, "\n".join(bad)
