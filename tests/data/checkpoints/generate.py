"""Make the quantized checkpoints tests/test_io_checkpoints.py reads, through each producer's own save path.

Run in a separate virtual environment (the libraries are not fpsim dependencies and must not change the
installed torch/numpy/numba/triton)::

    python -m venv --system-site-packages /tmp/ckpt/venv && . /tmp/ckpt/venv/bin/activate
    pip freeze | grep -iE '^(torch|numpy|numba|triton)==' > /tmp/ckpt/constraints.txt
    pip install -c /tmp/ckpt/constraints.txt "llmcompressor==0.14.0.1" transformers==5.17.0 "nvidia-modelopt==0.47.0"
    pip install --no-deps "compressed-tensors==0.20.1"
    python tests/data/checkpoints/generate.py tests/data/checkpoints

Versions used for the committed files (2026-12-06, CPU only): torch 2.13.0+cpu, transformers 5.17.0,
compressed-tensors 0.20.1 with llmcompressor 0.14.0.1 (which pins compressed-tensors 0.19.0; 0.20.1 was
installed over it, as the issue's user had), nvidia-modelopt 0.47.0, torchao 0.18.0.

It writes, from one tiny Llama (hidden 32, intermediate 64, 2 layers, vocabulary 64, seed 0, BF16):

* ``reference/`` -- the BF16 original (``save_pretrained``), what ``--reference`` compares against;
* ``ct_nvfp4/`` -- llmcompressor ``oneshot`` with the ``NVFP4`` preset scheme (weights and activations),
  saved compressed (``nvfp4-pack-quantized``), sharded into two files;
* ``modelopt_nvfp4/`` -- ModelOpt ``mtq.quantize`` with ``NVFP4_DEFAULT_CFG`` and ``export_hf_checkpoint``;
* ``torchao_nvfp4/`` -- ``from_pretrained(..., quantization_config=TorchAoConfig(NVFP4WeightOnlyConfig()))`` and
  ``save_pretrained`` (torchao 0.18.0, already installed beside torch: its safetensors flattening of
  ``NVFP4Tensor``, block scales swizzled);
* ``decoded/ct_nvfp4.safetensors``, ``decoded/modelopt_nvfp4.safetensors`` -- every quantized weight of the two
  checkpoints decoded by its producer's own code (compressed-tensors ``NVFP4PackedCompressor.decompress``,
  ModelOpt ``NVFP4QTensor.dequantize``, torchao ``NVFP4Tensor.dequantize``), what fpsim's decode is tested
  against bit for bit.

* ``ct_mxfp4``, ``ct_mxfp8``, ``ct_fp8`` -- llmcompressor presets MXFP4A16, MXFP8A16, FP8_DYNAMIC (weight-only
  formats, FP8 with per-row BF16 scales); ``modelopt_fp8``, ``modelopt_mxfp8`` -- ModelOpt FP8_DEFAULT_CFG,
  MXFP8_DEFAULT_CFG; each with its decoded weights in ``decoded/``.

Calibration for the NVFP4 and ModelOpt runs: 4 sequences of 16 random token ids (seed 1) through the model.
Reruns write identical tensor bytes; torchao's ``__metadata__`` lists its keys in a varying order.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import torch

HIDDEN, INTER, LAYERS, VOCAB = 32, 64, 2, 64


def tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=HIDDEN, intermediate_size=INTER, num_hidden_layers=LAYERS,
                      num_attention_heads=4, num_key_value_heads=2, vocab_size=VOCAB,
                      max_position_embeddings=64, tie_word_embeddings=True, torch_dtype="bfloat16")
    model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    # A few outliers so the checkpoints show saturated and small-scale blocks, as real weights do.
    with torch.no_grad():
        w = model.model.layers[0].mlp.down_proj.weight
        w[0, 0] = 40 * w.abs().max()
        model.model.layers[1].self_attn.q_proj.weight[3, :16] = 0  # an all-zero block
    return model


def calibration():
    g = torch.Generator().manual_seed(1)
    return [torch.randint(0, VOCAB, (1, 16), generator=g) for _ in range(4)]


def word_tokenizer():
    """A tokenizer of VOCAB words "0".."63": oneshot insists on a processor when given a dataset; the
    dataset here is already token ids, so it is never used to tokenize."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast

    vocab = {str(i): i for i in range(VOCAB)}
    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer(WordLevel(vocab, unk_token="0")),
                                   pad_token="0")


