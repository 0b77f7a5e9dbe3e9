"""Reference-oracle tooling (fpsim.oracle, `fpsim explain|diff|vectors`).

Each mismatch class of `diff` is tested with a candidate built from fpsim's own
correct output with exactly that defect; explain outputs are checked against
hand-derived cases; vectors round-trip through the raw .bin format and match the
hand-derived golden cases of tests/scaling_golden.py.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from click.testing import CliRunner

import fpsim
from fpsim.oracle import diff, explain_block, explain_value, read_vectors, write_vectors
from fpsim_cli.main import main
from tests import scaling_golden as G

F32 = np.float32
FLT_MAX = F32(np.finfo(np.float32).max)
E4M3 = fpsim.get_format("e4m3")


def _rng_tensor(rows=8, cols=128, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, cols)).astype(np.float32)
    return (x * np.exp2(rng.integers(-12, 4, (rows, 1)))).astype(np.float32)


def nvfp4_candidate(x, sdb_of, floor=None):
    """A straightforward NVFP4 kernel in numpy (1×16 blocks) with a pluggable scale formula and lower clamp."""
    x = np.asarray(x, np.float32)
    R, C = x.shape
    nb = -(-C // 16)
    X = np.zeros((R, nb * 16), np.float32)
    X[:, :C] = x
    amax = F32(np.max(np.abs(x)))
    s_enc = min(F32(2688) / amax, FLT_MAX) if amax != 0 else F32(1)
    s_enc = F32(1) if s_enc == 0 else F32(s_enc)
    s_dec = F32(1) / s_enc
    vmax = np.abs(X).reshape(R, nb, 16).max(axis=2)
    with np.errstate(all="ignore"):
        sdb = np.minimum(sdb_of(vmax, s_enc, s_dec, amax), F32(448)).astype(np.float32)
    sb = fpsim.encode(sdb, "e4m3")
    if floor is not None:
        sb = np.where(E4M3.decode_table()[sb] < floor, fpsim.encode(np.float32(floor), "e4m3"), sb).astype(np.uint8)
    with np.errstate(all="ignore"):
        enc = np.minimum(F32(1) / (E4M3.decode_table()[sb] * s_dec), FLT_MAX).astype(np.float32)
        y = (X.reshape(R, nb, 16) * enc[:, :, None]).astype(np.float32).reshape(R, -1)
    return fpsim.pack_fp4(fpsim.encode(y, "e2m1")), sb, amax


def te_order(vmax, s_enc, s_dec, amax):
    return vmax * (s_enc * (F32(1) / F32(6)))


def mul_first(vmax, s_enc, s_dec, amax):
    return (vmax * s_enc) * (F32(1) / F32(6))


# ---------------------------------------------------------------------------
# diff: one test per mismatch class


def test_correct_numpy_kernel_is_identical():
    x = _rng_tensor()
    codes, scales, amax = nvfp4_candidate(x, te_order)
    rep = diff(codes, scales, x, "nvfp4", candidate_amax=amax)
    assert rep.identical and rep.n_code_mismatches == 0 and rep.causes == {} and rep.amax_match


def test_tie_rounding_away_from_zero():
    x = np.array(G.A + G.blk(6.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.25, -2.5, -5.0), np.float32)[None]
    q = fpsim.quantize(x, "nvfp4")
    bad = fpsim.quantize(x, "nvfp4", rounding="rna")  # the defect: ties away from zero
    rep = diff(bad.data, bad.scales, x, "nvfp4")
    # ties whose upper neighbour is the even code agree (0.75, 1.75, 3.5); the other 7 differ
    assert rep.n_code_mismatches == 7 and rep.n_scale_mismatches == 0
    assert rep.causes == {"tie rounding": 7}
    assert all(m["detail"] == "candidate rounds ties away from zero" for m in rep.code_mismatches)
    m = rep.code_mismatches[0]
    assert (m["x"], m["ours_hex"], m["candidate_hex"]) == (0.25, "0x0", "0x1")
    assert not diff(q.data, q.scales, x, "nvfp4").code_mismatches


def test_scale_operation_order():
    x = np.array([G.blk(100.0) + G.blk(0.3487723469734192)], np.float32)
    codes, scales, _ = nvfp4_candidate(x, mul_first)
    rep = diff(codes, scales, x, "nvfp4")
    assert rep.n_scale_mismatches == 1 and rep.causes == {"scale operation order": 1}
    s = rep.scale_mismatches[0]
    assert (s["block"], s["ours_hex"], s["candidate_hex"]) == ([0, 1], "0x3D", "0x3C")
    assert s["detail"] == "candidate = fl(fl(vmax·S_enc)·fl(1/6))"


def test_scale_operation_order_elements_follow_their_block():
    # the tie of test_scale_operation_order, scaled so that an element code changes with the scale byte
    x = np.array([G.blk(100.0) + G.blk(0.3487723469734192, 0.3487723469734192 * 0.6)], np.float32)
    codes, scales, _ = nvfp4_candidate(x, mul_first)
    rep = diff(codes, scales, x, "nvfp4")
    assert rep.n_code_mismatches >= 1
    assert set(rep.causes) == {"scale operation order"}
    # the order hypothesis computes the scale and, from it, the codes: it explains both kinds of byte
    assert all(m["detail"] == "candidate = fl(fl(vmax·S_enc)·fl(1/6))" for m in rep.code_mismatches)
    assert rep.explained_by[0] == "candidate = fl(fl(vmax·S_enc)·fl(1/6))"


def test_scale_clamp():
    x = np.array([G.A + G.blk(6 * 2.0**-8, 2.0**-8) + G.blk(2.688e-4, -1e-4) + G.blk(3.0)], np.float32)
    codes, scales, _ = nvfp4_candidate(x, te_order, floor=2.0**-6)  # clamp to the smallest normal E4M3 scale
    rep = diff(codes, scales, x, "nvfp4")
    assert rep.n_scale_mismatches == 2
    assert set(rep.causes) == {"scale clamp"}
    assert all(m["detail"] == "candidate clamps block scales to ≥ 0.015625 (torchao's 2^-6)"
               for m in rep.scale_mismatches)


def test_signed_zero():
    x = np.array([G.blk(6.0, -0.0, -0.1, -1e-9, 0.1)], np.float32)
    q = fpsim.quantize(x, "nvfp4")
    codes = fpsim.unpack_fp4(q.data)
    assert list(codes[0, 1:4]) == [0x8, 0x8, 0x8]
    bad = np.where(codes == 0x8, 0x0, codes).astype(np.uint8)  # the defect: no negative zero
    rep = diff(fpsim.pack_fp4(bad), q.scales, x, "nvfp4")
    assert rep.causes == {"±0 sign": 3}


def test_nan_handling():
    x = _rng_tensor(2, 64)
    x[1, 5] = np.nan
    bad = fpsim.quantize(x, "nvfp4", nan_amax="ignore")  # the defect: the amax skips NaN (fmaxf)
    rep = diff(bad.data, bad.scales, x, "nvfp4", candidate_amax=bad.amax)
    assert rep.n_scale_mismatches == 8 and not rep.amax_match
    assert set(rep.causes) == {"NaN handling"}


def test_nibble_packing_order():
    x = _rng_tensor(4, 64)
    q = fpsim.quantize(x, "nvfp4")
    b = q.data
    rep = diff(((b << 4) | (b >> 4)).astype(np.uint8), q.scales, x, "nvfp4")
    assert rep.n_code_mismatches > 100 and rep.causes == {"nibble packing order": rep.n_code_mismatches}
    assert any("HIGH nibble" in f for f in rep.findings)


def test_swizzled_scale_layout_undeclared_and_wrongly_declared():
    x = _rng_tensor(128, 64, seed=3)  # [128, 4] scales: swizzled and plain have the same size
    q = fpsim.quantize(x, "nvfp4")
    sw = fpsim.swizzle_scales(q.scales)
    rep = diff(q.data, sw, x, "nvfp4")
    assert rep.n_code_mismatches == 0 and rep.n_scale_mismatches > 0
    assert set(rep.causes) == {"swizzled scale layout"}
    assert diff(q.data, sw, x, "nvfp4", swizzled=True).identical
    rep = diff(q.data, q.scales, x, "nvfp4", swizzled=True)  # plain scales declared swizzled
    assert set(rep.causes) == {"swizzled scale layout"} and "not swizzled as declared" in rep.findings[0]
    # [3, 2] scales swizzled to 512 bytes: recognised by the size
    x3 = _rng_tensor(3, 32)
    q3 = fpsim.quantize(x3, "nvfp4")
    rep = diff(q3.data, fpsim.swizzle_scales(q3.scales), x3, "nvfp4")
    assert "unswizzled they equal fpsim's" in rep.findings[0]


def test_mx_scale_rule():
    x = _rng_tensor(4, 128, seed=5)
    bad = fpsim.quantize(x, "mxfp4", scale_rule="floor")
    rep = diff(bad.data, bad.scales, x, "mxfp4")
    assert rep.n_scale_mismatches > 0
    assert set(rep.causes) == {"MX scale rule"}
    assert rep.scale_mismatches[0]["detail"] == "candidate = floor rule (floor(log2 amax) − emax_elem, on bits), " \
        "fpsim = rceil"


def test_zero_scale_block_without_flt_max_cap():
    x = np.array([G.blk(2688.0) + G.blk() + G.blk(1e-9)], np.float32)  # blocks 1 and 2 get scale 0
    q = fpsim.quantize(x, "nvfp4")
    assert list(q.scales[0]) == [0x7E, 0x00, 0x00]
    with np.errstate(all="ignore"):
        y = x * (F32(1) / F32(0))  # the defect: enc_b = 1/0 = inf, not capped at FLT_MAX
    codes = fpsim.unpack_fp4(q.data)
    codes[:, 16:] = fpsim.encode(y[:, 16:], "e2m1")  # 0·inf = NaN → 0x7; 1e-9·inf = inf → 0x7
    rep = diff(fpsim.pack_fp4(codes), q.scales, x, "nvfp4")
    assert rep.causes == {"zero-scale block": 31}  # the non-zero element: 1e-9·FLT_MAX also saturates to 6


def test_truncating_kernel_is_a_rounding_mode():
    x = _rng_tensor(2, 32, seed=7)
    bad = fpsim.quantize(x, "mxfp8_e4m3", rounding="rtz")
    rep = diff(bad.data, bad.scales, x, "mxfp8_e4m3")
    assert rep.n_code_mismatches > 0 and set(rep.causes) == {"rounding mode"}


def test_unknown_defect_is_other_and_shapes_are_checked():
    x = _rng_tensor(2, 32)
    q = fpsim.quantize(x, "nvfp4")
    d = q.data.copy()
    d[0, 0] ^= 0x3
    assert diff(d, q.scales, x, "nvfp4").causes.get("other", 0) >= 1
    with pytest.raises(ValueError, match="expected 2×16"):
        diff(q.data[:, :5], q.scales, x, "nvfp4")
    with pytest.raises(ValueError, match="expected 2×2 = 4"):
        diff(q.data, q.scales[:, :1], x, "nvfp4")


# ---------------------------------------------------------------------------
# explain


@pytest.mark.parametrize(
    "x, fmt, sat, rule, code, value",
    [
        (0.75, "e2m1", True, "tie-to-even", 0x2, 1.0),
        (5.0, "e2m1", True, "tie-to-even", 0x6, 4.0),
        (-0.25, "e2m1", True, "tie-to-even", 0x8, -0.0),
        (464.0, "e4m3", False, "tie-to-even", 0x7E, 448.0),
        (float("nan"), "e2m1", True, "NaN policy", 0x7, 6.0),
        (1e9, "e4m3", True, "saturation", 0x7E, 448.0),
        (float("-inf"), "e2m1", False, "saturation", 0xF, -6.0),
        (480.0, "e4m3", False, "overflow to NaN", 0x7F, float("nan")),
        (61440.0, "e5m2", False, "overflow to inf", 0x7C, float("inf")),
        (0.7500001, "e2m1", True, "sticky bits", 0x2, 1.0),
        (0.2, "e2m1", True, "below midpoint", 0x0, 0.0),
        (3.0, "e8m0", True, "tie-to-even", 0x80, 2.0),
        (1e-45, "e8m0", True, "underflow (no zero)", 0x00, 2.0**-127),
        (1.5, "e2m1", True, "exact", 0x3, 1.5),
    ],
)
def test_explain_value_hand_derived(x, fmt, sat, rule, code, value):
    d = explain_value(x, fmt, saturate=sat)
    assert d["rule"] == rule
    assert d["result"]["code"] == code
    assert d["result"]["value"] == value or (np.isnan(value) and np.isnan(d["result"]["value"]))


def test_explain_value_fields_and_neighbours():
    d = explain_value(0.75, "e2m1")
    assert d["input"]["hex"] == "0x3F400000" and d["input"]["exponent_field"] == 126
    assert (d["below"]["value"], d["below"]["hex"], d["above"]["value"], d["above"]["hex"]) == (0.5, "0x1", 1.0, "0x2")
    assert d["result"]["binary"] == "0.01.0" and d["position"] == {"fraction_of_step": 0.5, "round_bit": 1,
                                                                   "sticky": False}
    d = explain_value(0.3, "e2m1", scale=2.5)  # 0.3f·2.5 = 0.75 + 2^-25, half a float32 ulp: fl() gives 0.75
    assert d["scaled"]["hex"] == "0x3F400000" and d["rule"] == "tie-to-even" and d["result"]["hex"] == "0x2"
    assert "subnormal range of float8_e4m3fn (spacing 0.00195312)" in explain_value(0.001, "e4m3")["notes"]


@pytest.mark.parametrize("fmt", ["e2m1", "e2m3", "e3m2", "e4m3", "e5m2", "e8m0", "bf16"])
@pytest.mark.parametrize("mode", ["rne", "rtz", "rup", "rna"])
def test_explain_value_result_is_a_neighbour(fmt, mode):
    """The code is one of the two neighbours shown (or the max / a special), for values across the range."""
    spec = fpsim.get_format(fmt)
    rng = np.random.default_rng(11)
    xs = (rng.standard_normal(60) * np.exp2(rng.uniform(-12, 12, 60) * spec.ebits / 4)).astype(np.float32)
    for x in xs:
        d = explain_value(x, fmt, rounding=mode)
        assert d["result"]["code"] == int(fpsim.encode(np.float32(x), fmt, mode))
        if d["rule"] in ("exact", "underflow (no zero)"):
            continue
        allowed = {d["below"]["code"], d["above"]["code"]}
        if d["rule"] == "saturation":
            allowed.add(spec.max_code | (spec.sign_mask if x < 0 else 0))
        assert d["result"]["code"] in allowed, (fmt, mode, float(x), d["rule"])


def test_explain_value_refuses_float32_and_misplaced_sr_options():
    with pytest.raises(ValueError, match="float32"):
        explain_value(1.0, "float32")
    with pytest.raises(ValueError, match="--rounding sr"):
        explain_value(1.0, "e2m1", r=3)
    with pytest.raises(ValueError, match=r"r must be in 0\.\.15"):
        explain_value(1.0, "e2m1", rounding="sr", k=4, r=16)
    with pytest.raises(ValueError, match="saturates"):
        explain_value(1.0, "e2m1", rounding="sr", saturate=False)


@pytest.mark.parametrize("fmt,k", [("e2m1", 4), ("e2m1", 8), ("e4m3", 6), ("e5m2", 5), ("e3m2", 7)])
def test_explain_sr_threshold_is_the_encoders_for_every_random_value(fmt, k):
    """Stochastic rounding explained: for every r in 0 … 2^k − 1 the encoder's code is the 'above' neighbour exactly
    when r ≥ the explained threshold (float32 sums included), and the outcomes' probabilities are those counts."""
    from fpsim.formats import get_format

    spec = get_format(fmt)
    rng = np.random.default_rng(k)
    xs = np.concatenate([rng.uniform(-spec.max, spec.max, 40), rng.uniform(0, 4 * spec.min_subnormal, 10),
                         [spec.max * 0.999, -spec.min_subnormal * 0.5]]).astype(np.float32)
    rs = np.arange(1 << k, dtype=np.uint32)
    for x in xs:
        d = explain_value(x, fmt, rounding="sr", k=k)
        codes = fpsim.encode(np.full(rs.size, x, np.float32), fmt, "sr", rbits=rs, k=k)
        if d["rule"] != "stochastic rounding":
            assert d["result"] is not None and np.all(codes == d["result"]["code"]), (fmt, float(x), d["rule"])
            continue
        t = d["stochastic"]["threshold"]
        lo, hi = d["below"]["code"], d["above"]["code"]
        assert np.array_equal(codes, np.where(rs >= t, hi, lo).astype(codes.dtype)), (fmt, float(x), t)
        (o_lo, o_hi) = d["outcomes"]
        assert (o_lo["code"], o_hi["code"]) == (lo, hi) and d["result"] is None
        assert o_hi["probability"] == float(np.mean(codes == hi)) and o_lo["probability"] + o_hi["probability"] == 1
        assert abs(d["stochastic"]["p_away"] - d["stochastic"]["p_away_k"]) < 2.0 ** -k + 1e-12
        for r in (0, t - 1, t, (1 << k) - 1):
            if 0 <= r < 1 << k:
                assert explain_value(x, fmt, rounding="sr", k=k, r=r)["result"]["code"] == codes[r]


