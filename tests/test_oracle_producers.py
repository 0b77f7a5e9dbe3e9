"""``fpsim diff`` against the producer libraries' own outputs (issue 47 item 3): every differing byte, decoded value
and stored global scale is named with its true cause, or "not explained"; never a wrong cause.

The cases are the libraries' golden outputs (tests/data/producers/{torchao,compressed-tensors,modelopt}.npz: 9 edge
tensors x float32/bfloat16, written by torchao 0.18.0, compressed-tensors 0.20.1 and nvidia-modelopt 0.47.0) and
compressed-tensors' fused-group tensors with a shared global scale (shared-global.npz); their true causes are in
tests/data/producers/diff_causes.json, made by diff_truth.py from each library's parts written down by hand from its
code (file and function per part).  diff is not told the library: it must find the parts itself.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from fpsim.oracle import diff
from fpsim.oracle.producers import NOT_EXPLAINED

DATA = Path(__file__).resolve().parent / "data" / "producers"
TRUTH = json.loads((DATA / "diff_causes.json").read_text())


pytestmark = [pytest.mark.usefixtures("one_thread"),
              pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning"),
              pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning"),
              pytest.mark.filterwarnings("ignore:divide by zero encountered:RuntimeWarning")]


def _case(name: str) -> dict:
    lib, case = name.split("/")
    with np.load(DATA / f"{lib}.npz") as z:
        return {f: z[f"{case}.{f}"] for f in ("input", "codes", "scales", "global", "decoded")}


def _key(k: str) -> str:
    """A part key as the truth writes it: a shared amax (whatever the value diff found) is ``amax=shared``."""
    return "amax=shared" if k.startswith("amax=") else k


def _global_key(k: str) -> str:
    """The stored global scale's cause: a shared amax and the kind of global scale stored (unless the amax)."""
    if k == NOT_EXPLAINED:
        return k
    parts = [p for a in k.split(" & ") for p in (a.split("+") if a.startswith("amax=") else [a])]
    return " & ".join(sorted(_key(p) for p in parts if p != "stored=amax"))


def _norm(cause: str, keys: dict) -> str:
    """A diagnosed cause (labels: " + " within a part set, " or " between alternatives) as the truth file writes
    it (part keys: " & " within, " | " between, sorted)."""
    if cause == NOT_EXPLAINED:
        return cause
    return " | ".join(sorted(" & ".join(sorted(_key(keys[lab]) for lab in alt.split(" + ")))
                             for alt in cause.split(" or ")))


def score(name: str, truth: dict) -> Counter:
    """Run diff on one case (blind) and count its causes against ``truth``: right, not explained, wrong."""
    g = _case(name)
    x = g["input"].astype(ml_dtypes.bfloat16) if name.endswith(".bfloat16") else g["input"]
    rep = diff(g["codes"], g["scales"], x, packed=False, candidate_global=g["global"], candidate_values=g["decoded"])
    cd = rep.conventions
    out = Counter()
    named = {cd.category(c) for a in (cd.code_causes, cd.scale_causes) for c in a.reshape(-1) if c}
    named |= {cd.category(cd.global_cause)} - {""}
    if set(rep.causes) - named:  # the report's causes are the parts' (no other hypothesis names a byte)
        out.setdefault("wrongs", []).append(f"{name}: report causes {set(rep.causes) - named}")
    for what, arr in (("codes", cd.code_causes), ("scales", cd.scale_causes), ("values", cd.value_causes)):
        got = {str(i): _norm(c, cd.keys) for i, c in enumerate(arr.reshape(-1)) if c}
        assert set(got) == set(truth[what]), f"{name} {what}: the differing elements are not the truth's"
        for i, c in got.items():
            out["not explained" if c == NOT_EXPLAINED else "right" if c == truth[what][i] else "wrong"] += 1
            if c not in (NOT_EXPLAINED, truth[what][i]):
                out.setdefault("wrongs", []).append(f"{name} {what}[{i}]: {c} (true: {truth[what][i]})")
    if truth["global"] or cd.global_key:
        gk = _global_key(cd.global_key)
        want = " & ".join(sorted(truth["global"]))
        out["not explained" if gk == NOT_EXPLAINED else "right" if gk == want else "wrong"] += 1
        if gk not in (NOT_EXPLAINED, want):
            out.setdefault("wrongs", []).append(f"{name} global: {gk} (true: {want})")
    return out


def test_the_case_set_is_made_by_the_three_libraries():
    libs = Counter(n.split("/")[0] for n in TRUTH["cases"])
    assert libs == {"torchao": 18, "compressed-tensors": 18, "modelopt": 18, "shared-global": 6}
    differing = [n for n, t in TRUTH["cases"].items() if any(t[w] for w in ("codes", "scales", "values", "global"))]
    assert len(differing) >= 20
    for lib in ("torchao", "compressed-tensors", "modelopt"):  # every part's source is written down
        assert TRUTH["sources"][lib] and all(" " in v for v in TRUTH["sources"][lib].values())


def test_every_difference_is_named_right_or_not_explained():
    """Over all 60 cases: no wrong cause, and most differences named (the rest are ties between two libraries'
    arithmetic on an all-zero or underflowing tensor, where amax/2688 = 0 makes both give the same NaN bytes)."""
    total = Counter()
    per_lib: dict = {}
    for name, truth in TRUTH["cases"].items():
        c = score(name, truth)
        wrongs = c.pop("wrongs", [])
        assert not wrongs, "\n".join(wrongs[:10])
        total += c
        per_lib[name.split("/")[0]] = per_lib.get(name.split("/")[0], Counter()) + c
    assert total["wrong"] == 0
    assert total["right"] >= 5400 and total["not explained"] <= 700, total
    for lib in ("torchao", "compressed-tensors", "shared-global"):
        assert per_lib[lib]["not explained"] <= 20, (lib, per_lib[lib])


def test_a_wrong_truth_is_caught():
    """The comparison can fail: checked against another library's truth for the same tensor, causes are wrong."""
    with pytest.raises(AssertionError):
        score("torchao/outliers.float32", TRUTH["cases"]["modelopt/outliers.float32"])
    c = score("compressed-tensors/zero.float32", {**TRUTH["cases"]["compressed-tensors/zero.float32"],
                                                    "scales": {k: "zero_sdb=1.0" for k in
                                                               TRUTH["cases"]["compressed-tensors/zero.float32"]
                                                               ["scales"]}})
    assert c["wrong"] == 4


def test_decode_order_is_named_when_the_bytes_agree():
    """Transformer Engine's CUDA dequantize (hand-derived golden file): every byte is fpsim's, the values are not."""
    with np.load(DATA / "te-cuda.npz") as z:
        g = {f: z[f"random.float32.{f}"] for f in ("input", "codes", "scales", "global", "decoded")}
    rep = diff(g["codes"], g["scales"], g["input"], packed=False, candidate_global=g["global"],
               candidate_values=g["decoded"])
    assert rep.n_code_mismatches == rep.n_scale_mismatches == 0 and not rep.identical
    (cause, n), = rep.conventions.counts()["values"].items()
    assert cause.startswith("decode fl(e·fl(fl(s·amax)·fl(1/2688)))") and n > 100
    assert "values differing by cause: decode fl(e·fl(fl(s·amax)·fl(1/2688)))" in rep.format_table()
    assert rep.to_dict()["conventions"]["causes"]["values"] == {cause: n}
