"""GGUF loader (studies/llm/smollm2.py) on files that would otherwise load as a different model without a word."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
pytest.importorskip("torch")
pytest.importorskip("tokenizers")

from studies.llm.smollm2 import GGUFError, read_gguf  # noqa: E402
from tests.test_llm_gguf import TOKENS, D, write_tiny  # noqa: E402


def _refused(p: Path) -> str:
    with pytest.raises(GGUFError) as ei:
        read_gguf(p)
    msg = str(ei.value)
    assert "\n" not in msg and str(p) in msg
    return msg


def test_big_endian_file_refused_not_loaded_as_garbage(tmp_path):
    """gguf.quants.dequantize reads little-endian bytes: a big-endian file used to load as NaN / 1e37 weights."""
    p = tmp_path / "be.gguf"
    write_tiny(p, q_type=gguf.GGMLQuantizationType.Q4_0)  # Q4_0 / Q8_0 / F32: types the converter swaps
    r = subprocess.run([sys.executable, "-m", "gguf.scripts.gguf_convert_endian", str(p), "big"], input="YES\n",
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert gguf.GGUFReader(str(p)).endianess == gguf.GGUFEndian.BIG
    assert "big-endian" in _refused(p)


def test_untied_output_head_refused_not_ignored(tmp_path, monkeypatch):
    """A llama GGUF with its own ``output.weight`` head used to load with the head silently tied to the embedding."""
    add = gguf.GGUFWriter.add_tensor

    def with_head(self, name, arr, *a, **k):
        add(self, name, arr, *a, **k)
        if name == "output_norm.weight":
            add(self, "output.weight", np.zeros((len(TOKENS), D), np.float32))

    monkeypatch.setattr(gguf.GGUFWriter, "add_tensor", with_head)
    p = tmp_path / "untied.gguf"
    write_tiny(p)
    monkeypatch.undo()
    assert "tensor output.weight" in _refused(p)


@pytest.mark.parametrize(("key", "value", "kind"), [
    ("llama.attention.head_count", 0, "uint32"),  # used to raise ZeroDivisionError
    ("llama.block_count", -1, "int32"),  # used to load a model of no layers, every blk.* tensor ignored
    ("llama.block_count", "two", "string"),  # used to raise a bare ValueError (a traceback in capture_llm)
])
def test_bad_metadata_one_line(tmp_path, monkeypatch, key, value, kind):
    setters = {"llama.attention.head_count": "add_head_count", "llama.block_count": "add_block_count",
               "llama.attention.head_count_kv": "add_head_count_kv"}
    monkeypatch.setattr(gguf.GGUFWriter, setters[key],
                        lambda self, _n: getattr(self, f"add_{kind}")(key, value))
    p = tmp_path / "bad.gguf"
    write_tiny(p)
    monkeypatch.undo()
    assert key in _refused(p)


def test_capture_max_tokens_true_is_refused(tmp_path):
    """max_tokens=True passed the int check and meant 1 token: a bool is not a count."""
    import pytest

    torch = pytest.importorskip("torch")
    from fpsim.capture import Capture

    with pytest.raises(ValueError, match="max_tokens"):
        Capture(torch.nn.Linear(4, 4), tmp_path / "c.safetensors", max_tokens=True)