def test_explain_cli_prints_both_outcomes_of_stochastic_rounding():
    from click.testing import CliRunner

    from fpsim_cli.main import main

    r = CliRunner().invoke(main, ["explain", "0.3", "--format", "e2m1", "--rounding", "sr"])
    assert r.exit_code == 0 and "outcome   code 0x0  → 0  with probability 0.40234375" in r.output
    assert "outcome   code 0x1  → 0.5  with probability 0.59765625" in r.output and "r ≥ 103 of 0…255" in r.output
    r = CliRunner().invoke(main, ["explain", "0.3", "--format", "e2m1", "--rounding", "sr", "--random", "102"])
    assert r.exit_code == 0 and "result    code 0x0" in r.output
    r = CliRunner().invoke(main, ["explain", "0.3", "--format", "e2m1", "--random", "1"])
    assert r.exit_code == 2 and "--rounding sr" in r.output


def test_explain_block_operation_order_case_every_intermediate():
    d = explain_block([0.3487723469734192], "nvfp4", tensor_amax=100.0)
    hexes = {s["name"]: s["hex"] for s in d["steps"]}
    assert hexes["S_enc"] == "0x41D70A3D" and hexes["fl(1/6)"] == "0x3E2AAAAB"
    assert hexes["vmax·(…)"] == "0x3FC80001"  # one ulp above the E4M3 tie 1.5625
    assert hexes["s_b"] == "0x3D" and d["scale_code"] == 0x3D
    assert d["elements"][0]["code_hex"] == "0x7" and d["agrees_with_quantize"]


