"""Write tests/data/producers/diff_causes.json: the true cause of every byte and value in which the libraries' golden
outputs (torchao.npz, compressed-tensors.npz, modelopt.npz: written by torchao 0.18.0, compressed-tensors 0.20.1 and
nvidia-modelopt 0.47.0 themselves, see generate.py) differ from fpsim's own NVFP4 quantization.

The parts of each library's arithmetic are written down below BY HAND from the library's code (file and function
beside each part, read in the installed versions).  A part's fields are those of :class:`fpsim.conventions.Convention`
(only to run the arithmetic); the library's bytes and values are asserted to be those of fpsim + all of its parts.
The true cause of a differing byte is the set of the library's parts it needs: those whose removal alone changes it
back (leave one out); where no single removal does, the first part that alone reproduces it.  A differing value's
cause is its code's (else its block scale's) cause plus the decode parts it needs, found the same way on the
library's own bytes.  The stored global scale's cause is the library's ``stored`` part.

tests/test_oracle_producers.py runs ``fpsim diff``'s convention diagnosis blind (it is not told the library) on every
case and checks that every differing byte and value is named with exactly these parts or "not explained".
Run ``python tests/data/producers/diff_truth.py`` to regenerate (needs only fpsim and the .npz files).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
from pathlib import Path

import numpy as np

from fpsim import conventions as C
from fpsim.codecs import decode as np_decode

HERE = Path(__file__).resolve().parent
G, B, E, D, S = C.GlobalRule, C.BlockRule, C.EncodeRule, C.DecodeRule, C.Stored
TA = "torchao/prototype/mx_formats/nvfp4_tensor.py"
CT = "compressed_tensors/"
MO = "modelopt/torch/quantization/qtensor/nvfp4_tensor.py"

READS = {D.FPSIM: S.AMAX, D.TE_CUDA: S.AMAX, D.DIV_G: S.ENCODE, D.S_PTS: S.DECODE}  # the global each decode reads
SHARED = ("llmcompressor 0.14 observers/base.py: Observer.get_global_scale (generate_gparam(-absmax, absmax) over "
          "the fused group's statistics: one global scale for q/k/v or gate/up); generate_shared.py passes the group "
          "absmax")

#: library → (quantize parts, decode parts, stored part); each part: (fields, where the library does it)
PARTS = {
    "torchao": (
        [({"global_rule": G.PTS, "block_rule": B.DIV_PTS, "encode_rule": E.RECIP_PTS_S},
          f"{TA}: per_tensor_amax_to_scale (pts = amax / (448·6)); nvfp4_quantize, two-level branch: "
          "block_scale = max_abs / 6, scaled_block_scales = block_scale / per_tensor_scale, "
          "data_scaled = data_hp * (1 / per_tensor_scale) / block_scale_fp32"),
         ({"scale_min": 2.0**-6}, f"{TA}: nvfp4_quantize: torch.clamp(scaled_block_scales, min=E4M3_EPS, "
                                   "max=F8E4M3_MAX) (E4M3_EPS = 2^-6)"),
         ({"nan_scale": 0xFF}, f"{TA}: nvfp4_quantize: a NaN scaled_block_scales cast to float8_e4m3fn (0xFF on x86)"),
         ({"nan_code": 0xC}, "torchao/prototype/custom_fp_utils.py: _f32_to_floatx_unpacked of a NaN (0xC on x86)"),
         ({"inf_nan_code": 0xB}, "custom_fp_utils.py: _f32_to_floatx_unpacked of 0·inf = NaN (0xB on x86)")],
        [({"decode_rule": D.S_PTS}, f"{TA}: NVFP4Tensor.get_hp_scales (scale.to(float32) * per_tensor_scale), "
                                    "dequantize (data_lp * scale)")],
        S.DECODE),
    "compressed-tensors": (
        [({"global_rule": G.RECIP}, f"{CT}quantization/utils/helpers.py: generate_gparam (448·6 / max_val_pos in the "
                                    "input's dtype: torch's reciprocal then product)"),
         ({"block_rule": B.MUL_G}, f"{CT}quantization/utils/helpers.py: calculate_qparams (scales = global_scale * "
                                   "(max_val_pos / 6), in the input's dtype)"),
         ({"encode_rule": E.DIV_S_G}, f"{CT}quantization/lifecycle/forward.py: _quantize (x / (scale / global_scale))"),
         ({"zero_scale": 0.125}, f"{CT}quantization/utils/helpers.py: calculate_qparams (a zero FP8 scale replaced "
                                 "by _get_dtype_eps(float8_e4m3fn) = 0.125)"),
         ({"neg_zero": False}, f"{CT}quantization/utils/fp4_utils.py: cast_to_fp4 "
                               "(sign = torch.sign(x): sign(−0) = 0)")],
        [({"decode_rule": D.DIV_G, "global_rule": G.RECIP},
          f"{CT}quantization/lifecycle/forward.py: _dequantize (x_q * (scale / global_scale))"),
         ({"decode_bf16": True}, f"{CT}compressors/nvfp4/base.py: decompress (values in the unpacked dtype, "
                                 "bfloat16)")],
        S.ENCODE),
    "modelopt": (
        [({"global_rule": G.PTS, "block_rule": B.DIV_6PTS, "encode_rule": E.DIV_S_PTS},
          f"{MO}: NVFP4QTensor.get_weights_scaling_factor_2 (amax / (6·448)), get_weights_scaling_factor "
          "(per_block_amax / (6 · weights_scaling_factor_2)), quantize (input / (scale · scale_2))"),
         ({"zero_sdb": 1.0}, f"{MO}: get_weights_scaling_factor: per_block_scale[per_block_scale == 0] = 1.0"),
         ({"scale_min": 2.0**-9}, f"{MO}: _cast_per_block_scale_to_fp8: clamp(min=2**-9, max=448)"),
         ({"nan_scale": 0xFF}, f"{MO}: _cast_per_block_scale_to_fp8 of a NaN (0xFF on x86)"),
         ({"neg_zero": False}, f"{MO}: _cast_fp4 (sign bit from input < 0: −0 is not negative)")],
        [({"decode_rule": D.S_PTS}, f"{MO}: dequantize (values · (scale · double_scale))"),
         ({"decode_neg_zero": False}, f"{MO}: dequantize (E2M1 table with +0 for code 0x8)")],
        S.DECODE),
}


def key(fields: dict) -> str:
    """The part's name: ``field=value`` joined by ``+`` (a shared global scale is ``amax=shared``)."""
    if "amax" in fields:
        return "amax=shared"
    return "+".join(f"{k}={'shared' if k == 'amax' else getattr(v, 'value', v)}" for k, v in fields.items())


