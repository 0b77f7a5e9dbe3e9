"""fpsim.torch in real model code: convert on realistic structures, the inputs a training loop gives a layer, the
state it keeps, and its determinism, checked against fpsim.linear (the CPU reference) or plain torch."""

from __future__ import annotations

import copy
import io
import os
import subprocess
import sys
import warnings

import numpy as np
import pytest

import fpsim
from fpsim.recipe import LayerPolicy, get_recipe

torch = pytest.importorskip("torch")
fnn = pytest.importorskip("fpsim.torch.nn")
try:  # the fused (GPU) path runs under Triton's interpreter without CUDA; it sets that up before Triton loads
    from tests import tritonenv
except pytest.skip.Exception:
    tritonenv = None

DIN, DOUT = 64, 48


def _same(a, b):
    return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()


def _weights(seed=0):
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((DOUT, DIN)) / 8).astype(np.float32)
    return rng, w


def _layer(w, rec="nvfp4_paper", step=2):
    layer = fnn.Linear(DIN, DOUT, bias=False, recipe=rec, name="blocks.1.fc", seed=3, gemm="fp32")
    with torch.no_grad():
        layer.weight.copy_(torch.from_numpy(w))
    layer.step = step
    return layer


def _no_wgrad_rht(rec="nvfp4_paper"):
    """The recipe without Wgrad's token RHT: its Fprop and Dgrad copies are the recipe's own (same seeds)."""
    return get_recipe(rec).replace_roles(["wgrad_dy", "wgrad_x"], rht=0)


# ---- inputs ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("mode", ["no_grad", "inference_mode", "frozen_weight"])
def test_a_token_count_off_the_wgrad_rht_runs_where_no_wgrad_is_made(mode):
    """Wgrad's RHT needs the token count to be a multiple of 16; the layer refused 15 tokens (or one decoding
    token) even where no Wgrad runs: under no_grad / inference_mode and for a frozen weight (LoRA's base)."""
    rng, w = _weights(1)
    x = (rng.standard_normal((3, 5, DIN)) * 0.5).astype(np.float32)
    dy = (rng.standard_normal((3, 5, DOUT)) * 1e-3).astype(np.float32)
    layer = _layer(w)
    ref = fpsim.linear(x.reshape(15, DIN), w, dy.reshape(15, DOUT), _no_wgrad_rht(), seed=3, layer="blocks.1.fc",
                       step=2)
    if mode == "frozen_weight":
        layer.weight.requires_grad_(False)
        xt = torch.from_numpy(x).requires_grad_(True)
        y = layer(xt)
        y.backward(torch.from_numpy(dy))
        assert _same(xt.grad.numpy().reshape(15, DIN), ref.dx) and layer.weight.grad is None
    else:
        with torch.no_grad() if mode == "no_grad" else torch.inference_mode():
            y = layer(torch.from_numpy(x))
    assert _same(y.detach().numpy().reshape(15, DOUT), ref.y)
    with pytest.raises(ValueError, match=r"blocks\.1\.fc: 15 tokens"):  # training it still needs 16·n tokens
        _layer(w)(torch.from_numpy(x))


@pytest.mark.skipif(tritonenv is None, reason="Triton cannot run here")
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_the_fused_path_takes_the_same_token_rule_and_refuses_double_backward(monkeypatch):
    """The same two fixes on gemm="blas"'s fused path (CUDA, here Triton's interpreter): 15 tokens run without a
    Wgrad, and a gradient made under create_graph refuses a second backward."""
    from fpsim.torch import fastpath

    monkeypatch.setattr(fastpath, "IMPL", "triton")
    rng, w = _weights(6)
    x = rng.standard_normal((15, DIN)).astype(np.float32)
    dy = (rng.standard_normal((15, DOUT)) * 1e-3).astype(np.float32)
    ref = fpsim.linear(x, w, dy, _no_wgrad_rht(), seed=3, layer="blocks.1.fc", step=2)
    layer = _layer(w).to(tritonenv.DEV)
    layer.gemm = "blas"
    with torch.no_grad():
        y = layer(torch.from_numpy(x).to(tritonenv.DEV))
    assert np.allclose(y.cpu().numpy(), ref.y, rtol=1e-5, atol=1e-6)
    layer.weight.requires_grad_(False)
    xt = torch.from_numpy(x).to(tritonenv.DEV).requires_grad_(True)
    layer(xt).backward(torch.from_numpy(dy).to(tritonenv.DEV))
    assert np.allclose(xt.grad.cpu().numpy(), ref.dx, rtol=1e-5, atol=1e-9) and layer.weight.grad is None
    layer.weight.requires_grad_(True)
    x2 = torch.randn(16, DIN, device=tritonenv.DEV, requires_grad=True)
    y2 = layer(x2)
    (g,) = torch.autograd.grad(y2.square().sum(), x2, create_graph=True)
    with pytest.raises(TypeError, match=r"layer 'blocks\.1\.fc'.*differentiated once"):
        (y2.sum() + g.sum()).backward()


