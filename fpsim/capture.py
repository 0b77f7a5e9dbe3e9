"""Record what every ``torch.nn.Linear`` of a model sees in one step, for ``fpsim analyze`` (torch extra).

    from fpsim.capture import capture

    with capture(model, "step1000.safetensors", step=1000):
        loss = loss_fn(model(x), y)
        loss.backward()

    # then:  fpsim analyze step1000.safetensors --formats nvfp4,mxfp8_e4m3 --rht 16

Inside the ``with`` block run one forward and one backward.  For each matching
``nn.Linear`` (subclasses included) the file gets, in module order:

* ``<module>.weight``       — the weight as used by the first call, ``float32``
  (out × in), exact for FP32/BF16/FP16 parameters;
* ``<module>.input``        — the layer input flattened to tokens × in;
* ``<module>.grad_output``  — the gradient of the loss w.r.t. the layer output,
  tokens × out (what the backward GEMMs of the recipe quantize).

Activations and gradients are stored in ``dtype``: ``"bfloat16"`` by default
(what a real BF16 run feeds the quantizer; the cast is round-to-nearest-even),
or ``"float32"`` to keep an FP32 run's values exactly.  ``fpsim analyze``
guesses the roles from these names (weight / activation / gradient).

**Several calls of one module** (weight sharing, a layer applied twice,
gradient accumulation inside the block) are all recorded: the first call is
``<module>.input`` / ``<module>.grad_output``, call *k* ≥ 1 is
``<module>.input#k`` / ``<module>.grad_output#k``; each gradient is matched to
its own call (the weight is recorded once, from the first call).

The gradient is taken by a hook on each call's output tensor, registered in the
forward hook — rather than ``register_full_backward_hook`` — so that every
gradient belongs to a known call and in-place ops after the layer (e.g.
``ReLU(inplace=True)``) are fine: the hook receives the gradient of the layer's
own output.  (A full backward hook makes such models fail: "Output 0 of
BackwardHookFunction is a view and is being modified inplace".)  When the
output is a view — inputs of rank > 2 — the hook hands the model an equal
non-view copy (``clone()``), since an in-place op on a view would drop the hook;
values and gradients are unchanged, at the cost of one copy per call.

A call whose output needs no gradient (``torch.no_grad()``, frozen inputs and
weight) or whose backward never ran gets no ``grad_output``; a
``RuntimeWarning`` names them.  If a backward runs twice through the same
graph, the first gradient is kept.  Modules never *called* (e.g. the
``out_proj`` of ``nn.MultiheadAttention``, whose weight is used functionally)
do not appear.

The file is written atomically (:func:`fpsim.io.atomic_write`: never a
partial file, never an input or a device replaced) on a clean exit only: an
exception inside the block writes nothing.  A path that cannot be written (no
such directory, a directory, read-only) raises :class:`fpsim.io.OutputError`
when the capture is created, before the model runs.  All hooks are removed on exit in every case.  Nothing is
pickled; tensors are copied to host memory as they are seen (use
``max_tokens`` to keep only the first N token rows of each input/gradient, and
``modules`` — a glob or list of globs on module names — to select layers).
Metadata (strings): ``format=fpsim-capture``, ``model`` (class name),
``torch`` (version), ``dtype``, ``weight_dtype``, ``step`` (when given),
``max_tokens`` (when given).

``python -m fpsim.capture --demo OUT.safetensors`` trains a tiny byte-level
MLP language model on Python's standard-library sources for a few steps and
captures one more step (deterministic on one machine; needs torch).

torch is imported only when a capture is made: ``import fpsim`` never imports it.
"""

from __future__ import annotations

import fnmatch
import warnings
from collections.abc import Iterable
from pathlib import Path

import numpy as np

__all__ = ["capture", "Capture", "DTYPES"]

#: dtypes that activations and gradients can be stored in.
DTYPES = ("bfloat16", "float32")


