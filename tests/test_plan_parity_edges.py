"""Backend parity where tests/test_plan_parity.py does not look: generated plans with the directed roundings (rup,
rdown), odd block shapes, one-row / one-column / zero-size tensors, random float32 bit patterns (every exponent,
subnormal block maxima), float16 / bfloat16 / float64 inputs and given tensor amaxes; the RHT with every
size, sign policy and flag.  Three cases get tests of their own, as each once went wrong:

* FP32 block scales with 4-bit elements (a ``BlockScheme(…, "e2m1", "float32", (1, W))``): codes are packed two
  to a byte, written and decoded as such;
* stochastic rounding to E8M0 through ``backend="torch-cpu"`` is handed to the reference;
* zero-size tensors (no rows, or an empty quantized axis) pass through every backend's SR stream, decoders and RHT.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fpsim
from fpsim import backends
from fpsim.formats import FormatSpec, NanStyle
from fpsim.plan import lower
from tests.bitcompare import assert_same, same_bits

torch = pytest.importorskip("torch", reason="torch not installed (pip install 'fpsim[torch]')")
from fpsim.torch import backend as tb  # noqa: E402
from fpsim.torch.quantize import triton_unsupported  # noqa: E402
from fpsim.torch.runtime import triton_available  # noqa: E402

pytestmark = [pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning"),
              pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning"),
              pytest.mark.filterwarnings("ignore:divide by zero encountered:RuntimeWarning")]

F32 = np.float32
DEV = "cuda" if torch.cuda.is_available() else "cpu"
TRITON = pytest.mark.skipif(not triton_available(), reason="Triton cannot run here")
#: Test-only formats, as in tests/test_plan_parity.py: an 8-bit E3M4 element and an unsigned 5/3 scale format.
E3M4 = FormatSpec("float8_e3m4", 3, 4, 3)
UE5M3 = FormatSpec("float8_ue5m3", 5, 3, 15, signed=False, nan=NanStyle.ALL_ONES)


def _bases():
    two = fpsim.get_scheme("nvfp4")
    mx = fpsim.get_scheme("mxfp4")
    fp8 = fpsim.get_scheme("fp8_block128")
    out = [two, two.replace(name="fos", four_over_six=True),
           two.replace(name="fos_mae", four_over_six=True, four_over_six_metric="mae"),
           two.replace(name="per_row", per_row_scale=True), two.replace(name="no_ts", tensor_scale=False),
           two.replace(name="e3m4_e4m3", element=E3M4), two.replace(name="e2m1_ue5m3", scale=UE5M3),
           two.replace(name="e4m3_e4m3", element="e4m3"), two.replace(name="e2m1_e5m2", scale="e5m2")]
    out += [mx.replace(name=f"mx_{getattr(el, 'name', el)}", element=el)
            for el in ("e2m1", "e2m3", "e3m2", "e4m3", "e5m2", E3M4)]
    out += [fp8.replace(name=f"fp8_{el}_blocks", element=el) for el in ("e4m3", "e5m2", "e2m1")]
    out += [fpsim.get_scheme("fp8_e4m3"), fpsim.get_scheme("fp8_e5m2"), fpsim.get_scheme("bf16"),
            fpsim.BlockScheme("fp16", "float16", None, None)]
    return out


BASES = _bases()
BLOCKS = [(1, 16), (16, 16), (1, 32), (32, 32), (1, 128), (1, 8), (2, 4), (1, 2), (4, 8)]
ROUNDINGS = [("rne", None), ("rtz", None), ("rna", None), ("rup", None), ("rdown", None), ("sr", None), ("sr", 3),
             ("sr", 16), ("sr", 24)]
SHAPES = [((33, 130), -1), ((48, 64), 0), ((1, 40), -1), ((40, 1), 0), ((40, 1), -1), ((17, 33), 0),
          ((2, 3, 37), 1), ((5,), 0), ((1, 1), -1), ((0, 16), -1), ((16, 0), -1), ((3, 0, 5), 1)]
SPECIALS = [np.nan, np.inf, -np.inf, -0.0, F32(3e38), F32(1e-45), F32(2.5 * 448 / 6)]


def _data(rng, shape, kind: int) -> np.ndarray:
    """0: random float32 bit patterns (NaN replaced), every exponent; 1: one random binade range, subnormals
    included; 2: multiples of 1/8 at one power of two (grid points and ties); 3: heavy-tailed over 24 binades."""
    n = int(np.prod(shape))
    if kind == 0:
        x = rng.integers(0, 1 << 32, n, dtype=np.uint64).astype(np.uint32).view(F32)
        x = np.where(np.isnan(x), F32(1.0), x)
    elif kind == 1:
        e = float(rng.integers(-150, 125))
        x = rng.standard_normal(n) * np.exp2(e + rng.integers(-4, 4, n))
    elif kind == 2:
        x = rng.integers(-64, 65, n) / 8 * np.exp2(float(rng.integers(-20, 20)))
    else:
        x = rng.standard_t(2, n) * np.exp2(rng.integers(-12, 12, n))
    return np.asarray(x, F32).reshape(shape)


def _plan(rng, triton: bool):
    """A generated plan (one the Triton kernels take, with ``triton``), or None where the combination is refused."""
    base = BASES[rng.integers(len(BASES))]
    blk = None if base.block is None else BLOCKS[rng.integers(len(BLOCKS))]
    rnd, k = ROUNDINGS[rng.integers(len(ROUNDINGS))]
    rule = ["floor", "ceil", "even", "rceil"][rng.integers(4)] if base.kind.value == "pow2" else None
    nan = ["propagate", "ignore"][rng.integers(2)]
    try:
        plan = lower(base, block=blk, rounding=rnd, scale_rule=rule, k=k, nan_amax=nan)
    except ValueError:  # a combination the scheme refuses (per-row scales on 2-D tiles, odd 4-bit widths, …)
        return None
    return None if triton and triton_unsupported(plan) is not None else plan


def _case(seed: int, triton: bool = False):
    """(plan, x, axis, sr kwargs) of one generated case, or None where the combination is refused."""
    rng = np.random.default_rng(seed)
    plan = None
    for _ in range(40 if triton else 1):  # most combinations have no Triton kernel: draw until one has
        plan = _plan(rng, triton)
        if plan is not None:
            break
    if plan is None:
        return None
    shape, axis = SHAPES[rng.integers(len(SHAPES))]
    if plan.block is not None and plan.block[0] > 1 and len(shape) != 2:
        shape, axis = ((shape[0], 1), axis) if len(shape) == 1 else (shape[::2], axis if axis < 1 else -1)
    if triton and int(np.prod(shape)) > 1200:  # the interpreter is slow: small tensors carry the ragged edges
        shape = (9, shape[1]) if axis == -1 else (shape[0], 9)
    x = _data(rng, shape, int(rng.integers(4)))
    if x.size and rng.random() < 0.5:
        x.reshape(-1)[rng.integers(x.size)] = SPECIALS[rng.integers(len(SPECIALS))]
    kw = {"seed": int(rng.integers(1 << 20)), "counter": int(rng.integers(3))} if plan.is_sr else {}
    return plan, x, axis, kw


# ---------------------------------------------------------------------------
# Defects


def _fp32_blocks_expected(x, bc, rounding, rb):
    """Independent numpy model of §6 blockwise FP32 scales with E2M1 elements, codes packed as §4 says."""
    R, C = x.shape
    nb = -(-C // bc)
    xp = np.zeros((R, nb * bc), F32)
    xp[:, :C] = x
    amax = np.abs(xp.reshape(R, nb, bc)).max(axis=2)
    d = (amax / F32(6)).astype(F32)
    d = np.where((d == 0) | (d > np.finfo(F32).max), F32(1), d).astype(F32)
    y = (xp.reshape(R, nb, bc) / d[:, :, None]).astype(F32).reshape(R, nb * bc)
    if rounding == "sr":
        rbp = np.zeros((R, nb * bc), np.int64)
        rbp[:, :C] = rb
        codes = fpsim.encode(y, "e2m1", "sr", rbits=rbp, k=8)
    else:
        codes = fpsim.encode(y, "e2m1", rounding)
    codes[:, C:] = 0
    dec = (fpsim.decode(codes, "e2m1").reshape(R, nb, bc) * d[:, :, None]).astype(F32).reshape(R, nb * bc)[:, :C]
    return fpsim.pack_fp4(codes), d, dec


@pytest.mark.parametrize("bc", [16, 32, 2])
@pytest.mark.parametrize("rounding", ["rne", "rup", "sr"])
def test_fp32_block_scales_pack_4bit_codes(bc, rounding):
    """A 4-bit element under FP32 block scales stores two codes per byte (SPEC §4 packing, §6 scales): the reference
    wrote one code per byte past its packed buffer and read unpacked bytes back; torch-cpu decodes the packed codes."""
    rng = np.random.default_rng(bc)
    x = (rng.standard_normal((7, 45)) * np.exp2(rng.integers(-8, 8, (7, 45)))).astype(F32)
    x[0] = 0
    x[1, :5] = [-0.0, 1e-45, -3e38, np.inf, 6.0]
    rb = rng.integers(0, 256, x.shape) if rounding == "sr" else None
    sch = fpsim.BlockScheme("e2m1_fp32_blocks", "e2m1", "float32", (1, bc), rounding=rounding)
    q = fpsim.quantize(x, sch, rbits=rb)
    data, d, dec = _fp32_blocks_expected(x, bc, rounding, rb)
    assert np.array_equal(q.data, data) and same_bits(q.scales, d)
    assert same_bits(q.dequantize(), dec)
    assert same_bits(fpsim.dequantize(q, backend="torch-cpu"), dec)
    if rounding != "sr":
        assert_same(fpsim.quantize(x, sch, backend="torch-cpu"), q, sch.name)
        assert same_bits(tb.fake_quantize(torch.from_numpy(x), sch).numpy(), dec)


def test_fp32_block_scales_pack_4bit_codes_on_2d_tiles():
    x = np.random.default_rng(7).standard_normal((20, 36)).astype(F32)
    sch = fpsim.BlockScheme("e2m1_fp32_tiles", "e2m1", "float32", (4, 8))
    q = fpsim.quantize(x, sch)
    tiles = np.zeros((20, 40), F32)
    tiles[:, :36] = x
    amax = np.abs(tiles.reshape(5, 4, 5, 8)).max(axis=(1, 3))
    d = np.repeat((amax / F32(6)).astype(F32), 4, axis=0)
    codes = fpsim.encode((tiles.reshape(20, 5, 8) / d[:, :, None]).astype(F32).reshape(20, 40), "e2m1")
    codes[:, 36:] = 0
    assert np.array_equal(q.data, fpsim.pack_fp4(codes)) and same_bits(q.scales, d)
    assert same_bits(fpsim.dequantize(q, backend="torch-cpu"), q.dequantize())


def test_e8m0_stochastic_rounding_is_handed_to_the_reference():
    """SR to E8M0 (SPEC §3 on the power-of-two grid): x = 3 rounds to 4 exactly when fl(3 + r/8 · 2) ≥ 4, i.e.
    r ≥ 4 of 3 bits; torch-cpu has no E8M0 SR encoder and must hand the call to the reference, not raise."""
    x = np.array([3.0, 1.0, 0.3, 5.0, 1e-40, 0.0, -2.5, np.nan, np.inf, 2.0**-127 * 1.5], F32)
    assert np.array_equal(fpsim.encode(np.full(8, 3.0, F32), "e8m0", "sr", rbits=np.arange(8), k=3),
                          [128] * 4 + [129] * 4)
    for k in (1, 3, 8, 24):
        want = fpsim.encode(x, "e8m0", "sr", seed=11, k=k, counter=2)
        assert np.array_equal(fpsim.encode(x, "e8m0", "sr", seed=11, k=k, counter=2, backend="torch-cpu"), want)
    name, why = backends.route("encode", None, "torch-cpu", fmt=fpsim.get_format("e8m0"), sr=True)
    assert name == "numba-cpu" and "subnormals" in why
    assert backends.route("encode", None, "torch-cpu", fmt=fpsim.get_format("e2m1"), sr=True) == ("torch-cpu", None)


ZERO_SHAPES = [((0, 16), -1), ((16, 0), -1), ((3, 0, 5), 1), ((3, 0, 5), 0), ((0,), 0), ((0, 32), 0)]


@pytest.mark.parametrize("scheme", ["nvfp4", "mxfp4", "mxfp8_e4m3", "fp8_block128", "fp8_e4m3", "bf16"])
@pytest.mark.parametrize("rounding", ["rne", "sr"])
def test_zero_size_tensors_on_every_backend(scheme, rounding):
    """Tensors without elements quantize and decode to the reference's (empty) arrays and shapes everywhere."""
    kw = {"seed": 3} if rounding == "sr" else {}
    for shape, axis in ZERO_SHAPES:
        x = np.zeros(shape, F32)
        want = fpsim.quantize(x, scheme, axis, rounding=rounding, **kw)
        what = f"{scheme} {shape} {axis}"
        assert_same(fpsim.quantize(x, scheme, axis, rounding=rounding, backend="torch-cpu", **kw), want, what)
        assert same_bits(fpsim.dequantize(want, backend="torch-cpu"), want.dequantize()), what
        t = torch.from_numpy(x).to(DEV)
        assert same_bits(tb.fake_quantize(t, scheme, axis, rounding=rounding, impl="eager", **kw).cpu().numpy(),
                         want.dequantize()), what
        if triton_available() and triton_unsupported(lower(scheme, rounding=rounding)) is None:
            got = tb.quantize(t, scheme, axis, rounding=rounding, impl="triton", **kw)
            assert_same(got.to_quantized(), want, what)
            assert same_bits(got.dequantize(impl="triton").cpu().numpy(), want.dequantize()), what
            assert same_bits(tb.TorchQuantized.from_quantized(want, DEV).dequantize(impl="triton").cpu().numpy(),
                             want.dequantize()), what


