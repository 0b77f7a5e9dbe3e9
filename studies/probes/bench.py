"""The probe's CPU cost: study 10's report run and a full run, as ``reports/bench_probe.md``.

    python -m studies.probes.bench [--out reports/bench_probe.md]

Renders from the runs' own records (``studies/data/probes/<model>.json`` for the report run, and
``studies/data/probes/full/<model>.json`` and ``<model>_components.csv`` for a full run of ``python -m
studies.probes.measure --full``, whose other tables are not committed): the wall
and CPU seconds :mod:`studies.probes.measure` measured around :func:`fpsim.torch.probe` (model loading excluded),
the plan, and, for a model with both runs, each component's effect in the two runs side by side.  A benchmark, not
a timed test: nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pandas as pd

from fpsim.io import atomic_write
from studies.common import md_table
from studies.probes.study import DATA, MODELS, effects, load

OUT = Path(__file__).resolve().parents[2] / "reports" / "bench_probe.md"
FULL = DATA / "full"
#: What the records do not say about the machine's state during a run, as observed (``uptime``) while it ran.
CONDITIONS = {
    ("minilm", "full"): "run on 2026-12-06 beside other jobs on the same 2 cores (load average 4 to 6 while it "
                        "ran): its wall time is an upper bound, its CPU time inflated by the sharing; made before two "
                        "fixes of fpsim.torch.probe_stats.row_metrics (identical draws give the one-draw metrics "
                        "exactly; an all-zero draw has no cosine), which change none of the rows below beyond 1e-16",
}


def _plan(meta: dict) -> str:
    p, probe = meta["plan"], meta["probe"]
    layers = "every linear layer" if p["layers"] == ["*"] else f"{len(probe['layers_measured'])} linear layers"
    return (f"{p['batches']} batches + {p['val_batches']} held out, {p['draws']} draws isolated, "
            f"{p['e2e_draws']} end to end, {layers}, {len(probe['variants'])} variants")


def _runs() -> list[dict]:
    rows = []
    for folder in (DATA, FULL):
        for model in MODELS:
            path = folder / f"{model}.json"
            if not path.exists():
                continue
            m = json.loads(path.read_text())
            rows.append({"model": MODELS[model], "run": m["run"], "plan": _plan(m), "wall s": m["wall_s"],
                         "CPU s": m["cpu_s"], "threads": m["threads"],
                         "machine": f"{m['cores']} cores {m['cpu']}, torch {m['torch']}",
                         "conditions": CONDITIONS.get((model, m["run"]), "as recorded")})
    return rows


def _side_by_side(model: str) -> pd.DataFrame | None:
    rep, path = load(model), FULL / f"{model}_components.csv"
    if rep is None or not path.exists():
        return None
    full = {"components": pd.read_csv(path)}  # all study.effects reads; the full run's other tables stay out of git
    a, b = effects(rep, model), effects(full, model)
    keys = ["component", "gemm", "metric", "mode"]
    m = a.merge(b, on=keys, suffixes=(" report", " full"))
    for run in ("report", "full"):
        m[f"95 % CI {run}"] = [f"[{lo:+.4f}, {hi:+.4f}]" for lo, hi in zip(m[f"ci_low {run}"], m[f"ci_high {run}"])]
    return m[keys + ["effect report", "95 % CI report", "p_holm report", "effect full", "95 % CI full",
                     "p_holm full"]]


def render() -> str:
    runs = pd.DataFrame(_runs())
    out = ["# Probe benchmark: the CPU cost of study 10's runs", "",
           "Rendered by `python -m studies.probes.bench` from the runs' own records (`studies/data/probes/*.json`; "
           "full runs in `studies/data/probes/full/`).  Wall and CPU seconds are those `studies.probes.measure` "
           "measured around `fpsim.torch.probe`, model and data loading excluded; CPU seconds are the process's "
           "user + system time over its threads.", "", md_table(runs, formats={"wall s": ".1f", "CPU s": ".1f"}), ""]
    for model, name in MODELS.items():
        df = _side_by_side(model)
        if df is None:
            out += [f"{name}: no full run recorded (`python -m studies.probes.measure --model {model} --full "
                    f"--out studies/data/probes/full`).", ""]
            continue
        out += [f"## {name}: the report run against the full run", "",
                "Study 10's effects (the metric each component exists to change, in units of the GEMM result's "
                "norm; see reports/probes/section.md for their signs) computed from each run's own data; Holm's "
                "correction over each run's own rows.", "",
                md_table(df, formats={"effect report": "+.4f", "effect full": "+.4f", "p_holm report": ".2g",
                                      "p_holm full": ".2g"}), ""]
    return "\n".join(out)


def main(argv=None) -> Path:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=OUT)
    a = ap.parse_args(argv)
    atomic_write(a.out, render().encode())
    print(f"wrote {a.out}")
    return a.out


if __name__ == "__main__":
    main()
