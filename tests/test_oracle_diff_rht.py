"""fpsim diff and the random Hadamard transform (SPEC §7): ``rht=True`` makes the RHT'd input the reference; a
candidate quantized from the RHT'd input (or not, when asked), with other signs, or with a second bug is named as
such, an unrelated many-code bug is not called RHT, and the diagnosis stays fast."""

from __future__ import annotations

import time

import numpy as np
import pytest
from click.testing import CliRunner

import fpsim
from fpsim.oracle import diff
from fpsim.schemes import get_scheme
from fpsim.transforms import rht
from fpsim_cli.main import main

F32 = np.float32


def _x(rows=64, cols=256, seed=0):
    return np.random.default_rng(seed).standard_normal((rows, cols)).astype(F32)


X = _x()


def _quantized(x, scheme="nvfp4"):
    q = fpsim.quantize(x, scheme)
    return q.data, q.scales, (q.amax if scheme == "nvfp4" else None)


def test_rht_option_makes_the_rht_input_the_reference():
    """rht=True: fpsim quantizes rht(x, 16, "recipe") along the quantized axis (BF16 in and out), as the recipe."""
    codes, scales, amax = _quantized(rht(X, 16, "recipe"))
    rep = diff(codes, scales, X, "nvfp4", candidate_amax=amax, rht=True)
    assert rep.identical, rep.format_table()
    with pytest.raises(ValueError, match="multiple of the Hadamard size"):
        diff(codes, scales, X[:, :40], "nvfp4", rht=True)


def test_candidate_quantized_from_the_rht_input_is_named():
    """The toggled reference (with and without the RHT) explains every byte, the amax included."""
    codes, scales, amax = _quantized(rht(X, 16, "recipe"))
    rep = diff(codes, scales, X, "nvfp4", candidate_amax=amax)
    assert rep.findings[0].startswith("random Hadamard transform:") and "SPEC §7" in rep.findings[0]
    assert rep.causes == {"random Hadamard transform": rep.n_code_mismatches + rep.n_scale_mismatches + 1}
    assert rep.explained_by and "rht(x)" in rep.explained_by[0]
    assert rep.code_mismatches[0]["cause"] == "random Hadamard transform"


def test_rht_asked_but_candidate_did_not_transform():
    codes, scales, amax = _quantized(X)
    rep = diff(codes, scales, X, "nvfp4", candidate_amax=amax, rht=True)
    assert "not rht(x) as asked" in rep.findings[0]
    assert set(rep.causes) == {"random Hadamard transform"}


@pytest.mark.parametrize("signs,asked", [(1234, False), ("none", True)])
def test_rht_with_other_signs_is_named(signs, asked):
    """Seeded random signs (or none) instead of the recipe's vector: the implied vector is recovered from the codes."""
    codes, scales, amax = _quantized(rht(X, 16, signs))
    rep = diff(codes, scales, X, "nvfp4", candidate_amax=amax, rht=asked)
    assert rep.findings[0].startswith("RHT with other signs:"), rep.findings
    assert set(rep.causes) == {"RHT with other signs"} and rep.explained_by, rep.causes


def test_rht_and_a_second_bug_are_both_named():
    """The RHT'd input truncated to E2M1 (rtz): the RHT bytes get its cause, the rest the rounding mode's."""
    xr = rht(X, 16, "recipe")
    q = fpsim.quantize(xr, get_scheme("nvfp4").replace(rounding="rtz"))  # the kernel: RHT'd input, truncation
    codes, scales = q.data, q.scales
    rep = diff(codes, scales, X, "nvfp4", candidate_amax=q.amax)
    assert rep.findings[0].startswith("random Hadamard transform:")
    assert rep.causes.get("random Hadamard transform", 0) > 0.5 * rep.n_code_mismatches
    assert rep.causes.get("rounding mode", 0) > 0 and "other" not in rep.causes, rep.causes
    assert rep.explained_by and "rht(x)" in rep.explained_by[0] and "rtz" in rep.explained_by[0].lower()


def test_unrelated_many_code_bug_is_not_called_rht():
    """30 % of the codes scrambled: the toggled reference fixes nothing, so no RHT finding."""
    codes, scales, amax = _quantized(X)
    rng = np.random.default_rng(1)
    hit = rng.random(codes.shape) < 0.4
    codes = codes.copy()
    codes[hit] = rng.integers(0, 256, int(hit.sum()))
    rep = diff(codes, scales, X, "nvfp4", candidate_amax=amax)
    assert not any("Hadamard" in f or "RHT" in f for f in rep.findings)
    assert "random Hadamard transform" not in rep.causes and "RHT with other signs" not in rep.causes


def test_cli_rht_flag(tmp_path):
    codes, scales, amax = _quantized(rht(X, 16, "recipe"))
    np.savez(tmp_path / "c.npz", codes=codes, scales=scales, amax=amax)
    np.save(tmp_path / "x.npy", X)
    args = ["diff", str(tmp_path / "c.npz"), "--input", str(tmp_path / "x.npy")]
    r = CliRunner().invoke(main, args + ["--rht"])
    assert r.exit_code == 0 and "IDENTICAL" in r.output, r.output
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 1 and "finding: random Hadamard transform" in r.output, r.output


def test_rht_diagnosis_stays_fast():
    """The toggled reference costs two quantizations at most: 512×512 NVFP4 in under 10 s."""
    x = _x(512, 512, 3)
    codes, scales, amax = _quantized(rht(x, 16, 99))
    t = time.perf_counter()
    rep = diff(codes, scales, x, "nvfp4", candidate_amax=amax)
    assert time.perf_counter() - t < 10 and "RHT with other signs" in rep.causes
