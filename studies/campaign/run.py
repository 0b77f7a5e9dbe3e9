"""One campaign run: (arm, seed, size, token budget) → a CSV of the curve and a JSON of the run (issue 20).

    python -m studies.campaign.run --arm nvfp4 --seed 0 --size s10m --tokens 265e6 --lr 3e-3 --out DIR \\
        [--max-seconds 540] [--batch 32]

Protocol: AdamW (β = 0.9, 0.95; weight decay 0.1 on matrices), linear warmup over the first 2 % of steps then
cosine decay to 10 % of the peak learning rate, gradient clipping at 1.0, bf16 autocast.  The seed fixes the
initial weights (``torch.manual_seed`` before the model is built) and the data order (a permutation per epoch of
the corpus's non-overlapping ``ctx + 1``-byte windows, from ``numpy.random.default_rng([seed, epoch])``), so two
arms with one seed see the same batches.  Validation: the first ``val_tokens`` bytes of the held-out packages in
fixed windows, evaluated at 20 evenly spaced token counts and at the end (mean nats per byte).

A run that reaches ``--max-seconds`` writes a checkpoint (safetensors of the weights and the optimizer state, and
a JSON of the step; no pickle) and exits with status ``"partial"``; the same command resumes it.
"""

from __future__ import annotations

import argparse
import json
import math
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

__all__ = ["run_id", "batches", "lr_at", "train", "profile_run", "main"]

CSV_COLUMNS = ("step", "tokens", "lr", "train_loss", "val_loss", "tokens_per_s")
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


