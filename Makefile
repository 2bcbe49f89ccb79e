# ssaexec: `make demo` trains the example programs; `make test` runs the test suite;
# `make fuzz` runs the program-file and kernel fuzzers with a long budget.
# Both create .venv and install everything on first use.
#
# torch: on a machine without an NVIDIA GPU we install the CPU build of
# torch==$(TORCH_VERSION) (on this workplace's machines pip finds it on local disk);
# where `nvidia-smi` sees a GPU we install the CUDA build from PyPI instead.
# Elsewhere, on a CPU-only machine, set TORCH_INDEX to PyTorch's CPU wheel index to
# avoid downloading the multi-GB CUDA build: make test TORCH_INDEX=<url>.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
TORCH_VERSION ?= 2.13.0
TORCH_INDEX ?=
STAMP := $(VENV)/.installed-$(TORCH_VERSION)
HAS_GPU := $(shell nvidia-smi -L >/dev/null 2>&1 && echo yes)
PYTEST_ARGS ?=
# the suite runs on pytest-xdist workers, one per core (at most 4: each worker holds its own
# torch, and the tests that start processes take turns anyway); --dist loadfile runs each
# test file's tests on one worker, in order; the tests marked `processes` run one at a time
# (tests/conftest.py). PYTEST_WORKERS=0 runs the suite in this process, as before.
PYTEST_WORKERS ?= auto
XDIST := -n $(PYTEST_WORKERS) --maxprocesses 4 --dist loadfile

ifeq ($(HAS_GPU),yes)
TORCH_INSTALL := PIP_FIND_LINKS= $(BIN)/pip install "torch==$(TORCH_VERSION)"
else ifneq ($(TORCH_INDEX),)
TORCH_INSTALL := $(BIN)/pip install "torch==$(TORCH_VERSION)" --extra-index-url $(TORCH_INDEX)
else
TORCH_INSTALL := $(BIN)/pip install "torch==$(TORCH_VERSION)"
endif

.PHONY: demo test test-fast test-matrix test-oldest test-newest test-inductor test-tiered test-auto bench gpu-check validate-sim validate-sim-published fuzz install graphviz chromium clean

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip >/dev/null 2>&1 || true
	$(TORCH_INSTALL) -q
# a GPU machine also gets the cupy wheel for torch.version.cuda's major (NCCL collectives)
	@[ "$(HAS_GPU)" != yes ] || { \
		w=$$($(BIN)/python -c "import torch; v = torch.version.cuda or ''; print(v and 'cupy-cuda%sx' % v.split('.')[0])"); \
		if [ -z "$$w" ]; then echo "note: torch has no CUDA, so no cupy; NCCL collectives off"; \
		elif ! PIP_FIND_LINKS= $(BIN)/pip install -q "$$w>=13"; then \
		echo "note: pip install $$w failed; NCCL collectives fall back to torch.cuda.nccl"; fi; }
	$(BIN)/pip install -q "networkx>=3.0" "numpy>=1.24" "matplotlib>=3.7" "dask>=2024.1" \
		"pytest>=8" "hypothesis>=6.100" "pytest-timeout>=2.3" "pytest-xdist>=3.5" "safetensors>=0.4" \
		"scikit-learn>=1.3" "protobuf>=4" "transformers>=5"
	$(BIN)/pip install -q --no-deps -e .
	@touch $@

# Graphviz renders `ssaexec viz` pictures; without it viz falls back to matplotlib and the
# tests that need `dot` are skipped. `make test` installs Debian's package when it can
# (root with apt-get) and says so; NO_APT=1 only prints the hint.
NO_APT ?=
graphviz:
	@command -v dot >/dev/null 2>&1 || { [ -z "$(NO_APT)" ] && [ "$$(id -u)" = 0 ] && \
		command -v apt-get >/dev/null 2>&1 && \
		echo "installing Graphviz for ssaexec viz and its tests (apt-get install graphviz; NO_APT=1 skips)" && \
		(apt-get install -y -qq graphviz >/dev/null 2>&1 || \
		 (apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq graphviz >/dev/null 2>&1)) ; } || \
		echo "hint: Graphviz 'dot' is not installed (apt-get install graphviz): ssaexec viz uses its matplotlib fallback and the tests that need dot are skipped"

# Headless Chromium (Debian's package) runs the explorer page's browser tests
# (tests/graph/test_explorer.py); without it they skip with a hint.
chromium:
	@command -v chromium >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
		(apt-get install -y -qq chromium >/dev/null 2>&1 || \
		 (apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq chromium >/dev/null 2>&1)) ; } || \
		echo "hint: headless Chromium is not installed (apt-get install chromium): the explorer's browser tests (tests/graph/test_explorer.py) are skipped"

demo: $(STAMP)
	$(BIN)/python -m ssaexec.demo

# the whole suite; it prints the 20 slowest tests at the end (docs/reliability.md)
test: $(STAMP) graphviz chromium
	$(BIN)/python -m pytest -q $(XDIST) -m "not tiered" --durations=20 $(PYTEST_ARGS)

# everything but the tests marked slow (real processes, benchmarks, big models)
test-fast: $(STAMP)
	$(BIN)/python -m pytest -q $(XDIST) -m "not slow" $(PYTEST_ARGS)

