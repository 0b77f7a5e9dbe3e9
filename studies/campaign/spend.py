"""Study 8's account of the campaign's device time: the plans and the GPU time they still need at the
measured rates, and the ledger of device commands (``studies/data/campaign/sessions.json``) with its summed wall
time.  :mod:`studies.campaign.report` renders these blocks into the section.

``python -m studies.campaign.spend`` prints, for a session that has a GPU, the runs still to do from the committed
manifest (plan index, run, device seconds at the measured rate alone), packed into sessions (:func:`session_queues`),
each with the device command that runs its queue.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pandas as pd

from studies.campaign.arms import ARMS
from studies.campaign.batch import DATA, plan_runs, run_key


def _plan_text() -> str:
    counts = {p: len(plan_runs(p, lr=1.0)) for p in ("main", "horizon", "size")}
    return (f"Planned (`python -m studies.campaign.batch`): a BF16 learning-rate sweep (4 runs of 40 M tokens), "
            f"then {counts['main']} main runs ({len(ARMS)} arms × 3 seeds, 10.6 M non-embedding parameters, 265 M "
            f"tokens = 25 per parameter), {counts['horizon']} runs at 100 tokens per parameter (BF16, the recipe, "
            f"the recipe without SR) and {counts['size']} at 19.3 M parameters (25 tokens per parameter).")


#: Measured on the H200: two s10m runs side by side in one process, each on its own CUDA stream with CUDA-graph
#: steps (``batch --parallel 2 --streams --cuda-graph``), the way every main batch since 2026-12-03 ran: five
#: commands of 2026-12-04 that each took a pair from zero to 265 M tokens summed to 1.12–1.25 M tokens/s (wall of
#: the command, start-up included; median 1.23 M).  Three on streams summed to 1.17 M (2026-12-03), no more.  This
#: is the rate of an arm whose rate alone is not measured.
TOKENS_PER_S = 1.23e6
#: Tokens/s of one run alone on the H200 (2026-12-04 probes, CUDA-graph steps, the rate at step 191 of ~200, or
#: at step 100 (FP8 blockwise) and 50 (four-over-six); FP8 blockwise's 394 k held over its whole seed-1 run).
#: Where it is measured a run is costed at it: BF16 alone beats any pair (1.53 M), the recipe alone is 11 % below
#: the best pairs, and a pair of four-over-six seeds summed to 0.80 M (2026-12-04, 2 × 265 M tokens in 660 s of
#: two commands), less than one alone.  FP8 blockwise has FP32-scaled operands, which the fast path multiplies in
#: FP32 (not on tensor cores).
ALONE_TOKENS_PER_S = {"bf16": 1.53e6, "nvfp4": 1.10e6, "nvfp4_no_sr": 1.12e6, "mxfp4": 1.17e6,
                      "nvfp4_46": 828e3, "fp8_blockwise": 394e3}
#: Tokens/s of one run alone at the second size (2026-12-04: a probe of the recipe at s20m, 786–795 k over steps
#: 732–1037; BF16's seed-0 size run, median 1.17 M over its whole 482 M tokens, 0.76 of its s10m rate).  An arm not
#: measured there is costed at its s10m rate times the recipe's measured ratio (0.72), not the parameter ratio
#: (0.55): the embedding, attention and the optimizer do not grow with the block linears.
S20M_ALONE_TOKENS_PER_S = {"bf16": 1.17e6, "nvfp4": 795e3}
#: Device seconds a session can spend on runs: 30 minutes less a cold start (~60 s) and the gaps between calls.
SESSION_S = 1_650
#: Seconds of runs one device command holds (at most 600 s a command, less start-up and the archive).
COMMAND_S = 540


def _s20m_ratio() -> float:
    """The recipe's measured s20m rate over its s10m rate (alone on the H200)."""
    return S20M_ALONE_TOKENS_PER_S["nvfp4"] / ALONE_TOKENS_PER_S["nvfp4"]