@pytest.mark.parametrize("case", [c for c in G.NVFP4 if c[2] == {}], ids=lambda c: c[0])
def test_explain_block_matches_golden_nvfp4(case):
    _, _, _, x, codes, scales, _ = case
    x = np.asarray(x, np.float32)
    with np.errstate(invalid="ignore"):
        amax = F32(np.max(np.abs(x)))
    for j in range(len(scales[0])):
        d = explain_block(x[0, 16 * j : 16 * (j + 1)], "nvfp4", tensor_amax=amax)
        assert d["scale_code"] == scales[0][j] and d["agrees_with_quantize"]
        assert [e["code"] for e in d["elements"]] == list(codes[0][16 * j : 16 * j + len(d["elements"])])


@pytest.mark.parametrize("name, elem, values, rule, codes, _dec", G.MX_CODES, ids=[c[0] for c in G.MX_CODES])
def test_explain_block_matches_golden_mx(name, elem, values, rule, codes, _dec):
    sch = fpsim.get_scheme("mxfp4" if elem == "e2m1" else "mxfp8_e4m3").replace(scale_rule=rule)
    d = explain_block(values, sch)
    assert d["agrees_with_quantize"]
    assert [e["code"] for e in d["elements"]] == codes[: len(values)]


def test_explain_block_rejects_amax_below_block():
    with pytest.raises(ValueError, match="below the block amax"):
        explain_block([6.0], "nvfp4", tensor_amax=1.0)


