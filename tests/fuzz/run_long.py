"""The long fuzzing campaign: each reader in turn (one at a time, ``nice``), up to ``--runs`` inputs or ``--budget``
seconds each, and its figures written to ``reports/fuzz.md``: ``python -m tests.fuzz.run_long`` (``make fuzz``).

Per reader: inputs executed, wall time and rate, coverage (libFuzzer's edges ``cov`` and features ``ft``), corpus
size, peak RSS (libFuzzer's), the slowest input (measured around each call), and findings.  A finding (an exception
other than the reader's one-line error, a run past ``--timeout`` seconds, an RSS past ``--rss-mb``) stops libFuzzer;
the campaign records it (the input is kept under ``--work``) and resumes from the grown corpus with the next seed,
up to 3 findings per reader.  Results accumulate in ``--work``/results.json, so the report is rewritten after each
reader and a run stopped part way still reports what it did.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from .harnesses import CORPUS, READERS

ROOT = Path(__file__).resolve().parents[2]
ORDER = ["safetensors", "npy", "npz", "checkpoint", "quantized", "gguf", "pt_legacy", "te_dump", "pt_zip"]
_STAT = re.compile(r"^stat::(\w+):\s+(\d+)", re.M)
_COV = re.compile(r"^#(\d+)\s+\w+\s+cov: (\d+) ft: (\d+) corp: (\d+)/", re.M)
_EXC = re.compile(r"=== Uncaught Python exception: ===\n(.+)")


def _segment(reader: str, work: Path, runs: int, seconds: int, seed: int, args) -> dict:
    """One libFuzzer run of ``reader`` from its grown corpus; its figures and, when it stopped on one, the finding."""
    corpus, art = work / reader / "corpus", work / reader / "artifacts"
    corpus.mkdir(parents=True, exist_ok=True)
    art.mkdir(parents=True, exist_ok=True)
    stats = work / reader / f"stats-{seed}.json"
    cmd = ["nice", "-n", "10", sys.executable, "-m", "tests.fuzz.fuzz", reader, f"-runs={runs}",
           f"-max_total_time={seconds}", f"-timeout={args.timeout}", f"-rss_limit_mb={args.rss_mb}", f"-seed={seed}",
           "-print_final_stats=1", f"-artifact_prefix={art}/", str(corpus), str(CORPUS / reader)]
    t0 = time.monotonic()
    p = subprocess.run(cmd, cwd=ROOT, env={**os.environ, "FPSIM_FUZZ_STATS": str(stats)}, capture_output=True,
                       text=True, errors="replace")
    wall = time.monotonic() - t0
    log = p.stdout + p.stderr
    (work / reader / f"log-{seed}.txt").write_text(log[-200_000:])
    st = {k: int(v) for k, v in _STAT.findall(log)}
    cov = _COV.findall(log)
    slow = json.loads(stats.read_text()) if stats.exists() else {}
    seg = {"seed": seed, "rc": p.returncode, "wall_s": wall, "execs": st.get("number_of_executed_units", 0),
           "peak_rss_mb": st.get("peak_rss_mb", 0), "cov": int(cov[-1][1]) if cov else 0,
           "ft": int(cov[-1][2]) if cov else 0, "corpus": int(cov[-1][3]) if cov else 0,
           "slowest_s": slow.get("slowest_s", 0.0), "slowest_bytes": slow.get("slowest_bytes"),
           "slowest_sha1": slow.get("slowest_sha1")}
    if p.returncode != 0:
        kind = ("hang" if "ERROR: libFuzzer: timeout" in log else "rss" if "out-of-memory" in log
                else "exception" if _EXC.search(log) else f"exit {p.returncode}")
        unit = re.findall(r"Test unit written to (\S+)", log)
        what = {"hang": f"an input ran past {args.timeout} s", "rss": f"RSS past {args.rss_mb} MB"}.get(kind, kind)
        seg["finding"] = {"kind": kind, "what": (_EXC.search(log).group(1).strip()[:200] if _EXC.search(log) else what),
                          "input": unit[-1] if unit else None}
    return seg


def run_reader(reader: str, work: Path, args) -> dict:
    segs: list[dict] = []
    t_end = time.monotonic() + args.budget
    seed = 1
    while True:
        done = sum(s["execs"] for s in segs)
        left = int(t_end - time.monotonic())
        if done >= args.runs or left < 5 or sum("finding" in s for s in segs) >= 3:
            break
        segs.append(_segment(reader, work, args.runs - done, left, seed, args))
        print(f"{reader}: seed {seed}: {segs[-1]['execs']} inputs in {segs[-1]['wall_s']:.0f} s, rc {segs[-1]['rc']}"
              + (f", finding: {segs[-1]['finding']['what']}" if "finding" in segs[-1] else ""), flush=True)
        seed += 1
        if "finding" not in segs[-1]:
            break
    slow = max(segs, key=lambda s: s["slowest_s"])
    return {"reader": reader, "execs": sum(s["execs"] for s in segs), "wall_s": sum(s["wall_s"] for s in segs),
            "cov": max(s["cov"] for s in segs), "ft": max(s["ft"] for s in segs),
            "corpus": max(s["corpus"] for s in segs), "peak_rss_mb": max(s["peak_rss_mb"] for s in segs),
            "slowest_s": slow["slowest_s"], "slowest_bytes": slow["slowest_bytes"],
            "findings": [s["finding"] for s in segs if "finding" in s], "target_runs": args.runs,
            "budget_s": args.budget, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}


#: Findings of earlier runs, each fixed, with the regression test that fails before its fix.
FIXED = [
    ("npy", "numpy's header parser raised tokenize.TokenError for a header with an unclosed bracket",
     "fpsim/io/npz.py read_npy_header", "test_npy_header_with_an_unclosed_bracket_is_refused_in_one_line, "
     "test_npz_member_with_an_unclosed_bracket_is_refused_in_one_line"),
    ("npy", "numpy.dtype(',f4') (a descr numpy reads as a comma-string) raised SyntaxError",
     "fpsim/io/npz.py read_npy_header", "test_npy_dtype_descr_numpy_reads_as_a_comma_string_is_refused_in_one_line"),
    ("gguf", "gguf's GGUFReader raised KeyError for a metadata key given twice",
     "fpsim/torch/model_files.py _open_gguf", "test_gguf_with_a_metadata_key_given_twice_is_a_gguf_error"),
    ("gguf", "hang: an array field counting 2^60 elements past the end of the file looped in gguf's parser "
     "(its reads past the end come back empty)", "fpsim/torch/model_files.py _bounded_reader",
     "test_gguf_array_counting_past_the_end_of_the_file_is_refused_at_once"),
    ("pt_legacy", "memory: a 501-byte legacy .pt whose pickle holds BYTEARRAY8 of 14 GB made pickle zero-fill 14 GB "
     "(RSS 14 GB, 15-24 s)", "fpsim/io/torchpickle.py _Unpickler.load_bytearray8",
     "test_legacy_pt_bytearray_longer_than_the_file_allocates_nothing"),
    ("npy", "numpy sorts the header's keys: a bytes key beside str ones raised TypeError",
     "fpsim/io/npz.py read_npy_header", "test_npy_header_with_a_bytes_key_is_refused_in_one_line"),
    ("gguf", "a string metadata value that is not UTF-8 raised UnicodeDecodeError when read",
     "fpsim/torch/model_files.py _field", "test_gguf_string_metadata_that_is_not_utf8_is_a_gguf_error"),
]


def _findings_section(results: dict) -> list[str]:
    lines = ["## Findings", "", "Each finding below is fixed; its minimized input is a regression test of "
             "`tests/test_fuzz_findings.py` that fails before the fix.", "",
             "| reader | finding | fixed in | regression test |", "|---|---|---|---|"]
    lines += [f"| {r} | {what} | `{where}` | {test} |" for r, what, where, test in FIXED]
    earlier = [(r, f) for r in ORDER if r in results for f in results[r].get("earlier_findings", [])]
    if earlier:
        lines += ["", "Findings of earlier runs of this campaign (the reader then run again from its grown corpus, "
                  "after the fix): " + "; ".join(f"{r}: {f['kind']}: {f['what']}" for r, f in earlier) + "."]
    return lines + [""]


def render(results: dict, args) -> str:
    lines = [
        "# Fuzzing the readers",
        "",
        "Coverage-guided fuzzing (atheris 3 / libFuzzer) of every reader of fpsim, one target per reader "
        "(`tests/fuzz/harnesses.py`), each from its committed seed corpus (`tests/fuzz/corpus/<reader>/`, written by "
        "`python -m tests.fuzz.make_corpus`).  A target writes the input to a file, opens it through the entry point "
        "the CLI uses and reads every tensor's data; the reader's documented one-line error is the expected refusal, "
        "any other exception is a finding, as is an input that runs past the hang bound or an RSS past the memory "
        "bound.  This table is written by `make fuzz` (`python -m tests.fuzz.run_long`); the CI runs each target for "
        "a few hundred to a few thousand inputs (`tests/test_fuzz.py`).",
        "",
        "Columns: inputs executed (libFuzzer's count, the corpus replay included); wall time of the fuzzer processes, "
        "their start (imports, instrumentation, the seeds' first read: about 3 s each) included; edges and features "
        "are libFuzzer's `cov` and `ft` over the instrumented Python code (fpsim's modules but its Numba kernels, and "
        "gguf's for the GGUF reader; numpy's and torch's compiled code is not instrumented); corpus: the inputs "
        "kept; peak RSS: libFuzzer's `peak_rss_mb`; slowest input: the longest single call of the target, measured "
        "around it (seconds, and its size in bytes).",
        "",
        f"Bounds: hang {args.timeout} s per input (libFuzzer `-timeout`), memory {args.rss_mb} MB RSS "
        f"(`-rss_limit_mb`).  Goal: {args.runs:,} inputs per reader, within a budget of wall time per reader (its "
        "column) on this machine (2 cores shared with other work, the fuzzer at `nice -n 10`, one reader at a time).",
        "",
        "| reader | inputs executed | budget (s) | wall time (s) | inputs/s | edges (cov) | features (ft) | corpus "
        "| peak RSS (MB) | slowest input (s, bytes) | findings |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in ORDER:
        x = results.get(r)
        if x is None:
            lines.append(f"| {r} | not run | | | | | | | | | |")
            continue
        f = "; ".join(f"{d['kind']}: {d['what']}" for d in x["findings"]) or "0"
        rate = x["execs"] / max(x["wall_s"], 1e-9)
        lines.append(f"| {r} | {x['execs']:,} | {x['budget_s']} | {x['wall_s']:.0f} | {rate:,.0f} | "
                     f"{x['cov']} | {x['ft']} | {x['corpus']} | {x['peak_rss_mb']} | {x['slowest_s']:.3f} "
                     f"({x['slowest_bytes']}) | {f} |")
    short = [r for r in ORDER if r in results and results[r]["execs"] < results[r]["target_runs"]]
    lines += ["", "Readers below the goal (stopped by the time budget or by 3 findings; inputs reached and rate as in "
              "the table): "
              + (", ".join(short) if short else "none") + ".", ""]
    return "\n".join(lines + _findings_section(results))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--readers", default=",".join(ORDER))
    ap.add_argument("--runs", type=int, default=1_000_000)
    ap.add_argument("--budget", type=int, default=1800, help="wall seconds per reader at most")
    ap.add_argument("--timeout", type=int, default=2, help="hang bound per input, seconds")
    ap.add_argument("--rss-mb", type=int, default=2048)
    ap.add_argument("--work", type=Path, default=Path("/tmp/fpsim-fuzz-long"))
    ap.add_argument("--out", type=Path, default=ROOT / "reports" / "fuzz.md")
    args = ap.parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    res_path = args.work / "results.json"
    results = json.loads(res_path.read_text()) if res_path.exists() else {}
    for r in args.readers.split(","):
        if r not in READERS:
            sys.exit(f"unknown reader {r!r}")
        before = results.get(r, {})
        results[r] = run_reader(r, args.work, args)
        results[r]["earlier_findings"] = before.get("earlier_findings", []) + before.get("findings", [])
        res_path.write_text(json.dumps(results, indent=1))
        args.out.write_text(render(results, args))
        print(f"{r}: {results[r]['execs']} inputs, findings {len(results[r]['findings'])}", flush=True)


if __name__ == "__main__":
    main()
