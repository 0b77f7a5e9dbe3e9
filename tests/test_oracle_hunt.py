"""fpsim.oracle.diff against kernels with one or two deliberate, realistic bugs: each candidate is built with
fpsim's own codecs plus the bug, and diff must name that cause (and no wrong one).  Each test failed before its fix:
pairs holding an element rule were scored only in the blocks whose scales they change; a second bug hidden by the
first (its own score near zero) was never paired; and under --rounding sr --seed a round-to-nearest or truncating
kernel was said to round stochastically with "other random bits"."""

from __future__ import annotations

import numpy as np
import pytest

import fpsim
from fpsim.oracle import diff
from fpsim.packing import pack_fp4, unpack_fp4

F32 = np.float32


def _x(rows=64, cols=256, seed=0):
    """Rows of random normals at several magnitudes, every other row of quarter-step grid values (ties)."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((rows, cols)) * np.exp2(rng.integers(-6, 6, (rows, 1)))).astype(F32)
    x[1::2] = (rng.integers(-24, 25, x[1::2].shape) * 0.25).astype(F32)
    x[0, 0] = 2688.0  # NVFP4: S_enc = 1, so that block scales that are powers of two give E2M1 ties
    return x


X = _x()


def _full(rep, *causes):
    """Every byte explained (by a pair naming ``causes``), no byte left "other", no cause outside ``causes``."""
    assert rep.explained_by, rep.format_table()
    top = rep.hypotheses[0]
    assert top["explains_every_byte"] and set(top["cause"].split(" + ")) == set(causes), rep.format_table()
    assert {p for c in rep.causes for p in c.split(" + ")} <= set(causes), rep.causes


@pytest.mark.parametrize("scheme", ["mxfp4", "mxfp8_e4m3"])
@pytest.mark.parametrize("rounding,cause", [("rtz", "rounding mode"), ("rna", "tie rounding")])
def test_scale_rule_and_element_rounding_at_once(scheme, rounding, cause):
    """floor E8M0 scales and truncated (or ties-away) elements: the pair changes codes in every block, not only in
    the blocks whose scale byte it changes (before: the pair explained ~1/3 of the bytes; the rest "other" or a
    lone "tie rounding")."""
    q = fpsim.quantize(X, scheme, scale_rule="floor", rounding=rounding)
    rep = diff(q.data, q.scales, X, scheme)
    assert rep.n_scale_mismatches > 0 and rep.n_code_mismatches > 1000
    _full(rep, "MX scale rule", cause)
    assert any(n.startswith("candidate = floor rule") for n in rep.explained_by[0].split("; and "))


def test_tile_shape_and_truncation_at_once():
    q = fpsim.quantize(X, "nvfp4", block=(16, 16), rounding="rtz")
    rep = diff(q.data, q.scales, X, "nvfp4", candidate_amax=q.amax)
    _full(rep, "block shape", "rounding mode")


def test_a_second_bug_hidden_by_the_first_is_paired():
    """16×16 tiles with ties rounded away from zero: on fpsim's 1×16 scales the tie rule alone explains 2 bytes and
    breaks 186, so it never made the pairs' shortlist, and diff named a scale clamp (a coincidence of the data)
    as the cause of 4764 bytes."""
    q = fpsim.quantize(X, "nvfp4", block=(16, 16), rounding="rna")
    rep = diff(q.data, q.scales, X, "nvfp4", candidate_amax=q.amax)
    _full(rep, "block shape", "tie rounding")
    assert "scale clamp" not in rep.causes and "other" not in rep.causes


@pytest.mark.parametrize("scheme", ["nvfp4", "mxfp8_e4m3", "fp8_block128"])
@pytest.mark.parametrize("rounding", ["rne", "rtz"])
def test_a_deterministic_kernel_under_a_seed_is_not_other_random_bits(scheme, rounding):
    """A kernel asked for stochastic rounding that rounds to nearest (or truncates): with --rounding sr --seed every
    differing code is the other neighbour of x·enc_b, and diff said "SR random bits" (another Philox stream), though
    its own bias test fails by 35 standard deviations."""
    x = np.random.default_rng(1).standard_normal((64, 256)).astype(F32)
    q = fpsim.quantize(x, scheme, rounding=rounding)
    amax = q.amax if scheme == "nvfp4" else None
    rep = diff(q.data, q.scales, x, scheme, candidate_amax=amax, rounding="sr", seed=11)
    assert rep.explained_by == [f"candidate = {rounding} ({fpsim.oracle.model.ROUNDINGS[rounding]}), "
                                "not stochastic rounding"], rep.format_table()
    assert rep.causes == {"rounding mode": rep.n_code_mismatches}
    assert not any("rounds stochastically, but" in f for f in rep.findings)
    # fpsim's own stochastic rounding with another seed is still "SR random bits"
    q = fpsim.quantize(x, scheme, rounding="sr", seed=12)
    rep = diff(q.data, q.scales, x, scheme, candidate_amax=amax, rounding="sr", seed=11)
    assert rep.causes == {"SR random bits": rep.n_code_mismatches} and not rep.explained_by


def test_biased_neighbours_under_a_seed_are_not_called_another_stream():
    """Round-to-nearest codes with a few others flipped to the other neighbour: no rounding mode makes them all,
    and the away-roundings fail the bias test, so diff must not claim a stochastic rounding with other bits."""
    x = np.random.default_rng(2).standard_normal((64, 256)).astype(F32)
    q = fpsim.quantize(x, "nvfp4")
    up = fpsim.quantize(x, "nvfp4", rounding="rup")
    codes = unpack_fp4(q.data)
    flip = np.flatnonzero(unpack_fp4(up.data).reshape(-1) != codes.reshape(-1))[::50]
    codes.reshape(-1)[flip] = unpack_fp4(up.data).reshape(-1)[flip]
    rep = diff(pack_fp4(codes), q.scales, x, "nvfp4", candidate_amax=q.amax, rounding="sr", seed=11)
    assert not rep.rounding_check.stochastic and "SR random bits" not in rep.causes, rep.causes
    assert any("not those of a stochastic rounding" in f for f in rep.findings), rep.findings


@pytest.mark.parametrize("scheme,made,width", [("nvfp4", (1, 32), 32), ("mxfp4", (1, 16), 16)])
def test_another_block_width_is_a_usage_error_that_names_the_width(scheme, made, width):
    """NVFP4 with 1×32 blocks (or MX with 1×16): the scale count cannot be compared; the one-line error says which
    block width the count fits instead of only that it is wrong."""
    x = np.random.default_rng(3).standard_normal((32, 64)).astype(F32)
    q = fpsim.quantize(x, fpsim.get_scheme(scheme).replace(block=made))
    with pytest.raises(ValueError, match=f"one per 1×{width} block: another block size"):
        diff(q.data, q.scales, x, scheme)
    assert diff(q.data, q.scales, x, fpsim.get_scheme(scheme).replace(block=made)).identical
