"""Reading a tensor in row ranges of its 2-D view along any axis, in bounded memory.

A tensor ``x`` of shape ``S`` analysed along axis ``k`` is viewed as ``moveaxis(x, k, -1)`` flattened to
``rows × S[k]``: every row is one line of ``x`` along ``k``.  With ``A = prod(S[:k])``,
``K = S[k]`` and ``B = prod(S[k+1:])``, the C-ordered data is an ``A × K × B`` block and row
``r = a·B + b`` is ``x3[a, :, b]``.  :class:`RowSource` reads rows ``i..j`` by asking its storage
for whole ``K × B`` slabs where the range covers them and for ``K`` strided runs of ``j - i``
elements otherwise, so a chunk of rows costs memory proportional to the chunk along every axis
(``--axis 0`` on a 1 GB tensor reads 64 MB at a time, never the whole tensor or its transpose).
The runs are read :data:`_TILE_BYTES` at a time and transposed :data:`_STEP` lines at a time, in cache;
a file reads each run alone (one ``preadv``) unless its stride is short (:data:`_RUN_BYTES`), so a scan
along a leading axis reads each byte about once (it read every stride whole for every chunk: 8x the
tensor for 8 chunks) — 0.19 s per 256 MiB float32 scan along axis 0 against 0.6-1.0 s before, 0.07 s
along the last axis.  A stride too short for that (``B`` of at most :data:`_RUN_BYTES`) is read whole, so a file
read in many chunks is first copied once in row order into an unnamed file in TMPDIR (:meth:`RowSource._row_copy`):
4 GiB of float32 [262144, 4096] along axis 0 in 256 chunks took 195 s (the whole file read per chunk), 15 s now.
"""

from __future__ import annotations

import errno
import math
import os
import shutil
import tempfile

import numpy as np

from .errors import InputError

__all__ = ["RowSource", "FileStorage", "ArrayStorage", "Member", "temp_file"]

_GROUP_BYTES = 8 << 20  # bytes read per call when gathering short strided runs
_RUN_BYTES = 16 << 10  # a stride this short is read whole with its neighbours (about the cost of a system call)
_TILE_BYTES = 256 << 10  # bytes of the runs read at a time along a leading axis (then transposed in cache)
_STEP = 16  # runs transposed at a time: 16 elements written per row of the output, about one cache line
_COPY_AFTER = 4  # a short-stride tensor read in row ranges smaller than 1/this of it is first copied in row order
_COPY_TILE_BYTES = 32 << 20  # bytes of the tensor transposed at a time into that copy
_STEP_ELEMS = 4096  # elements of the source per step of a transposing copy, at least (lines of 256 or fewer)


def temp_file(need: int, fill):
    """An unnamed temporary file of ``need`` bytes in TMPDIR, its blocks reserved, written by ``fill(file)``; None
    when TMPDIR has not the space (before the work, or when the disk fills while it is written).  The file is
    closed (so freed) if anything fails.  Reserving the blocks first means a disk that fills later is an error
    here, never a SIGBUS in a mapping of the file."""
    tmpdir = tempfile.gettempdir()
    if shutil.disk_usage(tmpdir).free < need + (64 << 20):
        return None
    tmp = tempfile.TemporaryFile(dir=tmpdir)
    try:
        try:
            os.posix_fallocate(tmp.fileno(), 0, need)
        except OSError as e:
            if e.errno in (errno.ENOSPC, errno.EDQUOT):
                tmp.close()
                return None
            tmp.truncate(need)  # a file system without fallocate: the free-space check above must do
        try:
            fill(tmp)
            tmp.flush()
        except OSError as e:
            if e.errno in (errno.ENOSPC, errno.EDQUOT):
                tmp.close()
                return None
            raise
    except BaseException:
        tmp.close()
        raise
    return tmp


