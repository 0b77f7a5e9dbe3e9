"""Write the seed corpora of the readers' fuzz targets: ``python -m tests.fuzz.make_corpus`` (deterministic, seed 0).

Per reader, small valid files (the dtypes, ranks and layouts the reader handles) and near-valid ones (truncated,
a header size or offset off by one, trailing bytes), each under 8 KB, into ``tests/fuzz/corpus/<reader>/``; every
seed is read by its target before it is kept (a seed that is a finding would stop the fuzzer at once).
"""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import tempfile
import zipfile
from pathlib import Path

import ml_dtypes
import numpy as np

from .harnesses import CORPUS, READERS, SEPARATOR

RNG = np.random.default_rng(0)


def _f32(*shape) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def _safetensors_bytes(tensors: dict, metadata: dict | None = None) -> bytes:
    from fpsim.io import write_safetensors

    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "x.safetensors"
        write_safetensors(p, tensors, metadata)
        return p.read_bytes()


def _near(valid: bytes) -> list[bytes]:
    """Near-valid variants: truncated in the data, cut in the header, trailing bytes, the first byte changed."""
    return [valid[: len(valid) - 3], valid[: min(len(valid), 12)], valid + b"\x00\x01", bytes([valid[0] ^ 1]) +
            valid[1:]]


def safetensors() -> list[bytes]:
    valid = [
        _safetensors_bytes({"w": _f32(4, 8), "b": _f32(8)}),
        _safetensors_bytes({"x": _f32(2, 3, 4).astype(ml_dtypes.bfloat16), "s": np.float32(2.5).reshape(())},
                           {"format": "pt"}),
        _safetensors_bytes({"h": _f32(3, 5).astype(np.float16), "e": np.zeros((0, 4), np.float32),
                            "i": np.arange(6, dtype=np.int8).reshape(2, 3)}),
        _safetensors_bytes({"f8": _f32(4, 16).astype(ml_dtypes.float8_e4m3fn),
                            "f4": _f32(2, 32).astype(ml_dtypes.float4_e2m1fn),
                            "e5": _f32(8).astype(ml_dtypes.float8_e5m2)}),
    ]
    return valid + _near(valid[0]) + _near(valid[3])


def npz() -> list[bytes]:
    out = []
    for compressed in (False, True):
        buf = io.BytesIO()
        (np.savez_compressed if compressed else np.savez)(buf, w=_f32(4, 8), b=_f32(8).astype(np.float16),
                                                         f=np.asfortranarray(_f32(3, 5)), s=np.float64(1.5))
        out.append(buf.getvalue())
    buf = io.BytesIO()
    np.savez(buf, bf=_f32(2, 4).astype(ml_dtypes.bfloat16), i=np.arange(5, dtype=np.int32))
    out.append(buf.getvalue())
    buf = io.BytesIO()  # a member that is not an array, and a pickle-needing object array (refused, never loaded)
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("notes.txt", b"not an array")
        z.writestr("o.npy", b"\x93NUMPY\x01\x00v\x00{'descr': '|O', 'fortran_order': False, 'shape': (1,), }"
                   + b" " * 57 + b"\n" + b"\x80\x04N.")
    out.append(buf.getvalue())
    return out + _near(out[0]) + _near(out[1])


def _npy(a: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, a)
    return buf.getvalue()


def npy() -> list[bytes]:
    valid = [_npy(_f32(4, 8)), _npy(np.asfortranarray(_f32(3, 5, 2))), _npy(_f32(6).astype(np.float16)),
             _npy(np.float32(3.0)), _npy(np.zeros((0, 3), np.float32)), _npy(_f32(2, 4).astype(ml_dtypes.bfloat16))]
    return valid + _near(valid[0]) + _near(valid[1])


def _torch_bytes(obj, legacy: bool = False) -> bytes:
    import torch

    buf = io.BytesIO()
    torch.save(obj, buf, _use_new_zipfile_serialization=not legacy)
    return buf.getvalue()


