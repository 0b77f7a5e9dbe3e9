"""``fpsim probe`` end to end on each kind of model file (a tiny GGUF, BERT checkpoint directory and campaign
checkpoint, written in the tests): JSON and CSV outputs, the stdout summary, the figures, the progress bar; bad
inputs give one line and exit status 2."""

from __future__ import annotations

import csv
import io
import math

import numpy as np
import pytest
from click.testing import CliRunner

torch = pytest.importorskip("torch")
pytest.importorskip("gguf")
pytest.importorskip("tokenizers")

from fpsim_cli.main import main  # noqa: E402
from tests.cliutil import strict_json  # noqa: E402
from tests.test_llm_gguf import write_tiny  # noqa: E402
from tests.test_torch_models import WORDS, write_bert, write_campaign  # noqa: E402

#: Small and fast: one thread (two thread pools contend on tiny tensors), two batches, two draws.
FAST = ["--threads", "1", "--batches", "2", "--draws", "2", "--val-batches", "1"]
NUMERIC = ("n", "mean", "sd", "ci_low", "ci_high", "p", "p_holm", "mde80")


def probe(*args):
    r = CliRunner().invoke(main, ["probe", *map(str, args)])
    assert "Traceback" not in r.output, r.output
    return r


@pytest.fixture(scope="module")
def gguf_file(tmp_path_factory):
    d = tmp_path_factory.mktemp("gguf")
    write_tiny(d / "tiny.gguf")
    (d / "text.txt").write_text("abc ab cab ba zyx " * 200, encoding="utf-8")
    return d


def _numbers_or_null(rows, cols):
    for r in rows:
        for c in cols:
            v = r[c]
            assert v is None or (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)), (c, v)


def test_gguf_json_output_and_summary(gguf_file, tmp_path):
    out = tmp_path / "probe.json"
    r = probe(gguf_file / "tiny.gguf", "--text", gguf_file / "text.txt", "--seq-len", 16, "--batch-size", 2,
              "--layers", "layers.1.mlp.*", "-o", out, *FAST)
    assert r.exit_code == 0, r.output
    d = strict_json(out.read_text())
    assert set(d) == {"meta", "summary", "components", "flags", "steps", "table"}
    assert d["meta"]["model"]["arch"] == "gguf" and d["meta"]["recipe"] == "nvfp4_paper"
    assert d["meta"]["layers_measured"] == ["layers.1.mlp.down_proj", "layers.1.mlp.gate_proj", "layers.1.mlp.up_proj"]
    assert d["meta"]["keep_bf16"] == {"first": 0, "last": 0}  # 2 of 62 and 8 of 62 of 2 blocks round to 0
    comps = {c["component"] for c in d["components"]}
    assert {"bf16", "sr", "rht", "2d", "four-over-six", "tensor scale"} <= comps
    _numbers_or_null(d["components"], NUMERIC)
    _numbers_or_null(d["summary"], ("n", "mean", "ci_low", "ci_high", "sd"))
    _numbers_or_null(d["table"], ("batch", "draws", "rel_err", "cos", "gain", "bias", "noise"))
    assert {s["optimizer"] for s in d["steps"]} == {"sgd", "adamw"}
    assert "Component effects" in r.stdout and "Δ rel_err" in r.stdout and "One optimizer step" in r.stdout
    assert "flags: none to check" in r.stdout
    assert r.stderr.strip() == f"note: wrote {out}"  # no bar when stderr is not a terminal


def test_hf_checkpoint_csv_output_and_without(tmp_path):
    write_bert(tmp_path / "bert")
    text = tmp_path / "t.txt"
    text.write_text(" ".join(WORDS * 40), encoding="utf-8")
    out = tmp_path / "summary.csv"
    r = probe(tmp_path / "bert", "--text", text, "--seq-len", 8, "--batch-size", 4, "--without", "sr",
              "--layers", "layers.0.ffn_*", "-o", out, *FAST)
    assert r.exit_code == 0, r.output
    rows = list(csv.DictReader(io.StringIO(out.read_text())))
    assert rows and list(rows[0]) == ["layer", "gemm", "variant", "mode", "metric", "n", "mean", "ci_low", "ci_high",
                                      "sd"]
    for row in rows:
        for c in ("n", "mean", "ci_low", "ci_high", "sd"):
            assert row[c] == "" or math.isfinite(float(row[c])), (c, row[c])
    variants = {row["variant"] for row in rows}
    assert "without sr" in variants and "without rht" not in variants and "recipe" in variants
    assert "layers.0.ffn_in" in {row["layer"] for row in rows}


def test_campaign_checkpoint_tokens_plot_and_progress(tmp_path):
    _, _, folder = write_campaign(tmp_path / "runs")
    toks = tmp_path / "t.npy"
    np.save(toks, (np.arange(2000) * 7 % 256).astype(np.int32))
    plots = tmp_path / "plots"
    out = tmp_path / "p.json"
    r = probe(folder, "--tokens", toks, "--seq-len", 16, "--batch-size", 2, "--mode", "isolated",
              "--without", "rht", "--layers", "blocks.1.mlp.*", "--plot", plots, "--progress", "-o", out, *FAST)
    assert r.exit_code == 0, r.output
    meta = strict_json(out.read_text())["meta"]
    assert meta["adam_state"] == "given" and meta["model"]["step"] == 1  # the checkpoint's AdamW state and step
    assert meta["modes"] == ["isolated"] and meta["data"]["source"].endswith("t.npy (token ids)")
    names = sorted(p.name for p in plots.iterdir())
    assert names == ["component_aa.png", "component_bf16.png", "component_four_over_six.png", "component_rht.png"]
    assert all((plots / n).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for n in names)
    assert "fpsim probe" in r.stderr and "pass" in r.stderr  # the bar
    assert "end_to_end" not in r.stdout.split("Component effects")[1].split("One optimizer")[0]


