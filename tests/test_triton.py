"""The fused Triton kernels give the Numba reference's bits.

On a machine without CUDA the kernels run under Triton's interpreter (``TRITON_INTERPRET=1``,
set here before Triton is imported), which executes the same kernel source on CPU tensors;
on the device machine they compile for the GPU.  Skipped where torch or Triton is missing.
"""

import numpy as np
import pytest

import fpsim  # noqa: E402
from fpsim.torch import backend as tb  # noqa: E402
from fpsim.torch import codecs as tc  # noqa: E402
from fpsim.torch import container as tcont  # noqa: E402
from fpsim.torch import quantize as tq  # noqa: E402
from tests import scaling_golden as G  # noqa: E402
from tests.probes import float32_probes, probes_for  # noqa: E402
from tests.tritonenv import DEV, INTERPRETER_WARNINGS, torch  # noqa: F401 (sets TRITON_INTERPRET first)

pytestmark = INTERPRETER_WARNINGS

MX = {"mxfp4": "float4_e2m1fn", "mxfp6_e2m3": "float6_e2m3fn", "mxfp6_e3m2": "float6_e3m2fn",
      "mxfp8_e4m3": "float8_e4m3fn", "mxfp8_e5m2": "float8_e5m2"}
RULES = ["floor", "ceil", "even", "rceil"]


def T(x):
    return torch.from_numpy(np.ascontiguousarray(x)).to(DEV)


def N(t):
    return t.cpu().numpy()


def same_f32(a, b):
    return np.array_equal(np.asarray(a, np.float32).view(np.uint32), np.asarray(b, np.float32).view(np.uint32))


def wild(rng, shape):
    """Random data over ~60 binades, with zero, subnormal, tiny, tie-prone, NaN-free adversarial rows."""
    x = (rng.standard_normal(shape) * np.exp2(rng.integers(-30, 30, shape))).astype(np.float32)
    x2 = x.reshape(-1, shape[-1])
    if x2.shape[0] >= 6:
        x2[0, :] = 0
        x2[1, :17] = -0.0
        x2[2, :] = rng.standard_normal(shape[-1]).astype(np.float32) * np.float32(1e-41)  # float32 subnormals
        x2[3, :] = np.float32(2.5 * 448 / 6)  # an E4M3 scale tie after scaling
        x2[4, ::5] *= 1e6
        x2[5, :] = rng.integers(-12, 13, shape[-1]).astype(np.float32) / 2  # E2M1 ties
    return x


@pytest.mark.parametrize("fmt", ["float4_e2m1fn", "float6_e2m3fn", "float6_e3m2fn", "float8_e4m3fn", "float8_e5m2"])
def test_element_encoder_on_every_exponent_class(fmt):
    """Every float32 exponent, every rounding-relevant mantissa pattern, sticky bits, ±0, inf, NaN."""
    spec = fpsim.get_format(fmt)
    x = np.concatenate([probes_for(spec), float32_probes(top=4, sticky=True)]).view(np.float32)
    got = N(tc.encode_fused(T(x), spec))
    assert np.array_equal(got, fpsim.encode(x, spec).astype(np.uint8))


@pytest.mark.parametrize("fmt,k", [("float4_e2m1fn", k) for k in (1, 4, 8, 13, 24)]
                         + [(f, k) for f in ("float6_e2m3fn", "float8_e4m3fn") for k in (8, 24)])
def test_sr_element_encoder_on_every_exponent_class(fmt, k):
    """Stochastic rounding's element encoders (E2M1's short form, the generic one otherwise) against the CPU
    reference: every exponent class and mantissa pattern with random k-bit values and both extremes (0 and
    2^k − 1: the largest sum, which at k = 24 rounds some values up onto the next grid value)."""
    spec = fpsim.get_format(fmt)
    x = probes_for(spec).view(np.float32)
    rng = np.random.default_rng(k)
    for r in (rng.integers(0, 1 << k, x.shape), np.zeros(x.shape, np.int64), np.full(x.shape, (1 << k) - 1)):
        got = N(tc.encode_fused(T(x), spec, rbits=T(r), k=k))
        want = fpsim.encode(x, spec, rounding="sr", rbits=r, k=k).astype(np.uint8)
        bad = np.flatnonzero(got != want)
        assert bad.size == 0, (f"{bad.size} codes differ, first x bits {x.view(np.uint32)[bad[0]]:#010x} "
                               f"r {r[bad[0]]}: {got[bad[0]]} != {want[bad[0]]}")