def _torch_objects():
    import torch

    g = torch.Generator().manual_seed(0)
    t = torch.randn(4, 8, generator=g)
    return [
        {"w": t, "b": torch.randn(8, generator=g)},
        {"state_dict": {"fc.weight": t.to(torch.bfloat16), "fc.bias": torch.zeros(3, dtype=torch.float16)},
         "step": 7, "lr": [0.1, torch.ones(2)]},
        {"t": t.t(), "view": t[1:3], "f8": t.to(torch.float8_e4m3fn), "i": torch.arange(5)},
        t,
    ]


def pt_zip() -> list[bytes]:
    valid = [_torch_bytes(o) for o in _torch_objects()]
    return valid + _near(valid[0]) + _near(valid[1])


def pt_legacy() -> list[bytes]:
    valid = [_torch_bytes(o, legacy=True) for o in _torch_objects()]
    return valid + _near(valid[0]) + _near(valid[1])


class Float8Tensor:
    """Stands for TE's quantized tensor in a dump: pickled as a reference to this class, never unpickled."""

    def __init__(self, data):
        self.data = data


def te_dump() -> list[bytes]:
    import torch

    g = torch.Generator().manual_seed(1)
    hp = torch.randn(8, 16, generator=g).to(torch.bfloat16)
    valid = [_torch_bytes({"high_precision": hp}),
             _torch_bytes({"high_precision": hp, "quantized": Float8Tensor(b"\x01\x02")}),
             _torch_bytes({"high_precision": hp.float()}, legacy=True)]
    return valid + _near(valid[1])


def gguf() -> list[bytes]:
    import gguf as g

    def write(q_type, vocab: int = 6) -> bytes:
        d, ff, tokens = 32, 32, ["<s>", "</s>", "a", "b", "ab", "c"][:vocab]
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "m.gguf"
            w = g.GGUFWriter(str(path), "llama")
            w.add_block_count(1)
            w.add_context_length(16)
            w.add_embedding_length(d)
            w.add_feed_forward_length(ff)
            w.add_head_count(2)
            w.add_head_count_kv(1)
            w.add_rope_freq_base(10000.0)
            w.add_layer_norm_rms_eps(1e-5)
            w.add_tokenizer_model("gpt2")
            w.add_token_list(tokens)
            w.add_token_types([3, 3] + [1] * (len(tokens) - 2))
            w.add_token_merges(["a b"])
            w.add_bos_token_id(0)
            w.add_eos_token_id(1)

            def add(name, shape, qt):
                arr = _f32(*shape)
                if qt == g.GGMLQuantizationType.F32:
                    w.add_tensor(name, arr)
                else:
                    w.add_tensor(name, g.quants.quantize(arr, qt), raw_dtype=qt)

            f32 = g.GGMLQuantizationType.F32
            add("token_embd.weight", (len(tokens), d), g.GGMLQuantizationType.Q8_0)
            add("blk.0.attn_norm.weight", (d,), f32)
            add("blk.0.ffn_norm.weight", (d,), f32)
            kv = d // 2
            for nm, shp in (("attn_q", (d, d)), ("attn_k", (kv, d)), ("attn_v", (kv, d)), ("attn_output", (d, d)),
                            ("ffn_gate", (ff, d)), ("ffn_up", (ff, d)), ("ffn_down", (d, ff))):
                add(f"blk.0.{nm}.weight", shp, q_type)
            add("output_norm.weight", (d,), f32)
            w.write_header_to_file()
            w.write_kv_data_to_file()
            w.write_tensors_to_file()
            w.close()
            return path.read_bytes()

    valid = [write(g.GGMLQuantizationType.Q4_0), write(g.GGMLQuantizationType.Q4_1, vocab=4)]
    return valid + _near(valid[0])


def _e4m3(x) -> np.ndarray:
    return np.asarray(x, np.float32).astype(ml_dtypes.float8_e4m3fn)


