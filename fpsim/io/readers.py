"""Reading captured tensors safely: .npz, .safetensors, .pt/.pth (SPEC: no pickle, bounded memory, bounded time).

:func:`open_tensors` lists the tensors of files, directories and globs *without loading them*, opening
each file exactly once (its header, central directory or pickle-free torch load); each
:class:`TensorRef` reads its data on demand, as a whole array (``load()``) or in row chunks along any
axis (``row_source(axis)``, a :class:`~fpsim.io.rows.RowSource`):

* ``.safetensors`` — header parsed by :func:`fpsim.io.safetensors.parse_header`, data read in place
  (every dtype, F4/F6 packed as the format defines), no torch;
* ``.npz`` — :mod:`fpsim.io.npz`: members checked before inflating, streamed, never unpickled;
* ``.pt`` / ``.pth`` — :mod:`fpsim.io.torchfile`: ``weights_only=True``, memory-mapped, nested dicts.

Paths: an existing path is always taken literally (even with ``*?[`` in its name); otherwise a pattern
with those characters is a glob.  Only regular files are read (a FIFO or ``/dev/zero`` named ``x.npz``
is refused before it is opened, so nothing hangs or grows without bound).  Directories are walked
recursively; unreadable directories and files of other types are reported, never silently dropped.

Errors are :class:`InputError` with one line naming the file (and tensor); notes (what was skipped and why) are
passed to ``on_note``.  A file its format's reference reader refuses (the safetensors library, ``numpy.load``,
``torch.load(weights_only=True)``) is a :class:`~fpsim.io.errors.MalformedFile` saying why; read with
``strict=False``, only its tensors whose bytes are unambiguous are listed (docs/analyze.md, "Malformed files").
"""

from __future__ import annotations

import errno
import glob
import math
import os
import re
import stat
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .errors import InputError, MalformedFile, printable
from .npz import npy_dtype, npz_members, read_npy_header
from .rows import ArrayStorage, FileStorage, Member, RowSource
from .safetensors import SAFETENSORS_DTYPES, check_header, malformed, read_entry, read_raw_header, write_safetensors
from .torchfile import torch_members

__all__ = ["InputError", "TensorRef", "RowSource", "open_tensors", "open_file", "check_input_file", "unique_labels",
           "SAFETENSORS_DTYPES", "write_safetensors", "SUFFIXES", "dump_iteration"]

#: File suffixes fpsim reads, each with its reader.
SUFFIXES = (".safetensors", ".npz", ".npy", ".pt", ".pth", ".bin")


@dataclass
class TensorRef:
    """One tensor of a file: name, shape, dtype known up front; data read on demand.

    ``error`` (a one-line message) when the tensor cannot be read; ``note`` when it is read with an
    assumption the user should see (e.g. ``|V2`` read as bfloat16).
    """

    source: str
    name: str
    shape: tuple[int, ...]
    dtype: np.dtype
    storage: Callable[[], object] | None = field(default=None, repr=False)
    error: str | None = None
    note: str | None = None

    @property
    def key(self) -> str:
        return f"{self.source}:{self.name}"

    @property
    def nbytes(self) -> int:
        n = 1
        for s in self.shape:
            n *= int(s)
        return n * self.dtype.itemsize

    def _storage(self):
        if self.error:
            raise InputError(self.error)
        return self.storage()

    def load(self) -> np.ndarray:
        """The whole array (read-only view of the file's mapping for .pt; a fresh array otherwise)."""
        st = self._storage()
        if isinstance(st, ArrayStorage):
            return st.arr.reshape(self.shape)
        if self.shape == ():
            return st.read_runs(0, 1, 0, 1).reshape(())
        return np.asarray(RowSource(st, self.shape)).reshape(self.shape)

    def row_source(self, axis: int = -1, label: str | None = None) -> RowSource | np.ndarray:
        """A :class:`RowSource` of ``moveaxis(x, axis, -1)`` read in row chunks (the array itself when 0-d);
        ``label`` names the tensor in its errors (default ``file:tensor``)."""
        if self.shape == ():
            return self.load()
        return RowSource(self._storage(), self.shape, axis, label=label or self.key)


def _from_members(path: Path, members: list[Member]) -> list[TensorRef]:
    return [TensorRef(str(path), m.name, tuple(m.shape), m.dtype, m.storage, m.error,
                      f"{path}:{m.name}: {m.note}" if m.note else None) for m in members]


