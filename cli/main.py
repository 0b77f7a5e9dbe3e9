"""``fpsim``: command-line entry point.

Results go to stdout, messages to stderr; every error is one line starting ``error:`` (usage errors follow
the usage line), other messages start ``note:``.  Exit codes:

* 0 — success;
* 1 — the command ran but failed on (part of) its input (a one-line message says why);
* 2 — usage error (unknown option or format name, missing path);
* 3 — ``fpsim analyze`` could analyse nothing; every command: an internal error (an unexpected exception, a bug
  in fpsim: one line ``error: internal error (…)``, never a traceback);
* 4 — ``fpsim analyze`` could not write ``--output`` (checked before the work; 4 only if writing fails); every
  command: stdout could not be written (``> /dev/full``; one line ``error: cannot write to stdout (…)``);
* 130 — interrupted (Ctrl-C); 141 — stdout was closed (``fpsim … | head``): the run ends quietly, as a process
  killed by SIGPIPE would, never with a code a script reads as a result (diff's 1 "different").
"""

from __future__ import annotations

import errno
import os
import sys

import click

from fpsim import __version__

from .analyze_cmd import analyze
from .formats_cmd import formats
from .oracle_cmds import diff, explain, vectors
from .probe_cmd import probe

#: Exit codes of an unexpected exception, of a failed write to stdout, of Ctrl-C and of a closed stdout (see the
#: module docstring).
EXIT_INTERNAL, EXIT_OUTPUT, EXIT_INTERRUPTED, EXIT_PIPE = 3, 4, 130, 141


def _silence_stdout() -> None:
    """stdout's reader is gone: point fd 1 at /dev/null so that the flush at exit cannot fail again."""
    try:
        fd = os.open(os.devnull, os.O_WRONLY)
        os.dup2(fd, sys.stdout.fileno())
        os.close(fd)
    except (OSError, ValueError, AttributeError):  # no real stdout (click's test runner): nothing to flush there
        pass


class _Group(click.Group):
    """click's group, with one error prefix: ``error: …`` on stderr (click itself writes ``Error: …``)."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except OSError as e:  # click would exit 1 (for diff: "different") on a closed pipe, a traceback on a full disk
            if e.errno == errno.EPIPE:
                _silence_stdout()
                raise click.exceptions.Exit(EXIT_PIPE) from None
            if e.filename is not None:  # every file fpsim opens is reported by name where it is read or written
                raise
            click.echo(f"error: cannot write to stdout ({e.strerror or type(e).__name__})", err=True)
            _silence_stdout()
            raise click.exceptions.Exit(EXIT_OUTPUT) from None

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
        except click.Abort:  # Ctrl-C (click turns KeyboardInterrupt into Abort)
            click.echo("error: interrupted", err=True)
            sys.exit(EXIT_INTERRUPTED)
        except Exception as e:  # a bug in fpsim, not in the input: one line, never a traceback
            from fpsim.oracle.common import exception_line

            click.echo(f"error: internal error ({exception_line(e)}): a bug in fpsim; please report it", err=True)
            sys.exit(EXIT_INTERNAL)
        sys.exit(rv if isinstance(rv, int) else 0)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "-V", "--version", prog_name="fpsim", message="%(prog)s %(version)s")
def main() -> None:
    """Bit-accurate model of NVFP4 / MX / FP8 training formats (conventions: docs/spec.md)."""


main.add_command(analyze)
main.add_command(formats)
main.add_command(explain)
main.add_command(diff)
main.add_command(vectors)
main.add_command(probe)

if __name__ == "__main__":  # pragma: no cover
    main()
