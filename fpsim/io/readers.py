"""Reading captured tensors safely: .npz, .safetensors, .pt/.pth (SPEC: no pickle, bounded memory).

:func:`open_tensors` lists the tensors of one or more paths (files, directories,
globs) *without loading them*; each :class:`TensorRef` loads on demand:

* ``.npz`` — headers are read first; each member is loaded whole on demand
  with ``numpy.load(allow_pickle=False)`` (an object / pickled member raises
  :class:`InputError`; nothing is ever unpickled);
* ``.safetensors`` — the JSON header is parsed here and every tensor is a
  ``numpy.memmap`` of its byte range (all dtypes: F64/F32/F16/BF16/F8_E4M3/
  F8_E5M2/F8_E8M0/I*/U*/BOOL through ml_dtypes), no torch needed;
* ``.pt`` / ``.pth`` — only when torch is installed, with ``weights_only=True``.

Errors are :class:`InputError` with a one-line message; the CLI turns them into
notes (a bad tensor is skipped) or exit codes (nothing readable at all).
"""

from __future__ import annotations

import glob
import json
import os
import struct
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = ["InputError", "TensorRef", "open_tensors", "SAFETENSORS_DTYPES", "write_safetensors"]


class InputError(Exception):
    """A file or tensor that cannot be read as asked; the message is one line."""


def _st_dtypes() -> dict[str, np.dtype]:
    import ml_dtypes

    return {
        "F64": np.dtype("<f8"), "F32": np.dtype("<f4"), "F16": np.dtype("<f2"),
        "BF16": np.dtype(ml_dtypes.bfloat16), "F8_E4M3": np.dtype(ml_dtypes.float8_e4m3fn),
        "F8_E5M2": np.dtype(ml_dtypes.float8_e5m2), "F8_E8M0": np.dtype(ml_dtypes.float8_e8m0fnu),
        "F4": np.dtype(ml_dtypes.float4_e2m1fn),
        "I64": np.dtype("<i8"), "I32": np.dtype("<i4"), "I16": np.dtype("<i2"), "I8": np.dtype("i1"),
        "U64": np.dtype("<u8"), "U32": np.dtype("<u4"), "U16": np.dtype("<u2"), "U8": np.dtype("u1"),
        "BOOL": np.dtype("?"),
    }


SAFETENSORS_DTYPES = _st_dtypes()
_ST_NAMES = {v: k for k, v in SAFETENSORS_DTYPES.items()}
_MAX_HEADER = 100 * 1024 * 1024


class RowSource:
    """A tensor on disk read in row ranges (of its 2-D view: leading axes flattened × last axis).

    ``src[i:j]`` reads rows i..j-1 with one ``numpy.fromfile`` call, so only the
    rows asked for are ever in memory (a memory map would keep every page it
    touched resident).  ``numpy.asarray(src)`` reads the whole tensor.
    """

    def __init__(self, path: Path, offset: int, dtype: np.dtype, shape: tuple[int, ...]):
        self.path, self.offset, self.dtype, self.shape = path, offset, np.dtype(dtype), tuple(shape)
        self.ndim = len(self.shape)
        self.size = int(np.prod(self.shape, dtype=np.int64))
        self.nbytes = self.size * self.dtype.itemsize
        self.cols = self.shape[-1] if self.shape else 1
        self.rows = self.size // self.cols if self.cols else 0

    def __getitem__(self, sl: slice) -> np.ndarray:
        if not isinstance(sl, slice) or sl.step not in (None, 1):
            raise TypeError("RowSource supports contiguous row slices only")
        i, j, _ = sl.indices(self.rows)
        n = max(j - i, 0)
        with open(self.path, "rb") as f:
            f.seek(self.offset + i * self.cols * self.dtype.itemsize)
            a = np.fromfile(f, dtype=self.dtype, count=n * self.cols)
        if a.size != n * self.cols:
            raise InputError(f"{self.path}: tensor data is truncated")
        return a.reshape(n, self.cols)

    def as_2d(self) -> RowSource:
        return self

    def __array__(self, dtype=None, copy=None):
        a = self[0 : self.rows].reshape(self.shape)
        return a if dtype is None else a.astype(dtype)


