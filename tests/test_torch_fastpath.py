"""The fast ``gemm="blas"`` path of fpsim.torch (fpsim.torch.fastpath): every operand copy it writes decodes to
the reference's copy bit for bit, its GEMM epilogue is the bit-defined alpha, and a Linear on it gives the
reference's y, dX, dW up to FP32 summation order.  The kernels run under Triton's interpreter without CUDA."""

from __future__ import annotations

import functools

import numpy as np
import pytest

import fpsim  # noqa: E402
from fpsim.plan import lower  # noqa: E402
from fpsim.recipe import get_recipe  # noqa: E402
from fpsim.torch import backend as tb  # noqa: E402
from fpsim.torch import fastpath as fp  # noqa: E402
from fpsim.torch import nn as fnn  # noqa: E402
from fpsim.torch.gemm import bf16_exact, scaled_values_bf16, second_level_alpha  # noqa: E402
from tests.tritonenv import DEV, INTERPRETER_WARNINGS, torch  # sets TRITON_INTERPRET first

pytestmark = INTERPRETER_WARNINGS


@pytest.fixture(autouse=True)
def _fast_everywhere(monkeypatch):
    monkeypatch.setattr(fp, "IMPL", "triton")


def _bits(a):
    return np.ascontiguousarray(np.asarray(a, np.float32)).view(np.uint32)


def _data(shape, seed=0):
    rng = np.random.default_rng(seed)
    x = (rng.standard_t(3, shape) * np.exp2(rng.integers(-8, 8, shape))).astype(np.float32)
    x[0, :5] = 0.0
    x[1, 2] = -0.0
    x[2, 7] = 3e-41  # float32 subnormal
    x[-1, -1] = 2.0e4  # an outlier
    return x


PLANS = [
    ("nvfp4", {}), ("nvfp4", {"block": (16, 16)}), ("nvfp4", {"rounding": "sr"}),
    ("nvfp4", {"block": (16, 16), "rounding": "sr"}), ("nvfp4", {"block": (32, 32)}), ("mxfp4", {}),
    ("mxfp4", {"rounding": "sr"}), ("mxfp6_e2m3", {}), ("mxfp8_e4m3", {}), ("fp8_block128", {}), ("bf16", {}),
]


@pytest.mark.parametrize("shape", [(48, 64), (40, 75)], ids=["whole", "ragged"])
@pytest.mark.parametrize("name,opts", PLANS, ids=lambda v: str(v))
@pytest.mark.parametrize("bf16_in", [False, True], ids=["f32in", "bf16in"])
def test_copy_decodes_to_the_reference_copy(name, opts, shape, bf16_in):
    x = _data(shape)
    xt = torch.from_numpy(x).to(DEV)
    if bf16_in:
        xt = xt.to(torch.bfloat16)
        x = xt.float().cpu().numpy()
    sch = lower(name, **{k: v for k, v in opts.items() if k == "block"})
    rounding = opts.get("rounding")
    plan = lower(name, block=opts.get("block"), rounding=rounding)
    seed = 11 if rounding == "sr" else None
    c = fp.make_copy(xt.contiguous(), plan, seed)
    ref = fpsim.fake_quantize(x, plan, **({"seed": seed} if seed is not None else {}))
    assert np.array_equal(_bits(fp.values(c).cpu().numpy()), _bits(ref)), (name, opts, c.kind)
    if c.kind == "scaled":  # the BF16 operand is the exact e · s_b of the quantized tensor
        q = tb.quantize(torch.from_numpy(x).to(DEV), plan, **({"seed": seed} if seed is not None else {}))
        assert torch.equal(c.values.view(torch.int16), scaled_values_bf16(q).view(torch.int16))
    del sch


def test_copy_kinds_follow_the_exactness_of_the_products():
    assert fp.copy_kind(lower("nvfp4")) == fp.copy_kind(lower("nvfp4", block=(16, 16))) == "scaled"
    assert fp.copy_kind(lower("mxfp4")) == fp.copy_kind(lower("mxfp6_e3m2")) == "exact"
    assert fp.copy_kind(lower("mxfp8_e4m3")) == "f32"  # E4M3 × 2^-127 reaches below BF16's smallest subnormal
    assert fp.copy_kind(lower(fpsim.get_scheme("nvfp4").replace(per_row_scale=True))) == "f32"
    assert fp.copy_kind(lower("bf16")) == "cast"


