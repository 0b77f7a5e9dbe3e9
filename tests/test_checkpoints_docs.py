"""docs/checkpoints.md runs as pasted: every ``$ fpsim ...`` command of its console blocks runs from the
repository's root, and every output line the page shows under a command is a line of that command's output."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from click.testing import CliRunner

from fpsim_cli.main import main

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "checkpoints.md"


def _commands():
    out = []
    for block in re.findall(r"```console\n(.*?)```", DOC.read_text(), flags=re.S):
        for chunk in re.split(r"^\$ ", block, flags=re.M)[1:]:
            cmd, *shown = chunk.rstrip("\n").split("\n")
            out.append((cmd, shown))
    return out


def test_console_blocks_run_as_pasted(tmp_path, monkeypatch):
    cmds = _commands()
    assert len(cmds) == 5
    monkeypatch.chdir(ROOT)
    for cmd, shown in cmds:
        argv = shlex.split(cmd)
        assert argv[0] == "fpsim"
        argv = [str(tmp_path / a) if a == "report.json" else a for a in argv[1:]]
        r = CliRunner().invoke(main, argv)
        assert r.exit_code == 0, (cmd, r.output)
        lines = set(r.output.splitlines())
        for line in shown:
            line = line.replace("report.json", str(tmp_path / "report.json"))
            assert line in lines, f"{cmd}\nnot in the output: {line}\n---\n{r.output}"
    assert (tmp_path / "report.json").exists()
