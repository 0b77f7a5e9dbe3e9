"""``fpsim``: command-line entry point.

Results go to stdout, messages to stderr.  Exit codes:

* 0 — success;
* 1 — the command ran but failed on (part of) its input (a one-line message says why);
* 2 — usage error (unknown option or format name, missing path);
* 3 — ``fpsim analyze`` could analyse nothing;
* 4 — ``fpsim analyze`` could not write ``--output`` (checked before the work; 4 only if writing fails).
"""

from __future__ import annotations

import click

from .analyze_cmd import analyze
from .formats_cmd import formats
from .oracle_cmds import diff, explain, vectors


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="fpsim")
def main() -> None:
    """Bit-accurate model of NVFP4 / MX / FP8 training formats (SPEC.md conventions)."""


main.add_command(analyze)
main.add_command(formats)
main.add_command(explain)
main.add_command(diff)
main.add_command(vectors)

if __name__ == "__main__":  # pragma: no cover
    main()
