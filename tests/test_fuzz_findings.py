"""Inputs the readers' fuzzer found (tests/fuzz, reports/fuzz.md), minimized: each is refused with the reader's
one-line error naming the file, never an exception of another type."""

from __future__ import annotations

import struct

import pytest

from fpsim.io import InputError, open_file


def _npy(header: bytes, data: bytes = b"") -> bytes:
    header += b" " * (64 - 10 - len(header) - 1) + b"\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header + data


#: numpy's header parser tokenizes the text when it is no Python literal: an unclosed bracket raised
#: tokenize.TokenError (not a ValueError) out of the reader
UNCLOSED_SHAPE = _npy(b"{'descr': '<f4', 'fortran_order': False, 'shape': (3,", b"\0" * 12)


def test_npy_header_with_an_unclosed_bracket_is_refused_in_one_line(tmp_path):
    p = tmp_path / "x.npy"
    p.write_bytes(UNCLOSED_SHAPE)
    with pytest.raises(InputError, match=r"x\.npy: .*corrupt \.npy header") as e:
        open_file(p)
    assert "\n" not in str(e.value)


def test_npy_dtype_descr_numpy_reads_as_a_comma_string_is_refused_in_one_line(tmp_path):
    """numpy.dtype(",f4") parses the text as a comma-separated record description with ast.literal_eval and raised
    SyntaxError out of the reader."""
    p = tmp_path / "x.npy"
    p.write_bytes(_npy(b"{'descr': ',f4', 'fortran_order': False, 'shape': (1,), }", b"\0" * 4))
    with pytest.raises(InputError, match=r"x\.npy: .*corrupt \.npy header") as e:
        open_file(p)
    assert "\n" not in str(e.value)


def test_npz_member_with_an_unclosed_bracket_is_refused_in_one_line(tmp_path):
    import zipfile

    p = tmp_path / "x.npz"
    with zipfile.ZipFile(p, "w") as z:
        z.writestr("w.npy", UNCLOSED_SHAPE)
    try:
        refs, _ = open_file(p)
    except InputError as e:  # the whole file refused, or the member: either names the file in one line
        assert "x.npz" in str(e) and "\n" not in str(e)
        return
    for r in refs:
        assert r.error is not None and "x.npz" in r.error and "\n" not in r.error
        with pytest.raises(InputError):
            r.load()


def _gguf_string(b: bytes) -> bytes:
    return struct.pack("<Q", len(b)) + b


def test_gguf_with_a_metadata_key_given_twice_is_a_gguf_error(tmp_path):
    """gguf's reader raises KeyError for a duplicate key; read_gguf's one-line GGUFError names the file."""
    pytest.importorskip("gguf")
    from fpsim.torch.model_files import GGUFError, read_gguf

    kv = _gguf_string(b"general.architecture") + struct.pack("<I", 8) + _gguf_string(b"llama")  # 8: string
    p = tmp_path / "m.gguf"
    p.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 2) + kv + kv)  # version 3, no tensors, two key-values
    with pytest.raises(GGUFError, match=r"m\.gguf: corrupt GGUF file .*Duplicate general\.architecture") as e:
        read_gguf(p)
    assert "\n" not in str(e.value)
