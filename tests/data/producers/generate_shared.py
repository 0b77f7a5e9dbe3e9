"""Generate tests/data/producers/shared-global.npz: NVFP4 tensors of a fused group (q/k/v, gate/up) quantized by
compressed-tensors itself with the group's shared global scale (llmcompressor 0.14's Observer.get_global_scale:
generate_gparam(-absmax, absmax) over the group's absmax, so a member's global scale is not its own).

Run ``python tests/data/producers/generate_shared.py`` with the ``producers`` extra installed (committed file:
compressed-tensors 0.20.1, torch 2.13.0+cpu).  Per case ``<name>.<dtype>``: ``input`` (float32; bfloat16 values
widened), ``codes``, ``scales``, ``global`` and ``decoded`` as in generate.py, and ``absmax`` (float32: the group
absmax the library was given, larger than the member's own).  The true cause of the differences is written down in
diff_truth.py (the shared global scale plus compressed-tensors' parts).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from generate import case_arrays, edge_tensors, produce, versions  # noqa: E402

HERE = Path(__file__).resolve().parent


def main(out: Path = HERE) -> None:
    import torch

    arrays: dict[str, np.ndarray] = {}
    t = edge_tensors()
    for name, factor in (("random", 3.0), ("outliers", 1.7), ("ties", 2.5)):
        x = t[name]
        for dtype in ("float32", "bfloat16"):
            xin = torch.from_numpy(x).to(getattr(torch, dtype)).float().numpy()
            # the group's absmax (another member's), in the input's dtype as the observer holds it
            absmax = torch.tensor(float(np.max(np.abs(xin)) * factor), dtype=getattr(torch, dtype)).float().numpy()
            codes, scales, g, dec = produce("compressed-tensors", x, dtype, absmax=float(absmax))
            key = f"{name}.{dtype}"
            arrays.update(case_arrays(key, xin, codes, scales, g, dec))
            arrays[f"{key}.absmax"] = np.asarray(absmax, np.float32).reshape(())
    ver = versions()
    arrays["versions"] = np.array(sorted(f"{k}=={v}" for k, v in ver.items() if k in ("torch", "compressed-tensors")))
    np.savez_compressed(out / "shared-global.npz", **arrays)
    print(f"{len(arrays) // 6} cases → {out / 'shared-global.npz'}")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else HERE)
