"""Helpers shared by the oracle modules: float32 fields and code spellings, reading user files."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from ..codecs import decode
from ..formats import FormatSpec

__all__ = ["F32", "FLT_MAX", "code_bits", "code_info", "f32_fields", "fmin_nan", "f32_class", "hex32",
           "load_arrays", "positive_codes", "max_load_bytes", "check_load_size",
           "MAX_BYTES_ENV", "FileArrays"]

F32 = np.float32
FLT_MAX = F32(np.finfo(np.float32).max)


class DiagnosisError(RuntimeError):
    """:func:`fpsim.oracle.diff` failed after its inputs were checked: a bug in fpsim, not a bad input (the message
    names the original exception, chained as ``__cause__``)."""


def exception_line(e: BaseException) -> str:
    """``Type: first line of the message`` (``Type`` alone for an empty message): an exception in one line."""
    msg = str(e).splitlines()[0] if str(e) else ""
    return f"{type(e).__name__}{': ' + msg if msg else ''}"


@contextmanager
def internal_errors():
    """Inputs checked: any exception in the block (but MemoryError) is fpsim's bug, raised as DiagnosisError."""
    try:
        yield
    except MemoryError:
        raise
    except Exception as e:
        raise DiagnosisError(f"fpsim's diagnosis failed ({exception_line(e)}): a bug in fpsim, not in the inputs; "
                             "please report it with them") from e


def hex32(v) -> str:
    """The float32 bits of ``v`` as ``0xXXXXXXXX``."""
    return f"0x{int(np.asarray(v, np.float32).view(np.uint32)):08X}"


def f32_class(v) -> str:
    """``"nan"``, ``"inf"`` (either sign), ``"zero"``, ``"subnormal"`` or ``"normal"``: the class of float32 ``v``.

    JSON output writes NaN and ±inf as ``null`` (``fpsim.io.to_json``); this class, next to the value, says why.
    """
    b = int(np.asarray(v, np.float32).view(np.uint32))
    e, m = (b >> 23) & 0xFF, b & 0x7FFFFF
    if e == 0xFF:
        return "nan" if m else "inf"
    if e == 0:
        return "subnormal" if m else "zero"
    return "normal"


def f32_fields(v) -> dict:
    """The float32 ``v``: value, bits in hex, sign / exponent / mantissa fields and class (:func:`f32_class`)."""
    v = F32(v)
    b = int(np.asarray(v).view(np.uint32))
    s, e, m = b >> 31, (b >> 23) & 0xFF, b & 0x7FFFFF
    cls = f32_class(v)
    return {
        "value": float(v),
        "hex": f"0x{b:08X}",
        "sign": s,
        "exponent_field": e,
        "mantissa_field": f"0x{m:06X}",
        "unbiased_exponent": (e - 127) if cls == "normal" else (-126 if cls == "subnormal" else None),
        "class": cls,
    }


def code_bits(code: int, spec: FormatSpec) -> str:
    """Code as its fields separated by dots: s.ee.m for E2M1, eeeeeeee for E8M0."""
    b = format(code, f"0{spec.bits}b")
    parts = []
    i = 0
    if spec.signed:
        parts.append(b[0])
        i = 1
    parts.append(b[i : i + spec.ebits])
    if spec.mbits:
        parts.append(b[i + spec.ebits :])
    return ".".join(parts)


def code_info(code: int, spec: FormatSpec) -> dict:
    """Code, hex spelling, fields in binary, decoded value and its class (:func:`f32_class`) of one code."""
    v = decode(np.array([code]), spec)[0]
    return {
        "code": int(code),
        "hex": f"0x{code:0{(spec.bits + 3) // 4}X}",
        "binary": code_bits(int(code), spec),
        "value": float(v),
        "class": f32_class(v),
    }


def positive_codes(spec: FormatSpec) -> tuple[np.ndarray, np.ndarray]:
    """Finite non-negative grid values (ascending, float64) and the positive code of each."""
    table = spec.decode_table()
    n = 1 << (spec.bits - 1 if spec.signed else spec.bits)
    vals, codes = [], []
    for c in range(n):
        v = float(table[c])
        if math.isfinite(v) and (not vals or v > vals[-1]):
            vals.append(v)
            codes.append(c)
    return np.array(vals), np.array(codes)


def fmin_nan(a, b):
    """min with a NaN first argument propagating (CUDA ``fminf`` would drop it)."""
    return a if (a != a or a <= b) else b



