"""The torch backend gives the Numba reference's bits (CPU here; CUDA on the device machine)."""

import os

import numpy as np
import pytest

import fpsim
from fpsim import backends
from tests.probes import float32_probes, probes_for

torch = pytest.importorskip("torch", reason="torch not installed (pip install 'fpsim[torch]'); CPU CI skips this")
tb = pytest.importorskip("fpsim.torch.backend")
from fpsim.torch import codecs as tc  # noqa: E402

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
CODED = [n for n, s in fpsim.FORMATS.items() if not s.is_passthrough]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fmt", CODED)
@pytest.mark.parametrize("mode", ["rne", "rtz", "rup", "rdown", "rna"])
def test_encode_decode_equal_the_reference(device, fmt, mode):
    spec = fpsim.get_format(fmt)
    x = np.concatenate([probes_for(spec), float32_probes(top=4)]).view(np.float32)
    for sat in (True, False):
        want = fpsim.encode(x, spec, mode, sat)
        got = tb.encode(torch.from_numpy(x).to(device), spec, mode, sat).cpu().numpy()
        assert np.array_equal(got, want.astype(np.int64)), (fmt, mode, sat)
    codes = np.arange(1 << spec.bits)
    d = tb.decode(torch.from_numpy(codes).to(device), spec).cpu().numpy()
    assert np.array_equal(d.view(np.uint32), fpsim.decode(codes, spec).view(np.uint32))


def adversarial(rng, shape):
    x = rng.standard_normal(shape).astype(np.float32)
    x[0, :16] = 1e-7
    x[1, :] = 0
    x[2, 16:32] = np.float32(2.5 * 448 / 6)
    x[3, 5] = -0.0
    x[4, ::3] *= 1e4
    return x


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", [(8, 64), (33, 40), (5, 3, 48)])
def test_nvfp4_equals_the_reference(device, shape):
    rng = np.random.default_rng(len(shape))
    x = rng.standard_normal(shape).astype(np.float32) * 3
    if len(shape) == 2 and shape[0] >= 5:
        x = adversarial(rng, shape)
    q = fpsim.quantize(x, "nvfp4")
    t = tb.quantize(torch.from_numpy(x).to(device), "nvfp4", impl="eager")
    assert t.to_quantized().equals(q)
    xq = t.dequantize(impl="eager").cpu().numpy()
    assert np.array_equal(xq.view(np.uint32), q.dequantize().view(np.uint32))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("scheme", ["mxfp4", "mxfp8_e4m3", "mxfp6_e2m3"])
@pytest.mark.parametrize("rule", ["floor", "ceil", "even", "rceil"])
def test_mx_equals_the_reference(device, scheme, rule):
    rng = np.random.default_rng(5)
    x = (rng.standard_t(3, (16, 96)) * 10.0 ** rng.uniform(-6, 6, (16, 1))).astype(np.float32)
    x[0, 0] = np.nan
    q = fpsim.quantize(x, scheme, scale_rule=rule)
    t = tb.quantize(torch.from_numpy(x).to(device), scheme, scale_rule=rule, impl="eager")
    assert t.to_quantized().equals(q)
    xq = t.dequantize(impl="eager").cpu().numpy()
    ref = q.dequantize()
    assert np.array_equal(np.isnan(xq), np.isnan(ref))
    ok = ~np.isnan(ref)
    assert np.array_equal(xq[ok].view(np.uint32), ref[ok].view(np.uint32))


def test_registry():
    av = backends.available()
    assert av[:2] == ["numba-cpu", "torch-cpu"]
    with backends.use("torch-cpu"):
        assert backends.current() == "torch-cpu"
    assert backends.current() == backends.default()
    with pytest.raises(ValueError, match="not available"):
        with backends.use("tpu"):
            pass
    with pytest.raises(ValueError, match="exactly one of"):
        tc.encode(torch.zeros(2), "e2m1", "sr")


@pytest.mark.parametrize("device", DEVICES)
def test_philox_stream_equals_the_cpu_generator(device):
    from fpsim.random import philox4x32, random_bits

    for counter, key, _ in [((0, 0, 0, 0), (0, 0), None), ((0xFFFFFFFF, 0xFFFFFFFF, 0, 0), (0xFFFFFFFF,) * 2, None)]:
        w = tc.philox4x32(torch.tensor([counter[0]], device=device), torch.tensor([counter[1]], device=device), *key)
        assert tuple(int(v) for v in w) == philox4x32(counter, key)
    for k in (1, 8, 13, 16, 24):
        for seed in (0, 7, 2**40 + 3):
            want = random_bits(seed, 1000, k, counter=5)
            assert np.array_equal(tc.random_bits(seed, 1000, k, 5, device).cpu().numpy(), want.astype(np.int64))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fmt", [n for n in CODED if n != "float8_e8m0fnu"])
