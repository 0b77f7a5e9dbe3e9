"""Generate tests/data/producers/<producer>.npz: NVFP4 bytes and decoded values produced by the libraries themselves.

Run ``python tests/data/producers/generate.py`` with the libraries installed (``pip install 'fpsim[producers]'``;
versions used for the committed files: torchao 0.18.0, compressed-tensors 0.20.1, nvidia-modelopt 0.47.0, torch
2.13.0+cpu).  Each file holds, per edge tensor of :func:`edge_tensors` and input dtype (float32, bfloat16):
``<case>.<dtype>.input`` (float32; for bfloat16 the bf16 values widened), ``.codes`` (uint8, one E2M1 code per
element, from the library's packed bytes, low nibble first), ``.scales`` (uint8 E4M3 bytes [rows, blocks]),
``.global`` (float32: the global scale the library stores) and ``.decoded`` (float32: the library's own
dequantization to float32).  Nothing here calls fpsim: the bytes are the libraries'.
tests/test_producers.py compares fpsim's conventions with these files on every backend; tests/test_producers_live.py
repeats the comparison against the installed libraries when they are present.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent


def edge_tensors() -> dict[str, np.ndarray]:
    """The edge tensors (float32, [rows, 16·k]): zero blocks, −0, subnormal and zero E4M3 scales, tensors so small
    that 2688/amax overflows, outliers, E2M1 ties, a random tensor."""
    z = np.zeros
    t: dict[str, np.ndarray] = {}
    t["zero"] = z((2, 32), np.float32)
    t["negative_zero"] = np.full((2, 32), -0.0, np.float32)
    a = z((2, 48), np.float32)
    a[0, :16] = np.linspace(-5, 7, 16)
    a[0, 32:48] = -0.0
    a[1, 16:20] = [-0.0, 0.0, -1e-3, 2.0]
    t["zero_blocks"] = a
    b = z((1, 64), np.float32)
    b[0, 0] = 2688.0
    b[0, 16:19] = [6 * 2.0**-8, 2.0**-8, -3 * 2.0**-8]  # subnormal E4M3 scale
    b[0, 32] = 6 * 2.0**-10  # scale tie at half the smallest subnormal
    b[0, 48:50] = [2.688e-4, -1e-4]  # zero E4M3 scale
    t["small_scales"] = b
    c = z((1, 32), np.float32)
    c[0, 0], c[0, 1], c[0, 17] = 2.0**-149, -2.0**-149, 2.0**-140
    t["tiny_subnormal"] = c  # 2688/amax overflows float32
    d = z((1, 32), np.float32)
    d[0, :4] = [1e-36, -3e-37, 5e-38, -1e-39]
    t["tiny_normal"] = d  # 2688/amax overflows float32 (amax above FLT_MIN)
    e = z((1, 32), np.float32)
    e[0, :12] = [6.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.25, -2.5, -5.0, -0.1]
    e[0, 16:24] = [51.0, 0.3487723469734192, 57.0, -1.0, 3.0, 100.0, -0.75, 1e-3]
    t["ties"] = e
    rng = np.random.default_rng(47)
    r = rng.standard_normal((4, 64)).astype(np.float32)
    r[0, 3], r[2, 40], r[3, 7] = 40.0, -1e3, 3e4  # outliers
    r[1, 16:32] *= 1e-4
    t["outliers"] = r
    t["random"] = (rng.standard_normal((8, 64)) * 0.02).astype(np.float32)
    return t


def _codes(packed: np.ndarray) -> np.ndarray:
    p = np.asarray(packed, np.uint8)
    out = np.empty(p.shape[:-1] + (p.shape[-1] * 2,), np.uint8)
    out[..., 0::2] = p & 0xF
    out[..., 1::2] = p >> 4
    return out


def _e4m3_bytes(s) -> np.ndarray:
    import torch

    return s.contiguous().view(torch.uint8).cpu().numpy().copy()


def run_torchao(x):
    """torchao.prototype.mx_formats.nvfp4_tensor: NVFP4Tensor.to_nvfp4 with per_tensor_scale =
    per_tensor_amax_to_scale(max |x|), and NVFP4Tensor.dequantize(float32)."""
    import torch
    from torchao.prototype.mx_formats.nvfp4_tensor import NVFP4Tensor, per_tensor_amax_to_scale

    pts = per_tensor_amax_to_scale(torch.max(torch.abs(x)))
    q = NVFP4Tensor.to_nvfp4(x, 16, per_tensor_scale=pts)
    dec = q.dequantize(torch.float32)
    return _codes(q.qdata.view(torch.uint8).numpy()), _e4m3_bytes(q.scale), pts.float().numpy(), dec.numpy()


def run_compressed_tensors(x, absmax=None):
    """compressed-tensors: the NVFP4 preset's weight args; generate_gparam(min, max) of the whole tensor (in x's
    dtype, as the observers pass it), calculate_qparams on the per-group min/max, NVFP4PackedCompressor.compress
    and .decompress (CPU path).  ``absmax``: the absmax a fused group shares (llmcompressor 0.14's
    Observer.get_global_scale passes generate_gparam(-absmax, absmax) over the fused layers' statistics)."""
    import torch
    from compressed_tensors.compressors.nvfp4.base import NVFP4PackedCompressor
    from compressed_tensors.quantization import preset_name_to_scheme
    from compressed_tensors.quantization.utils.helpers import calculate_qparams, generate_gparam

    scheme = preset_name_to_scheme("NVFP4", ["Linear"])
    args = scheme.weights
    if absmax is None:
        g = generate_gparam(torch.min(x).reshape(1), torch.max(x).reshape(1))
    else:
        m = torch.tensor(absmax, dtype=x.dtype).reshape(1)
        g = generate_gparam(-m, m)
    R, C = x.shape
    xg = x.reshape(R, C // 16, 16)
    scale, _ = calculate_qparams(torch.amin(xg, dim=-1), torch.amax(xg, dim=-1), args, global_scale=g)
    sd = {"weight": x, "weight_scale": scale, "weight_global_scale": g}
    comp = NVFP4PackedCompressor.compress(sd, scheme)
    packed, sbytes = comp["weight_packed"], comp["weight_scale"]
    back = NVFP4PackedCompressor.decompress({"weight_packed": packed, "weight_scale": sbytes,
                                             "weight_global_scale": g}, scheme)
    return (_codes(packed.numpy()), _e4m3_bytes(sbytes), g.float().reshape(()).numpy(),
            back["weight"].float().numpy())


def run_modelopt(x):
    """modelopt.torch.quantization.qtensor.nvfp4_tensor: NVFP4QTensor.quantize(x, 16) (dynamic path) and
    NVFP4QTensor.dequantize(float32, scale=, double_scale=)."""
    import torch
    from modelopt.torch.quantization.qtensor.nvfp4_tensor import NVFP4QTensor

    q, s, s2 = NVFP4QTensor.quantize(x.clone(), 16)
    dec = q.dequantize(torch.float32, scale=s, double_scale=s2, block_sizes={-1: 16})
    return _codes(q._quantized_data.numpy()), _e4m3_bytes(s), s2.float().reshape(()).numpy(), dec.numpy()


RUNNERS = {"torchao": run_torchao, "compressed-tensors": run_compressed_tensors, "modelopt": run_modelopt}


def versions() -> dict[str, str]:
    from importlib.metadata import version

    return {p: version(p) for p in ("torch", "torchao", "compressed-tensors", "nvidia-modelopt")}


def produce(producer: str, x32: np.ndarray, dtype: str, **kw):
    """(codes, scales, global, decoded) of the library on the float32 tensor x32 given as ``dtype``."""
    import torch

    t = torch.from_numpy(np.ascontiguousarray(x32))
    if dtype == "bfloat16":
        t = t.to(torch.bfloat16)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return RUNNERS[producer](t, **kw)


def case_arrays(key: str, xin: np.ndarray, codes, scales, g, dec) -> dict[str, np.ndarray]:
    """One case's members of a golden file: the input as the producer saw it, its codes, scales (one row per input
    row), stored global scale and decoded values, each under ``key.``."""
    return {f"{key}.input": xin, f"{key}.codes": codes, f"{key}.scales": scales.reshape(xin.shape[0], -1),
            f"{key}.global": np.asarray(g, np.float32).reshape(()), f"{key}.decoded": np.asarray(dec, np.float32)}

def main(out: Path = HERE) -> None:
    import torch

    ver = versions()
    for producer in RUNNERS:
        arrays: dict[str, np.ndarray] = {}
        for name, x in edge_tensors().items():
            for dtype in ("float32", "bfloat16"):
                codes, scales, g, dec = produce(producer, x, dtype)
                xin = torch.from_numpy(x).to(getattr(torch, dtype)).float().numpy()
                arrays.update(case_arrays(f"{name}.{dtype}", xin, codes, scales, g, dec))
        arrays["versions"] = np.array(sorted(f"{k}=={v}" for k, v in ver.items()))
        np.savez_compressed(out / f"{producer}.npz", **arrays)
        print(f"{producer}: {len(arrays) // 5} cases → {out / (producer + '.npz')}")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else HERE)
