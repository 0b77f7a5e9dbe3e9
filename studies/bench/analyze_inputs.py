"""Benchmark of `fpsim analyze` on hostile and many-tensor inputs: wall time, peak RSS.

Each case writes its input to a temporary directory and runs ``python -m fpsim analyze`` on it as a
subprocess (``--formats nvfp4 --seeds 0 --format csv``, one worker); the peak RSS is the child's
``ru_maxrss`` (``os.wait4``), which counts every page the process ever had resident, mapped file
pages included.  The "before" column quotes the figures of the issue's red-team run (same machine
class), where they were reported.

    python -m studies.bench.analyze_inputs --out reports/bench_io.md [--scale 0.25]
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from fpsim.io import write_safetensors
from studies.bench.common import write_report

# A small launcher process starts the run and reports its ru_maxrss: Linux carries the high-water RSS of
# the process that forks (or vforks) across exec, so measured from this process (which held the inputs
# while writing them) every figure would include this process's own peak.
_LAUNCH = """import os, subprocess, sys, time
t = time.perf_counter()
p = subprocess.Popen(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
_, status, usage = os.wait4(p.pid, 0)
print(time.perf_counter() - t, usage.ru_maxrss * 1024, os.waitstatus_to_exitcode(status))
"""


def analyze(args: list[str]) -> tuple[float, int, int]:
    """(wall seconds, peak RSS bytes, exit code) of one ``fpsim analyze`` run."""
    cmd = [sys.executable, "-m", "fpsim", "analyze", *args, "--formats", "nvfp4", "--seeds", "0", "--format", "csv",
           "-q"]
    out = subprocess.run([sys.executable, "-S", "-c", _LAUNCH, *cmd], capture_output=True, text=True, check=True)
    wall, peak, rc = out.stdout.split()
    return float(wall), int(peak), int(rc)


def cases(d: Path, scale: float):
    """(name, what, input size in bytes, argv, figure before the fix) per case; inputs are written lazily."""
    gib = int(scale * (1 << 30))
    rows = max(256, gib // (4 * 16384))

    def bomb():
        p = d / "bomb.npz"
        z = np.zeros((rows * 4, 16384), np.float32)  # 4 × scale GiB of zeros: deflates ~1000:1
        z[::97, ::89] = 1.0
        np.savez_compressed(p, x=z)
        return p

    def dev_zero():
        p = d / "zero.npz"
        p.symlink_to("/dev/zero")
        return p

    def fifo():
        p = d / "pipe.safetensors"
        os.mkfifo(p)
        return p

    def big():
        p = d / "big.safetensors"
        x = np.random.default_rng(0).standard_t(3, (rows, 16384)).astype(np.float32)
        write_safetensors(p, {"layer.weight": x})
        return p

    def pt():
        import torch

        p = d / "model.pt"
        n = max(1, int(scale * 480e6) // (4 * 4096 * 4096))
        torch.save({f"layers.{i}.weight": torch.randn(4096, 4096) for i in range(max(n, 1))}, p)
        return p

    def many(kind, n=10_000):
        def make():
            t = {f"blocks.{i}.w": np.full((16, 64), 1 + i % 7, np.float32) for i in range(n)}
            p = d / f"many.{kind}"
            if kind == "npz":
                np.savez(p, **t)
            elif kind == "safetensors":
                write_safetensors(p, t)
            else:
                import torch

                torch.save({k: torch.from_numpy(v) for k, v in t.items()}, p)
            return p

        return make

    def meta():
        p = d / "meta.safetensors"
        t = {f"m.{i}.w": np.ones((4, 16), np.float32) for i in range(2000)}
        write_safetensors(p, t, {f"k{i}": "x" * 1000 for i in range(2000)})  # ≈ 2 MB of metadata
        return p

    return [
        (f"npz member inflating to {4 * gib / (1 << 30):g} GiB", bomb, [], "17 MB → 4 GB member: 8.8 GB RSS"),
        ("/dev/zero linked as .npz", dev_zero, [], "grew ~0.6 GB/s until killed"),
        ("FIFO named .safetensors", fifo, [], "hung forever"),
        (f"one {gib / (1 << 30):g} GiB tensor, last axis", big, [], "0.39 GB (1 GB tensor)"),
        (f"one {gib / (1 << 30):g} GiB tensor, --axis 0", big, ["--axis", "0"], "1.44 GB (1 GB tensor)"),
        (".pt of 4096×4096 float32 weights", pt, [], "1.64 GB (480 MB file)"),
        ("10,000 tensors, .npz", many("npz"), [], "O(N³): 400 members 197 s"),
        ("10,000 tensors, .safetensors", many("safetensors"), [], "header re-parsed per tensor"),
        ("10,000 tensors, .pt", many("pt"), [], "file loaded once per tensor"),
        ("2,000 tensors + 2 MB metadata, .safetensors", meta, [], "60 s"),
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale", type=float, default=0.25, help="GiB of the large single-tensor inputs")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    results = []
    seen: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        for name, make, extra, before in cases(d, args.scale):
            p = seen.get(make) or make()
            seen[make] = p
            size = p.stat().st_size if p.is_file() and not p.is_symlink() else 0
            wall, peak, rc = analyze([str(p), *extra])
            results.append((name, size, wall, peak, rc, before))
            print(f"{name}: {wall:.1f} s, peak RSS {peak / 1e9:.2f} GB, exit {rc}", file=sys.stderr)
    lines = [
        "# `fpsim analyze` on hostile and many-tensor inputs",
        "",
        f"Generated by `python -m studies.bench.analyze_inputs --scale {args.scale}` on {dt.date.today().isoformat()} "
        f"({os.cpu_count()} cores, shared). Each case is one `python -m fpsim analyze FILE --formats nvfp4 "
        "--seeds 0` subprocess; peak RSS is its `ru_maxrss` (resident pages at the peak, mapped file pages "
        "included; a bare `fpsim analyze` start-up — numpy, numba, pandas, click — is part of every figure).",
        "",
        "| input | file size (MB) | wall time (s) | peak RSS (GB) | exit | before (issue 17) |",
        "|---|---:|---:|---:|---:|---|",
    ]
    lines += [f"| {n} | {s / 1e6:.1f} | {w:.1f} | {pk / 1e9:.2f} | {rc} | {b} |" for n, s, w, pk, rc, b in results]
    lines += [
        "",
        "The `/dev/zero` and FIFO inputs are refused before they are opened (\"a character device / a FIFO, "
        "not a regular file\"): exit 3, as nothing else was given. The npz member is checked against its "
        "`.npy` header and deflate's 1032:1 limit, inflated once, streaming, into an unnamed temporary file "
        "and read from it in 64 MB row chunks; `--axis 0` reads the same chunks as strided runs, never the "
        "whole tensor or its transpose; the `.pt` is memory-mapped (`torch.load(mmap=True, "
        "weights_only=True)`), so its pages count as resident once touched. Tensors under 1 MiB run their "
        "kernels on one thread. The many-tensor rows include the start-up (under 1 s; importing torch adds a few "
        "seconds to the .pt rows).",
    ]
    write_report("\n".join(lines) + "\n", args.out)

if __name__ == "__main__":
    main()