def save_reference(out: Path):
    tiny_llama().save_pretrained(out / "reference")


def load_reference(out: Path):
    """The BF16 original as the user would load it (the producers read its config from the model)."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(out / "reference", dtype=torch.bfloat16)


def save_compressed_tensors(out: Path):
    from datasets import Dataset
    from llmcompressor import oneshot
    from llmcompressor.modifiers.quantization import QuantizationModifier

    model = load_reference(out)
    ds = Dataset.from_dict({"input_ids": [c[0].tolist() for c in calibration()]})
    recipe = QuantizationModifier(targets="Linear", scheme="NVFP4", ignore=["lm_head"])
    oneshot(model=model, dataset=ds, recipe=recipe, num_calibration_samples=4, max_seq_length=16,
            pipeline="basic", processor=word_tokenizer())
    model.save_pretrained(out / "ct_nvfp4", save_compressed=True, max_shard_size="12KB")


def save_modelopt(out: Path):
    import modelopt.torch.quantization as mtq
    from modelopt.torch.export import export_hf_checkpoint

    model = load_reference(out)

    def loop(m):
        for ids in calibration():
            m(ids)

    mtq.quantize(model, mtq.NVFP4_DEFAULT_CFG, loop)
    export_hf_checkpoint(model, export_dir=str(out / "modelopt_nvfp4"))


def save_torchao(out: Path):
    """torchao's NVFP4 weight-only quantization through transformers, and each weight as torchao decodes it."""
    from safetensors.torch import save_file
    from torchao.prototype.mx_formats import NVFP4WeightOnlyConfig
    from transformers import AutoModelForCausalLM, TorchAoConfig

    model = AutoModelForCausalLM.from_pretrained(out / "reference", dtype=torch.bfloat16,
                                                 quantization_config=TorchAoConfig(NVFP4WeightOnlyConfig()))
    model.save_pretrained(out / "torchao_nvfp4", safe_serialization=True)
    (out / "decoded").mkdir(exist_ok=True)
    dec = {name: p.dequantize(torch.bfloat16).contiguous() for name, p in model.named_parameters()
           if type(p).__name__ == "NVFP4Tensor" or type(getattr(p, "data", None)).__name__ == "NVFP4Tensor"}
    assert len(dec) == 14, sorted(dec)
    save_file(dec, out / "decoded" / "torchao_nvfp4.safetensors")


#: Other formats the producers write (weight-only where the scheme allows, so no calibration data is needed).
CT_OTHER = {"ct_mxfp4": "MXFP4A16", "ct_mxfp8": "MXFP8A16", "ct_fp8": "FP8_DYNAMIC"}
MODELOPT_OTHER = {"modelopt_fp8": "FP8_DEFAULT_CFG", "modelopt_mxfp8": "MXFP8_DEFAULT_CFG"}


def save_other_formats(out: Path):
    """MXFP4, MXFP8 and FP8 checkpoints of both libraries, and each weight as the library decodes it."""
    import modelopt.torch.quantization as mtq
    from compressed_tensors.compressors.mxfp4.base import MXFP4PackedCompressor
    from compressed_tensors.compressors.mxfp8.base import MXFP8QuantizationCompressor
    from compressed_tensors.compressors.naive_quantized.base import FloatQuantizationCompressor
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme
    from llmcompressor import oneshot
    from llmcompressor.modifiers.quantization import QuantizationModifier
    from modelopt.torch.export import export_hf_checkpoint
    from modelopt.torch.quantization.qtensor.fp8_tensor import FP8QTensor
    from modelopt.torch.quantization.qtensor.mxfp8_tensor import MXFP8QTensor
    from safetensors.torch import save_file

    compressors = {"mxfp4-pack-quantized": MXFP4PackedCompressor, "mxfp8-quantized": MXFP8QuantizationCompressor,
                   "float-quantized": FloatQuantizationCompressor}
    for name, scheme_name in CT_OTHER.items():
        model = load_reference(out)
        oneshot(model=model, recipe=QuantizationModifier(targets="Linear", scheme=scheme_name, ignore=["lm_head"]),
                processor=word_tokenizer())
        model.save_pretrained(out / name, save_compressed=True)
        cfg = json.loads((out / name / "config.json").read_text())["quantization_config"]
        scheme = QuantizationScheme(targets=["Linear"],
                                    weights=QuantizationArgs(**cfg["config_groups"]["group_0"]["weights"]))
        t = _tensors(out / name)
        code_leaf = "weight_packed" if name == "ct_mxfp4" else "weight"
        dec = {}
        for key in [k for k in t if k.endswith(".weight_scale")]:
            p = key[: -len("weight_scale")]
            sd = {leaf: t[p + leaf] for leaf in (code_leaf, "weight_scale")}
            w = compressors[cfg["format"]].decompress(sd, scheme)["weight"]
            dec[p + "weight"] = w.to(torch.bfloat16).contiguous()
        save_file(dec, out / "decoded" / f"{name}.safetensors")
    for name, cfg_name in MODELOPT_OTHER.items():
        model = load_reference(out)

        def loop(m):
            for ids in calibration():
                m(ids)

        mtq.quantize(model, getattr(mtq, cfg_name), loop)
        export_hf_checkpoint(model, export_dir=str(out / name))
        t = _tensors(out / name)
        qt = MXFP8QTensor if "mxfp8" in name else FP8QTensor
        dec = {}
        for key in [k for k in t if k.endswith(".weight_scale")]:
            p = key[: -len("weight_scale")]
            w = t[p + "weight"]
            dec[p + "weight"] = qt(w.shape, torch.bfloat16, w).dequantize(
                dtype=torch.bfloat16, scale=t[key]).contiguous()
        save_file(dec, out / "decoded" / f"{name}.safetensors")


