"""Run a batch of campaign runs side by side on one GPU and keep the manifest of what is done.

    python -m studies.campaign.batch --plan main --runs 0:4 --work /tmp/campaign --out $OUT/campaign \\
        --max-seconds 540 --parallel 4

Each run is its own process (``studies.campaign.run``), or with ``--streams`` one of several in this process; runs
that stop early checkpoint under ``--work`` and resume when the batch is run again.  ``--max-seconds`` is the
command's time for runs: a run started when another stops gets what is left, none starts with less than
``run.MIN_START_S`` left (the ledger says "not started"), so a queue such as ``--runs 1,3 --parallel 1`` can be sent
as the same command again and again until both are done.  Runs that are done (in the committed manifest, or by their
record under ``--work``) are skipped, not trained again from zero (``--redo`` runs them).  The device machine's disk
persists only while the machine stays warm (it is released 30 s after a command ends, and every session starts a
bare one), so a run must finish within the commands of one session, chained without a pause, unless its checkpoint
(130 MB for s10m: float32 weights and both AdamW moments) crosses to the next session in 15 MiB parts over a few
calls each way (:mod:`studies.campaign.shuttle`; tested on the CPU, not yet used on the device).  The CSVs and JSONs
go into one tar archive ``--out/<plan>.tar`` (the device returns at most 8 files per command) with the command's
device-time entry ``<plan>/ledger.json``; unpack it into ``studies/data/campaign/``, then :func:`update_manifest`
records each run's status and :func:`add_ledger` appends the entry to ``sessions.json`` (delete the ``ledger.json``
after: the next batch's has the same name).

Measured on the H200 (s10m, batch 64 × 512, eager steps): the NVFP4 recipe alone 368 k tokens/s; six runs side
by side (2026-12-01) 224 k (BF16) and 144–154 k (NVFP4 arms) each; three side by side (2026-12-02) 440 k (BF16),
287 k and 303 k (the recipe with and without SR), 1.03 M in all.  The processes time-slice the GPU, so about
1 M tokens/s in all is the ceiling: three 265 M-token runs take ~840 s, two chained commands:

    python -m studies.campaign.batch --plan main --runs 3:6 --work /tmp/campaign --out $OUT --parallel 3 \\
        --max-seconds 480          # the same command again at once (--max-seconds 540) to finish them; …

``--cuda-graph`` runs each training step as a captured CUDA graph (:class:`fpsim.torch.GraphStep`), which takes
the host's per-layer launch work off the step (every-block NVFP4 on the benchmark GPT: 79.2 → 45.9 ms per step on
the H200, 2026-12-02).  Its AdamW is the same fused one with the learning rate in a device tensor, so the run's
bits equal the eager run's; ``tests/test_campaign.py`` checks that on the GPU (``make test-gpu``: weights, AdamW
state and curve, through a checkpoint, a resume and a recipe switch): it passed there on 2026-12-02, with
``torch.backends.cudnn.deterministic`` set by every run.  Every run on CUDA also sets
``torch.use_deterministic_algorithms(True)`` with cuBLAS's fixed workspace (:mod:`studies.campaign.run`), so that
two processes training one run write the same bits; ``test_two_processes_train_the_same_bits_on_cuda`` checks it
(not yet run on a GPU in this form).

``--streams`` keeps the ``--parallel`` runs in this one process, each on its own CUDA stream
(:func:`studies.campaign.run.train_many`), so they overlap on the GPU instead of time-slicing it.  With ``--streams
--cuda-graph`` three s10m runs summed to 1.17 M tokens/s on the H200 (2026-12-03: BF16 435 k, the recipe 401 k,
without SR 333 k), against 1.03 M as three processes; two on streams summed to 0.95 M (2026-12-03: the recipe
without RHT 521 k, without 2-D weights 433 k).  NVFP4 on every block is the slowest arm (230–280 k tokens/s as one of
three: 159 M tokens after the first 505 s command), so a batch holding it needs a second command of ~400 s;
``--runs`` takes indices as well as slices (``11,14,17``) to group arms by speed.  A batch of three 265 M-token runs
is then two chained foreground commands, ``--max-seconds 510`` and at once again ``--max-seconds 540`` (about 530 +
150 s; about 690 s of device time with the cold start), so two batches fit in one session's 30 minutes.  A pause of
more than 30 s between the two (the controlling session away) loses the first command's checkpoints with the
machine, as happened three times (the ledger says when).  The safer shape is therefore a batch that finishes in
one command: two runs on streams (``--parallel 2 --streams --cuda-graph --max-seconds 560``) finished in one
command every time they were tried, the slowest pair (NVFP4 on every block, seeds 1 and 2, 2026-12-03) in 515 s,
the forward-only, backward-only and late-BF16 arms in pairs in 423–475 s (five commands of 2026-12-04, MXFP4 in one
of them: 1.12–1.25 M tokens/s in all); that is 0.95–1.25 M tokens/s in all instead of 1.17 M for three, but nothing
is lost if the next call comes late.

One run alone (2026-12-04 probes, graph steps, ~200 steps each): BF16 1.53 M tokens/s, the recipe 1.10 M, without
SR 1.12 M, MXFP4 1.17 M, four-over-six 828 k, FP8 blockwise 394 k.  So two side by side gain little over one alone
(1.12–1.25 M against 1.10 M for the recipe), and nothing for some arms: BF16 alone beats every pair, and the pair of
four-over-six seeds 1 and 2 (``--runs 32,35``, 2026-12-04) summed to 0.80 M (660 s over two commands,
``--max-seconds 520`` then ``300``), below one alone.  FP8 blockwise's operands have FP32 scales, so the fast path
multiplies them in FP32 rather than on tensor cores (:func:`fpsim.torch.fastpath.copy_kind`).  Beside a
four-over-six seed (``--runs 28,29``) it kept 273 k tokens/s but cut its neighbour to 227 k: 500 k in all, 1,043 s
over three chained commands.  Alone (seed 1, ``--runs 31 --parallel 1 --streams --cuda-graph``, 2026-12-04) it
held 394 k over the whole run: ``--max-seconds 400`` and at once ``--max-seconds 420`` (411 + 308 s); seed 2
(``--runs 34``) the same way (568 + 157 s).  The horizon runs (1,062 M tokens) go alone too: 694 s (BF16; seed 0
took 369 + 333 s, 1.57 M tokens/s) to 965 s (the recipe), two chained commands each; the recipe's seed 0
(``--runs 1,3 --max-seconds 570``, 2026-12-04) reached 611 M tokens at 1.10 M tokens/s in the first, then the
resuming call's machine was taken back and the checkpoint went with it.  Size runs (482 M tokens at s20m, where
BF16 alone makes 1.17 M tokens/s and the recipe 0.80 M) take ~410–610 s alone, one command each: BF16 seed 0
(``--plan size --runs 0 --parallel 1 --streams --cuda-graph --max-seconds 540``) took 437 s.

``--also PLAN=RUNS`` queues another plan's runs behind this plan's in the same command (one archive, named after
``--plan``, with both plans' folders; one ledger entry): no two of the recipe's horizon runs (948–965 s alone) fit
one session's ~1,650 s of runs, but each fits beside a size run (595–606 s), so the runs left after 2026-12-05
take 7 sessions packed this way against 9 one plan at a time.  ``python -m studies.campaign.spend`` prints that
packing from the committed manifest, with each session's command.

``--gpus N`` is for a machine of several GPUs (the device kinds nvidia-h200-x2/x4, when they are lent): the
selected runs go round robin to N child batches, one per GPU (``CUDA_VISIBLE_DEVICES``), each with this command's
other options (so ``--parallel 2 --streams`` means two runs on streams per GPU); their files come back in the one
archive with one ledger entry (``"gpus": N``; :func:`add_ledger` writes the GPU as "N × …").  A session's device
time counts the machine's time, not its GPUs', so N GPUs finish N times the runs per session.  For the horizon
plan (nine 1,062 M-token runs, 694–965 s each alone on one GPU: ~5 sessions), ``--gpus 4 --parallel 1`` would run
four at once in two chained commands, the nine in three such rounds: about two sessions (an estimate; ``--gpus``
has not run on the device yet).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

from fpsim.io import atomic_write, dumps
from studies.campaign.run import MIN_START_S, NOT_STARTED, run_id, too_late

__all__ = ["PARAMS", "PLANS", "plan_runs", "run_key", "select_indices", "select_runs", "update_manifest", "add_ledger",
           "main"]

DATA = Path(__file__).resolve().parents[1] / "data" / "campaign"

#: The learning rate of every arm, chosen by the ``lr_sweep`` plan (BF16, seed 0, 40 M tokens, 2026-12-01 on the
#: H200): final validation loss 0.8056 at 1e-3, 0.7908 at 2e-3, 1.1420 at 4e-3, 1.3720 at 8e-3 nats per byte.
LR = 2e-3
SEEDS = (0, 1, 2)
#: Non-embedding parameters of each size (``non_embedding_params`` of the model; a test checks them).
PARAMS = {"s10m": 10_621_824, "s20m": 19_274_240}
#: Tokens: 25 per non-embedding parameter at each size (10.6 M and 19.3 M), and 100 per parameter at the main size.
TOKENS = {"s10m": 265_000_000, "s20m": 482_000_000}
HORIZON = 1_062_000_000
#: Sequences of 512 bytes per step (32 k tokens): 8,088 steps for the main budget; the host cost of a step is
#: per layer, not per token, so larger batches keep the emulated recipes off the host's critical path.
BATCH = 64
POLL_S = 2.0
#: The main plan's order: all seeds of a group of arms before the next group, so that a component's paired
#: interval exists after three sessions (four runs each), not after the whole plan.
MAIN_GROUPS = (("bf16", "nvfp4", "nvfp4_no_sr"), ("nvfp4_no_rht", "nvfp4_no_2d", "nvfp4_all"),
               ("nvfp4_fwd", "nvfp4_bwd", "nvfp4_late_bf16"), ("mxfp4", "fp8_blockwise", "nvfp4_46"))


def plan_runs(plan: str, lr: float | None = None) -> list[dict]:
    """The runs of a plan, in a fixed order (arm, seed, size, tokens, lr)."""
    lr = lr if lr is not None else LR
    if plan == "lr_sweep":
        return [{"arm": "bf16", "seed": 0, "size": "s10m", "tokens": 40_000_000, "lr": v}
                for v in (1e-3, 2e-3, 4e-3, 8e-3)]
    if lr is None:
        raise ValueError("the learning rate is not chosen yet: run the lr_sweep plan first (or pass --lr)")
    if plan == "main":
        return [{"arm": a, "seed": s, "size": "s10m", "tokens": TOKENS["s10m"], "lr": lr}
                for group in MAIN_GROUPS for s in SEEDS for a in group]
    if plan == "horizon":
        return [{"arm": a, "seed": s, "size": "s10m", "tokens": HORIZON, "lr": lr}
                for s in SEEDS for a in ("bf16", "nvfp4", "nvfp4_no_sr")]
    if plan == "size":
        return [{"arm": a, "seed": s, "size": "s20m", "tokens": TOKENS["s20m"], "lr": lr}
                for s in SEEDS for a in ("bf16", "nvfp4", "nvfp4_no_sr")]
    raise ValueError(f"unknown plan {plan!r}; plans: {', '.join(PLANS)}")


PLANS = ("lr_sweep", "main", "horizon", "size")


def _dir(plan: str, r: dict) -> str:
    return f"lr_sweep/lr{r['lr']:.0e}" if plan == "lr_sweep" else plan  # no '.': the device drops such names


def select_indices(n: int, spec: str) -> list[int]:
    """The plan indices (of ``n`` runs) a ``--runs`` spec names, in the spec's order: comma-separated Python
    slices ``start:stop`` and single indices (so one slow arm's seeds can share a batch, e.g. ``11,14,17``).  An
    index past the plan, a run named twice or an empty selection is a ValueError."""
    idx: list[int] = []
    for part in spec.split(","):
        part = part.strip()
        try:
            if ":" in part:
                lo, hi = (int(v) if v else None for v in part.split(":"))
                idx += list(range(n))[lo:hi]
            else:
                i = int(part)
                if not -n <= i < n:
                    raise ValueError(f"run {i} is past the plan's {n} runs")
                idx.append(i % n)
        except ValueError as e:
            raise ValueError(f"--runs {spec!r}: {e}") from None
    if not idx or len(set(idx)) != len(idx):
        raise ValueError(f"--runs {spec!r}: " + ("selects no run" if not idx else "names a run twice"))
    return idx


def select_runs(runs: list[dict], spec: str) -> list[dict]:
    """The runs a ``--runs`` spec names (:func:`select_indices`), in the spec's order."""
    return [runs[i] for i in select_indices(len(runs), spec)]


def _run_records(root: Path):
    """(key, record) of every run record (a JSON object with a "run") below ``root``, in path order; the key is
    its folder below ``root`` / run id, as :func:`run_key` names it.  Other JSON files (the ledger, checkpoints'
    step files) are passed over."""
    for p in sorted(root.rglob("*.json")):
        rec = json.loads(p.read_text())
        if isinstance(rec, dict) and "run" in rec:
            yield f"{p.parent.relative_to(root).as_posix()}/{rec['run']}", rec


def update_manifest(results: Path, manifest: Path = DATA / "manifest.json") -> dict:
    """Record every run JSON under ``results`` in the manifest (run id → arm, seed, size, budget, status, tokens
    done, GPU seconds); returns the manifest."""
    man = json.loads(manifest.read_text()) if manifest.exists() else {}
    for key, rec in _run_records(Path(results)):
        man[key] = {k: rec[k] for k in ("arm", "seed", "size", "tokens_budget", "tokens_done", "status", "lr",
                                        "seconds_total", "device")}
    atomic_write(manifest, dumps(dict(sorted(man.items()))))
    return man


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--plan", required=True, choices=PLANS)
    ap.add_argument("--runs", default=None,
                    help="the plan's runs by index: slices start:stop and single indices, comma-separated, e.g. "
                         "9:11,17 (default: all)")
    ap.add_argument("--lr", type=float, default=None)
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--max-seconds", type=float, default=540,
                    help="seconds of runs this command may spend: a run started when others stop gets what is left, "
                         f"and none starts with less than {MIN_START_S:.0f} s left; a run stops at its first log "
                         "step past it and checkpoints")
    ap.add_argument("--parallel", type=int, default=4)
    ap.add_argument("--holdout", default=None)
    ap.add_argument("--loose", action="store_true", help="copy loose files to --out instead of one tar archive")
    ap.add_argument("--cuda-graph", action="store_true", help="runs capture their training step as a CUDA graph")
    ap.add_argument("--streams", action="store_true",
                    help="the --parallel runs in this one process, each on its own CUDA stream (run.train_many), "
                         "instead of one process each")
    ap.add_argument("--gpus", type=int, default=1,
                    help="spread the runs over this many GPUs of the machine, round robin: one child batch per GPU "
                         "(CUDA_VISIBLE_DEVICES), each with this command's --parallel; one archive, one ledger entry")
    ap.add_argument("--manifest", type=Path, default=DATA / "manifest.json",
                    help="runs this manifest lists as done are skipped, as are runs whose record under --work says "
                         "done (default: the committed manifest)")
    ap.add_argument("--redo", action="store_true", help="run the selected runs even if they are done")
    ap.add_argument("--also", action="append", default=[], metavar="PLAN=RUNS",
                    help="queue another plan's runs after this plan's (repeatable), e.g. --also size=1: one session "
                         "can then hold a long run of one plan and a shorter run of another "
                         "(python -m studies.campaign.spend packs them); one archive, named after --plan")
    argv = list(sys.argv[1:] if argv is None else argv)
    a = ap.parse_args(argv)
    plan = plan_runs(a.plan, a.lr)
    idx = select_indices(len(plan), a.runs) if a.runs else list(range(len(plan)))
    also = _also_runs(a.also, a.lr)
    if also and a.gpus > 1:
        raise SystemExit("batch: --also queues runs on one GPU; with --gpus, send one plan per command")
    runs = [(a.plan, plan[i]) for i in idx] + also  # (plan, run); the first len(idx) are --plan's runs idx
    keys = [run_key(p, r) for p, r in runs]
    if len(set(keys)) != len(keys):  # two copies of one run would train side by side into the same files
        raise SystemExit("batch: --runs and --also name a run twice")
    if not a.redo:  # a done run started again would train from zero (its checkpoint is gone) to the same bits
        done = _done_keys(a)
        for k in keys:
            if k in done:
                print(f"{k}: done already, skipped (--redo runs it again)", flush=True)
        idx = [i for i, k in zip(idx, keys) if k not in done]
        runs = [t for t, k in zip(runs, keys) if k not in done]
    t0 = time.perf_counter()
    if a.gpus > 1:
        exits = _over_gpus(a, argv, plan, idx)
    else:
        exits = _in_process(a, runs) if a.streams else _processes(a, runs)
    # the command's entry for the device-time ledger (studies/data/campaign/sessions.json; add_ledger merges it)
    statuses = {}
    for key, code in exits.items():  # code: an exit code, or the status of a run that was not started
        js = a.out / f"{key}.json"
        if isinstance(code, str):
            statuses[key] = code
        else:
            statuses[key] = (json.loads(js.read_text()).get("status", "?") if js.exists()
                             else f"exit {code}, no record")
    entry = {"date": time.strftime("%Y-%m-%d"), "command": " ".join(["batch", *argv]),
             "wall_s": round(time.perf_counter() - t0, 1), "result": statuses}
    if a.gpus > 1:
        entry["gpus"] = a.gpus
    (a.out / a.plan).mkdir(parents=True, exist_ok=True)
    atomic_write(a.out / a.plan / "ledger.json", dumps(entry))
    if not a.loose:
        _archive(a.out, a.plan, sorted({p for p, _ in runs} - {a.plan}))


