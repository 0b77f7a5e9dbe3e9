"""Issue 48 item 4: the edges of the interface, one test each (each failed before its fix)."""

import itertools
import re
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from click.testing import CliRunner

import fpsim
from fpsim.io import write_safetensors
from fpsim.schemes import get_scheme
from fpsim_cli.main import main
from tests.cliutil import run, strict_json

FAST = ["--formats", "nvfp4", "--seeds", "0"]
SPEC = Path(__file__).parents[1] / "docs" / "spec.md"


def run_split(*args):
    """``fpsim analyze ARGS`` with stdout and stderr apart."""
    r = CliRunner().invoke(main, ["analyze", *map(str, args)])
    assert "Traceback" not in r.output, r.output
    return r


@pytest.fixture
def three(tmp_path):
    p = tmp_path / "three.safetensors"
    rng = np.random.default_rng(0)
    write_safetensors(p, {f"l{i}.weight": rng.standard_normal((8, 32)).astype(np.float32) for i in range(3)})
    return p


# --- torch tensors are accepted by quantize as by encode ------------------------------------------------


@pytest.mark.parametrize("backend", [None, "numba-cpu", "torch-cpu"])
def test_quantize_takes_torch_tensors(backend):
    torch = pytest.importorskip("torch", reason="torch inputs need torch")
    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(0), requires_grad=True)
    want = fpsim.quantize(x.detach().numpy(), "nvfp4")
    got = fpsim.quantize(x, "nvfp4", backend=backend)
    assert np.array_equal(got.data, want.data) and np.array_equal(got.scales, want.scales)
    xb = x.detach().to(torch.bfloat16)  # no numpy dtype: read by its bits as ml_dtypes.bfloat16
    ref = x.detach().numpy().astype(ml_dtypes.bfloat16)
    assert np.array_equal(fpsim.quantize(xb, "nvfp4", backend=backend).data, fpsim.quantize(ref, "nvfp4").data)
    assert np.array_equal(fpsim.encode(xb, "e4m3"), fpsim.encode(ref, "e4m3"))


# --- one usage error for an impossible --axis -----------------------------------------------------------


def test_impossible_axis_is_one_usage_error(three):
    r = run_split(three, *FAST, "--axis", "5")
    assert r.exit_code == 2 and r.stdout == ""
    errors = [ln for ln in r.stderr.splitlines() if ln.lower().startswith("error")]
    assert len(errors) == 1 and "--axis 5" in errors[0] and "ranks: 2" in errors[0]
    assert run(three, *FAST, "--axis", "-2").exit_code == 0  # a possible axis still works


# --- the output format from the extension, or a clear refusal --------------------------------------------


def test_output_format_from_the_extension_or_a_refusal(tmp_path, three):
    xlsx = tmp_path / "out.xlsx"
    r = run_split(three, *FAST, "-o", xlsx)
    assert r.exit_code == 2 and not xlsx.exists() and "cannot write a .xlsx file" in r.stderr
    for name, check in (("r.json", lambda t: strict_json(t)["rows"]), ("r.txt", lambda t: "ranking:" in t),
                        ("r.markdown", lambda t: t.startswith("**three"))):
        assert run(three, *FAST, "-o", tmp_path / name).exit_code == 0 and check((tmp_path / name).read_text())
    assert run(three, *FAST, "-o", xlsx, "--format", "csv").exit_code == 0  # asked for explicitly: written


# --- the usual scheme aliases ---------------------------------------------------------------------------


@pytest.mark.parametrize("alias,name", [("mxfp8", "mxfp8_e4m3"), ("fp8", "fp8_e4m3"), ("MXFP8", "mxfp8_e4m3"),
                                        ("e5m2", "fp8_e5m2"), ("bfloat16", "bf16"), ("float8_e4m3fn", "fp8_e4m3")])
def test_scheme_aliases(three, alias, name):
    assert get_scheme(alias).name == name
    r = run(three, "--formats", f"nvfp4,{alias}", "--seeds", "0", "--format", "json")
    assert r.exit_code == 0 and {x["scheme"] for x in strict_json(r.output)["rows"]} == {"nvfp4", name}
    x = np.linspace(-3, 3, 64, dtype=np.float32).reshape(2, 32)
    assert np.array_equal(fpsim.quantize(x, alias).data, fpsim.quantize(x, name).data)


# --- .bin and .npy are read by analyze ------------------------------------------------------------------


