"""Measurements of the tensor studies on the SmolLM2-135M capture (``make capture-llm`` runs them).

    python -m studies.llm.measure [--capture FILE] [--out studies/data/llm/smollm2_results.csv]

Reads ``studies/data/llm/full/smollm2_capture.safetensors`` (made by ``studies.llm.capture_llm``) and writes one
tidy CSV (committed, a few hundred kB) from which ``studies.llm.study`` draws the report section, so that
``make reports`` needs neither the extra nor the 0.75 GB capture.  Columns: ``layer`` (block 0–29), ``linear``
(q, k, v, o, gate, up, down), ``experiment``, ``variant``, ``metric``, ``value``.

Weights are left out everywhere: SmolLM2's linear weights are dequantized Q4_1 (each block of 32 on an affine
16-level grid), so any measurement of quantizing *them* says nothing about quantizing a trained BF16 weight.
For the same reason the GEMM errors measured are those of Wgrad = dYᵀ·X, which does not involve W.

Experiments, per linear, on X (tokens × in) and dY (tokens × out), BF16 values widened to float32:

* ``format``: relative error ‖x − x̂‖/‖x‖ of X and dY under nvfp4, mxfp4, mxfp8_e4m3, fp8_e4m3 (1×16 / 1×32 blocks
  along features, the Fprop/Dgrad copies) and the design-space points ``e2m1_e4m3_b32`` (NVFP4 with blocks of 32)
  and ``e2m1_e8m0_b16`` (MX-style power-of-two scales on blocks of 16); plus kurtosis and amax/std.
* ``wgrad``: ``fpsim.linear`` under ``nvfp4_paper`` (RHT16 along tokens on Wgrad, SR on dY, as the recipe applies
  them) and under ``nvfp4_paper.without("rht")``, seed 0: Wgrad relative error vs FP64 over all of dW, over the
  columns of the massive input channels (the 1 % of channels with the largest max|X|) and over the other
  columns; and the same two recipes on the tokens without the attention-sink tiles (rows 0–15 of each sequence
  dropped: the 16-token Hadamard tile that holds the sink, so the token count stays a multiple of 16).
* ``tokens``: the Wgrad copies of X and dY (NVFP4 1×16 along tokens, RNE), with and without RHT16 along tokens:
  relative error of the sink token rows, of the other 15 rows of the sink tiles (its neighbours, which share
  their block scales with it) and of the other tiles, and each part's share of the squared error and of ‖x‖².
  A part's relative error is empty (NaN) when the part holds less than ``MIN_ENERGY_SHARE`` (1e-12) of the
  whole tensor's ‖x‖²: dividing by a norm that is ~0 gives no error ratio, only noise (on SmolLM2 this is the
  sink token's rows of q_proj's dY: under causal attention the first query attends only to itself, so its
  gradient is zero up to rounding, ~1e-19 of ‖dY‖², and its "relative error" came out as 1 or up to 1.2e7).
* ``sr``: magnitude bias mean(sign(g)·(ĝ − g)) / mean|g| of dY's Wgrad copy (NVFP4 along tokens) under RNE and
  under SR (``SR_SEEDS`` = 4 seeds; ``bias_sr_ci95`` the half-width of the 95 % Student-t interval,
  t(0.975, SR_SEEDS − 1)·s/√SR_SEEDS = 3.18·s/2, from ``fpsim.analysis.mean_ci95``).

All values are dimensionless (ratios of norms, shares, counts, channel indices).  The committed CSV was edited
once after measurement (``studies.llm.fix_results``, recorded under ``results_notes`` in ``smollm2_check.json``);
a new measurement writes those values directly and clears the notes.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

import fpsim
from fpsim.analysis import mean_ci95
from fpsim.recipe import get_recipe
from fpsim.schemes import BlockScheme

DATA = Path(__file__).resolve().parents[1] / "data" / "llm"
CAPTURE = DATA / "full" / "smollm2_capture.safetensors"
RESULTS = DATA / "smollm2_results.csv"
SEQ_LEN = 256  # capture_llm's default: the stored rows are whole sequences of this length
LINEARS = {"self_attn.q_proj": "q", "self_attn.k_proj": "k", "self_attn.v_proj": "v", "self_attn.o_proj": "o",
           "mlp.gate_proj": "gate", "mlp.up_proj": "up", "mlp.down_proj": "down"}
FORMATS = ("nvfp4", "mxfp4", "mxfp8_e4m3", "fp8_e4m3")
DESIGN = {"e2m1_e4m3_b32": BlockScheme("e2m1_e4m3_b32", "e2m1", "e4m3", (1, 32), tensor_scale=True),
          "e2m1_e8m0_b16": BlockScheme("e2m1_e8m0_b16", "e2m1", "e8m0", (1, 16))}
SR_SEEDS = 4
#: A part of a tensor holding less than this share of the whole tensor's squared norm gets no relative error.
MIN_ENERGY_SHARE = 1e-12


def rel(a: np.ndarray, ref: np.ndarray, whole_energy: float | None = None) -> float:
    """‖a − ref‖ / ‖ref‖; NaN when ‖ref‖ = 0 or, given the squared norm ``whole_energy`` of the tensor ``ref`` is
    a part of, when ‖ref‖² < MIN_ENERGY_SHARE · whole_energy (the ratio would divide by a norm that is ~0)."""
    d = np.linalg.norm(ref)
    if not d or (whole_energy is not None and d * d < MIN_ENERGY_SHARE * whole_energy):
        return float("nan")
    return float(np.linalg.norm(a.astype(np.float64) - ref) / d)


def kurtosis(x: np.ndarray) -> float:
    x = x.astype(np.float64).ravel()
    x = x - x.mean()
    return float((x**4).mean() / (x * x).mean() ** 2)


def sink_rows(t: int) -> np.ndarray:
    """Boolean mask of the rows in each sequence's first 16-token tile (the tile that holds the sink token)."""
    return (np.arange(t) % SEQ_LEN) < 16