@dataclass
class TensorRef:
    """One tensor of a file: name, shape, dtype known up front; ``load()`` maps or reads it."""

    source: str
    name: str
    shape: tuple[int, ...]
    dtype: np.dtype
    _load: Callable[[], np.ndarray]

    @property
    def key(self) -> str:
        return f"{self.source}:{self.name}"

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize

    rows: Callable[[], RowSource] | None = None

    def load(self) -> np.ndarray:
        """The array (a read-only memmap where the format allows it)."""
        return self._load()

    def row_source(self) -> RowSource | np.ndarray:
        """A :class:`RowSource` where the format allows reading row ranges, else the loaded array."""
        return self.rows() if self.rows is not None else self._load()


def _safetensors(path: Path) -> list[TensorRef]:
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise InputError(f"{path}: truncated safetensors file (no header length)")
        (n,) = struct.unpack("<Q", head)
        if n > min(_MAX_HEADER, size - 8):
            raise InputError(f"{path}: not a safetensors file (header length {n} exceeds the file)")
        try:
            header = json.loads(f.read(n))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise InputError(f"{path}: corrupt safetensors header ({e.__class__.__name__})") from None
    if not isinstance(header, dict):
        raise InputError(f"{path}: corrupt safetensors header (not a JSON object)")
    base = 8 + n
    refs = []
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            dt = SAFETENSORS_DTYPES[info["dtype"]]
            shape = tuple(int(s) for s in info["shape"])
            start, end = (int(o) for o in info["data_offsets"])
        except KeyError as e:
            raise InputError(f"{path}: tensor {name!r} has an unsupported or missing field {e}") from None
        except (TypeError, ValueError):
            raise InputError(f"{path}: tensor {name!r} has a malformed header entry") from None
        expect = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
        if end - start != expect or start < 0 or base + end > size:
            raise InputError(f"{path}: tensor {name!r} is truncated or its offsets are inconsistent")

        def load(path=path, off=base + start, dt=dt, shape=shape, count=expect):
            if count == 0:
                return np.zeros(shape, dt)
            return np.memmap(path, dtype=dt, mode="r", offset=off, shape=shape)

        def rows(path=path, off=base + start, dt=dt, shape=shape):
            return RowSource(path, off, dt, shape)

        refs.append(TensorRef(str(path), name, shape, dt, load, rows=rows))
    return refs


def _npz(path: Path) -> list[TensorRef]:
    try:
        zf = zipfile.ZipFile(path)
    except zipfile.BadZipFile:
        raise InputError(f"{path}: not an npz file (bad zip)") from None
    refs = []
    with zf:
        infos = [i for i in zf.infolist() if i.filename.endswith(".npy")]
    if not infos:
        raise InputError(f"{path}: no arrays in this npz file")
    for info in infos:
        name = info.filename[:-4]
        try:
            with zipfile.ZipFile(path) as z, z.open(info) as f:
                version = np.lib.format.read_magic(f)
                if version == (1, 0):
                    shape, fortran, dt = np.lib.format.read_array_header_1_0(f)
                else:
                    shape, fortran, dt = np.lib.format.read_array_header_2_0(f)
        except Exception as e:  # noqa: BLE001 - any header failure is a corrupt member
            raise InputError(f"{path}: member {name!r} is not a valid .npy array ({e.__class__.__name__})") from None
        if dt.hasobject:
            refs.append(TensorRef(str(path), name, shape, dt, _refuse_pickle(path, name)))
            continue

        def load(path=path, name=name):
            try:
                with np.load(path, allow_pickle=False) as z:
                    return z[name]
            except ValueError as e:
                raise InputError(f"{path}: member {name!r}: {e}") from None
            except (zipfile.BadZipFile, EOFError, OSError) as e:
                raise InputError(f"{path}: member {name!r} is truncated or corrupt ({e.__class__.__name__})") from None

        refs.append(TensorRef(str(path), name, tuple(shape), dt, load))
    return refs


