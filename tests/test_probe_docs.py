"""docs/probe.md runs as pasted: its Python blocks execute in order (the worked example's A/A interval covers 0
and fpsim's own converted layers are not flagged)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytest.importorskip("torch")

DOC = Path(__file__).resolve().parents[1] / "docs" / "probe.md"


def test_python_blocks_run_as_pasted(capsys):
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
    assert len(blocks) == 3
    ns: dict = {"__name__": "__docs__"}
    for i, code in enumerate(blocks):
        exec(compile(code, f"docs/probe.md python block {i + 1}", "exec"), ns)  # noqa: S102
    assert ns["res"].flagged().empty
    out = capsys.readouterr().out
    assert "dgrad" in out and "wgrad" in out and "Empty DataFrame" in out
