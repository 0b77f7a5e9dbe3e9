"""fpsim.oracle.diff as an oracle (issue 16, items 6–9 and 11): each defect is planted in a candidate built
here in plain numpy (or with fpsim.quantize options), and diff must name it as the explanation of every byte.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

import fpsim
from fpsim.oracle import diff
from fpsim.schemes import BlockScheme

F32 = np.float32
FLT_MAX = F32(np.finfo(np.float32).max)
E4M3 = fpsim.get_format("e4m3").decode_table()


def _nvfp4(x, enc_of, sdb_of=None, floor=None):
    """A hand-written NVFP4 kernel (1×16 blocks): TE's scale unless ``sdb_of``; elements y = enc_of(x, s, ...)."""
    x = np.asarray(x, F32)
    R, C = x.shape
    X = x.reshape(R, -1, 16)
    amax = F32(np.max(np.abs(x)))
    s_enc = F32(min(F32(2688) / amax, FLT_MAX)) if amax else F32(1)
    s_dec = F32(1) / s_enc
    pts = F32(amax / F32(2688))
    vmax = np.abs(X).max(axis=2)
    with np.errstate(all="ignore"):
        sdb = vmax * (s_enc * (F32(1) / F32(6))) if sdb_of is None else sdb_of(vmax, s_enc, pts)
        sdb = np.minimum(sdb, F32(448)).astype(F32)
        if floor is not None:
            sdb = np.maximum(sdb, F32(floor))
        sb = fpsim.encode(sdb, "e4m3")
        s = E4M3[sb][:, :, None]
        y = enc_of(X, s, s_enc, s_dec, pts).astype(F32).reshape(R, C)
    return fpsim.pack_fp4(fpsim.encode(y, "e2m1")), sb, amax


def te_enc(X, s, s_enc, s_dec, pts):
    return X * np.minimum(F32(1) / (s * s_dec), FLT_MAX)


def torchao_enc(X, s, s_enc, s_dec, pts):
    return X * ((F32(1) / pts) / s)


def _mx(x, byte_of, block=32, elem="e2m1", ftz=False):
    """A hand-written MX kernel: scale bytes from ``byte_of(amax)``, elements x·2^(127−b) (x/0 with ``ftz``)."""
    x = np.asarray(x, F32)
    R, C = x.shape
    X = x.reshape(R, -1, block)
    sb = byte_of(np.abs(X).max(axis=2)).astype(np.uint8)
    with np.errstate(all="ignore"):
        e = np.ldexp(F32(1), sb.astype(np.int32) - 127).astype(F32)
        e = np.where(sb == 0xFF, F32(np.nan), e)
        if ftz:
            e = np.where(e < F32(2.0**-126), F32(0), e)  # a flush-to-zero kernel: the subnormal scale 2^-127 is 0
        y = (X / e[:, :, None]).astype(F32).reshape(R, C)
    codes = fpsim.encode(y, elem)
    return (fpsim.pack_fp4(codes) if fpsim.get_format(elem).bits == 4 else codes), sb


def _rng(rows, cols, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((rows, cols)) * np.exp2(rng.integers(-8, 8, (rows, 1)))).astype(F32)


def _explained(rep, cause):
    """The top-ranked hypothesis explains every byte and has ``cause``; no mismatch is left as "other"."""
    assert rep.explained_by, rep.format_table()
    top = rep.hypotheses[0]
    assert top["explains_every_byte"] and top["cause"] == cause, rep.format_table()
    assert "other" not in rep.causes, rep.causes
    if cause != "NaN handling":
        assert "NaN handling" not in rep.causes, rep.causes
    return top