def test_inputs_of_any_layout_dtype_and_rank_give_the_references_bits():
    """2-D/3-D/4-D, transposed and strided views, float16/bfloat16/float64 inputs: y, dx, dW of fpsim.linear on
    the float32 values of the input (outputs rounded to the input's dtype)."""
    rng, w = _weights(2)
    base = torch.from_numpy((rng.standard_t(4, (64, DIN)) * 0.5).astype(np.float32))
    cases = [base.reshape(4, 16, DIN), base.reshape(2, 2, 16, DIN), base.reshape(16, 4, DIN).transpose(0, 1),
             base.t().contiguous().t(), base[::1, :].to(torch.bfloat16), base.to(torch.float16), base.double()]
    for xin in cases:
        xt = xin.detach().clone().requires_grad_(True) if xin.is_contiguous() else xin.detach().requires_grad_(True)
        layer = _layer(w)
        y = layer(xt)
        dy = torch.from_numpy((rng.standard_normal(y.shape) * 1e-3).astype(np.float32)).to(y.dtype)
        y.backward(dy)
        ref = fpsim.linear(xt.detach().float().reshape(-1, DIN).numpy(), w, dy.float().reshape(-1, DOUT).numpy(),
                           "nvfp4_paper", seed=3, layer="blocks.1.fc", step=2)
        assert y.dtype == xt.dtype and xt.grad.dtype == xt.dtype and y.shape == (*xt.shape[:-1], DOUT)
        assert torch.equal(y.detach().reshape(-1, DOUT), torch.from_numpy(ref.y).to(y.dtype))
        assert torch.equal(xt.grad.reshape(-1, DIN), torch.from_numpy(ref.dx).to(xt.dtype))
        assert _same(layer.weight.grad.numpy(), ref.dw)


def test_double_backward_is_refused_naming_the_layer_instead_of_dropping_the_term():
    """The layer's backward is not differentiable: a gradient penalty through it lost its own gradient silently
    (create_graph gave a dx without grad_fn) or failed with autograd's "does not require grad"."""
    layer = _layer(_weights(3)[1])
    other = torch.nn.Linear(DIN, DIN)
    x = torch.randn(16, DIN, requires_grad=True)
    y = layer(other(x))
    (g,) = torch.autograd.grad(y.square().sum(), x, create_graph=True)
    with pytest.raises(TypeError, match=r"layer 'blocks\.1\.fc'.*differentiated once"):
        (y.sum() + g.square().sum()).backward()
    z = layer(x)  # a plain create_graph backward that is not differentiated again still works
    (gz,) = torch.autograd.grad(z.sum(), x, create_graph=True)
    assert gz.shape == x.shape


def test_torch_func_transforms_are_refused_naming_the_layer():
    from torch.func import functional_call, grad, vmap

    layer = _layer(_weights(4)[1])
    x = torch.randn(16, DIN)
    with pytest.raises(TypeError, match=r"layer 'blocks\.1\.fc'.*torch\.func"):
        grad(lambda p: functional_call(layer, p, (x,)).sum())(dict(layer.named_parameters()))
    with pytest.raises(TypeError, match=r"layer 'blocks\.1\.fc'.*torch\.func"):
        vmap(layer)(torch.randn(2, 16, DIN))


# ---- convert ---------------------------------------------------------------------------------------------------

class _Bertish(torch.nn.Module):
    """A BERT-like MLM head: its decoder is tied to the word embeddings under a name no head pattern knows."""

    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(50, 32)
        self.blocks = torch.nn.ModuleList(torch.nn.Linear(32, 32) for _ in range(2))
        self.cls = torch.nn.Module()
        self.cls.transform = torch.nn.Linear(32, 32)
        self.cls.decoder = torch.nn.Linear(32, 50, bias=False)
        self.cls.decoder.weight = self.emb.weight


