"""One campaign run: (arm, seed, size, token budget) → a CSV of the curve and a JSON of the run.

    python -m studies.campaign.run --arm nvfp4 --seed 0 --size s10m --tokens 265e6 --lr 3e-3 --out DIR \\
        [--max-seconds 540] [--batch 32]

Protocol: AdamW (β = 0.9, 0.95; weight decay 0.1 on matrices), linear warmup over the first 2 % of steps then
cosine decay to 10 % of the peak learning rate, gradient clipping at 1.0, bf16 autocast.  The seed fixes the
initial weights (``torch.manual_seed`` before the model is built) and the data order (a permutation per epoch of
the corpus's non-overlapping ``ctx + 1``-byte windows, from ``numpy.random.default_rng([seed, epoch])``), so two
arms with one seed see the same batches.  Validation: ``val_tokens`` predicted bytes (:data:`VAL_TOKENS`) in
windows of ``ctx + 1`` bytes drawn from every held-out package, an equal share of windows from each, evenly spaced
over the package's bytes (:func:`validation_windows`), evaluated at 20 evenly spaced token counts and at the end
(mean nats per byte).  The record says which windows a run used (``"validation"``; runs without that key used the
first 1,048,576 bytes of the held-out stream, which are pandas's).

The curve (CSV) holds only what the run computes: step, tokens, learning rate, train and validation loss, so that
two runs of one (arm, seed, size, budget) write the same bytes; the tokens/s of each logged window (a wall-clock
measure) go to the record (``"throughput"``), with the SHA-256 of the final weights (``"weights_sha256"``).  On
CUDA a run is deterministic (``torch.use_deterministic_algorithms``, cuDNN's deterministic flag and a fixed cuBLAS
workspace, :data:`CUBLAS_WORKSPACE_CONFIG`; the record's ``"deterministic"``).

A run that reaches ``--max-seconds`` writes a checkpoint (safetensors of the weights and the optimizer state, and
a JSON of the step; no pickle) and exits with status ``"partial"``; the same command resumes it.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import math
import os
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

import fpsim.torch as ft
from fpsim.io import atomic_write, dumps
from fpsim.torch import fastpath
from studies.campaign.arms import ARMS, apply_arm
from studies.campaign.data import python_sources
from studies.campaign.model import SIZES, Llama, non_embedding_params

__all__ = ["run_id", "batches", "lr_at", "validation_windows", "weights_sha256", "Run", "train", "train_many",
           "MIN_START_S", "NOT_STARTED", "too_late", "profile_run", "main", "VAL_TOKENS", "CUBLAS_WORKSPACE_CONFIG"]

#: The curve's columns: what the run computes, nothing timed (the committed runs before this layout also have a
#: ``tokens_per_s`` column; :func:`studies.campaign.report.load_runs` reads both).
CSV_COLUMNS = ("step", "tokens", "lr", "train_loss", "val_loss")
#: Validation tokens (predicted bytes) per evaluation: 4 Mi, from every held-out package.
VAL_TOKENS = 1 << 22
#: cuBLAS's fixed workspace for reproducible GEMMs (the setting PyTorch's deterministic mode requires of CUDA ≥ 10.2;
#: ``:16:8`` is the other it accepts).  cuBLAS and PyTorch read it when their handles and workspaces are first made,
#: so it is set when this module is imported, before anything here touches CUDA; a value already set is kept.
CUBLAS_WORKSPACE_CONFIG = ":4096:8"
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE_CONFIG)
#: How every run multiplies two scaled copies (fpsim.torch.fastpath.GEMM), pinned: the paths sum the same exact
#: products in different FP32 orders, so a default changed mid-campaign would make arms differ by more than the
#: recipe.  The runs so far used cuBLAS + the alpha epilogue.
GEMM_PATH = "cublas"
#: cuDNN's attention backward may choose a nondeterministic algorithm (PyTorch's scaled_dot_product_attention
#: notes say so; its remedy is this flag).  Seen on the H200 (2026-12-02): the benchmark's BF16 CUDA-graph arm, the
#: same code, seed and data, ended 24 steps at loss 3.410 in one run and 3.411 in the next.  With the flag a seed's
#: run repeats bit for bit; the runs before this constant (main plan's first three) ran without it.
CUDNN_DETERMINISTIC = True
EVALS = 20


def run_id(arm: str, seed: int, size: str, tokens: int) -> str:
    return f"{size}-{arm}-s{seed}-t{int(tokens) // 1_000_000}m"


def batches(stream: np.ndarray, ctx: int, batch: int, seed: int, start_step: int = 0):
    """(step, int64 array batch × (ctx + 1)) from ``start_step`` on: non-overlapping windows, a permutation per
    epoch from ``default_rng([seed, epoch])`` (the same batches for every arm of a seed)."""
    n = (stream.size - 1) // ctx
    if n < batch:
        raise ValueError(f"the stream holds {n} windows of {ctx} bytes, fewer than one batch of {batch}")
    per_epoch = n // batch
    step = start_step
    cols = np.arange(ctx + 1)[None, :]
    perm_epoch, perm = None, None
    while True:
        epoch, i = divmod(step, per_epoch)
        if epoch != perm_epoch:  # one permutation per epoch (~8 ms for 0.7 M windows: not once per step)
            perm_epoch, perm = epoch, np.random.default_rng([seed, epoch]).permutation(n)
        order = perm[i * batch:(i + 1) * batch]
        idx = order[:, None] * ctx + cols
        yield step, stream[idx].astype(np.int64)
        step += 1


def lr_at(step: int, steps: int, peak: float) -> float:
    """Linear warmup over 2 % of the steps, then cosine to 10 % of the peak."""
    warm = max(1, round(0.02 * steps))
    if step < warm:
        return peak * (step + 1) / warm
    t = min(1.0, (step - warm) / max(1, steps - warm))
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t)))


def _optimizer(model, lr: float, device: str, graph: bool = False):
    """AdamW; for CUDA graphs ``capturable`` with the learning rate in a device tensor (a float would be frozen
    into the captured step)."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    kw = {"lr": torch.tensor(lr, device=device), "capturable": True} if graph else {"lr": lr}
    return torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
                             betas=(0.9, 0.95), fused=device == "cuda", **kw)


