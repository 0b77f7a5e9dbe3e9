"""fpsim.torch.graphs: the stochastic-rounding keys a captured CUDA graph reads from a device table.

Under Triton's interpreter (CI) the kernels read the key from the table and must give the bits of the scalar
key; on CUDA a whole training step captured as a graph and replayed must train the model to the same bits as
the eager steps."""

from __future__ import annotations

import numpy as np
import pytest

import fpsim.torch as ft  # noqa: E402, I001
from fpsim.plan import lower  # noqa: E402
from fpsim.recipe import LayerPolicy, get_recipe  # noqa: E402
from fpsim.torch import fastpath as fp  # noqa: E402
from fpsim.torch import graphs  # noqa: E402
from fpsim.torch.quantize import absmax, quantize_fused  # noqa: E402
from fpsim.transforms import derive_seed  # noqa: E402
from tests.tritonenv import DEV, INTERPRETER_WARNINGS, torch  # sets TRITON_INTERPRET first

pytestmark = INTERPRETER_WARNINGS


@pytest.fixture(autouse=True)
def _fast_everywhere(monkeypatch):
    monkeypatch.setattr(fp, "IMPL", "triton")


def _bits(t):
    return t.detach().float().cpu().numpy().view(np.uint32)


@pytest.mark.parametrize("name,block", [("nvfp4", None), ("nvfp4", (16, 16)), ("mxfp4", None)])
def test_a_key_read_from_device_memory_gives_the_scalar_keys_bits(name, block):
    """Each SR-capable fused kernel (1-D two-level, 16×16 two-level, MX) with KEY_PTR reproduces the scalar key."""
    x = torch.from_numpy(np.random.default_rng(1).standard_normal((48, 64)).astype(np.float32)).to(DEV)
    plan = lower(name, block=block, rounding="sr")
    amax = absmax(x)
    seed = derive_seed(7, "sr", "blocks.0.fc", 3, "wgrad_dy")
    k = np.array([seed & 0xFFFFFFFF, seed >> 32], np.uint32).view(np.int32)
    table = torch.tensor([0, 0, *k.tolist()], dtype=torch.int32, device=DEV)  # the key in slot 1, not at 0
    kw = {"amax": amax} if plan.kind.value == "two_level" else {}
    want = quantize_fused(x, plan, fake=True, seed=seed, **kw)
    got = quantize_fused(x, plan, fake=True, seed=table[2:4], **kw)
    assert np.array_equal(_bits(got), _bits(want))
    other = quantize_fused(x, plan, fake=True, seed=seed + 1, **kw)
    assert not np.array_equal(_bits(other), _bits(want))  # the key matters, so the equality above says something


class _Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(32, 48, bias=False)
        self.fc2 = torch.nn.Linear(48, 32, bias=False)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def _train(keys: bool, steps: int = 3, recipe="nvfp4_paper"):
    torch.manual_seed(0)
    m = ft.convert(_Tiny(), recipe, keep_bf16=LayerPolicy(), skip=(), seed=5).to(DEV)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(1)
    xs = [torch.randn(32, 32, generator=g).to(DEV) for _ in range(steps)]
    table = ft.GraphKeys(m) if keys else None
    with table if keys else _null():
        for x in xs:
            if keys:
                table.sync()
            m(x).square().mean().backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            ft.step(m)
    return m, table


class _null:
    def __enter__(self):
        return None

    def __exit__(self, *a):
        return None


def test_training_steps_under_graph_keys_are_the_eager_steps_bit_for_bit():
    """Steps whose SR copies read their keys from the table train to the bits of the scalar-key steps: the table
    holds derive_seed(seed, "sr", layer, step, role) for each step (sync before the step and the lazy write at a
    slot's first use both)."""
    ref, _ = _train(False)
    got, table = _train(True)
    for (n, a), (_, b) in zip(ref.named_parameters(), got.named_parameters()):
        assert np.array_equal(_bits(a), _bits(b)), n
    rec = get_recipe("nvfp4_paper")
    sr_roles = {r for r in ("fprop_x", "fprop_w", "dgrad_dy", "dgrad_w", "wgrad_dy", "wgrad_x")
                if getattr(rec, r).resolved() is not None and getattr(rec, r).resolved().rounding.value == "sr"}
    assert sr_roles and {role for _, role in table._slots} == sr_roles  # only SR copies take slots
    # fc1's input needs no gradient, so it has no Dgrad copy
    assert set(table._slots) == {("fc2", r) for r in sr_roles} | {("fc1", r) for r in sr_roles - {"dgrad_dy"}}


def test_a_step_without_sync_reads_the_previous_steps_keys():
    """What a replay without sync would do (the graph's kernels read whatever the table holds): other bits."""
    torch.manual_seed(0)
    m = ft.convert(_Tiny(), "nvfp4_paper", keep_bf16=LayerPolicy(), skip=(), seed=5).to(DEV)
    x = torch.randn(32, 32).to(DEV)
    keys = ft.GraphKeys(m)
    with keys:
        m(x).sum().backward()
        g0 = m.fc1.weight.grad.clone()
        m.fc1.weight.grad = None
        ft.step(m)
        keys.sync()
        m(x).sum().backward()
        g1 = m.fc1.weight.grad.clone()
    assert not torch.equal(g0, g1)  # step 1's SR keys differ from step 0's (weights unchanged: no optimizer)


