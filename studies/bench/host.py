"""Host time of the training layer's fast path per operand copy and per GEMM, without a GPU.

An eager training step under an emulated recipe is host-bound on the H200 (``reports/bench_training.md``): what
bounds it is the Python work of each copy (deriving its SR seed, looking its plan up, building the launch) and
the launches themselves.  This benchmark measures the first on any machine: the fast path runs on tiny CPU
tensors with every Triton launch replaced by a no-op, so what is timed is fpsim's host code plus torch's
allocations, not kernels.  The baseline, timed in the same process, is the host time of ``torch.nn.functional
.linear`` on the same tiny tensors (one torch operation: what a BF16 layer's host pays per GEMM).

    python -m studies.bench.host [--out reports/bench_host.md]

Numbers are medians of 7 rounds of 2,000 calls per row (the two layer rows: 7 rounds of 1,000 calls); ratios are
against the baseline of the same run.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import time
from pathlib import Path

os.environ.setdefault("TRITON_INTERPRET", "1")  # the kernels are never launched; their modules import without CUDA

import torch  # noqa: E402

from fpsim.recipe import get_recipe  # noqa: E402
from fpsim.torch import fastpath as fp  # noqa: E402
from fpsim.torch import nn as fnn  # noqa: E402
from fpsim.torch import quantize as _q  # noqa: E402
from fpsim.torch import rht as _r  # noqa: E402
from studies.bench.common import write_report  # noqa: E402

_LAUNCHERS = (_q, _r, fp)


ROUNDS, CALLS, LAYER_CALLS = 7, 2000, 1000


def _time(fn, n: int = CALLS, rounds: int = ROUNDS) -> tuple[float, int]:
    """(median over ``rounds`` rounds of the seconds per call in a round of ``n`` calls, ``n``)."""
    for _ in range(100):
        fn(0)
    out = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for i in range(n):
            fn(i)
        out.append((time.perf_counter() - t0) / n)
    return statistics.median(out), n


def measure(recipe: str = "nvfp4_paper") -> list[tuple[str, float, int]]:
    """(what, host seconds per call, calls per round) with the launches stubbed out; the first row is the
    baseline."""
    saved = [m.launch for m in _LAUNCHERS]
    impl = fp.IMPL
    for m in _LAUNCHERS:
        m.launch = lambda *a: None
    fp.IMPL = "triton"
    # the stubbed launches leave every copy's values unwritten: uninitialised memory can hold float32 subnormals,
    # which would make the tiny CPU GEMMs many times slower and charge that arithmetic to the host code
    ftz = torch.set_flush_denormal(True)
    try:
        torch.set_num_threads(1)
        rec = get_recipe(recipe)
        x = torch.randn(32, 64, dtype=torch.bfloat16)
        w = torch.randn(48, 64)
        dy = torch.randn(32, 48, dtype=torch.bfloat16)
        wb = w.bfloat16()
        rows = [("baseline: F.linear on the same tensors", *_time(lambda i: torch.nn.functional.linear(x, wb)))]
        copies = (("fprop_x", x, rec.fprop_x), ("fprop_w", w, rec.fprop_w), ("dgrad_dy", dy, rec.dgrad_dy),
                  ("wgrad_dy (RHT of dYᵀ)", dy.t(), rec.wgrad_dy), ("wgrad_x (RHT of Xᵀ)", x.t(), rec.wgrad_x))
        for role, t, pol in copies:
            name = role.split()[0]
            rows.append((f"copy {role}",
                         *_time(lambda i, t=t, pol=pol, name=name: fnn._fast_copy(t, pol, seed=1, layer="blocks.3.fc1",
                                                                                 step=i, role=name))))
        a, b = (c._replace(values=torch.ones_like(c.values)) for c in (  # defined values: see set_flush_denormal
            fnn._fast_copy(x, rec.fprop_x, seed=1, layer="l", step=0, role="fprop_x"),
            fnn._fast_copy(w, rec.fprop_w, seed=1, layer="l", step=0, role="fprop_w")))
        rows.append(("GEMM of two copies + alpha epilogue", *_time(lambda i: fp.mm(a, b, torch.bfloat16))))
        ref = torch.nn.Linear(64, 48, bias=False)
        lin = fnn.Linear(64, 48, bias=False, recipe=recipe, name="blocks.3.fc1", seed=1)
        xg = torch.randn(32, 64, requires_grad=True)
        g = torch.randn(32, 48)

        def layer_step(m):
            def run(i):
                m(xg).backward(g)
                if hasattr(m, "FPSIM_LAYER"):
                    m.step += 1  # a new step: new SR keys, as in training
            return run

        rows.append(("nn.Linear forward + backward (float32)", *_time(layer_step(ref), n=LAYER_CALLS)))
        rows.append(("fpsim.torch.Linear forward + backward (the copies, GEMMs and autograd)",
                     *_time(layer_step(lin), n=LAYER_CALLS)))
        return rows
    finally:
        for m, f in zip(_LAUNCHERS, saved):
            m.launch = f
        fp.IMPL = impl
        if ftz:
            torch.set_flush_denormal(False)


def timing_note(rows) -> str:
    """How the rows were timed, from the rows' own call counts: "median of 7 × 2,000 calls; …"."""
    counts = sorted({c for _, _, c in rows}, reverse=True)
    if len(counts) == 1:
        return f"median of {ROUNDS} × {counts[0]:,} calls"
    rest = "; ".join(f"{', '.join(n.split(' (')[0] for n, _, c in rows if c == k)}: {ROUNDS} × {k:,}"
                     for k in counts[1:])
    return f"median of {ROUNDS} rounds of {counts[0]:,} calls per row; {rest}"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None)
    ap.add_argument("--recipe", default="nvfp4_paper")
    a = ap.parse_args(argv)
    rows = measure(a.recipe)
    base = rows[0][1]
    lines = ["# Host time of the fast path (fpsim.torch, launches stubbed)", "",
             f"{datetime.date.today().isoformat()}, {platform.processor() or platform.machine()}, torch "
             f"{torch.__version__}, recipe {a.recipe}; `python -m studies.bench.host` ({timing_note(rows)}; "
             "tiny CPU tensors, every Triton launch a no-op: fpsim's host code and torch's allocations only).", "",
             "| what | host µs per call | × baseline |", "|---|---:|---:|"]
    lines += [f"| {n} | {t * 1e6:.1f} | {t / base:.2f} |" for n, t, _ in rows]
    write_report("\n".join(lines) + "\n", Path(a.out) if a.out else None)


if __name__ == "__main__":
    main()
