"""fpsim: a bit-accurate software model of low-precision training formats.

The public API of the element layer::

    encode(x, fmt, rounding="rne", saturate=None, rbits=None, seed=None) -> codes
        # saturate=None: satfinite for ≤ 8-bit formats, IEEE (inf) for BF16/FP16
    decode(codes, fmt) -> float32
    get_format(name) -> FormatSpec;  FORMATS;  Rounding
    pack_fp4 / unpack_fp4;  to_ml_dtypes / from_ml_dtypes;  random_bits

and of block-scaled tensors (:mod:`fpsim.scaling`, SPEC §4–§6)::

    quantize(x, "nvfp4" | "mxfp4" | ... | BlockScheme, axis=-1, block=, rounding=, seed=) -> QuantizedTensor
    dequantize(q);  fake_quantize(x, scheme);  swizzle_scales / unswizzle_scales

and of transforms, GEMMs and the training recipe (SPEC §7–§8)::

    rht(x, d=16, signs="recipe", axis=-1)            # random Hadamard transform
    gemm(qa, qb, accumulator="fp32") -> A · Bᵀ         # block-scaled GEMM emulation
    linear(x, w, dy, recipe="nvfp4_paper") -> LinearResult;  get_recipe / RECIPES / Recipe

Every function above that takes ``backend=`` (quantize, dequantize, fake_quantize, gemm, encode,
decode, rht) runs on the Numba CPU reference or, with torch installed, on torch tensors on CPU or
CUDA (:mod:`fpsim.backends`; fused Triton kernels on CUDA) and returns the same bits either way.

Conventions are NVIDIA's (cuda_fp4/6/8.h, PTX ``cvt``) as written in the specification, docs/spec.md;
"SPEC §n" in docstrings and ``--help`` texts cites its section n.
"""

from . import _cache  # noqa: F401, I001  (first: sets Numba's cache directory before numba is imported)
from . import conventions  # noqa: F401  (fpsim.conventions: the producer conventions)
from .codecs import Rounding
from .dispatch import decode, dequantize, encode, fake_quantize, gemm, quantize, rht
from .formats import ALIASES, FORMATS, FormatSpec, NanStyle, get_format
from .io.quantized import load_quantized, save_quantized
from .packing import from_ml_dtypes, pack_fp4, to_ml_dtypes, unpack_fp4
from .plan import Plan, lower
from .random import random_bits
from .recipe import RECIPES, LinearResult, Recipe, get_recipe, linear
from .scaling import swizzle_scales, unswizzle_scales
from .schemes import SCHEMES, BlockScheme, Kind, ScaleRule, get_scheme
from .tensor import QuantizedTensor

__version__ = "0.2.0"

__all__ = [
    "ALIASES",
    "FORMATS",
    "FormatSpec",
    "NanStyle",
    "Rounding",
    "decode",
    "encode",
    "from_ml_dtypes",
    "get_format",
    "pack_fp4",
    "random_bits",
    "to_ml_dtypes",
    "unpack_fp4",
    # block-scaled tensors (fpsim.scaling)
    "SCHEMES",
    "BlockScheme",
    "Kind",
    "Plan",
    "lower",
    "QuantizedTensor",
    "ScaleRule",
    "dequantize",
    "fake_quantize",
    "get_scheme",
    "load_quantized",
    "quantize",
    "save_quantized",
    "swizzle_scales",
    "unswizzle_scales",
    # transforms, GEMM, recipe (fpsim.transforms, fpsim.gemm, fpsim.recipe)
    "rht",
    "gemm",
    "RECIPES",
    "Recipe",
    "LinearResult",
    "get_recipe",
    "linear",
]