def _also_runs(specs: list[str], lr: float | None) -> list[tuple[str, dict]]:
    """(plan, run) of each ``--also PLAN=RUNS``, in the order given; RUNS as ``--runs`` takes them."""
    out: list[tuple[str, dict]] = []
    for spec in specs:
        name, sep, sel = spec.partition("=")
        if not sep or name not in PLANS or not sel:
            raise SystemExit(f"batch: --also {spec!r}: expected PLAN=RUNS with PLAN one of {', '.join(PLANS)}")
        runs = plan_runs(name, lr)
        try:
            out += [(name, runs[i]) for i in select_indices(len(runs), sel)]
        except ValueError as e:
            raise SystemExit(f"batch: --also {spec!r}: {e}") from None
    return out


def run_key(plan: str, r: dict) -> str:
    """A run's key in the ledger and the manifest: its plan folder / run id."""
    return f"{_dir(plan, r)}/{run_id(r['arm'], r['seed'], r['size'], r['tokens'])}"


def _done_keys(a) -> set[str]:
    """Keys (:func:`run_key`) of the runs that are done: in ``a.manifest``, or by their record under ``a.work`` (a
    run finished by an earlier command of this session, not yet in the committed manifest)."""
    man = json.loads(a.manifest.read_text()) if a.manifest.exists() else {}
    done = {k for k, v in man.items() if v.get("status") == "done"}
    return done | {k for k, rec in _run_records(a.work) if rec.get("status") == "done"}


