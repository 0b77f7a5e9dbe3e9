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
import re
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .errors import InputError, MalformedFile, json_object, printable
from .files import atomic_write

__all__ = ["SAFETENSORS_DTYPES", "Entry", "Header", "check_header", "malformed", "parse_header", "read_header",
           "read_raw_header", "read_entry", "write_safetensors"]

MAX_HEADER = 100 * 1024 * 1024  # the official library's limit as well


#: safetensors dtype code → (numpy dtype, or the name of an ml_dtypes type, of the unpacked elements; bits).
_SPECS = {
    "F64": ("<f8", 64), "F32": ("<f4", 32), "F16": ("<f2", 16), "BF16": ("bfloat16", 16),
    "F8_E4M3": ("float8_e4m3fn", 8), "F8_E5M2": ("float8_e5m2", 8),
    "F8_E4M3FNUZ": ("float8_e4m3fnuz", 8), "F8_E5M2FNUZ": ("float8_e5m2fnuz", 8),
    "F8_E8M0": ("float8_e8m0fnu", 8), "F6_E2M3": ("float6_e2m3fn", 6),
    "F6_E3M2": ("float6_e3m2fn", 6), "F4": ("float4_e2m1fn", 4),
    "C64": ("<c8", 64), "I64": ("<i8", 64), "I32": ("<i4", 32), "I16": ("<i2", 16), "I8": ("i1", 8),
    "U64": ("<u8", 64), "U32": ("<u4", 32), "U16": ("<u2", 16), "U8": ("u1", 8), "BOOL": ("?", 8),
}


class _DtypeTable(Mapping):
    """code → (dtype, bits) (``field=0``) or code → dtype (``field=None``), resolved per code on use: ml_dtypes'
    extension takes about 0.4 s to import, paid only where a file or call has one of its types."""

    def __init__(self, whole: bool):
        self._whole = whole
        self._got: dict = {}

    def __getitem__(self, code):
        if code not in self._got:
            spec, bits = _SPECS[code]
            if spec[0] in "<i?u":
                dt = np.dtype(spec)
            else:
                import ml_dtypes

                dt = np.dtype(getattr(ml_dtypes, spec))
            self._got[code] = (dt, bits)
        return self._got[code] if self._whole else self._got[code][0]

    def __contains__(self, code) -> bool:
        return code in _SPECS

    def __iter__(self):
        return iter(_SPECS)

    def __len__(self) -> int:
        return len(_SPECS)


class _Codes(Mapping):
    """numpy dtype → safetensors code, built (all of ml_dtypes' types too) on first use."""

    _d: dict | None = None

    def _all(self) -> dict:
        if self._d is None:
            self._d = {_TABLE[k][0]: k for k in _SPECS}
        return self._d

    def __getitem__(self, dt):
        return self._all()[dt]

    def __iter__(self):
        return iter(self._all())

    def __len__(self) -> int:
        return len(_SPECS)


_TABLE = _DtypeTable(True)
#: safetensors dtype code → numpy dtype of the unpacked elements.
SAFETENSORS_DTYPES: Mapping[str, np.dtype] = _DtypeTable(False)
_CODE = _Codes()


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


_U64 = (1 << 64) - 1  # the library's sizes are usize: a larger integer in the header is refused
_MAX_DEPTH = 127  # serde_json's nesting limit, as the library applies it to the whole header (measured, 0.8.0)


def _int(v, what: str) -> int:
    if type(v) is not int:  # bool and float (1e400 parses as inf, -0 as -0.0: see _parse_int) are not sizes
        raise ValueError(f"{what} is not an integer ({json.dumps(v)[:40] if _dumpable(v) else type(v).__name__})")
    if v < 0:
        raise ValueError(f"{what} is negative ({v})")
    if v > _U64:
        raise ValueError(f"{what} does not fit in 64 bits ({str(v)[:40]})")
    return v


def _dumpable(v) -> bool:
    try:
        json.dumps(v)
        return True
    except (TypeError, ValueError, RecursionError):
        return False


class _Obj(dict):
    """A JSON object that remembers its repeated keys (``dups``) and every (key, value) pair (``pairs``)."""

    dups: tuple = ()
    pairs: tuple = ()


def _pairs_hook(pairs):
    obj = _Obj(pairs)
    if len(obj) != len(pairs):
        seen: set = set()
        obj.dups = tuple(dict.fromkeys(k for k, _ in pairs if k in seen or seen.add(k)))
        obj.pairs = tuple(pairs)
    return obj


def _parse_int(text: str):
    # serde reads "-0" as the float -0.0 (refused where a size is due); Python would read the int 0
    return -0.0 if text == "-0" else int(text)


def _depth(v) -> int:
    if isinstance(v, dict):
        return 1 + max(map(_depth, v.values()), default=0)
    if isinstance(v, list):
        return 1 + max(map(_depth, v), default=0)
    return 0


