"""`fpsim diff` on stochastically rounded candidates: fpsim's bits for a seed are the reference; another stream
is named as such (every differing code the other neighbour of x·enc_b); another K is found; without a seed every
code is checked against the neighbours and the away-roundings are tested for bias by stratum, which a
round-to-nearest or directed candidate fails; round-to-nearest comparisons name stochastic rounding as the cause
where it is one; and no stochastic-rounding claim is made from too few blocks to judge."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

import fpsim
from fpsim.oracle import diff
from fpsim.oracle.rounding import Z_LIMIT, neighbour_check
from fpsim.schemes import get_scheme
from fpsim_cli.main import main

F32 = np.float32


def _x(rows=64, cols=256, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_t(3, (rows, cols)) * np.exp2(rng.integers(-6, 6, (rows, 1)))).astype(np.float32)


X = _x()


def _q(scheme="nvfp4", **kw):
    q = fpsim.quantize(X, scheme, **kw)
    return q.data, q.scales, (np.float32(q.amax) if scheme == "nvfp4" else None)


@pytest.mark.parametrize("scheme", ["nvfp4", "mxfp4", "mxfp8_e4m3"])
def test_fpsims_own_stochastic_rounding_is_identical_under_its_seed_and_consistent_without(scheme):
    codes, scales, amax = _q(scheme, rounding="sr", seed=11)
    rep = diff(codes, scales, X, scheme, candidate_amax=amax, rounding="sr", seed=11)
    assert rep.identical and rep.n_code_mismatches == 0 and rep.rounding == "sr" and rep.seed == 11
    rep = diff(codes, scales, X, scheme, candidate_amax=amax, rounding="sr")
    c = rep.rounding_check
    assert rep.identical and c.off_grid == 0 and c.inexact > 1000 and abs(c.z) <= Z_LIMIT, c.summary()
    assert "CONSISTENT with stochastic rounding" in rep.format_table().splitlines()[0]


def test_another_random_stream_is_named_and_every_code_is_a_neighbour():
    codes, scales, amax = _q(rounding="sr", seed=12)
    rep = diff(codes, scales, X, "nvfp4", candidate_amax=amax, rounding="sr", seed=11)
    assert not rep.identical and rep.n_code_mismatches > 1000 and rep.n_scale_mismatches == 0
    assert rep.causes == {"SR random bits": rep.n_code_mismatches}
    assert any("not with fpsim's random bits for seed 11 and K = 8" in f for f in rep.findings), rep.findings
    assert rep.rounding_check.off_grid == 0 and rep.rounding_check.stochastic


def test_another_k_is_found():
    codes, scales, amax = _q(rounding="sr", seed=11, k=4)
    rep = diff(codes, scales, X, "nvfp4", candidate_amax=amax, rounding="sr", seed=11)
    assert rep.explained_by == ["candidate = fpsim's stochastic rounding with K = 4 random bits per element "
                                "(here K = 8)"]
    rep = diff(codes, scales, X, "nvfp4", candidate_amax=amax, rounding="sr", seed=11, sr_bits=4)
    assert rep.identical


@pytest.mark.parametrize("rounding,stratum", [("rne", "[0.25, 0.5)"), ("rtz", "[0.75, 1)"), ("rup", None),
                                              ("rdown", None)])
def test_without_a_seed_deterministic_roundings_fail_the_bias_test(rounding, stratum):
    """Every code of a round-to-nearest or directed candidate is a neighbour, so only the strata catch them."""
    codes, scales, amax = _q(rounding=rounding)
    rep = diff(codes, scales, X, "nvfp4", candidate_amax=amax, rounding="sr")
    c = rep.rounding_check
    assert c.off_grid == 0 and rep.n_code_mismatches == 0 and abs(c.z) > 5 * Z_LIMIT, c.summary()
    assert not rep.identical and "INCONSISTENT" in rep.format_table().splitlines()[0]
    if stratum is not None:
        assert c.worst["p"] == [float(v) for v in stratum.strip("[)").split(", ")]


def test_a_code_no_rounding_gives_is_a_mismatch_without_a_seed():
    codes, scales, amax = _q(rounding="sr", seed=3)
    codes = codes.copy()
    un = fpsim.get_scheme("nvfp4")
    from fpsim.packing import pack_fp4, unpack_fp4

    c = unpack_fp4(codes).reshape(X.shape)
    y_big = np.argmax(np.abs(X[5]))  # the block maximum: its code is 6 (0x7) or −6; 0x1 is off the grid there
    c[5, y_big] = (c[5, y_big] & 0x8) | 0x1
    rep = diff(pack_fp4(c.reshape(-1)).reshape(codes.shape), scales, X, un, candidate_amax=amax, rounding="sr")
    assert rep.n_code_mismatches == 1 and rep.causes == {"not a rounding of x·enc_b": 1}
    assert rep.code_mismatches[0]["index"] == [5, int(y_big)] and not rep.identical


def test_round_to_nearest_comparison_names_stochastic_rounding():
    codes, scales, amax = _q(rounding="sr", seed=5)
    rep = diff(codes, scales, X, "nvfp4", candidate_amax=amax)
    assert not rep.identical and rep.rounding == "rne"
    assert rep.causes == {"stochastic rounding": rep.n_code_mismatches}
    assert any(f.startswith("stochastic rounding: fpsim compared round-to-nearest") for f in rep.findings)
    # a directed rounding stays the hypothesis that explains it, not stochastic rounding
    codes, scales, amax = _q(rounding="rtz")
    rep = diff(codes, scales, X, "nvfp4", candidate_amax=amax)
    assert rep.explained_by and "stochastic rounding" not in rep.causes


def test_the_k_bit_expectation_by_hand():
    """E2M1, y = fl32(0.3): between 0 and 0.5, p = 0.6000000238; K = 8 goes away for r ≥ ⌈(0.5 − y)·512⌉ = 103,
    153 of 256 values."""
    el = fpsim.get_scheme("nvfp4").element
    y = np.array([[0.3, -0.3, 0.5, 7.0]], np.float32)  # 0.5 exact, 7 saturates: neither is inexact
    cand = np.array([[0x1, 0x8, 0x1, 0x7]], np.uint8)  # away, toward zero (−0), exact, saturated
    check, fin, on = neighbour_check(y, el, np.ones(y.shape, bool), cand, cand, 8)
    assert check.inexact == 2 and check.away == 1 and check.off_grid == 0 and on.all() and fin.all()
    p = (np.float64(np.float32(0.3)) - 0.0) / 0.5
    assert check.expected_away == (2 * 153 / 256, 2 * p)


def test_the_cli_takes_the_rounding_and_its_seed(tmp_path):
    codes, scales, amax = _q(rounding="sr", seed=7)
    np.savez(tmp_path / "in.npz", x=X)
    np.savez(tmp_path / "c.npz", codes=codes, scales=scales, amax=amax)
    base = ["diff", str(tmp_path / "c.npz"), "--input", str(tmp_path / "in.npz")]
    run = lambda extra: CliRunner().invoke(main, base + extra)  # noqa: E731
    assert run(["--rounding", "sr", "--seed", "7"]).exit_code == 0
    r = run(["--rounding", "sr", "--seed", "8"])
    assert r.exit_code == 1 and "SR random bits" in r.output
    r = run(["--rounding", "sr", "--format", "json"])
    d = json.loads(r.output)
    assert r.exit_code == 0 and d["rounding"] == "sr" and d["seed"] is None and d["rounding_check"]["stochastic"]
    r = run(["--seed", "7"])
    assert r.exit_code == 2 and "--rounding sr" in r.output and "Traceback" not in r.output
    assert run(["--rounding", "sr", "--sr-bits", "0"]).exit_code == 2


# --- no stochastic-rounding claim from too few blocks ----------------------------------------------------------


def _normal(rows, cols, seed):
    return np.random.default_rng(seed).standard_normal((rows, cols)).astype(F32)


def _scales_one_up(x):
    """A kernel whose every E4M3 block scale is one step above fpsim's (a bug diff does not model); its codes
    follow from that scale with fpsim's element rule."""
    amax = F32(np.abs(x).max())
    s_enc = F32(2688) / amax
    s_dec = F32(1) / s_enc
    vmax = np.abs(x).reshape(x.shape[0], -1, 16).max(axis=2)
    sb = fpsim.encode(np.minimum((vmax * (s_enc * (F32(1) / F32(6)))).astype(F32), F32(448)), "e4m3")
    sb = np.minimum(sb.astype(np.int32) + 1, 0x7E).astype(np.uint8)  # the bug
    with np.errstate(all="ignore"):
        enc = (F32(1) / (fpsim.decode(sb, "e4m3") * s_dec)).astype(F32)
        y = (x.reshape(x.shape[0], -1, 16) * enc[..., None]).astype(F32).reshape(x.shape)
    return fpsim.pack_fp4(fpsim.encode(y, "e2m1")), sb, amax