def lenient(exc: MalformedFile, refs: list[TensorRef], notes: list[str], skipped: list[str]) -> MalformedFile:
    """``exc`` carrying what a lenient reading keeps: the tensors that are still unambiguous, the notes, and a
    message naming the tensors left out."""
    names = ", ".join(repr(printable(n)) for n in skipped[:5]) + (f" and {len(skipped) - 5} more" if len(skipped) > 5
                                                                  else "")
    why = f"; read leniently: {len(refs)} tensor(s) whose bytes are unambiguous" + (f", not {names}" if names else "")
    exc.lenient = (refs, notes, f"{exc}{why}")
    return exc


def _safetensors(path: Path) -> tuple[list[TensorRef], list[str]]:
    raw, size = read_raw_header(path)
    h = check_header(raw, path, size)
    refs = []
    for e in h.entries:
        if e.error:
            if not h.problems:  # (an entry that cannot be read always makes the file malformed)
                refs.append(TensorRef(str(path), e.name, (), np.dtype("u1"), error=e.error))
        elif e.bits < 8:  # packed sub-byte elements: unpacked whole (a quarter to a half of a float32 copy)
            refs.append(TensorRef(str(path), e.name, e.shape, e.dtype,
                                  lambda e=e: ArrayStorage(read_entry(path, e))))
        else:
            refs.append(TensorRef(str(path), e.name, e.shape, e.dtype,
                                  lambda e=e: FileStorage(path, e.offset, e.dtype)))
    if h.problems:
        raise lenient(MalformedFile(malformed(path, h)), refs, h.notes, [e.name for e in h.entries if e.error])
    return refs, h.notes


def _npz(path: Path):
    try:
        members, notes = npz_members(path)
    except MalformedFile as e:
        members, notes = e.lenient_members[:2]
        raise lenient(e, _from_members(path, members), notes, []) from None
    return _from_members(path, members), notes


def _torch(path: Path):
    try:
        members, notes = torch_members(path)
    except MalformedFile as e:
        members, notes, skipped = e.lenient_members
        raise lenient(e, _from_members(path, members), notes, skipped) from None
    return _from_members(path, members), notes


