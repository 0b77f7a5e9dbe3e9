"""Benchmark of `fpsim analyze`: throughput against a NumPy pass over the same file, start-up, and --workers.

Writes a float32 safetensors file of ``--mb`` MB (tensors of 2048 × 8192, Student-t ν=3), a tiny .npz (64 × 64)
and a file of 28 tensors (256 × 2048 each), then, ``--reps`` times, interleaved so that a busy machine slows
every variant alike:

* the NumPy pass: read each tensor of the big file and take max|x| (in this process: no start-up);
* ``python -m fpsim analyze`` (the default five schemes, ``--seeds 0``) on the big and the tiny file, for this tree
  and, with ``--before DIR``, for another checkout of fpsim (its ``fpsim/`` and ``cli/``);
* ``--workers 1`` and ``--workers`` = all cores on the 28-tensor file (this tree).

Each tree runs with its own Numba cache directory, warmed by one untimed run of each command first (the figures
are of a warm cache).  Throughput "start-up excluded" is size / (wall of the big file − wall of the tiny file).
Medians and the spread (min–max) of the repetitions are reported.

    python -m studies.bench.analyze --before /tmp/before --out reports/bench_analyze.md
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from fpsim.io import write_safetensors
from studies.bench.common import write_report

ROOT = Path(__file__).resolve().parents[2]  # the repository: fpsim/ and cli/


def tree_rss(pid: int) -> int:
    """Resident bytes of a process and all its descendants (Linux /proc)."""
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        try:
            with open(f"/proc/{p}/statm") as f:
                total += int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
            for t in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{t}/children") as f:
                    todo += [int(c) for c in f.read().split()]
        except (FileNotFoundError, ProcessLookupError, ValueError):
            continue
    return total


def run(cmd: list[str], env: dict) -> tuple[float, int]:
    """Wall seconds and peak RSS of the process tree (sampled every 20 ms); raises if the command fails.  Run in
    the file's directory, not here: ``python -m`` puts the working directory first on the path, ahead of
    PYTHONPATH, so from the repository every tree would run the repository's fpsim."""
    t = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env,
                            cwd=Path(cmd[4]).parent)
    peak = 0
    while proc.poll() is None:
        peak = max(peak, tree_rss(proc.pid))
        time.sleep(0.02)
    wall = time.perf_counter() - t
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd)}: exit {proc.returncode}: {proc.stderr.read().decode()[-500:]}")
    return wall, peak


def numpy_pass(path: Path) -> float:
    """Seconds to read every tensor of a float32 safetensors file and take its max|x|."""
    t = time.perf_counter()
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
        for name, e in header.items():
            if name == "__metadata__":
                continue
            b, end = e["data_offsets"]
            f.seek(8 + n + b)
            float(np.abs(np.frombuffer(f.read(end - b), np.float32)).max())
    return time.perf_counter() - t


def tree_env(src: Path | None, tmp: Path, name: str) -> dict:
    """The environment that runs ``python -m fpsim`` from ``src`` (None: this tree), with its own Numba cache: its
    fpsim/ first on the path and its cli/ as fpsim_cli (whatever is installed, or on a machine where nothing is)."""
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp / f"numba-{name}"))
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # Python's default, as on a user's machine: modules' bytecode cached
    src = ROOT if src is None else src
    pkgs = tmp / f"pkgs-{name}"
    pkgs.mkdir()
    (pkgs / "fpsim_cli").symlink_to(src / "cli")
    env["PYTHONPATH"] = f"{src}{os.pathsep}{pkgs}"
    return env


def stat(v: list[float]) -> str:
    return f"{statistics.median(v):.2f} ({min(v):.2f}–{max(v):.2f})"