def test_bf16_exact_gemm_takes_2d_weight_tiles():
    """Regression: 16×16 tiles (the recipe's weights) made bf16_exact false, so every Fprop GEMM of the training
    layer ran on the host (34.8 s a step on the H200 before the fix)."""
    assert bf16_exact(lower("nvfp4", block=(16, 16)))
    assert bf16_exact(lower("nvfp4"))
    assert not bf16_exact(lower(fpsim.get_scheme("nvfp4").replace(per_row_scale=True)))


@pytest.mark.parametrize("amaxes", [(3.0, 0.25), (0.0, 2.0), (float("nan"), 1.0), (1e-40, 5.0), (float("inf"), 1.0),
                                    (3e38, 3e38)])
@pytest.mark.parametrize("out", ["float32", "bfloat16"])
def test_alpha_epilogue_is_the_bit_defined_alpha(amaxes, out):
    rng = np.random.default_rng(3)
    acc = torch.from_numpy((rng.standard_normal((7, 9)) * 100).astype(np.float32)).to(DEV)
    aa, ab = (torch.full((), v, dtype=torch.float32, device=DEV) for v in amaxes)
    plan = lower("nvfp4")
    num = float(plan.two_level.num)
    a = fp.Copy(None, "scaled", aa, num, plan)
    b = fp.Copy(None, "scaled", ab, num, plan)
    want = (acc * second_level_alpha(aa, ab, num, num)).to(getattr(torch, out))
    got = fp.alpha_epilogue(acc.clone(), a, b, getattr(torch, out)).float().cpu().numpy()
    want = want.float().cpu().numpy()
    # NaN outputs are NaN (their sign and payload follow the host's conversion, which the GEMM output does not fix)
    assert np.array_equal(np.isnan(got), np.isnan(want))
    assert np.array_equal(_bits(got)[~np.isnan(got)], _bits(want)[~np.isnan(want)])


def _scaled_pair(m, n, k, seed=5, zero_b=False):
    rng = np.random.default_rng(seed)
    plan = lower("nvfp4")
    xa = torch.from_numpy((rng.standard_t(3, (m, k)) * 4).astype(np.float32)).to(DEV).to(torch.bfloat16)
    xb = torch.zeros((n, k), device=DEV, dtype=torch.bfloat16) if zero_b else \
        torch.from_numpy((rng.standard_normal((n, k)) * 0.02).astype(np.float32)).to(DEV).to(torch.bfloat16)
    return fp.make_copy(xa, plan), fp.make_copy(xb, plan)


@pytest.mark.parametrize("shape", [(48, 40, 80), (130, 257, 96), (16, 16, 16)], ids=["small", "ragged", "one-tile"])
@pytest.mark.parametrize("out", ["float32", "bfloat16"])
@pytest.mark.parametrize("layout", ["rows", "b-transposed-view"])
def test_the_fused_scaled_gemm_is_the_epilogue_path_up_to_fp32_summation_order(shape, out, layout):
    """fastpath.scaled_mm (one Triton GEMM, alpha on the accumulator) against the cuBLAS-then-epilogue path:
    both within FP32 summation error of fl(exact A·Bᵀ · alpha), the same alpha (bit-equal outputs wherever
    the two FP32 sums agree), B as a transposed view as Dgrad passes Fprop's W copy."""
    m, n, k = shape
    a, b = _scaled_pair(m, n, k)
    if layout == "b-transposed-view":  # B = (Bᵀ)ᵀ: the values a strided view, as fp.transposed makes them
        b = b._replace(values=b.values.t().contiguous().t())
        assert not b.values.is_contiguous()
    dt = getattr(torch, out)
    got = fp.scaled_mm(a, b, dt).float().cpu().numpy().astype(np.float64)
    ref = fp.alpha_epilogue(fp.mm_f32(a.values, b.values), a, b, dt).float().cpu().numpy().astype(np.float64)
    av, bv = (c.values.float().cpu().numpy().astype(np.float64) for c in (a, b))
    alpha = float(second_level_alpha(a.amax, b.amax, a.num, b.num))
    exact = (av @ bv.T) * alpha
    scale = (np.abs(av) @ np.abs(bv).T) * alpha
    ulp = 2.0 ** -8 if out == "bfloat16" else 2.0 ** -23
    bound = k * 2.0 ** -24 * scale + ulp * np.abs(exact) + 1e-45
    assert np.all(np.abs(got - exact) <= bound) and np.all(np.abs(ref - exact) <= bound)
    same = np.isclose(got, ref, rtol=0, atol=0)
    assert same.mean() > 0.5  # most sums round alike: a wrong alpha or a wrong tile would break every one


