"""The one exception of every reader (a file or tensor that cannot be read as asked), and the strict JSON
decoder every reader's header goes through."""

from __future__ import annotations

import json
import re

__all__ = ["InputError", "MalformedFile", "json_object", "printable"]

# Control characters (C0, DEL, C1), the Unicode line/paragraph separators and lone surrogates: any of them in a
# tensor or file name would split a one-line message, move the terminal's cursor or fail to encode as UTF-8.
_UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff]")


def printable(text: str) -> str:
    """``text`` safe on one line of a terminal or a UTF-8 file: control characters, line separators and lone
    surrogates (undecodable bytes of a file name) become their Python escapes (``\\n``, ``\\x1b``, ``\\udcff``)."""
    return _UNPRINTABLE.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)


def _refuse_constant(c):
    raise ValueError(f"JSON constant {c} is not allowed")


def json_object(raw: bytes, what: str, exc: type[Exception] = ValueError, **hooks) -> dict:
    """The JSON object in ``raw`` (UTF-8; NaN/Infinity constants refused), or ``exc`` with one line beginning
    with ``what`` (e.g. "PATH: corrupt safetensors header") that says why; ``hooks``: ``json.loads``'s
    ``object_pairs_hook`` / ``parse_int``."""
    try:
        obj = json.loads(raw.decode("utf-8"), parse_constant=_refuse_constant, **hooks)
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


class MalformedFile(InputError):
    """A file that its format's reference reader refuses (the safetensors library, ``numpy.load``, ``torch.load``);
    the message is one line: "PATH: malformed FORMAT: what is wrong"."""
