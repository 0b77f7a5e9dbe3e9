"""How ``fpsim analyze`` prints its rows: the grouped table, Markdown, CSV and JSON (the conventions are in
:mod:`fpsim_cli.analyze_cmd`'s docstring), and the summary that ranks tensors for the BF16 layers."""

from __future__ import annotations

import csv
import io
import math

_TABLE = (("scheme", "scheme"), ("bits", "bits_per_element"), ("kurtosis", "kurtosis"), ("sqnr_db", "sqnr_db"),
          ("rel_error", "rel_error"), ("bulk_err", "bulk_rel_error"), ("max_abs_err", "max_abs_error"),
          ("flushed", "flushed_frac"),
          ("saturated", "saturated_frac"), ("small_scale", "small_scale_block_frac"),
          ("dyn_range", "block_dyn_range_log2"), ("bias_rne", "bias_rne"), ("bias_sr", "bias_sr"),
          ("±ci95", "bias_sr_ci95"))
_MISSING = "–"
_WIDTH = 160  # the table's lines fit this many columns (wider tables continue in a second block of columns)


def _isnum(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _fmt(v) -> str:
    """A table cell: 4 significant digits; a value that could not be computed is "–" (its reason is listed)."""
    if v is None or isinstance(v, float) and not math.isfinite(v):
        return _MISSING
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v + 0.0:.4g}"
    if isinstance(v, list):
        return "×".join(map(str, v))
    return str(v)


def _fmt3(v) -> str:
    """3 significant digits (biases and their interval: the estimate's noise is larger)."""
    return f"{v + 0.0:.3g}" if isinstance(v, float) and math.isfinite(v) else _fmt(v)


def _notes_text(notes: dict) -> str:
    """"col, col: reason; col: reason" — the columns that share a reason named once."""
    by: dict[str, list[str]] = {}
    for col, why in notes.items():
        by.setdefault(why, []).append(col)
    return "; ".join(f"{', '.join(cols)}: {why}" for why, cols in by.items())


def _csv_cell(v) -> str:
    if v is None or isinstance(v, float) and not math.isfinite(v):
        return ""  # the reason is in the notes column
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return repr(float(v) + 0.0)  # shortest round-trip text; -0.0 → 0.0
    if isinstance(v, list):
        return "x".join(map(str, v))
    return str(v)


def render(rows: list[dict], fmt: str, summary: dict, extra: dict | None = None) -> str:
    """rows as table | csv | json | markdown (conventions: the module docstring and LEGEND); ``extra``: more
    top-level JSON keys (the quantized-checkpoint records)."""
    from fpsim.analysis import METRIC_COLUMNS
    from fpsim.io import dumps

    keep = set(summary["keep_bf16"])
    if fmt == "json":
        recs = [dict({c: r.get(c) for c in METRIC_COLUMNS}, notes=r.get("notes", {})) for r in rows]
        from fpsim.io import dump_iteration

        for rec in recs:
            it = dump_iteration(rec["tensor"])
            if it is not None:
                rec["iteration"] = it
        return dumps({"rows": recs, "summary": summary, **(extra or {})})
    if fmt == "csv":
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow([*METRIC_COLUMNS, "keep_bf16", "notes"])
        for r in rows:
            w.writerow([_csv_cell(r.get(c)) for c in METRIC_COLUMNS]
                       + [_csv_cell(r["tensor"] in keep), _notes_text(r.get("notes", {}))])
        return buf.getvalue()
    if fmt == "markdown":
        return _markdown(rows, summary)
    return _table(rows, summary)


def _tensor_line(r: dict, keep: set) -> str:
    nan_inf = f"  NaN {r['nan_count']}  inf {r['inf_count']}" if r["nan_count"] or r["inf_count"] else ""
    return (f"{r['tensor']}  ({r['role']}, {_fmt(r['shape'])}, kurtosis {_fmt(r['kurtosis'])}, "
            f"max|x|/std {_fmt(r['amax_over_std'])}{nan_inf})" + ("  → keep BF16" if r["tensor"] in keep else ""))


