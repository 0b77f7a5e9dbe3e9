"""GEMM on torch devices: the bit-defined fp32 model, the tensor-core paths, and Blackwell argument preparation."""

import numpy as np
import pytest

import fpsim

torch = pytest.importorskip("torch", reason="torch not installed (pip install 'fpsim[torch]')")
tb = pytest.importorskip("fpsim.torch.backend")
from fpsim.torch import gemm as tg  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def ops(scheme_a, scheme_b, m=24, n=20, k=96, seed=0):
    rng = np.random.default_rng(seed)
    a = (rng.standard_normal((m, k)) * np.exp2(rng.integers(-6, 6, (m, k)))).astype(np.float32)
    b = rng.standard_normal((n, k)).astype(np.float32)
    return fpsim.quantize(a, scheme_a), fpsim.quantize(b, scheme_b)


def same_f32(a, b):
    return np.array_equal(np.asarray(a, np.float32).view(np.uint32), np.asarray(b, np.float32).view(np.uint32))


def test_torch_quantized_round_trip_and_quantize_dispatch():
    x = np.random.default_rng(1).standard_normal((5, 40)).astype(np.float32)
    for scheme, kw in [("nvfp4", {}), ("mxfp8_e4m3", {}), ("fp8_block128", {}), ("nvfp4", {"rounding": "sr",
                                                                                         "seed": 3})]:
        q = fpsim.quantize(x, scheme, **kw)
        t = tb.quantize(torch.from_numpy(x).to(DEV), scheme, **kw)
        assert t.to_quantized().equals(q), scheme
        assert same_f32(t.dequantize().cpu().numpy(), q.dequantize()), scheme
        assert tb.TorchQuantized.from_quantized(q, DEV).to_quantized().equals(q)
    q = fpsim.quantize(x, "nvfp4", axis=0)
    assert tb.quantize(torch.from_numpy(x).to(DEV), "nvfp4", axis=0).to_quantized().equals(q)


@pytest.mark.parametrize("sa,sb", [("nvfp4", "nvfp4"), ("mxfp4", "mxfp4"), ("mxfp8_e4m3", "nvfp4"),
                                   ("fp8_e4m3", "fp8_e4m3"), ("fp8_block128", "fp8_block128"), ("nvfp4", "bf16")])
def test_fp32_model_is_bit_identical_to_the_reference(sa, sb):
    qa, qb = ops(sa, sb, k=256 if "128" in sa else 96)
    want = fpsim.gemm(qa, qb, "fp32")
    got = tb.gemm(tb.TorchQuantized.from_quantized(qa, DEV), tb.TorchQuantized.from_quantized(qb, DEV), "fp32")
    assert same_f32(got.cpu().numpy(), want)


def test_nvfp4_bf16_path_matches_the_exact_model_to_fp32_rounding():
    qa, qb = ops("nvfp4", "nvfp4", m=40, n=36, k=512, seed=2)
    exact = fpsim.gemm(qa, qb, "exact")
    got = tg.gemm_bf16_exact(tb.TorchQuantized.from_quantized(qa, DEV), tb.TorchQuantized.from_quantized(qb, DEV))
    got = got.cpu().numpy().astype(np.float64)
    wa = np.abs(fpsim.dequantize(qa)).astype(np.float64)
    wb = np.abs(fpsim.dequantize(qb)).astype(np.float64)
    bound = (512 + 2) * 2.0**-24 * (wa @ wb.T) + 1e-30  # |fl-sum error| ≤ γ_K Σ|a||b| (+ alpha's rounding)
    assert np.all(np.abs(got - exact) <= bound)
    # A single 16-block: one exact block sum, so every path gives the fp32 model's bits.
    qa, qb = ops("nvfp4", "nvfp4", m=8, n=8, k=16, seed=3)
    ta, tb_ = tb.TorchQuantized.from_quantized(qa, DEV), tb.TorchQuantized.from_quantized(qb, DEV)
    want = fpsim.gemm(qa, qb, "fp32")
    assert same_f32(tg.gemm_bf16_exact(ta, tb_).cpu().numpy(), want)
    got16 = tg.gemm_bf16_exact(ta, tb_, torch.bfloat16)
    assert got16.dtype == torch.bfloat16 and torch.equal(got16.cpu(), torch.from_numpy(want).to(torch.bfloat16))


