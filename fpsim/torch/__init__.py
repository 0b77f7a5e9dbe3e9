"""fpsim on torch tensors: the torch backend (:mod:`fpsim.torch.backend`, Triton kernels in
:mod:`fpsim.torch.kernels`), peers of the Numba reference under :mod:`fpsim.backends`.

Importing this package imports nothing heavy; torch is needed by its modules.
"""
