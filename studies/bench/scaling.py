"""Benchmark of block-scaled quantize/dequantize (`make bench`): GB/s of float32 data, ratios.

Same-run baselines: a read-only pass (``x.max()``), a plain-NumPy NVFP4
fake-quantizer as a user would write it by hand (E2M1 rounding with
``searchsorted`` on the midpoints, E4M3 scales via ml_dtypes), the same with
ml_dtypes casts for both the scales and the elements, and an ml_dtypes MXFP8
quantizer.  Each baseline is checked against fpsim's bits before it is timed,
so the comparison is between implementations that compute the same thing.

    python -m studies.bench.scaling --out reports/bench_scaling.md [--n 16777216] [--repeat 3]
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
from fpsim._scaling_kernels import row_absmax_bits
from fpsim.scaling import dequantize, quantize
from studies.bench.common import best_times, on_threads, round_ratio, round_times, write_report

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


def numpy_nvfp4_dequant(q) -> np.ndarray:
    """NVFP4 1×16 dequantization in plain NumPy: unpack nibbles, E2M1 table, E4M3 scales via ml_dtypes."""
    f = np.float32
    codes = q.data.reshape(-1, q.data.shape[-1])
    nib = np.empty((codes.shape[0], codes.shape[1] * 2), np.uint8)
    nib[:, 0::2] = codes & 0xF
    nib[:, 1::2] = codes >> 4
    table = np.concatenate([E2M1_VALUES, -E2M1_VALUES])
    s_b = q.scales.reshape(codes.shape[0], -1).view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    amax = f(q.amax)
    s_enc = f(min(f(2688) / amax, np.finfo(np.float32).max)) if amax > 0 else f(1)
    s_dec = f(1) / s_enc
    e = table[nib].reshape(codes.shape[0], -1, 16)
    return ((e * s_b[:, :, None]) * s_dec).reshape(q.shape)


def baseline_repeat(repeat: int) -> int:
    """Rounds of the four same-run baselines (each 10–60× slower than the kernels)."""
    return max(1, repeat // 3)


def rounds_note(repeat: int) -> str:
    return (f"best of {repeat} rounds (the plain-NumPy, ml_dtypes and MXFP8 baselines: best of "
            f"{baseline_repeat(repeat)} rounds)")


def drift_note(read_gbs: list[float]) -> str:
    """The spread of this run's one-thread read-only passes (GB/s of every round of every scheme), measured
    rather than asserted: how much the machine's speed moved while the table was taken."""
    lo, hi = min(read_gbs), max(read_gbs)
    mean = float(np.mean(read_gbs))
    return (f"the read-only pass ran at {lo:.1f}–{hi:.1f} GB/s over this run's {len(read_gbs)} rounds (mean "
            f"{mean:.1f}, ±{(hi - lo) / 2 / mean:.0%})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1 << 26)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()

    n = args.n - args.n % 4096
    x = np.random.default_rng(0).standard_normal((n // 4096, 4096)).astype(np.float32)
    gb = x.nbytes / 1e9
    ncores = get_num_threads()
    print(f"{n} float32 values as {x.shape}, {ncores} cores", file=sys.stderr)

    def read_only():
        x.max()

    # Every speed is paired with a read-only pass timed in the same rounds (interleaved), and ratios are
    # taken between such normalised speeds: the machine's drift cancels out.
    def paired(fn, repeat):
        t = best_times({"read": read_only, "fn": fn}, repeat)
        return gb / t["fn"], gb / t["read"]

    # Baselines compute the same bits as fpsim (checked), then are timed.
    q16 = quantize(x, "nvfp4")
    ref = dequantize(q16)
    base = {}
    for name, fn in [
        ("numpy", lambda: numpy_nvfp4(x)),
        ("ml_dtypes", lambda: numpy_nvfp4(x, mlcast_e2m1)),
        ("numpy_dequant", lambda: numpy_nvfp4_dequant(q16)),
    ]:
        same = np.array_equal(fn().view(np.uint32), ref.view(np.uint32))
        base[name] = (*paired(fn, baseline_repeat(args.repeat)), same)
        print(f"  baseline {name}: {base[name][0]:.3f} GB/s, same bits: {same}", file=sys.stderr)
    mx_ref = dequantize(quantize(x, "mxfp8_e4m3"))
    mx_same = np.array_equal(numpy_mxfp8(x).view(np.uint32), mx_ref.view(np.uint32))
    base["mxfp8"] = (*paired(lambda: numpy_mxfp8(x), baseline_repeat(args.repeat)), mx_same)

    def fresh_output():
        np.empty_like(x).fill(1.0)

    write_bw, write_read = paired(fresh_output, args.repeat)

    # The memory system's own scaling: a parallel read-only pass (a row-max kernel) on one thread and on all
    # cores, taking turns.  A kernel that is partly memory-bound cannot scale much better than this.
    bits, row_max = x.view(np.uint32), np.empty(x.shape[0], np.uint32)

    def parallel_read():
        row_absmax_bits(bits, False, row_max)

    t = round_times({"1": on_threads(1, parallel_read), "all": on_threads(ncores, parallel_read)}, args.repeat)
    read_scale = round_ratio(t, "1", "all")
    set_num_threads(ncores)

    cases = [("nvfp4", (1, 16)), ("nvfp4", (16, 16)), ("mxfp4", None), ("mxfp8_e4m3", None)]
    rows = []
    for scheme, block in cases:
        kw = {} if block is None else {"block": block}
        r = {"scheme": scheme + ("" if block is None else f" {block[0]}×{block[1]}")}
        q = quantize(x, scheme, **kw)
        buf = np.empty_like(x)

        # One-thread and all-core runs take turns in the same rounds too, so the speed-up is a same-drift ratio.
        fns = {
            "read1": on_threads(1, read_only),
            "q1": on_threads(1, lambda: quantize(x, scheme, **kw)),
            f"q{ncores}": on_threads(ncores, lambda: quantize(x, scheme, **kw)),
            "d1": on_threads(1, lambda: dequantize(q)),
            f"d{ncores}": on_threads(ncores, lambda: dequantize(q)),
            "dout1": on_threads(1, lambda: dequantize(q, out=buf)),
        }
        if q.scheme.tensor_scale:
            fns["qa1"] = on_threads(1, lambda: quantize(x, scheme, tensor_amax=float(q.amax), **kw))
        t = round_times(fns, args.repeat)
        for k, v in t.items():
            r[k] = gb / min(v)
        r["read1_rounds"] = [gb / v for v in t["read1"]]
        # Ratios: medians of per-round ratios (see round_ratio), not ratios of best times.
        for k in ("q1", "d1", "dout1", "qa1"):
            if k in t:
                r["ro_" + k] = round_ratio(t, "read1", k)
        r["up_q"] = round_ratio(t, "q1", f"q{ncores}")
        r["up_d"] = round_ratio(t, "d1", f"d{ncores}")
        set_num_threads(ncores)
        r["bits"] = q.bits_per_element
        rows.append(r)
        print(f"  {r['scheme']}: quantize {r['q1']:.2f} GB/s (1 thread, read-only {r['read1']:.2f})", file=sys.stderr)

    # The baselines are 10–60× slower than the kernels, so drift hardly moves their ratios; and they disturb
    # the read-only pass timed next to them (hundreds of MB of temporaries freed), so they are not normalised.
    np_q, ml_q, mx_q, np_d = (base[k][0] for k in ("numpy", "ml_dtypes", "mxfp8", "numpy_dequant"))
    lines = [
        "# Block-scaling benchmark",
        "",
        f"Generated by `make bench` (`studies/bench/scaling.py`) on {dt.date.today().isoformat()}: "
        f"{platform.machine()}, {os.cpu_count()} cores, numpy {np.__version__}, ml_dtypes {ml_dtypes.__version__}, "
        f"fpsim {fpsim.__version__}. Input {x.shape} float32 N(0,1) ({gb * 1e3:.0f} MB), {rounds_note(args.repeat)}; "
        "GB/s of float32 data (quantize: its input, and it includes the tensor-amax pass; dequantize: its float32 "
        "output).",
        "",
        "Each scheme's speeds are timed in the same rounds as a read-only pass `x.max()` (one thread), all of "
        "them taking turns (one thread and all cores alike). Speeds are the best round; the read-only and "
        "speed-up ratios are medians over the rounds of the ratio of the two timings within a round, taken "
        "seconds apart, so that drift lasting longer than a round cancels (the baseline ratios are plain same-run "
        f"ratios, see the note under the table): {drift_note([v for r in rows for v in r['read1_rounds']])}.",
        "",
        "Same-run baselines (each checked to give fpsim's bits before it is timed): NVFP4 fake-quant in plain NumPy "
        f"**{base['numpy'][0]:.3f} GB/s** (same bits: {base['numpy'][2]}); with ml_dtypes casts "
        f"**{base['ml_dtypes'][0]:.3f} GB/s** (same bits: {base['ml_dtypes'][2]}); MXFP8 with ml_dtypes casts "
        f"**{base['mxfp8'][0]:.3f} GB/s** (same bits: {base['mxfp8'][2]}); NVFP4 dequantize in plain NumPy "
        f"**{base['numpy_dequant'][0]:.3f} GB/s** (same bits: {base['numpy_dequant'][2]}); writing a fresh float32 "
        f"array (`np.empty_like(x).fill(1)`, the page faults every fresh output pays) **{write_bw:.2f} GB/s** "
        f"({write_bw / write_read:.0%} of read-only). A parallel read-only pass (Numba row max) runs "
        f"**{read_scale:.2f}×** as fast on {ncores} threads as on one: the memory system's own scaling, the "
        "ceiling for the speed-up of a memory-bound pass.",
        "",
        "| scheme | bits/elem | quantize 1 thr GB/s | ÷ read-only | ÷ plain NumPy | ÷ ml_dtypes-cast | "
        "quantize all GB/s | speed-up | amax given, 1 thr (÷ read-only) | dequantize 1 thr GB/s | ÷ read-only | "
        "÷ plain NumPy | dequantize all GB/s | speed-up | into a reused buffer, 1 thr (÷ read-only) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        ml_ref = mx_q if r["scheme"].startswith("mxfp8") else ml_q
        qall, dall = r[f"q{ncores}"], r[f"d{ncores}"]
        qa = f"{r['qa1']:.2f} ({r['ro_qa1']:.0%})" if "qa1" in r else "—"
        lines.append(
            f"| {r['scheme']} | {r['bits']:.3f} | {r['q1']:.2f} | {r['ro_q1']:.0%} | {r['q1'] / np_q:.0f}× | "
            f"{r['q1'] / ml_ref:.0f}× | {qall:.2f} | {r['up_q']:.2f}× | {qa} | {r['d1']:.2f} | {r['ro_d1']:.0%} | "
            f"{r['d1'] / np_d:.0f}× | {dall:.2f} | {r['up_d']:.2f}× | {r['dout1']:.2f} ({r['ro_dout1']:.0%}) |"
        )
    lines += ["", "The ml_dtypes-cast column compares NVFP4/MXFP4 rows with the NVFP4 ml_dtypes baseline and "
              "the MXFP8 row with the MXFP8 ml_dtypes baseline; \"÷ plain NumPy\" compares quantize with the "
              "plain-NumPy NVFP4 fake-quantizer and dequantize with the plain-NumPy NVFP4 dequantizer; these "
              "baselines are timed in rounds of their own and not normalised (they free hundreds of MB of "
              "temporaries, which slows the read-only pass timed after them). \"amax "
              "given\" passes `tensor_amax=` (delayed scaling, or an amax fused into the producer), so it skips the "
              "amax pass; \"reused buffer\" passes `out=` to `dequantize`, which saves the page faults of a fresh "
              "4-byte-per-element output (see the fresh-array baseline above)."]
    text = "\n".join(lines) + "\n"
    write_report(text, args.out)


if __name__ == "__main__":
    main()
