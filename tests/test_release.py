"""Release hygiene: one version everywhere (package, metadata, `fpsim --version`, CHANGELOG), and the typing marker."""

import importlib.metadata
import re
from pathlib import Path

from click.testing import CliRunner

import fpsim
from fpsim_cli.main import main

ROOT = Path(__file__).resolve().parents[1]


def test_the_version_is_0_2_0_in_the_package_and_its_metadata():
    assert fpsim.__version__ == "0.2.0"
    assert importlib.metadata.version("fpsim") == fpsim.__version__  # pyproject reads it from fpsim.__version__


def test_fpsim_version_prints_the_package_version():
    for flag in ("--version", "-V"):
        r = CliRunner().invoke(main, [flag])
        assert r.exit_code == 0 and r.output == f"fpsim {fpsim.__version__}\n"


def test_the_changelog_has_a_section_for_this_version_first():
    text = (ROOT / "CHANGELOG.md").read_text()
    versions = re.findall(r"^## \[?(\d+\.\d+\.\d+)\]? - (\d{4}-\d{2}-\d{2})$", text, re.M)
    assert versions and versions[0][0] == fpsim.__version__
    assert [v for v, _ in versions] == sorted((v for v, _ in versions), key=lambda v: tuple(map(int, v.split("."))),
                                             reverse=True)


def test_the_package_ships_its_typing_marker():
    assert (Path(fpsim.__file__).parent / "py.typed").is_file()
    assert 'fpsim = ["py.typed"]' in (ROOT / "pyproject.toml").read_text()
