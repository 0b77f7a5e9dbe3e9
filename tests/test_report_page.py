"""reports/index.html's renderer (studies.report.page): real Markdown, heading anchors, a table of contents, numbered
figures captioned by their alt text (never their file path), tables that scroll sideways; the same bytes twice."""

from __future__ import annotations

import base64
import html.parser
from pathlib import Path

from studies.report.page import md_to_html, page

PNG = base64.b64decode("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAAB"
                       "JRU5ErkJggg==")

MD = """# fpsim reports

Intro with **bold**, `code` and a [benchmark](bench_x.md).

## 1. Format error

**Paper's claim.** NVFP4 *beats* MXFP4.

| scheme | sqnr_db |
|---|---|
| nvfp4 | 20.1 |

![SQNR against bits per element](fig/sqnr.png)

![A figure with a caption paragraph](fig/sqnr.png)

*Each point is one distribution.*

## 2. Design space

### a. Format error

### a. Format error

- one
- two
"""


class _Tags(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags, self.text = [], []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data):
        self.text.append(data)


def _render(tmp_path: Path) -> tuple[str, _Tags]:
    (tmp_path / "fig").mkdir()
    (tmp_path / "fig" / "sqnr.png").write_bytes(PNG)
    body = md_to_html(MD, tmp_path)
    p = _Tags()
    p.feed(body)
    return body, p


def test_markdown_is_rendered_not_shown(tmp_path):
    body, p = _render(tmp_path)
    text = "".join(p.text)
    assert "**" not in text and "](" not in text and "`" not in text and "| scheme" not in text
    assert "<strong>bold</strong>" in body and "<code>code</code>" in body and "<em>beats</em>" in body
    assert ("a", {"href": "bench_x.md"}) in p.tags
    assert "<li>one</li>" in body and "<li>two</li>" in body


def test_headings_have_unique_anchors_and_a_table_of_contents(tmp_path):
    body, p = _render(tmp_path)
    ids = [a["id"] for t, a in p.tags if t in ("h2", "h3")]
    assert ids == ["1-format-error", "2-design-space", "a-format-error", "a-format-error-2"]
    toc = body[body.index('<nav class="toc">'):body.index("</nav>")]
    assert [a["href"] for t, a in _parse(toc).tags if t == "a"] == [f"#{i}" for i in ids]
    assert body.index("</h1>") < body.index('<nav class="toc">') < body.index('id="1-format-error"')


def _parse(fragment: str) -> _Tags:
    p = _Tags()
    p.feed(fragment)
    return p


def test_figures_are_embedded_numbered_and_captioned_by_their_text(tmp_path):
    body, p = _render(tmp_path)
    imgs = [a for t, a in p.tags if t == "img"]
    assert len(imgs) == 2 and all(a["src"] == "data:image/png;base64," + base64.b64encode(PNG).decode() for a in imgs)
    caps = body.split("<figcaption>")[1:]
    assert caps[0].startswith("Figure 1. SQNR against bits per element</figcaption>")
    assert caps[1].startswith("Figure 2. Each point is one distribution.</figcaption>")  # the paragraph after it
    assert "fig/sqnr.png" not in body and body.count("Each point is one distribution.") == 1


def test_tables_scroll_sideways_inside_their_wrapper(tmp_path):
    body, _ = _render(tmp_path)
    assert body.count('<div class="table-wrap">\n<table>') == 1 and "</table>\n</div>" in body
    assert ".table-wrap{overflow-x:auto" in page(MD, tmp_path)


def test_the_page_is_the_same_bytes_twice_and_needs_no_network(tmp_path):
    _render(tmp_path)
    a, b = page(MD, tmp_path), page(MD, tmp_path)
    assert a == b and "http://" not in a and "https://" not in a