@pytest.mark.parametrize("d", [1, 2, 16, 64])
def test_rht_of_an_empty_axis_or_no_rows(d):
    for shape in [(4, 0), (0, d), (2, 0, 3)]:
        x = np.zeros(shape, F32)
        want = fpsim.rht(x, d, "none", axis=1 if len(shape) == 3 else -1)
        assert want.shape == shape
        assert same_bits(fpsim.rht(x, d, "none", axis=1 if len(shape) == 3 else -1, backend="torch-cpu"), want)
        for impl in ("eager",) + (("triton",) if triton_available() else ()):
            got = tb.rht(torch.from_numpy(x).to(DEV), d, "none", axis=1 if len(shape) == 3 else -1, impl=impl)
            assert same_bits(got.cpu().numpy(), want), (shape, impl)


# ---------------------------------------------------------------------------
# Generated coverage: the eager quantizer (every plan it takes) and the Triton kernels (a smaller sample)


@settings(max_examples=300)
@given(st.integers(0, 1 << 30))
def test_generated_plans_torch_cpu_equals_the_reference(seed):
    case = _case(seed)
    if case is None:
        return
    plan, x, axis, kw = case
    want = fpsim.quantize(x, plan, axis, **kw)
    ref = want.dequantize()
    what = f"{plan.scheme.name} {plan.block} {plan.rounding.value} k={plan.sr and plan.sr.k} {x.shape} {axis}"
    assert_same(fpsim.quantize(x, plan, axis, backend="torch-cpu", **kw), want, what)
    assert same_bits(fpsim.dequantize(want, backend="torch-cpu"), ref), what
    if backends.unsupported("torch-cpu", "quantize", plan) is None:
        assert same_bits(tb.fake_quantize(torch.from_numpy(x), plan, axis, impl="eager", **kw).numpy(), ref), what