def test_item6_torchao_encode_multiplier_is_not_a_tie_rule():
    x = np.zeros((1, 32), F32)
    x[0, 0], x[0, 16], x[0, 17] = 5.5, -0.6875, -2.421875
    codes, scales, _ = _nvfp4(x, torchao_enc)
    rep = diff(codes, scales, x, "nvfp4")
    assert rep.n_code_mismatches == 1 and rep.n_scale_mismatches == 0
    top = _explained(rep, "encode multiplier")
    assert top["name"] == "candidate scales elements as fl(x·fl(fl(1/fl(amax/2688))/s))"
    assert rep.causes == {"encode multiplier": 1}
    # the repro in every row of a larger tensor, among values away from rounding boundaries
    x = np.tile(x, (64, 2))
    x[:, 32:] = np.linspace(0.5, 5.0, 32, dtype=F32)  # below the amax 5.5 and no zero block
    codes, scales, _ = _nvfp4(x, torchao_enc)
    rep = diff(codes, scales, x, "nvfp4")
    assert rep.n_code_mismatches >= 64
    top = _explained(rep, "encode multiplier")
    assert top["name"] == "candidate scales elements as fl(x·fl(fl(1/fl(amax/2688))/s))"


def test_item7_single_level_scheme_is_not_all_nan_handling():
    s = BlockScheme("one", "e2m1", "e4m3", (1, 16))
    x = np.linspace(-1, 1, 16, dtype=F32)[None]
    q = fpsim.quantize(x, s)
    sc = q.scales.copy()
    sc[0, 0] += 1
    rep = diff(q.data, sc, x, s)
    assert rep.causes == {"other": 1} and not rep.explained_by
    # a real defect of a single-level kernel: the scale computed as vmax/6 instead of vmax·fl(1/6), seen where
    # vmax/6 is an E4M3 tie (vmax = 6·m, m an odd multiple of 1/16 in [1, 2): fl(1/6) > 1/6 rounds it up)
    g = fpsim.get_format("e4m3").values().astype(np.float64)
    g = g[(g > 0) & np.isfinite(g)]
    v = (6 * (g[:-1] + g[1:]) / 2).astype(F32)  # block maxima whose sdb lies near an E4M3 tie
    v = np.concatenate([v, *[np.nextafter(v, F32(k)) for k in (0, np.inf)]])
    with np.errstate(all="ignore"):
        v = v[fpsim.encode(v / F32(6), "e4m3") != fpsim.encode(v * (F32(1) / F32(6)), "e4m3")]
    assert v.size >= 8
    x = _rng(v.size, 64, seed=7) * F32(2.0**-12)
    x[:, 0] = v
    vmax = np.abs(x).reshape(v.size, -1, 16).max(axis=2)
    sb = fpsim.encode(np.minimum(vmax / F32(6), F32(448)), "e4m3")
    ours = fpsim.quantize(x, s)
    assert np.count_nonzero(sb != ours.scales) > 0
    with np.errstate(all="ignore"):
        y = (x.reshape(v.size, -1, 16) * np.minimum(F32(1) / E4M3[sb][:, :, None], FLT_MAX)).reshape(x.shape)
    rep = diff(fpsim.pack_fp4(fpsim.encode(y, "e2m1")), sb, x, s)
    _explained(rep, "scale operation order")


def test_item7_single_level_nan_names_only_the_nan_block():
    s = BlockScheme("one", "e2m1", "e4m3", (1, 16))
    x = _rng(4, 64, seed=8)
    x[1, 20] = np.nan
    bad = fpsim.quantize(x, s, nan_amax="ignore")
    rep = diff(bad.data, bad.scales, x, s)
    _explained(rep, "NaN handling")
    assert rep.n_scale_mismatches == 1 and rep.causes["NaN handling"] == rep.n_code_mismatches + 1


def test_item8_even_rule_is_not_floor():
    x = np.zeros((1, 64), F32)
    x[0, 0], x[0, 32] = 1.8, 1.6
    q = fpsim.quantize(x, "mxfp4", scale_rule="even")
    rep = diff(q.data, q.scales, x, "mxfp4")
    top = _explained(rep, "MX scale rule")
    assert top["name"].startswith("candidate = even rule")
    assert not any(n.startswith("candidate = floor") for n in rep.explained_by)
    floor = next(h for h in rep.hypotheses if h["name"].startswith("candidate = floor rule"))
    assert floor["explains"] > 0 and floor["breaks"] > 0  # explains block 1, breaks block 0