@pytest.mark.parametrize("k", [None, 1, 8, 22, 23, 24])
def test_e2m1_values_without_codes_are_the_decoded_codes(k):
    """The fused copies' E2M1 rounding straight to values (RNE, or SR with k bits) is the CPU reference's encode
    then decode, bit for bit (−0 and NaN → +6 included), on every float32 exponent class and mantissa pattern."""
    from fpsim.torch import kernels as K
    spec = fpsim.get_format("float4_e2m1fn")
    x = probes_for(spec).view(np.float32)
    rs = ([None] if k is None else
          [np.random.default_rng(k).integers(0, 1 << k, x.shape), np.zeros(x.shape, np.int64),
           np.full(x.shape, (1 << k) - 1)])
    for r in rs:
        out = torch.empty(x.shape, dtype=torch.float32, device=DEV)
        rt = T(np.zeros(1, np.int32) if r is None else r.astype(np.int32))
        K.e2m1_values_kernel[(-(-x.size // 1024),)](T(x), rt, out, x.size, BLOCK=1024, SR=r is not None, K=k or 8)
        codes = (fpsim.encode(x, spec) if r is None else fpsim.encode(x, spec, rounding="sr", rbits=r, k=k))
        assert same_f32(N(out), fpsim.decode(codes, spec))  # E2M1 has no NaN: NaN → code 7 (+6), either sign


def test_sr_e2m1_short_form_on_every_random_value():
    """E2M1's SR short form on every 8-bit random value over the binades where E2M1 rounds (2^-4 … 16), against
    the CPU reference and the generic encoder."""
    spec = fpsim.get_format("float4_e2m1fn")
    x1 = float32_probes(top=4, exponents=np.arange(122, 132)).view(np.float32)
    x = np.repeat(x1, 256)
    r = np.tile(np.arange(256), x1.size)
    got = N(tc.encode_fused(T(x), spec, rbits=T(r), k=8))
    assert np.array_equal(got, fpsim.encode(x, spec, rounding="sr", rbits=r, k=8).astype(np.uint8))
    from fpsim.torch import kernels as K  # the generic encoder with E2M1's constants (E2M1=False)
    out = torch.empty(x.shape, dtype=torch.uint8, device=DEV)
    consts = {**tc.elem_consts(spec), "E2M1": False}
    K.encode_kernel[(-(-x.size // 1024),)](T(x), out, x.size, BLOCK=1024, **consts, r_ptr=T(r.astype(np.int32)),
                                           SR=True, K=8)
    assert np.array_equal(N(out), got)


def test_absmax_propagates_nan_unless_ignored():
    x = np.array([1.0, -3.0, np.nan, 2.0], np.float32)
    assert np.isnan(float(tq.absmax(T(x))))
    assert float(tq.absmax(T(x), ignore_nan=True)) == 3.0
    assert float(tq.absmax(T(np.array([-np.inf, 1], np.float32)))) == np.inf
    assert float(tq.absmax(T(np.zeros(0, np.float32)))) == 0.0
    assert np.signbit(float(tq.absmax(T(np.array([-0.0], np.float32))))) == np.False_


def _unpack(data, packed):
    if not packed:
        return data.astype(np.int64)
    return np.stack([data & 0xF, data >> 4], -1).reshape(*data.shape[:-1], -1).astype(np.int64)


@pytest.mark.parametrize("case", G.NVFP4, ids=[c[0] for c in G.NVFP4])
def test_nvfp4_golden_cases(case):
    name, scheme, kw, x, codes, scales, decoded = case
    x = np.asarray(x, np.float32)
    if set(kw) - {"block", "axis", "nan_amax"} or kw.get("block", (1, 16)) not in ((1, 16), (16, 16)):
        pytest.skip(f"option {kw} is not a fused-kernel option")
    xt = np.moveaxis(x, kw.get("axis", -1), -1)
    tile = kw.get("block") == (16, 16)
    t = tb.quantize(T(xt), "nvfp4", block=(16, 16) if tile else None, nan_amax=kw.get("nan_amax", "propagate"),
                    impl="triton")
    assert np.array_equal(_unpack(N(t.data), True).reshape(len(codes), -1), np.asarray(codes)), name
    assert np.array_equal(N(t.scales).reshape(len(scales), -1), np.asarray(scales)), name
    if decoded is not None:
        d = N(t.dequantize(impl="triton"))
        want = np.moveaxis(np.asarray(decoded, np.float32), kw.get("axis", -1), -1)
        assert same_f32(d, want) or np.array_equal(np.isnan(d), np.isnan(want)) and same_f32(
            np.nan_to_num(d), np.nan_to_num(want)), name


@pytest.mark.parametrize("shape", [(6, 16), (7, 53), (33, 40), (3, 5, 48), (64, 1024), (1, 1)])
@pytest.mark.parametrize("nan_amax", ["propagate", "ignore"])
def test_nvfp4_fused_equals_the_reference(shape, nan_amax):
    rng = np.random.default_rng(sum(shape))
    x = wild(rng, shape)
    if nan_amax == "ignore":
        x.reshape(-1)[::7] = np.nan
    q = fpsim.quantize(x, "nvfp4", nan_amax=nan_amax)
    t = tb.quantize(T(x), "nvfp4", nan_amax=nan_amax, impl="triton")
    assert np.array_equal(N(t.data), q.data) and np.array_equal(N(t.scales), q.scales)
    assert same_f32(N(t.amax), q.amax)
    assert same_f32(N(t.dequantize(impl="triton")), q.dequantize())
    bf = t.dequantize(torch.bfloat16, impl="triton")
    assert torch.equal(bf, torch.from_numpy(q.dequantize()).to(DEV).to(torch.bfloat16))
    assert same_f32(N(tb.fake_quantize(T(x), "nvfp4", nan_amax=nan_amax, impl="triton")), q.dequantize())


def test_nvfp4_nan_tensor_and_given_amax():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((4, 40)).astype(np.float32)
    q = fpsim.quantize(x, "nvfp4", tensor_amax=0.5)  # an amax below the data: saturating scales
    t = tb.quantize(T(x), "nvfp4", tensor_amax=0.5, impl="triton")
    assert np.array_equal(N(t.data), q.data) and np.array_equal(N(t.scales), q.scales)
    x[2, 3] = np.nan
    q = fpsim.quantize(x, "nvfp4")
    t = tb.quantize(T(x), "nvfp4", impl="triton")
    assert np.array_equal(N(t.data), q.data) and np.array_equal(N(t.scales), q.scales) and np.isnan(float(t.amax))


@pytest.mark.parametrize("shape", [(16, 16), (40, 70), (33, 128)])
def test_nvfp4_2d_tiles(shape):
    x = wild(np.random.default_rng(shape[1]), shape)
    q = fpsim.quantize(x, "nvfp4", block=(16, 16))
    t = tb.quantize(T(x), "nvfp4", block=(16, 16), impl="triton")
    assert np.array_equal(N(t.data), q.data) and np.array_equal(N(t.scales), q.scales)
    assert same_f32(N(tb.fake_quantize(T(x), "nvfp4", block=(16, 16), impl="triton")), q.dequantize())


def test_nvfp4_apply_s_dec_false_gives_exact_bf16_products():
    x = wild(np.random.default_rng(9), (8, 64))
    t = tb.quantize(T(x), "nvfp4", impl="triton")
    e = N(tcont.dequantize_fused(t.data, t.scales, t.amax, 64, t.plan, torch.float32, apply_s_dec=False))
    b = N(tcont.dequantize_fused(t.data, t.scales, t.amax, 64, t.plan, torch.bfloat16, apply_s_dec=False).float())
    assert same_f32(e, b)  # e · s_b is exact in BF16
    q = fpsim.quantize(x, "nvfp4")
    vals = fpsim.decode(fpsim.unpack_fp4(q.data), "float4_e2m1fn") * np.repeat(
        fpsim.decode(q.scales, "float8_e4m3fn"), 16, axis=-1)
    assert same_f32(e, vals)


@pytest.mark.parametrize("scheme", list(MX))
@pytest.mark.parametrize("rule", RULES)
def test_mx_fused_equals_the_reference(scheme, rule):
    rng = np.random.default_rng(len(scheme) + len(rule))
    x = wild(rng, (9, 75))
    x[6, 40] = np.nan
    x[7, 2] = -np.inf
    x[8, :] = np.float32(7.0) * np.exp2(rng.integers(-20, 20, 75)).astype(np.float32)  # floor saturates
    q = fpsim.quantize(x, scheme, scale_rule=rule)
    t = tb.quantize(T(x), scheme, scale_rule=rule, impl="triton")
    assert np.array_equal(N(t.data), q.data) and np.array_equal(N(t.scales), q.scales)
    assert same_f32(N(t.dequantize(impl="triton")), q.dequantize())
    f = N(tb.fake_quantize(T(x), scheme, scale_rule=rule, impl="triton"))
    assert same_f32(f, q.dequantize())


@pytest.mark.parametrize("case", G.MX_RULES, ids=[c[0] for c in G.MX_RULES])
def test_mx_scale_rule_golden_cases(case):
    name, el, vals, bytes_ = case
    x = np.asarray([G.blk(*vals, n=32)], np.float32)
    for rule, b in bytes_.items():
        t = tb.quantize(T(x), {"e2m1": "mxfp4", "e4m3": "mxfp8_e4m3"}[el], scale_rule=rule, impl="triton")
        assert int(N(t.scales)[0, 0]) == b, (name, rule)


def test_mx_32x32_tiles_and_ignore_nan():
    x = wild(np.random.default_rng(3), (64, 96))
    x[10, 10] = np.nan
    for nan_amax in ("propagate", "ignore"):
        q = fpsim.quantize(x, "mxfp8_e4m3", block=(32, 32), nan_amax=nan_amax)
        t = tb.quantize(T(x), "mxfp8_e4m3", block=(32, 32), nan_amax=nan_amax, impl="triton")
        assert np.array_equal(N(t.data), q.data) and np.array_equal(N(t.scales), q.scales), nan_amax


@pytest.mark.parametrize("scheme", ["fp8_e4m3", "fp8_e5m2", "fp8_block128"])
@pytest.mark.parametrize("shape", [(9, 256), (5, 200), (3, 4, 130)])
def test_fp8_fused_equals_the_reference(scheme, shape):
    rng = np.random.default_rng(shape[-1])
    x = wild(rng, shape)
    x.reshape(-1, shape[-1])[-1, 3] = np.inf
    q = fpsim.quantize(x, scheme)
    t = tb.quantize(T(x), scheme, impl="triton")
    assert np.array_equal(N(t.data), q.data) and same_f32(N(t.scales), q.scales), scheme
    assert same_f32(N(t.dequantize()), q.dequantize())
    if len(shape) == 2:
        assert same_f32(N(tb.fake_quantize(T(x), scheme, impl="triton")), q.dequantize())


@pytest.mark.parametrize("case", G.FP8, ids=[c[0] for c in G.FP8])
def test_fp8_golden_cases(case):
    name, scheme, x, codes, scales, decoded = case
    t = tb.quantize(T(np.asarray(x, np.float32)), scheme, impl="triton")
    assert np.array_equal(N(t.data).reshape(np.asarray(codes).shape), np.asarray(codes)), name
    assert np.array_equal(N(t.scales).reshape(np.shape(scales)), np.asarray(scales, np.float32)), name
    assert same_f32(N(t.dequantize()), np.asarray(decoded, np.float32)), name


def test_fp8_nan_ignore_and_given_amax():
    x = wild(np.random.default_rng(8), (6, 128))
    x[2, 7] = np.nan
    for kw in ({}, {"nan_amax": "ignore"}, {"tensor_amax": 3.0}):
        for scheme in ("fp8_e4m3", "fp8_block128"):
            if "tensor_amax" in kw and scheme == "fp8_block128":
                continue
            q = fpsim.quantize(x, scheme, **kw)
            t = tb.quantize(T(x), scheme, impl="triton", **kw)
            assert np.array_equal(N(t.data), q.data), (scheme, kw)
            assert np.array_equal(np.isnan(N(t.scales)), np.isnan(q.scales)), (scheme, kw)
            assert same_f32(np.nan_to_num(N(t.scales)), np.nan_to_num(q.scales)), (scheme, kw)


def test_philox_stream_equals_the_reference():
    from fpsim.random import random_bits, seed_key
    from fpsim.torch import kernels as K

    seed = 0xFEEDFACE12345678
    k0, k1 = seed_key(seed)
    out = torch.empty(4 * 70, dtype=torch.int32, device=DEV)
    K.philox_kernel[(2,)](out, 70, k0, k1, 2**32 - 3, BLOCK=64)  # the counter crosses into its high word
    assert np.array_equal(N(out).view(np.uint32), random_bits(seed, 280, k=32, counter=2**32 - 3))


@pytest.mark.parametrize("scheme,kw", [("nvfp4", {}), ("nvfp4", {"k": 16}), ("nvfp4", {"counter": 77}),
                                       ("mxfp4", {}), ("mxfp8_e4m3", {}), ("mxfp6_e3m2", {"k": 8}),
                                       ("nvfp4", {"block": (16, 16)})])
@pytest.mark.parametrize("shape", [(6, 64), (5, 70)])
def test_stochastic_rounding_in_the_kernels_equals_the_cpu_quantizer(monkeypatch, scheme, kw, shape):
    """Same seed, same Philox bits in the same block order: the same codes as fpsim.quantize(..., "sr")."""
    import fpsim.scaling

    x = wild(np.random.default_rng(shape[1] + len(kw)), shape)
    q = fpsim.quantize(x, scheme, rounding="sr", seed=1234, **kw)

    def no_host(*a, **k):
        raise AssertionError("fell back to the host quantizer")

    monkeypatch.setattr(fpsim.scaling, "quantize", no_host)
    t = tb.quantize(T(x), scheme, rounding="sr", seed=1234, impl="triton", **kw)
    assert np.array_equal(N(t.data), q.data) and np.array_equal(N(t.scales), q.scales)
    assert t.scheme == q.scheme


@pytest.mark.parametrize("scheme", ["nvfp4", "mxfp6_e2m3", "fp8_block128"])
@pytest.mark.parametrize("shape,axis", [((40, 24), 0), ((3, 5, 48), 1), ((3, 5, 48), -1)])
def test_quantize_and_dequantize_along_any_axis(scheme, shape, axis):
    """The fused path moves the quantized axis last and back: the reference's codes, scales and values."""
    x = wild(np.random.default_rng(len(shape) + axis), shape)
    q = fpsim.quantize(x, scheme, axis=axis)
    t = tb.quantize(T(x), scheme, axis=axis, impl="triton")
    assert t.to_quantized().equals(q)
    assert same_f32(N(t.dequantize(impl="triton")), q.dequantize())


@pytest.mark.parametrize("d,signs", [(1, "none"), (2, 3), (16, "recipe"), (16, 7), (128, 9), (256, "none")])
@pytest.mark.parametrize("bf16", [True, False])
def test_rht_kernel_equals_the_reference(d, signs, bf16):
    """The one-kernel RHT gives fpsim.rht's bits (forward and inverse), specials included, along either axis."""
    rng = np.random.default_rng(d)
    x = (rng.standard_t(3, (6, 512)) * 100).astype(np.float32)
    x[0, :5] = [np.nan, np.inf, -np.inf, -0.0, 1e-41]
    x[1, :] *= np.float32(1e-38)  # sums of subnormals: no flush to zero
    x[2, :] *= np.float32(3e36)  # sums that overflow to inf
    for axis in (-1, 0) if d <= 2 else (-1,):
        want = fpsim.rht(x, d, signs, axis=axis, bf16_in=bf16, bf16_out=bf16)
        got = N(tb.rht(T(x), d, signs, axis=axis, bf16_in=bf16, bf16_out=bf16, impl="triton"))
        nan = np.isnan(want)
        assert np.array_equal(np.isnan(got), nan) and same_f32(got[~nan], want[~nan]), (d, signs, bf16, axis)
    back = N(tb.rht(T(want), d, signs, bf16_in=False, bf16_out=False, inverse=True, impl="triton"))
    ref = fpsim.rht(want, d, signs, bf16_in=False, bf16_out=False, inverse=True)
    nan = np.isnan(ref)
    assert np.array_equal(np.isnan(back), nan) and same_f32(back[~nan], ref[~nan])


@pytest.mark.parametrize("metric", ["mse", "mae"])
@pytest.mark.parametrize("rounding", ["rne", "sr"])
@pytest.mark.parametrize("shape", [(48, 64), (40, 75)], ids=["whole", "ragged"])
def test_four_over_six_on_16x16_tiles_is_the_references(metric, rounding, shape):
    """Four-over-six on 16×16 weight tiles in the one-pass 2-D kernel: each tile's error summed over its rows then
    columns in float64, as the reference sums it, so the same candidate wins in every tile (codes, scales, fake)."""
    rng = np.random.default_rng(11)
    x = (rng.standard_t(3, shape) * np.exp2(rng.integers(-6, 6, shape))).astype(np.float32)
    x[0, :5] = 0.0
    x[17, 3] = 3e4
    sch = fpsim.get_scheme("nvfp4").replace(four_over_six=True, four_over_six_metric=metric)
    plan = fpsim.plan.lower(sch, block=(16, 16), rounding=rounding)
    kw = {"seed": 9} if rounding == "sr" else {}
    assert tb.route(plan, T(x), "triton") == "triton"
    ref = fpsim.quantize(x, plan, **kw)
    got = tb.quantize(T(x), plan, impl="triton", **kw)
    assert np.array_equal(N(got.data), ref.data) and np.array_equal(N(got.scales), ref.scales)
    assert same_f32(N(tb.fake_quantize(T(x), plan, impl="triton", **kw)), fpsim.fake_quantize(x, plan, **kw))
    four = fpsim.quantize(x, plan.scheme.replace(four_over_six=False), block=(16, 16), rounding=rounding, **kw)
    assert not np.array_equal(four.scales, ref.scales)  # some tiles did take the other candidate