# ---------------------------------------------------------------------------
# vectors


def test_vectors_round_trip_through_raw_format(tmp_path):
    m = write_vectors("nvfp4", tmp_path)
    m2, raw = read_vectors(tmp_path, "bin")
    _, npz = read_vectors(tmp_path, "npz")
    assert m2 == json.loads(json.dumps(m))
    for name, arrs in raw.items():
        for f, a in arrs.items():
            assert a.dtype == npz[name][f].dtype and a.tobytes() == npz[name][f].tobytes(), (name, f)
        # the raw vectors decode to what fpsim decodes
        c = next(c for c in m["cases"] if c["name"] == name)
        kw = {k: tuple(v) if isinstance(v, list) else v for k, v in c["kwargs"].items()}
        q = fpsim.quantize(arrs["input"], "nvfp4", **kw)
        assert np.array_equal(arrs["packed"], q.data) and np.array_equal(arrs["scales"], q.scales)
        assert arrs["decoded"].tobytes() == q.dequantize().tobytes()
    # a corrupted file is caught by its sha256
    p = tmp_path / m["cases"][0]["files"]["codes"]["path"]
    p.write_bytes(b"\x01" + p.read_bytes()[1:])
    with pytest.raises(ValueError, match="sha256"):
        read_vectors(tmp_path)