def test_item8_rceil_with_a_float32_log2():
    x = _rng(8, 1024, seed=9) * F32(2.0**-10)
    x[:, ::64] = np.nextafter(F32(6 * 2.0**20), F32(np.inf))  # amax/6 one ulp above 2^20: log2 is one too low
    x[:, 32::64] = (np.linspace(1.01, 7.9, 16) * 2.0**10).astype(F32)  # maxima where floor, ceil, even differ
    for rule in ("floor", "ceil", "even"):  # so that no other rule fits these bytes
        assert not np.array_equal(fpsim.quantize(x, "mxfp4", scale_rule=rule).scales[:, 1::2],
                                  fpsim.quantize(x, "mxfp4").scales[:, 1::2])
    with np.errstate(divide="ignore"):
        byte_of = lambda a: np.clip(np.ceil(np.log2((a / F32(6)).astype(F32))) + 127, 0, 254)  # noqa: E731
    codes, sb = _mx(x, byte_of)
    rep = diff(codes, sb, x, "mxfp4")
    assert rep.n_scale_mismatches == 8 * 16
    top = _explained(rep, "MX scale rule")
    assert top["name"].startswith("candidate = rceil_log2 rule")


def test_item8_every_hypothesis_that_explains_every_byte_is_reported_simplest_first():
    x = np.zeros((1, 32), F32)
    x[0, 0], x[0, 16] = 100.0, 0.3487723469734192
    codes, scales, _ = _nvfp4(x, te_enc, sdb_of=lambda v, s, p: (v * s) * (F32(1) / F32(6)))
    rep = diff(codes, scales, x, "nvfp4")
    names = rep.explained_by
    assert names[0] == "candidate = fl(fl(vmax·S_enc)·fl(1/6))" and "candidate = fl(fl(vmax·S_enc)/6)" in names
    ranked = [h for h in rep.hypotheses if h["explains_every_byte"]]
    assert [h["name"] for h in ranked] == names
    assert [h["complexity"] for h in ranked] == sorted(h["complexity"] for h in ranked)


def test_item9_dropped_tensor_scale():
    x = _rng(16, 128, seed=10)
    q = fpsim.quantize(x, fpsim.get_scheme("nvfp4").replace(tensor_scale=False))
    rep = diff(q.data, q.scales, x, "nvfp4")
    assert rep.n_scale_mismatches == q.scales.size
    _explained(rep, "tensor scale")


def test_item9_other_block_shape():
    x = _rng(32, 64, seed=11)
    q = fpsim.quantize(x, "nvfp4", block=(16, 16))
    rep = diff(q.data, q.scales, x, "nvfp4")
    assert _explained(rep, "block shape")["name"] == "candidate uses 16×16 blocks"
    q = fpsim.quantize(x, "nvfp4")  # and the other way round
    rep = diff(q.data, q.scales, x, fpsim.get_scheme("nvfp4").replace(block=(16, 16)))
    assert _explained(rep, "block shape")["name"] == "candidate uses 1×16 blocks"


def test_item9_bytes_made_with_another_amax_are_found_without_being_told_the_amax():
    x = _rng(16, 256, seed=12)
    other = float(np.abs(x).max()) * 1.37
    q = fpsim.quantize(x, "nvfp4", tensor_amax=other)
    rep = diff(q.data, q.scales, x, "nvfp4")
    top = _explained(rep, "tensor amax")
    assert "follow from a tensor amax" in top["name"]
    a = float(top["name"].split("tensor amax ")[1].split(" ")[0])
    assert abs(a / other - 1) < 1e-3
    rep = diff(q.data, q.scales, x, "nvfp4", candidate_amax=np.float32(other))  # told: that amax explains it
    _explained(rep, "tensor amax")