def test_what_a_graph_cannot_hold_is_refused_with_the_layer_named():
    torch.manual_seed(0)
    x = torch.randn(32, 32).to(DEV)
    m = ft.convert(_Tiny(), "nvfp4_paper", keep_bf16=LayerPolicy(), skip=(), seed=5, gemm="fp32").to(DEV)
    with ft.GraphKeys(m), pytest.raises(ValueError, match="fc1.*gemm='blas'"):
        m(x)
    rec = get_recipe("mxfp4")  # per-layer signs: accepted; per-call signs: refused
    per_call = rec.replace_roles(("wgrad_dy", "wgrad_x"), rht_signs="per_call")
    m = ft.convert(_Tiny(), per_call, keep_bf16=LayerPolicy(), skip=(), seed=5).to(DEV)
    with ft.GraphKeys(m), pytest.raises(ValueError, match="per-call RHT signs"):
        m(x).sum().backward()
    assert graphs.active() is None  # the context left the registry empty


def _tiny_training(steps: int, device=DEV, recipe="nvfp4_paper"):
    """(model, AdamW, the steps' inputs, the static input, the step body) of _Tiny with fixed seeds: the set-up
    every GraphStep test compares against a plain loop (AdamW is capturable on CUDA, where only it can be)."""
    torch.manual_seed(0)
    m = ft.convert(_Tiny(), recipe, keep_bf16=LayerPolicy(), skip=(), seed=5).to(device)
    cap = device == "cuda"
    opt = torch.optim.AdamW(m.parameters(), lr=torch.tensor(1e-2, device=device) if cap else 1e-2, capturable=cap)
    g = torch.Generator().manual_seed(1)
    xs = [torch.randn(64, 32, generator=g).to(device) for _ in range(steps)]
    static_x = torch.zeros_like(xs[0])

    def body():
        loss = m(static_x).square().mean()
        loss.backward()
        opt.step()
        return loss

    return m, opt, xs, static_x, body


def _graph_run(graph: bool, steps: int = 8, device=DEV, recipe="nvfp4_paper", switch_at=None):
    """``steps`` AdamW steps of _Tiny: through GraphStep (``graph``) or a plain eager loop, same data and seeds;
    ``switch_at``: the step at which every layer switches to BF16 (GraphStep recaptures)."""
    m, opt, xs, static_x, body = _tiny_training(steps, device, recipe)
    stepper = ft.GraphStep(body, m, opt, fallback=False) if graph else None
    losses = []
    for i, x in enumerate(xs):
        if i == switch_at:
            ft.set_recipe(m, "bf16")
            if stepper is not None:
                stepper.recapture()
        static_x.copy_(x)
        if stepper is not None:
            losses.append(stepper())
        else:
            losses.append(body())
            opt.zero_grad(set_to_none=True)
        ft.step(m)
    if device == "cuda":
        torch.cuda.synchronize()
    return [p.detach().clone() for p in m.parameters()], torch.stack(losses), stepper


def test_graph_step_without_cuda_runs_the_eager_steps_bit_for_bit():
    """On CPU GraphStep never captures; its steps (keys from the table) equal the plain loop's bits."""
    if DEV == "cuda":
        pytest.skip("the CPU path of GraphStep")
    want, lw, _ = _graph_run(False, steps=4)
    got, lg, st = _graph_run(True, steps=4)
    assert not st.captured and st.failed is None
    assert torch.equal(lw.view(torch.int32), lg.view(torch.int32))
    for a, b in zip(want, got):
        assert torch.equal(a.view(torch.int32), b.view(torch.int32))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU (the device machine)")
@pytest.mark.parametrize("switch_at", [None, 5], ids=["no-switch", "switch-to-bf16"])
def test_a_captured_training_step_replays_to_the_eager_bits(switch_at):
    """Three warm-up steps, one capture, then replays (and, with a switch, three eager steps and a second
    capture): parameters and losses after 10 steps equal 10 eager steps bit for bit."""
    want, lw, _ = _graph_run(False, steps=10, switch_at=switch_at)
    got, lg, st = _graph_run(True, steps=10, switch_at=switch_at)
    assert st.captured and st.failed is None
    assert torch.equal(lw.view(torch.int32), lg.view(torch.int32))
    for a, b in zip(want, got):
        assert torch.equal(a.view(torch.int32), b.view(torch.int32))


