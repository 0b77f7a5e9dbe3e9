"""Hostile dict keys in torch files: hashing a pickled tuple walks all of it, shared parts included, so a key of
40 nested pairs of one tuple (a few hundred bytes) took 2**40 steps in the loader, and naming its tensors printed
it (2**40 characters).  Each test failed (hang, crash or a name of megabytes) before the fix."""

from __future__ import annotations

import pickle
import subprocess
import sys
import zipfile

import pytest

pytest.importorskip("torch")

_MAGIC = pickle.dumps(0x1950A86A20F9469CFC6C, protocol=2)


def _dag(n: int = 40) -> bytes:
    """Pickle ops pushing one value: n nested pairs of one tuple (memo references, so 30 bytes a level)."""
    body = b")q\x000"
    for i in range(n):
        body += b"h" + bytes([i]) + b"h" + bytes([i]) + b"\x86q" + bytes([i + 1]) + b"0"
    return body + b"h" + bytes([n])


def _deep(n: int = 100_000) -> bytes:
    return b")" + b"\x85" * n  # ((((),),),) n deep: hashing it recurses n deep in C


def _zip(path, pkl: bytes):
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as zf:
        zf.writestr("archive/data.pkl", pkl)
        zf.writestr("archive/byteorder", "little")
        zf.writestr("archive/version", "3\n")


def _read(p) -> str:
    prog = ("from fpsim.io.torchfile import torch_members\nfrom fpsim.io import InputError\n"
            f"try:\n    m, notes = torch_members({str(p)!r})\n    print(len(m), notes, [x.error for x in m])\n"
            "except InputError as e:\n    print('error', e)")
    out = subprocess.run([sys.executable, "-c", prog], capture_output=True, text=True, timeout=90)
    assert out.returncode == 0, out.stderr[-2000:]
    assert len(out.stdout) < 500, out.stdout[:500]
    return out.stdout


KEYS = {"dag": _dag(), "deep": _deep()}
WHERE = ("zip", "zip refused by torch", "legacy", "OrderedDict", "set")


def _hostile(tmp_path, key: str, where: str):
    k = KEYS[key]
    body = {"zip": b"\x80\x02}" + k + b"K\x01s.",  # {key: 1}
            "zip refused by torch": b"\x80\x02cos\nsystem\n0}(" + k + b"K\x01u.",
            "legacy": b"\x80\x02}" + k + b"K\x01s.",
            "OrderedDict": b"\x80\x02ccollections\nOrderedDict\n((" + k + b"K\x01tq\x90]q\x91h\x90atR.",
            "set": b"\x80\x04\x8f(" + k + b"\x90."}[where]
    p = tmp_path / f"hostile-{key}-{where.replace(' ', '_')}.pt"
    if where == "legacy":
        p.write_bytes(_MAGIC + pickle.dumps(1001, protocol=2) + pickle.dumps({}, protocol=2) + body
                      + pickle.dumps([], protocol=2))
    else:
        _zip(p, body)
    return p


def test_a_key_that_would_hang_or_crash_hashing_is_one_line(tmp_path):
    """Every (key, where) in one fresh interpreter (one torch import), each file under its own line of output; a
    hang or a crash (a C stack overflow) stops the interpreter, and the files not reached are named."""
    cases = [(key, where) for key in sorted(KEYS) for where in WHERE]
    paths = [_hostile(tmp_path, key, where) for key, where in cases]
    prog = ("import sys\nfrom fpsim.io.torchfile import torch_members\nfrom fpsim.io import InputError\n"
            f"for p in {[str(p) for p in paths]!r}:\n"
            "    try:\n        m, notes = torch_members(p)\n        print('read', len(m), notes)\n"
            "    except InputError as e:\n        print('error', e)\n    sys.stdout.flush()\n")
    out = subprocess.run([sys.executable, "-c", prog], capture_output=True, text=True, timeout=120)
    lines = out.stdout.splitlines()
    assert out.returncode == 0 and len(lines) == len(cases), (cases[len(lines):], out.stderr[-1000:])
    for (key, where), line in zip(cases, lines):
        assert line.startswith("error") and "dict key or set item" in line and len(line) < 500, (key, where, line)


def test_check_hashable_passes_real_keys_and_is_linear():
    from fpsim.io.torchpickle import HostileKey, check_hashable

    check_hashable(("model", 3, ("a", "b")))
    check_hashable("x" * 10_000)
    t = ()
    for _ in range(60):  # 60 nested pairs of one tuple: 2**61 items expanded, 60 distinct tuples
        t = (t, t)
    with pytest.raises(HostileKey):
        check_hashable(t)


def test_keys_that_are_not_strings_name_tensors_by_type_and_position():
    from fpsim.io.torchpickle import key_text

    assert key_text("w", 0) == "w" and key_text(3, 0) == "3" and key_text(None, 0) == "None"
    assert key_text((1, 2), 4) == "<tuple key #4>"
    assert key_text(10**5000, 1) == "<int key #1>"  # str() of it raises (Python's 4300-digit limit)


