"""Issue 16 item 15: messages that name what went wrong and how to fix it."""

import numpy as np
import pytest
from click.testing import CliRunner

import fpsim
from fpsim_cli.main import main


def run(*args):
    r = CliRunner().invoke(main, [*map(str, args)])
    assert "Traceback" not in r.output, r.output
    return r


@pytest.fixture
def small(tmp_path):
    p = tmp_path / "s.npz"
    np.savez(p, w=np.random.default_rng(0).standard_normal((16, 32)).astype(np.float32))
    return p


def test_linear_with_8_tokens_names_tokens_the_size_and_the_fix():
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError) as e:
        fpsim.linear(rng.standard_normal((8, 32)), rng.standard_normal((16, 32)), rng.standard_normal((8, 16)))
    msg = str(e.value)
    assert "tokens (8)" in msg and "Hadamard size 16" in msg and "pad" in msg and "without('rht')" in msg
    fpsim.linear(rng.standard_normal((8, 32)), rng.standard_normal((16, 32)), rng.standard_normal((8, 16)),
                 fpsim.get_recipe("nvfp4_paper").without("rht"))  # the suggested fix works


def test_format_given_a_scheme_hints_at_formats(small):
    r = run("analyze", small, "--format", "nvfp4")
    assert r.exit_code == 2 and "did you mean --formats nvfp4?" in r.output


def test_formats_given_an_output_format_hints_at_format(small):
    r = run("analyze", small, "--formats", "json")
    assert r.exit_code == 2 and "did you mean --format json?" in r.output


def test_dash_o_writes_the_output(tmp_path, small):
    out = tmp_path / "r.json"
    r = run("analyze", small, "--formats", "nvfp4", "-o", out)
    assert r.exit_code == 0 and out.read_text().startswith("{")


def test_one_error_prefix(tmp_path, small):
    for args in (["analyze", small, "--formats", "nvfp9"], ["analyze", tmp_path / "missing.npz"],
                 ["analyze", small, "--no-such-option"], ["formats", "e9m9"]):
        r = run(*args)
        assert r.exit_code == 2 and "error: " in r.output and "Error:" not in r.output, (args, r.output)


def test_directory_without_supported_files(tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    r = run("analyze", tmp_path)
    assert r.exit_code == 3 and "under :" not in r.output
    assert "error: nothing could be analysed: no tensor in" in r.output and ".safetensors" in r.output


def test_fpsim_alone_prints_its_help_and_version_still_works():
    r = run()
    assert r.exit_code in (0, 2) and "Commands:" in r.output and "error:" not in r.output
    r = run("--version")
    assert r.exit_code == 0 and r.output.startswith("fpsim ")