def _run_seconds(r: dict) -> float:
    """Device seconds a plan's run costs: its tokens at its arm's rate alone where that is measured, else at the
    pair rate; at s20m the measured s20m rate, else the s10m rate times the recipe's s20m/s10m ratio."""
    rate = ALONE_TOKENS_PER_S.get(r["arm"], TOKENS_PER_S)
    if r["size"] == "s20m":
        rate = S20M_ALONE_TOKENS_PER_S.get(r["arm"], rate * _s20m_ratio())
    return r["tokens"] / rate


def _budget_text(done: set[tuple[str, str, int, int]]) -> str:
    """GPU time still needed by each plan at the measured rates, from the runs ``done`` ((arm, size, seed,
    tokens)), and which plans' runs take more than one command or more than one session."""
    parts, chained, long_runs, left_all = [], [], [], []
    for plan in ("main", "horizon", "size"):
        runs = plan_runs(plan, lr=1.0)
        left = [{"plan": plan, "seconds": _run_seconds(r)} for r in runs
                if (r["arm"], r["size"], r["seed"], r["tokens"]) not in done]
        left_all += left
        sec = sum(t["seconds"] for t in left)
        n = len(session_queues(left))
        parts.append(f"{plan}: all {len(runs)} runs done" if not left else
                     f"{plan} {len(runs) - len(left)} of {len(runs)} runs done, {sec / 3600:.1f} h left "
                     f"(~{n} session{'' if n == 1 else 's'})")
        secs = sorted(_run_seconds(r) for r in runs)
        what = f"{plan} runs of {runs[0]['tokens'] / 1e6:,.0f} M tokens take {secs[0]:,.0f}–{secs[-1]:,.0f} s alone"
        if secs[-1] > SESSION_S:
            long_runs.append(what)
        elif secs[-1] > COMMAND_S:
            chained.append(what)
    text = ("GPU time at the measured rates of a run alone (" +
            ", ".join(f"{ARMS[a].label} {v / 1e6:.2f} M" for a, v in ALONE_TOKENS_PER_S.items())
            + f" tokens/s at s10m; other arms at the {TOKENS_PER_S / 1e6:.2f} M tokens/s of two side by side; at s20m "
            + ", ".join(f"{ARMS[a].label} {v / 1e6:.2f} M" for a, v in S20M_ALONE_TOKENS_PER_S.items())
            + f", other arms at their s10m rate × {_s20m_ratio():.2f}, the recipe's measured ratio) and "
            f"~{SESSION_S:,} s of runs per session: " + "; ".join(parts) + ".")
    if left_all:
        n = len(session_queues(left_all))
        text += (f" Packed together, first fit by decreasing length (a run of one plan queued behind another's in "
                 f"one command with `batch --also`; `python -m studies.campaign.spend` prints each session's "
                 f"command), the runs left take {n} session{'' if n == 1 else 's'}.")
    if chained:
        text += (f" Runs longer than one command's ~{COMMAND_S} s ({', '.join(chained)}) resume from their "
                 f"checkpoint when their batch is run again at once; if the session ends first, the checkpoint "
                 f"(130 MB for s10m) crosses to the next session in parts (`studies.campaign.shuttle`: 15 MiB "
                 f"parts, about three calls each way within the 64 MiB a call moves; tested on the CPU, not yet used "
                 f"on the device).")
    if long_runs:
        text += (f" Some runs do not end within one session's ~{SESSION_S:,} s ({', '.join(long_runs)}): their "
                 f"checkpoints must cross sessions (`studies.campaign.shuttle`).")
    return text


def _gpus(c: dict) -> int:
    """How many GPUs a ledger command held: its ``gpus`` field, or the count that
    :func:`studies.campaign.batch.add_ledger` writes into ``gpu`` ("2 × NVIDIA H200"), else one."""
    if c.get("gpus"):
        return int(c["gpus"])
    m = re.match(r"\s*(\d+)\s*×", str(c.get("gpu", "")))
    return int(m.group(1)) if m else 1


