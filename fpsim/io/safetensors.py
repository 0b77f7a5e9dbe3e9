"""The one safetensors reader and writer of fpsim (no torch, no pickle, checked against the official library).

File layout (the format of the ``safetensors`` package): 8-byte little-endian header length ``n``, ``n``
bytes of UTF-8 JSON (an object: ``"__metadata__"`` → str→str, every other key → ``{"dtype", "shape",
"data_offsets": [start, end]}`` relative to the end of the header), then the raw little-endian data.

Sub-byte dtypes are stored packed, as the format defines: ``F4`` (E2M1) two elements per byte, element
``2j`` in the low nibble (the layout torch's ``float4_e2m1fn_x2`` and NVIDIA's ``__nv_fp4x2`` use);
``F6_E2M3`` / ``F6_E3M2`` four elements per three bytes, element ``i`` in bits ``6i .. 6i+5`` of the
little-endian bit stream.  The header shape counts elements; ``end - start`` is
``prod(shape) · bits / 8`` bytes and must be whole (the official library rejects odd F4 counts).

:func:`parse_header` is used by :func:`fpsim.io.open_tensors` and by :func:`fpsim.io.load_quantized`: a
header that is not a JSON object, nests too deep, holds ``Infinity``/``NaN`` or lies about sizes is an
:class:`InputError` naming the file; a malformed *entry* makes only that tensor unreadable.
"""

from __future__ import annotations

import json
import math
import os
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .errors import InputError, json_object, printable
from .files import atomic_write

__all__ = ["SAFETENSORS_DTYPES", "Entry", "parse_header", "read_header", "read_entry", "write_safetensors"]

MAX_HEADER = 100 * 1024 * 1024  # the official library's limit as well


def _dtypes() -> dict[str, tuple[np.dtype, int]]:
    import ml_dtypes

    d = {
        "F64": ("<f8", 64), "F32": ("<f4", 32), "F16": ("<f2", 16), "BF16": (ml_dtypes.bfloat16, 16),
        "F8_E4M3": (ml_dtypes.float8_e4m3fn, 8), "F8_E5M2": (ml_dtypes.float8_e5m2, 8),
        "F8_E4M3FNUZ": (ml_dtypes.float8_e4m3fnuz, 8), "F8_E5M2FNUZ": (ml_dtypes.float8_e5m2fnuz, 8),
        "F8_E8M0": (ml_dtypes.float8_e8m0fnu, 8), "F6_E2M3": (ml_dtypes.float6_e2m3fn, 6),
        "F6_E3M2": (ml_dtypes.float6_e3m2fn, 6), "F4": (ml_dtypes.float4_e2m1fn, 4),
        "C64": ("<c8", 64), "I64": ("<i8", 64), "I32": ("<i4", 32), "I16": ("<i2", 16), "I8": ("i1", 8),
        "U64": ("<u8", 64), "U32": ("<u4", 32), "U16": ("<u2", 16), "U8": ("u1", 8), "BOOL": ("?", 8),
    }
    return {k: (np.dtype(v), b) for k, (v, b) in d.items()}


_TABLE = _dtypes()
#: safetensors dtype code → numpy dtype of the unpacked elements.
SAFETENSORS_DTYPES: dict[str, np.dtype] = {k: v[0] for k, v in _TABLE.items()}
_CODE = {v[0]: k for k, v in _TABLE.items()}


@dataclass(frozen=True)
class Entry:
    """One tensor of a header: element dtype, shape, byte range in the file; ``error`` when unreadable."""

    name: str
    code: str
    dtype: np.dtype
    shape: tuple[int, ...]
    offset: int  # absolute byte offset of the data in the file
    nbytes: int
    bits: int
    error: str | None = None


def _int(v, what: str) -> int:
    if type(v) is not int:  # bool and float (1e400 parses as inf) are not sizes
        raise ValueError(f"{what} is not an integer ({json.dumps(v)[:40] if _dumpable(v) else type(v).__name__})")
    return v


def _dumpable(v) -> bool:
    try:
        json.dumps(v)
        return True
    except (TypeError, ValueError, RecursionError):
        return False


def _entry(path, name: str, info, base: int, size: int) -> Entry:
    shown = printable(name)
    try:
        if not isinstance(info, dict):
            raise ValueError("entry is not a JSON object")
        code = info.get("dtype")
        if not isinstance(code, str) or code not in _TABLE:  # a list or object is not hashable: test the type first
            raise ValueError(f"unsupported dtype {printable(str(code))[:40]!r}")
        dt, bits = _TABLE[code]
        shape = info.get("shape")
        offs = info.get("data_offsets")
        if not isinstance(shape, list) or not isinstance(offs, list) or len(offs) != 2:
            raise ValueError("shape must be a list and data_offsets a pair")
        shape = tuple(_int(s, "a dimension") for s in shape)
        if any(s < 0 for s in shape):
            raise ValueError(f"negative dimension in shape {list(shape)}")
        start, end = (_int(o, "an offset") for o in offs)
        numel = math.prod(shape)  # Python ints: no int64 overflow
        if numel * bits % 8:
            raise ValueError(f"{numel} elements of {bits} bits are not a whole number of bytes")
        want = numel * bits // 8
        if not 0 <= start <= end or end - start != want:
            raise ValueError(f"data_offsets {[start, end]} do not hold shape {list(shape)} of {code}")
        if base + end > size:
            raise ValueError("data is truncated (offsets run past the end of the file)")
    except ValueError as e:
        return Entry(shown, "", np.dtype("u1"), (), 0, 0, 8, error=f"{path}: tensor {shown!r}: {e}")
    return Entry(shown, code, dt, shape, base + start, want, bits)


