"""Quantized checkpoints as their producers write them: a packed weight and its scales read as ONE tensor.

:func:`find_quantized` recognises, among the tensors of safetensors checkpoints (a file, or the shards of one
directory), the layouts of compressed-tensors (llm-compressor), NVIDIA ModelOpt and torchao (docs/spec.md §11):

=====================  ===============================================  ==========================================
producer / format      tensors of module ``P``                          global scale stored
=====================  ===============================================  ==========================================
compressed-tensors     ``P.weight_packed`` U8 [R, C/2], ``P.weight_scale``  ``P.weight_global_scale`` F32 [1]: the
NVFP4                  F8_E4M3 [R, C/16]                                ENCODE scale 2688/amax
compressed-tensors     ``P.weight_packed`` U8 [R, C/2], ``P.weight_scale``  none
MXFP4                  U8 (E8M0) [R, C/32]
MXFP8 (either)         ``P.weight`` F8_E4M3 [R, C], ``P.weight_scale`` U8   none
                       (E8M0) [R, C/32]
ModelOpt NVFP4         ``P.weight`` U8 [R, C/2], ``P.weight_scale``         ``P.weight_scale_2`` F32 []: the DECODE
                       F8_E4M3 [R, C/16]                                scale amax/2688
torchao NVFP4          ``P._weight_qdata`` U8 [R, C/2],                    ``P._weight_per_tensor_scale`` F32 []:
                       ``P._weight_scale`` F8_E4M3, swizzled (metadata)  the DECODE scale amax/2688
FP8 (either)           ``P.weight`` F8_E4M3 [R, C], ``P.weight_scale`` F32  none (the scale is per tensor or
                       or BF16                                          per row)
=====================  ===============================================  ==========================================

All pack two E2M1 codes per byte, element 2j in the low nibble.  Activation scales (``input_global_scale``,
``input_scale``) are attached to their module's tensor; every other scale tensor of a recognised checkpoint
(``k_scale``, an orphan ``weight_scale``) is set aside, never analysed as a weight.

:func:`decode_quantized` decodes as the producer's own dequantize does, through its convention in
:mod:`fpsim.conventions` (SPEC §4.1): compressed-tensors divides, ``code · (f32(s) / g)``, ModelOpt multiplies,
``code · (f32(s) · g2)`` and reads code 0x8 (−0) as +0; both then cast to the checkpoint's dtype (``torch_dtype``
of ``config.json``: BF16 here, round to nearest even).  Nothing is unpickled; a tensor is read whole only when
its report is made (one module's tensors at a time).
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .errors import InputError, json_object, printable
from .readers import TensorRef

__all__ = ["QuantizedGroup", "find_quantized", "decode_quantized", "read_codes", "read_global", "SCALE_SUFFIXES"]

#: Names of scale tensors (the part after the module's dot): never weights.
SCALE_SUFFIXES = ("weight_scale", "weight_global_scale", "weight_scale_2", "input_scale", "input_global_scale",
                  "output_scale", "k_scale", "v_scale", "q_scale", "weight_zero_point", "input_zero_point",
                  "weight_g_idx", "pre_quant_scale", "_weight_scale", "_weight_per_tensor_scale",
                  "_weight_act_per_tensor_scale")
_METADATA_BYTES = 1 << 22  # config.json / hf_quant_config.json larger than this are not read (4 MiB)


@dataclass
class QuantizedGroup:
    """One quantized tensor of a checkpoint: its parts (``role`` → :class:`TensorRef`) and how to read them.

    ``producer`` is ``"compressed-tensors"`` or ``"modelopt"``; ``fmt`` ``"nvfp4"``, ``"mxfp4"`` or ``"fp8"``;
    ``name`` the logical tensor (``P.weight``); ``directory`` the checkpoint's folder; ``dtype`` the dtype the
    producer decodes to (``"bfloat16"``, ``"float16"`` or ``"float32"``); ``error`` a one-line reason when the
    parts do not fit together (shapes, dtypes)."""

    producer: str
    fmt: str
    name: str
    directory: str
    parts: dict[str, TensorRef]
    dtype: str = "float32"
    error: str | None = None
    notes: list[str] = field(default_factory=list)
    swizzled: bool = False  # block scales stored in the Blackwell tensor-core layout (torchao's default)

    @property
    def block(self) -> int | None:
        return {"nvfp4": 16, "mxfp4": 32, "mxfp8": 32}.get(self.fmt)

    @property
    def global_kind(self) -> str | None:
        """How the global scale is stored: ``"encode"`` (2688/amax) or ``"decode"`` (amax/2688)."""
        if self.fmt != "nvfp4":
            return None
        return "encode" if self.producer == "compressed-tensors" else "decode"


def _metadata(directory: Path) -> tuple[dict, dict, list[str]]:
    """(config.json, hf_quant_config.json, notes) of a checkpoint folder; a missing file is {}, a bad one a note."""
    out, notes = [], []
    for name in ("config.json", "hf_quant_config.json"):
        p = directory / name
        try:
            st = os.stat(p)
        except OSError:
            out.append({})
            continue
        if not stat.S_ISREG(st.st_mode) or st.st_size > _METADATA_BYTES:
            notes.append(f"{printable(str(p))}: not read (not a regular file, or over 4 MiB)")
            out.append({})
            continue
        try:
            with open(p, "rb") as f:
                out.append(json_object(f.read(_METADATA_BYTES), f"{printable(str(p))}: corrupt JSON"))
        except (OSError, ValueError) as e:
            notes.append(f"{e}" if isinstance(e, ValueError) else f"{printable(str(p))}: cannot read ({e.strerror})")
            out.append({})
    return out[0], out[1], notes


def _model_dtype(config: dict) -> str:
    d = config.get("torch_dtype", config.get("dtype"))
    return {"bfloat16": "bfloat16", "float16": "float16"}.get(d if isinstance(d, str) else "", "float32")


def _producer_hint(config: dict, hf_quant: dict) -> str | None:
    qc = config.get("quantization_config")
    method = qc.get("quant_method") if isinstance(qc, dict) else None
    if hf_quant or method == "modelopt":
        return "modelopt"
    if method == "compressed-tensors":
        return "compressed-tensors"
    return None


def _split(name: str) -> tuple[str, str]:
    prefix, _, leaf = name.rpartition(".")
    return prefix, leaf


def _classify(prefix: str, leaves: dict[str, TensorRef], hint: str | None) -> tuple[str, str, str] | None:
    """(producer, format, the leaf holding the codes) of one module's tensors, or None when it is not quantized."""
    if "_weight_qdata" in leaves and "_weight_scale" in leaves and "_weight_per_tensor_scale" in leaves:
        return "torchao", "nvfp4", "_weight_qdata"
    scale = leaves.get("weight_scale")
    if "weight_packed" in leaves and leaves["weight_packed"].dtype == np.uint8 and scale is not None:
        return "compressed-tensors", ("nvfp4" if "weight_global_scale" in leaves else "mxfp4"), "weight_packed"
    w = leaves.get("weight")
    if w is None or scale is None:
        return None
    if w.dtype == np.uint8 and "weight_scale_2" in leaves:
        return "modelopt", "nvfp4", "weight"
    if w.dtype.name == "float8_e4m3fn" and scale.dtype == np.uint8:
        return hint or "compressed-tensors", "mxfp8", "weight"
    if w.dtype.name == "float8_e4m3fn" and scale.dtype.kind in "fV" and scale.dtype.itemsize in (2, 4):
        return hint or "compressed-tensors", "fp8", "weight"
    return None


