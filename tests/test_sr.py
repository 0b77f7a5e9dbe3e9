"""Stochastic rounding (SPEC §3) and its counter-based random bits."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import fpsim
from fpsim.formats import get_format
from fpsim.random import philox4x32, random_bits
from tests.conftest import CODED
from tests.reference import f32_bits, grid, ref_sr

# Random123's known-answer vectors for Philox4x32-10 (kat_vectors): (counter, key, output).
PHILOX_KAT = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    (
        (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344),
        (0xA4093822, 0x299F31D0),
        (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1),
    ),
]


@pytest.mark.parametrize("counter,key,want", PHILOX_KAT)
def test_philox_known_answers(counter, key, want):
    assert philox4x32(counter, key) == want


def test_stream_layout_is_little_endian_bytes_of_each_block():
    """Element i of an 8-bit stream is byte i % 16 of block i // 16 (SPEC §3: one block = one NVFP4 block)."""
    w = philox4x32((0, 0, 0, 0), (7, 0))
    block0 = np.array(w, dtype="<u4").view(np.uint8)
    assert np.array_equal(random_bits(7, 16, k=8), block0)
    w1 = philox4x32((1, 0, 0, 0), (7, 0))
    assert np.array_equal(random_bits(7, 32, k=8)[16:], np.array(w1, dtype="<u4").view(np.uint8))
    assert np.array_equal(random_bits(7, 8, k=16), np.array(w, dtype="<u4").view("<u2"))
    assert np.array_equal(random_bits(7, 8, k=13), np.array(w, dtype="<u4").view("<u2") & 0x1FFF)
    assert np.array_equal(random_bits(7, 4, k=24), np.array(w, dtype="<u4") & 0xFFFFFF)
    # seeds above 2**32 use the second key word; counter offsets continue the stream
    want = np.array(philox4x32((0, 0, 0, 0), (3, 5)), "<u4").view(np.uint8)
    assert np.array_equal(random_bits(5 << 32 | 3, 16), want)
    assert np.array_equal(random_bits(7, 64)[32:], random_bits(7, 32, counter=2))


def test_random_bits_validation():
    with pytest.raises(ValueError, match="seed must be in"):
        random_bits(-1, 4)
    with pytest.raises(TypeError, match="seed must be an integer"):
        random_bits(1.5, 4)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="k must be in"):
        random_bits(0, 4, k=33)


# (x, r) → E2M1 code with k = 8, each derived by hand from t = fl(|x| + r/256 · step):
SR_TABLE = [
    (1.25, 127, 0x2),  # 1.25 + 127/512 < 1.5 → 1.0
    (1.25, 128, 0x3),  # 1.25 + 128/512 = 1.5 → 1.5
    (0.1, 204, 0x0),  # subnormal range, step 0.5: 0.1 + 204/512 = 0.498… → 0
    (0.1, 205, 0x1),  # 0.1 + 205/512 = 0.5004 → 0.5
    (5.0, 127, 0x6),  # step 2: 5 + 127/128 < 6 → 4
    (5.0, 128, 0x7),  # 5 + 1 = 6 → 6
    (-1.25, 128, 0xB),  # sign carried: −1.5
    (3.0, 255, 0x5),  # on the grid: never moves
    (7.0, 0, 0x7),  # |x| ≥ max → max
    (-1e30, 200, 0xF),
    (float("inf"), 3, 0x7),
    (float("nan"), 3, 0x7),  # NaN → +6 as in §2
    (-0.0, 255, 0x8),
]


@pytest.mark.parametrize("x,r,want", SR_TABLE)
def test_sr_exact_table_e2m1(x, r, want):
    got = fpsim.encode(np.array([x], np.float32), "e2m1", "sr", rbits=np.array([r]), k=8)
    assert got.tolist() == [want]
    assert ref_sr(f32_bits(np.float32(x)), get_format("e2m1"), r, 8) == want


def test_sr_single_rounding_of_the_fma_is_modelled():
    """k = 24, x = 4 + 2**-21: the exact sum crosses 6 only for r ≥ 2**24 − 4, but fl32 rounds it up from 2**24 − 6.

    This is the one float32 rounding of ``t = fl(a + u·step)`` in SPEC §3 (what TE's emulation and the
    hardware's FMA do); exact-arithmetic SR would give 4 for r = 2**24 − 6 and 2**24 − 5.
    """
    x = np.float32(4 + 2.0**-21)
    r = np.array([2**24 - 7, 2**24 - 6, 2**24 - 5, 2**24 - 4])
    got = fpsim.encode(np.full(4, x), "e2m1", "sr", rbits=r, k=24)
    assert got.tolist() == [0x6, 0x7, 0x7, 0x7]


@given(
    fmt=st.sampled_from(CODED),
    k=st.integers(1, 24),
    data=st.data(),
)
def test_sr_matches_reference(fmt, k, data):
    """Kernel SR equals the exact-rational SPEC §3 formula for random inputs, bits and k."""
    s = get_format(fmt)
    xs = data.draw(st.lists(st.integers(0, 0xFFFFFFFF), min_size=1, max_size=16))
    rs = data.draw(st.lists(st.integers(0, 2**k - 1), min_size=len(xs), max_size=len(xs)))
    x = np.array(xs, np.uint32).view(np.float32)
    got = fpsim.encode(x, s, "sr", rbits=np.array(rs), k=k)
    want = [ref_sr(v, s, r, k) for v, r in zip(xs, rs)]
    assert got.tolist() == want


