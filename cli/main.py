"""``fpsim``: command-line entry point.

Results go to stdout, messages to stderr; every error is one line starting ``error:`` (usage errors follow
the usage line), other messages start ``note:``.  Exit codes:

* 0 — success;
* 1 — the command ran but failed on (part of) its input (a one-line message says why);
* 2 — usage error (unknown option or format name, missing path);
* 3 — ``fpsim analyze`` could analyse nothing;
* 4 — ``fpsim analyze`` could not write ``--output`` (checked before the work; 4 only if writing fails).
"""

from __future__ import annotations

import sys

import click

from .analyze_cmd import analyze
from .formats_cmd import formats
from .oracle_cmds import diff, explain, vectors


class _Group(click.Group):
    """click's group, with one error prefix: ``error: …`` on stderr (click itself writes ``Error: …``)."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, False, **extra)
        try:
            rv = super().main(args, prog_name, complete_var, False, **extra)
        except click.ClickException as e:
            if type(e).__name__ == "NoArgsIsHelpError":  # `fpsim` alone: click's help, not an error line
                e.show()
                sys.exit(e.exit_code)
            ctx = getattr(e, "ctx", None)
            if isinstance(e, click.UsageError) and ctx is not None:
                click.echo(f"{ctx.get_usage()}\nTry '{ctx.command_path} -h' for help.\n", err=True)
            click.echo(f"error: {e.format_message()}", err=True)
            sys.exit(e.exit_code)
        except click.Abort:
            click.echo("error: aborted", err=True)
            sys.exit(1)
        sys.exit(rv if isinstance(rv, int) else 0)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="fpsim")
def main() -> None:
    """Bit-accurate model of NVFP4 / MX / FP8 training formats (conventions: docs/spec.md)."""


main.add_command(analyze)
main.add_command(formats)
main.add_command(explain)
main.add_command(diff)
main.add_command(vectors)

if __name__ == "__main__":  # pragma: no cover
    main()