def test_a_linear_tied_to_an_embedding_stays_high_precision_whatever_its_name():
    """§8: the LM head is never quantized; a head tied to the embedding (BERT's cls.predictions.decoder,
    fairseq's output_projection) was quantized because its name matched no HEAD_PATTERNS entry."""
    m = fnn.convert(_Bertish(), "nvfp4_paper", keep_bf16=[], gemm="fp32")
    assert type(m.cls.decoder) is torch.nn.Linear and m.cls.decoder.weight is m.emb.weight
    assert [n for n, *_ in fnn.summary(m)] == ["blocks.0", "blocks.1", "cls.transform"]


class _Scaled(torch.nn.Linear):
    def forward(self, x):
        return super().forward(x) * 2


class _PlainSub(torch.nn.Linear):
    pass


def test_a_linear_whose_forward_convert_would_drop_is_refused_naming_it():
    """A subclass (or instance) with its own forward was swapped for fpsim.torch.Linear: its forward vanished."""
    with pytest.raises(TypeError, match=r"layer '1'.*_Scaled.*own forward.*skip="):
        fnn.convert(torch.nn.Sequential(torch.nn.Linear(16, 16), _Scaled(16, 16)), "nvfp4_paper")
    inst = torch.nn.Sequential(torch.nn.Linear(16, 16))
    inst[0].forward = lambda x: x
    with pytest.raises(TypeError, match=r"layer '0'.*own forward"):
        fnn.convert(inst, "nvfp4_paper")
    m = fnn.convert(torch.nn.Sequential(_PlainSub(16, 16)), "nvfp4_paper", keep_bf16=[])
    assert isinstance(m[0], fnn.Linear)  # nn.Linear's forward: swapped (MultiheadAttention's out_proj class)


@pytest.mark.parametrize("how", ["parametrize", "weight_norm", "old_weight_norm"])
def test_a_parametrized_weight_is_refused_naming_the_layer(how):
    """torch's "cannot assign 'torch.FloatTensor' as parameter 'weight'" named no layer."""
    lin = torch.nn.Linear(16, 16)
    if how == "parametrize":
        from torch.nn.utils import parametrize

        class _Sym(torch.nn.Module):
            def forward(self, w):
                return w.triu() + w.triu(1).T

        parametrize.register_parametrization(lin, "weight", _Sym())
    elif how == "weight_norm":
        lin = torch.nn.utils.parametrizations.weight_norm(lin)
    else:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            lin = torch.nn.utils.weight_norm(lin)
    with pytest.raises(TypeError, match=r"layer 'blocks\.0'.*parametrized.*remove"):
        fnn.convert(_holder(lin), "nvfp4_paper")


def _holder(lin):
    m = torch.nn.Module()
    m.blocks = torch.nn.Sequential(lin)
    return m


def test_hooks_on_a_converted_linear_keep_running_and_their_handles_still_remove_them():
    """A forward (pre-)hook registered on an nn.Linear (activation capture) silently stopped firing."""
    lin = torch.nn.Linear(32, 32)
    seen = []
    h1 = lin.register_forward_hook(lambda mod, i, o: seen.append(("post", type(mod).__name__)))
    lin.register_forward_pre_hook(lambda mod, i: seen.append(("pre", type(mod).__name__)))
    m = fnn.convert(torch.nn.Sequential(lin), "nvfp4_paper", keep_bf16=[], gemm="fp32")
    m(torch.randn(16, 32))
    assert seen == [("pre", "Linear"), ("post", "Linear")] and isinstance(m[0], fnn.Linear)
    h1.remove()
    m(torch.randn(16, 32))
    assert seen[2:] == [("pre", "Linear")]


def test_multihead_attentions_out_proj_is_not_listed_as_quantized():
    """nn.MultiheadAttention computes out_proj with F.linear on its weight, never calling the module: convert
    swapped it and summary() listed it under the recipe while it ran in float32."""
    enc = torch.nn.TransformerEncoderLayer(32, 4, 64, batch_first=True)
    fnn.convert(enc, "nvfp4_paper", keep_bf16=[], gemm="fp32")
    assert [n for n, *_ in fnn.summary(enc)] == ["linear1", "linear2"]
    assert not isinstance(enc.self_attn.out_proj, fnn.Linear)
    enc(torch.randn(2, 16, 32)).sum().backward()


