"""The one exception of every reader: a file or tensor that cannot be read as asked."""

from __future__ import annotations

__all__ = ["InputError"]


class InputError(Exception):
    """A file or tensor that cannot be read as asked; the message is one line naming the file (and tensor)."""
