"""Training-step speed and memory of fpsim.torch against plain BF16, in one process on one GPU.

A GPT-style decoder (pre-norm, causal attention through ``scaled_dot_product_attention``, GELU MLP, untied
head) under bf16 autocast, AdamW.  Arms, each timed in the same process after warm-up steps:

* ``bf16``: the model as written (``nn.Linear`` under autocast): the baseline;
* ``nvfp4_paper`` / ``gemm=blas``: :func:`fpsim.torch.convert` with the recipe's own BF16 layer policy
  (first 2 and last 8 blocks stay BF16: of 12 blocks that leaves 2 quantized);
* ``nvfp4_paper, every block`` / ``gemm=blas``: ``keep_bf16=LayerPolicy()`` — all block linears quantized;
* the same with :func:`fpsim.torch.monitor` at ``every=100`` (its overhead);
* BF16 and every-block NVFP4 with the step captured as one CUDA graph (:class:`fpsim.torch.GraphKeys`;
  CUDA only): what is left when the host's launch overhead is gone;
* the every-block graph arm with each ``fpsim.torch.fastpath.GEMM`` that is not the default: ``"cublas"``
  (``torch.mm`` with FP32 output, then the alpha epilogue kernel), ``"cublaslt"`` (one cuBLASLt GEMM that reads
  alpha from device memory, in each of its pointer modes) and ``"triton"`` (one Triton GEMM that applies alpha
  to its FP32 accumulator tiles); every other arm runs the library's default;
* ``gemm=fp32`` (the bit-defined accumulator model) on a shorter run;
* with ``--tune`` (CUDA): :mod:`studies.bench.tune_kernels` sweeps the launch shapes of the two busiest copy kernels
  first (the same bits), and one more every-block graph arm runs with the fastest ones; its tables follow.

    python -m studies.bench.training --out reports/bench_training.md            (GPU)
    python -m studies.bench.training --tiny                                     (CPU smoke test)

Step time is the median over the timed steps (CUDA-synchronised); peak memory is
``torch.cuda.max_memory_allocated`` over the arm's steps.
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

import fpsim.torch as ft
from fpsim.io import atomic_write
from fpsim.recipe import LayerPolicy
from fpsim.torch import cublaslt, fastpath
from fpsim.torch import quantize as tquant
from fpsim.torch import rht as trht
from fpsim.torch.launch import direct_enabled
from studies.bench import profiling
from studies.bench.common import write_report


class Block(torch.nn.Module):
    def __init__(self, d: int, heads: int):
        super().__init__()
        self.heads = heads
        self.n1, self.n2 = torch.nn.RMSNorm(d), torch.nn.RMSNorm(d)
        self.qkv = torch.nn.Linear(d, 3 * d, bias=False)
        self.proj = torch.nn.Linear(d, d, bias=False)
        self.fc1 = torch.nn.Linear(d, 4 * d, bias=False)
        self.fc2 = torch.nn.Linear(4 * d, d, bias=False)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.n1(x)).view(b, t, 3, self.heads, d // self.heads).unbind(2)
        a = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.fc2(F.gelu(self.fc1(self.n2(x))))


class GPT(torch.nn.Module):
    def __init__(self, vocab: int, d: int, layers: int, heads: int):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, d)
        self.blocks = torch.nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.norm = torch.nn.RMSNorm(d)
        self.lm_head = torch.nn.Linear(d, vocab, bias=False)

    def forward(self, idx):
        x = self.embed(idx)
        for blk in self.blocks:
            x = blk(x)
        return self.lm_head(self.norm(x))


#: The every-block graph arm that runs with studies.bench.tune_kernels' fastest launch shapes (``--tune``).
TUNED_ARM = "nvfp4_paper, every block, gemm=blas, CUDA graph, tuned launch shapes"
#: The arm whose scaled products run as one Triton GEMM with alpha on the accumulator (fpsim.torch.fastpath.GEMM).
TRITON_GEMM_ARM = "nvfp4_paper, every block, gemm=blas, CUDA graph, fused Triton GEMM (alpha on the accumulator)"
#: The every-block graph arms of the other scaled-product paths: (fastpath.GEMM, cublaslt.POINTER_MODE) per arm.
GEMM_ARMS = {
    "nvfp4_paper, every block, gemm=blas, CUDA graph, GEMM='cublas' (torch.mm, FP32 out, alpha epilogue)":
        ("cublas", None),
    "nvfp4_paper, every block, gemm=blas, CUDA graph, GEMM='cublaslt', alpha a device scalar": ("cublaslt", "scalar"),
    "nvfp4_paper, every block, gemm=blas, CUDA graph, GEMM='cublaslt', alpha a device vector": ("cublaslt", "vector"),
    TRITON_GEMM_ARM: ("triton", None),
}
#: The transposed RHT's layouts (fpsim.torch.rht.RHT_T_WIDE: False = the tile loop, True = wide tiles).
RHT_T_LAYOUTS = {"tiles": False, "wide": True}


def _loss(model, idx, vocab: int, device, cache: bool = True):
    """Next-token cross-entropy of the model under bf16 autocast (``cache=False`` in a captured graph, whose
    replays the autocast weight cache would not survive)."""
    with torch.autocast(device, dtype=torch.bfloat16, cache_enabled=cache):
        logits = model(idx[:, :-1])
    return F.cross_entropy(logits.float().view(-1, vocab), idx[:, 1:].reshape(-1))


def _arm(cfg, device, convert=None, monitor_every=None, steps=10, warmup=3, graph=False, prof=None):
    """(median step seconds, peak GiB, last loss) of one arm; ``prof``, a profiler context, is entered after the
    warm-up steps and left after the timed ones."""
    torch.manual_seed(0)
    model = GPT(cfg["vocab"], cfg["d"], cfg["layers"], cfg["heads"]).to(device)
    if convert is not None:
        convert(model)
    g = torch.Generator(device=device).manual_seed(1)
    idx = torch.randint(0, cfg["vocab"], (cfg["batch"], cfg["seq"] + 1), device=device, generator=g)
    if graph:
        return _graph_arm(cfg, device, model, idx, steps, warmup)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device == "cuda")
    ctx = ft.monitor(model, every=monitor_every) if monitor_every else None
    if ctx is not None:
        ctx.__enter__()
    times = []
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    profiling = False
    try:
        for i in range(warmup + steps):
            if prof is not None and i == warmup:
                prof.__enter__()
                profiling = True
            t0 = time.perf_counter()
            loss = _loss(model, idx, cfg["vocab"], device)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            ft.step(model)
            if device == "cuda":
                torch.cuda.synchronize()
            if i >= warmup:
                times.append(time.perf_counter() - t0)
    finally:
        if profiling:
            prof.__exit__(None, None, None)
        if ctx is not None:
            ctx.__exit__(None, None, None)
    peak = torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else float("nan")
    return statistics.median(times), peak, float(loss.detach())


def _graph_arm(cfg, device, model, idx, steps, warmup):
    """The step captured once as a CUDA graph (:class:`fpsim.torch.GraphStep`: capturable AdamW with a tensor
    learning rate), timed per replay after ``warmup`` eager steps and the capturing one."""
    opt = torch.optim.AdamW(model.parameters(), lr=torch.tensor(1e-4, device=device), fused=True, capturable=True)

    def body():
        loss = _loss(model, idx, cfg["vocab"], device, cache=False)
        loss.backward()
        opt.step()
        return loss

    torch.cuda.reset_peak_memory_stats()
    step = ft.GraphStep(body, model, opt, warmup=warmup, fallback=False)
    times = []
    for i in range(warmup + 1 + steps):
        t0 = time.perf_counter()
        loss = step()
        ft.step(model)
        torch.cuda.synchronize()
        if i > warmup:
            times.append(time.perf_counter() - t0)
    peak = torch.cuda.max_memory_allocated() / 2**30
    return statistics.median(times), peak, float(loss)


def _profile(cfg, device, out: str | None, steps: int = 3) -> None:
    """Where the emulated step's time goes: the BF16 arm against the every-block NVFP4 arm (eager steps, so each
    launch is one profiled kernel), as :func:`studies.bench.profiling.report` tables, to ``out`` (or printed)."""
    every = lambda m: ft.convert(m, "nvfp4_paper", keep_bf16=LayerPolicy(), gemm="blas")  # noqa: E731
    arms = {}
    for label, conv in (("bf16", None), ("nvfp4", every)):
        prof = profiling.profiler(device)
        t, _, _ = _arm(cfg, device, conv, steps=steps, warmup=3, prof=prof)
        arms[label] = profiling.arm_entry(prof, t, steps)
    watch = None
    if device == "cuda":  # which lines make the host wait for the GPU inside one eager NVFP4 step
        watch = profiling.SyncWatch()
        _arm(cfg, device, every, steps=1, warmup=2, prof=watch)
    text = profiling.report(
        "Profile of one training step: BF16 against every-block NVFP4 (fpsim.torch, gemm=blas)",
        f"the benchmark's GPT ({cfg['layers']} blocks, d_model {cfg['d']}, {cfg['batch']} × {cfg['seq']} tokens); "
        f"{steps} profiled eager steps after 3 warm-up steps", arms, device, watch)
    if out:
        atomic_write(Path(out), text)
    print(text)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", action="store_true", help="a CPU-sized model (smoke test)")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--out", default=None)
    ap.add_argument("--profile", action="store_true", help="torch.profiler table of two steps of the every-block arm")
    ap.add_argument("--tune", action="store_true",
                    help="sweep the copy kernels' launch shapes first (studies.bench.tune_kernels) and add a graph arm "
                         "with the fastest (CUDA)")
    ap.add_argument("--skip-fp32", action="store_true", help="leave out the (slow) bit-defined gemm=fp32 arm")
    ap.add_argument("--graph-only", action="store_true",
                    help="only the CUDA-graph arms (GPU-bound; ratios against the BF16 graph arm): the eager arms "
                         "are host-bound and vary with the machine's host")
    ap.add_argument("--mm-tiles", default=None, metavar="BM,BN,BK,GROUP_M,WARPS,STAGES",
                    help="the fused Triton GEMM arm's tiling (fastpath.MMTiles; default fastpath.MM_TILES), e.g. "
                         "the fastest of studies.bench.scaled_mm --best")
    ap.add_argument("--wgrad", default=None, metavar="PATH[,PATH…]",
                    help="fastpath.WGRAD paths of the every-block graph arm (one arm each; the first is every other "
                         f"arm's): {', '.join(fastpath.WGRAD_PATHS)} (default: the library's)")
    ap.add_argument("--rht-t", default=None, metavar="LAYOUT[,LAYOUT…]",
                    help="layouts of the transposed RHT (fpsim.torch.rht.RHT_T_WIDE) for the every-block graph arm, "
                         f"as --wgrad: {', '.join(RHT_T_LAYOUTS)} (default: the library's)")
    ap.add_argument("--gemm-arms", default=None, metavar="PATH[,PATH…]",
                    help="which other-GEMM arms to run: cublas, cublaslt-scalar, cublaslt-vector, triton (default: "
                         "every one that is not the library's default)")
    a = ap.parse_args(argv)
    wgrad = (a.wgrad or fastpath.WGRAD).split(",")
    if not wgrad or any(w not in fastpath.WGRAD_PATHS for w in wgrad):
        ap.error(f"--wgrad: choose from {', '.join(fastpath.WGRAD_PATHS)}")
    default_layout = next(k for k, v in RHT_T_LAYOUTS.items() if v == trht.RHT_T_WIDE)
    layouts = (a.rht_t or default_layout).split(",")
    if any(v not in RHT_T_LAYOUTS for v in layouts):
        ap.error(f"--rht-t: choose from {', '.join(RHT_T_LAYOUTS)}")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    cfg = (dict(vocab=256, d=64, layers=12, heads=4, seq=64, batch=2) if a.tiny
           else dict(vocab=32768, d=1024, layers=12, heads=16, seq=1024, batch=8))
    if a.profile:
        _profile(cfg, device, a.out)
        return
    arms = [
        ("bf16 (nn.Linear, autocast)", None, None, a.steps),
        ("nvfp4_paper, recipe layer policy, gemm=blas",
         lambda m: ft.convert(m, "nvfp4_paper", gemm="blas"), None, a.steps),
        ("nvfp4_paper, every block, gemm=blas",
         lambda m: ft.convert(m, "nvfp4_paper", keep_bf16=LayerPolicy(), gemm="blas"), None, a.steps),
        ("nvfp4_paper, every block, gemm=blas, monitor every=100",
         lambda m: ft.convert(m, "nvfp4_paper", keep_bf16=LayerPolicy(), gemm="blas"), 100, a.steps),
        ("bf16 (nn.Linear, autocast), CUDA graph", None, "graph", a.steps),
        ("nvfp4_paper, every block, gemm=blas, CUDA graph",
         lambda m: ft.convert(m, "nvfp4_paper", keep_bf16=LayerPolicy(), gemm="blas"), "graph", a.steps),
        *[(f"nvfp4_paper, every block, gemm=blas, CUDA graph, WGRAD={w!r}",
           lambda m: ft.convert(m, "nvfp4_paper", keep_bf16=LayerPolicy(), gemm="blas"), "graph", a.steps)
          for w in wgrad[1:]],
        *[(f"nvfp4_paper, every block, gemm=blas, CUDA graph, RHT_T={v!r}",
           lambda m: ft.convert(m, "nvfp4_paper", keep_bf16=LayerPolicy(), gemm="blas"), "graph", a.steps)
          for v in layouts[1:]],
        *([(TUNED_ARM, lambda m: ft.convert(m, "nvfp4_paper", keep_bf16=LayerPolicy(), gemm="blas"), "graph",
             a.steps)] if a.tune and device == "cuda" else []),
        *[(name, lambda m: ft.convert(m, "nvfp4_paper", keep_bf16=LayerPolicy(), gemm="blas"), "graph", a.steps)
          for name, (path, mode) in GEMM_ARMS.items()
          if (path, mode) != (fastpath.GEMM, cublaslt.POINTER_MODE if path == "cublaslt" else None)
          and (a.gemm_arms is None or "-".join(filter(None, (path, mode))) in a.gemm_arms.split(","))],
        ("nvfp4_paper, every block, gemm=fp32",
         lambda m: ft.convert(m, "nvfp4_paper", keep_bf16=LayerPolicy(), gemm="fp32"), None, 1),
    ]
    if a.skip_fp32:
        arms = [arm for arm in arms if "fp32" not in arm[0]]
    if device != "cuda":
        arms = [arm for arm in arms if arm[2] != "graph"]
    elif a.graph_only:
        arms = [arm for arm in arms if arm[2] == "graph"]
    tuned = None
    if a.tune and device == "cuda":
        from studies.bench import tune_kernels

        tuned = tune_kernels.tune()
        print("\n".join(tune_kernels.report(tuned)), flush=True)
    shapes = trht.RHT_T_TILES, tquant.TWO_LEVEL_TILES
    tiles = fastpath.MMTiles(*map(int, a.mm_tiles.split(","))) if a.mm_tiles else fastpath.MM_TILES
    default_tiles = fastpath.MM_TILES
    defaults = fastpath.GEMM, fastpath.MM_TILES, fastpath.WGRAD, trht.RHT_T_WIDE, cublaslt.POINTER_MODE
    rows = []
    base = None
    for name, conv, mon, steps in arms:
        graph = mon == "graph"
        fastpath.GEMM, mode = GEMM_ARMS.get(name, (defaults[0], defaults[4]))
        cublaslt.POINTER_MODE = mode or defaults[4]
        fastpath.MM_TILES = tiles if name == TRITON_GEMM_ARM else default_tiles
        fastpath.WGRAD = next((w for w in wgrad[1:] if name.endswith(f"WGRAD={w!r}")), wgrad[0])
        trht.RHT_T_WIDE = RHT_T_LAYOUTS[next((v for v in layouts[1:] if name.endswith(f"RHT_T={v!r}")), layouts[0])]
        trht.RHT_T_TILES, tquant.TWO_LEVEL_TILES = shapes
        if name == TUNED_ARM:
            tune_kernels.apply(tuned)
        t, peak, loss = _arm(cfg, device, conv, None if graph else mon, steps=steps,
                             warmup=1 if "fp32" in name else 3, graph=graph)
        base = base or (t, peak)
        rows.append((name, t, t / base[0], peak, peak / base[1] if device == "cuda" else None, loss,
                     steps + (1 if "fp32" in name else 4 if graph else 3)))
        mem = f", peak {peak:.2f} GiB" if device == "cuda" else ""
        print(f"{name}: {t * 1e3:.1f} ms/step ({t / base[0]:.2f}x){mem}, loss {loss:.3f}", flush=True)
    fastpath.GEMM, fastpath.MM_TILES, fastpath.WGRAD, trht.RHT_T_WIDE, cublaslt.POINTER_MODE = defaults
    trht.RHT_T_TILES, tquant.TWO_LEVEL_TILES = shapes
    gpu = torch.cuda.get_device_name(0) if device == "cuda" else "CPU"
    tok = cfg["batch"] * cfg["seq"]
    direct = "on" if direct_enabled() else "off (the JIT dispatched every launch)"
    lines = [
        "# Training-step benchmark (fpsim.torch)",
        "",
        f"{datetime.date.today().isoformat()}, {gpu}, torch {torch.__version__}; model: GPT, {cfg['layers']} blocks, "
        f"d_model {cfg['d']}, {cfg['heads']} heads, seq {cfg['seq']}, batch {cfg['batch']} ({tok} tokens/step), "
        f"vocab {cfg['vocab']}, bf16 autocast, AdamW. `python -m studies.bench.training` (median step of the timed "
        "steps after warm-up; ratios against the first BF16 arm of the same run). Direct Triton launches "
        f"(`fpsim.torch.launch`) at the end of the run: {direct}. The fused Triton GEMM arm's tiling "
        f"(BM, BN, BK, GROUP_M, warps, stages): {tuple(tiles)}. Wgrad's RHT'd copies (`fastpath.WGRAD`): "
        f"{wgrad[0]!r}, the transposed RHT's layout (`fpsim.torch.rht.RHT_T_WIDE`): {layouts[0]!r}, scaled products "
        f"(`fastpath.GEMM`): {defaults[0]!r}"
        + (f" (cuBLASLt pointer mode {defaults[4]!r})" if defaults[0] == "cublaslt" else "")
        + ", except where an arm names another.",
        "",
        "| arm | ms / step | × BF16 | tokens/s | peak GiB | × BF16 | steps run | loss after them |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, t, r, peak, pr, loss, n in rows:
        mem = (f"{peak:.2f} | {pr:.2f}" if device == "cuda" else "— | —")
        lines.append(f"| {name} | {t * 1e3:.1f} | {r:.2f} | {tok / t:,.0f} | {mem} | {n} | {loss:.3f} |")
    if device != "cuda":
        lines += ["", "Peak memory is CUDA's allocator peak (`torch.cuda.max_memory_allocated`): no GPU here, so "
                      "those columns are empty."]
    if tuned is not None:
        lines += ["", f"The tuned arm's launch shapes: `RHT_T_TILES = {tuned['best_rht_t']!r}`, `TWO_LEVEL_TILES = "
                      f"{tuned['best_two_level']!r}`; the sweep (`studies.bench.tune_kernels`) before the arms:",
                  *tune_kernels.report(tuned)]
    write_report("\n".join(lines) + "\n", Path(a.out) if a.out else None)


if __name__ == "__main__":
    main()