def _npy(path: Path):
    """One array, named by the file's stem (``fc1.weight.npy`` holds ``fc1.weight``): header read and checked against
    the file's size, data read in place; pickles (object dtypes) and structured dtypes refused, never loaded."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        try:
            shape, fortran, dt = read_npy_header(f)
            dt, note = npy_dtype(dt)
        except ValueError as e:
            raise InputError(f"{path}: {e}") from None
        offset = f.tell()
    if any(type(n) is not int or n < 0 for n in shape):
        raise InputError(f"{path}: invalid shape {shape}")
    need = math.prod(shape) * dt.itemsize
    if size - offset != need:
        raise InputError(f"{path}: array holds {size - offset} data bytes but its header declares shape {list(shape)} "
                         f"of {dt} ({need} bytes): {'truncated' if size - offset < need else 'trailing data'} "
                         "or corrupt")
    shape = tuple(shape)
    if fortran and len(shape) > 1:  # the C-ordered data of the reversed shape, transposed (a memory map, not a copy)
        def storage():
            return ArrayStorage(np.memmap(path, dt, "r", offset, shape=shape[::-1]).T)
    else:
        def storage():
            return FileStorage(path, offset, dt)
    return [TensorRef(str(path), path.stem, shape, dt, storage, None,
                      f"{path}:{path.stem}: {note}" if note else None)], []


#: .bin: PyTorch's ``pytorch_model.bin`` (torch.save's zip or legacy format), read as .pt files are: never unpickled
_READERS = {".safetensors": _safetensors, ".npz": _npz, ".npy": _npy, ".pt": _torch, ".pth": _torch, ".bin": _torch}


def _kind(mode: int) -> str:
    for test, what in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a directory")):
        if test(mode):
            return what
    return "not a regular file"


def _stat_error(p: str, e: OSError) -> str:
    if e.errno == errno.ELOOP:
        return f"{p}: symbolic link loop"
    if e.errno == errno.EACCES:
        return f"{p}: permission denied (a directory on the path cannot be searched)"
    if e.errno == errno.ENOTDIR:
        return f"{p}: a component of the path is not a directory"
    if e.errno == errno.ENOENT and os.path.islink(p):
        return f"{p}: broken symbolic link (its target does not exist)"
    if e.errno == errno.ENOENT:
        return f"{p}: no such file or directory"
    return f"{p}: cannot access ({e.strerror or type(e).__name__})"


def check_input_file(path: str | os.PathLike) -> None:
    """:class:`InputError` with one line naming ``path`` unless it is a readable regular file: what it is instead
    (a directory, a character device such as ``/dev/null``, a FIFO, a socket), or why it cannot be reached
    (missing, a broken link, a link loop, an unsearchable directory, no read permission).  Nothing is opened, so
    a FIFO cannot block."""
    p = os.fspath(path)
    try:
        st = os.stat(p)
    except OSError as e:
        raise InputError(_stat_error(p, e)) from None
    if not stat.S_ISREG(st.st_mode):
        raise InputError(f"{p}: {_kind(st.st_mode)}, not a regular file; refusing to read it")
    if not os.access(p, os.R_OK):
        raise InputError(f"{p}: not readable (permission denied)")


def _walk(d: str, files: list[Path], notes: list[str], errors: list[str]) -> None:
    other = 0
    for root, dirs, names in os.walk(d, onerror=lambda e: errors.append(
            f"{e.filename}: cannot list this directory ({e.strerror or type(e).__name__})")):
        dirs.sort()
        for n in sorted(names):
            q = Path(root) / n
            if q.suffix.lower() not in _READERS:
                other += 1
                continue
            try:
                st = os.stat(q)
            except OSError as e:
                errors.append(_stat_error(str(q), e))
                continue
            if not stat.S_ISREG(st.st_mode):
                notes.append(f"{q}: {_kind(st.st_mode)}, not a regular file")
                continue
            files.append(q)
    if other:
        notes.append(f"{d}: {other} file(s) whose suffix is not {', '.join(SUFFIXES)}")


def _expand(paths: Iterable[str], notes: list[str], errors: list[str]) -> list[Path]:
    """Files named by ``paths``; a path that does not resolve (and is no glob) raises :class:`InputError`."""
    out: list[Path] = []
    for p in paths:
        p = os.fspath(p)
        try:
            st = os.stat(p)
        except OSError as e:
            if e.errno == errno.ENOENT and not os.path.lexists(p) and any(ch in p for ch in "*?["):
                hits = sorted(glob.glob(p, recursive=True))
                if not hits:
                    raise InputError(f"{p}: no file matches this pattern") from None
                for h in hits:
                    if os.path.isdir(h):
                        continue
                    if Path(h).suffix.lower() in _READERS:
                        out += _expand([h], notes, errors)
                continue
            raise InputError(_stat_error(p, e)) from None
        if stat.S_ISDIR(st.st_mode):
            _walk(p, out, notes, errors)
        elif stat.S_ISREG(st.st_mode):
            out.append(Path(p))
        else:
            errors.append(f"{p}: {_kind(st.st_mode)}, not a regular file; refusing to read it")
    return out


def _distinct_names(path: Path, refs: list[TensorRef]) -> list[TensorRef]:
    """Each tensor of one file under its own printable name (:func:`~fpsim.io.errors.printable`).

    A file can hold two entries of one name (a zip member written twice; ``{"a.b": t, "a": {"b": u}}`` or keys
    ``5`` and ``"5"`` in a .pt file): a later one is renamed ``NAME#2`` (``#3`` …) with a note, so that no tensor
    is dropped as a "duplicate", and every caller that opens the file (a worker process too) sees the same names.
    """
    taken: set[str] = set()
    for r in refs:
        name = printable(r.name)
        if name in taken:
            k = 2
            while f"{name}#{k}" in taken:
                k += 1
            why = f"{path}:{name}#{k}: renamed: an earlier entry of this file is also named {name!r}"
            r.note = f"{r.note}; {why}" if r.note else why
            name = f"{name}#{k}"
        taken.add(name)
        r.name = name
    return refs


def open_file(path: str | os.PathLike, strict: bool = True) -> tuple[list[TensorRef], list[str]]:
    """The tensors of one file (opened once) and its notes; :class:`InputError` when the file is unreadable.
    Names are printable and distinct within the file (:func:`_distinct_names`).

    ``strict``: a file its format's reference reader refuses (:class:`MalformedFile`) raises, with the reason; else
    only its tensors that are still unambiguous are returned, the one line saying why among the notes (aliased bytes
    are never read)."""
    refs, notes, bad = _open(Path(path), strict)
    return refs, notes + ([bad] if bad else [])


def _open(p: Path, strict: bool) -> tuple[list[TensorRef], list[str], str | None]:
    """:func:`open_file`'s tensors, notes and, read leniently, the line saying why the file is malformed."""
    reader = _READERS.get(p.suffix.lower())
    if reader is None:
        raise InputError(f"{p}: unsupported file type (use {', '.join(SUFFIXES)})")
    try:
        st = os.stat(p)
        if not stat.S_ISREG(st.st_mode):
            raise InputError(f"{p}: {_kind(st.st_mode)}, not a regular file; refusing to read it")
        if not os.access(p, os.R_OK):
            raise InputError(f"{p}: not readable (permission denied)")
        try:
            refs, notes = reader(p)
            bad = None
        except MalformedFile as e:
            if strict or getattr(e, "lenient", None) is None:
                raise
            refs, notes, bad = e.lenient
        return _distinct_names(p, refs), notes, bad
    except OSError as e:
        raise InputError(f"{p}: cannot read ({e.strerror or type(e).__name__})") from None
    except RecursionError:
        raise InputError(f"{p}: structure nested too deeply") from None
    except MemoryError:
        raise InputError(f"{p}: out of memory while reading its index") from None


