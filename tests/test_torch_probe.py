"""fpsim.torch.probe: the metrics against hand-derived values, the isolated GEMMs against fpsim.linear, the model
left as it was, the component table's pairing, and the as-built check: three planted defects (each flagged on its
layer and GEMM only) and the false-flag rate of a correct model over 20 seeds."""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from fpsim.recipe import LayerPolicy, get_recipe, linear  # noqa: E402
from fpsim.torch import nn as fnn  # noqa: E402
from fpsim.torch import probe_stats as S  # noqa: E402
from fpsim.torch import probes as P  # noqa: E402
from studies.probes import flag_rate  # noqa: E402

# the small model of the flag-rate study: the planted-defect tests run the same model the committed rates measure
D, VOCAB, Tiny = flag_rate.D, flag_rate.VOCAB, flag_rate.TinyLM


def _batches(n, seed, tokens=32):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, VOCAB, (2, tokens // 2), generator=g) for _ in range(n)]


def _tiny(seed=0, blocks=2):
    torch.manual_seed(seed)
    return Tiny(blocks)


# --- the metrics ------------------------------------------------------------------------------------------------

def test_one_draw_metrics_are_the_formulas():
    g = torch.tensor([3.0, 4.0], dtype=torch.float64)  # ‖g‖ = 5
    q = torch.tensor([3.0, 3.0])  # e = (0, -1)
    m = S.row_metrics(g, [q])
    assert m["rel_err"] == pytest.approx(1 / 5)
    assert m["gain"] == pytest.approx((9 + 12) / 25)
    assert m["cos"] == pytest.approx(21 / (math.sqrt(18) * 5))
    assert m["bias"] == m["rel_err"] and m["noise"] == 0.0 and m["bias_se"] == 0.0 and m["bias_to_noise"] is None


def test_bias_and_noise_separate_a_shared_error_from_each_draws_own():
    """q_d = g·(1 − c) + n_d: the bias is c (the shared shrinkage), the noise σ√N/‖g‖, the gain 1 − c."""
    rng = np.random.default_rng(0)
    n, draws, c, sigma = 20000, 16, 0.03, 0.05
    g = torch.from_numpy(rng.standard_normal(n))
    qs = [(g * (1 - c) + torch.from_numpy(sigma * rng.standard_normal(n))).float() for _ in range(draws)]
    m = S.row_metrics(g, qs)
    gn = float(g.norm())
    assert m["gain"] == pytest.approx(1 - c, abs=2e-3)
    assert m["bias"] == pytest.approx(c, rel=0.03)
    assert m["noise"] == pytest.approx(sigma * math.sqrt(n) / gn, rel=0.05)
    assert 0 < m["bias_se"] < 0.01 and m["bias_to_noise"] == pytest.approx(m["bias"] / m["noise"])
    # pure noise: the noise-corrected bias is near zero (the plain norm of the mean error would be σ√(N/D)/‖g‖)
    m0 = S.row_metrics(g, [(g + torch.from_numpy(sigma * rng.standard_normal(n))).float() for _ in range(draws)])
    assert m0["bias"] < 0.3 * sigma * math.sqrt(n / draws) / gn


def test_identical_draws_give_the_one_draw_metrics_bit_for_bit():
    """A variant that draws no random bits gives the same result in every draw (Fprop under SR, say); its metrics
    over D identical draws must be those of one draw exactly.  A float mean of D equal values can be an ulp off
    (0.1 + 0.1 + 0.1 = 0.30000000000000004), and the paired test then "resolves" a 1e-16 effect over batches."""
    rng = np.random.default_rng(3)
    for _ in range(20):
        g = torch.from_numpy(rng.standard_normal(257))
        q = (g + torch.from_numpy(0.1 * rng.standard_normal(257))).float()
        one = S.row_metrics(g, [q])
        for d in (2, 3, 4, 7):
            assert S.row_metrics(g, [q] * d) == one


def test_a_draw_that_flushed_to_zero_has_no_cosine():
    """A draw whose every block flushed (q = 0) has no direction: its cosine is left out with a note, never the
    rounding noise of ‖q‖² computed through e = q − g; its gain is exactly 0."""
    rng = np.random.default_rng(5)
    for _ in range(10):
        g = torch.from_numpy(rng.standard_normal(1000) * 10.0 ** rng.uniform(-3, 3))
        zero = torch.zeros(1000)
        m = S.row_metrics(g, [zero])
        assert m["cos"] is None and m["gain"] == 0.0 and "all-zero" in m["note"]
        q = (g + torch.from_numpy(0.1 * rng.standard_normal(1000))).float()
        m2 = S.row_metrics(g, [zero, q, zero])
        assert m2["cos"] == pytest.approx(S.row_metrics(g, [q])["cos"], rel=1e-12)  # the one draw with a direction


def test_a_zero_reference_is_null_with_a_reason():
    m = S.row_metrics(torch.zeros(4, dtype=torch.float64), [torch.ones(4)])
    assert m["rel_err"] is None and m["note"] == "the reference is zero"


def test_holm_and_the_paired_test():
    assert S.holm([0.01, 0.04, None, 0.03]) == [pytest.approx(0.03), pytest.approx(0.06), None, pytest.approx(0.06)]
    s = S.paired_test(np.array([1.0, 2.0, 3.0]))
    assert s["mean"] == 2.0 and s["sd"] == 1.0 and s["p"] == pytest.approx(0.0742, abs=1e-3)
    assert s["ci_low"] == pytest.approx(2 - 4.3027 / math.sqrt(3), abs=1e-3)
    assert s["mde80"] == pytest.approx((4.3027 + 1.0607) / math.sqrt(3), abs=1e-3)
    assert S.paired_test(np.array([0.5]))["ci_low"] is None  # one batch: no interval


# --- the probe on a small model ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def small():
    m = _tiny()
    res = P.probe(m, _batches(3, 1), "nvfp4_paper", keep_bf16=LayerPolicy(last=1), draws=3,
                  loss_fn=P.next_token_loss, val_batches=_batches(2, 2))
    return m, res


def test_table_has_a_row_per_batch_layer_gemm_variant_and_mode(small):
    _, res = small
    vs = res.meta["variants"]
    assert set(vs) == {"bf16", "recipe", "without sr", "without rht", "without 2d", "without bf16_layers",
                       "four-over-six", "without tensor scale", "recipe A/A"}
    layers = ["blocks.0.up", "blocks.0.down", "blocks.1.up", "blocks.1.down"]
    assert res.meta["layers_measured"] == sorted(layers)
    assert len(res.table) == 3 * len(layers) * 3 * len(vs) * 2
    # without the tensor scale this model's small gradients underflow E4M3's block scales: every block of some
    # Dgrad / Wgrad results flushes to zero (rel_err 1, no cosine), which the rows say
    noted = res.table[res.table["note"].notna()]
    assert set(noted["variant"]) == {"without tensor scale"} and set(noted["gemm"]) <= {"dgrad", "wgrad"}
    assert noted["note"].str.contains("all-zero result").all() and (noted["rel_err"] > 0.99).all()
    # the recipe's random variants drew 3 times in isolation, the deterministic ones once
    iso = res.table[res.table["mode"] == "isolated"]
    assert set(iso[iso["variant"] == "without sr"]["draws"]) == {1}
    assert set(iso[(iso["variant"] == "recipe") & (iso["layer"] == "blocks.0.up")]["draws"]) == {3}
    assert set(iso[(iso["variant"] == "recipe") & (iso["layer"] == "blocks.1.up")]["draws"]) == {1}  # BF16 block
    assert set(res.steps["optimizer"]) == {"sgd", "adamw"} and len(res.steps) == 3 * len(vs) * 2
    assert res.steps["progress_fp32"].notna().all()


def test_bf16_and_the_bf16_block_are_a_bf16_rounding_away_and_nvfp4_is_not(small):
    _, res = small
    iso = res.table[res.table["mode"] == "isolated"]
    bf = iso[iso["variant"] == "bf16"]["rel_err"]
    assert bf.max() < 2 ** -7 and bf.min() > 2 ** -12
    q = iso[(iso["variant"] == "recipe") & iso["layer"].str.startswith("blocks.0")]["rel_err"]
    assert q.min() > 0.05  # FP4: ~10 % of the result
    tail = iso[(iso["variant"] == "recipe") & iso["layer"].str.startswith("blocks.1")]
    assert (tail["rel_err"].to_numpy() == iso[(iso["variant"] == "bf16")
                                                & iso["layer"].str.startswith("blocks.1")]["rel_err"].to_numpy()).all()


def test_the_model_is_left_as_it_was():
    m = _tiny()
    before = {n: p.detach().clone() for n, p in m.named_parameters()}
    mods = dict(m.named_modules())
    m.train()
    P.probe(m, _batches(1, 1), "nvfp4_paper", draws=2, loss_fn=P.next_token_loss, aa=False,
            variants={"recipe": "nvfp4_paper"}, keep_bf16=LayerPolicy())
    assert dict(m.named_modules()) == mods and m.training
    assert all(torch.equal(before[n], p) for n, p in m.named_parameters())
    assert all(p.grad is None for p in m.parameters())


def test_isolated_gemms_equal_fpsim_linear_on_the_captured_operands():
    """The probe's isolated Fprop/Dgrad/Wgrad errors are those of fpsim.linear (the numpy reference) on the same
    operands, seed, layer name and step, up to the GEMMs' FP32 summation order."""
    m = _tiny()
    rec = get_recipe("nvfp4_paper").without("sr")  # deterministic: one draw, seeds irrelevant
    batch = _batches(1, 3)[0]
    res = P.probe(m, [batch], rec, variants={"recipe": rec}, aa=False, modes=("isolated",), draws=1,
                  loss_fn=P.next_token_loss, keep_bf16=LayerPolicy())
    ref, _ = P._reference(m, P._targets(m, fnn.HEAD_PATTERNS), batch, P.next_token_loss, {"blocks.0.up"},
                          [(n, p) for n, p in m.named_parameters()])
    d = ref["blocks.0.up"]
    out = linear(d["x"].numpy(), d["w"].numpy(), d["dy"].numpy(), rec, layer="blocks.0.up")
    exact = {"fprop": d["x"].double() @ d["w"].double().T, "dgrad": d["dy"].double() @ d["w"].double(),
             "wgrad": d["dy"].double().T @ d["x"].double()}
    got = {"fprop": out.y, "dgrad": out.dx, "wgrad": out.dw}
    row = res.table[(res.table["layer"] == "blocks.0.up")].set_index("gemm")
    for g in P.GEMM_NAMES:
        e, q = exact[g].numpy(), np.asarray(got[g], np.float64)
        assert row.loc[g, "rel_err"] == pytest.approx(np.linalg.norm(q - e) / np.linalg.norm(e), rel=1e-5)
        assert row.loc[g, "gain"] == pytest.approx((q * e).sum() / (e * e).sum(), rel=1e-6)


def test_step_progress_is_fp32s_for_unquantized_gemms_and_the_sgd_formula():
    """progress = ⟨∇L_val, u(q)⟩: the fp32 recipe's equals the FP32 model's (float32 sums in another order); SGD's
    is the dot product of the held-out gradient with the batch's gradient, recomputed here by hand."""
    m = _tiny()
    val = _batches(1, 2)
    res = P.probe(m, _batches(2, 1), "nvfp4_paper", variants={"fp32": "fp32", "recipe": "nvfp4_paper"}, aa=False,
                  modes=("end_to_end",), draws=1, loss_fn=P.next_token_loss, val_batches=val,
                  keep_bf16=LayerPolicy())
    fp = res.steps[res.steps["variant"] == "fp32"]
    assert np.allclose(fp["progress"], fp["progress_fp32"], rtol=1e-4)
    sgd = res.steps[(res.steps["optimizer"] == "sgd")].set_index(["variant", "batch"])
    params = dict(m.named_parameters())

    def grad(batch):
        m.zero_grad()
        P.next_token_loss(m(batch), batch).backward()
        return {n: p.grad.detach().double().clone() for n, p in params.items()}

    gv, gb = grad(val[0]), grad(_batches(2, 1)[0])
    m.zero_grad(set_to_none=True)
    want = sum(float((gv[n] * gb[n]).sum()) for n in params)
    assert sgd.loc[("fp32", 0), "progress_fp32"] == pytest.approx(want, rel=1e-5)
    q = sgd.xs("recipe")["progress"] / sgd.xs("recipe")["progress_fp32"]
    assert ((q > 0.3) & (q < 1.3)).all() and not np.allclose(q, 1.0, atol=1e-3)
    s = res.summary[(res.summary["metric"] == "step_progress") & (res.summary["mode"] == "sgd")].set_index("variant")
    assert s.loc["fp32", "mean"] == pytest.approx(1.0, abs=1e-4)  # normalised by the FP32 mean progress


def test_components_pair_each_ablation_with_the_recipe_and_holm_covers_them_all(small):
    _, res = small
    c = res.components
    assert set(c["component"]) >= {"sr", "rht", "2d", "bf16_layers", "four-over-six", "tensor scale", "bf16",
                                   "A/A (none: two draws sets)"}
    rows = c[(c["gemm"] == "wgrad") & (c["mode"] == "isolated") & (c["metric"] == "rel_err")].set_index("component")
    # recomputed by hand from the table: per batch the mean over layers, then the paired difference
    t = res.table[(res.table["gemm"] == "wgrad") & (res.table["mode"] == "isolated")]
    pb = t.groupby(["batch", "variant"])["rel_err"].mean().unstack()
    diff = (pb["without sr"] - pb["recipe"]).to_numpy()
    assert rows.loc["sr", "mean"] == pytest.approx(diff.mean())
    assert rows.loc["sr", "sd"] == pytest.approx(diff.std(ddof=1))
    ps = c["p"].dropna().to_numpy()
    assert (c["p_holm"].dropna().to_numpy() >= ps - 1e-12).all() and c["p_holm"].max() <= 1.0
    # the 16×16 weight tiles are deterministic and RNE: Wgrad does not see them; Fprop does
    assert rows.loc["2d", "mean"] == 0.0
    fp = c[(c["gemm"] == "fprop") & (c["mode"] == "isolated") & (c["metric"] == "rel_err")].set_index("component")
    # Fprop has no SR in the paper's recipe (its draws are identical: equal up to the sums' rounding)
    assert fp.loc["2d", "mean"] != 0.0 and fp.loc["sr", "mean"] == pytest.approx(0.0, abs=1e-12)


def test_a_layer_called_twice_is_reported_not_measured():
    class Twice(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(VOCAB, D)
            self.mix = torch.nn.Linear(D, D)
            self.head = torch.nn.Linear(D, VOCAB)

        def forward(self, t):
            return self.head(self.mix(self.mix(self.embed(t))))

    torch.manual_seed(0)
    res = P.probe(Twice(), _batches(1, 1), "nvfp4_paper", variants={"recipe": "nvfp4_paper"}, aa=False,
                  modes=("isolated",), draws=1, loss_fn=P.next_token_loss)
    assert set(res.table["note"]) == {"called more than once per pass"}


def test_bad_arguments_are_clear_errors():
    m = _tiny()
    with pytest.raises(ValueError, match="no layer matches"):
        P.probe(m, _batches(1, 1), layers="nothing.*", loss_fn=P.next_token_loss)
    with pytest.raises(ValueError, match="modes"):
        P.probe(m, _batches(1, 1), modes=("both",), loss_fn=P.next_token_loss)
    with pytest.raises(TypeError, match="loss_fn"):
        P.probe(m, _batches(1, 1), variants={"recipe": "nvfp4_paper"}, aa=False, modes=("isolated",))
    with pytest.raises(TypeError, match="LayerPolicy"):
        P.probe(m, _batches(1, 1), keep_bf16=["blocks.1.*"], loss_fn=P.next_token_loss)


# --- the as-built check: planted defects -------------------------------------------------------------------------

def _flags(m, seed, recipe):
    res, found = flag_rate.flagged(m, seed, recipe)
    f = res.flags
    assert len(f) == 4 * 3 * 3 and f["p_holm"].notna().all()  # 4 layers × 3 GEMMs × 3 metrics, every one tested
    return found


@pytest.mark.parametrize("plant", list(flag_rate.PLANTS))
def test_a_planted_defect_is_flagged_on_its_layer_and_gemm_only(plant):
    """Each defect of studies/probes/flag_rate.py (SR zeroing small Wgrad dY values, Wgrad X scales read from the
    neighbouring block, Dgrad W decoded with the forward copy's 1×16 scales) is flagged on its layer and GEMM only."""
    layer, role, _, recipe = flag_rate.PLANTS[plant]
    assert _flags(flag_rate.model(0, recipe, plant), 0, recipe) == {(layer, role.split("_")[0])}


def test_the_correct_recipe_is_flagged_in_at_most_one_of_twenty_seeds():
    """The false-flag rate of the as-built check on fpsim's own layers (a correct implementation, compared with
    independent draws of itself): flagged runs over 20 seeds (model, batches and draws all change)."""
    rec = get_recipe("nvfp4_paper")
    flagged = [s for s in range(20) if _flags(flag_rate.model(s, rec), s, rec)]
    assert len(flagged) <= 1, flagged
