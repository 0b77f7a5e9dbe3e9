"""The report's studies (`make reports`, run by :mod:`studies.run_all` in report order): each module's
``main(argv)`` writes ``<out>/<name>/`` (CSV, figures, ``section.md``) through :mod:`studies.common`."""
