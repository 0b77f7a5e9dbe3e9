"""Transformer Engine ``DumpTensors`` trees stay readable by ``fpsim analyze``; their pickled objects never run
(each is noted and skipped; the ``high_precision`` tensor beside it is read).

TE's debug feature writes ``<log_dir>/tensor_dumps/rank_<r>/<layer>_<tensor>_iter_<NNNNNN>.pt`` (dots of the layer
name become ``_``), each file a dict with ``high_precision`` (a tensor) and/or ``quantized`` (a pickled Python
object, e.g. TE's Float8Tensor).  The tree here is built in that layout, with one ``quantized`` entry a planted
object whose unpickling would create a marker file.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[1]
LAYERS = ("decoder.layers.0.self_attention.linear_qkv", "decoder.layers.1.mlp.linear_fc2")
ITERS = (1, 2)


class Planted:
    """Unpickling this calls ``open(marker, "w")``: the marker's existence would prove the pickle ran."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def build_tree(root: Path, marker: Path) -> dict[str, Path]:
    """The DumpTensors tree for two layers × (activation, gradient) × two iterations on rank 0; returns
    name → path of the malicious file and of one plain file."""
    g = torch.Generator().manual_seed(0)
    d = root / "tensor_dumps" / "rank_0"
    d.mkdir(parents=True)
    files = {}
    for layer in LAYERS:
        for tensor in ("activation", "gradient"):
            for it in ITERS:
                p = d / f"{layer.replace('.', '_')}_{tensor}_iter_{it:06d}.pt"
                obj = {"high_precision": torch.randn(32, 64, generator=g).to(torch.bfloat16)}
                if layer == LAYERS[1] and tensor == "activation" and it == 2:
                    obj["quantized"] = Planted(marker)
                    files["malicious"] = p
                torch.save(obj, p)
                files.setdefault("plain", p)
    return files


def analyze(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "fpsim", "analyze", *map(str, args)], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def tree(tmp_path):
    marker = tmp_path / "PWNED"
    files = build_tree(tmp_path / "te_logs", marker)
    # The planted object does run under a plain (unsafe) load: the test's marker is a real witness.
    torch.load(files["malicious"], weights_only=False)["quantized"].close()
    assert marker.exists()
    marker.unlink()
    return tmp_path / "te_logs", marker, files


def test_dump_tree_is_read_and_the_pickle_refused_without_running(tree, tmp_path):
    root, marker, files = tree
    out = tmp_path / "r.json"
    r = analyze(root, "--formats", "nvfp4", "--seeds", "0", "--format", "json", "-o", out)
    assert not marker.exists(), "the planted pickle ran"
    assert "Traceback" not in r.stderr
    assert r.returncode == 0, r.stderr  # the pickled object is noted and skipped, never built
    assert not [ln for ln in r.stderr.splitlines() if ln.startswith("error:")], r.stderr
    assert f"{files['malicious'].name}: 'quantized' is a pickled io.open object, not a tensor" in r.stderr
    rows = json.loads(out.read_text())["rows"]
    seen = {row["tensor"] for row in rows}
    n_files = len(LAYERS) * 2 * len(ITERS)
    assert len(seen) == n_files  # every file's high_precision tensor, the one beside the pickled object too
    assert all(t.endswith(":high_precision") for t in seen)
    assert any(files["malicious"].name in t for t in seen)
    assert any(files["plain"].name in t for t in seen)


def _iteration(name: str) -> int | None:
    m = re.search(r"_iter_(\d+)\.pt", name)
    return int(m.group(1)) if m else None


def test_dump_rows_grouped_by_iteration(tree, tmp_path):
    """Wanted: each row of a ``*_iter_<N>.pt`` file carries ``iteration`` N, and the JSON summary lists the
    rows per iteration (``summary.iterations``: {"1": [tensor, ...], "2": [...]})."""
    root, _, _ = tree
    out = tmp_path / "r.json"
    analyze(root, "--formats", "nvfp4", "--seeds", "0", "--format", "json", "-o", out)
    d = json.loads(out.read_text())
    for row in d["rows"]:
        assert row.get("iteration") == _iteration(row["tensor"])
    groups = d["summary"]["iterations"]
    assert sorted(groups) == [str(i) for i in ITERS]
    for it, tensors in groups.items():
        assert all(_iteration(t) == int(it) for t in tensors)
