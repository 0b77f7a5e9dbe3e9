"""fpsim.oracle vectors: element-codec vectors, every MX rule, atomic output and refusals that leave nothing behind."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import fpsim
from fpsim.oracle import element_cases, read_vectors, write_vectors
from fpsim_cli.main import main


@pytest.mark.parametrize("fmt", ["e2m1", "e2m3", "e3m2", "e4m3", "e5m2", "e8m0"])
def test_element_vectors_agree_with_the_codec_and_cover_every_code(tmp_path, fmt):
    spec = fpsim.get_format(fmt)
    m = write_vectors(element=fmt, out_dir=tmp_path / "v")
    assert m["element"] == spec.name and "scheme" not in m
    _, cases = read_vectors(tmp_path / "v")
    dec = cases["decode every code"]
    assert dec["codes"].size == 1 << spec.bits
    assert dec["decoded"].tobytes() == fpsim.decode(dec["codes"], spec).tobytes()
    enc = cases["encode grid, midpoints and neighbours"]
    x = enc["input"]
    for mode in ("rne", "rtz", "rup", "rdown", "rna"):
        assert np.array_equal(enc[f"codes_{mode}"], fpsim.encode(x, spec, mode))
        assert np.array_equal(enc[f"codes_{mode}_nosat"], fpsim.encode(x, spec, mode, saturate=False))
    # every midpoint between neighbouring grid points is an input, and ties land on even codes under RNE
    vals = np.unique(np.abs(dec["decoded"][np.isfinite(dec["decoded"])]))
    mids = ((vals[:-1].astype(np.float64) + vals[1:]) / 2).astype(np.float32)
    assert np.isin(mids, x).all() and np.isin(-mids, x).all()


def test_element_cases_probe_both_sides_of_every_midpoint():
    _, _, x = element_cases("e2m1")
    for m in (0.25, 0.75, 5.0):
        m = np.float32(m)
        assert {np.nextafter(m, np.float32(0)), m, np.nextafter(m, np.float32(9))} <= set(x.tolist())
    assert np.isnan(x).any() and np.isinf(x).any() and (x == 0).any() and np.signbit(x[x == 0]).any()


def test_every_mx_rule_is_exported(tmp_path):
    m = write_vectors("mxfp4", tmp_path / "v", scale_rules="all")
    _, cases = read_vectors(tmp_path / "v")
    rules = {c["kwargs"]["scale_rule"] for c in m["cases"]}
    assert rules == {"floor", "ceil", "even", "rceil"} and len(cases) == 4 * 12
    v = cases["block amax not on the grid [floor]"]
    q = fpsim.quantize(v["input"], "mxfp4", scale_rule="floor")
    assert np.array_equal(v["scales"], q.scales) and v["decoded"].tobytes() == q.dequantize().tobytes()
    # floor and rceil differ on this case: the rule really is applied
    assert not np.array_equal(v["scales"], cases["block amax not on the grid [rceil]"]["scales"])


def test_refusals_leave_no_directory(tmp_path):
    out = tmp_path / "new" / "v"
    for kw in ({"scheme": "bf16"}, {"scheme": "nvfp4", "scale_rules": "all"}, {"element": "float32"},
               {"scheme": "mxfp4", "scale_rules": ["rceil", "round"]}):
        with pytest.raises(ValueError):
            write_vectors(out_dir=out, **kw)
        assert not (tmp_path / "new").exists(), kw
    r = CliRunner().invoke(main, ["vectors", "--scheme", "bf16", "--out", str(out)])
    assert r.exit_code == 2 and not (tmp_path / "new").exists()


def test_manifest_is_strict_json_without_nan(tmp_path):
    write_vectors("nvfp4", tmp_path)
    text = (tmp_path / "manifest.json").read_text()
    json.loads(text, parse_constant=lambda c: pytest.fail(f"bare {c} in the manifest"))
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_two_level_decoder_matches_dequantize_and_torchao_order_differs(tmp_path):
    from fpsim.oracle.vectors import decode_two_level

    rng = np.random.default_rng(3)
    x = (rng.standard_normal((64, 64)) * np.exp2(rng.integers(-20, 4, (64, 1)))).astype(np.float32)
    q = fpsim.quantize(x, "nvfp4")
    sch = fpsim.get_scheme("nvfp4")
    codes = fpsim.unpack_fp4(q.data)
    te = decode_two_level(codes, q.scales, np.full(64, q.amax, np.float32), sch)
    assert te.tobytes() == q.dequantize().tobytes()
    ta = decode_two_level(codes, q.scales, np.full(64, q.amax, np.float32), sch, "pts_s")
    assert not np.array_equal(ta, te) and np.allclose(ta, te, rtol=1e-6, atol=0)


def test_torchao_options_scale_clamp_and_dequantize_order(tmp_path):
    m = write_vectors("nvfp4", tmp_path / "v", scale_min=2.0**-6, dequantize_order="pts_s")
    assert m["scale_min"] == 2.0**-6 and m["dequantize_order"] == "pts_s" and "≥ 0.015625" in m["conventions"]
    _, cases = read_vectors(tmp_path / "v")
    v = cases["subnormal E4M3 scale"]
    e4m3 = fpsim.get_format("e4m3").decode_table()
    assert e4m3[v["scales"]].min() >= 2.0**-6  # fpsim's own vectors have a subnormal scale here
    _, plain = read_vectors(tmp_path / "w") if write_vectors("nvfp4", tmp_path / "w") else (None, None)
    assert e4m3[plain["subnormal E4M3 scale"]["scales"]].min() < 2.0**-6
    for kw in ({"scheme": "mxfp4", "scale_min": 0.1}, {"scheme": "mxfp4", "dequantize_order": "pts_s"},
               {"scheme": "nvfp4", "dequantize_order": "other"}):
        with pytest.raises(ValueError):
            write_vectors(out_dir=tmp_path / "x", **kw)
        assert not (tmp_path / "x").exists()


def test_torchao_vectors_are_torchaos_on_zero_negative_zero_and_tiny_tensors(tmp_path):
    """Issue 47 item 4: the vectors called torchao's were fpsim's scale order with a 2^-6 clamp, which writes scale
    0x08 for the zero tensor, −0 and a 2^-149 tensor, where real torchao 0.18 gives NaN scales (0xFF) and NaN values
    (tests/data/producers/torchao.npz, written by torchao).  That combination is now named for what it is
    (``pts_s``) and ``convention="torchao"`` gives torchao's bytes."""
    from fpsim.oracle.vectors import DEQUANTIZE_ORDERS

    assert "torchao" not in DEQUANTIZE_ORDERS and "te_cuda" in DEQUANTIZE_ORDERS
    m = write_vectors("nvfp4", tmp_path / "t", convention="torchao")
    assert m["convention"] == "torchao" and m["dequantize_order"] == "s_pts"
    _, cases = read_vectors(tmp_path / "t")
    with np.load(Path(__file__).parent / "data" / "producers" / "torchao.npz") as z:
        lib = {f"{k}.{f}": z[f"{k}.float32.{f}"] for k in ("zero", "negative_zero") for f in ("scales", "codes")}
        assert set(lib["zero.scales"].ravel()) == set(lib["negative_zero.scales"].ravel()) == {0xFF}
        assert z["tiny_subnormal.float32.scales"][0, 0] == 0xFF  # block amax 2^-149: fl(2^-149/6) / 0 = NaN
        want_code = int(lib["zero.codes"].ravel()[0])
    for name in ("zero tensor", "negative zero", "tiny tensor: S_enc capped at FLT_MAX"):
        v = cases[name]
        assert set(v["scales"].ravel()) == {0xFF} and np.isnan(v["decoded"]).all(), name
        assert set(v["codes"][:, :v["input"].shape[-1]].ravel()) == {want_code}, name
    plain = write_vectors("nvfp4", tmp_path / "p", scale_min=2.0**-6, dequantize_order="pts_s")
    assert "convention" not in plain and read_vectors(tmp_path / "p")[1]["zero tensor"]["scales"].ravel()[0] == 0x08
    with pytest.raises(ValueError, match="convention"):
        write_vectors("nvfp4", tmp_path / "x", convention="torchao", scale_min=2.0**-6)
    with pytest.raises(ValueError):
        write_vectors("mxfp4", tmp_path / "y", convention="torchao")
