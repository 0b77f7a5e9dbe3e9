"""Format specs: derived properties against a table hand-derived from SPEC §1."""

import math

import ml_dtypes
import numpy as np
import pytest

import fpsim
from fpsim.formats import ALIASES, FORMATS, get_format
from tests.reference import code_value, grid

# name: (bits, bias, max finite, min normal, min subnormal, NaN code, inf code) — SPEC §1 / §2
SPEC_TABLE = {
    "float4_e2m1fn": (4, 1, 6.0, 1.0, 0.5, 0x7, None),
    "float6_e2m3fn": (6, 1, 7.5, 1.0, 0.125, 0x1F, None),
    "float6_e3m2fn": (6, 3, 28.0, 0.25, 0.0625, 0x1F, None),
    "float8_e4m3fn": (8, 7, 448.0, 2.0**-6, 2.0**-9, 0x7F, None),
    "float8_e5m2": (8, 15, 57344.0, 2.0**-14, 2.0**-16, 0x7F, 0x7C),
    "float8_e8m0fnu": (8, 127, 2.0**127, 2.0**-127, None, 0xFF, None),
    "bfloat16": (16, 127, float(ml_dtypes.finfo(ml_dtypes.bfloat16).max), 2.0**-126, 2.0**-133, 0x7FFF, 0x7F80),
    "float16": (16, 15, 65504.0, 2.0**-14, 2.0**-24, 0x7FFF, 0x7C00),
}


@pytest.mark.parametrize("name", list(SPEC_TABLE))
def test_derived_properties_match_spec_table(name):
    bits, bias, mx, mn, msub, nan, inf = SPEC_TABLE[name]
    s = get_format(name)
    assert (s.bits, s.bias, s.max, s.min_normal, s.min_subnormal, s.nan_code, s.inf_code) == (
        bits, bias, mx, mn, msub, nan, inf,
    )


def test_e2m1_values_are_the_spec_list():
    assert get_format("e2m1").values().tolist() == [0, 0.5, 1, 1.5, 2, 3, 4, 6]


@pytest.mark.parametrize("name", [n for n in FORMATS if n != "float32"])
def test_decode_table_matches_field_definition(name):
    """decode_table (numpy, vectorised) equals the per-code rational definition of SPEC §1."""
    s = get_format(name)
    t = s.decode_table()
    for code in range(1 << s.bits):
        v = code_value(s, code)
        if v == "nan":
            assert t.view(np.uint32)[code] == 0x7FC00000, hex(code)
        elif v in ("+inf", "-inf"):
            assert t[code] == (math.inf if v == "+inf" else -math.inf), hex(code)
        else:
            assert t[code] == float(v), hex(code)
            if v == 0:
                assert math.copysign(1, t[code]) == (-1 if code & s.sign_mask else 1), hex(code)


@pytest.mark.parametrize("name", [n for n in FORMATS if n not in ("float32",)])
def test_decode_table_equals_ml_dtypes(name):
    """Every code decodes like ml_dtypes (NaN positions included)."""
    s = get_format(name)
    codes = np.arange(1 << s.bits, dtype=s.code_dtype)
    ml = codes.view(s.ml_dtype).astype(np.float32)
    t = s.decode_table()
    assert np.array_equal(np.isnan(ml), np.isnan(t))
    ok = ~np.isnan(t)
    assert np.array_equal(ml[ok].view(np.uint32), t[ok].view(np.uint32))


def test_ml_dtypes_finfo_agrees():
    for name in ["float8_e4m3fn", "float8_e5m2", "bfloat16", "float6_e2m3fn", "float6_e3m2fn", "float4_e2m1fn"]:
        s = get_format(name)
        fi = ml_dtypes.finfo(s.ml_dtype)
        assert float(fi.max) == s.max and float(fi.smallest_normal) == s.min_normal
        assert float(fi.smallest_subnormal) == s.min_subnormal and fi.nmant == s.mbits


def test_grid_is_strictly_increasing_and_codes_monotone():
    for name in FORMATS:
        if name == "float32":
            continue
        vals, codes = grid(get_format(name))
        assert all(a < b for a, b in zip(vals, vals[1:]))
        assert codes == sorted(codes)


def test_aliases_resolve_and_unknown_is_clear():
    assert get_format("E4M3").name == "float8_e4m3fn"
    assert get_format("fp4").name == "float4_e2m1fn"
    assert get_format("bf16").name == "bfloat16"
    assert get_format("ue8m0").name == "float8_e8m0fnu"
    assert set(ALIASES.values()) == set(FORMATS)
    with pytest.raises(ValueError, match="unknown element format 'e9m9'"):
        get_format("e9m9")


def test_spec_is_frozen_and_validated():
    s = get_format("e2m1")
    with pytest.raises(AttributeError):
        s.mbits = 3  # type: ignore[misc]
    with pytest.raises(ValueError):
        fpsim.FormatSpec("bad", 9, 0, 1)
    with pytest.raises(ValueError):
        fpsim.FormatSpec("bad", 4, 2, 7, subnormals=False)


def test_custom_format_works_through_the_generic_kernel():
    """A format that is not registered (E3M4) encodes and decodes through the same code path."""
    e3m4 = fpsim.FormatSpec("e3m4", 3, 4, 3, nan=fpsim.NanStyle.NONE)
    x = e3m4.decode_table()
    assert np.array_equal(fpsim.encode(x, e3m4), np.arange(256, dtype=np.uint8))
    assert e3m4.max == 31.0 and e3m4.min_subnormal == 2.0**-6
