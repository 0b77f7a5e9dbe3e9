"""`fpsim diff` and `fpsim vectors` scheme options (issue 16 item 10): a candidate made with an option is
identical under that option and diagnosed without it; vectors honour the options and refuse cleanly."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

import fpsim
from fpsim.oracle import read_vectors
from fpsim.oracle.model import Convention, TensorView, model_bytes
from fpsim_cli.main import main


def _x(rows=32, cols=64, seed=0, nan=False):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((rows, cols)) * np.exp2(rng.integers(-14, 4, (rows, 1)))).astype(np.float32)
    if nan:
        x[3, 5] = np.nan
    return x


def _run(args):
    r = CliRunner().invoke(main, args)
    assert "Traceback" not in r.output, r.output
    return r


CASES = [  # (scheme, quantize kwargs / scheme changes for the candidate, CLI option, cause without the option)
    ("mxfp4", {"scale_rule": "floor"}, ["--scale-rule", "floor"], "MX scale rule"),
    ("nvfp4", {"block": (16, 16)}, ["--block", "16x16"], "block shape"),
    ("nvfp4", {"scheme": {"tensor_scale": False}}, ["--no-tensor-scale"], "tensor scale"),
    ("nvfp4", {"nan_amax": "ignore"}, ["--nan-amax", "ignore"], "NaN handling"),
    ("nvfp4", {"scheme": {"four_over_six": True}}, ["--four-over-six", "mse"], "four-over-six"),
    ("nvfp4", {"scheme": {"per_row_scale": True}}, ["--per-row-scale"], "per-row scale"),
]


@pytest.mark.parametrize("scheme, kw, opt, cause", CASES, ids=[c[2][0] for c in CASES])
def test_diff_options(tmp_path, scheme, kw, opt, cause):
    x = _x(nan="nan_amax" in kw)
    kw = dict(kw)
    sch = fpsim.get_scheme(scheme)
    if "scheme" in kw:
        sch = sch.replace(**kw.pop("scheme"))
    q = fpsim.quantize(x, sch, **kw)
    np.savez(tmp_path / "x.npz", x=x)
    np.savez(tmp_path / "c.npz", codes=q.data, scales=q.scales)
    base = ["diff", str(tmp_path / "c.npz"), "--input", str(tmp_path / "x.npz"), "--scheme", scheme]
    r = _run(base + opt)
    assert r.exit_code == 0 and "IDENTICAL" in r.stdout, r.output
    r = _run(base + ["--format", "json"])
    assert r.exit_code == 1
    d = json.loads(r.stdout)
    assert d["hypotheses"][0]["cause"] == cause and d["hypotheses"][0]["explains_every_byte"], d["hypotheses"][:2]


def test_diff_scale_min_is_torchao_clamp(tmp_path):
    x = _x()
    x[0, :16] *= np.float32(2.0**-12)  # a block far below the tensor amax: a subnormal E4M3 scale
    sch = fpsim.get_scheme("nvfp4")
    c, s = model_bytes(TensorView(x, (1, 16)), sch, Convention(scale_min=2.0**-6))
    np.savez(tmp_path / "x.npz", x=x)
    np.savez(tmp_path / "c.npz", codes=fpsim.pack_fp4(c), scales=s)
    base = ["diff", str(tmp_path / "c.npz"), "--input", str(tmp_path / "x.npz")]
    assert _run(base + ["--scale-min", "2^-6"]).exit_code == 0
    r = _run(base)
    assert r.exit_code == 1 and "scale clamp" in r.stdout
    r = _run(base + ["--scale-min", "tiny"])
    assert r.exit_code == 2 and "--scale-min 'tiny'" in r.stderr
    r = _run(base + ["--scale-min", "2^-6", "--scheme", "mxfp4"])
    assert r.exit_code == 2 and "two-level" in r.stderr


def test_diff_bad_scheme_options(tmp_path):
    x = _x()
    q = fpsim.quantize(x, "nvfp4")
    np.savez(tmp_path / "x.npz", x=x)
    np.savez(tmp_path / "c.npz", codes=q.data, scales=q.scales)
    base = ["diff", str(tmp_path / "c.npz"), "--input", str(tmp_path / "x.npz")]
    for opt, msg in ((["--block", "16by16"], "use RxC"), (["--scale-rule", "round"], "unknown scale rule"),
                     (["--four-over-six", "mse", "--scheme", "mxfp4"], "four_over_six")):
        r = _run(base + opt)
        assert r.exit_code == 2 and msg in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.output


def test_vectors_options(tmp_path):
    r = _run(["vectors", "--element", "e4m3", "--out", str(tmp_path / "e")])
    assert r.exit_code == 0 and "element format float8_e4m3fn" in r.stdout
    m, cases = read_vectors(tmp_path / "e")
    assert cases["decode every code"]["codes"].size == 256
    r = _run(["vectors", "--scheme", "mxfp8_e4m3", "--scale-rule", "all", "--out", str(tmp_path / "m")])
    assert r.exit_code == 0
    m, _ = read_vectors(tmp_path / "m")
    assert {c["kwargs"]["scale_rule"] for c in m["cases"]} == {"floor", "ceil", "even", "rceil"}
    r = _run(["vectors", "--block", "16x16", "--no-tensor-scale", "--out", str(tmp_path / "b")])
    assert r.exit_code == 0
    m, cases = read_vectors(tmp_path / "b")
    assert m["scheme"]["block"] == [16, 16] and m["scheme"]["tensor_scale"] is False
    v = cases["random normal with outliers"]
    q = fpsim.quantize(v["input"], fpsim.get_scheme("nvfp4").replace(block=(16, 16), tensor_scale=False))
    assert np.array_equal(v["scales"], q.scales) and v["decoded"].tobytes() == q.dequantize().tobytes()
    r = _run(["vectors", "--four-over-six", "mae", "--nan-amax", "ignore", "--out", str(tmp_path / "f")])
    assert r.exit_code == 0
    m, cases = read_vectors(tmp_path / "f")
    assert m["scheme"]["four_over_six"] and all(c["kwargs"].get("nan_amax") == "ignore" for c in m["cases"])
    r = _run(["vectors", "--scale-min", "2**-6", "--dequantize-order", "pts_s", "--out", str(tmp_path / "t")])
    assert r.exit_code == 0
    m, _ = read_vectors(tmp_path / "t")
    assert m["scale_min"] == 2.0**-6 and m["dequantize_order"] == "pts_s"


@pytest.mark.parametrize("args", [["--element", "e2m1", "--scale-rule", "floor"], ["--scheme", "bf16"],
                                  ["--scheme", "nvfp4", "--scale-rule", "all"], ["--element", "e9m9"],
                                  ["--scheme", "mxfp4", "--dequantize-order", "pts_s"]])
def test_vectors_refusals_leave_nothing(tmp_path, args):
    out = tmp_path / "new" / "v"
    r = _run(["vectors", *args, "--out", str(out)])
    assert r.exit_code == 2 and len(r.stderr.strip().splitlines()) == 1, r.output
    assert not (tmp_path / "new").exists()