def _groups(rows: list[dict]) -> list[list[dict]]:
    """Rows grouped by tensor, in first-seen order."""
    out: dict[str, list[dict]] = {}
    for r in rows:
        out.setdefault(r["tensor"], []).append(r)
    return list(out.values())


def _table(rows: list[dict], summary: dict) -> str:
    """One header line per tensor (its statistics and the keep-BF16 conclusion), one line per scheme under it;
    "–" cells are listed with their reasons below.  Lines fit 160 columns: columns that do not fit continue
    in a second block under the first, the scheme repeated."""
    if not rows:
        return "no tensor analysed\n"
    keep = set(summary["keep_bf16"])
    cols = list(_TABLE)
    if any(_isnum(r.get("nonfinite_out_count")) and r["nonfinite_out_count"] > 0 for r in rows):  # not NaN
        cols.insert(3, ("nonfinite_out", "nonfinite_out_count"))
    cells = [[(_fmt3 if k.startswith("bias") else _fmt)(r.get(k)) for _, k in cols] for r in rows]
    width = [max(len(h), *(len(c[i]) for c in cells)) for i, (h, _) in enumerate(cols)]
    blocks, cur = [], [0]
    for i in range(1, len(cols)):
        if 2 + sum(width[j] + 2 for j in cur) + width[i] > _WIDTH:
            blocks.append(cur)
            cur = [0]
        cur.append(i)
    blocks.append(cur)

    def line(vals, idx):
        return "  " + "  ".join(vals[i].ljust(width[i]) if i == 0 else vals[i].rjust(width[i]) for i in idx).rstrip()

    out = []
    start = 0
    for group in _groups(rows):
        out.append(_tensor_line(group[0], keep))
        for idx in blocks:
            out.append(line([h for h, _ in cols], idx))
            out += [line(cells[start + j], idx) for j in range(len(group))]
        start += len(group)
        out.append("")
    out += _reason_lines(rows, {k for _, k in cols} | {"kurtosis", "amax_over_std", "nonfinite_out_count"})
    out += _ranking_lines(summary)
    return "\n".join(out) + "\n"


def _reason_lines(rows: list[dict], shown: set) -> list[str]:
    """Why cells are "–": (columns, reason) with the number of rows, in first-seen order."""
    count: dict[tuple[str, str], int] = {}
    for r in rows:
        by: dict[str, list[str]] = {}
        for col, why in r.get("notes", {}).items():
            if col in shown:
                by.setdefault(why, []).append(col)
        for why, cs in by.items():
            count[(", ".join(cs), why)] = count.get((", ".join(cs), why), 0) + 1
    if not count:
        return []
    out = [f"{_MISSING}: not computed, or a note (columns: reason [rows]):"]
    out += [f"  {cs}: {why} [{n}]" for (cs, why), n in count.items()]
    return out + [""]