def test_nvfp4_vectors_equal_the_hand_derived_golden_cases(tmp_path):
    write_vectors("nvfp4", tmp_path)
    m, cases = read_vectors(tmp_path)
    kwargs = {c["name"]: c["kwargs"] for c in m["cases"]}
    checked = 0
    for name, _, kw, x, codes, scales, decoded in G.NVFP4:
        v = cases[name]
        assert kwargs[name] == {k: list(a) if isinstance(a, tuple) else a for k, a in kw.items()}, name
        assert v["input"].tobytes() == np.asarray(x, np.float32).tobytes(), name
        assert v["codes"].tolist() == codes and v["scales"].tolist() == scales, name
        if decoded is not None:
            np.testing.assert_array_equal(v["decoded"], np.asarray(decoded, np.float32))
        checked += 1
    assert checked == len(G.NVFP4) == 16


@pytest.mark.parametrize("scheme", ["mxfp4", "mxfp8_e4m3", "fp8_block128"])
def test_other_scheme_vectors_agree_with_the_scalar_reference(tmp_path, scheme):
    from tests.scaling_reference import ref_fp32_blocks, ref_mx

    sch = fpsim.get_scheme(scheme)
    write_vectors(scheme, tmp_path)
    _, cases = read_vectors(tmp_path)
    assert "element grid and midpoints" in cases and "NaN propagates" in cases
    for name, v in cases.items():
        if name == "NaN ignored" or v["input"].size > 512:
            continue
        x = v["input"]
        if sch.kind.value == "pow2":
            codes, scales, _ = ref_mx(x, sch.element.name, "rceil", sch.block)
        else:
            codes, scales, _ = ref_fp32_blocks(x, sch.element.name, sch.block)
        assert v["codes"].tolist() == codes.tolist(), name
        assert np.asarray(v["scales"]).tobytes() == np.asarray(scales, v["scales"].dtype).tobytes(), name


