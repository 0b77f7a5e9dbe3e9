"""CLI: `fpsim formats` through click's runner and as a subprocess."""

import json
import subprocess
import sys

from click.testing import CliRunner

import fpsim
from fpsim_cli.main import main


def test_formats_table_lists_every_format_with_its_values():
    r = CliRunner().invoke(main, ["formats"])
    assert r.exit_code == 0, r.output
    for name in fpsim.FORMATS:
        assert name in r.output
    assert "±{0, 0.5, 1, 1.5, 2, 3, 4, 6}" in r.output
    assert "±{0, 0.0625, 0.125" in r.output  # E3M2 value list starts at its min subnormal


def test_formats_json_is_generated_from_the_specs():
    r = CliRunner().invoke(main, ["formats", "--format", "json", "e4m3", "e8m0"])
    assert r.exit_code == 0
    d = json.loads(r.output)
    assert [x["name"] for x in d] == ["float8_e4m3fn", "float8_e8m0fnu"]
    assert d[0]["max"] == 448.0 and d[0]["min_subnormal"] == 2.0**-9 and d[0]["nan_input_gives"] == "0x7F"
    assert d[1]["min_subnormal"] is None and d[1]["max_code"] == "0xFE"


def test_formats_markdown():
    r = CliRunner().invoke(main, ["formats", "--format", "markdown", "fp4"])
    assert r.exit_code == 0 and r.output.startswith("### float4_e2m1fn")
    assert "| max | 6 |" in r.output


def test_unknown_format_is_a_usage_error():
    r = CliRunner().invoke(main, ["formats", "e9m9"])
    assert r.exit_code == 2
    assert "unknown element format 'e9m9'" in r.output
    assert "Traceback" not in r.output


def test_python_dash_m_fpsim_works_like_fpsim():
    p = subprocess.run([sys.executable, "-m", "fpsim", "formats", "e2m1"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("float4_e2m1fn")
