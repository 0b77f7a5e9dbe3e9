"""`fpsim diff` / `fpsim vectors`: a mismatch of the tensor amax alone is named as such and an inferred amax is
refined; an internal error is exit 3, not bad input (exit 2); a scale rule is refused where it does nothing; every
oracle error has the one message prefix; a "best partial explanations" list is never empty."""

from __future__ import annotations

import importlib
import json

import numpy as np
import pytest
from click.testing import CliRunner

import fpsim
from fpsim.oracle import diff
from fpsim_cli.main import main

diff_module = importlib.import_module("fpsim.oracle.diff")


def _x():
    rng = np.random.default_rng(7)
    x = rng.standard_normal((16, 64)).astype(np.float32)
    x[3, 5] = 20.0
    return x


def _bytes(q):
    return np.asarray(q.data).reshape(16, -1).copy(), np.asarray(q.scales).reshape(16, -1).copy()


def _run(args):
    r = CliRunner().invoke(main, [str(a) for a in args])
    assert "Traceback" not in r.output, r.output
    return r


def _files(tmp_path, x, **candidate):
    np.savez(tmp_path / "x.npz", x=x)
    np.savez(tmp_path / "c.npz", **candidate)
    return ["diff", tmp_path / "c.npz", "--input", tmp_path / "x.npz"]


@pytest.mark.parametrize("factor", [2.0, np.nan], ids=["doubled", "nan"])
def test_amax_only_mismatch_names_tensor_amax(tmp_path, factor):
    """Codes and scales fpsim's, only the amax differs: no mismatching block to screen four-over-six on (was
    "slice step cannot be zero", exit 2); the amax mismatch gets a cause."""
    x = _x()
    q = fpsim.quantize(x, "nvfp4")
    codes, scales = _bytes(q)
    amax = np.float32(q.amax) * np.float32(factor)
    rep = diff(codes, scales, x, "nvfp4", candidate_amax=amax)
    assert not rep.identical and rep.causes == {"tensor amax": 1}, rep.causes
    base = _files(tmp_path, x, codes=codes, scales=scales, amax=amax)
    r = _run(base)
    assert r.exit_code == 1, r.output
    assert "likely causes (all mismatches): tensor amax ×1" in r.stdout and not r.stderr, r.output
    r = _run(base + ["--format", "json"])
    assert r.exit_code == 1 and json.loads(r.stdout)["causes"] == {"tensor amax": 1}, r.output


def test_inferred_tensor_amax_is_refined(tmp_path):
    """quantize(x, tensor_amax=40) stored without its amax: the inferred-amax hypothesis (64 explained, 1 broken)
    is refined into a full explanation, although hypotheses that explain nothing rank ahead of it (was "other ×64")."""
    x = _x()
    codes, scales = _bytes(fpsim.quantize(x, "nvfp4", tensor_amax=40.0))
    rep = diff(codes, scales, x, "nvfp4")
    assert rep.causes == {"tensor amax": 64}, rep.causes
    assert rep.explained_by and "tensor amax" in rep.explained_by[0], rep.explained_by
    r = _run(_files(tmp_path, x, codes=codes, scales=scales))
    assert r.exit_code == 1 and "explained by (every byte): candidate's bytes follow from a tensor amax" in r.stdout
    assert "tensor amax ×64" in r.stdout and "other" not in r.stdout, r.stdout


def _boom(*args, **kwargs):
    raise ValueError("an internal slip")


def test_internal_error_is_not_a_usage_error(tmp_path, monkeypatch):
    """A bug inside the diagnosis is one `error: internal error …` line and exit 3 (not diff's 1, "different"),
    not the bad-input exit 2 (was `Error: slice step cannot be zero`, exit 2)."""
    x = _x()
    codes, scales = _bytes(fpsim.quantize(x, "nvfp4"))
    codes[5, 3] ^= 0x04
    monkeypatch.setattr(diff_module, "_diagnose", _boom)
    r = _run(_files(tmp_path, x, codes=codes, scales=scales))
    assert r.exit_code == 3 and not r.stdout, r.output
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: internal error") and "an internal slip" in lines[0]


def test_internal_error_api(monkeypatch):
    """The API raises DiagnosisError (a RuntimeError, not the ValueError of a bad input), chained to the bug."""
    from fpsim.oracle import DiagnosisError

    x = _x()
    codes, scales = _bytes(fpsim.quantize(x, "nvfp4"))
    codes[5, 3] ^= 0x04
    monkeypatch.setattr(diff_module, "_diagnose", _boom)
    with pytest.raises(DiagnosisError) as e:
        diff(codes, scales, x, "nvfp4")
    assert not isinstance(e.value, ValueError) and isinstance(e.value.__cause__, ValueError)
    assert "an internal slip" in str(e.value)


def test_bad_input_still_exit_2(tmp_path):
    x = _x()
    codes, scales = _bytes(fpsim.quantize(x, "nvfp4"))
    r = _run(_files(tmp_path, x, codes=codes[:, :5], scales=scales))
    assert r.exit_code == 2 and r.stderr.startswith("error: candidate codes have") and "internal" not in r.stderr


@pytest.mark.parametrize("scheme", ["nvfp4", "fp8_block128"])
def test_scale_rule_refused_without_e8m0_scales(tmp_path, scheme):
    """--scale-rule changes only E8M0 scales: refused (exit 2, one line, nothing written) like --scale-min on MX,
    instead of a silent `nvfp4+floor: IDENTICAL` and vectors labelled floor but byte-identical."""
    x = _x()
    codes, scales = _bytes(fpsim.quantize(x, "nvfp4"))
    r = _run(_files(tmp_path, x, codes=codes, scales=scales) + ["--scheme", scheme, "--scale-rule", "floor"])
    assert r.exit_code == 2 and not r.stdout, r.output
    assert r.stderr.strip().splitlines() == [f"error: --scale-rule applies to MX (E8M0-scaled) schemes, not {scheme}"]
    out = tmp_path / "new" / "v"
    for rule in ("floor", "all"):
        r = _run(["vectors", "--scheme", scheme, "--scale-rule", rule, "--out", out])
        assert r.exit_code == 2 and len(r.stderr.strip().splitlines()) == 1 and "E8M0" in r.stderr, r.output
    assert not (tmp_path / "new").exists()
    r = _run(["vectors", "--scheme", "mxfp4", "--scale-rule", "floor", "--out", out])
    assert r.exit_code == 0, r.output


@pytest.mark.parametrize("args", [["diff", "nothing.npz", "--input", "nothing.npz"],
                                  ["explain", "1.5"], ["vectors", "--scheme", "bf16", "--out", "v"]])
def test_oracle_errors_use_the_one_prefix(tmp_path, monkeypatch, args):
    """docs/analyze.md and cli/main.py: every error is one line starting `error:` (the oracle commands wrote
    `Error:`)."""
    monkeypatch.chdir(tmp_path)
    r = _run(args)
    assert r.exit_code == 2 and r.stderr.startswith("error: ") and "Error:" not in r.output, r.output


def test_no_empty_partial_explanation_list(tmp_path):
    """One flipped element code that no hypothesis explains: no header followed by an empty list."""
    x = _x()
    q = fpsim.quantize(x, "nvfp4")
    codes, scales = _bytes(q)
    codes[5, 3] ^= 0x04
    r = _run(_files(tmp_path, x, codes=codes, scales=scales, amax=np.float32(q.amax)))
    assert r.exit_code == 1, r.output
    assert "best partial explanations" not in r.stdout, r.stdout
    assert "no hypothesis explains any of the differing bytes" in r.stdout, r.stdout