def _refuse_pickle(path, name):
    def load():
        raise InputError(f"{path}: member {name!r} holds Python objects (a pickle); refusing to load it")

    return load


def _torch(path: Path) -> list[TensorRef]:
    try:
        import torch
    except ImportError:
        raise InputError(f"{path}: reading .pt/.pth needs torch (pip install 'fpsim[torch]')") from None
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - torch raises many types for bad files
        raise InputError(f"{path}: cannot read as a weights-only torch file ({str(e).splitlines()[0][:120]})") from None
    if isinstance(obj, torch.Tensor):
        obj = {"tensor": obj}
    if not isinstance(obj, dict):
        raise InputError(f"{path}: expected a tensor or a dict of tensors, got {type(obj).__name__}")
    refs = []
    for k, v in obj.items():
        if isinstance(v, torch.Tensor):
            t = v.detach()
            bf16 = t.dtype == torch.bfloat16  # numpy has no bfloat16: widen exactly to float32

            def arr_fn(t=t, bf16=bf16):
                return t.float().numpy() if bf16 else t.numpy()

            dt = np.dtype(np.float32) if bf16 else np.dtype(str(t.numpy().dtype))
            refs.append(TensorRef(str(path), str(k), tuple(t.shape), dt, arr_fn))
    return refs


_READERS = {".safetensors": _safetensors, ".npz": _npz, ".pt": _torch, ".pth": _torch}


def _expand(paths: list[str]) -> list[Path]:
    out: list[Path] = []
    for p in paths:
        if any(ch in p for ch in "*?["):
            hits = sorted(glob.glob(p, recursive=True))
            if not hits:
                raise InputError(f"{p}: no file matches this pattern")
            out += [Path(h) for h in hits if Path(h).is_file() and Path(h).suffix in _READERS]
        elif os.path.isdir(p):
            out += sorted(q for q in Path(p).rglob("*") if q.is_file() and q.suffix in _READERS)
        elif os.path.exists(p):
            out.append(Path(p))
        else:
            raise InputError(f"{p}: no such file or directory")
    return out


def open_tensors(paths: list[str] | str, on_error: Callable[[str], None] | None = None) -> list[TensorRef]:
    """All tensors of the given files / directories / globs, unloaded.

    A file that cannot be opened raises :class:`InputError`, or is reported to
    ``on_error`` and skipped when that callback is given.
    """
    if isinstance(paths, (str, os.PathLike)):
        paths = [str(paths)]
    refs = []
    for path in _expand(list(paths)):
        reader = _READERS.get(path.suffix.lower())
        try:
            if reader is None:
                raise InputError(f"{path}: unsupported file type (use .npz, .safetensors, .pt or .pth)")
            if not os.access(path, os.R_OK):
                raise InputError(f"{path}: not readable (permission denied)")
            refs += reader(path)
        except InputError as e:
            if on_error is None:
                raise
            on_error(str(e))
        except OSError as e:
            msg = f"{path}: cannot read ({e.strerror or e.__class__.__name__})"
            if on_error is None:
                raise InputError(msg) from None
            on_error(msg)
    return refs


def write_safetensors(path: str | os.PathLike, tensors: dict[str, np.ndarray], metadata: dict | None = None) -> None:
    """Write arrays (any dtype in :data:`SAFETENSORS_DTYPES`) to a .safetensors file, atomically."""
    header: dict = {}
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    off = 0
    arrays = []
    for name, a in tensors.items():
        a = np.ascontiguousarray(a)
        if a.dtype not in _ST_NAMES:
            raise ValueError(f"{name}: dtype {a.dtype} has no safetensors name")
        header[name] = {"dtype": _ST_NAMES[a.dtype], "shape": list(a.shape), "data_offsets": [off, off + a.nbytes]}
        off += a.nbytes
        arrays.append(a)
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for a in arrays:
            f.write(a.tobytes())
    os.replace(tmp, path)
