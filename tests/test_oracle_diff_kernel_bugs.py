"""fpsim.oracle.diff against hand-written kernels with planted, realistic bugs: each candidate is built here with
fpsim's own codecs (or from the spec) plus the bug, and diff must name that cause for every byte it explains, and
no wrong one.  The bugs: two at once (a scale rule with an element rounding, a tile shape with truncation, a second
bug hidden by the first); a deterministic kernel compared under a seed; another block width; the E4M3 block scale
truncated, rounded up, not saturated or flushed to zero; subnormal element codes flushed; codes or scales
transposed or shifted by any offset; blocks formed down the columns instead of along the rows; the random Hadamard
transform together with a layout error.  Chance matches in corrupted bytes are never called likely causes."""

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


def _x(rows=64, cols=256, seed=0):
    """Rows of random normals at several magnitudes (some far below the tensor amax: subnormal E4M3 scales),
    every other row of quarter-step grid values (ties)."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((rows, cols)) * np.exp2(rng.integers(-6, 6, (rows, 1)))).astype(F32)
    x[1::2] = (rng.integers(-24, 25, x[1::2].shape) * 0.25).astype(F32)
    x[0, 0] = 2688.0  # NVFP4: S_enc = 1, so that block scales that are powers of two give E2M1 ties
    return x


X = _x()


# --- two bugs at once; seeds; another block width -----------------------------------------------------------------


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
    the blocks whose scale byte it changes, so the pair is scored over every block (scored only where the scales
    change, it explains ~1/3 of the bytes)."""
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


# --- the block scale's conversion, subnormals, transposed and shifted layouts ------------------------------------


def _wide(rows=64, cols=256, seed=4):
    """Normals times 2^U(−24, 0) per element: every block spans the element format's subnormal range."""
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((rows, cols)) * np.exp2(rng.uniform(-24, 0, (rows, cols)))).astype(F32)


def _nvfp4(x, scale_rounding="rne", scale_saturate=True, scale_ftz=False, tensor_scale=True):
    """A hand-written NVFP4 kernel (SPEC §4's order) whose E4M3 block-scale conversion can be changed."""
    amax = F32(np.abs(x).max())
    s_enc = F32(2688) / amax if tensor_scale else F32(1)
    s_dec = F32(1) / s_enc
    vmax = np.abs(x).reshape(x.shape[0], -1, 16).max(axis=2)
    sdb = (vmax * (s_enc * (F32(1) / F32(6)))).astype(F32)
    if scale_saturate:
        sdb = np.minimum(sdb, F32(448))
    sb = fpsim.encode(sdb, "e4m3", rounding=scale_rounding, saturate=scale_saturate)
    if scale_ftz:
        sb = np.where(sb < 0x08, np.uint8(0), sb)  # the bug: an encoder without subnormals
    with np.errstate(all="ignore"):
        enc = np.minimum(F32(1) / (fpsim.decode(sb, "e4m3") * s_dec), FLT_MAX).astype(F32)
        y = (x.reshape(x.shape[0], -1, 16) * enc[..., None]).astype(F32).reshape(x.shape)
    return pack_fp4(fpsim.encode(y, "e2m1")), sb, amax


def _only(rep, cause, explained=None):
    """Every byte explained, every mismatch attributed to ``cause``."""
    assert rep.explained_by, rep.format_table()
    if explained is not None:
        assert explained in rep.explained_by[0], rep.explained_by
    assert rep.causes == {cause: rep.n_code_mismatches + rep.n_scale_mismatches}, rep.causes


@pytest.mark.parametrize("rounding,words", [("rtz", "toward zero"), ("rup", "up, to the next E4M3 value")])
def test_block_scale_rounded_another_way(rounding, words):
    """sdb truncated (or rounded up) to E4M3 where cvt.rn.satfinite.e4m3x2.f32 rounds to nearest even: named as the
    scale's rounding, for the scale bytes and the codes that follow them alike."""
    codes, scales, amax = _nvfp4(X, scale_rounding=rounding)
    rep = diff(codes, scales, X, "nvfp4", candidate_amax=amax)
    assert rep.n_scale_mismatches > 100 and rep.n_code_mismatches > 1000
    _only(rep, "scale rounding", f"candidate rounds block scales {words}")


