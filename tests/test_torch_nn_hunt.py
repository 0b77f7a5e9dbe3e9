"""fpsim.torch.Linear / convert beyond the presets: every recipe option equals fpsim.linear bit for bit, and
convert swaps every place a Linear is held."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import fpsim
from fpsim.recipe import ROLES, LayerPolicy, OperandPolicy, Recipe, get_recipe

torch = pytest.importorskip("torch")
fnn = pytest.importorskip("fpsim.torch.nn")


def _data(t, din, dout, seed=0):
    rng = np.random.default_rng(seed)
    x = (rng.standard_t(4, (t, din)) * 0.5).astype(np.float32)
    w = (rng.standard_normal((dout, din)) / 8).astype(np.float32)
    dy = (rng.standard_normal((t, dout)) * 1e-3).astype(np.float32)
    return x, w, dy


def _layer_and_ref(rec, t=32, din=64, dout=48):
    x, w, dy = _data(t, din, dout)
    layer = fnn.Linear(din, dout, bias=False, recipe=rec, name="blocks.1.fc", seed=3, gemm="fp32")
    with torch.no_grad():
        layer.weight.copy_(torch.from_numpy(w))
    layer.step = 4
    xt = torch.from_numpy(x).requires_grad_(True)
    y = layer(xt)
    y.backward(torch.from_numpy(dy))
    got = (y.detach().numpy(), xt.grad.numpy(), layer.weight.grad.numpy())
    return got, fpsim.linear(x, w, dy, rec, seed=3, layer="blocks.1.fc", step=4)


def _same(a, b):
    return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()


def _pair(a, b):
    """Every GEMM multiplies an ``a`` copy by a ``b`` copy."""
    return Recipe(f"{a}x{b}", *(OperandPolicy(s) for s in (a, b, a, b, a, b)))


@pytest.mark.parametrize("rec", [
    _pair("bf16", "nvfp4"), _pair(None, "fp8_e4m3"), _pair("fp8_block128", "bf16"),
    dataclasses.replace(get_recipe("nvfp4_paper").replace_roles(["fprop_w", "dgrad_w"], scheme="bf16", block=None),
                        name="bf16_weights"),
    Recipe("rht_mix", *(OperandPolicy("nvfp4") for _ in ROLES[:4]), OperandPolicy(None, rht=16),
           OperandPolicy("fp8_block128", rht=16)),
], ids=lambda r: r.name)
def test_a_plain_or_cast_copy_beside_a_scaled_one_equals_fpsim_linear(rec):
    """The reference GEMM of a plain/cast operand and a block-scaled one sums in the scaled one's chunks and applies
    its alpha last; the layer used to multiply the dequantized values instead (off in the last bits)."""
    (y, dx, dw), ref = _layer_and_ref(rec)
    assert _same(y, ref.y) and _same(dx, ref.dx) and _same(dw, ref.dw)


@pytest.mark.parametrize("acc", ["truncated", "exact"])
def test_the_recipes_accumulator_is_the_layers_model(acc):
    """Recipe.accumulator is part of the recipe: gemm="fp32" runs it (exact's float64 rounded to float32 once)."""
    rec = dataclasses.replace(get_recipe("fp8_current"), accumulator=acc)
    (y, dx, dw), ref = _layer_and_ref(rec, t=32, din=512, dout=32)
    assert _same(y, ref.y.astype(np.float32)) and _same(dx, ref.dx.astype(np.float32))
    assert _same(dw, ref.dw.astype(np.float32))
    with pytest.raises(ValueError, match=f"recipe fp8_current asks for the '{acc}' accumulator.*gemm='fp32'"):
        fnn.Linear(512, 32, recipe=rec, gemm="blas")(torch.zeros(32, 512))


def test_a_wrong_feature_count_is_one_clear_error_naming_the_layer():
    layer = fnn.Linear(64, 48, recipe="nvfp4_paper", name="blocks.0.fc1", gemm="fp32")
    with pytest.raises(ValueError, match=r"blocks\.0\.fc1: input \(32, 63\) has 63 features .* takes 64"):
        layer(torch.zeros(32, 63))


class _Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj_in = torch.nn.Linear(16, 16)
        self.blocks = torch.nn.ModuleList(torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Linear(16, 16))
                                          for _ in range(4))


def test_layer_policy_names_outside_the_blocks_stay_bf16():
    """LayerPolicy.names "adds explicit layer names": a named layer outside every block is one of them."""
    m = fnn.convert(_Net(), "nvfp4_paper", keep_bf16=LayerPolicy(names=("proj_in", "blocks.1.0")), gemm="fp32")
    assert {n for n, r, _ in fnn.summary(m) if r == "bf16"} == {"proj_in", "blocks.1.0"}


def test_convert_swaps_a_reused_linear_in_every_place_it_is_held():
    lin = torch.nn.Linear(16, 16)
    seq = torch.nn.Sequential(lin, torch.nn.ReLU(), lin)
    fnn.convert(seq, "nvfp4_paper", keep_bf16=[], gemm="fp32")
    assert isinstance(seq[2], fnn.Linear) and seq[2] is seq[0] and seq[0].weight is lin.weight


def test_convert_of_a_bare_linear_is_a_clear_error():
    with pytest.raises(TypeError, match=r"cannot replace the model itself.*Linear\.from_linear"):
        fnn.convert(torch.nn.Linear(16, 16), "nvfp4_paper")


@pytest.mark.parametrize("roles, din, dout, msg", [
    (["fprop_x", "fprop_w"], 40, 48, "fprop_x rotates along the 40 in_features"),
    (["dgrad_dy", "dgrad_w"], 64, 20, "dgrad_dy rotates along the 20 out_features"),
])
def test_a_feature_rht_the_layer_cannot_take_is_refused_in_forward_naming_the_layer(roles, din, dout, msg):
    rec = get_recipe("nvfp4_paper").replace_roles(roles, rht=16)
    layer = fnn.Linear(din, dout, recipe=rec, name="blocks.2.fc", gemm="fp32")
    with pytest.raises(ValueError, match=rf"layer blocks\.2\.fc: {msg}, not a multiple of its Hadamard size 16"):
        layer(torch.zeros(32, din))


def test_step_does_not_go_backwards():
    """step(model, -3) took every layer's step negative, a value set_step refuses (steps seed the SR bits)."""
    from fpsim.torch import Linear, set_step, step

    m = torch.nn.Sequential(Linear(16, 16, recipe="nvfp4_paper", name="a"))
    set_step(m, 2)
    with pytest.raises(ValueError, match="set_step"):
        step(m, -3)
    assert step(m) == 3
