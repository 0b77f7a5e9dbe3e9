"""The README is a short guide whose code runs as written: its shell blocks' ``fpsim`` commands run through the
CLI, then each Python block runs as a script and as pasted into an interactive ``python``, in a scratch directory
where ``studies/`` is the repository's; the pages it points at exist and every SPEC section cited exists."""

import re
from pathlib import Path

import pytest

from tests.docblocks import blocks, console_errors, run_python, run_shell_block

ROOT = Path(__file__).parents[1]
README = (ROOT / "README.md").read_text()
BLOCKS = blocks(ROOT / "README.md")
PYTHON = [b for b in BLOCKS if b.lang == "python"]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """A scratch directory after the README's shell blocks ran in it (the analyze task's report.csv)."""
    d = tmp_path_factory.mktemp("readme")
    (d / "studies").symlink_to(ROOT / "studies")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(d)
        skipped = []
        for b in BLOCKS:
            if b.lang in ("bash", "console") and b.not_run is None:
                skipped += run_shell_block(b)
    # the two set-up commands: the fpsim half of the first ran above; the installs and `make test` are the suite's own
    assert skipped == ["pip install -e .", "pip install -e '.[dev]'", "make test"]
    return d


def test_readme_is_a_short_guide_with_the_two_setup_commands_and_four_tasks():
    assert len(README.splitlines()) <= 150
    setup = README.split("## Set-up", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0].splitlines()
    assert setup == ["pip install -e . && fpsim analyze studies/data/tinylm_capture.safetensors",
                     "pip install -e '.[dev]' && make test"]
    assert "make test" in (ROOT / ".ci" / "run").read_text()  # CI runs the README's test command
    tasks = re.findall(r"^### (.+)$", README, re.M)
    assert len(tasks) == 4, tasks
    assert [b.not_run is not None for b in BLOCKS].count(True) == 1  # `make reports`: minutes; test_reports runs it


@pytest.mark.parametrize("i", range(len(PYTHON)))
def test_readme_python_block_runs_as_a_script(i, workdir, monkeypatch, capsys):
    monkeypatch.chdir(workdir)
    run_python(PYTHON[i], {"__name__": "__readme__"})


@pytest.mark.parametrize("i", range(len(PYTHON)))
def test_readme_python_block_runs_pasted_into_the_interpreter(i, workdir, monkeypatch, capsys):
    """Pasted into ``python``, a block must not need the blank lines a script can do without (or break on them)."""
    monkeypatch.chdir(workdir)
    assert console_errors(PYTHON[i].body) == [], PYTHON[i].where


def test_console_check_catches_what_a_paste_breaks_on():
    assert console_errors("def f():\n    return 1\nx = f()\n")  # the REPL needs a blank line after a def
    assert console_errors("x = 1\n\nx.nope\n")
    assert console_errors("def f():\n    return 1\n\nx = f()\n") == []


def test_spec_is_in_the_repository_with_every_cited_section():
    spec = (ROOT / "docs" / "spec.md").read_text()
    assert "docs/spec.md" in README
    sections = {int(n) for n in re.findall(r"^## (\d+)\. ", spec, re.M)}
    assert sections >= set(range(1, 12)) and sections == set(range(1, max(sections) + 1))  # numbered, no gaps
    cited = set()
    for p in [*ROOT.glob("fpsim/**/*.py"), *ROOT.glob("cli/*.py"), ROOT / "README.md", *ROOT.glob("docs/*.md")]:
        cited |= {int(n) for n in re.findall(r"SPEC §(\d+)", p.read_text())}
    assert cited and cited <= sections, cited - sections