_FIELDS = ("dtype", "shape", "data_offsets")
_SURROGATE = re.compile("[\ud800-\udfff]")


def _entry(path, name: str, info, base: int) -> Entry:
    """One header entry checked as the library checks it (``TensorInfo``: exact fields, usize sizes, the byte count
    of its shape computed without overflow); ``error`` says what is wrong.  Offsets are not checked against the
    other entries or the file here (:func:`_layout`)."""
    shown = printable(name)
    start = end = None
    try:
        if not isinstance(info, dict):
            raise ValueError("entry is not a JSON object")
        if info.dups:
            raise ValueError(f"field {printable(str(info.dups[0]))!r} given twice")
        missing = [f for f in _FIELDS if f not in info]
        if missing:
            raise ValueError(f"missing field {missing[0]!r}")
        code = info["dtype"]
        shape, offs = info["shape"], info["data_offsets"]
        if not isinstance(offs, list) or len(offs) != 2:
            raise ValueError("data_offsets is not a pair")
        start, end = (_int(o, "an offset") for o in offs)
        if not isinstance(code, str) or code not in _TABLE:  # a list or object is not hashable: test the type first
            raise ValueError(f"unsupported dtype {printable(str(code))[:40]!r}")
        if any(_depth(v) + 2 > _MAX_DEPTH for k, v in info.items() if k not in _FIELDS):
            raise ValueError(f"an extra field is nested deeper than {_MAX_DEPTH} levels")
        dt, bits = _TABLE[code]
        if not isinstance(shape, list):
            raise ValueError("shape is not a list")
        shape = tuple(_int(s, "a dimension") for s in shape)
        numel = 1
        for s in shape:  # the library's checked product, in order: [2**33, 2**33, 0] overflows before the 0
            numel *= s
            if numel > _U64:
                raise ValueError(f"shape {list(shape)} overflows 64 bits")
        if numel * bits > _U64:
            raise ValueError(f"shape {list(shape)} of {code} overflows 64 bits")
        if numel * bits % 8:
            raise ValueError(f"{numel} elements of {bits} bits are not a whole number of bytes")
        want = numel * bits // 8
        if end - start != want:
            raise ValueError(f"data_offsets {[start, end]} do not hold shape {list(shape)} of {code}")
    except ValueError as e:
        claim = (base + start, base + end) if start is not None and start <= end else None
        return Entry(shown, "", np.dtype("u1"), (), claim[0] if claim else 0, claim[1] - claim[0] if claim else 0,
                     8, error=f"{path}: tensor {shown!r}: {e}")
    return Entry(shown, code, dt, shape, base + start, want, bits)


def _ranges(entries: list[Entry], base: int) -> str:
    return ", ".join(f"{e.name!r} {[e.offset - base, e.offset - base + e.nbytes]}" for e in entries)


def _layout(entries: list[Entry], base: int, size: int) -> tuple[list[str], set[int]]:
    """The library's rule for the data (entries sorted by offsets cover it contiguously from 0 to the end of the
    file) checked over every entry whose offsets are readable: (problems, indices of entries whose bytes are
    ambiguous: overlapping another entry's bytes or past the end of the file)."""
    problems: list[str] = []
    claims = sorted((e.offset, e.offset + e.nbytes, i) for i, e in enumerate(entries) if e.nbytes or not e.error)
    bad: set[int] = set()
    pos, prev = base, None
    owner, reach = None, base
    for s, t, i in claims:
        if s < reach and s < t:  # shares bytes with the entry reaching furthest so far: both are aliased
            bad.update((i, owner))
            problems.append(f"data offsets of {_ranges([entries[i]], base)} overlap {_ranges([entries[owner]], base)}")
        elif s != pos and not problems:
            if s < pos:
                problems.append(f"data offsets of {_ranges([entries[i]], base)} lie inside "
                                f"{_ranges([entries[owner]], base)}")
            elif prev is None:
                problems.append(f"data does not start at offset 0 (the first tensor {_ranges([entries[i]], base)})")
            else:
                problems.append(f"data bytes [{pos - base}, {s - base}) between {entries[prev].name!r} and "
                                f"{entries[i].name!r} belong to no tensor")
        if t > reach:
            owner, reach = i, t
        if t > size:
            bad.add(i)
            problems.append(f"tensor {entries[i].name!r} is truncated: its data offsets end at {t - base}, the file "
                            f"holds {size - base} data bytes")
        pos, prev = max(pos, t), i
    if pos < size:
        problems.append(f"{size - pos} trailing byte(s) after the last tensor's data")
    return problems, bad


