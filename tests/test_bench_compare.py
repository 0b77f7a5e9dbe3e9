"""studies.bench.compare: rows matched by their first cell, ratios of the first numeric cell."""

from studies.bench.compare import compare, table_rows

OLD = """# x

| operation | ms | GB/s |
|---|---:|---:|
| amax | 0.250 | 4230 |
| quantize | 0.400 | 2000 |
| gone | 1.0 | 1 |
| words | n/a | n/a |
"""
NEW = """| operation | ms | GB/s |
|---|---:|---:|
| amax | 0.275 | 3846 |
| quantize | **0.300** | 2667 |
| new row | 2.0 | 1 |
| words | n/a | n/a |
"""


def test_rows_are_keyed_by_their_first_cell_without_headers_or_rules():
    rows = table_rows(OLD)
    assert list(rows) == ["amax", "quantize", "gone", "words"] and rows["amax"] == ["amax", "0.250", "4230"]


def test_ratios_of_the_first_numeric_column_and_what_was_not_compared():
    text = compare(OLD, NEW)
    assert "| amax | 0.250 | 0.275 | 1.100 |" in text
    assert "| quantize | 0.400 | **0.300** | 0.750 |" in text  # bold figures read as numbers
    assert "new row (only in the new report)" in text and "gone (only in the old report)" in text
    assert "words (no number)" in text
    assert "| amax | 4230 | 3846 | 0.909 |" in compare(OLD, NEW, column=3)
