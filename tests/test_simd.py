"""The hand-written vector blocks of :mod:`fpsim._simd` against the scalar kernels and the codec tables."""

import numpy as np
import pytest
from numba import types
from numba.extending import intrinsic

import fpsim
from fpsim import _simd
from fpsim._jit import njit
from fpsim._kernels import bits_f32
from fpsim._row_kernels import e2m1_code, elem_rne
from fpsim._simd import absmax16, absmax16_nonan, e2m1_pack16, e2m1_unpack16, elem_rne16, table_decode16


@njit
def _vector_vs_scalar_e2m1(start, n, mul, buf, out):
    """Mismatches between the vector and the scalar E2M1 encoders of fl(x · mul), x every bit pattern in range."""
    bad = 0
    for base in range(start, start + n, buf.size):
        for t in range(buf.size):
            buf[t] = np.uint32(base + t)
        for k in range(0, buf.size, 16):
            e2m1_pack16(buf, k, mul, out, k // 2)
        for t in range(buf.size):
            want = e2m1_code(bits_f32(buf[t]) * mul)
            bad += ((out[t >> 1] >> (4 * (t & 1))) & 15) != want
    return bad


def test_vector_e2m1_encoder_equals_the_scalar_one_on_every_float32():
    """All 2^32 bit patterns (every exponent class, ties, ±0, subnormals, ±inf, NaN payloads), multiplier 1.

    The scalar encoder is checked against the codec in test_scaling; this makes the vector one equal to it.
    """
    buf = np.empty(1 << 16, np.uint32)
    out = np.empty(1 << 15, np.uint8)
    assert _vector_vs_scalar_e2m1(0, 1 << 32, np.float32(1.0), buf, out) == 0


@pytest.mark.parametrize("mul", [0.5, 3.0, 1.0 / 3.0, 1e-38, 6e37, 2.0 ** -140])
def test_vector_e2m1_encoder_rounds_the_scaled_product_once(mul):
    """The product fl(x · m) is the scalar kernel's (no contraction, no flush-to-zero), on a 2^24 slice."""
    buf = np.empty(1 << 16, np.uint32)
    out = np.empty(1 << 15, np.uint8)
    for start in (0, 0x3E000000, 0x40000000, 0xBF000000, 0x7F000000):
        assert _vector_vs_scalar_e2m1(start, 1 << 22, np.float32(mul), buf, out) == 0


def test_vector_e2m1_encoder_on_the_grid_and_its_ties():
    v = np.float32([0, 0.25, 0.5, 0.75, 1, 1.25, 1.5, 1.75, 2, 2.5, 3, 3.5, 4, 5, 6, 7])
    x = np.concatenate([v, -v]).view(np.uint32)
    out = np.empty(16, np.uint8)

    @njit
    def run(x, out):
        e2m1_pack16(x, 0, np.float32(1.0), out, 0)
        e2m1_pack16(x, 16, np.float32(1.0), out, 8)

    run(x, out)
    got = fpsim.unpack_fp4(out.reshape(1, -1)).ravel()
    assert list(got) == [0, 0, 1, 2, 2, 2, 3, 4, 4, 4, 5, 6, 6, 6, 7, 7] + [8, 8, 9, 10, 10, 10, 11, 12, 12, 12, 13,
                                                                           14, 14, 14, 15, 15]


def test_big_endian_nibble_packing_equals_the_little_endian_one():
    """The shuffle form (used on big-endian hosts) packs the same bytes as the 64-bit-lane form."""

    def pack_with(little):
        @intrinsic
        def pack(typingctx, codes, out):
            def codegen(context, builder, sig, args):
                v = builder.load(_simd._vptr(context, builder, sig.args[0], args[0], context.get_constant(
                    types.intp, 0), _simd._V16I), align=4)
                b = _simd._pack_nibbles_ir(builder, v, little)
                builder.store(b, _simd._vptr(context, builder, sig.args[1], args[1], context.get_constant(
                    types.intp, 0), _simd._V8B), align=1)
                return context.get_dummy_value()

            return types.void(codes, out), codegen

        @njit
        def run(codes, out):
            pack(codes, out)

        return run

    codes = np.random.default_rng(0).integers(0, 16, 16).astype(np.int32)
    a, b = np.empty(8, np.uint8), np.empty(8, np.uint8)
    pack_with(True)(codes, a)
    pack_with(False)(codes, b)
    assert np.array_equal(a, b) and np.array_equal(a, (codes[0::2] | codes[1::2] << 4).astype(np.uint8))


@pytest.mark.parametrize("ignore_nan", [False, True])
def test_vector_block_amax_equals_numpy(ignore_nan):
    rng = np.random.default_rng(int(ignore_nan))
    x = (rng.standard_normal((4096, 16)) * 10.0 ** rng.integers(-44, 38, size=(4096, 1))).astype(np.float32)
    specials = np.float32([np.nan, -np.nan, np.inf, -np.inf, -0.0, 0.0, 1e-45, -1e-45, 3.4028235e38])
    for k, s in enumerate(specials):
        x[k * 17 % 4096, k % 16] = s
        x[4000 + k, :] = s
    x[4095, :] = -np.nan
    bits = x.reshape(-1).view(np.uint32)
    got = np.empty(4096, np.uint32)

    @njit
    def run(bits, got, ignore_nan):
        for j in range(got.size):
            got[j] = absmax16_nonan(bits, 16 * j) if ignore_nan else absmax16(bits, 16 * j)

    run(bits, got, ignore_nan)
    a = np.abs(x)
    want = (np.nanmax(np.where(np.isnan(a), 0, a), axis=1) if ignore_nan else a.max(axis=1))
    isnan = np.isnan(want)
    assert np.array_equal(np.isnan(got.view(np.float32)), isnan)
    assert np.array_equal(got[~isnan], want[~isnan].view(np.uint32))
    assert ignore_nan or np.all((got[isnan] & 0x7FFFFFFF) > 0x7F800000)


def test_vector_e2m1_decoder_equals_the_table():
    """Every byte (so every code in both nibbles) times scales that are 0, subnormal, normal, huge, inf, NaN."""
    table = fpsim.get_format("e2m1").decode_table()
    codes = np.arange(256, dtype=np.uint8).reshape(-1)
    scales = np.float32([1.0, 0.0, -0.0, 1e-45, 3e-39, 448.0, 1.5, 3.4e38, np.inf, np.nan])
    sds = np.float32([1.0, 2.0 ** -100, 6e-5, 1e30, np.nan])

    @njit
    def run(codes, sv, sd, out):
        for k in range(codes.size // 8):
            e2m1_unpack16(codes, 8 * k, sv, sd, out, 16 * k)

    out = np.empty(512, np.float32)
    el = np.empty(512, np.float32)
    el[0::2] = table[codes & 15]
    el[1::2] = table[codes >> 4]
    with np.errstate(all="ignore"):
        for sv in scales:
            for sd in sds:
                run(codes, sv, sd, out)
                want = (el * sv) * sd
                both_nan = np.isnan(out) & np.isnan(want)
                assert np.array_equal(out.view(np.uint32)[~both_nan], want.view(np.uint32)[~both_nan])
                assert np.array_equal(np.isnan(out), np.isnan(want))


def test_intrinsics_refuse_strided_arrays():
    """The raw vector loads are typed for C-contiguous rows only: a strided view does not compile."""
    from numba.core.errors import TypingError

    @njit
    def run(x):
        return absmax16(x, 0)

    with pytest.raises(TypingError):
        run(np.zeros(64, np.uint32)[::2])


@njit
def _vector_vs_scalar_elem(start, n, step, mul, ea, buf, out):
    """Mismatches between the vector and scalar FP8/FP6 encoders of fl(x · mul), x = start + k · step (mod 2^32)."""
    mb, emin_b, qinv, max_code, nan_code, bits = ea
    bad = 0
    for base in range(start, start + n, buf.size * step):
        for t in range(buf.size):
            buf[t] = np.uint32((base + t * step) & 0xFFFFFFFF)
        for k in range(0, buf.size, 16):
            elem_rne16(buf, k, mul, ea, out, k)
        for t in range(buf.size):
            want = elem_rne(bits_f32(buf[t]) * mul, mb, emin_b, qinv, max_code, nan_code, bits)
            bad += out[t] != (want & 0xFF)
    return bad


@pytest.mark.parametrize("name", ["e4m3", "e5m2", "e3m2", "e2m3"])
def test_vector_fp8_fp6_encoder_equals_the_scalar_one(name):
    """Every 7th float32 bit pattern (7 is odd, so every residue of the low mantissa bits, ties included) with
    multiplier 1, all 2^32 for E4M3 (MXFP8's default), and a 2^26 slice around 1 with multiplier 1/3."""
    from fpsim.codecs import Rounding
    from fpsim.plan import elem_path

    path, ea = elem_path(fpsim.get_format(name), Rounding.RNE)
    assert path == 2
    buf = np.empty(1 << 16, np.uint32)
    out = np.empty(1 << 16, np.uint8)
    assert _vector_vs_scalar_elem(0, 1 << 32, 1 if name == "e4m3" else 7, np.float32(1.0), ea, buf, out) == 0
    assert _vector_vs_scalar_elem(0x3E000000, 1 << 26, 1, np.float32(1.0 / 3.0), ea, buf, out) == 0


@pytest.mark.parametrize("name", ["e4m3", "e5m2", "e3m2"])
def test_vector_table_decoder_equals_the_table(name):
    """Every byte through the gathering decoder, times scales that are 0, subnormal, huge, inf and NaN."""
    from fpsim.scaling import byte_table

    table = byte_table(fpsim.get_format(name))
    codes = np.random.default_rng(2).permutation(256).astype(np.uint8)

    @njit
    def run(codes, table, sv, sd, out):
        for k in range(codes.size // 16):
            table_decode16(codes, 16 * k, table, sv, sd, out, 16 * k)

    out = np.empty(256, np.float32)
    with np.errstate(all="ignore"):
        for sv in np.float32([1.0, 0.0, 1e-45, 2.0 ** -130, 3e38, np.inf, np.nan]):
            for sd in np.float32([1.0, 2.0 ** -100, 1e30]):
                run(codes, table, sv, sd, out)
                want = (table[codes] * sv) * sd
                assert np.array_equal(np.isnan(out), np.isnan(want))
                ok = ~np.isnan(want)
                assert np.array_equal(out.view(np.uint32)[ok], want.view(np.uint32)[ok])


@pytest.mark.parametrize("scheme", ["mxfp6_e3m2", "mxfp6_e2m3"])
def test_bytes_that_are_no_fp6_code_dequantize_to_nan(scheme):
    """A hand-made or corrupt 6-bit ``.data`` byte ≥ 64 decodes to NaN (never reads past the code table)."""
    x = np.random.default_rng(3).standard_normal((2, 64)).astype(np.float32)
    q = fpsim.quantize(x, scheme)
    data = q.data.copy()
    data[0, 5] = 64
    data[1, 63] = 255
    bad = fpsim.QuantizedTensor(data, q.scales, q.amax, q.scheme, q.shape, q.dtype, q.axis).dequantize()
    good = q.dequantize()
    assert np.isnan(bad[0, 5]) and np.isnan(bad[1, 63])
    mask = np.ones(x.shape, bool)
    mask[0, 5] = mask[1, 63] = False
    assert np.array_equal(bad[mask].view(np.uint32), good[mask].view(np.uint32))


@pytest.mark.parametrize("d", [16, 32, 128])
@pytest.mark.parametrize("flags", range(8))
def test_vector_rht_equals_the_scalar_loop(d, flags):
    """Every combination of BF16 input, BF16 output and inverse, on data over all float32 exponent classes
    (NaN, ±inf, ±0, subnormals, sums that overflow): the vector paths give the scalar transform's bits."""
    from fpsim.transforms import _rht_rows, _rht_rows_scalar, sign_vector

    rng = np.random.default_rng(flags)
    bits = rng.integers(0, 2**32, size=(64, 256), dtype=np.uint64).astype(np.uint32)
    x = bits.view(np.float32).copy()
    x[:32] = (rng.standard_normal((32, 256)) * 10.0 ** rng.integers(-44, 38, size=(32, 1))).astype(np.float32)
    x[40, :16] = [np.nan, np.inf, -np.inf, -0.0, 0.0, 1e-45, -1e-45, 3.4e38, 3.4e38, -3.4e38, 1, 2, 3, 4, 5, 6]
    signs = sign_vector(d, 7)
    scale = np.float32(1.0 / np.sqrt(d))
    bf_in, bf_out, inverse = bool(flags & 1), bool(flags & 2), bool(flags & 4)
    got, want = np.empty_like(x), np.empty_like(x)
    _rht_rows(x, got, signs, d, scale, bf_in, bf_out, inverse)
    _rht_rows_scalar(x, want, signs, d, scale, bf_in, bf_out, inverse)
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(got), nan)
    assert np.array_equal(got.view(np.uint32)[~nan], want.view(np.uint32)[~nan])
    if bf_out:  # BF16 output: NaN is the canonical 0x7FC00000 on both sides
        assert np.all(got.view(np.uint32)[nan] == 0x7FC00000)
