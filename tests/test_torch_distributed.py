"""fpsim.torch layers under torch.distributed's DistributedDataParallel and FSDP2's ``fully_shard`` (issue 18:
parameters stay ordinary ``nn.Parameter``s, so both work unchanged): two CPU processes over gloo give the
gradients of the two shards averaged, bit for bit, with each rank's quantized copies the single-process layer's."""

from __future__ import annotations

import datetime

import numpy as np
import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
if not dist.is_available():
    pytest.skip("torch.distributed is not available", allow_module_level=True)

import fpsim.torch as ft  # noqa: E402

DIN, DOUT, TOK = 32, 16, 32


def _model(seed: int = 0):
    torch.manual_seed(seed)
    m = torch.nn.Sequential(torch.nn.Linear(DIN, DOUT, bias=False), torch.nn.Linear(DOUT, 8, bias=True))
    return ft.convert(m, "nvfp4_paper", keep_bf16=[], skip=[], seed=3, gemm="fp32")


def _shard(rank: int):
    g = torch.Generator().manual_seed(100 + rank)
    return torch.randn(TOK, DIN, generator=g), torch.randn(TOK, 8, generator=g)


def _worker(rank: int, world: int, store: str, out: str, wrap: str) -> None:
    import faulthandler
    import warnings

    faulthandler.enable()  # a native abort in a rank prints that rank's Python stack into the test's stderr
    torch.set_num_threads(1)  # two ranks on a 2-core CI machine: no oversubscribed intra-op pools
    # A file store, not tcp://: no port picked by the parent and released before rank 0 binds it, and no TCPStore
    # server thread; gloo's pairs on the loopback device (GLOO_SOCKET_IFNAME, set by the parent), whatever the
    # machine's host name resolves to.
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=120))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # e.g. FSDP's warning about module outputs that are views
            x, t = _shard(rank)
            if wrap == "ddp":
                model = torch.nn.parallel.DistributedDataParallel(_model())
                ((model(x) - t) ** 2).mean().backward()
                grads = {n: p.grad.numpy() for n, p in model.module.named_parameters()}
            else:
                from torch.distributed.fsdp import fully_shard

                model = _model()
                fully_shard(model)
                ((model(x) - t) ** 2).mean().backward()
                grads = {n: p.grad.full_tensor().numpy() for n, p in model.named_parameters()}
        if rank == 0:
            np.savez(out, **grads)
        dist.barrier()  # neither rank tears the group down while the other still talks to it
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("wrap", ["ddp", "fsdp"])
def test_distributed_gradients_are_the_shards_gradients_averaged(tmp_path, wrap, monkeypatch):
    import torch.multiprocessing as mp

    if wrap == "fsdp":
        pytest.importorskip("torch.distributed.fsdp", reason="no FSDP in this torch")
        from torch.distributed import fsdp

        if not hasattr(fsdp, "fully_shard"):
            pytest.skip("this torch has no FSDP2 fully_shard")
    out = str(tmp_path / f"{wrap}.npz")
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "lo")  # inherited by the spawned ranks
    mp.spawn(_worker, args=(2, str(tmp_path / "store"), out, wrap), nprocs=2, join=True)
    with np.load(out) as z:  # closed now, not by the cyclic GC in a later test (an 'unclosed file' warning)
        got = dict(z)
    grads = []
    for rank in (0, 1):
        m = _model()
        x, t = _shard(rank)
        ((m(x) - t) ** 2).mean().backward()
        grads.append({n: p.grad.numpy() for n, p in m.named_parameters()})
    for name in list(got):
        want = (grads[0][name] + grads[1][name]) / np.float32(2)
        assert np.array_equal(got[name].view(np.uint32), want.astype(np.float32).view(np.uint32)), name
