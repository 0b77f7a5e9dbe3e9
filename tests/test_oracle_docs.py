"""docs/oracle.md runs as pasted: its Python blocks execute in order, and the outputs it shows for
`fpsim explain 5.0 --format e2m1` and the worked example's `fpsim diff` are what the CLI prints."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from click.testing import CliRunner

from fpsim_cli.main import main

DOC = Path(__file__).resolve().parents[1] / "docs" / "oracle.md"


def _blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", DOC.read_text(), flags=re.S)


def test_python_blocks_run_as_pasted(tmp_path, monkeypatch, capsys):
    blocks = _blocks("python")
    assert len(blocks) >= 4
    monkeypatch.chdir(tmp_path)
    ns: dict = {"__name__": "__docs__"}
    for i, code in enumerate(blocks):
        exec(compile(code, f"docs/oracle.md python block {i + 1}", "exec"), ns)  # noqa: S102
    assert (tmp_path / "mine.npz").is_file()
    assert '"class": "nan"' in capsys.readouterr().out


def _shown(command: str) -> list[str]:
    """The lines docs/oracle.md shows after ``$ <command>`` up to the next ``$`` line or the block's end."""
    for block in _blocks("console"):
        lines = block.splitlines()
        if f"$ {command}" in lines:
            i = lines.index(f"$ {command}") + 1
            out = []
            while i < len(lines) and not lines[i].startswith("$ "):
                out.append(lines[i])
                i += 1
            return out
    raise AssertionError(f"docs/oracle.md shows no `$ {command}`")


def test_console_outputs_are_what_the_cli_prints(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    ns: dict = {}
    exec(next(b for b in _blocks("python") if "my_kernel" in b), ns)  # noqa: S102 - writes x.npz, mine.npz
    for cmd in ("fpsim explain 5.0 --format e2m1", "fpsim diff mine.npz --input x.npz --scheme nvfp4 --show 4"):
        r = CliRunner().invoke(main, shlex.split(cmd)[1:])
        assert r.stdout.rstrip("\n").splitlines() == _shown(cmd), r.stdout
