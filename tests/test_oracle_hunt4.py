"""fpsim diff against three kernel bugs it used to call "other" (test_oracle_hunt*.py's pattern: the buggy kernel is
written here from the spec, its bytes diffed, and the diagnosis asserted with the exact share it explains).

1. Blocks formed down the columns instead of along the rows (the kernel quantized x.T), stored in x's orientation or
   in x.T's layout: before, "other" for every byte, or a ValueError where the sizes were x.T's.
2. Codes or scales written at an offset other than one element / byte / row: before, "other".
3. The random Hadamard transform together with a layout error (nibble order, transposed scales): before, each check
   assumed the other part right, and the bytes were "other" (or the scales were)."""

from __future__ import annotations

import numpy as np
import pytest
from click.testing import CliRunner

import fpsim
from fpsim.oracle import diff
from fpsim.packing import pack_fp4, unpack_fp4
from fpsim.transforms import rht, sign_vector
from fpsim_cli.main import main

F32 = np.float32
FLT_MAX = F32(np.finfo(np.float32).max)
SHAPES = [(64, 256), (50, 200), (33, 70)]  # the last two: rows and columns not multiples of 16 (or 32)


def _x(shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(F32)


def _total(rep):
    return rep.n_code_mismatches + rep.n_scale_mismatches + (rep.amax_match is False)


# --- 1. quantized along the wrong axis --------------------------------------------------------------------------


def _nvfp4_down_columns(x):
    """A hand-written NVFP4 kernel (SPEC §4, TE's FP32 order) whose 16-element blocks run down the columns of x:
    codes [R, C] in x's orientation, scales [⌈R/16⌉, C], the tensor amax."""
    R, C = x.shape
    nbr = -(-R // 16)
    P = np.zeros((nbr * 16, C), F32)
    P[:R] = x
    amax = F32(np.abs(x).max())
    s_enc = np.minimum(F32(2688) / amax, FLT_MAX)
    s_dec = F32(1) / s_enc
    vmax = np.abs(P).reshape(nbr, 16, C).max(axis=1)  # the bug: a block is 16 rows of one column
    sb = fpsim.encode(np.minimum((vmax * (s_enc * (F32(1) / F32(6)))).astype(F32), F32(448)), "e4m3")
    with np.errstate(all="ignore"):
        enc = np.minimum(F32(1) / (fpsim.decode(sb, "e4m3") * s_dec), FLT_MAX).astype(F32)
        y = (P.reshape(nbr, 16, C) * enc[:, None, :]).astype(F32).reshape(nbr * 16, C)[:R]
    return fpsim.encode(y, "e2m1"), sb, amax


def _stored(codes, scales, orientation, four_bit=True):
    """x-oriented codes [R, C] / scales [nbr, C] written in x's orientation, or in x.T's layout ([C, R], [C, nbr])."""
    if orientation == "transpose":
        codes, scales = np.ascontiguousarray(codes.T), np.ascontiguousarray(scales.T)
    return (pack_fp4(codes) if four_bit else codes), scales


@pytest.mark.parametrize("orientation", ["view", "transpose"])
@pytest.mark.parametrize("shape", SHAPES)
def test_nvfp4_blocks_down_the_columns(shape, orientation):
    x = _x(shape)
    c, s, amax = _nvfp4_down_columns(x)
    rep = diff(*_stored(c, s, orientation), x, "nvfp4", candidate_amax=amax)
    assert rep.n_code_mismatches > 0.3 * x.size and rep.n_scale_mismatches > 0
    # every byte: the kernel is fpsim's rules on x.T exactly
    assert rep.causes == {"quantized along the wrong axis": _total(rep)}, rep.causes
    where = "the view's orientation" if orientation == "view" else "the transpose's layout"
    assert rep.findings[0].startswith("quantized along the wrong axis:") and where in rep.findings[0]
    assert f"reproduces {_total(rep)} of the {_total(rep)} differing bytes" in rep.findings[0]


@pytest.mark.parametrize("orientation", ["view", "transpose"])
@pytest.mark.parametrize("scheme", ["mxfp4", "mxfp8_e4m3"])
@pytest.mark.parametrize("shape", SHAPES)
def test_mx_blocks_down_the_columns(shape, scheme, orientation):
    """fpsim's MX rules applied along axis 0 (blocks of 32 down the columns); 13–18 % of the codes differ."""
    x = _x(shape, 1)
    q = fpsim.quantize(x, scheme, axis=0)  # codes [C, R·] with the quantized axis last: x.T's layout
    four = fpsim.get_scheme(scheme).element.bits == 4
    cT = (unpack_fp4(q.data) if four else q.data)[:, : shape[0]]
    rep = diff(*_stored(np.ascontiguousarray(cT.T), np.ascontiguousarray(q.scales.T), orientation, four), x, scheme)
    assert rep.n_code_mismatches > 0.05 * x.size
    assert rep.causes == {"quantized along the wrong axis": _total(rep)}, rep.causes


@pytest.mark.parametrize("shape", [(64, 256), (40, 50)])
def test_square_tiles_the_axis_changes_no_value(shape):
    """16×16 tiles: a tile's amax is the same in x and x.T, so in x's orientation the bytes are fpsim's (IDENTICAL
    is right); stored in x.T's layout they differ, codes and scales, and are named."""
    sch = fpsim.get_scheme("nvfp4").replace(block=(16, 16))
    x = _x(shape, 2)
    R = shape[0]
    qT = fpsim.quantize(np.ascontiguousarray(x.T), sch)
    cT = unpack_fp4(qT.data)[:, :R]
    q = fpsim.quantize(x, sch)
    assert diff(pack_fp4(np.ascontiguousarray(cT.T)), q.scales, x, sch, candidate_amax=qT.amax).identical
    rep = diff(pack_fp4(cT), qT.scales, x, sch, candidate_amax=qT.amax)
    assert rep.n_scale_mismatches > 0 and rep.causes == {"quantized along the wrong axis": _total(rep)}, rep.causes
    assert "changes no value" in rep.findings[0]


@pytest.mark.parametrize("shape", [(64, 256), (40, 50)])
def test_square_tiles_with_stochastic_rounding_still_show_the_axis(shape):
    """Under stochastic rounding with a seed the transpose renumbers the blocks and elements that draw the random
    bits: the scales are fpsim's but codes differ (before: "SR random bits")."""
    sch = fpsim.get_scheme("nvfp4").replace(block=(16, 16))
    x = _x(shape, 3)
    qT = fpsim.quantize(np.ascontiguousarray(x.T), sch.replace(rounding="sr"), seed=5)
    q = fpsim.quantize(x, sch.replace(rounding="sr"), seed=5)
    cand = pack_fp4(np.ascontiguousarray(unpack_fp4(qT.data)[:, : shape[0]].T))
    rep = diff(cand, q.scales, x, sch, candidate_amax=qT.amax, rounding="sr", seed=5)
    assert rep.n_code_mismatches > 0 and rep.n_scale_mismatches == 0
    assert rep.causes == {"quantized along the wrong axis": rep.n_code_mismatches}, rep.causes


def test_wrong_axis_sizes_are_not_a_usage_error_in_the_cli(tmp_path):
    """200×100: x.T's 100×13 scales are not fpsim's 200×7 — before, exit 2 ("candidate scales have 1300 values")."""
    x = _x((200, 100))
    c, s, amax = _nvfp4_down_columns(x)
    codes, scales = _stored(c, s, "transpose")
    np.savez(tmp_path / "c.npz", codes=codes, scales=scales, amax=amax)
    np.save(tmp_path / "x.npy", x)
    r = CliRunner().invoke(main, ["diff", str(tmp_path / "c.npz"), "--input", str(tmp_path / "x.npy")])
    assert r.exit_code == 1 and "finding: quantized along the wrong axis" in r.output, r.output


def test_correct_bytes_and_unrelated_sizes_are_unchanged():
    x = _x((50, 200))
    q = fpsim.quantize(x, "nvfp4")
    assert diff(q.data, q.scales, x, "nvfp4", candidate_amax=q.amax).identical
    with pytest.raises(ValueError, match="candidate scales have"):
        diff(q.data, q.scales.reshape(-1)[:-3], x, "nvfp4")


# --- 2. other offsets -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("shift", [3, -5, 16, -37, 64])  # up to one row of blocks (80 codes at 33×70)
@pytest.mark.parametrize("shape", SHAPES)
def test_codes_shifted_by_another_offset(shape, shift):
    """The code stream (fpsim's rows, padded to whole blocks) written ``shift`` codes late: the offset is found by
    correlation and named; the codes shifted out of the stream are credited to it, so it explains every byte."""
    x = _x(shape, 4)
    q = fpsim.quantize(x, "nvfp4")
    u = unpack_fp4(q.data)
    cand = pack_fp4(np.roll(u.reshape(-1), shift).reshape(u.shape))
    rep = diff(cand, q.scales, x, "nvfp4", candidate_amax=q.amax)
    assert rep.n_code_mismatches > 0.3 * x.size
    assert rep.causes == {"shifted codes": rep.n_code_mismatches}, rep.causes
    assert f"code i holds fpsim's code i{'−' if shift > 0 else '+'}{abs(shift)} " in rep.findings[0], rep.findings


def test_fp8_codes_shifted_by_seven_bytes():
    x = _x((50, 200), 5)
    q = fpsim.quantize(x, "mxfp8_e4m3")
    rep = diff(np.roll(q.data.reshape(-1), -7).reshape(q.data.shape), q.scales, x, "mxfp8_e4m3")
    assert rep.causes == {"shifted codes": rep.n_code_mismatches} and "i+7 " in rep.findings[0], rep.findings


@pytest.mark.parametrize("shift", [3, -5])
@pytest.mark.parametrize("shape", SHAPES)
def test_scales_shifted_by_another_offset(shape, shift):
    x = _x(shape, 6)
    q = fpsim.quantize(x, "nvfp4")
    s = np.roll(q.scales.reshape(-1), shift).reshape(q.scales.shape)
    rep = diff(q.data, s, x, "nvfp4", candidate_amax=q.amax)
    assert rep.causes == {"shifted scales": rep.n_scale_mismatches}, rep.causes
    assert f"shifted by {abs(shift)} bytes" in rep.findings[0]


def test_scrambled_bytes_get_no_offset():
    """40 % of the bytes random: no offset agrees with a sampled majority, so no shift is claimed."""
    x = _x((64, 256), 7)
    q = fpsim.quantize(x, "nvfp4")
    rng = np.random.default_rng(1)
    c = q.data.copy()
    hit = rng.random(c.shape) < 0.4
    c[hit] = rng.integers(0, 256, int(hit.sum()))
    rep = diff(c, q.scales, x, "nvfp4", candidate_amax=q.amax)
    assert not rep.findings and set(rep.causes) == {"other"}, (rep.findings, rep.causes)


# --- 3. the RHT and a layout error ------------------------------------------------------------------------------


def _rht_kernel(x, signs="recipe"):
    q = fpsim.quantize(rht(x, 16, signs), "nvfp4")
    return unpack_fp4(q.data), q.scales, q.amax


@pytest.mark.parametrize("shape", [(64, 256), (50, 160), (33, 96)])
def test_rht_and_swapped_nibbles(shape):
    """The layout gets the codes it moved (the two nibbles of the byte differ), the transform the rest (codes whose
    pair holds equal codes, every scale byte, the amax)."""
    x = _x(shape, 8)
    c, s, amax = _rht_kernel(x)
    ours = unpack_fp4(fpsim.quantize(x, "nvfp4").data)
    swapped = c.reshape(c.shape[0], -1, 2)[:, :, ::-1].reshape(c.shape)  # element 2j in the high nibble
    rep = diff(pack_fp4(swapped), s, x, "nvfp4", candidate_amax=amax)
    bad = swapped != ours
    moved = int((bad & (swapped != c)).sum())
    assert rep.causes == {"nibble packing order": moved, "random Hadamard transform": _total(rep) - moved}, rep.causes
    assert rep.findings[0].startswith("random Hadamard transform:") and rep.findings[1].startswith("nibble packing")
    assert rep.explained_by and "nibble packing order" in rep.explained_by[0]


@pytest.mark.parametrize("signs", ["recipe", 1234])
@pytest.mark.parametrize("shape", [(64, 256), (50, 160)])
def test_rht_and_transposed_scales(shape, signs):
    x = _x(shape, 9)
    c, s, amax = _rht_kernel(x, signs)
    sT = np.ascontiguousarray(s.T)
    rep = diff(pack_fp4(c), sT, x, "nvfp4", candidate_amax=amax)
    ours_s = fpsim.quantize(x, "nvfp4").scales
    moved = int(((sT.reshape(s.shape) != ours_s) & (sT.reshape(s.shape) != s)).sum())
    cause = "random Hadamard transform" if signs == "recipe" else "RHT with other signs"
    assert rep.causes == {"transposed scale layout": moved, cause: _total(rep) - moved}, rep.causes
    assert any(f.startswith("transposed scale layout") for f in rep.findings)


def test_rht_other_signs_and_swapped_nibbles_is_an_equivalent_sign_vector():
    """Swapping elements 2j and 2j+1 of every Hadamard output is the RHT with the odd positions' signs flipped
    (H = H8 ⊗ H2, and H2 with its columns swapped is diag(1, −1)·H2): with seeded signs s the bytes are exactly
    those of the signs s·(+, −, +, −, …), which is what diff names; with the recipe's signs the layout is named."""
    x = _x((64, 256), 10)
    c, s, amax = _rht_kernel(x, 1234)
    swapped = c.reshape(c.shape[0], -1, 2)[:, :, ::-1].reshape(c.shape)
    rep = diff(pack_fp4(swapped), s, x, "nvfp4", candidate_amax=amax)
    assert rep.causes == {"RHT with other signs": _total(rep)}, rep.causes
    flip = np.tile([1.0, -1.0], 8)
    text = " ".join("+" if v > 0 else "−" for v in sign_vector(16, 1234) * flip)
    assert f"[{text}]" in rep.findings[0]


@pytest.mark.parametrize("orientation", ["view", "transpose"])
@pytest.mark.parametrize("scheme", ["nvfp4", "mxfp4"])
@pytest.mark.parametrize("shape", SHAPES)
def test_wrong_axis_and_swapped_nibbles_together_are_both_named(shape, scheme, orientation):
    """A kernel with two bugs: blocks down the columns and element 2j in the high nibble.  Before, the nibble
    reading took the bytes it could (both nibbles wrong) and the rest — 14 % of MXFP4's, the wrong-axis codes —
    were "other"; the wrong-axis reading did not consider swapped nibbles."""
    x = _x(shape, 1)
    if scheme == "nvfp4":
        c, s, amax = _nvfp4_down_columns(x)
    else:
        q = fpsim.quantize(x, scheme, axis=0)
        c, s, amax = np.ascontiguousarray(unpack_fp4(q.data)[:, : shape[0]].T), np.ascontiguousarray(q.scales.T), None
    pc, ps = _stored(c, s, orientation)
    rep = diff(((pc >> 4) | (pc << 4)).astype(np.uint8), ps, x, scheme, candidate_amax=amax)
    assert rep.causes == {"quantized along the wrong axis": _total(rep)}, rep.causes
    assert "with the two nibbles of each byte swapped" in rep.findings[0]
    assert f"reproduces {_total(rep)} of the {_total(rep)} differing bytes" in rep.findings[0]
