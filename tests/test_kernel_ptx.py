"""studies.bench.kernel_ptx: the fused quantizer's configurations of one nvfp4_paper step, compiled for sm_90 here."""

import pytest

pytest.importorskip("torch")
pytest.importorskip("triton")

from studies.bench import kernel_ptx  # noqa: E402


def test_counts_every_configuration_of_one_step(tmp_path):
    out = tmp_path / "ptx.md"
    kernel_ptx.main(["--out", str(out)])
    rows = [r for r in out.read_text().splitlines() if r.startswith(("| True", "| False"))]
    assert len(rows) == 2  # X's copies (RNE) and dY's (SR) share one configuration each
    per = {r.split(" | ")[0].strip("| "): float(r.split(" | ")[12]) for r in rows}
    assert 10 < per["False"] < per["True"]  # SR adds the Philox stream and the sum to the RNE copy's work
