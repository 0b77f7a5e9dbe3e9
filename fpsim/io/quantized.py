"""Saving and loading :class:`fpsim.QuantizedTensor` files: ``.npz`` and ``.safetensors``, never unpickled.

Formats (unchanged from fpsim 0.1, so old files load and new files load in old versions):

* ``.npz`` — members ``data``, ``scales``, ``amax`` (float32) and ``meta``: the UTF-8 bytes of a JSON
  object as a uint8 array;
* ``.safetensors`` — tensors ``data``, ``scales``, ``amax``; the same JSON object as the string
  ``__metadata__["fpsim"]``.

The JSON object: ``{"format": "fpsim.QuantizedTensor/1", "scheme": BlockScheme.to_json(), "shape": [...],
"dtype": "float32", "axis": k}``.  Reading goes through fpsim.io's one npz reader and one safetensors
header parser; writing through :func:`fpsim.io.atomic_write` and :func:`fpsim.io.write_safetensors`.
A file that is corrupt, truncated, hand-edited or not an fpsim file raises a one-line ``ValueError``
that names the path, whatever is wrong with it.
"""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import numpy as np

from ..schemes import BlockScheme
from ..tensor import QuantizedTensor
from .errors import InputError, json_object
from .files import atomic_write
from .npz import npz_members
from .rows import ArrayStorage
from .safetensors import read_entry, read_header, write_safetensors

__all__ = ["save_quantized", "load_quantized", "FORMAT_TAG"]

FORMAT_TAG = "fpsim.QuantizedTensor/1"
_ARRAYS = ("data", "scales", "amax")
_ALLOWED = {np.dtype("u1"), np.dtype("<u2"), np.dtype("<u4"), np.dtype("<f4")}
_PICKLE_REFUSED = "refusing to load pickled content (fpsim never unpickles; this file was not written by fpsim)"


def _meta(qt: QuantizedTensor) -> str:
    return json.dumps({"format": FORMAT_TAG, "scheme": qt.scheme.to_json(), "shape": [int(s) for s in qt.shape],
                       "dtype": qt.dtype, "axis": int(qt.axis)}, allow_nan=False)


def save_quantized(qt: QuantizedTensor, path: str | os.PathLike) -> None:
    """Write ``qt`` losslessly to ``.npz`` or ``.safetensors`` (by extension), atomically; see the module docstring."""
    p = Path(path)
    arrays = {"data": np.asarray(qt.data), "scales": np.asarray(qt.scales), "amax": np.asarray(qt.amax, np.float32)}
    meta = _meta(qt)
    if p.suffix == ".npz":
        buf = io.BytesIO()
        np.savez(buf, meta=np.frombuffer(meta.encode(), np.uint8), **arrays)
        atomic_write(p, buf.getvalue())
    elif p.suffix == ".safetensors":
        write_safetensors(p, arrays, {"fpsim": meta})
    else:
        raise ValueError(f"{path}: use a .npz or .safetensors extension")


def _parse_meta(raw: bytes, path) -> dict:
    return json_object(raw, f"{path}: corrupt metadata")


#: Scheme fields BlockScheme tests for truth without converting them: a hand-edited "false" would read as True.
_FLAGS = ("tensor_scale", "four_over_six", "per_row_scale")


def _check_scheme_types(d, path) -> None:
    """ValueError unless the scheme object's fields have the JSON types ``BlockScheme.to_json`` writes: BlockScheme
    coerces some fields (``int(1.5)`` → 1 for a block size) and tests the flags for truth, so a wrong type would load
    silently as another scheme."""
    if not isinstance(d, dict):
        raise ValueError(f"{path}: invalid scheme in metadata (not a JSON object)")
    bad = [k for k in _FLAGS if k in d and type(d[k]) not in (bool, int)]
    blk = d.get("block")
    if blk is not None and not (isinstance(blk, list) and all(type(b) is int for b in blk)):
        bad.append("block")
    if "name" in d and not isinstance(d["name"], str):
        bad.append("name")
    if bad:
        raise ValueError(f"{path}: invalid scheme in metadata ({', '.join(bad)}: not the JSON type fpsim writes)")


