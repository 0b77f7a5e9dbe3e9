"""Benchmark of block-scaled quantize/dequantize (`make bench`): GB/s of float32 input, ratios.

Same-run baselines: a read-only pass (``x.max()``), a plain-NumPy NVFP4
fake-quantizer as a user would write it by hand (E2M1 rounding with
``searchsorted`` on the midpoints, E4M3 scales via ml_dtypes), the same with
ml_dtypes casts for both the scales and the elements, and an ml_dtypes MXFP8
quantizer.  Each baseline is checked against fpsim's bits before it is timed,
so the comparison is between implementations that compute the same thing.

    python -m studies.bench_scaling --out reports/bench_scaling.md [--n 16777216] [--repeat 3]
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import sys
from pathlib import Path

import ml_dtypes
import numpy as np

import fpsim
from fpsim._jit import get_num_threads, set_num_threads
from fpsim.scaling import dequantize, quantize
from studies.benchlib import best_time, write_report

E2M1_VALUES = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6], np.float32)
E2M1_MIDS = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5], np.float32)
TIE_DOWN = np.array([True, False, True, False, True, False, True])  # ties to the even code


def numpy_e2m1_rne(v: np.ndarray) -> np.ndarray:
    """E2M1 RNE by hand: bucket by midpoints, then send exact ties to the even code."""
    a = np.minimum(np.abs(v), np.float32(6))
    idx = np.searchsorted(E2M1_MIDS, a, side="right")
    tie = np.isin(a, E2M1_MIDS[TIE_DOWN])
    idx -= tie
    return np.copysign(E2M1_VALUES[idx], v)


def numpy_nvfp4(x: np.ndarray, e2m1=numpy_e2m1_rne) -> np.ndarray:
    """NVFP4 1×16 fake quantization in plain NumPy, TE's operation order (SPEC §4)."""
    f = np.float32
    xb = x.reshape(-1, 16)
    amax = np.abs(x).max()
    s_enc = f(min(f(2688) / amax, np.finfo(np.float32).max)) if amax > 0 else f(1)
    s_dec = f(1) / s_enc
    vmax = np.abs(xb).max(axis=1)
    sdb = np.minimum(vmax * (s_enc * (f(1) / f(6))), f(448))
    s_b = sdb.astype(ml_dtypes.float8_e4m3fn).astype(np.float32)
    with np.errstate(divide="ignore"):
        enc = np.minimum(f(1) / (s_b * s_dec), np.finfo(np.float32).max)
    q = e2m1(xb * enc[:, None])
    return ((q * s_b[:, None]) * s_dec).reshape(x.shape)


def mlcast_e2m1(v: np.ndarray) -> np.ndarray:
    return v.astype(ml_dtypes.float4_e2m1fn).astype(np.float32)


def numpy_mxfp8(x: np.ndarray) -> np.ndarray:
    """MXFP8 E4M3 fake quantization with ml_dtypes casts; rceil scale from the exponent bits."""
    xb = x.reshape(-1, 32)
    amax = np.abs(xb).max(axis=1)
    t = amax * np.float32(1 / 448)
    bits = t.view(np.uint32)
    e = (bits >> 23).astype(np.int32) - 127 + ((bits & 0x7FFFFF) != 0)  # ceil(log2 t) for normal t
    scale = np.ldexp(np.float32(1), e).astype(np.float32)
    q = (xb / scale[:, None]).astype(ml_dtypes.float8_e4m3fn).astype(np.float32)
    return (q * scale[:, None]).reshape(x.shape)




