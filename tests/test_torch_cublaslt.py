"""The fast path's cuBLASLt GEMM (``fastpath.GEMM = "cublaslt"``, :mod:`fpsim.torch.cublaslt`): how it hands torch
tensors to a column-major library (checked on the CPU against an emulation that reads the raw storage as cuBLASLt
does), the alpha it reads from device memory (the epilogue's, bit for bit, under Triton's interpreter), and on a
GPU its products against the cuBLAS-then-epilogue path, in graphs and on concurrent streams."""

from __future__ import annotations

import numpy as np
import pytest

from fpsim.plan import lower
from fpsim.torch import cublaslt as lt
from fpsim.torch import fastpath as fp
from fpsim.torch import nn as fnn
from fpsim.torch.gemm import second_level_alpha
from tests.test_torch_fastpath import _scaled_pair
from tests.tritonenv import DEV, INTERPRETER_WARNINGS, torch

pytestmark = INTERPRETER_WARNINGS
CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="cuBLASLt runs on CUDA (the device machine)")


def _stored(t, op: lt.Operand) -> np.ndarray:
    """op(X) of the column-major matrix that cuBLASLt reads at ``t``'s data pointer: element (i, j) of the stored
    rows × cols matrix is at offset i + j · ld from it."""
    buf = t.untyped_storage()
    flat = torch.tensor([], dtype=t.dtype).set_(buf).numpy()[t.storage_offset():]
    i, j = np.meshgrid(np.arange(op.rows), np.arange(op.cols), indexing="ij")
    m = flat[i + j * op.ld]
    return m if op.trans == lt._OP_N else m.T


def _layouts(r, c, rng):
    """The same r × c values as a contiguous tensor, a transposed view, and row/column-major views with padded
    leading dimensions (slices of wider tensors), as the fast path's copies and their transposes are."""
    v = torch.from_numpy(rng.standard_normal((r, c)).astype(np.float32))
    wide = torch.zeros((r, c + 3))
    wide[:, :c] = v
    tall = torch.zeros((c + 5, r))
    tall[:c, :] = v.t()
    every_other = torch.zeros((r, 2 * c))
    every_other[:, ::2] = v
    return {"rows": v, "cols": v.t().contiguous().t(), "rows-padded": wide[:, :c], "cols-padded": tall[:c].t(),
            "strided": every_other[:, ::2]}


LAYOUTS = ["rows", "cols", "rows-padded", "cols-padded", "strided"]


@pytest.mark.parametrize("la", LAYOUTS)
@pytest.mark.parametrize("lb", LAYOUTS)
@pytest.mark.parametrize("shape", [(5, 7, 3), (1, 4, 6), (6, 1, 2), (3, 5, 1)])
def test_operands_give_a_times_b_transposed_to_a_column_major_library(la, lb, shape):
    """D (column-major N × M) = op(B) · op(A), read from raw storage as cuBLASLt reads it, is A·Bᵀ row-major;
    operands that are neither row- nor column-major go as row-major copies, the others as they are."""
    m, n, k = shape
    rng = np.random.default_rng(m * 100 + n * 10 + k)
    a = _layouts(m, k, rng)[la]
    b = _layouts(n, k, rng)[lb]
    b_read, opa = lt._as_operand(b, want_rows=False)
    a_read, opb = lt._as_operand(a, want_rows=True)
    for t, read, name in ((a, a_read, la), (b, b_read, lb)):
        # a 1-wide strided view is also row- or column-major: only wider ones need the copy
        copied = name == "strided" and lt.operand(tuple(t.shape), tuple(t.stride()), want_rows=False) is None
        assert (read.data_ptr() != t.data_ptr()) == copied and (not copied or read.is_contiguous())
    assert (opa.ld >= max(1, opa.rows)) and (opb.ld >= max(1, opb.rows))  # cuBLASLt's layout rule
    d = _stored(b_read, opa) @ _stored(a_read, opb)  # N × M
    assert d.shape == (n, m)
    np.testing.assert_allclose(d.T, (a @ b.t()).numpy(), rtol=1e-6, atol=1e-6)