def test_block_scale_not_saturated_in_single_level_scaling():
    """No tensor scale and no min(sdb, 448) with a non-saturating conversion (__NV_NOSAT): a block whose vmax/6 is
    beyond 464 gets the NaN scale 0x7F, and its codes the NaN code."""
    x = X.copy()
    x[2, :16] *= 4000.0
    sch = fpsim.get_scheme("nvfp4").replace(tensor_scale=False)
    codes, scales, _ = _nvfp4(x, scale_saturate=False, tensor_scale=False)
    rep = diff(codes, scales, x, sch)
    assert rep.n_scale_mismatches == 1 and scales[2, 0] == 0x7F and rep.n_code_mismatches > 0
    _only(rep, "scale saturation", "without saturation")


def test_subnormal_block_scales_flushed_to_zero():
    codes, scales, amax = _nvfp4(X, scale_ftz=True)
    rep = diff(codes, scales, X, "nvfp4", candidate_amax=amax)
    assert rep.n_scale_mismatches > 50
    _only(rep, "scale flush to zero", "flushes subnormal block scales")


@pytest.mark.parametrize("scheme", ["nvfp4", "mxfp4", "mxfp8_e4m3", "fp8_block128"])
def test_subnormal_element_codes_flushed_to_zero(scheme):
    """E2M1 ±0.5 (FP8: below 2^-6) written as the zero of their sign: named as a subnormal flush, not a chance pair."""
    x = _wide()
    q = fpsim.quantize(x, scheme)
    el = fpsim.get_scheme(scheme).element
    c = unpack_fp4(q.data) if el.bits == 4 else q.data.copy()
    mag = c & el.magnitude_mask
    sub = (mag != 0) & (mag < (1 << el.mbits))
    c[sub] &= el.sign_mask
    rep = diff(pack_fp4(c) if el.bits == 4 else c, q.scales, x, scheme,
               candidate_amax=q.amax if scheme == "nvfp4" else None)
    assert rep.n_code_mismatches == int(sub.sum()) > 50
    _only(rep, "element flush to zero", "flushes subnormal")


def test_scales_transposed():
    """[R, nb] scales written as [nb, R]: named as transposed scales."""
    q = fpsim.quantize(X, "nvfp4")
    rep = diff(q.data, np.ascontiguousarray(q.scales.T), X, "nvfp4", candidate_amax=q.amax)
    assert rep.n_scale_mismatches > 500 and rep.n_code_mismatches == 0
    _only(rep, "transposed scale layout")
    assert any("stored transposed" in f for f in rep.findings)


def test_scales_shifted_by_one_byte():
    q = fpsim.quantize(X, "nvfp4")
    rep = diff(q.data, np.roll(q.scales.reshape(-1), 1).reshape(q.scales.shape), X, "nvfp4", candidate_amax=q.amax)
    assert rep.n_scale_mismatches > 500
    assert rep.causes == {"shifted scales": rep.n_scale_mismatches}, rep.causes


@pytest.mark.parametrize("how", ["codes", "bytes"])
def test_packed_codes_transposed(how):
    """The E2M1 code matrix stored [C, R] (packed along R), or the packed byte matrix stored transposed."""
    q = fpsim.quantize(X, "nvfp4")
    cand = pack_fp4(np.ascontiguousarray(unpack_fp4(q.data).T)) if how == "codes" else np.ascontiguousarray(q.data.T)
    rep = diff(cand, q.scales, X, "nvfp4", candidate_amax=q.amax)
    assert rep.n_code_mismatches > 10000
    _only(rep, "transposed code layout")


def test_fp8_codes_transposed():
    x = _x(64, 128)
    q = fpsim.quantize(x, "mxfp8_e4m3")
    rep = diff(np.ascontiguousarray(q.data.T), q.scales, x, "mxfp8_e4m3")
    _only(rep, "transposed code layout")


