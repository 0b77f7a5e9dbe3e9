"""Tensors of a torch zip file whose pickle holds objects that torch's weights-only loader refuses, read without
unpickling those objects.

A Transformer Engine ``DumpTensors`` file is ``{"high_precision": tensor, "quantized": QuantizedTensor}``; the
second value is a pickled Python object (TE's ``Float8Tensor``, ``NVFP4Tensor`` …), so ``torch.load(...,
weights_only=True)`` refuses the whole file and the tensor beside it was lost.  Here the file's ``data.pkl`` is
run by a :class:`pickle.Unpickler` whose ``find_class`` hands out only inert stand-ins: torch's tensor-rebuild
functions become records of (storage, offset, shape, strides, dtype), ``OrderedDict`` and torch's dtype and storage
names are themselves, and every other global — ``io.open``, a TE class, ``builtins.getattr`` — becomes an
:class:`Opaque` object that accepts any arguments and does nothing.  Nothing outside this module is ever called,
so no object of the file is built; each one is reported by its class name.  Tensor data is read from the zip's
stored records as :mod:`fpsim.io.torchfile` reads it.
"""

from __future__ import annotations

import io
import math
import os
import pickle
import struct
import sys
import warnings
import zipfile
from collections import OrderedDict
from pathlib import Path

import numpy as np

from .errors import MalformedFile
from .npz import zip_data_offset
from .rows import ArrayStorage, FileStorage, Member

__all__ = ["HostileKey", "Opaque", "check_hashable", "check_keys", "key_text", "legacy_members", "pickle_free_members",
           "tree_leaves"]


class Opaque:
    """Stand-in for a pickled global fpsim does not build: called, constructed, given state or items, it stays
    inert (``qualname`` says what the file asked for)."""

    qualname = "?"

    def __new__(cls, *args, **kwargs):
        return super().__new__(cls)

    def __init__(self, *args, **kwargs):
        pass

    def __call__(self, *args, **kwargs):  # a global reached through getattr (protocol 2's nested names)
        return type(self)()

    def __setstate__(self, state):
        pass

    def append(self, item):
        pass

    def extend(self, items):
        pass

    def __setitem__(self, key, value):
        pass

    def __repr__(self):  # the same in every process (a name built from it must not hold an address)
        return f"<{self.qualname}>"


class _Storage:
    def __init__(self, key: str, dtype, numel: int, base: int = 0, size: int | None = None):
        self.key, self.dtype, self.numel = key, dtype, numel
        self.base, self.size = base, size  # a view of torch < 1.0: elements base .. base + size of storage `key`


class _StorageType:
    def __init__(self, dtype):
        self.dtype = dtype  # None: an UntypedStorage (the tensor's dtype comes with the rebuild call)


class _TensorDesc:
    def __init__(self, storage: _Storage, offset, shape, stride, dtype):
        self.storage, self.offset, self.shape, self.stride, self.dtype = storage, offset, shape, stride, dtype


def _v2(storage, offset, size, stride, *rest):
    return _TensorDesc(storage, offset, tuple(size), tuple(stride), storage.dtype)


def _v3(storage, offset, size, stride, requires_grad, hooks, dtype, *rest):
    return _TensorDesc(storage, offset, tuple(size), tuple(stride), dtype)


def _parameter(data, *rest):
    return data


class HostileKey(pickle.UnpicklingError):
    """A dict key or set item whose hashing would hang or crash the reader."""


_KEY_LIMIT = 100_000  # expanded size of a hashed tuple; a real file's keys are strings, ints, short tuples
_KEY_DEPTH = 64


def check_hashable(key) -> None:
    """Raise ``pickle.UnpicklingError`` unless hashing ``key`` is cheap and safe.

    A tuple's hash walks its items every time, shared or not: 40 nested pairs of one tuple (a few hundred bytes
    of pickle, memo references) take 2**40 steps, and a tuple nested 10**6 deep overflows the C stack.  The
    check walks each distinct tuple (or frozenset) once, summing expanded sizes, so it is linear in the
    pickle."""
    size: dict[int, int] = {}
    keep = []  # the containers sized, so that their ids stay theirs

    def expanded(v, depth: int) -> int:
        if type(v) not in (tuple, frozenset):
            return 1
        if depth > _KEY_DEPTH:
            raise HostileKey(f"a dict key or set item nested more than {_KEY_DEPTH} deep")
        n = size.get(id(v))
        if n is None:
            n = 1 + sum(expanded(x, depth + 1) for x in v)
            size[id(v)] = n
            keep.append(v)
            if n > _KEY_LIMIT:
                raise HostileKey(f"a dict key or set item of more than {_KEY_LIMIT} items once its "
                                             "shared parts are expanded (hashing it would take that long)")
        return n

    expanded(key, 0)


