"""``python -m fpsim`` runs the ``fpsim`` command line."""

from fpsim_cli.main import main

main(prog_name="fpsim")
