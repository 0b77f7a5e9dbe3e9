"""Golden test vectors of named edge cases (:func:`write_vectors`, :func:`read_vectors`)."""

from __future__ import annotations

import hashlib
import json
import math
import re
import shutil
from pathlib import Path

import numpy as np

from ..codecs import decode, encode
from ..conventions import get_convention
from ..dispatch import quantize
from ..formats import get_format
from ..io import OutputError, atomic_write, dumps
from ..packing import pack_fp4, unpack_fp4
from ..plan import lower
from ..scaling import swizzle_scales
from ..schemes import BlockScheme, Kind, ScaleRule, get_scheme
from .common import F32
from .model import Convention, TensorView, model_bytes, tensor_s_enc

__all__ = ["DEQUANTIZE_ORDERS", "decode_two_level", "element_cases", "read_vectors", "vector_cases", "write_vectors"]

_NAN, _INF = float("nan"), float("inf")


def _blk(*vals, n):
    return list(vals) + [0.0] * (n - len(vals))


def vector_cases(scheme="nvfp4") -> list[tuple[str, np.ndarray, dict]]:
    """The named edge cases of :func:`write_vectors`: ``(name, x (float32), quantize kwargs)``.

    For NVFP4 these are the inputs of the hand-derived golden cases of the test
    suite (zero, −0, zero block, subnormal and zero E4M3 scales, E2M1 ties,
    E4M3 scale ties, the operation-order tie, inf, NaN propagated and ignored,
    S_enc capped at FLT_MAX, ragged, 2-D tiles, axis=0); other block schemes
    get the same kinds of cases built from their element format, plus a
    seeded random tensor with outliers.
    """
    sch = get_scheme(scheme)
    if sch.kind is Kind.CAST or sch.block is None:
        raise ValueError(f"vectors are defined for block-scaled schemes, not {sch.name}")
    BR, BC = sch.block
    el = sch.element
    M = el.max

    def b(*v):
        return _blk(*v, n=BC)

    two = sch.kind is Kind.TWO_LEVEL and sch.tensor_scale
    A = F32(el.max) * F32(sch.scale.max) if two else F32(M)  # an anchor block amax: S_enc = 1 for NVFP4
    A = float(A)
    Z = float(sch.scale.max) if two else M
    cases: list[tuple[str, list | np.ndarray, dict]] = [
        ("zero tensor", [b()], {}),
        ("negative zero", [[-0.0] * BC], {}),
        ("zero block inside a tensor", [b() + b(A, Z, -Z)], {}),
    ]
    vals = [float(v) for v in el.values()]
    mids = [(a + c) / 2 for a, c in zip(vals[:-1], vals[1:])]
    if two and el.name == "float4_e2m1fn" and sch.scale.name == "float8_e4m3fn":
        cases += [
            ("subnormal E4M3 scale", [b(A) + b(6 * 2.0**-8, 2.0**-8, -3 * 2.0**-8)], {}),
            ("E4M3 scale tie at half the smallest subnormal", [b(A) + b(6 * 2.0**-10) + b(7 * 2.0**-10)], {}),
            ("zero E4M3 scale (block 1e-7 x amax)", [b(A) + b(2.688e-4, -1e-4)], {}),
            ("E2M1 ties after scaling", [b(A) + b(6.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.25, -2.5, -5.0)], {}),
            ("E4M3 scale ties and element saturation", [b(A) + b(51.0) + b(57.0)], {}),
            ("E4M3 scale tie decided by the operation order", [b(100.0) + b(0.3487723469734192)], {}),
            ("inf", [b(_INF, 448.0, -_INF) + b(1.0)], {}),
            ("NaN propagates", [b(_NAN, 1.0) + b(2.0)], {}),
            ("NaN ignored", [b(_NAN, A) + b(6.0)], {"nan_amax": "ignore"}),
            ("tiny tensor: S_enc capped at FLT_MAX", [b(2.0**-149)], {}),
            ("ragged 3x20", [[A] + [6.0] * 19, [6.0] * 20, [6.0] * 20], {}),
        ]
        if (BR, BC) == (1, 16) and not sch.per_row_scale:  # per-row scales are undefined for 16x16 tiles
            t = np.zeros((16, 32), np.float32)
            t[15, 0], t[3, 20], t[0, 17] = A, 6.0, -3.0
            cases.append(("2D 16x16 tiles", t, {"block": (16, 16)}))
            cases.append(("axis=0", np.array([b(A), b(6.0, 0.25)], np.float32).T, {"axis": 0}))
    else:
        row = [M]
        for v in vals[1:] + mids:
            row += [v, -v]
        n = -(-len(row) // BC) * BC
        row += [0.0] * (n - len(row))
        grid = np.array(row, np.float32).reshape(-1, BC)
        grid[:, 0] = M  # every block keeps the amax M: the element grid and its midpoints at scale 1
        cases += [
            ("element grid and midpoints", grid.reshape(1, -1), {}),
            ("small blocks: subnormal, zero and clamped scales",
             [b(A) + b(M * 2.0**-8) + b(M * 2.0**-10) + b(M * 2.0**-20) + b(M * 2.0**-140)], {}),
            ("block amax not on the grid", [b(M * 7 / 6, 1.0) + b(float(np.nextafter(F32(8 * M / 6), F32(0))))], {}),
            ("inf", [b(_INF, M, -_INF) + b(1.0)], {}),
            ("NaN propagates", [b(_NAN, 1.0) + b(2.0)], {}),
            ("NaN ignored", [b(_NAN, A) + b(M)], {"nan_amax": "ignore"}),
            ("huge values", [b(1.5 * 2.0**127, -1.0)], {}),
            ("ragged 3xN", np.full((3, BC + 4), M, np.float32), {}),
        ]
    rng = np.random.default_rng(20240607)
    r = rng.standard_normal((4, 4 * BC)).astype(np.float32)
    r[0, 3], r[2, 5 * BC // 2] = 40.0, -1e3  # outliers
    cases.append(("random normal with outliers", r, {}))
    return [(n, np.asarray(v, np.float32), kw) for n, v, kw in cases]


def _slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_")


_VEC_TAG = "fpsim.vectors/1"
_CONVENTIONS = ("SPEC.md: NVIDIA conversions (RNE, satfinite, NaN → positive NaN/max code), Transformer Engine "
                "NVFP4 order sdb = min(fl(vmax·fl(S_enc·fl(1/6))), 448), no lower scale clamp, MX rceil, "
                "element 2j in the low nibble")


def element_cases(fmt) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Codec vectors of element format ``fmt``: ``(codes, decoded, inputs)``.

    ``codes``: every code of the format (all 2^bits; 16-bit formats: all 65,536); ``decoded`` their float32
    values; ``inputs``: float32 values probing every rounding decision: each finite grid value, each midpoint
    between neighbours and the float32 values one ulp either side of it, past-max values (max + half a
    step and its neighbours, 2·max, float32 max), ±0, ±inf, NaN and float32 subnormals — all with both signs.
    """
    spec = get_format(fmt)
    if spec.is_passthrough:
        raise ValueError("float32 is the input format itself: it has no codec vectors")
    codes = np.arange(1 << spec.bits, dtype=np.uint32).astype(spec.code_dtype)
    decoded = decode(codes, spec)
    vals = np.unique(np.abs(decoded[np.isfinite(decoded)]).astype(np.float64))
    mids = (vals[:-1] + vals[1:]) / 2
    top = 2.0 ** (spec.emax - spec.mbits)
    past = np.array([vals[-1] + top / 2, vals[-1] * 2, float(np.finfo(np.float32).max)])
    with np.errstate(over="ignore"):  # past-max probes of E8M0 overflow float32: they become inf, also a probe
        core = np.concatenate([vals, mids, past]).astype(np.float32)
        up = np.nextafter(core, F32(np.inf))
    down = np.nextafter(core, F32(0))
    sub = np.array([2.0**-149, 2.0**-126 - 2.0**-149], np.float32)
    mag = np.unique(np.concatenate([core, up, down, sub, np.array([np.inf], np.float32)]))
    inputs = np.concatenate([mag, -mag, np.array([np.nan], np.float32)]).astype(np.float32)
    return codes, decoded, inputs


def _element_arrays(fmt) -> tuple[dict, list[tuple[str, dict, int | None, dict]]]:
    spec = get_format(fmt)
    codes, decoded, inputs = element_cases(spec)
    enc: dict[str, np.ndarray] = {"input": inputs}
    for mode in ("rne", "rtz", "rup", "rdown", "rna"):
        enc[f"codes_{mode}"] = encode(inputs, spec, mode)
        enc[f"codes_{mode}_nosat"] = encode(inputs, spec, mode, saturate=False)
    head = {"element": spec.name, "conventions": "SPEC.md §2: NVIDIA conversions; _nosat = __NV_NOSAT"}
    return head, [("decode every code", {}, None, {"codes": codes, "decoded": decoded}),
                  ("encode grid, midpoints and neighbours", {"rounding": ["rne", "rtz", "rup", "rdown", "rna"],
                                                              "saturate": [True, False]}, None, enc)]


#: Orders of the two-level decode x̂ from code value e, block scale s and tensor amax.  (``pts_s`` is the
#: order fpsim 0.1 called "torchao"; torchao's NVFP4 as a whole is ``convention="torchao"``.)
DEQUANTIZE_ORDERS = {
    "fpsim": "fl(fl(e·s)·S_dec), S_dec = fl(1/S_enc)  (SPEC §4; fpsim's own order, not Transformer Engine's)",
    "te_cuda": "fl(e·fl(fl(s·amax)·fl(1/2688)))  (Transformer Engine's CUDA dequantize_fp4_kernel)",
    "pts_s": "fl(e·fl(pts·s)), pts = fl(amax/2688)  (the decode order of torchao and ModelOpt)",
}


def decode_two_level(codes: np.ndarray, scales: np.ndarray, amax_rows: np.ndarray, sch: BlockScheme,
                     order: str = "fpsim") -> np.ndarray:
    """Decoded values [R, nb·BC] of two-level codes [R, nb·BC] and scale bytes [R, nb] in :data:`DEQUANTIZE_ORDERS`.

    ``amax_rows``: the tensor amax of each row (float32, [R]); unused without a tensor scale.
    """
    el, sc = sch.element, sch.scale
    R, nb = scales.shape
    e = el.decode_table()[codes.astype(np.int64)].reshape(R, nb, -1)
    s = sc.decode_table()[scales.astype(np.int64)][:, :, None]
    num = F32(el.max) * F32(256.0 if sch.four_over_six else sc.max)
    with np.errstate(all="ignore"):
        if not sch.tensor_scale:
            return (e * s).astype(F32).reshape(R, -1)
        am = np.asarray(amax_rows, F32).reshape(R, 1, 1)
        if order == "pts_s":
            return (e * ((am / num).astype(F32) * s)).astype(F32).reshape(R, -1)
        if order == "te_cuda":
            return (e * ((s * am).astype(F32) * (F32(1.0) / num))).astype(F32).reshape(R, -1)
        s_dec = (F32(1.0) / tensor_s_enc(am, num)).astype(F32)
        return ((e * s).astype(F32) * s_dec).astype(F32).reshape(R, -1)


def _case_bytes(x: np.ndarray, sch: BlockScheme, kw: dict, scale_min, order: str, convention=None):
    """(codes [R, nb·BC] one per byte, packed or None, scales, amax, decoded in x's shape, axis) of one case."""
    if convention is not None:  # a producer's bytes and values (fpsim.conventions)
        q = quantize(x, sch, convention=convention, **kw)
        codes = unpack_fp4(q.data)
        return codes, q.data, q.scales, np.asarray(q.amax, F32), q.dequantize(), q.axis
    if scale_min is None:
        q = quantize(x, sch, **kw)
        R = math.prod(q.data.shape[:-1])
        codes = unpack_fp4(q.data) if sch.element.bits == 4 else q.data
        packed = q.data if sch.element.bits == 4 else None
        if order == "fpsim" or sch.kind is not Kind.TWO_LEVEL:
            return codes, packed, q.scales, np.asarray(q.amax, F32), q.dequantize(), q.axis
        scales, amax, axis = np.asarray(q.scales), np.asarray(q.amax, F32), q.axis
        codes2, scales2 = codes.reshape(R, -1), scales.reshape(R, -1)
    else:
        axis = kw.get("axis", -1) % x.ndim
        s2 = sch.replace(block=tuple(kw["block"])) if "block" in kw else sch
        X = np.ascontiguousarray(np.moveaxis(x, axis, -1)).reshape(-1, x.shape[axis])
        view = TensorView(X, s2.block)
        nan = kw.get("nan_amax", "propagate")
        codes2, scales2 = model_bytes(view, s2, Convention(nan_amax=nan, scale_min=float(scale_min)))
        rows = view.amax_rows(nan, "keep", bool(s2.per_row_scale))
        amax = rows.copy() if s2.per_row_scale else np.asarray(rows[0] if rows.size else F32(0), F32)
        if not s2.tensor_scale:
            amax = np.asarray(np.nan, F32)
        lead = tuple(np.moveaxis(x, axis, -1).shape[:-1])
        codes, scales = codes2.reshape(lead + (-1,)), scales2.reshape(lead + (-1,))
        packed = pack_fp4(codes) if sch.element.bits == 4 else None
    rows = np.broadcast_to(np.asarray(amax, F32).reshape(-1), (codes2.shape[0],))
    dec = decode_two_level(codes2, scales2, rows, sch, order)[:, : x.shape[axis]]
    moved = tuple(np.moveaxis(x, axis, -1).shape)
    return codes, packed, scales, amax, np.moveaxis(dec.reshape(moved), -1, axis), axis


def _scheme_arrays(sch: BlockScheme, rules, scale_min=None, order: str = "fpsim", nan_amax: str = "propagate",
                   convention=None):
    """Manifest head and cases ``(name, kwargs, axis, arrays)`` of a block scheme (one set per scale rule)."""
    cases = []
    many = len(rules) > 1
    for rule in rules:
        for name, x, kw in vector_cases(sch):
            kw = dict(kw, scale_rule=rule) if rule is not None else kw
            if nan_amax != "propagate":
                kw = dict(kw, nan_amax=nan_amax)
            if convention is not None and ("block" in kw or "nan_amax" in kw):
                continue  # producers write 1x16 blocks and take NaN into every amax
            codes, packed, scales, amax, decoded, axis = _case_bytes(x, sch, kw, scale_min, order, convention)
            R = math.prod(codes.shape[:-1])
            arrays = {"input": x, "codes": codes}
            if packed is not None:
                arrays["packed"] = packed
            arrays["scales"] = scales
            if sch.scale.bits == 8:
                arrays["scales_swizzled"] = swizzle_scales(np.ascontiguousarray(scales).reshape(R, -1))
            arrays["amax"] = amax
            arrays["decoded"] = decoded
            kwj = {k: (list(v) if isinstance(v, tuple) else v) for k, v in kw.items()}
            cases.append((f"{name} [{rule}]" if many else name, kwj, axis, arrays))
    conv = _CONVENTIONS
    if scale_min is not None:
        conv = conv.replace("no lower scale clamp", f"block scale clamped to ≥ {scale_min:g} before encoding")
    if order != "fpsim":
        conv += f"; decoded = {DEQUANTIZE_ORDERS[order]}"
    head = {"scheme": sch.to_json(), "conventions": conv, "scale_min": scale_min, "dequantize_order": order}
    if convention is not None:
        c = get_convention(convention)
        head.update(conventions=f"producer convention {c.name} (docs/spec.md §4.1; {c.source}); 2-D tiles and "
                    "ignored NaN left out", convention=c.name, dequantize_order=c.decode_rule.value)
    return head, cases


def write_vectors(scheme=None, out_dir=None, *, element=None, scale_rules=None, scale_min: float | None = None,
                  dequantize_order: str = "fpsim", nan_amax: str = "propagate", convention: str | None = None) -> dict:
    """Write golden vectors into ``out_dir`` (created, with ``bin/``, only once every array is computed).

    Either block-scheme vectors (``scheme``: the cases of :func:`vector_cases`) or element-codec vectors
    (``element``: :func:`element_cases`, encoded under every rounding mode with and without saturation).
    ``scale_rules``: for MX schemes, the E8M0 rules to write (``"all"`` or a list; default the scheme's);
    with several, each case name ends in `` [rule]``.  ``scale_min``: two-level schemes, clamp the block scale
    to at least this before encoding (torchao: ``2**-6``); ``dequantize_order``: how ``decoded`` is computed
    (:data:`DEQUANTIZE_ORDERS`; two-level schemes); ``nan_amax="ignore"``: every case ignores NaN in its
    amaxes (SPEC §9); ``convention``: a producer's bytes and decoded values (:mod:`fpsim.conventions`, NVFP4:
    ``"torchao"`` gives torchao's own, checked against torchao in tests/test_producers.py; the 2-D-tile and
    ignored-NaN cases are left out).  ``scale_min`` with ``dequantize_order="pts_s"`` is *not* torchao: it is
    fpsim's scale order with torchao's clamp and decode order.  Returns the manifest.

    Layout (every file written atomically through :func:`fpsim.io.atomic_write`)::

        out_dir/manifest.json           scheme or element, conventions, per case: name, kwargs, files
        out_dir/vectors.npz             every array, keyed "<case slug>.<field>"
        out_dir/bin/<slug>.<field>.bin  the same arrays as raw little-endian bytes, C order

    The manifest lists for each file its ``dtype`` (numpy name, little-endian),
    ``shape`` and ``sha256``.  Scheme fields: ``input`` (float32, the original shape),
    ``codes`` (uint8, one code per byte, quantized axis last and padded to whole
    blocks: [rows, blocks·block_width]), ``packed`` (4-bit elements: two codes
    per byte, element 2j in the low nibble), ``scales`` (raw scale bytes
    [rows, blocks], or float32 for FP32 scales), ``scales_swizzled`` (E4M3/E8M0
    scales in the Blackwell layout, SPEC §4), ``amax`` (float32 tensor amax; NaN
    where the scheme has none), ``decoded`` (float32, original shape).  Element fields: ``codes`` /
    ``decoded`` (every code), ``input`` and ``codes_<mode>[_nosat]``.
    A refusal (bad scheme, format or rule) raises ``ValueError`` before anything is created.
    """
    import fpsim

    if (scheme is None) == (element is None):
        raise ValueError("give a block scheme or an element format, not both or neither")
    if out_dir is None:
        raise ValueError("out_dir is required")
    if element is not None:
        head, cases = _element_arrays(element)
    else:
        sch = get_scheme(scheme)
        if scale_rules is not None and sch.kind is not Kind.POW2:
            raise ValueError(f"scale rules apply to MX (E8M0-scaled) schemes, not {sch.name}")
        if scale_rules is None:
            rules = [None]
        elif scale_rules == "all":
            rules = [r.value for r in ScaleRule]
        else:
            rules = [ScaleRule.parse(r).value for r in ([scale_rules] if isinstance(scale_rules, str) else
                                                          scale_rules)]
        if dequantize_order not in DEQUANTIZE_ORDERS:
            raise ValueError(f"unknown dequantize order {dequantize_order!r}; known: {', '.join(DEQUANTIZE_ORDERS)}")
        if (scale_min is not None or dequantize_order != "fpsim") and sch.kind is not Kind.TWO_LEVEL:
            raise ValueError(f"scale_min and dequantize_order apply to two-level (E4M3-scaled) schemes, not {sch.name}")
        if scale_min is not None and sch.four_over_six:
            raise ValueError("scale_min cannot be combined with four-over-six")
        if nan_amax not in ("propagate", "ignore"):
            raise ValueError("nan_amax must be 'propagate' or 'ignore'")
        if convention is not None:
            if scale_min is not None or dequantize_order != "fpsim" or nan_amax != "propagate" or rules != [None]:
                raise ValueError("a convention fixes the scale clamp, decode order and NaN policy: give it alone")
            lower(sch, convention=convention)  # refuses unknown names and schemes the producers do not write
        head, cases = _scheme_arrays(sch, rules, scale_min, dequantize_order, nan_amax, convention)
    manifest: dict = {"format": _VEC_TAG, "fpsim_version": fpsim.__version__, **head, "byteorder": "little",
                      "cases": []}
    blobs: dict[str, bytes] = {}
    npz: dict[str, np.ndarray] = {}
    for name, kw, axis, arrays in cases:
        slug = _slug(name)
        files = {}
        for fld, a in arrays.items():
            a = np.ascontiguousarray(a)
            raw = a.astype(a.dtype.newbyteorder("<"), copy=False).tobytes()
            rel = f"bin/{slug}.{fld}.bin"
            blobs[rel] = raw
            files[fld] = {"path": rel, "dtype": a.dtype.name, "shape": list(a.shape),
                          "sha256": hashlib.sha256(raw).hexdigest()}
            npz[f"{slug}.{fld}"] = a
        manifest["cases"].append({"name": name, "slug": slug, "kwargs": kw, "axis": axis, "files": files})
    _write_tree(Path(out_dir), blobs, npz, manifest)
    return manifest


def _write_tree(out: Path, blobs: dict[str, bytes], npz: dict[str, np.ndarray], manifest: dict) -> None:
    """Create ``out`` and ``out/bin`` and write every file; a failure removes the directories it created."""
    made = [d for d in (out, out / "bin") if not d.exists()]
    try:
        (out / "bin").mkdir(parents=True, exist_ok=True)
        for rel, raw in blobs.items():
            atomic_write(out / rel, raw)
        atomic_write(out / "vectors.npz", lambda f: np.savez(f, **npz))
        atomic_write(out / "manifest.json", dumps(manifest))  # last: a directory with a manifest is complete
    except (OSError, OutputError) as e:
        for d in reversed(made):
            shutil.rmtree(d, ignore_errors=True)
        raise OutputError(str(e).splitlines()[0] if str(e) else f"{out}: cannot write") from None


def read_vectors(vec_dir, source: str = "bin") -> tuple[dict, dict[str, dict[str, np.ndarray]]]:
    """Read vectors written by :func:`write_vectors`: ``(manifest, {case name: {field: array}})``.

    ``source="bin"`` reads the raw little-endian files through the manifest
    (checking size and sha256, as a C++/Rust reader would); ``"npz"`` reads
    ``vectors.npz`` (never unpickling).
    """
    d = Path(vec_dir)
    try:
        manifest = json.loads((d / "manifest.json").read_text())
    except FileNotFoundError:
        raise ValueError(f"{d}: no manifest.json (not a vectors directory)") from None
    if manifest.get("format") != _VEC_TAG:
        raise ValueError(f"{d}: unknown vectors format {manifest.get('format')!r}")
    cases: dict[str, dict[str, np.ndarray]] = {}
    if source == "npz":
        with np.load(d / "vectors.npz", allow_pickle=False) as z:
            for c in manifest["cases"]:
                cases[c["name"]] = {f: z[f"{c['slug']}.{f}"] for f in c["files"]}
        return manifest, cases
    if source != "bin":
        raise ValueError("source must be 'bin' or 'npz'")
    for c in manifest["cases"]:
        arrs = {}
        for fld, info in c["files"].items():
            raw = (d / info["path"]).read_bytes()
            if hashlib.sha256(raw).hexdigest() != info["sha256"]:
                raise ValueError(f"{info['path']}: sha256 does not match the manifest")
            dt = np.dtype(info["dtype"]).newbyteorder("<")
            n = math.prod(info["shape"])
            if len(raw) != n * dt.itemsize:
                raise ValueError(f"{info['path']}: {len(raw)} bytes, expected {n * dt.itemsize}")
            arrs[fld] = np.frombuffer(raw, dt).astype(dt.newbyteorder("=")).reshape(info["shape"])
        cases[c["name"]] = arrs
    return manifest, cases