def _without(argv: list[str], options: tuple[str, ...], flags: tuple[str, ...] = ()) -> list[str]:
    """``argv`` without the given options (``--opt value`` or ``--opt=value``) and flags."""
    out, skip = [], False
    for w in argv:
        if skip:
            skip = False
        elif w in options:
            skip = True
        elif not (w in flags or any(w.startswith(o + "=") for o in options)):
            out.append(w)
    return out


def _over_gpus(a, argv: list[str], plan: list[dict], idx: list[int]) -> dict:
    """The runs ``idx`` of ``plan`` spread over ``a.gpus`` GPUs, round robin: GPU k runs ``idx[k::gpus]`` as a
    child batch with this command's other options (CUDA_VISIBLE_DEVICES names that one GPU, so it is the child's
    cuda:0), writing loose files to ``out/gpu<k>``; its files then move under ``out``.  {key: the child's exit
    code}.  Why children: one process per GPU keeps each GPU's streams and graphs in their own context, the shape
    already measured on one GPU."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = visible.split(",") if visible else [str(k) for k in range(a.gpus)]
    import torch

    have = torch.cuda.device_count() if torch.cuda.is_available() else None
    if len(ids) < a.gpus or (have is not None and have < a.gpus):
        raise SystemExit(f"batch: --gpus {a.gpus}, but this machine shows {have if have is not None else len(ids)}")
    base = _without(argv, ("--runs", "--out", "--gpus"), ("--loose",))
    children = []
    for k in range(min(a.gpus, len(idx))):
        sub = idx[k::a.gpus]
        out_k = a.out / f"gpu{k}"
        cmd = [sys.executable, "-m", "studies.campaign.batch", *base, "--runs", ",".join(map(str, sub)),
               "--out", str(out_k), "--loose"]
        children.append((sub, out_k, subprocess.Popen(cmd, env={**os.environ, "CUDA_VISIBLE_DEVICES": ids[k]})))
    exits = {}
    for sub, out_k, p in children:
        code = p.wait()
        for f in sorted(f for f in out_k.rglob("*") if f.is_file() and f.name != "ledger.json"):
            dest = a.out / f.relative_to(out_k)
            dest.parent.mkdir(parents=True, exist_ok=True)
            f.replace(dest)
        shutil.rmtree(out_k, ignore_errors=True)
        for i in sub:  # a run whose child died before writing its record is "exit N, no record" in the ledger
            exits[run_key(a.plan, plan[i])] = code
    return exits


def _collect(a, plan: str, r: dict) -> str:
    """Copy a stopped run's CSV and JSON from --work to --out; returns its key (:func:`run_key`)."""
    key = run_key(plan, r)
    (a.out / key).parent.mkdir(parents=True, exist_ok=True)
    for ext in (".csv", ".json"):
        if (a.work / f"{key}{ext}").exists():
            shutil.copy2(a.work / f"{key}{ext}", a.out / f"{key}{ext}")
    return key


