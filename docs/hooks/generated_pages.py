"""MkDocs hook: fills the marked places of formats.md (the spec sheets that ``fpsim formats`` prints and a table of
the block schemes) and of recipes.md (the preset recipes, operand by operand), generated from fpsim's objects at
build time, so the pages cannot drift from the code (nothing generated is committed)."""

from __future__ import annotations

MARKER = "<!-- generated: fpsim formats and schemes -->"
RECIPES_MARKER = "<!-- generated: recipe presets -->"


def recipes_markdown() -> str:
    """One row per preset recipe of fpsim.RECIPES: each of the six operands' scheme, block, rounding and RHT."""
    from fpsim.recipe import RECIPES, ROLES

    def cell(pol) -> str:
        if pol.scheme is None:
            return "float32"
        s = pol.resolved()
        text = str(pol.scheme if isinstance(pol.scheme, str) else s.name)
        if pol.block is not None and s.block is not None and s.block[0] > 1:
            text += f" {s.block[0]}×{s.block[1]}"
        if str(getattr(pol.rounding, "value", pol.rounding)) == "sr":
            text += ", SR"
        if pol.rht:
            text += f", RHT {pol.rht}"
        return text

    rows = ["| recipe | " + " | ".join(f"`{r}`" for r in ROLES) + " | BF16 layers |",
            "|---|" + "---|" * (len(ROLES) + 1)]
    for name, r in RECIPES.items():
        lay = r.layers
        layers = f"first {lay.first}, last {lay.last}" if lay.first or lay.last else "—"
        rows.append(f"| `{name}` | " + " | ".join(cell(r.policy(role)) for role in ROLES) + f" | {layers} |")
    return "\n".join(rows) + "\n"


def schemes_markdown() -> str:
    """One row per preset block scheme of fpsim.SCHEMES: element, scale, block, tensor scale, scale rule."""
    import fpsim

    rows = ["| scheme | element format | scale format | block | FP32 tensor scale | E8M0 scale rule |",
            "|---|---|---|---|---|---|"]
    for name, s in fpsim.SCHEMES.items():
        scale = s.scale.name if s.scale is not None else "—"
        block = "×".join(map(str, s.block)) if s.block else ("whole tensor" if s.scale is not None else "—")
        rule = s.scale_rule.value if s.scale is not None and s.scale.name == "float8_e8m0fnu" else "—"  # MX only
        rows.append(f"| `{name}` | {s.element.name} | {scale} | {block} | {'yes' if s.tensor_scale else 'no'} "
                    f"| {rule} |")
    return "\n".join(rows) + "\n"


def formats_markdown() -> str:
    """What ``fpsim formats --format markdown`` prints (one spec sheet per element format)."""
    from click.testing import CliRunner

    from fpsim_cli.formats_cmd import formats

    r = CliRunner().invoke(formats, ["--format", "markdown"])
    if r.exit_code != 0:
        raise RuntimeError(f"fpsim formats --format markdown failed: {r.output}")
    return r.output


def generated_page(markdown: str) -> str:
    """``markdown`` with the marker replaced by the schemes table and the spec sheets."""
    if MARKER not in markdown:
        raise ValueError(f"formats.md has no {MARKER!r}")
    body = "## Block schemes\n\n" + schemes_markdown() + "\n## Element formats\n\n" + formats_markdown()
    return markdown.replace(MARKER, body)


def on_page_markdown(markdown, page, config, files):  # noqa: ARG001 - MkDocs' hook signature
    if page.file.src_uri == "formats.md":
        return generated_page(markdown)
    if page.file.src_uri == "recipes.md":
        if RECIPES_MARKER not in markdown:
            raise ValueError(f"recipes.md has no {RECIPES_MARKER!r}")
        return markdown.replace(RECIPES_MARKER, recipes_markdown())
    return markdown
