"""Members of an ``.npz`` archive, listed in one pass and read in bounded memory, never unpickled.

The archive is opened once; each ``.npy`` member's header is read (inflating only its first bytes)
and checked before any data is touched:

* the declared uncompressed size must equal the ``.npy`` header plus ``prod(shape) · itemsize``, and
  for a deflated member it must be possible at all — deflate cannot exceed 1032:1, so a member that
  declares more than that over its compressed size is a lie (a "zip bomb") and is refused;
* stored members (``numpy.savez``) are read in place: their data is a byte range of the archive;
* deflated members (``numpy.savez_compressed``) are inflated once, streaming, into memory when at most
  :data:`SPILL_BYTES`, else into an unnamed temporary file (after checking that the temporary
  directory has room), so memory stays bounded for any size and any ``--axis``;
* object members (pickles) are refused, structured dtypes are not tensors; a ``|V2`` member (how numpy
  saves an ``ml_dtypes.bfloat16`` array: the name is lost, the bytes are kept) is read as bfloat16
  with a note; other unnamed ``|Vn`` dtypes are refused with the reason.
"""

from __future__ import annotations

import math
import os
import struct
import tempfile
import tokenize
import zipfile
import zlib
from pathlib import Path

import numpy as np

from .errors import InputError, MalformedFile
from .rows import ArrayStorage, FileStorage, Member, temp_file

__all__ = ["npz_members", "read_npy_header", "npy_dtype", "zip_data_offset", "SPILL_BYTES", "MAX_DEFLATE_RATIO"]

SPILL_BYTES = 64 << 20
MAX_DEFLATE_RATIO = 1032  # deflate's largest possible expansion (258-byte matches coded in 2 bits)
_BAD = (ValueError, zipfile.BadZipFile, zlib.error, EOFError, OSError, SyntaxError, UnicodeDecodeError,
        struct.error, NotImplementedError, RuntimeError, TypeError)


class _Refused(ValueError):
    """A member fpsim will not read; the message is a verb phrase ("is encrypted", "holds …")."""


def read_npy_header(f):
    """(shape, fortran_order, dtype) of the ``.npy`` stream ``f``, left at the first data byte; versions 1.0 and 2.0
    (numpy's public readers), anything else refused."""
    version = np.lib.format.read_magic(f)
    read = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}.get(version)
    if read is not None:
        try:
            hdr = read(f)
        except (tokenize.TokenError, SyntaxError, TypeError) as e:  # numpy tokenizes the header and evaluates its
            # literals, the dtype's too (a descr of ",f4" is a comma-string to numpy), and sorts the keys: an unclosed
            # bracket, a stray comma, a bytes key beside str ones
            raise _Refused(f"has a corrupt .npy header (not a Python literal: {e.args[0]})") from None
    else:  # 3.0 (utf-8 field names) has no public reader; 2.0's differs only in the text encoding
        raise _Refused(f"uses .npy format version {version[0]}.{version[1]}, which fpsim does not read")
    return hdr


def npy_dtype(dt: np.dtype):
    """(dtype to read a ``.npy`` array's bytes as, note) or raise ValueError with the reason (a verb phrase)."""
    if dt.hasobject:
        raise _Refused("holds Python objects (a pickle); refusing to load it")
    if dt.fields is not None:
        raise _Refused(f"has a structured dtype {dt} (named fields), not a tensor of numbers")
    if dt.kind == "V":
        if dt.itemsize == 2:
            import ml_dtypes

            return np.dtype(ml_dtypes.bfloat16), (
                "dtype |V2 read as bfloat16 (numpy saves ml_dtypes.bfloat16 as unnamed 2-byte data)")
        raise _Refused(f"has an unnamed {dt.itemsize}-byte dtype |V{dt.itemsize} (numpy drops the names of ml_dtypes "
                         "float8/float4 types): cannot tell which format it holds; save it as .safetensors")
    return dt, None


def zip_data_offset(fh, info: zipfile.ZipInfo) -> int:
    """Absolute offset of a member's bytes in the archive (after its local header)."""
    fh.seek(info.header_offset)
    local = fh.read(30)  # the fixed part of a zip local file header (APPNOTE 4.3.7)
    if len(local) != 30 or local[:4] != b"PK\x03\x04":
        raise _Refused("is corrupt (bad local file header)")
    name_len, extra_len = struct.unpack("<2H", local[26:30])
    return info.header_offset + 30 + name_len + extra_len


