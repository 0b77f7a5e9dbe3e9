"""The one exception of every reader (a file or tensor that cannot be read as asked), and the strict JSON
decoder every reader's header goes through."""

from __future__ import annotations

import json

__all__ = ["InputError", "json_object"]


def _refuse_constant(c):
    raise ValueError(f"JSON constant {c} is not allowed")


def json_object(raw: bytes, what: str, exc: type[Exception] = ValueError) -> dict:
    """The JSON object in ``raw`` (UTF-8; NaN/Infinity constants refused), or ``exc`` with one line beginning
    with ``what`` (e.g. "PATH: corrupt safetensors header") that says why."""
    try:
        obj = json.loads(raw.decode("utf-8"), parse_constant=_refuse_constant)
    except UnicodeDecodeError:
        raise exc(f"{what} (not UTF-8)") from None
    except RecursionError:
        raise exc(f"{what} (JSON nested too deeply)") from None
    except ValueError as e:
        raise exc(f"{what} (not JSON: {str(e).splitlines()[0][:80]})") from None
    if not isinstance(obj, dict):
        raise exc(f"{what} (not a JSON object)")
    return obj


class InputError(Exception):
    """A file or tensor that cannot be read as asked; the message is one line naming the file (and tensor)."""
