"""Benchmarks (`make bench`, `make bench-gpu`), with their shared timing helpers (:mod:`studies.bench.common`),
the GPU kernels' launch-shape tuning and PTX counts, and the training step's profiler tables.  Each module's
``--out`` writes one Markdown page under ``reports/``."""
