"""The scaled × scaled GEMMs of one training step, timed per tiling of the fused Triton GEMM.

For every GEMM shape of the ``studies.bench.training`` model (Fprop, Dgrad and Wgrad of the four block linears)
this times, on the same BF16 copies (exact e · s_b values with their tensor amax):

* ``cublas+epilogue``: ``torch.mm`` with FP32 output, then the alpha epilogue kernel (``fastpath.GEMM =
  "cublas"``; the default ``"cublaslt"`` is timed per step by ``studies.bench.training``);
* each candidate :class:`fpsim.torch.fastpath.MMTiles` of ``fastpath.scaled_mm`` (alpha on the accumulator
  tiles, the FP32 product never in memory);
* ``bf16 mm``: a plain BF16 ``torch.mm`` with BF16 output, what the BF16 model's layer costs (no alpha): the floor.

The table gives milliseconds per call and, per step, the sum over the model's GEMMs (each shape × the blocks).
The tiling is chosen here, offline, and then fixed in ``fastpath.MM_TILES``: the FP32 sums' order follows BK, so
a per-run timing-based choice would change the bits from run to run.

    python -m studies.bench.scaled_mm --out /tmp/gpu/bench_scaled_mm.md      (GPU)
"""

from __future__ import annotations

import argparse
import datetime
import time
from pathlib import Path

import torch

from fpsim.io import atomic_write
from fpsim.plan import lower
from fpsim.torch import fastpath as fp
from fpsim.torch.gemm import mm_f32

#: Candidate tilings (BM, BN, BK, GROUP_M, warps, stages): the current default first, then the shapes Triton's
#: Hopper matmul examples use; 128 × 256 × 64 at 3–4 stages fits the H200's 228 KB of shared memory.
CANDIDATES = [
    fp.MMTiles(128, 128, 64, 8, 8, 3), fp.MMTiles(128, 256, 64, 8, 8, 3), fp.MMTiles(256, 128, 64, 8, 8, 3),
    fp.MMTiles(128, 256, 64, 8, 8, 4), fp.MMTiles(128, 128, 64, 8, 4, 4), fp.MMTiles(128, 128, 32, 8, 4, 4),
    fp.MMTiles(64, 256, 32, 8, 4, 4), fp.MMTiles(128, 64, 64, 8, 4, 4),
]


def step_shapes(d: int = 1024, ffn: int = 4096, tokens: int = 8192) -> list[tuple[str, int, int, int, str]]:
    """(label, M, N, K, output dtype) of each GEMM of one block: Y = X·Wᵀ (BF16 out under autocast),
    dX = dY·W (BF16), dW = dYᵀ·X (FP32, the master weights' dtype), for qkv, proj, fc1 and fc2."""
    linears = {"qkv": (d, 3 * d), "proj": (d, d), "fc1": (d, ffn), "fc2": (ffn, d)}
    out = []
    for name, (din, dout) in linears.items():
        out += [(f"{name} fprop", tokens, dout, din, "bf16"), (f"{name} dgrad", tokens, din, dout, "bf16"),
                (f"{name} wgrad", dout, din, tokens, "fp32")]
    return out


def _copy(rows: int, k: int, device: str, seed: int) -> fp.Copy:
    g = torch.Generator(device="cpu").manual_seed(seed)
    x = torch.randn(rows, k, generator=g).to(device)
    return fp.make_copy(x, lower("nvfp4"))


def _timer(device: str):
    """Mean seconds per call after one warm-up: CUDA events on the GPU, the host clock otherwise."""
    if device == "cuda":
        from studies.bench.gpu import cuda_time

        return cuda_time

    def run(fn, reps):
        fn()
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        return (time.perf_counter() - t0) / reps

    return run


def sweep(shapes, candidates, device: str, reps: int = 20) -> list[dict]:
    """One row per shape: seconds per call of the cuBLAS path, of each candidate, and of a plain BF16 mm; a
    candidate that fails to compile or launch is None with its error kept."""
    timed = _timer(device)
    rows = []
    for i, (label, m, n, k, odt) in enumerate(shapes):
        a, b = _copy(m, k, device, 2 * i), _copy(n, k, device, 2 * i + 1)
        dt = torch.bfloat16 if odt == "bf16" else torch.float32
        row = {"shape": label, "M": m, "N": n, "K": k, "out": odt,
               "cublas+epilogue": timed(lambda: fp.alpha_epilogue(mm_f32(a.values, b.values), a, b, dt), reps),
               "bf16 mm": timed(lambda: torch.mm(a.values, b.values.t()), reps), "tiles": {}, "errors": {}}
        for t in candidates:
            try:
                row["tiles"][t] = timed(lambda: fp.scaled_mm(a, b, dt, t), reps)
            except Exception as e:  # a tiling this GPU or Triton cannot run (shared memory, registers)
                row["tiles"][t] = None
                row["errors"][t] = f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"
        rows.append(row)
    return rows


