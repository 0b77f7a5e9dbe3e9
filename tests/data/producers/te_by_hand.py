"""Write tests/data/producers/te-*.npz: Transformer Engine's NVFP4 bytes and values on generate.py's edge tensors,
DERIVED BY HAND from Transformer Engine's source, not produced by Transformer Engine (it installs only with CUDA).

Each line below transcribes one operation of the cited TE function (github.com/NVIDIA/TransformerEngine, read at
commit d0067d0da6cb01811b8072a7d304f0e00344ce2b), one float32 rounding per operation, scalar by scalar; the
conversions cvt.rn.satfinite.{e4m3,e2m1} are fpsim's codecs (checked against CUDA's own host conversions in
tests/nvref) and bfloat16 rounding is ml_dtypes'.  Nothing here calls fpsim.conventions, which these files test.
Same layout as generate.py's files; run ``python tests/data/producers/te_by_hand.py``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import ml_dtypes
import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from generate import edge_tensors  # noqa: E402

import fpsim  # noqa: E402

F = np.float32
FLT_MAX = np.finfo(F).max
BF16_MAX = F(3.3895313892515355e38)
TE_COMMIT = "d0067d0da6cb01811b8072a7d304f0e00344ce2b"


def e4m3(v) -> int:
    return int(fpsim.encode(np.array([v], F), "e4m3")[0])


def e4m3_value(b: int) -> F:
    return F(fpsim.decode(np.array([b], np.uint8), "e4m3")[0])


def e2m1(v) -> int:
    return int(fpsim.encode(np.array([v], F), "e2m1")[0])


def e2m1_value(c: int) -> F:
    return F(fpsim.decode(np.array([c], np.uint8), "e2m1")[0])


def s_enc_of(amax: F) -> F:
    """core_nvfp4.cuh compute_global_encode_scaling_factor_FP4<448>."""
    with np.errstate(all="ignore"):
        s = F(F(448.0) * F(6.0)) / amax  # fp8_max * fp4_max / global_amax
    s = min(s, FLT_MAX)  # fminf(global_encode_scale, FLT_MAX)
    if amax == 0 or s == 0:
        return F(1.0)
    return F(s)


def block_scale_byte(vmax: F, s_enc: F) -> int:
    """core_nvfp4.cuh quantization_SF::compute_decoding_scaling_factor: (fp8e4m3)(block_amax * (S_enc * (1/6)))."""
    fp4_max_inv = F(F(1.0) / F(6.0))
    return e4m3(F(vmax * F(s_enc * fp4_max_inv)))


def coefficient(s: F, s_enc: F, fast: bool) -> F:
    with np.errstate(all="ignore"):
        if fast:  # tuned_1D compute_nvfp4_scaling_coefficient<bf16>: bf16(fminf(S_enc / S_dec_block, bf16 max))
            return F(ml_dtypes.bfloat16(min(F(s_enc / s), BF16_MAX)))
        s_dec = F(F(1.0) / s_enc)  # core::compute_scaling_coefficient<float>: S_dec = 1 / S_enc
        return F(min(F(F(1.0) / F(s * s_dec)), FLT_MAX))  # fminf(1 / (S_dec_block * S_dec), FLT_MAX)


def python_code(y: F) -> int:
    """reference_nvfp4.py cast_to_fp4x2: the range tests, in their order (later assignments win)."""
    c = 0
    for lo_ok, hi_ok, code in (
        (y >= 0.0, y <= 0.25, 0), (y > 0.25, y < 0.75, 1), (y >= 0.75, y <= 1.25, 2), (y > 1.25, y < 1.75, 3),
        (y >= 1.75, y <= 2.5, 4), (y > 2.5, y < 3.5, 5), (y >= 3.5, y <= 5.0, 6), (y > 5.0, True, 7),
        (y >= -0.25, y < -0.0, 8), (y < -0.25, y > -0.75, 9), (y <= -0.75, y >= -1.25, 10),
        (y < -1.25, y > -1.75, 11), (y <= -1.75, y >= -2.5, 12), (y < -2.5, y > -3.5, 13),
        (y <= -3.5, y >= -5.0, 14), (y < -5.0, True, 15)):
        if lo_ok and hi_ok:
            c = code
    return c


def dequantize(code: int, s_byte: int, amax: F) -> F:
    """dequantize_nvfp4.cuh dequantize_fp4_kernel: final_scale = float(scale) * amax * factor_inv; elt * final."""
    factor_inv = F(1.0 / (6.0 * 448.0))  # constexpr float factor_inv = 1.0 / (6.0 * 448.0)
    final_scale = F(F(e4m3_value(s_byte) * amax) * factor_inv)
    return F(e2m1_value(code) * final_scale)


def te_quantize(x: np.ndarray, variant: str, bf16: bool):
    """(codes, scale bytes, amax, decoded) of a float32 [R, 16k] tensor; variant te-cuda / te-cuda-fastmath /
    te-python.  Fast math exists only in the tuned 1-D kernel, which quantize_transpose_nvfp4.cuh uses for bfloat16
    inputs only."""
    R, C = x.shape
    amax = F(np.max(np.abs(x))) if x.size else F(0.0)
    s_enc = s_enc_of(amax)
    fast = variant == "te-cuda-fastmath" and bf16
    codes = np.zeros((R, C), np.uint8)
    scales = np.zeros((R, C // 16), np.uint8)
    dec = np.zeros((R, C), F)
    for r in range(R):
        for j in range(C // 16):
            blk = x[r, 16 * j: 16 * j + 16]
            b = block_scale_byte(F(np.max(np.abs(blk))), s_enc)
            scales[r, j] = b
            c = coefficient(e4m3_value(b), s_enc, fast)
            for t, v in enumerate(blk):
                with np.errstate(all="ignore"):
                    y = F(F(v) * c)  # mul.f32x2 / fma.rn.f32.bf16 (exact for bf16 operands), then the conversion
                if variant == "te-python":  # torch.clamp(scaled_x, -6, 6), then cast_to_fp4x2
                    code = python_code(F(min(max(y, F(-6.0)), F(6.0))))
                else:
                    code = e2m1(y)  # cvt.rn.satfinite.e2m1x2.f32
                codes[r, 16 * j + t] = code
                dec[r, 16 * j + t] = dequantize(code, b, amax)
    return codes, scales, amax, dec


def main(out: Path = HERE) -> None:
    for variant in ("te-cuda", "te-cuda-fastmath", "te-python"):
        arrays: dict[str, np.ndarray] = {}
        for name, x in edge_tensors().items():
            for dtype in ("float32", "bfloat16"):
                xin = x.astype(ml_dtypes.bfloat16).astype(F) if dtype == "bfloat16" else x
                codes, scales, amax, dec = te_quantize(xin, variant, dtype == "bfloat16")
                key = f"{name}.{dtype}"
                arrays.update({f"{key}.input": xin, f"{key}.codes": codes, f"{key}.scales": scales,
                               f"{key}.global": np.asarray(amax, F), f"{key}.decoded": dec})
        arrays["versions"] = np.array([f"TransformerEngine source {TE_COMMIT} (derived by hand, not run)"])
        np.savez_compressed(out / f"{variant}.npz", **arrays)
        print(f"{variant}: {(len(arrays) - 1) // 5} cases")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else HERE)