def _member(path: Path, zf: zipfile.ZipFile, fh, info: zipfile.ZipInfo) -> Member:
    name = info.filename[:-4]
    if info.flag_bits & 0x1:
        raise _Refused("is encrypted")
    if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
        raise _Refused(f"uses zip compression method {info.compress_type} (numpy writes stored or deflated)")
    if info.compress_type == zipfile.ZIP_DEFLATED and info.file_size > MAX_DEFLATE_RATIO * info.compress_size + 1024:
        raise _Refused(f"declares {info.file_size} bytes from {info.compress_size} compressed bytes, more than "
                         "deflate can produce: refusing to inflate it")
    with zf.open(info) as f:
        shape, fortran, dt = read_npy_header(f)
        head_len = f.tell()
    if any(type(s) is not int or s < 0 for s in shape):
        raise _Refused(f"has an invalid shape {shape}")
    dt, note = npy_dtype(dt)
    need = math.prod(shape) * dt.itemsize
    if info.file_size - head_len != need:
        raise _Refused(f"declares {info.file_size - head_len} data bytes but shape {list(shape)} of {dt} "
                         f"needs {need}: truncated or corrupt")
    if fortran and len(shape) > 1:
        # Fortran order: the C-ordered data of the reversed shape; read whole and reorder (rare in practice)
        return Member(name, tuple(shape), dt, _fortran_storage(path, info, head_len, dt, shape), note=note)
    if info.compress_type == zipfile.ZIP_STORED:
        start = zip_data_offset(fh, info)
        return Member(name, tuple(shape), dt, _stored_storage(path, info, start, head_len, dt), note=note)
    return Member(name, tuple(shape), dt, _inflating_storage(path, info, head_len, dt, need), note=note)


def _stored_storage(path, info, start: int, head_len: int, dt):
    """A stored member read in place, its CRC-32 checked over its bytes at the first read (numpy.load, through
    zipfile, refuses a member whose CRC does not match; zipfile checks it at the header only for small members)."""
    checked = []

    def storage():
        if not checked:
            crc = 0
            with open(path, "rb") as f:
                f.seek(start)
                for left in range(info.compress_size, 0, -(1 << 22)):
                    crc = zlib.crc32(f.read(min(left, 1 << 22)), crc)
            if crc != info.CRC:
                raise InputError(f"{path}: member {info.filename[:-4]!r} is corrupt: the CRC-32 of its bytes is not "
                                 "the archive's (numpy.load refuses it)")
            checked.append(True)
        return FileStorage(path, start + head_len, dt)

    return storage


def _inflate_into(path, info, head_len, sink, need):
    with zipfile.ZipFile(path) as zf, zf.open(info) as f:
        f.read(head_len)
        left = need
        while left:
            b = f.read(min(left, 1 << 20))
            if not b:
                raise EOFError("stream ended early")
            sink.write(b)
            left -= len(b)
        f.read(1)  # reach the end so zipfile checks the CRC


def _spill(path, name: str, need: int, fill):
    """:func:`fpsim.io.rows.temp_file`, or an :class:`InputError` saying that TMPDIR has not the space (never a
    "corrupt member")."""
    tmp = temp_file(need, fill)
    if tmp is None:
        raise InputError(f"{path}: member {name!r} inflates to {need} bytes; {tempfile.gettempdir()} (TMPDIR) has "
                         "not that much free space")
    return tmp


def _inflating_storage(path, info, head_len, dt, need):
    def storage():
        try:
            if need <= SPILL_BYTES:
                buf = bytearray()

                class _Sink:
                    write = buf.extend

                _inflate_into(path, info, head_len, _Sink, need)
                return ArrayStorage(np.frombuffer(bytes(buf), dt))
            tmp = _spill(path, info.filename[:-4], need, lambda f: _inflate_into(path, info, head_len, f, need))
            return FileStorage(f"{path}:{info.filename}", 0, dt, fileobj=tmp)
        except InputError:
            raise
        except _BAD as e:
            raise InputError(f"{path}: member {info.filename[:-4]!r} is truncated or corrupt "
                             f"({type(e).__name__}: {str(e)[:60]})") from None

    return storage


_PIECE_BYTES = 4 << 20  # bytes of a Fortran-ordered member reordered at a time


def _put_flat(dst: np.ndarray, start: int, data: np.ndarray) -> None:
    """Write ``data`` (1-D) to the elements ``start ..`` of the strided view ``dst`` in C order: whole sub-arrays
    along the first axis in one assignment, the partial ones at either end recursively (the inverse of
    :func:`fpsim.io.rows._flat_range`)."""
    count = data.size
    if dst.ndim <= 1:
        dst.reshape(-1)[start : start + count] = data  # a 1-d (strided) view: reshape keeps it a view
        return
    inner = math.prod(dst.shape[1:])
    i, pos = divmod(start, inner)
    done = 0
    if pos:
        take = min(count, inner - pos)
        _put_flat(dst[i], pos, data[:take])
        done, i = take, i + 1
    whole = (count - done) // inner
    if whole:
        dst[i : i + whole] = data[done : done + whole * inner].reshape((whole,) + dst.shape[1:])
        done, i = done + whole * inner, i + whole
    if done < count:
        _put_flat(dst[i], 0, data[done:])