class _FakeCuda:
    """Stand-ins for the torch.cuda calls GraphStep makes, so that its CUDA control flow runs on CPU tensors.

    A fake capture runs ``body`` once and then undoes its step (parameters and optimizer state restored), keeping
    the gradients it allocated, as a real capture leaves them allocated but not computed (``fail_capture``: then
    raises, as a capture that meets an operation it cannot hold fails when it ends); a replay runs ``body``
    with the gradients cleared first, so that, as after a real replay, they hold that step's values only."""

    def __init__(self, model, opt, fail_capture: bool = False):
        self.model, self.opt, self.fail, self.captures, self.replays = model, opt, fail_capture, 0, 0
        self.body = None
        fake = self

        class Stream:
            def wait_stream(self, other):
                pass

        class CUDAGraph:
            def replay(self):
                fake.replays += 1
                for p in fake.model.parameters():
                    p.grad = None
                fake.step.loss.detach().copy_(fake.body().detach())  # a replay rewrites the graph's output

        class graph:
            def __init__(self, g, stream=None):
                assert stream is fake.step.side, "the capture must run on the warm-ups' side stream"

            def __enter__(self):
                fake.captures += 0 if fake.fail else 1
                fake.saved = ([p.detach().clone() for p in fake.model.parameters()],
                              {k: {n: v.clone() if torch.is_tensor(v) else v for n, v in s.items()}
                               for k, s in fake.opt.state.items()})

            def __exit__(self, *exc):
                params, state = fake.saved
                with torch.no_grad():
                    for p, v in zip(fake.model.parameters(), params):
                        p.copy_(v)
                for k, s in state.items():
                    fake.opt.state[k] = s
                if fake.fail:  # as a real capture fails at its end: the body ran, its gradients are allocated
                    raise RuntimeError("operation not permitted when stream is capturing")
                return False

        self.Stream, self.CUDAGraph, self.graph = Stream, CUDAGraph, graph

    def install(self, monkeypatch, step):
        import contextlib

        monkeypatch.setattr(torch.cuda, "CUDAGraph", self.CUDAGraph)
        monkeypatch.setattr(torch.cuda, "graph", self.graph)
        monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
        monkeypatch.setattr(torch.cuda, "current_stream", lambda *a: self.Stream())
        monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
        step.cuda, step.side = True, self.Stream()
        self.body, self.step = step.body, step


@pytest.mark.parametrize("fail", [False, True], ids=["captured", "capture-fails"])
def test_graph_step_control_flow_warms_up_captures_replays_and_recaptures(monkeypatch, fail):
    """GraphStep's CUDA branch on CPU stand-ins: three eager steps, a capture, replays; a switch to BF16
    recaptures after three more eager steps, and no eager step after replays adds to the graph's gradients;
    a failed capture leaves eager steps.  The parameters end equal to a plain eager loop's, bit for bit."""
    if DEV == "cuda":
        pytest.skip("the stand-ins replace torch.cuda")
    want, lw, _ = _graph_run(False, steps=12, switch_at=6)
    m, opt, xs, static_x, body = _tiny_training(12)
    stepper = ft.GraphStep(body, m, opt)
    fake = _FakeCuda(m, opt, fail_capture=fail)
    fake.install(monkeypatch, stepper)
    losses = []
    for i, x in enumerate(xs):
        if i == 6:
            ft.set_recipe(m, "bf16")
            stepper.recapture()
        static_x.copy_(x)
        losses.append(stepper())
        ft.step(m)
    assert (fake.captures, fake.replays) == ((0, 0) if fail else (2, 3 + 3))  # steps 3-5 and 9-11 replay
    assert (stepper.failed is not None) == fail
    assert torch.equal(torch.stack(losses).view(torch.int32), lw.view(torch.int32))
    for a, b in zip(want, m.parameters()):
        assert torch.equal(a.view(torch.int32), b.detach().view(torch.int32))


def test_graph_step_runs_the_monitors_steps_eagerly_and_records_them(monkeypatch, tmp_path):
    """With ``eager_when=lambda: mon.due(step)`` the steps a monitor records run as plain eager steps (the
    monitor sees every copy of them) between replays; parameters and the monitor's rows equal a plain loop's."""
    if DEV == "cuda":
        pytest.skip("the stand-ins replace torch.cuda")

    def run(graph: bool):
        m, opt, xs, static_x, body = _tiny_training(10)
        with ft.monitor(m, every=4) as mon:
            stepper = ft.GraphStep(body, m, opt, eager_when=lambda: mon.due(m.fc1.step)) if graph else None
            if graph:
                fake = _FakeCuda(m, opt)
                fake.install(monkeypatch, stepper)
            for x in xs:
                static_x.copy_(x)
                if graph:
                    stepper()
                else:
                    body()
                    opt.zero_grad(set_to_none=True)
                ft.step(m)
        return [p.detach().clone() for p in m.parameters()], mon.rows, (fake.captures, fake.replays) if graph else None

    want, rows_w, _ = run(False)
    got, rows_g, counts = run(True)
    assert counts == (1, 4)  # 0, 4, 8 the monitor's; 1-3 warm up; 5 captures; 5-7 and 9 replay
    assert {r["step"] for r in rows_g} == {0, 4, 8} and len(rows_g) == len(rows_w)
    for a, b in zip(rows_w, rows_g):
        assert (a["layer"], a["role"], a["step"]) == (b["layer"], b["role"], b["step"])
    for a, b in zip(want, got):
        assert torch.equal(a.view(torch.int32), b.view(torch.int32))
