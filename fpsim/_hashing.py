"""A cached ``__hash__`` for frozen dataclasses that serve as cache keys on hot paths.

A frozen dataclass's generated ``__hash__`` hashes the tuple of its fields on every call, recursively through
nested dataclasses: a :class:`~fpsim.plan.Plan` (scheme, format specs, two-level constants, …) took about 27 hash
calls per lookup, and the training layer looks a plan up several times per operand copy per step.  The fields
cannot change (frozen), so the first hash is the hash.
"""

from __future__ import annotations

__all__ = ["cached_hash"]

_SLOT = "_fpsim_hash"


def cached_hash(cls):
    """Class decorator (outside ``@dataclass(frozen=True)``): the generated ``__hash__``, computed once per
    instance and kept in the instance dict (not a field: equality, ``fields`` and ``replace`` ignore it)."""
    generated = cls.__hash__
    if generated is None:
        raise TypeError(f"{cls.__name__} is not hashable: use @dataclass(frozen=True)")

    def __hash__(self):
        try:
            return self.__dict__[_SLOT]
        except KeyError:
            h = generated(self)
            object.__setattr__(self, _SLOT, h)
            return h

    __hash__.__doc__ = generated.__doc__
    cls.__hash__ = __hash__
    return cls
