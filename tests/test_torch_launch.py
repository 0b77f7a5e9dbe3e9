"""fpsim.torch.launch's cached launches pass every call's own runtime arguments in the JIT's order (a fake JIT
function stands in for Triton here; on the device machine tests/test_torch_fastpath.py checks real kernels)."""

from __future__ import annotations

import gc
import weakref

import pytest

torch = pytest.importorskip("torch")

from fpsim.torch import launch as L  # noqa: E402


class _Param:
    def __init__(self, name, const):
        self.name, self.is_constexpr = name, const


class _Kernel:
    function, packed_metadata = "f", "m"

    def __init__(self, log):
        self.log = log

    def run(self, g0, g1, g2, stream, function, packed, meta, enter, exit_, *vals):
        self.log.append(("direct", (g0, g1, g2), vals))


class _Fake:
    """A JIT function ``k(x_ptr, n, k0=0, k1=0, BLOCK: constexpr, SR: constexpr = False)``."""

    def __init__(self):
        def k(x_ptr, n, k0=0, k1=0, BLOCK=None, SR=False):
            pass

        self.fn = k
        self.params = [_Param("x_ptr", False), _Param("n", False), _Param("k0", False), _Param("k1", False),
                       _Param("BLOCK", True), _Param("SR", True)]
        self.log = []
        self.kernel = _Kernel(self.log)

    def __getitem__(self, grid):
        def go(*args, **kwargs):
            self.log.append(("jit", grid, args, kwargs))
            return self.kernel

        return go


class _CudaLike(torch.Tensor):
    is_cuda = True
    device = type("Dev", (), {"index": 0})()


@pytest.fixture
def fake(monkeypatch):
    monkeypatch.setattr(L, "hw_cvt", lambda: True)
    monkeypatch.setattr(L, "_state", {"broken": False})
    monkeypatch.setattr(L, "_cache", {})
    monkeypatch.setattr(L, "_meta", {})
    monkeypatch.setattr(L, "_kwmeta", {})
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda idx: 7, raising=False)
    return _Fake()


def _x(n=16):
    t = torch.zeros(n).as_subclass(_CudaLike)
    return t


def test_the_first_launch_goes_through_the_jit_and_the_next_ones_pass_their_own_arguments(fake):
    a, b = _x(), _x()
    L.launch(fake, (4,), (a, 32), {"k0": 5, "BLOCK": 128, "SR": True, "num_warps": 4})
    L.launch(fake, (2,), (b, 48), {"k0": 9, "BLOCK": 128, "SR": True, "num_warps": 4})
    assert fake.log[0][0] == "jit"
    kind, grid, vals = fake.log[1]
    assert kind == "direct" and grid == (2, 1, 1)
    assert vals[0] is b and vals[1:] == (48, 9, 0, 128, True)  # this call's tensor, n and k0; k1's default
    L.launch(fake, (1,), (a, 32), {"k1": 3, "k0": 7, "BLOCK": 128})  # two runtime keywords, another order
    L.launch(fake, (1,), (b, 16), {"k1": 4, "k0": 8, "BLOCK": 128})
    assert fake.log[-2][0] == "jit" and fake.log[-1][2] == (b, 16, 8, 4, 128, False)


def test_a_new_specialisation_goes_through_the_jit_again(fake):
    L.launch(fake, (1,), (_x(), 32), {"BLOCK": 128})
    L.launch(fake, (1,), (_x(), 33), {"BLOCK": 128})  # n no longer divisible by 16: another compiled kernel
    L.launch(fake, (1,), (_x(), 32), {"BLOCK": 64})  # another constexpr
    assert [e[0] for e in fake.log] == ["jit", "jit", "jit"]


def test_the_cache_keeps_no_tensor_of_the_first_call(fake):
    a = _x()
    ref = weakref.ref(a)
    L.launch(fake, (1,), (a, 32), {"BLOCK": 128})
    fake.log.clear()
    del a
    gc.collect()
    assert ref() is None


def test_a_launcher_that_fails_switches_direct_launches_off(fake):
    L.launch(fake, (1,), (_x(), 32), {"BLOCK": 128})

    def boom(*a):
        raise TypeError("another Triton")

    fake.kernel.run = boom
    L.launch(fake, (1,), (_x(), 32), {"BLOCK": 128})
    assert not L.direct_enabled() and fake.log[-1][0] == "jit"  # fell back to the JIT for this launch too
