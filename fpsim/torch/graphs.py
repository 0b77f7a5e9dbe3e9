"""CUDA-graph capture of training steps with :class:`fpsim.torch.Linear` layers (opt-in).

A step of an emulated recipe issues a dozen kernel launches per layer; captured once as a CUDA graph
(``torch.cuda.graph``) and replayed, it costs one launch of host time.  A graph freezes every kernel argument,
but stochastic rounding's Philox key depends on the step (``derive_seed(seed, "sr", layer, step, role)``, as
:func:`fpsim.linear` derives it), so while a :class:`GraphKeys` is active the fused kernels read each copy's key
from a device table instead of a scalar argument, and :meth:`GraphKeys.sync` rewrites the table for the layers'
current steps before each replay.  The bits are the eager fast path's: the same kernels on the same data with
the same keys.

Usage: :class:`GraphStep` does PyTorch's whole-step capture recipe (warm-up steps on a side stream, one
capture, a replay per step, each after :meth:`GraphKeys.sync`); ``body`` runs forward, backward and the
optimizer step on static inputs and returns the loss, and the optimizer is made with ``capturable=True`` and a
tensor learning rate (a float would be frozen into the graph)::

    opt = torch.optim.AdamW(model.parameters(), lr=torch.tensor(1e-3, device="cuda"), capturable=True)
    static_x = torch.zeros(batch_shape, dtype=torch.long, device="cuda")

    def body():
        loss = loss_fn(model(static_x))
        loss.backward()
        opt.step()
        return loss

    step = fpsim.torch.GraphStep(body, model, opt)
    for batch in data:
        static_x.copy_(batch)
        loss = step()                  # eager for the first 3 steps, then the captured graph
        fpsim.torch.step(model)

A learning-rate schedule fills the tensor (``opt.param_groups[i]["lr"].fill_(v)``) before the call; under
``torch.autocast`` pass ``cache_enabled=False`` (the autocast weight cache does not survive a replay).

What a graph cannot hold raises ``ValueError`` at the first (eager) call: copies whose stochastic rounding
does not run in the fused kernels (the float32 fallback), per-call RHT signs (a new sign vector every step),
the reference GEMM path (``gemm="fp32"``) and observers (:func:`fpsim.torch.monitor`), which run Python per step;
``GraphStep(..., eager_when=lambda: mon.due(layer.step))`` runs the steps a monitor records as plain eager steps.
"""

from __future__ import annotations

import logging

import numpy as np

from ..random import seed_key
from ..transforms import derive_seed
from .runtime import torch_module

__all__ = ["GraphKeys", "GraphStep", "active"]

log = logging.getLogger("fpsim.torch")

_ACTIVE: list = []


def active() -> GraphKeys | None:
    """The :class:`GraphKeys` in effect (the innermost ``with``), or None."""
    return _ACTIVE[-1] if _ACTIVE else None


def _words(seed: int, layer: str, step: int, role: str) -> tuple[int, int]:
    """The two key words of one copy's stochastic rounding, as int32 bit patterns (SPEC §3's Philox key)."""
    k0, k1 = seed_key(derive_seed(seed, "sr", layer, step, role))
    return tuple(int(v) for v in np.array([k0, k1], np.uint32).view(np.int32))


class GraphKeys:
    """The device table of stochastic-rounding keys of a model's :class:`fpsim.torch.Linear` layers.

    A slot per (layer, role) is made at the layer's first call under this table (an eager call: a slot first
    asked for during capture is an error, as the graph would hold a key nobody rewrites).  Eager calls write
    their slot's key for the step they run; :meth:`sync` writes every slot's key for its layer's current
    ``step`` in one host-to-device copy (pinned, on the current stream, so it is ordered before the replay that
    follows)."""

    def __init__(self, model, capacity: int = 4096):
        torch = torch_module()
        # fpsim.torch.Linear marks itself (this module sits below nn.py and does not import it)
        self.layers = {m.name: m for m in model.modules() if getattr(m, "FPSIM_LAYER", False)}
        dev = next((p.device for p in model.parameters()), torch.device("cpu"))
        self.table = torch.zeros(2 * int(capacity), dtype=torch.int32, device=dev)
        self.capacity = int(capacity)
        self._slots: dict[tuple[str, str], int] = {}
        self._seed: dict[int, int] = {}
        self._held: dict[int, int] = {}  # slot → the step its words are for

    def __enter__(self) -> GraphKeys:
        _ACTIVE.append(self)
        return self

    def __exit__(self, *exc) -> None:
        _ACTIVE.remove(self)

    def key(self, layer: str, role: str, seed: int, step: int):
        """The device words (int32 × 2) of the key of ``layer``'s ``role`` copy at ``step``."""
        torch = torch_module()
        capturing = self.table.is_cuda and torch.cuda.is_current_stream_capturing()
        i = self._slots.get((layer, role))
        if i is None:
            if capturing:
                raise ValueError(f"layer {layer!r}, copy {role}: first seen during CUDA-graph capture; run one eager "
                                 f"step under the same GraphKeys first (its slot holds the key replays rewrite)")
            if len(self._slots) >= self.capacity:
                raise ValueError(f"GraphKeys holds {self.capacity} copies; make it with a larger capacity")
            i = self._slots[(layer, role)] = len(self._slots)
            self._seed[i] = int(seed)
        if not capturing and self._held.get(i) != step:
            self.table[2 * i: 2 * i + 2].copy_(torch.tensor(_words(seed, layer, step, role), dtype=torch.int32))
            self._held[i] = step
        return self.table[2 * i: 2 * i + 2]

    def sync(self) -> None:
        """Write every slot's key for its layer's current step (call before each replay and each eager step)."""
        torch = torch_module()
        n = len(self._slots)
        if not n:
            return
        words = np.empty(2 * n, np.int32)
        for (layer, role), i in self._slots.items():
            m = self.layers.get(layer)
            if m is None:
                raise ValueError(f"layer {layer!r} is not a fpsim.torch.Linear of the model this GraphKeys was "
                                 f"made for")
            words[2 * i: 2 * i + 2] = _words(self._seed[i], layer, m.step, role)
            self._held[i] = m.step
        host = torch.from_numpy(words)
        if self.table.is_cuda:
            host = host.pin_memory()  # the caching host allocator keeps it until the copy has run
        self.table[: 2 * n].copy_(host, non_blocking=self.table.is_cuda)