@TRITON
@settings(max_examples=60)
@given(st.integers(0, 1 << 30))
def test_generated_plans_triton_equals_the_reference(seed):
    case = _case(seed, triton=True)
    if case is None:
        return
    plan, x, axis, kw = case
    want = fpsim.quantize(x, plan, axis, **kw)
    ref = want.dequantize()
    what = f"{plan.scheme.name} {plan.block} {plan.rounding.value} {x.shape} {axis}"
    t = torch.from_numpy(x).to(DEV)
    got = tb.quantize(t, plan, axis, impl="triton", **kw)
    assert_same(got.to_quantized(), want, what)
    assert same_bits(tb.TorchQuantized.from_quantized(want, DEV).dequantize(impl="triton").cpu().numpy(), ref), what
    assert same_bits(tb.fake_quantize(t, plan, axis, impl="triton", **kw).cpu().numpy(), ref), what


@settings(max_examples=60)
@given(st.integers(0, 1 << 30))
def test_generated_rht_equals_the_reference(seed):
    """Every size 1 … 512, sign policy (none, recipe, seeded, explicit), BF16 in/out, inverse, axis, specials."""
    rng = np.random.default_rng(seed)
    d = int(2 ** rng.integers(0, 10))
    signs = ["none", int(rng.integers(1 << 40)), "recipe" if d == 16 else None,
             np.where(rng.random(d) < 0.5, -1.0, 1.0).astype(F32)][rng.integers(4)]
    shape, axis = [((3, 2 * d), -1), ((d,), 0), ((2, d, 3), 1), ((d, 5), 0)][rng.integers(4)]
    x = _data(rng, shape, int(rng.integers(4)))
    x.reshape(-1)[rng.integers(x.size)] = SPECIALS[rng.integers(len(SPECIALS))]
    flags = [bool(b) for b in rng.integers(0, 2, 3)]
    want = fpsim.rht(x, d, signs, axis, *flags)
    assert same_bits(fpsim.rht(x, d, signs, axis, *flags, backend="torch-cpu"), want)
    if triton_available() and d <= 128:
        got = tb.rht(torch.from_numpy(x).to(DEV), d, signs, axis, *flags, impl="triton")
        assert same_bits(got.cpu().numpy(), want)