def _build(meta: dict, arrays: dict, path) -> QuantizedTensor:
    if meta.get("format") != FORMAT_TAG:
        raise ValueError(f"{path}: not an fpsim QuantizedTensor file (format tag {str(meta.get('format'))[:40]!r})")
    for k in ("scheme", "shape", "dtype", "axis"):
        if k not in meta:
            raise ValueError(f"{path}: metadata has no {k!r}")
    for k in _ARRAYS:
        if k not in arrays:
            raise ValueError(f"{path}: no {k!r} array")
    shape, axis, dtype = meta["shape"], meta["axis"], meta["dtype"]
    if not isinstance(shape, list) or any(type(s) is not int or s < 0 for s in shape):
        raise ValueError(f"{path}: metadata shape must be a list of non-negative integers")
    if not shape:  # quantize needs an axis: fpsim never writes a scalar (the layout would fail with an IndexError)
        raise ValueError(f"{path}: metadata shape is [] (a scalar); a QuantizedTensor has at least one axis")
    _check_scheme_types(meta["scheme"], path)
    if type(axis) is not int or not isinstance(dtype, str):
        raise ValueError(f"{path}: metadata axis must be an integer and dtype a string")
    try:
        scheme = BlockScheme.from_json(meta["scheme"])
    except (KeyError, TypeError, AttributeError, ValueError, RecursionError, OverflowError) as e:
        what = f"missing field {e}" if isinstance(e, KeyError) else f"{type(e).__name__}: {str(e)[:80]}"
        raise ValueError(f"{path}: invalid scheme in metadata ({what})") from None
    for k in _ARRAYS:
        if arrays[k].dtype not in _ALLOWED:
            raise ValueError(f"{path}: array {k!r} has dtype {arrays[k].dtype}, not one fpsim writes")
    try:
        return QuantizedTensor(arrays["data"], arrays["scales"], arrays["amax"].astype(np.float32, copy=False),
                               scheme, tuple(shape), dtype, axis)
    except (ValueError, TypeError, OverflowError, IndexError) as e:  # arrays that do not fit the scheme
        raise ValueError(f"{path}: {str(e).splitlines()[0] if str(e) else type(e).__name__}") from None


def _whole(m) -> np.ndarray:
    st = m.storage()
    if isinstance(st, ArrayStorage):
        return np.array(st.arr).reshape(m.shape)
    n = 1
    for s in m.shape:
        n *= s
    return st.read_runs(0, 1, 0, n).reshape(m.shape)


def _load_npz(p: Path) -> QuantizedTensor:
    members, _ = npz_members(p)
    arrays = {}
    for m in members:
        if m.error:
            if "pickle" in m.error:
                raise ValueError(f"{p}: {_PICKLE_REFUSED}")
            raise ValueError(m.error)
        arrays[m.name] = _whole(m)
    meta = arrays.pop("meta", None)
    if meta is None or meta.dtype != np.uint8 or meta.ndim != 1:
        raise ValueError(f"{p}: not an fpsim QuantizedTensor file (no metadata)")
    return _build(_parse_meta(meta.tobytes(), p), arrays, p)


def _load_safetensors(p: Path) -> QuantizedTensor:
    with open(p, "rb") as f:
        head = f.read(9)
    size = p.stat().st_size
    if len(head) >= 2 and head[0] == 0x80 and 2 <= head[1] <= 5 and int.from_bytes(head[:8], "little") > size:
        raise ValueError(f"{p}: {_PICKLE_REFUSED}")  # pickle protocol 2-5 starts with the PROTO opcode
    entries, meta = read_header(p)
    if not isinstance(meta.get("fpsim"), str):
        raise ValueError(f"{p}: not an fpsim QuantizedTensor file (no 'fpsim' metadata)")
    arrays = {}
    for e in entries:
        if e.error:
            raise ValueError(e.error)
        arrays[e.name] = read_entry(p, e).copy()
    return _build(_parse_meta(meta["fpsim"].encode("utf-8", "surrogatepass"), p), arrays, p)


def load_quantized(path: str | os.PathLike) -> QuantizedTensor:
    """Read a file written by :func:`save_quantized` (either format, told apart by content, not by name).

    Never unpickles.  Raises ``ValueError`` (one line naming ``path``) for anything but an intact fpsim file,
    ``FileNotFoundError`` / ``PermissionError`` as ``open`` does.
    """
    p = Path(path)
    if not p.is_file():
        if p.exists():
            raise ValueError(f"{p}: not a regular file")
        raise FileNotFoundError(f"{p}: no such file")
    with open(p, "rb") as f:
        magic = f.read(4)
    try:
        if magic == b"PK\x03\x04":
            return _load_npz(p)
        return _load_safetensors(p)
    except InputError as e:
        raise ValueError(str(e)) from None
    except MemoryError:
        raise ValueError(f"{p}: out of memory (corrupt sizes?)") from None