def _torchao_metadata(g: QuantizedGroup) -> None:
    """Read torchao's per-tensor JSON in the file's ``__metadata__`` (torchao/prototype/safetensors): whether the
    block scales are swizzled, and the dtype it decodes to; unreadable metadata is a note, the defaults kept."""
    from .safetensors import read_header

    src = g.parts["codes"].source
    try:
        raw = read_header(src)[1].get(g.name)
        meta = json_object(raw.encode() if isinstance(raw, str) else b"", f"{src}: {g.name}: torchao metadata")
        data = meta.get("_data") if isinstance(meta.get("_data"), dict) else {}
    except (InputError, OSError, ValueError) as e:
        g.notes.append(f"{e}; its block scales are read as swizzled")
        g.swizzled = True
        return
    g.swizzled = data.get("is_swizzled_scales") is not False
    orig = data.get("orig_dtype")
    d = orig.get("_data") if isinstance(orig, dict) else None
    g.dtype = {"bfloat16": "bfloat16", "float16": "float16", "float32": "float32"}.get(d, g.dtype)


def _check(g: QuantizedGroup) -> str | None:
    """Why the parts of ``g`` do not fit together, or None."""
    codes = g.parts["codes"]
    scale = g.parts["scale"]
    for r in g.parts.values():
        if r.error:
            return r.error
    if len(codes.shape) != 2:
        return f"{codes.name}: rank {len(codes.shape)}, a quantized weight is 2-D"
    rows, cols = codes.shape
    if g.fmt == "fp8":
        ok = scale.shape in ((), (1,), (rows, 1), (rows,))
        return None if ok else f"{scale.name}: shape {list(scale.shape)} is not per-tensor or per-row for {rows} rows"
    want_scale = "float8_e4m3fn" if g.fmt == "nvfp4" else "uint8"
    if scale.dtype.name != want_scale:
        return f"{scale.name}: dtype {scale.dtype.name}, {g.producer} {g.fmt.upper()} stores {want_scale}"
    elements = cols if g.fmt == "mxfp8" else 2 * cols  # 4-bit codes: two per byte
    blocks = -(-elements // g.block)
    if g.swizzled:
        want = 128 * -(-rows // 128) * 4 * -(-blocks // 4)
        n = int(np.prod(scale.shape))
        return None if n == want else (f"{scale.name}: {n} swizzled scale bytes, expected {want} for [{rows}, "
                                       f"{blocks}] blocks")
    if tuple(scale.shape) != (rows, blocks):
        return (f"{scale.name}: shape {list(scale.shape)}, expected [{rows}, {blocks}] for {elements} elements in "
                f"blocks of {g.block}")
    glob_ = g.parts.get("global")
    if g.fmt == "nvfp4" and (glob_ is None or glob_.dtype != np.float32 or int(np.prod(glob_.shape)) != 1):
        return f"{g.name}: the global scale is missing or not one float32"
    return None


def find_quantized(refs: list[TensorRef]) -> tuple[list[QuantizedGroup], list[TensorRef], list[str], list[str]]:
    """Split ``refs`` into quantized tensors and the rest: ``(groups, float_refs, set_aside, notes)``.

    Tensors are grouped by checkpoint folder (the shards of one model) and module prefix.  ``set_aside`` names
    every scale tensor that belongs to no group of a checkpoint holding quantized tensors (never analysed);
    ``notes`` are one-line messages (unreadable metadata)."""
    by_dir: dict[str, list[TensorRef]] = {}
    for r in refs:
        by_dir.setdefault(str(Path(r.source).parent) if r.source.endswith(".safetensors") else r.source,
                          []).append(r)
    groups: list[QuantizedGroup] = []
    rest: list[TensorRef] = []
    aside: list[str] = []
    notes: list[str] = []
    for directory, drefs in by_dir.items():
        if not all(r.source.endswith(".safetensors") for r in drefs):
            rest += drefs
            continue
        config, hf_quant, mnotes = _metadata(Path(directory))
        hint = _producer_hint(config, hf_quant)
        modules: dict[str, dict[str, TensorRef]] = {}
        for r in drefs:
            p, leaf = _split(r.name)
            modules.setdefault(p, {})[leaf] = r
        used: set[int] = set()
        dgroups = []
        for prefix, leaves in modules.items():
            kind = _classify(prefix, leaves, hint)
            if kind is None:
                continue
            producer, fmt, code_leaf = kind
            parts = {"codes": leaves[code_leaf], "scale": leaves["weight_scale" if "weight_scale" in leaves
                                                                  else "_weight_scale"]}
            for role, leaf in (("global", "weight_global_scale"), ("global", "weight_scale_2"),
                               ("global", "_weight_per_tensor_scale"), ("input", "input_global_scale"),
                               ("input", "input_scale")):
                if leaf in leaves:
                    parts[role] = leaves[leaf]
            g = QuantizedGroup(producer, fmt, f"{prefix}.weight" if prefix else "weight", directory, parts,
                               _model_dtype(config))
            if producer == "torchao":
                _torchao_metadata(g)
            g.error = _check(g)
            dgroups.append(g)
            used.update(id(r) for r in parts.values())
        if dgroups:
            notes += mnotes
        for r in drefs:
            if id(r) in used:
                continue
            if dgroups and _split(r.name)[1] in SCALE_SUFFIXES:
                aside.append(r.key)
            else:
                rest.append(r)
        groups += dgroups
    return groups, rest, aside, notes


def read_global(g: QuantizedGroup) -> float | None:
    """The global scale of ``g`` as stored (float32 as a float), or None when it has none or its parts do not fit."""
    if "global" not in g.parts or g.error:
        return None
    return float(np.asarray(g.parts["global"].load(), np.float32).reshape(-1)[0])


def read_codes(g: QuantizedGroup) -> tuple[np.ndarray, np.ndarray, float | None, float | None]:
    """(codes, scale bytes or float32 scales, global scale as stored, input scale as stored) of ``g``.

    codes: one uint8 code per element, [R, C] (4-bit codes unpacked, element 2j from the low nibble); the scale of
    an NVFP4/MXFP4 group is its raw bytes [R, C/block]; of FP8 the float32 scales."""
    packed = g.parts["codes"].load()
    if g.fmt == "fp8":
        codes = np.ascontiguousarray(packed).view(np.uint8)
        scale = np.asarray(g.parts["scale"].load(), np.float32)
    elif g.fmt == "mxfp8":
        codes = np.ascontiguousarray(packed).view(np.uint8)
        scale = np.ascontiguousarray(g.parts["scale"].load()).view(np.uint8)
    else:
        packed = np.asarray(packed, np.uint8)
        codes = np.empty((packed.shape[0], 2 * packed.shape[1]), np.uint8)
        codes[:, 0::2] = packed & 0x0F  # element 2j: low nibble (every producer's pack order)
        codes[:, 1::2] = packed >> 4
        scale = np.ascontiguousarray(g.parts["scale"].load()).view(np.uint8)
        if g.swizzled:
            from ..scaling import unswizzle_scales

            scale = unswizzle_scales(scale, codes.shape[0], -(-codes.shape[1] // g.block))
    glob_ = read_global(g)
    inp = g.parts.get("input")
    inp_v = float(np.asarray(inp.load(), np.float32).reshape(-1)[0]) if inp is not None and inp.error is None \
        and inp.dtype == np.float32 and inp.shape in ((), (1,)) else None
    return codes, scale, glob_, inp_v


def _cast(x: np.ndarray, dtype: str) -> np.ndarray:
    """float32 ``x`` rounded to ``dtype`` (BF16/FP16: nearest even, as torch's ``.to``), back as float32."""
    if dtype == "float32":
        return x
    from ..dispatch import decode, encode

    name = "bf16" if dtype == "bfloat16" else "fp16"
    return decode(encode(x, name), name)


def decode_quantized(g: QuantizedGroup, codes: np.ndarray, scale: np.ndarray, glob_: float | None) -> np.ndarray:
    """The float32 values ``g``'s producer decodes its tensor to: NVFP4 through :func:`fpsim.conventions.decode`
    with the producer's convention (SPEC §4.1), then the cast to the checkpoint's dtype; MXFP4, MXFP8 and FP8 as
    ``value · scale`` (ModelOpt's FP8 scale cast to that dtype first), then the same cast."""
    from ..dispatch import decode

    f32 = np.float32
    if g.fmt == "fp8":
        s = scale.reshape(-1, 1) if scale.size > 1 else scale.reshape(())
        if g.producer == "modelopt":  # FP8QTensor.dequantize: data.to(dtype) * scale.to(dtype)
            s = _cast(s.astype(f32), g.dtype)
        return _cast(decode(codes, "e4m3") * s.astype(f32), g.dtype)
    pad = scale.shape[1] * g.block - codes.shape[1]  # codes padded to whole blocks (zeros), cut back after
    padded = np.pad(codes, ((0, 0), (0, pad))) if pad else codes
    if g.fmt == "nvfp4":
        from ..conventions import decode as convention_decode

        values = convention_decode(padded, scale, glob_, g.producer)
    else:  # MXFP4 / MXFP8: element value · 2^(scale byte − 127), exact in float32 (0xFF: NaN)
        per_elem = np.repeat(decode(scale, "e8m0"), g.block, axis=1)
        values = decode(padded, "e2m1" if g.fmt == "mxfp4" else "e4m3") * per_elem
    return _cast(values[:, : codes.shape[1]], g.dtype)
