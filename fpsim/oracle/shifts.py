"""The shift search of :mod:`fpsim.oracle.layout`: which offsets of a candidate's byte stream may be an offset error.

A kernel that writes its codes (or scale bytes) at a wrong offset holds, at stream position j, fpsim's value at
j − s.  layout.py always tries the off-by-one offsets (one element, one byte, one row); :func:`best_shifts` finds
any other offset up to one row of blocks by correlation on an even sample of the stream: for every shift s in
[−bound, bound] it counts how many sampled candidate values equal fpsim's value s positions earlier, and returns the
shifts whose sample agrees far more than a chance match would.  It costs one gather of ``SAMPLE`` positions per
shift (at most ``MAX_SHIFT`` shifts each way), whatever the tensor's size; layout.py then scores the few shifts it
returns on the whole stream.
"""

from __future__ import annotations

import numpy as np

__all__ = ["MAX_SHIFT", "SAMPLE", "best_shifts"]

#: Sampled stream positions per shift.
SAMPLE = 1024
#: The largest offset searched, each way (in stream positions: codes or scale bytes).
MAX_SHIFT = 8192
#: A shift is returned when at least this share of the sampled positions agree with it.
MIN_AGREE = 0.5


def best_shifts(cand: np.ndarray, ours: np.ndarray, real: np.ndarray, bound: int, skip=(), top: int = 2) -> list[int]:
    """Up to ``top`` shifts s (0 < |s| ≤ ``bound``, not in ``skip``) under which the flat candidate stream ``cand``
    holds fpsim's flat stream ``ours`` shifted (``cand[j] == ours[j − s]``), best first.

    ``real``: where ``ours`` holds a value of the tensor (not padding); only those positions are compared.  A shift
    is kept when at least :data:`MIN_AGREE` of the sampled positions agree and it agrees on clearly more of them
    than the median shift (a stream of few distinct values matches often by chance).
    """
    n = cand.size
    bound = min(int(bound), n - 1, MAX_SHIFT)
    if bound < 1 or not real.any():
        return []
    pos = np.flatnonzero(real)
    j = pos[np.linspace(0, pos.size - 1, min(SAMPLE, pos.size)).astype(np.int64)]  # fpsim positions j − s
    shifts = np.arange(-bound, bound + 1)
    rate = np.zeros(shifts.size)
    cj = ours[j]
    for k in range(0, shifts.size, 512):  # in chunks of shifts: bounded memory
        s = shifts[k: k + 512, None]
        at = j[None, :] + s  # the candidate position that holds fpsim's value j under shift s
        ok = (at >= 0) & (at < n)
        hit = ok & (cand[np.clip(at, 0, n - 1)] == cj[None, :])
        rate[k: k + 512] = hit.sum(axis=1) / np.maximum(ok.sum(axis=1), 1)
    rate[shifts == 0] = 0.0
    chance = float(np.median(rate))
    keep = (rate >= MIN_AGREE) & (rate > chance + (1 - chance) / 2)
    keep &= ~np.isin(shifts, np.asarray(list(skip), np.int64))
    order = np.argsort(-rate[keep], kind="stable")
    return [int(s) for s in shifts[keep][order][:top]]