def _tensors(folder: Path) -> dict:
    from safetensors.torch import load_file

    out = {}
    for f in sorted(folder.glob("*.safetensors")):
        out.update(load_file(f))
    return out


def save_decoded(out: Path):
    """Each quantized weight as its producer's own dequantize gives it (the test's independent reference)."""
    from compressed_tensors.compressors.nvfp4.base import NVFP4PackedCompressor
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme
    from modelopt.torch.quantization.qtensor.nvfp4_tensor import NVFP4QTensor
    from safetensors.torch import save_file

    (out / "decoded").mkdir(exist_ok=True)
    cfg = json.loads((out / "ct_nvfp4" / "config.json").read_text())["quantization_config"]
    scheme = QuantizationScheme(targets=["Linear"],
                                weights=QuantizationArgs(**cfg["config_groups"]["group_0"]["weights"]))
    t = _tensors(out / "ct_nvfp4")
    dec = {}
    for name in [n for n in t if n.endswith(".weight_packed")]:
        p = name[: -len("weight_packed")]
        sd = {k[len(p):]: v for k, v in t.items() if k.startswith(p)}
        dec[p + "weight"] = NVFP4PackedCompressor.decompress(sd, scheme)["weight"].contiguous()
    save_file(dec, out / "decoded" / "ct_nvfp4.safetensors")
    t = _tensors(out / "modelopt_nvfp4")
    dec = {}
    for name in [n for n in t if n.endswith(".weight_scale_2")]:
        p = name[: -len("weight_scale_2")]
        packed = t[p + "weight"]
        q = NVFP4QTensor(torch.Size([packed.shape[0], 2 * packed.shape[1]]), torch.bfloat16, packed)
        dec[p + "weight"] = q.dequantize(dtype=torch.bfloat16, scale=t[p + "weight_scale"],
                                         double_scale=t[p + "weight_scale_2"], block_sizes={-1: 16}).contiguous()
    save_file(dec, out / "decoded" / "modelopt_nvfp4.safetensors")


def main(out: str):
    root = Path(out)
    for name in ("reference", "ct_nvfp4", "modelopt_nvfp4", "torchao_nvfp4", "decoded", *CT_OTHER, *MODELOPT_OTHER):
        shutil.rmtree(root / name, ignore_errors=True)
    save_reference(root)
    save_compressed_tensors(root)
    save_modelopt(root)
    save_decoded(root)
    save_torchao(root)
    save_other_formats(root)
    for d in sorted(p for p in root.iterdir() if p.is_dir()):
        # Only what a reader of the checkpoint needs: the tensors and the quantization metadata.
        for f in d.iterdir():
            if f.suffix not in (".safetensors", ".json") or f.name in ("generation_config.json", "tokenizer.json",
                                                                          "tokenizer_config.json"):
                f.unlink()
        print(d.name, sorted(f.name for f in d.iterdir()))
    print(json.dumps({"torch": torch.__version__}))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else str(Path(__file__).parent))
