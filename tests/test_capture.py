"""fpsim.capture: recording nn.Linear weights / inputs / output gradients into a safetensors file (torch extra)."""

from __future__ import annotations

import json
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest

from fpsim.analysis import guess_role
from fpsim.io import open_tensors


def test_import_fpsim_does_not_import_torch():
    code = "import sys, fpsim, fpsim.io, fpsim.analysis, fpsim.capture; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


torch = pytest.importorskip("torch", reason="torch not installed (optional extra: pip install 'fpsim[torch]')")

from fpsim.capture import capture  # noqa: E402


class MLP(torch.nn.Module):
    def __init__(self, d_in=32, d_hid=48, d_out=16):
        super().__init__()
        self.fc1 = torch.nn.Linear(d_in, d_hid)
        self.act = torch.nn.ReLU(inplace=True)  # in-place op right after a Linear output
        self.fc2 = torch.nn.Linear(d_hid, d_out)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


@pytest.fixture
def model():
    torch.manual_seed(0)
    return MLP()


@pytest.fixture(params=[(4, 5), (20,)], ids=["rank3", "rank2"])
def batch(request):
    """(batch, seq, features) inputs make the Linear output a view; (tokens, features) do not."""
    g = torch.Generator().manual_seed(1)
    lead = request.param
    return torch.randn(*lead, 32, generator=g), torch.randn(*lead, 16, generator=g)


def _load(path):
    return {r.name: r.load() for r in open_tensors([str(path)])}


def _meta(path):
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        return json.loads(f.read(n)).get("__metadata__", {})


def _reference(model, x, y):
    """Linear inputs and autograd gradients w.r.t. each Linear's output, via retain_grad on a manual forward."""
    h1 = model.fc1(x)
    h1.retain_grad()
    a = torch.relu(h1)
    h2 = model.fc2(a)
    h2.retain_grad()
    torch.nn.functional.mse_loss(h2, y).backward()
    model.zero_grad()
    return {"fc1.input": x, "fc1.grad_output": h1.grad, "fc2.input": a, "fc2.grad_output": h2.grad}


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_names_shapes_dtypes_and_values(tmp_path, model, batch, dtype):
    x, y = batch
    path = tmp_path / "cap.safetensors"
    plain = model(x).detach()
    with capture(model, path, dtype=dtype, step=7) as cap:
        out = model(x)
        torch.nn.functional.mse_loss(out, y).backward()
        assert not path.exists()  # written on exit only
    torch.testing.assert_close(out.detach(), plain, rtol=0, atol=0)  # the capture does not change the model
    model.zero_grad()
    got = _load(path)
    assert list(got) == ["fc1.weight", "fc1.input", "fc1.grad_output", "fc2.weight", "fc2.input", "fc2.grad_output"]
    assert cap.names() == list(got)
    act = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(np.float32)
    expect = {"fc1.weight": ((48, 32), np.float32), "fc1.input": ((20, 32), act), "fc1.grad_output": ((20, 48), act),
              "fc2.weight": ((16, 48), np.float32), "fc2.input": ((20, 48), act), "fc2.grad_output": ((20, 16), act)}
    for name, (shape, dt) in expect.items():
        assert got[name].shape == shape and got[name].dtype == np.dtype(dt), name

    # weights equal the parameters exactly
    np.testing.assert_array_equal(got["fc1.weight"], model.fc1.weight.detach().numpy())
    np.testing.assert_array_equal(got["fc2.weight"], model.fc2.weight.detach().numpy())
    # inputs and output gradients equal autograd's (cast like the capture: RNE to bf16, or exact)
    ref = _reference(model, x, y)
    for name, t in ref.items():
        t = t.detach().reshape(got[name].shape)
        if dtype == "bfloat16":
            t = t.to(torch.bfloat16).float()
        np.testing.assert_array_equal(got[name].astype(np.float32), t.numpy(), err_msg=name)
        assert np.any(got[name] != 0), name

    meta = _meta(path)
    assert meta["model"] == "MLP" and meta["dtype"] == dtype and meta["step"] == "7"
    assert meta["torch"] == torch.__version__ and meta["weight_dtype"] == "float32"


def _n_hooks(model):
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) + len(m._backward_hooks) for m in model.modules())


def test_hooks_removed_after_exit(tmp_path, model, batch):
    x, y = batch
    path = tmp_path / "cap.safetensors"
    n0 = _n_hooks(model)
    with capture(model, path):
        assert _n_hooks(model) > n0
        torch.nn.functional.mse_loss(model(x), y).backward()
    assert _n_hooks(model) == n0
    before = path.read_bytes()
    model.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()  # runs again, records and writes nothing
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["cap.safetensors"]


def test_exception_writes_nothing_and_removes_hooks(tmp_path, model, batch):
    x, y = batch
    path = tmp_path / "cap.safetensors"
    n0 = _n_hooks(model)
    with pytest.raises(KeyError, match="boom"), capture(model, path):
        torch.nn.functional.mse_loss(model(x), y).backward()
        raise KeyError("boom")
    assert not path.exists() and list(tmp_path.iterdir()) == []
    assert _n_hooks(model) == n0


def test_backward_after_exit_is_not_recorded_and_warns(tmp_path, model, batch):
    x, y = batch
    path = tmp_path / "cap.safetensors"
    with pytest.warns(RuntimeWarning, match=r"no gradient recorded for fc1.grad_output, fc2.grad_output"):
        with capture(model, path):
            out = model(x)  # forward only inside the block
    torch.nn.functional.mse_loss(out, y).backward()  # the per-call gradient hooks are gone already
    assert list(_load(path)) == ["fc1.weight", "fc1.input", "fc2.weight", "fc2.input"]