def ledger_sums(ledger: Path) -> tuple[float, float, int, int]:
    """(wall seconds summed over the commands that reported one, their GPU-seconds (wall × the GPUs the command
    held: a ``batch --gpus N`` command keeps N GPUs busy), how many commands reported a wall time, how many were
    lost with their machine (wall time null: counted apart, never as 0 s)); zeros without a ledger."""
    cmds = json.loads(ledger.read_text()) if ledger.exists() else []
    known = [c for c in cmds if c.get("wall_s") is not None]
    return (sum(c["wall_s"] for c in known), sum(c["wall_s"] * _gpus(c) for c in known), len(known),
            len(cmds) - len(known))


def _ledger_text(ledger: Path) -> str:
    """The ledger's summed wall time, and its GPU time where a command held several GPUs; a command lost with its
    machine has no wall time (null) and is counted apart rather than as 0 s."""
    if not ledger.exists():
        return "no ledger committed."
    wall, gpu, known, unknown = ledger_sums(ledger)
    text = f"{wall / 3600:.2f} h over {known} commands"
    if gpu != wall:
        text += f" ({gpu / 3600:.2f} GPU-hours: a command on several GPUs counts once per GPU)"
    return text + (f", plus {unknown} command(s) whose machine was taken back before it reported a wall time."
                   if unknown else ".")


def _ledger_table(ledger: Path, md_table) -> str:
    """Every GPU command of the campaign as a table (date, GPU, command, wall s, what came of it), from the ledger;
    "" without one.  A wall time the machine never reported stays empty, not 0."""
    if not ledger.exists():
        return ""
    rows = []
    for c in json.loads(ledger.read_text()):
        res = c.get("result")
        if isinstance(res, dict):
            by: dict[str, list[str]] = {}
            for run, status in res.items():
                by.setdefault(str(status).split(";")[0], []).append(run.split("/")[-1])
            res = "; ".join(f"{k}: {', '.join(v)}" for k, v in by.items())
        # the shell's own paths (--work, --out and their values) say nothing about the run and differ between machines
        cmd = re.sub(r"\s*--(?:work|out)\s+\S+", "", c["command"]).strip()
        rows.append({"date": c["date"], "GPU": c.get("gpu", ""), "command": f"`{cmd}`",
                     "wall s": "" if c.get("wall_s") is None else f"{c['wall_s']:.0f}",
                     "result": str(res).replace("|", "\\|")})  # a '|' would end the Markdown cell
    return ("The ledger, one row per device command (`studies/data/campaign/sessions.json`; wall s: the command's "
            "own wall time, without the machine's start or the transfers):\n\n" + md_table(pd.DataFrame(rows)))


#: The device command of one run alone (the shape every size and horizon run has used: streams and graph steps,
#: ``timeout`` 15 s above ``--max-seconds`` so a stuck run still returns the archive's other files).
COMMAND = ("nvidia-smi --query-gpu=name --format=csv,noheader; PYTHONUNBUFFERED=1 timeout {timeout} python3 -m "
           "studies.campaign.batch --plan {plan} --runs {index} --work /tmp/campaign --out $OUT --parallel 1 "
           "--streams --cuda-graph --max-seconds {max_s} 2>&1 | tail -15")
MAX_S = 560


def todo(plan: str, manifest: Path = DATA / "manifest.json") -> list[dict]:
    """The runs of ``plan`` not done in ``manifest``, in plan order: {plan, index, key, seconds (device seconds
    alone at the measured rate, :func:`_run_seconds`), status (the manifest's, or "not run"), tokens_done}.  A
    partial run's checkpoint stayed on a machine that is gone, so it is costed from zero."""
    man = json.loads(Path(manifest).read_text()) if Path(manifest).exists() else {}
    left = []
    for i, r in enumerate(plan_runs(plan)):
        rec = man.get(run_key(plan, r), {})
        if rec.get("status") != "done":
            left.append({"plan": plan, "index": i, "key": run_key(plan, r), "seconds": _run_seconds(r),
                         "status": rec.get("status", "not run"), "tokens_done": rec.get("tokens_done", 0)})
    return left


