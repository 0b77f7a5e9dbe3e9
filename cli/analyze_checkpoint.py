"""``fpsim analyze`` on quantized checkpoints: each packed weight with its scales reported once (docs/checkpoints.md).

The tensors :func:`fpsim.io.checkpoints.find_quantized` recognises (compressed-tensors and ModelOpt layouts) are
taken out of the float analysis: their scale tensors are never analysed, never ranked for BF16.  Each quantized
tensor gets one record (:func:`fpsim.io.checkpoint_check.inspect_group`), with ``--reference`` its error against
the original and a conformance check; this module renders the records as a table section or JSON.
"""

from __future__ import annotations

import math

_MISSING = "–"


def reference_tensors(paths: tuple[str, ...], note, on_file) -> dict:
    """name → TensorRef of the ``--reference`` files (the first of a name kept, a later one noted)."""
    from fpsim.io import open_tensors

    out: dict = {}
    for r in open_tensors(list(paths), on_error=lambda m: note(f"error: --reference {m}"), on_file=on_file):
        if r.name in out:
            note(f"note: --reference: {r.key} not used: {out[r.name].key} has the same name")
            continue
        out[r.name] = r
    return out


def quantized_records(groups, chosen, labels: dict, originals: dict | None, note,
                      convention: str | None = None) -> tuple[list[dict], int]:
    """One record per chosen quantized tensor (and the number that failed, each said in one ``error:`` line).
    ``groups``: every quantized tensor of the checkpoints, for the global scales they share."""
    from fpsim.io import InputError
    from fpsim.io.checkpoint_check import inspect_group, original_amax, sharing

    def label_of(g):
        codes = g.parts["codes"]
        return f"{labels.get(codes.source, codes.source)}:{g.name}"

    shared = sharing(groups)
    amaxes: dict[str, float] = {}

    def fused_amax(g):
        """The largest amax of the originals of g and the tensors sharing its global scale (None if one is missing)."""
        if originals is None or not shared[id(g)] or any(m.name not in originals for m in [g, *shared[id(g)]]):
            return None
        for m in [g, *shared[id(g)]]:
            if m.name not in amaxes:
                amaxes[m.name] = original_amax(originals[m.name])
        return max(amaxes[m.name] for m in [g, *shared[id(g)]])

    recs, failed = [], 0
    for g in chosen:
        label = label_of(g)
        try:
            orig = originals.get(g.name) if originals is not None else None
            rec = inspect_group(g, label, orig, reference_given=originals is not None, fused_amax=fused_amax(g),
                                convention=convention)
        except InputError as e:
            note(f"error: {e}")
            failed += 1
            continue
        except MemoryError:
            note(f"error: {label}: out of memory")
            failed += 1
            continue
        except (ValueError, TypeError, OverflowError, ArithmeticError) as e:
            note(f"error: {label}: {str(e).splitlines()[0] if str(e) else type(e).__name__}")
            failed += 1
            continue
        rec["shares_global_scale_with"] = [label_of(m) for m in shared[id(g)]] if rec["global_scale"] is not None \
            else None
        if rec["shares_global_scale_with"] is None:
            rec["notes"]["shares_global_scale_with"] = rec["notes"].get("global_scale", "no global scale read")
        recs.append(rec)
    return recs, failed


def _num(v, digits: int = 4) -> str:
    if v is None or isinstance(v, float) and not math.isfinite(v):
        return _MISSING
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v + 0.0:.{digits}g}"
    return str(v)


def _histogram(h) -> str:
    """"0:58 ±0.5:279 …" — the 16 E2M1 codes folded by magnitude (+0 and −0 apart)."""
    if h is None:
        return _MISSING
    mags = ("0.5", "1", "1.5", "2", "3", "4", "6")
    return f"+0:{h[0]} -0:{h[8]} " + " ".join(f"±{m}:{h[i + 1] + h[i + 9]}" for i, m in enumerate(mags))


def _e4m3(byte: int) -> str:
    import numpy as np

    from fpsim import decode

    return _num(float(decode(np.array([byte], np.uint8), "e4m3")[0]), 6)