def open_tensors(paths: list[str] | str, on_error: Callable[[str], None] | None = None,
                 on_note: Callable[[str], None] | None = None,
                 on_file: Callable[[str], None] | None = None, strict: bool = True) -> list[TensorRef]:
    """All tensors of the given files / directories / globs, unloaded, each file opened once.

    A path that names nothing raises :class:`InputError`.  A file that cannot be opened raises
    :class:`InputError`, or is reported to ``on_error`` and skipped when that callback is given; notes on
    skipped entries (non-array members, non-tensor values, files of other types) go to ``on_note``;
    ``on_file`` receives every file the paths name, readable or not (e.g. to protect inputs from an output).
    ``strict=False``: a malformed file's unambiguous tensors are listed (:func:`open_file`) and the line saying why it
    is malformed goes to ``on_error`` (to ``on_note`` when ``on_error`` is not given).
    """
    if isinstance(paths, (str, os.PathLike)):
        paths = [os.fspath(paths)]
    notes: list[str] = []
    errors: list[str] = []
    files = _expand(list(paths), notes, errors)
    refs: list[TensorRef] = []

    def fail(msg: str) -> None:
        if on_error is None:
            raise InputError(msg)
        on_error(msg)

    for msg in errors:
        fail(msg)
    for path in files:
        if on_file is not None:
            on_file(str(path))
        try:
            r, n, bad = _open(path, strict)
        except InputError as e:
            fail(str(e))
            continue
        if bad:
            (on_error or notes.append)(bad)
        refs += r
        notes += n
    if on_note is not None:
        for n in notes:
            on_note(n)
    return refs


def unique_labels(sources: Iterable[str]) -> dict[str, str]:
    """A short label per source path: its basename, lengthened by parent directories until labels are unique;
    printable on one line (:func:`~fpsim.io.errors.printable`: a file name may hold a newline or undecodable bytes)."""
    srcs = sorted(set(sources))
    parts = {s: Path(os.path.abspath(s)).parts for s in srcs}
    depth = dict.fromkeys(srcs, 1)
    while True:
        label = {s: "/".join(parts[s][-depth[s]:]) for s in srcs}
        by: dict[str, list[str]] = {}
        for s in srcs:
            by.setdefault(label[s], []).append(s)
        grow = [s for group in by.values() if len(group) > 1 for s in group if depth[s] < len(parts[s])]
        if not grow:
            return {s: printable(v) for s, v in label.items()}
        for s in grow:
            depth[s] += 1


#: Transformer Engine's DumpTensors files: <layer>_<tensor>_iter_<NNNNNN>.pt (one file per layer, tensor, step).
_TE_DUMP = re.compile(r"_iter_(\d+)\.pt(?::|$)")


def dump_iteration(label: str) -> int | None:
    """The training iteration in a tensor label from a Transformer Engine DumpTensors file, else None."""
    m = _TE_DUMP.search(label)
    return int(m.group(1)) if m else None
