"""The campaign's data stream and paired statistics (issue 20), on data made here."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from studies.campaign.data import python_sources
from studies.campaign.stats import paired_gap, verdict


def _tree(root):
    for rel, text in {"alpha/__init__.py": "a = 1\n", "alpha/z.py": "z = 2\n", "beta/m.py": "m = 3\n",
                      "gamma/sub/k.py": "k = 4\n", "gamma/readme.txt": "not python\n"}.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)


def test_corpus_is_sorted_whole_packages_held_out_and_recorded(tmp_path):
    _tree(tmp_path)
    c = python_sources([tmp_path], holdout=("beta",))
    assert c.train.tobytes() == b"a = 1\n\nz = 2\n\nk = 4\n\n"  # alpha/__init__, alpha/z, gamma/sub/k: path order
    assert c.val.tobytes() == b"m = 3\n\n"
    m = c.manifest()
    assert (m["train"]["files"], m["val"]["files"], m["train"]["bytes"]) == (3, 1, c.train.size)
    again = python_sources([tmp_path], holdout=("beta",)).manifest()
    assert again == m  # same tree, same stream, same SHA-256
    (tmp_path / "alpha" / "z.py").write_text("z = 5\n")
    assert python_sources([tmp_path], holdout=("beta",)).manifest()["train"]["sha256"] != m["train"]["sha256"]


def test_paired_gap_is_the_t_interval_of_the_differences():
    base = {0: 3.0, 1: 3.1, 2: 2.9, 3: 3.05}
    arm = {0: 3.02, 1: 3.13, 2: 2.91, 3: 3.08, 9: 1.0}  # seed 9 has no baseline: not paired, not used
    g = paired_gap(arm, base)
    d = np.array([0.02, 0.03, 0.01, 0.03])
    lo, hi = stats.t.interval(0.95, d.size - 1, loc=d.mean(), scale=stats.sem(d))
    assert g.seeds == (0, 1, 2, 3)
    assert math.isclose(g.mean, d.mean(), rel_tol=1e-12) and math.isclose(g.lo, lo, rel_tol=1e-9)
    assert math.isclose(g.hi, hi, rel_tol=1e-9)
    assert verdict(g, "helps") == "resolved" and verdict(g, "harmless") == "contradicted"


def test_identical_differences_give_an_exactly_zero_width_interval_and_verdicts():
    g = paired_gap({0: 1.1, 1: 2.1, 2: 3.1}, {0: 1.0, 1: 2.0, 2: 3.0})
    assert g.lo == g.mean == g.hi or (g.hi - g.lo) < 1e-15
    noisy = paired_gap({0: 1.0, 1: 1.2, 2: 0.9}, {0: 1.05, 1: 1.1, 2: 0.95})
    assert verdict(noisy, "helps") == "not resolved at this scale" and verdict(noisy, "harmless") == "consistent"
    worse = paired_gap({0: 0.9, 1: 0.91, 2: 0.92}, {0: 1.0, 1: 1.0, 2: 1.01})
    assert verdict(worse, "helps") == "contradicted"
    one = paired_gap({0: 1.0}, {0: 0.9})
    assert math.isnan(one.lo) and verdict(one, "helps").startswith("not resolved")
    with pytest.raises(ValueError, match="diverged"):
        paired_gap({0: float("nan")}, {0: 1.0})
    with pytest.raises(ValueError, match="no seed in common"):
        paired_gap({0: 1.0}, {1: 1.0})
