"""CUDA-graph capture of training steps with :class:`fpsim.torch.Linear` layers (opt-in).

A step of an emulated recipe issues a dozen kernel launches per layer; captured once as a CUDA graph
(``torch.cuda.graph``) and replayed, it costs one launch of host time.  A graph freezes every kernel argument,
but stochastic rounding's Philox key depends on the step (``derive_seed(seed, "sr", layer, step, role)``, as
:func:`fpsim.linear` derives it), so while a :class:`GraphKeys` is active the fused kernels read each copy's key
from a device table instead of a scalar argument, and :meth:`GraphKeys.sync` rewrites the table for the layers'
current steps before each replay.  The bits are the eager fast path's: the same kernels on the same data with
the same keys.

Usage (the PyTorch whole-step capture recipe; ``opt`` built with ``capturable=True`` and a tensor ``lr``)::

    keys = fpsim.torch.GraphKeys(model)
    with keys:
        for _ in range(3):                     # warm-up steps (real steps: they train) on a side stream
            keys.sync(); train_step(); fpsim.torch.step(model)
        g = torch.cuda.CUDAGraph()
        keys.sync()
        with torch.cuda.graph(g):
            loss = train_step()
        for batch in data:                     # each replay: the keys of the new step, then the graph
            static_x.copy_(batch); keys.sync(); g.replay(); fpsim.torch.step(model)

What a graph cannot hold raises ``ValueError`` at the first (eager) call: copies whose stochastic rounding
does not run in the fused kernels (the float32 fallback), per-call RHT signs (a new sign vector every step),
the reference GEMM path (``gemm="fp32"``) and observers (:func:`fpsim.torch.monitor`), which run Python per step.
"""

from __future__ import annotations

import numpy as np

from ..random import seed_key
from ..transforms import derive_seed
from .runtime import torch_module

__all__ = ["GraphKeys", "active"]

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
