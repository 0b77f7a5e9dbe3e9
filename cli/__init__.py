"""The ``fpsim`` command line (installed as the ``fpsim_cli`` package)."""