def test_item9_mx_byte0_blocks_flushed_to_zero():
    x = _rng(4, 128, seed=13)
    x[1, 32:64] *= F32(2.0**-140)  # a block whose scale is 2^-127 (byte 0)
    q = fpsim.quantize(x, "mxfp4")
    assert q.scales[1, 1] == 0
    codes, sb = _mx(x, lambda a: q.scales, ftz=True)
    rep = diff(codes, sb, x, "mxfp4")
    assert rep.n_code_mismatches > 0 and rep.n_scale_mismatches == 0
    assert _explained(rep, "MX byte-0 blocks")["name"].startswith("candidate flushes the scale 2^-127")


@pytest.mark.parametrize("scheme", ["mxfp4", "mxfp8_e4m3"])
def test_item9_inf_block_max(scheme):
    x = _rng(4, 128, seed=14)
    x[2, 40], x[3, 100] = np.inf, -np.inf
    q = fpsim.quantize(x, scheme)
    elem = fpsim.get_scheme(scheme).element.name
    byte_of = lambda a: np.where(np.isinf(a), 0xFF, q.scales)  # noqa: E731  # the candidate: log2(inf) -> NaN scale
    codes, sb = _mx(x, byte_of, elem=elem)
    rep = diff(codes, sb, x, scheme)
    assert rep.n_scale_mismatches == 2
    assert _explained(rep, "inf block max")["name"] == "candidate gives a block holding inf the NaN scale 0xFF"


def test_item9_inf_left_out_of_the_nvfp4_amax():
    x = _rng(8, 64, seed=15)
    x[3, 7] = np.inf
    fin = np.where(np.isinf(x), 0, x)
    q = fpsim.quantize(fin, "nvfp4")
    sc = q.scales.copy()
    codes = fpsim.unpack_fp4(q.data)
    codes[3, 7] = 0x7  # the inf element saturates to +6 under its block's (finite) scale
    rep = diff(fpsim.pack_fp4(codes), sc, x, "nvfp4")
    _explained(rep, "inf block max")


def test_two_bugs_at_once_are_explained_by_a_pair():
    x = np.zeros((1, 48), F32)
    x[0, 0], x[0, 16], x[0, 17] = 100.0, 0.3487723469734192, -0.1  # block 2 is all zeros

    def nocap(X, s, s_enc, s_dec, pts):
        return X * (F32(1) / (s * s_dec))

    codes, scales, amax = _nvfp4(x, nocap, sdb_of=lambda v, s, p: (v * s) * (F32(1) / F32(6)))
    rep = diff(codes, scales, x, "nvfp4", candidate_amax=amax)
    top = rep.hypotheses[0]
    assert top["explains_every_byte"] and top["complexity"] == 2
    assert set(top["cause"].split(" + ")) == {"zero-scale block", "scale operation order"}
    # each byte is attributed to the part that explains it
    assert rep.causes == {"zero-scale block": 16, "scale operation order": 2}


def test_item11_vectorised_every_block_wrong():
    """1024² with every block's scale wrong (a dropped tensor scale): the old per-mismatch loop took ~70 s."""
    rng = np.random.default_rng(16)
    x = rng.standard_normal((1024, 1024)).astype(F32)
    q = fpsim.quantize(x, fpsim.get_scheme("nvfp4").replace(tensor_scale=False))
    diff(q.data[:16], q.scales[:16], x[:16], "nvfp4")  # compile outside the timing
    t = time.perf_counter()
    rep = diff(q.data, q.scales, x, "nvfp4")
    dt = time.perf_counter() - t
    assert rep.n_scale_mismatches == q.scales.size and rep.hypotheses[0]["cause"] == "tensor scale"
    assert dt < 20, dt