class GraphStep:
    """A training step ``body()`` captured as one CUDA graph and replayed, with a :class:`GraphKeys` table for
    the model's stochastic-rounding keys (see the module docstring).

    The first ``warmup`` calls run ``body`` eagerly on a side stream (they are real steps); the next call
    captures it and every call from then on replays the graph; :meth:`recapture` starts over (after
    :func:`fpsim.torch.set_recipe`, which changes what the graph would hold).  Without CUDA every call is
    eager.  A capture that fails (an operation a graph cannot hold) sets :attr:`failed` to the error and the
    steps go on eagerly; ``fallback=False`` raises instead.  ``eager_when`` (a callable) picks calls that run as
    plain eager steps, e.g. the steps a :func:`fpsim.torch.monitor` records.  Each call returns the step's loss,
    detached: a copy when replayed (the graph overwrites its own output at the next replay), and without its
    autograd graph when eager (a kept graph would hold the parameters' gradient-accumulation nodes of the
    warm-up stream into the capture, a stream mismatch torch warns of).  Warm-ups and the capture run on one
    side stream."""

    def __init__(self, body, model, optimizer, *, warmup: int = 3, fallback: bool = True, eager_when=None):
        torch = torch_module()
        self.body, self.opt, self.warmup, self.fallback = body, optimizer, int(warmup), fallback
        #: a callable: when it returns True the call runs ``body`` eagerly outside the key table, as a plain step
        #: (e.g. ``lambda: mon.due(layer.step)``, so that :func:`fpsim.torch.monitor` records that step)
        self.eager_when = eager_when
        self.model = model
        self.keys = GraphKeys(model)
        self.cuda = self.keys.table.is_cuda
        self.side = torch.cuda.Stream(device=self.keys.table.device) if self.cuda else None
        self.failed: str | None = None
        self.recapture()

    @property
    def captured(self) -> bool:
        """Whether calls now replay a graph."""
        return self.graph is not None

    def recapture(self) -> None:
        """Drop the graph: the next ``warmup`` calls run eagerly, then the step is captured again."""
        if getattr(self, "graph", None) is not None:
            # the replays left their gradients in the graph's tensors: an eager backward would add to them
            self.opt.zero_grad(set_to_none=True)
        self.graph, self.loss, self.eager = None, None, 0

    def __call__(self):
        torch = torch_module()
        if self.eager_when is not None and self.eager_when():
            return self._plain_step()
        with self.keys:
            self.keys.sync()
            if self.cuda and self.graph is None and self.eager >= self.warmup and self.failed is None:
                self._capture()
            if self.graph is not None:
                self.graph.replay()
                return self.loss.detach().clone()
            if not self.cuda:
                loss = self.body()
                self.opt.zero_grad(set_to_none=True)
                return loss.detach()
            self.side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(self.side):
                loss = self.body()
                self.opt.zero_grad(set_to_none=True)
            torch.cuda.current_stream().wait_stream(self.side)
            self.eager += 1
            # detached: a returned loss that kept its autograd graph alive would keep the parameters'
            # AccumulateGrad nodes of the side stream alive into the capture (torch then warns of a stream mismatch)
            return loss.detach()

    def _plain_step(self):
        """One eager step with the layers' own scalar keys (observers may record it), on the current stream; the
        graph's gradient tensors, if there is a graph, stay where its replays write them."""
        held = [p.grad for p in self.model.parameters()]
        self.opt.zero_grad(set_to_none=True)
        loss = self.body()
        if self.graph is not None:
            for p, g in zip(self.model.parameters(), held):  # point .grad back at the graph's buffers
                p.grad = g
        else:
            self.opt.zero_grad(set_to_none=True)
        return loss.detach()

    def _capture(self) -> None:
        torch = torch_module()
        self.opt.zero_grad(set_to_none=True)  # the captured backward then writes (not adds to) the gradients
        graph = torch.cuda.CUDAGraph()
        try:
            self.side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.graph(graph, stream=self.side):  # the warm-ups' stream, where autograd made its nodes
                self.loss = self.body()
        except Exception as e:
            if not self.fallback:
                raise
            self.failed = f"{type(e).__name__}: {e}"
            torch.cuda.synchronize()
            self.opt.zero_grad(set_to_none=True)  # gradients the failed capture may have allocated
            log.warning("fpsim.torch: CUDA-graph capture failed, the steps run eagerly (%s)", self.failed)
            return
        self.graph = graph