def massive_channels(x: np.ndarray) -> np.ndarray:
    """Indices of the 1 % of input channels (at least 1) with the largest max|x| over tokens, sorted."""
    k = max(1, x.shape[1] // 100)
    return np.sort(np.argsort(-np.abs(x).max(axis=0), kind="stable")[:k])


def along_tokens(a: np.ndarray, rht: bool) -> np.ndarray:
    """The Wgrad copy of ``a`` (tokens × ch) seen in the original basis: NVFP4 1×16 along tokens (RNE), with an
    optional RHT16 along tokens (the recipe's fixed sign vector) undone exactly after decoding."""
    t = np.ascontiguousarray(a.T)
    tr = fpsim.rht(t, 16, "recipe") if rht else t
    q = fpsim.quantize(tr, "nvfp4").dequantize()
    if rht:
        q = fpsim.rht(q, 16, "recipe", inverse=True, bf16_in=False, bf16_out=False)
    return q.T.astype(np.float64)


def _rows(layer, lin, experiment, variant, metrics):
    return [{"layer": layer, "linear": lin, "experiment": experiment, "variant": variant, "metric": k,
             "value": float(v)} for k, v in metrics.items()]


def measure_linear(layer: int, lin: str, x: np.ndarray, dy: np.ndarray, w: np.ndarray, seed: int = 0) -> list:
    rows = []
    for tname, a in (("input", x), ("grad_output", dy)):
        m = {f"{tname}_rel_error_{f}": rel(fpsim.quantize(a, f).dequantize(), a.astype(np.float64)) for f in FORMATS}
        m |= {f"{tname}_rel_error_{k}": rel(fpsim.quantize(a, s).dequantize(), a.astype(np.float64))
              for k, s in DESIGN.items()}
        sd = float(a.astype(np.float64).std())
        m |= {f"{tname}_kurtosis": kurtosis(a), f"{tname}_amax_over_std": float(np.abs(a).max()) / sd if sd else np.nan}
        rows += _rows(layer, lin, "format", "-", m)
    mc = massive_channels(x)
    rest = np.setdiff1d(np.arange(x.shape[1]), mc)
    rows += _rows(layer, lin, "wgrad", "-", {"massive_channels": len(mc), "massive_channel_first": int(mc[0]),
                                             "massive_amax_ratio": float(np.abs(x[:, mc]).max()
                                                                         / np.abs(x[:, rest]).max())})
    keep = ~sink_rows(x.shape[0])
    full = get_recipe("nvfp4_paper")
    for rname, rec in (("nvfp4_paper", full), ("no_rht", full.without("rht"))):
        r = fpsim.linear(x, w, dy, rec, seed=seed, layer=f"layers.{layer}.{lin}", step=0)
        rows += _rows(layer, lin, "wgrad", rname, {
            "wgrad_rel_error": rel(r.dw, r.dw_ref), "wgrad_bf16_rel_error": rel(r.dw_bf16, r.dw_ref),
            "wgrad_rel_error_massive_cols": rel(r.dw[:, mc], r.dw_ref[:, mc]),
            "wgrad_rel_error_other_cols": rel(r.dw[:, rest], r.dw_ref[:, rest])})
        r2 = fpsim.linear(x[keep], w, dy[keep], rec, seed=seed, layer=f"layers.{layer}.{lin}", step=0)
        rows += _rows(layer, lin, "wgrad", rname, {"wgrad_rel_error_no_sink_tiles": rel(r2.dw, r2.dw_ref)})
    sink = sink_rows(x.shape[0])
    first = (np.arange(x.shape[0]) % SEQ_LEN) == 0
    parts = {"sink_token": first, "sink_neighbours": sink & ~first, "other_tiles": ~sink}
    for tname, a in (("input", x), ("grad_output", dy)):
        a64 = a.astype(np.float64)
        for rht in (False, True):
            q = along_tokens(a, rht)
            e2, x2 = float(((q - a64) ** 2).sum()), float((a64**2).sum())
            m = {f"{tname}_rel_error_{k}": rel(q[r], a64[r], x2) for k, r in parts.items()}  # NaN: no energy
            m |= {f"{tname}_err_share_{k}": float(((q[r] - a64[r]) ** 2).sum()) / e2 for k, r in parts.items()}
            m |= {f"{tname}_energy_share_{k}": float((a64[r] ** 2).sum()) / x2 for k, r in parts.items()}
            rows += _rows(layer, lin, "tokens", "rht16" if rht else "none", m)
    g = np.ascontiguousarray(dy.T)
    g64, sgn = g.astype(np.float64), np.sign(g.astype(np.float64))
    mag = float(np.abs(g64).mean())
    bias_rne = float((sgn * (fpsim.quantize(g, "nvfp4").dequantize() - g64)).mean()) / mag
    draws = [float((sgn * (fpsim.quantize(g, "nvfp4", rounding="sr", seed=seed + s).dequantize() - g64)).mean()) / mag
             for s in range(SR_SEEDS)]
    m, ci = mean_ci95(draws)  # ci: Student-t half-width, t(0.975, SR_SEEDS − 1)·s/√SR_SEEDS
    rows += _rows(layer, lin, "sr", "-", {"bias_rne": bias_rne, "bias_sr": m, "bias_sr_ci95": ci})
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--capture", type=Path, default=CAPTURE)
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--layers", type=str, default=None, help="comma-separated block indices (default: all)")
    args = ap.parse_args(argv)
    from fpsim.io import InputError, atomic_write, dumps, open_tensors

    try:
        refs = {r.name: r for r in open_tensors([str(args.capture)])}
    except InputError as e:
        print(f"error: {e} (make capture-llm builds it)", file=sys.stderr)
        return 1
    blocks = sorted({int(m.group(1)) for n in refs if (m := re.match(r"layers\.(\d+)\.", n))})
    if args.layers:
        blocks = [int(v) for v in args.layers.split(",")]
    rows, t0 = [], time.perf_counter()
    for i in blocks:
        for mod, lin in LINEARS.items():
            name = f"layers.{i}.{mod}"
            x, dy, w = (np.asarray(refs[f"{name}.{k}"].load(), dtype=np.float32)
                        for k in ("input", "grad_output", "weight"))
            rows += measure_linear(i, lin, x, dy, w)
        print(f"block {i} done ({time.perf_counter() - t0:.0f} s)", flush=True)
    df = pd.DataFrame(rows)
    atomic_write(args.out, df.to_csv(index=False, float_format="%.6g", lineterminator="\n"))
    check = args.out.parent / "smollm2_check.json"
    if args.out == RESULTS and check.exists() and "results_notes" in (c := json.loads(check.read_text())):
        del c["results_notes"]  # they describe edits of the previous CSV; these values are measured as written
        atomic_write(check, dumps(c, indent=1))
    print(f"wrote {args.out} ({len(df)} rows, {time.perf_counter() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