def test_strides_neither_row_nor_column_major_are_refused():
    x = torch.zeros((4, 6))[:, ::2]  # strides (6, 2)
    assert lt.operand(tuple(x.shape), tuple(x.stride()), want_rows=True) is None


@pytest.mark.parametrize("amaxes", [(3.0, 0.25), (0.0, 2.0), (float("nan"), 1.0), (1e-40, 5.0), (float("inf"), 1.0),
                                    (3e38, 3e38)])
@pytest.mark.parametrize("n", [1, 3, 1025])
def test_alpha_vector_is_the_epilogues_alpha(amaxes, n):
    """Every value the alpha kernel writes is second_level_alpha's, bit for bit (its fallbacks included)."""
    plan = lower("nvfp4")
    num = float(plan.two_level.num)
    aa, ab = (torch.full((), v, dtype=torch.float32, device=DEV) for v in amaxes)
    a = fp.Copy(None, "scaled", aa, num, plan)
    b = fp.Copy(None, "scaled", ab, num, plan)
    got = fp.alpha_vector(a, b, n).cpu().numpy()
    want = np.float32(second_level_alpha(aa, ab, num, num).cpu().numpy())
    assert got.shape == (n,) and np.array_equal(got.view(np.uint32), np.full(n, want).view(np.uint32))


@pytest.mark.skipif(torch.cuda.is_available(), reason="the fallback is for machines without CUDA")
def test_without_cuda_the_cublaslt_choice_is_the_cublas_path(monkeypatch):
    a, b = _scaled_pair(32, 24, 48)
    assert not lt.available(a.values.device)
    monkeypatch.setattr(fp, "GEMM", "cublaslt")
    got = fp.mm(a, b, torch.bfloat16)
    monkeypatch.setattr(fp, "GEMM", "cublas")
    want = fp.mm(a, b, torch.bfloat16)
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))
    monkeypatch.setattr(fp, "GEMM", "cuBLAS")
    with pytest.raises(ValueError, match="cublaslt"):
        fp.mm(a, b, torch.bfloat16)


def _check_bound(got, a, b, out_dtype):
    """``got`` within FP32 summation error of fl(exact A·Bᵀ · alpha); returns the fraction bit-equal to the
    cuBLAS-then-epilogue path."""
    k = a.values.shape[1]
    ref = fp.alpha_epilogue(fp.mm_f32(a.values, b.values), a, b, out_dtype).double().cpu().numpy()
    g = got.double().cpu().numpy()
    av, bv = (c.values.double().cpu().numpy() for c in (a, b))
    alpha = float(second_level_alpha(a.amax, b.amax, a.num, b.num))
    exact = (av @ bv.T) * alpha
    scale = (np.abs(av) @ np.abs(bv).T) * alpha
    ulp = {torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11, torch.float32: 2.0 ** -23}[out_dtype]
    bound = k * 2.0 ** -24 * scale + ulp * np.abs(exact) + 1e-38
    assert np.all(np.abs(g - exact) <= bound)
    return float(np.mean(g == ref))