class FileStorage:
    """Raw C-ordered elements at ``offset`` of a file (a path, or an open binary file kept alive)."""

    def __init__(self, path: str | os.PathLike, offset: int, dtype: np.dtype, fileobj=None):
        self.path, self.offset, self.dtype, self.fileobj = str(path), int(offset), np.dtype(dtype), fileobj

    def __del__(self):
        # an unnamed temporary file (an inflated npz member) is owned here: closing it frees its disk space
        f = getattr(self, "fileobj", None)
        if f is not None:
            f.close()

    def _open(self):
        if self.fileobj is not None:
            return _NoClose(self.fileobj)
        return open(self.path, "rb")

    def read(self, start: int, count: int) -> np.ndarray:
        """Elements ``start .. start+count-1`` (flat); :class:`InputError` when the file is shorter."""
        return self.read_runs(start, 1, 0, count)[0]

    def read_runs(self, start: int, n: int, stride: int, count: int) -> np.ndarray:
        """``n`` runs of ``count`` elements, run ``t`` starting at element ``start + t·stride``: an n × count array."""
        out = np.empty((n, count), self.dtype)
        isz = self.dtype.itemsize
        if n > 1 and count and stride * isz <= max(_RUN_BYTES, 2 * count * isz):
            # short, close runs: read groups of whole strides in one call and keep the first `count` of each — a
            # few large reads instead of n small ones; only where a stride holds little besides its run, since the
            # bytes in between are read too (a run far shorter than its stride is read alone, below)
            g = max(1, _GROUP_BYTES // (stride * isz))
            buf = np.empty(min(g, n) * stride, self.dtype)
            with self._open() as f:
                for t0 in range(0, n, g):
                    m = min(g, n - t0)
                    need = ((m - 1) * stride + count) * isz
                    f.seek(self.offset + (start + t0 * stride) * isz)
                    if f.readinto(memoryview(buf.view(np.uint8))[:need]) != need:
                        raise InputError(f"{self.path}: tensor data is truncated")
                    out[t0 : t0 + m] = buf[: m * stride].reshape(m, stride)[:, :count]
            return out
        if not count:
            return out
        with self._open() as f:
            raw = memoryview(out.view(np.uint8)).cast("B")
            size = count * isz
            pread = getattr(os, "preadv", None)
            fd = f.fileno() if pread is not None and hasattr(f, "fileno") else None
            if fd is not None and self.fileobj is not None and hasattr(f, "flush"):
                f.flush()  # a file written through Python's buffer (an inflated npz member): reads below bypass it
            for t in range(n):
                pos = self.offset + (start + t * stride) * isz
                dst = raw[t * size : (t + 1) * size]
                if fd is not None:  # one system call per run, no seek (a buffered seek + read costs 5x more)
                    got = 0
                    while got < size:  # a regular file reads short only at its end (then 0): retry to be sure
                        k = pread(fd, [dst[got:]], pos + got)
                        if k <= 0:
                            break
                        got += k
                else:
                    f.seek(pos)
                    got = f.readinto(dst)
                if got != size:
                    raise InputError(f"{self.path}: tensor data is truncated")
        return out


class _NoClose:
    """Context manager over a kept-open file that does not close it."""

    def __init__(self, f):
        self.f = f

    def __enter__(self):
        return self.f

    def __exit__(self, *exc):
        return False


class ArrayStorage:
    """The elements of an in-memory (or memory-mapped) array in C order, without copying it whole."""

    def __init__(self, arr: np.ndarray):
        self.arr = arr
        self.dtype = arr.dtype
        self.path = "<array>"

    def read_runs(self, start: int, n: int, stride: int, count: int) -> np.ndarray:
        flat = self.arr.reshape(-1) if self.arr.flags.c_contiguous else None
        if flat is None:  # a strided view (a transposed or sliced tensor): copy only the runs asked for
            if n == 1:  # one run: _flat_range's copy itself, unless it is a view of the array (1-d, or one part)
                run = _flat_range(self.arr, start, count)
                return (run.copy() if np.may_share_memory(run, self.arr) else run).reshape(1, count)
            out = np.empty((n, count), self.dtype)
            for t in range(n):
                out[t] = _flat_range(self.arr, start + t * stride, count)
            return out
        if n == 1:
            return flat[start : start + count].reshape(1, count).copy()
        # through opaque bytes of the element's size: as_strided rebuilds the array from its __array_interface__,
        # whose type string numpy cannot read back for some ml_dtypes ('<f1' of float8_e5m2)
        raw = flat[start:].view(np.dtype((np.void, flat.itemsize)))
        v = np.lib.stride_tricks.as_strided(raw, shape=(n, count), strides=(stride * flat.itemsize, flat.itemsize),
                                            writeable=False)
        return v.copy().view(self.dtype)


def _flat_range(arr: np.ndarray, start: int, count: int) -> np.ndarray:
    """Elements ``start .. start+count-1`` of ``arr`` in C order, for any strided ``arr``, copying only those:
    whole sub-arrays along the first axis are sliced (a strided copy numpy does fast), the partial ones at
    either end recursively.  (Fancy indexing builds index arrays several times the chunk's size and is slower.)"""
    if arr.ndim <= 1 or count == 0:
        return arr.reshape(-1)[start : start + count]  # a view for 0-d and 1-d arrays
    inner = math.prod(arr.shape[1:])
    if inner == 0:
        return np.empty(0, arr.dtype)
    i, off = divmod(start, inner)
    parts = []
    if off:
        take = min(count, inner - off)
        parts.append(_flat_range(arr[i], off, take))
        count, i = count - take, i + 1
    whole = count // inner
    if whole:
        parts.append(arr[i : i + whole].reshape(-1))
        count, i = count - whole * inner, i + whole
    if count:
        parts.append(_flat_range(arr[i], 0, count))
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


def _transpose_into(dst: np.ndarray, src: np.ndarray) -> None:
    """``dst[...] = src`` with its last two axes swapped, :data:`_STEP` lines of ``src`` at a time, or more where
    its lines are short (at least :data:`_STEP_ELEMS` elements a step): numpy's transposing copy of the whole
    writes one element per output row in turn, a page apart (4-10x slower); 16 lines of 16 elements a step spend
    the time in Python (float32 [131072, 16]: 9.2 ms by 16 lines, 1.7 ms by 256; [8192, 1024]: 14.8 ms either way
    and 29.7 ms by the square 256 × 256 blocks used before for the row-ordered copy, 2026-12-05)."""
    if src.shape[-1] == 1 or src.shape[-2] == 1:  # a line: the same elements in the same order
        dst[...] = src.reshape(dst.shape)
        return
    step = max(_STEP, _STEP_ELEMS // src.shape[-1])
    for k in range(0, src.shape[-2], step):
        dst[..., k : k + step] = src[..., k : k + step, :].swapaxes(-1, -2)


class RowSource:
    """A tensor read in row ranges of its 2-D view along ``axis`` (see the module docstring).

    ``shape`` is the shape of ``moveaxis(x, axis, -1)`` (what the analysis reports); ``as_2d()`` gives the
    ``rows × cols`` view; ``src[i:j]`` reads rows ``i..j-1``; ``numpy.asarray(src)`` reads everything.
    """

    def __init__(self, storage, shape: tuple[int, ...], axis: int = -1, two_d: bool = False,
                 label: str | None = None):
        shape = tuple(int(s) for s in shape)
        nd = len(shape)
        where = label or storage.path  # "file:tensor" where the caller knows the tensor's name
        if nd == 0:
            raise InputError(f"{where}: a 0-d tensor has no rows")
        if not -nd <= axis < nd:
            raise InputError(f"{where}: axis {axis} is out of range for a {nd}-d tensor {list(shape)}")
        self.storage, self.orig_shape, self.axis, self._two_d, self.label = storage, shape, axis % nd, two_d, label
        self.dtype = np.dtype(storage.dtype)
        k = self.axis
        self._A, self._K, self._B = math.prod(shape[:k]), shape[k], math.prod(shape[k + 1 :])
        self.cols = self._K
        self.rows = self._A * self._B
        self.size = math.prod(shape)
        self.nbytes = self.size * self.dtype.itemsize
        moved = shape[:k] + shape[k + 1 :] + (shape[k],)
        self.shape = (self.rows, self.cols) if two_d else moved
        self.ndim = len(self.shape)
        self._copy: FileStorage | bool | None = None  # the row-ordered copy (False: TMPDIR had no room for it)

    def as_2d(self) -> RowSource:
        """The ``rows × cols`` view (same storage)."""
        return RowSource(self.storage, self.orig_shape, self.axis, two_d=True, label=self.label)

    def stored_2d(self) -> RowSource:
        """The tensor in its stored order (rows along its last axis, whatever ``axis`` is), 2-D: for what does not
        depend on the order, read contiguously and the same way for every ``axis``."""
        return RowSource(self.storage, self.orig_shape, -1, two_d=True, label=self.label)

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, sl: slice) -> np.ndarray:
        if not isinstance(sl, slice) or sl.step not in (None, 1):
            raise TypeError("RowSource supports contiguous row slices only")
        if not self._two_d:
            return np.asarray(self)[sl]
        i, j, _ = sl.indices(self.rows)
        return self._rows(i, max(i, j))

    def _rows(self, i: int, j: int) -> np.ndarray:
        try:
            return self._read_rows(i, j)
        except InputError as e:  # the storage names the file only ("F: tensor data is truncated"): name the tensor
            msg, path = str(e), self.storage.path
            if self.label and self.label not in msg:
                msg = f"{self.label}:{msg[len(path) + 1:] if msg.startswith(f'{path}:') else ' ' + msg}"
            raise InputError(msg) from None

    def _row_copy(self, n: int):
        """The tensor in row order (``rows × K``, C order) in an unnamed temporary file, made on the first request
        of ``n`` rows that needs it; None where strided reads serve.  A file whose stride ``B`` is short is read
        whole strides at a time (a run of a few hundred bytes every few KiB costs a system call or a page either
        way), so each range of rows reads the whole tensor: a scan in c chunks read it c times (16 times for 1 GiB
        of float32 [131072, 2048] along axis 0, 4.6 s against 0.64 s along the last axis).  Here it is read once,
        a tile of whole slab rows at a time (the size of the request, 1 MiB to :data:`_COPY_TILE_BYTES`),
        transposed in memory and written to the copy; every range of rows is then one contiguous read.  Where TMPDIR
        has not the room, the strided reads serve (slower, same bytes)."""
        if self._copy is None:
            isz = self.dtype.itemsize
            if not (isinstance(self.storage, FileStorage) and 1 < self._B and self._B * isz <= _RUN_BYTES
                    and self.nbytes > _COPY_AFTER * n * self._K * isz):
                return None
            tile = max(1 << 20, min(_COPY_TILE_BYTES, n * self._K * isz))  # memory: about the caller's chunk
            tmp = temp_file(self.nbytes, lambda f: self._write_copy(f, tile))
            self._copy = False if tmp is None else FileStorage(f"{self.storage.path} (row-ordered copy)", 0,
                                                               self.dtype, fileobj=tmp)
        return self._copy or None

    def _write_copy(self, f, tile_bytes: int) -> None:
        A, K, B, isz = self._A, self._K, self._B, self.dtype.itemsize
        t = max(1, tile_bytes // (B * isz))  # slab rows (of B elements) per tile
        buf = np.empty((B, min(t, K)), self.dtype)
        fd = f.fileno()
        for a in range(A):
            for k0 in range(0, K, t):
                tk = min(t, K - k0)
                tile = self.storage.read_runs((a * K + k0) * B, 1, 0, tk * B).reshape(tk, B)
                dst = buf if tk == buf.shape[1] else np.empty((B, tk), self.dtype)
                _transpose_into(dst, tile)
                for b in range(B):  # row a·B + b of the copy holds x3[a, :, b]; this tile is its part k0 .. k0+tk
                    data = memoryview(dst[b].view(np.uint8))
                    pos, done = ((a * B + b) * K + k0) * isz, 0
                    while done < len(data):
                        done += os.pwrite(fd, data[done:], pos + done)

    def _read_rows(self, i: int, j: int) -> np.ndarray:
        K, B = self._K, self._B
        copy = self._row_copy(j - i) if j - i < self.rows else None
        if copy is not None:
            return copy.read(i * K, (j - i) * K).reshape(j - i, K)
        if B == 1:  # rows along the stored last axis: one contiguous run, read into its own array (no copy)
            return self.storage.read_runs(i * K, 1, 0, (j - i) * K).reshape(j - i, K)
        out = np.empty((j - i, K), self.dtype)
        st = self.storage
        isz = self.dtype.itemsize
        pos = i
        while pos < j:
            a, b0 = divmod(pos, B)
            if b0 == 0 and j - pos >= B:  # whole K × B slabs: one contiguous read
                na = (j - pos) // B
                slab = st.read_runs(a * K * B, 1, 0, na * K * B).reshape(na, K, B)
                dst = out[pos - i : pos - i + na * B].reshape(na, B, K)
                _transpose_into(dst, slab)
                pos += na * B
            else:  # part of one slab: K strided runs of w = b1 - b0 elements, read and transposed a tile at a time
                w = min(B - b0, j - pos)
                dst = out[pos - i : pos - i + w]
                t = max(1, _TILE_BYTES // max(1, w * isz * _STEP)) * _STEP
                for k0 in range(0, K, t):
                    runs = st.read_runs((a * K + k0) * B + b0, min(t, K - k0), B, w)
                    _transpose_into(dst[:, k0 : k0 + len(runs)], runs)
                pos += w
        return out

    def __array__(self, dtype=None, copy=None):
        a = self._rows(0, self.rows)
        a = a if self._two_d else a.reshape(self.shape)
        return a if dtype is None else a.astype(dtype)


class Member:
    """One member: name, shape, dtype, and how to get its data (``storage()``); or ``error`` / ``note``."""

    def __init__(self, name, shape=(), dtype=None, storage=None, error=None, note=None):
        self.name, self.shape, self.storage, self.error, self.note = name, shape, storage, error, note
        self.dtype = np.dtype("u1") if dtype is None else dtype