def test_the_fused_scaled_gemm_takes_the_epilogues_alpha_rules():
    """An all-zero operand (amax 0: alpha falls back to S_dec_a · S_dec_b) gives exact zeros, as the epilogue
    path does; the fast Linear path dispatches to it under fastpath.GEMM = "triton"."""
    a, b = _scaled_pair(32, 24, 48, zero_b=True)
    got = fp.scaled_mm(a, b, torch.float32).cpu().numpy()
    ref = fp.alpha_epilogue(fp.mm_f32(a.values, b.values), a, b, torch.float32).cpu().numpy()
    assert np.array_equal(_bits(got), _bits(ref)) and not got.any()
    a, b = _scaled_pair(32, 24, 48)
    old = fp.GEMM
    try:
        fp.GEMM = "triton"
        y = fp.mm(a, b, torch.bfloat16)
    finally:
        fp.GEMM = old
    assert np.array_equal(y.view(torch.int16).cpu().numpy(), fp.scaled_mm(a, b, torch.bfloat16).view(torch.int16)
                          .cpu().numpy())


def _recipes():
    base = get_recipe("nvfp4_paper")
    return [base, base.without("sr"), base.without("rht"), base.without("2d"), base.only("forward"),
            base.only("backward"), base.variant(four_over_six=True), get_recipe("mxfp4"), get_recipe("bf16"),
            get_recipe("fp8_blockwise"), get_recipe("fp8_current")]


class _Grab:
    """An observer that keeps every fast-path copy (and never asks for the full path)."""

    def __init__(self):
        self.copies = {}

    def due(self, step):
        return False

    def note(self, layer, role, step, x, c):
        self.copies[role] = c