def test_a_tensor_under_a_small_tuple_key_keeps_a_short_name(tmp_path):
    import torch

    p = tmp_path / "t.pt"
    torch.save({(1, "a"): torch.ones(3), 10**5000: torch.zeros(2), "w": torch.ones(2)}, p)
    from fpsim.io.torchfile import torch_members

    members, _ = torch_members(p)
    assert [m.name for m in members] == ["<tuple key #0>", "<int key #1>", "w"]


def test_a_tensor_whose_dtype_is_a_shared_tuple_is_named_by_type(tmp_path):
    # _rebuild_tensor_v3(storage, 0, (1,), (1,), False, OrderedDict(), dtype=<DAG>): torch refuses the global
    # beside it, so fpsim's own reader builds the record and prints its dtype
    pid = b"(X\x07\x00\x00\x00storagectorch\nUntypedStorage\nX\x01\x00\x00\x000X\x03\x00\x00\x00cpuK\x04tQ"
    v3 = (b"ctorch._utils\n_rebuild_tensor_v3\n(" + pid + b"K\x00K\x01\x85K\x01\x85\x89ccollections\nOrderedDict\n)R"
          + _dag() + b"tR")
    body = b"\x80\x02cos\nsystem\n0}(X\x01\x00\x00\x00w" + v3 + b"u."
    p = tmp_path / "dtype.pt"
    with zipfile.ZipFile(p, "w", zipfile.ZIP_STORED) as zf:
        zf.writestr("archive/data.pkl", body)
        zf.writestr("archive/data/0", b"\x00" * 4)
        zf.writestr("archive/byteorder", "little")
        zf.writestr("archive/version", "3\n")
    out = _read(p)
    assert "has dtype a tuple, which fpsim does not read" in out, out


# --- torch < 1.0's storage views (legacy format): read, not refused ----------------------------------------------


def _legacy_views(path, root, tensors, view_of):
    """A legacy-format file as torch < 1.0 wrote it: one float32 root storage '0' of ``root``, tensors
    name → (view, offset, shape, stride) whose storages are views ``view_of[view] = (offset, size)`` of it."""
    import collections
    import io
    import struct

    import torch

    class Ref:
        def __init__(self, view):
            off, size = view_of[view]
            self.pid = ("storage", torch.FloatStorage, "0", "cpu", root.size, (view, off, size))

    class T:
        def __init__(self, view, off, shape, stride):
            self.args = (Ref(view), off, shape, stride, False, collections.OrderedDict())

        def __reduce__(self):
            return torch._utils._rebuild_tensor_v2, self.args

    class P(pickle.Pickler):
        def persistent_id(self, obj):
            return obj.pid if isinstance(obj, Ref) else None

    buf = io.BytesIO()
    for o in (0x1950A86A20F9469CFC6C, 1001, {"protocol_version": 1001, "little_endian": True,
                                             "type_sizes": {"short": 2, "int": 4, "long": 4}}):
        pickle.dump(o, buf, protocol=2)
    P(buf, protocol=2).dump({k: T(*v) for k, v in tensors.items()})
    pickle.dump(["0"], buf, protocol=2)
    buf.write(struct.pack("<q", root.size) + root.astype("<f4").tobytes())
    path.write_bytes(buf.getvalue())


def test_storage_views_of_torch_before_1_0_are_read_as_torch_reads_them(tmp_path):
    # before: every tensor on a view was an error naming its storage "not a stored record of the file"
    import numpy as np
    import torch

    from fpsim.io import open_tensors

    root = np.arange(12, dtype=np.float32) * 1.5
    p = tmp_path / "old.pt"
    _legacy_views(p, root, {"a": ("1", 1, (3,), (1,)), "b": ("1", 0, (5,), (1,)), "c": ("2", 0, (2, 2), (2, 1)),
                            "d": ("2", 1, (2,), (2,))}, {"1": (2, 5), "2": (6, 4)})
    want = torch.load(p, weights_only=False)  # the file is this test's own: torch's full loader is the reference
    refs = {r.name: r for r in open_tensors([str(p)])}
    assert sorted(refs) == ["a", "b", "c", "d"]
    for name, r in refs.items():
        assert r.error is None, r.error
        assert r.load().tobytes() == want[name].contiguous().numpy().tobytes(), name
    assert refs["c"].load().tolist() == [[9.0, 10.5], [12.0, 13.5]]


def test_a_tensor_past_the_end_of_its_storage_view_is_one_error(tmp_path):
    import numpy as np

    from fpsim.io import open_tensors

    p = tmp_path / "bad.pt"
    _legacy_views(p, np.zeros(12, np.float32), {"a": ("1", 2, (4,), (1,)), "ok": ("1", 0, (2,), (1,))},
                  {"1": (2, 5)})
    errors = []
    refs = {r.name: r for r in open_tensors([str(p)], on_error=errors.append)}
    assert "needs 6 elements of its storage view, which has 5: corrupt" in (refs["a"].error or " ".join(errors))
    assert refs["ok"].error is None and refs["ok"].load().tolist() == [0.0, 0.0]