def _conformance(r: dict) -> str:
    if r.get("conformant") is None:
        return f"conformance: {r['notes'].get('conformant', _MISSING)}"
    fd = r.get("first_difference")
    glob = (f"equal (from {r['global_scale_from']})" if r["global_scale_equal"] else
            f"differs (the convention gives {_num(r['expected_global_scale'], 8)} from the tensor's own amax)")
    head = f"conformance to the {r['conformance_convention']} convention: global scale {glob}; "
    if not fd:
        return head + "every block's codes and scale equal"
    diff = [i for i, (a, b) in enumerate(zip(fd["codes_file"], fd["codes_expected"])) if a != b]
    what = (f"scale byte 0x{fd['scale_file']:02x} ({_e4m3(fd['scale_file'])}) vs 0x{fd['scale_expected']:02x} "
            f"({_e4m3(fd['scale_expected'])})"
            if fd["scale_file"] != fd["scale_expected"] else "same scale")
    codes = f", codes differ at columns {[fd['columns'][0] + i for i in diff]}" if diff else ""
    return (head + f"{r['blocks_differing']} of {r['blocks']} blocks differ ({r['blocks_scale_differing']} in their "
            f"scale); first: row {fd['row']} block {fd['block']} (columns {fd['columns'][0]}-{fd['columns'][1] - 1}): "
            f"{what}{codes}")


def render_quantized(recs: list[dict], lead: str = "\n") -> str:
    """The table section: per tensor a header line, what the file shows, and with --reference the comparison."""
    if not recs:
        return ""
    out = [lead + "Quantized tensors (read from the checkpoint: each packed weight with its scales, decoded as its "
           "producer does; never re-quantized, never ranked)"]
    for r in recs:
        out.append(f"{r['tensor']}  ({r['producer']} {r['format'].upper()}, {'×'.join(map(str, r['shape']))}, "
                   f"decoded to {r['decoded_dtype']})")
        inp = (f"input scale {_num(r['input_scale'], 6)} ({r['input_scale_kind']})"
               if r["input_scale"] is not None else "")
        if r["format"] == "nvfp4":
            out.append(f"  blocks {r['blocks']}: zero scale {_num(r['zero_scale_blocks'])}, subnormal scale "
                       f"{_num(r['subnormal_scale_blocks'])}, at max scale 448 {_num(r['max_scale_blocks'])}, "
                       f"NaN scale {_num(r['nan_scale_blocks'])}")
            shared = r.get("shares_global_scale_with")
            share = f"; shared with {', '.join(shared)}" if shared else ""
            kind = f" ({r['global_scale_kind']} scale, amax {_num(r['implied_amax'])})"
            out.append(f"  global scale {_num(r['global_scale'], 8)}{kind}{share}{'; ' + inp if inp else ''}")
        else:
            what = (f"{r['blocks']} blocks of {r['block']}: E8M0 scales" if r["blocks"] is not None
                    else "scale per tensor or row:")
            out.append(f"  {what} {_num(r['scale_min'])} to {_num(r['scale_max'])}"
                       + (f", NaN scale {r['nan_scale_blocks']}" if r["nan_scale_blocks"] is not None else "")
                       + (f"; {inp}" if inp else ""))
        if r["code_histogram"] is not None:
            out.append(f"  codes {_histogram(r['code_histogram'])}")
        if r["notes"].get("layout"):
            out.append(f"  note: {r['notes']['layout']}")
        if r.get("reference"):
            out.append(f"  vs {r['reference']}: rel_error {_num(r['rel_error'])}, sqnr_db {_num(r['sqnr_db'])}, "
                       f"max_abs_err {_num(r['max_abs_error'])} (fpsim {r['format']} of the original: rel_error "
                       f"{_num(r['fpsim_rel_error'])})")
            out.append(f"  {_conformance(r)}")
        elif r["notes"].get("rel_error", "").startswith("no tensor"):
            out.append(f"  reference: {r['notes']['rel_error']}")
    return "\n".join(out) + "\n"


def quantized_summary(recs: list[dict]) -> dict:
    """JSON summary: how many tensors were read, and (with --reference) how many conform."""
    checked = [r for r in recs if r.get("conformant") is not None]
    return {"quantized_tensors": len(recs), "conformance_checked": len(checked),
            "conformant": sum(bool(r["conformant"]) for r in checked)}