# ---------------------------------------------------------------------------
# CLI


def _one_line_error(r):
    text = r.stderr.strip()
    assert "Traceback" not in r.output and len(text.splitlines()) == 1, r.output
    return text


def test_cli_explain_value_and_json():
    r = CliRunner().invoke(main, ["explain", "0.75", "--format", "e2m1"])
    assert r.exit_code == 0 and "tie-to-even" in r.stdout and "code 0x2 = 0b0.01.0" in r.stdout
    r = CliRunner().invoke(main, ["explain", "-5.0", "--format", "fp4"])
    assert r.exit_code == 0 and "code 0xE" in r.stdout
    r = CliRunner().invoke(main, ["explain", "nan", "--format", "e4m3", "--json"])
    d = json.loads(r.stdout)
    assert d["input"]["value"] is None and d["input"]["class"] == "nan" and d["result"]["hex"] == "0x7F"
    assert d["result"]["value"] is None and d["result"]["class"] == "nan"  # E4M3 0x7F decodes to NaN
    r = CliRunner().invoke(main, ["explain", "0x43E80000", "--format", "e4m3", "--no-saturate", "--json"])
    assert json.loads(r.stdout)["result"]["hex"] == "0x7E"


def test_cli_explain_errors():
    r = CliRunner().invoke(main, ["explain", "1.0", "--format", "e9m9"])
    assert r.exit_code == 2 and "unknown element format" in _one_line_error(r)
    r = CliRunner().invoke(main, ["explain", "one", "--format", "e2m1"])
    assert r.exit_code == 2 and "cannot read 'one'" in _one_line_error(r)
    r = CliRunner().invoke(main, ["explain", "--block", "/nonexistent.npz:x:0"])
    assert r.exit_code == 1 and "no such file" in _one_line_error(r)