def commit_of(src: Path) -> str:
    """The checkout's commit: git's, or a ``.commit`` file beside an exported tree, else "?"."""
    r = subprocess.run(["git", "-C", str(src), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    if r.returncode == 0 and r.stdout.strip():
        return r.stdout.strip() + (" + working tree" if src == ROOT and _dirty() else "")
    return (src / ".commit").read_text().strip() if (src / ".commit").exists() else "?"


def _dirty() -> bool:
    """Whether this checkout's fpsim/ or cli/ differ from its commit."""
    r = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "fpsim", "cli"], capture_output=True,
                       text=True)
    return bool(r.stdout.strip())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=float, default=256.0, help="size of the big file, MB")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--before", type=Path, default=None, help="another fpsim checkout to compare (fpsim/, cli/)")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    ncores = os.cpu_count() or 1
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        big, tiny, many = tmp / "big.safetensors", tmp / "tiny.npz", tmp / "many.safetensors"
        n = max(1, round(args.mb * 1e6 / (2048 * 8192 * 4)))
        write_safetensors(big, {f"layers.{i}.mlp.fc.{'weight' if i % 2 == 0 else 'input'}":
                                rng.standard_t(3, (2048, 8192)).astype(np.float32) for i in range(n)})
        np.savez(tiny, w=rng.standard_normal((64, 64)).astype(np.float32))
        write_safetensors(many, {f"layers.{i}.fc.weight": rng.standard_t(3, (256, 2048)).astype(np.float32)
                                 for i in range(28)})
        size = big.stat().st_size
        trees = {"after": tree_env(None, tmp, "after")}
        if args.before is not None:
            trees = {"before": tree_env(args.before.resolve(), tmp, "before"), **trees}
        cmd = [sys.executable, "-m", "fpsim", "analyze", "--seeds", "0", "--format", "json", "-o", str(tmp / "o.json")]
        jobs = {f"{t} {what}": (env, cmd[:4] + [str(path)] + cmd[4:] + extra)
                for t, env in trees.items()
                for what, path, extra in (("big", big, []), ("tiny", tiny, []))}
        for w in sorted({1, ncores} | {2 ** i for i in range(1, ncores.bit_length()) if 2 ** i < ncores}):
            jobs[f"after workers {w}"] = (trees["after"], cmd[:4] + [str(many)] + cmd[4:] + ["--workers", str(w)])
        for t, env in trees.items():  # each tree must run its own fpsim (a check the first version lacked)
            src = (args.before.resolve() if t == "before" else ROOT) / "fpsim"
            got = subprocess.run([sys.executable, "-c", "import fpsim; print(fpsim.__file__)"], env=env, cwd=tmp,
                                 capture_output=True, text=True, check=True).stdout.strip()
            if Path(got).resolve().parent != src.resolve():
                raise SystemExit(f"tree {t!r} imports {got}, not {src}")
        for env, c in jobs.values():  # warm each tree's Numba cache (and the page cache)
            run(c, env)
        load0 = os.getloadavg()[0]
        wall: dict[str, list[float]] = {k: [] for k in ["numpy", *jobs]}
        peak: dict[str, int] = dict.fromkeys(jobs, 0)
        for rep in range(args.reps):
            wall["numpy"].append(numpy_pass(big))
            for k, (env, c) in jobs.items():
                w, p = run(c, env)
                wall[k].append(w)
                peak[k] = max(peak[k], p)
            print(f"rep {rep + 1}: " + ", ".join(f"{k} {v[-1]:.2f} s" for k, v in wall.items()), file=sys.stderr)
    load1 = os.getloadavg()[0]
    npx = statistics.median(wall["numpy"])
    lines = [
        "# `fpsim analyze`: throughput, start-up and --workers",
        "",
        f"Generated by `studies/bench/analyze.py` on {dt.datetime.now().strftime('%Y-%m-%d %H:%M')}, "
        f"{platform.machine()} with {ncores} cores (load average {load0:.1f} before the timed runs and {load1:.1f} "
        f"after; figures are medians of {args.reps} interleaved repetitions, min–max in brackets). Warm Numba caches "
        "(one untimed run of each command first, a cache directory per tree), Python's bytecode cache on. Input: one "
        "float32 safetensors file of "
        f"{size / 1e6:.0f} MB ({n} tensors 2048×8192, Student-t ν=3); the default five schemes, `--seeds 0`, JSON "
        "output. The NumPy pass reads each tensor and takes max|x| in the benchmark's own process. "
        "Start-up excluded = size / (wall of the big file − wall of the tiny 64×64 .npz).",
        "",
        "| run | commit | big file wall (s) | MB/s | MB/s start-up excluded | × NumPy pass (start-up excluded) "
        "| tiny file wall (s) | peak RSS big (GB) |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
        f"| NumPy read + max\\|x\\| | – | {stat(wall['numpy'])} | {size / npx / 1e6:.0f} | – | 1 | – | – |",
    ]
    for t in trees:
        b, s = wall[f"{t} big"], wall[f"{t} tiny"]
        net = statistics.median(b) - statistics.median(s)
        src = ROOT if t == "after" else args.before
        lines.append(f"| fpsim analyze ({t}) | {commit_of(src)} | {stat(b)} | {size / statistics.median(b) / 1e6:.0f} "
                     f"| {size / net / 1e6:.0f} | {net / npx:.1f} | {stat(s)} | {peak[f'{t} big'] / 1e9:.2f} |")
    lines += ["", "`--workers` on a file of 28 float32 tensors of 256×2048 (58.7 MB), this tree:", "",
              "| workers | wall (s) | speed-up over 1 worker (medians) | peak RSS (GB) |", "|---:|---:|---:|---:|"]
    one = statistics.median(wall["after workers 1"])
    lines += [f"| {k.split()[-1]} | {stat(v)} | {one / statistics.median(v):.2f}× | {peak[k] / 1e9:.2f} |"
              for k, v in wall.items() if "workers" in k]
    lines += goals(size, npx, wall)
    write_report("\n".join(lines) + "\n", args.out)


def goals(size: int, npx: float, wall: dict) -> list[str]:
    """The goals of issue 48 item 5 against this tree's medians: throughput start-up excluded, the ratio to the
    NumPy pass, the tiny file's wall time."""
    big, tiny = statistics.median(wall["after big"]), statistics.median(wall["after tiny"])
    mbs, ratio = size / (big - tiny) / 1e6, (big - tiny) / npx
    rows = [("≥ 400 MB/s of input, default schemes, start-up excluded", f"{mbs:.0f} MB/s", mbs >= 400),
            ("within 3× of the NumPy pass, start-up excluded", f"{ratio:.1f}×", ratio <= 3),
            ("start-up < 0.5 s for a tiny file (warm Numba cache)", f"{tiny:.2f} s", tiny < 0.5)]
    return ["", "Goals (issue 48 item 5), this tree's medians:", "", "| goal | measured | met |", "|---|---|---|",
            *[f"| {g} | {m} | {'yes' if ok else 'no'} |" for g, m, ok in rows]]


if __name__ == "__main__":
    main()