@pytest.mark.parametrize("shift", [1, -1, 2, 256])
def test_packed_codes_shifted(shift):
    """The code stream shifted by one element (a nibble), one byte (two codes) or one row: by one element, the
    nibble swap fixed half of the codes and diff claimed "nibble packing order" (and a chance "tie rounding")."""
    q = fpsim.quantize(X, "nvfp4")
    cand = pack_fp4(np.roll(unpack_fp4(q.data).reshape(-1), shift).reshape(X.shape))
    rep = diff(cand, q.scales, X, "nvfp4", candidate_amax=q.amax)
    assert rep.n_code_mismatches > 10000
    _only(rep, "shifted codes")
    assert not any(f.startswith("nibble") for f in rep.findings)


def test_fp8_codes_shifted_by_one_byte():
    q = fpsim.quantize(X, "fp8_block128")
    rep = diff(np.roll(q.data.reshape(-1), -1).reshape(q.data.shape), q.scales, X, "fp8_block128")
    _only(rep, "shifted codes")


def test_layout_readings_leave_real_bugs_alone():
    """A real element bug is not mistaken for a layout: the layout readings fix far fewer codes than the plain one."""
    q = fpsim.quantize(X, "nvfp4", rounding="rtz")
    rep = diff(q.data, q.scales, X, "nvfp4", candidate_amax=q.amax)
    assert not rep.findings and set(rep.causes) == {"rounding mode"}


def test_chance_matches_are_not_likely_causes():
    """Rows of corrupted bytes (every byte different from fpsim's): a hypothesis that changes only those rows
    breaks no matching byte and reproduces ~1 in 16 of them by chance ("element follows its block scale" ×173 and
    "scale clamp" ×137 of 3263 bytes here): a partial explanation must get right more of the bytes it changes than it
    gets wrong to be listed as a likely cause."""
    rng = np.random.default_rng(1)
    q = fpsim.quantize(X, "nvfp4")
    c, s = unpack_fp4(q.data), q.scales.copy()
    rows = np.flatnonzero(((s > 0) & (s < 8)).any(axis=1))  # the rows holding subnormal scales
    c[rows] ^= rng.integers(1, 16, c[rows].shape).astype(np.uint8)
    s[rows] = (s[rows] ^ rng.integers(1, 128, s[rows].shape).astype(np.uint8)) & 0x7E
    rep = diff(pack_fp4(c), s, X, "nvfp4", candidate_amax=q.amax)
    assert rep.n_code_mismatches > 1000 and not rep.explained_by
    assert rep.causes == {"other": rep.n_code_mismatches + rep.n_scale_mismatches}, rep.causes
    assert rep.hypotheses and all(h["wrong"] > h["explains"] for h in rep.hypotheses[:3])


def _normal(shape, seed=0):
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
    x = _normal(shape)
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
    x = _normal(shape, 1)
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
    x = _normal(shape, 2)
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
    bits: the scales are fpsim's but codes differ, and the cause is the axis, not "SR random bits"."""
    sch = fpsim.get_scheme("nvfp4").replace(block=(16, 16))
    x = _normal(shape, 3)
    qT = fpsim.quantize(np.ascontiguousarray(x.T), sch.replace(rounding="sr"), seed=5)
    q = fpsim.quantize(x, sch.replace(rounding="sr"), seed=5)
    cand = pack_fp4(np.ascontiguousarray(unpack_fp4(qT.data)[:, : shape[0]].T))
    rep = diff(cand, q.scales, x, sch, candidate_amax=qT.amax, rounding="sr", seed=5)
    assert rep.n_code_mismatches > 0 and rep.n_scale_mismatches == 0
    assert rep.causes == {"quantized along the wrong axis": rep.n_code_mismatches}, rep.causes


def test_wrong_axis_sizes_are_not_a_usage_error_in_the_cli(tmp_path):
    """200×100: x.T's 100×13 scales are not fpsim's 200×7, yet the CLI diagnoses the axis instead of refusing the
    sizes as a usage error (exit 2)."""
    x = _normal((200, 100))
    c, s, amax = _nvfp4_down_columns(x)
    codes, scales = _stored(c, s, "transpose")
    np.savez(tmp_path / "c.npz", codes=codes, scales=scales, amax=amax)
    np.save(tmp_path / "x.npy", x)
    r = CliRunner().invoke(main, ["diff", str(tmp_path / "c.npz"), "--input", str(tmp_path / "x.npy")])
    assert r.exit_code == 1 and "finding: quantized along the wrong axis" in r.output, r.output


