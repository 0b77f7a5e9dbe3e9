"""Producer conventions (issue 47 item 1) against the producers' own bytes, on every backend.

tests/data/producers/<producer>.npz were written by the libraries themselves (tests/data/producers/generate.py:
torchao 0.18.0, compressed-tensors 0.20.1, nvidia-modelopt 0.47.0, torch 2.13.0+cpu); each holds 9 edge tensors
(zero, −0, zero blocks, subnormal and zero E4M3 scales, two tensors whose 2688/amax overflows, E2M1 and E4M3
ties, outliers, random) in float32 and bfloat16.  Transformer Engine does not install without CUDA: its
conventions are checked against vectors DERIVED BY HAND from its cited CUDA and Python source, operation by
operation — tests/data/producers/te-*.npz (te_by_hand.py, the same edge tensors) and ``_te_*`` below, each line
naming the TE function it transcribes.
NaN values are compared as NaN: their payload and sign are the host's (x86 here), not part of any convention.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fpsim
from fpsim import backends
from fpsim import conventions as C

DATA = Path(__file__).resolve().parent / "data" / "producers"
PRODUCERS = ("torchao", "compressed-tensors", "modelopt")
TE_BY_HAND = ("te-cuda", "te-cuda-fastmath", "te-python")  # golden files derived by hand from TE's source
BACKENDS = [b for b in ("numba-cpu", "torch-cpu", "torch-cuda") if b in backends.available()]
F = np.float32

pytestmark = [pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning"),
              pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning"),
              pytest.mark.filterwarnings("ignore:divide by zero encountered:RuntimeWarning")]


def golden(producer: str) -> dict[str, dict[str, np.ndarray]]:
    with np.load(DATA / f"{producer}.npz", allow_pickle=False) as z:
        out: dict[str, dict[str, np.ndarray]] = {}
        for k in z.files:
            if k != "versions":
                case, field = k.rsplit(".", 1)
                out.setdefault(case, {})[field] = z[k]
    return out


def same_values(a, b) -> bool:
    """Bit-identical float32, NaN compared as NaN (payload and sign are the host's)."""
    a, b = np.asarray(a, F), np.asarray(b, F)
    na, nb = np.isnan(a), np.isnan(b)
    return a.shape == b.shape and bool((na == nb).all()) and a[~na].tobytes() == b[~nb].tobytes()


def as_input(case: str, x: np.ndarray):
    return x.astype(ml_dtypes.bfloat16) if case.endswith(".bfloat16") else x


def test_the_golden_files_cover_the_edge_tensors():
    for p in PRODUCERS:
        with np.load(DATA / f"{p}.npz") as z:
            assert {"torchao==0.18.0", "compressed-tensors==0.20.1", "nvidia-modelopt==0.47.0"} <= set(z["versions"])
    for p in TE_BY_HAND:
        with np.load(DATA / f"{p}.npz") as z:
            assert "derived by hand, not run" in str(z["versions"][0])
    for p in PRODUCERS + TE_BY_HAND:
        cases = golden(p)
        assert len(cases) == 18 and {c.rsplit(".", 1)[1] for c in cases} == {"float32", "bfloat16"}
        assert {c.rsplit(".", 1)[0] for c in cases} >= {"zero", "negative_zero", "zero_blocks", "small_scales",
                                                         "tiny_subnormal", "tiny_normal", "outliers"}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("producer", PRODUCERS + TE_BY_HAND)
def test_each_convention_gives_its_libraries_bytes_and_values(producer, backend):
    for case, g in golden(producer).items():
        x = as_input(case, g["input"])
        q = fpsim.quantize(x, "nvfp4", convention=producer, backend=backend)
        assert q.convention == producer
        assert fpsim.unpack_fp4(q.data).tobytes() == g["codes"].tobytes(), (case, "codes")
        assert q.scales.tobytes() == g["scales"].tobytes(), (case, "scales")
        assert C.stored_global(q).tobytes() == g["global"].tobytes(), (case, "stored global scale")
        assert same_values(fpsim.dequantize(q, backend=backend), g["decoded"]), (case, "decoded")


@pytest.mark.parametrize("producer", PRODUCERS + TE_BY_HAND)
def test_decoding_a_checkpoints_stored_arrays(producer):
    """fpsim.conventions.decode reads what the producer stores (codes, E4M3 bytes, its global scale)."""
    for case, g in golden(producer).items():
        got = C.decode(g["codes"], g["scales"], g["global"], producer)
        assert same_values(got, g["decoded"]), case


def test_the_fpsim_convention_differs_from_each_library_on_the_edge_tensors():
    """The conventions are needed: fpsim's own bytes or values differ from every library somewhere."""
    for p in PRODUCERS:
        differs = 0
        for case, g in golden(p).items():
            q = fpsim.quantize(as_input(case, g["input"]), "nvfp4")
            differs += not (fpsim.unpack_fp4(q.data).tobytes() == g["codes"].tobytes()
                            and q.scales.tobytes() == g["scales"].tobytes()
                            and same_values(q.dequantize(), g["decoded"]))
        assert differs >= 4, p


# ---------------------------------------------------------------------------
# Transformer Engine: vectors derived by hand from its source (no CPU install)


def _te_s_enc(amax):
    # core_nvfp4.cuh compute_global_encode_scaling_factor_FP4: fminf(448·6 / amax, FLT_MAX); 1 if amax or it is 0
    s = min(F(448.0) * F(6.0) / amax, np.finfo(F).max) if amax != 0 else F(1.0)
    return F(1.0) if s == 0 else F(s)


def _te_scale(vmax, s_enc):
    # quantization_SF::compute_decoding_scaling_factor: static_cast<fp8e4m3>(block_amax · (S_enc · (1/6)))
    sdb = F(vmax * F(s_enc * F(F(1.0) / F(6.0))))
    b = fpsim.encode(np.array([min(sdb, F(448.0))], F), "e4m3")[0]
    return b, fpsim.decode(np.array([b], np.uint8), "e4m3")[0]


def _te_dequant(e, s, amax):
    # dequantize_nvfp4.cuh dequantize_fp4_kernel: final_scale = float(scale) · amax · (float)(1/(6·448)); e·final
    return F(e * F(F(s * amax) * F(1.0 / (6.0 * 448.0))))


def _te_block(x, fast=False):
    """Codes, scale byte and decoded values of one 16-element tensor (one block) in TE's CUDA arithmetic."""
    amax = F(np.max(np.abs(x)))
    s_enc = _te_s_enc(amax)
    b, s = _te_scale(amax, s_enc)
    if fast:  # compute_nvfp4_scaling_coefficient<bf16>: bf16(fminf(S_enc / s, bf16 max)); fma.rn.f32.bf16 x·c
        c = F(ml_dtypes.bfloat16(min(F(s_enc / s), F(3.3895313892515355e38))))
    else:  # compute_scaling_coefficient<float>: fminf(1 / (s · (1 / S_enc)), FLT_MAX)
        c = F(min(F(F(1.0) / F(s * F(F(1.0) / s_enc))), np.finfo(F).max))
    codes = fpsim.encode(np.asarray(x, F) * c, "e2m1")  # cvt.rn.satfinite.e2m1x2.f32 (−0 keeps its sign)
    vals = fpsim.decode(codes, "e2m1")
    return codes, b, np.array([_te_dequant(v, s, amax) for v in vals], F)


TE_X = np.array([-6.7457376, 8.77885, 22.233696, -2.7412605, 29.142584, -14.186616, 7.4966598, 19.26832,
                 2.0050015, -15.856619, -19.65765, -9.761925, 4.6961045, -21.53214, -4.46109, -3.395794], F)
TE_BF16 = np.array([-169.0, -62.0, 70.5, -18.75, 46.5, -26.5, 95.5, 10.8125, -20.75, 139.0, -17.625, -66.5,
                    10.9375, -2.109375, 58.0, -50.0], F)  # bfloat16 values


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("x", [TE_X, TE_BF16, np.array([-0.0, 0.0, 1e-30, -3.0] + [0.0] * 12, F)],
                         ids=["normal", "bf16", "zeros"])
def test_te_cuda_conventions_match_vectors_derived_from_te_source(x, backend):
    """te-cuda on float32 and bfloat16 inputs; te-cuda-fastmath on bfloat16 inputs (TE's tuned 1-D kernel, the
    only one with fast math, takes bfloat16) and on float32 inputs, which TE quantizes without fast math."""
    xb = x.astype(ml_dtypes.bfloat16)
    for name, fast, xin in (("te-cuda", False, x), ("te-cuda", False, xb), ("te-cuda-fastmath", True, xb),
                            ("te-cuda-fastmath", False, x)):
        codes, b, dec = _te_block(np.asarray(xin, F), fast)
        q = fpsim.quantize(xin[None], "nvfp4", convention=name, backend=backend)
        assert fpsim.unpack_fp4(q.data)[0].tobytes() == codes.tobytes(), name
        assert int(q.scales[0, 0]) == int(b) and float(C.stored_global(q)) == float(np.max(np.abs(np.asarray(xin, F))))
        assert same_values(fpsim.dequantize(q, backend=backend)[0], dec), name


def test_te_decode_order_is_not_fpsims_and_fast_math_changes_codes():
    """Pinned by hand: element 0 of TE_X decodes to −7.2856464 in TE's CUDA order, −7.2856455 in fpsim's; with
    fast math (a bfloat16 coefficient) element 2 of TE_BF16 (70.5) gets code 4 (2) instead of 5 (3)."""
    q = fpsim.quantize(TE_X[None], "nvfp4")
    assert q.dequantize()[0, 0] == F(-7.2856455) and q.dequantize(convention="te-cuda")[0, 0] == F(-7.2856464)
    xb = TE_BF16[None].astype(ml_dtypes.bfloat16)
    assert fpsim.unpack_fp4(fpsim.quantize(xb, "nvfp4", convention="te-cuda").data)[0, 2] == 5
    assert fpsim.unpack_fp4(fpsim.quantize(xb, "nvfp4", convention="te-cuda-fastmath").data)[0, 2] == 4


@pytest.mark.parametrize("backend", BACKENDS)
def test_te_python_reference_writes_negative_zero_as_plus_zero(backend):
    """reference_nvfp4.py cast_to_fp4x2: x = −0 matches no negative range (x < −0.0 is false) and is written 0x0;
    a negative value that rounds to zero is 0x8; the hardware conversion (te-cuda, fpsim) keeps −0 as 0x8."""
    x = np.array([[-0.0, -1e-3, 6.0, -0.0] + [0.0] * 12], F)
    py = fpsim.unpack_fp4(fpsim.quantize(x, "nvfp4", convention="te-python", backend=backend).data)[0, :4]
    hw = fpsim.unpack_fp4(fpsim.quantize(x, "nvfp4", convention="te-cuda", backend=backend).data)[0, :4]
    assert list(py) == [0x0, 0x8, 0x7, 0x0] and list(hw) == [0x8, 0x8, 0x7, 0x8]


# ---------------------------------------------------------------------------
# Properties and the API


def _tensors():
    vals = st.one_of(st.floats(-1e4, 1e4, width=32), st.sampled_from([0.0, -0.0, 1e-40, -3e-39, 448.0, 6.0]))
    return st.integers(1, 3).flatmap(lambda r: st.lists(vals, min_size=32 * r, max_size=32 * r).map(
        lambda v, r=r: np.array(v, F).reshape(r, 32)))


@settings(max_examples=30, deadline=None)
@given(_tensors())
def test_a_convention_with_fpsims_parts_gives_fpsims_bytes(x):
    """The one algorithm of fpsim.conventions, given fpsim's parts, equals the fused kernels bit for bit."""
    mine = dataclasses.replace(C.FPSIM, name="fpsim-parts")
    with np.errstate(all="ignore"):
        codes, scales, amax = C.quantize_blocks(x.reshape(x.shape[0], -1, 16), mine, False)
    q = fpsim.quantize(x, "nvfp4")
    assert fpsim.pack_fp4(np.asarray(codes, np.uint8).reshape(x.shape)).tobytes() == q.data.tobytes()
    assert scales.tobytes() == q.scales.tobytes() and F(amax) == F(q.amax)
    with np.errstate(all="ignore"):
        dec = C.decode_blocks(fpsim.decode(codes, "e2m1"), fpsim.decode(scales, "e4m3")[..., None], amax, mine)
    assert same_values(np.asarray(dec, F).reshape(x.shape), q.dequantize())


@settings(max_examples=20, deadline=None)
@given(_tensors(), st.sampled_from([n for n in C.names() if n != "fpsim"]), st.booleans())
def test_torch_cpu_equals_numba_cpu_on_every_convention(x, name, bf16):
    if "torch-cpu" not in BACKENDS:
        pytest.skip("torch not installed")
    if bf16:
        x = x.astype(ml_dtypes.bfloat16)
    want = fpsim.quantize(x, "nvfp4", convention=name)
    got = fpsim.quantize(x, "nvfp4", convention=name, backend="torch-cpu")
    assert got.equals(want)
    assert same_values(fpsim.dequantize(got, backend="torch-cpu"), want.dequantize())


def test_api_names_sources_and_refusals():
    assert C.names()[0] == "fpsim" and set(PRODUCERS) | {"te-cuda", "te-cuda-fastmath", "te-python"} <= set(C.names())
    for c in C.CONVENTIONS.values():
        assert any(m in c.source for m in (".py", ".cuh", "spec.md")), c.name
    assert C.is_native(C.CONVENTIONS["te-cuda"]) and not C.decodes_native(C.CONVENTIONS["te-cuda"])
    with pytest.raises(ValueError, match="unknown convention"):
        fpsim.quantize(np.ones((1, 16), F), "nvfp4", convention="bitsandbytes")
    for scheme, kw in (("mxfp4", {}), ("nvfp4", {"block": (16, 16)}), ("nvfp4", {"nan_amax": "ignore"})):
        with pytest.raises(ValueError, match="convention"):
            fpsim.quantize(np.ones((16, 16), F), scheme, convention="torchao", **kw)
    q = fpsim.quantize(np.linspace(-3, 3, 48, dtype=F).reshape(1, 48), "nvfp4", convention="compressed-tensors")
    assert q.dequantize(convention="compressed-tensors").tobytes() == q.dequantize().tobytes()
    assert q.dequantize(convention="fpsim").dtype == F


def test_quantize_along_another_axis_and_with_a_given_amax():
    x = np.random.default_rng(3).standard_normal((32, 3)).astype(F)
    q0 = fpsim.quantize(x, "nvfp4", axis=0, convention="modelopt")
    q1 = fpsim.quantize(np.ascontiguousarray(x.T), "nvfp4", convention="modelopt")
    assert q0.data.tobytes() == q1.data.tobytes() and np.array_equal(q0.dequantize(), q1.dequantize().T)
    qa = fpsim.quantize(x.T, "nvfp4", convention="torchao", tensor_amax=10.0)
    assert float(C.stored_global(qa)) == float(F(10.0) / F(2688.0))
