"""Tensors of a ``.pt`` / ``.pth`` file: loaded once, ``weights_only=True`` always, read in place where it can be.

A zip-format checkpoint (what ``torch.save`` writes since torch 1.6) is loaded on the meta device: shapes,
dtypes and file offsets, no data; when every tensor is dense, contiguous and of a dtype whose bytes are read
as they are, each is read from its zip record with plain reads (checked against the record's size), so a file
truncated while it is read is an error, never a SIGBUS.  Other files are loaded again by torch with
``mmap=True`` (storages mapped, not read).  A legacy (non-zip) file, which torch can only read whole, is read
by :func:`fpsim.io.torchpickle.legacy_members`: its pickles through inert stand-ins, its storages in place.
Nested containers are walked: ``{"state_dict": {"fc.weight": t}}`` gives ``state_dict.fc.weight``, list
items get their index.  dtypes numpy lacks are viewed bit for bit as their ml_dtypes twin (bfloat16,
float8 E4M3/E5M2/E8M0 and the FNUZ variants; packed ``float4_e2m1fn_x2`` unpacked to two elements per
byte, low nibble first); complex32, quantized (qint8 …) and sparse tensors are reported, not guessed.
"""

from __future__ import annotations

import os
import pickle
import warnings
from pathlib import Path

import numpy as np

from .errors import InputError, MalformedFile
from .npz import zip_data_offset
from .rows import ArrayStorage, FileStorage, Member
from .torchpickle import HostileKey, check_keys, legacy_members, malformed_torch, pickle_free_members, tree_leaves

__all__ = ["torch_members"]


def _ml_views():
    import ml_dtypes
    import torch

    views = {torch.bfloat16: (torch.int16, ml_dtypes.bfloat16)}
    for tname, mname in (("float8_e4m3fn", "float8_e4m3fn"), ("float8_e5m2", "float8_e5m2"),
                         ("float8_e4m3fnuz", "float8_e4m3fnuz"), ("float8_e5m2fnuz", "float8_e5m2fnuz"),
                         ("float8_e8m0fnu", "float8_e8m0fnu")):
        if hasattr(torch, tname):
            views[getattr(torch, tname)] = (torch.uint8, getattr(ml_dtypes, mname))
    return views


def _to_numpy(t, views) -> np.ndarray:
    """A numpy view (no copy where torch allows) of a dense CPU tensor; ValueError with the reason otherwise."""
    import torch

    if t.layout != torch.strided:
        raise ValueError(f"is a sparse tensor ({t.layout}); save it dense (t.to_dense()) to analyse it")
    if t.is_quantized:
        raise ValueError(f"is a quantized tensor ({t.dtype}); fpsim reads float tensors (save t.dequantize())")
    stored = t.untyped_storage().nbytes() // max(t.element_size(), 1)
    if t.numel() > stored:  # stride 0 (an expand) or overlapping strides: work would grow with the view, not the file
        raise ValueError(f"is a view of {t.numel()} elements over a storage of {stored} (stride 0 or overlapping "
                         f"strides {tuple(t.stride())}); save it materialized (t.contiguous()) to analyse it")
    t = t.detach().resolve_conj().resolve_neg()
    if t.dtype in views:
        bits, ml = views[t.dtype]
        return t.view(bits).numpy().view(ml)
    if getattr(torch, "float4_e2m1fn_x2", None) is not None and t.dtype == torch.float4_e2m1fn_x2:
        import ml_dtypes

        b = t.view(torch.uint8).numpy()
        out = np.empty(b.shape[:-1] + (2 * b.shape[-1],) if b.ndim else (2,), np.uint8)
        out[..., 0::2] = b & 0xF
        out[..., 1::2] = b >> 4
        return out.view(ml_dtypes.float4_e2m1fn)
    try:
        return t.numpy()
    except (TypeError, RuntimeError):
        raise ValueError(f"has dtype {t.dtype}, which numpy cannot hold") from None


def _plain_dtypes(views) -> dict:
    """torch dtype → numpy dtype of the tensors read from the file in place (the bytes need no conversion)."""
    import torch

    d = {torch.float32: "<f4", torch.float64: "<f8", torch.float16: "<f2", torch.int8: "i1", torch.uint8: "u1",
         torch.int16: "<i2", torch.int32: "<i4", torch.int64: "<i8", torch.bool: "?", torch.complex64: "<c8",
         torch.complex128: "<c16"}
    for name, code in (("uint16", "<u2"), ("uint32", "<u4"), ("uint64", "<u8")):  # torch >= 2.3
        if hasattr(torch, name):
            d[getattr(torch, name)] = code
    return {k: np.dtype(v) for k, v in d.items()} | {k: np.dtype(ml) for k, (_, ml) in views.items()}


def _records(path: Path) -> tuple[dict[int, int], bool]:
    """{absolute data offset: size} of the file's stored zip records, and whether its byte order is little-endian."""
    import zipfile

    out, little = {}, True
    with zipfile.ZipFile(path) as zf, open(path, "rb") as fh:
        for info in zf.infolist():
            if info.filename.endswith("/byteorder"):
                little = zf.read(info).strip() == b"little"
            if info.compress_type != zipfile.ZIP_STORED:
                continue
            try:
                out[zip_data_offset(fh, info)] = info.file_size
            except ValueError:  # a bad local header: no record there, so a tensor pointing at it is an error
                continue
    return out, little


