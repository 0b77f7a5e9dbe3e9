"""Parity over plans, not presets (issue 15): every backend that claims a plan returns the reference's bytes.

Plans are generated across every scheme × option combination (presets and custom schemes with test-only
formats, block shapes 1×16 / 16×16 / 1×32 / 32×32 / 1×128, roundings rne / rtz / rna / sr with seeds and
k, four-over-six by both metrics, per-row scales, every MX scale rule, both NaN policies, axes) on ragged
shapes holding the special values.  Where ``fpsim.backends`` says torch-cpu runs a plan, its codes,
scales, amax, dequantized and fake-quantized values must equal the Numba reference's; the Triton kernels
(under the interpreter on CPU tensors, compiled on a GPU) are checked on a seeded sample of the plans they
take.  The test-only formats are first checked against the scalar reference of tests/scaling_reference.py.
"""

from __future__ import annotations

import itertools
import os
import random

import numpy as np
import pytest

import fpsim
from fpsim import backends
from fpsim.formats import FormatSpec, NanStyle
from fpsim.plan import lower
from tests import scaling_reference as SR
from tests.bitcompare import assert_same, same_bits

torch = pytest.importorskip("torch", reason="torch not installed (pip install 'fpsim[torch]')")
from fpsim.torch import backend as tb  # noqa: E402
from fpsim.torch.quantize import triton_unsupported  # noqa: E402
from fpsim.torch.runtime import triton_available  # noqa: E402

pytestmark = [pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning"),
              pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning"),
              pytest.mark.filterwarnings("ignore:divide by zero encountered:RuntimeWarning")]

#: Test-only formats: an 8-bit element with 3 exponent / 4 mantissa bits, and an unsigned 5/3 scale format.
E3M4 = FormatSpec("float8_e3m4", 3, 4, 3)
UE5M3 = FormatSpec("float8_ue5m3", 5, 3, 15, signed=False, nan=NanStyle.ALL_ONES)

BLOCKS = [(1, 16), (16, 16), (1, 32), (32, 32), (1, 128)]
ROUNDINGS = [("rne", None), ("rtz", None), ("rna", None), ("sr", None), ("sr", 5), ("sr", 20)]
GPU = torch.cuda.is_available()
DEV = "cuda" if GPU else "cpu"
#: Plans the Triton kernels are checked on: a seeded sample (each constexpr combination compiles once on a GPU;
#: the interpreter is slow).
TRITON_SAMPLE = int(os.environ.get("FPSIM_TRITON_PLANS", "160" if GPU else "36"))


def _bases():
    two = fpsim.get_scheme("nvfp4")
    mx = fpsim.get_scheme("mxfp4")
    fp8 = fpsim.get_scheme("fp8_block128")
    yield "two_level", two
    yield "two_level", two.replace(name="nvfp4_46_mse", four_over_six=True)
    yield "two_level", two.replace(name="nvfp4_46_mae", four_over_six=True, four_over_six_metric="mae")
    yield "two_level", two.replace(name="nvfp4_per_row", per_row_scale=True)
    yield "two_level", two.replace(name="e2m1_e4m3_no_tensor_scale", tensor_scale=False)
    yield "two_level", two.replace(name="e3m4_e4m3", element=E3M4)
    yield "two_level", two.replace(name="e2m1_ue5m3", scale=UE5M3)
    yield "two_level", two.replace(name="e2m1_ue5m3_46", scale=UE5M3, four_over_six=True)
    for el in ("e2m1", "e2m3", "e3m2", "e4m3", "e5m2", E3M4):
        yield "pow2", mx.replace(name=f"mx_{getattr(el, 'name', el)}", element=el)
    for el in ("e4m3", "e5m2"):
        yield "fp32", fp8.replace(name=f"fp8_{el}_blocks", element=el)
        yield "fp32_tensor", fpsim.get_scheme(f"fp8_{el}")
    yield "cast", fpsim.get_scheme("bf16")