#: Environment variable that sets the largest array (and the largest file total) :func:`load_arrays` reads, in bytes.
MAX_BYTES_ENV = "FPSIM_ORACLE_MAX_BYTES"


def _available_memory() -> int | None:
    """Bytes of memory available to a new allocation (Linux ``MemAvailable``; else the free physical pages)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def max_load_bytes() -> tuple[int, str]:
    """The largest array :func:`load_arrays` reads, in bytes, and where that bound comes from (for messages).

    ``$FPSIM_ORACLE_MAX_BYTES`` when set (an integer; tests use it), else a quarter of the available memory
    (8 GiB where it cannot be read): :func:`fpsim.oracle.diff` holds several float32 copies of its input and a
    few arrays of its size per hypothesis, so an array larger than that cannot be diagnosed anyway, and reading
    it first would only exhaust memory before any message.
    """
    env = os.environ.get(MAX_BYTES_ENV)
    if env:
        try:
            return max(0, int(env)), f"set by ${MAX_BYTES_ENV}"
        except ValueError:
            raise ValueError(f"${MAX_BYTES_ENV}={env!r}: give a number of bytes") from None
    avail = _available_memory()
    if avail is None:
        return 8 << 30, f"the default where the available memory is unknown; ${MAX_BYTES_ENV} sets it"
    return avail // 4, f"a quarter of the available memory; ${MAX_BYTES_ENV} sets it"


def check_load_size(where: str, nbytes: int, what: str = "") -> None:
    """Raise ``ValueError`` (one line naming ``where``) when ``nbytes`` exceed :func:`max_load_bytes`."""
    bound, why = max_load_bytes()
    if nbytes > bound:
        raise ValueError(f"{where}: {what + ' needs ' if what else ''}{nbytes} bytes, more than fpsim's oracle "
                         f"reads ({bound} bytes, {why}); refusing to load it")


def _npy(p: Path) -> dict[str, np.ndarray]:
    """The array of a ``.npy`` file: header read and checked against the file's size before any data is read.

    The header and dtype rules of :mod:`fpsim.io.npz`'s archive members (its ``read_npy_header``, ``npy_dtype``):
    object dtypes (pickles) and structured dtypes are refused, ``|V2`` is bfloat16; the data must be exactly
    ``prod(shape) · itemsize`` bytes after the header (fewer: truncated; more: not what numpy writes), and its size
    within :func:`max_load_bytes`.  Fortran order is read as the C-ordered data of the reversed shape, transposed.
    """
    from ..io.npz import npy_dtype, read_npy_header

    with open(p, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        try:
            shape, fortran, dt = read_npy_header(f)
            dt, _ = npy_dtype(dt)  # pickles and structured dtypes refused, |V2 read as bfloat16
        except ValueError as e:
            raise ValueError(f"{p}: {e}") from None
        if any(type(s) is not int or s < 0 for s in shape):
            raise ValueError(f"{p}: invalid shape {shape}")
        need = math.prod(shape) * dt.itemsize  # Python ints: no overflow for any declared shape
        have = size - f.tell()
        if have != need:
            raise ValueError(f"{p}: array holds {have} data bytes but its header declares shape {list(shape)} of "
                             f"{dt} ({need} bytes): {'truncated' if have < need else 'trailing data'} or corrupt")
        check_load_size(f"{p}: array", need, f"shape {list(shape)} of {dt}")
        data = np.fromfile(f, dt, count=math.prod(shape))
    if data.size != math.prod(shape):
        raise ValueError(f"{p}: array data is truncated")
    arr = data.reshape(shape[::-1]).T if fortran and len(shape) > 1 else data.reshape(shape)
    return {"": np.ascontiguousarray(arr)}


class FileArrays(Mapping):
    """The arrays of one ``.npz`` or ``.safetensors`` file by name, each read when it is first asked for.

    Listing the names reads nothing but the file's index.  An array that cannot be read — a pickled npz member
    (never unpickled), a truncated or corrupt one, one larger than :func:`max_load_bytes` — is refused when asked
    for, with one line naming the file and the array (``ValueError``); the file's other arrays stay readable.
    The arrays read from one file are also within :func:`max_load_bytes` together."""

    def __init__(self, path: Path, refs):
        self.path, self._refs, self._got, self._total = path, {r.name: r for r in refs}, {}, 0

    def __getitem__(self, name: str) -> np.ndarray:
        if name in self._got:
            return self._got[name]
        r = self._refs[name]  # KeyError: no such array
        from ..io import InputError

        p = self.path
        try:
            if r.error:
                raise InputError(r.error)
            check_load_size(f"{p}: array {r.name!r}", r.nbytes, f"shape {list(r.shape)} of {r.dtype}")
            if self._got:
                check_load_size(f"{p}", self._total + r.nbytes, f"its {len(self._got) + 1} arrays read together")
            arr = np.asarray(r.load())
        except (InputError, ValueError) as e:
            raise ValueError(_one_line(p, e)) from None
        except MemoryError:
            raise ValueError(f"{p}: array {name!r}: out of memory while reading it") from None
        except Exception as e:  # OSError (the file removed meanwhile) …: one line, no traceback
            raise ValueError(f"{p}: array {name!r}: cannot read ({exception_line(e)})") from None
        self._total += r.nbytes
        self._got[name] = arr
        return arr

    def __contains__(self, name) -> bool:
        return name in self._refs

    def __iter__(self):
        return iter(self._refs)

    def __len__(self) -> int:
        return len(self._refs)


def _one_line(p: Path, e: Exception) -> str:
    """The one-line message of a refused file or array, naming the file (pickles said so in numpy's words)."""
    msg = str(e).splitlines()[0] if str(e) else "cannot read"
    why = msg[len(str(p)) + 2:] if msg.startswith(f"{p}: ") else msg  # the reason, not the path (which may say it)
    if "pickle" in why.lower() and "pickled" not in why:  # fpsim.io's "… holds Python objects (a pickle) …"
        return f"{p}: refusing to load pickled data (allow_pickle=False): {why}"
    return msg if msg.startswith(str(p)) else f"{p}: cannot read: {msg}"


def _tensors(p: Path) -> FileArrays:
    """The arrays of a ``.npz`` or ``.safetensors`` file through :func:`fpsim.io.open_file` (members and headers
    checked against the file before any data is read: zip bombs, truncated members and offsets past the end are
    refused by name when asked for), read one by one as asked, each and all read together within
    :func:`max_load_bytes`."""
    from ..io import InputError, open_file

    try:
        refs, _ = open_file(p)
    except InputError as e:
        raise ValueError(str(e).splitlines()[0] if str(e) else f"{p}: cannot read") from None
    return FileArrays(p, refs)


def load_arrays(path) -> Mapping[str, np.ndarray]:
    """The arrays of a ``.npz``, ``.npy`` or ``.safetensors`` file by name; never unpickles, never over-allocates.

    Every array's declared size is checked before it is allocated: against the file (a truncated ``.npy``, an
    npz member that inflates to more or less than its ``.npy`` header says or more than deflate can produce, a
    safetensors entry whose offsets run past the file) and against :func:`max_load_bytes`.  ``.npz`` and
    ``.safetensors`` go through :func:`fpsim.io.open_file` (names printable; a ``|V2`` npz member is bfloat16,
    F4/F6 safetensors tensors are unpacked to one element per byte) and give a :class:`FileArrays`: each array is
    read when asked for, so a pickled or corrupt member is refused by name without making the file's other arrays
    unusable.  ``.npy`` arrays are keyed ``""``.

    Raises ``ValueError`` with a one-line message naming the file (and the array) for a path that is not a
    readable regular file (missing, a directory, a device, a FIFO: said as :func:`fpsim.io.check_input_file` says
    it), an unsupported suffix, an unreadable file index, and — when it is asked for — a pickled, inconsistent or
    too large array.
    """
    from ..io import InputError, check_input_file

    p = Path(path)
    try:
        check_input_file(p)
    except InputError as e:
        raise ValueError(str(e)) from None
    suffix = p.suffix.lower()
    if suffix not in (".npz", ".npy", ".safetensors"):
        raise ValueError(f"{p}: unsupported file type {suffix!r} (use .npz, .npy or .safetensors)")
    try:
        return _npy(p) if suffix == ".npy" else _tensors(p)
    except ValueError as e:
        raise ValueError(_one_line(p, e)) from None
    except MemoryError:
        raise ValueError(f"{p}: out of memory while reading it") from None
    except Exception as e:  # OSError, EOFError, struct.error …: one line, no traceback
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ValueError(f"{p}: cannot read ({type(e).__name__}: {msg})") from None
