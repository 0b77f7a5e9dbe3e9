"""Saving and loading :class:`~fpsim.tensor.QuantizedTensor` losslessly (.npz or .safetensors), never unpickling."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from ..schemes import BlockScheme
from ..tensor import QuantizedTensor
from .files import atomic_write

__all__ = ["save_quantized", "load_quantized"]


# ---------------------------------------------------------------------------
# Save / load (no pickle anywhere)

_FORMAT_TAG = "fpsim.QuantizedTensor/1"
_ST_DTYPES = {"uint8": "U8", "uint16": "U16", "uint32": "U32", "float32": "F32"}


def _meta(qt: QuantizedTensor) -> dict:
    return {
        "format": _FORMAT_TAG,
        "scheme": qt.scheme.to_json(),
        "shape": list(qt.shape),
        "dtype": qt.dtype,
        "axis": qt.axis,
    }


def _from_parts(meta: dict, arrays: dict, path) -> QuantizedTensor:
    if meta.get("format") != _FORMAT_TAG:
        raise ValueError(f"{path}: not an fpsim QuantizedTensor file (format tag {meta.get('format')!r})")
    try:
        return QuantizedTensor(
            np.asarray(arrays["data"]),
            np.asarray(arrays["scales"]),
            np.asarray(arrays["amax"], np.float32),
            BlockScheme.from_json(meta["scheme"]),
            tuple(int(s) for s in meta["shape"]),
            str(meta["dtype"]),
            int(meta["axis"]),
        )
    except KeyError as e:
        raise ValueError(f"{path}: missing field {e}") from None
    except ValueError as e:  # arrays that do not fit the scheme (a corrupt or hand-edited file)
        raise ValueError(f"{path}: {e}") from None


def save_quantized(qt: QuantizedTensor, path: str | os.PathLike) -> None:
    """Write ``qt`` to ``.npz`` (metadata as a JSON byte array) or ``.safetensors`` (metadata in the header).

    Both are bit-exact and pickle-free; the write is atomic.
    """
    p = Path(path)
    arrays = {"data": qt.data, "scales": qt.scales, "amax": np.asarray(qt.amax, np.float32)}
    meta = json.dumps(_meta(qt), allow_nan=False)
    if p.suffix == ".npz":
        meta_arr = np.frombuffer(meta.encode(), np.uint8)
        atomic_write(p, lambda f: np.savez(f, meta=meta_arr, **arrays))
    elif p.suffix == ".safetensors":
        header: dict = {"__metadata__": {"fpsim": meta}}
        blobs, pos = [], 0
        for name, a in arrays.items():
            a = np.asarray(a, order="C")  # (ascontiguousarray would make 0-d arrays 1-d)
            raw = a.astype(a.dtype.newbyteorder("<"), copy=False).tobytes()
            header[name] = {
                "dtype": _ST_DTYPES[a.dtype.name],
                "shape": list(a.shape),
                "data_offsets": [pos, pos + len(raw)],
            }
            blobs.append(raw)
            pos += len(raw)
        h = json.dumps(header).encode()
        h += b" " * (-len(h) % 8)

        def write(f):
            f.write(len(h).to_bytes(8, "little"))
            f.write(h)
            for b in blobs:
                f.write(b)

        atomic_write(p, write)
    else:
        raise ValueError(f"{path}: use a .npz or .safetensors extension")


_PICKLE_REFUSED = "refusing to load pickled content (fpsim never unpickles; this file was not written by fpsim)"


def load_quantized(path: str | os.PathLike) -> QuantizedTensor:
    """Read a file written by :func:`save_quantized`.

    Never unpickles: ``.npz`` is read with ``allow_pickle=False`` and a file
    holding pickled (object) data raises ``ValueError``; ``.safetensors`` is
    parsed by hand (8-byte header length, JSON header, raw little-endian bytes).
    """
    p = Path(path)
    with open(p, "rb") as f:
        head = f.read(8)
    if head[:4] == b"PK\x03\x04":
        try:
            with np.load(p, allow_pickle=False) as z:
                arrays = {k: z[k] for k in z.files}
        except ValueError as e:
            if "pickle" in str(e).lower():
                raise ValueError(f"{path}: {_PICKLE_REFUSED}") from None
            raise
        if "meta" not in arrays or arrays["meta"].dtype != np.uint8:
            raise ValueError(f"{path}: not an fpsim QuantizedTensor file (no metadata)")
        meta = json.loads(arrays.pop("meta").tobytes().decode())
        return _from_parts(meta, arrays, path)
    return _load_safetensors(p)


def _load_safetensors(p: Path) -> QuantizedTensor:
    raw = p.read_bytes()
    if len(raw) < 8:
        raise ValueError(f"{p}: too short for a safetensors file")
    n = int.from_bytes(raw[:8], "little")
    if n > len(raw) - 8 and raw[0] == 0x80 and 2 <= raw[1] <= 5:  # pickle protocol 2-5 opcode PROTO
        raise ValueError(f"{p}: {_PICKLE_REFUSED}")
    if n > len(raw) - 8:
        raise ValueError(f"{p}: not a safetensors file (header length {n} beyond the file)")
    try:
        header = json.loads(raw[8 : 8 + n].decode())
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise ValueError(f"{p}: not a safetensors file (header is not JSON)") from None
    body = memoryview(raw)[8 + n :]
    inv = {v: k for k, v in _ST_DTYPES.items()}
    meta_s = header.pop("__metadata__", {}).get("fpsim")
    if meta_s is None:
        raise ValueError(f"{p}: not an fpsim QuantizedTensor file (no 'fpsim' metadata)")
    arrays = {}
    for name, info in header.items():
        if info.get("dtype") not in inv:
            raise ValueError(f"{p}: tensor {name!r} has unsupported dtype {info.get('dtype')!r}")
        a, b = info["data_offsets"]
        dt = np.dtype(inv[info["dtype"]]).newbyteorder("<")
        arr = np.frombuffer(body[a:b], dt).astype(dt.newbyteorder("="))
        arrays[name] = arr.reshape(info["shape"])
    return _from_parts(json.loads(meta_s), arrays, p)