# ---------------------------------------------------------------------------
# Input dtypes and given tensor amaxes


@pytest.mark.parametrize("scheme", ["nvfp4", "mxfp4", "mxfp8_e5m2", "fp8_block128", "fp8_e4m3", "bf16"])
def test_16_and_64_bit_inputs_are_rounded_to_float32_first_on_every_backend(scheme):
    """SPEC §9: float64 / float16 / bfloat16 inputs go to float32 first (RNE), here with values that round to
    inf, to a float32 subnormal and past each format's max."""
    rng = np.random.default_rng(1)
    x = (_data(rng, (33, 64), 0).astype(np.float64) * np.float64(1e-30))
    x[0, :6] = [np.nan, np.inf, 1e-45 / 3, 6e4, 3.4028235e38 * 1.0000001, -7e4]
    x[1] = _data(rng, (64,), 3)
    for dt in (np.float64, np.float16, ml_dtypes.bfloat16):
        xx = x.astype(dt)
        want = fpsim.quantize(xx, scheme)
        got = fpsim.quantize(xx, scheme, backend="torch-cpu")
        assert_same(got, want, f"{scheme} {dt}")
        assert got.dtype == want.dtype
        if dt is np.float64:
            continue
        t = torch.from_numpy(xx.astype(F32)).to(torch.float16 if dt is np.float16 else torch.bfloat16).to(DEV)
        impls = ("eager",) + (("triton",) if triton_available() and triton_unsupported(lower(scheme)) is None else ())
        for impl in impls:
            assert_same(tb.quantize(t, scheme, impl=impl).to_quantized(), want, f"{scheme} {dt} {impl}")
            assert same_bits(tb.fake_quantize(t, scheme, impl=impl).cpu().numpy(), want.dequantize())


