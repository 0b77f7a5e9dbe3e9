"""Every file fpsim reads or writes: captured tensors (:mod:`.readers`), safe output (:mod:`.files`)."""

from .files import OutputError, atomic_write, check_writable, dumps, to_json
from .readers import SAFETENSORS_DTYPES, InputError, RowSource, TensorRef, open_tensors, write_safetensors

__all__ = [
    "InputError",
    "OutputError",
    "RowSource",
    "SAFETENSORS_DTYPES",
    "TensorRef",
    "atomic_write",
    "check_writable",
    "dumps",
    "open_tensors",
    "to_json",
    "write_safetensors",
]