def fastest(rows, candidates) -> fp.MMTiles:
    """The candidate with the least time summed over the rows (one of each shape) that ran every shape; the
    first candidate when none did."""
    ok = [t for t in candidates if all(r["tiles"][t] is not None for r in rows)]
    return min(ok, key=lambda t: sum(r["tiles"][t] for r in rows)) if ok else candidates[0]


def report(rows, candidates, blocks: int, device: str) -> str:
    def ms(v):
        return "—" if v is None else f"{v * 1e3:.3f}"

    names = [f"{t.BM}×{t.BN}×{t.BK} w{t.num_warps} s{t.num_stages}" for t in candidates]
    head = ["GEMM", "M × N × K", "out", "bf16 mm (floor)", "cuBLAS + epilogue", *names]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * 3 + "---:|" * (len(head) - 3)]
    tot = {"bf16 mm": 0.0, "cublas+epilogue": 0.0, **{t: 0.0 for t in candidates}}
    for r in rows:
        cells = [r["shape"], f"{r['M']} × {r['N']} × {r['K']}", r["out"], ms(r["bf16 mm"]), ms(r["cublas+epilogue"])]
        cells += [ms(r["tiles"][t]) for t in candidates]
        lines.append("| " + " | ".join(cells) + " |")
        tot["bf16 mm"] += r["bf16 mm"] * blocks
        tot["cublas+epilogue"] += r["cublas+epilogue"] * blocks
        for t in candidates:
            tot[t] = None if tot[t] is None or r["tiles"][t] is None else tot[t] + r["tiles"][t] * blocks
    lines.append("| " + " | ".join([f"**per step ({blocks} blocks)**", "", "", ms(tot["bf16 mm"]),
                                    ms(tot["cublas+epilogue"]), *(ms(tot[t]) for t in candidates)]) + " |")
    notes = []
    if any(tot[t] is not None for t in candidates):
        best = fastest(rows, candidates)
        notes.append(f"Fastest tiling over the step: {tuple(best)} (BM, BN, BK, GROUP_M, warps, stages), "
                     f"{tot[best] * 1e3:.2f} ms per step against {tot['cublas+epilogue'] * 1e3:.2f} ms for cuBLAS + "
                     f"the epilogue ({tot[best] / tot['cublas+epilogue']:.2f}×) and {tot['bf16 mm'] * 1e3:.2f} ms "
                     f"for the plain BF16 GEMMs.")
    for r in rows:
        for t, e in r["errors"].items():
            notes.append(f"{r['shape']}, tiling {tuple(t)}: {e}")
    return "\n".join(lines) + "\n\n" + "\n".join(f"- {n}" for n in notes) + "\n"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--tiny", action="store_true",
                    help="smoke test: small shapes (without a GPU under Triton's interpreter: not a timing)")
    ap.add_argument("--best", type=Path, default=None,
                    help="also write the fastest tiling as BM,BN,BK,GROUP_M,WARPS,STAGES (bench_training --mm-tiles)")
    a = ap.parse_args(argv)
    if a.tiny:  # on the GPU where there is one (compiled kernels), else under the interpreter
        device = "cuda" if torch.cuda.is_available() else "cpu"
        shapes, cands, blocks = step_shapes(16, 32, 32), [fp.MMTiles(16, 16, 16, 1, 1, 1)], 1
        fp.IMPL = "triton"
    else:
        if not torch.cuda.is_available():
            raise SystemExit("bench_scaled_mm: needs a CUDA GPU (use --tiny for the CPU smoke test)")
        device, shapes, cands, blocks = "cuda", step_shapes(), CANDIDATES, 12
    rows = sweep(shapes, cands, device, 2 if a.tiny else a.reps)
    gpu = torch.cuda.get_device_name(0) if device == "cuda" else "CPU (Triton interpreter: not a timing)"
    if a.tiny:
        gpu += ", smoke-test sizes"
    text = (f"# Scaled GEMMs of one training step, per tiling ({datetime.date.today()}, {gpu}, torch "
            f"{torch.__version__})\n\nmean ms per call over {a.reps if not a.tiny else 2} calls after one warm-up; "
            f"NVFP4 copies (exact e · s_b in BF16) of N(0, 1) data.\n\n" + report(rows, cands, blocks, device))
    atomic_write(a.out, text)
    if a.best is not None:
        atomic_write(a.best, ",".join(map(str, fastest(rows, cands))) + "\n")
    print(text)


if __name__ == "__main__":
    main()
