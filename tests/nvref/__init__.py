"""NVIDIA's host conversions (CUDA headers) compiled for the CPU and called through ctypes.

``load()`` returns a :class:`NvRef` or ``None`` when no CUDA headers / compiler
are found; tests fall back to the committed golden tables then.  The library
is built once per header version into ``$FPSIM_NVREF_CACHE`` (default: a
directory under the system temp dir).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "nvref.cpp"


def cuda_include() -> Path | None:
    """Directory holding cuda_fp4.h, or None."""
    cands = [os.environ.get("CUDA_HOME", ""), os.environ.get("CUDA_PATH", ""), "/usr/local/cuda"]
    nvcc = shutil.which("nvcc")
    if nvcc:
        cands.append(str(Path(os.path.realpath(nvcc)).parent.parent))
    for c in cands:
        if c and (Path(c) / "include" / "cuda_fp4.h").is_file():
            return Path(c) / "include"
    return None


def _compile(inc: Path) -> Path | None:
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        return None
    h = hashlib.sha256(SOURCE.read_bytes() + str(inc).encode() + (inc / "cuda_fp8.hpp").read_bytes()).hexdigest()[:16]
    cache = Path(os.environ.get("FPSIM_NVREF_CACHE", Path(tempfile.gettempdir()) / "fpsim-nvref"))
    cache.mkdir(parents=True, exist_ok=True)
    lib = cache / f"libnvref-{h}.so"
    if not lib.exists():
        tmp = lib.with_suffix(f".{os.getpid()}.tmp")
        cmd = [cxx, "-O2", "-shared", "-fPIC", f"-I{inc}", "-o", str(tmp), str(SOURCE)]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"building the NVIDIA reference failed:\n{r.stderr}")
        os.replace(tmp, lib)
    return lib


class NvRef:
    """numpy-friendly wrappers of NVIDIA's host conversion functions."""

    ROUND = {"rne": 0, "rtz": 1, "rup": 2, "rdown": 3}

    def __init__(self, path: Path):
        self.lib = ctypes.CDLL(str(path))
        self.path = path

    def _enc(self, fn, x, dtype, *args):
        x = np.ascontiguousarray(x, dtype=np.uint32).view(np.float32)
        out = np.empty(x.shape, dtype)
        getattr(self.lib, fn)(
            x.ctypes.data_as(ctypes.c_void_p), out.ctypes.data_as(ctypes.c_void_p), ctypes.c_size_t(x.size),
            *[ctypes.c_int(a) for a in args],
        )
        return out

    def encode(self, xbits: np.ndarray, fmt: str, rounding: str = "rne", saturate: bool = True) -> np.ndarray:
        """Codes from NVIDIA's conversion of float32 bit patterns, for the modes NVIDIA offers.

        Raises ``KeyError`` for a (format, rounding, saturate) combination the
        headers do not implement.
        """
        r = self.ROUND[rounding]
        if fmt == "float4_e2m1fn" and rounding in ("rne", "rtz") and saturate:
            return self._enc("nv_f32_to_fp4", xbits, np.uint8, r)
        if fmt in ("float6_e2m3fn", "float6_e3m2fn") and rounding in ("rne", "rtz") and saturate:
            return self._enc("nv_f32_to_fp6", xbits, np.uint8, int(fmt == "float6_e3m2fn"), r)
        if fmt in ("float8_e4m3fn", "float8_e5m2") and rounding == "rne":
            return self._enc("nv_f32_to_fp8", xbits, np.uint8, int(fmt == "float8_e5m2"), int(saturate))
        if fmt == "float8_e8m0fnu" and rounding in ("rtz", "rup"):
            return self._enc("nv_f32_to_e8m0", xbits, np.uint8, int(saturate), r)
        if fmt == "bfloat16" and not saturate:
            return self._enc("nv_f32_to_bf16", xbits, np.uint16, r)
        if fmt == "float16" and not saturate:
            return self._enc("nv_f32_to_f16", xbits, np.uint16, r)
        raise KeyError((fmt, rounding, saturate))

    def decode(self, codes: np.ndarray, fmt: str) -> np.ndarray:
        c = np.ascontiguousarray(codes, dtype=np.uint8)
        out = np.empty(c.shape, np.float32)
        args = {
            "float4_e2m1fn": ("nv_fp4_to_f32",),
            "float6_e2m3fn": ("nv_fp6_to_f32", 0),
            "float6_e3m2fn": ("nv_fp6_to_f32", 1),
            "float8_e4m3fn": ("nv_fp8_to_f32", 0),
            "float8_e5m2": ("nv_fp8_to_f32", 1),
            "float8_e8m0fnu": ("nv_e8m0_to_f32",),
        }[fmt]
        getattr(self.lib, args[0])(
            c.ctypes.data_as(ctypes.c_void_p), out.ctypes.data_as(ctypes.c_void_p), ctypes.c_size_t(c.size),
            *[ctypes.c_int(a) for a in args[1:]],
        )
        return out


#: Every (format, rounding, saturate) that NVIDIA's host headers implement.
CONFIGS = [
    ("float4_e2m1fn", "rne", True),
    ("float4_e2m1fn", "rtz", True),
    ("float6_e2m3fn", "rne", True),
    ("float6_e2m3fn", "rtz", True),
    ("float6_e3m2fn", "rne", True),
    ("float6_e3m2fn", "rtz", True),
    ("float8_e4m3fn", "rne", True),
    ("float8_e4m3fn", "rne", False),
    ("float8_e5m2", "rne", True),
    ("float8_e5m2", "rne", False),
    ("float8_e8m0fnu", "rtz", True),
    ("float8_e8m0fnu", "rtz", False),
    ("float8_e8m0fnu", "rup", True),
    ("float8_e8m0fnu", "rup", False),
    ("bfloat16", "rne", False),
    ("bfloat16", "rtz", False),
    ("bfloat16", "rup", False),
    ("bfloat16", "rdown", False),
    ("float16", "rne", False),
    ("float16", "rtz", False),
    ("float16", "rup", False),
    ("float16", "rdown", False),
]


def config_key(fmt: str, rounding: str, saturate: bool) -> str:
    return f"{fmt}:{rounding}:{'sat' if saturate else 'nosat'}"


@functools.lru_cache(maxsize=1)
def load() -> NvRef | None:
    inc = cuda_include()
    if inc is None:
        return None
    lib = _compile(inc)
    return NvRef(lib) if lib else None
