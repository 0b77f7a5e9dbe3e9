"""Every file fpsim reads or writes: captured tensors (:mod:`.readers`), safetensors (:mod:`.safetensors`),
npz (:mod:`.npz`), torch files (:mod:`.torchfile`), quantized tensors (:mod:`.quantized`), safe output
(:mod:`.files`)."""

from .errors import InputError
from .files import OutputError, atomic_write, check_writable, dumps, to_json
from .quantized import load_quantized, save_quantized
from .readers import (
    SUFFIXES,
    RowSource,
    TensorRef,
    check_input_file,
    dump_iteration,
    open_file,
    open_tensors,
    unique_labels,
)
from .safetensors import SAFETENSORS_DTYPES, write_safetensors

__all__ = [
    "dump_iteration",
    "InputError",
    "OutputError",
    "RowSource",
    "SAFETENSORS_DTYPES",
    "SUFFIXES",
    "TensorRef",
    "atomic_write",
    "check_input_file",
    "check_writable",
    "dumps",
    "open_file",
    "load_quantized",
    "open_tensors",
    "save_quantized",
    "to_json",
    "unique_labels",
    "write_safetensors",
]