@pytest.mark.parametrize("wgrad", fp.WGRAD_PATHS)
@pytest.mark.parametrize("rec", _recipes(), ids=lambda r: r.name)
def test_fast_linear_copies_are_the_references_and_the_gemms_agree(rec, wgrad, monkeypatch):
    """Every copy of the fast Linear is the reference's, on every Wgrad path (fastpath.WGRAD)."""
    monkeypatch.setattr(fp, "WGRAD", wgrad)
    tok, din, dout = 32, 64, 48
    rng = np.random.default_rng(5)
    x = (rng.standard_t(4, (tok, din)) * 0.5).astype(np.float32)
    w = (rng.standard_normal((dout, din)) / 8).astype(np.float32)
    dy = (rng.standard_normal((tok, dout)) * 1e-3).astype(np.float32)
    layer = fnn.Linear(din, dout, bias=False, recipe=rec, name="blocks.1.qkv", seed=3, gemm="blas").to(DEV)
    with torch.no_grad():
        layer.weight.copy_(torch.from_numpy(w))
    layer.step = 4
    grab = _Grab()
    fnn.OBSERVERS.append(grab)
    try:
        xt = torch.from_numpy(x).to(DEV).requires_grad_(True)
        y = layer(xt)
        y.backward(torch.from_numpy(dy).to(DEV))
    finally:
        fnn.OBSERVERS.remove(grab)
    ref = fpsim.linear(x, w, dy, rec, seed=3, layer="blocks.1.qkv", step=4)
    seen = set(grab.copies)
    assert seen >= {"fprop_x", "fprop_w", "dgrad_dy", "wgrad_dy", "wgrad_x"}, seen  # the fast path ran
    if fnn._reuse_fprop_w(rec):
        assert "dgrad_w" not in seen
        grab.copies["dgrad_w"] = fp.transposed(grab.copies["fprop_w"])
    for role, c in grab.copies.items():
        r = ref.operands[role]
        want = r if isinstance(r, np.ndarray) else fpsim.dequantize(r)
        assert np.array_equal(_bits(fp.values(c).cpu().numpy()), _bits(want)), role
    v = {r: np.abs(fp.values(c).float().cpu().numpy()) for r, c in grab.copies.items()}
    l1 = {"y": v["fprop_x"] @ v["fprop_w"].T, "dx": v["dgrad_dy"] @ v["dgrad_w"].T,
          "dw": v["wgrad_dy"] @ v["wgrad_x"].T}  # Σ|a·b| of each GEMM's copies (every copy is rows × K)
    fp8_tc = DEV == "cuda" and grab.copies["fprop_x"].kind == "quantized"
    for name, got, want in (("y", y, ref.y), ("dx", xt.grad, ref.dx), ("dw", layer.weight.grad, ref.dw)):
        err = np.abs(got.detach().float().cpu().numpy() - want)
        if fp8_tc:
            # Hopper's FP8 MMA accumulates with ~13 significant bits: measured on the H200 (2026-12-01), the error
            # of torch._scaled_mm against exact products stays below 2^-12 of Σ|a·b| for K = 64 … 4096
            assert (err <= 2.0 ** -11 * l1[name] + 1e-30).all(), (rec.name, name)
        else:
            assert err.max() <= 1e-5 * (np.abs(want).max() or 1.0), (rec.name, name)  # FP32 summation order only


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
@pytest.mark.parametrize("bias", [True, False])
def test_fast_path_takes_any_float_input_and_bias_and_gives_the_slow_paths_result(dtype, bias):
    """Leading shape, BF16/FP16/FP32 inputs and a bias: the same output dtype and values (up to the GEMMs' FP32
    order and one output rounding) as the reference path."""
    tok, din, dout = 32, 32, 16
    dt = getattr(torch, dtype)
    torch.manual_seed(0)
    x = torch.randn(2, tok // 2, din).to(DEV, dt)
    g = torch.randn(2, tok // 2, dout).to(DEV)
    outs = []
    for impl in ("triton", "eager"):
        fp.IMPL = impl
        layer = fnn.Linear(din, dout, bias=bias, recipe="nvfp4_paper", name="L", seed=1, gemm="blas").to(DEV)
        torch.manual_seed(1)
        with torch.no_grad():
            layer.weight.copy_(torch.randn(dout, din) / 4)
            if bias:
                layer.bias.copy_(torch.randn(dout))
        xt = x.clone().requires_grad_(True)
        y = layer(xt)
        assert y.dtype == dt and y.shape == (2, tok // 2, dout) and xt.grad is None
        (y.float() * g).sum().backward()  # a dense output gradient (the Wgrad RHT's one-pass path)
        assert xt.grad.dtype == dt
        outs.append([y.detach().float(), xt.grad.float(), layer.weight.grad] + ([layer.bias.grad] if bias else []))
    fp.IMPL = "triton"
    tol = {"bfloat16": 2e-2, "float16": 2e-3, "float32": 1e-5}[dtype]
    for a, b in zip(*outs):
        assert torch.allclose(a, b, rtol=tol, atol=tol * 0.1), (a - b).abs().max()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="direct launches run on CUDA (the device machine)")
def test_direct_launches_after_the_first_give_the_jits_bits():
    """The cached launcher (fpsim.torch.launch) passes every call's own runtime arguments: repeated SR copies with
    new seeds and new inputs still equal the reference."""
    from fpsim.torch.launch import direct_enabled

    plan = lower("nvfp4", rounding="sr")
    for seed in (1, 2, 3, 2**40 + 5):
        x = _data((48, 64), seed)
        c = fp.make_copy(torch.from_numpy(x).cuda(), plan, seed)
        assert np.array_equal(_bits(fp.values(c).cpu().numpy()), _bits(fpsim.fake_quantize(x, plan, seed=seed)))
    assert direct_enabled()


def test_monitor_finds_the_first_nonfinite_copy_on_the_fast_path():
    """Steps the monitor does not record run the fast path and still flag the first NaN (from the copies' amax)."""
    import fpsim.torch as ft

    layer = fnn.Linear(32, 16, bias=False, recipe="nvfp4_paper", name="blocks.0.fc1", gemm="blas").to(DEV)
    x = torch.randn(32, 32, device=DEV)
    with ft.monitor(every=100) as mon:
        for s in range(3):
            xs = x.clone()
            if s == 2:
                xs[3, 4] = float("nan")
            layer(xs).sum().backward()
            ft.step(layer)
    assert mon.first_nonfinite == (2, "blocks.0.fc1", "fprop_x")
    assert {r["step"] for r in mon.rows if "event" not in r} == {0}  # only step 0 is recorded


@pytest.mark.parametrize("d,signs", [(16, "recipe"), (32, 12345), (16, None)],
                         ids=["16-recipe", "32-seeded", "16-none"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("nan", [False, True], ids=["finite", "nan"])
def test_transposed_rht_is_the_rht_of_the_transpose_and_its_amax(d, signs, dtype, nan):
    """Wgrad's one-pass RHT of Xᵀ (fpsim.torch.rht.rht_transposed) = rht(Xᵀ) bit for bit, amax = absmax of it."""
    from fpsim.torch.quantize import absmax

    x = torch.from_numpy(_data((64, 75), 2)).to(DEV, getattr(torch, dtype))
    if nan:
        x[5, 9] = float("nan")
    want = tb.rht(x.t().contiguous(), d, signs, out_dtype=torch.bfloat16, impl="triton")
    for ignore in (False, True):
        got, amax = tb.rht_transposed(x, d, signs, out_dtype=torch.bfloat16, amax=True, ignore_nan=ignore,
                                      impl="triton")
        assert torch.equal(got.view(torch.int16), want.view(torch.int16))
        ref = absmax(want, ignore)
        if torch.isnan(ref):  # a NaN amax: any NaN (the kernel docstring says why the payload is not specified)
            assert torch.isnan(amax), (ignore, float(amax))
        else:
            assert torch.equal(amax.view(torch.int32), ref.view(torch.int32)), (ignore, float(amax), float(ref))
    eager, none = tb.rht_transposed(x, d, signs, out_dtype=torch.bfloat16, impl="eager")
    assert none is None and torch.equal(torch.isnan(eager), torch.isnan(want))  # NaN payloads: the path's own
    fin = ~torch.isnan(want)
    assert torch.equal(eager.view(torch.int16)[fin], want.view(torch.int16)[fin])


def test_transposed_rht_over_several_programs_along_the_tokens():
    """Token counts past one program's 8 tiles (and not a multiple of them): every tile written once, the amax the
    max over all programs' atomics, the largest value placed in the last, partial program."""
    from fpsim.torch.quantize import absmax

    x = torch.from_numpy(_data((16 * 8 * 2 + 48, 70), 4)).to(DEV)
    x[-3, 5] = 7.5e4  # the largest |value|, in the third program along the tokens
    want = tb.rht(x.t().contiguous(), 16, "recipe", out_dtype=torch.bfloat16, impl="triton")
    got, amax = tb.rht_transposed(x, 16, "recipe", out_dtype=torch.bfloat16, amax=True, impl="triton")
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))
    assert torch.equal(amax.view(torch.int32), absmax(want).view(torch.int32))


def _scaled_wgrad_cases(test):
    """The plans, input dtypes and NaN cases of the Wgrad kernels' bit tests."""
    test = pytest.mark.parametrize("nan", [False, True], ids=["finite", "nan"])(test)
    test = pytest.mark.parametrize("dtype", ["float32", "bfloat16"])(test)
    return pytest.mark.parametrize("name,opts", [
        ("nvfp4", {}), ("nvfp4", {"rounding": "sr"}), ("nvfp4", {"block": (1, 32)}), ("nvfp4", {"nan_amax": "ignore"}),
        ("nvfp4", {"rounding": "sr", "k": 4})], ids=lambda v: str(v))(test)


@_scaled_wgrad_cases
def test_wgrad_scaled_copy_in_two_passes_is_the_four_transfer_copy(name, opts, dtype, nan):
    """fpsim.torch.rht.rht_transposed_scaled (an amax pass that stores nothing, then RHT + quantize in registers)
    writes the bits of rht_transposed followed by the scaled fake quantization of the stored Xᵀ, with the same
    amax; over several programs along the tokens, a ragged feature count, SR with the seed or the key words read
    from a device table (CUDA graphs), a NaN input under both NaN policies."""
    from fpsim.random import seed_key
    from fpsim.torch.quantize import quantize_fused
    from fpsim.torch.rht import rht_transposed_scaled, scaled_fusable

    d = (opts.get("block") or (1, 16))[1]
    signs = "recipe" if d == 16 else 12345  # the recipe's fixed vector has 16 entries
    plan = lower(name, **opts)
    assert scaled_fusable(plan, d) and fp.copy_kind(plan) == "scaled"
    x = torch.from_numpy(_data((d * 8 * 2 + 3 * d, 70), 5)).to(DEV, getattr(torch, dtype))
    x[-2, 3] = 6.0e4  # the largest |value|, in the last, partial program along the tokens
    if nan:
        x[7, 66] = float("nan")
    seed = 1234 if plan.is_sr else None
    xt, amax_want = tb.rht_transposed(x, d, signs, out_dtype=torch.bfloat16, amax=True,
                                      ignore_nan=plan.ignore_nan, impl="triton")
    want = quantize_fused(xt, plan, amax_want, fake=True, apply_s_dec=False, out_dtype=torch.bfloat16,
                          **({} if seed is None else {"seed": seed}))
    keys = [seed]
    if seed is not None:
        keys.append(torch.tensor(np.array(seed_key(seed), np.uint32).view(np.int32), device=DEV))
    for key in keys:
        got, amax = rht_transposed_scaled(x, plan, d, signs, seed=key)
        assert got.dtype == torch.bfloat16 and got.shape == (70, x.shape[0])
        if torch.isnan(amax_want):
            assert torch.isnan(amax)
        else:
            assert torch.equal(amax.view(torch.int32), amax_want.view(torch.int32))
        assert torch.equal(got.view(torch.int16), want.view(torch.int16)), type(key)
    if nan and not plan.ignore_nan:
        assert torch.isnan(got.float()).all()  # a NaN amax: every value NaN, as in the two-pass copy


def test_wgrad_scaled_copy_refuses_the_plans_it_does_not_fuse():
    from fpsim.torch.rht import rht_transposed_scaled, scaled_fusable

    x = torch.zeros((32, 16), device=DEV)
    import dataclasses

    from fpsim.schemes import get_scheme

    nv = get_scheme("nvfp4")
    for plan in (lower("nvfp4", block=(16, 16)), lower("mxfp4"), lower(dataclasses.replace(nv, four_over_six=True)),
                 lower(dataclasses.replace(nv, per_row_scale=True)), lower("nvfp4", block=(1, 32))):
        assert not scaled_fusable(plan, 16)
        with pytest.raises(ValueError, match="not a one-tensor-scale two-level plan"):
            rht_transposed_scaled(x, plan, 16)
    with pytest.raises(ValueError, match="not a multiple of the Hadamard size 16"):
        rht_transposed_scaled(torch.zeros((24, 16), device=DEV), lower("nvfp4"), 16)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("nan", [False, True], ids=["finite", "nan"])
def test_one_read_gives_the_plain_and_the_transformed_amax(dtype, nan):
    """fpsim.torch.rht.rht_t_amaxes: amax(X) as absmax takes it and amax(RHT(Xᵀ)) as rht_transposed takes it,
    from one pass, each under its own NaN policy; several programs along the tokens, ragged features.  And
    rht_transposed_amaxes (the "shared" Wgrad path): rht_transposed's output and amax, and absmax's amax of X."""
    from fpsim.torch.quantize import absmax

    x = torch.from_numpy(_data((16 * 8 * 2 + 48, 70), 6)).to(DEV, getattr(torch, dtype))
    x[-5, 69] = -9.0e4  # the largest |value|: last partial program, last column
    if nan:
        x[3, 40] = float("nan")
    for ign_rht in (False, True):
        for ign_plain in (False, True):
            plain, trans = tb.rht_t_amaxes(x, 16, "recipe", ignore_nan=ign_rht, plain_ignore_nan=ign_plain)
            want_p = absmax(x, ign_plain)
            _, want_t = tb.rht_transposed(x, 16, "recipe", out_dtype=torch.bfloat16, amax=True, ignore_nan=ign_rht,
                                          impl="triton")
            out, want_t2 = tb.rht_transposed(x, 16, "recipe", out_dtype=torch.bfloat16, amax=True,
                                             ignore_nan=ign_rht, impl="triton")
            got_out, got_t, got_p = tb.rht_transposed_amaxes(x, 16, "recipe", out_dtype=torch.bfloat16,
                                                             ignore_nan=ign_rht, plain_ignore_nan=ign_plain,
                                                             impl="triton")
            assert torch.equal(got_out.view(torch.int16), out.view(torch.int16))
            for got, want in ((plain, want_p), (trans, want_t), (got_p, want_p), (got_t, want_t2)):
                assert got.shape == () and got.dtype == torch.float32
                if torch.isnan(want):
                    assert torch.isnan(got)
                else:
                    assert torch.equal(got.view(torch.int32), want.view(torch.int32)), (ign_rht, ign_plain)
            assert bool(torch.isnan(plain)) == (nan and not ign_plain)


def _counting(calls: dict, key: str, fn):
    """``fn`` that adds one to ``calls[key]`` per call."""
    def wrapped(*a, **k):
        calls[key] += 1
        return fn(*a, **k)
    return wrapped


@pytest.mark.parametrize("wide", [False, True], ids=["tile-loop", "wide"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("nan", [False, True], ids=["finite", "nan"])
def test_the_transposed_rht_pass_is_the_transposed_copys_rht_in_both_layouts(wide, dtype, nan, monkeypatch):
    """rht_t_kernel, tile loop or WIDE (fpsim.torch.rht.RHT_T_WIDE): RHT(Xᵀ) in BF16, its amax and X's own amax
    equal the RHT of the transposed copy and absmax of each (a partial last program along the tokens, ragged
    features, a tile past the tokens masked; amax-only passes too)."""
    import fpsim.torch.rht as trht
    from fpsim.torch.quantize import absmax

    monkeypatch.setattr(trht, "RHT_T_WIDE", wide)
    x = torch.from_numpy(_data((16 * 8 * 2 + 48, 70), 9)).to(DEV, getattr(torch, dtype))
    x[-3, 69] = 7.0e4
    if nan:
        x[20, 5] = float("nan")
    want = tb.rht(x.t().contiguous(), 16, "recipe", out_dtype=torch.bfloat16, impl="eager")
    for ign in (False, True):
        out, am, plain = tb.rht_transposed_amaxes(x, 16, "recipe", out_dtype=torch.bfloat16, ignore_nan=ign,
                                                  plain_ignore_nan=not ign, impl="triton")
        fin = ~torch.isnan(want)
        assert torch.equal(torch.isnan(out), ~fin) and torch.equal(out[fin].view(torch.int16),
                                                                   want[fin].view(torch.int16))
        p2, t2 = tb.rht_t_amaxes(x, 16, "recipe", ignore_nan=ign, plain_ignore_nan=not ign)
        for got, ref in ((am, absmax(want, ign)), (t2, absmax(want, ign)), (plain, absmax(x, not ign)),
                         (p2, absmax(x, not ign))):
            assert bool(torch.isnan(got)) == bool(torch.isnan(ref))
            if not torch.isnan(ref):
                assert torch.equal(got.view(torch.int32), ref.view(torch.int32))


def test_a_fast_nvfp4_linear_reads_x_and_dy_twice_each(monkeypatch):
    """Under nvfp4_paper the Fprop copy of X and Wgrad's RHT'd Xᵀ (and Dgrad's dY and Wgrad's dYᵀ) take their tensor
    amax values from one shared pass and are written by one more: the only separate amax pass and quantize launch
    left are W's; the bits are the reference's (the test above checks every copy)."""
    import fpsim.torch.rht as trht

    calls = {"absmax": 0, "shared": 0, "rht_amax_pass": 0, "quantize": 0, "pair": 0}
    absmax, shared, one_pass = fp.absmax, tb.rht_t_amaxes, trht._rht_t_pass

    count = functools.partial(_counting, calls)

    monkeypatch.setattr(fp, "WGRAD", "paired")
    monkeypatch.setattr(fp, "absmax", count("absmax", absmax))
    monkeypatch.setattr(tb, "rht_t_amaxes", count("shared", shared))
    monkeypatch.setattr(fp, "quantize_fused", count("quantize", fp.quantize_fused))
    monkeypatch.setattr(tb, "rht_transposed_scaled_pair", count("pair", tb.rht_transposed_scaled_pair))
    monkeypatch.setattr(trht, "_rht_t_pass", lambda *a, **k: (calls.__setitem__("rht_amax_pass", calls[
        "rht_amax_pass"] + (k.get("plain") is None)), one_pass(*a, **k))[1])
    layer = fnn.Linear(64, 48, bias=False, recipe="nvfp4_paper", name="blocks.1.qkv", seed=3, gemm="blas").to(DEV)
    x = torch.randn(32, 64, device=DEV, requires_grad=True)
    layer(x).backward(torch.randn(32, 48, device=DEV))
    # W's copy alone takes its own amax pass and quantize launch; X and dY each one amax read and one pair launch
    assert calls == {"absmax": 1, "shared": 2, "rht_amax_pass": 0, "quantize": 1, "pair": 2}, calls
    assert x.grad is not None and layer.weight.grad is not None


@pytest.mark.parametrize("wgrad,want", [
    ("stored", {"absmax": 3, "quantize": 5, "rht_t": 2}),
    ("shared", {"absmax": 1, "quantize": 5, "rht_t": 2}),  # X's and dY's amax from their RHT passes
    ("registers", {"absmax": 3, "quantize": 3, "rht_t": 2}),
    ("paired", {"absmax": 1, "quantize": 1, "rht_t": 2}),
])
def test_each_wgrad_path_launches_what_it_says(wgrad, want, monkeypatch):
    """Passes per nvfp4_paper layer and step on each fastpath.WGRAD path (W's 16×16 copy is Dgrad's too)."""
    import fpsim.torch.rht as trht

    calls = {"absmax": 0, "quantize": 0, "rht_t": 0}

    count = functools.partial(_counting, calls)

    monkeypatch.setattr(fp, "WGRAD", wgrad)
    monkeypatch.setattr(fp, "absmax", count("absmax", fp.absmax))
    monkeypatch.setattr(fp, "quantize_fused", count("quantize", fp.quantize_fused))
    monkeypatch.setattr(trht, "_rht_t_pass", count("rht_t", trht._rht_t_pass))
    layer = fnn.Linear(64, 48, bias=False, recipe="nvfp4_paper", name="blocks.1.qkv", seed=3, gemm="blas").to(DEV)
    layer(torch.randn(32, 64, device=DEV, requires_grad=True)).backward(torch.randn(32, 48, device=DEV))
    assert calls == want


@pytest.mark.parametrize("x_grad", [True, False], ids=["dx", "no-dx"])
@pytest.mark.parametrize("rec", ["nvfp4_paper", "nvfp4_paper-no-sr"])
def test_every_wgrad_path_gives_the_same_y_dx_dw(rec, x_grad, monkeypatch):
    """fastpath.WGRAD changes passes, never bits: y, dX and dW of a Linear (FP32 input with a leading axis,
    2 × 16 tokens) are equal bit for bit on every path, with and without an input gradient."""
    recipe = get_recipe("nvfp4_paper") if rec == "nvfp4_paper" else get_recipe("nvfp4_paper").without("sr")
    torch.manual_seed(4)
    x0, g = torch.randn(2, 16, 64, device=DEV) * 3, torch.randn(2, 16, 48, device=DEV) * 1e-3
    outs = {}
    for wgrad in fp.WGRAD_PATHS:
        monkeypatch.setattr(fp, "WGRAD", wgrad)
        layer = fnn.Linear(64, 48, bias=False, recipe=recipe, name="blocks.1.fc1", seed=7, gemm="blas").to(DEV)
        with torch.no_grad():
            layer.weight.copy_(torch.linspace(-1, 1, 48 * 64, device=DEV).reshape(48, 64))
        x = x0.clone().requires_grad_(x_grad)
        y = layer(x)
        y.backward(g)
        outs[wgrad] = [y.detach(), layer.weight.grad] + ([x.grad] if x_grad else [])
    for wgrad, got in outs.items():
        for a, b in zip(got, outs["stored"]):
            assert torch.equal(a.view(torch.int32), b.view(torch.int32)), wgrad


@_scaled_wgrad_cases
def test_both_copies_of_a_tensor_from_one_read_are_the_separate_copies(name, opts, dtype, nan):
    """fpsim.torch.rht.rht_transposed_scaled_pair: the scaled copy of X (1 × W blocks along its rows, as make_copy
    writes it) and Wgrad's of RHT(Xᵀ), from one pass, each with its own amax and SR key (seeds, or the device
    key tables of CUDA graphs): the bits of the two separate kernels; ragged features (partial row blocks)."""
    from fpsim.random import seed_key
    from fpsim.torch.quantize import quantize_fused
    from fpsim.torch.rht import rht_t_amaxes, rht_transposed_scaled, rht_transposed_scaled_pair

    d = (opts.get("block") or (1, 16))[1]
    signs = "recipe" if d == 16 else 12345
    plan = lower(name, **opts)
    x = torch.from_numpy(_data((d * 8 * 2 + 3 * d, 70), 7)).to(DEV, getattr(torch, dtype))
    x[-2, 68] = 6.0e4
    if nan:
        x[9, 2] = float("nan")
    plain_amax, amax = rht_t_amaxes(x, d, signs, ignore_nan=plan.ignore_nan, plain_ignore_nan=plan.ignore_nan)
    seeds = (None, None) if not plan.is_sr else (1234, 99)
    want_p = quantize_fused(x.contiguous(), plan, plain_amax, fake=True, apply_s_dec=False, out_dtype=torch.bfloat16,
                            **({} if seeds[1] is None else {"seed": seeds[1]}))
    want_t, _ = rht_transposed_scaled(x, plan, d, signs, amax=amax, **({} if seeds[0] is None else {"seed": seeds[0]}))
    keys = [seeds]
    if plan.is_sr:
        keys.append(tuple(torch.tensor(np.array(seed_key(s), np.uint32).view(np.int32), device=DEV) for s in seeds))
    for s_t, s_p in keys:
        got_p, got_t = rht_transposed_scaled_pair(x, plan, d, signs, amax=amax, plain_amax=plain_amax, seed=s_t,
                                                  plain_seed=s_p)
        assert got_p.shape == x.shape and got_t.shape == x.t().shape
        assert torch.equal(got_p.view(torch.int16), want_p.view(torch.int16)), type(s_t)
        assert torch.equal(got_t.view(torch.int16), want_t.view(torch.int16)), type(s_t)
