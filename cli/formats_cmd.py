"""``fpsim formats``: spec sheets generated from the format spec objects (STYLE §15)."""

from __future__ import annotations

import click


def _layout(spec) -> str:
    parts = (["s"] if spec.signed else []) + ["e" * spec.ebits] + (["m" * spec.mbits] if spec.mbits else [])
    return ".".join(parts)


def _specials(spec) -> str:
    from fpsim.formats import NanStyle

    if spec.nan is NanStyle.IEEE:
        return f"±inf 0x{spec.inf_code:X}, NaN: exponent all ones, mantissa ≠ 0"
    if spec.nan is NanStyle.ALL_ONES:
        neg = f"/0x{spec.magnitude_mask | spec.sign_mask:X}" if spec.signed else ""
        return f"NaN 0x{spec.magnitude_mask:X}{neg}, no inf"
    return "none (every code finite)"


def sheet(spec) -> dict:
    """The spec sheet of one format as plain data."""
    from fpsim.formats import ALIASES

    d = {
        "name": spec.name,
        "aliases": sorted(a for a, n in ALIASES.items() if n == spec.name and a != spec.name),
        "bits": spec.bits,
        "layout": _layout(spec),
        "exponent_bits": spec.ebits,
        "mantissa_bits": spec.mbits,
        "bias": spec.bias,
        "signed": spec.signed,
        "specials": _specials(spec),
        "max": spec.max,
        "min_normal": spec.min_normal,
        "min_subnormal": spec.min_subnormal,
        "max_code": f"0x{spec.max_code:X}",
        "nan_input_gives": f"0x{spec.nan_code:X}",
        "sr_bits": spec.sr_bits,
    }
    if spec.bits <= 6:
        d["values"] = [float(v) for v in spec.values()]
    return d


def _fmt_num(v) -> str:
    if v is None:
        return "—"
    return f"{v:.9g}" if isinstance(v, float) else str(v)


@click.command()
@click.argument("names", nargs=-1)
@click.option("--format", "out_format", type=click.Choice(["table", "json", "markdown"]), default="table",
              show_default=True, help="Output format.")
def formats(names: tuple[str, ...], out_format: str) -> None:
    """Print the spec sheet of each element format (all, or NAMES; aliases accepted)."""
    from fpsim.formats import FORMATS, get_format

    try:
        specs = [get_format(n) for n in names] if names else list(FORMATS.values())
    except ValueError as e:
        raise click.UsageError(str(e)) from None
    sheets = [sheet(s) for s in specs]
    if out_format == "json":
        from fpsim.io import dumps  # the one JSON convention of every command (numbers or null)

        click.echo(dumps(sheets, indent=2), nl=False)
        return
    keys = ["bits", "layout", "bias", "specials", "max", "min_normal", "min_subnormal", "max_code",
            "nan_input_gives", "sr_bits"]
    for d in sheets:
        if out_format == "markdown":
            click.echo(f"### {d['name']}\n")
            click.echo(f"aliases: {', '.join(d['aliases']) or '—'}\n")
            click.echo("| property | value |\n|---|---|")
            for k in keys:
                click.echo(f"| {k} | {_fmt_num(d[k])} |")
            if "values" in d:
                click.echo(f"| values | {', '.join(_fmt_num(v) for v in d['values'])} |")
            click.echo("")
        else:
            click.echo(f"{d['name']}  ({', '.join(d['aliases'])})")
            for k in keys:
                click.echo(f"  {k:<16} {_fmt_num(d[k])}")
            if "values" in d:
                click.echo(f"  {'values':<16} ±{{{', '.join(_fmt_num(v) for v in d['values'])}}}")
            click.echo("")