def _reorder_into(path, info, head_len, out: np.ndarray) -> None:
    """Stream a Fortran-ordered member's data (the C-ordered elements of the reversed shape) into ``out`` (C order,
    the member's shape), :data:`_PIECE_BYTES` at a time: each piece is whole rows of the reversed array where they
    fit, written as one tile of ``out``'s transpose — a cache-sized strided copy, not an element-wise walk."""
    dst = out.T
    isz = out.dtype.itemsize
    row = math.prod(dst.shape[1:]) or 1  # elements of one row of the reversed array
    step = row * max(1, _PIECE_BYTES // (row * isz)) if row * isz <= _PIECE_BYTES else max(1, _PIECE_BYTES // isz)
    buf = np.empty(min(step, out.size), out.dtype)
    with zipfile.ZipFile(path) as zf, zf.open(info) as f:
        f.read(head_len)
        for p in range(0, out.size, step):
            n = min(step, out.size - p)
            view = memoryview(buf[:n].view(np.uint8))
            got = 0
            while got < n * isz:
                k = f.readinto(view[got:])
                if not k:
                    raise EOFError("stream ended early")
                got += k
            _put_flat(dst, p, buf[:n])
        f.read(1)  # reach the end so zipfile checks the CRC


def _fortran_storage(path, info, head_len, dt, shape):
    """A Fortran-ordered member holds the C-ordered elements of the reversed shape: they are reordered once, while
    inflated (or copied), into C order — in memory up to :data:`SPILL_BYTES`, else into an unnamed temporary file
    (written through its mapping) — and then read as any member is.  Memory stays bounded (one piece of
    :data:`_PIECE_BYTES`), and every later pass reads C-ordered rows instead of walking a transposed view
    element by element (3.5× slower)."""
    need = math.prod(shape) * dt.itemsize
    name = info.filename[:-4]

    def storage():
        try:
            if need <= SPILL_BYTES:
                out = np.empty(shape, dt)
                _reorder_into(path, info, head_len, out)
                return ArrayStorage(out)

            def fill(f):
                mm = np.memmap(f, dt, mode="r+", shape=tuple(shape))
                _reorder_into(path, info, head_len, mm)
                mm.flush()

            return FileStorage(f"{path}:{info.filename}", 0, dt, fileobj=_spill(path, name, need, fill))
        except InputError:
            raise
        except _BAD as e:
            raise InputError(f"{path}: member {name!r} is truncated or corrupt "
                             f"({type(e).__name__}: {str(e)[:60]})") from None

    return storage


def npz_members(path: str | os.PathLike) -> tuple[list[Member], list[str]]:
    """The members of an npz file (one open of the archive) and the notes on members that are not arrays."""
    p = Path(path)
    try:
        zf = zipfile.ZipFile(p)
    # NotImplementedError: a corrupt central directory that asks for a zip version zipfile does not know
    except (zipfile.BadZipFile, EOFError, ValueError, struct.error, NotImplementedError) as e:
        raise InputError(f"{p}: not an npz file (bad zip: {type(e).__name__})") from None
    out, notes, copies, dups = [], [], {}, []
    with zf, open(p, "rb") as fh:
        magic = fh.read(4)
        infos = zf.infolist()
        for info in infos:
            copies[info.filename] = copies.get(info.filename, 0) + 1
        for info in infos:
            if info.filename.endswith("/"):  # a directory (ZipInfo.is_dir fails on an empty name: IndexError)
                continue
            if not info.filename.endswith(".npy"):
                notes.append(f"{p}: member {info.filename!r} is not a .npy array")
                continue
            name = info.filename[:-4]
            if zf.getinfo(info.filename) is not info:  # numpy.load reads the last member of a name: so does fpsim
                n = copies[info.filename]
                why = "twice" if n == 2 else f"{n} times"
                dups.append(Member(name, error=f"{p}: member {name!r} appears {why} in the archive; this earlier copy "
                                               "is not read (numpy.load reads the last)"))
                continue
            try:
                out.append(_member(p, zf, fh, info))
            except _Refused as e:
                out.append(Member(name, error=f"{p}: member {name!r} {e}"))
            except _BAD as e:  # numpy's header parser or zipfile/zlib on a damaged member
                out.append(Member(name, error=f"{p}: member {name!r} is not a valid .npy array or is corrupt "
                                              f"({type(e).__name__}: {str(e).splitlines()[0][:60] if str(e) else ''})"))
    out += dups  # after the copies read, so that those keep the member's name
    if not out and not notes:
        raise InputError(f"{p}: no arrays in this npz file")
    if magic not in (b"PK\x03\x04", b"PK\x05\x06"):  # numpy.load tells an npz by these first bytes
        e = MalformedFile(f"{p}: malformed npz: the file does not begin with a zip header ({len(zf.filelist)} "
                          "member(s) found after other data; numpy.load refuses it)")
        e.lenient_members = (out, notes)
        raise e
    return out, notes
