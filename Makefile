# Every target sets up .venv when it is missing (or pyproject.toml changed) and is quick when it exists.
PYTHON ?= python3.11
VENV   := .venv
BIN    := $(VENV)/bin
# The CPU wheel first, so that the torch range in pyproject.toml never pulls a multi-GB CUDA build.
TORCH_SPEC ?= torch==2.13.0
STAMP  := $(VENV)/.installed
# MODULE EXTRA PURPOSE: exit 2 with one line naming the extra when MODULE is not installed
NEED   := $(BIN)/python -c 'import sys, workbench.extras as x; sys.exit(x.main(sys.argv[1:]))'

.PHONY: setup lab app test test-fast test-engines test-engines-matrix engines lint format demo bench doctor clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV) || python3 -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet "$(TORCH_SPEC)"
	$(BIN)/python -m pip install --quiet -e ".[dev,lab]"
	$(BIN)/python -m ipykernel install --sys-prefix --name python3 >/dev/null
	@touch $(STAMP)

# No GPU answers nvidia-smi: the notebooks' Triton kernels run in Triton's interpreter, which must be on
# before torch and the kernels are imported (the kernel playground says so otherwise)
NO_GPU_ENV = $(if $(shell nvidia-smi -L 2>/dev/null | grep GPU),,TRITON_INTERPRET=1)

lab: $(STAMP)
	@$(NEED) jupyterlab lab "make lab"
	$(NO_GPU_ENV) $(BIN)/jupyter lab notebooks/ $(if $(filter 0,$(shell id -u)),--allow-root,)

# the MetadataExplorer as a standalone page (Voila), on http://localhost:8866
app: $(STAMP)
	@$(NEED) voila lab "make app"
	$(NO_GPU_ENV) $(BIN)/voila app/metadata_explorer.ipynb --port=8866 --no-browser

# pytest in two sessions. Every test but the notebooks' on TEST_WORKERS processes (pytest-xdist, one torch
# thread each), then the notebooks alone: JupyterLab, its kernels and Chromium need the whole machine (with a
# worker beside them the notebook runs took 1.8x longer and the browser's waits timed out; with the workers at
# SCHED_IDLE still 1.27x, for 610 s in all against 663 s, issue 33). Both sessions run even when the first
# fails; make fails when either did.
TEST_WORKERS ?= 2
# pytest keeps the test modules it rewrote for its assert messages only where bytecode may be written: with
# PYTHONDONTWRITEBYTECODE set (as on the 2-core machine) each session rewrote all of them again: collection 19.5 s
# against 10 s (issue 33). Empty is unset to Python; the caches go to the ignored __pycache__/ folders.
PYTEST = PYTHONDONTWRITEBYTECODE= $(BIN)/python -m pytest
PYTEST_PARALLEL = $(PYTEST) -q -n $(TEST_WORKERS) --dist loadgroup --no-loadscope-reorder

test: lint
	@rc=0; \
	$(PYTEST_PARALLEL) -m "not notebook" || rc=1; \
	$(PYTEST) -q -m notebook || rc=1; \
	exit $$rc

# the inner loop: no lint, no slow/network/notebook tests (markers in pyproject.toml), on TEST_WORKERS workers;
# 4.1 min on this shared 2-core machine on a slow day (8 min of CPU, issue 33). A test that takes seconds is
# marked slow.
test-fast: $(STAMP)
	$(PYTEST_PARALLEL) -m "not slow and not network and not notebook"

# The engines' own metadata code on the CPU (workbench.engines), in a venv of its own so the default one stays
# as it is: the CPU torch, the project with the engines extra (what their import chains need), then the
# released engines without their dependencies (their pins would pull a CUDA torch; compressed-tensors too).
ENGINES_VENV := .venv-engines
ENGINES_SPEC ?= sglang==0.5.23 vllm==0.33.0 compressed-tensors==0.18.0

engines: $(ENGINES_VENV)/.installed

$(ENGINES_VENV)/.installed: pyproject.toml
	@test -x $(ENGINES_VENV)/bin/python || $(PYTHON) -m venv $(ENGINES_VENV) || python3 -m venv $(ENGINES_VENV)
	$(ENGINES_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(ENGINES_VENV)/bin/python -m pip install --quiet "$(TORCH_SPEC)"
	$(ENGINES_VENV)/bin/python -m pip install --quiet -e ".[dev,engines]"
	$(ENGINES_VENV)/bin/python -m pip install --quiet --no-deps $(ENGINES_SPEC)
	@touch $@

# the adapter tests against the real wheels (marker engines; make test runs the fake-engine ones and skips these)
# SGLANG_ROOT / VLLM_ROOT: test a clone instead of the installed release; CHECKOUT=1 first checks out the commit
# the adapters were verified on (.ci/<engine>-verified.commit) in it
test-engines: engines
	$(if $(and $(CHECKOUT),$(SGLANG_ROOT)),git -C $(SGLANG_ROOT) checkout --quiet $$(cat .ci/sglang-verified.commit))
	$(if $(and $(CHECKOUT),$(VLLM_ROOT)),git -C $(VLLM_ROOT) checkout --quiet $$(cat .ci/vllm-verified.commit))
	LINATTN_SGLANG_ROOT=$(SGLANG_ROOT) LINATTN_VLLM_ROOT=$(VLLM_ROOT) $(ENGINES_VENV)/bin/python -m pytest -q -m "engines and not network" tests/engines

# every verified release of both engines through engine-check, each from its own wheel (downloaded once, cached)
test-engines-matrix: engines
	$(ENGINES_VENV)/bin/python -m pytest -q -m "engines and network" tests/engines/test_matrix.py

# ruff, the one-way import layers (import-linter, contracts in pyproject.toml), the type checker
lint: $(STAMP)
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .
	$(BIN)/lint-imports
	$(BIN)/mypy

format: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

demo: $(STAMP)
	$(BIN)/workbench demo

bench: $(STAMP)
	$(BIN)/workbench bench metadata
	$(BIN)/workbench bench kernels
	$(BIN)/workbench bench replay

doctor: $(STAMP)
	$(BIN)/workbench doctor

# everything the targets and the tests write: the venv, tool caches, reports, benchmark output, screenshots
clean:
	rm -rf $(VENV) $(ENGINES_VENV) .pytest_cache .ruff_cache .mypy_cache .hypothesis .import_linter_cache bench-results tests/screenshots
	rm -rf build dist out *.egg-info report.html benchmarks/results/*_dryrun_*.json
	find . -path ./.git -prune -o \( -name __pycache__ -o -name .ipynb_checkpoints \) -type d -prune -exec rm -rf {} +