def _plans():
    """(id, plan, seed, counter) for every combination the schemes accept."""
    out = []
    for kind, base in _bases():
        blocks = [None] if kind in ("cast", "fp32_tensor") else BLOCKS
        rules = [r.value for r in fpsim.ScaleRule] if kind == "pow2" else [None]
        for blk, (rnd, k), rule, nan in itertools.product(blocks, ROUNDINGS, rules, ("propagate", "ignore")):
            if kind == "cast" and nan == "ignore":
                continue
            try:
                plan = lower(base, block=blk, rounding=rnd, scale_rule=rule, k=k, nan_amax=nan)
            except ValueError:  # a combination the scheme rejects (per-row scales on 2-D tiles, …)
                continue
            seed = (len(out) * 7919) % 1000 if plan.is_sr else None
            pid = f"{base.name}-{blk}-{rnd}{k or ''}-{rule or ''}-{nan}"
            out.append((pid, plan, seed, len(out) % 3 if plan.is_sr else 0))
    for name in fpsim.conventions.names():  # the producer conventions (issue 47): NVFP4, RNE, NaN propagated
        if name != "fpsim":
            out.append((f"nvfp4-convention-{name}", lower("nvfp4", convention=name), None, 0))
    return out


PLANS = _plans()


def _data(shape, seed, nan: bool):
    """Heavy-tailed values over many binades with zero, −0, subnormal, tie, huge and inf entries (and a NaN)."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_t(2, shape) * np.exp2(rng.integers(-12, 12, shape))).astype(np.float32)
    x2 = x.reshape(-1, shape[-1])
    x2[0, :] = 0
    x2[1, ::3] = -0.0
    x2[2, :] = rng.standard_normal(shape[-1]).astype(np.float32) * np.float32(1e-41)
    x2[3, :] = rng.integers(-12, 13, shape[-1]).astype(np.float32) / 2  # E2M1 ties
    x2[4, 5] = np.float32(3e38)
    x2[5, 9] = -np.inf
    x2[-1, -1] = np.float32(2.5 * 448 / 6)
    if nan:
        x2[6, 2] = np.nan
    return x


def _case(plan, i):
    """(input, axis) of plan number i: ragged 2-D along either axis, or 3-D along the middle axis (1-D blocks)."""
    if plan.block is not None and plan.block[0] > 1:
        return _data((40, 72), i, i % 4 == 1), (-1 if i % 2 else 0)
    shape, axis = [((40, 72), -1), ((40, 72), 0), ((3, 8, 50), 1)][i % 3]
    return _data(shape, i, i % 4 == 1), axis


# ---------------------------------------------------------------------------
# The drift of issue 15, and the test-only formats against the scalar reference


@pytest.mark.parametrize("change", [{"four_over_six": True}, {"four_over_six": True, "four_over_six_metric": "mae"},
                                    {"per_row_scale": True}])
def test_torch_fake_quantize_equals_the_reference_for_four_over_six_and_per_row_scales(change):
    """The repro of issue 15: a 64×256 heavy-tailed tensor, NVFP4 with four-over-six or per-row scales."""
    x = np.random.default_rng(0).standard_t(2, (64, 256)).astype(np.float32)
    s = fpsim.get_scheme("nvfp4").replace(**change)
    want = fpsim.quantize(x, s).dequantize()
    assert same_bits(tb.fake_quantize(torch.from_numpy(x), s).numpy(), want)
    assert same_bits(fpsim.fake_quantize(x, s, backend="torch-cpu"), want)
    if triton_available():  # the Triton kernel: one fused pass (the interpreter on CPU tensors)
        assert same_bits(tb.fake_quantize(torch.from_numpy(x).to(DEV), s, impl="triton").cpu().numpy(), want)
        q = tb.quantize(torch.from_numpy(x).to(DEV), s, impl="triton")
        assert_same(q.to_quantized(), fpsim.quantize(x, s), str(change))


def _unpack(q):
    return fpsim.unpack_fp4(q.data) if q.scheme.element.bits == 4 else q.data


@pytest.mark.parametrize("elem,scale,kw", [(E3M4, "e4m3", {}), ("e2m1", UE5M3, {}),
                                           ("e2m1", UE5M3, {"four_over_six": True}),
                                           (E3M4, "e4m3", {"block": (16, 16)})])
def test_test_only_formats_equal_the_scalar_reference_two_level(elem, scale, kw):
    x = _data((18, 48), 3, False)
    blk = kw.get("block", (1, 16))
    sch = fpsim.BlockScheme("t", elem, scale, blk, tensor_scale=True, four_over_six=kw.get("four_over_six", False))
    q = fpsim.quantize(x, sch)
    codes, scales, amax, dec = SR.ref_two_level(x, elem, scale, blk, four_over_six=kw.get("four_over_six", False))
    assert np.array_equal(_unpack(q), codes) and np.array_equal(q.scales, scales)
    assert same_bits(np.asarray(q.amax), amax) and same_bits(q.dequantize(), dec)


@pytest.mark.parametrize("rule", ["floor", "ceil", "even", "rceil"])
def test_test_only_formats_equal_the_scalar_reference_mx(rule):
    x = _data((8, 64), 4, True)
    q = fpsim.quantize(x, fpsim.BlockScheme("t", E3M4, "e8m0", (1, 32), scale_rule=rule))
    codes, scales, dec = SR.ref_mx(x, E3M4, rule)
    assert np.array_equal(q.data, codes) and np.array_equal(q.scales, scales) and same_bits(q.dequantize(), dec)


# ---------------------------------------------------------------------------
# Plan parity: torch-cpu (through the dispatcher) and the eager entry points


def test_the_plan_set_covers_every_option():
    plans = [p for _, p, _, _ in PLANS]
    assert len(plans) > 1000
    two = [p for p in plans if p.two_level is not None]
    assert {int(p.two_level.four_over_six) for p in two} == {0, 1, 2}
    assert any(p.two_level.per_row for p in two) and any(not p.two_level.tensor_scale for p in two)
    assert {p.pow2.rule.value for p in plans if p.pow2 is not None} == {"floor", "ceil", "even", "rceil"}
    assert {p.block for p in plans} == set(BLOCKS) | {None}
    assert {p.rounding.value for p in plans} == {"rne", "rtz", "rna", "sr"}
    assert {p.nan.value for p in plans} == {"propagate", "ignore"}
    assert {p.element.name for p in plans} >= {"float8_e3m4"} and any(p.scale == UE5M3 for p in plans)
    assert {p.convention.name for p in plans} == set(fpsim.conventions.names())
    assert sum(backends.unsupported("torch-cpu", "quantize", p) is None for p in plans) > 0.9 * len(plans)


@pytest.mark.parametrize("chunk", range(8))
def test_torch_cpu_returns_the_reference_bytes_on_every_plan_it_claims(chunk):
    claimed = 0
    for i, (pid, plan, seed, counter) in enumerate(PLANS):
        if i % 8 != chunk:
            continue
        x, axis = _case(plan, i)
        kw = {"seed": seed, "counter": counter} if plan.is_sr else {}
        want = fpsim.quantize(x, plan, axis, **kw)
        ref = want.dequantize()
        if backends.unsupported("torch-cpu", "quantize", plan) is not None:
            continue
        claimed += 1
        got = fpsim.quantize(x, plan, axis, backend="torch-cpu", **kw)
        assert_same(got, want, pid)
        assert same_bits(fpsim.dequantize(got, backend="torch-cpu"), ref), pid
        t = torch.from_numpy(x)
        assert same_bits(tb.fake_quantize(t, plan, axis, impl="eager", **kw).numpy(), ref), pid
        if plan.is_sr and i % 4 == 0:  # another counter, another draw: the stream offset is honoured
            other = tb.quantize(t, plan, axis, impl="eager", seed=seed, counter=counter + 1)
            assert other.to_quantized().equals(fpsim.quantize(x, plan, axis, seed=seed, counter=counter + 1)), pid
    assert claimed > 0


# ---------------------------------------------------------------------------
# The Triton kernels (interpreter on CPU tensors; compiled on a GPU)


def _triton_sample():
    """A seeded sample of the plans the kernels take, stratified by kind (FP32-scaled plans are few)."""
    taken = [(i, c) for i, c in enumerate(PLANS) if triton_unsupported(c[1]) is None]
    rng = random.Random(15)
    out = []
    for kind in sorted({c[1].kind for _, c in taken}, key=lambda k: k.name):  # a set's order follows the hash seed
        group = [t for t in taken if t[1][1].kind is kind]
        n = max(4, TRITON_SAMPLE * len(group) // len(taken))
        out += rng.sample(group, min(n, len(group)))
    return sorted(out, key=lambda t: t[0])


def test_the_triton_sample_is_the_same_in_every_process():
    """The seeded sample must not depend on Python's string-hash seed (the kinds were taken in a set's order, so a
    given FPSIM_TRITON_PLANS gave up to six different samples)."""
    import subprocess
    import sys

    code = "from tests import test_plan_parity as t; print([i for i, _ in t._triton_sample()])"
    env = dict(os.environ, FPSIM_TRITON_PLANS="4")
    got = {subprocess.run([sys.executable, "-c", code], env=dict(env, PYTHONHASHSEED=str(seed)), check=True,
                          capture_output=True, text=True).stdout for seed in (0, 1, 2, 3)}
    assert len(got) == 1, got


@pytest.mark.skipif(not triton_available(), reason="Triton cannot run here")
def test_triton_kernels_return_the_reference_bytes_on_sampled_plans():
    sample = _triton_sample()
    kinds = {p.kind for _, (_, p, _, _) in sample}
    assert len(kinds) == 3 and any(p.is_sr for _, (_, p, _, _) in sample)
    for i, (pid, plan, seed, counter) in sample:
        x, axis = _case(plan, i)
        if not GPU:  # the interpreter is slow: a few rows are enough for 2-D tiles and ragged edges
            x = x[:33] if axis in (-1, x.ndim - 1) or x.ndim == 3 else x[:, :33]
        kw = {"seed": seed, "counter": counter} if plan.is_sr else {}
        want = fpsim.quantize(x, plan, axis, **kw)
        ref = want.dequantize()
        t = torch.from_numpy(x).to(DEV)
        got = tb.quantize(t, plan, axis, impl="triton", **kw)
        assert_same(got.to_quantized(want.dtype), want, pid)
        assert same_bits(got.dequantize(impl="triton").cpu().numpy(), ref), pid
        assert same_bits(tb.fake_quantize(t, plan, axis, impl="triton", **kw).cpu().numpy(), ref), pid


def test_producer_conventions_run_as_torch_operations_on_the_triton_path():
    """The Triton kernels take no producer convention: the torch backend says so and runs them as torch operations
    on the tensor's device (the reference's bytes; under the interpreter on CPU tensors, compiled on a GPU)."""
    x, _ = _case(lower("nvfp4"), 2)
    for name in fpsim.conventions.names():
        plan = lower("nvfp4", convention=name)
        t = torch.from_numpy(x).to(DEV)
        want = fpsim.quantize(x, "nvfp4", convention=name)
        if fpsim.conventions.is_native(plan.convention):  # fpsim's quantize parts (te-cuda decodes differently)
            assert triton_unsupported(plan) is None
            got = tb.quantize(t, plan, impl="triton") if triton_available() else tb.quantize(t, plan)
        else:
            assert name in triton_unsupported(plan) and tb.route(plan, t, "auto") == "eager"
            if triton_available():
                with pytest.raises(ValueError, match=name):
                    tb.quantize(t, plan, impl="triton")
            got = tb.quantize(t, plan)
        assert_same(got.to_quantized(), want, name)
        assert same_bits(got.dequantize(impl="triton" if triton_available() else "auto").cpu().numpy(),
                         want.dequantize()), name
        fake = tb.fake_quantize(t, plan, impl="triton" if triton_available() and name == "te-cuda" else "auto")
        assert same_bits(fake.cpu().numpy(), want.dequantize()), name  # te-cuda: Triton codes, TE's decode order


def test_route_and_unsupported_name_the_hand_off():
    """What no torch path runs is computed by the reference, and fpsim.backends says why."""
    p46 = lower(fpsim.get_scheme("nvfp4").replace(four_over_six=True, block=(32, 32)))
    assert "four-over-six" in triton_unsupported(p46)
    assert triton_unsupported(lower(fpsim.get_scheme("nvfp4").replace(four_over_six=True, block=(16, 16)))) is None
    assert backends.unsupported("torch-cpu", "quantize", p46) is None  # the eager path runs it
    assert tb.route(p46, torch.zeros(4, 32)) == "eager"
    if triton_available():
        with pytest.raises(ValueError, match="four-over-six"):
            tb.quantize(torch.zeros(4, 32), p46, impl="triton")
    name, why = backends.route("quantize", lower("nvfp4"), "torch-cpu", rbits=True)
    assert name == "numba-cpu" and "rbits" in why


@pytest.mark.skipif(not triton_available(), reason="Triton cannot run here")
@pytest.mark.parametrize("scale", ["e4m3", "e5m2", UE5M3])
def test_triton_decoder_reads_every_scale_byte_as_the_reference(scale):
    """Hand-made scale bytes 0–255 (negative, ±inf, NaN and past-the-format codes among them) decode as the
    reference's table decodes them, for ALL_ONES, IEEE and unsigned scale formats."""
    sch = fpsim.BlockScheme("t", "e2m1", scale, (1, 16), tensor_scale=True)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((16, 256)).astype(np.float32)
    q = fpsim.quantize(x, sch)
    hand = fpsim.QuantizedTensor(rng.integers(0, 256, q.data.shape).astype(np.uint8),
                                 np.arange(256, dtype=np.uint8).reshape(16, 16), q.amax, sch, q.shape, q.dtype, q.axis)
    want = fpsim.dequantize(hand)
    got = tb.TorchQuantized.from_quantized(hand, DEV).dequantize(impl="triton").cpu().numpy()
    assert same_bits(got, want)
