"""torch.compile of a model holding fpsim.torch.Linear layers: each layer runs eagerly behind a graph break, the rest
of the model compiles, and the forward output and every gradient equal the uncompiled model's bit for bit.
Also the two gaps a user meets building layers by hand: unnamed layers sharing one stream of random bits."""

from __future__ import annotations

import copy
import shutil

import pytest

torch = pytest.importorskip("torch")
fnn = pytest.importorskip("fpsim.torch.nn")
from fpsim.recipe import get_recipe  # noqa: E402

D, VOCAB, BATCH, SEQ = 32, 40, 2, 16  # 32 tokens: a multiple of the Wgrad RHT sizes (16, 32)
HAS_CC = shutil.which("g++") is not None or shutil.which("cc") is not None
CUDA = torch.cuda.is_available()

# Dynamo's tracing itself touches a non-leaf tensor's .grad (under a warnings filter of its own that the suite's
# "error" overrides) and warns of functools.lru_cache; inductor imports torch.jit.script_method; none of them is
# this library's code.
pytestmark = [pytest.mark.filterwarnings("ignore:The .grad attribute of a Tensor that is not a leaf:UserWarning"),
              pytest.mark.filterwarnings("ignore:Dynamo detected a call to a `functools.lru_cache`:UserWarning"),
              pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")]


class Block(torch.nn.Module):
    def __init__(self, norm):
        super().__init__()
        self.norm = torch.nn.LayerNorm(D) if norm else torch.nn.Identity()
        self.fc1 = torch.nn.Linear(D, 2 * D)
        self.fc2 = torch.nn.Linear(2 * D, D)

    def forward(self, x):
        return x + self.fc2(torch.relu(self.fc1(self.norm(x))))


class Tiny(torch.nn.Module):
    """embedding → 2 blocks (their four Linears converted) → head (kept nn.Linear by convert)."""

    def __init__(self, norm=True):
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, D)
        self.blocks = torch.nn.ModuleList([Block(norm), Block(norm)])
        self.head = torch.nn.Linear(D, VOCAB)

    def forward(self, tok):
        x = self.embed(tok)
        for b in self.blocks:
            x = b(x)
        return self.head(x)


def _recipes():
    """Block 0: the paper's recipe (SR on the gradients, Wgrad RHT with per-layer signs); block 1: the same with
    per-call (per-step) seeded RHT signs."""
    base = get_recipe("nvfp4_paper")
    per_call = base.replace_roles(["wgrad_dy", "wgrad_x"], rht_signs="per_call")
    return base, per_call


def _model(device, gemm, norm=True):
    torch.manual_seed(0)
    m = Tiny(norm).to(device)
    base, per_call = _recipes()
    fnn.convert(m, base, keep_bf16=[], seed=3, gemm=gemm)
    assert fnn.set_recipe(m, per_call, layers="blocks.1.*") == 2
    assert [n for n, _, _ in fnn.summary(m)] == ["blocks.0.fc1", "blocks.0.fc2", "blocks.1.fc1", "blocks.1.fc2"]
    return m


def _train(model, run, device, steps=3, strict=False):
    """``steps`` optimizer steps (SGD with momentum, step_with); per step the output and every parameter's gradient.
    ``strict``: a step after the first may compile nothing anew (a new step number is no new graph)."""
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    fnn.step_with(opt, model)
    g = torch.Generator().manual_seed(1)
    out = []
    for i in range(steps):
        tok = torch.randint(0, VOCAB, (BATCH, SEQ), generator=g).to(device)
        target = torch.randn(BATCH, SEQ, VOCAB, generator=g).to(device)
        opt.zero_grad(set_to_none=True)
        with torch._dynamo.config.patch(error_on_recompile=strict and i > 0):
            y = run(tok)
            ((y - target) ** 2).mean().backward()
        out.append((y.detach().clone(), {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}))
        opt.step()
    return out


def _assert_same(eager, compiled):
    assert len(eager) == len(compiled)
    for i, ((ye, ge), (yc, gc)) in enumerate(zip(eager, compiled)):
        assert ye.dtype == yc.dtype and torch.equal(ye, yc), f"step {i}: forward output differs"
        assert ge.keys() == gc.keys() and len(ge) >= 10
        bad = [n for n in ge if not torch.equal(ge[n], gc[n])]
        assert not bad, f"step {i}: gradients differ: {bad}"