def test_keep_bf16_names_and_patterns_that_match_no_layer_warn():
    """A typo in keep_bf16 (names of a LayerPolicy, or glob patterns) quantized the layer meant to stay BF16
    without a word."""
    def net():
        return torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 16))

    with pytest.warns(UserWarning, match=r"keep_bf16.*'blocks\.0\.attn'.*match no"):
        fnn.convert(net(), "nvfp4_paper", keep_bf16=LayerPolicy(names=("blocks.0.attn", "0")))
    with pytest.warns(UserWarning, match=r"keep_bf16.*'attn\.\*'.*match no"):
        fnn.convert(net(), "nvfp4_paper", keep_bf16=["attn.*", "2"])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fnn.convert(net(), "nvfp4_paper", keep_bf16=["0"])  # every pattern matched: silent
        fnn.convert(net(), "nvfp4_paper")  # the default skip patterns need not match


def test_convert_checks_gemm_before_touching_layers_it_converted_before():
    m = fnn.convert(torch.nn.Sequential(torch.nn.Linear(16, 16)), "nvfp4_paper", keep_bf16=[])
    with pytest.raises(ValueError, match="gemm must be one of"):
        fnn.convert(m, "nvfp4_paper", keep_bf16=[], gemm="fast")
    assert m[0].gemm == "blas"


def test_convert_on_nested_containers_shared_bf16_meta_and_twice():
    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            shared = torch.nn.Linear(32, 32)
            self.blocks = torch.nn.ModuleList(torch.nn.ModuleDict(
                {"attn": shared if i < 2 else torch.nn.Linear(32, 32),
                 "mlp": torch.nn.Sequential(torch.nn.Linear(32, 64, bias=False), torch.nn.GELU(),
                                            torch.nn.Linear(64, 32))}) for i in range(3))

        def forward(self, x):
            for b in self.blocks:
                x = x + b["mlp"](b["attn"](x))
            return x

    with torch.device("meta"):
        m = Net()
    fnn.convert(m, "nvfp4_paper", keep_bf16=[], gemm="fp32", seed=1)
    m.to_empty(device="cpu")
    for p in m.parameters():
        torch.nn.init.normal_(p, std=0.1)
    m = m.to(torch.bfloat16)
    assert m.blocks[0]["attn"] is m.blocks[1]["attn"] and m.blocks[1]["attn"].name == "blocks.0.attn"
    assert len(fnn.summary(m)) == 8
    x = torch.randn(2, 16, 32, dtype=torch.bfloat16, requires_grad=True)
    m(x).float().sum().backward()
    assert x.grad.dtype == torch.bfloat16 and all(p.grad.dtype == torch.bfloat16 for p in m.parameters())
    fnn.convert(m, "mxfp4", keep_bf16=[], gemm="fp32", seed=4)
    assert {(r, g) for _, r, g in fnn.summary(m)} == {("mxfp4", "fp32")} and m.blocks[2]["attn"].seed == 4


# ---- state and determinism ---------------------------------------------------------------------------------------

def _mlp(seed=0):
    torch.manual_seed(seed)
    m = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 32))
    return fnn.convert(m, "nvfp4_paper", keep_bf16=[], gemm="fp32", seed=5)


@pytest.mark.parametrize("opt", ["sgd", "adamw"])
def test_resuming_with_set_step_reproduces_the_uninterrupted_run_bit_for_bit(opt):
    make = {"sgd": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
            "adamw": lambda p: torch.optim.AdamW(p, lr=1e-2)}[opt]
    g = torch.Generator().manual_seed(1)
    data = [(torch.randn(16, 32, generator=g), torch.randn(16, 32, generator=g)) for _ in range(4)]

    def train(m, o, batches):
        for x, t in batches:
            o.zero_grad()
            (m(x) - t).square().mean().backward()
            o.step()

    m = _mlp()
    o = make(m.parameters())
    fnn.step_with(o, m)
    train(m, o, data)
    m1 = _mlp()
    o1 = make(m1.parameters())
    fnn.step_with(o1, m1)
    train(m1, o1, data[:2])
    buf = io.BytesIO()
    torch.save({"model": m1.state_dict(), "opt": o1.state_dict()}, buf)
    buf.seek(0)
    ck = torch.load(buf, weights_only=True)
    assert list(ck["model"]) == list(torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(),
                                                         torch.nn.Linear(64, 32)).state_dict())
    for set_it in (True, False):
        m2 = _mlp(seed=9)
        o2 = make(m2.parameters())
        m2.load_state_dict(ck["model"])
        o2.load_state_dict(ck["opt"])
        fnn.step_with(o2, m2)
        if set_it:
            fnn.set_step(m2, 2)
        train(m2, o2, data[2:])
        equal = all(torch.equal(a, b) for a, b in zip(m.parameters(), m2.parameters()))
        assert equal == set_it  # without set_step the SR bits of steps 0, 1 are drawn again
    twin = copy.deepcopy(m)
    x = torch.randn(16, 32)
    assert torch.equal(twin(x), m(x)) and twin[0].step == m[0].step == 4


