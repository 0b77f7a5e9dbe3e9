"""Each reader's fuzz target (tests/fuzz) run briefly under atheris from its committed seed corpus: a fixed seed and a
fixed number of inputs (about a second of fuzzing each), failing on any finding with libFuzzer's report.  Bounds: 2 GB
RSS, and 10 s per input (the long campaign, ``make fuzz``, holds every input to 2 s: reports/fuzz.md; here the suite's
other workers share the two cores, and an input of 0.3 s alone has taken over 2 s beside them)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("atheris", reason="atheris is not installed (pip install -e '.[dev]')")

from tests.fuzz.harnesses import CORPUS, READERS  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]

#: inputs per reader: about a second of fuzzing each on one core (the .pt readers run torch.load per input), beside
#: a start of about 3 s (imports, instrumentation, the seeds' first read); 9 readers: about 50 s of CPU in all
RUNS = {"safetensors": 3000, "npz": 1200, "npy": 2500, "pt_zip": 400, "pt_legacy": 800, "te_dump": 700,
        "gguf": 1000, "checkpoint": 250, "quantized": 2000}


def test_every_reader_has_a_target_and_seeds():
    assert set(RUNS) == set(READERS)
    for name in READERS:
        seeds = list((CORPUS / name).iterdir())
        assert len(seeds) >= 4, name
        assert all(f.stat().st_size < 16_384 for f in seeds), name
    total = sum(f.stat().st_size for f in CORPUS.rglob("*") if f.is_file())
    assert total < 256 * 1024


@pytest.mark.parametrize("reader", sorted(RUNS))
def test_fuzz_reader_briefly(reader, tmp_path):
    new = tmp_path / "corpus"  # libFuzzer adds inputs to its first corpus directory: not the committed one
    new.mkdir()
    cmd = [sys.executable, "-m", "tests.fuzz.fuzz", reader, f"-runs={RUNS[reader]}", "-seed=1", "-timeout=10",
           "-rss_limit_mb=2048", "-max_total_time=30", f"-artifact_prefix={tmp_path}/", str(new),
           str(CORPUS / reader)]
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, errors="replace", timeout=120)
    log = p.stdout + p.stderr
    found = sorted(f.name for f in tmp_path.iterdir() if f.name.startswith(("crash-", "timeout-", "oom-", "slow-")))
    assert p.returncode == 0 and not found, f"{reader}: finding {found} (rc {p.returncode}):\n{log[-4000:]}"
    assert f"Done {RUNS[reader]} runs" in log or f"#{RUNS[reader]}\tDONE" in log, log[-2000:]