def test_npy_is_read_in_place_and_pickles_refused(tmp_path):
    rng = np.random.default_rng(1)
    w = rng.standard_normal((16, 32)).astype(np.float32)
    np.save(tmp_path / "fc1.weight.npy", w)
    np.save(tmp_path / "f.npy", np.asfortranarray(w))
    np.save(tmp_path / "obj.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    r = run_split(tmp_path, *FAST, "--format", "json")
    assert r.exit_code == 1 and "obj.npy: holds Python objects (a pickle); refusing" in r.stderr
    rows = {x["tensor"]: x for x in strict_json(r.stdout)["rows"]}
    assert set(rows) == {"fc1.weight.npy:fc1.weight", "f.npy:f"}
    assert rows["fc1.weight.npy:fc1.weight"]["role"] == "weight"
    want = fpsim.quantize(w, "nvfp4").dequantize().astype(np.float64)
    assert rows["f.npy:f"]["mse"] == rows["fc1.weight.npy:fc1.weight"]["mse"] == pytest.approx(
        float(np.mean((w - want) ** 2)), rel=1e-12)


def test_pytorch_model_bin_is_read_without_unpickling(tmp_path):
    torch = pytest.importorskip("torch", reason=".bin files are torch.save files")

    class Planted:
        def __reduce__(self):
            return (open, (str(tmp_path / "ran"), "w"))

    g = torch.Generator().manual_seed(0)
    torch.save({"l.weight": torch.randn(16, 32, generator=g), "l.bias": torch.randn(16, generator=g),
                "evil": Planted()}, tmp_path / "pytorch_model.bin")
    torch.save({"m.weight": torch.randn(16, 32, generator=g)}, tmp_path / "legacy.bin",
               _use_new_zipfile_serialization=False)
    r = run_split(tmp_path, *FAST, "--format", "json")
    assert r.exit_code == 0, r.output
    roles = {x["tensor"]: x["role"] for x in strict_json(r.stdout)["rows"]}
    assert roles == {"pytorch_model.bin:l.weight": "weight", "pytorch_model.bin:l.bias": "bias",
                     "legacy.bin:m.weight": "weight"}
    assert not (tmp_path / "ran").exists() and "evil" in r.stderr


# --- messages on stderr ---------------------------------------------------------------------------------


def test_nothing_to_analyse_says_so_on_stderr_only(tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "notes.txt").write_text("hello")
    for path in (tmp_path / "empty", tmp_path / "notes.txt"):
        r = run_split(path)
        assert r.exit_code == 3 and r.stdout == "" and "nothing could be analysed" in r.stderr


# --- the ml_dtypes and torch FP8 casts in the docs' table ------------------------------------------------


def _table():
    text = SPEC.read_text()
    head = next(ln for ln in text.splitlines() if ln.startswith("| input | format | fpsim default"))
    rows = list(itertools.takewhile(lambda ln: ln.startswith("|"), text[text.index(head):].splitlines()[2:]))
    cols = [c.strip() for c in head.strip("|").split("|")]
    return cols, [[c.strip() for c in ln.strip("|").split("|")] for ln in rows]


def _value(s: str) -> np.float32:
    v = {"+NaN": np.float32(np.nan), "−NaN": -np.float32(np.nan), "+inf": np.float32(np.inf)}.get(s)
    return np.float32(float(s)) if v is None else v


def test_docs_fp8_cast_table_matches_the_libraries():
    cols, rows = _table()
    assert len(rows) == 8
    ml_ver = re.search(r"ml_dtypes (\d+\.\d+)", " ".join(cols)).group(1)
    torch_ver = re.search(r"torch (\d+\.\d+)", " ".join(cols)).group(1)
    for inp, fmt, fp_def, fp_nosat, ml, tch in rows:
        x = np.array([_value(inp)], np.float32)
        f = fmt.lower()
        assert f"{int(fpsim.encode(x, f)[0]):#04X}".replace("0X", "0x") == fp_def, (inp, fmt)
        assert f"{int(fpsim.encode(x, f, saturate=False)[0]):#04X}".replace("0X", "0x") == fp_nosat, (inp, fmt)
        if ".".join(ml_dtypes.__version__.split(".")[:2]) == ml_ver:
            got = x.astype(getattr(ml_dtypes, {"e4m3": "float8_e4m3fn", "e5m2": "float8_e5m2"}[f])).view(np.uint8)
            assert f"0x{int(got[0]):02X}" == ml, (inp, fmt, "ml_dtypes")
        try:
            import torch
        except ImportError:
            continue
        if ".".join(torch.__version__.split(".")[:2]) == torch_ver:
            td = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}[f]
            got = torch.from_numpy(x).to(td).view(torch.uint8).item()
            assert f"0x{got:02X}" == tch, (inp, fmt, "torch")


# --- --workers says why more workers than cores cannot help ---------------------------------------------


def test_more_workers_than_cores_says_why_and_gives_the_serial_result(three, monkeypatch):
    """The pool is a thread pool here (spawning processes costs seconds each); the note comes before it starts."""
    import concurrent.futures
    import os

    class Pool(concurrent.futures.ThreadPoolExecutor):
        def __init__(self, max_workers, mp_context=None, **kw):
            super().__init__(max_workers, **kw)

    monkeypatch.setattr(concurrent.futures, "ProcessPoolExecutor", Pool)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    serial = run_split(three, *FAST, "--format", "csv")
    r = run_split(three, *FAST, "--format", "csv", "--workers", cores + 1)
    assert r.exit_code == serial.exit_code == 0 and r.stdout == serial.stdout
    assert f"note: --workers {cores + 1} on {cores} CPU core(s): at most {cores} run at once" in r.stderr