def _in_place(obj, plain, records: dict[int, int]) -> bool:
    """Whether every tensor of a meta-device load is a dense, C-contiguous tensor of a dtype read as is, at the
    start of a stored record (torch computes a meta storage's offset from its own 64-byte alignment: in a zip
    rewritten by another tool it can point between records)."""
    import torch

    if isinstance(obj, torch.Tensor):
        return (obj.is_meta and obj.layout == torch.strided and obj.is_contiguous() and obj.dtype in plain
                and getattr(obj.untyped_storage(), "_checkpoint_offset", None) in records)
    if isinstance(obj, dict):
        return all(_in_place(v, plain, records) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return all(_in_place(v, plain, records) for v in obj)
    return True


def _load(path: Path, plain: dict):
    """The file's object.  Its tensors are on the meta device (shape, dtype and file offset, no data) when every
    one can be read in place: those are then read with plain reads, so a file truncated while it is analysed
    (a training run rewriting its dump) is a "truncated" error, not a SIGBUS that kills the whole run as a
    memory mapping would.  Other zip files (strided views, packed FP4, quantized, sparse) are loaded by torch,
    memory-mapped."""
    import torch

    # torch's own deprecation notices while rebuilding storages (TypedStorage, ComplexHalf, quantized
    # tensors) are about torch internals, not about the user's file: keep them off the user's stderr
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:  # mmap=True: nothing is read or touched for a meta load; it also refuses the legacy format fast
            records, little = _records(path)
            if little:  # (torch 2.13 ends the process with SIGSEGV on a meta load of a big-endian file)
                obj = torch.load(path, map_location="meta", weights_only=True, mmap=True)
                if _in_place(obj, plain, records):
                    return obj, records
        except Exception:  # noqa: BLE001 - the load below reports what is wrong with the file
            pass
        return torch.load(path, map_location="cpu", weights_only=True, mmap=True), None


def _file_member(p: Path, name: str, t, dt: np.dtype, records: dict[int, int]) -> Member:
    """A meta tensor read in place: its bytes checked against the size of the zip record that holds them."""
    off = t.untyped_storage()._checkpoint_offset
    have = records.get(off)
    start = t.storage_offset() * dt.itemsize
    need = start + t.numel() * dt.itemsize
    shape = tuple(t.shape)
    if have is None:
        return Member(name, shape, dt, error=f"{p}: tensor {name!r}: its storage is not a stored record of the file")
    declared = t.untyped_storage().nbytes()
    if have != declared:  # torch.load refuses the whole file ("record size ... does not match expected size")
        raise _RecordSize(f"the storage record of tensor {name!r} holds {have} bytes, the pickle declares {declared}")
    if t.numel() and need > have:
        return Member(name, shape, dt, error=f"{p}: tensor {name!r}: shape {list(shape)} of {t.dtype} needs {need} "
                                             f"bytes of its storage, the file holds {have}: truncated or corrupt")
    return Member(name, shape, dt, lambda: FileStorage(p, off + start, dt))


class _RecordSize(ValueError):
    """A storage record whose size is not the one the pickle declares (what makes torch.load refuse the file)."""


def torch_members(path: str | os.PathLike) -> tuple[list[Member], list[str]]:
    """Every tensor of a torch file (loaded once) and notes on the values that are not tensors."""
    p = Path(path)
    try:
        import torch
    except ImportError:
        raise InputError(f"{p}: reading .pt/.pth needs torch (pip install 'fpsim[torch]')") from None
    views = _ml_views()
    plain = _plain_dtypes(views)
    with open(p, "rb") as f:
        zipped = f.read(4) == b"PK\x03\x04"  # torch's own test of the format
    if not zipped:  # the legacy format: torch would read it whole (no mmap); read here in place, never unpickled
        try:
            return legacy_members(p, plain, torch)
        except MalformedFile:
            raise
        except HostileKey as e:
            raise InputError(f"{p}: cannot read as a torch file: {e}") from None
        except Exception as e:  # noqa: BLE001 - a file that is not one: one line
            first = (str(e).strip().splitlines() or [type(e).__name__])[0][:120]
            raise InputError(f"{p}: cannot read as a torch file: not a zip archive (torch >= 1.6) nor torch's "
                             f"legacy format ({first})") from None
    try:
        check_keys(p, torch)  # torch's loader would hash them and hang
        obj, records = _load(p, plain)
    except HostileKey as e:
        raise InputError(f"{p}: cannot read as a torch file: {e}") from None
    except Exception as e:  # noqa: BLE001 - torch raises many types for bad files
        if isinstance(e, pickle.UnpicklingError):  # a pickled object beside the tensors (a TE DumpTensors file)
            try:
                return pickle_free_members(p, plain, torch)
            except Exception:  # noqa: BLE001, S110 - torch's reason is the one to give
                pass
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:120]
        raise InputError(f"{p}: cannot read as a weights-only torch file ({first})") from None
    members: list[Member] = []
    notes: list[str] = []
    problems: list[str] = []
    for name, v in tree_leaves(obj, "" if not isinstance(obj, torch.Tensor) else "tensor", notes, p):
        if isinstance(v, torch.Tensor) and records is not None:
            try:
                members.append(_file_member(p, name, v, plain[v.dtype], records))
            except _RecordSize as e:
                problems.append(str(e))
                members.append(Member(name, tuple(v.shape), np.dtype("u1"), error=f"{p}: {e}"))
        elif isinstance(v, torch.Tensor):
            try:
                a = _to_numpy(v, views)
            except ValueError as e:
                members.append(Member(name, tuple(v.shape), np.dtype("u1"), error=f"{p}: tensor {name!r} {e}"))
                continue
            members.append(Member(name, tuple(a.shape), a.dtype, lambda a=a: ArrayStorage(a)))
        else:
            notes.append(f"{p}: {name or '(top level)'!r} is not a tensor ({type(v).__name__})")
    if problems:
        raise malformed_torch(p, problems, members, notes)
    return members, notes