def _compare(device, gemm, norm=True, frozen_embed=False, **compile_kw):
    torch._dynamo.reset()
    ref = _model(device, gemm, norm)
    ref.embed.weight.requires_grad_(not frozen_embed)
    mod = copy.deepcopy(ref)
    eager = _train(ref, ref, device)
    compiled_fn = torch.compile(mod, **compile_kw)
    compiled = _train(mod, compiled_fn, device, strict=True)
    _assert_same(eager, compiled)
    # the layers' steps advanced on both models (the SR bits and per-call signs of step 0, 1, 2 were drawn)
    assert {m.step for m in mod.modules() if isinstance(m, fnn.Linear)} == {3}
    return mod, compiled_fn


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_compiled_model_equals_the_eager_model_bit_for_bit(backend):
    """Output and all 15 gradients of 3 SGD steps (step_with advancing the SR / per-call RHT step) are the
    uncompiled model's; the fpsim layers run eagerly between the compiled pieces."""
    _compare("cpu", "blas", backend=backend)


@pytest.mark.skipif(not HAS_CC, reason="inductor on CPU needs a C++ compiler (g++ or cc)")
def test_inductor_compiled_model_equals_the_eager_model_bit_for_bit():
    """The default backend: output and all 11 gradients of 3 steps bit for bit, for blocks without LayerNorm.
    (Inductor's own fused LayerNorm backward sums in another order than ATen's, so a model with one differs in
    the LayerNorm and upstream gradients' last bits with or without fpsim layers: inductor's numerics.)"""
    _compare("cpu", "blas", norm=False)


def test_compiled_model_with_the_reference_gemm():
    """gemm="fp32" (the bit-defined host GEMM, numpy inside the layer) compiles the same way."""
    _compare("cpu", "fp32", backend="aot_eager")


def test_fullgraph_is_one_clear_error():
    """fullgraph=True forbids the graph break the fpsim layer needs: one short error that says so (and shows the
    model's line calling the layer), not the fake-tensor trace of tracing into the layer."""
    torch._dynamo.reset()
    m = _model("cpu", "blas")
    fn = torch.compile(m, backend="eager", fullgraph=True)
    with pytest.raises(Exception) as e:
        fn(torch.zeros(BATCH, SEQ, dtype=torch.long))
    msg = str(e.value)
    assert "fpsim.torch.Linear runs eagerly" in msg and "compile without fullgraph=True" in msg, msg
    assert "fake tensor" not in msg.lower() and len(msg.splitlines()) < 40, msg


class _CaptureSpy:
    """Every CUDA graph inductor's CUDA-graph trees capture under ``mode="reduce-overhead"``, and whether torch found
    it empty ("The CUDA Graph is empty", from ``capture_end``).

    A tree manager, made once per device and process, captures one graph with nothing in it to register its memory
    pool (``CUDAGraphTreeManager.__init__``: ``with torch.cuda.graph(...): pass``); torch 2.11 warns of that capture
    too.  That warning, raised inside the manager's constructor, is the only one held back; every other warning is
    re-issued as it came, and every graph the trees record for a compiled piece is kept in ``records``."""

    MESSAGE = "The CUDA Graph is empty"

    def __init__(self, monkeypatch):
        import warnings

        import torch._inductor.cudagraph_trees as trees

        self.records = []  # True where torch found the recorded graph empty
        record, manager_init = trees.CUDAGraphNode._record, trees.CUDAGraphTreeManager.__init__

        def reissue(caught, hold):
            for w in caught:
                if not (hold and self.MESSAGE in str(w.message)):
                    warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)

        def spy_record(node, model, inputs):
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                outs = record(node, model, inputs)
            self.records.append(any(self.MESSAGE in str(w.message) for w in caught))
            reissue(caught, hold=False)
            return outs

        def spy_manager_init(manager, *args, **kwargs):
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                manager_init(manager, *args, **kwargs)
            reissue(caught, hold=True)

        monkeypatch.setattr(trees.CUDAGraphNode, "_record", spy_record)
        monkeypatch.setattr(trees.CUDAGraphTreeManager, "__init__", spy_manager_init)


@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU (runs on the device machine)")
@pytest.mark.parametrize("mode", [None, "reduce-overhead"])
def test_compiled_model_on_cuda_fast_path(mode, monkeypatch):
    """On CUDA the layers take the fused gemm="blas" path eagerly, the rest compiles with inductor (and its
    CUDA graphs under mode="reduce-overhead"); bit for bit the eager model.  The embedding is frozen: inductor
    sums its gradient rows with atomic adds on the GPU, in no fixed order.

    Under "reduce-overhead" the pieces between the fpsim layers' graph breaks are captured as CUDA graphs, and each
    recorded graph holds work.  torch's own empty capture, the one that registers a tree manager's memory pool, is
    the only "graph is empty" warning let pass (see ``_CaptureSpy``); on the H100 the test records 6 graphs."""
    spy = _CaptureSpy(monkeypatch) if mode == "reduce-overhead" else None
    _compare("cuda", "blas", norm=False, frozen_embed=True, **({} if mode is None else {"mode": mode}))
    if spy is not None:
        assert spy.records and not any(spy.records), spy.records  # graphs were recorded, none of them empty