def test_cli_explain_block_from_npz_and_safetensors(tmp_path):
    x = np.array([G.blk(100.0) + G.blk(0.3487723469734192)], np.float32)
    np.savez(tmp_path / "t.npz", w=x)
    r = CliRunner().invoke(main, ["explain", "--block", f"{tmp_path / 't.npz'}:w:1", "--scheme", "nvfp4"])
    assert r.exit_code == 0, r.output
    assert "0x3FC80001" in r.stdout and "0x3D" in r.stdout and "agrees with fpsim.quantize: yes" in r.stdout
    from safetensors.numpy import save_file

    save_file({"w": x}, str(tmp_path / "t.safetensors"))
    r = CliRunner().invoke(main, ["explain", "--block", f"{tmp_path / 't.safetensors'}:w:0,1", "--json"])
    assert r.exit_code == 0 and json.loads(r.stdout)["scale_code"] == 0x3D
    r = CliRunner().invoke(main, ["explain", "--block", f"{tmp_path / 't.npz'}:v:0"])
    assert r.exit_code == 1 and "no array 'v'" in _one_line_error(r)


@pytest.fixture
def files(tmp_path):
    x = _rng_tensor(4, 64)
    x[2, 7] = np.nan
    x[3] = G.A + G.blk(6.0, 0.25, 1.25, 5.0, -2.5) + G.blk() * 2  # E2M1 ties at scale 1 (S_enc = 1)
    xs = x[[0, 1, 3]]  # a NaN-free input too
    np.savez(tmp_path / "x.npz", x=xs)
    np.savez(tmp_path / "xnan.npz", x=x)
    q = fpsim.quantize(xs, "nvfp4")
    np.savez(tmp_path / "good.npz", codes=q.data, scales=q.scales, amax=q.amax)
    bad = fpsim.quantize(xs, "nvfp4", rounding="rna")
    np.savez(tmp_path / "bad.npz", codes=bad.data, scales=bad.scales)
    qn = fpsim.quantize(x, "nvfp4")
    np.savez(tmp_path / "nan.npz", codes=qn.data, scales=qn.scales)
    (tmp_path / "c.bin").write_bytes(q.data.tobytes())
    (tmp_path / "s.bin").write_bytes(q.scales.tobytes())
    return tmp_path