def test_figures_are_deterministic(tmp_path):
    import pandas as pd

    from fpsim_cli.probe_render import plot_components

    rows = []
    for comp, sign in (("sr", 1.0), ("four-over-six", -1.0)):
        for gemm in ("fprop", "dgrad", "wgrad"):
            for mode in ("isolated", "end_to_end"):
                for metric in ("rel_err", "gain", "bias"):
                    m = sign * 0.01 * (1 + len(gemm) + len(mode))
                    rows.append({"component": comp, "variant": f"without {comp}", "against": "recipe", "gemm": gemm,
                                 "mode": mode, "metric": metric, "n": 4, "mean": m, "ci_low": m - 0.003,
                                 "ci_high": m + 0.002 if gemm != "dgrad" else None, "p_holm": 0.5, "mde80": 0.01})
        rows.append({"component": comp, "variant": f"without {comp}", "against": "recipe", "gemm": "step",
                     "mode": "sgd", "metric": "step_ratio", "n": 4, "mean": 0.02, "ci_low": -0.01, "ci_high": 0.05,
                     "p_holm": 1.0, "mde80": 0.04})
    df = pd.DataFrame(rows)
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    pa, pb = plot_components(df, a), plot_components(df, b)
    assert [p.name for p in pa] == ["component_sr.png", "component_four_over_six.png"]
    assert all(x.read_bytes() == y.read_bytes() for x, y in zip(pa, pb))


# --- bad input: one line, exit 2, nothing run ------------------------------------------------------------------------

def _one_line(r, *words):
    assert r.exit_code == 2, r.output
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    for w in words:
        assert w in lines[0], lines[0]
    assert r.stdout == ""


def test_missing_model(gguf_file, tmp_path):
    _one_line(probe(tmp_path / "nope.gguf", "--text", gguf_file / "text.txt"), "no such file")


def test_pickled_model_is_refused_not_loaded(gguf_file, tmp_path):
    p = tmp_path / "model.pt"
    torch.save({"weight": torch.zeros(4, 4)}, p)
    _one_line(probe(p, "--text", gguf_file / "text.txt"), "pickle", "never unpickles")
    tok = tmp_path / "ids.npy"
    np.save(tok, np.array([1, 2, "x"], dtype=object), allow_pickle=True)
    _one_line(probe(gguf_file / "tiny.gguf", "--tokens", tok, "--seq-len", 16, "--batch-size", 1), "--tokens",
              "not a .npy array of token ids")


def test_wrong_output_suffix(gguf_file, tmp_path):
    _one_line(probe(gguf_file / "tiny.gguf", "--text", gguf_file / "text.txt", "-o", tmp_path / "out.txt"),
              "--output", ".json", ".csv")
    assert not (tmp_path / "out.txt").exists()


def test_token_count_not_a_multiple_of_16(gguf_file):
    _one_line(probe(gguf_file / "tiny.gguf", "--text", gguf_file / "text.txt", "--seq-len", 10, "--batch-size", 3),
              "30 tokens per linear call", "multiple of 16")


def test_unknown_without(gguf_file):
    _one_line(probe(gguf_file / "tiny.gguf", "--text", gguf_file / "text.txt", "--seq-len", 16, "--without", "xyz"),
              "--without xyz", "sr, rht, 2d")
    # bf16_layers exists in the recipe but --keep-bf16 0,0 keeps no block
    _one_line(probe(gguf_file / "tiny.gguf", "--text", gguf_file / "text.txt", "--seq-len", 16, "--without",
                    "bf16_layers"), "--keep-bf16 keeps no block")


@pytest.mark.parametrize("case", ["no_source", "both_sources", "short_text", "not_utf8", "no_layer", "float_ids",
                                  "long_seq", "bad_keep", "bad_recipe"])
def test_other_bad_inputs_are_one_line(gguf_file, tmp_path, case):
    m, txt = gguf_file / "tiny.gguf", gguf_file / "text.txt"
    args = {"no_source": [m],
            "both_sources": [m, "--text", txt, "--tokens", txt],
            "short_text": [m, "--text", tmp_path / "s.txt", "--seq-len", 16],
            "not_utf8": [m, "--text", tmp_path / "b.txt"],
            "no_layer": [m, "--text", txt, "--seq-len", 16, "--layers", "nothing.*"],
            "float_ids": [m, "--tokens", tmp_path / "f.npy", "--seq-len", 16],
            "long_seq": [m, "--text", txt, "--seq-len", 256],
            "bad_keep": [m, "--text", txt, "--seq-len", 16, "--keep-bf16", "1"],
            "bad_recipe": [m, "--text", txt, "--seq-len", 16, "--recipe", "nvfp9"]}[case]
    (tmp_path / "s.txt").write_text("abc")
    (tmp_path / "b.txt").write_bytes(b"abc \xff\xfe")
    np.save(tmp_path / "f.npy", np.ones(100))
    _one_line(probe(*args))
