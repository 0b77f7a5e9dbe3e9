"""The README's Python snippets run when pasted (issue 16 item 14), and the docs it points at exist."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
README = (ROOT / "README.md").read_text()
BLOCKS = re.findall(r"```python\n(.*?)```", README, re.S)


def test_readme_has_python_snippets():
    assert BLOCKS, "no ```python block in README.md"


@pytest.mark.parametrize("i", range(len(BLOCKS)))
def test_readme_python_block_runs_as_pasted(i, capsys):
    """Each block on its own, in a fresh namespace, as a user would paste it."""
    exec(compile(BLOCKS[i], f"README.md python block {i + 1}", "exec"), {"__name__": "__readme__"})


def test_spec_is_in_the_repository_with_every_cited_section():
    spec = (ROOT / "docs" / "spec.md").read_text()
    assert "docs/spec.md" in README
    sections = {int(n) for n in re.findall(r"^## (\d+)\. ", spec, re.M)}
    assert sections >= set(range(1, 12)) and sections == set(range(1, max(sections) + 1))  # numbered, no gaps
    cited = set()
    for p in [*ROOT.glob("fpsim/**/*.py"), *ROOT.glob("cli/*.py"), ROOT / "README.md"]:
        cited |= {int(n) for n in re.findall(r"SPEC §(\d+)", p.read_text())}
    assert cited and cited <= sections, cited - sections