def test_cli_diff_identical_and_different(files):
    r = CliRunner().invoke(main, ["diff", str(files / "good.npz"), "--input", str(files / "x.npz")])
    assert r.exit_code == 0 and "IDENTICAL" in r.stdout
    r = CliRunner().invoke(main, ["diff", str(files / "bad.npz"), "--input", f"{files / 'x.npz'}:x", "--show", "2"])
    assert r.exit_code == 1 and "tie rounding" in r.stdout
    r = CliRunner().invoke(main, ["diff", str(files / "bad.npz"), "--input", str(files / "x.npz"), "--format", "json"])
    d = json.loads(r.stdout)
    assert r.exit_code == 1 and not d["identical"] and set(d["causes"]) == {"tie rounding"}
    assert len(d["first_code_mismatches"]) == min(10, d["code_mismatches"])


def test_cli_diff_json_has_no_bare_nan(files):
    r = CliRunner().invoke(main, ["diff", str(files / "nan.npz"), "--input", str(files / "xnan.npz"),
                                  "--format", "json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)  # json.loads would accept bare NaN; check the text too
    assert "NaN" not in r.stdout and "Infinity" not in r.stdout
    assert d["amax"]["ours"] is None and d["amax"]["ours_class"] == "nan"


def test_cli_diff_raw_files(files):
    args = ["diff", "--raw-codes", str(files / "c.bin"), "--raw-scales", str(files / "s.bin"),
            "--input", str(files / "x.npz")]
    assert CliRunner().invoke(main, args).exit_code == 0
    assert CliRunner().invoke(main, args + ["--shape", "3,32"]).exit_code == 0
    r = CliRunner().invoke(main, args + ["--shape", "3,31"])
    assert r.exit_code == 2 and "holds 93 values" in _one_line_error(r)


def test_cli_diff_bad_inputs(files, tmp_path):
    x = str(files / "x.npz")
    r = CliRunner().invoke(main, ["diff", str(tmp_path / "missing.npz"), "--input", x])
    assert r.exit_code == 2 and "no such file" in _one_line_error(r)
    np.savez(tmp_path / "pickled.npz", codes=np.array([{"a": 1}], dtype=object), scales=np.zeros(1))
    r = CliRunner().invoke(main, ["diff", str(tmp_path / "pickled.npz"), "--input", x])
    assert r.exit_code == 2 and "pickled" in _one_line_error(r)
    q = fpsim.quantize(np.load(x)["x"], "nvfp4")
    np.savez(tmp_path / "short.npz", codes=q.data[:, :7], scales=q.scales)
    r = CliRunner().invoke(main, ["diff", str(tmp_path / "short.npz"), "--input", x])
    assert r.exit_code == 2 and "expected 3×32 packed bytes" in _one_line_error(r)
    np.savez(tmp_path / "nokeys.npz", data=q.data)
    r = CliRunner().invoke(main, ["diff", str(tmp_path / "nokeys.npz"), "--input", x])
    assert r.exit_code == 2 and "missing key(s) codes, scales" in _one_line_error(r)
    r = CliRunner().invoke(main, ["diff", str(files / "good.npz"), "--input", x, "--scheme", "nvfp9"])
    assert r.exit_code == 2 and "unknown scheme" in _one_line_error(r)
    r = CliRunner().invoke(main, ["diff", str(files / "good.npz")])
    assert r.exit_code == 2 and "--input" in _one_line_error(r)


def test_cli_vectors(tmp_path):
    r = CliRunner().invoke(main, ["vectors", "--scheme", "mxfp4", "--out", str(tmp_path / "v")])
    assert r.exit_code == 0 and "wrote 12 cases of mxfp4" in r.stdout
    m, cases = read_vectors(tmp_path / "v")
    assert m["scheme"]["name"] == "mxfp4" and len(cases) == 12
    (tmp_path / "f").write_text("")
    r = CliRunner().invoke(main, ["vectors", "--out", str(tmp_path / "f")])
    assert r.exit_code == 2 and "Traceback" not in r.output  # click: the path is a file


def test_python_dash_m_fpsim_diff_exit_code(files):
    p = subprocess.run([sys.executable, "-m", "fpsim", "diff", str(files / "bad.npz"), "--input",
                        str(files / "x.npz"), "--format", "json"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 1, p.stderr
    assert set(json.loads(p.stdout)["causes"]) == {"tie rounding"}
