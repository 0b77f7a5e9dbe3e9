"""The launch shapes studies/bench/tune_kernels.py chooses between give the same bits (its sweep, under Triton's
interpreter on small tensors: partial programs along the tokens, ragged feature counts, an outlier)."""

from __future__ import annotations

import pytest

from fpsim.torch import quantize as tq  # noqa: E402
from fpsim.torch import rht as trht  # noqa: E402
from studies.bench import tune_kernels as tk  # noqa: E402
from tests.tritonenv import DEV, INTERPRETER_WARNINGS

pytestmark = INTERPRETER_WARNINGS


def test_every_candidate_launch_shape_gives_the_current_shapes_bits():
    old = trht.RHT_T_TILES, tq.TWO_LEVEL_TILES
    res = tk.tune(1, device=DEV, tokens=16 * 9, features={1024: 40, 3072: 64, 4096: 96},
                  rht_candidates=[trht.RhtTTiles(64, 8, 4), trht.RhtTTiles(128, 16, 8)],
                  two_level_candidates=[tq.TwoLevelTiles(256, 2), tq.TwoLevelTiles(8192, 8)])
    assert (trht.RHT_T_TILES, tq.TWO_LEVEL_TILES) == old  # the sweep leaves the shapes as they were
    for key in ("rht_t", "two_level"):
        rows = res[key]
        assert len(rows) == 3 and rows[0]["shape"] == old[0 if key == "rht_t" else 1]
        assert all(r["error"] is None and r["same"] and r["ms"] > 0 for r in rows), rows
    text = "\n".join(tk.report(res))
    assert "**NO**" not in text and "RhtTTiles(BF=" in text


def test_a_shape_that_changes_bits_is_reported_and_never_chosen(monkeypatch):
    """The check itself can fail: a 'shape' whose setter also switches the rounding must be flagged."""
    x = {16: tk.torch.ones(32, 16, device=DEV)}
    calls = {16: 1}
    seen = []

    def make(v):
        return lambda: v * (2.0 if seen and seen[-1] == "other" else 1.0)

    rows = tk._sweep(["current", "other"], seen.append, calls, make, x, 1)
    assert rows[0]["same"] and not rows[1]["same"]
    with pytest.raises(AssertionError):
        assert all(r["same"] for r in rows)
