"""Regenerate tests/data/nvidia_golden.npz from NVIDIA's host conversions.

    python -m tests.nvref.make_golden

For every (format, rounding, saturate) that the CUDA headers implement, the
codes NVIDIA produces for the probe set of ``tests.probes.probes_for`` (the
inputs are regenerated from that function and not stored), plus NVIDIA's
decoding of every code of the ≤ 8-bit formats.  The CUDA version is recorded.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

import fpsim
from tests.nvref import CONFIGS, config_key, cuda_include, load
from tests.probes import probes_for

OUT = Path(__file__).resolve().parents[1] / "data" / "nvidia_golden.npz"


def cuda_version() -> str:
    """Name of the toolkit directory the headers came from (e.g. ``cuda-13.0``)."""
    return Path(cuda_include()).resolve().parent.name


def main() -> None:
    nv = load()
    if nv is None:
        raise SystemExit("no CUDA headers / C++ compiler found")
    arrays = {}
    for fmt, rnd, sat in CONFIGS:
        x = probes_for(fpsim.get_format(fmt))
        arrays["enc/" + config_key(fmt, rnd, sat)] = nv.encode(x, fmt, rnd, sat)
    for fmt in ("float4_e2m1fn", "float6_e2m3fn", "float6_e3m2fn", "float8_e4m3fn", "float8_e5m2", "float8_e8m0fnu"):
        n = 1 << fpsim.get_format(fmt).bits
        arrays["dec/" + fmt] = nv.decode(np.arange(n, dtype=np.uint8), fmt)
    arrays["cuda_version"] = np.array(cuda_version())
    tmp = OUT.with_suffix(".tmp.npz")
    np.savez_compressed(tmp, **arrays)
    tmp.replace(OUT)
    print(f"wrote {OUT} ({OUT.stat().st_size / 1e6:.2f} MB, {len(arrays) - 1} tables)")


if __name__ == "__main__":
    main()
