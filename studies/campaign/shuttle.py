"""Carry a stopped run's checkpoint from one device session to the next, in parts that fit the transfer limits.

A device machine's disk lasts only while the machine stays warm, and a command brings back at most 8 files of
16 MiB (64 MiB together) while at most 64 MiB (the working tree included) travels to it.  A s10m checkpoint is
130 MB (float32 weights and both AdamW moments), so a run longer than one session (the horizon and size plans)
moves as numbered parts over several calls:

    # end of session A, on the warm machine, one call per group of parts (each within the return limit):
    python -m studies.campaign.shuttle pack --work /tmp/campaign --plan horizon --run RID --out $OUT --parts 0:3
    python -m studies.campaign.shuttle pack --work /tmp/campaign --plan horizon --run RID --out $OUT --parts 3:6
    ...                                  # here: copy each call's files into an ignored folder, e.g. .shuttle/RID/
    # session B: carry the parts over a few calls (each call copies its carried folder to /tmp/shuttle), then
    python -m studies.campaign.shuttle unpack --from /tmp/shuttle --work /tmp/campaign
    python -m studies.campaign.batch --plan horizon ...   # resumes from the checkpoint as within one session

The archive is a tar of the run's CSV, JSON and ``ckpt/<run>/`` under ``--work/<plan>/``, written the same way every
time (names in a fixed order, zero times and owners), so ``pack`` on the same checkpoint gives the same parts in
every call; a manifest ``<run>.shuttle.json`` holds each part's size and SHA-256 and the whole archive's.  ``unpack``
checks every hash before it writes anything, and extracts only regular files at the four expected paths; a missing,
extra, altered or hostile part is one ValueError that names it.  Resuming from the unpacked checkpoint is the same as
resuming within a session (``tests/test_campaign.py``: a resumed run's curve is the uninterrupted run's), on a
machine whose corpus has the run's SHA-256s: a resume on another stream is a ValueError
(:func:`studies.campaign.run._same_corpus`).  Carry at most ~45 MiB of parts a call (the working tree, ~14 MB,
travels with them within 64 MiB), and run a long plan's runs one or two at a time so their checkpoints stay few.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import tarfile
from pathlib import Path

from fpsim.io import OutputError, atomic_write, dumps

__all__ = ["PART_BYTES", "archive_bytes", "pack", "unpack", "main"]

#: Bytes per part: 15 MiB, under the 16 MiB a returned file may have; four parts and the manifest come back in one
#: call within its 64 MiB.
PART_BYTES = 15 * 2**20


def _members(work: Path, plan: str, rid: str) -> list[tuple[str, Path]]:
    """(name in the archive, file) of a run's resumable state, in a fixed order."""
    base = Path(work) / plan
    files = [(f"{plan}/{rid}.csv", base / f"{rid}.csv"), (f"{plan}/{rid}.json", base / f"{rid}.json"),
             (f"{plan}/ckpt/{rid}/state.safetensors", base / "ckpt" / rid / "state.safetensors"),
             (f"{plan}/ckpt/{rid}/step.json", base / "ckpt" / rid / "step.json")]
    missing = [str(f) for _, f in files if not f.is_file()]
    if missing:
        raise ValueError(f"run {rid}: no checkpoint to pack ({', '.join(missing)} missing)")
    return files


def archive_bytes(work: Path, plan: str, rid: str) -> bytes:
    """The run's state as one tar, byte for byte the same for the same files (zero mtime, uid, gid; no names)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for name, f in _members(work, plan, rid):
            data = f.read_bytes()
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(data), 0, 0o644
            tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def pack(work: Path, plan: str, rid: str, out: Path, parts: slice = slice(None)) -> list[Path]:
    """Write the parts ``parts`` of the run's archive (``<run>.part-NNN``) and its manifest into ``out``; returns
    the files written.  Every call writes the manifest, so any one call's files say how many parts there are."""
    blob = archive_bytes(work, plan, rid)
    chunks = [blob[i:i + PART_BYTES] for i in range(0, len(blob), PART_BYTES)]
    names = [f"{rid}.part-{k:03d}" for k in range(len(chunks))]
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for k in range(len(chunks))[parts]:
        dest = out / names[k]
        atomic_write(dest, chunks[k])
        written.append(dest)
    manifest = {"run": rid, "plan": plan, "bytes": len(blob), "sha256": _sha(blob),
                "parts": [{"name": n, "bytes": len(c), "sha256": _sha(c)} for n, c in zip(names, chunks)]}
    man = out / f"{rid}.shuttle.json"
    atomic_write(man, dumps(manifest))
    return [*written, man]


