"""One-off edit (2026-12-04) of the committed ``studies/data/llm/smollm2_results.csv``, so that it holds what
``studies.llm.measure`` now writes, without the capture (not on the machine that made this edit).

    python -m studies.llm.fix_results

Two edits, recorded under ``results_notes`` in ``studies/data/llm/smollm2_check.json`` (the script refuses to
run twice; a new ``studies.llm.measure`` run clears the notes):

1. ``bias_sr_ci95`` was measured as the normal half-width 1.96·s/√n over n = ``SR_SEEDS`` = 4 SR draws.
   ``fpsim.analysis.mean_ci95`` now gives the Student-t half-width t(0.975, n − 1)·s/√n; since the old value is
   exactly 1.96·s/√n, each is multiplied by t(0.975, 3)/1.96 = 3.18245/1.96 = 1.6237 (from the stored 6
   significant digits, so the result agrees with a new measurement to about 1e-6 relative).
2. A ``tokens`` relative error ``<tensor>_rel_error_<part>`` is made empty where the same row's
   ``<tensor>_energy_share_<part>`` is below ``measure.MIN_ENERGY_SHARE`` (1e-12), the rule ``measure.rel`` now
   applies: such a part's norm is ~0 and the ratio is noise (on SmolLM2: the sink-token rows of q_proj's dY,
   energy share 3e-19 to 1.4e-13, where it read 1.0 without RHT and 3.5e4 to 1.2e7 with RHT16).  The stored
   shares decide; the smallest share above the threshold is 9e-6, so 6-digit rounding cannot move a row across.

Every other line of the CSV stays byte-identical (checked before writing).
"""

from __future__ import annotations

import io
import json
import sys

import numpy as np
import pandas as pd
from scipy import stats

from fpsim.io import atomic_write, dumps
from studies.llm.measure import DATA, MIN_ENERGY_SHARE, RESULTS, SR_SEEDS

CHECK = DATA / "smollm2_check.json"
DATE = "2026-12-04"


def fix(df: pd.DataFrame) -> tuple[pd.DataFrame, list]:
    """The edited copy of ``df`` and the notes describing the edits."""
    df = df.copy()
    t = float(stats.t.ppf(0.975, SR_SEEDS - 1))
    ci = df.metric == "bias_sr_ci95"
    df.loc[ci, "value"] *= t / 1.96
    notes = [{"date": DATE, "metric": "bias_sr_ci95", "rows": int(ci.sum()),
              "edit": f"rescaled from the normal to the Student-t 95 % half-width: × t(0.975, {SR_SEEDS - 1})/1.96 "
                      f"= {t:.5f}/1.96 (n = SR_SEEDS = {SR_SEEDS} SR draws), as fpsim.analysis.mean_ci95 now gives"}]
    tok = df[df.experiment == "tokens"]
    share = tok[tok.metric.str.contains("_energy_share_")]
    key = share.set_index(["layer", "linear", "variant", share.metric.str.replace("_energy_share_", "_rel_error_")])
    low = key.value[key.value < MIN_ENERGY_SHARE]
    idx = df.set_index(["layer", "linear", "variant", "metric"]).index
    hit = (df.experiment == "tokens") & idx.isin(low.index)
    for metric, n in df[hit].metric.value_counts().sort_index().items():
        lin = sorted(set(df[hit & (df.metric == metric)].linear))
        src = metric.replace("_rel_error_", "_energy_share_")
        notes.append({"date": DATE, "metric": metric, "rows": int(n), "linears": lin,
                      "edit": f"emptied: the part's energy share (the same row's {src}) is below MIN_ENERGY_SHARE = "
                              f"{MIN_ENERGY_SHARE:g} of the tensor's squared norm, so its norm is ~0 and the relative "
                              "error is noise (q_proj's sink-token gradient: under causal attention the first query "
                              "attends only to itself and gets no gradient)"})
    df.loc[hit, "value"] = np.nan
    return df, notes


def main() -> int:
    check = json.loads(CHECK.read_text())
    if check.get("results_notes"):
        print(f"error: {CHECK} already records edits ({len(check['results_notes'])}); not applied twice",
              file=sys.stderr)
        return 1
    old_text = RESULTS.read_text()
    df, notes = fix(pd.read_csv(io.StringIO(old_text)))
    new_text = df.to_csv(index=False, float_format="%.6g", lineterminator="\n")
    metrics = {n["metric"] for n in notes}
    for o, n in zip(old_text.splitlines(), new_text.splitlines(), strict=True):
        if o != n and o.split(",")[4] not in metrics:
            raise SystemExit(f"error: unexpected change {o!r} -> {n!r}")
    atomic_write(RESULTS, new_text)
    check["results_notes"] = notes
    atomic_write(CHECK, dumps(check, indent=1))
    print("\n".join(f"{n['metric']}: {n['rows']} rows {n['edit'].split(':')[0]}" for n in notes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