def _in_process(a, runs: list[tuple[str, dict]]) -> dict:
    """The runs ((plan, run)) side by side in this process (run.train_many); {key: 0 or 1 (an error status)}."""
    from studies.campaign.data import python_sources
    from studies.campaign.run import train_many

    hold = tuple(a.holdout.split(",")) if a.holdout else None
    corpus = python_sources(holdout=hold) if hold else python_sources()
    specs = [{"arm": r["arm"], "seed": r["seed"], "size": r["size"], "tokens": r["tokens"], "lr": r["lr"],
              "out": a.work / _dir(p, r)} for p, r in runs]
    exits = {}

    def done(spec, rec):
        p, r = runs[next(i for i, sp in enumerate(specs) if sp is spec)]
        status = str(rec.get("status", ""))
        print(f"{rec['run']}: {status}", flush=True)
        if status.startswith(NOT_STARTED):  # nothing new under --work: its status goes to the ledger as it is
            exits[run_key(p, r)] = status
            return
        exits[_collect(a, p, r)] = 1 if status.startswith("error") else 0

    train_many(specs, parallel=a.parallel, on_done=done, batch=BATCH, max_seconds=a.max_seconds, corpus=corpus,
               cuda_graph=a.cuda_graph)
    return exits


def _processes(a, runs: list[tuple[str, dict]]) -> dict:
    """The runs ((plan, run)) as --parallel processes at a time; {key: exit code, or the status of a run not
    started}.  A run started when another ends gets what is left of --max-seconds (none with less than
    MIN_START_S)."""
    procs, pending, exits = [], list(runs), {}
    deadline = time.perf_counter() + a.max_seconds
    while pending or procs:
        while pending and len(procs) < a.parallel:  # keep --parallel runs going: start one as soon as one ends
            p, r = pending.pop(0)
            left = deadline - time.perf_counter()
            if status := too_late(left):
                exits[run_key(p, r)] = status
                print(f"{run_key(p, r)}: {status}", flush=True)
                continue
            cmd = [sys.executable, "-m", "studies.campaign.run", "--arm", r["arm"], "--seed", str(r["seed"]),
                   "--size", r["size"], "--tokens", str(r["tokens"]), "--lr", str(r["lr"]), "--batch", str(BATCH),
                   "--max-seconds", f"{left:.1f}", "--out", str(a.work / _dir(p, r))]
            if a.holdout:
                cmd += ["--holdout", a.holdout]
            if a.cuda_graph:
                cmd.append("--cuda-graph")
            procs.append((p, r, subprocess.Popen(cmd)))
        done = [t for t in procs if t[2].poll() is not None]
        if not done:
            time.sleep(POLL_S)
            continue
        procs.remove(done[0])
        p, r, proc = done[0]
        key = _collect(a, p, r)
        print(f"{key}: exit {proc.returncode}", flush=True)
        exits[key] = proc.returncode
    return exits