def unpack(sources: list[Path], work: Path) -> str:
    """Reassemble the one run whose manifest and parts lie in ``sources`` (folders), check every hash, and write
    its state under ``work``; returns the run id.  Nothing is written unless every check passes."""
    found: dict[str, Path] = {}
    for src in sources:
        for f in sorted(Path(src).iterdir()):
            if f.is_file():
                if f.name in found and found[f.name].read_bytes() != f.read_bytes():
                    raise ValueError(f"{f}: differs from {found[f.name]}, a part of the same name")
                found.setdefault(f.name, f)
    mans = [f for n, f in found.items() if n.endswith(".shuttle.json")]
    if len(mans) != 1:
        raise ValueError(f"{', '.join(map(str, sources))}: {len(mans)} shuttle manifests, expected one")
    try:
        m = json.loads(mans[0].read_text())
        rid, plan, parts = str(m["run"]), str(m["plan"]), list(m["parts"])
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{mans[0]}: not a shuttle manifest ({e})") from None
    chunks = []
    for p in parts:
        f = found.get(p["name"])
        if f is None:
            raise ValueError(f"{mans[0]}: part {p['name']} is missing")
        data = f.read_bytes()
        if len(data) != p["bytes"] or _sha(data) != p["sha256"]:
            raise ValueError(f"{f}: its size or SHA-256 is not the manifest's (a damaged or foreign part)")
        chunks.append(data)
    blob = b"".join(chunks)
    if len(blob) != m.get("bytes") or _sha(blob) != m.get("sha256"):
        raise ValueError(f"{mans[0]}: the reassembled archive's SHA-256 is not the manifest's")
    expected = {f"{plan}/{rid}.csv", f"{plan}/{rid}.json", f"{plan}/ckpt/{rid}/state.safetensors",
                f"{plan}/ckpt/{rid}/step.json"}
    with tarfile.open(fileobj=io.BytesIO(blob), mode="r:") as tf:
        members = tf.getmembers()
        names = [t.name for t in members]
        if sorted(names) != sorted(expected) or not all(t.isfile() for t in members):
            raise ValueError(f"{mans[0]}: the archive holds {names}, not the run's four files")
        contents = {t.name: tf.extractfile(t).read() for t in members}
    for name, data in sorted(contents.items()):
        dest = Path(work) / name
        dest.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(dest, data)
    return rid


def _slice(spec: str) -> slice:
    lo, _, hi = spec.partition(":")
    return slice(int(lo) if lo else None, int(hi) if hi else None)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("pack")
    p.add_argument("--work", type=Path, required=True)
    p.add_argument("--plan", required=True)
    p.add_argument("--run", required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--parts", default=":", help="a slice start:stop of the parts to write (default: all)")
    u = sub.add_parser("unpack")
    u.add_argument("--from", dest="sources", type=Path, nargs="+", required=True)
    u.add_argument("--work", type=Path, required=True)
    a = ap.parse_args(argv)
    try:
        if a.cmd == "pack":
            files = pack(a.work, a.plan, a.run, a.out, _slice(a.parts))
            print("\n".join(f"{f.name}: {f.stat().st_size:,} bytes" for f in files))
        else:
            print(f"unpacked {unpack(a.sources, a.work)} into {a.work}")
    except (ValueError, OutputError) as e:
        raise SystemExit(f"shuttle: {e}") from None


if __name__ == "__main__":
    main()