def test_stochastic_rounding_equals_the_reference(device, fmt):
    spec = fpsim.get_format(fmt)
    rng = np.random.default_rng(11)
    x = np.concatenate([probes_for(spec)[::7].view(np.float32),
                        (rng.standard_normal(20000) * min(spec.max, 1e30) / 3).astype(np.float32)])
    for k in (spec.sr_bits, 24):
        want = fpsim.encode(x, spec, "sr", seed=5, k=k, counter=3)
        got = tb.encode(torch.from_numpy(x).to(device), spec, "sr", seed=5, k=k, counter=3).cpu().numpy()
        assert np.array_equal(got, want.astype(np.int64)), (fmt, k)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("d,signs,bf16", [(16, "recipe", True), (16, "recipe", False), (2, 3, False),
                                          (128, 9, True), (256, "none", False)])
def test_rht_equals_the_reference(device, d, signs, bf16):
    rng = np.random.default_rng(d)
    x = (rng.standard_t(3, (6, 512)) * 100).astype(np.float32)
    x[0, :3] = [np.nan, np.inf, -0.0]
    for axis in (-1, 0) if d <= 6 else (-1,):
        want = fpsim.rht(x, d, signs, axis=axis, bf16_in=bf16, bf16_out=bf16)
        got = tb.rht(torch.from_numpy(x).to(device), d, signs, axis=axis, bf16_in=bf16, bf16_out=bf16).cpu().numpy()
        same_bits(got, want)
    back = tb.rht(torch.from_numpy(want).to(device), d, signs, bf16_in=False, bf16_out=False, inverse=True)
    ref = fpsim.rht(want, d, signs, bf16_in=False, bf16_out=False, inverse=True)
    same_bits(back.cpu().numpy(), ref)


def same_bits(got, want):
    """Bit-identical, except arithmetic NaN payloads, which are not part of the contract (GPUs canonicalise)."""
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(got), nan)
    assert np.array_equal(got[~nan].view(np.uint32), want[~nan].view(np.uint32))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("scheme,block", [("nvfp4", None), ("nvfp4", (16, 16)), ("mxfp4", None),
                                          ("mxfp8_e4m3", None), ("fp8_block128", None), ("fp8_block128", (128, 128)),
                                          ("fp8_e4m3", None), ("bf16", None), ("mxfp6_e3m2", None)])
def test_fake_quantize_rne_equals_the_reference(device, scheme, block):
    rng = np.random.default_rng(13)
    x = (rng.standard_t(3, (160, 272)) * 10.0 ** rng.uniform(-4, 4, (160, 1))).astype(np.float32)
    s = fpsim.get_scheme(scheme) if block is None else fpsim.get_scheme(scheme).replace(block=block)
    want = fpsim.quantize(x, s).dequantize()
    got = tb.fake_quantize(torch.from_numpy(x).to(device), s).cpu().numpy()
    same_bits(got, want)


@pytest.mark.parametrize("device", DEVICES)
def test_fake_quantize_sr_is_unbiased(device):
    x = torch.full((64, 64), 1.2 / 6 * 448 / 448, device=device)
    x[:, ::16] = 1.0  # block max: scaled values are 6 (the max) and 1.2
    draws = torch.stack([tb.fake_quantize(x, "nvfp4", rounding="sr", seed=s) for s in range(64)])
    assert abs(float(draws.mean()) - float(x.mean())) < 0.003 * float(x.mean())
    rne = tb.fake_quantize(x, "nvfp4")
    assert abs(float(rne.mean()) - float(x.mean())) > 0.05 * float(x.mean())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("scheme", ["nvfp4", "mxfp8_e4m3", "fp8_block128"])
def test_fake_quantize_sr_equals_the_cpu_quantizer(device, scheme):
    x = np.random.default_rng(3).standard_normal((8, 256)).astype(np.float32)
    want = fpsim.quantize(x, scheme, rounding="sr", seed=42, counter=3).dequantize()
    got = tb.fake_quantize(torch.from_numpy(x).to(device), scheme, rounding="sr", seed=42, counter=3)
    same_bits(got.cpu().numpy(), want)


@pytest.mark.parametrize("scheme", list(fpsim.SCHEMES))
def test_torch_quantized_round_trip_keeps_the_layout(scheme):
    """from_quantized → to_quantized gives back an equal QuantizedTensor (0-d per-tensor scales stay 0-d)."""
    x = np.random.default_rng(12).standard_normal((4, 64)).astype(np.float32)
    q = fpsim.quantize(x, scheme)
    back = tb.TorchQuantized.from_quantized(q).to_quantized(q.dtype)
    assert back.equals(q)


def test_default_backend_needs_no_torch_import_without_a_gpu_device():
    """On Linux with no NVIDIA device node, picking the default (every large numpy call) does not import torch."""
    import subprocess
    import sys

    if not sys.platform.startswith("linux") or os.path.exists("/dev/nvidiactl"):
        pytest.skip("a GPU device node exists here (or this is not Linux)")
    code = "import sys, fpsim; assert fpsim.backends.default() == 'numba-cpu'; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
