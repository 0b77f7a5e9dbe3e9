"""reports/index.html from reports/index.md: CommonMark with tables (markdown-it-py), one self-contained page.

What the renderer adds to plain Markdown: an ``id`` anchor on every heading (a slug of its text, made unique
with ``-2``, ``-3``), a table of contents of the ``##`` and ``###`` headings after the title, each image that
stands alone in its paragraph as a numbered ``<figure>`` embedded as base64 PNG whose caption is the image's alt
text (or the emphasised paragraph right after it, when there is one), and each table wrapped in a block that
scrolls sideways instead of widening the page.  The output depends only on the Markdown and the image bytes, so
``make reports`` stays byte-reproducible.
"""

from __future__ import annotations

import base64
import html
import re
from pathlib import Path

__all__ = ["md_to_html", "page"]

_CSS = """body{font-family:system-ui,sans-serif;max-width:62em;margin:auto;padding:0 1em;line-height:1.45;color:#222}
.table-wrap{overflow-x:auto;max-width:100%;margin:1em 0}table{border-collapse:collapse;font-size:90%}
td,th{border:1px solid #bbb;padding:2px 6px;text-align:right;vertical-align:top}
td:first-child,th:first-child{text-align:left}th{background:#f3f3f3}
img{max-width:100%}figure{margin:1.5em 0}figcaption{font-size:90%;color:#555}
nav.toc{background:#f7f7f7;border:1px solid #ddd;padding:.5em 1.5em;margin:1em 0}nav.toc ul{margin:.2em 0}
h2,h3{scroll-margin-top:1em}a.anchor{color:#bbb;text-decoration:none;margin-left:.3em;font-size:80%}
code{background:#f3f3f3;padding:0 .2em}"""


def _slug(text: str, seen: dict[str, int]) -> str:
    s = re.sub(r"[^\w\s-]", "", text.lower()).strip()
    s = re.sub(r"[\s_-]+", "-", s) or "section"
    n = seen.get(s, 0) + 1
    seen[s] = n
    return s if n == 1 else f"{s}-{n}"


def _lone_image(tokens, i: int):
    """The image token when tokens[i:i+3] is a paragraph holding one image and nothing else."""
    if i + 2 >= len(tokens) or tokens[i].type != "paragraph_open" or tokens[i + 1].type != "inline":
        return None
    kids = [k for k in tokens[i + 1].children or [] if not (k.type == "text" and not k.content.strip())]
    return kids[0] if len(kids) == 1 and kids[0].type == "image" else None


def _caption_after(tokens, i: int) -> str | None:
    """The text of an emphasised paragraph (``*…*`` alone) at tokens[i], else None."""
    if i + 2 >= len(tokens) or tokens[i].type != "paragraph_open" or tokens[i + 1].type != "inline":
        return None
    kids = tokens[i + 1].children or []
    if len(kids) >= 3 and kids[0].type == "em_open" and kids[-1].type == "em_close":
        return "".join(k.content for k in kids[1:-1])
    return None


def md_to_html(md: str, base: Path) -> str:
    """The body HTML of ``md``; images are read from ``base`` (a missing one is named in its caption)."""
    from markdown_it import MarkdownIt
    from markdown_it.token import Token

    mdit = MarkdownIt("commonmark", {"html": False}).enable("table")
    tokens = mdit.parse(md)
    seen: dict[str, int] = {}
    toc: list[tuple[int, str, str]] = []
    out: list = []
    figures = 0
    i = 0
    while i < len(tokens):
        t = tokens[i]
        if t.type == "heading_open":
            text = "".join(c.content for c in tokens[i + 1].children or [] if c.type in ("text", "code_inline"))
            anchor = _slug(text, seen)
            t.attrSet("id", anchor)
            level = int(t.tag[1])
            if level in (2, 3):
                toc.append((level, anchor, text))
            if level > 1:  # a link to the heading itself, to copy its address
                tokens[i + 1].children.append(_html_inline(Token, f' <a class="anchor" href="#{anchor}">#</a>'))
        img = _lone_image(tokens, i)
        if img is not None:
            figures += 1
            caption = _caption_after(tokens, i + 3)
            out.append(_block(Token, _figure(img, base, figures, caption)))
            i += 6 if caption is not None else 3
            continue
        if t.type == "table_open":
            out.append(_block(Token, '<div class="table-wrap">\n'))
        out.append(t)
        if t.type == "table_close":
            out.append(_block(Token, "</div>\n"))
        i += 1
    body = mdit.renderer.render(out, mdit.options, {})
    return _with_toc(body, toc)


def _html_inline(Token, content: str):
    tok = Token("html_inline", "", 0)
    tok.content = content
    return tok


def _block(Token, content: str):
    tok = Token("html_block", "", 0)
    tok.content = content
    return tok


def _figure(img, base: Path, n: int, caption: str | None) -> str:
    alt = "".join(c.content for c in img.children or []) or img.content
    src = img.attrGet("src") or ""
    path = base / src
    if path.is_file() and not re.match(r"^[a-z]+:", src):
        data = "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode()
        missing = ""
    else:
        data, missing = "", " (figure not found)"
    cap = caption if caption is not None else alt
    return (f'<figure id="figure-{n}"><img alt="{html.escape(alt)}" src="{data}">'
            f"<figcaption>Figure {n}. {html.escape(cap)}{missing}</figcaption></figure>\n")


def _with_toc(body: str, toc: list[tuple[int, str, str]]) -> str:
    """``body`` with the table of contents after its first ``</h1>`` (or first, without a title)."""
    if not toc:
        return body
    items, depth = ["<nav class=\"toc\"><strong>Contents</strong>\n<ul>"], 2
    for level, anchor, text in toc:
        while depth < level:
            items.append("<ul>")
            depth += 1
        while depth > level:
            items.append("</ul></li>")
            depth -= 1
        items.append(f'<li><a href="#{anchor}">{html.escape(text)}</a>')
    while depth > 2:
        items.append("</ul></li>")
        depth -= 1
    items.append("</ul></nav>\n")
    nav = "\n".join(items)
    k = body.find("</h1>")
    return body[: k + 6] + nav + body[k + 6:] if k >= 0 else nav + body


def page(md: str, base: Path, title: str = "fpsim reports") -> str:
    """The whole self-contained page."""
    return (f"<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>{html.escape(title)}</title>"
            f"<meta name=\"viewport\" content=\"width=device-width\"><style>{_CSS}</style></head><body>\n"
            + md_to_html(md, base) + "\n</body></html>\n")
