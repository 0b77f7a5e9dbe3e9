"""The training-step benchmark and its profile on a CPU-sized model: the tables they write add up."""

import re

import pytest

pytest.importorskip("torch")

from studies.bench import training as bench_training  # noqa: E402


def test_the_profile_splits_each_arms_time_by_kind_and_the_kinds_add_up(tmp_path):
    out = tmp_path / "profile.md"
    bench_training.main(["--tiny", "--profile", "--out", str(out)])
    text = out.read_text()
    kinds = re.findall(r"^\| ([^|*]+?) \| ([\d.]+) \| ([\d.]+) \| ([+-][\d.]+) \|$", text, re.M)
    num, signed = r"\*\*([\d.]+)\*\*", r"\*\*([+-][\d.]+)\*\*"
    total = re.search(rf"^\| \*\*all\*\* \| {num} \| {num} \| {signed} \|$", text, re.M)
    assert kinds and total
    for col in (1, 2):
        assert sum(float(k[col]) for k in kinds) == pytest.approx(float(total.group(col)), abs=0.01 * len(kinds))
    assert float(total.group(2)) > float(total.group(1)) > 0  # the emulated step does more work
    rows = re.findall(r"^\| `([^`]+)` \|", text, re.M)
    assert 0 < len(rows) <= 40 and "nan" not in text
    assert re.search(r"^\| nvfp4 \| [\d.]+ \| none \|$", text, re.M)  # no CUDA runtime calls without a GPU


def test_the_benchmark_table_leaves_memory_empty_without_a_gpu(tmp_path):
    out = tmp_path / "bench.md"
    bench_training.main(["--tiny", "--steps", "1", "--skip-fp32", "--out", str(out), "--mm-tiles", "128,256,64,8,8,4"])
    text = out.read_text()
    assert text.count("| — | — |") == 4 and "no GPU here" in text and "nan" not in text
    assert "(BM, BN, BK, GROUP_M, warps, stages): (128, 256, 64, 8, 8, 4)." in text
    assert bench_training.fastpath.MM_TILES == bench_training.fastpath.MMTiles()  # the default restored
