"""Bit-reproducibility of campaign runs across processes: the same short run, trained in separate fresh
Python processes, must write byte-identical curves (CSV) and final weights.

    python -m studies.campaign.repro --arm nvfp4 --size tiny --steps 8 --device cpu [--cuda-graph] [--out DIR]

Each process (this module with ``--child``) trains one run with :class:`studies.campaign.run.Run` on
:func:`synthetic_corpus`, logging every step, and writes the run's ``<run>.csv`` and ``<run>.json`` and
``weights.safetensors`` (the model's state dict when the run ends) into its own folder.  :func:`compare` reads the
folders back: the CSVs byte for byte (and the first row where they part), the weights tensor by tensor (and the
names of those that differ), the records' ``weights_sha256``.  The command prints that comparison as JSON and exits
with status 1 when the processes disagree.  Nothing here is timed, so nothing here may differ.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from studies.campaign.data import Corpus

__all__ = ["synthetic_corpus", "train_short", "in_processes", "compare", "main"]

ROOT = Path(__file__).resolve().parents[2]


def synthetic_corpus(n_train: int = 40_000, n_val: int = 9_000) -> Corpus:
    """A small code-like byte stream with 500 seeded substitutions (the same bytes in every process)."""
    rng = np.random.default_rng(0)
    text = np.frombuffer(b"def f(x):\n    return x * 2 + 1\n" * 2000, np.uint8)
    train = text[:n_train].copy()
    train[rng.integers(0, train.size, 500)] = rng.integers(32, 127, 500)
    return Corpus(train, text[:n_val].copy(), 1, 1, ("held",), ("synthetic",))


def train_short(out: Path, arm: str, *, seed: int = 1, size: str = "tiny", steps: int = 8, batch: int = 4,
                device: str = "cpu", cuda_graph: bool = False, stop_at: int | None = None) -> dict:
    """Train (or resume) ``steps`` steps of ``arm`` on :func:`synthetic_corpus` into ``out``, logging every step
    and validating 8 windows of ``ctx + 1`` bytes at the run's 20 evaluation points (every step of a run of 20 steps
    or fewer), and write the model's weights when it stops to ``out/weights.safetensors``; ``stop_at``: stop (and
    checkpoint) there, as :class:`studies.campaign.run.Run` does.  Returns the run's record."""
    from safetensors.torch import save_file

    from studies.campaign.model import SIZES
    from studies.campaign.run import Run

    ctx = SIZES[size].ctx
    out = Path(out)
    r = Run(arm, seed, size, batch * ctx * steps, 3e-3, out, batch=batch, val_tokens=8 * ctx,
            corpus=synthetic_corpus(), device=device, log_every=1, cuda_graph=cuda_graph, stop_at=stop_at)
    while r.advance():
        pass
    rec = r.finish()
    save_file({k: v.detach().cpu().contiguous() for k, v in r.model.state_dict().items()},
              str(out / "weights.safetensors"))
    return rec


def in_processes(out: Path, n: int = 2, **kw) -> list[Path]:
    """Run :func:`train_short` (keywords ``kw``: ``arm`` and the others) in ``n`` fresh Python processes at once,
    each into ``out/p<i>``; returns the folders.  A process that fails is a RuntimeError with its stderr."""
    dirs = [Path(out) / f"p{i}" for i in range(n)]
    args = [f"--{k.replace('_', '-')}={v}" for k, v in kw.items() if k != "cuda_graph"]
    args += ["--cuda-graph"] if kw.get("cuda_graph") else []
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    procs = [subprocess.Popen([sys.executable, "-m", "studies.campaign.repro", "--child", f"--out={d}", *args],
                              cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for d in dirs]
    for p in procs:
        _, err = p.communicate()
        if p.returncode:
            raise RuntimeError(f"a training process failed (status {p.returncode}):\n{err[-4000:]}")
    return dirs


def compare(dirs: list[Path]) -> dict:
    """Whether the runs in ``dirs`` (one run each, as :func:`train_short` writes them) are the same bits: CSV
    bytes, every weight tensor's bytes and the records' ``weights_sha256``; with the first CSV row that differs
    from the first folder's and the weight tensors that do."""
    from safetensors.numpy import load_file

    def run_files(d):
        (csv,) = Path(d).glob("*.csv")
        return csv.read_text(), load_file(str(Path(d) / "weights.safetensors")), json.loads(
            csv.with_suffix(".json").read_text())

    (c0, w0, r0), rest = run_files(dirs[0]), [run_files(d) for d in dirs[1:]]
    first_row, tensors = None, set()
    for c, w, _ in rest:
        rows0, rows = c0.splitlines(), c.splitlines()
        for i, (a, b) in enumerate(zip(rows0, rows)):
            if a != b:
                first_row = i if first_row is None else min(first_row, i)
                break
        if first_row is None and len(rows0) != len(rows):
            first_row = min(len(rows0), len(rows))
        tensors |= {k for k in w0.keys() | w.keys()
                    if k not in w0 or k not in w or w0[k].dtype != w[k].dtype or w0[k].shape != w[k].shape
                    or w0[k].tobytes() != w[k].tobytes()}
    csv_same = all(c == c0 for c, _, _ in rest)
    hashes = {r["weights_sha256"] for _, _, r in [(c0, w0, r0), *rest]}
    return {"processes": len(dirs), "csv_identical": csv_same, "weights_identical": not tensors,
            "weights_sha256_identical": len(hashes) == 1, "first_differing_csv_row": first_row,
            "differing_tensors": sorted(tensors), "identical": csv_same and not tensors and len(hashes) == 1}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arm", default="nvfp4")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--size", default="tiny")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--cuda-graph", action="store_true")
    ap.add_argument("--processes", type=int, default=2)
    ap.add_argument("--out", type=Path, default=None, help="a folder for the runs (default: a temporary one)")
    ap.add_argument("--child", action="store_true", help="train one run into --out (what each process does)")
    a = ap.parse_args(argv)
    kw = dict(arm=a.arm, seed=a.seed, size=a.size, steps=a.steps, batch=a.batch, device=a.device,
              cuda_graph=a.cuda_graph)
    if a.child:
        train_short(a.out, **kw)
        return
    with tempfile.TemporaryDirectory() as tmp:
        res = compare(in_processes(a.out or Path(tmp), a.processes, **kw))
    print(json.dumps({**kw, **res}))
    sys.exit(0 if res["identical"] else 1)


if __name__ == "__main__":
    main()