def test_correct_bytes_and_unrelated_sizes_are_unchanged():
    x = _normal((50, 200))
    q = fpsim.quantize(x, "nvfp4")
    assert diff(q.data, q.scales, x, "nvfp4", candidate_amax=q.amax).identical
    with pytest.raises(ValueError, match="candidate scales have"):
        diff(q.data, q.scales.reshape(-1)[:-3], x, "nvfp4")


# --- codes and scales at other offsets -------------------------------------------------------------------------


@pytest.mark.parametrize("shift", [3, -5, 16, -37, 64])  # up to one row of blocks (80 codes at 33×70)
@pytest.mark.parametrize("shape", SHAPES)
def test_codes_shifted_by_another_offset(shape, shift):
    """The code stream (fpsim's rows, padded to whole blocks) written ``shift`` codes late: the offset is found by
    correlation and named; the codes shifted out of the stream are credited to it, so it explains every byte."""
    x = _normal(shape, 4)
    q = fpsim.quantize(x, "nvfp4")
    u = unpack_fp4(q.data)
    cand = pack_fp4(np.roll(u.reshape(-1), shift).reshape(u.shape))
    rep = diff(cand, q.scales, x, "nvfp4", candidate_amax=q.amax)
    assert rep.n_code_mismatches > 0.3 * x.size
    assert rep.causes == {"shifted codes": rep.n_code_mismatches}, rep.causes
    assert f"code i holds fpsim's code i{'−' if shift > 0 else '+'}{abs(shift)} " in rep.findings[0], rep.findings


def test_fp8_codes_shifted_by_seven_bytes():
    x = _normal((50, 200), 5)
    q = fpsim.quantize(x, "mxfp8_e4m3")
    rep = diff(np.roll(q.data.reshape(-1), -7).reshape(q.data.shape), q.scales, x, "mxfp8_e4m3")
    assert rep.causes == {"shifted codes": rep.n_code_mismatches} and "i+7 " in rep.findings[0], rep.findings


@pytest.mark.parametrize("shift", [3, -5])
@pytest.mark.parametrize("shape", SHAPES)
def test_scales_shifted_by_another_offset(shape, shift):
    x = _normal(shape, 6)
    q = fpsim.quantize(x, "nvfp4")
    s = np.roll(q.scales.reshape(-1), shift).reshape(q.scales.shape)
    rep = diff(q.data, s, x, "nvfp4", candidate_amax=q.amax)
    assert rep.causes == {"shifted scales": rep.n_scale_mismatches}, rep.causes
    assert f"shifted by {abs(shift)} bytes" in rep.findings[0]


def test_scrambled_bytes_get_no_offset():
    """40 % of the bytes random: no offset agrees with a sampled majority, so no shift is claimed."""
    x = _normal((64, 256), 7)
    q = fpsim.quantize(x, "nvfp4")
    rng = np.random.default_rng(1)
    c = q.data.copy()
    hit = rng.random(c.shape) < 0.4
    c[hit] = rng.integers(0, 256, int(hit.sum()))
    rep = diff(c, q.scales, x, "nvfp4", candidate_amax=q.amax)
    assert not rep.findings and set(rep.causes) == {"other"}, (rep.findings, rep.causes)


# --- the RHT and a layout error ---------------------------------------------------------------------------------


def _rht_kernel(x, signs="recipe"):
    q = fpsim.quantize(rht(x, 16, signs), "nvfp4")
    return unpack_fp4(q.data), q.scales, q.amax


@pytest.mark.parametrize("shape", [(64, 256), (50, 160), (33, 96)])
def test_rht_and_swapped_nibbles(shape):
    """The layout gets the codes it moved (the two nibbles of the byte differ), the transform the rest (codes whose
    pair holds equal codes, every scale byte, the amax)."""
    x = _normal(shape, 8)
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
    x = _normal(shape, 9)
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
    x = _normal((64, 256), 10)
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
    """A kernel with two bugs: blocks down the columns and element 2j in the high nibble.  The wrong-axis reading
    considers swapped nibbles, so every byte is named (the nibble reading alone would explain only the bytes with
    both nibbles wrong and leave the wrong-axis codes, 14 % of MXFP4's, "other")."""
    x = _normal(shape, 1)
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
