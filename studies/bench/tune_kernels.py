"""Launch shapes of the training step's two busiest fpsim kernels, timed on the GPU and checked bit for bit.

The H200 profile of the every-block NVFP4 step (``reports/profile_training.md``) puts 8.0 ms in
``two_level_quant_kernel`` (the 1 × 16 copies of X, dY and Wgrad's RHT'd transposes) and 6.2 ms in ``rht_t_kernel``
(the RHT'd transposes with both amax values), both far from copy bandwidth.  Their launch shapes
(:data:`fpsim.torch.quantize.TWO_LEVEL_TILES`, :data:`fpsim.torch.rht.RHT_T_TILES`) do not change any bit (each
block, and each group of RHT tokens, is computed alone; a maximum does not depend on its order), so they can be
chosen by time.  This script times each candidate on the calls one block of ``studies.bench.training``'s GPT makes
(8192 tokens; features 1024, 3072, 4096; BF16 in and out), checks every candidate's output against the current
shape's bit for bit (a candidate that differs is reported and never chosen), and weights each call by how often a
step makes it (12 blocks), so the table's "ms / step" is comparable with the profile's.

    python -m studies.bench.tune_kernels --out reports/tune_kernels.md          (GPU)
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import time
from pathlib import Path

import torch

from fpsim.plan import lower
from fpsim.torch import quantize as tq
from fpsim.torch import rht as trht
from fpsim.torch.fastpath import Copy, make_copy
from studies.bench.common import write_report

TOKENS = 8192
BLOCKS = 12
#: How often one block of the benchmark's GPT (qkv 1024→3072, proj 1024→1024, fc1 1024→4096, fc2 4096→1024)
#: calls each kernel on 8192 × features BF16 tensors, by features: the transposed RHT once per X and per dY; the
#: RTN copies of X and of RHT(Xᵀ); the SR copies of dY and of RHT(dYᵀ) (a transposed copy has the same blocks).
RHT_T_CALLS = {1024: 5, 3072: 1, 4096: 2}
RTN_CALLS = {1024: 6, 4096: 2}
SR_CALLS = {1024: 4, 3072: 2, 4096: 2}

RHT_T_CANDIDATES = [trht.RhtTTiles(bf, tiles, w) for bf, tiles, w in itertools.product((32, 64, 128), (4, 8, 16),
                                                                                         (4, 8))]
TWO_LEVEL_CANDIDATES = [tq.TwoLevelTiles(e, w) for e, w in itertools.product((1024, 2048, 4096, 8192), (2, 4, 8))]


def mean_ms(fn, reps: int) -> float:
    """Mean milliseconds per call over ``reps`` calls after one warm-up call (CUDA events; wall time off CUDA,
    where only the bit checks mean anything)."""
    fn()
    if not torch.cuda.is_available():
        t = time.perf_counter()
        for _ in range(reps):
            fn()
        return (time.perf_counter() - t) * 1e3 / reps
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(reps):
        fn()
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b) / reps


def _bits(out) -> list[torch.Tensor]:
    """A call's outputs as integer tensors (a NaN's payload is compared as stored)."""
    flat = []
    if isinstance(out, Copy):
        out = (out.values, out.amax)
    for v in out if isinstance(out, (tuple, list)) else (out,):
        if v is None:
            continue
        flat.append(v.view(torch.int16) if v.dtype == torch.bfloat16 else v.view(torch.int32))
    return flat


def _sweep(candidates, set_shape, calls: dict[int, int], make_call, inputs, reps: int) -> list[dict]:
    """Each candidate's ms per step (Σ calls × mean call time × blocks) and whether all its outputs equal the
    first candidate's (the current shape) bit for bit."""
    rows, ref = [], {}
    for cand in candidates:
        set_shape(cand)
        row = {"shape": cand, "ms": 0.0, "same": True, "error": None}
        try:
            for c, n in calls.items():
                fn = make_call(inputs[c])
                got = _bits(fn())
                if c not in ref:
                    ref[c] = got
                row["same"] &= len(got) == len(ref[c]) and all(torch.equal(g, r) for g, r in zip(got, ref[c]))
                row["ms"] += n * BLOCKS * mean_ms(fn, reps)
        except Exception as e:  # a shape Triton cannot compile here (registers, shared memory): reported, not chosen
            row.update(ms=None, same=False, error=f"{type(e).__name__}: {str(e).splitlines()[0][:120]}")
        rows.append(row)
    return rows


