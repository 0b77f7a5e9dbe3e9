"""Helpers of the CLI tests: run ``fpsim analyze`` in-process, and parse JSON strictly."""

from __future__ import annotations

import json

from click.testing import CliRunner

from fpsim_cli.main import main


def run(*args):
    """``fpsim analyze ARGS`` through click's runner; a traceback in the output fails the test."""
    r = CliRunner().invoke(main, ["analyze", *map(str, args)])
    assert "Traceback" not in r.output, r.output
    return r


def strict_json(text: str):
    """``json.loads`` that refuses NaN/Infinity constants (fpsim writes null for them)."""

    def bad(c):
        raise ValueError(f"invalid JSON constant {c}")

    return json.loads(text, parse_constant=bad)
