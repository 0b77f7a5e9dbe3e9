"""Inputs the readers' fuzzer found (tests/fuzz, reports/fuzz.md), minimized: each is refused with the reader's
one-line error naming the file, never an exception of another type."""

from __future__ import annotations

import struct

import pytest

from fpsim.io import InputError, open_file


def _npy(header: bytes, data: bytes = b"") -> bytes:
    header += b" " * (64 - 10 - len(header) - 1) + b"\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header + data


def _assert_npy_refused(tmp_path, raw: bytes) -> None:
    """``raw`` as x.npy is refused with one line naming the file and a corrupt header."""
    p = tmp_path / "x.npy"
    p.write_bytes(raw)
    with pytest.raises(InputError, match=r"x\.npy: .*corrupt \.npy header") as e:
        open_file(p)
    assert "\n" not in str(e.value)


#: numpy's header parser tokenizes the text when it is no Python literal: an unclosed bracket raised
#: tokenize.TokenError (not a ValueError) out of the reader
UNCLOSED_SHAPE = _npy(b"{'descr': '<f4', 'fortran_order': False, 'shape': (3,", b"\0" * 12)


def test_npy_header_with_an_unclosed_bracket_is_refused_in_one_line(tmp_path):
    _assert_npy_refused(tmp_path, UNCLOSED_SHAPE)


def test_npy_dtype_descr_numpy_reads_as_a_comma_string_is_refused_in_one_line(tmp_path):
    """numpy.dtype(",f4") parses the text as a comma-separated record description with ast.literal_eval and raised
    SyntaxError out of the reader."""
    _assert_npy_refused(tmp_path, _npy(b"{'descr': ',f4', 'fortran_order': False, 'shape': (1,), }", b"\0" * 4))


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


def test_gguf_array_counting_past_the_end_of_the_file_is_refused_at_once(tmp_path):
    """An array field of 2^60 one-byte elements in a 40-byte file: gguf's reads past the end come back empty, so its
    parser looped for as long as the count said (a hang past the fuzzer's 2 s bound, its list of parts growing)."""
    pytest.importorskip("gguf")
    import signal

    from fpsim.torch.model_files import GGUFError, read_gguf

    kv = _gguf_string(b"a") + struct.pack("<IIQ", 9, 0, 1 << 60)  # 9: array, of 0: uint8, 2^60 of them
    p = tmp_path / "m.gguf"
    p.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + kv)

    def hang(*_):
        raise TimeoutError("read_gguf still parsing after 5 s")

    old = signal.signal(signal.SIGALRM, hang)
    signal.alarm(5)
    try:
        with pytest.raises(GGUFError, match=r"m\.gguf: .*past the end of the file"):
            read_gguf(p)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def test_legacy_pt_bytearray_longer_than_the_file_allocates_nothing(tmp_path):
    """A 20-byte legacy .pt file whose first pickle opcode is BYTEARRAY8 of 256 MiB: pickle's own loader zero-fills
    a bytearray of the stated length before reading (a 501-byte fuzzer input took 14 GB and 20 s)."""
    torch = pytest.importorskip("torch")
    import tracemalloc

    import ml_dtypes  # noqa: F401  (imported by the reader: not part of what is measured)

    assert torch
    p = tmp_path / "x.pt"
    p.write_bytes(b"\x80\x05\x96" + struct.pack("<Q", 256 << 20) + b"\x00" * 8 + b".")
    tracemalloc.start()
    try:
        with pytest.raises(InputError, match=r"x\.pt: .*BYTEARRAY8 of 268435456 bytes in a stream of 20 bytes"):
            open_file(p)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20


def test_npy_header_with_a_bytes_key_is_refused_in_one_line(tmp_path):
    """numpy sorts the header's keys: a bytes key beside str ones raised TypeError out of the reader."""
    _assert_npy_refused(tmp_path, _npy(b"{b'descr': '<f2', 'fortran_order': False, 'shape': (1,), }", b"\0" * 2))


def test_gguf_string_metadata_that_is_not_utf8_is_a_gguf_error(tmp_path):
    """gguf decodes a string value when asked for it: bytes that are not UTF-8 raised UnicodeDecodeError."""
    pytest.importorskip("gguf")
    from fpsim.torch.model_files import GGUFError, read_gguf

    kv = _gguf_string(b"general.architecture") + struct.pack("<I", 8) + _gguf_string(b"ll\xe1ma")
    p = tmp_path / "m.gguf"
    p.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + kv)
    with pytest.raises(GGUFError, match=r"m\.gguf: metadata general\.architecture: .*not UTF-8"):
        read_gguf(p)