def test_repeated_calls_get_suffixes_and_matching_gradients(tmp_path):
    torch.manual_seed(0)
    lin = torch.nn.Linear(8, 8)
    model = torch.nn.Sequential()
    model.add_module("shared", lin)
    x = torch.randn(3, 8)
    path = tmp_path / "cap.safetensors"
    with capture(model, path, dtype="float32") as cap:
        h = lin(x)
        h2 = lin(torch.tanh(h) * 3.0)  # second call of the same module, different input and gradient
        (h2.square().sum() + h.sum()).backward()
    assert cap.names() == ["shared.weight", "shared.input", "shared.grad_output",
                           "shared.input#1", "shared.grad_output#1"]
    got = _load(path)
    # reference gradients by retain_grad
    h = lin(x)
    h.retain_grad()
    a = torch.tanh(h) * 3.0
    h2 = lin(a)
    h2.retain_grad()
    (h2.square().sum() + h.sum()).backward()
    np.testing.assert_array_equal(got["shared.input"], x.numpy())
    np.testing.assert_array_equal(got["shared.input#1"], a.detach().numpy())
    np.testing.assert_array_equal(got["shared.grad_output"], h.grad.numpy())
    np.testing.assert_array_equal(got["shared.grad_output#1"], h2.grad.numpy())
    assert {guess_role(n) for n in got} == {"weight", "activation", "gradient"}
    assert guess_role("shared.input#1") == "activation" and guess_role("shared.grad_output#1") == "gradient"


def test_modules_glob_and_max_tokens(tmp_path, model, batch):
    x, y = batch
    path = tmp_path / "cap.safetensors"
    with capture(model, path, modules="fc2*", max_tokens=6) as cap:
        torch.nn.functional.mse_loss(model(x), y).backward()
    got = _load(path)
    assert list(got) == ["fc2.weight", "fc2.input", "fc2.grad_output"] == cap.names()
    assert got["fc2.input"].shape == (6, 48) and got["fc2.grad_output"].shape == (6, 16)
    ref = _reference(model, x, y)
    np.testing.assert_array_equal(got["fc2.grad_output"].astype(np.float32),
                                  ref["fc2.grad_output"].reshape(-1, 16)[:6].to(torch.bfloat16).float().numpy())
    assert _meta(path)["max_tokens"] == "6"


def test_bad_arguments(tmp_path, model):
    with pytest.raises(ValueError, match="dtype"):
        capture(model, tmp_path / "a.safetensors", dtype="float16")
    with pytest.raises(ValueError, match=".safetensors"):
        capture(model, tmp_path / "a.npz")
    with pytest.raises(ValueError, match="max_tokens"):
        capture(model, tmp_path / "a.safetensors", max_tokens=0)
    with pytest.raises(ValueError, match="no nn.Linear module matches"), capture(model, tmp_path / "a.safetensors",
                                                                                   modules=["nope*"]):
        pass
    with pytest.raises(RuntimeError, match="no selected nn.Linear ran"), capture(model, tmp_path / "b.safetensors"):
        pass
    assert list(tmp_path.iterdir()) == []
    assert _n_hooks(model) == 0


def test_fpsim_analyze_reads_the_capture(tmp_path, model, batch):
    from click.testing import CliRunner

    from fpsim_cli.main import main

    x, y = batch
    path = tmp_path / "cap.safetensors"
    with capture(model, path):
        torch.nn.functional.mse_loss(model(x), y).backward()
    res = CliRunner().invoke(main, ["analyze", str(path), "--formats", "nvfp4", "--seeds", "0"])
    assert res.exit_code == 0, res.output
    for name in ("fc1.weight", "fc2.input", "fc2.grad_output"):
        assert f"cap.safetensors:{name}" in res.output
    res = CliRunner().invoke(main, ["analyze", str(path), "--formats", "nvfp4", "--seeds", "0", "--format", "json"])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.output[res.output.index("{"):])["rows"]
    roles = {r["tensor"].split(":", 1)[1]: r["role"] for r in rows}
    assert roles == {"fc1.weight": "weight", "fc1.input": "activation", "fc1.grad_output": "gradient",
                     "fc2.weight": "weight", "fc2.input": "activation", "fc2.grad_output": "gradient"}


def test_demo_writes_an_analyzable_capture(tmp_path, capsys):
    from fpsim.capture import main

    out = tmp_path / "demo.safetensors"
    assert main(["--demo", str(out), "--steps", "2"]) == 0
    refs = open_tensors([str(out)])
    assert [r.name for r in refs] == [f"{m}.{k}" for m in ("fc1", "fc2", "head")
                                      for k in ("weight", "input", "grad_output")]
    assert _meta(out)["model"] == "TinyLM" and _meta(out)["step"] == "2"
    assert all(np.isfinite(r.load().astype(np.float32)).all() for r in refs)


def test_capture_max_tokens_true_is_refused(tmp_path):
    """max_tokens=True is refused: a bool is not a count (it would pass an int check and mean 1 token)."""
    from fpsim.capture import Capture

    with pytest.raises(ValueError, match="max_tokens"):
        Capture(torch.nn.Linear(4, 4), tmp_path / "c.safetensors", max_tokens=True)