def _checked(load, keys):
    def run(self):
        for k in keys(self.stack):
            check_hashable(k)
        load(self)

    return run


def _ordered_dict(*args, **kwargs):
    if args:
        for item in args[0]:
            check_hashable(item[0] if type(item) is tuple and item else item)
    return OrderedDict(*args, **kwargs)


class _Unpickler(pickle._Unpickler):  # noqa: SLF001
    """The pure-Python unpickler: its memo is a dict.  The C one sizes an array to the largest memo index a
    pickle names (a 13-byte file asking for index 2**32 - 1 made it allocate 64 GiB).  Every key it hashes
    (dict keys, set items) is checked first by :func:`check_hashable`."""

    dispatch = dict(pickle._Unpickler.dispatch)  # noqa: SLF001
    dispatch[pickle.SETITEM[0]] = _checked(pickle._Unpickler.load_setitem, lambda s: s[-2:-1])  # noqa: SLF001
    for _op, _load in ((pickle.SETITEMS, pickle._Unpickler.load_setitems),  # noqa: SLF001
                       (pickle.DICT, pickle._Unpickler.load_dict)):  # noqa: SLF001
        dispatch[_op[0]] = _checked(_load, lambda s: s[0::2])  # the items since the mark: key, value, ...
    for _op, _load in ((pickle.ADDITEMS, pickle._Unpickler.load_additems),  # noqa: SLF001
                       (pickle.FROZENSET, pickle._Unpickler.load_frozenset)):  # noqa: SLF001
        dispatch[_op[0]] = _checked(_load, lambda s: s)
    del _op, _load

    def __init__(self, f, torch):
        super().__init__(f)
        self.torch = torch
        self._stream = f
        self.storage_dtypes = {}  # storage key -> dtype of its first persistent id (None: untyped, bytes)

    def _stream_size(self) -> int | None:
        try:
            pos = self._stream.tell()
            end = self._stream.seek(0, os.SEEK_END)
            self._stream.seek(pos)
            return end
        except (AttributeError, OSError, ValueError):
            return None

    def load_bytearray8(self):
        """BYTEARRAY8 of at most the stream's size: pickle's own makes the zero-filled ``bytearray(n)`` of the
        length the file states before reading (a 501-byte file stating 13 GB took 13 GB of memory)."""
        (n,) = struct.unpack("<Q", self.read(8))
        size = self._stream_size()
        if n > sys.maxsize or (size is not None and n > size):
            raise pickle.UnpicklingError(f"BYTEARRAY8 of {n} bytes in a stream of {size} bytes: truncated or corrupt")
        data = self.read(n)
        if len(data) != n:
            raise pickle.UnpicklingError("pickle data was truncated")
        self.append(bytearray(data))

    dispatch[pickle.BYTEARRAY8[0]] = load_bytearray8

    def find_class(self, module, name):
        torch = self.torch
        fixed = {("torch._utils", "_rebuild_tensor_v2"): _v2, ("torch._utils", "_rebuild_tensor_v3"): _v3,
                 ("torch._utils", "_rebuild_parameter"): _parameter,
                 ("torch._utils", "_rebuild_parameter_with_state"): _parameter,
                 ("collections", "OrderedDict"): _ordered_dict}
        if (module, name) in fixed:
            return fixed[(module, name)]
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        if (module, name) in (("torch.storage", "UntypedStorage"), ("torch", "UntypedStorage")):
            return _StorageType(None)
        if module == "torch" and name.endswith("Storage") and hasattr(torch, name):
            with warnings.catch_warnings():  # torch's notice that TypedStorage is deprecated
                warnings.simplefilter("ignore")
                dtype = getattr(getattr(torch, name), "dtype", None)
            if isinstance(dtype, torch.dtype):
                return _StorageType(dtype)
        return type("Opaque", (Opaque,), {"qualname": f"{module}.{name}"})

    def persistent_load(self, pid):
        # zip format: ("storage", type, key, location, numel); legacy format: the same and a view (always None
        # since torch 1.0), or ("module", class, source file, source) for a pickled nn.Module's class
        if isinstance(pid, tuple) and len(pid) == 4 and pid[0] == "module" and _is_opaque(pid[1]):
            return pid[1]
        if not (isinstance(pid, tuple) and len(pid) in (5, 6) and pid[0] == "storage"
                and isinstance(pid[1], _StorageType) and type(pid[2]) is str and type(pid[4]) is int):
            # named by type only: printing a pickled container can take time exponential in its size
            raise pickle.UnpicklingError(f"unexpected persistent id (a {type(pid).__name__})")
        key = str(pid[2])
        self.storage_dtypes.setdefault(key, pid[1].dtype)  # the first one met is the one the legacy format wrote
        view = pid[5] if len(pid) == 6 else None
        if view is not None:  # torch < 1.0: (view key, offset, size) in elements of the root storage `key`
            if not (type(view) is tuple and len(view) == 3 and all(type(v) is int and v >= 0 for v in view[1:])):
                raise pickle.UnpicklingError(f"a storage view record that is not (key, offset, size) "
                                             f"(a {type(view).__name__})")
            return _Storage(key, pid[1].dtype, pid[4], view[1], view[2])
        return _Storage(key, pid[1].dtype, pid[4])