def _host(t, dtype: str, rows: int | None, width: int) -> np.ndarray:
    """A detached host *copy* of ``t`` as (tokens × width) numpy, first ``rows`` rows only."""
    import torch

    t = t.detach().reshape(-1, width)
    if rows is not None:
        t = t[:rows]
    if dtype == "float32":
        return t.to(device="cpu", dtype=torch.float32, copy=True).numpy()
    import ml_dtypes

    bits = t.to(device="cpu", dtype=torch.bfloat16, copy=True).contiguous().view(torch.int16)
    return bits.numpy().view(ml_dtypes.bfloat16)


class _Call:
    __slots__ = ("input", "grad")

    def __init__(self, inp: np.ndarray):
        self.input = inp
        self.grad: np.ndarray | None = None


class Capture:
    """The context manager returned by :func:`capture`; ``names()`` lists what is recorded so far."""

    def __init__(self, model, path, *, dtype: str = "bfloat16", modules: str | Iterable[str] | None = None,
                 max_tokens: int | None = None, step: int | None = None):
        if dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, not {dtype!r}")
        # a bool is an int to isinstance, and True would mean one token
        if max_tokens is not None and (type(max_tokens) is not int or max_tokens < 1):
            raise ValueError(f"max_tokens must be a positive int or None, not {max_tokens!r}")
        self.path = Path(path)
        if self.path.suffix.lower() != ".safetensors":
            raise ValueError(f"{path}: the capture file must end in .safetensors (fpsim analyze reads it by suffix)")
        from .io import check_writable

        check_writable(self.path)  # a bad path fails here, before the model runs, not after the step
        self.model = model
        self.dtype = dtype
        self.globs = [modules] if isinstance(modules, str) else (None if modules is None else list(modules))
        self.max_tokens = max_tokens
        self.step = step
        self._weights: dict[str, np.ndarray] = {}
        self._calls: dict[str, list[_Call]] = {}
        self._handles: list = []
        self._active = False

    # -- hooks ----------------------------------------------------------------
    def _forward_hook(self, name: str):
        def hook(module, args, kwargs, output):
            if not self._active:
                return None
            x = args[0] if args else kwargs.get("input")
            if x is None:
                return None
            calls = self._calls.setdefault(name, [])
            if name not in self._weights:
                self._weights[name] = _host(module.weight, "float32", None, module.in_features)
            call = _Call(_host(x, self.dtype, self.max_tokens, module.in_features))
            calls.append(call)
            import torch

            if isinstance(output, torch.Tensor) and output.requires_grad:
                width = module.out_features

                def grad_hook(g, call=call):
                    if self._active and call.grad is None:
                        call.grad = _host(g, self.dtype, self.max_tokens, width)

                if output._base is not None:
                    # A view (inputs of rank > 2): an in-place op on it would rebase its history and drop the
                    # hook, so hand the model an equal non-view copy instead (same values, same gradient).
                    output = output.clone()
                self._handles.append(output.register_hook(grad_hook))
                return output
            return None

        return hook

    # -- context manager ------------------------------------------------------
    def __enter__(self) -> Capture:
        import torch

        chosen = []
        for name, mod in self.model.named_modules():
            if not isinstance(mod, torch.nn.Linear):
                continue
            name = name or "linear"
            if self.globs is None or any(fnmatch.fnmatchcase(name, g) for g in self.globs):
                chosen.append((name, mod))
        if not chosen:
            what = "no nn.Linear modules" if self.globs is None else f"no nn.Linear module matches {self.globs}"
            raise ValueError(f"capture: {type(self.model).__name__} has {what}")
        self._order = [n for n, _ in chosen]
        self._active = True
        try:
            for name, mod in chosen:
                self._handles.append(mod.register_forward_hook(self._forward_hook(name), with_kwargs=True))
        except BaseException:
            self._remove()
            raise
        return self

    def _remove(self) -> None:
        self._active = False
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def __exit__(self, exc_type, exc, tb) -> bool:
        self._remove()
        if exc_type is None:
            self._write()
        return False

    # -- output ---------------------------------------------------------------
    def tensors(self) -> dict[str, np.ndarray]:
        """The recorded arrays by file name, in module order (weight, then input / grad_output per call)."""
        out: dict[str, np.ndarray] = {}
        for name in self._order:
            if name not in self._weights:
                continue
            out[f"{name}.weight"] = self._weights[name]
            for k, call in enumerate(self._calls.get(name, [])):
                sfx = f"#{k}" if k else ""
                out[f"{name}.input{sfx}"] = call.input
                if call.grad is not None:
                    out[f"{name}.grad_output{sfx}"] = call.grad
        return out

    def names(self) -> list[str]:
        return list(self.tensors())

    def _write(self) -> None:
        import torch

        from .io import write_safetensors

        tensors = self.tensors()
        if not tensors:
            raise RuntimeError(f"capture: no selected nn.Linear ran inside the block; {self.path} not written")
        missing = [f"{n}.grad_output" + (f"#{k}" if k else "")
                   for n in self._order for k, c in enumerate(self._calls.get(n, [])) if c.grad is None]
        if missing:
            shown = ", ".join(missing[:5]) + (f" (+{len(missing) - 5} more)" if len(missing) > 5 else "")
            warnings.warn(f"capture: no gradient recorded for {shown} (did the block run backward()?)",
                          RuntimeWarning, stacklevel=3)
        meta = {"format": "fpsim-capture", "model": type(self.model).__name__, "torch": torch.__version__,
                "dtype": self.dtype, "weight_dtype": "float32"}
        if self.step is not None:
            meta["step"] = self.step
        if self.max_tokens is not None:
            meta["max_tokens"] = self.max_tokens
        write_safetensors(self.path, tensors, meta)


