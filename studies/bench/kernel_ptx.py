"""Instructions per element of the training fast path's fused quantizer, compiled for sm_90 without a GPU.

The H200 profiles (``reports/profile_training.md``) put 8.10 ms (2026-12-02, tree 91b549a) and 6.63 ms (2026-12-04,
tree 25aa72d) of the every-block NVFP4 step in ``two_level_quant_kernel``, two to three times what its bytes take
at the GPU's bandwidth (2.7 ms): the copies are bound by instruction issue, so what a change does to them can be
counted on any machine.  This script records the launches of one ``nvfp4_paper`` Linear's forward and backward
(under Triton's interpreter, in a child process: the interpreter is chosen when Triton is imported), compiles each
distinct configuration of the kernel for sm_90 with the specialisation the training shapes get on the GPU
(16-divisible pointers and sizes; ``HW_CVT`` on, as ``fpsim.torch.runtime.hw_cvt`` is there) and counts the PTX
instructions of one thread.  PTX is not SASS and a count is not a time: the table ranks variants of one kernel;
the H200 run decides.

    python -m studies.bench.kernel_ptx --out reports/kernel_ptx.md
"""

from __future__ import annotations

import argparse
import collections
import datetime
import importlib
import inspect
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from studies.bench.common import write_report

KERNEL = "two_level_quant_kernel"
SHOWN = ("SR", "K", "FAKE", "OUT_BF16", "E2M1", "TILE", "FOS", "BB", "W")
_DIVISIBLE = ("R", "C", "NB", "NBLK", "n")  # sizes that are multiples of 16 at the training shapes


def _record(path: Path) -> None:
    """(Child, under the interpreter.) The launches of one nvfp4_paper Linear step, as JSON: kernel, argument
    types, constexpr values, launch options."""
    import torch

    import fpsim.torch as ft
    import fpsim.torch.launch as L
    from fpsim.torch import fastpath

    calls = []
    real = L.launch

    def record(fn, grid, args, kwargs):
        calls.append((fn, args, dict(kwargs)))
        fn[grid](*args, **kwargs)

    for mod in list(sys.modules.values()):
        if getattr(mod, "__name__", "").startswith("fpsim.torch") and getattr(mod, "launch", None) is real:
            mod.launch = record
    fastpath.IMPL = "triton"
    torch.manual_seed(0)
    lin = ft.Linear(256, 256, bias=False, recipe="nvfp4_paper", name="L", gemm="blas")
    x = torch.randn(64, 256, dtype=torch.bfloat16, requires_grad=True)
    lin(x).float().sum().backward()
    names = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.int16: "i16", torch.int32: "i32",
             torch.uint8: "u8", torch.int8: "i8", torch.int64: "i64", torch.float16: "fp16"}

    def ty(a):
        if isinstance(a, torch.Tensor):
            return "*" + names[a.dtype]
        if isinstance(a, bool):
            return "i1"
        if isinstance(a, int):
            return "i32" if -(1 << 31) <= a < (1 << 31) else "i64"
        return "fp32"

    out = []
    for fn, args, kw in calls:
        opts = {k: kw.pop(k) for k in ("num_warps", "num_stages") if k in kw}
        params = inspect.signature(fn.fn).parameters
        bound = inspect.signature(fn.fn).bind(*args, **kw)
        bound.apply_defaults()
        const = {n for n, p in params.items() if "constexpr" in str(p.annotation)}
        out.append({"module": fn.fn.__module__, "name": fn.fn.__name__, "opts": opts,
                    "args": {n: ["constexpr", v] if n in const else [ty(v), None]
                             for n, v in bound.arguments.items()}})
    path.write_text(json.dumps(out, default=str))