def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1 << 24)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()

    n = args.n - args.n % 4096
    x = np.random.default_rng(0).standard_normal((n // 4096, 4096)).astype(np.float32)
    gb = x.nbytes / 1e9
    ncores = get_num_threads()
    print(f"{n} float32 values as {x.shape}, {ncores} cores", file=sys.stderr)
    read_bw = gb / best_time(lambda: x.max(), args.repeat)

    # Baselines compute the same bits as fpsim (checked), then are timed.
    ref = dequantize(quantize(x, "nvfp4"))
    base = {}
    for name, fn in [
        ("plain NumPy (searchsorted E2M1)", lambda: numpy_nvfp4(x)),
        ("NumPy + ml_dtypes casts", lambda: numpy_nvfp4(x, mlcast_e2m1)),
    ]:
        same = np.array_equal(fn().view(np.uint32), ref.view(np.uint32))
        base[name] = (gb / best_time(fn, max(1, args.repeat - 1)), same)
        print(f"  baseline {name}: {base[name][0]:.3f} GB/s, same bits: {same}", file=sys.stderr)
    mx_ref = dequantize(quantize(x, "mxfp8_e4m3"))
    mx_same = np.array_equal(numpy_mxfp8(x).view(np.uint32), mx_ref.view(np.uint32))
    mx_base = gb / best_time(lambda: numpy_mxfp8(x), max(1, args.repeat - 1))

    cases = [("nvfp4", (1, 16)), ("nvfp4", (16, 16)), ("mxfp4", None), ("mxfp8_e4m3", None)]
    rows = []
    for scheme, block in cases:
        kw = {} if block is None else {"block": block}
        r = {"scheme": scheme + ("" if block is None else f" {block[0]}×{block[1]}")}
        for threads in (1, ncores):
            set_num_threads(threads)
            tq = best_time(lambda: quantize(x, scheme, **kw), args.repeat)
            q = quantize(x, scheme, **kw)
            td = best_time(lambda: dequantize(q), args.repeat)
            r[f"q{threads}"], r[f"d{threads}"] = gb / tq, gb / td
            if threads == 1:
                buf = np.empty_like(x)
                r["dout1"] = gb / best_time(lambda: dequantize(q, out=buf), args.repeat)
                if scheme == "nvfp4":
                    amax = float(q.amax)
                    r["qa1"] = gb / best_time(lambda: quantize(x, scheme, tensor_amax=amax, **kw), args.repeat)
        set_num_threads(ncores)
        r["bits"] = q.bits_per_element
        rows.append(r)
        print(f"  {r['scheme']}: quantize {r['q1']:.2f} GB/s (1 thread)", file=sys.stderr)

    numpy_bw = base["plain NumPy (searchsorted E2M1)"][0]
    ml_bw = base["NumPy + ml_dtypes casts"][0]
    lines = [
        "# Block-scaling benchmark",
        "",
        f"Generated by `make bench` (`studies/bench_scaling.py`) on {dt.date.today().isoformat()}: "
        f"{platform.machine()}, {os.cpu_count()} cores, numpy {np.__version__}, ml_dtypes {ml_dtypes.__version__}, "
        f"fpsim {fpsim.__version__}. Input {x.shape} float32 N(0,1) ({gb * 1e3:.0f} MB), best of {args.repeat}; "
        "GB/s of float32 input (quantize includes the tensor-amax pass).",
        "",
        f"Same-run baselines: read-only `x.max()` **{read_bw:.2f} GB/s**; NVFP4 fake-quant in plain NumPy "
        f"**{numpy_bw:.3f} GB/s** (same bits as fpsim: {base['plain NumPy (searchsorted E2M1)'][1]}); "
        f"with ml_dtypes casts **{ml_bw:.3f} GB/s** (same bits: {base['NumPy + ml_dtypes casts'][1]}); "
        f"MXFP8 with ml_dtypes casts **{mx_base:.3f} GB/s** (same bits: {mx_same}).",
        "",
        "| scheme | bits/elem | quantize 1 thr GB/s | quantize all GB/s | speed-up | ÷ read-only (1 thr) | "
        "÷ plain NumPy NVFP4 | ÷ ml_dtypes-cast | quantize, amax given, 1 thr | dequantize 1 thr GB/s | "
        "dequantize all GB/s | speed-up | dequantize into a reused buffer, 1 thr (÷ read-only) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        ml_ref = mx_base if r["scheme"].startswith("mxfp8") else ml_bw
        lines.append(
            f"| {r['scheme']} | {r['bits']:.3f} | {r['q1']:.2f} | {r[f'q{ncores}']:.2f} | "
            f"{r[f'q{ncores}'] / r['q1']:.2f}× | {r['q1'] / read_bw:.0%} | {r['q1'] / numpy_bw:.0f}× | "
            f"{r['q1'] / ml_ref:.0f}× | {r['qa1']:.2f} |" if "qa1" in r else
            f"| {r['scheme']} | {r['bits']:.3f} | {r['q1']:.2f} | {r[f'q{ncores}']:.2f} | "
            f"{r[f'q{ncores}'] / r['q1']:.2f}× | {r['q1'] / read_bw:.0%} | {r['q1'] / numpy_bw:.0f}× | "
            f"{r['q1'] / ml_ref:.0f}× | — |"
        )
        lines[-1] += (f" {r['d1']:.2f} | {r[f'd{ncores}']:.2f} | {r[f'd{ncores}'] / r['d1']:.2f}× | "
                      f"{r['dout1']:.2f} ({r['dout1'] / read_bw:.0%}) |")
    lines += ["", "The ml_dtypes-cast column compares NVFP4/MXFP4 rows with the NVFP4 ml_dtypes baseline and "
              "the MXFP8 row with the MXFP8 ml_dtypes baseline. \"amax given\" passes `tensor_amax=` (delayed "
              "scaling, or an amax fused into the producer), so it skips the amax pass; \"reused buffer\" passes "
              "`out=` to `dequantize`, which saves the allocation and page faults of a fresh 4-byte-per-element "
              "output."]
    text = "\n".join(lines) + "\n"
    write_report(text, args.out)


if __name__ == "__main__":
    main()