def _smallest(outputs: dict, target, bad, same) -> dict:
    """Per bad flat index, the smallest subsets (tuples of part keys) whose output (``outputs[subset]``) reproduces
    the target there: one subset, or several of one size (alternatives)."""
    res = {}
    for i in np.flatnonzero(bad.reshape(-1)):
        alts = []
        for size in range(1, max(len(k) for k in outputs) + 1):
            alts = [k for k, o in outputs.items() if len(k) == size and same(o, i)]
            if alts:
                break
        res[int(i)] = sorted(" & ".join(sorted(k)) for k in alts)
    return res


def _eq(a, b) -> bool:
    a, b = np.float32(a), np.float32(b)
    return bool(a.view(np.uint32) == b.view(np.uint32) or (np.isnan(a) and np.isnan(b))) if a.dtype == np.float32 \
        else bool(a == b)


def truth(lib: str, x: np.ndarray, codes, scales, glob, values, bf16: bool, absmax=None) -> dict:
    """The true causes of one case; ``absmax``: the group absmax a shared global scale was made from."""
    qparts, dparts, stored = PARTS[lib]
    if absmax is not None:  # the group's global scale, as the library forms it, replaces the tensor's own
        qparts = [p for p in qparts if "global_rule" not in p[0]] + [
            ({"amax": np.float32(absmax), "global_rule": G.RECIP}, SHARED)]
    base = C.FPSIM
    R, n = x.shape
    X3 = x.reshape(R, -1, 16)

    def q(parts):
        f = {k: v for f, _ in parts for k, v in f.items()}
        a = f.pop("amax", None)
        conv = dataclasses.replace(base, **f)
        with np.errstate(all="ignore"):
            c, s, _ = C.quantize_blocks(X3, conv, bf16, amax=a)
        return np.asarray(c, np.uint8).reshape(R, n), np.asarray(s, np.uint8)

    full = q(qparts)
    assert np.array_equal(full[0], codes) and np.array_equal(full[1], scales), f"{lib}: parts incomplete"
    ours = q([])
    qsub = {tuple(key(f) for f, _ in c): q(list(c)) for k in range(1, len(qparts) + 1)
            for c in itertools.combinations(qparts, k)}
    nbk = R * (n // 16)
    blk = np.repeat(np.arange(nbk), 16)  # the block of each flat element
    out = {
        "codes": _smallest(qsub, full[0], ours[0] != full[0], lambda o, i: o[0].reshape(-1)[i] == codes.reshape(-1)[i]),
        "scales": _smallest(qsub, full[1], ours[1] != full[1],
                            lambda o, i: o[1].reshape(-1)[i] == scales.reshape(-1)[i]),
    }
    # a value's bytes: its code and its block scale together
    bytes_bad = (ours[0] != full[0]).reshape(-1) | (ours[1] != full[1]).reshape(-1)[blk]
    joint = _smallest(qsub, None, bytes_bad, lambda o, i: o[0].reshape(-1)[i] == codes.reshape(-1)[i]
                      and o[1].reshape(-1)[blk[i]] == scales.reshape(-1)[blk[i]])
    # values: the library's bytes decoded with fpsim + decode parts
    amax = np.float32(np.max(np.abs(x))) if not np.isnan(x).any() else np.float32(np.nan)
    if absmax is not None:  # a decoder reads the stored global scale (the group's): fpsim's decode reads it as its
        amax = _reading(np.float32(glob))  # S_enc, i.e. from an amax whose fl(2688/amax) is the stored G
    e, s = np_decode(codes.reshape(R, -1, 16), "float4_e2m1fn"), np_decode(scales, "float8_e4m3fn")[..., None]
    eo, so = np_decode(ours[0].reshape(R, -1, 16), "float4_e2m1fn"), np_decode(ours[1], "float8_e4m3fn")[..., None]

    def d(parts, e, s):
        conv = dataclasses.replace(base, **{k: v for f, _ in parts for k, v in f.items()})
        with np.errstate(all="ignore"):
            # a decode rule that reads the kind of global scale the library stores reads the stored one
            gin = np.float32(glob) if READS[conv.decode_rule] is stored else C.decode_input(amax, conv, bf16)
            return np.asarray(C.decode_blocks(e, s, gin, conv), np.float32).reshape(R, n)

    assert _all_eq(d(dparts, e, s), values), f"{lib}: decode parts incomplete"
    ref_v = d([], eo, so)
    bad_v = ~np.vectorize(_eq)(ref_v, values)
    needs = bad_v & ~np.vectorize(_eq)(d([], e, s), values)
    dsub = {tuple(key(f) for f, _ in c): d(list(c), e, s) for k in range(1, len(dparts) + 1)
            for c in itertools.combinations(dparts, k)}
    dneed = _smallest(dsub, None, needs, lambda o, i: _eq(o.reshape(-1)[i], values.reshape(-1)[i]))
    vals = {}
    for i in np.flatnonzero(bad_v.reshape(-1)):
        a = joint.get(int(i), [""]) if bytes_bad[i] else [""]
        b = dneed.get(int(i), [""]) if needs.reshape(-1)[i] else [""]
        vals[int(i)] = sorted(" & ".join(sorted(filter(None, (x.split(" & ") if x else []) + (y.split(" & ") if y
                                                                                           else []))))
                              for x in a for y in b)
    out["values"] = vals
    g_ours = np.float32(np.max(np.abs(x))) if not np.isnan(x).any() else np.float32(np.nan)
    out["global"] = [] if _eq(g_ours, glob) else [f"stored={stored.value}"] + (["amax=shared"] if absmax is not None
                                                                               else [])
    return out


def _reading(g: np.float32) -> np.float32:
    """The float32 amax nearest 2688/g whose S_enc = fl(2688/amax) is exactly g (g: a stored encode scale)."""
    a0 = np.float32(np.float32(2688.0) / g)
    bits = np.arange(int(a0.view(np.uint32)) - 64, int(a0.view(np.uint32)) + 65).astype(np.uint32)
    cand = bits.view(np.float32)
    ok = cand[(np.float32(2688.0) / cand).astype(np.float32) == g]
    assert ok.size, g
    return ok[np.argmin(np.abs(ok.astype(np.float64) - float(a0)))]


def _all_eq(a, b) -> bool:
    return bool(np.all(np.vectorize(_eq)(a, b)))


def main() -> None:
    res = {"about": __doc__.split("\n\n")[0], "sources": {}, "cases": {}}
    for lib, (qp, dp, stored) in PARTS.items():
        res["sources"][lib] = {key(f): src for f, src in qp + dp}
        res["sources"][lib][f"stored={stored.value}"] = "the global scale the checkpoint holds (see generate.py)"
        with np.load(HERE / f"{lib}.npz") as z:
            cases = sorted({k.rsplit(".", 1)[0] for k in z.files if k != "versions"})
            for c in cases:
                g = {f: z[f"{c}.{f}"] for f in ("input", "codes", "scales", "global", "decoded")}
                t = truth(lib, g["input"], g["codes"], g["scales"], g["global"], g["decoded"], c.endswith("bfloat16"))
                res["cases"][f"{lib}/{c}"] = {w: ({str(i): " | ".join(v) for i, v in t[w].items()} if w != "global"
                                                  else t[w]) for w in t}
    res["sources"]["shared-global"] = {"amax=shared": SHARED}
    with np.load(HERE / "shared-global.npz") as z:
        for c in sorted({k.rsplit(".", 1)[0] for k in z.files if k != "versions"}):
            g = {f: z[f"{c}.{f}"] for f in ("input", "codes", "scales", "global", "decoded", "absmax")}
            t = truth("compressed-tensors", g["input"], g["codes"], g["scales"], g["global"], g["decoded"],
                      c.endswith("bfloat16"), absmax=g["absmax"])
            res["cases"][f"shared-global/{c}"] = {w: ({str(i): " | ".join(v) for i, v in t[w].items()}
                                                      if w != "global" else t[w]) for w in t}
    (HERE / "diff_causes.json").write_text(json.dumps(res, indent=0, sort_keys=True) + "\n")
    n = sum(len(v[w]) for v in res["cases"].values() for w in ("codes", "scales", "values", "global"))
    print(f"{len(res['cases'])} cases, {n} differing bytes, values and global scales → diff_causes.json")


if __name__ == "__main__":
    main()