def tune(reps: int = 20, seed: int = 0, *, device: str = "cuda", tokens: int = TOKENS, features: dict | None = None,
         rht_candidates=None, two_level_candidates=None) -> dict:
    """Sweep both kernels' candidates (the current shapes first); the tables and the fastest bit-identical shape of
    each.  Leaves the module constants as they were.  ``features`` (old → new) shrinks the calls' feature sizes
    (the CPU test under Triton's interpreter)."""
    fmap = features or {}
    rht_calls, rtn_calls, sr_calls = ({fmap.get(c, c): n for c, n in d.items()}
                                      for d in (RHT_T_CALLS, RTN_CALLS, SR_CALLS))
    g = torch.Generator(device=device).manual_seed(seed)
    inputs = {c: (torch.randn(tokens, c, device=device, generator=g)
                  * torch.exp2(torch.randint(-6, 6, (1, c), device=device, generator=g))).bfloat16()
              for c in sorted({*rht_calls, *rtn_calls, *sr_calls})}
    inputs[min(inputs)][3, 5] = 3.0e4  # an outlier: its blocks and tiles differ from their neighbours
    rtn, sr = lower("nvfp4"), lower("nvfp4", rounding="sr")
    amax = {c: x.float().abs().amax() for c, x in inputs.items()}
    old = trht.RHT_T_TILES, tq.TWO_LEVEL_TILES
    try:
        def set_rht(t):
            trht.RHT_T_TILES = t

        def set_tl(t):
            tq.TWO_LEVEL_TILES = t

        rht_rows = _sweep([old[0], *[c for c in rht_candidates or RHT_T_CANDIDATES if c != old[0]]], set_rht,
                          rht_calls,
                          lambda x: lambda: trht.rht_transposed_amaxes(x, 16, out_dtype=torch.bfloat16, impl="triton"),
                          inputs, reps)
        tl_rows = _sweep([old[1], *[c for c in two_level_candidates or TWO_LEVEL_CANDIDATES if c != old[1]]], set_tl,
                         {("rtn", c): n for c, n in rtn_calls.items()} | {("sr", c): n for c, n in sr_calls.items()},
                         lambda k: (lambda: make_copy(k[1], rtn, amax=k[2])) if k[0] == "rtn"
                         else (lambda: make_copy(k[1], sr, 7, amax=k[2])),
                         {(k, c): (k, inputs[c], amax[c]) for k in ("rtn", "sr") for c in inputs}, reps)
    finally:
        trht.RHT_T_TILES, tq.TWO_LEVEL_TILES = old

    def best(rows):
        ok = [r for r in rows if r["same"] and r["ms"] is not None]
        return min(ok, key=lambda r: r["ms"]) if ok else rows[0]

    return {"rht_t": rht_rows, "two_level": tl_rows, "best_rht_t": best(rht_rows)["shape"],
            "best_two_level": best(tl_rows)["shape"]}


def apply(result: dict) -> None:
    """Make the tuned shapes the ones every call uses (in this process)."""
    trht.RHT_T_TILES = result["best_rht_t"]
    tq.TWO_LEVEL_TILES = result["best_two_level"]


def report(result: dict) -> list[str]:
    """Markdown tables of one sweep (ms per step of the benchmark's 12 blocks; the current shape is the first row)."""
    lines = []
    for key, title, fields in (("rht_t", "`rht_t_kernel` (`fpsim.torch.rht.RHT_T_TILES`: BF, TILES, warps)",
                                ("BF", "TILES", "num_warps")),
                               ("two_level", "`two_level_quant_kernel` (`fpsim.torch.quantize.TWO_LEVEL_TILES`: "
                                             "elements per program, warps)", ("elems", "num_warps"))):
        rows = result[key]
        base = rows[0]["ms"]
        lines += ["", f"{title}, first row the current shape:", "",
                  "| shape | ms / step | × current | bits equal to the current shape's |", "|---|---:|---:|---|"]
        for r in rows:
            shape = ", ".join(str(getattr(r["shape"], f)) for f in fields)
            if r["ms"] is None:
                lines.append(f"| {shape} | — | — | not run: {r['error']} |")
            else:
                lines.append(f"| {shape} | {r['ms']:.2f} | {r['ms'] / base:.2f} | {'yes' if r['same'] else '**NO**'} |")
    lines += ["", f"Fastest bit-identical shapes: `RHT_T_TILES = {result['best_rht_t']!r}`, "
                  f"`TWO_LEVEL_TILES = {result['best_two_level']!r}`."]
    return lines


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=None, help="markdown report (default: print)")
    ap.add_argument("--reps", type=int, default=20)
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("tune_kernels times CUDA kernels: run it on the GPU machine")
    res = tune(a.reps)
    head = [f"# Kernel launch shapes ({torch.cuda.get_device_name(0)}, {datetime.date.today().isoformat()}, "
            f"torch {torch.__version__})", "", __doc__.split("\n\n")[1].replace("\n", " ")]
    write_report("\n".join(head + report(res)) + "\n", Path(a.out) if a.out else None)


if __name__ == "__main__":
    main()
