"""fpsim.torch.Linear / convert: the training layer equals fpsim.linear bit for bit under gemm="fp32", for the
presets and for every recipe option beyond them, and convert swaps every place a Linear is held."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import fpsim
from fpsim.recipe import ROLES, LayerPolicy, OperandPolicy, Recipe, get_recipe

torch = pytest.importorskip("torch")
fnn = pytest.importorskip("fpsim.torch.nn")

TOK, DIN, DOUT = 32, 64, 48  # tokens a multiple of the RHT sizes (16, 32); out not a multiple of 32 (padded blocks)


def _recipes():
    base = get_recipe("nvfp4_paper")
    out = [get_recipe(n) for n in ("nvfp4_paper", "mxfp4", "fp8_current", "fp8_blockwise", "bf16", "fp32")]
    out += [base.without(c) for c in ("sr", "rht", "2d", "bf16_layers")]
    out += [base.only("forward"), base.only("backward"), base.variant(four_over_six=True),
            base.variant(four_over_six=True, four_over_six_metric="mae"), base.variant(per_row_scale=True)]
    out.append(base.replace_roles(["dgrad_w"], block=(1, 16)).__class__(**{
        **{f: getattr(base, f) for f in base.__dataclass_fields__}, "name": "from_fprop", "dgrad_w_from_fprop": True}))
    return out


def _data(seed=0):
    rng = np.random.default_rng(seed)
    x = (rng.standard_t(4, (2, TOK // 2, DIN)) * 0.5).astype(np.float32)
    x[0, 3, 5] = 40.0  # an outlier channel value
    w = (rng.standard_normal((DOUT, DIN)) / 8).astype(np.float32)
    dy = (rng.standard_normal((2, TOK // 2, DOUT)) * 1e-3).astype(np.float32)
    return x, w, dy


def _run(layer, x, dy):
    xt = torch.from_numpy(x).requires_grad_(True)
    y = layer(xt)
    y.backward(torch.from_numpy(dy))
    return y.detach().numpy(), xt.grad.numpy(), layer.weight.grad.numpy()


def _same(a, b):
    return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()


@pytest.mark.parametrize("rec", _recipes(), ids=lambda r: r.name)
def test_linear_fp32_equals_fpsim_linear_bit_for_bit(rec):
    """y, dx and dW of Linear(gemm="fp32") named L, seed k, step s are fpsim.linear(..., seed=k, layer=L, step=s)'s."""
    x, w, dy = _data()
    layer = fnn.Linear(DIN, DOUT, bias=False, recipe=rec, name="blocks.3.fc1", seed=7, gemm="fp32")
    with torch.no_grad():
        layer.weight.copy_(torch.from_numpy(w))
    layer.step = 5
    y, dx, dw = _run(layer, x, dy)
    ref = fpsim.linear(x.reshape(TOK, DIN), w, dy.reshape(TOK, DOUT), rec, seed=7, layer="blocks.3.fc1", step=5)
    assert _same(y.reshape(TOK, DOUT), ref.y), "y"
    assert _same(dx.reshape(TOK, DIN), ref.dx), "dx"
    assert _same(dw, ref.dw), "dW"


def test_step_and_seed_change_the_stochastic_bits_and_nothing_else():
    x, w, dy = _data(1)
    outs = []
    for stp, seed in ((0, 0), (1, 0), (0, 1), (0, 0)):
        layer = fnn.Linear(DIN, DOUT, bias=False, recipe="nvfp4_paper", name="L", seed=seed, gemm="fp32")
        with torch.no_grad():
            layer.weight.copy_(torch.from_numpy(w))
        layer.step = stp
        outs.append(_run(layer, x, dy))
    assert _same(outs[0][0], outs[1][0]) and _same(outs[0][0], outs[2][0])  # Fprop has no SR: same y
    assert not _same(outs[0][1], outs[1][1]) and not _same(outs[0][1], outs[2][1])  # Dgrad's SR bits moved
    assert all(_same(a, b) for a, b in zip(outs[0], outs[3]))  # same (seed, step): same bits


