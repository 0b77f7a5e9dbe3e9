"""The fenced code blocks of the README and the docs pages, and how the tests run them as a reader would.

A block is code when its language is ``python``, ``bash`` or ``console``; ``text`` blocks (outputs, synopses) are
not. A code block that cannot run here is marked by an HTML comment on the line before its fence,
``<!-- not run: REASON -->``, which the tests read and count. Python blocks run as pasted, both as a script
(``exec``) and line by line in an interactive console (where a compound statement ends at a blank line); shell
blocks run their ``fpsim ...`` commands through the CLI in-process, and any other command must be one of
:data:`SETUP_COMMANDS`, which the suite covers otherwise.
"""

from __future__ import annotations

import code
import re
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

from click.testing import CliRunner

ROOT = Path(__file__).resolve().parents[1]
CODE_LANGS = ("python", "bash", "console")

_FENCE = re.compile(r"(?P<marker>^<!-- not run: (?P<why>[^\n]*?) -->\n)?^```(?P<info>[^\n]*)\n(?P<body>.*?)^```[ \t]*$",
                    re.M | re.S)

#: Shell commands of the pages that are not run by the docs tests, and why that is enough.
SETUP_COMMANDS = {
    "pip install -e .": "installs fpsim (the test environment has it installed)",
    "pip install -e '.[dev]'": "installs the test extras (the test environment has them)",
    "make test": "the test suite itself",
    "make docs": "builds this site; .ci/run runs it after the tests",
}


@dataclass(frozen=True)
class Block:
    page: str
    line: int
    lang: str
    info: str
    body: str
    not_run: str | None  # the reason of a <!-- not run: ... --> marker

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


def blocks(path: Path) -> list[Block]:
    """Every fenced block of a markdown file, in order."""
    text = path.read_text()
    out = []
    for m in _FENCE.finditer(text):
        info = m["info"].strip()
        lang = info.split()[0] if info else ""
        line = text.count("\n", 0, m.start("info")) + 1
        out.append(Block(str(path.relative_to(ROOT)), line, lang, info, m["body"], m["why"]))
    return out


def run_python(block: Block, ns: dict) -> None:
    """The block as a script, in ``ns`` (shared by the blocks of one page, run in order)."""
    exec(compile(block.body, f"{block.where} (python block)", "exec"), ns)  # noqa: S102 - the documented code


def console_errors(source: str) -> list[str]:
    """Feed ``source`` line by line to an interactive console, as a paste into ``python`` does; the errors."""
    errors: list[str] = []

    class Console(code.InteractiveConsole):
        def showtraceback(self):
            errors.append(f"{sys.exc_info()[0].__name__}: {sys.exc_info()[1]}")

        def showsyntaxerror(self, filename=None, **kwargs):
            errors.append(f"SyntaxError: {sys.exc_info()[1]}")

    con = Console({"__name__": "__console__"})
    more = False
    for line in source.splitlines():
        more = con.push(line)
    if more:
        con.push("")
    return errors


def shell_commands(block: Block) -> list[tuple[str, list[str]]]:
    """(command, lines shown after it) of a bash or console block; ``a && b`` is two commands."""
    out: list[tuple[str, list[str]]] = []
    lines = re.sub(r"\\\n\s*", " ", block.body).splitlines()  # a line continued with a backslash is one command
    if block.lang == "console":
        for ln in lines:
            if ln.startswith("$ "):
                out.append((ln[2:], []))
            elif out:
                out[-1][1].append(ln)
    else:
        out = [(ln, []) for ln in lines if ln.strip() and not ln.lstrip().startswith("#")]
    split = []
    for cmd, shown in out:
        parts = [p.strip() for p in cmd.split("&&")]
        split += [(p, []) for p in parts[:-1]] + [(parts[-1], shown)]
    return split


def run_fpsim(command: str):
    """``fpsim ...`` through the CLI in this process (the current directory is the caller's)."""
    from fpsim_cli.main import main

    argv = shlex.split(command, comments=True)
    assert argv[0] == "fpsim", command
    return CliRunner().invoke(main, argv[1:])


def run_shell_block(block: Block) -> list[str]:
    """Run a shell block's ``fpsim`` commands, check each against what the block shows; the setup commands it
    names (see :data:`SETUP_COMMANDS`). A block showing ``$ echo $?`` and a number expects that exit status."""
    skipped = []
    cmds = shell_commands(block)
    for i, (cmd, shown) in enumerate(cmds):
        if cmd == "echo $?":
            continue
        if not cmd.startswith("fpsim "):
            assert cmd in SETUP_COMMANDS, f"{block.where}: `{cmd}` is neither an fpsim command nor a known setup one"
            skipped.append(cmd)
            continue
        expect = 0
        if i + 1 < len(cmds) and cmds[i + 1][0] == "echo $?":
            expect = int(cmds[i + 1][1][0])
        r = run_fpsim(cmd)
        assert r.exit_code == expect, f"{block.where}: `{cmd}` exited {r.exit_code}\n{r.output}"
        got = set(r.output.splitlines())
        for line in shown:
            if line.strip() and line.strip() != "...":
                assert line in got, f"{block.where}: `{cmd}` does not print\n{line}\n---\n{r.output}"
    return skipped
