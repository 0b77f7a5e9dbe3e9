"""fpsim on torch tensors, a peer of the Numba reference under :mod:`fpsim.backends`.

Modules, lowest first: :mod:`~fpsim.torch.runtime` (the lazy torch import, Triton switches),
:mod:`~fpsim.torch.codecs` (element codecs, the Philox stream), :mod:`~fpsim.torch.container`
(:class:`~fpsim.torch.container.TorchQuantized` and its decoders), :mod:`~fpsim.torch.quantize` (the
fused Triton launchers and the eager quantizer, both reading a :class:`~fpsim.plan.Plan`),
:mod:`~fpsim.torch.rht`, :mod:`~fpsim.torch.gemm`, and :mod:`~fpsim.torch.backend` (what the dispatcher
calls: ``unsupported`` and the entry points).  The Triton sources are :mod:`~fpsim.torch.kernels`
(device functions, small kernels) and :mod:`~fpsim.torch.kernels_quant` (block quantizers and decoders).

Importing this package imports nothing heavy; torch is needed by its modules.
"""