def capture(model, path, *, dtype: str = "bfloat16", modules: str | Iterable[str] | None = None,
            max_tokens: int | None = None, step: int | None = None) -> Capture:
    """Context manager recording every matching ``nn.Linear``'s weight, input and output gradient to ``path``.

    See the module docstring for names, dtypes, repeated calls and failure behaviour.
    """
    return Capture(model, path, dtype=dtype, modules=modules, max_tokens=max_tokens, step=step)


# -- demo: a tiny byte-level LM on the stdlib's sources ---------------------------------------------------------
def demo(out, steps: int = 50, batch: int = 64, seed: int = 0) -> Path:
    """Train a tiny MLP LM (8-byte context) on Python's stdlib ``.py`` files ``steps`` steps; capture one more."""
    import sysconfig

    import torch

    root = Path(sysconfig.get_paths()["stdlib"])
    text = b"".join(p.read_bytes() for p in sorted(root.glob("*.py"))[:40])[:1_000_000]
    data = torch.tensor(np.frombuffer(text, dtype=np.uint8).astype(np.int64))
    torch.manual_seed(seed)
    ctx = 8

    class TinyLM(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(256, 32)
            self.fc1, self.fc2, self.head = (torch.nn.Linear(ctx * 32, 256), torch.nn.Linear(256, 256),
                                             torch.nn.Linear(256, 256))

        def forward(self, x):
            h = torch.nn.functional.gelu(self.fc1(self.emb(x).flatten(1)))
            return self.head(torch.nn.functional.gelu(self.fc2(h)))

    model = TinyLM()
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    gen = torch.Generator().manual_seed(seed)

    def step_loss():
        i = torch.randint(0, len(data) - ctx - 1, (batch,), generator=gen)
        x = torch.stack([data[j:j + ctx] for j in i.tolist()])
        return torch.nn.functional.cross_entropy(model(x), data[i + ctx])

    for _ in range(steps):
        opt.zero_grad()
        step_loss().backward()
        opt.step()
    opt.zero_grad()
    with capture(model, out, step=steps):
        step_loss().backward()
    return Path(out)


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m fpsim.capture", description="Capture demo (needs torch).")
    ap.add_argument("--demo", metavar="OUT", required=True, help="write a capture of a tiny LM to OUT.safetensors")
    ap.add_argument("--steps", type=int, default=50, help="training steps before the captured one")
    args = ap.parse_args(argv)
    try:
        import torch  # noqa: F401
    except ImportError:
        ap.error("torch is not installed (pip install 'fpsim[torch]')")
    print(demo(args.demo, steps=args.steps))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