def test_blas_dispatch_falls_back_to_the_reference_model_where_no_tensor_core_path_exists():
    qa, qb = ops("mxfp6_e2m3", "mxfp6_e2m3")
    got = tb.gemm(tb.TorchQuantized.from_quantized(qa, DEV), tb.TorchQuantized.from_quantized(qb, DEV), "blas")
    assert np.allclose(got.cpu().numpy(), fpsim.gemm(qa, qb, "blas"), rtol=1e-5, atol=1e-6)


def _emulate_scaled_mm(mat_a, mat_b, scale_a, scale_b, out_dtype, block, element):
    """What cuBLAS's block-scaled GEMM computes from these arguments, written from the documented layout
    (SPEC §4 swizzle, low nibble first, scales per 1×block along K) independently of the preparation code."""
    m = mat_a.shape[0]
    n = mat_b.shape[1]
    a = mat_a.view(torch.uint8).numpy()
    b = mat_b.t().contiguous().view(torch.uint8).numpy()
    if element == "float4_e2m1fn":
        a = np.stack([a & 0xF, a >> 4], -1).reshape(m, -1)
        b = np.stack([b & 0xF, b >> 4], -1).reshape(n, -1)
    k = a.shape[1]
    va = fpsim.decode(a, element).astype(np.float64)
    vb = fpsim.decode(b, element).astype(np.float64)
    sfmt = "float8_e4m3fn" if block == 16 else "float8_e8m0fnu"
    sa = fpsim.decode(fpsim.unswizzle_scales(scale_a.view(torch.uint8).numpy(), m, k // block), sfmt)
    sb = fpsim.decode(fpsim.unswizzle_scales(scale_b.view(torch.uint8).numpy(), n, k // block), sfmt)
    va *= np.repeat(sa, block, axis=1)
    vb *= np.repeat(sb, block, axis=1)
    return va @ vb.T


@pytest.mark.parametrize("scheme,block", [("nvfp4", 16), ("mxfp4", 32), ("mxfp8_e4m3", 32)])
def test_blackwell_argument_preparation(scheme, block):
    """Layout, dtypes and strides of the native tensor-core call (the hardware path itself is untested)."""
    qa, qb = ops(scheme, scheme, m=130, n=36, k=4 * block * 2, seed=4)
    a, b = tb.TorchQuantized.from_quantized(qa), tb.TorchQuantized.from_quantized(qb)
    prep = tg.blackwell_scaled_mm_args(a, b)
    args = prep["args"]
    el = qa.scheme.element.name
    assert args["mat_a"].dtype == {"float4_e2m1fn": torch.float4_e2m1fn_x2}.get(el, torch.float8_e4m3fn)
    assert args["mat_b"].stride()[0] == 1  # column-major B, as cuBLAS's TN layout wants
    assert args["scale_a"].dtype == (torch.float8_e4m3fn if block == 16 else torch.float8_e8m0fnu)
    assert args["scale_a"].numel() == 256 * 4 * -(-qa.scales.shape[1] // 4)
    assert np.array_equal(args["scale_a"].view(torch.uint8).numpy(), fpsim.swizzle_scales(qa.scales))
    got = _emulate_scaled_mm(args["mat_a"], args["mat_b"], args["scale_a"], args["scale_b"], args["out_dtype"],
                             block, el)
    if prep["alpha"] is not None:
        got = got * float(prep["alpha"])
    exact = fpsim.gemm(qa, qb, "exact")
    assert np.allclose(got, exact, rtol=1e-6, atol=1e-30)
    with pytest.raises(ValueError, match="multiple of"):
        qa2, qb2 = ops(scheme, scheme, k=block * 2)
        tg.blackwell_scaled_mm_args(tb.TorchQuantized.from_quantized(qa2), tb.TorchQuantized.from_quantized(qb2))


def test_blackwell_dispatch_is_chosen_on_compute_capability_10(monkeypatch):
    """With a (mocked) 10.x device, ``gemm(..., "blas")`` calls torch._scaled_mm with the prepared arguments."""
    qa, qb = ops("nvfp4", "nvfp4", m=8, n=8, k=64)
    a, b = tb.TorchQuantized.from_quantized(qa), tb.TorchQuantized.from_quantized(qb)
    calls = []

    def fake_scaled_mm(**kw):
        calls.append(kw)
        return torch.from_numpy(_emulate_scaled_mm(kw["mat_a"], kw["mat_b"], kw["scale_a"], kw["scale_b"],
                                                   kw["out_dtype"], 16, "float4_e2m1fn").astype(np.float32))

    monkeypatch.setattr(torch, "_scaled_mm", fake_scaled_mm)
    out = tg.gemm_blackwell(a, b)
    assert len(calls) == 1 and calls[0]["mat_a"].dtype == torch.float4_e2m1fn_x2
    assert np.allclose(out.numpy(), fpsim.gemm(qa, qb, "exact"), rtol=1e-6)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (FP8 tensor cores)")
def test_fp8_tensor_core_path_on_gpu():
    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("FP8 tensor cores need compute capability 8.9+")
    qa, qb = ops("fp8_e4m3", "fp8_e4m3", m=64, n=48, k=512, seed=6)
    a, b = tb.TorchQuantized.from_quantized(qa, "cuda"), tb.TorchQuantized.from_quantized(qb, "cuda")
    got = tb.gemm(a, b, "blas").cpu().numpy().astype(np.float64)
    exact = fpsim.gemm(qa, qb, "exact")
    wa = np.abs(fpsim.dequantize(qa)).astype(np.float64)
    wb = np.abs(fpsim.dequantize(qb)).astype(np.float64)
    # Hopper's FP8 tensor cores accumulate with fewer than FP32's 24 bits (about 14, DeepSeek-V3 §3.3.2):
    # the error is ~1e-4 of Σ|a||b| at K = 512 here, against ~1e-7 for an FP32 accumulator.  A sanity bound:
    assert np.all(np.abs(got - exact) <= 2.0**-10 * (wa @ wb.T) + 1e-30)


def test_public_api_backend_argument_and_context_give_the_reference_bits():
    from fpsim import backends

    rng = np.random.default_rng(11)
    x = rng.standard_normal((6, 64)).astype(np.float32)
    q = fpsim.quantize(x, "nvfp4")
    qb = fpsim.quantize(rng.standard_normal((5, 64)).astype(np.float32), "nvfp4")
    name = "torch-cuda" if DEV == "cuda" else "torch-cpu"
    assert fpsim.quantize(x, "nvfp4", backend=name).equals(q)
    assert fpsim.quantize(x, "mxfp4", axis=0, backend=name).equals(fpsim.quantize(x, "mxfp4", axis=0))
    assert same_f32(fpsim.dequantize(q, backend=name), q.dequantize())
    assert same_f32(fpsim.fake_quantize(x, "mxfp6_e3m2", backend=name), fpsim.fake_quantize(x, "mxfp6_e3m2"))
    assert same_f32(fpsim.gemm(q, qb, backend=name), fpsim.gemm(q, qb))
    assert np.array_equal(fpsim.encode(x, "e4m3", backend=name), fpsim.encode(x, "e4m3"))
    assert np.array_equal(fpsim.encode(x, "e2m1", "sr", seed=4, backend=name), fpsim.encode(x, "e2m1", "sr", seed=4))
    assert same_f32(fpsim.decode(np.arange(256), "e5m2", backend=name), fpsim.decode(np.arange(256), "e5m2"))
    assert same_f32(fpsim.rht(x, backend=name), fpsim.rht(x))
    with backends.use(name):
        assert backends.pick(None, x) == name
        assert fpsim.quantize(x, "nvfp4").equals(q)
    assert backends.pick(None, x) is None  # small numpy input, no block: the Numba reference
    assert backends.pick("numba-cpu", x) is None
    with pytest.raises(ValueError, match="not available"):
        fpsim.quantize(x, "nvfp4", backend="tpu")
    with pytest.raises(ValueError, match="outside"):
        fpsim.decode([300], "e4m3", backend=name)


@pytest.mark.parametrize("aa,ab", [(1.0, 2.0), (0.0, 3.0), (np.inf, 1.0), (np.nan, 1.0), (1e-38, 1e-38),
                                   (3e38, 2.0), (1e-45, 5.0)])
def test_alpha_on_the_device_equals_the_reference(aa, ab):
    from fpsim.gemm import alpha_factor, operand

    x = np.zeros((1, 16), np.float32)
    y = np.zeros((1, 16), np.float32)
    x[0, 0], y[0, 0] = aa, ab
    qa, qb = fpsim.quantize(x, "nvfp4"), fpsim.quantize(y, "nvfp4")
    want = alpha_factor(operand(qa), operand(qb)).reshape(())
    got = tg.second_level_alpha(torch.tensor(np.float32(qa.amax), device=DEV),
                                torch.tensor(np.float32(qb.amax), device=DEV), 2688.0, 2688.0).cpu().numpy()
    assert (np.isnan(want) and np.isnan(got)) or same_f32(got, want)