def _ranking_lines(summary: dict) -> list[str]:
    if not summary["ranking"] and not summary["unranked"]:
        return ["no tensor to rank"]
    ref = summary["gaussian_bulk_rel_error"]
    lines = [f"ranking: keep BF16 when bulk_rel_error under {summary['ranking_scheme']} > "
             f"{_fmt(summary['keep_above'])} × its value on a standard Gaussian ({_fmt(ref)});",
             "  bulk = |x| ≤ 8·median|x|, so outliers cannot hide the damage to the other elements (fpsim.ranking). "
             "Highest first:",
             f"  {'rank':>7}  {'bulk/gauss':>10}  {'bulk_err':>8}  {'rel_error':>9}  tensor"]
    lines += [f"  {e['rank']:>3}/{e['of']:<3}  {_fmt(e['bulk_vs_gaussian']):>10}  {_fmt(e['bulk_rel_error']):>8}  "
              f"{_fmt(e['rel_error']):>9}  {e['tensor']}{'  [keep BF16]' if e['keep_bf16'] else ''}"
              for e in summary["ranking"]]
    lines += [f"  not ranked: {e['tensor']}: {e['reason']}" for e in summary["unranked"]]
    by: dict[str, list[str]] = {}
    for t, r in summary["roles"].items():
        by.setdefault(f"{r['role']} ({r['from']})" if r["from"] else r["role"], []).append(t)
    lines.append("roles (guessed from the name, or a Transformer Engine dump's file name; --role overrides):")
    lines += [f"  {k}: {len(v)} tensor(s), e.g. {v[0]}" for k, v in by.items()]
    if summary.get("iterations"):
        err = {e["tensor"]: e["rel_error"] for e in summary["ranking"]}
        lines.append(f"by iteration (Transformer Engine DumpTensors files; mean relative error under "
                     f"{summary['ranking_scheme']} over the ranked tensors of each):")
        for it, tensors in summary["iterations"].items():
            vals = [err[t] for t in tensors if t in err]
            mean = _fmt(sum(vals) / len(vals)) if vals else "–"
            lines.append(f"  iter {it}: {len(tensors)} tensors, mean {mean}")
    return lines


def _markdown(rows: list[dict], summary: dict) -> str:
    """As the table: a line per tensor (statistics, keep-BF16 once), then a Markdown table of its schemes."""
    keep = set(summary["keep_bf16"])
    lines = []
    for group in _groups(rows):
        lines += [f"**{_tensor_line(group[0], keep)}**", "", "| " + " | ".join(h for h, _ in _TABLE) + " |",
                  "|" + "---|" * len(_TABLE)]
        for r in group:
            lines.append("| " + " | ".join((_fmt3 if k.startswith("bias") else _fmt)(r.get(k)) for _, k in _TABLE)
                         + " |")
        lines.append("")
    from fpsim.analysis import METRIC_COLUMNS

    notes = _reason_lines(rows, set(METRIC_COLUMNS))
    if notes:
        lines += [notes[0], ""] + [f"* {n.strip()}" for n in notes[1:] if n.strip()] + [""]
    ranked = ", ".join(f"{e['tensor']} ({_fmt(e['bulk_vs_gaussian'])}{', keep BF16' if e['keep_bf16'] else ''})"
                       for e in summary["ranking"])
    lines.append(f"**Ranking by bulk error over a Gaussian's** ({summary['ranking_scheme']}; keep BF16 above "
                 f"{_fmt(summary['keep_above'])}): {ranked}" if ranked
                 else "**Ranking by bulk error over a Gaussian's**: no tensor to rank")
    lines += [f"* not ranked: {e['tensor']}: {e['reason']}" for e in summary["unranked"]]
    lines += ["", "**Roles** (guessed from the name, or a Transformer Engine dump's file name; --role overrides):", ""]
    lines += [f"* {e['tensor']}: {e['role']} ({e['from']})" if e["from"] else f"* {e['tensor']}: {e['role']}"
              for e in ({"tensor": t, **r} for t, r in summary["roles"].items())]
    return "\n".join(lines) + "\n"


def summarize(rows: list[dict], keep_above: float) -> dict:
    """The keep-BF16 summary (:func:`fpsim.ranking.rank`: a fixed threshold on the bulk error over its Gaussian
    yardstick, the rank beside it), with the Transformer Engine dumps' iterations."""
    from fpsim.ranking import rank

    summary = rank(rows, keep_above)
    if not rows:
        return summary
    first = summary["ranking_scheme"]
    from fpsim.io import dump_iteration as iteration_of

    groups: dict[str, list[str]] = {}
    for r in rows:
        it = iteration_of(r["tensor"])
        if it is not None and r["scheme"] == first:
            groups.setdefault(str(it), []).append(r["tensor"])
    if groups:
        summary["iterations"] = {k: groups[k] for k in sorted(groups, key=int)}
    return summary