def add_ledger(entry_file: Path, ledger: Path = DATA / "sessions.json", gpu: str | None = None) -> list:
    """Append one command's ledger entry (``ledger.json`` of a batch's archive) to the device-time ledger."""
    entries = json.loads(ledger.read_text()) if ledger.exists() else []
    e = json.loads(Path(entry_file).read_text())
    if gpu:
        n = e.pop("gpus", 1)
        e = {"date": e["date"], "gpu": gpu if n == 1 else f"{n} × {gpu}", **{k: v for k, v in e.items() if k != "date"}}
    entries.append(e)
    atomic_write(ledger, dumps(entries))
    return entries


def _archive(out: Path, plan: str, others: list[str] = ()) -> Path:
    """Move the result files of ``plan`` (and of the ``others`` plans an ``--also`` queued) under ``out`` into
    one tar archive ``out/<plan>.tar`` (written atomically)."""
    srcs = [out / p for p in (plan, *others)]
    files = [f for src in srcs if src.exists() for f in sorted(f for f in src.rglob("*") if f.is_file())]
    dest = out / f"{plan}.tar"
    tmp = dest.with_suffix(".tar.tmp")
    with tarfile.open(tmp, "w") as tf:
        for f in files:
            tf.add(f, arcname=f.relative_to(out).as_posix())
    tmp.replace(dest)
    for src in srcs:
        shutil.rmtree(src, ignore_errors=True)
    return dest


if __name__ == "__main__":
    main()