def parse_header(raw: bytes, path, size: int) -> tuple[list[Entry], dict]:
    """Entries and ``__metadata__`` of a header ``raw`` (the JSON bytes) of a file of ``size`` bytes."""
    header = json_object(raw, f"{path}: corrupt safetensors header", InputError)
    meta = header.pop("__metadata__", {}) or {}
    if not isinstance(meta, dict):
        raise InputError(f"{path}: corrupt safetensors header (__metadata__ is not an object)")
    base = 8 + len(raw)
    return [_entry(path, str(k), v, base, size) for k, v in header.items()], meta


def read_header(path: str | os.PathLike) -> tuple[list[Entry], dict]:
    """Open ``path`` once and parse its header (see :func:`parse_header`)."""
    p = Path(path)
    with open(p, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        head = f.read(8)
        if len(head) < 8:
            raise InputError(f"{p}: truncated safetensors file (no header length)")
        (n,) = struct.unpack("<Q", head)
        if n > min(MAX_HEADER, size - 8):
            raise InputError(f"{p}: not a safetensors file (header length {n} exceeds the file or 100 MB)")
        raw = f.read(n)
    return parse_header(raw, p, size)


def _unpack(raw: np.ndarray, bits: int, numel: int) -> np.ndarray:
    """Packed bytes → one code per byte (uint8)."""
    if bits == 4:
        out = np.empty(raw.size * 2, np.uint8)
        out[0::2] = raw & 0xF
        out[1::2] = raw >> 4
        return out[:numel]
    g = raw.reshape(-1, 3).astype(np.uint32)
    v = g[:, 0] | (g[:, 1] << 8) | (g[:, 2] << 16)
    return ((v[:, None] >> np.array([0, 6, 12, 18], np.uint32)) & 63).astype(np.uint8).reshape(-1)[:numel]


def _pack(codes: np.ndarray, bits: int) -> bytes:
    c = codes.reshape(-1).astype(np.uint8) & np.uint8((1 << bits) - 1)
    if bits == 4:
        return (c[0::2] | (c[1::2] << 4)).astype(np.uint8).tobytes()
    g = c.reshape(-1, 4).astype(np.uint32)
    v = g[:, 0] | (g[:, 1] << 6) | (g[:, 2] << 12) | (g[:, 3] << 18)
    return np.stack([v & 255, (v >> 8) & 255, v >> 16], axis=1).astype(np.uint8).tobytes()


def read_entry(path: str | os.PathLike, e: Entry) -> np.ndarray:
    """The whole tensor of entry ``e`` as a numpy array (sub-byte dtypes unpacked to one element per byte)."""
    if e.error:
        raise InputError(e.error)
    numel = math.prod(e.shape)
    with open(path, "rb") as f:
        f.seek(e.offset)
        raw = np.fromfile(f, np.uint8, count=e.nbytes)
    if raw.size != e.nbytes:
        raise InputError(f"{path}: tensor {e.name!r}: data is truncated")
    if e.bits < 8:
        return _unpack(raw, e.bits, numel).view(e.dtype).reshape(e.shape)
    return raw.view(e.dtype).reshape(e.shape)


def write_safetensors(path: str | os.PathLike, tensors: dict[str, np.ndarray], metadata: dict | None = None,
                      inputs: Iterable[str | os.PathLike] = ()) -> None:
    """Write arrays (any dtype of :data:`SAFETENSORS_DTYPES`) to ``path`` atomically (:func:`fpsim.io.atomic_write`).

    ml_dtypes ``float4_e2m1fn`` / ``float6_*`` arrays are packed as the format defines (module docstring);
    metadata values become strings.  Raises ``ValueError`` for a dtype safetensors cannot name, a name that
    is not a string or is ``__metadata__``, or a sub-byte tensor whose size is not a whole number of bytes.
    """
    header: dict = {}
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    off = 0
    parts = []
    for name, a in tensors.items():
        if not isinstance(name, str) or name == "__metadata__":
            raise ValueError(f"tensor name {name!r}: must be a string other than '__metadata__'")
        a = np.asarray(a)
        if a.dtype.byteorder == ">":
            a = a.astype(a.dtype.newbyteorder("<"))
        code = _CODE.get(a.dtype)
        if code is None:
            raise ValueError(f"{name}: dtype {a.dtype} has no safetensors name")
        bits = _TABLE[code][1]
        if bits < 8:
            if a.size * bits % 8:
                raise ValueError(f"{name}: {a.size} elements of {code} are not a whole number of bytes")
            blob = _pack(np.ascontiguousarray(a).view(np.uint8), bits)
        else:
            blob = np.asarray(a, order="C")  # (ascontiguousarray would make a 0-d array 1-d)
        n = len(blob) if isinstance(blob, bytes) else blob.nbytes
        header[name] = {"dtype": code, "shape": list(a.shape), "data_offsets": [off, off + n]}
        off += n
        parts.append(blob)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)

    def write(f):
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in parts:
            f.write(b if isinstance(b, bytes) else memoryview(b.reshape(-1).view(np.uint8)))

    atomic_write(path, write, inputs=inputs)