@pytest.mark.parametrize("recipe", ["nvfp4_paper", "mxfp4", "fp8_blockwise", "bf16"])
def test_blas_and_host_gemms_keep_the_copies_and_bound_the_difference(recipe):
    """gemm="blas" and gemm="host" (the copies by the Numba backend) change only the summation order: within a
    few float32 ulps of the fp32 model's result, SR bits and RHT signs included."""
    x, w, dy = _data(2)
    res = {}
    for g in ("fp32", "blas", "host"):
        layer = fnn.Linear(DIN, DOUT, bias=False, recipe=recipe, name="L", seed=3, gemm=g)
        with torch.no_grad():
            layer.weight.copy_(torch.from_numpy(w))
        res[g] = _run(layer, x, dy)
    for g in ("blas", "host"):
        for a, b in zip(res["fp32"], res[g]):
            err = np.linalg.norm(a.astype(np.float64) - b) / np.linalg.norm(a.astype(np.float64))
            assert err < 1e-6, (g, err)


def test_bf16_inputs_leading_shape_bias_and_dtypes():
    x, w, dy = _data(3)
    layer = fnn.Linear(DIN, DOUT, bias=True, recipe="nvfp4_paper", gemm="fp32")
    xb = torch.from_numpy(x).to(torch.bfloat16).requires_grad_(True)
    y = layer(xb)
    assert y.dtype == torch.bfloat16 and y.shape == (2, TOK // 2, DOUT)
    y.float().sum().backward()
    assert xb.grad.dtype == torch.bfloat16 and layer.weight.grad.dtype == torch.float32
    assert torch.equal(layer.bias.grad, torch.full((DOUT,), float(TOK)))


def test_state_dict_is_nn_linears_and_from_linear_shares_parameters():
    lin = torch.nn.Linear(DIN, DOUT)
    q = fnn.Linear.from_linear(lin, recipe="mxfp4")
    assert q.weight is lin.weight and q.bias is lin.bias
    assert set(q.state_dict()) == set(lin.state_dict()) == {"weight", "bias"}
    q2 = fnn.Linear(DIN, DOUT, recipe="mxfp4")
    q2.load_state_dict(lin.state_dict())
    assert torch.equal(q2.weight, lin.weight)


def test_a_token_count_the_rht_cannot_take_is_one_clear_error():
    layer = fnn.Linear(DIN, DOUT, recipe="nvfp4_paper", name="blocks.0.attn.q")
    msg = r"blocks\.0\.attn\.q: 8 tokens .* multiple of the Wgrad RHT size 16 .*pad.*BF16"
    with pytest.raises(ValueError, match=msg):
        layer(torch.zeros(8, DIN))


class _Tiny(torch.nn.Module):
    def __init__(self, n=12):
        super().__init__()
        self.embed_proj = torch.nn.Linear(16, 16)
        self.blocks = torch.nn.ModuleList(torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Linear(16, 16))
                                          for _ in range(n))
        self.lm_head = torch.nn.Linear(16, 8)


def test_convert_keeps_the_head_and_the_recipes_first_and_last_blocks_in_bf16():
    m = fnn.convert(_Tiny(12), "nvfp4_paper", gemm="fp32")
    rows = dict((n, r) for n, r, _ in fnn.summary(m))
    assert isinstance(m.lm_head, torch.nn.Linear) and not isinstance(m.lm_head, fnn.Linear)
    assert not isinstance(m.embed_proj, fnn.Linear)
    bf = {n for n, r in rows.items() if r == "bf16"}
    want = {f"blocks.{b}.{j}" for b in (0, 1, 4, 5, 6, 7, 8, 9, 10, 11) for j in (0, 1)}  # first 2 + last 8 of 12
    assert bf == want
    assert rows["blocks.2.0"] == rows["blocks.3.1"] == "nvfp4_paper"