@pytest.mark.parametrize("bad", [2.7, 0.5, True, "3", None])
def test_a_step_that_is_not_an_integer_is_refused(bad):
    """set_step(model, 2.7) silently set step 2, step(model, 0.5) advanced by 0: the SR bits of another step."""
    m = _mlp()
    with pytest.raises(TypeError, match="integer"):
        fnn.set_step(m, bad)
    with pytest.raises(TypeError, match="integer"):
        fnn.step(m, bad)
    assert m[0].step == 0
    fnn.set_step(m, np.int64(3))
    assert fnn.step(m, torch.tensor(2)) == 5 and type(m[0].step) is int


_CHILD = """
import numpy as np, torch
from fpsim.torch import nn as fnn
torch.manual_seed(0)
out = []
for name in ("blocks.0.q", "blocks.0.k"):
    lay = fnn.Linear(64, 48, recipe="nvfp4_paper", name=name, seed=11, gemm="fp32")
    lay.step = 3
    x = torch.randn(32, 64, requires_grad=True)
    lay(x).backward(torch.randn(32, 48) * 1e-3)
    out.append(np.concatenate([x.grad.numpy().ravel(), lay.weight.grad.numpy().ravel()]))
np.save(__import__("sys").argv[1], np.stack(out))
"""


def test_same_seed_same_bits_in_two_fresh_processes_and_names_draw_different_bits(tmp_path):
    runs = []
    for i, hseed in enumerate(("1", "2")):
        path = tmp_path / f"r{i}.npy"
        env = {**os.environ, "PYTHONHASHSEED": hseed}
        subprocess.run([sys.executable, "-c", _CHILD, str(path)], check=True, env=env, timeout=300)
        runs.append(np.load(path))
    assert runs[0].tobytes() == runs[1].tobytes()
    # one layer's weights under two names: the SR bits (and so dX, dW) differ
    rng, w = _weights(5)
    x = torch.from_numpy(rng.standard_normal((32, DIN)).astype(np.float32))
    dy = torch.from_numpy((rng.standard_normal((32, DOUT)) * 1e-3).astype(np.float32))
    grads = []
    for name in ("blocks.0.q", "blocks.0.k"):
        layer = _layer(w)
        layer.name = name
        xt = x.clone().requires_grad_(True)
        layer(xt).backward(dy)
        grads.append((xt.grad, layer.weight.grad))
    assert not torch.equal(grads[0][0], grads[1][0]) and not torch.equal(grads[0][1], grads[1][1])


def test_summary_rows_are_what_the_layers_run():
    """summary() names the recipe each layer's forward uses: compare every row with the layer's own output
    against a Linear built with that recipe by hand."""
    m = fnn.convert(_mlp(), "nvfp4_paper", keep_bf16=["2"], gemm="fp32")
    fnn.set_recipe(m, None, layers="0")
    rows = fnn.summary(m)
    assert rows == [("0", "none", "fp32"), ("2", "bf16", "fp32")]
    x = {"0": torch.randn(16, 32), "2": torch.randn(16, 64)}
    for name, rec, g in rows:
        lay = dict(m.named_modules())[name]
        ref = fnn.Linear(lay.in_features, lay.out_features, recipe=None if rec == "none" else rec, name=name,
                         seed=5, gemm=g)
        ref.load_state_dict(lay.state_dict())
        assert torch.equal(ref(x[name]), lay(x[name]))
