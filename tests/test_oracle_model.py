"""fpsim.oracle.model: fpsim's convention reproduces fpsim.quantize bit for bit, and the other conventions
compute what their formulas say (checked on hand-derived blocks)."""

from __future__ import annotations

import numpy as np
import pytest

import fpsim
from fpsim.oracle.model import Convention, TensorView, model_bytes

F32 = np.float32


def _special_tensor(rows, cols, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, cols)).astype(np.float32)
    x *= np.exp2(rng.integers(-30, 8, (rows, 1))).astype(np.float32)
    x[0, :3] = [0.0, -0.0, 2.0**-149]
    x[1, 5] = 6.0 * 2.0**7 * (1 + 2.0**-23)  # just above max_elem·2^k
    x[2, 1] = 1.75  # E2M1 / E8M0 boundaries
    x[3, 4:8] = [0.25, 0.75, 2.5, -5.0]  # ties at scale 1
    x[4, 7:23] = 0.0  # a zero block
    return x


def _ours(x, sch, nan_amax="propagate"):
    q = fpsim.quantize(x, sch, nan_amax=nan_amax)
    codes = fpsim.unpack_fp4(q.data) if sch.element.bits == 4 else q.data
    return codes.reshape(x.shape[0], -1), np.asarray(q.scales).reshape(x.shape[0], -1)


SCHEMES = [
    fpsim.get_scheme("nvfp4"),
    fpsim.get_scheme("nvfp4").replace(block=(16, 16)),
    fpsim.get_scheme("nvfp4").replace(per_row_scale=True),
    fpsim.schemes.BlockScheme("one", "e2m1", "e4m3", (1, 16)),
    fpsim.schemes.BlockScheme("e4m3x32", "e4m3", "e4m3", (1, 32), tensor_scale=True),
    *[fpsim.get_scheme(s).replace(scale_rule=r) for s in ("mxfp4", "mxfp6_e2m3", "mxfp8_e5m2")
      for r in ("floor", "ceil", "even", "rceil")],
    fpsim.get_scheme("mxfp8_e4m3").replace(block=(32, 32)),
    fpsim.get_scheme("fp8_block128"),
    *[fpsim.get_scheme(s).replace(rounding=m) for s in ("nvfp4", "mxfp8_e4m3") for m in ("rtz", "rup", "rdown", "rna")],
]


@pytest.mark.parametrize("sch", SCHEMES, ids=lambda s: f"{s.name}-{s.block}-{s.scale_rule.value}-{s.rounding.value}")
@pytest.mark.parametrize("nan", ["none", "propagate", "ignore"])
def test_fpsim_convention_equals_quantize(sch, nan):
    """Convention() is fpsim.quantize, for every kind of scheme, special values, NaN / inf, both NaN policies."""
    for seed in range(3):
        x = _special_tensor(32, 160, seed)
        if nan != "none":
            x[5, 9], x[6, 40], x[7, 3] = np.nan, np.inf, -np.inf
        policy = "ignore" if nan == "ignore" else "propagate"
        codes, scales = _ours(x, sch, policy)
        view = TensorView(x, sch.block)
        mc, ms = model_bytes(view, sch, Convention(nan_amax=policy))
        assert np.array_equal(mc[:, : codes.shape[1]], codes), (sch.name, seed)
        assert np.asarray(ms).tobytes() == scales.tobytes(), (sch.name, seed)


def test_scale_order_tie_and_torchao_multiplier():
    """The operation-order tie of SPEC §4, and torchao's fl(fl(1/pts)/s) one ulp from TE's encode factor."""
    sch = fpsim.get_scheme("nvfp4")
    x = np.zeros((1, 32), F32)
    x[0, 0], x[0, 16] = 100.0, 0.3487723469734192
    v = TensorView(x, sch.block)
    assert model_bytes(v, sch, Convention())[1][0, 1] == 0x3D
    assert model_bytes(v, sch, Convention(scale_order="mul_first"))[1][0, 1] == 0x3C
    x = np.zeros((1, 32), F32)
    x[0, 0], x[0, 16], x[0, 17] = 5.5, -0.6875, -2.421875
    v = TensorView(x, sch.block)
    te, ta = model_bytes(v, sch, Convention()), model_bytes(v, sch, Convention(enc="inv_pts_div_s"))
    assert np.array_equal(te[1], ta[1]) and not np.array_equal(te[0], ta[0])


def test_mx_float_log2_rules_are_off_by_one_where_documented():
    sch = fpsim.get_scheme("mxfp4")
    x = np.zeros((1, 64), F32)
    x[0, 0] = np.nextafter(F32(6 * 2.0**100), F32(np.inf))  # amax/6 just above 2^100: a float32 log2 gives 100
    x[0, 32] = np.nextafter(F32(2.0**100), F32(0))  # just below 2^100: a float32 log2 gives 100
    v = TensorView(x, sch.block)
    bits = model_bytes(v, sch, Convention(mx_rule="rceil"))[1][0]
    lg2 = model_bytes(v, sch, Convention(mx_rule="rceil_log2"))[1][0]
    assert bits[0] == 127 + 101 and lg2[0] == 127 + 100
    fl = model_bytes(v, sch, Convention(mx_rule="floor"))[1][0]
    fl2 = model_bytes(v, sch, Convention(mx_rule="floor_log2"))[1][0]
    assert fl[1] == 127 + 99 - 2 and fl2[1] == 127 + 100 - 2


def test_tie_rules():
    sch = fpsim.schemes.BlockScheme("one", "e2m1", "e4m3", (1, 16))
    x = np.array([[6.0, 0.25, 0.75, 1.25, 2.5, 5.0, -0.25, -0.75] + [0.0] * 8], F32)  # scale 1: ties as written
    v = TensorView(x, sch.block)
    codes = {r: model_bytes(v, sch, Convention(rounding=r))[0][0, :8].tolist() for r in ("rne", "rna", "ties_zero",
                                                                                         "ties_odd")}
    assert codes["rne"] == [7, 0, 2, 2, 4, 6, 8, 10]
    assert codes["rna"] == [7, 1, 2, 3, 5, 7, 9, 10]
    assert codes["ties_zero"] == [7, 0, 1, 2, 4, 6, 8, 9]
    assert codes["ties_odd"] == [7, 1, 1, 3, 5, 7, 9, 9]
