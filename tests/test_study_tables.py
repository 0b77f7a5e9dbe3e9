"""Study tables print what their labels say: missing values are empty cells, gaps are paired differences."""

import math

import pandas as pd

from studies.common import md_table


def test_a_missing_value_is_an_empty_cell_not_nan_and_columns_take_their_own_format():
    df = pd.DataFrame({"run": ["a", "b"], "loss": [0.5, math.nan], "gap": [0.01, -0.02]})
    text = md_table(df, ".3f", {"gap": "+.3f"})
    assert "nan" not in text.lower()
    assert text.splitlines()[2:] == ["| a | 0.500 | +0.010 |", "| b |  | -0.020 |"]


def test_study_8s_earlier_runs_table_gives_the_paired_gap_in_nats_and_no_nan(tmp_path):
    from studies.report import training

    text = (training.main(["--out", str(tmp_path)]) / "section.md").read_text()
    assert "nan" not in text.replace("nanos", "")
    table = text.split("gap to BF16 of the same seed (nats per byte")[1].split("\n\n")[1]
    rows = {r[0]: r[1:] for r in ([c.strip() for c in line.split("|")[1:-1]] for line in table.splitlines()[2:])}
    bf16 = [float(v) for v in rows["BF16"][0::2]]
    for run, cells in rows.items():
        loss0, gap0 = float(cells[0]), float(cells[1])
        assert abs(gap0 - (loss0 - bf16[0])) <= 1.5e-4, run  # same seed, nats/byte (4 decimals each)
        if cells[2]:
            assert abs(float(cells[3]) - (float(cells[2]) - bf16[1])) <= 1.5e-4, run
        else:
            assert cells[3] == "", run  # no seed-1 run: both cells empty
    assert float(rows["BF16"][1]) == 0 and float(rows["BF16"][3]) == 0
