"""``fpsim analyze --html``: the page's structure (parsed), its windows and histograms (against fpsim.formats), its
refusals, and its behaviour in a real headless browser (loads, sorts on a header click, no console error)."""

from __future__ import annotations

import html.parser
import math
import shutil

import numpy as np
import pytest

from fpsim.analysis import LEGEND
from fpsim.formats import get_format
from fpsim.schemes import get_scheme
from fpsim_cli.analyze_html import binade_histogram, scheme_window
from tests.cliutil import run, strict_json

SCHEMES = "nvfp4,mxfp4,bf16"


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    d = tmp_path_factory.mktemp("html")
    rng = np.random.default_rng(7)
    w = rng.standard_normal((16, 64)).astype(np.float32)
    w[0, :4] = 0.0
    np.savez(d / "a.npz", w=w, dx=(rng.standard_normal((8, 64)) * 1e-4).astype(np.float32))
    np.savez(d / "b.npz", act=(rng.standard_normal((4, 32)) * 30).astype(np.float32))
    out = d / "report.html"
    r = run(d / "a.npz", d / "b.npz", "--formats", SCHEMES, "--seeds", "0", "--format", "json", "--html", out)
    assert r.exit_code == 0, r.output
    rows = strict_json(r.stdout)["rows"]
    return out, rows


class _Page(html.parser.HTMLParser):
    """Tags, attributes and the text of the results table's header and body cells."""

    def __init__(self):
        super().__init__()
        self.tags, self.heads, self.cells, self.dts = [], [], [], []
        self._in, self._table = None, None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.tags.append((tag, a))
        if tag == "table":
            self._table = a.get("class")
        if tag in ("th", "td", "dt"):
            self._in = tag
            if tag == "td" and self._table == "results":
                self.cells.append("")

    def handle_endtag(self, tag):
        if tag in ("th", "td", "dt"):
            self._in = None

    def handle_data(self, data):
        if self._in == "th" and self._table == "results":
            self.heads.append(data)
        elif self._in == "td" and self._table == "results":
            self.cells[-1] += data
        elif self._in == "dt":
            self.dts.append(data)


def test_the_page_holds_the_table_its_legend_and_one_figure_per_tensor(page):
    out, rows = page
    p = _Page()
    p.feed(out.read_text())
    assert [a.get("class") for t, a in p.tags if t == "table"].count("results") == 1
    assert p.heads[:3] == ["tensor", "role", "scheme"] and set(p.heads) <= set(LEGEND)
    assert len(p.cells) == len(rows) * len(p.heads)  # every row of the JSON output is in the table
    assert set(p.dts) == set(p.heads)  # every column shown is defined in the legend
    tensors = {r["tensor"] for r in rows}
    figures = [a for t, a in p.tags if t == "img"]
    assert len(tensors) == 3 and len(figures) == len(tensors)
    assert all(a["src"].startswith("data:image/png;base64,") for a in figures)
    assert sum(t == "section" for t, _ in p.tags) == len(tensors)
    assert any(t == "script" for t, _ in p.tags)


def test_the_page_needs_no_network(page):
    text = page[0].read_text()
    p = _Page()
    p.feed(text)
    for tag, a in p.tags:
        for k in ("src", "href"):
            assert not a.get(k) or a[k].startswith(("data:", "#")), (tag, a.get(k))
        assert tag != "link", a
    assert "http://" not in text and "https://" not in text and "url(" not in text


def test_windows_are_the_formats_own_values():
    bf = get_format("bfloat16")
    w = scheme_window("bf16", 123.0)  # a cast: absolute, whatever the tensor holds
    assert w["absolute"] and (w["min_subnormal"], w["min_normal"], w["max"]) == (bf.min_subnormal, bf.min_normal,
                                                                                  bf.max)
    assert w["flush"] == bf.min_subnormal / 2 and w["saturation"] == bf.max
    s = get_scheme("nvfp4")
    w = scheme_window("nvfp4", 12.0)  # the block holding amax = 12: its max lands on E2M1's largest value
    scale = 12.0 / s.element.max
    assert not w["absolute"] and w["max"] == 12.0 and w["min_normal"] == s.element.min_normal * scale
    assert w["flush"] == s.element.min_subnormal * scale / 2
    assert w["block_floor"] == 12.0 * s.scale.min_subnormal / s.scale.max
    assert scheme_window("mxfp4", 12.0)["block_floor"] is None


def test_the_histogram_counts_binades_exactly():
    below_one = np.nextafter(np.float32(1), np.float32(0))
    x = np.array([0.0, 1.0, 1.5, 2.0, -3.0, np.inf, np.nan, 0.25, below_one], np.float32)
    hist, amax, zeros, nonfinite = binade_histogram(x)
    # 1 and 1.5 in [1, 2); 2 and 3 in [2, 4); 0.25 in [0.25, 0.5); one ulp below 1 in [0.5, 1) (a float log2 says 0)
    assert hist == {0: 2, 1: 2, -2: 1, -1: 1} and amax == 3.0 and zeros == 1 and nonfinite == 2
    assert math.isfinite(amax)


def test_html_never_replaces_an_input_nor_the_output(tmp_path):
    f = tmp_path / "x.npz"
    np.savez(f, w=np.ones((2, 16), np.float32))
    before = f.read_bytes()
    r = run(f, "--formats", "nvfp4", "--seeds", "0", "--html", f)
    assert r.exit_code == 2 and "error: --html" in r.stderr and f.read_bytes() == before, r.output
    o = tmp_path / "o.json"
    r = run(f, "--formats", "nvfp4", "--seeds", "0", "-o", o, "--html", o)
    assert r.exit_code == 2 and "same file as --output" in r.stderr and not o.exists(), r.output


def _browser() -> str | None:
    return next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)


def test_the_page_sorts_in_a_headless_browser(page):
    """The page loads in Chromium with no console error, and a click on a header sorts the rows (again: reversed)."""
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install playwright)")
    exe = _browser()
    if exe is None:
        pytest.skip("no Chromium on this machine (apt-get install chromium)")
    out, rows = page
    errors: list[str] = []
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=exe, args=["--no-sandbox"])
        try:
            tab = browser.new_page()
            tab.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            tab.on("pageerror", lambda e: errors.append(str(e)))
            tab.goto(out.as_uri())
            heads = tab.eval_on_selector_all("table.results thead th", "e => e.map(x => x.textContent)")
            col = heads.index("rel_error") + 1
            cells = f"table.results tbody td:nth-child({col})"
            shown = tab.eval_on_selector_all(cells, "e => e.map(x => x.getAttribute('data-v'))")
            tab.click(f"table.results thead th:nth-child({col})")
            up = tab.eval_on_selector_all(cells, "e => e.map(x => x.getAttribute('data-v'))")
            tab.click(f"table.results thead th:nth-child({col})")
            down = tab.eval_on_selector_all(cells, "e => e.map(x => x.getAttribute('data-v'))")
            imgs = tab.eval_on_selector_all("figure img", "e => e.map(x => x.naturalWidth)")
        finally:
            browser.close()
    assert not errors, errors
    vals = [float(v) for v in shown]
    assert len(vals) == len(rows) and vals != sorted(vals)  # the page opens in the output's order, not sorted
    assert [float(v) for v in up] == sorted(vals) and [float(v) for v in down] == sorted(vals, reverse=True)
    assert len(imgs) == 3 and all(w > 0 for w in imgs)  # every figure decoded