@given(
    fmt=st.sampled_from(CODED),
    x=st.floats(width=32, allow_nan=False, allow_infinity=False),
    seed=st.integers(0, 2**64 - 1),
)
def test_sr_result_is_a_neighbour(fmt, x, seed):
    """SR returns one of the two grid neighbours of x (or max when |x| ≥ max)."""
    s = get_format(fmt)
    q = float(fpsim.decode(fpsim.encode(np.float32(x), s, "sr", seed=seed), s))
    if not s.signed:
        x = abs(x)
    vals = [float(v) for v in grid(s)[0]]
    a = abs(x)
    if a >= vals[-1]:
        assert abs(q) == vals[-1]
    elif s.subnormals or a >= vals[0]:
        lo = max(v for v in vals if v <= a)
        hi = min(v for v in vals if v >= a)
        assert abs(q) in (lo, hi) and (q == 0 or np.sign(q) == np.sign(x))


def test_sr_monotone_in_random_bits():
    """For fixed x the code is non-decreasing in r: P(up) = (#r above a threshold) / 2**k."""
    x = np.float32(2.3)
    r = np.arange(256)
    codes = fpsim.encode(np.full(256, x), "e2m1", "sr", rbits=r, k=8).astype(int)
    assert np.all(np.diff(codes) >= 0) and set(codes) == {0x4, 0x5}
    # threshold: 2.3 + r/256 ≥ 3 ⇔ r ≥ 0.7·256 = 179.2 → 76 of 256 draws go up
    assert (codes == 0x5).sum() == 76


@pytest.mark.parametrize("fmt,k", [("e2m1", 8), ("e4m3", 16), ("e5m2", 16), ("bf16", 16), ("e2m1", 24), ("e2m1", 4)])
def test_sr_is_unbiased_within_two_to_minus_k(fmt, k):
    """Mean of SR over 2**16 Philox draws is within 2**-k·step (quantisation of P(up)) + 5σ of x."""
    s = get_format(fmt)
    rng = np.random.default_rng(3)
    xs = rng.uniform(-0.9, 0.9, 12).astype(np.float32) * np.float32(s.max)
    n = 1 << 16
    for i, x in enumerate(xs):
        q = fpsim.decode(fpsim.encode(np.full(n, x), s, "sr", seed=1000 + i, k=k), s).astype(np.float64)
        lo, hi = (float(v) for v in _neighbours(s, float(x)))
        step = hi - lo
        bias = q.mean() - float(x)
        sigma = step * 0.5 / np.sqrt(n)
        assert abs(bias) <= step * 2.0**-k + 5 * sigma, (fmt, k, float(x), bias, step)


def _neighbours(s, x):
    vals = grid(s)[0]
    a = abs(x)
    lo = max(v for v in vals if v <= a)
    hi = min(v for v in vals if v >= a)
    return (lo, hi) if x >= 0 else (-hi, -lo)


def test_sr_bias_of_few_bits_is_measurable():
    """P(up) is quantised to 2**-k: with k = 2, x = 1.1 (exact P(up) = 0.2) needs u ≥ 0.8, which
    no r/4 reaches, so SR always returns 1.0: bias −0.1 = −0.2·step, inside the 2**-k·step bound."""
    n = 1 << 12
    q = fpsim.decode(fpsim.encode(np.full(n, np.float32(1.1)), "e2m1", "sr", seed=9, k=2), "e2m1")
    assert np.all(q == 1.0)
    assert abs(q.mean() - 1.1) <= 0.5 * 2.0**-2
    # with k = 8 the same value rounds up 51/256 of the time (r ≥ 204.8 → r ∈ 205..255)
    r = np.arange(256)
    up = fpsim.encode(np.full(256, np.float32(1.1)), "e2m1", "sr", rbits=r, k=8) == 0x3
    assert up.sum() == 51


def test_sr_same_seed_same_bits_and_rbits_path_agrees():
    x = np.random.default_rng(0).standard_normal((33, 17)).astype(np.float32) * 3
    a = fpsim.encode(x, "e2m1", "sr", seed=42)
    assert np.array_equal(a, fpsim.encode(x, "e2m1", "sr", seed=42))
    assert not np.array_equal(a, fpsim.encode(x, "e2m1", "sr", seed=43))
    r = random_bits(42, x.size, k=8).reshape(x.shape)
    assert np.array_equal(a, fpsim.encode(x, "e2m1", "sr", rbits=r))
    b = fpsim.encode(x, "bf16", "sr", seed=42, counter=5)
    r16 = random_bits(42, x.size, k=16, counter=5).reshape(x.shape)
    assert np.array_equal(b, fpsim.encode(x, "bf16", "sr", rbits=r16))


def test_sr_rbits_validation():
    x = np.ones(4, np.float32)
    with pytest.raises(ValueError, match="shape of x"):
        fpsim.encode(x, "e2m1", "sr", rbits=np.zeros(3, int))
    with pytest.raises(ValueError, match=r"\[0, 2\*\*8\)"):
        fpsim.encode(x, "e2m1", "sr", rbits=np.full(4, 256))
    with pytest.raises(TypeError, match="integers"):
        fpsim.encode(x, "e2m1", "sr", rbits=np.zeros(4))
    with pytest.raises(ValueError, match="k must be in"):
        fpsim.encode(x, "e2m1", "sr", seed=0, k=25)