@pytest.mark.parametrize("scheme", ["nvfp4", "fp8_e4m3", "fp8_e5m2"])
def test_given_tensor_amax_on_every_backend(scheme):
    """tensor_amax= (SPEC §4's amax given, e.g. a chunk's global amax): 0, subnormal, inf, NaN, huge, exact."""
    x = _data(np.random.default_rng(2), (17, 48), 3)
    impls = ("eager",) + (("triton",) if triton_available() else ())
    for am in (0.0, -0.0, np.inf, np.nan, 1e-45, 1e-40, 3e38, 448.0, 2688.0, 1e-30):
        want = fpsim.quantize(x, scheme, tensor_amax=am)
        assert_same(fpsim.quantize(x, scheme, tensor_amax=am, backend="torch-cpu"), want, f"{scheme} {am}")
        for impl in impls:
            t = torch.from_numpy(x).to(DEV)
            assert_same(tb.quantize(t, scheme, tensor_amax=am, impl=impl).to_quantized(), want, f"{scheme} {am}")
            assert same_bits(tb.fake_quantize(t, scheme, tensor_amax=am, impl=impl).cpu().numpy(), want.dequantize())


@pytest.mark.parametrize("scheme", ["nvfp4", "mxfp6_e3m2", "fp8_block128", "fp8_e5m2", "bf16"])
@pytest.mark.parametrize("mnk", [(5, 7, 48), (1, 1, 16), (3, 4, 37), (0, 3, 32), (17, 9, 130)])
def test_gemm_fp32_on_odd_shapes(scheme, mnk):
    m, n, k = mnk
    rng = np.random.default_rng(m * 1000 + k)
    qa, qb = fpsim.quantize(_data(rng, (m, k), 3), scheme), fpsim.quantize(_data(rng, (n, k), 3), scheme)
    assert same_bits(fpsim.gemm(qa, qb, backend="torch-cpu"), fpsim.gemm(qa, qb))


