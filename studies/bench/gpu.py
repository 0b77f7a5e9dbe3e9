"""GPU benchmark of the torch backend (run on the device machine): throughput vs copy bandwidth, GEMMs, bit identity.

    python -m studies.bench.gpu --out reports/bench_gpu.md

Bandwidth fractions count the bytes each operation must move (input read + output written, scales
included) over its time, divided by the device-to-device copy bandwidth (read + write) measured in the
same run.  "incl. amax" rows add the tensor-amax pass's time but count only the input once: with the
amax a second read of the input, 53 % is their ceiling for NVFP4.  The GB/s column is float32-equivalent
(elements × 4 B over the time) for every row, whatever the row reads and writes: a rate of elements, not of bytes.
"""

from __future__ import annotations

import argparse
import datetime as dt
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

import fpsim
from fpsim.io import atomic_write
from fpsim.plan import lower
from fpsim.torch import backend as tb
from fpsim.torch import codecs as tcodecs
from fpsim.torch import gemm as tgemm
from fpsim.torch.quantize import absmax, quantize_fused


def cuda_time(fn, reps: int = 50) -> float:
    """Mean seconds per call over ``reps`` calls after one warm-up (CUDA events).  50: a mean of 10 calls of
    MXFP4 quantize once read 0.552 ms where 50 calls read 0.442 (H200, 2026-12-02)."""
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 1e3 / reps


def same(a, b) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype == np.float32:
        return a.shape == b.shape and a.view(np.uint32).tobytes() == np.asarray(b, np.float32).view(np.uint32).tobytes()
    return bool(np.array_equal(a, b))