@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU (runs on the device machine)")
def test_compiled_model_on_cuda_eager_backends():
    """aot_eager on CUDA: every gradient bit for bit, the embedding and LayerNorms included."""
    _compare("cuda", "blas", backend="aot_eager")


# --- unnamed layers: one shared stream of SR bits and seeded RHT signs ------------------------------------------

def _unnamed_pair(recipe="nvfp4_paper", names=("", ""), seed=0):
    torch.manual_seed(0)
    return torch.nn.Sequential(fnn.Linear(D, D, recipe=recipe, name=names[0], seed=seed), torch.nn.ReLU(),
                               fnn.Linear(D, D, recipe=recipe, name=names[1], seed=seed))


def _fwd_bwd(model, grad=True):
    x = torch.randn(BATCH * SEQ, D, requires_grad=grad)
    with torch.set_grad_enabled(grad):
        y = model(x)
    if grad:
        y.sum().backward()


@pytest.fixture
def fresh_unnamed(monkeypatch):
    """A process in which no unnamed layer has drawn bits yet (the warning is once per process)."""
    monkeypatch.setattr(fnn, "_UNNAMED", {}, raising=False)
    monkeypatch.setattr(fnn, "_unnamed_warned", False, raising=False)


def test_two_unnamed_layers_drawing_random_bits_are_warned_of_once(fresh_unnamed):
    """Two fpsim layers built with name="" (same seed) draw the same SR bits and per-layer RHT signs: correlated
    rounding errors, so the first forward that shows it warns once, naming the remedy; a second model is quiet."""
    from fpsim.recipe import operand_steps

    rec = get_recipe("nvfp4_paper")
    a, b = (operand_steps(rec.wgrad_dy, seed=0, layer="", step=0, role="wgrad_dy") for _ in range(2))
    assert a.seed is not None and a == b  # the shared stream the warning is about
    with pytest.warns(UserWarning, match=r"no name.*same stochastic-rounding bits.*name=.*convert\(model"):
        _fwd_bwd(_unnamed_pair())
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _fwd_bwd(_unnamed_pair())  # once per process


@pytest.mark.parametrize("case", ["named", "one_layer", "no_random_bits", "no_grad_rne_forward", "other_seeds",
                                  "converted"])
def test_no_warning_where_no_two_layers_share_bits(fresh_unnamed, case):
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        if case == "named":
            _fwd_bwd(_unnamed_pair(names=("a", "b")))
        elif case == "one_layer":  # one unnamed layer, called twice (the documented same-step reuse)
            lin = fnn.Linear(D, D, recipe="nvfp4_paper")
            _fwd_bwd(torch.nn.Sequential(lin, lin))
        elif case == "no_random_bits":  # RNE everywhere, the recipe's fixed RHT signs
            _fwd_bwd(_unnamed_pair(get_recipe("nvfp4_paper").without("sr")))
        elif case == "no_grad_rne_forward":  # inference: only the RNE forward copies are made
            _fwd_bwd(_unnamed_pair(), grad=False)
        elif case == "other_seeds":
            torch.manual_seed(0)
            m = torch.nn.Sequential(fnn.Linear(D, D, seed=1), fnn.Linear(D, D, seed=2))
            _fwd_bwd(m)
        else:  # convert names fpsim layers that are already fpsim layers by their module path
            m = fnn.convert(_unnamed_pair(), "nvfp4_paper", keep_bf16=[])
            assert [n for n, _, _ in fnn.summary(m)] == ["0", "2"]
            _fwd_bwd(m)
    if case == "no_grad_rne_forward":  # the same pair with gradients: now their bits are shared
        with pytest.warns(UserWarning, match="no name"):
            _fwd_bwd(_unnamed_pair())


def test_per_layer_rht_signs_alone_are_warned_of(fresh_unnamed):
    """A recipe without SR whose Wgrad RHT signs are per-layer seeded (mxfp4) still shares the signs."""
    with pytest.warns(UserWarning, match="RHT signs"):
        _fwd_bwd(_unnamed_pair(get_recipe("mxfp4").without("sr")))