def test_a_counter_past_the_philox_range_is_refused_on_every_backend():
    """The reference refuses SR counters whose last block would pass 2**63 (fpsim.validate.counter_arg); the
    dispatcher promises the same check before a torch backend runs, so both raise instead of one wrapping."""
    x = np.random.default_rng(0).standard_normal((4, 64)).astype(F32)
    last = (1 << 63) - 17  # 4 rows × 4 blocks × 1 call per block: counter + 16 must stay below 2**63
    for backend in (None, "torch-cpu"):
        assert fpsim.quantize(x, "nvfp4", rounding="sr", seed=3, counter=last, backend=backend).data.shape == (4, 32)
        with pytest.raises(ValueError, match="2\\*\\*63"):
            fpsim.quantize(x, "nvfp4", rounding="sr", seed=3, counter=last + 1, backend=backend)


@pytest.mark.parametrize("scheme", ["nvfp4", "mxfp4", "mxfp8_e4m3", "fp8_block128"])
def test_bf16_subnormal_inputs(scheme):
    """BF16 subnormals (and blocks whose amax is one) widened to float32: the eager path everywhere, the Triton
    kernels only on a GPU, where the widening is the exact hardware conversion (Triton 3.9's CPU interpreter
    widens BF16 subnormals wrongly, 1.01e-39 -> 4.41e-39, so CI cannot check the kernels here)."""
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((32, 64)) * np.float64(1e-39)).astype(ml_dtypes.bfloat16)  # mostly subnormal
    x[0, :4] = [1e-38, -9.2e-41, 0.0, 3.0]  # a normal, the smallest magnitudes, a large value in a block
    want = fpsim.quantize(x, scheme)
    t = torch.from_numpy(x.astype(F32)).to(torch.bfloat16).to(DEV)
    if DEV == "cuda" and triton_unsupported(lower(scheme)) is None:
        assert_same(tb.quantize(t, scheme, impl="triton").to_quantized(), want, scheme)
    assert_same(tb.quantize(t, scheme, impl="eager").to_quantized(), want, scheme)