@dataclass(frozen=True)
class Header:
    """A parsed header: every entry (``error`` on those that cannot be read), ``__metadata__``, what makes the file
    malformed for the safetensors library (``problems``) and notes (repeated tensor names, read as the library does).
    """

    entries: list[Entry]
    meta: dict
    problems: list[str]
    notes: list[str]


def check_header(raw: bytes, path, size: int) -> Header:
    """Parse and check a header ``raw`` (the JSON bytes) of a file of ``size`` bytes as the safetensors library does.

    A header that is not a JSON object of UTF-8 text, nests deeper than the library allows or repeats
    ``__metadata__`` is a :class:`MalformedFile` (nothing in it can be trusted); problems of the entries, of their
    layout and of the metadata are listed in ``problems``, and the entries concerned carry ``error``.
    """
    what = f"{path}: malformed safetensors: header"
    header = json_object(raw, what, MalformedFile, object_pairs_hook=_pairs_hook, parse_int=_parse_int)
    if "__metadata__" in header.dups:
        raise MalformedFile(f"{what} holds __metadata__ twice")
    problems, notes = [], []
    meta = header.get("__metadata__")
    texts = list(header) + [t for kv in (meta.items() if isinstance(meta, dict) else ()) for t in kv
                            if isinstance(t, str)]
    if any(_SURROGATE.search(t) for t in texts):  # Python decodes "\ud800" alone; serde refuses it
        problems.append("a name or metadata string holds a lone UTF-16 surrogate escape (not Unicode text)")
    meta = header.pop("__metadata__", None)
    if meta is None:
        meta = {}
    elif not isinstance(meta, dict):
        problems.append("__metadata__ is not an object")
        meta = {}
    elif not all(isinstance(v, str) for v in meta.values()):
        k = next(k for k, v in meta.items() if not isinstance(v, str))
        problems.append(f"__metadata__ value of {printable(k)[:40]!r} is not a string")
    base = 8 + len(raw)
    entries = [_entry(path, str(k), v, base) for k, v in header.items()]
    if header.dups:  # the library keeps the last entry of a name, but refuses the file if any of them is bad
        dups = set(header.dups)
        bad = dict.fromkeys(k for k, v in header.pairs if k in dups and _entry(path, k, v, base).error)
        problems += [f"tensor {printable(k)!r} is named more than once and one of its entries is invalid" for k in bad]
        shown = ", ".join(repr(printable(k)) for k in header.dups[:5]) + (" …" if len(header.dups) > 5 else "")
        notes.append(f"{path}: earlier entries of {len(dups)} tensor name(s) given more than once in the header "
                     f"({shown}): the last is read, as the safetensors library does")
    problems += [e.error[len(f"{path}: "):] for e in entries if e.error]
    layout, bad = _layout(entries, base, size)
    problems += layout
    why = {i: f"{path}: tensor {entries[i].name!r}: its bytes are shared with another tensor or past the end of the "
              "file; not read" for i in bad}
    entries = [e if e.error or i not in why else Entry(e.name, "", np.dtype("u1"), (), 0, 0, 8, error=why[i])
               for i, e in enumerate(entries)]
    return Header(entries, meta, problems, notes)


def malformed(path, h: Header) -> str:
    """The one line that says why the file is malformed: its first problems and how many more."""
    more = f"; and {len(h.problems) - 3} more problem(s)" if len(h.problems) > 3 else ""
    return f"{path}: malformed safetensors: {'; '.join(h.problems[:3])}{more}"


def parse_header(raw: bytes, path, size: int, strict: bool = True) -> tuple[list[Entry], dict]:
    """Entries and ``__metadata__`` of a header ``raw`` of a file of ``size`` bytes (:func:`check_header`).

    ``strict``: a file the safetensors library refuses is a :class:`MalformedFile` with the reason; else its
    entries are returned, those whose bytes are ambiguous or that cannot be read with ``error``.
    """
    h = check_header(raw, path, size)
    if h.problems and strict:
        raise MalformedFile(malformed(path, h))
    return h.entries, h.meta


def read_raw_header(path: str | os.PathLike) -> tuple[bytes, int]:
    """(header bytes, file size) of ``path``; :class:`MalformedFile` when the header length is impossible."""
    p = Path(path)
    with open(p, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        head = f.read(8)
        if len(head) < 8:
            raise MalformedFile(f"{p}: malformed safetensors: {size} byte(s), too short for the header length")
        (n,) = struct.unpack("<Q", head)
        if n > min(MAX_HEADER, size - 8):
            raise MalformedFile(f"{p}: malformed safetensors: header length {n} exceeds the file or 100 MB")
        return f.read(n), size


def read_header(path: str | os.PathLike, strict: bool = True) -> tuple[list[Entry], dict]:
    """Open ``path`` once and parse its header (see :func:`parse_header`)."""
    raw, size = read_raw_header(path)
    return parse_header(raw, Path(path), size, strict)


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