def _is_opaque(v) -> bool:
    return isinstance(v, Opaque) or isinstance(v, type) and issubclass(v, Opaque)


def _pickle_record(zf: zipfile.ZipFile) -> zipfile.ZipInfo:
    """The archive's one ``data.pkl`` record (``pickle.UnpicklingError`` when there is not exactly one)."""
    pkl = [i for i in zf.infolist() if i.filename.endswith("/data.pkl") or i.filename == "data.pkl"]
    if len(pkl) != 1:
        raise pickle.UnpicklingError("no single data.pkl record")
    return pkl[0]


def _records(zf: zipfile.ZipFile, fh) -> tuple[bytes, dict[str, tuple[int, int]], bool]:
    """The pickle, {storage key: (absolute offset, size)} of the stored data records, little-endian or not."""
    pkl = _pickle_record(zf)
    prefix = pkl.filename[: -len("data.pkl")]
    data, little = {}, True
    for info in zf.infolist():
        if info.filename == prefix + "byteorder":
            little = zf.read(info).strip() == b"little"
        elif info.filename.startswith(prefix + "data/") and info.compress_type == zipfile.ZIP_STORED:
            data[info.filename[len(prefix) + 5 :]] = (zip_data_offset(fh, info), info.file_size)
    return zf.read(pkl), data, little