def session_queues(left: list[dict]) -> list[list[dict]]:
    """The runs ``left`` (:func:`todo` of one or more plans) packed into queues of one session each, first fit by
    decreasing length: a run goes into the first queue whose seconds stay within ``SESSION_S`` with it, else into
    a new queue.  A queue is one command sent again and again (a run starts when the one before it ends, within
    the same command), so a run's last minutes share a command with the next run's first instead of taking a short
    command of their own; a queue stays within a session because a checkpoint does not outlive its machine.
    Packing the plans together matters: no two of the recipe's horizon runs (948–965 s) fit a session, but each
    fits beside a size run (595–606 s)."""
    queues: list[list[dict]] = []
    for t in sorted(left, key=lambda t: -t["seconds"]):  # sorted() is stable: plan order among equal lengths
        q = next((q for q in queues if sum(u["seconds"] for u in q) + t["seconds"] <= SESSION_S), None)
        if q is None:
            queues.append([t])
        else:
            q.append(t)
    return queues


def queue_command(q: list[dict]) -> str:
    """The device command of a queue (:func:`session_queues`): the first run's plan is ``--plan``, the other
    plans' runs follow with ``--also PLAN=RUNS``."""
    plan = q[0]["plan"]
    mine = ",".join(str(t["index"]) for t in q if t["plan"] == plan)
    others: dict[str, list[str]] = {}
    for t in q:
        if t["plan"] != plan:
            others.setdefault(t["plan"], []).append(str(t["index"]))
    also = "".join(f" --also {p}={','.join(v)}" for p, v in others.items())
    return COMMAND.format(plan=plan, index=mine + also, max_s=MAX_S, timeout=MAX_S + 15)


def todo_text(plans=("horizon", "size", "main"), manifest: Path = DATA / "manifest.json") -> str:
    """What :func:`todo` finds for each plan, then the session queues (:func:`session_queues`) with their device
    command, as text."""
    lines, left = [], []
    for plan in plans:
        mine = todo(plan, manifest)
        left += mine
        if not mine:
            lines.append(f"{plan}: every run done")
            continue
        lines.append(f"{plan}: {len(mine)} of {len(plan_runs(plan))} runs left, "
                     f"{sum(t['seconds'] for t in mine):,.0f} s alone at the measured rates")
        for t in mine:
            state = ("" if t["status"] == "not run" else
                     f" ({t['status']} at {t['tokens_done'] / 1e6:,.0f} M tokens; restarts from zero: its checkpoint "
                     f"went with its machine)")
            lines.append(f"  {t['index']:>2}  {t['key']}  ~{t['seconds']:,.0f} s{state}")
    queues = session_queues(left)
    if queues:
        lines.append(f"{len(queues)} session(s) of at most ~{SESSION_S:,} s of runs; in each, send its command, and "
                     f"the same command again as soon as it returns, until the batch prints every run of it done (no "
                     f"pause between them: the machine is released 30 s after a command ends, and /tmp/campaign, "
                     f"the checkpoints, with it):")
    for k, q in enumerate(queues, 1):
        sec = sum(t["seconds"] for t in q)
        lines.append(f"  session {k}: {', '.join(t['key'] for t in q)}: ~{sec:,.0f} s, "
                     f"~{math.ceil(sec / MAX_S)} command(s)")
        lines.append("      " + queue_command(q))
    if queues:
        lines.append("After each command, here: tar -xf <files_at>/<plan>.tar -C studies/data/campaign/ (the --plan's "
                     "name; the archive holds the --also plans' folders too), then python -c \"from "
                     "studies.campaign.batch import DATA, add_ledger, update_manifest; update_manifest(DATA); "
                     "add_ledger(DATA / '<plan>' / 'ledger.json', gpu='<GPU name the command printed>')\", remove "
                     "that ledger.json, commit, and python -m studies.run_all --only training.")
    return "\n".join(lines)


def main(argv=None) -> None:
    import argparse

    ap = argparse.ArgumentParser(description="The campaign's runs still to do and the device command of each.")
    ap.add_argument("--plan", action="append", choices=("main", "horizon", "size"),
                    help="a plan to list (repeatable; default: horizon, size, main)")
    ap.add_argument("--manifest", type=Path, default=DATA / "manifest.json")
    a = ap.parse_args(argv)
    print(todo_text(tuple(a.plan) if a.plan else ("horizon", "size", "main"), a.manifest))


if __name__ == "__main__":
    main()
