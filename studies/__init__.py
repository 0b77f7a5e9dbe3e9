"""Studies, benchmarks and training runs built on fpsim; outside the library (nothing in ``fpsim`` imports them).

* ``run_all.py``: ``make reports`` (``python -m studies.run_all``): runs the report's studies, assembles
  ``reports/index.md`` and ``reports/index.html``; ``common.py``: the studies' shared plumbing;
* ``report/``: the report's tensor- and training-level studies, one module per section;
* ``bench/``: the benchmarks (``make bench``, ``make bench-gpu``), their helpers, kernel tuning and profiling;
* ``capture/``: the bundled example captures the studies read (``studies/data/*.safetensors``);
* ``campaign/``: the training runs (the paired-seed campaign, the earlier small-LM runs) and their statistics;
* ``llm/``: SmolLM2-135M: GGUF loader, capture and the measurements of section 9;
* ``probes/``: the gradient-level component probes of section 10;
* ``data/``: the committed inputs and results the sections are drawn from.
"""
