"""The campaign's corpus: the Python sources of the installed packages, as one reproducible byte stream.

Files are the ``*.py`` under the given site-packages roots, in sorted order of their path relative to the
root (``package/module.py``), concatenated with one ``\\n`` between files.  Whole packages are held out for
validation (a package is the first path component), so no validation byte shares a file, or a package,
with training; the validation stream keeps each held-out package's bytes together (its span, so that validation can
draw from every package).  :class:`Corpus` records the file count, the byte count and the SHA-256 of each stream,
so that a rerun can check it trains on the same data (``manifest()`` goes into the results).
"""

from __future__ import annotations

import hashlib
import sysconfig
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = ["Corpus", "python_sources", "DEFAULT_HOLDOUT"]

#: Held-out packages (validation) when none are named: sizeable, self-contained, unlike each other.
DEFAULT_HOLDOUT = ("sympy", "pandas")


@dataclass(frozen=True)
class Corpus:
    """Training and validation bytes (uint8 arrays) and what they were made of.  ``val_spans``: (package, start,
    end) of each held-out package's bytes in ``val``, in stream order; empty: the whole stream is one span (corpora
    made by hand)."""

    train: np.ndarray
    val: np.ndarray
    train_files: int
    val_files: int
    holdout: tuple[str, ...]
    roots: tuple[str, ...]
    val_spans: tuple[tuple[str, int, int], ...] = ()

    def spans(self) -> tuple[tuple[str, int, int], ...]:
        """``val_spans``, or one span over the whole validation stream named after the held-out packages."""
        return self.val_spans or ((",".join(self.holdout), 0, int(self.val.size)),)

    def manifest(self) -> dict:
        """File counts, byte counts and SHA-256 of both streams (the reproducibility record of a run)."""
        return {
            "roots": list(self.roots),
            "holdout": list(self.holdout),
            "train": {"files": self.train_files, "bytes": int(self.train.size),
                      "sha256": hashlib.sha256(self.train.tobytes()).hexdigest()},
            "val": {"files": self.val_files, "bytes": int(self.val.size),
                    "sha256": hashlib.sha256(self.val.tobytes()).hexdigest(),
                    "packages": {name: end - start for name, start, end in self.spans()}},
        }


def _files(roots: Sequence[Path]) -> list[tuple[str, Path]]:
    seen: dict[str, Path] = {}
    for root in roots:
        for p in root.rglob("*.py"):
            if p.is_file() and not p.is_symlink():
                rel = p.relative_to(root).as_posix()
                seen.setdefault(rel, p)  # the first root wins for a path found under several
    return sorted(seen.items())


def python_sources(roots: Iterable[str | Path] | None = None, holdout: Sequence[str] = DEFAULT_HOLDOUT,
                   max_bytes: int | None = None) -> Corpus:
    """The corpus of the ``*.py`` files under ``roots`` (default: this interpreter's site-packages).

    ``holdout``: packages (first path components) that form the validation stream.  ``max_bytes`` caps the
    training stream (the validation stream is kept whole), for smoke tests.
    """
    rts = tuple(Path(r) for r in (roots if roots is not None else [sysconfig.get_paths()["purelib"]]))
    hold = tuple(holdout)
    train, val = bytearray(), bytearray()
    nt = nv = 0
    spans: list[list] = []  # [package, start, end]: files sort by path, so a package's files are contiguous
    for rel, path in _files(rts):
        data = path.read_bytes()
        pkg = rel.split("/", 1)[0]
        if pkg in hold:
            if not spans or spans[-1][0] != pkg:
                spans.append([pkg, len(val), len(val)])
            val += data + b"\n"
            spans[-1][2] = len(val)
            nv += 1
        elif max_bytes is None or len(train) < max_bytes:
            train += data + b"\n"
            nt += 1
    if max_bytes is not None:
        train = train[:max_bytes]
    return Corpus(np.frombuffer(bytes(train), np.uint8), np.frombuffer(bytes(val), np.uint8), nt, nv, hold,
                  tuple(str(r) for r in rts), tuple((p, a, b) for p, a, b in spans))