@CUDA
def test_cublaslt_is_the_epilogue_path_up_to_fp32_summation_order(monkeypatch, capsys):
    """For both pointer modes, every output type, ragged and large shapes and transposed views: within FP32
    summation error of the exact product times alpha; into a NaN-filled output (C is never read); the same bits
    on a second call; most elements equal to the cuBLAS-then-epilogue path's.  A mode cuBLASLt has no algorithm
    for is reported (and must not be the default); fp.mm then still gives the epilogue path's product.  (One
    test, not 54 parametrized ones: CI, without CUDA, would list each as a skip.)"""
    seen, default = {}, lt.POINTER_MODE
    for mode in sorted(lt.POINTER_MODES):
        monkeypatch.setattr(lt, "POINTER_MODE", mode)
        for (m, n, k) in [(256, 192, 512), (130, 264, 96), (8192, 1024, 1024)]:
            for layout in ["rows", "b-transposed-view", "a-transposed-view"]:
                a, b = _scaled_pair(m, n, k)
                if layout == "b-transposed-view":
                    b = b._replace(values=b.values.t().contiguous().t())
                if layout == "a-transposed-view":
                    a = a._replace(values=a.values.t().contiguous().t())
                alpha = fp.alpha_vector(a, b, n if mode == "vector" else 1)
                for dt in (torch.bfloat16, torch.float32, torch.float16):
                    case = (mode, (m, n, k), layout, str(dt))
                    dest = torch.full((m, n), float("nan"), dtype=dt, device="cuda")
                    try:
                        got = lt.matmul(a.values, b.values, alpha, dt, out=dest)
                    except lt.Unsupported:
                        seen[case] = "unsupported"
                        monkeypatch.setattr(fp, "GEMM", "cublaslt")
                        assert _check_bound(fp.mm(a, b, dt), a, b, dt) > 0.99, case  # the fallback's product
                        continue
                    assert got.data_ptr() == dest.data_ptr()
                    seen[case] = "reads C" if torch.isnan(got).any() else "ok"
                    if seen[case] != "ok":
                        continue
                    ib = torch.int32 if dt == torch.float32 else torch.int16
                    again = lt.matmul(a.values, b.values, alpha, dt)
                    assert torch.equal(got.view(ib), again.view(ib)), case
                    same = _check_bound(got, a, b, dt)
                    assert same > 0.5, case
                    seen[case] = f"ok, {same:.4f} bit-equal to the epilogue path"
    with capsys.disabled():
        for case, v in seen.items():
            print("\ncublaslt", *case, v, end="")
    # the default mode runs every product the fast path sends it (BF16 and FP32 outputs; FP16 outputs take the
    # epilogue path: on the H200 cuBLASLt had no FP16-output algorithm with a device alpha)
    bad = {c: v for c, v in seen.items() if c[0] == default and c[3] != "torch.float16" and not v.startswith("ok")}
    assert not bad, bad


@CUDA
def test_cublaslt_in_a_cuda_graph_and_on_two_streams_gives_the_eager_bits(monkeypatch):
    monkeypatch.setattr(fp, "GEMM", "cublaslt")
    pairs = [_scaled_pair(512, 384, 256, seed=s) for s in (1, 2)]
    eager = [fp.mm(a, b, torch.bfloat16) for a, b in pairs]
    g = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fp.mm(*pairs[0], torch.bfloat16)  # warm-up on the capture's stream (plans and workspace exist)
    torch.cuda.current_stream().wait_stream(side)
    with torch.cuda.graph(g):
        captured = fp.mm(*pairs[0], torch.bfloat16)
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured.view(torch.int16), eager[0].view(torch.int16))
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    outs = [None, None]
    for _ in range(3):
        for i, (s, (a, b)) in enumerate(zip(streams, pairs)):
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                outs[i] = fp.mm(a, b, torch.bfloat16)
        torch.cuda.synchronize()
        for o, e in zip(outs, eager):
            assert torch.equal(o.view(torch.int16), e.view(torch.int16))


@CUDA
def test_a_linear_on_cublaslt_gives_the_cublas_paths_result(monkeypatch):
    """y, dX and dW of an every-copy-scaled NVFP4 layer: the same within FP32 summation order and one rounding."""
    outs = {}
    for path in ("cublas", "cublaslt"):
        monkeypatch.setattr(fp, "GEMM", path)
        torch.manual_seed(0)
        layer = fnn.Linear(1024, 768, bias=False, recipe="nvfp4_paper", name="L", seed=1, gemm="blas").cuda()
        x = torch.randn(4, 512, 1024, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            y = layer(x)
        (y.float() * torch.linspace(-1, 1, 768, device="cuda")).sum().backward()
        outs[path] = [y.float(), x.grad.float(), layer.weight.grad.float()]
    for name, a, b in zip(("y", "dx", "dw"), outs["cublas"], outs["cublaslt"]):
        err = (a - b).abs().max().item()
        assert err <= 2.0 ** -7 * a.abs().max().item(), (name, err)  # one BF16 rounding apart at most
