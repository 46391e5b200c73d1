# Every target sets up .venv when it is missing (or pyproject.toml changed) and is quick when it exists.
PYTHON ?= python3.11
VENV   := .venv
BIN    := $(VENV)/bin
# The CPU wheel first, so that the torch range in pyproject.toml never pulls a multi-GB CUDA build.
TORCH_SPEC ?= torch==2.13.0
STAMP  := $(VENV)/.installed

.PHONY: setup lab test test-fast lint format demo bench doctor clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV) || python3 -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet "$(TORCH_SPEC)"
	$(BIN)/python -m pip install --quiet -e ".[dev,lab]"
	$(BIN)/python -m ipykernel install --sys-prefix --name python3 >/dev/null
	@touch $(STAMP)

lab: $(STAMP)
	$(BIN)/jupyter lab notebooks/ $(if $(filter 0,$(shell id -u)),--allow-root,)

test: lint
	$(BIN)/python -m pytest -q

# the inner loop: no lint, no slow/network/notebook tests (markers in pyproject.toml); under a minute
test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -m "not slow and not network and not notebook"

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

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis
