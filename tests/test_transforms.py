"""Random Hadamard transform (SPEC §7): against scipy.linalg.hadamard, orthogonality, inverse, GEMM identity."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from scipy.linalg import hadamard

from fpsim.transforms import RECIPE_SIGNS, derive_seed, hadamard_matrix, rht, sign_vector

EXACT = {"bf16_in": False, "bf16_out": False}


def test_recipe_sign_vector_is_the_spec_vector():
    spec = [+1, +1, +1, -1, +1, -1, -1, -1, -1, -1, -1, +1, -1, +1, -1, -1]
    assert RECIPE_SIGNS.tolist() == spec and sign_vector(16).tolist() == spec


@pytest.mark.parametrize("d", [2, 4, 8, 16, 32, 64, 128, 256])
@pytest.mark.parametrize("signs", ["none", 7])
def test_equals_scipy_hadamard_product(d, signs):
    """y = (x ∘ s) · H_d / sqrt(d) with H_d from scipy.linalg.hadamard, to float32 rounding."""
    rng = np.random.default_rng(d)
    x = rng.standard_normal((5, 3 * d)).astype(np.float32)
    s = sign_vector(d, signs).astype(np.float64)
    ref = ((x.reshape(5, 3, d).astype(np.float64) * s) @ hadamard(d) / np.sqrt(d)).reshape(5, 3 * d)
    y = rht(x, d, signs, **EXACT)
    tol = 4 * np.log2(d) * np.finfo(np.float32).eps * np.abs(x).max() * np.sqrt(d)
    assert np.max(np.abs(y - ref)) <= tol


def test_integer_inputs_are_transformed_exactly_for_d16():
    """Small integers: every butterfly sum is exact and 1/sqrt(16) = 0.25 is exact, so y equals the exact product."""
    x = np.arange(-48, 48, dtype=np.float32).reshape(6, 16)
    want = (x.astype(np.float64) * RECIPE_SIGNS) @ hadamard(16) / 4
    assert np.array_equal(rht(x, 16, **EXACT), want.astype(np.float32))


def test_r_times_r_transpose_is_identity():
    for d in (2, 16, 128):
        r = hadamard_matrix(d, signs=3)
        assert np.allclose(r @ r.T, np.eye(d), atol=1e-12)


@given(
    d=st.sampled_from([2, 4, 8, 16, 32, 64, 128, 256]),
    rows=st.integers(1, 4),
    tiles=st.integers(1, 3),
    seed=st.integers(0, 2**32),
)
def test_rht_preserves_the_norm_of_every_tile(d, rows, tiles, seed):
    """R is orthogonal: each tile's Euclidean norm is preserved to float32 rounding."""
    x = np.random.default_rng(seed).standard_normal((rows, tiles * d)).astype(np.float32)
    y = rht(x, d, seed, **EXACT)
    nx = np.linalg.norm(x.reshape(rows, tiles, d).astype(np.float64), axis=-1)
    ny = np.linalg.norm(y.reshape(rows, tiles, d).astype(np.float64), axis=-1)
    assert np.allclose(nx, ny, rtol=1e-5 * np.log2(2 * d))


@given(hnp.arrays(np.float32, (3, 32), elements=st.floats(-1e6, 1e6, width=32)))
def test_inverse_undoes_the_transform(x):
    """rht(rht(x), inverse=True) = x to float32 rounding (the exact mode)."""
    back = rht(rht(x, 16, **EXACT), 16, inverse=True, **EXACT)
    assert np.allclose(back, x, rtol=1e-5, atol=1e-6 * max(1.0, float(np.abs(x).max())))


def test_rotated_gemm_equals_the_plain_gemm():
    """(A·R)(Rᵀ·B) = A·B: A rotated along its last axis, B along its first (the reduction axis)."""
    rng = np.random.default_rng(1)
    a = rng.standard_normal((8, 64)).astype(np.float32)
    b = rng.standard_normal((64, 5)).astype(np.float32)
    ar = rht(a, 16, axis=-1, **EXACT)
    br = rht(b, 16, axis=0, **EXACT)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    got = ar.astype(np.float64) @ br.astype(np.float64)
    assert np.allclose(got, ref, rtol=1e-5, atol=1e-5)


def test_bf16_rounding_of_input_and_output():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((4, 32)).astype(np.float32)
    y = rht(x)  # the recipe: BF16 in, BF16 out
    assert np.all(y.view(np.uint32) & 0xFFFF == 0)
    xb = (x.view(np.uint32) + 0x7FFF + ((x.view(np.uint32) >> 16) & 1)) & 0xFFFF0000
    exact_on_bf16 = rht(xb.view(np.float32), bf16_in=False, bf16_out=False)
    want = (exact_on_bf16.view(np.uint32) + 0x7FFF + ((exact_on_bf16.view(np.uint32) >> 16) & 1)) & 0xFFFF0000
    assert np.array_equal(y.view(np.uint32), want)


def test_rht_suppresses_an_outlier():
    """One large value in a tile is spread evenly over all 16 outputs: max|y| = max|x|/4."""
    x = np.zeros((1, 16), np.float32)
    x[0, 5] = 100.0
    y = rht(x, **EXACT)
    assert np.allclose(np.abs(y), 25.0)


def test_seeded_signs_are_deterministic_and_distinct():
    a, b = sign_vector(64, 1), sign_vector(64, 2)
    assert np.array_equal(a, sign_vector(64, 1)) and not np.array_equal(a, b)
    assert set(np.unique(a)) == {-1.0, 1.0}
    assert derive_seed(1, "layer.3", 10) == derive_seed(1, "layer.3", 10) != derive_seed(1, "layer.3", 11)
    assert derive_seed(0, "x") == 0x840094105a7bfb92  # pinned: BLAKE2b, stable across processes and platforms


def test_axis_shapes_and_errors():
    x = np.random.default_rng(0).standard_normal((32, 3, 2)).astype(np.float32)
    y = rht(x, 16, axis=0, **EXACT)
    assert y.shape == x.shape
    assert np.allclose(y[:, 1, 0], rht(x[:, 1, 0], 16, **EXACT))
    assert rht(np.empty((0, 16)), 16).shape == (0, 16)
    with pytest.raises(ValueError, match="power of two"):
        rht(np.zeros(12), 12)
    with pytest.raises(ValueError, match="not a multiple"):
        rht(np.zeros(20), 16)
    with pytest.raises(ValueError, match="16 entries"):
        rht(np.zeros(32), 32)
    with pytest.raises(ValueError, match="±1"):
        sign_vector(4, np.array([1, 0, 1, 1]))
    with pytest.raises(ValueError, match="unknown sign policy"):
        sign_vector(16, "random")