# the supported torch range (docs/torch_versions.md): pytest -m "not slow" plus the
# transformers zoo on torch 2.11.0, 2.13.0 and 2.14.1 (Python 3.11) and on the GPU
# machines' pair (Python 3.12, torch 2.11.0), each in its own .venv-matrix/py<py>-<torch>
# from the package index (torch wheels kept in ~/.cache/ssaexec-matrix-wheels); one line a
# cell. MATRIX_ARGS="--cells 3.11-2.11.0 --fast" picks cells / leaves the zoo out.
MATRIX_ARGS ?=
test-matrix:
	$(PYTHON) .ci/matrix.py $(MATRIX_ARGS)

# the fast suite on the oldest and on the newest supported torch (what CI runs besides
# make test, which runs the pinned one): both ends of the range
test-oldest:
	$(PYTHON) .ci/matrix.py --cells 3.11-2.11.0 --fast
test-newest:
	$(PYTHON) .ci/matrix.py --cells 3.11-2.14.1 --fast

# the whole suite with every ExecutionStrategy compiling its segments with Inductor
# (SSAEXEC_COMPILER=inductor); tests/conftest.py's INDUCTOR_EXCEPTIONS skips, with why, the
# tests that cannot hold then. Slow: each executor compiles its first steps.
test-inductor: $(STAMP)
	SSAEXEC_COMPILER=inductor $(BIN)/python -m pytest -q $(XDIST) $(PYTEST_ARGS)

# the tiered compiler (compiler="auto", the default) end to end: background compiles, the
# worker process, ranks agreeing on the switch, the harness waiting for it (about 2 min on
# 2 cores); kept out of `make test` for its time (docs/strategies.md)
test-tiered: $(STAMP)
	$(BIN)/python -m pytest -q $(XDIST) -m tiered $(PYTEST_ARGS)

# the whole suite with ExecutionStrategy's default, compiler="auto" (make test pins
# SSAEXEC_COMPILER=none for its time); tests/conftest.py's AUTO_EXCEPTIONS skips, with why,
# the tests that cannot hold then. Slower than make test: each executor compiles in the
# background
test-auto: $(STAMP)
	SSAEXEC_COMPILER=auto $(BIN)/python -m pytest -q $(XDIST) -m "not tiered" $(PYTEST_ARGS)

bench: $(STAMP)
	$(BIN)/python bench/images_per_sec.py

# everything GPU-only (cuda tests, sanitizer, GPU benchmarks, a profiled step) in one report,
# out/gpu_check/report.md and .json, in < 10 min on one H100; without a GPU it says so, exit 0.
# GPU_CHECK_ARGS=--quick (or --only PART; --list names the parts)
# A GPU machine as it comes (its own python with a CUDA torch, no network, no .venv) runs
# the check on that python as it is, nothing installed: bench/gpu_env.py detects it, or
# say so: make gpu-check NO_VENV=1 PYTHON=python3 (NO_VENV=0 forces .venv). docs/gpu.md.
GPU_CHECK_ARGS ?=
NO_VENV ?=
gpu-check:
	@mode=$$(NO_VENV=$(NO_VENV) $(PYTHON) bench/gpu_env.py $(VENV) $(PYTHON)) || exit 2; \
	if [ "$$mode" = system ]; then \
		PYTHONPATH=$(CURDIR)$${PYTHONPATH:+:$$PYTHONPATH} $(PYTHON) bench/gpu_check.py $(GPU_CHECK_ARGS); \
	else \
		$(MAKE) --no-print-directory install && $(BIN)/python bench/gpu_check.py $(GPU_CHECK_ARGS); \
	fi

# the scaling simulator against measured CPU runs (docs/simulator.md): ~2 min
validate-sim: $(STAMP)
	$(BIN)/python bench/validate_sim.py

# the scaling simulator against published GPU results (docs/data/published.json): ~20 s,
# no GPU; prints published figure, prediction and error per row, exit 1 outside the bound
validate-sim-published: $(STAMP)
	$(BIN)/python bench/validate_sim_published.py

# The program-file fuzzer (tests/integration/test_fuzz.py, docs/security.md) with a long budget;
# `make test` runs it with 60 cases. It prints the number of cases tried. Then the kernel
# fuzzer (tests/ops/test_kernel_fuzz.py: every allowlisted ATen kernel with hostile values),
# long: every mutation under every layout plus random pairs (`make test` samples it);
# KERNEL_FUZZ_SEED=N varies its random draws. Last, every structured mutation of every op of
# the PIR fixtures (tests/frontends/paddle/test_pir_malformed.py; `make test` samples 40).
FUZZ_EXAMPLES ?= 5000
KERNEL_FUZZ_SEED ?= 0
fuzz: $(STAMP)
	SSAEXEC_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) $(BIN)/python -m pytest -q -s -p no:cacheprovider \
		tests/integration/test_fuzz.py
	SSAEXEC_KERNEL_FUZZ=long SSAEXEC_KERNEL_FUZZ_SEED=$(KERNEL_FUZZ_SEED) $(BIN)/python -m pytest \
		-q -s -p no:cacheprovider tests/ops/test_kernel_fuzz.py -k no_allowlisted
	SSAEXEC_PIR_FUZZ=long $(BIN)/python -m pytest -q -s -p no:cacheprovider tests/frontends/paddle/test_pir_malformed.py -k fuzz

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