def _save(ckpt: Path, model, opt, step: int) -> None:
    from safetensors.torch import save_file

    ckpt.mkdir(parents=True, exist_ok=True)
    tensors = {f"model.{k}": v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    for i, p in enumerate(p for g in opt.param_groups for p in g["params"]):
        for k, v in opt.state.get(p, {}).items():
            if torch.is_tensor(v):
                tensors[f"opt.{i}.{k}"] = v.detach().reshape(v.shape).contiguous().cpu()
    tmp = ckpt / "state.safetensors.tmp"
    save_file(tensors, str(tmp))
    tmp.replace(ckpt / "state.safetensors")
    atomic_write(ckpt / "step.json", dumps({"step": step}))


def _load(ckpt: Path, model, opt, device: str) -> int:
    from safetensors.torch import load_file

    if not (ckpt / "step.json").exists():
        return 0
    tensors = load_file(str(ckpt / "state.safetensors"), device=device)
    model.load_state_dict({k[6:]: v for k, v in tensors.items() if k.startswith("model.")})
    for i, p in enumerate(p for g in opt.param_groups for p in g["params"]):
        st = {k.split(".", 2)[2]: v for k, v in tensors.items() if k.startswith(f"opt.{i}.")}
        if st:
            opt.state[p] = st
    return int(json.loads((ckpt / "step.json").read_text())["step"])


def _same_corpus(prev: Path, now: dict, validation: dict) -> None:
    """A resumed run must read the stream it started on and validate on the windows it started with: a checkpoint
    carried to another machine (whose installed packages may differ) with another corpus is a ValueError naming both
    SHA-256s, and so is one whose record has other validation windows (or none: a run started before the windows
    were drawn from every held-out package), not a silently mixed run."""
    if not prev.exists():
        return
    rec = json.loads(prev.read_text())
    was = rec.get("corpus") or {}
    for part in ("train", "val"):
        old = (was.get(part) or {}).get("sha256")
        if old is not None and old != now[part]["sha256"]:
            raise ValueError(f"{prev.stem}: the checkpoint was trained on a {part} stream with SHA-256 {old}, this "
                             f"machine's corpus has {now[part]['sha256']}; resume it where its packages are the same")
    old = (rec.get("validation") or {}).get("sha256")
    if old != validation["sha256"]:
        raise ValueError(f"{prev.stem}: the checkpoint's curve was validated on other windows (SHA-256 {old}) than "
                         f"this run's ({validation['sha256']}); start it again")


def validation_windows(corpus, ctx: int, tokens: int) -> tuple[np.ndarray, dict]:
    """(int64 array windows × (ctx + 1), its record) of ``tokens // ctx`` validation windows: an equal share from
    each held-out package (the first ``n % P`` packages, in stream order, take one more), each share evenly spaced
    over its package's bytes (window j of k in a package of L bytes starts j·⌊L / k⌋ bytes in), so windows never
    overlap and every part of every package is sampled; no randomness, so every run of a corpus gets the same
    windows.  The record: tokens, windows, windows per package and the SHA-256 of the windows' bytes.  A ValueError
    when the held-out stream, or one package, is too small for its share."""
    n = tokens // ctx
    spans = corpus.spans()
    if (corpus.val.size - 1) // ctx < n:
        raise ValueError(f"the held-out packages {', '.join(corpus.holdout)} hold {corpus.val.size:,} bytes, "
                         f"fewer than the {tokens:,} validation tokens; hold out other packages (--holdout)")
    starts, per = [], {}
    for i, (name, start, end) in enumerate(spans):
        k = n // len(spans) + (i < n % len(spans))
        stride = (end - start) // max(k, 1)
        if k and stride < ctx + 1:
            raise ValueError(f"the held-out package {name} holds {end - start:,} bytes, fewer than its {k:,} "
                             f"validation windows of {ctx + 1} bytes; hold out other packages (--holdout)")
        starts.append(start + stride * np.arange(k))
        per[name] = k
    idx = np.concatenate(starts)[:, None] + np.arange(ctx + 1)[None, :]
    win = corpus.val[idx]
    return win.astype(np.int64), {"tokens": n * ctx, "windows": n, "window_bytes": ctx + 1,
                                  "selection": "an equal share of windows from each held-out package, evenly spaced",
                                  "packages": per, "sha256": hashlib.sha256(win.tobytes()).hexdigest()}


def weights_sha256(model) -> str:
    """SHA-256 of a model's state dict: each entry's name, dtype, shape and bytes, in the state dict's order (two
    models with one hash have the same weights bit for bit)."""
    h = hashlib.sha256()
    for k, v in model.state_dict().items():
        t = v.detach().cpu().contiguous()
        h.update(f"{k}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


@torch.no_grad()
def _val_loss(model, val: torch.Tensor, ctx: int, device: str, batch: int = 64) -> float:
    model.eval()
    tot, n = 0.0, 0
    for i in range(0, val.shape[0], batch):
        xb = val[i:i + batch].to(device)
        with torch.autocast(device, dtype=torch.bfloat16, enabled=device == "cuda"):
            logits = model(xb[:, :-1])
        tot += float(F.cross_entropy(logits.reshape(-1, logits.shape[-1]), xb[:, 1:].reshape(-1), reduction="sum"))
        n += xb[:, 1:].numel()
    model.train()
    return tot / n


class Run:
    """One run's state between steps, so that :func:`train` can drive one run and :func:`train_many` several
    side by side in one process (each on its own CUDA stream).  The arguments are :func:`train`'s."""

    def __init__(self, arm: str, seed: int, size: str, tokens: float, lr: float, out: Path, *, batch: int = 32,
                 max_seconds: float = math.inf, val_tokens: int = VAL_TOKENS, corpus=None, device: str | None = None,
                 log_every: int = 50, holdout: tuple[str, ...] | None = None, cuda_graph: bool = False,
                 stop_at: int | None = None, prof=None, checkpoint: bool = True):
        device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.graph_mode = bool(cuda_graph) and device == "cuda"
        fastpath.GEMM = GEMM_PATH
        if device == "cuda":
            torch.backends.cudnn.deterministic = CUDNN_DETERMINISTIC
            # strict, not warn_only: an op without a deterministic kernel raises instead of drifting, and PyTorch's
            # flash-attention backward runs its deterministic algorithm only in strict mode (with warn_only it warns
            # "Flash Attention defaults to a non-deterministic algorithm" and stays nondeterministic)
            torch.use_deterministic_algorithms(True)
        self.cfg, self.a = cfg, a = SIZES[size], ARMS[arm]
        self.arm, self.seed, self.size, self.tokens, self.lr, self.batch = arm, seed, size, tokens, lr, batch
        self.device, self.max_seconds, self.log_every, self.stop_at = device, max_seconds, log_every, stop_at
        self.prof, self.checkpoint = prof, checkpoint
        self.rid = rid = run_id(arm, seed, size, tokens)
        self.out = out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        self.corpus = corpus = corpus or (python_sources(holdout=holdout) if holdout else python_sources())
        self.ctx = ctx = cfg.ctx
        self.steps = steps = max(1, int(tokens) // (batch * ctx))
        val, self.validation = validation_windows(corpus, ctx, val_tokens)
        self.val = torch.from_numpy(val)
        torch.manual_seed(seed)
        model = Llama(cfg)
        self.n_params = non_embedding_params(model)
        self.model = model = apply_arm(model.to(device), a, seed, cfg.layers)
        self.opt = opt = _optimizer(model, lr, device, self.graph_mode)
        self.ckpt = out / "ckpt" / rid
        self.start = start = _load(self.ckpt, model, opt, device)
        self.corpus_manifest = corpus.manifest()
        if start:
            _same_corpus(out / f"{rid}.json", self.corpus_manifest, self.validation)
        ft.set_step(model, start)
        self.csv_path = out / f"{rid}.csv"
        self.rows = self.csv_path.read_text().splitlines()[1:] if start and self.csv_path.exists() else []
        # tokens/s of each logged window ([step, rate]), the record's; a resumed run keeps those of its kept rows
        self.throughput = ([r for r in json.loads((out / f"{rid}.json").read_text()).get("throughput", [])
                            if r[0] <= start] if start and (out / f"{rid}.json").exists() else [])
        self.eval_steps = {round(steps * (k + 1) / EVALS) - 1 for k in range(EVALS)}
        self.t_start = time.perf_counter()
        self.status, self.loss_acc, self.n_acc, self.t_log, self.tok_log = "done", None, 0, time.perf_counter(), 0
        self.switched = False
        # the step's input (static for graphs)
        self.xs = torch.zeros((batch, ctx + 1), dtype=torch.int64, device=device)
        self.stepper = ft.GraphStep(self._body, model, opt) if self.graph_mode else None
        self.prof_at, self.prof_t0, self.prof_n = start + 3, None, 0
        self.data = batches(corpus.train, ctx, batch, seed, start)
        self.finished = False

    def _body(self):
        model, xs, device = self.model, self.xs, self.device
        with torch.autocast(device, dtype=torch.bfloat16, enabled=device == "cuda",
                            cache_enabled=not self.graph_mode):
            logits = model(xs[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, self.cfg.vocab), xs[:, 1:].reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        self.opt.step()
        return loss

    def advance(self) -> bool:
        """Run one step (and its log point, if it is one); False once the run has stopped (done, partial or
        diverged: :attr:`status`)."""
        if self.finished:
            return False
        step, xb = next(self.data)
        if step >= self.steps:
            self.finished = True
            return False
        model, opt, device, lr, steps = self.model, self.opt, self.device, self.lr, self.steps
        if self.prof is not None and step == self.prof_at:
            if device == "cuda":
                torch.cuda.synchronize()
            self.prof.__enter__()
            self.prof_t0 = time.perf_counter()
        self.prof_n += self.prof_t0 is not None
        if self.a.switch_at is not None and not self.switched and step >= math.ceil(self.a.switch_at * steps):
            ft.set_recipe(model, "bf16")  # also when a resumed run starts past the switch
            self.switched = True
            if self.stepper is not None:
                self.stepper.recapture()
        for g in opt.param_groups:
            if self.graph_mode:
                g["lr"].fill_(lr_at(step, steps, lr))
            else:
                g["lr"] = lr_at(step, steps, lr)
        xb = torch.from_numpy(xb)
        # from pinned memory the copy is queued without waiting for the GPU (a pageable copy syncs the stream first)
        self.xs.copy_(xb.pin_memory() if self.xs.is_cuda else xb, non_blocking=self.xs.is_cuda)
        if self.stepper is not None:
            loss = self.stepper()
        else:
            loss = self._body()
            opt.zero_grad(set_to_none=True)
        ft.step(model)
        self.loss_acc = loss.detach() if self.loss_acc is None else self.loss_acc + loss.detach()
        self.n_acc += 1
        self.tok_log += self.xs[:, 1:].numel()
        if (step + 1) % self.log_every == 0 or step in self.eval_steps:
            tl = float(self.loss_acc) / self.n_acc
            now = time.perf_counter()
            vl = _val_loss(model, self.val, self.ctx, device) if step in self.eval_steps else None
            self.rows.append(",".join(str(v) for v in (
                step + 1, (step + 1) * self.batch * self.ctx, f"{lr_at(step, steps, lr):.6g}", f"{tl:.6f}",
                "" if vl is None else f"{vl:.6f}")))
            self.throughput.append([step + 1, round(self.tok_log / (now - self.t_log), 1)])
            if vl is not None:  # progress on stdout at the evaluation points (the CSV is written at the end)
                print(f"{self.rid}: {self.rows[-1]}", flush=True)
            self.loss_acc, self.n_acc, self.t_log, self.tok_log = None, 0, time.perf_counter(), 0
            if not math.isfinite(tl):
                self.status, self.finished = "diverged", True
                return False
            out_of_time = time.perf_counter() - self.t_start > self.max_seconds
            if (out_of_time or (self.stop_at is not None and step + 1 >= self.stop_at)) and step + 1 < steps:
                if self.checkpoint:
                    _save(self.ckpt, model, opt, step + 1)
                self.status, self.finished = "partial", True
                return False
        return True

    def finish(self) -> dict:
        """Write the curve (CSV) and the record (JSON) of what has run; returns the record."""
        prof_s = None
        if self.prof_t0 is not None:
            if self.device == "cuda":
                torch.cuda.synchronize()
            prof_s = time.perf_counter() - self.prof_t0
            self.prof.__exit__(None, None, None)
        atomic_write(self.csv_path, "\n".join((",".join(CSV_COLUMNS), *self.rows)) + "\n")
        done_tokens = int(self.rows[-1].split(",")[1]) if self.rows else 0
        device, stepper = self.device, self.stepper
        rec = {"run": self.rid, "arm": self.arm, "recipe": self.a.build().name, "seed": self.seed, "size": self.size,
               "config": vars(self.cfg), "non_embedding_params": self.n_params, "tokens_budget": int(self.tokens),
               "tokens_done": done_tokens, "steps": self.steps, "batch": self.batch, "lr": self.lr,
               "gemm_path": GEMM_PATH, "cudnn_deterministic": CUDNN_DETERMINISTIC if device == "cuda" else None,
               "deterministic": torch.are_deterministic_algorithms_enabled(),
               "cublas_workspace_config": os.environ.get("CUBLAS_WORKSPACE_CONFIG") if device == "cuda" else None,
               "validation": self.validation, "weights_sha256": weights_sha256(self.model),
               "throughput": self.throughput,
               "cuda_graph": stepper is not None and stepper.failed is None,
               "cuda_graph_failure": None if stepper is None else stepper.failed, "status": self.status,
               "device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu",
               "seconds_this_call": round(time.perf_counter() - self.t_start, 1),
               "corpus": self.corpus_manifest, "layers": [list(r) for r in ft.summary(self.model)]}
        if self.side_by_side:
            rec["side_by_side"] = self.side_by_side
        if prof_s is not None:
            rec.update(profiled_s=round(prof_s, 4), profiled_steps=self.prof_n)
        prev = self.out / f"{self.rid}.json"
        if prev.exists():
            rec["seconds_total"] = round(json.loads(prev.read_text()).get("seconds_total", 0)
                                         + rec["seconds_this_call"], 1)
        else:
            rec["seconds_total"] = rec["seconds_this_call"]
        atomic_write(prev, dumps(rec))
        return rec

    #: how many runs shared the process when this one ran (train_many sets it; None: alone)
    side_by_side: int | None = None


def train(arm: str, seed: int, size: str, tokens: float, lr: float, out: Path, **kw) -> dict:
    """Train (or resume) one run; returns its JSON record (also written next to its CSV).

    Keywords: ``batch`` (sequences per step), ``max_seconds``, ``val_tokens``, ``corpus`` (default: the Python
    sources, :func:`studies.campaign.data.python_sources`), ``device``, ``log_every``, ``holdout``,
    ``cuda_graph``, ``stop_at``, ``prof``, ``checkpoint``.

    ``cuda_graph`` (CUDA only): after three eager warm-up steps (again after a recipe switch) the training step
    is captured as one CUDA graph and replayed, with stochastic rounding's keys from a
    :class:`fpsim.torch.GraphKeys` table; the optimizer is then the same fused AdamW with its learning rate in a
    device tensor (``capturable=True``), which gives the eager run's bits (a GPU test checks it).

    ``stop_at``: checkpoint and stop (status ``"partial"``) at the first log point at or past this step, as
    ``max_seconds`` does by time (tests and throughput probes); ``checkpoint=False`` stops without writing the
    checkpoint (profiles, which resume nothing).  ``prof``: a context (a ``torch.profiler``
    profile, :class:`studies.bench.profiling.SyncWatch`) entered three steps after the start and left when the run
    stops; the record then holds ``profiled_s`` and ``profiled_steps``."""
    r = Run(arm, seed, size, tokens, lr, out, **kw)
    while r.advance():
        pass
    return r.finish()


#: A queued run is not started when fewer seconds than this are left of the call's ``max_seconds``: its start
#: (model, graph capture, warm-up) and its checkpoint would take most of them, and a run that overshoots the
#: device command's limit is killed before its checkpoint and its batch's archive are written.
MIN_START_S = 60.0
NOT_STARTED = "not started"


def too_late(left: float) -> str | None:
    """The status of a queued run not started with ``left`` seconds of ``max_seconds`` left, or None when it may
    start (:data:`MIN_START_S` or more left)."""
    return None if left >= MIN_START_S else f"{NOT_STARTED}: {max(left, 0.0):.0f} s of max_seconds left"


def train_many(specs: list[dict], *, parallel: int, on_done=None, **kw) -> list[dict]:
    """Train the runs ``specs`` (each a dict of :func:`train`'s ``arm``, ``seed``, ``size``, ``tokens``, ``lr``,
    ``out``), ``parallel`` at a time in this one process, each on its own CUDA stream, a step of each in turn;
    a run that stops is replaced by the next spec.  ``kw``: :func:`train`'s keywords, shared.  Returns the
    records in the order of ``specs``; ``on_done(spec, record)`` is called as each run stops.

    ``max_seconds`` is this call's time, not each run's: a run started when others stop gets what is left, and
    with fewer than :data:`MIN_START_S` left it is not started (its record's status begins with
    :data:`NOT_STARTED`; nothing of it is written).

    Why one process: separate processes time-slice the GPU (one context at a time), so the small kernels of
    small models leave most of it idle; streams of one context run concurrently.  A run's bits do not depend
    on its neighbours (each has its own model, optimizer, data order, key table and graph; the kernels are
    deterministic), which a GPU test checks against the same runs alone.  A run that raises is recorded as
    status ``"error: …"`` and the others go on."""
    cuda = (kw.get("device") or ("cuda" if torch.cuda.is_available() else "cpu")) == "cuda"
    pending, live, recs = list(enumerate(specs)), [], [None] * len(specs)
    deadline = time.perf_counter() + kw.pop("max_seconds", math.inf)

    def _stop(i, run, err=None):
        rec = run.finish() if err is None else {"run": run_id(specs[i]["arm"], specs[i]["seed"], specs[i]["size"],
                                                               specs[i]["tokens"]), "status": f"error: {err}"}
        recs[i] = rec
        if on_done is not None:
            on_done(specs[i], rec)

    while pending or live:
        while pending and len(live) < parallel:
            i, s = pending.pop(0)
            left = deadline - time.perf_counter()
            if status := too_late(left):
                recs[i] = {"run": run_id(s["arm"], s["seed"], s["size"], s["tokens"]), "status": status}
                if on_done is not None:
                    on_done(s, recs[i])
                continue
            stream = torch.cuda.Stream() if cuda else None
            with torch.cuda.stream(stream) if cuda else contextlib.nullcontext():
                try:
                    run = Run(**s, **kw, max_seconds=left)
                except Exception as e:  # noqa: BLE001 (recorded; the other runs go on)
                    recs[i] = {"run": run_id(s["arm"], s["seed"], s["size"], s["tokens"]),
                               "status": f"error: {type(e).__name__}: {e}"}
                    if on_done is not None:
                        on_done(s, recs[i])
                    continue
            run.side_by_side = parallel
            live.append((i, run, stream))
        for item in list(live):
            i, run, stream = item
            with torch.cuda.stream(stream) if cuda else contextlib.nullcontext():
                try:
                    going = run.advance()
                    if not going:
                        if cuda:
                            stream.synchronize()
                        _stop(i, run)
                except Exception as e:  # noqa: BLE001
                    going = False
                    _stop(i, run, f"{type(e).__name__}: {e}")
            if not going:
                live.remove(item)
    return recs


def profile_run(arm: str, size: str, tokens: float, lr: float, out: Path, report_path: Path, *, batch: int = 32,
                holdout: tuple[str, ...] | None = None, steps: int = 3, corpus=None, device: str | None = None,
                val_tokens: int = VAL_TOKENS) -> str:
    """Profile ``steps`` eager steps of BF16 and of ``arm`` (after three warm-up steps each, the run's own
    schedule and data), and one more step of ``arm`` for implicit synchronisations; the tables of
    :func:`studies.bench.profiling.report` to ``report_path``.  The runs go to a scratch folder under ``out``, removed
    after; every step is a log point (the loss is read back each step, as at the run's own log points)."""
    import shutil
    import tempfile

    from studies.bench import profiling

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    corpus = corpus or (python_sources(holdout=holdout) if holdout else python_sources())
    Path(out).mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="profile-", dir=out))
    kw = dict(batch=batch, corpus=corpus, device=device, log_every=1, stop_at=3 + steps, val_tokens=val_tokens,
              checkpoint=False)  # ~130 MB per arm at s10m that nothing resumes
    try:
        arms, watch = {}, None
        for label in ("bf16", arm):
            prof = profiling.profiler(device)
            rec = train(label, 0, size, tokens, lr, scratch / label, prof=prof, **kw)
            n = rec["profiled_steps"]
            arms[label] = profiling.arm_entry(prof, rec["profiled_s"] / n, n)
        if device == "cuda":
            watch = profiling.SyncWatch()
            train(arm, 0, size, tokens, lr, scratch / "sync", prof=watch, **{**kw, "stop_at": 4})
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    cfg = SIZES[size]
    text = profiling.report(
        f"Profile of one campaign step: BF16 against {ARMS[arm].label} ({size})",
        f"the campaign's model {size} (d {cfg.d}, {cfg.layers} blocks, {batch} × {cfg.ctx} tokens per step); "
        f"{steps} profiled eager steps after 3 warm-up steps", arms, device, watch)
    atomic_write(Path(report_path), text)
    return text


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arm", required=True, choices=sorted(ARMS))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--size", default="s10m", choices=sorted(SIZES))
    ap.add_argument("--tokens", type=float, required=True)
    ap.add_argument("--lr", type=float, required=True)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--max-seconds", type=float, default=math.inf)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--holdout", default=None, help="comma-separated packages held out for validation")
    ap.add_argument("--cuda-graph", action="store_true", help="capture the training step as a CUDA graph")
    ap.add_argument("--profile", type=Path, default=None,
                    help="instead of a run: profile a few steps of BF16 and of --arm, Markdown tables to this file")
    a = ap.parse_args(argv)
    hold = tuple(a.holdout.split(",")) if a.holdout else None
    if a.profile:
        print(profile_run(a.arm, a.size, a.tokens, a.lr, a.out, a.profile, batch=a.batch, holdout=hold))
        return
    rec = train(a.arm, a.seed, a.size, a.tokens, a.lr, a.out, batch=a.batch, max_seconds=a.max_seconds, holdout=hold,
                cuda_graph=a.cuda_graph)
    print(json.dumps({k: rec[k] for k in ("run", "status", "tokens_done", "seconds_this_call")}))


if __name__ == "__main__":
    main()
