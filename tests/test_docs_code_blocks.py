"""Every code block of the documentation pages runs: each page's Python blocks in order as pasted (one namespace
per page), and the ``fpsim ...`` commands of its bash and console blocks through the CLI, in a scratch directory
where ``studies/`` is the repository's (so the bundled capture's path works as written). Blocks that cannot run
here carry a ``<!-- not run: REASON -->`` marker, counted below; the blocks of four pages run in their own tests.
The generated parts of the site (formats' spec sheets, the recipe table) are checked against the code."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from tests.docblocks import CODE_LANGS, ROOT, Block, blocks, run_python, run_shell_block

DOCS = ROOT / "docs"
PAGES = sorted(p.name for p in DOCS.glob("*.md"))

#: Pages whose Python blocks another test runs (with what they show checked there).
PYTHON_ELSEWHERE = {"probe.md": "tests/test_probe_docs.py", "testing.md": "tests/test_testing.py"}
#: Pages whose shell blocks another test runs.
SHELL_ELSEWHERE = {"checkpoints.md": "tests/test_checkpoints_docs.py"}
#: The marked blocks (<!-- not run: ... -->) per page: each needs a GPU, the network, a model file or minutes.
NOT_RUN = {"install.md": 2, "training.md": 1, "reports.md": 1, "probe.md": 1, "testing.md": 2}


def test_every_page_is_in_the_site_and_every_block_has_a_known_kind():
    nav = (ROOT / "mkdocs.yml").read_text()
    for page in PAGES:
        assert f": {page}" in nav, f"docs/{page} is not in mkdocs.yml's nav"
        for b in blocks(DOCS / page):
            assert b.lang in (*CODE_LANGS, "text"), f"{b.where}: a block must say its language (```{b.lang or '?'})"


def test_the_blocks_that_are_not_run_are_the_marked_ones():
    counted = {}
    for page in PAGES:
        marked = [b for b in blocks(DOCS / page) if b.not_run is not None]
        assert all(b.lang in CODE_LANGS and b.not_run.strip() for b in marked), page
        if marked:
            counted[page] = len(marked)
    assert counted == NOT_RUN
    for test in (*PYTHON_ELSEWHERE.values(), *SHELL_ELSEWHERE.values()):
        assert (ROOT / test).is_file(), test


def _run_here(page: str) -> list:
    """The code blocks of a page this test runs: unmarked, and not run by the page's own test."""
    return [b for b in blocks(DOCS / page) if b.lang in CODE_LANGS and b.not_run is None
            and not (b.lang == "python" and page in PYTHON_ELSEWHERE)
            and not (b.lang != "python" and page in SHELL_ELSEWHERE)]


@pytest.mark.parametrize("page", [p for p in PAGES if _run_here(p)])
def test_page_code_blocks_run_as_pasted(page, tmp_path, monkeypatch, capsys):
    todo = _run_here(page)
    if any("torch" in b.body for b in todo if b.lang == "python") and importlib.util.find_spec("torch") is None:
        pytest.skip("the page's Python blocks need torch (the torch extra)")
    (tmp_path / "studies").symlink_to(ROOT / "studies")
    monkeypatch.chdir(tmp_path)
    ns: dict = {"__name__": "__docs__"}
    for b in todo:
        if b.lang == "python":
            run_python(b, ns)
        else:
            run_shell_block(b)


def test_the_shell_runner_checks_commands_exit_status_and_shown_lines():
    def block(lang, body):
        return Block("x.md", 1, lang, lang, body, None)

    assert run_shell_block(block("bash", "pip install -e . && fpsim formats e2m1\n")) == ["pip install -e ."]
    with pytest.raises(AssertionError, match="neither an fpsim command"):
        run_shell_block(block("bash", "rm -rf build\n"))
    with pytest.raises(AssertionError, match="does not print"):
        run_shell_block(block("console", "$ fpsim formats e2m1\n  max 7\n"))
    with pytest.raises(AssertionError, match="exited 2"):
        run_shell_block(block("console", "$ fpsim formats nosuchformat\n"))
    run_shell_block(block("console", "$ fpsim formats nosuchformat\n$ echo $?\n2\n"))


def _hooks():
    spec = importlib.util.spec_from_file_location("generated_pages", DOCS / "hooks" / "generated_pages.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_generated_pages_hold_every_format_scheme_and_recipe():
    import fpsim

    hooks = _hooks()
    page = hooks.generated_page((DOCS / "formats.md").read_text())
    assert hooks.MARKER not in page
    for name in fpsim.FORMATS:
        assert f"### {name}\n" in page, name
    for name in fpsim.SCHEMES:
        assert f"| `{name}` |" in page, name
    recipes = hooks.recipes_markdown()
    assert hooks.RECIPES_MARKER in (DOCS / "recipes.md").read_text()
    for name in fpsim.RECIPES:
        assert f"| `{name}` |" in recipes, name
    assert "| `nvfp4_paper` | nvfp4 | nvfp4 16×16 | nvfp4, SR | nvfp4 16×16 | nvfp4, SR, RHT 16 | nvfp4, RHT 16 | " \
           "first 2, last 8 |" in recipes
    with pytest.raises(ValueError, match="no"):
        hooks.generated_page("# Formats\n")


def test_docs_links_name_pages_that_exist():
    """mkdocs --strict checks the site's links; this checks the README's links into docs/ too, quickly."""
    import re

    for src in (ROOT / "README.md", *DOCS.glob("*.md")):
        for target in re.findall(r"\]\(([^)#\s]+\.md)(?:#[^)]*)?\)", src.read_text()):
            assert (src.parent / target).is_file(), f"{src.relative_to(ROOT)} links to a missing {target}"
    assert Path(ROOT / "mkdocs.yml").is_file()
