"""One fuzz target per reader of fpsim: a function of the file's bytes that reads them as the CLI does.

Each target writes the bytes to a fresh file (the readers take paths; the name gives the reader its suffix), opens it
through the public entry point the CLI uses and reads every tensor's data, in row chunks along the last and the first
axis as ``fpsim analyze`` does.  The reader's documented one-line error (:class:`fpsim.io.InputError`; ``GGUFError``
for GGUF; ``ValueError`` for :func:`fpsim.load_quantized`; the errors ``fpsim analyze`` reports per quantized tensor
for checkpoints) is the expected way to refuse a file; any other exception propagates and is a finding.

Targets: ``READERS[name](data)``.  Used by :mod:`tests.fuzz.fuzz` (atheris), by the regression tests of
``tests/test_fuzz_findings.py`` and by :mod:`tests.fuzz.make_corpus` (every seed must read without a finding).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path

#: In one checkpoint input: config.json, hf_quant_config.json and model.safetensors, joined by this separator
#: (fewer parts: the last one is the safetensors file, the first the config).
SEPARATOR = b"\n--fpsim-fuzz-part--\n"

_CHUNK_ROWS = 64  # rows per read: several reads per tensor even for the small files of a corpus

_workdir: Path | None = None
_serial = 0


def _dir() -> Path:
    global _workdir
    if _workdir is None:
        base = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
        _workdir = Path(tempfile.mkdtemp(prefix="fpsim-fuzz-", dir=base))
    return _workdir


def write_input(name: str, data: bytes) -> Path:
    """``data`` as a new file ``name`` (a new inode each time: a mapping of the previous input stays valid)."""
    global _serial
    _serial += 1
    d = _dir() / str(_serial % 4)
    d.mkdir(exist_ok=True)
    for old in d.iterdir():
        old.unlink()
    p = d / name
    p.write_bytes(data)
    return p


def _read_rows(src) -> None:
    """Every row of a :class:`fpsim.io.RowSource` (or the array itself for a 0-d tensor), in chunks."""
    import numpy as np

    if isinstance(src, np.ndarray):
        np.asarray(src).sum()
        return
    two = src.as_2d()
    for i in range(0, two.rows, _CHUNK_ROWS):
        two[i : i + _CHUNK_ROWS]


def read_all(path: Path) -> int:
    """Open ``path`` as ``fpsim analyze`` does and read every tensor along its last and first axis; the number of
    tensors read.  :class:`fpsim.io.InputError` where the file or a tensor is refused."""
    from fpsim.io import InputError, open_file

    refs, _ = open_file(path)
    n = 0
    for ref in refs:
        try:
            _read_rows(ref.row_source(-1, label=ref.key))
            if len(ref.shape) > 1:
                _read_rows(ref.row_source(0, label=ref.key))
            n += 1
        except InputError:
            continue  # one tensor refused in one line; the others are still read
    return n


def _by_suffix(name: str) -> Callable[[bytes], None]:
    def target(data: bytes) -> None:
        from fpsim.io import InputError

        try:
            read_all(write_input(name, data))
        except InputError:
            pass

    target.__name__ = f"read_{name.replace('.', '_')}"
    return target


def te_dump(data: bytes) -> None:
    """A Transformer Engine DumpTensors file: read as .pt, each tensor's role guessed from key and file name, its
    iteration taken from the name, as ``fpsim analyze`` does."""
    from fpsim.io import InputError, dump_iteration, open_file
    from fpsim.ranking import role_guess

    p = write_input("layers_3_mlp_fc1_weight_iter_000012.pt", data)
    try:
        refs, _ = open_file(p)
    except InputError:
        return
    for ref in refs:
        role_guess(ref.name, ref.source)
        if dump_iteration(ref.key) != 12:
            raise AssertionError(f"{ref.key}: iteration not read from the file name")
        try:
            _read_rows(ref.row_source(-1, label=ref.key))
        except InputError:
            continue


def gguf_model(data: bytes) -> None:
    """A llama GGUF file read by :func:`fpsim.torch.model_files.read_gguf` (GGUFError is its one-line refusal)."""
    from fpsim.torch.model_files import GGUFError, read_gguf

    try:
        read_gguf(write_input("model.gguf", data))
    except GGUFError:
        pass


#: What ``fpsim analyze`` reports in one ``error:`` line for a quantized tensor it cannot read or decode.
def _group_errors():
    from fpsim.io import InputError

    return (InputError, ValueError, TypeError, OverflowError, ArithmeticError)


def checkpoint(data: bytes) -> None:
    """A quantized checkpoint folder (``config.json``, ``hf_quant_config.json``, ``model.safetensors`` joined by
    :data:`SEPARATOR`): tensors listed, quantized groups found, each group's codes read and decoded and its record
    made, as ``fpsim analyze`` does."""
    from fpsim.io import InputError, open_tensors
    from fpsim.io.checkpoint_check import inspect_group
    from fpsim.io.checkpoints import decode_quantized, find_quantized, read_codes

    parts = data.split(SEPARATOR, 2)
    model = write_input("model.safetensors", parts[-1])
    for name, raw in zip(("config.json", "hf_quant_config.json"), parts[:-1]):
        (model.parent / name).write_bytes(raw)
    try:
        refs = open_tensors([str(model)])
    except InputError:
        return
    groups, rest, _, _ = find_quantized(refs)
    for g in groups:
        try:
            codes, scale, glob_, _ = read_codes(g) if g.error is None else (None, None, None, None)
            if codes is not None:
                decode_quantized(g, codes, scale, glob_)
            inspect_group(g, g.name)
        except _group_errors():
            continue
    for ref in rest:
        try:
            _read_rows(ref.row_source(-1, label=ref.key))
        except InputError:
            continue


def quantized_tensor(data: bytes) -> None:
    """A file of :func:`fpsim.save_quantized` (npz or safetensors, told apart by content) read back by
    :func:`fpsim.load_quantized` and dequantized; its documented refusal is a one-line ValueError."""
    from fpsim import dequantize, load_quantized

    p = write_input("tensor.fpq", data)
    try:
        qt = load_quantized(p)
    except ValueError:
        return
    try:
        dequantize(qt)
    except ValueError as e:  # a tensor the scheme cannot decode must say so when it is loaded, not here
        raise AssertionError(f"{p}: loaded, but dequantize refused it: {e}") from e


#: reader name → fuzz target (the corpus of each is tests/fuzz/corpus/<name>/).
READERS: dict[str, Callable[[bytes], None]] = {
    "safetensors": _by_suffix("x.safetensors"),
    "npz": _by_suffix("x.npz"),
    "npy": _by_suffix("x.npy"),
    "pt_zip": _by_suffix("x.pt"),
    "pt_legacy": _by_suffix("x.pt"),
    "te_dump": te_dump,
    "gguf": gguf_model,
    "checkpoint": checkpoint,
    "quantized": quantized_tensor,
}

CORPUS = Path(__file__).parent / "corpus"