def bit_identity(x: torch.Tensor) -> list[tuple[str, bool]]:
    """Fused kernels on the GPU against the Numba reference on the same (adversarial) sample."""
    xs = x[: (1 << 22) // x.shape[1]].clone()
    xs[0, :16] = 1e-7
    xs[1] = 0
    xs[2, :40] *= 1e-40
    xs[3, :16] = 2.5 * 448 / 6
    xs[4, ::7] *= 1e5
    xs[5, :3] = torch.tensor([float("inf"), -float("inf"), -0.0])
    xn = xs.clone()
    xn[6, 9] = float("nan")
    out = []
    for label, t in (("finite + inf", xs), ("with a NaN", xn)):
        xc = t.cpu().numpy()
        q = fpsim.quantize(xc, "nvfp4")
        tq = tb.quantize(t, "nvfp4")
        ok = (same(tq.data.cpu().numpy(), q.data) and same(tq.scales.cpu().numpy(), q.scales)
              and same(tq.amax.cpu().numpy(), q.amax))
        out.append((f"NVFP4 1×16 codes, scales, amax ({label})", ok))
        out.append((f"NVFP4 dequantize float32 ({label})", same(tq.dequantize().cpu().numpy(), q.dequantize())))
    xc = xs.cpu().numpy()
    q = fpsim.quantize(xc, "nvfp4", block=(16, 16))
    tq = tb.quantize(xs, "nvfp4", block=(16, 16))
    out.append(("NVFP4 16×16 codes and scales", same(tq.data.cpu().numpy(), q.data)
                and same(tq.scales.cpu().numpy(), q.scales)))
    ok = True
    for scheme in ("mxfp4", "mxfp6_e2m3", "mxfp6_e3m2", "mxfp8_e4m3", "mxfp8_e5m2"):
        for rule in ("floor", "ceil", "even", "rceil"):
            q = fpsim.quantize(xc, scheme, scale_rule=rule)
            tq = tb.quantize(xs, scheme, scale_rule=rule)
            ok &= same(tq.data.cpu().numpy(), q.data) and same(tq.scales.cpu().numpy(), q.scales)
            ok &= same(tq.dequantize().cpu().numpy(), q.dequantize())
    out.append(("MX (5 element formats × 4 scale rules) codes, scales, dequantize", ok))
    out.append(("NVFP4 fake-quantize (fused) = quantize ∘ dequantize",
                same(tb.fake_quantize(xs, "nvfp4").cpu().numpy(), fpsim.fake_quantize(xc, "nvfp4"))))
    for scheme in ("fp8_e4m3", "fp8_e5m2", "fp8_block128"):
        q = fpsim.quantize(xc, scheme)
        t = tb.quantize(xs, scheme)
        out.append((f"{scheme} codes, scales, dequantize", same(t.data.cpu().numpy(), q.data)
                    and same(t.scales.cpu().numpy(), q.scales) and same(t.dequantize().cpu().numpy(), q.dequantize())))
    for change in ({"four_over_six": True}, {"per_row_scale": True}):
        sch = fpsim.get_scheme("nvfp4").replace(**change)
        out.append((f"NVFP4 {', '.join(change)} fake-quantize (torch on the GPU)",
                    same(tb.fake_quantize(xs, sch).cpu().numpy(), fpsim.fake_quantize(xc, sch))))
    out.append(("E4M3 encode (fused)", same(tcodecs.encode_fused(xs, "e4m3").cpu().numpy(),
                                             fpsim.encode(xc, "e4m3"))))
    ok = True  # the RHT (one Triton kernel); NaNs are compared as NaNs (canonical on both sides after BF16)
    for dh, signs, bf16 in ((16, "recipe", True), (16, 5, False), (128, 9, True)):
        want = fpsim.rht(xc, dh, signs, bf16_in=bf16, bf16_out=bf16)
        got = tb.rht(xs, dh, signs, bf16_in=bf16, bf16_out=bf16).cpu().numpy()
        nan = np.isnan(want)
        ok &= bool(np.array_equal(np.isnan(got), nan)) and same(got[~nan], want[~nan])
    out.append(("RHT (d = 16 recipe signs, 16 seeded, 128; BF16 in/out and float32)", ok))
    return out


TABLE_HEADER = ("| operation | ms | float32-equivalent GB/s (4 B × elements) "
                "| bytes moved / time, fraction of copy bandwidth |")


def operations(p) -> list[tuple[str, object, float, int]]:
    """(label, call, GB the call must move, calls timed) of each row of the throughput table.  ``p`` holds the
    prepared inputs (``x`` float32, ``xbf`` its BF16 copy, ``amax``, the quantized ``qn``/``qm``/``q8``); the calls
    read them only when timed, so labels and byte counts are checked without a GPU (tests/test_bench_labels.py).
    Bytes moved: input read + output written, scales included (see the module docstring)."""
    n_el = p.x.numel()
    f32, bf16 = n_el * 4 / 1e9, n_el * 2 / 1e9  # GB of one float32 / one BF16 pass over the elements
    nv_out = n_el * (0.5 + 1 / 16) / 1e9
    per_row = fpsim.get_scheme("nvfp4").replace(per_row_scale=True)
    fos = fpsim.get_scheme("nvfp4").replace(four_over_six=True)
    nv_sr = lower("nvfp4", rounding="sr")
    out = []

    def row(label, fn, moved_gb, reps=50):
        out.append((label, fn, moved_gb, reps))

    row("tensor amax (fused, one read)", lambda: absmax(p.x), f32)
    row("NVFP4 1×16 quantize, amax given (one fused pass)", lambda: tb.quantize(p.x, "nvfp4", tensor_amax=p.amax),
        f32 + nv_out)
    row("NVFP4 1×16 quantize incl. amax pass", lambda: tb.quantize(p.x, "nvfp4"), f32 + nv_out)
    row("NVFP4 16×16 quantize incl. amax pass (tile amax in the same pass)",
        lambda: tb.quantize(p.x, "nvfp4", block=(16, 16)), f32 + nv_out)
    row("NVFP4 1×16 quantize, stochastic rounding (Philox, k = 8), amax given",
        lambda: tb.quantize(p.x, "nvfp4", rounding="sr", tensor_amax=p.amax, seed=1), f32 + nv_out)
    row("NVFP4 1×16 quantize, per-row second-level scales (row amax by torch ops)",
        lambda: tb.quantize(p.x, per_row), f32 + nv_out)
    row("NVFP4 dequantize → float32", lambda: p.qn.dequantize(), f32 + nv_out)
    row("NVFP4 dequantize → BF16", lambda: p.qn.dequantize(torch.bfloat16), bf16 + nv_out)
    row("NVFP4 fake-quantize (float32 → float32) incl. amax", lambda: tb.fake_quantize(p.x, "nvfp4"), 2 * f32)
    row("MXFP4 quantize (rceil)", lambda: tb.quantize(p.x, "mxfp4"), f32 + n_el * (0.5 + 1 / 32) / 1e9)
    row("MXFP4 dequantize → float32", lambda: p.qm.dequantize(), f32 + n_el * (0.5 + 1 / 32) / 1e9)
    row("MXFP8 E4M3 quantize (rceil)", lambda: tb.quantize(p.x, "mxfp8_e4m3"), f32 + n_el * (1 + 1 / 32) / 1e9)
    row("MXFP8 E4M3 dequantize → float32", lambda: p.q8.dequantize(), f32 + n_el * (1 + 1 / 32) / 1e9)
    row("FP8 E4M3 per-tensor quantize incl. amax pass (IEEE x / d)", lambda: tb.quantize(p.x, "fp8_e4m3"),
        f32 + n_el / 1e9)
    row("FP8 E4M3 1×128 blockwise quantize (FP32 scales)", lambda: tb.quantize(p.x, "fp8_block128"),
        f32 + n_el * (1 + 4 / 128) / 1e9)
    row("E4M3 element encode (fused)", lambda: tcodecs.encode_fused(p.x, "e4m3"), f32 + n_el / 1e9)
    row("eager torch NVFP4 quantize (`impl=\"eager\"`)", lambda: tb.quantize(p.x, "nvfp4", impl="eager"),
        f32 + nv_out, reps=3)
    row("NVFP4 four-over-six (MSE) fake-quantize incl. amax (fused: both candidates, float64 errors)",
        lambda: tb.fake_quantize(p.x, fos), 2 * f32, reps=3)
    row("RHT d = 16, BF16 in/out, float32 storage (one Triton kernel)", lambda: tb.rht(p.x, 16), 2 * f32)
    row("RHT d = 16, the same as eager torch operations (before)", lambda: tb.rht(p.x, 16, impl="eager"), 2 * f32,
        reps=3)
    # Wgrad's copies: the RHT of Xᵀ with its amax, from BF16 X: one BF16 read and one BF16 write
    row("Wgrad RHT of Xᵀ + amax, BF16, one pass (`rht_transposed`: 8 token tiles and one atomic per program)",
        lambda: tb.rht_transposed(p.xbf, 16, out_dtype=torch.bfloat16, amax=True), 2 * bf16)
    row("  the same as transpose copy + RHT + amax pass (three kernels, the path before)",
        lambda: absmax(tb.rht(p.xbf.t().contiguous(), 16, out_dtype=torch.bfloat16)), 2 * bf16)

    def wide(fn):  # rht_t_kernel's WIDE layout (fpsim.torch.rht.RHT_T_WIDE) around one call
        from fpsim.torch import rht as trht

        def call():
            trht.RHT_T_WIDE = True
            try:
                return fn()
            finally:
                trht.RHT_T_WIDE = False
        return call

    row("  the same, WIDE layout (one 128-token × 64-column tile per program, 256-byte row stores)",
        wide(lambda: tb.rht_transposed(p.xbf, 16, out_dtype=torch.bfloat16, amax=True)), 2 * bf16)
    row("  the same with X's own amax from the same read (`rht_transposed_amaxes`, the \"shared\" Wgrad path)",
        lambda: tb.rht_transposed_amaxes(p.xbf, 16, out_dtype=torch.bfloat16), 2 * bf16)
    row("    and WIDE", wide(lambda: tb.rht_transposed_amaxes(p.xbf, 16, out_dtype=torch.bfloat16)), 2 * bf16)

    def wgrad_two_kernels():
        xt, am = tb.rht_transposed(p.xbf, 16, out_dtype=torch.bfloat16, amax=True)
        return quantize_fused(xt, nv_sr, am, fake=True, apply_s_dec=False, out_dtype=torch.bfloat16, seed=1)

    row("Wgrad's scaled NVFP4 SR copy of RHT(Xᵀ): `rht_transposed` + fused quantize (writes and rereads Xᵀ)",
        wgrad_two_kernels, 2 * bf16)
    row("  the same, amax pass + RHT and quantize in registers (`rht_transposed_scaled`, Xᵀ never written)",
        lambda: tb.rht_transposed_scaled(p.xbf, nv_sr, 16, seed=1), 2 * bf16)

    def both_separately():  # Dgrad's dY copy and Wgrad's dYᵀ copy, each with its own passes
        am = absmax(p.xbf)
        plain = quantize_fused(p.xbf, nv_sr, am, fake=True, apply_s_dec=False, out_dtype=torch.bfloat16, seed=2)
        return plain, tb.rht_transposed_scaled(p.xbf, nv_sr, 16, seed=1)

    def both_paired():
        am_p, am_t = tb.rht_t_amaxes(p.xbf, 16)
        return tb.rht_transposed_scaled_pair(p.xbf, nv_sr, 16, amax=am_t, plain_amax=am_p, seed=1, plain_seed=2)

    # two copies of dY: one BF16 read and two BF16 writes (counted as one write before 2026-12-04)
    row("Dgrad's and Wgrad's SR copies of one BF16 dY: amax + quantize, and amax pass + fused RHT quantize "
        "(four passes)", both_separately, 3 * bf16)
    row("  the same, one shared amax read + one pass writing both (`rht_t_amaxes`, `rht_transposed_scaled_pair`)",
        both_paired, 3 * bf16)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=1 << 28)
    ap.add_argument("--gemm", type=int, default=8192)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    dev = torch.device("cuda")
    name = torch.cuda.get_device_name(0)
    g = torch.Generator(device=dev).manual_seed(0)
    x = torch.randn(args.n // 4096, 4096, device=dev, generator=g)
    n_el = x.numel()
    gb = n_el * 4 / 1e9
    y = torch.empty_like(x)
    t_copy = cuda_time(lambda: y.copy_(x))
    copy_bw = 2 * gb / t_copy
    p = SimpleNamespace(x=x, amax=absmax(x), xbf=x.bfloat16())  # xbf: Wgrad's copies read BF16 X (tokens × features)
    p.qn = tb.quantize(x, "nvfp4", tensor_amax=p.amax)
    p.qm = tb.quantize(x, "mxfp4")
    p.q8 = tb.quantize(x, "mxfp8_e4m3")
    rows = []
    for label, fn, moved_gb, reps in operations(p):
        t = cuda_time(fn, reps)
        rows.append((label, t * 1e3, gb / t, moved_gb / t / copy_bw))
    p = None  # free the BF16 copy and the quantized tensors

    checks = bit_identity(x)
    y = None  # free the GPU memory before the GEMMs
    torch.cuda.empty_cache()

    # GEMMs
    n = args.gemm
    a_ = torch.randn(n, n, device=dev, generator=g)
    b_ = torch.randn(n, n, device=dev, generator=g)
    ab, bb = a_.bfloat16(), b_.bfloat16()
    t_bf16 = cuda_time(lambda: ab @ bb.T, 10)
    qa = tb.quantize(a_, "nvfp4")
    qb = tb.quantize(b_, "nvfp4")
    t_nv = cuda_time(lambda: tgemm.gemm_bf16_exact(qa, qb), 10)
    t_nvb = cuda_time(lambda: tgemm.gemm_bf16_exact(qa, qb, torch.bfloat16), 10)
    wa, wb = tgemm.scaled_values_bf16(qa), tgemm.scaled_values_bf16(qb)
    t_deq = cuda_time(lambda: (tgemm.scaled_values_bf16(qa), tgemm.scaled_values_bf16(qb)), 10)
    t_mm32 = cuda_time(lambda: torch.mm(wa, wb.t(), out_dtype=torch.float32), 10)
    t_mm16 = cuda_time(lambda: torch.mm(wa, wb.t()), 10)
    t_nvq = cuda_time(lambda: tgemm.gemm_bf16_exact(tb.quantize(a_, "nvfp4"), tb.quantize(b_, "nvfp4")), 10)
    fa = tb.TorchQuantized.from_quantized(fpsim.quantize(a_.cpu().numpy(), "fp8_e4m3"), dev)
    fb = tb.TorchQuantized.from_quantized(fpsim.quantize(b_.cpu().numpy(), "fp8_e4m3"), dev)
    t_fp8 = cuda_time(lambda: tb.gemm(fa, fb, "blas"), 10)
    gemm_rows = [
        ("BF16 `torch.matmul` (BF16 out)", t_bf16),
        ("NVFP4 × NVFP4, quantized operands: exact dequantize to BF16 + BF16 GEMM (FP32 out) × alpha", t_nv),
        ("the same, BF16 output (the FP32 result rounded to BF16, as `torch.matmul` outputs)", t_nvb),
        ("FP32 output, including the quantization of both operands (fused kernels)", t_nvq),
        ("  of which: both exact dequantizations to BF16", t_deq),
        ("  of which: the BF16 GEMM with FP32 output (`mm.dtype`), no alpha", t_mm32),
        ("  of which: the BF16 GEMM with BF16 output, no alpha", t_mm16),
        ("FP8 E4M3 per-tensor × FP8 E4M3 on FP8 tensor cores (`torch._scaled_mm`, FP32 out)", t_fp8),
    ]
    # fp32 model on the GPU (bit-defined order) against Numba on a smaller problem
    m2, k2 = 512, 2048
    xa = torch.randn(m2, k2, generator=g, device=dev)
    xb = torch.randn(m2, k2, generator=g, device=dev)
    qa2, qb2 = tb.quantize(xa, "nvfp4"), tb.quantize(xb, "nvfp4")
    ref = fpsim.gemm(qa2.to_quantized(), qb2.to_quantized(), "fp32", backend="numba-cpu")
    got = tb.gemm(qa2, qb2, "fp32").cpu().numpy()
    t_fp32 = cuda_time(lambda: tb.gemm(qa2, qb2, "fp32"), 3)
    checks.append((f"NVFP4 GEMM `fp32` model {m2}×{m2}×{k2} on the GPU = Numba", same(got, ref)))
    exact = fpsim.gemm(qa2.to_quantized(), qb2.to_quantized(), "exact", backend="numba-cpu")
    blas = tgemm.gemm_bf16_exact(qa2, qb2).cpu().numpy().astype(np.float64)
    mag = np.abs(qa2.to_quantized().dequantize()).astype(np.float64) @ np.abs(
        qb2.to_quantized().dequantize()).astype(np.float64).T
    rel = float(np.max(np.abs(blas - exact) / mag))
    fa2 = tb.TorchQuantized.from_quantized(fpsim.quantize(xa.cpu().numpy(), "fp8_e4m3"), dev)
    fb2 = tb.TorchQuantized.from_quantized(fpsim.quantize(xb.cpu().numpy(), "fp8_e4m3"), dev)
    exact8 = fpsim.gemm(fa2.to_quantized(), fb2.to_quantized(), "exact", backend="numba-cpu")
    mag8 = np.abs(fa2.to_quantized().dequantize()).astype(np.float64) @ np.abs(
        fb2.to_quantized().dequantize()).astype(np.float64).T
    rel8 = float(np.max(np.abs(tb.gemm(fa2, fb2, "blas").cpu().numpy() - exact8) / mag8))
    fp32m = fpsim.gemm(fa2.to_quantized(), fb2.to_quantized(), "fp32", backend="numba-cpu")
    rel32 = float(np.max(np.abs(fp32m - exact8) / mag8))

    lines = [
        f"# GPU benchmark ({name})",
        "",
        f"Generated by `python -m studies.bench.gpu` on {dt.date.today().isoformat()} on the device machine ({name}, "
        f"torch {torch.__version__}). Input {tuple(x.shape)} float32 ({gb:.2f} GB). Device-to-device copy: "
        f"**{copy_bw:.0f} GB/s** (read + write) in the same run. Fused rows are the Triton kernels of "
        "`fpsim/torch/kernels_quant.py` (device functions in `fpsim/torch/kernels.py`).",
        "",
        "The float32-equivalent GB/s column is elements × 4 B / time whatever the operation reads and writes "
        "(BF16 inputs, codes, float32 or BF16 outputs); the last column counts the bytes each operation moves.",
        "",
        TABLE_HEADER,
        "|---|---:|---:|---:|",
    ]
    lines += [f"| {lbl} | {ms:.3f} | {v:.0f} | {f:.0%} |" for lbl, ms, v, f in rows]
    lines += ["", f"GEMM {n}×{n}×{n}:", "", "| GEMM | ms | × BF16 |", "|---|---:|---:|"]
    lines += [f"| {lbl} | {t * 1e3:.2f} | {t / t_bf16:.2f}× |" for lbl, t in gemm_rows]
    lines += [
        "",
        f"The bit-defined `fp32` accumulator model on the GPU ({m2}×{m2}×{k2}, 128 K-chunks): {t_fp32 * 1e3:.1f} ms. "
        f"Accumulation error, max over C of |C − C_exact| / Σ|a||b| ({m2}×{m2}×{k2}): NVFP4 via BF16 tensor cores "
        f"{rel:.1e}; FP8 E4M3 via FP8 tensor cores {rel8:.1e}; the `fp32` model (FP32 accumulator) on the same FP8 "
        f"operands {rel32:.1e}. Hopper's FP8 tensor cores accumulate with fewer bits than FP32.",
        "",
        "Bit identity with the Numba CPU reference (same inputs, adversarial rows: zero, tiny, subnormal, E4M3 scale "
        "tie, ×1e5 outliers, ±inf, −0, NaN):",
        "",
    ]
    lines += [f"- {lbl}: {'identical' if ok else '**DIFFERENT**'}" for lbl, ok in checks]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(args.out, text)


if __name__ == "__main__":
    main()
