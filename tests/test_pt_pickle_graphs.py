"""The pickle-free ``.pt`` reader on hostile pickles: a huge memo index allocates nothing (legacy and zip
files), and a shared-container DAG (legacy version field, persistent id, storage key) is one line, not an
exponential walk."""

from __future__ import annotations

import pickle
import struct
import subprocess
import sys
import zipfile

import pytest

pytest.importorskip("torch")

_MAGIC = pickle.dumps(0x1950A86A20F9469CFC6C, protocol=2)


def _peak_growth_mib(code: str) -> float:
    """Peak resident growth (MiB) of a fresh interpreter running ``code`` after importing fpsim's torch reader."""
    prog = ("import resource, torch\nfrom fpsim.io.torchfile import torch_members\n"
            "base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n" + code +
            "\nprint((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) / 1024)")
    out = subprocess.run([sys.executable, "-c", prog], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return float(out.stdout.strip().splitlines()[-1])


def test_a_huge_memo_index_in_a_legacy_pt_pickle_allocates_nothing(tmp_path):
    # 13 bytes: a pickle storing one int at memo index 40 000 000.  The C unpickler sizes its memo array to
    # the index (and zeroes it): 640 MB resident for a 13-byte file; 0xFFFFFFFF asks for 64 GB
    p = tmp_path / "memo.pt"
    p.write_bytes(b"\x80\x02K\x01r" + struct.pack("<I", 40_000_000) + b".")
    grew = _peak_growth_mib(
        f"try:\n    torch_members({str(p)!r})\nexcept Exception as e:\n    assert 'legacy' in str(e), e")
    assert grew < 200, f"{grew:.0f} MiB resident for a 13-byte file"


def test_a_huge_memo_index_in_a_refused_zip_pickle_allocates_nothing(tmp_path):
    # torch's weights-only loader refuses the global (so fpsim's own reader of TE dumps runs the pickle),
    # and the pickle asks for memo index 40 000 000
    pkl = (b"\x80\x02cos\nsystem\nK\x01r" + struct.pack("<I", 40_000_000) + b"0}q\x00.")
    p = tmp_path / "memo_zip.pt"
    with zipfile.ZipFile(p, "w", zipfile.ZIP_STORED) as zf:
        zf.writestr("archive/data.pkl", pkl)
        zf.writestr("archive/byteorder", "little")
        zf.writestr("archive/version", "3\n")
    grew = _peak_growth_mib(f"try:\n    torch_members({str(p)!r})\nexcept Exception:\n    pass")
    assert grew < 200, f"{grew:.0f} MiB resident for a {p.stat().st_size}-byte file"


def test_a_legacy_version_that_is_a_shared_container_dag_is_one_line_not_a_hang(tmp_path):
    # the version pickle is 40 nested pairs of one tuple: printing it would take 2**40 steps
    body = b"\x80\x02)q\x00"
    for i in range(40):
        body += b"h" + bytes([i]) + b"h" + bytes([i]) + b"\x86q" + bytes([i + 1])
    p = tmp_path / "dag.pt"
    p.write_bytes(_MAGIC + body + b".")
    prog = ("from fpsim.io.torchfile import torch_members\nfrom fpsim.io import InputError\n"
            f"try:\n    torch_members({str(p)!r})\nexcept InputError as e:\n    print(e)")
    out = subprocess.run([sys.executable, "-c", prog], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "legacy format version" in out.stdout and len(out.stdout) < 400


def _dag(n: int = 40) -> bytes:
    """Pickle ops pushing n nested pairs of one tuple: printing it takes 2**n steps."""
    body = b")q\x00"
    for i in range(n):
        body += b"h" + bytes([i]) + b"h" + bytes([i]) + b"\x86q" + bytes([i + 1])
    return body


@pytest.mark.parametrize("where", ["pid", "key"])
def test_a_persistent_id_or_storage_key_that_is_a_dag_is_one_line_not_a_hang(tmp_path, where):
    head = _MAGIC + pickle.dumps(1001, protocol=2) + pickle.dumps({}, protocol=2)
    if where == "pid":  # BINPERSID on the tuple itself
        body = b"\x80\x02" + _dag() + b"Q."
    else:  # ("storage", FloatStorage, key, "cpu", 4): the key a container
        key = _dag()
        body = b"\x80\x02(X\x07\x00\x00\x00storagectorch\nFloatStorage\n" + key + b"X\x03\x00\x00\x00cpuK\x04tQ."
    keys = b"\x80\x02(X\x01\x00\x00\x000t."
    p = tmp_path / "dag.pt"
    p.write_bytes(head + body + keys)
    prog = ("from fpsim.io.torchfile import torch_members\nfrom fpsim.io import InputError\n"
            f"try:\n    print(torch_members({str(p)!r}))\nexcept InputError as e:\n    print(e)")
    out = subprocess.run([sys.executable, "-c", prog], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    assert len(out.stdout) < 400, out.stdout[:400]