def _packed(rows: int, cols: int) -> np.ndarray:
    return RNG.integers(0, 256, (rows, cols // 2), dtype=np.uint8)


def _checkpoints() -> list[tuple[dict, dict | None, dict, dict | None]]:
    """(config.json, hf_quant_config.json, tensors, safetensors metadata) of each producer's layout, 4 × 32."""
    r, c = 4, 32
    norm = {"model.norm.weight": _f32(c).astype(ml_dtypes.bfloat16)}
    p = "model.layers.0.mlp.up_proj."
    ct = {"quantization_config": {"quant_method": "compressed-tensors"}, "torch_dtype": "bfloat16"}
    mo = {"quantization_config": {"quant_method": "modelopt"}, "torch_dtype": "bfloat16"}
    hfq = {"quantization": {"quant_algo": "NVFP4", "group_size": 16}}
    swz = json.dumps({"_type": "NVFP4Tensor", "_data": {"is_swizzled_scales": False,
                                                        "orig_dtype": {"_type": "torch.dtype", "_data": "bfloat16"}}})
    return [
        (ct, None, {p + "weight_packed": _packed(r, c), p + "weight_scale": _e4m3(RNG.uniform(1, 4, (r, 2))),
                    p + "weight_global_scale": np.array([448 * 6 / 3.0], np.float32),
                    p + "input_global_scale": np.array([100.0], np.float32), **norm}, None),
        (ct, None, {p + "weight_packed": _packed(r, c), p + "weight_scale": RNG.integers(120, 130, (r, 1), np.uint8),
                    **norm}, None),
        (ct, None, {p + "weight": _e4m3(_f32(r, c)), p + "weight_scale": RNG.integers(120, 130, (r, 1), np.uint8),
                    **norm}, None),
        (mo, hfq, {p + "weight": _packed(r, c), p + "weight_scale": _e4m3(RNG.uniform(1, 4, (r, 2))),
                   p + "weight_scale_2": np.float32(0.01).reshape(()), p + "input_scale": np.float32(0.1).reshape(()),
                   **norm}, None),
        (mo, hfq, {p + "weight": _e4m3(_f32(r, c)), p + "weight_scale": np.float32(0.5).reshape(()),
                   p + "k_scale": np.float32(1.0).reshape(()), **norm}, None),
        ({"dtype": "bfloat16"}, None, {p + "_weight_qdata": _packed(r, c),
                                       p + "_weight_scale": _e4m3(RNG.uniform(1, 4, (r, 2))),
                                       p + "_weight_per_tensor_scale": np.float32(0.02).reshape(()), **norm},
         {p + "weight": swz}),
    ]


def checkpoint() -> list[bytes]:
    out = []
    for config, hfq, tensors, meta in _checkpoints():
        parts = [json.dumps(config).encode()]
        if hfq is not None:
            parts.append(json.dumps(hfq).encode())
        else:
            parts.append(b"{}")
        parts.append(_safetensors_bytes(tensors, meta))
        out.append(SEPARATOR.join(parts))
    out.append(out[0].rsplit(SEPARATOR, 1)[-1])  # no metadata files: the layout alone
    return out + [out[0][:-5], out[3][:-40]]


def quantized() -> list[bytes]:
    import fpsim

    out = []
    x = _f32(4, 32)
    for scheme, suffix in (("nvfp4", ".npz"), ("mxfp8", ".safetensors"), ("mxfp4", ".npz"), ("nvfp4", ".safetensors")):
        qt = fpsim.quantize(x, scheme)
        with tempfile.TemporaryDirectory() as d:
            p = Path(d) / f"q{suffix}"
            fpsim.save_quantized(qt, p)
            out.append(p.read_bytes())
    return out + _near(out[0]) + _near(out[1])


_MAKERS = {"safetensors": safetensors, "npz": npz, "npy": npy, "pt_zip": pt_zip, "pt_legacy": pt_legacy,
           "te_dump": te_dump, "gguf": gguf, "checkpoint": checkpoint, "quantized": quantized}


def main() -> None:
    import warnings

    warnings.simplefilter("ignore")
    assert set(_MAKERS) == set(READERS)
    total = 0
    for name, make in _MAKERS.items():
        d = CORPUS / name
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)
        for data in make():
            READERS[name](data)  # a seed that is a finding raises here
            (d / hashlib.sha1(data).hexdigest()[:16]).write_bytes(data)
            total += len(data)
        print(f"{name}: {len(list(d.iterdir()))} seeds, {sum(f.stat().st_size for f in d.iterdir())} bytes")
    print(f"total {total} bytes")


if __name__ == "__main__":
    main()