def train(arm: str, seed: int, size: str, tokens: float, lr: float, out: Path, *, batch: int = 32,
          max_seconds: float = math.inf, val_tokens: int = 1 << 20, corpus=None, device: str | None = None,
          log_every: int = 50, holdout: tuple[str, ...] | None = None, cuda_graph: bool = False,
          stop_at: int | None = None, prof=None, checkpoint: bool = True) -> dict:
    """Train (or resume) one run; returns its JSON record (also written next to its CSV).

    ``cuda_graph`` (CUDA only): after three eager warm-up steps (again after a recipe switch) the training step
    is captured as one CUDA graph and replayed, with stochastic rounding's keys from a
    :class:`fpsim.torch.GraphKeys` table; the optimizer is then the same fused AdamW with its learning rate in a
    device tensor (``capturable=True``), which gives the eager run's bits (a GPU test checks it).

    ``stop_at``: checkpoint and stop (status ``"partial"``) at the first log point at or past this step, as
    ``max_seconds`` does by time (tests and throughput probes); ``checkpoint=False`` stops without writing the
    checkpoint (profiles, which resume nothing).  ``prof``: a context (a ``torch.profiler``
    profile, :class:`studies.profiling.SyncWatch`) entered three steps after the start and left when the run
    stops; the record then holds ``profiled_s`` and ``profiled_steps``."""
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    graph_mode = bool(cuda_graph) and device == "cuda"
    fastpath.GEMM = GEMM_PATH
    if device == "cuda":
        torch.backends.cudnn.deterministic = CUDNN_DETERMINISTIC
    cfg, a = SIZES[size], ARMS[arm]
    rid = run_id(arm, seed, size, tokens)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    corpus = corpus or (python_sources(holdout=holdout) if holdout else python_sources())
    ctx = cfg.ctx
    steps = max(1, int(tokens) // (batch * ctx))
    nval = val_tokens // ctx
    if (corpus.val.size - 1) // ctx < nval:
        raise ValueError(f"the held-out packages {', '.join(corpus.holdout)} hold {corpus.val.size:,} bytes, fewer "
                         f"than the {val_tokens:,} validation tokens; hold out other packages (--holdout)")
    val = torch.from_numpy(corpus.val[: nval * ctx + 1][np.arange(nval)[:, None] * ctx
                                                          + np.arange(ctx + 1)[None, :]].astype(np.int64))
    torch.manual_seed(seed)
    model = Llama(cfg)
    n_params = non_embedding_params(model)
    model = apply_arm(model.to(device), a, seed, cfg.layers)
    opt = _optimizer(model, lr, device, graph_mode)
    ckpt = out / "ckpt" / rid
    start = _load(ckpt, model, opt, device)
    ft.set_step(model, start)
    csv_path = out / f"{rid}.csv"
    rows = csv_path.read_text().splitlines()[1:] if start and csv_path.exists() else []
    eval_steps = {round(steps * (k + 1) / EVALS) - 1 for k in range(EVALS)}
    t_start = time.perf_counter()
    status, loss_acc, n_acc, t_log, tok_log, switched = "done", None, 0, time.perf_counter(), 0, False
    xs = torch.zeros((batch, ctx + 1), dtype=torch.int64, device=device)  # the step's input (static for graphs)

    def body():
        with torch.autocast(device, dtype=torch.bfloat16, enabled=device == "cuda", cache_enabled=not graph_mode):
            logits = model(xs[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, cfg.vocab), xs[:, 1:].reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return loss

    stepper = ft.GraphStep(body, model, opt) if graph_mode else None
    prof_at, prof_t0, prof_n = start + 3, None, 0
    for step, xb in batches(corpus.train, ctx, batch, seed, start):
        if step >= steps:
            break
        if prof is not None and step == prof_at:
            if device == "cuda":
                torch.cuda.synchronize()
            prof.__enter__()
            prof_t0 = time.perf_counter()
        prof_n += prof_t0 is not None
        if a.switch_at is not None and not switched and step >= math.ceil(a.switch_at * steps):
            ft.set_recipe(model, "bf16")  # also when a resumed run starts past the switch
            switched = True
            if stepper is not None:
                stepper.recapture()
        for g in opt.param_groups:
            if graph_mode:
                g["lr"].fill_(lr_at(step, steps, lr))
            else:
                g["lr"] = lr_at(step, steps, lr)
        xb = torch.from_numpy(xb)
        # from pinned memory the copy is queued without waiting for the GPU (a pageable copy syncs the stream first)
        xs.copy_(xb.pin_memory() if xs.is_cuda else xb, non_blocking=xs.is_cuda)
        if stepper is not None:
            loss = stepper()
        else:
            loss = body()
            opt.zero_grad(set_to_none=True)
        ft.step(model)
        loss_acc = loss.detach() if loss_acc is None else loss_acc + loss.detach()
        n_acc += 1
        tok_log += xs[:, 1:].numel()
        if (step + 1) % log_every == 0 or step in eval_steps:
            tl = float(loss_acc) / n_acc
            now = time.perf_counter()
            vl = _val_loss(model, val, ctx, device) if step in eval_steps else None
            rows.append(",".join(str(v) for v in (step + 1, (step + 1) * batch * ctx, f"{lr_at(step, steps, lr):.6g}",
                                                  f"{tl:.6f}", "" if vl is None else f"{vl:.6f}",
                                                  f"{tok_log / (now - t_log):.1f}")))
            loss_acc, n_acc, t_log, tok_log = None, 0, time.perf_counter(), 0
            if not math.isfinite(tl):
                status = "diverged"
                break
            out_of_time = time.perf_counter() - t_start > max_seconds
            if (out_of_time or (stop_at is not None and step + 1 >= stop_at)) and step + 1 < steps:
                if checkpoint:
                    _save(ckpt, model, opt, step + 1)
                status = "partial"
                break
    prof_s = None
    if prof_t0 is not None:
        if device == "cuda":
            torch.cuda.synchronize()
        prof_s = time.perf_counter() - prof_t0
        prof.__exit__(None, None, None)
    atomic_write(csv_path, "\n".join((",".join(CSV_COLUMNS), *rows)) + "\n")
    done_tokens = int(rows[-1].split(",")[1]) if rows else 0
    rec = {"run": rid, "arm": arm, "recipe": a.build().name, "seed": seed, "size": size, "config": vars(cfg),
           "non_embedding_params": n_params, "tokens_budget": int(tokens), "tokens_done": done_tokens,
           "steps": steps, "batch": batch, "lr": lr, "gemm_path": GEMM_PATH,
           "cudnn_deterministic": CUDNN_DETERMINISTIC if device == "cuda" else None,
           "cuda_graph": stepper is not None and stepper.failed is None,
           "cuda_graph_failure": None if stepper is None else stepper.failed, "status": status,
           "device": torch.cuda.get_device_name(0)
           if device == "cuda" else "cpu", "seconds_this_call": round(time.perf_counter() - t_start, 1),
           "corpus": corpus.manifest(), "layers": [list(r) for r in ft.summary(model)]}
    if prof_s is not None:
        rec.update(profiled_s=round(prof_s, 4), profiled_steps=prof_n)
    prev = out / f"{rid}.json"
    if prev.exists():
        rec["seconds_total"] = round(json.loads(prev.read_text()).get("seconds_total", 0) + rec["seconds_this_call"], 1)
    else:
        rec["seconds_total"] = rec["seconds_this_call"]
    atomic_write(prev, dumps(rec))
    return rec


def profile_run(arm: str, size: str, tokens: float, lr: float, out: Path, report_path: Path, *, batch: int = 32,
                holdout: tuple[str, ...] | None = None, steps: int = 3, corpus=None, device: str | None = None,
                val_tokens: int = 1 << 20) -> str:
    """Profile ``steps`` eager steps of BF16 and of ``arm`` (after three warm-up steps each, the run's own
    schedule and data), and one more step of ``arm`` for implicit synchronisations; the tables of
    :func:`studies.profiling.report` to ``report_path``.  The runs go to a scratch folder under ``out``, removed
    after; every step is a log point (the loss is read back each step, as at the run's own log points)."""
    import shutil
    import tempfile

    from studies import profiling

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