def test_convert_with_patterns_callables_and_set_recipe_and_step():
    m = fnn.convert(_Tiny(4), "mxfp4", keep_bf16=["blocks.0.*"])
    assert {n for n, r, _ in fnn.summary(m) if r == "bf16"} == {"blocks.0.0", "blocks.0.1"}
    m = fnn.convert(_Tiny(4), "mxfp4", keep_bf16=lambda name, mod: name.endswith(".1"))
    assert {n for n, r, _ in fnn.summary(m) if r == "bf16"} == {f"blocks.{b}.1" for b in range(4)}
    m = fnn.convert(_Tiny(4), "mxfp4", keep_bf16=LayerPolicy(last=1))
    assert {n for n, r, _ in fnn.summary(m) if r == "bf16"} == {"blocks.3.0", "blocks.3.1"}
    assert fnn.set_recipe(m, "bf16", layers="blocks.[12].*") == 4
    assert {n for n, r, _ in fnn.summary(m) if r == "bf16"} == {f"blocks.{b}.{j}" for b in (1, 2, 3) for j in (0, 1)}
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    fnn.step_with(opt, m)
    opt.step()
    opt.step()
    assert {lay.step for lay in m.modules() if isinstance(lay, fnn.Linear)} == {2}
    fnn.set_step(m, 10)
    assert fnn.step(m) == 11


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (runs on the device machine)")
@pytest.mark.parametrize("name", ["nvfp4_paper", "mxfp4", "fp8_current", "fp8_blockwise", "bf16"])
def test_linear_on_cuda_fp32_equals_fpsim_linear(name):
    """The fused Triton copies and the FP32 GEMM model on the GPU give fpsim.linear's bits (CPU reference)."""
    x, w, dy = _data(4)
    layer = fnn.Linear(DIN, DOUT, bias=False, recipe=name, name="blocks.1.fc2", seed=3, gemm="fp32").cuda()
    with torch.no_grad():
        layer.weight.copy_(torch.from_numpy(w))
    layer.step = 2
    xt = torch.from_numpy(x).cuda().requires_grad_(True)
    y = layer(xt)
    y.backward(torch.from_numpy(dy).cuda())
    ref = fpsim.linear(x.reshape(TOK, DIN), w, dy.reshape(TOK, DOUT), name, seed=3, layer="blocks.1.fc2", step=2)
    assert _same(y.detach().cpu().numpy().reshape(TOK, DOUT), ref.y)
    assert _same(xt.grad.cpu().numpy().reshape(TOK, DIN), ref.dx)
    assert _same(layer.weight.grad.cpu().numpy(), ref.dw)


def test_train_lm_smoke_runs_on_the_public_api(tmp_path):
    """studies/campaign/train_lm.py (study 8's trainer) builds its block linears as fpsim.torch.Linear and trains."""
    import json

    from studies.campaign import train_lm

    train_lm.main(["--tiny", "--runs", "nvfp4", "--steps", "2", "--out", str(tmp_path)])
    meta = json.loads((tmp_path / "runs.json").read_text())
    assert np.isfinite(meta["runs"]["nvfp4"]["final_val_loss"])
    assert (tmp_path / "nvfp4.csv").read_text().startswith("step,tokens,lr,train_loss")


# --- recipe options beyond the presets, and convert on every place a Linear is held -------------------------------


def _data_2d(t, din, dout, seed=0):
    rng = np.random.default_rng(seed)
    x = (rng.standard_t(4, (t, din)) * 0.5).astype(np.float32)
    w = (rng.standard_normal((dout, din)) / 8).astype(np.float32)
    dy = (rng.standard_normal((t, dout)) * 1e-3).astype(np.float32)
    return x, w, dy


def _layer_and_ref(rec, t=32, din=64, dout=48):
    x, w, dy = _data_2d(t, din, dout)
    layer = fnn.Linear(din, dout, bias=False, recipe=rec, name="blocks.1.fc", seed=3, gemm="fp32")
    with torch.no_grad():
        layer.weight.copy_(torch.from_numpy(w))
    layer.step = 4
    xt = torch.from_numpy(x).requires_grad_(True)
    y = layer(xt)
    y.backward(torch.from_numpy(dy))
    got = (y.detach().numpy(), xt.grad.numpy(), layer.weight.grad.numpy())
    return got, fpsim.linear(x, w, dy, rec, seed=3, layer="blocks.1.fc", step=4)


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
    its alpha last, not a product of the dequantized values (which is off in the last bits)."""
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