@pytest.mark.parametrize("rows,seed", [(64, 0), (256, 1)])
def test_scales_one_step_up_is_not_called_stochastic_rounding(rows, seed):
    """No "stochastic rounding" claim from the 1–4 blocks whose scales still match (every code there fpsim's):
    too few blocks to judge."""
    x = _normal(rows, 256, seed)
    codes, scales, amax = _scales_one_up(x)
    rep = diff(codes, scales, x, "nvfp4", candidate_amax=amax)
    assert rep.n_scale_mismatches > 0.99 * rep.n_blocks
    assert "stochastic rounding" not in rep.causes, rep.causes
    assert not any(f.startswith("stochastic rounding") for f in rep.findings), rep.findings
    assert any("too few blocks to judge" in f for f in rep.findings), rep.findings
    assert rep.rounding_check is not None and not rep.rounding_check.judged


def test_a_large_enough_sample_still_names_stochastic_rounding():
    """The power check does not silence a real stochastic-rounding candidate compared under RNE."""
    x = _normal(64, 256, 5)
    q = fpsim.quantize(x, get_scheme("nvfp4").replace(rounding="sr"), seed=3)
    rep = diff(q.data, q.scales, x, "nvfp4", candidate_amax=q.amax)
    assert rep.rounding_check.judged and rep.causes == {"stochastic rounding": rep.n_code_mismatches}, rep.causes
