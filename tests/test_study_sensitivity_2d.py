"""Studies 5 and 7 state their baselines and derive their verdict wording from the numbers they print."""

import re

import pandas as pd

from studies.report import layer_sensitivity, weight_2d


def test_layer_sensitivity_prints_the_chance_baseline_and_judges_the_depth_trend(tmp_path):
    d = layer_sensitivity.main(["--quick", "--out", str(tmp_path)])
    text = (d / "section.md").read_text()
    # A random 3 of 12 layers covers exactly 3/12 of the summed squared error on average.
    assert "3 layers drawn at random 25.0 % on average (exactly 3/12)" in text
    assert "kurtosis dY (Pearson)" in text and "normal distribution gives 3" in text
    df = pd.read_csv(d / "layer_sensitivity.csv")
    wg = df[(df.gemm == "wgrad") & (df.precision == "nvfp4_paper")].sort_values("index")["value"].to_numpy()
    if wg[-1] == wg.min():  # the final layer least sensitive: the "final layers" part cannot read as supported
        assert "part is supported" not in text


def test_weight_2d_words_the_accuracy_comparison_from_the_per_tensor_ratio(tmp_path):
    d = weight_2d.main(["--quick", "--out", str(tmp_path)])
    text = (d / "section.md").read_text()
    df = pd.read_csv(d / "weight_2d.csv")
    cos = df[df.metric == "dx_cos_vs_fp64"].pivot(index="data", columns="scheme", values="value")
    worse = int(((1 - cos["16×16 tiles"]) > (1 - cos["1×16 different dims"])).sum())
    assert f"larger with 16×16 on {worse} of {len(cos)}" in text
    if worse == len(cos):
        assert re.search(r"worse on all \d+ tensors \(1 − cos [\d.]+–[\d.]+× that of the 1-D gradient\)", text)
    assert "mismatch = ‖W_fprop − W_bprop‖_F / ‖W‖_F" in text and "one seed, so no interval is computed" in text
    summ = df[df.data == weight_2d.ALL]
    assert len(summ) == 6 and summ.ci95.isna().all()  # one seed in --quick: no interval, never a fake 0
