"""fpsim.oracle vectors: element-codec vectors, every MX rule, atomic output and refusals that leave nothing behind."""

from __future__ import annotations

import json

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