def count(launches: list[dict], kernel: str = KERNEL) -> list[dict]:
    """PTX instructions per thread of each distinct configuration of ``kernel`` among ``launches``."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    rows, seen = [], set()
    for r in launches:
        if r["name"] != kernel:
            continue
        key = json.dumps({n: v for n, v in r["args"].items() if v[0] == "constexpr"}, sort_keys=True)
        if key in seen:
            continue
        seen.add(key)
        fn = getattr(importlib.import_module(r["module"]), r["name"])
        sig, const, attrs = {}, {}, {}
        for n, (t, v) in r["args"].items():
            sig[n] = t
            i = (fn.arg_names.index(n),)
            if t == "constexpr":
                const[i] = True if n == "HW_CVT" else v
            elif t.startswith("*") or n in _DIVISIBLE:
                attrs[i] = [["tt.divisibility", 16]]
        opts = {**r["opts"], "enable_fp_fusion": True}  # Triton's default, and the GPU runs'
        k = triton.compile(ASTSource(fn, sig, const, attrs), target=GPUTarget("cuda", 90, 32), options=opts)
        ops = [ln.split()[0] for ln in (s.strip() for s in k.asm["ptx"].splitlines())
               if ln and ln[0].isalpha() and not ln.endswith(":")]
        cfg = {n: r["args"][n][1] for n in SHOWN if n in r["args"]}
        threads = 32 * int(r["opts"].get("num_warps", 4))
        per_thread = cfg["BB"] * cfg["W"] / threads if "BB" in cfg and "W" in cfg else None
        top = collections.Counter(o.split(".")[0] for o in ops).most_common(6)
        rows.append({**cfg, "warps": r["opts"].get("num_warps"), "instructions": len(ops),
                     "elements_per_thread": per_thread,
                     "per_element": len(ops) / per_thread if per_thread else None, "top": top})
    return rows


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None)
    ap.add_argument("--kernel", default=KERNEL)
    ap.add_argument("--record", default=None, help=argparse.SUPPRESS)  # the children's halves
    ap.add_argument("--count", nargs=2, default=None, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.record:
        _record(Path(a.record))
        return
    if a.count:
        Path(a.count[1]).write_text(json.dumps(count(json.loads(Path(a.count[0]).read_text()), a.kernel)))
        return
    # the interpreter is chosen when Triton is imported: record in a child with it, compile in one without it
    with tempfile.TemporaryDirectory() as tmp:
        rec, res = Path(tmp) / "launches.json", Path(tmp) / "rows.json"
        me = [sys.executable, "-m", "studies.bench.kernel_ptx", "--kernel", a.kernel]
        subprocess.run([*me, "--record", str(rec)], check=True, env={**os.environ, "TRITON_INTERPRET": "1"})
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        subprocess.run([*me, "--count", str(rec), str(res)], check=True, env=env)
        rows = json.loads(res.read_text())
    import triton

    lines = [f"# PTX instructions per element: `{a.kernel}` (sm_90)", "",
             f"{datetime.date.today().isoformat()}, Triton {triton.__version__}, `python -m studies.bench.kernel_ptx`: "
             "the configurations of one nvfp4_paper Linear's forward and backward, compiled for sm_90 without a GPU "
             "(16-divisible pointers and sizes, HW_CVT on). Instructions are one thread's PTX instructions "
             "(straight-line code); elements per thread = BB·W / (32·warps). A ranking of variants, not a time.", "",
             "| " + " | ".join(SHOWN)
             + " | warps | PTX instructions | elements / thread | per element | most frequent |",
             "|" + "---|" * (len(SHOWN) + 5)]
    for r in rows:
        per = f"{r['per_element']:.1f}" if r["per_element"] is not None else "— (no BB·W)"
        lines.append("| " + " | ".join(str(r.get(n, "—")) for n in SHOWN)
                     + f" | {r['warps']} | {r['instructions']} | {r['elements_per_thread']} | {per} | "
                     + ", ".join(f"{o} {c}" for o, c in r["top"]) + " |")
    if not rows:
        lines.append(f"\nNo launch of `{a.kernel}` in one nvfp4_paper Linear step.")
    write_report("\n".join(lines) + "\n", Path(a.out) if a.out else None)


if __name__ == "__main__":
    main()