def _member(p: Path, name: str, t: _TensorDesc, plain: dict, records: dict) -> Member:
    ints = (*t.shape, *t.stride, t.offset)
    if not all(type(v) is int for v in ints) or len(t.stride) != len(t.shape) or any(s < 0 for s in t.shape):
        return Member(name, error=f"{p}: tensor {name!r} has a corrupt record (shape, strides or offset)")
    shape = t.shape
    dt = None if isinstance(t.dtype, (tuple, frozenset)) else plain.get(t.dtype)  # the file's: never hash a tuple
    if dt is None:
        # never print a container the file gave as the dtype (its text can be exponential in its size)
        shown = t.dtype if hasattr(t.dtype, "is_floating_point") else f"a {type(t.dtype).__name__}"
        return Member(name, shape, error=f"{p}: tensor {name!r} has dtype {shown}, which fpsim does not read from "
                                         "a file holding pickled objects")
    rec = records.get(t.storage.key)
    if rec is None:
        return Member(name, shape, dt, error=f"{p}: tensor {name!r}: its storage is not a stored record of the file")
    off, have = rec
    n, isz = math.prod(shape), dt.itemsize
    if any(s < 0 for s in t.stride) or t.offset < 0:
        return Member(name, shape, dt, error=f"{p}: tensor {name!r}: negative offset or strides {t.stride}")
    last = t.offset + sum((s - 1) * st for s, st in zip(shape, t.stride)) + 1 if n else 0
    view = t.storage.size is not None
    if n and view and last > t.storage.size:
        return Member(name, shape, dt, error=f"{p}: tensor {name!r}: shape {list(shape)} needs {last} elements of "
                                             f"its storage view, which has {t.storage.size}: corrupt")
    first = t.storage.base  # elements before the view in its storage (0 but for torch < 1.0's views)
    off += first * isz
    have = max(0, have - first * isz)
    if n and last * isz > have:
        return Member(name, shape, dt, error=f"{p}: tensor {name!r}: shape {list(shape)} needs {last * isz} bytes "
                                             f"of its storage, the file holds {have}: truncated or corrupt")
    dense = [st for s, st in zip(shape, t.stride) if s != 1] == [
        math.prod(shape[i + 1 :]) for i, s in enumerate(shape) if s != 1]
    if dense or not n:
        return Member(name, shape, dt, lambda: FileStorage(p, off + t.offset * isz, dt))
    if n > have // isz:  # stride 0 or overlapping strides: the work would grow with the view, not the file
        return Member(name, shape, dt, error=f"{p}: tensor {name!r} is a view of {n} elements over a storage of "
                                             f"{have // isz} (strides {t.stride}); save it materialized")

    def strided():
        base = np.memmap(p, np.dtype((np.void, isz)), mode="r", offset=off, shape=(have // isz,))  # ('<f1': rows)
        view = np.lib.stride_tricks.as_strided(base[t.offset :], shape, [s * isz for s in t.stride], writeable=False)
        return ArrayStorage(view.view(dt))

    return Member(name, shape, dt, strided)


def check_keys(p: Path, torch) -> None:
    """Raise :class:`HostileKey` when the pickle of the zip-format torch file ``p`` holds a dict key or set item
    that would hang or crash whoever hashes it (torch's own weights-only loader included); every other problem
    is left for the loader to report.  The pickle is run through the inert :class:`_Unpickler`: no object of
    the file is built."""
    try:
        with zipfile.ZipFile(p) as zf:
            raw = zf.read(_pickle_record(zf))
        _Unpickler(io.BytesIO(raw), torch).load()
    except HostileKey:
        raise
    except Exception:  # noqa: BLE001, S110 - not this check's to report
        pass


def pickle_free_members(p: Path, plain: dict, torch) -> tuple[list[Member], list[str]]:
    """Members and notes of the zip-format torch file ``p`` (raises ``pickle.UnpicklingError`` and the like when the
    file is not one); ``plain``: torch dtype → numpy dtype of the tensors read as stored."""
    with zipfile.ZipFile(p) as zf, open(p, "rb") as fh:
        raw, records, little = _records(zf, fh)
    if not little:
        raise pickle.UnpicklingError("a big-endian file")
    return _members_of(p, _Unpickler(io.BytesIO(raw), torch).load(), plain, records)


def _members_of(p: Path, obj, plain: dict, records: dict) -> tuple[list[Member], list[str]]:
    members: list[Member] = []
    notes: list[str] = []
    for name, v in tree_leaves(obj, "" if not isinstance(obj, _TensorDesc) else "tensor", notes, p):
        if isinstance(v, _TensorDesc):
            members.append(_member(p, name, v, plain, records))
        elif _is_opaque(v):
            notes.append(f"{p}: {name or '(top level)'!r} is a pickled {v.qualname} object, not a tensor; "
                         "fpsim does not unpickle objects")
        else:
            notes.append(f"{p}: {name or '(top level)'!r} is not a tensor ({type(v).__name__})")
    return members, notes


_LEGACY_MAGIC = 0x1950A86A20F9469CFC6C  # the first pickle of torch's legacy (non-zip) format, then its version
_LEGACY_VERSION = 1001


def legacy_members(p: Path, plain: dict, torch) -> tuple[list[Member], list[str]]:
    """Members and notes of a torch file in the legacy format (``torch.save(..., _use_new_zipfile_serialization=
    False)``, and every file of torch < 1.6), read in bounded memory: torch itself reads such a file whole (it
    cannot memory-map it).  The format is a run of pickles — magic number, version, system info, the object, the
    sorted storage keys — then each storage as its element count (8 bytes, little-endian) and its bytes
    (little-endian); files of torch < 1.0 may give a tensor a view of a storage (a view key, an offset and a size
    in its persistent id), read at that offset and bounded by that size.  The pickles go through the same inert
    :class:`_Unpickler` as a zip file's (no global of the file is ever called); each storage's place is found by
    reading its 8-byte count and seeking past its bytes, and its tensors are then read in place like a zip
    file's.  Raises ``pickle.UnpicklingError`` and the like when
    the file is not one."""
    size = p.stat().st_size
    with open(p, "rb") as f:
        if _Unpickler(f, torch).load() != _LEGACY_MAGIC:
            raise pickle.UnpicklingError("no zip archive and no legacy magic number")
        version = _Unpickler(f, torch).load()
        if version != _LEGACY_VERSION:
            shown = version if type(version) is int else type(version).__name__  # never print a pickled container
            raise pickle.UnpicklingError(f"legacy format version {str(shown)[:20]}, not {_LEGACY_VERSION}")
        info = _Unpickler(f, torch).load()
        if isinstance(info, dict) and info.get("little_endian") is False:
            raise pickle.UnpicklingError("a big-endian file")
        up = _Unpickler(f, torch)
        obj = up.load()
        keys = _Unpickler(f, torch).load()
        if not isinstance(keys, list):
            raise pickle.UnpicklingError("corrupt storage list")
        records, pos, problems = {}, f.tell(), []
        for key in map(str, keys):
            if key not in up.storage_dtypes:
                raise pickle.UnpicklingError(f"storage {key[:30]!r} is listed but no tensor uses it")
            dt = up.storage_dtypes[key]
            f.seek(pos)
            head = f.read(8)
            numel = int.from_bytes(head, "little", signed=True) if len(head) == 8 else 0
            if numel < 0:
                raise pickle.UnpicklingError(f"storage {key[:30]!r} has a negative size")
            nbytes = numel * (1 if dt is None else _itemsize(dt, torch))
            records[key] = (pos + 8, max(0, min(nbytes, size - pos - 8)))  # short: its tensors say "truncated"
            if len(head) < 8 or pos + 8 + nbytes > size:  # torch.load refuses the file ("unexpected EOF")
                problems.append(f"storage {key[:30]!r} is truncated ({records[key][1]} of {nbytes} bytes)")
            pos += 8 + nbytes
    members, notes = _members_of(p, obj, plain, records)
    if problems:
        raise malformed_torch(p, problems, members, notes)
    return members, notes


def _itemsize(dtype, torch) -> int:
    n = getattr(dtype, "itemsize", None)  # torch >= 2.1
    return int(n) if n else torch.empty((), dtype=dtype).element_size()


def key_text(k, i: int) -> str:
    """A dict key as part of a tensor's name: strings and small numbers as they are, anything else by its type
    and position (printing a pickled container can take time exponential in its size, and a huge int cannot be
    printed at all)."""
    if type(k) is str:
        return k
    if type(k) in (int, bool) and abs(k) < 10**18 or type(k) is float or k is None:
        return str(k)
    return f"<{type(k).__name__} key #{i}>"


def tree_leaves(obj, top: str, notes: list[str], p: Path, depth_limit: int = 64):
    """(dotted name, value) of every value under ``obj`` that is not a dict, list or tuple, depth-first in order.

    A container met a second time — shared by two keys, or holding itself — is entered once and noted where it
    recurs: walking it again would take time exponential in a file of a few kilobytes (a list holding itself 30
    times, or 40 nested pairs of one list).  A tensor held twice (tied weights) is a leaf and yields both names.
    Containers deeper than ``depth_limit`` are yielded as leaves (their caller notes them as not tensors)."""
    first: dict[int, str] = {}
    keep = []  # the containers seen, so that their ids stay theirs during the walk

    def walk(name: str, v, depth: int):
        if isinstance(v, (dict, list, tuple)) and depth < depth_limit:
            if id(v) in first:
                notes.append(f"{p}: {name or '(top level)'!r} is the container {first[id(v)] or '(top level)'!r} "
                             "again (shared, or a reference cycle); its tensors are read once")
                return
            first[id(v)] = name
            keep.append(v)
            items = v.items() if isinstance(v, dict) else enumerate(v)
            for i, (k, x) in enumerate(items):
                k = key_text(k, i)
                yield from walk(f"{name}.{k}" if name else k, x, depth + 1)
        else:
            yield name, v

    yield from walk(top, obj, 0)


def malformed_torch(p: Path, problems: list[str], members: list[Member], notes: list[str]) -> MalformedFile:
    """The :class:`MalformedFile` of a torch file that ``torch.load(weights_only=True)`` refuses, carrying the
    members whose bytes are still unambiguous (``lenient_members``)."""
    more = f"; and {len(problems) - 3} more" if len(problems) > 3 else ""
    e = MalformedFile(f"{p}: malformed torch file: {'; '.join(problems[:3])}{more} (torch.load refuses it)")
    e.lenient_members = ([m for m in members if m.error is None], notes, [m.name for m in members if m.error])
    return e
